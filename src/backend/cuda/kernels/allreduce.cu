// The one-shot all-reduce (allreduce.cuh).
//
// Ordering, per block b and call epoch e (each block counts its own calls; every rank runs the same
// calls with the same grid, so the counts agree): the writes of call e go to parity e & 1. Rank p
// reads parity e & 1 in call e only after every rank q raised flag e there, and q can reach call
// e + 2 (writing that parity again) only after p raised its flag of call e + 1 on q, which p does
// after finishing call e (stream order). So two parities suffice, and flags only grow.
#include "allreduce.cuh"

#include <algorithm>

#include "common.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(kThreads)
    oneshot_all_reduce_kernel(OneShotGroup g, const float* src, float* dst, int64_t n, int64_t chunk) {
  pdl_wait();
  __shared__ uint32_t epoch_s;
  const int b = blockIdx.x;
  const int64_t begin = b * chunk, end = min(n, begin + chunk);
  if (threadIdx.x == 0) epoch_s = g.epoch[b] + 1;
  __syncthreads();
  const uint32_t epoch = epoch_s;
  const int64_t parity = epoch & 1u;
  // 1. my partial into slot `rank` of every rank's buffer (mine too)
  for (int q = 0; q < g.n_ranks; ++q) {
    float* slot = g.recv[q] + (parity * g.n_ranks + g.rank) * g.max_elems;
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) slot[i] = src[i];
  }
  __syncthreads();
  // 2. the flags: my block's data is there (the fence orders the stores above before them)
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int q = 0; q < g.n_ranks; ++q) store_release_sys(g.flags[q] + g.rank * kOneShotMaxBlocks + b, epoch);
  }
  // 3. every rank's flag on my buffer
  if (threadIdx.x < g.n_ranks)
    while (load_acquire_sys(g.flags[g.rank] + threadIdx.x * kOneShotMaxBlocks + b) < epoch) {
    }
  __syncthreads();
  // 4. the sum in rank order (the same order on every rank: the same bits everywhere)
  const float* mine = g.recv[g.rank] + parity * g.n_ranks * g.max_elems;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float s = __ldcg(mine + i);
    for (int q = 1; q < g.n_ranks; ++q) s += __ldcg(mine + q * g.max_elems + i);
    dst[i] = s;
  }
  if (threadIdx.x == 0) g.epoch[b] = epoch;
}

}  // namespace

CudaError launch_oneshot_all_reduce(const OneShotGroup& g, const float* src, float* dst, int64_t n,
                                    cudaStream_t stream) {
  if (n <= 0 || n > g.max_elems || g.n_ranks < 1 || g.n_ranks > kOneShotMaxRanks)
    return CudaError::runtime(cudaErrorInvalidValue, "one-shot all-reduce: size or rank count out of range",
                              __FILE__, __LINE__);
  // A grid that depends on n alone: every rank launches the same blocks.
  const int64_t per_block = 4 * kThreads;
  const int blocks = static_cast<int>(std::min<int64_t>(kOneShotMaxBlocks, (n + per_block - 1) / per_block));
  const int64_t chunk = (n + blocks - 1) / blocks;
  oneshot_all_reduce_kernel<<<blocks, kThreads, 0, stream>>>(g, src, dst, n, chunk);
  LOOM_CUDA_CHECK_LAUNCH("oneshot_all_reduce_kernel");
  return {};
}

}  // namespace loom::cuda
