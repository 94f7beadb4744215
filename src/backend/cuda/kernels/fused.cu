// Fused kernels: one launch (plus the activations' quantization for quantized weights) for a
// group of nodes the executor's fusion pass matched. Each computes what the unfused kernels
// compute, in the same float operations where the order is free to choose (row reductions keep the
// block shape of norm.cu/softmax.cu/reduce.cu), so the results match the unfused launches to
// rounding; the intermediates are never stored.
//
// What each saves (bytes model, per row of n floats unless said otherwise):
// - rms_norm_mul: the norm's output (write + read, 8n bytes) and one launch.
// - add_rms_norm_mul: also the add's re-read by the norm (4n).
// - mat_vec_bias: the product's write and re-read (8 bytes per output) and one launch.
// - glu_mat_vec: one activation quantization, both products' write and re-read (16 bytes per
//   output) and two launches; the weights are still read once each (bandwidth-bound at n = 1).
// - rope_set_rows: the rotated keys' write and re-read, and one or two launches.
// - scale_mask_soft_max: two intermediate rows (16n) and two launches.
// - moe_route: the probabilities stay in shared memory; five launches become one.
// - mat_vec_multi (Q, K, V of one activation): two or three launches become one, and for quantized
//   weights two or three activation quantizations become one (so 2 launches in all, 1 for float
//   weights); the weights are read once each as before. Per output it is mul_mat's mat-vec
//   kernel unchanged (same warp split and reduction order): bit-identical to the unfused launches.
// - gather_flash_attn (a batched decode step over a paged cache): the gathered K/V's f32 copies
//   (written 4 bytes and read 4 bytes per element, where the f16 cache rows are 2) and two launches;
//   and the attention runs the fast decode kernel (attention_decode.cu), which takes f16 K/V only,
//   instead of the generic kernel the f32 copies fell back to. Fast numerics only (the exact mode
//   keeps its double-precision attention, node by node).
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "activation.cuh"
#include "allreduce.cuh"
#include "attention.cuh"
#include "common.cuh"
#include "fused.cuh"
#include "gemm_q_tiles.cuh"
#include "gemm_q_wgmma.cuh"
#include "mat_vec_fast.cuh"
#include "mat_vec_fast_formats.cuh"
#include "mma.cuh"
#include "loom/backend.h"
#include "loom/graph.h"
#include "mat_vec.cuh"
#include "matmul.cuh"
#include "quant.cuh"
#include "quant_dispatch.cuh"
#include "quantize_act.cuh"
#include "rope_row.cuh"
#include "softmax_row.cuh"

namespace loom::cuda {

namespace {

/// Experts moe_route handles: one block of at most this many threads per token, one per expert.
constexpr int kMoeMaxExperts = 256;

__device__ __forceinline__ float f32_load(const TensorDesc& t, int64_t i0, int64_t i1, int64_t i2,
                                          int64_t i3) {
  return *reinterpret_cast<const float*>(element_ptr(t, i0, i1, i2, i3));
}
/// Element (i0, i1, i2, i3) of t broadcast by modulo, as binary ops read their second operand.
__device__ __forceinline__ float f32_broadcast(const TensorDesc& t, int64_t i0, int64_t i1, int64_t i2,
                                               int64_t i3) {
  return f32_load(t, i0 % t.ne[0], i1 % t.ne[1], i2 % t.ne[2], i3 % t.ne[3]);
}

// ---- rms_norm_mul, add_rms_norm_mul ----------------------------------------------------------------

// y = rms_norm(x) * w per row, with x = a + b (stored into `sum`: the residual) when has_add, else
// x = a. One block per row as norm_kernel; each thread keeps to the same elements in both passes,
// so y may alias a, b (same layout) or sum.
__global__ void rms_norm_mul_kernel(TensorDesc y, TensorDesc a, TensorDesc b, TensorDesc sum, bool has_add,
                                    TensorDesc w, float eps) {
  pdl_wait();
  __shared__ double scratch[32];
  const int64_t n = y.ne[0];
  for (int64_t r = blockIdx.x; r < nrows(y); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, y.ne[1], y.ne[2], i1, i2, i3);
    double ss = 0.0;  // in double, as norm_kernel
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float x = f32_load(a, i, i1, i2, i3);
      if (has_add) {
        x = __fadd_rn(x, f32_broadcast(b, i, i1, i2, i3));
        *reinterpret_cast<float*>(element_ptr(sum, i, i1, i2, i3)) = x;
      }
      ss += static_cast<double>(x) * x;
    }
    ss = block_sum(ss, scratch);
    const auto s = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float x = has_add ? f32_load(sum, i, i1, i2, i3) : f32_load(a, i, i1, i2, i3);
      const float normed = __fmul_rn(x, s);
      *reinterpret_cast<float*>(element_ptr(y, i, i1, i2, i3)) = __fmul_rn(normed, f32_broadcast(w, i, i1, i2, i3));
    }
  }
}

// The fast numerics mode's rms_norm_mul / add_rms_norm_mul for contiguous f32 rows of up to 8192
// (a model's hidden state): each of 256 threads keeps its kPer elements in registers from the one
// read to the write, the sum of squares in float, one barrier. The exact kernel above reads the row
// twice through strided, broadcasting accesses and sums in double: ~7.6 us per 2048-wide row on the
// H200 (ncu), 251 us of a 1B decode step's 1,382. The weights are loaded with the row, before the
// barrier (after it they were a second memory latency on the kernel's path).
//
// With act_block (32 or 256) the output is written as the fast mat-vec's quantized activations
// (ActFast layout, in y's own bytes) instead of f32: the same floats quantized as
// quantize_act_fast_kernel does, so the mat-vecs that read them give the same results as after that
// kernel, and one launch (and one round trip of the row) less. A 32-block is 8 threads' float4s, a
// 256-block 64 (two warps: their maxima meet in shared memory).
constexpr int kNormFastThreads = 256;
constexpr int kNormFastWarps = kNormFastThreads / kWarpSize;

//
// With kAllReduce (tensor parallelism's all_reduce -> add -> norm), a is this rank's partial: the
// block exchanges its row with the peers by the LL protocol (allreduce.cuh; slot = row = block) and
// adds the ranks' partials in rank order before the residual, as the all_reduce and add would.
template <int kPer, bool kAllReduce>
__global__ void __launch_bounds__(kNormFastThreads) rms_norm_mul_fast_kernel(TensorDesc y, TensorDesc a, TensorDesc b,
                                                                             TensorDesc sum, bool has_add,
                                                                             const float* w, float eps,
                                                                             ActFastRaw act, int act_block,
                                                                             LLGroup ll, bool w_early) {
  // pdl_wait later: the weights (w_early: read_before_wait) are loaded before it
  constexpr int kVec = kPer / 4;
  const int64_t n4 = y.ne[0] / 4;
  const auto* w4 = reinterpret_cast<const float4*>(w);
  // the weights, one row for every row: with w_early (a weight, no kernel's output) before the wait,
  // so that after it only the row's loads, which the kernel before has just written to L2, are waited for
  float4 wv[kVec];
  auto load_w = [&] {
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(v) * kNormFastThreads;
      wv[v] = i < n4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  if (w_early) load_w();
  pdl_wait();
  if (!w_early) load_w();
  __shared__ float partial[kNormFastWarps];
  __shared__ float warp_max[kVec][kNormFastWarps];
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  for (int64_t r = blockIdx.x; r < nrows(y); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, y.ne[1], y.ne[2], i1, i2, i3);
    const auto* xa = reinterpret_cast<const float4*>(row_ptr(a, i1, i2, i3));
    const auto* xb = reinterpret_cast<const float4*>(has_add ? row_ptr(b, i1, i2, i3) : nullptr);
    float4 x[kVec], bv[kVec];
    // every load before the first store: the sum may alias a or b, so a store between two loads
    // kept the next load waiting for it (a memory latency per float4, 7.2 us per 4096-wide row)
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      x[v] = i < n4 ? xa[i] : zero;
      bv[v] = has_add && i < n4 ? xb[i] : zero;
    }
    if constexpr (kAllReduce) {  // grid = rows: one slot per block
      const int slot = static_cast<int>(blockIdx.x);
      const uint32_t epoch = ll_begin(ll, slot);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;
        if (i < n4) ll_send4(ll, epoch, slot, 4 * i, x[v]);
      }
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;
        if (i < n4) x[v] = ll_sum4(ll, epoch, slot, 4 * i, x[v]);
      }
      ll_end(ll, slot, epoch);
    }
    float ss = 0.0f;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;
      if (has_add && i < n4) {
        x[v] = make_float4(x[v].x + bv[v].x, x[v].y + bv[v].y, x[v].z + bv[v].z, x[v].w + bv[v].w);
        reinterpret_cast<float4*>(row_ptr(sum, i1, i2, i3))[i] = x[v];
      }
      ss += x[v].x * x[v].x + x[v].y * x[v].y + x[v].z * x[v].z + x[v].w * x[v].w;
    }
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormFastWarps; ++i) total += partial[i];  // fixed order
    const float s = rsqrtf(total / static_cast<float>(y.ne[0]) + eps);
#pragma unroll
    for (int v = 0; v < kVec; ++v)
      x[v] = make_float4(x[v].x * s * wv[v].x, x[v].y * s * wv[v].y, x[v].z * s * wv[v].z, x[v].w * s * wv[v].w);
    if (act_block == 0) {
      auto* yr = reinterpret_cast<float4*>(row_ptr(y, i1, i2, i3));
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;
        if (i < n4) yr[i] = x[v];
      }
    } else if (act_block == kActF16) {
      // y's bytes as contiguous f16 rows (kActF16): what pack_b_f16 makes of the f32 output, for
      // products through cuBLAS; row r's halves at r x n
      auto* yr = reinterpret_cast<uint2*>(reinterpret_cast<__half*>(y.data) + r * y.ne[0]);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;
        if (i < n4) yr[i] = make_uint2(pack_half2(x[v].x, x[v].y), pack_half2(x[v].z, x[v].w));
      }
    } else if (act_block == kActGemmQTiles) {
      // y's bytes as gemm_q's f16 activation tiles, row r being the products' column r: a k32 group
      // is 8 lanes' float4s; lane f < 4 of them writes the group's piece f, whose halves (k pairs
      // o, o + 1 of each 8, o = 4 (f / 2) + 2 (f % 2)) lanes f / 2 + 2s hold (x, y for even f, z, w for
      // odd). The same conversions as pack_gemm_q_tiles_kernel's of the f32 output.
      auto* tiles = reinterpret_cast<uint4*>(y.data);
      const int64_t chunks = y.ne[0] / gemm_q_plan::kChunk;
      const int f = lane % 8, group_lane = lane - f;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;  // float4 of the row
        const uint32_t hxy = pack_half2(x[v].x, x[v].y), hzw = pack_half2(x[v].z, x[v].w);
        uint32_t piece[4];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int from = group_lane + (f % 4) / 2 + 2 * s;
          const uint32_t a_xy = __shfl_sync(0xffffffffu, hxy, from), a_zw = __shfl_sync(0xffffffffu, hzw, from);
          piece[s] = f % 2 ? a_zw : a_xy;
        }
        if (f < 4 && i < n4)
          tiles[gemm_q_tile_piece(r, i / 8, chunks) + f * 64] = make_uint4(piece[0], piece[1], piece[2], piece[3]);
      }
    } else {
      // block maxima: 8 threads (32 elements), then the warp and its partner (256)
      float amax[kVec];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        amax[v] = fmaxf(fmaxf(fabsf(x[v].x), fabsf(x[v].y)), fmaxf(fabsf(x[v].z), fabsf(x[v].w)));
#pragma unroll
        for (int o = 1; o < 8; o *= 2) amax[v] = fmaxf(amax[v], __shfl_xor_sync(0xffffffffu, amax[v], o));
      }
      if (act_block == 256) {
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
#pragma unroll
          for (int o = 8; o < kWarpSize; o *= 2) amax[v] = fmaxf(amax[v], __shfl_xor_sync(0xffffffffu, amax[v], o));
          if (lane == 0) warp_max[v][warp] = amax[v];
        }
        __syncthreads();
#pragma unroll
        for (int v = 0; v < kVec; ++v) amax[v] = fmaxf(warp_max[v][warp], warp_max[v][warp ^ 1]);
      }
      const int64_t k = y.ne[0];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + static_cast<int64_t>(v) * kNormFastThreads;  // float4 of the row
        const float inv = act_fast_inverse(amax[v]);
        const int c0 = act_fast_code(x[v].x, inv), c1 = act_fast_code(x[v].y, inv);
        const int c2 = act_fast_code(x[v].z, inv), c3 = act_fast_code(x[v].w, inv);
        int csum = c0 + c1 + c2 + c3;
#pragma unroll
        for (int o = 1; o < 8; o *= 2) csum += __shfl_xor_sync(0xffffffffu, csum, o);
        if (i >= n4) continue;
        const int64_t e = r * k + 4 * i;  // element of the layout's rows
        *reinterpret_cast<uint32_t*>(act.codes + e) = (static_cast<uint32_t>(c0) & 0xffu) |
                                                      ((static_cast<uint32_t>(c1) & 0xffu) << 8) |
                                                      ((static_cast<uint32_t>(c2) & 0xffu) << 16) |
                                                      (static_cast<uint32_t>(c3) << 24);
        if (e % act_block == 0) act.scales[e / act_block] = act_fast_scale(amax[v]);
        if (act_block == 256 && e % kFastUnit == 0) act.sums[e / kFastUnit] = static_cast<int16_t>(csum);
      }
    }
    __syncthreads();  // partial and warp_max are rewritten by the next row
  }
}

// ---- glu_mat_vec -----------------------------------------------------------------------------------

// dst[i, j] = act(gate row i . x_j) * (up row i . x_j) for one warp per row i and up to
// kMatVecMaxCols columns (mul_mat_vec_kernel twice over, sharing the activation loads from L1).
template <class F>
__global__ void glu_mat_vec_kernel(TensorDesc dst, TensorDesc wg, TensorDesc wu, TensorDesc b, int64_t r2,
                                   int64_t r3, bool swiglu) {
  pdl_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= dst.ne[0]) return;  // no block-wide synchronization below
  const int64_t k = wg.ne[0], n = dst.ne[1], batches = dst.ne[2] * dst.ne[3];
  for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {
    const int64_t i2 = z % dst.ne[2], i3 = z / dst.ne[2];
    const char* g_row = row_ptr(wg, i, i2 / r2, i3 / r3);
    const char* u_row = row_ptr(wu, i, i2 / r2, i3 / r3);
    for (int64_t j0 = static_cast<int64_t>(blockIdx.y) * kMatVecMaxCols; j0 < n;
         j0 += static_cast<int64_t>(gridDim.y) * kMatVecMaxCols) {
      const int ncols = static_cast<int>(n - j0 < kMatVecMaxCols ? n - j0 : kMatVecMaxCols);
      const char* b_col = b.data + j0 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3];
      float acc_g[kMatVecMaxCols] = {}, acc_u[kMatVecMaxCols] = {};
      dot_columns_float<F>(g_row, k, b_col, b.nb[0], b.nb[1], ncols, acc_g);
      dot_columns_float<F>(u_row, k, b_col, b.nb[0], b.nb[1], ncols, acc_u);
#pragma unroll
      for (int c = 0; c < kMatVecMaxCols; ++c) {
        if (c >= ncols) break;
        const float g = warp_sum(acc_g[c]), u = warp_sum(acc_u[c]);
        if (lane == 0) *reinterpret_cast<float*>(element_ptr(dst, i, j0 + c, i2, i3)) = gated_f(g, u, swiglu);
      }
    }
  }
}

// The same for quantized weights (mul_mat_q8_kernel twice over); xq holds x's rows quantized once
// for both, in (j, i2, i3) order.
template <class D, int kCols>
__global__ void glu_mat_vec_q8_kernel(TensorDesc dst, TensorDesc wg, TensorDesc wu, const typename D::Act* xq,
                                      int64_t r2, int64_t r3, bool swiglu) {
  pdl_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= dst.ne[0]) return;  // no block-wide synchronization below
  const int64_t n_blocks = wg.ne[0] / D::kBlock, n = dst.ne[1], batches = dst.ne[2] * dst.ne[3];
  for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {
    const int64_t i2 = z % dst.ne[2], i3 = z / dst.ne[2];
    const auto* g_row = reinterpret_cast<const uint8_t*>(row_ptr(wg, i, i2 / r2, i3 / r3));
    const auto* u_row = reinterpret_cast<const uint8_t*>(row_ptr(wu, i, i2 / r2, i3 / r3));
    for (int64_t j0 = static_cast<int64_t>(blockIdx.y) * kCols; j0 < n;
         j0 += static_cast<int64_t>(gridDim.y) * kCols) {
      const int ncols = static_cast<int>(n - j0 < kCols ? n - j0 : kCols);
      const typename D::Act* x = xq + (j0 + n * z) * n_blocks;
      double acc_g[kCols] = {}, acc_u[kCols] = {};
      dot_columns<D>(g_row, n_blocks, x, ncols, acc_g);
      dot_columns<D>(u_row, n_blocks, x, ncols, acc_u);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        if (c >= ncols) break;
        const auto g = static_cast<float>(warp_sum(acc_g[c])), u = static_cast<float>(warp_sum(acc_u[c]));
        if (lane == 0) *reinterpret_cast<float*>(element_ptr(dst, i, j0 + c, i2, i3)) = gated_f(g, u, swiglu);
      }
    }
  }
}

// ---- mat_vec_multi ---------------------------------------------------------------------------------

/// Products one mat_vec_multi launch computes at most (Q, K, V).
constexpr int kMultiMax = 3;

/// One product of mat_vec_multi: its output, its weights with their batch broadcast (r2, r3, as
/// mul_mat's), and the first block of grid.x that computes its rows.
struct MultiPart {
  TensorDesc dst;
  TensorDesc w;
  int64_t r2, r3;
  unsigned first_block;
};

/// The products of one launch; unused parts start at block UINT_MAX, so no block picks them.
struct MultiArgs {
  MultiPart part[kMultiMax];
};

// The part that block bx belongs to: parts own consecutive ranges of whole blocks, so the
// choice is uniform over the block (mul_mat's kernels need no block-wide synchronization anyway).
__device__ __forceinline__ const MultiPart& multi_part(const MultiArgs& args, unsigned bx) {
  const int t = (bx >= args.part[1].first_block ? 1 : 0) + (bx >= args.part[2].first_block ? 1 : 0);
  return args.part[t];
}

// mul_mat_vec_kernel (no bias) for up to three weight matrices against one activation b: each block
// takes kMatVecWarps rows of one matrix, and every row keeps mul_mat's warp split and reduction, so
// each output is bit-identical to the unfused launch. __grid_constant__ lets the part be indexed
// at run time in parameter space instead of a local copy of the arguments.
template <class F>
__global__ void mat_vec_multi_kernel(const __grid_constant__ MultiArgs args, TensorDesc b) {
  pdl_wait();
  const MultiPart& p = multi_part(args, blockIdx.x);
  const int64_t i = static_cast<int64_t>(blockIdx.x - p.first_block) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= p.dst.ne[0]) return;  // no block-wide synchronization below
  mat_vec_float_row<F, false>(p.dst, p.w, b, i, p.r2, p.r3, nullptr);
}

// The same for quantized weights (mul_mat_q8_kernel without bias, per part); xq holds the
// activation's rows quantized once for all parts, in (j, i2, i3) order.
template <class D, int kCols>
__global__ void mat_vec_multi_q8_kernel(const __grid_constant__ MultiArgs args, const typename D::Act* xq) {
  pdl_wait();
  const MultiPart& p = multi_part(args, blockIdx.x);
  const int64_t i = static_cast<int64_t>(blockIdx.x - p.first_block) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= p.dst.ne[0]) return;  // no block-wide synchronization below
  mat_vec_q8_row<D, kCols, false>(p.dst, p.w, xq, i, p.r2, p.r3, nullptr);
}

// ---- rope_set_rows ---------------------------------------------------------------------------------

// One block per token and group of kRopeHeads heads (K heads first, then Q's): the pairs' angles
// are computed once into shared memory for all the group's heads (they depend on the token's
// position only), then every (head, rotation pair) of the group is rotated. K row (token, head) is stored,
// converted to the cache's type, at cache row idx[token] of head h (set_rows of permute(rope_k, 0,
// 2, 1, 3), indices broadcast by modulo over dims 2-3); Q rows go to q_dst (may alias q_src: each
// pair is read and stored by one thread). A block per (token, head) recomputed the angles per head:
// a 512-token chunk of an 8B layer took 46 us. angles_early: the positions and frequency factors are
// the step's inputs and weights (read_before_wait), so the angles' FP64 chain runs before the wait,
// while the Q/K/V products before it finish (as the decode attention's rope fold does).
constexpr int kRopeHeads = 8;
constexpr int kRopeMaxPairs = 256;  // n_dims / 2 (head sizes up to 512)
__global__ void rope_set_rows_kernel(TensorDesc cache, bool cache_f16, TensorDesc k_src, TensorDesc idx,
                                     TensorDesc q_dst, TensorDesc q_src, bool has_q, TensorDesc v_cache,
                                     TensorDesc v_src, TensorDesc v_idx, bool has_v, TensorDesc pos,
                                     TensorDesc freq_factors, bool has_ff, RopeArgs p, bool angles_early) {
  // pdl_wait later: with angles_early the angles (positions and frequency factors: read_before_wait) go first
  __shared__ float cs[2 * kRopeMaxPairs];
  const int64_t k_heads = k_src.ne[1], q_heads = has_q ? q_dst.ne[1] : 0;
  const int64_t heads = k_heads + q_heads + (has_v ? v_src.ne[2] : 0);
  const int64_t t = blockIdx.x % k_src.ne[2], i3 = blockIdx.x / k_src.ne[2];
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kRopeHeads;
  const int64_t h1 = h0 + kRopeHeads < heads ? h0 + kRopeHeads : heads;
  if (!angles_early) pdl_wait();
  const int32_t position = *reinterpret_cast<const int32_t*>(pos.data + t * pos.nb[0]);
  for (int i = static_cast<int>(threadIdx.x); i < p.n_dims / 2; i += blockDim.x)
    rope_angle(i, position, p, freq_factors, has_ff, cs[2 * i], cs[2 * i + 1]);
  if (angles_early) pdl_wait();
  __syncthreads();
  // Each thread takes slots of two elements of one head: slot i < n_dims / 2 is rotation pair i
  // (rope_pair_of), a slot past them copies elements 2 i and 2 i + 1 (the unrotated tail); all index
  // arithmetic in 32 bits. (Element by element with 64-bit divisions a 512-token chunk of an 8B layer
  // took 36 us, H200.)
  int ne0 = static_cast<int>(k_src.ne[0] > (has_q ? q_dst.ne[0] : 0) ? k_src.ne[0] : q_dst.ne[0]);
  if (has_v && v_src.ne[0] > ne0) ne0 = static_cast<int>(v_src.ne[0]);
  const int slots = (ne0 + 1) / 2, half = p.n_dims / 2;
  const int kh = static_cast<int>(k_heads), qh = static_cast<int>(q_heads);
  for (int w = static_cast<int>(threadIdx.x); w < static_cast<int>(h1 - h0) * slots; w += static_cast<int>(blockDim.x)) {
    const int h = static_cast<int>(h0) + w / slots, slot = w % slots;
    const bool rot = slot < half;
    int64_t j0 = 2 * slot, j1 = 2 * slot + 1;  // a tail slot's two elements
    float c = 0.0f, sn = 0.0f;
    if (rot) {
      rope_pair_of(slot, p, j0, j1);
      c = cs[2 * slot];
      sn = cs[2 * slot + 1];
    }
    // the slot's two results from row x of n elements (j1 may be past a row of odd length)
    auto rotate = [&](const float* x, int n, float& y0, float& y1) {
      const float x0 = x[j0], x1 = j1 < n ? x[j1] : 0.0f;
      y0 = rot ? rope_first(x0, x1, c, sn) : x0;
      y1 = rot ? rope_second(x0, x1, c, sn) : x1;
    };
    if (h < kh) {
      const int n = static_cast<int>(k_src.ne[0]);
      if (j0 >= n) continue;
      const int32_t cell = *reinterpret_cast<const int32_t*>(
          idx.data + t * idx.nb[0] + (h % idx.ne[1]) * idx.nb[1] + (i3 % idx.ne[2]) * idx.nb[2]);
      if (cell < 0 || cell >= cache.ne[1]) continue;  // out of range: nothing written, as set_rows
      float y0, y1;
      rotate(reinterpret_cast<const float*>(row_ptr(k_src, h, t, i3)), n, y0, y1);
      char* out = row_ptr(cache, cell, h, i3);
      if (cache_f16) {
        reinterpret_cast<uint16_t*>(out)[j0] = float_to_f16(y0);
        if (j1 < n) reinterpret_cast<uint16_t*>(out)[j1] = float_to_f16(y1);
      } else {
        reinterpret_cast<float*>(out)[j0] = y0;
        if (j1 < n) reinterpret_cast<float*>(out)[j1] = y1;
      }
    } else if (h < kh + qh) {
      const int n = static_cast<int>(q_dst.ne[0]);
      if (j0 >= n) continue;
      float y0, y1;
      rotate(reinterpret_cast<const float*>(row_ptr(q_src, h - kh, t, i3)), n, y0, y1);
      auto* y = reinterpret_cast<float*>(row_ptr(q_dst, h - kh, t, i3));
      y[j0] = y0;
      if (j1 < n) y[j1] = y1;
    } else {  // V: stored as it is, converted to the cache's type, as set_rows stores it
      const int hv = h - kh - qh, n = static_cast<int>(v_src.ne[0]);
      const int e0 = 2 * slot, e1 = 2 * slot + 1;
      if (e0 >= n) continue;
      const int32_t cell = *reinterpret_cast<const int32_t*>(
          v_idx.data + t * v_idx.nb[0] + (hv % v_idx.ne[1]) * v_idx.nb[1] + (i3 % v_idx.ne[2]) * v_idx.nb[2]);
      if (cell < 0 || cell >= v_cache.ne[1]) continue;
      const auto* x = reinterpret_cast<const float*>(row_ptr(v_src, t, hv, i3));
      char* out = row_ptr(v_cache, cell, hv, i3);
      if (cache_f16) {
        reinterpret_cast<uint16_t*>(out)[e0] = float_to_f16(x[e0]);
        if (e1 < n) reinterpret_cast<uint16_t*>(out)[e1] = float_to_f16(x[e1]);
      } else {
        reinterpret_cast<float*>(out)[e0] = x[e0];
        if (e1 < n) reinterpret_cast<float*>(out)[e1] = x[e1];
      }
    }
  }
}

// A decode step's rope_set_rows (one token, kRopeDecodeHeads heads a block, one element a thread):
// each thread issues its loads (position, cache cell, its element or pair) before its own angle, so
// their latencies overlap the angle's FP64 work and one another; the kernel above, a loop of
// dependent cell-then-row loads after a barrier, took 7.5 us per 8B layer (ncu, H100). Same
// arithmetic and stores as the kernel above.
constexpr int kRopeDecodeHeads = 2;
constexpr int kRopeDecodeThreads = 256;
__global__ void __launch_bounds__(kRopeDecodeThreads)
    rope_set_rows_decode_kernel(TensorDesc cache, bool cache_f16, TensorDesc k_src, TensorDesc idx, TensorDesc q_dst,
                                TensorDesc q_src, bool has_q, TensorDesc v_cache, TensorDesc v_src, TensorDesc v_idx,
                                bool has_v, TensorDesc pos, TensorDesc freq_factors, bool has_ff, RopeArgs p,
                                int64_t ne0) {
  pdl_wait();
  const int64_t k_heads = k_src.ne[1], q_heads = has_q ? q_dst.ne[1] : 0;
  const int64_t heads = k_heads + q_heads + (has_v ? v_src.ne[2] : 0);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kRopeDecodeThreads + threadIdx.x;
  const int64_t h = w / ne0, e = w % ne0;
  if (h >= heads) return;
  const int32_t position = *reinterpret_cast<const int32_t*>(pos.data);
  const int half = p.n_dims / 2;
  const bool is_k = h < k_heads, is_q = !is_k && h < k_heads + q_heads;
  const int64_t row_ne0 = is_k ? k_src.ne[0] : is_q ? q_dst.ne[0] : v_src.ne[0];
  if (e >= row_ne0) return;
  // the loads first: the cell, the element (or its pair)
  int32_t cell = 0;
  const float* x = nullptr;
  if (is_k) {
    cell = *reinterpret_cast<const int32_t*>(idx.data + (h % idx.ne[1]) * idx.nb[1]);
    x = reinterpret_cast<const float*>(row_ptr(k_src, h, 0, 0));
  } else if (is_q) {
    x = reinterpret_cast<const float*>(row_ptr(q_src, h - k_heads, 0, 0));
  } else {
    cell = *reinterpret_cast<const int32_t*>(v_idx.data + ((h - k_heads - q_heads) % v_idx.ne[1]) * v_idx.nb[1]);
    x = reinterpret_cast<const float*>(row_ptr(v_src, 0, h - k_heads - q_heads, 0));
  }
  const bool rotates = !(!is_k && !is_q) && e < p.n_dims;
  if (rotates && e >= half) return;  // its pair's owner stores it
  int64_t j0 = e, j1 = e;
  if (rotates) rope_pair_of(e, p, j0, j1);
  const float x0 = x[j0], x1 = rotates ? x[j1] : 0.0f;
  float c = 0.0f, s = 0.0f;
  if (rotates) rope_angle(static_cast<int>(e), position, p, freq_factors, has_ff, c, s);
  auto put = [&](char* out, int64_t j, float v) {
    if (cache_f16)
      reinterpret_cast<uint16_t*>(out)[j] = float_to_f16(v);
    else
      reinterpret_cast<float*>(out)[j] = v;
  };
  if (is_q) {
    auto* y = reinterpret_cast<float*>(row_ptr(q_dst, h - k_heads, 0, 0));
    if (rotates) {
      y[j0] = rope_first(x0, x1, c, s);
      y[j1] = rope_second(x0, x1, c, s);
    } else {
      y[j0] = x0;
    }
    return;
  }
  const TensorDesc& dst = is_k ? cache : v_cache;
  if (cell < 0 || cell >= dst.ne[1]) return;  // out of range: nothing written, as set_rows
  char* out = is_k ? row_ptr(cache, cell, h, 0) : row_ptr(v_cache, cell, h - k_heads - q_heads, 0);
  if (rotates) {
    put(out, j0, rope_first(x0, x1, c, s));
    put(out, j1, rope_second(x0, x1, c, s));
  } else {
    put(out, j0, x0);
  }
}

// ---- scale_mask_soft_max ---------------------------------------------------------------------------

// y = softmax(((x * s + bias) + mask) * sm_scale) per row: the scale node, the add (mask broadcast
// by modulo) and the soft_max's own scale, in the unfused kernels' float operations. y may alias x
// (each thread keeps to its elements).
__global__ void scale_mask_soft_max_kernel(TensorDesc y, TensorDesc x, TensorDesc mask, float s, float bias,
                                           float sm_scale) {
  pdl_wait();
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < nrows(y); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, y.ne[1], y.ne[2], i1, i2, i3);
    const char* x_row = row_ptr(x, i1, i2, i3);
    soft_max_row(
        reinterpret_cast<float*>(row_ptr(y, i1, i2, i3)), y.ne[0],
        [&](int64_t i) {
          // the unfused kernels' roundings, kept from contracting into FMAs
          const float scaled = __fadd_rn(__fmul_rn(*reinterpret_cast<const float*>(x_row + i * x.nb[0]), s), bias);
          const float masked = __fadd_rn(scaled, f32_broadcast(mask, i, i1, i2, i3));
          return __fmul_rn(masked, sm_scale);
        },
        scratch);
  }
}

// ---- moe_route -------------------------------------------------------------------------------------

// Per token t (row t of the router logits, one block, a thread per expert): the probabilities
// (soft_max_row into shared memory), each expert's rank as top_k_kernel ranks (how many beat it:
// larger, or equal with a lower index), the ids of ranks < k, and their probabilities (get_rows),
// optionally divided by their sum (sum_rows summed in rank order by the first warp, as
// sum_rows_kernel sums a row of k, then div). weights: element (e, t) at e * w_e + t * w_t bytes.
__global__ void moe_route_kernel(TensorDesc logits, float scale, TensorDesc ids, char* weights, int64_t w_e,
                                 int64_t w_t, int k, bool normalize) {
  pdl_wait();
  __shared__ float probs[kMoeMaxExperts];
  __shared__ float chosen[kMoeMaxExperts];
  __shared__ double scratch[32];
  const int64_t n = logits.ne[0];
  for (int64_t t = blockIdx.x; t < logits.ne[1]; t += gridDim.x) {
    const auto* x = reinterpret_cast<const float*>(row_ptr(logits, t, 0, 0));
    soft_max_row(
        probs, n, [&](int64_t i) { return __fmul_rn(x[i], scale); }, scratch);
    __syncthreads();
    const int64_t i = threadIdx.x;  // blockDim.x >= n
    int64_t rank = k;               // not chosen
    if (i < n) {
      const float v = probs[i];
      rank = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float u = probs[j];
        rank += (u > v || (u == v && j < i)) ? 1 : 0;
      }
      if (rank < k) {
        *reinterpret_cast<int32_t*>(element_ptr(ids, rank, t, 0, 0)) = static_cast<int32_t>(i);
        chosen[rank] = v;
      }
    }
    __syncthreads();
    float sum = 1.0f;  // sum_rows's: in double, rounded to float once
    if (normalize) sum = static_cast<float>(block_sum(threadIdx.x < k ? static_cast<double>(chosen[threadIdx.x]) : 0.0, scratch));
    if (threadIdx.x < k) {
      const float w = chosen[threadIdx.x];
      *reinterpret_cast<float*>(weights + threadIdx.x * w_e + t * w_t) = normalize ? __fdiv_rn(w, sum) : w;
    }
    __syncthreads();  // probs and chosen are rewritten for the next token
  }
}

// ---- host side: checks -----------------------------------------------------------------------------

bool is_f32(const Tensor* t) { return t && t->type == DType::f32; }
bool same_shape(const Tensor* a, const Tensor* b) { return a->ne == b->ne; }
bool is_float_weight(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
bool is_mat_vec_weight(DType t) { return is_float_weight(t) || dtype_is_quantized(t); }

// Whether a kernel may write `out` while reading `in`: the byte ranges are disjoint, or they are
// the same elements in the same layout (each fused kernel reads an element before it writes that
// element in the same thread and touches it nowhere else; a broadcast operand of another shape
// must therefore be disjoint). A partial overlap races: in the unfused
// launches an earlier kernel had finished reading before a later one wrote, and the allocator may
// have placed a later node's output over an earlier node's dead input. Unallocated tensors (no
// data yet) are not checked.
bool may_write_over(const Tensor* out, const Tensor* in) {
  if (!out || !in || !out->data || !in->data) return true;
  const auto* o = static_cast<const char*>(out->data);
  const auto* i = static_cast<const char*>(in->data);
  const bool disjoint = o + out->nbytes() <= i || i + in->nbytes() <= o;
  return disjoint || (o == i && out->type == in->type && out->ne == in->ne && out->nb == in->nb);
}
// As may_write_over, but `in` is read whole by every block (a weight broadcast, activations):
// only disjoint ranges are safe.
bool disjoint(const Tensor* out, const Tensor* in) {
  if (!out || !in || !out->data || !in->data) return true;
  const auto* o = static_cast<const char*>(out->data);
  const auto* i = static_cast<const char*>(in->data);
  return o + out->nbytes() <= i || i + in->nbytes() <= o;
}

// A view that reshapes `base` (same bytes, packed) into shape ne.
bool is_reshape_of(const Tensor* v, const Tensor* base, const Shape& ne) {
  return v && v->view_src == base && v->view_offset == 0 && v->ne == ne && v->is_contiguous() &&
         base->is_contiguous();
}

// ne[1] columns the mat-vec kernels take as one product (the fused launches keep to mul_mat's
// mat-vec path for float weights, and to the same limit for quantized ones).
bool mat_vec_shape(const Tensor* mm, bool fast) {
  const Tensor* w = mm->src[0];
  const Tensor* x = mm->src[1];
  return w && x && is_mat_vec_weight(w->type) && is_f32(x) && mm->ne[1] <= kMatVecMaxCols &&
         !float_gemm_few_cols(mm, fast);
}

bool rms_norm_mul_ok(const Tensor* add, const Tensor* norm, const Tensor* mul) {
  if (!norm || !mul || norm->op != OpKind::rms_norm || mul->op != OpKind::mul) return false;
  if (mul->src[0] != norm || !same_shape(mul, norm) || !is_f32(norm) || !is_f32(mul) || !is_f32(mul->src[1]))
    return false;
  const Tensor* w = mul->src[1];
  if (!disjoint(mul, w)) return false;
  if (!add) return is_f32(norm->src[0]) && may_write_over(mul, norm->src[0]);
  if (add->op != OpKind::add || norm->src[0] != add || !same_shape(add, norm) || !is_f32(add) ||
      !is_f32(add->src[0]) || !is_f32(add->src[1]))
    return false;
  // sum and y are written while a, b and w are read
  for (const Tensor* out : {add, mul})
    for (const Tensor* in : {add->src[0], add->src[1]})
      if (!may_write_over(out, in)) return false;
  return disjoint(add, w) && may_write_over(mul, add);
}

bool mat_vec_bias_ok(const Tensor* mm, const Tensor* add, bool fast) {
  if (!mm || !add || mm->op != OpKind::mul_mat || add->op != OpKind::add) return false;
  if (add->src[0] != mm || !same_shape(add, mm) || !is_f32(add) || !is_f32(add->src[1]) || !mat_vec_shape(mm, fast))
    return false;
  // the kernel adds a packed vector over the output rows, the bias of a linear layer
  const Tensor* bias = add->src[1];
  if (bias->ne != Shape{add->ne[0], 1, 1, 1} || bias->nb[0] != sizeof(float)) return false;
  return disjoint(add, mm->src[0]) && disjoint(add, mm->src[1]) && disjoint(add, bias);
}

bool glu_ok(const Tensor* gate, const Tensor* up, const Tensor* glu, bool fast) {
  if (!gate || !up || !glu || gate->op != OpKind::mul_mat || up->op != OpKind::mul_mat) return false;
  if (glu->op != OpKind::swiglu && glu->op != OpKind::geglu) return false;
  if (glu->src[0] != gate || glu->src[1] != up || !same_shape(glu, gate) || !is_f32(glu)) return false;
  const Tensor* wg = gate->src[0];
  const Tensor* wu = up->src[0];
  if (gate->src[1] != up->src[1] || !wg || !wu || wg->type != wu->type || wg->ne != wu->ne) return false;
  if (!mat_vec_shape(gate, fast) || !same_shape(gate, up)) return false;
  return disjoint(glu, gate->src[1]) && disjoint(glu, wg) && disjoint(glu, wu);
}

// 2-3 mul_mats of one activation x with weights of one type, each on mul_mat's mat-vec path, the
// weights' batches broadcast over x's as mul_mat broadcasts them. Every block reads x (or its
// quantized copy) and one weight matrix while others write their outputs: all disjoint.
bool mat_vec_multi_ok(const Tensor* const* n, bool fast) {
  if (!n[0] || !n[1] || n[0]->op != OpKind::mul_mat) return false;
  const Tensor* x = n[0]->src[1];
  const Tensor* w0 = n[0]->src[0];
  if (!x || !w0) return false;
  const int count = n[2] ? 3 : 2;
  // one weight type, but for the fast mode's q4_K / q6_K mix at one column (a Q4_K_M file's Q, K, V)
  const bool mixed = fast && mat_vec_fast_mixed_ok(n, count);
  for (int t = 0; t < count; ++t) {
    const Tensor* mm = n[t];
    const Tensor* w = mm->src[0];
    if (mm->op != OpKind::mul_mat || mm->src[1] != x || !mat_vec_shape(mm, fast) || !is_f32(mm)) return false;
    if ((w->type != w0->type && !mixed) || w->ne[0] != x->ne[0] || w->ne[2] <= 0 || w->ne[3] <= 0 ||
        x->ne[2] % w->ne[2] != 0 || x->ne[3] % w->ne[3] != 0)
      return false;
    if (mm->ne != Shape{w->ne[1], x->ne[1], x->ne[2], x->ne[3]} || !disjoint(mm, x)) return false;
    for (int u = 0; u < count; ++u)
      if (!disjoint(mm, n[u]->src[0]) || (u < t && !disjoint(mm, n[u]))) return false;
  }
  return true;
}

// The gemm_q forms of glu_mat_vec and mat_vec_multi, for more columns than the mat-vecs take (batched
// decode): the products in one launch of the tensor-core GEMM, the activation packed once.
// LOOM_CUDA_GEMM_Q_FUSE=0 (read once) leaves such products to one gemm_q launch each, for comparisons,
// and f16 / bf16 ones to one cuBLAS call each (the stacked cuBLAS forms below).
bool gemm_q_fuse_enabled() {
  static const bool on = env_switch("LOOM_CUDA_GEMM_Q_FUSE");
  return on;
}
GemmQProducts glu_products(const Tensor* const* n) { return GemmQProducts{{n[0], n[1]}, 2, n[2]}; }
GemmQProducts multi_products(const Tensor* const* n) { return GemmQProducts{{n[0], n[1], n[2]}, n[2] ? 3 : 2}; }

bool glu_gemm_q_ok(const Tensor* const* n, FusedTarget t) {
  const Tensor* gate = n[0];
  const Tensor* up = n[1];
  const Tensor* glu = n[2];
  if (!gemm_q_fuse_enabled() || !gate || !up || !glu || (glu->op != OpKind::swiglu && glu->op != OpKind::geglu)) return false;
  if (glu->src[0] != gate || glu->src[1] != up || !is_f32(glu) || !is_f32(gate) || !is_f32(up)) return false;
  return gemm_q_products_usable(glu_products(n), t.fast, t.sm90a);
}

// mat_vec_multi's GEMM forms (gemm_q, cuBLAS): 2-3 products whose f32 outputs lie apart from each
// other. They are written after the packing has read x, so they may lie on x's bytes.
bool multi_outputs_apart(const Tensor* const* n) {
  if (!n[0] || !n[1]) return false;
  const int count = n[2] ? 3 : 2;
  for (int i = 0; i < count; ++i) {
    if (!is_f32(n[i])) return false;
    for (int u = 0; u < i; ++u)
      if (!disjoint(n[i], n[u])) return false;
  }
  return true;
}

bool multi_gemm_q_ok(const Tensor* const* n, FusedTarget t) {
  return gemm_q_fuse_enabled() && multi_outputs_apart(n) && gemm_q_products_usable(multi_products(n), t.fast, t.sm90a);
}

// The cuBLAS form of mat_vec_multi: float weights back to back (stacked_cublas_usable).
bool multi_cublas_ok(const Tensor* const* n, FusedTarget t) {
  return gemm_q_fuse_enabled() && multi_outputs_apart(n) && stacked_cublas_usable(n, n[2] ? 3 : 2, t.fast);
}

// The prompt-pass form of mat_vec_multi over quantized weights (dequant_multi_usable).
bool multi_dequant_ok(const Tensor* const* n, FusedTarget t) {
  return gemm_q_fuse_enabled() && multi_outputs_apart(n) && dequant_multi_usable(n, n[2] ? 3 : 2, t.fast);
}

// The cuBLAS form of glu_mat_vec: gate and up weights back to back (stacked_cublas_usable), the gated
// activation written after the GEMM (it may lie on x's bytes, which the packing read first).
bool glu_cublas_ok(const Tensor* const* n, FusedTarget t) {
  const Tensor* gate = n[0];
  const Tensor* up = n[1];
  const Tensor* glu = n[2];
  if (!gemm_q_fuse_enabled() || !gate || !up || !glu || (glu->op != OpKind::swiglu && glu->op != OpKind::geglu))
    return false;
  if (glu->src[0] != gate || glu->src[1] != up || !is_f32(glu) || !same_shape(glu, gate) ||
      glu->nb[0] != sizeof(float) || glu->nb[1] < static_cast<size_t>(glu->ne[0]) * sizeof(float) ||
      gate->src[0]->ne != up->src[0]->ne)
    return false;
  const Tensor* mms[2] = {gate, up};
  return stacked_cublas_usable(mms, 2, t.fast);
}

// rope_k's permute(0, 2, 1, 3): a view of rope_k with dims 1 and 2 swapped.
bool is_k_permute(const Tensor* v, const Tensor* k) {
  return v && v->view_src == k && v->view_offset == 0 && v->type == k->type &&
         v->ne == Shape{k->ne[0], k->ne[2], k->ne[1], k->ne[3]} &&
         v->nb == std::array<size_t, kMaxDims>{k->nb[0], k->nb[2], k->nb[1], k->nb[3]};
}

bool rope_set_rows_qk_ok(const Tensor* rope_k, const Tensor* set_rows, const Tensor* rope_q) {
  if (!rope_k || !set_rows || rope_k->op != OpKind::rope || set_rows->op != OpKind::set_rows) return false;
  if (set_rows->type != DType::f16 && set_rows->type != DType::f32) return false;
  if (!is_k_permute(set_rows->src[0], rope_k) || !is_f32(rope_k) || !is_f32(rope_k->src[0])) return false;
  const Tensor* cache = set_rows->src[2];
  const Tensor* idx = set_rows->src[1];
  if (!cache || !idx || idx->type != DType::i32 || set_rows->nb[0] != dtype_type_size(set_rows->type))
    return false;
  // the rows the kernel reads: contiguous elements (x[j]), as rope_kernel reads them
  if (rope_k->src[0]->nb[0] != sizeof(float)) return false;
  const Tensor* readers[] = {rope_k->src[0], rope_k->src[1], rope_k->src[2], idx,
                             rope_q ? rope_q->src[0] : nullptr};
  for (const Tensor* in : readers)
    if (!disjoint(set_rows, in)) return false;
  if (!rope_q) return true;
  if (rope_q->op != OpKind::rope || !is_f32(rope_q) || !is_f32(rope_q->src[0]) ||
      rope_q->src[0]->nb[0] != sizeof(float) || rope_q->nb[0] != sizeof(float))
    return false;
  // one RopeArgs for both: the same positions, frequency factors and parameters
  if (rope_q->src[1] != rope_k->src[1] || rope_q->src[2] != rope_k->src[2] ||
      rope_q->ne[2] != rope_k->ne[2] || rope_q->ne[3] != rope_k->ne[3] ||
      std::memcmp(&rope_q->get_params<RopeParams>(), &rope_k->get_params<RopeParams>(), sizeof(RopeParams)) !=
          0)
    return false;
  for (const Tensor* in :
       std::initializer_list<const Tensor*>{rope_k->src[0], rope_k->src[1], rope_k->src[2], idx, cache})
    if (!disjoint(rope_q, in)) return false;
  return may_write_over(rope_q, rope_q->src[0]);
}

// ... and the values' store at the same cells: [head_dim, n_tokens, n_head_kv] rows of f32 (a permuted
// view of V), the same tokens as K, into a cache of the keys' type; nothing it reads is written by
// the other members.
bool rope_set_rows_ok(const Tensor* rope_k, const Tensor* set_rows, const Tensor* rope_q, const Tensor* set_rows_v) {
  if (!rope_set_rows_qk_ok(rope_k, set_rows, rope_q)) return false;
  if (!set_rows_v) return true;
  if (!rope_q || set_rows_v->op != OpKind::set_rows || set_rows_v->type != set_rows->type) return false;
  const Tensor* v = set_rows_v->src[0];
  const Tensor* idx = set_rows_v->src[1];
  const Tensor* cache = set_rows_v->src[2];
  const Tensor* k = rope_k->src[0];
  if (!v || !idx || !cache || !is_f32(v) || v->nb[0] != sizeof(float) || idx->type != DType::i32 ||
      set_rows_v->nb[0] != dtype_type_size(set_rows_v->type))
    return false;
  // v is [d, n_tokens, n_head_kv, ne3] like K's permuted view; its tokens those of K
  if (v->ne[1] != k->ne[2] || v->ne[3] != k->ne[3] || v->ne[2] != k->ne[1] || set_rows_v->ne[1] <= 0) return false;
  for (const Tensor* in : std::initializer_list<const Tensor*>{k, rope_k->src[1], rope_k->src[2], set_rows->src[1],
                                                               rope_q->src[0], v, idx})
    if (!disjoint(set_rows_v, in)) return false;
  for (const Tensor* out : std::initializer_list<const Tensor*>{set_rows, rope_q})
    if (!disjoint(out, v) || !disjoint(out, idx) || !disjoint(out, set_rows_v)) return false;
  return true;
}

bool scale_mask_soft_max_ok(const Tensor* scale, const Tensor* add, const Tensor* soft_max) {
  if (!scale || !add || !soft_max || scale->op != OpKind::scale || add->op != OpKind::add ||
      soft_max->op != OpKind::soft_max)
    return false;
  if (add->src[0] != scale || soft_max->src[0] != add || soft_max->src[1] != nullptr) return false;
  if (!same_shape(scale, add) || !same_shape(add, soft_max) || !is_f32(scale->src[0]) ||
      !is_f32(add->src[1]) || !is_f32(soft_max) || soft_max->nb[0] != sizeof(float))
    return false;
  return may_write_over(soft_max, scale->src[0]) && disjoint(soft_max, add->src[1]);
}

bool moe_route_ok(const Tensor* const* n) {
  const Tensor* soft_max = n[0];
  const Tensor* top_k = n[1];
  const Tensor* get_rows = n[2];
  const Tensor* sum_rows = n[3];
  const Tensor* div = n[4];
  if (!soft_max || !top_k || !get_rows || soft_max->op != OpKind::soft_max || top_k->op != OpKind::top_k ||
      get_rows->op != OpKind::get_rows)
    return false;
  const int64_t n_expert = soft_max->ne[0], n_tokens = soft_max->ne[1];
  const int k = top_k->get_params<TopKParams>().k;
  if (n_expert > kMoeMaxExperts || soft_max->ne[2] != 1 || soft_max->ne[3] != 1 ||
      soft_max->src[1] != nullptr || !is_f32(soft_max->src[0]) || soft_max->src[0]->nb[0] != sizeof(float) ||
      top_k->src[0] != soft_max || k < 1 || k > n_expert)
    return false;
  if (!is_reshape_of(get_rows->src[0], soft_max, {1, n_expert, n_tokens, 1}) || get_rows->src[1] != top_k)
    return false;
  if ((sum_rows == nullptr) != (div == nullptr)) return false;
  const Tensor* weights = get_rows;
  if (div) {
    const Shape w2{k, n_tokens, 1, 1};
    if (sum_rows->op != OpKind::sum_rows || div->op != OpKind::div || div->src[1] != sum_rows ||
        !is_reshape_of(sum_rows->src[0], get_rows, w2) || !is_reshape_of(div->src[0], get_rows, w2) ||
        div->ne != w2)
      return false;
    weights = div;
  }
  return disjoint(top_k, soft_max->src[0]) && disjoint(weights, soft_max->src[0]) && disjoint(weights, top_k);
}

// K and V of the flash_attn are reshapes of the whole outputs of the gathers (row r of the gather is
// key r % n_kv of head and sequence r / n_kv, as the decode kernel indexes), and the decode kernel
// takes the shapes and the stores' rows.
bool gather_flash_attn_ok(const Tensor* const* n, bool fast) {
  const Tensor* get_k = n[0];
  const Tensor* get_v = n[1];
  const Tensor* fa = n[2];
  if (!fast || !get_k || !get_v || !fa || get_k->op != OpKind::get_rows || get_v->op != OpKind::get_rows ||
      fa->op != OpKind::flash_attn)
    return false;
  const Tensor* k = fa->src[1];
  const Tensor* v = fa->src[2];
  if (!is_reshape_of(k, get_k, k->ne) || !is_reshape_of(v, get_v, v->ne) || get_k->ne[0] != k->ne[0] ||
      get_v->ne[0] != v->ne[0] || get_k->nelements() != k->nelements() ||
      get_v->nelements() != v->nelements())
    return false;
  if (fa->src[0]->ne[1] >= kFlashAttnMmaMinQueries) return false;  // the decode kernel's query counts
  const FlashAttnRows rows{get_k->src[0], get_k->src[1], get_v->src[0], get_v->src[1]};
  return flash_attn_decode_supported(fa, &rows);
}

// rope_flash_attn: rope_set_rows' four roles, both stores f16, whose stores and rope_q the decode
// kernel's flash_attn reads (flash_attn_decode_rope_supported checks the views and the rope's pairs).
// LOOM_CUDA_ROPE_ATTN=0 (read once) keeps them apart: `LOOM_NQ_BASE=LOOM_CUDA_ROPE_ATTN=0
// scripts/gpu-carried.sh normquant` checks that a greedy run's logits are bit-identical either way.
bool rope_flash_attn_ok(const Tensor* const* n, bool fast) {
  static const bool on = env_switch("LOOM_CUDA_ROPE_ATTN");  // =0: rope_set_rows and flash_attn apart, to compare
  const Tensor* fa = n[4];
  if (!on || !fast || !n[0] || !n[1] || !n[2] || !n[3] || !fa || fa->op != OpKind::flash_attn) return false;
  if (fa->src[0]->ne[1] >= kFlashAttnMmaMinQueries || !rope_set_rows_ok(n[0], n[1], n[2], n[3])) return false;
  // The output may lie on bytes the products wrote (Q, K and V die at the ropes and stores, which now
  // run in this kernel): with one split a block writes its heads' rows while another still reads. With
  // splits at every output form the merge kernel writes it, after the last split's block has read them
  // (`loom run -tp 2` on 8B F16: the planner had put the output on those bytes, so every layer ran
  // rope_set_rows and flash_attn apart, 257 kernels a token against 230 with the fold; 2x H200).
  const bool merged = flash_attn_decode_merged(fa);
  for (const Tensor* in : {n[2]->src[0], n[0]->src[0], n[3]->src[0]})
    if (!merged && !disjoint(fa, in)) return false;
  for (const Tensor* in : {n[0]->src[1], n[0]->src[2], n[1]->src[1], n[3]->src[1], fa->src[3], fa->src[4]})
    if (!disjoint(fa, in)) return false;
  // support depends on the rotation pairs' layout only (the launch gets the whole make_rope_args)
  const auto& p = n[0]->get_params<RopeParams>();
  RopeArgs pairs;
  pairs.n_dims = p.n_dims;
  pairs.neox = p.mode == RopeMode::neox;
  return flash_attn_decode_rope_supported(fa, FlashAttnRope{n[0], n[1], n[2], n[3], pairs});
}

unsigned capped(int64_t n, unsigned cap) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(n, 1), cap));
}

// ---- host side: glu launches -----------------------------------------------------------------------

template <class F>
CudaError glu_float(const LaunchContext& ctx, const Tensor* gate, const Tensor* up, const Tensor* glu) {
  const Tensor* wg = gate->src[0];
  const Tensor* x = gate->src[1];
  const dim3 grid(static_cast<unsigned>((glu->ne[0] + kMatVecWarps - 1) / kMatVecWarps),
                  capped((glu->ne[1] + kMatVecMaxCols - 1) / kMatVecMaxCols, kMaxGridYZ),
                  capped(glu->ne[2] * glu->ne[3], kMaxGridYZ));
  glu_mat_vec_kernel<F><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      desc_of(glu), desc_of(wg), desc_of(up->src[0]), desc_of(x), x->ne[2] / wg->ne[2], x->ne[3] / wg->ne[3],
      glu->op == OpKind::swiglu);
  LOOM_CUDA_CHECK_LAUNCH("glu_mat_vec_kernel");
  return {};
}

template <class D, int kCols>
CudaError glu_q8_cols(const LaunchContext& ctx, const Tensor* gate, const Tensor* up, const Tensor* glu) {
  const Tensor* wg = gate->src[0];
  const Tensor* x = gate->src[1];
  const dim3 grid(static_cast<unsigned>((glu->ne[0] + kMatVecWarps - 1) / kMatVecWarps),
                  capped((glu->ne[1] + kCols - 1) / kCols, kMaxGridYZ),
                  capped(glu->ne[2] * glu->ne[3], kMaxGridYZ));
  glu_mat_vec_q8_kernel<D, kCols><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      desc_of(glu), desc_of(wg), desc_of(up->src[0]), static_cast<const typename D::Act*>(ctx.scratch),
      x->ne[2] / wg->ne[2], x->ne[3] / wg->ne[3], glu->op == OpKind::swiglu);
  LOOM_CUDA_CHECK_LAUNCH("glu_mat_vec_q8_kernel");
  return {};
}

// Quantizes the shared activations once (into ctx.scratch), then both products in one kernel.
template <class D>
CudaError glu_q8(const LaunchContext& ctx, const Tensor* gate, const Tensor* up, const Tensor* glu) {
  LOOM_CUDA_TRY(launch_quantize_activations(ctx, gate->src[0]->type, gate->src[1]));
  return glu->ne[1] == 1 ? glu_q8_cols<D, 1>(ctx, gate, up, glu)
                         : glu_q8_cols<D, kMatVecMaxCols>(ctx, gate, up, glu);
}

// ---- host side: mat_vec_multi launches -------------------------------------------------------------

// The parts of a mat_vec_multi launch and the blocks of grid.x they need together (0: no rows).
unsigned multi_args(const Tensor* const* mms, int count, MultiArgs& args) {
  unsigned blocks = 0;
  for (int t = 0; t < kMultiMax; ++t) {
    MultiPart& p = args.part[t];
    if (t >= count) {
      p = MultiPart{TensorDesc{}, TensorDesc{}, 1, 1, UINT_MAX};
      continue;
    }
    const Tensor* w = mms[t]->src[0];
    const Tensor* x = mms[t]->src[1];
    p = MultiPart{desc_of(mms[t]), desc_of(w), x->ne[2] / w->ne[2], x->ne[3] / w->ne[3], blocks};
    blocks += static_cast<unsigned>((mms[t]->ne[0] + kMatVecWarps - 1) / kMatVecWarps);
  }
  return blocks;
}

template <class F>
CudaError multi_float(const LaunchContext& ctx, const Tensor* const* mms, int count) {
  MultiArgs args;
  const unsigned blocks = multi_args(mms, count, args);
  if (blocks == 0) return {};
  const Tensor* x = mms[0]->src[1];
  const dim3 grid(blocks, capped((x->ne[1] + kMatVecMaxCols - 1) / kMatVecMaxCols, kMaxGridYZ),
                  capped(x->ne[2] * x->ne[3], kMaxGridYZ));
  mat_vec_multi_kernel<F><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(args, desc_of(x));
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_multi_kernel");
  return {};
}

template <class D, int kCols>
CudaError multi_q8_cols(const LaunchContext& ctx, const Tensor* const* mms, int count) {
  MultiArgs args;
  const unsigned blocks = multi_args(mms, count, args);
  if (blocks == 0) return {};
  const Tensor* x = mms[0]->src[1];
  const dim3 grid(blocks, capped((x->ne[1] + kCols - 1) / kCols, kMaxGridYZ),
                  capped(x->ne[2] * x->ne[3], kMaxGridYZ));
  mat_vec_multi_q8_kernel<D, kCols><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      args, static_cast<const typename D::Act*>(ctx.scratch));
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_multi_q8_kernel");
  return {};
}

// Quantizes the shared activations once (into ctx.scratch), then all products in one kernel, with
// mul_mat's column tiling (1 column, or kMatVecMaxCols) so that each row sums as mul_mat's does.
template <class D>
CudaError multi_q8(const LaunchContext& ctx, const Tensor* const* mms, int count) {
  const Tensor* x = mms[0]->src[1];
  LOOM_CUDA_TRY(launch_quantize_activations(ctx, mms[0]->src[0]->type, x));
  return x->ne[1] == 1 ? multi_q8_cols<D, 1>(ctx, mms, count)
                       : multi_q8_cols<D, kMatVecMaxCols>(ctx, mms, count);
}

}  // namespace

// ---- launchers -------------------------------------------------------------------------------------

namespace {

bool packed_rows16(const Tensor* t, int64_t n) {
  return t->type == DType::f32 && t->ne[0] == n && t->nb[0] == sizeof(float) && t->nb[1] % 16 == 0 &&
         t->nb[2] % 16 == 0 && t->nb[3] % 16 == 0 && reinterpret_cast<uintptr_t>(t->data) % 16 == 0;
}

// The fast kernel for y = rms_norm(x = a (+ b)) * w: packed 16-byte aligned rows of at most 8192,
// b of y's shape (no broadcast), w one packed vector. Returns false where the exact kernel must run.
bool rms_norm_mul_fast_takes(const Tensor* y, const Tensor* a, const Tensor* b, const Tensor* sum, const Tensor* w) {
  const int64_t n = y->ne[0];
  if (n % 4 != 0 || n > 8192 || !packed_rows16(y, n) || !packed_rows16(a, n) || a->ne != y->ne ||
      !packed_rows16(w, n) || w->ne[1] != 1 || w->ne[2] != 1 || w->ne[3] != 1)
    return false;
  return !b || (packed_rows16(b, n) && b->ne == y->ne && packed_rows16(sum, n) && sum->ne == y->ne);
}

// Whether the fast kernel can write y as quantized activations of `block`: whole blocks per row,
// y contiguous and large enough for the layout (its f32 bytes always are).
bool act_out_fits(const Tensor* y, int block) {
  return (block == 32 || block == 256) && y->ne[0] % block == 0 && y->is_contiguous() &&
         act_fast_size(y->nrows(), y->ne[0], block, block == 256) <= y->nbytes();
}

// Whether the fast kernel can write y ([k, n]: n rows of k) as gemm_q's activation tiles of n columns
// (kActGemmQTiles): whole 256-k chunks, y contiguous, 16-byte aligned and large enough (n >= 32 at
// most 64 columns: the tiles take whole 64-column tiles of f16).
bool tiles_out_fits(const Tensor* y) {
  return y->ne[0] % gemm_q_plan::kChunk == 0 && y->ne[2] == 1 && y->ne[3] == 1 && y->is_contiguous() &&
         gemm_q_tiles_bytes(y->ne[1], y->ne[0]) <= y->nbytes() && reinterpret_cast<uintptr_t>(y->data) % 16 == 0;
}
// ... or as contiguous f16 rows (kActF16: f16_rows_fit; 8-byte aligned rows, as n % 4 == 0, which the fast
// kernel requires).
bool out_fits(const Tensor* y, int block) {
  return block == kActGemmQTiles ? tiles_out_fits(y) : block == kActF16 ? f16_rows_fit(y) : act_out_fits(y, block);
}

// With `ll`, a is this rank's partial of an all-reduce over ll's group (one block per row, rows <=
// kLLSlots).
bool rms_norm_mul_fast(const LaunchContext& ctx, const Tensor* y, const Tensor* a, const Tensor* b,
                       const Tensor* sum, const Tensor* w, float eps, const LLGroup* ll = nullptr) {
  const int64_t n = y->ne[0];
  if (!ctx.fast || !rms_norm_mul_fast_takes(y, a, b, sum, w)) return false;
  if (ctx.act_out_block && !out_fits(y, ctx.act_out_block)) return false;
  if (ll && y->nrows() > kLLSlots) return false;
  const ActFastRaw act =
      ctx.act_out_block > 0 ? act_fast_at(y->data, y->nrows(), n, ctx.act_out_block) : ActFastRaw{};
  const TensorDesc none{};
  auto pick = [n](auto ar) {
    constexpr bool kAr = decltype(ar)::value;
    return n <= 1024   ? rms_norm_mul_fast_kernel<4, kAr>
           : n <= 2048 ? rms_norm_mul_fast_kernel<8, kAr>
           : n <= 4096 ? rms_norm_mul_fast_kernel<16, kAr>
                       : rms_norm_mul_fast_kernel<32, kAr>;
  };
  auto kernel = ll ? pick(std::true_type{}) : pick(std::false_type{});
  const unsigned grid = ll ? static_cast<unsigned>(y->nrows()) : row_grid(y->nrows());
  kernel<<<grid, kNormFastThreads, 0, ctx.stream>>>(desc_of(y), desc_of(a), b ? desc_of(b) : none,
                                                    b ? desc_of(sum) : none, b != nullptr,
                                                    static_cast<const float*>(w->data), eps, act,
                                                    ctx.act_out_block, ll ? *ll : LLGroup{}, read_before_wait(w));
  return true;
}

// The addend of `add` that is not the all-reduce's sum: the residual.
const Tensor* residual_of(const Tensor* add, const Tensor* ar) { return add->src[0] == ar ? add->src[1] : add->src[0]; }

// all_reduce -> add -> rms_norm -> mul in one kernel: the fast mode, a group with LL buffers, rows the
// slots hold, and the fast norm's operands with the partial in place of the sum.
bool all_reduce_rms_norm_mul_ok(const Tensor* const* nodes, bool fast) {
  const Tensor *ar = nodes[0], *add = nodes[1], *norm = nodes[2], *mul = nodes[3];
  if (!fast || !ar || ar->op != OpKind::all_reduce || !add || !rms_norm_mul_ok(add, norm, mul)) return false;
  if (add->src[0] != ar && add->src[1] != ar) return false;
  const Tensor* partial = ar->src[0];
  if (!ll_group(*ar->get_params<AllReduceParams>().comm) || mul->nrows() > kLLSlots || !is_f32(partial) ||
      partial->ne != add->ne || !may_write_over(add, partial) || !may_write_over(mul, partial))
    return false;
  return rms_norm_mul_fast_takes(mul, partial, residual_of(add, ar), add, mul->src[1]);
}

// A norm asked for quantized activations that the fast kernel did not write: the mat-vecs reading
// them would read f32 as codes.
CudaError act_out_missed() {
  return CudaError::runtime(cudaErrorInvalidValue,
                            "rms_norm_mul: quantized activations asked for, but the fast norm kernel does not take "
                            "these operands",
                            __FILE__, __LINE__);
}
}  // namespace

bool fused_takes_f16_b(FusedKind kind, const Tensor* const* nodes, FusedTarget t) {
  const Tensor* x = nodes[0]->src[1];
  if (x->type != DType::f32 || !x->is_contiguous() || x->ne[2] != 1 || x->ne[3] != 1) return false;
  // the launchers' order: gemm_q first, then cuBLAS over stacked f16 weights, then the dequantized Q/K/V
  if (kind == FusedKind::glu_mat_vec)
    return !glu_gemm_q_ok(nodes, t) && glu_cublas_ok(nodes, t) && nodes[0]->src[0]->type == DType::f16;
  if (kind == FusedKind::mat_vec_multi)
    return !multi_gemm_q_ok(nodes, t) && ((multi_cublas_ok(nodes, t) && nodes[0]->src[0]->type == DType::f16) ||
                                          (!multi_cublas_ok(nodes, t) && multi_dequant_ok(nodes, t)));
  return false;
}

bool glu_writes_f16(const Tensor* const* nodes, FusedTarget t) {
  return !glu_gemm_q_ok(nodes, t) && glu_cublas_ok(nodes, t) && stacked_glu_f16_out_fits(nodes[2]);
}

bool fused_takes_gemm_q_tiles(FusedKind kind, const Tensor* const* nodes, FusedTarget t) {
  if (kind == FusedKind::glu_mat_vec) return glu_gemm_q_ok(nodes, t);
  if (kind == FusedKind::mat_vec_multi) return multi_gemm_q_ok(nodes, t);
  return false;
}

bool norm_act_out_supported(FusedKind kind, const Tensor* const* nodes, int block) {
  if (kind == FusedKind::rms_norm_mul) {
    const Tensor* norm = nodes[0];
    const Tensor* mul = nodes[1];
    return rms_norm_mul_fast_takes(mul, norm->src[0], nullptr, nullptr, mul->src[1]) && out_fits(mul, block);
  }
  if (kind == FusedKind::add_rms_norm_mul) {
    const Tensor* add = nodes[0];
    const Tensor* mul = nodes[2];
    return rms_norm_mul_fast_takes(mul, add->src[0], add->src[1], add, mul->src[1]) && out_fits(mul, block);
  }
  if (kind == FusedKind::all_reduce_add_rms_norm_mul) {
    const Tensor* ar = nodes[0];
    const Tensor* add = nodes[1];
    const Tensor* mul = nodes[3];
    return rms_norm_mul_fast_takes(mul, ar->src[0], residual_of(add, ar), add, mul->src[1]) && out_fits(mul, block);
  }
  return false;
}

CudaError launch_all_reduce_add_rms_norm_mul(const LaunchContext& ctx, const Tensor* ar, const Tensor* add,
                                             const Tensor* norm, const Tensor* mul) {
  if (mul->nelements() == 0) return {};
  const LLGroup* ll = ll_group(*ar->get_params<AllReduceParams>().comm);
  if (!ll)
    return CudaError::runtime(cudaErrorInvalidValue, "all_reduce_add_rms_norm_mul: the group has no LL buffers",
                              __FILE__, __LINE__);
  if (!rms_norm_mul_fast(ctx, mul, ar->src[0], residual_of(add, ar), add, mul->src[1],
                         norm->get_params<NormParams>().eps, ll))
    return CudaError::runtime(cudaErrorInvalidValue,
                              "all_reduce_add_rms_norm_mul: the fast norm kernel does not take these operands",
                              __FILE__, __LINE__);
  LOOM_CUDA_CHECK_LAUNCH("rms_norm_mul_fast_kernel (all-reduce)");
  return {};
}

CudaError launch_rms_norm_mul(const LaunchContext& ctx, const Tensor* norm, const Tensor* mul) {
  const int64_t rows = mul->nrows();
  if (rows == 0 || mul->ne[0] == 0) return {};
  const float eps = norm->get_params<NormParams>().eps;
  if (rms_norm_mul_fast(ctx, mul, norm->src[0], nullptr, nullptr, mul->src[1], eps)) {
    LOOM_CUDA_CHECK_LAUNCH("rms_norm_mul_fast_kernel");
    return {};
  }
  if (ctx.act_out_block) return act_out_missed();
  const TensorDesc none{};
  rms_norm_mul_kernel<<<row_grid(rows), row_block_threads(mul->ne[0]), 0, ctx.stream>>>(
      desc_of(mul), desc_of(norm->src[0]), none, none, false, desc_of(mul->src[1]), eps);
  LOOM_CUDA_CHECK_LAUNCH("rms_norm_mul_kernel");
  return {};
}

CudaError launch_add_rms_norm_mul(const LaunchContext& ctx, const Tensor* add, const Tensor* norm,
                                  const Tensor* mul) {
  const int64_t rows = mul->nrows();
  if (rows == 0 || mul->ne[0] == 0) return {};
  const float eps = norm->get_params<NormParams>().eps;
  if (rms_norm_mul_fast(ctx, mul, add->src[0], add->src[1], add, mul->src[1], eps)) {
    LOOM_CUDA_CHECK_LAUNCH("rms_norm_mul_fast_kernel");
    return {};
  }
  if (ctx.act_out_block) return act_out_missed();
  rms_norm_mul_kernel<<<row_grid(rows), row_block_threads(mul->ne[0]), 0, ctx.stream>>>(
      desc_of(mul), desc_of(add->src[0]), desc_of(add->src[1]), desc_of(add), true, desc_of(mul->src[1]), eps);
  LOOM_CUDA_CHECK_LAUNCH("rms_norm_mul_kernel");
  return {};
}

CudaError launch_mat_vec_bias(const LaunchContext& ctx, const Tensor* mm, const Tensor* add) {
  return launch_mul_mat_vec_bias(ctx, mm, add->src[1], add);
}

CudaError launch_glu_mat_vec(const LaunchContext& ctx, const Tensor* mm_gate, const Tensor* mm_up,
                             const Tensor* glu) {
  if (glu->nelements() == 0) return {};
  const Tensor* n[3] = {mm_gate, mm_up, glu};
  if (glu_gemm_q_ok(n, {ctx.fast, ctx.sm90a})) return launch_gemm_q_products(ctx, glu_products(n));
  const Tensor* mms[2] = {mm_gate, mm_up};
  if (glu_cublas_ok(n, {ctx.fast, ctx.sm90a})) return launch_stacked_cublas(ctx, mms, 2, glu);
  if (ctx.fast && mat_vec_fast_supports_multi(ctx, mms, 2)) return launch_mat_vec_fast_glu(ctx, mm_gate, mm_up, glu);
  if (ctx.act_in) return act_in_missed();
  const CudaError none = CudaError::runtime(
      cudaErrorInvalidValue, "glu_mat_vec: no kernel for this weight type", __FILE__, __LINE__);
  return visit_weight_type(
      mm_gate->src[0]->type, none, [&](auto f) { return glu_float<decltype(f)>(ctx, mm_gate, mm_up, glu); },
      [&](auto q) { return glu_q8<typename decltype(q)::Dot>(ctx, mm_gate, mm_up, glu); });
}

CudaError launch_mat_vec_multi(const LaunchContext& ctx, const Tensor* mm0, const Tensor* mm1,
                               const Tensor* mm2) {
  const Tensor* mms[kMultiMax] = {mm0, mm1, mm2};
  const int count = mm2 ? 3 : 2;
  const Tensor* x = mm0->src[1];
  if (x->nelements() == 0) return {};
  if (multi_gemm_q_ok(mms, {ctx.fast, ctx.sm90a})) return launch_gemm_q_products(ctx, multi_products(mms));
  if (multi_cublas_ok(mms, {ctx.fast, ctx.sm90a})) return launch_stacked_cublas(ctx, mms, count);
  if (multi_dequant_ok(mms, {ctx.fast, ctx.sm90a})) return launch_dequant_multi(ctx, mms, count);
  if (ctx.fast && mat_vec_fast_mixed_ok(mms, count)) return launch_mat_vec_fast_mixed(ctx, mms, count);
  if (ctx.fast && mat_vec_fast_supports_multi(ctx, mms, count)) return launch_mat_vec_fast_multi(ctx, mms, count);
  if (ctx.act_in) return act_in_missed();
  const CudaError none = CudaError::runtime(
      cudaErrorInvalidValue, "mat_vec_multi: no kernel for this weight type", __FILE__, __LINE__);
  return visit_weight_type(
      mm0->src[0]->type, none, [&](auto f) { return multi_float<decltype(f)>(ctx, mms, count); },
      [&](auto q) { return multi_q8<typename decltype(q)::Dot>(ctx, mms, count); });
}

// LOOM_CUDA_DECODE_ROPE=0 (read once) keeps one-token passes on the general kernel, for comparisons.
bool decode_rope_enabled() {
  static const bool on = env_switch("LOOM_CUDA_DECODE_ROPE");
  return on;
}

CudaError launch_rope_set_rows(const LaunchContext& ctx, const Tensor* rope_k, const Tensor* set_rows,
                               const Tensor* rope_q, const Tensor* set_rows_v, const RopeArgs& args) {
  const Tensor* k = rope_k->src[0];
  const int64_t tokens = k->ne[2] * k->ne[3];
  const int64_t heads = k->ne[1] + (rope_q ? rope_q->ne[1] : 0) + (set_rows_v ? set_rows_v->src[0]->ne[2] : 0);
  if (tokens == 0 || heads == 0) return {};
  if (rope_q && (rope_q->ne[2] != k->ne[2] || rope_q->ne[3] != k->ne[3]))
    return CudaError::runtime(cudaErrorInvalidValue, "rope_set_rows: Q and K of different tokens", __FILE__,
                              __LINE__);
  if (args.n_dims / 2 > kRopeMaxPairs || tokens > INT32_MAX)
    return CudaError::runtime(cudaErrorInvalidValue, "rope_set_rows: head or token count out of range", __FILE__,
                              __LINE__);
  const Tensor* ff = rope_k->src[2];
  const TensorDesc ff_desc = ff ? desc_of(ff) : TensorDesc{};
  const TensorDesc q_dst = rope_q ? desc_of(rope_q) : TensorDesc{};
  const TensorDesc q_src = rope_q ? desc_of(rope_q->src[0]) : TensorDesc{};
  const TensorDesc v_cache = set_rows_v ? desc_of(set_rows_v) : TensorDesc{};
  const TensorDesc v_src = set_rows_v ? desc_of(set_rows_v->src[0]) : TensorDesc{};
  const TensorDesc v_idx = set_rows_v ? desc_of(set_rows_v->src[1]) : TensorDesc{};
  int64_t ne0 = std::max(k->ne[0], rope_q ? rope_q->ne[0] : 0);
  if (set_rows_v) ne0 = std::max(ne0, set_rows_v->src[0]->ne[0]);
  if (tokens == 1 && ne0 * kRopeDecodeHeads <= kRopeDecodeThreads && decode_rope_enabled()) {
    rope_set_rows_decode_kernel<<<static_cast<unsigned>((heads * ne0 + kRopeDecodeThreads - 1) / kRopeDecodeThreads),
                                  kRopeDecodeThreads, 0, ctx.stream>>>(
        desc_of(set_rows), set_rows->type == DType::f16, desc_of(k), desc_of(set_rows->src[1]), q_dst, q_src,
        rope_q != nullptr, v_cache, v_src, v_idx, set_rows_v != nullptr, desc_of(rope_k->src[1]), ff_desc,
        ff != nullptr, args, ne0);
    LOOM_CUDA_CHECK_LAUNCH("rope_set_rows_decode_kernel");
    return {};
  }
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((heads + kRopeHeads - 1) / kRopeHeads));
  // LOOM_CUDA_ROPE_EARLY=0 (read once): the angles after the wait, for comparisons
  static const bool early_on = env_switch("LOOM_CUDA_ROPE_EARLY");
  const bool early = early_on && read_before_wait(rope_k->src[1]) && (!ff || read_before_wait(ff));
  rope_set_rows_kernel<<<grid, 256, 0, ctx.stream>>>(
      desc_of(set_rows), set_rows->type == DType::f16, desc_of(k), desc_of(set_rows->src[1]), q_dst, q_src,
      rope_q != nullptr, v_cache, v_src, v_idx, set_rows_v != nullptr, desc_of(rope_k->src[1]), ff_desc,
      ff != nullptr, args, early);
  LOOM_CUDA_CHECK_LAUNCH("rope_set_rows_kernel");
  return {};
}

CudaError launch_scale_mask_soft_max(const LaunchContext& ctx, const Tensor* scale, const Tensor* add,
                                     const Tensor* soft_max) {
  const int64_t rows = soft_max->nrows();
  if (rows == 0 || soft_max->ne[0] == 0) return {};
  const auto& sp = scale->get_params<ScaleParams>();
  scale_mask_soft_max_kernel<<<row_grid(rows), row_block_threads(soft_max->ne[0]), 0, ctx.stream>>>(
      desc_of(soft_max), desc_of(scale->src[0]), desc_of(add->src[1]), sp.scale, sp.bias,
      soft_max->get_params<SoftMaxParams>().scale);
  LOOM_CUDA_CHECK_LAUNCH("scale_mask_soft_max_kernel");
  return {};
}

CudaError launch_moe_route(const LaunchContext& ctx, const Tensor* soft_max, const Tensor* top_k,
                           const Tensor* get_rows, const Tensor* sum_rows, const Tensor* div) {
  const int64_t n_tokens = soft_max->ne[1];
  if (n_tokens == 0) return {};
  // weights (e, t): get_rows' [1, k, T] or div's [k, T]
  const Tensor* weights = div ? div : get_rows;
  const auto w_e = static_cast<int64_t>(div ? div->nb[0] : get_rows->nb[1]);
  const auto w_t = static_cast<int64_t>(div ? div->nb[1] : get_rows->nb[2]);
  moe_route_kernel<<<row_grid(n_tokens), row_block_threads(soft_max->ne[0]), 0, ctx.stream>>>(
      desc_of(soft_max->src[0]), soft_max->get_params<SoftMaxParams>().scale, desc_of(top_k),
      static_cast<char*>(weights->data), w_e, w_t, top_k->get_params<TopKParams>().k, sum_rows != nullptr);
  LOOM_CUDA_CHECK_LAUNCH("moe_route_kernel");
  return {};
}

CudaError launch_gather_flash_attn(const LaunchContext& ctx, const Tensor* get_k, const Tensor* get_v,
                                   const Tensor* flash_attn) {
  const FlashAttnRows rows{get_k->src[0], get_k->src[1], get_v->src[0], get_v->src[1]};
  // again at launch, with the data pointers set (the 16-byte loads need aligned stores, q and dst)
  if (!flash_attn_decode_supported(flash_attn, &rows))
    return CudaError::runtime(cudaErrorInvalidValue, "gather_flash_attn: operands the decode kernel cannot read",
                              __FILE__, __LINE__);
  const auto p = flash_attn->get_params<FlashAttnParams>();
  return launch_flash_attn_decode(ctx, flash_attn, p.scale, p.softcap, &rows);
}

CudaError launch_rope_flash_attn(const LaunchContext& ctx, const Tensor* rope_k, const Tensor* set_rows_k,
                                 const Tensor* rope_q, const Tensor* set_rows_v, const Tensor* flash_attn,
                                 const RopeArgs& args) {
  const FlashAttnRope rope{rope_k, set_rows_k, rope_q, set_rows_v, args};
  const auto p = flash_attn->get_params<FlashAttnParams>();
  return launch_flash_attn_decode(ctx, flash_attn, p.scale, p.softcap, nullptr, &rope);
}

bool fused_uses_cublas(FusedKind kind, const Tensor* const* nodes, FusedTarget t) {
  return (kind == FusedKind::mat_vec_multi && (multi_cublas_ok(nodes, t) || multi_dequant_ok(nodes, t))) ||
         (kind == FusedKind::glu_mat_vec && glu_cublas_ok(nodes, t));
}

size_t fused_scratch_bytes(FusedKind kind, const Tensor* const* nodes, FusedTarget t) {
  switch (kind) {
    case FusedKind::glu_mat_vec:  // the gemm_q form: the shared activation packed once, the partial sums
      if (glu_gemm_q_ok(nodes, t)) return gemm_q_products_scratch_bytes(glu_products(nodes));
      if (glu_cublas_ok(nodes, t)) return stacked_cublas_scratch_bytes(nodes, 2);
      return quantized_activation_bytes(nodes[0]->src[0]->type, nodes[0]->src[1]);
    case FusedKind::mat_vec_multi:
      if (multi_gemm_q_ok(nodes, t)) return gemm_q_products_scratch_bytes(multi_products(nodes));
      if (multi_cublas_ok(nodes, t)) return stacked_cublas_scratch_bytes(nodes, nodes[2] ? 3 : 2);
      if (multi_dequant_ok(nodes, t)) return dequant_multi_scratch_bytes(nodes, nodes[2] ? 3 : 2);
      return quantized_activation_bytes(nodes[0]->src[0]->type, nodes[0]->src[1]);
    case FusedKind::mat_vec_bias:  // the shared activation, quantized once for all products
      return quantized_activation_bytes(nodes[0]->src[0]->type, nodes[0]->src[1]);
    case FusedKind::gather_flash_attn:  // the key splits' partial results
      return flash_attn_decode_scratch_bytes(nodes[2]);
    case FusedKind::rope_flash_attn:
      return flash_attn_decode_scratch_bytes(nodes[4]);
    default:
      return 0;
  }
}

bool fused_supported(FusedKind kind, const Tensor* const* nodes, FusedTarget t) {
  const bool fast = t.fast;
  switch (kind) {
    case FusedKind::rms_norm_mul:
      return rms_norm_mul_ok(nullptr, nodes[0], nodes[1]);
    case FusedKind::add_rms_norm_mul:
      return nodes[0] && rms_norm_mul_ok(nodes[0], nodes[1], nodes[2]);
    case FusedKind::all_reduce_add_rms_norm_mul:
      return all_reduce_rms_norm_mul_ok(nodes, fast);
    case FusedKind::mat_vec_bias:  // the mat-vec kernels sum a column unlike gemm_q (batch_invariant)
      return !batch_invariant() && mat_vec_bias_ok(nodes[0], nodes[1], fast);
    case FusedKind::glu_mat_vec:
      return !batch_invariant() && (glu_ok(nodes[0], nodes[1], nodes[2], fast) || glu_gemm_q_ok(nodes, t) || glu_cublas_ok(nodes, t));
    case FusedKind::rope_set_rows:
      return rope_set_rows_ok(nodes[0], nodes[1], nodes[2], nodes[3]);
    case FusedKind::scale_mask_soft_max:
      return scale_mask_soft_max_ok(nodes[0], nodes[1], nodes[2]);
    case FusedKind::moe_route:
      return moe_route_ok(nodes);
    case FusedKind::mat_vec_multi:
      return !batch_invariant() && (mat_vec_multi_ok(nodes, fast) || multi_gemm_q_ok(nodes, t) ||
                                    multi_cublas_ok(nodes, t) || multi_dequant_ok(nodes, t));
    case FusedKind::gather_flash_attn:
      return gather_flash_attn_ok(nodes, fast);
    case FusedKind::rope_flash_attn:
      return rope_flash_attn_ok(nodes, fast);
    case FusedKind::none:
    case FusedKind::count_:
      break;
  }
  return false;
}

}  // namespace loom::cuda
