// decode_and_sample: one sequence's step, its token sampled in the pass's graph where exact.
#include "loom/llm_sampling.h"

#include <algorithm>

namespace loom::llm {

DeviceSampling device_sampling_settings(Sampler& sampler, int64_t n_vocab, std::span<const int32_t> history,
                                        std::optional<SampleRng>& rng_before) {
  DeviceSampling d;
  if (!sampler.device_samplable(n_vocab, history)) return d;
  const SamplerParams& p = sampler.params();
  d.on_device = true;
  d.top_k = p.top_k;
  d.temperature = p.temperature;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.min_keep = static_cast<int32_t>(std::min<size_t>(p.min_keep, 1u << 30));
  if (p.temperature > 0.0f) {
    rng_before = sampler.rng();
    d.uniform = sampler.draw_uniform();
  }
  return d;
}

Result<SampledToken> decode_and_sample(Context& ctx, Sampler& sampler, std::span<const int32_t> tokens,
                                       int pos, std::span<const int32_t> history,
                                       const DecodeSampleOptions& options) {
  SampledToken out;
  const int64_t n_vocab = ctx.n_vocab();
  const bool device = options.device && ctx.supports_device_sampling() && !tokens.empty() &&
                      tokens.size() <= static_cast<size_t>(std::max(1, ctx.n_batch())) &&
                      sampler.device_samplable(n_vocab, history);
  if (!device) {
    DecodeOptions o;
    o.seq_id = options.seq_id;
    auto logits = ctx.decode(tokens, pos, o);
    if (!logits) return logits.status();
    auto token = sampler.sample(*logits, history);
    if (!token) return token.status();
    out.token = *token;
    out.logits = *logits;
    return out;
  }
  std::optional<SampleRng> rng_before;
  const DeviceSampling settings[1] = {device_sampling_settings(sampler, n_vocab, history, rng_before)};
  const SeqTokens seq[1] = {SeqTokens{options.seq_id, pos, tokens}};
  auto got = ctx.decode_batch_sampled(seq, settings);
  if (!got) {
    if (rng_before) sampler.set_rng(*rng_before);
    return got.status();
  }
  if (got->tokens[0] >= 0) {
    out.token = got->tokens[0];
    out.on_device = true;
    return out;
  }
  // The device could not sample this row: the host does, from the generator's state before the
  // device's draw, so that the token (or the host's error naming the bad logit) is the host path's.
  if (rng_before) sampler.set_rng(*rng_before);
  const std::span<const float> row = got->host_logits.first(static_cast<size_t>(n_vocab));
  auto token = sampler.sample(row, history);
  if (!token) return token.status();
  out.token = *token;
  out.logits = row;
  return out;
}

}  // namespace loom::llm
