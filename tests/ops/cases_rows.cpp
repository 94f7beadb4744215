// Cases: rms_norm, norm, soft_max, sum_rows, argmax, top_k, sample_tokens.
#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
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
// a packed row. `peaks`: uniform values below 1 but two equal maxima, at elements p - 1 and p of each
// row (p = ceil(ne0 / 8): the last of one eighth and the first of the next, where CUDA's k = 1 cluster
// splits a row between blocks), in a packed row.
void add_top_k(CaseList& cases, const Shape& ne, int k, bool transposed, bool ties = false, bool peaks = false) {
  auto build = [=](Graph& g, CaseInputs& in) {
    if (ties)
      return top_k(g, in.custom(DType::f32, ne, [](Rng& rng, const Shape&, std::vector<float>& v) {
        for (float& x : v) x = std::floor(rng.uniform(0.0f, 8.0f));
      }), k);
    if (peaks)
      return top_k(g, in.custom(DType::f32, ne, [](Rng& rng, const Shape& s, std::vector<float>& v) {
        for (float& x : v) x = rng.uniform(0.0f, 1.0f);
        const int64_t p = (s[0] + 7) / 8;
        for (int64_t r = 0; r * s[0] < static_cast<int64_t>(v.size()); ++r) {
          v[r * s[0] + p - 1] = 2.0f;
          v[r * s[0] + p] = 2.0f;
        }
      }), k);
    return top_k(g, reduction_source(g, in, ne, transposed, true), k);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    return per_row(reduction_values(in, transposed), {k, ne[1], ne[2], ne[3]},
                   [&](const double* x, int64_t) { return ranking(x, ne[0], k); });
  };
  cases.push_back({"top_k",
                   fmt::format("{} k={}{}{}{}", shape_string(ne), k, transposed ? " (transposed view)" : "",
                               ties ? " (ties)" : "", peaks ? " (equal maxima across an eighth)" : ""),
                   0.0,
                   build, ref, 0.0});
}

// ---- sample_tokens ----------------------------------------------------------------------------------
//
// The graph a decode step appends: top_k(logits, K) gives each row's candidates, sample_tokens picks
// the token with the row's words (SampleParamWord). The reference is the chain of graph.h and
// sample.h in float64: validate -> top-k -> top-p -> min-p -> temperature -> draw, ties toward the
// lower id, -inf never drawn, NaN or +inf anywhere in the row (or no finite candidate) gives -1.
//
// An exact token match needs a well-defined answer: the kernels compute the same chain in float
// (exp, the temperature division) with double sums, so their cumulative sums sit a few 1e-7
// (relative) off the reference's. The params generator therefore runs the reference on the logits
// it has just seen (sample_params) and keeps every decision clear of its boundary by a margin
// several times that error: a uniform within the margin of a boundary between two tokens' slices of
// the CDF is drawn again; a top_p within it of a cumulative probability, or a min-p threshold
// within it of a kept logit, is nudged (top_p + 1e-4, min_p * 1.01), which the descriptions do not
// show. The last boundary (the total) is not one: a uniform just under 1 picks the last token on
// both sides, the kernels through their last_possible fallback.

// What happens to a row's logits after the ladder (sample_logits).
enum class RowLogits {
  plain,
  masked,      ///< a third of the logits and the row's 3 best are -inf; the candidates are finite
  few_finite,  ///< at most 7 logits are finite: the candidates past them are -inf, never drawn
  all_masked,  ///< every logit -inf: no finite candidate, -1
  nan,         ///< one NaN: -1
  pos_inf,     ///< one +inf: -1
};

// One row of a case: its settings (SampleParamWord) and its logits.
struct SampleRowSpec {
  int32_t top_k;
  float temperature;
  float top_p;  ///< >= 1: off
  float min_p;  ///< <= 0: off
  int32_t min_keep;
  RowLogits logits;
  double uniform;  ///< < 0: drawn (and re-drawn near a boundary); else used as it is
};

// A row's decoded words.
struct SampleWords {
  int32_t top_k = 1;
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float log_min_p = 0.0f;
  int32_t min_keep = 0;
  double uniform = 0.0;
};

// The reference's token for one row, and whether a decision came within the kernels' rounding of
// its boundary.
struct SampleRef {
  int32_t token = -1;
  bool near_top_p = false;  ///< a cumulative probability within the margin of top_p
  bool near_min_p = false;  ///< a candidate's logit within the margin of the min-p threshold
  bool near_draw = false;   ///< the uniform within the margin of a boundary between two tokens
};

SampleRef sample_ref(const double* x, int64_t n_vocab, int64_t n_cand, const SampleWords& p) {
  SampleRef r;
  for (int64_t i = 0; i < n_vocab; ++i)
    if (std::isnan(x[i]) || x[i] == INFINITY) return r;
  // top_k's candidates: larger first, the lower id first among equals (-inf ones last)
  std::vector<int32_t> c(static_cast<size_t>(n_vocab));
  std::iota(c.begin(), c.end(), 0);
  std::partial_sort(c.begin(), c.begin() + n_cand, c.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const int64_t k = std::clamp<int64_t>(p.top_k, 1, n_cand);
  int64_t n = 0;  // the finite ones among the first k
  while (n < k && x[c[n]] > -INFINITY) ++n;
  if (n == 0) return r;
  if (p.temperature <= 0.0f) {
    r.token = c[0];
    return r;
  }
  const double best = x[c[0]];
  double scale = 0.0;  // the largest |logit| the kernels' float arithmetic sees
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(x[c[i]]));
  const int64_t min_keep = std::max<int64_t>(p.min_keep, 1);
  if (p.top_p < 1.0f) {  // the smallest prefix whose probability (at temperature 1) reaches top_p
    // float exp of a float difference: relative error ~ 2^-24 * (1 + |logit| + |best|) per weight
    const double margin = 1e-6 * (1.0 + 3.0 * scale);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(x[c[i]] - best);
    double cum = 0.0;
    int64_t cut = n;
    for (int64_t i = 0; i < n; ++i) {
      cum += std::exp(x[c[i]] - best) / sum;
      r.near_top_p = r.near_top_p || std::fabs(cum - p.top_p) < margin;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    n = std::max(cut, std::min(min_keep, n));
  }
  if (p.min_p > 0.0f) {  // p_i >= min_p * p_best  <=>  logit_i >= best + log(min_p)
    // (the kernels add the log_min_p word, a float log of min_p; the reference takes min_p itself)
    const double threshold = best + std::log(static_cast<double>(p.min_p));
    const double margin = 1e-6 * (1.0 + scale);  // the kernels' float threshold: ~1 ulp of best
    int64_t cut = 0;
    while (cut < n && x[c[cut]] >= threshold) ++cut;
    for (int64_t i = 0; i < n; ++i) r.near_min_p = r.near_min_p || std::fabs(x[c[i]] - threshold) < margin;
    n = std::max(cut, std::min(min_keep, n));
  }
  // temperature, then the draw: the first token whose cumulative weight exceeds uniform * total
  const double t = p.temperature;
  std::vector<double> w(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += w[i] = std::exp((x[c[i]] - best) / t);
  // float logit / t carries 2^-24 * |logit| / t of absolute error into each weight's exponent
  const double margin = 1e-6 * (1.0 + 3.0 * scale / t);
  const double target = p.uniform * sum;
  double cum = 0.0;
  r.token = c[n - 1];
  bool drawn = false;
  for (int64_t i = 0; i < n; ++i) {
    cum += w[i];
    if (i + 1 < n) r.near_draw = r.near_draw || std::fabs(p.uniform - cum / sum) < margin;
    if (!drawn && target < cum) {
      r.token = c[i];
      drawn = true;
    }
  }
  return r;
}

// Tie-free logits shaped like a model's: distinct_values' ladder x in [-1, 1) through the
// increasing map -log(1 + 1/V - x), which spreads each row's best few as a Zipf law (p_j ~ 1/j at
// temperature 1; about 10 at the top, -0.7 at the bottom) instead of leaving them all near 1 with
// equal weights, so that top-p and min-p cut somewhere; then each row's special values.
void sample_logits(Rng& rng, int64_t n_vocab, const std::vector<SampleRowSpec>& rows, std::vector<float>& v) {
  distinct_values(rng, v);
  for (float& x : v) x = static_cast<float>(-std::log(1.0 + 1.0 / static_cast<double>(n_vocab) - x));
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows.size(); ++r) {
    float* row = v.data() + r * static_cast<size_t>(n_vocab);
    switch (rows[r].logits) {
      case RowLogits::plain:
        break;
      case RowLogits::masked: {
        for (int i = 0; i < 3; ++i) *std::max_element(row, row + n_vocab) = -inf;
        for (int64_t i = 0; i < n_vocab; ++i)
          if (rng.unit() < 1.0 / 3.0) row[i] = -inf;
        break;
      }
      case RowLogits::few_finite: {
        std::vector<float> keep(7);
        std::vector<int64_t> at(7);
        for (size_t i = 0; i < keep.size(); ++i) {
          at[i] = rng.below(n_vocab);
          keep[i] = row[at[i]];
        }
        std::fill(row, row + n_vocab, -inf);
        for (size_t i = 0; i < keep.size(); ++i) row[at[i]] = keep[i];
        break;
      }
      case RowLogits::all_masked:
        std::fill(row, row + n_vocab, -inf);
        break;
      case RowLogits::nan:
        row[rng.below(n_vocab)] = std::numeric_limits<float>::quiet_NaN();
        break;
      case RowLogits::pos_inf:
        row[rng.below(n_vocab)] = inf;
        break;
    }
  }
}

SampleWords decode_words(const RefTensor& params, int64_t r) {
  auto word = [&](int w) { return static_cast<int32_t>(params(w, r)); };
  SampleWords p;
  p.top_k = word(kSampleTopK);
  p.temperature = std::bit_cast<float>(word(kSampleTemperature));
  p.top_p = std::bit_cast<float>(word(kSampleTopP));
  p.min_p = std::bit_cast<float>(word(kSampleMinP));
  p.log_min_p = std::bit_cast<float>(word(kSampleLogMinP));
  p.min_keep = word(kSampleMinKeep);
  p.uniform =
      std::bit_cast<double>(static_cast<uint64_t>(static_cast<uint32_t>(word(kSampleUniformLo))) |
                            static_cast<uint64_t>(static_cast<uint32_t>(word(kSampleUniformHi))) << 32);
  return p;
}

// Each row's words from its spec, kept clear of the reference's boundaries (see above) on the
// logits just generated.
void sample_params(Rng& rng, int64_t n_vocab, int64_t n_cand, const std::vector<SampleRowSpec>& rows,
                   const std::vector<float>& logits, std::vector<int32_t>& words) {
  // 48 random bits: a double in [0, 1) as the host's SampleRng gives (it has 53)
  auto draw = [&] { return rng.unit() + rng.unit() * 0x1p-24; };
  std::vector<double> x(static_cast<size_t>(n_vocab));
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRowSpec& s = rows[r];
    std::copy_n(logits.begin() + static_cast<std::ptrdiff_t>(r * x.size()), x.size(), x.begin());
    SampleWords p{
        s.top_k, s.temperature, s.top_p, s.min_p, 0.0f, s.min_keep, s.uniform >= 0.0 ? s.uniform : draw()};
    for (int tries = 0;; ++tries) {
      LOOM_ASSERT(tries < 100);
      // as the host computes the threshold's term (apply_min_p; llm_context.cpp fills the word so)
      p.log_min_p = p.min_p > 0.0f ? std::log(p.min_p) : 0.0f;
      const SampleRef ref = sample_ref(x.data(), n_vocab, n_cand, p);
      if (ref.near_top_p) {
        p.top_p += 1e-4f;
      } else if (ref.near_min_p) {
        p.min_p *= 1.01f;
      } else if (ref.near_draw) {
        LOOM_ASSERT(s.uniform < 0.0);  // a fixed uniform must be clear of every boundary
        p.uniform = draw();
      } else {
        break;
      }
    }
    int32_t* w = words.data() + r * kSampleParamWords;
    const auto u = std::bit_cast<uint64_t>(p.uniform);
    w[kSampleTopK] = p.top_k;
    w[kSampleTemperature] = std::bit_cast<int32_t>(p.temperature);
    w[kSampleTopP] = std::bit_cast<int32_t>(p.top_p);
    w[kSampleMinP] = std::bit_cast<int32_t>(p.min_p);
    w[kSampleLogMinP] = std::bit_cast<int32_t>(p.log_min_p);
    w[kSampleMinKeep] = p.min_keep;
    w[kSampleUniformLo] = static_cast<int32_t>(static_cast<uint32_t>(u));
    w[kSampleUniformHi] = static_cast<int32_t>(static_cast<uint32_t>(u >> 32));
  }
}

std::string sample_row_desc(const SampleRowSpec& s) {
  std::string d = fmt::format("top_k={} t={:g}", s.top_k, s.temperature);
  if (s.top_p < 1.0f) d += fmt::format(" top_p={:g}", s.top_p);
  if (s.min_p > 0.0f) d += fmt::format(" min_p={:g}", s.min_p);
  if (s.min_keep) d += fmt::format(" min_keep={}", s.min_keep);
  static const char* const kLogits[] = {"", " masked", " 7 finite", " all -inf", " NaN", " +inf"};
  d += kLogits[static_cast<int>(s.logits)];
  if (s.uniform >= 0.0) d += fmt::format(" u={:g}", s.uniform);
  return d;
}

// `what` describes rows of several settings; a single row describes itself.
void add_sample_tokens(CaseList& cases, int64_t n_vocab, int n_cand, const std::vector<SampleRowSpec>& rows,
                       const std::string& what = "") {
  const auto n_rows = static_cast<int64_t>(rows.size());
  const Shape ne{n_vocab, n_rows, 1, 1};
  auto build = [=](Graph& g, CaseInputs& in) -> Tensor* {
    // Leafs are filled in creation order from one Rng: the params' generator sees the logits.
    auto seen = std::make_shared<std::vector<float>>();
    Tensor* logits = in.custom(DType::f32, ne, [=](Rng& rng, const Shape&, std::vector<float>& v) {
      sample_logits(rng, n_vocab, rows, v);
      *seen = v;
    });
    Tensor* params =
        in.words({kSampleParamWords, n_rows, 1, 1}, [=](Rng& rng, const Shape&, std::vector<int32_t>& w) {
          sample_params(rng, n_vocab, n_cand, rows, *seen, w);
        });
    return sample_tokens(g, logits, top_k(g, logits, n_cand), params);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    RefTensor out({n_rows, 1, 1, 1});
    for (int64_t r = 0; r < n_rows; ++r)
      out(r) = sample_ref(&in[0].v[static_cast<size_t>(r * n_vocab)], n_vocab, n_cand, decode_words(in[1], r))
                   .token;
    return out;
  };
  cases.push_back(
      {"sample_tokens",
       fmt::format("{} K={} {}", shape_string(ne), n_cand, what.empty() ? sample_row_desc(rows[0]) : what),
       0.0, build, ref, 0.0});
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
    // a decode step's sampling at llama.cpp's defaults: top_k then sample_tokens, one row and 64
    const SampleRowSpec defaults{40, 0.8f, 0.95f, 0.05f, 0, RowLogits::plain, -1.0};
    add_sample_tokens(cases, 128256, 40, {defaults});
    add_sample_tokens(cases, 128256, 40, std::vector<SampleRowSpec>(64, defaults),
                      "64 rows: " + sample_row_desc(defaults));
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
  add_top_k(cases, {32000, 40, 1, 1}, 40, false);  // many rows: fewer, longer chunks
  add_top_k(cases, {6, 2, 2, 1}, 6, false);  // a full sort
  // k = 1 on CUDA's compute capability 9.0 takes a cluster of 8 blocks a row: ties across its blocks'
  // shares (4100 = 8 x 513 - 4), strided rows, rows over two dimensions
  add_top_k(cases, {4100, 3, 1, 1}, 1, false, true);
  add_top_k(cases, {9000, 3, 1, 1}, 1, true);
  add_top_k(cases, {5000, 2, 2, 1}, 1, false);
  add_top_k(cases, {4100, 2, 1, 1}, 1, false, false, true);
  add_top_k(cases, {128256, 2, 1, 1}, 1, false, false, true);
  // its float4 reads: a ragged last share (4099 and 8198 not multiples of 4), rows past the first not
  // 16-byte aligned (the element loop instead)
  add_top_k(cases, {4099, 3, 1, 1}, 1, false, true);
  add_top_k(cases, {8198, 2, 1, 1}, 1, false, false, true);
  add_top_k(cases, {100, 5, 1, 1}, 1, false);
  add_top_k(cases, {31, 12, 1, 1}, 4, true);

  using enum RowLogits;
  // One row each. SampleRowSpec: top_k, temperature, top_p, min_p, min_keep, logits, uniform.
  add_sample_tokens(cases, 32000, 40, {{40, 0.0f, 1.0f, 0.0f, 0, plain, -1.0}});
  add_sample_tokens(cases, 32000, 1, {{1, 1.0f, 1.0f, 0.0f, 0, plain, -1.0}});
  add_sample_tokens(cases, 32000, 40, {{5, 2.5f, 1.0f, 0.0f, 0, plain, -1.0}});
  add_sample_tokens(cases, 32000, 40, {{40, 0.8f, 0.5f, 0.0f, 0, plain, -1.0}});
  add_sample_tokens(cases, 32000, 40, {{40, 1.0f, 1.0f, 0.2f, 3, plain, -1.0}});
  add_sample_tokens(cases, 32000, 40, {{40, 1.0f, 1e-4f, 0.0f, 4, plain, -1.0}});
  add_sample_tokens(cases, 128256, 40, {{40, 0.8f, 0.95f, 0.05f, 0, plain, -1.0}});
  add_sample_tokens(cases, 128256, 1000, {{1000, 3.0f, 1.0f, 0.0f, 0, plain, -1.0}});
  // Rows of different settings in one tensor.
  add_sample_tokens(cases, 32000, 64,
                    {
                        {40, 0.0f, 1.0f, 0.0f, 0, plain, -1.0},       // greedy
                        {40, -1.0f, 1.0f, 0.0f, 0, plain, -1.0},      // greedy
                        {1, 1.0f, 1.0f, 0.0f, 0, plain, -1.0},        // k = 1
                        {5, 2.5f, 1.0f, 0.0f, 0, plain, -1.0},        // a flat top 5
                        {40, 0.8f, 0.5f, 0.0f, 0, plain, -1.0},       // top-p
                        {40, 1.0f, 1.0f, 0.2f, 3, plain, -1.0},       // min-p
                        {40, 1.0f, 1.0f, 0.95f, 3, plain, -1.0},      // min-p below min_keep
                        {64, 0.7f, 1e-4f, 0.0f, 4, plain, -1.0},      // top-p keeps min_keep
                        {64, 1.3f, 1e-4f, 0.0f, 0, plain, -1.0},      // ... and at least one
                        {40, 0.8f, 0.95f, 0.05f, 0, plain, -1.0},     // llama.cpp's defaults
                        {64, 1.0f, 1.0f, 0.0f, 0, masked, -1.0},      // -inf logits, finite candidates
                        {40, 1.5f, 0.9f, 0.0f, 0, few_finite, -1.0},  // -inf candidates
                        {40, 1.0f, 1.0f, 0.0f, 0, all_masked, -1.0},  // -1
                        {40, 1.0f, 0.9f, 0.1f, 0, nan, -1.0},         // -1
                        {40, 0.0f, 1.0f, 0.0f, 0, pos_inf, -1.0},     // -1, greedy or not
                        {64, 1.0f, 0.8f, 0.1f, 2, plain, 0.0},        // u = 0: the best
                    },
                    "16 rows: greedy, k 1/5/40/64, top-p, min-p, min_keep, -inf, NaN, +inf, u=0");
  // The largest uniform picks the last token kept, which shows exactly where each filter cut.
  const double below_one = std::nextafter(1.0, 0.0);
  add_sample_tokens(cases, 32000, 64,
                    {
                        {5, 2.5f, 1.0f, 0.0f, 0, plain, below_one},
                        {40, 0.8f, 0.5f, 0.0f, 0, plain, below_one},
                        {64, 1.0f, 0.9f, 0.0f, 0, plain, below_one},
                        {40, 1.0f, 1.0f, 0.2f, 3, plain, below_one},
                        {40, 1.0f, 1.0f, 0.95f, 3, plain, below_one},
                        {64, 0.7f, 1e-4f, 0.0f, 4, plain, below_one},
                        {40, 0.8f, 0.95f, 0.05f, 0, plain, below_one},
                        {40, 1.5f, 0.9f, 0.0f, 0, few_finite, below_one},
                        {64, 1.0f, 0.7f, 0.1f, 0, masked, below_one},
                    },
                    "9 rows at u=1-2^-53: the last token kept by top-k, top-p, min-p, min_keep, -inf");
  add_sample_tokens(cases, 128256, 1000,
                    {
                        {1000, 3.0f, 1.0f, 0.0f, 0, plain, -1.0},
                        {40, 0.8f, 0.95f, 0.05f, 0, plain, below_one},  // the last kept token
                        {40, 0.0f, 1.0f, 0.0f, 0, masked, -1.0},        // greedy past -inf
                        {200, 1.2f, 0.9f, 0.02f, 5, plain, -1.0},
                    },
                    "4 rows: k 1000 t 3, u=1-2^-53, greedy masked, k 200 top-p min-p");
  // A short row (CUDA's top_k by ranking): candidates are the whole row.
  add_sample_tokens(cases, 100, 100,
                    {
                        {100, 1.0f, 1.0f, 0.0f, 0, plain, -1.0},
                        {100, 0.5f, 0.7f, 0.0f, 0, plain, -1.0},
                        {30, 2.0f, 1.0f, 0.3f, 2, few_finite, -1.0},
                        {100, 1.0f, 1.0f, 0.0f, 0, masked, -1.0},
                        {10, 1.0f, 1.0f, 0.0f, 0, nan, -1.0},
                    },
                    "5 rows: all, top-p, min-p over 7 finite, -inf, NaN");
}

}  // namespace loom::optest
