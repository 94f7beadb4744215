// The per-tensor type rule (see quant_mixture.h for the rules and their sources).
#include "loom/quant_mixture.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

namespace loom::llm {

namespace {

struct FileTypeInfo {
  FileType type;
  const char* name;
  uint32_t gguf_id;
  DType base;
};

// In enum order: info_of indexes it.
constexpr std::array<FileTypeInfo, 21> kFileTypes = {{
    {FileType::f32, "f32", 0, DType::f32},
    {FileType::f16, "f16", 1, DType::f16},
    {FileType::bf16, "bf16", 32, DType::bf16},
    {FileType::q8_0, "q8_0", 7, DType::q8_0},
    {FileType::q4_0, "q4_0", 2, DType::q4_0},
    {FileType::q4_k, "q4_K", 14, DType::q4_k},
    {FileType::q6_k, "q6_K", 18, DType::q6_k},
    {FileType::q4_k_m, "q4_K_M", 15, DType::q4_k},
    {FileType::q4_1, "q4_1", 3, DType::q4_1},
    {FileType::q5_0, "q5_0", 8, DType::q5_0},
    {FileType::q5_1, "q5_1", 9, DType::q5_1},
    {FileType::q2_k, "q2_K", 10, DType::q2_k},
    {FileType::q3_k_s, "q3_K_S", 11, DType::q3_k},
    {FileType::q3_k_m, "q3_K_M", 12, DType::q3_k},
    {FileType::q3_k_l, "q3_K_L", 13, DType::q3_k},
    {FileType::q4_k_s, "q4_K_S", 14, DType::q4_k},
    {FileType::q5_k_s, "q5_K_S", 16, DType::q5_k},
    {FileType::q5_k_m, "q5_K_M", 17, DType::q5_k},
    {FileType::iq4_nl, "iq4_nl", 25, DType::iq4_nl},
    {FileType::iq4_xs, "iq4_xs", 30, DType::iq4_xs},
    {FileType::mxfp4_moe, "MXFP4_MOE", 38, DType::mxfp4},
}};

constexpr std::array<FileType, 21> kAllFileTypes = {
    FileType::f32,    FileType::f16,    FileType::bf16,   FileType::q8_0,   FileType::q4_0,
    FileType::q4_k,   FileType::q6_k,   FileType::q4_k_m, FileType::q4_1,   FileType::q5_0,
    FileType::q5_1,   FileType::q2_k,   FileType::q3_k_s, FileType::q3_k_m, FileType::q3_k_l,
    FileType::q4_k_s, FileType::q5_k_s, FileType::q5_k_m, FileType::iq4_nl, FileType::iq4_xs,
    FileType::mxfp4_moe};

static_assert([] {
  for (size_t i = 0; i < kFileTypes.size(); ++i)
    if (static_cast<size_t>(kFileTypes[i].type) != i || kAllFileTypes[i] != kFileTypes[i].type) return false;
  return kFileTypes.size() == kAllFileTypes.size();
}(), "kFileTypes and kAllFileTypes list every FileType in enum order");

const FileTypeInfo& info_of(FileType t) { return kFileTypes[static_cast<size_t>(t)]; }

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

const char* file_type_name(FileType t) { return info_of(t).name; }
uint32_t file_type_gguf_id(FileType t) { return info_of(t).gguf_id; }
DType file_type_base(FileType t) { return info_of(t).base; }
bool file_type_is_quantized(FileType t) { return dtype_is_quantized(file_type_base(t)); }
std::span<const FileType> all_file_types() { return kAllFileTypes; }

std::optional<FileType> file_type_from_name(std::string_view name) {
  for (const FileTypeInfo& f : kFileTypes)
    if (iequal(name, f.name)) return f.type;
  return std::nullopt;
}

int significant_dims(const Shape& ne) {
  for (int i = kMaxDims - 1; i > 0; --i)
    if (ne[static_cast<size_t>(i)] > 1) return i + 1;
  return 1;
}

int tensor_block_index(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int v = -1;
  const char* first = name.data() + 4;
  const char* last = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || ptr == first || ptr == last || *ptr != '.') return -1;
  return v;
}

bool tensor_is_quantizable(std::string_view name, int n_dims) {
  if (n_dims < 2 || !ends_with(name, "weight")) return false;
  // Small or precision-critical tensors llama.cpp keeps as they are; the list covers the
  // architectures Loom loads (LLaMA-like, MoE, BERT-like embeddings, T5 biases, Gemma 3n).
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

bool is_attn_output(std::string_view name) { return contains(name, "attn_output.weight"); }

DType choose_quant_type(std::string_view name, int layer, int n_layers, FileType ft,
                        const MixtureModelInfo& info, const Shape& ne) {
  const DType base = file_type_base(ft);
  // llama.cpp applies its rules only when the target is a quantized type.
  if (!file_type_is_quantized(ft)) return base;
  // MXFP4_MOE: the stacked expert matrices (3-D) in mxfp4, everything else in q8_0. llama.cpp gives
  // the output (and tied embeddings) q8_0 first, then decides by ne[2] alone: the same answer, as
  // those are 2-D.
  if (ft == FileType::mxfp4_moe) return ne[2] > 1 ? DType::mxfp4 : DType::q8_0;
  // The output matrix (or the embedding standing in for it) is the most sensitive tensor.
  if (is_output(name) || (info.tied_embeddings && is_token_embd(name)))
    return base == DType::q8_0 ? DType::q8_0 : DType::q6_k;
  if (is_token_embd(name)) return base;
  const bool iq4 = ft == FileType::iq4_nl || ft == FileType::iq4_xs;
  if (tensor_is_attn_v_like(name)) {
    DType t = base;
    if (ft == FileType::q2_k) t = info.n_gqa >= 4 ? DType::q4_k : DType::q3_k;
    else if (ft == FileType::q3_k_m) t = layer < 2 ? DType::q5_k : DType::q4_k;
    else if (ft == FileType::q3_k_l) t = DType::q5_k;
    else if (iq4 && info.n_gqa >= 4) t = DType::q5_k;
    else if ((ft == FileType::q4_k_m || ft == FileType::q5_k_m) && use_more_bits(layer, n_layers)) t = DType::q6_k;
    else if (ft == FileType::q4_k_s && layer < 4) t = DType::q5_k;
    if (info.n_expert == 8) t = DType::q8_0;  // 8 experts share attention: ~128 MB more for Mixtral
    return t;
  }
  if (contains(name, "attn_k.weight")) return info.n_expert == 8 ? DType::q8_0 : base;
  if (tensor_is_ffn_down(name)) {
    switch (ft) {
      case FileType::q2_k: return DType::q3_k;
      case FileType::q3_k_m: return layer < n_layers / 16 ? DType::q5_k : DType::q4_k;
      case FileType::q3_k_l: return DType::q5_k;
      case FileType::q4_k_m:
      case FileType::q5_k_m: return use_more_bits(layer, n_layers) ? DType::q6_k : base;
      case FileType::q4_k_s: return layer < n_layers / 8 ? DType::q5_k : base;
      case FileType::iq4_nl:
      case FileType::iq4_xs: return layer < n_layers / 8 ? DType::q5_k : base;
      default: return base;
    }
  }
  if (is_attn_output(name)) {
    if (info.n_expert == 8) {
      switch (ft) {
        case FileType::q2_k:
        case FileType::q3_k_s:
        case FileType::q3_k_m:
        case FileType::q4_k_s:
        case FileType::q4_k_m:
        case FileType::iq4_nl:
        case FileType::iq4_xs: return DType::q5_k;
        default: return base;
      }
    }
    if (ft == FileType::q2_k) return DType::q3_k;
    if (ft == FileType::q3_k_m) return DType::q4_k;
    if (ft == FileType::q3_k_l) return DType::q5_k;
  }
  return base;
}

// llama.cpp's tensor_type_fallback: a 32-element type of about the same size, then f16; except q4_K,
// which keeps Loom's q8_0 (chosen while CUDA had no q5_0 kernels and q4_K models had to run there;
// it reads q5_0 now, so llama.cpp's choice could return, at the cost of changing existing outputs).
DType fallback_quant_type(DType t, int64_t ne0) {
  if (ne0 % dtype_block_size(t) == 0) return t;
  DType next = DType::f16;
  switch (t) {
    case DType::q2_k:
    case DType::q3_k: next = DType::q4_0; break;
    case DType::q4_k: next = DType::q8_0; break;
    case DType::q5_k: next = DType::q5_1; break;
    case DType::q6_k: next = DType::q8_0; break;
    case DType::iq4_xs: next = DType::iq4_nl; break;
    default: break;
  }
  return ne0 % dtype_block_size(next) == 0 ? next : DType::f16;
}

std::vector<TensorTypeChoice> choose_tensor_types(FileType ft, std::span<const MixtureTensor> tensors,
                                                  const MixtureModelInfo& info, bool pure) {
  // llama.cpp counts the attn_v-like tensors up front: their count is the counter's n.
  int n_attn_v = 0;
  for (const MixtureTensor& t : tensors) n_attn_v += tensor_is_attn_v_like(t.name);

  std::vector<TensorTypeChoice> out;
  out.reserve(tensors.size());
  int i_attn_v = 0, i_ffn_down = 0;
  for (const MixtureTensor& t : tensors) {
    TensorTypeChoice c;
    c.quantizable = tensor_is_quantizable(t.name, significant_dims(t.ne));
    if (c.quantizable) {
      int layer = 0, n_layers = info.n_layer;
      if (tensor_is_attn_v_like(t.name)) {
        layer = i_attn_v++;
        n_layers = n_attn_v;
      } else if (tensor_is_ffn_down(t.name)) {
        // MoE files need not hold expert tensors in block order, so llama.cpp reads the block
        // index from the name there.
        layer = info.n_expert > 1 ? std::max(0, tensor_block_index(t.name)) : i_ffn_down;
        ++i_ffn_down;
      }
      c.wanted = pure ? file_type_base(ft) : choose_quant_type(t.name, layer, n_layers, ft, info, t.ne);
      c.type = fallback_quant_type(c.wanted, t.ne[0]);
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace loom::llm
