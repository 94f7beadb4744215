// CPU kernels of rope and flash_attn against straightforward double-precision loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "loom/backend.h"
#include "loom/cpu.h"
#include "loom/graph.h"
#include "loom/planner.h"

namespace loom {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Values as a tensor of `type` stores them (f16 rounding), so references see what kernels see.
std::vector<float> stored_as(DType type, std::vector<float> v) {
  if (type == DType::f16)
    for (auto& x : v) x = f16_to_f32(f32_to_f16(x));
  return v;
}

/// Allocates `g` on the CPU, writes the given leaf data, computes with `n_threads` and returns
/// `out` as floats.
struct GraphRun {
  Result<GraphAllocation> alloc = Status();
  std::vector<float> out;
};

GraphRun run_graph(Graph& g, const std::vector<std::pair<Tensor*, const std::vector<float>*>>& inputs,
                   Tensor* out, int n_threads) {
  GraphRun r;
  EXPECT_TRUE(g.status().ok()) << g.status().to_string();
  g.mark_output(out);
  r.alloc = allocate_graph(g, cpu_buffer_type());
  EXPECT_TRUE(r.alloc.ok()) << r.alloc.status().to_string();
  if (!r.alloc.ok()) return r;
  for (auto& [t, data] : inputs) {
    Status s = tensor_from_floats(t, data->data(), static_cast<int64_t>(data->size()));
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  auto backend = make_cpu_backend(n_threads);
  Status s = backend->compute(g);
  EXPECT_TRUE(s.ok()) << s.to_string();
  auto floats = tensor_to_floats(out);
  EXPECT_TRUE(floats.ok());
  if (floats.ok()) r.out = std::move(floats.value());
  return r;
}

// ---- rope --------------------------------------------------------------------------------------

struct RopeCase {
  int64_t head_dim, n_head, n_tok, ne3;
  RopeParams p;
  bool freq_factors;
};

RopeParams rope_params(int n_dims, RopeMode mode, float freq_scale = 1.0f, float ext_factor = 0.0f) {
  return RopeParams{n_dims, mode, 4096, 10000.0f, freq_scale, ext_factor, 1.0f, 32.0f, 1.0f, 0};
}

/// The YaRN paper's (arXiv:2309.00071) NTK-by-parts blend, written from the wavelength view:
/// a pair whose wavelength fits many times in the training context keeps its frequency.
std::vector<double> reference_rope(const std::vector<float>& x, const std::vector<int32_t>& pos,
                                   const std::vector<float>* ff, const RopeCase& c) {
  const RopeParams& p = c.p;
  const int n_pairs = p.n_dims / 2;
  double low = 0, high = 0;
  if (p.ext_factor != 0.0f) {
    auto corr_dim = [&](double beta) {
      return p.n_dims * std::log(p.n_ctx_orig / (beta * 2 * std::numbers::pi)) /
             (2 * std::log(double(p.freq_base)));
    };
    low = std::max(0.0, std::floor(corr_dim(p.beta_fast)));
    high = std::min(double(p.n_dims - 1), std::ceil(corr_dim(p.beta_slow)));
  }
  double mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);

  std::vector<double> y(x.begin(), x.end());
  for (int64_t i3 = 0; i3 < c.ne3; ++i3)
    for (int64_t t = 0; t < c.n_tok; ++t)
      for (int64_t h = 0; h < c.n_head; ++h) {
        const size_t row = ((i3 * c.n_tok + t) * c.n_head + h) * c.head_dim;
        for (int i = 0; i < n_pairs; ++i) {
          double theta_extrap = pos[t] * std::pow(double(p.freq_base), -2.0 * i / p.n_dims);
          if (ff) theta_extrap /= (*ff)[i];
          double theta = p.freq_scale * theta_extrap;
          if (p.ext_factor != 0.0f) {
            const double ramp = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
            const double mix = ramp * p.ext_factor;
            theta = theta * (1 - mix) + theta_extrap * mix;
          }
          const size_t i0 = p.mode == RopeMode::neox ? row + i : row + 2 * i;
          const size_t i1 = p.mode == RopeMode::neox ? row + i + n_pairs : row + 2 * i + 1;
          const double x0 = x[i0], x1 = x[i1];
          y[i0] = (x0 * std::cos(theta) - x1 * std::sin(theta)) * mscale;
          y[i1] = (x0 * std::sin(theta) + x1 * std::cos(theta)) * mscale;
        }
      }
  return y;
}

/// Runs rope over an intermediate (so the planner may run it in place) and checks the result.
void check_rope(const RopeCase& c, int n_threads, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "head_dim " << c.head_dim << " n_dims " << c.p.n_dims << " mode "
                                  << int(c.p.mode) << " freq_scale " << c.p.freq_scale << " ext "
                                  << c.p.ext_factor << " ff " << c.freq_factors << " threads " << n_threads);
  Graph g;
  Tensor* x = g.input(DType::f32, {c.head_dim, c.n_head, c.n_tok, c.ne3}, "x");
  Tensor* pos = g.input(DType::i32, {c.n_tok, 1, 1, 1}, "pos");
  Tensor* ff = c.freq_factors ? g.input(DType::f32, {c.p.n_dims / 2, 1, 1, 1}, "ff") : nullptr;
  Tensor* xs = scale(g, x, 1.0f);  // an intermediate rope may overwrite
  Tensor* out = rope(g, xs, pos, ff, c.p);
  ASSERT_NE(out, nullptr) << g.status().to_string();

  const auto xv = random_floats(static_cast<size_t>(x->nelements()), seed);
  std::vector<int32_t> positions(c.n_tok);
  const int32_t pick[] = {0, 1, 2, 17, 100, 511, 4095, 4097, 12000, 33000, 7, 250000};
  for (int64_t t = 0; t < c.n_tok; ++t)
    positions[t] = pick[t % std::size(pick)] + int32_t(t / std::size(pick));
  std::vector<float> posf(positions.begin(), positions.end());
  std::vector<float> ffv;
  if (ff) {
    ffv = random_floats(static_cast<size_t>(c.p.n_dims / 2), seed + 1, 1.0f, 8.0f);
    ffv[0] = 1.0f;
  }

  std::vector<std::pair<Tensor*, const std::vector<float>*>> inputs = {{x, &xv}, {pos, &posf}};
  if (ff) inputs.push_back({ff, &ffv});
  GraphRun r = run_graph(g, inputs, out, n_threads);
  ASSERT_TRUE(r.alloc.ok());
  EXPECT_EQ(r.alloc.value().plan.in_place_of[out->index], xs->index) << "rope should run in place here";

  const auto ref = reference_rope(xv, positions, ff ? &ffv : nullptr, c);
  ASSERT_EQ(r.out.size(), ref.size());
  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::abs(r.out[i] - ref[i]));
  EXPECT_LT(max_err, 2e-6 * (c.p.attn_factor + 1.0));
  // The unrotated tail is copied exactly.
  for (size_t row = 0; row < ref.size() / c.head_dim; ++row)
    for (int64_t i = c.p.n_dims; i < c.head_dim; ++i)
      ASSERT_EQ(r.out[row * c.head_dim + i], xv[row * c.head_dim + i]);
}

TEST(RopeCpu, MatchesReference) {
  std::vector<RopeCase> cases = {
      {64, 4, 12, 1, rope_params(64, RopeMode::normal), false},
      {64, 4, 12, 1, rope_params(64, RopeMode::neox), false},
      {96, 3, 5, 2, rope_params(32, RopeMode::normal), false},                // n_dims < head_dim, ne3 > 1
      {96, 3, 5, 1, rope_params(64, RopeMode::neox), true},                   // partial + freq_factors
      {128, 2, 9, 1, rope_params(128, RopeMode::normal, 0.25f), false},       // linear scaling
      {128, 5, 13, 1, rope_params(128, RopeMode::neox, 0.25f, 1.0f), false},  // YaRN
      {80, 2, 6, 1, rope_params(64, RopeMode::normal, 0.125f, 0.6f), true},   // YaRN partial mix
  };
  cases[5].p.attn_factor = 0.8f;
  uint32_t seed = 10;
  for (const auto& c : cases)
    for (int nth : {1, 3}) check_rope(c, nth, seed++);
}

TEST(RopeCpu, YarnRangeIsWhereTheRampMoves) {
  // n_dims 64, base 1e4, n_ctx_orig 4096: dim(32) = 10.47 -> low 10, dim(1) = 22.5 -> high 23.
  // With freq_scale 1 the blend is invisible, so use a large scale and compare against pure
  // extrapolation (pairs < 10) and pure interpolation (pairs >= 23) directly.
  RopeCase c{64, 1, 1, 1, rope_params(64, RopeMode::normal, 0.25f, 1.0f), false};
  Graph g;
  Tensor* x = g.input(DType::f32, {64, 1, 1, 1}, "x");
  Tensor* pos = g.input(DType::i32, {1, 1, 1, 1}, "pos");
  Tensor* out = rope(g, x, pos, nullptr, c.p);
  std::vector<float> xv(64);
  for (int i = 0; i < 32; ++i) xv[2 * i] = 1.0f, xv[2 * i + 1] = 0.0f;  // angle readable via atan2
  const std::vector<float> pv = {1000.0f};
  GraphRun r = run_graph(g, {{x, &xv}, {pos, &pv}}, out, 1);
  ASSERT_EQ(r.out.size(), 64u);
  const double mscale = 1.0 + 0.1 * std::log(4.0);
  for (int i = 0; i < 32; ++i) {
    const double mag = std::hypot(r.out[2 * i], r.out[2 * i + 1]);
    EXPECT_NEAR(mag, mscale, 1e-5) << "pair " << i;
    const double extrap = 1000.0 * std::pow(10000.0, -2.0 * i / 64);
    const double want = i < 10 ? extrap : i >= 23 ? 0.25 * extrap : -1;
    if (want < 0) continue;
    const double got = std::atan2(r.out[2 * i + 1], r.out[2 * i]);
    EXPECT_NEAR(std::remainder(got - want, 2 * std::numbers::pi), 0.0, 1e-5) << "pair " << i;
  }
}

TEST(RopeCpu, ScoresDependOnRelativePosition) {
  // <rope(q, m), rope(k, n)> depends only on m - n: the property RoPE exists for.
  RopeParams p = rope_params(64, RopeMode::neox);
  Graph g;
  Tensor* x = g.input(DType::f32, {64, 1, 4, 1}, "x");
  Tensor* pos = g.input(DType::i32, {4, 1, 1, 1}, "pos");
  Tensor* out = rope(g, x, pos, nullptr, p);
  const auto q = random_floats(64, 3), k = random_floats(64, 4);
  std::vector<float> xv;
  for (const auto* v : {&q, &k, &q, &k}) xv.insert(xv.end(), v->begin(), v->end());
  const std::vector<float> pv = {10, 3, 1010, 1003};  // (q@10, k@3) and (q@1010, k@1003)
  GraphRun r = run_graph(g, {{x, &xv}, {pos, &pv}}, out, 2);
  ASSERT_EQ(r.out.size(), 256u);
  double s0 = 0, s1 = 0, raw = 0;
  for (int i = 0; i < 64; ++i) {
    s0 += double(r.out[i]) * r.out[64 + i];
    s1 += double(r.out[128 + i]) * r.out[192 + i];
    raw += double(q[i]) * k[i];
  }
  EXPECT_NEAR(s0, s1, 2e-4);
  EXPECT_GT(std::abs(s0 - raw), 1e-3);  // and rotation did change the score
}

// ---- flash attention -----------------------------------------------------------------------------

enum class MaskKind { none, f32, f16 };

struct AttnCase {
  int64_t d, dv, n_q, n_kv, n_head, n_head_kv, ne3;
  DType kv_type;
  MaskKind mask;
  float scale, softcap;
  bool cache_view;         ///< K/V as views of a longer cache (strided rows)
  int64_t mask_heads = 1;  ///< mask.ne2: 1 broadcasts over heads, n_head gives each head its own
};

/// out[t, h, :] in the kernel's layout [dv, n_head, n_q, ne3]; also the largest |score| seen.
std::vector<double> reference_attention(const AttnCase& c, const std::vector<float>& q,
                                        const std::vector<float>& k, const std::vector<float>& v,
                                        const std::vector<float>* mask, double& max_score) {
  max_score = 0;
  std::vector<double> out(static_cast<size_t>(c.dv * c.n_head * c.n_q * c.ne3));
  std::vector<double> s(c.n_kv);
  const int64_t rep = c.n_head / c.n_head_kv;
  for (int64_t i3 = 0; i3 < c.ne3; ++i3)
    for (int64_t h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.n_q; ++t) {
        const int64_t hk = h / rep;
        const float* qr = &q[((i3 * c.n_head + h) * c.n_q + t) * c.d];
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.n_kv; ++j) {
          const float* kr = &k[((i3 * c.n_head_kv + hk) * c.n_kv + j) * c.d];
          double dot = 0;
          for (int64_t i = 0; i < c.d; ++i) dot += double(qr[i]) * kr[i];
          dot *= c.scale;
          if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
          max_score = std::max(max_score, std::abs(dot));
          if (mask) dot += (*mask)[((h % c.mask_heads) * (c.n_q + 3) + t) * c.n_kv + j];
          s[j] = dot;
          mx = std::max(mx, dot);
        }
        double* o = &out[((i3 * c.n_q + t) * c.n_head + h) * c.dv];
        if (mx == -INFINITY) continue;  // fully masked: zeros
        double sum = 0;
        for (int64_t j = 0; j < c.n_kv; ++j) sum += s[j] = std::exp(s[j] - mx);
        for (int64_t j = 0; j < c.n_kv; ++j) {
          const float* vr = &v[((i3 * c.n_head_kv + hk) * c.n_kv + j) * c.dv];
          for (int64_t i = 0; i < c.dv; ++i) o[i] += s[j] / sum * vr[i];
        }
      }
  return out;
}

void check_attention(const AttnCase& c, int n_threads, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "d " << c.d << " dv " << c.dv << " n_q " << c.n_q << " n_kv " << c.n_kv
                                  << " heads " << c.n_head << "/" << c.n_head_kv << " ne3 " << c.ne3 << " kv "
                                  << dtype_name(c.kv_type) << " mask " << int(c.mask) << " softcap "
                                  << c.softcap << " view " << c.cache_view << " threads " << n_threads);
  Graph g;
  const int64_t n_ctx = c.cache_view ? c.n_kv + 11 : c.n_kv;  // cache length; views take n_kv rows
  Tensor* q = g.input(DType::f32, {c.d, c.n_q, c.n_head, c.ne3}, "q");
  Tensor* kc = g.input(c.kv_type, {c.d, n_ctx, c.n_head_kv, c.ne3}, "k_cache");
  Tensor* vc = g.input(c.kv_type, {c.dv, n_ctx, c.n_head_kv, c.ne3}, "v_cache");
  Tensor* k = c.cache_view ? view(g, kc, {c.d, c.n_kv, c.n_head_kv, c.ne3}, kc->nb, 0) : kc;
  Tensor* v = c.cache_view ? view(g, vc, {c.dv, c.n_kv, c.n_head_kv, c.ne3}, vc->nb, 0) : vc;
  const int64_t mask_rows = c.n_q + 3;  // padded, as runtimes allocate it
  Tensor* mask = nullptr;
  if (c.mask != MaskKind::none)
    mask = g.input(c.mask == MaskKind::f16 ? DType::f16 : DType::f32, {c.n_kv, mask_rows, c.mask_heads, 1},
                   "mask");
  Tensor* out = flash_attn(g, q, k, v, mask, c.scale, c.softcap);
  ASSERT_NE(out, nullptr) << g.status().to_string();
  ASSERT_EQ(out->ne, (Shape{c.dv, c.n_head, c.n_q, c.ne3}));

  const auto qv = random_floats(static_cast<size_t>(q->nelements()), seed);
  const auto kcv = stored_as(c.kv_type, random_floats(static_cast<size_t>(kc->nelements()), seed + 1));
  const auto vcv =
      stored_as(c.kv_type, random_floats(static_cast<size_t>(vc->nelements()), seed + 2, -2.0f, 2.0f));
  // Causal mask (query t sees keys up to n_kv - n_q + t), a few random holes, a soft bias, and
  // the last query fully masked when there are several.
  std::vector<float> mv(static_cast<size_t>(c.n_kv * mask_rows * c.mask_heads), 0.0f);
  if (mask) {
    std::mt19937 rng(seed + 3);
    for (int64_t t = 0; t < mask_rows * c.mask_heads; ++t)
      for (int64_t j = 0; j < c.n_kv; ++j) {
        float m = std::uniform_real_distribution<float>(-1.5f, 0.0f)(rng);
        if (j > 0 && rng() % 7 == 0) m = -kInf;
        if (c.n_q > 1 && t % mask_rows == c.n_q - 1) m = -kInf;
        if (j > c.n_kv - c.n_q + t % mask_rows) m = -kInf;
        mv[t * c.n_kv + j] = m;
      }
    mv = stored_as(mask->type, mv);
  }
  // The views' data: the first n_kv rows of each cache head.
  auto slice = [&](const std::vector<float>& cache, int64_t row) {
    std::vector<float> s;
    for (int64_t i = 0; i < c.n_head_kv * c.ne3; ++i)
      s.insert(s.end(), cache.begin() + i * n_ctx * row, cache.begin() + (i * n_ctx + c.n_kv) * row);
    return s;
  };
  const auto kv = slice(kcv, c.d), vv = slice(vcv, c.dv);

  std::vector<std::pair<Tensor*, const std::vector<float>*>> inputs = {{q, &qv}, {kc, &kcv}, {vc, &vcv}};
  if (mask) inputs.push_back({mask, &mv});
  GraphRun r = run_graph(g, inputs, out, n_threads);
  double max_score = 0;
  const auto ref = reference_attention(c, qv, kv, vv, mask ? &mv : nullptr, max_score);
  ASSERT_EQ(r.out.size(), ref.size());

  double max_err = 0, max_ref = 0;
  size_t zeros = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(r.out[i])) << "element " << i;
    max_err = std::max(max_err, std::abs(r.out[i] - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
    zeros += r.out[i] == 0.0f;
  }
  ASSERT_GT(max_ref, 0.05);  // the data is not degenerate
  // f32 scores carry an absolute error of a few ulp of their magnitude, which becomes a relative
  // error of the weights: sharp (large-score) cases get a proportionally larger bound.
  const double tol = 2e-6 * max_ref * std::max(1.0, max_score / 8.0);
  EXPECT_LT(max_err, tol) << "max_err " << max_err << " max_ref " << max_ref << " max_score " << max_score;
  if (mask && c.n_q > 1) {
    EXPECT_GE(zeros, static_cast<size_t>(c.dv * c.n_head * c.ne3));  // the fully masked query
    for (int64_t i3 = 0; i3 < c.ne3; ++i3)
      for (int64_t i = 0; i < c.dv * c.n_head; ++i)
        ASSERT_EQ(r.out[((i3 * c.n_q + c.n_q - 1) * c.n_head) * c.dv + i], 0.0f);
  }
}

TEST(FlashAttnCpu, MatchesReference) {
  const float s64 = 1.0f / 8.0f, s80 = 1.0f / std::sqrt(80.0f);
  const std::vector<AttnCase> cases = {
      {64, 64, 1, 37, 8, 2, 1, DType::f32, MaskKind::none, s64, 0.0f, false},  // decode, GQA 4:1
      {64, 64, 7, 37, 8, 2, 1, DType::f32, MaskKind::f32, s64, 0.0f, false},
      {80, 80, 7, 37, 8, 2, 1, DType::f16, MaskKind::f16, s80, 0.0f, true},  // f16 cache views
      {80, 80, 1, 37, 4, 1, 1, DType::f16, MaskKind::f32, s80, 0.0f, true},
      {80, 80, 7, 1, 8, 2, 1, DType::f32, MaskKind::none, s80, 0.0f, false},  // a single key
      {80, 80, 1, 1, 4, 4, 1, DType::f16, MaskKind::f16, s80, 0.0f, false},
      {64, 64, 7, 37, 8, 2, 1, DType::f32, MaskKind::f32, 3.0f, 5.0f, false},  // softcap bites
      {80, 80, 7, 37, 4, 1, 2, DType::f16, MaskKind::f16, 2.0f, 4.0f, true},   // softcap, ne3 2
      {96, 64, 7, 37, 6, 3, 1, DType::f32, MaskKind::f32, 4.0f, 0.0f, false},  // dv != d, sharp
      {128, 128, 3, 300, 32, 8, 1, DType::f16, MaskKind::f16, 0.0884f, 0.0f, true},
      {64, 64, 7, 37, 8, 2, 1, DType::f16, MaskKind::f32, 1.0f, 0.0f, false, 8},  // mask per head
  };
  uint32_t seed = 100;
  for (const auto& c : cases)
    for (int nth : {1, 3}) check_attention(c, nth, seed += 5);
}

TEST(FlashAttnCpu, EveryKeyMaskedGivesZeros) {
  AttnCase c{64, 64, 2, 5, 2, 1, 1, DType::f32, MaskKind::f32, 0.125f, 0.0f, false};
  Graph g;
  Tensor* q = g.input(DType::f32, {64, 2, 2, 1}, "q");
  Tensor* k = g.input(DType::f32, {64, 5, 1, 1}, "k");
  Tensor* v = g.input(DType::f32, {64, 5, 1, 1}, "v");
  Tensor* mask = g.input(DType::f32, {5, 2, 1, 1}, "mask");
  Tensor* out = flash_attn(g, q, k, v, mask, c.scale);
  const auto qv = random_floats(256, 1), kv = random_floats(320, 2), vv = random_floats(320, 3);
  std::vector<float> mv(10, -kInf);
  mv[5 + 3] = 0.0f;  // query 1 sees key 3 only
  GraphRun r = run_graph(g, {{q, &qv}, {k, &kv}, {v, &vv}, {mask, &mv}}, out, 2);
  ASSERT_EQ(r.out.size(), 64u * 2 * 2);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(r.out[(0 * 2 + h) * 64 + i], 0.0f);                  // query 0: nothing visible
      EXPECT_FLOAT_EQ(r.out[(1 * 2 + h) * 64 + i], vv[3 * 64 + i]);  // query 1: exactly v[3]
    }
}

}  // namespace
}  // namespace loom
