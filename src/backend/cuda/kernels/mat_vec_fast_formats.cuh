// The fast numerics mode's quantized mat-vec arithmetic (mat_vec_fast.cu): how 32 weights of each
// quantized type decode from their block, and their dot with 32 int8 activations, in float.
//
// Activations are quantized per column into ActFast's layout (not the CPU's blocks): int8 codes
// contiguous per column (16-byte loads of 16 codes), one float scale per 32 codes for q8_0/q4_0
// weights and per 256 for the K-quants (q8_K's granularity), and for q4_K the integer sum of each 32
// codes (the sub-block mins term). The layout's size never exceeds the exact mode's blocks'
// (quantized_activation_bytes), so the scratch every caller reserves holds it.
//
// A unit is 32 consecutive weights of a row: one whole q8_0/q4_0 block, one sub-block of a q4_K
// block (1 of 8), a quarter-half of a q6_K block (1 of 8). decode(block, part) unpacks unit `part`
// of a block into eight words of signed (or for q4_K unsigned) 8-bit codes, element order, and its
// float scales; dot(unit, x, dx, xsum) gives the unit's term of the row's dot product: an exact
// integer sum by dp4a, scaled in float.
//
// __host__ __device__ (LOOM_HD) so that loom-cuda-host-tests checks the decoders against the CPU's
// dequantizer. Weight blocks are only 2-byte aligned (34, 18 and 210 bytes), so words are read
// through load_words_a2. Includes nothing outside src/backend/cuda/ but cuda_fp16.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant_blocks.cuh"
#include "quantize_act.cuh"

namespace loom::cuda {

/// Weights (and activation codes) per unit.
constexpr int kFastUnit = 32;

/// n little-endian 32-bit words from a 2-byte aligned address. On the device: the n + 1 aligned
/// words around them and a funnel shift, n + 1 loads instead of 2n 16-bit ones (the word past the
/// end must be readable: the shared-memory stages keep 16 bytes of slack).
template <int N>
LOOM_HD void load_words_a2(const uint8_t* p, uint32_t (&w)[N]) {
#if defined(__CUDA_ARCH__)
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto* base = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const unsigned shift = (addr & 2u) * 8u;
  uint32_t raw[N + 1];
  for (int i = 0; i <= N; ++i) raw[i] = base[i];
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
#else
  std::memcpy(w, p, sizeof(w));
#endif
}

/// n (a multiple of 4) little-endian 32-bit words from a 16-byte aligned address: n / 4 16-byte
/// loads. The fast kernel's stages hold rows from 16-byte boundaries (mat_vec_fast_supports), so
/// the 144- and 176-byte blocks of q4_K and q5_K, and their 16-byte aligned fields, are aligned there.
template <int N>
LOOM_HD void load_words_a16(const uint8_t* p, uint32_t (&w)[N]) {
  static_assert(N % 4 == 0, "whole 16-byte loads");
#if defined(__CUDA_ARCH__)
  const auto* v = reinterpret_cast<const uint4*>(p);
  for (int i = 0; i < N / 4; ++i) {
    const uint4 x = v[i];
    w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
  }
#else
  std::memcpy(w, p, sizeof(w));
#endif
}

/// n (even) little-endian 32-bit words from an 8-byte aligned address: n / 2 8-byte loads, nothing read
/// past them (iq4_xs's 136-byte blocks on 16-byte aligned rows: their code bytes at 8 + 16 s).
template <int N>
LOOM_HD void load_words_a8(const uint8_t* p, uint32_t (&w)[N]) {
  static_assert(N % 2 == 0, "whole 8-byte loads");
#if defined(__CUDA_ARCH__)
  const auto* v = reinterpret_cast<const uint2*>(p);
  for (int i = 0; i < N / 2; ++i) {
    const uint2 x = v[i];
    w[2 * i] = x.x, w[2 * i + 1] = x.y;
  }
#else
  std::memcpy(w, p, sizeof(w));
#endif
}

/// load_words_a2 from any address (mxfp4's 17-byte blocks): the same funnel shift by 8, 16 or 24 bits.
template <int N>
LOOM_HD void load_words_a1(const uint8_t* p, uint32_t (&w)[N]) {
#if defined(__CUDA_ARCH__)
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto* base = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const unsigned shift = (addr & 3u) * 8u;
  uint32_t raw[N + 1];
  for (int i = 0; i <= N; ++i) raw[i] = base[i];
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
#else
  std::memcpy(w, p, sizeof(w));
#endif
}

/// Bytewise x - 8 for bytes 0..15 (q4_0 codes), as int8: no borrow crosses a byte.
LOOM_HD uint32_t nibbles_minus_8(uint32_t x) { return (x + 0x78787878u) ^ 0x80808080u; }
/// Bytewise x - 32 for bytes 0..63 (q6_K codes), as int8.
LOOM_HD uint32_t sixbits_minus_32(uint32_t x) { return (x + 0x60606060u) ^ 0x80808080u; }
/// Bytewise x - 16 for bytes 0..31 (q5_0 codes) and x - 4 for bytes 0..7 (q3_K codes), as int8.
LOOM_HD uint32_t fivebits_minus_16(uint32_t x) { return (x + 0x70707070u) ^ 0x80808080u; }
LOOM_HD uint32_t threebits_minus_4(uint32_t x) { return (x + 0x7c7c7c7cu) ^ 0x80808080u; }

/// The isum of 32 weight codes against 32 activation codes.
LOOM_HD int dot32(const uint32_t (&w)[8], const int (&x)[8]) {
  int s = 0;
  for (int i = 0; i < 8; ++i) s = dot4(static_cast<int>(w[i]), x[i], s);
  return s;
}

/// q8_0: one unit per block; d * dx * isum.
struct FastQ8_0 {
  static constexpr int kBlock = 32, kBytes = 34, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;  ///< activations per activation scale
  static constexpr bool kActSums = false;
  struct Unit {
    uint32_t q[8];
    float d;
  };
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    Unit u;
    load_words_a2(b + 2, u.q);
    u.d = half_to_float(load_u16_a2(b));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int /*xsum*/) {
    return static_cast<float>(dot32(u.q, x)) * (u.d * dx);
  }
};

/// q4_0: one unit per block, codes nibble - 8 (element j low nibble of byte j, j + 16 high).
struct FastQ4_0 {
  static constexpr int kBlock = 32, kBytes = 18, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;
  static constexpr bool kActSums = false;
  using Unit = FastQ8_0::Unit;
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    uint32_t raw[4];
    load_words_a2(b + 2, raw);
    Unit u;
    for (int i = 0; i < 4; ++i) {
      u.q[i] = nibbles_minus_8(raw[i] & 0x0f0f0f0fu);
      u.q[4 + i] = nibbles_minus_8((raw[i] >> 4) & 0x0f0f0f0fu);
    }
    u.d = half_to_float(load_u16_a2(b));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return FastQ8_0::dot(u, x, dx, xsum);
  }
};

/// q4_K: unit s = sub-block s (elements 32s .. 32s+31): the low (s even) or high nibbles of qs
/// bytes 32(s/2) .. +31, 6-bit scale sc and min m. Term: dx (d sc isum - dmin m xsum), dx the
/// activations' scale of the whole 256-block, xsum the sum of the unit's 32 activation codes.
struct FastQ4_K {
  static constexpr int kBlock = 256, kBytes = 144, kUnitsPerBlock = 8;
  static constexpr int kActScaleBlock = 256;
  static constexpr bool kActSums = true;
  struct Unit {
    uint32_t q[8];  // unsigned nibbles
    float d_sc, dmin_m;
  };
  LOOM_HD static Unit decode(const uint8_t* b, int s) {
    Unit u;
    uint32_t raw[8];
    load_words_a16(b + 16 + 32 * (s / 2), raw);
    const unsigned shift = (s & 1) * 4u;
    for (int i = 0; i < 8; ++i) u.q[i] = (raw[i] >> shift) & 0x0f0f0f0fu;
    int sc, m;
    q4k_scale_min(s, b + 4, sc, m);
    u.d_sc = half_to_float(load_u16_a2(b)) * static_cast<float>(sc);
    u.dmin_m = half_to_float(load_u16_a2(b + 2)) * static_cast<float>(m);
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return dx * (u.d_sc * static_cast<float>(dot32(u.q, x)) - u.dmin_m * static_cast<float>(xsum));
  }
};

/// q6_K: unit p = (h, c) = (p / 4, p % 4): elements 128h + 32c + l, l = 0..31, the low (c < 2) or
/// high nibble of ql[64h + 32(c & 1) + l] and bits 2c..2c+1 of qh[32h + l], code - 32; scales
/// scales[8h + 2c] for l < 16 and [8h + 2c + 1] for the rest. Term: d dx (sc0 isum_lo + sc1 isum_hi).
struct FastQ6_K {
  static constexpr int kBlock = 256, kBytes = 210, kUnitsPerBlock = 8;
  static constexpr int kActScaleBlock = 256;
  static constexpr bool kActSums = false;
  struct Unit {
    uint32_t q[8];
    int sc0, sc1;
    float d;
  };
  LOOM_HD static Unit decode(const uint8_t* b, int p) {
    const int h = p / 4, c = p % 4;
    uint32_t ql[8], qh[8];
    load_words_a2(b + 64 * h + 32 * (c & 1), ql);
    load_words_a2(b + 128 + 32 * h, qh);
    const unsigned lo_shift = c < 2 ? 0u : 4u, hi_shift = 2u * static_cast<unsigned>(c);
    Unit u;
    for (int i = 0; i < 8; ++i)
      u.q[i] = sixbits_minus_32(((ql[i] >> lo_shift) & 0x0f0f0f0fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4));
    const uint16_t sc = load_u16_a2(b + 192 + 8 * h + 2 * c);
    u.sc0 = static_cast<int8_t>(sc & 0xff);
    u.sc1 = static_cast<int8_t>(sc >> 8);
    u.d = half_to_float(load_u16_a2(b + 208));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int /*xsum*/) {
    int lo = 0, hi = 0;
    for (int i = 0; i < 4; ++i) {
      lo = dot4(static_cast<int>(u.q[i]), x[i], lo);
      hi = dot4(static_cast<int>(u.q[4 + i]), x[4 + i], hi);
    }
    return (u.d * dx) * static_cast<float>(u.sc0 * lo + u.sc1 * hi);
  }
};

/// The 32 bits at bit s (0..31) of the 64-bit hi:lo (the device's funnel shift).
LOOM_HD uint32_t funnel_r(uint32_t lo, uint32_t hi, unsigned s) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, s);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (s & 31u));
#endif
}

/// q6_K read from global memory straight into registers (mat_vec_direct_q6k_kernel). A group of 8
/// blocks is 1680 bytes, 105 16-byte chunks, so on 16-byte aligned rows (mat_vec_fast_supports: 210 n
/// bytes are a multiple of 16 only for n a multiple of 8) every group starts 16-byte aligned and block
/// j of a group (0..7) starts 2 j bytes into chunk 13 j. Part u = 2 h + s (0..3) of a block is its 64
/// weights 128 h + 32 c + 16 s + (0..15), c = 0..3: the low (c = 0, 1) or high (c = 2, 3) nibbles of
/// ql bytes 64 h + 32 (c & 1) + 16 s + (0..15), bits 2 c of qh bytes 32 h + 16 s + (0..15), scale byte
/// 8 h + 2 c + s: three 16-byte runs (ql, ql + 32, qh) at the block's offset 2 j, read as the chunk
/// pairs holding them (four consecutive chunks of ql, two of qh), plus four scale bytes and d.
///
/// Codes are built as 4 (q - 32) in int8: the 4 ql bits at bits 2..5 and the 2 qh bits at 6..7 with
/// the top one flipped, byte 4 q ^ 0x80 = 4 q - 128 as signed (no per-code subtraction and no sums of
/// activation codes): two LOP3 per qh word and a shift and a LOP3 per code word. The term of part u of
/// block b against the activations' codes x (per unit c: four words of the 16 codes at 128 h + 32 c +
/// 16 s) is d / 4 * dx * sum_c sc_c isum_c: the pipeline's (FastQ6_K) integer sums, scaled in float.
struct DirectQ6_K {
  static constexpr int kGroupBlocks = 8, kGroupBytes = kGroupBlocks * FastQ6_K::kBytes;
  static constexpr int kParts = 4;  ///< lanes per block
  static_assert(kGroupBytes % 16 == 0 && FastQ6_K::kBytes % 16 == 2, "block j of a group at 16 (13 j) + 2 j");

  /// Chunks (of the group) that hold part u's ql runs (4, from this one) and qh run (2) of block j.
  LOOM_HD static int ql_chunk(int j, int u) { return 13 * j + 4 * (u >> 1) + (u & 1); }
  LOOM_HD static int qh_chunk(int j, int u) { return 13 * j + 8 + 2 * (u >> 1) + (u & 1); }
  /// Byte (of the group) of part u's scale of unit c, of d.
  LOOM_HD static int scale_byte(int j, int u, int c) {
    return 210 * j + 192 + 8 * (u >> 1) + 2 * c + (u & 1);
  }
  LOOM_HD static int d_byte(int j) { return 210 * j + 208; }

  /// The 16 bytes at byte 4 w0 + 2 hw of 8 words (two chunks): block j's run, w0 = j / 2, hw = j % 2.
  /// Two levels of selects and a funnel shift; the kernel's lanes take j with compile-time w0 bits
  /// where they can (then only the funnel shift, or nothing, remains).
  LOOM_HD static void window(const uint32_t* raw, int w0, int hw, uint32_t (&out)[4]) {
    uint32_t t[6], v[5];
    for (int i = 0; i < 6; ++i) t[i] = (w0 & 2) ? raw[i + 2] : raw[i];
    for (int i = 0; i < 5; ++i) v[i] = (w0 & 1) ? t[i + 1] : t[i];
    for (int i = 0; i < 4; ++i) out[i] = funnel_r(v[i], v[i + 1], 16u * static_cast<unsigned>(hw));
  }

  struct Part {
    uint32_t q[4][4];  ///< unit c's 16 codes 4 (q - 32), element order
    int sc[4];         ///< unit c's scale
    float d4;          ///< d / 4
  };
  /// A part of a block from its chunks: ql[16] (ql_chunk on), qh[8] (qh_chunk on), its scales (read as
  /// int8) and d's bits, at the block's w0 = j / 2, hw = j % 2.
  LOOM_HD static Part decode(const uint32_t (&ql)[16], const uint32_t (&qh)[8], const int (&sc)[4],
                             uint32_t d_bits, int w0, int hw) {
    uint32_t lo[4], hi[4], h[4];
    window(ql, w0, hw, lo);      // ql bytes 64 h + 16 s ..: units 0 (low nibbles) and 2 (high)
    window(ql + 8, w0, hw, hi);  // ql bytes 64 h + 32 + 16 s ..: units 1 and 3
    window(qh, w0, hw, h);
    constexpr uint32_t kMid = 0x3c3c3c3cu;  // bits 2..5 of each byte: the ql nibble
    Part p;
    for (int i = 0; i < 4; ++i) {
      const uint32_t t0 = (h[i] & 0x33333333u) ^ 0x22222222u;  // qh bits of units 0 (0..1) and 2 (4..5)
      const uint32_t t1 = (h[i] & 0xccccccccu) ^ 0x88888888u;  // units 1 (2..3) and 3 (6..7)
      p.q[0][i] = ((lo[i] << 2) & kMid) | ((t0 << 6) & ~kMid);
      p.q[1][i] = ((hi[i] << 2) & kMid) | ((t1 << 4) & ~kMid);
      p.q[2][i] = ((lo[i] >> 2) & kMid) | ((t0 << 2) & ~kMid);
      p.q[3][i] = ((hi[i] >> 2) & kMid) | (t1 & ~kMid);
    }
    for (int c = 0; c < 4; ++c) p.sc[c] = sc[c];
    p.d4 = half_to_float(static_cast<uint16_t>(d_bits)) * 0.25f;
    return p;
  }
  /// 4 sum_c sc_c isum_c against x[c] (unit c's 16 activation codes).
  LOOM_HD static int isum(const Part& p, const int (&x)[4][4]) {
    int total = 0;
    for (int c = 0; c < 4; ++c) {
      int s = 0;
      for (int i = 0; i < 4; ++i) s = dot4(static_cast<int>(p.q[c][i]), x[c][i], s);
      total += p.sc[c] * s;
    }
    return total;
  }
};

// ---- the newer formats --------------------------------------------------------------------------------
// Same unit of 32 weights. The 32-element formats with an offset (q4_1, q5_1) sum their unit's 32
// activation codes by dp4a in the dot rather than through the layout's sums: a sum per 32 codes
// with a scale per 32 would outgrow the exact mode's q8_0 blocks, the scratch every caller reserves.

/// The sum of 32 activation codes.
LOOM_HD int code_sum32(const int (&x)[8]) {
  int s = 0;
  for (int i = 0; i < 8; ++i) s = dot4(x[i], 0x01010101, s);
  return s;
}

/// A 32-element block with an offset: codes unsigned, x = d q + m.
struct FastOffsetUnit {
  uint32_t q[8];
  float d, m;
};

/// n little-endian 32-bit words from a 4-byte aligned address: n word loads, nothing read past them
/// (q4_1's codes at 4 of its 20-byte blocks, q5_1's at 8 of 24, on 16-byte aligned rows).
template <int N>
LOOM_HD void load_words_a4(const uint8_t* p, uint32_t (&w)[N]) {
#if defined(__CUDA_ARCH__)
  const auto* v = reinterpret_cast<const uint32_t*>(p);
  for (int i = 0; i < N; ++i) w[i] = v[i];
#else
  std::memcpy(w, p, sizeof(w));
#endif
}

/// load_words_a2 with nothing read past the n words: the aligned word holding their last two bytes
/// (2-byte aligned p) read as a 16-bit load, none (4-byte aligned p). For global memory, where a
/// tensor's last block may end its allocation (mat_vec_direct_unit_kernel's q5_0 and iq4_nl).
template <int N>
LOOM_HD void load_words_a2_in(const uint8_t* p, uint32_t (&w)[N]) {
#if defined(__CUDA_ARCH__)
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto* base = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const unsigned shift = (addr & 2u) * 8u;
  uint32_t raw[N + 1];
  for (int i = 0; i < N; ++i) raw[i] = base[i];
  raw[N] = shift ? *reinterpret_cast<const uint16_t*>(base + N) : 0u;
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
#else
  std::memcpy(w, p, sizeof(w));
#endif
}

/// How a block's 16 bytes of nibbles are aligned where they are read: any byte (mxfp4), 2 bytes (q5_0,
/// iq4_nl: a word more is read, past the codes; a2_in: nothing past them), 4 bytes (q4_1, q5_1: exactly
/// the 16 bytes).
enum class NibbleAlign { a1, a2, a2_in, a4 };

/// Eight code words of a 32-element block from its 16 bytes of nibbles (q4_0's order) at qs.
template <NibbleAlign kAlign>
LOOM_HD void nibble_words(const uint8_t* qs, uint32_t (&lo)[4], uint32_t (&hi)[4]) {
  uint32_t raw[4];
  if constexpr (kAlign == NibbleAlign::a1) {
    load_words_a1(qs, raw);
  } else if constexpr (kAlign == NibbleAlign::a2) {
    load_words_a2(qs, raw);
  } else if constexpr (kAlign == NibbleAlign::a2_in) {
    load_words_a2_in(qs, raw);
  } else {
    load_words_a4(qs, raw);
  }
  for (int i = 0; i < 4; ++i) {
    lo[i] = raw[i] & 0x0f0f0f0fu;
    hi[i] = (raw[i] >> 4) & 0x0f0f0f0fu;
  }
}

/// q4_1: one unit per block; dx (d isum + m xsum).
struct FastQ4_1 {
  static constexpr int kBlock = 32, kBytes = 20, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;
  static constexpr bool kActSums = false;
  using Unit = FastOffsetUnit;
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    Unit u;
    uint32_t lo[4], hi[4];
    nibble_words<NibbleAlign::a4>(b + 4, lo, hi);
    for (int i = 0; i < 4; ++i) {
      u.q[i] = lo[i];
      u.q[4 + i] = hi[i];
    }
    u.d = half_to_float(load_u16_a2(b));
    u.m = half_to_float(load_u16_a2(b + 2));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int /*xsum*/) {
    return dx * (u.d * static_cast<float>(dot32(u.q, x)) + u.m * static_cast<float>(code_sum32(x)));
  }
};

/// q5 codes of a block: nibbles at qs, fifth bits in the word qh.
template <NibbleAlign kAlign>
LOOM_HD void q5_words(const uint8_t* qs, uint32_t qh, uint32_t (&q)[8]) {
  uint32_t lo[4], hi[4];
  nibble_words<kAlign>(qs, lo, hi);
  for (int i = 0; i < 4; ++i) {
    q[i] = lo[i] | spread_bit4(qh >> (4 * i));
    q[4 + i] = hi[i] | spread_bit4(qh >> (16 + 4 * i));
  }
}

/// q5_0: one unit per block, codes q - 16.
struct FastQ5_0 {
  static constexpr int kBlock = 32, kBytes = 22, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;
  static constexpr bool kActSums = false;
  using Unit = FastQ8_0::Unit;
  template <NibbleAlign kAlign = NibbleAlign::a2>
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    Unit u;
    q5_words<kAlign>(b + 6, load_u32_a2(b + 2), u.q);
    for (uint32_t& w : u.q) w = fivebits_minus_16(w);
    u.d = half_to_float(load_u16_a2(b));
    return u;
  }
  /// decode reading nothing past the block (global memory: mat_vec_direct_unit_kernel)
  LOOM_HD static Unit decode_in_block(const uint8_t* b, int part) { return decode<NibbleAlign::a2_in>(b, part); }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return FastQ8_0::dot(u, x, dx, xsum);
  }
};

/// q5_1: one unit per block, codes 0..31; dx (d isum + m xsum).
struct FastQ5_1 {
  static constexpr int kBlock = 32, kBytes = 24, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;
  static constexpr bool kActSums = false;
  using Unit = FastOffsetUnit;
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    Unit u;
    q5_words<NibbleAlign::a4>(b + 8, load_u32_a2(b + 4), u.q);
    u.d = half_to_float(load_u16_a2(b));
    u.m = half_to_float(load_u16_a2(b + 2));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return FastQ4_1::dot(u, x, dx, xsum);
  }
};

/// Code-book block: the nibbles' entries, d.
template <NibbleAlign kAlign>
LOOM_HD void book_words(const uint8_t* qs, const CodeBook16& book, uint32_t (&q)[8]) {
  uint32_t lo[4], hi[4];
  nibble_words<kAlign>(qs, lo, hi);
  for (int i = 0; i < 4; ++i) {
    q[i] = book_lookup4(book, lo[i]);
    q[4 + i] = book_lookup4(book, hi[i]);
  }
}

/// iq4_nl: one unit per block, codes from the iq4_nl book.
struct FastIQ4_NL {
  static constexpr int kBlock = 32, kBytes = 18, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;
  static constexpr bool kActSums = false;
  using Unit = FastQ8_0::Unit;
  template <NibbleAlign kAlign = NibbleAlign::a2>
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    Unit u;
    book_words<kAlign>(b + 2, iq4nl_book(), u.q);
    u.d = half_to_float(load_u16_a2(b));
    return u;
  }
  /// decode reading nothing past the block (global memory: mat_vec_direct_unit_kernel)
  LOOM_HD static Unit decode_in_block(const uint8_t* b, int part) { return decode<NibbleAlign::a2_in>(b, part); }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return FastQ8_0::dot(u, x, dx, xsum);
  }
};

/// mxfp4: one unit per block (17 bytes: read bytewise-aligned), codes from the doubled e2m1 book.
struct FastMXFP4 {
  static constexpr int kBlock = 32, kBytes = 17, kUnitsPerBlock = 1;
  static constexpr int kActScaleBlock = 32;
  static constexpr bool kActSums = false;
  using Unit = FastQ8_0::Unit;
  LOOM_HD static Unit decode(const uint8_t* b, int /*part*/) {
    Unit u;
    book_words<NibbleAlign::a1>(b + 1, mxfp4_book(), u.q);
    u.d = e8m0_half(b[0]);
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return FastQ8_0::dot(u, x, dx, xsum);
  }
};

/// Signed codes with one integer scale per 16 elements (q3_K, iq4_xs): d dx (sc0 isum_lo + sc1 isum_hi).
struct FastScaledUnit {
  uint32_t q[8];
  int sc0, sc1;
  float d;
};
LOOM_HD float scaled_unit_dot(const FastScaledUnit& u, const int (&x)[8], float dx) {
  int lo = 0, hi = 0;
  for (int i = 0; i < 4; ++i) {
    lo = dot4(static_cast<int>(u.q[i]), x[i], lo);
    hi = dot4(static_cast<int>(u.q[4 + i]), x[4 + i], hi);
  }
  return (u.d * dx) * static_cast<float>(u.sc0 * lo + u.sc1 * hi);
}

/// q2_K: unit u = (h, k) = (u / 4, u % 4): elements 128h + 32k + l, bits 2k of qs[32h + l]; scale
/// and min bytes 2u, 2u + 1 (16 elements each). Term: dx (d (sc0 isum_lo + sc1 isum_hi) - dmin msum),
/// msum = m0 xsum_lo + m1 xsum_hi by dp4a against the mins replicated in every byte (the layout's
/// sums per 32 would need a split, and their load cost the 1-2 column kernels spilled registers).
struct FastQ2_K {
  static constexpr int kBlock = 256, kBytes = 84, kUnitsPerBlock = 8;
  static constexpr int kActScaleBlock = 256;
  static constexpr bool kActSums = false;
  static constexpr bool kWideDecode = true;  ///< more registers per thread (mat_vec_fast.cu)
  struct Unit {
    uint32_t q[8];
    uint32_t scales;  // bytes 2u, 2u + 1 as one word: registers are the 1-2 column kernels' limit
    float d, dmin;
  };
  LOOM_HD static Unit decode(const uint8_t* b, int p) {
    Unit u;
    uint32_t raw[8];
    load_words_a2(b + 16 + 32 * (p / 4), raw);
    const unsigned shift = 2u * static_cast<unsigned>(p % 4);
    for (int i = 0; i < 8; ++i) u.q[i] = (raw[i] >> shift) & 0x03030303u;
    u.scales = load_u16_a2(b + 2 * p);
    u.d = half_to_float(load_u16_a2(b + 80));
    u.dmin = half_to_float(load_u16_a2(b + 82));
    return u;
  }
  LOOM_HD static int sc0(const Unit& u) { return static_cast<int>(u.scales & 0xFu); }
  LOOM_HD static int m0(const Unit& u) { return static_cast<int>((u.scales >> 4) & 0xFu); }
  LOOM_HD static int sc1(const Unit& u) { return static_cast<int>((u.scales >> 8) & 0xFu); }
  LOOM_HD static int m1(const Unit& u) { return static_cast<int>(u.scales >> 12); }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int /*xsum*/) {
    int lo = 0, hi = 0, msum = 0;
    const int m_lo = m0(u) * 0x01010101, m_hi = m1(u) * 0x01010101;
    for (int i = 0; i < 4; ++i) {
      lo = dot4(static_cast<int>(u.q[i]), x[i], lo);
      hi = dot4(static_cast<int>(u.q[4 + i]), x[4 + i], hi);
      msum = dot4(m_lo, x[i], msum);
      msum = dot4(m_hi, x[4 + i], msum);
    }
    return dx * (u.d * static_cast<float>(sc0(u) * lo + sc1(u) * hi) - u.dmin * static_cast<float>(msum));
  }
};

/// q3_K: unit u = (h, k) as q2_K's (2-bit codes at 32), high bit u of hmask[l], code - 4; scales
/// of sub-blocks 2u, 2u + 1 (minus 32).
struct FastQ3_K {
  static constexpr int kBlock = 256, kBytes = 110, kUnitsPerBlock = 8;
  static constexpr int kActScaleBlock = 256;
  static constexpr bool kActSums = false;
  static constexpr bool kWideDecode = true;
  using Unit = FastScaledUnit;
  LOOM_HD static Unit decode(const uint8_t* b, int p) {
    Unit u;
    const unsigned shift = 2u * static_cast<unsigned>(p % 4);
    // four words of each array at a time: all 16 (plus the shifts' spare words) live at once
    // spilled in the 1-2 column kernels (40 registers)
    for (int h = 0; h < 2; ++h) {
      uint32_t lo[4], hm[4];
      load_words_a2(b + 32 + 32 * (p / 4) + 16 * h, lo);
      load_words_a2(b + 16 * h, hm);
      for (int i = 0; i < 4; ++i)
        u.q[4 * h + i] =
            threebits_minus_4(((lo[i] >> shift) & 0x03030303u) | (((hm[i] >> p) & 0x01010101u) << 2));
    }
    // sub-blocks 2p and 2p + 1 keep their low nibbles in adjacent bytes 96 + (2p % 8) and their high
    // bits in adjacent bytes 104 + (2p % 4), at the same shifts: two 16-bit loads for both scales
    const uint32_t lo = load_u16_a2(b + 96 + (2 * p) % 8) >> (4 * (p / 4));
    const uint32_t hi = load_u16_a2(b + 104 + (2 * p) % 4) >> (2 * (p / 2));
    const uint32_t sc = (lo & 0x0F0Fu) | ((hi & 0x0303u) << 4);
    u.sc0 = static_cast<int>(sc & 0xFFu) - 32;
    u.sc1 = static_cast<int>(sc >> 8) - 32;
    u.d = half_to_float(load_u16_a2(b + 108));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int /*xsum*/) {
    return scaled_unit_dot(u, x, dx);
  }
};

/// q5_K: unit s = sub-block s: nibble s % 2 of qs[32(s/2) + l] (at 48), fifth bit s of qh[l] (at
/// 16); q4_K's scale and min. Term as q4_K's.
struct FastQ5_K {
  static constexpr int kBlock = 256, kBytes = 176, kUnitsPerBlock = 8;
  static constexpr int kActScaleBlock = 256;
  static constexpr bool kActSums = true;
  static constexpr bool kWideDecode = true;  ///< more registers per thread (mat_vec_fast.cu)
  using Unit = FastQ4_K::Unit;
  LOOM_HD static Unit decode(const uint8_t* b, int s) {
    Unit u;
    uint32_t raw[8], qh[8];
    load_words_a16(b + 48 + 32 * (s / 2), raw);
    load_words_a16(b + 16, qh);
    const unsigned shift = (s & 1) * 4u;
    for (int i = 0; i < 8; ++i)
      u.q[i] = ((raw[i] >> shift) & 0x0f0f0f0fu) | (((qh[i] >> s) & 0x01010101u) << 4);
    int sc, m;
    q4k_scale_min(s, b + 4, sc, m);
    u.d_sc = half_to_float(load_u16_a2(b)) * static_cast<float>(sc);
    u.dmin_m = half_to_float(load_u16_a2(b + 2)) * static_cast<float>(m);
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int xsum) {
    return FastQ4_K::dot(u, x, dx, xsum);
  }
};

/// iq4_xs: unit s = sub-block s: its 16 bytes at 8 + 16s as an iq4_nl block's; one scale ls - 32.
/// Blocks are 8-byte aligned wherever they are read (16-byte aligned rows of 136-byte blocks, in global
/// memory or a stage): the 8-byte header (d, scales_h, scales_l) and the codes in 8-byte loads, nothing
/// read past the block (mat_vec_direct_unit_kernel reads rows in place).
struct FastIQ4_XS {
  static constexpr int kBlock = 256, kBytes = 136, kUnitsPerBlock = 8;
  static constexpr int kActScaleBlock = 256;
  static constexpr bool kActSums = false;
  using Unit = FastScaledUnit;
  LOOM_HD static Unit decode(const uint8_t* b, int s) {
    Unit u;
    uint32_t head[2], raw[4];
    load_words_a8(b, head);
    load_words_a8(b + 8 + 16 * s, raw);
    const CodeBook16 book = iq4nl_book();
    for (int i = 0; i < 4; ++i) {
      u.q[i] = book_lookup4(book, raw[i] & 0x0f0f0f0fu);
      u.q[4 + i] = book_lookup4(book, (raw[i] >> 4) & 0x0f0f0f0fu);
    }
    // iq4xs_scale_of from the header's words: low nibble s % 2 of scales_l[s / 2], bits 2 s of scales_h
    const uint32_t ls = ((head[1] >> (8 * (s / 2) + 4 * (s % 2))) & 0xFu) | (((head[0] >> (16 + 2 * s)) & 3u) << 4);
    u.sc0 = u.sc1 = static_cast<int>(ls) - 32;
    u.d = half_to_float(static_cast<uint16_t>(head[0] & 0xffffu));
    return u;
  }
  LOOM_HD static float dot(const Unit& u, const int (&x)[8], float dx, int /*xsum*/) {
    return scaled_unit_dot(u, x, dx);
  }
};

/// Where a column's quantized activations lie in the scratch (rows in (j, i2, i3) order, k each):
/// codes[rows * k], then scales[rows * k / block] (float), then, where the format reads them (q4_K,
/// q5_K), the int16 sum of each 32 codes [rows * k / 32]. A layout of 256-blocks with the sums serves
/// every 256-block format (the others read the same codes and scales, not the sums); every 32-block
/// format reads the same layout. The norm and flash-decoding's merge that write it in place of their
/// f32 output (fused.cu, attention_decode.cu) and the quantize kernel (mat_vec_fast.cu) share
/// act_fast_at, act_fast_scale, act_fast_inverse and act_fast_code.
struct ActFastRaw {
  int8_t* codes;
  float* scales;
  int16_t* sums;
};
LOOM_HD ActFastRaw act_fast_at(void* base, int64_t rows, int64_t k, int block) {
  auto* p = static_cast<char*>(base);
  return {reinterpret_cast<int8_t*>(p), reinterpret_cast<float*>(p + rows * k),
          reinterpret_cast<int16_t*>(p + rows * k + rows * (k / block) * static_cast<int64_t>(sizeof(float)))};
}
LOOM_HD size_t act_fast_size(int64_t rows, int64_t k, int block, bool sums) {
  return static_cast<size_t>(rows * k) + static_cast<size_t>(rows * (k / block)) * sizeof(float) +
         (sums ? static_cast<size_t>(rows * (k / kFastUnit)) * sizeof(int16_t) : 0);
}
/// A block's scale from its largest magnitude, and the factor its codes are formed with.
LOOM_HD float act_fast_scale(float amax) { return amax / 127.0f; }
LOOM_HD float act_fast_inverse(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }
#ifdef __CUDACC__
__device__ __forceinline__ int act_fast_code(float x, float inverse) {
  return max(-127, min(127, __float2int_rn(x * inverse)));
}
#endif

/// The layout for Q's weights: its activation block, and the sums where Q reads them.
template <class Q>
struct ActFastLayout : ActFastRaw {
  LOOM_HD static size_t bytes(int64_t rows, int64_t k) { return act_fast_size(rows, k, Q::kActScaleBlock, Q::kActSums); }
  LOOM_HD static ActFastLayout at(void* base, int64_t rows, int64_t k) {
    return {act_fast_at(base, rows, k, Q::kActScaleBlock)};
  }
};

}  // namespace loom::cuda
