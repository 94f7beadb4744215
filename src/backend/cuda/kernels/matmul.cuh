// Matrix products: mul_mat (cuBLAS for float weights with many columns, and in the fast numerics
// mode for dequantized quantized weights too; a mat-vec kernel
// otherwise; quantized weights multiply activations quantized as the CPU backend quantizes them)
// and the expert-routed mul_mat_id. Kernels in matmul.cu.
#pragma once

#include "gemm_q.cuh"
#include "launch.h"

namespace loom::cuda {

/// Device scratch mul_mat needs for this node (activations converted for cuBLAS, or quantized; in
/// the fast mode with quantized weights and many columns, also a chunk of dequantized weights).
size_t mul_mat_scratch_bytes(const Tensor* dst, bool fast);
/// Device scratch mul_mat_id needs for this node (quantized activations).
size_t mul_mat_id_scratch_bytes(const Tensor* dst);
CudaError launch_mul_mat(const LaunchContext& ctx, const Tensor* dst);
/// Whether launch_mul_mat calls cuBLAS for this node (the executor orders cuBLAS calls, which share
/// the device's cuBLAS workspace).
bool mul_mat_uses_cublas(const Tensor* dst, bool fast);
/// Fast numerics: f16/bf16 weights at a few columns (2-8 unless LOOM_CUDA_FLOAT_GEMM_MIN_COLS) that go
/// to cuBLAS rather than the mat-vec kernels (and their fusions).
bool float_gemm_few_cols(const Tensor* dst, bool fast);
/// 2-3 products of one activation whose f16 / bf16 weights lie back to back in memory (Q, K and V as the
/// loader places them), in fast numerics past the mat-vec kernels' columns: one cuBLAS GEMM over the
/// stacked rows into the scratch, then the rows copied to each output, or with `glu` (gate and up, count
/// 2) act(gate) * up written to glu instead.
bool stacked_cublas_usable(const Tensor* const* mm, int count, bool fast);
size_t stacked_cublas_scratch_bytes(const Tensor* const* mm, int count);
CudaError launch_stacked_cublas(const LaunchContext& ctx, const Tensor* const* mm, int count,
                                const Tensor* glu = nullptr);
/// Whether launch_stacked_cublas can write glu as contiguous f16 rows over its own bytes (kActF16).
bool stacked_glu_f16_out_fits(const Tensor* glu);
/// Q, K and V of one activation with quantized weights, past gemm_q's columns (prompt passes): the
/// activation packed once; Q dequantized and multiplied alone, K and V (the last two products, of one
/// shape) dequantized back to back and multiplied by one strided-batched cuBLAS GEMM, each into its own
/// output, where two 1024-row GEMMs each took a wave of their own.
bool dequant_multi_usable(const Tensor* const* mm, int count, bool fast);
size_t dequant_multi_scratch_bytes(const Tensor* const* mm, int count);
CudaError launch_dequant_multi(const LaunchContext& ctx, const Tensor* const* mm, int count);
/// For a product through cuBLAS: the element type its activations are packed to at the start of its
/// scratch (1 f16, 2 f32, 3 bf16), so that a product right after another of the same activations in
/// one scratch region can take the packing as it is (LaunchContext::b_packed); 0: none.
int mul_mat_packed_b(const Tensor* dst, bool fast);
/// Whether mul_mat dst packs its activations to contiguous f16 (mul_mat_packed_b 1) from a contiguous
/// 2-D f32 operand, so that a producer may write them so for it (kActF16) and the packing goes.
bool mul_mat_takes_f16_b(const Tensor* dst, bool fast);
/// dst = mul_mat(mm->src[0], mm->src[1]) + bias in one mat-vec kernel (plus the activations'
/// quantization for quantized weights, into ctx.scratch as mul_mat does): dst has mm's shape, bias
/// is a packed f32 [m], added to every column. Any weight type but i32, any
/// column count (the fused path keeps to kMatVecMaxCols, where mul_mat takes this kernel too).
CudaError launch_mul_mat_vec_bias(const LaunchContext& ctx, const Tensor* mm, const Tensor* bias,
                                  const Tensor* dst);
/// Bytes of b's rows quantized for a mat-vec with weights of type `weight` (0 for float weights).
size_t quantized_activation_bytes(DType weight, const Tensor* b);
/// Quantizes all rows of b (f32, any strides) into ctx.scratch, in (i1, i2, i3) row order, as the
/// mat-vec kernels for weights of type `weight` read them (q8_0 blocks, or q8_K for the K-quants).
CudaError launch_quantize_activations(const LaunchContext& ctx, DType weight, const Tensor* b);
/// Whether the fast mode computes these products of one activation (a layer's Q/K/V, or a gate/up
/// pair with its glu) in one gemm_q launch: each would take gemm_q as a mul_mat,
/// gemm_q_products_supported, and several take the warpgroup kernel (sm90a: a device of compute
/// capability 9.0, LaunchContext::sm90a).
bool gemm_q_products_usable(const GemmQProducts& pr, bool fast, bool sm90a);
/// Whether mul_mat dst runs gemm_q on the warpgroup kernel's packed tiles (which a producer may hand
/// it: kActGemmQTiles).
bool mul_mat_takes_gemm_q_tiles(const Tensor* dst, bool fast, bool sm90a);
/// Device scratch of launch_gemm_q_products: the packed activations and the partial sums.
size_t gemm_q_products_scratch_bytes(const GemmQProducts& pr);
/// The products in one gemm_q launch (with its packing and, split or gated, its reduction), where
/// gemm_q_products_usable.
CudaError launch_gemm_q_products(const LaunchContext& ctx, const GemmQProducts& pr);
/// Expert ids out of range give NaN columns.
CudaError launch_mul_mat_id(const LaunchContext& ctx, const Tensor* dst);

}  // namespace loom::cuda
