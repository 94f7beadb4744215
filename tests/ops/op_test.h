// Differential op test: shared declarations.
//
// A case builds a small graph from leaf inputs, the runner allocates it on a backend, fills the
// inputs with seeded random data, poisons the outputs, computes, and compares the result against
// either a float64 reference written here from the op's definition in loom/graph.h, or the same
// case run on a second backend.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "loom/exec.h"
#include "loom/graph.h"

namespace loom::optest {

// ---- float64 reference tensors ------------------------------------------------------------------

/// Packed float64 values of a logical tensor (ne[0] innermost), the reference's working type.
struct RefTensor {
  Shape ne{1, 1, 1, 1};
  std::vector<double> v;

  RefTensor() = default;
  explicit RefTensor(const Shape& shape, double fill = 0.0)
      : ne(shape), v(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]), fill) {}
  int64_t size() const { return static_cast<int64_t>(v.size()); }
  size_t index(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    return static_cast<size_t>(((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0);
  }
  double& operator()(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    return v[index(i0, i1, i2, i3)];
  }
  double operator()(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return v[index(i0, i1, i2, i3)];
  }
};

/// Element strides (not bytes) of a view, as the reference sees it.
using ElemStrides = std::array<int64_t, kMaxDims>;

/// Packed element strides of a shape.
ElemStrides packed_strides(const Shape& ne);
/// Values of a strided view of `src`: element (i) = src.v[offset + sum(i_d * stride_d)].
RefTensor ref_view(const RefTensor& src, const Shape& ne, const ElemStrides& stride, int64_t offset);
/// Same semantics as loom::permute: dimension d of `a` becomes dimension axes[d].
RefTensor ref_permute(const RefTensor& a, int ax0, int ax1, int ax2, int ax3);
RefTensor ref_transpose(const RefTensor& a);
/// Same values, new shape.
RefTensor ref_reshape(const RefTensor& a, const Shape& ne);
/// What storing the values in `type` keeps: each row quantized then dequantized by the library's
/// reference converters (identity for f32).
RefTensor ref_round_trip(const RefTensor& a, DType type);

/// `a` copied into an activation by an exact scale(1), so that the op reading it may run in place
/// over that activation's memory (the planner never reuses a leaf).
inline Tensor* as_activation(Graph& g, Tensor* a) { return scale(g, a, 1.0f); }

/// Builds the graph view that ref_view describes (element strides, element offset).
Tensor* strided_view(Graph& g, Tensor* a, const Shape& ne, const ElemStrides& stride, int64_t offset);

// ---- inputs -----------------------------------------------------------------------------------------

/// Deterministic random source; mt19937 is fully specified by the standard, and the float
/// conversions below are ours, so a seed gives the same data with every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  /// Uniform in [0, 1).
  double unit() { return static_cast<double>(gen_() >> 8) * 0x1p-24; }
  float uniform(float lo, float hi) { return static_cast<float>(lo + (hi - lo) * unit()); }
  /// Uniform integer in [0, n).
  int64_t below(int64_t n) { return static_cast<int64_t>(unit() * static_cast<double>(n)) % n; }

 private:
  std::mt19937 gen_;
};

/// Writes the packed float values of one input (nelements of them) from its shape.
using Generator = std::function<void(Rng& rng, const Shape& ne, std::vector<float>& values)>;
/// Writes the packed words of one i32 input exactly (values a float cannot hold: bit patterns).
using WordGenerator = std::function<void(Rng& rng, const Shape& ne, std::vector<int32_t>& words)>;

/// One leaf of a case: how it is filled.
struct InputSpec {
  Tensor* tensor = nullptr;
  Generator generate;   ///< empty when poisoned or filled by `words`
  WordGenerator words;  ///< set instead of `generate` for an i32 leaf written word for word
  bool poison = false;  ///< every byte 0xFF (NaN in every float type): a destination to be overwritten
};

/// The values CaseInputs::distinct stores: a shuffled ladder over all of `v` in [-1, 1), no ties.
void distinct_values(Rng& rng, std::vector<float>& v);

/// Creates a case's leafs and remembers how to fill them. Leafs are numbered in creation order and
/// filled in that order from one Rng; the reference receives their dequantized values (i32: the
/// stored integers, exactly) in that order.
class CaseInputs {
 public:
  explicit CaseInputs(Graph& g) : g_(g) {}
  /// Values from `gen`, stored in `type` (quantized where it is a quantized type).
  Tensor* custom(DType type, const Shape& ne, Generator gen);
  /// Uniform in [lo, hi].
  Tensor* uniform(DType type, const Shape& ne, float lo = -1.0f, float hi = 1.0f);
  /// Magnitude in [lo, hi] with a random sign (divisors, scales away from zero).
  Tensor* signed_magnitude(const Shape& ne, float lo, float hi);
  /// f32 values without ties anywhere in the tensor (argmax/top_k have one answer).
  Tensor* distinct(const Shape& ne);
  /// i32 words from `gen`, stored as they are (the reference receives each as an exact double).
  Tensor* words(const Shape& ne, WordGenerator gen);
  /// i32 values in [0, n); with `unique`, no value repeats inside a row (needs ne[0] <= n).
  Tensor* indices(const Shape& ne, int64_t n, bool unique);
  /// Attention-style mask: values in [-1, 0], a fraction `p_inf` of -inf, at least one finite
  /// entry per row; `causal` masks kv > q + (ne0 - n_q) with -inf for the first n_q rows.
  Tensor* mask(DType type, const Shape& ne, double p_inf, bool causal, int64_t n_q = 0);
  /// Every byte 0xFF: a destination the op overwrites completely.
  Tensor* poisoned(DType type, const Shape& ne);

  const std::vector<InputSpec>& specs() const { return specs_; }

 private:
  Graph& g_;
  std::vector<InputSpec> specs_;
};

// ---- cases ------------------------------------------------------------------------------------------

using BuildFn = std::function<Tensor*(Graph& g, CaseInputs& in)>;
using ReferenceFn = std::function<RefTensor(const std::vector<RefTensor>& inputs)>;

/// One differential test case.
///
/// A case may check several results: `build` returns the first and marks the others with
/// Graph::mark_output; the reference then returns all their values one after another (the returned
/// tensor's first, then the others in the order they were marked), each in its logical order. Each
/// result is compared on its own (i32 exactly, others by NMSE).
struct OpCase {
  std::string op;         ///< group name for --op and --list (an op name, or "cont" for views)
  std::string desc;       ///< shapes, dtypes and parameters
  double max_nmse;        ///< threshold; i32 outputs must match exactly whatever this says
  BuildFn build;          ///< returns the output tensor
  ReferenceFn reference;  ///< float64 result in the output's logical order (may be empty in perf mode)
  double flops = 0;       ///< useful floating-point operations, for TFLOP/s in perf mode (0: not shown)
  /// The fused dispatch a backend with a graph executor must form from this graph: when the
  /// backend under test reports exec counters (computes > 0) with fusion on, the run fails unless
  /// its counters show at least one fusion of this kind.
  FusedKind expected_fusion = FusedKind::none;
  /// expected_fusion is a fast-numerics kernel: a backend in the exact mode must not form it (it
  /// keeps the unfused kernels' exact results), one in the fast mode must.
  bool fusion_fast_only = false;
  /// With fusion_fast_only: the fused form exists on some devices only (gemm_q's, compute capability
  /// 9.0: its warpgroup kernel), so in the fast mode the fusion may be missing; the results are
  /// checked either way. (loom bench's traces show it on the H200.)
  bool fusion_device_dependent = false;
  /// In the fast mode, with fusion on, the graph must take at most this many dispatches (0: not
  /// checked): where a fusion of the same kind can form in two ways (a Q4_K_M file's Q, K and V: the
  /// q4_K pair alone, or all three in fast numerics), the count tells which one formed.
  int64_t fast_max_dispatches = 0;
};

/// Which set of cases to register: small checked shapes, or large timed ones.
enum class CaseSet { check, perf };

using CaseList = std::vector<OpCase>;

// One function per op family (cases_*.cpp).
void add_elementwise_cases(CaseList& cases, CaseSet set);
void add_row_cases(CaseList& cases, CaseSet set);
void add_matmul_cases(CaseList& cases, CaseSet set);
void add_attention_cases(CaseList& cases, CaseSet set);
void add_data_cases(CaseList& cases, CaseSet set);
/// The node groups a graph executor fuses, built as the model code builds them (cases_fused.cpp).
void add_fused_cases(CaseList& cases, CaseSet set);

/// Every case of a set, in a fixed order.
CaseList all_cases(CaseSet set);

// ---- thresholds (normalised mean squared error, sum((out-ref)^2) / sum(ref^2)) ---------------------
//
// A wrong index, a missed row or a broken layout gives an NMSE of order 1e-3 to 1 even when it
// touches a single row of a small case, so the thresholds below only need to sit comfortably above
// the rounding each legitimate implementation makes, and they do so by about 10x or more.

/// Data movement and exact conversions (get_rows, concat, cont, cpy/set_rows into f32/f16/bf16):
/// bit-exact by construction; the allowance is far below one wrong element.
inline constexpr double kNmseExact = 1e-12;
/// Elementwise f32 arithmetic and activations, norms, softmax, row sums: float32 evaluation of a
/// few operations per element is a few ulps off the float64 reference (NMSE ~1e-14); 1e-7 leaves
/// room for fast-math intrinsics on GPUs (relative error ~2^-21) while one wrong element among
/// 10^5 still shows (NMSE ~1e-5).
inline constexpr double kNmseElementwise = 1e-7;

/// flash_attn (and the fused attention over gathered K/V), against float64 on the stored
/// (dequantized) K/V: a kernel may round Q to f16 to meet f16 K and accumulate V in f16; a score
/// s ~ 3 rounded to 11 bits moves its softmax weight by ~1e-3 relative, NMSE ~1e-6. 1e-5 sits above
/// that; a wrong head, key or mask entry is >= 1e-3.
inline constexpr double kNmseFlashAttn = 1e-5;

/// rope with positions up to 1024: float32 angles pos * base^(-2i/n) carry a few ulps (or, computed
/// by repeated multiplication, up to ~i ulps) of relative error, i.e. up to ~1e-3 rad at pos 1024,
/// NMSE up to ~1e-6. 1e-5 sits above that; a wrong pair, sign or frequency is O(1).
inline constexpr double kNmseRope = 1e-5;

// ---- helpers for case files ------------------------------------------------------------------------

inline constexpr DType kAllWeightTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0,
                                            DType::q4_0, DType::q4_k, DType::q6_k};
/// The newer block formats (CPU and CUDA kernels alike): fewer cases each than kAllWeightTypes, to
/// keep the CPU run short, but every path of the CUDA kernels (exact and fast mat-vec columns,
/// stages and row alignments, the dequantizing GEMM, get_rows, mul_mat_id, the fused projections).
inline constexpr DType kNewerWeightTypes[] = {DType::q4_1,   DType::q5_0,   DType::q5_1,
                                              DType::q2_k,   DType::q3_k,   DType::q5_k,
                                              DType::iq4_nl, DType::iq4_xs, DType::mxfp4};

// References and thresholds shared between case files (the fused cases reuse the ops' own).

/// mul_mat's threshold for weights of type `weight` (cases_matmul.cpp).
double mul_mat_nmse(DType weight);
/// out[i, j, i2, i3] = dot(a row i of batch (i2 / (b2/a2), i3 / (b3/a3)), b row j of batch (i2, i3)).
RefTensor mul_mat_ref(const RefTensor& a, const RefTensor& b);
/// rope of a [head_dim, n_head, n_tokens] with positions pos and optional frequency factors ff
/// (cases_attention.cpp).
RefTensor rope_ref(const RefTensor& a, const RefTensor& pos, const RefTensor* ff, const RopeParams& p);
/// RopeParams with the model loader's defaults for the rest (n_ctx_orig 4096, beta 32/1).
RopeParams rope_params(RopeMode mode, int32_t n_dims, float base, float freq_scale = 1.0f, float ext = 0.0f,
                       float attn = 1.0f);

}  // namespace loom::optest
