// Cases: add sub mul div (with broadcasting), scale, silu, gelu, gelu_erf, softcap, swiglu, geglu,
// swiglu_oai.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

namespace {

// ---- float64 definitions ----------------------------------------------------------------------------

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double gelu_tanh_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

using BinaryOp = Tensor* (*)(Graph&, Tensor*, Tensor*);

struct BinaryKind {
  const char* name;
  BinaryOp build;
  double (*apply)(double, double);
};

const BinaryKind kBinaryKinds[] = {
    {"add", &loom::add, [](double x, double y) { return x + y; }},
    {"sub", &loom::sub, [](double x, double y) { return x - y; }},
    {"mul", &loom::mul, [](double x, double y) { return x * y; }},
    {"div", &loom::div, [](double x, double y) { return x / y; }},
};

// out[i] = op(a[i], b[i0 % b.ne0, i1 % b.ne1, i2 % b.ne2, i3 % b.ne3]).
RefTensor binary_ref(const RefTensor& a, const RefTensor& b, double (*apply)(double, double)) {
  RefTensor out(a.ne);
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < a.ne[0]; ++i0)
          out(i0, i1, i2, i3) =
              apply(a(i0, i1, i2, i3), b(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]));
  return out;
}

RefTensor map_ref(const RefTensor& a, const std::function<double(double)>& f) {
  RefTensor out(a.ne);
  for (int64_t i = 0; i < a.size(); ++i) out.v[i] = f(a.v[i]);
  return out;
}

// The lowest input for a tensor of `n` elements. The NMSE of one or a few elements is their
// relative error, and in float32 0.5x(1 + tanh(u)) and 0.5x(1 + erf(x/sqrt 2)) cancel below
// x ~ -3 (relative error 1e-4 at -3.5, 100% at -6, absolute error still < 1e-7). In larger tensors
// the large values dominate, so only tiny cases stay above -3.
float lowest_input(float lo, int64_t n) { return n < 8 ? std::max(lo, -3.0f) : lo; }

// A view that keeps every other row of a leaf twice as tall: rows stay contiguous, dims 1-3 do not.
Shape doubled_rows(const Shape& ne) { return {ne[0], ne[1] * 2, ne[2], ne[3]}; }
ElemStrides every_other_row(const Shape& ne) {
  return {1, 2 * ne[0], 2 * ne[0] * ne[1], 2 * ne[0] * ne[1] * ne[2]};
}

// ---- binary -----------------------------------------------------------------------------------------

struct BinaryShape {
  Shape a;
  Shape b;
  bool a_strided;         // a is every other row of a larger leaf
  bool b_strided;         // b is a column window of a wider leaf (rows contiguous, not packed)
  bool in_place = false;  // a is an activation the op may overwrite
};

void add_binary(CaseList& cases, const BinaryKind& k, const BinaryShape& s, double max_nmse) {
  const bool is_div = std::string(k.name) == "div";
  auto build = [k, s, is_div](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* a = s.a_strided
                    ? strided_view(g, in.uniform(DType::f32, doubled_rows(s.a)), s.a, every_other_row(s.a), 0)
                    : in.uniform(DType::f32, s.a);
    if (s.in_place) a = as_activation(g, a);
    const Shape b_leaf = s.b_strided ? Shape{s.b[0] + 5, s.b[1], s.b[2], s.b[3]} : s.b;
    // Divisors stay away from zero so the quotient's rounding does not dominate.
    Tensor* b = is_div ? in.signed_magnitude(b_leaf, 0.5f, 2.0f) : in.uniform(DType::f32, b_leaf);
    if (s.b_strided) b = strided_view(g, b, s.b, packed_strides(b_leaf), 3);
    return k.build(g, a, b);
  };
  auto ref = [k, s](const std::vector<RefTensor>& in) {
    RefTensor a = s.a_strided ? ref_view(in[0], s.a, every_other_row(s.a), 0) : in[0];
    RefTensor b = s.b_strided ? ref_view(in[1], s.b, packed_strides(in[1].ne), 3) : in[1];
    return binary_ref(a, b, k.apply);
  };
  std::string desc =
      fmt::format("a={}{} b={}{}{}", shape_string(s.a), s.a_strided ? " (strided view)" : "",
                  shape_string(s.b), s.b_strided ? " (window view)" : "", s.in_place ? " in place" : "");
  cases.push_back({k.name, desc, max_nmse, build, ref, 0.0});
}

// ---- unary ------------------------------------------------------------------------------------------

struct UnaryKind {
  std::string name;   // group
  std::string label;  // parameters
  std::function<Tensor*(Graph&, Tensor*)> build;
  std::function<double(double)> apply;
  float lo, hi;  // input range: the part of the curve that matters
};

std::vector<UnaryKind> unary_kinds() {
  return {
      {"scale", "s=0.37", [](Graph& g, Tensor* a) { return scale(g, a, 0.37f); },
       [](double x) { return x * static_cast<double>(0.37f); }, -1.0f, 1.0f},
      {"scale", "s=-2.5 bias=0.75", [](Graph& g, Tensor* a) { return scale(g, a, -2.5f, 0.75f); },
       [](double x) { return x * -2.5 + 0.75; }, -1.0f, 1.0f},
      {"silu", "", [](Graph& g, Tensor* a) { return silu(g, a); }, silu_ref, -8.0f, 8.0f},
      {"gelu", "", [](Graph& g, Tensor* a) { return gelu(g, a); }, gelu_tanh_ref, -6.0f, 6.0f},
      {"gelu_erf", "", [](Graph& g, Tensor* a) { return gelu_erf(g, a); }, gelu_erf_ref, -6.0f, 6.0f},
      {"softcap", "cap=30", [](Graph& g, Tensor* a) { return softcap(g, a, 30.0f); },
       [](double x) { return 30.0 * std::tanh(x / 30.0); }, -90.0f, 90.0f},
      {"softcap", "cap=2.5", [](Graph& g, Tensor* a) { return softcap(g, a, 2.5f); },
       [](double x) { return 2.5 * std::tanh(x / 2.5); }, -6.0f, 6.0f},
  };
}

void add_unary(CaseList& cases, const UnaryKind& k, const Shape& ne, bool strided, double max_nmse,
               bool in_place = false) {
  auto build = [k, ne, strided, in_place](Graph& g, CaseInputs& in) -> Tensor* {
    const float lo = lowest_input(k.lo, ne[0] * ne[1] * ne[2] * ne[3]);
    Tensor* a = strided ? strided_view(g, in.uniform(DType::f32, doubled_rows(ne), lo, k.hi), ne,
                                       every_other_row(ne), 0)
                        : in.uniform(DType::f32, ne, lo, k.hi);
    return k.build(g, in_place ? as_activation(g, a) : a);
  };
  auto ref = [k, ne, strided](const std::vector<RefTensor>& in) {
    return map_ref(strided ? ref_view(in[0], ne, every_other_row(ne), 0) : in[0], k.apply);
  };
  std::string desc = fmt::format("{}{}{}{}", shape_string(ne), strided ? " (strided view)" : "",
                                 k.label.empty() ? "" : " " + k.label, in_place ? " in place" : "");
  cases.push_back({k.name, desc, max_nmse, build, ref, 0.0});
}

// ---- gated ------------------------------------------------------------------------------------------

void add_gated(CaseList& cases, bool swi, const Shape& ne, bool fused, double max_nmse,
               bool in_place = false) {
  auto build = [swi, ne, fused, in_place](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor *gate, *up;
    if (fused) {  // one [2n, ...] projection split into its halves, as a fused gate/up weight gives
      const Shape both{2 * ne[0], ne[1], ne[2], ne[3]};
      Tensor* gu = in.uniform(DType::f32, both, lowest_input(-6.0f, ne[0] * ne[1] * ne[2] * ne[3]), 6.0f);
      gate = strided_view(g, gu, ne, packed_strides(both), 0);
      up = strided_view(g, gu, ne, packed_strides(both), ne[0]);
    } else {
      gate = in.uniform(DType::f32, ne, lowest_input(-6.0f, ne[0] * ne[1] * ne[2] * ne[3]), 6.0f);
      up = in.uniform(DType::f32, ne);
    }
    if (in_place) gate = as_activation(g, gate);
    return swi ? swiglu(g, gate, up) : geglu(g, gate, up);
  };
  auto ref = [swi, ne, fused](const std::vector<RefTensor>& in) {
    RefTensor gate, up;
    if (fused) {
      gate = ref_view(in[0], ne, packed_strides(in[0].ne), 0);
      up = ref_view(in[0], ne, packed_strides(in[0].ne), ne[0]);
    } else {
      gate = in[0];
      up = in[1];
    }
    RefTensor out(ne);
    for (int64_t i = 0; i < out.size(); ++i)
      out.v[i] = (swi ? silu_ref(gate.v[i]) : gelu_tanh_ref(gate.v[i])) * up.v[i];
    return out;
  };
  std::string desc = fmt::format("{}{}{}", shape_string(ne), fused ? " (halves of one fused tensor)" : "",
                                 in_place ? " in place" : "");
  cases.push_back({swi ? "swiglu" : "geglu", desc, max_nmse, build, ref, 0.0});
}

// gpt-oss's clamped SwiGLU, inputs in [-12, 12] so that both clamps (at +-limit) are met often.
void add_swiglu_oai(CaseList& cases, const Shape& ne, float alpha, float limit, bool in_place = false) {
  auto build = [ne, alpha, limit, in_place](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* gate = in.uniform(DType::f32, ne, -12.0f, 12.0f);
    Tensor* up = in.uniform(DType::f32, ne, -12.0f, 12.0f);
    if (in_place) gate = as_activation(g, gate);
    return swiglu_oai(g, gate, up, alpha, limit);
  };
  auto ref = [ne, alpha, limit](const std::vector<RefTensor>& in) {
    RefTensor out(ne);
    for (int64_t i = 0; i < out.size(); ++i) {
      const double gate = std::min(in[0].v[i], static_cast<double>(limit));
      const double up = std::clamp(in[1].v[i], -static_cast<double>(limit), static_cast<double>(limit));
      out.v[i] = gate / (1.0 + std::exp(-static_cast<double>(alpha) * gate)) * (up + 1.0);
    }
    return out;
  };
  cases.push_back(
      {"swiglu_oai",
       fmt::format("{} alpha={:g} limit={:g}{}", shape_string(ne), alpha, limit, in_place ? " in place" : ""),
       kNmseElementwise, build, ref, 0.0});
}

}  // namespace

void add_elementwise_cases(CaseList& cases, CaseSet set) {
  if (set == CaseSet::perf) {
    for (const BinaryKind& k : kBinaryKinds) {
      add_binary(cases, k, {{4096, 512, 1, 1}, {4096, 512, 1, 1}, false, false}, kNmseElementwise);
      add_binary(cases, k, {{4096, 512, 1, 1}, {4096, 1, 1, 1}, false, false}, kNmseElementwise);
    }
    for (const UnaryKind& k : unary_kinds()) add_unary(cases, k, {4096, 512, 1, 1}, false, kNmseElementwise);
    add_gated(cases, true, {14336, 32, 1, 1}, false, kNmseElementwise);
    add_gated(cases, false, {14336, 32, 1, 1}, true, kNmseElementwise);
    add_gated(cases, true, {14336, 512, 1, 1}, false, kNmseElementwise);  // a 512-token prefill chunk of an 8B layer
    return;
  }

  const BinaryShape shapes[] = {
      {{16, 5, 3, 2}, {16, 5, 3, 2}, false, false},  // same shape
      {{16, 5, 3, 2}, {16, 1, 1, 1}, false, false},  // one row for all (a bias)
      {{16, 5, 3, 2}, {1, 5, 1, 2}, false, false},   // one value per row, broadcast over dim 2
      {{12, 6, 4, 1}, {4, 3, 2, 1}, false, false},   // b repeats inside dims 0-2
      {{7, 1, 1, 1}, {7, 1, 1, 1}, false, false},    // a single odd row
      {{4096, 3, 1, 1}, {4096, 1, 1, 1}, false, false},
      {{20, 5, 3, 1}, {20, 1, 3, 1}, true, false},  // a strided
      {{33, 4, 2, 1}, {33, 4, 1, 1}, false, true},  // b a window of wider rows
      {{1, 9, 2, 2}, {1, 1, 1, 1}, false, false},   // scalar rows
  };
  for (const BinaryKind& k : kBinaryKinds) {
    for (const BinaryShape& s : shapes) add_binary(cases, k, s, kNmseElementwise);
    add_binary(cases, k, {{16, 5, 3, 2}, {16, 1, 3, 1}, false, false, true}, kNmseElementwise);
  }

  const Shape unary_shapes[] = {{1, 1, 1, 1}, {17, 3, 1, 1}, {4096, 2, 1, 1}, {33, 7, 2, 3}};
  for (const UnaryKind& k : unary_kinds()) {
    for (const Shape& ne : unary_shapes) add_unary(cases, k, ne, false, kNmseElementwise);
    add_unary(cases, k, {24, 5, 3, 1}, true, kNmseElementwise);
    add_unary(cases, k, {33, 7, 2, 1}, false, kNmseElementwise, true);
  }

  for (bool swi : {true, false}) {
    add_gated(cases, swi, {11, 5, 1, 1}, false, kNmseElementwise);
    add_gated(cases, swi, {1024, 3, 2, 1}, false, kNmseElementwise);
    add_gated(cases, swi, {96, 7, 1, 1}, true, kNmseElementwise);
    add_gated(cases, swi, {1, 1, 1, 1}, false, kNmseElementwise);
    add_gated(cases, swi, {64, 6, 1, 1}, false, kNmseElementwise, true);
  }
  // as the MoE layer shapes it: [n_ff_exp, n_used, n_tokens]
  add_swiglu_oai(cases, {96, 4, 5, 1}, 1.702f, 7.0f);
  add_swiglu_oai(cases, {13, 3, 1, 1}, 1.702f, 7.0f);
  add_swiglu_oai(cases, {64, 2, 3, 1}, 1.0f, 2.5f, true);
}

}  // namespace loom::optest
