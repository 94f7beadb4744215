// The quantized GEMM's split over k (src/backend/cuda/kernels/gemm_q_plan.h), host code checked on the
// CPU: the splits measured best on the H200 for the 8B shapes, the grid covering k exactly, and a
// column's split the same for every column count of one column tile (what keeps its sums the same
// whatever the batch).
#include <gtest/gtest.h>

#include "kernels/gemm_q_plan.h"

namespace {

using loom::cuda::gemm_q_plan::kChunk;
using loom::cuda::gemm_q_plan::kMaxSplits;
using loom::cuda::gemm_q_plan::makespan;
using loom::cuda::gemm_q_plan::plan;

TEST(GemmQPlan, EightBShapesAtSixtyFourColumns) {
  struct Want {
    int64_t m, k;
    int splits;
  };
  // [14336, 64] 2 splits of 8 chunks (3 splits in two waves: 64.4 us against 48.8); [6144, 64] 6 (22.4 us
  // against 26.2 for 4); FFN down (k 14336) 8 of 7 chunks; an output layer of 501 row tiles unsplit.
  for (const Want& w : {Want{14336, 4096, 2}, Want{6144, 4096, 6}, Want{4096, 14336, 8}, Want{4096, 4096, 8},
                        Want{1024, 4096, 16}, Want{128256, 4096, 1}}) {
    const auto p = plan(w.m, 64, w.k);
    EXPECT_EQ(p.splits, w.splits) << "[" << w.m << ", 64] k " << w.k;
    EXPECT_EQ(p.row_tiles, (w.m + 255) / 256);
    EXPECT_EQ(p.col_tiles, 1);
  }
}

TEST(GemmQPlan, SplitsCoverKAndStayInBounds) {
  for (int64_t m : {1, 17, 200, 256, 1024, 4096, 6144, 14336, 128256})
    for (int64_t n : {1, 9, 33, 64, 65, 200})
      for (int64_t k : {256, 512, 2048, 4096, 14336, 16384}) {
        const auto p = plan(m, n, k);
        ASSERT_GE(p.splits, 1);
        ASSERT_LE(p.splits, kMaxSplits);
        ASSERT_EQ(p.k_split % kChunk, 0);
        EXPECT_GE(p.splits * p.k_split, k) << m << " " << n << " " << k;
        EXPECT_LT((p.splits - 1) * p.k_split, k) << m << " " << n << " " << k;  // no empty split
      }
}

TEST(GemmQPlan, SplitDoesNotDependOnColumnsWithinATile) {
  for (int64_t m : {200, 1024, 4096, 6144, 14336})
    for (int64_t k : {512, 4096, 14336}) {
      const auto at64 = plan(m, 64, k);
      for (int64_t n = 1; n <= 64; ++n) {
        const auto p = plan(m, n, k);
        EXPECT_EQ(p.splits, at64.splits) << "[" << m << ", " << n << "] k " << k;
        EXPECT_EQ(p.k_split, at64.k_split);
      }
    }
}

TEST(GemmQPlan, ByRowsSplitDoesNotDependOnAnyColumnCount) {
  for (int64_t m : {200, 4096, 14336})
    for (int64_t k : {512, 4096, 14336}) {
      const auto one = plan(m, 1, k, true);
      EXPECT_EQ(one.splits, plan(m, 64, k).splits);  // within a tile: as the default
      for (int64_t n : {2, 9, 64, 65, 128, 500, 4096}) {
        const auto p = plan(m, n, k, true);
        EXPECT_EQ(p.splits, one.splits) << "[" << m << ", " << n << "] k " << k;
        EXPECT_EQ(p.k_split, one.k_split);
        EXPECT_EQ(p.col_tiles, (n + 63) / 64);
      }
    }
}

TEST(GemmQPlan, MakespanCountsWavesAndTheShortLastSplit) {
  // 132 blocks of 4 chunks: one wave of 4 + 0.6
  EXPECT_DOUBLE_EQ(makespan(132, 4, 4), 4.6);
  // 133: a second wave
  EXPECT_DOUBLE_EQ(makespan(133, 4, 4), 9.2);
  // 24 tiles, 16 chunks in splits of 3: 120 blocks of 3.6, then 24 of 1.6 (12 on free SMs, 12 after them)
  EXPECT_DOUBLE_EQ(makespan(24, 16, 3), 3.6);
  // never under the total work spread over every SM
  for (int64_t tiles : {1, 7, 56, 131})
    for (int64_t per : {1, 3, 8, 16}) EXPECT_GE(makespan(tiles, 16, per) + 1e-9, tiles * (16 + 0.6 * ((16 + per - 1) / per)) / 132.0);
}

}  // namespace
