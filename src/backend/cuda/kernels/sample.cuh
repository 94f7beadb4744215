// sample_tokens: one token per logits row from its top-k candidates (loom::Sampler's chain after
// penalties). Kernel in sample.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// Each row's token, or -1 for a row with a NaN or +inf logit or no finite candidate.
/// Rows of 8192 and more are checked for NaN/+inf by a block per 4096 floats, whose flags take
/// sample_tokens_scratch_bytes() of ctx.scratch (without it one block scans the row).
CudaError launch_sample_tokens(const LaunchContext& ctx, const Tensor* dst);
size_t sample_tokens_scratch_bytes(const Tensor* dst);

}  // namespace loom::cuda
