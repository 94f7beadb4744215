// What every kernel launcher receives, and the Tensor -> TensorDesc conversion. Host code only:
// included by the .cu files' launchers and by the backend's dispatch (cuda_backend.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_error.h"
#include "tensor_desc.h"
#include "loom/tensor.h"

namespace loom::cuda {

/// deterministic_from_env() (`--deterministic`; read once): fast numerics made batch-invariant, a
/// sequence's results the same bits whatever else a step holds (docs/BATCHING.md): every quantized
/// product through gemm_q (split by its row tiles only), no mat-vec fusions or activation hand-offs,
/// flash-decoding in a fixed number of fixed-size key splits. Slower at small batches.
bool batch_invariant();

/// LaunchContext::act_out_block's value for gemm_q's f16 activation tiles (gemm_q_tiles.cuh, in the
/// output's own bytes) in place of the fast mat-vec's quantized blocks: a norm hands its output to
/// products on the warpgroup kernel, which then skip their packing kernel.
constexpr int kActGemmQTiles = -1;
/// LaunchContext::act_out_block's value for f16 activations, contiguous ([k, n] rows of k, in the
/// output's own bytes): what the products through cuBLAS pack their activations to (f16 weights, and
/// the prompt passes' dequantized weights). A producer (a norm, a gated activation) hands them its
/// output so, and they skip their packing kernel.
constexpr int kActF16 = -2;

/// Whether p is 16-byte aligned (16-byte vector accesses, bulk copies).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Whether a producer's output y can hold its kActF16 rows over its own bytes: y contiguous (f32 or f16:
/// the halves fit) and 16-byte aligned, as the producers store them.
inline bool f16_rows_fit(const Tensor* y) { return y->is_contiguous() && aligned16(y->data); }

/// The stream and resources a node's kernels run with.
struct LaunchContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* scratch = nullptr;  ///< device scratch of at least the node's scratch_bytes()
  size_t scratch_size = 0;
  /// The fast numerics mode (tensor cores, float accumulation); false: exact (docs/NUMERICS.md).
  bool fast = false;
  /// The device's SMs (sizing grids of about one wave); 0: unknown.
  int sm_count = 0;
  /// A device of compute capability 9.0 exactly, which runs the sm_90a kernels (gemm_q_wgmma.cu).
  bool sm90a = false;
  /// A norm or flash-decoding dispatch writes its output as quantized activations of this block (32
  /// or 256: the fast mat-vec's ActFast layout) instead of f32, for the fast mat-vecs that alone read
  /// it; 0: f32.
  int act_out_block = 0;
  /// A mat-vec dispatch whose activations the producing dispatch quantized (act_out_block): the fast
  /// quantized mat-vec reads them from its activation tensor's bytes; it fails if it cannot. A gemm_q
  /// product on the warpgroup kernel reads its packed tiles there instead (kActGemmQTiles), a product
  /// through cuBLAS its f16 activations (kActF16).
  bool act_in = false;
  /// A product through cuBLAS whose scratch already holds its activations, packed by the product
  /// before it in the same scratch (same activation tensor and packing; the executor orders them).
  bool b_packed = false;
};

/// LOOM_CUDA_ABLATE names a launcher may also test for one of its kernels or steps ("flash_decode_merge",
/// "quantize_act", "rope_angles"): true when that is to be left out (timing only; cuda_exec.cpp).
bool ablated_kernel(const char* name);

/// Whether a kernel may read t before its pdl_wait (while the kernel before it still runs): a leaf
/// (OpKind::none) marked a weight or an input, written before the step's first kernel. The caches are
/// unmarked leaves the stores write; an input a store writes in place would pass, so this is for operands
/// that are never a store's target: positions, frequency factors, norm weights.
inline bool read_before_wait(const Tensor* t) {
  return t->op == OpKind::none && (t->flags & (kTensorInput | kTensorWeight)) != 0;
}

inline TensorDesc desc_of(const Tensor* t) {
  TensorDesc d{};
  d.data = static_cast<char*>(t->data);
  for (int i = 0; i < 4; ++i) {
    d.ne[i] = t->ne[i];
    d.nb[i] = static_cast<int64_t>(t->nb[i]);
  }
  return d;
}

/// A launch of thread-block clusters of `cluster` blocks (its attribute kept in *attr, which must
/// outlive the launch call).
inline cudaLaunchConfig_t cluster_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, dim3 cluster,
                                         cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster.x;
  attr->val.clusterDim.y = cluster.y;
  attr->val.clusterDim.z = cluster.z;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/// Blocks of `threads` covering `n` items, capped so the grid stays within CUDA's x limit
/// (kernels loop with a grid stride over the rest).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 1 << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

/// Threads for a block that walks a row of n elements: a multiple of 32, at most 1024.
inline int row_block_threads(int64_t n) {
  if (n >= 1024) return 1024;
  return n < 32 ? 32 : static_cast<int>((n + 31) / 32 * 32);
}

/// Blocks for kernels that take one row per block and loop with a grid stride over the rest.
inline unsigned row_grid(int64_t rows) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > kMaxBlocks ? kMaxBlocks : rows));
}

}  // namespace loom::cuda
