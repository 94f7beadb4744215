// Token samplers: turn one position's logits into a token id.
//
// The building blocks (penalties, top-k, top-p, min-p, temperature, softmax, draw) each work on a
// TokenCandidates set and can be used alone; Sampler chains them in llama.cpp's default order:
//
//   penalties -> top-k -> [typical: not implemented] -> top-p -> min-p -> temperature -> draw
//
// with llama.cpp's common defaults (penalty window 64 with every penalty off, top-k 40, top-p 0.95,
// min-p 0.05, temperature 0.8). As in llama.cpp, top-p and min-p see the distribution at
// temperature 1, before the temperature step; temperature <= 0 picks the most likely token.
//
// Logits: NaN and +inf are errors (they have no meaning as a probability and usually mean a broken
// model or kernel); -inf is a masked token that is never drawn. At least one logit must be finite.
// Ties between equal logits are broken toward the lower token id, everywhere, so results never
// depend on the order std::sort leaves equal elements in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "loom/status.h"

namespace loom {

/// One candidate token: its id, its (possibly adjusted) logit, and its probability, which is only
/// meaningful right after softmax_candidates().
struct TokenData {
  int32_t id;
  float logit;
  float p;
};

/// The tokens still in the running for one sampling step.
struct TokenCandidates {
  std::vector<TokenData> data;
  /// True when `data` is in descending logit order (ties: lower id first).
  bool sorted = false;
};

/// Checks that no logit is NaN or +inf and that at least one is finite; the error names the index.
Status validate_logits(std::span<const float> logits);

/// Repetition penalties over the last `last_n` tokens of the history (llama.cpp's definitions):
/// a token seen c > 0 times gets logit / repeat when the logit is positive, logit * repeat when
/// not, then logit - c * frequency - presence.
struct PenaltyParams {
  int32_t last_n = 64;     ///< window; 0 disables penalties, -1 means the whole history
  float repeat = 1.0f;     ///< 1 = off; > 1 discourages repetition
  float frequency = 0.0f;  ///< 0 = off
  float presence = 0.0f;   ///< 0 = off
  bool active() const { return last_n != 0 && (repeat != 1.0f || frequency != 0.0f || presence != 0.0f); }
};
/// Applies `p` to `logits` in place. Tokens in the window must lie in [0, logits.size()).
Status apply_penalties(std::span<float> logits, std::span<const int32_t> history, const PenaltyParams& p);

/// The index of the largest logit (the lowest such index on ties); -1 when every logit is -inf or
/// the span is empty. NaN compares false and is never picked (validate first to reject it).
int32_t sample_greedy(std::span<const float> logits);

/// Every token whose logit is not -inf, in id order (unsorted).
void candidates_from_logits(std::span<const float> logits, TokenCandidates& out);
/// The `k` best tokens straight from the logits, sorted, in one pass (a size-k heap): the cheap
/// path for a large vocabulary. k <= 0 or k >= logits.size(): as candidates_from_logits.
void candidates_top_k(std::span<const float> logits, int32_t k, TokenCandidates& out);

/// Keeps the `k` best candidates, sorted. k <= 0 leaves the set as it is.
void apply_top_k(TokenCandidates& c, int32_t k);
/// Sets every candidate's p to softmax(logit) over the set (sums in double). Order is unchanged.
void softmax_candidates(TokenCandidates& c);
/// Nucleus: keeps the smallest prefix (most likely first) whose probability mass reaches `p`, and
/// at least max(1, min_keep) tokens. p >= 1 leaves the set as it is. Sets up to 1024 tokens end
/// sorted; larger unsorted ones go through a linear-time selection and stay unsorted.
void apply_top_p(TokenCandidates& c, float p, size_t min_keep = 0);
/// Keeps tokens whose probability is at least `p` times the top token's, and at least
/// max(1, min_keep) tokens. p <= 0 leaves the set as it is.
void apply_min_p(TokenCandidates& c, float p, size_t min_keep = 0);
/// Divides logits by `t`; t <= 0 keeps only the best token (greedy).
void apply_temperature(TokenCandidates& c, float t);

/// The sampler's random numbers: std::mt19937 (fully specified by the C++ standard, so a seed gives
/// the same tokens on every platform) turned into doubles in [0, 1) with 53 random bits by Loom's
/// own code, since std::uniform_real_distribution differs between standard libraries.
class SampleRng {
 public:
  explicit SampleRng(uint32_t seed) : seed_(seed), gen_(seed) {}
  uint32_t seed() const { return seed_; }
  /// Uniform in [0, 1), multiples of 2^-53.
  double uniform();

 private:
  uint32_t seed_;
  std::mt19937 gen_;
};

/// Draws a token with probability softmax(logit) over the candidates; -1 when the set is empty.
/// Leaves unnormalized weights exp(logit - max) in each p.
int32_t sample_distribution(TokenCandidates& c, SampleRng& rng);

/// Seed value that asks Sampler for a random seed (llama.cpp's LLAMA_DEFAULT_SEED).
inline constexpr uint32_t kRandomSeed = 0xFFFFFFFFu;

/// The chain's settings; defaults are llama.cpp's common sampling defaults.
struct SamplerParams {
  uint32_t seed = kRandomSeed;  ///< kRandomSeed: drawn from std::random_device
  PenaltyParams penalties;
  int32_t top_k = 40;        ///< <= 0: off
  float top_p = 0.95f;       ///< >= 1: off
  float min_p = 0.05f;       ///< <= 0: off
  float temperature = 0.8f;  ///< <= 0: greedy
  size_t min_keep = 0;       ///< top-p and min-p keep at least max(1, min_keep) tokens
};

/// A sampler chain with its own random state and scratch buffers (reused across calls, so a step
/// allocates nothing once warmed up). Not thread-safe: one per sequence.
class Sampler {
 public:
  /// Validates the parameters (ranges, NaN) and seeds the generator.
  static Result<Sampler> create(const SamplerParams& params);

  /// Picks the next token from one position's logits (n_vocab floats). `history` is the sequence so
  /// far (prompt and generated tokens); only its last penalties.last_n tokens matter.
  Result<int32_t> sample(std::span<const float> logits, std::span<const int32_t> history = {});

  const SamplerParams& params() const { return params_; }
  /// The seed in use (the drawn one when params.seed was kRandomSeed).
  uint32_t seed() const { return rng_.seed(); }
  /// Restarts the random sequence from `seed`.
  void reseed(uint32_t seed) { rng_ = SampleRng(seed); }
  /// The uniform sample() would draw for its next token, for the same chain run elsewhere (the
  /// device: sample_tokens in loom/graph.h); advances the generator as sample() would.
  double draw_uniform() { return rng_.uniform(); }
  /// The random state, to be put back (set_rng) when a drawn token is not taken.
  const SampleRng& rng() const { return rng_; }
  void set_rng(const SampleRng& rng) { rng_ = rng; }
  /// Whether the next token can be sampled outside this class exactly (sample_tokens): greedy, or
  /// top-k in [1, n_vocab) with no active penalty over a non-empty history.
  bool device_samplable(int64_t n_vocab, std::span<const int32_t> history) const {
    if (params_.penalties.active() && !history.empty()) return false;
    return params_.temperature <= 0.0f || (params_.top_k >= 1 && params_.top_k < n_vocab);
  }

 private:
  Sampler(const SamplerParams& params, uint32_t seed) : params_(params), rng_(seed) {}
  SamplerParams params_;
  SampleRng rng_;
  std::vector<float> penalized_;
  TokenCandidates candidates_;
};

}  // namespace loom
