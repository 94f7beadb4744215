// Reference quantization for the 32-element block formats and the Q8_K activation format.
#include <algorithm>
#include <cmath>

#include "loom/quant.h"

namespace loom {

namespace {
constexpr float kMaxF16 = 65504.0f;  // largest finite half: block scales are stored as f16
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
