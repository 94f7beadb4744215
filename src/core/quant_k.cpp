// Reference quantization of the K-quant super-block formats Q4_K and Q6_K (GGUF layouts, see
// loom/dtype.h).
//
// Both quantizers fit in two levels: each sub-block first gets a float scale (and for Q4_K a min)
// chosen by a small search that minimizes squared error, then the super-block scale d (and dmin)
// is chosen so the largest sub-scale uses the full integer range, the sub-scales are rounded to
// it, and the element codes are recomputed against the *rounded* scales (what the decoder will
// actually see). A last least-squares pass refits d/dmin for the final codes and is kept only if
// it lowers the error. Fits run in double so huge inputs cannot overflow the sums of squares.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "loom/quant.h"

namespace loom {

namespace {

constexpr float kF16Max = 65504.0f;
constexpr int kQ4KSub = 32;  // elements per Q4_K sub-block
constexpr int kQ6KSub = 16;  // elements per Q6_K sub-block

// Rounds to nearest and clamps to [lo, hi]; NaN maps to lo so garbage input never reaches lrint.
int round_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::lrint(v));
}

// The value an f16 field will decode to (finite: clamped to the f16 range first).
float f16_field(float v) {
  if (!(v > 0.0f)) return 0.0f;
  return f16_to_f32(f32_to_f16(std::min(v, kF16Max)));
}

// The smallest f16 value >= v (clamped to the f16 range). Super-block scales round up so that the
// largest sub-scale never needs an integer past its maximum; rounding to nearest could force a clamp,
// which costs several percent where d is an f16 subnormal and its steps are coarse.
float f16_field_up(float v) {
  if (!(v > 0.0f)) return 0.0f;
  if (v >= kF16Max) return kF16Max;
  f16_bits h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;  // positive f16 values order like their bits
  return f16_to_f32(h);
}

// ---- Q4_K -----------------------------------------------------------------------------------------

// x ~= scale * q - min with q in [0, 15], scale >= 0, min >= 0.
struct AffineFit {
  float scale = 0.0f;
  float min = 0.0f;
};

// Least-squares (scale, offset) for x ~= scale*q + offset given codes q, with offset <= 0 (the
// format subtracts a non-negative min). Returns the squared error, or infinity if degenerate.
double affine_refit(const float* x, const int* q, int n, double& scale, double& offset) {
  double sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < n; ++i) {
    sq += q[i];
    sqq += static_cast<double>(q[i]) * q[i];
    sx += x[i];
    sqx += static_cast<double>(q[i]) * x[i];
  }
  const double det = n * sqq - sq * sq;
  if (det > 0) {
    scale = (n * sqx - sq * sx) / det;
    offset = (sqq * sx - sq * sqx) / det;
  } else {
    scale = 0;
    offset = 1;  // forces the fallback below
  }
  if (offset > 0) {
    offset = 0;
    scale = sqq > 0 ? sqx / sqq : 0;
  }
  if (!(scale >= 0) || !std::isfinite(scale) || !std::isfinite(offset))
    return std::numeric_limits<double>::infinity();
  double err = 0;
  for (int i = 0; i < n; ++i) {
    const double e = scale * q[i] + offset - x[i];
    err += e * e;
  }
  return err;
}

AffineFit fit_q4k_sub_block(const float* x) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < kQ4KSub; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (!(hi > lo)) return {0.0f, -lo};                 // constant sub-block at lo <= 0: exact with scale 0
  const double range = static_cast<double>(hi) - lo;  // may exceed the float range
  // Baseline: plain min/max mapping.
  double best_scale = range / 15.0, best_offset = lo;
  double best_err = 0;
  for (int i = 0; i < kQ4KSub; ++i) {
    const int q = round_clamp(static_cast<float>((x[i] - lo) / best_scale), 0, 15);
    const double e = best_scale * q + lo - x[i];
    best_err += e * e;
  }
  // Candidates stretch or shrink the step around range/15 (shrinking clips the extremes, which pays
  // off when most values crowd the middle), each followed by a least-squares refit of the codes.
  int q[kQ4KSub];
  for (int k = -5; k <= 6; ++k) {
    const double inv_step = (15.0 + 0.25 * k) / range;
    for (int i = 0; i < kQ4KSub; ++i) q[i] = round_clamp(static_cast<float>((x[i] - lo) * inv_step), 0, 15);
    double scale, offset;
    const double err = affine_refit(x, q, kQ4KSub, scale, offset);
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_offset = offset;
    }
  }
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  return {static_cast<float>(std::min(best_scale, kFloatMax)),
          static_cast<float>(std::min(-best_offset, kFloatMax))};
}

// Codes for one super-block given the decoded d/dmin and integer sub-scales; returns squared error.
double q4k_codes(const float* x, float d, float dmin, const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  double err = 0;
  for (int j = 0; j < 8; ++j) {
    const float step = d * sc[j];
    const float off = dmin * m[j];
    for (int i = 0; i < kQ4KSub; ++i) {
      const float v = x[j * kQ4KSub + i];
      const int c = step > 0.0f ? round_clamp((v + off) / step, 0, 15) : 0;
      q[j * kQ4KSub + i] = static_cast<uint8_t>(c);
      const double e = static_cast<double>(step) * c - off - v;
      err += e * e;
    }
  }
  return err;
}

void quantize_block_q4_k(const float* x, BlockQ4_K& y) {
  AffineFit fits[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fits[j] = fit_q4k_sub_block(x + j * kQ4KSub);
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  float d = f16_field_up(max_scale / 63.0f);
  float dmin = f16_field_up(max_min / 63.0f);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.0f ? round_clamp(fits[j].scale / d, 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0.0f ? round_clamp(fits[j].min / dmin, 0, 63) : 0);
  }
  uint8_t q[kQK_K];
  double err = q4k_codes(x, d, dmin, sc, m, q);

  // Refit x ~= d*(sc*q) - dmin*m over the whole super-block for the chosen integers.
  double saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;
  for (int i = 0; i < kQK_K; ++i) {
    const double a = static_cast<double>(sc[i / kQ4KSub]) * q[i];
    const double b = m[i / kQ4KSub];
    saa += a * a;
    sab += a * b;
    sbb += b * b;
    sax += a * x[i];
    sbx += b * x[i];
  }
  const double det = saa * sbb - sab * sab;
  if (det > 0) {
    const double d2 = (sax * sbb - sab * sbx) / det;
    const double dmin2 = (sab * sax - saa * sbx) / det;  // coefficient of -b
    if (d2 > 0 && dmin2 >= 0 && std::isfinite(d2) && std::isfinite(dmin2)) {
      const float dr = f16_field(static_cast<float>(d2));
      const float dminr = f16_field(static_cast<float>(dmin2));
      uint8_t q2[kQK_K];
      const double err2 = q4k_codes(x, dr, dminr, sc, m, q2);
      if (err2 < err) {
        d = dr;
        dmin = dminr;
        std::memcpy(q, q2, sizeof(q));
      }
    }
  }

  y.d = f32_to_f16(d);
  y.dmin = f32_to_f16(dmin);
  std::memset(y.scales, 0, sizeof(y.scales));
  for (int j = 0; j < 8; ++j) q4k_set_scale_min(j, y.scales, sc[j], m[j]);
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      y.qs[32 * p + l] = static_cast<uint8_t>(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
}

// ---- Q6_K -----------------------------------------------------------------------------------------

// Symmetric scale for x ~= s * q with q in [-32, 31]; s may be negative (the range is lopsided, so
// mapping the extreme to -32 rather than 31 gains a step).
float fit_q6k_sub_block(const float* x) {
  float ext = 0.0f;
  for (int i = 0; i < kQ6KSub; ++i)
    if (std::fabs(x[i]) > std::fabs(ext)) ext = x[i];
  if (ext == 0.0f) return 0.0f;
  static constexpr float kTargets[] = {-32.0f, -31.5f, -31.0f, -30.5f, -30.0f, -29.0f,
                                       -28.0f, 31.0f,  30.5f,  30.0f,  29.0f,  28.0f};
  float best_scale = ext / -32.0f;
  double best_err = std::numeric_limits<double>::infinity();
  for (float t : kTargets) {
    const float inv = t / ext;
    double sqq = 0, sqx = 0;
    int q[kQ6KSub];
    for (int i = 0; i < kQ6KSub; ++i) {
      q[i] = round_clamp(x[i] * inv, -32, 31);
      sqq += static_cast<double>(q[i]) * q[i];
      sqx += static_cast<double>(q[i]) * x[i];
    }
    if (!(sqq > 0)) continue;
    const double s = sqx / sqq;
    double err = 0;
    for (int i = 0; i < kQ6KSub; ++i) {
      const double e = s * q[i] - x[i];
      err += e * e;
    }
    if (err < best_err && std::isfinite(s)) {
      best_err = err;
      best_scale = static_cast<float>(s);
    }
  }
  return best_scale;
}

double q6k_codes(const float* x, float d, const int8_t* sc, int8_t* q) {
  double err = 0;
  for (int j = 0; j < kQK_K / kQ6KSub; ++j) {
    const float step = d * sc[j];
    for (int i = 0; i < kQ6KSub; ++i) {
      const float v = x[j * kQ6KSub + i];
      const int c = step != 0.0f ? round_clamp(v / step, -32, 31) : 0;
      q[j * kQ6KSub + i] = static_cast<int8_t>(c);
      const double e = static_cast<double>(step) * c - v;
      err += e * e;
    }
  }
  return err;
}

void quantize_block_q6_k(const float* x, BlockQ6_K& y) {
  constexpr int kSubs = kQK_K / kQ6KSub;
  float scales[kSubs];
  float max_abs = 0.0f;
  for (int j = 0; j < kSubs; ++j) {
    scales[j] = fit_q6k_sub_block(x + j * kQ6KSub);
    max_abs = std::max(max_abs, std::fabs(scales[j]));
  }
  float d = f16_field_up(max_abs / 127.0f);
  int8_t sc[kSubs];
  for (int j = 0; j < kSubs; ++j)
    sc[j] = static_cast<int8_t>(d > 0.0f ? round_clamp(scales[j] / d, -128, 127) : 0);
  int8_t q[kQK_K];
  double err = q6k_codes(x, d, sc, q);

  double saa = 0, sax = 0;
  for (int i = 0; i < kQK_K; ++i) {
    const double a = static_cast<double>(sc[i / kQ6KSub]) * q[i];
    saa += a * a;
    sax += a * x[i];
  }
  if (saa > 0) {
    const double d2 = sax / saa;
    if (d2 > 0 && std::isfinite(d2)) {
      const float dr = f16_field(static_cast<float>(d2));
      int8_t q2[kQK_K];
      const double err2 = q6k_codes(x, dr, sc, q2);
      if (err2 < err) {
        d = dr;
        std::memcpy(q, q2, sizeof(q));
      }
    }
  }

  y.d = f32_to_f16(d);
  std::memcpy(y.scales, sc, sizeof(sc));
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = y.ql + 64 * h;
    uint8_t* qh = y.qh + 32 * h;
    const int8_t* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int q0 = qq[l] + 32, q1 = qq[l + 32] + 32, q2 = qq[l + 64] + 32, q3 = qq[l + 96] + 32;
      ql[l] = static_cast<uint8_t>((q0 & 0xF) | ((q2 & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
    }
  }
}

}  // namespace

// Sub-blocks 0-3 keep their 6-bit scale/min in the low bits of bytes 0-3 / 4-7; sub-blocks 4-7 keep
// their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the spare top bits of
// bytes 0-3 (scale) and 4-7 (min).
void q4k_get_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

void q4k_set_scale_min(int j, uint8_t* scales, uint8_t sc, uint8_t m) {
  sc &= 63;
  m &= 63;
  if (j < 4) {
    scales[j] = static_cast<uint8_t>((scales[j] & 0xC0) | sc);
    scales[j + 4] = static_cast<uint8_t>((scales[j + 4] & 0xC0) | m);
  } else {
    scales[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
    scales[j - 4] = static_cast<uint8_t>((scales[j - 4] & 63) | ((sc >> 4) << 6));
    scales[j] = static_cast<uint8_t>((scales[j] & 63) | ((m >> 4) << 6));
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) quantize_block_q4_k(x + b * kQK_K, y[b]);
}

void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    const float dmin = f16_to_f32(x[b].dmin);
    for (int p = 0; p < 4; ++p) {
      uint8_t sc0, m0, sc1, m1;
      q4k_get_scale_min(2 * p, x[b].scales, &sc0, &m0);
      q4k_get_scale_min(2 * p + 1, x[b].scales, &sc1, &m1);
      const float step0 = d * sc0, off0 = dmin * m0;
      const float step1 = d * sc1, off1 = dmin * m1;
      const uint8_t* qs = x[b].qs + 32 * p;
      for (int l = 0; l < 32; ++l) {
        y[64 * p + l] = step0 * (qs[l] & 0xF) - off0;
        y[64 * p + 32 + l] = step1 * (qs[l] >> 4) - off1;
      }
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) quantize_block_q6_k(x + b * kQK_K, y[b]);
}

void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
      float* out = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = d * sc[is + 0] * q0;
        out[l + 32] = d * sc[is + 2] * q1;
        out[l + 64] = d * sc[is + 4] * q2;
        out[l + 96] = d * sc[is + 6] * q3;
      }
    }
  }
}

}  // namespace loom
