// flash_attn's tensor-core kernel (attention_mma_kernel.cuh) with its products on wgmma: sm_90a code,
// in the loom_cuda_sm90a object library. 128-key tiles, two warpgroups of 64 query rows a block.
#include "attention_mma_kernel.cuh"

namespace loom::cuda {

bool flash_attn_wgmma_covers(int64_t d) {
  static const bool on = env_switch("LOOM_CUDA_FA_WGMMA");
  return on && (d == 64 || d == 128);
}

// 128-key tiles against 64 (H200, op-test perf, causal d 128 32/8 heads, before the swizzled K/V copies):
// 4,096 tokens 507 us against 526, 16,384 6,273 against 6,915, 2,048 180 against 174, then with 224 bytes
// of spill stores a thread (255 registers; none since the mask's tile offsets went 32-bit and the softcap
// went to the mma.sync kernel).
CudaError launch_flash_attn_wgmma(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap,
                                  bool& launched) {
  launched = false;
  // a softcapped head (gemma2-27b: 128, softcap 50) takes an instantiation of its own, so that the
  // softcap's registers do not make the others spill
  const bool cap = softcap > 0.0f;
  switch (dst->src[0]->ne[0]) {
    case 64:
      return cap ? launch_mma<64, 128, 1, true, true>(ctx, dst, scale, softcap, &launched)
                 : launch_mma<64, 128, 1, true>(ctx, dst, scale, softcap, &launched);
    case 128:
      return cap ? launch_mma<128, 128, 1, true, true>(ctx, dst, scale, softcap, &launched)
                 : launch_mma<128, 128, 1, true>(ctx, dst, scale, softcap, &launched);
    default:
      return CudaError::runtime(cudaErrorInvalidValue, "flash_attn_wgmma: head size not 64 or 128", __FILE__,
                                __LINE__);
  }
}

}  // namespace loom::cuda
