// GGUF reader: maps a file and validates every field before anything uses it.
//
// Untrusted counts and lengths are always compared with the bytes left in the file before they
// drive a loop or an allocation, so work and memory stay proportional to the file's size.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "gguf_internal.h"

namespace loom {

using gguf_detail::escape;
using gguf_detail::load;

// ---- MappedFile ----------------------------------------------------------------------------------

namespace {
// Closes a descriptor on scope exit; the mapping keeps the file alive on its own.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

namespace {
// Only regular files can be mapped; the type is checked before open(), because opening a FIFO for
// reading blocks until a writer comes (`loom info -m fifo` hung), and again on the descriptor (the
// path may have changed in between; O_NONBLOCK keeps that open() from blocking).
Status check_regular_file(const std::string& path, const struct stat& st) {
  if (S_ISREG(st.st_mode)) return {};
  const char* what = S_ISDIR(st.st_mode)                          ? "a directory"
                     : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                     : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                  : "an unusual file type";
  return make_error(StatusCode::io_error, "{}: not a regular file ({})", path, what);
}
}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return make_error(StatusCode::io_error, "{}: cannot open: {}", path, std::strerror(errno));
  LOOM_TRY(check_regular_file(path, st));
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (fd.fd < 0) return make_error(StatusCode::io_error, "{}: cannot open: {}", path, std::strerror(errno));
  if (::fstat(fd.fd, &st) != 0)
    return make_error(StatusCode::io_error, "{}: cannot stat: {}", path, std::strerror(errno));
  LOOM_TRY(check_regular_file(path, st));
  MappedFile m;
  if (st.st_size == 0) return m;  // mmap rejects length 0
  void* addr = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED)
    return make_error(StatusCode::io_error, "{}: cannot map {} bytes: {}", path, st.st_size,
                      std::strerror(errno));
  m.addr_ = addr;
  m.size_ = static_cast<size_t>(st.st_size);
  return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept : addr_(other.addr_), size_(other.size_) {
  other.addr_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    addr_ = other.addr_;
    size_ = other.size_;
    other.addr_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (addr_) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

// ---- parser --------------------------------------------------------------------------------------

namespace {
// Smallest encodings, used to reject impossible counts before looping or reserving:
// a KV is a key (8-byte length + at least 1 byte), a type id and at least a 1-byte value;
// a tensor info is a name (8 + at least 1), n_dims, one dim, a type id and an offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
}  // namespace

// Walks the bytes once, filling a GgufFile; every error names the file and what it was reading.
class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, GgufFile& out) : b_(bytes), f_(out) {}

  Status run() {
    LOOM_TRY(parse_header());
    for (uint64_t i = 0; i < kv_count_; ++i) LOOM_TRY(parse_kv(i));
    LOOM_TRY(read_alignment());
    for (uint64_t i = 0; i < tensor_count_; ++i) LOOM_TRY(parse_tensor_info(i));
    return place_tensors();
  }

 private:
  size_t left() const { return b_.size() - pos_; }

  Status error(std::string_view where, std::string_view what) const {
    if (where.empty()) return make_error(StatusCode::format_error, "{}: {}", f_.name_, what);
    return make_error(StatusCode::format_error, "{}: {}: {}", f_.name_, where, what);
  }
  std::string truncated(std::string_view field, size_t need) const {
    return fmt::format("truncated: {} at offset {} needs {} bytes, the file has {} left", field, pos_, need,
                       left());
  }

  // Fixed-size reads; a false return means the file ends first.
  template <typename T>
  bool read(T& v) {
    if (left() < sizeof(T)) return false;
    v = load<T>(b_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }

  // A GGUF string whose length is at most `max_len`; `where` and `field` describe it for errors.
  Status read_string(std::string_view where, std::string_view field, uint64_t max_len, std::string_view& s) {
    uint64_t len = 0;
    if (!read(len)) return error(where, truncated(fmt::format("{} length", field), 8));
    if (len > max_len)
      return error(where, fmt::format("{} length {} exceeds the limit of {}", field, len, max_len));
    if (len > left())
      return error(where,
                   fmt::format("{} length {} exceeds the {} bytes left in the file", field, len, left()));
    s = std::string_view(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return {};
  }

  Status parse_header() {
    if (b_.size() < 4)
      return error("", fmt::format("file is {} bytes, too short for a GGUF header ({} bytes)", b_.size(),
                                   gguf_detail::kHeaderBytes));
    if (std::memcmp(b_.data(), gguf_detail::kMagic, 4) != 0)
      return error("", fmt::format("not a GGUF file: magic is \"{}\", expected \"GGUF\"",
                                   escape(std::string_view(reinterpret_cast<const char*>(b_.data()), 4))));
    pos_ = 4;
    uint32_t version = 0;
    if (!read(version)) return error("header", truncated("version", 4));
    if (version == 1)
      return error("", "GGUF version 1 is not supported (it stores 32-bit counts); convert the model again");
    if (version != 2 && version != 3) {
      if ((version & 0xffffu) == 0 && __builtin_bswap32(version) <= 3)
        return error("", fmt::format("GGUF version field is 0x{:08x}: the file looks big-endian, Loom reads "
                                     "little-endian files only",
                                     version));
      return error("", fmt::format("unsupported GGUF version {} (Loom reads versions 2 and 3)", version));
    }
    f_.version_ = version;
    if (!read(tensor_count_)) return error("header", truncated("tensor_count", 8));
    if (!read(kv_count_)) return error("header", truncated("metadata_kv_count", 8));
    // Reject counts the rest of the file cannot possibly hold before reserving anything.
    if (kv_count_ > left() / kMinKvBytes)
      return error("header", fmt::format("metadata_kv_count {} is impossible: the {} bytes after the header "
                                         "hold at most {} key-values",
                                         kv_count_, left(), left() / kMinKvBytes));
    const uint64_t after_kvs = left() - kv_count_ * kMinKvBytes;
    if (tensor_count_ > after_kvs / kMinTensorInfoBytes)
      return error("header", fmt::format("tensor_count {} is impossible: the {} bytes after the header hold "
                                         "{} key-values and at most {} tensor infos",
                                         tensor_count_, left(), kv_count_, after_kvs / kMinTensorInfoBytes));
    f_.kvs_.reserve(kv_count_);
    f_.kv_index_.reserve(kv_count_);
    f_.tensors_.reserve(tensor_count_);
    f_.tensor_index_.reserve(tensor_count_);
    return {};
  }

  // Validates one value of `type` at the cursor and moves past it. The message says what is wrong
  // relative to the value; the caller adds the file and key.
  Status skip_value(GgufType type, int depth) {
    auto bad = [](std::string what) { return Status(StatusCode::format_error, std::move(what)); };
    if (const size_t size = gguf_detail::scalar_size(type); size != 0) {
      if (left() < size) return bad(truncated(fmt::format("{} value", gguf_type_name(type)), size));
      if (type == GgufType::boolean && b_[pos_] > 1)
        return bad(fmt::format("bool value {} at offset {} is neither 0 nor 1", b_[pos_], pos_));
      pos_ += size;
      return {};
    }
    if (type == GgufType::string) {
      uint64_t len = 0;
      if (!read(len)) return bad(truncated("string length", 8));
      if (len > left())
        return bad(fmt::format("string length {} exceeds the {} bytes left in the file", len, left()));
      pos_ += len;
      return {};
    }
    // array
    if (depth >= kGgufMaxArrayDepth)
      return bad(fmt::format("arrays nest deeper than {} levels", kGgufMaxArrayDepth));
    uint32_t elem_id = 0;
    uint64_t count = 0;
    if (!read(elem_id)) return bad(truncated("array element type", 4));
    if (!gguf_detail::is_valid_type(elem_id))
      return bad(fmt::format("unknown array element type {}", elem_id));
    if (!read(count)) return bad(truncated("array length", 8));
    const auto elem = static_cast<GgufType>(elem_id);
    const size_t elem_size = gguf_detail::scalar_size(elem);
    // Smallest element encoding: its fixed size, a string's length field, an array's header.
    const size_t min_elem = elem_size                  ? elem_size
                            : elem == GgufType::string ? gguf_detail::kStringHeaderBytes
                                                       : gguf_detail::kArrayHeaderBytes;
    if (count > left() / min_elem)
      return bad(fmt::format("array length {} of {} exceeds the {} bytes left in the file", count,
                             gguf_type_name(elem), left()));
    if (elem_size != 0 && elem != GgufType::boolean) {
      pos_ += count * elem_size;
      return {};
    }
    for (uint64_t i = 0; i < count; ++i) {
      if (Status s = skip_value(elem, depth + 1); !s.ok()) {
        // Nested positions read as one path: "element [2][0]: ...".
        constexpr std::string_view kNested = "element [";
        const std::string& inner = s.message();
        if (inner.starts_with(kNested))
          return bad(fmt::format("element [{}][{}", i, inner.substr(kNested.size())));
        return bad(fmt::format("element [{}]: {}", i, inner));
      }
    }
    return {};
  }

  Status parse_kv(uint64_t index) {
    const std::string where = fmt::format("key-value #{}", index);
    std::string_view key;
    LOOM_TRY(read_string(where, "key", kGgufMaxKeyBytes, key));
    if (key.empty()) return error(where, "empty key");
    const std::string key_where = fmt::format("key '{}'", escape(key));
    uint32_t type_id = 0;
    if (!read(type_id)) return error(key_where, truncated("value type", 4));
    if (!gguf_detail::is_valid_type(type_id))
      return error(key_where, fmt::format("unknown value type {}", type_id));
    const size_t start = pos_;
    if (Status s = skip_value(static_cast<GgufType>(type_id), 0); !s.ok())
      return error(key_where, s.message());
    if (const auto it = f_.kv_index_.find(key); it != f_.kv_index_.end())
      return error(key_where, fmt::format("duplicate key (key-values #{} and #{})", it->second, index));
    f_.kv_index_.emplace(key, f_.kvs_.size());
    f_.kvs_.push_back({key, GgufValue(static_cast<GgufType>(type_id), b_.subspan(start, pos_ - start))});
    return {};
  }

  Status read_alignment() {
    const GgufValue* v = f_.find("general.alignment");
    if (!v) return {};
    if (v->type() != GgufType::u32)
      return error("key 'general.alignment'", fmt::format("has type {}, expected u32", v->type_string()));
    const uint32_t a = load<uint32_t>(v->raw().data());
    if (!gguf_detail::is_power_of_two(a))
      return error("key 'general.alignment'", fmt::format("{} is not a nonzero power of two", a));
    f_.alignment_ = a;
    return {};
  }

  Status parse_tensor_info(uint64_t index) {
    std::string where = fmt::format("tensor #{}", index);
    GgufTensorInfo t;
    LOOM_TRY(read_string(where, "name", kGgufMaxTensorNameBytes, t.name));
    if (t.name.empty()) return error(where, "empty name");
    where = fmt::format("tensor '{}'", escape(t.name));
    if (const auto it = f_.tensor_index_.find(t.name); it != f_.tensor_index_.end())
      return error(where, fmt::format("duplicate tensor name (tensors #{} and #{})", it->second, index));

    uint32_t n_dims = 0;
    if (!read(n_dims)) return error(where, truncated("n_dims", 4));
    if (n_dims < 1 || n_dims > static_cast<uint32_t>(kMaxDims))
      return error(where, fmt::format("n_dims {} is outside 1..{}", n_dims, kMaxDims));
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (!read(dim)) return error(where, truncated(fmt::format("dimension {}", d), 8));
      if (dim == 0) return error(where, fmt::format("dimension {} is 0", d));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return error(where, fmt::format("dimension {} is {}, larger than 2^63-1", d, dim));
      t.ne[d] = static_cast<int64_t>(dim);
    }
    if (!read(t.ggml_type)) return error(where, truncated("type", 4));
    t.type_info = ggml_type_info(t.ggml_type);
    if (!t.type_info) return error(where, fmt::format("unknown ggml type id {}", t.ggml_type));
    t.dtype = dtype_from_gguf(t.ggml_type);
    if (!read(t.offset)) return error(where, truncated("offset", 8));

    const int64_t block = t.type_info->block_size;
    if (t.ne[0] % block != 0)
      return error(where, fmt::format("ne0 = {} is not a multiple of {}'s block size {}", t.ne[0],
                                      t.type_info->name, block));
    int64_t n = 1;
    for (int d = 0; d < kMaxDims; ++d)
      if (__builtin_mul_overflow(n, t.ne[d], &n))
        return error(where, fmt::format("element count of shape {} overflows 64 bits", shape_string(t.ne)));
    if (__builtin_mul_overflow(static_cast<uint64_t>(n / block), uint64_t{t.type_info->type_size}, &t.size))
      return error(where, fmt::format("byte size of shape {} in {} overflows 64 bits", shape_string(t.ne),
                                      t.type_info->name));
    // The data section starts aligned, so an aligned offset is also aligned in the file (and in
    // the page-aligned mapping).
    if (t.offset % f_.alignment_ != 0)
      return error(where,
                   fmt::format("offset {} is not a multiple of the alignment {}", t.offset, f_.alignment_));

    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(t);
    return {};
  }

  Status place_tensors() {
    const uint64_t a = f_.alignment_;
    // pos_ <= file size < 2^63, so rounding up cannot overflow.
    f_.data_offset_ = (pos_ + a - 1) / a * a;
    const uint64_t file_size = b_.size();
    for (GgufTensorInfo& t : f_.tensors_) {
      uint64_t begin = 0, end = 0;
      if (__builtin_add_overflow(f_.data_offset_, t.offset, &begin) ||
          __builtin_add_overflow(begin, t.size, &end) || end > file_size)
        return error(fmt::format("tensor '{}'", escape(t.name)),
                     fmt::format("data offset {} + size {} (from file offset {}) exceeds file size {}",
                                 t.offset, t.size, f_.data_offset_, file_size));
      t.data = b_.data() + begin;
    }
    // Overlapping tensors would let a small file describe far more tensor bytes than it holds
    // (and make a loader allocate that much); no GGUF writer produces them.
    std::vector<size_t> order(f_.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return f_.tensors_[x].offset < f_.tensors_[y].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensorInfo& prev = f_.tensors_[order[i - 1]];
      const GgufTensorInfo& t = f_.tensors_[order[i]];
      if (t.offset < prev.offset + prev.size)
        return error(fmt::format("tensor '{}'", escape(t.name)),
                     fmt::format("data at offset {} overlaps tensor '{}' (offset {}, size {})", t.offset,
                                 escape(prev.name), prev.offset, prev.size));
    }
    return {};
  }

  std::span<const uint8_t> b_;
  GgufFile& f_;
  size_t pos_ = 0;
  uint64_t kv_count_ = 0;
  uint64_t tensor_count_ = 0;
};

// ---- GgufFile ------------------------------------------------------------------------------------

Result<GgufFile> GgufFile::open(const std::string& path) {
  Result<MappedFile> map = MappedFile::open(path);
  if (!map.ok()) return map.status();
  GgufFile f;
  f.name_ = path;
  f.bytes_ = std::span<const uint8_t>(map->data(), map->size());
  f.map_ = std::move(map).value();
  LOOM_TRY(GgufParser(f.bytes_, f).run());
  return f;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  GgufFile f;
  f.name_ = std::move(name);
  f.bytes_ = bytes;
  LOOM_TRY(GgufParser(f.bytes_, f).run());
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

Status GgufFile::key_error(std::string_view key, StatusCode code, std::string_view what) const {
  return make_error(code, "{}: key '{}' {}", name_, escape(key), what);
}

Result<const GgufValue*> GgufFile::require(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return key_error(key, StatusCode::format_error, "is missing");
  return v;
}

Result<const GgufValue*> GgufFile::require_array(std::string_view key) const {
  Result<const GgufValue*> v = require(key);
  if (v.ok() && !(*v)->is_array())
    return key_error(key, StatusCode::type_mismatch,
                     fmt::format("has type {}, expected an array", (*v)->type_string()));
  return v;
}

namespace {
// Integer getters share this: any integer type, range-checked into T.
template <typename T>
Result<T> integer_value(const GgufFile& f, const GgufValue& v, std::string_view key, const char* want) {
  auto fail = [&](StatusCode c, std::string what) {
    return make_error(c, "{}: key '{}' {}", f.name(), escape(key), what);
  };
  if (!v.is_integer())
    return fail(StatusCode::type_mismatch, fmt::format("has type {}, expected {}", v.type_string(), want));
  if constexpr (std::is_signed_v<T>) {
    const std::optional<int64_t> i = v.as_i64();
    if (i && *i >= std::numeric_limits<T>::min() && *i <= std::numeric_limits<T>::max())
      return static_cast<T>(*i);
  } else {
    const std::optional<uint64_t> u = v.as_u64();
    if (u && *u <= std::numeric_limits<T>::max()) return static_cast<T>(*u);
  }
  return fail(StatusCode::invalid_argument, fmt::format("= {} does not fit in {}", v.format(), want));
}
}  // namespace

#define LOOM_GGUF_INT_GETTER(T, fn, want)              \
  Result<T> GgufFile::fn(std::string_view key) const { \
    Result<const GgufValue*> v = require(key);         \
    if (!v.ok()) return v.status();                    \
    return integer_value<T>(*this, **v, key, want);    \
  }
LOOM_GGUF_INT_GETTER(uint32_t, get_u32, "u32")
LOOM_GGUF_INT_GETTER(int32_t, get_i32, "i32")
LOOM_GGUF_INT_GETTER(uint64_t, get_u64, "u64")
LOOM_GGUF_INT_GETTER(int64_t, get_i64, "i64")
#undef LOOM_GGUF_INT_GETTER

Result<float> GgufFile::get_f32(std::string_view key) const {
  Result<const GgufValue*> v = require(key);
  if (!v.ok()) return v.status();
  const std::optional<double> d = (*v)->as_f64();
  if (!d)
    return key_error(key, StatusCode::type_mismatch,
                     fmt::format("has type {}, expected f32", (*v)->type_string()));
  return static_cast<float>(*d);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  Result<const GgufValue*> v = require(key);
  if (!v.ok()) return v.status();
  const std::optional<bool> b = (*v)->as_bool();
  if (!b)
    return key_error(key, StatusCode::type_mismatch,
                     fmt::format("has type {}, expected bool", (*v)->type_string()));
  return *b;
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  Result<const GgufValue*> v = require(key);
  if (!v.ok()) return v.status();
  const std::optional<std::string_view> s = (*v)->as_string();
  if (!s)
    return key_error(key, StatusCode::type_mismatch,
                     fmt::format("has type {}, expected string", (*v)->type_string()));
  return *s;
}

Result<uint32_t> GgufFile::get_u32_or(std::string_view key, uint32_t fallback) const {
  return has(key) ? get_u32(key) : Result<uint32_t>(fallback);
}
Result<float> GgufFile::get_f32_or(std::string_view key, float fallback) const {
  return has(key) ? get_f32(key) : Result<float>(fallback);
}
Result<bool> GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : Result<bool>(fallback);
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  Result<const GgufValue*> v = require_array(key);
  if (!v.ok()) return v.status();
  if ((*v)->array_type() != GgufType::string)
    return key_error(key, StatusCode::type_mismatch,
                     fmt::format("has type {}, expected array[string]", (*v)->type_string()));
  std::vector<std::string_view> out;
  out.reserve((*v)->array_size());  // validated against the file's size
  const uint8_t* p = (*v)->raw().data() + gguf_detail::kArrayHeaderBytes;
  for (uint64_t i = 0; i < (*v)->array_size(); ++i) {
    const uint64_t len = load<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p) + gguf_detail::kStringHeaderBytes, len);
    p += gguf_detail::kStringHeaderBytes + len;
  }
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  Result<const GgufValue*> v = require_array(key);
  if (!v.ok()) return v.status();
  const std::vector<GgufValue> elems = (*v)->elements();
  std::vector<int64_t> out;
  out.reserve(elems.size());
  for (size_t i = 0; i < elems.size(); ++i) {
    if (!elems[i].is_integer())
      return key_error(key, StatusCode::type_mismatch,
                       fmt::format("has type {}, expected an array of integers", (*v)->type_string()));
    const std::optional<int64_t> x = elems[i].as_i64();
    if (!x)
      return key_error(key, StatusCode::invalid_argument,
                       fmt::format("element {} = {} does not fit in i64", i, elems[i].format()));
    out.push_back(*x);
  }
  return out;
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  Result<const GgufValue*> v = require_array(key);
  if (!v.ok()) return v.status();
  const GgufType et = (*v)->array_type();
  if (et != GgufType::f32 && et != GgufType::f64)
    return key_error(key, StatusCode::type_mismatch,
                     fmt::format("has type {}, expected an array of f32", (*v)->type_string()));
  const std::vector<GgufValue> elems = (*v)->elements();
  std::vector<float> out;
  out.reserve(elems.size());
  for (const GgufValue& e : elems) out.push_back(static_cast<float>(*e.as_f64()));
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<const GgufTensorInfo*> GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) return make_error(StatusCode::format_error, "{}: tensor '{}' is missing", name_, escape(name));
  return t;
}

Result<DType> GgufFile::dtype_of(const GgufTensorInfo& t) const {
  if (t.dtype) return *t.dtype;
  return make_error(StatusCode::unsupported, "{}: tensor '{}': type {} (ggml id {}) is not supported by Loom",
                    name_, escape(t.name), t.type_info ? t.type_info->name : "unknown", t.ggml_type);
}

}  // namespace loom
