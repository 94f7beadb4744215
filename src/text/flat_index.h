// Open-addressing hash tables for the two lookups the tokenizers make per symbol pair: token text
// to id, and token-id pair to BPE merge. std::unordered_map spent 50% of SentencePiece encoding
// in its bucket chains; one flat array with linear probing keeps a lookup to a cache line or two.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "loom/text.h"

namespace loom::text {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/// A hash of short byte strings, eight bytes at a time.
inline uint64_t hash_text(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = mix64(h ^ v);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix64(h ^ tail);
}

inline size_t table_capacity(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;  // at most half full
  return cap;
}

/// Token text -> id. Texts live elsewhere (the vocabulary arena); `text_of(id)` reads them back.
class TextIndex {
 public:
  /// Inserts ids 0..n-1 in order; a text seen before keeps its first id.
  template <typename TextOf>
  void build(int32_t n, TextOf text_of) {
    slots_.assign(table_capacity(static_cast<size_t>(n)), Slot{0, kNoToken});
    mask_ = slots_.size() - 1;
    for (TokenId id = 0; id < n; ++id) {
      const std::string_view t = text_of(id);
      const uint64_t h = hash_text(t);
      size_t i = h & mask_;
      bool seen = false;
      for (; slots_[i].id != kNoToken; i = (i + 1) & mask_)
        if (slots_[i].tag == static_cast<uint32_t>(h >> 32) && text_of(slots_[i].id) == t) {
          seen = true;
          break;
        }
      if (!seen) slots_[i] = Slot{static_cast<uint32_t>(h >> 32), id};
    }
  }

  template <typename TextOf>
  TokenId find(std::string_view s, TextOf text_of) const {
    const uint64_t h = hash_text(s);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.id == kNoToken) return kNoToken;
      if (slot.tag == tag && text_of(slot.id) == s) return slot.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high hash bits: most mismatches end here without touching the text
    TokenId id;
  };
  std::vector<Slot> slots_{Slot{0, kNoToken}};
  size_t mask_ = 0;
};

/// One BPE merge: the rank (lower merges first) and the token the pair becomes.
struct BpeMerge {
  int32_t rank;
  TokenId result;
};

/// (left id, right id) -> merge.
class MergeTable {
 public:
  void reserve(size_t n) {
    slots_.assign(table_capacity(n), Slot{kEmpty, {0, kNoToken}});
    mask_ = slots_.size() - 1;
  }
  /// Adds a merge unless the pair has one already (the earlier, lower rank wins). reserve() must
  /// have been called for at least as many merges as are added.
  void add(TokenId left, TokenId right, BpeMerge m) {
    const uint64_t k = key(left, right);
    size_t i = mix64(k) & mask_;
    for (; slots_[i].key != kEmpty; i = (i + 1) & mask_)
      if (slots_[i].key == k) return;
    slots_[i] = Slot{k, m};
    ++size_;
  }
  const BpeMerge* find(TokenId left, TokenId right) const {
    const uint64_t k = key(left, right);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == k) return &slot.merge;
      if (slot.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are below 2^31, so no real key
  static uint64_t key(TokenId l, TokenId r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  struct Slot {
    uint64_t key;
    BpeMerge merge;
  };
  std::vector<Slot> slots_{Slot{kEmpty, {0, kNoToken}}};
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace loom::text
