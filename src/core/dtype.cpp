#include "loom/dtype.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>

#include "loom/quant.h"

namespace loom {

namespace {
constexpr std::array<DTypeTraits, kDTypeCount> kTraits = {{
    {"f32", 1, 4, false, 0},
    {"f16", 1, 2, false, 1},
    {"bf16", 1, 2, false, 30},
    {"i32", 1, 4, false, 26},
    {"q8_0", kQK8_0, sizeof(BlockQ8_0), true, 8},
    {"q4_0", kQK4_0, sizeof(BlockQ4_0), true, 2},
    {"q4_K", kQK_K, sizeof(BlockQ4_K), true, 12},
    {"q6_K", kQK_K, sizeof(BlockQ6_K), true, 14},
    {"q4_1", kQK32, sizeof(BlockQ4_1), true, 3},
    {"q5_0", kQK32, sizeof(BlockQ5_0), true, 6},
    {"q5_1", kQK32, sizeof(BlockQ5_1), true, 7},
    {"q2_K", kQK_K, sizeof(BlockQ2_K), true, 10},
    {"q3_K", kQK_K, sizeof(BlockQ3_K), true, 11},
    {"q5_K", kQK_K, sizeof(BlockQ5_K), true, 13},
    {"iq4_nl", kQK32, sizeof(BlockIQ4_NL), true, 20},
    {"iq4_xs", kQK_K, sizeof(BlockIQ4_XS), true, 23},
    {"mxfp4", kQK32, sizeof(BlockMXFP4), true, 39},
}};

// ---- row conversions: one entry per dtype -------------------------------------------------------------

void f32_to_row(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void f16_to_row(const void* src, float* dst, int64_t n) {
  auto s = static_cast<const f16_bits*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}
void bf16_to_row(const void* src, float* dst, int64_t n) {
  auto s = static_cast<const bf16_bits*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}
void i32_to_row(const void* src, float* dst, int64_t n) {
  auto s = static_cast<const int32_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
void row_from_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void row_from_f16(const float* src, void* dst, int64_t n) {
  auto d = static_cast<f16_bits*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
}
void row_from_bf16(const float* src, void* dst, int64_t n) {
  auto d = static_cast<bf16_bits*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}
void row_from_i32(const float* src, void* dst, int64_t n) {
  auto d = static_cast<int32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(std::lrint(src[i]));
}

// Adapters from the typed block functions of loom/quant.h.
template <typename B, void (*F)(const B*, float*, int64_t)>
void blocks_to_row(const void* src, float* dst, int64_t n) {
  F(static_cast<const B*>(src), dst, n);
}
template <typename B, void (*F)(const float*, B*, int64_t)>
void row_to_blocks(const float* src, void* dst, int64_t n) {
  F(src, static_cast<B*>(dst), n);
}

struct RowConversions {
  void (*to_float)(const void*, float*, int64_t);
  void (*from_float)(const float*, void*, int64_t);
};

#define LOOM_QUANT_ROW(B, name) {blocks_to_row<B, dequantize_row_##name>, row_to_blocks<B, quantize_row_##name>}
constexpr std::array<RowConversions, kDTypeCount> kRows = {{
    {f32_to_row, row_from_f32},
    {f16_to_row, row_from_f16},
    {bf16_to_row, row_from_bf16},
    {i32_to_row, row_from_i32},
    LOOM_QUANT_ROW(BlockQ8_0, q8_0),
    LOOM_QUANT_ROW(BlockQ4_0, q4_0),
    LOOM_QUANT_ROW(BlockQ4_K, q4_k),
    LOOM_QUANT_ROW(BlockQ6_K, q6_k),
    LOOM_QUANT_ROW(BlockQ4_1, q4_1),
    LOOM_QUANT_ROW(BlockQ5_0, q5_0),
    LOOM_QUANT_ROW(BlockQ5_1, q5_1),
    LOOM_QUANT_ROW(BlockQ2_K, q2_k),
    LOOM_QUANT_ROW(BlockQ3_K, q3_k),
    LOOM_QUANT_ROW(BlockQ5_K, q5_k),
    LOOM_QUANT_ROW(BlockIQ4_NL, iq4_nl),
    LOOM_QUANT_ROW(BlockIQ4_XS, iq4_xs),
    LOOM_QUANT_ROW(BlockMXFP4, mxfp4),
}};
#undef LOOM_QUANT_ROW
static_assert(static_cast<int>(DType::mxfp4) == kDTypeCount - 1, "kTraits and kRows are indexed by DType");

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

const DTypeTraits& dtype_traits(DType t) { return kTraits[static_cast<size_t>(t)]; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kDTypeCount; ++i) {
    std::string_view n = kTraits[i].name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t j = 0; j < n.size() && eq; ++j)
      eq = std::tolower(static_cast<unsigned char>(n[j])) ==
           std::tolower(static_cast<unsigned char>(name[j]));
    if (eq) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_gguf(uint32_t id) {
  for (int i = 0; i < kDTypeCount; ++i)
    if (kTraits[i].gguf_id == id) return static_cast<DType>(i);
  return std::nullopt;
}

// Half-precision conversion by bit manipulation: exact for every finite value, subnormals,
// infinities and NaN (NaN keeps a quiet payload bit).
float f16_to_f32(f16_bits h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

f16_bits f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<f16_bits>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<f16_bits>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // result is subnormal or zero: round abs * 2^24 to an integer, nearest even
    float a = bits_f32(abs);
    float scaled = a * 0x1p24f;  // exact: power-of-two scale of a float < 2^-14
    float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<f16_bits>(sign | static_cast<uint32_t>(r));
  }
  // normal: drop 13 mantissa bits with round-to-nearest-even; carry may bump the exponent
  uint32_t v = abs - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t rounded = v + 0xfffu + ((v >> 13) & 1u);
  return static_cast<f16_bits>(sign | (rounded >> 13));
}

bf16_bits f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>(u >> 16);
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  kRows[static_cast<size_t>(t)].to_float(src, dst, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  kRows[static_cast<size_t>(t)].from_float(src, dst, n);
}

}  // namespace loom
