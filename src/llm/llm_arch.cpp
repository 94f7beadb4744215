// What the LLaMA family shares: tensor declarations and the registry of architectures.
#include "llm_arch.h"

namespace loom::llm::detail {

void declare_llama_family(TensorLoader& tl, const HParams& hp, ModelWeights& w, bool dense_ffn) {
  const int64_t n_embd = hp.n_embd;
  const int64_t n_vocab = hp.n_vocab;
  const int64_t q_dim = static_cast<int64_t>(hp.head_dim_k) * hp.n_head;
  const int64_t o_dim = static_cast<int64_t>(hp.head_dim_v) * hp.n_head;
  w.tok_embd = tl.require("token_embd.weight", {n_embd, n_vocab, 1, 1}, WeightKind::matrix);
  w.output_norm = tl.require("output_norm.weight", {n_embd, 1, 1, 1}, WeightKind::vector);
  w.output = tl.optional("output.weight", {n_embd, n_vocab, 1, 1}, WeightKind::matrix);
  if (!w.output) w.output = w.tok_embd;  // tied embeddings
  w.rope_freqs = tl.optional("rope_freqs.weight", {hp.n_rot / 2, 1, 1, 1}, WeightKind::vector);
  w.layers.resize(hp.n_layer);
  for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
    LayerWeights& l = w.layers[il];
    auto name = [il](const char* what) { return TensorLoader::layer_name(il, what); };
    l.attn_norm = tl.require(name("attn_norm.weight"), {n_embd, 1, 1, 1}, WeightKind::vector);
    l.wq = tl.require(name("attn_q.weight"), {n_embd, q_dim, 1, 1}, WeightKind::matrix);
    l.wk = tl.require(name("attn_k.weight"), {n_embd, hp.n_embd_k_gqa(), 1, 1}, WeightKind::matrix);
    l.wv = tl.require(name("attn_v.weight"), {n_embd, hp.n_embd_v_gqa(), 1, 1}, WeightKind::matrix);
    l.wo = tl.require(name("attn_output.weight"), {o_dim, n_embd, 1, 1}, WeightKind::matrix);
    if (!dense_ffn) continue;
    l.ffn_norm = tl.require(name("ffn_norm.weight"), {n_embd, 1, 1, 1}, WeightKind::vector);
    l.ffn_gate = tl.require(name("ffn_gate.weight"), {n_embd, hp.n_ff, 1, 1}, WeightKind::matrix);
    l.ffn_up = tl.require(name("ffn_up.weight"), {n_embd, hp.n_ff, 1, 1}, WeightKind::matrix);
    l.ffn_down = tl.require(name("ffn_down.weight"), {hp.n_ff, n_embd, 1, 1}, WeightKind::matrix);
  }
}

const Architecture& architecture_for(Arch a) {
  switch (a) {
    case Arch::llama:
      return llama_architecture();
    case Arch::qwen2:
      return qwen2_architecture();
    case Arch::qwen3:
      return qwen3_architecture();
    case Arch::qwen3moe:
      return qwen3moe_architecture();
    case Arch::gemma2:
      return gemma2_architecture();
    case Arch::gemma3:
      return gemma3_architecture();
    case Arch::phi3:
      return phi3_architecture();
    case Arch::gpt_oss:
      return gpt_oss_architecture();
  }
  return llama_architecture();
}

Tensor* build_llama_family(StepBuilder& b) {
  Graph& g = b.graph();
  const HParams& hp = b.hparams();
  const int n_layer = static_cast<int>(hp.n_layer);
  Tensor* x = b.stream_in();
  for (int il = b.layer_begin(); il < b.layer_end(); ++il) {
    const LayerWeights& l = b.weights().layers[il];
    Tensor* h = b.rms_norm(x, l.attn_norm, "attn_norm", il);
    auto [q, k, v] = b.project_qkv(l, h, il);
    if (l.q_norm) {  // over head_dim: dim 0 of [head_dim, n_head, n_tokens]
      q = b.rms_norm(q, l.q_norm, "attn_q_norm", il);
      k = b.rms_norm(k, l.k_norm, "attn_k_norm", il);
    }
    Tensor* attn = b.attention(il, b.rope(q, il, "attn_q_rope"), b.rope(k, il, "attn_k_rope"), v);
    if (il == n_layer - 1) {  // only the rows whose logits are wanted go on
      attn = b.select_outputs(attn);
      x = b.select_outputs(x);
    }
    x = b.name(add(g, x, b.linear_reduce(l.wo, attn, l.bo, "attn_out", il)), "ffn_inp", il);
    Tensor* f = b.rms_norm(x, l.ffn_norm, "ffn_norm", il);
    x = b.name(add(g, x, l.ffn_gate_inp ? b.ffn_moe(l, f, il) : b.ffn_swiglu(l, f, il)), "ffn_out", il);
  }
  return b.stream_out(x);
}

}  // namespace loom::llm::detail
