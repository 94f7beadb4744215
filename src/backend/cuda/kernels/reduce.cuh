// Row reductions and selections: sum_rows, argmax, top_k. Kernels in reduce.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

CudaError launch_sum_rows(const LaunchContext& ctx, const Tensor* dst);
/// Index of each row's largest element; the first index wins ties.
CudaError launch_argmax(const LaunchContext& ctx, const Tensor* dst);
/// Indices of each row's k largest elements, largest first, lower index first among equals.
/// Rows of a vocabulary (4096 and more) with k <= 128 are split over blocks, each chunk's best k
/// to top_k_scratch_bytes() of ctx.scratch, then merged; without that scratch, one block per row.
CudaError launch_top_k(const LaunchContext& ctx, const Tensor* dst, int k);
size_t top_k_scratch_bytes(const Tensor* dst, int k);

}  // namespace loom::cuda
