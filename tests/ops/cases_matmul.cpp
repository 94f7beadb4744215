// Cases: mul_mat (every weight type, batched, broadcast, views) and mul_mat_id.
#include <array>

#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

// Thresholds against the float64 product of the dequantized weights and the f32 activations.
// Inputs are uniform in [-1, 1]; an error e of each activation relative to E[x^2] = 1/3 carries
// straight into the dot products, so NMSE ~ E[e^2] * 3.
double mul_mat_nmse(DType weight) {
  switch (weight) {
    // f32: float accumulation alone is ~1e-13; 1e-6 admits a device that rounds operands to
    // TF32/f16 for tensor cores (10 mantissa bits: NMSE ~2e-7).
    case DType::f32:
      return 1e-6;
    // f16: activations may be rounded to f16 for the dot product: (2^-11)^2 ~ 1e-7.
    case DType::f16:
      return 1e-6;
    // bf16: activations may be rounded to bf16: (2^-8)^2 ~ 5e-6.
    case DType::bf16:
      return 5e-5;
    // Quantized weights: the CPU quantizes activations to 8 bits per block on the fly (q8_0 for
    // q8_0/q4_0, q8_K for the K-quants): step amax/127 ~ 1/127, E[e^2] = step^2/12 ~ 5e-6, NMSE
    // ~1.5e-5 (measured 1e-5..4e-5 over these cases; the spread comes from cases with only 16
    // outputs). Two backends that each quantize their own way add their errors: 5e-4 covers that.
    default:
      return 5e-4;
  }
}

// Consecutive batches of b share one matrix of a, as query heads share a key head under GQA.
RefTensor mul_mat_ref(const RefTensor& a, const RefTensor& b) {
  const int64_t k = a.ne[0], m = a.ne[1];
  const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
  RefTensor out({m, b.ne[1], b.ne[2], b.ne[3]});
  for (int64_t i3 = 0; i3 < b.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < b.ne[2]; ++i2)
      for (int64_t j = 0; j < b.ne[1]; ++j)
        for (int64_t i = 0; i < m; ++i) {
          const double* x = &a.v[a.index(0, i, i2 / r2, i3 / r3)];
          const double* y = &b.v[b.index(0, j, i2, i3)];
          double s = 0.0;
          for (int64_t t = 0; t < k; ++t) s += x[t] * y[t];
          out(i, j, i2, i3) = s;
        }
  return out;
}

namespace {

enum class BLayout {
  packed,      // a plain leaf
  permuted,    // leaf [k, b2, n] permuted to [k, n, b2]: rows contiguous, dims 1-2 swapped
  transposed,  // leaf [n, k] transposed: elements of a row n apart
};

struct MulMatCase {
  DType wt;
  int64_t m, n, k;
  std::array<int64_t, 2> a_batch;  // {a2, a3}
  std::array<int64_t, 2> b_batch;  // {b2, b3}
  BLayout layout = BLayout::packed;
  bool a_window = false;  // a is the second half of the rows of a larger weight
  // Float weights only: a is the view at element a_shift of each row of a leaf [k + a_shift, ...],
  // so rows start off 16-byte boundaries (some rows, others on them) even when k is a multiple of
  // the mat-vec kernel's vector width.
  int64_t a_shift = 0;
  // Packed b only: b is the view at element b_offset (<= b_pad) of each row of a leaf
  // [k + b_pad, ...]: for b_pad odd the column stride is not a multiple of 16 bytes, and for
  // b_offset odd column 0 is off a 16-byte boundary too.
  int64_t b_pad = 0, b_offset = 0;
};

void add_mul_mat(CaseList& cases, const MulMatCase& c, bool perf) {
  auto build = [c](Graph& g, CaseInputs& in) -> Tensor* {
    const Shape a_ne{c.k, c.m, c.a_batch[0], c.a_batch[1]};
    Tensor* a;
    if (c.a_window) {
      Tensor* whole = in.uniform(c.wt, {c.k, 2 * c.m, c.a_batch[0], c.a_batch[1]});
      a = view(g, whole, a_ne, whole->nb, c.m * whole->nb[1]);
    } else if (c.a_shift > 0) {
      Tensor* whole = in.uniform(c.wt, {c.k + c.a_shift, c.m, c.a_batch[0], c.a_batch[1]});
      a = view(g, whole, a_ne, whole->nb, static_cast<size_t>(c.a_shift) * dtype_type_size(c.wt));
    } else {
      a = in.uniform(c.wt, a_ne);
    }
    Tensor* b = nullptr;
    switch (c.layout) {
      case BLayout::packed:
        b = in.uniform(DType::f32, {c.k + c.b_pad, c.n, c.b_batch[0], c.b_batch[1]});
        if (c.b_pad > 0)
          b = view(g, b, {c.k, c.n, c.b_batch[0], c.b_batch[1]}, b->nb, static_cast<size_t>(c.b_offset) * 4);
        break;
      case BLayout::permuted:
        b = permute(g, in.uniform(DType::f32, {c.k, c.b_batch[0], c.n, c.b_batch[1]}), 0, 2, 1, 3);
        break;
      case BLayout::transposed:
        b = transpose(g, in.uniform(DType::f32, {c.n, c.k, c.b_batch[0], c.b_batch[1]}));
        break;
    }
    return mul_mat(g, a, b);
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [c](const std::vector<RefTensor>& in) {
      RefTensor a = in[0];
      const Shape a_ne{c.k, c.m, c.a_batch[0], c.a_batch[1]};
      if (c.a_window) a = ref_view(in[0], a_ne, packed_strides(in[0].ne), c.m * c.k);
      if (c.a_shift > 0) a = ref_view(in[0], a_ne, packed_strides(in[0].ne), c.a_shift);
      RefTensor b = in[1];
      if (c.b_pad > 0)
        b = ref_view(in[1], {c.k, c.n, c.b_batch[0], c.b_batch[1]}, packed_strides(in[1].ne), c.b_offset);
      if (c.layout == BLayout::permuted) b = ref_permute(in[1], 0, 2, 1, 3);
      if (c.layout == BLayout::transposed) b = ref_transpose(in[1]);
      return mul_mat_ref(a, b);
    };
  }
  const char* layout = c.layout == BLayout::permuted     ? " b permuted"
                       : c.layout == BLayout::transposed ? " b transposed"
                                                         : "";
  std::string desc = fmt::format(
      "a={}{}{} b=f32{}{}", dtype_name(c.wt), shape_string({c.k, c.m, c.a_batch[0], c.a_batch[1]}),
      c.a_window ? " (row window)" : "", shape_string({c.k, c.n, c.b_batch[0], c.b_batch[1]}), layout);
  if (c.a_shift > 0) desc += fmt::format(" (a rows at element {} of {})", c.a_shift, c.k + c.a_shift);
  if (c.b_pad > 0) desc += fmt::format(" (b rows at element {} of {})", c.b_offset, c.k + c.b_pad);
  const double flops = 2.0 * c.m * c.n * c.k * c.b_batch[0] * c.b_batch[1];
  cases.push_back({"mul_mat", desc, mul_mat_nmse(c.wt), build, ref, flops});
}

// ---- mul_mat_id -------------------------------------------------------------------------------------

struct MulMatIdCase {
  DType wt;
  int64_t m, k, n_expert, n_used, n_tokens;
  bool b_per_expert;  // b.ne1 = n_used (else 1: every expert reads the same activations)
};

void add_mul_mat_id(CaseList& cases, const MulMatIdCase& c, bool perf) {
  auto build = [c](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* as = in.uniform(c.wt, {c.k, c.m, c.n_expert, 1});
    Tensor* b = in.uniform(DType::f32, {c.k, c.b_per_expert ? c.n_used : 1, c.n_tokens, 1});
    // Routing picks distinct experts per token, as top-k does.
    Tensor* ids = in.indices({c.n_used, c.n_tokens, 1, 1}, c.n_expert, true);
    return mul_mat_id(g, as, b, ids);
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [c](const std::vector<RefTensor>& in) {
      const RefTensor &as = in[0], &b = in[1], &ids = in[2];
      RefTensor out({c.m, c.n_used, c.n_tokens, 1});
      for (int64_t t = 0; t < c.n_tokens; ++t)
        for (int64_t e = 0; e < c.n_used; ++e) {
          const auto expert = static_cast<int64_t>(ids(e, t));
          const double* y = &b.v[b.index(0, c.b_per_expert ? e : 0, t, 0)];
          for (int64_t i = 0; i < c.m; ++i) {
            const double* x = &as.v[as.index(0, i, expert, 0)];
            double s = 0.0;
            for (int64_t j = 0; j < c.k; ++j) s += x[j] * y[j];
            out(i, e, t) = s;
          }
        }
      return out;
    };
  }
  std::string desc = fmt::format("as={}{} b.ne1={} n_used={} n_tokens={}", dtype_name(c.wt),
                                 shape_string({c.k, c.m, c.n_expert, 1}), c.b_per_expert ? c.n_used : 1,
                                 c.n_used, c.n_tokens);
  const double flops = 2.0 * c.m * c.k * c.n_used * c.n_tokens;
  cases.push_back({"mul_mat_id", desc, mul_mat_nmse(c.wt), build, ref, flops});
}

// A reduced dimension that suits the type: odd for plain types, whole blocks for quantized ones.
int64_t pick_k(DType t, int64_t plain, int64_t q32, int64_t qk) {
  if (dtype_block_size(t) == kQK_K) return qk;
  if (dtype_is_quantized(t)) return q32;
  return plain;
}

}  // namespace

void add_matmul_cases(CaseList& cases, CaseSet set) {
  if (set == CaseSet::perf) {
    // Decode (the mat-vec kernels, 1..8 columns; GB/s against 4,350 on the H200): the 8B shapes.
    for (DType wt : kAllWeightTypes)
      for (int64_t n : {1, 2, 4, 8}) {
        add_mul_mat(cases, {wt, 4096, n, 4096, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 14336, n, 4096, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 4096, n, 14336, {1, 1}, {1, 1}}, true);
      }
    for (DType wt : kNewerWeightTypes)
      for (int64_t n : {1, 2, 4, 8}) {
        add_mul_mat(cases, {wt, 4096, n, 4096, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 14336, n, 4096, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 4096, n, 14336, {1, 1}, {1, 1}}, true);
      }
    // the output layer (2.1 GB in f32: left to the types models ship it in)
    for (DType wt : {DType::f16, DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k})
      for (int64_t n : {1, 2, 4, 8}) add_mul_mat(cases, {wt, 128256, n, 4096, {1, 1}, {1, 1}}, true);
    // Batched decode (gemm_q at 32 and 64 columns): the 8B FFN and K/V products.
    for (DType wt : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k, DType::q6_k})
      for (int64_t n : {32, 64}) {
        add_mul_mat(cases, {wt, 14336, n, 4096, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 4096, n, 14336, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 1024, n, 4096, {1, 1}, {1, 1}}, true);
        add_mul_mat(cases, {wt, 6144, n, 4096, {1, 1}, {1, 1}}, true);
      }
    for (DType wt : kAllWeightTypes) add_mul_mat(cases, {wt, 4096, 512, 4096, {1, 1}, {1, 1}}, true);
    for (DType wt : kNewerWeightTypes) add_mul_mat(cases, {wt, 4096, 512, 4096, {1, 1}, {1, 1}}, true);
    // Prefill (the fast mode's tensor-core GEMMs): the 8B shapes at prompt chunks of M tokens.
    for (DType wt : kAllWeightTypes)
      for (int64_t n : {16, 64, 256, 2048, 4096}) add_mul_mat(cases, {wt, 4096, n, 4096, {1, 1}, {1, 1}}, true);
    for (DType wt : {DType::f16, DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k}) {
      add_mul_mat(cases, {wt, 1024, 512, 4096, {1, 1}, {1, 1}}, true);
      add_mul_mat(cases, {wt, 14336, 512, 4096, {1, 1}, {1, 1}}, true);
      add_mul_mat(cases, {wt, 4096, 512, 14336, {1, 1}, {1, 1}}, true);
      add_mul_mat(cases, {wt, 128256, 512, 4096, {1, 1}, {1, 1}}, true);
    }
    // A 2048-wide model's FFN projections at decode: up/gate (8192 rows of 2048) and down.
    for (DType wt : {DType::f16, DType::bf16}) {
      add_mul_mat(cases, {wt, 8192, 1, 2048, {1, 1}, {1, 1}}, true);
      add_mul_mat(cases, {wt, 2048, 1, 8192, {1, 1}, {1, 1}}, true);
    }
    for (DType wt : {DType::f16, DType::q8_0, DType::q4_0, DType::q4_k}) {
      add_mul_mat_id(cases, {wt, 2048, 4096, 32, 4, 1, true}, true);
      add_mul_mat_id(cases, {wt, 2048, 4096, 32, 4, 128, false}, true);
    }
    return;
  }

  for (DType wt : kAllWeightTypes) {
    const int64_t k1 = pick_k(wt, 67, 64, 256), k2 = pick_k(wt, 129, 288, 512);
    add_mul_mat(cases, {wt, 16, 1, k1, {1, 1}, {1, 1}}, false);   // one token
    add_mul_mat(cases, {wt, 33, 7, k2, {1, 1}, {1, 1}}, false);   // odd rows and columns
    add_mul_mat(cases, {wt, 64, 65, k1, {1, 1}, {1, 1}}, false);  // many tokens
    // the fast mode's quantized tensor-core GEMM (gemm_q.cu: 128 x 64 tiles, k in chunks of 256,
    // split over blocks): a partial row tile and column tile in two splits, then three column tiles
    // in eight splits
    add_mul_mat(cases, {wt, 200, 40, pick_k(wt, 131, 512, 512), {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {wt, 130, 130, pick_k(wt, 67, 2048, 2048), {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {wt, 17, 32, k1, {2, 1}, {6, 2}}, false);  // broadcast over dims 2-3
    add_mul_mat(cases, {wt, 5, 3, k2, {3, 2}, {3, 2}}, false);    // batched, no broadcast
    add_mul_mat(cases, {wt, 9, 5, k1, {1, 1}, {3, 1}, BLayout::permuted}, false);
    add_mul_mat(cases, {wt, 8, 4, k1, {1, 1}, {1, 1}, BLayout::packed, true}, false);
  }
  // Every column count of the mat-vec kernels (the fast mode's take 1, 2, 4 or 8 columns per kernel and
  // 1, 1, 2 or 4 rows per block): row counts off those tiles, one row, a reduction of several
  // quantized stages (k 4352: 136 units of 32 weights, 128 per stage), quantized rows off 16-byte
  // boundaries (k 288: q4_0 rows of 162 bytes, q8_0 of 306; k 768: q6_K rows of 630), and batches
  // broadcast over dims 2-3.
  // short_rows: one row gives an NMSE of single outputs, which for the offset formats (q4_1's d q + m)
  // and q3_K crossed mul_mat's threshold on some seeds against float64; four rows average that.
  auto every_column_count = [&cases](DType wt, int64_t short_rows) {
    const int64_t k_long = pick_k(wt, 1032, 4352, 4352), k_short = pick_k(wt, 136, 288, 768);
    for (int64_t n = 1; n <= 8; ++n) {
      add_mul_mat(cases, {wt, 2 * n + 1, n, k_long, {1, 1}, {1, 1}}, false);
      add_mul_mat(cases, {wt, short_rows, n, k_short, {1, 1}, {1, 1}}, false);
      if (n % 3 == 2) add_mul_mat(cases, {wt, 5, n, k_short, {2, 1}, {4, 2}}, false);
    }
  };
  for (DType wt : kAllWeightTypes) every_column_count(wt, 1);
  // (mxfp4 rows of k 288 are 153 bytes: odd, so the fast mode leaves them to the exact kernels)
  for (DType wt : kNewerWeightTypes) every_column_count(wt, 4);
  // The newer block formats: one token, odd shapes, many tokens (the fast mode's dequantizing GEMM),
  // broadcast batches, and the CPU's column counts of one dot call (1..4) with a remainder.
  for (DType wt : kNewerWeightTypes) {
    const int64_t k1 = pick_k(wt, 0, 64, 256), k2 = pick_k(wt, 0, 288, 512);
    add_mul_mat(cases, {wt, 16, 1, k1, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {wt, 33, 7, k2, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {wt, 64, 65, k1, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {wt, 17, 32, k1, {2, 1}, {6, 2}}, false);
    add_mul_mat(cases, {wt, 9, 5, k1, {1, 1}, {3, 1}, BLayout::permuted}, false);
    add_mul_mat(cases, {wt, 7, 5, pick_k(wt, 0, 4352, 4352), {1, 1}, {1, 1}}, false);
    add_mul_mat_id(cases, {wt, 16, k1, 8, 2, 5, true}, false);
    // the fast mode's quantized tensor-core GEMM (9-64 columns: gemm_q, its f16 dequantization for every
    // format but mxfp4), a partial row tile and column tile, two k chunks
    add_mul_mat(cases, {wt, 200, 40, 512, {1, 1}, {1, 1}}, false);
  }
  // Activations whose rows are not contiguous (the front end accepts them).
  for (DType wt : {DType::f32, DType::f16, DType::q8_0, DType::q4_k})
    add_mul_mat(cases, {wt, 12, 6, pick_k(wt, 40, 64, 256), {1, 1}, {2, 1}, BLayout::transposed}, false);
  // Larger products: several row tiles and column tiles, long reductions.
  add_mul_mat(cases, {DType::f32, 70, 40, 2048, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::f16, 100, 70, 512, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::q8_0, 200, 3, 4096, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::q4_k, 130, 33, 1024, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::q6_k, 67, 96, 768, {1, 1}, {1, 1}}, false);
  // The fast mode's direct q6_K mat-vec (1-2 columns; rows of whole 8-block groups, k a multiple of 2048,
  // else the pipeline or the exact kernels): the llama-3-8B shapes at k 4096 (attention, 4096 rows; K/V,
  // 1024), the down projection's k 14336 (seven groups), a row count whose last 2-row (or, under
  // LOOM_MV_TILE_ROWS=4, 4-row) tile is partial, one group, broadcast batches, and an output layer's
  // shape cut to 8451 rows: 2113 4-row tiles, enough for 4-row tiles on 132 SMs, the last one partial
  // (one column: at 3.5 s on the CPU the largest case here).
  for (int64_t n : {1, 2}) {
    add_mul_mat(cases, {DType::q6_k, 4096, n, 4096, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {DType::q6_k, 1024, n, 4096, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {DType::q6_k, 203, n, 14336, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {DType::q6_k, 1001, n, 4096, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {DType::q6_k, 37, n, 2048, {1, 1}, {1, 1}}, false);
    add_mul_mat(cases, {DType::q6_k, 5, n, 2048, {2, 1}, {4, 2}}, false);
  }
  add_mul_mat(cases, {DType::q6_k, 8451, 1, 4096, {1, 1}, {1, 1}}, false);
  // Prefill-sized products of every quantized type (the fast mode's dequantized GEMM; a weight of
  // k 8192 spans two dequantization chunks of 2048 rows).
  add_mul_mat(cases, {DType::q4_0, 2100, 16, 8192, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::q8_0, 96, 40, 512, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::q4_0, 96, 24, 512, {1, 1}, {1, 1}}, false);
  // The float mat-vec loop's two paths (mat_vec.cuh): 16-byte loads for aligned rows and
  // contiguous activations (k 1344: whole unrolled steps and a remainder for every width), one
  // element per lane otherwise: k not a multiple of the vector width, rows off 16-byte boundaries
  // (a shifted: the paths mixed within one matrix), activations off them or with an odd column stride.
  for (DType wt : {DType::f32, DType::f16, DType::bf16})
    for (int64_t n : {1, 3}) {
      MulMatCase aligned{wt, 37, n, 1344, {1, 1}, {1, 1}};
      add_mul_mat(cases, aligned, false);
      MulMatCase odd_k{wt, 37, n, 75, {1, 1}, {1, 1}};
      add_mul_mat(cases, odd_k, false);
      MulMatCase shifted = aligned;
      shifted.a_shift = 1;
      add_mul_mat(cases, shifted, false);
      MulMatCase padded = aligned;  // column 0 aligned: the wide path for 1 column only
      padded.b_pad = 1;
      add_mul_mat(cases, padded, false);
      padded.b_offset = 1;
      add_mul_mat(cases, padded, false);
    }
  // Tiny and attention-shaped products: K^T Q per head under GQA (f16 cache, permuted queries).
  add_mul_mat(cases, {DType::f32, 1, 1, 1, {1, 1}, {1, 1}}, false);
  add_mul_mat(cases, {DType::f16, 37, 6, 128, {2, 1}, {8, 1}, BLayout::permuted}, false);

  for (DType wt : kAllWeightTypes) {
    const int64_t k = pick_k(wt, 72, 64, 256);
    add_mul_mat_id(cases, {wt, 16, k, 8, 2, 1, false}, false);
    add_mul_mat_id(cases, {wt, 16, k, 8, 2, 5, true}, false);
  }
  for (DType wt : {DType::f32, DType::q8_0, DType::q4_k}) {
    const int64_t k = pick_k(wt, 33, 96, 256);
    add_mul_mat_id(cases, {wt, 7, k, 4, 4, 7, false}, false);  // every expert used
    add_mul_mat_id(cases, {wt, 17, k, 16, 3, 33, true}, false);
  }
  // More columns per expert than one tile holds.
  add_mul_mat_id(cases, {DType::q4_0, 24, 128, 2, 2, 40, false}, false);
  add_mul_mat_id(cases, {DType::f16, 24, 96, 4, 2, 64, true}, false);
  add_mul_mat_id(cases, {DType::q6_k, 40, 512, 6, 2, 48, true}, false);
}

}  // namespace loom::optest
