// Synthetic models: GGUF files of real model shapes with deterministic random weights, for tests,
// benchmarks and demos without downloading anything (`loom gen-model`).
//
// Weights are uniform in +-sqrt(3 / fan_in) (variance 1/fan_in, fan_in = ne0, the row length), so
// every projection keeps activations O(1) and logits have a standard deviation near 1; norm weights
// are uniform in [0.75, 1.25], biases in +-0.2. Each row is drawn from its own counter-based stream
// seeded by (seed, tensor name, row), so files are identical whatever the thread count.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/quant_mixture.h"
#include "loom/llm.h"
#include "loom/status.h"

namespace loom::llm {

/// A named model shape.
struct SynthShape {
  const char* name;
  Arch arch;
  int n_vocab;
  int n_embd;
  int n_layer;
  int n_head;
  int n_head_kv;
  int head_dim;  ///< may differ from n_embd / n_head (qwen3)
  int n_ff;
  int n_ctx;
  float rope_base;
  float norm_eps;
  bool tied_output;          ///< no output.weight: logits use token_embd
  bool qkv_bias;             ///< attn_q/k/v.bias (qwen2)
  bool qk_norm;              ///< attn_q_norm / attn_k_norm (qwen3)
  float llama3_rope_factor;  ///< > 0: a rope_freqs.weight tensor as Llama 3.1+ files carry
  int n_expert;              ///< > 0: every FFN is a mixture of experts (qwen3moe)
  int n_expert_used;         ///< experts per token
  int n_ff_exp;              ///< width of each expert
  int sliding_window;        ///< > 0: attention.sliding_window (gemma's local layers)
  float attn_softcap;        ///< > 0: attn_logit_softcapping
  float final_softcap;       ///< > 0: final_logit_softcapping
  float rope_linear_factor;  ///< > 0: rope.scaling.type linear with this factor (gemma3's global layers)
  float rope_yarn_factor;    ///< > 0: rope.scaling.type yarn with this factor over `n_ctx_orig` tokens
  int n_ctx_orig;            ///< > 0: rope.scaling.original_context_length
  bool longrope;             ///< Phi-3 LongRoPE: rope_factors_short/long and rope.scaling.attn_factor
  int n_rot;                 ///< rotated dims per head (rope.dimension_count); 0: head_dim
  bool experts_mxfp4;        ///< expert weights in MXFP4 whatever the file type (gpt-oss as released)
};

/// llama3-1b, llama3-8b, llama3-70b, small, tiny, llama31-tiny, qwen2-tiny, qwen2-yarn-tiny, qwen3-tiny,
/// qwen3moe-tiny, gemma2-tiny, gemma3-tiny, phi3-tiny, phi3-longrope-tiny, gptoss-tiny, gptoss-mxfp4-tiny.
/// The gemma shapes have a window of 4 positions so that short prompts reach past it.
std::span<const SynthShape> synth_shapes();
const SynthShape* find_synth_shape(std::string_view name);

struct SynthOptions {
  uint64_t seed = 1;
  int n_threads = 0;     ///< quantization threads (0: all cores)
  bool progress = true;  ///< on stderr, only when it is a terminal
};

/// Writes the model atomically to `path`, generating and quantizing one tensor at a time.
Status write_synth_model(const std::string& path, const SynthShape& shape, FileType type,
                         const SynthOptions& options = {});

/// Synthetic Phi-3 LongRoPE divisors (n_rot/2 each): short ones rising from 1 to 3, long ones from 1
/// to 8; and the cos/sin scale of a context of n_ctx over n_ctx_orig, sqrt(1 + ln(n_ctx/n_ctx_orig) /
/// ln(n_ctx_orig)), as the Phi-3 configs define it.
std::vector<float> longrope_factors(int n_rot, bool long_context);
float longrope_attn_factor(int n_ctx, int n_ctx_orig);

/// Llama 3.1's frequency divisors for RoPE (factor, low 1, high 4, original context 8192), n_rot/2.
std::vector<float> llama3_rope_freq_factors(int n_rot, float freq_base, float factor);

}  // namespace loom::llm
