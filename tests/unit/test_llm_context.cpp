// Context: incremental decoding through the KV cache equals recomputing the sequence, chunked
// prefill equals one-shot prefill, results do not depend on the thread count, and the cache
// bookkeeping (rewind, limits) behaves.
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

class LlmContext : public ModelFiles {
 protected:
  using Loaded = LoadedModel;
  Loaded open(const std::string& file, int n_threads, int n_ctx, int n_batch) {
    return open_cpu_model(file, n_threads, n_ctx, n_batch);
  }
};

// All logits of `tokens` computed in one pass (n_batch >= tokens).
std::vector<float> one_shot(Context& ctx, const std::vector<int32_t>& tokens) {
  ctx.kv_cache_clear();
  DecodeOptions o;
  o.all_logits = true;
  auto r = ctx.decode(tokens, 0, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::vector<float>(r->begin(), r->end()) : std::vector<float>{};
}

// Prefill of a few tokens, then one token at a time, gives the logits a full recompute gives. Both
// paths read the same f16 cache contents (the one-shot pass also stores K/V in f16 before attending),
// so they differ only by summation order: the threshold is far below any real error (a wrong
// position or mask gives NMSE ~1).
TEST_F(LlmContext, DecodeStepsEqualRecompute) {
  for (const char* shape : {"tiny", "qwen2-tiny", "qwen3-tiny"}) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(shape) + " " + type);
      auto l = open(model(shape, type), 2, 64, 64);
      ASSERT_TRUE(l.ctx);
      const int n = 12, n_prefill = 5;
      const int n_vocab = l.ctx->n_vocab();
      const auto tokens = test_tokens(n, n_vocab);
      const std::vector<float> ref = one_shot(*l.ctx, tokens);
      ASSERT_EQ(ref.size(), static_cast<size_t>(n) * n_vocab);

      l.ctx->kv_cache_clear();
      auto r = l.ctx->decode(std::span(tokens).first(n_prefill), 0);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      std::vector<float> got(r->begin(), r->end());
      const int allocations = l.ctx->stats().n_arena_allocations;
      for (int i = n_prefill; i < n; ++i) {
        auto s = l.ctx->decode(std::span(tokens).subspan(i, 1), i);
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        got.insert(got.end(), s->begin(), s->end());
      }
      // got holds the logits of tokens n_prefill-1 .. n-1
      const std::vector<float> want(ref.begin() + static_cast<ptrdiff_t>(n_prefill - 1) * n_vocab, ref.end());
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LT(nmse(got, want), 1e-9);
      EXPECT_EQ(l.ctx->kv_cache_used(), n);
      EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(0), n - 1);
      // the arena is reused by every decode step
      EXPECT_EQ(l.ctx->stats().n_arena_allocations, allocations);
      EXPECT_EQ(allocations, 1);  // sized at creation for the largest pass
    }
  }
}

// Prefill in chunks of 3 tokens (-ub 3) equals prefill in one pass, for the last token's logits and
// for all of them.
TEST_F(LlmContext, ChunkedPrefillEqualsOneShot) {
  const std::string file = model("tiny", "f32");
  auto big = open(file, 2, 64, 64);
  auto small = open(file, 2, 64, 3);
  ASSERT_TRUE(big.ctx && small.ctx);
  EXPECT_EQ(small.ctx->n_batch(), 3);
  const auto tokens = test_tokens(11, big.ctx->n_vocab(), 3);
  const std::vector<float> ref = one_shot(*big.ctx, tokens);

  small.ctx->kv_cache_clear();
  DecodeOptions all;
  all.all_logits = true;
  auto r = small.ctx->decode(tokens, 0, all);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(small.ctx->stats().n_steps, 4);  // 3 + 3 + 3 + 2
  ASSERT_EQ(r->size(), ref.size());
  EXPECT_LT(nmse(*r, ref), 1e-10);

  small.ctx->kv_cache_clear();
  auto last = small.ctx->decode(tokens, 0);
  ASSERT_TRUE(last.ok());
  const std::vector<float> ref_last(ref.end() - big.ctx->n_vocab(), ref.end());
  ASSERT_EQ(last->size(), ref_last.size());
  EXPECT_LT(nmse(*last, ref_last), 1e-10);
}

// Greedy generation over 16 steps picks the same tokens with 1 and 3 threads.
TEST_F(LlmContext, GreedyIsThreadIndependent) {
  const std::string file = model("small", "q4_K_M");
  std::vector<std::vector<int32_t>> outputs;
  for (int threads : {1, 3}) {
    auto l = open(file, threads, 128, 8);
    ASSERT_TRUE(l.ctx);
    std::vector<int32_t> seq = test_tokens(10, l.ctx->n_vocab(), 11);
    auto r = l.ctx->decode(seq, 0);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<int32_t> out;
    for (int step = 0; step < 16; ++step) {
      const int32_t next = argmax_of(*r);
      out.push_back(next);
      r = l.ctx->decode(std::span(&next, 1), static_cast<int>(seq.size()));
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      seq.push_back(next);
    }
    outputs.push_back(out);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  // a real sequence, not one token repeated (random weights still vary their argmax)
  EXPECT_GT(std::set<int32_t>(outputs[0].begin(), outputs[0].end()).size(), 1u);
}

// Rewinding with kv_cache_seq_rm and decoding other tokens gives what a fresh context gives.
TEST_F(LlmContext, RewindWithSeqRm) {
  auto l = open(model("qwen3-tiny", "f32"), 2, 64, 16);
  ASSERT_TRUE(l.ctx);
  const int n_vocab = l.ctx->n_vocab();
  auto a = test_tokens(10, n_vocab, 1);
  auto b = test_tokens(4, n_vocab, 2);
  ASSERT_TRUE(l.ctx->decode(a, 0).ok());
  ASSERT_TRUE(l.ctx->kv_cache_seq_rm(0, 6).ok());
  EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(0), 5);
  auto r = l.ctx->decode(b, 6);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<float> got(r->begin(), r->end());

  std::vector<int32_t> joined(a.begin(), a.begin() + 6);
  joined.insert(joined.end(), b.begin(), b.end());
  l.ctx->kv_cache_clear();
  auto ref = l.ctx->decode(joined, 0);
  ASSERT_TRUE(ref.ok());
  EXPECT_LT(nmse(got, *ref), 1e-10);
}

TEST_F(LlmContext, DecodeErrors) {
  auto l = open(model("tiny", "f32"), 1, 16, 4);
  ASSERT_TRUE(l.ctx);
  const int n_vocab = l.ctx->n_vocab();
  const int32_t bad_token = n_vocab;
  auto r = l.ctx->decode(std::span(&bad_token, 1), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos) << r.status().message();

  auto tokens = test_tokens(10, n_vocab);
  ASSERT_TRUE(l.ctx->decode(tokens, 0).ok());
  r = l.ctx->decode(std::span(tokens).first(1), 5);  // position already cached
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("already holds positions up to 9"), std::string::npos)
      << r.status().message();

  r = l.ctx->decode(tokens, 10);  // 10 more do not fit 16 cells
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::out_of_memory);
  EXPECT_EQ(l.ctx->kv_cache_used(), 10);  // nothing was claimed

  r = l.ctx->decode({}, 10);
  EXPECT_FALSE(r.ok());
  // the cache still works after the errors
  r = l.ctx->decode(std::span(tokens).first(6), 10);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(l.ctx->kv_cache_used(), 16);
}

TEST_F(LlmContext, SessionOpensEverything) {
  SessionParams p;
  p.model_path = model("tiny", "q8_0");
  p.n_threads = 2;
  p.n_ctx = 32;
  p.n_batch = 8;
  p.progress = false;
  p.print_summary = false;
  auto s = open_session(p);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->context->n_ctx(), 32);
  EXPECT_EQ(s->context->n_batch(), 8);
  EXPECT_EQ(s->context->kv_cache_bytes(),
            2u * 2 * 32 * 2 * (32 + 32));  // layers * (K+V) * cells * heads * dims * 2 B
  auto r = s->context->decode(test_tokens(3, s->context->n_vocab()), 0);
  EXPECT_TRUE(r.ok()) << r.status().to_string();

  p.model_path = path("does-not-exist.gguf");
  auto bad = open_session(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does-not-exist.gguf"), std::string::npos);
}

}  // namespace
}  // namespace loom::llm::testing
