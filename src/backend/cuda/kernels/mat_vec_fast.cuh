// The fast numerics mode's mat-vec (mul_mat and mat_vec_bias with at most kMatVecMaxCols columns):
// float accumulation, several rows per block, 16-byte weight loads (mat_vec_fast.cu). The exact
// mode's kernels (matmul.cu, mat_vec.cuh) are not involved.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// Whether launch_mat_vec_fast takes this product: f32/f16/bf16 weights with 16-byte aligned rows
/// and contiguous, 16-byte aligned activation columns, or quantized weights of any block format (any
/// activation strides) with ctx.scratch large enough; at most kMatVecMaxCols columns. Other products
/// stay on the exact kernels, which take any layout.
bool mat_vec_fast_supports(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst);

/// dst = mm->src[0] x mm->src[1] (+ bias[i] on row i when bias is not null), dst of mm's shape.
/// Quantized weights first quantize the activations into ctx.scratch (mat_vec_fast_formats.cuh).
CudaError launch_mat_vec_fast(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias);

}  // namespace loom::cuda
