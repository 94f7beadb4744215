#include "llm/quant_mixture.h"

#include <cctype>
#include <charconv>
#include <string>

namespace loom::llm {

namespace {

struct FileTypeInfo {
  FileType type;
  const char* name;
  uint32_t gguf_id;
  DType base;
};

constexpr FileTypeInfo kFileTypes[] = {
    {FileType::f32, "f32", 0, DType::f32},     {FileType::f16, "f16", 1, DType::f16},
    {FileType::bf16, "bf16", 32, DType::bf16}, {FileType::q8_0, "q8_0", 7, DType::q8_0},
    {FileType::q4_0, "q4_0", 2, DType::q4_0},  {FileType::q4_k, "q4_K", 14, DType::q4_k},
    {FileType::q6_k, "q6_K", 18, DType::q6_k}, {FileType::q4_k_m, "q4_K_M", 15, DType::q4_k},
};

const FileTypeInfo& info_of(FileType t) {
  for (const auto& i : kFileTypes)
    if (i.type == t) return i;
  return kFileTypes[0];
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

// Layer index of "blk.N.xxx", -1 for other names.
int layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int il = -1;
  const char* first = name.data() + 4;
  const char* last = name.data() + name.size();
  auto [p, ec] = std::from_chars(first, last, il);
  if (ec != std::errc() || p == last || *p != '.') return -1;
  return il;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// llama.cpp's fallback for rows that K-quant blocks do not divide.
DType fit_rows(DType t, int64_t ne0) {
  if (ne0 % dtype_block_size(t) == 0) return t;
  DType fallback = t;
  switch (t) {
    case DType::q4_k:  // llama.cpp: q5_0, which Loom lacks; q8_0 is the nearest type at least as precise
    case DType::q6_k:
      fallback = DType::q8_0;
      break;
    default:
      break;
  }
  if (ne0 % dtype_block_size(fallback) == 0) return fallback;
  return DType::f16;
}

}  // namespace

const char* file_type_name(FileType t) { return info_of(t).name; }
uint32_t file_type_gguf_id(FileType t) { return info_of(t).gguf_id; }
DType file_type_base(FileType t) { return info_of(t).base; }

std::optional<FileType> file_type_from_name(std::string_view name) {
  for (const auto& i : kFileTypes)
    if (iequals(name, i.name)) return i.type;
  return std::nullopt;
}

bool use_more_bits(int i_layer, int n_layer) {
  return i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2;
}

DType tensor_type_for(FileType ft, std::string_view name, const Shape& ne, int n_dims,
                      const MixtureModelInfo& info) {
  if (n_dims < 2) return DType::f32;
  DType t = file_type_base(ft);
  if (ft == FileType::q4_k_m) {
    const bool is_output = name == "output.weight" || (!info.has_output && name == "token_embd.weight");
    if (is_output) {
      t = ne[0] % kQK_K != 0 ? DType::q8_0 : DType::q6_k;
    } else if (contains(name, "attn_v.weight") || contains(name, "ffn_down")) {
      const int il = layer_of(name);
      if (il >= 0 && use_more_bits(il, info.n_layer)) t = DType::q6_k;
    }
  }
  return fit_rows(t, ne[0]);
}

}  // namespace loom::llm
