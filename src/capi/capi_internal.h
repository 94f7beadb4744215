// The structures behind loom.h's context, graph and backend handles (libloom_capi.so only).
#pragma once

#include <memory>
#include <vector>

#include "capi_export.h"
#include "loom/backend.h"
#include "loom/graph.h"

namespace loom::capi {

/// Host memory the context does not allocate per tensor: its arena, seen as a Buffer so tensors
/// placed in it are "allocated" for the backends (the CPU backend then computes in place).
class ArenaBuffer final : public Buffer {
 public:
  ArenaBuffer(void* base, size_t size) : base_(base), size_(size) {}
  void* base() override { return base_; }
  size_t size() const override { return size_; }
  BufferType& type() const override;
  Status write(size_t offset, const void* src, size_t n) override;
  Status read(size_t offset, void* dst, size_t n) const override;
  Status fill(size_t offset, uint8_t value, size_t n) override;

 private:
  void* base_;
  size_t size_;
};

/// Aligns `n` up to a power of two.
inline size_t align_up(size_t n, size_t alignment) { return (n + alignment - 1) & ~(alignment - 1); }

/// Sets a view's (or a write-into-dst node's) memory from its source, sources first.
void resolve_view(Tensor* t);

}  // namespace loom::capi

struct loom_context {
  loom::Graph graph;  ///< every tensor of the context; its status is the context's first error
  std::unique_ptr<loom::capi::ArenaBuffer> arena;  ///< null for no_alloc contexts
  void* owned_memory = nullptr;                    ///< arena memory Loom allocated (freed with it)
  size_t used = 0;
  bool no_alloc = false;
  std::vector<std::unique_ptr<loom_graph>> graphs;
  std::unique_ptr<loom::Backend> cpu_backend;  ///< kept for loom_graph_compute_cpu
  int cpu_threads = 0;

  ~loom_context();
  /// Whether `t` is one of this context's tensors.
  bool owns(const loom::Tensor* t) const;
  /// Records `s` as the context's error (first one wins) and the thread's last error.
  void fail(const loom::Status& s);
};

struct loom_graph {
  loom_context* ctx = nullptr;
  std::vector<loom::Tensor*> nodes;  ///< creation order (topological)
  std::vector<loom::Tensor*> leafs;
};

struct loom_backend {
  std::unique_ptr<loom::Backend> impl;
  int device = 0;
};

namespace loom::capi {

/// Gives a new tensor of `ctx` its memory: a view follows its source; other tensors take the next
/// aligned bytes of the arena (nothing in no_alloc contexts).
Status place_tensor(loom_context* ctx, Tensor* t);

/// Runs `build(graph)` (an op front end or new_tensor) on the context's Graph and places the result.
/// On failure records why: the op's own message even when the context already holds an earlier
/// error (loom::Graph keeps only the first, so the op is re-run on a scratch Graph to learn it).
template <typename F>
loom_tensor* build_in_context(loom_context* ctx, F&& build) {
  const bool was_ok = ctx->graph.status().ok();
  Tensor* t = build(ctx->graph);
  if (!t) {
    Status why = ctx->graph.status();
    if (!was_ok) {
      Graph probe;
      if (!build(probe) && !probe.status().ok()) why = probe.status();
    }
    report(why);
    return nullptr;
  }
  if (Status s = place_tensor(ctx, t); !s.ok()) {
    ctx->fail(s);
    return nullptr;
  }
  return to_c(t);
}

/// Evaluates the graph's nodes on `backend`: resolves views, then hands the backend a loom::Graph
/// holding copies of exactly those nodes (the context's Graph also holds nodes not needed here).
Status compute_graph(Backend& backend, loom_graph* graph);

}  // namespace loom::capi
