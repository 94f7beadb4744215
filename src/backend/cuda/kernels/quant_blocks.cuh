// Reading the newer block formats (q4_1, q5_0, q5_1, q2_K, q3_K, q5_K, iq4_nl, iq4_xs, mxfp4): the
// bit tricks their decoders share, and per format a Format struct (quant.cuh's contract: kBlock,
// kBytes, load(block, j)) whose loads are the CPU dequantizer's (src/core/quant_basic.cpp,
// quant_k.cpp, quant_iq.cpp) bit for bit.
//
// Bit for bit needs the CPU's roundings: it computes e.g. q4_1's d * q + m as a product and a sum,
// each rounded (baseline x86-64 has no FMA), where nvcc would contract them into one fma. Every
// float operation below therefore goes through quantize_act.cuh's named round-to-nearest helpers.
//
// Each Format splits load into step(block, j), the scale(s) of element j's sub-block, and
// value(step, block, j), so that a caller decoding several elements of one sub-block (Dequant8Of in
// quant.cuh: 8 consecutive elements, never crossing a sub-block of these formats, which are at least
// 16 long) decodes the scales once. Layouts are loom/dtype.h's (copy.cu checks sizes and offsets).
//
// __host__ __device__ so that loom-cuda-host-tests compares the loads with the CPU dequantizer.
// Includes nothing outside src/backend/cuda/ but cuda_fp16.h (through quantize_act.cuh).
#pragma once

#include <cstdint>
#include <cstring>

#include "quantize_act.cuh"

namespace loom::cuda {

// ---- shared decoding helpers ------------------------------------------------------------------------

/// 32-bit little-endian load from any address (mxfp4's 17-byte blocks start at odd offsets).
LOOM_HD uint32_t load_u32_a1(const uint8_t* p) {
  return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

/// Spreads bits 0..3 of `bits` to bit 4 of bytes 0..3: the fifth code bit of four q5 elements.
/// (The four shifted copies of a 4-bit value do not overlap, so the multiply never carries.)
LOOM_HD uint32_t spread_bit4(uint32_t bits) { return ((bits & 0xfu) * 0x00204081u & 0x01010101u) << 4; }

/// A 16-entry int8 code book packed little-endian into four words.
struct CodeBook16 {
  uint32_t w[4];
};
/// iq4_nl / iq4_xs: -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113 (loom/dtype.h's
/// kIQ4NLValues; the host test checks the words against it).
LOOM_HD CodeBook16 iq4nl_book() { return {{0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u}}; }
/// mxfp4's e2m1 values doubled: 0 1 2 3 | 4 6 8 12 | 0 -1 -2 -3 | -4 -6 -8 -12 (kMXFP4Values).
LOOM_HD CodeBook16 mxfp4_book() { return {{0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu}}; }

/// Entry `index` (0..15) of the book.
LOOM_HD int book_value(const CodeBook16& t, int index) {
  const uint32_t word = index < 8 ? (index < 4 ? t.w[0] : t.w[1]) : (index < 12 ? t.w[2] : t.w[3]);
  return static_cast<int8_t>(word >> (8 * (index & 3)));
}

/// The book's entries for the four indices in bytes of v (each 0..15), as four int8 bytes. On the
/// device two byte permutes (each picks from 8 of the 16 entries by the index's low 3 bits) and a
/// select on bit 3: a handful of instructions for four lookups, no memory access.
LOOM_HD uint32_t book_lookup4(const CodeBook16& t, uint32_t v) {
#if defined(__CUDA_ARCH__)
  const uint32_t low3 = v & 0x07070707u;
  const uint32_t pairs = low3 | (low3 >> 4);  // byte 0: idx0 | idx1 << 4, byte 2: idx2 | idx3 << 4
  const uint32_t selector = (pairs & 0xffu) | ((pairs >> 8) & 0xff00u);
  const uint32_t lo = __byte_perm(t.w[0], t.w[1], selector);
  const uint32_t hi = __byte_perm(t.w[2], t.w[3], selector);
  const uint32_t take_hi = ((v >> 3) & 0x01010101u) * 0xffu;
  return (lo & ~take_hi) | (hi & take_hi);
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= (static_cast<uint32_t>(book_value(t, static_cast<int>((v >> (8 * i)) & 15u))) & 0xffu) << (8 * i);
  return r;
#endif
}

/// Half the value of an e8m0 exponent byte, 2^(e-128): loom/dtype.h's e8m0_to_f32_half (exact).
LOOM_HD float e8m0_half(uint8_t e) {
  const uint32_t u = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

/// q3_K's 6-bit scale of sub-block j (0..15), still biased by 32: low 4 bits in the nibbles of bytes
/// 0-7, high 2 bits in bytes 8-11 (loom's q3k_scale).
LOOM_HD int q3k_scale_of(int j, const uint8_t* scales) {
  return ((scales[j % 8] >> (4 * (j / 8))) & 0xF) | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/// iq4_xs's 6-bit scale of sub-block j (0..7), still biased by 32: low 4 bits in the nibbles of
/// scales_l (bytes 4-7), high 2 bits in the 16-bit scales_h (bytes 2-3).
LOOM_HD int iq4xs_scale_of(int j, const uint8_t* block) {
  return ((block[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((load_u16_a2(block + 2) >> (2 * j)) & 3) << 4);
}

/// Nibble j of a 32-element block's 16 bytes laid out as q4_0's (j < 16 low nibble of byte j, else
/// high nibble of byte j - 16).
LOOM_HD int nibble_of(const uint8_t* qs, int j) { return j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4); }

/// Bit 4 of q5 element j: bit j of the little-endian word at qh.
LOOM_HD int q5_high_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

// ---- formats -----------------------------------------------------------------------------------------

/// q4_1: d, m (f16), 16 bytes of nibbles; x = d * q + m.
struct FormatQ4_1 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 20;
  struct Step {
    float d, m;
  };
  LOOM_HD static Step step(const uint8_t* b, int) {
    return {half_to_float(load_u16_a2(b)), half_to_float(load_u16_a2(b + 2))};
  }
  LOOM_HD static float value(const Step& s, const uint8_t* b, int j) {
    return fadd_rn(fmul_rn(s.d, static_cast<float>(nibble_of(b + 4, j))), s.m);
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// q5_0: d (f16), qh (32 fifth bits), 16 bytes of nibbles; x = d * (q - 16).
struct FormatQ5_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 22;
  using Step = float;
  LOOM_HD static Step step(const uint8_t* b, int) { return half_to_float(load_u16_a2(b)); }
  LOOM_HD static float value(Step d, const uint8_t* b, int j) {
    const int q = nibble_of(b + 6, j) | (q5_high_bit(b + 2, j) << 4);
    return fmul_rn(d, static_cast<float>(q - 16));
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// q5_1: d, m (f16), qh, 16 bytes of nibbles; x = d * q + m.
struct FormatQ5_1 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 24;
  using Step = FormatQ4_1::Step;
  LOOM_HD static Step step(const uint8_t* b, int j) { return FormatQ4_1::step(b, j); }
  LOOM_HD static float value(const Step& s, const uint8_t* b, int j) {
    const int q = nibble_of(b + 8, j) | (q5_high_bit(b + 4, j) << 4);
    return fadd_rn(fmul_rn(s.d, static_cast<float>(q)), s.m);
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// Sub-block step and offset of the formats with mins: x = step * q - off.
struct StepMin {
  float step, off;
};

/// q2_K: 16 scale bytes (low nibble scale, high nibble min of each 16 elements), 64 bytes of 2-bit
/// codes (element 128h + 32k + l in bits 2k of qs[32h + l]), d, dmin (f16).
struct FormatQ2_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 84;
  using Step = StepMin;
  LOOM_HD static Step step(const uint8_t* b, int j) {
    const int s = b[j / 16];
    return {fmul_rn(half_to_float(load_u16_a2(b + 80)), static_cast<float>(s & 0xF)),
            fmul_rn(half_to_float(load_u16_a2(b + 82)), static_cast<float>(s >> 4))};
  }
  LOOM_HD static int code(const uint8_t* b, int j) {
    return (b[16 + 32 * (j / 128) + j % 32] >> (2 * ((j / 32) % 4))) & 3;
  }
  LOOM_HD static float value(const Step& s, const uint8_t* b, int j) {
    return fsub_rn(fmul_rn(s.step, static_cast<float>(code(b, j))), s.off);
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// q3_K: hmask (32 bytes: bit k of byte l is the high bit of element 32k + l), 2-bit codes as q2_K
/// (64 bytes at 32), 12 bytes of 6-bit scales, d (f16); x = d * (sc - 32) * (lo - 4 (1 - hbit)).
struct FormatQ3_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 110;
  using Step = float;
  LOOM_HD static Step step(const uint8_t* b, int j) {
    return fmul_rn(half_to_float(load_u16_a2(b + 108)),
                   static_cast<float>(q3k_scale_of(j / 16, b + 96) - 32));
  }
  LOOM_HD static float value(Step s, const uint8_t* b, int j) {
    const int lo = (b[32 + 32 * (j / 128) + j % 32] >> (2 * ((j / 32) % 4))) & 3;
    const int hbit = (b[j % 32] >> (j / 32)) & 1;
    return fmul_rn(s, static_cast<float>(lo - 4 * (1 - hbit)));
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// q5_K: d, dmin (f16), 12 bytes of 6-bit scales/mins (q4_K's packing), qh (32 bytes: bit s of
/// byte l is the fifth bit of element 32s + l), 128 bytes of nibbles as q4_K's.
struct FormatQ5_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 176;
  using Step = StepMin;
  LOOM_HD static Step step(const uint8_t* b, int j) {
    int sc, m;
    q4k_scale_min(j / 32, b + 4, sc, m);
    return {fmul_rn(half_to_float(load_u16_a2(b)), static_cast<float>(sc)),
            fmul_rn(half_to_float(load_u16_a2(b + 2)), static_cast<float>(m))};
  }
  LOOM_HD static float value(const Step& s, const uint8_t* b, int j) {
    const int sub = j / 32, l = j % 32;
    const int q = ((b[48 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF) | (((b[16 + l] >> sub) & 1) << 4);
    return fsub_rn(fmul_rn(s.step, static_cast<float>(q)), s.off);
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// iq4_nl: d (f16), 16 bytes of nibbles as q4_0's indexing the iq4_nl code book; x = d * book[q].
struct FormatIQ4_NL {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 18;
  using Step = float;
  LOOM_HD static Step step(const uint8_t* b, int) { return half_to_float(load_u16_a2(b)); }
  LOOM_HD static float value(Step d, const uint8_t* b, int j) {
    return fmul_rn(d, static_cast<float>(book_value(iq4nl_book(), nibble_of(b + 2, j))));
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// iq4_xs: d (f16), scales_h (u16), scales_l (4 bytes), 8 sub-blocks of 32 with 16 bytes each laid
/// out as iq4_nl's; x = d * (ls - 32) * book[q].
struct FormatIQ4_XS {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 136;
  using Step = float;
  LOOM_HD static Step step(const uint8_t* b, int j) {
    return fmul_rn(half_to_float(load_u16_a2(b)), static_cast<float>(iq4xs_scale_of(j / 32, b) - 32));
  }
  LOOM_HD static float value(Step s, const uint8_t* b, int j) {
    return fmul_rn(s, static_cast<float>(book_value(iq4nl_book(), nibble_of(b + 8 + 16 * (j / 32), j % 32))));
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

/// mxfp4: e (e8m0 exponent byte), 16 bytes of nibbles as q4_0's indexing the doubled e2m1 values;
/// x = 2^(e-128) * book[q]. 17-byte blocks: nothing wider than a byte is aligned.
struct FormatMXFP4 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 17;
  using Step = float;
  LOOM_HD static Step step(const uint8_t* b, int) { return e8m0_half(b[0]); }
  LOOM_HD static float value(Step d, const uint8_t* b, int j) {
    return fmul_rn(d, static_cast<float>(book_value(mxfp4_book(), nibble_of(b + 1, j))));
  }
  LOOM_HD static float load(const uint8_t* b, int j) { return value(step(b, j), b, j); }
};

}  // namespace loom::cuda
