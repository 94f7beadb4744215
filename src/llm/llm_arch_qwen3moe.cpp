// Qwen3-MoE: Qwen3's attention (QK-norm, NeoX RoPE, no biases) with a sparse feed-forward in every
// layer: a softmax router picks expert_used_count of expert_count SwiGLU experts per token, their
// probabilities renormalized to sum to one (norm_topk_prob), and the experts' outputs are summed
// with those weights. No shared expert.
#include "llm_arch.h"

namespace loom::llm::detail {

namespace {

class Qwen3MoeArchitecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::qwen3moe; }
  RopeMode rope_mode() const override { return RopeMode::neox; }

  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_llama_family(tl, hp, w, /*dense_ffn=*/false);
    const int64_t n_embd = hp.n_embd, n_ff = hp.n_ff_exp, n_expert = hp.n_expert;
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
      LayerWeights& l = w.layers[il];
      auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
      l.q_norm = tl.require(name("attn_q_norm.weight"), {hp.head_dim_k, 1, 1, 1}, WeightKind::vector);
      l.k_norm = tl.require(name("attn_k_norm.weight"), {hp.head_dim_k, 1, 1, 1}, WeightKind::vector);
      l.ffn_norm = tl.require(name("ffn_norm.weight"), {n_embd, 1, 1, 1}, WeightKind::vector);
      l.ffn_gate_inp = tl.require(name("ffn_gate_inp.weight"), {n_embd, n_expert, 1, 1}, WeightKind::matrix);
      l.ffn_gate_exps =
          tl.require(name("ffn_gate_exps.weight"), {n_embd, n_ff, n_expert, 1}, WeightKind::matrix);
      l.ffn_up_exps = tl.require(name("ffn_up_exps.weight"), {n_embd, n_ff, n_expert, 1}, WeightKind::matrix);
      l.ffn_down_exps =
          tl.require(name("ffn_down_exps.weight"), {n_ff, n_embd, n_expert, 1}, WeightKind::matrix);
    }
  }

  Tensor* build(StepBuilder& b) const override { return build_llama_family(b); }
};

}  // namespace

const Architecture& qwen3moe_architecture() {
  static const Qwen3MoeArchitecture arch;
  return arch;
}

}  // namespace loom::llm::detail
