// Elementwise kernels: add/sub/mul/div with broadcasting, unary activations, gated activations.
// Host-callable launchers; the kernels are in elementwise.cu.
#pragma once

#include "launch.h"

namespace loom::cuda {

/// add, sub, mul, div (dst->op); src[1] broadcasts over src[0] by modulo in every dimension.
CudaError launch_binary(const LaunchContext& ctx, const Tensor* dst);
/// scale (x * p0 + p1), silu, gelu, gelu_erf, softcap (p0 * tanh(x / p0)), by dst->op.
CudaError launch_unary(const LaunchContext& ctx, const Tensor* dst, float p0, float p1);
/// swiglu, geglu: act(src[0]) * src[1].
CudaError launch_gated(const LaunchContext& ctx, const Tensor* dst);
/// Whether launch_gated can write dst as contiguous f16 (LaunchContext::act_out_block kActF16).
bool gated_f16_out_supported(const Tensor* dst);
/// swiglu_oai (SwigluOaiParams): the clamped gpt-oss SwiGLU of src[0] (gate) and src[1] (up).
CudaError launch_swiglu_oai(const LaunchContext& ctx, const Tensor* dst);

}  // namespace loom::cuda
