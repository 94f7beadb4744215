// The inner loops of the mat-vec kernels (one warp per output row, up to kMatVecMaxCols columns),
// and whole rows of them, shared by mul_mat (matmul.cu) and the fused projections (fused.cu). Device code
// only; includes nothing outside src/backend/cuda/.
#pragma once

#include <cstdint>
#include <cstring>

#include "common.cuh"
#include "quant.cuh"
#include "quantize_act.cuh"

namespace loom::cuda {

/// Columns one warp computes at once; float weights with more columns go to cuBLAS.
constexpr int kMatVecMaxCols = 8;
/// Warps (output rows) per block.
constexpr int kMatVecWarps = 4;

/// How 16 bytes of float weights of format F unpack into kElems floats, in element order.
template <class F>
struct WideWeights;

template <>
struct WideWeights<FormatF32> {
  static constexpr int kElems = 4;
  __device__ static void unpack(const uint4& q, float (&w)[kElems]) {
    w[0] = __uint_as_float(q.x);
    w[1] = __uint_as_float(q.y);
    w[2] = __uint_as_float(q.z);
    w[3] = __uint_as_float(q.w);
  }
};

template <>
struct WideWeights<FormatF16> {
  static constexpr int kElems = 8;
  __device__ static void unpack(const uint4& q, float (&w)[kElems]) {
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      static_assert(sizeof(h) == sizeof(words[i]));
      memcpy(&h, &words[i], sizeof(h));
      const float2 f = __half22float2(h);  // .x: the lower address, element 2i
      w[2 * i] = f.x;
      w[2 * i + 1] = f.y;
    }
  }
};

template <>
struct WideWeights<FormatBF16> {
  static constexpr int kElems = 8;
  __device__ static void unpack(const uint4& q, float (&w)[kElems]) {
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bf16 is the upper half of an f32: exact by shifting
      w[2 * i] = __uint_as_float(words[i] << 16);
      w[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

/// Whether dot_columns_float may take the 16-byte path for this row and these columns: every
/// weight and activation load whole and aligned. Depends only on the row's and columns' addresses
/// and strides, so every kernel sharing this loop (mul_mat, mat_vec_bias, glu_mat_vec,
/// mat_vec_multi) takes the same path for the same tensors and sums in the same order.
template <class F>
__device__ __forceinline__ bool wide_float_path(const char* a_row, int64_t k, const char* b_col,
                                                int64_t b_nb0, int64_t b_nb1, int ncols) {
  const auto addr = reinterpret_cast<uintptr_t>(a_row) | reinterpret_cast<uintptr_t>(b_col);
  return k % WideWeights<F>::kElems == 0 && b_nb0 == static_cast<int64_t>(sizeof(float)) && addr % 16 == 0 &&
         (ncols == 1 || b_nb1 % 16 == 0);
}

/// One lane's step of the 16-byte path: weights q (vector v of the row) against vector v of each column.
template <class F, int kCols>
__device__ __forceinline__ void dot_wide_step(const uint4& q, int64_t v, const char* b_col, int64_t b_nb1,
                                              int ncols, float (&acc)[kCols]) {
  constexpr int kElems = WideWeights<F>::kElems;
  float w[kElems];
  WideWeights<F>::unpack(q, w);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if (c >= ncols) break;
    const auto* x = reinterpret_cast<const float4*>(b_col + c * b_nb1) + v * (kElems / 4);
#pragma unroll
    for (int h = 0; h < kElems / 4; ++h) {
      const float4 xv = ld_act(x + h);  // an earlier kernel's output: coherent (common.cuh's PDL rule)
      acc[c] += w[4 * h] * xv.x;
      acc[c] += w[4 * h + 1] * xv.y;
      acc[c] += w[4 * h + 2] * xv.z;
      acc[c] += w[4 * h + 3] * xv.w;
    }
  }
}

/// acc[c] += this lane's share of dot(weight row, activation column c) for c < ncols: float
/// weights of format F (f32, f16, bf16), f32 activations at b_col + e * b_nb0 + c * b_nb1. The lanes
/// split the k elements; the caller sums acc over the warp.
///
/// Aligned rows of contiguous activations (wide_float_path, true of every weight and activation
/// Loom builds for a model) go 16 bytes of weights per lane per load (uint4: 8 f16/bf16 or 4 f32,
/// 512 bytes per warp per step instead of 64 for one f16 element per lane), kUnroll steps issued
/// before any is used so that 2 KiB per warp are in flight: a decode step is bandwidth-bound on
/// the weights, and with 4-16 warps per SM one element per lane reached ~10% of the H200's HBM
/// bandwidth. Each lane sums its vectors' elements in order; the warp reduction is the caller's.
/// Other rows (odd k, offset views, strided activations) take one element per lane per step.
template <class F, int kCols>
__device__ __forceinline__ void dot_columns_float(const char* a_row, int64_t k, const char* b_col,
                                                  int64_t b_nb0, int64_t b_nb1, int ncols,
                                                  float (&acc)[kCols]) {
  const int lane = threadIdx.x % kWarpSize;
  if (wide_float_path<F>(a_row, k, b_col, b_nb0, b_nb1, ncols)) {
    constexpr int kUnroll = 4;
    const auto* w_vec = reinterpret_cast<const uint4*>(a_row);
    const int64_t nv = k / WideWeights<F>::kElems;
    int64_t v = lane;
    for (; v + (kUnroll - 1) * kWarpSize < nv; v += kUnroll * kWarpSize) {
      uint4 q[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) q[u] = __ldg(w_vec + v + u * kWarpSize);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) dot_wide_step<F>(q[u], v + u * kWarpSize, b_col, b_nb1, ncols, acc);
    }
    for (; v < nv; v += kWarpSize) dot_wide_step<F>(__ldg(w_vec + v), v, b_col, b_nb1, ncols, acc);
    return;
  }
  for (int64_t e = lane; e < k; e += kWarpSize) {
    const float w = load_element<F>(a_row, e);
    const char* b_elem = b_col + e * b_nb0;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (c < ncols) acc[c] += w * *reinterpret_cast<const float*>(b_elem + c * b_nb1);
  }
}

/// acc[c] += dot(weight row, activation row x + c * n_blocks) for c < ncols, in double (the block
/// terms and their sum, as on the CPU: vec_dot.h), quantized weights of dot
/// format D against activations quantized to D::Act blocks: the warp splits the row's blocks,
/// D::kParts lanes to a block, 32 / D::kParts blocks per step; each lane unpacks its share of a
/// weight block once for all columns. One column has little work per step to hide the memory
/// latency behind, so its loop is unrolled to keep several steps' loads in flight; with more
/// columns their independent loads do that already (and registers are scarcer).
template <class D, int kCols>
__device__ __forceinline__ void dot_columns(const uint8_t* w_row, int64_t n_blocks, const typename D::Act* x,
                                            int ncols, double (&acc)[kCols]) {
  const int lane = threadIdx.x % kWarpSize;
  const int part = lane % D::kParts;
  constexpr int kUnroll = kCols == 1 ? 4 : 1;
#pragma unroll kUnroll
  for (int64_t ib = lane / D::kParts; ib < n_blocks; ib += kWarpSize / D::kParts) {
    const typename D::Part w = D::decode(w_row + ib * D::kBytes, part);
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (c < ncols) acc[c] += D::dot(w, x[c * n_blocks + ib], part);
  }
}

/// Row i of every column and batch of dst = w x b (+ bias[i] with kBias), float weights of format F:
/// the whole of one warp's work in mul_mat_vec_kernel (matmul.cu) and in mat_vec_multi_kernel
/// (fused.cu), so the fused and unfused products are the same code. The block's grid.y and grid.z
/// stride over column groups and batches; r2, r3 are the weights' batch broadcast.
template <class F, bool kBias>
__device__ __forceinline__ void mat_vec_float_row(const TensorDesc& dst, const TensorDesc& w, const TensorDesc& b,
                                                  int64_t i, int64_t r2, int64_t r3, const float* bias) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t k = w.ne[0], n = dst.ne[1], batches = dst.ne[2] * dst.ne[3];
  for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {
    const int64_t i2 = z % dst.ne[2], i3 = z / dst.ne[2];
    const char* w_row = row_ptr(w, i, i2 / r2, i3 / r3);
    for (int64_t j0 = static_cast<int64_t>(blockIdx.y) * kMatVecMaxCols; j0 < n;
         j0 += static_cast<int64_t>(gridDim.y) * kMatVecMaxCols) {
      const int ncols = static_cast<int>(n - j0 < kMatVecMaxCols ? n - j0 : kMatVecMaxCols);
      const char* b_col = b.data + j0 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3];
      float acc[kMatVecMaxCols] = {};
      dot_columns_float<F>(w_row, k, b_col, b.nb[0], b.nb[1], ncols, acc);
#pragma unroll
      for (int c = 0; c < kMatVecMaxCols; ++c) {
        if (c >= ncols) break;
        float sum = warp_sum(acc[c]);
        if constexpr (kBias) sum += bias[i];
        if (lane == 0) *reinterpret_cast<float*>(element_ptr(dst, i, j0 + c, i2, i3)) = sum;
      }
    }
  }
}

/// The same for quantized weights of dot format D, kCols columns per step, against activations
/// quantized into xq (rows in (j, i2, i3) order): mul_mat_q8_kernel's and mat_vec_multi_q8_kernel's
/// warp. Sums in double, rounded once (docs/NUMERICS.md).
template <class D, int kCols, bool kBias>
__device__ __forceinline__ void mat_vec_q8_row(const TensorDesc& dst, const TensorDesc& w,
                                               const typename D::Act* xq, int64_t i, int64_t r2, int64_t r3,
                                               const float* bias) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n_blocks = w.ne[0] / D::kBlock, n = dst.ne[1], batches = dst.ne[2] * dst.ne[3];
  for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {
    const int64_t i2 = z % dst.ne[2], i3 = z / dst.ne[2];
    const auto* w_row = reinterpret_cast<const uint8_t*>(row_ptr(w, i, i2 / r2, i3 / r3));
    for (int64_t j0 = static_cast<int64_t>(blockIdx.y) * kCols; j0 < n;
         j0 += static_cast<int64_t>(gridDim.y) * kCols) {
      const int ncols = static_cast<int>(n - j0 < kCols ? n - j0 : kCols);
      double acc[kCols] = {};
      dot_columns<D>(w_row, n_blocks, xq + (j0 + n * z) * n_blocks, ncols, acc);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        if (c >= ncols) break;
        auto sum = static_cast<float>(warp_sum(acc[c]));
        if constexpr (kBias) sum += bias[i];
        if (lane == 0) *reinterpret_cast<float*>(element_ptr(dst, i, j0 + c, i2, i3)) = sum;
      }
    }
  }
}

}  // namespace loom::cuda
