// Activation functions of the elementwise kernels (elementwise.cu) and of the fused gated
// projections (fused.cu). Device code only; includes nothing outside src/backend/cuda/.
//
// Each is evaluated in double and rounded to float once, with the same formulas as the CPU backend
// (ops_elementwise.cpp): both libraries' double exp/tanh/erf are within an ulp of the true value, so
// the two backends round the same number and give the same float (docs/NUMERICS.md). In float, the
// libraries' expf/tanhf differ in the last bit for a share of inputs.
#pragma once

namespace loom::cuda {

__device__ __forceinline__ float silu_f(float x) {
  const double v = x;
  return static_cast<float>(v / (1.0 + exp(-v)));
}
/// GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
__device__ __forceinline__ float gelu_tanh_f(float x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + tanh(kSqrt2OverPi * v * (1.0 + 0.044715 * v * v))));
}
__device__ __forceinline__ float gelu_erf_f(float x) {
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
}
__device__ __forceinline__ float softcap_f(float x, float cap) {
  return static_cast<float>(cap * tanh(static_cast<double>(x) / cap));
}
/// The gated activations: swiglu = silu(gate) * up, geglu = gelu(gate) * up.
__device__ __forceinline__ float gated_f(float gate, float up, bool swiglu) {
  return __fmul_rn(swiglu ? silu_f(gate) : gelu_tanh_f(gate), up);
}
/// The gated activations in float (the fast numerics mode's elementwise swiglu / geglu over prompt
/// chunks): the double evaluations above cost about as much as the 88 MB a 512-token chunk of an 8B
/// layer moves (38.5 us where its bytes need ~22, H200). Within a few float ulps of them.
__device__ __forceinline__ float gated_fast_f(float gate, float up, bool swiglu) {
  const float act = swiglu ? gate / (1.0f + expf(-gate))
                           : 0.5f * gate * (1.0f + tanhf(0.79788456080286535588f * gate * (1.0f + 0.044715f * gate * gate)));
  return act * up;
}
/// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), g sigmoid(alpha g)
/// (u + 1). Comparisons rather than fminf/fmaxf, which would turn a NaN into the limit (the CPU and
/// PyTorch keep it); the activation in double, then a float add and a float multiply, as on the CPU.
__device__ __forceinline__ float swiglu_oai_f(float gate, float up, float alpha, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  const double gd = g;
  const float act = static_cast<float>(gd / (1.0 + exp(-static_cast<double>(alpha) * gd)));
  return __fmul_rn(act, __fadd_rn(u, 1.0f));
}

}  // namespace loom::cuda
