#include "unicode.h"

#include <algorithm>
#include <array>

namespace loom::text {

size_t utf8_first_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    uint32_t min;
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string_view::npos;
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t c = p[i];
  // Clamped, so that a truncated sequence (token texts come from files) cannot read past the end.
  const size_t len = std::min(utf8_seq_len(c), s.size() - i);
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3f);
  i += len;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> cp_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, 324> byte_of_cp{};  // the alphabet lies below U+0144

  ByteLevelTables() {
    byte_of_cp.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      cp_of_byte[b] = printable ? b : next++;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      utf8_append(utf8_of_byte[b], cp_of_byte[b]);
      byte_of_cp[cp_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

std::string_view byte_level_char(uint8_t byte) { return byte_level_tables().utf8_of_byte[byte]; }

int byte_level_byte(uint32_t cp) {
  const auto& t = byte_level_tables();
  return cp < t.byte_of_cp.size() ? t.byte_of_cp[cp] : -1;
}

}  // namespace loom::text
