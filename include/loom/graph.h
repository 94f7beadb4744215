// Graph builder: op functions validate their operands and append nodes.
//
// Errors never abort. An op that rejects its operands records the first error in the graph and
// returns nullptr; every later op given a nullptr returns nullptr too, so model code builds the
// whole pass and checks `graph.status()` once at the end.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "loom/status.h"
#include "loom/tensor.h"

namespace loom {

/// The exact structure of an allocated graph (exec::structure_key builds it): 64-bit words encoding
/// every node's op, type, flags, shape, strides, address, parameters and operands (names excluded),
/// and their hash. Equal words: the same kernels with the same arguments.
struct StructureKey {
  uint64_t hash = 0;
  std::vector<uint64_t> words;
};

/// A forward pass: leafs (weights, inputs) and nodes in a topological order (creation order).
class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// New leaf. Its memory is set later (by an allocator or by binding to a buffer).
  Tensor* new_tensor(DType type, const Shape& ne, std::string name = {}, uint32_t flags = 0);
  Tensor* input(DType type, const Shape& ne, std::string name) {
    return new_tensor(type, ne, std::move(name), kTensorInput);
  }
  Tensor* weight(DType type, const Shape& ne, std::string name) {
    return new_tensor(type, ne, std::move(name), kTensorWeight);
  }
  /// Keeps `t` alive to the end of compute and records it as a result.
  void mark_output(Tensor* t);

  const std::vector<Tensor*>& nodes() const { return nodes_; }
  const std::vector<Tensor*>& leafs() const { return leafs_; }
  const std::vector<Tensor*>& outputs() const { return outputs_; }
  /// First error recorded by an op, or ok.
  const Status& status() const { return status_; }

  /// Records `s` (first error wins) and returns nullptr. Used by op functions.
  Tensor* fail(Status s);
  /// Appends a node computed by `op` from `srcs`; shape/type already validated by the caller.
  Tensor* add_node(OpKind op, DType type, const Shape& ne, std::initializer_list<Tensor*> srcs);
  /// Appends a view node over `src`'s memory with explicit strides.
  Tensor* add_view(Tensor* src, const Shape& ne, const std::array<size_t, kMaxDims>& nb,
                   size_t offset);

  /// Attaches the key of the graph's final structure, for a graph computed many times as it is: a
  /// backend that caches per structure then skips encoding it each compute. Set it after the
  /// tensors are bound; adding a node, leaf or output clears it, and whoever rebinds or edits a
  /// tensor afterwards must clear it (set_structure_key({})) or set it again.
  void set_structure_key(std::optional<StructureKey> key) { structure_key_ = std::move(key); }
  /// The attached key, or nullptr.
  const StructureKey* structure_key() const { return structure_key_ ? &*structure_key_ : nullptr; }

 private:
  std::deque<Tensor> storage_;
  std::vector<Tensor*> nodes_;
  std::vector<Tensor*> leafs_;
  std::vector<Tensor*> outputs_;
  Status status_;
  std::optional<StructureKey> structure_key_;
};

// ---- op parameters (stored in Tensor::params) ----------------------------------------------------

struct ScaleParams { float scale; float bias; };
struct NormParams { float eps; };
enum class RopeMode : int32_t { normal = 0, neox = 2 };
/// Rotary embedding. theta_i = pos * freq_base^(-2i/n_dims) / freq_factor_i, then linear scaling
/// (freq_scale) blended with extrapolation by YaRN's ramp when ext_factor > 0.
struct RopeParams {
  int32_t n_dims;          ///< leading dims of each head that rotate (<= head size, even)
  RopeMode mode;
  int32_t n_ctx_orig;      ///< training context, for YaRN's correction range
  float freq_base;
  float freq_scale;        ///< 1 / linear scaling factor
  float ext_factor;        ///< YaRN extrapolation mix (0 disables YaRN)
  float attn_factor;       ///< magnitude scale
  float beta_fast;
  float beta_slow;
  /// 1: YaRN's correction range is used as computed, not widened to whole dims (floor of the fast
  /// bound, ceil of the slow one) as GGUF runtimes do; Hugging Face's `truncate: false` (gpt-oss).
  int32_t yarn_unrounded;
};
struct SoftMaxParams { float scale; };
struct FlashAttnParams { float scale; float softcap; };  ///< softcap 0 disables
struct SoftcapParams { float cap; };
/// gpt-oss's gated activation (see swiglu_oai()).
struct SwigluOaiParams {
  float alpha;
  float limit;
};
struct TopKParams { int32_t k; };
/// One row's settings for sample_tokens(): kSampleParamWords i32 words per row (floats and the
/// double stored as their bits, so the host's values arrive exactly).
enum SampleParamWord : int32_t {
  kSampleTopK = 0,         ///< the row's top-k (1..candidates); its first top_k candidates are used
  kSampleTemperature = 1,  ///< float; <= 0: greedy (the best candidate)
  kSampleTopP = 2,         ///< float; >= 1: off
  kSampleMinP = 3,         ///< float; <= 0: off
  kSampleLogMinP = 4,      ///< float: std::log(min_p), computed by the host as its sampler does
  kSampleMinKeep = 5,      ///< top-p and min-p keep at least max(1, min_keep) tokens
  kSampleUniformLo = 6,    ///< low word of the double in [0, 1) that picks the token
  kSampleUniformHi = 7,    ///< high word
  kSampleParamWords = 8,
};
struct ConcatParams { int32_t dim; };
class Communicator;
struct AllReduceParams {
  Communicator* comm;
};

// ---- views -----------------------------------------------------------------------------------------

/// View with explicit shape, strides (nb[1..3]; nb[0] is the type size) and byte offset.
Tensor* view(Graph& g, Tensor* a, const Shape& ne, const std::array<size_t, kMaxDims>& nb,
             size_t offset);
/// Same elements, new shape; `a` must be contiguous.
Tensor* reshape(Graph& g, Tensor* a, const Shape& ne);
/// Dimension i of `a` becomes dimension axes[i] of the result.
Tensor* permute(Graph& g, Tensor* a, int ax0, int ax1, int ax2, int ax3);
/// Swaps dims 0 and 1.
Tensor* transpose(Graph& g, Tensor* a);
/// Packed copy of `a` (same type).
Tensor* cont(Graph& g, Tensor* a);

// ---- ops ---------------------------------------------------------------------------------------------

/// Rows of `a` ([n, rows, a2, a3], any type) picked by `idx` (i32 [k, a2, a3]) -> f32 [n, k, a2, a3].
Tensor* get_rows(Graph& g, Tensor* a, Tensor* idx);
/// Elementwise f32 ops; `b` broadcasts over `a` (a.ne[i] % b.ne[i] == 0).
Tensor* add(Graph& g, Tensor* a, Tensor* b);
Tensor* sub(Graph& g, Tensor* a, Tensor* b);
Tensor* mul(Graph& g, Tensor* a, Tensor* b);
Tensor* div(Graph& g, Tensor* a, Tensor* b);
/// a * s + bias.
Tensor* scale(Graph& g, Tensor* a, float s, float bias = 0.0f);
/// x / sqrt(mean(x^2) + eps) over dim 0.
Tensor* rms_norm(Graph& g, Tensor* a, float eps);
/// (x - mean) / sqrt(var + eps) over dim 0.
Tensor* norm(Graph& g, Tensor* a, float eps);
/// a: [k, m, a2, a3] any type (rows contiguous); b: f32 [k, n, b2, b3] with b2 % a2 == 0 and
/// b3 % a3 == 0 -> f32 [m, n, b2, b3]: result[i, j] = dot(a row i, b row j). Broadcast groups
/// consecutive batches: b's batch i2 uses a's batch i2 / (b2 / a2) (so query heads share key heads as
/// in grouped-query attention); likewise for dim 3.
Tensor* mul_mat(Graph& g, Tensor* a, Tensor* b);
/// Expert-routed mul_mat. as: [k, m, n_expert]; b: f32 [k, 1 or n_used, n_tokens];
/// ids: i32 [n_used, n_tokens] -> f32 [m, n_used, n_tokens] with out[:, e, t] = as[ids[e,t]] * b[:, e or 0, t].
Tensor* mul_mat_id(Graph& g, Tensor* as, Tensor* b, Tensor* ids);
/// a: f32 [head_dim, n_head, n_tokens]; pos: i32 [n_tokens]; freq_factors: optional f32 [n_dims/2].
Tensor* rope(Graph& g, Tensor* a, Tensor* pos, Tensor* freq_factors, const RopeParams& p);
/// softmax(a * scale + mask) over dim 0; mask (f32 or f16, [ne0, >= ne1], broadcast over dims 2-3) optional.
Tensor* soft_max(Graph& g, Tensor* a, Tensor* mask, float scale);
/// softmax(softcap(q k^T * scale) + mask) v. q: f32 [d, n_q, n_head]; k: f32/f16 [d, n_kv, n_head_kv];
/// v: f32/f16 [dv, n_kv, n_head_kv]; mask: optional f32/f16 [n_kv, >= n_q]. -> f32 [dv, n_head, n_q].
/// sinks: optional f32 [n_head], one logit per head that joins every softmax denominator as a key
/// without a value (gpt-oss's attention sinks): out = sum_j e^{s_j} v_j / (sum_j e^{s_j} + e^{sink}).
Tensor* flash_attn(Graph& g, Tensor* q, Tensor* k, Tensor* v, Tensor* mask, float scale, float softcap = 0.0f,
                   Tensor* sinks = nullptr);
Tensor* silu(Graph& g, Tensor* a);
/// GELU, tanh approximation.
Tensor* gelu(Graph& g, Tensor* a);
/// GELU, exact (erf).
Tensor* gelu_erf(Graph& g, Tensor* a);
/// silu(gate) * up.
Tensor* swiglu(Graph& g, Tensor* gate, Tensor* up);
/// gelu(gate) * up (tanh form).
Tensor* geglu(Graph& g, Tensor* gate, Tensor* up);
/// gpt-oss's clamped SwiGLU: with g = min(gate, limit) and u = clamp(up, -limit, limit),
/// g * sigmoid(alpha * g) * (u + 1). A NaN stays NaN (the clamps do not swallow it).
Tensor* swiglu_oai(Graph& g, Tensor* gate, Tensor* up, float alpha, float limit);
/// cap * tanh(a / cap).
Tensor* softcap(Graph& g, Tensor* a, float cap);
/// Index of the largest element of each row -> i32 [ne1, ne2, ne3].
Tensor* argmax(Graph& g, Tensor* a);
/// Indices of the k largest elements of each row, largest first -> i32 [k, ne1, ne2, ne3].
Tensor* top_k(Graph& g, Tensor* a, int k);
/// Samples one token per row of `logits` (f32 [n_vocab, n_rows]) exactly as loom::Sampler's chain
/// does after penalties (top-k -> top-p -> min-p -> temperature -> draw, sample.h), from
/// `candidates` (i32 [K, n_rows]: top_k(logits, K), best first, lower id first on ties) and `params`
/// (i32 [kSampleParamWords, n_rows], SampleParamWord) -> i32 [n_rows]: the token, or -1 when the row
/// holds a NaN or +inf logit or no finite candidate (the host sampler then reports why).
Tensor* sample_tokens(Graph& g, Tensor* logits, Tensor* candidates, Tensor* params);
/// Writes rows of src (f32 [n, r, s2, s3]) into dst (any type, [n, R, s2, s3]) at rows idx
/// (i32 [r, i2, i3], broadcast over dims 2-3). Returns a view of dst that carries the write.
Tensor* set_rows(Graph& g, Tensor* dst, Tensor* src, Tensor* idx);
/// Copies src into dst (same element count, converting dtype). Returns a view of dst.
Tensor* cpy(Graph& g, Tensor* src, Tensor* dst);
/// Packed copy of `a` converted to `type`.
Tensor* convert(Graph& g, Tensor* a, DType type);
/// Joins a and b along `dim`; other dims equal; same non-quantized type.
Tensor* concat(Graph& g, Tensor* a, Tensor* b, int dim);
/// Sum over dim 0 -> f32 [1, ne1, ne2, ne3].
Tensor* sum_rows(Graph& g, Tensor* a);
/// Elementwise sum of `a` (contiguous f32) over the ranks of `comm` (tensor parallelism): every rank
/// runs the same graph with its own share and gets the same sum. `comm` must outlive the graph and
/// belong to the backend kind that computes it (a host group on the CPU, NCCL on CUDA).
Tensor* all_reduce(Graph& g, Tensor* a, Communicator* comm);

}  // namespace loom
