// Cases: rope (normal, neox, partial rotation, freq_factors, linear scaling, YaRN) and flash_attn.
#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

// ---- rope -------------------------------------------------------------------------------------------

namespace {

// YaRN's correction range: the pair indices whose wavelength spans between beta_fast and
// beta_slow rotations over the training context (Peng et al. 2023, "YaRN", section 3.2).
void yarn_range(const RopeParams& p, double& low, double& high) {
  auto dim_for_rotations = [&](double n_rot) {
    return p.n_dims * std::log(p.n_ctx_orig / (n_rot * 2.0 * M_PI)) /
           (2.0 * std::log(static_cast<double>(p.freq_base)));
  };
  low = dim_for_rotations(p.beta_fast);
  high = dim_for_rotations(p.beta_slow);
  if (!p.yarn_unrounded) {  // GGUF runtimes widen the range to whole dims; HF's truncate: false does not
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(0.0, low);
  high = std::min(static_cast<double>(p.n_dims - 1), high);
}

}  // namespace

// a: [head_dim, n_head, n_tokens]; pos: [n_tokens]; ff: [n_dims/2] or empty.
RefTensor rope_ref(const RefTensor& a, const RefTensor& pos, const RefTensor* ff, const RopeParams& p) {
  RefTensor out = a;
  const int64_t half = p.n_dims / 2;
  double low = 0.0, high = 0.0;
  if (p.ext_factor != 0.0f) yarn_range(p, low, high);
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t t = 0; t < a.ne[2]; ++t)
      for (int64_t h = 0; h < a.ne[1]; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double extrapolated = pos(t) *
                                      std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims) /
                                      (ff ? (*ff)(i) : 1.0);
          const double interpolated = p.freq_scale * extrapolated;
          double theta = interpolated, mag = p.attn_factor;
          if (p.ext_factor != 0.0f) {
            // ramp 1 below `low` (extrapolate: high frequencies), 0 above `high` (interpolate)
            const double y = (i - low) / std::max(0.001, high - low);
            const double ramp = (1.0 - std::clamp(y, 0.0, 1.0)) * p.ext_factor;
            theta = interpolated * (1.0 - ramp) + extrapolated * ramp;
            mag *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);  // YaRN's attention temperature
          }
          const double c = std::cos(theta) * mag, s = std::sin(theta) * mag;
          const int64_t j0 = p.mode == RopeMode::neox ? i : 2 * i;
          const int64_t j1 = p.mode == RopeMode::neox ? i + half : 2 * i + 1;
          const double x0 = a(j0, h, t, i3), x1 = a(j1, h, t, i3);
          out(j0, h, t, i3) = x0 * c - x1 * s;
          out(j1, h, t, i3) = x0 * s + x1 * c;
        }
  return out;
}

RopeParams rope_params(RopeMode mode, int32_t n_dims, float base, float freq_scale, float ext, float attn) {
  return {n_dims, mode, 4096, base, freq_scale, ext, attn, 32.0f, 1.0f, 0};
}

namespace {

// Positions up to 1024, as kNmseRope (op_test.h) assumes.
constexpr int64_t kMaxPos = 1024;

struct RopeCase {
  int64_t head_dim, n_head, n_tokens;
  RopeParams p;
  bool freq_factors = false;
  bool fused_qkv = false;  // the input is the query part of a fused QKV row (a view)
  bool in_place = false;   // the input is an activation the op may overwrite
};

// K and V heads after the Q heads in the fused layout.
constexpr int64_t kFusedKvHeads = 2;

void add_rope(CaseList& cases, const RopeCase& c, bool perf) {
  auto build = [c](Graph& g, CaseInputs& in) -> Tensor* {
    const Shape ne{c.head_dim, c.n_head, c.n_tokens, 1};
    Tensor* a;
    if (c.fused_qkv) {
      const int64_t row = c.head_dim * (c.n_head + 2 * kFusedKvHeads);
      Tensor* qkv = in.uniform(DType::f32, {row, c.n_tokens, 1, 1});
      a = strided_view(g, qkv, ne, {1, c.head_dim, row, row * c.n_tokens}, 0);
    } else {
      a = in.uniform(DType::f32, ne);
    }
    if (c.in_place) a = as_activation(g, a);
    Tensor* pos = in.indices({c.n_tokens, 1, 1, 1}, kMaxPos, false);
    Tensor* ff = c.freq_factors ? in.uniform(DType::f32, {c.p.n_dims / 2, 1, 1, 1}, 1.0f, 8.0f) : nullptr;
    return rope(g, a, pos, ff, c.p);
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [c](const std::vector<RefTensor>& in) {
      const Shape ne{c.head_dim, c.n_head, c.n_tokens, 1};
      const RefTensor a = c.fused_qkv
                              ? ref_view(in[0], ne, {1, c.head_dim, in[0].ne[0], in[0].ne[0] * c.n_tokens}, 0)
                              : in[0];
      return rope_ref(a, in[1], c.freq_factors ? &in[2] : nullptr, c.p);
    };
  }
  const RopeParams& p = c.p;
  std::string desc =
      fmt::format("{} {} n_dims={} base={:g}", shape_string({c.head_dim, c.n_head, c.n_tokens, 1}),
                  p.mode == RopeMode::neox ? "neox" : "normal", p.n_dims, p.freq_base);
  if (p.freq_scale != 1.0f) desc += fmt::format(" freq_scale={:g}", p.freq_scale);
  if (p.ext_factor != 0.0f) desc += fmt::format(" yarn ext={:g} attn={:g}", p.ext_factor, p.attn_factor);
  if (p.yarn_unrounded) desc += " unrounded";
  if (c.freq_factors) desc += " freq_factors";
  if (c.fused_qkv) desc += " (view of fused qkv)";
  if (c.in_place) desc += " in place";
  cases.push_back({"rope", desc, kNmseRope, build, ref, 0.0});
}

// ---- flash_attn ---------------------------------------------------------------------------------------

// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding): fields follow the order of the case table
struct FlashCase {
  int64_t d, dv, n_q, n_kv, n_head, n_head_kv, ne3;
  DType kt, vt;
  bool has_mask;
  DType mask_type;
  int64_t mask_rows;  // >= n_q (padded as KV-cache masks are)
  bool causal;
  float softcap;
  bool cache_view;          // K and V are the first n_kv positions of a longer cache
  bool q_permuted = false;  // q is a permuted view of [d, n_head, n_q], as the models build it
  int64_t window = 0;       // > 0: a sliding-window causal mask, each query sees its last `window` keys
  bool pure_causal = false;  // no random -inf entries: a model's prompt mask (zeros and the causal -inf)
  bool sinks = false;        // a per-head sink logit joins every softmax denominator (gpt-oss)
  int64_t nan_pad = 0;       // > 0: the last nan_pad keys are masked for every query and their K/V hold
                             // NaN (unwritten cache cells past the sequence, as a bucketed extent shows)
  bool mask_per_seq = false;  // a mask of its own for each of the ne3 sequences (a packed pass's prompts)
  int64_t nan_key = -1;       // >= 0: that key's K row is NaN (its V finite) and it is visible: its score
                              // weighs 0, as every kernel and the CPU give a NaN score
  int64_t sink_keys = 0;      // with a window: the first sink_keys keys visible too (StreamingLLM's sink
                              // tokens), so whole key tiles between them and the window are hidden
};

constexpr int64_t kCacheExtra = 24;

/// Element strides of q [d, n_q, n_head, ne3] viewed from storage [d, n_head, n_q, ne3].
ElemStrides q_view_strides(const FlashCase& c) { return {1, c.d * c.n_head, c.d, c.d * c.n_head * c.n_q}; }

/// (query, key) pairs the causal part of the mask leaves visible: query i sees keys up to
/// i + n_kv - n_q, the last `window` of them with a window (the random -inf entries are not
/// subtracted; a kernel still meets them).
double visible_pairs(const FlashCase& c) {
  if (!c.has_mask || !c.causal) return static_cast<double>(c.n_q) * c.n_kv;
  double pairs = 0.0;
  for (int64_t i = 0; i < c.n_q; ++i) {
    int64_t keys = std::clamp<int64_t>(i + 1 + c.n_kv - c.n_q, 0, c.n_kv);
    if (c.window > 0) keys = std::min(keys, c.window) + std::min(c.sink_keys, std::max<int64_t>(0, keys - c.window));
    pairs += static_cast<double>(keys);
  }
  return pairs;
}

void add_flash_attn(CaseList& cases, const FlashCase& c, bool perf) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  auto build = [c, scale](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* q;
    if (c.q_permuted) {
      Tensor* qs = in.uniform(DType::f32, {c.d, c.n_head, c.n_q, c.ne3});
      q = strided_view(g, qs, {c.d, c.n_q, c.n_head, c.ne3}, q_view_strides(c), 0);
    } else {
      q = in.uniform(DType::f32, {c.d, c.n_q, c.n_head, c.ne3});
    }
    Tensor *k, *v;
    if (c.cache_view) {
      const int64_t n_ctx = c.n_kv + kCacheExtra;
      Tensor* kc = in.uniform(c.kt, {c.d, n_ctx, c.n_head_kv, c.ne3});
      Tensor* vc = in.uniform(c.vt, {c.dv, n_ctx, c.n_head_kv, c.ne3});
      k = strided_view(g, kc, {c.d, c.n_kv, c.n_head_kv, c.ne3}, packed_strides(kc->ne), 0);
      v = strided_view(g, vc, {c.dv, c.n_kv, c.n_head_kv, c.ne3}, packed_strides(vc->ne), 0);
    } else if (c.nan_pad > 0) {
      auto nan_tail = [c](Rng& rng, const Shape& s, std::vector<float>& v) {
        for (size_t i = 0; i < v.size(); ++i) {
          const auto j = static_cast<int64_t>(i / static_cast<size_t>(s[0])) % s[1];  // the key
          v[i] = j >= c.n_kv - c.nan_pad ? NAN : rng.uniform(-1.0f, 1.0f);
        }
      };
      k = in.custom(c.kt, {c.d, c.n_kv, c.n_head_kv, c.ne3}, nan_tail);
      v = in.custom(c.vt, {c.dv, c.n_kv, c.n_head_kv, c.ne3}, nan_tail);
    } else if (c.nan_key >= 0) {
      k = in.custom(c.kt, {c.d, c.n_kv, c.n_head_kv, c.ne3}, [c](Rng& rng, const Shape& s, std::vector<float>& v) {
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = static_cast<int64_t>(i / static_cast<size_t>(s[0])) % s[1] == c.nan_key ? NAN : rng.uniform(-1.0f, 1.0f);
      });
      v = in.uniform(c.vt, {c.dv, c.n_kv, c.n_head_kv, c.ne3});
    } else {
      k = in.uniform(c.kt, {c.d, c.n_kv, c.n_head_kv, c.ne3});
      v = in.uniform(c.vt, {c.dv, c.n_kv, c.n_head_kv, c.ne3});
    }
    Tensor* mask = nullptr;
    if (c.has_mask && c.nan_pad > 0)
      mask = in.custom(c.mask_type, {c.n_kv, c.mask_rows, 1, 1}, [c](Rng& rng, const Shape& s, std::vector<float>& v) {
        for (int64_t r = 0; r < s[1]; ++r)
          for (int64_t j = 0; j < s[0]; ++j)
            v[static_cast<size_t>(r * s[0] + j)] = j < c.n_kv - c.nan_pad ? rng.uniform(-1.0f, 0.0f) : -INFINITY;
      });
    else if (c.has_mask && c.window > 0)
      mask = in.custom(
          c.mask_type, {c.n_kv, c.mask_rows, 1, 1}, [c](Rng& rng, const Shape& s, std::vector<float>& v) {
            for (int64_t r = 0; r < s[1]; ++r)
              for (int64_t j = 0; j < s[0]; ++j) {
                const int64_t last = r + c.n_kv - c.n_q;  // the query's own position
                const bool visible = j <= last && (j > last - c.window || j < c.sink_keys);
                v[static_cast<size_t>(r * s[0] + j)] = visible ? rng.uniform(-1.0f, 0.0f) : -INFINITY;
              }
          });
    else if (c.has_mask && c.pure_causal)
      mask = in.custom(c.mask_type, {c.n_kv, c.mask_rows, 1, 1}, [c](Rng&, const Shape& s, std::vector<float>& v) {
        for (int64_t r = 0; r < s[1]; ++r)
          for (int64_t j = 0; j < s[0]; ++j)
            v[static_cast<size_t>(r * s[0] + j)] = j <= r + c.n_kv - c.n_q ? 0.0f : -INFINITY;
      });
    else if (c.has_mask)
      mask = in.mask(c.mask_type, {c.n_kv, c.mask_rows, 1, c.mask_per_seq ? c.ne3 : 1}, 0.1, c.causal, c.n_q);
    // sinks around the scores' range (|q k| * scale <~ 1 here, mask entries in [-1, 0]): they take
    // a visible share of each row's weight, up to most of it
    Tensor* sinks = c.sinks ? in.uniform(DType::f32, {c.n_head, 1, 1, 1}, -1.0f, 3.0f) : nullptr;
    return flash_attn(g, q, k, v, mask, scale, c.softcap, sinks);
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [c, scale](const std::vector<RefTensor>& in) {
      const RefTensor q =
          c.q_permuted ? ref_view(in[0], {c.d, c.n_q, c.n_head, c.ne3}, q_view_strides(c), 0) : in[0];
      RefTensor k = in[1], v = in[2];
      if (c.cache_view) {
        k = ref_view(in[1], {c.d, c.n_kv, c.n_head_kv, c.ne3}, packed_strides(in[1].ne), 0);
        v = ref_view(in[2], {c.dv, c.n_kv, c.n_head_kv, c.ne3}, packed_strides(in[2].ne), 0);
      }
      const RefTensor* mask = c.has_mask ? &in[3] : nullptr;
      const RefTensor* sinks = c.sinks ? &in[c.has_mask ? 4 : 3] : nullptr;
      const int64_t group = c.n_head / c.n_head_kv;
      RefTensor out({c.dv, c.n_head, c.n_q, c.ne3});
      std::vector<double> w(static_cast<size_t>(c.n_kv));
      for (int64_t i3 = 0; i3 < c.ne3; ++i3)
        for (int64_t h = 0; h < c.n_head; ++h)
          for (int64_t iq = 0; iq < c.n_q; ++iq) {
            const int64_t hk = h / group;
            double mx = -INFINITY;
            for (int64_t j = 0; j < c.n_kv; ++j) {
              const int64_t m3 = mask && mask->ne[3] > 1 ? i3 : 0;
              if (mask && (*mask)(j, iq, 0, m3) == -INFINITY) {  // hidden: whatever its K/V hold
                w[j] = -INFINITY;
                continue;
              }
              double s = 0.0;
              for (int64_t t = 0; t < c.d; ++t) s += q(t, iq, h, i3) * k(t, j, hk, i3);
              s *= scale;
              if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
              if (mask) s += (*mask)(j, iq, 0, m3);
              if (std::isnan(s)) {  // a NaN score (NaN in K) weighs 0
                w[j] = -INFINITY;
                continue;
              }
              w[j] = s;
              mx = std::max(mx, s);
            }
            double sum = 0.0;
            for (double& x : w) sum += (x = std::exp(x - mx));
            if (sinks) sum += std::exp((*sinks)(h)-mx);  // a key without a value
            for (int64_t t = 0; t < c.dv; ++t) {
              double acc = 0.0;
              for (int64_t j = 0; j < c.n_kv; ++j)
                if (w[j] != 0.0) acc += w[j] * v(t, j, hk, i3);
              out(t, h, iq, i3) = acc / sum;
            }
          }
      return out;
    };
  }
  std::string desc = fmt::format("d={}{} n_q={} n_kv={} heads={}/{} K={} V={}", c.d,
                                 c.dv != c.d ? fmt::format(" dv={}", c.dv) : "", c.n_q, c.n_kv, c.n_head,
                                 c.n_head_kv, dtype_name(c.kt), dtype_name(c.vt));
  if (c.ne3 > 1) desc += fmt::format(" ne3={}", c.ne3);
  if (c.has_mask)
    desc += fmt::format(" mask={}[{}]{}", dtype_name(c.mask_type), c.mask_rows, c.causal ? " causal" : "");
  if (c.window > 0) desc += fmt::format(" window={}", c.window);
  if (c.sink_keys > 0) desc += fmt::format(" +{} sink keys", c.sink_keys);
  if (c.pure_causal) desc += " (zeros and -inf)";
  if (c.softcap > 0.0f) desc += fmt::format(" softcap={:g}", c.softcap);
  if (c.cache_view) desc += " (cache view)";
  if (c.q_permuted) desc += " (permuted q)";
  if (c.sinks) desc += " sinks";
  if (c.nan_pad > 0) desc += fmt::format(" (last {} keys masked, NaN K/V)", c.nan_pad);
  if (c.nan_key >= 0) desc += fmt::format(" (NaN K at visible key {})", c.nan_key);
  if (c.mask_per_seq) desc += " (a mask per sequence)";
  // 2 (d + dv) per visible (query, key, head): Q K^T and P V
  const double flops = 2.0 * visible_pairs(c) * (c.d + c.dv) * c.n_head * c.ne3;
  cases.push_back({"flash_attn", desc, kNmseFlashAttn, build, ref, flops});
}

}  // namespace

void add_attention_cases(CaseList& cases, CaseSet set) {
  if (set == CaseSet::perf) {
    add_rope(cases, {128, 32, 512, rope_params(RopeMode::neox, 128, 500000.0f)}, true);
    add_rope(cases, {128, 32, 1, rope_params(RopeMode::normal, 128, 10000.0f)}, true);
    for (int64_t n_q : {1, 512}) {
      add_flash_attn(
          cases,
          {128, 128, n_q, 4096, 32, 8, 1, DType::f16, DType::f16, true, DType::f16, n_q, true, 0.0f, false},
          true);
    }
    // causal prefill of a whole prompt (the tensor-core kernel's case), q a permuted view as in the models,
    // with random entries in the visible part of the mask (every tile read) and with a model's mask (zeros
    // and the causal -inf: the tiles below the diagonal read none; issue 13's 400 TFLOP/s figure)
    for (int64_t n : {512, 2048, 4096, 16384}) {
      for (const bool pure : {false, true})
        add_flash_attn(cases,
                       {128, 128, n, n, 32, 8, 1, DType::f16, DType::f16, true, DType::f16, n, true, 0.0f, false,
                        true, 0, pure},
                       true);
    }
    // gemma2-27b's prompt attention (head 128, 32 / 16 heads, logit softcap 50), the softcap's route
    add_flash_attn(cases,
                   {128, 128, 4096, 4096, 32, 16, 1, DType::f16, DType::f16, true, DType::f16, 4096, true, 50.0f,
                    false, true, 0, true},
                   true);
    // as the models build a prompt chunk: an f32 mask of zeros and the causal -inf, the chunk's 512
    // queries after 512 and after 3,584 cached keys, and a 2,048-token pass after 2,048 (pp4096's second)
    for (const auto& [n_q, n_kv] : {std::pair<int64_t, int64_t>{512, 1024}, {512, 4096}, {2048, 4096}}) {
      add_flash_attn(cases,
                     {128, 128, n_q, n_kv, 32, 8, 1, DType::f16, DType::f16, true, DType::f32, n_q, true, 0.0f,
                      false, true, 0, true},
                     true);
    }
    return;
  }

  using M = RopeMode;
  const RopeCase rope_cases[] = {
      {64, 4, 5, rope_params(M::normal, 64, 10000.0f)},
      {128, 8, 1, rope_params(M::neox, 128, 500000.0f)},
      {80, 3, 7, rope_params(M::normal, 32, 10000.0f)},  // partial rotation
      {96, 2, 9, rope_params(M::neox, 64, 10000.0f)},
      {64, 4, 6, rope_params(M::neox, 64, 500000.0f), true},  // llama-3 style freq_factors
      {64, 3, 4, rope_params(M::normal, 64, 10000.0f), true},
      {32, 2, 5, rope_params(M::normal, 32, 10000.0f, 0.25f)},              // linear scaling
      {128, 2, 6, rope_params(M::neox, 128, 10000.0f, 0.25f, 1.0f, 1.0f)},  // YaRN
      {64, 3, 4, rope_params(M::normal, 48, 10000.0f, 0.5f, 0.5f, 0.8f), true},
      {64, 4, 3, rope_params(M::neox, 64, 10000.0f), false, true},
      {64, 2, 33, rope_params(M::normal, 64, 10000.0f)},
      {2, 1, 3, rope_params(M::neox, 2, 10000.0f)},
      {64, 4, 5, rope_params(M::normal, 64, 10000.0f), false, false, true},
      {128, 2, 3, rope_params(M::neox, 96, 10000.0f, 0.25f, 1.0f, 1.0f), true, false, true},
  };
  for (const RopeCase& c : rope_cases) add_rope(cases, c, false);
  // gpt-oss's YaRN: factor 32, base 150000, the correction range not rounded to whole dims
  // (corr dims 8.09 and 17.4 for 64 rotated dims: rounding would move the ramp visibly)
  RopeParams oss = rope_params(M::neox, 64, 150000.0f, 1.0f / 32.0f, 1.0f, 1.0f);
  oss.yarn_unrounded = 1;
  add_rope(cases, {64, 4, 5, oss}, false);
  add_rope(cases, {64, 8, 1, oss, false, false, true}, false);

  const DType f16 = DType::f16, f32 = DType::f32;
  const FlashCase flash_cases[] = {
      {64, 64, 1, 17, 4, 4, 1, f16, f16, true, f16, 1, true, 0.0f, false},     // decode
      {128, 128, 7, 113, 8, 2, 1, f16, f16, true, f16, 8, true, 0.0f, false},  // GQA 4, padded mask
      {80, 80, 5, 64, 2, 1, 1, f32, f32, true, f32, 5, false, 0.0f, false},    // odd head size, f32
      {64, 64, 32, 32, 2, 2, 1, f16, f16, false, f16, 0, false, 3.0f, false},  // softcap, no mask
      {256, 256, 1, 300, 2, 1, 1, f16, f16, true, f16, 1, false, 0.0f, false},
      {40, 40, 3, 1, 2, 2, 1, f32, f32, false, f32, 0, false, 0.0f, false},   // a single key
      {96, 64, 4, 50, 4, 2, 1, f16, f16, true, f32, 4, true, 0.0f, false},    // dv != d
      {64, 64, 3, 40, 4, 2, 1, f16, f32, true, f16, 3, true, 0.0f, false},    // mixed K/V types
      {64, 64, 2, 40, 4, 2, 1, f16, f16, true, f16, 2, true, 0.0f, true},     // views of a cache
      {80, 80, 2, 27, 2, 1, 2, f32, f16, true, f16, 2, false, 50.0f, false},  // ne3 = 2, softcap
      {64, 64, 64, 64, 4, 2, 1, f16, f16, true, f16, 64, true, 0.0f, false},  // prefill
      {112, 112, 1, 129, 3, 1, 1, f32, f32, true, f32, 1, false, 0.0f, true},
      {128, 128, 8, 1000, 8, 2, 1, f16, f16, true, f16, 8, true, 0.0f, false},  // long context
      {64, 64, 1, 2048, 4, 1, 1, f16, f16, true, f16, 1, false, 0.0f, false},
      // packed prompts: several sequences' queries, each sequence with its own causal mask; tensor-core
      // shapes (n_q >= 16) and decode-kernel ones
      {128, 128, 24, 64, 8, 2, 4, f16, f16, true, f16, 24, true, 0.0f, false, false, 0, false, false, 0, true},
      {64, 64, 64, 96, 8, 2, 3, f16, f16, true, f32, 64, true, 0.0f, false, false, 0, false, false, 0, true},
      {128, 128, 6, 64, 8, 2, 4, f16, f16, true, f16, 6, true, 0.0f, false, false, 0, false, false, 0, true},
      // a visible key with NaN K: the tensor-core kernel's plain tiles (64 queries after 128 cached keys,
      // the key in the second, all-visible tile) and flash-decoding
      {128, 128, 64, 192, 8, 2, 1, f16, f16, true, f16, 64, true, 0.0f, false, false, 0, true, false, 0, false, 70},
      {128, 128, 1, 300, 8, 2, 1, f16, f16, true, f16, 1, false, 0.0f, false, false, 0, false, false, 0, false, 100},
      // decode over a bucketed extent: the cells past the sequence masked, their K/V NaN
      {128, 128, 1, 256, 32, 8, 1, f16, f16, true, f16, 1, false, 0.0f, false, false, 0, false, false, 100},
      {64, 64, 1, 2048, 8, 2, 1, f16, f16, true, f16, 1, false, 0.0f, false, false, 0, false, false, 300},
      {128, 128, 3, 512, 8, 2, 1, f16, f16, true, f32, 3, false, 0.0f, false, false, 0, false, true, 37},
      // Prefill shapes of the tensor-core kernel (attention_mma.cu: d in {64, 128, 256}, f16 K/V,
      // 64-query tiles, 64- or 32-key tiles): partial query and key tiles, prompts appended to a
      // cache (n_kv > n_q), GQA 8/2, f16 and f32 masks, a permuted q as the models build it.
      {64, 64, 16, 64, 8, 2, 1, f16, f16, true, f16, 16, true, 0.0f, false},
      {64, 64, 33, 300, 8, 2, 1, f16, f16, true, f16, 33, true, 30.0f, false},         // softcap
      {64, 64, 128, 100, 8, 2, 1, f16, f16, false, f16, 0, false, 0.0f, false, true},  // no mask
      {128, 128, 33, 100, 8, 2, 1, f16, f16, true, f32, 40, true, 0.0f, false},
      {128, 128, 128, 128, 8, 2, 1, f16, f16, true, f16, 128, true, 0.0f, false, true},
      {128, 128, 128, 300, 8, 2, 1, f16, f16, true, f16, 128, false, 0.0f, false},  // not causal
      {128, 128, 16, 300, 8, 2, 2, f16, f16, true, f16, 16, true, 0.0f, true},      // ne3 = 2, cache view
      {256, 256, 16, 100, 8, 2, 1, f16, f16, true, f32, 16, true, 0.0f, false},
      {256, 256, 128, 300, 8, 2, 1, f16, f16, true, f16, 128, true, 0.0f, false, true},
      {256, 256, 33, 64, 8, 2, 1, f16, f16, true, f16, 33, true, 50.0f, true},  // softcap, cache view
      {128, 128, 64, 200, 16, 8, 1, f16, f16, true, f16, 64, true, 50.0f, false},  // softcap 50 at d 128 (gemma2-27b)
      // sliding window: the first keys are hidden from the later queries
      {128, 128, 128, 200, 8, 2, 1, f16, f16, true, f16, 128, true, 0.0f, false, false, 40},
      // a window after 32 visible sink keys: whole key tiles between the two hidden for every query of a
      // block (the mma.sync kernel skips them, the wgmma one computes them with no key visible)
      {128, 128, 150, 600, 8, 2, 1, f16, f16, true, f16, 150, true, 0.0f, false, false, 100, false, false, 0, false,
       -1, 32},
      {64, 64, 150, 600, 8, 2, 1, f16, f16, true, f32, 160, true, 0.0f, false, true, 100, false, false, 0, false, -1,
       32},
      // a model's prompt-chunk mask, zeros and the causal -inf (f32, padded rows): key tiles the fast
      // kernel classes as all-zero (no mask reads), all-hidden (skipped) and mixed (the diagonal)
      {128, 128, 150, 333, 8, 2, 1, f16, f16, true, f32, 160, true, 0.0f, false, true, 0, true},
      {64, 64, 70, 70, 4, 4, 1, f16, f16, true, f16, 70, true, 0.0f, false, false, 0, true},
      {256, 256, 40, 100, 4, 1, 1, f16, f16, true, f32, 48, true, 0.0f, false, true, 0, true},
      // gpt-oss's attention sinks (head 64, GQA 8, a window of 128 on half the layers) on every
      // path: the exact kernel (f32 K/V), fast decode with one split and with several (the merge),
      // the tensor-core prefill with and without a mask, a sliding window, no mask at all
      {64, 64, 3, 40, 8, 1, 1, f32, f32, true, f32, 3, true, 0.0f, false, false, 0, false, true},
      {64, 64, 1, 50, 8, 1, 1, f16, f16, true, f16, 1, true, 0.0f, false, false, 0, false, true},
      {64, 64, 2, 2048, 16, 2, 1, f16, f16, true, f32, 2, true, 0.0f, true, true, 0, false, true},
      {64, 64, 1, 700, 8, 1, 2, f16, f16, true, f16, 1, false, 0.0f, false, false, 0, false, true},
      {64, 64, 70, 300, 8, 1, 1, f16, f16, true, f32, 80, true, 0.0f, false, true, 0, true, true},
      {64, 64, 128, 200, 8, 2, 1, f16, f16, true, f16, 128, true, 0.0f, false, false, 128, false, true},
      {64, 64, 40, 40, 4, 2, 1, f16, f16, false, f16, 0, false, 0.0f, false, true, 0, false, true},
      {128, 128, 17, 90, 4, 2, 1, f16, f16, true, f16, 17, true, 20.0f, true, false, 0, false, true},
  };
  for (const FlashCase& c : flash_cases) add_flash_attn(cases, c, false);
}

}  // namespace loom::optest
