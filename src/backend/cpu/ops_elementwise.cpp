// Elementwise kernels: binary with broadcasting, unary activations, gated activations.
#include <cmath>

#include "cpu_ops.h"
#include "loom/graph.h"

namespace loom::cpu {

namespace {

template <typename Op>
void binary_rows(const KernelContext& ctx, Tensor* dst, Op op) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  const int64_t n0 = dst->ne[0], nb0 = b->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    auto* x = reinterpret_cast<const float*>(at(a, 0, i1, i2, i3));
    auto* z = reinterpret_cast<const float*>(at(b, 0, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]));
    if (nb0 == n0) {
      for (int64_t i = 0; i < n0; ++i) y[i] = op(x[i], z[i]);
    } else {
      for (int64_t i = 0; i < n0; ++i) y[i] = op(x[i], z[i % nb0]);
    }
  });
}

template <typename Op>
void unary_rows(const KernelContext& ctx, Tensor* dst, Op op) {
  const Tensor* a = dst->src[0];
  const int64_t n0 = dst->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    auto* x = reinterpret_cast<const float*>(at(a, 0, i1, i2, i3));
    for (int64_t i = 0; i < n0; ++i) y[i] = op(x[i]);
  });
}

template <typename Op>
void gated_rows(const KernelContext& ctx, Tensor* dst, Op act) {
  const Tensor* gate = dst->src[0];
  const Tensor* up = dst->src[1];
  const int64_t n0 = dst->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    auto* g = reinterpret_cast<const float*>(at(gate, 0, i1, i2, i3));
    auto* u = reinterpret_cast<const float*>(at(up, 0, i1, i2, i3));
    for (int64_t i = 0; i < n0; ++i) y[i] = act(g[i]) * u[i];
  });
}

// Activations are evaluated in double and rounded to float once (docs/NUMERICS.md): the CUDA
// backend uses the same formulas (kernels/activation.cuh), and double exp/tanh/erf from two
// libraries round to the same float where expf/tanhf differ in the last bit.
inline float silu_f(float x) {
  const double v = x;
  return static_cast<float>(v / (1.0 + std::exp(-v)));
}
// GELU with the tanh approximation (Hendrycks & Gimpel): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
inline float gelu_tanh_f(float x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * v * (1.0 + 0.044715 * v * v))));
}
inline float gelu_erf_f(float x) {
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + std::erf(v * 0.70710678118654752440)));
}
inline float softcap_f(float x, float cap) { return static_cast<float>(cap * std::tanh(static_cast<double>(x) / cap)); }

}  // namespace

void op_binary(const KernelContext& ctx, Tensor* dst) {
  switch (dst->op) {
    case OpKind::add: binary_rows(ctx, dst, [](float x, float y) { return x + y; }); break;
    case OpKind::sub: binary_rows(ctx, dst, [](float x, float y) { return x - y; }); break;
    case OpKind::mul: binary_rows(ctx, dst, [](float x, float y) { return x * y; }); break;
    case OpKind::div: binary_rows(ctx, dst, [](float x, float y) { return x / y; }); break;
    default: LOOM_ASSERT(false);
  }
}

void op_unary(const KernelContext& ctx, Tensor* dst) {
  switch (dst->op) {
    case OpKind::scale: {
      const auto p = dst->get_params<ScaleParams>();
      unary_rows(ctx, dst, [p](float x) { return x * p.scale + p.bias; });
      break;
    }
    case OpKind::silu: unary_rows(ctx, dst, silu_f); break;
    case OpKind::gelu: unary_rows(ctx, dst, gelu_tanh_f); break;
    case OpKind::gelu_erf: unary_rows(ctx, dst, gelu_erf_f); break;
    case OpKind::softcap: {
      const float cap = dst->get_params<SoftcapParams>().cap;
      unary_rows(ctx, dst, [cap](float x) { return softcap_f(x, cap); });
      break;
    }
    default: LOOM_ASSERT(false);
  }
}

void op_gated(const KernelContext& ctx, Tensor* dst) {
  if (dst->op == OpKind::swiglu) {
    gated_rows(ctx, dst, silu_f);
  } else {
    gated_rows(ctx, dst, gelu_tanh_f);
  }
}

void op_swiglu_oai(const KernelContext& ctx, Tensor* dst) {
  const auto p = dst->get_params<SwigluOaiParams>();
  const double alpha = p.alpha;
  const float limit = p.limit;
  const Tensor* gate = dst->src[0];
  const Tensor* up = dst->src[1];
  const int64_t n = dst->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    const auto* g = reinterpret_cast<const float*>(at(gate, 0, i1, i2, i3));
    const auto* u = reinterpret_cast<const float*>(at(up, 0, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    for (int64_t i = 0; i < n; ++i) {
      // comparisons rather than min/clamp, so that a NaN passes through as it does in PyTorch
      const float gc = g[i] > limit ? limit : g[i];
      const float uc = u[i] > limit ? limit : (u[i] < -limit ? -limit : u[i]);
      // g * sigmoid(alpha g) in double, rounded once; then float (u + 1) and a float product, the
      // same roundings as the CUDA kernel (docs/NUMERICS.md)
      const double gd = gc;
      const float act = static_cast<float>(gd / (1.0 + std::exp(-alpha * gd)));
      y[i] = act * (uc + 1.0f);
    }
  });
}

}  // namespace loom::cpu
