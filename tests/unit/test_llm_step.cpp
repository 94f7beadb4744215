// The per-step graph of decoding: attention reads a bucketed KV extent (results equal the exact
// extent's bit for bit on the CPU, even with NaN in the padding), decode steps inside one bucket
// build graphs of one structure with the same addresses (what a replaying graph executor needs),
// and the step inputs reach the backend in one transfer per pass.
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "loom/planner.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

// ---- a CPU backend whose buffers count the writes they get ------------------------------------

struct WriteCounter {
  int writes = 0;
  size_t bytes = 0;
};

class CountingBuffer final : public Buffer {
 public:
  CountingBuffer(std::unique_ptr<Buffer> inner, BufferType& type, WriteCounter& counter)
      : inner_(std::move(inner)), type_(type), counter_(counter) {}
  void* base() override { return inner_->base(); }
  size_t size() const override { return inner_->size(); }
  BufferType& type() const override { return type_; }
  Status write(size_t offset, const void* src, size_t n) override {
    ++counter_.writes;
    counter_.bytes += n;
    return inner_->write(offset, src, n);
  }
  Status read(size_t offset, void* dst, size_t n) const override { return inner_->read(offset, dst, n); }
  Status fill(size_t offset, uint8_t value, size_t n) override { return inner_->fill(offset, value, n); }

 private:
  std::unique_ptr<Buffer> inner_;
  BufferType& type_;
  WriteCounter& counter_;
};

class CountingBufferType final : public BufferType {
 public:
  explicit CountingBufferType(WriteCounter& counter) : counter_(counter) {}
  const char* name() const override { return "counting-cpu"; }
  size_t alignment() const override { return cpu_buffer_type().alignment(); }
  bool is_host() const override { return true; }
  Result<std::unique_ptr<Buffer>> allocate(size_t size) override {
    auto b = cpu_buffer_type().allocate(size);
    if (!b) return b.status();
    return std::unique_ptr<Buffer>(new CountingBuffer(std::move(b.value()), *this, counter_));
  }

 private:
  WriteCounter& counter_;
};

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(int n_threads) : inner_(make_cpu_backend(n_threads)), type_(counter) {}
  const char* name() const override { return "counting-cpu"; }
  BufferType& buffer_type() override { return type_; }
  bool supports_op(const Tensor& node) const override { return inner_->supports_op(node); }
  Status compute(const Graph& g) override { return inner_->compute(g); }

  WriteCounter counter;

 private:
  std::unique_ptr<Backend> inner_;
  CountingBufferType type_;
};

// ---- helpers ----------------------------------------------------------------------------------

class LlmStep : public ModelFiles {};

std::unique_ptr<Context> make_context(const Model& model, int n_ctx, int n_batch, int bucket) {
  ContextParams p;
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  p.n_kv_bucket = bucket;
  auto c = Context::create(model, p);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c.value()) : nullptr;
}

// What one decode call left behind.
struct StepRecord {
  std::vector<float> logits;
  int n_kv = 0;
  uint64_t fingerprint = 0;
  int n_graph_builds = 0;
};

// Prefills `prompt` tokens then decodes the rest one at a time, recording every call.
std::vector<StepRecord> run_sequence(Context& ctx, const std::vector<int32_t>& tokens, int prompt,
                                     int pos0 = 0) {
  std::vector<StepRecord> rec;
  auto record = [&](std::span<const int32_t> t, int pos) {
    auto r = ctx.decode(t, pos);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return false;
    const DecodeStats& st = ctx.stats();
    rec.push_back(
        {std::vector<float>(r->begin(), r->end()), st.n_kv, st.graph_fingerprint, st.n_graph_builds});
    return true;
  };
  if (!record(std::span(tokens).first(static_cast<size_t>(prompt)), pos0)) return rec;
  for (size_t i = static_cast<size_t>(prompt); i < tokens.size(); ++i)
    if (!record(std::span(tokens).subspan(i, 1), pos0 + static_cast<int>(i))) break;
  return rec;
}

int round_up(int n, int b) { return (n + b - 1) / b * b; }

// ---- (a) bucketed extent == exact extent --------------------------------------------------------

// A short prompt and 20 decode steps that cross two buckets of 8 cells: the logits equal those of
// a context that reads exactly the used cells, bit for bit. The padding cells are masked (-inf) and
// the CPU kernel skips keys every head masks before touching K/V, with key blocks aligned the same
// way in both extents, so the sums run over the same terms in the same order. Gemma 2 covers the
// sliding-window mask. Then the sequence is rewound (cells 12.. hold stale K/V inside the bucket)
// and continued with other tokens: still equal.
TEST_F(LlmStep, BucketedExtentEqualsExact) {
  for (const char* shape : {"tiny", "qwen3-tiny", "gemma2-tiny"}) {
    SCOPED_TRACE(shape);
    auto backend = make_cpu_backend(2);
    auto m = Model::load(model(shape, "q8_0"), *backend, quiet_load());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto exact = make_context(**m, 64, 16, 1);
    auto bucketed = make_context(**m, 64, 16, 8);
    ASSERT_TRUE(exact && bucketed);
    const auto tokens = test_tokens(25, exact->n_vocab(), 5);
    const auto a = run_sequence(*exact, tokens, 5);
    const auto b = run_sequence(*bucketed, tokens, 5);
    ASSERT_EQ(a.size(), 21u);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE(i);
      const int used = 5 + static_cast<int>(i);
      EXPECT_EQ(a[i].n_kv, used);
      EXPECT_EQ(b[i].n_kv, round_up(used, 8));
      EXPECT_EQ(a[i].logits, b[i].logits);  // exact float equality
    }
    EXPECT_GT(nmse(a[0].logits, a[1].logits), 1e-3);  // the steps differ: not comparing constants

    const auto other = test_tokens(6, exact->n_vocab(), 9);
    for (Context* c : {exact.get(), bucketed.get()}) ASSERT_TRUE(c->kv_cache_seq_rm(0, 12).ok());
    const auto a2 = run_sequence(*exact, other, 2, 12);
    const auto b2 = run_sequence(*bucketed, other, 2, 12);
    ASSERT_EQ(a2.size(), 5u);
    ASSERT_EQ(b2.size(), a2.size());
    for (size_t i = 0; i < a2.size(); ++i) {
      SCOPED_TRACE(i);
      const int used = 14 + static_cast<int>(i);  // cells 12, 13 then one per step
      EXPECT_EQ(a2[i].n_kv, used);
      EXPECT_EQ(b2[i].n_kv, round_up(used, 8));  // past `used`: stale cells of the first run, masked
      EXPECT_EQ(a2[i].logits, b2[i].logits);
    }
  }
}

// The kernel-level reason the padding is harmless: flash_attn over n_kv cells plus padding cells
// holding NaN and infinities, masked with -inf, equals flash_attn over the n_kv cells alone.
TEST(LlmStepAttention, MaskedPaddingNeverContributes) {
  const int64_t d = 32, n_head = 4, n_head_kv = 2, n_q = 3, n_kv = 37, n_pad = 27;
  auto backend = make_cpu_backend(2);
  std::vector<std::vector<float>> outs;
  for (int64_t extent : {n_kv, n_kv + n_pad}) {
    Graph g;
    Tensor* q = g.input(DType::f32, {d, n_q, n_head, 1}, "q");
    Tensor* k = g.input(DType::f16, {d, extent, n_head_kv, 1}, "k");
    Tensor* v = g.input(DType::f16, {d, extent, n_head_kv, 1}, "v");
    Tensor* mask = g.input(DType::f32, {extent, n_q, 1, 1}, "mask");
    Tensor* out = flash_attn(g, q, k, v, mask, 0.125f);
    ASSERT_TRUE(g.status().ok()) << g.status().to_string();
    g.mark_output(out);
    auto alloc = allocate_graph(g, backend->buffer_type());
    ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();

    std::vector<float> qv(static_cast<size_t>(d * n_q * n_head));
    for (size_t i = 0; i < qv.size(); ++i) qv[i] = std::sin(0.37f * static_cast<float>(i));
    ASSERT_TRUE(tensor_from_floats(q, qv.data(), static_cast<int64_t>(qv.size())).ok());
    for (Tensor* t : {k, v}) {
      std::vector<float> x(static_cast<size_t>(t->nelements()));
      for (int64_t h = 0; h < n_head_kv; ++h)
        for (int64_t j = 0; j < extent; ++j)
          for (int64_t e = 0; e < d; ++e) {
            const float val =
                std::cos(0.11f * static_cast<float>(e + 7 * j + 131 * h) + (t == v ? 1.0f : 0.0f));
            const float pad = (j + e) % 3 == 0   ? std::numeric_limits<float>::quiet_NaN()
                              : (j + e) % 3 == 1 ? std::numeric_limits<float>::infinity()
                                                 : -std::numeric_limits<float>::infinity();
            x[static_cast<size_t>((h * extent + j) * d + e)] = j < n_kv ? val : pad;
          }
      ASSERT_TRUE(tensor_from_floats(t, x.data(), static_cast<int64_t>(x.size())).ok());
    }
    // causal over the real cells: query i sees cells [0, n_kv - n_q + i]
    std::vector<float> mv(static_cast<size_t>(extent * n_q));
    for (int64_t i = 0; i < n_q; ++i)
      for (int64_t j = 0; j < extent; ++j)
        mv[static_cast<size_t>(i * extent + j)] =
            j <= n_kv - n_q + i ? 0.0f : -std::numeric_limits<float>::infinity();
    ASSERT_TRUE(tensor_write(mask, mv.data(), 0, mv.size() * sizeof(float)).ok());
    ASSERT_TRUE(backend->compute(g).ok());
    auto o = tensor_to_floats(out);
    ASSERT_TRUE(o.ok());
    for (float x : *o) ASSERT_TRUE(std::isfinite(x));
    outs.push_back(*o);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_GT(std::inner_product(outs[0].begin(), outs[0].end(), outs[0].begin(), 0.0), 0.1);
}

// ---- (b) one structure per bucket ----------------------------------------------------------------

// Decode steps inside one bucket run graphs with identical ops, shapes, strides, parameters and
// data addresses (equal fingerprints; the graph of the step before is reused as is), a bucket
// boundary changes the structure, and running the same sequence again after clearing the cache
// rebuilds graphs with the very same fingerprints (plan_memory is deterministic and neither the
// arena nor the inputs buffer moves). With the exact extent every step differs.
TEST_F(LlmStep, OneStructurePerBucket) {
  auto backend = make_cpu_backend(2);
  auto m = Model::load(model("tiny", "q8_0"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto ctx = make_context(**m, 64, 16, 8);
  ASSERT_TRUE(ctx);
  const auto tokens = test_tokens(26, ctx->n_vocab(), 2);
  const int allocations = ctx->stats().n_arena_allocations;
  const auto rec = run_sequence(*ctx, tokens, 5);  // prompt: cells 0-4, then steps at n_kv 6..26
  ASSERT_EQ(rec.size(), 22u);
  for (size_t i = 2; i < rec.size(); ++i) {
    SCOPED_TRACE(i);
    const bool same_bucket = rec[i].n_kv == rec[i - 1].n_kv;
    EXPECT_EQ(same_bucket, (5 + i - 1) % 8 != 0);  // step i fills cell 4 + i
    EXPECT_EQ(rec[i].n_graph_builds, same_bucket ? 0 : 1);
    if (same_bucket)
      EXPECT_EQ(rec[i].fingerprint, rec[i - 1].fingerprint);
    else
      EXPECT_NE(rec[i].fingerprint, rec[i - 1].fingerprint);
  }
  EXPECT_NE(rec[0].fingerprint, rec[1].fingerprint);  // 5 tokens vs 1: another structure
  EXPECT_EQ(rec[1].n_graph_builds, 1);
  EXPECT_EQ(ctx->stats().n_arena_allocations, allocations);

  ctx->kv_cache_clear();
  const auto again = run_sequence(*ctx, tokens, 5);
  ASSERT_EQ(again.size(), rec.size());
  int rebuilt = 0;
  for (size_t i = 0; i < rec.size(); ++i) {
    EXPECT_EQ(again[i].fingerprint, rec[i].fingerprint);
    EXPECT_EQ(again[i].logits, rec[i].logits);
    rebuilt += again[i].n_graph_builds;
  }
  EXPECT_EQ(rebuilt, 5);  // the prompt pass and the steps entering buckets 8, 16, 24 and 32

  auto exact = make_context(**m, 64, 16, 1);
  ASSERT_TRUE(exact);
  const auto ex = run_sequence(*exact, std::vector<int32_t>(tokens.begin(), tokens.begin() + 9), 5);
  ASSERT_EQ(ex.size(), 5u);
  for (size_t i = 2; i < ex.size(); ++i) {
    EXPECT_NE(ex[i].fingerprint, ex[i - 1].fingerprint);
    EXPECT_EQ(ex[i].n_graph_builds, 1);
  }
}

// The structures of a 1,000-token generation with the default bucket (256): the 8-token prompt
// pass, then one per bucket the decode steps reach (extents 9 .. 1,008: 4 buckets), so 5 in all
// instead of 1,001, and 4 graphs built for the 1,000 steps. The arena is never reallocated.
TEST_F(LlmStep, ThousandTokensMakeFiveStructures) {
  auto backend = make_cpu_backend(2);
  auto m = Model::load(model("tiny", "q8_0"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto ctx = make_context(**m, 1024, 64, ContextParams{}.n_kv_bucket);
  ASSERT_TRUE(ctx);
  const int allocations = ctx->stats().n_arena_allocations;
  std::vector<int32_t> seq = test_tokens(8, ctx->n_vocab(), 4);
  auto r = ctx->decode(seq, 0);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::map<uint64_t, int> structures;  // fingerprint -> passes
  std::map<int, std::set<uint64_t>> by_n_kv;
  ++structures[ctx->stats().graph_fingerprint];
  int builds = 0;
  for (int step = 0; step < 1000; ++step) {
    const int32_t next = argmax_of(*r);
    r = ctx->decode(std::span(&next, 1), static_cast<int>(seq.size()));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    seq.push_back(next);
    ++structures[ctx->stats().graph_fingerprint];
    by_n_kv[ctx->stats().n_kv].insert(ctx->stats().graph_fingerprint);
    builds += ctx->stats().n_graph_builds;
  }
  EXPECT_EQ(structures.size(), 5u);
  EXPECT_EQ(builds, 4);  // one graph per bucket; the other 996 steps reuse it
  ASSERT_EQ(by_n_kv.size(), 4u);
  int n_kv = 256;
  for (const auto& [k, prints] : by_n_kv) {
    EXPECT_EQ(k, n_kv);
    EXPECT_EQ(prints.size(), 1u);
    n_kv += 256;
  }
  EXPECT_EQ(ctx->stats().n_arena_allocations, allocations);
}

// ---- (c) one input transfer per pass -------------------------------------------------------------

// Every write into the backend's buffers during a decode is counted: a chunked prefill makes one
// per pass, a decode step exactly one, with and without the sliding-window mask. The host times of
// the pass are recorded.
TEST_F(LlmStep, InputsGoInOneTransferPerPass) {
  for (const char* shape : {"tiny", "gemma2-tiny"}) {
    SCOPED_TRACE(shape);
    CountingBackend backend(2);
    auto m = Model::load(model(shape, "q8_0"), backend, quiet_load());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto ctx = make_context(**m, 64, 4, 16);
    ASSERT_TRUE(ctx);
    const auto tokens = test_tokens(14, ctx->n_vocab(), 6);

    backend.counter = {};
    auto r = ctx->decode(std::span(tokens).first(10), 0);  // passes of 4 + 4 + 2 tokens
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(ctx->stats().n_steps, 3);
    EXPECT_EQ(ctx->stats().n_input_writes, 3);
    EXPECT_EQ(backend.counter.writes, 3);

    for (int i = 10; i < 14; ++i) {
      backend.counter = {};
      r = ctx->decode(std::span(tokens).subspan(static_cast<size_t>(i), 1), i);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(backend.counter.writes, 1);
      EXPECT_EQ(ctx->stats().n_input_writes, 1);
      // tokens, positions and cells (64-byte aligned) and a 16-float mask; gemma2 also the window
      // cells and the local layers' mask over its ring of 4 + 4 - 1 cells
      const size_t extra = std::string(shape) == "gemma2-tiny" ? 2 : 0;
      EXPECT_EQ(backend.counter.bytes, 3 * 64 + 64 + extra * 64);
      // the first step builds its graph (the prefill's shape differs); the others reuse it
      EXPECT_EQ(ctx->stats().n_graph_builds, i == 10 ? 1 : 0);
      EXPECT_EQ(ctx->stats().host_build_ns > 0, i == 10);
      EXPECT_EQ(ctx->stats().host_alloc_ns > 0, i == 10);
      EXPECT_GT(ctx->stats().host_inputs_ns, 0u);
    }
  }
}

// A prompt longer than n_batch runs in chunks and reports each one (loom run's progress line).
TEST_F(LlmStep, PromptChunksReportProgress) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("tiny", "q8_0"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto ctx = make_context(**m, 32, 4, 16);
  ASSERT_TRUE(ctx);
  const auto tokens = test_tokens(10, ctx->n_vocab(), 3);
  std::vector<std::pair<size_t, size_t>> calls;
  DecodeOptions o;
  o.on_chunk = [&](size_t done, size_t total) { calls.emplace_back(done, total); };
  auto r = ctx->decode(tokens, 0, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::vector<std::pair<size_t, size_t>> expected = {{4, 10}, {8, 10}, {10, 10}};
  EXPECT_EQ(calls, expected);
  EXPECT_EQ(ctx->stats().n_steps, 3);
}

TEST_F(LlmStep, BucketMustBePositive) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("tiny", "f32"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ContextParams p;
  p.n_ctx = 16;
  p.n_kv_bucket = 0;
  auto c = Context::create(**m, p);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(c.status().message().find("n_kv_bucket 0"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace loom::llm::testing
