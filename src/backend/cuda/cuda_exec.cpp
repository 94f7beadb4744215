// The CUDA graph executor (see cuda_exec.h).
#include "cuda_exec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cuda_common.h"
#include "cuda_ops.h"
#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/fused.cuh"
#include "kernels/mat_vec_fast.cuh"
#include "kernels/matmul.cuh"

namespace loom::cuda {

namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

/// Adds the time from its construction to its destruction to a counter (ns).
struct AddElapsed {
  uint64_t& into;
  uint64_t t0 = now_ns();
  ~AddElapsed() { into += now_ns() - t0; }
};

class CudaFusion final : public exec::FusionSupport {
 public:
  explicit CudaFusion(FusedTarget target) : target_(target) {}
  bool supports_fused(const exec::Dispatch& d) const override {
    return fused_supported(d.kind, d.nodes.data(), target_);
  }

 private:
  FusedTarget target_;  // the executor's numerics mode and device
};

// What the fused kernels' support depends on, from the executor's launch context.
FusedTarget target_of(const LaunchContext& c) { return {c.fast, c.sm90a}; }

// Splits n dispatches into the seeds' chunks: the first max(64, 10%), then n_cb more of equal size.
std::vector<size_t> chunk_bounds(size_t n, int n_cb) {
  std::vector<size_t> b{0};
  const size_t first = std::min(n, std::max<size_t>(64, n / 10));
  if (first > 0) b.push_back(first);
  const size_t rest = n - first;
  const size_t parts = static_cast<size_t>(std::max(n_cb, 1));
  for (size_t k = 1; k <= parts && rest > 0; ++k) {
    const size_t end = first + rest * k / parts;
    if (end > b.back()) b.push_back(end);
  }
  return b;
}

CudaError launch_dispatch(const LaunchContext& base, const exec::Dispatch& d) {
  LaunchContext ctx = base;
  if (d.scratch_bytes > 0) {
    ctx.scratch = reinterpret_cast<void*>(d.scratch.begin);
    ctx.scratch_size = d.scratch_bytes;
  }
  ctx.act_out_block = d.act_out_block;
  ctx.act_in = d.act_in;
  ctx.b_packed = d.b_packed;
  const auto& n = d.nodes;
  switch (d.kind) {
    case FusedKind::none:
      return launch_node(ctx, n[0]);
    case FusedKind::rms_norm_mul:
      return launch_rms_norm_mul(ctx, n[0], n[1]);
    case FusedKind::add_rms_norm_mul:
      return launch_add_rms_norm_mul(ctx, n[0], n[1], n[2]);
    case FusedKind::all_reduce_add_rms_norm_mul:
      return launch_all_reduce_add_rms_norm_mul(ctx, n[0], n[1], n[2], n[3]);
    case FusedKind::mat_vec_bias:
      return launch_mat_vec_bias(ctx, n[0], n[1]);
    case FusedKind::glu_mat_vec:
      return launch_glu_mat_vec(ctx, n[0], n[1], n[2]);
    case FusedKind::rope_set_rows:
      return launch_rope_set_rows(ctx, n[0], n[1], n[2], n[3], make_rope_args(n[0]->get_params<RopeParams>()));
    case FusedKind::scale_mask_soft_max:
      return launch_scale_mask_soft_max(ctx, n[0], n[1], n[2]);
    case FusedKind::moe_route:
      return launch_moe_route(ctx, n[0], n[1], n[2], n[3], n[4]);
    case FusedKind::mat_vec_multi:
      return launch_mat_vec_multi(ctx, n[0], n[1], n[2]);
    case FusedKind::gather_flash_attn:
      return launch_gather_flash_attn(ctx, n[0], n[1], n[2]);
    case FusedKind::rope_flash_attn:
      return launch_rope_flash_attn(ctx, n[0], n[1], n[2], n[3], n[4], make_rope_args(n[0]->get_params<RopeParams>()));
    case FusedKind::count_:
      break;
  }
  return CudaError::runtime(cudaErrorInvalidValue, "unknown fused dispatch kind", __FILE__, __LINE__);
}

// LOOM_CUDA_NORM_QUANT=0 (read when an executor is made) turns the activation hand-offs off: every
// norm's and attention's output stays f32, for comparisons (loom-exec-equivalence makes one of each).
bool act_handoff_from_env() { return env_switch("LOOM_CUDA_NORM_QUANT"); }
bool tile_handoff_from_env() { return env_switch("LOOM_CUDA_TILE_HANDOFF"); }
// LOOM_CUDA_F16_HANDOFF: 0 off; a mask of the f16 hand-offs' parts, for comparisons: 1 products alone
// (mul_mat dispatches), 2 the fused products (stacked f16 weights, dequantized Q/K/V), 4 gated
// activations as producers, 8 a prompt's flash attention as producer (the norms always are); 15
// (all) by default.
int f16_handoff_from_env() { return static_cast<int>(env_int("LOOM_CUDA_F16_HANDOFF", 15, 0, 15)); }

// Whether `b` (a mat-vec's activation) shows all of y's bytes as they lie: y, or a contiguous reshape.
bool whole_view_of(const Tensor* b, const Tensor* y) {
  if (b == y) return true;
  return b->op == OpKind::view && exec::producer(b) == y && b->data == y->data && b->is_contiguous() &&
         y->is_contiguous() && b->nelements() == y->nelements();
}

// Whether a fused norm's output y may take its mat-vecs' quantized activations: their layout puts row
// r's codes at byte r * k and the scales and sums after every row's codes, so with more than one row
// a block writes into other rows' f32 bytes. Where y shares bytes with what the kernel reads (the
// residual and the added value, the norm's input: the planner may put y on the bytes of an input
// that dies at the add, and runs the last layer's whole chain in place) or the sum it also writes,
// another block may still load those bytes, or store its f32 sum over codes already written: a race
// (seen as logits that differ run to run with 4 sequences, `loom-exec-equivalence`). One row keeps
// all its bytes to itself (its block loads before it stores), so there the hand-off stays.
bool norm_act_bytes_own(const exec::Dispatch& d, const Tensor* y) {
  return y->nrows() <= 1 || !exec::output_shares_bytes(d, y);
}

// Whether decode attention t (of dispatch d) can write its output as activations of `block`: f16 rows
// (kActF16) only where f16 hand-offs of attention are on and never over its operands (its blocks store
// while others still load Q).
bool decode_attention_writes_act(const exec::Dispatch& d, const Tensor* t, const FlashAttnRows* rows, int block,
                                 int f16) {
  return flash_attn_decode_writes_act(t, rows, block) &&
         (block != kActF16 || ((f16 & 8) && !exec::output_shares_bytes(d, t)));
}

// Whether dispatch d can write its output as activations of `block`.
bool writes_act(const exec::Dispatch& d, int block, int f16, FusedTarget target) {
  switch (d.kind) {
    case FusedKind::rms_norm_mul:
    case FusedKind::add_rms_norm_mul:
    case FusedKind::all_reduce_add_rms_norm_mul:
      return norm_act_out_supported(d.kind, d.nodes.data(), block) && norm_act_bytes_own(d, d.anchor());
    case FusedKind::none: {
      const Tensor* t = d.node();
      // a gated activation as f16 rows over its own f32 bytes: never where the output lies on its
      // operands, even for one row (the kernel spreads a row over many blocks, so one block's f16
      // stores may land on gate values another block has not loaded yet)
      if (t->op == OpKind::swiglu || t->op == OpKind::geglu)
        return block == kActF16 && gated_f16_out_supported(t) && !exec::output_shares_bytes(d, t);
      if (t->op != OpKind::flash_attn) return false;
      if (t->src[0]->ne[1] < kFlashAttnMmaMinQueries) return decode_attention_writes_act(d, t, nullptr, block, f16);
      // a prompt's attention (the tensor-core kernel: mark_act_handoffs runs in the fast mode only) as
      // f16 over its own bytes, never over its operands (blocks store while others still load)
      return (f16 & 8) && block == kActF16 && flash_attn_mma_supported(t) && flash_attn_f16_out_fits(t) &&
             !exec::output_shares_bytes(d, t);
    }
    case FusedKind::gather_flash_attn: {
      const FlashAttnRows rows{d.nodes[0]->src[0], d.nodes[0]->src[1], d.nodes[1]->src[0], d.nodes[1]->src[1]};
      return decode_attention_writes_act(d, d.nodes[2], &rows, block, f16);
    }
    case FusedKind::rope_flash_attn:  // the split merge is the plain decode's
      return decode_attention_writes_act(d, d.nodes[4], nullptr, block, f16);
    case FusedKind::glu_mat_vec:  // the stacked cuBLAS form's gated activation (f16 on)
      return (f16 & 4) && block == kActF16 && glu_writes_f16(d.nodes.data(), target);
    default:
      return false;
  }
}

// Whether dispatch d writes any of x's bytes (a node it keeps lies over them; a single node's dispatch
// keeps its node, kept[] marking only fused dispatches' nodes).
bool writes_over(const exec::Dispatch& d, const Tensor* x) {
  const auto xb = reinterpret_cast<uintptr_t>(x->data), xe = xb + x->nbytes();
  for (size_t r = 0; r < d.nodes.size(); ++r) {
    const Tensor* n = d.nodes[r];
    const bool kept = d.kept[r] || (d.kind == FusedKind::none && r == 0);
    if (!n || !kept || !n->data) continue;
    const auto nb = reinterpret_cast<uintptr_t>(n->data), ne = nb + n->nbytes();
    if (nb < xe && xb < ne) return true;
  }
  return false;
}

// The fast mode's hand-off of quantized activations to the mat-vecs: a dispatch whose output nothing
// reads but fast quantized mat-vecs of one activation block, and which is no graph output, writes
// that output as their quantized activations (ActFast layout, in its own bytes), and the mat-vecs
// skip their quantize kernel: a launch less per producer. The producers: a fused rms_norm_mul /
// add_rms_norm_mul (the Q/K/V and gate/up products after a layer's norm) and flash-decoding with
// split keys, whose merge writes the attention output projection's activations. The byte ranges do
// not change (the layout lies within the f32 output's bytes), so ordering is untouched; the values
// equal the unfused path's bit for bit (the same floats quantized by the same arithmetic), but for
// flash-decoding of few keys, which without the hand-off (an f32 output) takes one split instead of
// the merge (LOOM_FLASH_DECODE_SINGLE=0 keeps the splits, for comparisons).
// With tiles (Executor::tile_handoff_), a norm whose readers are all products on gemm_q's warpgroup
// kernel writes its output as their packed f16 tiles (kActGemmQTiles) and they skip their packing.
// With f16 (Executor::f16_handoff_), a norm, a gated activation (swiglu, geglu) or a prompt's flash
// attention (its output projection's activations) whose readers all
// pack it to contiguous f16 for cuBLAS (f16 weights, or a prompt pass's dequantized ones) writes it
// so (kActF16): at a 512-token pass of an 8B layer the packings of the Q/K/V, gate/up and FFN-down
// activations (one of 29 MB read and 15 MB written) and half of the producers' writes go.
void mark_act_handoffs(exec::Plan& p, const Graph& g, FusedTarget target, bool tiles, int f16) {
  const auto readers = exec::readers_of(g);
  std::unordered_map<const Tensor*, size_t> at;  // node -> its dispatch
  for (size_t i = 0; i < p.dispatches.size(); ++i)
    for (const Tensor* n : p.dispatches[i].nodes)
      if (n) at[n] = i;
  for (exec::Dispatch& d : p.dispatches) {
    const bool candidate = d.kind == FusedKind::rms_norm_mul || d.kind == FusedKind::add_rms_norm_mul ||
                           d.kind == FusedKind::all_reduce_add_rms_norm_mul ||
                           d.kind == FusedKind::gather_flash_attn || d.kind == FusedKind::rope_flash_attn ||
                           (d.kind == FusedKind::none && d.node()->op == OpKind::flash_attn) ||
                           ((f16 & 4) && d.kind == FusedKind::none &&
                            (d.node()->op == OpKind::swiglu || d.node()->op == OpKind::geglu)) ||
                           ((f16 & 4) && d.kind == FusedKind::glu_mat_vec);
    if (!candidate) continue;
    const Tensor* y = d.anchor();
    auto r = readers.find(y);
    if ((y->flags & kTensorOutput) || r == readers.end()) continue;
    int block = 0;
    std::vector<size_t> consumers;
    for (const Tensor* u : r->second) {
      auto c = at.find(u);
      if (u->op != OpKind::mul_mat || !u->src[1] || !whole_view_of(u->src[1], y) || u->src[0] == y ||
          c == at.end()) {
        block = 0;
        break;
      }
      const exec::Dispatch& cd = p.dispatches[c->second];
      // where the product's output goes, as the consumer's launcher passes it to the mat-vec
      const Tensor* dst = cd.kind == FusedKind::none || cd.kind == FusedKind::mat_vec_multi ? u
                          : cd.kind == FusedKind::mat_vec_bias                              ? cd.nodes[1]
                          : cd.kind == FusedKind::glu_mat_vec                               ? cd.nodes[2]
                                                                                            : nullptr;
      int b = dst ? mat_vec_fast_act_block(u, dst) : 0;
      // Products on gemm_q's warpgroup kernel take its packed tiles instead (no packing kernel), when
      // none of their outputs lies on the activations' bytes: the kernel reads them while it writes
      // (the packing read them all first, so the planner may put an output there).
      if (b == 0 && tiles && !writes_over(cd, y) &&
          (cd.kind == FusedKind::none ? mul_mat_takes_gemm_q_tiles(u, target.fast, target.sm90a)
                                      : fused_takes_gemm_q_tiles(cd.kind, cd.nodes.data(), target)))
        b = kActGemmQTiles;
      // Products through cuBLAS take f16 rows (kActF16): likewise, none may write over them
      if (b == 0 && f16 && !writes_over(cd, y) &&
          (cd.kind == FusedKind::none ? (f16 & 1) && mul_mat_takes_f16_b(u, target.fast)
                                      : (f16 & 2) && fused_takes_f16_b(cd.kind, cd.nodes.data(), target)))
        b = kActF16;
      if (b == 0 || (block && b != block)) {
        block = 0;
        break;
      }
      block = b;
      consumers.push_back(c->second);
    }
    if (block == 0 || !writes_act(d, block, f16, target)) continue;
    d.act_out_block = block;
    ++p.stats.act_handoffs;
    for (size_t c : consumers) {
      p.dispatches[c].act_in = true;
      p.dispatches[c].act_in_library = block == kActF16;  // no packing kernel of ours before cuBLAS's
    }
  }
}

// Whether a dispatch's first kernel is one of ours, which waits on a programmatic edge (pdl_wait) and
// so may take one. Not a collective's (NCCL; the fused all-reduce + norm is ours), nor a product that
// skips its packing (b_packed, or f16 activations handed over: act_in_library), whose first kernel
// may then be cuBLAS's: those get a full dependency (without it cuBLAS read the norm's output before
// the norm had written it: logits that differed run to run, loom-exec-equivalence).
// Nor a dispatch whose products' weights some kernel of the step may write (not read_before_wait: a
// graph's own output as weights, possible through the C API, or a cache the step's stores write): the
// product kernels load their first weights before their wait, which a full dependency makes safe (every
// kernel passes its wait before it ends, so the dispatches before have all ended), with no flag in the
// kernels (one cost ~1.5% of 8B Q4_K_M decode, H200). Broader than the kernels that load early (the exact
// ones wait first), which costs only graphs with such products: LLM graphs have none (flash attention).
bool weights_read_early_ok(const exec::Dispatch& d) {
  for (const Tensor* n : d.nodes)
    if (n && (n->op == OpKind::mul_mat || n->op == OpKind::mul_mat_id) && n->src[0] &&
        !read_before_wait(n->src[0]->root()))
      return false;
  return true;
}
bool first_kernel_waits(const exec::Dispatch& d) {
  return !d.b_packed && !d.act_in_library && !(d.kind == FusedKind::none && d.node()->op == OpKind::all_reduce) &&
         weights_read_early_ok(d);
}

// LOOM_CUDA_INJECT_FAULT=N makes the Nth dispatch launched by a compute that plans (not a replay)
// fail as a launch would: for testing the error state and reset().
int64_t injected_fault_at() {
  const char* v = std::getenv("LOOM_CUDA_INJECT_FAULT");
  return v && *v ? std::atoll(v) : -1;
}

// LOOM_EXEC_FORCE_HASH=N (read when the executor is created or reset) makes every structure look up
// the graph cache by hash N: every lookup with a cached pass of another structure is a collision, for
// testing that a collision rebuilds.
std::optional<uint64_t> forced_hash() {
  const char* v = std::getenv("LOOM_EXEC_FORCE_HASH");
  if (!v || !*v) return std::nullopt;
  return std::strtoull(v, nullptr, 0);
}

std::string dispatch_name(const exec::Dispatch& d) {
  const Tensor* a = d.anchor();
  const char* what = d.kind == FusedKind::none ? op_name(d.node()->op) : fused_kind_name(d.kind);
  return a->name.empty() ? std::string(what) : fmt::format("{} {}", what, a->name);
}

constexpr size_t kScratchAlign = 256;
constexpr int kScratchSlots = 8;

}  // namespace

Executor::Executor(DeviceContext& dev, Numerics numerics)
    : dev_(dev),
      numerics_(numerics),
      options_(exec_options_from_env()),
      sync_each_node_(std::getenv("LOOM_CUDA_SYNC_EACH_NODE") != nullptr),
      act_handoff_(act_handoff_from_env()),
      tile_handoff_(tile_handoff_from_env()),
      f16_handoff_(f16_handoff_from_env()) {
  cache_.force_hash(forced_hash());
}

Executor::~Executor() {
  if (dev_.make_current().ok()) {
    if (cudaStreamSynchronize(dev_.stream()) != cudaSuccess) (void)cudaGetLastError();
    clear_cache();
    if (capture_stream_) cudaStreamDestroy(capture_stream_);
    if (scratch_) dev_.release(scratch_, scratch_capacity_);
    for (cudaEvent_t ev : timing_)
      if (ev) cudaEventDestroy(ev);
  }
  (void)cudaGetLastError();
}

void Executor::clear_cache() {
  cache_.clear([](Cached& c) {
    if (c.exec) cudaGraphExecDestroy(c.exec);
  });
  seen_.clear();
}

Status Executor::fail(Status s) {
  if (error_.ok()) error_ = s;
  return s;
}

Status Executor::sync() {
  ++counters_.host_syncs;
  const cudaError_t e = cudaStreamSynchronize(dev_.stream());
  if (e != cudaSuccess)
    return fail(to_status(CudaError::runtime(e, "cudaStreamSynchronize", __FILE__, __LINE__),
                          "after a graph compute; set LOOM_CUDA_SYNC_EACH_NODE=1 to find the dispatch"));
  return {};
}

Status Executor::reset() {
  std::lock_guard lock(dev_.stream_mutex());
  LOOM_TRY(dev_.make_current());
  if (cudaStreamSynchronize(dev_.stream()) != cudaSuccess) (void)cudaGetLastError();
  (void)cudaGetLastError();
  clear_cache();
  cache_.force_hash(forced_hash());
  error_ = {};
  return {};
}

Status Executor::validate(const Graph& g) const {
  const BufferType& type = dev_.buffer_type();
  auto check = [&](const Tensor& t, const Tensor& node) -> Status {
    if (!t.data || !t.buffer)
      return make_error(StatusCode::invalid_argument, "cuda: tensor {} (used by {}) has no memory", describe(t),
                        op_name(node.op));
    if (&t.buffer->type() != &type)
      return make_error(StatusCode::invalid_argument, "cuda: tensor {} (used by {}) is in {} memory, not {}",
                        describe(t), op_name(node.op), t.buffer->type().name(), type.name());
    return {};
  };
  for (const Tensor* t : g.nodes()) {
    if (t->op == OpKind::view) continue;
    if (!cuda_supports_op(*t)) {
      std::string inputs;  // a weight's type is the usual reason: name it
      for (const Tensor* s : t->src)
        if (s) inputs += (inputs.empty() ? " from " : ", ") + describe(*s);
      return make_error(StatusCode::unsupported, "cuda: no kernel for {} of {}{}", op_name(t->op), describe(*t),
                        inputs);
    }
    LOOM_TRY(check(*t, *t));
    for (const Tensor* s : t->src)
      if (s) LOOM_TRY(check(*s, *t));
  }
  return {};
}

Status Executor::ensure_scratch(size_t shared_bytes, size_t slot_bytes, int n_slots) {
  shared_bytes = (shared_bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  slot_bytes = (slot_bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  if (shared_bytes <= shared_bytes_ && slot_bytes <= slot_bytes_ && n_slots <= n_slots_) return {};
  // grow, never shrink, either part
  shared_bytes = std::max(shared_bytes, shared_bytes_);
  slot_bytes = std::max(slot_bytes, slot_bytes_);
  n_slots = std::max(n_slots, n_slots_);
  const size_t need = shared_bytes + slot_bytes * static_cast<size_t>(n_slots);
  // Cached graphs point into the old scratch: they go with it.
  LOOM_TRY(sync());
  clear_cache();
  if (scratch_) dev_.release(scratch_, scratch_capacity_);
  scratch_ = nullptr;
  scratch_capacity_ = 0;
  shared_bytes_ = 0;
  slot_bytes_ = 0;
  n_slots_ = 0;
  Result<void*> p = dev_.allocate(need, &scratch_capacity_);
  if (!p.ok()) return p.status();
  scratch_ = *p;
  shared_bytes_ = shared_bytes;
  slot_bytes_ = slot_bytes;
  n_slots_ = n_slots;
  return {};
}

Result<exec::Plan> Executor::make_plan(const Graph& g, const ExecOptions& o) {
  const AddElapsed count_plan{counters_.host_plan_ns};
  exec::Plan p = exec::build_plan(g);
  const FusedTarget target = target_of(launch_context(nullptr));
  if (o.fusion) exec::fuse(p, g, CudaFusion{target});
  if (o.fusion && numerics_ == Numerics::fast && act_handoff_ && !batch_invariant()) mark_act_handoffs(p, g, target, tile_handoff_, f16_handoff_);
  const auto ws = reinterpret_cast<uintptr_t>(dev_.cublas_workspace());
  // Products through cuBLAS all write its workspace, so they are ordered among themselves: their
  // scratch (the prefill GEMM's dequantized weights, up to a whole matrix) shares one region ahead
  // of the slots the other dispatches take in turn.
  auto uses_cublas = [&](const exec::Dispatch& d) {
    if (d.kind != FusedKind::none) return fused_uses_cublas(d.kind, d.nodes.data(), target);
    return d.node()->op == OpKind::mul_mat && mul_mat_uses_cublas(d.node(), numerics_ == Numerics::fast);
  };
  size_t max_shared = 0, max_slot = 0;
  for (exec::Dispatch& d : p.dispatches) {
    d.scratch_bytes = d.kind == FusedKind::none ? node_scratch_bytes(*d.node(), numerics_ == Numerics::fast)
                                                : fused_scratch_bytes(d.kind, d.nodes.data(), target);
    if (uses_cublas(d)) {
      max_shared = std::max(max_shared, d.scratch_bytes);
      d.writes.push_back({ws, ws + dev_.cublas_workspace_size()});
    } else {
      max_slot = std::max(max_slot, d.scratch_bytes);
    }
  }
  const int slots = o.concurrency ? kScratchSlots : 1;
  if (max_shared + max_slot > 0) {
    LOOM_TRY(ensure_scratch(max_shared, max_slot, kScratchSlots));
    const auto base = reinterpret_cast<uintptr_t>(scratch_);
    exec::assign_scratch(p, base + shared_bytes_, slot_bytes_, slots, base, uses_cublas);
  }
  if (o.reorder) exec::reorder(p, o.lookahead);
  // In the final order, a product through cuBLAS right after another (in the shared region) of the
  // same activations with the same packing takes that packing as it is: K and V after Q, up after
  // gate (one packing kernel fewer each; 5-12 us at 512 tokens of an 8B layer).
  // LOOM_CUDA_PACK_REUSE=0 packs every time, for comparisons.
  static const bool reuse = env_switch("LOOM_CUDA_PACK_REUSE");
  if (reuse)
    exec::mark_packed_reuse(p, uses_cublas, [&](const exec::Dispatch& d) {
      // a fused dispatch packs its own activations, for itself; one handed f16 activations packs none
      if (d.kind != FusedKind::none || d.act_in) return uintptr_t{0};
      const int kind = mul_mat_packed_b(d.node(), numerics_ == Numerics::fast);  // 0..3
      return kind ? reinterpret_cast<uintptr_t>(d.node()->src[1]) * 4 + static_cast<uintptr_t>(kind) : uintptr_t{0};
    });
  exec::build_dependencies(p, o.concurrency);
  return p;
}

Result<exec::Plan> Executor::plan(const Graph& g) {
  if (!g.status().ok()) return g.status();
  std::lock_guard lock(dev_.stream_mutex());
  LOOM_TRY(dev_.make_current());
  LOOM_TRY(validate(g));
  return make_plan(g, effective_options(false));
}

// Options as this compute runs them: serialize (asked for, LOOM_CUDA_SYNC_EACH_NODE, or a trace,
// which times dispatches one at a time) turns every technique off; a trace keeps fusion, so it shows
// the kernels a normal run launches.
ExecOptions Executor::effective_options(bool trace) const {
  const ExecOptions& o = options_;
  if (!o.serialize && !sync_each_node_ && !trace) return o;
  ExecOptions s;
  s.serialize = true;
  s.graph = s.concurrency = s.reorder = s.pdl = false;
  s.fusion = trace && !o.serialize && o.fusion;
  s.n_cb = o.n_cb;
  s.lookahead = o.lookahead;
  return s;
}

void Executor::count_plan(const exec::PlanStats& stats, size_t n_dispatches) {
  counters_.dispatches += n_dispatches;
  counters_.graph_nodes += stats.graph_nodes;
  counters_.edges += stats.edges;
  counters_.groups += stats.groups;
  counters_.reordered += stats.reordered;
  counters_.act_handoffs += stats.act_handoffs;
  for (size_t i = 0; i < stats.group_hist.size(); ++i) counters_.group_hist[i] += stats.group_hist[i];
  for (size_t i = 0; i < stats.fusions.size(); ++i) counters_.fusions[i] += stats.fusions[i];
}

Status Executor::compute(const Graph& g) {
  const uint64_t t0 = now_ns();
  if (!g.status().ok()) return g.status();
  if (!error_.ok())
    return make_error(error_.code(),
                      "cuda: the backend is in an error state since an earlier failure (reset it): {}",
                      error_.message());
  std::lock_guard lock(dev_.stream_mutex());
  LOOM_TRY(dev_.make_current());
  ++counters_.computes;
  return compute_locked(g, t0);
}

Status Executor::compute_locked(const Graph& g, uint64_t t0) {
  const bool trace = !trace_path_.empty();
  const ExecOptions o = effective_options(trace);
  // One encoding of the structure per pass: the graph's own key when its owner attached one (a step
  // the model layer reuses as it is), else encoded here.
  const uint64_t t_hash = now_ns();
  const StructureKey* key = g.structure_key();
  if (!key) {
    exec::structure_key(g, key_);
    key = &key_;
  }
  const uint64_t options = exec::options_word(o);
  const uint64_t hash = key->hash ^ (options * 0x9e3779b97f4a7c15ull);  // for seen_ and eager_kernels_
  counters_.host_hash_ns += now_ns() - t_hash;

  if (o.graph) {
    bool collision = false;
    if (const Cached* c = cache_.find(*key, options, &collision)) return replay(*c, t0);
    counters_.hash_collisions += collision;
  }

  LOOM_TRY(validate(g));
  inject_countdown_ = injected_fault_at();
  Result<exec::Plan> planned = make_plan(g, o);
  if (!planned.ok()) return planned.status();
  const exec::Plan& p = *planned;
  count_plan(p.stats, p.dispatches.size());
  dump_plan(p);
  if (trace) {
    std::string path;
    std::swap(path, trace_path_);
    return run_traced(p, path, t0);
  }
  if (!o.graph) {
    LOOM_TRY(run_eager(p, hash));
  } else {
    LOOM_TRY(run_new_structure(p, *key, hash, o));
  }
  counters_.host_ns += now_ns() - t0;
  return sync();
}

LaunchContext Executor::launch_context(cudaStream_t stream) const {
  const CudaDeviceInfo& info = dev_.info();
  return LaunchContext{stream,         dev_.cublas(),  nullptr, 0, numerics_ == Numerics::fast,
                       info.sm_count, info.cc_major == 9 && info.cc_minor == 0};
}

namespace {
// LOOM_CUDA_ABLATE=a,b,... (or a+b+...): the dispatches so named launch nothing. A name is a dispatch's op or
// fusion ("add_rms_norm_mul", "rope_flash_attn"), its tensor's or its first operand's name without the
// layer prefix ("ffn_down.weight": the FFN down products); some launchers also test names of their
// kernels (ablated_kernel). For timing only (the results are wrong):
// tg128 with and without a kind of kernel is what that kind costs in the replayed step, launch and
// hand-offs included, which ncu's one-kernel-at-a-time times are not.
const std::vector<std::string>& ablated() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    const char* e = std::getenv("LOOM_CUDA_ABLATE");
    std::string s = e ? e : "";
    for (size_t at = 0; at < s.size();) {
      const size_t comma = std::min(s.find_first_of(",+", at), s.size());
      std::string name = s.substr(at, comma - at);
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (!name.empty()) v.push_back(std::move(name));
      at = comma + 1;
    }
    return v;
  }();
  return names;
}
}  // namespace

bool ablated_kernel(const char* name) {
  for (const std::string& n : ablated())
    if (n == name) return true;
  return false;
}

namespace {
bool is_ablated(const exec::Dispatch& d) {
  const auto& names = ablated();
  if (names.empty()) return false;
  auto unprefixed = [](const std::string& n) {  // "blk.3.ffn_down.weight" -> "ffn_down.weight"
    if (n.rfind("blk.", 0) != 0) return n;
    const size_t dot = n.find('.', 4);
    return dot == std::string::npos ? n : n.substr(dot + 1);
  };
  const Tensor* a = d.anchor();
  const std::string what = d.kind == FusedKind::none ? op_name(d.node()->op) : fused_kind_name(d.kind);
  const std::string own = unprefixed(a->name), first = a->src[0] ? unprefixed(a->src[0]->name) : std::string();
  for (const std::string& n : names)
    if (n == what || n == own || (!first.empty() && n == first)) return true;
  return false;
}
}  // namespace

CudaError Executor::run_dispatch(const LaunchContext& base, const exec::Dispatch& d) {
  if (inject_countdown_ > 0 && --inject_countdown_ == 0)
    return CudaError::runtime(cudaErrorLaunchFailure, "injected fault (LOOM_CUDA_INJECT_FAULT)", __FILE__, __LINE__);
  if (is_ablated(d)) return {};
  return launch_dispatch(base, d);
}

// LOOM_EXEC_DUMP=PREFIX writes every newly planned structure to PREFIX-N.txt (Plan::dump) and
// PREFIX-N.dot (Graphviz), N counting from 0 in this process.
void Executor::dump_plan(const exec::Plan& p) {
  const char* prefix = std::getenv("LOOM_EXEC_DUMP");
  if (!prefix || !*prefix) return;
  const std::string base = fmt::format("{}-{}", prefix, n_dumped_++);
  std::ofstream(base + ".txt") << exec_options_string(options_) << '\n' << p.dump();
  std::ofstream(base + ".dot") << p.dot();
}

// ---- eager submission ------------------------------------------------------------------------------

Status Executor::run_eager(const exec::Plan& p, uint64_t hash) {
  const LaunchContext base = launch_context(dev_.stream());
  const std::vector<size_t> chunks = chunk_bounds(p.dispatches.size(), options_.n_cb);
  for (size_t c = 0; c + 1 < chunks.size(); ++c) {
    if (aborted()) {
      (void)sync();
      return make_error(StatusCode::aborted, "cuda: compute stopped by the abort callback after {} of {} dispatches",
                        chunks[c], p.dispatches.size());
    }
    for (size_t i = chunks[c]; i < chunks[c + 1]; ++i) {
      const exec::Dispatch& d = p.dispatches[i];
      CudaError e = run_dispatch(base, d);
      if (e.ok() && sync_each_node_) {
        const cudaError_t s = cudaStreamSynchronize(dev_.stream());
        if (s != cudaSuccess) e = CudaError::runtime(s, "cudaStreamSynchronize", __FILE__, __LINE__);
      }
      if (!e.ok()) {
        if (cudaStreamSynchronize(dev_.stream()) != cudaSuccess) (void)cudaGetLastError();
        return fail(to_status(e, fmt::format("dispatch {} {} {}", i, dispatch_name(d), describe(*d.anchor()))));
      }
    }
  }
  counters_.kernels += kernels_of(p, hash);
  return {};
}

// Kernels an eager pass launches: counted once per structure by recording it (not instantiated).
uint64_t Executor::kernels_of(const exec::Plan& p, uint64_t hash) {
  auto it = eager_kernels_.find(hash);
  if (it != eager_kernels_.end()) return it->second;
  cudaGraph_t graph = nullptr;
  uint64_t kernels = 0, pdl = 0;
  if (!record(p, 0, p.dispatches.size(), false, &graph, &kernels, &pdl).ok()) kernels = p.dispatches.size();
  if (graph) cudaGraphDestroy(graph);
  if (eager_kernels_.size() > 64) eager_kernels_.clear();
  eager_kernels_[hash] = kernels;
  return kernels;
}

// ---- recording -------------------------------------------------------------------------------------

Status Executor::record(const exec::Plan& p, size_t begin, size_t end, bool pdl, cudaGraph_t* out,
                        uint64_t* kernels, uint64_t* pdl_edges, std::string* listing) {
  *out = nullptr;
  *kernels = 0;
  *pdl_edges = 0;
  const AddElapsed count_record{counters_.host_record_ns};
  if (!capture_stream_) LOOM_CUDA_STATUS(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  // cublasSetStream resets the handle's workspace to cuBLAS's own pool: set ours again each time, so
  // cuBLAS never allocates inside a capture and its writes stay inside the range the plan orders.
  void* ws = dev_.cublas_workspace();
  LOOM_CUBLAS_STATUS(cublasSetStream(dev_.cublas(), capture_stream_));
  LOOM_CUBLAS_STATUS(cublasSetWorkspace(dev_.cublas(), ws, dev_.cublas_workspace_size()));
  struct RestoreCublas {
    DeviceContext& dev;
    void* ws;
    ~RestoreCublas() {
      (void)cublasSetStream(dev.cublas(), dev.stream());
      (void)cublasSetWorkspace(dev.cublas(), ws, dev.cublas_workspace_size());
    }
  } restore{dev_, ws};
  LOOM_CUDA_STATUS(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
  // Ends the capture if anything below throws, so the stream is usable again.
  struct EndCaptureOnThrow {
    cudaStream_t stream;
    bool armed = true;
    ~EndCaptureOnThrow() {
      if (!armed) return;
      cudaGraph_t g = nullptr;
      if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
    }
  } end_guard{capture_stream_};
  const LaunchContext base = launch_context(capture_stream_);
  std::vector<std::vector<cudaGraphNode_t>> terminal(end - begin);
  std::vector<cudaGraphNode_t> deps;
  Status failure;
  for (size_t i = begin; i < end && failure.ok(); ++i) {
    deps.clear();
    for (int j : p.deps[i])
      if (static_cast<size_t>(j) >= begin) {
        const auto& t = terminal[static_cast<size_t>(j) - begin];
        deps.insert(deps.end(), t.begin(), t.end());
      }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    cudaGraphEdgeData edge{};
    bool programmatic = false;
    // (an ablated dispatch launches nothing: a programmatic edge left on the capture's dependencies
    // would make the query below fail with cudaErrorLossyQuery)
    if (pdl && first_kernel_waits(p.dispatches[i]) && deps.size() == 1 && p.deps[i].size() == 1 &&
        !is_ablated(p.dispatches[i])) {
      cudaGraphNodeType type{};
      if (cudaGraphNodeGetType(deps[0], &type) == cudaSuccess && type == cudaGraphNodeTypeKernel) {
        edge.from_port = cudaGraphKernelNodePortProgrammatic;
        edge.type = cudaGraphDependencyTypeProgrammatic;
        programmatic = true;
      }
    }
    cudaError_t e = cudaStreamUpdateCaptureDependencies(capture_stream_, deps.data(), programmatic ? &edge : nullptr,
                                                        deps.size(), cudaStreamSetCaptureDependencies);
    if (e != cudaSuccess) {
      failure = to_status(CudaError::runtime(e, "cudaStreamUpdateCaptureDependencies", __FILE__, __LINE__));
      break;
    }
    const CudaError ce = run_dispatch(base, p.dispatches[i]);
    if (!ce.ok()) {
      failure = to_status(ce, fmt::format("recording dispatch {} {}", i, dispatch_name(p.dispatches[i])));
      break;
    }
    cudaStreamCaptureStatus status{};
    const cudaGraphNode_t* now = nullptr;
    size_t n_now = 0;
    e = cudaStreamGetCaptureInfo(capture_stream_, &status, nullptr, nullptr, &now, nullptr, &n_now);
    if (e != cudaSuccess) {
      failure = to_status(CudaError::runtime(e, "cudaStreamGetCaptureInfo", __FILE__, __LINE__));
      break;
    }
    terminal[i - begin].assign(now, now + n_now);
    *pdl_edges += programmatic;
  }
  cudaGraph_t graph = nullptr;
  end_guard.armed = false;
  const cudaError_t end_e = cudaStreamEndCapture(capture_stream_, &graph);
  if (!failure.ok() || end_e != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (!failure.ok()) return failure;
    return to_status(CudaError::runtime(end_e, "cudaStreamEndCapture", __FILE__, __LINE__));
  }
  if (listing) {
    // each dispatch's last kernel: the kernel chosen and its launch shape
    for (size_t i = begin; i < end; ++i)
      for (cudaGraphNode_t node : terminal[i - begin]) {
        cudaKernelNodeParams kp{};
        const char* name = nullptr;
        if (cudaGraphKernelNodeGetParams(node, &kp) != cudaSuccess ||
            cudaFuncGetName(&name, kp.func) != cudaSuccess || !name) {
          (void)cudaGetLastError();
          name = "(a library kernel)";
        }
        *listing += fmt::format("{:5} {:40} {} grid ({},{},{}) block ({},{},{}) smem {}\n", i,
                                dispatch_name(p.dispatches[i]), name, kp.gridDim.x, kp.gridDim.y, kp.gridDim.z,
                                kp.blockDim.x, kp.blockDim.y, kp.blockDim.z, kp.sharedMemBytes);
      }
  }
  size_t n_nodes = 0;
  cudaError_t ge = cudaGraphGetNodes(graph, nullptr, &n_nodes);
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  if (ge == cudaSuccess) ge = cudaGraphGetNodes(graph, nodes.data(), &n_nodes);
  if (ge != cudaSuccess) {
    cudaGraphDestroy(graph);
    return to_status(CudaError::runtime(ge, "cudaGraphGetNodes", __FILE__, __LINE__));
  }
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(n, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel) ++*kernels;
  }
  *out = graph;
  return {};
}

Status Executor::replay(const Cached& c, uint64_t t0) {
  if (aborted())
    return make_error(StatusCode::aborted, "cuda: compute stopped by the abort callback before launch");
  // LOOM_EXEC_GPU_TIME=1: the replay between two events (ExecCounters::device_ns); a failing event call
  // leaves the executor's error as a failing launch does
  static const bool gpu_time = env_int("LOOM_EXEC_GPU_TIME", 0, 0, 1) == 1;
  auto timing = [&](cudaError_t err, const char* what) -> Status {
    if (err == cudaSuccess) return Status{};
    return fail(to_status(CudaError::runtime(err, what, __FILE__, __LINE__), "timing a replay"));
  };
  if (gpu_time && !timing_[1]) {  // both or neither
    cudaEvent_t ev[2] = {nullptr, nullptr};
    for (cudaEvent_t& e : ev) {
      if (const cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
        if (ev[0]) cudaEventDestroy(ev[0]);
        return timing(err, "cudaEventCreate");
      }
    }
    timing_[0] = ev[0];
    timing_[1] = ev[1];
  }
  if (gpu_time) LOOM_TRY(timing(cudaEventRecord(timing_[0], dev_.stream()), "cudaEventRecord"));
  const cudaError_t e = cudaGraphLaunch(c.exec, dev_.stream());
  if (e != cudaSuccess)
    return fail(to_status(CudaError::runtime(e, "cudaGraphLaunch", __FILE__, __LINE__), "replaying a pass"));
  if (gpu_time) LOOM_TRY(timing(cudaEventRecord(timing_[1], dev_.stream()), "cudaEventRecord"));
  ++counters_.graph_replays;
  counters_.kernels += c.kernels;
  counters_.pdl_edges += c.pdl_edges;
  count_plan(c.stats, c.dispatches);  // a replay does the recorded plan's work
  counters_.host_ns += now_ns() - t0;
  LOOM_TRY(sync());
  if (gpu_time) {
    float ms = 0.0f;
    LOOM_TRY(timing(cudaEventElapsedTime(&ms, timing_[0], timing_[1]), "cudaEventElapsedTime"));
    counters_.device_ns += static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
    ++counters_.device_timed;
  }
  return {};
}

Status Executor::run_new_structure(const exec::Plan& p, const StructureKey& key, uint64_t hash,
                                   const ExecOptions& o) {
  const bool pdl = o.pdl && dev_.info().cc_major >= 9;
  if (seen_.count(hash)) {
    // Second sighting: the structure repeats, so record it whole once and replay it from now on.
    cudaGraph_t graph = nullptr;
    Cached c;
    c.dispatches = p.dispatches.size();
    c.stats = p.stats;
    const char* dump = std::getenv("LOOM_EXEC_DUMP");
    std::string listing;
    LOOM_TRY(fail(record(p, 0, p.dispatches.size(), pdl, &graph, &c.kernels, &c.pdl_edges,
                         dump && *dump ? &listing : nullptr)));
    if (dump && *dump)
      std::ofstream(fmt::format("{}-graph-{}.kernels.txt", dump, n_graph_dumps_++))
          << "dispatch label kernel launch (the last kernel of each dispatch)\n" << listing;
    Status s = instantiate_and_cache(graph, key, exec::options_word(o), c);
    cudaGraphDestroy(graph);
    LOOM_TRY(fail(s));
    if (aborted()) return make_error(StatusCode::aborted, "cuda: compute stopped by the abort callback before launch");
    const Cached* cached = cache_.front();
    const cudaError_t e = cudaGraphLaunch(cached->exec, dev_.stream());
    if (e != cudaSuccess)
      return fail(to_status(CudaError::runtime(e, "cudaGraphLaunch", __FILE__, __LINE__), "first launch of a pass"));
    counters_.kernels += cached->kernels;
    counters_.pdl_edges += cached->pdl_edges;
    return {};
  }
  // First sighting: launched eagerly, dispatch by dispatch. A structure seen once (a serving step
  // whose running sequences or prompt chunk changed) is then never instantiated (its kernels are
  // counted by a capture after the launches, while the device runs them): 64 streams on 8B Q4_K_M
  // (H200), the steps with a prompt chunk 4.03 -> 3.60 s in all, time to first token p50 2.10 ->
  // 1.87 s. LOOM_EXEC_FIRST_EAGER=0: chunk graphs instead, each launched as soon as it is recorded
  // while the next is recorded.
  if (seen_.size() > 256) seen_.clear();
  seen_.insert(hash);
  static const bool first_eager = env_switch("LOOM_EXEC_FIRST_EAGER");
  if (first_eager) return run_eager(p, hash);
  const std::vector<size_t> chunks = chunk_bounds(p.dispatches.size(), o.n_cb);
  std::vector<cudaGraphExec_t> launched;
  Status result;
  for (size_t c = 0; c + 1 < chunks.size() && result.ok(); ++c) {
    if (aborted()) {
      result = make_error(StatusCode::aborted, "cuda: compute stopped by the abort callback after {} of {} dispatches",
                          chunks[c], p.dispatches.size());
      break;
    }
    cudaGraph_t graph = nullptr;
    uint64_t kernels = 0, pdl_edges = 0;
    result = record(p, chunks[c], chunks[c + 1], pdl, &graph, &kernels, &pdl_edges);
    if (!result.ok()) break;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = [&] {
      const AddElapsed count_inst{counters_.host_instantiate_ns};
      return cudaGraphInstantiate(&exec, graph, 0);
    }();
    cudaGraphDestroy(graph);
    if (e == cudaSuccess) {
      launched.push_back(exec);
      e = cudaGraphLaunch(exec, dev_.stream());
    }
    if (e != cudaSuccess) {
      result = to_status(CudaError::runtime(e, "cudaGraphInstantiate/cudaGraphLaunch", __FILE__, __LINE__),
                         fmt::format("chunk {} of a new pass", c));
      break;
    }
    ++counters_.chunk_graphs;
    counters_.kernels += kernels;
    counters_.pdl_edges += pdl_edges;
  }
  // The chunks' executable graphs may be destroyed only once they have run.
  const Status s = sync();
  for (cudaGraphExec_t e : launched) cudaGraphExecDestroy(e);
  --counters_.host_syncs;  // compute_locked's final sync is the same wait
  if (!result.ok()) return result.code() == StatusCode::aborted ? result : fail(result);
  return s;
}

namespace {

// Whether a kernel node of the graph launches thread-block clusters (a cluster dimension above 1).
bool graph_has_clusters(cudaGraph_t graph) {
  size_t n = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // unknown: as if it had (the caller then instantiates afresh)
  }
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0 && cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) continue;
    cudaLaunchAttributeValue v{};
    if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &v) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (v.clusterDim.x * v.clusterDim.y * v.clusterDim.z > 1) return true;
  }
  (void)cudaGetLastError();
  return false;
}

}  // namespace

Status Executor::instantiate_and_cache(cudaGraph_t graph, const StructureKey& key, uint64_t options,
                                       Cached c) {
  const AddElapsed count_inst{counters_.host_instantiate_ns};
  c.clusters = graph_has_clusters(graph);
  if (cache_.full()) {
    // Reuse the least recently used executable graph: update it in place when the topology allows,
    // and neither graph has cluster launches (cudaGraphExecUpdate is reported to keep an executable
    // graph's old cluster dimensions: ml-explore/mlx#2813).
    const Cached old = cache_.take_oldest();
    cudaGraphExecUpdateResultInfo info{};
    if (!c.clusters && !old.clusters && cudaGraphExecUpdate(old.exec, graph, &info) == cudaSuccess) {
      c.exec = old.exec;
      ++counters_.graph_updates;
      cache_.insert(key, options, c);
      return {};
    }
    (void)cudaGetLastError();
    cudaGraphExecDestroy(old.exec);
  }
  LOOM_CUDA_STATUS(cudaGraphInstantiate(&c.exec, graph, 0));
  ++counters_.graph_builds;
  cache_.insert(key, options, c);
  return {};
}

// ---- tracing -----------------------------------------------------------------------------------------

Status Executor::run_traced(const exec::Plan& p, const std::string& path, uint64_t t0) {
  const size_t n = p.dispatches.size();
  std::vector<cudaEvent_t> start(n, nullptr), stop(n, nullptr);
  struct Events {
    std::vector<cudaEvent_t>& a;
    std::vector<cudaEvent_t>& b;
    ~Events() {
      for (cudaEvent_t e : a)
        if (e) cudaEventDestroy(e);
      for (cudaEvent_t e : b)
        if (e) cudaEventDestroy(e);
    }
  } cleanup{start, stop};
  for (size_t i = 0; i < n; ++i) {
    LOOM_CUDA_STATUS(cudaEventCreate(&start[i]));
    LOOM_CUDA_STATUS(cudaEventCreate(&stop[i]));
  }
  const LaunchContext base = launch_context(dev_.stream());
  size_t done = 0;
  bool stopped = false;
  for (size_t i = 0; i < n; ++i) {
    if (aborted()) {
      stopped = true;
      break;
    }
    LOOM_CUDA_STATUS(cudaEventRecord(start[i], dev_.stream()));
    const CudaError e = run_dispatch(base, p.dispatches[i]);
    if (!e.ok()) {
      if (cudaStreamSynchronize(dev_.stream()) != cudaSuccess) (void)cudaGetLastError();
      return fail(to_status(e, fmt::format("dispatch {} {}", i, dispatch_name(p.dispatches[i]))));
    }
    LOOM_CUDA_STATUS(cudaEventRecord(stop[i], dev_.stream()));
    ++done;
  }
  counters_.host_ns += now_ns() - t0;
  LOOM_TRY(sync());
  if (stopped)
    return make_error(StatusCode::aborted, "cuda: compute stopped by the abort callback after {} of {} dispatches",
                      done, n);
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", 0},
                    {"args", {{"name", fmt::format("cuda{} stream", dev_.ordinal())}}}});
  double total_us = 0.0;
  for (size_t i = 0; i < done; ++i) {
    const exec::Dispatch& d = p.dispatches[i];
    float begin_ms = 0.0f, dur_ms = 0.0f;
    LOOM_CUDA_STATUS(cudaEventElapsedTime(&begin_ms, start[0], start[i]));
    LOOM_CUDA_STATUS(cudaEventElapsedTime(&dur_ms, start[i], stop[i]));
    json nodes = json::array(), ops = json::array();
    for (const Tensor* t : d.nodes)
      if (t) {
        nodes.push_back(describe(*t));
        ops.push_back(op_name(t->op));
      }
    events.push_back({{"name", dispatch_name(d)},
                      {"cat", d.kind == FusedKind::none ? op_name(d.node()->op) : fused_kind_name(d.kind)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", 0},
                      {"ts", begin_ms * 1000.0},
                      {"dur", dur_ms * 1000.0},
                      {"args",
                       {{"dispatch", i},
                        {"ops", ops},
                        {"nodes", nodes},
                        {"shape", shape_string(d.anchor()->ne)},
                        {"type", dtype_name(d.anchor()->type)}}}});
    total_us += dur_ms * 1000.0;
  }
  const json doc = {{"traceEvents", events},
                    {"displayTimeUnit", "ns"},
                    {"otherData",
                     {{"device", dev_.info().name},
                      {"options", exec_options_string(options_)},
                      {"n_dispatches", n},
                      {"n_graph_nodes", p.stats.graph_nodes},
                      {"sum_dispatch_gpu_us", total_us}}}};
  std::ofstream file(path);
  file << doc.dump(1) << '\n';
  std::ofstream dot(path + ".dot");
  dot << p.dot();
  if (!file || !dot)
    return make_error(StatusCode::io_error, "cuda: cannot write the trace to '{}': {}", path, std::strerror(errno));
  return {};
}

}  // namespace loom::cuda
