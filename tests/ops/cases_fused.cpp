// Cases: the node groups a graph executor fuses into one dispatch (loom/exec.h FusedKind), each
// built unfused exactly as the model code builds it (src/llm/llm_graph.cpp, llm_arch.cpp), so
// that a backend without fusion computes them node by node and one with fusion must give the same
// results from its fused kernels. Each case names the fusion it expects (OpCase::expected_fusion);
// the results that the fused kernel keeps are all checked (Graph::mark_output inside the build).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

namespace {

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
}

// Values of several results one after another, as OpCase::reference returns them.
RefTensor concat_results(std::initializer_list<const RefTensor*> parts) {
  int64_t n = 0;
  for (const RefTensor* p : parts) n += p->size();
  RefTensor out({n, 1, 1, 1});
  size_t at = 0;
  for (const RefTensor* p : parts) {
    std::copy(p->v.begin(), p->v.end(), out.v.begin() + static_cast<std::ptrdiff_t>(at));
    at += p->v.size();
  }
  return out;
}

// Element (i0, i1, i2, i3) of b broadcast over a larger tensor by modulo, as binary ops read b.
double broadcast_at(const RefTensor& b, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return b(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
}

// ---- rms_norm_mul, add_rms_norm_mul ----------------------------------------------------------------

constexpr float kEps = 1e-5f;

// rms_norm(x) * w per row, w broadcast by modulo.
RefTensor rms_norm_mul_ref(const RefTensor& x, const RefTensor& w, double eps) {
  RefTensor out(x.ne);
  const int64_t n = x.ne[0];
  for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < x.ne[1]; ++i1) {
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += x(i, i1, i2, i3) * x(i, i1, i2, i3);
        const double s = 1.0 / std::sqrt(ss / n + eps);
        for (int64_t i = 0; i < n; ++i)
          out(i, i1, i2, i3) = x(i, i1, i2, i3) * s * broadcast_at(w, i, i1, i2, i3);
      }
  return out;
}

// StepBuilder::rms_norm: mul(rms_norm(x), weight); x of shape ne, the weight [w_ne].
void add_rms_norm_mul(CaseList& cases, const Shape& ne, const Shape& w_ne) {
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* x = in.uniform(DType::f32, ne, -2.0f, 2.0f);
    Tensor* w = in.uniform(DType::f32, w_ne, 0.5f, 1.5f);
    return mul(g, rms_norm(g, x, kEps), w);
  };
  auto ref = [](const std::vector<RefTensor>& in) { return rms_norm_mul_ref(in[0], in[1], kEps); };
  cases.push_back({"rms_norm_mul", fmt::format("x={} w={}", shape_string(ne), shape_string(w_ne)),
                   kNmseElementwise, build, ref, 0.0, FusedKind::rms_norm_mul});
}

// The residual stream (llm_arch.cpp): x = add(x, sublayer); f = mul(rms_norm(x), ffn_norm). Both
// the sum (the next layer's residual, marked as an output) and the normed row are checked.
void add_add_rms_norm_mul(CaseList& cases, const Shape& ne, const Shape& b_ne) {
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* residual = in.uniform(DType::f32, ne, -2.0f, 2.0f);
    Tensor* sublayer = in.uniform(DType::f32, b_ne, -1.0f, 1.0f);
    Tensor* w = in.uniform(DType::f32, {ne[0], 1, 1, 1}, 0.5f, 1.5f);
    Tensor* sum = add(g, residual, sublayer);
    Tensor* normed = mul(g, rms_norm(g, sum, kEps), w);
    if (sum) g.mark_output(sum);
    return normed;
  };
  auto ref = [ne](const std::vector<RefTensor>& in) {
    RefTensor sum(ne);
    for (int64_t i3 = 0; i3 < ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < ne[0]; ++i0)
            sum(i0, i1, i2, i3) = in[0](i0, i1, i2, i3) + broadcast_at(in[1], i0, i1, i2, i3);
    const RefTensor normed = rms_norm_mul_ref(sum, in[2], kEps);
    return concat_results({&normed, &sum});
  };
  cases.push_back({"add_rms_norm_mul",
                   fmt::format("x={} + {} w=[{}]", shape_string(ne), shape_string(b_ne), ne[0]),
                   kNmseElementwise, build, ref, 0.0, FusedKind::add_rms_norm_mul});
}

// ---- mat_vec_bias, glu_mat_vec ---------------------------------------------------------------------

// A reduced dimension of whole blocks for quantized types, odd for plain ones.
int64_t pick_k(DType t) {
  if (dtype_block_size(t) == kQK_K) return 512;
  return dtype_is_quantized(t) ? 160 : 75;
}

// StepBuilder::linear with a bias: add(mul_mat(w, x), bias). k 0: pick_k.
void add_mat_vec_bias(CaseList& cases, DType wt, int64_t m, int64_t n, int64_t k_in = 0) {
  const int64_t k = k_in ? k_in : pick_k(wt);
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* w = in.uniform(wt, {k, m, 1, 1});
    Tensor* x = in.uniform(DType::f32, {k, n, 1, 1});
    Tensor* bias = in.uniform(DType::f32, {m, 1, 1, 1}, -4.0f, 4.0f);
    return add(g, mul_mat(g, w, x), bias);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    RefTensor out = mul_mat_ref(in[0], in[1]);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) out(i, j) += in[2](i);
    return out;
  };
  cases.push_back({"mat_vec_bias",
                   fmt::format("w={}[{}, {}] x=f32[{}, {}] bias=[{}]", dtype_name(wt), k, m, k, n, m),
                   mul_mat_nmse(wt), build, ref, 2.0 * m * n * k, FusedKind::mat_vec_bias});
}

// StepBuilder::ffn_swiglu / ffn_geglu: swiglu(mul_mat(gate, x), mul_mat(up, x)), both products
// of the same activations. The product of two results carries both their errors: twice mul_mat's
// allowance (quantized weights measured up to 7.4e-5 here against 5e-4 for one product).
// `stacked`: gate and up are the two halves of one [k, 2m] tensor, back to back in memory as the loader
// places them (CUDA's one-GEMM form for f16 / bf16).
void add_glu_mat_vec(CaseList& cases, DType wt, int64_t m, int64_t n, bool swi, int64_t k_in = 0,
                     bool stacked = false) {
  const int64_t k = k_in ? k_in : pick_k(wt);
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor *gate, *up;
    if (stacked) {
      Tensor* both = in.uniform(wt, {k, 2 * m, 1, 1});
      const std::array<size_t, kMaxDims> nb{both->nb[0], both->nb[1], both->nb[1] * m, both->nb[1] * m};
      gate = view(g, both, {k, m, 1, 1}, nb, 0);
      up = view(g, both, {k, m, 1, 1}, nb, static_cast<size_t>(m) * both->nb[1]);
    } else {
      gate = in.uniform(wt, {k, m, 1, 1});
      up = in.uniform(wt, {k, m, 1, 1});
    }
    Tensor* x = in.uniform(DType::f32, {k, n, 1, 1});
    Tensor* g_out = mul_mat(g, gate, x);
    Tensor* u_out = mul_mat(g, up, x);
    return swi ? swiglu(g, g_out, u_out) : geglu(g, g_out, u_out);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[stacked ? 1 : 2];
    const RefTensor gate = mul_mat_ref(stacked ? ref_view(in[0], {k, m, 1, 1}, {1, k, k * m, k * m}, 0) : in[0], x);
    const RefTensor up = mul_mat_ref(stacked ? ref_view(in[0], {k, m, 1, 1}, {1, k, k * m, k * m}, k * m) : in[1], x);
    RefTensor out(gate.ne);
    for (int64_t i = 0; i < out.size(); ++i)
      out.v[i] = (swi ? silu_ref(gate.v[i]) : gelu_tanh_ref(gate.v[i])) * up.v[i];
    return out;
  };
  cases.push_back(
      {"glu_mat_vec",
       fmt::format("{} w={}[{}, {}] x2 x=f32[{}, {}]{}", swi ? "swiglu" : "geglu", dtype_name(wt), k, m, k, n,
                   stacked ? " stacked" : ""),
       2.0 * mul_mat_nmse(wt), build, ref, 4.0 * m * n * k, FusedKind::glu_mat_vec});
}

// ---- mat_vec_multi ---------------------------------------------------------------------------------

// StepBuilder::attention's projections: mul_mat(wq, x), mul_mat(wk, x), mul_mat(wv, x) of one
// activation x [k, n, b2, 1], weights [k, m_t, w2_t, 1] of one type (w2_t divides b2: broadcast as
// mul_mat). The first product is the case's result and the others are marked outputs, so each is
// checked on its own against mul_mat's threshold; no other node reads them, so no other fusion
// (mat_vec_bias) takes a product away from the group. `stacked`: the weights are row ranges of one
// tensor, back to back in memory as the loader places Q, K and V (CUDA's one-GEMM form for f16 / bf16).
// wts: each product's weight type where they differ (a Q4_K_M file's q6_K V beside q4_K Q and K)
void add_mat_vec_multi(CaseList& cases, DType wt, std::vector<int64_t> rows, int64_t n, int64_t k,
                       int64_t b2 = 1, std::vector<int64_t> w2 = {}, bool stacked = false, std::vector<DType> wts = {}) {
  w2.resize(rows.size(), 1);
  wts.resize(rows.size(), wt);
  int64_t total_rows = 0;
  for (int64_t r : rows) total_rows += r;
  const size_t n_w = stacked ? 1 : rows.size();  // weight inputs
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    std::vector<Tensor*> w;
    if (stacked) {
      Tensor* all = in.uniform(wt, {k, total_rows, 1, 1});
      int64_t first = 0;
      for (int64_t r : rows) {
        w.push_back(view(g, all, {k, r, 1, 1}, {all->nb[0], all->nb[1], all->nb[1] * r, all->nb[1] * r},
                         static_cast<size_t>(first) * all->nb[1]));
        first += r;
      }
    } else {
      for (size_t t = 0; t < rows.size(); ++t) w.push_back(in.uniform(wts[t], {k, rows[t], w2[t], 1}));
    }
    Tensor* x = in.uniform(DType::f32, {k, n, b2, 1});
    std::vector<Tensor*> out;
    for (Tensor* weights : w) out.push_back(mul_mat(g, weights, x));
    for (size_t t = 1; t < out.size(); ++t)
      if (out[t]) g.mark_output(out[t]);
    return out[0];
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[n_w];
    std::vector<RefTensor> out;
    int64_t first = 0;
    for (size_t t = 0; t < rows.size(); ++t) {
      const RefTensor w = stacked ? ref_view(in[0], {k, rows[t], 1, 1}, {1, k, k * rows[t], k * rows[t]}, first * k)
                                  : in[t];
      first += rows[t];
      out.push_back(mul_mat_ref(w, x));
    }
    return out.size() == 2 ? concat_results({&out[0], &out[1]}) : concat_results({&out[0], &out[1], &out[2]});
  };
  std::string shapes;
  double flops = 0.0;
  for (size_t t = 0; t < rows.size(); ++t) {
    shapes += fmt::format("{}{}[{}, {}{}] ", t == 0 ? "" : "+ ", wts[t] == wt ? "" : dtype_name(wts[t]), k, rows[t],
                          w2[t] > 1 ? fmt::format(", {}", w2[t]) : "");
    flops += 2.0 * static_cast<double>(rows[t] * n * k * b2);
  }
  cases.push_back({"mat_vec_multi",
                   fmt::format("w={} {}x=f32[{}, {}{}]{}", dtype_name(wt), shapes, k, n,
                               b2 > 1 ? fmt::format(", {}", b2) : "", stacked ? " stacked" : ""),
                   mul_mat_nmse(wt), build, ref, flops, FusedKind::mat_vec_multi});
}

// ---- rope_set_rows ---------------------------------------------------------------------------------

// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding): fields follow the order of the case table
struct RopeStoreCase {
  int64_t head_dim, n_head, n_head_kv, n_tokens, n_cells;
  DType cache_type;
  RopeParams p;
  bool freq_factors = false;
  bool with_q = true;   // Q rotated too (the fused kernel's optional rope_q)
  bool q_first = true;  // Q's rope built before K's
  bool with_v = false;  // V stored at the same cells too (the fused kernel's optional set_rows_v)
};

// StepBuilder::attention's store of the rotated keys: set_rows(cache_k, permute(rope(k), 0, 2, 1, 3),
// kv_cells) into a [head_dim, n_cells, n_head_kv] cache, and rope(q) with the same positions. The
// whole cache (rows not written keep their values) and the rotated Q are checked.
void add_rope_set_rows(CaseList& cases, const RopeStoreCase& c) {
  auto build = [c](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* q = in.uniform(DType::f32, {c.head_dim, c.n_head, c.n_tokens, 1});
    Tensor* k = in.uniform(DType::f32, {c.head_dim, c.n_head_kv, c.n_tokens, 1});
    Tensor* pos = in.indices({c.n_tokens, 1, 1, 1}, 1024, false);
    Tensor* cells = in.indices({c.n_tokens, 1, 1, 1}, c.n_cells, true);
    Tensor* cache = in.uniform(c.cache_type, {c.head_dim, c.n_cells, c.n_head_kv, 1});
    Tensor* ff = c.freq_factors ? in.uniform(DType::f32, {c.p.n_dims / 2, 1, 1, 1}, 1.0f, 8.0f) : nullptr;
    Tensor* q_rot = c.with_q && c.q_first ? rope(g, q, pos, ff, c.p) : nullptr;
    Tensor* k_rot = rope(g, k, pos, ff, c.p);
    if (c.with_q && !c.q_first) q_rot = rope(g, q, pos, ff, c.p);
    Tensor* stored = set_rows(g, cache, permute(g, k_rot, 0, 2, 1, 3), cells);
    if (q_rot) g.mark_output(q_rot);
    if (c.with_v) {
      Tensor* v = in.uniform(DType::f32, {c.head_dim, c.n_head_kv, c.n_tokens, 1});
      Tensor* cache_v = in.uniform(c.cache_type, {c.head_dim, c.n_cells, c.n_head_kv, 1});
      g.mark_output(set_rows(g, cache_v, permute(g, v, 0, 2, 1, 3), cells));
    }
    return stored;
  };
  auto ref = [c](const std::vector<RefTensor>& in) {
    const RefTensor* ff = c.freq_factors ? &in[5] : nullptr;
    const RefTensor k_rot = ref_round_trip(rope_ref(in[1], in[2], ff, c.p), c.cache_type);
    RefTensor cache = in[4];
    for (int64_t t = 0; t < c.n_tokens; ++t)
      for (int64_t h = 0; h < c.n_head_kv; ++h) {
        const auto cell = static_cast<int64_t>(in[3](t));
        for (int64_t i = 0; i < c.head_dim; ++i) cache(i, cell, h) = k_rot(i, h, t);
      }
    if (!c.with_q) return cache;
    const RefTensor q_rot = rope_ref(in[0], in[2], ff, c.p);
    if (!c.with_v) return concat_results({&cache, &q_rot});
    const size_t vi = c.freq_factors ? 6 : 5;
    const RefTensor v = ref_round_trip(in[vi], c.cache_type);
    RefTensor cache_v = in[vi + 1];
    for (int64_t t = 0; t < c.n_tokens; ++t)
      for (int64_t h = 0; h < c.n_head_kv; ++h) {
        const auto cell = static_cast<int64_t>(in[3](t));
        for (int64_t i = 0; i < c.head_dim; ++i) cache_v(i, cell, h) = v(i, h, t);
      }
    return concat_results({&cache, &q_rot, &cache_v});
  };
  const RopeParams& p = c.p;
  std::string desc = fmt::format("hd={} heads={}/{} T={} cache={}[{}] {} n_dims={}", c.head_dim, c.n_head,
                                 c.n_head_kv, c.n_tokens, dtype_name(c.cache_type), c.n_cells,
                                 p.mode == RopeMode::neox ? "neox" : "normal", p.n_dims);
  if (p.ext_factor != 0.0f) desc += " yarn";
  if (c.freq_factors) desc += " freq_factors";
  desc += !c.with_q ? " (no q)" : c.q_first ? "" : " (q roped after k)";
  if (c.with_v) desc += " + v store";
  cases.push_back({"rope_set_rows", desc, kNmseRope, build, ref, 0.0, FusedKind::rope_set_rows});
}

// ---- scale_mask_soft_max ---------------------------------------------------------------------------

// soft_max(add(scale(kq, s), mask)): attention scores scaled, masked (the mask broadcast over the
// heads by add) and normalised per row; `sm_scale` is the soft_max's own scale.
void add_scale_mask_soft_max(CaseList& cases, const Shape& ne, const Shape& mask_ne, float s, float bias,
                             float sm_scale) {
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* kq = in.uniform(DType::f32, ne, -4.0f, 4.0f);
    Tensor* mask = in.mask(DType::f32, mask_ne, 0.2, true, mask_ne[1]);
    return soft_max(g, add(g, scale(g, kq, s, bias), mask), nullptr, sm_scale);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    RefTensor out(ne);
    const int64_t n = ne[0];
    std::vector<double> y(static_cast<size_t>(n));
    for (int64_t i3 = 0; i3 < ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < ne[1]; ++i1) {
          double mx = -INFINITY;
          for (int64_t i = 0; i < n; ++i) {
            y[i] = (x(i, i1, i2, i3) * s + bias + broadcast_at(in[1], i, i1, i2, i3)) * sm_scale;
            mx = std::max(mx, y[i]);
          }
          double sum = 0.0;
          for (int64_t i = 0; i < n; ++i) sum += (y[i] = std::exp(y[i] - mx));
          for (int64_t i = 0; i < n; ++i) out(i, i1, i2, i3) = y[i] / sum;
        }
    return out;
  };
  std::string desc = fmt::format("kq={} mask={} scale={:g}", shape_string(ne), shape_string(mask_ne), s);
  if (bias != 0.0f) desc += fmt::format(" bias={:g}", bias);
  if (sm_scale != 1.0f) desc += fmt::format(" soft_max scale={:g}", sm_scale);
  cases.push_back(
      {"scale_mask_soft_max", desc, kNmseElementwise, build, ref, 0.0, FusedKind::scale_mask_soft_max});
}

// ---- moe_route -------------------------------------------------------------------------------------

// StepBuilder::ffn_moe's routing: probs = soft_max(logits); ids = top_k(probs, k); weights =
// get_rows(reshape(probs, [1, n_expert, T]), ids), optionally divided by their sum. The weights
// (as ffn_moe leaves them: [1, k, T]) and the ids (marked as an output) are checked.
void add_moe_route(CaseList& cases, int64_t n_expert, int k, int64_t n_tokens, bool norm) {
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* logits = in.distinct({n_expert, n_tokens, 1, 1});
    Tensor* probs = soft_max(g, logits, nullptr, 1.0f);
    Tensor* ids = top_k(g, probs, k);
    Tensor* weights = get_rows(g, reshape(g, probs, {1, n_expert, n_tokens, 1}), ids);
    if (norm) {
      Tensor* w2 = reshape(g, weights, {k, n_tokens, 1, 1});
      w2 = div(g, w2, sum_rows(g, w2));
      weights = reshape(g, w2, {1, k, n_tokens, 1});
    }
    if (ids) g.mark_output(ids);
    return weights;
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    RefTensor weights({1, k, n_tokens, 1}), ids({k, n_tokens, 1, 1});
    std::vector<double> p(static_cast<size_t>(n_expert));
    std::vector<int64_t> order(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < n_tokens; ++t) {
      double mx = -INFINITY, sum = 0.0;
      for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, in[0](e, t));
      for (int64_t e = 0; e < n_expert; ++e) sum += (p[e] = std::exp(in[0](e, t) - mx));
      for (double& v : p) v /= sum;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      double chosen = 0.0;
      for (int e = 0; e < k; ++e) chosen += p[order[e]];
      for (int e = 0; e < k; ++e) {
        ids(e, t) = static_cast<double>(order[e]);
        weights(0, e, t) = norm ? p[order[e]] / chosen : p[order[e]];
      }
    }
    return concat_results({&weights, &ids});
  };
  cases.push_back({"moe_route",
                   fmt::format("experts={} k={} T={}{}", n_expert, k, n_tokens, norm ? " normalised" : ""),
                   kNmseElementwise, build, ref, 0.0, FusedKind::moe_route});
}

// ---- gather_flash_attn -----------------------------------------------------------------------------

// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding): fields follow the order of the case table
struct GatherAttnCase {
  int64_t d, n_head, n_head_kv, n_seqs, n_kv;
  bool store = false;  // each sequence's new K/V row stored by set_rows first, as a decode step does
  float softcap = 0.0f;
  bool sinks = false;  // a per-head sink logit in every denominator (gpt-oss)
};

// Which cell each slot of each sequence reads, as the paged cache lays them out: a sequence's
// cells scattered over the store, odd sequences sharing the first slots of the one before (a shared
// prompt prefix: those rows are read by both), padding slots past a sequence's length reading its
// first cell (masked). Each sequence's last visible slot is a cell of its own (its new token's).
struct SlotTable {
  int64_t n_cells = 0;
  std::vector<int64_t> len;                // visible slots per sequence
  std::vector<std::vector<int64_t>> cell;  // [seq][slot]
};

SlotTable slot_table(const GatherAttnCase& c) {
  SlotTable t;
  t.n_cells = c.n_seqs * c.n_kv + 7;
  std::vector<int64_t> perm(static_cast<size_t>(t.n_cells));
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(0x5107 + static_cast<uint64_t>(c.n_kv * 31 + c.n_seqs));
  for (int64_t i = t.n_cells - 1; i > 0; --i)
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng.below(i + 1))]);
  size_t next = 0;
  for (int64_t s = 0; s < c.n_seqs; ++s) {
    const int64_t len = s == 0 ? c.n_kv : std::max<int64_t>(2, c.n_kv - (s * 37) % c.n_kv);
    const int64_t shared = s % 2 == 1 ? std::min(len, t.len.back()) / 2 : 0;
    std::vector<int64_t> cells(static_cast<size_t>(c.n_kv));
    for (int64_t j = 0; j < c.n_kv; ++j) {
      if (j < shared)
        cells[j] = t.cell.back()[j];
      else if (j < len)
        cells[j] = perm[next++];
      else
        cells[j] = cells[0];
    }
    t.len.push_back(len);
    t.cell.push_back(std::move(cells));
  }
  return t;
}

// StepBuilder::attention's gather branch (shape.gather, one token of each of n_seqs sequences):
// each layer's f16 store viewed as rows [d, n_cells * n_head_kv], get_rows with the step's row
// indices (row h * n_cells + cell for slot j of KV head h of sequence s), reshaped to
// [d, n_kv, n_head_kv, n_seqs], and one flash_attn over all sequences with q [d, 1, n_head, n_seqs]
// and the mask [n_kv, 1, 1, n_seqs]. With `store`, the new rows go into the caches first and the
// gathers read views of the stores (both caches checked too).
void add_gather_flash_attn(CaseList& cases, const GatherAttnCase& c) {
  const SlotTable slots = slot_table(c);
  const int64_t n_cells = slots.n_cells, hkv = c.n_head_kv, n_rows = c.n_kv * hkv * c.n_seqs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  auto build = [c, slots, n_cells, hkv, n_rows, scale](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* q = in.uniform(DType::f32, {c.d, c.n_head, c.n_seqs, 1});  // [d, H, T], as rope leaves it
    Tensor* cache_k = in.uniform(DType::f16, {c.d, n_cells, hkv, 1});
    Tensor* cache_v = in.uniform(DType::f16, {c.d, n_cells, hkv, 1});
    Tensor* idx =
        in.custom(DType::i32, {n_rows, 1, 1, 1}, [c, slots](Rng&, const Shape&, std::vector<float>& v) {
          for (int64_t s = 0; s < c.n_seqs; ++s)
            for (int64_t h = 0; h < c.n_head_kv; ++h)
              for (int64_t j = 0; j < c.n_kv; ++j)
                v[static_cast<size_t>(j + c.n_kv * (h + c.n_head_kv * s))] =
                    static_cast<float>(h * slots.n_cells + slots.cell[s][j]);
        });
    Tensor* mask = in.custom(
        DType::f32, {c.n_kv, 1, 1, c.n_seqs}, [slots](Rng& rng, const Shape& sh, std::vector<float>& v) {
          for (int64_t s = 0; s < sh[3]; ++s)
            for (int64_t j = 0; j < sh[0]; ++j) {
              const int64_t len = slots.len[s];
              const bool hidden = j >= len || (j + 1 < len && rng.unit() < 0.15);  // the own token is visible
              v[static_cast<size_t>(s * sh[0] + j)] = hidden ? -INFINITY : rng.uniform(-1.0f, 0.0f);
            }
        });
    Tensor* stored_k = cache_k;
    Tensor* stored_v = cache_v;
    if (c.store) {
      Tensor* k_new = in.uniform(DType::f32, {c.d, hkv, c.n_seqs, 1});
      Tensor* v_new = in.uniform(DType::f32, {c.d, hkv, c.n_seqs, 1});
      Tensor* cells =
          in.custom(DType::i32, {c.n_seqs, 1, 1, 1}, [slots](Rng&, const Shape&, std::vector<float>& v) {
            for (size_t s = 0; s < v.size(); ++s)
              v[s] = static_cast<float>(slots.cell[s][static_cast<size_t>(slots.len[s] - 1)]);
          });
      stored_k = set_rows(g, cache_k, permute(g, k_new, 0, 2, 1, 3), cells);
      stored_v = set_rows(g, cache_v, permute(g, v_new, 0, 2, 1, 3), cells);
      if (!stored_k || !stored_v) return nullptr;
    }
    auto gathered = [&](Tensor* stored) {
      const size_t row = stored->nb[1], rows = static_cast<size_t>(n_cells * hkv);
      Tensor* r =
          view(g, stored, {c.d, n_cells * hkv, 1, 1}, {stored->nb[0], row, row * rows, row * rows}, 0);
      return reshape(g, get_rows(g, r, idx), {c.d, c.n_kv, hkv, c.n_seqs});
    };
    Tensor* keys = gathered(stored_k);
    Tensor* vals = gathered(stored_v);
    Tensor* qs = permute(g, reshape(g, q, {c.d, c.n_head, 1, c.n_seqs}), 0, 2, 1, 3);  // [d, 1, H, S]
    Tensor* sinks = c.sinks ? in.uniform(DType::f32, {c.n_head, 1, 1, 1}, -1.0f, 3.0f) : nullptr;
    Tensor* out = flash_attn(g, qs, keys, vals, mask, scale, c.softcap, sinks);
    if (c.store && out) {
      g.mark_output(stored_k);
      g.mark_output(stored_v);
    }
    return out;
  };
  auto ref = [c, slots, scale](const std::vector<RefTensor>& in) {
    const RefTensor& q = in[0];
    RefTensor ck = in[1], cv = in[2];
    const RefTensor& mask = in[4];
    if (c.store) {
      const RefTensor k_new = ref_round_trip(in[5], DType::f16), v_new = ref_round_trip(in[6], DType::f16);
      for (int64_t s = 0; s < c.n_seqs; ++s)
        for (int64_t h = 0; h < c.n_head_kv; ++h) {
          const auto cell = static_cast<int64_t>(in[7](s));
          for (int64_t i = 0; i < c.d; ++i) {
            ck(i, cell, h) = k_new(i, h, s);
            cv(i, cell, h) = v_new(i, h, s);
          }
        }
    }
    const int64_t group = c.n_head / c.n_head_kv;
    RefTensor out({c.d, c.n_head, 1, c.n_seqs});
    std::vector<double> w(static_cast<size_t>(c.n_kv));
    for (int64_t s = 0; s < c.n_seqs; ++s)
      for (int64_t h = 0; h < c.n_head; ++h) {
        const int64_t hk = h / group;
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.n_kv; ++j) {
          // the row the index names: cell r % n_cells of KV head r / n_cells
          const auto r = static_cast<int64_t>(in[3](j + c.n_kv * (hk + c.n_head_kv * s)));
          const int64_t cell = r % slots.n_cells, head = r / slots.n_cells;
          double x = 0.0;
          for (int64_t i = 0; i < c.d; ++i) x += q(i, h, s) * ck(i, cell, head);
          x *= scale;
          if (c.softcap > 0.0f) x = c.softcap * std::tanh(x / c.softcap);
          w[j] = x + mask(j, 0, 0, s);
          mx = std::max(mx, w[j]);
        }
        double sum = 0.0;
        for (double& x : w) sum += (x = std::exp(x - mx));
        if (c.sinks) sum += std::exp(in[c.store ? 8 : 5](h) - mx);  // created after every other input
        for (int64_t i = 0; i < c.d; ++i) {
          double acc = 0.0;
          for (int64_t j = 0; j < c.n_kv; ++j) {
            const auto r = static_cast<int64_t>(in[3](j + c.n_kv * (hk + c.n_head_kv * s)));
            acc += w[j] * cv(i, r % slots.n_cells, r / slots.n_cells);
          }
          out(i, h, 0, s) = acc / sum;
        }
      }
    if (!c.store) return out;
    return concat_results({&out, &ck, &cv});
  };
  std::string desc = fmt::format("d={} heads={}/{} seqs={} n_kv={} f16 store[{}] i32 rows", c.d, c.n_head,
                                 hkv, c.n_seqs, c.n_kv, n_cells * hkv);
  if (c.softcap > 0.0f) desc += fmt::format(" softcap={:g}", c.softcap);
  if (c.store) desc += " (stores first)";
  if (c.sinks) desc += " sinks";
  // 2 d per (query head, slot) for Q K^T and as many for P V (masked slots counted: an upper bound)
  const double flops = 4.0 * static_cast<double>(c.d * c.n_kv * c.n_head * c.n_seqs);
  OpCase oc{"gather_flash_attn", desc, kNmseFlashAttn, build, ref, flops, FusedKind::gather_flash_attn};
  oc.fusion_fast_only = true;
  cases.push_back(std::move(oc));
}

// ---- rope_flash_attn -------------------------------------------------------------------------------

// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding): fields follow the order of the case table
struct RopeAttnCase {
  int64_t d, n_head, n_head_kv, n_kv, n_cells, cell;  // the token's cell (n_kv and more: stored, not attended)
  RopeParams p;
  bool freq_factors = false;
  DType mask_type = DType::f32;
};

// A decode step of StepBuilder::attention on a contiguous cache (one token): rope(q) and rope(k) at the
// token's position, K and V stored into [d, n_cells, n_head_kv] f16 caches at its cell, then flash_attn
// of permute(rope(q)) over views of the two stores' first n_kv cells, under a mask with hidden keys and
// the token's own cell visible. The output and both whole caches are checked.
void add_rope_flash_attn(CaseList& cases, const RopeAttnCase& c) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  auto one = [](float value) {
    return [value](Rng&, const Shape&, std::vector<float>& v) { v.assign(v.size(), value); };
  };
  auto build = [c, scale, one](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* q = in.uniform(DType::f32, {c.d, c.n_head, 1, 1});
    Tensor* k = in.uniform(DType::f32, {c.d, c.n_head_kv, 1, 1});
    Tensor* v = in.uniform(DType::f32, {c.d, c.n_head_kv, 1, 1});
    Tensor* pos = in.custom(DType::i32, {1, 1, 1, 1}, one(static_cast<float>(c.cell + 1000)));
    Tensor* cells = in.custom(DType::i32, {1, 1, 1, 1}, one(static_cast<float>(c.cell)));
    Tensor* cache_k = in.uniform(DType::f16, {c.d, c.n_cells, c.n_head_kv, 1});
    Tensor* cache_v = in.uniform(DType::f16, {c.d, c.n_cells, c.n_head_kv, 1});
    Tensor* ff = c.freq_factors ? in.uniform(DType::f32, {c.p.n_dims / 2, 1, 1, 1}, 1.0f, 8.0f) : nullptr;
    Tensor* mask = in.custom(c.mask_type, {c.n_kv, 1, 1, 1}, [c](Rng& rng, const Shape& sh, std::vector<float>& m) {
      for (int64_t j = 0; j < sh[0]; ++j)
        m[static_cast<size_t>(j)] = j != c.cell && rng.unit() < 0.2 ? -INFINITY : rng.uniform(-1.0f, 0.0f);
    });
    Tensor* q_rot = rope(g, q, pos, ff, c.p);
    Tensor* k_rot = rope(g, k, pos, ff, c.p);
    Tensor* stored_k = set_rows(g, cache_k, permute(g, k_rot, 0, 2, 1, 3), cells);
    Tensor* stored_v = set_rows(g, cache_v, permute(g, v, 0, 2, 1, 3), cells);
    if (!stored_k || !stored_v) return nullptr;
    Tensor* keys = view(g, stored_k, {c.d, c.n_kv, c.n_head_kv, 1}, stored_k->nb, 0);
    Tensor* vals = view(g, stored_v, {c.d, c.n_kv, c.n_head_kv, 1}, stored_v->nb, 0);
    Tensor* out = flash_attn(g, permute(g, q_rot, 0, 2, 1, 3), keys, vals, mask, scale);
    if (out) {
      g.mark_output(stored_k);
      g.mark_output(stored_v);
      // the stored rows alone too: in the whole caches a lane's missing 16 bytes hide under the threshold
      for (Tensor* st : {stored_k, stored_v})
        g.mark_output(view(g, st, {c.d, 1, c.n_head_kv, 1}, st->nb, static_cast<size_t>(c.cell) * st->nb[1]));
    }
    return out;
  };
  auto ref = [c, scale](const std::vector<RefTensor>& in) {
    const RefTensor* ff = c.freq_factors ? &in[7] : nullptr;
    const RefTensor& mask = in[c.freq_factors ? 8 : 7];
    const RefTensor q_rot = rope_ref(in[0], in[3], ff, c.p);
    const RefTensor k_rot = ref_round_trip(rope_ref(in[1], in[3], ff, c.p), DType::f16);
    const RefTensor v16 = ref_round_trip(in[2], DType::f16);
    RefTensor ck = in[5], cv = in[6];
    for (int64_t h = 0; h < c.n_head_kv; ++h)
      for (int64_t i = 0; i < c.d; ++i) {
        ck(i, c.cell, h) = k_rot(i, h, 0);
        cv(i, c.cell, h) = v16(i, h, 0);
      }
    const int64_t group = c.n_head / c.n_head_kv;
    RefTensor out({c.d, c.n_head, 1, 1});
    std::vector<double> w(static_cast<size_t>(c.n_kv));
    for (int64_t h = 0; h < c.n_head; ++h) {
      const int64_t hk = h / group;
      double mx = -INFINITY;
      for (int64_t j = 0; j < c.n_kv; ++j) {
        double x = 0.0;
        for (int64_t i = 0; i < c.d; ++i) x += q_rot(i, h, 0) * ck(i, j, hk);
        w[static_cast<size_t>(j)] = x * scale + mask(j, 0, 0, 0);
        mx = std::max(mx, w[static_cast<size_t>(j)]);
      }
      double sum = 0.0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < c.d; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < c.n_kv; ++j) acc += w[static_cast<size_t>(j)] * cv(i, j, hk);
        out(i, h, 0, 0) = acc / sum;
      }
    }
    RefTensor k_row({c.d, 1, c.n_head_kv, 1}), v_row({c.d, 1, c.n_head_kv, 1});
    for (int64_t h = 0; h < c.n_head_kv; ++h)
      for (int64_t i = 0; i < c.d; ++i) {
        k_row(i, 0, h, 0) = ck(i, c.cell, h);
        v_row(i, 0, h, 0) = cv(i, c.cell, h);
      }
    return concat_results({&out, &ck, &cv, &k_row, &v_row});
  };
  std::string desc = fmt::format("d={} heads={}/{} n_kv={} cache=f16[{}] cell={} {} n_dims={} mask={}", c.d, c.n_head,
                                 c.n_head_kv, c.n_kv, c.n_cells, c.cell,
                                 c.p.mode == RopeMode::neox ? "neox" : "normal", c.p.n_dims, dtype_name(c.mask_type));
  if (c.freq_factors) desc += " freq_factors";
  if (c.p.ext_factor != 0.0f) desc += " yarn";
  const double flops = 4.0 * static_cast<double>(c.d * c.n_kv * c.n_head);
  OpCase oc{"rope_flash_attn", desc, kNmseFlashAttn, build, ref, flops, FusedKind::rope_flash_attn};
  oc.fusion_fast_only = true;
  cases.push_back(std::move(oc));
}

}  // namespace

void add_fused_cases(CaseList& cases, CaseSet set) {
  if (set == CaseSet::perf) {
    add_rms_norm_mul(cases, {4096, 1, 1, 1}, {4096, 1, 1, 1});
    add_add_rms_norm_mul(cases, {4096, 1, 1, 1}, {4096, 1, 1, 1});
    for (DType wt : {DType::f16, DType::q8_0, DType::q4_k}) {
      add_mat_vec_bias(cases, wt, 4096, 1, 4096);
      add_glu_mat_vec(cases, wt, 14336, 1, true, 4096);
    }
    add_glu_mat_vec(cases, DType::f16, 8192, 1, true, 2048);  // a 2048-wide model's gate + up
    for (DType wt : {DType::f16, DType::q8_0, DType::q4_k})
      add_mat_vec_multi(cases, wt, {4096, 1024, 1024}, 1, 4096);  // llama-3-8B Q, K, V
    // and a Q4_K_M file's: V in q6_K (LOOM_CUDA_MIXED_MULTI=0: V a launch of its own)
    add_mat_vec_multi(cases, DType::q4_k, {4096, 1024, 1024}, 1, 4096, 1, {}, false,
                      {DType::q4_k, DType::q4_k, DType::q6_k});
    // batched decode at 64 sequences (the fast mode's gemm_q form: one launch, one packing)
    for (DType wt : {DType::q4_k, DType::q6_k}) {
      add_glu_mat_vec(cases, wt, 14336, 64, true, 4096);
      add_mat_vec_multi(cases, wt, {4096, 1024, 1024}, 64, 4096);
      for (size_t i = cases.size() - 2; i < cases.size(); ++i)
        cases[i].fusion_fast_only = cases[i].fusion_device_dependent = true;
    }
    add_rope_set_rows(cases, {128, 32, 8, 1, 4096, DType::f16, rope_params(RopeMode::neox, 128, 500000.0f)});
    // a 512-token prompt chunk of an 8B layer: Q, K and V stored
    add_rope_set_rows(cases, {128, 32, 8, 512, 4096, DType::f16, rope_params(RopeMode::neox, 128, 500000.0f), true,
                              true, true, true});
    add_scale_mask_soft_max(cases, {4096, 1, 32, 1}, {4096, 1, 1, 1}, 0.088f, 0.0f, 1.0f);
    add_moe_route(cases, 128, 8, 1, true);
    // loom bench -npl 64 -npp 128 -ntg 32 on an 8B model: 64 sequences over a 256-slot bucket
    add_gather_flash_attn(cases, {128, 32, 8, 64, 256});
    // a decode step of an 8B layer at 128 and 4,096 keys
    for (int64_t n_kv : {128, 4096})
      add_rope_flash_attn(cases, {128, 32, 8, n_kv, n_kv, n_kv - 1, rope_params(RopeMode::normal, 128, 500000.0f)});
    return;
  }

  // rms_norm(x) * w: a token's hidden row, several tokens, per-head norms (QK-norm: the weight
  // [head_dim] broadcast over heads and tokens), a row longer than one block of threads.
  add_rms_norm_mul(cases, {256, 1, 1, 1}, {256, 1, 1, 1});
  add_rms_norm_mul(cases, {96, 5, 1, 1}, {96, 1, 1, 1});
  add_rms_norm_mul(cases, {64, 4, 3, 1}, {64, 1, 1, 1});
  add_rms_norm_mul(cases, {3000, 2, 1, 1}, {3000, 1, 1, 1});
  add_add_rms_norm_mul(cases, {256, 1, 1, 1}, {256, 1, 1, 1});
  add_add_rms_norm_mul(cases, {160, 7, 1, 1}, {160, 7, 1, 1});
  add_add_rms_norm_mul(cases, {2050, 3, 1, 1}, {2050, 1, 1, 1});  // the second operand broadcast

  for (DType wt : kAllWeightTypes)
    for (int64_t n : {1, 3, 8}) add_mat_vec_bias(cases, wt, 37, n);

  for (DType wt : kAllWeightTypes)
    for (int64_t n : {1, 3}) add_glu_mat_vec(cases, wt, 45, n, true);
  for (DType wt : {DType::f32, DType::f16, DType::q8_0, DType::q4_k})
    for (int64_t n : {1, 3}) add_glu_mat_vec(cases, wt, 29, n, false);
  // Float weights on the mat-vec loop's 16-byte path (k 1344: aligned rows, whole unrolled steps
  // and a remainder); the k 75 cases above take its one-element path.
  for (DType wt : {DType::f32, DType::f16, DType::bf16})
    for (int64_t n : {1, 3}) {
      add_mat_vec_bias(cases, wt, 37, n, 1344);
      add_glu_mat_vec(cases, wt, 45, n, true, 1344);
      add_mat_vec_multi(cases, wt, {40, 12, 12}, n, 1344);
    }

  // Q, K, V of one token or three (k 256: whole q4_K/q6_K blocks), two products (K and V), rows
  // that leave a block of warps partly idle, an odd k for float weights, and batches with the
  // weights broadcast over them (one matrix per batch for the second).
  for (DType wt : kAllWeightTypes)
    for (int64_t n : {1, 3}) add_mat_vec_multi(cases, wt, {64, 32, 32}, n, 256);
  for (DType wt : {DType::f16, DType::q8_0, DType::q4_k}) add_mat_vec_multi(cases, wt, {45, 19}, 2, 256);
  // The newer block formats through each fused projection.
  for (DType wt : kNewerWeightTypes)
    for (int64_t n : {1, 3}) {
      add_mat_vec_bias(cases, wt, 37, n);
      add_glu_mat_vec(cases, wt, 45, n, true);
      add_mat_vec_multi(cases, wt, {64, 32, 32}, n, 256);
    }
  // q6_K on the fast mode's direct mat-vec (rows of whole 8-block groups: k a multiple of 2048).
  for (int64_t n : {1, 2}) {
    add_mat_vec_bias(cases, DType::q6_k, 37, n, 2048);
    add_glu_mat_vec(cases, DType::q6_k, 45, n, true, 2048);
    add_mat_vec_multi(cases, DType::q6_k, {64, 32, 32}, n, 2048);
  }
  add_glu_mat_vec(cases, DType::q6_k, 203, 1, false, 4096);
  // A Q4_K_M file's Q, K (q4_K) and V (q6_K) at one token: one launch of the direct kernels' mixed form
  // in fast numerics (q6_K's 8-block groups: k a multiple of 2048; rows off the 2- and 4-row tiles), the
  // exact mode fusing the q4_K pair alone (so a fusion in both, one dispatch in fast: the graph has no
  // other node); and a pair with q6_K first, fused in fast numerics only.
  // (LOOM_CUDA_MIXED_MULTI=0 or LOOM_MV_DIRECT=0, set for comparisons, keep the mixed form off: then only
  // the q4_K pair fuses, and the q6_K-first pair not at all)
  {
    using D = DType;
    auto off = [](const char* var) {
      const char* v = std::getenv(var);
      return v && std::string_view(v) == "0";
    };
    const bool mixed = !off("LOOM_CUDA_MIXED_MULTI") && !off("LOOM_MV_DIRECT");
    add_mat_vec_multi(cases, D::q4_k, {64, 32, 30}, 1, 2048, 1, {}, false, {D::q4_k, D::q4_k, D::q6_k});
    cases.back().fast_max_dispatches = mixed ? 1 : 0;
    add_mat_vec_multi(cases, D::q4_k, {4096, 1024, 1024}, 1, 4096, 1, {}, false, {D::q4_k, D::q4_k, D::q6_k});
    cases.back().fast_max_dispatches = mixed ? 1 : 0;
    add_mat_vec_multi(cases, D::q4_k, {26, 51}, 1, 4096, 1, {}, false, {D::q6_k, D::q4_k});
    cases.back().fusion_fast_only = true;
    cases.back().fusion_device_dependent = !mixed;
    cases.back().fast_max_dispatches = mixed ? 1 : 0;
  }
  // Past the mat-vecs' 8 columns, quantized weights in the fast mode: the gemm_q form (one launch of
  // the products of 256-row tiles, one packing; gate and up gated in the reduction), with whole and
  // partial column tiles, products split over k and not, and a last part of a partial row tile.
  {
    CaseList gemm_q_form;
    for (DType wt : {DType::q4_0, DType::q4_k, DType::q8_0, DType::q6_k})
      for (int64_t n : {16, 33, 64}) {
        add_glu_mat_vec(gemm_q_form, wt, 256, n, n != 33, 512);
        add_mat_vec_multi(gemm_q_form, wt, {512, 256, 256}, n, 512);
      }
    // the newer formats on gemm_q's f16 dequantization (stop 44)
    for (DType wt : {DType::q5_k, DType::iq4_xs, DType::q3_k, DType::q2_k, DType::q4_1, DType::q5_0, DType::q5_1,
                     DType::iq4_nl})
      for (int64_t n : {16, 64}) {
        add_glu_mat_vec(gemm_q_form, wt, 256, n, true, 512);
        add_mat_vec_multi(gemm_q_form, wt, {512, 256, 256}, n, 512);
      }
    add_glu_mat_vec(gemm_q_form, DType::q4_k, 4096, 40, true, 1024);
    add_mat_vec_multi(gemm_q_form, DType::q4_k, {256, 256, 100}, 24, 256);
    add_mat_vec_multi(gemm_q_form, DType::q4_0, {768, 256}, 64, 2048);
    // f16 / bf16 weights back to back past 8 columns: CUDA's one cuBLAS GEMM over the stacked rows
    for (DType wt : {DType::f16, DType::bf16}) {
      add_mat_vec_multi(gemm_q_form, wt, {256, 64, 64}, 24, 320, 1, {}, true);
      add_mat_vec_multi(gemm_q_form, wt, {96, 40}, 64, 128, 1, {}, true);
      add_mat_vec_multi(gemm_q_form, wt, {96, 42}, 24, 128, 1, {}, true);  // rows copied one a thread
      add_glu_mat_vec(gemm_q_form, wt, 200, 24, true, 192, true);
      add_glu_mat_vec(gemm_q_form, wt, 64, 64, false, 256, true);
    }
    for (OpCase& oc : gemm_q_form) {
      oc.fusion_fast_only = true;
      oc.fusion_device_dependent = true;
      cases.push_back(std::move(oc));
    }
  }
  add_mat_vec_multi(cases, DType::f32, {37, 13, 6}, 8, 75);
  add_mat_vec_multi(cases, DType::bf16, {21, 10}, 1, 75);
  add_mat_vec_multi(cases, DType::q4_0, {24, 8, 8}, 3, 128, 2, {1, 2, 1});
  add_mat_vec_multi(cases, DType::f32, {16, 12, 12}, 1, 96, 2, {2, 1, 1});
  // prompt passes (past gemm_q's columns): Q alone, K and V as one strided-batched GEMM, fast numerics;
  // V of another type as in Q4_K_M files
  for (const DType v_type : {DType::q4_k, DType::q6_k}) {
    add_mat_vec_multi(cases, DType::q4_k, {512, 128, 128}, 300, 256, 1, {}, false, {DType::q4_k, DType::q4_k, v_type});
    cases.back().fusion_fast_only = true;
  }

  using M = RopeMode;
  const RopeStoreCase stores[] = {
      {64, 4, 2, 1, 8, DType::f16, rope_params(M::neox, 64, 10000.0f)},  // one token (decode)
      {64, 4, 2, 5, 16, DType::f16, rope_params(M::normal, 64, 10000.0f)},
      {128, 8, 2, 3, 6, DType::f16, rope_params(M::neox, 128, 500000.0f), true},  // llama-3 freq_factors
      {80, 3, 1, 4, 9, DType::f16, rope_params(M::normal, 32, 10000.0f)},         // partial rotation
      {64, 2, 2, 3, 5, DType::f16, rope_params(M::neox, 64, 10000.0f, 0.25f, 1.0f, 1.0f)},  // YaRN
      {64, 4, 2, 4, 7, DType::f32, rope_params(M::neox, 64, 10000.0f)},
      {64, 4, 2, 3, 8, DType::f16, rope_params(M::neox, 64, 10000.0f), false, true, false},
      {32, 2, 2, 2, 4, DType::f16, rope_params(M::normal, 32, 10000.0f), false, false},
      // with the values' store at the same cells, as StepBuilder::attention builds it
      {64, 4, 2, 1, 8, DType::f16, rope_params(M::neox, 64, 10000.0f), false, true, true, true},
      {128, 8, 2, 3, 6, DType::f16, rope_params(M::neox, 128, 500000.0f), true, true, true, true},
      {64, 4, 2, 4, 7, DType::f32, rope_params(M::neox, 64, 10000.0f), false, true, true, true},
      // one token each (CUDA's decode kernel: an element a thread, its loads before its angle)
      {128, 32, 8, 1, 64, DType::f16, rope_params(M::neox, 128, 500000.0f), true, true, true, true},  // 8B
      {80, 3, 1, 1, 9, DType::f16, rope_params(M::normal, 32, 10000.0f)},  // partial rotation
      {64, 2, 2, 1, 5, DType::f16, rope_params(M::neox, 64, 10000.0f, 0.25f, 1.0f, 1.0f)},  // YaRN
      {64, 4, 2, 1, 7, DType::f32, rope_params(M::neox, 64, 10000.0f), false, true, true, true},
      {32, 2, 2, 1, 4, DType::f16, rope_params(M::normal, 32, 10000.0f), false, false},  // no Q
      {64, 4, 2, 1, 8, DType::f16, rope_params(M::normal, 64, 10000.0f), false, true, false},  // Q after K
  };
  for (const RopeStoreCase& c : stores) add_rope_set_rows(cases, c);

  add_scale_mask_soft_max(cases, {32, 4, 8, 1}, {32, 4, 1, 1}, 0.125f, 0.0f, 1.0f);
  add_scale_mask_soft_max(cases, {100, 1, 16, 1}, {100, 1, 1, 1}, 0.0883883f, 0.0f, 1.0f);
  add_scale_mask_soft_max(cases, {1500, 3, 2, 1}, {1500, 3, 1, 1}, 0.3f, 0.5f, 1.0f);
  add_scale_mask_soft_max(cases, {48, 6, 4, 1}, {48, 6, 2, 1}, 1.0f, 0.0f, 0.5f);

  add_moe_route(cases, 8, 2, 1, false);
  add_moe_route(cases, 8, 2, 4, true);
  add_moe_route(cases, 60, 4, 7, false);  // Qwen2-MoE: 60 experts, 4 used
  add_moe_route(cases, 128, 8, 3, true);  // Qwen3-MoE: 128 experts, 8 used, normalised
  add_moe_route(cases, 256, 8, 2, true);  // DeepSeek-V3-sized router

  // A batched decode step over a paged cache: GQA groups of 4 (whole row groups of the decode
  // kernel) and 3 (a partial one), one key split and several (n_kv > 64: the scratch merge), the
  // new rows stored first, softcap, head sizes 64, 128 and 256.
  add_gather_flash_attn(cases, {128, 8, 2, 5, 40});
  add_gather_flash_attn(cases, {128, 8, 2, 3, 300});
  add_gather_flash_attn(cases, {128, 8, 2, 4, 70, true});
  add_gather_flash_attn(cases, {64, 6, 2, 3, 100});
  add_gather_flash_attn(cases, {64, 4, 4, 2, 17, true, 30.0f});
  add_gather_flash_attn(cases, {256, 4, 1, 2, 129});
  // gpt-oss's attention sinks: one split (n_kv 40) and several (n_kv 600: the merge kernel adds them)
  add_gather_flash_attn(cases, {64, 8, 2, 3, 40, true, 0.0f, true});
  add_gather_flash_attn(cases, {64, 8, 1, 2, 600, false, 0.0f, true});

  // A decode step's rope and K/V stores folded into its attention: the token's cell the last key, one
  // in the middle (several splits: a split not the first holds it), one past the attended keys (stored
  // only); normal and neox pairs, partial rotation, frequency factors, head sizes 64, 128 and 256.
  add_rope_flash_attn(cases, {128, 8, 2, 40, 64, 39, rope_params(M::normal, 128, 500000.0f)});
  add_rope_flash_attn(cases, {128, 8, 2, 300, 320, 150, rope_params(M::neox, 128, 1000000.0f), true});
  add_rope_flash_attn(cases, {64, 4, 4, 17, 20, 16, rope_params(M::normal, 32, 10000.0f), false, DType::f16});
  add_rope_flash_attn(cases, {256, 4, 1, 129, 140, 128, rope_params(M::neox, 64, 10000.0f)});
  add_rope_flash_attn(cases, {64, 6, 2, 20, 40, 30, rope_params(M::neox, 64, 10000.0f)});
  // one split (fewer than 16 keys: the block writes the output itself), the cell in it; GQA groups of 8 (two
  // row groups a KV head); YaRN
  add_rope_flash_attn(cases, {128, 16, 2, 9, 12, 4, rope_params(M::normal, 128, 500000.0f)});
  add_rope_flash_attn(cases, {64, 4, 2, 64, 80, 63, rope_params(M::neox, 64, 10000.0f, 0.25f, 1.0f, 1.0f)});
  // several splits and their merge: an 8B layer's 16 over a 256-cell bucket (the cell in the seventh), 13
  // (not a power of two), 10 with GQA groups of 8 (two row groups a KV head)
  add_rope_flash_attn(cases, {128, 32, 8, 256, 256, 100, rope_params(M::normal, 128, 500000.0f)});
  add_rope_flash_attn(cases, {128, 8, 2, 200, 256, 199, rope_params(M::neox, 128, 1000000.0f), true});
  add_rope_flash_attn(cases, {128, 16, 2, 160, 192, 80, rope_params(M::normal, 128, 500000.0f)});
}

}  // namespace loom::optest
