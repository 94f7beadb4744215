// Rotary embedding: one block per row (one head of one token), one thread per rotating pair;
// dimensions past n_dims are copied. The rotation itself is rope_row (rope_row.cuh); each pair is
// read and written by the same thread, so the op may run in place.
#include "common.cuh"
#include "rope.cuh"
#include "rope_row.cuh"

namespace loom::cuda {

namespace {

__global__ void rope_kernel(TensorDesc dst, TensorDesc a, TensorDesc pos, TensorDesc freq_factors,
                            bool has_ff, RopeArgs p) {
  pdl_wait();
  for (int64_t r = blockIdx.x; r < nrows(dst); r += gridDim.x) {
    int64_t i1, i2, i3;
    split_row(r, dst.ne[1], dst.ne[2], i1, i2, i3);
    const auto* x = reinterpret_cast<const float*>(row_ptr(a, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(row_ptr(dst, i1, i2, i3));
    const int32_t position = *reinterpret_cast<const int32_t*>(pos.data + i2 * pos.nb[0]);
    rope_row(x, dst.ne[0], position, p, freq_factors, has_ff, [&](int64_t j, float v) { y[j] = v; });
  }
}

}  // namespace

CudaError launch_rope(const LaunchContext& ctx, const Tensor* dst, const RopeArgs& args) {
  if (dst->nrows() == 0) return {};
  const Tensor* ff = dst->src[2];
  const TensorDesc ff_desc = ff ? desc_of(ff) : TensorDesc{};
  rope_kernel<<<row_grid(dst->nrows()), row_block_threads(dst->ne[0]), 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), ff_desc, ff != nullptr, args);
  LOOM_CUDA_CHECK_LAUNCH("rope_kernel");
  return {};
}

}  // namespace loom::cuda
