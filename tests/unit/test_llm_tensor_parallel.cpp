// Tensor parallelism on the CPU: a model split over two CPU backends (a host group's all-reduce
// between them) gives the unsplit model's logits within rounding, over a chunked prompt, decode
// steps and batched steps over a paged cache; every rank holds its slice of each split weight and
// of the KV heads; what cannot be split is refused by name.
#include <algorithm>
#include <cstring>

#include <thread>

#include "llm/llm_kv_cache.h"
#include "llm/llm_model_impl.h"
#include "loom/comm.h"
#include "loom/llm_sampling.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

constexpr int kThreads = 1;

struct TpModel {
  std::vector<std::unique_ptr<Backend>> backends;
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

// n_ranks CPU backends; contexts of 64 cells, -ub 5 and buckets of 4 cells as the offload tests use.
Result<TpModel> open_tp(const std::string& file, int n_ranks, KvCacheKind kind = KvCacheKind::contiguous,
                        int n_seq_max = 0) {
  TpModel s;
  ModelLoadOptions lo = quiet_load();
  for (int r = 0; r < n_ranks; ++r) {
    BackendOptions o;
    o.n_threads = kThreads;
    auto b = create_backend("cpu", o);
    if (!b) return b.status();
    s.backends.push_back(std::move(b.value()));
    if (n_ranks > 1) lo.tensor_parallel.push_back(s.backends.back().get());
  }
  auto m = Model::load(file, *s.backends[0], lo);
  if (!m) return m.status();
  s.model = std::move(m.value());
  ContextParams cp;
  cp.n_ctx = n_seq_max > 0 ? 512 : 64;  // room for a ring smaller than the cache
  cp.n_batch = 5;
  cp.n_kv_bucket = 4;
  cp.kv_cache = kind;
  cp.n_seq_max = n_seq_max;
  auto c = Context::create(*s.model, cp);
  if (!c) return c.status();
  s.ctx = std::move(c.value());
  return s;
}

// A 7-token prompt (all logits, two chunks), then 6 one-token steps: every decode's logits.
std::vector<std::vector<float>> run_sequence(Context& ctx) {
  const auto tokens = test_tokens(13, ctx.n_vocab(), 11);
  std::vector<std::vector<float>> out;
  DecodeOptions all;
  all.all_logits = true;
  auto r = ctx.decode(std::span(tokens).first(7), 0, all);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return out;
  out.emplace_back(r->begin(), r->end());
  for (int i = 7; i < static_cast<int>(tokens.size()); ++i) {
    auto s = ctx.decode(std::span(tokens).subspan(static_cast<size_t>(i), 1), i);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return out;
    out.emplace_back(s->begin(), s->end());
  }
  return out;
}

// Logits of a split run against the unsplit one: the partial products are rounded to f32 before the
// all-reduce adds them, so they agree to rounding, not bit for bit (measured NMSE 1e-13 to 1e-9 on
// these random models, the QK-norm and Gemma ones highest; a wrong split gives ~1); each row's best
// token is the same.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, size_t n_vocab) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size() % n_vocab, 0u);
  float lo = want[0], hi = lo;
  for (float v : want) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 0.1f);  // real logits
  EXPECT_LT(nmse(got, want), 1e-8);
  for (size_t row = 0; row < want.size() / n_vocab; ++row) {
    auto g = got.begin() + static_cast<std::ptrdiff_t>(row * n_vocab);
    auto w = want.begin() + static_cast<std::ptrdiff_t>(row * n_vocab);
    const auto n = static_cast<std::ptrdiff_t>(n_vocab);
    EXPECT_EQ(std::max_element(g, g + n) - g, std::max_element(w, w + n) - w) << "row " << row;
  }
}

class LlmTensorParallel : public ModelFiles {};

TEST_F(LlmTensorParallel, TwoRanksMatchTheUnsplitModel) {
  // tied output + biases + rope_freqs (llama31), QK-norm (qwen3), experts (qwen3moe), sliding
  // windows with a ring and soft-caps (gemma2/3), sinks and biased experts (gpt-oss), fused Q/K/V and
  // gate/up whose parts split each on its own (phi3), and q8_0 blocks
  // split along their rows' columns
  for (const auto& [shape, type] :
       std::vector<std::pair<const char*, const char*>>{{"tiny", "f32"},
                                                        {"llama31-tiny", "f32"},
                                                        {"qwen2-tiny", "f32"},
                                                        {"qwen3-tiny", "f32"},
                                                        {"qwen3moe-tiny", "f32"},
                                                        {"gemma2-tiny", "f32"},
                                                        {"gemma3-tiny", "f32"},
                                                        {"gptoss-tiny", "f32"},
                                                        {"phi3-tiny", "f32"},
                                                        {"phi3-longrope-tiny", "f32"},
                                                        {"tiny", "q8_0"}}) {
    SCOPED_TRACE(std::string(shape) + " " + type);
    const std::string file = model(shape, type);
    auto ref = open_tp(file, 1);
    auto tp = open_tp(file, 2);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    ASSERT_TRUE(tp.ok()) << tp.status().to_string();
    EXPECT_EQ(tp->model->n_tensor_parallel(), 2);
    EXPECT_EQ(tp->ctx->n_vocab(), ref->ctx->n_vocab());
    const auto want = run_sequence(*ref->ctx);
    const auto got = run_sequence(*tp->ctx);
    ASSERT_EQ(want.size(), 7u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("decode " + std::to_string(i));
      expect_close(got[i], want[i], static_cast<size_t>(ref->ctx->n_vocab()));
    }
  }
}

// Several sequences in one step over a paged cache, then a mixed pass (one sequence's prompt chunk
// with the others' decode tokens): each sequence's logits as the unsplit model's.
TEST_F(LlmTensorParallel, BatchedStepsOverAPagedCache) {
  // qwen2: every layer global; gemma3: local layers on the paged cache's sliding-window ring
  for (const auto& [shape, n_seq_max] :
       std::vector<std::pair<const char*, int>>{{"qwen2-tiny", 0}, {"gemma3-tiny", 4}}) {
    SCOPED_TRACE(shape);
    const std::string file = model(shape, "f32");
    auto ref = open_tp(file, 1, KvCacheKind::paged, n_seq_max);
    auto tp = open_tp(file, 2, KvCacheKind::paged, n_seq_max);
    ASSERT_TRUE(ref.ok() && tp.ok());
    EXPECT_EQ(tp->ctx->swa_full(), n_seq_max == 0);
    const auto tokens = test_tokens(12, ref->ctx->n_vocab(), 3);
    for (Context* ctx : {ref->ctx.get(), tp->ctx.get()})
      for (int seq = 0; seq < 3; ++seq) {
        DecodeOptions o;
        o.seq_id = seq;
        ASSERT_TRUE(ctx->decode(std::span(tokens).subspan(static_cast<size_t>(seq), 3 + seq), 0, o).ok());
      }
    for (int step = 0; step < 3; ++step) {
      std::vector<SeqTokens> seqs;
      for (int seq = 0; seq < 3; ++seq)
        seqs.push_back(
            {seq, 3 + seq + step, std::span(tokens).subspan(static_cast<size_t>(6 + seq + step), 1)});
      auto want = ref->ctx->decode_batch(seqs);
      ASSERT_TRUE(want.ok()) << want.status().to_string();
      const std::vector<float> w(want->begin(), want->end());
      auto got = tp->ctx->decode_batch(seqs);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      expect_close(std::vector<float>(got->begin(), got->end()), w, static_cast<size_t>(ref->ctx->n_vocab()));
      // each rank's part of the pass is timed; one device has no such entries
      const DecodeStats& st = tp->ctx->stats();
      ASSERT_EQ(st.tp_rank_busy_ns.size(), 2u);
      ASSERT_EQ(st.tp_rank_start_lag_ns.size(), 2u);
      EXPECT_GT(st.tp_rank_busy_ns[0], 0u);
      EXPECT_GT(st.tp_rank_busy_ns[1], 0u);
      EXPECT_TRUE(ref->ctx->stats().tp_rank_busy_ns.empty());
    }
    // a mixed pass: a new sequence's 2-token prompt chunk beside the others' decode tokens (5 in all: -ub)
    std::vector<SeqTokens> mixed;
    for (int seq = 0; seq < 3; ++seq)
      mixed.push_back({seq, 6 + seq, std::span(tokens).subspan(static_cast<size_t>(9 + seq), 1)});
    mixed.push_back({3, 0, std::span(tokens).first(2)});
    auto want = ref->ctx->decode_batch(mixed);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    const std::vector<float> w(want->begin(), want->end());
    auto got = tp->ctx->decode_batch(mixed);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(w.size(), 4u * static_cast<size_t>(ref->ctx->n_vocab()));
    expect_close(std::vector<float>(got->begin(), got->end()), w, static_cast<size_t>(ref->ctx->n_vocab()));
  }
}

// Tokens sampled in the graph of a split model (each rank gathers the vocabulary's logits by an
// all-reduce and samples alike) equal the host loop's on the same split model, greedy and sampled,
// with no logits read back; a soft-capped model (gemma2) and a plain one.
TEST_F(LlmTensorParallel, SamplesInTheGraphAsTheHostDoes) {
  for (const char* shape : {"tiny", "gemma2-tiny"}) {
    SCOPED_TRACE(shape);
    auto tp = open_tp(model(shape, "f32"), 2);
    ASSERT_TRUE(tp.ok()) << tp.status().to_string();
    Context& ctx = *tp->ctx;
    ASSERT_TRUE(ctx.supports_device_sampling());
    SamplerParams greedy;
    greedy.temperature = 0.0f;
    SamplerParams sampled;
    sampled.seed = 7;
    sampled.top_k = 20;
    sampled.top_p = 0.9f;
    sampled.min_p = 0.02f;
    sampled.temperature = 0.9f;
    for (const SamplerParams& sp : {greedy, sampled}) {
      SCOPED_TRACE(sp.temperature > 0 ? "sampled" : "greedy");
      std::vector<int32_t> runs[2];
      int n_device = 0;
      for (int device = 0; device < 2; ++device) {
        ctx.kv_cache_clear();
        auto sampler = Sampler::create(sp);
        ASSERT_TRUE(sampler.ok()) << sampler.status().to_string();
        std::vector<int32_t> history = test_tokens(5, ctx.n_vocab(), 21);
        auto logits = ctx.decode(history, 0);
        ASSERT_TRUE(logits.ok()) << logits.status().to_string();
        auto first = sampler->sample(*logits, history);
        ASSERT_TRUE(first.ok()) << first.status().to_string();
        int32_t next = *first;
        DecodeSampleOptions o;
        o.device = device == 1;
        for (int i = 0; i < 8; ++i) {
          history.push_back(next);
          runs[device].push_back(next);
          auto got = decode_and_sample(ctx, *sampler, std::span<const int32_t>(history).last(1),
                                       static_cast<int>(history.size()) - 1, history, o);
          ASSERT_TRUE(got.ok()) << got.status().to_string();
          if (device == 1) {
            n_device += got->on_device ? 1 : 0;
            EXPECT_EQ(ctx.stats().logits_bytes_read, 0u);
          }
          next = got->token;
        }
        runs[device].push_back(next);
      }
      EXPECT_EQ(runs[1], runs[0]);
      EXPECT_EQ(n_device, 8);
    }
  }
}

// Each rank's shard: its share of the heads and columns, its slice of the vocabulary, its own
// memory, and KV cache tensors over its KV heads.
TEST_F(LlmTensorParallel, EachRankHoldsItsSlice) {
  auto tp = open_tp(model("llama31-tiny", "f32"), 2);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  const detail::ModelImpl& m = tp->model->impl();
  ASSERT_EQ(m.shards.size(), 2u);
  const detail::KvCache& kv = detail::context_kv_cache(*tp->ctx);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const detail::Shard& s = m.shards[static_cast<size_t>(r)];
    EXPECT_EQ(s.hp.n_head * 2, m.hp.n_head);
    EXPECT_EQ(s.hp.n_head_kv * 2, m.hp.n_head_kv);
    EXPECT_EQ(s.hp.n_ff * 2, m.hp.n_ff);
    EXPECT_EQ(s.vocab_begin, r * static_cast<int64_t>(m.hp.n_vocab) / 2);
    EXPECT_EQ(s.w.output->ne[1] * 2, static_cast<int64_t>(m.hp.n_vocab));
    EXPECT_EQ(s.w.output, s.w.tok_embd);  // tied in the file: one slice of the vocabulary serves both
    EXPECT_EQ(s.w.tok_embd->ne[1] * 2, m.w.tok_embd->ne[1]);
    const detail::LayerWeights& l = s.w.layers[0];
    EXPECT_EQ(l.wq->ne[1] * 2, m.w.layers[0].wq->ne[1]);
    EXPECT_EQ(l.bq->ne[0] * 2, m.w.layers[0].bq->ne[0]);
    EXPECT_EQ(l.wo->ne[0] * 2, m.w.layers[0].wo->ne[0]);
    EXPECT_EQ(l.ffn_down->ne[0] * 2, m.w.layers[0].ffn_down->ne[0]);
    EXPECT_EQ(l.attn_norm->ne, m.w.layers[0].attn_norm->ne);
    EXPECT_EQ(l.wq->buffer, s.buffer.get());
    EXPECT_EQ(kv.k(0, r)->ne[2], static_cast<int64_t>(s.hp.n_head_kv));
    // rank r's wq rows are the file's rows [r * rows, (r + 1) * rows)
    const GgufTensorInfo* info = tp->model->gguf().find_tensor("blk.0.attn_q.weight");
    ASSERT_TRUE(info);
    std::vector<uint8_t> got(l.wq->nbytes());
    ASSERT_TRUE(tensor_read(l.wq, got.data(), 0, got.size()).ok());
    EXPECT_EQ(std::memcmp(got.data(), info->data + r * got.size(), got.size()), 0);
  }
  EXPECT_NE(kv.k(0, 0), kv.k(0, 1));
  EXPECT_NE(tp->model->summary().find("split over 2 cpu ranks"), std::string::npos) << tp->model->summary();
}

TEST_F(LlmTensorParallel, RefusesWhatCannotBeSplit) {
  {
    auto tp = open_tp(model("tiny", "f32"), 4);  // 2 KV heads
    ASSERT_FALSE(tp.ok());
    EXPECT_NE(tp.status().message().find("KV heads (2) to divide by 4"), std::string::npos)
        << tp.status().to_string();
  }
  {
    // q4_K blocks of 256 columns: the attention output's 256 columns cannot be halved on block boundaries
    auto tp = open_tp(model("small", "q4_K_M"), 2);
    ASSERT_FALSE(tp.ok());
    EXPECT_NE(tp.status().message().find("blk.0.attn_output.weight"), std::string::npos)
        << tp.status().to_string();
    EXPECT_NE(tp.status().message().find("whole blocks of 256"), std::string::npos)
        << tp.status().to_string();
  }
}

// The host group's all-reduce itself: every rank gets the rank-ordered sum, and an aborted group
// releases the waiting ranks with an error.
TEST(HostCommunicator, SumsAndAborts) {
  auto comms = make_host_communicators(3);
  ASSERT_EQ(comms.size(), 3u);
  std::vector<std::vector<float>> data = {{1.0f, 1e8f, -2.0f}, {2.0f, 1.0f, 0.5f}, {3.0f, -1e8f, 0.25f}};
  std::vector<std::vector<float>> out(3, std::vector<float>(3, -1.0f));
  std::vector<std::thread> threads;
  std::vector<Status> st(3);
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] { st[r] = comms[r]->all_reduce_host(data[r].data(), out[r].data(), 3); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].to_string();
    EXPECT_EQ(out[r], (std::vector<float>{6.0f, 1.0f, -1.25f}));  // summed in double: 1e8 + 1 - 1e8 = 1
  }
  threads.clear();
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] { st[r] = comms[r]->all_reduce_host(data[r].data(), out[r].data(), 3); });
  comms[2]->abort();
  for (auto& t : threads) t.join();
  EXPECT_EQ(st[0].code(), StatusCode::aborted);
  EXPECT_EQ(st[1].code(), StatusCode::aborted);
}

}  // namespace
}  // namespace loom::llm::testing
