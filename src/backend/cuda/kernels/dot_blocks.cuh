// The exact mode's dot formats (quantize_act.cuh's contract: kBlock, kBytes, Act, kParts, Part,
// decode, dot) of the newer block formats, against the CPU's activation blocks: q8_0 for the
// 32-element formats (q4_1, q5_0, q5_1, iq4_nl, mxfp4), q8_K for the 256-element ones (q2_K, q3_K,
// q5_K, iq4_xs).
//
// The CPU (src/backend/cpu/vec_dot.cpp: dot_block32, dot_block_k) decodes a block to integer codes
// and scales and forms per block, in double,
//   32-element:  dx * (d * isum + m * xsum)     isum = sum q*xq, xsum = sum xq (m = 0 but in q4_1, q5_1)
//   256-element: dx * (d * isum - dmin * msum)  isum = sum_s sc_s (q.xq)_s, msum = sum_s m_s bsums_s
// Here each part's share of the integer sums is exact and its term is formed the same way; the
// terms of a block's parts sum to the CPU's block term as exactly as the blocks sum to the row (the
// products are exact in double; docs/NUMERICS.md), so both backends round the row to the same float.
//
// Parts: the 32-element formats split a block in two (elements 8p..8p+7 and 16+8p..16+8p+7: the
// bytes 8p..8p+7 of its nibbles), as DotQ4_0; the 256-element ones in 16, part s taking sub-block
// s of 16 elements (q8_K's bsums granularity) for all their scales.
//
// __host__ __device__: loom-cuda-host-tests runs them in a warp's order against the CPU's kernels.
// Includes nothing outside src/backend/cuda/ but cuda_fp16.h.
#pragma once

#include <cstdint>

#include "quant_blocks.cuh"
#include "quantize_act.cuh"

namespace loom::cuda {

/// sum of the four signed bytes of a.
LOOM_HD int byte_sum4(int a, int c) { return dot4(a, 0x01010101, c); }

/// Two parts per 32-element block, each 8 bytes of nibbles (16 codes, kept as four words of int8),
/// the scale d and offset m (0 where the format has none).
struct Block32Part {
  int lo[2], hi[2];  ///< codes of elements 8p..8p+7 and 16+8p..16+8p+7
  float d, m;
};

/// The part's isum and, when kOffset, xsum against x, and the CPU's term dx * (d isum + m xsum).
template <bool kOffset>
LOOM_HD double block32_term(const Block32Part& p, const ActQ8_0& x, int part) {
  const int x_lo0 = load_i32_a4(x.qs + 8 * part), x_lo1 = load_i32_a4(x.qs + 8 * part + 4);
  const int x_hi0 = load_i32_a4(x.qs + 16 + 8 * part), x_hi1 = load_i32_a4(x.qs + 20 + 8 * part);
  int isum = dot4(p.lo[0], x_lo0, 0);
  isum = dot4(p.lo[1], x_lo1, isum);
  isum = dot4(p.hi[0], x_hi0, isum);
  isum = dot4(p.hi[1], x_hi1, isum);
  const double dx = half_to_float(x.d);
  if constexpr (kOffset) {
    const int xsum = byte_sum4(x_hi1, byte_sum4(x_hi0, byte_sum4(x_lo1, byte_sum4(x_lo0, 0))));
    return dx * (static_cast<double>(p.d) * isum + static_cast<double>(p.m) * xsum);
  } else {
    return dx * (static_cast<double>(p.d) * isum);
  }
}

/// q4_1: d, m (f16) at 0 and 2, nibbles at 4; codes 0..15.
struct DotQ4_1 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 20;
  static constexpr int kParts = 2;
  using Act = ActQ8_0;
  using Part = Block32Part;
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    Part p;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = load_u32_a2(w + 4 + 8 * part + 4 * i);
      p.lo[i] = static_cast<int>(v & 0x0f0f0f0fu);
      p.hi[i] = static_cast<int>((v >> 4) & 0x0f0f0f0fu);
    }
    p.d = half_to_float(load_u16_a2(w));
    p.m = half_to_float(load_u16_a2(w + 2));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) { return block32_term<true>(p, x, part); }
};

/// Codes of a q5 block's part: nibbles at qs, fifth bits in the word qh; minus `bias` (16 for q5_0,
/// 0 for q5_1) bytewise.
LOOM_HD void q5_part_codes(const uint8_t* qs, uint32_t qh, int part, uint32_t bias, Block32Part& p) {
  for (int i = 0; i < 2; ++i) {
    const uint32_t v = load_u32_a2(qs + 8 * part + 4 * i);
    const int first = 8 * part + 4 * i;  // element of the low nibbles' first byte
    p.lo[i] = sub_bytes((v & 0x0f0f0f0fu) | spread_bit4(qh >> first), bias);
    p.hi[i] = sub_bytes(((v >> 4) & 0x0f0f0f0fu) | spread_bit4(qh >> (first + 16)), bias);
  }
}

/// q5_0: d (f16) at 0, qh at 2, nibbles at 6; codes q - 16.
struct DotQ5_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 22;
  static constexpr int kParts = 2;
  using Act = ActQ8_0;
  using Part = Block32Part;
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    Part p;
    q5_part_codes(w + 6, load_u32_a2(w + 2), part, 0x10101010u, p);
    p.d = half_to_float(load_u16_a2(w));
    p.m = 0.0f;
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) { return block32_term<false>(p, x, part); }
};

/// q5_1: d, m (f16) at 0 and 2, qh at 4, nibbles at 8; codes 0..31.
struct DotQ5_1 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 24;
  static constexpr int kParts = 2;
  using Act = ActQ8_0;
  using Part = Block32Part;
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    Part p;
    q5_part_codes(w + 8, load_u32_a2(w + 4), part, 0u, p);
    p.d = half_to_float(load_u16_a2(w));
    p.m = half_to_float(load_u16_a2(w + 2));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) { return block32_term<true>(p, x, part); }
};

/// Codes of a code-book block's part: the nibbles' entries in `book`; qs 2-byte aligned unless
/// kByteAligned.
template <bool kByteAligned>
LOOM_HD void book_part_codes(const uint8_t* qs, int part, const CodeBook16& book, Block32Part& p) {
  for (int i = 0; i < 2; ++i) {
    const uint8_t* at = qs + 8 * part + 4 * i;
    const uint32_t v = kByteAligned ? load_u32_a1(at) : load_u32_a2(at);
    p.lo[i] = static_cast<int>(book_lookup4(book, v & 0x0f0f0f0fu));
    p.hi[i] = static_cast<int>(book_lookup4(book, (v >> 4) & 0x0f0f0f0fu));
  }
}

/// iq4_nl: d (f16) at 0, nibbles at 2 into the iq4_nl code book.
struct DotIQ4_NL {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 18;
  static constexpr int kParts = 2;
  using Act = ActQ8_0;
  using Part = Block32Part;
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    Part p;
    book_part_codes<false>(w + 2, part, iq4nl_book(), p);
    p.d = half_to_float(load_u16_a2(w));
    p.m = 0.0f;
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) { return block32_term<false>(p, x, part); }
};

/// mxfp4: e8m0 exponent byte at 0, nibbles at 1 into the doubled e2m1 values; d = 2^(e-128).
struct DotMXFP4 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 17;
  static constexpr int kParts = 2;
  using Act = ActQ8_0;
  using Part = Block32Part;
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    Part p;
    book_part_codes<true>(w + 1, part, mxfp4_book(), p);
    p.d = e8m0_half(w[0]);
    p.m = 0.0f;
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) { return block32_term<false>(p, x, part); }
};

// ---- 256-element formats: part s = sub-block s of 16 elements ---------------------------------------

/// Sub-block s's 16 codes (four words of int8), its scale, min, and the block's d, dmin.
struct BlockKPart {
  int q[4];
  int sc, m;
  float d, dmin;
};

/// The part's term of the CPU's dx * (d * isum - dmin * msum).
LOOM_HD double block_k_term(const BlockKPart& p, const ActQ8_K& x, int s) {
  int dot = 0;
  for (int i = 0; i < 4; ++i) dot = dot4(p.q[i], load_i32_a4(x.qs + 16 * s + 4 * i), dot);
  const int isum = p.sc * dot, msum = p.m * x.bsums[s];
  return static_cast<double>(x.d) * (static_cast<double>(p.d) * isum - static_cast<double>(p.dmin) * msum);
}

/// q2_K: scales at 0, 2-bit codes at 16 (sub-block s: bytes 32(s/8) + 16(s%2) .. +15, bits
/// 2((s%8)/2)), d, dmin at 80, 82.
struct DotQ2_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 84;
  static constexpr int kParts = 16;
  using Act = ActQ8_K;
  using Part = BlockKPart;
  LOOM_HD static Part decode(const uint8_t* w, int s) {
    Part p;
    const uint8_t* qs = w + 16 + 32 * (s / 8) + 16 * (s % 2);
    const int shift = 2 * ((s % 8) / 2);
    for (int i = 0; i < 4; ++i) p.q[i] = static_cast<int>((load_u32_a2(qs + 4 * i) >> shift) & 0x03030303u);
    p.sc = w[s] & 0xF;
    p.m = w[s] >> 4;
    p.d = half_to_float(load_u16_a2(w + 80));
    p.dmin = half_to_float(load_u16_a2(w + 82));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int s) { return block_k_term(p, x, s); }
};

/// q3_K: hmask at 0 (sub-block s: bytes 16(s%2) .. +15, bit s/2), 2-bit codes at 32 as q2_K's,
/// scales at 96, d at 108; codes lo - 4 (1 - hbit), scale sc - 32, no mins.
struct DotQ3_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 110;
  static constexpr int kParts = 16;
  using Act = ActQ8_K;
  using Part = BlockKPart;
  LOOM_HD static Part decode(const uint8_t* w, int s) {
    Part p;
    const uint8_t* qs = w + 32 + 32 * (s / 8) + 16 * (s % 2);
    const uint8_t* hm = w + 16 * (s % 2);
    const int shift = 2 * ((s % 8) / 2), hshift = s / 2;
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (load_u32_a2(qs + 4 * i) >> shift) & 0x03030303u;
      const uint32_t hbit = (load_u32_a2(hm + 4 * i) >> hshift) & 0x01010101u;
      p.q[i] = sub_bytes(lo | (hbit << 2), 0x04040404u);
    }
    p.sc = q3k_scale_of(s, w + 96) - 32;
    p.m = 0;
    p.d = half_to_float(load_u16_a2(w + 108));
    p.dmin = 0.0f;
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int s) { return block_k_term(p, x, s); }
};

/// q5_K: d, dmin at 0, 2, scales/mins at 4 (q4_K's packing, per 32 elements), qh at 16 (sub-block s:
/// bytes 16(s%2) .. +15, bit s/2), nibbles at 48 (bytes 32(s/4) + 16(s%2) .. +15, nibble (s/2)%2).
struct DotQ5_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 176;
  static constexpr int kParts = 16;
  using Act = ActQ8_K;
  using Part = BlockKPart;
  LOOM_HD static Part decode(const uint8_t* w, int s) {
    Part p;
    const int sub = s / 2;  // the 32-element sub-block
    const uint8_t* qs = w + 48 + 32 * (sub / 2) + 16 * (s % 2);
    const uint8_t* qh = w + 16 + 16 * (s % 2);
    const int shift = 4 * (sub % 2);
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (load_u32_a2(qs + 4 * i) >> shift) & 0x0f0f0f0fu;
      const uint32_t hi = ((load_u32_a2(qh + 4 * i) >> sub) & 0x01010101u) << 4;
      p.q[i] = static_cast<int>(lo | hi);
    }
    q4k_scale_min(sub, w + 4, p.sc, p.m);
    p.d = half_to_float(load_u16_a2(w));
    p.dmin = half_to_float(load_u16_a2(w + 2));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int s) { return block_k_term(p, x, s); }
};

/// iq4_xs: d at 0, 6-bit scales at 2..7, nibbles at 8 (sub-block s: the low (s even) or high
/// nibbles of bytes 16(s/2) .. +15) into the iq4_nl code book; scale ls - 32, no mins.
struct DotIQ4_XS {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 136;
  static constexpr int kParts = 16;
  using Act = ActQ8_K;
  using Part = BlockKPart;
  LOOM_HD static Part decode(const uint8_t* w, int s) {
    Part p;
    const uint8_t* qs = w + 8 + 16 * (s / 2);
    const int shift = 4 * (s % 2);
    const CodeBook16 book = iq4nl_book();
    for (int i = 0; i < 4; ++i)
      p.q[i] = static_cast<int>(book_lookup4(book, (load_u32_a2(qs + 4 * i) >> shift) & 0x0f0f0f0fu));
    p.sc = iq4xs_scale_of(s / 2, w) - 32;
    p.m = 0;
    p.d = half_to_float(load_u16_a2(w));
    p.dmin = 0.0f;
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int s) { return block_k_term(p, x, s); }
};

}  // namespace loom::cuda
