// Data movement with conversion: get_rows, set_rows, cpy, concat. Kernels in copy.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// Rows of src[0] (any type) picked by src[1] (i32), as f32; an index out of range gives NaN.
CudaError launch_get_rows(const LaunchContext& ctx, const Tensor* dst);
/// Writes the f32 rows of src[0] into dst (any type but i32) at rows src[1]; indices out of range
/// write nothing. Quantized blocks are the CPU reference quantizer's, byte for byte.
CudaError launch_set_rows(const LaunchContext& ctx, const Tensor* dst);
/// Copies src[0] (any type) into dst (any type) element by element in logical order, converting
/// the type.
CudaError launch_cpy(const LaunchContext& ctx, const Tensor* dst);
CudaError launch_concat(const LaunchContext& ctx, const Tensor* dst, int dim);

}  // namespace loom::cuda
