// UTF-8 helpers and the GPT-2 byte-level alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "loom/text.h"  // utf8_first_invalid

namespace loom::text {


/// Length of the sequence a lead byte starts (1 for stray continuation bytes, so loops advance).
inline size_t utf8_seq_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;
}

/// Decodes the code point at s[i] and advances i past it. Meant for valid UTF-8; on other bytes it
/// returns some value and still advances by at least one byte without passing the end.
uint32_t utf8_next(std::string_view s, size_t& i);

/// Appends the UTF-8 encoding of `cp` (a valid scalar value).
void utf8_append(std::string& out, uint32_t cp);

/// GPT-2's byte-level alphabet: every byte is shown as a printable character (bytes that are
/// printable Latin-1 stand for themselves, the others map to U+0100 and up, in byte order), so
/// byte strings can be BPE-merged as text. Returns that character's UTF-8.
std::string_view byte_level_char(uint8_t byte);
/// The byte a byte-level character stands for, or -1 when `cp` is not in the alphabet.
int byte_level_byte(uint32_t cp);

}  // namespace loom::text
