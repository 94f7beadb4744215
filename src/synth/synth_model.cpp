#include "synth_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numbers>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "loom/progress.h"
#include "synth_vocab.h"
#include "loom/gguf.h"

namespace loom::llm {

namespace {

// name, arch, vocab, embd, layers, heads, kv heads, head dim, ffn, ctx, rope base, eps, tied, qkv bias,
// qk norm, llama3 rope factor, experts, experts used, expert ffn, sliding window, attention soft-cap,
// final soft-cap, linear rope factor, yarn rope factor, original context, longrope, rotated dims, experts
// in mxfp4 (phi3: fused qkv and gate/up)
// clang-format off
constexpr SynthShape kShapes[] = {
    {"llama3-1b", Arch::llama, 128256, 2048, 16, 32, 8, 64, 8192, 131072, 500000.0f, 1e-5f, true, false,
     false, 32.0f, 0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    {"llama3-8b", Arch::llama, 128256, 4096, 32, 32, 8, 128, 14336, 131072, 500000.0f, 1e-5f, false, false,
     false, 8.0f, 0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    // Llama 3.x 70B's shape: 141 GB in F16, more than one GPU holds (tensor parallelism's test case).
    {"llama3-70b", Arch::llama, 128256, 8192, 80, 64, 8, 128, 28672, 131072, 500000.0f, 1e-5f, false, false,
     false, 8.0f, 0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    {"small", Arch::llama, 2048, 256, 4, 8, 4, 32, 768, 1024, 10000.0f, 1e-5f, false, false, false, 0.0f, 0, 0,
     0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    {"tiny", Arch::llama, 512, 128, 2, 4, 2, 32, 384, 512, 10000.0f, 1e-5f, false, false, false, 0.0f, 0, 0, 0,
     0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    // Llama 3.1 features on the tiny shape: rope_freqs, tied output, q/k/v biases (some fine-tunes).
    {"llama31-tiny", Arch::llama, 512, 128, 2, 4, 2, 32, 384, 512, 500000.0f, 1e-5f, true, true, false, 8.0f, 0,
     0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    {"qwen2-tiny", Arch::qwen2, 512, 128, 2, 4, 2, 32, 384, 512, 1000000.0f, 1e-6f, true, true, false, 0.0f, 0,
     0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    // Qwen2.5's YaRN recipe: factor 4 over a 128-token original context (context_length 512 = 4 x 128).
    {"qwen2-yarn-tiny", Arch::qwen2, 512, 128, 2, 4, 2, 32, 384, 512, 10000.0f, 1e-6f, false, true, false, 0.0f,
     0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 4.0f, 128, false, 0, false},
    {"qwen3-tiny", Arch::qwen3, 512, 128, 2, 4, 2, 64, 384, 512, 1000000.0f, 1e-6f, false, false, true, 0.0f,
     0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    {"qwen3moe-tiny", Arch::qwen3moe, 512, 128, 2, 4, 2, 64, 384, 512, 1000000.0f, 1e-6f, false, false, true,
     0.0f, 8, 2, 64, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    // Gemma 2: local layers 0 and 2, global layer 1; Gemma 2's caps.
    {"gemma2-tiny", Arch::gemma2, 512, 128, 3, 4, 2, 64, 384, 512, 10000.0f, 1e-6f, true, false, false, 0.0f,
     0, 0, 0, 4, 50.0f, 30.0f, 0.0f, 0.0f, 0, false, 0, false},
    // Gemma 3: local layers 0-4, global layer 5 with linear RoPE scaling as in the 4B+ models.
    {"gemma3-tiny", Arch::gemma3, 512, 128, 6, 4, 2, 64, 384, 512, 1000000.0f, 1e-6f, true, false, true, 0.0f,
     0, 0, 0, 4, 0.0f, 0.0f, 8.0f, 0.0f, 0, false, 0, false},
    // Phi-3: fused attn_qkv and gate/up (ffn_up holds both), NeoX RoPE, untied output, every layer
    // attending through a window (of 6 positions here, so that short prompts reach past it).
    {"phi3-tiny", Arch::phi3, 512, 128, 2, 4, 2, 32, 384, 512, 10000.0f, 1e-5f, false, false, false, 0.0f, 0,
     0, 0, 6, 0.0f, 0.0f, 0.0f, 0.0f, 0, false, 0, false},
    // Phi-4-mini style: LongRoPE over an original context of 128 (context_length 512), 3/4 of each head
    // rotated, tied output, no window.
    {"phi3-longrope-tiny", Arch::phi3, 512, 128, 2, 4, 2, 32, 384, 512, 10000.0f, 1e-5f, true, false, false, 0.0f,
     0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f, 128, true, 24, false},
    // gpt-oss: biases on q/k/v/o, the router and the experts, attention sinks, local layers 0 and 2
    // (a window of 4 positions here, so that short prompts reach past it), YaRN factor 32 over 4096
    // (context 131072) with base 150000 as released, 8 query / 2 KV heads of 64 (the fast attention
    // kernels' head size), 8 experts of which 4 are used. n_embd (160) differs from 2 n_ff_exp (128)
    // and from n_head * head_dim (512), so that a transposed or interleaved mapping cannot pass.
    {"gptoss-tiny", Arch::gpt_oss, 512, 160, 4, 8, 2, 64, 64, 131072, 150000.0f, 1e-5f, false, true, false, 0.0f,
     8, 4, 64, 4, 0.0f, 0.0f, 0.0f, 32.0f, 4096, false, 0, false},
    // The same with the experts in MXFP4, as the released files carry them, whatever the type asked for.
    {"gptoss-mxfp4-tiny", Arch::gpt_oss, 512, 160, 4, 8, 2, 64, 64, 131072, 150000.0f, 1e-5f, false, true, false,
     0.0f, 8, 4, 64, 4, 0.0f, 0.0f, 0.0f, 32.0f, 4096, false, 0, true},
};
// clang-format on

bool is_gemma(Arch a) { return a == Arch::gemma2 || a == Arch::gemma3; }

int64_t rows_of(const std::vector<int64_t>& ne) {
  int64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  return rows;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

enum class Init { matrix, norm, bias, sink, fixed };

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> ne;
  DType type;
  Init init;
  std::vector<float> fixed;  // Init::fixed values
};

// Fills rows [r0, r1) of a tensor of `ne0` columns.
void generate_rows(const PlannedTensor& t, uint64_t seed, int64_t r0, int64_t r1, uint8_t* dst) {
  const int64_t ne0 = t.ne[0];
  const size_t row_bytes = dtype_row_size(t.type, ne0);
  std::vector<float> row(static_cast<size_t>(ne0));
  const uint64_t tensor_seed = seed ^ hash_name(t.name);
  float lo = -1.0f, hi = 1.0f;
  switch (t.init) {
    case Init::matrix:
      hi = std::sqrt(3.0f / static_cast<float>(ne0));
      lo = -hi;
      break;
    case Init::norm:
      lo = 0.75f;
      hi = 1.25f;
      break;
    case Init::bias:
      lo = -0.2f;
      hi = 0.2f;
      break;
    case Init::sink:  // logits comparable to the scores, so that a sink takes a visible share
      lo = -0.5f;
      hi = 2.0f;
      break;
    case Init::fixed:
      break;
  }
  for (int64_t r = r0; r < r1; ++r) {
    if (t.init == Init::fixed) {
      std::copy(t.fixed.begin() + r * ne0, t.fixed.begin() + (r + 1) * ne0, row.begin());
    } else {
      uint64_t state = tensor_seed + 0xD1B54A32D192ED03ull * static_cast<uint64_t>(r + 1);
      for (float& x : row) {
        const float u = static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        x = lo + (hi - lo) * u;
      }
    }
    quantize_row(t.type, row.data(), dst + static_cast<size_t>(r) * row_bytes, ne0);
  }
}

// The mixture rule over the whole list (its counters run in file order); tensors it does not
// quantize (norms, biases, rope factors) are written as f32.
void assign_types(std::vector<PlannedTensor>& tensors, FileType ft, const MixtureModelInfo& info) {
  std::vector<MixtureTensor> seen;
  for (const PlannedTensor& t : tensors) {
    MixtureTensor m{t.name, {1, 1, 1, 1}};
    std::copy(t.ne.begin(), t.ne.end(), m.ne.begin());
    seen.push_back(m);
  }
  const std::vector<TensorTypeChoice> choices = choose_tensor_types(ft, seen, info);
  for (size_t i = 0; i < tensors.size(); ++i)
    tensors[i].type = choices[i].quantizable ? choices[i].type : DType::f32;
}

std::vector<PlannedTensor> plan_tensors(const SynthShape& s, FileType ft) {
  MixtureModelInfo info;
  info.n_layer = s.n_layer;
  info.tied_embeddings = s.tied_output;
  info.n_expert = s.n_expert;
  info.n_gqa = s.n_head_kv > 0 ? std::max(1, s.n_head / s.n_head_kv) : 1;
  std::vector<PlannedTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> ne, Init init) {
    out.push_back({std::move(name), std::move(ne), DType::f32, init, {}});  // type: assign_types
  };
  const int64_t q_dim = static_cast<int64_t>(s.head_dim) * s.n_head;
  const int64_t kv_dim = static_cast<int64_t>(s.head_dim) * s.n_head_kv;
  add("token_embd.weight", {s.n_embd, s.n_vocab}, Init::matrix);
  if (s.llama3_rope_factor > 0.0f) {
    out.push_back({"rope_freqs.weight",
                   {s.head_dim / 2},
                   DType::f32,
                   Init::fixed,
                   llama3_rope_freq_factors(s.head_dim, s.rope_base, s.llama3_rope_factor)});
  }
  if (s.longrope) {
    const int n_rot = s.n_rot > 0 ? s.n_rot : s.head_dim;
    for (bool long_context : {true, false})
      out.push_back({long_context ? "rope_factors_long.weight" : "rope_factors_short.weight",
                     {n_rot / 2},
                     DType::f32,
                     Init::fixed,
                     longrope_factors(n_rot, long_context)});
  }
  for (int il = 0; il < s.n_layer; ++il) {
    auto n = [il](const char* what) { return fmt::format("blk.{}.{}", il, what); };
    add(n("attn_norm.weight"), {s.n_embd}, Init::norm);
    if (s.arch == Arch::phi3) {  // one projection: query rows, then key rows, then value rows
      add(n("attn_qkv.weight"), {s.n_embd, q_dim + 2 * kv_dim}, Init::matrix);
    } else {
      add(n("attn_q.weight"), {s.n_embd, q_dim}, Init::matrix);
      add(n("attn_k.weight"), {s.n_embd, kv_dim}, Init::matrix);
      add(n("attn_v.weight"), {s.n_embd, kv_dim}, Init::matrix);
    }
    if (s.qkv_bias) {
      add(n("attn_q.bias"), {q_dim}, Init::bias);
      add(n("attn_k.bias"), {kv_dim}, Init::bias);
      add(n("attn_v.bias"), {kv_dim}, Init::bias);
    }
    if (s.qk_norm) {
      add(n("attn_q_norm.weight"), {s.head_dim}, Init::norm);
      add(n("attn_k_norm.weight"), {s.head_dim}, Init::norm);
    }
    add(n("attn_output.weight"), {q_dim, s.n_embd}, Init::matrix);
    const bool oss = s.arch == Arch::gpt_oss;
    if (oss) {
      add(n("attn_output.bias"), {s.n_embd}, Init::bias);
      add(n("attn_sinks.weight"), {s.n_head}, Init::sink);
    }
    // gpt-oss's FFN pre-norm is named post_attention_norm in GGUF files
    if (is_gemma(s.arch) || oss) add(n("post_attention_norm.weight"), {s.n_embd}, Init::norm);
    if (!oss) add(n("ffn_norm.weight"), {s.n_embd}, Init::norm);
    if (oss) {
      add(n("ffn_gate_inp.weight"), {s.n_embd, s.n_expert}, Init::matrix);
      add(n("ffn_gate_inp.bias"), {s.n_expert}, Init::bias);
      add(n("ffn_gate_exps.weight"), {s.n_embd, s.n_ff_exp, s.n_expert}, Init::matrix);
      add(n("ffn_gate_exps.bias"), {s.n_ff_exp, s.n_expert}, Init::bias);
      add(n("ffn_up_exps.weight"), {s.n_embd, s.n_ff_exp, s.n_expert}, Init::matrix);
      add(n("ffn_up_exps.bias"), {s.n_ff_exp, s.n_expert}, Init::bias);
      add(n("ffn_down_exps.weight"), {s.n_ff_exp, s.n_embd, s.n_expert}, Init::matrix);
      add(n("ffn_down_exps.bias"), {s.n_embd, s.n_expert}, Init::bias);
    } else if (s.n_expert > 0) {
      add(n("ffn_gate_inp.weight"), {s.n_embd, s.n_expert}, Init::matrix);
      add(n("ffn_gate_exps.weight"), {s.n_embd, s.n_ff_exp, s.n_expert}, Init::matrix);
      add(n("ffn_up_exps.weight"), {s.n_embd, s.n_ff_exp, s.n_expert}, Init::matrix);
      add(n("ffn_down_exps.weight"), {s.n_ff_exp, s.n_embd, s.n_expert}, Init::matrix);
    } else if (s.arch == Arch::phi3) {  // gate rows, then up rows
      add(n("ffn_up.weight"), {s.n_embd, 2 * static_cast<int64_t>(s.n_ff)}, Init::matrix);
      add(n("ffn_down.weight"), {s.n_ff, s.n_embd}, Init::matrix);
    } else {
      add(n("ffn_gate.weight"), {s.n_embd, s.n_ff}, Init::matrix);
      add(n("ffn_up.weight"), {s.n_embd, s.n_ff}, Init::matrix);
      add(n("ffn_down.weight"), {s.n_ff, s.n_embd}, Init::matrix);
    }
    if (is_gemma(s.arch)) add(n("post_ffw_norm.weight"), {s.n_embd}, Init::norm);
  }
  add("output_norm.weight", {s.n_embd}, Init::norm);
  if (!s.tied_output) add("output.weight", {s.n_embd, s.n_vocab}, Init::matrix);
  assign_types(out, ft, info);
  if (s.experts_mxfp4)
    for (PlannedTensor& t : out)
      if (t.name.ends_with("_exps.weight")) t.type = DType::mxfp4;
  return out;
}

Status add_metadata(GgufWriter& w, const SynthShape& s, FileType ft) {
  const std::string a = arch_name(s.arch);
  LOOM_TRY(w.add_string("general.architecture", a));
  LOOM_TRY(w.add_string("general.name", fmt::format("loom synthetic {} {}", s.name, file_type_name(ft))));
  LOOM_TRY(w.add_u32("general.file_type", file_type_gguf_id(ft)));
  LOOM_TRY(w.add_u32("general.quantization_version", 2));
  LOOM_TRY(w.add_u32(a + ".context_length", static_cast<uint32_t>(s.n_ctx)));
  LOOM_TRY(w.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd)));
  LOOM_TRY(w.add_u32(a + ".block_count", static_cast<uint32_t>(s.n_layer)));
  LOOM_TRY(w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff)));
  LOOM_TRY(w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head)));
  LOOM_TRY(w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv)));
  LOOM_TRY(w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim)));
  LOOM_TRY(w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim)));
  LOOM_TRY(w.add_f32(a + ".attention.layer_norm_rms_epsilon", s.norm_eps));
  LOOM_TRY(w.add_f32(a + ".rope.freq_base", s.rope_base));
  LOOM_TRY(w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(s.n_rot > 0 ? s.n_rot : s.head_dim)));
  LOOM_TRY(w.add_u32(a + ".vocab_size", static_cast<uint32_t>(s.n_vocab)));
  if (s.n_expert > 0) {
    LOOM_TRY(w.add_u32(a + ".expert_count", static_cast<uint32_t>(s.n_expert)));
    LOOM_TRY(w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(s.n_expert_used)));
    LOOM_TRY(w.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp)));
  }
  if (s.sliding_window > 0)
    LOOM_TRY(w.add_u32(a + ".attention.sliding_window", static_cast<uint32_t>(s.sliding_window)));
  if (s.attn_softcap > 0.0f) LOOM_TRY(w.add_f32(a + ".attn_logit_softcapping", s.attn_softcap));
  if (s.final_softcap > 0.0f) LOOM_TRY(w.add_f32(a + ".final_logit_softcapping", s.final_softcap));
  if (s.rope_linear_factor > 0.0f) {
    LOOM_TRY(w.add_string(a + ".rope.scaling.type", "linear"));
    LOOM_TRY(w.add_f32(a + ".rope.scaling.factor", s.rope_linear_factor));
  }
  if (s.rope_yarn_factor > 0.0f) {
    LOOM_TRY(w.add_string(a + ".rope.scaling.type", "yarn"));
    LOOM_TRY(w.add_f32(a + ".rope.scaling.factor", s.rope_yarn_factor));
  }
  if (s.n_ctx_orig > 0)
    LOOM_TRY(w.add_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(s.n_ctx_orig)));
  if (s.longrope)
    LOOM_TRY(w.add_f32(a + ".rope.scaling.attn_factor", longrope_attn_factor(s.n_ctx, s.n_ctx_orig)));

  const SynthVocab v = make_synth_vocab(s.n_vocab);
  LOOM_TRY(w.add_string("tokenizer.ggml.model", "gpt2"));
  LOOM_TRY(w.add_string("tokenizer.ggml.pre", "default"));
  LOOM_TRY(w.add_array("tokenizer.ggml.tokens", std::span<const std::string>(v.tokens)));
  LOOM_TRY(w.add_array("tokenizer.ggml.token_type", std::span<const int32_t>(v.token_types)));
  LOOM_TRY(w.add_array("tokenizer.ggml.merges", std::span<const std::string>(v.merges)));
  LOOM_TRY(w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos)));
  LOOM_TRY(w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos)));
  LOOM_TRY(w.add_bool("tokenizer.ggml.add_bos_token", true));
  return {};
}

}  // namespace

std::span<const SynthShape> synth_shapes() { return kShapes; }

const SynthShape* find_synth_shape(std::string_view name) {
  for (const SynthShape& s : kShapes)
    if (name == s.name) return &s;
  return nullptr;
}

std::vector<float> longrope_factors(int n_rot, bool long_context) {
  const int n = n_rot / 2;
  std::vector<float> out;
  for (int i = 0; i < n; ++i) {
    const double t = n > 1 ? static_cast<double>(i) / (n - 1) : 0.0;
    out.push_back(static_cast<float>(long_context ? 1.0 + 7.0 * t * t : 1.0 + 2.0 * t));
  }
  return out;
}

float longrope_attn_factor(int n_ctx, int n_ctx_orig) {
  const double scale = static_cast<double>(n_ctx) / n_ctx_orig;
  return scale <= 1.0 ? 1.0f
                      : static_cast<float>(
                            std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(n_ctx_orig))));
}

std::vector<float> llama3_rope_freq_factors(int n_rot, float freq_base, float factor) {
  const double low_freq_factor = 1.0, high_freq_factor = 4.0, old_ctx = 8192.0;
  const double low_wavelen = old_ctx / low_freq_factor, high_wavelen = old_ctx / high_freq_factor;
  std::vector<float> out;
  for (int i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double scaled = freq;
    if (wavelen > low_wavelen) {
      scaled = freq / factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      scaled = (1.0 - smooth) * freq / factor + smooth * freq;
    }
    out.push_back(static_cast<float>(freq / scaled));  // rope divides theta by this
  }
  return out;
}

Status write_synth_model(const std::string& path, const SynthShape& shape, FileType ft,
                         const SynthOptions& options) {
  GgufWriter w;
  LOOM_TRY(add_metadata(w, shape, ft));
  const std::vector<PlannedTensor> tensors = plan_tensors(shape, ft);
  uint64_t total = 0;
  for (const PlannedTensor& t : tensors)
    total += dtype_row_size(t.type, t.ne[0]) * static_cast<uint64_t>(rows_of(t.ne));
  const int n_threads = options.n_threads > 0
                            ? options.n_threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto progress = std::make_shared<ProgressLine>(options.progress, fmt::format("loom: writing {}", path));
  auto done = std::make_shared<uint64_t>(0);
  for (const PlannedTensor& t : tensors) {
    const uint64_t seed = options.seed;
    LOOM_TRY(w.add_tensor(
        t.name, t.type, t.ne, [&t, seed, n_threads, progress, done, total](std::span<uint8_t> dst) {
          const int64_t rows = rows_of(t.ne);
          // Rows in chunks handed out by a counter: quantizing a 128256-row embedding is the bulk of the
          // work.
          std::atomic<int64_t> next{0};
          const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(64, rows / (4 * n_threads) + 1));
          auto work = [&] {
            for (int64_t r0; (r0 = next.fetch_add(chunk)) < rows;)
              generate_rows(t, seed, r0, std::min(rows, r0 + chunk), dst.data());
          };
          const int n = static_cast<int>(std::min<int64_t>(n_threads, (rows + chunk - 1) / chunk));
          std::vector<std::thread> pool;
          try {
            for (int i = 1; i < n; ++i) pool.emplace_back(work);
          } catch (const std::system_error&) {
            // fewer threads than asked for: the ones started (and this one) share the rows
          }
          work();
          for (auto& th : pool) th.join();
          *done += dst.size();
          progress->update(total ? static_cast<double>(*done) / total : 1.0);
          return Status{};
        }));
  }
  Status s = w.write(path);
  progress->done();
  return s;
}

}  // namespace loom::llm
