// Fused attention: out = softmax(softcap(q k^T * scale) + mask) v, one pass over the keys with an
// online softmax (running max and sum; the accumulator is rescaled when the max grows), so no
// n_q x n_kv score matrix is ever stored. An optional per-head sink logit (gpt-oss) joins each
// denominator at the end.
//
// Work units are runs of query heads that share one KV head (GQA), for one (query, ne3), so each
// K/V row is loaded (and converted from f16) once per run instead of once per head; the runs
// depend on the shape only, so results do not depend on the thread count. Keys go in blocks of kKeyBlock:
// scores for the block, one rescale of the accumulators if the max grew, then the weighted V sum with the
// accumulators held in registers across the block. Keys every head of a run masks out (-inf) are skipped
// before K/V are touched, which halves the work of a causal prefill.
//
// Cost per (head, key): 2*D + 2*Dv FLOPs (in double) and one exp; K/V bytes are read once per run.
// Measured single-threaded in float (2.3 GHz AVX2 Xeon, shared machine, D = 128, 32/8 heads): ~23
// GFLOP/s for a 4096-key f16 decode and ~20 GFLOP/s for a causal 256x256 f16 prefill; in double
// (since the CPU and CUDA kernels round the same values, docs/NUMERICS.md) see docs/PERFORMANCE.md.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_ops.h"
#include "loom/graph.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define LOOM_FA_X86 1
#endif

namespace loom::cpu {

namespace {

/// Query heads processed together per K/V row; bounds the scratch per thread.
constexpr int64_t kMaxRunHeads = 8;
/// Keys scored together: the accumulators are then loaded and stored once per block, not per key.
constexpr int64_t kKeyBlock = 32;
constexpr size_t kAlign = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- row primitives: portable versions and AVX2 versions chosen at run time ----------------------
//
// Everything past the inputs is double: q and K/V rows are converted once (exactly), products of
// two such values are exact in double, and scores, weights, sums and accumulators stay double until
// the output is rounded to float. The CUDA kernel does the same (kernels/attention.cu), so both
// round the same exact value whatever order they take the keys in (docs/NUMERICS.md).

/// out[h] = dot(q[h], k) for nr query rows against one key row.
void dot_heads_portable(const double* const* q, int64_t nr, const double* k, int64_t n, double* out) {
  for (int64_t h = 0; h < nr; ++h) {
    // independent partial sums let the compiler keep several lanes busy without -ffast-math
    double s[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int l = 0; l < 4; ++l) s[l] += q[h][i + l] * k[i + l];
    double sum = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; ++i) sum += q[h][i] * k[i];
    out[h] = sum;
  }
}

void f16_row_portable(const f16_bits* src, double* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

/// acc += sum over c of w[c] * rows[c], for n rows of length dv.
void weighted_sum_portable(double* acc, const double* w, const double* const* rows, int64_t n, int64_t dv) {
  for (int64_t c = 0; c < n; ++c)
    for (int64_t i = 0; i < dv; ++i) acc[i] += w[c] * rows[c][i];
}

#ifdef LOOM_FA_X86
__attribute__((target("avx2,fma"))) double hsum256(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/// NR heads against one key row, C independent accumulator chains per head: NR * C = 8 chains
/// keep both FMA ports busy through the 4-cycle FMA latency, and each key vector is loaded once
/// for all NR heads of a GQA group.
template <int NR, int C>
__attribute__((target("avx2,fma"))) void dot_heads_avx2_n(const double* const* q, const double* k, int64_t n,
                                                          double* out) {
  __m256d s[NR][C];
  for (int h = 0; h < NR; ++h)
    for (int c = 0; c < C; ++c) s[h][c] = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 * C <= n; i += 4 * C)
    for (int c = 0; c < C; ++c) {
      const __m256d kv = _mm256_loadu_pd(k + i + 4 * c);
      for (int h = 0; h < NR; ++h) s[h][c] = _mm256_fmadd_pd(_mm256_loadu_pd(q[h] + i + 4 * c), kv, s[h][c]);
    }
  for (; i + 4 <= n; i += 4) {
    const __m256d kv = _mm256_loadu_pd(k + i);
    for (int h = 0; h < NR; ++h) s[h][0] = _mm256_fmadd_pd(_mm256_loadu_pd(q[h] + i), kv, s[h][0]);
  }
  for (int h = 0; h < NR; ++h) {
    for (int c = 1; c < C; ++c) s[h][0] = _mm256_add_pd(s[h][0], s[h][c]);
    double sum = hsum256(s[h][0]);
    for (int64_t j = i; j < n; ++j) sum += q[h][j] * k[j];
    out[h] = sum;
  }
}

void dot_heads_avx2(const double* const* q, int64_t nr, const double* k, int64_t n, double* out) {
  int64_t h = 0;
  for (; h + 8 <= nr; h += 8) dot_heads_avx2_n<8, 1>(q + h, k, n, out + h);
  if (h + 4 <= nr) dot_heads_avx2_n<4, 2>(q + h, k, n, out + h), h += 4;
  if (h + 2 <= nr) dot_heads_avx2_n<2, 4>(q + h, k, n, out + h), h += 2;
  if (h < nr) dot_heads_avx2_n<1, 8>(q + h, k, n, out + h);
}

__attribute__((target("avx2,f16c"))) void f16_row_avx2(const f16_bits* src, double* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_pd(dst + i, _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

/// U vectors of acc (4*U doubles at i) += sum over c of w[c] * rows[c][i..]: U independent FMA
/// chains, each acc vector loaded and stored once per block of keys.
template <int U>
__attribute__((target("avx2,fma"))) void weighted_sum_avx2_n(double* acc, const double* w,
                                                             const double* const* rows, int64_t n, int64_t i) {
  __m256d a[U];
  for (int u = 0; u < U; ++u) a[u] = _mm256_loadu_pd(acc + i + 4 * u);
  for (int64_t c = 0; c < n; ++c) {
    const __m256d wc = _mm256_set1_pd(w[c]);
    const double* r = rows[c] + i;
    for (int u = 0; u < U; ++u) a[u] = _mm256_fmadd_pd(wc, _mm256_loadu_pd(r + 4 * u), a[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_storeu_pd(acc + i + 4 * u, a[u]);
}

void weighted_sum_avx2(double* acc, const double* w, const double* const* rows, int64_t n, int64_t dv) {
  int64_t i = 0;
  for (; i + 32 <= dv; i += 32) weighted_sum_avx2_n<8>(acc, w, rows, n, i);
  if (i + 16 <= dv) weighted_sum_avx2_n<4>(acc, w, rows, n, i), i += 16;
  if (i + 8 <= dv) weighted_sum_avx2_n<2>(acc, w, rows, n, i), i += 8;
  if (i + 4 <= dv) weighted_sum_avx2_n<1>(acc, w, rows, n, i), i += 4;
  for (; i < dv; ++i)
    for (int64_t c = 0; c < n; ++c) acc[i] += w[c] * rows[c][i];
}
#endif

struct RowKernels {
  void (*dot_heads)(const double* const*, int64_t, const double*, int64_t, double*);
  void (*f16_row)(const f16_bits*, double*, int64_t);
  void (*weighted_sum)(double*, const double*, const double* const*, int64_t, int64_t);
};

const RowKernels& row_kernels() {
  static const RowKernels k = [] {
#ifdef LOOM_FA_X86
    // Clang's __builtin_cpu_supports does not know "f16c"; CPUID leaf 1, ECX bit 29 is F16C.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return RowKernels{dot_heads_avx2, f16_row_avx2, weighted_sum_avx2};
#endif
    return RowKernels{dot_heads_portable, f16_row_portable, weighted_sum_portable};
  }();
  return k;
}

void f32_row(const float* src, double* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// ---- scratch layout ------------------------------------------------------------------------------

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
size_t doubles_bytes(int64_t n) { return round_up(static_cast<size_t>(n) * sizeof(double), kAlign); }

/// One thread's scratch: the run's accumulators and query rows, one converted K row, a block of
/// converted V rows.
struct Scratch {
  double* acc;    ///< [kMaxRunHeads][dv]
  double* q;      ///< [kMaxRunHeads][d]
  double* k_row;  ///< [d]
  double* v_blk;  ///< [kKeyBlock][dv]

  static size_t bytes(int64_t d, int64_t dv) {
    return doubles_bytes(kMaxRunHeads * dv) + doubles_bytes(kMaxRunHeads * d) + doubles_bytes(d) +
           doubles_bytes(kKeyBlock * dv);
  }
  static Scratch at(uint8_t* work, int ith, int64_t d, int64_t dv) {
    auto base = reinterpret_cast<uintptr_t>(work);
    base = round_up(base, kAlign) + static_cast<size_t>(ith) * bytes(d, dv);
    auto* p = reinterpret_cast<uint8_t*>(base);
    Scratch s;
    s.acc = reinterpret_cast<double*>(p);
    p += doubles_bytes(kMaxRunHeads * dv);
    s.q = reinterpret_cast<double*>(p);
    p += doubles_bytes(kMaxRunHeads * d);
    s.k_row = reinterpret_cast<double*>(p);
    p += doubles_bytes(d);
    s.v_blk = reinterpret_cast<double*>(p);
    return s;
  }
};

}  // namespace

size_t flash_attn_work_size(const Tensor& node, int nth) {
  return static_cast<size_t>(nth) * Scratch::bytes(node.src[0]->ne[0], node.src[2]->ne[0]) + kAlign;
}

void op_flash_attn(const KernelContext& ctx, Tensor* dst) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  const Tensor* v = dst->src[2];
  const Tensor* mask = dst->src[3];
  const auto* sinks = dst->src[4] ? static_cast<const float*>(dst->src[4]->data) : nullptr;
  const FlashAttnParams& p = dst->get_params<FlashAttnParams>();
  const RowKernels& rk = row_kernels();

  const int64_t d = q->ne[0], dv = v->ne[0];
  const int64_t n_q = q->ne[1], n_head = q->ne[2], ne3 = q->ne[3];
  const int64_t n_kv = k->ne[1];
  const int64_t n_rep = n_head / k->ne[2];
  const bool k_f16 = k->type == DType::f16, v_f16 = v->type == DType::f16;
  const Scratch scratch = Scratch::at(ctx.work, ctx.ith, d, dv);

  // Runs are whole GQA groups (split in runs of kMaxRunHeads), never cut where a thread's share
  // ends: dot_heads lays out its accumulators by the run length, so a head scored in a run of 1 and
  // in a run of 4 differs in the last bits. Fixed runs make results independent of the thread count
  // (perplexity is compared bit for bit between 1 and 3 threads) and of the query count (chunked
  // prefill equals one-shot prefill). The price: a decode step has only n_head_kv units of work.
  const int64_t n_head_kv = n_head / n_rep;
  const int64_t run_len = std::min(n_rep, kMaxRunHeads);
  const int64_t runs_per_group = (n_rep + run_len - 1) / run_len;
  int64_t begin, end;
  ctx.split(runs_per_group * n_head_kv * n_q * ne3, begin, end);
  for (int64_t u = begin; u < end; ++u) {
    const int64_t kv_head = (u / runs_per_group) % n_head_kv;
    const int64_t t = (u / (runs_per_group * n_head_kv)) % n_q, i3 = u / (runs_per_group * n_head_kv * n_q);
    // The run: heads h0 .. h0+nr-1, all mapped to kv_head.
    const int64_t h0 = kv_head * n_rep + (u % runs_per_group) * run_len;
    const int64_t nr = std::min(run_len, (kv_head + 1) * n_rep - h0);

    const double* q_rows[kMaxRunHeads];
    const uint8_t* m_rows[kMaxRunHeads];
    double run_max[kMaxRunHeads];
    double run_sum[kMaxRunHeads];
    bool mask_shared = true;
    for (int64_t h = 0; h < nr; ++h) {
      double* qd = scratch.q + h * d;
      f32_row(reinterpret_cast<const float*>(at(q, 0, t, h0 + h, i3)), qd, d);
      q_rows[h] = qd;
      m_rows[h] = mask ? at(mask, 0, t, (h0 + h) % mask->ne[2], i3 % mask->ne[3]) : nullptr;
      mask_shared = mask_shared && m_rows[h] == m_rows[0];
      run_max[h] = kNegInf;
      run_sum[h] = 0.0;
    }
    double* acc = scratch.acc;
    std::fill(acc, acc + nr * dv, 0.0);

    for (int64_t j0 = 0; j0 < n_kv; j0 += kKeyBlock) {
      const int64_t jn = std::min(kKeyBlock, n_kv - j0);
      // Keys of the block some head can see, and their mask values: a key every head of the run
      // ignores costs no K/V traffic (half the keys of a causal prefill).
      int64_t keys[kKeyBlock];
      double score[kMaxRunHeads][kKeyBlock];
      double bias[kMaxRunHeads][kKeyBlock];
      const int64_t n_bias_rows = mask ? (mask_shared ? 1 : nr) : 0;
      for (int64_t h = 0; h < n_bias_rows; ++h) {
        if (mask->type == DType::f16)
          rk.f16_row(reinterpret_cast<const f16_bits*>(m_rows[h]) + j0, bias[h], jn);
        else
          f32_row(reinterpret_cast<const float*>(m_rows[h]) + j0, bias[h], jn);
      }
      int64_t n_vis = 0;
      for (int64_t jj = 0; jj < jn; ++jj) {
        bool any = false;
        for (int64_t h = 0; h < nr; ++h) {
          const double b = n_bias_rows == 0 ? 0.0 : bias[n_bias_rows == 1 ? 0 : h][jj];
          score[h][n_vis] = b;
          any = any || b != kNegInf;
        }
        if (any) keys[n_vis++] = j0 + jj;
      }
      if (n_vis == 0) continue;

      // Scores: score = softcap(q.k * scale) + mask.
      for (int64_t c = 0; c < n_vis; ++c) {
        const uint8_t* k_src = at(k, 0, keys[c], kv_head, i3);
        if (k_f16)
          rk.f16_row(reinterpret_cast<const f16_bits*>(k_src), scratch.k_row, d);
        else
          f32_row(reinterpret_cast<const float*>(k_src), scratch.k_row, d);
        double dots[kMaxRunHeads];
        rk.dot_heads(q_rows, nr, scratch.k_row, d, dots);
        for (int64_t h = 0; h < nr; ++h) {
          double s = dots[h] * p.scale;
          if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
          score[h][c] += s;
        }
      }

      // Weights under the running max; the accumulator is rescaled once per block if it grew.
      bool has_weight[kMaxRunHeads];
      bool need_v = false;
      for (int64_t h = 0; h < nr; ++h) {
        double* w = score[h];
        double block_max = kNegInf;
        for (int64_t c = 0; c < n_vis; ++c)
          if (w[c] > block_max) block_max = w[c];  // NaN never wins
        has_weight[h] = block_max != kNegInf;
        if (!has_weight[h]) continue;
        if (block_max > run_max[h]) {
          if (run_max[h] != kNegInf) {
            const double f = std::exp(run_max[h] - block_max);
            double* a = acc + h * dv;
            for (int64_t i = 0; i < dv; ++i) a[i] *= f;
            run_sum[h] *= f;
          }
          run_max[h] = block_max;
        }
        double sum = 0.0;
        for (int64_t c = 0; c < n_vis; ++c) {
          w[c] = w[c] > kNegInf ? std::exp(w[c] - run_max[h]) : 0.0;  // masked or NaN: no weight
          sum += w[c];
        }
        run_sum[h] += sum;
        need_v = true;
      }
      if (!need_v) continue;

      const double* v_rows[kKeyBlock];
      for (int64_t c = 0; c < n_vis; ++c) {
        const uint8_t* v_src = at(v, 0, keys[c], kv_head, i3);
        double* buf = scratch.v_blk + c * dv;
        if (v_f16)
          rk.f16_row(reinterpret_cast<const f16_bits*>(v_src), buf, dv);
        else
          f32_row(reinterpret_cast<const float*>(v_src), buf, dv);
        v_rows[c] = buf;
      }
      for (int64_t h = 0; h < nr; ++h)
        if (has_weight[h]) rk.weighted_sum(acc + h * dv, score[h], v_rows, n_vis, dv);
    }

    for (int64_t h = 0; h < nr; ++h) {
      auto* y = reinterpret_cast<float*>(at(dst, 0, h0 + h, t, i3));
      const double* a = acc + h * dv;
      if (run_sum[h] == 0.0) {  // every key masked: zeros rather than 0/0 (a sink has no value)
        std::fill(y, y + dv, 0.0f);
        continue;
      }
      // the sink joins the denominator as one more key, relative to the running max like the others
      const double denom =
          sinks ? run_sum[h] + std::exp(static_cast<double>(sinks[h0 + h]) - run_max[h]) : run_sum[h];
      for (int64_t i = 0; i < dv; ++i) y[i] = static_cast<float>(a[i] / denom);
    }
  }
}

}  // namespace loom::cpu
