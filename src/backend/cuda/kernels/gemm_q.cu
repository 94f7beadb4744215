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
// Tiling: a block of 8 warps owns kBM = 256 weight rows (two m16 tiles per warp, so each 16-byte
// activation load feeds four mma) x kBN = 64 columns x one k range, walked in kChunk = 256 chunks (a
// whole block of every format). Per chunk, the rows' raw weight bytes (16-byte cp.async pieces from
// each segment's aligned start: coalesced, where per-thread loads of each lane's own row were 8
// lines per warp load and saturated L1) and the f16 activations (packed by the caller) are staged in
// shared memory, two stages deep. Small products split k over blocks (blockIdx.z) so that the grid
// fills the GPU: each split writes its partial sums to scratch and gemm_q_reduce_kernel adds them in
// split order, the same every run. With one m16 tile per warp (128 rows) the shared-memory pipe
// bound it (8 activation loads per 16 mma); two tiles: 4096 x 4096 x 64 q4_0 27.1 -> 26.4 us per
// call, the 8B batched step's [4096, 64] products 38 -> 34 us.
//
// Bytes: the weights once per column tile; the f16 activations once per 256-row tile (from L2);
// partial sums 8 x splits x m x n bytes. FLOPs 2 m n k. At 4096 x 4096 x 64 columns q4_0: 9.4 MB of
// weights (2 us at 4.8 TB/s), 2.1 GFLOP.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common.cuh"
#include "gemm_q.cuh"
#include "mma.cuh"
#include "quant.cuh"
#include "quant_dispatch.cuh"

namespace loom::cuda {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * kWarpSize;
constexpr int kMTiles = 2;            // m16 tiles per warp: each activation load feeds 2 x 2 mma
constexpr int kBM = 16 * kMTiles * kWarps;  // weight rows per block
constexpr int kBN = 64;           // columns per block
constexpr int kNTiles = kBN / 8;  // n8 tiles per warp
constexpr int kChunk = 256;       // k per shared-memory stage (a whole block of every format)
constexpr int kXCopies = kBN * kChunk / 8 / kThreads;  // 16-byte cp.async per thread per stage
// Activations per stage: kBN columns of kChunk halves (512 bytes), the 16-byte pieces of odd columns
// swizzled (piece ^ 4), so that the two columns one 8-lane phase of a 16-byte load reads fall on
// different banks.
constexpr size_t kXStageBytes = size_t{kBN} * kChunk * sizeof(__half);  // 32,768
__device__ __forceinline__ int x_piece(int col, int piece) { return piece ^ ((col & 1) << 2); }

// Raw weight bytes per row and stage: the chunk's segment of a row (kSegBytes) copied from its
// 16-byte-aligned start, so up to 15 bytes before it: one piece more than the segment needs.
// q4_0 / q4_K: 11 pieces, 176-byte rows (12 banks apart); 256 rows x 2 stages with the activations: 154 KB.
template <class D>
struct Staging {
  static constexpr int kSegBytes = kChunk / D::kBlock * D::kBytes;
  static constexpr int kRawPieces = (kSegBytes + 15) / 16 + 1;
  static constexpr int kRawStride = 16 * kRawPieces;
  static constexpr size_t kWStageBytes = size_t{kBM} * kRawStride;
  /// q4_K: the chunk's sub-block scale and negated bias of each row as f16 pairs (PreScales).
  static constexpr bool kPreScales = std::is_same_v<D, Dequant8Q4_K>;
  static constexpr size_t kScaleBytes = kPreScales ? size_t{kBM} * (kChunk / 32) * sizeof(uint32_t) : 0;
  static constexpr size_t kSmemBytes = 2 * (kWStageBytes + kXStageBytes) + kScaleBytes;
};

// Blocks the split over k aims for: one per SM of a 132-SM H100/H200 (a function of the shape only,
// so the scratch size and the result do not depend on the device).
constexpr int64_t kTargetBlocks = 132;
constexpr int kMaxSplits = 16;

struct GemmQArgs {
  float* out;       // splits == 1: dst [m, n]; else partial sums [splits][n][m]
  const char* a;    // weight rows, a_nb1 bytes apart
  int64_t a_nb1;
  const __half* x;  // activations [n][k] f16, contiguous
  int64_t m, n, k;
  int64_t k_split;  // k per split, a multiple of kChunk
  const char* a_end;  // one past the weights' last byte
  bool pre_scales;    // q4_K: decode the scales once per chunk (LOOM_CUDA_GEMM_Q_PRESCALES=0: per dequant8)
};

__device__ __forceinline__ void load_x(const GemmQArgs& p, int64_t col0, int64_t k0, __half* s_x) {
#pragma unroll
  for (int i = 0; i < kXCopies; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    const int col = c / (kChunk / 8), part = c % (kChunk / 8);
    const bool ok = col0 + col < p.n;
    const __half* src = p.x + (ok ? col0 + col : 0) * p.k + k0 + part * 8;
    cp_async_16(smem_addr(s_x + col * kChunk + x_piece(col, part) * 8), src, ok ? 16 : 0);
  }
}

// cp.async of the raw weight segments of chunk k0 for the block's kBM rows: each row's segment from
// its 16-byte-aligned start (rows past m and bytes past the weights are zero-filled).
template <class D>
__device__ __forceinline__ void load_w(const GemmQArgs& p, int64_t row0, int64_t k0, unsigned char* s_w) {
  using S = Staging<D>;
  for (int i = static_cast<int>(threadIdx.x); i < kBM * S::kRawPieces; i += kThreads) {
    const int r = i / S::kRawPieces, piece = i % S::kRawPieces;
    const int64_t row = row0 + r;
    const char* seg = p.a + (row < p.m ? row : 0) * p.a_nb1 + (k0 / D::kBlock) * D::kBytes;
    const char* src = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(seg) & ~uintptr_t{15}) + 16 * piece;
    const int64_t left = p.a_end - src;
    const int bytes =
        row < p.m && src < seg + S::kSegBytes ? static_cast<int>(left < 16 ? (left > 0 ? left : 0) : 16) : 0;
    // a piece with nothing to copy still names a 16-byte-aligned address (the weights' aligned start)
    const char* base = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p.a) & ~uintptr_t{15});
    cp_async_16(smem_addr(s_w + r * S::kRawStride + 16 * piece), bytes > 0 ? src : base, bytes);
  }
}

// (h - sub) * d on f16x2 registers; exact subtraction of small integers, one rounding of the product.
__device__ __forceinline__ uint32_t h2_sub_mul(uint32_t h, uint32_t sub, uint32_t d) {
  __half2 x, y, z;
  memcpy(&x, &h, 4);
  memcpy(&y, &sub, 4);
  memcpy(&z, &d, 4);
  const __half2 r = __hmul2(__hsub2(x, y), z);
  uint32_t out;
  memcpy(&out, &r, 4);
  return out;
}

// Eight weights k .. k+7 (k relative to the chunk) of a staged row as four f16x2. q4_0 and q8_0 work
// on f16 pairs directly: two 8-bit codes become 1024 + code in one byte permute with 0x64 (the f16
// exponent of 1024), the offset (1032 or 1152) comes off exactly and the f16 scale multiplies with one
// rounding: the same values as the float path (an exact product rounded once to f16) in ~60% of its
// instructions, which bound this kernel (8B Q4_0 batched step at 64: 4,830 -> 5,376 t/s). q4_K and
// q6_K likewise with their scales rounded to f16 first; the other formats go through their float
// Dequant8.
template <class D>
__device__ __forceinline__ void dequant8(const unsigned char* raw, int k, uint32_t (&w)[4]) {
  if constexpr (std::is_same_v<D, Dequant8Q4_0> || std::is_same_v<D, Dequant8Q8_0>) {
    const uint8_t* b = raw + (k / D::kBlock) * D::kBytes;
    const int j0 = k % D::kBlock;
    const uint32_t d = load_u16_even(b);
    const uint32_t d2 = d | (d << 16);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      uint32_t v;
      if constexpr (std::is_same_v<D, Dequant8Q4_0>) {
        v = (load_u16_even(b + 2 + (j0 & 15) + 2 * e) >> (j0 < 16 ? 0 : 4)) & 0x0f0fu;  // codes 0..15
        w[e] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64086408u, d2);  // (1024 + q) - 1032
      } else {
        v = load_u16_even(b + 2 + j0 + 2 * e) ^ 0x8080u;  // int8 + 128
        w[e] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64806480u, d2);  // (1024 + u) - 1152
      }
    }
  } else if constexpr (std::is_same_v<D, Dequant8Q4_K> || std::is_same_v<D, Dequant8Q6_K>) {
    // The K-quants' sub-block scale (and q4_K's bias) rounded to f16 first, then one f16 fma or
    // product per pair: within about 2 f16 ulps of the float path's values (fast mode only).
    const uint8_t* b = raw + (k / D::kBlock) * D::kBytes;
    const int j0 = k % D::kBlock;
    if constexpr (std::is_same_v<D, Dequant8Q4_K>) {
      const int sb = j0 / 32;
      int sc, m;
      q4k_scale_min(sb, b + 4, sc, m);
      const float scale_f = fmul_rn(f16_to_float(load_u16_even(b)), static_cast<float>(sc));
      const float bias_f = fmul_rn(f16_to_float(load_u16_even(b + 2)), static_cast<float>(m));
      if (!(fabsf(scale_f) <= 65504.0f && fabsf(bias_f) <= 65504.0f)) {  // beyond f16: the float path
        float f[8];
        D::run(b, j0, f);
        for (int e = 0; e < 4; ++e) w[e] = pack_half2(f[2 * e], f[2 * e + 1]);
        return;
      }
      const __half2 scale = __float2half2_rn(scale_f);
      const __half2 nbias = __float2half2_rn(-bias_f);
      const uint8_t* q = b + 16 + (j0 / 64) * 32 + (j0 % 32);
      const int shift = (sb & 1) ? 4 : 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t v = (load_u16_even(q + 2 * e) >> shift) & 0x0f0fu;
        const uint32_t h = __byte_perm(v, 0x64646464u, 0x5140);  // 1024 + code
        __half2 x, c1024;
        const uint32_t k1024 = 0x64006400u;
        memcpy(&x, &h, 4);
        memcpy(&c1024, &k1024, 4);
        const __half2 r = __hfma2(__hsub2(x, c1024), scale, nbias);
        memcpy(&w[e], &r, 4);
      }
    } else {
      const int h = j0 / 128, c = (j0 % 128) / 32, l0 = j0 % 32;
      const uint8_t* ql = b + 64 * h + 32 * (c & 1) + l0;
      const uint8_t* qh = b + 128 + 32 * h + l0;
      const __half2 scale = __float2half2_rn(f16_to_float(load_u16_even(b + 208)) *
                                             static_cast<float>(static_cast<int8_t>(b[192 + j0 / 16])));
      uint32_t sc2;
      memcpy(&sc2, &scale, 4);
      const int shift = c < 2 ? 0 : 4;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t v = ((load_u16_even(ql + 2 * e) >> shift) & 0x0f0fu) |
                           (((load_u16_even(qh + 2 * e) >> (2 * c)) & 0x0303u) << 4);  // codes 0..63
        w[e] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64206420u, sc2);  // (1024 + q) - 1056
      }
    }
  } else {
    float f[8];
    D::run(raw + (k / D::kBlock) * D::kBytes, k % D::kBlock, f);
    w[0] = pack_half2(f[0], f[1]);
    w[1] = pack_half2(f[2], f[3]);
    w[2] = pack_half2(f[4], f[5]);
    w[3] = pack_half2(f[6], f[7]);
  }
}

// q4_K with the scales decoded once per chunk (kChunk = one block of each row): every thread takes
// one row (kBM == kThreads) and writes its 8 sub-blocks' d * sc (low half) and -(dmin * m) (high half)
// as f16; where one of them is beyond f16, the whole chunk takes the float path (returns true), for
// every thread alike. Before, each of the 4 threads sharing a row's 8 weights decoded them again at
// every dequant8 call (the 6-bit unpacking, two conversions, a range check).
__device__ __forceinline__ bool q4k_pre_scales(const unsigned char* row_block, uint32_t* s_sc) {
  static_assert(kBM == kThreads, "one row per thread");
  const uint8_t* b = row_block;
  const float d = f16_to_float(load_u16_even(b)), dmin = f16_to_float(load_u16_even(b + 2));
  bool wide = false;
#pragma unroll
  for (int sb = 0; sb < kChunk / 32; ++sb) {
    int sc, m;
    q4k_scale_min(sb, b + 4, sc, m);
    const float scale = fmul_rn(d, static_cast<float>(sc)), bias = fmul_rn(dmin, static_cast<float>(m));
    wide = wide || !(fabsf(scale) <= 65504.0f && fabsf(bias) <= 65504.0f);
    s_sc[sb * kBM + threadIdx.x] = pack_half2(scale, -bias);
  }
  return __syncthreads_or(wide) != 0;
}

// dequant8 for q4_K from a pre-decoded sub-block scale pair (q4k_pre_scales): the same f16 values.
__device__ __forceinline__ void dequant8_q4k_pre(const unsigned char* raw, int k, uint32_t sc_pair, uint32_t (&w)[4]) {
  const uint32_t scale2 = __byte_perm(sc_pair, 0, 0x1010), nbias2 = __byte_perm(sc_pair, 0, 0x3232);
  const uint8_t* q = raw + 16 + (k / 64) * 32 + (k % 32);
  const int shift = ((k / 32) & 1) ? 4 : 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t v = (load_u16_even(q + 2 * e) >> shift) & 0x0f0fu;
    const uint32_t h = __byte_perm(v, 0x64646464u, 0x5140);  // 1024 + code
    __half2 x, c1024, sc, nb;
    const uint32_t k1024 = 0x64006400u;
    memcpy(&x, &h, 4);
    memcpy(&c1024, &k1024, 4);
    memcpy(&sc, &scale2, 4);
    memcpy(&nb, &nbias2, 4);
    const __half2 r = __hfma2(__hsub2(x, c1024), sc, nb);
    memcpy(&w[e], &r, 4);
  }
}

template <class D>
__global__ void __launch_bounds__(kThreads, 1) gemm_q_kernel(GemmQArgs p) {
  // pdl_wait later: the first weight chunk is requested first (no kernel writes weights)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using S = Staging<D>;
  unsigned char* s_w = smem_raw;                                           // [2][kBM][kRawStride]
  auto* s_x = reinterpret_cast<__half*>(smem_raw + 2 * S::kWStageBytes);   // [2][kBN][kChunk], swizzled
  auto* s_sc = reinterpret_cast<uint32_t*>(smem_raw + 2 * (S::kWStageBytes + kXStageBytes));  // [8][kBM]
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, c = lane % 4;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBN, row0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * p.k_split;
  const int64_t k_end = p.k < k_begin + p.k_split ? p.k : k_begin + p.k_split;
  // This thread's rows: g and g + 8 of each of the warp's m16 tiles; misalign(r, k0): where row r's
  // segment of chunk k0 starts in its staged pieces.
  auto row_of = [&](int mt, int half) { return warp * 16 * kMTiles + mt * 16 + g + 8 * half; };
  auto misalign = [&](int r, int64_t k0) {
    const int64_t row = row0 + r < p.m ? row0 + r : 0;
    return static_cast<int>(reinterpret_cast<uintptr_t>(p.a + row * p.a_nb1 + (k0 / D::kBlock) * D::kBytes) & 15);
  };

  load_w<D>(p, row0, k_begin, s_w);
  pdl_wait();
  load_x(p, col0, k_begin, s_x);
  cp_async_commit();

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int i = 0; i < kNTiles; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.0f;

  int stage = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kChunk, stage ^= 1) {
    if (k0 + kChunk < k_end) {
      load_w<D>(p, row0, k0 + kChunk, s_w + (stage ^ 1) * S::kWStageBytes);
      load_x(p, col0, k0 + kChunk, s_x + (stage ^ 1) * kBN * kChunk);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this stage's bytes (the next stage's may still be in flight)
    __syncthreads();
    const unsigned char* w_rows[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row_of(mt, hf);
        w_rows[mt][hf] = s_w + stage * S::kWStageBytes + r * S::kRawStride + misalign(r, k0);
      }
    bool pre = false;  // q4_K: scales decoded once for the chunk
    if constexpr (S::kPreScales) if (p.pre_scales) {
      const int r = static_cast<int>(threadIdx.x);
      pre = !q4k_pre_scales(s_w + stage * S::kWStageBytes + r * S::kRawStride + misalign(r, k0), s_sc);
    }
    // column g of each n8 tile (g's parity, hence the swizzle, is the same in every tile)
    const __half* xs = s_x + stage * kBN * kChunk + g * kChunk + 8 * c;
    const int sw = (g & 1) << 2;
#pragma unroll 1
    for (int j = 0; j < kChunk / 32; ++j) {
      uint32_t a0[kMTiles][4], a1[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        uint32_t wl[4], wh[4];
        if (pre) {
          dequant8_q4k_pre(w_rows[mt][0], 32 * j + 8 * c, s_sc[j * kBM + row_of(mt, 0)], wl);
          dequant8_q4k_pre(w_rows[mt][1], 32 * j + 8 * c, s_sc[j * kBM + row_of(mt, 1)], wh);
        } else {
          dequant8<D>(w_rows[mt][0], 32 * j + 8 * c, wl);
          dequant8<D>(w_rows[mt][1], 32 * j + 8 * c, wh);
        }
        a0[mt][0] = wl[0], a0[mt][1] = wh[0], a0[mt][2] = wl[1], a0[mt][3] = wh[1];
        a1[mt][0] = wl[2], a1[mt][1] = wh[2], a1[mt][2] = wl[3], a1[mt][3] = wh[3];
      }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xs + nt * 8 * kChunk + 8 * ((4 * j) ^ sw));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816(acc[mt][nt], a0[mt], xv.x, xv.y);
          mma_16816(acc[mt][nt], a1[mt], xv.z, xv.w);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // C fragment: rows g, g + 8 of each m16 tile, columns 2c, 2c + 1 of each n8 tile.
  float* out = p.out + static_cast<int64_t>(blockIdx.z) * p.m * p.n;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + row_of(mt, e / 2);
        const int64_t col = col0 + nt * 8 + 2 * c + (e & 1);
        if (row < p.m && col < p.n) out[col * p.m + row] = acc[mt][nt][e];
      }
}

// dst[i] = sum over splits s = 0, 1, ... of part[s][i], in that order.
__global__ void gemm_q_reduce_kernel(float* dst, const float* part, int64_t count, int splits) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = part[i];
    for (int j = 1; j < splits; ++j) s += part[j * count + i];
    dst[i] = s;
  }
}

bool pre_scales_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LOOM_CUDA_GEMM_Q_PRESCALES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

struct GemmQShape {
  int64_t m, n, k, col_tiles, row_tiles;
  int splits;
  int64_t k_split;
};

GemmQShape shape_of(const Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  GemmQShape s{a->ne[1], b->ne[1] * b->ne[2] * b->ne[3], a->ne[0], 0, 0, 1, 0};
  s.col_tiles = (s.n + kBN - 1) / kBN;
  s.row_tiles = (s.m + kBM - 1) / kBM;
  const int64_t chunks = s.k / kChunk;
  const int64_t want = (kTargetBlocks + s.col_tiles * s.row_tiles - 1) / (s.col_tiles * s.row_tiles);
  const int64_t per_split = (chunks + std::clamp<int64_t>(want, 1, kMaxSplits) - 1) / std::clamp<int64_t>(want, 1, kMaxSplits);
  s.k_split = per_split * kChunk;
  s.splits = static_cast<int>((chunks + per_split - 1) / per_split);
  return s;
}

}  // namespace

bool gemm_q_supported(const Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  if (!dtype_is_quantized(a->type) || a->ne[2] != 1 || a->ne[3] != 1 || !dst->is_contiguous()) return false;
  if (a->ne[0] <= 0 || a->ne[0] % kChunk != 0 || b->ne[0] != a->ne[0]) return false;
  const GemmQShape s = shape_of(dst);
  return s.col_tiles <= INT32_MAX && s.row_tiles <= kMaxGridYZ;
}

size_t gemm_q_partial_bytes(const Tensor* dst) {
  const GemmQShape s = shape_of(dst);
  return s.splits > 1 ? static_cast<size_t>(s.splits) * static_cast<size_t>(s.m * s.n) * sizeof(float) : 0;
}

CudaError launch_gemm_q(const LaunchContext& ctx, const Tensor* dst, const __half* x16, float* partial) {
  const Tensor* a = dst->src[0];
  const GemmQShape s = shape_of(dst);
  if (s.splits > 1 && !partial)
    return CudaError::runtime(cudaErrorInvalidValue, "mul_mat: no scratch for the split sums", __FILE__, __LINE__);
  GemmQArgs p{s.splits > 1 ? partial : static_cast<float*>(dst->data), static_cast<const char*>(a->data),
              static_cast<int64_t>(a->nb[1]), x16, s.m, s.n, s.k, s.k_split,
              static_cast<const char*>(a->data) + (s.m - 1) * static_cast<int64_t>(a->nb[1]) +
                  static_cast<int64_t>(a->ne[0] / dtype_block_size(a->type) * dtype_type_size(a->type)),
              pre_scales_enabled()};
  const dim3 grid(static_cast<unsigned>(s.col_tiles), static_cast<unsigned>(s.row_tiles),
                  static_cast<unsigned>(s.splits));
  const CudaError e = visit_quant_type(
      a->type, CudaError::runtime(cudaErrorInvalidValue, "mul_mat: not a quantized weight", __FILE__, __LINE__),
      [&](auto q) -> CudaError {
        auto* kernel = gemm_q_kernel<typename decltype(q)::Dequant8>;
        constexpr size_t smem = Staging<typename decltype(q)::Dequant8>::kSmemBytes;
        static_assert(smem <= 227 * 1024);
        LOOM_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kThreads, smem, ctx.stream>>>(p);
        LOOM_CUDA_CHECK_LAUNCH("gemm_q_kernel");
        return {};
      });
  if (!e.ok() || s.splits == 1) return e;
  constexpr int kReduceThreads = 256;
  gemm_q_reduce_kernel<<<grid_for(s.m * s.n, kReduceThreads), kReduceThreads, 0, ctx.stream>>>(
      static_cast<float*>(dst->data), partial, s.m * s.n, s.splits);
  LOOM_CUDA_CHECK_LAUNCH("gemm_q_reduce_kernel");
  return {};
}

}  // namespace loom::cuda
