// The sliding-window KV cache: local layers of gemma2, gemma3 and phi3 keep a ring of window +
// n_batch - 1 cells instead of the whole context. Memory per local layer is bounded by that whatever
// n_ctx; prompts and decode steps that wrap the ring many times give the logits of the full cache
// (ContextParams::swa_full); rewinds behind what the ring holds are refused, clearing always works.
#include "test_llm_common.h"

#include <algorithm>

#include "llm/llm_kv_cache.h"

namespace loom::llm::testing {
namespace {

class LlmSwaCache : public ModelFiles {
 protected:
  struct Run {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<Context> ctx;
  };
  Run open(const std::string& file, int n_ctx, int n_batch, bool swa_full) {
    Run r;
    r.backend = make_cpu_backend(2);
    auto m = Model::load(file, *r.backend, quiet_load());
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return r;
    r.model = std::move(m.value());
    ContextParams p{n_ctx, n_batch, 0};
    p.n_kv_bucket = 16;
    p.swa_full = swa_full;
    auto c = Context::create(*r.model, p);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (c.ok()) r.ctx = std::move(c.value());
    return r;
  }

  // Every logit of a `n_prompt`-token prompt (in chunks of n_batch), then `n_steps` greedy steps.
  static std::vector<float> prompt_and_steps(Context& ctx, int n_prompt, int n_steps,
                                             std::vector<int32_t>* seq_out) {
    const int n_vocab = ctx.n_vocab();
    std::vector<int32_t> seq = test_tokens(n_prompt, n_vocab, 17);
    DecodeOptions all;
    all.all_logits = true;
    auto r = ctx.decode(seq, 0, all);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return {};
    std::vector<float> out(r->begin(), r->end());
    for (int i = 0; i < n_steps; ++i) {
      const auto last = std::span<const float>(out).last(static_cast<size_t>(n_vocab));
      seq.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
      auto s = ctx.decode(std::span(seq).last(1), static_cast<int>(seq.size()) - 1);
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      if (!s.ok()) return {};
      out.insert(out.end(), s->begin(), s->end());
    }
    if (seq_out) *seq_out = seq;
    return out;
  }
};

constexpr const char* kWindowedShapes[] = {"gemma2-tiny", "gemma3-tiny", "phi3-tiny"};

// Local layers hold window + n_batch - 1 cells at any n_ctx; global layers n_ctx; swa_full: all n_ctx.
TEST_F(LlmSwaCache, LocalLayersAreBoundedByTheWindow) {
  for (const char* shape : kWindowedShapes) {
    SCOPED_TRACE(shape);
    const std::string file = model(shape, "q8_0");
    for (int n_ctx : {64, 512}) {
      Run r = open(file, n_ctx, 8, false);
      ASSERT_TRUE(r.ctx);
      const HParams& hp = r.model->hparams();
      const detail::KvCache& kv = detail::context_kv_cache(*r.ctx);
      ASSERT_TRUE(kv.windowed());
      EXPECT_EQ(kv.n_window_cells(), static_cast<int>(hp.n_swa) + 8 - 1);
      uint64_t local_bytes = 0;
      for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const int64_t cells = kv.k(static_cast<int>(il))->ne[1];
        EXPECT_EQ(cells, hp.is_swa(il) ? hp.n_swa + 8 - 1 : n_ctx) << il;
        EXPECT_EQ(kv.v(static_cast<int>(il))->ne[1], cells) << il;
        if (hp.is_swa(il))
          local_bytes += kv.k(static_cast<int>(il))->nbytes() + kv.v(static_cast<int>(il))->nbytes();
      }
      EXPECT_EQ(local_bytes, static_cast<uint64_t>(hp.n_swa + 7) * hp.n_head_kv *
                                 (hp.head_dim_k + hp.head_dim_v) * 2 *
                                 (hp.arch == Arch::gemma2   ? 2
                                  : hp.arch == Arch::gemma3 ? 5
                                                            : hp.n_layer));
      Run full = open(file, n_ctx, 8, true);
      ASSERT_TRUE(full.ctx);
      const detail::KvCache& fkv = detail::context_kv_cache(*full.ctx);
      EXPECT_FALSE(fkv.windowed());
      for (uint32_t il = 0; il < hp.n_layer; ++il) EXPECT_EQ(fkv.k(static_cast<int>(il))->ne[1], n_ctx);
      EXPECT_LT(r.ctx->kv_cache_bytes(), full.ctx->kv_cache_bytes());
    }
  }
}

// A 37-token prompt in chunks of 4 and 24 decode steps wrap the ring (gemma: 7 cells, phi3: 9) many
// times; every logit equals the full cache's run bit for bit (the CPU's exact numerics make attention
// independent of the order in which it meets the cells, docs/NUMERICS.md), and so do the greedy tokens.
TEST_F(LlmSwaCache, WrappingTheRingGivesTheFullCacheLogits) {
  for (const char* shape : kWindowedShapes) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(shape) + " " + type);
      const std::string file = model(shape, type);
      Run ring = open(file, 128, 4, false);
      Run full = open(file, 128, 4, true);
      ASSERT_TRUE(ring.ctx && full.ctx);
      ASSERT_TRUE(detail::context_kv_cache(*ring.ctx).windowed());
      std::vector<int32_t> seq_ring, seq_full;
      const auto got = prompt_and_steps(*ring.ctx, 37, 24, &seq_ring);
      const auto want = prompt_and_steps(*full.ctx, 37, 24, &seq_full);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_FALSE(got.empty());
      EXPECT_EQ(got, want) << "NMSE " << nmse(got, want);
      EXPECT_EQ(seq_ring, seq_full);
      // The ring really was reused: far fewer cells than positions.
      EXPECT_LT(detail::context_kv_cache(*ring.ctx).n_kv_window(), 16);
    }
  }
}

// After the ring has dropped old positions, a rewind that would need them is refused (and the cache
// stays usable); a rewind inside what the ring holds, or clearing from 0, gives a fresh run's logits.
TEST_F(LlmSwaCache, RewindsBehindTheRingAreRefused) {
  const std::string file = model("gemma3-tiny", "f32");
  Run r = open(file, 128, 4, false);
  ASSERT_TRUE(r.ctx);
  const int n_vocab = r.ctx->n_vocab();
  const auto a = test_tokens(30, n_vocab, 3);
  const auto b = test_tokens(6, n_vocab, 4);
  ASSERT_TRUE(r.ctx->decode(a, 0).ok());
  const detail::KvCache& kv = detail::context_kv_cache(*r.ctx);
  const int rewind_min = kv.seq_rewind_min(0);
  EXPECT_GT(rewind_min, 0);
  EXPECT_LE(rewind_min, 30);
  const Status refused = r.ctx->kv_cache_seq_rm(0, 5);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("sliding-window"), std::string::npos) << refused.message();
  EXPECT_EQ(r.ctx->kv_cache_seq_pos_max(0), 29);  // left as it was

  // Rewind to 27 (inside the ring) and continue with b: equals a fresh run of a[0..27) + b.
  ASSERT_GE(27, rewind_min);
  ASSERT_TRUE(r.ctx->kv_cache_seq_rm(0, 27).ok());
  auto got = r.ctx->decode(b, 27);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const std::vector<float> after_rewind(got->begin(), got->end());
  std::vector<int32_t> joined(a.begin(), a.begin() + 27);
  joined.insert(joined.end(), b.begin(), b.end());
  ASSERT_TRUE(r.ctx->kv_cache_seq_rm(0, 0).ok());  // clearing always works
  EXPECT_EQ(kv.seq_rewind_min(0), 0);
  auto fresh = r.ctx->decode(joined, 0);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  EXPECT_EQ(after_rewind, std::vector<float>(fresh->begin(), fresh->end()));

  // decode's own check, for a caller that skips seq_rm's: a gap is fine, going back is not.
  Run g = open(file, 128, 4, false);
  ASSERT_TRUE(g.ctx);
  ASSERT_TRUE(g.ctx->decode(a, 0).ok());
  EXPECT_TRUE(g.ctx->decode(b, 40).ok());
}

// The ring serves single-sequence passes. A step over several sequences (decode_batch) needs every
// cell of the sliding-window layers: refused on a ring (nothing changes), done by a paged cache,
// which keeps them whole, and by swa_full.
TEST_F(LlmSwaCache, BatchedStepsNeedEveryCell) {
  const std::string file = model("gemma2-tiny", "q8_0");
  Run r = open(file, 128, 8, false);
  ASSERT_TRUE(r.ctx);
  ASSERT_FALSE(r.ctx->swa_full());
  const auto prompt = test_tokens(5, r.ctx->n_vocab(), 9);
  for (int seq : {1, 2}) {
    DecodeOptions o;
    o.seq_id = seq;
    ASSERT_TRUE(r.ctx->decode(prompt, 0, o).ok());
  }
  const int32_t t = 3;
  const std::vector<SeqTokens> step{{1, 5, std::span(&t, 1)}, {2, 5, std::span(&t, 1)}};
  auto refused = r.ctx->decode_batch(step);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(refused.status().message().find("swa_full"), std::string::npos) << refused.status().message();
  EXPECT_EQ(r.ctx->kv_cache_seq_pos_max(1), 4);
  EXPECT_EQ(r.ctx->kv_cache_seq_pos_max(2), 4);
  EXPECT_TRUE(r.ctx->decode_batch(std::span(step).first(1)).ok());  // one sequence: the ring's own pass

  // A paged cache not told how many sequences it serves (n_seq_max, LlmSwaPaged) keeps every cell
  // of every layer, whatever swa_full says.
  ContextParams p{128, 8, 0};
  p.kv_cache = KvCacheKind::paged;
  auto paged = Context::create(*r.model, p);
  ASSERT_TRUE(paged.ok()) << paged.status().to_string();
  EXPECT_TRUE((*paged)->swa_full());
  const detail::KvCache& kv = detail::context_kv_cache(**paged);
  EXPECT_FALSE(kv.windowed());
  for (uint32_t il = 0; il < r.model->hparams().n_layer; ++il)
    EXPECT_EQ(kv.k(static_cast<int>(il))->ne[1], 128) << il;
  for (int seq : {1, 2}) {
    DecodeOptions o;
    o.seq_id = seq;
    ASSERT_TRUE((*paged)->decode(prompt, 0, o).ok());
  }
  EXPECT_TRUE((*paged)->decode_batch(step).ok());
}

}  // namespace
}  // namespace loom::llm::testing
