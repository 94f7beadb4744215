// How gemm_q_kernel (gemm_q.cu) splits a product over k: host code only, so the CPU tests check it
// (tests/unit/test_cuda_gemm_q_plan.cpp). A function of the shape alone: the scratch size and the
// result do not depend on the device, and a column's split (hence its sums) is the same for every
// column count within one column tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace loom::cuda::gemm_q_plan {

constexpr int kBM = 256;     // weight rows per block
constexpr int kBN = 64;      // columns per block
constexpr int kChunk = 256;  // k per shared-memory stage (a whole block of every format)
// SMs the split aims to fill: those of a 132-SM H100/H200 (not the device's, see above).
constexpr int64_t kTargetBlocks = 132;
constexpr int kMaxSplits = 16;
constexpr int kMaxParts = 3;  // products one launch computes at most: the Q, K and V of one activation (or gate and up)

/// The grid: column tiles x row tiles x splits, each split k_split of k (the last one shorter).
struct Plan {
  int64_t m, n, k, col_tiles, row_tiles;
  int splits;
  int64_t k_split;
};

// The time of a product split into `per`-chunk k ranges, in chunks: blocks in launch order (split
// after split, the last one shorter) each taken by the first of kTargetBlocks SMs to be free, a block
// costing its chunks plus kBlockCost of its own (the first stage's wait, the stores). Fitted on the
// H200 (ncu, q4_K, 64 columns): a block takes ~3.5 + 5.65 us a chunk (1, 4, 7, 8 chunks: 9.3, 26.2,
// 44.2, 48.8 us); [6144, 64] in 6 splits (120 blocks of 3 chunks, 24 of 1) 22.4 us, in 4 (96 of 4) 26.2;
// [14336, 64] in 2 splits (112 of 8) 48.8, in 3 (two waves) 64.4.
constexpr double kBlockCost = 0.6;
inline double makespan(int64_t tiles, int64_t chunks, int64_t per) {
  // The full splits' blocks, all alike, spread evenly in closed form: r SMs take one more than the
  // rest. The shorter last split (fewer than kTargetBlocks blocks: plan() splits only such grids)
  // goes block by block to the first free SM.
  const int64_t n1 = tiles * (chunks / per), q = n1 / kTargetBlocks, r = n1 % kTargetBlocks;
  const double len = kBlockCost + static_cast<double>(per);
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int64_t i = 0; i < kTargetBlocks; ++i) free_at.push(static_cast<double>(i < r ? q + 1 : q) * len);
  double end = static_cast<double>(r > 0 ? q + 1 : q) * len;
  if (chunks % per != 0)
    for (int64_t i = 0; i < tiles; ++i) {
      const double t = free_at.top() + kBlockCost + static_cast<double>(chunks % per);
      free_at.pop();
      free_at.push(t);
      end = std::max(end, t);
    }
  return end;
}

/// The split over k with the shortest makespan (the fewer splits on a tie); a grid that fills the GPU
/// unsplit stays so. k a multiple of kChunk. `by_rows`: chosen for one column tile whatever n, so a
/// column's split is the same for every column count (the batch-invariant mode).
inline Plan plan(int64_t m, int64_t n, int64_t k, bool by_rows = false) {
  Plan s{m, n, k, 0, 0, 1, 0};
  s.col_tiles = (s.n + kBN - 1) / kBN;
  s.row_tiles = (s.m + kBM - 1) / kBM;
  const int64_t chunks = s.k / kChunk, tiles = (by_rows ? 1 : s.col_tiles) * s.row_tiles;
  int64_t per_split = chunks;
  if (tiles < kTargetBlocks) {
    double best = makespan(tiles, chunks, chunks);
    for (int64_t splits = 2; splits <= std::min<int64_t>(kMaxSplits, chunks); ++splits) {
      const int64_t per = (chunks + splits - 1) / splits;
      if (per == per_split) continue;
      const double t = makespan(tiles, chunks, per);
      if (t < best - 1e-9) best = t, per_split = per;
    }
  }
  s.k_split = per_split * kChunk;
  s.splits = static_cast<int>((chunks + per_split - 1) / per_split);
  return s;
}

}  // namespace loom::cuda::gemm_q_plan
