// SentencePiece BPE: spaces become "▁", the text starts as one symbol per character, and the
// adjacent pair whose concatenation is the best-scoring token merges first (ties: leftmost), until
// no pair is a token. Characters left that are not tokens fall back to their UTF-8 bytes (<0xXX>).
#include <algorithm>

#include "text_internal.h"
#include "unicode.h"

namespace loom::text {

namespace {

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

struct Symbol {
  uint32_t begin;
  uint32_t size;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  float score;
  int32_t left;
  uint32_t size;  // bytes of the pair when queued; a different sum later means the pair changed
};

struct WorseBigram {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  }
};

class SpmWork {
 public:
  explicit SpmWork(const TokenizerData& d) : d_(d) {}

  // Merges `text` (escaped, a view that outlives the call) and appends its tokens.
  void run(std::string_view text, std::vector<TokenId>& out) {
    text_ = text;
    symbols_.clear();
    queue_.clear();
    for (size_t i = 0; i < text_.size();) {
      const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(text_[i])), text_.size() - i);
      const auto idx = static_cast<int32_t>(symbols_.size());
      symbols_.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), idx - 1, -1});
      if (idx > 0) symbols_[idx - 1].next = idx;
      i += len;
    }
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) try_pair(i - 1, i);

    while (!queue_.empty()) {
      std::pop_heap(queue_.begin(), queue_.end(), WorseBigram{});
      const Bigram b = queue_.back();
      queue_.pop_back();
      Symbol& left = symbols_[b.left];
      if (left.size == 0 || left.next < 0) continue;
      Symbol& right = symbols_[left.next];
      if (left.size + right.size != b.size) continue;  // one side grew since it was queued
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (left.next >= 0) symbols_[left.next].prev = b.left;
      if (left.prev >= 0) try_pair(left.prev, b.left);
      if (left.next >= 0) try_pair(b.left, left.next);
    }

    for (int32_t i = symbols_.empty() ? -1 : 0; i >= 0; i = symbols_[i].next) {
      const std::string_view piece = text_.substr(symbols_[i].begin, symbols_[i].size);
      if (TokenId id = d_.find(piece); id != kNoToken) {
        out.push_back(id);
        continue;
      }
      // Only single characters reach here: every merge made a token.
      const bool bytes_known = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return d_.byte_tokens[static_cast<uint8_t>(c)] != kNoToken;
      });
      if (bytes_known) {
        for (char c : piece) out.push_back(d_.byte_tokens[static_cast<uint8_t>(c)]);
      } else if (d_.special.unk != kNoToken) {
        out.push_back(d_.special.unk);  // SentencePiece without byte fallback: one <unk> per character
      }
    }
  }

 private:
  void try_pair(int32_t l, int32_t r) {
    const Symbol& a = symbols_[l];
    const Symbol& b = symbols_[r];
    const TokenId id = d_.find(text_.substr(a.begin, a.size + b.size));
    if (id == kNoToken) return;
    queue_.push_back({d_.scores[id], l, a.size + b.size});
    std::push_heap(queue_.begin(), queue_.end(), WorseBigram{});
  }

  const TokenizerData& d_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::vector<Bigram> queue_;
};

}  // namespace

void encode_spm(const TokenizerData& d, std::string_view fragment, bool add_prefix,
                std::vector<TokenId>& out) {
  std::string text;
  text.reserve(fragment.size() + 8);
  if (add_prefix) text += kSpaceMark;
  for (char c : fragment) {
    if (c == ' ')
      text += kSpaceMark;
    else
      text += c;
  }
  SpmWork work(d);
  if (!d.spm_split_words) {
    work.run(text, out);
    return;
  }
  // No token holds a "▁" after another character, so no merge crosses the start of a word (a "▁"
  // after a non-"▁"): words merge independently, with small queues, and give the same tokens.
  const std::string_view all(text);
  size_t word_begin = 0;
  for (size_t i = all.find(kSpaceMark, 1); i != std::string_view::npos; i = all.find(kSpaceMark, i + 1)) {
    const bool after_mark =
        i >= kSpaceMark.size() && all.compare(i - kSpaceMark.size(), kSpaceMark.size(), kSpaceMark) == 0;
    if (after_mark) continue;
    work.run(all.substr(word_begin, i - word_begin), out);
    word_begin = i;
  }
  work.run(all.substr(word_begin), out);
}

}  // namespace loom::text
