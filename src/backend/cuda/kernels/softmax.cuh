// soft_max over dim 0 with scale and optional mask. Kernel in softmax.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// softmax(src[0] * scale + src[1]) per row; src[1] (f32 or f16) may be null.
CudaError launch_soft_max(const LaunchContext& ctx, const Tensor* dst, float scale);

}  // namespace loom::cuda
