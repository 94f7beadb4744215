// The fast numerics mode's GEMM for quantized weights at a few dozen columns (batched decode): weights
// are dequantized into the registers of mma.sync's A fragments (m16n8k16, f16 inputs, f32
// accumulators), with no f16 copy of the weights in global memory (the dequantize-then-cuBLAS path
// of matmul.cu writes and re-reads one, which at 64 columns costs more than the products).
//
// The k order trick: a dot product does not care in which order its k terms are paired, only that A
// and B pair the same ones. Within each 32-wide k step, thread (g = lane / 4, c = lane % 4) takes
// the physical k 8c .. 8c+7 for both operands: eight consecutive weights of rows g and g + 8 (one
// Dequant8 call each, quant.cuh, scales decoded once) and eight consecutive activations of column g
// of each n8 tile (one 16-byte shared load), placed in the fragment slots of two k16 steps
// (2c, 2c+1 | 2c+8, 2c+9 of step 0 take 8c+0..3, of step 1 8c+4..7). No ldmatrix and no
// dequantized tile in shared memory.
//
// Tiling: a block owns kBM = 256 weight rows x kBN = 64 columns x one k range, walked in kChunk = 256
// chunks (a whole block of every format): 16 warps of one m16 tile each (the k32 steps unrolled by
// two), or 8 of two. Per chunk, the rows' raw weight bytes and the f16 activations (packed by the
// caller) are staged in shared memory, two stages deep (Staging: bulk copies or cp.async pieces).
// Latency bounds it, not bytes or FLOPs (ncu, H200, [14336, 64] q4_K: 1 block of 8 warps per SM,
// 6 cycles per issued instruction, ~1,800 instructions per warp and chunk of which 256 mma): 16 warps
// hide more of it (48.8 -> 42.9 us) although each activation load then feeds 2 mma instead of 4.
// Small products split k over blocks (blockIdx.z, the count from gemm_q_plan.h): each split writes its
// partial sums to scratch and gemm_q_reduce_kernel adds them in split order, the same every run.
//
// On compute capability 9.0 the f16-path formats (all but mxfp4) take gemm_q_wgmma.cu's
// warpgroup kernel instead (same block, stages and dequantization; wgmma for the products; the
// activations packed in its tiles by pack_gemm_q_tiles); LOOM_CUDA_GEMM_Q_WGMMA=0 keeps this one.
// There, several products of one activation (a layer's Q/K/V, or gate and up, whose SwiGLU/GeGLU the
// reduction applies) go in one launch (GemmQProducts): their row tiles one after another along
// blockIdx.y, each block taking its part's weights and output from its row tile (enter_part), planned
// as one product of all their rows; the activation is packed once.
//
// Bytes: the weights once per column tile; the f16 activations once per 256-row tile (from L2);
// partial sums 8 x splits x m x n bytes. FLOPs 2 m n k. At 4096 x 4096 x 64 columns q4_0: 9.4 MB of
// weights (2 us at 4.8 TB/s), 2.1 GFLOP.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <type_traits>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "activation.cuh"
#include "common.cuh"
#include "gemm_q.cuh"
#include "gemm_q_device.cuh"
#include "gemm_q_wgmma.cuh"
#include "gemm_q_plan.h"
#include "loom/backend.h"
#include "mma.cuh"
#include "quant.cuh"
#include "quant_dispatch.cuh"

namespace loom::cuda {

namespace {

using namespace gemm_q_detail;

template <class D, int kUnroll, int kMT>
__global__ void __launch_bounds__(kThreadsOf<kMT>, 1) gemm_q_kernel(GemmQArgs p, const __grid_constant__ CUtensorMap map) {
  // pdl_wait later: the first weight chunk is requested first (no kernel writes weights)
  constexpr int kMTiles = kMT;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // tensor copies land on 128-byte boundaries
  using S = Staging<D>;
  unsigned char* s_w = smem_raw;                                          // [2][kBM][kRawStride]
  auto* s_x = reinterpret_cast<__half*>(smem_raw + 2 * S::kWStageBytes);  // [2][kBN][kXStride]
  auto* s_sc = reinterpret_cast<uint32_t*>(smem_raw + 2 * (S::kWStageBytes + S::kXStageBytes));  // [8][kBM]
  auto* bar = reinterpret_cast<uint64_t*>(smem_raw + 2 * (S::kWStageBytes + S::kXStageBytes) + S::kScaleBytes);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, c = lane % 4;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBN, row0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * p.k_split;
  const int64_t k_end = p.k < k_begin + p.k_split ? p.k : k_begin + p.k_split;
  // This thread's rows: g and g + 8 of each of the warp's m16 tiles; misalign(r, k0): where row r's
  // segment of chunk k0 starts in its staged pieces (0 when bulk-staged).
  auto row_of = [&](int mt, int half) { return warp * 16 * kMTiles + mt * 16 + g + 8 * half; };
  auto misalign = [&](int r, int64_t k0) {
    if constexpr (S::kBulk) return 0;
    const int64_t row = row0 + r < p.m ? row0 + r : 0;
    return static_cast<int>(reinterpret_cast<uintptr_t>(p.a + row * p.a_nb1 + (k0 / D::kBlock) * D::kBytes) & 15);
  };

  if constexpr (S::kBulk) {
    // A stage's barrier is armed (its bytes expected) before a block barrier that precedes its copies.
    if (threadIdx.x == 0) {
      mbar_init(&bar[0], 1);
      mbar_init(&bar[1], 1);
      mbar_init_fence();
      arm_stage<D>(p, row0, col0, &bar[0]);
      if (k_begin + kChunk < k_end) arm_stage<D>(p, row0, col0, &bar[1]);
    }
    __syncthreads();
    issue_w_bulk<D>(p, &map, row0, k_begin, s_w, &bar[0]);
    pdl_wait();
    issue_x_bulk<D>(p, col0, k_begin, s_x, &bar[0]);
  } else {
    load_w<D, kMT>(p, row0, k_begin, s_w);
    pdl_wait();
    load_x<kMT>(p, col0, k_begin, s_x);
    cp_async_commit();
  }

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int i = 0; i < kNTiles; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.0f;

  int stage = 0;
  unsigned chunk = 0;  // bulk: stage chunk & 1 was filled chunk / 2 times before (the parity its wait expects)
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kChunk, stage ^= 1, ++chunk) {
    if constexpr (S::kBulk) {
      if (k0 + kChunk < k_end) {  // the other stage's readers finished at the last chunk's barrier
        fence_proxy_async();
        issue_w_bulk<D>(p, &map, row0, k0 + kChunk, s_w + (stage ^ 1) * S::kWStageBytes, &bar[stage ^ 1]);
        issue_x_bulk<D>(p, col0, k0 + kChunk, s_x + (stage ^ 1) * kBN * S::kXStride, &bar[stage ^ 1]);
      }
      mbar_wait(&bar[stage], (chunk >> 1) & 1);
    } else {
      if (k0 + kChunk < k_end) {
        load_w<D, kMT>(p, row0, k0 + kChunk, s_w + (stage ^ 1) * S::kWStageBytes);
        load_x<kMT>(p, col0, k0 + kChunk, s_x + (stage ^ 1) * kBN * S::kXStride);
      }
      cp_async_commit();
      cp_async_wait<1>();  // this stage's bytes (the next stage's may still be in flight)
      __syncthreads();
    }
    const unsigned char* w_rows[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row_of(mt, hf);
        w_rows[mt][hf] = s_w + stage * S::kWStageBytes + r * S::kRawStride + misalign(r, k0);
      }
    bool pre = false;  // q4_K: scales decoded once for the chunk
    if constexpr (S::kPreScales)
      if (p.pre_scales) pre = !q4k_pre_scales<S, kMT>(s_w + stage * S::kWStageBytes, warp, lane, p.m - row0, s_sc);
    // column g of each n8 tile (g's parity, hence the swizzle, is the same in every tile)
    const __half* xs = s_x + stage * kBN * S::kXStride + g * S::kXStride + 8 * c;
    const int sw = S::kBulk ? 0 : (g & 1) << 2;
    // The chunk's 8 k32 steps, one loop per dequantization path (no branch inside the steps, so the
    // scheduler may overlap a step's weight loads with the previous step's mma).
    auto steps = [&](auto dq) {
#pragma unroll kUnroll
      for (int j = 0; j < kChunk / 32; ++j) {
        uint32_t a0[kMTiles][4], a1[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          uint32_t wl[4], wh[4];
          dq(mt, 0, j, wl);
          dq(mt, 1, j, wh);
          a0[mt][0] = wl[0], a0[mt][1] = wh[0], a0[mt][2] = wl[1], a0[mt][3] = wh[1];
          a1[mt][0] = wl[2], a1[mt][1] = wh[2], a1[mt][2] = wl[3], a1[mt][3] = wh[3];
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const uint4 xv = *reinterpret_cast<const uint4*>(xs + nt * 8 * S::kXStride + 8 * ((4 * j) ^ sw));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816(acc[mt][nt], a0[mt], xv.x, xv.y);
            mma_16816(acc[mt][nt], a1[mt], xv.z, xv.w);
          }
        }
      }
    };
    bool done = false;
    if constexpr (S::kPreScales) {
      if (pre) {
        steps([&](int mt, int hf, int j, uint32_t(&w)[4]) {
          dequant8_q4k_pre(w_rows[mt][hf], j, c, s_sc[j * kBM + row_of(mt, hf)], w);
        });
        done = true;
      }
    }
    if (!done) steps([&](int mt, int hf, int j, uint32_t(&w)[4]) { dequant8_jc<D>(w_rows[mt][hf], j, c, w); });
    // this stage's next fill (chunk + 2) is expected before the barrier that precedes its copies
    if constexpr (S::kBulk) if (k0 + 2 * kChunk < k_end) arm_stage<D>(p, row0, col0, &bar[stage]);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // C fragment: rows g, g + 8 of each m16 tile, columns 2c, 2c + 1 of each n8 tile.
  float* out = p.out + static_cast<int64_t>(blockIdx.z) * p.split_stride;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + row_of(mt, e / 2);
        const int64_t col = col0 + nt * 8 + 2 * c + (e & 1);
        if (row < p.m && col < p.n) out[col * p.ldo + row] = acc[mt][nt][e];
      }
}

// The partial sums' reduction: per output element the splits' sums added in split order (the same
// every run), into each part's output; with glu, act(gate) * up of parts 0 and 1 (the gate's and the
// up's rows of each column) into dst[0], the only output.
struct ReduceArgs {
  float* dst[kMaxParts];
  int64_t m[kMaxParts];  // each part's rows
  int parts;
  int64_t m_total, n;  // the partial sums' rows (every part's) and columns
  int splits;
  int glu;  // 0: none, 1: swiglu, 2: geglu
};

// Grid: x over the output rows (r.glu ? the gate's : every part's), y the columns (no index division:
// with one per element the gated reduction took 9.5 us at [14336, 64], ncu, H200).
__global__ void gemm_q_reduce_kernel(const __grid_constant__ ReduceArgs r, const float* part) {
  pdl_wait();
  const int64_t stride = r.m_total * r.n, rows = r.glu ? r.m[0] : r.m_total, col = blockIdx.y;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= rows) return;
  auto sum = [&](int64_t at) {
    float s = part[at];
    for (int j = 1; j < r.splits; ++j) s += part[j * stride + at];
    return s;
  };
  const int64_t at = col * r.m_total + row;
  if (r.glu) {
    r.dst[0][col * rows + row] = gated_f(sum(at), sum(at + r.m[0]), r.glu == 1);
  } else {
    const int q = row < r.m[0] ? 0 : r.parts > 2 && row >= r.m[0] + r.m[1] ? 2 : 1;
    const int64_t off = q == 0 ? 0 : q == 1 ? r.m[0] : r.m[0] + r.m[1];
    r.dst[q][col * r.m[q] + row - off] = sum(at);
  }
}

// LOOM_CUDA_GEMM_Q_MTILES (1 or 2) and LOOM_CUDA_GEMM_Q_UNROLL (1 or 2): the f16-path formats' kernel
// shape, to time one against another (0: the format's default).
int env_choice(const char* name) {
  const char* e = std::getenv(name);
  return e && (std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0) ? *e - '0' : 0;
}
bool tma_enabled() {
  static const bool on = env_switch("LOOM_CUDA_GEMM_Q_TMA");
  return on;
}
int mtiles_setting() {
  static const int m = env_choice("LOOM_CUDA_GEMM_Q_MTILES");
  return m;
}
int unroll_setting() {
  static const int u = env_choice("LOOM_CUDA_GEMM_Q_UNROLL");
  return u;
}

bool pre_scales_enabled() {
  static const bool on = env_switch("LOOM_CUDA_GEMM_Q_PRESCALES");
  return on;
}

using GemmQShape = gemm_q_plan::Plan;

// shape_of is asked at every plan and launch (eager launches too): the split search once per shape
// and thread (the makespan search cost an eager product, as in a --trace run, 30-200 us of host time).
// A multi-part launch is planned as one product of all its parts' rows.
GemmQShape shape_of(const GemmQProducts& pr) {
  const Tensor* a = pr.mm[0]->src[0];
  const Tensor* b = pr.mm[0]->src[1];
  int64_t m = 0;
  for (int i = 0; i < pr.count; ++i) m += pr.mm[i]->src[0]->ne[1];
  const std::array<int64_t, 3> key{m, b->ne[1] * b->ne[2] * b->ne[3], a->ne[0]};
  thread_local std::map<std::array<int64_t, 3>, GemmQShape> known;
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  return known.emplace(key, gemm_q_plan::plan(key[0], key[1], key[2], batch_invariant())).first->second;
}

// Whether the products' sums go through the partial-sum scratch (split over k, or gated).
bool via_partial(const GemmQProducts& pr, const GemmQShape& s) { return s.splits > 1 || pr.glu; }

const char* end_of(const Tensor* a) {
  return static_cast<const char*>(a->data) + (a->ne[1] - 1) * static_cast<int64_t>(a->nb[1]) +
         static_cast<int64_t>(a->ne[0] / dtype_block_size(a->type) * dtype_type_size(a->type));
}

}  // namespace

bool gemm_q_supported(const Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  if (!dtype_is_quantized(a->type) || a->ne[2] != 1 || a->ne[3] != 1 || !dst->is_contiguous()) return false;
  if (a->ne[0] <= 0 || a->ne[0] % kChunk != 0 || b->ne[0] != a->ne[0]) return false;
  // bulk-staged formats copy whole 16-byte pieces from each row's start
  const bool bulk = visit_quant_type(a->type, false, [](auto q) { return Staging<typename decltype(q)::Dequant8>::kBulk; });
  if (bulk && (reinterpret_cast<uintptr_t>(a->data) % 16 != 0 || a->nb[1] % 16 != 0)) return false;
  const GemmQShape s = shape_of(GemmQProducts{{dst}});
  return s.col_tiles <= INT32_MAX && s.row_tiles <= kMaxGridYZ && s.n <= kMaxGridYZ;  // the reduction: y a column
}

bool gemm_q_products_supported(const GemmQProducts& pr) {
  if (pr.count < 1 || pr.count > kMaxParts || (pr.glu && pr.count != 2)) return false;
  const Tensor* w0 = pr.mm[0]->src[0];
  for (int i = 0; i < pr.count; ++i) {
    const Tensor* mm = pr.mm[i];
    if (!mm || mm->op != OpKind::mul_mat || mm->src[1] != pr.mm[0]->src[1] || mm->src[0]->type != w0->type ||
        !gemm_q_supported(mm))
      return false;
    // every part but the last whole row tiles, so the parts' tiles follow one another
    if (i + 1 < pr.count && mm->src[0]->ne[1] % kBM != 0) return false;
  }
  if (pr.glu && (pr.mm[0]->ne != pr.mm[1]->ne || pr.glu->ne != pr.mm[0]->ne || !pr.glu->is_contiguous())) return false;
  const GemmQShape s = shape_of(pr);
  return s.row_tiles <= kMaxGridYZ;
}

size_t gemm_q_partial_bytes(const GemmQProducts& pr) {
  const GemmQShape s = shape_of(pr);
  return via_partial(pr, s) ? static_cast<size_t>(s.splits) * static_cast<size_t>(s.m * s.n) * sizeof(float) : 0;
}

CudaError launch_gemm_q(const LaunchContext& ctx, const GemmQProducts& pr, const __half* x16, float* partial,
                        bool tiles) {
  const GemmQShape s = shape_of(pr);
  const bool to_partial = via_partial(pr, s);
  if (to_partial && !partial)
    return CudaError::runtime(cudaErrorInvalidValue, "mul_mat: no scratch for the split sums", __FILE__, __LINE__);
  if (pr.count > 1 && !tiles)
    return CudaError::runtime(cudaErrorInvalidValue, "mul_mat: products of one launch need the warpgroup kernel",
                              __FILE__, __LINE__);
  GemmQArgs p{};
  p.x = x16;
  p.n = s.n;
  p.k = s.k;
  p.k_split = s.k_split;
  p.split_stride = s.m * s.n;
  p.pre_scales = pre_scales_enabled();
  p.parts = pr.count;
  const Tensor* weights[kMaxParts] = {};
  int64_t row = 0, tile = 0;
  for (int i = 0; i < pr.count; ++i) {
    const Tensor* w = pr.mm[i]->src[0];
    weights[i] = w;
    p.part[i] = {static_cast<const char*>(w->data), end_of(w),
                 to_partial ? partial + row : static_cast<float*>(pr.mm[i]->data), w->ne[1],
                 to_partial ? s.m : w->ne[1], tile};
    row += w->ne[1];
    tile += (w->ne[1] + kBM - 1) / kBM;
  }
  p.a = p.part[0].a;  // a single product's (and part 0's): the kernels read these unless p.parts > 1
  p.a_end = p.part[0].a_end;
  p.out = p.part[0].out;
  p.m = p.part[0].m;
  p.ldo = p.part[0].ldo;
  p.a_nb1 = static_cast<int64_t>(weights[0]->nb[1]);
  const dim3 grid(static_cast<unsigned>(s.col_tiles), static_cast<unsigned>(s.row_tiles),
                  static_cast<unsigned>(s.splits));
  if (tiles) p.tma = tma_enabled();
  const CudaError e = tiles ? launch_gemm_q_wgmma(ctx.stream, weights, p, grid) : visit_quant_type(
      weights[0]->type, CudaError::runtime(cudaErrorInvalidValue, "mul_mat: not a quantized weight", __FILE__, __LINE__),
      [&](auto q) -> CudaError {
        using D = typename decltype(q)::Dequant8;
        // q4_0, q8_0, q4_K: 16 warps of one m16 tile each, the k32 steps unrolled by two (ncu, H200,
        // 64 columns, 8 warps of two tiles against it: [14336, 4096] q4_K 48.8 / 41.3 us, q4_0 43.8 / 41.0,
        // [4096, 14336] q8_0 47.4 / 43.2); q6_K: 8 warps of two tiles (55.5 against 59.1). The formats
        // dequantized through floats: 16 warps, unrolled once (by two they spill at 128 registers).
        auto* kernel = gemm_q_kernel<D, kF16Dequant<D> ? 2 : 1, 1>;
        int threads = kThreadsOf<1>;
        if constexpr (kF16Dequant<D>) {
          const int mt = mtiles_setting() ? mtiles_setting() : std::is_same_v<D, Dequant8Q6_K> ? 2 : 1;
          const int unroll = unroll_setting() ? unroll_setting() : mt == 1 ? 2 : 1;
          if (mt == 2) {
            kernel = unroll == 2 ? gemm_q_kernel<D, 2, 2> : gemm_q_kernel<D, 1, 2>;
            threads = kThreadsOf<2>;
          } else if (unroll == 1) {
            kernel = gemm_q_kernel<D, 1, 1>;
          }
        }
        CUtensorMap map{};  // one product a launch here
        if constexpr (Staging<D>::kTma)
          if (tma_enabled()) p.tma = encode_weight_map<D>(weights[0], s.m, s.k, map);
        constexpr size_t smem = Staging<D>::kSmemBytes;
        static_assert(smem <= 227 * 1024);
        LOOM_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, threads, smem, ctx.stream>>>(p, map);
        LOOM_CUDA_CHECK_LAUNCH("gemm_q_kernel");
        return {};
      });
  if (!e.ok() || !to_partial) return e;
  ReduceArgs r{};
  for (int i = 0; i < pr.count; ++i) {
    r.dst[i] = static_cast<float*>(pr.mm[i]->data);
    r.m[i] = pr.mm[i]->src[0]->ne[1];
  }
  if (pr.glu) r.dst[0] = static_cast<float*>(pr.glu->data);
  r.parts = pr.count;
  r.m_total = s.m;
  r.n = s.n;
  r.splits = s.splits;
  r.glu = !pr.glu ? 0 : pr.glu->op == OpKind::swiglu ? 1 : 2;
  constexpr int kReduceThreads = 256;
  const dim3 reduce_grid(grid_for(pr.glu ? r.m[0] : s.m, kReduceThreads), static_cast<unsigned>(s.n));
  gemm_q_reduce_kernel<<<reduce_grid, kReduceThreads, 0, ctx.stream>>>(r, partial);
  LOOM_CUDA_CHECK_LAUNCH("gemm_q_reduce_kernel");
  return {};
}

}  // namespace loom::cuda
