// The executor's backend-agnostic passes: byte ranges, dependencies (RAW/WAR/WAW, transitive
// reduction), reorder, fusion matching. No kernels run: plans only look at addresses.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_map>

#include "loom/comm.h"
#include "loom/exec_plan.h"
#include "loom/cpu.h"
#include "loom/planner.h"

namespace loom {
namespace {

using exec::ByteRange;
using exec::Dispatch;
using exec::Plan;

// A dispatch over fake address ranges.
Dispatch fake(std::vector<ByteRange> reads, std::vector<ByteRange> writes, bool barrier = false) {
  Dispatch d;
  d.reads = std::move(reads);
  d.writes = std::move(writes);
  d.barrier = barrier;
  return d;
}

constexpr ByteRange r(uintptr_t b, uintptr_t e) { return {b, e}; }

TEST(ExecPlan, TensorRangeOfViewIsItsOwnExtent) {
  Graph g;
  Tensor* a = g.input(DType::f32, {8, 4, 2, 1}, "a");
  Tensor* row = view(g, a, {8, 1, 1, 1}, a->nb, a->nb[1] * 2);  // row 2 of matrix 0
  Tensor* t = permute(g, a, 1, 0, 2, 3);
  ASSERT_TRUE(g.status().ok());
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok());
  const ByteRange whole = exec::tensor_range(*a);
  EXPECT_EQ(whole.end - whole.begin, 8u * 4 * 2 * 4);
  const ByteRange rr = exec::tensor_range(*row);
  EXPECT_EQ(rr.begin, whole.begin + 2 * 32);
  EXPECT_EQ(rr.end - rr.begin, 32u);
  const ByteRange pr = exec::tensor_range(*t);  // a permutation spans the same bytes
  EXPECT_EQ(pr.begin, whole.begin);
  EXPECT_EQ(pr.end, whole.end);
}

TEST(ExecPlan, DependenciesFollowConflictsOnly) {
  Plan p;
  p.dispatches.push_back(fake({r(0, 100)}, {r(100, 200)}));    // 0: reads X writes A
  p.dispatches.push_back(fake({r(0, 100)}, {r(200, 300)}));    // 1: reads X writes B  (read-read: free)
  p.dispatches.push_back(fake({r(150, 160)}, {r(300, 400)}));  // 2: RAW on part of A
  p.dispatches.push_back(fake({r(500, 600)}, {r(0, 10)}));     // 3: WAR on X (0 and 1 read it)
  p.dispatches.push_back(fake({}, {r(350, 360)}));             // 4: WAW with 2
  exec::build_dependencies(p, true);
  EXPECT_TRUE(p.deps[0].empty());
  EXPECT_TRUE(p.deps[1].empty());
  EXPECT_EQ(p.deps[2], (std::vector<int>{0}));
  EXPECT_EQ(p.deps[3], (std::vector<int>{0, 1}));
  EXPECT_EQ(p.deps[4], (std::vector<int>{2}));
  EXPECT_EQ(p.stats.edges, 4u);
  EXPECT_EQ(p.dispatches[2].depth, 1);
  EXPECT_EQ(p.dispatches[4].depth, 2);
  // depths: {0,1,3} at 0? 3 depends on 0 and 1 -> depth 1; groups: depth0 {0,1}, depth1 {2,3}, depth2 {4}
  EXPECT_EQ(p.stats.groups, 3u);
  EXPECT_EQ(p.stats.group_hist[1], 2u);  // two groups of size 2
  EXPECT_EQ(p.stats.group_hist[0], 1u);  // one of size 1

  exec::build_dependencies(p, false);  // a chain
  for (size_t i = 1; i < p.deps.size(); ++i) EXPECT_EQ(p.deps[i], (std::vector<int>{static_cast<int>(i - 1)}));
}

TEST(ExecPlan, TransitiveReductionDropsImpliedEdges) {
  Plan p;
  p.dispatches.push_back(fake({}, {r(0, 10)}));                 // 0 writes A
  p.dispatches.push_back(fake({r(0, 10)}, {r(10, 20)}));        // 1: A -> B
  p.dispatches.push_back(fake({r(0, 10), r(10, 20)}, {r(20, 30)}));  // 2 reads A and B
  exec::build_dependencies(p, true);
  EXPECT_EQ(p.deps[2], (std::vector<int>{1}));  // 0 -> 2 is implied by 0 -> 1 -> 2
  EXPECT_EQ(p.stats.edges, 2u);
}

// On random plans (300 dispatches over 40 buffers) the dependencies are exactly the transitive
// reduction of the conflict relation, computed here the plain way: the closure of every conflict,
// then i's edges to the j it needs that no k between them (needed by i, needing j) implies.
TEST(ExecPlan, DependenciesAreTheReductionOfEveryConflict) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 4; ++trial) {
    Plan p;
    const int n = 300, buffers = 40;
    std::uniform_int_distribution<int> buf(0, buffers - 1), count(0, 3);
    for (int i = 0; i < n; ++i) {
      std::vector<ByteRange> reads, writes;
      for (int k = count(rng); k > 0; --k) {
        const uintptr_t b = static_cast<uintptr_t>(buf(rng)) * 64;
        reads.push_back(r(b, b + 64));
      }
      const uintptr_t w = static_cast<uintptr_t>(buf(rng)) * 64;
      writes.push_back(r(w, w + 32 + 32 * (trial % 2)));
      p.dispatches.push_back(fake(reads, writes));
    }
    exec::build_dependencies(p, true);
    // closure[i][j]: j must finish before i (conflicts, transitively)
    std::vector<std::vector<bool>> closure(n, std::vector<bool>(n, false));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j)
        if (exec::conflicts(p.dispatches[static_cast<size_t>(j)], p.dispatches[static_cast<size_t>(i)])) {
          closure[i][j] = true;
          for (int k = 0; k < j; ++k)
            if (closure[j][k]) closure[i][k] = true;
        }
    for (int i = 0; i < n; ++i) {
      std::vector<int> want;  // the closure's reduction: j not implied by another k > j that i needs
      for (int j = 0; j < i; ++j) {
        if (!closure[i][j]) continue;
        bool implied = false;
        for (int k = j + 1; k < i && !implied; ++k) implied = closure[i][k] && closure[k][j];
        if (!implied) want.push_back(j);
      }
      ASSERT_EQ(p.deps[static_cast<size_t>(i)], want) << "trial " << trial << " dispatch " << i;
    }
  }
}

// The reorder pass against its definition, written the plain way: repeatedly, the first pending
// dispatch and every later one within the window that conflicts with none of those skipped or
// taken before it, stopping at a barrier.
std::vector<size_t> reorder_reference(const std::vector<Dispatch>& ds, size_t lookahead) {
  std::vector<size_t> pending(ds.size()), order;
  for (size_t i = 0; i < ds.size(); ++i) pending[i] = i;
  while (!pending.empty()) {
    std::vector<size_t> group{pending[0]}, skipped;
    for (size_t j = 1; j < std::min(pending.size(), lookahead) && !ds[pending[0]].barrier; ++j) {
      const Dispatch& c = ds[pending[j]];
      if (c.barrier) break;
      bool free = true;
      for (size_t s : skipped) free = free && !exec::conflicts(ds[s], c);
      for (size_t g : group) free = free && !exec::conflicts(ds[g], c);
      (free ? group : skipped).push_back(pending[j]);
    }
    order.insert(order.end(), group.begin(), group.end());
    std::vector<size_t> rest;
    for (size_t p : pending)
      if (std::find(group.begin(), group.end(), p) == group.end()) rest.push_back(p);
    pending.swap(rest);
  }
  return order;
}

TEST(ExecPlan, ReorderMatchesItsDefinition) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> buf(0, 29), count(0, 2), barrier(0, 40);
  for (size_t lookahead : {1u, 2u, 8u, 64u}) {
    Plan p;
    for (int i = 0; i < 400; ++i) {
      std::vector<ByteRange> reads;
      for (int k = count(rng); k > 0; --k) {
        const uintptr_t b = static_cast<uintptr_t>(buf(rng)) * 64;
        reads.push_back(r(b, b + 64));
      }
      const uintptr_t w = static_cast<uintptr_t>(buf(rng)) * 64;
      p.dispatches.push_back(fake(reads, {r(w, w + 64)}, barrier(rng) == 0));
      p.dispatches.back().order = i;
    }
    const std::vector<size_t> want = reorder_reference(p.dispatches, lookahead);
    exec::reorder(p, static_cast<int>(lookahead));
    ASSERT_EQ(p.dispatches.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(p.dispatches[i].order, static_cast<int>(want[i])) << "lookahead " << lookahead << " at " << i;
  }
}

TEST(ExecPlan, ReorderPullsIndependentWorkForward) {
  Plan p;
  p.dispatches.push_back(fake({}, {r(0, 10)}));          // A
  p.dispatches.push_back(fake({r(0, 10)}, {r(10, 20)})); // B needs A
  p.dispatches.push_back(fake({}, {r(20, 30)}));         // C independent
  p.dispatches.push_back(fake({r(20, 30)}, {r(30, 40)}));// D needs C
  for (int i = 0; i < 4; ++i) p.dispatches[i].order = i;
  exec::reorder(p, 64);
  std::vector<int> order;
  for (const Dispatch& d : p.dispatches) order.push_back(d.order);
  EXPECT_EQ(order, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(p.stats.reordered, 1u);

  // A barrier stops the look-ahead: C cannot move above it
  Plan q;
  q.dispatches.push_back(fake({}, {r(0, 10)}));
  q.dispatches.push_back(fake({r(0, 10)}, {r(10, 20)}, /*barrier=*/true));
  q.dispatches.push_back(fake({}, {r(20, 30)}));
  for (int i = 0; i < 3; ++i) q.dispatches[i].order = i;
  exec::reorder(q, 64);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(q.dispatches[i].order, i);
  EXPECT_EQ(q.stats.reordered, 0u);

  // the window limits how far the look-ahead reaches
  Plan w;
  w.dispatches.push_back(fake({}, {r(0, 10)}));
  w.dispatches.push_back(fake({r(0, 10)}, {r(10, 20)}));
  w.dispatches.push_back(fake({r(10, 20)}, {r(20, 30)}));
  w.dispatches.push_back(fake({}, {r(40, 50)}));  // independent but 3 ahead
  for (int i = 0; i < 4; ++i) w.dispatches[i].order = i;
  exec::reorder(w, 2);
  EXPECT_EQ(w.dispatches[1].order, 1);
}

class AcceptAll final : public exec::FusionSupport {
 public:
  bool supports_fused(const Dispatch&) const override { return true; }
};
class AcceptNone final : public exec::FusionSupport {
 public:
  bool supports_fused(const Dispatch&) const override { return false; }
};

// A LLaMA-like layer: norm*w, gate/up + swiglu, down, residual add, norm*w, projection + bias. With
// `comm`, the down product is one rank's partial, summed by an all_reduce before the residual add
// (tensor parallelism's layout); extra_reader_of_sum gives that sum a second reader.
struct Layer {
  Graph g;
  Tensor *x, *h, *glu, *down, *sum = nullptr, *y, *z, *out;
  GraphAllocation alloc;
  explicit Layer(bool extra_reader_of_norm = false, Communicator* comm = nullptr, bool extra_reader_of_sum = false) {
    const int64_t n = 64, ff = 128;
    x = g.input(DType::f32, {n, 1, 1, 1}, "x");
    Tensor* w1 = g.weight(DType::f32, {n, 1, 1, 1}, "w1");
    Tensor* w2 = g.weight(DType::f32, {n, 1, 1, 1}, "w2");
    Tensor* wg = g.weight(DType::f16, {n, ff, 1, 1}, "wg");
    Tensor* wu = g.weight(DType::f16, {n, ff, 1, 1}, "wu");
    Tensor* wd = g.weight(DType::f16, {ff, n, 1, 1}, "wd");
    Tensor* wo = g.weight(DType::f16, {n, n, 1, 1}, "wo");
    Tensor* bias = g.weight(DType::f32, {n, 1, 1, 1}, "bias");
    Tensor* norm = rms_norm(g, x, 1e-5f);
    h = mul(g, norm, w1);
    glu = swiglu(g, mul_mat(g, wg, h), mul_mat(g, wu, h));
    down = mul_mat(g, wd, glu);
    if (comm) sum = all_reduce(g, down, comm);
    y = add(g, x, comm ? sum : down);
    z = mul(g, rms_norm(g, y, 1e-5f), w2);
    out = add(g, mul_mat(g, wo, z), bias);
    if (extra_reader_of_norm) out = add(g, out, norm);  // the first norm is read twice now
    if (extra_reader_of_sum) out = add(g, out, sum);
    g.mark_output(out);
    auto a = allocate_graph(g, cpu_buffer_type());
    EXPECT_TRUE(a.ok()) << a.status().message();
    if (a.ok()) alloc = std::move(a.value());
  }
};

TEST(ExecPlan, FusionMatchesTheLayerPatterns) {
  Layer l;
  ASSERT_TRUE(l.g.status().ok());
  Plan p = exec::build_plan(l.g);
  EXPECT_EQ(p.dispatches.size(), 11u);  // norm mul mm mm swiglu mm add norm mul mm add
  exec::fuse(p, l.g, AcceptAll{});
  using K = FusedKind;
  EXPECT_EQ(p.stats.fusions[static_cast<int>(K::rms_norm_mul)], 1u);
  EXPECT_EQ(p.stats.fusions[static_cast<int>(K::glu_mat_vec)], 1u);
  EXPECT_EQ(p.stats.fusions[static_cast<int>(K::add_rms_norm_mul)], 1u);
  EXPECT_EQ(p.stats.fusions[static_cast<int>(K::mat_vec_bias)], 1u);
  // norm*w, glu, down, add+norm*w, proj+bias
  ASSERT_EQ(p.dispatches.size(), 5u);
  EXPECT_EQ(p.dispatches[0].kind, K::rms_norm_mul);
  EXPECT_EQ(p.dispatches[1].kind, K::glu_mat_vec);
  EXPECT_EQ(p.dispatches[2].kind, K::none);
  EXPECT_EQ(p.dispatches[3].kind, K::add_rms_norm_mul);
  EXPECT_EQ(p.dispatches[3].nodes[0], l.y);  // the residual is kept
  EXPECT_EQ(p.dispatches[3].writes.size(), 2u);
  EXPECT_EQ(p.dispatches[4].anchor(), l.out);
  // the fused glu reads h and both weights, and writes only its result
  EXPECT_EQ(p.dispatches[1].writes.size(), 1u);
  EXPECT_EQ(p.dispatches[1].writes[0].begin, exec::tensor_range(*l.glu).begin);
  EXPECT_EQ(p.dispatches[1].reads.size(), 4u);  // wg, h, wu, h
  exec::build_dependencies(p, true);
  for (size_t i = 1; i < p.dispatches.size(); ++i) EXPECT_FALSE(p.deps[i].empty()) << i;
  EXPECT_NE(p.dot().find("glu_mat_vec"), std::string::npos);
  EXPECT_NE(p.dump().find("add_rms_norm_mul"), std::string::npos);
}

// A residual add, norm and mul over 4 rows whose intermediates are each read once: the planner may
// place the sum, or the norm's output, on the bytes of the add's inputs (the last layer's whole chain
// runs in place). exec::output_shares_bytes sees every overlap of the fused dispatch's output with
// its inputs or the sum it writes, and none with intermediates it never writes (the CUDA backend then
// keeps f32 instead of handing the mat-vecs int8 rows laid out across other rows' bytes).
TEST(ExecPlan, OutputSharingBytesWithInputsIsSeen) {
  for (const bool sum_read_later : {false, true}) {
    Graph g;
    const int64_t n = 64, rows = 4;
    Tensor* x0 = g.input(DType::f32, {n, rows, 1, 1}, "x0");
    Tensor* f0 = g.input(DType::f32, {n, rows, 1, 1}, "f0");
    Tensor* w = g.weight(DType::f32, {n, 1, 1, 1}, "w");
    Tensor* x = add(g, x0, x0);  // intermediates, as a layer's residual and FFN output are
    Tensor* ffn = add(g, f0, f0);
    Tensor* sum = add(g, x, ffn);
    Tensor* norm = rms_norm(g, sum, 1e-5f);
    Tensor* y = mul(g, norm, w);
    g.mark_output(sum_read_later ? add(g, y, sum) : y);
    auto alloc = allocate_graph(g, cpu_buffer_type());
    ASSERT_TRUE(alloc.ok()) << alloc.status().message();
    Plan p = exec::build_plan(g);
    exec::fuse(p, g, AcceptAll{});
    const auto it = std::find_if(p.dispatches.begin(), p.dispatches.end(),
                                 [](const Dispatch& d) { return d.kind == FusedKind::add_rms_norm_mul; });
    ASSERT_NE(it, p.dispatches.end());
    ASSERT_EQ(it->anchor(), y);
    const exec::ByteRange yr = exec::tensor_range(*y);
    auto meet = [&](const Tensor* t) {
      const exec::ByteRange tr = exec::tensor_range(*t);
      return tr.begin < yr.end && yr.begin < tr.end;
    };
    // the norm's output (an intermediate, in registers) does not count, wherever it was planned
    (void)norm;
    EXPECT_EQ(exec::output_shares_bytes(*it, y), meet(sum) || meet(x) || meet(ffn) || meet(w))
        << "sum read later: " << sum_read_later;
    if (sum_read_later) {
      EXPECT_FALSE(meet(sum));  // the sum outlives y: never the same bytes
    }
  }
  // By hand: bytes of its own, then y over an intermediate, the sum, an input, across two tensors.
  Graph g;
  Tensor* a = g.input(DType::f32, {8, 2, 1, 1}, "a");
  Tensor* b = g.input(DType::f32, {8, 2, 1, 1}, "b");
  Tensor* w = g.weight(DType::f32, {8, 1, 1, 1}, "w");
  Tensor* sum = add(g, a, b);
  Tensor* norm = rms_norm(g, sum, 1e-5f);
  Tensor* y = mul(g, norm, w);
  alignas(16) static float bytes[8][16];  // a row of 16 floats: one [8, 2] tensor
  a->data = bytes[0], b->data = bytes[1], w->data = bytes[2], sum->data = bytes[3], norm->data = bytes[4];
  y->data = bytes[6];
  Dispatch d;
  d.kind = FusedKind::add_rms_norm_mul;
  d.nodes = {sum, norm, y, nullptr, nullptr};
  d.kept = {true, false, true, false, false};  // the sum and y written, the norm in registers
  EXPECT_FALSE(exec::output_shares_bytes(d, y));
  norm->data = bytes[6];  // the norm's output planned in place of y: never written, so no matter
  EXPECT_FALSE(exec::output_shares_bytes(d, y));
  d.kept[1] = true;  // were it written, it would
  EXPECT_TRUE(exec::output_shares_bytes(d, y));
  d.kept[1] = false;
  norm->data = bytes[4];
  y->data = bytes[3];  // y over the sum
  EXPECT_TRUE(exec::output_shares_bytes(d, y));
  y->data = bytes[1];  // y over an input of the add
  EXPECT_TRUE(exec::output_shares_bytes(d, y));
  y->data = bytes[2] + 8;  // past w's 8 floats, into the sum's first ones
  EXPECT_TRUE(exec::output_shares_bytes(d, y));
  y->data = bytes[6];
  EXPECT_FALSE(exec::output_shares_bytes(d, y));
}

TEST(ExecPlan, FusionRespectsTheBackendAndExtraReaders) {
  Layer l;
  Plan p = exec::build_plan(l.g);
  exec::fuse(p, l.g, AcceptNone{});
  EXPECT_EQ(p.dispatches.size(), 11u);
  for (uint64_t f : p.stats.fusions) EXPECT_EQ(f, 0u);

  Layer shared(/*extra_reader_of_norm=*/true);
  Plan q = exec::build_plan(shared.g);
  exec::fuse(q, shared.g, AcceptAll{});
  // the first rms_norm has two readers: it must stay its own dispatch
  EXPECT_EQ(q.stats.fusions[static_cast<int>(FusedKind::rms_norm_mul)], 0u);
  EXPECT_EQ(q.dispatches[0].kind, FusedKind::none);
  EXPECT_EQ(q.dispatches[0].node()->op, OpKind::rms_norm);
}

TEST(ExecPlan, FusionFoldsTheAllReduceIntoTheNextNorm) {
  auto comms = make_host_communicators(2);
  Layer l(false, comms[0].get());
  ASSERT_TRUE(l.g.status().ok()) << l.g.status().to_string();
  Plan p = exec::build_plan(l.g);
  EXPECT_EQ(p.dispatches.size(), 12u);  // the 11 above and the all_reduce
  exec::fuse(p, l.g, AcceptAll{});
  using K = FusedKind;
  EXPECT_EQ(p.stats.fusions[static_cast<int>(K::all_reduce_add_rms_norm_mul)], 1u);
  EXPECT_EQ(p.stats.fusions[static_cast<int>(K::add_rms_norm_mul)], 0u);
  ASSERT_EQ(p.dispatches.size(), 5u);  // norm*w, glu, down, all-reduce+add+norm*w, proj+bias
  const Dispatch& d = p.dispatches[3];
  EXPECT_EQ(d.kind, K::all_reduce_add_rms_norm_mul);
  EXPECT_EQ(d.nodes[0], l.sum);
  EXPECT_EQ(d.nodes[1], l.y);
  EXPECT_EQ(d.anchor(), l.z);
  EXPECT_TRUE(d.barrier);  // still a collective: every rank reaches it in the same order
  // it reads the partial (not the sum, which nobody stores) and writes the residual and the norm
  auto has = [](const std::vector<ByteRange>& v, const Tensor* t) {
    const ByteRange tr = exec::tensor_range(*t);
    return std::any_of(v.begin(), v.end(), [&](const ByteRange& b) { return b.begin == tr.begin && b.end == tr.end; });
  };
  EXPECT_TRUE(has(d.reads, l.down));
  EXPECT_TRUE(has(d.reads, l.x));
  EXPECT_EQ(d.writes.size(), 2u);
  EXPECT_TRUE(has(d.writes, l.y));
  EXPECT_TRUE(has(d.writes, l.z));
  EXPECT_NE(p.dump().find("all_reduce_add_rms_norm_mul"), std::string::npos);

  // a sum read elsewhere too stays an all_reduce of its own; the add and norm still fuse
  Layer shared(false, comms[0].get(), /*extra_reader_of_sum=*/true);
  Plan q = exec::build_plan(shared.g);
  exec::fuse(q, shared.g, AcceptAll{});
  EXPECT_EQ(q.stats.fusions[static_cast<int>(K::all_reduce_add_rms_norm_mul)], 0u);
  EXPECT_EQ(q.stats.fusions[static_cast<int>(K::add_rms_norm_mul)], 1u);
}

TEST(ExecPlan, ScratchSlotsAreWrites) {
  Plan p;
  for (int i = 0; i < 3; ++i) {
    p.dispatches.push_back(fake({r(0, 10)}, {r(100 + 10 * i, 110 + 10 * i)}));
    p.dispatches.back().scratch_bytes = 8;
  }
  exec::assign_scratch(p, 1000, 16, 2);
  EXPECT_EQ(p.dispatches[0].scratch.begin, 1000u);
  EXPECT_EQ(p.dispatches[1].scratch.begin, 1016u);
  EXPECT_EQ(p.dispatches[2].scratch.begin, 1000u);  // wraps: ordered after dispatch 0
  exec::build_dependencies(p, true);
  EXPECT_TRUE(p.deps[1].empty());
  EXPECT_EQ(p.deps[2], (std::vector<int>{0}));
}

TEST(ExecPlan, PackedActivationsReusedOnlyRightAfterTheSamePacking) {
  // keys by dispatch: 7, 7 (reuses), other (not in the region), 7 (reuses: the region's last was 7),
  // 9, 0 (no packing), 0, 9 (the last user packed nothing)
  Plan p;
  const std::vector<uintptr_t> keys = {7, 7, 1, 7, 9, 0, 0, 9};
  for (size_t i = 0; i < keys.size(); ++i) {
    p.dispatches.push_back(fake({r(0, 10)}, {r(100, 110)}));
    p.dispatches.back().order = static_cast<int>(i);
  }
  auto key = [&](const Dispatch& d) { return keys[static_cast<size_t>(d.order)]; };
  exec::mark_packed_reuse(p, [](const Dispatch& d) { return d.order != 2; }, key);
  std::vector<bool> got;
  for (const Dispatch& d : p.dispatches) got.push_back(d.b_packed);
  EXPECT_EQ(got, (std::vector<bool>{false, true, false, true, false, false, false, false}));
}

TEST(ExecPlan, SharedScratchRegionOrdersItsUsersOnly) {
  // dispatches 0 and 2 take the shared region (as the CUDA backend's cuBLAS products do); 1 and 3
  // the slots in turn, as if the others were not there
  Plan p;
  for (int i = 0; i < 4; ++i) {
    p.dispatches.push_back(fake({r(0, 10)}, {r(100 + 10 * i, 110 + 10 * i)}));
    p.dispatches.back().scratch_bytes = i % 2 == 0 ? 64 : 8;
  }
  auto big = [](const Dispatch& d) { return d.scratch_bytes > 16; };
  exec::assign_scratch(p, 2000, 16, 2, 1000, big);
  EXPECT_EQ(p.dispatches[0].scratch.begin, 1000u);
  EXPECT_EQ(p.dispatches[0].scratch.end, 1064u);
  EXPECT_EQ(p.dispatches[1].scratch.begin, 2000u);
  EXPECT_EQ(p.dispatches[2].scratch.begin, 1000u);
  EXPECT_EQ(p.dispatches[3].scratch.begin, 2016u);
  exec::build_dependencies(p, true);
  EXPECT_TRUE(p.deps[1].empty());
  EXPECT_EQ(p.deps[2], (std::vector<int>{0}));  // the shared region: ordered after dispatch 0
  EXPECT_TRUE(p.deps[3].empty());
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(ExecPlan, FusionGroupsProjectionsOfOneActivation) {
  Graph g;
  Tensor* x = g.input(DType::f32, {64, 1, 1, 1}, "x");
  Tensor* wq = g.weight(DType::q8_0, {64, 64, 1, 1}, "wq");
  Tensor* wk = g.weight(DType::q8_0, {64, 32, 1, 1}, "wk");
  Tensor* wv = g.weight(DType::q8_0, {64, 32, 1, 1}, "wv");
  Tensor* wo = g.weight(DType::f16, {64, 64, 1, 1}, "wo");  // another type: not grouped
  Tensor* q = mul_mat(g, wq, x);
  Tensor* k = mul_mat(g, wk, x);
  Tensor* v = mul_mat(g, wv, x);
  Tensor* o = mul_mat(g, wo, x);
  Tensor* s = mul(g, mul(g, q, o), concat(g, k, v, 0));
  g.mark_output(s);
  ASSERT_TRUE(g.status().ok());
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok());
  Plan p = exec::build_plan(g);
  exec::fuse(p, g, AcceptAll{});
  EXPECT_EQ(p.stats.fusions[static_cast<int>(FusedKind::mat_vec_multi)], 1u);
  ASSERT_EQ(p.dispatches[0].kind, FusedKind::mat_vec_multi);
  EXPECT_EQ(p.dispatches[0].nodes[0], q);
  EXPECT_EQ(p.dispatches[0].nodes[1], k);
  EXPECT_EQ(p.dispatches[0].nodes[2], v);
  EXPECT_EQ(p.dispatches[0].writes.size(), 3u);
  EXPECT_EQ(p.dispatches[1].node(), o);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// A caller reading an intermediate through a view (an output-flagged view) keeps it from being fused away.
TEST(ExecPlan, FusionKeepsIntermediatesReadThroughOutputViews) {
  Graph g;
  Tensor* x = g.input(DType::f32, {64, 2, 1, 1}, "x");
  Tensor* w = g.weight(DType::f32, {64, 1, 1, 1}, "w");
  Tensor* norm = rms_norm(g, x, 1e-5f);
  Tensor* y = mul(g, norm, w);
  Tensor* row = view(g, norm, {64, 1, 1, 1}, norm->nb, 0);  // the caller reads the norm's first row
  g.mark_output(row);
  g.mark_output(y);
  ASSERT_TRUE(g.status().ok());
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok());
  Plan p = exec::build_plan(g);
  exec::fuse(p, g, AcceptAll{});
  EXPECT_EQ(p.stats.fusions[static_cast<int>(FusedKind::rms_norm_mul)], 0u);
  EXPECT_EQ(p.dispatches.size(), 2u);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The batched step's attention (StepBuilder::attention, shape.gather): K and V rows gathered from
// an f16 store by get_rows, reshaped to [d, n_kv, n_head_kv, n_seqs]. Fused, the gathers' outputs
// are neither written nor read; a second reader of a gather keeps it.
struct GatheredAttention {
  Graph g;
  Tensor *get_k = nullptr, *get_v = nullptr, *out = nullptr;
  GraphAllocation alloc;
  explicit GatheredAttention(bool extra_reader_of_keys = false) {
    const int64_t d = 64, n_cells = 32, hkv = 2, n_head = 4, n_kv = 8, n_seqs = 3;
    Tensor* cache_k = g.weight(DType::f16, {d, n_cells * hkv, 1, 1}, "cache_k");
    Tensor* cache_v = g.weight(DType::f16, {d, n_cells * hkv, 1, 1}, "cache_v");
    Tensor* idx = g.input(DType::i32, {n_kv * hkv * n_seqs, 1, 1, 1}, "inp_kv_gather");
    Tensor* q = g.input(DType::f32, {d, 1, n_head, n_seqs}, "q");
    Tensor* mask = g.input(DType::f32, {n_kv, 1, 1, n_seqs}, "mask");
    get_k = get_rows(g, view(g, cache_k, cache_k->ne, cache_k->nb, 0), idx);
    get_v = get_rows(g, view(g, cache_v, cache_v->ne, cache_v->nb, 0), idx);
    out = flash_attn(g, q, reshape(g, get_k, {d, n_kv, hkv, n_seqs}),
                     reshape(g, get_v, {d, n_kv, hkv, n_seqs}), mask, 0.125f);
    g.mark_output(out);
    if (extra_reader_of_keys) g.mark_output(sum_rows(g, get_k));
    auto a = allocate_graph(g, cpu_buffer_type());
    EXPECT_TRUE(a.ok()) << a.status().message();
    if (a.ok()) alloc = std::move(a.value());
  }
};

TEST(ExecPlan, FusionReadsGatheredRowsInPlace) {
  GatheredAttention a;
  ASSERT_TRUE(a.g.status().ok()) << a.g.status().message();
  Plan p = exec::build_plan(a.g);
  ASSERT_EQ(p.dispatches.size(), 3u);  // get_rows get_rows flash_attn
  exec::fuse(p, a.g, AcceptAll{});
  EXPECT_EQ(p.stats.fusions[static_cast<int>(FusedKind::gather_flash_attn)], 1u);
  ASSERT_EQ(p.dispatches.size(), 1u);
  const Dispatch& d = p.dispatches[0];
  EXPECT_EQ(d.kind, FusedKind::gather_flash_attn);
  EXPECT_EQ(d.nodes[0], a.get_k);
  EXPECT_EQ(d.nodes[1], a.get_v);
  EXPECT_EQ(d.anchor(), a.out);
  // writes the attention only; reads the stores, the indices (twice), q and the mask, not the gathers
  ASSERT_EQ(d.writes.size(), 1u);
  EXPECT_EQ(d.writes[0].begin, exec::tensor_range(*a.out).begin);
  EXPECT_EQ(d.reads.size(), 6u);
  for (const ByteRange& r : d.reads) {
    EXPECT_FALSE(r.overlaps(exec::tensor_range(*a.get_k)));
    EXPECT_FALSE(r.overlaps(exec::tensor_range(*a.get_v)));
  }

  GatheredAttention shared(/*extra_reader_of_keys=*/true);
  Plan q = exec::build_plan(shared.g);
  exec::fuse(q, shared.g, AcceptAll{});
  EXPECT_EQ(q.stats.fusions[static_cast<int>(FusedKind::gather_flash_attn)], 0u);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Property test over random plans: reorder keeps every conflicting pair in order and moves nothing
// across a barrier; the dependencies order exactly the conflicting pairs (transitively), point only at
// conflicting dispatches, and carry no edge implied by another path.
TEST(ExecPlan, RandomPlansKeepConflictsOrderedAndEdgesMinimal) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 60);
    Plan p;
    for (int i = 0; i < n; ++i) {
      auto range = [&] {
        const uintptr_t b = rng() % 200;
        return ByteRange{b, b + 1 + rng() % 12};
      };
      std::vector<ByteRange> reads, writes;
      for (unsigned k = rng() % 3; k-- > 0;) reads.push_back(range());
      for (unsigned k = 1 + rng() % 2; k-- > 0;) writes.push_back(range());
      p.dispatches.push_back(fake(reads, writes, rng() % 17 == 0));
      p.dispatches.back().order = i;
    }
    const std::vector<Dispatch> original = p.dispatches;
    exec::reorder(p, 1 + static_cast<int>(rng() % 70));
    std::vector<int> pos(n, -1);
    for (int k = 0; k < n; ++k) {
      const int o = p.dispatches[k].order;
      ASSERT_TRUE(o >= 0 && o < n && pos[o] < 0);  // a permutation
      pos[o] = k;
    }
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        if (exec::conflicts(original[a], original[b])) {
          ASSERT_LT(pos[a], pos[b]) << "trial " << trial;
        }
        if (original[a].barrier || original[b].barrier) {
          ASSERT_LT(pos[a], pos[b]) << "barrier, trial " << trial;
        }
      }

    exec::build_dependencies(p, true);
    // reach[j][i]: j waits for i through the edges
    std::vector<std::vector<char>> reach(n, std::vector<char>(n, 0));
    for (int j = 0; j < n; ++j)
      for (int i : p.deps[j]) {
        ASSERT_LT(i, j);
        ASSERT_TRUE(exec::conflicts(p.dispatches[i], p.dispatches[j])) << "edge without a conflict";
        reach[j][i] = 1;
        for (int k = 0; k < n; ++k)
          if (reach[i][k]) reach[j][k] = 1;
      }
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < j; ++i)
        if (exec::conflicts(p.dispatches[i], p.dispatches[j])) {
          ASSERT_TRUE(reach[j][i]) << "missing order";
        }
    for (int j = 0; j < n; ++j)
      for (int i : p.deps[j])
        for (int k : p.deps[j])
          if (k != i) {
            ASSERT_FALSE(reach[k][i]) << "edge " << i << "->" << j << " implied via " << k;
          }
    for (int j = 0; j < n; ++j) {
      int depth = 0;
      for (int i : p.deps[j]) depth = std::max(depth, p.dispatches[i].depth + 1);
      ASSERT_EQ(p.dispatches[j].depth, depth);
    }
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The replay cache's key: the same structure encodes the same (also in a copy of the graph, as the C
// ABI makes), and any change a kernel would see changes its words and its hash; names change neither.
TEST(ExecPlan, StructureHashSeesEverythingAKernelSees) {
  Layer l;
  ASSERT_TRUE(l.g.status().ok());
  const StructureKey k0 = exec::structure_key(l.g);
  const uint64_t h0 = k0.hash;
  EXPECT_EQ(exec::structure_key(l.g).hash, h0);
  EXPECT_EQ(exec::structure_key(l.g).words, k0.words);

  // a node-for-node copy (operands re-pointed at the copies) hashes the same
  Graph copy;
  std::unordered_map<const Tensor*, Tensor*> map;
  for (const Tensor* n : l.g.nodes()) {
    Tensor* c = copy.add_node(n->op, n->type, n->ne, {});
    const int32_t index = c->index;
    *c = *n;
    c->index = index;
    for (Tensor*& s : c->src)
      if (s && map.count(s)) s = map[s];
    if (c->view_src && map.count(c->view_src)) c->view_src = map[c->view_src];
    map[n] = c;
  }
  EXPECT_EQ(exec::structure_key(copy).words, k0.words);
  EXPECT_EQ(exec::structure_key(copy).hash, h0);

  auto changed = [&](auto&& mutate, auto&& undo, const char* what) {
    mutate();
    const StructureKey k = exec::structure_key(l.g);
    EXPECT_NE(k.hash, h0) << what;
    EXPECT_NE(k.words, k0.words) << what;
    undo();
    EXPECT_EQ(exec::structure_key(l.g).hash, h0) << what << " (undone)";
  };
  Tensor* n = l.glu;
  void* data = n->data;
  changed([&] { n->data = static_cast<char*>(data) + 256; }, [&] { n->data = data; }, "a node's address");
  Tensor* leaf = n->src[0]->src[0];  // the gate weight
  void* wdata = leaf->data;
  changed([&] { leaf->data = static_cast<char*>(wdata) + 256; }, [&] { leaf->data = wdata; }, "a weight's address");
  changed([&] { n->params[3] ^= 1; }, [&] { n->params[3] ^= 1; }, "a parameter byte");
  changed([&] { n->op = OpKind::geglu; }, [&] { n->op = OpKind::swiglu; }, "the op");
  changed([&] { n->nb[1] += 4; }, [&] { n->nb[1] -= 4; }, "a stride");
  Tensor* other = l.h;
  Tensor* src1 = n->src[1];
  changed([&] { n->src[1] = other; }, [&] { n->src[1] = src1; }, "an operand");
  changed([&] { n->flags |= kTensorOutput; }, [&] { n->flags &= ~uint32_t{kTensorOutput}; }, "the output flag");
  n->name = "blk.0.ffn_glu";  // names change no kernel
  EXPECT_EQ(exec::structure_key(l.g).words, k0.words);
  ExecOptions no_fusion;
  no_fusion.fusion = false;
  EXPECT_NE(exec::options_word(no_fusion), exec::options_word(ExecOptions{}));
  ExecOptions more_chunks;
  more_chunks.n_cb = 4;  // splits only a first run
  EXPECT_EQ(exec::options_word(more_chunks), exec::options_word(ExecOptions{}));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// A decode step's attention (StepBuilder::attention, one token, contiguous cache): rope(q), rope(k)
// stored by set_rows, V stored beside it, flash_attn over views of the stores. Fused, the dispatch
// writes the two stores and the attention only (rope_q and rope_k are never written); a second reader
// of rope(q) leaves the attention alone and the rope and stores to rope_set_rows.
struct DecodeAttention {
  Graph g;
  Tensor *rope_q = nullptr, *rope_k = nullptr, *store_k = nullptr, *store_v = nullptr, *out = nullptr;
  GraphAllocation alloc;
  explicit DecodeAttention(bool extra_reader_of_q = false) {
    const int64_t d = 64, n_cells = 32, hkv = 2, n_head = 4, n_kv = 8;
    Tensor* cache_k = g.weight(DType::f16, {d, n_cells, hkv, 1}, "cache_k");
    Tensor* cache_v = g.weight(DType::f16, {d, n_cells, hkv, 1}, "cache_v");
    Tensor* q = g.input(DType::f32, {d, n_head, 1, 1}, "q");
    Tensor* k = g.input(DType::f32, {d, hkv, 1, 1}, "k");
    Tensor* v = g.input(DType::f32, {d, hkv, 1, 1}, "v");
    Tensor* pos = g.input(DType::i32, {1, 1, 1, 1}, "pos");
    Tensor* cells = g.input(DType::i32, {1, 1, 1, 1}, "cells");
    Tensor* mask = g.input(DType::f32, {n_kv, 1, 1, 1}, "mask");
    RopeParams p{};
    p.n_dims = static_cast<int32_t>(d);
    p.mode = RopeMode::normal;
    p.freq_base = 10000.0f;
    p.freq_scale = 1.0f;
    p.attn_factor = 1.0f;
    rope_q = rope(g, q, pos, nullptr, p);
    rope_k = rope(g, k, pos, nullptr, p);
    store_k = set_rows(g, cache_k, permute(g, rope_k, 0, 2, 1, 3), cells);
    store_v = set_rows(g, cache_v, permute(g, v, 0, 2, 1, 3), cells);
    out = flash_attn(g, permute(g, rope_q, 0, 2, 1, 3), view(g, store_k, {d, n_kv, hkv, 1}, store_k->nb, 0),
                     view(g, store_v, {d, n_kv, hkv, 1}, store_v->nb, 0), mask, 0.125f);
    g.mark_output(out);
    if (extra_reader_of_q) g.mark_output(sum_rows(g, rope_q));
    auto a = allocate_graph(g, cpu_buffer_type());
    EXPECT_TRUE(a.ok()) << a.status().message();
    if (a.ok()) alloc = std::move(a.value());
  }
};

TEST(ExecPlan, FusionFoldsTheDecodeRopeAndStoresIntoAttention) {
  DecodeAttention a;
  ASSERT_TRUE(a.g.status().ok()) << a.g.status().message();
  Plan p = exec::build_plan(a.g);
  ASSERT_EQ(p.dispatches.size(), 5u);  // rope rope set_rows set_rows flash_attn
  exec::fuse(p, a.g, AcceptAll{});
  EXPECT_EQ(p.stats.fusions[static_cast<int>(FusedKind::rope_flash_attn)], 1u);
  EXPECT_EQ(p.stats.fusions[static_cast<int>(FusedKind::rope_set_rows)], 0u);
  ASSERT_EQ(p.dispatches.size(), 1u);
  const Dispatch& d = p.dispatches[0];
  EXPECT_EQ(d.kind, FusedKind::rope_flash_attn);
  EXPECT_EQ(d.nodes[0], a.rope_k);
  EXPECT_EQ(d.nodes[1], a.store_k);
  EXPECT_EQ(d.nodes[2], a.rope_q);
  EXPECT_EQ(d.nodes[3], a.store_v);
  EXPECT_EQ(d.anchor(), a.out);
  // writes both stores and the attention, not the ropes (which the allocator may lay over their inputs)
  ASSERT_EQ(d.writes.size(), 3u);
  EXPECT_EQ(d.writes[0].begin, exec::tensor_range(*a.store_k).begin);
  EXPECT_EQ(d.writes[1].begin, exec::tensor_range(*a.store_v).begin);
  EXPECT_EQ(d.writes[2].begin, exec::tensor_range(*a.out).begin);

  DecodeAttention shared(/*extra_reader_of_q=*/true);
  Plan q = exec::build_plan(shared.g);
  exec::fuse(q, shared.g, AcceptAll{});
  EXPECT_EQ(q.stats.fusions[static_cast<int>(FusedKind::rope_flash_attn)], 0u);
  EXPECT_EQ(q.stats.fusions[static_cast<int>(FusedKind::rope_set_rows)], 1u);
}

}  // namespace
}  // namespace loom
