// include/loom-cuda.h: the seed's Metal interface on CUDA (libloom_capi_cuda.so). Host ranges are
// mapped to device copies; a graph built on host memory is computed on the device by translating
// each tensor's host address into its range's device copy. Like loom.h it sits on top of the C++
// API: the backend comes from loom/cuda.h, its executor through exec::ExecutorControl.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "capi_export.h"
#include "loom-cuda.h"
#include "loom/cuda.h"
#include "loom/exec.h"
#include "loom/exec_plan.h"
#include "loom/graph.h"

using loom::Buffer;
using loom::make_error;
using loom::Status;
using loom::StatusCode;
using loom::Tensor;
using loom::capi::guard_status;
using loom::capi::guard_value;
using loom::capi::report;
using loom::capi::to_c;
using loom::capi::to_cpp;

namespace loom::capi {
namespace {

// ---- logging ----------------------------------------------------------------------------------------

struct LogSink {
  std::mutex mutex;
  loom_log_callback callback = nullptr;
  void* user_data = nullptr;
};

LogSink& log_sink() {
  static LogSink sink;
  return sink;
}

template <typename... Args>
void log(loom_log_level level, fmt::format_string<Args...> f, Args&&... args) {
  const std::string text = fmt::format(f, std::forward<Args>(args)...);
  LogSink& sink = log_sink();
  std::lock_guard lock(sink.mutex);
  if (sink.callback)
    sink.callback(level, text.c_str(), sink.user_data);
  else if (level >= LOOM_LOG_WARN)
    std::fprintf(stderr, "loom-cuda: %s\n", text.c_str());
}

/// Records `s` as the last error, logs it, and returns its code.
loom_status fail(const Status& s) {
  log(LOOM_LOG_ERROR, "{}", s.message());
  return report(s);
}

// ---- mapped host ranges ---------------------------------------------------------------------------------

/// A host range and its device copy (loom_cuda_add_buffer).
struct MappedRange {
  std::string name;
  const uint8_t* host = nullptr;
  size_t size = 0;
  size_t max_size = 0;
  std::unique_ptr<Buffer> device;

  bool contains(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= host && b <= host + size && n <= static_cast<size_t>(host + size - b);
  }
  uint8_t* device_address(const void* p) const {
    return static_cast<uint8_t*>(device->base()) + (static_cast<const uint8_t*>(p) - host);
  }
};

std::string mib(size_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace
}  // namespace loom::capi

using namespace loom::capi;

struct loom_cuda_context {
  int device = 0;
  loom::BufferType* device_memory = nullptr;  // where mapped ranges get their device copies
  int n_cb = 1;
  std::unique_ptr<loom::Backend> backend;  // answers supports_op for the nodes we launch
  std::vector<MappedRange> ranges;
  std::vector<int> concur_list;
  bool optimized = false;
  loom_abort_callback abort_callback = nullptr;
  void* abort_user_data = nullptr;
  std::string capture_path;  // trace the next compute into this file

  const MappedRange* find(const void* p, size_t n) const {
    for (const MappedRange& r : ranges)
      if (r.contains(p, n)) return &r;
    return nullptr;
  }
  std::string mapped_list() const {
    if (ranges.empty()) return "no range is mapped";
    std::string s = "mapped:";
    for (const MappedRange& r : ranges)
      s += fmt::format(" '{}' [{}, {})", r.name, fmt::ptr(r.host), fmt::ptr(r.host + r.size));
    return s;
  }
};

namespace {

Status null_arg(const char* fn, const char* what) {
  return make_error(StatusCode::invalid_argument, "{}: {} is NULL", fn, what);
}

Status check_n_cb(const char* fn, int n_cb) {
  if (n_cb < 1 || n_cb > LOOM_CUDA_MAX_COMMAND_BUFFERS)
    return make_error(StatusCode::invalid_argument, "{}: n_cb {} is not in [1, {}]", fn, n_cb,
                      LOOM_CUDA_MAX_COMMAND_BUFFERS);
  return {};
}

// The range holding a tensor's host bytes, or an error naming the tensor.
loom::Result<const MappedRange*> range_of(const loom_cuda_context& ctx, const Tensor& t, const char* fn) {
  if (!t.data)
    return make_error(StatusCode::invalid_argument, "{}: tensor {} has no host memory", fn, describe(t));
  const MappedRange* r = ctx.find(t.data, t.nbytes());
  if (!r)
    return make_error(StatusCode::invalid_argument,
                      "{}: tensor {} (host bytes [{}, +{})) is not inside any range mapped with "
                      "loom_cuda_add_buffer ({})",
                      fn, describe(t), t.data, t.nbytes(), ctx.mapped_list());
  return r;
}

// Copies a tensor's elements between host and device copy, as the fewest contiguous runs.
Status copy_tensor(loom_cuda_context& ctx, loom_tensor* tc, bool to_device, const char* fn) {
  if (!tc) return null_arg(fn, "tensor");
  (void)loom_tensor_data(tc);  // a view's address follows its source (resolved by loom.h)
  const Tensor& t = *to_cpp(tc);
  auto range = range_of(ctx, t, fn);
  if (!range.ok()) return range.status();
  uint8_t* host = static_cast<uint8_t*>(t.data);
  Buffer& device = *(*range)->device;
  const size_t at = static_cast<size_t>(host - (*range)->host);  // the tensor's offset in the copy
  // Buffer::write/read wait for their copy, so the host bytes are final when this returns.
  auto copy = [&](size_t offset, size_t n) -> Status {
    return to_device ? device.write(at + offset, host + offset, n) : device.read(at + offset, host + offset, n);
  };
  if (t.is_contiguous()) {
    LOOM_TRY(copy(0, t.nbytes()));
  } else {
    // Gaps belong to other tensors: copy rows (or single blocks, for transposed views) only.
    const bool rows = t.rows_contiguous();
    const int64_t n0 = rows ? 1 : t.ne[0] / loom::dtype_block_size(t.type);
    const size_t run = rows ? t.row_size() : loom::dtype_type_size(t.type);
    for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
          for (int64_t b = 0; b < n0; ++b)
            LOOM_TRY(copy(b * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3], run));
  }
  return {};
}

// The graph's tensors with device addresses: copies of the nodes and leafs in a scratch Graph,
// operands pointing at the copies.
struct DeviceGraph {
  loom::Graph graph;
  std::vector<Tensor*> nodes;  // copies, in the graph's node order
};

Status translate(const loom_cuda_context& ctx, loom_graph* graph, DeviceGraph& out) {
  const char* fn = "loom_cuda_graph_compute";
  std::unordered_map<const Tensor*, Tensor*> copies;
  auto copy_of = [&](Tensor* original, Tensor* copy) -> Status {
    const int32_t index = copy->index;
    *copy = *original;
    copy->index = index;
    for (Tensor*& s : copy->src) {
      if (!s) continue;
      auto it = copies.find(s);
      if (it == copies.end())
        return make_error(StatusCode::internal, "{}: operand {} of {} is not in the graph", fn, describe(*s),
                          describe(*original));
      s = it->second;
    }
    if (original->view_src) {
      // Views (and writes into another tensor) sit at an offset of their source's device copy.
      auto it = copies.find(original->view_src);
      if (it == copies.end())
        return make_error(StatusCode::internal, "{}: source of view {} is not in the graph", fn,
                          describe(*original));
      copy->view_src = it->second;
      copy->buffer = it->second->buffer;
      copy->data = static_cast<uint8_t*>(it->second->data) + original->view_offset;
    } else {
      auto range = range_of(ctx, *original, fn);
      if (!range.ok()) return range.status();
      copy->buffer = (*range)->device.get();
      copy->data = (*range)->device_address(original->data);
    }
    copies.emplace(original, copy);
    return {};
  };
  const int n_leafs = loom_graph_n_leafs(graph);
  for (int i = 0; i < n_leafs; ++i) {
    Tensor* leaf = to_cpp(loom_graph_leaf(graph, i));
    Tensor* copy = out.graph.new_tensor(leaf->type, leaf->ne);
    LOOM_ASSERT(copy);  // the shape was valid when the leaf was made
    LOOM_TRY(copy_of(leaf, copy));
  }
  const int n_nodes = loom_graph_n_nodes(graph);
  for (int i = 0; i < n_nodes; ++i) {
    Tensor* node = to_cpp(loom_graph_node(graph, i));
    Tensor* copy = out.graph.add_node(node->op, node->type, node->ne, {});
    LOOM_TRY(copy_of(node, copy));
    // get_tensor may read any node afterwards: the executor must not drop intermediates
    copy->flags |= loom::kTensorOutput;
    out.nodes.push_back(copy);
  }
  return {};
}

// The C graph as device tensors, run through the backend's graph executor: plan, fusion, CUDA graph
// replay, abort callback between chunks, trace capture.
Status compute(loom_cuda_context& ctx, loom_graph* graph) {
  DeviceGraph dg;
  LOOM_TRY(translate(ctx, graph, dg));
  auto* ex = ctx.backend->extension<loom::exec::ExecutorControl>();
  LOOM_ASSERT(ex != nullptr);
  loom::ExecOptions o = ex->options();
  o.n_cb = ctx.n_cb;
  ex->set_options(o);
  ex->set_abort_callback(ctx.abort_callback, ctx.abort_user_data);
  if (!ctx.capture_path.empty()) {
    LOOM_TRY(ex->capture_next_compute(ctx.capture_path));
    log(LOOM_LOG_INFO, "loom_cuda_graph_compute: tracing this compute into '{}' (and its plan into '{}.dot')",
        ctx.capture_path, ctx.capture_path);
    ctx.capture_path.clear();
  }
  return ctx.backend->compute(dg.graph);
}

// The executor's plan as the seed's concurrency list: node indices level by level (dispatches
// whose dependencies are all in earlier levels), -1 between levels; a fused dispatch lists its nodes.
Status find_concurrency(loom_cuda_context& ctx, loom_graph* graph) {
  DeviceGraph dg;
  LOOM_TRY(translate(ctx, graph, dg));
  auto* ex = ctx.backend->extension<loom::exec::ExecutorControl>();
  LOOM_ASSERT(ex != nullptr);
  loom::exec::Plan plan_storage;
  LOOM_TRY(ex->plan(dg.graph, &plan_storage));
  const loom::exec::Plan* plan = &plan_storage;
  std::vector<size_t> order(plan->dispatches.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan->dispatches[a].depth < plan->dispatches[b].depth;
  });
  ctx.concur_list.clear();
  int depth = -1;
  for (size_t i : order) {
    const loom::exec::Dispatch& d = plan->dispatches[i];
    if (depth >= 0 && d.depth != depth) ctx.concur_list.push_back(-1);
    depth = d.depth;
    for (const Tensor* t : d.nodes)
      if (t) ctx.concur_list.push_back(t->index);
  }
  ctx.optimized = true;
  log(LOOM_LOG_DEBUG, "loom_cuda_graph_find_concurrency: {} dispatches in {} levels", plan->dispatches.size(),
      plan->stats.groups);
  return {};
}

}  // namespace

extern "C" {

// ---- the seed interface -----------------------------------------------------------------------------------

LOOM_API void loom_cuda_log_set_callback(loom_log_callback callback, void* user_data) {
  LogSink& sink = log_sink();
  std::lock_guard lock(sink.mutex);
  sink.callback = callback;
  sink.user_data = user_data;
}

LOOM_API loom_cuda_context* loom_cuda_init_device(int device, int n_cb) {
  return guard_value<loom_cuda_context*>("loom_cuda_init", nullptr, [&]() -> loom_cuda_context* {
    if (Status s = check_n_cb("loom_cuda_init", n_cb); !s.ok()) {
      fail(s);
      return nullptr;
    }
    auto info = loom::cuda_device_info(device);
    auto memory = info.ok() ? loom::cuda_buffer_type(device) : loom::Result<loom::BufferType*>(info.status());
    if (!memory.ok()) {
      fail(make_error(memory.status().code(), "loom_cuda_init: {}", memory.status().message()));
      return nullptr;
    }
    loom::BackendOptions options;
    options.device = device;
    auto backend = loom::make_cuda_backend(options);
    if (!backend.ok()) {
      fail(backend.status());
      return nullptr;
    }
    auto ctx = std::make_unique<loom_cuda_context>();
    ctx->device = device;
    ctx->device_memory = *memory;
    ctx->n_cb = n_cb;
    ctx->backend = std::move(*backend);
    log(LOOM_LOG_INFO, "loom_cuda_init: device {}: {}, compute capability {}.{}, {} SMs, {} of memory",
        device, info->name, info->cc_major, info->cc_minor, info->sm_count, mib(info->total_bytes));
    return ctx.release();
  });
}

LOOM_API loom_cuda_context* loom_cuda_init(int n_cb) { return loom_cuda_init_device(0, n_cb); }

LOOM_API void loom_cuda_free(loom_cuda_context* ctx) {
  if (!ctx) return;
  // Computes and copies synchronize before returning, but wait anyway: the device copies go back
  // to the device's cache for reuse, and no queued kernel may still use them.
  try {
    (void)ctx->backend->synchronize();
  } catch (...) {
  }
  delete ctx;
}

LOOM_API void* loom_cuda_host_malloc(size_t n) {
  return guard_value<void*>("loom_cuda_host_malloc", nullptr, [&]() -> void* {
    auto type = loom::cuda_host_buffer_type();  // checks for a driver and a device
    if (!type.ok()) {
      fail(make_error(type.status().code(), "loom_cuda_host_malloc: {}", type.status().message()));
      return nullptr;
    }
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, std::max<size_t>(n, 1), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      fail(make_error(err == cudaErrorMemoryAllocation ? StatusCode::out_of_memory : StatusCode::device_error,
                      "loom_cuda_host_malloc: cudaHostAlloc of {} bytes failed: {}", n,
                      cudaGetErrorString(err)));
      return nullptr;
    }
    return p;
  });
}

LOOM_API void loom_cuda_host_free(void* data) {
  if (data && cudaFreeHost(data) != cudaSuccess) {
    (void)cudaGetLastError();
    report(make_error(StatusCode::invalid_argument,
                      "loom_cuda_host_free: {} is not from loom_cuda_host_malloc", data));
  }
}

LOOM_API loom_status loom_cuda_set_n_cb(loom_cuda_context* ctx, int n_cb) {
  return guard_status("loom_cuda_set_n_cb", [&]() -> Status {
    if (!ctx) return null_arg("loom_cuda_set_n_cb", "context");
    LOOM_TRY(check_n_cb("loom_cuda_set_n_cb", n_cb));
    ctx->n_cb = n_cb;
    return {};
  });
}

LOOM_API int loom_cuda_get_n_cb(const loom_cuda_context* ctx) { return ctx ? ctx->n_cb : 0; }

LOOM_API loom_status loom_cuda_add_buffer(loom_cuda_context* ctx, const char* name, void* data, size_t size,
                                          size_t max_size) {
  const char* fn = "loom_cuda_add_buffer";
  const loom_status st = guard_status(fn, [&]() -> Status {
    if (!ctx) return null_arg(fn, "context");
    if (!name || !*name) return make_error(StatusCode::invalid_argument, "{}: the range needs a name", fn);
    if (!data) return make_error(StatusCode::invalid_argument, "{}: range '{}': data is NULL", fn, name);
    if (size == 0) return make_error(StatusCode::invalid_argument, "{}: range '{}' is empty", fn, name);
    if (max_size > size)
      return make_error(StatusCode::invalid_argument, "{}: range '{}': max_size {} exceeds its size {}", fn,
                        name, max_size, size);
    const auto* host = static_cast<const uint8_t*>(data);
    if (reinterpret_cast<uintptr_t>(host) > UINTPTR_MAX - size)
      return make_error(StatusCode::invalid_argument, "{}: range '{}' wraps around the address space", fn,
                        name);
    if (ctx->ranges.size() >= LOOM_CUDA_MAX_BUFFERS)
      return make_error(StatusCode::invalid_argument,
                        "{}: range '{}': already {} ranges mapped, the most allowed", fn, name,
                        ctx->ranges.size());
    for (const MappedRange& r : ctx->ranges) {
      if (r.name == name)
        return make_error(StatusCode::invalid_argument, "{}: a range named '{}' is already mapped", fn, name);
      if (host < r.host + r.size && r.host < host + size)
        return make_error(StatusCode::invalid_argument,
                          "{}: range '{}' [{}, {}) overlaps range '{}' [{}, {})", fn, name, data,
                          fmt::ptr(host + size), r.name, fmt::ptr(r.host), fmt::ptr(r.host + r.size));
    }
    auto device = ctx->device_memory->allocate(size);
    if (!device.ok())
      return make_error(device.status().code(), "{}: range '{}': {}", fn, name, device.status().message());
    LOOM_TRY((*device)->write(0, data, size));
    MappedRange range;
    range.name = name;
    range.host = host;
    range.size = size;
    range.max_size = max_size;
    range.device = std::move(*device);
    log(LOOM_LOG_INFO, "{}: '{}': {} at host {} -> device {}", fn, name, mib(size), data,
        range.device->base());
    ctx->ranges.push_back(std::move(range));
    return {};
  });
  if (st != LOOM_STATUS_OK) log(LOOM_LOG_ERROR, "{}", loom_last_error());
  return st;
}

LOOM_API loom_status loom_cuda_set_tensor(loom_cuda_context* ctx, loom_tensor* t) {
  return guard_status("loom_cuda_set_tensor", [&]() -> Status {
    if (!ctx) return null_arg("loom_cuda_set_tensor", "context");
    return copy_tensor(*ctx, t, true, "loom_cuda_set_tensor");
  });
}

LOOM_API loom_status loom_cuda_get_tensor(loom_cuda_context* ctx, loom_tensor* t) {
  return guard_status("loom_cuda_get_tensor", [&]() -> Status {
    if (!ctx) return null_arg("loom_cuda_get_tensor", "context");
    return copy_tensor(*ctx, t, false, "loom_cuda_get_tensor");
  });
}

LOOM_API loom_status loom_cuda_graph_find_concurrency(loom_cuda_context* ctx, loom_graph* graph,
                                                      bool check_mem) {
  return guard_status("loom_cuda_graph_find_concurrency", [&]() -> Status {
    if (!ctx || !graph) return null_arg("loom_cuda_graph_find_concurrency", !ctx ? "context" : "graph");
    (void)check_mem;
    return find_concurrency(*ctx, graph);
  });
}

LOOM_API int loom_cuda_if_optimized(const loom_cuda_context* ctx) {
  return ctx && ctx->optimized ? static_cast<int>(ctx->concur_list.size()) : 0;
}

LOOM_API int* loom_cuda_get_concur_list(loom_cuda_context* ctx) {
  return ctx && ctx->optimized ? ctx->concur_list.data() : nullptr;
}

LOOM_API loom_status loom_cuda_graph_compute(loom_cuda_context* ctx, loom_graph* graph) {
  const loom_status st = guard_status("loom_cuda_graph_compute", [&]() -> Status {
    if (!ctx || !graph) return null_arg("loom_cuda_graph_compute", !ctx ? "context" : "graph");
    return compute(*ctx, graph);
  });
  if (st != LOOM_STATUS_OK && st != LOOM_STATUS_ABORTED) log(LOOM_LOG_ERROR, "{}", loom_last_error());
  return st;
}

// ---- Loom's additions -------------------------------------------------------------------------------------

LOOM_API void loom_cuda_set_abort_callback(loom_cuda_context* ctx, loom_abort_callback callback,
                                           void* user_data) {
  if (!ctx) {
    report(null_arg("loom_cuda_set_abort_callback", "context"));
    return;
  }
  ctx->abort_callback = callback;
  ctx->abort_user_data = user_data;
}

LOOM_API loom_status loom_cuda_capture_next_compute(loom_cuda_context* ctx, const char* path) {
  return guard_status("loom_cuda_capture_next_compute", [&]() -> Status {
    if (!ctx) return null_arg("loom_cuda_capture_next_compute", "context");
    ctx->capture_path = path ? path : "";
    return {};
  });
}

LOOM_API int loom_cuda_context_device(const loom_cuda_context* ctx) { return ctx ? ctx->device : -1; }

// ---- backend interface ------------------------------------------------------------------------------------

LOOM_API loom_backend* loom_backend_cuda_init(int device) {
  // Through the program's registry (loom.h), which loads this library's "cuda" factory, so the
  // handle is an ordinary loom.h backend.
  return loom_backend_init_by_name("cuda", device, 0);
}

LOOM_API bool loom_backend_is_cuda(const loom_backend* backend) {
  return backend && std::strcmp(loom_backend_name(backend), "cuda") == 0;
}

LOOM_API loom_status loom_backend_cuda_set_n_cb(loom_backend* backend, int n_cb) {
  return guard_status("loom_backend_cuda_set_n_cb", [&]() -> Status {
    if (!loom_backend_is_cuda(backend))
      return make_error(StatusCode::invalid_argument, "loom_backend_cuda_set_n_cb: not a CUDA backend");
    return check_n_cb("loom_backend_cuda_set_n_cb", n_cb);
  });
}

LOOM_API loom_buffer_type* loom_backend_cuda_buffer_type(int device) {
  return guard_value<loom_buffer_type*>("loom_backend_cuda_buffer_type", nullptr, [&]() -> loom_buffer_type* {
    auto type = loom::cuda_buffer_type(device);
    if (!type.ok()) {
      report(type.status());
      return nullptr;
    }
    return to_c(*type);
  });
}

LOOM_API loom_buffer_type* loom_backend_cuda_host_buffer_type(void) {
  return guard_value<loom_buffer_type*>("loom_backend_cuda_host_buffer_type", nullptr,
                                        [&]() -> loom_buffer_type* {
                                          auto type = loom::cuda_host_buffer_type();
                                          if (!type.ok()) {
                                            report(type.status());
                                            return nullptr;
                                          }
                                          return to_c(*type);
                                        });
}

LOOM_API loom_buffer* loom_backend_cuda_buffer_from_ptr(void* data, size_t size) {
  const char* fn = "loom_backend_cuda_buffer_from_ptr";
  return guard_value<loom_buffer*>(fn, nullptr, [&]() -> loom_buffer* {
    if (!data) {
      report(null_arg(fn, "data"));
      return nullptr;
    }
    auto buffer = loom::cuda_buffer_from_device_memory(data, size);
    if (!buffer.ok()) {
      report(make_error(buffer.status().code(), "{}: {}", fn, buffer.status().message()));
      return nullptr;
    }
    return to_c(buffer->release());
  });
}

LOOM_API bool loom_backend_cuda_supports_arch(const loom_backend* backend, int compute_capability) {
  return guard_value<bool>("loom_backend_cuda_supports_arch", false, [&] {
    if (!loom_backend_is_cuda(backend)) return false;
    auto info = loom::cuda_device_info(loom_backend_device(backend));
    if (!info.ok()) {
      report(info.status());
      return false;
    }
    return info->cc_major * 10 + info->cc_minor >= compute_capability;
  });
}

}  // extern "C"
