// Rotary position embedding. Kernel in rope.cu.
#pragma once

#include "backend/cuda/kernels/launch.h"

namespace loom::cuda {

/// RopeParams reduced to what the kernel needs; the host computes the YaRN terms once. Angles are
/// computed in double, as on the CPU: positions times frequencies reach 10^4-10^5 radians, where a
/// float angle is off by ~10^-3.
struct RopeArgs {
  int n_dims = 0;
  bool neox = false;
  double freq_base = 10000.0;
  double freq_scale = 1.0;
  double ext_factor = 0.0;
  double mscale = 1.0;     ///< attn_factor, times YaRN's magnitude correction when ext_factor != 0
  double corr_low = 0.0;   ///< YaRN ramp over the pair index: from corr_low (extrapolate)
  double corr_high = 0.0;  ///< to corr_high (interpolate)
};

/// dst = rope(src[0]) with positions src[1] and optional frequency factors src[2].
CudaError launch_rope(const LaunchContext& ctx, const Tensor* dst, const RopeArgs& args);

}  // namespace loom::cuda
