// Qwen2 / Qwen2.5: the LLaMA block with biases on the query, key and value projections and RoPE
// in NeoX mode (rotating the two halves of each head rather than interleaved pairs).
#include "llm_arch.h"

namespace loom::llm::detail {

namespace {

class Qwen2Architecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::qwen2; }
  RopeMode rope_mode() const override { return RopeMode::neox; }

  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_llama_family(tl, hp, w);
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
      LayerWeights& l = w.layers[il];
      auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
      l.bq = tl.require(name("attn_q.bias"), {static_cast<int64_t>(hp.head_dim_k) * hp.n_head, 1, 1, 1},
                        WeightKind::vector);
      l.bk = tl.require(name("attn_k.bias"), {hp.n_embd_k_gqa(), 1, 1, 1}, WeightKind::vector);
      l.bv = tl.require(name("attn_v.bias"), {hp.n_embd_v_gqa(), 1, 1, 1}, WeightKind::vector);
    }
  }

  Tensor* build(StepBuilder& b) const override { return build_llama_family(b); }
};

}  // namespace

const Architecture& qwen2_architecture() {
  static const Qwen2Architecture arch;
  return arch;
}

}  // namespace loom::llm::detail
