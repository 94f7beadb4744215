// Element types and the GGUF block layouts of the quantized ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

/// Element types. Quantized types store blocks of `block_size` elements in `type_size` bytes,
/// bit-identical to GGUF so weights can be memory-mapped as they are.
/// New types are appended: the values index per-type tables (dtype.cpp, the CPU dot kernels).
enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  i32,
  q8_0,
  q4_0,
  q4_k,
  q6_k,
  q4_1,
  q5_0,
  q5_1,
  q2_k,
  q3_k,
  q5_k,
  iq4_nl,
  iq4_xs,
  mxfp4,
};
inline constexpr int kDTypeCount = 17;

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
inline constexpr int kQK32 = 32;  ///< block of the 32-element formats (q4_1, q5_0, q5_1, iq4_nl, mxfp4)
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
/// 32 values: x = nibble * d + m (m is a signed offset, not subtracted); layout of qs as Q4_0.
struct BlockQ4_1 {
  f16_bits d;
  f16_bits m;
  uint8_t qs[kQK32 / 2];
};
/// 32 values: x = (q - 16) * d, q 5-bit: low 4 bits as Q4_0's nibbles, bit 4 of element i in bit i
/// of the little-endian word qh.
struct BlockQ5_0 {
  f16_bits d;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
/// 32 values: x = q * d + m, q 5-bit packed as in Q5_0.
struct BlockQ5_1 {
  f16_bits d;
  f16_bits m;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
/// 256 values in 16 sub-blocks of 16: x = d*(scales[s]&15)*q - dmin*(scales[s]>>4), q 2-bit;
/// element 128h + 32k + l is bits 2k..2k+1 of qs[32h + l].
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  f16_bits d;
  f16_bits dmin;
};
/// 256 values in 16 sub-blocks of 16: x = d*(sc[s]-32)*(q - 4*(1-hbit)), q 2-bit packed as in Q2_K,
/// hbit of element 32k + l in bit k of hmask[l]; 6-bit sc packed in `scales` (q3k_scale).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[kKScaleBytes];
  f16_bits d;
};
/// 256 values in 8 sub-blocks of 32: x = d*sc[s]*q - dmin*m[s] as Q4_K, q 5-bit: low 4 bits as
/// Q4_K's qs, bit 4 of element 32k + l in bit k of qh[l].
struct BlockQ5_K {
  f16_bits d;
  f16_bits dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
/// 32 values: x = d * kIQ4NLValues[nibble], nibbles laid out as Q4_0's.
struct BlockIQ4_NL {
  f16_bits d;
  uint8_t qs[kQK32 / 2];
};
/// 256 values in 8 sub-blocks of 32: x = d * (ls[s] - 32) * kIQ4NLValues[nibble], ls 6-bit (low 4
/// bits in scales_l nibbles, high 2 bits in scales_h); each sub-block's 16 bytes laid out as Q4_0's.
struct BlockIQ4_XS {
  f16_bits d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
/// 32 values (OCP microscaling FP4): x = 2^(e-128) * kMXFP4Values[nibble] (the table holds the
/// e2m1 values doubled), nibbles laid out as Q4_0's.
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK32 / 2];
};

/// The IQ4_NL / IQ4_XS code book (non-uniform, denser near zero).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
/// MXFP4's e2m1 code book, doubled so every entry is an integer.
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/// Half the value of an e8m0 exponent byte (2^(e-128)), as the MXFP4 decoder uses it; exact.
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t u = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

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
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockMXFP4) == 17);

// ---- reference row conversions ------------------------------------------------------------------

/// Converts `n` elements of a row of type `t` to float. `n` is a multiple of the block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
/// Converts `n` floats to a row of type `t` (quantizing where needed; reference quality).
/// `n` is a multiple of the block size. i32 rounds to nearest.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

/// Packs/unpacks the 6-bit scale and min of sub-block `j` (0..7) of a Q4_K block.
void q4k_get_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);
void q4k_set_scale_min(int j, uint8_t* scales, uint8_t sc, uint8_t m);
/// Unpacks/packs the 6-bit scale (0..63, stored with a +32 bias) of sub-block `j` (0..15) of a Q3_K
/// block: low 4 bits in the nibbles of bytes 0-7, high 2 bits in bytes 8-11.
int q3k_scale(int j, const uint8_t* scales);
void q3k_set_scale(int j, uint8_t* scales, int sc);
/// The 6-bit scale (0..63, +32 bias) of sub-block `j` (0..7) of an IQ4_XS block.
int iq4xs_scale(int j, const BlockIQ4_XS& b);

}  // namespace loom
