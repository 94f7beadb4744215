// Gemma 3 (text): Gemma 2's block (scaled embeddings, sandwich norms, GeGLU) with QK-norm instead of
// attention soft-capping, and five local layers per global one. Local layers rotate with base
// 10000 and no scaling; global layers use the model's base and its (linear) scaling. The query
// scale, windows and an optional final soft-cap come from the hyperparameters (llm_hparams.cpp).
#include "llm_arch.h"

namespace loom::llm::detail {

namespace {

class Gemma3Architecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::gemma3; }
  RopeMode rope_mode() const override { return RopeMode::neox; }
  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_gemma_family(tl, hp, w, true);
  }
  Tensor* build(StepBuilder& b) const override { return build_gemma(b); }
};

}  // namespace

const Architecture& gemma3_architecture() {
  static const Gemma3Architecture arch;
  return arch;
}

}  // namespace loom::llm::detail
