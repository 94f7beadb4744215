// A LLaMA-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) built straight from graph
// ops, with no GGUF or KV cache: the foundation's check that the ops compose into a correct block
// (test_llama_block.cpp). Models proper live in src/llm.
#pragma once

#include <vector>

#include "loom/graph.h"

namespace loom::llm {

struct LlamaConfig {
  int n_vocab = 256;
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int n_ff = 160;
  int n_layer = 2;
  float norm_eps = 1e-5f;
  float rope_base = 10000.0f;
  DType weight_type = DType::f32;
  bool use_flash_attn = true;  ///< flash_attn op, else mul_mat + soft_max + mul_mat
  int head_dim() const { return n_embd / n_head; }
};

struct LlamaLayer {
  Tensor* attn_norm;  // [n_embd]
  Tensor* wq;         // [n_embd, n_head*head_dim]
  Tensor* wk;         // [n_embd, n_head_kv*head_dim]
  Tensor* wv;         // [n_embd, n_head_kv*head_dim]
  Tensor* wo;         // [n_head*head_dim, n_embd]
  Tensor* ffn_norm;   // [n_embd]
  Tensor* w_gate;     // [n_embd, n_ff]
  Tensor* w_up;       // [n_embd, n_ff]
  Tensor* w_down;     // [n_ff, n_embd]
};

struct LlamaWeights {
  Tensor* tok_embd;     // [n_embd, n_vocab]
  std::vector<LlamaLayer> layers;
  Tensor* output_norm;  // [n_embd]
  Tensor* output;       // [n_embd, n_vocab]
};

struct LlamaInputs {
  Tensor* tokens;     // i32 [n_tokens]
  Tensor* positions;  // i32 [n_tokens]
  Tensor* mask;       // f32 [n_tokens, n_tokens], 0 or -inf (causal)
};

/// Declares the weights as leafs of `g` (names follow GGUF: "blk.0.attn_q.weight").
LlamaWeights declare_llama_weights(Graph& g, const LlamaConfig& cfg);
/// Declares the inputs for a batch of `n_tokens`.
LlamaInputs declare_llama_inputs(Graph& g, int n_tokens);
/// Builds the forward pass; returns logits f32 [n_vocab, n_tokens] (nullptr on error: see g.status()).
Tensor* build_llama(Graph& g, const LlamaConfig& cfg, const LlamaWeights& w, const LlamaInputs& in);

/// Causal mask for positions 0..n-1: mask[j, i] = 0 if j <= i else -inf (row i = query i).
std::vector<float> causal_mask(int n_tokens);

}  // namespace loom::llm
