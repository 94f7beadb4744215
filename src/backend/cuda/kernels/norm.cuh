// Row normalizations over dim 0: rms_norm and norm. Kernels in norm.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// rms_norm or norm (dst->op) of src[0] with epsilon `eps`.
CudaError launch_norm(const LaunchContext& ctx, const Tensor* dst, float eps);

}  // namespace loom::cuda
