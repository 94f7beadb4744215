// The fast numerics mode's mat-vec: dst = w x b for 1..kMatVecMaxCols columns (decode, and small
// batches of tokens), f32/f16/bf16 and every quantized format's weights (quant_dispatch.cuh), float
// accumulation.
//
// Why not the exact kernels: they give each warp one row and sum block terms in double, and reach
// 25-40% of the H200's 4,350 GB/s read bandwidth (4096x4096 at n = 1: f16 1.68 TB/s, q4_0 674 GB/s,
// q4_K 565 GB/s). A mat-vec is bound by memory-level parallelism: the SMs must keep ~3 MB of loads
// in flight (4.35 TB/s x ~700 ns), ~23 KB per SM, in wide coalesced requests.
//
// Design (both paths): a block of kThreads = 128 threads owns kRows consecutive rows (1 for one or
// two columns, kCols / 2 for 4 or 8) and every column; its threads split each row's k between them
// (several warps per row), each thread doing the same k range for all kRows rows, so that the
// activations it loads serve kRows rows. At 8 columns the activation traffic through L1 is the
// limit, not the weights: per weight byte, int8 activations cost (elements per byte) x columns /
// kRows bytes of L1 reads, 1.78 x 8 / 4 = 3.6 for q4_0 (~53 B/clk/SM at 90% of HBM bandwidth,
// against L1's 128), f32 activations of f16 weights 2 x 8 / 4 = 4 (~60 B/clk/SM). Partial sums are
// reduced over each warp by a transposing butterfly (31 shuffles for 32 values), then over the 4
// warps through shared memory in a fixed order: deterministic, no atomics.
//
// Float weights (f32/f16/bf16): each thread loads 16 bytes of weights per row per step straight into
// registers (the warp reads 512 contiguous bytes of a row), kUnroll = 4 / kRows steps issued before
// the first use: 4 x 16 bytes in flight per thread, 8 KB per block; at 16 blocks per SM (1 and 2
// columns) that is 128 KB per SM, at ~5 blocks (8 columns, ~100 registers) 40 KB.
//
// Quantized weights: activations are first quantized to int8 (mat_vec_fast_formats.cuh: a float scale
// per 32 for q8_0/q4_0, per 256 for the K-quants); the weight rows, whose blocks are only 2-byte
// aligned (34, 18, 210 bytes), are copied 16 bytes per thread with cp.async into shared memory, two
// stages deep, a stage being 128 units of 32 weights per row (4096 weights: 2304 bytes of q4_0/q4_K,
// 4352 of q8_0, 3360 of q6_K); each thread then decodes its unit of every row from shared memory
// and takes dp4a sums against its 32 activation codes (two 16-byte loads per column), scaled in
// float. Bytes in flight: a stage of kRows rows, 2.3-17 KB per block; ~16 blocks per SM at 1 column,
// ~6 at 8 (shared memory: 35 KB per block for q8_0), 35-100 KB per SM.
//
// Bytes model per call: m x row_bytes of weights (read once) + n columns of activations (f32, or
// int8 after a quantization kernel that reads them once: ~1.1 k n bytes, L2-resident for every
// block) + 4 m n bytes of output. Predicted: ~85-90% of 4,350 GB/s on the large shapes (14336x4096,
// 4096x14336, 128256x4096) for n = 1..4 and every type; at n = 8 the q4_0/q4_K dp4a count (8 per 32
// weights per column, plus float scaling) keeps the SM's integer pipe ~80% busy at 90% bandwidth,
// so those may land at 75-85%. Small matrices (4096x4096 q4_0 is 9.4 MB, ~2 us) are bounded by
// launch and the tail of the grid, not bandwidth. Not measured yet.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "mat_vec.cuh"
#include "mat_vec_fast.cuh"
#include "mat_vec_fast_formats.cuh"
#include "quant.cuh"
#include "quant_dispatch.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
/// Quantized units (32 weights) of a row per pipeline stage: one per thread.
constexpr int kUnitsPerStage = kThreads;
constexpr unsigned kMaxGridY = 65535;

/// Rows per block for kCols columns: enough that the activations a thread loads serve several rows
/// (L1 traffic above), few enough that small matrices still give every SM blocks.
template <int kCols>
__host__ __device__ constexpr int rows_per_block() {
  return kCols <= 2 ? 1 : kCols / 2;
}

/// Blocks per SM the register budget must allow (__launch_bounds__), from ptxas -v: the quantized
/// kernels take ~40 registers at 1-2 columns (12 blocks: 48 warps) and ~80 at 4; at 8 the compiler
/// hoists every column's activation loads and takes 168 (3 blocks per SM), and a cap of 128 spilled
/// 12-76 bytes, so 8 columns keep 3. The float kernels spilled under a 40-register cap at 1-2 columns.
template <int kCols, bool kQuantized>
__host__ __device__ constexpr int min_blocks_per_sm() {
  if (kCols <= 2) return kQuantized ? 12 : 8;
  return kCols <= 4 ? 6 : (kQuantized ? 3 : 4);
}

/// The quantized kernels' blocks per SM for format Q: formats whose decode needs more registers
/// (FastQ2_K, FastQ3_K: kWideDecode) spilled 16-48 bytes at 1-4 columns under the default budget
/// (ptxas -v, sm_90), so they take 10 blocks instead of 12 at 1-2 columns and 5 instead of 6 at 4.
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
  if constexpr (WideDecode<Q>::value && kCols <= 4) return kCols <= 2 ? 10 : 5;
  return base;
}

// ---- asynchronous copies to shared memory (sm_80+) -------------------------------------------------

/// Copies the first src_bytes (1..16) of the 16 bytes at gmem (16-byte aligned) to smem and zeroes
/// the rest, without passing through registers or L1.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const auto g = __cvta_generic_to_global(gmem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

/// Sums acc over the block and writes dst[i0 + r, c, i2, i3] (+ bias) for valid rows and columns.
/// `partial` is the block's shared scratch; the caller synchronizes before reusing it.
template <int kRows, int kCols, bool kBias>
__device__ __forceinline__ void reduce_and_store(float (&acc)[kRows][kCols], float (*partial)[kRows * kCols],
                                                 const TensorDesc& dst, int64_t i0, int ncols, int64_t i2,
                                                 int64_t i3, const float* bias) {
  constexpr int V = kRows * kCols, kLanesPerValue = kWarpSize / V;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  float v[V];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) v[r * kCols + c] = acc[r][c];
  const float total = warp_sum_many(v, lane);
  if (lane % kLanesPerValue == 0) partial[warp][lane / kLanesPerValue] = total;
  __syncthreads();
  if (tid < V) {
    const int r = tid / kCols, c = tid % kCols;
    const int64_t i = i0 + r;
    if (c < ncols && i < dst.ne[0]) {
      float sum = partial[0][tid];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) sum += partial[w][tid];
      if constexpr (kBias) sum += bias[i];
      *reinterpret_cast<float*>(element_ptr(dst, i, c, i2, i3)) = sum;
    }
  }
}

// ---- float weights ---------------------------------------------------------------------------------

// Rows [blockIdx.x * kRows, + kRows) of every column (ncols = dst.ne[1] <= kCols) and batch; b's
// columns contiguous and 16-byte aligned, the weight rows 16-byte aligned (mat_vec_fast_supports).
template <class F, int kCols, bool kBias>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<kCols, false>()) mat_vec_fast_float_kernel(TensorDesc dst, TensorDesc a, TensorDesc b,
                                                                      int64_t r2, int64_t r3, const float* bias) {
  pdl_wait();
  constexpr int kRows = rows_per_block<kCols>();
  constexpr int kElems = WideWeights<F>::kElems;
  constexpr int kUnroll = kRows >= 4 ? 1 : 4 / kRows;
  __shared__ float partial[kWarps][kRows * kCols];
  const int tid = threadIdx.x;
  const int64_t m = dst.ne[0], n_vec = a.ne[0] / kElems, batches = dst.ne[2] * dst.ne[3];
  const int ncols = static_cast<int>(dst.ne[1]);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kRows;
  for (int64_t z = blockIdx.y; z < batches; z += gridDim.y) {
    const int64_t i2 = z % dst.ne[2], i3 = z / dst.ne[2];
    const uint4* rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)  // rows past the end repeat the last one; their sums are dropped
      rows[r] = reinterpret_cast<const uint4*>(row_ptr(a, i0 + r < m ? i0 + r : m - 1, i2 / r2, i3 / r3));
    const char* b_batch = b.data + i2 * b.nb[2] + i3 * b.nb[3];
    float acc[kRows][kCols] = {};
    for (int64_t v = tid; v < n_vec; v += static_cast<int64_t>(kThreads) * kUnroll) {
      uint4 q[kUnroll][kRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          q[u][r] = v + u * kThreads < n_vec ? __ldg(rows[r] + v + u * kThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t vu = v + u * kThreads;
        if (vu >= n_vec) break;
        float w[kRows][kElems];
#pragma unroll
        for (int r = 0; r < kRows; ++r) WideWeights<F>::unpack(q[u][r], w[r]);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if (c >= ncols) break;
          const auto* x = reinterpret_cast<const float4*>(b_batch + c * b.nb[1]) + vu * (kElems / 4);
#pragma unroll
          for (int h = 0; h < kElems / 4; ++h) {
            const float4 xv = __ldg(x + h);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              acc[r][c] = fmaf(w[r][4 * h], xv.x, acc[r][c]);
              acc[r][c] = fmaf(w[r][4 * h + 1], xv.y, acc[r][c]);
              acc[r][c] = fmaf(w[r][4 * h + 2], xv.z, acc[r][c]);
              acc[r][c] = fmaf(w[r][4 * h + 3], xv.w, acc[r][c]);
            }
          }
        }
      }
    }
    reduce_and_store<kRows, kCols, kBias>(acc, partial, dst, i0, ncols, i2, i3, bias);
  }
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
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int codes[kPerLane];
    int sum = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      codes[e] = max(-127, min(127, __float2int_rn(x[e] * id)));
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

// Rows [blockIdx.x * kRows, + kRows) of every column (ncols = dst.ne[1] <= kCols) and batch, against
// the activations quantized in act (column j of batch z at row j + ncols * z).
template <class Q, int kCols, bool kBias>
__global__ void __launch_bounds__(kThreads, quant_blocks_per_sm<Q, kCols>())
    mat_vec_fast_q_kernel(TensorDesc dst, TensorDesc a, ActFastLayout<Q> act, int64_t r2, int64_t r3,
                          const float* bias) {
  pdl_wait();
  constexpr int kRows = rows_per_block<kCols>();
  constexpr int kStageBytes = kUnitsPerStage / Q::kUnitsPerBlock * Q::kBytes;  // of one row
  static_assert(kStageBytes % 16 == 0, "stages start on 16-byte boundaries of a row");
  // a row starting off a 16-byte boundary takes one more chunk; load_words_a2 reads a word ahead
  constexpr int kRowBuf = kStageBytes + 32;
  __shared__ __align__(16) uint8_t stage[2][kRows][kRowBuf];
  __shared__ float partial[kWarps][kRows * kCols];

  const int tid = threadIdx.x;
  const int64_t m = dst.ne[0], k = a.ne[0], n = dst.ne[1], batches = dst.ne[2] * dst.ne[3];
  const int ncols = static_cast<int>(n);
  const int64_t n_units = k / kFastUnit, row_bytes = k / Q::kBlock * Q::kBytes;
  const int64_t scales_per_row = k / Q::kActScaleBlock;
  const int n_stages = static_cast<int>((n_units + kUnitsPerStage - 1) / kUnitsPerStage);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kRows;

  for (int64_t z = blockIdx.y; z < batches; z += gridDim.y) {
    const int64_t i2 = z % dst.ne[2], i3 = z / dst.ne[2];
    const uint8_t* rows[kRows];
    int skew[kRows];  // the row's offset from a 16-byte boundary (even)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      rows[r] = reinterpret_cast<const uint8_t*>(row_ptr(a, i0 + r < m ? i0 + r : m - 1, i2 / r2, i3 / r3));
      skew[r] = static_cast<int>(reinterpret_cast<uintptr_t>(rows[r]) & 15u);
    }
    // Stage s of every row: the 16-byte chunks covering its bytes, from the boundary at or before
    // them (the bytes before the row lie in the same 16 bytes of the allocation); bytes past the
    // row's end are zero-filled, never read from memory.
    auto issue = [&](int s) {
      const int64_t begin = static_cast<int64_t>(s) * kStageBytes;
      const int64_t bytes = row_bytes - begin < kStageBytes ? row_bytes - begin : kStageBytes;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint8_t* first = rows[r] + begin - skew[r];
        const uint8_t* end = rows[r] + row_bytes;
        const int chunks = static_cast<int>((skew[r] + bytes + 15) / 16);
        for (int c = tid; c < chunks; c += kThreads) {
          const uint8_t* src = first + 16 * c;
          const int64_t left = end - src;
          cp_async_16(&stage[s & 1][r][16 * c], src, left < 16 ? static_cast<int>(left) : 16);
        }
      }
      cp_async_commit();
    };

    float acc[kRows][kCols] = {};
    issue(0);
    for (int s = 0; s < n_stages; ++s) {
      if (s + 1 < n_stages) {
        issue(s + 1);
      } else {
        cp_async_commit();  // an empty group keeps the wait below uniform
      }
      cp_async_wait<1>();
      __syncthreads();
      const int64_t u = static_cast<int64_t>(s) * kUnitsPerStage + tid;
      if (u < n_units) {
        const int blk = tid / Q::kUnitsPerBlock, part = tid % Q::kUnitsPerBlock;
        typename Q::Unit w[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) w[r] = Q::decode(&stage[s & 1][r][skew[r] + blk * Q::kBytes], part);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if (c >= ncols) break;
          const int64_t col = c + n * z;
          const auto* xp = reinterpret_cast<const int4*>(act.codes + col * k + u * kFastUnit);
          const int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
          const int x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          const float dx = __ldg(act.scales + col * scales_per_row + u * kFastUnit / Q::kActScaleBlock);
          int xsum = 0;
          if constexpr (Q::kActSums) xsum = __ldg(act.sums + col * n_units + u);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[r][c] += Q::dot(w[r], x, dx, xsum);
        }
      }
      __syncthreads();  // the stage's buffer is refilled two stages on
    }
    reduce_and_store<kRows, kCols, kBias>(acc, partial, dst, i0, ncols, i2, i3, bias);
  }
}

// ---- launchers -------------------------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

dim3 fast_grid(const Tensor* dst, int rows) {
  const int64_t batches = std::max<int64_t>(dst->ne[2] * dst->ne[3], 1);
  return {static_cast<unsigned>((dst->ne[0] + rows - 1) / rows),
          static_cast<unsigned>(std::min<int64_t>(batches, kMaxGridY))};
}

template <class F, int kCols, bool kBias>
CudaError launch_float_cols(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  const Tensor* a = mm->src[0];
  const Tensor* b = mm->src[1];
  mat_vec_fast_float_kernel<F, kCols, kBias><<<fast_grid(dst, rows_per_block<kCols>()), kThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(a), desc_of(b), b->ne[2] / a->ne[2], b->ne[3] / a->ne[3], bias);
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_fast_float_kernel");
  return {};
}

template <class Q, int kCols, bool kBias>
CudaError launch_q_cols(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  const Tensor* a = mm->src[0];
  const Tensor* b = mm->src[1];
  const auto act = ActFastLayout<Q>::at(ctx.scratch, b->nrows(), b->ne[0]);
  mat_vec_fast_q_kernel<Q, kCols, kBias><<<fast_grid(dst, rows_per_block<kCols>()), kThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(a), act, b->ne[2] / a->ne[2], b->ne[3] / a->ne[3], bias);
  LOOM_CUDA_CHECK_LAUNCH("mat_vec_fast_q_kernel");
  return {};
}

// The kernel for ncols columns: 1, 2, 4 or 8 (3 runs the 4-column kernel with one column idle).
template <template <int, bool> class Launch, bool kBias>
CudaError by_columns(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  const int64_t n = dst->ne[1];
  if (n <= 1) return Launch<1, kBias>::run(ctx, mm, dst, bias);
  if (n <= 2) return Launch<2, kBias>::run(ctx, mm, dst, bias);
  if (n <= 4) return Launch<4, kBias>::run(ctx, mm, dst, bias);
  return Launch<8, kBias>::run(ctx, mm, dst, bias);
}

template <class F>
struct FloatLaunch {
  template <int kCols, bool kBias>
  struct With {
    static CudaError run(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
      return launch_float_cols<F, kCols, kBias>(ctx, mm, dst, bias);
    }
  };
};

template <class Q>
struct QuantLaunch {
  template <int kCols, bool kBias>
  struct With {
    static CudaError run(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
      return launch_q_cols<Q, kCols, kBias>(ctx, mm, dst, bias);
    }
  };
};

template <class F>
CudaError float_mat_vec(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  return bias ? by_columns<FloatLaunch<F>::template With, true>(ctx, mm, dst, bias)
              : by_columns<FloatLaunch<F>::template With, false>(ctx, mm, dst, bias);
}

template <class Q>
CudaError quant_mat_vec(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  const Tensor* b = mm->src[1];
  const int64_t blocks = b->nrows() * (b->ne[0] / Q::kActScaleBlock);
  if (blocks > 0) {
    constexpr int kQuantThreads = 256;
    quantize_act_fast_kernel<Q><<<grid_for(blocks * kWarpSize, kQuantThreads), kQuantThreads, 0, ctx.stream>>>(
        ActFastLayout<Q>::at(ctx.scratch, b->nrows(), b->ne[0]), desc_of(b));
    LOOM_CUDA_CHECK_LAUNCH("quantize_act_fast_kernel");
  }
  return bias ? by_columns<QuantLaunch<Q>::template With, true>(ctx, mm, dst, bias)
              : by_columns<QuantLaunch<Q>::template With, false>(ctx, mm, dst, bias);
}

size_t act_fast_bytes(DType weight, const Tensor* b) {
  const int64_t rows = b->nrows(), k = b->ne[0];
  return visit_quant_type(weight, size_t{0},
                          [&](auto q) { return ActFastLayout<typename decltype(q)::Fast>::bytes(rows, k); });
}

}  // namespace

bool mat_vec_fast_supports(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst) {
  const Tensor* a = mm->src[0];
  const Tensor* b = mm->src[1];
  if (dst->ne[1] > kMatVecMaxCols || dst->ne[1] < 1) return false;
  switch (a->type) {
    case DType::f32:
    case DType::f16:
    case DType::bf16: {
      const int64_t elems = a->type == DType::f32 ? 4 : 8;  // per 16 bytes
      const bool rows_aligned =
          a->ne[0] % elems == 0 && aligned16(a->data) && a->nb[1] % 16 == 0 && a->nb[2] % 16 == 0 && a->nb[3] % 16 == 0;
      const bool cols_aligned = b->nb[0] == sizeof(float) && aligned16(b->data) &&
                                (b->ne[1] == 1 || b->nb[1] % 16 == 0) && (b->ne[2] == 1 || b->nb[2] % 16 == 0) &&
                                (b->ne[3] == 1 || b->nb[3] % 16 == 0);
      return rows_aligned && cols_aligned;
    }
    default:
      if (!dtype_is_quantized(a->type)) return false;
      // blocks are read as 16-bit words (mxfp4's, 17 bytes, at any byte: one check for every
      // format, an mxfp4 row of an odd number of blocks stays on the exact kernels); the scratch is
      // reserved for the exact mode's blocks, which the fast layout never outgrows
      return reinterpret_cast<uintptr_t>(a->data) % 2 == 0 && a->nb[1] % 2 == 0 && a->nb[2] % 2 == 0 &&
             a->nb[3] % 2 == 0 && aligned16(ctx.scratch) && ctx.scratch_size >= act_fast_bytes(a->type, b);
  }
}

CudaError launch_mat_vec_fast(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias) {
  switch (mm->src[0]->type) {
    case DType::f32: return float_mat_vec<FormatF32>(ctx, mm, dst, bias);
    case DType::f16: return float_mat_vec<FormatF16>(ctx, mm, dst, bias);
    case DType::bf16: return float_mat_vec<FormatBF16>(ctx, mm, dst, bias);
    default: break;
  }
  const CudaError none =
      CudaError::runtime(cudaErrorInvalidValue, "mat_vec_fast: unsupported weight type", __FILE__, __LINE__);
  return visit_quant_type(mm->src[0]->type, none, [&](auto q) {
    return quant_mat_vec<typename decltype(q)::Fast>(ctx, mm, dst, bias);
  });
}

}  // namespace loom::cuda
