// Elementwise kernels. One thread per element with a grid-stride loop; every operand is
// addressed through its strides, so views with gaps between rows work unchanged.
// Bytes model: 8-12 bytes moved per element, far below compute; the int64 index splits dominate
// for now (a contiguous fast path is future work).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/elementwise.cuh"

namespace loom::cuda {

namespace {

enum class Binary : int { add, sub, mul, div };
enum class Unary : int { scale, silu, gelu, gelu_erf, softcap };

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
// GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
__device__ __forceinline__ float gelu_tanh_f(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}
__device__ __forceinline__ float gelu_erf_f(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

__global__ void binary_kernel(TensorDesc dst, TensorDesc a, TensorDesc b, Binary op) {
  const int64_t n = nelements(dst);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i[4];
    split_index(e, dst.ne, i);
    const float x = *reinterpret_cast<const float*>(element_ptr(a, i[0], i[1], i[2], i[3]));
    const float y = *reinterpret_cast<const float*>(
        element_ptr(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]));
    float r;
    switch (op) {
      case Binary::add:
        r = x + y;
        break;
      case Binary::sub:
        r = x - y;
        break;
      case Binary::mul:
        r = x * y;
        break;
      default:
        r = x / y;
        break;
    }
    *reinterpret_cast<float*>(element_ptr(dst, i[0], i[1], i[2], i[3])) = r;
  }
}

__global__ void unary_kernel(TensorDesc dst, TensorDesc a, Unary op, float p0, float p1) {
  const int64_t n = nelements(dst);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i[4];
    split_index(e, dst.ne, i);
    const float x = *reinterpret_cast<const float*>(element_ptr(a, i[0], i[1], i[2], i[3]));
    float r;
    switch (op) {
      case Unary::scale:
        r = x * p0 + p1;
        break;
      case Unary::silu:
        r = silu_f(x);
        break;
      case Unary::gelu:
        r = gelu_tanh_f(x);
        break;
      case Unary::gelu_erf:
        r = gelu_erf_f(x);
        break;
      default:
        r = p0 * tanhf(x / p0);
        break;
    }
    *reinterpret_cast<float*>(element_ptr(dst, i[0], i[1], i[2], i[3])) = r;
  }
}

__global__ void gated_kernel(TensorDesc dst, TensorDesc gate, TensorDesc up, bool swiglu) {
  const int64_t n = nelements(dst);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i[4];
    split_index(e, dst.ne, i);
    const float g = *reinterpret_cast<const float*>(element_ptr(gate, i[0], i[1], i[2], i[3]));
    const float u = *reinterpret_cast<const float*>(element_ptr(up, i[0], i[1], i[2], i[3]));
    *reinterpret_cast<float*>(element_ptr(dst, i[0], i[1], i[2], i[3])) =
        (swiglu ? silu_f(g) : gelu_tanh_f(g)) * u;
  }
}

constexpr int kThreads = 256;

}  // namespace

CudaError launch_binary(const LaunchContext& ctx, const Tensor* dst) {
  Binary op = Binary::add;
  switch (dst->op) {
    case OpKind::sub:
      op = Binary::sub;
      break;
    case OpKind::mul:
      op = Binary::mul;
      break;
    case OpKind::div:
      op = Binary::div;
      break;
    default:
      break;
  }
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  binary_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(dst->src[0]),
                                                                    desc_of(dst->src[1]), op);
  LOOM_CUDA_CHECK_LAUNCH("binary_kernel");
  return {};
}

CudaError launch_unary(const LaunchContext& ctx, const Tensor* dst, float p0, float p1) {
  Unary op = Unary::scale;
  switch (dst->op) {
    case OpKind::silu:
      op = Unary::silu;
      break;
    case OpKind::gelu:
      op = Unary::gelu;
      break;
    case OpKind::gelu_erf:
      op = Unary::gelu_erf;
      break;
    case OpKind::softcap:
      op = Unary::softcap;
      break;
    default:
      break;
  }
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  unary_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(dst->src[0]), op, p0,
                                                                   p1);
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
