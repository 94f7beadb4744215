// Row reductions and selections: sum_rows, argmax, top_k. Kernels in reduce.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

CudaError launch_sum_rows(const LaunchContext& ctx, const Tensor* dst);
/// Index of each row's largest element; the first index wins ties.
CudaError launch_argmax(const LaunchContext& ctx, const Tensor* dst);
/// Indices of each row's k largest elements, largest first, lower index first among equals.
CudaError launch_top_k(const LaunchContext& ctx, const Tensor* dst, int k);

}  // namespace loom::cuda
