// Memory planner: one arena for activations, blocks reused by liveness.
//
// Walks the nodes in order. A node that owns memory gets a block when it is defined; the block
// returns to the free list after the last node that reads it (directly or through a view). Free
// blocks are kept sorted by offset and merged with neighbours; allocation is best-fit, else the
// arena grows at its end.
#include "loom/planner.h"

#include <algorithm>
#include <map>

namespace loom {

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool owns_memory(const Tensor& t) { return !t.is_leaf() && t.view_src == nullptr; }

// The node whose arena block `t` ultimately lives in, or nullptr (leafs and views of leafs).
const Tensor* owner(const Tensor* t) {
  const Tensor* r = t->root();
  return r->is_leaf() ? nullptr : r;
}

class FreeList {
 public:
  size_t allocate(size_t size) {
    auto best = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
      if (it->second >= size && (best == blocks_.end() || it->second < best->second)) best = it;
    if (best != blocks_.end()) {
      size_t off = best->first;
      size_t rest = best->second - size;
      blocks_.erase(best);
      if (rest) blocks_[off + size] = rest;
      return off;
    }
    // Grow: a free block touching the end is extended instead of left behind.
    if (!blocks_.empty()) {
      auto last = std::prev(blocks_.end());
      if (last->first + last->second == end_) {
        size_t off = last->first;
        blocks_.erase(last);
        end_ = off + size;
        peak_ = std::max(peak_, end_);
        return off;
      }
    }
    size_t off = end_;
    end_ += size;
    peak_ = std::max(peak_, end_);
    return off;
  }

  void release(size_t off, size_t size) {
    auto [it, inserted] = blocks_.emplace(off, size);
    LOOM_ASSERT(inserted);
    auto next = std::next(it);
    if (next != blocks_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      blocks_.erase(next);
    }
    if (it != blocks_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        blocks_.erase(it);
      }
    }
  }

  size_t peak() const { return peak_; }

 private:
  std::map<size_t, size_t> blocks_;  // offset -> size
  size_t end_ = 0;
  size_t peak_ = 0;
};

// Whether an operand other than src[0] reads src[0]'s block through a different view. Kernels
// write element e right after reading element e of each operand, so `a` itself as a second
// operand is safe, but a view mapping elements elsewhere (a broadcast row, a slice) would read
// values this node has already overwritten.
bool other_operand_aliases(const Tensor& node, const Tensor* a) {
  for (int j = 1; j < kMaxSrc; ++j) {
    const Tensor* s = node.src[j];
    if (s && s != a && owner(s) == a) return true;
  }
  return false;
}

}  // namespace

bool op_can_run_in_place(const Tensor& node) {
  switch (node.op) {
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::scale:
    case OpKind::silu:
    case OpKind::gelu:
    case OpKind::gelu_erf:
    case OpKind::swiglu:
    case OpKind::geglu:
    case OpKind::swiglu_oai:
    case OpKind::softcap:
    case OpKind::rms_norm:
    case OpKind::norm:
    case OpKind::soft_max:
    case OpKind::rope:
      break;
    default:
      return false;
  }
  const Tensor* a = node.src[0];
  return a && a->type == node.type && a->ne == node.ne && a->is_contiguous() && node.is_contiguous();
}

MemoryPlan plan_memory(const Graph& g, size_t alignment) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  MemoryPlan plan;
  plan.offsets.assign(n, MemoryPlan::kNoOffset);
  plan.in_place_of.assign(n, -1);
  plan.first_use.assign(n, -1);
  plan.last_use.assign(n, -1);

  // Liveness of every owning node: defined at its index, last read by the latest node that uses it
  // or a view of it; outputs live to the end.
  for (int i = 0; i < n; ++i) {
    const Tensor* t = nodes[i];
    if (owns_memory(*t)) plan.first_use[i] = plan.last_use[i] = i;
    for (const Tensor* s : t->src) {
      if (!s) continue;
      if (const Tensor* o = owner(s)) plan.last_use[o->index] = std::max(plan.last_use[o->index], i);
    }
    // A write through a view (set_rows, cpy) keeps the target alive until then too.
    if (t->view_src) {
      if (const Tensor* o = owner(t)) plan.last_use[o->index] = std::max(plan.last_use[o->index], i);
    }
  }
  for (const Tensor* t : g.outputs()) {
    if (const Tensor* o = owner(t)) plan.last_use[o->index] = n;
  }

  // Nodes whose last use is at index i: their blocks free after node i ran.
  std::vector<std::vector<int>> dies_at(n + 1);
  for (int i = 0; i < n; ++i)
    if (plan.first_use[i] >= 0) dies_at[plan.last_use[i]].push_back(i);

  std::vector<size_t> sizes(n, 0);
  FreeList free_list;
  for (int i = 0; i < n; ++i) {
    const Tensor* t = nodes[i];
    if (owns_memory(*t)) {
      sizes[i] = align_up(std::max<size_t>(t->nbytes(), 1), alignment);
      plan.total_bytes += sizes[i];
      // In place: take over the first operand's block when this node is its last reader.
      const Tensor* a = t->src[0];
      if (op_can_run_in_place(*t) && a && owns_memory(*a) && plan.last_use[a->index] == i &&
          sizes[a->index] == sizes[i] && !(a->flags & kTensorOutput) && !other_operand_aliases(*t, a)) {
        plan.offsets[i] = plan.offsets[a->index];
        plan.in_place_of[i] = a->index;
        sizes[a->index] = 0;  // ownership moves to this node
        ++plan.n_in_place;
      } else {
        plan.offsets[i] = free_list.allocate(sizes[i]);
      }
    }
    for (int d : dies_at[i])
      if (sizes[d] != 0) free_list.release(plan.offsets[d], sizes[d]);
  }
  plan.peak_bytes = free_list.peak();
  return plan;
}

Result<GraphAllocation> allocate_graph(Graph& g, BufferType& type) {
  if (!g.status().ok()) return g.status();
  GraphAllocation alloc;
  const size_t alignment = type.alignment();

  size_t leaf_bytes = 0;
  for (Tensor* t : g.leafs())
    if (!t->data) leaf_bytes += align_up(t->nbytes(), alignment);
  if (leaf_bytes) {
    auto buf = type.allocate(leaf_bytes);
    if (!buf) return buf.status();
    alloc.leafs = std::move(buf.value());
    size_t off = 0;
    for (Tensor* t : g.leafs()) {
      if (t->data) continue;
      LOOM_TRY(tensor_bind(t, alloc.leafs.get(), off));
      off += align_up(t->nbytes(), alignment);
    }
  }

  alloc.plan = plan_memory(g, alignment);
  if (alloc.plan.peak_bytes) {
    auto buf = type.allocate(alloc.plan.peak_bytes);
    if (!buf) return buf.status();
    alloc.arena = std::move(buf.value());
  }
  for (Tensor* t : g.nodes()) {
    if (t->view_src) {
      const Tensor* src = t->view_src;
      if (!src->data)
        return make_error(StatusCode::invalid_argument, "allocate_graph: view {} of unallocated tensor {}",
                          describe(*t), describe(*src));
      t->buffer = src->buffer;
      t->data = static_cast<uint8_t*>(src->data) + t->view_offset;
    } else {
      LOOM_TRY(tensor_bind(t, alloc.arena.get(), alloc.plan.offsets[t->index]));
    }
  }
  return alloc;
}

}  // namespace loom
