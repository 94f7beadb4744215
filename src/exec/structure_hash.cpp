// The structure key the CUDA executor looks its executable graphs up by (exec_plan.h: structure_key).
#include "loom/exec_plan.h"

namespace loom::exec {

namespace {

// Every word goes into the key, so the key's words are exactly what was hashed: equal hashes with
// unequal words are a collision, and the words decide. Four independent multiply lanes keep hashing
// at about a cycle per word.
class Encoder {
 public:
  explicit Encoder(std::vector<uint64_t>& words) : words_(words) { words_.clear(); }

  void add(uint64_t v) {
    words_.push_back(v);
    uint64_t& l = lane_[n_++ & 3];
    l = (l ^ v) * 0x9fb21c651e98df25ull;
  }
  uint64_t finish() const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint64_t l : lane_) {
      h ^= l ^ (l >> 31);
      h *= 0xff51afd7ed558ccdull;
      h ^= h >> 33;
    }
    return h ^ n_;
  }
  // type | op << 8 | flags << 16: bit 63 is clear (flags are 32 bits), which tells a tensor written
  // in full from a node reference (kNodeRef) in an operand slot
  void add_tensor(const Tensor& t) {
    add(static_cast<uint64_t>(t.type) | (static_cast<uint64_t>(t.op) << 8) | (uint64_t{t.flags} << 16));
    add(reinterpret_cast<uintptr_t>(t.data));
    for (int i = 0; i < kMaxDims; ++i) {
      add(static_cast<uint64_t>(t.ne[i]));
      add(t.nb[i]);
    }
  }
  // an operand: a node by its index (written in full where the graph lists it); a leaf in full,
  // since weights and the KV cache are leafs of other graphs (the model's, the cache's)
  void add_ref(const Tensor* t) {
    if (!t) {
      add(kNull);
    } else if (t->is_leaf()) {
      add_tensor(*t);
    } else {
      add(kNodeRef | static_cast<uint32_t>(t->index));
      add(reinterpret_cast<uintptr_t>(t->data));
    }
  }

 private:
  static constexpr uint64_t kNodeRef = 1ull << 63;
  static constexpr uint64_t kNull = ~0ull;
  std::vector<uint64_t>& words_;
  uint64_t lane_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  uint64_t n_ = 0;
};

}  // namespace

void structure_key(const Graph& g, StructureKey& out) {
  Encoder e(out.words);
  e.add(g.nodes().size());
  for (const Tensor* t : g.nodes()) {
    e.add_tensor(*t);
    if (t->op == OpKind::view) {
      e.add_ref(t->view_src);
      continue;
    }
    const auto* p = reinterpret_cast<const uint64_t*>(t->params.data());
    for (size_t i = 0; i < kMaxOpParams / 8; ++i) e.add(p[i]);
    for (const Tensor* s : t->src) e.add_ref(s);
  }
  out.hash = e.finish();
}

StructureKey structure_key(const Graph& g) {
  StructureKey k;
  structure_key(g, k);
  return k;
}

uint64_t options_word(const ExecOptions& o) {
  return static_cast<uint64_t>(o.serialize) | (uint64_t{o.graph} << 1) | (uint64_t{o.concurrency} << 2) |
         (uint64_t{o.fusion} << 3) | (uint64_t{o.reorder} << 4) | (uint64_t{o.pdl} << 5) |
         (static_cast<uint64_t>(static_cast<uint32_t>(o.lookahead)) << 8);
}

}  // namespace loom::exec
