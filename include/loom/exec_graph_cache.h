// The executor's cache of recorded passes: entries keyed by a pass's structure (structure_key) and
// the options it was recorded under, least recently used first out. A lookup finds candidates by
// hash and replays one only when its words are equal too, so a 64-bit collision rebuilds instead of
// replaying another pass's graph. Backend-agnostic (the payload is the backend's executable graph),
// so it is tested on the CPU.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <utility>

#include "loom/graph.h"

namespace loom::exec {

template <typename Payload>
class GraphCache {
 public:
  explicit GraphCache(size_t capacity) : capacity_(capacity) {}

  /// The hash a key is looked up by: the structure's hash with the options word mixed in, or the
  /// forced value (force_hash).
  uint64_t lookup_hash(const StructureKey& key, uint64_t options) const {
    if (forced_) return *forced_;
    uint64_t h = key.hash ^ (options * 0x9e3779b97f4a7c15ull);
    h ^= h >> 32;
    return h * 0xd6e8feb86659fd93ull;
  }
  /// Every key hashes to `h` (tests: forces collisions); nullopt restores the real hash.
  void force_hash(std::optional<uint64_t> h) { forced_ = h; }

  /// The payload recorded for exactly this structure and options, made the most recently used;
  /// nullptr when there is none. `collision` (if given) is set when an entry had the same lookup
  /// hash but another structure: a miss the hash alone would have taken for a hit.
  Payload* find(const StructureKey& key, uint64_t options, bool* collision = nullptr) {
    const uint64_t h = lookup_hash(key, options);
    bool clash = false;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->hash != h) continue;
      if (it->options != options || it->words != key.words) {
        clash = true;
        continue;
      }
      entries_.splice(entries_.begin(), entries_, it);
      if (collision) *collision = false;
      return &entries_.front().payload;
    }
    if (collision) *collision = clash;
    return nullptr;
  }

  /// The most recently used payload (the one just inserted or found); nullptr when empty.
  Payload* front() { return entries_.empty() ? nullptr : &entries_.front().payload; }
  bool full() const { return entries_.size() >= capacity_; }
  size_t size() const { return entries_.size(); }
  /// Removes the least recently used entry and returns its payload (to be reused or released).
  Payload take_oldest() {
    Payload p = std::move(entries_.back().payload);
    entries_.pop_back();
    return p;
  }
  /// Adds an entry as the most recently used (the caller makes room first: full(), take_oldest()).
  Payload& insert(const StructureKey& key, uint64_t options, Payload p) {
    entries_.push_front(Entry{lookup_hash(key, options), options, key.words, std::move(p)});
    return entries_.front().payload;
  }
  /// Calls `release(payload)` for every entry, then empties the cache.
  template <typename Release>
  void clear(Release&& release) {
    for (Entry& e : entries_) release(e.payload);
    entries_.clear();
  }

 private:
  struct Entry {
    uint64_t hash;
    uint64_t options;
    std::vector<uint64_t> words;
    Payload payload;
  };
  std::list<Entry> entries_;  // most recently used first
  size_t capacity_;
  std::optional<uint64_t> forced_;
};

}  // namespace loom::exec
