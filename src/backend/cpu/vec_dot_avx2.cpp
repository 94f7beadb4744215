// AVX2 + FMA + F16C dot products. This file alone is compiled with -mavx2 -mfma -mf16c and is only
// called after a run-time CPU check (vec_dot.cpp), so it must not define inline or template code
// that other files could share through the linker: everything here lives in an anonymous namespace
// and uses intrinsics rather than standard-library helpers.
//
// Every kernel takes up to kDotMaxCols activation rows so a weight block is loaded and unpacked
// once and multiplied against all of them. Quantized kernels use the unsigned x signed byte
// multiply (vpmaddubsw) on whole blocks: per-block sums are exact integers, then scaled and
// accumulated in double (vec_dot.h: the same rounding as the scalar and CUDA kernels).
#include "vec_dot.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>
#include <immintrin.h>

namespace loom::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half(uint16_t h) { return _cvtsh_ss(h); }

// Sums adjacent int16 pairs into int32.
inline __m256i pair_sum(__m256i v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }

template <typename T>
inline const T* col(const void* const* xs, int c) {
  return static_cast<const T*>(xs[c]);
}

// ---- float types ------------------------------------------------------------------------------------

// Loads 8 weights as f32. Weight/activation element types differ per kernel.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {  // f16
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
struct Bf16 {
  const uint16_t* p;
};
inline __m256 load8(Bf16 b) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t h) { return half(h); }
inline float to_f32(Bf16 b) {
  const uint32_t u = static_cast<uint32_t>(*b.p) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// U = 4 chains of 8 lanes per column keep the FMA latency covered with a single column. The
// summation order is the same whatever the number of columns (callers take at most two at a time),
// so a token's result does not depend on how many tokens share its batch: a rewound and refilled
// context reproduces a fresh one bit for bit.
template <int NC, typename WT, typename XT, bool kWBf16>
void dot_float(int64_t n, const void* wv, const void* const* xs, float* out) {
  static_assert(NC <= 2, "4 chains x 2 columns fill 8 of the 16 vector registers");
  constexpr int U = 4;
  const WT* w = static_cast<const WT*>(wv);
  const XT* x[NC];
  for (int c = 0; c < NC; ++c) x[c] = col<XT>(xs, c);
  __m256 acc[NC][U];
  for (int c = 0; c < NC; ++c)
    for (int u = 0; u < U; ++u) acc[c][u] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 * U <= n; i += 8 * U) {
    for (int u = 0; u < U; ++u) {
      __m256 wf;
      if constexpr (kWBf16)
        wf = load8(Bf16{reinterpret_cast<const uint16_t*>(w) + i + 8 * u});
      else
        wf = load8(w + i + 8 * u);
      for (int c = 0; c < NC; ++c) acc[c][u] = _mm256_fmadd_ps(wf, load8(x[c] + i + 8 * u), acc[c][u]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    __m256 s = acc[c][0];
    for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, acc[c][u]);
    float r = hsum(s);
    for (int64_t k = i; k < n; ++k) {
      float wk;
      if constexpr (kWBf16)
        wk = to_f32(Bf16{reinterpret_cast<const uint16_t*>(w) + k});
      else
        wk = to_f32(w[k]);
      r += wk * to_f32(x[c][k]);
    }
    out[c] = r;
  }
}

// ---- q8_0 / q4_0 ------------------------------------------------------------------------------------

inline __m256i unpack_q4_0(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  // low nibbles are elements 0-15, high nibbles 16-31
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

// The 32-element formats, each loading block b of a row as 32 codes (signed bytes, or unsigned for
// the offset formats) and its scale d (and offset m).
struct FmtQ8_0 {
  static __m256i load(const void* w, int64_t b, float& d) {
    const BlockQ8_0& blk = static_cast<const BlockQ8_0*>(w)[b];
    d = half(blk.d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
  }
};
struct FmtQ4_0 {
  static __m256i load(const void* w, int64_t b, float& d) {
    const BlockQ4_0& blk = static_cast<const BlockQ4_0*>(w)[b];
    d = half(blk.d);
    return unpack_q4_0(blk.qs);
  }
};

// Nibbles of a Q4_0-style 16-byte array: elements 0-15 low, 16-31 high, as bytes 0..15.
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}
// Bit i of the little-endian word at qh as 0x10 in byte i (the fifth bit of Q5_0/Q5_1 codes).
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t h;
  __builtin_memcpy(&h, qh, 4);
  const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}
// A 16-entry code book looked up by nibble.
inline __m256i lookup(const uint8_t* qs, const int8_t* table) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return _mm256_shuffle_epi8(t, nibbles(qs));
}

struct FmtQ5_0 {
  static __m256i load(const void* w, int64_t b, float& d) {
    const BlockQ5_0& blk = static_cast<const BlockQ5_0*>(w)[b];
    d = half(blk.d);
    return _mm256_sub_epi8(_mm256_or_si256(nibbles(blk.qs), fifth_bits(blk.qh)), _mm256_set1_epi8(16));
  }
};
struct FmtIQ4_NL {
  static __m256i load(const void* w, int64_t b, float& d) {
    const BlockIQ4_NL& blk = static_cast<const BlockIQ4_NL*>(w)[b];
    d = half(blk.d);
    return lookup(blk.qs, kIQ4NLValues);
  }
};
struct FmtMXFP4 {
  static __m256i load(const void* w, int64_t b, float& d) {
    const BlockMXFP4& blk = static_cast<const BlockMXFP4*>(w)[b];
    d = e8m0_to_f32_half(blk.e);
    return lookup(blk.qs, kMXFP4Values);
  }
};
// The offset formats: unsigned codes, x = d * code + m.
struct FmtQ4_1 {
  static __m256i load(const void* w, int64_t b, float& d, float& m) {
    const BlockQ4_1& blk = static_cast<const BlockQ4_1*>(w)[b];
    d = half(blk.d);
    m = half(blk.m);
    return nibbles(blk.qs);
  }
};
struct FmtQ5_1 {
  static __m256i load(const void* w, int64_t b, float& d, float& m) {
    const BlockQ5_1& blk = static_cast<const BlockQ5_1*>(w)[b];
    d = half(blk.d);
    m = half(blk.m);
    return _mm256_or_si256(nibbles(blk.qs), fifth_bits(blk.qh));
  }
};

// Exact int32 totals of four vectors of eight int32 each: [sum a, sum b, sum c, sum d].
inline __m128i hsum4_i32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline double hsum_pd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// Four blocks per step: each block's products summed exactly in int32 (vpmaddubsw pairs, vpmaddwd
// pairs, then one horizontal add across the four blocks), scaled and accumulated in double (the
// contract in vec_dot.h). dw * dx is a product of two f16 values, exact in float.
template <int NC, typename Fmt>
void dot_q8_0_blocks(int64_t n, const void* wv, const void* const* xs, float* out) {
  const BlockQ8_0* x[NC];
  __m256d acc[NC];
  double tail[NC];
  for (int c = 0; c < NC; ++c) {
    x[c] = col<BlockQ8_0>(xs, c);
    acc[c] = _mm256_setzero_pd();
    tail[c] = 0.0;
  }
  const int64_t nb = n / kQK8_0;
  // vpmaddubsw wants its first operand unsigned: use |w| and move w's sign onto x
  // (|w| <= 128 and |x| <= 127 keep each pair sum inside int16)
  auto sums = [&](__m256i wabs, __m256i wq, const BlockQ8_0& xb) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
    return pair_sum(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, wq)));
  };
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i wq[4], wabs[4];
    float dw[4];
    for (int k = 0; k < 4; ++k) {
      wq[k] = Fmt::load(wv, b + k, dw[k]);
      wabs[k] = _mm256_sign_epi8(wq[k], wq[k]);
    }
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_0* xb = x[c] + b;
      const __m128i tot = hsum4_i32(sums(wabs[0], wq[0], xb[0]), sums(wabs[1], wq[1], xb[1]),
                                    sums(wabs[2], wq[2], xb[2]), sums(wabs[3], wq[3], xb[3]));
      // in double: exact, also for MXFP4's power-of-two scales beyond the float range's product
      const __m256d scale = _mm256_mul_pd(_mm256_setr_pd(dw[0], dw[1], dw[2], dw[3]),
                                          _mm256_setr_pd(half(xb[0].d), half(xb[1].d), half(xb[2].d), half(xb[3].d)));
      acc[c] = _mm256_fmadd_pd(_mm256_cvtepi32_pd(tot), scale, acc[c]);
    }
  }
  for (; b < nb; ++b) {
    float dw;
    const __m256i wq = Fmt::load(wv, b, dw);
    const __m256i wabs = _mm256_sign_epi8(wq, wq);
    for (int c = 0; c < NC; ++c)
      tail[c] += static_cast<double>(hsum_i32(sums(wabs, wq, x[c][b]))) * (static_cast<double>(dw) * half(x[c][b].d));
  }
  for (int c = 0; c < NC; ++c) out[c] = static_cast<float>(hsum_pd(acc[c]) + tail[c]);
}

// Q4_1 / Q5_1: per block dx * (d * sum q*xq + m * sum xq), codes unsigned (vpmaddubsw takes them
// as they are); sum xq through a multiply by ones.
template <int NC, typename Fmt>
void dot_offset_blocks(int64_t n, const void* wv, const void* const* xs, float* out) {
  double acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = 0.0;
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    float d, m;
    const __m256i wq = Fmt::load(wv, b, d, m);
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_0& xb = col<BlockQ8_0>(xs, c)[b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      const int32_t isum = hsum_i32(pair_sum(_mm256_maddubs_epi16(wq, xq)));
      const int32_t xsum = hsum_i32(pair_sum(_mm256_maddubs_epi16(ones, xq)));
      acc[c] += static_cast<double>(half(xb.d)) * (static_cast<double>(d) * isum + static_cast<double>(m) * xsum);
    }
  }
  for (int c = 0; c < NC; ++c) out[c] = static_cast<float>(acc[c]);
}

// ---- q4_K -------------------------------------------------------------------------------------------

// Unpacks the 8 six-bit scales and mins of a Q4_K block (layout in loom/dtype.h).
inline void q4k_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
    m[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// Q4_K, and Q5_K with the fifth bit of sub-block j's codes in bit j of qh[l].
template <int NC, bool kQ5>
void dot_q4_k(int64_t n, const void* wv, const void* const* xs, float* out) {
  const BlockQ8_K* x[NC];
  double acc[NC];
  for (int c = 0; c < NC; ++c) {
    x[c] = col<BlockQ8_K>(xs, c);
    acc[c] = 0.0;
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    // the fields shared by both layouts
    const uint8_t *scales, *qs, *qh = nullptr;
    f16_bits dh, dminh;
    if constexpr (kQ5) {
      const BlockQ5_K& blk = static_cast<const BlockQ5_K*>(wv)[b];
      scales = blk.scales;
      qs = blk.qs;
      qh = blk.qh;
      dh = blk.d;
      dminh = blk.dmin;
    } else {
      const BlockQ4_K& blk = static_cast<const BlockQ4_K*>(wv)[b];
      scales = blk.scales;
      qs = blk.qs;
      dh = blk.d;
      dminh = blk.dmin;
    }
    uint8_t sc[8], m[8];
    q4k_scales(scales, sc, m);
    // each min covers two 16-element bsums
    const __m256i mins = _mm256_setr_epi16(m[0], m[0], m[1], m[1], m[2], m[2], m[3], m[3], m[4], m[4], m[5],
                                           m[5], m[6], m[6], m[7], m[7]);
    __m256i hbits;
    if constexpr (kQ5) hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    __m256i isum[NC];
    for (int c = 0; c < NC; ++c) isum[c] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * p));
      __m256i lo = _mm256_and_si256(raw, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if constexpr (kQ5) {  // bit 2p of qh[l] tops the low nibble, bit 2p + 1 the high one
        const __m256i m_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * p)));
        const __m256i m_hi = _mm256_set1_epi8(static_cast<char>(2 << (2 * p)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, m_lo), m_lo), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, m_hi), m_hi), bit4));
      }
      const __m256i sc_lo = _mm256_set1_epi16(sc[2 * p]);
      const __m256i sc_hi = _mm256_set1_epi16(sc[2 * p + 1]);
      for (int c = 0; c < NC; ++c) {
        const int8_t* xq = x[c][b].qs + 64 * p;
        const __m256i plo =
            _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
        const __m256i phi =
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32)));
        isum[c] = _mm256_add_epi32(
            isum[c], _mm256_add_epi32(_mm256_madd_epi16(plo, sc_lo), _mm256_madd_epi16(phi, sc_hi)));
      }
    }
    const float d = half(dh), dmin = half(dminh);
    for (int c = 0; c < NC; ++c) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[c][b].bsums));
      const int32_t msum = hsum_i32(_mm256_madd_epi16(bs, mins));
      acc[c] += block_term_k(x[c][b].d, d, hsum_i32(isum[c]), dmin, msum);
    }
  }
  for (int c = 0; c < NC; ++c) out[c] = static_cast<float>(acc[c]);
}

// ---- q6_K -------------------------------------------------------------------------------------------

template <int NC>
void dot_q6_k(int64_t n, const void* wv, const void* const* xs, float* out) {
  const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
  const BlockQ8_K* x[NC];
  double acc[NC];
  for (int c = 0; c < NC; ++c) {
    x[c] = col<BlockQ8_K>(xs, c);
    acc[c] = 0.0;
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    __m256i isum[NC];
    for (int c = 0; c < NC; ++c) isum[c] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[b].ql + 64 * h;
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qh + 32 * h));
      // the four 32-element groups of this half, codes 0..63 (bias 32 removed through bsums)
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
      const int8_t* sc = w[b].scales + 8 * h;
      __m256i scale[4];
      for (int k = 0; k < 4; ++k)  // elements 0-15 of a group use sc[2k], 16-31 use sc[2k+1]
        scale[k] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
      for (int c = 0; c < NC; ++c) {
        const int8_t* xq = x[c][b].qs + 128 * h;
        for (int k = 0; k < 4; ++k) {
          const __m256i p =
              _mm256_maddubs_epi16(q[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * k)));
          isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, scale[k]));
        }
      }
    }
    const __m256i scales16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales)));
    const float d = half(w[b].d);
    for (int c = 0; c < NC; ++c) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[c][b].bsums));
      const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bs, scales16), 5);  // 32 * sum sc*bsum
      acc[c] += block_term_k(x[c][b].d, d, hsum_i32(_mm256_sub_epi32(isum[c], bias)), 0.0f, 0);
    }
  }
  for (int c = 0; c < NC; ++c) out[c] = static_cast<float>(acc[c]);
}

// ---- q2_K, q3_K, iq4_xs: eight groups of 32 codes, a scale (and min) per 16 ----------------------

// Each format fills sub-block scales and mins (int16, 16 of each), d and dmin, and yields the 32
// codes of group g (elements 32g..32g+31): unsigned, or signed where kSigned.
struct FmtQ2_K {
  static constexpr bool kSigned = false;
  static void prepare(const void* w, int64_t b, int16_t* sc, int16_t* m, float& d, float& dmin) {
    const BlockQ2_K& blk = static_cast<const BlockQ2_K*>(w)[b];
    for (int s = 0; s < 16; ++s) {
      sc[s] = static_cast<int16_t>(blk.scales[s] & 0xF);
      m[s] = static_cast<int16_t>(blk.scales[s] >> 4);
    }
    d = half(blk.d);
    dmin = half(blk.dmin);
  }
  static __m256i codes(const void* w, int64_t b, int g) {
    const BlockQ2_K& blk = static_cast<const BlockQ2_K*>(w)[b];
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * (g / 4)));
    return _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * (g % 4))), _mm256_set1_epi8(3));
  }
};
// Q3_K's codes q - 4*(1 - hbit) are taken as u = q + 4*hbit in [0, 7] with 4 per element moved into
// the min term: min 4*sc against d (dmin = d gives the same exact integers as the scalar kernel).
struct FmtQ3_K {
  static constexpr bool kSigned = false;
  static void prepare(const void* w, int64_t b, int16_t* sc, int16_t* m, float& d, float& dmin) {
    const BlockQ3_K& blk = static_cast<const BlockQ3_K*>(w)[b];
    for (int s = 0; s < 16; ++s) {
      sc[s] = static_cast<int16_t>(q3k_scale(s, blk.scales) - 32);
      m[s] = static_cast<int16_t>(4 * sc[s]);
    }
    d = dmin = half(blk.d);
  }
  static __m256i codes(const void* w, int64_t b, int g) {
    const BlockQ3_K& blk = static_cast<const BlockQ3_K*>(w)[b];
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * (g / 4)));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * (g % 4))), _mm256_set1_epi8(3));
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.hmask));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << g));
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), _mm256_set1_epi8(4)));
  }
};
struct FmtIQ4_XS {
  static constexpr bool kSigned = true;
  static void prepare(const void* w, int64_t b, int16_t* sc, int16_t* m, float& d, float& dmin) {
    const BlockIQ4_XS& blk = static_cast<const BlockIQ4_XS*>(w)[b];
    for (int j = 0; j < 8; ++j) {
      sc[2 * j] = sc[2 * j + 1] = static_cast<int16_t>(iq4xs_scale(j, blk) - 32);
      m[2 * j] = m[2 * j + 1] = 0;
    }
    d = half(blk.d);
    dmin = 0.0f;
  }
  static __m256i codes(const void* w, int64_t b, int g) {
    return lookup(static_cast<const BlockIQ4_XS*>(w)[b].qs + 16 * g, kIQ4NLValues);
  }
};

template <int NC, typename Fmt>
void dot_k16(int64_t n, const void* wv, const void* const* xs, float* out) {
  const BlockQ8_K* x[NC];
  double acc[NC];
  for (int c = 0; c < NC; ++c) {
    x[c] = col<BlockQ8_K>(xs, c);
    acc[c] = 0.0;
  }
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    alignas(32) int16_t sc[16], m[16];
    float d, dmin;
    Fmt::prepare(wv, b, sc, m, d, dmin);
    __m256i isum[NC];
    for (int c = 0; c < NC; ++c) isum[c] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const __m256i q = Fmt::codes(wv, b, g);
      // vpmaddubsw wants its first operand unsigned: signed codes lend their sign to x
      // (|q| <= 127 and |x| <= 127 keep each pair sum inside int16)
      const __m256i qa = Fmt::kSigned ? _mm256_sign_epi8(q, q) : q;
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g]));
      for (int c = 0; c < NC; ++c) {
        __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[c][b].qs + 32 * g));
        if (Fmt::kSigned) xq = _mm256_sign_epi8(xq, q);
        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, xq), scale));
      }
    }
    const __m256i mins = _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
    for (int c = 0; c < NC; ++c) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[c][b].bsums));
      const int32_t msum = hsum_i32(_mm256_madd_epi16(bs, mins));
      acc[c] += block_term_k(x[c][b].d, d, hsum_i32(isum[c]), dmin, msum);
    }
  }
  for (int c = 0; c < NC; ++c) out[c] = static_cast<float>(acc[c]);
}

// ---- dispatch over the column count ----------------------------------------------------------------

template <template <int> class K>
void by_cols(int64_t n, const void* w, const void* const* xs, int nc, float* out) {
  switch (nc) {
    case 1:
      K<1>::run(n, w, xs, out);
      return;
    case 2:
      K<2>::run(n, w, xs, out);
      return;
    case 3:
      K<3>::run(n, w, xs, out);
      return;
    default:
      K<4>::run(n, w, xs, out);
      return;
  }
}

// Float dots take columns two at a time (dot_float's order is fixed; see there).
template <int NC, typename WT, typename XT, bool kWBf16>
void dot_float_pairs(int64_t n, const void* w, const void* const* x, float* o) {
  int c = 0;
  for (; c + 2 <= NC; c += 2) dot_float<2, WT, XT, kWBf16>(n, w, x + c, o + c);
  if (c < NC) dot_float<1, WT, XT, kWBf16>(n, w, x + c, o + c);
}
template <int NC>
struct F32 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_float_pairs<NC, float, float, false>(n, w, x, o);
  }
};
template <int NC>
struct F16 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_float_pairs<NC, uint16_t, float, false>(n, w, x, o);
  }
};
template <int NC>
struct F16F16 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_float_pairs<NC, uint16_t, uint16_t, false>(n, w, x, o);
  }
};
template <int NC>
struct BF16 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_float_pairs<NC, uint16_t, float, true>(n, w, x, o);
  }
};
template <int NC>
struct Q8_0 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_q8_0_blocks<NC, FmtQ8_0>(n, w, x, o);
  }
};
template <int NC>
struct Q4_0 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_q8_0_blocks<NC, FmtQ4_0>(n, w, x, o);
  }
};
template <int NC>
struct Q5_0 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_q8_0_blocks<NC, FmtQ5_0>(n, w, x, o);
  }
};
template <int NC>
struct IQ4_NL {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_q8_0_blocks<NC, FmtIQ4_NL>(n, w, x, o);
  }
};
template <int NC>
struct MXFP4 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_q8_0_blocks<NC, FmtMXFP4>(n, w, x, o);
  }
};
template <int NC>
struct Q2_K {
  static void run(int64_t n, const void* w, const void* const* x, float* o) { dot_k16<NC, FmtQ2_K>(n, w, x, o); }
};
template <int NC>
struct Q3_K {
  static void run(int64_t n, const void* w, const void* const* x, float* o) { dot_k16<NC, FmtQ3_K>(n, w, x, o); }
};
template <int NC>
struct IQ4_XS {
  static void run(int64_t n, const void* w, const void* const* x, float* o) { dot_k16<NC, FmtIQ4_XS>(n, w, x, o); }
};
template <int NC>
struct Q4_1 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_offset_blocks<NC, FmtQ4_1>(n, w, x, o);
  }
};
template <int NC>
struct Q5_1 {
  static void run(int64_t n, const void* w, const void* const* x, float* o) {
    dot_offset_blocks<NC, FmtQ5_1>(n, w, x, o);
  }
};
template <int NC>
struct Q4_K {
  static void run(int64_t n, const void* w, const void* const* x, float* o) { dot_q4_k<NC, false>(n, w, x, o); }
};
template <int NC>
struct Q5_K {
  static void run(int64_t n, const void* w, const void* const* x, float* o) { dot_q4_k<NC, true>(n, w, x, o); }
};
template <int NC>
struct Q6_K {
  static void run(int64_t n, const void* w, const void* const* x, float* o) { dot_q6_k<NC>(n, w, x, o); }
};

// ---- activation conversions -------------------------------------------------------------------------

void from_float_f32(const float* x, void* y, int64_t n) { __builtin_memcpy(y, x, n * sizeof(float)); }

void from_float_f16(const float* x, void* y, int64_t n) {
  auto out = static_cast<uint16_t*>(y);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

inline float abs_max(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rounds 32 floats times `id` to nearest-even bytes in [-127, 127] (the same arithmetic as the
// scalar quantizers, so both paths give identical blocks).
inline void round_32(const float* x, float id, int8_t* q) {
  const __m256 vid = _mm256_set1_ps(id);
  __m256i v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid));
  const __m256i p01 = _mm256_packs_epi32(v[0], v[1]);
  const __m256i p23 = _mm256_packs_epi32(v[2], v[3]);
  __m256i p = _mm256_packs_epi16(p01, p23);
  // the packs interleave 128-bit lanes: restore element order
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  p = _mm256_max_epi8(p, _mm256_set1_epi8(-127));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p);
}

void from_float_q8_0(const float* x, void* yv, int64_t n) {
  auto y = static_cast<BlockQ8_0*>(yv);
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    // capped at f16's largest value like the scalar quantizer, so both give identical blocks
    const float d = std::min(abs_max(x, kQK8_0) / 127.0f, 65504.0f);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    round_32(x, id, y[b].qs);
  }
}

void from_float_q8_k(const float* x, void* yv, int64_t n) {
  auto y = static_cast<BlockQ8_K*>(yv);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    const float d = abs_max(x, kQK_K) / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    y[b].d = d;
    for (int k = 0; k < kQK_K / 32; ++k) round_32(x + 32 * k, id, y[b].qs + 32 * k);
    for (int j = 0; j < kQK_K / 16; ++j) {
      // 16 bytes -> int16 -> pair sums -> total
      const __m256i v =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y[b].qs + 16 * j)));
      __m256i s = pair_sum(v);
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      t = _mm_hadd_epi32(t, t);
      t = _mm_hadd_epi32(t, t);
      y[b].bsums[j] = static_cast<int16_t>(_mm_cvtsi128_si32(t));
    }
  }
}

constexpr VecDotKernel kAvx2[kDTypeCount] = {
    /* f32  */ {ActType::f32, from_float_f32, by_cols<F32>},
    /* f16  */ {ActType::f32, from_float_f32, by_cols<F16>},
    /* bf16 */ {ActType::f32, from_float_f32, by_cols<BF16>},
    /* i32  */ {ActType::f32, nullptr, nullptr},
    /* q8_0 */ {ActType::q8_0, from_float_q8_0, by_cols<Q8_0>},
    /* q4_0 */ {ActType::q8_0, from_float_q8_0, by_cols<Q4_0>},
    /* q4_K */ {ActType::q8_k, from_float_q8_k, by_cols<Q4_K>},
    /* q6_K */ {ActType::q8_k, from_float_q8_k, by_cols<Q6_K>},
    /* q4_1 */ {ActType::q8_0, from_float_q8_0, by_cols<Q4_1>},
    /* q5_0 */ {ActType::q8_0, from_float_q8_0, by_cols<Q5_0>},
    /* q5_1 */ {ActType::q8_0, from_float_q8_0, by_cols<Q5_1>},
    /* q2_K */ {ActType::q8_k, from_float_q8_k, by_cols<Q2_K>},
    /* q3_K */ {ActType::q8_k, from_float_q8_k, by_cols<Q3_K>},
    /* q5_K */ {ActType::q8_k, from_float_q8_k, by_cols<Q5_K>},
    /* iq4_nl */ {ActType::q8_0, from_float_q8_0, by_cols<IQ4_NL>},
    /* iq4_xs */ {ActType::q8_k, from_float_q8_k, by_cols<IQ4_XS>},
    /* mxfp4 */ {ActType::q8_0, from_float_q8_0, by_cols<MXFP4>},
};
static_assert(static_cast<int>(DType::mxfp4) == kDTypeCount - 1, "kAvx2 is indexed by DType");

constexpr VecDotKernel kAvx2F16F16 = {ActType::f16, from_float_f16, by_cols<F16F16>};

}  // namespace

namespace detail {
const VecDotKernel* vec_dot_kernel_avx2_unchecked(DType weight) {
  const VecDotKernel& k = kAvx2[static_cast<size_t>(weight)];
  return k.dot ? &k : nullptr;
}
const VecDotKernel* vec_dot_f16_f16_avx2_unchecked() { return &kAvx2F16F16; }

// Eight halves at a time by vcvtph2ps. Groups holding an infinity, a NaN or a subnormal go through
// the portable conversion instead, so every output bit equals f16_to_f32's (F16C quiets signaling
// NaNs, and MXCSR's denormals-are-zero mode could flush subnormal inputs).
void f16_to_f32_row_avx2(const f16_bits* src, float* dst, int64_t n) {
  const __m128i exp_mask = _mm_set1_epi16(0x7c00), abs_mask = _mm_set1_epi16(0x7fff);
  const __m128i zero = _mm_setzero_si128(), tiny = _mm_set1_epi16(0x0400);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i a = _mm_and_si128(h, abs_mask);
    const __m128i special = _mm_or_si128(_mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask),
                                         _mm_andnot_si128(_mm_cmpeq_epi16(a, zero), _mm_cmplt_epi16(a, tiny)));
    if (_mm_movemask_epi8(special) != 0) {
      for (int64_t k = i; k < i + 8; ++k) dst[k] = f16_to_f32(src[k]);
      continue;
    }
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
F16RowFn f16_to_f32_row_avx2_unchecked() { return f16_to_f32_row_avx2; }
}  // namespace detail

}  // namespace loom::cpu

#else  // not an AVX2 build target

namespace loom::cpu::detail {
const VecDotKernel* vec_dot_kernel_avx2_unchecked(DType) { return nullptr; }
const VecDotKernel* vec_dot_f16_f16_avx2_unchecked() { return nullptr; }
F16RowFn f16_to_f32_row_avx2_unchecked() { return nullptr; }
}  // namespace loom::cpu::detail

#endif
