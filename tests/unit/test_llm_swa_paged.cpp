// The paged KV cache's sliding-window ring (ContextParams::n_seq_max): local layers of gemma2,
// gemma3, gpt-oss and phi3 keep a pool of window blocks sized by the number of sequences, not by n_ctx.
// Several sequences decoded together over it (batched and mixed passes) give, bit for bit, the
// logits each gives alone with every cell kept; blocks no later query sees go back to the pool;
// prefix sharing, rewinds and too many sequences are honoured or refused with a clear error.
#include "test_llm_common.h"

#include <algorithm>

#include "llm/llm_kv_cache.h"
#include "loom/llm_batch.h"

namespace loom::llm::testing {
namespace {

class LlmSwaPaged : public ModelFiles {};

// Windows of 4 positions (phi3-tiny: 6, every layer local).
constexpr const char* kShapes[] = {"gemma2-tiny", "gemma3-tiny", "gptoss-tiny", "phi3-tiny"};

ContextParams ring_params(int n_ctx, int n_batch, int n_seq_max, int block_size = 4) {
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_batch = n_batch;
  cp.kv_cache = KvCacheKind::paged;
  cp.kv_block_size = block_size;
  cp.n_seq_max = n_seq_max;
  cp.n_kv_bucket = 8;
  return cp;
}

// The reference: a paged cache of the same sizes keeping every cell of the sliding-window layers.
ContextParams every_cell_params() {
  ContextParams cp = ring_params(256, 16, 0);
  cp.swa_full = true;
  return cp;
}

const detail::PagedKvCache& paged_of(const Context& ctx) {
  return dynamic_cast<const detail::PagedKvCache&>(detail::context_kv_cache(ctx));
}

// A prompt alone on a cache that keeps every cell, then greedy steps: each step's logits, and the tokens.
struct Alone {
  std::vector<std::vector<float>> logits;  // [0]: the prompt's last token; [i]: step i
  std::vector<int32_t> tokens;             // the prompt, then the greedy tokens
};

Alone decode_alone(Context& ctx, const std::vector<int32_t>& prompt, int n_steps) {
  Alone a;
  ctx.kv_cache_clear();
  a.tokens = prompt;
  auto r = ctx.decode(prompt, 0);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return a;
  a.logits.emplace_back(r->begin(), r->end());
  for (int i = 1; i < n_steps; ++i) {
    a.tokens.push_back(argmax_of(a.logits.back()));
    auto s = ctx.decode(std::span(a.tokens).last(1), static_cast<int>(a.tokens.size()) - 1);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return a;
    a.logits.emplace_back(s->begin(), s->end());
  }
  return a;
}

// ---- bookkeeping -------------------------------------------------------------------------------------

TEST_F(LlmSwaPaged, WindowBlocksComeAndGo) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("gemma3-tiny", "f32"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const HParams& hp = (*m)->hparams();
  ASSERT_EQ(hp.n_swa, 4u);
  // 3 sequences decoding (2 blocks of 4 each: the window before the token's block, its block), one
  // chunk of 8 (4: 1 + 2 + 1).
  EXPECT_EQ(detail::PagedKvCache::window_blocks_needed(4, 4, 3, 8), 2 * 2 + 4);
  EXPECT_EQ(detail::PagedKvCache::window_blocks_needed(4, 4, 1, 1), 2);
  EXPECT_EQ(detail::PagedKvCache::window_blocks_needed(1024, 16, 2, 512), 65 + 97);

  auto made = detail::PagedKvCache::create(hp, 256, 4, backend->buffer_type(), nullptr, -1, 5);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  detail::PagedKvCache& kv = **made;
  ASSERT_TRUE(kv.windowed());
  EXPECT_EQ(kv.n_window_cells(), 20);
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    EXPECT_EQ(kv.k(static_cast<int>(il))->ne[1], hp.is_swa(il) ? 20 : 256) << il;

  auto claim = [&](int seq, int from, int n) -> Status {
    const auto pos = [&] {
      std::vector<int32_t> p(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) p[i] = from + i;
      return p;
    }();
    auto c = kv.claim(pos, seq);
    if (!c) return c.status();
    auto w = kv.claim_window(pos, seq);
    if (!w) {
      kv.release(*c);
      return w.status();
    }
    const int seqs[1] = {seq};
    kv.commit_window(seqs);
    return {};
  };
  ASSERT_TRUE(claim(0, 0, 6).ok());  // positions 0-5: window blocks 0 and 1, none dropped yet
  EXPECT_EQ(kv.n_free_window_blocks(), 3);
  EXPECT_EQ(kv.seq_rewind_min(0), 0);
  ASSERT_TRUE(claim(0, 6, 3).ok());  // 6-8: block 2; the next query (9) sees 6-8: block 0 goes back
  EXPECT_EQ(kv.n_free_window_blocks(), 3);
  EXPECT_EQ(kv.seq_rewind_min(0), 4 + 3);
  std::vector<int32_t> cells, positions;
  kv.seq_window_cells(0, cells, positions);
  EXPECT_EQ(positions, (std::vector<int32_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(cells.size(), positions.size());

  // A cut behind what the ring holds is refused, leaving the sequence as it was.
  const Status behind = kv.seq_rm(0, 5, -1);
  EXPECT_FALSE(behind.ok());
  EXPECT_NE(behind.message().find("sliding-window"), std::string::npos) << behind.message();
  EXPECT_EQ(kv.seq_pos_max(0), 8);
  ASSERT_TRUE(kv.seq_rm(0, 7, -1).ok());  // inside it: block 2 goes back
  EXPECT_EQ(kv.seq_pos_max(0), 6);
  EXPECT_EQ(kv.n_free_window_blocks(), 4);
  ASSERT_TRUE(claim(0, 7, 1).ok());

  // Sharing: the prefix [0, 4) of sequence 0 would need positions 1-3, which its ring gave back.
  EXPECT_EQ(kv.seq_share_prefix(0, 1, 4), 0);
  // A sequence that still holds the window before the prefix's end shares its window blocks too.
  ASSERT_TRUE(claim(2, 0, 8).ok());  // blocks of 0-3 (dropped at commit: the next query is 8) and 4-7
  EXPECT_EQ(kv.seq_share_prefix(2, 3, 8), 8);
  kv.seq_window_cells(3, cells, positions);
  std::vector<int32_t> cells2, positions2;
  kv.seq_window_cells(2, cells2, positions2);
  EXPECT_EQ(cells, cells2);
  EXPECT_EQ(positions, (std::vector<int32_t>{4, 5, 6, 7}));
  const int shared = cells[0] / 4;
  EXPECT_EQ(kv.window_refs(shared), 2);
  const int free_before = kv.n_free_window_blocks();
  ASSERT_TRUE(claim(3, 8, 1).ok());  // the sharer writes into a block of its own
  EXPECT_EQ(kv.n_free_window_blocks(), free_before - 1);

  // The pool runs dry: out_of_memory, and nothing of the failed claim stays.
  const int free_now = kv.n_free_window_blocks();
  const Status dry = claim(4, 0, 4 * (free_now + 1));
  ASSERT_FALSE(dry.ok());
  EXPECT_EQ(dry.code(), StatusCode::out_of_memory);
  EXPECT_NE(dry.message().find("sliding-window"), std::string::npos) << dry.message();
  EXPECT_EQ(kv.seq_pos_max(4), -1);
  EXPECT_EQ(kv.n_free_window_blocks(), free_now);

  // Removing every sequence gives every block back.
  for (int seq : {0, 2, 3}) ASSERT_TRUE(kv.seq_rm(seq, 0, -1).ok());
  EXPECT_EQ(kv.n_free_window_blocks(), kv.n_window_blocks());
  EXPECT_EQ(kv.n_free_blocks(), kv.n_blocks());
}

// Local layers hold window_blocks_needed(n_seq_max) blocks whatever n_ctx; without n_seq_max, or
// with swa_full, a paged cache keeps every cell.
TEST_F(LlmSwaPaged, LocalLayersAreBoundedBySequencesNotContext) {
  for (const char* shape : kShapes) {
    SCOPED_TRACE(shape);
    const std::string file = model(shape, "q8_0");
    for (int n_ctx : {256, 1024}) {
      auto l = open_cpu_model(file, 1, ring_params(n_ctx, 8, 3));
      ASSERT_TRUE(l.ctx);
      const HParams& hp = l.model->hparams();
      const detail::PagedKvCache& kv = paged_of(*l.ctx);
      ASSERT_TRUE(kv.windowed());
      EXPECT_FALSE(l.ctx->swa_full());
      const int64_t window_cells =
          detail::PagedKvCache::window_blocks_needed(static_cast<int>(hp.n_swa), 4, 3, 8) * 4;
      EXPECT_EQ(kv.n_window_cells(), window_cells);
      for (uint32_t il = 0; il < hp.n_layer; ++il) {
        EXPECT_EQ(kv.k(static_cast<int>(il))->ne[1], hp.is_swa(il) ? window_cells : n_ctx) << il;
        EXPECT_EQ(kv.v(static_cast<int>(il))->ne[1], hp.is_swa(il) ? window_cells : n_ctx) << il;
      }
      for (bool swa_full : {false, true}) {
        ContextParams cp = ring_params(n_ctx, 8, swa_full ? 3 : 0);
        cp.swa_full = swa_full;
        auto full = open_cpu_model(file, 1, cp);
        ASSERT_TRUE(full.ctx);
        EXPECT_FALSE(detail::context_kv_cache(*full.ctx).windowed());
        EXPECT_LT(l.ctx->kv_cache_bytes(), full.ctx->kv_cache_bytes());
      }
    }
  }
}

// Five sequences (prompts of 3 to 19 tokens, so past the window of 4), prefilled alone and then
// decoded together in batched steps (some sitting out), then a sixth one's prompt in chunks beside
// their decode steps (mixed passes): every logit equals the sequence's alone over every cell.
TEST_F(LlmSwaPaged, SequencesTogetherOverTheRingEqualAloneOverEveryCell) {
  for (const char* shape : kShapes) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(shape) + " " + type);
      const std::string file = model(shape, type);
      auto full = open_cpu_model(file, 2, every_cell_params());
      auto ring = open_cpu_model(file, 2, ring_params(256, 16, 6));
      ASSERT_TRUE(full.ctx && ring.ctx);
      ASSERT_TRUE(detail::context_kv_cache(*ring.ctx).windowed());
      const int n_vocab = ring.ctx->n_vocab(), n_seqs = 5, n_steps = 9;
      std::vector<Alone> alone;
      for (int s = 0; s < n_seqs; ++s)
        alone.push_back(decode_alone(*full.ctx, test_tokens(3 + 4 * s, n_vocab, 11 + s), n_steps + 4));
      const std::vector<int32_t> chunked = test_tokens(23, n_vocab, 5);
      const int chunks[4] = {9, 2, 7, 5};
      std::vector<std::vector<float>> chunk_alone;
      full.ctx->kv_cache_clear();
      for (int pos = 0, i = 0; i < 4; pos += chunks[i++]) {
        auto r = full.ctx->decode(std::span(chunked).subspan(static_cast<size_t>(pos), static_cast<size_t>(chunks[i])), pos);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        chunk_alone.emplace_back(r->begin(), r->end());
      }

      std::vector<int> length(n_seqs);  // positions each sequence holds on the ring
      for (int s = 0; s < n_seqs; ++s) {
        const int n = 3 + 4 * s;
        DecodeOptions o;
        o.seq_id = 10 + s;
        auto r = ring.ctx->decode(std::span(alone[s].tokens).first(static_cast<size_t>(n)), 0, o);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(std::vector<float>(r->begin(), r->end()), alone[s].logits[0]) << "prompt " << s;
        length[s] = n;
      }
      std::vector<int> step(n_seqs, 1);  // the next step of each sequence
      int chunk_pos = 0, n_chunks = 0;
      for (int i = 1; i < n_steps; ++i) {
        std::vector<SeqTokens> batch;
        if (i >= 5 && n_chunks < 4) {  // the sixth sequence's prompt, chunk by chunk
          batch.push_back(SeqTokens{
              30, chunk_pos, std::span(chunked).subspan(static_cast<size_t>(chunk_pos), static_cast<size_t>(chunks[n_chunks]))});
        }
        for (int s = 0; s < n_seqs; ++s) {
          if (i > 2 && i < 5 && s % 2 == 1) continue;  // sitting out
          batch.push_back(SeqTokens{10 + s, length[s], std::span(alone[s].tokens).subspan(length[s], 1)});
        }
        auto r = ring.ctx->decode_batch(batch);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_EQ(r->size(), batch.size() * static_cast<size_t>(n_vocab));
        for (size_t b = 0; b < batch.size(); ++b) {
          const auto row = r->subspan(b * n_vocab, n_vocab);
          const std::vector<float> got(row.begin(), row.end());
          if (batch[b].seq_id == 30) {
            EXPECT_EQ(got, chunk_alone[n_chunks]) << "chunk " << n_chunks;
            chunk_pos += chunks[n_chunks++];
            continue;
          }
          const int s = batch[b].seq_id - 10;
          EXPECT_EQ(got, alone[s].logits[step[s]]) << "seq " << s << " step " << step[s] << " (pass " << i << ")";
          ++step[s];
          ++length[s];
        }
      }
      EXPECT_EQ(n_chunks, 4);
      // The ring really was reused: each sequence holds a window's blocks, not its positions.
      const detail::PagedKvCache& kv = paged_of(*ring.ctx);
      std::vector<int32_t> cells, positions;
      const size_t n_swa = ring.model->hparams().n_swa;
      for (int s = 0; s < n_seqs; ++s) {
        kv.seq_window_cells(10 + s, cells, positions);
        EXPECT_LE(cells.size(), n_swa + 2 * 4 - 2) << s;  // from the window of its block's start
        if (s == 0) continue;  // 11 positions: phi3's ring (window 6) has dropped none yet
        EXPECT_LT(cells.size(), static_cast<size_t>(length[s])) << s;
        EXPECT_GT(kv.seq_rewind_min(10 + s), 0) << s;
      }
    }
  }
}

// Prompts packed in passes of equal runs (decode_batch with every sequence bringing the same number
// of tokens) over the rings of window blocks give each sequence's logits alone over every cell, bit for
// bit, then the steps after: the window masks and gathers of a packed pass are each sequence's own.
TEST_F(LlmSwaPaged, PackedPromptsOverTheRingEqualAlone) {
  for (const char* shape : kShapes) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(shape) + " " + type);
      const std::string file = model(shape, type);
      auto full = open_cpu_model(file, 2, every_cell_params());
      auto ring = open_cpu_model(file, 2, ring_params(256, 16, 6));
      ASSERT_TRUE(full.ctx && ring.ctx);
      const int n_vocab = ring.ctx->n_vocab(), n_seqs = 4, n_prompt = 12, n_run = 4, n_steps = 4;
      std::vector<Alone> alone;
      for (int s = 0; s < n_seqs; ++s)
        alone.push_back(decode_alone(*full.ctx, test_tokens(n_prompt, n_vocab, 41 + s), n_steps));
      for (int from = 0; from < n_prompt; from += n_run) {  // passes of 4 sequences x 4 tokens
        std::vector<SeqTokens> pack;
        for (int s = 0; s < n_seqs; ++s)
          pack.push_back(SeqTokens{s, from, std::span(alone[s].tokens).subspan(static_cast<size_t>(from), n_run)});
        auto r = ring.ctx->decode_batch(pack);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        if (from + n_run < n_prompt) continue;
        for (int s = 0; s < n_seqs; ++s) {
          const auto row = r->subspan(static_cast<size_t>(s) * n_vocab, n_vocab);
          EXPECT_EQ(std::vector<float>(row.begin(), row.end()), alone[s].logits[0]) << "prompt " << s;
        }
      }
      for (int i = 1; i < n_steps; ++i) {
        std::vector<SeqTokens> step;
        for (int s = 0; s < n_seqs; ++s)
          step.push_back(SeqTokens{s, n_prompt + i - 1, std::span(alone[s].tokens).subspan(n_prompt + i - 1, 1)});
        auto r = ring.ctx->decode_batch(step);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        for (int s = 0; s < n_seqs; ++s) {
          const auto row = r->subspan(static_cast<size_t>(s) * n_vocab, n_vocab);
          EXPECT_EQ(std::vector<float>(row.begin(), row.end()), alone[s].logits[i]) << "seq " << s << " step " << i;
        }
      }
    }
  }
}

// Prefix sharing over the ring: a sharer continues as if alone when the source still holds the
// window before the shared prefix's end; otherwise nothing is shared (it prefills it all again).
// Removing a sequence gives its window blocks back; rewinds behind the ring are refused.
TEST_F(LlmSwaPaged, PrefixSharingAndRemoval) {
  const std::string file = model("gemma3-tiny", "f32");
  ContextParams full_params = ring_params(256, 16, 0);
  full_params.swa_full = true;
  auto full = open_cpu_model(file, 2, full_params);
  auto ring = open_cpu_model(file, 2, ring_params(256, 16, 4));
  ASSERT_TRUE(full.ctx && ring.ctx);
  const int n_vocab = ring.ctx->n_vocab();
  std::vector<int32_t> joined = test_tokens(8, n_vocab, 2);
  const std::vector<int32_t> tail = test_tokens(5, n_vocab, 3);
  joined.insert(joined.end(), tail.begin(), tail.end());
  const Alone want = decode_alone(*full.ctx, joined, 1);

  ASSERT_TRUE(ring.ctx->decode(std::span(joined).first(8), 0).ok());
  auto k = ring.ctx->kv_cache_seq_share_prefix(0, 1, 8);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, 8);
  auto got = ring.ctx->decode(std::span(joined).subspan(8), 8, DecodeOptions{false, 1, {}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(std::vector<float>(got->begin(), got->end()), want.logits[0]);

  // Sequence 1 has moved on: its ring holds nothing before position 8, so its prefix of 8 is not lent.
  auto none = ring.ctx->kv_cache_seq_share_prefix(1, 2, 8);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  EXPECT_EQ(ring.ctx->kv_cache_seq_pos_max(2), -1);
  // Its whole length but the partial block (a chat's next turn) is lent: the window of 12 is held.
  auto turn = ring.ctx->kv_cache_seq_share_prefix(1, 3, 13);
  ASSERT_TRUE(turn.ok());
  EXPECT_EQ(*turn, 12);
  got = ring.ctx->decode(std::span(joined).last(1), 12, DecodeOptions{false, 3, {}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(std::vector<float>(got->begin(), got->end()), want.logits[0]);

  const Status refused = ring.ctx->kv_cache_seq_rm(1, 4);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("sliding-window"), std::string::npos) << refused.message();
  EXPECT_EQ(ring.ctx->kv_cache_seq_pos_max(1), 12);
  const detail::PagedKvCache& kv = paged_of(*ring.ctx);
  ASSERT_TRUE(ring.ctx->kv_cache_seq_rm(1, 12).ok());  // inside the ring: continue as if never cut
  got = ring.ctx->decode(std::span(joined).last(1), 12, DecodeOptions{false, 1, {}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(std::vector<float>(got->begin(), got->end()), want.logits[0]);
  for (int seq : {0, 1, 3}) ASSERT_TRUE(ring.ctx->kv_cache_seq_rm(seq, 0).ok());
  EXPECT_EQ(kv.n_free_window_blocks(), kv.n_window_blocks());
  EXPECT_EQ(ring.ctx->kv_cache_used(), 0);
}

// More sequences than n_seq_max run out of window blocks: the step fails with out_of_memory naming
// the sequence and the sliding-window blocks, and no sequence's cells change.
TEST_F(LlmSwaPaged, TooManySequencesFailCleanly) {
  const std::string file = model("gptoss-tiny", "q8_0");
  auto l = open_cpu_model(file, 2, ring_params(256, 8, 2));
  ASSERT_TRUE(l.ctx);
  const detail::PagedKvCache& kv = paged_of(*l.ctx);
  const int n_vocab = l.ctx->n_vocab();
  const std::vector<int32_t> prompt = test_tokens(7, n_vocab, 4);
  int n_ok = 0;
  Status last;
  for (int seq = 0; seq < 16 && last.ok(); ++seq) {
    auto r = l.ctx->decode(prompt, 0, DecodeOptions{false, seq, {}});
    if (r.ok())
      ++n_ok;
    else
      last = r.status();
  }
  ASSERT_FALSE(last.ok());
  EXPECT_GE(n_ok, 2);
  EXPECT_EQ(last.code(), StatusCode::out_of_memory);
  EXPECT_NE(last.message().find("sliding-window"), std::string::npos) << last.message();
  EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(n_ok), -1);

  // A batched step that cannot give its last sequence a window block stores nothing for any of them.
  const int free_blocks = kv.n_free_window_blocks();
  std::vector<int32_t> next(static_cast<size_t>(n_ok + 1), 1);
  std::vector<SeqTokens> step;
  for (int seq = 0; seq < n_ok; ++seq) step.push_back(SeqTokens{seq, 7, std::span(&next[seq], 1)});
  step.push_back(SeqTokens{n_ok, 0, std::span(prompt).first(5)});  // two blocks, n_batch tokens in all
  ASSERT_EQ(n_ok, 3);
  auto r = l.ctx->decode_batch(step);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::out_of_memory);
  for (int seq = 0; seq < n_ok; ++seq) EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(seq), 6) << seq;
  EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(n_ok), -1);
  EXPECT_EQ(kv.n_free_window_blocks(), free_blocks);
  step.pop_back();
  EXPECT_TRUE(l.ctx->decode_batch(step).ok());  // the others still step

  ContextParams bad = ring_params(256, 8, -1);
  auto refused = Context::create(*l.model, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("n_seq_max"), std::string::npos);
}

// BatchGenerator (what `loom serve` drives) over the ring: sequences added together generate their
// tokens alone over every cell; a parked one lends the next turn its prefix up to its last block
// boundary (enqueued: a prompt computed in mixed passes), which then generates its tokens alone.
TEST_F(LlmSwaPaged, GeneratorOverTheRingKeepsTokensAndLendsTheNextTurn) {
  const std::string file = model("gemma3-tiny", "q8_0");
  ContextParams full_params = ring_params(512, 16, 0);
  full_params.swa_full = true;
  auto full = open_cpu_model(file, 2, full_params);
  auto ring = open_cpu_model(file, 2, ring_params(512, 16, 4));
  ASSERT_TRUE(full.ctx && ring.ctx);
  const int n_vocab = ring.ctx->n_vocab();
  auto greedy_alone = [&](const std::vector<int32_t>& prompt, int n) {
    const Alone a = decode_alone(*full.ctx, prompt, n);
    std::vector<int32_t> out(a.tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), a.tokens.end());
    if (!a.logits.empty()) out.push_back(argmax_of(a.logits.back()));
    return out;
  };
  SamplerParams greedy;
  greedy.temperature = 0.0f;
  greedy.seed = 1;
  BatchGenerator gen(*ring.ctx);
  const std::vector<std::vector<int32_t>> prompts = {test_tokens(21, n_vocab, 1), test_tokens(9, n_vocab, 2),
                                                     test_tokens(30, n_vocab, 3)};
  std::vector<int> ids;
  for (const auto& p : prompts) {
    auto id = gen.add(p, greedy);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  for (int i = 1; i < 8; ++i) ASSERT_TRUE(gen.step().ok());
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto got = gen.generated(ids[s]);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), greedy_alone(prompts[s], 8)) << s;
  }
  const auto a_tokens = gen.generated(ids[0]);
  std::vector<int32_t> next_turn(prompts[0]);
  next_turn.insert(next_turn.end(), a_tokens.begin(), a_tokens.end());
  for (int32_t t : test_tokens(5, n_vocab, 33)) next_turn.push_back(t);
  ASSERT_TRUE(gen.park(ids[0]).ok());
  auto c = gen.enqueue(next_turn, greedy);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // The parked sequence holds its prompt and all but its newest token: 28 positions, 7 blocks of 4.
  EXPECT_EQ(gen.shared_prompt_tokens(*c), static_cast<int>(prompts[0].size() + a_tokens.size() - 1) / 4 * 4);
  for (int i = 0; i < 40 && gen.generated(*c).size() < 6; ++i) ASSERT_TRUE(gen.step().ok());
  const auto got = gen.generated(*c);
  ASSERT_GE(got.size(), 6u);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 6), greedy_alone(next_turn, 6));
  for (int id : {ids[0], ids[1], ids[2], *c}) ASSERT_TRUE(gen.remove(id).ok());
  const detail::PagedKvCache& kv = paged_of(*ring.ctx);
  EXPECT_EQ(kv.n_free_window_blocks(), kv.n_window_blocks());
  EXPECT_EQ(ring.ctx->kv_cache_used(), 0);
}

}  // namespace
}  // namespace loom::llm::testing
