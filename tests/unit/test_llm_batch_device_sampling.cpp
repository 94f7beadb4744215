// BatchGenerator::set_device_sampling: the tokens sampled in the step's graph (top_k +
// sample_tokens on the CPU backend) equal the host sampler's, token for token, for greedy and
// sampled sequences (top-k, top-p, min-p, temperature, fixed seeds), alone and batched, in one pass
// or several, with an enqueued prompt riding in the pass; sequences the device cannot sample
// exactly (penalties, top-k off) go to the host; and no logits come back for the others.
#include "loom/llm_batch.h"
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
  EXPECT_EQ(dev.n_device, 12 * n_steps);  // 12 of the 16 configs run on the device
  EXPECT_EQ(dev.n_host, 4 * n_steps);
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

}  // namespace
}  // namespace loom::llm::testing
