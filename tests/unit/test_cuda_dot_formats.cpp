// The CUDA backend's quantized dot products (src/backend/cuda/kernels/quantize_act.cuh), compiled
// for the host and run in the order one warp of mul_mat_q8_kernel takes the blocks, against the
// CPU backend's scalar and AVX2 kernels: the same float for every row. This is the numerics
// contract of docs/NUMERICS.md -- exact integer block sums, block terms formed and summed in
// double, one rounding to float -- under which the two backends' quantized models give identical
// logits although their summation orders differ. A block term left in float (as one was, found by
// this test's predecessor experiment) shows here as thousands of mismatching rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "backend/cuda/kernels/dot_blocks.cuh"
#include "backend/cuda/kernels/mat_vec_fast_formats.cuh"
#include "backend/cuda/kernels/quant_blocks.cuh"
#include "backend/cuda/kernels/quantize_act.cuh"
#include "loom/dtype.h"
#include "loom/quant.h"

namespace loom {
namespace {

constexpr int kWarp = 32;

// Activation blocks in the device layout, from the CPU's converted row: q8_K blocks are byte for byte
// the CPU's; q8_0 ones carry two bytes of padding after the scale.
template <class Act>
std::vector<Act> device_acts(const std::vector<uint8_t>& row, int64_t n_blocks) {
  std::vector<Act> out(n_blocks);
  if constexpr (std::is_same_v<Act, cuda::ActQ8_K>) {
    std::memcpy(out.data(), row.data(), n_blocks * sizeof(Act));
  } else {
    const auto* src = reinterpret_cast<const BlockQ8_0*>(row.data());
    for (int64_t b = 0; b < n_blocks; ++b) {
      out[b].d = src[b].d;
      out[b].unused = 0;
      std::memcpy(out[b].qs, src[b].qs, sizeof(out[b].qs));
    }
  }
  return out;
}

// dot_columns (mat_vec.cuh) for one row and one column, lane by lane, then warp_sum's xor tree.
template <class D>
float warp_dot(const uint8_t* w, int64_t n_blocks, const typename D::Act* x) {
  double lane[kWarp] = {};
  for (int l = 0; l < kWarp; ++l) {
    const int part = l % D::kParts;
    for (int64_t ib = l / D::kParts; ib < n_blocks; ib += kWarp / D::kParts)
      lane[l] += D::dot(D::decode(w + ib * D::kBytes, part), x[ib], part);
  }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    double next[kWarp];
    for (int l = 0; l < kWarp; ++l) next[l] = lane[l] + lane[l ^ o];
    std::copy(next, next + kWarp, lane);
  }
  return static_cast<float>(lane[0]);
}

template <class D>
void check_type(DType type) {
  SCOPED_TRACE(dtype_name(type));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const cpu::VecDotKernel* scalar = cpu::vec_dot_kernel_scalar(type);
  const cpu::VecDotKernel* avx2 = cpu::vec_dot_kernel_avx2(type);
  ASSERT_NE(scalar, nullptr);
  // lengths whose block counts are and are not multiples of the lanes' stride
  for (int64_t k : {256, 2048, 2816, 4096 + 256}) {
    const int64_t n_blocks = k / D::kBlock;
    for (int r = 0; r < 150; ++r) {
      std::vector<float> w(k), x(k);
      const float w_scale = r % 3 == 0 ? 1e-3f : 0.05f;
      for (float& v : w) v = normal(rng) * w_scale;
      for (float& v : x) v = normal(rng) * (r % 5 == 0 ? 30.0f : 1.0f);
      std::vector<uint8_t> wq(dtype_row_size(type, k));
      quantize_row(type, w.data(), wq.data(), k);
      std::vector<uint8_t> xq(cpu::act_row_size(scalar->act_type, k));
      scalar->from_float(x.data(), xq.data(), k);
      const float want = cpu::vec_dot(*scalar, k, wq.data(), xq.data());
      const auto acts = device_acts<typename D::Act>(xq, n_blocks);
      const float got = warp_dot<D>(wq.data(), n_blocks, acts.data());
      ASSERT_EQ(got, want) << "k " << k << " row " << r;
      if (avx2) {
        const float simd = cpu::vec_dot(*avx2, k, wq.data(), xq.data());
        ASSERT_EQ(simd, want) << "AVX2, k " << k << " row " << r;
      }
    }
  }
}

TEST(CudaDotFormats, Q8_0MatchesTheCpuBitForBit) { check_type<cuda::DotQ8_0>(DType::q8_0); }
TEST(CudaDotFormats, Q4_0MatchesTheCpuBitForBit) { check_type<cuda::DotQ4_0>(DType::q4_0); }
TEST(CudaDotFormats, Q4_KMatchesTheCpuBitForBit) { check_type<cuda::DotQ4_K>(DType::q4_k); }
TEST(CudaDotFormats, Q6_KMatchesTheCpuBitForBit) { check_type<cuda::DotQ6_K>(DType::q6_k); }
TEST(CudaDotFormats, Q4_1MatchesTheCpuBitForBit) { check_type<cuda::DotQ4_1>(DType::q4_1); }
TEST(CudaDotFormats, Q5_0MatchesTheCpuBitForBit) { check_type<cuda::DotQ5_0>(DType::q5_0); }
TEST(CudaDotFormats, Q5_1MatchesTheCpuBitForBit) { check_type<cuda::DotQ5_1>(DType::q5_1); }
TEST(CudaDotFormats, Q2_KMatchesTheCpuBitForBit) { check_type<cuda::DotQ2_K>(DType::q2_k); }
TEST(CudaDotFormats, Q3_KMatchesTheCpuBitForBit) { check_type<cuda::DotQ3_K>(DType::q3_k); }
TEST(CudaDotFormats, Q5_KMatchesTheCpuBitForBit) { check_type<cuda::DotQ5_K>(DType::q5_k); }
TEST(CudaDotFormats, IQ4_NLMatchesTheCpuBitForBit) { check_type<cuda::DotIQ4_NL>(DType::iq4_nl); }
TEST(CudaDotFormats, IQ4_XSMatchesTheCpuBitForBit) { check_type<cuda::DotIQ4_XS>(DType::iq4_xs); }
TEST(CudaDotFormats, MXFP4MatchesTheCpuBitForBit) { check_type<cuda::DotMXFP4>(DType::mxfp4); }

// ---- element loads of the read-only formats (quant_blocks.cuh) ---------------------------------------
// load(block, j), and step/value as Dequant8Of uses them, give the CPU dequantizer's floats bit for bit.

TEST(CudaQuantBlocks, CodeBooksAreLoomsTables) {
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(cuda::book_value(cuda::iq4nl_book(), i), kIQ4NLValues[i]) << i;
    EXPECT_EQ(cuda::book_value(cuda::mxfp4_book(), i), kMXFP4Values[i]) << i;
  }
  for (uint32_t e = 0; e < 256; ++e) {
    const float a = cuda::e8m0_half(static_cast<uint8_t>(e)), b = e8m0_to_f32_half(static_cast<uint8_t>(e));
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0) << e;
  }
}

template <class F>
void check_loads(DType type) {
  SCOPED_TRACE(dtype_name(type));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> byte(0, 255);
  constexpr int64_t k = 1024;
  for (int r = 0; r < 60; ++r) {
    std::vector<uint8_t> wq(dtype_row_size(type, k));
    if (r % 2 == 0) {  // quantizer output, and random bytes (every bit pattern of codes and scales)
      std::vector<float> w(k);
      for (float& v : w) v = normal(rng) * (r % 3 == 0 ? 1e-3f : 0.05f) + (r % 4 == 0 ? 0.02f : 0.0f);
      quantize_row(type, w.data(), wq.data(), k);
    } else {
      for (uint8_t& b : wq) b = static_cast<uint8_t>(byte(rng));
    }
    std::vector<float> ref(k);
    dequantize_row(type, wq.data(), ref.data(), k);
    for (int64_t e = 0; e < k; ++e) {
      const uint8_t* block = wq.data() + (e / F::kBlock) * F::kBytes;
      const int j = static_cast<int>(e % F::kBlock);
      const float got = F::load(block, j);
      const float grouped = F::value(F::step(block, j - j % 8), block, j);
      if (std::isnan(ref[e])) {
        ASSERT_TRUE(std::isnan(got) && std::isnan(grouped)) << "row " << r << " element " << e;
        continue;
      }
      ASSERT_EQ(std::memcmp(&got, &ref[e], sizeof(float)), 0)
          << "row " << r << " element " << e << ": " << got << " vs " << ref[e];
      ASSERT_EQ(std::memcmp(&grouped, &ref[e], sizeof(float)), 0) << "row " << r << " element " << e;
    }
  }
}

TEST(CudaQuantBlocks, LoadsMatchTheCpuDequantizerBitForBit) {
  check_loads<cuda::FormatQ4_1>(DType::q4_1);
  check_loads<cuda::FormatQ5_0>(DType::q5_0);
  check_loads<cuda::FormatQ5_1>(DType::q5_1);
  check_loads<cuda::FormatQ2_K>(DType::q2_k);
  check_loads<cuda::FormatQ3_K>(DType::q3_k);
  check_loads<cuda::FormatQ5_K>(DType::q5_k);
  check_loads<cuda::FormatIQ4_NL>(DType::iq4_nl);
  check_loads<cuda::FormatIQ4_XS>(DType::iq4_xs);
  check_loads<cuda::FormatMXFP4>(DType::mxfp4);
}

// ---- the fast mode's units (mat_vec_fast_formats.cuh) ----------------------------------------------
// Each unit's decoded codes and scales give the CPU dequantizer's 32 weights, and its dot with int8
// activation codes is their float64 dot within float rounding.

int8_t code_byte(const uint32_t (&q)[8], int e) { return static_cast<int8_t>(q[e / 4] >> (8 * (e % 4))); }

float unit_weight(const cuda::FastQ8_0::Unit& u, int e) { return static_cast<float>(code_byte(u.q, e)) * u.d; }
float unit_weight(const cuda::FastQ4_K::Unit& u, int e) {
  return u.d_sc * static_cast<float>(code_byte(u.q, e)) - u.dmin_m;
}
float unit_weight(const cuda::FastQ6_K::Unit& u, int e) {
  return u.d * static_cast<float>(e < 16 ? u.sc0 : u.sc1) * static_cast<float>(code_byte(u.q, e));
}
float unit_weight(const cuda::FastOffsetUnit& u, int e) {
  return u.d * static_cast<float>(code_byte(u.q, e)) + u.m;
}
float unit_weight(const cuda::FastScaledUnit& u, int e) {
  return u.d * static_cast<float>(e < 16 ? u.sc0 : u.sc1) * static_cast<float>(code_byte(u.q, e));
}
float unit_weight(const cuda::FastQ2_K::Unit& u, int e) {
  using Q = cuda::FastQ2_K;
  const int sc = e < 16 ? Q::sc0(u) : Q::sc1(u), m = e < 16 ? Q::m0(u) : Q::m1(u);
  return u.d * static_cast<float>(sc) * static_cast<float>(code_byte(u.q, e)) -
         u.dmin * static_cast<float>(m);
}

template <class Q>
void check_fast_units(DType type) {
  SCOPED_TRACE(dtype_name(type));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> code(-127, 127);
  constexpr int64_t k = 2048;
  for (int r = 0; r < 40; ++r) {
    std::vector<float> w(k);
    for (float& v : w) v = normal(rng) * (r % 3 == 0 ? 1e-3f : 0.05f) + (r % 4 == 0 ? 0.02f : 0.0f);
    std::vector<uint8_t> wq(dtype_row_size(type, k));
    quantize_row(type, w.data(), wq.data(), k);
    std::vector<float> ref(k);
    dequantize_row(type, wq.data(), ref.data(), k);
    for (int64_t u = 0; u < k / cuda::kFastUnit; ++u) {
      const auto unit = Q::decode(wq.data() + (u / Q::kUnitsPerBlock) * Q::kBytes, static_cast<int>(u % Q::kUnitsPerBlock));
      int x[8];
      int xsum = 0;
      double want = 0.0, scale = 0.0;
      const float dx = 0.01f + 0.001f * static_cast<float>(r);
      for (int i = 0; i < 8; ++i) {
        uint32_t word = 0;
        for (int b = 0; b < 4; ++b) {
          const int c = code(rng);
          xsum += c;
          const double term = static_cast<double>(ref[u * 32 + 4 * i + b]) * c * dx;
          want += term;
          scale += std::fabs(term);
          word |= (static_cast<uint32_t>(c) & 0xffu) << (8 * b);
        }
        x[i] = static_cast<int>(word);
      }
      for (int e = 0; e < cuda::kFastUnit; ++e) {
        const float expect = ref[u * 32 + e];
        ASSERT_NEAR(unit_weight(unit, e), expect, 1e-6 * std::fabs(expect) + 1e-12) << "row " << r << " element " << u * 32 + e;
      }
      ASSERT_NEAR(Q::dot(unit, x, dx, xsum), want, 1e-5 * scale + 1e-12) << "row " << r << " unit " << u;
    }
  }
  // the fast layout fits in the scratch reserved for the exact mode's activation blocks
  const size_t exact = Q::kActScaleBlock == 256 ? 100 * (4096 / 256) * sizeof(cuda::ActQ8_K)
                                                : 100 * (4096 / 32) * sizeof(cuda::ActQ8_0);
  EXPECT_LE(cuda::ActFastLayout<Q>::bytes(100, 4096), exact);
}

TEST(CudaFastFormats, Q8_0UnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ8_0>(DType::q8_0); }
TEST(CudaFastFormats, Q4_0UnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ4_0>(DType::q4_0); }
TEST(CudaFastFormats, Q4_KUnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ4_K>(DType::q4_k); }
TEST(CudaFastFormats, Q6_KUnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ6_K>(DType::q6_k); }
TEST(CudaFastFormats, Q4_1UnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ4_1>(DType::q4_1); }
TEST(CudaFastFormats, Q5_0UnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ5_0>(DType::q5_0); }
TEST(CudaFastFormats, Q5_1UnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ5_1>(DType::q5_1); }
TEST(CudaFastFormats, Q2_KUnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ2_K>(DType::q2_k); }
TEST(CudaFastFormats, Q3_KUnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ3_K>(DType::q3_k); }
TEST(CudaFastFormats, Q5_KUnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastQ5_K>(DType::q5_k); }
TEST(CudaFastFormats, IQ4_NLUnitsMatchTheCpuDequantizer) {
  check_fast_units<cuda::FastIQ4_NL>(DType::iq4_nl);
}
TEST(CudaFastFormats, IQ4_XSUnitsMatchTheCpuDequantizer) {
  check_fast_units<cuda::FastIQ4_XS>(DType::iq4_xs);
}
TEST(CudaFastFormats, MXFP4UnitsMatchTheCpuDequantizer) { check_fast_units<cuda::FastMXFP4>(DType::mxfp4); }

// ---- the direct q6_K mat-vec's lane parts (DirectQ6_K) -------------------------------------------------
// Every part u of every block of a row, read as mat_vec_direct_q6k_kernel reads it -- the 16-byte chunks
// of its 8-block group that hold its runs, at the block's place j in the group -- gives 4 times the
// pipeline's integer sums (FastQ6_K's units: scale times isum of each 16 codes) exactly, and the row's
// terms sum to the float64 dot of the CPU dequantizer's weights within float rounding. Random bytes
// give every code and scale pattern (their sums only: d may be no number); quantizer output the dots.
TEST(CudaFastFormats, DirectQ6_KPartsMatchThePipelineAndTheCpuDequantizer) {
  using D = cuda::DirectQ6_K;
  using Q = cuda::FastQ6_K;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> byte(0, 255), code(-127, 127);
  constexpr int64_t k = 2 * D::kGroupBlocks * 256, n_blocks = k / 256;
  auto words = [](const uint8_t* p, uint32_t* w, int n) { std::memcpy(w, p, 4 * static_cast<size_t>(n)); };
  for (int r = 0; r < 40; ++r) {
    const bool random_bytes = r % 2 == 1;
    std::vector<uint8_t> wq(dtype_row_size(DType::q6_k, k));
    ASSERT_EQ(wq.size() % 16, 0u);
    std::vector<float> ref(k);
    if (random_bytes) {
      for (uint8_t& b : wq) b = static_cast<uint8_t>(byte(rng));
    } else {
      std::vector<float> w(k);
      for (float& v : w) v = normal(rng) * (r % 3 == 0 ? 1e-3f : 0.05f) + (r % 4 == 0 ? 0.02f : 0.0f);
      quantize_row(DType::q6_k, w.data(), wq.data(), k);
      dequantize_row(DType::q6_k, wq.data(), ref.data(), k);
    }
    std::vector<int8_t> x(k);
    for (int8_t& v : x) v = static_cast<int8_t>(code(rng));
    std::vector<float> dx(n_blocks);
    for (float& v : dx) v = 0.01f + 0.001f * static_cast<float>(byte(rng));
    double want = 0.0, scale = 0.0;
    for (int64_t e = 0; e < k && !random_bytes; ++e) {
      const double term = static_cast<double>(ref[e]) * x[e] * dx[e / 256];
      want += term;
      scale += std::fabs(term);
    }
    float got = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int j = static_cast<int>(b % D::kGroupBlocks);
      const uint8_t* group = wq.data() + (b / D::kGroupBlocks) * D::kGroupBytes;
      const uint8_t* block = wq.data() + b * Q::kBytes;
      for (int u = 0; u < D::kParts; ++u) {
        const int h = u >> 1, s = u & 1;
        uint32_t ql[16], qh[8];
        int sc[4];
        words(group + 16 * D::ql_chunk(j, u), ql, 16);
        words(group + 16 * D::qh_chunk(j, u), qh, 8);
        for (int c = 0; c < 4; ++c) sc[c] = static_cast<int8_t>(group[D::scale_byte(j, u, c)]);
        const D::Part p = D::decode(ql, qh, sc, cuda::load_u16_a2(group + D::d_byte(j)), j >> 1, j & 1);
        int xw[4][4];
        int pipeline = 0;
        for (int c = 0; c < 4; ++c) {
          // the pipeline's unit 4 h + c, its half s (16 codes, scale sc0 or sc1)
          const auto unit = Q::decode(block, 4 * h + c);
          int isum = 0;
          for (int i = 0; i < 4; ++i) {
            std::memcpy(&xw[c][i], &x[b * 256 + 128 * h + 32 * c + 16 * s + 4 * i], 4);
            isum = cuda::dot4(static_cast<int>(unit.q[4 * s + i]), xw[c][i], isum);
          }
          pipeline += (s == 0 ? unit.sc0 : unit.sc1) * isum;
        }
        const int direct = D::isum(p, xw);
        ASSERT_EQ(direct, 4 * pipeline) << "row " << r << " block " << b << " part " << u;
        if (!random_bytes) {
          ASSERT_EQ(p.d4, cuda::half_to_float(cuda::load_u16_a2(block + 208)) * 0.25f);
          got += p.d4 * dx[b] * static_cast<float>(direct);
        }
      }
    }
    if (!random_bytes) {
      ASSERT_NEAR(got, want, 1e-5 * scale + 1e-12) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace loom
