// Stop strings and UTF-8 boundaries of streamed text (loom/text_stream.h).
#include "loom/text_stream.h"

#include <algorithm>
#include <cstdint>

namespace loom {

StopFilter::StopFilter(std::string stop, Sink sink)
    : StopFilter(std::vector<std::string>{std::move(stop)}, std::move(sink)) {}

StopFilter::StopFilter(std::vector<std::string> stops, Sink sink) : sink_(std::move(sink)) {
  for (auto& s : stops)
    if (!s.empty()) {
      longest_stop_ = std::max(longest_stop_, s.size());
      stops_.push_back(std::move(s));
    }
}

bool StopFilter::add(std::string_view piece) {
  text_ += piece;
  if (!stops_.empty()) {
    // Emitted text never holds the start of a stop string, so the search starts near its end.
    const size_t from = emitted_ > longest_stop_ ? emitted_ - longest_stop_ : 0;
    size_t first = std::string::npos;
    for (const std::string& s : stops_) first = std::min(first, text_.find(s, from));
    if (first != std::string::npos) {
      text_.resize(first);
      emit(text_.size());
      return true;
    }
  }
  emit(text_.size() - held_back());
  return false;
}

void StopFilter::finish() { emit(text_.size()); }

// Length of the longest suffix of the text that is a proper prefix of a stop string.
size_t StopFilter::held_back() const {
  size_t best = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, text_.size()); n > best; --n)
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        best = n;
        break;
      }
  return best;
}

void StopFilter::emit(size_t upto) {
  if (upto <= emitted_) return;
  sink_(std::string_view(text_).substr(emitted_, upto - emitted_));
  emitted_ = upto;
}

namespace {

// The length a lead byte announces (1 for ASCII), 0 for a byte that cannot start a sequence.
size_t utf8_sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 0;
}

}  // namespace

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = utf8_sequence_length(b);
    static constexpr unsigned char kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = b & kLeadMask[len];
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    // no overlong forms, surrogates or code points past U+10FFFF
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last three bytes can belong to an unfinished sequence of at most four.
  const size_t stop = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i > stop; --i) {
    const auto b = static_cast<unsigned char>(s[i - 1]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t len = utf8_sequence_length(b);
    // A lead byte whose sequence runs past the end waits for the rest; anything else is complete
    // (or invalid, which waiting would not repair).
    return len > 1 && i - 1 + len > s.size() ? i - 1 : s.size();
  }
  return s.size();
}

std::string Utf8Joiner::add(std::string_view bytes) {
  pending_ += bytes;
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = to_valid_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string Utf8Joiner::finish() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace loom
