// The model layer against an independent float64 implementation (in the style of
// test_llama_block.cpp) that reads the same GGUF weights: llama (normal RoPE), qwen2 (biases, NeoX
// RoPE, tied output) and qwen3 (QK-norm, head size != n_embd / n_head).
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

using Vec = std::vector<double>;

struct RefWeights {
  const GgufFile* f;
  std::vector<float> get(const std::string& name) const {
    const GgufTensorInfo* t = f->find_tensor(name);
    if (!t) return {};
    std::vector<float> out(static_cast<size_t>(t->nelements()));
    dequantize_row(*t->dtype, t->data, out.data(), t->nelements());
    return out;
  }
  bool has(const std::string& name) const { return f->find_tensor(name) != nullptr; }
};

// y[r] = sum_k w[r*K + k] x[k]: a GGUF weight [K, rows] holds one row per output.
Vec matvec(const std::vector<float>& w, const Vec& x, size_t rows) {
  const size_t k_dim = x.size();
  Vec y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t k = 0; k < k_dim; ++k) y[r] += static_cast<double>(w[r * k_dim + k]) * x[k];
  return y;
}

void add_bias(Vec& y, const std::vector<float>& b) {
  for (size_t i = 0; i < b.size(); ++i) y[i] += b[i];
}

// RMS norm of each group of `n` values, times w.
void rmsnorm_groups(Vec& x, const std::vector<float>& w, size_t n, double eps) {
  for (size_t g = 0; g < x.size() / n; ++g) {
    double ss = 0.0;
    for (size_t i = 0; i < n; ++i) ss += x[g * n + i] * x[g * n + i];
    const double s = 1.0 / std::sqrt(ss / n + eps);
    for (size_t i = 0; i < n; ++i) x[g * n + i] = x[g * n + i] * s * w[i];
  }
}

// Normal mode rotates pairs (2i, 2i+1); NeoX rotates (i, i + n_rot/2).
void rope(Vec& v, size_t n_heads, size_t hd, size_t n_rot, int pos, double base, bool neox) {
  for (size_t h = 0; h < n_heads; ++h)
    for (size_t i = 0; i < n_rot / 2; ++i) {
      const double theta = pos * std::pow(base, -2.0 * i / n_rot);
      const size_t a_i = neox ? i : 2 * i, b_i = neox ? i + n_rot / 2 : 2 * i + 1;
      double& a = v[h * hd + a_i];
      double& b = v[h * hd + b_i];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(theta) - b0 * std::sin(theta);
      b = a0 * std::sin(theta) + b0 * std::cos(theta);
    }
}

double f16_round(double x) { return f16_to_f32(f32_to_f16(static_cast<float>(x))); }

std::vector<Vec> reference_logits(const GgufFile& f, const HParams& hp, const std::vector<int32_t>& tokens,
                                  int pos0) {
  RefWeights w{&f};
  const size_t T = tokens.size(), E = hp.n_embd, hd = hp.head_dim_k, H = hp.n_head, Hkv = hp.n_head_kv;
  const bool neox = hp.arch != Arch::llama;
  const auto embd = w.get("token_embd.weight");
  std::vector<Vec> x(T, Vec(E));
  for (size_t t = 0; t < T; ++t)
    for (size_t e = 0; e < E; ++e) x[t][e] = embd[tokens[t] * E + e];
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    auto n = [il](const char* what) { return "blk." + std::to_string(il) + "." + what; };
    const auto attn_norm = w.get(n("attn_norm.weight")), wq = w.get(n("attn_q.weight")),
               wk = w.get(n("attn_k.weight")), wv = w.get(n("attn_v.weight")),
               wo = w.get(n("attn_output.weight")), ffn_norm = w.get(n("ffn_norm.weight")),
               wg = w.get(n("ffn_gate.weight")), wu = w.get(n("ffn_up.weight")),
               wd = w.get(n("ffn_down.weight"));
    std::vector<Vec> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      Vec h = x[t];
      rmsnorm_groups(h, attn_norm, E, hp.norm_rms_eps);
      q[t] = matvec(wq, h, H * hd);
      k[t] = matvec(wk, h, Hkv * hd);
      v[t] = matvec(wv, h, Hkv * hd);
      if (w.has(n("attn_q.bias"))) {
        add_bias(q[t], w.get(n("attn_q.bias")));
        add_bias(k[t], w.get(n("attn_k.bias")));
        add_bias(v[t], w.get(n("attn_v.bias")));
      }
      if (w.has(n("attn_q_norm.weight"))) {
        rmsnorm_groups(q[t], w.get(n("attn_q_norm.weight")), hd, hp.norm_rms_eps);
        rmsnorm_groups(k[t], w.get(n("attn_k_norm.weight")), hd, hp.norm_rms_eps);
      }
      const int p = pos0 + static_cast<int>(t);
      rope(q[t], H, hd, hp.n_rot, p, hp.rope_freq_base, neox);
      rope(k[t], Hkv, hd, hp.n_rot, p, hp.rope_freq_base, neox);
      for (double& e : k[t]) e = f16_round(e);  // the cache holds K and V in f16
      for (double& e : v[t]) e = f16_round(e);
    }
    const size_t group = H / Hkv;
    for (size_t t = 0; t < T; ++t) {
      Vec att(H * hd, 0.0);
      for (size_t h = 0; h < H; ++h) {
        const size_t kvh = h / group;
        Vec s(t + 1);
        double mx = -INFINITY;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (size_t d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[j][kvh * hd + d];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (double& sj : s) sum += (sj = std::exp(sj - mx));
        for (size_t j = 0; j <= t; ++j)
          for (size_t d = 0; d < hd; ++d) att[h * hd + d] += s[j] / sum * v[j][kvh * hd + d];
      }
      const Vec o = matvec(wo, att, E);
      for (size_t e = 0; e < E; ++e) x[t][e] += o[e];
      Vec h = x[t];
      rmsnorm_groups(h, ffn_norm, E, hp.norm_rms_eps);
      Vec gate = matvec(wg, h, hp.n_ff);
      const Vec up = matvec(wu, h, hp.n_ff);
      for (size_t i = 0; i < hp.n_ff; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const Vec d = matvec(wd, gate, E);
      for (size_t e = 0; e < E; ++e) x[t][e] += d[e];
    }
  }
  const auto out_norm = w.get("output_norm.weight");
  const auto out = w.has("output.weight") ? w.get("output.weight") : embd;
  std::vector<Vec> logits(T);
  for (size_t t = 0; t < T; ++t) {
    Vec h = x[t];
    rmsnorm_groups(h, out_norm, E, hp.norm_rms_eps);
    logits[t] = matvec(out, h, hp.n_vocab);
  }
  return logits;
}

class LlmReference : public ModelFiles, public ::testing::WithParamInterface<const char*> {};

// Logits of every token of a 9-token prompt starting at position 3, in two chunks (n_batch 5).
// The reference rounds K and V to f16 like the cache, so what remains is f32 against f64
// arithmetic: NMSE ~1e-11 measured; 1e-8 leaves room for other summation orders while any
// mistake in positions, masking, head mapping or norms gives 1e-3 or more.
TEST_P(LlmReference, MatchesFloat64) {
  const std::string file = model(GetParam(), "f32", 5);
  auto backend = make_cpu_backend(2);
  auto m = Model::load(file, *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto ctx = Context::create(**m, ContextParams{32, 5, 0});
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const HParams& hp = (*m)->hparams();
  const auto tokens = test_tokens(9, static_cast<int>(hp.n_vocab), 21);
  const int pos0 = 3;
  DecodeOptions all;
  all.all_logits = true;
  auto got = (*ctx)->decode(tokens, pos0, all);
  ASSERT_TRUE(got.ok()) << got.status().to_string();

  const auto ref = reference_logits((*m)->gguf(), hp, tokens, pos0);
  std::vector<double> flat;
  for (const Vec& r : ref) flat.insert(flat.end(), r.begin(), r.end());
  ASSERT_EQ(got->size(), flat.size());
  for (float v : *got) ASSERT_TRUE(std::isfinite(v));
  double energy = 0.0;
  for (double v : flat) energy += v * v;
  ASSERT_GT(energy / flat.size(), 0.05);  // logits are not trivially small
  const double e = nmse(*got, flat);
  EXPECT_LT(e, 1e-8) << "NMSE " << e;
}

INSTANTIATE_TEST_SUITE_P(Archs, LlmReference, ::testing::Values("tiny", "qwen2-tiny", "qwen3-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace loom::llm::testing
