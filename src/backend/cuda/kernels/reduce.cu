// Row reductions. Sources may have any element stride (sum_rows, argmax and top_k accept
// non-contiguous rows), so elements are addressed through nb[0].
#include "common.cuh"
#include "reduce.cuh"

namespace loom::cuda {

namespace {

__device__ __forceinline__ float load_f32(const char* row, int64_t i, int64_t stride) {
  return *reinterpret_cast<const float*>(row + i * stride);
}

__global__ void sum_rows_kernel(TensorDesc dst, TensorDesc a) {
  pdl_wait();
  __shared__ double scratch[32];  // in double, as the CPU's sum_rows (docs/NUMERICS.md)
  for (int64_t r = blockIdx.x; r < nrows(a); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, a.ne[1], a.ne[2], i1, i2, i3);
    const char* row = row_ptr(a, i1, i2, i3);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < a.ne[0]; i += blockDim.x) sum += load_f32(row, i, a.nb[0]);
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) *reinterpret_cast<float*>(row_ptr(dst, i1, i2, i3)) = static_cast<float>(sum);
  }
}

// (value, index) pairs ordered by larger value, then lower index.
__device__ __forceinline__ bool beats(float v, int64_t i, float best_v, int64_t best_i) {
  return v > best_v || (v == best_v && i < best_i);
}

__global__ void argmax_kernel(TensorDesc dst, TensorDesc a) {
  pdl_wait();
  __shared__ float warp_v[32];
  __shared__ int64_t warp_i[32];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int64_t r = blockIdx.x; r < nrows(a); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, a.ne[1], a.ne[2], i1, i2, i3);
    const char* row = row_ptr(a, i1, i2, i3);
    // start from the thread's first element so rows of -inf still pick index 0 like the CPU
    float best_v = -INFINITY;
    int64_t best_i = INT64_MAX;
    if (threadIdx.x < a.ne[0]) {
      best_v = load_f32(row, threadIdx.x, a.nb[0]);
      best_i = threadIdx.x;
    }
    for (int64_t i = threadIdx.x + blockDim.x; i < a.ne[0]; i += blockDim.x) {
      const float v = load_f32(row, i, a.nb[0]);
      if (v > best_v) best_v = v, best_i = i;
    }
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best_v, o);
      const int64_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (beats(v, i, best_v, best_i)) best_v = v, best_i = i;
    }
    if (lane == 0) {
      warp_v[warp] = best_v;
      warp_i[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / kWarpSize); ++w)
        if (beats(warp_v[w], warp_i[w], best_v, best_i)) best_v = warp_v[w], best_i = warp_i[w];
      *reinterpret_cast<int32_t*>(element_ptr(dst, i1, i2, i3, 0)) = static_cast<int32_t>(best_i);
    }
    __syncthreads();
  }
}

constexpr int kTopKThreads = 256;

// top_k by ranking: element i's rank is the number of elements that beat it (larger, or equal
// with a lower index); ranks are distinct, so rank < k places i directly, already sorted. That is
// n^2 comparisons per row, read from shared-memory tiles and spread over n threads: cheap for
// the short rows of MoE routing, ~1.6e10 comparisons for a 128k vocabulary row (an estimate of
// a few ms, not measured). A radix select of the k-th value first is the faster replacement.
__global__ void top_k_kernel(TensorDesc dst, TensorDesc a, int k) {
  pdl_wait();
  __shared__ float tile[kTopKThreads];
  const int64_t n = a.ne[0];
  for (int64_t r = blockIdx.y; r < nrows(a); r += gridDim.y) {
    int64_t i1, i2, i3;
    split_row(r, a.ne[1], a.ne[2], i1, i2, i3);
    const char* row = row_ptr(a, i1, i2, i3);
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x; base < n;
         base += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const float v = i < n ? load_f32(row, i, a.nb[0]) : 0.0f;
      int64_t rank = 0;
      for (int64_t t0 = 0; t0 < n; t0 += blockDim.x) {
        __syncthreads();
        if (t0 + threadIdx.x < n) tile[threadIdx.x] = load_f32(row, t0 + threadIdx.x, a.nb[0]);
        __syncthreads();
        const int64_t count = n - t0 < blockDim.x ? n - t0 : blockDim.x;
        for (int64_t j = 0; j < count; ++j) {
          const float w = tile[j];
          rank += (w > v || (w == v && t0 + j < i)) ? 1 : 0;
        }
      }
      if (i < n && rank < k)
        *reinterpret_cast<int32_t*>(element_ptr(dst, rank, i1, i2, i3)) = static_cast<int32_t>(i);
    }
  }
}

}  // namespace

CudaError launch_sum_rows(const LaunchContext& ctx, const Tensor* dst) {
  const Tensor* a = dst->src[0];
  if (a->nrows() == 0) return {};
  sum_rows_kernel<<<row_grid(a->nrows()), row_block_threads(a->ne[0]), 0, ctx.stream>>>(desc_of(dst),
                                                                                        desc_of(a));
  LOOM_CUDA_CHECK_LAUNCH("sum_rows_kernel");
  return {};
}

CudaError launch_argmax(const LaunchContext& ctx, const Tensor* dst) {
  const Tensor* a = dst->src[0];
  if (a->nrows() == 0 || a->ne[0] == 0) return {};
  argmax_kernel<<<row_grid(a->nrows()), row_block_threads(a->ne[0]), 0, ctx.stream>>>(desc_of(dst),
                                                                                      desc_of(a));
  LOOM_CUDA_CHECK_LAUNCH("argmax_kernel");
  return {};
}

CudaError launch_top_k(const LaunchContext& ctx, const Tensor* dst, int k) {
  const Tensor* a = dst->src[0];
  if (a->nrows() == 0 || a->ne[0] == 0) return {};
  const int64_t chunks = (a->ne[0] + kTopKThreads - 1) / kTopKThreads;
  const int64_t rows = a->nrows();
  const dim3 grid(static_cast<unsigned>(chunks < 65535 ? chunks : 65535),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  top_k_kernel<<<grid, kTopKThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(a), k);
  LOOM_CUDA_CHECK_LAUNCH("top_k_kernel");
  return {};
}

}  // namespace loom::cuda
