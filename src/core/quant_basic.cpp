// Reference quantization for the 32-element block formats with uniform steps (Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1) and the Q8_K activation format. Decoders compute exactly what gguf-py's reference
// decoder computes (a float product, then a float sum for the offset formats), so they reproduce its
// output bit for bit (tests/unit/test_quant_vectors.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/quant.h"

namespace loom {

namespace {
constexpr float kMaxF16 = 65504.0f;  // largest finite half: block scales are stored as f16

// ---- symmetric (Q4_0, Q5_0) and offset (Q4_1, Q5_1) block fits ------------------------------------

// Codes for x ~= d*q + m with q in [0, nmax] against the decoded d and m; returns the squared error.
double offset_codes(const float* x, float d, float m, int nmax, uint8_t* q) {
  double err = 0;
  for (int i = 0; i < kQK32; ++i) {
    int c = 0;
    if (d > 0.0f) {
      const float v = (x[i] - m) / d;
      c = v > 0.0f ? static_cast<int>(std::lrint(std::min(v, static_cast<float>(nmax)))) : 0;
    }
    q[i] = static_cast<uint8_t>(c);
    const double e = static_cast<double>(d) * c + m - x[i];
    err += e * e;
  }
  return err;
}

// Offset formats: the min/max mapping, then steps stretched or shrunk around it (shrinking clips the
// extremes, which pays off when most values crowd the middle), each refit by least squares for its
// codes and judged with d and m rounded to f16 as the decoder sees them.
void fit_offset_block(const float* x, int nmax, f16_bits& d_out, f16_bits& m_out, uint8_t* q) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < kQK32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  auto f16_of = [](double v) { return f32_to_f16(static_cast<float>(std::clamp<double>(v, -kMaxF16, kMaxF16))); };
  double best_err = std::numeric_limits<double>::infinity();
  uint8_t cand[kQK32];
  auto try_fit = [&](double scale, double offset) {
    const f16_bits dh = f16_of(scale), mh = f16_of(offset);
    const double err = offset_codes(x, f16_to_f32(dh), f16_to_f32(mh), nmax, cand);
    if (err < best_err) {
      best_err = err;
      d_out = dh;
      m_out = mh;
      std::copy(cand, cand + kQK32, q);
    }
  };
  const double range = static_cast<double>(hi) - lo;
  try_fit(range / nmax, lo);
  if (!(range > 0)) return;
  for (int k = -4; k <= 4; ++k) {
    const double inv_step = (nmax + 0.25 * k) / range;
    int c[kQK32];
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < kQK32; ++i) {
      c[i] = std::clamp(static_cast<int>(std::lrint((x[i] - lo) * inv_step)), 0, nmax);
      sq += c[i];
      sqq += static_cast<double>(c[i]) * c[i];
      sx += x[i];
      sqx += static_cast<double>(c[i]) * x[i];
    }
    const double det = kQK32 * sqq - sq * sq;
    if (!(det > 0)) continue;
    const double scale = (kQK32 * sqx - sq * sx) / det;
    const double offset = (sqq * sx - sq * sqx) / det;
    if (scale > 0 && std::isfinite(scale) && std::isfinite(offset)) try_fit(scale, offset);
  }
}

// Symmetric formats: the value of largest magnitude maps to the extreme code -2^(bits-1), so its
// sign picks the sign of the scale and the full range is used.
float symmetric_scale(const float* x, int half_range) {
  float extreme = 0.0f;
  for (int i = 0; i < kQK32; ++i)
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  return std::clamp(extreme / static_cast<float>(-half_range), -kMaxF16, kMaxF16);
}

// Packs 32 codes as Q4_0's nibbles (element j low, j+16 high), the 5th bits into qh.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int i = 0; i < kQK32 / 2; ++i) qs[i] = static_cast<uint8_t>((q[i] & 0xF) | ((q[i + kQK32 / 2] & 0xF) << 4));
}
void pack_high_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t h = 0;
  for (int i = 0; i < kQK32; ++i) h |= static_cast<uint32_t>((q[i] >> 4) & 1) << i;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(h >> (8 * k));
}
// The 5-bit codes of a Q5_0 / Q5_1 block.
void unpack_q5(const uint8_t* qs, const uint8_t* qh, int* q) {
  const uint32_t h = qh[0] | (qh[1] << 8) | (qh[2] << 16) | (static_cast<uint32_t>(qh[3]) << 24);
  for (int i = 0; i < kQK32 / 2; ++i) {
    q[i] = (qs[i] & 0xF) | (((h >> i) & 1) << 4);
    q[i + kQK32 / 2] = (qs[i] >> 4) | (((h >> (i + kQK32 / 2)) & 1) << 4);
  }
}
}  // namespace

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    float amax = 0.0f;
    for (int i = 0; i < kQK8_0; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = std::min(amax / 127.0f, kMaxF16);  // beyond f16's range values saturate
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int i = 0; i < kQK8_0; ++i)
      y[b].qs[i] = static_cast<int8_t>(std::clamp<long>(std::lrint(x[i] * id), -127, 127));
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int i = 0; i < kQK8_0; ++i) y[b * kQK8_0 + i] = x[b].qs[i] * d;
  }
}

// Q4_0 maps the value of largest magnitude to -8 (the extreme code), so its sign picks the sign
// of the scale and the full range [-8, 7] is used.
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK4_0; ++b, x += kQK4_0) {
    float extreme = 0.0f;
    for (int i = 0; i < kQK4_0; ++i)
      if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
    const float d = std::clamp(extreme / -8.0f, -kMaxF16, kMaxF16);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int i = 0; i < kQK4_0 / 2; ++i) {
      const int lo = std::clamp(static_cast<int>(std::lrint(x[i] * id)) + 8, 0, 15);
      const int hi = std::clamp(static_cast<int>(std::lrint(x[i + kQK4_0 / 2] * id)) + 8, 0, 15);
      y[b].qs[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int i = 0; i < kQK4_0 / 2; ++i) {
      y[b * kQK4_0 + i] = ((x[b].qs[i] & 0x0f) - 8) * d;
      y[b * kQK4_0 + i + kQK4_0 / 2] = ((x[b].qs[i] >> 4) - 8) * d;
    }
  }
}

void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, x += kQK32) {
    uint8_t q[kQK32];
    fit_offset_block(x, 15, y[b].d, y[b].m, q);
    pack_nibbles(q, y[b].qs);
  }
}

void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, y += kQK32) {
    const float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);
    for (int i = 0; i < kQK32 / 2; ++i) {
      y[i] = d * static_cast<float>(x[b].qs[i] & 0xF) + m;
      y[i + kQK32 / 2] = d * static_cast<float>(x[b].qs[i] >> 4) + m;
    }
  }
}

void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, x += kQK32) {
    const float d = symmetric_scale(x, 16);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[kQK32];
    for (int i = 0; i < kQK32; ++i) q[i] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::lrint(x[i] * id)) + 16, 0, 31));
    y[b].d = f32_to_f16(d);
    pack_nibbles(q, y[b].qs);
    pack_high_bits(q, y[b].qh);
  }
}

void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, y += kQK32) {
    const float d = f16_to_f32(x[b].d);
    int q[kQK32];
    unpack_q5(x[b].qs, x[b].qh, q);
    for (int i = 0; i < kQK32; ++i) y[i] = d * static_cast<float>(q[i] - 16);
  }
}

void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, x += kQK32) {
    uint8_t q[kQK32];
    fit_offset_block(x, 31, y[b].d, y[b].m, q);
    pack_nibbles(q, y[b].qs);
    pack_high_bits(q, y[b].qh);
  }
}

void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK32; ++b, y += kQK32) {
    const float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);
    int q[kQK32];
    unpack_q5(x[b].qs, x[b].qh, q);
    for (int i = 0; i < kQK32; ++i) y[i] = d * static_cast<float>(q[i]) + m;
  }
}

void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float amax = 0.0f;
    for (int i = 0; i < kQK_K; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    y[b].d = d;
    for (int i = 0; i < kQK_K; ++i) y[b].qs[i] = static_cast<int8_t>(std::clamp<long>(std::lrint(x[i] * id), -127, 127));
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[j * 16 + i];
      y[b].bsums[j] = static_cast<int16_t>(sum);
    }
  }
}

void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b)
    for (int i = 0; i < kQK_K; ++i) y[b * kQK_K + i] = x[b].qs[i] * x[b].d;
}

}  // namespace loom
