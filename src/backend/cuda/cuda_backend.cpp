// The "cuda" backend: maps graph nodes to kernel launchers, runs them in order on the device's
// stream, and registers itself with the loading program's registry.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/copy.cuh"
#include "backend/cuda/kernels/elementwise.cuh"
#include "backend/cuda/kernels/matmul.cuh"
#include "backend/cuda/kernels/norm.cuh"
#include "backend/cuda/kernels/reduce.cuh"
#include "backend/cuda/kernels/rope.cuh"
#include "backend/cuda/kernels/softmax.cuh"
#include "loom/graph.h"

namespace loom::cuda {

namespace {

// YaRN's correction range: the pair index whose wavelength fits `n_rot` turns into the training
// context, n_dims * ln(n_ctx_orig / (n_rot * 2 pi)) / (2 ln base).
double yarn_corr_dim(int n_dims, int n_ctx_orig, double n_rot, double base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

RopeArgs rope_args(const RopeParams& p) {
  RopeArgs a;
  a.n_dims = p.n_dims;
  a.neox = p.mode == RopeMode::neox;
  a.freq_base = p.freq_base;
  a.freq_scale = p.freq_scale;
  a.ext_factor = p.ext_factor;
  a.mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    a.mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);  // YaRN's attention temperature
    a.corr_low = std::max(0.0, std::floor(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    a.corr_high = std::min(static_cast<double>(p.n_dims - 1),
                           std::ceil(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base)));
  }
  return a;
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
      return launch_rope(ctx, t, rope_args(t->get_params<RopeParams>()));
    case OpKind::flash_attn: {
      const auto p = t->get_params<FlashAttnParams>();
      return launch_flash_attn(ctx, t, p.scale, p.softcap);
    }
    case OpKind::none:
    case OpKind::view:
    case OpKind::count_:
      break;
  }
  return {};
}

size_t scratch_bytes(const Tensor& t) {
  if (t.op == OpKind::mul_mat) return mul_mat_scratch_bytes(&t);
  if (t.op == OpKind::mul_mat_id) return mul_mat_id_scratch_bytes(&t);
  return 0;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(DeviceContext& dev)
      : dev_(dev), sync_each_node_(std::getenv("LOOM_CUDA_SYNC_EACH_NODE") != nullptr) {}

  const char* name() const override { return "cuda"; }
  BufferType& buffer_type() override { return dev_.buffer_type(); }

  bool supports_op(const Tensor& node) const override {
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
      case OpKind::softcap:
      case OpKind::argmax:
      case OpKind::top_k:
      case OpKind::sum_rows:
        return true;
      case OpKind::count_:
        break;
    }
    return false;
  }

  Status compute(const Graph& g) override {
    if (!g.status().ok()) return g.status();
    size_t scratch = 0;
    for (const Tensor* t : g.nodes()) {
      if (t->op == OpKind::view) continue;
      if (!supports_op(*t))
        return make_error(StatusCode::unsupported, "cuda: no kernel for {} of {}", op_name(t->op),
                          describe(*t));
      LOOM_TRY(check_memory(*t, *t));
      for (const Tensor* s : t->src)
        if (s) LOOM_TRY(check_memory(*s, *t));
      scratch = std::max(scratch, scratch_bytes(*t));
    }

    std::lock_guard lock(dev_.stream_mutex());
    Result<LaunchContext> ctx = dev_.launch_context(scratch);
    if (!ctx.ok()) return ctx.status();
    for (const Tensor* t : g.nodes()) {
      if (t->op == OpKind::view) continue;
      CudaError e = run_node(*ctx, t);
      if (e.ok() && sync_each_node_) e = sync();
      if (!e.ok()) {
        (void)sync();  // let queued work finish before buffers can be freed
        return to_status(e, fmt::format("node {} {}", op_name(t->op), describe(*t)));
      }
    }
    const CudaError e = sync();
    if (!e.ok())
      return to_status(
          e, fmt::format("while running a graph of {} nodes; set LOOM_CUDA_SYNC_EACH_NODE=1 to find the node",
                         g.nodes().size()));
    return {};
  }

  Status synchronize() override {
    std::lock_guard lock(dev_.stream_mutex());
    LOOM_TRY(dev_.make_current());
    const CudaError e = sync();
    return e.ok() ? Status{} : to_status(e);
  }

 private:
  CudaError sync() const {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(dev_.stream()));
    return {};
  }

  // Every tensor a kernel touches must be in this device's memory.
  Status check_memory(const Tensor& t, const Tensor& node) const {
    if (!t.data || !t.buffer)
      return make_error(StatusCode::invalid_argument, "cuda: tensor {} (used by {}) has no memory",
                        describe(t), op_name(node.op));
    if (&t.buffer->type() != &dev_.buffer_type())
      return make_error(StatusCode::invalid_argument, "cuda: tensor {} (used by {}) is in {} memory, not {}",
                        describe(t), op_name(node.op), t.buffer->type().name(), dev_.buffer_type().name());
    return {};
  }

  DeviceContext& dev_;
  bool sync_each_node_;  // attributes asynchronous faults to their node, at the cost of speed
};

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  Result<DeviceContext*> dev = DeviceContext::get(options.device);
  if (!dev.ok()) return dev.status();
  return std::unique_ptr<Backend>(new CudaBackend(**dev));
}

}  // namespace

// Hooks for the seed C API (cuda_seed_api.cpp), which launches node by node itself so that it can
// check an abort callback and time each node (declared in cuda_common.h).
CudaError launch_node(const LaunchContext& ctx, const Tensor* node) { return run_node(ctx, node); }
size_t node_scratch_bytes(const Tensor& node) { return scratch_bytes(node); }
Result<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  BackendOptions options;
  options.device = device;
  return make_backend(options);
}

}  // namespace loom::cuda

/// Entry point the registry looks up after dlopen(). This library carries its own copy of
/// loom_core, so it must not call its own register_backend (that registry is private to the
/// library); the program passes its register_backend instead.
extern "C" __attribute__((visibility("default"))) void loom_backend_register(
    void (*register_fn)(std::string name, loom::BackendFactory factory)) {
  if (register_fn) register_fn("cuda", loom::cuda::make_backend);
}
