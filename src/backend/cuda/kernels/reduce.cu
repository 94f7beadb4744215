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
// a few ms, not measured). Rows of kSelectMinN and more take top_k_select_kernel (radix select).
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

// ---- top_k over long rows (a vocabulary): radix select, then a sort of the k chosen ----------------

constexpr int kSelectThreads = 1024;
constexpr int kSelectMaxK = 2048;   ///< k chosen rows hold in shared memory (pairs of key and index)
constexpr int64_t kSelectMinN = 4096;  ///< shorter rows keep the ranking kernel (MoE routing)

/// A float's order as an unsigned key: larger float, larger key; -0 keyed as +0, so that equal values
/// tie by index as on the CPU (a NaN ranks above +inf: the sampler checks rows for NaN itself).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/// Whether (ka, ia) comes before (kb, ib): the larger key, or the lower index among equal keys.
__device__ __forceinline__ bool ranks_before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// One block per row. k == 1: one pass, the best (key, index) by shuffles. Otherwise the k-th largest
// key T by a radix select (4 passes of 8 bits, a shared histogram each, the bin holding the k-th
// chosen by thread 0), then every key > T is collected (atomic slots: any order) and the lowest-index
// keys == T that complete k (tiles in index order, a ballot scan: deterministic), and the k pairs are
// bitonic-sorted in shared memory. Same result as the ranking kernel and the CPU's partial_sort.
__global__ void __launch_bounds__(kSelectThreads) top_k_select_kernel(TensorDesc dst, TensorDesc a, int k) {
  pdl_wait();
  __shared__ unsigned hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_need, s_gt;
  __shared__ uint32_t keys[kSelectMaxK];
  __shared__ int32_t idxs[kSelectMaxK];
  __shared__ int warp_count[kSelectThreads / kWarpSize];
  __shared__ uint32_t warp_key[kSelectThreads / kWarpSize];
  __shared__ int32_t warp_idx[kSelectThreads / kWarpSize];
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  const int64_t n = a.ne[0];
  for (int64_t r = blockIdx.x; r < nrows(a); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, a.ne[1], a.ne[2], i1, i2, i3);
    const char* row = row_ptr(a, i1, i2, i3);
    int32_t* out = reinterpret_cast<int32_t*>(element_ptr(dst, 0, i1, i2, i3));
    if (k == 1) {
      uint32_t best_k = 0;
      int32_t best_i = INT32_MAX;
      for (int64_t i = tid; i < n; i += blockDim.x) {
        const uint32_t key = order_key(load_f32(row, i, a.nb[0]));
        if (ranks_before(key, static_cast<int32_t>(i), best_k, best_i)) best_k = key, best_i = static_cast<int32_t>(i);
      }
      for (int o = kWarpSize / 2; o > 0; o /= 2) {
        const uint32_t ok = __shfl_xor_sync(0xffffffffu, best_k, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (ranks_before(ok, oi, best_k, best_i)) best_k = ok, best_i = oi;
      }
      if (lane == 0) warp_key[warp] = best_k, warp_idx[warp] = best_i;
      __syncthreads();
      if (tid == 0) {
        for (int w = 1; w < n_warps; ++w)
          if (ranks_before(warp_key[w], warp_idx[w], best_k, best_i)) best_k = warp_key[w], best_i = warp_idx[w];
        out[0] = best_i;
      }
      __syncthreads();
      continue;
    }
    // the k-th largest key, 8 bits at a time
    if (tid == 0) s_prefix = 0, s_mask = 0, s_need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int64_t i = tid; i < n; i += blockDim.x) {
        const uint32_t key = order_key(load_f32(row, i, a.nb[0]));
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        int need = s_need, bin = 255;
        for (; bin > 0; --bin) {
          if (static_cast<int>(hist[bin]) >= need) break;
          need -= static_cast<int>(hist[bin]);
        }
        s_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
        s_mask = mask | (255u << shift);
        s_need = need;
        s_gt = 0;
      }
      __syncthreads();
    }
    const uint32_t threshold = s_prefix;
    const int need_eq = s_need;  // keys equal to the threshold to take; the k - need_eq larger ones all go
    for (int64_t i = tid; i < n; i += blockDim.x) {
      const uint32_t key = order_key(load_f32(row, i, a.nb[0]));
      if (key > threshold) {
        const int slot = atomicAdd(&s_gt, 1);
        keys[slot] = key;
        idxs[slot] = static_cast<int32_t>(i);
      }
    }
    // the first need_eq equal keys in index order: a tile of blockDim.x indices at a time
    int taken = 0;
    for (int64_t t0 = 0; t0 < n && taken < need_eq; t0 += blockDim.x) {
      const int64_t i = t0 + tid;
      const bool eq = i < n && order_key(load_f32(row, i, a.nb[0])) == threshold;
      const unsigned ballot = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, total = 0;
      for (int w = 0; w < n_warps; ++w) {
        before += w < warp ? warp_count[w] : 0;
        total += warp_count[w];
      }
      const int pos = taken + before + __popc(ballot & ((1u << lane) - 1u));
      if (eq && pos < need_eq) {
        keys[k - need_eq + pos] = threshold;
        idxs[k - need_eq + pos] = static_cast<int32_t>(i);
      }
      taken += total;
      __syncthreads();  // warp_count is rewritten by the next tile
    }
    // sort the k pairs (padded to a power of two with pairs that rank last)
    int p2 = 1;
    while (p2 < k) p2 *= 2;
    for (int i = k + tid; i < p2; i += blockDim.x) keys[i] = 0, idxs[i] = INT32_MAX;
    __syncthreads();
    for (int size = 2; size <= p2; size *= 2) {
      for (int stride = size / 2; stride > 0; stride /= 2) {
        for (int i = tid; i < p2; i += blockDim.x) {
          const int j = i ^ stride;
          if (j > i) {
            const bool ascending = (i & size) == 0;  // "ascending": in ranking order
            const bool j_first = ranks_before(keys[j], idxs[j], keys[i], idxs[i]);
            if (ascending == j_first) {
              const uint32_t tk = keys[i];
              const int32_t ti = idxs[i];
              keys[i] = keys[j], idxs[i] = idxs[j];
              keys[j] = tk, idxs[j] = ti;
            }
          }
        }
        __syncthreads();
      }
    }
    for (int i = tid; i < k; i += blockDim.x) out[i] = idxs[i];
    __syncthreads();
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
  if (a->ne[0] >= kSelectMinN && k <= kSelectMaxK && dst->nb[0] == sizeof(int32_t)) {
    const int64_t rows = a->nrows();
    top_k_select_kernel<<<static_cast<unsigned>(rows < 65535 ? rows : 65535), kSelectThreads, 0, ctx.stream>>>(
        desc_of(dst), desc_of(a), k);
    LOOM_CUDA_CHECK_LAUNCH("top_k_select_kernel");
    return {};
  }
  const int64_t chunks = (a->ne[0] + kTopKThreads - 1) / kTopKThreads;
  const int64_t rows = a->nrows();
  const dim3 grid(static_cast<unsigned>(chunks < 65535 ? chunks : 65535),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  top_k_kernel<<<grid, kTopKThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(a), k);
  LOOM_CUDA_CHECK_LAUNCH("top_k_kernel");
  return {};
}

}  // namespace loom::cuda
