// gemm_q's shared pieces (gemm_q.cu's mma.sync kernel and gemm_q_wgmma.cu's warpgroup kernel): the
// block's tiling, the stages' staging (tensor copies, bulk copies, cp.async pieces) and the
// dequantization of eight weights into f16 pairs. Included by those two files only.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "common.cuh"
#include "gemm_q_plan.h"
#include "loom/tensor.h"
#include "mma.cuh"
#include "quant.cuh"
#include "tensor_map.h"

namespace loom::cuda::gemm_q_detail {

// A block: kBM = 256 weight rows, kMT m16 tiles per warp (each activation load feeds 2 x kMT mma),
// so 16 / kMT warps.
constexpr int kBM = gemm_q_plan::kBM;
template <int kMT>
constexpr int kThreadsOf = kBM / (16 * kMT) * kWarpSize;
constexpr int kBN = gemm_q_plan::kBN;  // columns per block
constexpr int kNTiles = kBN / 8;  // n8 tiles per warp
constexpr int kChunk = gemm_q_plan::kChunk;  // k per shared-memory stage

// Per stage, the chunk's segment of each of the kBM weight rows (kSegBytes) and kBN columns of kChunk
// f16 activations. Formats whose segment is a multiple of 16 bytes (q4_0, q4_K, q8_0, ...; rows
// 16-byte aligned, gemm_q_supported) are staged by the SM's copy engine, completing on an mbarrier per
// stage: the weight rows by one 2-D tensor copy where the segment fits its box (Staging::kTma: q4_0, q5_K,
// q4_K), else one cp.async.bulk per row; the activations one per column. Rows then start 16-byte
// aligned (q4_K's codes in one 8-byte load). The others copy 16-byte cp.async pieces from each
// segment's aligned start (up to 15 bytes before it: one piece more). Measured (ncu, H200, [14336, 64]
// q4_K), per-row bulk copies alone changed nothing against the pieces (64.4 -> 65.0 us): the pieces'
// addresses cost ~400 of a chunk's ~1,800 instructions per warp, and the compiler serializes the bulk
// copies of a warp's lanes through one elected lane (~350); the tensor copy removes both (41.6 -> 39.9).
// Row stride seg + 16 bytes (q4_K: 160, 8 banks apart: a half-warp's eight-byte loads of rows g, g+1,
// .. hit different banks). Activation columns: bulk, 576 bytes apart (odd columns 16 banks over, so the
// two columns one 8-lane phase of a 16-byte load reads fall on different banks); cp.async, 512 bytes
// apart with the 16-byte pieces of odd columns swizzled (piece ^ 4) for the same effect.
template <class D>
struct Staging {
  static constexpr int kSegBytes = kChunk / D::kBlock * D::kBytes;
  static constexpr bool kBulk = kSegBytes % 16 == 0;
  static constexpr int kRawPieces = (kSegBytes + 15) / 16 + 1;
  static constexpr int kRawStride = 16 * kRawPieces;
  static constexpr size_t kWStageBytes = size_t{kBM} * kRawStride;
  /// The tensor copy's box is a row's segment and the next 16 bytes (the row stride here; zero past
  /// the row's end), at most 256 bytes.
  static constexpr bool kTma = kBulk && kRawStride <= 256;
  /// A segment that is not a multiple of 16 bytes fits a tensor copy's box too, from the 16 bytes that
  /// hold its first byte (kRawStride covers the misalignment): the warpgroup kernel's kViaTma form
  /// (q6_K, q3_K, q2_K, iq4_xs).
  static constexpr bool kTmaUnaligned = !kBulk && kRawStride <= 256;
  static constexpr int kXStride = kBulk ? kChunk + 32 : kChunk;  // halves between columns
  static constexpr size_t kXStageBytes = size_t{kBN} * kXStride * sizeof(__half);
  /// q4_K: the chunk's sub-block scale and negated bias of each row as f16 pairs (PreScales).
  static constexpr bool kPreScales = std::is_same_v<D, Dequant8Q4_K>;
  static constexpr size_t kScaleBytes = kPreScales ? size_t{kBM} * (kChunk / 32) * sizeof(uint32_t) : 0;
  static_assert(!kPreScales || kBulk, "q4k_pre_scales reads rows staged from their start");
  static constexpr size_t kBarBytes = kBulk ? 2 * sizeof(uint64_t) : 0;
  static constexpr size_t kSmemBytes = 2 * (kWStageBytes + kXStageBytes) + kScaleBytes + kBarBytes;
};
__device__ __forceinline__ int x_piece(int col, int piece) { return piece ^ ((col & 1) << 2); }


constexpr int kMaxParts = gemm_q_plan::kMaxParts;

/// One product of a multi-part launch (products of one activation with weights of one type, their
/// row tiles one after another along blockIdx.y): its weights, rows and where its sums go.
struct GemmQPart {
  const char* a;
  const char* a_end;
  float* out;
  int64_t m, ldo;
  int64_t tile0;  // its first row tile
};

struct GemmQArgs {
  float* out;       // splits == 1: dst [n][ldo]; else partial sums [splits][n][ldo], split_stride apart
  const char* a;    // weight rows, a_nb1 bytes apart
  int64_t a_nb1;
  const __half* x;  // activations [n][k] f16, contiguous (the warpgroup kernel: its packed tiles)
  int64_t m, n, k;
  int64_t k_split;  // k per split, a multiple of kChunk
  const char* a_end;  // one past the weights' last byte
  int64_t ldo;           // elements between output columns (m, or the parts' rows together)
  int64_t split_stride;  // elements between splits' partial sums
  bool pre_scales;    // q4_K: decode the scales once per chunk (LOOM_CUDA_GEMM_Q_PRESCALES=0: per dequant8)
  bool tma;           // the weights by one 2-D tensor copy per stage (LOOM_CUDA_GEMM_Q_TMA=0: a bulk copy a row)
  int parts;          // > 1: a multi-part launch (part[], enter_part); the fields above then hold part 0
  GemmQPart part[kMaxParts];
};

// A multi-part launch's block takes its part's weights, rows and output (by its row tile, selected
// field by field so that nothing is indexed dynamically); returns the part and the block's first row
// within it.
__device__ __forceinline__ int enter_part(GemmQArgs& p, int64_t& row0) {
  const int64_t y = blockIdx.y;
  const int i = p.parts > 2 && y >= p.part[2].tile0 ? 2 : y >= p.part[1].tile0 ? 1 : 0;
  auto pick = [&](auto GemmQPart::*f) { return i == 0 ? p.part[0].*f : i == 1 ? p.part[1].*f : p.part[2].*f; };
  p.a = pick(&GemmQPart::a);
  p.a_end = pick(&GemmQPart::a_end);
  p.out = pick(&GemmQPart::out);
  p.m = pick(&GemmQPart::m);
  p.ldo = pick(&GemmQPart::ldo);
  row0 = (y - pick(&GemmQPart::tile0)) * kBM;
  return i;
}

template <int kMT>
__device__ __forceinline__ void load_x(const GemmQArgs& p, int64_t col0, int64_t k0, __half* s_x) {
  constexpr int kThreads = kThreadsOf<kMT>, kXCopies = kBN * kChunk / 8 / kThreads;  // 16-byte pieces a thread
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
template <class D, int kMT>
__device__ __forceinline__ void load_w(const GemmQArgs& p, int64_t row0, int64_t k0, unsigned char* s_w) {
  using S = Staging<D>;
  for (int i = static_cast<int>(threadIdx.x); i < kBM * S::kRawPieces; i += kThreadsOf<kMT>) {
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

// A 2-D tensor copy (Hopper's TMA): box {bytes, rows} at {byte x, row y} of the map's [rows][bytes]
// weights into shared memory (dense rows of the box's bytes), completing on bar; parts past the
// tensor are zero-filled and counted.
__device__ __forceinline__ void tensor_copy_2d(void* smem, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}

// Bulk staging of chunk k0 (Staging::kBulk): thread r copies weight row r's segment, threads below
// kBN a column's activations; arm_stage (thread 0) makes the stage's mbarrier expect their bytes.
// Rows past m and columns past n are not copied (their stale values reach only outputs that are not
// stored). Where the format's row segment fits a tensor copy's box (Staging::kTma: q4_0, q4_K),
// thread 0 copies all the weight rows of a stage with one 2-D tensor copy (box kRawStride x kBM,
// counted whole, zeros past the tensor) instead of a bulk copy per row, which the compiler serializes
// through one elected lane per warp: ncu, H200, q4_K at 64 columns, [14336, 4096] 41.6 -> 39.9 us,
// [4096, 14336] 37.6 -> 36.0 us. LOOM_CUDA_GEMM_Q_TMA=0 keeps the per-row copies.
template <class D>
__device__ __forceinline__ void issue_w_bulk(const GemmQArgs& p, const CUtensorMap* map, int64_t row0, int64_t k0,
                                             unsigned char* s_w, uint64_t* bar) {
  using S = Staging<D>;
  if constexpr (S::kTma) {
    if (p.tma) {
      if (threadIdx.x == 0)
        tensor_copy_2d(s_w, map, static_cast<int>((k0 / D::kBlock) * D::kBytes), static_cast<int>(row0), bar);
      return;
    }
  }
  const int r = static_cast<int>(threadIdx.x);
  if (r < kBM && row0 + r < p.m)
    bulk_copy(s_w + r * S::kRawStride, p.a + (row0 + r) * p.a_nb1 + (k0 / D::kBlock) * D::kBytes, S::kSegBytes, bar);
}
template <class D>
__device__ __forceinline__ void issue_x_bulk(const GemmQArgs& p, int64_t col0, int64_t k0, __half* s_x, uint64_t* bar) {
  const int col = static_cast<int>(threadIdx.x);
  if (col < kBN && col0 + col < p.n)
    bulk_copy(s_x + col * Staging<D>::kXStride, p.x + (col0 + col) * p.k + k0, kChunk * sizeof(__half), bar);
}
template <class D>
__device__ __forceinline__ void arm_stage(const GemmQArgs& p, int64_t row0, int64_t col0, uint64_t* bar) {
  if (threadIdx.x == 0) {
    using S = Staging<D>;
    const int64_t rows = p.m - row0 < kBM ? p.m - row0 : kBM, cols = p.n - col0 < kBN ? p.n - col0 : kBN;
    const int64_t w_bytes = S::kTma && p.tma ? int64_t{kBM} * S::kRawStride : rows * S::kSegBytes;
    mbar_arrive_expect(bar, static_cast<unsigned>(w_bytes + cols * kChunk * sizeof(__half)));
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

// (h - sub) * mul + add on f16x2 registers: the exact subtraction, then one fma.
__device__ __forceinline__ uint32_t h2_sub_fma(uint32_t h, uint32_t sub, __half2 mul, __half2 add) {
  __half2 x, y;
  memcpy(&x, &h, 4);
  memcpy(&y, &sub, 4);
  const __half2 r = __hfma2(__hsub2(x, y), mul, add);
  uint32_t out;
  memcpy(&out, &r, 4);
  return out;
}

/// Weights j0 .. j0 + 7 of block b through the format's float Dequant8, each pair rounded to f16: the
/// formats without an f16 path, and a block whose f16 path's scale lies beyond f16's range.
template <class D>
__device__ __forceinline__ void dequant8_float(const uint8_t* b, int j0, uint32_t (&w)[4]) {
  float f[8];
  D::run(b, j0, f);
  for (int e = 0; e < 4; ++e) w[e] = pack_half2(f[2 * e], f[2 * e + 1]);
}

/// q6_K's eight weights 128 h + 32 c + l0 .. + 7 of block b (l0 a multiple of 8) as four f16x2: the
/// low nibbles (c < 2) or high ones of ql, two bits of qh at 2 c, one int8 scale a 16 (j0 / 16 =
/// 8 h + 2 c + l0 / 16) times d, rounded to f16 first.
template <bool kWords = false>
__device__ __forceinline__ void dequant8_q6k_at(const uint8_t* b, int h, int c, int l0, uint32_t (&w)[4]) {
  const uint8_t* ql = b + 64 * h + 32 * (c & 1) + l0;
  const uint8_t* qh = b + 128 + 32 * h + l0;
  const __half2 scale = __float2half2_rn(f16_to_float(load_u16_even(b + 208)) *
                                         static_cast<float>(static_cast<int8_t>(b[192 + 8 * h + 2 * c + l0 / 16])));
  uint32_t sc2;
  memcpy(&sc2, &scale, 4);
  const int shift = c < 2 ? 0 : 4;
  if constexpr (kWords) {
    // ql's and qh's eight bytes as two words each, cut by a funnel shift (0 or 16 bits) out of the three
    // aligned words around them (210-byte blocks start 2-byte aligned; the third word stays inside the
    // block), the codes made four at a time: the warpgroup kernel's q6_K step ~100 -> ~86 instructions
    // (SASS, stop 51; in the mma.sync kernel, at its 128-register bound, it spilled: 16-bit pairs there)
    auto words8 = [](const uint8_t* p, uint32_t (&out)[2]) {
      const auto* a = reinterpret_cast<const uint32_t*>(p - (reinterpret_cast<uintptr_t>(p) & 2u));
      const unsigned sh = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 2u) * 8u;
      const uint32_t w0 = a[0], w1 = a[1], w2 = a[2];
      out[0] = __funnelshift_r(w0, w1, sh);
      out[1] = __funnelshift_r(w1, w2, sh);
    };
    uint32_t lw[2], hw[2];
    words8(ql, lw);
    words8(qh, hw);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = ((lw[i] >> shift) & 0x0f0f0f0fu) | (((hw[i] >> (2 * c)) & 0x03030303u) << 4);  // codes 0..63
      w[2 * i] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64206420u, sc2);      // (1024 + q) - 1056
      w[2 * i + 1] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x7362), 0x64206420u, sc2);  // bytes 2, 3
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t v = ((load_u16_even(ql + 2 * e) >> shift) & 0x0f0fu) |
                         (((load_u16_even(qh + 2 * e) >> (2 * c)) & 0x0303u) << 4);  // codes 0..63
      w[e] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64206420u, sc2);  // (1024 + q) - 1056
    }
  }
}

/// The formats dequant8 decodes straight to f16 pairs (all but mxfp4, whose power-of-two scale lies past
/// f16's range: its float Dequant8): gemm_q's unrolled-by-two form and the warpgroup kernel take them.
template <class D>
constexpr bool kF16Dequant = std::is_same_v<D, Dequant8Q4_K> || std::is_same_v<D, Dequant8Q4_0> ||
                             std::is_same_v<D, Dequant8Q8_0> || std::is_same_v<D, Dequant8Q6_K> ||
                             std::is_same_v<D, Dequant8Of<FormatQ5_K>> || std::is_same_v<D, Dequant8Of<FormatIQ4_XS>> ||
                             std::is_same_v<D, Dequant8Of<FormatQ3_K>> || std::is_same_v<D, Dequant8Of<FormatQ2_K>> ||
                             std::is_same_v<D, Dequant8Of<FormatQ4_1>> || std::is_same_v<D, Dequant8Of<FormatQ5_0>> ||
                             std::is_same_v<D, Dequant8Of<FormatQ5_1>> || std::is_same_v<D, Dequant8Of<FormatIQ4_NL>>;

// Eight weights k .. k+7 (k relative to the chunk) of a staged row as four f16x2. q4_0 and q8_0 work
// on f16 pairs directly: two 8-bit codes become 1024 + code in one byte permute with 0x64 (the f16
// exponent of 1024), the offset (1032 or 1152) comes off exactly and the f16 scale multiplies with one
// rounding: the same values as the float path (an exact product rounded once to f16) in ~60% of its
// instructions, which bound this kernel (8B Q4_0 batched step at 64: 4,830 -> 5,376 t/s); q4_1, q5_0,
// q5_1 and iq4_nl likewise (their f16 scales as they are, q4_1's and q5_1's offsets by an fma). The
// K-quants and iq4_xs with their scales rounded to f16 first; mxfp4 (a power-of-two scale past f16's
// range) through its float Dequant8.
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
  } else if constexpr (std::is_same_v<D, Dequant8Q4_K> || std::is_same_v<D, Dequant8Q6_K> ||
                       std::is_same_v<D, Dequant8Of<FormatQ5_K>>) {
    // The K-quants' sub-block scale (and q4_K's and q5_K's bias) rounded to f16 first, then one f16 fma
    // or product per pair: within about 2 f16 ulps of the float path's values (fast mode only).
    const uint8_t* b = raw + (k / D::kBlock) * D::kBytes;
    const int j0 = k % D::kBlock;
    if constexpr (!std::is_same_v<D, Dequant8Q6_K>) {
      // q4_K, q5_K: header (d, dmin, 12 scale bytes), then q5_K's fifth bits (bit s of byte 16 + l:
      // sub-block s's code l), then the nibbles of sub-blocks 2 p and 2 p + 1 in 32 bytes at 16 or 48
      constexpr bool kQ5 = std::is_same_v<D, Dequant8Of<FormatQ5_K>>;
      const int sb = j0 / 32;
      int sc, m;
      q4k_scale_min(sb, b + 4, sc, m);
      const float scale_f = fmul_rn(f16_to_float(load_u16_even(b)), static_cast<float>(sc));
      const float bias_f = fmul_rn(f16_to_float(load_u16_even(b + 2)), static_cast<float>(m));
      if (!(fabsf(scale_f) <= 65504.0f && fabsf(bias_f) <= 65504.0f)) {  // beyond f16: the float path
        dequant8_float<D>(b, j0, w);
        return;
      }
      const __half2 scale = __float2half2_rn(scale_f);
      const __half2 nbias = __float2half2_rn(-bias_f);
      const uint8_t* q = b + (kQ5 ? 48 : 16) + (j0 / 64) * 32 + (j0 % 32);
      const int shift = (sb & 1) ? 4 : 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        uint32_t v = (load_u16_even(q + 2 * e) >> shift) & 0x0f0fu;
        if constexpr (kQ5) v |= ((load_u16_even(b + 16 + j0 % 32 + 2 * e) >> sb) & 0x0101u) << 4;  // codes 0..31
        w[e] = h2_sub_fma(__byte_perm(v, 0x64646464u, 0x5140), 0x64006400u, scale, nbias);  // (1024 + code) - 1024
      }
    } else {
      dequant8_q6k_at(b, j0 / 128, (j0 % 128) / 32, j0 % 32, w);
    }
  } else if constexpr (std::is_same_v<D, Dequant8Of<FormatQ3_K>> || std::is_same_v<D, Dequant8Of<FormatQ2_K>>) {
    // q3_K, q2_K: 2-bit codes of element 128 h + 32 c + l in bits 2 c of byte 32 h + l (at 32 / 16); q3_K's
    // third bit c + 4 h of hmask byte l (its code lo + 4 hbit - 4), one scale a 16 elements (q3_K: d (sc -
    // 32); q2_K: d sc and the bias dmin m) rounded to f16 first, as the other K-quants'. Blocks (110 / 84
    // bytes) start 2-byte aligned, staged or not; j0 .. j0 + 7 share their 16 elements' scale.
    constexpr bool kQ3 = std::is_same_v<D, Dequant8Of<FormatQ3_K>>;
    const uint8_t* b = raw + (k / D::kBlock) * D::kBytes;
    const int j0 = k % D::kBlock, c4 = j0 / 32, l0 = j0 % 32;
    float scale_f, bias_f = 0.0f;
    if constexpr (kQ3) {
      scale_f = fmul_rn(f16_to_float(load_u16_even(b + 108)), static_cast<float>(q3k_scale_of(j0 / 16, b + 96) - 32));
    } else {
      const int sm = b[j0 / 16];
      scale_f = fmul_rn(f16_to_float(load_u16_even(b + 80)), static_cast<float>(sm & 0xF));
      bias_f = fmul_rn(f16_to_float(load_u16_even(b + 82)), static_cast<float>(sm >> 4));
    }
    if (!(fabsf(scale_f) <= 65504.0f && fabsf(bias_f) <= 65504.0f)) {  // beyond f16: the float path
      dequant8_float<D>(b, j0, w);
      return;
    }
    const __half2 scale = __float2half2_rn(scale_f);
    const __half2 nbias = __float2half2_rn(-bias_f);
    const uint8_t* q = b + (kQ3 ? 32 : 16) + 32 * (j0 / 128) + l0;
    const int shift = 2 * (c4 % 4);
    const uint32_t k_off = kQ3 ? 0x64046404u : 0x64006400u;  // 1028 (codes 0..7 less 4) or 1024
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      uint32_t v = (load_u16_even(q + 2 * e) >> shift) & 0x0303u;
      if constexpr (kQ3) v |= ((load_u16_even(b + l0 + 2 * e) >> c4) & 0x0101u) << 2;  // codes 0..7
      w[e] = h2_sub_fma(__byte_perm(v, 0x64646464u, 0x5140), k_off, scale, nbias);  // (1024 + code) - k_off
    }
  } else if constexpr (std::is_same_v<D, Dequant8Of<FormatQ4_1>> || std::is_same_v<D, Dequant8Of<FormatQ5_0>> ||
                       std::is_same_v<D, Dequant8Of<FormatQ5_1>> || std::is_same_v<D, Dequant8Of<FormatIQ4_NL>>) {
    // The other 32-weight formats, as q4_0: their scale d (and q4_1's, q5_1's offset m) already f16, the
    // codes (with q5_0's, q5_1's fifth bit j of qh, iq4_nl's through its code book) as 1024 + code in
    // one byte permute, then one f16 product (q5_0: code - 16; iq4_nl: entry + 128 less 1152) or fma
    // (d code + m) a pair. Blocks (20, 22, 24, 18 bytes) start 2-byte aligned, staged or not.
    constexpr bool kQ41 = std::is_same_v<D, Dequant8Of<FormatQ4_1>>, kQ50 = std::is_same_v<D, Dequant8Of<FormatQ5_0>>,
                   kQ51 = std::is_same_v<D, Dequant8Of<FormatQ5_1>>;
    constexpr bool kMin = kQ41 || kQ51, kFifth = kQ50 || kQ51, kBook = !(kQ41 || kQ50 || kQ51);
    constexpr int kQs = kQ41 ? 4 : kQ50 ? 6 : kQ51 ? 8 : 2, kQh = kQ50 ? 2 : 4;  // byte offsets: codes, fifth bits
    const uint8_t* b = raw + (k / D::kBlock) * D::kBytes;
    const int j0 = k % D::kBlock;
    const uint32_t d = load_u16_even(b);
    const uint32_t d2 = d | (d << 16);
    uint32_t m2 = 0, qh = 0;
    if constexpr (kMin) m2 = load_u16_even(b + 2) | (load_u16_even(b + 2) << 16);
    if constexpr (kFifth) qh = load_u16_even(b + kQh) | (load_u16_even(b + kQh + 2) << 16);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + 2 * e;  // the pair's first element
      uint32_t v = (load_u16_even(b + kQs + (j0 & 15) + 2 * e) >> (j0 < 16 ? 0 : 4)) & 0x0f0fu;  // codes 0..15
      if constexpr (kFifth) v |= (((qh >> j) & 1u) << 4) | (((qh >> (j + 1)) & 1u) << 12);     // 0..31
      if constexpr (kBook) {
        v = (book_lookup4(iq4nl_book(), v) ^ 0x8080u) & 0xffffu;  // two entries, int8 + 128
        w[e] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64806480u, d2);  // (1024 + u) - 1152
      } else if constexpr (kMin) {
        __half2 dh, mh;
        memcpy(&dh, &d2, 4);
        memcpy(&mh, &m2, 4);
        w[e] = h2_sub_fma(__byte_perm(v, 0x64646464u, 0x5140), 0x64006400u, dh, mh);  // d code + m
      } else {
        w[e] = h2_sub_mul(__byte_perm(v, 0x64646464u, 0x5140), 0x64106410u, d2);  // (1024 + q) - 1040
      }
    }
  } else if constexpr (std::is_same_v<D, Dequant8Of<FormatIQ4_XS>>) {
    // iq4_xs: the sub-block's scale d (ls - 32) rounded to f16 first (as the K-quants'), the code book's
    // int8 entries (four lookups a word of nibbles) as 1152 + v in f16 pairs, 1152 off exactly, one
    // rounding of the product. Blocks (136 bytes) start 8-byte aligned, staged or not; the nibbles of
    // weights j0 .. j0 + 7 are 8 bytes at 8 + 16 s + j0 % 16 (low nibbles below j0 % 32 = 16, else high).
    const uint8_t* b = raw + (k / D::kBlock) * D::kBytes;
    const int j0 = k % D::kBlock, s = j0 / 32;
    const float scale_f = fmul_rn(f16_to_float(load_u16_even(b)), static_cast<float>(iq4xs_scale_of(s, b) - 32));
    if (!(fabsf(scale_f) <= 65504.0f)) {  // beyond f16: the float path
      dequant8_float<D>(b, j0, w);
      return;
    }
    const uint32_t d = __half_as_ushort(__float2half_rn(scale_f));
    const uint32_t d2 = d | (d << 16);
    const auto* q = reinterpret_cast<const uint32_t*>(b + 8 + 16 * s + j0 % 16);
    const int shift = j0 % 32 < 16 ? 0 : 4;
    const CodeBook16 book = iq4nl_book();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t c = book_lookup4(book, (q[h] >> shift) & 0x0f0f0f0fu) ^ 0x80808080u;  // int8 + 128
      w[2 * h] = h2_sub_mul(__byte_perm(c, 0x64646464u, 0x5140), 0x64806480u, d2);      // (1024 + u) - 1152
      w[2 * h + 1] = h2_sub_mul(__byte_perm(c, 0x64646464u, 0x7362), 0x64806480u, d2);  // bytes 2, 3
    }
  } else {
    dequant8_float<D>(raw + (k / D::kBlock) * D::kBytes, k % D::kBlock, w);
  }
}

/// dequant8 of weights 32 j + 8 c .. + 7 of the chunk, with the k32 step j and the quad's thread c
/// (< 4) apart: where the caller unrolls its steps, q6_K's offsets and shifts become constants (from
/// k = 32 j + 8 c the compiler computed them per step, not knowing c < 4). The same values.
// (kWords: q6_K's codes from words, dequant8_q6k_at<true>)
template <class D, bool kWords = false>
__device__ __forceinline__ void dequant8_jc(const unsigned char* raw, int j, int c, uint32_t (&w)[4]) {
  if constexpr (std::is_same_v<D, Dequant8Q6_K>) {
    const int jb = j % (D::kBlock / 32);  // the step within its block
    dequant8_q6k_at<kWords>(raw + (32 * j / D::kBlock) * D::kBytes, jb / 4, jb % 4, 8 * c, w);
  } else {
    dequant8<D>(raw, 32 * j + 8 * c, w);
  }
}

/// Whether v holds in any thread of the caller's warpgroup (its 128 threads, every one calling): a named
/// barrier (id 1 + the warpgroup; __syncthreads takes 0) that ORs their predicates.
__device__ __forceinline__ bool warpgroup_any(bool v) {
  const uint32_t wg = threadIdx.x / 128;
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(v)), "r"(1 + wg)
      : "memory");
  return r != 0;
}

// q4_K with the scales decoded once per chunk (kChunk = one block of each row), by the warp whose
// rows they are: its kRows rows' 8 sub-blocks' d * sc (low half) and -(dmin * m) (high half) as f16,
// kRows / 4 sub-blocks a lane. Where one of them is beyond f16, the warp takes the float path for the
// chunk (returns true, alike in every lane). Rows past m (stale bytes) take no part in that choice.
// Before, each of the 4 threads sharing a row's 8 weights decoded them again at every dequant8 call;
// and a block-wide vote here held every warp at the slowest one each chunk (ncu: 10% of the stalls).
// (kGroupVote: the vote is over the caller's warpgroup, every thread of which calls, not over the warp)
//
// The row's head (d, dmin and the 12 scale bytes) in one 16-byte load, a lane's four sub-blocks' 6-bit
// scales and mins cut out of its three words at once (sub-blocks 0-3: bytes 0-3 and 4-7 masked; 4-7: the
// low and high nibbles of bytes 8-11 with the top two bits of bytes 0-3 and 4-7), turned into f16 pairs
// exactly (1024 + x, less 1024) and multiplied by d and -dmin in f16: the exact product rounded once, as
// the float product (exact: 11 x 6 bits) rounded to f16 was, so the same bits. Whether one is beyond f16
// is decided on the largest scale and min, in float as before. Before: 12 byte loads and per sub-block
// the integer decoding, two conversions and float products (~100 instructions a lane and chunk).
template <class S, int kMT, bool kGroupVote = false>
__device__ __forceinline__ bool q4k_pre_scales(const unsigned char* stage_w, int warp, int lane, int64_t rows_left,
                                               uint32_t* s_sc) {
  constexpr int kRows = 16 * kMT, kLanesPerRow = kWarpSize / kRows, kSbPerLane = (kChunk / 32) / kLanesPerRow;
  static_assert(kSbPerLane % 4 == 0, "a lane takes whole groups of four sub-blocks");
  const int r = warp * kRows + lane % kRows, sb0 = lane / kRows * kSbPerLane;
  const uint4 head = *reinterpret_cast<const uint4*>(stage_w + r * S::kRawStride);  // rows start 16-byte aligned
  const uint32_t w0 = head.y, w1 = head.z, w2 = head.w;
  auto as_h2 = [](uint32_t u) {
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
  };
  const __half2 d2 = as_h2(__byte_perm(head.x, 0, 0x1010)), nm2 = as_h2(__byte_perm(head.x, 0, 0x3232) ^ 0x80008000u);
  const __half2 k1024 = as_h2(0x64006400u);
  const float d_abs = fabsf(__low2float(d2)), m_abs = fabsf(__low2float(nm2));
  bool wide = false;
#pragma unroll
  for (int q = 0; q < kSbPerLane / 4; ++q) {
    const int sb = sb0 + 4 * q;  // 0 or 4
    const uint32_t sc4 = sb == 0 ? (w0 & 0x3f3f3f3fu) : ((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u));
    const uint32_t m4 = sb == 0 ? (w1 & 0x3f3f3f3fu) : (((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u));
    const __half2 sc01 = __hsub2(as_h2(__byte_perm(sc4, 0x64646464u, 0x5140)), k1024),
                  sc23 = __hsub2(as_h2(__byte_perm(sc4, 0x64646464u, 0x7362)), k1024),
                  m01 = __hsub2(as_h2(__byte_perm(m4, 0x64646464u, 0x5140)), k1024),
                  m23 = __hsub2(as_h2(__byte_perm(m4, 0x64646464u, 0x7362)), k1024);
    const __half2 s01 = __hmul2(sc01, d2), s23 = __hmul2(sc23, d2), b01 = __hmul2(m01, nm2), b23 = __hmul2(m23, nm2);
    uint32_t us01, us23, ub01, ub23;
    memcpy(&us01, &s01, 4), memcpy(&us23, &s23, 4), memcpy(&ub01, &b01, 4), memcpy(&ub23, &b23, 4);
    s_sc[(sb + 0) * kBM + r] = __byte_perm(us01, ub01, 0x5410);  // (scale, -bias) of sub-block sb
    s_sc[(sb + 1) * kBM + r] = __byte_perm(us01, ub01, 0x7632);
    s_sc[(sb + 2) * kBM + r] = __byte_perm(us23, ub23, 0x5410);
    s_sc[(sb + 3) * kBM + r] = __byte_perm(us23, ub23, 0x7632);
    const __half2 sc_max = __hmax2(sc01, sc23), m_max = __hmax2(m01, m23);
    const float scale = fmul_rn(d_abs, fmaxf(__low2float(sc_max), __high2float(sc_max)));
    const float bias = fmul_rn(m_abs, fmaxf(__low2float(m_max), __high2float(m_max)));
    wide = wide || (r < rows_left && !(scale <= 65504.0f && bias <= 65504.0f));
  }
  if constexpr (kGroupVote) return warpgroup_any(wide);  // (a barrier: the scales' stores are done too)
  const bool any = __any_sync(0xffffffffu, wide);
  __syncwarp();
  return any;
}

// dequant8 for q4_K from a pre-decoded sub-block scale pair (q4k_pre_scales): the row's weights
// 32 j + 8 c .. + 7 of the chunk (j its k32 step, c < 4 the thread of the quad), their eight codes in one
// 8-byte shared load (rows are staged from their 16-byte-aligned start): the same f16 values. With j and c
// apart, the nibble shift is a constant where the caller unrolls its steps (with k = 32 j + 8 c the
// compiler computed it per step, not knowing c < 4), and the scale and bias halves reach the fma as
// operand selectors (__low2half2 / __high2half2) instead of two byte permutes.
__device__ __forceinline__ void dequant8_q4k_pre(const unsigned char* raw, int j, int c, uint32_t sc_pair,
                                                 uint32_t (&w)[4]) {
  __half2 pair;
  memcpy(&pair, &sc_pair, 4);
  const __half2 sc = __low2half2(pair), nb = __high2half2(pair);
  const uint2 u = *reinterpret_cast<const uint2*>(raw + 16 + (j / 2) * 32 + 8 * c);
  const int shift = (j & 1) * 4;
  const uint32_t lo = (u.x >> shift) & 0x0f0f0f0fu, hi = (u.y >> shift) & 0x0f0f0f0fu;
  const uint32_t h[4] = {__byte_perm(lo, 0x64646464u, 0x5140), __byte_perm(lo, 0x64646464u, 0x7362),
                         __byte_perm(hi, 0x64646464u, 0x5140), __byte_perm(hi, 0x64646464u, 0x7362)};  // 1024 + code
#pragma unroll
  for (int e = 0; e < 4; ++e) w[e] = h2_sub_fma(h[e], 0x64006400u, sc, nb);  // (1024 + code) - 1024
}

// The tensor map of weights a ([m rows][k / kBlock * kBytes bytes], nb1 apart) for the stage's 2-D
// copy: boxes of kRawStride bytes x kBM rows. False where the driver has no encoder or refuses.
template <class D>
bool encode_weight_map(const Tensor* a, int64_t m, int64_t k, CUtensorMap& map) {
  const auto encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k / D::kBlock * D::kBytes), static_cast<cuuint64_t>(m)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a->nb[1])};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(Staging<D>::kRawStride), static_cast<cuuint32_t>(kBM)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, a->data, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace loom::cuda::gemm_q_detail
