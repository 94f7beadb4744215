// Maps nodes to CPU kernels.
#include <string_view>

#include "cpu_ops.h"
#include "loom/comm.h"
#include "loom/graph.h"

namespace loom::cpu {

bool supports(const Tensor& node) {
  switch (node.op) {
    case OpKind::none:
    case OpKind::view:
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::scale:
    case OpKind::silu:
    case OpKind::gelu:
    case OpKind::gelu_erf:
    case OpKind::softcap:
    case OpKind::swiglu:
    case OpKind::geglu:
    case OpKind::swiglu_oai:
    case OpKind::rms_norm:
    case OpKind::norm:
    case OpKind::soft_max:
    case OpKind::sum_rows:
    case OpKind::argmax:
    case OpKind::top_k:
    case OpKind::sample_tokens:
    case OpKind::get_rows:
    case OpKind::set_rows:
    case OpKind::cpy:
    case OpKind::concat:
    case OpKind::mul_mat:
    case OpKind::mul_mat_id:
    case OpKind::rope:
    case OpKind::flash_attn:
      return true;
    case OpKind::all_reduce:  // with a host group's communicator
      return std::string_view(node.get_params<AllReduceParams>().comm->kind()) == "host";
    case OpKind::count_:
      break;
  }
  return false;
}

size_t work_size(const Tensor& node, int nth) {
  switch (node.op) {
    case OpKind::mul_mat: return mul_mat_work_size(node, nth);
    case OpKind::mul_mat_id: return mul_mat_id_work_size(node, nth);
    case OpKind::flash_attn: return flash_attn_work_size(node, nth);
    // one float row per thread for conversions and sorting
    case OpKind::get_rows:
    case OpKind::set_rows:
    case OpKind::cpy:
    case OpKind::top_k:
      return static_cast<size_t>(nth) * static_cast<size_t>(node.src[0]->ne[0]) * 8 + 64 * nth;
    default: return 0;
  }
}

void compute_node(const KernelContext& ctx, Tensor* node) {
  switch (node->op) {
    case OpKind::none:
    case OpKind::view: return;
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div: op_binary(ctx, node); return;
    case OpKind::scale:
    case OpKind::silu:
    case OpKind::gelu:
    case OpKind::gelu_erf:
    case OpKind::softcap: op_unary(ctx, node); return;
    case OpKind::swiglu:
    case OpKind::geglu: op_gated(ctx, node); return;
    case OpKind::swiglu_oai:
      op_swiglu_oai(ctx, node);
      return;
    case OpKind::rms_norm: op_rms_norm(ctx, node); return;
    case OpKind::norm: op_norm(ctx, node); return;
    case OpKind::soft_max: op_soft_max(ctx, node); return;
    case OpKind::sum_rows: op_sum_rows(ctx, node); return;
    case OpKind::argmax: op_argmax(ctx, node); return;
    case OpKind::top_k: op_top_k(ctx, node); return;
    case OpKind::sample_tokens:
      op_sample_tokens(ctx, node);
      return;
    case OpKind::get_rows: op_get_rows(ctx, node); return;
    case OpKind::set_rows: op_set_rows(ctx, node); return;
    case OpKind::cpy: op_cpy(ctx, node); return;
    case OpKind::concat: op_concat(ctx, node); return;
    case OpKind::mul_mat: op_mul_mat(ctx, node); return;
    case OpKind::mul_mat_id: op_mul_mat_id(ctx, node); return;
    case OpKind::rope: op_rope(ctx, node); return;
    case OpKind::flash_attn: op_flash_attn(ctx, node); return;
    case OpKind::all_reduce:
      op_all_reduce(ctx, node);
      return;
    case OpKind::count_: break;
  }
  LOOM_ASSERT(false && "unknown op");
}

}  // namespace loom::cpu
