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
}};

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
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::f16: {
      auto s = static_cast<const f16_bits*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::bf16: {
      auto s = static_cast<const bf16_bits*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::i32: {
      auto s = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::q8_0: dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, n); return;
    case DType::q4_0: dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n); return;
    case DType::q4_k: dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), dst, n); return;
    case DType::q6_k: dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), dst, n); return;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::f16: {
      auto d = static_cast<f16_bits*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::bf16: {
      auto d = static_cast<bf16_bits*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::i32: {
      auto d = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(std::lrint(src[i]));
      return;
    }
    case DType::q8_0: quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n); return;
    case DType::q4_0: quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n); return;
    case DType::q4_k: quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), n); return;
    case DType::q6_k: quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), n); return;
  }
}

}  // namespace loom
