// flash_attn on tensor cores for the fast numerics mode (the kernel; its launches in attention_mma.cu
// and, on wgmma, attention_wgmma.cu) (FlashAttention-2, Dao 2023): a block of
// kWarps warps takes kBr = 16 * kWarps * kMS queries of one head; each warp owns kMS slabs of 16 query
// rows (one, or two for long prompts: flash_attn_slabs). Q is scaled, rounded to f16 and stored in
// shared memory once; K/V tiles of kBc keys are staged in shared memory by cp.async, two buffers deep
// (tile t+1 loads while tile t computes). Per tile, S = Q K^T (mma.sync m16n8k16, f16 in, f32
// accumulators; each K fragment serves every slab), softcap and mask in f32, an online softmax on the
// accumulator registers (base-2 exponentials, log2 e folded into Q's scale), P rounded to f16 in
// registers (the S accumulator layout is the A operand layout of the next mma) and O += P V. O, the
// running max and the running sum stay in registers; O is rescaled only when a row's maximum rose (any
// of a warp's rows); the output is O / l in f32 (l with the head's sink term when src[4] gives sinks).
// Masked and NaN scores weigh 0 on every tile. Deterministic: one block owns each output row, no
// atomics, no split over the keys.
//
// Masked keys: the mask is an input, so the keys a block's queries can see are found by scanning
// it: [kv_begin, kv_end) holds every finite mask entry of the block's rows. When the dispatch has
// flash_attn_mma_scratch_bytes() of ctx.scratch, a pre-pass kernel (one block per query tile and key
// tile, so it runs wide) classes every tile of the mask once for all the heads that share it: all
// zeros (a "plain" tile when all its keys are below n_kv: no mask loads, no key checks, no -inf
// tests in the softmax), all -inf (skipped; the first and last other tile give the extent), or mixed
// (read per element after the K/V wait). A block-per-query-tile scan for the extent alone took 118 us
// before a 30 us attention on a 1B prompt chunk (8 blocks walking 4,096 keys). Without the scratch
// each block scans for itself. Masked keys inside the tiles a block computes (the wgmma form computes
// every tile between the first and the last visible one, all-hidden ones included) must hold finite K
// and V, unlike in the exact kernel, which never reads them: a weight of 0 times a NaN is NaN in the
// P V product. The KV cache is zeroed at allocation, so its unwritten cells are.
//
// FLOPs: 4 * n_q * n_kv * d * n_head (2 for Q K^T, 2 for P V), about half under a causal mask.
// Bytes: Q read once (4 * d per row), O written once (4 * dv per row), the mask once per head over
// the visible keys (2 or 4 bytes per (query, key)) plus once per mask head over the hidden ones (the
// scan); K and V once per query tile and head, (n_q / kBr) * n_head * n_kv * (d + dv) * 2 bytes,
// nearly all from L2: the grid runs heads fastest, so the blocks resident together (the heads of a
// few query tiles) share mask rows and K/V and walk the keys in step.
// Measured (H200, op-test perf, causal, zeros and -inf, d 128, 32/8 heads): 4,096 tokens 671-677 us
// (~204 TFLOP/s), 16,384 tokens 260 TFLOP/s; ncu before this layout (one slab, 64-key tiles): 8 warps
// an SM (235 registers), 1,121 instructions per warp and tile for its 128 mma, issue-bound at 1.56
// IPC. docs/PERFORMANCE.md has the steps.
//
// On sm_90a (attention_wgmma.cu) the same kernel makes its two products with wgmma.mma_async (kWg),
// for passes that fill the GPU with 128-query blocks (attention_mma.cu: flash_attn_wide): two
// warpgroups a block, in FlashAttention-3's ping-pong (they take turns issuing their products), each its 64 query
// rows, each warp's 16 the ones it owns with mma.sync, so the accumulator registers, the mask, the
// softmax and the output are the same code. Q lies in shared memory as wgmma's core matrices (wg_off),
// K and V tiles of 128 keys (by tensor copies) in the 128-byte swizzle (kKvSwizzle): S = Q K^T
// (m64n128k16, both K-major), O += P V (P from registers, V as the MN-major B). The tile loop is
// pipelined: a tile's softmax runs while the tensor cores make the previous tile's P V. Softcapped
// attention takes an instantiation of its own (kWgSoftcap). Measured (H200, op-test perf, as above,
// with the causal tile class): 4,096 tokens 391 us (351 TFLOP/s), 16,384 434 TFLOP/s; the steps in
// docs/PERFORMANCE.md. LOOM_CUDA_FA_WGMMA=0 keeps mma.sync.
//
// Internal to the two files: everything here has internal linkage (an unnamed namespace), one copy per
// file.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "attention.cuh"
#include "common.cuh"
#include "loom/backend.h"
#include "mma.cuh"
#include "tensor_map.h"
#include "wgmma.cuh"

namespace loom::cuda {

namespace {


constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
/// m16 query slabs per warp (kMS): one, or two at head sizes up to 128 for long prompts
/// (FlashAttention-2's 128-query blocks of 4 warps: each K/V fragment loaded from shared memory feeds
/// both slabs' mma, and a key tile's fixed costs serve twice the queries; 32-key tiles keep the
/// registers under 255, no spills). Two slabs halve the blocks, so short prompts keep one
/// (flash_attn_slabs). Queries per block:
template <int kMS, int kNW = kWarps>
inline constexpr int kBrOf = 16 * kNW * kMS;
/// Warps of a block of the attention kernel: one warpgroup with mma.sync, two with wgmma (each its 64
/// query rows, sharing the K and V tiles: half the L2 reads of one a block, which bounded it at 79% of
/// L2's throughput, ncu, H200, causal 4,096 tokens).
template <bool kWg>
inline constexpr int kWarpsOf = kWg ? 8 : 4;
constexpr int kBrMax = kBrOf<2>;
// Keys per step of the mask-extent scan (the fallback without the tile classes' scratch): up to
// kBrMax rows x 256 keys a step.
constexpr int kScanKeys = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/// x, or -inf for NaN: PTX max returns the operand that is not NaN. In inline PTX because the
/// compiler folds fmaxf(x, -INFINITY) to x, which keeps the NaN.
__device__ __forceinline__ float nan_to_neg_inf(float x) {
  float y;
  asm("max.f32 %0, %1, 0fFF800000;\n" : "=f"(y) : "f"(x));
  return y;
}

/// 2^x; ex2.approx gives 0 for -inf (relative error ~2^-22, far below the f16 rounding of P).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}


// ---- the mask (mask_at: common.cuh) --------------------------------------------------------------

template <int kNW>
__device__ __forceinline__ int block_max(int v, int* scratch) {
  v = __reduce_max_sync(0xffffffffu, v);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  v = scratch[0];
#pragma unroll
  for (int w = 1; w < kNW; ++w) v = max(v, scratch[w]);
  __syncthreads();
  return v;
}

/// Offset from lo of the last finite mask entry among rows [0, rows) and keys [lo, hi) that this
/// thread reads (-1 if none; hi - lo <= kScanKeys); with `first`, kScanKeys minus the offset of the
/// first one instead, so that a block maximum finds either. Each warp reads kBrMax / kWarps rows, its
/// lanes along the keys; a fixed count of loads per thread, unrolled, keeps 16 of them in flight.
template <int kNW>
__device__ __forceinline__ int scan_mask(const char* base, int64_t nb1, bool f16, int rows, int64_t lo,
                                         int64_t hi, bool first) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  constexpr int kPerRow = kScanKeys / kWarpSize;
  int found = -1;
#pragma unroll 16
  for (int i = 0; i < kPerRow * (kBrMax / kNW); ++i) {
    const int r = warp + kNW * (i / kPerRow);
    const int off = lane + kWarpSize * (i % kPerRow);
    if (r < rows && lo + off < hi && mask_at(base + r * nb1, lo + off, f16) != -INFINITY)
      found = max(found, first ? kScanKeys - off : off);
  }
  return found;
}

/// The keys [begin, end) that hold every finite mask entry of rows [0, rows) (row r at
/// base + r * nb1, rows <= kBrMax); begin = end = 0 when all are -inf. Block-wide (kThreads threads,
/// all calling): scans back from the last key and forward from the first in kScanKeys steps, so a
/// causal tile reads the part of the mask it may skip once, and a mask without -inf costs one step
/// each way.
template <int kNW>
__device__ void mask_extent(const char* base, int64_t nb1, bool f16, int rows, int64_t n_kv, int64_t& begin,
                            int64_t& end, int* scratch) {
  begin = end = 0;
  for (int64_t hi = n_kv; hi > 0; hi -= kScanKeys) {
    const int64_t lo = hi > kScanKeys ? hi - kScanKeys : 0;
    const int last = scan_mask<kNW>(base, nb1, f16, rows, lo, hi, false);
    if (__syncthreads_or(last >= 0)) {
      end = lo + block_max<kNW>(last, scratch) + 1;
      break;
    }
  }
  for (int64_t lo = 0; lo < end; lo += kScanKeys) {
    const int64_t hi = min(lo + kScanKeys, end);
    const int first = scan_mask<kNW>(base, nb1, f16, rows, lo, hi, true);
    if (__syncthreads_or(first >= 0)) {
      begin = lo + kScanKeys - block_max<kNW>(first, scratch);
      break;
    }
  }
}

/// What a (query tile, key tile) of the mask holds: all zeros (the kernel adds nothing and reads no
/// mask), all -inf (skipped), or anything else (read per element).
/// A causal tile holds 0 where key k <= query q + off and -inf elsewhere (off = n_kv - n_q: a prompt's
/// diagonal tiles, its last query seeing the last key), so the kernel makes its mask from the indices.
enum : uint8_t { kTileZero = 0, kTileMixed = 1, kTileHidden = 2, kTileCausal = 3 };

/// The class of each (query tile of br rows, key tile of kbc keys at multiples of kbc) for each mask
/// head and sequence: out[((i3 * mask.ne[2] + i2) * q_tiles + tile) * k_tiles + kt]; grid (k tiles,
/// query tiles, mask heads x sequences). A causal prompt's mask is zeros below the diagonal, so
/// nearly every tile a block computes needs no mask loads (they were ~half of its stalls).
__global__ void __launch_bounds__(kThreads)
    flash_attn_tile_class_kernel(TensorDesc mask, bool f16, bool vec, int64_t n_q, int64_t causal_off, int br, int kbc,
                                 uint8_t* out) {
  pdl_wait();
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * br, k0 = static_cast<int64_t>(blockIdx.x) * kbc;
  const int64_t i2 = blockIdx.z % mask.ne[2], i3 = blockIdx.z / mask.ne[2];
  const int rows = static_cast<int>(n_q - q0 < br ? n_q - q0 : br);
  const int keys = static_cast<int>(mask.ne[0] - k0 < kbc ? mask.ne[0] - k0 : kbc);
  // Where the tile lies against a causal diagonal: wholly on or below it (a causal tile there is all
  // zeros), wholly above (all -inf), or across it (the entries decide, one by one).
  const bool below = k0 + keys - 1 <= q0 + causal_off, above = k0 > q0 + rows - 1 + causal_off;
  const bool across = !below && !above;
  bool causal = true;  // across the diagonal: the entries so far are a causal tile's
  // entry (q, k) as a causal tile has it: 0 for k <= q + causal_off, -inf past
  auto causal_ok = [&](int64_t q, int64_t k, bool is_zero, bool is_neg_inf) {
    return k <= q + causal_off ? is_zero : is_neg_inf;
  };
  const char* row0 = row_ptr(mask, q0, i2, i3) + k0 * (f16 ? 2 : 4);
  const int64_t nb1 = mask.nb[1];
  // the bits of an entry that is not zero (+0 or -0) / not -inf, ORed over the thread's entries
  uint32_t not_zero = 0, not_hidden = 0;
  if (vec && keys % 8 == 0) {
    // 8 keys a load (16 bytes of f16, two loads of f32), tested a word at a time; a few loads in flight
    // a thread. (One entry a thread at a time took 9.7 us for a 512-token causal mask, ncu, H200; a
    // test per entry with 64-bit indices 23.5 us for a 4,096-token f16 mask in 128 x 128 tiles.)
    const int per_row = keys / 8;
#pragma unroll 4
    for (int i = static_cast<int>(threadIdx.x); i < rows * per_row; i += kThreads) {
      const int r = i / per_row, c = i % per_row;
      const char* at = row0 + r * nb1 + c * (f16 ? 16 : 32);
      if (f16) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(at));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) not_zero |= w[e] & 0x7fff7fffu, not_hidden |= w[e] ^ 0xfc00fc00u;
        if (across) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const uint32_t h = w[e / 2] >> (e % 2 * 16) & 0xffffu;
            causal = causal && causal_ok(q0 + r, k0 + 8 * c + e, (h & 0x7fffu) == 0, h == 0xfc00u);
          }
        }
      } else {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(at)), b = __ldg(reinterpret_cast<const uint4*>(at) + 1);
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          not_zero |= w[e] & 0x7fffffffu, not_hidden |= w[e] ^ 0xff800000u;
          if (across) causal = causal && causal_ok(q0 + r, k0 + 8 * c + e, (w[e] & 0x7fffffffu) == 0, w[e] == 0xff800000u);
        }
      }
    }
  } else {
    for (int i = static_cast<int>(threadIdx.x); i < rows * keys; i += kThreads) {
      const int r = i / keys, c = i % keys;
      const float x = mask_at(row0 + r * nb1, c, f16);
      not_zero |= x == 0.0f ? 0u : 1u;
      not_hidden |= x == -INFINITY ? 0u : 1u;
      if (across) causal = causal && causal_ok(q0 + r, k0 + c, x == 0.0f, x == -INFINITY);
    }
  }
  const bool zero = !__syncthreads_or(not_zero != 0);
  const bool hidden = !__syncthreads_or(not_hidden != 0);
  causal = below ? zero : (above ? hidden : __syncthreads_and(causal));
  if (threadIdx.x == 0)
    out[(static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x] =
        zero ? kTileZero : (hidden ? kTileHidden : (causal ? kTileCausal : kTileMixed));
}

// ---- the attention kernel ------------------------------------------------------------------------

struct MmaArgs {
  TensorDesc dst, q, k, v, mask;
  bool has_mask, mask_f16;
  float scale, softcap;
  /// flash_attn_tile_class_kernel's output, or null: each block scans the mask for its extent
  const uint8_t* tile_class;
  int64_t k_tiles;     ///< key tiles per query tile in tile_class
  int64_t causal_off;  ///< n_kv - n_q: a causal tile's key k is visible to query q where k <= q + causal_off
  const float* sinks;  ///< per head, a logit joining the softmax denominator (null: none)
  /// The output as contiguous f16 over dst's own bytes (element i at half i: what pack_b_f16 makes of
  /// the f32 output), for the products after it (LaunchContext::act_out_block kActF16; dst contiguous)
  bool out_f16;
};

/// The wgmma kernel's tensor maps of K and V (unused by the mma.sync one), made by encode_kv_map:
/// dimensions {piece, rows, D / piece, KV heads, sequences} (piece: kKvSwizzle / 2 halves), so that a
/// box {piece, kBc, D / piece, 1, 1} lands piece after piece, kBc rows of kKvSwizzle bytes each, in the
/// swizzle of that width. Rows past the tensor's (n_kv) come as zeros.
struct FlashAttnMaps {
  CUtensorMap k, v;
};

/// The wgmma form's K and V tiles in shared memory: rows of kKvSwizzle bytes (kKvSwizzle / 2 of a key's
/// D halves, the piece), piece after piece, in the swizzle of that width (a tensor copy's box {piece,
/// kBc rows, D / piece}); the tiles need 8 kKvSwizzle-byte alignment. LOOM_FA_KV_SWIZZLE (a build
/// setting, for comparisons) picks 32, 64 or 128 (encode_kv_map has the measurements).
#ifndef LOOM_FA_KV_SWIZZLE
#define LOOM_FA_KV_SWIZZLE 128
#endif
inline constexpr int kKvSwizzle = LOOM_FA_KV_SWIZZLE;

/// Halves per shared-memory row of a D-wide tile: 16 bytes of padding put the 8 rows an ldmatrix
/// phase reads in 8 different 16-byte bank groups (rows of 2D bytes alone would all share one).
template <int D>
inline constexpr int kSmemStride = D + 8;

/// Halves per shared-memory row of a Q, K or V tile: padded rows for mma.sync's ldmatrix loads; the wgmma
/// form's tiles have no padding (Q in wg_off's core matrices, K and V in kKvSwizzle-byte swizzled pieces).
template <int D, bool kWg>
inline constexpr int kRowHalves = kWg ? D : kSmemStride<D>;

/// Dynamic shared memory: Q, two K tiles, two V tiles, all f16 (wgmma: three of each, and 8 kKvSwizzle
/// bytes of alignment slack).
template <int D, int kBc, int kMS, bool kWg>
inline constexpr size_t kSmemBytes =
    (static_cast<size_t>(kBrOf<kMS, kWarpsOf<kWg>>) * kRowHalves<D, kWg> + static_cast<size_t>((kWg ? 6 : 4) * kBc) * kRowHalves<D, kWg>) *
        2 +
    (kWg ? 8 * kKvSwizzle : 0);

/// P's A fragment of keys 16 kk .. 16 kk + 15 from a slab's S accumulators (n8 tiles 2 kk and 2 kk + 1:
/// a0 = rows g, a1 = rows g + 8 of the first; a2, a3 of the second), rounded to f16.
template <int kKTiles>
__device__ __forceinline__ void pack_p(const float (&s)[kKTiles][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/// wgmma's no-swizzle tile layout (wgmma.cuh), the wgmma form's Q: the 16-byte piece c (halves 8c ..
/// 8c + 7) of row r of an R-row tile at byte (c R / 8 + r / 8) 128 + (r % 8) 16, so that core matrix
/// (row group, piece) is 128 contiguous bytes, row-group-adjacent ones 128 bytes apart and piece-adjacent
/// ones 16 R: K-major A of S with leading offset 16 R and stride offset 128. (K and V come swizzled:
/// kKvSwizzle.)
template <int R>
__device__ __forceinline__ int wg_off(int r, int c) {
  return (c * (R / 8) + r / 8) * 128 + (r % 8) * 16;
}

// D: head size of K and V (d == dv); kBc: keys per tile; kMS: slabs per warp. Warp w of the block's
// kNW owns the slabs of 16 query rows (m kNW + w) 16 .. + 15 of its kBrOf<kMS, kNW>. kWg: the products
// by wgmma (sm_90a code, instantiated only in attention_wgmma.cu), two warpgroups of one slab each:
// warpgroup i's wgmma make rows 64 i .. 64 i + 63, each warp's 16 the ones it owns with mma.sync, so
// the accumulators and the softmax are the same.
template <int D, int kBc, int kMS, bool kWg, bool kWgSoftcap = false>
__global__ void __launch_bounds__(kWarpsOf<kWg> * kWarpSize) flash_attn_mma_kernel(const MmaArgs a, const __grid_constant__ FlashAttnMaps maps) {
  pdl_wait();
  constexpr int kNW = kWarpsOf<kWg>, kNT = kNW * kWarpSize;  // warps, threads
  static_assert(D % 16 == 0 && kBc % 16 == 0, "m16n8k16 tiles");
  static_assert(!kWg || (kBc == 128 && kMS == 1 && (D == 64 || D == 128)), "wgmma: S m64n128, O m64n64 or m64n128");
  constexpr int kBr = kBrOf<kMS, kNW>;
  constexpr int kStride = kRowHalves<D, kWg>;  // K and V rows
  constexpr int kQStride = kRowHalves<D, kWg>;  // Q rows (wgmma: core matrices, wg_off)
  // Q fragments: D / 4 registers; else from shared memory. wgmma reads Q from shared memory: its
  // registers go to 128-key tiles (S m64n128: 2 KB of Q and 4 KB of K a k16 step, within shared
  // memory's 128 bytes a cycle at the tensor cores' rate).
  constexpr bool kQInRegs = !kWg && kMS == 1 && D <= 128;
  constexpr int kKTiles = kBc / 8;                 // n8 tiles of S per slab
  constexpr int kDTiles = D / 8;                   // n8 tiles of O per slab
  // 128-byte aligned (the wgmma form aligns its tiles further below)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int scratch[kNW];
  // (the wgmma form's K and V tiles, swizzled, need 8 kKvSwizzle-byte alignment: the dynamic shared
  // memory holds that much slack for it)
  constexpr unsigned kAlign = 8 * kKvSwizzle;
  __half* s_q = reinterpret_cast<__half*>(smem_raw + (kWg ? (kAlign - smem_addr(smem_raw) % kAlign) % kAlign : 0));  // [kBr][kStride]
  // [2][kBc][kStride] each; in the wgmma form three K and three V buffers, each [D / piece][kBc][piece],
  // swizzled (kKvSwizzle)
  __half* s_k = s_q + kBr * kQStride;
  __half* s_v = s_k + (kWg ? 3 : 2) * kBc * kStride;

  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t4 = lane % 4;  // fragment row group and column pair
  const int64_t n_q = a.q.ne[1], n_head = a.q.ne[2], n_kv = a.k.ne[1];
  // Heads vary fastest in the grid: the blocks resident together are the heads of a few query
  // tiles, which share mask rows and (per KV head) K/V and walk the keys in step, so both stay in
  // L2 at any length. The last query tiles see the most keys under a causal mask: they start first.
  const int64_t tile = gridDim.y - 1 - blockIdx.y;
  const int64_t q0 = tile * kBr;
  const int64_t h = blockIdx.x, i3 = blockIdx.z;
  const int64_t h_kv = h / (n_head / a.k.ne[2]);
  auto slab_row = [&](int m) { return (m * kNW + warp) * 16; };  // the slab's first row in the block

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // the wgmma loop's K and V buffers' barriers (full: the tile's copy landed; empty: every warp is done
  // with it), initialized here so that K_0's copy can go out before Q is loaded
  constexpr int kKBufs = 3, kVBufs = 3;
  __shared__ alignas(8) uint64_t k_full[kKBufs], k_empty[kKBufs], v_full[kVBufs], v_empty[kVBufs];
  constexpr unsigned kTileBytes = kBc * D * sizeof(__half);
  constexpr unsigned kReleasers = kNW;  // each warp's lane 0
  auto tma_tile = [&](const CUtensorMap* map, __half* base, int64_t kv0, int buf, uint64_t* bar) {
    mbar_arrive_expect(bar, kTileBytes);
    tensor_copy_5d(base + buf * kBc * kStride, map, 0, static_cast<int>(kv0), 0, static_cast<int>(h_kv),
                   static_cast<int>(i3), bar);
  };
  if constexpr (kWg) {
    if (tid == 0) {
      for (int i = 0; i < kKBufs; ++i) mbar_init(&k_full[i], 1), mbar_init(&k_empty[i], kReleasers);
      for (int i = 0; i < kVBufs; ++i) mbar_init(&v_full[i], 1), mbar_init(&v_empty[i], kReleasers);
      mbar_init_fence();
    }
    __syncthreads();  // the barriers initialized (the extent's reductions may not run)
  }
#endif

  // The keys this block's queries can see.
  int64_t kv_begin = 0, kv_end = n_kv;
  const char* mask_head = nullptr;      // the mask rows of this head and sequence (row i at + i nb1)
  const uint8_t* tile_class = nullptr;  // per key tile: zeros, hidden or mixed
  if (a.has_mask) {
    const int64_t mh = h % a.mask.ne[2], m3 = i3 % a.mask.ne[3];
    if (a.tile_class) {
      // The extent from the classes: the first and the last key tile not all -inf.
      tile_class = a.tile_class + ((m3 * a.mask.ne[2] + mh) * gridDim.y + tile) * a.k_tiles;
      int last = -1, first = -1;  // first as k_tiles - index, so that one block maximum finds each
      for (int64_t t = tid; t < a.k_tiles; t += kNT)
        if (tile_class[t] != kTileHidden) {
          last = max(last, static_cast<int>(t));
          first = max(first, static_cast<int>(a.k_tiles - t));
        }
      last = block_max<kNW>(last, scratch);
      first = block_max<kNW>(first, scratch);
      kv_begin = last < 0 ? 0 : (a.k_tiles - first) * kBc;
      kv_end = last < 0 ? 0 : min(n_kv, static_cast<int64_t>(last + 1) * kBc);
    } else {
      const int rows = static_cast<int>(n_q - q0 < kBr ? n_q - q0 : kBr);
      mask_extent<kNW>(row_ptr(a.mask, q0, mh, m3), a.mask.nb[1], a.mask_f16, rows, n_kv, kv_begin, kv_end,
                  scratch);
    }
    mask_head = row_ptr(a.mask, 0, mh, m3);
  }
  const int n_tiles = static_cast<int>((kv_end - kv_begin + kBc - 1) / kBc);
  // the wgmma loop walks one tile at least (its first iteration is straight-line code: no wgmma under a
  // branch); a block with no visible key walks tile kv_begin, which it sees none of, and clears O
  [[maybe_unused]] const int n_walk = n_tiles > 0 ? n_tiles : 1;

  // mma.sync's K and V rows kv0 .. kv0 + kBc - 1 into buffer `buf` (the wgmma loop's come by tensor
  // copies); keys past n_kv are zeros (a zero V row
  // keeps 0 * garbage out of O; their scores are -inf anyway).
  // A thread copies the same 16-byte column piece of rows r0, r0 + kRowStep, ...: its addresses are
  // computed once, and a tile wholly below n_kv (all but the last) checks no row.
  constexpr int kChunks = kBc * D / 8;  // 16-byte pieces
  static_assert(kChunks % kNT == 0 && kNT % (D / 8) == 0, "whole pieces per thread, whole rows per step");
  constexpr int kRowStep = kNT / (D / 8);
  const int r0 = tid / (D / 8), col0 = tid % (D / 8) * 8;
  const char* k_col = row_ptr(a.k, 0, h_kv, i3) + col0 * sizeof(__half);
  const char* v_col = row_ptr(a.v, 0, h_kv, i3) + col0 * sizeof(__half);
  const int64_t k_step = kRowStep * static_cast<int64_t>(a.k.nb[1]), v_step = kRowStep * static_cast<int64_t>(a.v.nb[1]);
  const uint32_t s_k0 = smem_addr(s_k + r0 * kStride + col0), s_v0 = smem_addr(s_v + r0 * kStride + col0);
  auto load_tile = [&](int64_t kv0, int buf) {
    const uint32_t dk = s_k0 + buf * kBc * kStride * sizeof(__half), dv = s_v0 + buf * kBc * kStride * sizeof(__half);
    const char* pk = k_col + (kv0 + r0) * static_cast<int64_t>(a.k.nb[1]);
    const char* pv = v_col + (kv0 + r0) * static_cast<int64_t>(a.v.nb[1]);
    if (kv0 + kBc <= n_kv) {
#pragma unroll
      for (int i = 0; i < kChunks / kNT; ++i)
        cp_async_16(dk + i * kRowStep * kStride * sizeof(__half), pk + i * k_step, 16),
            cp_async_16(dv + i * kRowStep * kStride * sizeof(__half), pv + i * v_step, 16);
    } else {
#pragma unroll
      for (int i = 0; i < kChunks / kNT; ++i) {
        const bool in = kv0 + r0 + i * kRowStep < n_kv;
        cp_async_16(dk + i * kRowStep * kStride * sizeof(__half), in ? pk + i * k_step : k_col, in ? 16 : 0);
        cp_async_16(dv + i * kRowStep * kStride * sizeof(__half), in ? pv + i * v_step : v_col, in ? 16 : 0);
      }
    }
    cp_async_commit();
  };

  // the first K (and V) tile's copies go out before Q is loaded: the wgmma loop's K_0 by a tensor copy
  // (its barriers initialized before the extent's block reductions), mma.sync's by cp.async
  if (!kWg && n_tiles > 0) load_tile(kv_begin, 0);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kWg) {
    if (tid == 0) tma_tile(&maps.k, s_k, kv_begin, 0, &k_full[0]);
  }
#endif
  // Q * scale * log2(e) as f16, so that S comes out in the base-2 units of the softmax (softcap, which
  // needs q k^T * scale, takes them back by ln 2); rows past n_q are 0. Loaded kQBatch pairs a thread
  // at a time, all in flight before the first store (4 at a time made the wgmma form's 32 a thread 8
  // round trips to memory at every block's start).
  static_assert(kBr * D / 2 % kNT == 0, "whole pairs per thread");
  const float q_scale = a.scale * kLog2e;
  {
    constexpr int kQPairs = kBr * D / 2 / kNT, kQBatch = kQPairs < 16 ? kQPairs : 16;
    static_assert(kQPairs % kQBatch == 0, "whole batches");
#pragma unroll 1
    for (int i0 = 0; i0 < kQPairs; i0 += kQBatch) {
      float2 x[kQBatch];
#pragma unroll
      for (int j = 0; j < kQBatch; ++j) {
        const int c = tid + (i0 + j) * kNT;
        const int r = c / (D / 2), col = c % (D / 2) * 2;
        // Q: an earlier kernel's output (the rope's), so coherent loads (common.cuh's PDL rule)
        x[j] = q0 + r < n_q ? ld_act(reinterpret_cast<const float2*>(row_ptr(a.q, q0 + r, h, i3) + col * sizeof(float)))
                            : make_float2(0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kQBatch; ++j) {
        const int c = tid + (i0 + j) * kNT;
        const int r = c / (D / 2), col = c % (D / 2) * 2;
        __half2* at = kWg ? reinterpret_cast<__half2*>(reinterpret_cast<char*>(s_q) + wg_off<kBr>(r, col / 8)) + col % 8 / 2
                          : reinterpret_cast<__half2*>(s_q + r * kQStride + col);
        *at = __floats2half2_rn(x[j].x * q_scale, x[j].y * q_scale);
      }
    }
  }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kWg) fence_proxy_async();  // s_q, for wgmma's reads
#endif
  __syncthreads();  // s_q written

  // A fragments of a slab's 16 Q rows: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in the order
  // a0..a3 wants, lane l addressing row l % 16, column 8 * (l / 16).
  uint32_t q_at[kMS];
#pragma unroll
  for (int m = 0; m < kMS; ++m) q_at[m] = smem_addr(s_q + (slab_row(m) + lane % 16) * kQStride + lane / 16 * 8);
  uint32_t q_frag[kQInRegs ? D / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(q_frag[ks], q_at[0] + ks * 16 * sizeof(__half));
  }

  float o[kMS][kDTiles][4];
#pragma unroll
  for (int m = 0; m < kMS; ++m)
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.0f;
  float m_run[kMS][2], l_run[kMS][2];  // running max of rows g, g + 8 (log2 units); running sum, this thread's columns
#pragma unroll
  for (int m = 0; m < kMS; ++m) m_run[m][0] = m_run[m][1] = -INFINITY, l_run[m][0] = l_run[m][1] = 0.0f;

  // Softcap, the mask, the online softmax of a tile's scores s (in log2 units): s becomes P (unrounded),
  // alpha the factor of each row's earlier O and l, sum its new terms (this thread's columns); returns
  // whether a row of the warp's rose (else alpha is 1). m_run moves to the new maxima.
  auto softmax_tile = [&](float (&s)[kMS][kKTiles][4], int cls, bool plain, int64_t kv0, float (&alpha)[kMS][2],
                          float (&sum)[kMS][2]) {
    // softcap (in natural units: c tanh(x / c)), the mask; the row maxima over the quad that shares a row.
    // tanh(y) = 1 - 2 / (e^(2y) + 1), with 2y log2(e) = 2 s / c for s in log2 units: one ex2.approx and
    // one fast division a score (saturating to +-1; ~1e-7 absolute, well below P's f16 rounding), where
    // tanhf's branches and a polynomial. The wgmma loop applies it only in its kWgSoftcap instantiation
    // (whose registers spill; the plain one's do not).
    if ((!kWg || kWgSoftcap) && a.softcap > 0.0f) {
      const float in2 = 2.0f / a.softcap, out = a.softcap * kLog2e;
#pragma unroll
      for (int m = 0; m < kMS; ++m)
#pragma unroll
        for (int nt = 0; nt < kKTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[m][nt][e] = out - __fdividef(2.0f * out, exp2_approx(s[m][nt][e] * in2) + 1.0f);
    }
    if (!plain) {
      // S accumulator layout: [n8 tile][c0..c3] = rows g (c0, c1) and g + 8 (c2, c3), keys kv0 + 8
      // tile + 2 t4 + {0, 1}; rows past n_q (not stored) read the last real row, not past the mask
#pragma unroll
      for (int m = 0; m < kMS; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t iq = min(q0 + slab_row(m) + g + 8 * r, n_q - 1);
          // (a hidden tile comes here only in the wgmma loop, which computes every tile: no key visible)
          // the row's mask entries from key kv0 on; its visible keys of the tile: kv0 .. kv0 + lim - 1
          // (32-bit tile offsets: the 64-bit key indices of every score cost the wgmma loop spills)
          const char* row = cls == kTileMixed ? mask_head + iq * static_cast<int64_t>(a.mask.nb[1]) +
                                                    kv0 * static_cast<int64_t>(a.mask_f16 ? 2 : 4)
                                              : nullptr;
          const int64_t last = cls == kTileCausal   ? iq + a.causal_off
                               : cls == kTileHidden ? kv0 - 1
                                                    : n_kv;  // the row's last visible key
          const int lim = static_cast<int>(max(int64_t{0}, min(min(n_kv, last + 1) - kv0, int64_t{kBc})));
#pragma unroll
          for (int nt = 0; nt < kKTiles; ++nt)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const int jj = nt * 8 + t4 * 2 + (e & 1);
              float x = -INFINITY;
              if (jj < lim) x = row ? mask_at(row, jj, a.mask_f16) * kLog2e : 0.0f;
              s[m][nt][e] += x;
            }
        }
    }
    float m_use[kMS][2];
    bool grew = false;  // a row's maximum rose: O and l are rescaled (else alpha is 1)
#pragma unroll
    for (int m = 0; m < kMS; ++m) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kKTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[m][nt][e]);  // a NaN score never wins
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m_run[m][r], mx[r]);
        grew = grew || m_new != m_run[m][r];
        m_use[m][r] = m_new == -INFINITY ? 0.0f : m_new;   // no visible key yet: no -inf - -inf
        alpha[m][r] = exp2_approx(m_run[m][r] - m_use[m][r]);  // 0 while m_run is -inf
        m_run[m][r] = m_new;
      }
    }
    // P: a masked (-inf) or NaN score weighs 0, as in the exact and decode kernels and on the CPU
    // (max(NaN, -inf) is -inf, and 2^-inf is 0: one instruction where a compare and a select were)
#pragma unroll
    for (int m = 0; m < kMS; ++m) {
      sum[m][0] = sum[m][1] = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kKTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2_approx(nan_to_neg_inf(s[m][nt][e]) - m_use[m][e / 2]);
          s[m][nt][e] = p;
          sum[m][e / 2] += p;
        }
    }
    return __any_sync(0xffffffffu, grew);
  };
  // O and l of each row times alpha
  auto rescale = [&](const float (&alpha)[kMS][2]) {
#pragma unroll
    for (int m = 0; m < kMS; ++m) {
      l_run[m][0] *= alpha[m][0];
      l_run[m][1] *= alpha[m][1];
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[m][dt][0] *= alpha[m][0];
        o[m][dt][1] *= alpha[m][0];
        o[m][dt][2] *= alpha[m][1];
        o[m][dt][3] *= alpha[m][1];
      }
    }
  };

  // K as B of S = Q K^T: matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15) ordered b0, b1 of the first
  // n8 tile then b0, b1 of the second: lane l addresses key l % 8 + 8 (l / 16), dim 8 ((l / 8) % 2).
  const int k_lane_off = (lane % 8 + lane / 16 * 8) * kStride + (lane / 8) % 2 * 8;
  // V as B of O = P V (transposed loads): matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15) ordered
  // b0, b1 of the first n8 tile of dims, then the second: lane l addresses key l % 8 + 8 ((l / 8) %
  // 2), dim 8 (l / 16).
  const int v_lane_off = (lane % 8 + (lane / 8) % 2 * 8) * kStride + lane / 16 * 8;

  // The tile's class. A plain tile (the mask's zeros, every key below n_kv: all a causal prompt's
  // tiles but the diagonal's) reads no mask and checks no key; a hidden one (all -inf) is skipped;
  // the others add their mask entries (in log2 units) to S. (ncu, H100, causal 4096: 1,121
  // instructions per warp and tile for 128 mma before the plain path and the hoisted copy addresses.)
  auto class_of = [&](int64_t kv0) { return tile_class ? tile_class[kv0 / kBc] : (a.has_mask ? kTileMixed : kTileZero); };

  if constexpr (!kWg) {
  for (int it = 0; it < n_tiles; ++it) {
    const int64_t kv0 = kv_begin + static_cast<int64_t>(it) * kBc;
    const int buf = it & 1;
    if (it + 1 < n_tiles) load_tile(kv0 + kBc, buf ^ 1);
    const int cls = class_of(kv0);
    const bool plain = cls == kTileZero && kv0 + kBc <= n_kv;

    if (it + 1 < n_tiles)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();  // tile `buf` visible to every warp

    if (cls != kTileHidden) {
      const __half* k_tile = s_k + buf * kBc * kStride;
      const __half* v_tile = s_v + buf * kBc * kStride;

      // S = (Q * scale * log2 e) K^T: each K fragment serves every slab
      float s[kMS][kKTiles][4];
#pragma unroll
      for (int m = 0; m < kMS; ++m)
#pragma unroll
        for (int nt = 0; nt < kKTiles; ++nt) s[m][nt][0] = s[m][nt][1] = s[m][nt][2] = s[m][nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t qa[kMS][4];
#pragma unroll
        for (int m = 0; m < kMS; ++m) {
          if constexpr (kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) qa[m][i] = q_frag[ks][i];
          } else {
            ldmatrix_x4(qa[m], q_at[m] + ks * 16 * sizeof(__half));
          }
        }
#pragma unroll
        for (int np = 0; np < kKTiles / 2; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb, smem_addr(k_tile + np * 16 * kStride + ks * 16 + k_lane_off));
#pragma unroll
          for (int m = 0; m < kMS; ++m) {
            mma_16816(s[m][2 * np], qa[m], kb[0], kb[1]);
            mma_16816(s[m][2 * np + 1], qa[m], kb[2], kb[3]);
          }
        }
      }

      float alpha[kMS][2], sum[kMS][2];
      if (softmax_tile(s, cls, plain, kv0, alpha, sum)) rescale(alpha);
#pragma unroll
      for (int m = 0; m < kMS; ++m) l_run[m][0] += sum[m][0], l_run[m][1] += sum[m][1];

      // O += P V: the S accumulators of n8 tiles 2 kk and 2 kk + 1 are the A fragment of keys
      // 16 kk .. 16 kk + 15 (a0 = rows g, a1 = rows g + 8 of the first; a2, a3 of the second); each
      // V fragment serves every slab.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t pa[kMS][4];
#pragma unroll
        for (int m = 0; m < kMS; ++m) pack_p(s[m], kk, pa[m]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, smem_addr(v_tile + kk * 16 * kStride + dp * 16 + v_lane_off));
#pragma unroll
          for (int m = 0; m < kMS; ++m) {
            mma_16816(o[m][2 * dp], pa[m], vb[0], vb[1]);
            mma_16816(o[m][2 * dp + 1], pa[m], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with `buf` before the next iteration refills it
  }
  } else {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // wgmma, pipelined (FlashAttention-3's overlap within a warpgroup): iteration it issues S_it = Q
  // K_it^T and then O += P_{it-1} V_{it-1}, waits for S_it alone and runs its softmax while the tensor
  // cores make the P V product, then waits for that, rescales O and keeps P_it in registers for the
  // next iteration. K and V tiles come by tensor copies (thread 0 issues one a tile, completing on
  // the buffer's full mbarrier; per-thread cp.async pieces stalled their warps on the address
  // registers and needed a proxy fence a tile); the buffers and the two warpgroups' turns below.
  // Accumulators: S (one slab: 64 x kBc, m64n128k16 with Q and K from shared memory, both K-major);
  // O (64 x D, m64nDk16, P from registers, V MN-major).
  float s_acc[kMS][kKTiles][4];
  float(&s0)[kKTiles * 4] = reinterpret_cast<float(&)[kKTiles * 4]>(s_acc[0]);
  float(&o0)[kDTiles * 4] = reinterpret_cast<float(&)[kDTiles * 4]>(o[0]);
  // No wgmma under a branch (ptxas serializes every wgmma of a kernel that has one: "program
  // dependence on compiler-inserted WG.AR in divergent path", 960 us against 633 for mma.sync at
  // 4,096 tokens): every tile's S is computed, a hidden one's P being zeros; the first iteration is a
  // step of its own (no P V), taken by every block (n_walk), and the last P V after the loop always
  // runs (O cleared where no tile was visible).
  uint32_t pa[kBc / 16][4];  // P_{it-1} as A fragments of keys 16 kk ..
  // Ping-pong (FlashAttention-3's inter-warpgroup schedule): the two warpgroups take turns to issue
  // their products (named barriers 1 and 2: a warpgroup waits for its turn, issues S_it and P_{it-1}
  // V_{it-1}, then hands the turn over), so one's softmax runs while the other's products occupy the
  // tensor cores, where a block-wide barrier a tile kept them in the same phase. Without that barrier
  // a buffer is refilled once both warpgroups have released it (empty mbarriers, an arrival from each
  // warp's lane 0): K after S, V after P V. Three buffers each, so that thread 0 does not wait on the
  // other warpgroup's current tile: K_{it+1} copied when iteration it begins into the buffer K_{it-2}
  // left, V_it into the one V_{it-3} left (released one and two iterations before). Tile j is buffer
  // j % 3's (j / 3)-th fill: its full barrier's phase parity is (j / 3) % 2. The first iteration is
  // its own instantiation of the step, without a P V (there is no tile -1).
  const int wg = warp / 4;
  auto release = [&](uint64_t* bar) {  // this warp is done reading a buffer
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // thread 0's phase parity of each empty barrier's next completion, a bit a buffer (registers, not a
  // stack array indexed at run time)
  unsigned k_empty_par = 0, v_empty_par = 0;
  auto wait_empty = [](uint64_t* bar, unsigned& par, int b) {
    mbar_wait(bar, (par >> b) & 1u);
    par ^= 1u << b;
  };
  auto issue_pv = [&](int vbuf) {
    const uint32_t v_base = smem_addr(s_v + vbuf * kBc * kStride);
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      // keys 16 kk ..: 16 rows of a piece; pieces kBc rows apart
      const uint64_t vd = wgmma_desc_swizzled<kKvSwizzle>(v_base + kk * 16 * kKvSwizzle, kBc * kKvSwizzle);
      if constexpr (D == 128)
        wgmma_64x128x16_rs<true>(o0, pa[kk], vd);
      else
        wgmma_64x64x16_rs<true>(o0, pa[kk], vd);
    }
  };
  auto my_turn = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory"); };
  auto their_turn = [&] { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory"); };
  if (wg == 1) their_turn();  // warpgroup 0 goes first
  int v_prev_buf = 0;
  auto step = [&](auto first, int it) {  // first: std::bool_constant, the first iteration's step
    constexpr bool kFirst = decltype(first)::value;
    const int64_t kv0 = kv_begin + static_cast<int64_t>(it) * kBc;
    const int buf = it % kKBufs, vbuf = it % kVBufs;
    if (tid == 0) {
      if (it + 1 < n_walk) {  // K_{it+1} into the buffer K_{it-2} left
        const int b = buf + 1 == kKBufs ? 0 : buf + 1;
        if (it >= 2) wait_empty(&k_empty[b], k_empty_par, b);
        tma_tile(&maps.k, s_k, kv0 + kBc, b, &k_full[b]);
      }
      // V_it into the buffer V_{it-3} left
      if (it >= 3) wait_empty(&v_empty[vbuf], v_empty_par, vbuf);
      tma_tile(&maps.v, s_v, kv0, vbuf, &v_full[vbuf]);
    }
    const int cls = class_of(kv0);
    const bool plain = cls == kTileZero && kv0 + kBc <= n_kv;
    mbar_wait(&k_full[buf], static_cast<unsigned>(it / kKBufs) & 1);                          // K_it
    if (!kFirst) mbar_wait(&v_full[v_prev_buf], static_cast<unsigned>((it - 1) / kVBufs) & 1);  // V_{it-1}

    __syncwarp();  // warp 0 whole again after thread 0's waits: bar.sync and wgmma are warp-wide
    my_turn();
    wgmma_fence();
    const uint32_t k_base = smem_addr(s_k + buf * kBc * kStride);
    // this warpgroup's 64 query rows: row groups 8 (warp / 4) ..
    const uint32_t q_base = smem_addr(s_q) + warp / 4 * 8 * 128;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wgmma_64x128x16_ss(s0, wgmma_desc(q_base + 2 * ks * 16 * kBr, 16 * kBr, 128),
                         wgmma_desc_swizzled<kKvSwizzle>(k_base + ks * 32 / kKvSwizzle * kBc * kKvSwizzle +
                                                         ks * 32 % kKvSwizzle),
                         ks > 0);
    wgmma_commit();
    if constexpr (!kFirst) {
      issue_pv(v_prev_buf);
      wgmma_commit();
    }
    their_turn();
    if constexpr (kFirst)
      wgmma_wait<0>();  // S_0
    else
      wgmma_wait<1>();  // S_it
    fence_regs(s0);
    release(&k_empty[buf]);
    float alpha[kMS][2], sum[kMS][2];
    const bool grew = softmax_tile(s_acc, cls, plain, kv0, alpha, sum);
    if constexpr (!kFirst) {
      wgmma_wait<0>();  // P_{it-1} V_{it-1}
      fence_regs(o0);
      fence_regs(reinterpret_cast<uint32_t(&)[kBc / 4]>(pa));
      release(&v_empty[v_prev_buf]);
      if (grew) rescale(alpha);  // (the first tile's O is zeros)
    }
    l_run[0][0] += sum[0][0], l_run[0][1] += sum[0][1];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) pack_p(s_acc[0], kk, pa[kk]);
    // pinned before the next wgmma.fence: the rescale and the packing come before it
    fence_regs(o0);
    fence_regs(reinterpret_cast<uint32_t(&)[kBc / 4]>(pa));
    v_prev_buf = vbuf;
  };
  step(std::true_type{}, 0);
  for (int it = 1; it < n_walk; ++it) step(std::false_type{}, it);
  mbar_wait(&v_full[v_prev_buf], static_cast<unsigned>((n_walk - 1) / kVBufs) & 1);  // V_{n-1}
  my_turn();
  wgmma_fence();
  issue_pv(v_prev_buf);
  wgmma_commit();
  if (wg == 0) their_turn();  // warpgroup 1's last turn (it hands none back: warpgroup 0 takes no more)
  wgmma_wait<0>();
  fence_regs(o0);
  if (n_tiles == 0) {  // the walked tile's P is zeros, its V maybe NaN (unwritten cells): O is zeros
#pragma unroll
    for (int i = 0; i < kDTiles * 4; ++i) o0[i] = 0.0f;
  }
#endif
  }

  // O / l; a row that saw no visible key has l = 0 and O = 0: zeros, as soft_max gives.
#pragma unroll
  for (int m = 0; m < kMS; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_run[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const bool seen = l > 0.0f;
      // the head's sink: one more term of the denominator at the row's maximum (log2 units)
      if (a.sinks && m_run[m][r] != -INFINITY) l += exp2_approx(a.sinks[h] * kLog2e - m_run[m][r]);
      const float inv = seen ? 1.0f / l : 0.0f;
      const int64_t iq = q0 + slab_row(m) + g + 8 * r;
      if (iq >= n_q) continue;
      // output [dv, n_head, n_q]: a query's heads are adjacent rows
      char* out = row_ptr(a.dst, h, iq, i3);
      if (a.out_f16) {  // element e of the contiguous dst at half e: byte offsets halved
        char* out16 = a.dst.data + (out - a.dst.data) / 2;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
          *reinterpret_cast<__half2*>(out16 + (dt * 8 + t4 * 2) * sizeof(__half)) =
              __floats2half2_rn(o[m][dt][2 * r] * inv, o[m][dt][2 * r + 1] * inv);
        continue;
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        *reinterpret_cast<float2*>(out + (dt * 8 + t4 * 2) * sizeof(float)) =
            make_float2(o[m][dt][2 * r] * inv, o[m][dt][2 * r + 1] * inv);
    }
}

int64_t query_tiles(const Tensor* dst, int slabs) {
  const int64_t br = kBrOf<1> * slabs;
  return (dst->src[0]->ne[1] + br - 1) / br;
}

/// Whether t's data (where set) and strides are multiples of `bytes`.
inline bool aligned(const Tensor* t, size_t bytes) {
  if (t->data && reinterpret_cast<uintptr_t>(t->data) % bytes != 0) return false;
  for (int i = 1; i < 4; ++i)
    if (t->nb[i] % bytes != 0) return false;
  return true;
}

/// K's or V's map for the wgmma kernel (FlashAttnMaps); false where the driver has no encoder or refuses.
/// Boxes {piece, kBc rows, D / piece} in the kKvSwizzle-byte swizzle: K as K-major B of S, V as MN-major
/// B of P V (wgmma_desc_swizzled). The copies read whole 32-byte sectors or more, where 16-byte pieces
/// (core matrices without swizzle) made L2 serve each sector twice: ncu, causal 4,096 tokens, L2 at 78%
/// and the K wait the top stall (15.5% of samples). Op-test perf (H200, causal d128, 4,096 / 16,384
/// tokens): 16-byte pieces 494-499 / 6,150-6,169 us, 32-byte 416-417 / 5,362-5,403, 64-byte 413 /
/// 5,266-5,297, 128-byte 409 / 5,204-5,212.
template <int D, int kBc>
bool encode_kv_map(const Tensor* t, CUtensorMap& map) {
  return encode_rows_map(map, t->data, t->ne.data(), t->nb.data(), D, kBc, kKvSwizzle);
}

/// launched: false where the wgmma kernel's tensor maps cannot be made (nothing ran; the caller
/// takes the mma.sync kernel).
template <int D, int kBc, int kMS, bool kWg, bool kWgSoftcap = false>
CudaError launch_mma(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap, bool* launched = nullptr) {
  FlashAttnMaps maps{};
  if constexpr (kWg) {
    const bool ok = encode_kv_map<D, kBc>(dst->src[1], maps.k) && encode_kv_map<D, kBc>(dst->src[2], maps.v);
    if (launched) *launched = ok;
    if (!ok) return {};
  }
  const Tensor* q = dst->src[0];
  const Tensor* mask = dst->src[3];
  constexpr int kBr = kBrOf<kMS, kWarpsOf<kWg>>, kNT = kWarpsOf<kWg> * kWarpSize;
  const int64_t tiles = (q->ne[1] + kBr - 1) / kBr;
  if (tiles == 0 || q->ne[2] == 0 || q->ne[3] == 0) return {};

  MmaArgs args{desc_of(dst),
               desc_of(q),
               desc_of(dst->src[1]),
               desc_of(dst->src[2]),
               {},
               mask != nullptr,
               mask && mask->type == DType::f16,
               scale,
               softcap,
               nullptr,
               0,
               dst->src[1]->ne[1] - q->ne[1],
               dst->src[4] ? static_cast<const float*>(dst->src[4]->data) : nullptr,
               ctx.act_out_block == kActF16};
  if (ctx.act_out_block && !(args.out_f16 && flash_attn_f16_out_fits(dst)))
    return CudaError::runtime(cudaErrorInvalidValue,
                              "flash_attn: the products after it asked for activations this kernel cannot write",
                              __FILE__, __LINE__);
  if (mask) {
    args.mask = desc_of(mask);
    if (ctx.scratch && ctx.scratch_size >= flash_attn_mma_scratch_bytes(dst)) {
      auto* classes = static_cast<uint8_t*>(ctx.scratch);
      args.k_tiles = (mask->ne[0] + kBc - 1) / kBc;
      const dim3 cgrid(static_cast<unsigned>(args.k_tiles), static_cast<unsigned>(tiles),
                       static_cast<unsigned>(mask->ne[2] * mask->ne[3]));
      flash_attn_tile_class_kernel<<<cgrid, kThreads, 0, ctx.stream>>>(args.mask, args.mask_f16, aligned(mask, 16),
                                                                        q->ne[1], args.causal_off, kBr, kBc, classes);
      LOOM_CUDA_CHECK_LAUNCH("flash_attn_tile_class_kernel");
      args.tile_class = classes;
    }
  }
  constexpr size_t kSmem = kSmemBytes<D, kBc, kMS, kWg>;
  auto kernel = flash_attn_mma_kernel<D, kBc, kMS, kWg, kWgSoftcap>;
  // per launch rather than once: the limit belongs to the current device's context
  LOOM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  const dim3 grid(static_cast<unsigned>(q->ne[2]), static_cast<unsigned>(tiles),
                  static_cast<unsigned>(q->ne[3]));
  kernel<<<grid, kNT, kSmem, ctx.stream>>>(args, maps);
  LOOM_CUDA_CHECK_LAUNCH("flash_attn_mma_kernel");
  return {};
}

}  // namespace

}  // namespace loom::cuda
