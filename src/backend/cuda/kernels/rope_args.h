// The rotary embedding's parameters as kernels take them: plain data shared by device code
// (rope_row.cuh) and host launch code (rope.cuh).
#pragma once

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

}  // namespace loom::cuda
