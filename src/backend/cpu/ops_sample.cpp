// sample_tokens: a step's tokens picked from the logits, one row per sequence, by the same chain
// and the same float/double roundings as loom::Sampler (src/sample/sample_ops.cpp), so that a
// sequence sampled here gets the token the host sampler would give it (checked token for token by
// tests/unit/test_llm_batch.cpp). Ties and order come from top_k's candidates: best first, the
// lower id first among equals, as candidates_top_k leaves them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_ops.h"
#include "loom/graph.h"

namespace loom::cpu {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float word_float(const int32_t* w, int i) {
  float f;
  std::memcpy(&f, w + i, sizeof f);
  return f;
}

// One row: the host chain after candidates_top_k, over the row's first top_k candidates.
int32_t sample_row(const uint8_t* row, size_t stride, int64_t n_vocab, const int32_t* cand, int64_t n_cand,
                   const int32_t* w) {
  auto logit = [&](int64_t i) {
    return *reinterpret_cast<const float*>(row + static_cast<size_t>(i) * stride);
  };
  // validate_logits: NaN or +inf anywhere is the host's error to report
  int bad = 0;
  for (int64_t i = 0; i < n_vocab; ++i) bad |= !(logit(i) < kInf);
  if (bad) return -1;
  const int64_t k = std::min<int64_t>(std::max(w[kSampleTopK], 1), n_cand);
  for (int64_t i = 0; i < k; ++i)
    if (cand[i] < 0 || cand[i] >= n_vocab) return -1;
  // the finite candidates (top_k places -inf last)
  int64_t n = 0;
  while (n < k && logit(cand[n]) > -kInf) ++n;
  if (n == 0) return -1;
  const float temperature = word_float(w, kSampleTemperature);
  if (temperature <= 0.0f) return cand[0];  // sample_greedy: the best, lowest id on ties
  const int64_t min_keep = std::max(w[kSampleMinKeep], 1);
  const float top_p = word_float(w, kSampleTopP);
  if (top_p < 1.0f) {  // apply_top_p's sorted path (softmax_candidates, then the running sum)
    const float max_logit = logit(cand[0]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(logit(cand[i]) - max_logit);
    const double inv = 1.0 / sum;
    int64_t cut = n;
    double cum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float p = std::exp(logit(cand[i]) - max_logit);
      cum += static_cast<float>(p * inv);
      if (cum >= top_p) {
        cut = i + 1;
        break;
      }
    }
    n = std::max(cut, std::min(min_keep, n));
  }
  if (word_float(w, kSampleMinP) > 0.0f) {  // apply_min_p's sorted path
    const float threshold = logit(cand[0]) + word_float(w, kSampleLogMinP);
    int64_t cut = 0;
    while (cut < n && logit(cand[cut]) >= threshold) ++cut;
    n = std::max(cut, std::min(min_keep, n));
  }
  // apply_temperature, then sample_distribution
  const float max_logit = logit(cand[0]) / temperature;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logit(cand[i]) / temperature - max_logit);
  uint64_t bits = static_cast<uint32_t>(w[kSampleUniformLo]) |
                  static_cast<uint64_t>(static_cast<uint32_t>(w[kSampleUniformHi])) << 32;
  double u;
  std::memcpy(&u, &bits, sizeof u);
  const double target = u * sum;
  double cum = 0.0;
  int32_t last_possible = cand[0];
  for (int64_t i = 0; i < n; ++i) {
    const float p = std::exp(logit(cand[i]) / temperature - max_logit);
    if (p <= 0.0f) continue;
    cum += p;
    last_possible = cand[i];
    if (target < cum) return cand[i];
  }
  return last_possible;
}

}  // namespace

void op_sample_tokens(const KernelContext& ctx, Tensor* dst) {
  const Tensor* logits = dst->src[0];
  const Tensor* cand = dst->src[1];
  const Tensor* params = dst->src[2];
  int64_t begin, end;
  ctx.split(dst->ne[0], begin, end);
  auto* out = static_cast<int32_t*>(dst->data);
  for (int64_t r = begin; r < end; ++r)
    out[r] = sample_row(at(logits, 0, r, 0, 0), logits->nb[0], logits->ne[0],
                        static_cast<const int32_t*>(cand->data) + r * cand->ne[0], cand->ne[0],
                        static_cast<const int32_t*>(params->data) + r * kSampleParamWords);
}

}  // namespace loom::cpu
