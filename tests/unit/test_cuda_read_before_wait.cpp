// Which operands a programmatically launched kernel may read before its pdl_wait
// (src/backend/cuda/kernels/launch.h read_before_wait): only leaves marked as the step's inputs or
// weights; not an unmarked leaf (the KV caches, which the stores write) and not any op's output.
#include <gtest/gtest.h>

#include "kernels/launch.h"
#include "loom/graph.h"

namespace {

TEST(ReadBeforeWait, OnlyInputAndWeightLeaves) {
  loom::Graph g;
  loom::Tensor* pos = g.input(loom::DType::i32, {4, 1, 1, 1}, "inp_pos");
  loom::Tensor* w = g.weight(loom::DType::f32, {4, 1, 1, 1}, "attn_norm.weight");
  loom::Tensor* cache = g.new_tensor(loom::DType::f16, {4, 8, 1, 1}, "cache_k_l0");
  loom::Tensor* x = g.input(loom::DType::f32, {4, 1, 1, 1}, "x");
  loom::Tensor* sum = loom::add(g, x, w);
  EXPECT_TRUE(loom::cuda::read_before_wait(pos));
  EXPECT_TRUE(loom::cuda::read_before_wait(w));
  EXPECT_FALSE(loom::cuda::read_before_wait(cache));
  EXPECT_FALSE(loom::cuda::read_before_wait(sum));
}

}  // namespace
