// LLaMA (1/2/3, Mistral-style dense models): RMSNorm, RoPE in normal (interleaved-pair) mode,
// grouped-query attention, SwiGLU. Attention biases are optional (some fine-tunes carry them).
#include "llm_arch.h"

namespace loom::llm::detail {

namespace {

class LlamaArchitecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::llama; }
  RopeMode rope_mode() const override { return RopeMode::normal; }

  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_llama_family(tl, hp, w);
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
      LayerWeights& l = w.layers[il];
      auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
      l.bq = tl.optional(name("attn_q.bias"), {static_cast<int64_t>(hp.head_dim_k) * hp.n_head, 1, 1, 1},
                         WeightKind::vector);
      l.bk = tl.optional(name("attn_k.bias"), {hp.n_embd_k_gqa(), 1, 1, 1}, WeightKind::vector);
      l.bv = tl.optional(name("attn_v.bias"), {hp.n_embd_v_gqa(), 1, 1, 1}, WeightKind::vector);
      l.bo = tl.optional(name("attn_output.bias"), {hp.n_embd, 1, 1, 1}, WeightKind::vector);
    }
  }

  Tensor* build(StepBuilder& b) const override { return build_llama_family(b); }
};

}  // namespace

const Architecture& llama_architecture() {
  static const LlamaArchitecture arch;
  return arch;
}

}  // namespace loom::llm::detail
