// The "cuda" backend as the registry makes it: CudaBackend (a Backend, and an exec::ExecutorControl
// over the graph executor), make_cuda_backend (loom/cuda.h) and the entry point the registry calls
// after loading libloom_cuda.so.
#include <memory>
#include <string>
#include <string_view>

#include "cuda_common.h"
#include "cuda_device.h"
#include "cuda_exec.h"
#include "cuda_nccl.h"
#include "cuda_ops.h"
#include "loom/comm.h"
#include "loom/cuda.h"
#include "loom/exec.h"
#include "loom/exec_plan.h"

namespace loom::cuda {

namespace {

class CudaBackend final : public Backend, public exec::ExecutorControl, public Collectives {
 public:
  CudaBackend(DeviceContext& dev, Numerics numerics) : dev_(dev), exec_(dev, numerics) {}

  const char* name() const override { return "cuda"; }
  Numerics numerics() const override { return exec_.numerics(); }
  BufferType& buffer_type() override { return dev_.buffer_type(); }
  BufferType* host_buffer_type() override {
    Result<BufferType*> t = cuda_host_buffer_type();
    return t.ok() ? *t : nullptr;
  }

  bool supports_op(const Tensor& node) const override { return cuda_supports_op(node); }

  Status compute(const Graph& g) override { return exec_.compute(g); }

  Status synchronize() override {
    std::lock_guard lock(dev_.stream_mutex());
    LOOM_TRY(dev_.make_current());
    LOOM_CUDA_STATUS(cudaStreamSynchronize(dev_.stream()));
    return {};
  }

  Status reset() override { return exec_.reset(); }

  void* extension(std::string_view id) override {
    if (id == exec::ExecutorControl::kExtensionId) return static_cast<exec::ExecutorControl*>(this);
    if (id == Collectives::kExtensionId) return static_cast<Collectives*>(this);
    return nullptr;
  }

  // ---- Collectives: NCCL over the backends' devices (each a "cuda" backend of this library, on a
  // device of its own) ----
  Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(
      std::span<Backend* const> backends) override {
    std::vector<int> devices;
    for (Backend* b : backends) {
      if (std::string_view(b->name()) != "cuda" || !b->extension<Collectives>())
        return make_error(StatusCode::invalid_argument, "cuda collectives: backend {} is not a CUDA backend",
                          b->name());
      const int ordinal = static_cast<CudaBackend*>(b->extension<Collectives>())->dev_.ordinal();
      for (int d : devices)
        if (d == ordinal)
          return make_error(StatusCode::invalid_argument,
                            "cuda collectives: two ranks on device {} (each rank needs a GPU of its own)", d);
      devices.push_back(ordinal);
    }
    return make_nccl_communicators(devices);
  }

  // ---- exec::ExecutorControl ----
  void set_options(const ExecOptions& options) override { exec_.set_options(options); }
  ExecOptions options() const override { return exec_.options(); }
  ExecCounters counters() const override { return exec_.counters(); }
  void reset_counters() override { exec_.reset_counters(); }
  Status capture_next_compute(const std::string& path) override {
    exec_.capture_next(path);
    return {};
  }
  void set_abort_callback(bool (*fn)(void*), void* data) override { exec_.set_abort_callback(fn, data); }
  Status plan(const Graph& g, exec::Plan* out) override {
    Result<exec::Plan> p = exec_.plan(g);
    if (!p.ok()) return p.status();
    *out = std::move(*p);
    return {};
  }

 private:
  DeviceContext& dev_;
  Executor exec_;
};

}  // namespace

}  // namespace loom::cuda

namespace loom {

Result<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options) {
  auto numerics = resolve_numerics(options.numerics, Numerics::fast);
  if (!numerics) return numerics.status();
  Result<cuda::DeviceContext*> dev = cuda::DeviceContext::get(options.device);
  if (!dev.ok()) return dev.status();
  return std::unique_ptr<Backend>(new cuda::CudaBackend(**dev, *numerics));
}

}  // namespace loom

/// Entry point the registry looks up after dlopen(). This library carries its own copy of
/// loom_core, so it must not call its own register_backend (that registry is private to the
/// library); the program passes its register_backend instead.
extern "C" __attribute__((visibility("default"))) void loom_backend_register(
    void (*register_fn)(std::string name, loom::BackendFactory factory)) {
  if (register_fn)
    register_fn("cuda", [](const loom::BackendOptions& o) { return loom::make_cuda_backend(o); });
}
