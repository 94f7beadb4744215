// The architecture interface: each decoder family (one llm_arch_*.cpp per family) declares which
// GGUF tensors it needs and builds one forward pass from the shared graph helpers of StepBuilder.
#pragma once

#include <string>
#include <vector>

#include "loom/graph.h"
#include "loom/llm.h"

namespace loom::llm::detail {

class KvCache;

/// Weights of one block; optional ones are nullptr when the file lacks them.
struct LayerWeights {
  Tensor* attn_norm = nullptr;
  Tensor* wq = nullptr;
  Tensor* wk = nullptr;
  Tensor* wv = nullptr;
  Tensor* wo = nullptr;
  Tensor* wqkv =
      nullptr;  // fused projection, query rows then key rows then value rows (phi3), instead of wq/wk/wv
  Tensor* bq = nullptr;  // biases (qwen2; optional for llama)
  Tensor* bk = nullptr;
  Tensor* bv = nullptr;
  Tensor* bo = nullptr;
  Tensor* q_norm = nullptr;  // per-head RMS norm of queries and keys (qwen3, gemma3)
  Tensor* k_norm = nullptr;
  Tensor* attn_post_norm = nullptr;  // norm of the attention output before the residual add (gemma)
  Tensor* ffn_norm = nullptr;
  Tensor* ffn_gate = nullptr;
  Tensor* ffn_up = nullptr;
  Tensor* ffn_down = nullptr;
  Tensor* ffn_gate_up =
      nullptr;  // fused [n_embd, 2 n_ff]: gate rows then up rows (phi3), instead of ffn_gate/ffn_up
  Tensor* ffn_post_norm = nullptr;  // norm of the FFN output before the residual add (gemma)
  // Mixture of experts: router [n_embd, n_expert] and stacked experts.
  Tensor* ffn_gate_inp = nullptr;
  Tensor* ffn_gate_exps = nullptr;  // [n_embd, n_ff_exp, n_expert]
  Tensor* ffn_up_exps = nullptr;    // [n_embd, n_ff_exp, n_expert]
  Tensor* ffn_down_exps = nullptr;  // [n_ff_exp, n_embd, n_expert]
  // gpt-oss: the router's bias [n_expert] and each expert's output biases, one row per expert
  Tensor* ffn_gate_inp_b = nullptr;
  Tensor* ffn_gate_exps_b = nullptr;  // [n_ff_exp, n_expert]
  Tensor* ffn_up_exps_b = nullptr;    // [n_ff_exp, n_expert]
  Tensor* ffn_down_exps_b = nullptr;  // [n_embd, n_expert]
  Tensor* attn_sinks = nullptr;       // f32 [n_head]: gpt-oss's per-head logit in every softmax denominator
  // The model's rope_freqs in this layer's memory: the loader sets it for every layer (a copy on the
  // offload backend for offloaded layers), since a graph may only read its own backend's memory.
  Tensor* rope_freqs = nullptr;
  Tensor* rope_freqs_long = nullptr;  // likewise for ModelWeights::rope_freqs_long
};

struct ModelWeights {
  Tensor* tok_embd = nullptr;     // [n_embd, n_vocab]
  Tensor* output_norm = nullptr;  // [n_embd]
  // [n_embd, n_vocab]; tok_embd when the file ties them, unless the head is offloaded (then a copy)
  Tensor* output = nullptr;
  // [n_rot/2] frequency divisors, optional: Llama 3.1's, or Phi-3 LongRoPE's short factors
  Tensor* rope_freqs = nullptr;
  // Phi-3 LongRoPE's factors for contexts beyond the original one (used instead of rope_freqs when
  // the context has more cells than n_ctx_orig)
  Tensor* rope_freqs_long = nullptr;
  std::vector<LayerWeights> layers;
};

/// What a weight must be: a matrix may have any type Loom can multiply; vectors (norms, biases,
/// frequency factors) must be f32 because elementwise ops take f32 only.
enum class WeightKind { matrix, vector };

/// Finds tensors in the model file, checks them and makes weight tensors for them. The first
/// problem is recorded (later calls return nullptr) so an architecture declares everything and the
/// loader checks status() once, like Graph.
class TensorLoader {
 public:
  virtual ~TensorLoader() = default;
  /// The tensor `name` with exactly shape `ne`; a missing one is an error.
  virtual Tensor* require(const std::string& name, const Shape& ne, WeightKind kind) = 0;
  /// As require, but nullptr without error when the file lacks it.
  virtual Tensor* optional(const std::string& name, const Shape& ne, WeightKind kind) = 0;
  /// "blk.{il}.{what}.weight"-style names.
  static std::string layer_name(int il, const char* what) { return "blk." + std::to_string(il) + "." + what; }
};

/// Inputs of a forward pass; set on the host before compute. Those a pass's layer range does not
/// need are nullptr.
struct StepInputs {
  Tensor* tokens = nullptr;     // i32 [n_tokens]; passes that start at layer 0
  Tensor* hidden = nullptr;     // f32 [n_embd, n_tokens]: the residual stream entering a later first layer
  Tensor* positions = nullptr;  // i32 [n_tokens]
  Tensor* kv_cells = nullptr;   // i32 [n_tokens]: cache cell each token's K and V go to
  // f32 [n_kv, n_q, 1, n_seqs]: 0 where a query sees a key slot, -inf elsewhere. A slot is a cell
  // (reading the cache prefix) or the j-th cell of the query's sequence (gathering).
  Tensor* kq_mask = nullptr;
  // As kq_mask, also -inf beyond the sliding window; only with local layers. Over the window cells
  // ([n_kv_swa, n_q, 1, n_seqs]) when the cache has a ring for them.
  Tensor* kq_mask_swa = nullptr;
  Tensor* kv_cells_swa = nullptr;  // i32 [n_tokens]: window cell of each token (local layers, windowed cache)
  // i32 [n_kv_swa * n_head_kv * n_seqs]: as kv_gather over the window cells (rows h * n_window_cells +
  // cell), when a gathering pass's cache has a ring; kv_gather_swa_chunk likewise for a mixed pass's chunk.
  Tensor* kv_gather_swa = nullptr;
  Tensor* kv_gather_swa_chunk = nullptr;
  // i32 [n_kv * n_head_kv * n_seqs] when gathering: for slot j of kv head h of sequence s, the row
  // h * n_cells + cell of the cache viewed as [head_dim, n_cells * n_head_kv] (K and V alike).
  Tensor* kv_gather = nullptr;
  // A mixed pass (StepShape::n_chunk > 0) attends in two groups: the prompt chunk, with these
  // (kq_mask_chunk [n_kv_chunk, n_chunk, 1, 1], kq_mask_swa_chunk likewise on local layers,
  // kv_gather_chunk [n_kv_chunk * n_head_kv]), and the one-token sequences, with the ones above
  // (n_q 1, n_seqs - 1 sequences).
  Tensor* kq_mask_chunk = nullptr;
  Tensor* kq_mask_swa_chunk = nullptr;
  Tensor* kv_gather_chunk = nullptr;
  // Tensor parallelism splits the token embeddings by vocabulary: `tokens` holds each token's row in
  // the rank's slice (0 when the token is another rank's), and this f32 [1, n_tokens] is 1 where the
  // token is the rank's, 0 elsewhere, so the ranks' masked rows all-reduce to the token's embedding.
  Tensor* embd_mask = nullptr;
};

/// Shape of one forward pass.
struct StepShape {
  int n_tokens = 1;          // all sequences' tokens: n_seqs runs of n_tokens / n_seqs
  int n_kv = 1;              // key slots attention reads per sequence: cells [0, n_kv), or gathered
  bool all_outputs = false;  // logits for every token, else only the last of each sequence
  int n_seqs = 1;            // sequences of the step, equal runs each (one token, or a packed pass's prompts)
  bool gather = false;       // each sequence's cells gathered (kv_gather), not the cache prefix read
  // Window slots local layers read when the cache keeps a ring for them: cells [0, n_kv_swa), or
  // with gather each sequence's window cells (n_kv_swa_chunk for a mixed pass's chunk); 0: they
  // read like the global layers.
  int n_kv_swa = 0;
  // A mixed pass: the first sequence brings n_chunk > 1 tokens (a prompt chunk), each of the other
  // n_seqs - 1 one token (decode steps); gather only. The chunk reads n_kv_chunk slots, the others
  // n_kv. 0: every sequence brings n_tokens / n_seqs.
  int n_chunk = 0;
  int n_kv_chunk = 0;
  int n_kv_swa_chunk = 0;
  // > 0: the last segment samples each output row on the device from its sample_k best logits
  // (ContextImpl appends top_k and sample_tokens after the model's graph).
  int sample_k = 0;

  bool operator==(const StepShape&) const = default;
  /// Sequences that bring one token each in a mixed pass (the decode group).
  int n_decode() const { return n_chunk > 0 ? n_seqs - 1 : n_seqs; }
};

/// The layers one graph runs: a model split between two backends is run as two graphs, the first
/// from the embeddings to the hidden state after its layers, the second from that hidden state
/// (an input) to the logits.
struct StepRange {
  int layer_begin = 0;
  int layer_end = -1;  // one past the last layer; -1: n_layer
};

/// Tensor parallelism in a pass: the rank whose shard of the weights and KV cache it runs, and the
/// communicator of its all-reduces (nullptr: the model is not split).
struct TensorSplit {
  Communicator* comm = nullptr;
  int rank = 0;
};

/// Graph helpers shared by the architectures. Ops record errors in the graph (nullptr propagates).
///
/// Every node a pass builds is named after llama.cpp's intermediates: "blk.{il}.{what}" inside layer
/// il (blk.3.attn_q, blk.3.ffn_down), plain names outside (inp_embd, result_norm, result_output). A
/// helper's result carries the name it is given; the nodes inside it "{name}.{op}" (the rms_norm
/// under blk.3.attn_norm is blk.3.attn_norm.rms_norm); views carry their source's name + " (view)".
/// Names reach graph dumps, traces and error messages; they do not enter the structure key.
class StepBuilder {
 public:
  StepBuilder(Graph& g, const HParams& hp, const ModelWeights& w, KvCache& kv, RopeMode rope_mode,
              const StepShape& shape, const StepRange& range = {}, const TensorSplit& split = {});

  Graph& graph() { return g_; }
  const HParams& hparams() const { return hp_; }
  const ModelWeights& weights() const { return w_; }
  const StepInputs& inputs() const { return in_; }
  int n_tokens() const { return shape_.n_tokens; }
  /// The layers this pass runs: [layer_begin(), layer_end()).
  int layer_begin() const { return layer_begin_; }
  int layer_end() const { return layer_end_; }

  /// Names `t` "blk.{il}.{what}", or `what` when il < 0; returns `t`.
  static Tensor* name(Tensor* t, const char* what, int il = -1);

  /// Token embeddings: f32 [n_embd, n_tokens].
  Tensor* embed();
  /// The residual stream entering layer_begin(): the token embeddings times `embed_scale` when the
  /// pass starts at layer 0, else the hidden-state input.
  Tensor* stream_in(float embed_scale = 1.0f);
  /// What the pass returns from the residual stream after its last layer: the logits when that is
  /// the model's last layer, else the stream itself (every token's row) for the next backend.
  Tensor* stream_out(Tensor* x);
  /// rms_norm over dim 0, times `weight` (broadcast); named `what` (see name()).
  Tensor* rms_norm(Tensor* x, Tensor* weight, const char* what, int il = -1);
  /// w x (+ bias): [k, n] -> [m, n]; named `what`.
  Tensor* linear(Tensor* w, Tensor* x, Tensor* bias, const char* what, int il = -1);
  /// A product that sums over heads or FFN columns (attention output, FFN down): with tensor
  /// parallelism each rank holds those columns of w, so its product is a partial sum that the
  /// ranks all-reduce before the bias is added once. Without, linear().
  Tensor* linear_reduce(Tensor* w, Tensor* x, Tensor* bias, const char* what, int il = -1);
  /// The sum of `x` over the tensor-parallel ranks (x itself when not split); named "{what}_sum".
  Tensor* reduce(Tensor* x, const char* what, int il = -1);
  /// [head_dim * n_heads, n_tokens] -> [head_dim, n_heads, n_tokens].
  Tensor* split_heads(Tensor* x, int64_t head_dim, int64_t n_heads);
  /// Queries, keys and values of layer `il` from its normed input `h`, each [head_dim, n_heads, n_tokens]:
  /// three projections (with their biases when present), or views of one fused wqkv product.
  struct Qkv {
    Tensor* q;
    Tensor* k;
    Tensor* v;
  };
  Qkv project_qkv(const LayerWeights& l, Tensor* h, int il);
  /// Rotary embedding of layer `il` at the step's positions, in the architecture's mode: local
  /// (sliding-window) layers use rope_freq_base_swa and no frequency scaling. Named `what`.
  Tensor* rope(Tensor* x, int il, const char* what);
  /// Stores k and v ([head_dim, n_head_kv, n_tokens]) in layer `il`'s cache cells, then attends
  /// with q ([head_dim, n_head, n_tokens]) over n_kv key slots per sequence -> [head_dim_v * n_head,
  /// n_tokens]: the first n_kv cells, or each sequence's own cells gathered (StepShape::gather) into
  /// [head_dim, n_kv, n_head_kv, n_seqs], one flash_attn over all sequences (dim 3).
  /// Uses the model's query scale and attention soft-cap, the sliding-window mask on local layers, and
  /// the layer's attention sinks when it has them. In a mixed pass (StepShape::n_chunk) the chunk's
  /// queries and the one-token sequences' attend in two flash_attns (each group as it would alone),
  /// joined along the tokens.
  Tensor* attention(int il, Tensor* q, Tensor* k, Tensor* v);
  /// SwiGLU feed-forward of layer `il`: down(silu(gate x) * up x); with ffn_gate_up, gate and up are
  /// the two halves of one product.
  Tensor* ffn_swiglu(const LayerWeights& l, Tensor* x, int il);
  /// GeGLU feed-forward (GELU, tanh form) of layer `il`: down(gelu(gate x) * up x).
  Tensor* ffn_geglu(const LayerWeights& l, Tensor* x, int il);
  /// Mixture-of-experts SwiGLU feed-forward: softmax router, top n_expert_used experts, their
  /// weights renormalized (expert_weights_norm), weighted sum of the experts' outputs. Routing stays
  /// on the device. x: [n_embd, n_tokens] -> [n_embd, n_tokens]. gpt-oss's variant (HParams
  /// expert_softmax_topk, swiglu_oai_limit and the layer's biases): a biased router whose top logits
  /// are softmaxed among themselves, each chosen expert's bias rows added to its products, and the
  /// clamped SwiGLU.
  Tensor* ffn_moe(const LayerWeights& l, Tensor* x, int il);
  /// The rows whose logits are wanted: the last token's (each sequence's: every row when the step
  /// has several sequences of one token; in a mixed pass the chunk's last row and the one-token
  /// sequences' rows after it) unless all outputs were asked for.
  Tensor* select_outputs(Tensor* x);
  /// Final norm, output projection and soft-cap (final_softcap) -> logits f32 [n_vocab, n_outputs].
  Tensor* logits(Tensor* x);

 private:
  // One flash_attn over `n_seqs` sequences of `n_q` queries each (q: [head_dim, n_head, n_q *
  // n_seqs]) reading n_kv key slots per sequence: the first n_kv cells of the stores, or the rows
  // `gather_rows` picks -> [head_dim_v * n_head, n_q * n_seqs].
  Tensor* attend(int il, Tensor* q, Tensor* k_stored, Tensor* v_stored, Tensor* mask, Tensor* gather_rows,
                 int64_t n_kv, int64_t n_q, int64_t n_seqs);

  Graph& g_;
  const HParams& hp_;
  const ModelWeights& w_;
  KvCache& kv_;
  RopeParams rope_;
  RopeParams rope_swa_;  // local layers
  bool rope_long_ = false;  // rope_freqs_long instead of rope_freqs (a context beyond n_ctx_orig)
  StepShape shape_;
  TensorSplit split_;
  int layer_begin_ = 0;
  int layer_end_ = 0;
  StepInputs in_;
};

/// One decoder family.
class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual Arch arch() const = 0;
  virtual RopeMode rope_mode() const = 0;
  /// Declares the family's tensors through `tl`.
  virtual void declare_weights(TensorLoader& tl, const HParams& hp, ModelWeights& w) const = 0;
  /// Builds one forward pass over the builder's layer range (StepBuilder::stream_in / stream_out);
  /// returns the logits, or the hidden state when the range stops short of the last layer (nullptr
  /// on error: see the graph's status).
  virtual Tensor* build(StepBuilder& b) const = 0;
};

const Architecture& llama_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();
const Architecture& qwen3moe_architecture();
const Architecture& gemma2_architecture();
const Architecture& gemma3_architecture();
const Architecture& phi3_architecture();
const Architecture& gpt_oss_architecture();
const Architecture& architecture_for(Arch a);

/// The tensors every LLaMA-family model has: embeddings, output norm, output (tied to the
/// embeddings when absent), optional rope_freqs, and per layer the attention weights and, with
/// `dense_ffn`, the gated FFN weights (ffn_norm, ffn_gate, ffn_up, ffn_down).
void declare_llama_family(TensorLoader& tl, const HParams& hp, ModelWeights& w, bool dense_ffn = true);
/// The forward pass shared by llama, qwen2, qwen3, qwen3moe, phi3 and gpt-oss: pre-norm attention and
/// FFN blocks. What the weights hold picks the variant: projection biases when present (qwen2,
/// gpt-oss), QK-norm when q_norm is (qwen3), fused projections (phi3), attention sinks (gpt-oss), a
/// mixture of experts when the layer has a router (qwen3moe, gpt-oss), else SwiGLU.
Tensor* build_llama_family(StepBuilder& b);

/// Gemma 2/3 (llm_arch_gemma2.cpp): the LLaMA-family tensors (tied output) plus the post-attention
/// and post-FFN norms, and with `qk_norm` the per-head query/key norms (Gemma 3).
void declare_gemma_family(TensorLoader& tl, const HParams& hp, ModelWeights& w, bool qk_norm);
/// The Gemma forward pass; QK-norm where the layers have q_norm/k_norm.
Tensor* build_gemma(StepBuilder& b);

}  // namespace loom::llm::detail
