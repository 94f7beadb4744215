// BatchGenerator::set_device_sampling: the tokens sampled in the step's graph (top_k +
// sample_tokens on the CPU backend) equal the host sampler's, token for token, for greedy and
// sampled sequences (top-k, top-p, min-p, temperature, fixed seeds), alone and batched, in one pass
// or several, with an enqueued prompt riding in the pass, on a sliding-window ring too; sequences
// the device cannot sample exactly (penalties, top-k off) or kept on the host (set_host_sampling)
// go to the host, and no logits come back for the others. decode_and_sample (one sequence,
// `loom run`'s steps) likewise, on a contiguous cache and its sliding-window ring; a NaN row is the
// host's error.
#include <limits>
#include <string>

#include "loom/llm_batch.h"
#include "loom/llm_sampling.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

class LlmBatchDeviceSampling : public ModelFiles {};

LoadedModel open_paged(int n_ctx, int n_batch) {
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_batch = n_batch;
  cp.kv_cache = KvCacheKind::paged;
  cp.kv_block_size = 16;
  return open_cpu_model(LOOM_BUILTIN_MODEL_Q8_0, 2, cp);
}

SamplerParams config(int s) {
  SamplerParams sp;  // llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
  sp.seed = 1000 + static_cast<uint32_t>(s);
  switch (s % 8) {
    case 0:
      sp.temperature = 0.0f;
      break;  // greedy
    case 1:
      break;
    case 2:
      sp.top_k = 5, sp.temperature = 1.5f, sp.top_p = 1.0f, sp.min_p = 0.0f;
      break;
    case 3:
      sp.top_k = 200, sp.temperature = 2.0f, sp.top_p = 0.5f, sp.min_p = 0.0f;
      break;
    case 4:
      sp.top_k = 64, sp.temperature = 1.2f, sp.top_p = 1.0f, sp.min_p = 0.2f, sp.min_keep = 3;
      break;
    case 5:
      sp.penalties.repeat = 1.3f;
      break;  // host: penalties
    case 6:
      sp.top_k = 0, sp.temperature = 1.0f;
      break;  // host: top-k off
    case 7:
      sp.top_k = 1000, sp.temperature = 3.0f, sp.top_p = 0.9f;
      break;
  }
  return sp;
}

bool on_device(int s) { return s % 8 != 5 && s % 8 != 6; }

struct Generated {
  std::vector<std::vector<int32_t>> tokens;
  int n_device = 0, n_host = 0;
  uint64_t logits_bytes = 0;
};

// `which` sequences (configs and prompts by index), the last one enqueued when `enqueue_last`.
Generated generate(Context& ctx, const std::vector<int>& which, bool device, int n_steps,
             bool enqueue_last = false) {
  BatchGenerator gen(ctx);
  gen.set_device_sampling(device);
  std::vector<int> ids;
  for (size_t i = 0; i < which.size(); ++i) {
    const int s = which[i];
    std::vector<int32_t> prompt = test_tokens(3 + (s * 5) % 17, ctx.n_vocab(), 500 + s);
    prompt[0] = 0;
    auto id = enqueue_last && i + 1 == which.size() ? gen.enqueue(prompt, config(s), 4)
                                                    : gen.add(prompt, config(s));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  Generated r;
  for (int i = 0; i < n_steps; ++i) {
    auto step = gen.step();
    EXPECT_TRUE(step.ok()) << step.status().to_string();
    r.n_device += gen.last_step().n_device_sampled;
    r.n_host += gen.last_step().n_host_sampled;
    r.logits_bytes += gen.last_step().logits_bytes_read;
  }
  for (int id : ids) {
    auto g = gen.generated(id);
    r.tokens.emplace_back(g.begin(), g.end());
  }
  ctx.kv_cache_clear();
  return r;
}

TEST_F(LlmBatchDeviceSampling, TokensEqualTheHostSampler) {
  auto l = open_paged(4096, 64);
  ASSERT_TRUE(l.ctx);
  std::vector<int> all;
  for (int s = 0; s < 16; ++s) all.push_back(s);
  const int n_steps = 12;
  const Generated host = generate(*l.ctx, all, false, n_steps);
  const Generated dev = generate(*l.ctx, all, true, n_steps);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_EQ(host.n_device, 0);
  int n_on_device = 0;
  for (int s : all) n_on_device += on_device(s);
  EXPECT_EQ(n_on_device, 12);  // configs 5 and 6 of each 8 go to the host
  EXPECT_EQ(dev.n_device, n_on_device * n_steps);
  EXPECT_EQ(dev.n_host, (16 - n_on_device) * n_steps);
  // Only the host-sampled sequences' rows come back.
  const uint64_t row = static_cast<uint64_t>(l.ctx->n_vocab()) * sizeof(float);
  EXPECT_EQ(host.logits_bytes, 16 * n_steps * row);
  EXPECT_EQ(dev.logits_bytes, 4 * n_steps * row);
  // Sampled sequences do sample: different seeds of one config differ somewhere.
  EXPECT_NE(host.tokens[1], host.tokens[9]);

  // Each sequence alone, on the device, gives what it gives among the others.
  for (int s : {0, 1, 3, 4, 5, 7})
    EXPECT_EQ(generate(*l.ctx, {s}, true, n_steps).tokens[0], host.tokens[static_cast<size_t>(s)]) << s;
}

// A model split over two CPU ranks (tensor parallelism: each rank gathers the vocabulary's logits in
// the graph, then samples): batched steps with mixed passes give the host sampler's tokens, and only
// the host-sampled sequences' rows come back.
TEST_F(LlmBatchDeviceSampling, TensorParallelTokensEqualTheHostSampler) {
  std::vector<std::unique_ptr<Backend>> ranks;
  ModelLoadOptions lo = quiet_load();
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(make_cpu_backend(1));
    lo.tensor_parallel.push_back(ranks.back().get());
  }
  auto m = Model::load(LOOM_BUILTIN_MODEL_Q8_0, *ranks[0], lo);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ((*m)->n_tensor_parallel(), 2);
  ContextParams cp;
  cp.n_ctx = 1024;
  cp.n_batch = 16;
  cp.kv_cache = KvCacheKind::paged;
  cp.kv_block_size = 16;
  auto c = Context::create(**m, cp);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Context& ctx = **c;
  ASSERT_TRUE(ctx.supports_device_sampling());
  std::vector<int> some;
  for (int s = 0; s < 8; ++s) some.push_back(s);
  const int n_steps = 6;
  const Generated host = generate(ctx, some, false, n_steps, true);
  const Generated dev = generate(ctx, some, true, n_steps, true);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_GT(dev.n_device, 0);
  EXPECT_LT(dev.logits_bytes, host.logits_bytes);
}

// Several passes per step (n_batch 8 for 12 sequences) and an enqueued prompt whose chunks ride in
// the running sequences' pass and whose first token is sampled there.
TEST_F(LlmBatchDeviceSampling, SeveralPassesAndMixedChunks) {
  auto l = open_paged(4096, 8);
  ASSERT_TRUE(l.ctx);
  std::vector<int> some;
  for (int s = 0; s < 12; ++s) some.push_back(s);
  EXPECT_EQ(generate(*l.ctx, some, true, 8).tokens, generate(*l.ctx, some, false, 8).tokens);
  auto m = open_paged(4096, 32);
  ASSERT_TRUE(m.ctx);
  const std::vector<int> mixed = {0, 1, 2, 3, 4, 9};  // 9 enqueued, in chunks of 4
  EXPECT_EQ(generate(*m.ctx, mixed, true, 10, true).tokens, generate(*m.ctx, mixed, false, 10, true).tokens);
}

// A sequence marked for the host keeps its logits every step while the others are sampled in the
// graph; its tokens are unchanged, and so are the others'.
TEST_F(LlmBatchDeviceSampling, HostSampledSequenceKeepsItsLogits) {
  auto l = open_paged(4096, 64);
  ASSERT_TRUE(l.ctx);
  const std::vector<int> which = {0, 1, 2, 9};  // 9 enqueued: its first token comes from a mixed pass
  const Generated host = generate(*l.ctx, which, false, 8, true);
  BatchGenerator gen(*l.ctx);
  gen.set_device_sampling(true);
  std::vector<int> ids;
  for (size_t i = 0; i < which.size(); ++i) {
    std::vector<int32_t> prompt = test_tokens(3 + (which[i] * 5) % 17, l.ctx->n_vocab(), 500 + which[i]);
    prompt[0] = 0;
    auto id =
        i + 1 == which.size() ? gen.enqueue(prompt, config(which[i]), 4) : gen.add(prompt, config(which[i]));
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  ASSERT_TRUE(gen.set_host_sampling(ids[1], true).ok());
  ASSERT_TRUE(gen.set_host_sampling(ids[3], true).ok());
  EXPECT_FALSE(gen.set_host_sampling(99, true).ok());
  const size_t n_vocab = static_cast<size_t>(l.ctx->n_vocab());
  bool late_seen = false;
  for (int step = 0; step < 8; ++step) {
    auto got = gen.step();
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(gen.logits(ids[0]).size(), 0u) << step;  // sampled in the graph
    EXPECT_EQ(gen.logits(ids[2]).size(), 0u) << step;
    EXPECT_EQ(gen.logits(ids[1]).size(), n_vocab) << step;  // kept on the host
    const bool late = !gen.prefilling(ids[3]);
    if (late) {
      EXPECT_EQ(gen.logits(ids[3]).size(), n_vocab) << step;
    }
    late_seen |= late;
    EXPECT_EQ(gen.last_step().n_device_sampled, 2) << step;
    EXPECT_EQ(gen.last_step().n_host_sampled, late ? 2 : 1) << step;
  }
  EXPECT_TRUE(late_seen);
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto g = gen.generated(ids[i]);
    EXPECT_EQ(std::vector<int32_t>(g.begin(), g.end()), host.tokens[i]) << i;
  }
}

// Several sequences on a paged cache with a sliding-window ring (gemma3: local layers of 4
// positions): the graph's tokens equal the host's.
TEST_F(LlmBatchDeviceSampling, PagedSlidingWindowRing) {
  ContextParams cp;
  cp.n_ctx = 512;
  cp.n_batch = 16;
  cp.kv_cache = KvCacheKind::paged;
  cp.kv_block_size = 4;
  cp.n_seq_max = 6;
  auto l = open_cpu_model(model("gemma3-tiny", "f32"), 2, cp);
  ASSERT_TRUE(l.ctx);
  ASSERT_FALSE(l.ctx->swa_full());
  ASSERT_TRUE(l.ctx->supports_device_sampling());
  const std::vector<int> which = {0, 1, 2, 4, 5};
  const Generated dev = generate(*l.ctx, which, true, 12, true);
  EXPECT_EQ(dev.tokens, generate(*l.ctx, which, false, 12, true).tokens);
  EXPECT_GT(dev.n_device, 0);
}

// ---- one sequence: decode_and_sample -----------------------------------------------------------

enum class Loop { plain, host, device };

struct Single {
  std::vector<int32_t> tokens;  // the first (from the prompt's logits), then one per step
  int n_device = 0;             // steps sampled in the graph
  int n_no_logits = 0;          // steps that read no logits back
};

// The prompt by Context::decode and its first token on the host, then `n_steps` steps: the plain
// loop (Context::decode, Sampler::sample), or decode_and_sample on the host or where it can.
Single generate_one(Context& ctx, const SamplerParams& sp, std::vector<int32_t> history, int n_steps,
                    Loop loop) {
  Single r;
  ctx.kv_cache_clear();
  auto sampler = Sampler::create(sp);
  EXPECT_TRUE(sampler.ok()) << sampler.status().to_string();
  if (!sampler.ok()) return r;
  auto logits = ctx.decode(history, 0);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  if (!logits.ok()) return r;
  auto first = sampler->sample(*logits, history);
  EXPECT_TRUE(first.ok()) << first.status().to_string();
  if (!first.ok()) return r;
  int32_t next = *first;
  DecodeSampleOptions o;
  o.device = loop == Loop::device;
  for (int i = 0; i < n_steps; ++i) {
    history.push_back(next);
    r.tokens.push_back(next);
    const auto last = std::span<const int32_t>(history).last(1);
    const int pos = static_cast<int>(history.size()) - 1;
    if (loop == Loop::plain) {
      auto step = ctx.decode(last, pos);
      EXPECT_TRUE(step.ok()) << step.status().to_string();
      if (!step.ok()) return r;
      auto t = sampler->sample(*step, history);
      EXPECT_TRUE(t.ok()) << t.status().to_string();
      if (!t.ok()) return r;
      next = *t;
      continue;
    }
    auto got = decode_and_sample(ctx, *sampler, last, pos, history, o);
    EXPECT_TRUE(got.ok()) << got.status().to_string();
    if (!got.ok()) return r;
    r.n_device += got->on_device ? 1 : 0;
    r.n_no_logits += ctx.stats().logits_bytes_read == 0 ? 1 : 0;
    EXPECT_EQ(got->logits.empty(), got->on_device);
    next = got->token;
  }
  r.tokens.push_back(next);
  return r;
}

std::vector<int32_t> one_prompt(const Context& ctx, int n, uint32_t seed) {
  std::vector<int32_t> p = test_tokens(n, ctx.n_vocab(), seed);
  p[0] = 0;
  return p;
}

// `loom run`'s case: one sequence on a contiguous cache; greedy and sampled chains sampled in the
// graph, no logits read back, the plain host loop's tokens.
TEST_F(LlmBatchDeviceSampling, OneSequenceTokensEqualTheHostLoop) {
  auto l = open_cpu_model(LOOM_BUILTIN_MODEL_Q8_0, 2, ContextParams{256, 32, 0});
  ASSERT_TRUE(l.ctx);
  ASSERT_EQ(l.ctx->kv_cache_kind(), KvCacheKind::contiguous);
  ASSERT_TRUE(l.ctx->supports_device_sampling());
  const int n_steps = 16;
  std::vector<std::vector<int32_t>> plain_of;
  for (int s : {0, 1, 2, 3, 4, 7, 9}) {
    const std::vector<int32_t> prompt = one_prompt(*l.ctx, 5 + s, 700 + s);
    const Single plain = generate_one(*l.ctx, config(s), prompt, n_steps, Loop::plain);
    const Single dev = generate_one(*l.ctx, config(s), prompt, n_steps, Loop::device);
    const Single host = generate_one(*l.ctx, config(s), prompt, n_steps, Loop::host);
    ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(n_steps + 1)) << s;
    EXPECT_EQ(dev.tokens, plain.tokens) << s;
    EXPECT_EQ(host.tokens, plain.tokens) << s;
    EXPECT_EQ(dev.n_device, n_steps) << s;
    EXPECT_EQ(dev.n_no_logits, n_steps) << s;
    EXPECT_EQ(host.n_device, 0) << s;
    EXPECT_EQ(host.n_no_logits, 0) << s;
    plain_of.push_back(plain.tokens);
  }
  // Sampled chains do sample: config 1 with two seeds (1 and 9) differs somewhere.
  const Single other = generate_one(*l.ctx, config(9), one_prompt(*l.ctx, 6, 701), n_steps, Loop::device);
  EXPECT_NE(other.tokens, plain_of[1]);
}

// Penalties over the history and top-k off cannot run in the graph: every step samples on the host,
// with the same tokens.
TEST_F(LlmBatchDeviceSampling, OneSequencePenaltiesFallBackToTheHost) {
  auto l = open_cpu_model(LOOM_BUILTIN_MODEL_Q8_0, 2, ContextParams{256, 32, 0});
  ASSERT_TRUE(l.ctx);
  for (int s : {5, 6}) {
    const std::vector<int32_t> prompt = one_prompt(*l.ctx, 7, 800 + s);
    const Single plain = generate_one(*l.ctx, config(s), prompt, 16, Loop::plain);
    const Single dev = generate_one(*l.ctx, config(s), prompt, 16, Loop::device);
    EXPECT_EQ(dev.tokens, plain.tokens) << s;
    EXPECT_EQ(dev.n_device, 0) << s;
    EXPECT_EQ(dev.n_no_logits, 0) << s;
  }
}

// Several tokens at once (a prompt): in the graph when they fit one pass, else on the host; the
// same token either way.
TEST_F(LlmBatchDeviceSampling, OneSequencePromptInThePass) {
  auto l = open_cpu_model(LOOM_BUILTIN_MODEL_Q8_0, 2, ContextParams{256, 8, 0});
  ASSERT_TRUE(l.ctx);
  for (int n : {6, 8, 13}) {
    const std::vector<int32_t> prompt = one_prompt(*l.ctx, n, 900 + static_cast<uint32_t>(n));
    auto host_sampler = Sampler::create(config(1));
    auto dev_sampler = Sampler::create(config(1));
    ASSERT_TRUE(host_sampler.ok() && dev_sampler.ok());
    l.ctx->kv_cache_clear();
    DecodeSampleOptions host;
    host.device = false;
    auto h = decode_and_sample(*l.ctx, *host_sampler, prompt, 0, prompt, host);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const int32_t host_token = h->token;
    EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(0), n - 1);
    l.ctx->kv_cache_clear();
    auto d = decode_and_sample(*l.ctx, *dev_sampler, prompt, 0, prompt);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->token, host_token) << n;
    EXPECT_EQ(d->on_device, n <= l.ctx->n_batch()) << n;
    EXPECT_EQ(l.ctx->kv_cache_seq_pos_max(0), n - 1);
  }
}

// A contiguous cache with a sliding-window ring (gemma3-tiny: windows of 4, a ring of 4 + 8 - 1
// cells): one sequence's steps sample in the graph, past the window, with the host's tokens.
TEST_F(LlmBatchDeviceSampling, OneSequenceOnASlidingWindowRing) {
  auto l = open_cpu_model(model("gemma3-tiny", "f32"), 2, ContextParams{64, 8, 0});
  ASSERT_TRUE(l.ctx);
  ASSERT_FALSE(l.ctx->swa_full());
  ASSERT_TRUE(l.ctx->supports_device_sampling());
  for (int s : {0, 1, 3}) {
    const std::vector<int32_t> prompt = one_prompt(*l.ctx, 5, 950 + s);
    const Single plain = generate_one(*l.ctx, config(s), prompt, 24, Loop::plain);
    const Single dev = generate_one(*l.ctx, config(s), prompt, 24, Loop::device);
    EXPECT_EQ(dev.tokens, plain.tokens) << s;
    EXPECT_EQ(dev.n_device, 24) << s;
  }
}

// NaN logits: the graph gives no token, the host sampler reports the NaN as it would alone, and the
// sampler's generator is left as before the call.
TEST_F(LlmBatchDeviceSampling, OneSequenceNanLogitsAreTheHostsError) {
  const std::string nan_model = path("nan-output.gguf");
  Rewrite r;
  r.drop_tensors = {"output.weight"};
  std::vector<float> nan_weights(128 * 512, std::numeric_limits<float>::quiet_NaN());
  r.add = [&nan_weights](GgufWriter& w, const GgufFile&) {
    const int64_t ne[] = {128, 512};
    return w.add_tensor("output.weight", DType::f32, ne, nan_weights.data());
  };
  ASSERT_TRUE(rewrite_gguf(model("tiny", "f32"), nan_model, r).ok());
  auto l = open_cpu_model(nan_model, 2, ContextParams{64, 8, 0});
  ASSERT_TRUE(l.ctx);
  const std::vector<int32_t> prompt = one_prompt(*l.ctx, 4, 77);
  std::string messages[2];
  for (bool device : {false, true}) {
    l.ctx->kv_cache_clear();
    auto sampler = Sampler::create(config(1));
    ASSERT_TRUE(sampler.ok());
    SampleRng before = sampler->rng();
    DecodeSampleOptions o;
    o.device = device;
    auto got = decode_and_sample(*l.ctx, *sampler, prompt, 0, prompt, o);
    ASSERT_FALSE(got.ok()) << device;
    EXPECT_NE(got.status().message().find("NaN"), std::string::npos) << got.status().message();
    messages[device ? 1 : 0] = got.status().message();
    EXPECT_EQ(sampler->draw_uniform(), before.uniform()) << device;  // nothing drawn
  }
  EXPECT_EQ(messages[1], messages[0]);
}

}  // namespace
}  // namespace loom::llm::testing
