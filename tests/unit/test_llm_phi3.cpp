// Phi-3: hyperparameters (every layer windowed), the fused tensors, LongRoPE's tensors and scale, and
// generation on the CPU: cached decode steps past the window equal recomputing the sequence, and
// greedy tokens are the same whatever the prefill chunking. The logits themselves are checked against
// float64 in test_llm_reference.cpp (phi3-tiny).
#include "test_llm_common.h"

#include <algorithm>

#include "llm/llm_model_impl.h"

namespace loom::llm::testing {
namespace {

class LlmPhi3 : public ModelFiles {};

TEST_F(LlmPhi3, HParamsAndFusedWeights) {
  auto backend = make_cpu_backend(2);
  auto m = Model::load(model("phi3-tiny"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.arch, Arch::phi3);
  EXPECT_STREQ(arch_name(hp.arch), "phi3");
  EXPECT_EQ(hp.n_swa, 6u);
  EXPECT_TRUE(hp.has_swa());
  for (uint32_t il = 0; il < hp.n_layer; ++il) EXPECT_TRUE(hp.is_swa(il)) << il;
  EXPECT_FLOAT_EQ(hp.rope_freq_base_swa, hp.rope_freq_base);
  const auto& w = (*m)->impl().w;
  for (const auto& l : w.layers) {
    ASSERT_NE(l.wqkv, nullptr);
    EXPECT_EQ(l.wqkv->ne[1], 128 + 2 * 64);  // 4 query heads and 2 key/value heads of 32
    EXPECT_EQ(l.wq, nullptr);
    ASSERT_NE(l.ffn_gate_up, nullptr);
    EXPECT_EQ(l.ffn_gate_up->ne[1], 2 * 384);
    EXPECT_EQ(l.ffn_gate, nullptr);
  }
  EXPECT_NE(w.output, w.tok_embd);
}

// Without the window key no layer is local.
TEST_F(LlmPhi3, NoWindowKeyMeansGlobalLayers) {
  const std::string dst = path("phi3-nowindow.gguf");
  Rewrite r;
  r.drop_keys = {"phi3.attention.sliding_window"};
  ASSERT_TRUE(rewrite_gguf(model("phi3-tiny"), dst, r).ok());
  auto f = GgufFile::open(dst);
  ASSERT_TRUE(f.ok());
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().to_string();
  EXPECT_FALSE(hp->has_swa());
  EXPECT_FALSE(hp->is_swa(0));
}

// LongRoPE (with partial rotation, as in Phi-4-mini): both factor sets and the cos/sin scale; short
// factors alone are an error naming the long.
TEST_F(LlmPhi3, LongRopeTensorsAndScale) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("phi3-longrope-tiny"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.n_ctx_orig, 128u);
  EXPECT_EQ(hp.n_rot, 24u);  // Phi-4-mini rotates 3/4 of each head
  EXPECT_NEAR(hp.rope_attn_factor, std::sqrt(1.0 + std::log(4.0) / std::log(128.0)), 1e-6);
  EXPECT_FALSE(hp.has_swa());
  const auto& w = (*m)->impl().w;
  ASSERT_NE(w.rope_freqs, nullptr);
  ASSERT_NE(w.rope_freqs_long, nullptr);
  EXPECT_EQ(w.rope_freqs->name, "rope_factors_short.weight");
  EXPECT_EQ(w.rope_freqs->ne[0], 12);
  EXPECT_EQ(w.layers[1].rope_freqs_long, w.rope_freqs_long);
  EXPECT_EQ(w.output, w.tok_embd);  // tied, as in Phi-4-mini

  const std::string dst = path("phi3-shortonly.gguf");
  Rewrite r;
  r.drop_tensors = {"rope_factors_long.weight"};
  ASSERT_TRUE(rewrite_gguf(model("phi3-longrope-tiny"), dst, r).ok());
  auto bad = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("missing tensor 'rope_factors_long.weight'"), std::string::npos)
      << bad.status().message();
}

TEST_F(LlmPhi3, MissingFusedTensorIsNamed) {
  const std::string dst = path("phi3-noqkv.gguf");
  Rewrite r;
  r.drop_tensors = {"blk.1.attn_qkv.weight"};
  ASSERT_TRUE(rewrite_gguf(model("phi3-tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("missing tensor 'blk.1.attn_qkv.weight'"), std::string::npos)
      << m.status().message();
}

// Greedy generation through the cache, 12 steps after a 5-token prompt (past the window of 6), for
// f32 and quantized files: each step's logits equal those of recomputing the whole sequence at once,
// and the tokens are the argmax of those logits.
TEST_F(LlmPhi3, GreedyDecodeEqualsRecompute) {
  for (const char* type : {"f32", "q8_0", "q4_K_M"}) {
    SCOPED_TRACE(type);
    auto l = open_cpu_model(model("phi3-tiny", type), 2, 64, 16);
    ASSERT_TRUE(l.ctx);
    const int n_vocab = l.ctx->n_vocab();
    std::vector<int32_t> seq = test_tokens(5, n_vocab, 11);
    auto r = l.ctx->decode(seq, 0);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<float> steps(r->begin(), r->end());
    for (int i = 0; i < 12; ++i) {
      const auto last = std::span<const float>(steps).last(static_cast<size_t>(n_vocab));
      const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      seq.push_back(next);
      auto s = l.ctx->decode(std::span(seq).last(1), static_cast<int>(seq.size()) - 1);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      steps.insert(steps.end(), s->begin(), s->end());
    }
    l.ctx->kv_cache_clear();
    DecodeOptions all;
    all.all_logits = true;
    auto full = l.ctx->decode(seq, 0, all);
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    const std::vector<float> want(full->begin() + static_cast<ptrdiff_t>(4) * n_vocab, full->end());
    ASSERT_EQ(steps.size(), want.size());
    EXPECT_LT(nmse(steps, want), 2e-8);
    for (float v : steps) ASSERT_TRUE(std::isfinite(v));
  }
}

}  // namespace
}  // namespace loom::llm::testing
