// Many sequences at once: the paged KV cache's bookkeeping, and paged decoding against the
// contiguous cache.
#include "llm/llm_kv_cache.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

class LlmBatch : public ModelFiles {};

LoadedModel open_model(const std::string& file, int n_ctx, int n_batch, KvCacheKind kind, int block_size = 16,
                       int n_threads = 2) {
  LoadedModel l;
  l.backend = make_cpu_backend(n_threads);
  auto m = Model::load(file, *l.backend, quiet_load());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return l;
  l.model = std::move(m.value());
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_batch = n_batch;
  cp.kv_cache = kind;
  cp.kv_block_size = block_size;
  auto c = Context::create(*l.model, cp);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (c.ok()) l.ctx = std::move(c.value());
  return l;
}

std::vector<int32_t> iota_positions(int from, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = from + i;
  return p;
}

// ---- the paged cache's bookkeeping --------------------------------------------------------------------

TEST_F(LlmBatch, PagedCacheBlocksComeAndGo) {
  auto f = GgufFile::open(model("tiny"));
  ASSERT_TRUE(f.ok());
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok());
  auto backend = make_cpu_backend(1);
  auto made = detail::PagedKvCache::create(*hp, 60, 16, backend->buffer_type());  // 4 blocks of 16
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  detail::PagedKvCache& kv = **made;
  EXPECT_EQ(kv.n_cells(), 64);
  EXPECT_EQ(kv.n_blocks(), 4);

  auto a = kv.claim(iota_positions(0, 20), 0);  // blocks 0, 1
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0], 0);
  EXPECT_EQ((*a)[19], 19);
  auto b = kv.claim(iota_positions(0, 3), 7);  // block 2
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0], 32);
  auto a2 = kv.claim(iota_positions(20, 1), 0);  // still in block 1
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ((*a2)[0], 20);
  EXPECT_EQ(kv.used(), 24);
  EXPECT_EQ(kv.n_free_blocks(), 1);
  EXPECT_EQ(kv.room(0), 11 + 16);
  EXPECT_EQ(kv.seq_pos_max(0), 20);
  EXPECT_EQ(kv.seq_pos_max(7), 2);

  // Positions must continue the sequence.
  EXPECT_EQ(kv.claim(iota_positions(5, 1), 7).status().code(), StatusCode::invalid_argument);
  // Out of blocks: a clear error, and nobody's cells move.
  auto full = kv.claim(iota_positions(3, 40), 7);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::out_of_memory);
  EXPECT_NE(full.status().message().find("sequence 7"), std::string::npos) << full.status().message();
  EXPECT_EQ(kv.used(), 24);
  EXPECT_EQ(kv.n_free_blocks(), 1);
  EXPECT_EQ(kv.block_table(0).size(), 2u);
  EXPECT_EQ(kv.block_table(7).size(), 1u);

  // Only a suffix can be removed; removing everything frees the blocks.
  EXPECT_FALSE(kv.seq_rm(0, 2, 5).ok());
  EXPECT_TRUE(kv.seq_rm(0, 10, -1).ok());
  EXPECT_EQ(kv.seq_pos_max(0), 9);
  EXPECT_EQ(kv.block_table(0).size(), 1u);
  EXPECT_EQ(kv.n_free_blocks(), 2);
  EXPECT_TRUE(kv.seq_rm(0, 0, -1).ok());
  EXPECT_EQ(kv.seq_pos_max(0), -1);
  EXPECT_EQ(kv.n_free_blocks(), 3);
  EXPECT_EQ(kv.used(), 3);

  // A new sequence takes the lowest free block; its cells list in position order.
  auto c = kv.claim(iota_positions(0, 17), 3);
  ASSERT_TRUE(c.ok());
  std::vector<int32_t> cells, pos;
  kv.seq_cells(3, cells, pos);
  ASSERT_EQ(cells.size(), 17u);
  EXPECT_EQ(cells[0], 0);
  EXPECT_EQ(cells[16], 16);
  EXPECT_EQ(pos[16], 16);
  // A failed step's cells go back (and with them a block they opened).
  auto d = kv.claim(iota_positions(3, 14), 7);  // fills block 2, opens block 3
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(kv.n_free_blocks(), 0);
  kv.release(*d);
  EXPECT_EQ(kv.seq_pos_max(7), 2);
  EXPECT_EQ(kv.n_free_blocks(), 1);
  kv.clear();
  EXPECT_EQ(kv.used(), 0);
  EXPECT_EQ(kv.n_free_blocks(), 4);
}

// ---- paged decoding ----------------------------------------------------------------------------------

// A single sequence through the paged cache (gathered attention) gives the contiguous cache's logits
// bit for bit: the same keys in the same order, converted from the same f16 values.
TEST_F(LlmBatch, PagedDecodeEqualsContiguous) {
  for (const char* shape : {"tiny", "qwen3-tiny", "gemma2-tiny", "qwen3moe-tiny"}) {
    SCOPED_TRACE(shape);
    auto ref = open_model(model(shape, "q8_0"), 64, 16, KvCacheKind::contiguous);
    auto paged = open_model(model(shape, "q8_0"), 64, 16, KvCacheKind::paged, 8);
    ASSERT_TRUE(ref.ctx && paged.ctx);
    EXPECT_EQ(paged.ctx->kv_cache_kind(), KvCacheKind::paged);
    const int n_vocab = ref.ctx->n_vocab();
    const auto tokens = test_tokens(30, n_vocab);
    DecodeOptions all;
    all.all_logits = true;
    auto a = ref.ctx->decode(std::span(tokens).first(21), 0, all);  // two chunks
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    std::vector<float> want(a->begin(), a->end());
    auto b = paged.ctx->decode(std::span(tokens).first(21), 0, all);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(std::vector<float>(b->begin(), b->end()), want);
    for (int i = 21; i < 30; ++i) {
      auto x = ref.ctx->decode(std::span(tokens).subspan(i, 1), i);
      auto y = paged.ctx->decode(std::span(tokens).subspan(i, 1), i);
      ASSERT_TRUE(x.ok() && y.ok());
      EXPECT_EQ(std::vector<float>(x->begin(), x->end()), std::vector<float>(y->begin(), y->end())) << i;
    }
    // A paged sequence rewinds only at its end, and grows only there.
    EXPECT_FALSE(paged.ctx->kv_cache_seq_rm(0, 3, 5).ok());
    EXPECT_TRUE(paged.ctx->kv_cache_seq_rm(0, 25).ok());
    EXPECT_EQ(paged.ctx->kv_cache_seq_pos_max(0), 24);
    EXPECT_FALSE(paged.ctx->decode(std::span(tokens).first(1), 27).ok());
  }
}

}  // namespace
}  // namespace loom::llm::testing
