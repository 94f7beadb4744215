// Reference tensor helpers and input generators of the differential op test.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

// ---- reference tensors ------------------------------------------------------------------------------

ElemStrides packed_strides(const Shape& ne) { return {1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]}; }

RefTensor ref_view(const RefTensor& src, const Shape& ne, const ElemStrides& stride, int64_t offset) {
  RefTensor out(ne);
  for (int64_t i3 = 0; i3 < ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < ne[0]; ++i0) {
          const int64_t at = offset + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
          out(i0, i1, i2, i3) = src.v.at(static_cast<size_t>(at));
        }
  return out;
}

RefTensor ref_permute(const RefTensor& a, int ax0, int ax1, int ax2, int ax3) {
  const int axes[kMaxDims] = {ax0, ax1, ax2, ax3};
  const ElemStrides src = packed_strides(a.ne);
  Shape ne{};
  ElemStrides stride{};
  for (int d = 0; d < kMaxDims; ++d) {
    ne[axes[d]] = a.ne[d];
    stride[axes[d]] = src[d];
  }
  return ref_view(a, ne, stride, 0);
}

RefTensor ref_transpose(const RefTensor& a) { return ref_permute(a, 1, 0, 2, 3); }

RefTensor ref_reshape(const RefTensor& a, const Shape& ne) {
  RefTensor out = a;
  out.ne = ne;
  LOOM_ASSERT(out.size() == ne[0] * ne[1] * ne[2] * ne[3]);
  return out;
}

RefTensor ref_round_trip(const RefTensor& a, DType type) {
  RefTensor out(a.ne);
  const int64_t n0 = a.ne[0];
  std::vector<float> row(static_cast<size_t>(n0)), back(static_cast<size_t>(n0));
  std::vector<uint8_t> bytes(dtype_row_size(type, n0));
  for (int64_t r = 0; r < a.size() / n0; ++r) {
    for (int64_t i = 0; i < n0; ++i) row[i] = static_cast<float>(a.v[r * n0 + i]);
    quantize_row(type, row.data(), bytes.data(), n0);
    dequantize_row(type, bytes.data(), back.data(), n0);
    for (int64_t i = 0; i < n0; ++i) out.v[r * n0 + i] = back[i];
  }
  return out;
}

Tensor* strided_view(Graph& g, Tensor* a, const Shape& ne, const ElemStrides& stride, int64_t offset) {
  LOOM_ASSERT(stride[0] == 1);  // rows stay contiguous; transposes go through loom::permute
  const size_t ts = dtype_type_size(a->type);
  std::array<size_t, kMaxDims> nb{};
  for (int d = 0; d < kMaxDims; ++d) nb[d] = static_cast<size_t>(stride[d]) * ts;
  return view(g, a, ne, nb, static_cast<size_t>(offset) * ts);
}

// ---- inputs -------------------------------------------------------------------------------------------

Tensor* CaseInputs::custom(DType type, const Shape& ne, Generator gen) {
  Tensor* t = g_.input(type, ne, fmt::format("in{}", specs_.size()));
  if (t) specs_.push_back({t, std::move(gen), {}, false});
  return t;
}

Tensor* CaseInputs::uniform(DType type, const Shape& ne, float lo, float hi) {
  return custom(type, ne, [lo, hi](Rng& rng, const Shape&, std::vector<float>& v) {
    for (float& x : v) x = rng.uniform(lo, hi);
  });
}

Tensor* CaseInputs::signed_magnitude(const Shape& ne, float lo, float hi) {
  return custom(DType::f32, ne, [lo, hi](Rng& rng, const Shape&, std::vector<float>& v) {
    for (float& x : v) x = rng.uniform(lo, hi) * (rng.unit() < 0.5 ? -1.0f : 1.0f);
  });
}

void distinct_values(Rng& rng, std::vector<float>& v) {
  // A shuffled ladder over the whole tensor with jitter below half a step: no two values are
  // equal, whichever dimension a view later makes the row.
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((perm[i] + 0.4 * rng.unit()) / static_cast<double>(n) * 2.0 - 1.0);
}

Tensor* CaseInputs::distinct(const Shape& ne) {
  return custom(DType::f32, ne,
                [](Rng& rng, const Shape&, std::vector<float>& v) { distinct_values(rng, v); });
}

Tensor* CaseInputs::words(const Shape& ne, WordGenerator gen) {
  Tensor* t = g_.input(DType::i32, ne, fmt::format("in{}", specs_.size()));
  if (t) specs_.push_back({t, {}, std::move(gen), false});
  return t;
}

Tensor* CaseInputs::indices(const Shape& ne, int64_t n, bool unique) {
  LOOM_ASSERT(!unique || ne[0] <= n);
  return custom(DType::i32, ne, [n, unique](Rng& rng, const Shape& s, std::vector<float>& v) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (size_t r = 0; r < v.size() / s[0]; ++r) {
      if (unique) {  // the first ne0 entries of a partial shuffle
        std::iota(pool.begin(), pool.end(), 0);
        for (int64_t i = 0; i < s[0]; ++i) {
          std::swap(pool[i], pool[i + rng.below(n - i)]);
          v[r * s[0] + i] = static_cast<float>(pool[i]);
        }
      } else {
        for (int64_t i = 0; i < s[0]; ++i) v[r * s[0] + i] = static_cast<float>(rng.below(n));
      }
    }
  });
}

Tensor* CaseInputs::mask(DType type, const Shape& ne, double p_inf, bool causal, int64_t n_q) {
  return custom(type, ne, [p_inf, causal, n_q](Rng& rng, const Shape& s, std::vector<float>& v) {
    const float inf = std::numeric_limits<float>::infinity();
    const int64_t n_kv = s[0];
    for (size_t r = 0; r < v.size() / n_kv; ++r) {
      const int64_t q = static_cast<int64_t>(r % s[1]);
      const bool masks_future = causal && q < n_q;
      for (int64_t i = 0; i < n_kv; ++i) {
        float x = rng.uniform(-1.0f, 0.0f);
        if (rng.unit() < p_inf || (masks_future && i > q + (n_kv - n_q))) x = -inf;
        v[r * n_kv + i] = x;
      }
      // One finite entry per row, so no row is fully masked (whose result graph.h leaves open).
      const int64_t keep = causal ? 0 : rng.below(n_kv);
      v[r * n_kv + keep] = rng.uniform(-1.0f, 0.0f);
    }
  });
}

Tensor* CaseInputs::poisoned(DType type, const Shape& ne) {
  Tensor* t = g_.input(type, ne, fmt::format("in{}", specs_.size()));
  if (t) specs_.push_back({t, {}, {}, true});
  return t;
}

}  // namespace loom::optest
