// Where gemm_q's warpgroup kernel finds its activations in the packed tiles (gemm_q_wgmma.cu's
// pack_gemm_q_tiles_kernel writes them; a norm handing its output to the products writes them too:
// fused.cu). Device code only; includes nothing outside src/backend/cuda/.
#pragma once

#include <cstdint>

#include "gemm_q_plan.h"

namespace loom::cuda {

/// Per 64-column tile and 256-k chunk, 32 KB of f16 core matrices (8 columns x 8 k, 16 bytes a column);
/// column col's k32 group g32 (its k 32 g32 .. 32 g32 + 31, of `chunks` chunks) is four 16-byte pieces,
/// 64 pieces apart, the first at the 16-byte index this returns. Piece q holds the halves of k
/// o, o + 1, 8 + o, 9 + o, 16 + o, 17 + o, 24 + o, 25 + o of the group, o = 4 (q / 2) + 2 (q % 2): the
/// k order of the weights' fragments (gemm_q_wgmma.cu).
__device__ __forceinline__ int64_t gemm_q_tile_piece(int64_t col, int64_t g32, int64_t chunks) {
  constexpr int kBN = gemm_q_plan::kBN, kGroups = gemm_q_plan::kChunk / 32;
  const int64_t tile = col / kBN * chunks + g32 / kGroups;
  const int64_t j = g32 % kGroups;
  return tile * (kBN * gemm_q_plan::kChunk / 8) + (4 * j * 8 + (col % kBN) / 8) * 8 + col % 8;
}

}  // namespace loom::cuda
