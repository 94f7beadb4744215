// Perplexity of a model on a text (`loom perplexity`), by llama.cpp's method, so numbers compare
// with llama-perplexity's:
//   - the whole text is tokenized once (with BOS when the model's tokenizer adds one);
//   - the tokens are cut into chunks of n_ctx; an incomplete last chunk is dropped;
//   - each chunk is decoded from an empty KV cache with the logits of every position; when the
//     model adds a BOS, the chunk's first token is replaced by BOS (the first chunk already starts
//     with it), so every chunk starts as a document does;
//   - only the second half is scored: position j in [n_ctx/2, n_ctx - 1) contributes
//     -log softmax(logits_j)[token_{j+1}], so every scored token sees at least n_ctx/2 tokens of
//     context (the first half is context only);
//   - PPL = exp(mean NLL); its error is exp(mean) times the standard error of the mean NLL,
//     sqrt(var / (N - 1)) with var = mean(NLL^2) - mean(NLL)^2 (llama.cpp's estimate).
// Log-softmax and all sums are in double; per-token values are summed in token order, so the
// result does not depend on how many threads compute them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "loom/llm.h"
#include "loom/status.h"
#include "loom/text.h"

namespace loom::app {

struct PerplexityParams {
  int n_ctx = 512;         ///< tokens per chunk; the context must hold at least this many
  int max_chunks = 0;      ///< <= 0: every complete chunk
  TokenId bos = kNoToken;  ///< not kNoToken: each chunk's first token becomes this id
  int n_threads = 0;       ///< threads for the log-softmax (0: hardware concurrency, at most 16)
};

struct PerplexityResult {
  int n_chunks = 0;             ///< chunks evaluated
  int64_t n_scored = 0;         ///< tokens whose probability was counted
  double nll_mean = 0.0;        ///< mean negative log-likelihood, nats per token
  double nll_stderr = 0.0;      ///< standard error of nll_mean (0 with fewer than 2 tokens)
  double ppl = 0.0;             ///< exp(nll_mean)
  double ppl_err = 0.0;         ///< ppl * nll_stderr
  std::vector<double> running;  ///< ppl over the chunks so far, after each chunk
  double decode_seconds = 0.0;  ///< time in Context::decode
  int64_t n_decoded = 0;        ///< tokens decoded
};

/// The negative log-likelihood of `next` under the distribution softmax(logits), in double.
double token_nll(std::span<const float> logits, int32_t next);

/// Sees each chunk's logits: `chunk` counts from 0, `tokens` are the chunk's n_ctx tokens as decoded
/// (BOS substituted), `logits` n_ctx rows of n_vocab. An error stops the evaluation and is returned.
using ChunkLogitsFn =
    std::function<Status(int chunk, std::span<const int32_t> tokens, std::span<const float> logits)>;

/// Evaluates `tokens` as described above. `on_chunk(chunk, running_ppl)` is called after each chunk
/// (chunk counts from 1), after `on_logits` for that chunk. invalid_argument when n_ctx < 4, the
/// context is smaller than n_ctx, or there are fewer than n_ctx tokens (loom needs one complete
/// chunk; llama.cpp asks for two).
Result<PerplexityResult> compute_perplexity(llm::Context& ctx, std::span<const int32_t> tokens,
                                            const PerplexityParams& params,
                                            const std::function<void(int, double)>& on_chunk = {},
                                            const ChunkLogitsFn& on_logits = {});

/// The number of chunks compute_perplexity evaluates for `n_tokens` tokens.
int perplexity_chunk_count(size_t n_tokens, const PerplexityParams& params);

/// Calls work(r0, r1) on contiguous ranges covering [0, n_rows), on up to n_threads threads (0:
/// hardware concurrency, at most 16). Work that writes only its own rows' results gives the same
/// results for any thread count.
void for_row_ranges(int n_rows, int n_threads, const std::function<void(int, int)>& work);

}  // namespace loom::app
