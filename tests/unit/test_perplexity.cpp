// Perplexity (`loom perplexity`): the result of compute_perplexity equals exp(mean NLL) computed
// here, independently, from Context::decode logits with a log-softmax in double over the same
// chunks and positions; it is finite and > 1, bit-for-bit reproducible across runs and across 1
// and 3 CPU threads; and the argument checks fire.
#include <cmath>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace loom::llm::testing
