// The stand-alone LL all-reduce (allreduce.cuh): 1024 floats a block, a slot each.
#include "allreduce.cuh"

#include "common.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kPerBlock = 4 * kThreads;

__global__ void __launch_bounds__(kThreads)
    ll_all_reduce_kernel(LLGroup g, const float4* src, float4* dst, int64_t n4) {
  pdl_wait();
  const int slot = static_cast<int>(blockIdx.x);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;  // float4 index
  const float4 mine = i < n4 ? src[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const uint32_t epoch = ll_begin(g, slot);  // a barrier: every load of src is done (src may be dst)
  const int64_t w = 4 * static_cast<int64_t>(threadIdx.x);  // the words of this block's slot
  if (i < n4) {
    ll_send4(g, epoch, slot, w, mine);
    dst[i] = ll_sum4(g, epoch, slot, w, mine);
  }
  ll_end(g, slot, epoch);
}

}  // namespace

CudaError launch_ll_all_reduce(const LLGroup& g, const float* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0 || n % 4 != 0 || n > kLLAllReduceMaxElems || g.n_ranks < 1 || g.n_ranks > kLLMaxRanks)
    return CudaError::runtime(cudaErrorInvalidValue, "LL all-reduce: size or rank count out of range", __FILE__,
                              __LINE__);
  // A grid that depends on n alone: every rank launches the same blocks, so the slots' epochs agree.
  const int blocks = static_cast<int>((n + kPerBlock - 1) / kPerBlock);
  ll_all_reduce_kernel<<<blocks, kThreads, 0, stream>>>(g, reinterpret_cast<const float4*>(src),
                                                        reinterpret_cast<float4*>(dst), n / 4);
  LOOM_CUDA_CHECK_LAUNCH("ll_all_reduce_kernel");
  return {};
}

}  // namespace loom::cuda
