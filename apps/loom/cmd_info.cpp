// `loom info -m FILE`: metadata, tensor table and totals of a GGUF file.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "gguf_info.h"
#include "loom/dtype.h"
#include "loom/llm.h"

namespace loom::app {

namespace {

std::string shape_of(const GgufTensorInfo& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", t.ne[static_cast<size_t>(d)]);
  return s + "]";
}

// 6738415616 -> "6.74 B"; counts below 1000 stay exact.
std::string format_count(uint64_t n) {
  if (n < 1000) return fmt::format("{}", n);
  static constexpr const char* kUnits[] = {"K", "M", "B", "T"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1000.0 && u < 3) {
    v /= 1000.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

struct TypeTotal {
  size_t tensors = 0;
  uint64_t params = 0;
  uint64_t bytes = 0;
};

}  // namespace

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

SupportReport check_support(const GgufFile& f) {
  SupportReport r;
  if (auto arch = f.get_string("general.architecture")) {
    r.arch = std::string(*arch);
    r.arch_supported = llm::arch_from_name(*arch).has_value();
  }
  for (const GgufTensorInfo& t : f.tensors())
    if (!dtype_from_gguf(t.ggml_type)) r.unsupported_types[t.type_info->name].emplace_back(t.name);
  return r;
}

std::string describe_support(const SupportReport& r) {
  std::string archs, types;
  for (llm::Arch a : llm::supported_archs())
    archs += fmt::format("{}{}", archs.empty() ? "" : ", ", llm::arch_name(a));
  for (int i = 0; i < kDTypeCount; ++i)
    types += fmt::format("{}{}", types.empty() ? "" : ", ", dtype_name(static_cast<DType>(i)));
  if (r.ok())
    return fmt::format(
        "support:  Loom can run this file: architecture {} and every tensor type are supported\n",
        gguf_escape(r.arch, 256));
  std::string out = "support:  Loom cannot run this file:\n";
  if (r.arch.empty())
    out += fmt::format(
        "  no general.architecture key (string): not a model file (supported architectures: {})\n", archs);
  else if (!r.arch_supported)
    out += fmt::format("  architecture '{}' is not supported (supported: {})\n", gguf_escape(r.arch, 256),
                       archs);
  // At most a few names per type: a model holds hundreds of tensors of one type.
  constexpr size_t kNamesShown = 4;
  for (const auto& [type, names] : r.unsupported_types) {
    std::string shown;
    for (size_t i = 0; i < std::min(names.size(), kNamesShown); ++i)
      shown += fmt::format("{}{}", i ? ", " : "", gguf_escape(names[i], 256));
    if (names.size() > kNamesShown) shown += fmt::format(", ... {} more", names.size() - kNamesShown);
    out += fmt::format("  tensor type {} is not supported: {} tensor{} ({})\n", type, names.size(),
                       names.size() == 1 ? "" : "s", shown);
  }
  if (!r.unsupported_types.empty()) out += fmt::format("  (supported tensor types: {})\n", types);
  return out;
}

std::string describe_gguf(const GgufFile& f, size_t max_elements) {
  const auto escape = [](std::string_view s, size_t max_bytes) { return gguf_escape(s, max_bytes); };
  std::string out;
  auto line = [&out](std::string s) {
    out += s;
    out += '\n';
  };
  line(fmt::format("file:     {}", f.name()));
  line(fmt::format("format:   GGUF v{}, {} ({} bytes), alignment {}, tensor data at byte {}", f.version(),
                   format_bytes(f.file_size()), f.file_size(), f.alignment(), f.data_offset()));

  const auto kvs = f.kvs();
  line(fmt::format("metadata: {} keys", kvs.size()));
  size_t key_w = 3, type_w = 4;
  for (const GgufKV& kv : kvs) {
    key_w = std::max(key_w, escape(kv.key, 256).size());
    type_w = std::max(type_w, kv.value.type_string().size());
  }
  for (const GgufKV& kv : kvs)
    line(fmt::format("  {:<{}}  {:<{}}  {}", escape(kv.key, 256), key_w, kv.value.type_string(), type_w,
                     kv.value.format(max_elements)));

  const auto tensors = f.tensors();
  line(fmt::format("tensors:  {}", tensors.size()));
  size_t name_w = 4, type_col = 4, shape_w = 5;
  for (const GgufTensorInfo& t : tensors) {
    name_w = std::max(name_w, escape(t.name, 256).size());
    type_col = std::max(type_col, std::string_view(t.type_info->name).size());
    shape_w = std::max(shape_w, shape_of(t).size());
  }
  const size_t idx_w = std::max<size_t>(1, fmt::format("{}", tensors.size()).size());
  if (!tensors.empty())
    line(fmt::format("  {:>{}}  {:<{}}  {:<{}}  {:<{}}  {:>12}  {:>12}", "#", idx_w, "name", name_w, "type",
                     type_col, "shape", shape_w, "size", "offset"));
  std::map<std::string, TypeTotal> by_type;
  uint64_t params = 0, bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& t = tensors[i];
    line(fmt::format("  {:>{}}  {:<{}}  {:<{}}  {:<{}}  {:>12}  {:>12}", i, idx_w, escape(t.name, 256),
                     name_w, t.type_info->name, type_col, shape_of(t), shape_w, format_bytes(t.size),
                     t.offset));
    TypeTotal& tt = by_type[t.type_info->name];
    ++tt.tensors;
    tt.params += static_cast<uint64_t>(t.nelements());
    tt.bytes += t.size;
    params += static_cast<uint64_t>(t.nelements());
    bytes += t.size;
  }
  const double bits = params ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0;
  line(fmt::format("totals:   {} parameters ({}), {} of tensor data ({:.2f} bits per parameter)",
                   format_count(params), params, format_bytes(bytes), bits));
  for (const auto& [name, tt] : by_type)
    line(fmt::format("  {:<{}}  {:>5} tensors  {:>12} parameters  {:>12}  {:5.1f}%", name, type_col,
                     tt.tensors, tt.params, format_bytes(tt.bytes),
                     bytes ? 100.0 * static_cast<double>(tt.bytes) / static_cast<double>(bytes) : 0.0));
  out += describe_support(check_support(f));
  return out;
}

void add_info_command(CLI::App& app, std::vector<Command>& out) {
  struct Options {
    std::string model;
    size_t max_elements = 8;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("info",
                         "Print a GGUF file's metadata, tensors and totals, and whether Loom supports "
                         "its architecture and tensor types");
  // `loom info FILE` or `loom info -m FILE`, exactly one of them.
  auto* file = cmd->add_option_group("file", "The GGUF file: -m FILE or FILE");
  file->add_option("-m,--model", opts->model, "GGUF file");
  file->add_option("file", opts->model, "GGUF file (as -m)");
  file->require_option(1);
  cmd->add_option("--max-array", opts->max_elements, "Array elements shown per metadata key")
      ->check(CLI::Range(0, 1 << 20));
  out.push_back({cmd, [opts] {
                   auto f = GgufFile::open(opts->model);
                   if (!f) {
                     std::fprintf(stderr, "loom: %s\n", f.status().to_string().c_str());
                     return 1;
                   }
                   const std::string text = describe_gguf(*f, opts->max_elements);
                   std::fwrite(text.data(), 1, text.size(), stdout);
                   return 0;
                 }});
}

}  // namespace loom::app
