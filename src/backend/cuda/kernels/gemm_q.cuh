// The fast numerics mode's tensor-core GEMM for quantized weights at a few dozen columns (gemm_q.cu):
// weights dequantized into mma fragments, never through an f16 copy in global memory.
#pragma once

#include <cuda_fp16.h>

#include "gemm_q_plan.h"
#include "launch.h"

namespace loom::cuda {

/// The products of one gemm_q launch: 1-3 mul_mats of one activation with weights of one type (a
/// layer's Q, K and V), each written to its output; or, with glu (a swiglu/geglu node of mm[0], the
/// gate, and mm[1], the up projection), only the gated product, into glu (the sums of the two go
/// through the partial-sum scratch, and the reduction applies the activation).
struct GemmQProducts {
  const Tensor* mm[gemm_q_plan::kMaxParts] = {};
  int count = 1;
  const Tensor* glu = nullptr;
};

/// Whether gemm_q_kernel can compute mul_mat node dst: quantized 2-D weights with k a multiple of
/// 256, a contiguous output.
bool gemm_q_supported(const Tensor* dst);
/// Whether one launch can compute the products: each gemm_q_supported, one activation and weight
/// type, every part's rows but the last's a whole number of 256-row tiles; glu: two of one shape.
bool gemm_q_products_supported(const GemmQProducts& pr);
/// Scratch for the partial sums when the products are split over k or gated (0 when neither).
size_t gemm_q_partial_bytes(const GemmQProducts& pr);
/// The products with b's elements given as f16 in x16: contiguous [k, n], or with `tiles` the
/// warpgroup kernel's tiles (pack_gemm_q_tiles, gemm_q_wgmma.cuh; only where ctx.sm90a and
/// gemm_q_wgmma_covers); `partial` holds gemm_q_partial_bytes(pr).
CudaError launch_gemm_q(const LaunchContext& ctx, const GemmQProducts& pr, const __half* x16, float* partial,
                        bool tiles);

}  // namespace loom::cuda
