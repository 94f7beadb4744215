// The CUDA graph executor: plans a graph (src/exec: fusion, reorder, dependencies), records it as
// a CUDA graph with one kernel node per dispatch and edges only where byte ranges conflict
// (programmatic dependent launch on single-predecessor chains), caches the executable graph by a
// structure key of the pass (structure_key: its hash finds the entry, its words confirm it) and
// replays it while the structure stays the same.
//
// A pass whose structure is new is launched eagerly, dispatch by dispatch (LOOM_EXEC_FIRST_EAGER=0:
// the way the seeds submit, its first max(64, 10%) dispatches as one graph launched as soon as it is
// recorded, the rest in n_cb more chunks, each launched when recorded); the second time it is seen,
// the whole pass is recorded as a single graph, instantiated and cached for replay.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "cuda_device.h"
#include "loom/exec_graph_cache.h"
#include "loom/exec_plan.h"
#include "loom/exec.h"

namespace loom::cuda {

class Executor {
 public:
  Executor(DeviceContext& dev, Numerics numerics);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Runs `g` (every node supported, every tensor in this device's memory) and waits for it.
  /// After a failed launch or sync every later call fails until reset().
  Status compute(const Graph& g);
  /// Clears the error state and the graph cache.
  Status reset();

  void set_options(const ExecOptions& o) { options_ = o; }
  const ExecOptions& options() const { return options_; }
  const ExecCounters& counters() const { return counters_; }
  Numerics numerics() const { return numerics_; }
  void reset_counters() { counters_ = {}; }
  void set_abort_callback(bool (*fn)(void*), void* data) {
    abort_fn_ = fn;
    abort_data_ = data;
  }
  /// The next compute runs dispatch by dispatch with events and writes a Chrome trace to `path`
  /// and the plan's DOT to `path`.dot.
  void capture_next(std::string path) { trace_path_ = std::move(path); }
  /// The plan the current options give for `g` (no kernels run): for find_concurrency.
  Result<exec::Plan> plan(const Graph& g);

 private:
  struct Cached {
    cudaGraphExec_t exec = nullptr;
    uint64_t kernels = 0;
    uint64_t dispatches = 0;
    uint64_t pdl_edges = 0;
    exec::PlanStats stats;
    bool clusters = false;  ///< a kernel node launched as thread-block clusters (never updated in place)
  };
  Status compute_locked(const Graph& g, uint64_t t0);
  Status validate(const Graph& g) const;
  Result<exec::Plan> make_plan(const Graph& g, const ExecOptions& o);
  // Scratch of at least `shared_bytes` (one region) then `n_slots` slots of `slot_bytes`.
  Status ensure_scratch(size_t shared_bytes, size_t slot_bytes, int n_slots);
  Status run_eager(const exec::Plan& p, uint64_t hash);
  Status run_traced(const exec::Plan& p, const std::string& path, uint64_t t0);
  uint64_t kernels_of(const exec::Plan& p, uint64_t hash);
  Status run_new_structure(const exec::Plan& p, const StructureKey& key, uint64_t hash, const ExecOptions& o);
  // Launches a cached executable graph and waits for it.
  Status replay(const Cached& c, uint64_t t0);
  // Records dispatches [begin, end) of `p` into a new graph (edges inside the range only).
  // `listing`, when given, receives each dispatch's last kernel: name, grid, block.
  Status record(const exec::Plan& p, size_t begin, size_t end, bool pdl, cudaGraph_t* out, uint64_t* kernels,
                uint64_t* pdl_edges, std::string* listing = nullptr);
  Status instantiate_and_cache(cudaGraph_t graph, const StructureKey& key, uint64_t options, Cached info);
  Status fail(Status s);
  /// What every launch on `stream` gets: the handles, the numerics mode, the device's SM count.
  LaunchContext launch_context(cudaStream_t stream) const;
  CudaError run_dispatch(const LaunchContext& base, const exec::Dispatch& d);
  bool aborted() const { return abort_fn_ && abort_fn_(abort_data_); }
  void count_plan(const exec::PlanStats& stats, size_t n_dispatches);
  ExecOptions effective_options(bool trace) const;
  void dump_plan(const exec::Plan& p);
  void clear_cache();
  Status sync();

  DeviceContext& dev_;
  Numerics numerics_;
  ExecOptions options_;
  ExecCounters counters_;
  bool sync_each_node_ = false;
  bool act_handoff_ = true;  ///< LOOM_CUDA_NORM_QUANT (read when the executor is made): activation hand-offs
  bool tile_handoff_ = true;  ///< LOOM_CUDA_TILE_HANDOFF (read when the executor is made): norms write gemm_q's tiles
  int f16_handoff_ = 15;      ///< LOOM_CUDA_F16_HANDOFF (likewise): norms, gated activations and prompt attention write cuBLAS's f16
  bool (*abort_fn_)(void*) = nullptr;
  void* abort_data_ = nullptr;
  std::string trace_path_;
  Status error_;  // sticky
  int64_t inject_countdown_ = -1;
  int n_dumped_ = 0;
  int n_graph_dumps_ = 0;
  cudaStream_t capture_stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_capacity_ = 0;
  cudaEvent_t timing_[2] = {nullptr, nullptr};  ///< LOOM_EXEC_GPU_TIME: around each replay
  size_t shared_bytes_ = 0;
  size_t slot_bytes_ = 0;
  int n_slots_ = 0;
  static constexpr size_t kCacheCapacity = 16;
  exec::GraphCache<Cached> cache_{kCacheCapacity};
  StructureKey key_;  // the key of a graph that carries none, rebuilt each compute in the same memory
  // By structure hash alone: a collision here costs only a needless whole-pass recording or a wrong
  // kernel count, never a wrong replay.
  std::unordered_set<uint64_t> seen_;  // structures run once (built into a graph when seen again)
  std::unordered_map<uint64_t, uint64_t> eager_kernels_;  // kernels per eager pass, by structure
};

}  // namespace loom::cuda
