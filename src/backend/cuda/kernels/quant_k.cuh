// Quantizers of the K-quant super-blocks q4_K and q6_K: the CPU reference (src/core/quant_k.cpp)
// operation for operation, so that a block quantized on the device has the same bytes as one
// quantized on the CPU.
//
// Why not a simpler device algorithm: the reference searches each sub-block for the scale of least
// squared error and refits the super-block scales; the op test holds other backends to that within
// 1/20 of the format's own error, which a plain min/max quantizer misses by ~50x.
//
// Same bytes needs the same rounding at every step. The CPU code is built by g++ for baseline
// x86-64 (no FMA, SSE arithmetic without excess precision), so each float and double operation
// rounds on its own. nvcc contracts a*b+c into an FMA by default, which changes the last bit of
// the sums of squares and, through a comparison of errors or a rounding tie, a code or a scale; so
// every operation below goes through a named round-to-nearest intrinsic on the device (never
// contracted, immune to -use_fast_math) and the plain operator on the host. Sums run in the CPU's
// order (sequential over the block), min/max are std::min/std::max's comparisons (which decide how
// NaN propagates), and codes round half to even like lrint.
//
// Everything is __host__ __device__ so that the host instantiation can be compared with the CPU
// reference byte for byte (tests/unit/test_cuda_quant_k.cpp). One thread quantizes one block; the
// codes are recomputed where the reference keeps them in arrays, to keep the thread's stack small
// (they are a pure function of the element and the chosen scales, so the result is the same).
//
// Includes nothing outside src/backend/cuda/ but cuda_fp16.h (through quantize_act.cuh).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quantize_act.cuh"  // LOOM_HD, f*_rn, half_to_float, float_to_half

namespace loom::cuda {

// ---- operations with fixed rounding ------------------------------------------------------------------
// The float ones (fadd_rn, fsub_rn, fmul_rn, fdiv_rn) are quantize_act.cuh's; the double ones:

LOOM_HD double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
LOOM_HD double dsub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
LOOM_HD double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LOOM_HD double ddiv_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
/// Sum of squares step: acc + a*a, two roundings.
LOOM_HD double add_square(double acc, double a) { return dadd_rn(acc, dmul_rn(a, a)); }
/// acc + a*b, two roundings.
LOOM_HD double add_product(double acc, double a, double b) { return dadd_rn(acc, dmul_rn(a, b)); }

LOOM_HD bool finite_d(double v) {
#if defined(__CUDA_ARCH__)
  return isfinite(v);
#else
  return std::isfinite(v);
#endif
}

// std::min / std::max exactly: the first argument is kept unless the comparison says otherwise, so
// a NaN second argument is ignored and a NaN first argument sticks, as in the reference.
template <typename T>
LOOM_HD T min_std(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
LOOM_HD T max_std(T a, T b) {
  return a < b ? b : a;
}

/// 16-bit store to a 2-byte aligned address (every field of both block layouts starts at an even
/// offset; see store_u16 in quant.cuh for why the device writes f16 fields whole).
LOOM_HD void kq_store_u16(uint8_t* p, uint16_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint16_t*>(p) = v;
#else
  std::memcpy(p, &v, sizeof(v));
#endif
}

// ---- shared helpers (quant_k.cpp's anonymous namespace) ------------------------------------------------

/// Rounds to nearest even and clamps to [lo, hi]; NaN maps to lo.
LOOM_HD int kq_round_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return static_cast<int>(std::lrint(v));
#endif
}

constexpr float kKqF16Max = 65504.0f;

/// The value an f16 field will decode to (clamped to the f16 range first).
LOOM_HD float kq_f16_field(float v) {
  if (!(v > 0.0f)) return 0.0f;
  return half_to_float(float_to_half(min_std(v, kKqF16Max)));
}

/// The smallest f16 value >= v (clamped to the f16 range).
LOOM_HD float kq_f16_field_up(float v) {
  if (!(v > 0.0f)) return 0.0f;
  if (v >= kKqF16Max) return kKqF16Max;
  uint16_t h = float_to_half(v);
  if (half_to_float(h) < v) ++h;  // positive f16 values order like their bits
  return half_to_float(h);
}

// ---- q4_K ------------------------------------------------------------------------------------------

constexpr int kQ4KSubBlock = 32;

/// x ~= scale * q - min, q in [0, 15].
struct Q4KSubFit {
  float scale;
  float min;
};

/// Least-squares (scale, offset) for x ~= scale*q + offset over one sub-block with offset <= 0;
/// returns the squared error, or infinity if degenerate.
LOOM_HD double q4k_affine_refit(const float* x, const int* q, double& scale, double& offset) {
  constexpr int n = kQ4KSubBlock;
  double sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < n; ++i) {
    const double qi = q[i];
    sq = dadd_rn(sq, qi);
    sqq = add_square(sqq, qi);
    sx = dadd_rn(sx, x[i]);
    sqx = add_product(sqx, qi, x[i]);
  }
  const double det = dsub_rn(dmul_rn(n, sqq), dmul_rn(sq, sq));
  if (det > 0) {
    scale = ddiv_rn(dsub_rn(dmul_rn(n, sqx), dmul_rn(sq, sx)), det);
    offset = ddiv_rn(dsub_rn(dmul_rn(sqq, sx), dmul_rn(sq, sqx)), det);
  } else {
    scale = 0;
    offset = 1;  // forces the fallback below
  }
  if (offset > 0) {
    offset = 0;
    scale = sqq > 0 ? ddiv_rn(sqx, sqq) : 0;
  }
  if (!(scale >= 0) || !finite_d(scale) || !finite_d(offset)) return static_cast<double>(INFINITY);
  double err = 0;
  for (int i = 0; i < n; ++i) err = add_square(err, dsub_rn(dadd_rn(dmul_rn(scale, q[i]), offset), x[i]));
  return err;
}

/// Scale and min of one sub-block: min/max mapping, then 12 stretched or shrunk steps each refit
/// by least squares; the fit of least error wins (the first on ties).
LOOM_HD Q4KSubFit q4k_fit_sub_block(const float* x) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < kQ4KSubBlock; ++i) {
    lo = min_std(lo, x[i]);
    hi = max_std(hi, x[i]);
  }
  if (!(hi > lo)) return {0.0f, -lo};
  const double range = dsub_rn(hi, lo);
  double best_scale = ddiv_rn(range, 15.0), best_offset = lo;
  double best_err = 0;
  for (int i = 0; i < kQ4KSubBlock; ++i) {
    const int code = kq_round_clamp(static_cast<float>(ddiv_rn(fsub_rn(x[i], lo), best_scale)), 0, 15);
    best_err = add_square(best_err, dsub_rn(dadd_rn(dmul_rn(best_scale, code), lo), x[i]));
  }
  int q[kQ4KSubBlock];
  for (int k = -5; k <= 6; ++k) {
    const double inv_step = ddiv_rn(dadd_rn(15.0, dmul_rn(0.25, k)), range);
    for (int i = 0; i < kQ4KSubBlock; ++i)
      q[i] = kq_round_clamp(static_cast<float>(dmul_rn(fsub_rn(x[i], lo), inv_step)), 0, 15);
    double scale, offset;
    const double err = q4k_affine_refit(x, q, scale, offset);
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_offset = offset;
    }
  }
  constexpr double kFloatMax = FLT_MAX;
  return {static_cast<float>(min_std(best_scale, kFloatMax)),
          static_cast<float>(min_std(-best_offset, kFloatMax))};
}

/// Code of one element for a decoded sub-block step (d*sc) and offset (dmin*m).
LOOM_HD int q4k_code(float v, float step, float off) {
  return step > 0.0f ? kq_round_clamp(fdiv_rn(fadd_rn(v, off), step), 0, 15) : 0;
}

/// The sub-block steps and offsets a decoder sees for d, dmin and the integer scales/mins.
LOOM_HD void q4k_steps(float d, float dmin, const uint8_t* sc, const uint8_t* m, float* step, float* off) {
  for (int j = 0; j < 8; ++j) {
    step[j] = fmul_rn(d, static_cast<float>(sc[j]));
    off[j] = fmul_rn(dmin, static_cast<float>(m[j]));
  }
}

/// Squared error of the super-block quantized with d/dmin and the integer scales/mins.
LOOM_HD double q4k_error(const float* x, float d, float dmin, const uint8_t* sc, const uint8_t* m) {
  float step[8], off[8];
  q4k_steps(d, dmin, sc, m, step, off);
  double err = 0;
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < kQ4KSubBlock; ++i) {
      const float v = x[j * kQ4KSubBlock + i];
      const int c = q4k_code(v, step[j], off[j]);
      err = add_square(err, dsub_rn(dsub_rn(dmul_rn(step[j], c), off[j]), v));
    }
  }
  return err;
}

/// Quantizes 256 floats into one q4_K block (144 bytes at `y`, 2-byte aligned).
LOOM_HD void quantize_block_q4_k(const float* x, uint8_t* y) {
  Q4KSubFit fits[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fits[j] = q4k_fit_sub_block(x + j * kQ4KSubBlock);
    max_scale = max_std(max_scale, fits[j].scale);
    max_min = max_std(max_min, fits[j].min);
  }
  float d = kq_f16_field_up(fdiv_rn(max_scale, 63.0f));
  float dmin = kq_f16_field_up(fdiv_rn(max_min, 63.0f));
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.0f ? kq_round_clamp(fdiv_rn(fits[j].scale, d), 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0.0f ? kq_round_clamp(fdiv_rn(fits[j].min, dmin), 0, 63) : 0);
  }
  const double err = q4k_error(x, d, dmin, sc, m);

  // Least-squares refit of d and dmin for the chosen integers, kept if it lowers the error.
  {
    float step[8], off[8];
    q4k_steps(d, dmin, sc, m, step, off);
    double saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;
    for (int i = 0; i < 256; ++i) {
      const int j = i / kQ4KSubBlock;
      const double a = dmul_rn(sc[j], q4k_code(x[i], step[j], off[j]));
      const double b = m[j];
      saa = add_square(saa, a);
      sab = add_product(sab, a, b);
      sbb = add_square(sbb, b);
      sax = add_product(sax, a, x[i]);
      sbx = add_product(sbx, b, x[i]);
    }
    const double det = dsub_rn(dmul_rn(saa, sbb), dmul_rn(sab, sab));
    if (det > 0) {
      const double d2 = ddiv_rn(dsub_rn(dmul_rn(sax, sbb), dmul_rn(sab, sbx)), det);
      const double dmin2 = ddiv_rn(dsub_rn(dmul_rn(sab, sax), dmul_rn(saa, sbx)), det);
      if (d2 > 0 && dmin2 >= 0 && finite_d(d2) && finite_d(dmin2)) {
        const float dr = kq_f16_field(static_cast<float>(d2));
        const float dminr = kq_f16_field(static_cast<float>(dmin2));
        if (q4k_error(x, dr, dminr, sc, m) < err) {
          d = dr;
          dmin = dminr;
        }
      }
    }
  }

  kq_store_u16(y, float_to_half(d));
  kq_store_u16(y + 2, float_to_half(dmin));
  // 6-bit scales/mins: sub-blocks 0-3 in the low bits of bytes 0-3 (scale) and 4-7 (min); 4-7 as a
  // nibble pair in bytes 8-11 plus their top 2 bits in the spare top bits of bytes 0-7.
  uint8_t packed[12];
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  for (int i = 0; i < 12; i += 2)
    kq_store_u16(y + 4 + i, static_cast<uint16_t>(packed[i] | (packed[i + 1] << 8)));
  // qs: pair p of sub-blocks in bytes 32p..32p+31, sub-block 2p in the low nibbles.
  float step[8], off[8];
  q4k_steps(d, dmin, sc, m, step, off);
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < 32; l += 2) {
      uint16_t pair = 0;
      for (int b = 0; b < 2; ++b) {
        const int lo = q4k_code(x[64 * p + l + b], step[2 * p], off[2 * p]);
        const int hi = q4k_code(x[64 * p + 32 + l + b], step[2 * p + 1], off[2 * p + 1]);
        pair = static_cast<uint16_t>(pair | ((lo | (hi << 4)) << (8 * b)));
      }
      kq_store_u16(y + 16 + 32 * p + l, pair);
    }
  }
}

// ---- q6_K ------------------------------------------------------------------------------------------

constexpr int kQ6KSubBlock = 16;

/// Symmetric scale of one sub-block for x ~= s*q, q in [-32, 31]: the extreme element mapped to
/// 12 targets, each refit by least squares; the least error wins (the first on ties).
LOOM_HD float q6k_fit_sub_block(const float* x) {
  float ext = 0.0f;
  for (int i = 0; i < kQ6KSubBlock; ++i)
    if (fabsf(x[i]) > fabsf(ext)) ext = x[i];
  if (ext == 0.0f) return 0.0f;
  const float targets[12] = {-32.0f, -31.5f, -31.0f, -30.5f, -30.0f, -29.0f,
                             -28.0f, 31.0f,  30.5f,  30.0f,  29.0f,  28.0f};
  float best_scale = fdiv_rn(ext, -32.0f);
  double best_err = static_cast<double>(INFINITY);
  for (int t = 0; t < 12; ++t) {
    const float inv = fdiv_rn(targets[t], ext);
    double sqq = 0, sqx = 0;
    int q[kQ6KSubBlock];
    for (int i = 0; i < kQ6KSubBlock; ++i) {
      q[i] = kq_round_clamp(fmul_rn(x[i], inv), -32, 31);
      sqq = add_square(sqq, q[i]);
      sqx = add_product(sqx, q[i], x[i]);
    }
    if (!(sqq > 0)) continue;
    const double s = ddiv_rn(sqx, sqq);
    double err = 0;
    for (int i = 0; i < kQ6KSubBlock; ++i) err = add_square(err, dsub_rn(dmul_rn(s, q[i]), x[i]));
    if (err < best_err && finite_d(s)) {
      best_err = err;
      best_scale = static_cast<float>(s);
    }
  }
  return best_scale;
}

LOOM_HD int q6k_code(float v, float step) {
  return step != 0.0f ? kq_round_clamp(fdiv_rn(v, step), -32, 31) : 0;
}

LOOM_HD double q6k_error(const float* x, float d, const int8_t* sc) {
  double err = 0;
  for (int j = 0; j < 16; ++j) {
    const float step = fmul_rn(d, static_cast<float>(sc[j]));
    for (int i = 0; i < kQ6KSubBlock; ++i) {
      const float v = x[j * kQ6KSubBlock + i];
      err = add_square(err, dsub_rn(dmul_rn(step, q6k_code(v, step)), v));
    }
  }
  return err;
}

/// Quantizes 256 floats into one q6_K block (210 bytes at `y`, 2-byte aligned).
LOOM_HD void quantize_block_q6_k(const float* x, uint8_t* y) {
  float scales[16];
  float max_abs = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scales[j] = q6k_fit_sub_block(x + j * kQ6KSubBlock);
    max_abs = max_std(max_abs, fabsf(scales[j]));
  }
  float d = kq_f16_field_up(fdiv_rn(max_abs, 127.0f));
  int8_t sc[16];
  for (int j = 0; j < 16; ++j)
    sc[j] = static_cast<int8_t>(d > 0.0f ? kq_round_clamp(fdiv_rn(scales[j], d), -128, 127) : 0);
  const double err = q6k_error(x, d, sc);

  double saa = 0, sax = 0;
  for (int j = 0; j < 16; ++j) {
    const float step = fmul_rn(d, static_cast<float>(sc[j]));
    for (int i = 0; i < kQ6KSubBlock; ++i) {
      const float v = x[j * kQ6KSubBlock + i];
      const double a = dmul_rn(sc[j], q6k_code(v, step));
      saa = add_square(saa, a);
      sax = add_product(sax, a, v);
    }
  }
  if (saa > 0) {
    const double d2 = ddiv_rn(sax, saa);
    if (d2 > 0 && finite_d(d2)) {
      const float dr = kq_f16_field(static_cast<float>(d2));
      if (q6k_error(x, dr, sc) < err) d = dr;
    }
  }

  float step[16];
  for (int j = 0; j < 16; ++j) step[j] = fmul_rn(d, static_cast<float>(sc[j]));
  // In half h, element 128h + 32c + l (c = 0..3): low bits in the low (c < 2) or high nibble of
  // ql[64h + 32(c&1) + l], high bits in bits 2c..2c+1 of qh[32h + l].
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; l += 2) {
      uint16_t ql_a = 0, ql_b = 0, qh = 0;
      for (int b = 0; b < 2; ++b) {
        int c4[4];
        for (int c = 0; c < 4; ++c) {
          const int e = 128 * h + 32 * c + l + b;
          c4[c] = q6k_code(x[e], step[e / kQ6KSubBlock]) + 32;
        }
        ql_a = static_cast<uint16_t>(ql_a | (((c4[0] & 0xF) | ((c4[2] & 0xF) << 4)) << (8 * b)));
        ql_b = static_cast<uint16_t>(ql_b | (((c4[1] & 0xF) | ((c4[3] & 0xF) << 4)) << (8 * b)));
        qh = static_cast<uint16_t>(
            qh |
            (((c4[0] >> 4) | ((c4[1] >> 4) << 2) | ((c4[2] >> 4) << 4) | ((c4[3] >> 4) << 6)) << (8 * b)));
      }
      kq_store_u16(y + 64 * h + l, ql_a);
      kq_store_u16(y + 64 * h + 32 + l, ql_b);
      kq_store_u16(y + 128 + 32 * h + l, qh);
    }
  }
  for (int j = 0; j < 16; j += 2)
    kq_store_u16(y + 192 + j,
                 static_cast<uint16_t>(static_cast<uint8_t>(sc[j]) | (static_cast<uint8_t>(sc[j + 1]) << 8)));
  kq_store_u16(y + 208, float_to_half(d));
}

}  // namespace loom::cuda
