// `loom quantize`'s engine. The writer pulls tensors one at a time, so memory stays at one output
// tensor plus a row of floats per thread, whatever the model size; each tensor's rows are split
// over the threads.
#include "quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include <fmt/format.h>

namespace loom::app {

namespace {

constexpr uint32_t kQuantizationVersion = 2;  // GGML_QNT_VERSION: the block layouts in dtype.h

bool is_float_type(uint32_t ggml_type) {
  const auto t = dtype_from_gguf(ggml_type);
  return t && (*t == DType::f32 || *t == DType::f16 || *t == DType::bf16);
}

// Integer metadata that may be missing or stored in any integer type.
int metadata_int(const GgufFile& in, const std::string& key) {
  const GgufValue* v = in.find(key);
  if (!v) return 0;
  const auto i = v->as_i64();
  return i && *i > 0 && *i < std::numeric_limits<int>::max() ? static_cast<int>(*i) : 0;
}

// Converts rows [row_begin, row_end) of a tensor from its float type to `dst`.
Status convert_rows(const GgufTensorInfo& t, DType src, DType dst, int64_t row_begin, int64_t row_end,
                    uint8_t* out) {
  const int64_t ne0 = t.ne[0];
  const size_t src_row = dtype_row_size(src, ne0);
  const size_t dst_row = dtype_row_size(dst, ne0);
  std::vector<float> row(static_cast<size_t>(ne0));
  for (int64_t r = row_begin; r < row_end; ++r) {
    dequantize_row(src, t.data + static_cast<size_t>(r) * src_row, row.data(), ne0);
    int bad = 0;
    for (float x : row) bad |= !std::isfinite(x);
    if (bad) {
      const auto col =
          std::find_if(row.begin(), row.end(), [](float x) { return !std::isfinite(x); }) - row.begin();
      return make_error(StatusCode::invalid_argument,
                        "tensor '{}': row {} column {} is {}: weights must be finite", t.name, r, col,
                        row[static_cast<size_t>(col)]);
    }
    quantize_row(dst, row.data(), out + static_cast<size_t>(r) * dst_row, ne0);
  }
  return {};
}

Status convert_tensor(const GgufTensorInfo& t, DType src, DType dst, int n_threads, std::span<uint8_t> out) {
  const int64_t rows = t.nelements() / t.ne[0];
  // A thread per ~64k elements at least: below that, starting a thread costs more than it saves.
  const int64_t useful = std::max<int64_t>(1, t.nelements() / 65536);
  const int n = static_cast<int>(std::min<int64_t>({static_cast<int64_t>(n_threads), rows, useful}));
  if (n <= 1) return convert_rows(t, src, dst, 0, rows, out.data());
  std::vector<Status> status(static_cast<size_t>(n));
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int64_t r0 = rows * i / n, r1 = rows * (i + 1) / n;
    // Errors stay in each thread's slot and are reported after the join, never thrown across.
    workers.emplace_back(
        [&, i, r0, r1] { status[static_cast<size_t>(i)] = convert_rows(t, src, dst, r0, r1, out.data()); });
  }
  for (std::thread& w : workers) w.join();
  for (const Status& s : status) LOOM_TRY(s);
  return {};
}

}  // namespace

Result<QuantizePlan> plan_quantization(const GgufFile& in, llm::FileType ftype, bool pure) {
  QuantizePlan plan;
  plan.ftype = ftype;
  plan.pure = pure;
  if (!llm::file_type_is_quantized(ftype))
    return make_error(StatusCode::invalid_argument,
                      "{}: loom quantize writes quantized file types; '{}' is not one (loom gen-model "
                      "writes {} models)",
                      in.name(), llm::file_type_name(ftype), llm::file_type_name(ftype));
  if (const GgufValue* v = in.find("split.count"); v && v->as_u64().value_or(1) > 1)
    return make_error(StatusCode::unsupported,
                      "{}: split GGUF files (split.count = {}) are not supported; merge them first",
                      in.name(), v->format());
  std::string arch;
  if (const GgufValue* v = in.find("general.architecture"); v && v->as_string())
    arch = std::string(*v->as_string());
  plan.n_layers = arch.empty() ? 0 : metadata_int(in, arch + ".block_count");
  plan.info.n_expert = arch.empty() ? 0 : metadata_int(in, arch + ".expert_count");
  if (!arch.empty()) {  // per-layer head counts (arrays) read as 0: no GQA bump then
    const int n_head = metadata_int(in, arch + ".attention.head_count");
    const int n_head_kv = metadata_int(in, arch + ".attention.head_count_kv");
    if (n_head > 0 && n_head_kv > 0) plan.info.n_gqa = std::max(1, n_head / n_head_kv);
  }
  if (plan.n_layers == 0)
    for (const GgufTensorInfo& t : in.tensors())
      plan.n_layers = std::max(plan.n_layers, llm::tensor_block_index(t.name) + 1);
  plan.info.n_layer = plan.n_layers;
  plan.info.tied_embeddings = in.find_tensor("output.weight") == nullptr;

  std::vector<llm::MixtureTensor> tensors;
  for (const GgufTensorInfo& t : in.tensors()) tensors.push_back({t.name, t.ne});
  const std::vector<llm::TensorTypeChoice> choices = llm::choose_tensor_types(ftype, tensors, plan.info, pure);

  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const GgufTensorInfo& t = in.tensors()[i];
    const llm::TensorTypeChoice& c = choices[i];
    TensorPlan p;
    p.name = std::string(t.name);
    p.ne = t.ne;
    p.n_dims = llm::significant_dims(t.ne);
    p.src_type = p.dst_type = t.ggml_type;
    p.src_bytes = p.dst_bytes = t.size;
    p.quantizable = c.quantizable;
    if (p.quantizable) {
      p.fell_back = c.type != c.wanted;
      p.dst_type = dtype_traits(c.type).gguf_id;
      p.dst_bytes = static_cast<uint64_t>(dtype_row_size(c.type, t.ne[0])) *
                    static_cast<uint64_t>(t.nelements() / t.ne[0]);
      p.convert = p.dst_type != p.src_type;
      if (p.convert && !is_float_type(t.ggml_type))
        return make_error(
            StatusCode::unsupported,
            "{}: tensor '{}' is {}; loom quantize converts f32, f16 or bf16 weights (quantizing "
            "twice compounds the error: start from the original weights)",
            in.name(), t.name, t.type_info->name);
    }
    plan.tensors.push_back(std::move(p));
  }
  return plan;
}

Result<QuantizeSummary> quantize_gguf(const std::string& in_path, const std::string& out_path,
                                      llm::FileType ftype, const QuantizeOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (std::filesystem::exists(out_path, ec) && std::filesystem::equivalent(in_path, out_path, ec))
    return make_error(StatusCode::invalid_argument, "{}: the output is the input file; write to another path",
                      out_path);
  auto in = GgufFile::open(in_path);
  if (!in) return in.status();
  auto planned = plan_quantization(*in, ftype, options.pure);
  if (!planned) return planned.status();

  QuantizeSummary summary;
  summary.plan = std::move(*planned);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  summary.n_threads = options.n_threads > 0 ? options.n_threads : hw;

  GgufWriter w;
  bool have_file_type = false, have_qversion = false;
  for (const GgufKV& kv : in->kvs()) {
    if (kv.key == "general.file_type") {
      LOOM_TRY(w.add_u32(kv.key, llm::file_type_gguf_id(ftype)));
      have_file_type = true;
    } else if (kv.key == "general.quantization_version") {
      LOOM_TRY(w.add_u32(kv.key, kQuantizationVersion));
      have_qversion = true;
    } else {
      LOOM_TRY(w.add_value(kv.key, kv.value));
    }
  }
  if (!have_qversion) LOOM_TRY(w.add_u32("general.quantization_version", kQuantizationVersion));
  if (!have_file_type) LOOM_TRY(w.add_u32("general.file_type", llm::file_type_gguf_id(ftype)));

  const auto tensors = in->tensors();
  const size_t count = tensors.size();
  uint64_t bytes_total = 0;
  for (const GgufTensorInfo& t : tensors) bytes_total += t.size;
  uint64_t bytes_done = 0;
  for (size_t i = 0; i < count; ++i) {
    const GgufTensorInfo& t = tensors[i];
    const TensorPlan& p = summary.plan.tensors[i];
    const std::array<int64_t, kMaxDims> ne = t.ne;
    const std::span<const int64_t> dims(ne.data(), static_cast<size_t>(t.n_dims));
    // Every tensor goes through a fill, copies included, so progress covers every tensor.
    auto fill = [&, i](std::span<uint8_t> dst) -> Status {
      if (options.on_tensor) options.on_tensor({false, i, count, &p, bytes_done, bytes_total});
      if (p.convert) {
        LOOM_TRY(convert_tensor(t, *dtype_from_gguf(p.src_type), *dtype_from_gguf(p.dst_type),
                                summary.n_threads, dst));
      } else {
        std::copy(t.data, t.data + t.size, dst.begin());
      }
      bytes_done += t.size;
      if (options.on_tensor) options.on_tensor({true, i, count, &p, bytes_done, bytes_total});
      return {};
    };
    if (const auto dst = dtype_from_gguf(p.dst_type)) {
      LOOM_TRY(w.add_tensor(t.name, *dst, dims, fill));
    } else {
      // A type Loom cannot compute with is copied by id; the writer needs the bytes up front.
      LOOM_TRY(w.add_tensor_ggml(t.name, p.dst_type, dims, t.data));
    }
    summary.bytes_in += p.src_bytes;
    summary.bytes_out += p.dst_bytes;
  }
  LOOM_TRY(w.write(out_path));
  summary.file_bytes = std::filesystem::file_size(out_path, ec);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace loom::app
