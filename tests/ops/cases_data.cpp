// Cases: get_rows, set_rows, cpy (conversions, reshaping copies, strided sources and
// destinations), concat, and the views (view, reshape, permute, transpose) through cont.
#include <fmt/format.h>

#include "op_test.h"

namespace loom::optest {

namespace {

// Storing into a quantized type is compared with the library's reference quantizer round trip.
// The CPU uses that same quantizer (NMSE 0). Another backend that rounds ties differently, or its
// scale in the last bit, moves a few elements by one step; these sit at about 1/20 of each type's
// own quantization NMSE on uniform data (q8_0 ~1.5e-5, q4_0 ~4e-3, q4_K ~3e-3, q6_K ~2.5e-4),
// while a wrong block order or scale is of the order of the data itself.
double store_nmse(DType t) {
  switch (t) {
    case DType::q8_0:
      return 1e-6;
    case DType::q4_0:
      return 2e-4;
    case DType::q4_k:
      return 2e-4;
    case DType::q6_k:
      return 1e-5;
    default:
      return kNmseExact;  // f32/f16/bf16/i32: rounding to nearest even is exact and unique
  }
}

// Row length that suits every type of a list: whole blocks.
int64_t row_len(DType t, int64_t plain) {
  if (dtype_block_size(t) == kQK_K) return 256;
  if (dtype_is_quantized(t)) return 64;
  return plain;
}

// ---- get_rows ---------------------------------------------------------------------------------------

void add_get_rows(CaseList& cases, DType t, const Shape& a_ne, int64_t k, bool perf) {
  auto build = [=](Graph& g, CaseInputs& in) {
    Tensor* a = in.uniform(t, a_ne);
    Tensor* idx = in.indices({k, a_ne[2], a_ne[3], 1}, a_ne[1], false);  // repeats allowed
    return get_rows(g, a, idx);
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [=](const std::vector<RefTensor>& in) {
      const RefTensor &a = in[0], &idx = in[1];
      RefTensor out({a_ne[0], k, a_ne[2], a_ne[3]});
      for (int64_t i3 = 0; i3 < a_ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < a_ne[2]; ++i2)
          for (int64_t i1 = 0; i1 < k; ++i1) {
            const auto r = static_cast<int64_t>(idx(i1, i2, i3));
            for (int64_t i0 = 0; i0 < a_ne[0]; ++i0) out(i0, i1, i2, i3) = a(i0, r, i2, i3);
          }
      return out;
    };
  }
  cases.push_back({"get_rows", fmt::format("a={}{} k={}", dtype_name(t), shape_string(a_ne), k), kNmseExact,
                   build, ref, 0.0});
}

// ---- set_rows ---------------------------------------------------------------------------------------

// dst [n, R, s2, s3] (initial values kept where no row is written), src f32 [n, r, s2, s3],
// idx [r, i2, i3] broadcast over dims 2-3 by modulo, unique inside each row so no two source rows
// race for one destination row.
void add_set_rows(CaseList& cases, DType t, const Shape& dst_ne, int64_t r, const Shape& idx_batch,
                  bool perf) {
  const Shape src_ne{dst_ne[0], r, dst_ne[2], dst_ne[3]};
  auto build = [=](Graph& g, CaseInputs& in) {
    Tensor* dst = in.uniform(t, dst_ne);
    Tensor* src = in.uniform(DType::f32, src_ne);
    Tensor* idx = in.indices({r, idx_batch[0], idx_batch[1], 1}, dst_ne[1], true);
    return set_rows(g, dst, src, idx);
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [=](const std::vector<RefTensor>& in) {
      RefTensor out = in[0];
      const RefTensor stored = ref_round_trip(in[1], t);
      const RefTensor& idx = in[2];
      for (int64_t i3 = 0; i3 < src_ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < src_ne[2]; ++i2)
          for (int64_t i1 = 0; i1 < r; ++i1) {
            const auto row = static_cast<int64_t>(idx(i1, i2 % idx.ne[1], i3 % idx.ne[2]));
            for (int64_t i0 = 0; i0 < src_ne[0]; ++i0) out(i0, row, i2, i3) = stored(i0, i1, i2, i3);
          }
      return out;
    };
  }
  cases.push_back({"set_rows",
                   fmt::format("dst={}{} src=f32{} idx={}", dtype_name(t), shape_string(dst_ne),
                               shape_string(src_ne), shape_string({r, idx_batch[0], idx_batch[1], 1})),
                   store_nmse(t), build, ref, 0.0});
}

// set_rows into slice 1 of a [n, R, 3] cache (a view with an offset, as a KV cache layer is): the
// other slices must stay as they were.
void add_set_rows_into_slice(CaseList& cases, DType t, int64_t n, int64_t rows, int64_t r) {
  auto build = [=](Graph& g, CaseInputs& in) {
    Tensor* cache = in.uniform(t, {n, rows, 3, 1});
    Tensor* dst = view(g, cache, {n, rows, 1, 1}, cache->nb, cache->nb[2]);
    Tensor* src = in.uniform(DType::f32, {n, r, 1, 1});
    Tensor* idx = in.indices({r, 1, 1, 1}, rows, true);
    return set_rows(g, dst, src, idx);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    RefTensor out = ref_view(in[0], {n, rows, 1, 1}, packed_strides(in[0].ne), n * rows);
    const RefTensor stored = ref_round_trip(in[1], t);
    for (int64_t i1 = 0; i1 < r; ++i1)
      for (int64_t i0 = 0; i0 < n; ++i0) out(i0, static_cast<int64_t>(in[2](i1)), 0, 0) = stored(i0, i1);
    return out;
  };
  cases.push_back(
      {"set_rows",
       fmt::format("dst={}{} (slice 1 of {}) src=f32{}", dtype_name(t), shape_string({n, rows, 1, 1}),
                   shape_string({n, rows, 3, 1}), shape_string({n, r, 1, 1})),
       store_nmse(t), build, ref, 0.0});
}

// ---- cpy / convert ----------------------------------------------------------------------------------

enum class SrcLayout { packed, transposed, permuted };
enum class DstLayout { packed, transposed, convert };  // convert: loom::convert makes the destination

struct CpyCase {
  DType src_t, dst_t;
  Shape src_ne;  // logical shape of the source
  Shape dst_ne;  // logical shape of the destination (same element count)
  SrcLayout src_layout = SrcLayout::packed;
  DstLayout dst_layout = DstLayout::packed;
};

Shape transposed_shape(const Shape& ne) { return {ne[1], ne[0], ne[2], ne[3]}; }

void add_cpy(CaseList& cases, const CpyCase& c, bool perf) {
  auto build = [c](Graph& g, CaseInputs& in) -> Tensor* {
    Tensor* src = nullptr;
    switch (c.src_layout) {
      case SrcLayout::packed:
        src = in.uniform(c.src_t, c.src_ne);
        break;
      case SrcLayout::transposed:
        src = transpose(g, in.uniform(c.src_t, transposed_shape(c.src_ne)));
        break;
      case SrcLayout::permuted:  // leaf [ne1, ne2, ne0, ne3] seen as [ne0, ne1, ne2, ne3]
        src =
            permute(g, in.uniform(c.src_t, {c.src_ne[1], c.src_ne[2], c.src_ne[0], c.src_ne[3]}), 1, 2, 0, 3);
        break;
    }
    switch (c.dst_layout) {
      case DstLayout::packed:
        return cpy(g, src, in.poisoned(c.dst_t, c.dst_ne));
      case DstLayout::transposed:
        return cpy(g, src, transpose(g, in.poisoned(c.dst_t, transposed_shape(c.dst_ne))));
      case DstLayout::convert:
        return convert(g, src, c.dst_t);
    }
    return nullptr;
  };
  ReferenceFn ref;
  if (!perf) {
    ref = [c](const std::vector<RefTensor>& in) {
      RefTensor src = in[0];
      if (c.src_layout == SrcLayout::transposed) src = ref_transpose(in[0]);
      if (c.src_layout == SrcLayout::permuted) src = ref_permute(in[0], 1, 2, 0, 3);
      // Elements go over in flat order; the destination's rows are what gets rounded.
      return ref_round_trip(ref_reshape(src, c.dst_ne), c.dst_t);
    };
  }
  const char* src_layout = c.src_layout == SrcLayout::transposed ? " (transposed)"
                           : c.src_layout == SrcLayout::permuted ? " (permuted)"
                                                                 : "";
  const char* dst_layout = c.dst_layout == DstLayout::transposed ? " (transposed view)"
                           : c.dst_layout == DstLayout::convert  ? " (convert)"
                                                                 : "";
  cases.push_back({"cpy",
                   fmt::format("{}{}{} -> {}{}{}", dtype_name(c.src_t), shape_string(c.src_ne), src_layout,
                               dtype_name(c.dst_t), shape_string(c.dst_ne), dst_layout),
                   store_nmse(c.dst_t), build, ref, 0.0});
}

// cpy of f32 [n, r] into rows first..first+r-1 of a [n, rows] cache (a KV store at a position);
// the cache is poisoned, and the rows outside the window must stay so.
void add_cpy_into_window(CaseList& cases, DType t, int64_t n, int64_t rows, int64_t first, int64_t r) {
  auto build = [=](Graph& g, CaseInputs& in) {
    Tensor* src = in.uniform(DType::f32, {n, r, 1, 1});
    Tensor* cache = in.poisoned(t, {n, rows, 1, 1});
    return cpy(g, src, view(g, cache, {n, r, 1, 1}, cache->nb, first * cache->nb[1]));
  };
  auto ref = [=](const std::vector<RefTensor>& in) { return ref_round_trip(in[0], t); };
  cases.push_back({"cpy",
                   fmt::format("f32{} -> {} rows {}..{} of {}", shape_string({n, r, 1, 1}), dtype_name(t),
                               first, first + r - 1, shape_string({n, rows, 1, 1})),
                   store_nmse(t), build, ref, 0.0});
}

// ---- concat -----------------------------------------------------------------------------------------

void add_concat(CaseList& cases, DType t, const Shape& a_ne, int64_t b_dim_size, int dim, bool a_transposed) {
  Shape b_ne = a_ne;
  b_ne[dim] = b_dim_size;
  auto make = [t](CaseInputs& in, const Shape& ne) {
    // i32 values stay small integers; float types get the usual uniform values
    return t == DType::i32 ? in.indices(ne, 1000, false) : in.uniform(t, ne);
  };
  auto build = [=](Graph& g, CaseInputs& in) {
    Tensor* a = a_transposed ? transpose(g, make(in, transposed_shape(a_ne))) : make(in, a_ne);
    return concat(g, a, make(in, b_ne), dim);
  };
  auto ref = [=](const std::vector<RefTensor>& in) {
    const RefTensor a = a_transposed ? ref_transpose(in[0]) : in[0];
    const RefTensor& b = in[1];
    Shape ne = a_ne;
    ne[dim] += b_dim_size;
    RefTensor out(ne);
    for (int64_t i3 = 0; i3 < ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < ne[0]; ++i0) {
            int64_t i[kMaxDims] = {i0, i1, i2, i3};
            if (i[dim] < a_ne[dim]) {
              out(i0, i1, i2, i3) = a(i0, i1, i2, i3);
            } else {
              i[dim] -= a_ne[dim];
              out(i0, i1, i2, i3) = b(i[0], i[1], i[2], i[3]);
            }
          }
    return out;
  };
  cases.push_back({"concat",
                   fmt::format("{} a={}{} b={} dim={}", dtype_name(t), shape_string(a_ne),
                               a_transposed ? " (transposed)" : "", shape_string(b_ne), dim),
                   kNmseExact, build, ref, 0.0});
}

// ---- views through cont ------------------------------------------------------------------------------

struct ViewCase {
  std::string desc;
  DType t;
  Shape leaf;
  std::function<Tensor*(Graph&, Tensor*)> view;
  std::function<RefTensor(const RefTensor&)> ref_view;
};

void add_cont(CaseList& cases, const ViewCase& v) {
  auto build = [v](Graph& g, CaseInputs& in) {
    Tensor* leaf = v.t == DType::i32 ? in.indices(v.leaf, 1 << 20, false) : in.uniform(v.t, v.leaf);
    return cont(g, v.view(g, leaf));
  };
  auto ref = [v](const std::vector<RefTensor>& in) { return v.ref_view(in[0]); };
  cases.push_back({"cont", fmt::format("{}{} {}", dtype_name(v.t), shape_string(v.leaf), v.desc), kNmseExact,
                   build, ref, 0.0});
}

std::vector<ViewCase> view_cases() {
  std::vector<ViewCase> out;
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32}) {
    out.push_back({"transpose",
                   t,
                   {7, 5, 1, 1},
                   [](Graph& g, Tensor* a) { return transpose(g, a); },
                   [](const RefTensor& a) { return ref_transpose(a); }});
  }
  out.push_back({"permute(2,0,1,3)",
                 DType::f32,
                 {4, 3, 5, 2},
                 [](Graph& g, Tensor* a) { return permute(g, a, 2, 0, 1, 3); },
                 [](const RefTensor& a) { return ref_permute(a, 2, 0, 1, 3); }});
  out.push_back({"permute(0,2,1,3)",
                 DType::f16,
                 {16, 3, 5, 1},
                 [](Graph& g, Tensor* a) { return permute(g, a, 0, 2, 1, 3); },
                 [](const RefTensor& a) { return ref_permute(a, 0, 2, 1, 3); }});
  out.push_back({"permute(3,2,1,0)",
                 DType::f32,
                 {2, 3, 4, 5},
                 [](Graph& g, Tensor* a) { return permute(g, a, 3, 2, 1, 0); },
                 [](const RefTensor& a) { return ref_permute(a, 3, 2, 1, 0); }});
  // A [4, 5, 2] block of a [10, 8, 3] tensor starting at (2, 1, 1).
  const ElemStrides block_strides{1, 10, 80, 240};
  const int64_t block_offset = 2 + 1 * 10 + 1 * 80;
  out.push_back({"view [4, 5, 2] at (2, 1, 1)",
                 DType::f32,
                 {10, 8, 3, 1},
                 [=](Graph& g, Tensor* a) {
                   return strided_view(g, a, {4, 5, 2, 1}, block_strides, block_offset);
                 },
                 [=](const RefTensor& a) {
                   return ref_view(a, {4, 5, 2, 1}, block_strides, block_offset);
                 }});
  out.push_back({"reshape [4, 3, 10] then permute(1,0,2,3)",
                 DType::f32,
                 {12, 10, 1, 1},
                 [](Graph& g, Tensor* a) {
                   return permute(g, reshape(g, a, {4, 3, 10, 1}), 1, 0, 2, 3);
                 },
                 [](const RefTensor& a) {
                   return ref_permute(ref_reshape(a, {4, 3, 10, 1}), 1, 0, 2, 3);
                 }});
  out.push_back({"transpose of a transpose",
                 DType::f32,
                 {6, 9, 2, 1},
                 [](Graph& g, Tensor* a) { return transpose(g, transpose(g, a)); },
                 [](const RefTensor& a) { return a; }});
  out.push_back({"reshape [3, 4, 2, 5]",
                 DType::f16,
                 {24, 5, 1, 1},
                 [](Graph& g, Tensor* a) {
                   return reshape(g, a, {3, 4, 2, 5});
                 },
                 [](const RefTensor& a) {
                   return ref_reshape(a, {3, 4, 2, 5});
                 }});
  // Quantized rows copied whole: rows 2..5 of 7.
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k}) {
    const int64_t n = row_len(t, 0);
    out.push_back({"rows 2..5",
                   t,
                   {n, 7, 1, 1},
                   [](Graph& g, Tensor* a) {
                     return view(g, a, {a->ne[0], 4, 1, 1}, a->nb, 2 * a->nb[1]);
                   },
                   [n](const RefTensor& a) {
                     return ref_view(a, {n, 4, 1, 1}, packed_strides(a.ne), 2 * n);
                   }});
  }
  return out;
}

}  // namespace

void add_data_cases(CaseList& cases, CaseSet set) {
  if (set == CaseSet::perf) {
    for (DType t : {DType::f32, DType::f16, DType::q8_0, DType::q4_k})
      add_get_rows(cases, t, {4096, 8192, 1, 1}, 512, true);
    for (DType t : {DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k})
      add_cpy(cases, {DType::f32, t, {4096, 512, 1, 1}, {4096, 512, 1, 1}}, true);
    add_cpy(cases, {DType::f32, DType::f16, {512, 4096, 1, 1}, {512, 4096, 1, 1}, SrcLayout::transposed},
            true);
    for (DType t : {DType::f16, DType::q8_0}) add_set_rows(cases, t, {1024, 4096, 1, 1}, 32, {1, 1}, true);
    add_concat(cases, DType::f32, {4096, 256, 1, 1}, 256, 1, false);
    add_concat(cases, DType::f16, {128, 4096, 8, 1}, 1, 1, false);  // appending one KV position
    return;
  }

  for (DType t : kAllWeightTypes) {
    const int64_t n = row_len(t, 33);
    add_get_rows(cases, t, {n, 10, 1, 1}, 4, false);
    add_get_rows(cases, t, {n, 7, 3, 1}, 5, false);
    add_get_rows(cases, t, {n, 1, 1, 1}, 3, false);
    add_get_rows(cases, t, {n, 6, 2, 2}, 1, false);
  }
  for (DType t : kNewerWeightTypes) {
    add_get_rows(cases, t, {row_len(t, 0), 10, 1, 1}, 4, false);
    add_get_rows(cases, t, {row_len(t, 0), 7, 3, 1}, 5, false);
    // dequantization by cpy, and quantization: the CPU's reference quantizer (NMSE 0 against the
    // round trip); CUDA has no quantizers for these and reports the store "not supported"
    add_cpy(cases, {t, DType::f32, {row_len(t, 0), 5, 1, 1}, {row_len(t, 0), 5, 1, 1}}, false);
    add_cpy(cases, {DType::f32, t, {row_len(t, 0), 3, 1, 1}, {row_len(t, 0), 3, 1, 1}}, false);
  }
  add_get_rows(cases, DType::f32, {4096, 50, 1, 1}, 9, false);

  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k}) {
    const int64_t n = row_len(t, 19);
    add_set_rows(cases, t, {n, 16, 1, 1}, 3, {1, 1}, false);
    add_set_rows(cases, t, {n, 10, 4, 1}, 2, {2, 1}, false);  // indices broadcast over dim 2
    add_set_rows(cases, t, {n, 8, 2, 2}, 8, {1, 1}, false);   // every row rewritten
    add_set_rows(cases, t, {n, 5, 3, 2}, 1, {3, 2}, false);   // one row per slice, one token
  }
  for (DType t : {DType::f16, DType::q8_0, DType::q4_k})
    add_set_rows_into_slice(cases, t, row_len(t, 24), 12, 4);

  const DType from_f32[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0,
                            DType::q4_0, DType::q4_k, DType::q6_k};
  for (DType t : from_f32) {
    const int64_t n = row_len(t, 37);
    add_cpy(cases, {DType::f32, t, {n, 5, 1, 1}, {n, 5, 1, 1}}, false);
    add_cpy(cases, {DType::f32, t, {n, 3, 2, 1}, {n, 3, 2, 1}, SrcLayout::transposed}, false);
    add_cpy(cases, {DType::f32, t, {n, 4, 1, 1}, {n, 4, 1, 1}, SrcLayout::packed, DstLayout::convert}, false);
    if (t != DType::f32) {  // back to f32: plain dequantization
      add_cpy(cases, {t, DType::f32, {n, 5, 1, 1}, {n, 5, 1, 1}}, false);
      add_cpy(cases, {t, DType::f32, {2 * n, 3, 1, 1}, {n, 6, 1, 1}}, false);  // and a new shape
    }
  }
  add_cpy(cases, {DType::f32, DType::q8_0, {64, 3, 5, 1}, {64, 3, 5, 1}, SrcLayout::permuted}, false);
  add_cpy(cases, {DType::f32, DType::q4_k, {256, 2, 3, 1}, {256, 2, 3, 1}, SrcLayout::permuted}, false);
  add_cpy(cases, {DType::f32, DType::f16, {64, 6, 1, 1}, {96, 4, 1, 1}}, false);  // flat-order reshaping copy
  add_cpy(cases, {DType::f32, DType::q8_0, {32, 3, 2, 1}, {64, 3, 1, 1}}, false);
  add_cpy(cases,
          {DType::f32, DType::f16, {7, 16, 1, 1}, {7, 16, 1, 1}, SrcLayout::packed, DstLayout::transposed},
          false);
  add_cpy(cases,
          {DType::f32, DType::f32, {5, 9, 2, 1}, {5, 9, 2, 1}, SrcLayout::transposed, DstLayout::transposed},
          false);
  add_cpy(cases, {DType::f16, DType::bf16, {13, 4, 1, 1}, {13, 4, 1, 1}, SrcLayout::transposed}, false);
  add_cpy(cases, {DType::bf16, DType::f16, {13, 4, 1, 1}, {13, 4, 1, 1}}, false);
  add_cpy(cases, {DType::f16, DType::q8_0, {64, 3, 1, 1}, {64, 3, 1, 1}}, false);
  add_cpy(cases, {DType::i32, DType::i32, {6, 5, 1, 1}, {6, 5, 1, 1}, SrcLayout::transposed}, false);
  for (DType t : {DType::f32, DType::f16, DType::q8_0, DType::q4_0})
    add_cpy_into_window(cases, t, row_len(t, 40), 10, 4, 3);

  for (int dim = 0; dim < kMaxDims; ++dim) {
    add_concat(cases, DType::f32, {4, 3, 2, 2}, 3, dim, false);
    add_concat(cases, DType::f16, {5, 2, 3, 1}, 1, dim, false);
  }
  add_concat(cases, DType::f32, {6, 7, 1, 1}, 2, 1, true);
  add_concat(cases, DType::f32, {6, 7, 1, 1}, 5, 0, true);
  add_concat(cases, DType::i32, {3, 4, 2, 1}, 2, 2, false);
  add_concat(cases, DType::bf16, {64, 2, 1, 1}, 64, 0, false);

  for (const ViewCase& v : view_cases()) add_cont(cases, v);
}

}  // namespace loom::optest
