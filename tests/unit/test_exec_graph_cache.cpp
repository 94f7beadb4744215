// The executor's replay cache (src/exec/graph_cache.h) and the structure keys it compares: a pass is
// replayed only when its whole structure equals the recorded one, so a forced hash collision rebuilds.
// The CUDA executor holds the same cache (cuda_exec.cpp); LOOM_EXEC_FORCE_HASH forces its collisions
// on the GPU (tests/gpu/exec_equivalence.cpp).
#include <gtest/gtest.h>

#include <memory>

#include "loom/exec_graph_cache.h"
#include "loom/exec_plan.h"
#include "loom/cpu.h"
#include "loom/planner.h"

namespace loom {
namespace {

// A small allocated pass; each field of Variant changes one thing a kernel would see.
struct Variant {
  float scale = 0.5f;              // an op parameter
  int64_t rows = 8;                // a shape
  DType weight_type = DType::f32;  // a type
  bool transposed_view = false;    // a stride (a permuted view instead of a reshape)
};

struct Pass {
  Graph g;
  GraphAllocation alloc;
  explicit Pass(const Variant& v = {}) {
    Tensor* x = g.input(DType::f32, {32, v.rows, 1, 1}, "x");
    Tensor* w = g.weight(v.weight_type, {32, 16, 1, 1}, "w");
    Tensor* y = mul_mat(g, w, x);  // [16, rows]
    Tensor* r = v.transposed_view ? transpose(g, y) : reshape(g, y, {v.rows, 16, 1, 1});
    Tensor* out = scale(g, cont(g, r), v.scale);
    g.mark_output(out);
    auto a = allocate_graph(g, cpu_buffer_type());
    EXPECT_TRUE(a.ok()) << a.status().message();
    if (a.ok()) alloc = std::move(a.value());
  }
  StructureKey key() const { return exec::structure_key(g); }
};

TEST(ExecGraphCache, KeysDifferInEveryFieldAKernelSees) {
  Pass base;
  ASSERT_TRUE(base.g.status().ok());
  const StructureKey k = base.key();
  EXPECT_EQ(Pass().key().words.size(), k.words.size());
  EXPECT_NE(Pass().key().words, k.words) << "another allocation: other addresses";
  Variant v;
  v.scale = 0.25f;
  EXPECT_NE(Pass(v).key().words, k.words) << "a parameter";
  v = {};
  v.rows = 16;
  EXPECT_NE(Pass(v).key().words, k.words) << "a shape";
  v = {};
  v.weight_type = DType::f16;
  EXPECT_NE(Pass(v).key().words, k.words) << "a type";
  v = {};
  v.transposed_view = true;
  EXPECT_NE(Pass(v).key().words, k.words) << "strides";
}

// What the executor does per compute: replay the cached payload of an equal structure, else build
// one and cache it. Payloads are build numbers, so a test sees which build a pass ran.
struct MiniExecutor {
  exec::GraphCache<int> cache{4};
  int builds = 0;
  int collisions = 0;
  int run(const Graph& g, uint64_t options = 0) {
    StructureKey key = exec::structure_key(g);
    bool collision = false;
    if (const int* hit = cache.find(key, options, &collision)) return *hit;
    collisions += collision;
    if (cache.full()) (void)cache.take_oldest();
    return cache.insert(key, options, builds++);
  }
};

TEST(ExecGraphCache, ReplaysOnlyTheSameStructure) {
  Pass a, b;
  MiniExecutor ex;
  EXPECT_EQ(ex.run(a.g), 0);
  EXPECT_EQ(ex.run(a.g), 0);  // replayed
  EXPECT_EQ(ex.run(b.g), 1);  // other addresses: built
  EXPECT_EQ(ex.run(a.g, 1), 2) << "other options: built";
  EXPECT_EQ(ex.run(a.g), 0);
  EXPECT_EQ(ex.run(b.g), 1);
  EXPECT_EQ(ex.collisions, 0);
}

// Every key hashes alike: a 64-bit hash match alone would replay the first pass's graph for the
// second pass. The words tell them apart, so the second is built, and each replays its own.
TEST(ExecGraphCache, ForcedHashCollisionRebuilds) {
  Pass a;
  Variant v;
  v.scale = 2.0f;
  Pass b(v);
  MiniExecutor ex;
  ex.cache.force_hash(42);
  EXPECT_EQ(ex.cache.lookup_hash(a.key(), 0), ex.cache.lookup_hash(b.key(), 0));
  EXPECT_EQ(ex.run(a.g), 0);
  EXPECT_EQ(ex.run(b.g), 1) << "the second structure must not replay the first's graph";
  EXPECT_EQ(ex.collisions, 1);
  EXPECT_EQ(ex.run(a.g), 0);
  EXPECT_EQ(ex.run(b.g), 1);
  EXPECT_EQ(ex.builds, 2);
  EXPECT_EQ(ex.collisions, 1);
  EXPECT_EQ(ex.cache.size(), 2u);
}

TEST(ExecGraphCache, EvictsLeastRecentlyUsed) {
  exec::GraphCache<int> cache(2);
  Pass a, b, c;
  cache.insert(a.key(), 0, 10);
  cache.insert(b.key(), 0, 11);
  ASSERT_NE(cache.find(a.key(), 0), nullptr);  // a is now the most recent
  ASSERT_TRUE(cache.full());
  EXPECT_EQ(cache.take_oldest(), 11);
  cache.insert(c.key(), 0, 12);
  EXPECT_EQ(*cache.front(), 12);
  EXPECT_EQ(cache.find(b.key(), 0), nullptr);
  int released = 0;
  cache.clear([&](int&) { ++released; });
  EXPECT_EQ(released, 2);
  EXPECT_EQ(cache.size(), 0u);
}

// A graph's attached key (what the model layer sets once per built step) goes stale as soon as the
// graph grows.
TEST(ExecGraphCache, AttachedKeyIsClearedByNewNodes) {
  Pass p;
  EXPECT_EQ(p.g.structure_key(), nullptr);
  p.g.set_structure_key(p.key());
  ASSERT_NE(p.g.structure_key(), nullptr);
  EXPECT_EQ(p.g.structure_key()->words, p.key().words);
  Tensor* extra = scale(p.g, p.g.nodes().back(), 3.0f);
  EXPECT_EQ(p.g.structure_key(), nullptr);
  p.g.set_structure_key(p.key());
  p.g.mark_output(extra);
  EXPECT_EQ(p.g.structure_key(), nullptr);
  p.g.set_structure_key(p.key());
  p.g.input(DType::f32, {4, 1, 1, 1}, "late");
  EXPECT_EQ(p.g.structure_key(), nullptr);
}

}  // namespace
}  // namespace loom
