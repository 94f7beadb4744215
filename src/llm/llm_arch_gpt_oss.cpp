// gpt-oss (OpenAI's open-weight MoE models, llama.cpp's "gpt-oss"): the LLaMA block with biases on
// every attention projection, a learned per-head attention sink (attn_sinks: a logit that joins each
// softmax denominator), local layers (a window of 128) alternating with full ones from layer 0, YaRN
// RoPE in NeoX mode on every layer, and a sparse feed-forward in every layer: a biased router whose
// top experts are softmaxed among themselves, biased experts (MXFP4 in the released files) and the
// clamped SwiGLU (swiglu_oai). The FFN's pre-norm is stored as post_attention_norm.
#include "llm_arch.h"

namespace loom::llm::detail {

namespace {

class GptOssArchitecture final : public Architecture {
 public:
  Arch arch() const override { return Arch::gpt_oss; }
  RopeMode rope_mode() const override { return RopeMode::neox; }

  void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const override {
    declare_llama_family(tl, hp, w, /*dense_ffn=*/false);
    const int64_t n_embd = hp.n_embd, n_ff = hp.n_ff_exp, n_expert = hp.n_expert;
    const int64_t q_dim = static_cast<int64_t>(hp.head_dim_k) * hp.n_head;
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
      LayerWeights& l = w.layers[il];
      auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
      l.bq = tl.require(name("attn_q.bias"), {q_dim, 1, 1, 1}, WeightKind::vector);
      l.bk = tl.require(name("attn_k.bias"), {hp.n_embd_k_gqa(), 1, 1, 1}, WeightKind::vector);
      l.bv = tl.require(name("attn_v.bias"), {hp.n_embd_v_gqa(), 1, 1, 1}, WeightKind::vector);
      l.bo = tl.require(name("attn_output.bias"), {n_embd, 1, 1, 1}, WeightKind::vector);
      l.attn_sinks = tl.require(name("attn_sinks.weight"), {hp.n_head, 1, 1, 1}, WeightKind::vector);
      l.ffn_norm = tl.require(name("post_attention_norm.weight"), {n_embd, 1, 1, 1}, WeightKind::vector);
      l.ffn_gate_inp = tl.require(name("ffn_gate_inp.weight"), {n_embd, n_expert, 1, 1}, WeightKind::matrix);
      l.ffn_gate_inp_b = tl.require(name("ffn_gate_inp.bias"), {n_expert, 1, 1, 1}, WeightKind::vector);
      l.ffn_gate_exps =
          tl.require(name("ffn_gate_exps.weight"), {n_embd, n_ff, n_expert, 1}, WeightKind::matrix);
      l.ffn_up_exps = tl.require(name("ffn_up_exps.weight"), {n_embd, n_ff, n_expert, 1}, WeightKind::matrix);
      l.ffn_down_exps =
          tl.require(name("ffn_down_exps.weight"), {n_ff, n_embd, n_expert, 1}, WeightKind::matrix);
      // one bias row per expert
      l.ffn_gate_exps_b = tl.require(name("ffn_gate_exps.bias"), {n_ff, n_expert, 1, 1}, WeightKind::vector);
      l.ffn_up_exps_b = tl.require(name("ffn_up_exps.bias"), {n_ff, n_expert, 1, 1}, WeightKind::vector);
      l.ffn_down_exps_b =
          tl.require(name("ffn_down_exps.bias"), {n_embd, n_expert, 1, 1}, WeightKind::vector);
    }
  }

  Tensor* build(StepBuilder& b) const override { return build_llama_family(b); }
};

}  // namespace

const Architecture& gpt_oss_architecture() {
  static const GptOssArchitecture arch;
  return arch;
}

}  // namespace loom::llm::detail
