// Reference quantization of the code-book formats: IQ4_NL, IQ4_XS (non-uniform 4-bit values, the
// table in loom/dtype.h) and MXFP4 (e2m1 values under a power-of-two block scale).
//
// The fits search a handful of scales that put the block's extreme value at or near an extreme code,
// give every element its nearest code, refit the scale by least squares for those codes, and keep
// whichever candidate has the lowest squared error as the decoder will see it (scales rounded to
// their stored precision). Decoders compute what gguf-py's reference decoder computes, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "loom/quant.h"
#include "quant_util.h"

namespace loom {

namespace {

using quant_detail::f16_field_up;
using quant_detail::kF16Max;
using quant_detail::round_clamp;

constexpr int kIQ4XSSub = 32;

// Index of the code-book entry nearest to v (kIQ4NLValues is sorted ascending).
int nearest_iq4(float v) {
  const int8_t* t = kIQ4NLValues;
  if (!(v > t[0])) return 0;
  if (v >= t[15]) return 15;
  int lo = 0, hi = 15;  // t[lo] < v <= t[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v > t[mid])
      lo = mid;
    else
      hi = mid;
  }
  return v - t[lo] <= t[hi] - v ? lo : hi;
}

// Codes of n values against step `d` (the decoded scale); returns the squared error.
double iq4_codes(const float* x, int n, float d, uint8_t* q) {
  double err = 0;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = d != 0.0f ? nearest_iq4(x[i] * id) : 8;  // 8: the code nearest zero
    q[i] = static_cast<uint8_t>(c);
    const double e = static_cast<double>(d * static_cast<float>(kIQ4NLValues[c])) - x[i];
    err += e * e;
  }
  return err;
}

// Best float scale for x ~= s * kIQ4NLValues[q] over n values; `round` maps a scale to the value the
// decoder will see (f16 for IQ4_NL; identity for IQ4_XS sub-blocks, quantized again later).
template <typename Round>
float fit_iq4(const float* x, int n, Round round) {
  float ext = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(ext)) ext = x[i];
  if (ext == 0.0f || !std::isfinite(ext)) return 0.0f;
  float best = 0.0f;
  double best_err = std::numeric_limits<double>::infinity();
  uint8_t q[kIQ4XSSub];
  auto consider = [&](float s) {
    const float sr = round(s);
    const double err = iq4_codes(x, n, sr, q);
    if (err < best_err) {
      best_err = err;
      best = sr;
    }
  };
  // The extreme at -127 (the widest code) and a little inside it, or at the positive end, each refit
  // by least squares for its codes. 13 candidates: on loom-quant-error's matrices an earlier 34 gave
  // the same RMSE to three digits at 6x the time (loom quantize iq4_xs of a 4M-weight model: 17 s).
  consider(ext / -127.0f);
  for (float target : {-127.0f, -124.0f, -121.0f, -118.0f, -115.0f, -130.0f, -133.0f, 113.0f, 110.0f, 116.0f,
                       107.0f, 119.0f}) {
    const float s = ext / target;
    iq4_codes(x, n, s, q);
    double svx = 0, svv = 0;
    for (int i = 0; i < n; ++i) {
      const double v = kIQ4NLValues[q[i]];
      svx += v * x[i];
      svv += v * v;
    }
    if (svv > 0 && std::isfinite(svx / svv)) consider(static_cast<float>(svx / svv));
  }
  return best;
}

float f16_signed(float v) { return f16_to_f32(f32_to_f16(std::clamp(v, -kF16Max, kF16Max))); }

void pack_nibbles_32(const uint8_t* q, uint8_t* qs) {
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>(q[i] | (q[i + 16] << 4));
}

void quantize_block_iq4_xs(const float* x, BlockIQ4_XS& y) {
  constexpr int kSubs = kQK_K / kIQ4XSSub;
  float s[kSubs];
  float max_abs = 0.0f;
  for (int j = 0; j < kSubs; ++j) {
    s[j] = fit_iq4(x + j * kIQ4XSSub, kIQ4XSSub, [](float v) { return v; });
    max_abs = std::max(max_abs, std::fabs(s[j]));
  }
  auto codes = [&](float d, const int* ls, uint8_t* q) {
    double err = 0;
    for (int j = 0; j < kSubs; ++j)
      err += iq4_codes(x + j * kIQ4XSSub, kIQ4XSSub, d * static_cast<float>(ls[j]), q + j * kIQ4XSSub);
    return err;
  };
  float d = f16_field_up(max_abs / 31.0f);
  int ls[kSubs];
  for (int j = 0; j < kSubs; ++j) ls[j] = d > 0.0f ? round_clamp(s[j] / d, -32, 31) : 0;
  uint8_t q[kQK_K];
  double err = codes(d, ls, q);
  double saa = 0, sax = 0;  // refit d for the chosen integers
  for (int i = 0; i < kQK_K; ++i) {
    const double a = static_cast<double>(ls[i / kIQ4XSSub]) * kIQ4NLValues[q[i]];
    saa += a * a;
    sax += a * x[i];
  }
  if (saa > 0 && sax / saa > 0 && std::isfinite(sax / saa)) {
    const float d2 = quant_detail::f16_field(static_cast<float>(sax / saa));
    uint8_t q2[kQK_K];
    if (codes(d2, ls, q2) < err) {
      d = d2;
      std::memcpy(q, q2, sizeof(q));
    }
  }
  y.d = f32_to_f16(d);
  y.scales_h = 0;
  std::memset(y.scales_l, 0, sizeof(y.scales_l));
  for (int j = 0; j < kSubs; ++j) {
    const int u = ls[j] + 32;
    y.scales_l[j / 2] |= static_cast<uint8_t>((u & 0xF) << (4 * (j % 2)));
    y.scales_h |= static_cast<uint16_t>((u >> 4) << (2 * j));
    pack_nibbles_32(q + j * kIQ4XSSub, y.qs + 16 * j);
  }
}

// Index of the MXFP4 code nearest to v under scale d (2^(e-128)).
int nearest_mxfp4(float v) {
  const float a = std::fabs(v);
  int best = 0;
  for (int k = 1; k < 8; ++k)
    if (std::fabs(a - kMXFP4Values[k]) < std::fabs(a - kMXFP4Values[best])) best = k;
  return (v < 0.0f && best != 0) ? best + 8 : best;
}

double mxfp4_codes(const float* x, uint8_t e, uint8_t* q) {
  const float d = e8m0_to_f32_half(e);
  double err = 0;
  for (int i = 0; i < kQK32; ++i) {
    q[i] = static_cast<uint8_t>(nearest_mxfp4(x[i] / d));
    const double r = static_cast<double>(d * static_cast<float>(kMXFP4Values[q[i]])) - x[i];
    err += r * r;
  }
  return err;
}

}  // namespace

int iq4xs_scale(int j, const BlockIQ4_XS& b) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

void quantize_row_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, x += kQK32) {
    const float d = fit_iq4(x, kQK32, f16_signed);
    uint8_t q[kQK32];
    iq4_codes(x, kQK32, d, q);
    y[b].d = f32_to_f16(d);
    pack_nibbles_32(q, y[b].qs);
  }
}

void dequantize_row_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, y += kQK32) {
    const float d = f16_to_f32(x[b].d);
    for (int i = 0; i < kQK32 / 2; ++i) {
      y[i] = d * static_cast<float>(kIQ4NLValues[x[b].qs[i] & 0xF]);
      y[i + kQK32 / 2] = d * static_cast<float>(kIQ4NLValues[x[b].qs[i] >> 4]);
    }
  }
}

void quantize_row_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) quantize_block_iq4_xs(x + b * kQK_K, y[b]);
}

void dequantize_row_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQK_K / kIQ4XSSub; ++j) {
      const float dl = d * static_cast<float>(iq4xs_scale(j, x[b]) - 32);
      const uint8_t* qs = x[b].qs + 16 * j;
      for (int i = 0; i < 16; ++i) {
        y[32 * j + i] = dl * static_cast<float>(kIQ4NLValues[qs[i] & 0xF]);
        y[32 * j + i + 16] = dl * static_cast<float>(kIQ4NLValues[qs[i] >> 4]);
      }
    }
  }
}

// The block exponent puts the largest magnitude in [4, 8) times the half-scale (codes up to 12 when
// doubled), so the top codes are used; one step up is tried too for blocks the clipping hurts.
void quantize_row_mxfp4(const float* x, BlockMXFP4* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, x += kQK32) {
    float amax = 0.0f;
    for (int i = 0; i < kQK32; ++i) amax = std::max(amax, std::fabs(x[i]));
    uint8_t q[kQK32];
    if (!(amax > 0.0f) || !std::isfinite(amax)) {
      y[b].e = amax > 0.0f ? 254 : 0;
      std::memset(y[b].qs, 0, sizeof(y[b].qs));
      continue;
    }
    int ex;
    std::frexp(amax, &ex);  // amax = m * 2^ex, m in [0.5, 1): floor(log2(amax)) = ex - 1
    const int e0 = std::clamp(ex - 1 - 2 + 127, 0, 254);
    uint8_t best_e = static_cast<uint8_t>(e0);
    double best_err = std::numeric_limits<double>::infinity();
    for (int e = std::max(e0 - 1, 0); e <= std::min(e0 + 1, 254); ++e) {
      const double err = mxfp4_codes(x, static_cast<uint8_t>(e), q);
      if (err < best_err) {
        best_err = err;
        best_e = static_cast<uint8_t>(e);
      }
    }
    mxfp4_codes(x, best_e, q);
    y[b].e = best_e;
    pack_nibbles_32(q, y[b].qs);
  }
}

void dequantize_row_mxfp4(const BlockMXFP4* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, y += kQK32) {
    const float d = e8m0_to_f32_half(x[b].e);
    for (int i = 0; i < kQK32 / 2; ++i) {
      y[i] = d * static_cast<float>(kMXFP4Values[x[b].qs[i] & 0xF]);
      y[i + kQK32 / 2] = d * static_cast<float>(kMXFP4Values[x[b].qs[i] >> 4]);
    }
  }
}

}  // namespace loom
