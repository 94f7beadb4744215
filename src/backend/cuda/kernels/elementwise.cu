// Elementwise kernels. One thread per element with a grid-stride loop; every operand is
// addressed through its strides, so views with gaps between rows work unchanged.
// Bytes model: 8-12 bytes moved per element, far below compute; the int64 index splits dominate
// for now (a contiguous fast path is future work).
#include "activation.cuh"
#include "common.cuh"
#include "elementwise.cuh"

namespace loom::cuda {

namespace {

enum class Binary : int { add, sub, mul, div };
enum class Unary : int { scale, silu, gelu, gelu_erf, softcap };

// Element i[4] of an f32 tensor.
__device__ __forceinline__ float& f32_at(const TensorDesc& t, const int64_t* i) {
  return *reinterpret_cast<float*>(element_ptr(t, i[0], i[1], i[2], i[3]));
}

__global__ void binary_kernel(TensorDesc dst, TensorDesc a, TensorDesc b, OpKind op) {
  pdl_wait();
  for_each_element(dst, [&](const int64_t* i) {
    const int64_t j[4] = {i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]};
    const float x = f32_at(a, i), y = f32_at(b, j);
    float r;
    switch (op) {
      case OpKind::sub:
        r = x - y;
        break;
      case OpKind::mul:
        r = x * y;
        break;
      case OpKind::div:
        r = x / y;
        break;
      default:  // add
        r = x + y;
        break;
    }
    f32_at(dst, i) = r;
  });
}

__global__ void unary_kernel(TensorDesc dst, TensorDesc a, OpKind op, float p0, float p1) {
  pdl_wait();
  for_each_element(dst, [&](const int64_t* i) {
    const float x = f32_at(a, i);
    float r;
    switch (op) {
      case OpKind::silu:
        r = silu_f(x);
        break;
      case OpKind::gelu:
        r = gelu_tanh_f(x);
        break;
      case OpKind::gelu_erf:
        r = gelu_erf_f(x);
        break;
      case OpKind::softcap:
        r = softcap_f(x, p0);
        break;
      default:  // scale
        r = __fadd_rn(__fmul_rn(x, p0), p1);  // two roundings, as on the CPU (no FMA)
        break;
    }
    f32_at(dst, i) = r;
  });
}

__global__ void gated_kernel(TensorDesc dst, TensorDesc gate, TensorDesc up, bool swiglu) {
  pdl_wait();
  for_each_element(
      dst, [&](const int64_t* i) { f32_at(dst, i) = gated_f(f32_at(gate, i), f32_at(up, i), swiglu); });
}

constexpr int kThreads = 256;

}  // namespace

CudaError launch_binary(const LaunchContext& ctx, const Tensor* dst) {
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  binary_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(dst->src[0]),
                                                                    desc_of(dst->src[1]), dst->op);
  LOOM_CUDA_CHECK_LAUNCH("binary_kernel");
  return {};
}

CudaError launch_unary(const LaunchContext& ctx, const Tensor* dst, float p0, float p1) {
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  unary_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(dst->src[0]),
                                                                   dst->op, p0, p1);
  LOOM_CUDA_CHECK_LAUNCH("unary_kernel");
  return {};
}

CudaError launch_gated(const LaunchContext& ctx, const Tensor* dst) {
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  gated_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), dst->op == OpKind::swiglu);
  LOOM_CUDA_CHECK_LAUNCH("gated_kernel");
  return {};
}

}  // namespace loom::cuda
