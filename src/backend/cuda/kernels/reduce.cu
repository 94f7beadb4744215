// Row reductions. Sources may have any element stride (sum_rows, argmax and top_k accept
// non-contiguous rows), so elements are addressed through nb[0].
#include <algorithm>
#include <map>
#include <mutex>

#include <cooperative_groups.h>

#include "common.cuh"
#include "loom/backend.h"
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
constexpr int kSelectMaxK = 2048;      ///< k chosen rows hold in shared memory (pairs of key and index)
constexpr int64_t kSelectMinN = 4096;  ///< shorter rows keep the ranking kernel (MoE routing)
// The split path (a row over many blocks, then a merge): k <= kSplitMaxK, chunks of at most
// kChunkMax elements (held in shared memory), at most kMergeMax candidates for the merge.
constexpr int kSplitThreads = 512;   ///< per chunk block (its select's passes: 4 keys per thread)
constexpr int kMergeThreads = 1024;  ///< per merge block (up to kMergeMax candidates: 4 per thread)
constexpr int kSplitMaxK = 128;
constexpr int kChunkMin = 2048;
constexpr int kChunkMax = 8192;
constexpr int kMergeMax = 4096;
constexpr int kPrefilterMax = 1024;  ///< candidates a chunk block holds after its prefilter
/// Chunks the prefilter runs on: 8+ keys a thread (H200, 128256-row k = 40: 2,036-key chunks took 17.6 us
/// with it against 13.9 without; 64 rows at k = 64, 8,016-key chunks, 73.0 against 115.6)
constexpr int64_t kPrefilterMinLen = 8 * kSplitThreads;
constexpr int64_t kSplitWave = 132 * 4;  ///< chunk blocks resident at once on a 132-SM H100/H200 (4 per SM)

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

struct SelectShared {
  unsigned hist[256];
  uint32_t prefix, mask;
  int need, gt;
  int warp_count[32];
  uint32_t warp_key[32];
  int32_t warp_idx[32];
};

/// The k (key, index) pairs of n that rank first (larger key, then lower index), sorted, into
/// out_key/out_idx (room for k rounded up to a power of two); the whole block calls it and leaves it
/// synchronized. key_at(i) gives element i's key, index_at(i) its index; equal keys must come in
/// increasing index order along i (the ballot scan below takes the first ones). k == 1: one pass of
/// shuffles. Otherwise the k-th key T by a radix select (4 passes of 8 bits over a shared histogram,
/// lanes of a warp with the same bin adding once; warp 0 finds the bin holding the k-th), every key
/// > T (atomic slots: any order) and the first keys == T that complete k (a ballot scan, in order),
/// then a bitonic sort.
template <class KeyAt, class IndexAt>
__device__ void select_top_k(int64_t n, int k, KeyAt key_at, IndexAt index_at, SelectShared& s, uint32_t* out_key,
                             int32_t* out_idx) {
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  if (k == 1) {
    uint32_t best_k = 0;
    int32_t best_i = INT32_MAX;
    for (int64_t i = tid; i < n; i += blockDim.x) {
      const uint32_t key = key_at(i);
      const int32_t idx = index_at(i);
      if (ranks_before(key, idx, best_k, best_i)) best_k = key, best_i = idx;
    }
    for (int o = kWarpSize / 2; o > 0; o /= 2) {
      const uint32_t ok = __shfl_xor_sync(0xffffffffu, best_k, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ranks_before(ok, oi, best_k, best_i)) best_k = ok, best_i = oi;
    }
    if (lane == 0) s.warp_key[warp] = best_k, s.warp_idx[warp] = best_i;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < n_warps; ++w)
        if (ranks_before(s.warp_key[w], s.warp_idx[w], best_k, best_i)) best_k = s.warp_key[w], best_i = s.warp_idx[w];
      out_key[0] = best_k;
      out_idx[0] = best_i;
    }
    __syncthreads();
    return;
  }
  if (tid == 0) s.prefix = 0, s.mask = 0, s.need = k, s.gt = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += blockDim.x) s.hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s.prefix, mask = s.mask;
    for (int64_t base = 0; base < n; base += blockDim.x) {  // every lane of a warp goes round together
      const int64_t i = base + tid;
      uint32_t key = 0;
      bool in = false;
      if (i < n) key = key_at(i), in = (key & mask) == prefix;
      const unsigned bin = in ? (key >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], static_cast<unsigned>(__popc(peers)));
    }
    __syncthreads();
    if (warp == 0) {  // lane l holds bins 255 - 8l down to 248 - 8l; the first lane whose sum reaches need
      const int need = s.need;
      int mine = 0;
      for (int j = 0; j < 8; ++j) mine += static_cast<int>(s.hist[255 - 8 * lane - j]);
      int incl = mine;
      for (int o = 1; o < kWarpSize; o *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
      }
      const unsigned reach = __ballot_sync(0xffffffffu, incl >= need);
      if (lane == __ffs(reach) - 1) {
        int left = need - (incl - mine);
        int bin = 255 - 8 * lane;
        for (int j = 0; j < 7 && static_cast<int>(s.hist[bin]) < left; ++j) left -= static_cast<int>(s.hist[bin--]);
        s.prefix = prefix | (static_cast<uint32_t>(bin) << shift);
        s.mask = mask | (255u << shift);
        s.need = left;
      }
    }
    __syncthreads();
  }
  const uint32_t threshold = s.prefix;
  const int need_eq = s.need;  // keys equal to the threshold to take; the k - need_eq larger ones all go
  for (int64_t i = tid; i < n; i += blockDim.x) {
    const uint32_t key = key_at(i);
    if (key > threshold) {
      const int slot = atomicAdd(&s.gt, 1);
      out_key[slot] = key;
      out_idx[slot] = index_at(i);
    }
  }
  // the first need_eq equal keys in order: a tile of blockDim.x elements at a time
  int taken = 0;
  for (int64_t t0 = 0; t0 < n && taken < need_eq; t0 += blockDim.x) {
    const int64_t i = t0 + tid;
    const bool eq = i < n && key_at(i) == threshold;
    const unsigned ballot = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) s.warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < n_warps; ++w) {
      before += w < warp ? s.warp_count[w] : 0;
      total += s.warp_count[w];
    }
    const int pos = taken + before + __popc(ballot & ((1u << lane) - 1u));
    if (eq && pos < need_eq) {
      out_key[k - need_eq + pos] = threshold;
      out_idx[k - need_eq + pos] = index_at(i);
    }
    taken += total;
    __syncthreads();  // warp_count is rewritten by the next tile
  }
  // sort the k pairs (padded to a power of two with pairs that rank last)
  int p2 = 1;
  while (p2 < k) p2 *= 2;
  for (int i = k + tid; i < p2; i += blockDim.x) out_key[i] = 0, out_idx[i] = INT32_MAX;
  __syncthreads();
  for (int size = 2; size <= p2; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = tid; i < p2; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool ascending = (i & size) == 0;  // "ascending": in ranking order
          const bool j_first = ranks_before(out_key[j], out_idx[j], out_key[i], out_idx[i]);
          if (ascending == j_first) {
            const uint32_t tk = out_key[i];
            const int32_t ti = out_idx[i];
            out_key[i] = out_key[j], out_idx[i] = out_idx[j];
            out_key[j] = tk, out_idx[j] = ti;
          }
        }
      }
      __syncthreads();
    }
  }
}

// One block per row (rows too long for the split path, or k > kSplitMaxK): select_top_k over the row
// in global memory. Same result as the ranking kernel and the CPU's partial_sort.
__global__ void __launch_bounds__(kSelectThreads) top_k_select_kernel(TensorDesc dst, TensorDesc a, int k) {
  pdl_wait();
  __shared__ SelectShared s;
  __shared__ uint32_t keys[kSelectMaxK];
  __shared__ int32_t idxs[kSelectMaxK];
  for (int64_t r = blockIdx.x; r < nrows(a); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, a.ne[1], a.ne[2], i1, i2, i3);
    const char* row = row_ptr(a, i1, i2, i3);
    const int64_t nb0 = a.nb[0];
    select_top_k(
        a.ne[0], k, [=](int64_t i) { return order_key(load_f32(row, i, nb0)); },
        [](int64_t i) { return static_cast<int32_t>(i); }, s, keys, idxs);
    int32_t* out = reinterpret_cast<int32_t*>(element_ptr(dst, 0, i1, i2, i3));
    for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = idxs[i];
    __syncthreads();
  }
}

struct SplitArgs {
  TensorDesc dst, a;
  int k;
  int n_chunks;
  int64_t chunk;    ///< elements per chunk (the last may have fewer)
  uint32_t* keys;   ///< scratch: [rows][n_chunks][k] keys, each chunk's best first
  int32_t* idxs;    ///< the same for indices
  bool prefilter;   ///< the chunk blocks' prefilter (LOOM_CUDA_TOPK_PREFILTER=0: off)
};

// The split path, step 1: block (c, r) takes chunk c of row r into shared memory and writes its
// best min(k, chunk) pairs, sorted, to the scratch (only the last chunk may be shorter than k).
__global__ void __launch_bounds__(kSplitThreads, 4) top_k_chunk_kernel(SplitArgs p) {
  pdl_wait();
  __shared__ SelectShared s;
  __shared__ uint32_t chunk_keys[kChunkMax];
  __shared__ uint32_t best_key[kSplitMaxK];
  __shared__ int32_t best_idx[kSplitMaxK];
  const int64_t r = blockIdx.y;
  int64_t i1, i2, i3;
  split_row(r, p.a.ne[1], p.a.ne[2], i1, i2, i3);
  const char* row = row_ptr(p.a, i1, i2, i3);
  const int64_t begin = blockIdx.x * p.chunk;
  const int64_t len = p.a.ne[0] - begin < p.chunk ? p.a.ne[0] - begin : p.chunk;
  // kLoadBatch loads in flight per thread before the first is used (a loop of load-then-store waited
  // out each load's latency in turn: 19.7 us for a 128256-row's 63 chunks at k = 40, ncu on the H200)
  constexpr int kLoadBatch = 8;
  for (int64_t base = 0; base < len; base += kLoadBatch * kSplitThreads) {
    float v[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int64_t i = base + j * kSplitThreads + threadIdx.x;
      v[j] = i < len ? load_f32(row, begin + i, p.a.nb[0]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int64_t i = base + j * kSplitThreads + threadIdx.x;
      if (i < len) chunk_keys[i] = order_key(v[j]);
    }
  }
  __syncthreads();
  const int kk = static_cast<int>(min(static_cast<int64_t>(p.k), len));
  // Prefilter (k >= 2): each thread's maximum over its share of the chunk (every kSplitThreads-th key:
  // no bank conflicts); T, the kk-th largest of those maxima, is reached by at least kk keys, so every
  // key of the chunk's best kk is >= T. Those candidates go to the select, in index order (a ballot per
  // round of kSplitThreads keys, the (round, warp) counts scanned), instead of the whole chunk, when they
  // fit kPrefilterMax (many ties at T: the whole chunk as before). The same kk pairs.
  constexpr int kWarps = kSplitThreads / kWarpSize, kRounds = kChunkMax / kSplitThreads;
  static_assert(kRounds * kWarps <= kSplitThreads, "one thread a (round, warp) count");
  __shared__ uint32_t thread_max[kSplitThreads];
  __shared__ uint32_t cand_key[kPrefilterMax];
  __shared__ int32_t cand_idx[kPrefilterMax];
  __shared__ int round_off[kRounds * kWarps];  // candidates before each (round, warp)'s, then its count
  __shared__ int scan_total[kWarps + 1];
  bool done = false;
  if (p.prefilter && kk >= 2 && len >= kPrefilterMinLen) {
    const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int rounds = static_cast<int>((len + kSplitThreads - 1) / kSplitThreads);
    uint32_t mx = 0;
    for (int j = 0; j < rounds; ++j) {
      const int64_t i = static_cast<int64_t>(j) * kSplitThreads + tid;
      if (i < len) mx = max(mx, chunk_keys[i]);
    }
    thread_max[tid] = mx;
    __syncthreads();
    select_top_k(
        kSplitThreads, kk, [&](int64_t i) { return thread_max[i]; }, [](int64_t i) { return static_cast<int32_t>(i); },
        s, best_key, best_idx);
    const uint32_t t_key = best_key[kk - 1];
    auto flag = [&](int j) {
      const int64_t i = static_cast<int64_t>(j) * kSplitThreads + tid;
      return i < len && chunk_keys[i] >= t_key;
    };
    for (int j = 0; j < rounds; ++j) {
      const unsigned b = __ballot_sync(0xffffffffu, flag(j));
      if (lane == 0) round_off[j * kWarps + warp] = __popc(b);
    }
    __syncthreads();
    // exclusive scan of the rounds x warps counts, in that (index) order: warps of 32 entries, then
    // their totals
    const int entries = rounds * kWarps;
    const int c = tid < entries ? round_off[tid] : 0;
    int incl = c;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == kWarpSize - 1) scan_total[warp] = incl;
    __syncthreads();
    if (tid == 0) {
      int run = 0;
      for (int w = 0; w < kWarps; ++w) {
        const int t = scan_total[w];
        scan_total[w] = run;
        run += t;
      }
      scan_total[kWarps] = run;
    }
    __syncthreads();
    if (tid < entries) round_off[tid] = scan_total[warp] + incl - c;
    __syncthreads();
    const int total = scan_total[kWarps];
    if (total <= kPrefilterMax) {  // alike in every thread
      const unsigned below = (1u << lane) - 1u;
      for (int j = 0; j < rounds; ++j) {
        const bool f = flag(j);
        const unsigned b = __ballot_sync(0xffffffffu, f);
        if (f) {
          const int at_c = round_off[j * kWarps + warp] + __popc(b & below);
          const int64_t i = static_cast<int64_t>(j) * kSplitThreads + tid;
          cand_key[at_c] = chunk_keys[i];
          cand_idx[at_c] = static_cast<int32_t>(begin + i);
        }
      }
      __syncthreads();
      select_top_k(
          total, kk, [&](int64_t i) { return cand_key[i]; }, [&](int64_t i) { return cand_idx[i]; }, s, best_key,
          best_idx);
      done = true;
    }
  }
  if (!done)
    select_top_k(
        len, kk, [&](int64_t i) { return chunk_keys[i]; }, [=](int64_t i) { return static_cast<int32_t>(begin + i); },
        s, best_key, best_idx);
  const int64_t at = (r * p.n_chunks + blockIdx.x) * p.k;
  for (int i = threadIdx.x; i < kk; i += blockDim.x) p.keys[at + i] = best_key[i], p.idxs[at + i] = best_idx[i];
}

// The split path, step 2: block r selects row r's k among its chunks' n_chunks * k candidates. Equal
// keys come in increasing index order along the candidates (chunks in order, each sorted), as
// select_top_k needs.
__global__ void __launch_bounds__(kMergeThreads) top_k_merge_kernel(SplitArgs p) {
  pdl_wait();
  __shared__ SelectShared s;
  __shared__ uint32_t cand_key[kMergeMax];
  __shared__ int32_t cand_idx[kMergeMax];
  __shared__ uint32_t best_key[kSplitMaxK];
  __shared__ int32_t best_idx[kSplitMaxK];
  const int64_t r = blockIdx.x;
  const int64_t last = p.a.ne[0] - (p.n_chunks - 1) * p.chunk;  // the last chunk's elements
  const int n = (p.n_chunks - 1) * p.k + static_cast<int>(last < p.k ? last : p.k);
  const int64_t at = r * p.n_chunks * p.k;
  constexpr int kLoadBatch = 8;  // loads in flight per thread, as in top_k_chunk_kernel
  for (int base = 0; base < n; base += kLoadBatch * kMergeThreads) {
    uint32_t kv[kLoadBatch];
    int32_t iv[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int i = base + j * kMergeThreads + static_cast<int>(threadIdx.x);
      kv[j] = i < n ? p.keys[at + i] : 0u;
      iv[j] = i < n ? p.idxs[at + i] : 0;
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int i = base + j * kMergeThreads + static_cast<int>(threadIdx.x);
      if (i < n) cand_key[i] = kv[j], cand_idx[i] = iv[j];
    }
  }
  __syncthreads();
  select_top_k(
      n, p.k, [&](int64_t i) { return cand_key[i]; }, [&](int64_t i) { return cand_idx[i]; }, s, best_key, best_idx);
  int64_t i1, i2, i3;
  split_row(r, p.a.ne[1], p.a.ne[2], i1, i2, i3);
  int32_t* out = reinterpret_cast<int32_t*>(element_ptr(p.dst, 0, i1, i2, i3));
  for (int i = threadIdx.x; i < p.k; i += blockDim.x) out[i] = best_idx[i];
}

// k = 1 over a long row (greedy sampling's top_k): a cluster of kTop1Blocks blocks a row, each its
// share of the row in registers (kLoadBatch loads in flight a thread), reduced by shuffles and then
// over the cluster's shared memory by block 0, which writes the index: one launch, no scratch. The
// split path took a chunk kernel and a merge kernel for it (3.8 + 2.9 us on the H200, ncu).
// A 128256-entry row (ncu, H200): 8.03 us at 4 blocks, 6.26 at 8, 5.99 at 12, 5.82 at 16: the rest is
// the chain (loads, two reductions, two cluster barriers), not the bytes.
constexpr int kTop1Blocks = 16;       ///< blocks a row's cluster, by default (LOOM_CUDA_TOP1_BLOCKS: 2-16)
constexpr int kTop1MaxBlocks = 16;    ///< a non-portable cluster size, which sm_90 places
constexpr int kTop1Threads = 1024;
static_assert(kTop1Threads / kWarpSize == kWarpSize && kTop1MaxBlocks <= kWarpSize, "one warp reduces the warps and the blocks");

__global__ void __launch_bounds__(kTop1Threads) top_k1_cluster_kernel(TensorDesc dst, TensorDesc a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pdl_wait();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ uint32_t warp_key[kTop1Threads / kWarpSize];
  __shared__ int32_t warp_idx[kTop1Threads / kWarpSize];
  __shared__ uint32_t block_key;
  __shared__ int32_t block_idx;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int64_t r = blockIdx.y;
  int64_t i1, i2, i3;
  split_row(r, a.ne[1], a.ne[2], i1, i2, i3);
  const char* row = row_ptr(a, i1, i2, i3);
  const int64_t n = a.ne[0];
  // each block's share a multiple of 4 elements, so that a contiguous 16-byte-aligned row's shares are
  // read as float4 (a 128256-entry row: 4 per thread, all in flight at once)
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int64_t per = ((n + blocks - 1) / blocks + 3) / 4 * 4;
  const int64_t begin = static_cast<int64_t>(cluster.block_rank()) * per;
  const int64_t end = n < begin + per ? n : begin + per;
  // nothing yet: key 0 at the largest index (any element, key 0 included, comes before it)
  uint32_t best_k = 0;
  int32_t best_i = INT32_MAX;
  auto take = [&](float v, int64_t i) {
    const uint32_t key = order_key(v);
    if (ranks_before(key, static_cast<int32_t>(i), best_k, best_i)) best_k = key, best_i = static_cast<int32_t>(i);
  };
  if (a.nb[0] == sizeof(float) && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    constexpr int kVecBatch = 4;
    const auto* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t base = begin + 4 * tid; base < end; base += kVecBatch * 4 * kTop1Threads) {
      float4 v[kVecBatch];
#pragma unroll
      for (int j = 0; j < kVecBatch; ++j) {
        const int64_t i = base + j * 4 * kTop1Threads;
        v[j] = i + 3 < end ? row4[i / 4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kVecBatch; ++j) {
        const int64_t i = base + j * 4 * kTop1Threads;
        if (i + 3 < end) {
          take(v[j].x, i), take(v[j].y, i + 1), take(v[j].z, i + 2), take(v[j].w, i + 3);
        } else {
          for (int64_t t = i; t < end; ++t) take(load_f32(row, t, a.nb[0]), t);  // the row's ragged end
        }
      }
    }
  } else {
    constexpr int kLoadBatch = 8;
    for (int64_t base = begin + tid; base < end; base += kLoadBatch * kTop1Threads) {
      float v[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        const int64_t i = base + j * kTop1Threads;
        v[j] = i < end ? load_f32(row, i, a.nb[0]) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        const int64_t i = base + j * kTop1Threads;
        if (i < end) take(v[j], i);
      }
    }
  }
  auto warp_best = [&](uint32_t& key, int32_t& idx) {
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o >>= 1) {
      const uint32_t k2 = __shfl_xor_sync(0xffffffffu, key, o);
      const int32_t i2 = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ranks_before(k2, i2, key, idx)) key = k2, idx = i2;
    }
  };
  warp_best(best_k, best_i);
  if (lane == 0) warp_key[warp] = best_k, warp_idx[warp] = best_i;
  __syncthreads();
  if (warp == 0) {
    best_k = warp_key[lane];  // kTop1Threads / kWarpSize == kWarpSize
    best_i = warp_idx[lane];
    warp_best(best_k, best_i);
    if (lane == 0) block_key = best_k, block_idx = best_i;
  }
  cluster.sync();  // every block's best is in its shared memory
  if (cluster.block_rank() == 0 && warp == 0) {
    uint32_t key = 0;
    int32_t idx = INT32_MAX;
    if (lane < blocks) {
      key = *cluster.map_shared_rank(&block_key, lane);
      idx = *cluster.map_shared_rank(&block_idx, lane);
    }
    warp_best(key, idx);
    if (lane == 0) *reinterpret_cast<int32_t*>(element_ptr(dst, 0, i1, i2, i3)) = idx;
  }
  cluster.sync();  // block 0 has read the others' shared memory before they exit
#endif
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

namespace {

// The split path's chunking of a row of n for k, or n_chunks = 0 where it does not apply: chunks of
// at least kChunkMin (enough work per block), as many as the merge's kMergeMax candidates allow.
SplitArgs split_plan(const Tensor* dst, int k) {
  const Tensor* a = dst->src[0];
  SplitArgs p{};
  const int64_t n = a->ne[0];
  if (n < kSelectMinN || k > kSplitMaxK || dst->nb[0] != sizeof(int32_t) || a->nrows() > 65535) return p;
  // With many rows (a batched step's sampling) fewer, longer chunks: about kSplitWave blocks in all are
  // enough to fill the GPU, and each block's time is mostly latency (64 rows of 128256 at k = 64: 63
  // chunks each, 4,032 blocks in ~8 waves, took 154 us on an H100).
  const int64_t rows = a->nrows();
  const int64_t for_waves = std::max<int64_t>(1, (kSplitWave + rows - 1) / rows);
  const int64_t want = std::max<int64_t>(
      std::min({(n + kChunkMin - 1) / kChunkMin, kMergeMax / static_cast<int64_t>(k), for_waves}),
      (n + kChunkMax - 1) / kChunkMax);
  const int64_t chunk = (n + want - 1) / want;
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (chunk > kChunkMax || n_chunks * k > kMergeMax) return p;
  p.k = k;
  p.chunk = chunk;
  p.n_chunks = static_cast<int>(n_chunks);
  return p;
}

}  // namespace

size_t top_k_scratch_bytes(const Tensor* dst, int k) {
  const SplitArgs p = split_plan(dst, k);
  return static_cast<size_t>(dst->src[0]->nrows()) * static_cast<size_t>(p.n_chunks) * static_cast<size_t>(k) *
         (sizeof(uint32_t) + sizeof(int32_t));
}

CudaError launch_top_k(const LaunchContext& ctx, const Tensor* dst, int k) {
  const Tensor* a = dst->src[0];
  if (a->nrows() == 0 || a->ne[0] == 0) return {};
  static const bool top1_cluster = env_switch("LOOM_CUDA_TOP1_CLUSTER");  // 0: the split path for k = 1 too
  // whether the device places a cluster of kTop1Blocks such blocks (asked once)
  // blocks a row (read once; sizes above 8 are non-portable: the kernel is allowed them first)
  static const unsigned top1_blocks = static_cast<unsigned>(env_int("LOOM_CUDA_TOP1_BLOCKS", kTop1Blocks, 2, kTop1MaxBlocks));
  // Asked once per device: cudaFuncSetAttribute sets the non-portable size for the current device's
  // context only (asked once per process, a tensor-parallel rank on another device then failed its
  // launch with cudaErrorInvalidClusterSize).
  auto top1_fits = [] {
    static std::mutex m;
    static std::map<int, bool> fits;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    std::lock_guard lock(m);
    if (auto it = fits.find(dev); it != fits.end()) return it->second;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        cluster_config(dim3(top1_blocks, 1), dim3(kTop1Threads), 0, nullptr, dim3(top1_blocks, 1, 1), &attr);
    int clusters = 0;
    const bool ok = (top1_blocks <= 8 || cudaFuncSetAttribute(top_k1_cluster_kernel,
                                                              cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) &&
                    cudaOccupancyMaxActiveClusters(&clusters, top_k1_cluster_kernel, &cfg) == cudaSuccess && clusters > 0;
    (void)cudaGetLastError();  // a refusal is an answer, not a sticky error
    fits[dev] = ok;
    return ok;
  };
  if (k == 1 && top1_cluster && ctx.sm90a && a->ne[0] >= kSelectMinN && a->ne[0] < INT32_MAX && a->nrows() <= 65535 &&
      top1_fits()) {
    // a cluster of kTop1Blocks blocks a row (compute capability 9.0)
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config(dim3(top1_blocks, static_cast<unsigned>(a->nrows())),
                                                  dim3(kTop1Threads), 0, ctx.stream, dim3(top1_blocks, 1, 1), &attr);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, top_k1_cluster_kernel, desc_of(dst), desc_of(a));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return CudaError::runtime(e, "cudaLaunchKernelEx(top_k1_cluster_kernel)", __FILE__, __LINE__);
    }
    LOOM_CUDA_CHECK_LAUNCH("top_k1_cluster_kernel");
    return {};
  }
  SplitArgs p = split_plan(dst, k);
  const size_t scratch = top_k_scratch_bytes(dst, k);
  if (p.n_chunks > 0 && ctx.scratch && ctx.scratch_size >= scratch) {
    const int64_t rows = a->nrows();
    p.dst = desc_of(dst);
    p.a = desc_of(a);
    static const bool prefilter = env_switch("LOOM_CUDA_TOPK_PREFILTER");
    p.prefilter = prefilter;
    p.keys = static_cast<uint32_t*>(ctx.scratch);
    p.idxs = reinterpret_cast<int32_t*>(p.keys + rows * p.n_chunks * k);
    top_k_chunk_kernel<<<dim3(static_cast<unsigned>(p.n_chunks), static_cast<unsigned>(rows)), kSplitThreads, 0,
                         ctx.stream>>>(p);
    LOOM_CUDA_CHECK_LAUNCH("top_k_chunk_kernel");
    top_k_merge_kernel<<<static_cast<unsigned>(rows), kMergeThreads, 0, ctx.stream>>>(p);
    LOOM_CUDA_CHECK_LAUNCH("top_k_merge_kernel");
    return {};
  }
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
