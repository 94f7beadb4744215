// Model loading: hyperparameters, every architecture, tied embeddings, and the named errors for
// broken files.
#include "test_llm_common.h"

#include "llm/llm_model_impl.h"

namespace loom::llm::testing {
namespace {

class LlmModel : public ModelFiles {};

TEST_F(LlmModel, HParamsFromMetadata) {
  auto f = GgufFile::open(model("qwen3-tiny"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().to_string();
  const SynthShape& s = *find_synth_shape("qwen3-tiny");
  EXPECT_EQ(hp->arch, Arch::qwen3);
  EXPECT_EQ(hp->n_ctx_train, static_cast<uint32_t>(s.n_ctx));
  EXPECT_EQ(hp->n_embd, static_cast<uint32_t>(s.n_embd));
  EXPECT_EQ(hp->n_layer, static_cast<uint32_t>(s.n_layer));
  EXPECT_EQ(hp->n_ff, static_cast<uint32_t>(s.n_ff));
  EXPECT_EQ(hp->n_head, static_cast<uint32_t>(s.n_head));
  EXPECT_EQ(hp->n_head_kv, static_cast<uint32_t>(s.n_head_kv));
  EXPECT_EQ(hp->head_dim_k, static_cast<uint32_t>(s.head_dim));
  EXPECT_NE(hp->head_dim_k, hp->n_embd / hp->n_head);  // qwen3-tiny's heads are wider than n_embd/n_head
  EXPECT_EQ(hp->head_dim_v, static_cast<uint32_t>(s.head_dim));
  EXPECT_EQ(hp->n_rot, static_cast<uint32_t>(s.head_dim));
  EXPECT_EQ(hp->n_vocab, static_cast<uint32_t>(s.n_vocab));
  EXPECT_FLOAT_EQ(hp->norm_rms_eps, s.norm_eps);
  EXPECT_FLOAT_EQ(hp->rope_freq_base, s.rope_base);
  EXPECT_EQ(hp->rope_scaling, RopeScaling::none);
}

TEST_F(LlmModel, RopeScalingKeys) {
  const std::string src = model("tiny"), dst = path("yarn.gguf");
  Rewrite r;
  r.add = [](GgufWriter& w, const GgufFile&) {
    LOOM_TRY(w.add_string("llama.rope.scaling.type", "yarn"));
    LOOM_TRY(w.add_f32("llama.rope.scaling.factor", 4.0f));
    return w.add_u32("llama.rope.scaling.original_context_length", 128);
  };
  ASSERT_TRUE(rewrite_gguf(src, dst, r).ok());
  auto f = GgufFile::open(dst);
  ASSERT_TRUE(f.ok());
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().to_string();
  EXPECT_EQ(hp->rope_scaling, RopeScaling::yarn);
  EXPECT_FLOAT_EQ(hp->rope_scaling_factor, 4.0f);
  EXPECT_EQ(hp->n_ctx_orig, 128u);

  const std::string bad = path("longrope.gguf");
  r.add = [](GgufWriter& w, const GgufFile&) { return w.add_string("llama.rope.scaling.type", "longrope"); };
  ASSERT_TRUE(rewrite_gguf(src, bad, r).ok());
  auto fb = GgufFile::open(bad);
  ASSERT_TRUE(fb.ok());
  auto hb = read_hparams(*fb);
  ASSERT_FALSE(hb.ok());
  EXPECT_EQ(hb.status().code(), StatusCode::unsupported);
  EXPECT_NE(hb.status().message().find("longrope"), std::string::npos) << hb.status().message();
}

// Each architecture loads, declares its own tensors, and produces finite, varied logits.
TEST_F(LlmModel, EveryArchitectureLoadsAndRuns) {
  auto backend = make_cpu_backend(2);
  for (const char* shape : {"tiny", "qwen2-tiny", "qwen3-tiny"}) {
    SCOPED_TRACE(shape);
    auto m = Model::load(model(shape), *backend, quiet_load());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto& w = (*m)->impl().w;
    const Arch arch = (*m)->hparams().arch;
    EXPECT_EQ(w.layers[0].bq != nullptr, arch == Arch::qwen2);
    EXPECT_EQ(w.layers[0].q_norm != nullptr, arch == Arch::qwen3);
    EXPECT_EQ((*m)->type_mixture().rfind("f32: ", 0), 0u);  // everything f32
    EXPECT_EQ((*m)->type_mixture().find(','), std::string::npos);
    auto ctx = Context::create(**m, ContextParams{64, 16, 0});
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    const auto tokens = test_tokens(5, (*ctx)->n_vocab());
    auto logits = (*ctx)->decode(tokens, 0);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    ASSERT_EQ(logits->size(), static_cast<size_t>((*ctx)->n_vocab()));
    double mean = 0.0, var = 0.0;
    for (float v : *logits) {
      ASSERT_TRUE(std::isfinite(v));
      mean += v;
    }
    mean /= logits->size();
    for (float v : *logits) var += (v - mean) * (v - mean);
    var /= logits->size();
    // weights scaled for unit-variance activations: logits spread O(1), neither collapsed nor exploding
    EXPECT_GT(var, 0.05);
    EXPECT_LT(var, 100.0);
  }
}

// A tied model (no output.weight) gives the same logits as a copy whose output.weight is an explicit
// copy of token_embd.
TEST_F(LlmModel, TiedEmbeddings) {
  const std::string tied = model("qwen2-tiny");
  const std::string untied = path("qwen2-untied.gguf");
  Rewrite r;
  r.add = [](GgufWriter& w, const GgufFile& f) {
    const GgufTensorInfo* te = f.find_tensor("token_embd.weight");
    if (!te) return make_error(StatusCode::internal, "no token_embd");
    std::vector<int64_t> ne(te->ne.begin(), te->ne.begin() + te->n_dims);
    return w.add_tensor_ggml("output.weight", te->ggml_type, ne, te->data);
  };
  ASSERT_TRUE(rewrite_gguf(tied, untied, r).ok());

  auto backend = make_cpu_backend(2);
  std::vector<std::vector<float>> results;
  for (const std::string& p : {tied, untied}) {
    auto m = Model::load(p, *backend, quiet_load());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto& w = (*m)->impl().w;
    EXPECT_EQ(w.output == w.tok_embd, p == tied);
    auto ctx = Context::create(**m, ContextParams{32, 8, 0});
    ASSERT_TRUE(ctx.ok());
    auto logits = (*ctx)->decode(test_tokens(6, (*ctx)->n_vocab()), 0);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    results.emplace_back(logits->begin(), logits->end());
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST_F(LlmModel, MissingTensorIsNamed) {
  const std::string dst = path("missing.gguf");
  Rewrite r;
  r.drop_tensors = {"blk.1.ffn_up.weight"};
  ASSERT_TRUE(rewrite_gguf(model("tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::format_error);
  EXPECT_NE(m.status().message().find("missing tensor 'blk.1.ffn_up.weight'"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("[128, 384]"), std::string::npos) << m.status().message();
}

TEST_F(LlmModel, QwenBiasesAreRequired) {
  const std::string dst = path("nobias.gguf");
  Rewrite r;
  r.drop_tensors = {"blk.0.attn_k.bias"};
  ASSERT_TRUE(rewrite_gguf(model("qwen2-tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("blk.0.attn_k.bias"), std::string::npos) << m.status().message();
}

TEST_F(LlmModel, WrongShapeNamesBothShapes) {
  const std::string dst = path("shape.gguf");
  Rewrite r;
  r.drop_tensors = {"blk.0.attn_k.weight"};
  std::vector<float> data(128 * 32, 0.5f);
  r.add = [&data](GgufWriter& w, const GgufFile&) {
    const int64_t ne[] = {128, 32};  // 1 head of 32, the model has 2 KV heads
    return w.add_tensor("blk.0.attn_k.weight", DType::f32, ne, data.data());
  };
  ASSERT_TRUE(rewrite_gguf(model("tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::shape_mismatch);
  const std::string msg = m.status().message();
  EXPECT_NE(msg.find("'blk.0.attn_k.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 64]"), std::string::npos) << msg;
}

TEST_F(LlmModel, NormMustBeF32) {
  const std::string dst = path("f16norm.gguf");
  Rewrite r;
  r.drop_tensors = {"output_norm.weight"};
  std::vector<uint16_t> data(128, f32_to_f16(1.0f));
  r.add = [&data](GgufWriter& w, const GgufFile&) {
    const int64_t ne[] = {128};
    return w.add_tensor("output_norm.weight", DType::f16, ne, data.data());
  };
  ASSERT_TRUE(rewrite_gguf(model("tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::type_mismatch);
  EXPECT_NE(m.status().message().find("output_norm.weight"), std::string::npos) << m.status().message();
}

TEST_F(LlmModel, UnknownArchitectureIsNamed) {
  const std::string dst = path("arch.gguf");
  Rewrite r;
  r.drop_keys = {"general.architecture"};
  r.add = [](GgufWriter& w, const GgufFile&) { return w.add_string("general.architecture", "gpt9"); };
  ASSERT_TRUE(rewrite_gguf(model("tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::unsupported);
  EXPECT_NE(m.status().message().find("unknown architecture 'gpt9'"), std::string::npos)
      << m.status().message();
}

TEST_F(LlmModel, MissingHyperparameterIsNamed) {
  const std::string dst = path("nokey.gguf");
  Rewrite r;
  r.drop_keys = {"llama.block_count"};
  ASSERT_TRUE(rewrite_gguf(model("tiny"), dst, r).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(dst, *backend, quiet_load());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("llama.block_count"), std::string::npos) << m.status().message();
}

TEST_F(LlmModel, NotEnoughMemoryFailsBeforeLoading) {
  auto backend = make_cpu_backend(1);
  ModelLoadOptions o = quiet_load();
  o.available_memory = 100000;  // the tiny f32 model needs ~1.4 MB
  auto m = Model::load(model("tiny"), *backend, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::out_of_memory);
  EXPECT_NE(m.status().message().find("97.7 KiB"), std::string::npos) << m.status().message();

  auto ok = Model::load(model("tiny"), *backend, quiet_load());
  ASSERT_TRUE(ok.ok());
  ContextParams cp;
  cp.n_ctx = 512;
  cp.available_memory = 1000;
  auto ctx = Context::create(**ok, cp);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::out_of_memory);
  EXPECT_NE(ctx.status().message().find("512 cells"), std::string::npos) << ctx.status().message();
}

// Weights on the CPU stay in the file's mapping: the tensor data points into the file's bytes.
TEST_F(LlmModel, CpuWeightsAreTheMapping) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("tiny"), *backend, quiet_load());
  ASSERT_TRUE(m.ok());
  const auto bytes = (*m)->gguf().bytes();
  const auto* p = static_cast<const uint8_t*>((*m)->impl().w.layers[1].wq->data);
  EXPECT_GE(p, bytes.data());
  EXPECT_LT(p, bytes.data() + bytes.size());
  EXPECT_EQ(p, (*m)->gguf().find_tensor("blk.1.attn_q.weight")->data);
  // the mapping is read-only through the buffer interface too
  EXPECT_FALSE((*m)->impl().buffer->write(0, "x", 1).ok());
}

TEST_F(LlmModel, SummaryAndMixture) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load(model("small", "q4_K_M"), *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  // small: 4 layers; use_more_bits(i, 4) holds for i = 0 (i < 0? no: 4/8 = 0), i >= 3, (i - 0) % 3 == 2
  // -> layers 2 and 3: attn_v and ffn_down of those are q6_K, as is output.weight.
  EXPECT_EQ((*m)->type_mixture(), "q4_K: 25, f32: 9, q6_K: 5");
  const std::string s = (*m)->summary();
  EXPECT_NE(s.find("llama"), std::string::npos) << s;
  EXPECT_NE(s.find("trained context 1024"), std::string::npos) << s;
  const SynthShape& sh = *find_synth_shape("small");
  const uint64_t per_layer =
      2ull * sh.n_embd + static_cast<uint64_t>(sh.n_embd) * sh.head_dim * (2 * sh.n_head + 2 * sh.n_head_kv) +
      3ull * sh.n_embd * sh.n_ff;
  EXPECT_EQ((*m)->n_params(), 2ull * sh.n_embd * sh.n_vocab + sh.n_embd + per_layer * sh.n_layer);
}

}  // namespace
}  // namespace loom::llm::testing
