// What the CUDA kernels do per graph node (cuda_ops.cpp): the executor (cuda_exec.cpp) plans and
// launches through these.
#pragma once

#include <cstddef>

#include "cuda_error.h"
#include "loom/graph.h"
#include "loom/tensor.h"

namespace loom::cuda {

struct LaunchContext;

/// Launches one node's kernels on ctx.stream (nothing for views).
CudaError launch_node(const LaunchContext& ctx, const Tensor* node);
/// Device scratch bytes launch_node needs for `node` (in the fast numerics mode when `fast`).
size_t node_scratch_bytes(const Tensor& node, bool fast);
/// Whether the CUDA kernels handle this node (op, dtypes, shape).
bool cuda_supports_op(const Tensor& node);
/// The kernel's view of a rope node's parameters (YaRN terms computed once).
struct RopeArgs;
RopeArgs make_rope_args(const ::loom::RopeParams& p);

}  // namespace loom::cuda
