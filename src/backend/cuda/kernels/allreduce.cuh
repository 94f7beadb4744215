// A one-shot all-reduce for small tensors between the GPUs of one process (tensor parallelism's
// decode steps): every rank writes its partial into a slot of every rank's receive buffer over
// NVLink (peer access), raises a flag there, waits for every rank's flag on its own buffer and sums
// the slots in rank order. One kernel and one flag round trip instead of NCCL's ring steps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_error.h"

namespace loom::cuda {

inline constexpr int kOneShotMaxRanks = 8;
inline constexpr int kOneShotMaxBlocks = 32;

/// One rank's view of the group's buffers (all device pointers, peers' reachable by peer access).
/// recv[q] of rank p: floats [2 parities][n_ranks][max_elems]; flags[q]: u32 [n_ranks][kOneShotMaxBlocks];
/// epoch: this rank's u32 [kOneShotMaxBlocks], one per block, all starting at 0.
struct OneShotGroup {
  int rank = 0;
  int n_ranks = 0;
  int64_t max_elems = 0;
  float* recv[kOneShotMaxRanks] = {};
  uint32_t* flags[kOneShotMaxRanks] = {};
  uint32_t* epoch = nullptr;
};

/// Sums n floats (n <= max_elems) over the ranks; every rank must launch it with the same n, in the
/// same order as its other collectives. src may equal dst.
CudaError launch_oneshot_all_reduce(const OneShotGroup& g, const float* src, float* dst, int64_t n,
                                    cudaStream_t stream);

}  // namespace loom::cuda
