// The executor's plan: a graph becomes a list of dispatches (one kernel launch or one fused kernel
// each) with the exact byte ranges they read and write; passes rewrite it (fusion, reorder) and
// derive the dependencies (RAW/WAR/WAW on overlapping bytes, transitively reduced).
// Backend-agnostic: it only looks at tensors' addresses, so it runs after allocation.
//
// Node roles of each fused kind (Dispatch::nodes, in this order; "kept" nodes are written, the
// others are intermediates the fused kernel never stores):
//   rms_norm_mul         {norm, mul}                          kept: mul.  mul = mul(norm, w) with w = mul->src[1]
//   add_rms_norm_mul     {add, norm, mul}                     kept: add, mul (add is the residual)
//   all_reduce_add_rms_norm_mul {all_reduce, add, norm, mul}  kept: add, mul. add reads the all_reduce
//                                                             (its only reader) and the residual; the
//                                                             kernel sums the ranks' partials itself
//   mat_vec_bias         {mul_mat, add}                       kept: add.  add = add(mul_mat, bias), bias = add->src[1]
//   glu_mat_vec          {mm_gate, mm_up, glu}                kept: glu.  glu = swiglu/geglu(mm_gate, mm_up), both
//                                                             mul_mats read the same activations (src[1])
//   rope_set_rows        {rope_k, set_rows, rope_q or null,   kept: set_rows, rope_q, set_rows_v.
//                         set_rows_v or null}                 set_rows->src[0] is permute(rope_k, 0, 2, 1,
//                                                             3) (a view of rope_k); set_rows_v stores the
//                                                             values at the same cells (no rope)
//   scale_mask_soft_max  {scale, add, soft_max}               kept: soft_max. add = add(scale, mask);
//                                                             soft_max has no mask of its own
//   moe_route            {soft_max, top_k, get_rows, sum_rows or null, div or null}
//                                                             kept: top_k and the last of get_rows/div.
//                                                             top_k reads soft_max; get_rows reads a
//                                                             [1, n_expert, T] view of soft_max with the
//                                                             top_k ids; div = div(view(get_rows), sum_rows)
//   mat_vec_multi        {mm0, mm1, mm2 or null}              kept: all. mul_mats with the same activations
//                                                             (src[1]) and weights of one type
//   gather_flash_attn    {get_rows_k, get_rows_v, flash_attn} kept: flash_attn. Its K (src[1]) and V (src[2])
//                                                             are views of get_rows_k / get_rows_v (the
//                                                             batched step's gathered cache rows:
//                                                             get_rows(view(store), idx) reshaped to
//                                                             [d, n_kv, n_head_kv, n_seqs]); the kernel
//                                                             reads the rows through the indices
//   rope_flash_attn      {rope_k, set_rows_k, rope_q,         kept: set_rows_k, set_rows_v, flash_attn.
//                         set_rows_v, flash_attn}             rope_set_rows's four roles (both stores
//                                                             required) whose stores flash_attn reads
//                                                             (its K and V are views of them) and whose
//                                                             rope_q it reads (through a permute) alone:
//                                                             a decode step's attention, rotating Q and
//                                                             the new K and storing K/V in its own kernel
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/exec.h"
#include "loom/graph.h"

namespace loom::exec {

/// Bytes [begin, end) of one address space.
struct ByteRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool empty() const { return end <= begin; }
  bool overlaps(const ByteRange& o) const { return begin < o.end && o.begin < end; }
};

/// The bytes a tensor's elements span: from its first element to one past its last, strides
/// included (a view contributes its own extent, not its source's whole allocation).
ByteRange tensor_range(const Tensor& t);


inline constexpr int kMaxFusedNodes = 5;

struct Dispatch {
  FusedKind kind = FusedKind::none;
  std::array<Tensor*, kMaxFusedNodes> nodes{};  ///< roles per kind (above); kind none: nodes[0]
  /// A fused dispatch's nodes it writes (others are intermediates its kernel keeps in registers).
  std::array<bool, kMaxFusedNodes> kept{};
  int order = 0;              ///< graph index of the node that anchors it (its last node)
  std::vector<ByteRange> reads;
  std::vector<ByteRange> writes;
  bool barrier = false;       ///< host-visible result or side effect: reorder does not move past it
  size_t scratch_bytes = 0;   ///< device scratch the kernels need (set by the backend)
  ByteRange scratch;          ///< where (assign_scratch); counted among writes
  int depth = 0;              ///< longest path from a root in the dependency DAG
  /// Set by the backend (CUDA, fast numerics): a norm or flash-decoding dispatch writes its output as
  /// the mat-vec's quantized activations of this block size instead of f32 (0: f32), and the mat-vec
  /// dispatches that alone read it (act_in) take them as they are, without quantizing. Negative: the
  /// products' packed f16 activations (-1 gemm_q's tiles, -2 contiguous f16 for cuBLAS; a norm or a
  /// gated activation writes those), which they take without packing.
  int act_out_block = 0;
  bool act_in = false;
  /// With act_in: the first kernel reading them may be a library's (cuBLAS on handed f16 activations),
  /// which does not wait on a programmatic edge, so the dispatch takes a full dependency.
  bool act_in_library = false;
  /// Set by the backend (CUDA): a product whose activations the product before it in the same
  /// scratch region already packed (the same activation tensor): it skips its packing.
  bool b_packed = false;

  Tensor* node() const { return nodes[0]; }
  /// The node that names the dispatch: the last non-null role.
  Tensor* anchor() const;
};

/// Whether tensor y, written by dispatch d, shares bytes with anything else d touches: another node it
/// writes (a fused add's sum; intermediates, never materialized, do not count) or a source from
/// outside it (an input it reads). A kernel that writes y in a layout other than y's own rows (the CUDA backend's
/// activation hand-off: row r's codes at byte r * k) may then overwrite bytes another block of it
/// still reads or writes.
bool output_shares_bytes(const Dispatch& d, const Tensor* y);

/// Asks the backend whether it has a kernel for a candidate fused dispatch.
class FusionSupport {
 public:
  virtual ~FusionSupport() = default;
  virtual bool supports_fused(const Dispatch& d) const = 0;
};

struct PlanStats {
  uint64_t graph_nodes = 0;  ///< nodes with kernels
  std::array<uint64_t, kFusedKindCount> fusions{};
  uint64_t reordered = 0;
  uint64_t act_handoffs = 0;  ///< dispatches with act_out_block set (the backend's hand-off pass)
  uint64_t edges = 0;
  uint64_t groups = 0;
  std::array<uint64_t, 9> group_hist{};
};

struct Plan {
  std::vector<Dispatch> dispatches;    ///< in encoding order
  std::vector<std::vector<int>> deps;  ///< deps[i]: earlier dispatches i waits for (reduced)
  PlanStats stats;

  /// One line per dispatch: index, kind/op, anchor, depth, deps, ranges.
  std::string dump() const;
  /// Graphviz DOT of the dependency DAG.
  std::string dot() const;
};

// ---- passes, in the order the executor runs them ------------------------------------------------

/// One dispatch per node that launches work (views and leafs launch nothing), in graph order.
/// Every tensor must be allocated.
Plan build_plan(const Graph& g);
/// Rewrites matching node groups into fused dispatches the backend supports.
void fuse(Plan& plan, const Graph& g, const FusionSupport& support);
/// The node whose result `t` shows: `t`, or through views (not set_rows/cpy, which write) the node
/// they view.
const Tensor* producer(const Tensor* t);
/// For every node, the nodes that read it, directly or through views; a view marked as an output
/// counts as a reader of what it shows (the caller reads it after compute). The fusion pass and the
/// backends' passes after it ask it which outputs nothing else reads.
std::unordered_map<const Tensor*, std::vector<Tensor*>> readers_of(const Graph& g);
/// Gives each dispatch with scratch_bytes > 0 one of `n_slots` slots of `slot_bytes` at `base`,
/// round robin, and adds the slot to its writes (so two users of a slot are ordered). Dispatches
/// `in_shared` accepts all get the one region at `shared` instead (large scratch of dispatches the
/// backend orders among themselves anyway, e.g. through a library's workspace: one region for them
/// instead of a slot each costs no concurrency).
void assign_scratch(Plan& plan, uintptr_t base, size_t slot_bytes, int n_slots, uintptr_t shared = 0,
                    const std::function<bool(const Dispatch&)>& in_shared = nullptr);
/// In plan order, marks b_packed on each dispatch `in_shared` accepts whose `packing` key (nonzero:
/// which activations, packed how) equals that of the previous dispatch it accepted: the shared scratch
/// region still holds those packed activations (its users are ordered in plan order).
void mark_packed_reuse(Plan& plan, const std::function<bool(const Dispatch&)>& in_shared,
                       const std::function<uintptr_t(const Dispatch&)>& packing);
/// Greedy look-ahead: repeatedly emits, from the next `lookahead` pending dispatches, every one that
/// conflicts with no earlier pending dispatch, so independent dispatches become adjacent groups.
/// Barriers stop the look-ahead. Counts the dispatches that moved.
void reorder(Plan& plan, int lookahead);
/// deps and depth: with `concurrency`, each dispatch waits for earlier ones whose ranges conflict
/// (RAW, WAR, WAW), transitively reduced; without, each waits for the one before it (a chain).
void build_dependencies(Plan& plan, bool concurrency);

/// A pass's structure (not its contents), encoded in one walk: every node's op, type, flags, shape,
/// strides, address and parameters, which tensors it reads (leaf operands in full) as 64-bit words,
/// and their hash. Names are left out: they change no kernel. Two passes with equal words launch the
/// same kernels with the same arguments, so a recorded CUDA graph of one replays the other; the hash
/// finds the candidate, the words confirm it. Reuses `out.words`' memory; four independent multiply
/// lanes, about a cycle per word.
void structure_key(const Graph& g, StructureKey& out);
StructureKey structure_key(const Graph& g);
/// The options that change what a recorded pass launches, as one word (n_cb does not: it only
/// splits a first run into chunks). Part of the executor's cache key beside the structure.
uint64_t options_word(const ExecOptions& o);

/// Whether two dispatches must be ordered (one writes bytes the other reads or writes).
bool conflicts(const Dispatch& a, const Dispatch& b);

}  // namespace loom::exec
