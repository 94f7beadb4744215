// GGUF, the model file format: a validating reader over a read-only memory map and an atomic writer.
// Files are GGUF version 2 or 3, little-endian. The reader checks every count, length, type id,
// shape and offset against the file before anything uses them, so a malformed or hostile file
// gives a Status naming the file and the key or tensor, never a crash or a huge allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "loom/dtype.h"
#include "loom/status.h"
#include "loom/tensor.h"

namespace loom {

/// Metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
inline constexpr uint32_t kGgufTypeCount = 13;
/// "u32", "string", "array"; "invalid" for ids outside the enum.
const char* gguf_type_name(GgufType t);

inline constexpr uint32_t kGgufDefaultAlignment = 32;
/// Limits from the GGUF spec (tensor names, keys) and Loom's own (array nesting).
inline constexpr size_t kGgufMaxTensorNameBytes = 64;
inline constexpr size_t kGgufMaxKeyBytes = 65535;
inline constexpr int kGgufMaxArrayDepth = 8;

/// Layout of a ggml tensor type, known for every type GGUF files may hold, including those Loom
/// cannot compute with (so their sizes can still be validated and copied).
struct GgmlTypeInfo {
  const char* name;     ///< "q5_K"
  uint32_t id;          ///< ggml_type value in files
  uint32_t block_size;  ///< elements per block
  uint32_t type_size;   ///< bytes per block
};
/// Facts about ggml type `id`; nullptr when the id is unknown or retired from GGUF files.
const GgmlTypeInfo* ggml_type_info(uint32_t id);

/// A whole file mapped read-only; unmapped on destruction. Move-only.
class MappedFile {
 public:
  /// Maps `path`. An empty file maps to data() == nullptr, size() == 0.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  size_t size() const { return size_; }

 private:
  void reset();
  void* addr_ = nullptr;
  size_t size_ = 0;
};

/// A metadata value: a view of its encoding inside the file's bytes, valid while the GgufFile
/// lives. Values come only from a GgufFile, which validated them, so accessors trust the bytes.
class GgufValue {
 public:
  GgufValue() = default;
  GgufType type() const { return type_; }
  /// The value as encoded in the file, after its type id (strings: length + bytes; arrays:
  /// element type + count + elements).
  std::span<const uint8_t> raw() const { return raw_; }

  bool is_integer() const;  ///< u8..i64 (not bool)
  bool is_float() const;    ///< f32 or f64
  bool is_array() const { return type_ == GgufType::array; }

  /// Integers that fit the target; nullopt for other types or values out of range.
  std::optional<uint64_t> as_u64() const;
  std::optional<int64_t> as_i64() const;
  /// f32 or f64 (integers are not converted: a float key stored as an integer is a type error).
  std::optional<double> as_f64() const;
  std::optional<bool> as_bool() const;
  std::optional<std::string_view> as_string() const;

  /// Arrays: element type and count (for other types: GgufType::u8 and 0).
  GgufType array_type() const;
  uint64_t array_size() const;
  /// The elements of an array (empty for other types); walks the array once.
  std::vector<GgufValue> elements() const;

  /// "u32", "array[string]", "array[array]".
  std::string type_string() const;
  /// Human-readable value for `loom info`: numbers, quoted strings (escaped, long ones cut), arrays
  /// as "[a, b, ... (N elements)]" showing at most `max_elements`.
  std::string format(size_t max_elements = 8) const;

 private:
  friend class GgufParser;
  GgufValue(GgufType type, std::span<const uint8_t> raw) : type_(type), raw_(raw) {}
  std::vector<GgufValue> first_elements(uint64_t limit) const;
  GgufType type_ = GgufType::u8;
  std::span<const uint8_t> raw_;
};

/// One metadata key-value pair, in file order.
struct GgufKV {
  std::string_view key;
  GgufValue value;
};

/// A tensor's description and its bytes inside the mapping.
struct GgufTensorInfo {
  std::string_view name;
  uint32_t ggml_type = 0;                   ///< type id as stored
  const GgmlTypeInfo* type_info = nullptr;  ///< never null in a parsed file
  std::optional<DType> dtype;               ///< nullopt when Loom lacks the type (see dtype_of)
  int n_dims = 0;                           ///< 1..4 as stored
  Shape ne{1, 1, 1, 1};                     ///< dims beyond n_dims are 1
  uint64_t offset = 0;                      ///< from the start of the data section
  uint64_t size = 0;                        ///< bytes
  const uint8_t* data = nullptr;            ///< first byte, inside the file's bytes

  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

/// A parsed and validated GGUF file: besides the format's own rules, keys and tensor names are
/// unique, arrays nest at most kGgufMaxArrayDepth deep, and tensor data ranges lie inside the file
/// and do not overlap (so a small file cannot describe more tensor bytes than it holds).
/// Move-only; views (keys, strings, tensor data) stay valid while it lives, also across moves.
class GgufFile {
 public:
  /// Maps `path` read-only and validates it; errors name the path.
  static Result<GgufFile> open(const std::string& path);
  /// Validates bytes held by the caller, which must outlive the result (fuzzing, tests, embedded
  /// files). `name` stands for the file in error messages.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, std::string name = "<memory>");

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile() = default;

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  /// Where the data section starts; it may equal or pass the file size when there are no tensors.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }
  std::span<const uint8_t> bytes() const { return bytes_; }

  // ---- metadata ----
  std::span<const GgufKV> kvs() const { return kvs_; }
  /// Any value by key, nullptr when absent.
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  /// Typed getters: a missing key is a format_error, a wrong type a type_mismatch, an integer that
  /// does not fit the target an invalid_argument; all name the file and key. Integer getters
  /// accept any integer type whose value fits; get_f32 accepts f32 and f64.
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  /// As above, but `fallback` when the key is absent (a present key of the wrong type still fails).
  Result<uint32_t> get_u32_or(std::string_view key, uint32_t fallback) const;
  Result<float> get_f32_or(std::string_view key, float fallback) const;
  Result<bool> get_bool_or(std::string_view key, bool fallback) const;

  /// Arrays: strings; integers of any integer element type (each must fit int64); floats (f32/f64).
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;

  // ---- tensors ----
  std::span<const GgufTensorInfo> tensors() const { return tensors_; }
  /// nullptr when absent.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  /// format_error naming the file and tensor when absent.
  Result<const GgufTensorInfo*> tensor(std::string_view name) const;
  /// The tensor's DType, or `unsupported` naming the file, tensor and ggml type when Loom lacks it.
  Result<DType> dtype_of(const GgufTensorInfo& t) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  Status key_error(std::string_view key, StatusCode code, std::string_view what) const;
  Result<const GgufValue*> require(std::string_view key) const;
  Result<const GgufValue*> require_array(std::string_view key) const;

  std::string name_;
  MappedFile map_;  // empty for parse()
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

/// Builds a GGUF (version 3) file: metadata in the order added, then tensor infos, then tensor data,
/// each tensor at a multiple of the alignment (`general.alignment` when added as a u32, else 32).
/// Every add_* validates its input (keys unique and non-empty, names unique and at most 64 bytes,
/// 1..4 positive dims, ne0 a multiple of the block size) and fails without changing the writer.
class GgufWriter {
 public:
  /// Fills exactly dst.size() bytes of a tensor's data when the file is written.
  using TensorFill = std::function<Status(std::span<uint8_t> dst)>;

  GgufWriter() = default;

  Status add_u8(std::string_view key, uint8_t v);
  Status add_i8(std::string_view key, int8_t v);
  Status add_u16(std::string_view key, uint16_t v);
  Status add_i16(std::string_view key, int16_t v);
  Status add_u32(std::string_view key, uint32_t v);
  Status add_i32(std::string_view key, int32_t v);
  Status add_f32(std::string_view key, float v);
  Status add_bool(std::string_view key, bool v);
  Status add_string(std::string_view key, std::string_view v);
  Status add_u64(std::string_view key, uint64_t v);
  Status add_i64(std::string_view key, int64_t v);
  Status add_f64(std::string_view key, double v);

  Status add_array(std::string_view key, std::span<const uint8_t> v);
  Status add_array(std::string_view key, std::span<const int8_t> v);
  Status add_array(std::string_view key, std::span<const uint16_t> v);
  Status add_array(std::string_view key, std::span<const int16_t> v);
  Status add_array(std::string_view key, std::span<const uint32_t> v);
  Status add_array(std::string_view key, std::span<const int32_t> v);
  Status add_array(std::string_view key, std::span<const float> v);
  Status add_array(std::string_view key, std::span<const bool> v);
  Status add_array(std::string_view key, std::span<const uint64_t> v);
  Status add_array(std::string_view key, std::span<const int64_t> v);
  Status add_array(std::string_view key, std::span<const double> v);
  Status add_array(std::string_view key, std::span<const std::string> v);
  Status add_array(std::string_view key, std::span<const std::string_view> v);
  /// Copies any value, nested arrays included (e.g. from another file's kvs()).
  Status add_value(std::string_view key, const GgufValue& v);

  /// A tensor whose `data` (packed, ggml layout) stays valid until write()/serialize() returns.
  Status add_tensor(std::string_view name, DType type, std::span<const int64_t> ne, const void* data);
  /// A tensor whose bytes `fill` produces when the file is written.
  Status add_tensor(std::string_view name, DType type, std::span<const int64_t> ne, TensorFill fill);
  /// By raw ggml type id, for types Loom cannot compute with (copying them, tests).
  Status add_tensor_ggml(std::string_view name, uint32_t ggml_type, std::span<const int64_t> ne,
                         const void* data);

  uint32_t alignment() const { return alignment_; }
  size_t kv_count() const { return kvs_.size(); }
  size_t tensor_count() const { return tensors_.size(); }

  /// The whole file in memory.
  Result<std::vector<uint8_t>> serialize() const;
  /// Writes a temporary file next to `path`, syncs it and renames it over `path`, so readers never
  /// see a partial file; on failure the temporary is removed and `path` is untouched.
  Status write(const std::string& path) const;

 private:
  struct Kv {
    std::string key;
    GgufType type;
    std::vector<uint8_t> value;  // encoding after the type id
  };
  struct PendingTensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> ne;
    uint64_t size;
    const void* data;
    TensorFill fill;
  };
  using ByteSink = std::function<Status(const void* p, size_t n)>;
  Status add_kv(std::string_view key, GgufType type, std::vector<uint8_t> value);
  Status add_tensor_impl(std::string_view name, uint32_t ggml_type, std::span<const int64_t> ne,
                         const void* data, TensorFill fill);
  Status emit(const ByteSink& sink) const;

  std::vector<Kv> kvs_;
  std::unordered_set<std::string> keys_;
  std::vector<PendingTensor> tensors_;
  std::unordered_set<std::string> tensor_names_;
  uint32_t alignment_ = kGgufDefaultAlignment;
};

/// A key, name or string value fit for printing: bytes that are not printable ASCII appear as \xNN
/// and text longer than `max_bytes` is cut with "...".
std::string gguf_escape(std::string_view s, size_t max_bytes = 96);

}  // namespace loom
