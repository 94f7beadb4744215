// The inner loops of the mat-vec kernels (one warp per output row, up to kMatVecMaxCols columns),
// shared by mul_mat (matmul.cu) and the fused projections (fused.cu: glu_mat_vec). Device code
// only; includes nothing outside src/backend/cuda/.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/quant.cuh"
#include "backend/cuda/kernels/quantize_act.cuh"

namespace loom::cuda {

/// Columns one warp computes at once; float weights with more columns go to cuBLAS.
constexpr int kMatVecMaxCols = 8;
/// Warps (output rows) per block.
constexpr int kMatVecWarps = 4;

/// acc[c] += this lane's share of dot(weight row, activation column c) for c < ncols: float
/// weights of format F (f32, f16, bf16), f32 activations at b_col + e * b_nb0 + c * b_nb1. The lanes
/// split the k elements; the caller sums acc over the warp.
template <class F, int kCols>
__device__ __forceinline__ void dot_columns_float(const char* a_row, int64_t k, const char* b_col,
                                                  int64_t b_nb0, int64_t b_nb1, int ncols,
                                                  float (&acc)[kCols]) {
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t e = lane; e < k; e += kWarpSize) {
    const float w = load_element<F>(a_row, e);
    const char* b_elem = b_col + e * b_nb0;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (c < ncols) acc[c] += w * *reinterpret_cast<const float*>(b_elem + c * b_nb1);
  }
}

/// acc[c] += dot(weight row, activation row x + c * n_blocks) for c < ncols, quantized weights of dot
/// format D against activations quantized to D::Act blocks: the warp splits the row's blocks,
/// D::kParts lanes to a block, 32 / D::kParts blocks per step; each lane unpacks its share of a
/// weight block once for all columns. One column has little work per step to hide the memory
/// latency behind, so its loop is unrolled to keep several steps' loads in flight; with more
/// columns their independent loads do that already (and registers are scarcer).
template <class D, int kCols>
__device__ __forceinline__ void dot_columns(const uint8_t* w_row, int64_t n_blocks, const typename D::Act* x,
                                            int ncols, float (&acc)[kCols]) {
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

}  // namespace loom::cuda
