// Phi-3 (and Phi-3.5 / Phi-4-mini text models): the LLaMA block with NeoX RoPE, one fused query/key/
// value projection (attn_qkv) and one fused gate/up projection (ffn_up holds the gate rows, then the
// up rows). Files of the 4k models carry a sliding window that every layer attends through. LongRoPE
// files carry per-pair frequency divisors for short and long contexts (rope_factors_short/long) and a
// cos/sin scale (HParams::rope_attn_factor); a context longer than the original one uses the long ones.
#include "llm_arch.h"

namespace loom::llm::detail {

namespace {

class Phi3Architecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::phi3; }
  RopeMode rope_mode() const override { return RopeMode::neox; }

  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    const int64_t n_embd = hp.n_embd;
    const int64_t n_vocab = hp.n_vocab;
    const int64_t q_dim = static_cast<int64_t>(hp.head_dim_k) * hp.n_head;
    const int64_t qkv_dim = q_dim + hp.n_embd_k_gqa() + hp.n_embd_v_gqa();
    w.tok_embd = tl.require("token_embd.weight", {n_embd, n_vocab, 1, 1}, WeightKind::matrix);
    w.output_norm = tl.require("output_norm.weight", {n_embd, 1, 1, 1}, WeightKind::vector);
    w.output = tl.optional("output.weight", {n_embd, n_vocab, 1, 1}, WeightKind::matrix);
    if (!w.output) w.output = w.tok_embd;  // Phi-4-mini ties them
    const Shape factors{hp.n_rot / 2, 1, 1, 1};
    w.rope_freqs = tl.optional("rope_factors_short.weight", factors, WeightKind::vector);
    if (w.rope_freqs)  // LongRoPE: both sets
      w.rope_freqs_long = tl.require("rope_factors_long.weight", factors, WeightKind::vector);
    w.layers.resize(hp.n_layer);
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
      LayerWeights& l = w.layers[il];
      auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
      l.attn_norm = tl.require(name("attn_norm.weight"), {n_embd, 1, 1, 1}, WeightKind::vector);
      l.wqkv = tl.require(name("attn_qkv.weight"), {n_embd, qkv_dim, 1, 1}, WeightKind::matrix);
      l.wo = tl.require(name("attn_output.weight"), {q_dim, n_embd, 1, 1}, WeightKind::matrix);
      l.ffn_norm = tl.require(name("ffn_norm.weight"), {n_embd, 1, 1, 1}, WeightKind::vector);
      l.ffn_gate_up = tl.require(name("ffn_up.weight"), {n_embd, 2 * static_cast<int64_t>(hp.n_ff), 1, 1},
                                 WeightKind::matrix);
      l.ffn_down = tl.require(name("ffn_down.weight"), {hp.n_ff, n_embd, 1, 1}, WeightKind::matrix);
    }
  }

  Tensor* build(StepBuilder& b) const override { return build_llama_family(b); }
};

}  // namespace

const Architecture& phi3_architecture() {
  static const Phi3Architecture arch;
  return arch;
}

}  // namespace loom::llm::detail
