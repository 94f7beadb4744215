// mul_mat and mul_mat_id.
//
// Layout (ggml's): a is [k, m] with each of the m rows holding k contiguous elements, b is [k, n]
// likewise, and dst[i, j] = dot(a row i, b row j) is [m, n] with m innermost. In cuBLAS's
// column-major terms a is a k x m matrix (lda = a.nb1 / size), so dst (m x n, ldc = m) = a^T b.
//
// Paths:
// - f32/f16/bf16 weights and more than kMatVecMaxCols columns: b is packed into scratch in the
//   weights' type and cublasGemmStridedBatchedEx runs with f32 accumulation and f32 output
//   (CUBLAS_COMPUTE_32F without TF32, so f32 weights give true f32 products).
// - f32/f16/bf16 weights otherwise: mul_mat_vec_kernel, one warp per output row and up to
//   kMatVecMaxCols columns, accumulating in float.
// - quantized weights (every block format; quant_dispatch.cuh): b's rows are first quantized into
//   scratch exactly as the CPU backend quantizes them (q8_0 blocks for the 32-element formats, q8_K
//   blocks for the 256-element ones; see quantize_act.cuh), then mul_mat_q8_kernel sums each
//   block's products in integers (dp4a), one warp per output row and up to kMatVecMaxCols columns,
//   kParts lanes per weight block, the block terms formed and summed in double as on the CPU
//   (docs/NUMERICS.md).
//   Multiplying dequantized weights by f32 activations instead left whole-model logits NMSE
//   5e-4..1e-3 away from the CPU backend's on the H200.
//   Bytes model for one column: the weight matrix is read once (m * row_size bytes) plus the
//   quantized column (~1.1 * k bytes, from L1/L2 for every row), so a decode step is
//   bandwidth-bound; with many columns the weights are re-read n / 8 times (from L2 for matrices
//   that fit; a tiled quantized GEMM is future work).
// - the fast numerics mode, quantized weights and more than kMatVecMaxCols columns (prefill):
//   b is packed into scratch as f16, the weights are dequantized to f16 rows in chunks of at most
//   kDequantChunkBytes, and cuBLAS multiplies each chunk on tensor cores (f32 accumulation and
//   output). Bytes model per chunk of r rows: read r * row_size, write and read back 2 r k bytes,
//   against 2 r k n FLOPs: at n = 512 the GEMM's ~0.5 ms per 8B layer outweighs the ~0.2 ms of
//   dequantization. Deterministic: cuBLAS gives the same bits run to run for one configuration.
//   Float weights in the fast mode take the cuBLAS path as in exact mode (f32 weights with TF32).
// The mat-vec inner loops are in mat_vec.cuh, shared with the fused gate/up projection (fused.cu);
// mul_mat_vec_kernel and mul_mat_q8_kernel also serve the fused mat_vec_bias (kBias).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "activation.cuh"
#include "common.cuh"
#include "gemm_q.cuh"
#include "gemm_q_wgmma.cuh"
#include "loom/backend.h"
#include "loom/dtype.h"
#include "mat_vec.cuh"
#include "mat_vec_fast.cuh"
#include "matmul.cuh"
#include "quant.cuh"
#include "quant_dispatch.cuh"
#include "quantize_act.cuh"

namespace loom::cuda {

namespace {

// The device formats must be GGUF's and the CPU backend's (loom/dtype.h).
static_assert(DotQ8_0::kBytes == sizeof(BlockQ8_0) && DotQ8_0::kBlock == kQK8_0);
static_assert(DotQ4_0::kBytes == sizeof(BlockQ4_0) && DotQ4_0::kBlock == kQK4_0);
static_assert(DotQ4_K::kBytes == sizeof(BlockQ4_K) && DotQ4_K::kBlock == kQK_K);
static_assert(DotQ6_K::kBytes == sizeof(BlockQ6_K) && DotQ6_K::kBlock == kQK_K);
static_assert(sizeof(ActQ8_K) == sizeof(BlockQ8_K) && offsetof(ActQ8_K, bsums) == offsetof(BlockQ8_K, bsums));


// dst[i, j0 .. j0+ncols) of batch (i2, i3) for one warp per row i, plus bias[i] with kBias
// (mat_vec_bias: a template parameter, because a run-time one cost the plain kernels registers).
template <class F, bool kBias>
__global__ void mul_mat_vec_kernel(TensorDesc dst, TensorDesc a, TensorDesc b, int64_t r2, int64_t r3,
                                   const float* bias) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= dst.ne[0]) return;  // no block-wide synchronization below
  mat_vec_float_row<F, kBias>(dst, a, b, i, r2, r3, bias);
}

// out[:, e, t] = as[ids[e, t]] * b[:, e or 0, t]: one warp per output row and (e, t) column.
template <class F>
__global__ void mul_mat_id_kernel(TensorDesc dst, TensorDesc as, TensorDesc b, TensorDesc ids) {
  pdl_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= dst.ne[0]) return;
  const int64_t k = as.ne[0];
  for (int64_t t = blockIdx.z; t < dst.ne[2]; t += gridDim.z) {
    for (int64_t e = blockIdx.y; e < dst.ne[1]; e += gridDim.y) {
      const int32_t expert = *reinterpret_cast<const int32_t*>(ids.data + e * ids.nb[0] + t * ids.nb[1]);
      float* out = reinterpret_cast<float*>(element_ptr(dst, i, e, t, 0));
      if (expert < 0 || expert >= as.ne[2]) {
        if (lane == 0) *out = __int_as_float(0x7fc00000);
        continue;
      }
      const char* a_row = row_ptr(as, i, expert, 0);
      const char* b_col = row_ptr(b, b.ne[1] == 1 ? 0 : e, t, 0);
      float acc[1] = {0.0f};
      dot_columns_float<F>(a_row, k, b_col, b.nb[0], 0, 1, acc);
      const float sum = warp_sum(acc[0]);
      if (lane == 0) *out = sum;
    }
  }
}

// ---- quantized weights ------------------------------------------------------------------------------

// Quantizes every row of b (f32, any strides) into q8_0 blocks, rows in (i1, i2, i3) order, k / 32
// blocks each: one warp per block, lane l taking element l.
__global__ void quantize_q8_0_kernel(ActQ8_0* out, TensorDesc b) {
  pdl_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t per_row = b.ne[0] / 32, total = nrows(b) * per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; g < total;
       g += warps) {
    int64_t i1, i2, i3;
    split_row(g / per_row, b.ne[1], b.ne[2], i1, i2, i3);
    const float x = *reinterpret_cast<const float*>(element_ptr(b, (g % per_row) * 32 + lane, i1, i2, i3));
    // the 0 operand drops NaN from the maximum, as the CPU's std::max does
    const float amax = warp_reduce(fmaxf(0.0f, fabsf(x)), MaxOp{});
    const float d = q8_0_scale(amax);
    ActQ8_0& y = out[g];
    y.qs[lane] = static_cast<int8_t>(q8_code(fmul_rn(x, q8_inverse(d))));
    if (lane == 0) {
      y.d = float_to_half(d);
      y.unused = 0;
    }
  }
}

// Quantizes every row of b into q8_K blocks (k / 256 per row): one warp per block, lane l taking
// elements 8l .. 8l+7, so lanes 2j and 2j+1 together hold bsums[j].
__global__ void quantize_q8_k_kernel(ActQ8_K* out, TensorDesc b) {
  pdl_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t per_row = b.ne[0] / 256, total = nrows(b) * per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; g < total;
       g += warps) {
    int64_t i1, i2, i3;
    split_row(g / per_row, b.ne[1], b.ne[2], i1, i2, i3);
    const int64_t i0 = (g % per_row) * 256 + 8 * lane;
    float x[8];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[e] = *reinterpret_cast<const float*>(element_ptr(b, i0 + e, i1, i2, i3));
      amax = fmaxf(amax, fabsf(x[e]));
    }
    amax = warp_reduce(amax, MaxOp{});
    const float d = q8_k_scale(amax);
    const float id = q8_inverse(d);
    uint32_t packed[2] = {0, 0};
    int sum = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int q = q8_code(fmul_rn(x[e], id));
      sum += q;
      packed[e / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (e % 4));
    }
    ActQ8_K& y = out[g];
    auto* qs = reinterpret_cast<uint32_t*>(y.qs + 8 * lane);  // 4-byte aligned: ActQ8_K is 292 bytes
    qs[0] = packed[0];
    qs[1] = packed[1];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (lane % 2 == 0) y.bsums[lane / 2] = static_cast<int16_t>(sum);
    if (lane == 0) y.d = d;
  }
}

// dst[i, j0 .. j0+ncols) of batch (i2, i3) for one warp per row i, ncols <= kCols, plus bias[i]
// with kBias (mat_vec_bias); xq holds b's rows quantized, in (j, i2, i3) order. kCols is 1
// (decoding one token) or kMatVecMaxCols.
template <class D, int kCols, bool kBias>
__global__ void mul_mat_q8_kernel(TensorDesc dst, TensorDesc a, const typename D::Act* xq, int64_t r2,
                                  int64_t r3, const float* bias) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= dst.ne[0]) return;  // no block-wide synchronization below
  mat_vec_q8_row<D, kCols, kBias>(dst, a, xq, i, r2, r3, bias);
}

// out[:, e, t] = as[ids[e, t]] * b[:, e or 0, t] with b quantized in xq (row (e or 0) + b1 * t).
template <class D>
__global__ void mul_mat_id_q8_kernel(TensorDesc dst, TensorDesc as, const typename D::Act* xq, int64_t b1,
                                     TensorDesc ids) {
  pdl_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMatVecWarps + threadIdx.x / kWarpSize;
  if (i >= dst.ne[0]) return;
  const int64_t n_blocks = as.ne[0] / D::kBlock;
  for (int64_t t = blockIdx.z; t < dst.ne[2]; t += gridDim.z) {
    for (int64_t e = blockIdx.y; e < dst.ne[1]; e += gridDim.y) {
      const int32_t expert = *reinterpret_cast<const int32_t*>(ids.data + e * ids.nb[0] + t * ids.nb[1]);
      float* out = reinterpret_cast<float*>(element_ptr(dst, i, e, t, 0));
      if (expert < 0 || expert >= as.ne[2]) {
        if (lane == 0) *out = __int_as_float(0x7fc00000);
        continue;
      }
      const auto* w_row = reinterpret_cast<const uint8_t*>(row_ptr(as, i, expert, 0));
      double acc[1] = {0.0};
      dot_columns<D>(w_row, n_blocks, xq + ((b1 == 1 ? 0 : e) + b1 * t) * n_blocks, 1, acc);
      const auto sum = static_cast<float>(warp_sum(acc[0]));
      if (lane == 0) *out = sum;
    }
  }
}

// Packs b (f32, any strides) into a contiguous [k, n, b2, b3] array of T.
template <typename T>
__global__ void pack_b_kernel(T* out, TensorDesc b) {
  pdl_wait();
  const int64_t n = nelements(b);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i[4];
    split_index(e, b.ne, i);
    const float v = *reinterpret_cast<const float*>(element_ptr(b, i[0], i[1], i[2], i[3]));
    if constexpr (sizeof(T) == 4) {
      out[e] = v;
    } else if constexpr (std::is_same_v<T, __half>) {
      out[e] = __float2half_rn(v);
    } else {
      out[e] = __float2bfloat16_rn(v);
    }
  }
}

// Dequantizes rows [row0, row0 + rows) of the 2-D weight a into `out` as f16, row r at out + r * k:
// each thread writes 8 consecutive elements (16 bytes, coalesced across the warp); k is a multiple
// of every block size.
template <class D>
__global__ void dequantize_rows_f16_kernel(__half* out, TensorDesc a, int64_t row0, int64_t rows) {
  pdl_wait();
  const int64_t groups_per_row = a.ne[0] / 8, total = rows * groups_per_row;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = g / groups_per_row, c = (g % groups_per_row) * 8;
    const auto* block = reinterpret_cast<const uint8_t*>(row_ptr(a, row0 + r, 0, 0)) + (c / D::kBlock) * D::kBytes;
    float x[8];
    D::run(block, static_cast<int>(c % D::kBlock), x);
    alignas(16) __half v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __float2half_rn(x[e]);
    *reinterpret_cast<uint4*>(out + r * a.ne[0] + c) = *reinterpret_cast<const uint4*>(v);
  }
}

// The same for rows that lie back to back (row bytes = k / kBlock * kBytes, as every weight Loom
// loads): the rows are one array of blocks and the output one array of elements, so thread group g
// (8 elements) is block g / (kBlock / 8), elements (g % (kBlock / 8)) * 8 of it, output g * 8: no
// per-row 64-bit division (which, with 8 half conversions a thread, kept the kernel at ~2.9 TB/s
// on the H200). 32-bit indices: the caller keeps groups below 2^31. Same values as above.
__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

template <class D>
__global__ void dequantize_flat_f16_kernel(__half* out, const uint8_t* blocks, uint32_t groups) {
  pdl_wait();
  constexpr uint32_t kPerBlock = D::kBlock / 8;
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += gridDim.x * blockDim.x) {
    float x[8];
    D::run(blocks + static_cast<size_t>(g / kPerBlock) * D::kBytes, static_cast<int>(g % kPerBlock) * 8, x);
    uint4 v;
    v.x = half2_bits(__floats2half2_rn(x[0], x[1]));
    v.y = half2_bits(__floats2half2_rn(x[2], x[3]));
    v.z = half2_bits(__floats2half2_rn(x[4], x[5]));
    v.w = half2_bits(__floats2half2_rn(x[6], x[7]));
    reinterpret_cast<uint4*>(out)[g] = v;
  }
}

// Contiguous f32 b to f16, four elements per thread (n4 = elements / 4; the tail by the first threads).
__global__ void pack_b_f16_contiguous_kernel(__half* out, const float* in, int64_t n) {
  pdl_wait();
  const int64_t n4 = n / 4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(in)[i];
    alignas(8) __half h[4] = {__float2half_rn(v.x), __float2half_rn(v.y), __float2half_rn(v.z), __float2half_rn(v.w)};
    reinterpret_cast<uint2*>(out)[i] = *reinterpret_cast<const uint2*>(h);
  }
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < n - 4 * n4) out[4 * n4 + t] = __float2half_rn(in[4 * n4 + t]);
}

// b (f32, any strides) packed into a contiguous f16 [k, n, b2, b3] array.
CudaError pack_b_f16(const LaunchContext& ctx, __half* out, const Tensor* b) {
  constexpr int kThreads = 256;
  if (b->is_contiguous() && reinterpret_cast<uintptr_t>(b->data) % 16 == 0) {
    pack_b_f16_contiguous_kernel<<<grid_for(b->nelements() / 4 + 1, kThreads), kThreads, 0, ctx.stream>>>(
        out, static_cast<const float*>(b->data), b->nelements());
    LOOM_CUDA_CHECK_LAUNCH("pack_b_f16_contiguous_kernel");
  } else {
    pack_b_kernel<__half><<<grid_for(b->nelements(), kThreads), kThreads, 0, ctx.stream>>>(out, desc_of(b));
    LOOM_CUDA_CHECK_LAUNCH("pack_b_kernel");
  }
  return {};
}

unsigned capped(int64_t n, unsigned cap) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(n, 1), cap));
}

// dst (mm's shape: mm itself, or the add of mat_vec_bias) = mm->src[0] x mm->src[1] (+ bias).
template <class F, bool kBias>
CudaError mat_vec(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  const Tensor* a = mm->src[0];
  const Tensor* b = mm->src[1];
  const dim3 grid(static_cast<unsigned>((dst->ne[0] + kMatVecWarps - 1) / kMatVecWarps),
                  capped((dst->ne[1] + kMatVecMaxCols - 1) / kMatVecMaxCols, kMaxGridYZ),
                  capped(dst->ne[2] * dst->ne[3], kMaxGridYZ));
  mul_mat_vec_kernel<F, kBias><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      desc_of(dst), desc_of(a), desc_of(b), b->ne[2] / a->ne[2], b->ne[3] / a->ne[3], bias);
  LOOM_CUDA_CHECK_LAUNCH("mul_mat_vec_kernel");
  return {};
}

template <class F>
CudaError mat_vec_id(const LaunchContext& ctx, const Tensor* dst) {
  const dim3 grid(static_cast<unsigned>((dst->ne[0] + kMatVecWarps - 1) / kMatVecWarps),
                  capped(dst->ne[1], kMaxGridYZ), capped(dst->ne[2], kMaxGridYZ));
  mul_mat_id_kernel<F><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), desc_of(dst->src[2]));
  LOOM_CUDA_CHECK_LAUNCH("mul_mat_id_kernel");
  return {};
}

// Whether weights of type t take q8_K activation blocks (the 256-element formats) rather than q8_0.
bool acts_q8_k(DType t) {
  return visit_quant_type(t, false, [](auto q) { return decltype(q)::kActQ8_K; });
}

// Bytes of one row of k activations quantized for weights of type t.
size_t act_row_bytes(DType weight, int64_t k) {
  return acts_q8_k(weight) ? static_cast<size_t>(k / 256) * sizeof(ActQ8_K)
                           : static_cast<size_t>(k / 32) * sizeof(ActQ8_0);
}

size_t quantized_act_bytes(const Tensor* dst) {
  return quantized_activation_bytes(dst->src[0]->type, dst->src[1]);
}

template <class D, int kCols, bool kBias>
CudaError launch_mat_vec_q8(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst,
                            const float* bias) {
  const Tensor* a = mm->src[0];
  const Tensor* b = mm->src[1];
  const dim3 grid(static_cast<unsigned>((dst->ne[0] + kMatVecWarps - 1) / kMatVecWarps),
                  capped((dst->ne[1] + kCols - 1) / kCols, kMaxGridYZ),
                  capped(dst->ne[2] * dst->ne[3], kMaxGridYZ));
  mul_mat_q8_kernel<D, kCols, kBias><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      desc_of(dst), desc_of(a), static_cast<const typename D::Act*>(ctx.scratch), b->ne[2] / a->ne[2],
      b->ne[3] / a->ne[3], bias);
  LOOM_CUDA_CHECK_LAUNCH("mul_mat_q8_kernel");
  return {};
}

// Like mat_vec, for quantized weights: quantizes mm's activations into the scratch first.
template <class D, bool kBias>
CudaError mat_vec_q8(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  LOOM_CUDA_TRY(launch_quantize_activations(ctx, mm->src[0]->type, mm->src[1]));
  return dst->ne[1] == 1 ? launch_mat_vec_q8<D, 1, kBias>(ctx, mm, dst, bias)
                         : launch_mat_vec_q8<D, kMatVecMaxCols, kBias>(ctx, mm, dst, bias);
}

template <class D>
CudaError mat_vec_id_q8(const LaunchContext& ctx, const Tensor* dst) {
  LOOM_CUDA_TRY(launch_quantize_activations(ctx, dst->src[0]->type, dst->src[1]));
  const dim3 grid(static_cast<unsigned>((dst->ne[0] + kMatVecWarps - 1) / kMatVecWarps),
                  capped(dst->ne[1], kMaxGridYZ), capped(dst->ne[2], kMaxGridYZ));
  mul_mat_id_q8_kernel<D><<<grid, kMatVecWarps * kWarpSize, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), static_cast<const typename D::Act*>(ctx.scratch),
      dst->src[1]->ne[1], desc_of(dst->src[2]));
  LOOM_CUDA_CHECK_LAUNCH("mul_mat_id_q8_kernel");
  return {};
}

// The mat-vec path of mul_mat for any weight type but i32 (dst: see mat_vec).
template <bool kBias>
CudaError mat_vec_any(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  // the fast numerics mode's kernels (mat_vec_fast.cu); the exact ones below serve exact mode, more
  // columns, and layouts the fast ones leave out
  if (ctx.fast && mat_vec_fast_supports(ctx, mm, dst)) return launch_mat_vec_fast(ctx, mm, dst, bias);
  if (ctx.act_in) return act_in_missed();
  const CudaError none = CudaError::runtime(cudaErrorInvalidValue, "mul_mat: no kernel for this weight type",
                                            __FILE__, __LINE__);
  return visit_weight_type(
      mm->src[0]->type, none, [&](auto f) { return mat_vec<decltype(f), kBias>(ctx, mm, dst, bias); },
      [&](auto q) { return mat_vec_q8<typename decltype(q)::Dot, kBias>(ctx, mm, dst, bias); });
}

bool is_float_type(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// ---- fast numerics: dequantized weights on tensor cores ----------------------------------------------

// Dequantized weight rows per cuBLAS call: a whole matrix of an 8B model (14336 x 4096 f16 is 117
// MB), since one large GEMM beats several (8B Q4_K_M on the H200: pp512 21,800 with 32 MB chunks,
// 22,200 with 64, 22,700 with 128; 16 MB 20,100, 8 MB 17,100), and bounded so the scratch stays small
// next to a large model's weights (the executor keeps one region for every product through cuBLAS,
// which are ordered anyway). Dequantizing the next chunk on a second stream during the current
// chunk's GEMM gave +2% at 32 MB chunks (cuBLAS's CTAs take whole SMs) and was removed.
constexpr size_t kDequantChunkBytes = size_t{128} << 20;
constexpr size_t kScratchAlign = 256;

size_t align_up(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Columns up to which the fast mode multiplies quantized weights with gemm_q_kernel (weights
// dequantized into mma fragments) rather than dequantizing them to f16 rows for cuBLAS. Measured on
// the H200 (op-test perf, 4096 x 4096, us per call with its host sync; docs/PERFORMANCE.md): q4_0 at
// 16 / 64 / 256 columns 27.0 / 28.9 / 79.5 against cuBLAS's 34.5 / 35.3 / 43.2.
// LOOM_CUDA_GEMM_Q_MAX_COLS overrides it, to measure one path against the other.
int64_t gemm_q_max_cols() {
  static const int64_t cols = [] {
    const char* e = std::getenv("LOOM_CUDA_GEMM_Q_MAX_COLS");
    return e && *e ? std::max<int64_t>(0, std::atoll(e)) : int64_t{64};
  }();
  return cols;
}

// Whether the fast mode's quantized tensor-core GEMM (gemm_q.cu) applies: more columns than the
// mat-vec kernels take, up to gemm_q_max_cols().
// Batch-invariant (batch_invariant()): every column count, since a column's sums in gemm_q do not
// depend on the others (gemm_q_plan.h).
bool use_gemm_q(const Tensor* dst, bool fast) {
  const Tensor* b = dst->src[1];
  if (!fast || !dtype_is_quantized(dst->src[0]->type) || !gemm_q_supported(dst)) return false;
  return batch_invariant() || (dst->ne[1] > kMatVecMaxCols && b->ne[1] * b->ne[2] * b->ne[3] <= gemm_q_max_cols());
}

// Whether gemm_q takes its activations as the warpgroup kernel's tiles (gemm_q_wgmma.cuh): f32
// activations in one contiguous block, a compute capability 9.0 device and a weight type the kernel
// covers. Known when the executor plans (no data pointer in it).
bool gemm_q_tiles_usable(bool sm90a, const Tensor* dst) {
  const Tensor* b = dst->src[1];
  return sm90a && b->type == DType::f32 && b->is_contiguous() && gemm_q_wgmma_covers(dst->src[0]->type);
}

// The activations' bytes in gemm_q's scratch: room for the warpgroup kernel's tiles (whole 64-column
// tiles), which hold at least the f16 [k, n] of the other kernel.
size_t gemm_q_x_bytes(const Tensor* dst) {
  const Tensor* b = dst->src[1];
  return align_up(gemm_q_tiles_bytes(b->nrows(), b->ne[0]));
}

// The products through gemm_q: the activations packed once (tiles for the warpgroup kernel, else
// contiguous f16) at the start of the scratch, the partial sums after them.
CudaError gemm_q_launch(const LaunchContext& ctx, const GemmQProducts& pr) {
  const Tensor* dst = pr.mm[0];
  const size_t x_bytes = gemm_q_x_bytes(dst);
  if (ctx.scratch_size < x_bytes + gemm_q_partial_bytes(pr))
    return CudaError::runtime(cudaErrorInvalidValue, "mul_mat: scratch smaller than the f16 activations",
                              __FILE__, __LINE__);
  auto* x16 = static_cast<__half*>(ctx.scratch);
  const Tensor* b = dst->src[1];
  const bool tiles = gemm_q_tiles_usable(ctx.sm90a, dst);
  if (ctx.act_in && !tiles) return act_in_missed();
  if (ctx.act_in)  // the producer wrote the tiles into b's own bytes (kActGemmQTiles)
    x16 = static_cast<__half*>(b->data);
  else if (tiles)
    LOOM_CUDA_TRY(pack_gemm_q_tiles(ctx.stream, x16, static_cast<const float*>(b->data), b->nrows(), b->ne[0]));
  else
    LOOM_CUDA_TRY(pack_b_f16(ctx, x16, b));
  return launch_gemm_q(ctx, pr, x16, reinterpret_cast<float*>(static_cast<char*>(ctx.scratch) + x_bytes), tiles);
}

// Whether the fast quantized GEMM through cuBLAS applies: quantized 2-D weights (one batch), a
// contiguous output, more columns than the mat-vec kernels take, sizes in cuBLAS's int range.
bool use_dequant_gemm(const Tensor* dst, bool fast) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  if (!fast || !dtype_is_quantized(a->type) || dst->ne[1] <= kMatVecMaxCols || use_gemm_q(dst, fast)) return false;
  if (a->ne[2] != 1 || a->ne[3] != 1 || !dst->is_contiguous()) return false;
  const int64_t n = b->ne[1] * b->ne[2] * b->ne[3];
  return a->ne[0] <= INT32_MAX && a->ne[1] <= INT32_MAX && n <= INT32_MAX;
}

// LOOM_CUDA_DEQUANT_CHUNK_MB (1-1024, read once) replaces kDequantChunkBytes, for comparisons.
size_t dequant_chunk_bytes() {
  static const size_t bytes = [] {
    const int64_t mb = env_int("LOOM_CUDA_DEQUANT_CHUNK_MB", 0, 1, 1024);
    return mb > 0 ? static_cast<size_t>(mb) << 20 : kDequantChunkBytes;
  }();
  return bytes;
}

int64_t dequant_chunk_rows(const Tensor* a) {
  const auto per_row = static_cast<int64_t>(a->ne[0]) * 2;
  const int64_t rows = std::max<int64_t>(128, static_cast<int64_t>(dequant_chunk_bytes()) / per_row) / 128 * 128;
  return std::min<int64_t>(rows, a->ne[1]);
}

size_t dequant_gemm_scratch(const Tensor* dst) {
  const Tensor* a = dst->src[0];
  return align_up(static_cast<size_t>(dst->src[1]->nelements()) * 2) +
         static_cast<size_t>(dequant_chunk_rows(a) * a->ne[0]) * 2;
}

template <class D>
CudaError dequantize_rows(const LaunchContext& ctx, __half* out, const Tensor* a, int64_t row0, int64_t rows) {
  constexpr int kThreads = 256;
  const int64_t groups = rows * (a->ne[0] / 8);
  if (a->nb[1] == static_cast<size_t>(a->ne[0] / D::kBlock * D::kBytes) && groups < (int64_t{1} << 31)) {
    const auto* blocks = static_cast<const uint8_t*>(a->data) + row0 * static_cast<int64_t>(a->nb[1]);
    dequantize_flat_f16_kernel<D><<<grid_for(groups, kThreads), kThreads, 0, ctx.stream>>>(out, blocks,
                                                                                         static_cast<uint32_t>(groups));
    LOOM_CUDA_CHECK_LAUNCH("dequantize_flat_f16_kernel");
    return {};
  }
  dequantize_rows_f16_kernel<D><<<grid_for(groups, kThreads), kThreads, 0, ctx.stream>>>(out, desc_of(a), row0, rows);
  LOOM_CUDA_CHECK_LAUNCH("dequantize_rows_f16_kernel");
  return {};
}

// Rows [row0, row0 + rows) of quantized weights a, whatever their format, as f16 rows at out.
CudaError dequantize_rows_any(const LaunchContext& ctx, __half* out, const Tensor* a, int64_t row0, int64_t rows) {
  return visit_quant_type(
      a->type, CudaError::runtime(cudaErrorInvalidValue, "mul_mat: not a quantized weight", __FILE__, __LINE__),
      [&](auto q) { return dequantize_rows<typename decltype(q)::Dequant8>(ctx, out, a, row0, rows); });
}

CudaError gemm_dequant(const LaunchContext& ctx, const Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  const int64_t k = a->ne[0], m = a->ne[1], n = b->ne[1] * b->ne[2] * b->ne[3];
  if (ctx.scratch_size < dequant_gemm_scratch(dst))
    return CudaError::runtime(cudaErrorInvalidValue, "mul_mat: scratch smaller than the dequantized weights",
                              __FILE__, __LINE__);
  // the activations as f16: their producer's (ctx.act_in: b's own bytes, kActF16), else packed here
  auto* b16 = static_cast<__half*>(ctx.act_in ? b->data : ctx.scratch);
  if (!ctx.act_in && !ctx.b_packed) LOOM_CUDA_TRY(pack_b_f16(ctx, b16, b));
  auto* w16 = reinterpret_cast<__half*>(static_cast<char*>(ctx.scratch) + align_up(static_cast<size_t>(b->nelements()) * 2));
  const int64_t chunk = dequant_chunk_rows(a);
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t row0 = 0; row0 < m; row0 += chunk) {
    const int64_t rows = std::min(chunk, m - row0);
    LOOM_CUDA_TRY(dequantize_rows_any(ctx, w16, a, row0, rows));
    // dst rows [row0, row0 + rows) of every column: column-major C with ldc = m
    LOOM_CUBLAS_CHECK(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                                   static_cast<int>(k), &alpha, w16, CUDA_R_16F, static_cast<int>(k), b16,
                                   CUDA_R_16F, static_cast<int>(k), &beta, static_cast<float*>(dst->data) + row0,
                                   CUDA_R_32F, static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return {};
}

}  // namespace

// Fast numerics: f16 / bf16 weights at LOOM_CUDA_FLOAT_GEMM_MIN_COLS (read once; default 2, 0 or
// more than kMatVecMaxCols: never) to kMatVecMaxCols columns go to cuBLAS's tensor cores, not the
// mat-vec kernel, whose float FMAs grow with the columns. 8B F16, H200, S_TG at 2 / 3 / 4 / 8
// sequences: 342.7 / 454.8 / 510.4 / 783.5 on the mat-vec, 356.7 / 529.6 / 700.5 / 1,350.3 on cuBLAS.
bool float_gemm_few_cols(const Tensor* dst, bool fast) {
  static const int64_t min_cols = [] {
    const char* v = std::getenv("LOOM_CUDA_FLOAT_GEMM_MIN_COLS");
    return v ? static_cast<int64_t>(std::atol(v)) : int64_t{2};
  }();
  const DType t = dst->src[0]->type;
  return fast && !batch_invariant() && (t == DType::f16 || t == DType::bf16) && min_cols > 0 &&
         dst->ne[1] >= min_cols && dst->ne[1] <= kMatVecMaxCols;
}

namespace {

// Whether the cuBLAS path applies: float weights, enough columns to be worth a GEMM, and weight
// strides cuBLAS can express (whole elements, lda >= k, int range): true of every tensor Loom
// builds; an odd view falls back to the mat-vec kernel, which takes any strides.
// Batch-invariant fast numerics (batch_invariant()): never, float weights taking the float mat-vec at every
// column count (mat_vec_fast.cu: its 8-column form, column groups of 8), whose sums of a column do not depend on
// the others; cuBLAS's order may change with the columns (1B F16: 16 sequences together against alone, 81%).
// Exact numerics: never (a sequence's sums independent of the batch): float weights take the exact mat-vec
// at every column count, 8 columns a block, as quantized ones do; cuBLAS's float sums changed with the
// columns (1B F16: 16 sequences together against alone 94%, stop 46). The price is exact prompts of
// float-weight files at the mat-vec's speed.
bool use_cublas(const Tensor* dst, bool fast) {
  if (!fast) return false;
  const Tensor* a = dst->src[0];
  if (!is_float_type(a->type) || (dst->ne[1] <= kMatVecMaxCols && !float_gemm_few_cols(dst, fast))) return false;
  if (batch_invariant()) return false;  // (float_gemm_few_cols is false there too)
  const size_t ts = dtype_type_size(a->type);
  const bool whole_elements = a->nb[1] % ts == 0 && a->nb[2] % ts == 0 && a->nb[3] % ts == 0;
  const bool fits_int = a->nb[1] / ts <= INT32_MAX && a->ne[1] <= INT32_MAX && dst->ne[1] <= INT32_MAX &&
                        dst->ne[2] <= INT32_MAX;
  return whole_elements && fits_int && a->nb[1] >= static_cast<size_t>(a->ne[0]) * ts;  // lda >= k
}

// cuBLAS's element type for weights of type t (f32, f16 or bf16), and b packed contiguous as it at out.
cudaDataType_t cublas_type_of(DType t) {
  return t == DType::f16 ? CUDA_R_16F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}
CudaError pack_b_as(const LaunchContext& ctx, DType t, void* out, const Tensor* b) {
  if (t == DType::f16) return pack_b_f16(ctx, static_cast<__half*>(out), b);
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(b->nelements(), kThreads);
  if (t == DType::f32)
    pack_b_kernel<float><<<grid, kThreads, 0, ctx.stream>>>(static_cast<float*>(out), desc_of(b));
  else
    pack_b_kernel<__nv_bfloat16><<<grid, kThreads, 0, ctx.stream>>>(static_cast<__nv_bfloat16*>(out), desc_of(b));
  LOOM_CUDA_CHECK_LAUNCH("pack_b_kernel");
  return {};
}

CudaError gemm_cublas(const LaunchContext& ctx, const Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  const int64_t k = a->ne[0], m = a->ne[1], n = b->ne[1];
  const int64_t b2 = b->ne[2], b3 = b->ne[3];
  const int64_t r2 = b2 / a->ne[2], r3 = b3 / a->ne[3];
  const size_t ts = dtype_type_size(a->type);

  const cudaDataType_t type = cublas_type_of(a->type);
  // f16 activations handed over by their producer (kActF16) lie in b's own bytes
  if (ctx.act_in && (a->type != DType::f16 || b->ne[2] != 1 || b->ne[3] != 1)) return act_in_missed();
  if (!ctx.act_in && !ctx.b_packed) LOOM_CUDA_TRY(pack_b_as(ctx, a->type, ctx.scratch, b));

  const float alpha = 1.0f, beta = 0.0f;
  const auto lda = static_cast<int>(a->nb[1] / ts);
  const int64_t b_batch = k * n;  // elements per packed b batch
  const auto* b_base = static_cast<const char*>(ctx.act_in ? b->data : ctx.scratch);
  auto* c_base = static_cast<char*>(dst->data);
  const int64_t c_batch = static_cast<int64_t>(dst->nb[2] / sizeof(float));
  // Consecutive b batches share an a batch (grouped-query broadcast): one strided call per a
  // batch with stride 0 over its r2 b batches, or one call over all of dim 2 when r2 == 1.
  for (int64_t i3 = 0; i3 < b3; ++i3) {
    const char* a3 = static_cast<const char*>(a->data) + (i3 / r3) * a->nb[3];
    const int64_t groups = r2 == 1 ? 1 : a->ne[2];
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first = r2 == 1 ? 0 : g * r2;  // first b batch of the call
      const int64_t batch = r2 == 1 ? b2 : r2;
      const char* a_ptr = a3 + (r2 == 1 ? 0 : g * a->nb[2]);
      const int64_t stride_a = r2 == 1 ? static_cast<int64_t>(a->nb[2] / ts) : 0;
      const char* b_ptr = b_base + ((i3 * b2 + first) * b_batch) * static_cast<int64_t>(ts);
      char* c_ptr = c_base + i3 * dst->nb[3] + first * dst->nb[2];
      LOOM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
          &alpha, a_ptr, type, lda, stride_a, b_ptr, type, static_cast<int>(k), b_batch, &beta, c_ptr,
          CUDA_R_32F, static_cast<int>(m), c_batch, static_cast<int>(batch),
          ctx.fast && a->type == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  return {};
}

// Rows [0, m_total) of the stacked products' f32 result c (column-major, m_total rows a column) to
// their outputs: rows below m0 to out0, the next m1 to out1, the rest to out2 (ld* floats apart).
// A column a grid row (blockIdx.y), so no per-element division (one over 64-bit indices per element
// took 4.3 us for an 8B layer's Q/K/V at 64 columns, H200); kVec4: 4 rows a thread, 16-byte accesses
// (every count, stride and pointer a multiple of 4 floats, so 4 rows never straddle two outputs).
template <bool kVec4>
__global__ void split_stacked_rows_kernel(const float* c, int64_t m_total, float* out0, int64_t m0, int64_t ld0,
                                          float* out1, int64_t m1, int64_t ld1, float* out2, int64_t ld2) {
  pdl_wait();
  constexpr int kPer = kVec4 ? 4 : 1;
  const int64_t col = blockIdx.y;
  const float* src = c + col * m_total;
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kPer; r < m_total;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x * kPer) {
    float* dst = r < m0 ? out0 + col * ld0 + r : r < m0 + m1 ? out1 + col * ld1 + (r - m0) : out2 + col * ld2 + (r - m0 - m1);
    if constexpr (kVec4) *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src + r);
    else *dst = src[r];
  }
}

// act(gate) * up of the stacked gate and up products (m rows each, gate's first in each column of c),
// as the fast mode's elementwise swiglu / geglu evaluates it (float4 rows: gated_fast_f, in float; else
// gated_f), to out (ld floats a column) or, with out16, as contiguous f16 rows (kActF16: the down
// product's packed activations, over out's own bytes; c lies in the scratch, so no block reads what
// another writes). A column a grid row, 4 rows a thread (kVec4: m and ld multiples of 4, c and out
// 16-byte aligned), else one: the grid-stride loop over 64-bit element indices it replaces took 9.4 us
// for an 8B layer at 64 columns (H200).
template <bool kVec4>
__global__ void gated_stacked_kernel(const float* c, int64_t m, float* out, int64_t ld, bool swiglu, uint2* out16) {
  pdl_wait();
  constexpr int kPer = kVec4 ? 4 : 1;
  const int64_t col = blockIdx.y;
  const float* gate = c + col * 2 * m;
  const float* up = gate + m;
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kPer; r < m;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x * kPer) {
    if constexpr (kVec4) {
      const float4 g = *reinterpret_cast<const float4*>(gate + r), u = *reinterpret_cast<const float4*>(up + r);
      const float4 o = make_float4(gated_fast_f(g.x, u.x, swiglu), gated_fast_f(g.y, u.y, swiglu),
                                   gated_fast_f(g.z, u.z, swiglu), gated_fast_f(g.w, u.w, swiglu));
      if (out16) {
        out16[(col * m + r) / 4] = make_uint2(half2_bits(__floats2half2_rn(o.x, o.y)), half2_bits(__floats2half2_rn(o.z, o.w)));
      } else {
        *reinterpret_cast<float4*>(out + col * ld + r) = o;
      }
    } else {  // as the elementwise kernel's one-element form (gated_kernel): the double evaluation
      out[col * ld + r] = gated_f(gate[r], up[r], swiglu);
    }
  }
}

// A grid of about 4 elements a thread over one column's rows (kThreads a block), a column a grid row.
dim3 column_grid(int64_t rows, int64_t cols, int threads, int per_thread) {
  const int64_t blocks = (rows + static_cast<int64_t>(threads) * per_thread - 1) / (static_cast<int64_t>(threads) * per_thread);
  return dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1)), static_cast<unsigned>(cols));
}

}  // namespace

// Products of one activation whose f16 / bf16 weights lie back to back in memory (the loader asks for
// Q, K and V one after another): one GEMM over their stacked rows. Fast numerics, more columns than
// the mat-vec kernels take, 2-D: its f16 activations, then the stacked f32 result, in the scratch.
// Up to kStackedMaxCols columns (batched decode): past them the rows' copy out costs more than the
// one launch saves (8B F16, H200: 2,048-token prompt passes 30,518 / 31,376 t/s stacked against
// 31,660 / 32,313 without, while 16 / 64 sequences decode 2,761 / 8,643 against 2,596 / 8,255).
constexpr int64_t kStackedMaxCols = 256;
bool stacked_cublas_usable(const Tensor* const* mm, int count, bool fast) {
  if (!fast || count < 2 || count > 3 || !mm[0] || mm[0]->op != OpKind::mul_mat) return false;
  const Tensor* x = mm[0]->src[1];
  const Tensor* w0 = mm[0]->src[0];
  if (!x || !w0 || (w0->type != DType::f16 && w0->type != DType::bf16) || x->type != DType::f32 || x->ne[2] != 1 ||
      x->ne[3] != 1 || x->ne[1] <= kMatVecMaxCols || x->ne[1] > kStackedMaxCols)
    return false;
  const char* next = static_cast<const char*>(w0->data);
  int64_t m_total = 0;
  for (int t = 0; t < count; ++t) {
    const Tensor* mm_t = mm[t];
    if (!mm_t || mm_t->op != OpKind::mul_mat || mm_t->src[1] != x || !use_cublas(mm_t, fast)) return false;
    const Tensor* w = mm_t->src[0];
    if (w->type != w0->type || w->ne[0] != w0->ne[0] || w->ne[2] != 1 || w->ne[3] != 1 || !w->is_contiguous() ||
        !w->data || w->data != next)
      return false;
    if (mm_t->type != DType::f32 || mm_t->nb[0] != sizeof(float) || mm_t->ne[1] != x->ne[1] || mm_t->ne[2] != 1 ||
        mm_t->ne[3] != 1 || mm_t->nb[1] < static_cast<size_t>(mm_t->ne[0]) * sizeof(float))
      return false;
    next += w->nbytes();
    m_total += w->ne[1];
  }
  return m_total <= INT32_MAX && w0->ne[0] <= INT32_MAX && x->ne[1] <= INT32_MAX;
}

namespace {
size_t stacked_act_bytes(const Tensor* x) { return align_up(static_cast<size_t>(x->nelements()) * 2); }
}  // namespace

size_t stacked_cublas_scratch_bytes(const Tensor* const* mm, int count) {
  int64_t m_total = 0;
  for (int t = 0; t < count; ++t) m_total += mm[t]->src[0]->ne[1];
  const Tensor* x = mm[0]->src[1];
  return stacked_act_bytes(x) + static_cast<size_t>(m_total) * static_cast<size_t>(x->ne[1]) * sizeof(float);
}

bool stacked_glu_f16_out_fits(const Tensor* glu) {
  return glu->ne[0] % 4 == 0 && glu->nb[1] == static_cast<size_t>(glu->ne[0]) * sizeof(float) && f16_rows_fit(glu);
}

CudaError launch_stacked_cublas(const LaunchContext& ctx, const Tensor* const* mm, int count, const Tensor* glu) {
  const Tensor* x = mm[0]->src[1];
  const Tensor* w0 = mm[0]->src[0];
  const int64_t k = w0->ne[0], n = x->ne[1];
  if (!ctx.scratch || ctx.scratch_size < stacked_cublas_scratch_bytes(mm, count))
    return CudaError::runtime(cudaErrorInvalidValue, "stacked products: scratch smaller than they need", __FILE__,
                              __LINE__);
  int64_t m[3] = {0, 0, 0}, m_total = 0;
  for (int t = 0; t < count; ++t) m_total += (m[t] = mm[t]->src[0]->ne[1]);
  constexpr int kThreads = 256;
  const cudaDataType_t type = cublas_type_of(w0->type);
  // f16 activations handed over by their producer (kActF16) lie in x's own bytes; the gated activation
  // may be handed on so (stacked_glu_f16_out_fits)
  if (ctx.act_in && w0->type != DType::f16) return act_in_missed();
  const bool f16_out = ctx.act_out_block == kActF16;
  if (ctx.act_out_block && (!f16_out || !glu || !stacked_glu_f16_out_fits(glu)))
    return CudaError::runtime(cudaErrorInvalidValue,
                              "stacked products: activations asked of their output, but only a contiguous gated "
                              "activation can be written as f16 rows",
                              __FILE__, __LINE__);
  auto* c = reinterpret_cast<float*>(static_cast<char*>(ctx.scratch) + stacked_act_bytes(x));
  // the gated activation's 4-row form (its f16 rows need it: checked before anything is queued)
  auto* glu_out = glu ? static_cast<float*>(glu->data) : nullptr;
  const auto glu_ld = glu ? static_cast<int64_t>(glu->nb[1] / sizeof(float)) : int64_t{0};
  const bool glu_vec4 = glu && m[0] % 4 == 0 && glu_ld % 4 == 0 && aligned16(glu_out) && aligned16(c);
  if (f16_out && !glu_vec4)  // stacked_glu_f16_out_fits holds for glu; c is the scratch's, aligned
    return CudaError::runtime(cudaErrorInvalidValue, "stacked gate/up: f16 rows asked of an unaligned output",
                              __FILE__, __LINE__);
  if (!ctx.act_in) LOOM_CUDA_TRY(pack_b_as(ctx, w0->type, ctx.scratch, x));
  const void* x16 = ctx.act_in ? x->data : ctx.scratch;
  const float alpha = 1.0f, beta = 0.0f;
  LOOM_CUBLAS_CHECK(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m_total), static_cast<int>(n),
                                 static_cast<int>(k), &alpha, w0->data, type, static_cast<int>(k), x16, type,
                                 static_cast<int>(k), &beta, c, CUDA_R_32F, static_cast<int>(m_total),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (glu) {  // gate and up (count 2, m rows each): their gated activation
    uint2* out16 = f16_out ? static_cast<uint2*>(glu->data) : nullptr;
    const bool swiglu = glu->op == OpKind::swiglu;
    if (glu_vec4)
      gated_stacked_kernel<true><<<column_grid(m[0], n, kThreads, 4), kThreads, 0, ctx.stream>>>(
          c, m[0], glu_out, glu_ld, swiglu, out16);
    else
      gated_stacked_kernel<false><<<column_grid(m[0], n, kThreads, 1), kThreads, 0, ctx.stream>>>(
          c, m[0], glu_out, glu_ld, swiglu, nullptr);
    LOOM_CUDA_CHECK_LAUNCH("gated_stacked_kernel");
    return {};
  }
  auto out = [&](int t) { return t < count ? static_cast<float*>(mm[t]->data) : nullptr; };
  auto ld = [&](int t) { return t < count ? static_cast<int64_t>(mm[t]->nb[1] / sizeof(float)) : int64_t{0}; };
  bool vec4 = m_total % 4 == 0 && m[0] % 4 == 0 && m[1] % 4 == 0 && aligned16(c);
  for (int t = 0; t < count; ++t) vec4 = vec4 && ld(t) % 4 == 0 && aligned16(out(t));
  if (vec4)
    split_stacked_rows_kernel<true><<<column_grid(m_total, n, kThreads, 4), kThreads, 0, ctx.stream>>>(
        c, m_total, out(0), m[0], ld(0), out(1), m[1], ld(1), out(2), ld(2));
  else
    split_stacked_rows_kernel<false><<<column_grid(m_total, n, kThreads, 1), kThreads, 0, ctx.stream>>>(
        c, m_total, out(0), m[0], ld(0), out(1), m[1], ld(1), out(2), ld(2));
  LOOM_CUDA_CHECK_LAUNCH("split_stacked_rows_kernel");
  return {};
}

// LOOM_CUDA_DEQUANT_MULTI=0 (read once) keeps one dequantize-then-GEMM per product, for comparisons.
bool dequant_multi_usable(const Tensor* const* mm, int count, bool fast) {
  static const bool on = env_switch("LOOM_CUDA_DEQUANT_MULTI");
  if (!on || !fast || count < 2 || count > 3 || !mm[0] || mm[0]->op != OpKind::mul_mat) return false;
  const Tensor* x = mm[0]->src[1];
  if (!x || x->type != DType::f32 || x->ne[2] != 1 || x->ne[3] != 1) return false;
  for (int t = 0; t < count; ++t) {
    const Tensor* d = mm[t];
    if (!d || d->op != OpKind::mul_mat || d->src[1] != x || !use_dequant_gemm(d, fast) || d->type != DType::f32)
      return false;
  }
  // the pair: one shape, both dequantized whole into the scratch at once
  const Tensor* k = mm[count - 2];
  const Tensor* v = mm[count - 1];
  return k->src[0]->ne[1] == v->src[0]->ne[1] && dequant_chunk_rows(k->src[0]) == k->src[0]->ne[1] &&
         static_cast<size_t>(k->src[0]->ne[1] * k->src[0]->ne[0]) * 2 <= dequant_chunk_bytes();
}

size_t dequant_multi_scratch_bytes(const Tensor* const* mm, int count) {
  const Tensor* k = mm[count - 2]->src[0];
  size_t bytes = align_up(static_cast<size_t>(mm[0]->src[1]->nelements()) * 2) +
                 2 * static_cast<size_t>(k->ne[1] * k->ne[0]) * 2;
  if (count == 3) bytes = std::max(bytes, dequant_gemm_scratch(mm[0]));
  return bytes;
}

CudaError launch_dequant_multi(const LaunchContext& ctx, const Tensor* const* mm, int count) {
  if (!ctx.scratch || ctx.scratch_size < dequant_multi_scratch_bytes(mm, count))
    return CudaError::runtime(cudaErrorInvalidValue, "Q/K/V products: scratch smaller than they need", __FILE__,
                              __LINE__);
  const Tensor* x = mm[0]->src[1];
  LaunchContext c = ctx;
  if (count == 3) {  // Q alone: packs the activation at the scratch's start (unless handed over: act_in)
    LOOM_CUDA_TRY(gemm_dequant(c, mm[0]));
  } else if (!c.b_packed && !c.act_in) {
    LOOM_CUDA_TRY(pack_b_f16(c, static_cast<__half*>(c.scratch), x));
  }
  c.b_packed = true;
  // K and V: lower output address first, so that the batch stride between the outputs is positive
  const Tensor* pair[2] = {mm[count - 2], mm[count - 1]};
  if (pair[1]->data < pair[0]->data) std::swap(pair[0], pair[1]);
  const int64_t k = x->ne[0], m = pair[0]->src[0]->ne[1], n = x->ne[1];
  const auto* b16 = static_cast<const __half*>(c.act_in ? x->data : c.scratch);
  auto* w16 = reinterpret_cast<__half*>(static_cast<char*>(c.scratch) + align_up(static_cast<size_t>(x->nelements()) * 2));
  for (int i = 0; i < 2; ++i) LOOM_CUDA_TRY(dequantize_rows_any(c, w16 + i * m * k, pair[i]->src[0], 0, m));
  const auto* c0 = static_cast<float*>(pair[0]->data);
  const long long stride_c = static_cast<float*>(pair[1]->data) - c0;
  const float alpha = 1.0f, beta = 0.0f;
  LOOM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, w16,
      CUDA_R_16F, static_cast<int>(k), m * k, b16, CUDA_R_16F, static_cast<int>(k), 0, &beta, pair[0]->data, CUDA_R_32F,
      static_cast<int>(m), stride_c, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return {};
}

size_t quantized_activation_bytes(DType weight, const Tensor* b) {
  if (!dtype_is_quantized(weight)) return 0;
  return static_cast<size_t>(b->nrows()) * act_row_bytes(weight, b->ne[0]);
}

CudaError launch_quantize_activations(const LaunchContext& ctx, DType weight, const Tensor* b) {
  if (ctx.scratch_size < quantized_activation_bytes(weight, b))
    return CudaError::runtime(cudaErrorInvalidValue,
                              "mul_mat: scratch smaller than the quantized activations", __FILE__, __LINE__);
  const int64_t blocks = b->nrows() * (b->ne[0] / (acts_q8_k(weight) ? 256 : 32));
  if (blocks == 0) return {};
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(blocks * kWarpSize, kThreads);
  if (acts_q8_k(weight)) {
    quantize_q8_k_kernel<<<grid, kThreads, 0, ctx.stream>>>(static_cast<ActQ8_K*>(ctx.scratch), desc_of(b));
    LOOM_CUDA_CHECK_LAUNCH("quantize_q8_k_kernel");
  } else {
    quantize_q8_0_kernel<<<grid, kThreads, 0, ctx.stream>>>(static_cast<ActQ8_0*>(ctx.scratch), desc_of(b));
    LOOM_CUDA_CHECK_LAUNCH("quantize_q8_0_kernel");
  }
  return {};
}

size_t mul_mat_scratch_bytes(const Tensor* dst, bool fast) {
  if (use_gemm_q(dst, fast)) return gemm_q_products_scratch_bytes(GemmQProducts{{dst}});
  if (use_dequant_gemm(dst, fast)) return dequant_gemm_scratch(dst);
  if (dtype_is_quantized(dst->src[0]->type)) return quantized_act_bytes(dst);
  if (!use_cublas(dst, fast)) return 0;
  const Tensor* a = dst->src[0];
  return static_cast<size_t>(dst->src[1]->nelements()) * (a->type == DType::f32 ? 4 : 2);
}

size_t mul_mat_id_scratch_bytes(const Tensor* dst) {
  return dtype_is_quantized(dst->src[0]->type) ? quantized_act_bytes(dst) : 0;
}

bool mul_mat_uses_cublas(const Tensor* dst, bool fast) { return use_cublas(dst, fast) || use_dequant_gemm(dst, fast); }

int mul_mat_packed_b(const Tensor* dst, bool fast) {
  if (use_dequant_gemm(dst, fast)) return 1;
  if (!use_cublas(dst, fast)) return 0;
  const DType t = dst->src[0]->type;
  return t == DType::f16 ? 1 : t == DType::f32 ? 2 : 3;
}

bool mul_mat_takes_f16_b(const Tensor* dst, bool fast) {
  const Tensor* b = dst->src[1];
  return mul_mat_packed_b(dst, fast) == 1 && b->type == DType::f32 && b->is_contiguous() && b->ne[2] == 1 &&
         b->ne[3] == 1;
}

bool mul_mat_takes_gemm_q_tiles(const Tensor* dst, bool fast, bool sm90a) {
  return use_gemm_q(dst, fast) && gemm_q_tiles_usable(sm90a, dst);
}

bool gemm_q_products_usable(const GemmQProducts& pr, bool fast, bool sm90a) {
  for (int i = 0; i < pr.count; ++i)
    if (!pr.mm[i] || pr.mm[i]->op != OpKind::mul_mat || !use_gemm_q(pr.mm[i], fast)) return false;
  return gemm_q_products_supported(pr) && (pr.count == 1 || gemm_q_tiles_usable(sm90a, pr.mm[0]));
}

size_t gemm_q_products_scratch_bytes(const GemmQProducts& pr) { return gemm_q_x_bytes(pr.mm[0]) + gemm_q_partial_bytes(pr); }

CudaError launch_gemm_q_products(const LaunchContext& ctx, const GemmQProducts& pr) {
  if (pr.mm[0]->src[1]->nelements() == 0) return {};
  return gemm_q_launch(ctx, pr);
}

CudaError launch_mul_mat(const LaunchContext& ctx, const Tensor* dst) {
  if (dst->nelements() == 0) return {};
  if (use_gemm_q(dst, ctx.fast)) return gemm_q_launch(ctx, GemmQProducts{{dst}});
  if (use_dequant_gemm(dst, ctx.fast)) return gemm_dequant(ctx, dst);
  if (use_cublas(dst, ctx.fast)) return gemm_cublas(ctx, dst);
  return mat_vec_any<false>(ctx, dst, dst, nullptr);
}

CudaError launch_mul_mat_vec_bias(const LaunchContext& ctx, const Tensor* mm, const Tensor* bias,
                                  const Tensor* dst) {
  if (dst->nelements() == 0) return {};
  return mat_vec_any<true>(ctx, mm, dst, static_cast<const float*>(bias->data));
}

CudaError launch_mul_mat_id(const LaunchContext& ctx, const Tensor* dst) {
  if (dst->nelements() == 0) return {};
  const CudaError none = CudaError::runtime(cudaErrorInvalidValue,
                                            "mul_mat_id: no kernel for this weight type", __FILE__, __LINE__);
  return visit_weight_type(
      dst->src[0]->type, none, [&](auto f) { return mat_vec_id<decltype(f)>(ctx, dst); },
      [&](auto q) { return mat_vec_id_q8<typename decltype(q)::Dot>(ctx, dst); });
}

}  // namespace loom::cuda
