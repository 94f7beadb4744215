// Op front ends: validate operands, then append a node. Kernels trust what passes here.
#include <cmath>

#include "loom/graph.h"

namespace loom {

namespace {

Tensor* shape_error(Graph& g, const char* op, const Tensor& a, const Tensor& b, const char* why) {
  return g.fail(make_error(StatusCode::shape_mismatch, "{}: tensor {} does not fit tensor {}: {}", op,
                           describe(a), describe(b), why));
}

Tensor* type_error(Graph& g, const char* op, const Tensor& a, const char* expected) {
  return g.fail(make_error(StatusCode::type_mismatch, "{}: tensor {} has type {}; expected {}", op,
                           describe(a), dtype_name(a.type), expected));
}

// Two operands whose types do not go together (as opposed to one operand of a wrong type).
Tensor* type_pair_error(Graph& g, const char* op, const Tensor& a, const Tensor& b, const char* why) {
  return g.fail(make_error(StatusCode::type_mismatch, "{}: tensor {} does not fit tensor {}: {}", op,
                           describe(a), describe(b), why));
}

Tensor* elementwise_binary(Graph& g, OpKind op, Tensor* a, Tensor* b) {
  if (!a || !b) return nullptr;
  const char* name = op_name(op);
  if (a->type != DType::f32) return type_error(g, name, *a, "f32");
  if (b->type != DType::f32) return type_error(g, name, *b, "f32");
  for (int i = 0; i < kMaxDims; ++i)
    if (a->ne[i] % b->ne[i] != 0)
      return shape_error(g, name, *a, *b, "each dimension of the second must divide the first's");
  if (!b->rows_contiguous()) return g.fail(make_error(StatusCode::invalid_argument,
                                                       "{}: tensor {}: rows must be contiguous", name, describe(*b)));
  if (!a->rows_contiguous()) return g.fail(make_error(StatusCode::invalid_argument,
                                                       "{}: tensor {}: rows must be contiguous", name, describe(*a)));
  return g.add_node(op, DType::f32, a->ne, {a, b});
}

Tensor* elementwise_unary(Graph& g, OpKind op, Tensor* a) {
  if (!a) return nullptr;
  if (a->type != DType::f32) return type_error(g, op_name(op), *a, "f32");
  if (!a->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "{}: tensor {}: rows must be contiguous",
                             op_name(op), describe(*a)));
  return g.add_node(op, DType::f32, a->ne, {a});
}

Tensor* gated(Graph& g, OpKind op, Tensor* gate, Tensor* up) {
  if (!gate || !up) return nullptr;
  if (gate->type != DType::f32) return type_error(g, op_name(op), *gate, "f32");
  if (up->type != DType::f32) return type_error(g, op_name(op), *up, "f32");
  if (gate->ne != up->ne) return shape_error(g, op_name(op), *gate, *up, "shapes must be equal");
  if (!gate->rows_contiguous() || !up->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "{}: rows must be contiguous", op_name(op)));
  return g.add_node(op, DType::f32, gate->ne, {gate, up});
}

Tensor* row_op(Graph& g, OpKind op, Tensor* a) {
  if (!a) return nullptr;
  if (a->type != DType::f32) return type_error(g, op_name(op), *a, "f32");
  if (!a->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "{}: tensor {}: rows must be contiguous",
                             op_name(op), describe(*a)));
  return g.add_node(op, DType::f32, a->ne, {a});
}

bool check_mask(Graph& g, const char* op, const Tensor& mask, int64_t n_cols, int64_t n_rows) {
  if (mask.type != DType::f32 && mask.type != DType::f16) {
    type_error(g, op, mask, "f32 or f16");
    return false;
  }
  if (mask.ne[0] != n_cols || mask.ne[1] < n_rows || !mask.rows_contiguous()) {
    g.fail(make_error(StatusCode::shape_mismatch,
                      "{}: mask {} must be [{}, >= {}] with contiguous rows", op, describe(mask),
                      n_cols, n_rows));
    return false;
  }
  return true;
}

}  // namespace

Tensor* add(Graph& g, Tensor* a, Tensor* b) { return elementwise_binary(g, OpKind::add, a, b); }
Tensor* sub(Graph& g, Tensor* a, Tensor* b) { return elementwise_binary(g, OpKind::sub, a, b); }
Tensor* mul(Graph& g, Tensor* a, Tensor* b) { return elementwise_binary(g, OpKind::mul, a, b); }
Tensor* div(Graph& g, Tensor* a, Tensor* b) { return elementwise_binary(g, OpKind::div, a, b); }

Tensor* scale(Graph& g, Tensor* a, float s, float bias) {
  Tensor* t = elementwise_unary(g, OpKind::scale, a);
  if (t) t->set_params(ScaleParams{s, bias});
  return t;
}

Tensor* silu(Graph& g, Tensor* a) { return elementwise_unary(g, OpKind::silu, a); }
Tensor* gelu(Graph& g, Tensor* a) { return elementwise_unary(g, OpKind::gelu, a); }
Tensor* gelu_erf(Graph& g, Tensor* a) { return elementwise_unary(g, OpKind::gelu_erf, a); }
Tensor* swiglu(Graph& g, Tensor* gate, Tensor* up) { return gated(g, OpKind::swiglu, gate, up); }
Tensor* geglu(Graph& g, Tensor* gate, Tensor* up) { return gated(g, OpKind::geglu, gate, up); }

Tensor* swiglu_oai(Graph& g, Tensor* gate, Tensor* up, float alpha, float limit) {
  if (gate && !(limit > 0.0f && std::isfinite(alpha)))
    return g.fail(make_error(StatusCode::invalid_argument,
                             "swiglu_oai: tensor {}: limit {} must be positive and alpha {} finite",
                             describe(*gate), limit, alpha));
  Tensor* t = gated(g, OpKind::swiglu_oai, gate, up);
  if (t) t->set_params(SwigluOaiParams{alpha, limit});
  return t;
}

Tensor* softcap(Graph& g, Tensor* a, float cap) {
  if (a && !(cap > 0.0f))
    return g.fail(make_error(StatusCode::invalid_argument, "softcap: tensor {}: cap {} must be positive",
                             describe(*a), cap));
  Tensor* t = elementwise_unary(g, OpKind::softcap, a);
  if (t) t->set_params(SoftcapParams{cap});
  return t;
}

Tensor* rms_norm(Graph& g, Tensor* a, float eps) {
  Tensor* t = row_op(g, OpKind::rms_norm, a);
  if (t) t->set_params(NormParams{eps});
  return t;
}

Tensor* norm(Graph& g, Tensor* a, float eps) {
  Tensor* t = row_op(g, OpKind::norm, a);
  if (t) t->set_params(NormParams{eps});
  return t;
}

Tensor* sum_rows(Graph& g, Tensor* a) {
  if (!a) return nullptr;
  if (a->type != DType::f32) return type_error(g, "sum_rows", *a, "f32");
  return g.add_node(OpKind::sum_rows, DType::f32, {1, a->ne[1], a->ne[2], a->ne[3]}, {a});
}

Tensor* all_reduce(Graph& g, Tensor* a, Communicator* comm) {
  if (!a) return nullptr;
  if (!comm) return g.fail(make_error(StatusCode::invalid_argument, "all_reduce: no communicator"));
  if (a->type != DType::f32) return type_error(g, "all_reduce", *a, "f32");
  if (!a->is_contiguous())
    return g.fail(
        make_error(StatusCode::invalid_argument, "all_reduce: tensor {} must be contiguous", describe(*a)));
  Tensor* t = g.add_node(OpKind::all_reduce, DType::f32, a->ne, {a});
  if (t) t->set_params(AllReduceParams{comm});
  return t;
}

Tensor* argmax(Graph& g, Tensor* a) {
  if (!a) return nullptr;
  if (a->type != DType::f32) return type_error(g, "argmax", *a, "f32");
  return g.add_node(OpKind::argmax, DType::i32, {a->ne[1], a->ne[2], a->ne[3], 1}, {a});
}

Tensor* top_k(Graph& g, Tensor* a, int k) {
  if (!a) return nullptr;
  if (a->type != DType::f32) return type_error(g, "top_k", *a, "f32");
  if (k < 1 || k > a->ne[0])
    return g.fail(make_error(StatusCode::invalid_argument, "top_k: tensor {}: k = {} must be in [1, {}]",
                             describe(*a), k, a->ne[0]));
  Tensor* t = g.add_node(OpKind::top_k, DType::i32, {k, a->ne[1], a->ne[2], a->ne[3]}, {a});
  t->set_params(TopKParams{k});
  return t;
}

Tensor* sample_tokens(Graph& g, Tensor* logits, Tensor* candidates, Tensor* params) {
  if (!logits || !candidates || !params) return nullptr;
  if (logits->type != DType::f32) return type_error(g, "sample_tokens", *logits, "f32");
  if (candidates->type != DType::i32) return type_error(g, "sample_tokens", *candidates, "i32");
  if (params->type != DType::i32) return type_error(g, "sample_tokens", *params, "i32");
  const int64_t n_rows = logits->ne[1];
  if (logits->ne[2] != 1 || logits->ne[3] != 1 || !candidates->is_contiguous() || !params->is_contiguous() ||
      candidates->ne[1] != n_rows || candidates->ne[2] != 1 || candidates->ne[3] != 1 ||
      candidates->ne[0] > logits->ne[0] || params->ne[0] != kSampleParamWords || params->ne[1] != n_rows ||
      params->ne[2] != 1 || params->ne[3] != 1)
    return g.fail(make_error(StatusCode::invalid_argument,
                             "sample_tokens: logits {}, candidates {} and params {} must be [n_vocab, n], "
                             "contiguous [K <= n_vocab, n] and contiguous [{}, n]",
                             describe(*logits), describe(*candidates), describe(*params), kSampleParamWords));
  return g.add_node(OpKind::sample_tokens, DType::i32, {n_rows, 1, 1, 1}, {logits, candidates, params});
}

Tensor* get_rows(Graph& g, Tensor* a, Tensor* idx) {
  if (!a || !idx) return nullptr;
  if (idx->type != DType::i32) return type_error(g, "get_rows", *idx, "i32");
  if (!a->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "get_rows: tensor {}: rows must be contiguous",
                             describe(*a)));
  if (idx->ne[1] != a->ne[2] || idx->ne[2] != a->ne[3] || idx->ne[3] != 1)
    return shape_error(g, "get_rows", *a, *idx, "indices must be [k, a.ne2, a.ne3]");
  return g.add_node(OpKind::get_rows, DType::f32, {a->ne[0], idx->ne[0], a->ne[2], a->ne[3]}, {a, idx});
}

Tensor* mul_mat(Graph& g, Tensor* a, Tensor* b) {
  if (!a || !b) return nullptr;
  if (b->type != DType::f32) return type_error(g, "mul_mat", *b, "f32 (activations)");
  if (a->type == DType::i32) return type_error(g, "mul_mat", *a, "a float or quantized type");
  if (a->ne[0] != b->ne[0]) return shape_error(g, "mul_mat", *a, *b, "ne0 (the reduced dimension) must match");
  if (b->ne[2] % a->ne[2] != 0 || b->ne[3] % a->ne[3] != 0)
    return shape_error(g, "mul_mat", *a, *b, "the first's dims 2-3 must divide the second's");
  if (!a->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "mul_mat: tensor {}: rows must be contiguous",
                             describe(*a)));
  return g.add_node(OpKind::mul_mat, DType::f32, {a->ne[1], b->ne[1], b->ne[2], b->ne[3]}, {a, b});
}

Tensor* mul_mat_id(Graph& g, Tensor* as, Tensor* b, Tensor* ids) {
  if (!as || !b || !ids) return nullptr;
  if (b->type != DType::f32) return type_error(g, "mul_mat_id", *b, "f32 (activations)");
  if (ids->type != DType::i32) return type_error(g, "mul_mat_id", *ids, "i32");
  if (as->type == DType::i32) return type_error(g, "mul_mat_id", *as, "a float or quantized type");
  if (as->ne[3] != 1 || !as->rows_contiguous())
    return g.fail(make_error(StatusCode::shape_mismatch,
                             "mul_mat_id: experts {} must be [k, m, n_expert] with contiguous rows",
                             describe(*as)));
  if (as->ne[0] != b->ne[0]) return shape_error(g, "mul_mat_id", *as, *b, "ne0 must match");
  if (ids->ne[2] != 1 || ids->ne[3] != 1 || ids->ne[1] != b->ne[2] || b->ne[3] != 1)
    return shape_error(g, "mul_mat_id", *b, *ids, "ids must be [n_used, n_tokens] with b [k, 1|n_used, n_tokens]");
  if (b->ne[1] != 1 && b->ne[1] != ids->ne[0])
    return shape_error(g, "mul_mat_id", *b, *ids, "b.ne1 must be 1 or n_used");
  return g.add_node(OpKind::mul_mat_id, DType::f32, {as->ne[1], ids->ne[0], ids->ne[1], 1}, {as, b, ids});
}

Tensor* rope(Graph& g, Tensor* a, Tensor* pos, Tensor* freq_factors, const RopeParams& p) {
  if (!a || !pos) return nullptr;
  if (a->type != DType::f32) return type_error(g, "rope", *a, "f32");
  if (pos->type != DType::i32) return type_error(g, "rope", *pos, "i32");
  if (pos->ne[0] != a->ne[2] || pos->nrows() != 1)
    return shape_error(g, "rope", *a, *pos, "positions must be [a.ne2]");
  if (p.n_dims <= 0 || p.n_dims % 2 != 0 || p.n_dims > a->ne[0])
    return g.fail(make_error(StatusCode::invalid_argument, "rope: tensor {}: n_dims {} must be even and in [2, {}]",
                             describe(*a), p.n_dims, a->ne[0]));
  if (p.mode != RopeMode::normal && p.mode != RopeMode::neox)
    return g.fail(make_error(StatusCode::invalid_argument, "rope: unknown mode {}", static_cast<int>(p.mode)));
  if (!a->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "rope: tensor {}: rows must be contiguous", describe(*a)));
  if (freq_factors) {
    if (freq_factors->type != DType::f32) return type_error(g, "rope", *freq_factors, "f32");
    if (freq_factors->nelements() < p.n_dims / 2)
      return shape_error(g, "rope", *a, *freq_factors, "freq_factors needs n_dims/2 elements");
  }
  Tensor* t = g.add_node(OpKind::rope, DType::f32, a->ne, {a, pos, freq_factors});
  t->set_params(p);
  return t;
}

Tensor* soft_max(Graph& g, Tensor* a, Tensor* mask, float scale_value) {
  if (!a) return nullptr;
  if (a->type != DType::f32) return type_error(g, "soft_max", *a, "f32");
  if (!a->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "soft_max: tensor {}: rows must be contiguous", describe(*a)));
  if (mask && !check_mask(g, "soft_max", *mask, a->ne[0], a->ne[1])) return nullptr;
  Tensor* t = g.add_node(OpKind::soft_max, DType::f32, a->ne, {a, mask});
  t->set_params(SoftMaxParams{scale_value});
  return t;
}

Tensor* flash_attn(Graph& g, Tensor* q, Tensor* k, Tensor* v, Tensor* mask, float scale_value,
                   float softcap_value, Tensor* sinks) {
  if (!q || !k || !v) return nullptr;
  if (sinks) {
    if (sinks->type != DType::f32) return type_error(g, "flash_attn", *sinks, "f32 (sinks)");
    if (sinks->nelements() != q->ne[2] || !sinks->is_contiguous())
      return shape_error(g, "flash_attn", *q, *sinks, "sinks must be a packed f32 [n_head]");
  }
  if (q->type != DType::f32) return type_error(g, "flash_attn", *q, "f32");
  if (k->type != DType::f32 && k->type != DType::f16) return type_error(g, "flash_attn", *k, "f32 or f16");
  if (v->type != DType::f32 && v->type != DType::f16) return type_error(g, "flash_attn", *v, "f32 or f16");
  if (q->ne[0] != k->ne[0]) return shape_error(g, "flash_attn", *q, *k, "head size (ne0) must match");
  if (k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2])
    return shape_error(g, "flash_attn", *k, *v, "keys and values need the same length and head count");
  if (q->ne[2] % k->ne[2] != 0)
    return shape_error(g, "flash_attn", *q, *k, "query heads must be a multiple of key heads");
  if (q->ne[3] != k->ne[3] || k->ne[3] != v->ne[3])
    return shape_error(g, "flash_attn", *q, *k, "ne3 must match");
  if (!q->rows_contiguous() || !k->rows_contiguous() || !v->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "flash_attn: q, k and v rows must be contiguous"));
  if (softcap_value < 0.0f)
    return g.fail(make_error(StatusCode::invalid_argument, "flash_attn: softcap {} must be >= 0", softcap_value));
  if (mask && !check_mask(g, "flash_attn", *mask, k->ne[1], q->ne[1])) return nullptr;
  Tensor* t = g.add_node(OpKind::flash_attn, DType::f32, {v->ne[0], q->ne[2], q->ne[1], q->ne[3]},
                         {q, k, v, mask, sinks});
  t->set_params(FlashAttnParams{scale_value, softcap_value});
  return t;
}

Tensor* set_rows(Graph& g, Tensor* dst, Tensor* src, Tensor* idx) {
  if (!dst || !src || !idx) return nullptr;
  if (src->type != DType::f32) return type_error(g, "set_rows", *src, "f32");
  if (idx->type != DType::i32) return type_error(g, "set_rows", *idx, "i32");
  if (dst->type == DType::i32) return type_error(g, "set_rows", *dst, "a float or quantized type");
  if (src->ne[0] != dst->ne[0] || src->ne[2] != dst->ne[2] || src->ne[3] != dst->ne[3])
    return shape_error(g, "set_rows", *dst, *src, "ne0, ne2 and ne3 must match");
  if (idx->ne[0] != src->ne[1] || src->ne[2] % idx->ne[1] != 0 || src->ne[3] % idx->ne[2] != 0 || idx->ne[3] != 1)
    return shape_error(g, "set_rows", *src, *idx, "indices must be [src.ne1, divisor of ne2, divisor of ne3]");
  if (!dst->rows_contiguous() || !src->rows_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "set_rows: rows must be contiguous"));
  Tensor* t = g.add_node(OpKind::set_rows, dst->type, dst->ne, {src, idx, dst});
  t->nb = dst->nb;
  t->view_src = dst;
  t->name = dst->name;
  return t;
}

Tensor* cpy(Graph& g, Tensor* src, Tensor* dst) {
  if (!src || !dst) return nullptr;
  if (src->nelements() != dst->nelements())
    return shape_error(g, "cpy", *src, *dst, "element counts must be equal");
  if ((src->type == DType::i32) != (dst->type == DType::i32))
    return type_pair_error(g, "cpy", *src, *dst, "i32 copies only to i32");
  if (dtype_is_quantized(src->type) && !src->is_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "cpy: quantized source {} must be contiguous", describe(*src)));
  if (dtype_is_quantized(dst->type) && (!dst->is_contiguous() || src->ne[0] % dtype_block_size(dst->type) != 0))
    return g.fail(make_error(StatusCode::invalid_argument, "cpy: quantized destination {} must be contiguous, rows whole blocks",
                             describe(*dst)));
  Tensor* t = g.add_node(OpKind::cpy, dst->type, dst->ne, {src, dst});
  t->nb = dst->nb;
  t->view_src = dst;
  t->name = dst->name;
  return t;
}

Tensor* convert(Graph& g, Tensor* a, DType type) {
  if (!a) return nullptr;
  if (a->ne[0] % dtype_block_size(type) != 0)
    return g.fail(make_error(StatusCode::shape_mismatch, "convert: tensor {}: ne0 is not a multiple of {}'s block",
                             describe(*a), dtype_name(type)));
  if ((a->type == DType::i32) != (type == DType::i32))
    return type_error(g, "convert", *a, "i32 converts only to i32");
  if (dtype_is_quantized(a->type) && !a->is_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "convert: quantized source {} must be contiguous", describe(*a)));
  Tensor* t = g.add_node(OpKind::cpy, type, a->ne, {a});
  return t;
}

Tensor* cont(Graph& g, Tensor* a) { return a ? convert(g, a, a->type) : nullptr; }

Tensor* concat(Graph& g, Tensor* a, Tensor* b, int dim) {
  if (!a || !b) return nullptr;
  if (dim < 0 || dim >= kMaxDims)
    return g.fail(make_error(StatusCode::invalid_argument, "concat: dim {} out of range", dim));
  if (a->type != b->type) return type_pair_error(g, "concat", *a, *b, "types must be equal");
  if (dtype_is_quantized(a->type)) return type_error(g, "concat", *a, "a non-quantized type");
  for (int i = 0; i < kMaxDims; ++i)
    if (i != dim && a->ne[i] != b->ne[i]) return shape_error(g, "concat", *a, *b, "dims other than the joined one must match");
  Shape ne = a->ne;
  ne[dim] += b->ne[dim];
  Tensor* t = g.add_node(OpKind::concat, a->type, ne, {a, b});
  t->set_params(ConcatParams{dim});
  return t;
}

}  // namespace loom
