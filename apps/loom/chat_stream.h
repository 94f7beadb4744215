// Pieces of `loom chat`'s reply streaming, separate so that tests can reach them.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace loom::app {

/// Streams a reply to a sink while watching for a stop string (the template's end-of-turn text,
/// for models that spell it with ordinary tokens): text that could be the start of the stop string
/// is held back until the next piece shows whether it is, so the stop string is never printed.
class StopFilter {
 public:
  using Sink = std::function<void(std::string_view)>;
  /// An empty `stop` passes everything through.
  StopFilter(std::string stop, Sink sink) : stop_(std::move(stop)), sink_(std::move(sink)) {}

  /// Adds a piece; true when the text now contains the stop string, which is cut off together with
  /// whatever followed it.
  bool add(std::string_view piece);
  /// Passes on what was held back (the reply ended without the stop string).
  void finish();
  /// The reply so far, without the stop string.
  const std::string& text() const { return text_; }

 private:
  size_t held_back() const;
  void emit(size_t upto);

  std::string stop_;
  Sink sink_;
  std::string text_;
  size_t emitted_ = 0;
};

/// `s` with every byte that does not start a valid UTF-8 sequence (truncated, overlong, surrogate,
/// past U+10FFFF) replaced by U+FFFD. A reply is the concatenation of its tokens' bytes, which need
/// not be valid UTF-8 (byte-level vocabularies split characters; -n can stop inside one), and the
/// tokenizer takes valid text only.
std::string to_valid_utf8(std::string_view s);

}  // namespace loom::app
