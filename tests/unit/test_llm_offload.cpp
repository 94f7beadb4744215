// Layer offload (llama.cpp's -ngl split) exercised with two CPU backends: the logits of a model split
// between a main and an offload backend are bit-identical to one backend's, over a prompt and
// decode steps, and each layer's weights and KV cache live in its backend's memory.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "llm/llm_kv_cache.h"
#include "llm/llm_model_impl.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

// Host memory under a buffer type object of its own, so that a test can tell offloaded tensors from
// the main backend's by Tensor::buffer->type(). 256-byte alignment, unlike the CPU's 64, as a
// device's would differ.
class TestBuffer final : public Buffer {
 public:
  TestBuffer(BufferType& type, void* data, size_t size) : type_(type), data_(data), size_(size) {}
  ~TestBuffer() override { std::free(data_); }
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  BufferType& type() const override { return type_; }
  Status write(size_t offset, const void* src, size_t n) override {
    if (offset > size_ || n > size_ - offset)
      return make_error(StatusCode::invalid_argument, "write past end");
    std::memcpy(static_cast<uint8_t*>(data_) + offset, src, n);
    return {};
  }
  Status read(size_t offset, void* dst, size_t n) const override {
    if (offset > size_ || n > size_ - offset)
      return make_error(StatusCode::invalid_argument, "read past end");
    std::memcpy(dst, static_cast<const uint8_t*>(data_) + offset, n);
    return {};
  }
  Status fill(size_t offset, uint8_t value, size_t n) override {
    if (offset > size_ || n > size_ - offset)
      return make_error(StatusCode::invalid_argument, "fill past end");
    std::memset(static_cast<uint8_t*>(data_) + offset, value, n);
    return {};
  }

 private:
  BufferType& type_;
  void* data_;
  size_t size_;
};

class TestBufferType final : public BufferType {
 public:
  static constexpr size_t kAlign = 256;
  const char* name() const override { return "test-offload"; }
  size_t alignment() const override { return kAlign; }
  bool is_host() const override { return true; }
  Result<std::unique_ptr<Buffer>> allocate(size_t size) override {
    const size_t rounded = (std::max<size_t>(size, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p) return make_error(StatusCode::out_of_memory, "test-offload: {} bytes", size);
    // Garbage, not zeros, where nothing was written yet: a missed input write shows up.
    std::memset(p, 0xa5, rounded);
    return std::unique_ptr<Buffer>(new TestBuffer(*this, p, size));
  }
};

// A CPU backend (from the registry) computing on TestBufferType memory.
class TestOffloadBackend final : public Backend {
 public:
  explicit TestOffloadBackend(int n_threads) {
    BackendOptions o;
    o.n_threads = n_threads;
    auto cpu = create_backend("cpu", o);
    EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
    if (cpu.ok()) cpu_ = std::move(cpu.value());
  }
  const char* name() const override { return "test-offload"; }
  BufferType& buffer_type() override { return type_; }
  bool supports_op(const Tensor& node) const override { return cpu_->supports_op(node); }
  Status compute(const Graph& g) override { return cpu_->compute(g); }

 private:
  TestBufferType type_;
  std::unique_ptr<Backend> cpu_;
};

enum class OffloadKind { distinct_type, plain_cpu };

struct SplitModel {
  std::unique_ptr<Backend> main;
  std::unique_ptr<Backend> offload;
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

constexpr int kThreads = 2;

std::unique_ptr<Backend> cpu_backend() {
  BackendOptions o;
  o.n_threads = kThreads;
  auto b = create_backend("cpu", o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b.value()) : nullptr;
}

// n_offload 0: one backend. Contexts of 64 cells, -ub 5, buckets of 4 cells, so a 7-token prompt
// is two chunks and the decode steps cross bucket boundaries (graphs rebuilt and reused).
SplitModel open_model(const std::string& file, int n_offload, OffloadKind kind = OffloadKind::distinct_type) {
  SplitModel s;
  s.main = cpu_backend();
  if (!s.main) return s;
  ModelLoadOptions lo = quiet_load();
  if (n_offload > 0) {
    if (kind == OffloadKind::distinct_type)
      s.offload = std::make_unique<TestOffloadBackend>(kThreads);
    else
      s.offload = cpu_backend();
    lo.offload_backend = s.offload.get();
    lo.n_offload_layers = n_offload;
  }
  auto m = Model::load(file, *s.main, lo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return s;
  s.model = std::move(m.value());
  ContextParams cp;
  cp.n_ctx = 64;
  cp.n_batch = 5;
  cp.n_kv_bucket = 4;
  auto c = Context::create(*s.model, cp);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (c.ok()) s.ctx = std::move(c.value());
  return s;
}

// What one decode returned, and the bookkeeping that must match between runs.
struct StepResult {
  std::vector<float> logits;
  int n_steps = 0;
  int n_graph_builds = 0;
  int n_input_writes = 0;
  int n_arena_allocations = 0;
};

// A 7-token prompt (all logits, two chunks), then 6 one-token steps.
std::vector<StepResult> run_sequence(Context& ctx) {
  const auto tokens = test_tokens(13, ctx.n_vocab(), 11);
  const int n_prompt = 7;
  std::vector<StepResult> out;
  DecodeOptions all;
  all.all_logits = true;
  auto r = ctx.decode(std::span(tokens).first(n_prompt), 0, all);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return out;
  auto record = [&](std::span<const float> l) {
    const DecodeStats& st = ctx.stats();
    out.push_back({std::vector<float>(l.begin(), l.end()), st.n_steps, st.n_graph_builds, st.n_input_writes,
                   st.n_arena_allocations});
  };
  record(*r);
  for (int i = n_prompt; i < static_cast<int>(tokens.size()); ++i) {
    auto s = ctx.decode(std::span(tokens).subspan(static_cast<size_t>(i), 1), i);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return out;
    record(*s);
  }
  return out;
}

class LlmOffload : public ModelFiles {};

// The split run computes the same kernels on the same values in the same order as the single-backend
// run (the hidden state crosses as f32 bytes), so its logits must match bit for bit.
void expect_split_matches(const std::string& file, int n_offload, OffloadKind kind) {
  SplitModel ref = open_model(file, 0);
  SplitModel split = open_model(file, n_offload, kind);
  ASSERT_TRUE(ref.ctx && split.ctx);
  ASSERT_EQ(split.model->n_offload_layers(), n_offload);
  // one arena per backend, sized at creation
  EXPECT_EQ(ref.ctx->stats().n_arena_allocations, 1);
  EXPECT_EQ(split.ctx->stats().n_arena_allocations, 2);
  const std::vector<StepResult> want = run_sequence(*ref.ctx);
  const std::vector<StepResult> got = run_sequence(*split.ctx);
  ASSERT_EQ(want.size(), 7u);
  ASSERT_EQ(got.size(), want.size());
  const size_t n_vocab = static_cast<size_t>(ref.ctx->n_vocab());
  EXPECT_EQ(want[0].logits.size(), 7 * n_vocab);
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("decode " + std::to_string(i));
    ASSERT_EQ(got[i].logits.size(), want[i].logits.size());
    // real logits: finite, not all equal
    float lo = want[i].logits[0], hi = lo;
    for (float v : want[i].logits) {
      ASSERT_TRUE(std::isfinite(v));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GT(hi - lo, 0.1f);
    EXPECT_EQ(std::memcmp(got[i].logits.data(), want[i].logits.data(), want[i].logits.size() * sizeof(float)),
              0)
        << "NMSE " << nmse(got[i].logits, want[i].logits);
    // the same passes and graph builds; one inputs transfer per pass and backend
    EXPECT_EQ(got[i].n_steps, want[i].n_steps);
    EXPECT_EQ(got[i].n_graph_builds, want[i].n_graph_builds);
    EXPECT_EQ(want[i].n_input_writes, want[i].n_steps);
    EXPECT_EQ(got[i].n_input_writes, 2 * got[i].n_steps);
  }
  // some decode steps reused the previous graphs, some rebuilt them (bucket boundaries)
  int reused = 0, rebuilt = 0;
  for (size_t i = 1; i < got.size(); ++i) (got[i].n_graph_builds ? rebuilt : reused) += 1;
  EXPECT_GT(reused, 0);
  EXPECT_GT(rebuilt, 0);
  // the all-logits prompt may grow an arena; the decode steps never do
  EXPECT_EQ(got.back().n_arena_allocations, got[0].n_arena_allocations);
  EXPECT_EQ(want.back().n_arena_allocations, want[0].n_arena_allocations);
  EXPECT_GE(split.ctx->kv_cache_bytes(), ref.ctx->kv_cache_bytes());
}

TEST_F(LlmOffload, SplitLogitsAreBitIdentical) {
  for (const char* shape : {"tiny", "qwen3-tiny", "gemma2-tiny", "gemma3-tiny"}) {
    const int n_layer = find_synth_shape(shape)->n_layer;
    std::vector<int> counts = {1};
    if (n_layer - 1 > 1) counts.push_back(n_layer - 1);
    counts.push_back(n_layer);  // every layer: the main backend only embeds
    for (int n : counts) {
      SCOPED_TRACE(std::string(shape) + " -ngl " + std::to_string(n));
      expect_split_matches(model(shape, "f32"), n, OffloadKind::distinct_type);
    }
  }
}

// Quantized weights (copied, not mapped, on the offload side), and two plain CPU backends from the
// registry as main and offload.
TEST_F(LlmOffload, SplitLogitsQuantizedAndPlainCpu) {
  {
    SCOPED_TRACE("tiny q8_0, test offload backend");
    expect_split_matches(model("tiny", "q8_0"), 1, OffloadKind::distinct_type);
  }
  {
    SCOPED_TRACE("qwen2-tiny q4_K_M, two cpu backends");
    expect_split_matches(model("qwen2-tiny", "q4_K_M"), 1, OffloadKind::plain_cpu);
  }
}

// Expected home of a weight: the offload backend for the offloaded layers and the output head.
bool offloaded_weight(const std::string& name, int first_offload) {
  if (name.rfind("output", 0) == 0) return true;  // output.weight, output_norm.weight, the tied copy
  if (name.rfind("blk.", 0) != 0) return false;
  return std::atoi(name.c_str() + 4) >= first_offload;
}

void expect_placement(const Model& model, const Context& ctx, Backend& main, Backend& offload,
                      int n_offload) {
  const detail::ModelImpl& m = model.impl();
  const int n_layer = static_cast<int>(m.hp.n_layer);
  const int first = n_layer - n_offload;
  EXPECT_EQ(model.offload_backend(), &offload);
  EXPECT_EQ(model.n_offload_layers(), n_offload);
  const BufferType* main_type = &cpu_buffer_type();  // the mapping's view
  const BufferType* off_type = &offload.buffer_type();
  ASSERT_NE(main_type, off_type);
  int n_main = 0, n_off = 0;
  for (const Tensor* t : m.weight_tensors.leafs()) {
    SCOPED_TRACE(t->name);
    ASSERT_TRUE(t->buffer && t->data);
    const bool off = offloaded_weight(t->name, first) || t->name.rfind("rope_freqs.weight (offload)", 0) == 0;
    EXPECT_EQ(&t->buffer->type(), off ? off_type : main_type);
    (off ? n_off : n_main) += 1;
  }
  EXPECT_GT(n_main, 0);
  EXPECT_GT(n_off, 0);
  EXPECT_EQ(&m.w.tok_embd->buffer->type(), main_type);
  EXPECT_EQ(&m.w.output->buffer->type(), off_type);
  EXPECT_EQ(&m.w.output_norm->buffer->type(), off_type);
  for (int il = 0; il < n_layer; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const BufferType* want = il >= first ? off_type : main_type;
    const detail::LayerWeights& l = m.w.layers[il];
    EXPECT_EQ(&l.wq->buffer->type(), want);
    EXPECT_EQ(&l.ffn_down->buffer->type(), want);
    EXPECT_EQ(&l.attn_norm->buffer->type(), want);
    if (m.w.rope_freqs) {
      EXPECT_EQ(&l.rope_freqs->buffer->type(), want);
    }
    const detail::KvCache& kv = detail::context_kv_cache(ctx);
    EXPECT_EQ(&kv.k(il)->buffer->type(), il >= first ? off_type : &main.buffer_type());
    EXPECT_EQ(&kv.v(il)->buffer->type(), il >= first ? off_type : &main.buffer_type());
  }
  EXPECT_NE(model.summary().find(std::to_string(n_offload) + " of " + std::to_string(n_layer) +
                                 " layers on " + offload.name()),
            std::string::npos)
      << model.summary();
}

// Untied output, and tied output (qwen2-tiny: the head's copy of token_embd), on either split.
TEST_F(LlmOffload, WeightsAndCacheLiveWhereTheirLayerRuns) {
  for (const char* shape : {"tiny", "qwen2-tiny", "gemma2-tiny"}) {
    const int n_layer = find_synth_shape(shape)->n_layer;
    for (int n : {1, n_layer - 1}) {
      SCOPED_TRACE(std::string(shape) + " -ngl " + std::to_string(n));
      SplitModel s = open_model(model(shape, "f32"), n);
      ASSERT_TRUE(s.ctx);
      expect_placement(*s.model, *s.ctx, *s.main, *s.offload, n);
      const detail::ModelImpl& m = s.model->impl();
      const bool tied = find_synth_shape(shape)->tied_output;
      EXPECT_EQ(s.model->gguf().find_tensor("output.weight") == nullptr, tied);
      EXPECT_NE(m.w.output, m.w.tok_embd);
      if (tied) {  // the copy holds the embeddings' bytes
        std::vector<uint8_t> a(m.w.tok_embd->nbytes()), b(m.w.output->nbytes());
        ASSERT_EQ(a.size(), b.size());
        ASSERT_TRUE(tensor_read(m.w.tok_embd, a.data(), 0, a.size()).ok());
        ASSERT_TRUE(tensor_read(m.w.output, b.data(), 0, b.size()).ok());
        EXPECT_EQ(a, b);
      }
    }
  }
}

// A model with rope_freqs (Llama 3.1 style): each side reads its own copy, and the split still
// matches bit for bit.
TEST_F(LlmOffload, RopeFreqsCopiedToTheOffloadBackend) {
  const std::string src = model("tiny", "f32");
  const std::string dst = path("tiny-rope-freqs.gguf");
  const SynthShape& sh = *find_synth_shape("tiny");
  Rewrite r;
  r.add = [&](GgufWriter& w, const GgufFile&) -> Status {
    const std::vector<float> f = llama3_rope_freq_factors(sh.head_dim, sh.rope_base, 8.0f);
    const int64_t ne[1] = {static_cast<int64_t>(f.size())};
    return w.add_tensor(std::string("rope_freqs.weight"), DType::f32, ne, f.data());
  };
  ASSERT_TRUE(rewrite_gguf(src, dst, r).ok());
  SplitModel s = open_model(dst, 1);
  ASSERT_TRUE(s.ctx);
  const detail::ModelImpl& m = s.model->impl();
  ASSERT_NE(m.w.rope_freqs, nullptr);
  EXPECT_EQ(m.w.layers[0].rope_freqs, m.w.rope_freqs);
  EXPECT_NE(m.w.layers[1].rope_freqs, m.w.rope_freqs);
  expect_placement(*s.model, *s.ctx, *s.main, *s.offload, 1);
  expect_split_matches(dst, 1, OffloadKind::distinct_type);
  // the factors change the logits (else the copy would not be tested)
  SplitModel plain = open_model(src, 0), with = open_model(dst, 0);
  ASSERT_TRUE(plain.ctx && with.ctx);
  const std::vector<float> a = run_sequence(*with.ctx)[0].logits, b = run_sequence(*plain.ctx)[0].logits;
  ASSERT_EQ(a.size(), b.size());
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST_F(LlmOffload, LoadOptions) {
  const std::string file = model("tiny", "f32");
  auto main = cpu_backend();
  TestOffloadBackend offload(kThreads);
  ModelLoadOptions o = quiet_load();
  o.offload_backend = &offload;
  o.n_offload_layers = -1;
  auto bad = Model::load(file, *main, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  // more layers than the model has: all of them
  o.n_offload_layers = 99;
  auto all = Model::load(file, *main, o);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ((*all)->n_offload_layers(), 2);
  EXPECT_NE((*all)->summary().find("all 2 layers"), std::string::npos) << (*all)->summary();
  // 0 layers, or no backend: nothing offloaded, the summary as before
  o.n_offload_layers = 0;
  auto none = Model::load(file, *main, o);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->n_offload_layers(), 0);
  EXPECT_EQ((*none)->offload_backend(), nullptr);
  EXPECT_EQ((*none)->summary().find("layers on"), std::string::npos);
  o.offload_backend = nullptr;
  o.n_offload_layers = 1;
  auto no_backend = Model::load(file, *main, o);
  ASSERT_TRUE(no_backend.ok());
  EXPECT_EQ((*no_backend)->n_offload_layers(), 0);
}

// open_session with an offload backend by registry name.
TEST_F(LlmOffload, OpenSessionSplits) {
  SessionParams p;
  p.model_path = model("tiny", "f32");
  p.n_threads = kThreads;
  p.n_ctx = 32;
  p.progress = false;
  p.print_summary = false;
  p.offload_backend = "cpu";
  p.n_offload_layers = 1;
  auto s = open_session(p);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_TRUE(s->offload_backend);
  EXPECT_EQ(s->model->offload_backend(), s->offload_backend.get());
  EXPECT_EQ(s->model->n_offload_layers(), 1);
  const auto tokens = test_tokens(4, s->context->n_vocab());
  auto r = s->context->decode(tokens, 0);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(s->context->stats().n_input_writes, 2);
  p.offload_backend = "no-such-backend";
  EXPECT_FALSE(open_session(p).ok());
}

}  // namespace
}  // namespace loom::llm::testing
