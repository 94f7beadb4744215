// C ABI: graphs (node subsets of a context) and backends.
#include <algorithm>
#include <iterator>
#include <unordered_map>
#include <unordered_set>

#include "capi_internal.h"
#include "loom/cpu.h"

using loom::Graph;
using loom::make_error;
using loom::Status;
using loom::StatusCode;
using loom::Tensor;
using namespace loom::capi;

namespace loom::capi {

Status compute_graph(Backend& backend, loom_graph* graph) {
  for (Tensor* t : graph->nodes) resolve_view(t);
  // Backend::compute takes a whole loom::Graph, and the context's one also holds nodes this graph
  // does not need (other outputs, abandoned attempts). So the backend gets a scratch Graph with a
  // copy of each needed node: the copies keep the originals' memory, operands and parameters, so
  // kernels write the results where the originals' handles read them.
  // Operands and view sources are re-pointed at the copies (leafs stay the originals), so the
  // backend sees one consistent graph. Every node is marked as an output: through the C ABI any
  // tensor may be read after compute, so no executor may drop an intermediate.
  Graph exec;
  std::unordered_map<const Tensor*, Tensor*> copies;
  for (const Tensor* n : graph->nodes) {
    Tensor* copy = exec.add_node(n->op, n->type, n->ne, {});
    const int32_t index = copy->index;
    *copy = *n;
    copy->index = index;
    copy->flags |= loom::kTensorOutput;
    for (Tensor*& s : copy->src) {
      auto it = s ? copies.find(s) : copies.end();
      if (it != copies.end()) s = it->second;
    }
    if (copy->view_src) {
      auto it = copies.find(copy->view_src);
      if (it != copies.end()) copy->view_src = it->second;
    }
    copies.emplace(n, copy);
  }
  return backend.compute(exec);
}

}  // namespace loom::capi

namespace {

Status null_arg(const char* fn, const char* what) {
  return make_error(StatusCode::invalid_argument, "{}: {} is NULL", fn, what);
}

// Adds `root` and what it depends on to `graph`, keeping creation order.
Status expand(loom_graph* graph, Tensor* root) {
  loom_context* ctx = graph->ctx;
  if (!ctx->owns(root))
    return make_error(StatusCode::invalid_argument,
                      "loom_graph_build_forward_expand: tensor {} does not belong to the graph's context",
                      describe(*root));
  std::unordered_set<const Tensor*> seen(graph->nodes.begin(), graph->nodes.end());
  seen.insert(graph->leafs.begin(), graph->leafs.end());
  std::vector<Tensor*> new_nodes, new_leafs, stack{root};
  while (!stack.empty()) {
    Tensor* t = stack.back();
    stack.pop_back();
    if (!seen.insert(t).second) continue;
    if (!ctx->owns(t))
      return make_error(
          StatusCode::invalid_argument,
          "loom_graph_build_forward_expand: tensor {} (an operand of the graph) belongs to another "
          "context",
          describe(*t));
    (t->is_leaf() ? new_leafs : new_nodes).push_back(t);
    for (Tensor* s : t->src)
      if (s) stack.push_back(s);
    if (t->view_src) stack.push_back(t->view_src);
  }
  // Node indices are creation positions in the context's Graph, a topological order. Keeping it
  // (rather than the search order) also keeps a write into a tensor (set_rows, cpy) before the
  // nodes created after it, as the C++ API evaluates them.
  auto by_index = [](const Tensor* a, const Tensor* b) { return a->index < b->index; };
  for (auto* list : {&new_nodes, &new_leafs}) std::sort(list->begin(), list->end(), by_index);
  auto merge = [&](std::vector<Tensor*>& into, const std::vector<Tensor*>& add) {
    std::vector<Tensor*> merged;
    merged.reserve(into.size() + add.size());
    std::merge(into.begin(), into.end(), add.begin(), add.end(), std::back_inserter(merged), by_index);
    into = std::move(merged);
  };
  merge(graph->nodes, new_nodes);
  merge(graph->leafs, new_leafs);
  return {};
}

Tensor* at_index(const std::vector<Tensor*>& list, int i) {
  const int n = static_cast<int>(list.size());
  if (i < 0) i += n;
  return i >= 0 && i < n ? list[static_cast<size_t>(i)] : nullptr;
}

}  // namespace

extern "C" {

// ---- graphs --------------------------------------------------------------------------------------------

LOOM_API loom_graph* loom_graph_new(loom_context* ctx) {
  return guard_value<loom_graph*>("loom_graph_new", nullptr, [&]() -> loom_graph* {
    if (!ctx) {
      report(null_arg("loom_graph_new", "context"));
      return nullptr;
    }
    auto graph = std::make_unique<loom_graph>();
    graph->ctx = ctx;
    ctx->graphs.push_back(std::move(graph));
    return ctx->graphs.back().get();
  });
}

LOOM_API loom_status loom_graph_build_forward_expand(loom_graph* graph, loom_tensor* t) {
  return guard_status("loom_graph_build_forward_expand", [&]() -> Status {
    if (!graph || !t) {
      Status s = null_arg("loom_graph_build_forward_expand", !graph ? "graph" : "tensor");
      if (graph && !graph->ctx->graph.status().ok())  // the NULL is most likely a failed op's result
        s = make_error(StatusCode::invalid_argument, "{}; the context's first error: {}", s.message(),
                       graph->ctx->graph.status().message());
      return s;
    }
    return expand(graph, to_cpp(t));
  });
}

LOOM_API loom_graph* loom_graph_build(loom_context* ctx, loom_tensor* output) {
  loom_graph* graph = loom_graph_new(ctx);
  if (!graph) return nullptr;
  if (loom_graph_build_forward_expand(graph, output) != LOOM_STATUS_OK) {
    loom_graph_free(graph);
    return nullptr;
  }
  return graph;
}

LOOM_API void loom_graph_free(loom_graph* graph) {
  if (!graph) return;
  auto& graphs = graph->ctx->graphs;
  graphs.erase(std::remove_if(graphs.begin(), graphs.end(), [&](const auto& g) { return g.get() == graph; }),
               graphs.end());
}

LOOM_API int loom_graph_n_nodes(const loom_graph* graph) {
  return graph ? static_cast<int>(graph->nodes.size()) : 0;
}

LOOM_API loom_tensor* loom_graph_node(const loom_graph* graph, int i) {
  return graph ? to_c(at_index(graph->nodes, i)) : nullptr;
}

LOOM_API int loom_graph_n_leafs(const loom_graph* graph) {
  return graph ? static_cast<int>(graph->leafs.size()) : 0;
}

LOOM_API loom_tensor* loom_graph_leaf(const loom_graph* graph, int i) {
  return graph ? to_c(at_index(graph->leafs, i)) : nullptr;
}

LOOM_API loom_status loom_graph_compute_cpu(loom_graph* graph, int n_threads) {
  return guard_status("loom_graph_compute_cpu", [&]() -> Status {
    if (!graph) return null_arg("loom_graph_compute_cpu", "graph");
    loom_context* ctx = graph->ctx;
    if (!ctx->cpu_backend || ctx->cpu_threads != n_threads) {
      ctx->cpu_backend = loom::make_cpu_backend(n_threads);
      ctx->cpu_threads = n_threads;
    }
    return compute_graph(*ctx->cpu_backend, graph);
  });
}

// ---- backends ------------------------------------------------------------------------------------------

LOOM_API loom_backend* loom_backend_cpu_init(int n_threads) {
  return guard_value<loom_backend*>("loom_backend_cpu_init", nullptr, [&] {
    auto backend = std::make_unique<loom_backend>();
    backend->impl = loom::make_cpu_backend(n_threads);
    return backend.release();
  });
}

LOOM_API loom_backend* loom_backend_init_by_name(const char* name, int device, int n_threads) {
  return loom_backend_init_ex(name, device, n_threads, LOOM_NUMERICS_DEFAULT);
}

LOOM_API loom_backend* loom_backend_init_ex(const char* name, int device, int n_threads, loom_numerics numerics) {
  return guard_value<loom_backend*>("loom_backend_init_ex", nullptr, [&]() -> loom_backend* {
    if (!name) {
      report(null_arg("loom_backend_init_ex", "name"));
      return nullptr;
    }
    loom::BackendOptions options;
    options.device = device;
    options.n_threads = n_threads;
    if (numerics == LOOM_NUMERICS_EXACT) {
      options.numerics = loom::Numerics::exact;
    } else if (numerics == LOOM_NUMERICS_FAST) {
      options.numerics = loom::Numerics::fast;
    } else if (numerics != LOOM_NUMERICS_DEFAULT) {
      report(loom::make_error(loom::StatusCode::invalid_argument, "loom_backend_init_ex: numerics {} is not a mode",
                              static_cast<int>(numerics)));
      return nullptr;
    }
    auto impl = loom::create_backend(name, options);
    if (!impl.ok()) {
      report(impl.status());
      return nullptr;
    }
    auto backend = std::make_unique<loom_backend>();
    backend->impl = std::move(*impl);
    backend->device = device;
    return backend.release();
  });
}

LOOM_API void loom_backend_free(loom_backend* backend) { delete backend; }

LOOM_API loom_numerics loom_backend_numerics(const loom_backend* backend) {
  if (!backend) return LOOM_NUMERICS_DEFAULT;
  return backend->impl->numerics() == loom::Numerics::fast ? LOOM_NUMERICS_FAST : LOOM_NUMERICS_EXACT;
}

LOOM_API const char* loom_backend_name(const loom_backend* backend) {
  return backend ? backend->impl->name() : "";
}

LOOM_API int loom_backend_device(const loom_backend* backend) { return backend ? backend->device : 0; }

LOOM_API loom_buffer_type* loom_backend_get_buffer_type(loom_backend* backend) {
  return backend ? to_c(&backend->impl->buffer_type()) : nullptr;
}

LOOM_API bool loom_backend_supports_op(const loom_backend* backend, const loom_tensor* node) {
  return guard_value<bool>("loom_backend_supports_op", false,
                           [&] { return backend && node && backend->impl->supports_op(*to_cpp(node)); });
}

LOOM_API loom_status loom_backend_graph_compute(loom_backend* backend, loom_graph* graph) {
  return guard_status("loom_backend_graph_compute", [&]() -> Status {
    if (!backend || !graph) return null_arg("loom_backend_graph_compute", !backend ? "backend" : "graph");
    return compute_graph(*backend->impl, graph);
  });
}

LOOM_API loom_status loom_backend_synchronize(loom_backend* backend) {
  return guard_status("loom_backend_synchronize", [&]() -> Status {
    if (!backend) return null_arg("loom_backend_synchronize", "backend");
    return backend->impl->synchronize();
  });
}

}  // extern "C"
