// Row-wise kernels: norms, softmax, row sums, argmax, top-k.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cpu_ops.h"
#include "loom/comm.h"
#include "loom/graph.h"

namespace loom::cpu {

void op_rms_norm(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const float eps = dst->get_params<NormParams>().eps;
  const int64_t n = dst->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    auto* x = reinterpret_cast<const float*>(at(a, 0, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    double sum = 0.0;  // double: rows of 10^4+ elements lose digits in float
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float s = static_cast<float>(1.0 / std::sqrt(sum / n + eps));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
  });
}

void op_norm(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const float eps = dst->get_params<NormParams>().eps;
  const int64_t n = dst->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    auto* x = reinterpret_cast<const float*>(at(a, 0, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    const double mean = sum / n;
    double var = 0.0;
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    const float s = static_cast<float>(1.0 / std::sqrt(var / n + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * s;
  });
}

void op_soft_max(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* mask = dst->src[1];
  const float scale = dst->get_params<SoftMaxParams>().scale;
  const int64_t n = dst->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    auto* x = reinterpret_cast<const float*>(at(a, 0, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    const uint8_t* m = mask ? at(mask, 0, i1, i2 % mask->ne[2], i3 % mask->ne[3]) : nullptr;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      float v = x[i] * scale;
      if (m) v += mask->type == DType::f16 ? f16_to_f32(reinterpret_cast<const f16_bits*>(m)[i])
                                           : reinterpret_cast<const float*>(m)[i];
      y[i] = v;
      mx = std::max(mx, v);
    }
    if (mx == -std::numeric_limits<float>::infinity()) {  // fully masked row: all zeros, not NaN
      for (int64_t i = 0; i < n; ++i) y[i] = 0.0f;
      return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      y[i] = static_cast<float>(std::exp(static_cast<double>(y[i] - mx)));  // as CUDA's (docs/NUMERICS.md)
      sum += y[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  });
}

void op_sum_rows(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const int64_t n = a->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    const uint8_t* row = at(a, 0, i1, i2, i3);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += *reinterpret_cast<const float*>(row + i * a->nb[0]);
    *reinterpret_cast<float*>(at(dst, 0, i1, i2, i3)) = static_cast<float>(sum);
  });
}

// One thread takes part in the group's all-reduce (which waits for the other ranks); the others
// wait at the barrier after the node. A group aborted by a failed rank leaves NaN.
void op_all_reduce(const KernelContext& ctx, Tensor* dst) {
  if (ctx.ith != 0) return;
  const Tensor* a = dst->src[0];
  auto* out = static_cast<float*>(dst->data);
  const size_t n = static_cast<size_t>(dst->nelements());
  Communicator* comm = dst->get_params<AllReduceParams>().comm;
  if (!comm->all_reduce_host(static_cast<const float*>(a->data), out, n).ok())
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
}

void op_argmax(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const int64_t n = a->ne[0];
  int64_t begin, end;
  ctx.split(a->nrows(), begin, end);
  auto* out = static_cast<int32_t*>(dst->data);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
    const uint8_t* row = at(a, 0, i1, i2, i3);
    int64_t best = 0;
    float best_v = *reinterpret_cast<const float*>(row);
    for (int64_t i = 1; i < n; ++i) {
      const float v = *reinterpret_cast<const float*>(row + i * a->nb[0]);
      if (v > best_v) best_v = v, best = i;  // first index wins ties
    }
    out[r] = static_cast<int32_t>(best);
  }
}

void op_top_k(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const int64_t n = a->ne[0];
  const int k = dst->get_params<TopKParams>().k;
  auto* idx = reinterpret_cast<int32_t*>(ctx.work + static_cast<size_t>(ctx.ith) * (n * 8 + 64));
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    const uint8_t* row = at(a, 0, i1, i2, i3);
    auto value = [&](int32_t i) { return *reinterpret_cast<const float*>(row + i * a->nb[0]); };
    std::iota(idx, idx + n, 0);
    // larger value first; the lower index first among equals, so the result is deterministic
    std::partial_sort(idx, idx + k, idx + n, [&](int32_t x, int32_t y) {
      const float vx = value(x), vy = value(y);
      return vx > vy || (vx == vy && x < y);
    });
    auto* y = reinterpret_cast<int32_t*>(at(dst, 0, i1, i2, i3));
    std::copy(idx, idx + k, y);
  });
}

}  // namespace loom::cpu
