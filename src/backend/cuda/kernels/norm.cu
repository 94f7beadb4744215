// Row normalizations: one block per row, block-wide sums in double and the scale formed in double,
// as the CPU backend does (ops_rows.cpp), so both round the same exact value to float and give the
// same bits (docs/NUMERICS.md).
// Bytes model: the row is read twice (norm: three times) and written once; L2 holds it between.
#include "common.cuh"
#include "norm.cuh"

namespace loom::cuda {

namespace {

// norm is rms_norm of the row less its mean: kCenter adds the pass that computes the mean.
template <bool kCenter>
__global__ void norm_kernel(TensorDesc dst, TensorDesc a, float eps) {
  pdl_wait();
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < nrows(dst); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, dst.ne[1], dst.ne[2], i1, i2, i3);
    const auto* x = reinterpret_cast<const float*>(row_ptr(a, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(row_ptr(dst, i1, i2, i3));
    const int64_t n = dst.ne[0];
    double mean = 0.0;
    if constexpr (kCenter) {
      double sum = 0.0;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
      mean = block_sum(sum, scratch) / static_cast<double>(n);
    }
    double var = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const double c = x[i] - mean;
      var += c * c;
    }
    var = block_sum(var, scratch);
    const auto s = static_cast<float>(1.0 / sqrt(var / static_cast<double>(n) + eps));
    const auto m = static_cast<float>(mean);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(__fsub_rn(x[i], m), s);
  }
}

}  // namespace

CudaError launch_norm(const LaunchContext& ctx, const Tensor* dst, float eps) {
  const int64_t rows = dst->nrows();
  if (rows == 0 || dst->ne[0] == 0) return {};
  const int threads = row_block_threads(dst->ne[0]);
  if (dst->op == OpKind::rms_norm) {
    norm_kernel<false><<<row_grid(rows), threads, 0, ctx.stream>>>(desc_of(dst), desc_of(dst->src[0]), eps);
    LOOM_CUDA_CHECK_LAUNCH("rms_norm_kernel");
  } else {
    norm_kernel<true><<<row_grid(rows), threads, 0, ctx.stream>>>(desc_of(dst), desc_of(dst->src[0]), eps);
    LOOM_CUDA_CHECK_LAUNCH("norm_kernel");
  }
  return {};
}

}  // namespace loom::cuda
