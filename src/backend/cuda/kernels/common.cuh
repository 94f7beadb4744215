// Device helpers shared by the kernels: tensor addressing, half conversions, warp and block
// reductions. Includes nothing outside src/backend/cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels/tensor_desc.h"

namespace loom::cuda {

constexpr int kWarpSize = 32;

__device__ __forceinline__ int64_t nelements(const TensorDesc& t) {
  return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}
__device__ __forceinline__ int64_t nrows(const TensorDesc& t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

/// Address of element (i0, i1, i2, i3) of a non-quantized tensor.
__device__ __forceinline__ char* element_ptr(const TensorDesc& t, int64_t i0, int64_t i1, int64_t i2,
                                             int64_t i3) {
  return t.data + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/// Address of row (i1, i2, i3).
__device__ __forceinline__ char* row_ptr(const TensorDesc& t, int64_t i1, int64_t i2, int64_t i3) {
  return t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/// Splits a flat row index into (i1, i2, i3) for a tensor with ne1 x ne2 rows per i3.
__device__ __forceinline__ void split_row(int64_t r, int64_t ne1, int64_t ne2, int64_t& i1, int64_t& i2,
                                          int64_t& i3) {
  i1 = r % ne1;
  i2 = (r / ne1) % ne2;
  i3 = r / (ne1 * ne2);
}

/// Splits a flat element index into (i0, i1, i2, i3) in the order ne[0] fastest.
__device__ __forceinline__ void split_index(int64_t e, const int64_t* ne, int64_t* i) {
  i[0] = e % ne[0];
  e /= ne[0];
  i[1] = e % ne[1];
  e /= ne[1];
  i[2] = e % ne[2];
  i[3] = e / ne[2];
}

__device__ __forceinline__ float f16_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ uint16_t float_to_f16(float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t float_to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
/// `scratch` holds 32 floats of shared memory; the call ends with the block synchronized, so the
/// scratch may be reused at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}

/// Maximum over the whole block; same contract as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}

}  // namespace loom::cuda
