// Hyperparameters from GGUF metadata. Keys follow the GGUF convention `{arch}.name`; optional keys
// take the defaults GGUF runtimes use, and every value is range-checked so later size arithmetic
// cannot overflow on a hostile file.
#include <cmath>

#include <fmt/format.h>

#include "loom/llm.h"

namespace loom::llm {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::llama:
      return "llama";
    case Arch::qwen2:
      return "qwen2";
    case Arch::qwen3:
      return "qwen3";
    case Arch::qwen3moe:
      return "qwen3moe";
    case Arch::gemma2:
      return "gemma2";
    case Arch::gemma3:
      return "gemma3";
    case Arch::phi3:
      return "phi3";
    case Arch::gpt_oss:
      return "gpt-oss";
  }
  return "unknown";
}

namespace {
constexpr Arch kArchs[] = {Arch::llama,  Arch::qwen2,  Arch::qwen3, Arch::qwen3moe,
                           Arch::gemma2, Arch::gemma3, Arch::phi3,  Arch::gpt_oss};
}  // namespace

std::span<const Arch> supported_archs() { return kArchs; }

std::optional<Arch> arch_from_name(std::string_view name) {
  for (Arch a : kArchs)
    if (name == arch_name(a)) return a;
  return std::nullopt;
}

namespace {

// Limits far above any released model, small enough that products of two fit in 64 bits.
constexpr uint32_t kMaxDim = 1u << 20;
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxHeads = 4096;
constexpr uint32_t kMaxCtx = 1u << 24;
constexpr uint32_t kMaxExperts = 4096;

Status out_of_range(const GgufFile& f, const std::string& key, uint64_t v, uint64_t lo, uint64_t hi) {
  return make_error(StatusCode::format_error, "{}: key '{}': value {} is outside [{}, {}]", f.name(), key, v,
                    lo, hi);
}

Status get_dim(const GgufFile& f, const std::string& key, uint32_t hi, uint32_t& out) {
  auto v = f.get_u32(key);
  if (!v) return v.status();
  if (*v < 1 || *v > hi) return out_of_range(f, key, *v, 1, hi);
  out = *v;
  return {};
}

Status get_dim_or(const GgufFile& f, const std::string& key, uint32_t fallback, uint32_t hi, uint32_t& out) {
  if (!f.has(key)) {
    out = fallback;
    return {};
  }
  return get_dim(f, key, hi, out);
}

// An optional float in [lo, hi]; `out` keeps its value when the key is absent.
Status get_f32_in(const GgufFile& f, const std::string& key, float lo, float hi, float& out) {
  if (!f.has(key)) return {};
  auto v = f.get_f32(key);
  if (!v) return v.status();
  if (!(*v >= lo && *v <= hi))
    return make_error(StatusCode::format_error, "{}: key '{}': value {} is outside [{}, {}]", f.name(), key,
                      *v, lo, hi);
  out = *v;
  return {};
}

// Gemma 2 and 3: sliding-window layers, soft-capping, the query scale and local RoPE.
Status read_gemma(const GgufFile& f, const std::string& p, HParams& hp) {
  const bool gemma2 = hp.arch == Arch::gemma2;
  // Gemma 2 alternates local and global layers starting with a local one; Gemma 3 has five local
  // layers per global one. The files carry only the window, not the pattern.
  hp.swa_period = gemma2 ? 2 : 6;
  if (f.has(p + "attention.sliding_window")) {
    auto w = f.get_u32(p + "attention.sliding_window");
    if (!w) return w.status();
    if (*w > kMaxCtx) return out_of_range(f, p + "attention.sliding_window", *w, 0, kMaxCtx);
    hp.n_swa = *w;
  }
  // Gemma 2's local layers share the global RoPE; Gemma 3's use base 10000 without scaling.
  hp.rope_freq_base_swa = gemma2 ? hp.rope_freq_base : 10000.0f;
  LOOM_TRY(get_f32_in(f, p + "rope.freq_base_swa", 1.0f, 1e12f, hp.rope_freq_base_swa));
  if (!(hp.rope_freq_base_swa > 1.0f))
    return make_error(StatusCode::format_error, "{}: {}rope.freq_base_swa {} must be > 1", f.name(), p,
                      hp.rope_freq_base_swa);
  // Gemma 2 was trained with both caps; older files lack the keys and mean these values.
  if (gemma2) {
    hp.attn_softcap = 50.0f;
    hp.final_softcap = 30.0f;
  }
  LOOM_TRY(get_f32_in(f, p + "attn_logit_softcapping", 0.0f, 1e6f, hp.attn_softcap));
  LOOM_TRY(get_f32_in(f, p + "final_logit_softcapping", 0.0f, 1e6f, hp.final_softcap));
  // Queries are scaled by 1/sqrt(query_pre_attn_scalar), which is head_dim for every size except the
  // 27B models (n_embd / n_head there). GGUF files carry no key for it, so the 27B models are told
  // apart by their layer count (46 for Gemma 2, 62 for Gemma 3), as llama.cpp does.
  if (hp.n_layer == (gemma2 ? 46u : 62u))
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head));
  return {};
}

// Phi-3: every layer attends through the window when the file has one (the 4k models: 2047).
// LongRoPE (the 128k models, Phi-3.5, Phi-4-mini) comes as rope_factors_short/long tensors (see the
// architecture) and a cos/sin scale, rope.scaling.attn_factor.
Status read_phi3(const GgufFile& f, const std::string& p, HParams& hp) {
  LOOM_TRY(get_f32_in(f, p + "rope.scaling.attn_factor", 0.01f, 100.0f, hp.rope_attn_factor));
  if (hp.rope_scaling != RopeScaling::none)
    return make_error(StatusCode::unsupported,
                      "{}: {}rope.scaling.type: Phi-3 with RoPE scaling is not supported", f.name(), p);
  if (f.has(p + "attention.sliding_window")) {
    auto w = f.get_u32(p + "attention.sliding_window");
    if (!w) return w.status();
    if (*w > kMaxCtx) return out_of_range(f, p + "attention.sliding_window", *w, 0, kMaxCtx);
    hp.n_swa = *w;
    hp.swa_period = 1;
  }
  hp.rope_freq_base_swa = hp.rope_freq_base;  // local layers are the only layers: the same RoPE
  return {};
}

// gpt-oss (llama.cpp's convert_hf_to_gguf.py writes the window, the expert keys and YaRN: factor 32
// over an original 4096): local layers 0, 2, 4, ... (Hugging Face's layer_types: sliding, full,
// sliding, ...) with the same YaRN RoPE as the full ones; the router's top-k logits softmaxed among
// themselves; the clamped SwiGLU with the constants both reference implementations hard-code.
Status read_gpt_oss(const GgufFile& f, const std::string& p, HParams& hp) {
  auto w = f.get_u32(p + "attention.sliding_window");
  if (!w) return w.status();
  if (*w < 1 || *w > kMaxCtx) return out_of_range(f, p + "attention.sliding_window", *w, 1, kMaxCtx);
  hp.n_swa = *w;
  hp.swa_period = 2;
  hp.rope_freq_base_swa = hp.rope_freq_base;
  hp.swa_rope_scaled = true;
  hp.rope_yarn_unrounded = true;
  hp.expert_softmax_topk = true;
  hp.expert_weights_norm = false;  // the softmax over the chosen ones already sums to one
  hp.swiglu_oai_alpha = 1.702f;
  hp.swiglu_oai_limit = 7.0f;
  return {};
}

// Mixture of experts: expert count, experts per token and their FFN width.
Status read_moe(const GgufFile& f, const std::string& p, HParams& hp) {
  LOOM_TRY(get_dim(f, p + "expert_count", kMaxExperts, hp.n_expert));
  LOOM_TRY(get_dim(f, p + "expert_used_count", hp.n_expert, hp.n_expert_used));
  LOOM_TRY(get_dim(f, p + "expert_feed_forward_length", kMaxDim, hp.n_ff_exp));
  auto norm = f.get_bool_or(p + "expert_weights_norm", true);
  if (!norm) return norm.status();
  hp.expert_weights_norm = *norm;
  return {};
}

}  // namespace

Result<HParams> read_hparams(const GgufFile& f) {
  auto arch_str = f.get_string("general.architecture");
  if (!arch_str) return arch_str.status();
  auto arch = arch_from_name(*arch_str);
  if (!arch) {
    std::string supported;
    for (Arch a : kArchs) supported += fmt::format("{}{}", supported.empty() ? "" : ", ", arch_name(a));
    return make_error(StatusCode::unsupported, "{}: unknown architecture '{}' (supported: {})", f.name(),
                      *arch_str, supported);
  }
  HParams hp;
  hp.arch = *arch;
  const std::string p = std::string(*arch_str) + ".";

  LOOM_TRY(get_dim(f, p + "context_length", kMaxCtx, hp.n_ctx_train));
  LOOM_TRY(get_dim(f, p + "embedding_length", kMaxDim, hp.n_embd));
  LOOM_TRY(get_dim(f, p + "block_count", kMaxLayers, hp.n_layer));
  if (hp.arch == Arch::qwen3moe || hp.arch == Arch::gpt_oss) {
    // Every layer is sparse: the dense width is informational and some files omit it.
    LOOM_TRY(read_moe(f, p, hp));
    LOOM_TRY(get_dim_or(f, p + "feed_forward_length", hp.n_ff_exp, kMaxDim, hp.n_ff));
  } else {
    LOOM_TRY(get_dim(f, p + "feed_forward_length", kMaxDim, hp.n_ff));
  }
  LOOM_TRY(get_dim(f, p + "attention.head_count", kMaxHeads, hp.n_head));
  LOOM_TRY(get_dim_or(f, p + "attention.head_count_kv", hp.n_head, kMaxHeads, hp.n_head_kv));
  if (hp.n_head % hp.n_head_kv != 0)
    return make_error(StatusCode::format_error,
                      "{}: {}attention.head_count {} is not a multiple of head_count_kv {}", f.name(), p,
                      hp.n_head, hp.n_head_kv);
  const bool has_key_length = f.has(p + "attention.key_length");
  if (!has_key_length && hp.n_embd % hp.n_head != 0)
    return make_error(StatusCode::format_error,
                      "{}: {}embedding_length {} is not a multiple of head_count {} and there is no "
                      "{}attention.key_length",
                      f.name(), p, hp.n_embd, hp.n_head, p);
  LOOM_TRY(get_dim_or(f, p + "attention.key_length", hp.n_embd / hp.n_head, kMaxDim / 4, hp.head_dim_k));
  LOOM_TRY(get_dim_or(f, p + "attention.value_length", hp.head_dim_k, kMaxDim / 4, hp.head_dim_v));
  LOOM_TRY(get_dim_or(f, p + "rope.dimension_count", hp.head_dim_k, hp.head_dim_k, hp.n_rot));
  if (hp.n_rot % 2 != 0)
    return make_error(StatusCode::format_error, "{}: {}rope.dimension_count {} must be even", f.name(), p,
                      hp.n_rot);

  auto eps = f.get_f32(p + "attention.layer_norm_rms_epsilon");
  if (!eps) return eps.status();
  if (!(*eps > 0.0f && *eps < 1.0f))
    return make_error(StatusCode::format_error, "{}: {}attention.layer_norm_rms_epsilon {} must be in (0, 1)",
                      f.name(), p, *eps);
  hp.norm_rms_eps = *eps;
  auto base = f.get_f32_or(p + "rope.freq_base", 10000.0f);
  if (!base) return base.status();
  if (!(*base > 1.0f))
    return make_error(StatusCode::format_error, "{}: {}rope.freq_base {} must be > 1", f.name(), p, *base);
  hp.rope_freq_base = *base;

  // Scaling: `rope.scaling.type` ("none", "linear", "yarn") with `.factor`; older files carry only
  // `rope.scale_linear`.
  std::string scaling_type = "none";
  if (f.has(p + "rope.scaling.type")) {
    auto t = f.get_string(p + "rope.scaling.type");
    if (!t) return t.status();
    scaling_type = std::string(*t);
  }
  float factor = 0.0f;
  if (f.has(p + "rope.scaling.factor")) {
    auto v = f.get_f32(p + "rope.scaling.factor");
    if (!v) return v.status();
    factor = *v;
  } else if (f.has(p + "rope.scale_linear")) {
    auto v = f.get_f32(p + "rope.scale_linear");
    if (!v) return v.status();
    factor = *v;
    if (scaling_type == "none") scaling_type = "linear";
  }
  if (scaling_type == "none") {
    hp.rope_scaling = RopeScaling::none;
  } else if (scaling_type == "linear" || scaling_type == "yarn") {
    hp.rope_scaling = scaling_type == "linear" ? RopeScaling::linear : RopeScaling::yarn;
    if (!(factor >= 1.0f && factor <= 1024.0f))
      return make_error(StatusCode::format_error,
                        "{}: {}rope.scaling.factor {} must be in [1, 1024] for {} scaling", f.name(), p,
                        factor, scaling_type);
    hp.rope_scaling_factor = factor;
  } else {
    return make_error(StatusCode::unsupported,
                      "{}: {}rope.scaling.type '{}' is not supported (none, linear, yarn)", f.name(), p,
                      scaling_type);
  }
  LOOM_TRY(get_dim_or(f, p + "rope.scaling.original_context_length", hp.n_ctx_train, kMaxCtx, hp.n_ctx_orig));
  if (hp.arch == Arch::gemma2 || hp.arch == Arch::gemma3) LOOM_TRY(read_gemma(f, p, hp));
  if (hp.arch == Arch::phi3) LOOM_TRY(read_phi3(f, p, hp));
  if (hp.arch == Arch::gpt_oss) LOOM_TRY(read_gpt_oss(f, p, hp));
  if (hp.attn_scale == 0.0f) hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));

  // Vocabulary size: the tokenizer's list when present; token_embd is checked against it later.
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->is_array()) {
    if (toks->array_size() < 1 || toks->array_size() > (1u << 24))
      return make_error(StatusCode::format_error, "{}: tokenizer.ggml.tokens has {} entries", f.name(),
                        toks->array_size());
    hp.n_vocab = static_cast<uint32_t>(toks->array_size());
  } else if (f.has(p + "vocab_size")) {
    LOOM_TRY(get_dim(f, p + "vocab_size", 1u << 24, hp.n_vocab));
  } else if (const GgufTensorInfo* te = f.find_tensor("token_embd.weight")) {
    if (te->ne[1] < 1 || te->ne[1] > (1 << 24))
      return make_error(StatusCode::format_error, "{}: token_embd.weight has {} rows", f.name(), te->ne[1]);
    hp.n_vocab = static_cast<uint32_t>(te->ne[1]);
  } else {
    return make_error(StatusCode::format_error,
                      "{}: no vocabulary size (no tokenizer.ggml.tokens, {}vocab_size or token_embd.weight)",
                      f.name(), p);
  }
  return hp;
}

}  // namespace loom::llm
