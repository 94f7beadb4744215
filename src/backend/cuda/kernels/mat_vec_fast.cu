// The fast numerics mode's mat-vec: dst = w x b for 1..kMatVecMaxCols columns (decode, and small
// batches of tokens), f32/f16/bf16 and every quantized format's weights (quant_dispatch.cuh), float
// accumulation.
//
// Why not the exact kernels: they give each warp one row and sum block terms in double, and reach
// 25-40% of the H200's 4,350 GB/s read bandwidth (4096x4096 at n = 1: f16 1.68 TB/s, q4_0 674 GB/s,
// q4_K 565 GB/s). A mat-vec is bound by memory-level parallelism: the SMs must keep ~3 MB of loads
// in flight (4.35 TB/s x ~700 ns), ~23 KB per SM, in wide coalesced requests.
//
// What one launch computes (FastArgs): 1-3 products of one activation (mul_mat, mat_vec_bias,
// the fused mat_vec_multi of Q/K/V) or a gate/up pair whose gated product is the output (the fused
// glu_mat_vec), so the fast mode's fusions read their weights at the same bandwidth as mul_mat.
// Work is cut into tiles of a few output rows of one batch of one product.
//
// Design (both paths): a block of kThreads = 128 threads owns a tile and every column; its threads
// split each row's k between them (several warps per row), each thread doing the same k range for
// all rows of the tile, so that the activations it loads serve every row. Partial sums are reduced
// over each warp by a transposing butterfly (31 shuffles for 32 values), then over the 4 warps
// through shared memory in a fixed order: deterministic, no atomics.
//
// Float weights (f32/f16/bf16): a block per tile (float_rows: 1 row at 1-2 columns); each thread
// loads 16 bytes of weights per row per step straight into registers (the warp reads 512 contiguous
// bytes of a row), 4 loads issued before the first use.
//
// Quantized weights: activations are first quantized to int8 (mat_vec_fast_formats.cuh: a float scale
// per 32 for q8_0/q4_0, per 256 for the K-quants). A grid of about one wave walks the tiles (4 rows;
// gated: 2 gate + 2 up): thread 0 keeps bulk copies (cp.async.bulk, one per row and stage, an
// mbarrier per buffer) of the next 1-2 stages in flight, a stage being 128 units of 32 weights per
// row (4096 weights: 2304 bytes of q4_0/q4_K, 4352 of q8_0, 3360 of q6_K); every thread decodes its
// unit of each row from shared memory and takes dp4a sums against its 32 activation codes (two
// 16-byte loads per column), scaled in float.
//
// Bytes model per call: m x row_bytes of weights (read once) + n columns of activations (f32, or
// int8 after a quantization kernel that reads them once: ~1.1 k n bytes, L2-resident for every
// block) + 4 m n bytes of output. Measured (ncu, H200, 4096x14336 at 1 column, % of DRAM peak):
// f16 75% (glu pair 84%), q8_0 61%, q6_K 46%, q4_0 41%, q4_K 37%; q4_K 35% at 2 columns, 30% at 4,
// 21% at 8. The quantized kernels are bound by instruction issue and the per-step barriers (decode
// of 2-byte aligned blocks from shared memory: funnel shifts, nibble unpacking), not bytes; one
// block per 1-row tile with per-thread 16-byte cp.async ran q4_K at 22% (issue ~310 instructions
// per 32 weights). A load-time repacking into aligned code and scale arrays is the next step.
//
// At 1-2 columns q4_K, q4_0, q8_0 and q6_K take direct kernels instead (mat_vec_direct_q4k_kernel,
// mat_vec_direct_a2_kernel, mat_vec_direct_q6k_kernel; LOOM_MV_DIRECT=0 selects the pipeline, to
// compare): a warp per 4-row tile (2-row where 4 would give the SMs fewer than 16 warps) loads its
// weights straight into registers (q4_K's 144-byte blocks are 16-byte aligned; 8 blocks of q4_0 or
// q8_0 are too, and 8 of q6_K, 1680 bytes), with half the pipeline's instructions and no barrier:
// 4-8% faster decode on the llama3 files for the first three (docs/PERFORMANCE.md). The q6_K one
// (the output layer and half the FFN down projections of Q4_K_M files) only helps small products at
// one column, so it takes those alone (launch_q_cols: 4096x4096 9.5 us against the pipeline's 10.1;
// the 128256-row output layer 169.5 against 149.5, two columns 11.7 against 10.1; H200, ncu).
// q5_K's (q4_K's kernel with the fifth bits) takes one column; q2_K and q3_K one generic kernel
// (mat_vec_direct_unit_kernel: the pipeline's unit decode from global memory) at 1-2, iq4_xs at one.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "activation.cuh"
#include "common.cuh"
#include "loom/backend.h"
#include "mat_vec.cuh"
#include "mat_vec_fast.cuh"
#include "mat_vec_fast_formats.cuh"
#include "mma.cuh"
#include "mma.cuh"
#include "quant.cuh"
#include "quant_dispatch.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
/// Quantized units (32 weights) of a row per pipeline stage: one per thread.
constexpr int kUnitsPerStage = kThreads;

/// Blocks per SM the register budget must allow (__launch_bounds__), from ptxas -v. Quantized: 4
/// rows per tile (fast_rows) and the pipeline's row pointers and tile state take ~90 registers at
/// 1 column (5 blocks per SM; shared memory allows 5-8), ~100-128 at 2-4 (4 blocks; 96 spilled
/// 24-164 bytes), and at 8 the compiler hoists every
/// column's activation loads and takes ~130-170 (3 blocks per SM; a cap of 128 spilled). The
/// float kernels spilled under a 40-register cap at 1-2 columns.
template <int kCols, bool kQuantized>
__host__ __device__ constexpr int min_blocks_per_sm() {
  if constexpr (kQuantized) return kCols <= 1 ? 5 : (kCols <= 4 ? 4 : 3);
  return kCols <= 2 ? 8 : (kCols <= 4 ? 6 : 4);
}

/// The quantized kernel's blocks per SM for format Q: formats whose decode needs more registers
/// (kWideDecode: q2_K, q3_K, q5_K) spilled 8-76 bytes at 2-8 columns under the budget above, so
/// they take one block per SM fewer there.
template <class Q, class = void>
struct WideDecode {
  static constexpr bool value = false;
};
template <class Q>
struct WideDecode<Q, std::void_t<decltype(Q::kWideDecode)>> {
  static constexpr bool value = Q::kWideDecode;
};
template <class Q, int kCols>
__host__ __device__ constexpr int quant_blocks_per_sm() {
  constexpr int base = min_blocks_per_sm<kCols, true>();
  return WideDecode<Q>::value && kCols > 1 ? base - 1 : base;
}

// ---- reduction -------------------------------------------------------------------------------------

// One step of warp_sum_many: lanes with bit kO set keep the upper half of their kHalf * 2 values and
// send the lower half to their partner, which does the opposite; each adds what it receives.
template <int kHalf, int kO, int V>
__device__ __forceinline__ void halving_step(float (&v)[V], int lane) {
  if constexpr (kO > 0) {
    if constexpr (kHalf >= 1) {
      const bool upper = (lane & kO) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
      }
      halving_step<kHalf / 2, kO / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kO);
      halving_step<0, kO / 2>(v, lane);
    }
  }
}

/// Sums each of v[V] (V a power of two, at most 32) over the warp: 31 shuffles for V = 32 where V
/// separate butterflies take 5 V. Returns value index lane / (32 / V)'s total (each held by 32 / V
/// lanes). Fixed order: deterministic.
template <int V>
__device__ __forceinline__ float warp_sum_many(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= kWarpSize && (V & (V - 1)) == 0, "a power of two up to 32 values");
  halving_step<V / 2, kWarpSize / 2>(v, lane);
  return v[0];
}

// ---- what one launch computes ----------------------------------------------------------------------

/// Products one launch computes at most (mat_vec_multi's Q, K, V).
constexpr int kFastMaxParts = 3;

/// One product: its output, its weights with their batch broadcast (r2, r3, as mul_mat's), its row
/// tiles per batch, and the first tile of the launch that belongs to it (INT64_MAX: unused).
struct FastPart {
  TensorDesc dst;
  TensorDesc w;
  int64_t r2, r3;
  int64_t row_tiles;
  int64_t first_tile;
};

/// One launch: 1-3 products of one activation (mul_mat; mat_vec_bias with `bias`; mat_vec_multi),
/// or with kGlu the gated product act(part 0's weights x) * (part 1's weights x) into part 0's dst
/// (glu_mat_vec: swiglu or geglu). Tiles: kRows output rows of one batch of one part.
struct FastArgs {
  FastPart part[kFastMaxParts];
  int64_t tiles;
  int64_t batches;  ///< dst.ne[2] * dst.ne[3], the same for every part (one activation)
  int64_t ne2;      ///< dst.ne[2]
  const float* bias;
  bool swiglu;
  uint32_t q6_parts;  ///< mat_vec_direct_q4k_q6k_kernel: bit p set where part p's weights are q6_K
};

/// Output rows per tile: 4 (gated: 2 of gate and 2 of up), whatever the columns, so that every step
/// gives each thread 4 units to decode against the activations it loads (which serve all 4 rows),
/// and the per-step work (copies issued, the wait, the barrier, tile bookkeeping, the reduction)
/// is shared by 4 units. With 1 row per tile at 1 column the q8_0 kernel issued ~310 instructions
/// per 32 weights and ran at 45% of bandwidth, issue-bound (ncu: 0.66 warps issued per scheduler
/// per cycle). The block reduction then takes 4 x kCols <= 32 sums per warp.
template <bool kGlu>
__host__ __device__ constexpr int fast_rows() {
  return kGlu ? 2 : 4;
}

/// The float kernel's rows per tile: its threads load 16 weight bytes per row straight into
/// registers, 4 loads in flight per thread (kUnroll rows x steps), so one row at 1-2 columns and
/// columns / 2 rows beyond (gated: half as many, at least one).
template <int kCols, bool kGlu>
__host__ __device__ constexpr int float_rows() {
  constexpr int rows = kCols <= 2 ? 1 : kCols / 2;
  return kGlu && rows > 1 ? rows / 2 : rows;
}

/// Where tile t writes: its part, first row and batch.
struct TileAt {
  int part;
  int64_t i0, z, i2, i3;
};

template <int kRows>
__device__ __forceinline__ TileAt tile_at(const FastArgs& args, int64_t t) {
  TileAt at;
  at.part = (t >= args.part[1].first_tile ? 1 : 0) + (t >= args.part[2].first_tile ? 1 : 0);
  const FastPart& p = args.part[at.part];
  const int64_t local = t - p.first_tile;
  if (args.batches == 1) {  // decode: no divisions
    at.i0 = local * kRows;
    at.z = at.i2 = at.i3 = 0;
  } else {
    at.z = local / p.row_tiles;
    at.i0 = (local - at.z * p.row_tiles) * kRows;
    at.i2 = at.z % args.ne2;
    at.i3 = at.z / args.ne2;
  }
  return at;
}

/// Row l of a tile (kRows output rows; with kGlu rows kRows.. are the up weights' rows): rows past
/// the end repeat the last one, their sums are dropped.
template <int kRows, bool kGlu>
__device__ __forceinline__ const char* tile_row(const FastArgs& args, const TileAt& at, int l) {
  const FastPart& p = args.part[kGlu && l >= kRows ? 1 : at.part];
  const int64_t m = args.part[at.part].dst.ne[0];
  const int64_t i = at.i0 + (kGlu ? l % kRows : l);
  if (args.batches == 1) return p.w.data + (i < m ? i : m - 1) * p.w.nb[1];
  return row_ptr(p.w, i < m ? i : m - 1, at.i2 / p.r2, at.i3 / p.r3);
}

/// Sums each of the kLoad x kCols values over the block into partial[warp][...] (then synchronized),
/// and writes the tile's outputs: the row's sum (+ bias), or with kGlu act(gate sum) * up sum.
template <int kRows, int kCols, bool kGlu, int kLoad>
__device__ __forceinline__ void reduce_and_store(float (&acc)[kLoad][kCols], float (*partial)[kLoad * kCols],
                                                 const FastArgs& args, const TileAt& at, int ncols) {
  constexpr int V = kLoad * kCols, kLanesPerValue = kWarpSize / V;
  static_assert(V <= kWarpSize, "at most 32 sums per warp");
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  float v[V];
#pragma unroll
  for (int r = 0; r < kLoad; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) v[r * kCols + c] = acc[r][c];
  const float total = warp_sum_many(v, lane);
  if (lane % kLanesPerValue == 0) partial[warp][lane / kLanesPerValue] = total;
  __syncthreads();
  if (tid < kRows * kCols) {
    const int r = tid / kCols, c = tid % kCols;
    const TensorDesc& dst = args.part[at.part].dst;
    const int64_t i = at.i0 + r;
    if (c < ncols && i < dst.ne[0]) {
      float sum = partial[0][tid];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) sum += partial[w][tid];
      if constexpr (kGlu) {
        float up = partial[0][tid + kRows * kCols];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) up += partial[w][tid + kRows * kCols];
        sum = gated_f(sum, up, args.swiglu);
      } else if (args.bias) {
        sum += args.bias[i];
      }
      *reinterpret_cast<float*>(element_ptr(dst, i, c, at.i2, at.i3)) = sum;
    }
  }
}

// ---- float weights ---------------------------------------------------------------------------------

// Tiles blockIdx.x, + gridDim.x, ... of every column (ncols <= kCols); b's columns contiguous and
// 16-byte aligned, the weight rows 16-byte aligned (mat_vec_fast_supports).
template <class F, int kCols, bool kGlu>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<kCols, false>())
    mat_vec_fast_float_kernel(const __grid_constant__ FastArgs args, TensorDesc b, int ncols, bool early) {
  // pdl_wait later: with `early` the block's first step of weights is loaded before it (the host sets it only
  // for weights no kernel of the step writes); the activations after it, with ld_act (coherent loads, which
  // ptxas keeps below the wait)
  constexpr int kRows = float_rows<kCols, kGlu>();
  constexpr int kLoad = kGlu ? 2 * kRows : kRows;
  constexpr int kElems = WideWeights<F>::kElems;
  constexpr int kUnroll = kLoad >= 4 ? 1 : 4 / kLoad;
  __shared__ float partial[kWarps][kLoad * kCols];
  const int tid = threadIdx.x;
  const int64_t n_vec = b.ne[0] / kElems;
  bool waited = !early;  // LOOM_MV_FLOAT_EARLY=0: wait first, as before
  if (waited) pdl_wait();
  for (int64_t t = blockIdx.x; t < args.tiles; t += gridDim.x) {
    const TileAt at = tile_at<kRows>(args, t);
    const uint4* rows[kLoad];
#pragma unroll
    for (int l = 0; l < kLoad; ++l) rows[l] = reinterpret_cast<const uint4*>(tile_row<kRows, kGlu>(args, at, l));
    const char* b_batch = b.data + at.i2 * b.nb[2] + at.i3 * b.nb[3];
    float acc[kLoad][kCols] = {};
    for (int64_t v = tid; v < n_vec; v += static_cast<int64_t>(kThreads) * kUnroll) {
      uint4 q[kUnroll][kLoad];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kLoad; ++r)
          q[u][r] = v + u * kThreads < n_vec ? __ldg(rows[r] + v + u * kThreads) : make_uint4(0, 0, 0, 0);
      if (!waited) {
        pdl_wait();
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t vu = v + u * kThreads;
        if (vu >= n_vec) break;
        float w[kLoad][kElems];
#pragma unroll
        for (int r = 0; r < kLoad; ++r) WideWeights<F>::unpack(q[u][r], w[r]);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if (c >= ncols) break;
          const auto* x = reinterpret_cast<const float4*>(b_batch + c * b.nb[1]) + vu * (kElems / 4);
#pragma unroll
          for (int h = 0; h < kElems / 4; ++h) {
            const float4 xv = ld_act(x + h);
#pragma unroll
            for (int r = 0; r < kLoad; ++r) {
              acc[r][c] = fmaf(w[r][4 * h], xv.x, acc[r][c]);
              acc[r][c] = fmaf(w[r][4 * h + 1], xv.y, acc[r][c]);
              acc[r][c] = fmaf(w[r][4 * h + 2], xv.z, acc[r][c]);
              acc[r][c] = fmaf(w[r][4 * h + 3], xv.w, acc[r][c]);
            }
          }
        }
      }
    }
    if (!waited) {  // a tile with no steps: nothing loaded, but the stores must wait
      pdl_wait();
      waited = true;
    }
    reduce_and_store<kRows, kCols, kGlu>(acc, partial, args, at, ncols);
    __syncthreads();  // partial is rewritten by the next tile
  }
  if (!waited) pdl_wait();  // a block with no tile
}

// ---- quantized weights -----------------------------------------------------------------------------

// Quantizes every row of b (f32, any strides; rows in (i1, i2, i3) order) into Q's ActFastLayout:
// one warp per kActScaleBlock activations, each lane kActScaleBlock / 32 of them.
template <class Q>
__global__ void quantize_act_fast_kernel(ActFastLayout<Q> out, TensorDesc b) {
  pdl_wait();
  constexpr int kBlock = Q::kActScaleBlock, kPerLane = kBlock / kWarpSize;
  static_assert(kPerLane == 1 || kPerLane == 8, "q8_0-sized or q8_K-sized activation blocks");
  const int lane = threadIdx.x % kWarpSize;
  const int64_t k = b.ne[0], per_row = k / kBlock, total = nrows(b) * per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; g < total;
       g += warps) {
    const int64_t row = g / per_row;
    int64_t i1, i2, i3;
    split_row(row, b.ne[1], b.ne[2], i1, i2, i3);
    const int64_t e0 = (g % per_row) * kBlock + kPerLane * lane;  // element of the row
    float x[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      x[e] = *reinterpret_cast<const float*>(element_ptr(b, e0 + e, i1, i2, i3));
      amax = fmaxf(amax, fabsf(x[e]));
    }
    amax = warp_reduce(amax, MaxOp{});
    const float d = act_fast_scale(amax);
    const float id = act_fast_inverse(amax);
    int codes[kPerLane];
    int sum = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      codes[e] = act_fast_code(x[e], id);
      sum += codes[e];
    }
    int8_t* dst = out.codes + row * k + e0;
    if constexpr (kPerLane == 1) {
      *dst = static_cast<int8_t>(codes[0]);
    } else {
      uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e / 4] |= (static_cast<uint32_t>(codes[e]) & 0xffu) << (8 * (e % 4));
      *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);  // 8-byte aligned: k % 256 == 0
    }
    if (lane == 0) out.scales[g] = d;
    if constexpr (Q::kActSums) {  // 4 lanes per 32 codes
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (lane % 4 == 0) out.sums[e0 / kFastUnit + row * (k / kFastUnit)] = static_cast<int16_t>(sum);
    }
  }
}

/// Unit u's decoded weights of the tile's kLoad rows (w) against the unit's 32 activation codes of each of
/// the ncols columns of batch z, their terms added to acc: a step of the pipeline and of the direct unit
/// kernel alike. n_units = k / kFastUnit and scales_per_row = k / Q::kActScaleBlock, the callers' (once
/// a kernel, not a step).
template <class Q, int kCols, int kLoad>
__device__ __forceinline__ void unit_dot_columns(const typename Q::Unit (&w)[kLoad], const ActFastLayout<Q>& act,
                                                 int64_t k, int64_t n_units, int64_t scales_per_row, int64_t u,
                                                 int ncols, int64_t z, float (&acc)[kLoad][kCols]) {
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if (c >= ncols) break;
    const int64_t col = c + ncols * z;
    const auto* xp = reinterpret_cast<const int4*>(act.codes + col * k + u * kFastUnit);
    const int4 x0 = ld_act(xp), x1 = ld_act(xp + 1);
    const int x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float dx = ld_act(act.scales + col * scales_per_row + u * kFastUnit / Q::kActScaleBlock);
    int xsum = 0;
    if constexpr (Q::kActSums) xsum = ld_act(act.sums + col * n_units + u);
#pragma unroll
    for (int l = 0; l < kLoad; ++l) acc[l][c] += Q::dot(w[l], x, dx, xsum);
  }
}

// Tiles blockIdx.x, + gridDim.x, ... (a grid of about one wave: every block walks several tiles)
// against the activations quantized in act (column j of batch z at row j + ncols * z). The
// block's work is a sequence of steps (tile, stage); thread 0 keeps the bulk copies of the next
// kDepth - 1 steps in flight (one per row, each buffer with its mbarrier) while the block computes
// a step, across tile boundaries. Rows are 16-byte aligned with a multiple of 16 bytes
// (mat_vec_fast_supports), as the bulk copy needs. Per-thread cp.async of 16-byte chunks spent
// ~180 instructions per step issuing them (ncu: issue-bound at 0.66 warps per scheduler-cycle).
template <class Q, int kCols, bool kGlu>
__global__ void __launch_bounds__(kThreads, quant_blocks_per_sm<Q, kCols>())
    mat_vec_fast_q_kernel(const __grid_constant__ FastArgs args, ActFastLayout<Q> act, int64_t k, int ncols) {
  // pdl_wait later: only the weights, no earlier kernel's output, are read (copied) before it
  constexpr int kRows = fast_rows<kGlu>();
  constexpr int kLoad = kGlu ? 2 * kRows : kRows;
  constexpr int kStageBytes = kUnitsPerStage / Q::kUnitsPerBlock * Q::kBytes;  // of one row
  static_assert(kStageBytes % 16 == 0, "stages start on 16-byte boundaries of a row");
  // load_words_a2 reads a word past a unit's bytes
  constexpr int kRowBuf = kStageBytes + 16;
  // stages in flight: 3 where they fit in ~30 KB (q4_0, q4_K: 28 KB), else 2 (q8_0 35 KB, q6_K 27 KB)
  constexpr int kDepth = 3 * kLoad * kRowBuf <= 30 * 1024 ? 3 : 2;
  __shared__ __align__(16) uint8_t stage[kDepth][kLoad][kRowBuf];
  __shared__ float partial[kWarps][kLoad * kCols];
  __shared__ __align__(8) uint64_t full[kDepth];

  const int tid = threadIdx.x;
  const int64_t n_units = k / kFastUnit, row_bytes = k / Q::kBlock * Q::kBytes;
  const int64_t scales_per_row = k / Q::kActScaleBlock;
  const int n_stages = static_cast<int>((n_units + kUnitsPerStage - 1) / kUnitsPerStage);
  const int64_t my_tiles =
      static_cast<int64_t>(blockIdx.x) < args.tiles ? (args.tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int64_t n_steps = my_tiles * n_stages;

  if (tid == 0) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) mbar_init(&full[d], 1);
    mbar_init_fence();
  }
  __syncthreads();

  // Thread 0 walks (tile, stage) kDepth - 1 steps ahead of the computing side.
  int64_t issue_tile = blockIdx.x;
  int issue_stage = 0;
  const char* issue_rows[kLoad];
  auto issue = [&](int64_t j) {
    if (j >= n_steps) return;
    if (issue_stage == 0) {
      const TileAt at = tile_at<kRows>(args, issue_tile);
#pragma unroll
      for (int l = 0; l < kLoad; ++l) issue_rows[l] = tile_row<kRows, kGlu>(args, at, l);
    }
    const int64_t begin = static_cast<int64_t>(issue_stage) * kStageBytes;
    const auto bytes = static_cast<unsigned>(row_bytes - begin < kStageBytes ? row_bytes - begin : kStageBytes);
    const int buf = static_cast<int>(j % kDepth);
    mbar_arrive_expect(&full[buf], bytes * kLoad);
#pragma unroll
    for (int l = 0; l < kLoad; ++l) bulk_copy(&stage[buf][l][0], issue_rows[l] + begin, bytes, &full[buf]);
    if (++issue_stage == n_stages) {
      issue_stage = 0;
      issue_tile += gridDim.x;
    }
  };

  // the weights are no earlier kernel's output: their first copies go out before the wait for one
  if (tid == 0) {
#pragma unroll
    for (int d = 0; d < kDepth - 1; ++d) issue(d);
  }
  pdl_wait();
  int64_t tile = blockIdx.x;
  int s = 0;
  TileAt at = tile_at<kRows>(args, tile);
  float acc[kLoad][kCols] = {};
  for (int64_t j = 0; j < n_steps; ++j) {
    if (tid == 0) {
      fence_proxy_async();  // the block's reads of the buffer refilled here ended at the last barrier
      issue(j + kDepth - 1);
    }
    const int buf = static_cast<int>(j % kDepth);
    mbar_wait(&full[buf], static_cast<unsigned>((j / kDepth) & 1));
    const int64_t u = static_cast<int64_t>(s) * kUnitsPerStage + tid;
    if (u < n_units) {
      const int blk = tid / Q::kUnitsPerBlock, part = tid % Q::kUnitsPerBlock;
      typename Q::Unit w[kLoad];
#pragma unroll
      for (int l = 0; l < kLoad; ++l) w[l] = Q::decode(&stage[buf][l][blk * Q::kBytes], part);
      unit_dot_columns<Q, kCols, kLoad>(w, act, k, n_units, scales_per_row, u, ncols, at.z, acc);
    }
    if (++s == n_stages) {  // the tile is complete
      reduce_and_store<kRows, kCols, kGlu>(acc, partial, args, at, ncols);
#pragma unroll
      for (int l = 0; l < kLoad; ++l)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[l][c] = 0.0f;
      s = 0;
      tile += gridDim.x;
      if (tile < args.tiles) at = tile_at<kRows>(args, tile);
    }
    __syncthreads();  // the stage's buffer (and partial) are refilled kDepth - 1 steps on
  }
}

/// A direct kernel's warp tile t (blockIdx.x * kWarps + warp; a warp past the last tile reads the last
/// tile's rows and writes nothing).
template <int kRows>
__device__ __forceinline__ TileAt warp_tile(const FastArgs& args, int64_t& t) {
  t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  return tile_at<kRows>(args, t < args.tiles ? t : args.tiles - 1);
}

/// warp_tile and the weight rows the tile reads.
template <int kRows, bool kGlu, int kLoad>
__device__ __forceinline__ TileAt warp_tile(const FastArgs& args, int64_t& t, const uint8_t* (&rows)[kLoad]) {
  const TileAt at = warp_tile<kRows>(args, t);
#pragma unroll
  for (int l = 0; l < kLoad; ++l) rows[l] = reinterpret_cast<const uint8_t*>(tile_row<kRows, kGlu>(args, at, l));
  return at;
}

/// A warp's tile (t) done: sums each of its kLoad x kCols accumulators over the warp and writes the
/// tile's outputs as reduce_and_store does (+ bias, or the gated product of gate and up rows).
template <int kRows, int kCols, bool kGlu, int kLoad>
__device__ __forceinline__ void warp_reduce_store(float (&acc)[kLoad][kCols], const FastArgs& args, const TileAt& at,
                                                  int64_t t, int lane, int ncols) {
  // the warp's kLoad x kCols sums: value v ends on lanes v * (32 / V) ..
  constexpr int V = kLoad * kCols, kLanesPerValue = kWarpSize / V;
  static_assert(V <= kWarpSize, "at most 32 sums per warp");
  float v[V];
#pragma unroll
  for (int l = 0; l < kLoad; ++l)
#pragma unroll
    for (int c = 0; c < kCols; ++c) v[l * kCols + c] = acc[l][c];
  const float total = warp_sum_many(v, lane);
  const int idx = lane / kLanesPerValue;
  float up = 0.0f;
  if constexpr (kGlu) up = __shfl_sync(0xffffffffu, total, ((idx + kRows * kCols) % V) * kLanesPerValue);
  if (t >= args.tiles || lane % kLanesPerValue != 0 || idx >= kRows * kCols) return;
  const int r = idx / kCols, c = idx % kCols;
  const TensorDesc& dst = args.part[at.part].dst;
  const int64_t i = at.i0 + r;
  if (c >= ncols || i >= dst.ne[0]) return;
  float sum = total;
  if constexpr (kGlu) {
    sum = gated_f(sum, up, args.swiglu);
  } else if (args.bias) {
    sum += args.bias[i];
  }
  *reinterpret_cast<float*>(element_ptr(dst, i, c, at.i2, at.i3)) = sum;
}

// ---- q4_K straight from global memory ---------------------------------------------------------------

/// Blocks per SM for the direct kernels (1-2 columns; ptxas -v: q4_K ~150 registers at 1 column
/// unconstrained, 122 under 4 blocks, 158 at 2 columns; q4_0 100 / 138, q8_0 128 / 142; q6_K 99-108 /
/// 112-147; no spills).
template <int kCols, bool kPrefetch = false>
__host__ __device__ constexpr int direct_blocks_per_sm() {
  // a prefetched step doubles the weight registers (q4_K 4-row tiles: 96): one block per SM fewer,
  // where the budget above spilled 116-128 bytes
  return (kCols <= 1 ? 4 : 3) - (kPrefetch ? 1 : 0);
}

/// The two 6-bit scales and mins of q4_K sub-blocks 2 pair and 2 pair + 1 from the block's scale
/// words s0 = scales[0..3], s1 = scales[4..7], s2 = scales[8..11]: each as bytes (lo, hi) of a
/// 16-bit value. Branch-free: the lanes of a warp hold different pairs.
__device__ __forceinline__ void q4k_pair_scales(uint32_t s0, uint32_t s1, uint32_t s2, int pair, uint32_t& sc,
                                                uint32_t& m) {
  const unsigned sh = 16u * static_cast<unsigned>(pair & 1);
  const uint32_t a = s0 >> sh, b = s1 >> sh, c = s2 >> sh;
  const uint32_t sc_lo = a & 0x3f3fu, m_lo = b & 0x3f3fu;                              // sub-blocks 0..3
  const uint32_t sc_hi = (c & 0x0f0fu) | ((a >> 2) & 0x3030u);                          // 4..7
  const uint32_t m_hi = ((c >> 4) & 0x0f0fu) | ((b >> 2) & 0x3030u);
  sc = pair < 2 ? sc_lo : sc_hi;
  m = pair < 2 ? m_lo : m_hi;
}

// Tiles of kRows output rows (glu: 2 gate + 2 up), one per warp, with q4_K weights read from global
// memory straight into registers: a q4_K block is 144 bytes, so on 16-byte aligned rows
// (mat_vec_fast_supports) its 16-byte header (d, dmin, 12 scale bytes) and its 32-byte groups of
// nibbles are 16-byte aligned. Lane 4 j + p takes group p of blocks j, j + 8, ... of each row: the low
// nibbles are sub-block 2 p (elements 64 p + 0..31), the high ones sub-block 2 p + 1 (64 p + 32..63);
// the 4 lanes of a block share its header load. A warp owns its tile: no shared memory and no block
// barrier; its sums are reduced with shuffles. Per 64 weights of a row a lane issues two 16-byte
// loads, 16 dp4a and ~30 other instructions; the activations' codes, scale and sub-block sums are
// loaded once for the tile's rows.
//
// Measured (ncu, H200, caches flushed, q4_K 4096x14336 at 1 column): 14.6 us, 47% of DRAM peak, 3.2M
// instructions, against the shared-memory pipeline's (mat_vec_fast_q_kernel, LOOM_MV_DIRECT=0) 15.5
// us, 44%, 6.2M. Both are latency-bound (~1.9 instructions per cycle per SM, no unit busy): while a
// warp computes a step it has no load in flight. Tried and slower: one block per 4-row tile with a
// block reduction (41%); L2 bulk prefetches of the next tiles (36-38%); per-lane cp.async into
// shared memory two steps deep (30%: every 32-byte sector is then requested by two copies, one per
// 16-byte half, both to L2).
//
// kPrefetch: the next step's weights are loaded into a second set of registers before this step's
// arithmetic, so a warp keeps a step of loads in flight while it computes (LOOM_MV_PREFETCH=0: not).
// Tiles of 4 loaded rows then need one block per SM fewer (96 registers of weights), which costs more
// than it gives where a warp has few steps: ncu, H100, 1 column, off -> on: 14336 rows of k = 4096
// (2 steps, 4-row tiles) 16.5 -> 17.6 us; 4096 of k = 14336 (7 steps) 16.8 -> 15.2; 4096 of 4096 (2-row
// tiles, same occupancy) 8.1 -> 7.5. So: always on 2-row tiles, on 4-row ones from k = 8192.
//
// kQ5: q5_K's 176-byte blocks, the same with a fifth bit a code: its 32 qh bytes (16 in, two 16-byte
// loads a lane, shared by the block's 4 lanes) hold bit s of sub-block s's code l in byte l, so lane p
// ORs bits 2 p and 2 p + 1 of the word covering codes l .. l + 3 into its low and high nibbles; the
// codes sit at 48 (16-byte aligned: 48 + 32 p). Scales, mins and the activations' layout are q4_K's.
template <int kCols, bool kGlu, int kRows, bool kPrefetch, bool kQ5>
__device__ __forceinline__ void direct_q4k_tile(const FastArgs& args,
                                                ActFastLayout<std::conditional_t<kQ5, FastQ5_K, FastQ4_K>> act,
                                                int64_t k, int ncols) {
  constexpr int kBlockBytes = kQ5 ? 176 : 144, kCodeChunk = kQ5 ? 3 : 1;  // 16-byte chunks
  constexpr int kLoad = kGlu ? 2 * kRows : kRows;
  constexpr int kLanesPerBlock = 4, kBlocksPerStep = kWarpSize / kLanesPerBlock;
  const int lane = threadIdx.x % kWarpSize;
  const int p = lane % kLanesPerBlock;  // the lane's 64-weight group of each block
  const int64_t n_blocks = k / 256;
  int64_t t;
  const uint8_t* rows[kLoad];
  const TileAt at = warp_tile<kRows, kGlu>(args, t, rows);
  bool waited = false;  // the weights are no earlier kernel's output: the first loads go out before the wait
  float acc[kLoad][kCols] = {};
  constexpr int kQh = kQ5 ? kLoad : 1;  // q5_K's fifth bits (unused for q4_K)
  auto load = [&](int64_t b, uint4(&h)[kLoad], uint4(&q0)[kLoad], uint4(&q1)[kLoad], uint4(&qh0)[kQh],
                  uint4(&qh1)[kQh]) {
#pragma unroll
    for (int l = 0; l < kLoad; ++l) {
      const auto* blk = reinterpret_cast<const uint4*>(rows[l] + b * kBlockBytes);
      h[l] = __ldg(blk);
      q0[l] = __ldg(blk + kCodeChunk + 2 * p);
      q1[l] = __ldg(blk + kCodeChunk + 1 + 2 * p);
      if constexpr (kQ5) {
        qh0[l] = __ldg(blk + 1);
        qh1[l] = __ldg(blk + 2);
      }
    }
  };
  // one step: block b of each loaded row (its weights in h, q0, q1, qh0, qh1), every column
  auto step = [&](int64_t b, const uint4(&h)[kLoad], const uint4(&q0)[kLoad], const uint4(&q1)[kLoad],
                  const uint4(&qh0)[kQh], const uint4(&qh1)[kQh]) {
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    float d[kLoad], dmin[kLoad];
    int sc0[kLoad], sc1[kLoad], m0[kLoad], m1[kLoad];
#pragma unroll
    for (int l = 0; l < kLoad; ++l) {
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&h[l].x));
      d[l] = dd.x;
      dmin[l] = dd.y;
      uint32_t sc, m;
      q4k_pair_scales(h[l].y, h[l].z, h[l].w, p, sc, m);
      sc0[l] = static_cast<int>(sc & 0xffu);
      sc1[l] = static_cast<int>(sc >> 8);
      m0[l] = static_cast<int>(m & 0xffu);
      m1[l] = static_cast<int>(m >> 8);
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      if (c >= ncols) break;
      const int64_t col = c + ncols * at.z;
      const auto* xc = reinterpret_cast<const int4*>(act.codes + col * k + b * 256 + 64 * p);
      const int4 xa = ld_act(xc), xb = ld_act(xc + 1), xc2 = ld_act(xc + 2), xd = ld_act(xc + 3);
      const float dx = ld_act(act.scales + col * n_blocks + b);
      // the two sub-blocks' activation code sums (int16 pairs, 4-byte aligned: 8 b + 2 p is even)
      const uint32_t sums =
          ld_act(reinterpret_cast<const uint32_t*>(act.sums + col * (k / kFastUnit) + 8 * b + 2 * p));
      const int s0 = static_cast<int16_t>(sums & 0xffffu), s1 = static_cast<int16_t>(sums >> 16);
      const int x_lo[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      const int x_hi[8] = {xc2.x, xc2.y, xc2.z, xc2.w, xd.x, xd.y, xd.z, xd.w};
#pragma unroll
      for (int l = 0; l < kLoad; ++l) {
        const uint32_t w[8] = {q0[l].x, q0[l].y, q0[l].z, q0[l].w, q1[l].x, q1[l].y, q1[l].z, q1[l].w};
        int i0 = 0, i1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          uint32_t lo = w[i] & 0x0f0f0f0fu, hi = (w[i] >> 4) & 0x0f0f0f0fu;
          if constexpr (kQ5) {
            const uint4& qv = i < 4 ? qh0[l] : qh1[l];
            const uint32_t hb = (i % 4 == 0 ? qv.x : i % 4 == 1 ? qv.y : i % 4 == 2 ? qv.z : qv.w) >> (2 * p);
            lo |= (hb & 0x01010101u) << 4;
            hi |= ((hb >> 1) & 0x01010101u) << 4;
          }
          i0 = dot4(static_cast<int>(lo), x_lo[i], i0);
          i1 = dot4(static_cast<int>(hi), x_hi[i], i1);
        }
        const float dsum = static_cast<float>(sc0[l] * i0 + sc1[l] * i1);
        const float msum = static_cast<float>(m0[l] * s0 + m1[l] * s1);
        acc[l][c] += dx * (d[l] * dsum - dmin[l] * msum);
      }
    }
  };
  const int64_t first = lane / kLanesPerBlock;
  if constexpr (kPrefetch && !kQ5) {
    // two register sets in turn, each loaded a step ahead of its use (a set copied into the other every
    // step, as below, was ~48 moves a step of ~380 instructions: SASS of the gate/up kernel; q5_K keeps
    // the copy, its two sets in turn spilling 64-72 bytes at its 128-register bound)
    uint4 ha[kLoad], q0a[kLoad], q1a[kLoad], qh0a[kQh], qh1a[kQh];
    uint4 hb[kLoad], q0b[kLoad], q1b[kLoad], qh0b[kQh], qh1b[kQh];
    if (first < n_blocks) load(first, ha, q0a, q1a, qh0a, qh1a);
#pragma unroll 1
    for (int64_t b = first; b < n_blocks; b += 2 * kBlocksPerStep) {
      const int64_t b1 = b + kBlocksPerStep, b2 = b1 + kBlocksPerStep;
      if (b1 < n_blocks) load(b1, hb, q0b, q1b, qh0b, qh1b);
      step(b, ha, q0a, q1a, qh0a, qh1a);
      if (b1 >= n_blocks) break;
      if (b2 < n_blocks) load(b2, ha, q0a, q1a, qh0a, qh1a);
      step(b1, hb, q0b, q1b, qh0b, qh1b);
    }
  } else {
    uint4 nq0[kLoad], nq1[kLoad], nh[kLoad], nqh0[kQh], nqh1[kQh];  // the prefetched step (kPrefetch)
    if (kPrefetch && first < n_blocks) load(first, nh, nq0, nq1, nqh0, nqh1);
#pragma unroll 1
    for (int64_t b = first; b < n_blocks; b += kBlocksPerStep) {
      uint4 q0[kLoad], q1[kLoad], h[kLoad], qh0[kQh], qh1[kQh];
      if constexpr (kPrefetch) {
#pragma unroll
        for (int l = 0; l < kLoad; ++l) {
          h[l] = nh[l];
          q0[l] = nq0[l];
          q1[l] = nq1[l];
        }
#pragma unroll
        for (int l = 0; l < kQh; ++l) qh0[l] = nqh0[l], qh1[l] = nqh1[l];
        if (b + kBlocksPerStep < n_blocks) load(b + kBlocksPerStep, nh, nq0, nq1, nqh0, nqh1);
      } else {
        load(b, h, q0, q1, qh0, qh1);
      }
      step(b, h, q0, q1, qh0, qh1);
    }
  }
  if (!waited) pdl_wait();
  warp_reduce_store<kRows, kCols, kGlu>(acc, args, at, t, lane, ncols);
}

template <int kCols, bool kGlu, int kRows, bool kPrefetch, bool kQ5 = false>
__global__ void __launch_bounds__(kThreads, direct_blocks_per_sm<kCols, (kPrefetch && (kGlu ? 2 * kRows : kRows) > 2)>())
    mat_vec_direct_q4k_kernel(const __grid_constant__ FastArgs args,
                              ActFastLayout<std::conditional_t<kQ5, FastQ5_K, FastQ4_K>> act, int64_t k, int ncols) {
  // pdl_wait later: the first step's weight loads (no earlier kernel's output) go out before it,
  // in direct_q4k_tile, which calls pdl_wait(); after them
  direct_q4k_tile<kCols, kGlu, kRows, kPrefetch, kQ5>(args, act, k, ncols);
}

// ---- q4_0 and q8_0 straight from global memory -------------------------------------------------------

/// The 32-weight formats with a 2-byte scale before the codes (18-byte q4_0, 34-byte q8_0 blocks, only
/// 2-byte aligned): 8 blocks are a multiple of 16 bytes, so on 16-byte aligned rows every 8th block
/// starts 16-byte aligned.
struct DirectQ4_0 {
  using Fast = FastQ4_0;
  static constexpr int kBytes = 18, kCodeWords = 4;
};
struct DirectQ8_0 {
  using Fast = FastQ8_0;
  static constexpr int kBytes = 34, kCodeWords = 8;
};

// Tiles of kRows output rows (glu: 2 gate + 2 up), one per warp, with q4_0 / q8_0 weights loaded
// straight into registers. Lane 4 j + p takes blocks 2 p and 2 p + 1 of each 8-block group j, j + 8,
// ... of a row (64 weights): their 2 x kBytes bytes start at byte 2 p kBytes of the 16-byte aligned
// group, which is word p of its 16-byte chunk (both formats), so the lane loads the chunks covering
// them (3 for q4_0, 5 for q8_0) and takes the words from word p on (two selects per word). The first
// block's scale is the low half of word 0 and its codes start 2 bytes in (funnel shifts); the second's
// scale is the high half of word kBytes / 4 and its codes are the aligned words after it. Per block:
// d dx (isum - 8 xsum) for q4_0 (xsum from dp4a with ones, once for the tile's rows), d dx isum for
// q8_0. As mat_vec_direct_q4k_kernel otherwise.
template <class F, int kCols, bool kGlu, int kRows>
__global__ void __launch_bounds__(kThreads, direct_blocks_per_sm<kCols>())
    mat_vec_direct_a2_kernel(const __grid_constant__ FastArgs args, ActFastLayout<typename F::Fast> act, int64_t k,
                             int ncols) {
  // pdl_wait later: the first step's weight loads (no earlier kernel's output) go out before it
  constexpr int kLoad = kGlu ? 2 * kRows : kRows;
  constexpr int kLanesPerGroup = 4, kGroupsPerStep = kWarpSize / kLanesPerGroup;
  constexpr int kGroupBytes = 8 * F::kBytes;                 // 144 / 272: a multiple of 16
  constexpr int kWords = 2 * F::kBytes / 4;                  // 9 / 17 words from word p on
  constexpr int kChunks = (2 * F::kBytes + 12 + 15) / 16;    // 3 / 5 16-byte loads cover words p .. p + kWords - 1
  constexpr int kHi = F::kBytes / 4;                         // the word holding block 1's scale (high half)
  constexpr bool kNibbles = F::kCodeWords == 4;
  static_assert(kGroupBytes % 16 == 0 && kChunks * 4 >= kWords + 3, "chunks cover the lane's words");
  const int lane = threadIdx.x % kWarpSize;
  const int p = lane % kLanesPerGroup;
  const int64_t n_groups = k / 256;
  const int64_t n_scales = k / 32;
  const int first_chunk = 2 * F::kBytes * p / 16;
  int64_t t;
  const uint8_t* rows[kLoad];
  const TileAt at = warp_tile<kRows, kGlu>(args, t, rows);
  bool waited = false;  // the weights are no earlier kernel's output: the first loads go out before the wait
  float acc[kLoad][kCols] = {};
#pragma unroll 1
  for (int64_t g = lane / kLanesPerGroup; g < n_groups; g += kGroupsPerStep) {
    uint32_t w[kLoad][kWords];
#pragma unroll
    for (int l = 0; l < kLoad; ++l) {
      const auto* chunk = reinterpret_cast<const uint4*>(rows[l] + g * kGroupBytes) + first_chunk;
      uint32_t raw[kChunks * 4];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const uint4 v = __ldg(chunk + c);
        raw[4 * c] = v.x, raw[4 * c + 1] = v.y, raw[4 * c + 2] = v.z, raw[4 * c + 3] = v.w;
      }
      uint32_t half[kWords + 2];
#pragma unroll
      for (int i = 0; i < kWords + 2; ++i) half[i] = (p & 1) ? raw[i + 1] : raw[i];
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[l][i] = (p & 2) ? half[i + 2] : half[i];
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      if (c >= ncols) break;
      const int64_t col = c + ncols * at.z;
      const auto* xc = reinterpret_cast<const int4*>(act.codes + col * k + g * 256 + 64 * p);
      const int4 x0 = ld_act(xc), x1 = ld_act(xc + 1), x2 = ld_act(xc + 2), x3 = ld_act(xc + 3);
      const float2 dx = ld_act(reinterpret_cast<const float2*>(act.scales + col * n_scales + 8 * g + 2 * p));
      const int xa[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};  // block 2 p's codes
      const int xb[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};  // block 2 p + 1's
      int sa = 0, sb = 0;
      if constexpr (kNibbles) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          sa = dot4(xa[i], 0x01010101, sa);
          sb = dot4(xb[i], 0x01010101, sb);
        }
      }
#pragma unroll
      for (int l = 0; l < kLoad; ++l) {
        uint32_t qa[F::kCodeWords], qb[F::kCodeWords];
#pragma unroll
        for (int i = 0; i < F::kCodeWords; ++i) {
          qa[i] = __funnelshift_r(w[l][i], w[l][i + 1], 16);
          qb[i] = w[l][kHi + 1 + i];
        }
        int ia = 0, ib = 0;
        if constexpr (kNibbles) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            ia = dot4(static_cast<int>(qa[i] & 0x0f0f0f0fu), xa[i], ia);
            ia = dot4(static_cast<int>((qa[i] >> 4) & 0x0f0f0f0fu), xa[4 + i], ia);
            ib = dot4(static_cast<int>(qb[i] & 0x0f0f0f0fu), xb[i], ib);
            ib = dot4(static_cast<int>((qb[i] >> 4) & 0x0f0f0f0fu), xb[4 + i], ib);
          }
          ia -= 8 * sa;
          ib -= 8 * sb;
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            ia = dot4(static_cast<int>(qa[i]), xa[i], ia);
            ib = dot4(static_cast<int>(qb[i]), xb[i], ib);
          }
        }
        const float da = __half2float(__ushort_as_half(static_cast<unsigned short>(w[l][0] & 0xffffu)));
        const float db = __half2float(__ushort_as_half(static_cast<unsigned short>(w[l][kHi] >> 16)));
        acc[l][c] += da * dx.x * static_cast<float>(ia) + db * dx.y * static_cast<float>(ib);
      }
    }
  }
  if (!waited) pdl_wait();
  warp_reduce_store<kRows, kCols, kGlu>(acc, args, at, t, lane, ncols);
}

// ---- q6_K straight from global memory -----------------------------------------------------------------

// Tiles of kRows output rows (glu: 2 gate + 2 up), one per warp, with q6_K weights loaded straight into
// registers (DirectQ6_K, mat_vec_fast_formats.cuh: block j of a 16-byte aligned group of 8 starts 2 j
// bytes into a 16-byte chunk, so each of a part's three 16-byte runs is cut out of the two chunks that
// hold it). Unlike the other direct kernels a lane works on one row of the tile: lane (r, jo, u) takes
// part u (64 weights) of blocks j = jj kPhases + jo, jj = 0, 1, .., of every group of row r; the
// tile's rows' lanes load the same activation codes (the same L1 lines). A lane's j is thus known at
// compile time up to jo: with 8 lanes per row (4-row tiles, 2 + 2 gated) the runs come out of their
// chunks by register renaming and one funnel shift by 0 or 16 bits; with 16 (2-row tiles, 1 + 1) one
// level of selects too. (Lanes over 8 blocks of one row, as the other direct kernels, would need two
// levels of selects on a per-lane j; lanes over groups would idle at k 2048.) Per 64 weights of a row
// a lane issues six 16-byte weight loads, four 8-bit ones (its scales, sign-extended by the load) and
// a 16-bit one (d); 12 funnel shifts (4-row tiles; 2-row: and 15 selects) cut out its runs, ~52
// shifts and logic ops make the 64 codes (DirectQ6_K::decode) and 16 dp4a take their sums; per column
// four 16-byte activation loads and one of their scale. kSteps blocks' loads go out before the first
// is decoded. A lane's sums are of its row alone: warp_reduce_store adds them up with zeros for the
// tile's other rows.
template <int kCols, bool kGlu, int kRows>
__device__ __forceinline__ void direct_q6k_tile(const FastArgs& args, ActFastLayout<FastQ6_K> act, int64_t k,
                                                int ncols) {
  using D = DirectQ6_K;
  constexpr int kLoad = kGlu ? 2 * kRows : kRows;
  constexpr int kLanesPerRow = kWarpSize / kLoad;       // 8 (4-row tiles), 16 (2-row)
  constexpr int kPhases = kLanesPerRow / D::kParts;     // 2, 4
  constexpr int kPerGroup = D::kGroupBlocks / kPhases;  // a lane's blocks of a group: 4, 2
  constexpr int kSteps = 2;                             // blocks loaded together
  static_assert(kPhases * D::kParts * kLoad == kWarpSize && kPerGroup % kSteps == 0, "lanes cover the tile");
  const int lane = threadIdx.x % kWarpSize;
  const int u = lane % D::kParts, jo = lane / D::kParts % kPhases, my_row = lane / kLanesPerRow;
  const int h = u >> 1, s = u & 1;
  const int64_t n_groups = k / (D::kGroupBlocks * 256), n_blocks = k / 256;
  int64_t t;
  const TileAt at = warp_tile<kRows>(args, t);
  const uint8_t* row = reinterpret_cast<const uint8_t*>(tile_row<kRows, kGlu>(args, at, my_row));
  bool waited = false;  // the weights are no earlier kernel's output: the first loads go out before the wait
  float acc[kCols] = {};
#pragma unroll 1
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = row + g * D::kGroupBytes;
    const auto* chunks = reinterpret_cast<const uint4*>(group);
#pragma unroll
    for (int j0 = 0; j0 < kPerGroup; j0 += kSteps) {
      uint32_t ql[kSteps][16], qh[kSteps][8], d_bits[kSteps];
      int sc[kSteps][4];
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int j = (j0 + st) * kPhases + jo;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 v = __ldg(chunks + D::ql_chunk(j, u) + i);
          ql[st][4 * i] = v.x, ql[st][4 * i + 1] = v.y, ql[st][4 * i + 2] = v.z, ql[st][4 * i + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint4 v = __ldg(chunks + D::qh_chunk(j, u) + i);
          qh[st][4 * i] = v.x, qh[st][4 * i + 1] = v.y, qh[st][4 * i + 2] = v.z, qh[st][4 * i + 3] = v.w;
        }
#pragma unroll
        for (int c = 0; c < 4; ++c)
          sc[st][c] = __ldg(reinterpret_cast<const signed char*>(group + D::scale_byte(j, u, c)));
        d_bits[st] = __ldg(reinterpret_cast<const unsigned short*>(group + D::d_byte(j)));
      }
      if (!waited) {
        pdl_wait();
        waited = true;
      }
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int j = (j0 + st) * kPhases + jo;
        const D::Part p = D::decode(ql[st], qh[st], sc[st], d_bits[st], j >> 1, j & 1);
        const int64_t b = g * D::kGroupBlocks + j;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if (c >= ncols) break;
          const int64_t col = c + ncols * at.z;
          const auto* xc = reinterpret_cast<const int4*>(act.codes + col * k + b * 256 + 128 * h + 16 * s);
          int x[4][4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // unit e's 16 codes, 32 apart
            const int4 v = ld_act(xc + 2 * e);
            x[e][0] = v.x, x[e][1] = v.y, x[e][2] = v.z, x[e][3] = v.w;
          }
          const float dx = ld_act(act.scales + col * n_blocks + b);
          acc[c] += p.d4 * dx * static_cast<float>(D::isum(p, x));
        }
      }
    }
  }
  if (!waited) pdl_wait();
  float sums[kLoad][kCols];  // this lane's row, zeros for the others
#pragma unroll
  for (int l = 0; l < kLoad; ++l)
#pragma unroll
    for (int c = 0; c < kCols; ++c) sums[l][c] = l == my_row ? acc[c] : 0.0f;
  warp_reduce_store<kRows, kCols, kGlu>(sums, args, at, t, lane, ncols);
}

template <int kCols, bool kGlu, int kRows>
__global__ void __launch_bounds__(kThreads, direct_blocks_per_sm<kCols>())
    mat_vec_direct_q6k_kernel(const __grid_constant__ FastArgs args, ActFastLayout<FastQ6_K> act, int64_t k,
                              int ncols) {
  // pdl_wait later: the first step's weight loads (no earlier kernel's output) go out before it,
  // in direct_q6k_tile, which calls pdl_wait(); after them
  direct_q6k_tile<kCols, kGlu, kRows>(args, act, k, ncols);
}

// A Q4_K_M file's Q, K and V of one layer at one column (decode), where V's weights are q6_K and Q's and
// K's q4_K: one launch, each warp's tile taking the q4_K or the q6_K direct kernel's code by its part's
// type (a part's tiles are one warp's each, so the branch is uniform in a warp), against one activation
// quantized in the 256-block layout with sums (the q4_K kernel reads the sums, the q6_K one not). Before,
// V was a launch of its own in half the layers: a kernel boundary for 3.4 MB of weights.
template <int kRows, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, direct_blocks_per_sm<1, (kPrefetch && kRows > 2)>())
    mat_vec_direct_q4k_q6k_kernel(const __grid_constant__ FastArgs args, ActFastLayout<FastQ4_K> act, int64_t k) {
  // pdl_wait later: both tile functions load the first step's weights, then call pdl_wait(); they read
  // the activations with ld_act (coherent loads), which ptxas keeps after the wait: with __ldg it put the
  // q6_K tile's first activation loads above it (SASS, stop 45), and under PDL the logits moved run to run
  int64_t t;
  const TileAt at = warp_tile<kRows>(args, t);
  if ((args.q6_parts >> at.part) & 1u) {
    direct_q6k_tile<1, false, kRows>(args, ActFastLayout<FastQ6_K>{ActFastRaw{act.codes, act.scales, nullptr}}, k, 1);
  } else {
    direct_q4k_tile<1, false, kRows, kPrefetch, false>(args, act, k, 1);
  }
}

// ---- the other K-quants and iq4_xs straight from global memory ---------------------------------------

/// The formats whose unit decode (mat_vec_fast_formats.cuh) reads nothing past its own block
/// at the alignment rows give them in global memory (q2_K's 84-byte blocks: 4-byte aligned; q3_K's
/// 110: 2-byte, its aligned words starting up to 2 bytes before a block, in the row's previous one, as
/// a row starts 16-byte aligned; iq4_xs's 136: 8-byte, read in 8-byte words), and the 32-weight q4_1 (20
/// bytes, its codes 4-byte aligned) and q5_1 (24, 8-byte) whose codes are read in whole words
/// (NibbleAlign::a4), so mat_vec_direct_unit_kernel may decode rows in place: no read past a tensor's last
/// block. q5_0 and iq4_nl (2-byte aligned codes, which their pipeline decode reads a word past) through
/// decode_in_block (NibbleAlign::a2_in: the last two bytes a 16-bit load); mxfp4 stays on the pipeline.
template <class Q>
constexpr bool kDirectUnit = std::is_same_v<Q, FastQ2_K> || std::is_same_v<Q, FastQ3_K> ||
                             std::is_same_v<Q, FastIQ4_XS> || std::is_same_v<Q, FastQ4_1> ||
                             std::is_same_v<Q, FastQ5_1> || std::is_same_v<Q, FastQ5_0> ||
                             std::is_same_v<Q, FastIQ4_NL>;

/// Whether Q has decode_in_block (its decode reads past the block).
template <class Q, class = void>
struct HasDecodeInBlock : std::false_type {};
template <class Q>
struct HasDecodeInBlock<Q, std::void_t<decltype(Q::decode_in_block(nullptr, 0))>> : std::true_type {};

/// A unit decoded from global memory: the format's decode_in_block where it has one.
template <class Q>
__device__ __forceinline__ typename Q::Unit direct_decode(const uint8_t* block, int part) {
  if constexpr (HasDecodeInBlock<Q>::value) return Q::decode_in_block(block, part);
  else return Q::decode(block, part);
}

// Tiles of kRows output rows (glu: kRows gate + kRows up), one per warp, for the kDirectUnit formats:
// lane l of a step takes unit l of the step's 32 of each row (4 blocks of 8 units), decodes it with the
// pipeline's Q::decode straight from global memory and takes its dot against the unit's 32 activation
// codes as mat_vec_fast_q_kernel does (the same arithmetic, so the same sums per unit), with no shared
// memory, no bulk copies and no block barrier; shuffles reduce the tile's sums. The tile's kLoad units
// decode before the first use (their loads in flight together), and the first step's before the wait.
template <class Q, int kCols, bool kGlu, int kRows>
__global__ void __launch_bounds__(kThreads, direct_blocks_per_sm<kCols>())
    mat_vec_direct_unit_kernel(const __grid_constant__ FastArgs args, ActFastLayout<Q> act, int64_t k, int ncols) {
  // pdl_wait later: the first step's weight loads (no earlier kernel's output) go out before it
  constexpr int kLoad = kGlu ? 2 * kRows : kRows;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n_units = k / kFastUnit, scales_per_row = k / Q::kActScaleBlock;
  int64_t t;
  const uint8_t* rows[kLoad];
  const TileAt at = warp_tile<kRows, kGlu>(args, t, rows);
  bool waited = false;  // the weights are no earlier kernel's output: the first loads go out before the wait
  float acc[kLoad][kCols] = {};
#pragma unroll 1
  for (int64_t u = lane; u < n_units; u += kWarpSize) {
    const int64_t blk = u / Q::kUnitsPerBlock;
    const int part = static_cast<int>(u % Q::kUnitsPerBlock);
    typename Q::Unit w[kLoad];
#pragma unroll
    for (int l = 0; l < kLoad; ++l) w[l] = direct_decode<Q>(rows[l] + blk * Q::kBytes, part);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    unit_dot_columns<Q, kCols, kLoad>(w, act, k, n_units, scales_per_row, u, ncols, at.z, acc);
  }
  if (!waited) pdl_wait();
  warp_reduce_store<kRows, kCols, kGlu>(acc, args, at, t, lane, ncols);
}

// ---- launchers -------------------------------------------------------------------------------------

/// LOOM_MV_TILE_ROWS: the direct kernels' tile height (4 or 2 rows; gated products half of it) instead
/// of the one chosen by the grid's size; 0 when unset.
int forced_tile_rows() {
  static const int rows = [] {
    const char* v = std::getenv("LOOM_MV_TILE_ROWS");
    const int r = v ? std::atoi(v) : 0;
    return r == 4 || r == 2 ? r : 0;
  }();
  return rows;
}

/// The formats with a direct kernel and the multiple of it their rows' lengths must be: whole 8-block
/// groups of q4_0 and q8_0 (256) and of q6_K (2048), whole blocks of q4_K, q5_K and the kDirectUnit formats
/// (256); 0: none. Rows that
/// mat_vec_fast_supports takes always are (their bytes a multiple of 16: 18 n, 34 n and 210 n only for
/// n a multiple of 8, 144 n and 176 n for any n); a row that is not would take the pipeline.
template <class Q>
constexpr int64_t direct_row_multiple() {
  if constexpr (std::is_same_v<Q, FastQ4_K> || std::is_same_v<Q, FastQ5_K>) return 256;
  if constexpr (std::is_same_v<Q, FastQ4_0> || std::is_same_v<Q, FastQ8_0>) return 8 * 32;
  if constexpr (std::is_same_v<Q, FastQ6_K>) return DirectQ6_K::kGroupBlocks * 256;
  if constexpr (kDirectUnit<Q>) return 256;
  return 0;
}

/// q6_K's direct kernel's rows at most (launch_q_cols).
constexpr int64_t kQ6DirectMaxRows = 16384;

/// The direct kernels (q4_K, q4_0, q8_0, q2_K, q3_K, q4_1, q5_0, q5_1, iq4_nl at 1-2 columns; q5_K, q6_K, iq4_xs at
/// one), unless LOOM_MV_DIRECT=0 asks for the shared-memory pipeline instead (to compare).
bool direct_mat_vec_enabled() {
  static const bool on = env_switch("LOOM_MV_DIRECT");
  return on;
}

/// Whether the direct q4_K kernel prefetches its next step into registers (LOOM_MV_PREFETCH=0: not).
bool direct_prefetch_enabled() {
  static const bool on = env_switch("LOOM_MV_PREFETCH");
  return on;
}

// A launch's products: `mms` (1-3 mul_mats of one activation; with glu the gate and up products) and
// where the single product's output goes (dst: mul_mat or the fused add; glu: the glu node).
struct FastLaunch {
  const Tensor* const* mms;
  int count;
  const Tensor* glu;
  const Tensor* dst;
  const float* bias;
};

/// The launch's tiles of `rows` output rows: parts own consecutive ranges (unused parts start at
/// INT64_MAX); the glu's up weights are read with the gate's tiles.
FastArgs args_of(const FastLaunch& l, int rows) {
  FastArgs args{};
  const Tensor* dst0 = l.mms[0];
  args.batches = std::max<int64_t>(dst0->ne[2] * dst0->ne[3], 1);
  args.ne2 = std::max<int64_t>(dst0->ne[2], 1);
  args.bias = l.bias;
  args.swiglu = l.glu && l.glu->op == OpKind::swiglu;
  int64_t tiles = 0;
  for (int t = 0; t < kFastMaxParts; ++t) {
    FastPart& p = args.part[t];
    p.first_tile = INT64_MAX;
    p.r2 = p.r3 = 1;
    if (t >= l.count) continue;
    const Tensor* w = l.mms[t]->src[0];
    const Tensor* x = l.mms[t]->src[1];
    p.dst = desc_of(l.mms[t]);
    p.w = desc_of(w);
    p.r2 = x->ne[2] / w->ne[2];
    p.r3 = x->ne[3] / w->ne[3];
    p.row_tiles = (l.mms[t]->ne[0] + rows - 1) / rows;
    if (l.glu && t > 0) continue;
    p.first_tile = tiles;
    tiles += p.row_tiles * args.batches;
  }
  args.tiles = tiles;
  // the output written: the fused node's where there is one (same shape as the product's)
  if (l.glu) args.part[0].dst = desc_of(l.glu);
  else if (l.count == 1) args.part[0].dst = desc_of(l.dst);
  return args;
}

/// The float kernel over columns col0 .. col0 + ncols - 1 (ncols <= kCols; -1: all of b's).
template <class F, int kCols, bool kGlu>
CudaError launch_float_cols(const LaunchContext& ctx, const FastLaunch& l, int64_t col0 = 0, int64_t ncols = -1) {
  constexpr int kRows = float_rows<kCols, kGlu>();
  FastArgs args = args_of(l, kRows);
  if (args.tiles == 0) return {};
  const Tensor* b = l.mms[0]->src[1];
  TensorDesc bd = desc_of(b);
  bd.data += col0 * static_cast<int64_t>(b->nb[1]);
  for (FastPart& part : args.part)
    if (part.dst.data) part.dst.data += col0 * part.dst.nb[1];
  const auto grid = static_cast<unsigned>(std::min<int64_t>(args.tiles, int64_t{1} << 30));
  // the first weights before the wait only where no kernel of the step writes them (read_before_wait:
  // a model's weights; a product of a graph's own output, possible through the C API, waits first)
  static const bool early_on = env_switch("LOOM_MV_FLOAT_EARLY");  // 0: the wait first, for comparisons
  bool early = early_on;
  for (int t = 0; t < l.count; ++t) early = early && read_before_wait(l.mms[t]->src[0]->root());
  mat_vec_fast_float_kernel<F, kCols, kGlu><<<grid, kThreads, 0, ctx.stream>>>(
      args, bd, static_cast<int>(ncols < 0 ? b->ne[1] : ncols), early);
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_fast_float_kernel");
  return {};
}

/// Batch-invariant fast numerics (batch_invariant()): every column count through the 8-column kernel, in
/// launches of 8 columns, so that a column's sums (its threads' order, the 8-column reduction tree) are the
/// same whatever the other columns. Slower at one column (8 accumulators a row) and far slower for a
/// prompt (the weights read once per 8 columns, where cuBLAS reads them once): the price of the mode.
template <class F, bool kGlu>
CudaError launch_float_invariant(const LaunchContext& ctx, const FastLaunch& l) {
  const int64_t n = l.mms[0]->src[1]->ne[1];
  for (int64_t c = 0; c < n; c += kMatVecMaxCols)
    if (CudaError e = launch_float_cols<F, kMatVecMaxCols, kGlu>(ctx, l, c, std::min<int64_t>(kMatVecMaxCols, n - c));
        !e.ok())
      return e;
  return {};
}

/// A direct kernel's launch: a warp per tile of kRows output rows (glu: kRows of gate and of up).
template <class Q, int kCols, bool kGlu, int kRows>
CudaError launch_direct(const LaunchContext& ctx, const FastLaunch& l, const ActFastLayout<Q>& act) {
  const FastArgs args = args_of(l, kRows);
  const Tensor* b = l.mms[0]->src[1];
  const int64_t blocks = (args.tiles + kWarps - 1) / kWarps;
  if (blocks > int64_t{1} << 31)
    return CudaError::runtime(cudaErrorInvalidValue, "mat_vec_fast: too many rows", __FILE__, __LINE__);
  if constexpr (std::is_same_v<Q, FastQ4_K> || std::is_same_v<Q, FastQ5_K>) {
    constexpr int kLoad = kGlu ? 2 * kRows : kRows;
    constexpr bool kQ5 = std::is_same_v<Q, FastQ5_K>;
    const bool prefetch = direct_prefetch_enabled() && (kLoad <= 2 || b->ne[0] >= 8192);
    // q5_K's 4-row tiles prefetched spill (ptxas: 372-392 bytes at one column): not instantiated
    constexpr bool kCanPrefetch = !kQ5 || kLoad <= 2;
    auto kernel = mat_vec_direct_q4k_kernel<kCols, kGlu, kRows, false, kQ5>;
    if constexpr (kCanPrefetch)
      if (prefetch) kernel = mat_vec_direct_q4k_kernel<kCols, kGlu, kRows, true, kQ5>;
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(args, act, b->ne[0],
                                                                       static_cast<int>(b->ne[1]));
    LOOM_CUDA_CHECK_LAUNCH("mat_vec_direct_q4k_kernel");
  } else if constexpr (kDirectUnit<Q>) {
    mat_vec_direct_unit_kernel<Q, kCols, kGlu, kRows><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
        args, act, b->ne[0], static_cast<int>(b->ne[1]));
    LOOM_CUDA_CHECK_LAUNCH("mat_vec_direct_unit_kernel");
  } else if constexpr (std::is_same_v<Q, FastQ6_K>) {
    mat_vec_direct_q6k_kernel<kCols, kGlu, kRows><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
        args, act, b->ne[0], static_cast<int>(b->ne[1]));
    LOOM_CUDA_CHECK_LAUNCH("mat_vec_direct_q6k_kernel");
  } else {
    using F = std::conditional_t<std::is_same_v<Q, FastQ4_0>, DirectQ4_0, DirectQ8_0>;
    mat_vec_direct_a2_kernel<F, kCols, kGlu, kRows><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
        args, act, b->ne[0], static_cast<int>(b->ne[1]));
    LOOM_CUDA_CHECK_LAUNCH("mat_vec_direct_a2_kernel");
  }
  return {};
}

template <class Q, int kCols, bool kGlu>
CudaError launch_q_cols(const LaunchContext& ctx, const FastLaunch& l) {
  constexpr int kRows = fast_rows<kGlu>();
  const FastArgs args = args_of(l, kRows);
  if (args.tiles == 0) return {};
  const Tensor* b = l.mms[0]->src[1];
  // quantized by the dispatch that produced b (ctx.act_in: b's own bytes hold them), else by quant_mat_vec
  const auto act = ActFastLayout<Q>::at(ctx.act_in ? b->data : ctx.scratch, b->nrows(), b->ne[0]);
  // the direct kernels at 1-2 columns; at 4 and 8 the pipeline was faster (ncu, q4_0 4 columns: 43% of
  // DRAM peak against 41%; q4_K 8 columns: 23% against 20%)
  // q6_K's direct kernel only at one column and up to kQ6DirectMaxRows rows (ncu, H200, direct against
  // the pipeline: 4096x4096 9.5 / 10.1 us, 4096 rows of 14336 21.3 / 21.4, but the 128256-row output
  // layer 169.5 / 149.5 and two columns 11.7 / 10.1)
  // q5_K's only at one column too (op-test perf, H200, direct against the pipeline: one column 4096x4096
  // 13.5 / 14.5 us, 4096 rows of 14336 19.0 / 22.8-24.8, 14336 of 4096 19.8 / 22.8; two columns 15.9 /
  // 15.4, 29.4 / 27.0-27.8, 23.4 / 27.1); iq4_xs's as well (two columns 4096x4096 16.7 / 16.3 us, where one
  // column gains 10-13% and q2_K / q3_K gain at two as at one: docs/PERFORMANCE.md, stop 44)
  constexpr bool kQ6 = std::is_same_v<Q, FastQ6_K>;
  constexpr bool kOneColumn = kQ6 || std::is_same_v<Q, FastQ5_K> || std::is_same_v<Q, FastIQ4_XS>;
  if constexpr (direct_row_multiple<Q>() > 0 && kCols <= (kOneColumn ? 1 : 2)) {
    if (direct_mat_vec_enabled() && b->ne[0] % direct_row_multiple<Q>() == 0 &&
        (!kQ6 || args.tiles * kRows <= kQ6DirectMaxRows)) {
      // half-height tiles where full ones would give the SMs fewer than 16 warps (the 4096-row products of
      // an 8B model: its FFN down projection ran at 42% of DRAM peak on 7.75 warps per SM). Single rows
      // were no faster (q4_0 4096x4096, H100: 4 / 2 / 1 rows 35 / 39 / 36% of DRAM peak; 1B decode the
      // same). LOOM_MV_TILE_ROWS=4 or 2 forces the height, for tests and comparisons.
      const int64_t min_warps = 16 * static_cast<int64_t>(std::max(ctx.sm_count, 1));
      const int forced = forced_tile_rows();
      const bool full = forced ? forced == 4 : args.tiles >= min_warps;
      return full ? launch_direct<Q, kCols, kGlu, kRows>(ctx, l, act)
                  : launch_direct<Q, kCols, kGlu, kRows / 2>(ctx, l, act);
    }
  }
  // about one wave: every block walks tiles with its copies in flight across them
  const int64_t wave = static_cast<int64_t>(std::max(ctx.sm_count, 1)) * quant_blocks_per_sm<Q, kCols>();
  const auto grid = static_cast<unsigned>(std::min<int64_t>(args.tiles, wave));
  mat_vec_fast_q_kernel<Q, kCols, kGlu><<<grid, kThreads, 0, ctx.stream>>>(
      args, act, b->ne[0], static_cast<int>(b->ne[1]));
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_fast_q_kernel");
  return {};
}

// The kernel for ncols columns: 1, 2, 4 or 8 (3 runs the 4-column kernel with one column idle).
template <template <int, bool> class Launch, bool kGlu>
CudaError by_columns(const LaunchContext& ctx, const FastLaunch& l) {
  const int64_t n = l.mms[0]->ne[1];
  if (n <= 1) return Launch<1, kGlu>::run(ctx, l);
  if (n <= 2) return Launch<2, kGlu>::run(ctx, l);
  if (n <= 4) return Launch<4, kGlu>::run(ctx, l);
  return Launch<8, kGlu>::run(ctx, l);
}

template <class F>
struct FloatLaunch {
  template <int kCols, bool kGlu>
  struct With {
    static CudaError run(const LaunchContext& ctx, const FastLaunch& l) {
      return launch_float_cols<F, kCols, kGlu>(ctx, l);
    }
  };
};

template <class Q>
struct QuantLaunch {
  template <int kCols, bool kGlu>
  struct With {
    static CudaError run(const LaunchContext& ctx, const FastLaunch& l) { return launch_q_cols<Q, kCols, kGlu>(ctx, l); }
  };
};

template <class F>
CudaError float_mat_vec(const LaunchContext& ctx, const FastLaunch& l) {
  if (batch_invariant())
    return l.glu ? launch_float_invariant<F, true>(ctx, l) : launch_float_invariant<F, false>(ctx, l);
  return l.glu ? by_columns<FloatLaunch<F>::template With, true>(ctx, l)
               : by_columns<FloatLaunch<F>::template With, false>(ctx, l);
}

/// The launch's shared activation quantized once for every product into Q's layout in the scratch,
/// unless the dispatch that produced it wrote that layout itself (ctx.act_in).
template <class Q>
CudaError quantize_shared_act(const LaunchContext& ctx, const FastLaunch& l) {
  const Tensor* b = l.mms[0]->src[1];
  const int64_t blocks = b->nrows() * (b->ne[0] / Q::kActScaleBlock);
  static const bool no_quantize = ablated_kernel("quantize_act");  // timing only
  if (blocks > 0 && !ctx.act_in && !no_quantize) {
    constexpr int kQuantThreads = 256;
    quantize_act_fast_kernel<Q><<<grid_for(blocks * kWarpSize, kQuantThreads), kQuantThreads, 0, ctx.stream>>>(
        ActFastLayout<Q>::at(ctx.scratch, b->nrows(), b->ne[0]), desc_of(b));
    LOOM_CUDA_CHECK_LAUNCH("quantize_act_fast_kernel");
  }
  return {};
}

template <class Q>
CudaError quant_mat_vec(const LaunchContext& ctx, const FastLaunch& l) {
  if (CudaError e = quantize_shared_act<Q>(ctx, l); !e.ok()) return e;
  return l.glu ? by_columns<QuantLaunch<Q>::template With, true>(ctx, l)
               : by_columns<QuantLaunch<Q>::template With, false>(ctx, l);
}

/// LOOM_CUDA_MIXED_MULTI=0 (read once) leaves a Q4_K_M file's q6_K V out of the Q/K launch at one column
/// (a launch of its own, as before), for comparisons.
bool mixed_multi_enabled() {
  static const bool on = env_switch("LOOM_CUDA_MIXED_MULTI");
  return on;
}

template <int kRows, bool kPrefetch>
CudaError launch_mixed(const LaunchContext& ctx, const FastLaunch& l, const ActFastLayout<FastQ4_K>& act, int64_t k) {
  FastArgs args = args_of(l, kRows);
  for (int t = 0; t < l.count; ++t)
    if (l.mms[t]->src[0]->type == DType::q6_k) args.q6_parts |= 1u << t;
  const int64_t blocks = (args.tiles + kWarps - 1) / kWarps;
  if (blocks > int64_t{1} << 31)
    return CudaError::runtime(cudaErrorInvalidValue, "mat_vec_multi: too many rows", __FILE__, __LINE__);
  mat_vec_direct_q4k_q6k_kernel<kRows, kPrefetch>
      <<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(args, act, k);
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_direct_q4k_q6k_kernel");
  return {};
}

CudaError launch_fast(const LaunchContext& ctx, const FastLaunch& l) {
  const CudaError none =
      CudaError::runtime(cudaErrorInvalidValue, "mat_vec_fast: unsupported weight type", __FILE__, __LINE__);
  return visit_weight_type(
      l.mms[0]->src[0]->type, none, [&](auto f) { return float_mat_vec<decltype(f)>(ctx, l); },
      [&](auto q) { return quant_mat_vec<typename decltype(q)::Fast>(ctx, l); });
}

size_t act_fast_bytes(DType weight, const Tensor* b) {
  const int64_t rows = b->nrows(), k = b->ne[0];
  return visit_quant_type(weight, size_t{0},
                          [&](auto q) { return ActFastLayout<typename decltype(q)::Fast>::bytes(rows, k); });
}

}  // namespace

int mat_vec_fast_act_block(const Tensor* mm, const Tensor* dst) {
  const Tensor* a = mm->src[0];
  if (dst->ne[1] > kMatVecMaxCols || dst->ne[1] < 1 || !dtype_is_quantized(a->type)) return 0;
  // rows are bulk-copied: 16-byte aligned, a multiple of 16 bytes (k a multiple of 256 for every
  // format: all the usual shapes; others, such as an mxfp4 row of an odd number of blocks, take
  // the exact kernels)
  // (k = 0 has no stage to write its outputs from: the exact kernels write the zeros)
  if (!(a->ne[0] > 0 && aligned16(a->data) && a->nb[1] % 16 == 0 && a->nb[2] % 16 == 0 && a->nb[3] % 16 == 0 &&
        dtype_row_size(a->type, a->ne[0]) % 16 == 0))
    return 0;
  return visit_quant_type(a->type, 0, [&](auto q) { return decltype(q)::Fast::kActScaleBlock; });
}

bool mat_vec_fast_supports(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst) {
  const Tensor* a = mm->src[0];
  const Tensor* b = mm->src[1];
  if (dst->ne[1] < 1) return false;
  switch (a->type) {
    case DType::f32:
    case DType::f16:
    case DType::bf16: {
      // batch-invariant: every column count (launch_float_invariant's launches of 8 columns)
      if (dst->ne[1] > kMatVecMaxCols && !batch_invariant()) return false;
      const int64_t elems = a->type == DType::f32 ? 4 : 8;  // per 16 bytes
      const bool rows_aligned =
          a->ne[0] % elems == 0 && aligned16(a->data) && a->nb[1] % 16 == 0 && a->nb[2] % 16 == 0 && a->nb[3] % 16 == 0;
      const bool cols_aligned = b->nb[0] == sizeof(float) && aligned16(b->data) &&
                                (b->ne[1] == 1 || b->nb[1] % 16 == 0) && (b->ne[2] == 1 || b->nb[2] % 16 == 0) &&
                                (b->ne[3] == 1 || b->nb[3] % 16 == 0);
      return rows_aligned && cols_aligned;
    }
    default:
      // the scratch is reserved for the exact mode's blocks, which the fast layout never outgrows;
      // activations their producer quantized (ctx.act_in) need none
      return mat_vec_fast_act_block(mm, dst) > 0 &&
             (ctx.act_in || (aligned16(ctx.scratch) && ctx.scratch_size >= act_fast_bytes(a->type, b)));
  }
}

CudaError launch_mat_vec_fast(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  const Tensor* mms[1] = {mm};
  return launch_fast(ctx, FastLaunch{mms, 1, nullptr, dst, bias});
}

bool mat_vec_fast_mixed_ok(const Tensor* const* mms, int count) {
  if (count < 2 || !direct_mat_vec_enabled() || !mixed_multi_enabled()) return false;
  const Tensor* x = mms[0]->src[1];
  bool q4 = false, q6 = false;
  for (int t = 0; t < count; ++t) {
    const Tensor* mm = mms[t];
    if (!mm || mm->op != OpKind::mul_mat) return false;
    const Tensor* w = mm->src[0];
    if (!w || !x || mm->src[1] != x || mm->type != DType::f32) return false;
    if (w->type == DType::q4_k) q4 = true;
    else if (w->type == DType::q6_k) q6 = true;
    else return false;
    // one column of one batch, whole 8-block groups of q6_K (so whole q4_K blocks), rows that the direct
    // kernels read (mat_vec_fast_act_block: 16-byte aligned rows), q6_K's direct row limit
    if (x->ne[1] != 1 || x->ne[2] != 1 || x->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[0] != x->ne[0])
      return false;
    if (w->ne[0] % direct_row_multiple<FastQ6_K>() != 0 || mat_vec_fast_act_block(mm, mm) != 256) return false;
    if (w->type == DType::q6_k && w->ne[1] > kQ6DirectMaxRows) return false;
  }
  return q4 && q6;
}

CudaError launch_mat_vec_fast_mixed(const LaunchContext& ctx, const Tensor* const* mms, int count) {
  const FastLaunch l{mms, count, nullptr, mms[0], nullptr};
  const Tensor* b = mms[0]->src[1];
  const int64_t k = b->ne[0];
  if (!ctx.act_in && !(aligned16(ctx.scratch) && ctx.scratch_size >= ActFastLayout<FastQ4_K>::bytes(b->nrows(), k)))
    return CudaError::runtime(cudaErrorInvalidValue, "mat_vec_multi: no scratch for the quantized activations",
                              __FILE__, __LINE__);
  // the 256-block layout with the sums (q4_K's), which the q6_K tiles read without the sums
  if (CudaError e = quantize_shared_act<FastQ4_K>(ctx, l); !e.ok()) return e;
  const auto act = ActFastLayout<FastQ4_K>::at(ctx.act_in ? b->data : ctx.scratch, b->nrows(), k);
  // the tile height and prefetch as launch_q_cols and launch_direct choose them for q4_K
  const int64_t min_warps = 16 * static_cast<int64_t>(std::max(ctx.sm_count, 1));
  const int forced = forced_tile_rows();
  const bool full = forced ? forced == 4 : args_of(l, 4).tiles >= min_warps;
  const bool prefetch = direct_prefetch_enabled();
  if (full) return prefetch && k >= 8192 ? launch_mixed<4, true>(ctx, l, act, k) : launch_mixed<4, false>(ctx, l, act, k);
  return prefetch ? launch_mixed<2, true>(ctx, l, act, k) : launch_mixed<2, false>(ctx, l, act, k);
}

bool mat_vec_fast_supports_multi(const LaunchContext& ctx, const Tensor* const* mms, int count) {
  for (int t = 0; t < count; ++t)  // one launch decodes one weight type
    if (!mat_vec_fast_supports(ctx, mms[t], mms[t]) || mms[t]->src[0]->type != mms[0]->src[0]->type) return false;
  return true;
}

CudaError launch_mat_vec_fast_multi(const LaunchContext& ctx, const Tensor* const* mms, int count) {
  return launch_fast(ctx, FastLaunch{mms, count, nullptr, mms[0], nullptr});
}

CudaError launch_mat_vec_fast_glu(const LaunchContext& ctx, const Tensor* gate, const Tensor* up,
                                  const Tensor* glu) {
  const Tensor* mms[2] = {gate, up};
  return launch_fast(ctx, FastLaunch{mms, 2, glu, glu, nullptr});
}

}  // namespace loom::cuda
