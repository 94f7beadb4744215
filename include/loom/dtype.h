// Element types and the GGUF block layouts of the quantized ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

/// Element types. Quantized types store blocks of `block_size` elements in `type_size` bytes,
/// bit-identical to GGUF so weights can be memory-mapped as they are.
enum class DType : uint8_t { f32, f16, bf16, i32, q8_0, q4_0, q4_k, q6_k };
inline constexpr int kDTypeCount = 8;

/// Static facts about a dtype.
struct DTypeTraits {
  const char* name;      ///< "f32", "q4_K", ... (GGUF spelling)
  int64_t block_size;    ///< elements per block (1 for plain types)
  size_t type_size;      ///< bytes per block
  bool quantized;
  uint32_t gguf_id;      ///< ggml_type value in GGUF files
};

const DTypeTraits& dtype_traits(DType t);
inline const char* dtype_name(DType t) { return dtype_traits(t).name; }
inline int64_t dtype_block_size(DType t) { return dtype_traits(t).block_size; }
inline size_t dtype_type_size(DType t) { return dtype_traits(t).type_size; }
inline bool dtype_is_quantized(DType t) { return dtype_traits(t).quantized; }
/// Bytes of one row of `n` elements; `n` must be a multiple of the block size.
inline size_t dtype_row_size(DType t, int64_t n) {
  return dtype_type_size(t) * static_cast<size_t>(n / dtype_block_size(t));
}
/// Parses a name as printed by dtype_name (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);
/// Maps a GGUF ggml_type id to a DType Loom supports.
std::optional<DType> dtype_from_gguf(uint32_t id);

/// IEEE half stored as bits; conversions are exact for every value.
using f16_bits = uint16_t;
/// bfloat16 stored as bits.
using bf16_bits = uint16_t;

float f16_to_f32(f16_bits h);
f16_bits f32_to_f16(float f);  ///< round to nearest even
inline float bf16_to_f32(bf16_bits h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
bf16_bits f32_to_bf16(float f);  ///< round to nearest even; NaN stays NaN

// ---- GGUF block layouts -------------------------------------------------------------------------

inline constexpr int kQK8_0 = 32;
inline constexpr int kQK4_0 = 32;
inline constexpr int kQK_K = 256;  ///< super-block of the K-quants
inline constexpr int kKScaleBytes = 12;

/// 32 values: x = qs[i] * d.
struct BlockQ8_0 {
  f16_bits d;
  int8_t qs[kQK8_0];
};
/// 32 values: x = (nibble - 8) * d; qs[j] holds element j (low nibble) and j+16 (high nibble).
struct BlockQ4_0 {
  f16_bits d;
  uint8_t qs[kQK4_0 / 2];
};
/// 256 values in 8 sub-blocks of 32: x = d*sc[s]*q - dmin*m[s], with 6-bit sc/m packed in
/// `scales`; qs holds 4 pairs of sub-blocks, 32 bytes each (low nibbles: even sub-block).
struct BlockQ4_K {
  f16_bits d;
  f16_bits dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
/// 256 values in 16 sub-blocks of 16: x = d * scales[s] * (q - 32), q 6-bit from ql (4 low bits)
/// and qh (2 high bits).
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  f16_bits d;
};
/// Activations quantized for K-quant dot products (never stored in files): x = qs[i] * d;
/// bsums[j] = sum of qs[16j..16j+15].
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);

// ---- reference row conversions ------------------------------------------------------------------

/// Converts `n` elements of a row of type `t` to float. `n` is a multiple of the block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
/// Converts `n` floats to a row of type `t` (quantizing where needed; reference quality).
/// `n` is a multiple of the block size. i32 rounds to nearest.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

/// Packs/unpacks the 6-bit scale and min of sub-block `j` (0..7) of a Q4_K block.
void q4k_get_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);
void q4k_set_scale_min(int j, uint8_t* scales, uint8_t sc, uint8_t m);

}  // namespace loom
