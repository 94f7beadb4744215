// Cases: rms_norm, norm, soft_max, sum_rows, argmax, top_k.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

namespace {

// Calls f(row values, row index) for each row of ne[0] values and writes what it returns.
RefTensor per_row(const RefTensor& a, const Shape& out_ne,
                  const std::function<std::vector<double>(const double* row, int64_t r)>& f) {
  RefTensor out(out_ne);
  const int64_t n = a.ne[0], m = out_ne[0];
  for (int64_t r = 0; r < a.size() / n; ++r) {
    std::vector<double> y = f(a.v.data() + r * n, r);
    std::copy(y.begin(), y.end(), out.v.begin() + r * m);
  }
  return out;
}

// A view of every other row of a leaf twice as tall (rows contiguous, dims 1-3 strided).
ElemStrides every_other_row(const Shape& ne) {
  return {1, 2 * ne[0], 2 * ne[0] * ne[1], 2 * ne[0] * ne[1] * ne[2]};
}

// ---- norms ------------------------------------------------------------------------------------------

void add_norm(CaseList& cases, bool rms, const Shape& ne, float eps, bool strided, float lo, float hi,
              bool in_place = false) {
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* a = strided ? strided_view(g, in.uniform(DType::f32, {ne[0], 2 * ne[1], ne[2], ne[3]}, lo, hi),
                                       ne, every_other_row(ne), 0)
                        : in.uniform(DType::f32, ne, lo, hi);
    if (in_place) a = as_activation(g, a);
    return rms ? rms_norm(g, a, eps) : norm(g, a, eps);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    const RefTensor a = strided ? ref_view(in[0], ne, every_other_row(ne), 0) : in[0];
    const double e = eps;
    return per_row(a, ne, [&](const double* x, int64_t) {
      const int64_t n = ne[0];
      std::vector<double> y(static_cast<size_t>(n));
      if (rms) {
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
        const double s = 1.0 / std::sqrt(ss / n + e);
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
      } else {
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; ++i) mean += x[i];
        mean /= n;
        for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
        const double s = 1.0 / std::sqrt(var / n + e);
        for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * s;
      }
      return y;
    });
  };
  cases.push_back({rms ? "rms_norm" : "norm",
                   fmt::format("{}{} eps={:g} x in [{:g}, {:g}]{}", shape_string(ne),
                               strided ? " (strided view)" : "", eps, lo, hi, in_place ? " in place" : ""),
                   kNmseElementwise, build, ref, 0.0});
}

// ---- soft_max ---------------------------------------------------------------------------------------

// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding): fields follow the order of the case table
struct SoftMaxCase {
  Shape ne;
  float scale;
  bool has_mask;
  DType mask_type;
  Shape mask_ne;  // [ne0, >= ne1, divisor of ne2, divisor of ne3]
  bool strided;
  bool in_place = false;
};

void add_soft_max(CaseList& cases, const SoftMaxCase& s) {
  auto build = [s](Graph& g, CaseInputs& in) -> Tensor* {
    const Shape& ne = s.ne;
    Tensor* a = s.strided ? strided_view(g, in.uniform(DType::f32, {ne[0], 2 * ne[1], ne[2], ne[3]}), ne,
                                         every_other_row(ne), 0)
                          : in.uniform(DType::f32, ne);
    if (s.in_place) a = as_activation(g, a);
    Tensor* mask = s.has_mask ? in.mask(s.mask_type, s.mask_ne, 0.2, false) : nullptr;
    return soft_max(g, a, mask, s.scale);
  };
  auto ref = [s](const std::vector<RefTensor>& in) {
    const RefTensor a = s.strided ? ref_view(in[0], s.ne, every_other_row(s.ne), 0) : in[0];
    const RefTensor* mask = s.has_mask ? &in[1] : nullptr;
    const double scale = s.scale;
    return per_row(a, s.ne, [&](const double* x, int64_t r) {
      const int64_t n = s.ne[0];
      const int64_t i1 = r % s.ne[1], i2 = (r / s.ne[1]) % s.ne[2], i3 = r / (s.ne[1] * s.ne[2]);
      std::vector<double> y(static_cast<size_t>(n));
      double mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        y[i] = x[i] * scale + (mask ? (*mask)(i, i1, i2 % mask->ne[2], i3 % mask->ne[3]) : 0.0);
        mx = std::max(mx, y[i]);
      }
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += (y[i] = std::exp(y[i] - mx));
      for (int64_t i = 0; i < n; ++i) y[i] /= sum;
      return y;
    });
  };
  std::string desc =
      fmt::format("{}{} scale={:g}", shape_string(s.ne), s.strided ? " (strided view)" : "", s.scale);
  if (s.has_mask) desc += fmt::format(" mask={} {}", dtype_name(s.mask_type), shape_string(s.mask_ne));
  if (s.in_place) desc += " in place";
  cases.push_back({"soft_max", desc, kNmseElementwise, build, ref, 0.0});
}

// ---- reductions -------------------------------------------------------------------------------------

// The source of a reduction: a packed leaf, or a transposed view (elements of a row nb0 apart).
Tensor* reduction_source(Graph& g, CaseInputs& in, const Shape& ne, bool transposed, bool distinct) {
  if (!transposed) return distinct ? in.distinct(ne) : in.uniform(DType::f32, ne);
  const Shape leaf{ne[1], ne[0], ne[2], ne[3]};
  return transpose(g, distinct ? in.distinct(leaf) : in.uniform(DType::f32, leaf));
}

RefTensor reduction_values(const std::vector<RefTensor>& in, bool transposed) {
  return transposed ? ref_transpose(in[0]) : in[0];
}

void add_sum_rows(CaseList& cases, const Shape& ne, bool transposed) {
  auto build = [=](Graph& g, CaseInputs& in) {
    return sum_rows(g, reduction_source(g, in, ne, transposed, false));
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    return per_row(reduction_values(in, transposed), {1, ne[1], ne[2], ne[3]}, [&](const double* x, int64_t) {
      return std::vector<double>{std::accumulate(x, x + ne[0], 0.0)};
    });
  };
  cases.push_back({"sum_rows", fmt::format("{}{}", shape_string(ne), transposed ? " (transposed view)" : ""),
                   kNmseElementwise, build, ref, 0.0});
}

// Indices of the row sorted by value, largest first, the lower index first among equal values.
std::vector<double> ranking(const double* x, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  return std::vector<double>(idx.begin(), idx.begin() + k);
}

void add_argmax(CaseList& cases, const Shape& ne, bool transposed) {
  auto build = [=](Graph& g, CaseInputs& in) {
    return argmax(g, reduction_source(g, in, ne, transposed, true));
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    return per_row(reduction_values(in, transposed), {1, ne[1], ne[2], ne[3]},
                   [&](const double* x, int64_t) { return ranking(x, ne[0], 1); });
  };
  // The exact-match rule applies: the output is i32.
  cases.push_back({"argmax", fmt::format("{}{}", shape_string(ne), transposed ? " (transposed view)" : ""),
                   0.0, build, ref, 0.0});
}

// `ties`: the values are a few integers (most of a row ties with others; the lower index wins), in
// a packed row.
void add_top_k(CaseList& cases, const Shape& ne, int k, bool transposed, bool ties = false) {
  auto build = [=](Graph& g, CaseInputs& in) {
    if (ties)
      return top_k(g, in.custom(DType::f32, ne, [](Rng& rng, const Shape&, std::vector<float>& v) {
        for (float& x : v) x = std::floor(rng.uniform(0.0f, 8.0f));
      }), k);
    return top_k(g, reduction_source(g, in, ne, transposed, true), k);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    return per_row(reduction_values(in, transposed), {k, ne[1], ne[2], ne[3]},
                   [&](const double* x, int64_t) { return ranking(x, ne[0], k); });
  };
  cases.push_back({"top_k",
                   fmt::format("{} k={}{}{}", shape_string(ne), k, transposed ? " (transposed view)" : "",
                               ties ? " (ties)" : ""),
                   0.0,
                   build, ref, 0.0});
}

}  // namespace

void add_row_cases(CaseList& cases, CaseSet set) {
  if (set == CaseSet::perf) {
    add_norm(cases, true, {4096, 512, 1, 1}, 1e-5f, false, -1.0f, 1.0f);
    add_norm(cases, false, {4096, 512, 1, 1}, 1e-5f, false, -1.0f, 1.0f);
    add_soft_max(cases, {{4096, 32, 32, 1}, 0.088f, true, DType::f16, {4096, 32, 1, 1}, false});
    add_sum_rows(cases, {4096, 512, 1, 1}, false);
    add_argmax(cases, {128256, 4, 1, 1}, false);
    add_top_k(cases, {128256, 1, 1, 1}, 40, false);
    add_top_k(cases, {128256, 1, 1, 1}, 1, false);     // greedy sampling's top_k
    add_top_k(cases, {128256, 64, 1, 1}, 64, false);   // a 64-sequence step's sampling
    add_top_k(cases, {128256, 1, 1, 1}, 1024, false);  // one block per row (k > 128)
    return;
  }

  for (bool rms : {true, false}) {
    add_norm(cases, rms, {4096, 3, 1, 1}, 1e-5f, false, -1.0f, 1.0f);
    add_norm(cases, rms, {17, 5, 2, 1}, 1e-6f, false, -1.0f, 3.0f);
    add_norm(cases, rms, {2, 4, 1, 1}, 1e-5f, false, -1.0f, 1.0f);
    add_norm(cases, rms, {64, 3, 2, 1}, 1e-5f, true, 0.0f, 2.0f);
    add_norm(cases, rms, {5, 7, 1, 1}, 0.5f, false, -0.2f, 0.2f);  // eps dominates the scale
    add_norm(cases, rms, {300, 4, 1, 1}, 1e-5f, false, -1.0f, 2.0f, true);
  }
  add_norm(cases, true, {1, 6, 1, 1}, 1e-5f, false, -1.0f, 1.0f);  // x / sqrt(x^2 + eps)

  const SoftMaxCase softmax_cases[] = {
      {{32, 4, 1, 1}, 1.0f, false, DType::f32, {}, false},
      {{1, 3, 1, 1}, 1.0f, false, DType::f32, {}, false},
      {{113, 7, 3, 1}, 0.125f, true, DType::f32, {113, 7, 1, 1}, false},
      {{113, 7, 3, 1}, 0.125f, true, DType::f16, {113, 8, 1, 1}, false},  // mask has padding rows
      {{256, 2, 4, 2}, 4.0f, true, DType::f16, {256, 2, 2, 1}, false},    // mask broadcast over dims 2-3
      {{1024, 1, 8, 1}, 0.088f, true, DType::f32, {1024, 1, 1, 1}, false},
      {{40, 3, 2, 1}, 2.0f, false, DType::f32, {}, true},
      {{40, 3, 2, 1}, 0.5f, true, DType::f16, {40, 3, 1, 1}, true},
      {{77, 5, 2, 1}, 0.3f, true, DType::f32, {77, 5, 1, 1}, false, true},
  };
  for (const SoftMaxCase& s : softmax_cases) add_soft_max(cases, s);

  add_sum_rows(cases, {17, 5, 1, 1}, false);
  add_sum_rows(cases, {4096, 3, 2, 1}, false);
  add_sum_rows(cases, {1, 4, 1, 1}, false);
  add_sum_rows(cases, {19, 6, 2, 1}, true);

  add_argmax(cases, {10, 3, 1, 1}, false);
  add_argmax(cases, {32000, 2, 1, 1}, false);
  add_argmax(cases, {1, 5, 1, 1}, false);
  add_argmax(cases, {7, 4, 3, 1}, false);
  add_argmax(cases, {23, 9, 1, 1}, true);

  add_top_k(cases, {10, 3, 1, 1}, 3, false);
  add_top_k(cases, {257, 4, 1, 1}, 8, false);
  add_top_k(cases, {32000, 1, 1, 1}, 40, false);
  // rows of 4096 and more take CUDA's radix select: k = 1 (its one-pass path), several rows, the
  // largest k it holds (2048), a k that is not a power of two
  add_top_k(cases, {128256, 2, 1, 1}, 1, false);
  add_top_k(cases, {128256, 3, 1, 1}, 64, false);
  add_top_k(cases, {8192, 2, 1, 1}, 2048, false);
  add_top_k(cases, {5000, 2, 2, 1}, 37, false);
  // CUDA splits rows of 4096 and more with k <= 128 over blocks and merges their best: ties across
  // chunks (k = 1 and 100), chunks of unequal length (8193 = 4 x 1639 + 1637), the largest k it
  // splits for, strided rows
  add_top_k(cases, {20000, 3, 1, 1}, 100, false, true);
  add_top_k(cases, {20000, 2, 1, 1}, 1, false, true);
  add_top_k(cases, {8193, 2, 1, 1}, 100, false);
  add_top_k(cases, {8193, 1, 1, 1}, 128, false, true);
  add_top_k(cases, {9000, 3, 1, 1}, 16, true);
  add_top_k(cases, {128256, 4, 1, 1}, 128, false);
  add_top_k(cases, {6, 2, 2, 1}, 6, false);  // a full sort
  add_top_k(cases, {100, 5, 1, 1}, 1, false);
  add_top_k(cases, {31, 12, 1, 1}, 4, true);
}

}  // namespace loom::optest
