// Fused attention (flash_attn). Kernel in attention.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// Largest head size (K and V) the kernel keeps in registers.
inline constexpr int kFlashAttnMaxHead = 512;

/// softmax(softcap(q k^T * scale) + mask) v; softcap 0 disables it.
CudaError launch_flash_attn(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap);

}  // namespace loom::cuda
