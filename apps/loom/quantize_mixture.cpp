// The per-tensor type rule of `loom quantize` (see quantize_mixture.h for the rules and sources).
#include "quantize_mixture.h"

#include <array>
#include <cctype>

namespace loom::app {

namespace {

struct FtypeInfo {
  QuantFtype ftype;
  const char* name;
  uint32_t file_type;
  DType base;
};

constexpr std::array<FtypeInfo, 5> kFtypes = {{
    {QuantFtype::q8_0, "q8_0", 7, DType::q8_0},
    {QuantFtype::q4_0, "q4_0", 2, DType::q4_0},
    {QuantFtype::q4_k, "q4_K", 14, DType::q4_k},
    {QuantFtype::q6_k, "q6_K", 18, DType::q6_k},
    {QuantFtype::q4_k_m, "q4_K_M", 15, DType::q4_k},
}};

const FtypeInfo& info_of(QuantFtype f) { return kFtypes[static_cast<size_t>(f)]; }

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

bool is_output(std::string_view name) { return name == "output.weight"; }
bool is_token_embd(std::string_view name) {
  return name == "token_embd.weight" || name == "per_layer_token_embd.weight";
}

}  // namespace

std::optional<QuantFtype> quant_ftype_from_name(std::string_view name) {
  for (const FtypeInfo& f : kFtypes)
    if (iequal(name, f.name)) return f.ftype;
  return std::nullopt;
}

const char* quant_ftype_name(QuantFtype f) { return info_of(f).name; }
uint32_t quant_ftype_file_type(QuantFtype f) { return info_of(f).file_type; }
DType quant_ftype_base_type(QuantFtype f) { return info_of(f).base; }

bool tensor_is_quantizable(std::string_view name, int n_dims) {
  if (n_dims < 2 || !ends_with(name, "weight")) return false;
  // Small or precision-critical tensors llama.cpp keeps as they are; the list covers the
  // architectures Loom loads (LLaMA-like, MoE, BERT-like embeddings, T5 biases).
  static constexpr std::string_view kKeep[] = {
      "_norm.weight", "ffn_gate_inp.weight",  "attn_rel_b.weight", "ssm_conv1d", ".position_embd", "altup",
      "laurel",       "per_layer_model_proj",
  };
  for (std::string_view k : kKeep)
    if (contains(name, k)) return false;
  return name != "position_embd.weight" && name != "token_types.weight";
}

bool tensor_is_attn_v_like(std::string_view name) {
  return contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") ||
         contains(name, "attn_kv_b.weight");
}

bool tensor_is_ffn_down(std::string_view name) { return contains(name, "ffn_down"); }

bool use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

DType choose_quant_type(std::string_view name, int layer, int n_layers, QuantFtype ftype,
                        const MixtureModelInfo& info) {
  const DType base = quant_ftype_base_type(ftype);
  // The output matrix (or the embedding standing in for it) is the most sensitive tensor.
  if (is_output(name) || (info.tied_embeddings && is_token_embd(name)))
    return base == DType::q8_0 ? DType::q8_0 : DType::q6_k;
  if (is_token_embd(name)) return base;
  if (tensor_is_attn_v_like(name)) {
    if (info.n_expert == 8) return DType::q8_0;  // 8 experts share attention: ~128 MB more for Mixtral
    if (ftype == QuantFtype::q4_k_m && use_more_bits(layer, n_layers)) return DType::q6_k;
    return base;
  }
  if (contains(name, "attn_k.weight")) return info.n_expert == 8 ? DType::q8_0 : base;
  if (tensor_is_ffn_down(name)) {
    if (ftype == QuantFtype::q4_k_m && use_more_bits(layer, n_layers)) return DType::q6_k;
    return base;
  }
  return base;
}

DType fallback_quant_type(DType t, int64_t ne0) {
  if (ne0 % dtype_block_size(t) == 0) return t;
  if ((t == DType::q4_k || t == DType::q6_k) && ne0 % dtype_block_size(DType::q8_0) == 0) return DType::q8_0;
  return DType::f16;
}

}  // namespace loom::app
