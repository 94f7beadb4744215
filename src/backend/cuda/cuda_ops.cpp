// What the CUDA kernels do per graph node (cuda_ops.h): which nodes they handle, the scratch each
// needs, and the launch of one node's kernels. The executor (cuda_exec.cpp) launches through these;
// the backend class and its registration are in cuda_register.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <string>

#include "cuda_common.h"
#include "cuda_nccl.h"
#include "cuda_ops.h"
#include "kernels/attention.cuh"
#include "kernels/copy.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/matmul.cuh"
#include "kernels/norm.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rope.cuh"
#include "kernels/sample.cuh"
#include "kernels/softmax.cuh"
#include "loom/graph.h"

namespace loom::cuda {

namespace {

// YaRN's correction range: the pair index whose wavelength fits `n_rot` turns into the training
// context, n_dims * ln(n_ctx_orig / (n_rot * 2 pi)) / (2 ln base).
double yarn_corr_dim(int n_dims, int n_ctx_orig, double n_rot, double base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

RopeArgs make_rope_args(const RopeParams& p) {
  RopeArgs a;
  a.n_dims = p.n_dims;
  a.neox = p.mode == RopeMode::neox;
  a.freq_base = p.freq_base;
  a.freq_scale = p.freq_scale;
  a.ext_factor = p.ext_factor;
  a.mscale = p.attn_factor;
  static const bool table = env_switch("LOOM_CUDA_ROPE_TABLE");  // =0: pow on the device, to compare
  a.has_table = table && p.n_dims / 2 <= kMaxRopeTable;
  if (a.has_table)  // the CPU's expression (ops_rope.cpp), so both take the same frequencies
    for (int i = 0; i < p.n_dims / 2; ++i) a.inv_freq[i] = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
  if (p.ext_factor != 0.0f) {
    a.mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);  // YaRN's attention temperature
    // whole dims (floor / ceil) as GGUF runtimes take them, unless yarn_unrounded (HF's truncate: false)
    double low = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base);
    double high = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base);
    if (!p.yarn_unrounded) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    a.corr_low = std::max(0.0, low);
    a.corr_high = std::min(static_cast<double>(p.n_dims - 1), high);
  }
  return a;
}

namespace {

bool use_flash_attn_mma(const Tensor& t, bool fast) {
  return fast && t.op == OpKind::flash_attn && t.src[0]->ne[1] >= kFlashAttnMmaMinQueries &&
         flash_attn_mma_supported(&t);
}

// Decode (fewer queries than the tensor-core kernel takes) in the fast mode: flash-decoding.
bool use_flash_attn_decode(const Tensor& t, bool fast) {
  return fast && t.op == OpKind::flash_attn && t.src[0]->ne[1] < kFlashAttnMmaMinQueries &&
         flash_attn_decode_supported(&t);
}

// Launches the kernels of one node (views never get here).
CudaError run_node(const LaunchContext& ctx, const Tensor* t) {
  switch (t->op) {
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
      return launch_binary(ctx, t);
    case OpKind::scale: {
      const auto p = t->get_params<ScaleParams>();
      return launch_unary(ctx, t, p.scale, p.bias);
    }
    case OpKind::silu:
    case OpKind::gelu:
    case OpKind::gelu_erf:
      return launch_unary(ctx, t, 0.0f, 0.0f);
    case OpKind::softcap:
      return launch_unary(ctx, t, t->get_params<SoftcapParams>().cap, 0.0f);
    case OpKind::swiglu:
    case OpKind::geglu:
      return launch_gated(ctx, t);
    case OpKind::swiglu_oai:
      return launch_swiglu_oai(ctx, t);
    case OpKind::rms_norm:
    case OpKind::norm:
      return launch_norm(ctx, t, t->get_params<NormParams>().eps);
    case OpKind::soft_max:
      return launch_soft_max(ctx, t, t->get_params<SoftMaxParams>().scale);
    case OpKind::sum_rows:
      return launch_sum_rows(ctx, t);
    case OpKind::argmax:
      return launch_argmax(ctx, t);
    case OpKind::top_k:
      return launch_top_k(ctx, t, t->get_params<TopKParams>().k);
    case OpKind::sample_tokens:
      return launch_sample_tokens(ctx, t);
    case OpKind::get_rows:
      return launch_get_rows(ctx, t);
    case OpKind::set_rows:
      return launch_set_rows(ctx, t);
    case OpKind::cpy:
      return launch_cpy(ctx, t);
    case OpKind::concat:
      return launch_concat(ctx, t, t->get_params<ConcatParams>().dim);
    case OpKind::mul_mat:
      return launch_mul_mat(ctx, t);
    case OpKind::mul_mat_id:
      return launch_mul_mat_id(ctx, t);
    case OpKind::rope:
      return launch_rope(ctx, t, make_rope_args(t->get_params<RopeParams>()));
    case OpKind::flash_attn: {
      const auto p = t->get_params<FlashAttnParams>();
      // prefill in the fast mode: tensor cores
      if (use_flash_attn_mma(*t, ctx.fast)) return launch_flash_attn_mma(ctx, t, p.scale, p.softcap);
      // decode in the fast mode, where the planned scratch holds the splits (see scratch_bytes)
      if (use_flash_attn_decode(*t, ctx.fast) && ctx.scratch_size >= flash_attn_decode_scratch_bytes(t))
        return launch_flash_attn_decode(ctx, t, p.scale, p.softcap);
      if (ctx.act_out_block)  // the plan has its mat-vecs read quantized activations: never f32 as codes
        return CudaError::runtime(cudaErrorInvalidValue,
                                  "flash_attn: quantized activations asked for, but the decode kernel does not run",
                                  __FILE__, __LINE__);
      return launch_flash_attn(ctx, t, p.scale, p.softcap);
    }
    case OpKind::all_reduce:
      return nccl_all_reduce(*t->get_params<AllReduceParams>().comm,
                             static_cast<const float*>(t->src[0]->data), static_cast<float*>(t->data),
                             static_cast<size_t>(t->nelements()), ctx.stream);
    case OpKind::none:
    case OpKind::view:
    case OpKind::count_:
      break;
  }
  return {};
}

size_t scratch_bytes(const Tensor& t, bool fast) {
  if (t.op == OpKind::mul_mat) return mul_mat_scratch_bytes(&t, fast);
  if (use_flash_attn_mma(t, fast)) return flash_attn_mma_scratch_bytes(&t);  // per query tile: visible keys
  if (use_flash_attn_decode(t, fast)) return flash_attn_decode_scratch_bytes(&t);  // the splits' partials
  if (t.op == OpKind::mul_mat_id) return mul_mat_id_scratch_bytes(&t);
  if (t.op == OpKind::top_k) return top_k_scratch_bytes(&t, t.get_params<TopKParams>().k);
  if (t.op == OpKind::sample_tokens) return sample_tokens_scratch_bytes(&t);
  return 0;
}

// Every element type is read by the kernels (load_any in copy.cu, the mat-vec, GEMM and fused
// formats through kernels/quant_dispatch.cuh). Written -- the output of cpy and set_rows, the only
// nodes with a quantized result -- are only the plain types and q8_0, q4_0, q4_K, q6_K: the device
// has no quantizers for q4_1, q5_0, q5_1, q2_K, q3_K, q5_K, iq4_nl, iq4_xs and mxfp4 (a quantized KV
// cache or a conversion into them), so such nodes are reported unsupported and the executor refuses
// them by name instead of a kernel writing garbage.
bool has_store_kernel(DType t) {
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::i32:
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_k:
    case DType::q6_k:
      return true;
    default:
      return false;
  }
}

bool types_supported(const Tensor& node) { return has_store_kernel(node.type); }

bool supports_op_impl(const Tensor& node) {
  if (node.op != OpKind::none && node.op != OpKind::view && !types_supported(node)) return false;
  switch (node.op) {
    case OpKind::none:
    case OpKind::view:
      return true;
    case OpKind::mul_mat:
    case OpKind::mul_mat_id:
      return node.src[0] && node.src[0]->type != DType::i32;
    case OpKind::set_rows:
      return node.type != DType::i32;
    case OpKind::cpy:
      return node.src[0] && (node.src[0]->type == DType::i32) == (node.type == DType::i32);
    case OpKind::concat:
      return !dtype_is_quantized(node.type);
    case OpKind::flash_attn:
      return node.src[0] && node.src[2] && node.src[0]->ne[0] <= kFlashAttnMaxHead &&
             node.src[2]->ne[0] <= kFlashAttnMaxHead &&
             (node.src[1]->type == DType::f32 || node.src[1]->type == DType::f16) &&
             (node.src[2]->type == DType::f32 || node.src[2]->type == DType::f16);
    case OpKind::get_rows:
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::scale:
    case OpKind::rms_norm:
    case OpKind::norm:
    case OpKind::rope:
    case OpKind::soft_max:
    case OpKind::silu:
    case OpKind::gelu:
    case OpKind::gelu_erf:
    case OpKind::swiglu:
    case OpKind::geglu:
    case OpKind::swiglu_oai:
    case OpKind::softcap:
    case OpKind::argmax:
    case OpKind::top_k:
    case OpKind::sample_tokens:
    case OpKind::sum_rows:
      return true;
    case OpKind::all_reduce:  // with an NCCL communicator
      return std::string_view(node.get_params<AllReduceParams>().comm->kind()) == "nccl";
    case OpKind::count_:
      break;
  }
  return false;
}

}  // namespace

// Declared in cuda_ops.h.
CudaError launch_node(const LaunchContext& ctx, const Tensor* node) { return run_node(ctx, node); }
bool cuda_supports_op(const Tensor& node) { return supports_op_impl(node); }

bool batch_invariant() {
  static const bool on = deterministic_from_env();
  return on;
}
size_t node_scratch_bytes(const Tensor& node, bool fast) { return scratch_bytes(node, fast); }

}  // namespace loom::cuda
