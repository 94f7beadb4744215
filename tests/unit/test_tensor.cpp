// Tensor layout: strides, views, reshape/permute/transpose, dtype traits, and copies of strided
// views computed on the CPU backend. Expected strides and values are worked out by hand in comments.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/backend.h"
#include "loom/cpu.h"
#include "loom/graph.h"
#include "loom/planner.h"

namespace loom {
namespace {

using Strides = std::array<size_t, kMaxDims>;

// ---- dtype traits -------------------------------------------------------------------------------

TEST(DType, TraitsMatchGguf) {
  struct Expect {
    DType type;
    const char* name;
    int64_t block;
    size_t size;
    bool quantized;
    uint32_t gguf;
  };
  // GGUF ggml_type ids as in ggml.h (enum ggml_type).
  const Expect expect[] = {
      {DType::f32, "f32", 1, 4, false, 0},        {DType::f16, "f16", 1, 2, false, 1},
      {DType::bf16, "bf16", 1, 2, false, 30},     {DType::i32, "i32", 1, 4, false, 26},
      {DType::q8_0, "q8_0", 32, 34, true, 8},     {DType::q4_0, "q4_0", 32, 18, true, 2},
      {DType::q4_k, "q4_K", 256, 144, true, 12},  {DType::q6_k, "q6_K", 256, 210, true, 14},
      {DType::q4_1, "q4_1", 32, 20, true, 3},     {DType::q5_0, "q5_0", 32, 22, true, 6},
      {DType::q5_1, "q5_1", 32, 24, true, 7},     {DType::q2_k, "q2_K", 256, 84, true, 10},
      {DType::q3_k, "q3_K", 256, 110, true, 11},  {DType::q5_k, "q5_K", 256, 176, true, 13},
      {DType::iq4_nl, "iq4_nl", 32, 18, true, 20}, {DType::iq4_xs, "iq4_xs", 256, 136, true, 23},
      {DType::mxfp4, "mxfp4", 32, 17, true, 39},
  };
  static_assert(sizeof(expect) / sizeof(expect[0]) == kDTypeCount);
  for (const Expect& e : expect) {
    SCOPED_TRACE(e.name);
    const DTypeTraits& t = dtype_traits(e.type);
    EXPECT_STREQ(t.name, e.name);
    EXPECT_STREQ(dtype_name(e.type), e.name);
    EXPECT_EQ(t.block_size, e.block);
    EXPECT_EQ(dtype_block_size(e.type), e.block);
    EXPECT_EQ(t.type_size, e.size);
    EXPECT_EQ(dtype_type_size(e.type), e.size);
    EXPECT_EQ(t.quantized, e.quantized);
    EXPECT_EQ(dtype_is_quantized(e.type), e.quantized);
    EXPECT_EQ(t.gguf_id, e.gguf);
    ASSERT_TRUE(dtype_from_gguf(e.gguf).has_value());
    EXPECT_EQ(*dtype_from_gguf(e.gguf), e.type);
    ASSERT_TRUE(dtype_from_name(e.name).has_value());
    EXPECT_EQ(*dtype_from_name(e.name), e.type);
  }
}

TEST(DType, GgufIdsLoomDoesNotSupport) {
  // 9 = Q8_1, 16 = IQ2_XXS, 21 = IQ3_S, 35 = TQ2_0, 9999 = nothing
  for (uint32_t id : {9u, 16u, 21u, 35u, 9999u}) EXPECT_FALSE(dtype_from_gguf(id).has_value()) << id;
}

TEST(DType, FromNameIsCaseInsensitiveAndExact) {
  EXPECT_EQ(dtype_from_name("F32"), DType::f32);
  EXPECT_EQ(dtype_from_name("BF16"), DType::bf16);
  EXPECT_EQ(dtype_from_name("Q4_k"), DType::q4_k);
  EXPECT_EQ(dtype_from_name("q4_K"), DType::q4_k);
  EXPECT_EQ(dtype_from_name("Q6_K"), DType::q6_k);
  EXPECT_EQ(dtype_from_name("Q8_0"), DType::q8_0);
  EXPECT_FALSE(dtype_from_name(""));
  EXPECT_FALSE(dtype_from_name("f3"));
  EXPECT_FALSE(dtype_from_name("f32 "));
  EXPECT_EQ(dtype_from_name("Q5_0"), DType::q5_0);
  EXPECT_EQ(dtype_from_name("IQ4_XS"), DType::iq4_xs);
  EXPECT_FALSE(dtype_from_name("q8_1"));
  EXPECT_FALSE(dtype_from_name("float32"));
}

TEST(DType, RowSize) {
  EXPECT_EQ(dtype_row_size(DType::f32, 7), 28u);
  EXPECT_EQ(dtype_row_size(DType::f16, 7), 14u);
  EXPECT_EQ(dtype_row_size(DType::q8_0, 96), 3u * 34u);
  EXPECT_EQ(dtype_row_size(DType::q4_0, 64), 2u * 18u);
  EXPECT_EQ(dtype_row_size(DType::q4_k, 512), 2u * 144u);
  EXPECT_EQ(dtype_row_size(DType::q6_k, 4096), 16u * 210u);
}

// ---- strides ------------------------------------------------------------------------------------

TEST(Strides, ContiguousForEachDType) {
  const Shape plain{8, 3, 2, 5};
  EXPECT_EQ(contiguous_strides(DType::f32, plain), (Strides{4, 32, 96, 192}));
  EXPECT_EQ(contiguous_strides(DType::i32, plain), (Strides{4, 32, 96, 192}));
  EXPECT_EQ(contiguous_strides(DType::f16, plain), (Strides{2, 16, 48, 96}));
  EXPECT_EQ(contiguous_strides(DType::bf16, plain), (Strides{2, 16, 48, 96}));
  // q8_0 [64, 3, 2]: 2 blocks of 34 bytes per row -> 68; 3 rows -> 204; 2 planes -> 408.
  EXPECT_EQ(contiguous_strides(DType::q8_0, {64, 3, 2, 1}), (Strides{34, 68, 204, 408}));
  // q4_0 [64, 3]: 2 blocks of 18 -> 36 per row; 108 per plane.
  EXPECT_EQ(contiguous_strides(DType::q4_0, {64, 3, 1, 1}), (Strides{18, 36, 108, 108}));
  // q4_K [512, 3]: 2 super-blocks of 144 -> 288; 864.
  EXPECT_EQ(contiguous_strides(DType::q4_k, {512, 3, 1, 1}), (Strides{144, 288, 864, 864}));
  // q6_K [256, 2, 3]: one block of 210 per row; 420 per plane; 1260 per volume.
  EXPECT_EQ(contiguous_strides(DType::q6_k, {256, 2, 3, 1}), (Strides{210, 210, 420, 1260}));
}

TEST(Strides, LeafsArePackedAndSized) {
  Graph g;
  Tensor* a = g.input(DType::f32, {8, 3, 2, 5}, "a");
  Tensor* q = g.weight(DType::q8_0, {64, 3, 2, 1}, "q");
  Tensor* k = g.weight(DType::q6_k, {256, 2, 3, 1}, "k");
  ASSERT_TRUE(a && q && k);
  EXPECT_EQ(a->nbytes(), 8u * 3 * 2 * 5 * 4);
  EXPECT_EQ(q->nbytes(), 408u);
  EXPECT_EQ(k->nbytes(), 1260u);
  EXPECT_EQ(q->row_size(), 68u);
  EXPECT_EQ(a->nelements(), 240);
  EXPECT_EQ(a->nrows(), 30);
  for (const Tensor* t : {a, q, k}) {
    EXPECT_TRUE(t->is_contiguous());
    EXPECT_TRUE(t->rows_contiguous());
    EXPECT_TRUE(t->is_leaf());
    EXPECT_EQ(t->root(), t);
  }
  EXPECT_EQ(a->flags, static_cast<uint32_t>(kTensorInput));
  EXPECT_EQ(q->flags, static_cast<uint32_t>(kTensorWeight));
  // offset_of counts blocks in dim 0: element 32 of a q8_0 row starts the second block.
  EXPECT_EQ(q->offset_of(32, 2, 1, 0), 34u + 2 * 68 + 204);
  EXPECT_EQ(a->offset_of(3, 2, 1, 4), 3u * 4 + 2 * 32 + 96 + 4 * 192);
}

// ---- views ----------------------------------------------------------------------------------------

TEST(Views, ViewOfRowsWithGaps) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");  // nb {4, 16, 48, 96}, 96 bytes
  // Elements 2..3 of every row: ne {2, 3, 2}, a's strides, offset 8 bytes.
  Tensor* v = view(g, a, {2, 3, 2, 1}, {0, 16, 48, 96}, 8);
  ASSERT_NE(v, nullptr) << g.status().to_string();
  EXPECT_EQ(v->op, OpKind::view);
  EXPECT_EQ(v->ne, (Shape{2, 3, 2, 1}));
  EXPECT_EQ(v->nb, (Strides{4, 16, 48, 96}));  // nb[0] is forced to the type size
  EXPECT_EQ(v->view_src, a);
  EXPECT_EQ(v->view_offset, 8u);
  EXPECT_EQ(v->root(), a);
  // last element at 4*1 + 16*2 + 48*1 = 84 from the view's start, plus 4 bytes
  EXPECT_EQ(v->nbytes(), 88u);
  EXPECT_FALSE(v->is_contiguous());
  EXPECT_TRUE(v->rows_contiguous());
  EXPECT_EQ(v->name, "a (view)");
  EXPECT_TRUE(g.status().ok());
}

TEST(Views, ViewPastTheEndIsRejected) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");
  // Same view at offset 12: 12 + 88 = 100 > 96.
  EXPECT_EQ(view(g, a, {2, 3, 2, 1}, {0, 16, 48, 96}, 12), nullptr);
  EXPECT_EQ(g.status().code(), StatusCode::shape_mismatch);
  EXPECT_NE(g.status().message().find("view"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("'a'"), std::string::npos) << g.status().message();
  EXPECT_TRUE(g.nodes().empty());
}

TEST(Views, ViewExactlyToTheEndIsAccepted) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");
  Tensor* v = view(g, a, {2, 3, 2, 1}, {0, 16, 48, 96}, 8);  // 8 + 88 == 96
  ASSERT_NE(v, nullptr);
  Tensor* last = view(g, a, {4, 1, 1, 1}, {0, 16, 16, 16}, 80);  // the last row
  ASSERT_NE(last, nullptr);
  EXPECT_TRUE(last->is_contiguous());
  EXPECT_EQ(last->nbytes(), 16u);
}

TEST(Views, ViewSplittingAQuantizedBlockIsRejected) {
  Graph g;
  Tensor* q = g.weight(DType::q8_0, {64, 4, 1, 1}, "q");
  EXPECT_EQ(view(g, q, {16, 4, 1, 1}, {0, 68, 272, 272}, 0), nullptr);
  EXPECT_EQ(g.status().code(), StatusCode::shape_mismatch);
}

TEST(Views, ViewWithNonPositiveDimensionIsRejected) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
  EXPECT_EQ(view(g, a, {4, 0, 1, 1}, {0, 16, 48, 48}, 0), nullptr);
  EXPECT_EQ(g.status().code(), StatusCode::shape_mismatch);
}

TEST(Views, Reshape) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");
  Tensor* r = reshape(g, a, {12, 2, 1, 1});
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->ne, (Shape{12, 2, 1, 1}));
  EXPECT_EQ(r->nb, (Strides{4, 48, 96, 96}));
  EXPECT_EQ(r->view_offset, 0u);
  EXPECT_EQ(r->view_src, a);
  EXPECT_TRUE(r->is_contiguous());
  EXPECT_EQ(r->nbytes(), a->nbytes());

  Tensor* r2 = reshape(g, r, {2, 2, 3, 2});
  ASSERT_NE(r2, nullptr);
  EXPECT_EQ(r2->nb, (Strides{4, 8, 16, 48}));
  EXPECT_EQ(r2->root(), a);

  // q8_0 [64, 4] -> [128, 2]: rows of 4 blocks, 136 bytes.
  Tensor* q = g.weight(DType::q8_0, {64, 4, 1, 1}, "q");
  Tensor* rq = reshape(g, q, {128, 2, 1, 1});
  ASSERT_NE(rq, nullptr);
  EXPECT_EQ(rq->nb, (Strides{34, 136, 272, 272}));
  EXPECT_TRUE(g.status().ok());
}

TEST(Views, ReshapeErrors) {
  {
    Graph g;
    Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");
    EXPECT_EQ(reshape(g, a, {5, 5, 1, 1}), nullptr);
    EXPECT_EQ(g.status().code(), StatusCode::shape_mismatch);
    EXPECT_NE(g.status().message().find("[5, 5]"), std::string::npos) << g.status().message();
  }
  {
    Graph g;
    Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
    Tensor* t = transpose(g, a);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(reshape(g, t, {12, 1, 1, 1}), nullptr);
    EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  }
  {
    Graph g;
    Tensor* q = g.weight(DType::q4_0, {64, 2, 1, 1}, "q");
    EXPECT_EQ(reshape(g, q, {16, 8, 1, 1}), nullptr);  // splits blocks
    EXPECT_EQ(g.status().code(), StatusCode::shape_mismatch);
  }
}

TEST(Views, Permute) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");  // nb {4, 16, 48, 96}
  // dim 0 -> 2, dim 1 -> 0, dim 2 -> 1: ne {3, 2, 4, 1}, nb {16, 48, 4, 96}
  Tensor* p = permute(g, a, 2, 0, 1, 3);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->ne, (Shape{3, 2, 4, 1}));
  EXPECT_EQ(p->nb, (Strides{16, 48, 4, 96}));
  EXPECT_EQ(p->view_offset, 0u);
  EXPECT_FALSE(p->is_contiguous());
  EXPECT_FALSE(p->rows_contiguous());
  // 4 + 2*16 + 1*48 + 3*4: the same 96 bytes as a.
  EXPECT_EQ(p->nbytes(), 96u);
  EXPECT_EQ(p->nelements(), a->nelements());

  // The inverse permutation restores a's layout.
  Tensor* back = permute(g, p, 1, 2, 0, 3);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->ne, a->ne);
  EXPECT_EQ(back->nb, a->nb);
  EXPECT_TRUE(back->is_contiguous());
  EXPECT_EQ(back->root(), a);
}

TEST(Views, Transpose) {
  Graph g;
  Tensor* a = g.input(DType::f16, {4, 3, 2, 1}, "a");  // nb {2, 8, 24, 48}
  Tensor* t = transpose(g, a);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (Shape{3, 4, 2, 1}));
  EXPECT_EQ(t->nb, (Strides{8, 2, 24, 48}));
  EXPECT_EQ(t->type, DType::f16);
  EXPECT_FALSE(t->rows_contiguous());
  EXPECT_EQ(t->nbytes(), 48u);
  Tensor* tt = transpose(g, t);
  ASSERT_NE(tt, nullptr);
  EXPECT_EQ(tt->nb, a->nb);
  EXPECT_TRUE(tt->is_contiguous());
}

TEST(Views, SizeOneDimensionsMayCarryAnyStride) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
  // Swapping two size-1 dims changes their strides but not the layout.
  Tensor* p = permute(g, a, 0, 1, 3, 2);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->nb, (Strides{4, 16, 48, 48}));
  EXPECT_TRUE(p->is_contiguous());
  // Row 1 alone, as [4, 1, 1, 1] with a large nb[1], is still packed.
  Tensor* row = view(g, a, {4, 1, 1, 1}, {0, 1000, 1000, 1000}, 16);
  ASSERT_NE(row, nullptr);
  EXPECT_TRUE(row->is_contiguous());
}

TEST(Views, PermuteErrors) {
  {
    Graph g;
    Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
    EXPECT_EQ(permute(g, a, 0, 0, 1, 2), nullptr);
    EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  }
  {
    Graph g;
    Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
    EXPECT_EQ(permute(g, a, 0, 1, 2, 4), nullptr);
    EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  }
  for (DType q : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k}) {
    Graph g;
    Tensor* w = g.weight(q, {256, 4, 2, 1}, "w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(transpose(g, w), nullptr) << dtype_name(q);
    EXPECT_EQ(g.status().code(), StatusCode::type_mismatch);
    EXPECT_NE(g.status().message().find("'w'"), std::string::npos);
    EXPECT_TRUE(g.nodes().empty());
  }
  {
    Graph g;
    Tensor* w = g.weight(DType::q8_0, {64, 4, 1, 1}, "w");
    EXPECT_EQ(permute(g, w, 2, 0, 1, 3), nullptr);  // dim 0 moves to 2
    EXPECT_EQ(g.status().code(), StatusCode::type_mismatch);
  }
}

TEST(Views, PermuteQuantizedKeepingDimZero) {
  Graph g;
  Tensor* w = g.weight(DType::q8_0, {64, 4, 1, 1}, "w");  // nb {34, 68, 272, 272}
  Tensor* p = permute(g, w, 0, 2, 1, 3);
  ASSERT_NE(p, nullptr) << g.status().to_string();
  EXPECT_EQ(p->ne, (Shape{64, 1, 4, 1}));
  EXPECT_EQ(p->nb, (Strides{34, 272, 68, 272}));
  EXPECT_TRUE(p->is_contiguous());  // only a size-1 dim moved
  EXPECT_EQ(p->nbytes(), 272u);
}

// ---- names ----------------------------------------------------------------------------------------

TEST(Names, ShapeString) {
  EXPECT_EQ(shape_string({4096, 7, 1, 1}), "[4096, 7]");
  EXPECT_EQ(shape_string({1, 1, 1, 1}), "[1]");
  EXPECT_EQ(shape_string({5, 1, 1, 1}), "[5]");
  EXPECT_EQ(shape_string({2, 1, 3, 1}), "[2, 1, 3]");
  EXPECT_EQ(shape_string({1, 1, 1, 5}), "[1, 1, 1, 5]");
  EXPECT_EQ(shape_string({64, 32, 8, 2}), "[64, 32, 8, 2]");
}

TEST(Names, Describe) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4096, 7, 1, 1}, "x");
  Tensor* q = g.weight(DType::q4_k, {256, 2, 1, 1}, "");
  EXPECT_EQ(describe(*a), "'x' f32 [4096, 7]");
  EXPECT_EQ(describe(*q), "'(unnamed)' q4_K [256, 2]");
}

TEST(Names, OpNames) {
  EXPECT_STREQ(op_name(OpKind::none), "none");
  EXPECT_STREQ(op_name(OpKind::mul_mat), "mul_mat");
  EXPECT_STREQ(op_name(OpKind::set_rows), "set_rows");
  EXPECT_STREQ(op_name(OpKind::sum_rows), "sum_rows");
  // Every op has its own name.
  for (int i = 0; i < kOpCount; ++i)
    for (int j = i + 1; j < kOpCount; ++j)
      EXPECT_STRNE(op_name(static_cast<OpKind>(i)), op_name(static_cast<OpKind>(j)));
}

// ---- copies of strided views on the CPU backend ------------------------------------------------------

// Allocates `g`, writes each leaf's values, runs it on a 3-thread CPU backend.
class CopyTest : public ::testing::Test {
 protected:
  void run(Graph& g, const std::vector<std::pair<Tensor*, std::vector<float>>>& inputs) {
    ASSERT_TRUE(g.status().ok()) << g.status().to_string();
    auto alloc = allocate_graph(g, cpu_buffer_type());
    ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
    alloc_ = std::move(alloc.value());
    for (auto& [t, v] : inputs) {
      Status s = tensor_from_floats(t, v.data(), static_cast<int64_t>(v.size()));
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    Status s = backend_->compute(g);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  static std::vector<float> floats(const Tensor* t) {
    auto r = tensor_to_floats(t);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : std::vector<float>{};
  }

  std::unique_ptr<Backend> backend_ = make_cpu_backend(3);
  GraphAllocation alloc_;
};

// a [4, 3] with a(i0, i1) = 100*i1 + i0 + 1, stored row by row.
const std::vector<float> kA43 = {1, 2, 3, 4, 101, 102, 103, 104, 201, 202, 203, 204};
// transpose(a) packed: [3, 4] with t(j0, j1) = a(j1, j0).
const std::vector<float> kA43T = {1, 101, 201, 2, 102, 202, 3, 103, 203, 4, 104, 204};

TEST_F(CopyTest, ContOfTranspose) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
  Tensor* c = cont(g, transpose(g, a));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->ne, (Shape{3, 4, 1, 1}));
  EXPECT_TRUE(c->is_contiguous());
  g.mark_output(c);
  run(g, {{a, kA43}});
  EXPECT_EQ(floats(c), kA43T);
}

TEST_F(CopyTest, ContOfTransposeF16AndBf16) {
  for (DType type : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(type));
    Graph g;
    Tensor* a = g.input(type, {4, 3, 1, 1}, "a");
    Tensor* c = cont(g, transpose(g, a));
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->type, type);
    g.mark_output(c);
    // Every value has at most 8 significant bits (204 = 0b11001100), so both types hold it exactly.
    run(g, {{a, kA43}});
    EXPECT_EQ(floats(c), kA43T);
  }
}

TEST_F(CopyTest, ContOfPermute3d) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 2, 1}, "a");
  std::vector<float> av(24);
  // a(i0, i1, i2) = 1 + i0 + 10*i1 + 100*i2
  for (int i2 = 0; i2 < 2; ++i2)
    for (int i1 = 0; i1 < 3; ++i1)
      for (int i0 = 0; i0 < 4; ++i0) av[i2 * 12 + i1 * 4 + i0] = 1.0f + i0 + 10.0f * i1 + 100.0f * i2;
  Tensor* p = permute(g, a, 2, 0, 1, 3);  // p(j0, j1, j2) = a(j2, j0, j1); ne {3, 2, 4}
  Tensor* c = cont(g, p);
  g.mark_output(c);
  run(g, {{a, av}});
  const std::vector<float> out = floats(c);
  ASSERT_EQ(out.size(), 24u);
  // Hand check of a few: c[0] = p(0,0,0) = a(0,0,0) = 1; c[1] = p(1,0,0) = a(0,1,0) = 11;
  // c[3] = p(0,1,0) = a(0,0,1) = 101; c[6] = p(0,0,1) = a(1,0,0) = 2.
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 11.0f);
  EXPECT_EQ(out[2], 21.0f);
  EXPECT_EQ(out[3], 101.0f);
  EXPECT_EQ(out[6], 2.0f);
  for (int j2 = 0; j2 < 4; ++j2)
    for (int j1 = 0; j1 < 2; ++j1)
      for (int j0 = 0; j0 < 3; ++j0)
        EXPECT_EQ(out[j2 * 6 + j1 * 3 + j0], 1.0f + j2 + 10.0f * j0 + 100.0f * j1)
            << j0 << "," << j1 << "," << j2;
}

TEST_F(CopyTest, CpyTransposeIntoFlatAndF16) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
  Tensor* flat = g.new_tensor(DType::f32, {12, 1, 1, 1}, "flat");
  Tensor* half = g.new_tensor(DType::f16, {3, 4, 1, 1}, "half");
  Tensor* t = transpose(g, a);
  Tensor* c1 = cpy(g, t, flat);
  Tensor* c2 = cpy(g, t, half);
  ASSERT_TRUE(c1 && c2) << g.status().to_string();
  EXPECT_EQ(c1->view_src, flat);
  EXPECT_EQ(c2->view_src, half);
  g.mark_output(c1);
  g.mark_output(c2);
  run(g, {{a, kA43}});
  EXPECT_EQ(floats(flat), kA43T);
  EXPECT_EQ(floats(c1), kA43T);
  EXPECT_EQ(floats(half), kA43T);
}

TEST_F(CopyTest, CpyIntoTransposedDestination) {
  Graph g;
  Tensor* src = g.input(DType::f32, {3, 4, 1, 1}, "src");
  Tensor* dst = g.new_tensor(DType::f32, {4, 3, 1, 1}, "dst");
  // Writing the packed transpose through dst's transposed view restores a's layout in dst.
  Tensor* c = cpy(g, src, transpose(g, dst));
  ASSERT_NE(c, nullptr);
  g.mark_output(c);
  run(g, {{src, kA43T}, {dst, std::vector<float>(12, -7.0f)}});
  EXPECT_EQ(floats(dst), kA43);
}

TEST_F(CopyTest, CpyI32Transpose) {
  Graph g;
  Tensor* a = g.input(DType::i32, {4, 3, 1, 1}, "a");
  Tensor* dst = g.new_tensor(DType::i32, {3, 4, 1, 1}, "dst");
  Tensor* c = cpy(g, transpose(g, a), dst);
  ASSERT_NE(c, nullptr);
  g.mark_output(c);
  run(g, {{a, kA43}});
  std::vector<int32_t> out(12);
  ASSERT_TRUE(tensor_read(dst, out.data(), 0, 48).ok());
  const std::vector<int32_t> expect = {1, 101, 201, 2, 102, 202, 3, 103, 203, 4, 104, 204};
  EXPECT_EQ(out, expect);
}

TEST_F(CopyTest, CpyOfRowSliceView) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 3, 1, 1}, "a");
  // Columns 1..2 of every row: [2, 3] with row stride 16 at offset 4.
  Tensor* v = view(g, a, {2, 3, 1, 1}, {0, 16, 48, 48}, 4);
  Tensor* c = cont(g, v);
  ASSERT_NE(c, nullptr);
  g.mark_output(c);
  run(g, {{a, kA43}});
  EXPECT_EQ(floats(c), (std::vector<float>{2, 3, 102, 103, 202, 203}));
}

TEST_F(CopyTest, CpyTransposeIntoQuantizedFlat) {
  Graph g;
  Tensor* a = g.input(DType::f32, {2, 64, 1, 1}, "a");
  Tensor* q = g.new_tensor(DType::q8_0, {128, 1, 1, 1}, "q");
  // transpose(a) is [64, 2]; its rows land one after the other in q's four blocks.
  Tensor* c = cpy(g, transpose(g, a), q);
  ASSERT_NE(c, nullptr) << g.status().to_string();
  g.mark_output(c);
  std::vector<float> av(128);
  for (int i = 0; i < 128; ++i) av[i] = static_cast<float>((i * 29) % 61 - 30) * 0.125f;
  run(g, {{a, av}});
  // a(i0, i1) = av[i1*2 + i0]; transpose row j holds a(j, 0..63).
  std::vector<float> t(128);
  for (int j = 0; j < 2; ++j)
    for (int k = 0; k < 64; ++k) t[j * 64 + k] = av[k * 2 + j];
  std::vector<uint8_t> expect(4 * sizeof(BlockQ8_0)), got(expect.size());
  quantize_row(DType::q8_0, t.data(), expect.data(), 128);
  ASSERT_TRUE(tensor_read(q, got.data(), 0, got.size()).ok());
  EXPECT_EQ(got, expect);
}

}  // namespace
}  // namespace loom
