// flash_attn on tensor cores for the fast numerics mode: the launches of attention_mma_kernel.cuh's
// kernel with mma.sync, and the choice of its shape (slabs, key tile) and of its wgmma form
// (attention_wgmma.cu, sm_90a).
#include "attention_mma_kernel.cuh"

namespace loom::cuda {

namespace {

/// Blocks from which two slabs a warp pay (H200, op-test perf, causal zeros and -inf masks, d 128): 128
/// blocks (512 queries x 32 heads) 43.7 -> 64.4 us with two (half the SMs' second block idle), 1,024
/// (4,096 queries) 731 -> 675 us, 16,384 queries 220 -> 260 TFLOP/s. A function of the shape alone, as
/// the tile classes' scratch size depends on it. LOOM_CUDA_FA_SLABS=1|2 (read once) forces a count.
constexpr int64_t kTwoSlabMinBlocks = 512;
/// Blocks of 128 queries from which the wgmma form runs where it can (sm_90a, its head sizes): one a
/// SM or more, in passes of kWgmmaMinQueries or more (the shapes measured: fewer queries would leave
/// most of a 128-row block empty). H200, op-test perf, d 128, 32/8 heads, f32 prompt-chunk masks (stop
/// 43), the one-slab mma.sync kernel -> wgmma: 512 queries after 512 cached keys 51.9 -> 43.5 us, after
/// 3,584 147.9 -> 101.2; a 512-token prompt alone 35.1-35.8 -> 36.3-37.3 (slower, kept for one rule).
constexpr int64_t kWgmmaMinBlocks = 128, kWgmmaMinQueries = 512;
int forced_slabs() {
  static const int forced = static_cast<int>(env_int("LOOM_CUDA_FA_SLABS", 0, 1, 2));
  return forced;
}
int64_t wide_blocks(const Tensor* dst) {
  const Tensor* q = dst->src[0];
  return query_tiles(dst, 2) * q->ne[2] * q->ne[3];
}
int flash_attn_slabs(const Tensor* dst) {
  if (dst->src[0]->ne[0] > 128) return 1;
  const int forced = forced_slabs();
  if (forced == 1 || forced == 2) return forced;
  return wide_blocks(dst) >= kTwoSlabMinBlocks ? 2 : 1;
}
/// The wgmma form: where the device and head size allow it and the 128-query blocks fill the GPU (or
/// LOOM_CUDA_FA_SLABS=2 forces 128-query blocks; =1 keeps the one-slab mma.sync kernel).
bool flash_attn_wide(const LaunchContext& ctx, const Tensor* dst, int slabs) {
  const int64_t d = dst->src[0]->ne[0];
  if (!ctx.sm90a || !flash_attn_wgmma_covers(d) || forced_slabs() == 1) return false;
  return slabs == 2 || (wide_blocks(dst) >= kWgmmaMinBlocks && dst->src[0]->ne[1] >= kWgmmaMinQueries);
}

}  // namespace

bool flash_attn_mma_supported(const Tensor* dst) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  const Tensor* v = dst->src[2];
  const Tensor* mask = dst->src[3];
  if (!q || !k || !v) return false;
  const int64_t d = q->ne[0];
  if ((d != 64 && d != 128 && d != 256) || k->ne[0] != d || v->ne[0] != d) return false;
  if (dst->type != DType::f32 || q->type != DType::f32 || k->type != DType::f16 || v->type != DType::f16)
    return false;
  if (mask && mask->type != DType::f32 && mask->type != DType::f16) return false;
  // f16 K/V rows move in 16-byte pieces, Q and the output in float pairs
  if (q->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float) || k->nb[0] != 2 || v->nb[0] != 2)
    return false;
  if (!aligned(k, 16) || !aligned(v, 16) || !aligned(q, 8) || !aligned(dst, 8)) return false;
  if (mask && mask->nb[0] != static_cast<size_t>(mask->type == DType::f16 ? 2 : 4)) return false;
  // grid: heads in x, query tiles in y, sequences in z (the mask pre-pass: tiles, mask heads,
  // mask sequences); key offsets in int
  if (query_tiles(dst, 1) > kMaxGridYZ || q->ne[2] > INT32_MAX || q->ne[3] > kMaxGridYZ) return false;
  if (mask && (mask->ne[2] > kMaxGridYZ || mask->ne[3] > kMaxGridYZ || mask->ne[2] * mask->ne[3] > kMaxGridYZ))
    return false;
  return k->ne[1] < INT32_MAX && k->ne[2] > 0 && q->ne[2] % k->ne[2] == 0;
}

bool flash_attn_f16_out_fits(const Tensor* dst) {
  return dst->type == DType::f32 && dst->is_contiguous() && reinterpret_cast<uintptr_t>(dst->data) % 16 == 0;
}

size_t flash_attn_mma_scratch_bytes(const Tensor* dst) {
  const Tensor* mask = dst->src[3];
  if (!mask) return 0;
  // enough for every form launch_flash_attn_mma may pick (the smallest query and key tiles: one slab,
  // 32 keys), as the wgmma form depends on the device, which the plan does not know
  const auto cells = static_cast<size_t>(query_tiles(dst, 1) * mask->ne[2] * mask->ne[3]);
  return cells * static_cast<size_t>((mask->ne[0] + 31) / 32);
}

CudaError launch_flash_attn_mma(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap) {
  const int64_t d = dst->src[0]->ne[0];
  const int slabs = flash_attn_slabs(dst);
  // wgmma takes the shapes that fill the GPU with 128-query blocks (op-test perf, H200, causal, d 128,
  // 32/8 heads, against the two-slab mma.sync kernel: 2,048 tokens 207 against 213 us, 4,096 594
  // against 633, 16,384 7,288 against 7,905; at 512 tokens, before its spills were removed, 46.7
  // against the one-slab kernel's 38.1: kWgmmaMinBlocks has today's figures)
  if (flash_attn_wide(ctx, dst, slabs)) {
    bool launched = false;
    const CudaError e = launch_flash_attn_wgmma(ctx, dst, scale, softcap, launched);
    if (launched || !e.ok()) return e;
  }
  switch (d) {
    case 64:
      return slabs == 2 ? launch_mma<64, 32, 2, false>(ctx, dst, scale, softcap)
                        : launch_mma<64, 64, 1, false>(ctx, dst, scale, softcap);
    case 128:
      return slabs == 2 ? launch_mma<128, 32, 2, false>(ctx, dst, scale, softcap)
                        : launch_mma<128, 64, 1, false>(ctx, dst, scale, softcap);
    case 256:
      return launch_mma<256, 32, 1, false>(ctx, dst, scale, softcap);
    default:
      return CudaError::runtime(cudaErrorInvalidValue, "flash_attn_mma: head size not 64, 128 or 256",
                                __FILE__, __LINE__);
  }
}

}  // namespace loom::cuda
