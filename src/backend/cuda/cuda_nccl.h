// NCCL for tensor parallelism, loaded at run time (dlopen of libnccl.so.2) so that the CUDA backend
// still loads where NCCL is missing: only a request for several GPUs needs it.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <span>
#include <vector>

#include "kernels/allreduce.cuh"
#include "kernels/launch.h"
#include "loom/comm.h"

namespace loom::cuda {

/// One communicator per device ordinal, rank i on devices[i] (ncclCommInitAll); an error naming
/// NCCL's reason, or saying that libnccl.so.2 is not there.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(std::span<const int> devices);

/// Sums `n` floats over the ranks of `comm` (a communicator made above) on `stream`; src may equal dst.
CudaError nccl_all_reduce(Communicator& comm, const float* src, float* dst, size_t n, cudaStream_t stream);

}  // namespace loom::cuda
