// Rotary position embedding. Kernel in rope.cu.
#pragma once

#include "launch.h"
#include "rope_args.h"

namespace loom::cuda {

/// dst = rope(src[0]) with positions src[1] and optional frequency factors src[2].
CudaError launch_rope(const LaunchContext& ctx, const Tensor* dst, const RopeArgs& args);

}  // namespace loom::cuda
