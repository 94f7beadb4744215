// Rotary position embedding (RoPE) with linear scaling and YaRN (Peng et al. 2023,
// arXiv:2309.00071, "NTK-by-parts" interpolation plus attention temperature).
//
// Pair i of a head rotates by theta_i = pos * freq_base^(-2i/n_dims) / freq_factor_i. Linear
// scaling interpolates: theta_interp = freq_scale * theta. YaRN keeps the high-frequency pairs
// (those that turn many times over the training context) extrapolated and interpolates the
// low-frequency ones, with a linear ramp over the pair index between the two correction dims.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "cpu_ops.h"
#include "loom/graph.h"

namespace loom::cpu {

namespace {

/// The (fractional) dimension index at which a pair turns `n_rot` times over `n_ctx_orig` tokens:
/// solving n_ctx_orig / (2 pi base^(2 i / n_dims)) = n_rot for 2i.
double yarn_corr_dim(int n_dims, int n_ctx_orig, double n_rot, double base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

/// Per-call constants shared by every row.
struct RopeTables {
  std::vector<double> inv_freq;  ///< freq_base^(-2i/n_dims) / freq_factor_i, per pair
  std::vector<double> ramp_mix;  ///< YaRN extrapolation weight per pair (0 without YaRN)
  double freq_scale = 1.0;
  double mscale = 1.0;
};

RopeTables make_tables(const RopeParams& p, const float* freq_factors) {
  const int n_pairs = p.n_dims / 2;
  RopeTables t;
  t.inv_freq.resize(n_pairs);
  t.ramp_mix.assign(n_pairs, 0.0);
  t.freq_scale = p.freq_scale;
  t.mscale = p.attn_factor;
  for (int i = 0; i < n_pairs; ++i) {
    double f = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
    if (freq_factors) f /= freq_factors[i];
    t.inv_freq[i] = f;
  }
  if (p.ext_factor != 0.0f) {
    // Correction range in dims, as GGUF runtimes compute it: floor of the fast bound, ceil of
    // the slow one (unless yarn_unrounded), clamped to valid dims. The ramp then runs over the pair
    // index.
    double low = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base);
    double high = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base);
    if (!p.yarn_unrounded) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(0.0, low);
    high = std::min(static_cast<double>(p.n_dims - 1), high);
    for (int i = 0; i < n_pairs; ++i) {
      const double y = (i - low) / std::max(0.001, high - low);
      const double ramp = 1.0 - std::clamp(y, 0.0, 1.0);
      t.ramp_mix[i] = ramp * p.ext_factor;
    }
    // YaRN's attention temperature: sqrt(1/t) = 0.1 ln(s) + 1 with s = 1 / freq_scale.
    t.mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
  }
  return t;
}

/// cos/sin (already multiplied by mscale) of every pair for one position.
void fill_cos_sin(const RopeTables& t, int32_t pos, float* cos_out, float* sin_out) {
  const size_t n_pairs = t.inv_freq.size();
  for (size_t i = 0; i < n_pairs; ++i) {
    const double theta_extrap = pos * t.inv_freq[i];
    const double theta_interp = t.freq_scale * theta_extrap;
    const double mix = t.ramp_mix[i];
    const double theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
    cos_out[i] = static_cast<float>(std::cos(theta) * t.mscale);
    sin_out[i] = static_cast<float>(std::sin(theta) * t.mscale);
  }
}

}  // namespace

void op_rope(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* pos = dst->src[1];
  const Tensor* ff = dst->src[2];
  const RopeParams& p = dst->get_params<RopeParams>();
  const int64_t head_dim = a->ne[0];
  const int n_dims = p.n_dims;
  const int n_pairs = n_dims / 2;
  const auto* positions = static_cast<const int32_t*>(pos->data);

  // The tables are tiny (n_dims/2 entries); each thread builds its own copy rather than sharing
  // through scratch, which would need a barrier and a work_size entry.
  const RopeTables tables = make_tables(p, ff ? static_cast<const float*>(ff->data) : nullptr);
  std::vector<float> cos_sin(2 * static_cast<size_t>(n_pairs));
  float* cos_t = cos_sin.data();
  float* sin_t = cos_sin.data() + n_pairs;
  int64_t cached_token = -1;

  // Rows run head-fastest (ne[1] = heads), so consecutive rows of a thread share a token and the
  // cos/sin table is recomputed only when the token changes.
  for_each_row(ctx, dst, [&](int64_t i1, int64_t i2, int64_t i3) {
    if (i2 != cached_token) {
      fill_cos_sin(tables, positions[i2], cos_t, sin_t);
      cached_token = i2;
    }
    const auto* x = reinterpret_cast<const float*>(at(a, 0, i1, i2, i3));
    auto* y = reinterpret_cast<float*>(at(dst, 0, i1, i2, i3));
    // x and y may be the same memory (in-place): each pair is read fully before it is written.
    if (p.mode == RopeMode::neox) {
      for (int i = 0; i < n_pairs; ++i) {
        const float x0 = x[i], x1 = x[i + n_pairs];
        y[i] = x0 * cos_t[i] - x1 * sin_t[i];
        y[i + n_pairs] = x0 * sin_t[i] + x1 * cos_t[i];
      }
    } else {
      for (int i = 0; i < n_pairs; ++i) {
        const float x0 = x[2 * i], x1 = x[2 * i + 1];
        y[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
        y[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
      }
    }
    if (head_dim > n_dims && x != y)
      std::memcpy(y + n_dims, x + n_dims, static_cast<size_t>(head_dim - n_dims) * sizeof(float));
  });
}

}  // namespace loom::cpu
