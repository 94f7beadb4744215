// The fast numerics mode's tensor-core GEMM for quantized weights at a few dozen columns (gemm_q.cu):
// weights dequantized into mma fragments, never through an f16 copy in global memory.
#pragma once

#include <cuda_fp16.h>

#include "launch.h"

namespace loom::cuda {

/// Whether gemm_q_kernel can compute mul_mat node dst: quantized 2-D weights with k a multiple of
/// 256, a contiguous output.
bool gemm_q_supported(const Tensor* dst);
/// Scratch for the partial sums when the product is split over k (0 when it is not).
size_t gemm_q_partial_bytes(const Tensor* dst);
/// dst = mul_mat(dst->src[0], b) with b's elements given as f16 in x16: contiguous [k, n], or with
/// `tiles` the warpgroup kernel's tiles (pack_gemm_q_tiles, gemm_q_wgmma.cuh; only where
/// ctx.sm90a and gemm_q_wgmma_covers); `partial` holds gemm_q_partial_bytes(dst).
CudaError launch_gemm_q(const LaunchContext& ctx, const Tensor* dst, const __half* x16, float* partial, bool tiles);

}  // namespace loom::cuda
