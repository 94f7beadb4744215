// Activation functions of the elementwise kernels (elementwise.cu) and of the fused gated
// projections (fused.cu). Device code only; includes nothing outside src/backend/cuda/.
#pragma once

namespace loom::cuda {

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
/// GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
__device__ __forceinline__ float gelu_tanh_f(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}
__device__ __forceinline__ float gelu_erf_f(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}
/// The gated activations: swiglu = silu(gate) * up, geglu = gelu(gate) * up.
__device__ __forceinline__ float gated_f(float gate, float up, bool swiglu) {
  return (swiglu ? silu_f(gate) : gelu_tanh_f(gate)) * up;
}

}  // namespace loom::cuda
