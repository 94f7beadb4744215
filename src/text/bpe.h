// Byte-level BPE (GPT-2 and its descendants): the text is split by the pre-tokenizer, each piece's
// bytes become byte-level characters, and merges apply lowest rank first.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pretokenize.h"
#include "text_internal.h"

namespace loom::text {

/// The state of one encode call: regex match data, symbol and queue buffers reused across words,
/// and a cache of the words seen so far (running text repeats words a lot: on tinyshakespeare it
/// skips the merges for most of them).
class BpeSession {
 public:
  explicit BpeSession(const TokenizerData& d) : d_(d) {}

  /// Appends the tokens of a fragment of plain text (valid UTF-8, no special tokens).
  Status encode(std::string_view fragment, std::vector<TokenId>& out);

 private:
  struct Symbol {
    TokenId id;  // kNoToken for a byte whose character is not in the vocabulary; kDead once merged away
    int32_t prev;
    int32_t next;
  };
  // A mergeable neighbour pair, valid while both symbols still hold left_id and right_id.
  struct Candidate {
    int32_t rank;
    int32_t left;
    TokenId left_id;
    TokenId right_id;
    TokenId result;
  };
  static constexpr TokenId kDead = -2;
  static constexpr size_t kCacheMaxWordBytes = 64;
  static constexpr size_t kCacheMaxEntries = 1 << 16;

  void encode_word(std::string_view word, std::vector<TokenId>& out);
  void push_candidate(int32_t left, int32_t right);

  const TokenizerData& d_;
  RegexScratch scratch_;
  std::vector<TextSpan> pieces_;
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;
  std::string mapped_;
  // Hashes std::string and std::string_view alike, so looking a word up allocates nothing.
  struct WordHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // word -> [begin, end) in cache_ids_
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, WordHash, std::equal_to<>> cache_;
  std::vector<TokenId> cache_ids_;
};

}  // namespace loom::text
