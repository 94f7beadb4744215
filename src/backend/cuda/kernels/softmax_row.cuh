// Softmax of one row by one block: shared by soft_max (softmax.cu) and the fused kernels that end
// in one (fused.cu: scale_mask_soft_max, moe_route). Device code only; includes nothing outside
// src/backend/cuda/.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace loom::cuda {

/// y[i] = softmax(logit(0 .. n-1))[i] for a row of n: pass 1 stores logit(i) in y and finds the
/// maximum, pass 2 exponentiates and sums, pass 3 normalizes. y may be global or shared memory, and
/// may alias what logit() reads: each thread touches the same elements in every pass. A fully
/// masked row (every logit -inf) gives zeros, not NaN, as on the CPU. `scratch` holds 32 floats of
/// shared memory; all threads of the block must call this.
template <class Logit>
__device__ __forceinline__ void soft_max_row(float* y, int64_t n, Logit&& logit, float* scratch) {
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = logit(i);
    y[i] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, scratch);
  if (mx == -INFINITY) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(y[i] - mx);
    y[i] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum, scratch);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] *= inv;
}

}  // namespace loom::cuda
