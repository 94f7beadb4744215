// Gemma 2: scaled embeddings, "sandwich" norms (each sub-layer's output is RMS-normed again before
// the residual add), GeGLU feed-forward, attention and final logit soft-capping, and local layers
// (sliding window) alternating with global ones, starting with a local layer 0. NeoX RoPE; the
// output is tied to the embeddings.
//
// Gemma's RMSNorm multiplies by (1 + w); GGUF converters store 1 + w, so norm weights are used as
// they are, like every other family's.
#include <cmath>

#include "llm_arch.h"

namespace loom::llm::detail {

void declare_gemma_family(TensorLoader& tl, const HParams& hp, ModelWeights& w, bool qk_norm) {
  declare_llama_family(tl, hp, w);
  for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
    LayerWeights& l = w.layers[il];
    auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
    l.attn_post_norm =
        tl.require(name("post_attention_norm.weight"), {hp.n_embd, 1, 1, 1}, WeightKind::vector);
    l.ffn_post_norm = tl.require(name("post_ffw_norm.weight"), {hp.n_embd, 1, 1, 1}, WeightKind::vector);
    if (qk_norm) {
      l.q_norm = tl.require(name("attn_q_norm.weight"), {hp.head_dim_k, 1, 1, 1}, WeightKind::vector);
      l.k_norm = tl.require(name("attn_k_norm.weight"), {hp.head_dim_k, 1, 1, 1}, WeightKind::vector);
    }
  }
}

Tensor* build_gemma(StepBuilder& b) {
  Graph& g = b.graph();
  const HParams& hp = b.hparams();
  const int n_layer = static_cast<int>(hp.n_layer);
  // Embeddings are scaled by sqrt(n_embd) so they start at the residual stream's magnitude.
  Tensor* x = b.stream_in(std::sqrt(static_cast<float>(hp.n_embd)));
  for (int il = b.layer_begin(); il < b.layer_end(); ++il) {
    const LayerWeights& l = b.weights().layers[il];
    Tensor* h = b.rms_norm(x, l.attn_norm, "attn_norm", il);
    Tensor* q = b.split_heads(b.linear(l.wq, h, nullptr, "attn_q", il), hp.head_dim_k, hp.n_head);
    Tensor* k = b.split_heads(b.linear(l.wk, h, nullptr, "attn_k", il), hp.head_dim_k, hp.n_head_kv);
    Tensor* v = b.split_heads(b.linear(l.wv, h, nullptr, "attn_v", il), hp.head_dim_v, hp.n_head_kv);
    if (l.q_norm) {
      q = b.rms_norm(q, l.q_norm, "attn_q_norm", il);
      k = b.rms_norm(k, l.k_norm, "attn_k_norm", il);
    }
    Tensor* attn = b.attention(il, b.rope(q, il, "attn_q_rope"), b.rope(k, il, "attn_k_rope"), v);
    if (il == n_layer - 1) {
      attn = b.select_outputs(attn);
      x = b.select_outputs(x);
    }
    Tensor* attn_out = b.linear_reduce(l.wo, attn, nullptr, "attn_out", il);
    x = b.name(add(g, x, b.rms_norm(attn_out, l.attn_post_norm, "attn_post_norm", il)), "ffn_inp", il);
    Tensor* ffn = b.ffn_geglu(l, b.rms_norm(x, l.ffn_norm, "ffn_norm", il), il);
    x = b.name(add(g, x, b.rms_norm(ffn, l.ffn_post_norm, "ffn_post_norm", il)), "ffn_out", il);
  }
  return b.stream_out(x);  // logits: final soft-cap included
}

namespace {

class Gemma2Architecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::gemma2; }
  RopeMode rope_mode() const override { return RopeMode::neox; }
  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_gemma_family(tl, hp, w, false);
  }
  Tensor* build(StepBuilder& b) const override { return build_gemma(b); }
};

}  // namespace

const Architecture& gemma2_architecture() {
  static const Gemma2Architecture arch;
  return arch;
}

}  // namespace loom::llm::detail
