// Quantization formats, f16/bf16 conversions, dot kernels and the CPU mul_mat / mul_mat_id.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "loom/quant.h"
#include "loom/cpu.h"
#include "loom/planner.h"

namespace loom {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ---- f16 / bf16 -------------------------------------------------------------------------------------

TEST(F16, ExactValuesAndSpecials) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.5f), 0xC100);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
  const f16_bits nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xFC01)));
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
}

TEST(F16, SubnormalsAndOverflow) {
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(f32_to_f16(-1023 * std::ldexp(1.0f, -24)), 0x83FF);
  // 2^-25 is halfway between 0 and the smallest subnormal: ties to even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  // 3 * 2^-25 is halfway between subnormals 1 and 2: ties to even (2)
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);
  // just above the half: rounds up
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  // the largest subnormal rounds up into the smallest normal when the carry spills
  EXPECT_EQ(f32_to_f16(1023.5f * std::ldexp(1.0f, -24)), 0x0400);
  // 65520 is halfway between 65504 and 65536 (= inf): ties to even -> inf
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
}

TEST(F16, RoundingTies) {
  const float ulp = std::ldexp(1.0f, -10);            // f16 spacing just above 1
  EXPECT_EQ(f32_to_f16(1.0f + ulp / 2), 0x3C00);      // tie, even stays down
  EXPECT_EQ(f32_to_f16(1.0f + 3 * ulp / 2), 0x3C02);  // tie, odd rounds up
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3C01);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 3 * ulp / 2, 0.0f)), 0x3C01);
  // a tie whose carry bumps the exponent: 2 - ulp/4 lies halfway between 0x3BFF and 2.0
  EXPECT_EQ(f32_to_f16(2.0f - std::ldexp(1.0f, -12)), 0x4000);
}

TEST(F16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<f16_bits>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << "f16 bits " << h;
  }
}

// The CPU backend's row conversion (F16C where the CPU has it) gives f16_to_f32's bits for every
// half, in groups of eight that mix specials (NaN payloads, infinities, subnormals) with normal
// values, and over every tail length.
TEST(F16, RowConversionEqualsTheScalarOneBitForBit) {
  std::vector<f16_bits> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<f16_bits>(i);
  std::vector<f16_bits> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  std::vector<cpu::F16RowFn> fns{cpu::f16_to_f32_row()};
  if (cpu::vec_dot_kernel_avx2(DType::f32))  // this CPU has AVX2+F16C: its kernel whatever LOOM_CPU_SIMD says
    fns.push_back(cpu::detail::f16_to_f32_row_avx2_unchecked());
  for (cpu::F16RowFn fn : fns)
  for (const auto* src : {&all, &shuffled}) {
    for (int64_t n : {int64_t{65536}, int64_t{65531}, int64_t{7}, int64_t{1}}) {
      std::vector<float> got(static_cast<size_t>(n), -1.0f);
      fn(src->data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = f16_to_f32((*src)[static_cast<size_t>(i)]);
        ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]), std::bit_cast<uint32_t>(want))
            << "half 0x" << std::hex << (*src)[static_cast<size_t>(i)] << " n " << std::dec << n;
      }
    }
  }
}

TEST(BF16, RoundingAndSpecials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);  // below the tie
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16
  // a NaN whose payload sits only in the low 16 bits must stay NaN, not become inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xFFC00000u)))));
  // subnormals: the smallest f32 subnormal rounds to zero, a bf16-representable one is exact
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000u)), 0x0001);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<bf16_bits>(h));
    EXPECT_EQ(bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h) << h;
    }
  }
}

// ---- hand-built blocks ------------------------------------------------------------------------------

TEST(Q4K, ScaleMinPacking) {
  const uint8_t sc[8] = {1, 17, 33, 63, 5, 40, 22, 60};
  const uint8_t mn[8] = {0, 63, 12, 31, 48, 7, 19, 2};
  // bytes 0-3: sc[0..3] | high bits of sc[4..7]; 4-7: mn[0..3] | high bits of mn[4..7];
  // 8-11: low nibbles of sc[4..7] | low nibbles of mn[4..7] << 4
  uint8_t expect[12];
  for (int j = 0; j < 4; ++j) {
    expect[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    expect[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    expect[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  uint8_t packed[12] = {};
  for (int j = 0; j < 8; ++j) q4k_set_scale_min(j, packed, sc[j], mn[j]);
  EXPECT_EQ(0, std::memcmp(packed, expect, 12));
  // setting in reverse order must not disturb already-set neighbours
  uint8_t packed_rev[12];
  std::memset(packed_rev, 0xFF, 12);
  for (int j = 7; j >= 0; --j) q4k_set_scale_min(j, packed_rev, sc[j], mn[j]);
  EXPECT_EQ(0, std::memcmp(packed_rev, expect, 12));
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    q4k_get_scale_min(j, expect, &s, &m);
    EXPECT_EQ(s, sc[j]) << j;
    EXPECT_EQ(m, mn[j]) << j;
  }
}

TEST(Q4K, DequantizeHandBuiltBlock) {
  const uint8_t sc[8] = {1, 17, 33, 63, 5, 40, 22, 60};
  const uint8_t mn[8] = {0, 63, 12, 31, 48, 7, 19, 2};
  BlockQ4_K blk{};
  blk.d = 0x3800;     // 0.5
  blk.dmin = 0x3400;  // 0.25
  for (int j = 0; j < 4; ++j) {
    blk.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    blk.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    blk.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  int code[256];
  for (int i = 0; i < 256; ++i) code[i] = (i * 7 + i / 32) % 16;
  // byte 32p+l: low nibble = element 64p+l, high nibble = element 64p+32+l
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      blk.qs[32 * p + l] = static_cast<uint8_t>(code[64 * p + l] | (code[64 * p + 32 + l] << 4));
  float out[256];
  dequantize_row_q4_k(&blk, out, 256);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    const float expect = 0.5f * sc[j] * code[i] - 0.25f * mn[j];  // exact in float
    ASSERT_EQ(out[i], expect) << "element " << i;
  }
}

TEST(Q6K, DequantizeHandBuiltBlock) {
  BlockQ6_K blk{};
  blk.d = 0x3000;  // 0.125
  const int8_t sc[16] = {1, -3, 127, -128, 64, 5, -77, 9, 33, -1, 100, 12, -45, 2, 7, -9};
  std::memcpy(blk.scales, sc, 16);
  int code[256];  // stored codes 0..63
  for (int i = 0; i < 256; ++i) code[i] = (i * 13 + 5) % 64;
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int e = 128 * h + l;
      const int c0 = code[e], c1 = code[e + 32], c2 = code[e + 64], c3 = code[e + 96];
      blk.ql[64 * h + l] = static_cast<uint8_t>((c0 & 0xF) | ((c2 & 0xF) << 4));
      blk.ql[64 * h + l + 32] = static_cast<uint8_t>((c1 & 0xF) | ((c3 & 0xF) << 4));
      blk.qh[32 * h + l] =
          static_cast<uint8_t>((c0 >> 4) | ((c1 >> 4) << 2) | ((c2 >> 4) << 4) | ((c3 >> 4) << 6));
    }
  float out[256];
  dequantize_row_q6_k(&blk, out, 256);
  for (int i = 0; i < 256; ++i) {
    const float expect = 0.125f * sc[i / 16] * (code[i] - 32);  // exact in float
    ASSERT_EQ(out[i], expect) << "element " << i;
  }
}

TEST(Q4_0, DequantizeHandBuiltBlock) {
  BlockQ4_0 blk{};
  blk.d = 0xB800;  // -0.5
  for (int i = 0; i < 16; ++i) blk.qs[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  float out[32];
  dequantize_row_q4_0(&blk, out, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[i], -0.5f * (i - 8));
    EXPECT_EQ(out[i + 16], -0.5f * (7 - i));
  }
}

// ---- quantizer quality and robustness -------------------------------------------------------------

struct QuantError {
  double max_abs = 0;
  double rmse = 0;
};

QuantError round_trip(DType t, const std::vector<float>& x, std::vector<float>& y) {
  std::vector<uint8_t> q(dtype_row_size(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  y.assign(x.size(), 0.0f);
  dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  QuantError e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::fabs(static_cast<double>(y[i]) - x[i]);
    e.max_abs = std::max(e.max_abs, d);
    e.rmse += d * d;
  }
  e.rmse = std::sqrt(e.rmse / static_cast<double>(x.size()));
  return e;
}

// A smooth pattern with a different offset and amplitude per 32 elements, so both the K-quant
// sub-block mins and the sub-scales are exercised.
std::vector<float> pattern(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(i / 32);
    x[i] = static_cast<float>((1.0 + 0.5 * std::sin(g)) * std::sin(0.37 * i) + 0.4 * std::cos(0.9 * g));
  }
  return x;
}

// Error bound per element: half a quantization step of the element's group, plus slack for the
// 6/8-bit sub-scales and f16 super-scales (a code can land one step off near the clamped ends).
TEST(Quantize, K_QuantsStayWithinStepBounds) {
  const std::vector<float> x = pattern(1024);
  std::vector<float> y;
  round_trip(DType::q4_k, x, y);
  double err2 = 0, step2 = 0;
  for (size_t s = 0; s < x.size() / 32; ++s) {
    float lo = 0.0f, hi = x[32 * s];
    for (int i = 0; i < 32; ++i) {
      lo = std::min(lo, x[32 * s + i]);
      hi = std::max(hi, x[32 * s + i]);
    }
    const double step = (hi - lo) / 15.0;
    for (int i = 0; i < 32; ++i) {
      const double e = std::fabs(y[32 * s + i] - x[32 * s + i]);
      EXPECT_LE(e, 0.75 * step) << "q4_K element " << 32 * s + i;
      err2 += e * e;
    }
    step2 += step * step * 32;
  }
  // uniform rounding error has RMS step/sqrt(12) = 0.29 step; the fit must be at least that good
  EXPECT_LE(std::sqrt(err2 / step2), 0.30);

  round_trip(DType::q6_k, x, y);
  err2 = step2 = 0;
  for (size_t s = 0; s < x.size() / 16; ++s) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * s + i]));
    const double step = amax / 31.5;
    for (int i = 0; i < 16; ++i) {
      const double e = std::fabs(y[16 * s + i] - x[16 * s + i]);
      EXPECT_LE(e, 0.75 * step) << "q6_K element " << 16 * s + i;
      err2 += e * e;
    }
    step2 += step * step * 16;
  }
  EXPECT_LE(std::sqrt(err2 / step2), 0.30);
}

TEST(Quantize, RelativeErrorOnGaussianData) {
  const std::vector<float> x = random_floats(8192, 42);
  double rms = 0;
  for (float v : x) rms += static_cast<double>(v) * v;
  rms = std::sqrt(rms / static_cast<double>(x.size()));
  std::vector<float> y;
  // bounds: a few percent above what these quantizers reach (q4_K 0.071, q6_K 0.016, q2_K 0.268,
  // q3_K 0.147, q5_K 0.035, iq4_xs 0.074, mxfp4 0.112, ...)
  struct Case {
    DType t;
    double max_rel_rmse;
  } cases[] = {{DType::f16, 3e-4},  {DType::bf16, 2.5e-3}, {DType::q8_0, 6e-3},
               {DType::q4_0, 0.11}, {DType::q4_k, 0.080},  {DType::q6_k, 0.020},
               {DType::q4_1, 0.073}, {DType::q5_0, 0.045}, {DType::q5_1, 0.035}, {DType::q2_k, 0.28},
               {DType::q3_k, 0.155}, {DType::q5_k, 0.037}, {DType::iq4_nl, 0.077}, {DType::iq4_xs, 0.078},
               {DType::mxfp4, 0.118}};
  for (const Case& c : cases) {
    const QuantError e = round_trip(c.t, x, y);
    EXPECT_LE(e.rmse / rms, c.max_rel_rmse) << dtype_name(c.t);
    EXPECT_GT(e.rmse, 0.0) << dtype_name(c.t);  // guards against comparing a buffer with itself
  }
}

TEST(Quantize, KQuantsAreRobust) {
  for (DType t : {DType::q4_k, DType::q6_k, DType::q2_k, DType::q3_k, DType::q5_k, DType::iq4_xs}) {
    std::vector<float> y;
    // all zero: exact zeros
    std::vector<float> zero(512, 0.0f);
    EXPECT_EQ(round_trip(t, zero, y).max_abs, 0.0) << dtype_name(t);
    // constant blocks, positive and negative
    for (float c : {3.25f, -0.7f, 40.0f}) {
      std::vector<float> x(256, c);
      EXPECT_LE(round_trip(t, x, y).max_abs, 1e-3 * std::fabs(c)) << dtype_name(t) << " constant " << c;
    }
    {  // here d is an f16 subnormal with coarse steps, so the product d*sc is coarser too (and
       // iq4_xs has no code that makes a constant exact: its product of three factors is coarser still)
      std::vector<float> x(256, 1e-3f);
      EXPECT_LE(round_trip(t, x, y).max_abs, (t == DType::iq4_xs ? 2e-2 : 5e-3) * 1e-3) << dtype_name(t);
    }
    // huge, tiny and mixed magnitudes: always finite
    for (float scale : {1e30f, 1e8f, 1e-8f, 1e-30f}) {
      std::vector<float> x = random_floats(512, 7, scale);
      round_trip(t, x, y);
      for (float v : y) ASSERT_TRUE(std::isfinite(v)) << dtype_name(t) << " scale " << scale;
    }
    std::vector<float> mixed = random_floats(256, 9, 1e-3f);
    mixed[17] = 5e4f;
    mixed[200] = -3e4f;
    const QuantError e = round_trip(t, mixed, y);
    for (float v : y) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LE(e.max_abs, 5e4 / 8) << dtype_name(t);  // within a coarse step of the extreme's range
    EXPECT_NEAR(y[17], 5e4f, 5e4 * 0.05) << dtype_name(t);
    // values beyond the f16 range of the super-block scale still decode to finite numbers
    std::vector<float> x(256, 0.0f);
    x[3] = 3e38f;
    x[4] = -3e38f;
    round_trip(t, x, y);
    for (float v : y) ASSERT_TRUE(std::isfinite(v)) << dtype_name(t);
  }
}

// ---- dot kernels ----------------------------------------------------------------------------------

using cpu::ActType;
using cpu::VecDotKernel;

constexpr DType kWeightTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0,   DType::q4_0,
                                  DType::q4_k, DType::q6_k, DType::q4_1, DType::q5_0,   DType::q5_1,
                                  DType::q2_k, DType::q3_k, DType::q5_k, DType::iq4_nl, DType::iq4_xs,
                                  DType::mxfp4};

// Dequantized activation row as the kernel sees it.
std::vector<float> act_values(ActType t, const void* row, int64_t n) {
  std::vector<float> v(n);
  switch (t) {
    case ActType::f32:
      std::memcpy(v.data(), row, n * sizeof(float));
      break;
    case ActType::f16:
      dequantize_row(DType::f16, row, v.data(), n);
      break;
    case ActType::q8_0:
      dequantize_row(DType::q8_0, row, v.data(), n);
      break;
    case ActType::q8_k:
      dequantize_row_q8_k(static_cast<const BlockQ8_K*>(row), v.data(), n);
      break;
  }
  return v;
}

struct DotCase {
  std::vector<uint8_t> w;
  std::vector<float> w_values;
  std::vector<std::vector<uint8_t>> x;  // kDotMaxCols converted rows
  std::vector<std::vector<float>> x_values;
};

DotCase make_dot_case(DType t, const VecDotKernel& k, int64_t n, uint32_t seed) {
  DotCase dc;
  const std::vector<float> wf = random_floats(n, seed);
  dc.w.resize(dtype_row_size(t, n));
  quantize_row(t, wf.data(), dc.w.data(), n);
  dc.w_values.resize(n);
  dequantize_row(t, dc.w.data(), dc.w_values.data(), n);
  for (int c = 0; c < cpu::kDotMaxCols; ++c) {
    const std::vector<float> xf = random_floats(n, seed * 31 + c + 1, 0.5f + c);
    dc.x.emplace_back(cpu::act_row_size(k.act_type, n));
    k.from_float(xf.data(), dc.x.back().data(), n);
    dc.x_values.push_back(act_values(k.act_type, dc.x.back().data(), n));
  }
  return dc;
}

std::vector<int64_t> lengths_for(DType t) {
  if (dtype_is_quantized(t)) return {256, 512, 768, 4096};
  return {1, 7, 33, 100, 256, 1000, 4096};
}

// Each kernel against a double-precision dot of exactly the values it multiplies: only float
// accumulation error is allowed.
void check_kernel_against_double(const VecDotKernel& k, DType t, const char* which) {
  for (int64_t n : lengths_for(t)) {
    const DotCase dc = make_dot_case(t, k, n, static_cast<uint32_t>(n) + 3);
    for (int nc = 1; nc <= cpu::kDotMaxCols; ++nc) {
      const void* xs[cpu::kDotMaxCols];
      for (int c = 0; c < nc; ++c) xs[c] = dc.x[c].data();
      float out[cpu::kDotMaxCols];
      k.dot(n, dc.w.data(), xs, nc, out);
      for (int c = 0; c < nc; ++c) {
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          ref += static_cast<double>(dc.w_values[i]) * dc.x_values[c][i];
          mag += std::fabs(static_cast<double>(dc.w_values[i]) * dc.x_values[c][i]);
        }
        EXPECT_NEAR(out[c], ref, 2e-6 * mag + 1e-30)
            << which << " " << dtype_name(t) << " n=" << n << " nc=" << nc << " col " << c;
      }
    }
  }
}

TEST(VecDot, ScalarKernelsMatchDouble) {
  for (DType t : kWeightTypes) {
    const VecDotKernel* k = cpu::vec_dot_kernel_scalar(t);
    ASSERT_NE(k, nullptr) << dtype_name(t);
    check_kernel_against_double(*k, t, "scalar");
  }
  EXPECT_EQ(cpu::vec_dot_kernel_scalar(DType::i32), nullptr);
}

TEST(VecDot, DispatchedKernelsMatchDouble) {
  for (DType t : kWeightTypes) {
    const VecDotKernel* k = cpu::vec_dot_kernel(t);
    ASSERT_NE(k, nullptr) << dtype_name(t);
    check_kernel_against_double(*k, t, cpu::vec_dot_isa());
  }
}

void check_simd_against_scalar(const VecDotKernel& simd, const VecDotKernel& ref, DType t) {
  ASSERT_EQ(simd.act_type, ref.act_type);
  check_kernel_against_double(simd, t, "avx2");
  for (int64_t n : lengths_for(t)) {
    // activation conversion: the same arithmetic, so identical bytes
    const std::vector<float> xf = random_floats(n, static_cast<uint32_t>(n) * 5 + 1, 2.0f);
    std::vector<uint8_t> a(cpu::act_row_size(ref.act_type, n)), b(a.size());
    ref.from_float(xf.data(), a.data(), n);
    simd.from_float(xf.data(), b.data(), n);
    EXPECT_EQ(a, b) << dtype_name(t) << " from_float n=" << n;
    // dots on the same converted rows
    const DotCase dc = make_dot_case(t, ref, n, static_cast<uint32_t>(n) * 11 + 2);
    const void* xs[cpu::kDotMaxCols];
    for (int c = 0; c < cpu::kDotMaxCols; ++c) xs[c] = dc.x[c].data();
    float o_ref[cpu::kDotMaxCols], o_simd[cpu::kDotMaxCols];
    ref.dot(n, dc.w.data(), xs, cpu::kDotMaxCols, o_ref);
    simd.dot(n, dc.w.data(), xs, cpu::kDotMaxCols, o_simd);
    for (int c = 0; c < cpu::kDotMaxCols; ++c) {
      double mag = 0;
      for (int64_t i = 0; i < n; ++i)
        mag += std::fabs(static_cast<double>(dc.w_values[i]) * dc.x_values[c][i]);
      EXPECT_NEAR(o_simd[c], o_ref[c], 4e-6 * mag) << dtype_name(t) << " n=" << n << " col " << c;
      // one column at a time gives the same result as the batched call
      const float single = cpu::vec_dot(simd, n, dc.w.data(), xs[c]);
      EXPECT_NEAR(single, o_simd[c], 4e-6 * mag);
    }
  }
}

TEST(VecDot, Avx2AgreesWithScalar) {
  if (!cpu::vec_dot_kernel_avx2(DType::f32)) GTEST_SKIP() << "this CPU has no AVX2+FMA+F16C";
  for (DType t : kWeightTypes) {
    SCOPED_TRACE(dtype_name(t));
    const VecDotKernel* simd = cpu::vec_dot_kernel_avx2(t);
    if (!simd) {  // only the scalar kernel: the dispatcher must fall back to it
      EXPECT_EQ(cpu::vec_dot_kernel(t), cpu::vec_dot_kernel_scalar(t));
      continue;
    }
    check_simd_against_scalar(*simd, *cpu::vec_dot_kernel_scalar(t), t);
  }
  SCOPED_TRACE("f16.f16");
  ASSERT_NE(&cpu::vec_dot_f16_f16(true), &cpu::vec_dot_f16_f16(false));
  check_simd_against_scalar(cpu::vec_dot_f16_f16(true), cpu::vec_dot_f16_f16(false), DType::f16);
}

TEST(VecDot, F16TimesF16) {
  const VecDotKernel& k = cpu::vec_dot_f16_f16(false);
  EXPECT_EQ(k.act_type, ActType::f16);
  check_kernel_against_double(k, DType::f16, "scalar f16.f16");
}

// ---- mul_mat / mul_mat_id through a graph ---------------------------------------------------------

// Bound on |computed - exact| for a dot of weights `a` with f32 activations `x`: the activations'
// conversion error (f16 rounding, or q8 rounding with its block scale) times |a|, plus float
// accumulation error.
double dot_error_bound(ActType t, const double* a, const float* x, int64_t k) {
  double bound = 1e-6, mag = 0;
  for (int64_t i = 0; i < k; ++i) mag += std::fabs(a[i] * x[i]);
  bound += 1e-5 * mag;
  const int64_t bs = cpu::act_block_size(t);
  for (int64_t b0 = 0; b0 < k; b0 += bs) {
    double amax = 0;
    for (int64_t i = b0; i < b0 + bs; ++i) amax = std::max(amax, static_cast<double>(std::fabs(x[i])));
    for (int64_t i = b0; i < b0 + bs; ++i) {
      double ex = 0;
      switch (t) {
        case ActType::f32:
          break;
        case ActType::f16:
          ex = std::fabs(x[i]) * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
          break;
        case ActType::q8_0:
          ex = 0.57 * amax / 127;
          break;  // half a step + the f16 rounding of the scale
        case ActType::q8_k:
          ex = 0.51 * amax / 127;
          break;
      }
      bound += std::fabs(a[i]) * ex;
    }
  }
  return bound;
}

enum class BLayout { contiguous, transposed, permuted };

struct MulMatCase {
  DType type;
  int64_t k, m, n;
  int64_t a2, a3, b2, b3;
  BLayout layout;
  int threads;
};

void check_mul_mat(const MulMatCase& c) {
  SCOPED_TRACE(testing::Message() << dtype_name(c.type) << " k=" << c.k << " m=" << c.m << " n=" << c.n
                                  << " layout=" << static_cast<int>(c.layout) << " threads=" << c.threads);
  Graph g;
  Tensor* a = g.weight(c.type, {c.k, c.m, c.a2, c.a3}, "a");
  Tensor* b_src = nullptr;
  Tensor* b = nullptr;
  switch (c.layout) {
    case BLayout::contiguous:
      b = b_src = g.input(DType::f32, {c.k, c.n, c.b2, c.b3}, "b");
      break;
    case BLayout::transposed:
      b_src = g.input(DType::f32, {c.n, c.k, c.b2, c.b3}, "bt");
      b = transpose(g, b_src);
      break;
    case BLayout::permuted:
      b_src = g.input(DType::f32, {c.k, c.b2, c.n, c.b3}, "bp");
      b = permute(g, b_src, 0, 2, 1, 3);
      break;
  }
  Tensor* y = mul_mat(g, a, b);
  g.mark_output(y);
  ASSERT_TRUE(g.status().ok()) << g.status().to_string();
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();

  const std::vector<float> af = random_floats(static_cast<size_t>(a->nelements()), 101);
  const std::vector<float> bf = random_floats(static_cast<size_t>(b_src->nelements()), 202, 1.5f);
  ASSERT_TRUE(tensor_from_floats(a, af.data(), a->nelements()).ok());
  ASSERT_TRUE(tensor_from_floats(b_src, bf.data(), b_src->nelements()).ok());
  auto a_deq = tensor_to_floats(a);  // the weights as stored
  ASSERT_TRUE(a_deq.ok());
  auto bval = [&](int64_t kk, int64_t j, int64_t i2, int64_t i3) {
    switch (c.layout) {
      case BLayout::contiguous:
        return bf[kk + c.k * (j + c.n * (i2 + c.b2 * i3))];
      case BLayout::transposed:
        return bf[j + c.n * (kk + c.k * (i2 + c.b2 * i3))];
      case BLayout::permuted:
        return bf[kk + c.k * (i2 + c.b2 * (j + c.n * i3))];
    }
    return 0.0f;
  };

  auto backend = make_cpu_backend(c.threads);
  const Status st = backend->compute(g);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto out = tensor_to_floats(y);
  ASSERT_TRUE(out.ok());
  const ActType act = cpu::vec_dot_kernel(c.type)->act_type;
  std::vector<double> arow(c.k);
  std::vector<float> xrow(c.k);
  for (int64_t i3 = 0; i3 < c.b3; ++i3)
    for (int64_t i2 = 0; i2 < c.b2; ++i2)
      for (int64_t j = 0; j < c.n; ++j) {
        for (int64_t kk = 0; kk < c.k; ++kk) xrow[kk] = bval(kk, j, i2, i3);
        for (int64_t i = 0; i < c.m; ++i) {
          // broadcast: b batch i2 uses a batch i2 / (b2 / a2)
          const int64_t ia2 = i2 / (c.b2 / c.a2), ia3 = i3 / (c.b3 / c.a3);
          const float* ar = a_deq->data() + c.k * (i + c.m * (ia2 + c.a2 * ia3));
          double ref = 0;
          for (int64_t kk = 0; kk < c.k; ++kk) {
            arow[kk] = ar[kk];
            ref += arow[kk] * xrow[kk];
          }
          const float got = (*out)[i + c.m * (j + c.n * (i2 + c.b2 * i3))];
          ASSERT_NEAR(got, ref, dot_error_bound(act, arow.data(), xrow.data(), c.k))
              << "at i=" << i << " j=" << j << " i2=" << i2 << " i3=" << i3;
        }
      }
}

TEST(MulMat, EveryWeightTypeMatchesDoubleReference) {
  for (DType t : kWeightTypes)
    for (int64_t n : {1, 7, 40}) check_mul_mat({t, 512, 37, n, 2, 1, 4, 2, BLayout::contiguous, 3});
}

TEST(MulMat, NonContiguousActivations) {
  for (DType t : {DType::f32, DType::f16, DType::q4_0, DType::q4_k})
    for (BLayout l : {BLayout::transposed, BLayout::permuted})
      check_mul_mat({t, 256, 19, 9, 1, 1, 3, 1, l, 2});
}

TEST(MulMat, OddShapesAndThreadCounts) {
  check_mul_mat({DType::f32, 45, 5, 3, 1, 1, 1, 1, BLayout::contiguous, 4});  // more threads than rows
  check_mul_mat({DType::f16, 77, 130, 2, 1, 1, 1, 1, BLayout::contiguous, 1});
  check_mul_mat({DType::bf16, 33, 3, 70, 1, 2, 2, 4, BLayout::permuted, 2});
  check_mul_mat({DType::q6_k, 256, 1, 1, 1, 1, 1, 1, BLayout::contiguous, 2});
  check_mul_mat({DType::q8_0, 4096, 64, 33, 1, 1, 1, 1, BLayout::contiguous, 2});
}

void check_mul_mat_id(DType type, int64_t b1_is_one, int threads) {
  SCOPED_TRACE(testing::Message() << dtype_name(type) << " b1_is_one=" << b1_is_one);
  const int64_t k = 256, m = 21, n_expert = 5, n_used = 3, n_tokens = 6;
  const int64_t b1 = b1_is_one ? 1 : n_used;
  Graph g;
  Tensor* as = g.weight(type, {k, m, n_expert, 1}, "experts");
  Tensor* b = g.input(DType::f32, {k, b1, n_tokens, 1}, "b");
  Tensor* ids = g.input(DType::i32, {n_used, n_tokens, 1, 1}, "ids");
  Tensor* y = mul_mat_id(g, as, b, ids);
  g.mark_output(y);
  ASSERT_TRUE(g.status().ok()) << g.status().to_string();
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
  const std::vector<float> af = random_floats(static_cast<size_t>(as->nelements()), 303);
  const std::vector<float> bf = random_floats(static_cast<size_t>(b->nelements()), 404);
  // expert 2 is used by most tokens, expert 3 by none; two entries are out of range
  const std::vector<float> idf = {2, 0, 4, 2, 1, 0, 4, 2, 9, 2, 0, 1, 2, -1, 4, 1, 2, 0};
  ASSERT_TRUE(tensor_from_floats(as, af.data(), as->nelements()).ok());
  ASSERT_TRUE(tensor_from_floats(b, bf.data(), b->nelements()).ok());
  ASSERT_TRUE(tensor_from_floats(ids, idf.data(), ids->nelements()).ok());
  auto a_deq = tensor_to_floats(as);
  ASSERT_TRUE(a_deq.ok());
  auto backend = make_cpu_backend(threads);
  const Status st = backend->compute(g);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto out = tensor_to_floats(y);
  ASSERT_TRUE(out.ok());
  const ActType act = cpu::vec_dot_kernel(type)->act_type;
  std::vector<double> arow(k);
  int n_nan_columns = 0;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t e = 0; e < n_used; ++e) {
      const int id = static_cast<int>(idf[e + n_used * t]);
      const float* x = bf.data() + k * ((b1 == 1 ? 0 : e) + b1 * t);
      const float* o = out->data() + m * (e + n_used * t);
      if (id < 0 || id >= n_expert) {
        for (int64_t i = 0; i < m; ++i) ASSERT_TRUE(std::isnan(o[i])) << "slot " << e << " token " << t;
        ++n_nan_columns;
        continue;
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* ar = a_deq->data() + k * (i + m * id);
        double ref = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          arow[kk] = ar[kk];
          ref += arow[kk] * x[kk];
        }
        ASSERT_NEAR(o[i], ref, dot_error_bound(act, arow.data(), x, k)) << "slot " << e << " token " << t;
      }
    }
  EXPECT_EQ(n_nan_columns, 2);
}

TEST(MulMatId, RoutesEachColumnToItsExpert) {
  for (DType t : kWeightTypes) {
    check_mul_mat_id(t, false, 3);
    check_mul_mat_id(t, true, 2);
  }
}

}  // namespace
}  // namespace loom
