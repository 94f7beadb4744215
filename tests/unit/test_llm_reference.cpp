// The model layer against an independent float64 implementation (in the style of
// test_llama_block.cpp) that reads the same GGUF weights: llama (normal RoPE; Llama 3.1's rope_freqs,
// tied output and q/k/v biases in llama31-tiny), qwen2 (biases, NeoX RoPE, tied output; YaRN in
// qwen2-yarn-tiny), qwen3 (QK-norm, head size != n_embd / n_head) and phi3 (fused qkv and gate/up,
// every layer windowed; LongRoPE and 3/4 of each head rotated in phi3-longrope-tiny) and gpt-oss (as
// Hugging Face's GptOssForCausalLM defines it: biases everywhere, attention sinks, sliding layers 0, 2,
// ..., YaRN with an unrounded correction range, a top-k-then-softmax router over biased experts with
// the clamped SwiGLU).
#include "test_llm_common.h"

#include <algorithm>
#include <numbers>

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

// Per-pair angle rates and the cos/sin magnitude of a file's RoPE, derived from its metadata and
// rope_freqs tensor the way the papers and Hugging Face describe them: theta_i = pos * inv_freq_i.
struct RopeRef {
  std::vector<double> inv_freq;
  double mscale = 1.0;
};

RopeRef rope_ref(const GgufFile& f, const HParams& hp, const RefWeights& w, bool scaled, int n_ctx,
                 bool yarn_unrounded) {
  const std::string p = std::string(arch_name(hp.arch)) + ".";
  const size_t n_rot = hp.n_rot;
  const double base = hp.rope_freq_base;
  RopeRef r;
  auto factors = scaled ? w.get("rope_freqs.weight") : std::vector<float>{};  // Llama 3.1: divisors
  if (scaled && w.has("rope_factors_short.weight")) {
    // Phi-3 LongRoPE: the long divisors for a context beyond the original one, and cos/sin scaled by
    // sqrt(1 + ln(s) / ln(original)), s = context_length / original.
    const double orig = *f.get_u32(p + "rope.scaling.original_context_length");
    const double s = *f.get_u32(p + "context_length") / orig;
    factors = w.get(n_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight");
    r.mscale = s > 1.0 ? std::sqrt(1.0 + std::log(s) / std::log(orig)) : 1.0;
  }
  for (size_t i = 0; i < n_rot / 2; ++i) {
    const double inv = std::pow(base, -2.0 * static_cast<double>(i) / n_rot);
    r.inv_freq.push_back(factors.empty() ? inv : inv / factors[i]);
  }
  auto type = f.get_string(p + "rope.scaling.type");
  if (scaled && type.ok() && *type == "yarn") {
    // YaRN (arXiv:2309.00071): pairs turning more than beta_fast = 32 times over the original
    // context keep their frequency, those turning less than beta_slow = 1 times are divided by the
    // factor, with a linear ramp in between; cos and sin grow by 0.1 ln(factor) + 1.
    const double factor = *f.get_f32(p + "rope.scaling.factor");
    const double orig = *f.get_u32(p + "rope.scaling.original_context_length");
    auto dim_of = [&](double turns) {
      return n_rot * std::log(orig / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
    };
    // GGUF runtimes widen the range to whole dims; gpt-oss's config says truncate: false
    const double low = std::max(0.0, yarn_unrounded ? dim_of(32.0) : std::floor(dim_of(32.0)));
    const double high =
        std::min(static_cast<double>(n_rot - 1), yarn_unrounded ? dim_of(1.0) : std::ceil(dim_of(1.0)));
    for (size_t i = 0; i < n_rot / 2; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / std::max(high - low, 0.001), 0.0, 1.0);
      const double keep = 1.0 - ramp;  // weight of the original frequency
      r.inv_freq[i] = r.inv_freq[i] / factor * (1.0 - keep) + r.inv_freq[i] * keep;
    }
    r.mscale = 0.1 * std::log(factor) + 1.0;
  }
  return r;
}

// Normal mode rotates pairs (2i, 2i+1); NeoX rotates (i, i + n_rot/2).
void rope(Vec& v, size_t n_heads, size_t hd, size_t n_rot, int pos, const RopeRef& r, bool neox) {
  for (size_t h = 0; h < n_heads; ++h)
    for (size_t i = 0; i < n_rot / 2; ++i) {
      const double theta = pos * r.inv_freq[i];
      const size_t a_i = neox ? i : 2 * i, b_i = neox ? i + n_rot / 2 : 2 * i + 1;
      double& a = v[h * hd + a_i];
      double& b = v[h * hd + b_i];
      const double a0 = a, b0 = b;
      a = (a0 * std::cos(theta) - b0 * std::sin(theta)) * r.mscale;
      b = (a0 * std::sin(theta) + b0 * std::cos(theta)) * r.mscale;
    }
}

double f16_round(double x) { return f16_to_f32(f32_to_f16(static_cast<float>(x))); }

// What the reference leaves out, to show that each feature matters.
struct RefSwitches {
  bool rope_scaling = true;    // rope_freqs and YaRN
  bool window = true;          // phi3's and gpt-oss's sliding windows
  bool sinks = true;           // gpt-oss's attention sinks
  bool yarn_unrounded = true;  // gpt-oss's YaRN correction range as computed (false: rounded as llama.cpp)
};

// What a product with weights of block type `w` sees of the activation x: for the block formats whose
// CPU dot product takes q8_0 activations (MXFP4 among them), x rounded through q8_0 blocks.
Vec activation_as_seen(const GgufFile& f, const std::string& weight, const Vec& x) {
  const GgufTensorInfo* t = f.find_tensor(weight);
  if (!t || *t->dtype == DType::f32) return x;
  std::vector<float> xf(x.begin(), x.end()), back(x.size());
  std::vector<uint8_t> q(dtype_row_size(DType::q8_0, static_cast<int64_t>(x.size())));
  quantize_row(DType::q8_0, xf.data(), q.data(), static_cast<int64_t>(x.size()));
  dequantize_row(DType::q8_0, q.data(), back.data(), static_cast<int64_t>(x.size()));
  return Vec(back.begin(), back.end());
}

// gpt-oss's experts for one token: the router's top-k logits softmaxed among themselves, each chosen
// expert's biased gate and up, the clamped SwiGLU (alpha 1.702, limit 7), the biased down projection.
Vec gpt_oss_moe(const RefWeights& w, int il, const HParams& hp, const Vec& h) {
  auto n = [il](const char* what) { return "blk." + std::to_string(il) + "." + what; };
  const size_t E = hp.n_embd, F = hp.n_ff_exp, X = hp.n_expert, K = hp.n_expert_used;
  Vec logits = matvec(w.get(n("ffn_gate_inp.weight")), h, X);
  add_bias(logits, w.get(n("ffn_gate_inp.bias")));
  std::vector<size_t> order(X);
  for (size_t e = 0; e < X; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  order.resize(K);
  double mx = -INFINITY, sum = 0.0;
  for (size_t e : order) mx = std::max(mx, logits[e]);
  for (size_t e : order) sum += std::exp(logits[e] - mx);
  const auto wg = w.get(n("ffn_gate_exps.weight")), wu = w.get(n("ffn_up_exps.weight")),
             wd = w.get(n("ffn_down_exps.weight")), bg = w.get(n("ffn_gate_exps.bias")),
             bu = w.get(n("ffn_up_exps.bias")), bd = w.get(n("ffn_down_exps.bias"));
  auto slice = [](const std::vector<float>& v, size_t e, size_t len) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(e * len),
                              v.begin() + static_cast<std::ptrdiff_t>((e + 1) * len));
  };
  Vec out(E, 0.0);
  const Vec h_seen = activation_as_seen(*w.f, n("ffn_gate_exps.weight"), h);
  for (size_t e : order) {
    const double weight = std::exp(logits[e] - mx) / sum;
    Vec gate = matvec(slice(wg, e, F * E), h_seen, F), up = matvec(slice(wu, e, F * E), h_seen, F);
    add_bias(gate, slice(bg, e, F));
    add_bias(up, slice(bu, e, F));
    Vec glu(F);
    for (size_t i = 0; i < F; ++i) {
      const double g = std::min(gate[i], 7.0), u = std::clamp(up[i], -7.0, 7.0);
      glu[i] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
    }
    Vec d = matvec(slice(wd, e, E * F), activation_as_seen(*w.f, n("ffn_down_exps.weight"), glu), E);
    add_bias(d, slice(bd, e, E));
    for (size_t i = 0; i < E; ++i) out[i] += weight * d[i];
  }
  return out;
}

std::vector<Vec> reference_logits(const GgufFile& f, const HParams& hp, const std::vector<int32_t>& tokens,
                                  int pos0, int n_ctx, RefSwitches sw = {}) {
  RefWeights w{&f};
  const size_t T = tokens.size(), E = hp.n_embd, hd = hp.head_dim_k, H = hp.n_head, Hkv = hp.n_head_kv;
  const bool neox = hp.arch != Arch::llama;
  const bool oss = hp.arch == Arch::gpt_oss;
  const RopeRef rr = rope_ref(f, hp, w, sw.rope_scaling, n_ctx, oss && sw.yarn_unrounded);
  const std::string p = std::string(arch_name(hp.arch)) + ".";
  const size_t file_window =
      sw.window && (hp.arch == Arch::phi3 || oss) ? *f.get_u32_or(p + "attention.sliding_window", 0) : 0;
  const auto embd = w.get("token_embd.weight");
  std::vector<Vec> x(T, Vec(E));
  for (size_t t = 0; t < T; ++t)
    for (size_t e = 0; e < E; ++e) x[t][e] = embd[tokens[t] * E + e];
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    auto n = [il](const char* what) { return "blk." + std::to_string(il) + "." + what; };
    const auto attn_norm = w.get(n("attn_norm.weight")), wq = w.get(n("attn_q.weight")),
               wk = w.get(n("attn_k.weight")), wv = w.get(n("attn_v.weight")),
               wqkv = w.get(n("attn_qkv.weight")), wo = w.get(n("attn_output.weight")),
               ffn_norm = w.get(n("ffn_norm.weight")), wg = w.get(n("ffn_gate.weight")),
               wu = w.get(n("ffn_up.weight")), wd = w.get(n("ffn_down.weight"));
    // gpt-oss: Hugging Face's layer_types alternate sliding (even layers) and full attention
    const size_t window = oss && il % 2 == 1 ? 0 : file_window;
    const auto sinks = sw.sinks ? w.get(n("attn_sinks.weight")) : std::vector<float>{};
    std::vector<Vec> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      Vec h = x[t];
      rmsnorm_groups(h, attn_norm, E, hp.norm_rms_eps);
      if (!wqkv.empty()) {  // phi3: one product, q then k then v
        const Vec all = matvec(wqkv, h, (H + 2 * Hkv) * hd);
        q[t].assign(all.begin(), all.begin() + H * hd);
        k[t].assign(all.begin() + H * hd, all.begin() + (H + Hkv) * hd);
        v[t].assign(all.begin() + (H + Hkv) * hd, all.end());
      } else {
        q[t] = matvec(wq, h, H * hd);
        k[t] = matvec(wk, h, Hkv * hd);
        v[t] = matvec(wv, h, Hkv * hd);
      }
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
      rope(q[t], H, hd, hp.n_rot, p, rr, neox);
      rope(k[t], Hkv, hd, hp.n_rot, p, rr, neox);
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
          if (window > 0 && t - j >= window) {  // outside the sliding window
            s[j] = -INFINITY;
            continue;
          }
          double dot = 0.0;
          for (size_t d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[j][kvh * hd + d];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (double& sj : s) sum += (sj = std::exp(sj - mx));
        if (!sinks.empty()) sum += std::exp(sinks[h] - mx);  // the sink: a logit without a value
        for (size_t j = 0; j <= t; ++j)
          for (size_t d = 0; d < hd; ++d) att[h * hd + d] += s[j] / sum * v[j][kvh * hd + d];
      }
      Vec o = matvec(wo, att, E);
      if (w.has(n("attn_output.bias"))) add_bias(o, w.get(n("attn_output.bias")));
      for (size_t e = 0; e < E; ++e) x[t][e] += o[e];
      Vec h = x[t];
      if (oss) {  // the FFN's pre-norm is post_attention_norm; a mixture of experts
        rmsnorm_groups(h, w.get(n("post_attention_norm.weight")), E, hp.norm_rms_eps);
        const Vec moe = gpt_oss_moe(w, static_cast<int>(il), hp, h);
        for (size_t e = 0; e < E; ++e) x[t][e] += moe[e];
        continue;
      }
      rmsnorm_groups(h, ffn_norm, E, hp.norm_rms_eps);
      Vec gate, up;
      if (wg.empty()) {  // phi3: ffn_up holds the gate rows, then the up rows
        const Vec gu = matvec(wu, h, 2 * hp.n_ff);
        gate.assign(gu.begin(), gu.begin() + hp.n_ff);
        up.assign(gu.begin() + hp.n_ff, gu.end());
      } else {
        gate = matvec(wg, h, hp.n_ff);
        up = matvec(wu, h, hp.n_ff);
      }
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
class LlmReferenceFar : public ModelFiles {};

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

  const auto ref = reference_logits((*m)->gguf(), hp, tokens, pos0, 32);
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

INSTANTIATE_TEST_SUITE_P(Archs, LlmReference,
                         ::testing::Values("tiny", "llama31-tiny", "qwen2-tiny", "qwen2-yarn-tiny",
                                           "qwen3-tiny", "phi3-tiny", "phi3-longrope-tiny", "gptoss-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// From position 5000 (RoPE tables of large angles), with the window of phi3-tiny (6) passed: still the
// reference, which without the scaling (or the window) is clearly off. Phi-3 LongRoPE takes the short
// factors in a context of 32 cells and the long ones in 256 (beyond the original 128). Measured:
// llama31-tiny 1.2e-13 (1.0e-6 without rope_freqs), qwen2-yarn-tiny 2.2e-11 (0.058 without YaRN),
// phi3-tiny 4.3e-11 (0.35 without the window), phi3-longrope-tiny 8.9e-10 / 1.5e-11 (0.057 / 0.044
// without LongRoPE).
TEST_F(LlmReferenceFar, ScalingAndWindowMatter) {
  for (const auto& [shape, n_ctx] :
       {std::pair{"llama31-tiny", 32}, std::pair{"qwen2-yarn-tiny", 32}, std::pair{"phi3-tiny", 32},
        std::pair{"phi3-longrope-tiny", 32}, std::pair{"phi3-longrope-tiny", 256}}) {
    SCOPED_TRACE(std::string(shape) + " n_ctx " + std::to_string(n_ctx));
    const std::string file = model(shape, "f32", 5);
    auto backend = make_cpu_backend(2);
    auto m = Model::load(file, *backend, quiet_load());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto ctx = Context::create(**m, ContextParams{n_ctx, 5, 0});
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    const HParams& hp = (*m)->hparams();
    const auto tokens = test_tokens(14, static_cast<int>(hp.n_vocab), 7);
    const int pos0 = 5000;
    DecodeOptions all;
    all.all_logits = true;
    auto got = (*ctx)->decode(tokens, pos0, all);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    auto flat = [](const std::vector<Vec>& rows) {
      std::vector<double> out;
      for (const Vec& r : rows) out.insert(out.end(), r.begin(), r.end());
      return out;
    };
    const auto ref = flat(reference_logits((*m)->gguf(), hp, tokens, pos0, n_ctx));
    ASSERT_EQ(got->size(), ref.size());
    const double e = nmse(*got, ref);
    EXPECT_LT(e, 5e-8) << "NMSE " << e;  // the bound of test_llm_archs2.cpp: K/V values near f16 ties
    RefSwitches off;
    (hp.has_swa() ? off.window : off.rope_scaling) = false;
    const double e_off = nmse(*got, flat(reference_logits((*m)->gguf(), hp, tokens, pos0, n_ctx, off)));
    if (n_ctx > 32) {  // the long factors matter: the short ones are off too
      const double e_short = nmse(*got, flat(reference_logits((*m)->gguf(), hp, tokens, pos0, 32)));
      EXPECT_GT(e_short, 1e-3) << "NMSE with the short factors " << e_short;
    }
    // Scores depend on relative positions (here at most 13), over which the low-frequency pairs that
    // rope_freqs slows barely turn: it moves the logits little, but 1e7 times the remaining error.
    EXPECT_GT(e_off, hp.arch == Arch::llama ? 1e-7 : 1e-3) << "NMSE without the feature " << e_off;
  }
}

// gpt-oss: a 14-token prompt at position 3 in chunks of 5 (the window of 4 passed, local and full
// layers, ring cache and chunk boundaries), every token's logits against the reference; each of its
// features left out of the reference moves the logits far beyond the remaining error. The MXFP4
// experts (gptoss-mxfp4-tiny) against the same reference on their dequantized weights, the experts'
// inputs rounded through q8_0 as the MXFP4 dot product takes them (without that rounding the router
// of a later layer picks another expert for some token: NMSE 4e-3 measured).
TEST_F(LlmReferenceFar, GptOssFeaturesMatter) {
  auto flat = [](const std::vector<Vec>& rows) {
    std::vector<double> out;
    for (const Vec& r : rows) out.insert(out.end(), r.begin(), r.end());
    return out;
  };
  for (const char* shape : {"gptoss-tiny", "gptoss-mxfp4-tiny"}) {
    SCOPED_TRACE(shape);
    const std::string file = model(shape, "f32", 5);
    auto backend = make_cpu_backend(2);
    auto m = Model::load(file, *backend, quiet_load());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto ctx = Context::create(**m, ContextParams{32, 5, 0});
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    const HParams& hp = (*m)->hparams();
    EXPECT_EQ(hp.arch, Arch::gpt_oss);
    EXPECT_TRUE(hp.is_swa(0) && !hp.is_swa(1) && hp.is_swa(2) && !hp.is_swa(3));
    const auto tokens = test_tokens(14, static_cast<int>(hp.n_vocab), 11);
    DecodeOptions all;
    all.all_logits = true;
    auto got = (*ctx)->decode(tokens, 3, all);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const GgufFile& f = (*m)->gguf();
    const auto ref = flat(reference_logits(f, hp, tokens, 3, 32));
    ASSERT_EQ(got->size(), ref.size());
    const double e = nmse(*got, ref);
    const bool mxfp4 = std::string(shape) == "gptoss-mxfp4-tiny";
    EXPECT_LT(e, mxfp4 ? 1e-4 : 1e-8) << "NMSE " << e;
    if (mxfp4) continue;
    const char* what[] = {"window", "sinks", "YaRN", "YaRN's unrounded range"};
    for (int feature = 0; feature < 4; ++feature) {
      RefSwitches off;
      (feature == 0   ? off.window
       : feature == 1 ? off.sinks
       : feature == 2 ? off.rope_scaling
                      : off.yarn_unrounded) = false;
      const double e_off = nmse(*got, flat(reference_logits(f, hp, tokens, 3, 32, off)));
      // relative positions up to 13 barely turn the pairs whose rate the rounding moves: a smaller
      // effect, still far above the remaining error
      EXPECT_GT(e_off, feature == 3 ? 100 * e + 1e-12 : 1e-4)
          << "NMSE without the " << what[feature] << " " << e_off;
    }
  }
}

}  // namespace
}  // namespace loom::llm::testing
