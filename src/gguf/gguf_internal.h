// Helpers shared by the GGUF reader, value accessors and writer.
#pragma once

#include <bit>
#include <cstring>
#include <string>
#include <string_view>

#include "loom/gguf.h"

namespace loom::gguf_detail {

// GGUF is little-endian and values are read by memcpy into host integers.
static_assert(std::endian::native == std::endian::little, "Loom's GGUF code assumes a little-endian host");

inline constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
inline constexpr uint32_t kWriteVersion = 3;
inline constexpr size_t kHeaderBytes = 24;  // magic, version, tensor_count, metadata_kv_count
inline constexpr size_t kStringHeaderBytes = 8;
inline constexpr size_t kArrayHeaderBytes = 12;  // element type + count

/// Reads a little-endian value from unaligned bytes.
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// Bytes of a fixed-size value type; 0 for string and array.
size_t scalar_size(GgufType t);
inline bool is_valid_type(uint32_t id) { return id < kGgufTypeCount; }

/// Bytes of the value of type `t` encoded at `p`. Trusts the encoding (the parser validated it).
size_t encoded_size(GgufType t, const uint8_t* p);

/// A key, name or string value fit for an error message: bytes that are not printable ASCII
/// appear as \xNN and long text is cut after `max_bytes` with "...".
std::string escape(std::string_view s, size_t max_bytes = 96);

inline bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace loom::gguf_detail
