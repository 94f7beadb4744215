// Fused attention (flash_attn). Kernels in attention.cu (exact numerics), attention_mma.cu (fast, prefill)
// and attention_decode.cu (fast, decode).
#pragma once

#include "launch.h"
#include "rope_args.h"

namespace loom::cuda {

/// Largest head size (K and V) the kernel keeps in registers.
inline constexpr int kFlashAttnMaxHead = 512;
/// Queries per head from which the fast mode runs flash attention on tensor cores
/// (launch_flash_attn_mma), below which it runs the decode kernel (launch_flash_attn_decode): the
/// mma kernel's query tile is 64 rows, so fewer queries leave most of a tile's mma work unused, while
/// the split decode kernel spreads one query's keys over 16 warps.
inline constexpr int64_t kFlashAttnMmaMinQueries = 16;

/// softmax(softcap(q k^T * scale) + mask) v; softcap 0 disables it.
CudaError launch_flash_attn(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap);

/// Whether launch_flash_attn_mma handles this flash_attn node: f32 Q, f16 K/V, d == dv in {64, 128,
/// 256}, rows aligned for 16-byte K/V and 8-byte Q/output accesses. Checks the data pointers too
/// when they are set, so call it at launch time.
bool flash_attn_mma_supported(const Tensor* dst);
/// Device scratch launch_flash_attn_mma uses, when the context has that much, to find each query
/// tile's visible keys once per mask rather than once per head (0 without a mask).
size_t flash_attn_mma_scratch_bytes(const Tensor* dst);
/// flash_attn on tensor cores (mma.sync f16 inputs, f32 accumulation): for the fast numerics mode.
/// dst must pass flash_attn_mma_supported. Kernels in attention_mma.cu.
CudaError launch_flash_attn_mma(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap);

/// Whether launch_flash_attn_mma can write dst as contiguous f16 over its own bytes (kActF16: the
/// packed activations of the products after it): dst contiguous and 16-byte aligned.
bool flash_attn_f16_out_fits(const Tensor* dst);
/// Whether launch_flash_attn_wgmma takes head size d (64 or 128) and LOOM_CUDA_FA_WGMMA is not 0. It is
/// sm_90a code: launch_flash_attn_mma calls it only where LaunchContext::sm90a.
bool flash_attn_wgmma_covers(int64_t d);
/// launch_flash_attn_mma's kernel with its products on wgmma (attention_wgmma.cu): 128-key tiles, 128
/// query rows a block (flash_attn_mma_scratch_bytes covers its tile classes); a softcap takes an
/// instantiation of its own. launched: false where K's or V's tensor map cannot be made (nothing ran;
/// the mma.sync kernel takes over).
CudaError launch_flash_attn_wgmma(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap,
                                  bool& launched);

/// K and V of a flash_attn read through row indices instead of from dst->src[1] / src[2], which then
/// only give the shapes [d, n_kv, n_head_kv, n_seqs] (the gather_flash_attn fusion: they are
/// reshapes of get_rows outputs that are never written). Key j of KV head h of sequence s is row
/// k_idx[j + n_kv * (h + n_head_kv * s)] of k_store (rows of ne[0] elements, nb[1] bytes apart);
/// likewise V. An index outside the store gives a NaN row, as get_rows does.
struct FlashAttnRows {
  const Tensor* k_store;
  const Tensor* k_idx;
  const Tensor* v_store;
  const Tensor* v_idx;
};

/// Whether launch_flash_attn_decode handles this flash_attn node: f32 Q and output, f16 K/V,
/// d == dv in {64, 128, 256}, query heads a multiple of the KV heads, rows 16-byte aligned. With
/// `rows`, the same of the stores' rows, and i32 packed indices, one per key of every head and
/// sequence. Checks the data pointers too when they are set, so call it at launch time.
bool flash_attn_decode_supported(const Tensor* dst, const FlashAttnRows* rows = nullptr);
/// Whether launch_flash_attn_decode, asked by ctx.act_out_block, writes its output as the fast
/// mat-vec's quantized activations of act_block (32 or 256) for the output projection: when its keys
/// are split (the merge writes them) and a merge block holds whole activation blocks of whole heads;
/// or (kActF16) as contiguous f16 rows for a product through cuBLAS (a batched step's): dst contiguous.
bool flash_attn_decode_writes_act(const Tensor* dst, const FlashAttnRows* rows, int act_block);
/// Whether launch_flash_attn_decode of dst (contiguous K/V) splits its keys whatever its output's form
/// (f32, f16 rows or activations): the merge kernel then writes the output, after every block of the
/// splits has read its operands. A function of the shape.
bool flash_attn_decode_merged(const Tensor* dst);
/// Device scratch launch_flash_attn_decode needs for its splits' partial results (0: one split).
size_t flash_attn_decode_scratch_bytes(const Tensor* dst);
/// One token's rope and KV-cache stores done by the decode kernel (the rope_flash_attn fusion):
/// rope_q = rope(q) is dst's Q (through a permute) and nothing else reads it; set_rows_k stores
/// permute(rope_k = rope(k)) and set_rows_v permute(v) at the token's cell; dst's K and V are views of
/// the two stores from their first cell. The kernel reads q, k and v as the products left them,
/// rotates Q and the new key with the rope's arithmetic and stores the new K/V row as f16; where a
/// block's keys include the new cell it takes that row from its registers instead of the cache.
struct FlashAttnRope {
  const Tensor* rope_k;
  const Tensor* set_rows_k;
  const Tensor* rope_q;
  const Tensor* set_rows_v;
  RopeArgs args;
};

/// flash_attn for few queries in the fast numerics mode (flash-decoding: the keys split over blocks,
/// K/V read once per KV head, float softmax), K/V read through `rows` when given, with the rope and
/// stores of `rope` when given (not with rows). Kernels in attention_decode.cu.
CudaError launch_flash_attn_decode(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap,
                                   const FlashAttnRows* rows = nullptr, const FlashAttnRope* rope = nullptr);
/// Whether launch_flash_attn_decode takes `rope` with dst (beyond flash_attn_decode_supported): one
/// token of one sequence, f16 caches, the views and strides the kernel assumes, a rope whose pairs a
/// lane group holds (normal mode, or neox with n_dims / 16 a power of two). The caller checks that
/// the rope/store nodes are rope_set_rows' (rope_set_rows_ok). Checks data pointers when set.
bool flash_attn_decode_rope_supported(const Tensor* dst, const FlashAttnRope& rope);

}  // namespace loom::cuda
