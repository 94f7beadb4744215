// gemm_q's warpgroup kernel (gemm_q_wgmma.cu, compiled for sm_90a only): the same block, stages and
// dequantization as gemm_q.cu's mma.sync kernel, with the products made by wgmma.mma_async (A, the
// dequantized weights, from registers; B, the activations, read by the tensor cores from shared
// memory in wgmma's core-matrix layout, which the packing kernel writes in global memory).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda_error.h"
#include "loom/dtype.h"
#include "loom/tensor.h"

namespace loom::cuda {

namespace gemm_q_detail {
struct GemmQArgs;
}

/// Whether the warpgroup kernel takes weights of type t: a format it covers (q4_0, q4_K, q5_K, q8_0, q6_K:
/// the f16-path ones) and LOOM_CUDA_GEMM_Q_WGMMA not 0. It is sm_90a code: callers also need a
/// device of compute capability 9.0 (LaunchContext::sm90a).
bool gemm_q_wgmma_covers(DType t);
/// Bytes of the packed activation tiles of n columns of k (whole 64-column tiles).
size_t gemm_q_tiles_bytes(int64_t n, int64_t k);
/// b (f32 [k, n], contiguous) packed into the kernel's tiles: per 64-column tile and 256-k chunk,
/// 32 KB of f16 core matrices, the k order within each 32 permuted as the weights' fragments take it;
/// columns past n zero.
CudaError pack_gemm_q_tiles(cudaStream_t stream, __half* out, const float* b, int64_t n, int64_t k);
/// The warpgroup kernel on grid (column tiles, row tiles, splits) for the weights of p's parts (one
/// type; weights[0] alone when p.parts <= 1).
CudaError launch_gemm_q_wgmma(cudaStream_t stream, const Tensor* const* weights, const gemm_q_detail::GemmQArgs& p,
                              dim3 grid);

}  // namespace loom::cuda
