// The sampler chain: llama.cpp's default order over Loom's building blocks.
#include <cmath>
#include <limits>
#include <random>

#include "loom/sample.h"

namespace loom {

namespace {

Status bad_param(const char* name, double v, const char* want) {
  return make_error(StatusCode::invalid_argument, "sampler: {} = {} is invalid: {}", name, v, want);
}

}  // namespace

Result<Sampler> Sampler::create(const SamplerParams& params) {
  const PenaltyParams& pen = params.penalties;
  if (pen.last_n < -1)
    return bad_param("penalty last_n", pen.last_n, "expected -1 (whole history), 0 (off) or more");
  if (!std::isfinite(pen.repeat) || pen.repeat <= 0.0f)
    return bad_param("repeat penalty", pen.repeat, "expected a finite value > 0 (1 = off)");
  if (!std::isfinite(pen.frequency))
    return bad_param("frequency penalty", pen.frequency, "expected a finite value");
  if (!std::isfinite(pen.presence))
    return bad_param("presence penalty", pen.presence, "expected a finite value");
  if (std::isnan(params.top_p)) return bad_param("top_p", params.top_p, "expected a number (>= 1 = off)");
  if (std::isnan(params.min_p)) return bad_param("min_p", params.min_p, "expected a number (<= 0 = off)");
  if (!std::isfinite(params.temperature))
    return bad_param("temperature", params.temperature, "expected a finite value (<= 0 = greedy)");
  uint32_t seed = params.seed;
  if (seed == kRandomSeed) seed = std::random_device{}();
  return Sampler(params, seed);
}

Result<int32_t> Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return make_error(StatusCode::invalid_argument, "sampler: {} logits do not fit 32-bit token ids",
                      logits.size());
  LOOM_TRY(validate_logits(logits));
  std::span<const float> scores = logits;
  if (params_.penalties.active() && !history.empty()) {
    // Penalties touch at most last_n tokens, but the caller's logits are read-only: one copy of the
    // vocabulary (0.5 MB for 128k tokens) is the price.
    penalized_.assign(logits.begin(), logits.end());
    LOOM_TRY(apply_penalties(penalized_, history, params_.penalties));
    scores = penalized_;
  }
  if (params_.temperature <= 0.0f) {
    // Greedy: every filter keeps the best token, so skip them.
    const int32_t id = sample_greedy(scores);
    if (id < 0)
      return make_error(StatusCode::invalid_argument, "sampler: no finite logit is left after penalties");
    return id;
  }
  candidates_top_k(scores, params_.top_k, candidates_);
  if (candidates_.data.empty())
    return make_error(StatusCode::invalid_argument, "sampler: no finite logit is left after penalties");
  // typical-p (llama.cpp's next step) is not implemented: its default, 1.0, turns it off.
  apply_top_p(candidates_, params_.top_p, params_.min_keep);
  apply_min_p(candidates_, params_.min_p, params_.min_keep);
  apply_temperature(candidates_, params_.temperature);
  return sample_distribution(candidates_, rng_);
}

}  // namespace loom
