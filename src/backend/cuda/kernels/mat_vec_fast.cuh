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

/// The activation block (32 or 256, mat_vec_fast_formats.cuh's ActFast layout) in which the fast
/// quantized mat-vec reads mm's activations when it takes mm (output dst), whatever the scratch;
/// 0 when it does not (float weights, too many columns, unaligned rows). With ctx.act_in it reads
/// them from mm->src[1]'s own bytes, quantized by the dispatch that produced them (a norm, or
/// flash-decoding's merge), and quantizes nothing.
int mat_vec_fast_act_block(const Tensor* mm, const Tensor* dst);

/// The error of a mat-vec whose activations their producer quantized (ctx.act_in) that the fast
/// kernels do not take: the plan and the launch disagree; nothing reads codes as f32.
inline CudaError act_in_missed() {
  return CudaError::runtime(cudaErrorInvalidValue,
                            "mat-vec: activations quantized by their producer, but the fast mat-vec does not take "
                            "the product",
                            __FILE__, __LINE__);
}

/// dst = mm->src[0] x mm->src[1] (+ bias[i] on row i when bias is not null), dst of mm's shape.
/// Quantized weights first quantize the activations into ctx.scratch (mat_vec_fast_formats.cuh).
CudaError launch_mat_vec_fast(const LaunchContext& ctx, const Tensor* mm, const Tensor* dst, const float* bias);

/// Whether every one of `count` products (mul_mats of one activation, weights of one type) is one
/// launch_mat_vec_fast takes, written to its own output.
bool mat_vec_fast_supports_multi(const LaunchContext& ctx, const Tensor* const* mms, int count);

/// Whether 2-3 products of one activation with q4_K and q6_K weights (a Q4_K_M file's Q, K and V) at one
/// column take one launch of the direct kernels' mixed form (launch_mat_vec_fast_mixed), the fast
/// numerics' only mat_vec_multi of mixed weight types. A function of the tensors alone (plan time).
bool mat_vec_fast_mixed_ok(const Tensor* const* mms, int count);

/// Those products in that one launch, plus the activations' quantization unless handed over.
CudaError launch_mat_vec_fast_mixed(const LaunchContext& ctx, const Tensor* const* mms, int count);

/// The fused mat_vec_multi (2-3 products of one activation, fused.cu checks the shapes) in one launch,
/// plus the activations' quantization for quantized weights.
CudaError launch_mat_vec_fast_multi(const LaunchContext& ctx, const Tensor* const* mms, int count);

/// The fused glu_mat_vec: glu = act(gate) * up of two products of one activation (same shapes and
/// weight type), the gate and up rows of a tile read together and gated in the epilogue.
CudaError launch_mat_vec_fast_glu(const LaunchContext& ctx, const Tensor* gate, const Tensor* up,
                                  const Tensor* glu);

}  // namespace loom::cuda
