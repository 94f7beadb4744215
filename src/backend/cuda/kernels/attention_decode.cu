// flash_attn for decode in the fast numerics mode (flash-decoding): few queries per head (fewer than
// the tensor-core kernel's minimum), f16 K/V, head size 64/128/256 for both K and V.
//
// Why: the exact kernel gives each (query, head) a block whose 16 warps walk keys one at a time in
// double (dependent load, 5 double shuffles and two double exps per key): ~20 us per layer of a 1B
// model at a 256-cell KV extent, and it reads K/V once per query head.
//
// Design: a block takes one KV head, up to kRows query rows that share it (the heads of the GQA
// group times the queries), and one split of the keys; K/V are read once for all of them. A key's
// row is read by kLpk lanes, 16 bytes (8 halves) each, so a warp works on 32 / kLpk keys at once;
// every lane group is an independent online-softmax stream (running max m, sum l, accumulator of its
// 8 output elements per row) over the keys j = its slot mod (4 warps x keys per warp). The streams
// are merged through shuffles and shared memory in a fixed order; with several splits each writes
// (m, l, acc) to scratch and a second kernel merges the splits in order: deterministic, no atomics.
// Scores, softmax and accumulation in float. A head's sink logit (src[4], optional) joins the
// denominator where the row's result is final: the single split's write, or the merge.
// Bytes model per layer: n_kv x n_head_kv x d x 2 (K and V, f16) once, plus masks; at depth 4096
// on an 8B layer that is 16 MB, ~4 us at the H200's 4,350 GB/s.
//
// Gathered K/V (the gather_flash_attn fusion, a batched step over a paged cache): each key's row is
// looked up in an i32 index and read from the f16 cache store in place. Unfused, get_rows writes an
// f32 copy of every sequence's rows (4 bytes per element written, then read again), and f32 K/V
// send the attention to the slow generic kernel, since this one takes f16 only. A template flag, so
// the contiguous path compiles as before; the index load is one more 4-byte load per key and lane
// group, issued with the mask loads of the unrolled keys so that it adds no step to the chain of
// dependent loads before a key's K/V.
#include <algorithm>
#include <cstdlib>

#include "attention.cuh"
#include "common.cuh"
#include "loom/backend.h"
#include "loom/exec_plan.h"
#include "mat_vec_fast_formats.cuh"
#include "tensor_map.h"
#include "mma.cuh"
#include "rope_row.cuh"

namespace loom::cuda {

namespace {

constexpr int kDecThreads = 128;
constexpr int kDecWarps = kDecThreads / kWarpSize;
constexpr int kRows = 4;             ///< query rows per block
constexpr int kMinKeysPerSplit = 16;  ///< keys per split at least (below that the merge dominates)
constexpr int kMaxSplits = 64;        ///< what the merges hold (splits_for takes at most split_cap(): 48)
constexpr int kUnroll = 2;            ///< keys per lane group loaded before the first is used
constexpr int kKeyChunk = 256;        ///< keys whose masks (and row indices) a block stages at once
constexpr int kMaxHeadsPerMergeBlock = 4;  ///< the activations' merge: heads of one block (64 x 4 = 256)
constexpr int kMaxMergeWarps = 8;          ///< and its threads, 256 at most
static_assert(kMaxSplits <= 64, "the merge gives a split to each of its >= 64 threads");

struct DecodeArgs {
  TensorDesc dst, q, k, v, mask;
  bool has_mask, mask_f16;
  float scale, softcap;
  int64_t group;         ///< query heads per KV head
  int64_t n_rows;        ///< query rows per KV head: group x n_q
  int64_t row_groups;    ///< blocks per KV head along the rows: ceil(n_rows / kRows)
  int64_t keys_per_split;
  int n_splits;
  float* partial;        ///< [split][row][d + 2] when n_splits > 1
  const float* sinks;    ///< per query head, a logit joining the denominator (null: none)
  // Gathered K/V only: k and v then hold the stores' data and row stride (nb[1]) with the gathered
  // shape (ne), and key j of KV head hk of sequence i3 is row idx[j + n_kv * (hk + n_head_kv * i3)].
  const int32_t* k_idx;
  const int32_t* v_idx;
  int64_t k_store_rows, v_store_rows;  ///< rows of each store: an index outside reads NaNs
  // The rope_flash_attn fusion only (kRope): Q, K and V as the products left them (f32), rotated and
  // stored by the kernel. q_raw [d, n_head, 1] (head h: row (h, 0)), k_raw [d, n_head_kv, 1], v_raw
  // [d, 1, n_head_kv] (V's permuted view); the stores [d, n_cells, n_head_kv] with the token's cell
  // (i32; KV head h's at (0, h % ne[1]), as set_rows broadcasts); k and v above are views of the
  // stores from cell 0, so key j is cell j.
  TensorDesc q_raw, k_raw, v_raw, k_cache, v_cache, k_cell, v_cell, pos, freq;
  bool has_freq;
  bool angles_early;  ///< the position and frequency factors are graph inputs / weights: read before the wait
  int mma_bufs;       ///< flash_decode_mma_kernel: stages in flight (shared buffers), 2 or 3
  bool no_angles;     ///< LOOM_CUDA_ABLATE=rope_angles: cos 1, sin 0 (timing only)
  RopeArgs rope;
  /// kActF16 (flash_attn_decode_writes_act): the output as contiguous f16 at dst's bytes, element i of
  /// dst (its flat index) at out16[i], for the output projection's cuBLAS product; null: f32 in dst.
  __half* out16;
};

/// Element e of the output row of head h, query iq, sequence i3: f32 into dst, or f16 at its flat index.
__device__ __forceinline__ void store_out(const DecodeArgs& a, int64_t h, int64_t iq, int64_t i3, int64_t e, float v) {
  float* row = reinterpret_cast<float*>(row_ptr(a.dst, h, iq, i3));
  if (a.out16)
    a.out16[(reinterpret_cast<const char*>(row) - a.dst.data) / static_cast<int64_t>(sizeof(float)) + e] = __float2half_rn(v);
  else
    row[e] = v;
}

/// kRope: each rotation pair's (cos, sin) at the token's position into sh_cs, a thread a pair.
__device__ __forceinline__ void rope_angles(const DecodeArgs& a, float* sh_cs) {
  const int32_t position = *reinterpret_cast<const int32_t*>(a.pos.data);
  for (int i = static_cast<int>(threadIdx.x); i < a.rope.n_dims / 2; i += kDecThreads) {
    if (a.no_angles) {
      sh_cs[2 * i] = 1.0f, sh_cs[2 * i + 1] = 0.0f;
      continue;
    }
    rope_angle(i, position, a.rope, a.freq, a.has_freq, sh_cs[2 * i], sh_cs[2 * i + 1]);
  }
}

/// The query row rr of KV head hk: its head and query.
__device__ __forceinline__ void row_at(const DecodeArgs& a, int64_t hk, int64_t rr, int64_t& h, int64_t& iq) {
  h = hk * a.group + rr % a.group;
  iq = rr / a.group;
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

/// Lane `sub`'s 16 bytes of key (or value) j of KV head hk, sequence i3: element (j, hk, i3) of t, or
/// with kGather row `row` of the store (the index's entry for the key). An index outside the store
/// gives NaN halves, as get_rows gives NaN there: never a wild read. kCoherent: through ld_act, where the
/// kernel before this one (set_rows, under a programmatic edge) stores the step's rows; __ldg's
/// ld.global.nc promises data no grid writes while this one runs (common.cuh). The rope fold stores
/// them itself and takes its own row from registers: __ldg there.
template <bool kGather, bool kCoherent>
__device__ __forceinline__ uint4 kv_load(const TensorDesc& t, int32_t row, int64_t store_rows, int64_t j,
                                         int64_t hk, int64_t i3, int sub) {
  const uint4* p;
  if constexpr (kGather) {
    if (row < 0 || row >= store_rows) return make_uint4(~0u, ~0u, ~0u, ~0u);
    p = reinterpret_cast<const uint4*>(t.data + row * t.nb[1]) + sub;
  } else {
    p = reinterpret_cast<const uint4*>(row_ptr(t, j, hk, i3)) + sub;
  }
  if constexpr (kCoherent) return ld_act(p);
  else return __ldg(p);
}

/// The splits' merge weights of one row, by the row's threads (e their index, at least n of them;
/// every thread of the block calls it: it holds block barriers): w[0..n) holds the splits' maxima on
/// entry and exp(m_s - M) on exit (0 for a split that saw no visible key), each computed by thread s;
/// *total gets the denominator sum_s l_s w_s, summed by thread 0 in split order, with the head's sink
/// logit (a key without a value) joining it. Every merge gives the same bits.
__device__ __forceinline__ void split_weights(float* w, const float* l, int n, const float* sinks, int64_t h, int64_t e,
                                              float* total) {
  float big = -INFINITY;
  for (int s = 0; s < n; ++s) big = fmaxf(big, w[s]);
  __syncthreads();  // every thread has read the maxima
  if (e < n) w[e] = w[e] == -INFINITY ? 0.0f : __expf(w[e] - big);
  __syncthreads();
  if (e == 0) {
    float t = 0.0f;
    for (int s = 0; s < n; ++s) t += l[s] * w[s];
    if (sinks && big != -INFINITY) t += __expf(sinks[h] - big);
    *total = t;
  }
  __syncthreads();
}

/// Element e of row `row` merged over the n splits' partial results (split order), their loads
/// kMergeBatch at a time in flight.
__device__ __forceinline__ float merged_element(const DecodeArgs& a, int64_t rows, int64_t row, int64_t d, int64_t e,
                                                const float* w, int n, float total) {
  constexpr int kMergeBatch = 16;
  float out = 0.0f;
  for (int s0 = 0; s0 < n; s0 += kMergeBatch) {
    float v[kMergeBatch];
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b)
      v[b] = s0 + b < n ? a.partial[((s0 + b) * rows + row) * (d + 2) + 2 + e] : 0.0f;
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b)
      if (s0 + b < n) out += v[b] * w[s0 + b];
  }
  return total > 0.0f ? out / total : 0.0f;
}

/// Element e of row `row` of each of the n splits' partial results, every load in flight at once and
/// issued before the merge weights are known (split_weights), so their round trip overlaps the
/// weights' instead of following it in batches of 16.
__device__ __forceinline__ void split_values(const DecodeArgs& a, int64_t rows, int64_t row, int64_t d, int64_t e, int n,
                                             float (&v)[kMaxSplits]) {
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) v[s] = s < n ? a.partial[(s * rows + row) * (d + 2) + 2 + e] : 0.0f;
}

/// merged_element from split_values' v: the same products and sums in the same order (the same bits).
__device__ __forceinline__ float merged_values(const float (&v)[kMaxSplits], const float* w, int n, float total) {
  float out = 0.0f;
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s)
    if (s < n) out += v[s] * w[s];
  return total > 0.0f ? out / total : 0.0f;
}

/// A lane's 8 elements (sub * 8 ..) of a row rotated by the rope whose pairs' (cos, sin) are cs: the
/// rope kernels' arithmetic (rope_first / rope_second). Normal mode's pairs are a lane's own; neox
/// pairs element e with e + n_dims / 2, held by lane sub ^ (n_dims / 16) of the same lane group (the
/// launcher checks n_dims / 16 is a power of two). Every lane of the warp calls it (shuffles).
__device__ __forceinline__ void rope_lane8(float (&x)[8], int sub, const float* cs, const RopeArgs& p) {
  const int n_dims = p.n_dims, half = n_dims / 2, e0 = sub * 8;
  if (p.neox) {
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = __shfl_xor_sync(0xffffffffu, x[i], half / 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = e0 + i;
      if (e < half) {
        x[i] = rope_first(x[i], y[i], cs[2 * e], cs[2 * e + 1]);
      } else if (e < n_dims) {
        const int t = e - half;
        x[i] = rope_second(y[i], x[i], cs[2 * t], cs[2 * t + 1]);
      }
    }
    return;
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int e = e0 + 2 * m;
    if (e >= n_dims) continue;
    const float x0 = x[2 * m], x1 = x[2 * m + 1], c = cs[e], s = cs[e + 1];  // pair e / 2
    x[2 * m] = rope_first(x0, x1, c, s);
    x[2 * m + 1] = rope_second(x0, x1, c, s);
  }
}

/// 8 floats as the f16 row bytes a cache store writes (float_to_f16, element 2 i in word i's low half).
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = static_cast<uint32_t>(float_to_f16(f[2 * i])) | (static_cast<uint32_t>(float_to_f16(f[2 * i + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// 8 floats from p (16-byte aligned).
__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

/// Merges stream (m2, l2, acc2) into (m, l, acc).
__device__ __forceinline__ void merge(float& m, float& l, float (&acc)[8], float m2, float l2, const float (&acc2)[8]) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // neither saw a visible key
  const float a = __expf(m - mn), b = __expf(m2 - mn);
  l = l * a + l2 * b;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * a + acc2[e] * b;
  m = mn;
}

// Grid: x = (i3, KV head, row group), y = split. kGather: K/V rows through a.k_idx / a.v_idx.
// kMinBlocks: blocks an SM must hold (the register cap): 4 for gathered K/V (a batched step's 64
// sequences x 8 KV heads = 512 blocks fit one wave of 132 SMs instead of two at 3 a SM), 3 for
// contiguous K/V (12 warps an SM instead of 8: more keys' loads in flight at depth).
// kRope (one token of one sequence, the rope_flash_attn fusion): each block rotates its rows' Q from
// a.q_raw and the new key from a.k_raw with angles it computes once into shared memory; the key j
// that is the token's cell takes the rotated K (and V, both rounded to f16 as the store rounds them)
// from registers instead of the cache, and the first split's first row group block stores the new
// K/V row of its KV head. So no block reads a cache row another writes, and the results are those
// of rope_set_rows followed by flash_attn, bit for bit.
//
// kBulk (with kRope only; launch_flash_attn_decode_impl: rows of one KV head back to back, the split's
// K and V within kBulkMaxBytes): the block's split of K rows and of V rows come by two bulk copies into
// shared memory (dynamic: keys_per_split rows of each), issued before the wait. No kernel of the step
// writes those rows but this one, and it writes only the token's own cell, which the loop takes from
// registers (a copy of that row may be stale: it is never read); earlier steps' stores finished
// before this step's graph began. So the K/V bytes, at depth most of the layer's, stream in while the
// products before it run, and the key loop waits on one barrier instead of a dependent global load per
// kUnroll keys (ncu at 4,096 keys: 16% of DRAM bandwidth, the stalls on those loads; stop 38).
template <int kLpk, bool kGather, int kMinBlocks, bool kRope, bool kBulk = false>
__global__ void __launch_bounds__(kDecThreads, kMinBlocks) flash_decode_kernel(const __grid_constant__ DecodeArgs a) {
  // pdl_wait later: kRope's angles (a.angles_early: the position and frequency factors, read_before_wait) and kBulk's copies go before it
  static_assert(!(kGather && kRope), "the fused rope reads contiguous K/V");
  static_assert(!kBulk || kRope, "the bulk copies read before the wait: only where this kernel stores the new row");
  __shared__ float sh_cs[kRope ? kLpk * 8 : 1];  // kRope: (cos, sin) of each rotation pair
  extern __shared__ __align__(16) uint8_t sh_kv[];  // kBulk: keys_per_split K rows, then as many V rows
  __shared__ __align__(8) uint64_t sh_kv_bar;
  constexpr int kRowBytes = kLpk * 16;  // a K or V row: kLpk lanes of 16 bytes
  if constexpr (kBulk) {
    if (threadIdx.x == 0) {
      const int64_t hk0 = (blockIdx.x / a.row_groups) % a.k.ne[2];
      const int64_t jb = static_cast<int64_t>(blockIdx.y) * a.keys_per_split;
      const int64_t je = min(a.k.ne[1], jb + a.keys_per_split);
      mbar_init(&sh_kv_bar, 1);
      mbar_init_fence();
      if (je > jb) {
        const auto bytes = static_cast<unsigned>((je - jb) * kRowBytes);
        mbar_arrive_expect(&sh_kv_bar, 2 * bytes);
        bulk_copy(sh_kv, row_ptr(a.k, jb, hk0, 0), bytes, &sh_kv_bar);
        bulk_copy(sh_kv + a.keys_per_split * kRowBytes, row_ptr(a.v, jb, hk0, 0), bytes, &sh_kv_bar);
      } else {
        mbar_arrive(&sh_kv_bar);  // no keys: the phase completes without bytes
      }
    }
  }
  // kRope with a.angles_early: the angles before the wait (the position and the frequency factors are
  // the step's inputs and weights, no kernel's output), off the path after the products' hand-off
  if constexpr (kRope)
    if (a.angles_early) rope_angles(a, sh_cs);
  pdl_wait();
  constexpr int kKpw = kWarpSize / kLpk;  // keys per warp at once
  constexpr int kD = kLpk * 8;            // head size
  __shared__ float sh_m[kDecWarps][kRows], sh_l[kDecWarps][kRows];
  __shared__ float sh_acc[kDecWarps][kRows][kD];
  __shared__ float sh_mask[kRows][kKeyChunk];
  __shared__ int32_t sh_kidx[kGather ? kKeyChunk : 1], sh_vidx[kGather ? kKeyChunk : 1];
  __shared__ int sh_last[2];  // per chunk parity: the chunk's last key a row sees (-1: none)
  if (threadIdx.x == 0) sh_last[0] = -1;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int slot = lane / kLpk, sub = lane % kLpk;
  const int64_t n_kv_heads = a.k.ne[2];
  const int64_t rg = blockIdx.x % a.row_groups;
  const int64_t hk = (blockIdx.x / a.row_groups) % n_kv_heads;
  const int64_t i3 = blockIdx.x / (a.row_groups * n_kv_heads);
  const int split = static_cast<int>(blockIdx.y);

  // this lane's 8 elements of each row's query, scaled
  float q[kRows][8];
  const char* m_rows[kRows];
  bool row_ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t rr = rg * kRows + r;
    row_ok[r] = rr < a.n_rows;
    int64_t h = 0, iq = 0;
    if (row_ok[r]) row_at(a, hk, rr, h, iq);
    const auto* qp = reinterpret_cast<const float4*>(kRope ? row_ptr(a.q_raw, h, iq, i3) : row_ptr(a.q, iq, h, i3)) +
                     2 * sub;
    const float4 q0 = row_ok[r] ? qp[0] : make_float4(0, 0, 0, 0), q1 = row_ok[r] ? qp[1] : make_float4(0, 0, 0, 0);
    q[r][0] = q0.x, q[r][1] = q0.y, q[r][2] = q0.z, q[r][3] = q0.w;
    q[r][4] = q1.x, q[r][5] = q1.y, q[r][6] = q1.z, q[r][7] = q1.w;
    m_rows[r] = a.has_mask && row_ok[r] ? row_ptr(a.mask, iq, h % a.mask.ne[2], i3 % a.mask.ne[3]) : nullptr;
  }
  // kRope: the pairs' angles, the new K/V row's elements of this lane and its cells (keys)
  int64_t k_key = -1, v_key = -1;
  uint4 k_new = make_uint4(0, 0, 0, 0), v_new = make_uint4(0, 0, 0, 0);
  float kx[8], vx[8];
  if constexpr (kRope) {
    k_key = *reinterpret_cast<const int32_t*>(a.k_cell.data + (hk % a.k_cell.ne[1]) * a.k_cell.nb[1]);
    v_key = *reinterpret_cast<const int32_t*>(a.v_cell.data + (hk % a.v_cell.ne[1]) * a.v_cell.nb[1]);
    load8(reinterpret_cast<const float*>(row_ptr(a.k_raw, hk, 0, 0)) + 8 * sub, kx);
    load8(reinterpret_cast<const float*>(row_ptr(a.v_raw, 0, hk, 0)) + 8 * sub, vx);
    if (!a.angles_early) rope_angles(a, sh_cs);
  }
  __syncthreads();  // sh_last (and kRope's angles) set
  if constexpr (kRope) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) rope_lane8(q[r], sub, sh_cs, a.rope);
    rope_lane8(kx, sub, sh_cs, a.rope);
    k_new = pack8(kx);
    v_new = pack8(vx);
    if (split == 0 && rg == 0 && threadIdx.x < kLpk) {  // one lane group of one block per KV head stores
      if (k_key >= 0 && k_key < a.k_cache.ne[1]) reinterpret_cast<uint4*>(row_ptr(a.k_cache, k_key, hk, 0))[sub] = k_new;
      if (v_key >= 0 && v_key < a.v_cache.ne[1]) reinterpret_cast<uint4*>(row_ptr(a.v_cache, v_key, hk, 0))[sub] = v_new;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < 8; ++e) q[r][e] *= a.scale;

  float m[kRows], l[kRows], acc[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.0f;
  }

  const int64_t n_kv = a.k.ne[1];
  const int64_t j_begin = split * a.keys_per_split;
  const int64_t j_end = min(n_kv, j_begin + a.keys_per_split);
  constexpr int kStride = kDecWarps * kKpw;  // keys the block takes at once
  // gathered K/V: this KV head's and sequence's entries of the row indices
  const int64_t idx_base = kGather ? n_kv * (hk + n_kv_heads * i3) : 0;
  // The split's keys in chunks of kKeyChunk: the block first stages the chunk's masks (and gathered
  // rows' indices) in shared memory, coalesced, and finds its last key any row sees; then each lane
  // group walks the keys up to that one, kUnroll at a time with their K/V loads all in flight, so a
  // key waits on one global load (its K/V), not on its mask and index first; the keys past a
  // bucket's extent, which every row masks, are not walked.
  for (int64_t c0 = j_begin, ci = 0; c0 < j_end; c0 += kKeyChunk, ++ci) {
    const int c_len = static_cast<int>(min(j_end - c0, static_cast<int64_t>(kKeyChunk)));
    if (threadIdx.x == 0) sh_last[(ci + 1) & 1] = -1;  // the next chunk's (read before this one's barrier)
    int last = -1;
    for (int t = threadIdx.x; t < c_len; t += kDecThreads) {
      const int64_t j = c0 + t;
      bool seen = false;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float mv = row_ok[r] ? 0.0f : -INFINITY;
        if (m_rows[r])
          mv = a.mask_f16 ? f16_to_float(reinterpret_cast<const uint16_t*>(m_rows[r])[j])
                          : reinterpret_cast<const float*>(m_rows[r])[j];
        sh_mask[r][t] = mv;
        seen = seen || mv != -INFINITY;
      }
      if constexpr (kGather) {
        sh_kidx[t] = __ldg(a.k_idx + idx_base + j);
        sh_vidx[t] = __ldg(a.v_idx + idx_base + j);
      }
      if (seen) last = t;
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0 && last >= 0) atomicMax(&sh_last[ci & 1], last);
    __syncthreads();
    if (kBulk && ci == 0) mbar_wait(&sh_kv_bar, 0);  // the split's K/V rows landed (one phase, all chunks)
    const int c_stop = sh_last[ci & 1] + 1;  // uniform over the block
    for (int t0 = warp * kKpw; t0 < c_stop; t0 += kStride * kUnroll) {
      float mv[kUnroll][kRows];
      bool any[kUnroll];
      int32_t k_row[kUnroll] = {}, v_row[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = t0 + slot + u * kStride;
        const bool in_range = t < c_stop;
        any[u] = false;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          mv[u][r] = in_range ? sh_mask[r][t] : -INFINITY;
          any[u] = any[u] || mv[u][r] != -INFINITY;
        }
        if (kGather && in_range) {
          k_row[u] = sh_kidx[t];
          v_row[u] = sh_vidx[t];
        }
      }
      // keys every row masks are not loaded (a lane group agrees: same key)
      uint4 kraw[kUnroll], vraw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = c0 + t0 + slot + u * kStride;
        // kRope: the token's own key from registers (its cache row is being stored)
        const bool k_here = kRope && j == k_key, v_here = kRope && j == v_key;
        if constexpr (kBulk) {  // from the split's rows in shared memory
          const auto* kr = reinterpret_cast<const uint4*>(sh_kv + (j - j_begin) * kRowBytes);
          const auto* vr = reinterpret_cast<const uint4*>(sh_kv + (a.keys_per_split + j - j_begin) * kRowBytes);
          kraw[u] = k_here ? k_new : any[u] ? kr[sub] : make_uint4(0, 0, 0, 0);
          vraw[u] = v_here ? v_new : any[u] ? vr[sub] : make_uint4(0, 0, 0, 0);
        } else {
          kraw[u] = k_here ? k_new
                    : any[u] ? kv_load<kGather, !kRope>(a.k, k_row[u], a.k_store_rows, j, hk, i3, sub)
                             : make_uint4(0, 0, 0, 0);
          vraw[u] = v_here ? v_new
                    : any[u] ? kv_load<kGather, !kRope>(a.v, v_row[u], a.v_store_rows, j, hk, i3, sub)
                             : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float kf[8], vf[8];
        unpack8(kraw[u], kf);
        unpack8(vraw[u], vf);
        float s[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(q[r][e], kf[e], d);
          s[r] = d;
        }
#pragma unroll
        for (int o = kLpk / 2; o > 0; o /= 2)
#pragma unroll
          for (int r = 0; r < kRows; ++r) s[r] += __shfl_xor_sync(0xffffffffu, s[r], o);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float sc = s[r];
          if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
          sc += mv[u][r];
          if (!(sc > -INFINITY)) continue;  // masked (or NaN): weight 0
          const float mn = fmaxf(m[r], sc);
          const float alpha = __expf(m[r] - mn), p = __expf(sc - mn);
          l[r] = l[r] * alpha + p;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][e] = fmaf(p, vf[e], acc[r][e] * alpha);
          m[r] = mn;
        }
      }
    }
    __syncthreads();  // the chunk's staged masks and indices are read before the next chunk's
  }

  // merge the lane groups of the warp (same elements, other keys), then the warps
#pragma unroll
  for (int o = kLpk; o < kWarpSize; o *= 2) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[r], o), l2 = __shfl_xor_sync(0xffffffffu, l[r], o);
      float acc2[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc2[e] = __shfl_xor_sync(0xffffffffu, acc[r][e], o);
      merge(m[r], l[r], acc[r], m2, l2, acc2);
    }
  }
  if (slot == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (sub == 0) {
        sh_m[warp][r] = m[r];
        sh_l[warp][r] = l[r];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sh_acc[warp][r][sub * 8 + e] = acc[r][e];
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < kRows * kD; t += kDecThreads) {
    const int r = t / kD, e = t % kD;
    const int64_t rr = rg * kRows + r;
    if (rr >= a.n_rows) continue;
    float mt = sh_m[0][r], lt = sh_l[0][r], at = sh_acc[0][r][e];
    for (int w = 1; w < kDecWarps; ++w) {
      const float m2 = sh_m[w][r], mn = fmaxf(mt, m2);
      if (mn == -INFINITY) continue;
      const float x = __expf(mt - mn), y = __expf(m2 - mn);
      lt = lt * x + sh_l[w][r] * y;
      at = at * x + sh_acc[w][r][e] * y;
      mt = mn;
    }
    int64_t h, iq;
    row_at(a, hk, rr, h, iq);
    if (a.n_splits == 1) {
      // output [dv, n_head, n_q]; no visible key gives zeros, as the exact kernel does; the sink
      // joins the denominator relative to the same maximum
      const float denom = a.sinks && mt != -INFINITY ? lt + __expf(a.sinks[h] - mt) : lt;
      store_out(a, h, iq, i3, e, lt > 0.0f ? at / denom : 0.0f);
    } else {
      const int64_t row = (i3 * n_kv_heads + hk) * a.n_rows + rr;
      const int64_t rows = a.k.ne[3] * n_kv_heads * a.n_rows;
      float* p = a.partial + (split * rows + row) * (kD + 2);
      if (e == 0) {
        p[0] = mt;
        p[1] = lt;
      }
      p[2 + e] = at;
    }
  }
}

// ---- flash-decoding on tensor cores (flash_decode_mma_kernel) -------------------------------------
// One token of one sequence over contiguous K/V (a KV head's rows back to back), head 64 or 128, the
// GQA group's query rows (up to 16) sharing one mask row. Why: the kernel above spends its time on each
// key's work, not on its bytes (ncu at 6,663 keys: 13% of DRAM bandwidth, 41% of the SM; stop 49): every
// key's four dot products are reduced over 16 lanes by shuffles, then two exps and a rescale of 32
// accumulators a row. Here a warp takes 16 keys at once: S = Q K^T on mma.sync m16n8k16 (the rows padded
// to 16), the online softmax on the S fragments (a quad's shuffles per 16 keys), and O += P V with the S
// fragments as P's A operand (FlashAttention-2's register reuse). K and V come in stages of kMmaStageKeys
// keys (a 16-key tile a warp), a.mma_bufs in flight: by tensor copies in the 128-byte swizzle (kTma), or
// by cp.async into padded rows (kMmaStride: ldmatrix's eight rows fall in eight bank groups); with the
// rope fold the first ones go out before the wait, and the token's own rows are written into the tile
// from the kernel's f16 copy (s_new) over what the copy brought.
// Numerics: Q (rotated, times the scale) and P rounded to f16, scores and sums in float: fast mode's. The
// folded and the unfolded paths both take it (their greedy logits are compared bit for bit), the
// gathered (batched) ones keep the kernel above, and so does batch-invariant mode.
constexpr int kMmaStageKeys = 64;  ///< keys a stage: a 16-key tile for each of the 4 warps
constexpr int kMmaRows = 16;       ///< query rows a block at most (the m16 of the products)
template <int D>
constexpr int kMmaStride = D + 8;  ///< halves a shared Q/K/V row: 16 bytes of padding
constexpr int kMmaMaxBufs = 3;  ///< stages in flight at most (a.mma_bufs)
/// a stage's K and V rows
template <int D>
constexpr size_t kMmaStageBytes = size_t{2} * kMmaStageKeys * kMmaStride<D> * sizeof(__half);
static_assert(kKeyChunk % kMmaStageKeys == 0, "a mask chunk holds whole stages");

/// Element e of a row x rotated by the rope whose pairs' (cos, sin) are cs (rope_lane8's arithmetic, an
/// element at a time): normal pairs (2i, 2i + 1), neox pairs (i, i + n_dims / 2); past n_dims as it is.
__device__ __forceinline__ float rope_elem(const float* x, int e, const float* cs, const RopeArgs& p) {
  const int n_dims = p.n_dims;
  if (e >= n_dims) return x[e];
  if (p.neox) {
    const int half = n_dims / 2;
    if (e < half) return rope_first(x[e], x[e + half], cs[2 * e], cs[2 * e + 1]);
    const int t = e - half;
    return rope_second(x[t], x[e], cs[2 * t], cs[2 * t + 1]);
  }
  const int e0 = e & ~1;
  return (e & 1) ? rope_second(x[e0], x[e0 + 1], cs[e0], cs[e0 + 1]) : rope_first(x[e0], x[e0 + 1], cs[e0], cs[e0 + 1]);
}

// Grid: x = KV head (one row group, one sequence), y = split. Partial results (or with one split the
// output) as flash_decode_kernel writes them, so the merges are the same.
/// Stores 16 bytes to shared memory at a shared-window address (st_shared_zero16: zeros).
__device__ __forceinline__ void st_shared16(uint32_t at, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void st_shared_zero16(uint32_t at) { st_shared16(at, make_uint4(0, 0, 0, 0)); }

/// kTma's tensor maps of K and V (encode_rows_map: boxes of kMmaStageKeys rows, 128-byte swizzle)
struct DecodeMaps {
  CUtensorMap k, v;
};
/// kTma: a stage's K (or V) tile, pieces of 64 halves after each other, kMmaStageKeys rows of 128 bytes each
template <int D>
constexpr int kMmaTmaTileBytes = kMmaStageKeys * D * static_cast<int>(sizeof(__half));
constexpr int kMmaTmaAlign = 1024;  ///< the 128-byte swizzle's tiles: 8 x 128-byte alignment

/// flash_decode_mma_kernel's K/V stage rows: a row's 16-byte piece p lies at + (p / 8) x kPieceStride +
/// ((p % 8) ^ swz(row index)) x 16 from the row's first byte (padded rows: one row, no swizzle; kTma: 64-half
/// pieces kMmaStageKeys rows of 128 bytes apart, in the 128-byte swizzle)
template <bool kTma>
struct MmaRows {
  static constexpr uint32_t kPieceStride = kTma ? kMmaStageKeys * 128 : 128;
  __device__ static int swz(int i) { return kTma ? i & 7 : 0; }
  /// the byte offset of piece p in a row whose pieces of 8 lie `stride` bytes apart, swizzled by x
  __device__ static uint32_t piece_at(int p, int x, uint32_t stride) {
    return (p / 8) * stride + static_cast<uint32_t>(((p % 8) ^ x) * 16);
  }
  /// ldmatrix's address: piece 2 q + b (q compile-time, b 0 or 1) of a row at row_at whose index % 8 is x,
  /// in a form whose runtime part the loops hoist
  __device__ static uint32_t pair_at(uint32_t row_at, int q, int b, int x) {
    if constexpr (kTma) return row_at + (q / 4) * kPieceStride + static_cast<uint32_t>((((2 * q) % 8) ^ (b ^ x)) * 16);
    else return row_at + b * 16 + q * 32;
  }
};

// kTma: each stage's K and V tiles by one tensor copy each (thread 0; an mbarrier a buffer), rows of 128
// bytes in the 128-byte swizzle (16-byte piece p of row r at p ^ r % 8): cp.async's 2,048 16-byte requests a
// stage keep fewer bytes in flight than an SM's share of the bandwidth needs (ncu: 29% of DRAM at 6,663
// keys). Without it, cp.async into padded rows (kMmaStride).
template <int D, bool kRope, bool kTma>
__global__ void __launch_bounds__(kDecThreads, 2) flash_decode_mma_kernel(const __grid_constant__ DecodeArgs a,
                                                                          const __grid_constant__ DecodeMaps maps) {
  // pdl_wait later: the barriers, and with kRope the first stages' copies and the angles, go before it
  constexpr int kS = kMmaStride<D>;
  constexpr int kDT = D / 8;  // n8 tiles of O
  extern __shared__ __align__(16) uint8_t sh_raw[];
  // kTma: the stages from the first kMmaTmaAlign-aligned byte (the launcher adds the slack)
  uint8_t* const sh_base =
      kTma ? sh_raw + ((kMmaTmaAlign - smem_addr(sh_raw) % kMmaTmaAlign) % kMmaTmaAlign) : sh_raw;
  auto* s_kv = reinterpret_cast<__half*>(sh_base);  // [stage][K rows, then V rows][kS] (kTma: tiles)
  __shared__ __align__(16) __half s_q[kMmaRows * kS];
  // kRope: the token's rotated K row and its V row, as stored; the warp whose tile holds the token's key
  // writes them over what the stage's copy brought there (another block may be storing that row)
  __shared__ __align__(16) __half s_new[2][kS];
  __shared__ __align__(8) uint64_t bar[kMmaMaxBufs];  // kTma: a buffer's copies landed
  __shared__ float sh_cs[kRope ? D : 1];  // kRope: (cos, sin) of each rotation pair
  __shared__ float sh_mask[kKeyChunk];
  __shared__ int sh_last[2];  // per chunk parity: the chunk's last visible key (-1: none)
  __shared__ float sh_m[kDecWarps][kMmaRows], sh_l[kDecWarps][kMmaRows];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, c = lane % 4;  // fragment row group and column pair
  const int64_t hk = blockIdx.x, n_kv_heads = a.k.ne[2];
  const int split = static_cast<int>(blockIdx.y);
  const int64_t jb = static_cast<int64_t>(split) * a.keys_per_split, je = min(a.k.ne[1], jb + a.keys_per_split);
  const int n_stages = je > jb ? static_cast<int>((je - jb + kMmaStageKeys - 1) / kMmaStageKeys) : 0;
  // row i of buffer buf's K (kv 0) or V (kv 1) rows: its first byte's shared address (MmaRows: its pieces)
  using L = MmaRows<kTma>;
  constexpr uint32_t kPieceStride = L::kPieceStride;
  auto kv_row = [&](int buf, int kv, int i) -> uint32_t {
    if constexpr (kTma) return smem_addr(sh_base) + (buf * 2 + kv) * kMmaTmaTileBytes<D> + i * 128;
    else return smem_addr(s_kv + ((buf * 2 + kv) * kMmaStageKeys + i) * kS);
  };
  const auto swz = L::swz;
  const auto piece_at = L::piece_at;
  const auto pair_at = L::pair_at;
  // stage st's K and V rows into buffer st % n_bufs by cp.async, 16 bytes a thread at a time (every
  // thread), rows past the split zero-filled; one commit group a stage. (A bulk copy a row, this kernel's
  // first form, ~800 copies of 256 bytes an SM: ncu 30 us at 6,663 keys against 25 here.)
  // (kTma: thread 0 issues the stage's two tensor copies; rows past the tensor come as zeros, rows of the
  // next split as they are, and the walk stops at je)
  const int n_bufs = a.mma_bufs;
  auto issue_stage = [&](int st) {
    const int64_t kb = jb + static_cast<int64_t>(st) * kMmaStageKeys;
    const int buf = st % n_bufs;
    if constexpr (kTma) {
      if (tid == 0) {
        mbar_arrive_expect(&bar[buf], 2 * kMmaTmaTileBytes<D>);
        tensor_copy_5d(sh_base + (buf * 2) * kMmaTmaTileBytes<D>, &maps.k, 0, static_cast<int>(kb), 0,
                       static_cast<int>(hk), 0, &bar[buf]);
        tensor_copy_5d(sh_base + (buf * 2 + 1) * kMmaTmaTileBytes<D>, &maps.v, 0, static_cast<int>(kb), 0,
                       static_cast<int>(hk), 0, &bar[buf]);
      }
      return;
    }
    const int n = static_cast<int>(min(je - kb, static_cast<int64_t>(kMmaStageKeys)));
    constexpr int kChunks = D / 8;  // 16-byte pieces a row
    for (int i = tid; i < 2 * kMmaStageKeys * kChunks; i += kDecThreads) {
      const int kv = i / (kMmaStageKeys * kChunks), r = i / kChunks % kMmaStageKeys, ch = i % kChunks;
      const bool in = r < n;
      const char* src = in ? row_ptr(kv ? a.v : a.k, kb + r, hk, 0) + ch * 16 : a.k.data;
      cp_async_16(kv_row(buf, kv, r) + piece_at(ch, 0, kPieceStride), src, in ? 16 : 0);
    }
    cp_async_commit();
  };
  if (tid == 0) {
    sh_last[0] = -1;
    if constexpr (kTma) {
      for (int i = 0; i < kMmaMaxBufs; ++i) mbar_init(&bar[i], 1);
      mbar_init_fence();
    }
  }
  __syncthreads();
  if constexpr (kRope) {
    for (int st = 0; st < n_bufs && st < n_stages; ++st) issue_stage(st);
    if (a.angles_early) rope_angles(a, sh_cs);
  }
  pdl_wait();
  if constexpr (!kRope) {  // the step's stores wrote the token's rows: copied after the wait
    for (int st = 0; st < n_bufs && st < n_stages; ++st) issue_stage(st);
  } else {
    if (!a.angles_early) rope_angles(a, sh_cs);
    __syncthreads();  // the angles
  }

  // the mask row (one for the group: the launcher checks); a chunk's masks into sh_mask and its last
  // visible key into sh_last[ci & 1] (the next chunk's reset; the barriers are the caller's)
  const char* mask_row = a.has_mask ? row_ptr(a.mask, 0, 0, 0) : nullptr;
  auto stage_chunk = [&](int64_t c0v, int64_t ci) {
    const int c_len = static_cast<int>(min(je - c0v, static_cast<int64_t>(kKeyChunk)));
    if (tid == 0) sh_last[(ci + 1) & 1] = -1;
    int last = -1;
    for (int t = tid; t < c_len; t += kDecThreads) {
      const float mv = mask_row ? mask_at(mask_row, c0v + t, a.mask_f16) : 0.0f;
      sh_mask[t] = mv;
      if (mv != -INFINITY) last = t;
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0 && last >= 0) atomicMax(&sh_last[ci & 1], last);
  };
  // Q: the group's rows (rotated with kRope), times the scale, as f16; rows past n_rows zero. One query
  // (the launcher checks), so row r is head hk x group + r (row_at without its division)
  for (int i = tid; i < kMmaRows * D; i += kDecThreads) {
    const int r = i / D, e = i % D;
    float v = 0.0f;
    if (r < a.n_rows) {
      const int64_t h = hk * a.group + r;
      const auto* x = reinterpret_cast<const float*>(kRope ? row_ptr(a.q_raw, h, 0, 0) : row_ptr(a.q, 0, h, 0));
      if constexpr (kRope) v = rope_elem(x, e, sh_cs, a.rope) * a.scale;
      else v = x[e] * a.scale;
    }
    s_q[r * kS + e] = __float2half_rn(v);
  }
  // kRope: the token's K row rotated and its V row, rounded to f16 as the stores round them; split 0's
  // block stores them in the caches (every block takes those rows from s_new, written into its tile)
  int64_t k_key = -1, v_key = -1;
  if constexpr (kRope) {
    k_key = *reinterpret_cast<const int32_t*>(a.k_cell.data + (hk % a.k_cell.ne[1]) * a.k_cell.nb[1]);
    v_key = *reinterpret_cast<const int32_t*>(a.v_cell.data + (hk % a.v_cell.ne[1]) * a.v_cell.nb[1]);
    const auto* kx = reinterpret_cast<const float*>(row_ptr(a.k_raw, hk, 0, 0));
    const auto* vx = reinterpret_cast<const float*>(row_ptr(a.v_raw, 0, hk, 0));
    for (int e = tid; e < D; e += kDecThreads) {
      const uint16_t kh = float_to_f16(rope_elem(kx, e, sh_cs, a.rope)), vh = float_to_f16(vx[e]);
      s_new[0][e] = __ushort_as_half(kh);
      s_new[1][e] = __ushort_as_half(vh);
      if (split == 0) {
        if (k_key >= 0 && k_key < a.k_cache.ne[1]) reinterpret_cast<uint16_t*>(row_ptr(a.k_cache, k_key, hk, 0))[e] = kh;
        if (v_key >= 0 && v_key < a.v_cache.ne[1]) reinterpret_cast<uint16_t*>(row_ptr(a.v_cache, v_key, hk, 0))[e] = vh;
      }
    }
  }
  __syncthreads();  // s_q, s_new

  uint32_t qa[D / 16][4];  // Q's A fragments: rows lane % 16, k halves 8 (lane / 16) of each k16 step
  {
    const uint32_t q_at = smem_addr(s_q + (lane % 16) * kS + lane / 16 * 8);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(qa[ks], q_at + ks * 16 * sizeof(__half));
  }
  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8 (l: this thread's keys)

  int64_t c0 = jb;
  int c_stop = 0;
  for (int st = 0; st < n_stages; ++st) {
    const int64_t kb = jb + static_cast<int64_t>(st) * kMmaStageKeys;
    if (st % (kKeyChunk / kMmaStageKeys) == 0) {  // a chunk's masks and its last visible key
      const int64_t ci = st / (kKeyChunk / kMmaStageKeys);
      c0 = kb;
      if (st > 0) __syncthreads();  // every warp is done with the last chunk's masks
      stage_chunk(c0, ci);
      __syncthreads();
      c_stop = sh_last[ci & 1] + 1;  // uniform over the block
    }
    const int buf = st % n_bufs;
    if constexpr (kTma) {
      mbar_wait(&bar[buf], (st / n_bufs) & 1);
    } else {  // this thread's pieces of stage st (the later stages' may fly), then everyone's
      const int later = min(n_bufs - 1, n_stages - 1 - st);
      if (later >= 2) cp_async_wait<2>();
      else if (later == 1) cp_async_wait<1>();
      else cp_async_wait<0>();
      __syncthreads();
    }
    const int t0 = static_cast<int>(kb - c0) + warp * 16;  // this warp's tile: chunk keys t0 .. t0 + 15
    if (t0 < c_stop) {
      // keys past c_stop or masked: weight 0, and their V rows zeroed (stale or never-written cells may
      // hold anything, and 0 x NaN is NaN in P V)
      const int tk = t0 + lane % 16;
      const bool hidden = tk >= c_stop || sh_mask[tk] == -INFINITY;
      const unsigned hidden_bits = __ballot_sync(0xffffffffu, hidden && lane < 16);
      if (hidden_bits) {
        for (unsigned b = hidden_bits; b; b &= b - 1) {
          const uint32_t row = kv_row(buf, 1, warp * 16 + __ffs(b) - 1);
          for (int p = lane; p < D / 8; p += kWarpSize) st_shared_zero16(row + piece_at(p, 0, kPieceStride));
        }
      }
      // kRope: the token's K row, and its V row where visible (hidden, its zeroed copy, as the unfolded
      // path), from s_new into the tile
      bool wrote = false;
      if constexpr (kRope) {
        const int64_t kk = k_key - (c0 + t0), vk = v_key - (c0 + t0);
        const bool put_k = kk >= 0 && kk < 16, put_v = vk >= 0 && vk < 16 && !((hidden_bits >> vk) & 1u);
        for (int p = lane; p < D / 8; p += kWarpSize) {
          const int ik = warp * 16 + static_cast<int>(kk), iv = warp * 16 + static_cast<int>(vk);
          if (put_k) st_shared16(kv_row(buf, 0, ik) + piece_at(p, swz(ik), kPieceStride), reinterpret_cast<const uint4*>(s_new[0])[p]);
          if (put_v) st_shared16(kv_row(buf, 1, iv) + piece_at(p, swz(iv), kPieceStride), reinterpret_cast<const uint4*>(s_new[1])[p]);
        }
        wrote = put_k || put_v;
      }
      if (hidden_bits || wrote) {
        if constexpr (kTma) fence_proxy_async();  // these stores before a later refill's tensor copy
        __syncwarp();
      }
      // S = Q K^T over the tile: K rows as B (keys 0-7 / 8-15 of the tile)
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      {
        // (the row's index % 8 is lane % 8)
        const uint32_t k_at = kv_row(buf, 0, warp * 16 + lane % 8 + lane / 16 * 8);
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t kb4[4];
          ldmatrix_x4(kb4, pair_at(k_at, ks, (lane / 8) % 2, swz(lane)));
          mma_16816(s[0], qa[ks], kb4[0], kb4[1]);
          mma_16816(s[1], qa[ks], kb4[2], kb4[3]);
        }
      }
      // the online softmax: S fragment (nt, 2 hr + j) is row g + 8 hr, key t0 + 8 nt + 2 c + j;
      // each_score(f) calls f(its value, hr, its key) for each
      auto each_score = [&](auto&& f) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
#pragma unroll
            for (int j = 0; j < 2; ++j) f(s[nt][2 * hr + j], hr, t0 + 8 * nt + 2 * c + j);
      };
      // The masks by plain loads (the chunk's keys: t < kKeyChunk; past c_stop selected away), so their
      // addresses are one base and constant offsets, and the softcap's test once a tile: per score, a
      // predicated load with its address rebuilt and a branch on the softcap were ~15 instructions of
      // ~50 (SASS, stop 51)
      float mx[2] = {-INFINITY, -INFINITY};
      auto mask_score = [&](float& x, int hr, int t) {
        const float mt = sh_mask[t];
        x += t < c_stop ? mt : -INFINITY;
        if (!(x > -INFINITY)) x = -INFINITY;  // masked, or NaN (as flash_decode_kernel): weight 0
        mx[hr] = fmaxf(mx[hr], x);
      };
      if (a.softcap > 0.0f)
        each_score([&](float& x, int hr, int t) {
          x = a.softcap * tanhf(x / a.softcap);
          mask_score(x, hr, t);
        });
      else
        each_score(mask_score);
      float alpha[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        const float mn = fmaxf(m[hr], mx[hr]);
        alpha[hr] = mn == -INFINITY ? 1.0f : __expf(m[hr] - mn);
        m[hr] = mn;
        l[hr] *= alpha[hr];
      }
      each_score([&](float& x, int hr, int) {
        x = x == -INFINITY ? 0.0f : __expf(x - m[hr]);
        l[hr] += x;
      });
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
      }
      // O += P V: P's A fragment from the S fragments, V rows (the tile's keys) transposed as B
      const uint32_t pa[4] = {pack_half2(s[0][0], s[0][1]), pack_half2(s[0][2], s[0][3]), pack_half2(s[1][0], s[1][1]),
                              pack_half2(s[1][2], s[1][3])};
      {
        const uint32_t v_at = kv_row(buf, 1, warp * 16 + lane % 8 + (lane / 8) % 2 * 8);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, pair_at(v_at, dp, lane / 16, swz(lane)));
          mma_16816(o[2 * dp], pa, vb[0], vb[1]);
          mma_16816(o[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
    if (st + n_bufs < n_stages) {  // buffer `buf` takes stage st + n_bufs once every warp is done with it
      __syncthreads();
      if constexpr (kTma)
        if (tid == 0) fence_proxy_async();  // the block's reads of the buffer before the copy's writes
      issue_stage(st + n_bufs);
    }
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {  // a row's sum over the quad's keys
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
  }

  // the warps' (m, l, O) through shared memory (the stages' bytes: every copy has landed and been
  // read), merged in warp order and written as flash_decode_kernel writes them
  __syncthreads();
  auto* sh_acc = reinterpret_cast<float*>(sh_base);  // [warp][row][D]
  static_assert(kDecWarps * kMmaRows * D * sizeof(float) <= 2 * (kTma ? 2 * kMmaTmaTileBytes<D> : kMmaStageBytes<D>),
                "the warps' O fit two stages");
  if (c == 0) {
    sh_m[warp][g] = m[0], sh_m[warp][g + 8] = m[1];
    sh_l[warp][g] = l[0], sh_l[warp][g + 8] = l[1];
  }
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    float* r0 = sh_acc + (warp * kMmaRows + g) * D + dt * 8 + 2 * c;
    float* r1 = r0 + 8 * D;
    r0[0] = o[dt][0], r0[1] = o[dt][1];
    r1[0] = o[dt][2], r1[1] = o[dt][3];
  }
  __syncthreads();
  const int64_t rows = n_kv_heads * a.n_rows;
  for (int t = tid; t < a.n_rows * D; t += kDecThreads) {
    const int r = t / D, e = t % D;
    float mt = sh_m[0][r], lt = sh_l[0][r], at = sh_acc[r * D + e];
    for (int w = 1; w < kDecWarps; ++w) {
      const float m2 = sh_m[w][r], mn = fmaxf(mt, m2);
      if (mn == -INFINITY) continue;
      const float x = __expf(mt - mn), y = __expf(m2 - mn);
      lt = lt * x + sh_l[w][r] * y;
      at = at * x + sh_acc[(w * kMmaRows + r) * D + e] * y;
      mt = mn;
    }
    const int64_t h = hk * a.group + r;  // one query: row r's head
    if (a.n_splits == 1) {
      const float denom = a.sinks && mt != -INFINITY ? lt + __expf(a.sinks[h] - mt) : lt;
      store_out(a, h, 0, 0, e, lt > 0.0f ? at / denom : 0.0f);
    } else {
      float* p = a.partial + (split * rows + hk * a.n_rows + r) * (D + 2);
      if (e == 0) p[0] = mt, p[1] = lt;
      p[2 + e] = at;
    }
  }
}

// Merges the splits of each row in split order: grid = rows, block = d threads (d >= kMaxSplits).
// The splits' maxima are read in parallel, their weights exp(m_s - M) computed once, and each
// thread's loads of its element over the splits are independent.
__global__ void flash_decode_merge_kernel(const __grid_constant__ DecodeArgs a) {
  pdl_wait();
  __shared__ float sh_w[kMaxSplits], sh_l[kMaxSplits];
  __shared__ float sh_total;
  const int64_t d = a.v.ne[0], n_kv_heads = a.k.ne[2];
  const int64_t rows = a.k.ne[3] * n_kv_heads * a.n_rows;
  const int64_t row = blockIdx.x, e = threadIdx.x;
  const int n = a.n_splits;
  const int64_t rr = row % a.n_rows, hk = (row / a.n_rows) % n_kv_heads, i3 = row / (a.n_rows * n_kv_heads);
  int64_t h, iq;
  row_at(a, hk, rr, h, iq);
  float v[kMaxSplits];
  split_values(a, rows, row, d, e, n, v);
  if (e < n) {
    const float* p = a.partial + (e * rows + row) * (d + 2);
    sh_w[e] = p[0];
    sh_l[e] = p[1];
  }
  __syncthreads();
  split_weights(sh_w, sh_l, n, a.sinks, h, e, &sh_total);
  store_out(a, h, iq, i3, e, merged_values(v, sh_w, n, sh_total));
}

// Splits of the keys: enough blocks to fill the GPU (target_blocks(): about one wave of the kernel,
// 3 blocks an SM for contiguous K/V, 4 for gathered; a block's time grows with its keys, so past one
// full wave more splits only add the merge), at least kMinKeysPerSplit keys each, at most split_cap()
// (48 contiguous, 32 gathered). A single sequence's decode (8 KV heads, one row group) takes 48 splits
// from 768 keys; a batched step of 64 sequences already has 512 blocks and takes one (measured on the
// H200, 64 sequences x 256 cells x 8 KV heads, d 128: 4 splits 75 us + 7 us merge). One sequence at
// depth 4096 on 3 blocks an SM and 48 splits instead of 2 and 32: tg128 8B Q4_K_M 339.5 / 336.8 ->
// 343.7 / 345.3 (H200), unchanged at depth 0. A function of the shape only, so the scratch size is
// known before launch.
// For comparisons (read once): LOOM_FLASH_DECODE_MIN_KEYS (8-4096) replaces kMinKeysPerSplit,
// LOOM_FLASH_DECODE_TARGET (64-4096) the target, LOOM_FLASH_DECODE_MAX_SPLITS (1-kMaxSplits) the cap,
// LOOM_FLASH_DECODE_MINB=1 (any value but 3) the contiguous kernel's 3 blocks an SM (2 at its 174-185
// registers then); TARGET and MAX_SPLITS set both rules' values, contiguous and gathered.
int64_t target_blocks(bool gathered) {
  static const int64_t contiguous = env_int("LOOM_FLASH_DECODE_TARGET", 384, 64, 4096),
                       gather = env_int("LOOM_FLASH_DECODE_TARGET", 512, 64, 4096);
  return gathered ? gather : contiguous;
}
int64_t split_cap(bool gathered) {
  static const int64_t contiguous = env_int("LOOM_FLASH_DECODE_MAX_SPLITS", 48, 1, kMaxSplits),
                       gather = env_int("LOOM_FLASH_DECODE_MAX_SPLITS", 32, 1, kMaxSplits);
  return gathered ? gather : contiguous;
}
int64_t min_keys_per_split() {
  static const int64_t keys = env_int("LOOM_FLASH_DECODE_MIN_KEYS", kMinKeysPerSplit, 8, 4096);
  return keys;
}
// Batch-invariant (batch_invariant()): always kInvariantSplits splits of kInvariantKeys keys (more, in
// multiples of it, only past kInvariantSplits x kInvariantKeys = 8,192 keys, where a sequence's splits then
// follow the longest of its step): a sequence's keys fall in the same splits, merged over as many,
// whatever else the step holds; the splits past its keys are empty (weight 0 in the merge).
constexpr int64_t kInvariantKeys = 256;
constexpr int kInvariantSplits = 32;
// One split, no merge kernel, for a contiguous cache of few keys whose output is f32 (f16/bf16/f32
// weights after it; quantized ones take their activations from the merge): n_kv x d up to
// LOOM_FLASH_DECODE_SINGLE (16,384: 256 keys of head size 64; 0: never). Its blocks walk the keys the
// splits would share, but a layer launches one kernel less: the built-in model (2 KV heads, d 64,
// 256-cell bucket) tg128 4,772 / 4,677 -> 5,199 / 5,282 (H200). 1B Q4_K_M lost 4% so (1,293 -> 1,245:
// a quantize kernel then replaces the merge's quantized output), hence f32 outputs only.
int64_t single_split_limit() {
  static const int64_t limit = env_int("LOOM_FLASH_DECODE_SINGLE", 16384, 0, int64_t{1} << 40);
  return limit;
}
int splits_for(const Tensor* q, const Tensor* k, bool gathered, bool f32_out) {
  if (batch_invariant()) return kInvariantSplits;
  if (f32_out && !gathered && k->ne[1] * q->ne[0] <= single_split_limit()) return 1;
  const int64_t base = q->ne[3] * k->ne[2] * ((q->ne[2] / k->ne[2] * q->ne[1] + kRows - 1) / kRows);
  const int64_t by_keys = (k->ne[1] + min_keys_per_split() - 1) / min_keys_per_split();
  const int64_t by_blocks = (target_blocks(gathered) + base - 1) / std::max<int64_t>(base, 1);
  return static_cast<int>(std::clamp<int64_t>(std::min(by_keys, by_blocks), 1, split_cap(gathered)));
}

// Rows `idx` picks from `store` for the keys (or values) of shape [d, n_kv, n_head_kv, n_seqs]: one
// packed i32 index per key of every head and sequence, rows of a 2-D store.
bool gathered_rows_ok(const Tensor* store, const Tensor* idx, const Tensor* shape) {
  return store->ne[0] == shape->ne[0] && store->ne[2] == 1 && store->ne[3] == 1 && idx->type == DType::i32 &&
         idx->is_contiguous() && idx->nelements() == shape->ne[1] * shape->ne[2] * shape->ne[3];
}

// K or V as the kernel reads it: the operand, or with gathered rows the store's data and row stride
// under the operand's (gathered) shape.
TensorDesc kv_desc(const Tensor* operand, const Tensor* store) {
  TensorDesc t = desc_of(operand);
  if (store) {
    t.data = static_cast<char*>(store->data);
    t.nb[0] = static_cast<int64_t>(store->nb[0]);
    t.nb[1] = static_cast<int64_t>(store->nb[1]);
    t.nb[2] = t.nb[3] = 0;  // unused: the index gives the row
  }
  return t;
}

template <bool kGather, int kMinBlocks, bool kRope = false>
auto decode_kernel_for(int64_t d) {
  return d == 64    ? flash_decode_kernel<8, kGather, kMinBlocks, kRope>
         : d == 128 ? flash_decode_kernel<16, kGather, kMinBlocks, kRope>
                    : flash_decode_kernel<32, kGather, kMinBlocks, kRope>;
}

/// kBulk's dynamic shared memory at most: a split's K and V rows (48 KB: 3 blocks an SM beside the
/// kernel's ~13 KB of static shared memory). Depth 4,096 of an 8B model (48 splits of 86 keys, head 128)
/// takes 44 KB; longer caches keep the global loads.
constexpr int64_t kBulkMaxBytes = 48 * 1024;
/// LOOM_FLASH_DECODE_BULK=0 (read once): the fused rope's kernel loads K/V from global memory as
/// before, for comparisons.
bool bulk_enabled() {
  static const bool on = env_switch("LOOM_FLASH_DECODE_BULK");
  return on;
}

}  // namespace

bool flash_attn_decode_supported(const Tensor* dst, const FlashAttnRows* rows) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  const Tensor* v = dst->src[2];
  const Tensor* mask = dst->src[3];
  // what the kernel loads K/V rows from: the operands, or the stores the indices point into
  const Tensor* k_rows = rows ? rows->k_store : k;
  const Tensor* v_rows = rows ? rows->v_store : v;
  const int64_t d = q->ne[0];
  if (d != 64 && d != 128 && d != 256) return false;
  if (k->ne[1] == 0) return false;  // no keys: the exact kernel writes the zeros
  if (k->ne[0] != d || v->ne[0] != d || q->type != DType::f32 || k_rows->type != DType::f16 ||
      v_rows->type != DType::f16)
    return false;
  if (dst->type != DType::f32 || dst->nb[0] != sizeof(float) || q->nb[0] != sizeof(float) || q->nb[1] % 16 != 0 ||
      q->nb[2] % 16 != 0 || q->nb[3] % 16 != 0)
    return false;
  if (k_rows->nb[0] != 2 || v_rows->nb[0] != 2 || k_rows->nb[1] % 16 != 0 || v_rows->nb[1] % 16 != 0)
    return false;
  if (rows ? !gathered_rows_ok(rows->k_store, rows->k_idx, k) ||
                 !gathered_rows_ok(rows->v_store, rows->v_idx, v)
           : k->nb[2] % 16 != 0 || v->nb[2] % 16 != 0 || k->nb[3] % 16 != 0 || v->nb[3] % 16 != 0)
    return false;
  if (k->ne[2] <= 0 || q->ne[2] % k->ne[2] != 0 || v->ne[1] != k->ne[1] || v->ne[2] != k->ne[2] ||
      k->ne[3] != q->ne[3] || v->ne[3] != q->ne[3])
    return false;
  if (mask && (mask->nb[0] != (mask->type == DType::f16 ? 2u : 4u) ||
               (mask->type != DType::f16 && mask->type != DType::f32)))
    return false;
  for (const Tensor* t : {dst, q, k_rows, v_rows})
    if (t->data && !aligned16(t->data)) return false;
  return true;
}

bool flash_attn_decode_rope_supported(const Tensor* dst, const FlashAttnRope& r) {
  if (!r.rope_k || !r.set_rows_k || !r.rope_q || !r.set_rows_v || !flash_attn_decode_supported(dst)) return false;
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  const Tensor* v = dst->src[2];
  const Tensor* qr = r.rope_q->src[0];
  const Tensor* kr = r.rope_k->src[0];
  const Tensor* vr = r.set_rows_v->src[0];
  const Tensor* ks = r.set_rows_k;
  const Tensor* vs = r.set_rows_v;
  const Tensor* pos = r.rope_k->src[1];
  const int64_t d = q->ne[0], n_head = q->ne[2], n_head_kv = k->ne[2];
  // one token of one sequence; the kernel reads Q's head h at row (h, 0) of q_raw, as q shows rope_q
  if (q->ne[1] != 1 || q->ne[3] != 1 || k->ne[3] != 1 || !qr || !kr || !vr || !pos) return false;
  if (exec::producer(q) != r.rope_q || q->data != r.rope_q->data || r.rope_q->ne[0] != d || r.rope_q->ne[1] != n_head ||
      q->nb[2] != r.rope_q->nb[1] || r.rope_q->ne[2] != 1 || r.rope_q->ne[3] != 1)
    return false;
  if (qr->type != DType::f32 || qr->ne[0] != d || qr->ne[1] != n_head || qr->nb[0] != sizeof(float) || qr->nb[1] % 16 != 0)
    return false;
  if (kr->type != DType::f32 || kr->ne[0] != d || kr->ne[1] != n_head_kv || kr->ne[2] != 1 || kr->ne[3] != 1 ||
      kr->nb[0] != sizeof(float) || kr->nb[1] % 16 != 0)
    return false;
  if (vr->type != DType::f32 || vr->ne[0] != d || vr->ne[1] != 1 || vr->ne[2] != n_head_kv || vr->ne[3] != 1 ||
      vr->nb[0] != sizeof(float) || vr->nb[2] % 16 != 0)
    return false;
  // K and V: views of the f16 stores from cell 0 with their strides, so key j is cell j
  for (auto [view, store] : {std::pair{k, ks}, std::pair{v, vs}}) {
    const Tensor* cell = store->src[1];
    if (store->type != DType::f16 || exec::producer(view) != store || view->data != store->data || store->ne[0] != d ||
        store->ne[2] != n_head_kv || store->ne[3] != 1 || view->nb[1] != store->nb[1] || view->nb[2] != store->nb[2] ||
        store->nb[0] != 2 || store->nb[1] % 16 != 0 || store->nb[2] % 16 != 0)
      return false;
    if (!cell || cell->type != DType::i32 || cell->ne[0] != 1 || cell->ne[1] <= 0) return false;
    if (store->data && !aligned16(store->data)) return false;
  }
  if (pos->type != DType::i32 || pos->ne[0] < 1) return false;
  // the rotation pairs a lane group holds
  const int n_dims = r.args.n_dims;
  if (n_dims < 2 || n_dims % 2 != 0 || n_dims > d) return false;
  const int partner = n_dims / 16;  // neox: the partner lane's distance, a power of two (an xor)
  if (r.args.neox && (n_dims % 16 != 0 || (partner & (partner - 1)) != 0)) return false;
  for (const Tensor* t : {qr, kr, vr})
    if (t->data && !aligned16(t->data)) return false;
  return true;
}

// The merge writing the fast mat-vec's quantized activations (ctx.act_out_block) instead of f32: a
// block of kHpb heads x d threads per (query, group of kHpb heads), each thread one element merged as
// flash_decode_merge_kernel merges it, then quantized as quantize_act_fast_kernel quantizes the f32
// output (its maxima per act_block over the block's warps): the attention output projection's
// quantize launch is not needed. The layout's rows are the queries (iq + n_q i3), each n_head d long.
__global__ void flash_decode_merge_act_kernel(const __grid_constant__ DecodeArgs a, ActFastRaw act, int act_block,
                                              int heads_per_block) {
  pdl_wait();
  __shared__ float sh_w[kMaxHeadsPerMergeBlock][kMaxSplits], sh_l[kMaxHeadsPerMergeBlock][kMaxSplits];
  __shared__ float sh_total[kMaxHeadsPerMergeBlock];
  __shared__ float sh_max[kMaxMergeWarps];
  const int64_t d = a.v.ne[0], n_kv_heads = a.k.ne[2], n_head = a.q.ne[2], n_q = a.q.ne[1];  // q: [d, n_q, n_head]
  const int64_t rows = a.k.ne[3] * n_kv_heads * a.n_rows;
  const int64_t groups = n_head / heads_per_block;
  const int64_t hg = blockIdx.x % groups, qrow = blockIdx.x / groups;  // qrow = iq + n_q i3
  const int64_t iq = qrow % n_q, i3 = qrow / n_q;
  const int slot = static_cast<int>(threadIdx.x / d);
  const int64_t e = threadIdx.x % d, h = hg * heads_per_block + slot;
  const int64_t hk = h / a.group;
  const int64_t rr = iq * a.group + (h - hk * a.group);  // row_at's inverse
  const int64_t row = (i3 * n_kv_heads + hk) * a.n_rows + rr;
  const int n = a.n_splits;
  if (e < n) {
    const float* p = a.partial + (e * rows + row) * (d + 2);
    sh_w[slot][e] = p[0];
    sh_l[slot][e] = p[1];
  }
  __syncthreads();
  split_weights(sh_w[slot], sh_l[slot], n, a.sinks, h, e, &sh_total[slot]);
  const float value = merged_element(a, rows, row, d, e, sh_w[slot], n, sh_total[slot]);
  // the block maxima: a warp (32 elements), then act_block / 32 warps together
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float amax = warp_reduce(fabsf(value), MaxOp{});
  if (act_block > kWarpSize) {
    if (lane == 0) sh_max[warp] = amax;
    __syncthreads();
    const int per = act_block / kWarpSize, first = warp / per * per;
    amax = sh_max[first];
    for (int w = first + 1; w < first + per; ++w) amax = fmaxf(amax, sh_max[w]);
  }
  const int code = act_fast_code(value, act_fast_inverse(amax));
  const int64_t k = n_head * d, at = qrow * k + h * d + e;
  act.codes[at] = static_cast<int8_t>(code);
  if (at % act_block == 0) act.scales[at / act_block] = act_fast_scale(amax);
  if (act_block == 256) {
    const int sum = warp_reduce(code, SumOp{});
    if (lane == 0) act.sums[at / kFastUnit] = static_cast<int16_t>(sum);
  }
}

// Heads per block of the activations' merge for head size d and act_block, or 0 when it cannot run
// (a block must hold whole activation blocks of whole heads).
int merge_heads_per_block(int64_t d, int64_t n_head, int act_block) {
  const int64_t hpb = act_block % d == 0 ? act_block / d : (d % act_block == 0 ? 1 : 0);
  if (hpb == 0 || hpb > kMaxHeadsPerMergeBlock || hpb * d > kMaxMergeWarps * kWarpSize || n_head % hpb != 0) return 0;
  return static_cast<int>(hpb);
}

bool flash_attn_decode_writes_act(const Tensor* dst, const FlashAttnRows* rows, int act_block) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  if (act_block == kActF16)  // f16 rows at dst's flat indices (store_out): any split count
    return flash_attn_decode_supported(dst, rows) && f16_rows_fit(dst);
  return (act_block == 32 || act_block == 256) && flash_attn_decode_supported(dst, rows) &&
         splits_for(q, k, rows != nullptr, false) > 1 &&
         dst->is_contiguous() && dst->ne[0] == q->ne[0] && dst->ne[1] == q->ne[2] && dst->ne[2] == q->ne[1] &&
         merge_heads_per_block(q->ne[0], q->ne[2], act_block) > 0 &&
         act_fast_size(q->ne[1] * q->ne[3], q->ne[0] * q->ne[2], act_block, act_block == 256) <= dst->nbytes();
}

size_t flash_attn_decode_scratch_bytes(const Tensor* dst) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  // either kernel's, with either output (a single split needs none)
  const int splits = std::max(splits_for(q, k, false, false), splits_for(q, k, true, false));
  if (splits == 1) return 0;
  const int64_t rows = q->ne[1] * q->ne[2] * q->ne[3];  // every (query, head)
  return static_cast<size_t>(splits) * static_cast<size_t>(rows) * static_cast<size_t>(q->ne[0] + 2) * sizeof(float);
}

bool flash_attn_decode_merged(const Tensor* dst) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  return splits_for(q, k, false, true) > 1 && splits_for(q, k, false, false) > 1;
}

CudaError launch_flash_attn_decode(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap,
                                   const FlashAttnRows* rows, const FlashAttnRope* rope) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  const Tensor* v = dst->src[2];
  const Tensor* mask = dst->src[3];
  DecodeArgs a{};
  a.dst = desc_of(dst);
  a.q = desc_of(q);
  a.k = kv_desc(k, rows ? rows->k_store : nullptr);
  a.v = kv_desc(v, rows ? rows->v_store : nullptr);
  if (rows) {
    a.k_idx = static_cast<const int32_t*>(rows->k_idx->data);
    a.v_idx = static_cast<const int32_t*>(rows->v_idx->data);
    a.k_store_rows = rows->k_store->ne[1];
    a.v_store_rows = rows->v_store->ne[1];
  }
  a.has_mask = mask != nullptr;
  a.mask = mask ? desc_of(mask) : TensorDesc{};
  a.sinks = dst->src[4] ? static_cast<const float*>(dst->src[4]->data) : nullptr;
  a.mask_f16 = mask && mask->type == DType::f16;
  if (rope) {
    if (rows || !flash_attn_decode_rope_supported(dst, *rope))
      return CudaError::runtime(cudaErrorInvalidValue, "flash_attn decode: a rope and stores it cannot fold in",
                                __FILE__, __LINE__);
    a.q_raw = desc_of(rope->rope_q->src[0]);
    a.k_raw = desc_of(rope->rope_k->src[0]);
    a.v_raw = desc_of(rope->set_rows_v->src[0]);
    a.k_cache = desc_of(rope->set_rows_k);
    a.v_cache = desc_of(rope->set_rows_v);
    a.k_cell = desc_of(rope->set_rows_k->src[1]);
    a.v_cell = desc_of(rope->set_rows_v->src[1]);
    a.pos = desc_of(rope->rope_k->src[1]);
    const Tensor* ff = rope->rope_k->src[2];
    a.has_freq = ff != nullptr;
    a.angles_early = read_before_wait(rope->rope_k->src[1]) && (!ff || read_before_wait(ff));
    a.freq = ff ? desc_of(ff) : TensorDesc{};
    a.rope = rope->args;
    static const bool no_angles = ablated_kernel("rope_angles");
    a.no_angles = no_angles;
  }
  a.scale = scale;
  a.softcap = softcap;
  a.group = q->ne[2] / k->ne[2];
  a.n_rows = a.group * q->ne[1];
  a.row_groups = (a.n_rows + kRows - 1) / kRows;
  // f16 rows (kActF16) are an f32 output's values, rounded: its splits
  const bool f16_out = ctx.act_out_block == kActF16;
  a.n_splits = splits_for(q, k, rows != nullptr, ctx.act_out_block == 0 || f16_out);
  // flash_decode_mma_kernel: one token of one sequence over contiguous K/V rows, the group's rows sharing
  // one mask row; as many blocks as fit on the GPU at once (the occupancy of its stages' shared memory):
  // fewer splits than splits_for's (the scratch holds those), two at least where it takes more than one
  // (the rope fold's output may lie on the Q/K/V rows only behind a merge)
  static const bool mma_on = env_switch("LOOM_FLASH_DECODE_MMA");
  const int64_t d_head = q->ne[0];
  const bool use_mma = mma_on && ctx.sm_count > 0 && !rows && !batch_invariant() && (d_head == 64 || d_head == 128) &&
                       q->ne[1] == 1 && q->ne[3] == 1 && k->ne[3] == 1 && a.n_rows <= kMmaRows &&
                       (!mask || (mask->ne[2] == 1 && mask->ne[3] == 1)) &&
                       k->nb[1] == static_cast<size_t>(d_head) * 2 && v->nb[1] == static_cast<size_t>(d_head) * 2 &&
                       aligned16(k->data) && aligned16(v->data) && k->nb[2] % 16 == 0 && v->nb[2] % 16 == 0;
  // LOOM_FLASH_DECODE_MMA_BUFS: stages in flight, 3 (two blocks an SM at head 128) or 2. Measured on 8B
  // Q4_K_M tg128 (stop 50): 3 against 2 +1.5% at depth 4096, +3.6% at 16384; swizzled unpadded rows for
  // three blocks an SM (50 splits) were 1-2% slower than these (168 registers, a spill).
  static const int mma_bufs = static_cast<int>(env_int("LOOM_FLASH_DECODE_MMA_BUFS", 3, 2, kMmaMaxBufs));
  // LOOM_FLASH_DECODE_MMA_TMA=0: the stages by cp.async (where the tensor maps cannot be made, too).
  // 8B Q4_K_M tg128 (H200, stop 51): depth 16384 310 against 289 by cp.async; 4096 and 0 the same
  // within noise; the logits bit-identical.
  static const bool mma_tma = env_switch("LOOM_FLASH_DECODE_MMA_TMA");
  a.mma_bufs = mma_bufs;
  void (*mma)(DecodeArgs, DecodeMaps) = nullptr;
  DecodeMaps maps{};
  size_t mma_smem = 0;
  if (use_mma) {
    const bool d64 = d_head == 64;
    const int dh = static_cast<int>(d_head);
    const bool tma = mma_tma && encode_rows_map(maps.k, k->data, k->ne.data(), k->nb.data(), dh, kMmaStageKeys, 128) &&
                     encode_rows_map(maps.v, v->data, v->ne.data(), v->nb.data(), dh, kMmaStageKeys, 128);
    if (tma) {
      mma = rope ? (d64 ? flash_decode_mma_kernel<64, true, true> : flash_decode_mma_kernel<128, true, true>)
                 : (d64 ? flash_decode_mma_kernel<64, false, true> : flash_decode_mma_kernel<128, false, true>);
      mma_smem = a.mma_bufs * 2 * (d64 ? kMmaTmaTileBytes<64> : kMmaTmaTileBytes<128>) + kMmaTmaAlign;
    } else {
      mma = rope ? (d64 ? flash_decode_mma_kernel<64, true, false> : flash_decode_mma_kernel<128, true, false>)
                 : (d64 ? flash_decode_mma_kernel<64, false, false> : flash_decode_mma_kernel<128, false, false>);
      mma_smem = a.mma_bufs * (d64 ? kMmaStageBytes<64> : kMmaStageBytes<128>);
    }
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(mma, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(mma_smem)));
    int per_sm = 0;
    LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mma, kDecThreads, mma_smem));
    if (per_sm < 1)
      return CudaError::runtime(cudaErrorInvalidConfiguration, "flash_attn decode: the mma kernel fits no SM",
                                __FILE__, __LINE__);
    if (a.n_splits > 1) {
      const int64_t fit = std::max<int64_t>(2, per_sm * static_cast<int64_t>(ctx.sm_count) / k->ne[2]);
      a.n_splits = static_cast<int>(std::min<int64_t>(a.n_splits, fit));
    }
  }
  a.keys_per_split = (k->ne[1] + a.n_splits - 1) / a.n_splits;
  if (batch_invariant())
    a.keys_per_split = std::max(kInvariantKeys, (a.keys_per_split + kInvariantKeys - 1) / kInvariantKeys * kInvariantKeys);
  if (rope && a.n_splits == 1)  // one split writes the output while other blocks read the products' rows
    for (const Tensor* in : {rope->rope_q->src[0], rope->rope_k->src[0], rope->set_rows_v->src[0]})
      if (exec::tensor_range(*dst).overlaps(exec::tensor_range(*in)))
        return CudaError::runtime(cudaErrorInvalidValue,
                                  "flash_attn decode: one split's output lies on the Q/K/V it rotates", __FILE__,
                                  __LINE__);
  if (a.n_splits > 1) {
    if (!ctx.scratch || ctx.scratch_size < flash_attn_decode_scratch_bytes(dst))
      return CudaError::runtime(cudaErrorInvalidValue, "flash_attn decode: scratch smaller than its splits need",
                                __FILE__, __LINE__);
    a.partial = static_cast<float*>(ctx.scratch);
  }
  const int64_t blocks = q->ne[3] * k->ne[2] * a.row_groups;
  if (blocks == 0 || k->ne[1] == 0) return {};
  if (blocks > INT32_MAX)
    return CudaError::runtime(cudaErrorInvalidConfiguration, "flash_attn decode: too many blocks", __FILE__, __LINE__);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.n_splits));
  const int64_t d = q->ne[0];
  const bool quant_out = ctx.act_out_block > 0;
  const int hpb = quant_out ? merge_heads_per_block(d, q->ne[2], ctx.act_out_block) : 0;  // q: [d, n_q, n_head, n_seqs]
  if (quant_out && (a.n_splits < 2 || hpb == 0 || !flash_attn_decode_writes_act(dst, rows, ctx.act_out_block)))
    return CudaError::runtime(cudaErrorInvalidValue,
                              "flash_attn decode: quantized activations asked for, but the merge cannot write them",
                              __FILE__, __LINE__);
  if (ctx.act_out_block && !quant_out && (!f16_out || !flash_attn_decode_writes_act(dst, rows, kActF16)))
    return CudaError::runtime(cudaErrorInvalidValue, "flash_attn decode: f16 rows asked for, but it cannot write them",
                              __FILE__, __LINE__);
  if (f16_out) a.out16 = static_cast<__half*>(dst->data);
  // LOOM_FLASH_DECODE_CAP=0: the gathered kernel without the cap
  static const bool capped = env_switch("LOOM_FLASH_DECODE_CAP");
  // contiguous K/V's kernels capped to 3 blocks an SM (157-160 registers, no spills; splits_for's target)
  static const bool three = env_int("LOOM_FLASH_DECODE_MINB", 3, 1, 3) == 3;
  auto kernel = rope    ? (three ? decode_kernel_for<false, 3, true>(d) : decode_kernel_for<false, 1, true>(d))
                : !rows ? (three ? decode_kernel_for<false, 3>(d) : decode_kernel_for<false, 1>(d))
                        : (capped ? decode_kernel_for<true, 4>(d) : decode_kernel_for<true, 1>(d));
  // the fused rope's kernel with the split's K/V by bulk copies (kBulk): rows of one KV head back to
  // back (16-byte aligned, as bulk copies need), one sequence, head 64 or 128, the rows within kBulkMaxBytes
  size_t bulk_bytes = 0;
  if (rope && three && bulk_enabled() && (d == 64 || d == 128) && q->ne[3] == 1 && k->nb[1] == static_cast<size_t>(d) * 2 &&
      v->nb[1] == static_cast<size_t>(d) * 2 && aligned16(k->data) && aligned16(v->data) && k->nb[2] % 16 == 0 &&
      v->nb[2] % 16 == 0 && 2 * a.keys_per_split * d * 2 <= kBulkMaxBytes) {
    bulk_bytes = static_cast<size_t>(2 * a.keys_per_split * d * 2);
    kernel = d == 64 ? flash_decode_kernel<8, false, 3, true, true> : flash_decode_kernel<16, false, 3, true, true>;
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kBulkMaxBytes)));
  }
  if (mma) {
    mma<<<dim3(static_cast<unsigned>(k->ne[2]), static_cast<unsigned>(a.n_splits)), kDecThreads, mma_smem, ctx.stream>>>(
        a, maps);
    LOOM_CUDA_CHECK_LAUNCH("flash_decode_mma_kernel");
  } else {
    kernel<<<grid, kDecThreads, bulk_bytes, ctx.stream>>>(a);
    LOOM_CUDA_CHECK_LAUNCH("flash_decode_kernel");
  }
  static const bool no_merge = ablated_kernel("flash_decode_merge");  // timing only
  if (no_merge) return {};
  if (quant_out) {  // the output projection's activations, quantized by the merge
    const ActFastRaw act = act_fast_at(dst->data, q->ne[1] * q->ne[3], d * q->ne[2], ctx.act_out_block);
    flash_decode_merge_act_kernel<<<static_cast<unsigned>(q->ne[1] * q->ne[3] * (q->ne[2] / hpb)),
                                    static_cast<unsigned>(hpb * d), 0, ctx.stream>>>(a, act, ctx.act_out_block, hpb);
    LOOM_CUDA_CHECK_LAUNCH("flash_decode_merge_act_kernel");
    return {};
  }
  if (a.n_splits > 1) {
    const int64_t rows = q->ne[3] * k->ne[2] * a.n_rows;
    flash_decode_merge_kernel<<<static_cast<unsigned>(rows), static_cast<unsigned>(d), 0, ctx.stream>>>(a);
    LOOM_CUDA_CHECK_LAUNCH("flash_decode_merge_kernel");
  }
  return {};
}

}  // namespace loom::cuda
