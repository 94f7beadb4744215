// Plan construction, reorder and dependencies (fusion matching is in fusion.cpp).
#include "loom/exec_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace loom::exec {

ByteRange tensor_range(const Tensor& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + t.nbytes()};
}

bool output_shares_bytes(const Dispatch& d, const Tensor* y) {
  const ByteRange yr = tensor_range(*y);
  auto overlaps = [&](const Tensor* t) {
    if (!t || !t->data) return false;
    const ByteRange tr = tensor_range(*t);
    return tr.begin < yr.end && yr.begin < tr.end;
  };
  for (int r = 0; r < kMaxFusedNodes; ++r) {
    const Tensor* n = d.nodes[static_cast<size_t>(r)];
    if (!n) continue;
    if (n != y && d.kept[static_cast<size_t>(r)] && overlaps(n)) return true;
    for (const Tensor* src : n->src)
      if (src && std::find(d.nodes.begin(), d.nodes.end(), src) == d.nodes.end() && overlaps(src)) return true;
  }
  return false;
}

Tensor* Dispatch::anchor() const {
  for (int i = kMaxFusedNodes - 1; i >= 0; --i)
    if (nodes[i]) return nodes[i];
  return nullptr;
}

namespace {

void add_range(std::vector<ByteRange>& v, const ByteRange& r) {
  if (!r.empty()) v.push_back(r);
}

bool any_overlap(const std::vector<ByteRange>& a, const std::vector<ByteRange>& b) {
  for (const ByteRange& x : a)
    for (const ByteRange& y : b)
      if (x.overlaps(y)) return true;
  return false;
}

// A write into memory the graph does not own (the KV cache, a weight): a side effect.
bool writes_persistent(const Tensor& t) {
  const Tensor* r = t.root();
  return r != &t && r->is_leaf();
}

}  // namespace

bool conflicts(const Dispatch& a, const Dispatch& b) {
  return any_overlap(a.writes, b.writes) || any_overlap(a.writes, b.reads) || any_overlap(a.reads, b.writes);
}

Plan build_plan(const Graph& g) {
  Plan plan;
  plan.dispatches.reserve(g.nodes().size());
  for (Tensor* t : g.nodes()) {
    if (t->op == OpKind::view || t->op == OpKind::none) continue;
    Dispatch d;
    d.nodes[0] = t;
    d.order = t->index;
    for (const Tensor* s : t->src)
      if (s) add_range(d.reads, tensor_range(*s));
    add_range(d.writes, tensor_range(*t));
    // a collective too: every rank must reach its all-reduces in the same order
    d.barrier = (t->flags & kTensorOutput) != 0 || writes_persistent(*t) || t->op == OpKind::all_reduce;
    plan.dispatches.push_back(std::move(d));
  }
  plan.stats.graph_nodes = plan.dispatches.size();
  return plan;
}

void assign_scratch(Plan& plan, uintptr_t base, size_t slot_bytes, int n_slots, uintptr_t shared,
                    const std::function<bool(const Dispatch&)>& in_shared) {
  int next = 0;
  for (Dispatch& d : plan.dispatches) {
    if (d.scratch_bytes == 0) continue;
    if (in_shared && in_shared(d)) {
      d.scratch = {shared, shared + d.scratch_bytes};
      d.writes.push_back(d.scratch);
      continue;
    }
    const uintptr_t b = base + static_cast<uintptr_t>(next) * slot_bytes;
    d.scratch = {b, b + d.scratch_bytes};
    d.writes.push_back(d.scratch);
    next = (next + 1) % std::max(n_slots, 1);
  }
}

void mark_packed_reuse(Plan& plan, const std::function<bool(const Dispatch&)>& in_shared,
                       const std::function<uintptr_t(const Dispatch&)>& packing) {
  uintptr_t last = 0;  // the shared region's last user's key so far
  for (Dispatch& d : plan.dispatches) {
    if (!in_shared(d)) continue;
    const uintptr_t key = packing(d);
    d.b_packed = key != 0 && key == last;
    last = key;
  }
}

void reorder(Plan& plan, int lookahead) {
  std::vector<Dispatch>& ds = plan.dispatches;
  const size_t n = ds.size();
  // The pending dispatches in order as a linked list (next[n] is the head), so taking a group out
  // costs its size, not a copy of everything pending (quadratic in an 8B pass's ~1,500 dispatches).
  std::vector<size_t> next(n + 1), prev(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    next[i] = i + 1 <= n ? i + 1 : n;  // node n is the list's sentinel
    prev[i] = i > 0 ? i - 1 : n;
  }
  next[n] = n > 0 ? 0 : n;
  prev[n] = n > 0 ? n - 1 : n;
  auto unlink = [&](size_t i) {
    next[prev[i]] = next[i];
    prev[next[i]] = prev[i];
  };
  std::vector<size_t> order;
  order.reserve(n);
  std::vector<size_t> group, skipped;
  uint64_t moved = 0;
  const size_t window = static_cast<size_t>(std::max(lookahead, 1));
  while (next[n] != n) {
    const size_t head = next[n];
    group.assign(1, head);
    skipped.clear();
    if (!ds[head].barrier) {
      size_t seen = 1;
      for (size_t j = next[head]; j != n && seen < window; j = next[j], ++seen) {
        const Dispatch& c = ds[j];
        if (c.barrier) break;  // nothing moves across a side effect
        // the latest skipped first: in a chain the candidate's producer is usually the one before it
        bool free = true;
        for (size_t s = skipped.size(); free && s-- > 0;) free = !conflicts(ds[skipped[s]], c);
        for (size_t m = 0; free && m < group.size(); ++m) free = !conflicts(ds[group[m]], c);
        if (free) {
          if (!skipped.empty()) ++moved;
          group.push_back(j);
        } else {
          skipped.push_back(j);
        }
      }
    }
    for (size_t i : group) unlink(i);
    order.insert(order.end(), group.begin(), group.end());
  }
  std::vector<Dispatch> out;
  out.reserve(n);
  for (size_t i : order) out.push_back(std::move(ds[i]));
  ds.swap(out);
  plan.stats.reordered = moved;
}

void build_dependencies(Plan& plan, bool concurrency) {
  const std::vector<Dispatch>& ds = plan.dispatches;
  const size_t n = ds.size();
  plan.deps.assign(n, {});
  plan.stats.edges = 0;
  std::vector<int> depth(n, 0);
  if (!concurrency) {
    for (size_t i = 1; i < n; ++i) {
      plan.deps[i].push_back(static_cast<int>(i - 1));
      depth[i] = depth[i - 1] + 1;
    }
  } else {
    // reach[i]: every dispatch i waits for, directly or not (bitset over earlier dispatches)
    const size_t words = (n + 63) / 64;
    std::vector<uint64_t> reach(n * words, 0);
    for (size_t i = 0; i < n; ++i) {
      // Latest first: a conflicting j already reached through a kept later one is implied, so only
      // the earlier dispatches not yet reached are tested for a conflict (in a chain of layers,
      // few: the pairwise test over every earlier dispatch cost ~6 ms a plan of an 8B serving step).
      // The scan walks the words of i's reach downwards, taking the highest unreached j each time.
      uint64_t* ri = &reach[i * words];
      for (size_t w = (i + 63) / 64; w-- > 0;) {
        const uint64_t below_i = w < i / 64 ? ~uint64_t{0} : (uint64_t{1} << (i % 64)) - 1;
        uint64_t open = ~ri[w] & below_i;  // earlier dispatches of word w not reached yet
        while (open) {
          const size_t j = w * 64 + static_cast<size_t>(63 - __builtin_clzll(open));
          open &= ~(uint64_t{1} << (j % 64));
          if (!conflicts(ds[j], ds[i])) continue;
          plan.deps[i].push_back(static_cast<int>(j));
          const uint64_t* rj = &reach[j * words];
          for (size_t v = 0; v <= w; ++v) ri[v] |= rj[v];  // rj holds dispatches before j only
          ri[w] |= uint64_t{1} << (j % 64);
          open &= ~ri[w];
          depth[i] = std::max(depth[i], depth[j] + 1);
        }
      }
      std::reverse(plan.deps[i].begin(), plan.deps[i].end());
    }
  }
  int max_depth = -1;
  for (size_t i = 0; i < n; ++i) {
    plan.dispatches[i].depth = depth[i];
    plan.stats.edges += plan.deps[i].size();
    max_depth = std::max(max_depth, depth[i]);
  }
  std::vector<uint64_t> per_depth(static_cast<size_t>(max_depth + 1), 0);
  for (int d : depth) ++per_depth[static_cast<size_t>(d)];
  plan.stats.groups = per_depth.size();
  plan.stats.group_hist = {};
  for (uint64_t size : per_depth) ++plan.stats.group_hist[static_cast<size_t>(group_hist_bucket(size))];
}

namespace {

std::string dispatch_label(const Dispatch& d) {
  const Tensor* a = d.anchor();
  std::string what = d.kind == FusedKind::none ? op_name(d.node()->op) : fused_kind_name(d.kind);
  return fmt::format("{} '{}' {}", what, a->name, shape_string(a->ne));
}

}  // namespace

std::string Plan::dump() const {
  std::string s = fmt::format("plan: {} dispatches from {} nodes, {} edges, {} groups, {} reordered\n",
                              dispatches.size(), stats.graph_nodes, stats.edges, stats.groups, stats.reordered);
  for (size_t i = 0; i < dispatches.size(); ++i) {
    const Dispatch& d = dispatches[i];
    s += fmt::format("{:5} {}{}{}{}{} depth {} deps [", i, dispatch_label(d), d.barrier ? " (barrier)" : "",
                     d.act_out_block > 0    ? fmt::format(" (writes activations q{})", d.act_out_block)
                     : d.act_out_block == -1 ? std::string(" (writes gemm_q's activation tiles)")
                     : d.act_out_block == -2 ? std::string(" (writes f16 activations)")
                                             : std::string(),
                     d.act_in ? " (activations handed over)" : "", d.b_packed ? " (activations packed)" : "", d.depth);
    if (i < deps.size())
      for (size_t k = 0; k < deps[i].size(); ++k) s += fmt::format("{}{}", k ? " " : "", deps[i][k]);
    s += "] reads";
    for (const ByteRange& r : d.reads) s += fmt::format(" {:#x}+{}", r.begin, r.end - r.begin);
    s += " writes";
    for (const ByteRange& r : d.writes) s += fmt::format(" {:#x}+{}", r.begin, r.end - r.begin);
    s += '\n';
  }
  return s;
}

std::string Plan::dot() const {
  std::string s = "digraph plan {\n  rankdir=TB;\n  node [shape=box, fontname=monospace, fontsize=10];\n";
  for (size_t i = 0; i < dispatches.size(); ++i) {
    const Dispatch& d = dispatches[i];
    std::string label = dispatch_label(d);
    std::replace(label.begin(), label.end(), '"', '\'');
    s += fmt::format("  d{} [label=\"{}: {}\"{}];\n", i, i, label,
                     d.kind != FusedKind::none ? ", style=filled, fillcolor=lightblue"
                                               : (d.barrier ? ", style=filled, fillcolor=lightgray" : ""));
  }
  for (size_t i = 0; i < deps.size(); ++i)
    for (int j : deps[i]) s += fmt::format("  d{} -> d{};\n", j, i);
  s += "}\n";
  return s;
}

}  // namespace loom::exec
