// A 2-layer LLaMA-style decoder built from Loom ops equals an independent float64 implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "llama_block.h"
#include "loom/cpu.h"
#include "loom/planner.h"

namespace loom {
namespace {

using Mat = std::vector<double>;  // row-major, rows of `cols`

struct RefModel {
  llm::LlamaConfig c;
  std::vector<float> embd, out_norm, out;
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, ffn_norm, wg, wu, wd;
  };
  std::vector<Layer> layers;
};

// y[r] = sum_k w[r*k_dim + k] * x[k]: the ggml layout, a weight [k_dim, rows] holds one row per output.
std::vector<double> matvec(const std::vector<float>& w, const std::vector<double>& x, int rows) {
  const size_t k_dim = x.size();
  std::vector<double> y(rows, 0.0);
  for (int r = 0; r < rows; ++r)
    for (size_t k = 0; k < k_dim; ++k) y[r] += static_cast<double>(w[r * k_dim + k]) * x[k];
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

void rope_normal(std::vector<double>& v, int n_heads, int hd, int pos, double base) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      const double theta = pos * std::pow(base, -2.0 * i / hd);
      double& a = v[h * hd + 2 * i];
      double& b = v[h * hd + 2 * i + 1];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(theta) - b0 * std::sin(theta);
      b = a0 * std::sin(theta) + b0 * std::cos(theta);
    }
}

std::vector<std::vector<double>> reference_logits(const RefModel& m, const std::vector<int>& tokens,
                                                  const std::vector<int>& pos) {
  const auto& c = m.c;
  const int T = static_cast<int>(tokens.size()), E = c.n_embd, hd = c.head_dim();
  std::vector<std::vector<double>> x(T, std::vector<double>(E));
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) x[t][e] = m.embd[tokens[t] * E + e];
  for (const auto& l : m.layers) {
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      auto h = rmsnorm(x[t], l.attn_norm, c.norm_eps);
      q[t] = matvec(l.wq, h, c.n_head * hd);
      k[t] = matvec(l.wk, h, c.n_head_kv * hd);
      v[t] = matvec(l.wv, h, c.n_head_kv * hd);
      rope_normal(q[t], c.n_head, hd, pos[t], c.rope_base);
      rope_normal(k[t], c.n_head_kv, hd, pos[t], c.rope_base);
    }
    const int group = c.n_head / c.n_head_kv;
    for (int t = 0; t < T; ++t) {
      std::vector<double> att(c.n_head * hd, 0.0);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / group;
        std::vector<double> s(t + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {  // causal: keys up to t
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[j][kvh * hd + d];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (double& sj : s) sum += (sj = std::exp(sj - mx));
        for (int j = 0; j <= t; ++j)
          for (int d = 0; d < hd; ++d) att[h * hd + d] += s[j] / sum * v[j][kvh * hd + d];
      }
      auto o = matvec(l.wo, att, E);
      for (int e = 0; e < E; ++e) x[t][e] += o[e];
      auto h = rmsnorm(x[t], l.ffn_norm, c.norm_eps);
      auto gate = matvec(l.wg, h, c.n_ff);
      auto up = matvec(l.wu, h, c.n_ff);
      for (int i = 0; i < c.n_ff; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      auto d = matvec(l.wd, gate, E);
      for (int e = 0; e < E; ++e) x[t][e] += d[e];
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int t = 0; t < T; ++t) logits[t] = matvec(m.out, rmsnorm(x[t], m.out_norm, c.norm_eps), c.n_vocab);
  return logits;
}

std::vector<float> random_vec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class LlamaBlockTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(LlamaBlockTest, MatchesFloat64Reference) {
  const auto [n_threads, flash] = GetParam();
  llm::LlamaConfig c;
  c.n_vocab = 97;
  c.n_embd = 64;
  c.n_head = 8;
  c.n_head_kv = 2;  // 4 query heads per key head
  c.n_ff = 176;
  c.n_layer = 2;
  c.use_flash_attn = flash;
  std::mt19937 rng(1234 + n_threads);

  RefModel m;
  m.c = c;
  const int E = c.n_embd, hd = c.head_dim();
  auto w = [&](int k, int rows) { return random_vec(rng, static_cast<size_t>(k) * rows, -1.0f / std::sqrt(k) * 1.7f, 1.0f / std::sqrt(k) * 1.7f); };
  auto normw = [&](int n) { return random_vec(rng, n, 0.7f, 1.3f); };
  m.embd = random_vec(rng, static_cast<size_t>(E) * c.n_vocab, -1.0f, 1.0f);
  for (int il = 0; il < c.n_layer; ++il) {
    RefModel::Layer l;
    l.attn_norm = normw(E);
    l.wq = w(E, c.n_head * hd);
    l.wk = w(E, c.n_head_kv * hd);
    l.wv = w(E, c.n_head_kv * hd);
    l.wo = w(c.n_head * hd, E);
    l.ffn_norm = normw(E);
    l.wg = w(E, c.n_ff);
    l.wu = w(E, c.n_ff);
    l.wd = w(c.n_ff, E);
    m.layers.push_back(std::move(l));
  }
  m.out_norm = normw(E);
  m.out = w(E, c.n_vocab);

  const int T = 7;
  std::vector<int> tokens, pos;
  for (int t = 0; t < T; ++t) {
    tokens.push_back(static_cast<int>(rng() % c.n_vocab));
    pos.push_back(3 + t);  // not starting at 0: positions are data, not indices
  }

  Graph g;
  auto weights = llm::declare_llama_weights(g, c);
  auto inputs = llm::declare_llama_inputs(g, T);
  Tensor* logits = llm::build_llama(g, c, weights, inputs);
  ASSERT_TRUE(g.status().ok()) << g.status().to_string();
  g.mark_output(logits);
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();

  auto set = [](Tensor* t, const std::vector<float>& v) {
    Status s = tensor_from_floats(t, v.data(), static_cast<int64_t>(v.size()));
    ASSERT_TRUE(s.ok()) << s.to_string();
  };
  set(weights.tok_embd, m.embd);
  for (int il = 0; il < c.n_layer; ++il) {
    const auto& l = m.layers[il];
    const auto& L = weights.layers[il];
    set(L.attn_norm, l.attn_norm); set(L.wq, l.wq); set(L.wk, l.wk); set(L.wv, l.wv); set(L.wo, l.wo);
    set(L.ffn_norm, l.ffn_norm); set(L.w_gate, l.wg); set(L.w_up, l.wu); set(L.w_down, l.wd);
  }
  set(weights.output_norm, m.out_norm);
  set(weights.output, m.out);
  std::vector<float> tok_f(tokens.begin(), tokens.end()), pos_f(pos.begin(), pos.end());
  set(inputs.tokens, tok_f);
  set(inputs.positions, pos_f);
  set(inputs.mask, llm::causal_mask(T));
  // poison the activations so a node that is never written cannot pass
  ASSERT_TRUE(alloc->arena->fill(0, 0xff, alloc->arena->size()).ok());

  auto backend = make_cpu_backend(n_threads);
  Status st = backend->compute(g);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto got = tensor_to_floats(logits);
  ASSERT_TRUE(got.ok());

  auto ref = reference_logits(m, tokens, pos);
  double num = 0.0, den = 0.0;
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < c.n_vocab; ++v) {
      const double a = (*got)[t * c.n_vocab + v], b = ref[t][v];
      ASSERT_TRUE(std::isfinite(a)) << "token " << t << " logit " << v;
      num += (a - b) * (a - b);
      den += b * b;
    }
  ASSERT_GT(den, 1.0);  // the logits are not trivially small
  EXPECT_LT(num / den, 1e-5) << "NMSE " << num / den;
  EXPECT_GT(alloc->plan.n_in_place, 0);
}

INSTANTIATE_TEST_SUITE_P(Threads, LlamaBlockTest,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return fmt::format("t{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "flash" : "softmax");
                         });

}  // namespace
}  // namespace loom
