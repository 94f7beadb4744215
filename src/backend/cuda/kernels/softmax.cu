// soft_max: one block per row (soft_max_row in softmax_row.cuh: pass 1 writes the scaled, masked
// logits to dst and finds the maximum; pass 2 exponentiates and sums; pass 3 normalizes). Each
// thread touches the same elements in every pass, so dst may alias the input (in-place).
// Bytes model: 3 reads + 2 writes of the row, all L2-resident for rows up to ~MBs.
#include "common.cuh"
#include "softmax.cuh"
#include "softmax_row.cuh"

namespace loom::cuda {

namespace {

__global__ void soft_max_kernel(TensorDesc dst, TensorDesc a, TensorDesc mask, bool has_mask, bool mask_f16,
                                float scale) {
  pdl_wait();
  __shared__ double scratch[32];
  const int64_t n = dst.ne[0];
  for (int64_t r = blockIdx.x; r < nrows(dst); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, dst.ne[1], dst.ne[2], i1, i2, i3);
    const auto* x = reinterpret_cast<const float*>(row_ptr(a, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(row_ptr(dst, i1, i2, i3));
    // the mask's rows follow the logits' rows; it broadcasts over dims 2-3
    const char* m = has_mask ? row_ptr(mask, i1, i2 % mask.ne[2], i3 % mask.ne[3]) : nullptr;
    soft_max_row(
        y, n,
        [&](int64_t i) {
          float v = __fmul_rn(x[i], scale);  // then the mask: two roundings, as on the CPU
          if (m)
            v += mask_f16 ? f16_to_float(reinterpret_cast<const uint16_t*>(m)[i])
                          : reinterpret_cast<const float*>(m)[i];
          return v;
        },
        scratch);
  }
}

}  // namespace

CudaError launch_soft_max(const LaunchContext& ctx, const Tensor* dst, float scale) {
  const int64_t rows = dst->nrows();
  if (rows == 0 || dst->ne[0] == 0) return {};
  const Tensor* mask = dst->src[1];
  const TensorDesc mask_desc = mask ? desc_of(mask) : TensorDesc{};
  soft_max_kernel<<<row_grid(rows), row_block_threads(dst->ne[0]), 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), mask_desc, mask != nullptr, mask && mask->type == DType::f16,
      scale);
  LOOM_CUDA_CHECK_LAUNCH("soft_max_kernel");
  return {};
}

}  // namespace loom::cuda
