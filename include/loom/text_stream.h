// Streaming generated text: stop strings and UTF-8 boundaries. A reply is the concatenation of its
// tokens' bytes, which need not be valid UTF-8 (byte-level vocabularies split characters; a length
// limit can stop inside one), and a stop string may be spelled across several tokens. These pieces
// let `loom chat` and `loom serve` stream such text without printing a stop string or half a
// character.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

/// Streams a reply to a sink while watching for stop strings (a template's end-of-turn text, a
/// request's `stop` list): text that could be the start of a stop string is held back until the
/// next piece shows whether it is, so a stop string is never passed on.
class StopFilter {
 public:
  using Sink = std::function<void(std::string_view)>;
  /// One stop string; an empty `stop` passes everything through.
  StopFilter(std::string stop, Sink sink);
  /// Several stop strings (empty ones are ignored); the earliest match in the text wins.
  StopFilter(std::vector<std::string> stops, Sink sink);

  /// Adds a piece; true when the text now contains a stop string, which is cut off together with
  /// whatever followed it.
  bool add(std::string_view piece);
  /// Passes on what was held back (the reply ended without a stop string).
  void finish();
  /// The reply so far, without the stop string.
  const std::string& text() const { return text_; }

 private:
  size_t held_back() const;
  void emit(size_t upto);

  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  Sink sink_;
  std::string text_;
  size_t emitted_ = 0;
};

/// `s` with every byte that does not start a valid UTF-8 sequence (truncated, overlong, surrogate,
/// past U+10FFFF) replaced by U+FFFD. The tokenizer and JSON take valid text only.
std::string to_valid_utf8(std::string_view s);

/// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence which the next
/// bytes could still complete: a stream passes on that prefix and keeps the rest for later.
/// Invalid bytes do not hold anything back (to_valid_utf8 replaces them).
size_t utf8_complete_prefix(std::string_view s);

/// Joins pieces of bytes into valid UTF-8 text: add() returns the characters completed so far,
/// finish() the rest with any unfinished sequence replaced by U+FFFD.
class Utf8Joiner {
 public:
  /// The complete characters now available (possibly empty).
  std::string add(std::string_view bytes);
  /// What is left, made valid.
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace loom
