// GGUF type tables and the metadata value accessors.
#include <array>
#include <limits>

#include <fmt/format.h>

#include "gguf_internal.h"

namespace loom {

using gguf_detail::load;

namespace {

// Block layouts of every type a GGUF file may name (ggml_type numbering). Retired ids (4, 5,
// 31-33, 36-38: removed from files) are absent, so files using them fail as unknown types.
constexpr std::array<GgmlTypeInfo, 32> kGgmlTypes = {{
    {"f32", 0, 1, 4},         {"f16", 1, 1, 2},         {"q4_0", 2, 32, 18},      {"q4_1", 3, 32, 20},
    {"q5_0", 6, 32, 22},      {"q5_1", 7, 32, 24},      {"q8_0", 8, 32, 34},      {"q8_1", 9, 32, 36},
    {"q2_K", 10, 256, 84},    {"q3_K", 11, 256, 110},   {"q4_K", 12, 256, 144},   {"q5_K", 13, 256, 176},
    {"q6_K", 14, 256, 210},   {"q8_K", 15, 256, 292},   {"iq2_xxs", 16, 256, 66}, {"iq2_xs", 17, 256, 74},
    {"iq3_xxs", 18, 256, 98}, {"iq1_s", 19, 256, 50},   {"iq4_nl", 20, 32, 18},   {"iq3_s", 21, 256, 110},
    {"iq2_s", 22, 256, 82},   {"iq4_xs", 23, 256, 136}, {"i8", 24, 1, 1},         {"i16", 25, 1, 2},
    {"i32", 26, 1, 4},        {"i64", 27, 1, 8},        {"f64", 28, 1, 8},        {"iq1_m", 29, 256, 56},
    {"bf16", 30, 1, 2},       {"tq1_0", 34, 256, 54},   {"tq2_0", 35, 256, 66},   {"mxfp4", 39, 32, 17},
}};

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const GgmlTypeInfo& t : kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8:
      return "u8";
    case GgufType::i8:
      return "i8";
    case GgufType::u16:
      return "u16";
    case GgufType::i16:
      return "i16";
    case GgufType::u32:
      return "u32";
    case GgufType::i32:
      return "i32";
    case GgufType::f32:
      return "f32";
    case GgufType::boolean:
      return "bool";
    case GgufType::string:
      return "string";
    case GgufType::array:
      return "array";
    case GgufType::u64:
      return "u64";
    case GgufType::i64:
      return "i64";
    case GgufType::f64:
      return "f64";
  }
  return "invalid";
}

namespace gguf_detail {

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
      return 8;
    case GgufType::string:
    case GgufType::array:
      return 0;
  }
  return 0;
}

size_t encoded_size(GgufType t, const uint8_t* p) {
  if (t == GgufType::string) return kStringHeaderBytes + load<uint64_t>(p);
  if (t != GgufType::array) return scalar_size(t);
  const auto elem = static_cast<GgufType>(load<uint32_t>(p));
  const uint64_t n = load<uint64_t>(p + 4);
  if (const size_t s = scalar_size(elem); s != 0) return kArrayHeaderBytes + n * s;
  size_t size = kArrayHeaderBytes;
  for (uint64_t i = 0; i < n; ++i) size += encoded_size(elem, p + size);
  return size;
}

std::string escape(std::string_view s, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

}  // namespace gguf_detail

std::string gguf_escape(std::string_view s, size_t max_bytes) { return gguf_detail::escape(s, max_bytes); }

// ---- GgufValue -----------------------------------------------------------------------------------

bool GgufValue::is_integer() const {
  switch (type_) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_float() const { return type_ == GgufType::f32 || type_ == GgufType::f64; }

std::optional<uint64_t> GgufValue::as_u64() const {
  const uint8_t* p = raw_.data();
  auto non_negative = [](int64_t v) -> std::optional<uint64_t> {
    if (v < 0) return std::nullopt;
    return static_cast<uint64_t>(v);
  };
  switch (type_) {
    case GgufType::u8:
      return load<uint8_t>(p);
    case GgufType::u16:
      return load<uint16_t>(p);
    case GgufType::u32:
      return load<uint32_t>(p);
    case GgufType::u64:
      return load<uint64_t>(p);
    case GgufType::i8:
      return non_negative(load<int8_t>(p));
    case GgufType::i16:
      return non_negative(load<int16_t>(p));
    case GgufType::i32:
      return non_negative(load<int32_t>(p));
    case GgufType::i64:
      return non_negative(load<int64_t>(p));
    default:
      return std::nullopt;
  }
}

std::optional<int64_t> GgufValue::as_i64() const {
  const uint8_t* p = raw_.data();
  switch (type_) {
    case GgufType::i8:
      return load<int8_t>(p);
    case GgufType::i16:
      return load<int16_t>(p);
    case GgufType::i32:
      return load<int32_t>(p);
    case GgufType::i64:
      return load<int64_t>(p);
    case GgufType::u8:
      return load<uint8_t>(p);
    case GgufType::u16:
      return load<uint16_t>(p);
    case GgufType::u32:
      return load<uint32_t>(p);
    case GgufType::u64: {
      const uint64_t v = load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    default:
      return std::nullopt;
  }
}

std::optional<double> GgufValue::as_f64() const {
  if (type_ == GgufType::f32) return load<float>(raw_.data());
  if (type_ == GgufType::f64) return load<double>(raw_.data());
  return std::nullopt;
}

std::optional<bool> GgufValue::as_bool() const {
  if (type_ != GgufType::boolean) return std::nullopt;
  return raw_[0] != 0;
}

std::optional<std::string_view> GgufValue::as_string() const {
  if (type_ != GgufType::string) return std::nullopt;
  const uint64_t n = load<uint64_t>(raw_.data());
  return std::string_view(reinterpret_cast<const char*>(raw_.data()) + gguf_detail::kStringHeaderBytes, n);
}

GgufType GgufValue::array_type() const {
  if (type_ != GgufType::array) return GgufType::u8;
  return static_cast<GgufType>(load<uint32_t>(raw_.data()));
}

uint64_t GgufValue::array_size() const {
  if (type_ != GgufType::array) return 0;
  return load<uint64_t>(raw_.data() + 4);
}

std::vector<GgufValue> GgufValue::first_elements(uint64_t limit) const {
  std::vector<GgufValue> out;
  if (type_ != GgufType::array) return out;
  const GgufType elem = array_type();
  const uint64_t n = std::min(array_size(), limit);
  // n is bounded by the validated array's bytes (every element takes at least one byte).
  out.reserve(n);
  size_t pos = gguf_detail::kArrayHeaderBytes;
  for (uint64_t i = 0; i < n; ++i) {
    const size_t size = gguf_detail::encoded_size(elem, raw_.data() + pos);
    out.push_back(GgufValue(elem, raw_.subspan(pos, size)));
    pos += size;
  }
  return out;
}

std::vector<GgufValue> GgufValue::elements() const {
  return first_elements(std::numeric_limits<uint64_t>::max());
}

std::string GgufValue::type_string() const {
  if (type_ != GgufType::array) return gguf_type_name(type_);
  return fmt::format("array[{}]", gguf_type_name(array_type()));
}

std::string GgufValue::format(size_t max_elements) const {
  switch (type_) {
    case GgufType::f32:
      return fmt::format("{}", load<float>(raw_.data()));
    case GgufType::f64:
      return fmt::format("{}", load<double>(raw_.data()));
    case GgufType::boolean:
      return raw_[0] ? "true" : "false";
    case GgufType::string:
      return fmt::format("\"{}\"", gguf_detail::escape(*as_string(), 200));
    case GgufType::array: {
      const uint64_t n = array_size();
      std::string out = "[";
      const std::vector<GgufValue> shown = first_elements(max_elements);
      for (size_t i = 0; i < shown.size(); ++i) {
        if (i) out += ", ";
        out += shown[i].format(max_elements);
      }
      if (n > shown.size()) out += fmt::format("{}... ({} elements)", shown.empty() ? "" : ", ", n);
      return out + "]";
    }
    default:
      break;
  }
  if (const auto u = as_u64()) return fmt::format("{}", *u);
  if (const auto i = as_i64()) return fmt::format("{}", *i);
  return "?";
}

}  // namespace loom
