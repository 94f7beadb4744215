// The graph executor's switches and counters (loom_exec), as backends with an executor expose them:
// exec::ExecutorControl, reached through Backend::extension. The plan itself (dispatches, ranges,
// passes) is in loom/exec_plan.h.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "loom/status.h"

namespace loom {

class Backend;
class Graph;

/// Kinds of fused dispatch (include/loom/exec_plan.h documents the node roles of each).
enum class FusedKind : uint8_t {
  none,                 ///< one graph node
  rms_norm_mul,         ///< rms_norm(x) * w
  add_rms_norm_mul,     ///< y = a + b; rms_norm(y) * w (y is written too: it is the residual)
  mat_vec_bias,         ///< mul_mat(w, x) + bias
  glu_mat_vec,          ///< swiglu/geglu(mul_mat(w_gate, x), mul_mat(w_up, x))
  rope_set_rows,        ///< rope(k) stored into the KV cache by set_rows (+ rope(q) in the same launch)
  scale_mask_soft_max,  ///< soft_max(scale(x) + mask)
  moe_route,            ///< soft_max -> top_k -> gather weights (-> normalise): ids and weights
  mat_vec_multi,        ///< 2-3 mul_mats of one activation (Q, K, V): one quantization, one kernel
  gather_flash_attn,    ///< flash_attn over K/V rows gathered by get_rows: the rows read in place
  all_reduce_add_rms_norm_mul,  ///< add_rms_norm_mul whose addend is an all_reduce's sum, exchanged in the kernel
  rope_flash_attn,      ///< one token's rope(q), rope(k) and K/V cache stores done by its flash-decoding kernel
  count_,
};
inline constexpr int kFusedKindCount = static_cast<int>(FusedKind::count_);
const char* fused_kind_name(FusedKind k);

/// Which executor techniques are on. Every field defaults to on; `serialize` overrides all of them
/// (one kernel at a time, in graph order, no CUDA graph: the mode for hunting races).
/// Environment: LOOM_EXEC_SERIALIZE=1, LOOM_EXEC_GRAPH=0, LOOM_EXEC_CONCURRENCY=0, LOOM_EXEC_FUSION=0,
/// LOOM_EXEC_REORDER=0, LOOM_EXEC_PDL=0 turn the matching switch (read by exec_options_from_env());
/// LOOM_EXEC_DUMP=PREFIX writes each new plan as PREFIX-N.txt and PREFIX-N.dot, and for each recorded
/// replay graph the kernel each dispatch launches with its grid and block (PREFIX-graph-N.kernels.txt).
struct ExecOptions {
  bool serialize = false;    ///< everything off
  bool graph = true;         ///< record the pass as a CUDA graph and replay it
  bool concurrency = true;   ///< edges only where byte ranges conflict (else a chain)
  bool fusion = true;        ///< fusion pass
  bool reorder = true;       ///< 64-dispatch look-ahead reorder pass
  bool pdl = true;           ///< programmatic dependent launch on single-predecessor chains (Hopper+)
  int n_cb = 1;              ///< chunks a first (non-replayed) pass is submitted in
  int lookahead = 64;        ///< reorder window
};

/// Options with the environment's overrides applied to `base`.
ExecOptions exec_options_from_env(ExecOptions base = {});
/// The executor's cumulative configurations by name, on top of `base` (which supplies n_cb and
/// lookahead): "serialize"; "graph" (a CUDA graph, a chain); "concurrency" (+ edges only where ranges
/// conflict); "fusion"; "reorder"; "all" (+ PDL). Empty for an unknown name. `loom bench --exec` and
/// the executor equivalence test use these.
std::optional<ExecOptions> exec_options_named(std::string_view name, ExecOptions base = {});
/// "serialize, graph, concurrency, fusion, reorder, all".
inline constexpr const char* kExecConfigurationNames = "serialize, graph, concurrency, fusion, reorder, all";

/// "serialize" / "graph+concurrency+fusion+reorder+pdl" etc.
std::string exec_options_string(const ExecOptions& o);

/// What the executor did, summed since the last reset.
struct ExecCounters {
  uint64_t computes = 0;        ///< graph_compute calls
  uint64_t dispatches = 0;      ///< dispatches planned (after fusion)
  uint64_t graph_nodes = 0;     ///< graph nodes with kernels (before fusion)
  uint64_t kernels = 0;         ///< kernel launches (in a replayed graph: its kernel nodes)
  uint64_t edges = 0;           ///< dependency edges after transitive reduction
  uint64_t pdl_edges = 0;       ///< of which programmatic (PDL)
  uint64_t groups = 0;          ///< concurrent groups (dispatches with the same dependency depth)
  std::array<uint64_t, 9> group_hist{};  ///< groups of size 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65-128, >128
  std::array<uint64_t, kFusedKindCount> fusions{};  ///< fused dispatches by kind
  uint64_t reordered = 0;       ///< dispatches moved by the reorder pass
  uint64_t act_handoffs = 0;    ///< dispatches writing the next mat-vecs' quantized activations (CUDA fast)
  uint64_t graph_builds = 0;    ///< executable graphs of whole passes instantiated (for replay)
  uint64_t chunk_graphs = 0;    ///< chunk graphs of a new structure's first run, launched as recorded
  uint64_t graph_updates = 0;   ///< executable graphs updated in place (cudaGraphExecUpdate)
  uint64_t graph_replays = 0;   ///< launches of a cached executable graph
  uint64_t hash_collisions = 0;  ///< lookups whose hash matched a cached pass of another structure (rebuilt)
  uint64_t host_syncs = 0;      ///< host waits on the device
  uint64_t host_ns = 0;         ///< host time inside compute, excluding the final wait on the device
  uint64_t host_hash_ns = 0;    ///< of which hashing the pass's structure (every compute)
  uint64_t host_plan_ns = 0;    ///< of which planning new structures (fusion, ordering, scratch)
  uint64_t host_record_ns = 0;  ///< of which recording them (stream capture, the launches inside it)
  uint64_t host_instantiate_ns = 0;  ///< of which instantiating and updating executable graphs
  /// LOOM_EXEC_GPU_TIME=1 (CUDA; 0 otherwise): device time of the replayed passes, from an event recorded
  /// before each graph launch to one after it (the launch's latency on the device included), so that a
  /// step's wall time splits into this and the host's part (inputs, launch, the wait's wake-up, read-back).
  uint64_t device_ns = 0;
  uint64_t device_timed = 0;  ///< replays timed so
};

/// Human-readable multi-line summary (what `loom run --stats` prints).
std::string exec_counters_string(const ExecCounters& c);
/// Index into ExecCounters::group_hist for a group of `size` dispatches.
int group_hist_bucket(uint64_t size);

namespace exec {

struct Plan;

/// What a backend with a graph executor lets its users switch and read: its extension
/// `backend.extension<exec::ExecutorControl>()` (nullptr on backends without an executor).
class ExecutorControl {
 public:
  static constexpr const char* kExtensionId = "loom.exec.control";
  virtual ~ExecutorControl() = default;

  /// Switches the executor's techniques (takes effect at the next compute).
  virtual void set_options(const ExecOptions& options) = 0;
  virtual ExecOptions options() const = 0;
  /// What the executor did since the last reset_counters().
  virtual ExecCounters counters() const = 0;
  virtual void reset_counters() = 0;
  /// Writes a Chrome-trace JSON of the next compute (per-dispatch device times) to `path`, and the
  /// plan as DOT to `path` + ".dot".
  virtual Status capture_next_compute(const std::string& path) = 0;
  /// `fn(data)` is asked between the chunks of a compute; true aborts it (StatusCode::aborted).
  virtual void set_abort_callback(bool (*fn)(void*), void* data) = 0;
  /// The plan the current options give for `g` (every tensor allocated on this backend; no kernel runs).
  virtual Status plan(const Graph& g, Plan* out) = 0;
};

}  // namespace exec

// ---- the same for any backend: what a backend without an executor does (plain in-order evaluation)

/// Sets the executor's options; nothing on backends without one.
void set_exec_options(Backend& backend, const ExecOptions& options);
/// The executor's options; ExecOptions{} on backends without one.
ExecOptions exec_options(const Backend& backend);
/// The executor's counters since the last reset; zeros on backends without one.
ExecCounters exec_counters(const Backend& backend);
void reset_exec_counters(Backend& backend);
/// ExecutorControl::capture_next_compute; an unsupported error on backends without an executor.
Status capture_next_compute(Backend& backend, const std::string& path);

}  // namespace loom
