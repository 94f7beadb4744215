// Qwen3 (dense): no projection biases; instead queries and keys get an RMS norm over each head
// (QK-norm) before RoPE, which runs in NeoX mode. The head size is its own hyperparameter
// (attention.key_length), often larger than n_embd / n_head.
#include "llm_arch.h"

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

  Tensor* build(StepBuilder& b) const override { return build_llama_family(b); }
};

}  // namespace

const Architecture& qwen3_architecture() {
  static const Qwen3Architecture arch;
  return arch;
}

}  // namespace loom::llm::detail
