// Every block format against the reference vectors made by llama.cpp's own reference code
// (tests/data/quant-vectors, provenance in tests/data/README.md), read with Loom's GGUF reader:
// dequantization must reproduce w_ref bit for bit; the CPU dot kernels (scalar and the dispatched,
// possibly AVX2, ones) must give w_ref . x within the rounding of their contract (vec_dot.h) once
// the activations' own quantization is accounted for, and the float64 references within that
// quantization's error bound.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "loom/gguf.h"
#include "loom/quant.h"

namespace loom {
namespace {

constexpr int64_t kCols = 1024;  // elements per row in every vector file
constexpr int64_t kRows = 8;

struct Vectors {
  const GgufTensorInfo* w = nullptr;  // points into the fixture's file
  DType type = DType::f32;
  std::vector<float> w_ref, x1, y1_ref, x4, y4_ref;
};

std::vector<float> read_f32(const GgufFile& f, const char* name, int64_t n) {
  auto t = f.tensor(name);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return {};
  EXPECT_EQ((*t)->ggml_type, 0u) << name;
  EXPECT_EQ((*t)->nelements(), n) << name;
  std::vector<float> v(n);
  std::memcpy(v.data(), (*t)->data, n * sizeof(float));
  return v;
}

std::string vector_path(const std::string& type) {
  return std::string(LOOM_TEST_DATA_DIR) + "/quant-vectors/" + type + ".gguf";
}

class QuantVectors : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto f = GgufFile::open(vector_path(GetParam()));
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto w = f->tensor("w");
    ASSERT_TRUE(w.ok()) << w.status().message();
    auto t = f->dtype_of(**w);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_EQ((*w)->ne[0], kCols);
    ASSERT_EQ((*w)->ne[1], kRows);
    v_.type = *t;
    v_.w = *w;
    v_.w_ref = read_f32(*f, "w_ref", kCols * kRows);
    v_.x1 = read_f32(*f, "x1", kCols);
    v_.y1_ref = read_f32(*f, "y1_ref", kRows);
    v_.x4 = read_f32(*f, "x4", kCols * 4);
    v_.y4_ref = read_f32(*f, "y4_ref", kRows * 4);
    file_.emplace(std::move(*f));
    ASSERT_FALSE(HasFailure());
  }
  const uint8_t* row(int64_t r) const { return v_.w->data + r * dtype_row_size(v_.type, kCols); }
  std::optional<GgufFile> file_;
  Vectors v_;
};

TEST_P(QuantVectors, NameAndSizesMatchTheFile) {
  EXPECT_STREQ(dtype_name(v_.type), v_.w->type_info->name);
  EXPECT_EQ(dtype_block_size(v_.type), static_cast<int64_t>(v_.w->type_info->block_size));
  EXPECT_EQ(dtype_type_size(v_.type), v_.w->type_info->type_size);
  EXPECT_EQ(dtype_traits(v_.type).gguf_id, v_.w->ggml_type);
}

TEST_P(QuantVectors, DequantizeIsBitExact) {
  std::vector<float> out(kCols);
  int64_t mismatches = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    dequantize_row(v_.type, row(r), out.data(), kCols);
    for (int64_t i = 0; i < kCols; ++i) {
      const float ref = v_.w_ref[r * kCols + i];
      if (std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(ref) && mismatches++ < 5)
        ADD_FAILURE() << "row " << r << " element " << i << ": " << out[i] << " != reference " << ref;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// The activations as the kernel sees them (after its own quantization), as floats.
std::vector<float> kernel_activations(const cpu::VecDotKernel& k, const float* x,
                                      std::vector<uint8_t>& packed) {
  packed.assign(cpu::act_row_size(k.act_type, kCols), 0);
  k.from_float(x, packed.data(), kCols);
  std::vector<float> out(kCols);
  switch (k.act_type) {
    case cpu::ActType::f32:
      std::memcpy(out.data(), packed.data(), kCols * sizeof(float));
      break;
    case cpu::ActType::f16:
      dequantize_row(DType::f16, packed.data(), out.data(), kCols);
      break;
    case cpu::ActType::q8_0:
      dequantize_row(DType::q8_0, packed.data(), out.data(), kCols);
      break;
    case cpu::ActType::q8_k:
      dequantize_row_q8_k(reinterpret_cast<const BlockQ8_K*>(packed.data()), out.data(), kCols);
      break;
  }
  return out;
}

void check_kernel(const cpu::VecDotKernel& k, const Vectors& v, const uint8_t* w_data,
                  const std::vector<float>& x, const std::vector<float>& y_ref, int nc, const char* what) {
  const size_t row_bytes = dtype_row_size(v.type, kCols);
  std::vector<std::vector<uint8_t>> packed(nc);
  std::vector<std::vector<float>> xq(nc);
  std::vector<const void*> xs(nc);
  for (int c = 0; c < nc; ++c) {
    xq[c] = kernel_activations(k, x.data() + c * kCols, packed[c]);
    xs[c] = packed[c].data();
  }
  for (int64_t r = 0; r < kRows; ++r) {
    float out[cpu::kDotMaxCols];
    k.dot(kCols, w_data + r * row_bytes, xs.data(), nc, out);
    for (int c = 0; c < nc; ++c) {
      const float* w = v.w_ref.data() + r * kCols;
      const float* xc = x.data() + c * kCols;
      double exact = 0, magnitude = 0, act_error = 0;
      for (int64_t i = 0; i < kCols; ++i) {
        exact += static_cast<double>(w[i]) * xq[c][i];
        magnitude += std::fabs(static_cast<double>(w[i]) * xq[c][i]);
        act_error += std::fabs(static_cast<double>(w[i]) * (xc[i] - xq[c][i]));
      }
      // the kernel's contract: exact block sums, double accumulation, one rounding to float; w_ref
      // itself was rounded to float per element (d*sc, then *q, then - dmin*m), and the float weight
      // types accumulate in float: both a few ulps of the magnitude
      const double tol = 1e-6 * magnitude + 1e-12;
      EXPECT_NEAR(out[c], exact, tol) << what << " row " << r << " column " << c;
      // the float64 reference: off by at most the activations' quantization error
      EXPECT_NEAR(out[c], y_ref[c * kRows + r], act_error + 1e-6 * magnitude + 1e-12)
          << what << " row " << r << " column " << c << " against y_ref";
    }
  }
}

TEST_P(QuantVectors, DotProductsMatchTheReference) {
  const cpu::VecDotKernel* scalar = cpu::vec_dot_kernel_scalar(v_.type);
  ASSERT_NE(scalar, nullptr);
  check_kernel(*scalar, v_, v_.w->data, v_.x1, v_.y1_ref, 1, "scalar x1");
  check_kernel(*scalar, v_, v_.w->data, v_.x4, v_.y4_ref, 4, "scalar x4");
  const cpu::VecDotKernel* fast = cpu::vec_dot_kernel(v_.type);
  ASSERT_NE(fast, nullptr);
  check_kernel(*fast, v_, v_.w->data, v_.x1, v_.y1_ref, 1, "dispatched x1");
  check_kernel(*fast, v_, v_.w->data, v_.x4, v_.y4_ref, 4, "dispatched x4");
}

// The contract (vec_dot.h) makes the scalar and SIMD kernels round to the same float.
TEST_P(QuantVectors, ScalarAndDispatchedKernelsAgreeBitForBit) {
  const cpu::VecDotKernel* scalar = cpu::vec_dot_kernel_scalar(v_.type);
  const cpu::VecDotKernel* fast = cpu::vec_dot_kernel(v_.type);
  ASSERT_TRUE(scalar && fast);
  // float weights accumulate in float in a kernel-specific order; without SIMD there is one kernel
  if (v_.type == DType::bf16 || scalar == fast) return;
  std::vector<uint8_t> packed;
  kernel_activations(*scalar, v_.x4.data(), packed);
  const void* xs[1] = {packed.data()};
  for (int64_t r = 0; r < kRows; ++r) {
    float a, b;
    scalar->dot(kCols, row(r), xs, 1, &a);
    fast->dot(kCols, row(r), xs, 1, &b);
    EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b))
        << "row " << r << ": " << a << " vs " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantVectors,
                         ::testing::Values("bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k",
                                           "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace loom
