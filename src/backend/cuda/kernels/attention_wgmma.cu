// flash_attn's tensor-core kernel (attention_mma_kernel.cuh) with its products on wgmma: sm_90a code,
// in the loom_cuda_sm90a object library. 64-key tiles, one slab of 64 query rows a block.
#include "attention_mma_kernel.cuh"

namespace loom::cuda {

bool flash_attn_wgmma_covers(int64_t d) {
  static const bool on = env_switch("LOOM_CUDA_FA_WGMMA");
  return on && (d == 64 || d == 128);
}

// One slab (64 query rows) a block: with two, the accumulators of both (O 128 registers at head size
// 128) spill; one slab takes 207 registers, so two blocks share an SM, one's softmax beside the other's
// products.
CudaError launch_flash_attn_wgmma(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap,
                                  bool& launched) {
  switch (dst->src[0]->ne[0]) {
    case 64:
      return launch_mma<64, 64, 1, true>(ctx, dst, scale, softcap, &launched);
    case 128:
      return launch_mma<128, 64, 1, true>(ctx, dst, scale, softcap, &launched);
    default:
      return CudaError::runtime(cudaErrorInvalidValue, "flash_attn_wgmma: head size not 64 or 128", __FILE__,
                                __LINE__);
  }
}

}  // namespace loom::cuda
