#include "bpe.h"

#include <algorithm>

#include "unicode.h"

namespace loom::text {

namespace {

// Min-heap order: lowest rank first, then the leftmost pair (Hugging Face's tie break).
struct LaterCandidate {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

}  // namespace

Status BpeSession::encode(std::string_view fragment, std::vector<TokenId>& out) {
  LOOM_TRY(d_.pre_tokenizer->split(fragment, scratch_, pieces_));
  for (const TextSpan& p : pieces_) encode_word(fragment.substr(p.begin, p.size), out);
  return {};
}

void BpeSession::push_candidate(int32_t left, int32_t right) {
  const TokenId l = symbols_[left].id, r = symbols_[right].id;
  if (l < 0 || r < 0) return;
  const BpeMerge* m = d_.merges.find(l, r);
  if (!m) return;
  heap_.push_back({m->rank, left, l, r, m->result});
  std::push_heap(heap_.begin(), heap_.end(), LaterCandidate{});
}

void BpeSession::encode_word(std::string_view word, std::vector<TokenId>& out) {
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), cache_ids_.begin() + it->second.first, cache_ids_.begin() + it->second.second);
      return;
    }
  }
  const size_t out_begin = out.size();

  if (d_.ignore_merges) {
    mapped_.clear();
    for (char c : word) mapped_ += byte_level_char(static_cast<uint8_t>(c));
    if (TokenId id = d_.find(mapped_); id != kNoToken) out.push_back(id);
  }

  if (out.size() == out_begin) {
    // One symbol per byte, linked as a list; merging a pair is O(1) and each merge queues at most
    // two new candidates, so a word of n bytes costs O(n log n) whatever its length.
    const auto n = static_cast<int32_t>(word.size());
    symbols_.clear();
    for (int32_t i = 0; i < n; ++i)
      symbols_.push_back({d_.byte_char_tokens[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1});
    heap_.clear();
    for (int32_t i = 1; i < n; ++i) push_candidate(i - 1, i);

    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), LaterCandidate{});
      const Candidate c = heap_.back();
      heap_.pop_back();
      Symbol& left = symbols_[c.left];
      if (left.id != c.left_id || left.next < 0) continue;  // stale: the left symbol changed
      Symbol& right = symbols_[left.next];
      if (right.id != c.right_id) continue;  // stale: the right neighbour changed
      left.id = c.result;
      const int32_t after = right.next;
      right.id = kDead;
      left.next = after;
      if (after >= 0) symbols_[after].prev = c.left;
      if (left.prev >= 0) push_candidate(left.prev, c.left);
      if (after >= 0) push_candidate(c.left, after);
    }

    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols_[i].next) {
      const TokenId id = symbols_[i].id;
      if (id >= 0) {
        out.push_back(id);
      } else if (d_.special.unk != kNoToken) {
        out.push_back(d_.special.unk);  // a byte the vocabulary cannot spell (a broken vocabulary)
      }
    }
  }

  if (cacheable) {
    if (cache_.size() >= kCacheMaxEntries) {
      cache_.clear();
      cache_ids_.clear();
    }
    const auto begin = static_cast<uint32_t>(cache_ids_.size());
    cache_ids_.insert(cache_ids_.end(), out.begin() + static_cast<ptrdiff_t>(out_begin), out.end());
    cache_.emplace(std::string(word), std::make_pair(begin, static_cast<uint32_t>(cache_ids_.size())));
  }
}

}  // namespace loom::text
