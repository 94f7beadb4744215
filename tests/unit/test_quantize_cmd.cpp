// `loom quantize` and `loom info`: a small LLaMA-shaped f32/f16/bf16 model written with GgufWriter
// is quantized, re-read and checked: each tensor's type against the rule (worked out by hand here,
// not by calling the rule), dequantized values against per-type error bounds, metadata kept, and
// errors for bad input.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "gguf_info.h"
#include "loom/cpu.h"
#include "loom/gguf.h"
#include "loom/llm.h"
#include "loom/quant_mixture.h"
#include "quantize_model.h"
#include "synth_model.h"

namespace loom::app {
namespace {

namespace fs = std::filesystem;
using llm::choose_quant_type;
using llm::fallback_quant_type;
using llm::file_type_base;
using llm::file_type_from_name;
using llm::file_type_gguf_id;
using llm::file_type_is_quantized;
using llm::file_type_name;
using llm::FileType;
using llm::tensor_is_quantizable;
using llm::use_more_bits;
using llm::all_file_types;
using llm::choose_tensor_types;
using llm::MixtureModelInfo;
using llm::MixtureTensor;

constexpr int kLayers = 8;
constexpr int64_t kEmbd = 256;
constexpr int64_t kKv = 64;
constexpr int64_t kFf = 256;
constexpr int64_t kVocab = 48;
// Largest logit NMSE of gptoss-tiny quantized to MXFP4_MOE against its f32 original, per step of
// Mxfp4MoeGptOssEndToEnd: 0.055-0.10 measured (mxfp4's ~11 % weight error on every expert, routers
// that pick other experts for some tokens), where unrelated weights give about 1 or more.
constexpr double kMxfp4MoeNmseBound = 0.25;

// The tensors of the test model with their original values (after rounding to the stored type).
struct TestModel {
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<float> values;   // as stored, widened to float
    std::vector<uint8_t> bytes;  // as stored
  };
  std::vector<Tensor> tensors;

  const Tensor& get(const std::string& name) const {
    for (const Tensor& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
};

struct ModelOptions {
  bool with_output = true;
  float nan_in = 0.0f;       // when nonzero: put a NaN into blk.2.ffn_up.weight
  bool quantized_q = false;  // store blk.3.attn_q.weight as q8_0
  bool split = false;
};

TestModel make_model(const ModelOptions& o, uint32_t seed = 1) {
  TestModel m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  auto add = [&](std::string name, std::vector<int64_t> ne, DType type = DType::f32, bool norm = false) {
    TestModel::Tensor t{std::move(name), type, std::move(ne), {}, {}};
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = norm ? 1.0f + nd(rng) : nd(rng);
    t.bytes.resize(dtype_row_size(type, t.ne[0]) * static_cast<size_t>(n / t.ne[0]));
    quantize_row(type, v.data(), t.bytes.data(), n);
    t.values.resize(v.size());
    dequantize_row(type, t.bytes.data(), t.values.data(), n);
    m.tensors.push_back(std::move(t));
  };
  add("token_embd.weight", {kEmbd, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {kEmbd}, DType::f32, true);
    const DType q_type = l == 1                      ? DType::f16
                         : l == 2                    ? DType::bf16
                         : (l == 3 && o.quantized_q) ? DType::q8_0
                                                     : DType::f32;
    add(b + "attn_q.weight", {kEmbd, kEmbd}, q_type);
    add(b + "attn_k.weight", {kEmbd, kKv});
    add(b + "attn_v.weight", {kEmbd, kKv});
    add(b + "attn_output.weight", {kEmbd, kEmbd});
    add(b + "ffn_norm.weight", {kEmbd}, DType::f32, true);
    add(b + "ffn_gate.weight", {kEmbd, kFf});
    add(b + "ffn_up.weight", {kEmbd, kFf});
    add(b + "ffn_down.weight", {kFf, kEmbd});
  }
  add("blk.0.attn_q.bias", {kEmbd});      // not a weight: copied
  add("blk.0.ffn_odd.weight", {96, 8});   // 96 % 256 != 0: K-quants fall back to q8_0
  add("blk.0.ffn_tiny.weight", {40, 4});  // 40 % 32 != 0: f16
  add("blk.0.col.weight", {kEmbd, 1});    // one significant dimension: copied
  add("output_norm.weight", {kEmbd}, DType::f32, true);
  if (o.with_output) add("output.weight", {kEmbd, kVocab});
  if (o.nan_in != 0.0f) {
    for (TestModel::Tensor& t : m.tensors)
      if (t.name == "blk.2.ffn_up.weight") {
        float* f = reinterpret_cast<float*>(t.bytes.data());
        f[3 * kEmbd + 17] = std::nanf("");
      }
  }
  (void)o.split;
  return m;
}

void write_model(const TestModel& m, const std::string& path, const ModelOptions& o) {
  GgufWriter w;
  ASSERT_TRUE(w.add_string("general.architecture", "llama").ok());
  ASSERT_TRUE(w.add_string("general.name", "loom quantize test").ok());
  ASSERT_TRUE(w.add_u32("general.alignment", 64).ok());
  ASSERT_TRUE(w.add_u32("general.file_type", 0).ok());
  ASSERT_TRUE(w.add_u32("llama.block_count", kLayers).ok());
  ASSERT_TRUE(w.add_u32("llama.embedding_length", kEmbd).ok());
  ASSERT_TRUE(w.add_f32("llama.rope.freq_base", 500000.0f).ok());
  std::vector<std::string> tokens;
  std::vector<float> scores;
  for (int i = 0; i < kVocab; ++i) {
    tokens.push_back("tok" + std::to_string(i));
    scores.push_back(-0.5f * static_cast<float>(i));
  }
  ASSERT_TRUE(w.add_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens)).ok());
  ASSERT_TRUE(w.add_array("tokenizer.ggml.scores", std::span<const float>(scores)).ok());
  if (o.split) {
    ASSERT_TRUE(w.add_u16("split.count", 2).ok());
  }
  for (const TestModel::Tensor& t : m.tensors)
    ASSERT_TRUE(w.add_tensor(t.name, t.type, t.ne, t.bytes.data()).ok()) << t.name;
  ASSERT_TRUE(w.write(path).ok());
}

class QuantizeCmd : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom-quantize-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes the model and returns its path.
  std::string model(const ModelOptions& o = {}) {
    model_ = make_model(o);
    const std::string p = path("in.gguf");
    write_model(model_, p, o);
    return p;
  }

  fs::path dir_;
  TestModel model_;
};

// Relative RMS error bounds on Gaussian data, a little above what each format reaches
// (tests/unit/test_quant.cpp measures the same quantizers).
double error_bound(DType t) {
  switch (t) {
    case DType::q8_0:
      return 0.006;
    case DType::q4_0:
      return 0.11;
    case DType::q4_k:
      return 0.08;
    case DType::q6_k:
      return 0.02;
    case DType::f16:
      return 3e-4;
    case DType::q4_1:
      return 0.075;
    case DType::q5_0:
      return 0.047;
    case DType::q5_1:
      return 0.037;
    case DType::q2_k:
      return 0.29;
    case DType::q3_k:
      return 0.16;
    case DType::q5_k:
      return 0.039;
    case DType::iq4_nl:
    case DType::iq4_xs:
      return 0.08;
    case DType::mxfp4:
      return 0.14;  // 0.112 on Gaussian data (docs/QUANTIZATION.md)
    default:
      return 0.0;
  }
}

// Checks every output tensor: type as `expected` says, values within the type's bound (bytes equal
// when copied), shape unchanged.
void check_output(const TestModel& m, const GgufFile& out, const std::map<std::string, DType>& expected) {
  ASSERT_EQ(out.tensors().size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const TestModel::Tensor& src = m.tensors[i];
    const GgufTensorInfo& t = out.tensors()[i];
    ASSERT_EQ(t.name, src.name) << "tensor order is kept";
    for (size_t d = 0; d < src.ne.size(); ++d) EXPECT_EQ(t.ne[d], src.ne[d]) << src.name;
    const auto it = expected.find(src.name);
    ASSERT_NE(it, expected.end()) << src.name;
    ASSERT_TRUE(t.dtype.has_value()) << src.name;
    EXPECT_EQ(dtype_name(*t.dtype), std::string(dtype_name(it->second))) << src.name;
    if (*t.dtype == src.type) {
      ASSERT_EQ(t.size, src.bytes.size()) << src.name;
      EXPECT_EQ(std::memcmp(t.data, src.bytes.data(), t.size), 0) << src.name << " must be copied unchanged";
      continue;
    }
    std::vector<float> y(src.values.size());
    const int64_t ne0 = src.ne[0];
    const size_t row_bytes = dtype_row_size(*t.dtype, ne0);
    for (size_t r = 0; r < y.size() / static_cast<size_t>(ne0); ++r)
      dequantize_row(*t.dtype, t.data + r * row_bytes, y.data() + r * static_cast<size_t>(ne0), ne0);
    double err = 0.0, ref = 0.0;
    for (size_t j = 0; j < y.size(); ++j) {
      err += (y[j] - src.values[j]) * (y[j] - src.values[j]);
      ref += src.values[j] * src.values[j];
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_LE(rel, error_bound(*t.dtype)) << src.name << " as " << dtype_name(*t.dtype);
    EXPECT_GT(rel, 0.0) << src.name << ": converted data equal to the input means nothing was converted";
  }
}

// The types the rule gives the test model, written out by hand from llama.cpp's rules.
std::map<std::string, DType> expected_types(const TestModel& m, FileType f, bool tied = false) {
  const DType base = file_type_base(f);
  const std::set<int> more_bits = {0, 3, 6, 7};  // n = 8: i < 1, i >= 7, (i - 1) % 3 == 2
  std::map<std::string, DType> e;
  for (const TestModel::Tensor& t : m.tensors) {
    const std::string& n = t.name;
    DType d = base;
    if (n.find("norm") != std::string::npos || n == "blk.0.attn_q.bias" || n == "blk.0.col.weight") {
      d = t.type;
    } else if (n == "output.weight" || (tied && n == "token_embd.weight")) {
      d = base == DType::q8_0 ? DType::q8_0 : DType::q6_k;
    } else if (n == "blk.0.ffn_odd.weight") {  // llama.cpp's tensor_type_fallback
      d = base == DType::q4_k   ? DType::q8_0
          : base == DType::q6_k ? DType::q8_0
          : base == DType::q5_k ? DType::q5_1
          : base == DType::q3_k ? DType::q4_0
          : base == DType::iq4_xs ? DType::iq4_nl
                                  : base;
    } else if (n == "blk.0.ffn_tiny.weight") {
      d = DType::f16;
    } else if (f == FileType::iq4_nl && n == "blk.0.ffn_down.weight") {
      d = DType::q5_k;  // the first n/8 ffn_down
    } else if (f == FileType::q4_k_m &&
               (n.find("attn_v") != std::string::npos || n.find("ffn_down") != std::string::npos)) {
      const int layer = std::stoi(n.substr(4));
      d = more_bits.count(layer) ? DType::q6_k : DType::q4_k;
    }
    e[n] = d;
  }
  return e;
}

// ---- the rule alone ---------------------------------------------------------------------------------

TEST(QuantMixture, UseMoreBits) {
  std::vector<int> picked;
  for (int i = 0; i < 8; ++i)
    if (use_more_bits(i, 8)) picked.push_back(i);
  EXPECT_EQ(picked, (std::vector<int>{0, 3, 6, 7}));
  picked.clear();
  for (int i = 0; i < 32; ++i)
    if (use_more_bits(i, 32)) picked.push_back(i);
  // first 4, last 4, and i with (i - 4) % 3 == 2 in between
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
}

TEST(QuantMixture, ChooseTypes) {
  const FileType m = FileType::q4_k_m;
  EXPECT_EQ(choose_quant_type("output.weight", 0, 32, m), DType::q6_k);
  EXPECT_EQ(choose_quant_type("output.weight", 0, 32, FileType::q8_0), DType::q8_0);
  EXPECT_EQ(choose_quant_type("output.weight", 0, 32, FileType::q4_0), DType::q6_k);
  EXPECT_EQ(choose_quant_type("token_embd.weight", 0, 32, m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("token_embd.weight", 0, 32, m, {.tied_embeddings = true}), DType::q6_k);
  EXPECT_EQ(choose_quant_type("blk.6.attn_v.weight", 6, 32, m), DType::q6_k);
  EXPECT_EQ(choose_quant_type("blk.5.attn_v.weight", 5, 32, m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.9.attn_qkv.weight", 9, 32, m), DType::q6_k);
  EXPECT_EQ(choose_quant_type("blk.31.ffn_down.weight", 31, 32, m), DType::q6_k);
  EXPECT_EQ(choose_quant_type("blk.10.ffn_down.weight", 10, 32, m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.0.ffn_up.weight", 0, 32, m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.0.attn_q.weight", 0, 32, m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.0.attn_v.weight", 0, 32, FileType::q4_k), DType::q4_k)
      << "plain q4_K: no mixture";
  EXPECT_EQ(choose_quant_type("blk.5.attn_k.weight", 5, 32, m, {.n_expert = 8}), DType::q8_0);
  EXPECT_EQ(choose_quant_type("blk.5.attn_v.weight", 5, 32, m, {.n_expert = 8}), DType::q8_0);

  EXPECT_TRUE(tensor_is_quantizable("blk.0.attn_q.weight", 2));
  EXPECT_TRUE(tensor_is_quantizable("blk.0.ffn_down_exps.weight", 3));
  EXPECT_FALSE(tensor_is_quantizable("blk.0.attn_norm.weight", 2)) << "norms never";
  EXPECT_FALSE(tensor_is_quantizable("blk.0.attn_q.weight", 1)) << "1-D never";
  EXPECT_FALSE(tensor_is_quantizable("blk.0.attn_q.bias", 2));
  EXPECT_FALSE(tensor_is_quantizable("blk.0.ffn_gate_inp.weight", 2)) << "MoE router";
  EXPECT_FALSE(tensor_is_quantizable("position_embd.weight", 2));

  EXPECT_EQ(fallback_quant_type(DType::q4_k, 4096), DType::q4_k);
  EXPECT_EQ(fallback_quant_type(DType::q4_k, 96), DType::q8_0);  // not q5_0: see quant_mixture.h
  EXPECT_EQ(fallback_quant_type(DType::q6_k, 160), DType::q8_0);
  EXPECT_EQ(fallback_quant_type(DType::q5_k, 96), DType::q5_1);
  EXPECT_EQ(fallback_quant_type(DType::q2_k, 96), DType::q4_0);
  EXPECT_EQ(fallback_quant_type(DType::q3_k, 96), DType::q4_0);
  EXPECT_EQ(fallback_quant_type(DType::iq4_xs, 96), DType::iq4_nl);
  EXPECT_EQ(fallback_quant_type(DType::q5_k, 40), DType::f16);
  EXPECT_EQ(fallback_quant_type(DType::q4_k, 40), DType::f16);
  EXPECT_EQ(fallback_quant_type(DType::q8_0, 40), DType::f16);
  EXPECT_EQ(fallback_quant_type(DType::q4_0, 96), DType::q4_0);
}

// The mixes beyond q4_K_M, case by case from llama.cpp's llama_tensor_get_type.
TEST(QuantMixture, LowBitAndIq4Mixes) {
  const llm::MixtureModelInfo gqa{.n_layer = 32, .tied_embeddings = false, .n_expert = 0, .n_gqa = 4};
  EXPECT_EQ(choose_quant_type("blk.3.attn_v.weight", 3, 32, FileType::q2_k), DType::q3_k);
  EXPECT_EQ(choose_quant_type("blk.3.attn_v.weight", 3, 32, FileType::q2_k, gqa), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.3.ffn_down.weight", 3, 32, FileType::q2_k), DType::q3_k);
  EXPECT_EQ(choose_quant_type("blk.3.attn_output.weight", 3, 32, FileType::q2_k), DType::q3_k);
  EXPECT_EQ(choose_quant_type("blk.3.ffn_up.weight", 3, 32, FileType::q2_k), DType::q2_k);
  EXPECT_EQ(choose_quant_type("output.weight", 0, 32, FileType::q2_k), DType::q6_k);
  EXPECT_EQ(choose_quant_type("blk.1.attn_v.weight", 1, 32, FileType::q3_k_m), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.2.attn_v.weight", 2, 32, FileType::q3_k_m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.1.ffn_down.weight", 1, 32, FileType::q3_k_m), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.2.ffn_down.weight", 2, 32, FileType::q3_k_m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.2.attn_output.weight", 2, 32, FileType::q3_k_m), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.2.ffn_gate.weight", 2, 32, FileType::q3_k_m), DType::q3_k);
  EXPECT_EQ(choose_quant_type("blk.9.attn_v.weight", 9, 32, FileType::q3_k_l), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.9.ffn_down.weight", 9, 32, FileType::q3_k_l), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.9.ffn_down.weight", 9, 32, FileType::q3_k_s), DType::q3_k);
  EXPECT_EQ(choose_quant_type("blk.3.attn_v.weight", 3, 32, FileType::q4_k_s), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.4.attn_v.weight", 4, 32, FileType::q4_k_s), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.3.ffn_down.weight", 3, 32, FileType::q4_k_s), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.4.ffn_down.weight", 4, 32, FileType::q4_k_s), DType::q4_k);
  EXPECT_EQ(choose_quant_type("blk.31.ffn_down.weight", 31, 32, FileType::q5_k_m), DType::q6_k);
  EXPECT_EQ(choose_quant_type("blk.10.ffn_down.weight", 10, 32, FileType::q5_k_m), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.10.attn_v.weight", 10, 32, FileType::q5_k_s), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.3.attn_v.weight", 3, 32, FileType::iq4_xs), DType::iq4_xs);
  EXPECT_EQ(choose_quant_type("blk.3.attn_v.weight", 3, 32, FileType::iq4_xs, gqa), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.3.ffn_down.weight", 3, 32, FileType::iq4_nl), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.4.ffn_down.weight", 4, 32, FileType::iq4_nl), DType::iq4_nl);
  const llm::MixtureModelInfo moe{.n_layer = 32, .tied_embeddings = false, .n_expert = 8, .n_gqa = 1};
  EXPECT_EQ(choose_quant_type("blk.3.attn_output.weight", 3, 32, FileType::q4_k_m, moe), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.3.attn_output.weight", 3, 32, FileType::q5_k_m, moe), DType::q5_k);
  EXPECT_EQ(choose_quant_type("blk.3.attn_v.weight", 3, 32, FileType::q2_k, moe), DType::q8_0);
}

TEST(QuantMixture, FtypeNames) {
  EXPECT_EQ(file_type_from_name("q4_K_M"), FileType::q4_k_m);
  EXPECT_EQ(file_type_from_name("Q4_K_M"), FileType::q4_k_m);
  EXPECT_EQ(file_type_from_name("q8_0"), FileType::q8_0);
  EXPECT_EQ(file_type_from_name("q6_k"), FileType::q6_k);
  EXPECT_FALSE(file_type_from_name("q5_K").has_value()) << "only the q5_K_S and q5_K_M mixes";
  EXPECT_EQ(file_type_from_name("Q3_K_M"), FileType::q3_k_m);
  EXPECT_EQ(file_type_from_name("iq4_XS"), FileType::iq4_xs);
  EXPECT_EQ(file_type_gguf_id(FileType::q2_k), 10u);
  EXPECT_EQ(file_type_gguf_id(FileType::q3_k_l), 13u);
  EXPECT_EQ(file_type_gguf_id(FileType::q5_k_m), 17u);
  EXPECT_EQ(file_type_gguf_id(FileType::iq4_nl), 25u);
  EXPECT_EQ(file_type_gguf_id(FileType::iq4_xs), 30u);
  EXPECT_FALSE(file_type_from_name("").has_value());
  EXPECT_FALSE(file_type_is_quantized(*file_type_from_name("f16"))) << "loom quantize rejects float types";
  EXPECT_EQ(file_type_gguf_id(FileType::q4_k_m), 15u);
  EXPECT_EQ(file_type_gguf_id(FileType::q8_0), 7u);
  EXPECT_EQ(file_type_gguf_id(FileType::q4_0), 2u);
  EXPECT_EQ(file_type_gguf_id(FileType::q6_k), 18u);
  EXPECT_EQ(file_type_from_name("MXFP4_MOE"), FileType::mxfp4_moe);
  EXPECT_EQ(file_type_from_name("mxfp4_moe"), FileType::mxfp4_moe);
  EXPECT_EQ(file_type_from_name("Mxfp4_MoE"), FileType::mxfp4_moe);
  EXPECT_FALSE(file_type_from_name("mxfp4").has_value()) << "a tensor type, not a file type";
  EXPECT_EQ(std::string(file_type_name(FileType::mxfp4_moe)), "MXFP4_MOE");
  EXPECT_EQ(file_type_gguf_id(FileType::mxfp4_moe), 38u) << "llama.cpp's LLAMA_FTYPE_MOSTLY_MXFP4_MOE";
  EXPECT_EQ(file_type_base(FileType::mxfp4_moe), DType::mxfp4);
  EXPECT_TRUE(file_type_is_quantized(FileType::mxfp4_moe)) << "loom quantize takes it";
}

// Every file type's canonical name, in any case, parses back to it; the list holds each once.
TEST(QuantMixture, FtypeNamesRoundTrip) {
  std::set<std::string> names;
  for (FileType f : all_file_types()) {
    std::string name = file_type_name(f);
    EXPECT_EQ(file_type_from_name(name), f) << name;
    std::string upper = name, lower = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(file_type_from_name(upper), f) << upper;
    EXPECT_EQ(file_type_from_name(lower), f) << lower;
    EXPECT_TRUE(names.insert(lower).second) << name << " listed twice";
  }
  EXPECT_EQ(names.size(), 21u);
  EXPECT_TRUE(names.count("mxfp4_moe"));
}

// MXFP4_MOE, as llama.cpp's llama_tensor_get_type has it: the 3-D (stacked expert) weights in mxfp4,
// every other quantizable tensor in q8_0, output and token embeddings included; 1-D tensors, biases,
// norms, sinks and the router kept; rows that 32 does not divide in f16.
TEST(QuantMixture, Mxfp4MoeRule) {
  const FileType f = FileType::mxfp4_moe;
  const MixtureModelInfo moe{.n_layer = 2, .tied_embeddings = false, .n_expert = 8, .n_gqa = 4};
  const Shape exps{2880, 2880, 32, 1}, mat{2880, 4096, 1, 1};
  EXPECT_EQ(choose_quant_type("blk.0.ffn_gate_exps.weight", 0, 2, f, moe, exps), DType::mxfp4);
  EXPECT_EQ(choose_quant_type("blk.1.ffn_up_exps.weight", 1, 2, f, moe, exps), DType::mxfp4);
  EXPECT_EQ(choose_quant_type("blk.1.ffn_down_exps.weight", 1, 2, f, moe, exps), DType::mxfp4);
  EXPECT_EQ(choose_quant_type("blk.1.ffn_gate_up_exps.weight", 1, 2, f, moe, exps), DType::mxfp4);
  EXPECT_EQ(choose_quant_type("blk.0.attn_q.weight", 0, 2, f, moe, mat), DType::q8_0);
  EXPECT_EQ(choose_quant_type("blk.0.attn_v.weight", 0, 2, f, moe, mat), DType::q8_0) << "no attn_v bump";
  EXPECT_EQ(choose_quant_type("blk.0.attn_output.weight", 0, 2, f, moe, mat), DType::q8_0);
  EXPECT_EQ(choose_quant_type("blk.0.ffn_down.weight", 0, 2, f, moe, mat), DType::q8_0) << "dense FFN";
  EXPECT_EQ(choose_quant_type("blk.0.ffn_down_shexp.weight", 0, 2, f, moe, mat), DType::q8_0) << "shared";
  EXPECT_EQ(choose_quant_type("output.weight", 0, 2, f, moe, mat), DType::q8_0) << "not q6_K";
  EXPECT_EQ(choose_quant_type("token_embd.weight", 0, 2, f, moe, mat), DType::q8_0);
  EXPECT_EQ(choose_quant_type("token_embd.weight", 0, 2, f, {.n_layer = 2, .tied_embeddings = true}, mat),
            DType::q8_0);
  EXPECT_EQ(choose_quant_type("blk.0.ffn_up_exps.weight", 0, 2, f, moe), DType::q8_0)
      << "the shape decides, not the name: a 2-D tensor is not a stack of experts";

  // The whole rule over a gpt-oss-like list, with the fallback and the tensors it keeps.
  const std::vector<std::pair<MixtureTensor, DType>> cases = {
      {{"token_embd.weight", {160, 512, 1, 1}}, DType::q8_0},
      {{"blk.0.attn_norm.weight", {160, 1, 1, 1}}, DType::f32},  // kept (f32 reads as "no choice")
      {{"blk.0.attn_q.weight", {160, 512, 1, 1}}, DType::q8_0},
      {{"blk.0.attn_q.bias", {512, 1, 1, 1}}, DType::f32},
      {{"blk.0.attn_v.weight", {160, 128, 1, 1}}, DType::q8_0},
      {{"blk.0.attn_sinks.weight", {8, 1, 1, 1}}, DType::f32},
      {{"blk.0.attn_output.weight", {512, 160, 1, 1}}, DType::q8_0},
      {{"blk.0.ffn_gate_inp.weight", {160, 8, 1, 1}}, DType::f32},  // the router
      {{"blk.0.ffn_gate_exps.weight", {160, 64, 8, 1}}, DType::mxfp4},
      {{"blk.0.ffn_gate_exps.bias", {64, 8, 1, 1}}, DType::f32},
      {{"blk.0.ffn_up_exps.weight", {160, 64, 8, 1}}, DType::mxfp4},
      {{"blk.0.ffn_down_exps.weight", {64, 160, 8, 1}}, DType::mxfp4},
      {{"blk.1.ffn_down_exps.weight", {100, 160, 8, 1}}, DType::f16},  // 100 % 32 != 0
      {{"blk.1.attn_k.weight", {40, 128, 1, 1}}, DType::f16},          // 40 % 32 != 0
      {{"blk.1.ffn_gate_exps.weight", {96, 64, 8, 1}}, DType::mxfp4},  // 96 = 3 x 32
      {{"output_norm.weight", {160, 1, 1, 1}}, DType::f32},
      {{"output.weight", {160, 512, 1, 1}}, DType::q8_0},
  };
  std::vector<MixtureTensor> tensors;
  for (const auto& c : cases) tensors.push_back(c.first);
  const auto choices = choose_tensor_types(f, tensors, moe);
  ASSERT_EQ(choices.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first.name);
    const bool kept = cases[i].second == DType::f32;
    EXPECT_EQ(choices[i].quantizable, !kept);
    if (!kept) EXPECT_EQ(dtype_name(choices[i].type), std::string(dtype_name(cases[i].second)));
  }
  EXPECT_EQ(choices[12].wanted, DType::mxfp4) << "the fallback, not the rule, makes it f16";
  EXPECT_EQ(choices[13].wanted, DType::q8_0);

  // --pure: every quantizable tensor in mxfp4, then the fallback.
  const auto pure = choose_tensor_types(f, tensors, moe, /*pure=*/true);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first.name);
    EXPECT_EQ(pure[i].quantizable, choices[i].quantizable);
    if (pure[i].quantizable)
      EXPECT_EQ(pure[i].type, cases[i].first.ne[0] % 32 == 0 ? DType::mxfp4 : DType::f16);
  }
}

// ---- whole files --------------------------------------------------------------------------------------

TEST_F(QuantizeCmd, Q4KMMixtureValuesAndMetadata) {
  const std::string in = model();
  const std::string out = path("out.gguf");
  size_t progress_calls = 0;
  QuantizeOptions opts;
  opts.n_threads = 3;
  opts.on_tensor = [&](const QuantizeProgress& p) {
    EXPECT_EQ(p.index, progress_calls / 2);
    EXPECT_EQ(p.done, progress_calls % 2 == 1) << "a start, then a done, per tensor";
    EXPECT_EQ(p.count, model_.tensors.size());
    EXPECT_LE(p.bytes_done, p.bytes_total);
    ++progress_calls;
  };
  auto r = quantize_gguf(in, out, FileType::q4_k_m, opts);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(progress_calls, 2 * model_.tensors.size());
  EXPECT_EQ(r->n_threads, 3);
  EXPECT_LT(r->bytes_out, r->bytes_in / 5) << "f32 -> ~4.5-6.6 bits per weight";

  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  check_output(model_, *f, expected_types(model_, FileType::q4_k_m));

  auto src = GgufFile::open(in);
  ASSERT_TRUE(src.ok());
  ASSERT_EQ(f->kvs().size(), src->kvs().size() + 1) << "every key plus general.quantization_version";
  for (size_t i = 0; i < src->kvs().size(); ++i) {
    const GgufKV& a = src->kvs()[i];
    const GgufKV& b = f->kvs()[i];
    EXPECT_EQ(a.key, b.key) << "order is kept";
    if (a.key == "general.file_type") continue;
    EXPECT_EQ(a.value.type(), b.value.type()) << a.key;
    ASSERT_EQ(a.value.raw().size(), b.value.raw().size()) << a.key;
    EXPECT_EQ(std::memcmp(a.value.raw().data(), b.value.raw().data(), a.value.raw().size()), 0) << a.key;
  }
  EXPECT_EQ(*f->get_u32("general.file_type"), 15u);
  EXPECT_EQ(*f->get_u32("general.quantization_version"), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  for (const GgufTensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), static_cast<size_t>(kVocab));
}

TEST_F(QuantizeCmd, SingleTypes) {
  const std::string in = model();
  for (FileType f : {FileType::q8_0, FileType::q4_0, FileType::q4_k, FileType::q6_k, FileType::q4_1,
                     FileType::q5_0, FileType::q5_1, FileType::q3_k_s, FileType::q5_k_s, FileType::iq4_nl}) {
    SCOPED_TRACE(file_type_name(f));
    const std::string out = path(std::string("out-") + file_type_name(f) + ".gguf");
    auto r = quantize_gguf(in, out, f, {.n_threads = 2, .on_tensor = {}});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto g = GgufFile::open(out);
    ASSERT_TRUE(g.ok());
    check_output(model_, *g, expected_types(model_, f));
    EXPECT_EQ(*g->get_u32("general.file_type"), file_type_gguf_id(f));
  }
}

TEST_F(QuantizeCmd, TiedEmbeddingsGetTheOutputType) {
  ModelOptions o;
  o.with_output = false;
  const std::string in = model(o);
  const std::string out = path("out.gguf");
  auto r = quantize_gguf(in, out, FileType::q4_k_m);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto g = GgufFile::open(out);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->find_tensor("token_embd.weight")->dtype, DType::q6_k);
  check_output(model_, *g, expected_types(model_, FileType::q4_k_m, /*tied=*/true));
}

TEST_F(QuantizeCmd, ThreadCountDoesNotChangeBytes) {
  const std::string in = model();
  ASSERT_TRUE(quantize_gguf(in, path("a.gguf"), FileType::q4_k_m, {.n_threads = 1, .on_tensor = {}}).ok());
  ASSERT_TRUE(quantize_gguf(in, path("b.gguf"), FileType::q4_k_m, {.n_threads = 7, .on_tensor = {}}).ok());
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
  };
  const auto a = read(path("a.gguf")), b = read(path("b.gguf"));
  EXPECT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b);
}

// `loom gen-model --shape gptoss-tiny --type f32` (the same writer) quantized to MXFP4_MOE: each
// tensor's type worked out by hand (expert matrices mxfp4, other 2-D weights but the router q8_0, the
// rest copied), values within each type's bound, general.file_type 38; then the file runs on the
// CPU: a prompt and greedy steps, logits finite and near the f32 model's for the same tokens.
TEST_F(QuantizeCmd, Mxfp4MoeGptOssEndToEnd) {
  const llm::SynthShape* shape = llm::find_synth_shape("gptoss-tiny");
  ASSERT_NE(shape, nullptr);
  const std::string in = path("gptoss-tiny-f32.gguf"), out = path("gptoss-tiny-mxfp4_moe.gguf");
  llm::SynthOptions so;
  so.n_threads = 2;
  so.progress = false;
  ASSERT_TRUE(llm::write_synth_model(in, *shape, FileType::f32, so).ok());
  auto r = quantize_gguf(in, out, *file_type_from_name("MXFP4_MOE"), {.n_threads = 2, .on_tensor = {}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_LT(r->bytes_out, r->bytes_in / 3) << "f32 -> 4.25 (experts) and 8.5 bits per weight";

  auto src = GgufFile::open(in);
  auto q = GgufFile::open(out);
  ASSERT_TRUE(src.ok() && q.ok());
  EXPECT_EQ(*q->get_u32("general.file_type"), 38u);
  EXPECT_EQ(*q->get_u32("general.quantization_version"), 2u);
  ASSERT_EQ(q->tensors().size(), src->tensors().size());
  std::map<DType, int> counts;
  for (size_t i = 0; i < src->tensors().size(); ++i) {
    const GgufTensorInfo& a = src->tensors()[i];
    const GgufTensorInfo& b = q->tensors()[i];
    const std::string name(a.name);
    SCOPED_TRACE(name);
    ASSERT_EQ(b.name, a.name);
    EXPECT_EQ(b.ne, a.ne);
    ASSERT_TRUE(a.dtype.has_value() && b.dtype.has_value());
    ASSERT_EQ(*a.dtype, DType::f32) << "gen-model --type f32 writes every tensor in f32";
    const bool matrix = llm::significant_dims(a.ne) >= 2 && name.ends_with(".weight");
    const DType want = name.ends_with("_exps.weight")                                        ? DType::mxfp4
                       : matrix && name.find("ffn_gate_inp") == std::string::npos ? DType::q8_0
                                                                                            : DType::f32;
    if (name.ends_with("_exps.weight")) EXPECT_GT(a.ne[2], 1) << "experts stacked on the third dimension";
    EXPECT_EQ(dtype_name(*b.dtype), std::string(dtype_name(want)));
    ++counts[*b.dtype];
    if (want == DType::f32) {
      ASSERT_EQ(b.size, a.size);
      EXPECT_EQ(std::memcmp(b.data, a.data, a.size), 0) << "copied unchanged";
      continue;
    }
    const int64_t ne0 = a.ne[0], rows = a.nelements() / ne0;
    const float* x = reinterpret_cast<const float*>(a.data);
    std::vector<float> y(static_cast<size_t>(ne0));
    double err = 0.0, ref = 0.0;
    for (int64_t row = 0; row < rows; ++row) {
      dequantize_row(*b.dtype, b.data + static_cast<size_t>(row) * dtype_row_size(*b.dtype, ne0), y.data(), ne0);
      for (int64_t j = 0; j < ne0; ++j) {
        const double v = x[row * ne0 + j];
        err += (y[static_cast<size_t>(j)] - v) * (y[static_cast<size_t>(j)] - v);
        ref += v * v;
      }
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_LE(rel, error_bound(want));
    EXPECT_GT(rel, 0.0);
  }
  EXPECT_EQ(counts[DType::mxfp4], 3 * shape->n_layer) << "gate, up and down experts of every layer";
  // token_embd, output, and q, k, v, output of every layer
  EXPECT_EQ(counts[DType::q8_0], 2 + 4 * shape->n_layer);
  EXPECT_GT(counts[DType::f32], 0);

  // Both files on the CPU: the quantized one greedy from a prompt, the f32 one fed the same tokens.
  auto backend = make_cpu_backend(2);
  auto mq = llm::Model::load(out, *backend, {.progress = false, .print_summary = false});
  ASSERT_TRUE(mq.ok()) << mq.status().to_string();
  auto mf = llm::Model::load(in, *backend, {.progress = false, .print_summary = false});
  ASSERT_TRUE(mf.ok()) << mf.status().to_string();
  EXPECT_EQ((*mq)->hparams().arch, llm::Arch::gpt_oss);
  const int n_vocab = static_cast<int>((*mq)->hparams().n_vocab);
  ASSERT_GT(n_vocab, 1);
  llm::ContextParams cp;
  cp.n_ctx = 32;
  cp.n_batch = 8;
  auto cq = llm::Context::create(**mq, cp);
  auto cf = llm::Context::create(**mf, cp);
  ASSERT_TRUE(cq.ok() && cf.ok());
  std::vector<int32_t> tokens = {3, 141, 59, 265, 35, 89};
  const size_t n_prompt = tokens.size();
  constexpr int kSteps = 6;
  for (int step = 0; step <= kSteps; ++step) {
    SCOPED_TRACE(step);
    const size_t first = step == 0 ? 0 : tokens.size() - 1;
    const std::span<const int32_t> feed = std::span<const int32_t>(tokens).subspan(first);
    auto lq = (*cq)->decode(feed, static_cast<int>(first));
    ASSERT_TRUE(lq.ok()) << lq.status().to_string();
    const std::vector<float> got(lq->begin(), lq->end());
    auto lf = (*cf)->decode(feed, static_cast<int>(first));
    ASSERT_TRUE(lf.ok()) << lf.status().to_string();
    ASSERT_EQ(got.size(), static_cast<size_t>(n_vocab));
    ASSERT_EQ(lf->size(), got.size());
    double num = 0.0, den = 0.0;
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_TRUE(std::isfinite(got[j])) << "logit " << j;
      num += (got[j] - (*lf)[j]) * (got[j] - (*lf)[j]);
      den += static_cast<double>((*lf)[j]) * (*lf)[j];
    }
    const double nmse = num / den;
    std::printf("[ mxfp4_moe ] step %d NMSE vs f32 %.3g\n", step, nmse);
    EXPECT_LT(nmse, kMxfp4MoeNmseBound) << "the quantized model computes the f32 model's function";
    EXPECT_GT(nmse, 0.0) << "the quantized weights are the ones that ran";
    if (step < kSteps) {
      int best = 0;
      for (int j = 1; j < n_vocab; ++j)
        if (got[static_cast<size_t>(j)] > got[static_cast<size_t>(best)]) best = j;
      tokens.push_back(best);
    }
  }
  EXPECT_EQ(tokens.size(), n_prompt + kSteps);
}

TEST_F(QuantizeCmd, PureTurnsTheMixtureOff) {
  auto in = GgufFile::open(model());
  ASSERT_TRUE(in.ok());
  for (FileType f : {FileType::q4_k_m, FileType::q3_k_m, FileType::q2_k}) {
    SCOPED_TRACE(file_type_name(f));
    auto plan = plan_quantization(*in, f, /*pure=*/true);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    const DType base = file_type_base(f);
    int quantized = 0;
    for (const auto& t : plan->tensors) {
      if (!t.quantizable) continue;
      const DType want = fallback_quant_type(base, t.ne[0]);  // output.weight too: no q6_K
      EXPECT_EQ(t.dst_type, dtype_traits(want).gguf_id) << t.name;
      ++quantized;
    }
    EXPECT_GT(quantized, 10);
  }
}

TEST_F(QuantizeCmd, Errors) {
  const std::string in = model();
  auto r = quantize_gguf(path("missing.gguf"), path("o.gguf"), FileType::q8_0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::io_error);

  r = quantize_gguf(in, in, FileType::q8_0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(GgufFile::open(in).ok()) << "the input is untouched";

  r = quantize_gguf(in, path("no/such/dir/o.gguf"), FileType::q8_0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::io_error);

  // float file types are gen-model's, not quantize's
  r = quantize_gguf(in, path("o.gguf"), FileType::f16);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("'f16' is not one"), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(path("o.gguf")));

  // not a GGUF file
  const std::string junk = path("junk.gguf");
  std::ofstream(junk) << "this is not a model";
  r = quantize_gguf(junk, path("o.gguf"), FileType::q8_0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::format_error);
  EXPECT_FALSE(fs::exists(path("o.gguf")));
}

TEST_F(QuantizeCmd, RejectsNaNWeightsNamingTheElement) {
  ModelOptions o;
  o.nan_in = 1.0f;
  const std::string in = model(o);
  const std::string out = path("out.gguf");
  auto r = quantize_gguf(in, out, FileType::q4_k, {.n_threads = 4, .on_tensor = {}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("tensor 'blk.2.ffn_up.weight': row 3 column 17 is nan"),
            std::string::npos)
      << r.status().message();
  EXPECT_FALSE(fs::exists(out)) << "a failed run leaves no output";
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "temporary left: " << e.path();
}

TEST_F(QuantizeCmd, RejectsQuantizedInputAndSplitFiles) {
  ModelOptions o;
  o.quantized_q = true;
  std::string in = model(o);
  auto r = quantize_gguf(in, path("o.gguf"), FileType::q4_k_m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unsupported);
  EXPECT_NE(r.status().message().find("'blk.3.attn_q.weight' is q8_0"), std::string::npos)
      << r.status().message();
  // the same type needs no conversion: q8_0 -> q8_0 is a copy
  r = quantize_gguf(in, path("o.gguf"), FileType::q8_0);
  EXPECT_TRUE(r.ok()) << r.status().to_string();

  ModelOptions s;
  s.split = true;
  in = model(s);
  r = quantize_gguf(in, path("o2.gguf"), FileType::q8_0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unsupported);
  EXPECT_NE(r.status().message().find("split"), std::string::npos);
}

// ---- loom info ----------------------------------------------------------------------------------------

TEST_F(QuantizeCmd, InfoDescribesMetadataTensorsAndTotals) {
  const std::string in = model();
  const std::string out = path("out.gguf");
  ASSERT_TRUE(quantize_gguf(in, out, FileType::q4_k_m).ok());
  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.ok());
  const std::string text = describe_gguf(*f, 3);
  auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("GGUF v3")) << text;
  EXPECT_TRUE(has("metadata: 10 keys")) << text;
  EXPECT_TRUE(has("general.architecture")) << text;
  EXPECT_TRUE(has("\"llama\"")) << text;
  EXPECT_TRUE(has("array[string]")) << text;
  EXPECT_TRUE(has("[\"tok0\", \"tok1\", \"tok2\", ... (48 elements)]")) << text;
  EXPECT_TRUE(has("tensors:  " + std::to_string(model_.tensors.size()))) << text;
  uint64_t params = 0;
  for (const auto& t : model_.tensors) params += t.values.size();
  EXPECT_TRUE(has("parameters (" + std::to_string(params) + ")")) << text;
  // one line per tensor with its type and shape
  EXPECT_TRUE(has("blk.3.attn_v.weight")) << text;
  size_t lines_with_q6 = 0;
  for (size_t pos = 0; (pos = text.find(" q6_K ", pos)) != std::string::npos; ++pos) ++lines_with_q6;
  EXPECT_EQ(lines_with_q6, 4u + 4u + 1u + 1u)
      << "attn_v and ffn_down in 4 layers, output, the per-type total\n"
      << text;
  EXPECT_TRUE(has("[256, 64]")) << text;
  EXPECT_TRUE(has("support:  Loom can run this file: architecture llama and every tensor type are supported"))
      << text;

  // a bad file is a clean error, not a crash
  const std::string junk = path("junk.gguf");
  std::ofstream(junk) << "GGUF but not really";
  auto bad = GgufFile::open(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(junk), std::string::npos);
}

// A GGUF of an architecture Loom does not know, with tensors of a type it cannot compute with:
// `loom info` says so from the metadata alone. What Loom supports comes from the queries
// (llm::supported_archs, dtype_from_gguf), so adding an architecture or a type keeps this true.
TEST_F(QuantizeCmd, InfoListsTheArchitectureAndTypesLoomCannotRun) {
  // IQ2_XXS (16) and TQ1_0 (34): types no branch adds; whichever Loom lacks.
  uint32_t type_id = 0;
  for (uint32_t id : {16u, 34u})
    if (!dtype_from_gguf(id) && ggml_type_info(id)) {
      type_id = id;
      break;
    }
  ASSERT_NE(type_id, 0u) << "Loom supports IQ2_XXS and TQ1_0: pick another type Loom lacks";
  const GgmlTypeInfo* ti = ggml_type_info(type_id);
  ASSERT_FALSE(llm::arch_from_name("no-such-arch").has_value());

  GgufWriter w;
  ASSERT_TRUE(w.add_string("general.architecture", "no-such-arch").ok());
  const std::vector<float> norm(256, 1.0f);
  const std::vector<int64_t> ne_norm = {256}, ne_matrix = {256, 2};
  ASSERT_TRUE(w.add_tensor("output_norm.weight", DType::f32, ne_norm, norm.data()).ok());
  const std::vector<uint8_t> raw(2 * ti->type_size * (256 / ti->block_size));
  for (const char* name : {"blk.0.ffn_up.weight", "blk.1.ffn_up.weight"})
    ASSERT_TRUE(w.add_tensor_ggml(name, type_id, ne_matrix, raw.data()).ok());
  const std::string file = path("unsupported.gguf");
  ASSERT_TRUE(w.write(file).ok());
  auto f = GgufFile::open(file);
  ASSERT_TRUE(f.ok()) << f.status().to_string();

  const SupportReport r = check_support(*f);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.arch, "no-such-arch");
  EXPECT_FALSE(r.arch_supported);
  ASSERT_EQ(r.unsupported_types.size(), 1u);  // the f32 norm is fine
  EXPECT_EQ(r.unsupported_types.begin()->first, ti->name);
  EXPECT_EQ(r.unsupported_types.begin()->second,
            (std::vector<std::string>{"blk.0.ffn_up.weight", "blk.1.ffn_up.weight"}));

  const std::string text = describe_gguf(*f);
  auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("support:  Loom cannot run this file:\n")) << text;
  std::string archs;
  for (llm::Arch a : llm::supported_archs())
    archs += (archs.empty() ? "" : ", ") + std::string(llm::arch_name(a));
  EXPECT_TRUE(has("  architecture 'no-such-arch' is not supported (supported: " + archs + ")\n")) << text;
  EXPECT_TRUE(has("  tensor type " + std::string(ti->name) +
                  " is not supported: 2 tensors (blk.0.ffn_up.weight, blk.1.ffn_up.weight)\n"))
      << text;
  std::string types;
  for (int i = 0; i < kDTypeCount; ++i)
    types += (i ? ", " : "") + std::string(dtype_name(static_cast<DType>(i)));
  EXPECT_TRUE(has("  (supported tensor types: " + types + ")\n")) << text;

  // Only the architecture: the types line stays out. Many tensors of one type: a few names shown.
  GgufWriter w2;
  ASSERT_TRUE(w2.add_string("general.architecture", "no-such-arch").ok());
  ASSERT_TRUE(w2.add_tensor("output_norm.weight", DType::f32, ne_norm, norm.data()).ok());
  const std::string file2 = path("arch_only.gguf");
  ASSERT_TRUE(w2.write(file2).ok());
  auto f2 = GgufFile::open(file2);
  ASSERT_TRUE(f2.ok());
  const std::string text2 = describe_support(check_support(*f2));
  EXPECT_NE(text2.find("architecture 'no-such-arch' is not supported"), std::string::npos) << text2;
  EXPECT_EQ(text2.find("tensor type"), std::string::npos) << text2;

  SupportReport many;
  many.arch = "llama";
  many.arch_supported = true;
  many.unsupported_types[ti->name] = {"a", "b", "c", "d", "e", "f"};
  const std::string text3 = describe_support(many);
  EXPECT_NE(text3.find("6 tensors (a, b, c, d, ... 2 more)"), std::string::npos) << text3;
  EXPECT_EQ(text3.find("architecture"), std::string::npos) << text3;
}

}  // namespace
}  // namespace loom::app
