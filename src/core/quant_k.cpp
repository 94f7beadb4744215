// Reference quantization of the K-quant super-block formats Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (GGUF
// layouts, see loom/dtype.h). Q2_K, Q4_K and Q5_K are affine (a scale and a min per sub-block), Q3_K and
// Q6_K symmetric (a signed scale per sub-block); each family shares one fitting routine.
//
// The quantizers fit in two levels: each sub-block first gets a float scale (and for Q4_K a min)
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
#include "quant_util.h"

namespace loom {

namespace {

using quant_detail::f16_field;
using quant_detail::f16_field_up;
using quant_detail::round_clamp;

// ---- affine K-quants: Q4_K, Q5_K, Q2_K -------------------------------------------------------------

// x ~= d*sc[s]*q - dmin*m[s] with q in [0, nmax] and sub-scales/mins in [0, smax].
struct AffineK {
  int sub;           // elements per sub-block
  int nmax;          // largest code
  int smax;          // largest sub-scale / sub-min
  double stretch;    // step of the scale search around range/nmax
};
constexpr AffineK kQ4K{32, 15, 63, 0.25};
constexpr AffineK kQ5K{32, 31, 63, 0.25};
constexpr AffineK kQ2K{16, 3, 15, 0.1};
constexpr int kMaxSubs = kQK_K / 16;

// x ~= scale * q - min with q in [0, nmax], scale >= 0, min >= 0.
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

AffineFit fit_affine_sub_block(const float* x, const AffineK& f) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < f.sub; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (!(hi > lo)) return {0.0f, -lo};                 // constant sub-block at lo <= 0: exact with scale 0
  const double range = static_cast<double>(hi) - lo;  // may exceed the float range
  // Baseline: plain min/max mapping.
  double best_scale = range / f.nmax, best_offset = lo;
  double best_err = 0;
  for (int i = 0; i < f.sub; ++i) {
    const int q = round_clamp(static_cast<float>((x[i] - lo) / best_scale), 0, f.nmax);
    const double e = best_scale * q + lo - x[i];
    best_err += e * e;
  }
  // Candidates stretch or shrink the step around range/nmax (shrinking clips the extremes, which
  // pays off when most values crowd the middle), each followed by a least-squares refit of the codes.
  int q[32];
  for (int k = -5; k <= 6; ++k) {
    const double inv_step = (f.nmax + f.stretch * k) / range;
    for (int i = 0; i < f.sub; ++i) q[i] = round_clamp(static_cast<float>((x[i] - lo) * inv_step), 0, f.nmax);
    double scale, offset;
    const double err = affine_refit(x, q, f.sub, scale, offset);
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
double affine_k_codes(const float* x, const AffineK& f, float d, float dmin, const uint8_t* sc, const uint8_t* m,
                      uint8_t* q) {
  double err = 0;
  for (int j = 0; j < kQK_K / f.sub; ++j) {
    const float step = d * sc[j];
    const float off = dmin * m[j];
    for (int i = 0; i < f.sub; ++i) {
      const float v = x[j * f.sub + i];
      const int c = step > 0.0f ? round_clamp((v + off) / step, 0, f.nmax) : 0;
      q[j * f.sub + i] = static_cast<uint8_t>(c);
      const double e = static_cast<double>(step) * c - off - v;
      err += e * e;
    }
  }
  return err;
}

// The integers of one affine K-quant super-block: sub-scales sc, sub-mins m, codes q.
struct AffineKBlock {
  float d = 0.0f, dmin = 0.0f;
  uint8_t sc[kMaxSubs], m[kMaxSubs];
  uint8_t q[kQK_K];
};

void quantize_affine_k(const float* x, const AffineK& f, AffineKBlock& y) {
  const int subs = kQK_K / f.sub;
  AffineFit fits[kMaxSubs];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < subs; ++j) {
    fits[j] = fit_affine_sub_block(x + j * f.sub, f);
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  float d = f16_field_up(max_scale / static_cast<float>(f.smax));
  float dmin = f16_field_up(max_min / static_cast<float>(f.smax));
  uint8_t* sc = y.sc;
  uint8_t* m = y.m;
  for (int j = 0; j < subs; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.0f ? round_clamp(fits[j].scale / d, 0, f.smax) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0.0f ? round_clamp(fits[j].min / dmin, 0, f.smax) : 0);
  }
  double err = affine_k_codes(x, f, d, dmin, sc, m, y.q);

  // Refit x ~= d*(sc*q) - dmin*m over the whole super-block for the chosen integers.
  double saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;
  for (int i = 0; i < kQK_K; ++i) {
    const double a = static_cast<double>(sc[i / f.sub]) * y.q[i];
    const double b = m[i / f.sub];
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
      const double err2 = affine_k_codes(x, f, dr, dminr, sc, m, q2);
      if (err2 < err) {
        d = dr;
        dmin = dminr;
        std::memcpy(y.q, q2, sizeof(q2));
      }
    }
  }
  y.d = d;
  y.dmin = dmin;
}

void quantize_block_q4_k(const float* x, BlockQ4_K& y) {
  AffineKBlock k;
  quantize_affine_k(x, kQ4K, k);
  y.d = f32_to_f16(k.d);
  y.dmin = f32_to_f16(k.dmin);
  std::memset(y.scales, 0, sizeof(y.scales));
  for (int j = 0; j < 8; ++j) q4k_set_scale_min(j, y.scales, k.sc[j], k.m[j]);
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      y.qs[32 * p + l] = static_cast<uint8_t>(k.q[64 * p + l] | (k.q[64 * p + 32 + l] << 4));
}

void quantize_block_q5_k(const float* x, BlockQ5_K& y) {
  AffineKBlock k;
  quantize_affine_k(x, kQ5K, k);
  y.d = f32_to_f16(k.d);
  y.dmin = f32_to_f16(k.dmin);
  std::memset(y.scales, 0, sizeof(y.scales));
  for (int j = 0; j < 8; ++j) q4k_set_scale_min(j, y.scales, k.sc[j], k.m[j]);
  std::memset(y.qh, 0, sizeof(y.qh));
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      const int lo = k.q[64 * p + l], hi = k.q[64 * p + 32 + l];
      y.qs[32 * p + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      y.qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
    }
}

void quantize_block_q2_k(const float* x, BlockQ2_K& y) {
  AffineKBlock k;
  quantize_affine_k(x, kQ2K, k);
  y.d = f32_to_f16(k.d);
  y.dmin = f32_to_f16(k.dmin);
  for (int j = 0; j < kQK_K / 16; ++j) y.scales[j] = static_cast<uint8_t>(k.sc[j] | (k.m[j] << 4));
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* q = k.q + 128 * h + l;
      y.qs[32 * h + l] = static_cast<uint8_t>(q[0] | (q[32] << 2) | (q[64] << 4) | (q[96] << 6));
    }
}

// ---- symmetric K-quants: Q6_K, Q3_K -----------------------------------------------------------------

// x ~= d*sc[s]*q with q in [qlo, qhi] over sub-blocks of 16, sub-scales in [-smax-1, smax].
struct SymmetricK {
  int qlo, qhi;
  int smax;
  const float* targets;  // codes the sub-block's extreme value is tried at
  int n_targets;
};
// The range is lopsided, so mapping the extreme to qlo rather than qhi gains a step.
constexpr float kQ6KTargets[] = {-32.0f, -31.5f, -31.0f, -30.5f, -30.0f, -29.0f,
                                 -28.0f, 31.0f,  30.5f,  30.0f,  29.0f,  28.0f};
constexpr float kQ3KTargets[] = {-4.0f, -3.75f, -3.5f, -3.25f, -3.0f, -2.75f, 3.0f, 3.25f, 3.5f, 2.75f, 2.5f};
constexpr SymmetricK kQ6K{-32, 31, 127, kQ6KTargets, 12};
constexpr SymmetricK kQ3K{-4, 3, 31, kQ3KTargets, 11};
constexpr int kSymSub = 16;

// Symmetric scale for x ~= s * q; s may be negative.
float fit_symmetric_sub_block(const float* x, const SymmetricK& f) {
  float ext = 0.0f;
  for (int i = 0; i < kSymSub; ++i)
    if (std::fabs(x[i]) > std::fabs(ext)) ext = x[i];
  if (ext == 0.0f) return 0.0f;
  float best_scale = ext / static_cast<float>(f.qlo);
  double best_err = std::numeric_limits<double>::infinity();
  for (int k = 0; k < f.n_targets; ++k) {
    const float inv = f.targets[k] / ext;
    double sqq = 0, sqx = 0;
    int q[kSymSub];
    for (int i = 0; i < kSymSub; ++i) {
      q[i] = round_clamp(x[i] * inv, f.qlo, f.qhi);
      sqq += static_cast<double>(q[i]) * q[i];
      sqx += static_cast<double>(q[i]) * x[i];
    }
    if (!(sqq > 0)) continue;
    const double s = sqx / sqq;
    double err = 0;
    for (int i = 0; i < kSymSub; ++i) {
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

double symmetric_k_codes(const float* x, const SymmetricK& f, float d, const int8_t* sc, int8_t* q) {
  double err = 0;
  for (int j = 0; j < kQK_K / kSymSub; ++j) {
    const float step = d * sc[j];
    for (int i = 0; i < kSymSub; ++i) {
      const float v = x[j * kSymSub + i];
      const int c = step != 0.0f ? round_clamp(v / step, f.qlo, f.qhi) : 0;
      q[j * kSymSub + i] = static_cast<int8_t>(c);
      const double e = static_cast<double>(step) * c - v;
      err += e * e;
    }
  }
  return err;
}

// Fills d, the sub-scales and the signed codes of one super-block.
void quantize_symmetric_k(const float* x, const SymmetricK& f, float& d_out, int8_t* sc, int8_t* q) {
  constexpr int kSubs = kQK_K / kSymSub;
  float scales[kSubs];
  float max_abs = 0.0f;
  for (int j = 0; j < kSubs; ++j) {
    scales[j] = fit_symmetric_sub_block(x + j * kSymSub, f);
    max_abs = std::max(max_abs, std::fabs(scales[j]));
  }
  float d = f16_field_up(max_abs / static_cast<float>(f.smax));
  for (int j = 0; j < kSubs; ++j)
    sc[j] = static_cast<int8_t>(d > 0.0f ? round_clamp(scales[j] / d, -f.smax - 1, f.smax) : 0);
  double err = symmetric_k_codes(x, f, d, sc, q);

  double saa = 0, sax = 0;
  for (int i = 0; i < kQK_K; ++i) {
    const double a = static_cast<double>(sc[i / kSymSub]) * q[i];
    saa += a * a;
    sax += a * x[i];
  }
  if (saa > 0) {
    const double d2 = sax / saa;
    if (d2 > 0 && std::isfinite(d2)) {
      const float dr = f16_field(static_cast<float>(d2));
      int8_t q2[kQK_K];
      const double err2 = symmetric_k_codes(x, f, dr, sc, q2);
      if (err2 < err) {
        d = dr;
        std::memcpy(q, q2, sizeof(q2));
      }
    }
  }
  d_out = d;
}

void quantize_block_q6_k(const float* x, BlockQ6_K& y) {
  float d;
  int8_t sc[kQK_K / kSymSub], q[kQK_K];
  quantize_symmetric_k(x, kQ6K, d, sc, q);
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

void quantize_block_q3_k(const float* x, BlockQ3_K& y) {
  float d;
  int8_t sc[kQK_K / kSymSub], q[kQK_K];
  quantize_symmetric_k(x, kQ3K, d, sc, q);
  y.d = f32_to_f16(d);
  std::memset(y.scales, 0, sizeof(y.scales));
  for (int j = 0; j < kQK_K / kSymSub; ++j) q3k_set_scale(j, y.scales, sc[j] + 32);
  std::memset(y.hmask, 0, sizeof(y.hmask));
  std::memset(y.qs, 0, sizeof(y.qs));
  for (int e = 0; e < kQK_K; ++e) {
    const int u = q[e] + 4;  // 0..7: bit 2 is the "no -4 offset" mask bit
    const int h = e / 128, k = (e / 32) % 4, l = e % 32;
    y.qs[32 * h + l] |= static_cast<uint8_t>((u & 3) << (2 * k));
    y.hmask[l] |= static_cast<uint8_t>((u >> 2) << (e / 32));
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

// Sub-block j's low 4 bits sit in byte j % 8 (low nibble for j < 8, high nibble after), its top 2
// bits in byte 8 + j % 4 at bit 2 * (j / 4).
int q3k_scale(int j, const uint8_t* scales) {
  const int lo = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | (hi << 4);
}

void q3k_set_scale(int j, uint8_t* scales, int sc) {
  const int lo_shift = 4 * (j / 8), hi_shift = 2 * (j / 4);
  scales[j % 8] = static_cast<uint8_t>((scales[j % 8] & ~(0xF << lo_shift)) | ((sc & 0xF) << lo_shift));
  scales[8 + j % 4] =
      static_cast<uint8_t>((scales[8 + j % 4] & ~(3 << hi_shift)) | (((sc >> 4) & 3) << hi_shift));
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) quantize_block_q5_k(x + b * kQK_K, y[b]);
}

void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    const float dmin = f16_to_f32(x[b].dmin);
    for (int j = 0; j < 8; ++j) {  // sub-block j: nibble j % 2 of qs[32 * (j / 2) + l], bit j of qh[l]
      uint8_t sc, m;
      q4k_get_scale_min(j, x[b].scales, &sc, &m);
      const float step = d * sc, off = dmin * m;
      const uint8_t* qs = x[b].qs + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> (4 * (j % 2))) & 0xF) | (((x[b].qh[l] >> j) & 1) << 4);
        y[32 * j + l] = step * static_cast<float>(q) - off;
      }
    }
  }
}

void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) quantize_block_q2_k(x + b * kQK_K, y[b]);
}

void dequantize_row_q2_k(const BlockQ2_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    const float dmin = f16_to_f32(x[b].dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const uint8_t s = x[b].scales[e / 16];
      const float step = d * static_cast<float>(s & 0xF), off = dmin * static_cast<float>(s >> 4);
      const int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
      y[e] = step * static_cast<float>(q) - off;
    }
  }
}

void quantize_row_q3_k(const float* x, BlockQ3_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) quantize_block_q3_k(x + b * kQK_K, y[b]);
}

void dequantize_row_q3_k(const BlockQ3_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    for (int e = 0; e < kQK_K; ++e) {
      const float step = d * static_cast<float>(q3k_scale(e / 16, x[b].scales) - 32);
      const int lo = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
      const int hbit = (x[b].hmask[e % 32] >> (e / 32)) & 1;
      y[e] = step * static_cast<float>(lo - 4 * (1 - hbit));
    }
  }
}

}  // namespace loom
