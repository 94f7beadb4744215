// Matrix products: mul_mat (cuBLAS for float weights with many columns, a dequantizing
// mat-vec kernel otherwise) and the expert-routed mul_mat_id. Kernels in matmul.cu.
#pragma once

#include "backend/cuda/kernels/launch.h"

namespace loom::cuda {

/// Device scratch mul_mat needs for this node (activations converted for cuBLAS).
size_t mul_mat_scratch_bytes(const Tensor* dst);
CudaError launch_mul_mat(const LaunchContext& ctx, const Tensor* dst);
/// Expert ids out of range give NaN columns.
CudaError launch_mul_mat_id(const LaunchContext& ctx, const Tensor* dst);

}  // namespace loom::cuda
