// Model loading: hyperparameters, tensor checks, memory check, then the weights go where the
// backend computes (a view of the mapping on the CPU, a device copy elsewhere). With an offload
// backend the last layers and the output head go to its memory instead.
#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <unordered_set>

#include <fmt/format.h>

#include "host_view_buffer.h"
#include "llm_model_impl.h"
#include "loom/progress.h"

namespace loom::llm {

namespace detail {

uint64_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;  // reported in kB
  }
  return 0;
}

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

namespace {

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string count_string(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1000ull) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{}", n);
}

// Weight tensors with their description in the file.
using WeightList = std::vector<std::pair<Tensor*, const GgufTensorInfo*>>;

// Checks declared tensors against the file and makes weight tensors for them.
class FileTensorLoader final : public TensorLoader {
 public:
  FileTensorLoader(const GgufFile& file, Graph& tensors) : file_(file), tensors_(tensors) {}

  Tensor* require(const std::string& name, const Shape& ne, WeightKind kind) override {
    return find(name, ne, kind, true);
  }
  Tensor* optional(const std::string& name, const Shape& ne, WeightKind kind) override {
    return find(name, ne, kind, false);
  }

  const Status& status() const { return status_; }
  /// Weight tensors in declaration order, each with its description in the file.
  const WeightList& loaded() const { return loaded_; }

 private:
  Tensor* fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    return nullptr;
  }

  Tensor* find(const std::string& name, const Shape& ne, WeightKind kind, bool required) {
    if (!status_.ok()) return nullptr;
    const GgufTensorInfo* info = file_.find_tensor(name);
    if (!info) {
      if (!required) return nullptr;
      return fail(make_error(StatusCode::format_error, "{}: missing tensor '{}' (expected shape {})",
                             file_.name(), name, shape_string(ne)));
    }
    if (info->ne != ne)
      return fail(make_error(StatusCode::shape_mismatch, "{}: tensor '{}' has shape {}, expected {}",
                             file_.name(), name, shape_string(info->ne), shape_string(ne)));
    auto dtype = file_.dtype_of(*info);
    if (!dtype) return fail(dtype.status());
    if (kind == WeightKind::vector && *dtype != DType::f32)
      return fail(make_error(StatusCode::type_mismatch, "{}: tensor '{}' has type {}, expected f32",
                             file_.name(), name, dtype_name(*dtype)));
    if (kind == WeightKind::matrix && *dtype == DType::i32)
      return fail(make_error(StatusCode::type_mismatch,
                             "{}: tensor '{}' has type i32, expected a float or quantized type", file_.name(),
                             name));
    Tensor* t = tensors_.weight(*dtype, ne, name);
    loaded_.emplace_back(t, info);
    return t;
  }

  const GgufFile& file_;
  Graph& tensors_;
  Status status_;
  WeightList loaded_;
};

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Host backends: tensors point into the mapping. Touching every page now (with progress) moves the
// disk reads to load time instead of the first tokens.
Status bind_host(ModelImpl& m, const WeightList& weights, bool progress) {
  const std::span<const uint8_t> bytes = m.file.bytes();
  m.buffer = std::make_unique<HostViewBuffer>(bytes.data(), bytes.size());
  ProgressLine line(progress, fmt::format("loom: loading {}", base_name(m.file.name())));
  uint64_t total = 0;
  for (const auto& [t, info] : weights) total += info->size;
  uint64_t done = 0;
  volatile uint8_t sink = 0;
  for (const auto& [t, info] : weights) {
    LOOM_TRY(tensor_bind(t, m.buffer.get(), static_cast<size_t>(info->data - bytes.data())));
    uint8_t acc = 0;
    for (uint64_t off = 0; off < info->size; off += 4096) acc ^= info->data[off];
    sink = sink ^ acc;
    done += info->size;
    line.update(total ? static_cast<double>(done) / total : 1.0);
  }
  (void)sink;
  return {};
}

// Device backends (and offload backends of any kind): one buffer for `weights`, filled tensor by
// tensor from the mapping.
Status upload(const ModelImpl& m, Backend& backend, const WeightList& weights, std::unique_ptr<Buffer>& out,
              bool progress) {
  BufferType& type = backend.buffer_type();
  const size_t align = type.alignment();
  size_t total = 0;
  for (const auto& [t, info] : weights) total += align_up(t->nbytes(), align);
  auto buf = type.allocate(total);
  if (!buf)
    return make_error(buf.status().code(), "{}: cannot allocate {} of {} memory for the weights: {}",
                      m.file.name(), format_bytes(total), type.name(), buf.status().message());
  out = std::move(buf.value());
  ProgressLine line(progress, fmt::format("loom: loading {} to {}", base_name(m.file.name()), type.name()));
  size_t off = 0, done = 0;
  for (const auto& [t, info] : weights) {
    LOOM_TRY(tensor_bind(t, out.get(), off));
    LOOM_TRY(tensor_write(t, info->data, 0, info->size));
    off += align_up(t->nbytes(), align);
    done += info->size;
    line.update(total ? static_cast<double>(done) / total : 1.0);
  }
  return backend.synchronize();
}

// The layer of a "blk.N.*" tensor, -1 for the others.
int layer_of(const std::string& name) {
  constexpr std::string_view prefix = "blk.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  int il = -1;
  const char* first = name.data() + prefix.size();
  const auto [end, ec] = std::from_chars(first, name.data() + name.size(), il);
  return ec == std::errc() && end != first && *end == '.' ? il : -1;
}

// Splits the weights between the backends as llama.cpp does for -ngl: the offloaded layers (by
// tensor name, so every per-layer tensor an architecture declares follows its layer), the output
// norm and the output projection go to the offload backend; the token embeddings never do (a
// get_rows of a few rows is cheap on the host, and the table is large). A graph reads only its own
// backend's memory, so a tensor both sides use gets a second copy there: the output projection
// when it is tied to the embeddings, and the RoPE frequency factors (rope_freqs, Phi-3's long ones).
void assign_weights(ModelImpl& m, const WeightList& loaded, WeightList& main, WeightList& offload) {
  for (LayerWeights& l : m.w.layers) {
    l.rope_freqs = m.w.rope_freqs;
    l.rope_freqs_long = m.w.rope_freqs_long;
  }
  if (m.n_offload == 0) {
    main = loaded;
    return;
  }
  const int first = m.first_offload_layer();
  auto info_of = [&loaded](const Tensor* t) {
    for (const auto& entry : loaded)
      if (entry.first == t) return entry.second;
    return static_cast<const GgufTensorInfo*>(nullptr);
  };
  for (const auto& entry : loaded) {
    Tensor* t = entry.first;
    const bool head = t == m.w.output_norm || (t == m.w.output && t != m.w.tok_embd);
    (head || layer_of(t->name) >= first ? offload : main).push_back(entry);
  }
  if (m.w.output == m.w.tok_embd) {
    Tensor* copy = m.weight_tensors.weight(m.w.tok_embd->type, m.w.tok_embd->ne, "output.weight (tied)");
    offload.emplace_back(copy, info_of(m.w.tok_embd));
    m.w.output = copy;
  }
  const std::pair<Tensor*, Tensor* LayerWeights::*> factor_sets[] = {
      {m.w.rope_freqs, &LayerWeights::rope_freqs}, {m.w.rope_freqs_long, &LayerWeights::rope_freqs_long}};
  for (const auto& [shared, factors] : factor_sets) {
    if (!shared) continue;
    Tensor* copy = m.weight_tensors.weight(DType::f32, shared->ne, shared->name + " (offload)");
    offload.emplace_back(copy, info_of(shared));
    for (int il = first; il < static_cast<int>(m.hp.n_layer); ++il) m.w.layers[il].*factors = copy;
  }
  for (const auto& [t, info] : offload) m.offload_bytes += info->size;
}

}  // namespace
}  // namespace detail

Model::Model(std::unique_ptr<detail::ModelImpl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const HParams& Model::hparams() const { return impl_->hp; }
const GgufFile& Model::gguf() const { return impl_->file; }
Backend& Model::backend() const { return *impl_->backend; }
Backend* Model::offload_backend() const { return impl_->offload_backend; }
int Model::n_offload_layers() const { return impl_->n_offload; }
uint64_t Model::n_params() const { return impl_->n_params; }
uint64_t Model::n_bytes() const { return impl_->n_bytes; }

std::string Model::type_mixture() const {
  std::string s;
  for (const auto& [name, n] : impl_->type_counts)
    s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", name, n);
  return s;
}

std::string Model::summary() const {
  const detail::ModelImpl& m = *impl_;
  const HParams& hp = m.hp;
  std::string s =
      fmt::format("{}: {}, {} params, {} ({}), {} layers, {} embd, {}/{} heads, vocab {}, trained context {}",
                  detail::base_name(m.file.name()), arch_name(hp.arch), detail::count_string(m.n_params),
                  detail::format_bytes(m.n_bytes), type_mixture(), hp.n_layer, hp.n_embd, hp.n_head,
                  hp.n_head_kv, hp.n_vocab, hp.n_ctx_train);
  if (m.n_offload > 0) {
    const int first = m.first_offload_layer();
    const int last = static_cast<int>(hp.n_layer) - 1;
    auto layers = [](int a, int b) {
      return a == b ? fmt::format("layer {}", a) : fmt::format("layers {}-{}", a, b);
    };
    const std::string offloaded = first == 0 ? fmt::format("all {} layers", hp.n_layer) : layers(first, last);
    const std::string kept = first == 0 ? "the embeddings" : layers(0, first - 1) + " and the embeddings";
    s += fmt::format("; {} of {} layers on {}: {} and the output ({}); {} on {}", m.n_offload, hp.n_layer,
                     m.offload_backend->name(), offloaded, detail::format_bytes(m.offload_bytes), kept,
                     m.backend->name());
  }
  return s;
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, Backend& backend,
                                           const ModelLoadOptions& options) {
  auto file = GgufFile::open(path);
  if (!file) return file.status();
  auto impl = std::make_unique<detail::ModelImpl>(std::move(file.value()));
  detail::ModelImpl& m = *impl;
  auto hp = read_hparams(m.file);
  if (!hp) return hp.status();
  m.hp = *hp;
  m.arch = &detail::architecture_for(m.hp.arch);
  m.backend = &backend;
  if (options.n_offload_layers < 0)
    return make_error(StatusCode::invalid_argument, "{}: n_offload_layers {} must be >= 0", path,
                      options.n_offload_layers);
  if (options.offload_backend && options.n_offload_layers > 0) {
    m.offload_backend = options.offload_backend;
    m.n_offload = std::min(options.n_offload_layers, static_cast<int>(m.hp.n_layer));
  }

  detail::FileTensorLoader tl(m.file, m.weight_tensors);
  m.arch->declare_weights(tl, m.hp, m.w);
  LOOM_TRY(tl.status());

  std::map<std::string, int> counts;
  for (const auto& [t, info] : tl.loaded()) {
    m.n_params += static_cast<uint64_t>(t->nelements());
    m.n_bytes += info->size;
    ++counts[dtype_name(t->type)];
  }
  m.type_counts.assign(counts.begin(), counts.end());
  std::stable_sort(m.type_counts.begin(), m.type_counts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });

  detail::WeightList main_weights, offload_weights;
  detail::assign_weights(m, tl.loaded(), main_weights, offload_weights);

  // Host memory: the mapped weights a host backend computes on, plus copies on a host offload backend.
  const bool host = backend.buffer_type().is_host();
  uint64_t host_bytes = 0;
  for (const auto& [t, info] : main_weights) host_bytes += host ? info->size : 0;
  for (const auto& [t, info] : offload_weights)
    host_bytes += m.offload_backend->buffer_type().is_host() ? info->size : 0;
  const uint64_t avail = host_bytes == 0            ? 0
                         : options.available_memory ? options.available_memory
                                                    : detail::host_memory_available();
  if (avail && host_bytes > avail)
    return make_error(
        StatusCode::out_of_memory,
        "{}: the weights need {} of memory but only {} is available (MemAvailable); use a smaller "
        "model or quantization",
        path, detail::format_bytes(host_bytes), detail::format_bytes(avail));
  if (host)
    LOOM_TRY(detail::bind_host(m, main_weights, options.progress));
  else
    LOOM_TRY(detail::upload(m, backend, main_weights, m.buffer, options.progress));
  if (!offload_weights.empty())
    LOOM_TRY(detail::upload(m, *m.offload_backend, offload_weights, m.offload_buffer, options.progress));

  std::unique_ptr<Model> model(new Model(std::move(impl)));
  if (options.print_summary) fmt::print(stderr, "loom: model {}\n", model->summary());
  return model;
}

}  // namespace loom::llm
