// Rotating one row (one head of one token) by the rotary embedding: shared by rope (rope.cu) and
// the fused store of rotated keys into the KV cache (fused.cu). Device code only; includes nothing
// outside src/backend/cuda/.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "rope_args.h"

namespace loom::cuda {

/// cos and sin of pair i's angle at `position`, times mscale: theta_i = pos * base^(-2i/n_dims) / ff_i,
/// then linear scaling blended with extrapolation (YaRN). In double (see RopeArgs): the base frequency
/// from the host's table (else an FP64 pow) and an FP64 sincos. Cheap in throughput, but a long chain
/// of dependent FP64 operations on a decode step's path (the pow was most of it).
__device__ __forceinline__ void rope_angle(int i, int32_t position, const RopeArgs& p, const TensorDesc& freq_factors,
                                           bool has_ff, float& c, float& s) {
  double inv_freq = p.has_table ? p.inv_freq[i] : pow(p.freq_base, -2.0 * i / p.n_dims);
  if (has_ff) inv_freq /= *reinterpret_cast<const float*>(freq_factors.data + i * freq_factors.nb[0]);
  const double theta_extrap = position * inv_freq;
  const double theta_interp = p.freq_scale * theta_extrap;
  double theta = theta_interp;
  if (p.ext_factor != 0.0) {
    const double y_ramp = (i - p.corr_low) / fmax(0.001, p.corr_high - p.corr_low);
    const double ramp_mix = (1.0 - fmin(1.0, fmax(0.0, y_ramp))) * p.ext_factor;
    theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
  }
  double sd, cd;
  sincos(theta, &sd, &cd);
  c = static_cast<float>(cd * p.mscale);
  s = static_cast<float>(sd * p.mscale);
}

/// The elements pair t (< n_dims / 2) rotates: normal mode (2t, 2t+1), neox (t, t + n_dims/2).
__device__ __forceinline__ void rope_pair_of(int64_t t, const RopeArgs& p, int64_t& j0, int64_t& j1) {
  j0 = p.neox ? t : 2 * t;
  j1 = p.neox ? t + p.n_dims / 2 : 2 * t + 1;
}
// The rotated pair, in the CPU's float operations, kept from contracting into FMAs (docs/NUMERICS.md).
__device__ __forceinline__ float rope_first(float x0, float x1, float c, float s) {
  return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ float rope_second(float x0, float x1, float c, float s) {
  return __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/// Element t of the row x rotated with pair (c, s) (t < n_dims / 2 rotates pair t and stores both of
/// its elements; n_dims / 2 <= t < n_dims stores nothing, its pair's owner does; t >= n_dims copies).
template <class Store>
__device__ __forceinline__ void rope_element(const float* x, int64_t t, const RopeArgs& p, float c, float s,
                                             Store&& store) {
  const int half = p.n_dims / 2;
  if (t >= p.n_dims) {
    store(t, x[t]);
    return;
  }
  if (t >= half) return;
  int64_t j0, j1;
  rope_pair_of(t, p, j0, j1);
  const float x0 = x[j0], x1 = x[j1];
  store(j0, rope_first(x0, x1, c, s));
  store(j1, rope_second(x0, x1, c, s));
}

/// Rotates the row x of ne0 elements at `position` and hands each result to store(j, value). The
/// block's threads split the row: thread t rotates pair t (t < n_dims / 2) and copies element t
/// when t >= n_dims, and so on with a stride of blockDim.x. Each pair is read and stored by the
/// same thread, so the destination may be x itself.
template <class Store>
__device__ __forceinline__ void rope_row(const float* x, int64_t ne0, int32_t position, const RopeArgs& p,
                                         const TensorDesc& freq_factors, bool has_ff, Store&& store) {
  for (int64_t t = threadIdx.x; t < ne0; t += blockDim.x) {
    float c = 0.0f, s = 0.0f;
    if (t < p.n_dims / 2) rope_angle(static_cast<int>(t), position, p, freq_factors, has_ff, c, s);
    rope_element(x, t, p, c, s, store);
  }
}

}  // namespace loom::cuda
