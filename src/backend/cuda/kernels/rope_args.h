// The rotary embedding's parameters as kernels take them: plain data shared by device code
// (rope_row.cuh) and host launch code (rope.cuh).
#pragma once

namespace loom::cuda {

/// RopeParams reduced to what the kernel needs; the host computes the YaRN terms once. Angles are
/// computed in double, as on the CPU: positions times frequencies reach 10^4-10^5 radians, where a
/// float angle is off by ~10^-3.
/// Rotation pairs whose base frequencies the host computes into RopeArgs::inv_freq (head sizes to 256).
constexpr int kMaxRopeTable = 128;

struct RopeArgs {
  int n_dims = 0;
  bool neox = false;
  double freq_base = 10000.0;
  double freq_scale = 1.0;
  double ext_factor = 0.0;
  double mscale = 1.0;     ///< attn_factor, times YaRN's magnitude correction when ext_factor != 0
  double corr_low = 0.0;   ///< YaRN ramp over the pair index: from corr_low (extrapolate)
  double corr_high = 0.0;  ///< to corr_high (interpolate)
  /// freq_base^(-2 i / n_dims) of each pair, by the host's std::pow as the CPU computes it (before the
  /// frequency factors), where n_dims / 2 <= kMaxRopeTable; else the kernels call pow. An FP64 pow was
  /// most of a decode step's angle chain.
  bool has_table = false;
  double inv_freq[kMaxRopeTable] = {};
};

}  // namespace loom::cuda
