// gemm_q on Hopper's warpgroup MMA (compiled for sm_90a only: it runs where LaunchContext::sm90a, for
// the types gemm_q_wgmma_covers). The block, the stages and the dequantization are gemm_q.cu's (gemm_q_device.cuh): 256 weight
// rows x 64 columns x a k range, walked in 256-k chunks staged two deep by tensor/bulk copies, each
// warp dequantizing its 16 rows' weights into f16 A fragments in registers. What changes is the
// product: the four warps of a warpgroup (64 rows) issue one wgmma.mma_async m64n64k16 per k16 step,
// whose B operand the tensor cores read from shared memory themselves, in place of each warp's 16
// mma.sync m16n8k16 and 8 shared loads of activations per k32 step.
//
// B's layout (K-major, no swizzle): core matrices of 8 columns x 8 k (16 bytes a column, 128 bytes
// a matrix); within a stage's 64 x 256 tile, matrix (k group kg, column group ng) at (kg * 8 + ng) *
// 128 bytes, so the leading (k) byte offset is 1,024 and the stride (column) offset 128. The k order
// within each 32 is the fragments' (gemm_q.cu's "k order trick": thread c of a quad holds the
// physical k 8c .. 8c+7 of its rows, spread over two k16 steps), so logical k L = 16 s + 8 h + 2 c + e
// holds physical k 8 c + 4 s + 2 h + e; the packing kernel writes that order, so no weight moves.
//
// Pipelining: the A fragments of k32 step j + 1 are dequantized while step j's two wgmma run (two
// register sets, each kept live until its products are waited for).
//
// Measured (ncu, H200, 64 columns, against the mma.sync kernel): q4_K [4096, 14336] 39.5 -> 30.3 us,
// [14336, 4096] 35.6 -> 27.5, q4_0 [4096, 14336] 39.8 -> 25.8, q4_K [4096, 6144] at 32 columns 17.5 ->
// 14.3. What bounds it now (ncu on [4096, 14336] q4_K): 1.8 instructions issued per SM cycle, 16 warps
// (the register file's limit at 120 registers), ~94 instructions per warp and k32 step of which 2 are
// wgmma and ~60 dequantization (PRMT, LOP3, HADD2, HFMA2, SHF, LDS); stalls on fixed-latency and
// shared-load dependencies, not on the tensor cores (a third stage or two steps in flight: no change).
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common.cuh"
#include "gemm_q_device.cuh"
#include "gemm_q_tiles.cuh"
#include "gemm_q_wgmma.cuh"
#include "launch.h"
#include "loom/backend.h"
#include "quant_dispatch.cuh"
#include "wgmma.cuh"

namespace loom::cuda {

using namespace gemm_q_detail;

namespace {

/// The tensor maps of a launch's weights (Staging::kTma), one per part (the mma.sync kernel takes one).
struct GemmQMaps {
  CUtensorMap map[kMaxParts];
};

constexpr int kWgThreads = kThreadsOf<1>;   // 16 warps: 4 warpgroups of 64 rows
constexpr int kXTileHalves = kBN * kChunk;  // one stage's activations: 64 x 256 f16 (32 KB)

// The formats the kernel covers: kF16Dequant's (gemm_q_device.cuh), dequantized straight to f16 pairs
// (q5_K as q4_K with its fifth bits: 1B Q5_K_M S_TG at 16 / 64 sequences +30% / +18% against the float
// path; iq4_xs +31% / +20%). Their weights are staged by copies completing on the stage's mbarrier where a
// row's segment is a multiple of 16 bytes (q4_0, q4_K, q5_K, q8_0; q4_1, q5_0, q5_1, iq4_nl: 8 blocks of
// 20, 22, 24, 18), else by cp.async pieces (q6_K's 210-byte blocks, iq4_xs's 136, q3_K's 110, q2_K's 84);
// the activation tiles always by a bulk copy on the mbarrier.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// B's descriptor at shared address addr: k-adjacent core matrices 1,024 bytes apart (leading offset),
// column-adjacent ones 128 (stride offset); swapped, the op test faults (checked on the H200).
__device__ __forceinline__ uint64_t b_desc(uint32_t addr) { return wgmma_desc(addr, 1024, 128); }
#endif

template <class D, bool kViaTma>
__device__ __forceinline__ void arm_stage_wg(const GemmQArgs& p, int64_t row0, uint64_t* bar) {
  using S = Staging<D>;
  const int64_t rows = p.m - row0 < kBM ? p.m - row0 : kBM;
  const int64_t w_bytes = kViaTma || (S::kTma && p.tma) ? int64_t{kBM} * S::kRawStride
                          : S::kBulk                   ? rows * S::kSegBytes
                                                       : 0;
  mbar_arrive_expect(bar, static_cast<unsigned>(w_bytes + kXTileHalves * sizeof(__half)));
}

// The activation tile of (column tile, chunk k0): one bulk copy of 32 KB, from a thread that copies no
// weight row.
__device__ __forceinline__ void issue_x_tile(const GemmQArgs& p, int64_t k0, __half* s_x, uint64_t* bar) {
  if (threadIdx.x == kBM) {
    const int64_t tile = static_cast<int64_t>(blockIdx.x) * (p.k / kChunk) + k0 / kChunk;
    bulk_copy(s_x, p.x + tile * kXTileHalves, kXTileHalves * sizeof(__half), bar);
  }
}

// Formats staged by the copy engine (bulk or tensor copies) run their stages free: each warp releases a
// stage on the stage's "empty" mbarrier once its reads of it are done (its dequantization; its
// warpgroup's products, waited for), and only the threads that copy into a stage wait for that release
// before refilling it, where every warp used to meet at a block barrier each chunk; the warpgroups then
// drift apart instead of dequantizing and issuing their products at the same moments. ncu (H200, caches
// flushed, 64 columns, q4_K): [4096, 14336] 28.6 -> 26.0 us, [4096, 4096] 12.7 -> 11.9; a third stage
// (224 KB) took back half of that (26.8, 12.8). cp.async staging keeps the barrier.
//
// kViaTma: a format whose row segment is not a multiple of 16 bytes (q6_K's 210, Staging::kTmaUnaligned)
// staged by one tensor copy a stage all the same, where the tensor map can be made (rows 16-byte aligned
// and strided; LOOM_CUDA_GEMM_Q_TMA=0: cp.async pieces, ~25 address instructions a row and chunk, and the
// block barrier). The box starts at the 16 bytes holding the segment's first byte (a box starting
// elsewhere faulted on the H200), so the segment sits misaligned in its row as the pieces left it.
template <class D, int kStages>
constexpr size_t kSmemOf = kStages * (Staging<D>::kWStageBytes + kXTileHalves * sizeof(__half)) +
                           Staging<D>::kScaleBytes + 2 * kStages * sizeof(uint64_t);

// kMulti: a multi-part launch (enter_part); a single product's block reads its fields from the
// parameters as they are (10 registers fewer: 118 against 128).
template <class D, int kStages, bool kMulti, bool kViaTma>
__global__ void __launch_bounds__(kWgThreads, 1) gemm_q_wgmma_kernel(GemmQArgs p, const __grid_constant__ GemmQMaps maps) {
  // pdl_wait later: the first weight chunk is requested first (no kernel writes weights)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kF16Dequant<D>) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    using S = Staging<D>;
    static_assert(!kViaTma || S::kTmaUnaligned, "kViaTma: a segment that fits the box, not bulk-copied");
    constexpr bool kCopyEngine = S::kBulk || kViaTma;  // else cp.async pieces
    static_assert(kCopyEngine || kStages == 2, "cp.async staging waits for one group in flight");
    unsigned char* s_w = smem_raw;                                                // [kStages][kBM][kRawStride]
    auto* s_x = reinterpret_cast<__half*>(smem_raw + kStages * S::kWStageBytes);  // [kStages][32 KB tile]
    auto* s_sc = reinterpret_cast<uint32_t*>(smem_raw + kStages * (S::kWStageBytes + kXTileHalves * sizeof(__half)));
    auto* bar = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(s_sc) + S::kScaleBytes);  // full
    constexpr bool kFree = kCopyEngine;
    uint64_t* empty = bar + kStages;  // kFree: a stage's release by each of the block's warps
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
    const int g = lane / 4, c = lane % 4;
    const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBN;
    int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBM;
    const CUtensorMap* map = &maps.map[0];
    if constexpr (kMulti) map = &maps.map[enter_part(p, row0)];
    const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * p.k_split;
    const int64_t k_end = p.k < k_begin + p.k_split ? p.k : k_begin + p.k_split;
    auto row_of = [&](int half) { return warp * 16 + g + 8 * half; };
    // where row r's segment of chunk k0 starts in its staged pieces (0 when staged by the copy engine)
    auto misalign = [&](int r, int64_t k0) {
      if constexpr (kViaTma) return static_cast<int>((k0 / D::kBlock) * D::kBytes) & 15;  // the box's start, below
      if constexpr (kCopyEngine) return 0;
      const int64_t row = row0 + r < p.m ? row0 + r : 0;
      return static_cast<int>(reinterpret_cast<uintptr_t>(p.a + row * p.a_nb1 + (k0 / D::kBlock) * D::kBytes) & 15);
    };
    // a stage's weights: a tensor copy or bulk copies on its barrier, or cp.async pieces (one group)
    auto issue_w = [&](int64_t k, unsigned char* stage_w, uint64_t* stage_bar) {
      if constexpr (kViaTma) {
        if (threadIdx.x == 0)
          tensor_copy_2d(stage_w, map, static_cast<int>((k / D::kBlock) * D::kBytes) & ~15, static_cast<int>(row0),
                         stage_bar);
      } else if constexpr (S::kBulk) {
        issue_w_bulk<D>(p, map, row0, k, stage_w, stage_bar);
      } else {
        load_w<D, 1>(p, row0, k, stage_w);
      }
    };

    // Stage i % kStages holds chunk i (counted from k_begin); chunks 0 .. kStages - 2 are requested
    // before the loop, chunk i + kStages - 1 at the top of iteration i, into the stage that chunk
    // i - 1 left at the previous iteration's barrier. A stage's barrier is armed (its bytes expected)
    // before the block barrier that precedes its copies.
    // (kFree: a stage is armed by thread 0 just before its copies are issued, once it is released)
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&bar[s], 1);
        if constexpr (kFree) mbar_init(&empty[s], kWgThreads / kWarpSize);
      }
      mbar_init_fence();
#pragma unroll
      for (int s = 0; s < (kFree ? kStages - 1 : kStages); ++s)
        if (k_begin + s * kChunk < k_end) arm_stage_wg<D, kViaTma>(p, row0, &bar[s]);
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s)
      if (k_begin + s * kChunk < k_end) issue_w(k_begin + s * kChunk, s_w + s * S::kWStageBytes, &bar[s]);
    if constexpr (!kCopyEngine) cp_async_commit();
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s)
      if (k_begin + s * kChunk < k_end) issue_x_tile(p, k_begin + s * kChunk, s_x + s * kXTileHalves, &bar[s]);

    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;

    // kFree: the threads that copy into a stage (thread 0: the weights' tensor copy or row 0's bulk copy;
    // the other rows' bulk copies without a tensor map; thread kBM: the activation tile)
    const bool copier = threadIdx.x == 0 || threadIdx.x == kBM || (!kViaTma && !(S::kTma && p.tma) && threadIdx.x < kBM);
    int stage = 0;
    unsigned chunk = 0;
    for (int64_t k0 = k_begin; k0 < k_end; k0 += kChunk, stage = stage + 1 == kStages ? 0 : stage + 1, ++chunk) {
      const int64_t k_next = k0 + (kStages - 1) * kChunk;
      if (k_next < k_end) {  // that stage held chunk - 1 (none at chunk 0)
        const int s = stage == 0 ? kStages - 1 : stage - 1;
        if constexpr (kFree) {
          if (copier) {
            if (chunk > 0) mbar_wait(&empty[s], ((chunk - 1) / kStages) & 1);  // every warp released it
            fence_proxy_async();
            if (threadIdx.x == 0) arm_stage_wg<D, kViaTma>(p, row0, &bar[s]);
            issue_w(k_next, s_w + s * S::kWStageBytes, &bar[s]);
            issue_x_tile(p, k_next, s_x + s * kXTileHalves, &bar[s]);
          }
        } else {  // its readers finished at the last chunk's barrier
          fence_proxy_async();
          issue_w(k_next, s_w + s * S::kWStageBytes, &bar[s]);
          issue_x_tile(p, k_next, s_x + s * kXTileHalves, &bar[s]);
        }
      }
      if constexpr (!kCopyEngine) {  // this stage's weight pieces, every thread's, before anyone reads them
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
      }
      mbar_wait(&bar[stage], (chunk / kStages) & 1);
      const unsigned char* w_rows[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        w_rows[hf] = s_w + stage * S::kWStageBytes + row_of(hf) * S::kRawStride + misalign(row_of(hf), k0);
      // q4_K's pre-decoded scales where no scale of the warpgroup's rows is beyond f16 (the vote over the
      // warpgroup: its four warps must take the same loop below, their wgmma instructions being
      // warpgroup-wide)
      bool pre = false;
      if constexpr (S::kPreScales)
        if (p.pre_scales)
          pre = !q4k_pre_scales<S, 1, true>(s_w + stage * S::kWStageBytes, warp, lane, p.m - row0, s_sc);
      // B's descriptors: the stage's, plus k16 step i's 2,048 bytes in the start address field (bits 0-13,
      // the address / 16: no carry out of it within shared memory), so a product's descriptor is one add
      const uint64_t xd = b_desc(smem_addr(s_x + stage * kXTileHalves));
      const uint32_t xd_lo = static_cast<uint32_t>(xd), xd_hi = static_cast<uint32_t>(xd >> 32);
      auto desc_at = [&](int i) { return static_cast<uint64_t>(xd_hi) << 32 | (xd_lo + i * (2048 >> 4)); };
      // The chunk's 8 k32 steps, one loop per dequantization path (dq(hf, j, w): row hf's eight weights of
      // step j), so no branch sits inside the steps. A fragments of step j: rows g and g + 8, physical k
      // 8c .. 8c+7 of the step, as two k16 steps. Step j's products are waited for before step j + 1's
      // are issued (two steps in flight, with a third fragment set, measured the same: ncu, H200, [4096,
      // 14336] q4_K at 64 columns 31.5 against 30.7 us; so did a third stage, 30.6 against 30.5).
      auto steps = [&](auto dq) {
        auto dequant_step = [&](int j, uint32_t(&a)[8]) {
          uint32_t wl[4], wh[4];
          dq(0, j, wl);
          dq(1, j, wh);
          a[0] = wl[0], a[1] = wh[0], a[2] = wl[1], a[3] = wh[1];
          a[4] = wl[2], a[5] = wh[2], a[6] = wl[3], a[7] = wh[3];
        };
        uint32_t a[2][8];
        dequant_step(0, a[0]);
        fence_regs(acc);
#pragma unroll
        for (int j = 0; j < kChunk / 32; ++j) {
          wgmma_fence();
          wgmma_64x64x16_rs<false>(acc, &a[j & 1][0], desc_at(2 * j));
          wgmma_64x64x16_rs<false>(acc, &a[j & 1][4], desc_at(2 * j + 1));
          wgmma_commit();
          if (j + 1 < kChunk / 32) dequant_step(j + 1, a[(j + 1) & 1]);
          wgmma_wait<0>();
          fence_regs(a[j & 1]);
        }
      };
      bool done = false;
      if constexpr (S::kPreScales) {
        if (pre) {
          steps([&](int hf, int j, uint32_t(&w)[4]) { dequant8_q4k_pre(w_rows[hf], j, c, s_sc[j * kBM + row_of(hf)], w); });
          done = true;
        }
      }
      if (!done) steps([&](int hf, int j, uint32_t(&w)[4]) { dequant8_jc<D, true>(w_rows[hf], j, c, w); });
      fence_regs(acc);
      if constexpr (kFree) {
        __syncwarp();  // the warp's reads of the stage (and of its pre-decoded scales) are done
        if (lane == 0) mbar_arrive(&empty[stage]);
      } else {
        if (threadIdx.x == 0 && k0 + kStages * kChunk < k_end) arm_stage_wg<D, kViaTma>(p, row0, &bar[stage]);
        __syncthreads();  // every warpgroup's products of this stage are done before it is refilled
      }
    }

    // D fragment: rows g, g + 8 of the warp's 16; columns 8i + 2c, 8i + 2c + 1 of n8 group i.
    float* out = p.out + static_cast<int64_t>(blockIdx.z) * p.split_stride;
#pragma unroll
    for (int i = 0; i < kNTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + row_of(e / 2);
        const int64_t col = col0 + i * 8 + 2 * c + (e & 1);
        if (row < p.m && col < p.n) out[col * p.ldo + row] = acc[4 * i + e];
      }
  }
#endif
}

// One thread per column and k32 group (columns fastest, so a warp's stores fill whole core matrices
// and each thread's loads are one 128-byte line): its 32 activations become the four 16-byte rows of
// k groups 4j .. 4j + 3 (j the k32 step within the chunk) in column n % 8 of column group ng, where
// logical k 8 kg' .. 8 kg' + 7 (kg' = kg % 4 = 2 s + h) hold physical k 8c + 4 s + 2 h + e, c = 0..3,
// e = 0, 1. Columns past n are zero. b 16-byte aligned: 16-byte loads (rows are: k is a multiple of
// 256), else one element a load.
__global__ void pack_gemm_q_tiles_kernel(uint4* out, const float* b, int64_t n, int64_t k, int64_t n_pad) {
  pdl_wait();
  const bool aligned = reinterpret_cast<uintptr_t>(b) % 16 == 0;  // else element loads
  const int64_t chunks = k / kChunk, items = n_pad * (k / 32);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i % n_pad, g32 = i / n_pad;
    uint4* dst = out + gemm_q_tile_piece(col, g32, chunks);
    float x[32];
    if (col < n && aligned) {
      const float4* src = reinterpret_cast<const float4*>(b + col * k + g32 * 32);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float4 f = src[v];
        x[4 * v] = f.x, x[4 * v + 1] = f.y, x[4 * v + 2] = f.z, x[4 * v + 3] = f.w;
      }
    } else if (col < n) {
#pragma unroll
      for (int v = 0; v < 32; ++v) x[v] = b[col * k + g32 * 32 + v];
    } else {
#pragma unroll
      for (int v = 0; v < 32; ++v) x[v] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int o = 4 * (q / 2) + 2 * (q % 2);
      dst[q * 64] = make_uint4(pack_half2(x[o], x[o + 1]), pack_half2(x[8 + o], x[9 + o]), pack_half2(x[16 + o], x[17 + o]),
                               pack_half2(x[24 + o], x[25 + o]));
    }
  }
}

bool wgmma_switch() {
  static const bool on = env_switch("LOOM_CUDA_GEMM_Q_WGMMA");
  return on;
}

}  // namespace

bool gemm_q_wgmma_covers(DType t) {
  return wgmma_switch() &&
         visit_quant_type(t, false, [](auto q) { return kF16Dequant<typename decltype(q)::Dequant8>; });
}

size_t gemm_q_tiles_bytes(int64_t n, int64_t k) {
  return static_cast<size_t>((n + kBN - 1) / kBN * kBN) * static_cast<size_t>(k) * sizeof(__half);
}

CudaError pack_gemm_q_tiles(cudaStream_t stream, __half* out, const float* b, int64_t n, int64_t k) {
  const int64_t n_pad = (n + kBN - 1) / kBN * kBN;
  constexpr int kThreads = 64;  // small blocks: a 64 x 4096 product has 8,192 items, spread over 128 SMs
  pack_gemm_q_tiles_kernel<<<grid_for(n_pad * (k / 32), kThreads), kThreads, 0, stream>>>(reinterpret_cast<uint4*>(out),
                                                                                           b, n, k, n_pad);
  LOOM_CUDA_CHECK_LAUNCH("pack_gemm_q_tiles_kernel");
  return {};
}

CudaError launch_gemm_q_wgmma(cudaStream_t stream, const Tensor* const* weights, const GemmQArgs& args, dim3 grid) {
  return visit_quant_type(
      weights[0]->type, CudaError::runtime(cudaErrorInvalidValue, "mul_mat: not a quantized weight", __FILE__, __LINE__),
      [&](auto q) -> CudaError {
        using D = typename decltype(q)::Dequant8;
        if constexpr (!kF16Dequant<D>) {
          return CudaError::runtime(cudaErrorInvalidValue, "mul_mat: no warpgroup gemm_q for this weight type",
                                    __FILE__, __LINE__);
        } else {
          GemmQArgs p = args;
          GemmQMaps maps{};
          using S = Staging<D>;
          if constexpr (S::kTma || S::kTmaUnaligned)
            for (int i = 0; i < std::max(p.parts, 1) && p.tma; ++i)
              p.tma = encode_weight_map<D>(weights[i], p.parts > 1 ? p.part[i].m : p.m, p.k, maps.map[i]);
          constexpr int kStages = 2;
          constexpr size_t smem = kSmemOf<D, kStages>;
          static_assert(smem <= 227 * 1024);
          auto* kernel =
              p.parts > 1 ? gemm_q_wgmma_kernel<D, kStages, true, false> : gemm_q_wgmma_kernel<D, kStages, false, false>;
          if constexpr (S::kTmaUnaligned)
            if (p.tma)
              kernel = p.parts > 1 ? gemm_q_wgmma_kernel<D, kStages, true, true> : gemm_q_wgmma_kernel<D, kStages, false, true>;
          LOOM_CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
          kernel<<<grid, kWgThreads, smem, stream>>>(p, maps);
          LOOM_CUDA_CHECK_LAUNCH("gemm_q_wgmma_kernel");
          return {};
        }
      });
}

}  // namespace loom::cuda
