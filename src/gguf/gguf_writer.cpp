// GGUF writer: validates what it is given, then streams header, metadata, tensor infos and aligned
// tensor data to memory or to a temporary file that is renamed over the target.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <new>

#include <fmt/format.h>

#include "gguf_internal.h"

namespace loom {

using gguf_detail::escape;

namespace {

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  // resize + memcpy rather than insert: g++ 12 reports a false -Wstringop-overflow for the latter
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

template <typename T>
std::vector<uint8_t> scalar(T v) {
  std::vector<uint8_t> out;
  put(out, v);
  return out;
}

template <typename T>
std::vector<uint8_t> numeric_array(GgufType elem, std::span<const T> v) {
  std::vector<uint8_t> out;
  out.reserve(gguf_detail::kArrayHeaderBytes + v.size_bytes());
  put<uint32_t>(out, static_cast<uint32_t>(elem));
  put<uint64_t>(out, v.size());
  put_bytes(out, v.data(), v.size_bytes());
  return out;
}

template <typename S>
std::vector<uint8_t> string_array(std::span<const S> v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(GgufType::string));
  put<uint64_t>(out, v.size());
  for (const S& s : v) put_string(out, s);
  return out;
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Buffers small writes (headers, padding) and passes large tensor data straight through.
class FdWriter {
 public:
  FdWriter(int fd, const std::string& path) : fd_(fd), path_(path) { buf_.reserve(kBufBytes); }
  Status put(const void* p, size_t n) {
    if (buf_.size() + n > kBufBytes) LOOM_TRY(flush());
    if (n >= kBufBytes) return write_all(p, n);
    put_bytes(buf_, p, n);
    return {};
  }
  Status flush() {
    LOOM_TRY(write_all(buf_.data(), buf_.size()));
    buf_.clear();
    return {};
  }

 private:
  static constexpr size_t kBufBytes = size_t{1} << 20;
  Status write_all(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd_, b, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return make_error(StatusCode::io_error, "{}: cannot write: {}", path_, std::strerror(errno));
      }
      b += w;
      n -= static_cast<size_t>(w);
    }
    return {};
  }
  int fd_;
  const std::string& path_;
  std::vector<uint8_t> buf_;
};

// A temporary file next to the target; removed unless committed by renaming it over the target.
struct TempFile {
  std::string path;
  int fd = -1;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

// ---- metadata ------------------------------------------------------------------------------------

Status GgufWriter::add_kv(std::string_view key, GgufType type, std::vector<uint8_t> value) {
  if (key.empty()) return make_error(StatusCode::invalid_argument, "gguf writer: empty key");
  if (key.size() > kGgufMaxKeyBytes)
    return make_error(StatusCode::invalid_argument, "gguf writer: key '{}' is {} bytes, more than {}",
                      escape(key), key.size(), kGgufMaxKeyBytes);
  if (keys_.contains(std::string(key)))
    return make_error(StatusCode::invalid_argument, "gguf writer: duplicate key '{}'", escape(key));
  if (key == "general.alignment") {
    if (type != GgufType::u32)
      return make_error(StatusCode::invalid_argument,
                        "gguf writer: key 'general.alignment' must be u32, not {}", gguf_type_name(type));
    const uint32_t a = gguf_detail::load<uint32_t>(value.data());
    if (!gguf_detail::is_power_of_two(a))
      return make_error(StatusCode::invalid_argument,
                        "gguf writer: key 'general.alignment': {} is not a nonzero power of two", a);
    alignment_ = a;
  }
  keys_.emplace(key);
  kvs_.push_back({std::string(key), type, std::move(value)});
  return {};
}

Status GgufWriter::add_u8(std::string_view key, uint8_t v) { return add_kv(key, GgufType::u8, scalar(v)); }
Status GgufWriter::add_i8(std::string_view key, int8_t v) { return add_kv(key, GgufType::i8, scalar(v)); }
Status GgufWriter::add_u16(std::string_view key, uint16_t v) { return add_kv(key, GgufType::u16, scalar(v)); }
Status GgufWriter::add_i16(std::string_view key, int16_t v) { return add_kv(key, GgufType::i16, scalar(v)); }
Status GgufWriter::add_u32(std::string_view key, uint32_t v) { return add_kv(key, GgufType::u32, scalar(v)); }
Status GgufWriter::add_i32(std::string_view key, int32_t v) { return add_kv(key, GgufType::i32, scalar(v)); }
Status GgufWriter::add_f32(std::string_view key, float v) { return add_kv(key, GgufType::f32, scalar(v)); }
Status GgufWriter::add_bool(std::string_view key, bool v) {
  return add_kv(key, GgufType::boolean, scalar<uint8_t>(v ? 1 : 0));
}
Status GgufWriter::add_string(std::string_view key, std::string_view v) {
  std::vector<uint8_t> out;
  put_string(out, v);
  return add_kv(key, GgufType::string, std::move(out));
}
Status GgufWriter::add_u64(std::string_view key, uint64_t v) { return add_kv(key, GgufType::u64, scalar(v)); }
Status GgufWriter::add_i64(std::string_view key, int64_t v) { return add_kv(key, GgufType::i64, scalar(v)); }
Status GgufWriter::add_f64(std::string_view key, double v) { return add_kv(key, GgufType::f64, scalar(v)); }

#define LOOM_GGUF_ARRAY(T, type)                                             \
  Status GgufWriter::add_array(std::string_view key, std::span<const T> v) { \
    return add_kv(key, GgufType::array, numeric_array(type, v));             \
  }
LOOM_GGUF_ARRAY(uint8_t, GgufType::u8)
LOOM_GGUF_ARRAY(int8_t, GgufType::i8)
LOOM_GGUF_ARRAY(uint16_t, GgufType::u16)
LOOM_GGUF_ARRAY(int16_t, GgufType::i16)
LOOM_GGUF_ARRAY(uint32_t, GgufType::u32)
LOOM_GGUF_ARRAY(int32_t, GgufType::i32)
LOOM_GGUF_ARRAY(float, GgufType::f32)
LOOM_GGUF_ARRAY(uint64_t, GgufType::u64)
LOOM_GGUF_ARRAY(int64_t, GgufType::i64)
LOOM_GGUF_ARRAY(double, GgufType::f64)
#undef LOOM_GGUF_ARRAY

Status GgufWriter::add_array(std::string_view key, std::span<const bool> v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(GgufType::boolean));
  put<uint64_t>(out, v.size());
  for (bool b : v) out.push_back(b ? 1 : 0);  // the file's bool is exactly 0 or 1
  return add_kv(key, GgufType::array, std::move(out));
}
Status GgufWriter::add_array(std::string_view key, std::span<const std::string> v) {
  return add_kv(key, GgufType::array, string_array(v));
}
Status GgufWriter::add_array(std::string_view key, std::span<const std::string_view> v) {
  return add_kv(key, GgufType::array, string_array(v));
}

Status GgufWriter::add_value(std::string_view key, const GgufValue& v) {
  // Values only come out of a validated GgufFile; a default-constructed one has no encoding.
  if (v.raw().empty())
    return make_error(StatusCode::invalid_argument, "gguf writer: key '{}': value has no encoding",
                      escape(key));
  return add_kv(key, v.type(), std::vector<uint8_t>(v.raw().begin(), v.raw().end()));
}

// ---- tensors -------------------------------------------------------------------------------------

Status GgufWriter::add_tensor_impl(std::string_view name, uint32_t ggml_type, std::span<const int64_t> ne,
                                   const void* data, TensorFill fill) {
  auto fail = [&](std::string what) {
    return make_error(StatusCode::invalid_argument, "gguf writer: tensor '{}': {}", escape(name), what);
  };
  if (name.empty()) return make_error(StatusCode::invalid_argument, "gguf writer: empty tensor name");
  if (name.size() > kGgufMaxTensorNameBytes)
    return fail(fmt::format("name is {} bytes, more than {}", name.size(), kGgufMaxTensorNameBytes));
  if (tensor_names_.contains(std::string(name))) return fail("duplicate tensor name");
  const GgmlTypeInfo* info = ggml_type_info(ggml_type);
  if (!info) return fail(fmt::format("unknown ggml type id {}", ggml_type));
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    return fail(fmt::format("{} dimensions, expected 1..{}", ne.size(), kMaxDims));
  int64_t n = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0) return fail(fmt::format("dimension {} is {}", d, ne[d]));
    if (__builtin_mul_overflow(n, ne[d], &n)) return fail("element count overflows 64 bits");
  }
  if (ne[0] % info->block_size != 0)
    return fail(
        fmt::format("ne0 = {} is not a multiple of {}'s block size {}", ne[0], info->name, info->block_size));
  uint64_t size = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n / info->block_size), uint64_t{info->type_size}, &size))
    return fail("byte size overflows 64 bits");
  if (!data && !fill) return fail("no data");
  tensor_names_.emplace(name);
  tensors_.push_back({std::string(name), ggml_type, std::vector<int64_t>(ne.begin(), ne.end()), size, data,
                      std::move(fill)});
  return {};
}

Status GgufWriter::add_tensor(std::string_view name, DType type, std::span<const int64_t> ne,
                              const void* data) {
  if (!data)
    return make_error(StatusCode::invalid_argument, "gguf writer: tensor '{}': null data", escape(name));
  return add_tensor_impl(name, dtype_traits(type).gguf_id, ne, data, nullptr);
}

Status GgufWriter::add_tensor(std::string_view name, DType type, std::span<const int64_t> ne,
                              TensorFill fill) {
  if (!fill)
    return make_error(StatusCode::invalid_argument, "gguf writer: tensor '{}': empty fill function",
                      escape(name));
  return add_tensor_impl(name, dtype_traits(type).gguf_id, ne, nullptr, std::move(fill));
}

Status GgufWriter::add_tensor_ggml(std::string_view name, uint32_t ggml_type, std::span<const int64_t> ne,
                                   const void* data) {
  if (!data)
    return make_error(StatusCode::invalid_argument, "gguf writer: tensor '{}': null data", escape(name));
  return add_tensor_impl(name, ggml_type, ne, data, nullptr);
}

// ---- output --------------------------------------------------------------------------------------

Status GgufWriter::emit(const ByteSink& sink) const {
  uint64_t written = 0;
  auto out = [&](const void* p, size_t n) {
    written += n;
    return sink(p, n);
  };
  auto pad_to = [&](uint64_t pos) -> Status {
    static constexpr uint8_t kZeros[256] = {};
    while (written < pos) LOOM_TRY(out(kZeros, std::min<uint64_t>(sizeof(kZeros), pos - written)));
    return {};
  };
  std::vector<uint8_t> head;
  put_bytes(head, gguf_detail::kMagic, 4);
  put<uint32_t>(head, gguf_detail::kWriteVersion);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size());
  for (const Kv& kv : kvs_) {
    put_string(head, kv.key);
    put<uint32_t>(head, static_cast<uint32_t>(kv.type));
    put_bytes(head, kv.value.data(), kv.value.size());
  }
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors_.size());
  uint64_t data_size = 0;
  for (const PendingTensor& t : tensors_) {
    const uint64_t offset = align_up(data_size, alignment_);
    offsets.push_back(offset);
    data_size = offset + t.size;
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, t.ggml_type);
    put<uint64_t>(head, offset);
  }
  LOOM_TRY(out(head.data(), head.size()));
  // A file without tensors ends after its metadata, as vocab-only files do: padding it would cost
  // up to `alignment` bytes (2^31 is valid) for nothing.
  if (tensors_.empty()) return {};
  const uint64_t data_offset = align_up(written, alignment_);
  std::vector<uint8_t> scratch;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    LOOM_TRY(pad_to(data_offset + offsets[i]));
    if (t.data) {
      LOOM_TRY(out(t.data, t.size));
      continue;
    }
    try {
      scratch.assign(t.size, 0);
    } catch (const std::bad_alloc&) {
      return make_error(StatusCode::out_of_memory, "gguf writer: tensor '{}': cannot allocate {} bytes",
                        escape(t.name), t.size);
    }
    LOOM_TRY(t.fill(std::span<uint8_t>(scratch.data(), scratch.size())));
    LOOM_TRY(out(scratch.data(), scratch.size()));
  }
  return pad_to(align_up(written, alignment_));
}

Result<std::vector<uint8_t>> GgufWriter::serialize() const {
  std::vector<uint8_t> bytes;
  LOOM_TRY(emit([&](const void* p, size_t n) {
    put_bytes(bytes, p, n);
    return Status{};
  }));
  return bytes;
}

Status GgufWriter::write(const std::string& path) const {
  TempFile tmp;
  std::string pattern = path + ".tmp.XXXXXX";
  tmp.fd = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (tmp.fd < 0)
    return make_error(StatusCode::io_error, "{}: cannot create a temporary file next to it: {}", path,
                      std::strerror(errno));
  tmp.path = pattern;
  FdWriter file(tmp.fd, tmp.path);
  LOOM_TRY(emit([&](const void* p, size_t n) { return file.put(p, n); }));
  LOOM_TRY(file.flush());
  // mkstemp creates 0600; a model file is meant to be shared like any other output.
  if (::fchmod(tmp.fd, 0644) != 0 || ::fsync(tmp.fd) != 0)
    return make_error(StatusCode::io_error, "{}: cannot sync: {}", tmp.path, std::strerror(errno));
  const int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0)
    return make_error(StatusCode::io_error, "{}: cannot close: {}", tmp.path, std::strerror(errno));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    return make_error(StatusCode::io_error, "{}: cannot rename {} over it: {}", path, tmp.path,
                      std::strerror(errno));
  tmp.committed = true;
  return {};
}

}  // namespace loom
