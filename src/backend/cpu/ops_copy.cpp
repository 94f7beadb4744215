// Data movement kernels: get_rows, set_rows, cpy (with conversion), concat.
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_ops.h"
#include "vec_dot.h"
#include "loom/graph.h"

namespace loom::cpu {

namespace {

// This thread's float scratch row (work_size reserves n*8+64 bytes per thread).
float* scratch_row(const KernelContext& ctx, int64_t n) {
  return reinterpret_cast<float*>(ctx.work + static_cast<size_t>(ctx.ith) * (n * 8 + 64));
}

// Reads row (i1,i2,i3) of t as floats, whatever its element stride.
void read_row(const Tensor* t, int64_t i1, int64_t i2, int64_t i3, float* out, float* tmp) {
  const uint8_t* row = at(t, 0, i1, i2, i3);
  if (t->rows_contiguous()) {
    dequantize_row(t->type, row, out, t->ne[0]);
    return;
  }
  const size_t ts = dtype_type_size(t->type);  // non-contiguous rows are never quantized
  auto* packed = reinterpret_cast<uint8_t*>(tmp);
  for (int64_t i = 0; i < t->ne[0]; ++i) std::memcpy(packed + i * ts, row + i * t->nb[0], ts);
  dequantize_row(t->type, packed, out, t->ne[0]);
}

}  // namespace

void op_get_rows(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const F16RowFn f16_row = f16_to_f32_row();
  const Tensor* idx = dst->src[1];
  const int64_t n0 = a->ne[0];
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    const int32_t r = *reinterpret_cast<const int32_t*>(at(idx, i1, i2, i3, 0));
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    if (r < 0 || r >= a->ne[1]) {  // an index out of range yields NaN, never a wild read
      for (int64_t i = 0; i < n0; ++i) y[i] = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    if (a->type == DType::f16)
      f16_row(reinterpret_cast<const f16_bits*>(at(a, 0, r, i2, i3)), y, n0);
    else
      dequantize_row(a->type, at(a, 0, r, i2, i3), y, n0);
  });
}

void op_set_rows(const KernelContext& ctx, Tensor* dst) {
  const Tensor* src = dst->src[0];
  const Tensor* idx = dst->src[1];
  for_each_row(ctx, src, [&](int64_t i1, int64_t i2, int64_t i3) {
    const int32_t r = *reinterpret_cast<const int32_t*>(at(idx, i1, i2 % idx->ne[1], i3 % idx->ne[2], 0));
    if (r < 0 || r >= dst->ne[1]) return;  // out of range: nothing written
    quantize_row(dst->type, reinterpret_cast<const float*>(at(src, 0, i1, i2, i3)), at(dst, 0, r, i2, i3),
                 src->ne[0]);
  });
}

void op_cpy(const KernelContext& ctx, Tensor* dst) {
  const Tensor* src = dst->src[0];
  const int64_t n0 = src->ne[0];
  float* row = scratch_row(ctx, n0);
  float* tmp = row + n0;
  const bool same_rows = src->ne == dst->ne;
  const bool dst_quantized = dtype_is_quantized(dst->type);
  const size_t dts = dtype_type_size(dst->type);
  const int64_t dbs = dtype_block_size(dst->type);
  for_each_row(ctx, src, [&](int64_t i1, int64_t i2, int64_t i3) {
    if (src->type == DType::i32 && dst->type == DType::i32) {  // exact, no float round trip
      for (int64_t i = 0; i < n0; ++i) {
        const int64_t e = ((i3 * src->ne[2] + i2) * src->ne[1] + i1) * n0 + i;
        const int64_t d0 = e % dst->ne[0], d1 = (e / dst->ne[0]) % dst->ne[1];
        const int64_t d2 = (e / (dst->ne[0] * dst->ne[1])) % dst->ne[2], d3 = e / (dst->ne[0] * dst->ne[1] * dst->ne[2]);
        std::memcpy(at(dst, d0, d1, d2, d3), at(src, i, i1, i2, i3), 4);
      }
      return;
    }
    read_row(src, i1, i2, i3, row, tmp);
    if (same_rows && dst->rows_contiguous()) {
      quantize_row(dst->type, row, at(dst, 0, i1, i2, i3), n0);
      return;
    }
    const int64_t first = ((i3 * src->ne[2] + i2) * src->ne[1] + i1) * n0;  // flat index of the row
    if (dst_quantized) {  // contiguous destination, rows of whole blocks (checked by cpy)
      quantize_row(dst->type, row, static_cast<uint8_t*>(dst->data) + (first / dbs) * dts, n0);
      return;
    }
    auto* packed = reinterpret_cast<uint8_t*>(tmp);
    quantize_row(dst->type, row, packed, n0);
    for (int64_t i = 0; i < n0; ++i) {
      const int64_t e = first + i;
      const int64_t d0 = e % dst->ne[0], d1 = (e / dst->ne[0]) % dst->ne[1];
      const int64_t d2 = (e / (dst->ne[0] * dst->ne[1])) % dst->ne[2], d3 = e / (dst->ne[0] * dst->ne[1] * dst->ne[2]);
      std::memcpy(at(dst, d0, d1, d2, d3), packed + i * dts, dts);
    }
  });
}

void op_concat(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  const int dim = dst->get_params<ConcatParams>().dim;
  const size_t ts = dtype_type_size(dst->type);
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    for (int64_t i0 = 0; i0 < dst->ne[0]; ++i0) {
      int64_t c[kMaxDims] = {i0, i1, i2, i3};
      const Tensor* from = a;
      if (c[dim] >= a->ne[dim]) {
        c[dim] -= a->ne[dim];
        from = b;
      }
      std::memcpy(at(dst, i0, i1, i2, i3), at(from, c[0], c[1], c[2], c[3]), ts);
    }
  });
}

}  // namespace loom::cpu
