// The one switch from a quantized DType to its kernels' format structs. Every kernel family that
// takes quantized weights (get_rows/cpy loads, the exact and fast mat-vecs, mul_mat_id, the fused
// projections, the fast mode's dequantizing GEMM) dispatches through visit_quant_type, so a new
// format is added here once, not in each launcher.
//
// Like the .cu files, and unlike the other headers of this folder, it names loom/dtype.h's DType: it
// is the bridge from the graph's types to the device formats.
#pragma once

#include <type_traits>

#include "dot_blocks.cuh"
#include "loom/dtype.h"
#include "mat_vec_fast_formats.cuh"
#include "quant.cuh"
#include "quantize_act.cuh"

namespace loom::cuda {

/// The device structs of one quantized format: Format (element loads, quant.cuh), Dequant8 (eight
/// elements at once, for the fast mode's GEMM), Dot (the exact mat-vec, against the CPU's activation
/// blocks Dot::Act), Fast (the fast mat-vec's units, mat_vec_fast_formats.cuh).
template <class FormatT, class Dequant8T, class DotT, class FastT>
struct QuantKernels {
  using Format = FormatT;
  using Dequant8 = Dequant8T;
  using Dot = DotT;
  using Fast = FastT;
  /// Whether activations are quantized to q8_K blocks (256 elements) rather than q8_0 ones.
  static constexpr bool kActQ8_K = std::is_same_v<typename DotT::Act, ActQ8_K>;
  static_assert(FormatT::kBlock == DotT::kBlock && FormatT::kBytes == DotT::kBytes &&
                    FormatT::kBlock == FastT::kBlock && FormatT::kBytes == FastT::kBytes &&
                    FormatT::kBlock == Dequant8T::kBlock && FormatT::kBytes == Dequant8T::kBytes,
                "one format's structs agree on its block");
};

/// fn(QuantKernels<...>{}) for quantized type t, `otherwise` for any other type. fn is generic (auto
/// parameter) and returns something convertible to R. Usable in host and device code.
// nv_exec_check_disable: instantiated with host lambdas on the host and device ones on the device,
// which is legal, but nvcc would warn about the host-device function calling a host one.
#pragma nv_exec_check_disable
template <class R, class Fn>
__host__ __device__ __forceinline__ R visit_quant_type(DType t, R otherwise, Fn&& fn) {
  switch (t) {
    case DType::q8_0:
      return fn(QuantKernels<FormatQ8_0, Dequant8Q8_0, DotQ8_0, FastQ8_0>{});
    case DType::q4_0:
      return fn(QuantKernels<FormatQ4_0, Dequant8Q4_0, DotQ4_0, FastQ4_0>{});
    case DType::q4_k:
      return fn(QuantKernels<FormatQ4_K, Dequant8Q4_K, DotQ4_K, FastQ4_K>{});
    case DType::q6_k:
      return fn(QuantKernels<FormatQ6_K, Dequant8Q6_K, DotQ6_K, FastQ6_K>{});
    case DType::q4_1:
      return fn(QuantKernels<FormatQ4_1, Dequant8Of<FormatQ4_1>, DotQ4_1, FastQ4_1>{});
    case DType::q5_0:
      return fn(QuantKernels<FormatQ5_0, Dequant8Of<FormatQ5_0>, DotQ5_0, FastQ5_0>{});
    case DType::q5_1:
      return fn(QuantKernels<FormatQ5_1, Dequant8Of<FormatQ5_1>, DotQ5_1, FastQ5_1>{});
    case DType::q2_k:
      return fn(QuantKernels<FormatQ2_K, Dequant8Of<FormatQ2_K>, DotQ2_K, FastQ2_K>{});
    case DType::q3_k:
      return fn(QuantKernels<FormatQ3_K, Dequant8Of<FormatQ3_K>, DotQ3_K, FastQ3_K>{});
    case DType::q5_k:
      return fn(QuantKernels<FormatQ5_K, Dequant8Of<FormatQ5_K>, DotQ5_K, FastQ5_K>{});
    case DType::iq4_nl:
      return fn(QuantKernels<FormatIQ4_NL, Dequant8Of<FormatIQ4_NL>, DotIQ4_NL, FastIQ4_NL>{});
    case DType::iq4_xs:
      return fn(QuantKernels<FormatIQ4_XS, Dequant8Of<FormatIQ4_XS>, DotIQ4_XS, FastIQ4_XS>{});
    case DType::mxfp4:
      return fn(QuantKernels<FormatMXFP4, Dequant8Of<FormatMXFP4>, DotMXFP4, FastMXFP4>{});
    default:
      return otherwise;
  }
}

/// The one weight-type switch of the launchers: float_fn(FormatF32{} / FormatF16{} / FormatBF16{})
/// for float weights, quant_fn(QuantKernels<...>{}) for quantized ones (visit_quant_type),
/// `otherwise` for any other type.
#pragma nv_exec_check_disable
template <class R, class FloatFn, class QuantFn>
__host__ __device__ __forceinline__ R visit_weight_type(DType t, R otherwise, FloatFn&& float_fn, QuantFn&& quant_fn) {
  switch (t) {
    case DType::f32:
      return float_fn(FormatF32{});
    case DType::f16:
      return float_fn(FormatF16{});
    case DType::bf16:
      return float_fn(FormatBF16{});
    default:
      return visit_quant_type(t, otherwise, quant_fn);
  }
}

}  // namespace loom::cuda
