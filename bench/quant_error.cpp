// Quantization error of every block format on a fixed random matrix, beside its block size and
// bits per weight: the table in docs/QUANTIZATION.md. Two matrices of 256 x 4096: Gaussian N(0, 1)
// and the same with one weight in 256 scaled by 10 (outliers, as real weight matrices have).
// Columns: relative RMS error (RMS of the error over RMS of the weights) and the largest error
// over the RMS. Deterministic: the same numbers on every machine.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "loom/dtype.h"

namespace {

struct Error {
  double rel_rmse = 0, max_rel = 0;
};

Error measure(loom::DType t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<uint8_t> q(loom::dtype_row_size(t, cols));
  std::vector<float> y(static_cast<size_t>(cols));
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * cols;
    loom::quantize_row(t, row, q.data(), cols);
    loom::dequantize_row(t, q.data(), y.data(), cols);
    for (int64_t i = 0; i < cols; ++i) {
      const double e = static_cast<double>(y[i]) - row[i];
      err2 += e * e;
      ref2 += static_cast<double>(row[i]) * row[i];
      max_abs = std::fmax(max_abs, std::fabs(e));
    }
  }
  const double rms = std::sqrt(ref2 / static_cast<double>(rows * cols));
  return {std::sqrt(err2 / ref2), max_abs / rms};
}

}  // namespace

int main() {
  constexpr int64_t kRows = 256, kCols = 4096;
  std::mt19937 rng(20261125);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> gauss(static_cast<size_t>(kRows * kCols));
  for (float& v : gauss) v = normal(rng);
  std::vector<float> outliers = gauss;
  for (size_t i = 0; i < outliers.size(); i += 256) outliers[i + (i / 256) % 256] *= 10.0f;

  std::printf(
      "| type | block | bytes/block | bits/weight | rel. RMSE (Gaussian) | max err / RMS | rel. RMSE "
      "(outliers) |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < loom::kDTypeCount; ++i) {
    const auto t = static_cast<loom::DType>(i);
    if (t == loom::DType::f32 || t == loom::DType::i32) continue;
    const double bpw =
        8.0 * static_cast<double>(loom::dtype_type_size(t)) / static_cast<double>(loom::dtype_block_size(t));
    const Error g = measure(t, gauss, kRows, kCols);
    const Error o = measure(t, outliers, kRows, kCols);
    std::printf("| %s | %lld | %zu | %.4g | %.4f | %.3f | %.4f |\n", loom::dtype_name(t),
                static_cast<long long>(loom::dtype_block_size(t)), loom::dtype_type_size(t), bpw, g.rel_rmse,
                g.max_rel, o.rel_rmse);
  }
  return 0;
}
