// The structural hash the CUDA executor keys its executable graphs by (plan.h: structure_hash).
#include "loom/exec_plan.h"

namespace loom::exec {

namespace {

// Four independent multiply lanes keep hashing at about a cycle per word.
class Hasher {
 public:
  void add(uint64_t v) {
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
  void add_tensor(const Tensor& t) {
    add(static_cast<uint64_t>(t.type) | (static_cast<uint64_t>(t.op) << 8) | (uint64_t{t.flags} << 16));
    add(reinterpret_cast<uintptr_t>(t.data));
    for (int i = 0; i < kMaxDims; ++i) {
      add(static_cast<uint64_t>(t.ne[i]));
      add(t.nb[i]);
    }
  }
  // an operand: a node by its index (hashed in full where the graph lists it); a leaf in full,
  // since weights and the KV cache are leafs of other graphs (the model's, the cache's)
  void add_ref(const Tensor* t) {
    if (!t) {
      add(~0ull);
    } else if (t->is_leaf()) {
      add_tensor(*t);
    } else {
      add(static_cast<uint64_t>(static_cast<uint32_t>(t->index)));
      add(reinterpret_cast<uintptr_t>(t->data));
    }
  }

 private:
  uint64_t lane_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  uint64_t n_ = 0;
};

}  // namespace

uint64_t structure_hash(const Graph& g, const ExecOptions& o) {
  Hasher h;
  h.add(static_cast<uint64_t>(o.serialize) | (uint64_t{o.graph} << 1) | (uint64_t{o.concurrency} << 2) |
        (uint64_t{o.fusion} << 3) | (uint64_t{o.reorder} << 4) | (uint64_t{o.pdl} << 5) |
        (static_cast<uint64_t>(o.lookahead) << 8));
  h.add(g.nodes().size());
  for (const Tensor* t : g.nodes()) {
    h.add_tensor(*t);
    if (t->op == OpKind::view) {
      h.add_ref(t->view_src);
      continue;
    }
    const auto* p = reinterpret_cast<const uint64_t*>(t->params.data());
    for (size_t i = 0; i < kMaxOpParams / 8; ++i) h.add(p[i]);
    for (const Tensor* s : t->src) h.add_ref(s);
  }
  return h.finish();
}

}  // namespace loom::exec
