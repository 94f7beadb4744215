// Perplexity (`loom perplexity`): the result of compute_perplexity equals exp(mean NLL) computed
// here, independently, from Context::decode logits with a log-softmax in double over the same
// chunks and positions; it is finite and > 1, bit-for-bit reproducible across runs and across 1
// and 3 CPU threads; and the argument checks fire.
// KL divergence (--kl-divergence-base / --kl-divergence): a run against its own base gives KL below
// the 16-bit storage's floor and 100% top agreement; a q8_0 run against an f32 base matches KL, PPL
// ratio and top agreement computed here in double from both models' logits; hand-made rows give
// the exact KL within the storage's error bound; bad files are errors that name the file.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kl_divergence.h"
#include "loom/text.h"
#include "perplexity.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

// A fixed English text: the synthetic vocabulary's merges were trained on English, so it becomes
// a few hundred tokens.
const char* kText =
    "The river ran quickly past the old mill, carrying leaves and small branches down toward the sea. "
    "On the far bank a fisherman sat with his line in the water, waiting, as he had every morning for "
    "thirty years. He did not mind the cold. He liked the quiet hour before the town woke, when the "
    "only sounds were the water and the birds and, now and then, a cart on the bridge. His daughter "
    "had asked him once why he never seemed to catch anything. He told her that the fish were not the "
    "point. She did not understand then, but years later, standing on the same bank with her own "
    "children, she thought she finally did. The mill had closed long ago and the wheel no longer "
    "turned, yet people still came to look at it, to take pictures, to sit on the low stone wall and "
    "eat their lunch in the sun. In the evening the light turned gold and then grey, and the river "
    "kept running, as rivers do, without caring who watched it or why. Some of the visitors asked "
    "about the fisherman; a few of the older ones still remembered him, and they told the story of "
    "the winter the river froze and he walked across it to bring bread to a neighbour who was ill.";

using Loaded = LoadedModel;

Loaded open_model(const std::string& file, int n_threads, int n_ctx, int n_batch) {
  return open_cpu_model(file, n_threads, n_ctx, n_batch);
}

// -log p(next) from one row of logits, written out separately from the code under test.
double reference_nll(const float* row, int n_vocab, int next) {
  std::vector<double> x(row, row + n_vocab);
  double m = x[0];
  for (double v : x) m = v > m ? v : m;
  double z = 0.0;
  for (double v : x) z += std::exp(v - m);
  const double log_softmax = x[static_cast<size_t>(next)] - m - std::log(z);
  return -log_softmax;
}

class Perplexity : public ModelFiles {
 protected:
  static constexpr int kChunk = 64;

  std::vector<int32_t> tokenize(const Model& model) {
    auto tok = Tokenizer::from_gguf(model.gguf());
    EXPECT_TRUE(tok.ok()) << tok.status().to_string();
    if (!tok.ok()) return {};
    bos_ = tok->special().add_bos ? tok->special().bos : kNoToken;
    auto ids = tok->encode(kText, /*add_special=*/true, /*parse_special=*/false);
    EXPECT_TRUE(ids.ok()) << ids.status().to_string();
    return ids.ok() ? std::vector<int32_t>(ids->begin(), ids->end()) : std::vector<int32_t>{};
  }

  app::PerplexityParams params() const {
    app::PerplexityParams p;
    p.n_ctx = kChunk;
    p.bos = bos_;
    return p;
  }

  TokenId bos_ = kNoToken;
};

TEST_F(Perplexity, EqualsIndependentNll) {
  // -ub 16: each chunk is decoded in four passes, as a long chunk would be.
  auto l = open_model(model("tiny", "f32"), 2, kChunk, 16);
  ASSERT_TRUE(l.ctx);
  const std::vector<int32_t> tokens = tokenize(*l.model);
  ASSERT_NE(bos_, kNoToken);  // synthetic models add a BOS
  ASSERT_EQ(tokens.front(), bos_);
  const int n_chunks = static_cast<int>(tokens.size()) / kChunk;
  ASSERT_GE(n_chunks, 3) << tokens.size() << " tokens";
  ASSERT_NE(tokens.size() % kChunk, 0u);  // a partial chunk at the end, to be dropped

  std::vector<std::pair<int, double>> seen;
  auto r = app::compute_perplexity(*l.ctx, tokens, params(),
                                   [&](int chunk, double ppl) { seen.emplace_back(chunk, ppl); });
  ASSERT_TRUE(r.ok()) << r.status().to_string();

  // The same evaluation, written out: chunk c holds tokens [c*64, c*64+64) with its first token
  // replaced by BOS; positions 32..62 predict tokens 33..63.
  const int n_vocab = l.ctx->n_vocab();
  double sum = 0.0, sum_sq = 0.0;
  int64_t count = 0;
  std::vector<double> running;
  for (int c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * kChunk, tokens.begin() + (c + 1) * kChunk);
    chunk[0] = bos_;
    l.ctx->kv_cache_clear();
    DecodeOptions all;
    all.all_logits = true;
    auto logits = l.ctx->decode(chunk, 0, all);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    ASSERT_EQ(logits->size(), static_cast<size_t>(kChunk) * n_vocab);
    for (int j = kChunk / 2; j < kChunk - 1; ++j) {
      const double nll =
          reference_nll(logits->data() + static_cast<size_t>(j) * n_vocab, n_vocab, chunk[j + 1]);
      sum += nll;
      sum_sq += nll * nll;
      ++count;
    }
    running.push_back(std::exp(sum / static_cast<double>(count)));
  }
  const double mean = sum / static_cast<double>(count);
  const double ppl = std::exp(mean);
  const double stderr_mean = std::sqrt((sum_sq / count - mean * mean) / static_cast<double>(count - 1));

  EXPECT_EQ(r->n_chunks, n_chunks);
  EXPECT_EQ(r->n_scored, count);
  EXPECT_EQ(count, static_cast<int64_t>(n_chunks) * (kChunk - 1 - kChunk / 2));
  EXPECT_EQ(r->n_decoded, static_cast<int64_t>(n_chunks) * kChunk);
  EXPECT_NEAR(r->nll_mean, mean, 1e-12 * mean);
  EXPECT_NEAR(r->ppl, ppl, 1e-11 * ppl);
  EXPECT_NEAR(r->nll_stderr, stderr_mean, 1e-9 * stderr_mean);
  EXPECT_NEAR(r->ppl_err, ppl * stderr_mean, 1e-9 * ppl * stderr_mean);
  ASSERT_EQ(r->running.size(), running.size());
  ASSERT_EQ(seen.size(), running.size());
  for (size_t i = 0; i < running.size(); ++i) {
    EXPECT_NEAR(r->running[i], running[i], 1e-11 * running[i]);
    EXPECT_EQ(seen[i].first, static_cast<int>(i) + 1);
    EXPECT_EQ(seen[i].second, r->running[i]);
  }
  EXPECT_TRUE(std::isfinite(r->ppl));
  EXPECT_GT(r->ppl, 1.0);
  EXPECT_GT(r->ppl_err, 0.0);
  // A random model is no better than guessing among the vocabulary, and not absurdly worse.
  EXPECT_GT(r->ppl, 0.1 * n_vocab);
  EXPECT_LT(r->ppl, 100.0 * n_vocab);

  // --chunks 1: the first running value.
  app::PerplexityParams one = params();
  one.max_chunks = 1;
  auto r1 = app::compute_perplexity(*l.ctx, tokens, one);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->n_chunks, 1);
  EXPECT_EQ(r1->ppl, r->running[0]);
}

// Bit-for-bit: twice on one context, on a fresh context, with 1 and 3 threads for the model, and
// with 1 and 4 threads for the log-softmax.
TEST_F(Perplexity, Reproducible) {
  const std::string file = model("tiny", "f32");
  std::vector<double> ppl;
  std::vector<std::vector<double>> running;
  for (int threads : {1, 3}) {
    auto l = open_model(file, threads, kChunk, 32);
    ASSERT_TRUE(l.ctx);
    const std::vector<int32_t> tokens = tokenize(*l.model);
    for (int softmax_threads : {1, 4}) {
      app::PerplexityParams p = params();
      p.n_threads = softmax_threads;
      auto r = app::compute_perplexity(*l.ctx, tokens, p);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      ppl.push_back(r->ppl);
      running.push_back(r->running);
    }
  }
  ASSERT_EQ(ppl.size(), 4u);
  for (size_t i = 1; i < ppl.size(); ++i) {
    EXPECT_EQ(ppl[i], ppl[0]) << "run " << i;  // exact, not near
    EXPECT_EQ(running[i], running[0]) << "run " << i;
  }
  EXPECT_TRUE(std::isfinite(ppl[0]));
  EXPECT_GT(ppl[0], 1.0);
}

TEST_F(Perplexity, ArgumentErrors) {
  auto l = open_model(model("tiny", "f32"), 2, kChunk, kChunk);
  ASSERT_TRUE(l.ctx);
  const std::vector<int32_t> tokens = tokenize(*l.model);
  ASSERT_GE(tokens.size(), static_cast<size_t>(kChunk));

  // fewer tokens than one chunk
  auto short_text = app::compute_perplexity(*l.ctx, std::span(tokens).first(kChunk - 1), params());
  ASSERT_FALSE(short_text.ok());
  EXPECT_EQ(short_text.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(short_text.status().message().find("63 tokens"), std::string::npos)
      << short_text.status().message();
  // exactly one chunk is enough
  auto exact = app::compute_perplexity(*l.ctx, std::span(tokens).first(kChunk), params());
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_EQ(exact->n_chunks, 1);
  // chunks larger than the context
  app::PerplexityParams big = params();
  big.n_ctx = kChunk * 2;
  auto too_big = app::compute_perplexity(*l.ctx, tokens, big);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("do not fit"), std::string::npos);
  // chunks too small to score anything
  app::PerplexityParams tiny = params();
  tiny.n_ctx = 3;
  EXPECT_FALSE(app::compute_perplexity(*l.ctx, tokens, tiny).ok());
}

// token_nll against a hand-computed case: logits (0, ln 2, ln 5) give probabilities 1/8, 2/8, 5/8.
TEST(PerplexityMath, TokenNll) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};
  EXPECT_NEAR(app::token_nll(logits, 0), std::log(8.0), 1e-6);
  EXPECT_NEAR(app::token_nll(logits, 1), std::log(4.0), 1e-6);
  EXPECT_NEAR(app::token_nll(logits, 2), std::log(8.0 / 5.0), 1e-6);
  // large logits do not overflow
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(app::token_nll(big, 1), std::log(2.0), 1e-12);
}

// ---- KL divergence -------------------------------------------------------------------------------

// log softmax of a row, in double.
std::vector<double> log_softmax(const float* row, size_t n) {
  std::vector<double> x(row, row + n);
  double m = -INFINITY;
  for (double v : x) m = v > m ? v : m;
  double z = 0.0;
  for (double v : x) z += std::exp(v - m);
  const double lse = m + std::log(z);
  for (double& v : x) v -= lse;
  return x;
}

size_t first_argmax(const float* row, size_t n) {
  size_t top = 0;
  for (size_t i = 1; i < n; ++i)
    if (row[i] > row[top]) top = i;
  return top;
}

struct ReferenceKl {
  double kl = 0.0;     ///< KL(P || Q) in double from the unquantized rows
  double bound = 0.0;  ///< how far the 16-bit stored P may move it (see below)
};

// KL(softmax(a) || softmax(b)) and the error bound of its estimate from a's 16-bit row. With
// stored log-probs off by e_i (|e_i| <= step/2) and renormalized, the estimate differs from the
// exact KL by KL(P'||P) + Cov_p(e, d) to first order, d = log p - log q: at most step^2/8 +
// (step/2) * sum p |d - E_p d|; the last terms allow for the second order and the clamped tail.
ReferenceKl reference_kl(const float* a, const float* b, size_t n) {
  const std::vector<double> lp = log_softmax(a, n), lq = log_softmax(b, n);
  double hi = -INFINITY, lo = INFINITY;
  for (double v : lp) {
    hi = std::max(hi, v);
    lo = std::min(lo, v);
  }
  const double step = (hi - std::max(lo, hi - app::kKldLogProbRange)) / 65535.0;
  ReferenceKl r;
  double mean_d = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::exp(lp[i]);
    if (p > 0.0) {
      r.kl += p * (lp[i] - lq[i]);
      mean_d += p * (lp[i] - lq[i]);
    }
  }
  double spread = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::exp(lp[i]);
    if (p > 0.0 && std::isfinite(lq[i])) spread += p * std::fabs(lp[i] - lq[i] - mean_d);
  }
  r.bound = step * step / 8.0 + step / 2.0 * spread + step * step * (1.0 + spread) + 1e-12;
  return r;
}

// A run against the base it saved: the same PPL to the last bit, KL below the storage floor, every
// top token the same; and the file round trip: header, tokens, and rows within half a step.
TEST_F(Perplexity, KlDivergenceAgainstOwnBase) {
  auto l = open_model(model("tiny", "f32"), 2, kChunk, kChunk);
  ASSERT_TRUE(l.ctx);
  const std::vector<int32_t> tokens = tokenize(*l.model);
  const std::string path = (dir_ / "base.kld").string();
  auto plain = app::compute_perplexity(*l.ctx, tokens, params());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto saved = app::compute_perplexity_saving_base(*l.ctx, tokens, params(), path);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  EXPECT_EQ(saved->ppl, plain->ppl);
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  // round trip
  const int n_vocab = l.ctx->n_vocab();
  const int n_chunks = static_cast<int>(tokens.size()) / kChunk;
  const int rows = kChunk - 1 - kChunk / 2;
  auto file = app::KldBaseFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->n_vocab(), n_vocab);
  EXPECT_EQ(file->n_ctx(), kChunk);
  EXPECT_EQ(file->n_chunks(), n_chunks);
  EXPECT_EQ(file->rows_per_chunk(), rows);
  EXPECT_EQ(std::filesystem::file_size(path),
            app::kKldHeaderBytes + 4u * n_chunks * kChunk +
                static_cast<size_t>(n_chunks) * rows * app::kld_row_bytes(static_cast<size_t>(n_vocab)));
  std::vector<int32_t> expected_tokens(tokens.begin(), tokens.begin() + n_chunks * kChunk);
  for (int c = 0; c < n_chunks; ++c) expected_tokens[static_cast<size_t>(c) * kChunk] = bos_;
  EXPECT_EQ(file->tokens(), expected_tokens);
  {
    std::vector<int32_t> chunk(expected_tokens.begin() + kChunk, expected_tokens.begin() + 2 * kChunk);
    l.ctx->kv_cache_clear();
    DecodeOptions all;
    all.all_logits = true;
    auto logits = l.ctx->decode(chunk, 0, all);
    ASSERT_TRUE(logits.ok());
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(file->read_chunk(1, bytes).ok());
    ASSERT_EQ(bytes.size(), rows * app::kld_row_bytes(static_cast<size_t>(n_vocab)));
    for (int r = 0; r < rows; ++r) {
      const float* row = logits->data() + static_cast<size_t>(kChunk / 2 + r) * n_vocab;
      const uint8_t* stored = bytes.data() + r * app::kld_row_bytes(static_cast<size_t>(n_vocab));
      double nll;
      float lo, step;
      int32_t top;
      std::memcpy(&nll, stored, 8);
      std::memcpy(&lo, stored + 8, 4);
      std::memcpy(&step, stored + 12, 4);
      std::memcpy(&top, stored + 16, 4);
      const int32_t next = chunk[static_cast<size_t>(kChunk / 2 + r + 1)];
      EXPECT_EQ(nll, app::token_nll(std::span(row, static_cast<size_t>(n_vocab)), next));
      EXPECT_EQ(top, static_cast<int32_t>(first_argmax(row, static_cast<size_t>(n_vocab))));
      const std::vector<double> lp = log_softmax(row, static_cast<size_t>(n_vocab));
      for (int i = 0; i < n_vocab; ++i) {
        uint16_t code;
        std::memcpy(&code, stored + app::kKldRowHeaderBytes + 2 * i, 2);
        // half a step, plus the float rounding of lo and step
        EXPECT_NEAR(lo + code * static_cast<double>(step), lp[static_cast<size_t>(i)], step * 0.5 + 1e-5)
            << "row " << r << " token " << i;
      }
    }
  }

  // The same model again: PPL identical, KL only the storage's rounding.
  for (int threads : {1, 4}) {
    app::PerplexityParams p = params();
    p.n_threads = threads;
    std::vector<int> chunks_seen;
    auto r = app::compute_kl_divergence(
        *l.ctx, *file, p, [&](int c, const app::KlDivergenceResult&) { chunks_seen.push_back(c); });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(chunks_seen.size(), static_cast<size_t>(n_chunks));
    EXPECT_EQ(r->n_scored, static_cast<int64_t>(n_chunks) * rows);
    EXPECT_EQ(r->run.ppl, plain->ppl);
    EXPECT_EQ(r->base_ppl, plain->ppl);  // the stored NLLs are the base run's doubles
    EXPECT_EQ(r->ln_ppl_ratio, 0.0);
    EXPECT_EQ(r->ppl_ratio, 1.0);
    EXPECT_EQ(r->dp_rms, 0.0);
    EXPECT_EQ(r->same_top, 1.0);
    // kl_divergence.h: the renormalized 16-bit row is within KL step^2/8 of the true one, and
    // step <= 40 / 65535, so <= 4.7e-8; the tiny model's rows span far less than 40 nats.
    EXPECT_LT(r->kld_max, 4.7e-8);
    EXPECT_LT(r->kld_mean, 1e-8);
    EXPECT_GE(r->kld_min, -1e-15);  // two normalized distributions: >= 0 up to rounding
    ASSERT_EQ(r->kld.size(), static_cast<size_t>(r->n_scored));
  }
  // --chunks 1
  app::PerplexityParams one = params();
  one.max_chunks = 1;
  auto r1 = app::compute_kl_divergence(*l.ctx, *file, one);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->n_scored, rows);
  EXPECT_EQ(r1->run.ppl, plain->running[0]);
}

// A q8_0 run against an f32 base, against KL, PPL ratio, top agreement and dp computed here from
// both models' logits in double (no 16-bit storage).
TEST_F(Perplexity, KlDivergenceOfQuantizedModel) {
  auto f = open_model(model("tiny", "f32"), 2, kChunk, kChunk);
  auto q = open_model(model("tiny", "q8_0"), 2, kChunk, kChunk);
  ASSERT_TRUE(f.ctx && q.ctx);
  const std::vector<int32_t> tokens = tokenize(*f.model);
  const std::string path = (dir_ / "f32.kld").string();
  auto saved = app::compute_perplexity_saving_base(*f.ctx, tokens, params(), path);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  auto file = app::KldBaseFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto r = app::compute_kl_divergence(*q.ctx, *file, params());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto q_plain = app::compute_perplexity(*q.ctx, tokens, params());
  ASSERT_TRUE(q_plain.ok());
  EXPECT_EQ(r->run.ppl, q_plain->ppl);
  EXPECT_EQ(r->base_ppl, saved->ppl);

  const size_t n_vocab = static_cast<size_t>(f.ctx->n_vocab());
  std::vector<double> kl, d, dp;
  double bound_sum = 0.0;
  int64_t same = 0;
  for (int c = 0; c < file->n_chunks(); ++c) {
    std::vector<int32_t> chunk(file->tokens().begin() + c * kChunk,
                               file->tokens().begin() + (c + 1) * kChunk);
    DecodeOptions all;
    all.all_logits = true;
    f.ctx->kv_cache_clear();
    q.ctx->kv_cache_clear();
    auto lf = f.ctx->decode(chunk, 0, all);
    auto lq = q.ctx->decode(chunk, 0, all);
    ASSERT_TRUE(lf.ok() && lq.ok());
    for (int j = kChunk / 2; j < kChunk - 1; ++j) {
      const float* a = lf->data() + static_cast<size_t>(j) * n_vocab;
      const float* b = lq->data() + static_cast<size_t>(j) * n_vocab;
      const ReferenceKl ref = reference_kl(a, b, n_vocab);
      kl.push_back(ref.kl);
      bound_sum += ref.bound;
      EXPECT_NEAR(r->kld[kl.size() - 1], ref.kl, ref.bound) << "chunk " << c << " position " << j;
      const int32_t next = chunk[static_cast<size_t>(j + 1)];
      const double nll_f = reference_nll(a, static_cast<int>(n_vocab), next);
      const double nll_q = reference_nll(b, static_cast<int>(n_vocab), next);
      d.push_back(nll_q - nll_f);
      dp.push_back(std::exp(-nll_q) - std::exp(-nll_f));
      same += first_argmax(a, n_vocab) == first_argmax(b, n_vocab) ? 1 : 0;
    }
  }
  const double n = static_cast<double>(kl.size());
  ASSERT_EQ(r->n_scored, static_cast<int64_t>(kl.size()));
  double kl_mean = 0.0, d_mean = 0.0, dp_mean = 0.0, dp_sq = 0.0;
  for (size_t i = 0; i < kl.size(); ++i) {
    kl_mean += kl[i] / n;
    d_mean += d[i] / n;
    dp_mean += dp[i] / n;
    dp_sq += dp[i] * dp[i] / n;
  }
  EXPECT_NEAR(r->kld_mean, kl_mean, bound_sum / n);
  EXPECT_LT(bound_sum / n, 0.02 * kl_mean);  // the storage error is small next to what it measures
  EXPECT_GT(kl_mean, 1e-5);                  // q8_0 does change the distribution...
  EXPECT_LT(kl_mean, 1e-2);                  // ...a little
  EXPECT_NEAR(r->ln_ppl_ratio, d_mean, 1e-12);
  EXPECT_NEAR(r->ppl_ratio, std::exp(d_mean), 1e-12);
  EXPECT_NEAR(r->dp_mean, dp_mean, 1e-14);
  EXPECT_NEAR(r->dp_rms, std::sqrt(dp_sq), 1e-12);
  EXPECT_EQ(r->same_top, static_cast<double>(same) / n);  // the base's top token is stored exactly
  EXPECT_LT(r->same_top, 1.0);
  EXPECT_GT(r->same_top, 0.5);
  // quantiles are of the per-token values
  std::vector<double> sorted = r->kld;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(r->kld_max, sorted.back());
  EXPECT_EQ(r->kld_min, sorted.front());
  EXPECT_LE(r->kld_median, r->kld_p90);
  EXPECT_LE(r->kld_p90, r->kld_p99);
  EXPECT_LE(r->kld_p99, r->kld_max);
  // the report prints
  EXPECT_NE(app::kl_divergence_summary(*r).find("Same top p"), std::string::npos);
  EXPECT_NE(app::kl_divergence_table_row(1, *r).find("%"), std::string::npos);
}

// Bad files and mismatched runs are errors naming the file; a failed save leaves no file.
TEST_F(Perplexity, KlDivergenceFileErrors) {
  auto l = open_model(model("tiny", "f32"), 2, kChunk, kChunk);
  ASSERT_TRUE(l.ctx);
  const std::vector<int32_t> tokens = tokenize(*l.model);
  const std::string good = (dir_ / "good.kld").string();
  app::PerplexityParams two = params();
  two.max_chunks = 2;
  ASSERT_TRUE(app::compute_perplexity_saving_base(*l.ctx, tokens, two, good).ok());
  std::vector<char> bytes(std::filesystem::file_size(good));
  std::ifstream(good, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const int n_vocab = l.ctx->n_vocab();
  const size_t row_bytes = app::kld_row_bytes(static_cast<size_t>(n_vocab));
  const size_t rows_start = app::kKldHeaderBytes + 4 * 2 * kChunk;

  auto write = [&](const std::string& name, const std::vector<char>& b) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return p;
  };
  auto patched = [&](size_t offset, uint32_t value) {
    std::vector<char> b = bytes;
    std::memcpy(b.data() + offset, &value, 4);
    return b;
  };
  auto expect_open_error = [&](const std::string& name, const std::vector<char>& b, StatusCode code,
                               const std::string& text) {
    const std::string p = write(name, b);
    auto f = app::KldBaseFile::open(p);
    ASSERT_FALSE(f.ok()) << name;
    EXPECT_EQ(f.status().code(), code) << f.status().to_string();
    EXPECT_NE(f.status().message().find(p), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find(text), std::string::npos) << f.status().message();
  };
  auto missing = app::KldBaseFile::open((dir_ / "missing.kld").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::io_error);
  EXPECT_NE(missing.status().message().find("missing.kld"), std::string::npos);
  expect_open_error("empty.kld", {}, StatusCode::format_error, "too short");
  expect_open_error("short.kld", std::vector<char>(bytes.begin(), bytes.end() - 1), StatusCode::format_error,
                    "truncated");
  expect_open_error("header-only.kld", std::vector<char>(bytes.begin(), bytes.begin() + rows_start),
                    StatusCode::format_error, "truncated");
  std::vector<char> longer = bytes;
  longer.push_back(0);
  expect_open_error("long.kld", longer, StatusCode::format_error, "after the last row");
  std::vector<char> magic = bytes;
  magic[0] = 'X';
  expect_open_error("magic.kld", magic, StatusCode::format_error, "bad magic");
  std::vector<char> llama = bytes;
  std::memcpy(llama.data(), "_logits_", 8);
  expect_open_error("llama.kld", llama, StatusCode::format_error, "llama-perplexity");
  expect_open_error("version.kld", patched(8, 2), StatusCode::unsupported, "version 2");
  expect_open_error("ctx.kld", patched(16, 2), StatusCode::format_error, "corrupt header");
  expect_open_error("token.kld", patched(app::kKldHeaderBytes + 4 * 5, static_cast<uint32_t>(n_vocab)),
                    StatusCode::format_error, "outside the vocabulary");

  // A corrupt row is found when its chunk is read: top out of range in chunk 1, row 3; a NaN step.
  auto expect_run_error = [&](const std::string& name, const std::vector<char>& b, const std::string& text) {
    const std::string p = write(name, b);
    auto f = app::KldBaseFile::open(p);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    auto r = app::compute_kl_divergence(*l.ctx, *f, params());
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::format_error) << r.status().to_string();
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
  };
  const size_t chunk1_row3 = rows_start + (static_cast<size_t>(kChunk - 1 - kChunk / 2) + 3) * row_bytes;
  expect_run_error("top.kld", patched(chunk1_row3 + 16, static_cast<uint32_t>(n_vocab)), "chunk 1 row 3");
  expect_run_error("step.kld", patched(rows_start + 12, 0x7fc00000u), "chunk 0 row 0");

  // mismatched chunk size and vocabulary
  auto f = app::KldBaseFile::open(good);
  ASSERT_TRUE(f.ok());
  app::PerplexityParams other = params();
  other.n_ctx = kChunk / 2;
  auto wrong_ctx = app::compute_kl_divergence(*l.ctx, *f, other);
  ASSERT_FALSE(wrong_ctx.ok());
  EXPECT_EQ(wrong_ctx.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(wrong_ctx.status().message().find("chunks of 64 tokens"), std::string::npos)
      << wrong_ctx.status().message();
  {  // a valid file of a 7-token vocabulary: 1 chunk of 4 tokens, 1 scored row
    std::vector<char> b(app::kKldHeaderBytes + 4 * 4 + app::kld_row_bytes(7));
    std::memcpy(b.data(), app::kKldMagic, 8);
    const uint32_t header[4] = {app::kKldVersion, 7, 4, 1};
    std::memcpy(b.data() + 8, header, sizeof(header));
    const int32_t toks[4] = {1, 2, 3, 4};
    std::memcpy(b.data() + app::kKldHeaderBytes, toks, sizeof(toks));
    const std::vector<float> logits = {0, 1, 2, 3, 4, 5, 6};
    ASSERT_TRUE(app::encode_kld_row(
        logits, 4, reinterpret_cast<uint8_t*>(b.data()) + app::kKldHeaderBytes + sizeof(toks)));
    const std::string p = write("vocab7.kld", b);
    auto small = app::KldBaseFile::open(p);
    ASSERT_TRUE(small.ok()) << small.status().to_string();
    auto wrong_vocab = app::compute_kl_divergence(*l.ctx, *small, params());
    ASSERT_FALSE(wrong_vocab.ok());
    EXPECT_EQ(wrong_vocab.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(wrong_vocab.status().message().find("vocabulary has 7 tokens"), std::string::npos)
        << wrong_vocab.status().message();
    EXPECT_NE(wrong_vocab.status().message().find(p), std::string::npos);
  }

  // a run that fails (chunks larger than the context) writes nothing
  const std::string failed = (dir_ / "failed.kld").string();
  app::PerplexityParams big = params();
  big.n_ctx = 2 * kChunk;
  EXPECT_FALSE(app::compute_perplexity_saving_base(*l.ctx, tokens, big, failed).ok());
  EXPECT_FALSE(std::filesystem::exists(failed));
  EXPECT_FALSE(std::filesystem::exists(failed + ".partial"));
  // an unwritable path is an io_error naming it
  auto unwritable =
      app::compute_perplexity_saving_base(*l.ctx, tokens, params(), (dir_ / "no/such/dir.kld").string());
  ASSERT_FALSE(unwritable.ok());
  EXPECT_EQ(unwritable.status().code(), StatusCode::io_error);
  EXPECT_NE(unwritable.status().message().find("no/such/dir.kld"), std::string::npos);
}

// Hand-made rows against KL computed here in double.
TEST(PerplexityMath, KlDivergenceOfRows) {
  // p = (1/8, 2/8, 5/8), q = (1/4, 1/4, 1/2): KL = 1/8 ln(1/2) + 2/8 ln(1) + 5/8 ln(5/4)
  const std::vector<float> a = {0.0f, std::log(2.0f), std::log(5.0f)};
  const std::vector<float> b = {0.0f, 0.0f, std::log(2.0f)};
  std::vector<uint8_t> row(app::kld_row_bytes(3));
  ASSERT_TRUE(app::encode_kld_row(a, 1, row.data()));
  const app::KldRowStats s = app::compare_kld_row(row.data(), b, 1);
  const ReferenceKl ref = reference_kl(a.data(), b.data(), 3);
  EXPECT_NEAR(ref.kl, 0.125 * std::log(0.5) + 0.625 * std::log(1.25), 1e-7);  // float inputs
  EXPECT_NEAR(s.kld, ref.kl, ref.bound);
  EXPECT_LT(ref.bound, 1e-5);
  EXPECT_NEAR(s.nll, std::log(4.0), 1e-7);
  EXPECT_NEAR(s.nll_base, std::log(4.0), 1e-7);
  EXPECT_TRUE(s.same_top);
  EXPECT_FALSE(app::compare_kld_row(row.data(), std::vector<float>{3.0f, 0.0f, 0.0f}, 1).same_top);

  // 2000 logits spread over 80 nats (the bottom half clamped at 40 below the top) against small
  // perturbations of themselves.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-70.0f, 10.0f);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  const size_t n = 2000;
  std::vector<float> wide(n), near(n);
  for (size_t i = 0; i < n; ++i) {
    wide[i] = uniform(rng);
    near[i] = wide[i] + noise(rng);
  }
  std::vector<uint8_t> wide_row(app::kld_row_bytes(n));
  ASSERT_TRUE(app::encode_kld_row(wide, 3, wide_row.data()));
  uint32_t flags;
  std::memcpy(&flags, wide_row.data() + 20, 4);
  EXPECT_EQ(flags, 1u);  // clamped
  const ReferenceKl wide_ref = reference_kl(wide.data(), near.data(), n);
  const app::KldRowStats ws = app::compare_kld_row(wide_row.data(), near, 3);
  EXPECT_NEAR(ws.kld, wide_ref.kl, wide_ref.bound);
  EXPECT_LT(wide_ref.bound, 0.05 * wide_ref.kl);
  // against itself: the storage floor (step^2/8 with step = 40/65535)
  const app::KldRowStats self = app::compare_kld_row(wide_row.data(), wide, 3);
  EXPECT_LT(self.kld, 4.7e-8);
  EXPECT_GE(self.kld, -1e-15);
  EXPECT_TRUE(self.same_top);
  // -inf where the base is clamped contributes nothing (both are below the stored range)...
  size_t low = 0;
  while (wide[low] > -40.0f) ++low;
  std::vector<float> masked = wide;
  masked[low] = -INFINITY;
  EXPECT_NEAR(app::compare_kld_row(wide_row.data(), masked, 3).kld, self.kld, 1e-15);
  // ...but -inf where the base has probability is an infinite divergence
  std::vector<uint8_t> small_row(app::kld_row_bytes(3));
  ASSERT_TRUE(app::encode_kld_row(a, 1, small_row.data()));
  EXPECT_TRUE(
      std::isinf(app::compare_kld_row(small_row.data(), std::vector<float>{-INFINITY, 0.0f, 0.0f}, 1).kld));

  // rows without a finite log-sum-exp are refused
  EXPECT_FALSE(app::encode_kld_row(std::vector<float>{0.0f, NAN}, 0, small_row.data()));
  EXPECT_FALSE(app::encode_kld_row(std::vector<float>{-INFINITY, -INFINITY}, 0, small_row.data()));
  // all-equal logits: step 0, the uniform distribution back
  std::vector<uint8_t> flat_row(app::kld_row_bytes(3));
  ASSERT_TRUE(app::encode_kld_row(std::vector<float>{1.0f, 1.0f, 1.0f}, 0, flat_row.data()));
  const app::KldRowStats flat =
      app::compare_kld_row(flat_row.data(), std::vector<float>{2.0f, 2.0f, 2.0f}, 0);
  EXPECT_NEAR(flat.kld, 0.0, 1e-15);
  EXPECT_NEAR(flat.nll_base, std::log(3.0), 1e-15);
}

}  // namespace
}  // namespace loom::llm::testing
