// Qwen3 (dense): no projection biases; instead queries and keys get an RMS norm over each head
// (QK-norm) before RoPE, which runs in NeoX mode. The head size is its own hyperparameter
// (attention.key_length), often larger than n_embd / n_head.
#include "llm/llm_arch.h"

namespace loom::llm::detail {

namespace {

class Qwen3Architecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::qwen3; }
  RopeMode rope_mode() const override { return RopeMode::neox; }

  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_llama_family(tl, hp, w);
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
      LayerWeights& l = w.layers[il];
      auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
      l.q_norm = tl.require(name("attn_q_norm.weight"), {hp.head_dim_k, 1, 1, 1}, WeightKind::vector);
      l.k_norm = tl.require(name("attn_k_norm.weight"), {hp.head_dim_k, 1, 1, 1}, WeightKind::vector);
    }
  }

  Tensor* build(StepBuilder& b) const override {
    Graph& g = b.graph();
    const HParams& hp = b.hparams();
    const int n_layer = static_cast<int>(hp.n_layer);
    Tensor* x = b.embed();
    for (int il = 0; il < n_layer; ++il) {
      const LayerWeights& l = b.weights().layers[il];
      Tensor* h = b.rms_norm(x, l.attn_norm);
      Tensor* q = b.split_heads(b.linear(l.wq, h), hp.head_dim_k, hp.n_head);
      Tensor* k = b.split_heads(b.linear(l.wk, h), hp.head_dim_k, hp.n_head_kv);
      Tensor* v = b.split_heads(b.linear(l.wv, h), hp.head_dim_v, hp.n_head_kv);
      q = b.rms_norm(q, l.q_norm);  // over head_dim: dim 0 of [head_dim, n_head, n_tokens]
      k = b.rms_norm(k, l.k_norm);
      Tensor* attn = b.attention(il, b.rope(q), b.rope(k), v);
      if (il == n_layer - 1) {
        attn = b.select_outputs(attn);
        x = b.select_outputs(x);
      }
      x = add(g, x, b.linear(l.wo, attn));
      x = add(g, x, b.ffn_swiglu(l, b.rms_norm(x, l.ffn_norm)));
    }
    return b.logits(x);
  }
};

}  // namespace

const Architecture& qwen3_architecture() {
  static const Qwen3Architecture arch;
  return arch;
}

}  // namespace loom::llm::detail
