// Dot products of one weight row with activation rows, per weight dtype.
//
// Activations are first converted to the weight type's "vec dot" type: q8_0 for q8_0/q4_0 and q8_K
// for the K-quants, so quantized dots run on integers (each block's sum is exact, only the per-block
// scaling is done in float); f32 for the float types. f16 weights take f32 rather than f16
// activations: on AVX2 an f16 operand costs a conversion per use, and measured on one core
// (4096x4096, 4 columns per call) f16.f32 ran at 38 GFLOP/s against 26 for f16.f16, and is exact
// in the activations too. The f16.f16 kernel remains available (vec_dot_f16_f16) for callers that
// hold both operands in f16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/dtype.h"

namespace loom::cpu {

/// The arithmetic every quantized dot follows, on the CPU and on CUDA alike: each block's integer
/// sums are exact, each block's term is formed and accumulated in double, and the row's result is
/// rounded to float once. Any summation order then gives the exact sum to about 1e-16 relative, so
/// two implementations (scalar, AVX2, the GPU's warps) round to the same float except in the rare
/// case of a sum within ~1e-16 of a rounding boundary. Float accumulation instead made every
/// output differ in its last bits between them, and with 8-bit activation quantization after
/// every layer those differences grew to a logits NMSE of ~4e-4 between two correct paths.
///
/// Term of one K-quant super-block: dx * (d * isum - dmin * msum). `static` so the AVX2 file's
/// copy (compiled with other target flags) is its own.
static inline double block_term_k(float dx, float d, int32_t isum, float dmin, int32_t msum) {
  return static_cast<double>(dx) * (static_cast<double>(d) * isum - static_cast<double>(dmin) * msum);
}

/// Most activation rows one dot call takes: the weight row is loaded and decoded once for all.
inline constexpr int kDotMaxCols = 4;

/// out[c] = dot(w, xs[c]) over n elements for c < nc, 1 <= nc <= kDotMaxCols. `w` is a row of the
/// weight type, each xs[c] a row of the kernel's activation type; n is a multiple of both block sizes.
using DotFn = void (*)(int64_t n, const void* w, const void* const* xs, int nc, float* out);
/// Converts n floats to a row of the activation type.
using FromFloatFn = void (*)(const float* x, void* y, int64_t n);

/// Element types activations are converted to before a dot product. q8_K is not a storage dtype
/// (it exists only as BlockQ8_K scratch), hence an enum of its own.
enum class ActType : uint8_t { f32, f16, q8_0, q8_k };

/// Bytes of a converted activation row of n elements (n a multiple of the type's block size).
size_t act_row_size(ActType t, int64_t n);
/// Elements per block of an activation type.
int64_t act_block_size(ActType t);

/// How to multiply weights of one dtype.
struct VecDotKernel {
  ActType act_type;        ///< what activations are converted to
  FromFloatFn from_float;  ///< f32 -> act_type
  DotFn dot;
};

/// Instruction set the dispatching kernels use: "avx2" or "scalar".
const char* vec_dot_isa();
/// Kernel for weights of type `weight` (fastest available; LOOM_CPU_SIMD=0 forces scalar), or
/// nullptr for types that are not weights (i32).
const VecDotKernel* vec_dot_kernel(DType weight);
/// The portable reference kernel, or nullptr (i32).
const VecDotKernel* vec_dot_kernel_scalar(DType weight);
/// The AVX2+FMA+F16C kernel, or nullptr where this CPU or build has none.
const VecDotKernel* vec_dot_kernel_avx2(DType weight);

/// Dots of f16 rows with f16 rows (accumulated in f32); `simd` picks the AVX2 version where the CPU
/// has it. Its act_type is f16.
const VecDotKernel& vec_dot_f16_f16(bool simd);

/// One dot product (convenience for tests and cold paths).
inline float vec_dot(const VecDotKernel& k, int64_t n, const void* w, const void* x) {
  float out;
  k.dot(n, w, &x, 1, &out);
  return out;
}

/// Converts n halves to floats, bit for bit as f16_to_f32.
using F16RowFn = void (*)(const f16_bits* src, float* dst, int64_t n);
/// The fastest f16 row conversion (AVX2+F16C where the CPU has it, unless LOOM_CPU_SIMD=0): get_rows
/// of an f16 KV cache (a paged cache's gathered rows) spent most of a small model's decode step in
/// the portable one.
F16RowFn f16_to_f32_row();

namespace detail {
/// The AVX2 table without the CPU check (defined in vec_dot_avx2.cpp; nullptr on other targets).
const VecDotKernel* vec_dot_kernel_avx2_unchecked(DType weight);
const VecDotKernel* vec_dot_f16_f16_avx2_unchecked();
F16RowFn f16_to_f32_row_avx2_unchecked();
}  // namespace detail

}  // namespace loom::cpu
