// Softmax of one row by one block: shared by soft_max (softmax.cu) and the fused kernels that end
// in one (fused.cu: scale_mask_soft_max, moe_route). Device code only; includes nothing outside
// src/backend/cuda/.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace loom::cuda {

/// y[i] = softmax(logit(0 .. n-1))[i] for a row of n: pass 1 stores logit(i) in y and finds the
/// maximum, pass 2 exponentiates and sums, pass 3 normalizes. y may be global or shared memory, and
/// may alias what logit() reads: each thread touches the same elements in every pass. A fully
/// masked row (every logit -inf) gives zeros, not NaN, as on the CPU. The arithmetic is the CPU's
/// (ops_rows.cpp): exponentials in double rounded to float, their sum in double, the reciprocal
/// rounded to float, so both backends give the same bits (docs/NUMERICS.md). `scratch` holds 32
/// doubles of shared memory; all threads of the block must call this.
template <class Logit>
__device__ __forceinline__ void soft_max_row(float* y, int64_t n, Logit&& logit, double* scratch) {
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = logit(i);
    y[i] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, reinterpret_cast<float*>(scratch));
  if (mx == -INFINITY) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const auto e = static_cast<float>(exp(static_cast<double>(__fsub_rn(y[i], mx))));
    y[i] = e;
    sum += e;
  }
  const auto inv = static_cast<float>(1.0 / block_sum(sum, scratch));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(y[i], inv);
}

}  // namespace loom::cuda
