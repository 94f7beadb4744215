// Elementwise kernels. One thread per element with a grid-stride loop; every operand is
// addressed through its strides, so views with gaps between rows work unchanged.
// Bytes model: 8-12 bytes moved per element, far below compute; the int64 index splits dominate
// for now (a contiguous fast path is future work).
#include <cstdint>

#include "activation.cuh"
#include "common.cuh"
#include "elementwise.cuh"
#include "loom/graph.h"

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

// The same over rows of float4s (every operand: contiguous rows of a multiple of 4 elements, 16-byte
// aligned): one index split per 4 elements and 16-byte accesses. A prefill chunk's swiglu over
// [14336, 512] on the H200 took 82 us at one element per thread (~1 TB/s of its 88 MB).
// kFast: the activation in float (gated_fast_f), in the fast numerics mode. out16 (dst contiguous):
// the result as contiguous f16 there instead (kActF16: the next product's packed activations).
template <bool kFast>
__global__ void gated4_kernel(TensorDesc dst, TensorDesc gate, TensorDesc up, bool swiglu, int64_t n4, uint2* out16) {
  pdl_wait();
  const int64_t per_row = dst.ne[0] / 4;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n4;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = v / per_row, c = (v % per_row) * 4 * static_cast<int64_t>(sizeof(float));
    const int64_t i1 = r % dst.ne[1], i2 = (r / dst.ne[1]) % dst.ne[2], i3 = r / (dst.ne[1] * dst.ne[2]);
    const float4 g = *reinterpret_cast<const float4*>(row_ptr(gate, i1, i2, i3) + c);
    const float4 u = *reinterpret_cast<const float4*>(row_ptr(up, i1, i2, i3) + c);
    auto act = [&](float x, float y) { return kFast ? gated_fast_f(x, y, swiglu) : gated_f(x, y, swiglu); };
    const float4 o = make_float4(act(g.x, u.x), act(g.y, u.y), act(g.z, u.z), act(g.w, u.w));
    if (out16) {
      const __half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
      out16[v] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      *reinterpret_cast<float4*>(row_ptr(dst, i1, i2, i3) + c) = o;
    }
  }
}

// The expert activations of a MoE layer ([n_ff_exp, n_used, n_tokens], 2 x 360 KB for a 512-token
// gpt-oss-20b chunk): one element per thread is enough.
__global__ void swiglu_oai_kernel(TensorDesc dst, TensorDesc gate, TensorDesc up, float alpha, float limit) {
  pdl_wait();
  for_each_element(dst, [&](const int64_t* i) {
    f32_at(dst, i) = swiglu_oai_f(f32_at(gate, i), f32_at(up, i), alpha, limit);
  });
}

bool float4_rows(const Tensor* t) {
  if (t->type != DType::f32 || t->nb[0] != sizeof(float) || t->ne[0] % 4 != 0 ||
      reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
    return false;
  return t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0 && t->nb[3] % 16 == 0;
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

bool gated_f16_out_supported(const Tensor* dst) {
  return float4_rows(dst) && float4_rows(dst->src[0]) && float4_rows(dst->src[1]) && dst->is_contiguous();
}

CudaError launch_gated(const LaunchContext& ctx, const Tensor* dst) {
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  const bool f16_out = ctx.act_out_block == kActF16;
  if (ctx.act_out_block && (!f16_out || !gated_f16_out_supported(dst)))
    return CudaError::runtime(cudaErrorInvalidValue, "swiglu/geglu: f16 activations asked for, but this kernel cannot write them",
                              __FILE__, __LINE__);
  if (float4_rows(dst) && float4_rows(dst->src[0]) && float4_rows(dst->src[1])) {
    auto kernel = ctx.fast ? gated4_kernel<true> : gated4_kernel<false>;
    kernel<<<grid_for(n / 4, kThreads), kThreads, 0, ctx.stream>>>(
        desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), dst->op == OpKind::swiglu, n / 4,
        f16_out ? static_cast<uint2*>(dst->data) : nullptr);
    LOOM_CUDA_CHECK_LAUNCH("gated4_kernel");
    return {};
  }
  gated_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), dst->op == OpKind::swiglu);
  LOOM_CUDA_CHECK_LAUNCH("gated_kernel");
  return {};
}

CudaError launch_swiglu_oai(const LaunchContext& ctx, const Tensor* dst) {
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  const auto p = dst->get_params<SwigluOaiParams>();
  swiglu_oai_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), p.alpha, p.limit);
  LOOM_CUDA_CHECK_LAUNCH("swiglu_oai_kernel");
  return {};
}

}  // namespace loom::cuda
