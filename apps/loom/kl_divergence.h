// KL divergence between a model run and a saved reference ("base") run over the same tokens, as
// llama-perplexity's --kl-divergence-base / --kl-divergence do: the base run saves, for every
// position perplexity scores, the whole next-token distribution; a later run (another
// quantization, other numerics, another backend) is compared with it token by token.
//
// The base file (all integers and floats little-endian, no padding):
//   char     magic[8]    "LOOMKLD1"
//   uint32   version     1
//   uint32   n_vocab
//   uint32   n_ctx       tokens per chunk
//   uint32   n_chunks
//   int32    tokens[n_chunks * n_ctx]   each chunk's tokens as decoded (BOS substitution applied)
//   then, for each chunk, for each scored position j in [n_ctx/2, n_ctx - 1), one row:
//     float64  nll        -log p(token_{j+1}), in double from the logits (so the base PPL is exact)
//     float32  lo         the log-probability that code 0 stands for
//     float32  step       log-probability per code
//     int32    top        argmax of the logits (the first on ties), stored so "same top" is exact
//     uint32   flags      bit 0: code 0 also holds log-probabilities below lo (clamped)
//     uint16   code[n_vocab]   log p_i ~= lo + code_i * step
// A row is 24 + 2 * n_vocab bytes: 4096 positions of a 128k vocabulary take 1 GiB.
//
// Quantization. lo = max(min_i log p_i, max_i log p_i - kKldLogProbRange) and step = (max - lo) /
// 65535, so step <= 40 / 65535 = 6.1e-4 nats and each log-probability is off by at most step / 2.
// The reader renormalizes the dequantized row before using it; then the first-order effect of the
// rounding cancels and KL(stored || true) ~= Var_p(error) / 2 <= step^2 / 8 = 4.7e-8 (typically
// step^2 / 24 = 1.6e-8), far below the 1e-4..1e-3 that numerics or quantization changes give.
// Why 40 nats: a clamped token has p < e^-40 = 4.2e-18 times the top token's, so even 128k of them
// hold < 6e-13 of the mass and bias the KL by < 1e-10, while a wider range would only coarsen the
// step (llama.cpp uses 16 nats, which drops up to n_vocab * e^-16 = 1.5% of the mass for 128k).
// Clamped entries count at lo for the normalization; in the KL sum they count only where this run
// puts more than lo on the token (where both are below lo nothing is known, and -inf logits of
// this run would otherwise give an infinite term).
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loom/llm.h"
#include "loom/status.h"
#include "perplexity.h"

namespace loom::app {

inline constexpr char kKldMagic[8] = {'L', 'O', 'O', 'M', 'K', 'L', 'D', '1'};
inline constexpr uint32_t kKldVersion = 1;
/// Log-probabilities more than this many nats below the row's top are clamped (see above).
inline constexpr double kKldLogProbRange = 40.0;
inline constexpr size_t kKldHeaderBytes = 8 + 4 * 4;
inline constexpr size_t kKldRowHeaderBytes = 24;

/// Bytes of one stored row.
inline size_t kld_row_bytes(size_t n_vocab) { return kKldRowHeaderBytes + 2 * n_vocab; }

/// Writes one row (kld_row_bytes(logits.size()) bytes at `out`) for a position whose logits are
/// `logits` and whose next token is `next`. false (and nothing usable written) when the logits'
/// log-sum-exp is not finite (NaN, +inf, or every logit -inf).
bool encode_kld_row(std::span<const float> logits, int32_t next, uint8_t* out);

/// One scored position compared with its base row.
struct KldRowStats {
  double kld = 0.0;       ///< KL(base || this), nats
  double nll = 0.0;       ///< -log p(next) under this run
  double nll_base = 0.0;  ///< -log p(next) under the base (stored exactly)
  bool same_top = false;  ///< this run's argmax equals the base's
};

/// Compares the stored row at `row` with this run's `logits` (n_vocab of them) for next token `next`.
KldRowStats compare_kld_row(const uint8_t* row, std::span<const float> logits, int32_t next);

/// The header of a base file and access to its rows, one chunk at a time.
class KldBaseFile {
 public:
  /// Opens and validates `path`: magic, version, sizes, tokens in [0, n_vocab), and the file's
  /// size against the header (so a truncated file is an error here, not halfway through a run).
  static Result<KldBaseFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  int n_vocab() const { return n_vocab_; }
  int n_ctx() const { return n_ctx_; }
  int n_chunks() const { return n_chunks_; }
  int rows_per_chunk() const { return n_ctx_ - 1 - n_ctx_ / 2; }
  /// n_chunks * n_ctx tokens, as the base run decoded them.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  /// Reads chunk `c`'s rows (rows_per_chunk() * kld_row_bytes(n_vocab) bytes) into `out`, and
  /// checks each row's header (finite lo and step, top in range).
  Status read_chunk(int c, std::vector<uint8_t>& out);

 private:
  std::string path_;
  std::ifstream in_;
  int n_vocab_ = 0, n_ctx_ = 0, n_chunks_ = 0;
  std::vector<int32_t> tokens_;
};

/// Evaluates perplexity as compute_perplexity does and saves the base file `path` (written to
/// `path`.partial and renamed when complete, so a failed run leaves no half file under `path`).
Result<PerplexityResult> compute_perplexity_saving_base(
    llm::Context& ctx, std::span<const int32_t> tokens, const PerplexityParams& params,
    const std::string& path, const std::function<void(int, double)>& on_chunk = {});

/// This run against the base, over the base's tokens.
struct KlDivergenceResult {
  PerplexityResult run;           ///< this run's perplexity (and decode timing)
  int64_t n_scored = 0;           ///< tokens compared
  double base_nll_mean = 0.0;     ///< the base run's mean NLL over the same tokens
  double base_ppl = 0.0;          ///< exp(base_nll_mean)
  double base_ppl_err = 0.0;      ///< base_ppl times the standard error of base_nll_mean
  double ln_ppl_ratio = 0.0;      ///< mean(nll - nll_base) = ln(PPL / PPL(base))
  double ln_ppl_ratio_err = 0.0;  ///< its standard error (of the per-token differences)
  double ppl_ratio = 0.0;         ///< exp(ln_ppl_ratio)
  double ppl_ratio_err = 0.0;     ///< ppl_ratio * ln_ppl_ratio_err
  double kld_mean = 0.0;          ///< mean KL(base || this) per token, nats
  double kld_stderr = 0.0;        ///< its standard error
  double kld_median = 0.0, kld_p90 = 0.0, kld_p99 = 0.0, kld_max = 0.0, kld_min = 0.0;
  double same_top = 0.0;      ///< fraction of tokens whose argmax agrees with the base's
  double same_top_err = 0.0;  ///< its standard error
  double dp_mean = 0.0;       ///< mean of p(next) - p_base(next)
  double dp_mean_err = 0.0;   ///< its standard error
  double dp_rms = 0.0;        ///< sqrt(mean((p - p_base)^2))
  double dp_rms_err = 0.0;    ///< its standard error
  double dp_max = 0.0;        ///< max |p - p_base|
  std::vector<double> kld;    ///< per token, in evaluation order
};

/// Runs `ctx` over the tokens of `base` (its chunk size must be params.n_ctx, its vocabulary the
/// model's; params.bos is ignored: the stored tokens already have it; params.max_chunks limits the
/// chunks) and compares every scored position. `on_chunk(chunk, running)` after each chunk gets
/// the statistics so far (without the quantiles). format_error for a malformed row,
/// invalid_argument for a vocabulary or chunk-size mismatch; messages name the file.
Result<KlDivergenceResult> compute_kl_divergence(
    llm::Context& ctx, KldBaseFile& base, const PerplexityParams& params,
    const std::function<void(int, const KlDivergenceResult&)>& on_chunk = {});

/// llama-perplexity's per-chunk table: the header line and one row.
std::string kl_divergence_table_header();
std::string kl_divergence_table_row(int chunk, const KlDivergenceResult& running);
/// The final statistics block.
std::string kl_divergence_summary(const KlDivergenceResult& r);

}  // namespace loom::app
