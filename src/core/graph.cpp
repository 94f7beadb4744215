// Graph storage and the view functions. The compute ops' front ends are in ops.cpp.
#include "loom/graph.h"

#include <algorithm>
#include <string_view>

namespace loom {

Tensor* Graph::new_tensor(DType type, const Shape& ne, std::string name, uint32_t flags) {
  for (int i = 0; i < kMaxDims; ++i) {
    if (ne[i] <= 0) {
      return fail(make_error(StatusCode::shape_mismatch, "new_tensor: tensor '{}': dimension {} is {}",
                             name, i, ne[i]));
    }
  }
  if (ne[0] % dtype_block_size(type) != 0) {
    return fail(make_error(StatusCode::shape_mismatch,
                           "new_tensor: tensor '{}': ne0 {} is not a multiple of {}'s block size {}",
                           name, ne[0], dtype_name(type), dtype_block_size(type)));
  }
  structure_key_.reset();
  Tensor& t = storage_.emplace_back();
  t.type = type;
  t.ne = ne;
  t.nb = contiguous_strides(type, ne);
  t.flags = flags;
  t.name = std::move(name);
  t.index = static_cast<int32_t>(leafs_.size());
  leafs_.push_back(&t);
  return &t;
}

void Graph::mark_output(Tensor* t) {
  if (!t) return;
  structure_key_.reset();
  t->flags |= kTensorOutput;
  if (std::find(outputs_.begin(), outputs_.end(), t) == outputs_.end()) outputs_.push_back(t);
}

Tensor* Graph::fail(Status s) {
  if (status_.ok()) status_ = std::move(s);
  return nullptr;
}

Tensor* Graph::add_node(OpKind op, DType type, const Shape& ne, std::initializer_list<Tensor*> srcs) {
  structure_key_.reset();
  Tensor& t = storage_.emplace_back();
  t.op = op;
  t.type = type;
  t.ne = ne;
  t.nb = contiguous_strides(type, ne);
  int i = 0;
  for (Tensor* s : srcs) t.src[i++] = s;
  t.index = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(&t);
  return &t;
}

Tensor* Graph::add_view(Tensor* src, const Shape& ne, const std::array<size_t, kMaxDims>& nb,
                        size_t offset) {
  Tensor* t = add_node(OpKind::view, src->type, ne, {src});
  t->nb = nb;
  t->view_src = src;
  t->view_offset = offset;
  // a view of a view keeps one suffix: "blk.0.attn_q (view)", not "... (view) (view)"
  static constexpr std::string_view kSuffix = " (view)";
  if (src->name.empty() || src->name.ends_with(kSuffix))
    t->name = src->name;
  else
    t->name = src->name + std::string(kSuffix);
  return t;
}

// ---- views -----------------------------------------------------------------------------------------

Tensor* view(Graph& g, Tensor* a, const Shape& ne, const std::array<size_t, kMaxDims>& nb_in,
             size_t offset) {
  if (!a) return nullptr;
  std::array<size_t, kMaxDims> nb = nb_in;
  nb[0] = dtype_type_size(a->type);
  for (int i = 0; i < kMaxDims; ++i) {
    if (ne[i] <= 0)
      return g.fail(make_error(StatusCode::shape_mismatch, "view: tensor {}: dimension {} of {} is not positive",
                               describe(*a), i, shape_string(ne)));
  }
  if (ne[0] % dtype_block_size(a->type) != 0)
    return g.fail(make_error(StatusCode::shape_mismatch, "view: tensor {}: ne0 {} splits a {} block",
                             describe(*a), ne[0], dtype_name(a->type)));
  Tensor probe;
  probe.type = a->type;
  probe.ne = ne;
  probe.nb = nb;
  if (offset + probe.nbytes() > a->nbytes())
    return g.fail(make_error(StatusCode::shape_mismatch,
                             "view: tensor {}: view {} at offset {} spans {} bytes, past its {} bytes",
                             describe(*a), shape_string(ne), offset, probe.nbytes(), a->nbytes()));
  return g.add_view(a, ne, nb, offset);
}

Tensor* reshape(Graph& g, Tensor* a, const Shape& ne) {
  if (!a) return nullptr;
  if (!a->is_contiguous())
    return g.fail(make_error(StatusCode::invalid_argument, "reshape: tensor {} is not contiguous", describe(*a)));
  const int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
  if (n != a->nelements() || ne[0] % dtype_block_size(a->type) != 0)
    return g.fail(make_error(StatusCode::shape_mismatch, "reshape: tensor {} cannot become {}", describe(*a),
                             shape_string(ne)));
  return view(g, a, ne, contiguous_strides(a->type, ne), 0);
}

Tensor* permute(Graph& g, Tensor* a, int ax0, int ax1, int ax2, int ax3) {
  if (!a) return nullptr;
  const int axes[kMaxDims] = {ax0, ax1, ax2, ax3};
  bool seen[kMaxDims] = {};
  for (int ax : axes) {
    if (ax < 0 || ax >= kMaxDims || seen[ax])
      return g.fail(make_error(StatusCode::invalid_argument,
                               "permute: tensor {}: axes ({}, {}, {}, {}) are not a permutation",
                               describe(*a), ax0, ax1, ax2, ax3));
    seen[ax] = true;
  }
  if (dtype_is_quantized(a->type) && ax0 != 0)
    return g.fail(make_error(StatusCode::type_mismatch, "permute: tensor {}: cannot move dim 0 of a quantized type",
                             describe(*a)));
  Shape ne{};
  std::array<size_t, kMaxDims> nb{};
  for (int i = 0; i < kMaxDims; ++i) {
    ne[axes[i]] = a->ne[i];
    nb[axes[i]] = a->nb[i];
  }
  Tensor* t = g.add_view(a, ne, nb, 0);
  return t;
}

Tensor* transpose(Graph& g, Tensor* a) { return permute(g, a, 1, 0, 2, 3); }

}  // namespace loom
