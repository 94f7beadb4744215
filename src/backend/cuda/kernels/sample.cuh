// sample_tokens: one token per logits row from its top-k candidates (loom::Sampler's chain after
// penalties). Kernel in sample.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// Each row's token, or -1 for a row with a NaN or +inf logit or no finite candidate.
CudaError launch_sample_tokens(const LaunchContext& ctx, const Tensor* dst);

}  // namespace loom::cuda
