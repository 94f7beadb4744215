// Rounding helpers shared by the reference quantizers of loom_core (private to src/core).
#pragma once

#include <algorithm>
#include <cmath>

#include "loom/dtype.h"

namespace loom::quant_detail {

inline constexpr float kF16Max = 65504.0f;

// Rounds to nearest and clamps to [lo, hi]; NaN maps to lo so garbage input never reaches lrint.
inline int round_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::lrint(v));
}

// The value an f16 field will decode to (finite: clamped to the f16 range first).
inline float f16_field(float v) {
  if (!(v > 0.0f)) return 0.0f;
  return f16_to_f32(f32_to_f16(std::min(v, kF16Max)));
}

// The smallest f16 value >= v (clamped to the f16 range). Super-block scales round up so that the
// largest sub-scale never needs an integer past its maximum; rounding to nearest could force a clamp,
// which costs several percent where d is an f16 subnormal and its steps are coarse.
inline float f16_field_up(float v) {
  if (!(v > 0.0f)) return 0.0f;
  if (v >= kF16Max) return kF16Max;
  f16_bits h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;  // positive f16 values order like their bits
  return f16_to_f32(h);
}

}  // namespace loom::quant_detail
