#include "llama_block.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace loom::llm {

LlamaWeights declare_llama_weights(Graph& g, const LlamaConfig& c) {
  const int64_t hd = c.head_dim();
  const DType wt = c.weight_type;
  LlamaWeights w;
  w.tok_embd = g.weight(wt, {c.n_embd, c.n_vocab, 1, 1}, "token_embd.weight");
  for (int il = 0; il < c.n_layer; ++il) {
    auto name = [il](const char* n) { return fmt::format("blk.{}.{}.weight", il, n); };
    LlamaLayer l;
    l.attn_norm = g.weight(DType::f32, {c.n_embd, 1, 1, 1}, name("attn_norm"));
    l.wq = g.weight(wt, {c.n_embd, c.n_head * hd, 1, 1}, name("attn_q"));
    l.wk = g.weight(wt, {c.n_embd, c.n_head_kv * hd, 1, 1}, name("attn_k"));
    l.wv = g.weight(wt, {c.n_embd, c.n_head_kv * hd, 1, 1}, name("attn_v"));
    l.wo = g.weight(wt, {c.n_head * hd, c.n_embd, 1, 1}, name("attn_output"));
    l.ffn_norm = g.weight(DType::f32, {c.n_embd, 1, 1, 1}, name("ffn_norm"));
    l.w_gate = g.weight(wt, {c.n_embd, c.n_ff, 1, 1}, name("ffn_gate"));
    l.w_up = g.weight(wt, {c.n_embd, c.n_ff, 1, 1}, name("ffn_up"));
    l.w_down = g.weight(wt, {c.n_ff, c.n_embd, 1, 1}, name("ffn_down"));
    w.layers.push_back(l);
  }
  w.output_norm = g.weight(DType::f32, {c.n_embd, 1, 1, 1}, "output_norm.weight");
  w.output = g.weight(wt, {c.n_embd, c.n_vocab, 1, 1}, "output.weight");
  return w;
}

LlamaInputs declare_llama_inputs(Graph& g, int n_tokens) {
  LlamaInputs in;
  in.tokens = g.input(DType::i32, {n_tokens, 1, 1, 1}, "tokens");
  in.positions = g.input(DType::i32, {n_tokens, 1, 1, 1}, "positions");
  in.mask = g.input(DType::f32, {n_tokens, n_tokens, 1, 1}, "kq_mask");
  return in;
}

namespace {

// softmax(q k^T * scale + mask) v for q [hd, T, H], k/v [hd, T, H_kv]; returns [hd, H, T].
Tensor* attention(Graph& g, const LlamaConfig& c, Tensor* q, Tensor* k, Tensor* v, Tensor* mask, float kq_scale) {
  if (c.use_flash_attn) return flash_attn(g, q, k, v, mask, kq_scale);
  Tensor* kq = mul_mat(g, k, q);                       // [T_kv, T_q, H]
  kq = soft_max(g, kq, mask, kq_scale);
  Tensor* vt = cont(g, permute(g, v, 1, 0, 2, 3));     // [T_kv, hd, H_kv]
  Tensor* kqv = mul_mat(g, vt, kq);                    // [hd, T_q, H]
  return cont(g, permute(g, kqv, 0, 2, 1, 3));         // [hd, H, T_q]
}

}  // namespace

Tensor* build_llama(Graph& g, const LlamaConfig& c, const LlamaWeights& w, const LlamaInputs& in) {
  const int64_t hd = c.head_dim();
  const int64_t n_tokens = in.tokens ? in.tokens->ne[0] : 0;
  RopeParams rp{};
  rp.n_dims = static_cast<int32_t>(hd);
  rp.mode = RopeMode::normal;
  rp.n_ctx_orig = 0;
  rp.freq_base = c.rope_base;
  rp.freq_scale = 1.0f;
  rp.ext_factor = 0.0f;
  rp.attn_factor = 1.0f;
  rp.beta_fast = 32.0f;
  rp.beta_slow = 1.0f;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  Tensor* x = get_rows(g, w.tok_embd, in.tokens);  // [n_embd, T]
  for (int il = 0; il < c.n_layer; ++il) {
    const LlamaLayer& l = w.layers[il];
    Tensor* h = mul(g, rms_norm(g, x, c.norm_eps), l.attn_norm);
    Tensor* q = reshape(g, mul_mat(g, l.wq, h), {hd, c.n_head, n_tokens, 1});
    Tensor* k = reshape(g, mul_mat(g, l.wk, h), {hd, c.n_head_kv, n_tokens, 1});
    Tensor* v = reshape(g, mul_mat(g, l.wv, h), {hd, c.n_head_kv, n_tokens, 1});
    q = rope(g, q, in.positions, nullptr, rp);
    k = rope(g, k, in.positions, nullptr, rp);
    // heads outermost for attention: [hd, T, H]
    q = permute(g, q, 0, 2, 1, 3);
    k = permute(g, k, 0, 2, 1, 3);
    v = permute(g, v, 0, 2, 1, 3);
    Tensor* attn = attention(g, c, q, k, v, in.mask, kq_scale);  // [hd, H, T]
    attn = reshape(g, attn, {hd * c.n_head, n_tokens, 1, 1});
    x = add(g, x, mul_mat(g, l.wo, attn));

    h = mul(g, rms_norm(g, x, c.norm_eps), l.ffn_norm);
    Tensor* ff = swiglu(g, mul_mat(g, l.w_gate, h), mul_mat(g, l.w_up, h));
    x = add(g, x, mul_mat(g, l.w_down, ff));
  }
  x = mul(g, rms_norm(g, x, c.norm_eps), w.output_norm);
  Tensor* logits = mul_mat(g, w.output, x);
  if (logits) logits->name = "logits";
  return logits;
}

std::vector<float> causal_mask(int n) {
  std::vector<float> m(static_cast<size_t>(n) * n, 0.0f);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) m[static_cast<size_t>(i) * n + j] = -std::numeric_limits<float>::infinity();
  return m;
}

}  // namespace loom::llm
