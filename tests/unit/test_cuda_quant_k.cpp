// The CUDA backend's K-quant quantizers (src/backend/cuda/kernels/quant_k.cuh), compiled for the
// host, against the CPU reference (src/core/quant_k.cpp through loom::quantize_row): the same
// bytes for every block. The device build runs the same source with each operation pinned to its
// IEEE round-to-nearest intrinsic, so this checks the algorithm, its order of operations and its
// tie breaking; the op test (tests/ops) then compares the two backends on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/quant_k.cuh"
#include "loom/dtype.h"

namespace loom {
namespace {

constexpr int64_t kBlocks = 1000;  // per distribution

using DeviceQuantizer = void (*)(const float*, uint8_t*);

struct Distribution {
  std::string name;
  std::function<float(std::mt19937&)> draw;
  bool in_range = true;  ///< the super-block scales fit f16 without clamping
};

// Inputs that exercise the branches of the scale search: symmetric and one-sided data, outliers,
// f16-subnormal and clamped super-block scales, exact ties (small integers and halves), constant
// and zero sub-blocks.
std::vector<Distribution> distributions() {
  std::vector<Distribution> d;
  d.push_back({"uniform", [](std::mt19937& g) { return std::uniform_real_distribution<float>(-1, 1)(g); }});
  d.push_back({"normal", [](std::mt19937& g) { return std::normal_distribution<float>(0, 1)(g); }});
  d.push_back({"positive", [](std::mt19937& g) { return std::uniform_real_distribution<float>(2, 3)(g); }});
  d.push_back({"negative", [](std::mt19937& g) { return std::uniform_real_distribution<float>(-5, -1)(g); }});
  d.push_back({"outliers", [](std::mt19937& g) {
                 const float v = std::normal_distribution<float>(0, 0.02f)(g);
                 return std::uniform_int_distribution<int>(0, 63)(g) == 0 ? v * 300.0f : v;
               }});
  d.push_back({"tiny", [](std::mt19937& g) { return std::normal_distribution<float>(0, 1e-6f)(g); }});
  d.push_back({"huge", [](std::mt19937& g) { return std::normal_distribution<float>(0, 1e7f)(g); }, false});
  // Small grids put many elements exactly halfway between codes (ties round to even).
  d.push_back({"halves", [](std::mt19937& g) {
                 return static_cast<float>(std::uniform_int_distribution<int>(-8, 8)(g)) * 0.5f;
               }});
  d.push_back({"codes_0_15", [](std::mt19937& g) {
                 return static_cast<float>(std::uniform_int_distribution<int>(0, 15)(g));
               }});
  d.push_back({"codes_0_3", [](std::mt19937& g) {
                 return static_cast<float>(std::uniform_int_distribution<int>(0, 3)(g));
               }});
  d.push_back({"halves_31", [](std::mt19937& g) {
                 return static_cast<float>(std::uniform_int_distribution<int>(-31, 31)(g)) * 0.5f;
               }});
  d.push_back({"integers_100", [](std::mt19937& g) {
                 return static_cast<float>(std::uniform_int_distribution<int>(-100, 100)(g));
               }});
  d.push_back({"wide_range", [](std::mt19937& g) {
                 const float e = std::uniform_real_distribution<float>(-12, 12)(g);
                 return std::ldexp(std::uniform_real_distribution<float>(-1, 1)(g), static_cast<int>(e));
               }});
  return d;
}

// Blocks of `dist`, with some sub-blocks (of 16, the smaller of the two formats') made constant or
// zero so the degenerate fits are reached too.
std::vector<float> make_input(const Distribution& dist, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> x(kBlocks * kQK_K);
  for (float& v : x) v = dist.draw(g);
  for (int64_t s = 0; s < static_cast<int64_t>(x.size()) / 16; ++s) {
    const int pick = std::uniform_int_distribution<int>(0, 39)(g);
    if (pick == 0) std::fill(x.begin() + 16 * s, x.begin() + 16 * s + 16, 0.0f);
    if (pick == 1) std::fill(x.begin() + 16 * s, x.begin() + 16 * s + 16, x[16 * s]);
  }
  return x;
}

// Compares every block; reports the first few that differ with the first differing byte.
void expect_same_blocks(DType t, DeviceQuantizer device, const std::vector<float>& x, const std::string& what,
                        bool in_range) {
  const size_t bytes = dtype_type_size(t);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> ref(dtype_row_size(t, n)), got(ref.size(), 0xAA);
  quantize_row(t, x.data(), ref.data(), n);
  for (int64_t b = 0; b < n / kQK_K; ++b) device(x.data() + b * kQK_K, got.data() + b * bytes);
  int reported = 0;
  for (int64_t b = 0; b < n / kQK_K && reported < 5; ++b) {
    const uint8_t* r = ref.data() + b * bytes;
    const uint8_t* d = got.data() + b * bytes;
    if (std::memcmp(r, d, bytes) == 0) continue;
    size_t k = 0;
    while (r[k] == d[k]) ++k;
    ADD_FAILURE() << dtype_name(t) << " " << what << ": block " << b << " differs first at byte " << k
                  << " (cpu " << int{r[k]} << ", device code " << int{d[k]} << ")";
    ++reported;
  }

  // The comparison must be about real quantization: the reference round trip follows the data
  // (loosely where the scales clamp at f16's largest value).
  std::vector<float> back(n);
  dequantize_row(t, ref.data(), back.data(), n);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (static_cast<double>(back[i]) - x[i]) * (static_cast<double>(back[i]) - x[i]);
    norm += static_cast<double>(x[i]) * x[i];
  }
  ASSERT_GT(norm, 0.0) << what;
  EXPECT_GT(err / norm, 0.0) << what;
  EXPECT_LT(err / norm, in_range ? 0.02 : 0.5) << dtype_name(t) << " " << what;
}

TEST(CudaQuantK, Q4KMatchesCpuReference) {
  uint32_t seed = 1;
  for (const Distribution& d : distributions())
    expect_same_blocks(DType::q4_k, cuda::quantize_block_q4_k, make_input(d, seed++), d.name, d.in_range);
}

TEST(CudaQuantK, Q6KMatchesCpuReference) {
  uint32_t seed = 100;
  for (const Distribution& d : distributions())
    expect_same_blocks(DType::q6_k, cuda::quantize_block_q6_k, make_input(d, seed++), d.name, d.in_range);
}

// Non-finite inputs go through the same comparisons (NaN is never taken by min/max, maps to the
// low code), so the bytes agree there too.
TEST(CudaQuantK, NonFiniteInputsMatchCpuReference) {
  std::mt19937 g(7);
  std::vector<float> x(8 * kQK_K);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(g);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[kQK_K + 40] = std::numeric_limits<float>::infinity();
  x[2 * kQK_K] = std::numeric_limits<float>::quiet_NaN();  // first element of a sub-block
  x[3 * kQK_K + 100] = -std::numeric_limits<float>::infinity();
  x[4 * kQK_K + 7] = 3e38f;
  x[4 * kQK_K + 8] = -3e38f;
  for (DType t : {DType::q4_k, DType::q6_k}) {
    const size_t bytes = dtype_type_size(t);
    std::vector<uint8_t> ref(dtype_row_size(t, static_cast<int64_t>(x.size()))), got(ref.size());
    quantize_row(t, x.data(), ref.data(), static_cast<int64_t>(x.size()));
    const DeviceQuantizer device = t == DType::q4_k ? cuda::quantize_block_q4_k : cuda::quantize_block_q6_k;
    for (size_t b = 0; b < x.size() / kQK_K; ++b) device(x.data() + b * kQK_K, got.data() + b * bytes);
    for (size_t b = 0; b < x.size() / kQK_K; ++b)
      EXPECT_EQ(std::memcmp(ref.data() + b * bytes, got.data() + b * bytes, bytes), 0)
          << dtype_name(t) << " block " << b;
  }
}

}  // namespace
}  // namespace loom
