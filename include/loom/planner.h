// Memory planner: places a graph's activations in one arena by liveness.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "loom/backend.h"
#include "loom/graph.h"

namespace loom {

/// Where each node's memory goes in the arena.
struct MemoryPlan {
  static constexpr size_t kNoOffset = static_cast<size_t>(-1);
  std::vector<size_t> offsets;      ///< per node index; kNoOffset for nodes that alias memory
  std::vector<int32_t> in_place_of; ///< per node index: node whose block it reuses in place, or -1
  std::vector<int32_t> first_use;   ///< per node index: node index that defines it
  std::vector<int32_t> last_use;    ///< per node index: last node index that reads it (n for outputs)
  size_t peak_bytes = 0;            ///< arena size
  size_t total_bytes = 0;           ///< sum of all node sizes (what no reuse would need)
  int n_in_place = 0;
};

/// Whether `node` may write its result over its first operand's memory (same size, type and
/// layout; each output element depends only on the same input element or its row's statistics).
bool op_can_run_in_place(const Tensor& node);

/// Plans offsets for every node that owns memory (not views, not writes into other tensors).
/// Blocks are `alignment`-aligned; a block is reused once its last reader has run.
MemoryPlan plan_memory(const Graph& g, size_t alignment);

/// Buffers that hold a graph's tensors.
struct GraphAllocation {
  std::unique_ptr<Buffer> leafs;  ///< leafs that had no memory
  std::unique_ptr<Buffer> arena;  ///< activations
  MemoryPlan plan;
};

/// Allocates leafs without memory and the activation arena in `type`, and sets every tensor's
/// data (views resolved).
Result<GraphAllocation> allocate_graph(Graph& g, BufferType& type);

}  // namespace loom
