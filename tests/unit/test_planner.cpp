// Memory planner: a property test over random graphs (live blocks never overlap, offsets aligned,
// peak within bounds), the same graphs computed on the CPU backend with the planned arena against
// a run where every node keeps its own memory, and hand-built cases (in-place chains, outputs,
// views and writes keeping their source alive, operands that alias an in-place target).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "loom/backend.h"
#include "loom/cpu.h"
#include "loom/graph.h"
#include "loom/planner.h"

namespace loom {
namespace {

using LeafValues = std::vector<std::pair<Tensor*, std::vector<float>>>;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// ---- random graphs ---------------------------------------------------------------------------------

struct GenOptions {
  bool mul_mat = true;  // the CPU mul_mat kernel is not part of this suite's code under test
  int n_steps = 30;
  double output_prob = 0.12;
};

// Builds a random DAG of f32 ops (and a few i32 results) over random leafs, with the other ops'
// operands (masks, positions, keys) taken from the pool or made as leafs. The same seed builds
// the same graph, so two graphs can be compared node by node. Every tensor kept in pool_ has
// contiguous rows, so any op may take it.
class RandomGraph {
 public:
  RandomGraph(Graph& g, uint32_t seed, const GenOptions& opt) : g_(g), rng_(seed), opt_(opt) {}

  void build() {
    for (int i = 0; i < 3; ++i) pool_.push_back(leaf_f32(random_shape()));
    for (int s = 0; s < opt_.n_steps; ++s) step();
    ASSERT_TRUE(g_.status().ok()) << g_.status().to_string();
  }
  /// Marks a random subset of nodes (and always the last one) as outputs.
  void mark_random_outputs() {
    const auto& nodes = g_.nodes();
    for (Tensor* t : nodes)
      if (chance(opt_.output_prob)) g_.mark_output(t);
    if (!nodes.empty()) g_.mark_output(nodes.back());
  }
  const LeafValues& leaf_values() const { return leaf_values_; }

 private:
  int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  float rand_float(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  Shape random_shape() {
    static constexpr int64_t kNe0[] = {8, 16, 32, 64};
    return {kNe0[rand_int(0, 3)], rand_int(1, 4), rand_int(1, 2), 1};
  }
  Tensor* leaf_f32(const Shape& ne, float lo = -1.0f, float hi = 1.0f) {
    Tensor* t = g_.input(DType::f32, ne, "in" + std::to_string(leaf_values_.size()));
    std::vector<float> v(static_cast<size_t>(t->nelements()));
    for (float& x : v) x = rand_float(lo, hi);
    leaf_values_.emplace_back(t, std::move(v));
    return t;
  }
  Tensor* leaf_i32(const Shape& ne, std::vector<float> values) {
    Tensor* t = g_.input(DType::i32, ne, "idx" + std::to_string(leaf_values_.size()));
    leaf_values_.emplace_back(t, std::move(values));
    return t;
  }
  Tensor* pick() { return pool_[rand_int(0, static_cast<int>(pool_.size()) - 1)]; }
  // A pool tensor living in the arena (its root is a node), or nullptr.
  Tensor* pick_arena() {
    std::vector<Tensor*> c;
    for (Tensor* t : pool_)
      if (!t->root()->is_leaf()) c.push_back(t);
    return c.empty() ? nullptr : c[rand_int(0, static_cast<int>(c.size()) - 1)];
  }
  template <typename Pred>
  Tensor* find(Pred pred) {
    std::vector<Tensor*> c;
    for (Tensor* t : pool_)
      if (pred(t)) c.push_back(t);
    return c.empty() ? nullptr : c[rand_int(0, static_cast<int>(c.size()) - 1)];
  }
  Tensor* same_shape_or(Tensor* a, Tensor* fallback) {
    Tensor* b = find([&](Tensor* t) { return t->ne == a->ne; });
    return b ? b : fallback;
  }
  // Values in (1, 2]: safe divisors and multipliers that do not blow up over long chains.
  Tensor* positive(Tensor* a) { return scale(g_, soft_max(g_, a, nullptr, 1.0f), 1.0f, 1.0f); }
  // Row 0 of `a` repeated over all of a's rows (stride 0): an operand aliasing `a`'s block.
  Tensor* broadcast_row0(Tensor* a) { return view(g_, a, a->ne, {0, 0, 0, 0}, 0); }

  void add_result(Tensor* t) {
    ASSERT_NE(t, nullptr) << g_.status().to_string();
    ASSERT_TRUE(t->rows_contiguous());
    pool_.push_back(t);
  }

  void step() {
    Tensor* a = pick();
    switch (rand_int(0, 15)) {
      case 0: {  // unary
        switch (rand_int(0, 4)) {
          case 0: return add_result(silu(g_, a));
          case 1: return add_result(gelu(g_, a));
          case 2: return add_result(gelu_erf(g_, a));
          case 3: return add_result(scale(g_, a, rand_float(0.5f, 1.5f), rand_float(-0.5f, 0.5f)));
          default: return add_result(softcap(g_, a, rand_float(1.0f, 5.0f)));
        }
      }
      case 1: {  // row ops
        switch (rand_int(0, 3)) {
          case 0: return add_result(rms_norm(g_, a, 1e-5f));
          case 1: return add_result(norm(g_, a, 1e-5f));
          case 2: return add_result(soft_max(g_, a, nullptr, rand_float(0.5f, 2.0f)));
          default: {
            Tensor* mask = leaf_f32({a->ne[0], a->ne[1] + rand_int(0, 2), 1, 1}, -2.0f, 0.0f);
            return add_result(soft_max(g_, a, mask, 1.0f));
          }
        }
      }
      case 2:
      case 3: {  // add / sub / mul, b from several sources including aliases of a
        Tensor* b = nullptr;
        switch (rand_int(0, 4)) {
          case 0: b = same_shape_or(a, a); break;
          case 1: b = view(g_, a, {a->ne[0], 1, 1, 1}, a->nb, 0); break;  // row 0 of a
          case 2: b = a; break;
          case 3: b = leaf_f32({a->ne[0], 1, 1, 1}); break;
          default: b = broadcast_row0(a); break;
        }
        switch (rand_int(0, 2)) {
          case 0: return add_result(add(g_, a, b));
          case 1: return add_result(sub(g_, a, b));
          default: return add_result(mul(g_, a, chance(0.5) ? positive(b) : b));
        }
      }
      case 4: return add_result(div(g_, a, positive(same_shape_or(a, a))));
      case 5: {  // gated
        Tensor* up = chance(0.3) ? broadcast_row0(a) : same_shape_or(a, a);
        return add_result(chance(0.5) ? swiglu(g_, a, up) : geglu(g_, a, up));
      }
      case 6: {  // views: a block of rows, or a block of columns
        if (a->ne[1] > 1 && chance(0.6)) {
          const int r0 = rand_int(0, static_cast<int>(a->ne[1]) - 1);
          const int k = rand_int(1, static_cast<int>(a->ne[1]) - r0);
          return add_result(view(g_, a, {a->ne[0], k, a->ne[2], a->ne[3]}, a->nb, r0 * a->nb[1]));
        }
        const int c0 = rand_int(0, static_cast<int>(a->ne[0]) - 1);
        const int k = rand_int(1, static_cast<int>(a->ne[0]) - c0);
        return add_result(view(g_, a, {k, a->ne[1], a->ne[2], a->ne[3]}, a->nb, c0 * sizeof(float)));
      }
      case 7: {  // reshape (of a packed copy when a is not contiguous)
        Tensor* c = a->is_contiguous() ? a : cont(g_, a);
        if (c->ne[0] % 2 == 0 && chance(0.5))
          return add_result(reshape(g_, c, {c->ne[0] / 2, 2 * c->ne[1], c->ne[2], c->ne[3]}));
        return add_result(reshape(g_, c, {c->ne[0] * c->ne[1], c->ne[2], c->ne[3], 1}));
      }
      case 8:  // transposes and permutes, packed
        return add_result(cont(g_, chance(0.5) ? transpose(g_, a) : permute(g_, a, 1, 2, 0, 3)));
      case 9: {
        if (!opt_.mul_mat) return add_result(scale(g_, a, 0.5f));
        Tensor* w = leaf_f32({a->ne[0], rand_int(1, 4) * 4, 1, 1});
        return add_result(mul_mat(g_, w, a));
      }
      case 10: {  // concat along a random dim with a matching tensor (often a itself)
        const int dim = rand_int(0, 2);
        Tensor* b = find([&](Tensor* t) {
          for (int i = 0; i < kMaxDims; ++i)
            if (i != dim && t->ne[i] != a->ne[i]) return false;
          return true;
        });
        return add_result(concat(g_, a, b ? b : a, dim));
      }
      case 11: {  // set_rows into an arena tensor
        Tensor* dst = pick_arena();
        if (!dst) return add_result(silu(g_, a));
        Tensor* src = find([&](Tensor* t) {
          return t->ne[0] == dst->ne[0] && t->ne[1] <= dst->ne[1] && t->ne[2] == dst->ne[2] &&
                 t->ne[3] == dst->ne[3] && t->root() != dst->root();
        });
        if (!src) src = leaf_f32({dst->ne[0], rand_int(1, static_cast<int>(dst->ne[1])), dst->ne[2], dst->ne[3]});
        // distinct rows, so no two threads write the same row
        std::vector<float> rows(static_cast<size_t>(dst->ne[1]));
        std::iota(rows.begin(), rows.end(), 0.0f);
        std::shuffle(rows.begin(), rows.end(), rng_);
        rows.resize(static_cast<size_t>(src->ne[1]));
        Tensor* idx = leaf_i32({src->ne[1], 1, 1, 1}, rows);
        return add_result(set_rows(g_, dst, src, idx));
      }
      case 12: {  // cpy into an arena tensor, straight or through its transpose
        Tensor* dst = pick_arena();
        if (!dst || !dst->is_contiguous()) return add_result(gelu(g_, a));
        if (chance(0.5)) return add_result(cpy(g_, leaf_f32(dst->ne), dst));
        Tensor* t = transpose(g_, dst);
        Tensor* c = cpy(g_, leaf_f32(t->ne), t);
        ASSERT_NE(c, nullptr) << g_.status().to_string();
        return add_result(cont(g_, c));
      }
      case 13: {  // rope (runs in place), a as [head_dim, n_head, n_tokens]
        if (a->ne[0] < 2) return add_result(gelu(g_, a));
        RopeParams p{};
        p.n_dims = 2 * rand_int(1, static_cast<int>(a->ne[0]) / 2);
        p.mode = chance(0.5) ? RopeMode::neox : RopeMode::normal;
        p.n_ctx_orig = 64;
        p.freq_base = 10000.0f;
        p.freq_scale = chance(0.5) ? 1.0f : 0.5f;
        p.ext_factor = chance(0.3) ? 1.0f : 0.0f;
        p.attn_factor = 1.0f;
        p.beta_fast = 32.0f;
        p.beta_slow = 1.0f;
        std::vector<float> positions(static_cast<size_t>(a->ne[2]));
        for (float& x : positions) x = static_cast<float>(rand_int(0, 200));
        Tensor* pos = leaf_i32({a->ne[2], 1, 1, 1}, positions);
        Tensor* ff = chance(0.3) ? leaf_f32({p.n_dims / 2, 1, 1, 1}, 1.0f, 4.0f) : nullptr;
        return add_result(rope(g_, a, pos, ff, p));
      }
      case 14: {  // flash_attn, q = a as [d, n_q, n_head]; k and v from the pool when they fit
        Tensor* k = find([&](Tensor* t) { return t->ne[0] == a->ne[0] && a->ne[2] % t->ne[2] == 0 && t->ne[3] == a->ne[3]; });
        if (!k) k = leaf_f32({a->ne[0], rand_int(1, 6), chance(0.5) ? 1 : a->ne[2], a->ne[3]});
        Tensor* v = find([&](Tensor* t) { return t->ne[1] == k->ne[1] && t->ne[2] == k->ne[2] && t->ne[3] == k->ne[3]; });
        if (!v) v = leaf_f32({8 * rand_int(1, 2), k->ne[1], k->ne[2], k->ne[3]});
        Tensor* mask = chance(0.5) ? leaf_f32({k->ne[1], a->ne[1] + rand_int(0, 1), 1, 1}, -2.0f, 0.0f) : nullptr;
        const float cap = chance(0.3) ? 5.0f : 0.0f;
        return add_result(flash_attn(g_, a, k, v, mask, 1.0f / std::sqrt(static_cast<float>(a->ne[0])), cap));
      }
      default: {  // reductions and gathers
        switch (rand_int(0, 3)) {
          case 0: return add_result(sum_rows(g_, a));
          case 1: ASSERT_NE(argmax(g_, a), nullptr); return;
          case 2: ASSERT_NE(top_k(g_, a, rand_int(1, static_cast<int>(a->ne[0]))), nullptr); return;
          default: {
            const int k = rand_int(1, 5);
            std::vector<float> rows(static_cast<size_t>(k * a->ne[2] * a->ne[3]));
            for (float& r : rows) r = static_cast<float>(rand_int(0, static_cast<int>(a->ne[1]) - 1));
            return add_result(get_rows(g_, a, leaf_i32({k, a->ne[2], a->ne[3], 1}, rows)));
          }
        }
      }
    }
  }

  Graph& g_;
  std::mt19937 rng_;
  GenOptions opt_;
  std::vector<Tensor*> pool_;
  LeafValues leaf_values_;
};

// ---- checking a plan ---------------------------------------------------------------------------------

// Index of the node whose block `t` lives in, or -1 for leaf memory.
int owner_index(const Tensor* t) {
  const Tensor* r = t->root();
  return r->is_leaf() ? -1 : r->index;
}

bool owns_memory(const Tensor* t) { return !t->is_leaf() && t->view_src == nullptr; }

// Live range [defined, last read] of every owning node, worked out from the graph alone: a node
// is read by every node that names it, a view of it, or writes into it; outputs live to the end.
void liveness(const Graph& g, std::vector<int>& first, std::vector<int>& last) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  first.assign(n, -1);
  last.assign(n, -1);
  for (int i = 0; i < n; ++i)
    if (owns_memory(nodes[i])) first[i] = last[i] = i;
  for (int i = 0; i < n; ++i) {
    for (const Tensor* s : nodes[i]->src)
      if (s && owner_index(s) >= 0) last[owner_index(s)] = std::max(last[owner_index(s)], i);
    if (nodes[i]->view_src && owner_index(nodes[i]) >= 0)
      last[owner_index(nodes[i])] = std::max(last[owner_index(nodes[i])], i);
  }
  for (const Tensor* t : g.outputs())
    if (owner_index(t) >= 0) last[owner_index(t)] = n;
}

// Every property a plan must have.
void check_plan(const Graph& g, const MemoryPlan& plan, size_t alignment) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  ASSERT_EQ(plan.offsets.size(), static_cast<size_t>(n));
  ASSERT_EQ(plan.in_place_of.size(), static_cast<size_t>(n));
  ASSERT_EQ(plan.first_use.size(), static_cast<size_t>(n));
  ASSERT_EQ(plan.last_use.size(), static_cast<size_t>(n));
  std::vector<int> first, last;
  liveness(g, first, last);

  size_t total = 0;
  int n_in_place = 0;
  for (int i = 0; i < n; ++i) {
    const Tensor* t = nodes[i];
    if (!owns_memory(t)) {
      EXPECT_EQ(plan.offsets[i], MemoryPlan::kNoOffset) << "node " << i << " aliases memory";
      EXPECT_EQ(plan.in_place_of[i], -1);
      continue;
    }
    ASSERT_NE(plan.offsets[i], MemoryPlan::kNoOffset) << "node " << i;
    EXPECT_EQ(plan.offsets[i] % alignment, 0u) << "node " << i;
    const size_t size = align_up(t->nbytes(), alignment);
    total += size;
    EXPECT_LE(plan.offsets[i] + size, plan.peak_bytes) << "node " << i;
    EXPECT_EQ(plan.first_use[i], i);
    EXPECT_EQ(plan.last_use[i], last[i]) << "node " << i << " " << describe(*t);
    if (plan.in_place_of[i] >= 0) {
      ++n_in_place;
      const int a = plan.in_place_of[i];
      ASSERT_LT(a, i);
      EXPECT_EQ(t->src[0], nodes[a]);
      EXPECT_TRUE(op_can_run_in_place(*t));
      EXPECT_EQ(plan.offsets[i], plan.offsets[a]);
      EXPECT_EQ(last[a], i) << "node " << i << " overwrites node " << a << ", read later";
      EXPECT_FALSE(nodes[a]->flags & kTensorOutput);
      // Elementwise kernels write element e after reading element e of each operand; an operand
      // that reaches the block through another view would read values already overwritten.
      for (int s = 1; s < kMaxSrc; ++s) {
        const Tensor* o = t->src[s];
        if (o && o != nodes[a]) {
          EXPECT_NE(owner_index(o), a) << "node " << i << " " << op_name(t->op) << " runs in place of node " << a
                                       << " but operand " << s << " " << describe(*o) << " aliases it";
        }
      }
    }
  }
  EXPECT_EQ(plan.n_in_place, n_in_place);
  EXPECT_EQ(plan.total_bytes, total);
  EXPECT_LE(plan.peak_bytes, plan.total_bytes);

  // Two owning nodes alive at once occupy disjoint bytes, except a node computed in place of its
  // operand, which takes over the operand's block at the operand's last use.
  for (int i = 0; i < n; ++i) {
    if (!owns_memory(nodes[i])) continue;
    for (int j = i + 1; j < n && j <= last[i]; ++j) {
      if (!owns_memory(nodes[j])) continue;
      if (plan.in_place_of[j] == i && last[i] == j) continue;
      const size_t bi = plan.offsets[i], ei = bi + nodes[i]->nbytes();
      const size_t bj = plan.offsets[j], ej = bj + nodes[j]->nbytes();
      EXPECT_TRUE(ei <= bj || ej <= bi) << "nodes " << i << " [" << first[i] << ", " << last[i] << "] and " << j
                                        << " [" << first[j] << ", " << last[j] << "] share bytes [" << bi << ", "
                                        << ei << ") / [" << bj << ", " << ej << ")";
    }
  }
}

TEST(PlannerProperty, RandomGraphs) {
  const size_t alignments[] = {4, 64, 256};
  int in_place = 0, graphs_with_reuse = 0;
  for (uint32_t seed = 0; seed < 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Graph g;
    GenOptions opt;
    opt.n_steps = 10 + static_cast<int>(seed % 40);
    RandomGraph gen(g, seed, opt);
    gen.build();
    if (HasFatalFailure()) return;
    gen.mark_random_outputs();
    const size_t alignment = alignments[seed % 3];
    const MemoryPlan plan = plan_memory(g, alignment);
    check_plan(g, plan, alignment);
    if (HasFailure()) return;  // one failing graph says enough
    in_place += plan.n_in_place;
    graphs_with_reuse += plan.peak_bytes < plan.total_bytes;
  }
  // The generator must exercise reuse, or the checks above prove little.
  EXPECT_GT(in_place, 300);
  EXPECT_GT(graphs_with_reuse, 250);
}

TEST(PlannerProperty, EveryNodeAnOutputMeansNoReuse) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    Graph g;
    RandomGraph gen(g, seed, GenOptions{});
    gen.build();
    for (Tensor* t : g.nodes()) g.mark_output(t);
    const MemoryPlan plan = plan_memory(g, 64);
    check_plan(g, plan, 64);
    EXPECT_EQ(plan.n_in_place, 0);
    EXPECT_EQ(plan.peak_bytes, plan.total_bytes);
  }
}

// ---- planned arena vs. no reuse, computed ----------------------------------------------------------------

struct GraphRun {
  Graph graph;
  GraphAllocation alloc;
};

void compute(GraphRun& r, const LeafValues& values, Backend& backend) {
  auto alloc = allocate_graph(r.graph, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
  r.alloc = std::move(alloc.value());
  // Garbage in the arena, so a node reading memory nobody wrote shows up.
  if (r.alloc.arena) {
    ASSERT_TRUE(r.alloc.arena->fill(0, 0xA5, r.alloc.arena->size()).ok());
  }
  for (const auto& [t, v] : values) ASSERT_TRUE(tensor_from_floats(t, v.data(), static_cast<int64_t>(v.size())).ok());
  Status s = backend.compute(r.graph);
  ASSERT_TRUE(s.ok()) << s.to_string();
}

TEST(PlannerCompute, PlannedArenaMatchesNoReuse) {
  auto backend1 = make_cpu_backend(1);
  auto backend3 = make_cpu_backend(3);
  GenOptions opt;
  opt.mul_mat = false;  // no CPU mul_mat kernel in this tree yet; concat covers shape-changing nodes
  size_t values = 0, finite_nonzero = 0;
  int in_place = 0;
  for (uint32_t seed = 0; seed < 120; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    opt.n_steps = 10 + static_cast<int>(seed % 30);
    Backend& backend = seed % 2 ? *backend3 : *backend1;
    GraphRun planned, separate;
    RandomGraph gen_a(planned.graph, seed, opt);
    gen_a.build();
    gen_a.mark_random_outputs();
    RandomGraph gen_b(separate.graph, seed, opt);
    gen_b.build();
    if (HasFatalFailure()) return;
    for (Tensor* t : separate.graph.nodes()) separate.graph.mark_output(t);
    ASSERT_EQ(planned.graph.nodes().size(), separate.graph.nodes().size());

    compute(planned, gen_a.leaf_values(), backend);
    compute(separate, gen_b.leaf_values(), backend);
    if (HasFatalFailure()) return;
    EXPECT_EQ(separate.alloc.plan.n_in_place, 0);
    in_place += planned.alloc.plan.n_in_place;

    for (const Tensor* t : planned.graph.outputs()) {
      const Tensor* u = separate.graph.nodes()[t->index];
      ASSERT_EQ(t->op, u->op);
      auto x = tensor_to_floats(t);
      auto y = tensor_to_floats(u);
      ASSERT_TRUE(x.ok() && y.ok());
      ASSERT_EQ(x->size(), y->size());
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0)
          << "node " << t->index << " " << op_name(t->op) << " " << describe(*t) << " differs";
      for (float v : *x) finite_nonzero += std::isfinite(v) && v != 0.0f;
      values += x->size();
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(in_place, 100);
  // The comparison means something only if the data does.
  EXPECT_GT(finite_nonzero, values * 9 / 10) << finite_nonzero << " of " << values;
}

// ---- specific cases ------------------------------------------------------------------------------------------

// x values with few significant bits, so sums and products below are exact.
std::vector<float> small_values(size_t n, float step = 0.25f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = step * static_cast<float>(static_cast<int>(i % 13) - 6);
  return v;
}

class PlannerCase : public ::testing::Test {
 protected:
  void run(const LeafValues& values) {
    ASSERT_TRUE(g_.status().ok()) << g_.status().to_string();
    auto alloc = allocate_graph(g_, cpu_buffer_type());
    ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
    alloc_ = std::move(alloc.value());
    check_plan(g_, alloc_.plan, cpu_buffer_type().alignment());
    if (alloc_.arena) {
      ASSERT_TRUE(alloc_.arena->fill(0, 0xA5, alloc_.arena->size()).ok());
    }
    for (const auto& [t, v] : values)
      ASSERT_TRUE(tensor_from_floats(t, v.data(), static_cast<int64_t>(v.size())).ok());
    Status s = backend_->compute(g_);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  std::vector<float> floats(const Tensor* t) {
    auto r = tensor_to_floats(t);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : std::vector<float>{};
  }
  const MemoryPlan& plan() const { return alloc_.plan; }
  bool bytes_overlap(const Tensor* a, const Tensor* b) const {
    const size_t oa = plan().offsets[a->index], ob = plan().offsets[b->index];
    return oa < ob + b->nbytes() && ob < oa + a->nbytes();
  }

  Graph g_;
  GraphAllocation alloc_;
  std::unique_ptr<Backend> backend_ = make_cpu_backend(3);
};

TEST_F(PlannerCase, UnaryChainRunsInPlace) {
  Tensor* x = g_.input(DType::f32, {256, 4, 1, 1}, "x");  // 4096 bytes
  Tensor* a1 = silu(g_, x);
  Tensor* a2 = scale(g_, a1, 0.5f, 0.25f);
  Tensor* a3 = gelu(g_, a2);
  Tensor* a4 = softcap(g_, a3, 3.0f);
  Tensor* a5 = gelu_erf(g_, a4);
  Tensor* a6 = rms_norm(g_, a5, 1e-6f);
  g_.mark_output(a6);
  const std::vector<float> xv = small_values(1024);
  run({{x, xv}});
  EXPECT_EQ(plan().n_in_place, 5);
  for (const Tensor* t : {a2, a3, a4, a5, a6}) EXPECT_EQ(plan().in_place_of[t->index], t->index - 1);
  EXPECT_EQ(plan().in_place_of[a1->index], -1);  // its operand is a leaf
  EXPECT_EQ(plan().peak_bytes, 4096u);           // one tensor for the whole chain
  EXPECT_EQ(plan().total_bytes, 6u * 4096u);

  const std::vector<float> out = floats(a6);
  ASSERT_EQ(out.size(), 1024u);
  for (int r = 0; r < 4; ++r) {
    std::vector<double> y(256);
    double ss = 0.0;
    for (int i = 0; i < 256; ++i) {
      double v = xv[r * 256 + i];
      v = v / (1.0 + std::exp(-v));
      v = v * 0.5 + 0.25;
      v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
      v = 3.0 * std::tanh(v / 3.0);
      v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
      y[i] = v;
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / 256 + 1e-6);
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(out[r * 256 + i], y[i] * inv, 2e-5) << r << "," << i;
  }
}

TEST_F(PlannerCase, NoInPlaceWhenTheOperandIsReadLater) {
  Tensor* x = g_.input(DType::f32, {64, 2, 1, 1}, "x");
  Tensor* a = silu(g_, x);
  Tensor* b = scale(g_, a, 2.0f);  // a is still needed by c
  Tensor* c = add(g_, b, a);
  g_.mark_output(c);
  const std::vector<float> xv = small_values(128);
  run({{x, xv}});
  EXPECT_EQ(plan().in_place_of[b->index], -1);
  EXPECT_FALSE(bytes_overlap(a, b));
  EXPECT_EQ(plan().in_place_of[c->index], b->index);  // b's last reader is c
  const std::vector<float> out = floats(c);
  for (size_t i = 0; i < out.size(); ++i) {
    const float s = xv[i] / (1.0f + std::exp(-xv[i]));
    EXPECT_NEAR(out[i], 3.0f * s, 1e-6f);
  }
}

TEST_F(PlannerCase, OutputsAreNeverReused) {
  Tensor* x = g_.input(DType::f32, {128, 2, 1, 1}, "x");
  Tensor* a = silu(g_, x);
  g_.mark_output(a);
  Tensor* b = scale(g_, a, -1.0f, 0.5f);  // in place of a would clobber the output
  Tensor* c = gelu(g_, b);
  Tensor* d = concat(g_, c, c, 1);
  Tensor* e = scale(g_, d, 2.0f);
  Tensor* f = sum_rows(g_, e);
  g_.mark_output(f);
  const std::vector<float> xv = small_values(256);
  run({{x, xv}});
  EXPECT_EQ(plan().last_use[a->index], static_cast<int32_t>(g_.nodes().size()));
  EXPECT_EQ(plan().in_place_of[b->index], -1);
  for (const Tensor* t : {b, c, d, e, f}) EXPECT_FALSE(bytes_overlap(a, t)) << describe(*t);
  EXPECT_GT(plan().n_in_place, 0);  // c, e reuse their operands' blocks
  const std::vector<float> av = floats(a);
  for (size_t i = 0; i < av.size(); ++i) EXPECT_FLOAT_EQ(av[i], xv[i] / (1.0f + std::exp(-xv[i])));
  const std::vector<float> fv = floats(f);
  ASSERT_EQ(fv.size(), 4u);
  for (int r = 0; r < 4; ++r) {  // rows 0-1 and 2-3 of the concat are the same rows of c
    double s = 0.0;
    for (int i = 0; i < 128; ++i) {
      const double v = -av[(r % 2) * 128 + i] + 0.5;
      s += 2.0 * 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    }
    EXPECT_NEAR(fv[r], s, 1e-4) << r;
  }
}

TEST_F(PlannerCase, ViewsKeepTheirSourceAlive) {
  Tensor* x = g_.input(DType::f32, {64, 4, 1, 1}, "x");
  Tensor* y = g_.input(DType::f32, {64, 2, 1, 1}, "y");
  Tensor* a = scale(g_, x, 3.0f);
  Tensor* v = view(g_, a, {64, 2, 1, 1}, a->nb, 2 * a->nb[1]);  // rows 2-3 of a
  Tensor* b = scale(g_, y, 0.5f);  // allocated while a is only reachable through v
  Tensor* c = scale(g_, b, 2.0f, 1.0f);
  Tensor* d = add(g_, c, v);
  g_.mark_output(d);
  const std::vector<float> xv = small_values(256), yv = small_values(128, 0.5f);
  run({{x, xv}, {y, yv}});
  EXPECT_EQ(plan().last_use[a->index], d->index);
  EXPECT_EQ(plan().offsets[v->index], MemoryPlan::kNoOffset);
  EXPECT_FALSE(bytes_overlap(a, b));
  EXPECT_FALSE(bytes_overlap(a, c));
  const std::vector<float> out = floats(d);
  ASSERT_EQ(out.size(), 128u);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out[i], (yv[i] * 0.5f * 2.0f + 1.0f) + 3.0f * xv[128 + i]) << i;
}

TEST_F(PlannerCase, WritesKeepTheirTargetAlive) {
  Tensor* x = g_.input(DType::f32, {16, 6, 1, 1}, "x");
  Tensor* src = g_.input(DType::f32, {16, 2, 1, 1}, "src");
  Tensor* idx = g_.input(DType::i32, {2, 1, 1, 1}, "idx");
  Tensor* k = scale(g_, x, 1.0f, 100.0f);  // the arena tensor written into
  Tensor* other = scale(g_, x, -1.0f);     // allocated while k waits for the write
  Tensor* w = set_rows(g_, k, silu(g_, src), idx);
  Tensor* sum = add(g_, other, w);
  g_.mark_output(sum);
  const std::vector<float> xv = small_values(96), sv = small_values(32, 1.0f);
  run({{x, xv}, {src, sv}, {idx, {4, 1}}});
  EXPECT_GE(plan().last_use[k->index], w->index);
  EXPECT_FALSE(bytes_overlap(k, other));
  const std::vector<float> out = floats(sum);
  for (int r = 0; r < 6; ++r)
    for (int i = 0; i < 16; ++i) {
      float kv = xv[r * 16 + i] + 100.0f;
      if (r == 4 || r == 1) {
        const float s = sv[(r == 4 ? 0 : 1) * 16 + i];
        kv = s / (1.0f + std::exp(-s));
      }
      EXPECT_FLOAT_EQ(out[r * 16 + i], -xv[r * 16 + i] + kv) << r << "," << i;
    }
}

// An operand that reads the in-place target through another view (here: row 0 broadcast over
// every row) would see rows already overwritten, so such nodes must get their own block.
TEST_F(PlannerCase, NoInPlaceWhenAnotherOperandAliasesTheTarget) {
  Tensor* x = g_.input(DType::f32, {16, 4, 1, 1}, "x");
  Tensor* a = scale(g_, x, 1.0f);
  Tensor* row0 = view(g_, a, {16, 1, 1, 1}, a->nb, 0);
  Tensor* s = add(g_, a, row0);
  Tensor* b = scale(g_, x, 2.0f);
  Tensor* up = view(g_, b, b->ne, {0, 0, 0, 0}, 0);  // row 0 of b on every row
  Tensor* gl = swiglu(g_, b, up);
  g_.mark_output(s);
  g_.mark_output(gl);
  const std::vector<float> xv = small_values(64);
  run({{x, xv}});
  EXPECT_EQ(plan().in_place_of[s->index], -1);
  EXPECT_EQ(plan().in_place_of[gl->index], -1);
  const std::vector<float> sv = floats(s), gv = floats(gl);
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(sv[r * 16 + i], xv[r * 16 + i] + xv[i]) << r << "," << i;
      const float g = 2.0f * xv[r * 16 + i];
      EXPECT_FLOAT_EQ(gv[r * 16 + i], g / (1.0f + std::exp(-g)) * 2.0f * xv[i]) << r << "," << i;
    }
}

TEST_F(PlannerCase, SameOperandTwiceMayRunInPlace) {
  Tensor* x = g_.input(DType::f32, {16, 4, 1, 1}, "x");
  Tensor* a = scale(g_, x, 1.0f, 1.0f);
  Tensor* m = mul(g_, a, a);  // reads element e of a twice before writing element e
  g_.mark_output(m);
  const std::vector<float> xv = small_values(64);
  run({{x, xv}});
  EXPECT_EQ(plan().in_place_of[m->index], a->index);
  const std::vector<float> out = floats(m);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], (xv[i] + 1.0f) * (xv[i] + 1.0f)) << i;
}

TEST(Planner, FreedBlocksAreReused) {
  // Three independent [256] results, each dead right after its consumer: the arena holds at most
  // the live pair, never all of them.
  Graph g;
  Tensor* x = g.input(DType::f32, {256, 1, 1, 1}, "x");
  Tensor* acc = nullptr;
  for (int i = 0; i < 6; ++i) {
    Tensor* t = sum_rows(g, concat(g, silu(g, x), x, 0));  // silu and concat die at once
    acc = acc ? add(g, acc, t) : t;
  }
  g.mark_output(acc);
  ASSERT_TRUE(g.status().ok());
  const MemoryPlan plan = plan_memory(g, 64);
  check_plan(g, plan, 64);
  // silu (1024 B) + concat (2048 B) + sum/accumulator (64 B each) at most
  EXPECT_LE(plan.peak_bytes, 1024u + 2048u + 3 * 64u);
  EXPECT_GT(plan.total_bytes, 6 * (1024u + 2048u));
}

}  // namespace
}  // namespace loom
