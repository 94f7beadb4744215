// One sequence's next token sampled where its logits are: in the forward pass's graph
// (Context::decode_batch_sampled: only the token id comes back) when the sampler's chain can run
// there exactly, else on the host from the logits read back. `loom run` and `loom chat` generate
// this way; BatchGenerator builds its device settings with the same function.
//
//   std::vector<int32_t> tokens = prompt;
//   auto logits = ctx.decode(prompt, 0);                    // the prompt: its logits on the host
//   int32_t next = *sampler.sample(*logits, tokens);
//   while (...) {
//     tokens.push_back(next);
//     auto got = loom::llm::decode_and_sample(ctx, sampler, std::span(tokens).last(1),
//                                             static_cast<int>(tokens.size()) - 1, tokens);
//     next = got->token;                                    // got->on_device: no logits read back
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "loom/llm.h"
#include "loom/sample.h"
#include "loom/status.h"

namespace loom::llm {

/// `sampler`'s next token as Context::decode_batch_sampled samples it: the chain's settings after
/// penalties, and the uniform the sampler's generator draws for it (advancing it as sample() would;
/// its state before the draw goes to `rng_before`, to be put back with Sampler::set_rng when the
/// device's token is not taken; nothing is drawn, and rng_before left as it is, when greedy).
/// on_device = false, and nothing drawn, where only the host chain is exact
/// (Sampler::device_samplable over `history`, the sequence so far).
DeviceSampling device_sampling_settings(Sampler& sampler, int64_t n_vocab, std::span<const int32_t> history,
                                        std::optional<SampleRng>& rng_before);

/// Per-call options of decode_and_sample.
struct DecodeSampleOptions {
  int seq_id = 0;  ///< sequence the tokens belong to
  /// false: always the host path (Context::decode, then Sampler::sample on the logits read back),
  /// as `loom run --host-sampling`.
  bool device = true;
};

/// The token decode_and_sample sampled.
struct SampledToken {
  int32_t token = -1;
  bool on_device = false;  ///< sampled in the pass's graph: no logits came back
  /// The logits the host sampled from (n_vocab floats, as the model gave them), valid until the
  /// next decode; empty when on_device.
  std::span<const float> logits;
};

/// Runs `tokens` at positions pos, pos+1, ... of sequence options.seq_id (as Context::decode) and
/// samples the next token with `sampler`; `history` is the sequence so far, `tokens` included (what
/// the penalties look at, as in Sampler::sample). The token is sampled in the pass's graph when the
/// context can (Context::supports_device_sampling), the chain can run there exactly
/// (Sampler::device_samplable) and the tokens fit one pass (n_batch); otherwise, or with
/// options.device off, on the host. A row the device cannot sample (NaN/+inf logits) comes back,
/// and the host samples it with the generator put back as it was before the device's draw. Either
/// way the token is the host path's for the same seed (on the CPU bit for bit; see sample_tokens in
/// loom/graph.h for the GPU's exp). Where the logits themselves are needed (logprobs, perplexity,
/// dumps), use Context::decode. On a decode error the cache is left as it was; on a sampling error
/// the tokens stay in the cache.
Result<SampledToken> decode_and_sample(Context& ctx, Sampler& sampler, std::span<const int32_t> tokens,
                                       int pos, std::span<const int32_t> history,
                                       const DecodeSampleOptions& options = {});

}  // namespace loom::llm
