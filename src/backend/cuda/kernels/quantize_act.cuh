// Activations quantized to 8 bits per block, and the integer dot products of quantized weight
// blocks with them: the arithmetic of the CPU backend, so that both backends give the same logits.
//
// The CPU quantizes each activation row before a quantized mul_mat (src/core/quant_basic.cpp:
// quantize_row_q8_0 for q8_0/q4_0 weights, quantize_row_q8_k for the K-quants) and sums each
// block's products in integers (src/backend/cpu/vec_dot.cpp's scalar kernels). Dequantizing the
// weights and multiplying f32 activations instead differs from that by the activations' rounding
// error, which measured NMSE 5e-4..1e-3 on whole-model logits. Here the quantizer reproduces the
// CPU's blocks bit for bit and the dots reproduce its integer sums exactly; the per-block terms are
// formed and summed in double as on the CPU (vec_dot.h), so the float both round the row's sum to
// is the same although the order of the sums differs (docs/NUMERICS.md).
//
// Everything is __host__ __device__ (intrinsics have plain host fallbacks) so that a host compiler
// can check it against the CPU code. Includes nothing outside src/backend/cuda/ but cuda_fp16.h.
//
// Dot formats: struct DotXxx per weight type, with kBlock elements and kBytes bytes per weight
// block, the activation block type Act, and kParts lanes sharing a block: decode(block, part)
// unpacks a lane's share of the weights once, dot(part_weights, x, part) gives that share's term
// of the dot with one activation block; the terms of all parts sum to the block's contribution.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom::cuda {

// ---- arithmetic with fixed rounding ----------------------------------------------------------------
// The device versions name the IEEE round-to-nearest operations so that no compiler flag
// (-use_fast_math, -prec-div=false) can change the quantizer's scales.

LOOM_HD float fadd_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LOOM_HD float fsub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LOOM_HD float fmul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LOOM_HD float fdiv_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

LOOM_HD float reciprocal_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(a);
#else
  return 1.0f / a;
#endif
}

/// c + the sum of the products of the four signed bytes of a and b (dp4a).
LOOM_HD int dot4(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i)) *
         static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
  return c;
#endif
}

/// Bytewise a - b, each byte wrapping on its own (no borrow between bytes), as an int for dot4.
LOOM_HD int sub_bytes(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(__vsub4(a, b));
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
  return static_cast<int>(r);
#endif
}

LOOM_HD float half_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
LOOM_HD uint16_t float_to_half(float v) { return __half_as_ushort(__float2half_rn(v)); }

/// Little-endian 16-bit load from a 2-byte aligned address.
LOOM_HD uint16_t load_u16_a2(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}

/// 32-bit load from a 2-byte aligned address: weight blocks of 34, 18 and 210 bytes only promise
/// that, so the words are read as two halves.
LOOM_HD uint32_t load_u32_a2(const uint8_t* p) {
  return load_u16_a2(p) | (static_cast<uint32_t>(load_u16_a2(p + 2)) << 16);
}

/// 32-bit load from a 4-byte aligned address (the activation blocks below).
LOOM_HD int load_i32_a4(const int8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const int*>(p);
#else
  int v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}

// ---- activation blocks -----------------------------------------------------------------------------

/// 32 activations: x ~ qs[i] * d. The CPU's BlockQ8_0 plus two bytes that align qs for 32-bit loads.
struct ActQ8_0 {
  uint16_t d;  ///< f16 scale
  uint16_t unused;
  int8_t qs[32];
};
static_assert(sizeof(ActQ8_0) == 36, "ActQ8_0 is 36 bytes");

/// 256 activations for the K-quants: x ~ qs[i] * d, bsums[j] = sum of qs[16j .. 16j+15]. Byte for
/// byte the CPU's BlockQ8_K.
struct ActQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(ActQ8_K) == 292, "ActQ8_K is the CPU's BlockQ8_K");

/// q8_0 scale from the block's largest magnitude: stored as f16, so it saturates at f16's largest
/// finite value as the CPU's does. The codes use the unrounded value.
LOOM_HD float q8_0_scale(float amax) { return fminf(fdiv_rn(amax, 127.0f), 65504.0f); }
/// q8_K scale: a float, no saturation.
LOOM_HD float q8_k_scale(float amax) { return fdiv_rn(amax, 127.0f); }
LOOM_HD float q8_inverse(float d) { return d > 0.0f ? reciprocal_rn(d) : 0.0f; }

/// Code of one activation: v = x * inverse scale rounded to nearest even, clamped to [-127, 127].
/// The CPU rounds with lrint into a 64-bit long, which on x86 gives LONG_MIN (clamped to -127) for
/// NaN, infinities and magnitudes of 2^63 and more; the device conversion saturates and maps NaN to
/// 0, so those cases are taken first.
LOOM_HD int q8_code(float v) {
  if (!(fabsf(v) < 0x1p63f)) return -127;
#if defined(__CUDA_ARCH__)
  const int r = __float2int_rn(v);  // saturates at the int range; the clamp follows
#else
  const long long wide = std::llrint(v);
  const int r = wide > 127 ? 127 : (wide < -127 ? -127 : static_cast<int>(wide));
#endif
  return r < -127 ? -127 : (r > 127 ? 127 : r);
}

// ---- weight blocks against activation blocks ---------------------------------------------------------

/// Sub-block s (0..7) scale and min of a q4_K block from its 12 packed bytes: the first four
/// sub-blocks keep 6 bits in bytes s and s+4; the last four split theirs into a nibble in byte
/// s+4 and the top 2 bits of bytes s-4 (scale) and s (min). Either way the bytes involved are
/// (s&3), (s&3)+4 and (s&3)+8, so both cases are computed and one selected: no divergent branch
/// when the lanes of a warp decode different sub-blocks.
LOOM_HD void q4k_scale_min_from(int s, int lo, int mid, int hi, int& sc, int& m) {
  sc = s < 4 ? (lo & 63) : ((hi & 0x0f) | ((lo >> 6) << 4));
  m = s < 4 ? (mid & 63) : ((hi >> 4) | ((mid >> 6) << 4));
}
LOOM_HD void q4k_scale_min(int s, const uint8_t* q, int& sc, int& m) {
  q4k_scale_min_from(s, q[s & 3], q[(s & 3) + 4], q[(s & 3) + 8], sc, m);
}

/// q8_0 weights (d f16, 32 int8): four lanes per block, each 8 codes.
struct DotQ8_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 34;
  static constexpr int kParts = 4;
  using Act = ActQ8_0;
  struct Part {
    int q[2];
    float d;
  };
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    return {
        {static_cast<int>(load_u32_a2(w + 2 + 8 * part)), static_cast<int>(load_u32_a2(w + 6 + 8 * part))},
        half_to_float(load_u16_a2(w))};
  }
  // CPU: isum * (dw * dx) per block
  LOOM_HD static double dot(const Part& p, const Act& x, int part) {
    const int s =
        dot4(p.q[1], load_i32_a4(x.qs + 8 * part + 4), dot4(p.q[0], load_i32_a4(x.qs + 8 * part), 0));
    return static_cast<double>(s) * (static_cast<double>(p.d) * half_to_float(x.d));
  }
};

/// q4_0 weights (d f16, 16 bytes: element j in the low nibble of byte j, j+16 in the high nibble;
/// code - 8): two lanes per block, each 8 bytes (elements 8p..8p+7 and 16+8p..16+8p+7).
struct DotQ4_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 18;
  static constexpr int kParts = 2;
  using Act = ActQ8_0;
  struct Part {
    int lo[2], hi[2];  // signed codes (nibble - 8)
    float d;
  };
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    Part p;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = load_u32_a2(w + 2 + 8 * part + 4 * i);
      p.lo[i] = sub_bytes(v & 0x0f0f0f0fu, 0x08080808u);
      p.hi[i] = sub_bytes((v >> 4) & 0x0f0f0f0fu, 0x08080808u);
    }
    p.d = half_to_float(load_u16_a2(w));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) {
    const int8_t* lo = x.qs + 8 * part;
    const int8_t* hi = x.qs + 16 + 8 * part;
    int s = dot4(p.lo[0], load_i32_a4(lo), 0);
    s = dot4(p.lo[1], load_i32_a4(lo + 4), s);
    s = dot4(p.hi[0], load_i32_a4(hi), s);
    s = dot4(p.hi[1], load_i32_a4(hi + 4), s);
    return static_cast<double>(s) * (static_cast<double>(p.d) * half_to_float(x.d));
  }
};

/// q4_K weights (d, dmin f16, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles: pair p of
/// sub-blocks in qs[32p .. 32p+31], low nibbles sub-block 2p, high 2p+1): 16 lanes per block. Lane
/// t = 4p + q takes bytes 32p + 8q .. 32p + 8q + 7, i.e. elements 8q..8q+7 of sub-blocks 2p and
/// 2p+1. CPU per block: dx * (d * sum_s sc_s * (q.x)_s - dmin * sum_s m_s * (sum of x over s)); the
/// x sums come from bsums (16 elements each), one per lane: lanes q = 0, 1, 2, 3 take the first half
/// of sub-block 2p, of 2p+1, the second half of 2p, of 2p+1, so the four cover the pair once.
struct DotQ4_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 144;
  static constexpr int kParts = 16;
  using Act = ActQ8_K;
  struct Part {
    int lo[2], hi[2];  // nibbles of sub-blocks 2p and 2p+1
    int sc_lo, sc_hi, m;
    float d, dmin;
  };
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    const int pair = part / 4, q = part % 4;
    Part p;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = load_u32_a2(w + 16 + 32 * pair + 8 * q + 4 * i);
      p.lo[i] = static_cast<int>(v & 0x0f0f0f0fu);
      p.hi[i] = static_cast<int>((v >> 4) & 0x0f0f0f0fu);
    }
    // sub-blocks 2p and 2p+1 use adjacent bytes of each third of the scales: three 16-bit loads
    const int j = (2 * pair) & 3;
    const uint32_t lo = load_u16_a2(w + 4 + j), mid = load_u16_a2(w + 8 + j), hi = load_u16_a2(w + 12 + j);
    int m_lo, m_hi;
    q4k_scale_min_from(2 * pair, lo & 0xff, mid & 0xff, hi & 0xff, p.sc_lo, m_lo);
    q4k_scale_min_from(2 * pair + 1, lo >> 8, mid >> 8, hi >> 8, p.sc_hi, m_hi);
    p.m = (q & 1) ? m_hi : m_lo;
    p.d = half_to_float(load_u16_a2(w));
    p.dmin = half_to_float(load_u16_a2(w + 2));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) {
    const int pair = part / 4, q = part % 4;
    const int8_t* lo = x.qs + 64 * pair + 8 * q;
    const int8_t* hi = lo + 32;
    const int s_lo = dot4(p.lo[1], load_i32_a4(lo + 4), dot4(p.lo[0], load_i32_a4(lo), 0));
    const int s_hi = dot4(p.hi[1], load_i32_a4(hi + 4), dot4(p.hi[0], load_i32_a4(hi), 0));
    const int isum = p.sc_lo * s_lo + p.sc_hi * s_hi;
    const int msum = p.m * x.bsums[4 * pair + 2 * (q & 1) + q / 2];
    return static_cast<double>(x.d) * (static_cast<double>(p.d) * isum - static_cast<double>(p.dmin) * msum);
  }
};

/// q6_K weights (ql: 128 bytes of low nibbles, qh: 64 bytes of 2-bit high parts, 16 int8 scales,
/// d f16; code - 32): 16 lanes per block. In half h of 128 elements, element 32c + l takes the low
/// (c < 2) or high nibble of ql[64h + 32(c&1) + l] and bits 2c..2c+1 of qh[32h + l], scale
/// scales[8h + 2c + l/16]. Lane t = 8h + u takes l = 4u .. 4u+3 for all four c. CPU per block:
/// dw * dx * sum_s scale_s * ((q - 32).x)_s, the bias folded into the codes here.
struct DotQ6_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 210;
  static constexpr int kParts = 16;
  using Act = ActQ8_K;
  struct Part {
    int code[4];  // signed codes q - 32 of c = 0..3
    int sc[4];
    float d;
  };
  LOOM_HD static Part decode(const uint8_t* w, int part) {
    const int h = part / 8, l = 4 * (part % 8);
    const uint32_t ql_a = load_u32_a2(w + 64 * h + l);       // c = 0 (low nibbles), c = 2 (high)
    const uint32_t ql_b = load_u32_a2(w + 64 * h + 32 + l);  // c = 1, c = 3
    const uint32_t qh = load_u32_a2(w + 128 + 32 * h + l);
    constexpr uint32_t kLow = 0x0f0f0f0fu, kHigh = 0x30303030u, kBias = 0x20202020u;
    Part p;
    p.code[0] = sub_bytes((ql_a & kLow) | ((qh << 4) & kHigh), kBias);
    p.code[1] = sub_bytes((ql_b & kLow) | ((qh << 2) & kHigh), kBias);
    p.code[2] = sub_bytes(((ql_a >> 4) & kLow) | (qh & kHigh), kBias);
    p.code[3] = sub_bytes(((ql_b >> 4) & kLow) | ((qh >> 2) & kHigh), kBias);
    for (int c = 0; c < 4; ++c) p.sc[c] = static_cast<int8_t>(w[192 + 8 * h + 2 * c + l / 16]);
    p.d = half_to_float(load_u16_a2(w + 208));
    return p;
  }
  LOOM_HD static double dot(const Part& p, const Act& x, int part) {
    const int h = part / 8, l = 4 * (part % 8);
    const int8_t* xq = x.qs + 128 * h + l;
    int isum = 0;
    for (int c = 0; c < 4; ++c) isum += p.sc[c] * dot4(p.code[c], load_i32_a4(xq + 32 * c), 0);
    return (static_cast<double>(p.d) * x.d) * isum;
  }
};

}  // namespace loom::cuda
