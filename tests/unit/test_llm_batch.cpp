// Many sequences at once: the paged KV cache's bookkeeping and prefix sharing, paged decoding against
// the contiguous cache, Context::decode_batch, and batch invariance (a sequence decoded among others,
// joining and leaving, or starting from another's shared prefix, gives the tokens and logits it
// gives alone, bit for bit) on synthetic models and the built-in model.
#include <map>

#include "llm/llm_kv_cache.h"
#include "llm/llm_model_impl.h"
#include "loom/exec_plan.h"
#include "loom/llm_batch.h"
#include "loom/planner.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

class LlmBatch : public ModelFiles {};

// `swa_full`: sliding-window layers keep every cell (what steps over several sequences need on a
// contiguous cache; a paged cache always does).
LoadedModel open_model(const std::string& file, int n_ctx, int n_batch, KvCacheKind kind, int block_size = 16,
                       int n_threads = 2, bool swa_full = false) {
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_batch = n_batch;
  cp.kv_cache = kind;
  cp.kv_block_size = block_size;
  cp.swa_full = swa_full;
  return open_cpu_model(file, n_threads, cp);
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

// Prefix reuse: a new sequence takes another's whole blocks by reference; nobody writes into a
// shared block, and a block is free only when no table holds it.
TEST_F(LlmBatch, PagedCacheSharesPrefixBlocks) {
  auto f = GgufFile::open(model("tiny"));
  ASSERT_TRUE(f.ok());
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok());
  auto backend = make_cpu_backend(1);
  auto made = detail::PagedKvCache::create(*hp, 128, 16, backend->buffer_type());  // 8 blocks
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  detail::PagedKvCache& kv = **made;
  ASSERT_TRUE(kv.claim(iota_positions(0, 40), 0).ok());  // blocks 0, 1, 2 (8 of 16 filled)
  EXPECT_EQ(kv.seq_share_prefix(0, 1, 40), 32);          // whole blocks only
  EXPECT_EQ(kv.seq_share_prefix(0, 1, 40), 0);           // 1 holds positions now
  EXPECT_EQ(kv.seq_share_prefix(0, 2, 15), 0);           // less than a block
  EXPECT_EQ(kv.seq_pos_max(1), 31);
  EXPECT_EQ(kv.block_refs(0), 2);
  EXPECT_EQ(kv.block_refs(1), 2);
  EXPECT_EQ(kv.block_refs(2), 1);
  EXPECT_EQ(kv.used(), 40);                     // shared cells count once
  auto c = kv.claim(iota_positions(32, 2), 1);  // past the shared blocks: a block of its own
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], 3 * 16);
  EXPECT_EQ(kv.used(), 42);
  std::vector<int32_t> cells, pos;
  kv.seq_cells(1, cells, pos);
  ASSERT_EQ(cells.size(), 34u);
  EXPECT_EQ(cells[20], 20);  // read from sequence 0's block 1
  // Cutting inside a shared block would let the next write land in the other's data: refused.
  EXPECT_FALSE(kv.seq_rm(1, 20, -1).ok());
  EXPECT_TRUE(kv.seq_rm(1, 16, -1).ok());
  EXPECT_EQ(kv.block_refs(1), 1);
  EXPECT_EQ(kv.used(), 40);
  // Sequence 0 leaves: block 0 stays (sequence 1 holds it), blocks 1 and 2 are free.
  EXPECT_TRUE(kv.seq_rm(0, 0, -1).ok());
  EXPECT_EQ(kv.block_refs(0), 1);
  EXPECT_EQ(kv.block_refs(1), 0);
  EXPECT_EQ(kv.used(), 16);
  EXPECT_EQ(kv.n_free_blocks(), 7);
  EXPECT_TRUE(kv.seq_rm(1, 0, -1).ok());
  EXPECT_EQ(kv.used(), 0);
  EXPECT_EQ(kv.n_free_blocks(), 8);
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

// A backend that has one fused kernel: gather_flash_attn.
class GatherAttentionOnly final : public exec::FusionSupport {
 public:
  bool supports_fused(const exec::Dispatch& d) const override {
    return d.kind == FusedKind::gather_flash_attn;
  }
};

// The batched decode step's graph (StepBuilder over a paged cache, one token of each of 4
// sequences): each layer's attention over the gathered K/V rows is one gather_flash_attn dispatch
// (the CUDA executor's fast mode reads the rows in place), ordered after the layer's cache stores.
TEST_F(LlmBatch, BatchedStepFusesAttentionOverTheGather) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("tiny"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const detail::ModelImpl& impl = (*m)->impl();
  auto kv = detail::PagedKvCache::create(impl.hp, 64, 16, backend->buffer_type());
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  Graph g;
  detail::StepShape shape;
  shape.n_tokens = 4;
  shape.n_kv = 32;
  shape.n_seqs = 4;
  shape.gather = true;
  detail::StepBuilder b(g, impl.hp, impl.w, **kv, impl.arch->rope_mode(), shape);
  Tensor* out = impl.arch->build(b);
  ASSERT_TRUE(g.status().ok()) << g.status().to_string();
  ASSERT_NE(out, nullptr);
  g.mark_output(out);
  auto alloc = allocate_graph(g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();

  exec::Plan p = exec::build_plan(g);
  const size_t unfused = p.dispatches.size();
  exec::fuse(p, g, GatherAttentionOnly{});
  const auto n_layer = static_cast<size_t>(impl.hp.n_layer);
  EXPECT_EQ(p.stats.fusions[static_cast<size_t>(FusedKind::gather_flash_attn)], n_layer);
  EXPECT_EQ(p.dispatches.size(), unfused - 2 * n_layer);  // both gathers of each layer folded in
  size_t seen = 0;
  for (size_t i = 0; i < p.dispatches.size(); ++i) {
    const exec::Dispatch& d = p.dispatches[i];
    if (d.kind != FusedKind::gather_flash_attn) continue;
    const std::string layer = "blk." + std::to_string(seen++) + ".";
    EXPECT_EQ(d.nodes[0]->name, layer + "k_gathered");
    EXPECT_EQ(d.nodes[1]->name, layer + "v_gathered");
    EXPECT_EQ(d.anchor()->name, layer + "kqv_out");
    ASSERT_EQ(d.writes.size(), 1u);  // the attention's output only
    // the layer's K and V stores (set_rows into the cache) come before it
    int stores = 0;
    for (size_t j = 0; j < i; ++j)
      if (p.dispatches[j].kind == FusedKind::none && p.dispatches[j].node()->op == OpKind::set_rows &&
          p.dispatches[j].node()->name.rfind(layer, 0) == 0)
        ++stores;
    EXPECT_EQ(stores, 2) << layer;
  }
  EXPECT_EQ(seen, n_layer);
}

// Logits of `n_steps` greedy tokens after `prompt`, for one sequence alone in a fresh context.
struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // of each step's input token
};

Decoded decode_alone(Context& ctx, std::span<const int32_t> prompt, int n_steps) {
  ctx.kv_cache_clear();
  Decoded d;
  auto r = ctx.decode(prompt, 0);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return d;
  d.logits.emplace_back(r->begin(), r->end());
  d.tokens.push_back(argmax_of(*r));
  for (int i = 1; i < n_steps; ++i) {
    auto s = ctx.decode(std::span(&d.tokens.back(), 1), static_cast<int>(prompt.size()) + i - 1);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return d;
    d.logits.emplace_back(s->begin(), s->end());
    d.tokens.push_back(argmax_of(*s));
  }
  return d;
}

// decode_batch over several sequences gives each the logits it gets alone, bit for bit, on either
// cache kind, whichever sequences share the step. The contiguous cache keeps every cell of gemma2's
// sliding-window layers (swa_full, chosen explicitly): its ring holds one sequence's window, and
// decode_batch refuses several sequences on it (LlmSwaCache.BatchedStepsNeedEveryCell).
TEST_F(LlmBatch, DecodeBatchEqualsAlone) {
  const std::pair<const char*, const char*> models[] = {{"tiny", "f32"},
                                                        {"tiny", "q8_0"},
                                                        {"tiny", "q4_K_M"},
                                                        {"gemma2-tiny", "q8_0"},
                                                        {"qwen3moe-tiny", "q8_0"}};
  for (const auto& [shape, type] : models) {
    for (KvCacheKind kind : {KvCacheKind::paged, KvCacheKind::contiguous}) {
      SCOPED_TRACE(std::string(shape) + " " + type + (kind == KvCacheKind::paged ? " paged" : " contiguous"));
      auto l = open_model(model(shape, type), 256, 16, kind, 16, 2, /*swa_full=*/true);
      ASSERT_TRUE(l.ctx);
      const int n_vocab = l.ctx->n_vocab(), n_seqs = 5, n_steps = 6;
      std::vector<std::vector<int32_t>> prompts;
      std::vector<Decoded> alone;
      for (int s = 0; s < n_seqs; ++s) {
        prompts.push_back(test_tokens(3 + 4 * s, n_vocab, 11 + s));
        alone.push_back(decode_alone(*l.ctx, prompts.back(), n_steps));
      }
      l.ctx->kv_cache_clear();
      std::vector<int32_t> last(n_seqs);
      for (int s = 0; s < n_seqs; ++s) {
        DecodeOptions o;
        o.seq_id = 10 + s;
        auto r = l.ctx->decode(prompts[s], 0, o);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(std::vector<float>(r->begin(), r->end()), alone[s].logits[0]);
        last[s] = argmax_of(*r);
      }
      for (int i = 1; i < n_steps; ++i) {
        std::vector<SeqTokens> batch;
        for (int s = 0; s < n_seqs; ++s)
          if (i < 3 || s % 2 == 0)  // some sequences sit out the later steps
            batch.push_back(
                SeqTokens{10 + s, static_cast<int>(prompts[s].size()) + i - 1, std::span(&last[s], 1)});
        auto r = l.ctx->decode_batch(batch);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_EQ(r->size(), batch.size() * n_vocab);
        for (size_t b = 0; b < batch.size(); ++b) {
          const int s = batch[b].seq_id - 10;
          const auto row = r->subspan(b * n_vocab, n_vocab);
          EXPECT_EQ(std::vector<float>(row.begin(), row.end()), alone[s].logits[i])
              << "seq " << s << " step " << i;
          last[s] = argmax_of(row);
        }
      }
    }
  }
}

// The contexts of the mixed and packed pass tests: 256 cells, passes of 32 tokens, 16-cell blocks,
// every cell of sliding-window layers kept, attention extents in buckets of 32.
ContextParams mixed_params(KvCacheKind kind) {
  ContextParams cp;
  cp.n_ctx = 256;
  cp.n_batch = 32;
  cp.kv_cache = kind;
  cp.kv_block_size = 16;
  cp.swa_full = true;
  cp.n_kv_bucket = 32;
  return cp;
}

// Prompts of one length prefilled together (a packed pass: every sequence brings the same number of
// tokens) give each sequence the logits it gets alone, bit for bit, and the decode steps after them
// too; a pass packing prompts onto sequences that already hold tokens (a second chunk each) as well.
TEST_F(LlmBatch, PackedPromptsEqualAlone) {
  const std::pair<const char*, const char*> models[] = {
      {"tiny", "f32"}, {"tiny", "q4_K_M"}, {"gemma2-tiny", "q8_0"}, {"qwen3moe-tiny", "q8_0"}};
  for (const auto& [shape, type] : models) {
    for (KvCacheKind kind : {KvCacheKind::paged, KvCacheKind::contiguous}) {
      SCOPED_TRACE(std::string(shape) + " " + type + (kind == KvCacheKind::paged ? " paged" : " contiguous"));
      auto l = open_cpu_model(model(shape, type), 2, mixed_params(kind));
      ASSERT_TRUE(l.ctx);
      const int n_vocab = l.ctx->n_vocab(), n_seqs = 3, n_steps = 4, n_prompt = 10;
      std::vector<std::vector<int32_t>> prompts;
      std::vector<Decoded> alone;
      for (int s = 0; s < n_seqs; ++s) {
        prompts.push_back(test_tokens(n_prompt, n_vocab, 71 + s));
        alone.push_back(decode_alone(*l.ctx, prompts.back(), n_steps));
      }
      l.ctx->kv_cache_clear();
      // the prompts in two packed passes of 6 and 4 tokens each
      std::vector<int32_t> last(n_seqs);
      for (const auto& [from, n] : {std::pair{0, 6}, std::pair{6, 4}}) {
        std::vector<SeqTokens> pack;
        for (int s = 0; s < n_seqs; ++s)
          pack.push_back(SeqTokens{20 + s, from,
                                   std::span(prompts[s]).subspan(static_cast<size_t>(from), static_cast<size_t>(n))});
        auto r = l.ctx->decode_batch(pack);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_EQ(r->size(), static_cast<size_t>(n_seqs) * n_vocab);
        if (from + n < n_prompt) continue;
        for (int s = 0; s < n_seqs; ++s) {
          const auto row = r->subspan(static_cast<size_t>(s) * n_vocab, n_vocab);
          EXPECT_EQ(std::vector<float>(row.begin(), row.end()), alone[s].logits[0]) << "prompt of seq " << s;
          last[s] = argmax_of(row);
        }
      }
      for (int i = 1; i < n_steps; ++i) {
        std::vector<SeqTokens> step;
        for (int s = 0; s < n_seqs; ++s) step.push_back(SeqTokens{20 + s, n_prompt + i - 1, std::span(&last[s], 1)});
        auto r = l.ctx->decode_batch(step);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        for (int s = 0; s < n_seqs; ++s) {
          const auto row = r->subspan(static_cast<size_t>(s) * n_vocab, n_vocab);
          EXPECT_EQ(std::vector<float>(row.begin(), row.end()), alone[s].logits[i]) << "seq " << s << " step " << i;
          last[s] = argmax_of(row);
        }
      }
    }
  }
}

// A mixed pass (one sequence's prompt chunk and other sequences' decode tokens in one decode_batch)
// gives every sequence the logits it gets alone, bit for bit: the decode tokens those of one-token
// steps alone, the chunk's last token that of the same chunk decoded alone, and the whole prompt's
// last token that of the prompt in one pass. The chunk goes first, in the middle or last in the
// entries (the logits come back in the order given); the cache fills across a bucket boundary (32).
TEST_F(LlmBatch, MixedPassEqualsAlone) {
  const std::pair<const char*, const char*> models[] = {{"tiny", "f32"},
                                                        {"tiny", "q8_0"},
                                                        {"tiny", "q4_K_M"},
                                                        {"gemma2-tiny", "q8_0"},
                                                        {"qwen3moe-tiny", "q8_0"}};
  for (const auto& [shape, type] : models) {
    for (KvCacheKind kind : {KvCacheKind::paged, KvCacheKind::contiguous}) {
      SCOPED_TRACE(std::string(shape) + " " + type + (kind == KvCacheKind::paged ? " paged" : " contiguous"));
      auto l = open_cpu_model(model(shape, type), 2, mixed_params(kind));
      ASSERT_TRUE(l.ctx);
      const int n_vocab = l.ctx->n_vocab(), n_seqs = 4, n_steps = 5;
      const int chunks[n_steps - 1] = {9, 2, 13, 16};  // the chunked prompt's, one per mixed step
      std::vector<std::vector<int32_t>> prompts;
      std::vector<Decoded> alone;
      for (int s = 0; s < n_seqs; ++s) {
        prompts.push_back(test_tokens(5 + 7 * s, n_vocab, 31 + s));
        alone.push_back(decode_alone(*l.ctx, prompts.back(), n_steps));
      }
      // The chunked prompt alone, in the same chunks, and in one pass.
      const std::vector<int32_t> long_prompt = test_tokens(40, n_vocab, 5);
      std::vector<std::vector<float>> chunk_alone;
      l.ctx->kv_cache_clear();
      int pos = 0;
      for (int n : chunks) {
        auto r = l.ctx->decode(
            std::span(long_prompt).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)), pos);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        chunk_alone.emplace_back(r->begin(), r->end());
        pos += n;
      }
      ASSERT_EQ(pos, static_cast<int>(long_prompt.size()));
      l.ctx->kv_cache_clear();
      auto whole = l.ctx->decode(long_prompt, 0);
      ASSERT_TRUE(whole.ok());
      const std::vector<float> whole_alone(whole->begin(), whole->end());
      EXPECT_EQ(whole_alone, chunk_alone.back()) << "the prompt's last logits depend on its chunking";

      l.ctx->kv_cache_clear();
      std::vector<int32_t> last(n_seqs);
      for (int s = 0; s < n_seqs; ++s) {
        DecodeOptions o;
        o.seq_id = 10 + s;
        auto r = l.ctx->decode(prompts[s], 0, o);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        last[s] = argmax_of(*r);
      }
      const int chunk_seq = 3;
      pos = 0;
      for (int i = 1; i < n_steps; ++i) {
        const int n = chunks[i - 1];
        std::vector<SeqTokens> batch;
        for (int s = 0; s < n_seqs; ++s)
          if (i != 3 || s != 1)  // a sequence sits out a step
            batch.push_back(
                SeqTokens{10 + s, static_cast<int>(prompts[s].size()) + i - 1, std::span(&last[s], 1)});
        const SeqTokens chunk{
            chunk_seq, pos, std::span(long_prompt).subspan(static_cast<size_t>(pos), static_cast<size_t>(n))};
        const size_t at = static_cast<size_t>(i - 1) % 3 == 0 ? 0 : (i % 2 ? batch.size() : 1);
        batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(at), chunk);
        auto r = l.ctx->decode_batch(batch);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_EQ(r->size(), batch.size() * n_vocab);
        for (size_t b = 0; b < batch.size(); ++b) {
          const auto row = r->subspan(b * n_vocab, n_vocab);
          const std::vector<float> got(row.begin(), row.end());
          if (batch[b].seq_id == chunk_seq) {
            EXPECT_EQ(got, chunk_alone[i - 1]) << "chunk of step " << i << " at entry " << b;
            continue;
          }
          const int s = batch[b].seq_id - 10;
          EXPECT_EQ(got, alone[s].logits[i]) << "seq " << s << " step " << i;
          last[s] = argmax_of(row);
        }
        pos += n;
        if (i == 3) {  // the one that sat out catches up alone
          const int s = 1;
          auto c = l.ctx->decode(std::span(&last[s], 1), static_cast<int>(prompts[s].size()) + i - 1,
                                 DecodeOptions{false, 10 + s, {}});
          ASSERT_TRUE(c.ok());
          EXPECT_EQ(std::vector<float>(c->begin(), c->end()), alone[s].logits[i]);
          last[s] = argmax_of(*c);
        }
      }
    }
  }
}

TEST_F(LlmBatch, DecodeBatchErrors) {
  auto l = open_model(model("tiny", "q8_0"), 32, 8, KvCacheKind::paged, 16);  // 2 blocks
  ASSERT_TRUE(l.ctx);
  const auto prompt = test_tokens(20, l.ctx->n_vocab());
  DecodeOptions o;
  o.seq_id = 1;
  ASSERT_TRUE(l.ctx->decode(std::span(prompt).first(16), 0, o).ok());  // block 0
  o.seq_id = 2;
  ASSERT_TRUE(l.ctx->decode(std::span(prompt).first(16), 0, o).ok());  // block 1
  const int32_t t = 5;
  // Duplicates, several tokens each but not the same number, and positions that do not follow are
  // refused (the same number from each is a packed pass).
  std::vector<SeqTokens> dup{{1, 16, std::span(&t, 1)}, {1, 17, std::span(&t, 1)}};
  EXPECT_EQ(l.ctx->decode_batch(dup).status().code(), StatusCode::invalid_argument);
  std::vector<SeqTokens> two{{1, 16, std::span(prompt).first(2)}, {2, 16, std::span(prompt).first(3)}};
  auto uneven = l.ctx->decode_batch(two);
  EXPECT_EQ(uneven.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(uneven.status().message().find("bring 2 and 3 tokens"), std::string::npos) << uneven.status().message();
  // A mixed pass past n_batch (8) tokens is refused.
  std::vector<SeqTokens> big{{1, 16, std::span(prompt).first(8)}, {2, 16, std::span(&t, 1)}};
  EXPECT_EQ(l.ctx->decode_batch(big).status().code(), StatusCode::invalid_argument);
  std::vector<SeqTokens> old{{1, 3, std::span(&t, 1)}, {2, 16, std::span(&t, 1)}};
  EXPECT_EQ(l.ctx->decode_batch(old).status().code(), StatusCode::invalid_argument);
  // The pool is full: the step fails with a message naming the sequence, and no cache changes.
  std::vector<SeqTokens> step{{1, 16, std::span(&t, 1)}, {2, 16, std::span(&t, 1)}};
  auto r = l.ctx->decode_batch(step);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::out_of_memory);
  EXPECT_NE(r.status().message().find("sequence 1"), std::string::npos) << r.status().message();
  EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(1), 15);
  EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(2), 15);
  EXPECT_EQ(l.ctx->kv_cache_used(), 32);
  // Freeing a sequence gives its blocks to the other.
  ASSERT_TRUE(l.ctx->kv_cache_seq_rm(2, 0).ok());
  EXPECT_TRUE(l.ctx->decode_batch(std::span(step).first(1)).ok());
}

// ---- batch invariance on the built-in model --------------------------------------------------------

// Greedy tokens of each prompt generated alone (a plain contiguous context, one token per decode).
std::vector<int32_t> greedy_alone(Context& ctx, std::span<const int32_t> prompt, int n) {
  return decode_alone(ctx, prompt, n).tokens;
}

// greedy_alone of every prompt.
std::vector<std::vector<int32_t>> greedy_alone_each(Context& ctx, const std::vector<std::vector<int32_t>>& prompts,
                                                    int n) {
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(greedy_alone(ctx, p, n));
  return want;
}

// Sequence ids[s]'s first n_gen tokens are want[s] (what it gives alone), for every s.
void expect_tokens_alone(const BatchGenerator& gen, const std::vector<int>& ids,
                         const std::vector<std::vector<int32_t>>& want, int n_gen) {
  for (size_t s = 0; s < ids.size(); ++s) {
    const auto got = gen.generated(ids[s]);
    ASSERT_GE(got.size(), static_cast<size_t>(n_gen)) << "sequence " << s;
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + n_gen), want[s]) << "sequence " << s;
  }
}

std::vector<std::vector<int32_t>> builtin_prompts(int n, int n_vocab) {
  std::vector<std::vector<int32_t>> p;
  for (int s = 0; s < n; ++s) {
    std::vector<int32_t> t = test_tokens(2 + (s * 7) % 23, n_vocab, 100 + s);
    t[0] = 0;  // BOS
    p.push_back(t);
  }
  return p;
}

SamplerParams greedy() {
  SamplerParams sp;
  sp.temperature = 0.0f;
  sp.seed = 1;
  return sp;
}

// 16 sequences with different prompts decoded together give, token for token, what each gives
// alone; so do sequences that join and leave while others run. Both weight types of the built-in
// model: f16 (float dot products) and q8_0 (integer blocks).
TEST_F(LlmBatch, BuiltinModelBatchInvariance) {
  for (const char* file : {LOOM_BUILTIN_MODEL_F16, LOOM_BUILTIN_MODEL_Q8_0}) {
    SCOPED_TRACE(file);
    auto ref = open_model(file, 256, 64, KvCacheKind::contiguous);
    auto l = open_model(file, 16 * 64, 32, KvCacheKind::paged, 16);
    ASSERT_TRUE(ref.ctx && l.ctx);
    const int n_seqs = 16, n_gen = 24;
    const auto prompts = builtin_prompts(n_seqs, ref.ctx->n_vocab());
    const auto want = greedy_alone_each(*ref.ctx, prompts, n_gen);

    // All together.
    {
      BatchGenerator gen(*l.ctx);
      for (const auto& p : prompts) ASSERT_TRUE(gen.add(p, greedy()).ok());
      for (int i = 1; i < n_gen; ++i) ASSERT_TRUE(gen.step().ok());
      for (int s = 0; s < n_seqs; ++s) {
        const auto got = gen.generated(s);
        EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want[s]) << "sequence " << s;
      }
      for (int s = 0; s < n_seqs; ++s) ASSERT_TRUE(gen.remove(s).ok());
      EXPECT_EQ(l.ctx->kv_cache_used(), 0);
    }
    // Joining and leaving: sequence s joins at step s % 5 * 3; every third one leaves early; the
    // finished ones leave and free their blocks for the rest.
    {
      BatchGenerator gen(*l.ctx);
      std::map<int, int> id_of;  // prompt -> sequence id
      std::map<int, std::vector<int32_t>> got;
      for (int step = 0; step < 60; ++step) {
        for (int s = 0; s < n_seqs; ++s)
          if (s % 5 * 3 == step) {
            auto id = gen.add(prompts[s], greedy());
            ASSERT_TRUE(id.ok()) << id.status().to_string();
            id_of[s] = *id;
          }
        if (gen.n_sequences() > 0) {
          ASSERT_TRUE(gen.step().ok());
        }
        for (auto it = id_of.begin(); it != id_of.end();) {
          const int s = it->first;
          const auto gen_tokens = gen.generated(it->second);
          const size_t limit = s % 3 == 0 ? n_gen / 2 : n_gen;
          if (gen_tokens.size() >= limit) {
            got[s].assign(gen_tokens.begin(), gen_tokens.begin() + static_cast<ptrdiff_t>(limit));
            ASSERT_TRUE(gen.remove(it->second).ok());
            it = id_of.erase(it);
          } else {
            ++it;
          }
        }
      }
      ASSERT_EQ(got.size(), static_cast<size_t>(n_seqs));
      for (int s = 0; s < n_seqs; ++s) {
        const size_t limit = s % 3 == 0 ? n_gen / 2 : n_gen;
        EXPECT_EQ(got[s],
                  std::vector<int32_t>(want[s].begin(), want[s].begin() + static_cast<ptrdiff_t>(limit)))
            << "sequence " << s;
      }
    }
  }
}

// An enqueued prompt is computed a chunk per step while the running sequences keep producing a
// token every step; its tokens, and theirs, are those each gives alone. A second enqueued prompt
// waits for the first; one sharing a running sequence's prefix computes only the rest.
TEST_F(LlmBatch, EnqueuedPromptsInterleaveWithDecodes) {
  auto ref = open_model(LOOM_BUILTIN_MODEL_Q8_0, 256, 64, KvCacheKind::contiguous);
  auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, 32, KvCacheKind::paged, 16);
  ASSERT_TRUE(ref.ctx && l.ctx);
  const int n_gen = 16;
  auto prompts = builtin_prompts(4, ref.ctx->n_vocab());
  std::vector<int32_t> long_prompt = test_tokens(45, ref.ctx->n_vocab(), 7);
  long_prompt[0] = 0;
  prompts[3] = test_tokens(40, ref.ctx->n_vocab(), 11);  // two whole blocks to share
  prompts[3][0] = 0;
  std::vector<int32_t> shared_prompt(prompts[3].begin(), prompts[3].end());  // a running one's prompt, longer
  for (int32_t t : test_tokens(20, ref.ctx->n_vocab(), 9)) shared_prompt.push_back(t);
  prompts.push_back(long_prompt);
  prompts.push_back(shared_prompt);
  const auto want = greedy_alone_each(*ref.ctx, prompts, n_gen);

  BatchGenerator gen(*l.ctx);
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(gen.add(prompts[s], greedy()).ok());
  EXPECT_FALSE(gen.enqueue(prompts[4], greedy(), -1).ok());
  auto a = gen.enqueue(prompts[4], greedy(), 8);  // 45 tokens: 6 steps of 8
  auto b = gen.enqueue(prompts[5], greedy(), 8);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(gen.prefilling(*a));
  EXPECT_TRUE(gen.prefilling(*b));
  EXPECT_TRUE(gen.generated(*a).empty());
  int steps_a = 0, steps_b = 0;
  for (int step = 0; step < 64; ++step) {
    const bool a_pending = gen.prefilling(*a), b_pending = gen.prefilling(*b);
    auto out = gen.step();
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    steps_a += a_pending;
    steps_b += b_pending;
    // every running sequence advanced, whatever the prompts in flight
    size_t running = 0;
    for (const auto& t : *out) running += t.seq_id < 4;
    EXPECT_EQ(running, 4u) << "step " << step;
    // b's prompt waits for a's
    if (a_pending) {
      EXPECT_TRUE(gen.prefilling(*b)) << "the second prompt went before the first";
    }
    if (gen.generated(*a).size() >= static_cast<size_t>(n_gen) &&
        gen.generated(*b).size() >= static_cast<size_t>(n_gen))
      break;
  }
  EXPECT_EQ(steps_a, 6);
  EXPECT_EQ(gen.shared_prompt_tokens(*b), 32);  // its prefix came from sequence 3's two whole blocks
  EXPECT_LE(steps_b, 6 + (static_cast<int>(prompts[5].size()) - gen.shared_prompt_tokens(*b) + 7) / 8);
  expect_tokens_alone(gen, {0, 1, 2, 3, *a, *b}, want, n_gen);
}

// The step schedule: while sequences run, every step is one pass (the prompt chunk rides in the
// running sequences' pass) that gives each of them a token and computes at most `chunk` prompt
// tokens, cut to the pass's room (n_batch tokens); prompts go through oldest first; with no
// sequence running a step computes a whole pass of prompt. With mixed steps off the chunk is a pass
// of its own before theirs. The tokens are each sequence's alone either way (counts, not times).
TEST_F(LlmBatch, MixedStepsKeepTheDecodeCadence) {
  auto ref = open_model(LOOM_BUILTIN_MODEL_Q8_0, 256, 64, KvCacheKind::contiguous);
  ASSERT_TRUE(ref.ctx);
  const int n_vocab = ref.ctx->n_vocab(), n_gen = 12, n_batch = 32;
  auto prompts = builtin_prompts(4, n_vocab);
  for (uint32_t k = 0; k < 3; ++k) {  // three prompts of 40 tokens arrive at once
    prompts.push_back(test_tokens(40, n_vocab, 50 + k));
    prompts.back()[0] = 0;
  }
  const auto want = greedy_alone_each(*ref.ctx, prompts, n_gen);
  for (const bool mixed : {true, false}) {
    SCOPED_TRACE(mixed ? "mixed" : "chunk passes");
    auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, n_batch, KvCacheKind::paged, 16);
    ASSERT_TRUE(l.ctx);
    BatchGenerator gen(*l.ctx);
    gen.set_mixed_steps(mixed);
    std::vector<int> ids;
    for (int s = 0; s < 4; ++s) ids.push_back(*gen.add(prompts[s], greedy()));
    for (int s = 4; s < 7; ++s) ids.push_back(*gen.enqueue(prompts[s], greedy(), 12));
    int prefill_steps = 0;
    std::vector<int> first_token_step(7, -1);
    for (int step = 0; step < 40; ++step) {
      int running = 0, oldest_pending = -1;
      for (int s = 0; s < 7; ++s) {
        running += !gen.prefilling(ids[s]) && gen.generated(ids[s]).size() < 64;
        if (oldest_pending < 0 && gen.prefilling(ids[s])) oldest_pending = s;
      }
      const size_t before = oldest_pending >= 0 ? gen.generated(ids[oldest_pending]).size() : 0;
      auto out = gen.step();
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      const BatchStepStats& st = gen.last_step();
      EXPECT_EQ(st.n_decoded, running) << "step " << step;
      if (st.n_prefill_tokens > 0) {
        ++prefill_steps;
        // 12 tokens at most, or the pass's room: 32 minus the running sequences' tokens
        EXPECT_LE(st.n_prefill_tokens, std::min(12, n_batch - running)) << "step " << step;
        EXPECT_EQ(st.mixed, mixed);
        EXPECT_EQ(st.n_passes, mixed ? 1 : 2) << "step " << step;
      } else {
        EXPECT_EQ(st.n_passes, 1);
      }
      (void)before;
      for (int s = 0; s < 7; ++s)
        if (first_token_step[s] < 0 && !gen.generated(ids[s]).empty()) first_token_step[s] = step;
      bool all = true;
      for (int s = 0; s < 7; ++s) all = all && gen.generated(ids[s]).size() >= static_cast<size_t>(n_gen);
      if (all) break;
    }
    // 40 tokens in chunks of 12 (the running sequences leave room): 4 steps each, one prompt at a time
    EXPECT_EQ(prefill_steps, 12);
    EXPECT_EQ(first_token_step[4], 3);
    EXPECT_EQ(first_token_step[5], 7);
    EXPECT_EQ(first_token_step[6], 11);
    expect_tokens_alone(gen, ids, want, n_gen);
  }
  // Nothing running: a step computes a whole pass (n_batch tokens) of the prompt, and the chunk
  // limit comes back once the first sequence decodes. Packed (the default), the second step takes
  // the rest of the first prompt and as much of the second in one pass.
  for (const bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "one prompt a step");
    auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, n_batch, KvCacheKind::paged, 16);
    ASSERT_TRUE(l.ctx);
    BatchGenerator gen(*l.ctx);
    gen.set_packed_prompts(packed);
    const std::vector<int32_t> long_prompt = test_tokens(45, n_vocab, 60);
    auto a = gen.enqueue(long_prompt, greedy(), 8);
    auto b = gen.enqueue(prompts[4], greedy(), 8);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(gen.step().ok());
    EXPECT_EQ(gen.last_step().n_prefill_tokens, n_batch);  // a chunk of n_batch: nothing else fits
    EXPECT_EQ(gen.last_step().n_passes, 1);
    ASSERT_TRUE(gen.step().ok());
    EXPECT_EQ(gen.last_step().n_prefill_tokens, (packed ? 2 : 1) * (45 - n_batch));
    EXPECT_EQ(gen.last_step().n_passes, 1);
    EXPECT_EQ(gen.generated(*a).size(), 1u);
    EXPECT_TRUE(gen.generated(*b).empty());
    ASSERT_TRUE(gen.step().ok());
    EXPECT_EQ(gen.last_step().n_prefill_tokens, 8);  // a decodes now
    EXPECT_EQ(gen.last_step().n_decoded, 1);
    EXPECT_EQ(gen.last_step().n_passes, 1);
    EXPECT_EQ(gen.generated(*a).size(), 2u);
  }
}

// Prompts waiting with nothing decoding are computed together: chunks of the oldest one's length from
// as many as a pass holds. Every sequence's tokens are those it gives alone (exact numerics), in
// fewer steps than one prompt a step, each step one pass.
TEST_F(LlmBatch, PackedPromptStepsEqualAlone) {
  const int n_batch = 32, n_gen = 6;
  auto ref = open_model(LOOM_BUILTIN_MODEL_Q8_0, 256, 64, KvCacheKind::contiguous);
  ASSERT_TRUE(ref.ctx);
  const int n_vocab = ref.ctx->n_vocab();
  // lengths 10, 10, 10, 7, 23, 3: the first step packs three 10s, the next the rest by length
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {10, 10, 10, 7, 23, 3}) prompts.push_back(test_tokens(len, n_vocab, 70 + len + prompts.size()));
  const auto want = greedy_alone_each(*ref.ctx, prompts, n_gen);
  int steps_one_by_one = 0;
  for (const bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "one prompt a step");
    auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, n_batch, KvCacheKind::paged, 16);
    ASSERT_TRUE(l.ctx);
    BatchGenerator gen(*l.ctx);
    gen.set_packed_prompts(packed);
    std::vector<int> ids;
    for (const auto& p : prompts) ids.push_back(*gen.enqueue(p, greedy()));
    int prompt_steps = 0;
    for (int step = 0; step < 64; ++step) {
      bool waiting = false;
      for (int id : ids) waiting = waiting || gen.prefilling(id);
      if (!waiting) break;
      auto out = gen.step();
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_LE(gen.last_step().n_prefill_tokens, n_batch);
      ++prompt_steps;
    }
    if (!packed) steps_one_by_one = prompt_steps;
    else {
      EXPECT_LT(prompt_steps, steps_one_by_one);
      EXPECT_GE(prompt_steps, 2);
    }
    for (int step = 0; step < 3 * n_gen; ++step) {
      bool all = true;
      for (int id : ids) all = all && gen.generated(id).size() >= static_cast<size_t>(n_gen);
      if (all) break;
      ASSERT_TRUE(gen.step().ok());
    }
    expect_tokens_alone(gen, ids, want, n_gen);
  }
}

// Each sequence samples with its own parameters and seed: the same prompt and seed give the same
// tokens together as alone, and different seeds differ.
TEST_F(LlmBatch, PerSequenceSampling) {
  auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, 32, KvCacheKind::paged, 16);
  ASSERT_TRUE(l.ctx);
  const auto prompts = builtin_prompts(3, l.ctx->n_vocab());
  auto params = [](uint32_t seed, float temp) {
    SamplerParams sp;
    sp.seed = seed;
    sp.temperature = temp;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    return sp;
  };
  const SamplerParams cfg[] = {params(1, 1.5f), params(2, 1.5f), params(3, 0.0f)};
  auto run = [&](std::vector<int> which) {
    BatchGenerator gen(*l.ctx);
    std::vector<int> ids;
    for (int w : which) {
      auto id = gen.add(prompts[0], cfg[w]);
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(gen.step().ok());
    std::vector<std::vector<int32_t>> out;
    for (int id : ids) {
      auto g = gen.generated(id);
      out.emplace_back(g.begin(), g.end());
    }
    l.ctx->kv_cache_clear();
    return out;
  };
  const auto together = run({0, 1, 2});
  for (int w = 0; w < 3; ++w) EXPECT_EQ(run({w})[0], together[w]) << w;
  EXPECT_NE(together[0], together[1]);
}

// Sampling a step's sequences on several threads gives the tokens one thread gives.
TEST_F(LlmBatch, SamplingThreadsKeepTokens) {
  auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 2048, 32, KvCacheKind::paged, 16);
  ASSERT_TRUE(l.ctx);
  const auto prompts = builtin_prompts(12, l.ctx->n_vocab());
  auto run = [&](int n_threads) {
    BatchGenerator gen(*l.ctx);
    gen.set_sampling_threads(n_threads);
    for (int s = 0; s < 12; ++s) {
      SamplerParams sp;
      sp.seed = 100 + static_cast<uint32_t>(s);
      sp.temperature = s % 3 == 0 ? 0.0f : 1.2f;
      sp.penalties.repeat = s % 2 ? 1.3f : 1.0f;
      EXPECT_TRUE(gen.add(prompts[static_cast<size_t>(s)], sp).ok());
    }
    for (int i = 0; i < 12; ++i) EXPECT_TRUE(gen.step().ok());
    std::vector<std::vector<int32_t>> out;
    for (int id : gen.sequences()) {
      auto g = gen.generated(id);
      out.emplace_back(g.begin(), g.end());
    }
    l.ctx->kv_cache_clear();
    return out;
  };
  const auto one = run(1);
  EXPECT_EQ(run(3), one);
  EXPECT_EQ(run(1), one);
}

// Prompts that begin alike (a shared "system prompt") share its blocks: each later sequence
// computes only the rest of its prompt, holds fewer cells, and generates what it generates alone.
TEST_F(LlmBatch, PrefixReuseKeepsTokens) {
  auto ref = open_model(LOOM_BUILTIN_MODEL_Q8_0, 256, 64, KvCacheKind::contiguous);
  auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, 32, KvCacheKind::paged, 16);
  ASSERT_TRUE(ref.ctx && l.ctx);
  const int n_vocab = ref.ctx->n_vocab(), n_seqs = 6, n_gen = 12;
  std::vector<int32_t> system = test_tokens(40, n_vocab, 5);
  system[0] = 0;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < n_seqs; ++s) {
    std::vector<int32_t> p = system;
    const auto own = test_tokens(3 + s, n_vocab, 50 + s);
    p.insert(p.end(), own.begin(), own.end());
    prompts.push_back(p);
  }
  BatchGenerator gen(*l.ctx);
  size_t n_positions = 0;
  for (int s = 0; s < n_seqs; ++s) {
    auto id = gen.add(prompts[s], greedy());
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    EXPECT_EQ(gen.shared_prompt_tokens(*id), s == 0 ? 0 : 32) << s;
    n_positions += prompts[s].size();
  }
  EXPECT_EQ(l.ctx->kv_cache_used(), static_cast<int>(n_positions) - 32 * (n_seqs - 1));
  for (int i = 1; i < n_gen; ++i) ASSERT_TRUE(gen.step().ok());
  for (int s = 0; s < n_seqs; ++s) {
    const auto got = gen.generated(s);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), greedy_alone(*ref.ctx, prompts[s], n_gen))
        << "sequence " << s;
  }
  // The first sequence leaves; the others keep the shared blocks and go on as before.
  ASSERT_TRUE(gen.remove(0).ok());
  ASSERT_TRUE(gen.step().ok());
  for (int s = 1; s < n_seqs; ++s) {
    const auto got = gen.generated(s);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), greedy_alone(*ref.ctx, prompts[s], n_gen + 1))
        << "sequence " << s;
  }
}

// What a server needs besides tokens: the logits each token was sampled from (log-probabilities),
// how many sequences a step decoded together, and parked sequences: a finished one stops
// generating but keeps its cells, which a later prompt that starts the same way shares.
TEST_F(LlmBatch, ParkedSequencesLendTheirPrefix) {
  auto ref = open_model(LOOM_BUILTIN_MODEL_Q8_0, 256, 64, KvCacheKind::contiguous);
  auto l = open_model(LOOM_BUILTIN_MODEL_Q8_0, 1024, 32, KvCacheKind::paged, 16);
  ASSERT_TRUE(ref.ctx && l.ctx);
  const int n_vocab = ref.ctx->n_vocab();
  auto prompts = builtin_prompts(2, n_vocab);
  prompts[0] = test_tokens(40, n_vocab, 21);
  prompts[0][0] = 0;
  BatchGenerator gen(*l.ctx);
  auto a = gen.add(prompts[0], greedy());
  auto b = gen.add(prompts[1], greedy());
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 6; ++i) {
    auto out = gen.step();
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(gen.last_step().n_decoded, 2);
    EXPECT_EQ(gen.last_step().n_passes, 1);
    EXPECT_EQ(gen.last_step().n_prefill_tokens, 0);
    for (const GeneratedToken& t : *out) {
      const auto logits = gen.logits(t.seq_id);
      ASSERT_EQ(logits.size(), static_cast<size_t>(n_vocab));
      EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), t.token);  // greedy
    }
  }
  const auto a_tokens = gen.generated(*a);
  std::vector<int32_t> next_turn(prompts[0]);
  next_turn.insert(next_turn.end(), a_tokens.begin(), a_tokens.end());
  for (int32_t t : test_tokens(5, n_vocab, 33)) next_turn.push_back(t);
  ASSERT_TRUE(gen.park(*a).ok());
  EXPECT_TRUE(gen.parked(*a));
  EXPECT_FALSE(gen.park(99).ok());
  const int used_parked = l.ctx->kv_cache_used();
  auto out = gen.step();
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 1u);  // the parked one takes no token
  EXPECT_EQ((*out)[0].seq_id, *b);
  EXPECT_TRUE(gen.logits(*a).empty());
  EXPECT_EQ(l.ctx->kv_cache_used(), used_parked + 1);
  // the next turn shares the parked sequence's whole blocks and generates what it does alone
  auto c = gen.enqueue(next_turn, greedy());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(gen.shared_prompt_tokens(*c),
            static_cast<int>(prompts[0].size() + a_tokens.size() - 1) / 16 * 16);
  while (gen.generated(*c).size() < 8) {
    ASSERT_TRUE(gen.step().ok());
    if (gen.last_step().n_prefill_tokens > 0) {
      EXPECT_EQ(gen.last_step().n_decoded, 1);
    }
  }
  const auto got = gen.generated(*c);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 8), greedy_alone(*ref.ctx, next_turn, 8));
  // removing the parked sequence frees only what nobody else holds
  const int before = l.ctx->kv_cache_used();
  ASSERT_TRUE(gen.remove(*a).ok());
  EXPECT_LT(l.ctx->kv_cache_used(), before);
  EXPECT_GT(l.ctx->kv_cache_used(), 0);
}

}  // namespace
}  // namespace loom::llm::testing
