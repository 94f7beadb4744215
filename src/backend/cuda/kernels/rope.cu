// Rotary embedding: one block per row (one head of one token), one thread per rotating pair;
// dimensions past n_dims are copied. Each pair is read and written by the same thread, so the op
// may run in place. Angles in double (see RopeArgs): a pow and a sincos in FP64 per pair and head,
// small next to the attention that follows (an H200 does ~34 FP64 TFLOP/s).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/rope.cuh"

namespace loom::cuda {

namespace {

__global__ void rope_kernel(TensorDesc dst, TensorDesc a, TensorDesc pos, TensorDesc freq_factors,
                            bool has_ff, RopeArgs p) {
  const int64_t ne0 = dst.ne[0];
  const int half = p.n_dims / 2;
  for (int64_t r = blockIdx.x; r < nrows(dst); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, dst.ne[1], dst.ne[2], i1, i2, i3);
    const auto* x = reinterpret_cast<const float*>(row_ptr(a, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(row_ptr(dst, i1, i2, i3));
    const int32_t position = *reinterpret_cast<const int32_t*>(pos.data + i2 * pos.nb[0]);
    for (int64_t t = threadIdx.x; t < ne0; t += blockDim.x) {
      if (t >= p.n_dims) {
        y[t] = x[t];
        continue;
      }
      if (t >= half) continue;  // elements half..n_dims-1 belong to pairs of threads below half
      const int i = static_cast<int>(t);
      // theta_i = pos * base^(-2i/n_dims) / ff_i, then linear scaling blended with extrapolation
      double inv_freq = pow(p.freq_base, -2.0 * i / p.n_dims);
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
      const auto c = static_cast<float>(cd * p.mscale);
      const auto s = static_cast<float>(sd * p.mscale);
      // normal mode rotates (2i, 2i+1); neox rotates (i, i + n_dims/2)
      const int64_t j0 = p.neox ? i : 2 * i;
      const int64_t j1 = p.neox ? i + half : 2 * i + 1;
      const float x0 = x[j0], x1 = x[j1];
      y[j0] = x0 * c - x1 * s;
      y[j1] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

CudaError launch_rope(const LaunchContext& ctx, const Tensor* dst, const RopeArgs& args) {
  if (dst->nrows() == 0) return {};
  const Tensor* ff = dst->src[2];
  const TensorDesc ff_desc = ff ? desc_of(ff) : TensorDesc{};
  rope_kernel<<<row_grid(dst->nrows()), row_block_threads(dst->ne[0]), 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), ff_desc, ff != nullptr, args);
  LOOM_CUDA_CHECK_LAUNCH("rope_kernel");
  return {};
}

}  // namespace loom::cuda
