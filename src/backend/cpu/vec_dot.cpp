// Scalar reference dot products and the run-time choice between them and the AVX2 kernels.
#include "vec_dot.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "loom/quant.h"

namespace loom::cpu {

namespace {

// f16 -> f32 through a table: the bit-twiddling conversion costs more than the multiply-add it
// feeds, and 256 KiB of table is cheap next to any f16 weight matrix.
const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(static_cast<f16_bits>(i));
    return t;
  }();
  return table.data();
}

// ---- activation conversions -----------------------------------------------------------------------

void from_float_f32(const float* x, void* y, int64_t n) { std::memcpy(y, x, n * sizeof(float)); }

void from_float_f16(const float* x, void* y, int64_t n) {
  auto out = static_cast<f16_bits*>(y);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

void from_float_q8_0(const float* x, void* y, int64_t n) {
  quantize_row_q8_0(x, static_cast<BlockQ8_0*>(y), n);
}
void from_float_q8_k(const float* x, void* y, int64_t n) {
  quantize_row_q8_k(x, static_cast<BlockQ8_K*>(y), n);
}

// ---- dots -------------------------------------------------------------------------------------------

// Four partial sums give the scalar loop some instruction-level parallelism.
float dot_f32(int64_t n, const float* w, const float* x) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += w[i + k] * x[i + k];
  for (; i < n; ++i) s[0] += w[i] * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float dot_f16(int64_t n, const f16_bits* w, const f16_bits* x) {
  const float* t = f16_table();
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += t[w[i + k]] * t[x[i + k]];
  for (; i < n; ++i) s[0] += t[w[i]] * t[x[i]];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float dot_f16_f32(int64_t n, const f16_bits* w, const float* x) {
  const float* t = f16_table();
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += t[w[i + k]] * x[i + k];
  for (; i < n; ++i) s[0] += t[w[i]] * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float dot_bf16_f32(int64_t n, const bf16_bits* w, const float* x) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += bf16_to_f32(w[i + k]) * x[i + k];
  for (; i < n; ++i) s[0] += bf16_to_f32(w[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float dot_q8_0(int64_t n, const BlockQ8_0* w, const BlockQ8_0* x) {
  const float* t = f16_table();
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int32_t isum = 0;
    for (int i = 0; i < kQK8_0; ++i) isum += w[b].qs[i] * x[b].qs[i];
    sum += static_cast<double>(isum) * (static_cast<double>(t[w[b].d]) * t[x[b].d]);
  }
  return static_cast<float>(sum);
}

float dot_q4_0(int64_t n, const BlockQ4_0* w, const BlockQ8_0* x) {
  const float* t = f16_table();
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    int32_t isum = 0;
    for (int i = 0; i < kQK4_0 / 2; ++i) {
      isum += ((w[b].qs[i] & 0xF) - 8) * x[b].qs[i];
      isum += ((w[b].qs[i] >> 4) - 8) * x[b].qs[i + kQK4_0 / 2];
    }
    sum += static_cast<double>(isum) * (static_cast<double>(t[w[b].d]) * t[x[b].d]);
  }
  return static_cast<float>(sum);
}

// Per super-block: d*dx * sum_j sc_j*(q.x)_j - dmin*dx * sum_j m_j*(sum of x over sub-block j);
// both sums are exact integers.
float dot_q4_k(int64_t n, const BlockQ4_K* w, const BlockQ8_K* x) {
  const float* t = f16_table();
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t isum = 0, msum = 0;
    for (int p = 0; p < 4; ++p) {
      uint8_t sc0, m0, sc1, m1;
      q4k_get_scale_min(2 * p, w[b].scales, &sc0, &m0);
      q4k_get_scale_min(2 * p + 1, w[b].scales, &sc1, &m1);
      const uint8_t* qs = w[b].qs + 32 * p;
      const int8_t* xq = x[b].qs + 64 * p;
      int32_t s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += (qs[l] & 0xF) * xq[l];
        s1 += (qs[l] >> 4) * xq[l + 32];
      }
      isum += sc0 * s0 + sc1 * s1;
      msum += m0 * (x[b].bsums[4 * p] + x[b].bsums[4 * p + 1]) +
              m1 * (x[b].bsums[4 * p + 2] + x[b].bsums[4 * p + 3]);
    }
    sum += block_term_k(x[b].d, t[w[b].d], isum, t[w[b].dmin], msum);
  }
  return static_cast<float>(sum);
}

// Q6_K codes are stored with a +32 bias: sum (q-32)*x = sum q*x - 32 * sum x, and the scale of the
// 16-element sub-block s pairs with bsums[s].
float dot_q6_k(int64_t n, const BlockQ6_K* w, const BlockQ8_K* x) {
  const float* t = f16_table();
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t isum = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[b].ql + 64 * h;
      const uint8_t* qh = w[b].qh + 32 * h;
      const int8_t* sc = w[b].scales + 8 * h;
      const int8_t* xq = x[b].qs + 128 * h;
      for (int g = 0; g < 2; ++g) {  // g: first or second 16 of each 32
        int32_t s[4] = {0, 0, 0, 0};
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          s[0] += ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) * xq[l];
          s[1] += ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) * xq[l + 32];
          s[2] += ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) * xq[l + 64];
          s[3] += ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) * xq[l + 96];
        }
        for (int k = 0; k < 4; ++k) isum += sc[g + 2 * k] * s[k];
      }
    }
    int32_t bias = 0;
    for (int s = 0; s < kQK_K / 16; ++s) bias += w[b].scales[s] * x[b].bsums[s];
    sum += block_term_k(x[b].d, t[w[b].d], isum - 32 * bias, 0.0f, 0);
  }
  return static_cast<float>(sum);
}

// ---- formats decoded to integer codes ----------------------------------------------------------------
//
// The newer formats share two scalar dots: a block is decoded to integer codes plus its scales, and the
// integer sums follow the same contract (exact per block, scaled in double).

// A 32-element block as x = d * code + m.
struct Block32 {
  int8_t q[kQK32];
  double d, m;
};
void decode(const BlockQ4_1& b, Block32& o) {
  for (int i = 0; i < 16; ++i) {
    o.q[i] = static_cast<int8_t>(b.qs[i] & 0xF);
    o.q[i + 16] = static_cast<int8_t>(b.qs[i] >> 4);
  }
  o.d = f16_to_f32(b.d);
  o.m = f16_to_f32(b.m);
}
void decode_q5(const uint8_t* qs, const uint8_t* qh, int bias, int8_t* q) {
  const uint32_t h = qh[0] | (qh[1] << 8) | (qh[2] << 16) | (static_cast<uint32_t>(qh[3]) << 24);
  for (int i = 0; i < 16; ++i) {
    q[i] = static_cast<int8_t>(((qs[i] & 0xF) | (((h >> i) & 1) << 4)) - bias);
    q[i + 16] = static_cast<int8_t>(((qs[i] >> 4) | (((h >> (i + 16)) & 1) << 4)) - bias);
  }
}
void decode(const BlockQ5_0& b, Block32& o) {
  decode_q5(b.qs, b.qh, 16, o.q);
  o.d = f16_to_f32(b.d);
  o.m = 0;
}
void decode(const BlockQ5_1& b, Block32& o) {
  decode_q5(b.qs, b.qh, 0, o.q);
  o.d = f16_to_f32(b.d);
  o.m = f16_to_f32(b.m);
}
void decode_table(const uint8_t* qs, const int8_t* table, int8_t* q) {
  for (int i = 0; i < 16; ++i) {
    q[i] = table[qs[i] & 0xF];
    q[i + 16] = table[qs[i] >> 4];
  }
}
void decode(const BlockIQ4_NL& b, Block32& o) {
  decode_table(b.qs, kIQ4NLValues, o.q);
  o.d = f16_to_f32(b.d);
  o.m = 0;
}
void decode(const BlockMXFP4& b, Block32& o) {
  decode_table(b.qs, kMXFP4Values, o.q);
  o.d = e8m0_to_f32_half(b.e);
  o.m = 0;
}

// sum over blocks of dx * (d * sum q*xq + m * sum xq)
template <typename W>
float dot_block32(int64_t n, const W* w, const BlockQ8_0* x) {
  const float* t = f16_table();
  double sum = 0.0;
  Block32 blk;
  for (int64_t b = 0; b < n / kQK32; ++b) {
    decode(w[b], blk);
    int32_t isum = 0, xsum = 0;
    for (int i = 0; i < kQK32; ++i) {
      isum += blk.q[i] * x[b].qs[i];
      xsum += x[b].qs[i];
    }
    sum += static_cast<double>(t[x[b].d]) * (blk.d * isum + blk.m * xsum);
  }
  return static_cast<float>(sum);
}

// A 256-element super-block as x = d * sc[s] * q - dmin * m[s] over 16 sub-blocks of 16 (formats with
// 32-element sub-blocks repeat their scales).
struct BlockK {
  int8_t q[kQK_K];
  int32_t sc[16], m[16];
  float d, dmin;
};
void decode(const BlockQ2_K& b, BlockK& o) {
  for (int e = 0; e < kQK_K; ++e) o.q[e] = static_cast<int8_t>((b.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3);
  for (int s = 0; s < 16; ++s) {
    o.sc[s] = b.scales[s] & 0xF;
    o.m[s] = b.scales[s] >> 4;
  }
  o.d = f16_to_f32(b.d);
  o.dmin = f16_to_f32(b.dmin);
}
void decode(const BlockQ3_K& b, BlockK& o) {
  for (int e = 0; e < kQK_K; ++e) {
    const int lo = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    o.q[e] = static_cast<int8_t>(lo - 4 * (1 - ((b.hmask[e % 32] >> (e / 32)) & 1)));
  }
  for (int s = 0; s < 16; ++s) {
    o.sc[s] = q3k_scale(s, b.scales) - 32;
    o.m[s] = 0;
  }
  o.d = f16_to_f32(b.d);
  o.dmin = 0.0f;
}
void decode(const BlockQ5_K& b, BlockK& o) {
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4k_get_scale_min(j, b.scales, &sc, &m);
    o.sc[2 * j] = o.sc[2 * j + 1] = sc;
    o.m[2 * j] = o.m[2 * j + 1] = m;
    const uint8_t* qs = b.qs + 32 * (j / 2);
    for (int l = 0; l < 32; ++l)
      o.q[32 * j + l] = static_cast<int8_t>(((qs[l] >> (4 * (j % 2))) & 0xF) | (((b.qh[l] >> j) & 1) << 4));
  }
  o.d = f16_to_f32(b.d);
  o.dmin = f16_to_f32(b.dmin);
}
void decode(const BlockIQ4_XS& b, BlockK& o) {
  for (int j = 0; j < 8; ++j) {
    o.sc[2 * j] = o.sc[2 * j + 1] = iq4xs_scale(j, b) - 32;
    o.m[2 * j] = o.m[2 * j + 1] = 0;
    decode_table(b.qs + 16 * j, kIQ4NLValues, o.q + 32 * j);
  }
  o.d = f16_to_f32(b.d);
  o.dmin = 0.0f;
}

template <typename W>
float dot_block_k(int64_t n, const W* w, const BlockQ8_K* x) {
  double sum = 0.0;
  BlockK blk;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    decode(w[b], blk);
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t part = 0;
      for (int i = 16 * s; i < 16 * s + 16; ++i) part += blk.q[i] * x[b].qs[i];
      isum += blk.sc[s] * part;
      msum += blk.m[s] * x[b].bsums[s];
    }
    sum += block_term_k(x[b].d, blk.d, isum, blk.dmin, msum);
  }
  return static_cast<float>(sum);
}

// Adapts a one-column dot to the multi-column signature.
template <typename W, typename X, float (*F)(int64_t, const W*, const X*)>
void multi(int64_t n, const void* w, const void* const* xs, int nc, float* out) {
  for (int c = 0; c < nc; ++c) out[c] = F(n, static_cast<const W*>(w), static_cast<const X*>(xs[c]));
}

// Indexed by DType; i32 has no kernel.
constexpr VecDotKernel kScalar[kDTypeCount] = {
    /* f32  */ {ActType::f32, from_float_f32, multi<float, float, dot_f32>},
    /* f16  */ {ActType::f32, from_float_f32, multi<f16_bits, float, dot_f16_f32>},
    /* bf16 */ {ActType::f32, from_float_f32, multi<bf16_bits, float, dot_bf16_f32>},
    /* i32  */ {ActType::f32, nullptr, nullptr},
    /* q8_0 */ {ActType::q8_0, from_float_q8_0, multi<BlockQ8_0, BlockQ8_0, dot_q8_0>},
    /* q4_0 */ {ActType::q8_0, from_float_q8_0, multi<BlockQ4_0, BlockQ8_0, dot_q4_0>},
    /* q4_K */ {ActType::q8_k, from_float_q8_k, multi<BlockQ4_K, BlockQ8_K, dot_q4_k>},
    /* q6_K */ {ActType::q8_k, from_float_q8_k, multi<BlockQ6_K, BlockQ8_K, dot_q6_k>},
    /* q4_1 */ {ActType::q8_0, from_float_q8_0, multi<BlockQ4_1, BlockQ8_0, dot_block32<BlockQ4_1>>},
    /* q5_0 */ {ActType::q8_0, from_float_q8_0, multi<BlockQ5_0, BlockQ8_0, dot_block32<BlockQ5_0>>},
    /* q5_1 */ {ActType::q8_0, from_float_q8_0, multi<BlockQ5_1, BlockQ8_0, dot_block32<BlockQ5_1>>},
    /* q2_K */ {ActType::q8_k, from_float_q8_k, multi<BlockQ2_K, BlockQ8_K, dot_block_k<BlockQ2_K>>},
    /* q3_K */ {ActType::q8_k, from_float_q8_k, multi<BlockQ3_K, BlockQ8_K, dot_block_k<BlockQ3_K>>},
    /* q5_K */ {ActType::q8_k, from_float_q8_k, multi<BlockQ5_K, BlockQ8_K, dot_block_k<BlockQ5_K>>},
    /* iq4_nl */ {ActType::q8_0, from_float_q8_0, multi<BlockIQ4_NL, BlockQ8_0, dot_block32<BlockIQ4_NL>>},
    /* iq4_xs */ {ActType::q8_k, from_float_q8_k, multi<BlockIQ4_XS, BlockQ8_K, dot_block_k<BlockIQ4_XS>>},
    /* mxfp4 */ {ActType::q8_0, from_float_q8_0, multi<BlockMXFP4, BlockQ8_0, dot_block32<BlockMXFP4>>},
};
static_assert(static_cast<int>(DType::mxfp4) == kDTypeCount - 1, "kScalar is indexed by DType");
constexpr VecDotKernel kScalarF16F16 = {ActType::f16, from_float_f16, multi<f16_bits, f16_bits, dot_f16>};

bool env_forces_scalar() {
  const char* v = std::getenv("LOOM_CPU_SIMD");
  return v && std::strcmp(v, "0") == 0;
}

bool cpu_has_avx2_fma_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// Decided once: the environment and the CPU do not change while the process runs.
bool use_avx2() {
  static const bool use = !env_forces_scalar() && cpu_has_avx2_fma_f16c() &&
                          detail::vec_dot_kernel_avx2_unchecked(DType::f32) != nullptr;
  return use;
}

}  // namespace

size_t act_row_size(ActType t, int64_t n) {
  switch (t) {
    case ActType::f32:
      return static_cast<size_t>(n) * sizeof(float);
    case ActType::f16:
      return static_cast<size_t>(n) * sizeof(f16_bits);
    case ActType::q8_0:
      return static_cast<size_t>(n / kQK8_0) * sizeof(BlockQ8_0);
    case ActType::q8_k:
      return static_cast<size_t>(n / kQK_K) * sizeof(BlockQ8_K);
  }
  return 0;
}

int64_t act_block_size(ActType t) {
  switch (t) {
    case ActType::f32:
    case ActType::f16:
      return 1;
    case ActType::q8_0:
      return kQK8_0;
    case ActType::q8_k:
      return kQK_K;
  }
  return 1;
}

const char* vec_dot_isa() { return use_avx2() ? "avx2" : "scalar"; }

const VecDotKernel* vec_dot_kernel_scalar(DType weight) {
  const VecDotKernel& k = kScalar[static_cast<size_t>(weight)];
  return k.dot ? &k : nullptr;
}

const VecDotKernel* vec_dot_kernel_avx2(DType weight) {
  if (!cpu_has_avx2_fma_f16c()) return nullptr;
  return detail::vec_dot_kernel_avx2_unchecked(weight);
}

const VecDotKernel& vec_dot_f16_f16(bool simd) {
  if (simd && cpu_has_avx2_fma_f16c()) {
    if (const VecDotKernel* k = detail::vec_dot_f16_f16_avx2_unchecked()) return *k;
  }
  return kScalarF16F16;
}

namespace {
void f16_to_f32_row_portable(const f16_bits* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
}  // namespace

F16RowFn f16_to_f32_row() {
  static const F16RowFn fn = [] {
    F16RowFn f = use_avx2() ? detail::f16_to_f32_row_avx2_unchecked() : nullptr;
    return f ? f : f16_to_f32_row_portable;
  }();
  return fn;
}

const VecDotKernel* vec_dot_kernel(DType weight) {
  if (use_avx2()) {
    if (const VecDotKernel* k = detail::vec_dot_kernel_avx2_unchecked(weight)) return k;
  }
  return vec_dot_kernel_scalar(weight);
}

}  // namespace loom::cpu
