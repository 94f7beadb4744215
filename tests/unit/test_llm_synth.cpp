// Synthetic models: the Q4_K_M type rule, the vocabulary, and deterministic files.
#include <fstream>
#include <iterator>
#include <map>

#include "synth_vocab.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

// The type gen-model writes for a model holding just this tensor (kept tensors are f32).
DType type_in_model(FileType ft, std::string_view name, Shape ne, const MixtureModelInfo& info) {
  const MixtureTensor t{name, ne};
  const TensorTypeChoice c = choose_tensor_types(ft, std::span<const MixtureTensor>(&t, 1), info)[0];
  return c.quantizable ? c.type : DType::f32;
}

TEST(LlmQuantMixture, UseMoreBits) {
  // 16 layers: the first and last eighth (0, 1, 14, 15) and every third in between (4, 7, 10, 13)
  std::vector<int> picked;
  for (int i = 0; i < 16; ++i)
    if (use_more_bits(i, 16)) picked.push_back(i);
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 4, 7, 10, 13, 14, 15}));
  picked.clear();
  for (int i = 0; i < 32; ++i)
    if (use_more_bits(i, 32)) picked.push_back(i);
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
}

// The counts of a Llama 3.2 1B Q4_K_M file (tied output, rope_freqs): 96 q4_K, 17 q6_K, 34 f32.
TEST(LlmQuantMixture, Llama3_1bCounts) {
  const SynthShape& s = *find_synth_shape("llama3-1b");
  MixtureModelInfo info{.n_layer = s.n_layer, .tied_embeddings = s.tied_output};
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  auto count = [&](const std::string& name, Shape ne) {
    names.push_back(name);
    shapes.push_back(ne);
  };
  const int64_t E = s.n_embd, kv = static_cast<int64_t>(s.head_dim) * s.n_head_kv;
  count("token_embd.weight", {E, s.n_vocab, 1, 1});
  count("rope_freqs.weight", {s.head_dim / 2, 1, 1, 1});
  count("output_norm.weight", {E, 1, 1, 1});
  for (int il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    count(p + "attn_norm.weight", {E, 1, 1, 1});
    count(p + "ffn_norm.weight", {E, 1, 1, 1});
    count(p + "attn_q.weight", {E, E, 1, 1});
    count(p + "attn_k.weight", {E, kv, 1, 1});
    count(p + "attn_v.weight", {E, kv, 1, 1});
    count(p + "attn_output.weight", {E, E, 1, 1});
    count(p + "ffn_gate.weight", {E, s.n_ff, 1, 1});
    count(p + "ffn_up.weight", {E, s.n_ff, 1, 1});
    count(p + "ffn_down.weight", {s.n_ff, E, 1, 1});
  }
  std::vector<MixtureTensor> tensors;
  for (size_t i = 0; i < names.size(); ++i) tensors.push_back({names[i], shapes[i]});
  std::map<DType, int> counts;
  for (const TensorTypeChoice& c : choose_tensor_types(FileType::q4_k_m, tensors, info))
    ++counts[c.quantizable ? c.type : DType::f32];  // gen-model writes kept tensors as f32
  EXPECT_EQ(counts[DType::q4_k], 96);
  EXPECT_EQ(counts[DType::q6_k], 17);
  EXPECT_EQ(counts[DType::f32], 34);
  // tied: the embedding is the output, so it gets the output's q6_K
  EXPECT_EQ(type_in_model(FileType::q4_k_m, "token_embd.weight", {E, s.n_vocab, 1, 1}, info), DType::q6_k);
  info.tied_embeddings = false;
  EXPECT_EQ(type_in_model(FileType::q4_k_m, "token_embd.weight", {E, s.n_vocab, 1, 1}, info), DType::q4_k);
}

TEST(LlmQuantMixture, FallbacksForShortRows) {
  const MixtureModelInfo info{.n_layer = 2};
  // 128-wide rows are not a multiple of the K-quants' 256
  EXPECT_EQ(type_in_model(FileType::q4_k, "blk.0.attn_q.weight", {128, 128, 1, 1}, info), DType::q8_0);
  EXPECT_EQ(type_in_model(FileType::q6_k, "blk.0.attn_q.weight", {128, 128, 1, 1}, info), DType::q8_0);
  EXPECT_EQ(type_in_model(FileType::q4_k_m, "output.weight", {128, 512, 1, 1}, info), DType::q8_0);
  // not even a multiple of 32: f16
  EXPECT_EQ(type_in_model(FileType::q4_0, "blk.0.attn_q.weight", {48, 16, 1, 1}, info), DType::f16);
  // Since gen-model shares loom quantize's rule, output.weight gets q6_K in every quantized type but
  // q8_0, as llama.cpp gives it (it used to stay in the plain type).
  EXPECT_EQ(type_in_model(FileType::q4_0, "output.weight", {256, 512, 1, 1}, info), DType::q6_k);
  EXPECT_EQ(type_in_model(FileType::q8_0, "output.weight", {256, 512, 1, 1}, info), DType::q8_0);
  // float types are pure: every weight, the output included, in that type
  EXPECT_EQ(type_in_model(FileType::bf16, "blk.1.ffn_down.weight", {384, 128, 1, 1}, info), DType::bf16);
  EXPECT_EQ(type_in_model(FileType::f16, "output.weight", {256, 512, 1, 1}, info), DType::f16);
  EXPECT_EQ(type_in_model(FileType::f32, "token_embd.weight", {256, 512, 1, 1}, {.tied_embeddings = true}),
            DType::f32);
  EXPECT_EQ(type_in_model(FileType::q8_0, "blk.1.attn_norm.weight", {128, 1, 1, 1}, info), DType::f32);
  EXPECT_EQ(file_type_from_name("Q4_K_M"), FileType::q4_k_m);
  EXPECT_FALSE(file_type_from_name("q5_K").has_value());
  EXPECT_TRUE(file_type_is_quantized(FileType::q4_0));
  EXPECT_FALSE(file_type_is_quantized(FileType::bf16));
  EXPECT_EQ(file_type_gguf_id(FileType::bf16), 32u);
}

// llama.cpp's counters, not block indices: attn_v ranks among the attn_v tensors present, and MoE
// ffn_down tensors use their block index whatever the file order.
TEST(LlmQuantMixture, CountersFollowFileOrder) {
  // 8 blocks, attn_v only in the odd ones (as in models with attention-free layers): ranks 0..3 of
  // n = 4, where use_more_bits picks ranks 2 and 3, i.e. blocks 5 and 7.
  std::vector<std::string> names;
  for (int il = 0; il < 8; ++il) {
    if (il % 2 == 1) names.push_back("blk." + std::to_string(il) + ".attn_v.weight");
    names.push_back("blk." + std::to_string(il) + ".ffn_down.weight");
  }
  std::vector<MixtureTensor> tensors;
  for (const std::string& n : names) tensors.push_back({n, {256, 256, 1, 1}});
  const auto dense = choose_tensor_types(FileType::q4_k_m, tensors, {.n_layer = 8});
  ASSERT_EQ(dense.size(), tensors.size());
  std::vector<std::string> q6;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (dense[i].type == DType::q6_k) q6.push_back(names[i]);
  // ffn_down ranks equal block indices here: use_more_bits(i, 8) picks 0, 3, 6, 7
  EXPECT_EQ(q6, (std::vector<std::string>{"blk.0.ffn_down.weight", "blk.3.ffn_down.weight",
                                          "blk.5.attn_v.weight", "blk.6.ffn_down.weight",
                                          "blk.7.attn_v.weight", "blk.7.ffn_down.weight"}));

  // MoE: expert tensors out of block order; the block index in the name decides.
  std::vector<MixtureTensor> moe = {{"blk.7.ffn_down_exps.weight", {256, 64, 4, 1}},
                                    {"blk.1.ffn_down_exps.weight", {256, 64, 4, 1}},
                                    {"blk.0.ffn_down_exps.weight", {256, 64, 4, 1}},
                                    {"blk.1.ffn_gate_inp.weight", {256, 4, 1, 1}}};
  const auto m = choose_tensor_types(FileType::q4_k_m, moe, {.n_layer = 8, .n_expert = 4});
  EXPECT_EQ(m[0].type, DType::q6_k);  // block 7
  EXPECT_EQ(m[1].type, DType::q4_k);  // block 1, though it is the second ffn_down
  EXPECT_EQ(m[2].type, DType::q6_k);  // block 0; its rank (2) would give q4_K
  EXPECT_FALSE(m[3].quantizable) << "the MoE router keeps its type";
}

TEST(LlmSynthVocab, LayoutAndMerges) {
  for (int n_vocab : {512, 128256}) {
    SynthVocab v = make_synth_vocab(n_vocab);
    ASSERT_EQ(v.tokens.size(), static_cast<size_t>(n_vocab));
    ASSERT_EQ(v.token_types.size(), v.tokens.size());
    EXPECT_EQ(v.bos, n_vocab - 2);
    EXPECT_EQ(v.eos, n_vocab - 1);
    EXPECT_EQ(v.tokens[v.bos], "<|begin_of_text|>");
    EXPECT_EQ(v.token_types[v.eos], 3);
    std::map<std::string, int> index;
    for (size_t i = 0; i < v.tokens.size(); ++i)
      EXPECT_TRUE(index.emplace(v.tokens[i], static_cast<int>(i)).second) << v.tokens[i];
    // bytes: space is U+0120 'Ġ', 'A' is itself, byte 0 is U+0100
    EXPECT_EQ(v.tokens[' '], "\xC4\xA0");
    EXPECT_EQ(v.tokens['A'], "A");
    EXPECT_EQ(v.tokens[0], "\xC4\x80");
    // every merge joins two existing tokens into an existing token
    ASSERT_GT(v.merges.size(), 100u);
    for (const std::string& m : v.merges) {
      const size_t sp = m.find(' ');
      ASSERT_NE(sp, std::string::npos) << m;
      const std::string l = m.substr(0, sp), r = m.substr(sp + 1);
      EXPECT_TRUE(index.count(l) && index.count(r) && index.count(l + r)) << m;
    }
    if (n_vocab == 512) {
      EXPECT_EQ(v.merges.size(), 254u);  // every slot a merge
    }
  }
}

std::vector<char> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class LlmSynthModel : public ModelFiles {};

TEST_F(LlmSynthModel, DeterministicAcrossThreads) {
  const SynthShape& s = *find_synth_shape("small");
  SynthOptions o;
  o.progress = false;
  o.seed = 9;
  o.n_threads = 1;
  ASSERT_TRUE(write_synth_model(path("a.gguf"), s, FileType::q4_k_m, o).ok());
  o.n_threads = 3;
  ASSERT_TRUE(write_synth_model(path("b.gguf"), s, FileType::q4_k_m, o).ok());
  o.seed = 10;
  ASSERT_TRUE(write_synth_model(path("c.gguf"), s, FileType::q4_k_m, o).ok());
  const auto a = read_all(path("a.gguf")), b = read_all(path("b.gguf")), c = read_all(path("c.gguf"));
  ASSERT_GT(a.size(), 1000000u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
}

// Every file type writes a loadable model with the types the rule gives; weights follow the
// documented distribution (uniform in +-sqrt(3/fan_in), norms in [0.75, 1.25]).
TEST_F(LlmSynthModel, TypesAndValues) {
  for (const char* type : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K", "q4_K_M"}) {
    SCOPED_TRACE(type);
    auto f = GgufFile::open(model("small", type));
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const FileType ft = *file_type_from_name(type);
    const GgufTensorInfo* wq = f->find_tensor("blk.1.attn_q.weight");
    ASSERT_NE(wq, nullptr);
    EXPECT_EQ(*wq->dtype, fallback_quant_type(choose_quant_type(wq->name, 1, 4, ft), wq->ne[0]));
    std::vector<float> vals(static_cast<size_t>(wq->nelements()));
    dequantize_row(*wq->dtype, wq->data, vals.data(), wq->nelements());
    double ss = 0.0, mx = 0.0;
    for (float x : vals) {
      ss += static_cast<double>(x) * x;
      mx = std::max(mx, std::abs(static_cast<double>(x)));
    }
    const double bound = std::sqrt(3.0 / 256.0);
    EXPECT_NEAR(ss / vals.size(), 1.0 / 256.0, 0.15 / 256.0);  // variance 1/fan_in, quantization noise aside
    EXPECT_LT(mx, bound * 1.1);
    const GgufTensorInfo* norm = f->find_tensor("blk.0.ffn_norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(*norm->dtype, DType::f32);
    const float* nv = reinterpret_cast<const float*>(norm->data);
    for (int i = 0; i < 256; ++i) EXPECT_TRUE(nv[i] >= 0.75f && nv[i] <= 1.25f);
    auto tm = f->get_string("tokenizer.ggml.model");
    ASSERT_TRUE(tm.ok());
    EXPECT_EQ(*tm, "gpt2");
    EXPECT_EQ(*f->get_u32("general.file_type"), file_type_gguf_id(ft));
  }
}

TEST(LlmSynthModelRope, Llama3FreqFactors) {
  const auto ff = llama3_rope_freq_factors(64, 500000.0f, 32.0f);
  ASSERT_EQ(ff.size(), 32u);
  EXPECT_FLOAT_EQ(ff[0], 1.0f);    // highest frequency: kept
  EXPECT_FLOAT_EQ(ff[31], 32.0f);  // lowest: divided by the factor
  for (size_t i = 1; i < ff.size(); ++i) EXPECT_GE(ff[i], ff[i - 1]);
}

}  // namespace
}  // namespace loom::llm::testing
