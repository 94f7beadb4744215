// Model loading: hyperparameters, tensor checks, memory check, then the weights go where the
// backend computes (a view of the mapping on the CPU, a device copy elsewhere). With an offload
// backend the last layers and the output head go to its memory instead.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>
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

// The ranks' communicators go down together, each on a thread of its own: NCCL may treat tearing
// one down as a collective that waits for the others. First every rank's backend drops the graphs
// it recorded (Backend::reset): NCCL does not let a communicator go while a CUDA graph that
// captured its collectives still exists (a `loom bench -tp 2` hung in its teardown).
ModelImpl::~ModelImpl() {
  for (Shard& s : shards)
    if (s.backend) (void)s.backend->reset();
  shards.clear();
  std::vector<std::thread> threads;
  for (auto& c : comms)
    if (c) threads.emplace_back([&c] { c.reset(); });
  for (std::thread& t : threads) t.join();
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

// Every layer reads the model's RoPE frequency factors (LayerWeights::rope_freqs: a layer on another
// backend gets a copy of its own instead, assign_weights).
void give_layers_rope_factors(ModelWeights& w) {
  for (LayerWeights& l : w.layers) {
    l.rope_freqs = w.rope_freqs;
    l.rope_freqs_long = w.rope_freqs_long;
  }
}

// ---- tensor parallelism ----------------------------------------------------------------------------

int layer_of(const std::string& name);

// The dimension along which the ranks split a tensor (by its llama.cpp name), -1 when every rank
// holds it whole. Rows (dim 1 of a matrix, dim 0 of a bias) of the products whose outputs are per
// head or per FFN column; columns (dim 0) of those that sum over them, whose partial products the
// all-reduce adds up; the token embeddings' and the output projection's rows (the vocabulary; a
// file that ties them gets one slice serving both).
int split_dim(const std::string& name) {
  static const std::pair<std::string_view, int> kRules[] = {
      {"attn_q.weight", 1},      {"attn_k.weight", 1},        {"attn_v.weight", 1},
      {"attn_q.bias", 0},        {"attn_k.bias", 0},          {"attn_v.bias", 0},
      {"ffn_gate.weight", 1},    {"ffn_up.weight", 1},        {"ffn_gate_exps.weight", 1},
      {"ffn_up_exps.weight", 1}, {"ffn_gate_exps.bias", 0},   {"ffn_up_exps.bias", 0},
      {"attn_sinks.weight", 0},  {"attn_sinks", 0},           {"attn_output.weight", 0},
      {"ffn_down.weight", 0},    {"ffn_down_exps.weight", 0}, {"attn_qkv.weight", 1},
      {"attn_qkv.bias", 0},
  };
  if (name == "output.weight" || name == "token_embd.weight") return 1;  // the vocabulary
  if (layer_of(name) < 0) return -1;
  const std::string_view what = std::string_view(name).substr(name.find('.', 4) + 1);
  for (const auto& [suffix, dim] : kRules)
    if (what == suffix) return dim;
  return -1;
}

// Where one rank's part of a file tensor lies: ranges of indices along `dim`, one after the other
// (one range; several for a fused projection, whose parts are split each on its own).
struct Slice {
  Tensor* t = nullptr;  // the rank's tensor (its shape is the slice's)
  const GgufTensorInfo* info = nullptr;
  int dim = -1;                                     // -1: the whole tensor
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (begin, count) along dim
};

// Rank `rank` of `n_ranks` along a dimension of `size` elements: chunks of ceil(size / n_ranks).
std::pair<int64_t, int64_t> rank_range(int64_t size, int rank, int n_ranks) {
  const int64_t chunk = (size + n_ranks - 1) / n_ranks;
  const int64_t begin = std::min(size, chunk * rank);
  return {begin, std::min(size, begin + chunk) - begin};
}

// Declares one rank's tensors: checks each against the file like FileTensorLoader (through one,
// over a scratch graph) and makes a tensor of the rank's slice.
class ShardTensorLoader final : public TensorLoader {
 public:
  ShardTensorLoader(const GgufFile& file, const HParams& hp, Graph& tensors, int rank, int n_ranks)
      : file_(file), hp_(hp), checker_(file, scratch_), tensors_(tensors), rank_(rank), n_ranks_(n_ranks) {}

  Tensor* require(const std::string& name, const Shape& ne, WeightKind kind) override {
    return slice(checker_.require(name, ne, kind), name);
  }
  Tensor* optional(const std::string& name, const Shape& ne, WeightKind kind) override {
    return slice(checker_.optional(name, ne, kind), name);
  }
  Status status() const { return status_.ok() ? checker_.status() : status_; }
  const std::vector<Slice>& slices() const { return slices_; }

 private:
  Tensor* fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    return nullptr;
  }

  Tensor* slice(Tensor* whole, const std::string& name) {
    if (!whole) return nullptr;
    return make(checker_.loaded().back().second, name, split_dim(name), fused_parts(name, whole->ne));
  }

  // The parts of a fused projection, each split on its own (phi3's attn_qkv: queries, keys, values;
  // its ffn_up: gate rows, then up rows); empty for the others.
  std::vector<int64_t> fused_parts(const std::string& name, const Shape& ne) const {
    const std::string_view what = std::string_view(name).substr(name.find('.', 4) + 1);
    const int64_t q = static_cast<int64_t>(hp_.head_dim_k) * hp_.n_head, k = hp_.n_embd_k_gqa(),
                  v = hp_.n_embd_v_gqa();
    if (what == "attn_qkv.weight" || what == "attn_qkv.bias") return {q, k, v};
    if (what == "ffn_up.weight" && ne[1] == 2 * static_cast<int64_t>(hp_.n_ff)) return {hp_.n_ff, hp_.n_ff};
    return {};
  }

  Tensor* make(const GgufTensorInfo* info, const std::string& name, int dim,
               std::vector<int64_t> parts = {}) {
    if (!status_.ok()) return nullptr;
    auto dtype = file_.dtype_of(*info);
    if (!dtype) return fail(dtype.status());
    Shape ne = info->ne;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    if (dim >= 0) {
      if (parts.empty()) parts = {ne[dim]};
      const int64_t block = dtype_block_size(*dtype);
      int64_t part_begin = 0, total = 0;
      for (int64_t part : parts) {
        const auto [b, n] = rank_range(part, rank_, n_ranks_);
        if (n <= 0 || (dim == 0 && (b % block != 0 || n % block != 0)))
          return fail(make_error(
              StatusCode::unsupported, "{}: tensor '{}' ({} {}) cannot be split {} ways along dimension {}{}",
              file_.name(), name, dtype_name(*dtype), shape_string(info->ne), n_ranks_, dim,
              dim == 0 ? fmt::format(" on whole blocks of {}", block) : std::string()));
        ranges.emplace_back(part_begin + b, n);
        part_begin += part;
        total += n;
      }
      ne[dim] = total;
    }
    Tensor* t = tensors_.weight(*dtype, ne, fmt::format("{} (rank {})", name, rank_));
    slices_.push_back(Slice{t, info, dim, std::move(ranges)});
    return t;
  }

  const GgufFile& file_;
  const HParams& hp_;
  Graph scratch_;
  FileTensorLoader checker_;
  Graph& tensors_;
  const int rank_, n_ranks_;
  Status status_;
  std::vector<Slice> slices_;
};

// Copies tensors (whole, or a rank's slices) into one buffer of the backend (device backends, and
// offload backends of any kind): whole tensors straight from the mapping, split ones packed row by
// row on the host first. `line` (may be null) shows the progress.
Status upload_slices(const GgufFile& file, Backend& backend, const std::vector<Slice>& slices,
                     std::unique_ptr<Buffer>& out, ProgressLine* line = nullptr) {
  BufferType& type = backend.buffer_type();
  const size_t align = type.alignment();
  size_t total = 0;
  for (const Slice& s : slices) total += align_up(s.t->nbytes(), align);
  auto buf = type.allocate(total);
  if (!buf)
    return make_error(buf.status().code(), "{}: cannot allocate {} of {} memory for the weights: {}", file.name(),
                      format_bytes(total), type.name(), buf.status().message());
  out = std::move(buf.value());
  size_t off = 0;
  std::vector<uint8_t> packed;
  for (const Slice& s : slices) {
    LOOM_TRY(tensor_bind(s.t, out.get(), off));
    off += align_up(s.t->nbytes(), align);
    if (line) line->update(total ? static_cast<double>(off) / total : 1.0);
    if (s.dim < 0) {
      LOOM_TRY(tensor_write(s.t, s.info->data, 0, s.info->size));
      continue;
    }
    const std::array<size_t, kMaxDims> nb = contiguous_strides(s.t->type, s.info->ne);
    const Shape& ne = s.t->ne;
    // The file index of each of the slice's indices along the split dimension (identity elsewhere);
    // along dim 0, runs of whole blocks: (first byte in the file's row, bytes).
    std::array<std::vector<int64_t>, kMaxDims> index;
    for (int d = 1; d < kMaxDims; ++d)
      for (int64_t i = 0; i < ne[d]; ++i) index[static_cast<size_t>(d)].push_back(i);
    std::vector<std::pair<size_t, size_t>> runs;
    const size_t block_bytes = dtype_type_size(s.t->type);
    const int64_t block = dtype_block_size(s.t->type);
    if (s.dim == 0) {
      for (const auto& [b, n] : s.ranges)
        runs.emplace_back(static_cast<size_t>(b / block) * block_bytes,
                          static_cast<size_t>(n / block) * block_bytes);
    } else {
      runs.emplace_back(0, s.t->row_size());
      std::vector<int64_t>& at = index[static_cast<size_t>(s.dim)];
      at.clear();
      for (const auto& [b, n] : s.ranges)
        for (int64_t i = 0; i < n; ++i) at.push_back(b + i);
    }
    packed.resize(s.t->nbytes());
    uint8_t* dst = packed.data();
    for (int64_t i3 : index[3])
      for (int64_t i2 : index[2])
        for (int64_t i1 : index[1]) {
          const uint8_t* src = s.info->data + static_cast<size_t>(i1) * nb[1] +
                               static_cast<size_t>(i2) * nb[2] + static_cast<size_t>(i3) * nb[3];
          for (const auto& [off, n] : runs) {
            std::memcpy(dst, src + off, n);
            dst += n;
          }
        }
    LOOM_ASSERT(dst == packed.data() + packed.size());
    LOOM_TRY(tensor_write(s.t, packed.data(), 0, packed.size()));
  }
  return backend.synchronize();
}

// The rank's share of the hyperparameters; an error when a head count or width does not divide.
Result<HParams> shard_hparams(const std::string& path, const HParams& hp, int n_ranks, int64_t n_vocab_rows) {
  const std::pair<const char*, uint32_t> counts[] = {{"attention heads", hp.n_head},
                                                     {"KV heads", hp.n_head_kv},
                                                     {"FFN width", hp.n_ff},
                                                     {"expert FFN width", hp.n_ff_exp}};
  for (const auto& [what, n] : counts)
    if (n % static_cast<uint32_t>(n_ranks) != 0)
      return make_error(StatusCode::unsupported,
                        "{}: tensor parallelism over {} ranks needs the {} ({}) to divide by {}", path,
                        n_ranks, what, n, n_ranks);
  HParams s = hp;
  s.n_head /= n_ranks;
  s.n_head_kv /= n_ranks;
  s.n_ff /= n_ranks;
  s.n_ff_exp /= n_ranks;
  s.n_vocab = static_cast<uint32_t>(n_vocab_rows);
  return s;
}

// Loads rank by rank: each rank's weights go straight to its backend.
Status load_shards(ModelImpl& m, std::span<Backend* const> backends, bool progress) {
  const int n = static_cast<int>(backends.size());
  auto comms = make_communicators(backends);
  if (!comms)
    return make_error(comms.status().code(), "{}: tensor parallelism: {}", m.file.name(),
                      comms.status().message());
  m.comms = std::move(comms.value());
  ProgressLine line(progress, fmt::format("loom: loading {} over {} ranks", base_name(m.file.name()), n));
  for (int r = 0; r < n; ++r) {
    Shard s;
    s.backend = backends[static_cast<size_t>(r)];
    s.comm = m.comms[static_cast<size_t>(r)].get();
    ShardTensorLoader tl(m.file, m.hp, m.weight_tensors, r, n);
    m.arch->declare_weights(tl, m.hp, s.w);
    LOOM_TRY(tl.status());
    s.vocab_begin = rank_range(m.w.output->ne[1], r, n).first;
    auto hp = shard_hparams(m.file.name(), m.hp, n, s.w.output->ne[1]);
    if (!hp) return hp.status();
    s.hp = *hp;
    give_layers_rope_factors(s.w);
    LOOM_TRY(upload_slices(m.file, *s.backend, tl.slices(), s.buffer));
    m.shards.push_back(std::move(s));
    line.update(static_cast<double>(r + 1) / n);
  }
  return {};
}

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

// Device backends (and offload backends of any kind): one buffer for `weights`, whole tensors.
Status upload(const ModelImpl& m, Backend& backend, const WeightList& weights, std::unique_ptr<Buffer>& out,
              bool progress) {
  std::vector<Slice> whole;
  for (const auto& [t, info] : weights) whole.push_back(Slice{t, info, -1, {}});
  ProgressLine line(progress,
                    fmt::format("loom: loading {} to {}", base_name(m.file.name()), backend.buffer_type().name()));
  return upload_slices(m.file, backend, whole, out, &line);
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
  give_layers_rope_factors(m.w);
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
int Model::n_tensor_parallel() const {
  return impl_->shards.empty() ? 1 : static_cast<int>(impl_->shards.size());
}
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
  if (!m.shards.empty())
    s += fmt::format("; split over {} {} ranks (tensor parallel, {} per rank)", m.shards.size(),
                     m.shards[0].backend->name(), detail::format_bytes(m.shards[0].buffer->size()));
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

  if (options.tensor_parallel.size() > 1) {
    if (options.tensor_parallel[0] != &backend)
      return make_error(StatusCode::invalid_argument,
                        "{}: the first tensor-parallel backend must be the model's backend", path);
    if (m.n_offload > 0)
      return make_error(StatusCode::invalid_argument,
                        "{}: tensor parallelism and layer offload do not go together", path);
    LOOM_TRY(detail::load_shards(m, options.tensor_parallel, options.progress));
    std::unique_ptr<Model> model(new Model(std::move(impl)));
    if (options.print_summary) fmt::print(stderr, "loom: model {}\n", model->summary());
    return model;
  }

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
