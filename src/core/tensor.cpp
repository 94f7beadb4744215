#include "loom/tensor.h"

#include <fmt/format.h>

namespace loom {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::none: return "none";
    case OpKind::view: return "view";
    case OpKind::get_rows: return "get_rows";
    case OpKind::add: return "add";
    case OpKind::sub: return "sub";
    case OpKind::mul: return "mul";
    case OpKind::div: return "div";
    case OpKind::scale: return "scale";
    case OpKind::rms_norm: return "rms_norm";
    case OpKind::norm: return "norm";
    case OpKind::mul_mat: return "mul_mat";
    case OpKind::mul_mat_id: return "mul_mat_id";
    case OpKind::rope: return "rope";
    case OpKind::soft_max: return "soft_max";
    case OpKind::flash_attn: return "flash_attn";
    case OpKind::silu: return "silu";
    case OpKind::gelu: return "gelu";
    case OpKind::gelu_erf: return "gelu_erf";
    case OpKind::swiglu: return "swiglu";
    case OpKind::geglu: return "geglu";
    case OpKind::swiglu_oai:
      return "swiglu_oai";
    case OpKind::softcap: return "softcap";
    case OpKind::argmax: return "argmax";
    case OpKind::top_k: return "top_k";
    case OpKind::sample_tokens:
      return "sample_tokens";
    case OpKind::set_rows: return "set_rows";
    case OpKind::cpy: return "cpy";
    case OpKind::concat: return "concat";
    case OpKind::sum_rows: return "sum_rows";
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::count_: break;
  }
  return "unknown";
}

size_t Tensor::nbytes() const {
  if (nelements() == 0) return 0;
  const int64_t bs = dtype_block_size(type);
  size_t bytes = dtype_type_size(type);
  bytes += static_cast<size_t>(ne[0] / bs - 1) * nb[0];
  for (int i = 1; i < kMaxDims; ++i) bytes += static_cast<size_t>(ne[i] - 1) * nb[i];
  return bytes;
}

bool Tensor::is_contiguous() const {
  return nb == contiguous_strides(type, ne) ||
         // dimensions of size 1 may carry any stride
         [&] {
           size_t expect = dtype_type_size(type);
           if (nb[0] != expect) return false;
           expect = row_size();
           for (int i = 1; i < kMaxDims; ++i) {
             if (ne[i] != 1 && nb[i] != expect) return false;
             expect *= static_cast<size_t>(ne[i]);
           }
           return true;
         }();
}

bool Tensor::rows_contiguous() const { return nb[0] == dtype_type_size(type); }

std::array<size_t, kMaxDims> contiguous_strides(DType type, const Shape& ne) {
  std::array<size_t, kMaxDims> nb{};
  nb[0] = dtype_type_size(type);
  nb[1] = dtype_row_size(type, ne[0]);
  for (int i = 2; i < kMaxDims; ++i) nb[i] = nb[i - 1] * static_cast<size_t>(ne[i - 1]);
  return nb;
}

std::string shape_string(const Shape& ne) {
  int n = kMaxDims;
  while (n > 1 && ne[n - 1] == 1) --n;
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += fmt::format("{}{}", i ? ", " : "", ne[i]);
  return s + "]";
}

std::string describe(const Tensor& t) {
  return fmt::format("'{}' {} {}", t.name.empty() ? "(unnamed)" : t.name, dtype_name(t.type),
                     shape_string(t.ne));
}

}  // namespace loom
