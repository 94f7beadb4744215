// The model layer: LLaMA-family decoders (dense, Gemma 2/3 with sliding-window attention, Qwen3
// mixture of experts) loaded from GGUF, an F16 KV cache, and a Context that
// runs chunked prefill and one-token decode steps on any backend.
//
// Typical use (what `loom run` does):
//
//   loom::llm::SessionParams sp;
//   sp.model_path = "model.gguf"; sp.backend = "cpu"; sp.n_threads = 8; sp.n_ctx = 4096; sp.n_batch = 512;
//   auto session = loom::llm::open_session(sp);            // backend + model + context
//   if (!session) ... session.status().to_string() ...
//   loom::llm::Context& ctx = *session->context;
//   auto logits = ctx.decode(prompt_tokens, /*pos=*/0);    // prefill in chunks of n_batch
//   ... pick a token t from *logits (n_vocab floats) ...
//   logits = ctx.decode({&t, 1}, n_prompt);                // one decode step
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend.h"
#include "loom/gguf.h"
#include "loom/status.h"

namespace loom::llm {

namespace detail {
struct ModelImpl;
struct ContextImpl;
}  // namespace detail

/// Decoder architectures Loom can run.
enum class Arch { llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt_oss };
/// GGUF spelling ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt-oss").
const char* arch_name(Arch a);
/// Parses a `general.architecture` value; nullopt when Loom does not know it.
std::optional<Arch> arch_from_name(std::string_view name);
/// Every architecture Loom can run, in the order of Arch.
std::span<const Arch> supported_archs();

/// How RoPE frequencies are stretched beyond the training context.
enum class RopeScaling { none, linear, yarn };

/// Model hyperparameters, from the GGUF metadata (`{arch}.*` keys).
struct HParams {
  Arch arch = Arch::llama;
  uint32_t n_ctx_train = 0;    ///< {arch}.context_length
  uint32_t n_embd = 0;         ///< {arch}.embedding_length
  uint32_t n_layer = 0;        ///< {arch}.block_count
  uint32_t n_ff = 0;           ///< {arch}.feed_forward_length
  uint32_t n_head = 0;         ///< {arch}.attention.head_count
  uint32_t n_head_kv = 0;      ///< {arch}.attention.head_count_kv (default: n_head)
  uint32_t head_dim_k = 0;     ///< {arch}.attention.key_length (default: n_embd / n_head)
  uint32_t head_dim_v = 0;     ///< {arch}.attention.value_length (default: head_dim_k)
  uint32_t n_rot = 0;          ///< {arch}.rope.dimension_count (default: head_dim_k)
  uint32_t n_vocab = 0;        ///< tokenizer.ggml.tokens, else {arch}.vocab_size, else token_embd
  float norm_rms_eps = 1e-5f;  ///< {arch}.attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::none;
  float rope_scaling_factor = 1.0f;  ///< {arch}.rope.scaling.factor
  uint32_t n_ctx_orig = 0;           ///< {arch}.rope.scaling.original_context_length (default: n_ctx_train)
  float rope_attn_factor = 1.0f;     ///< phi3.rope.scaling.attn_factor: LongRoPE's cos/sin scale
  /// Query scale: 1/sqrt(head_dim_k), except where the family says otherwise (Gemma 27B).
  float attn_scale = 0.0f;

  // Sliding-window attention (gemma2, gemma3, phi3, gpt-oss): local layers see only the last n_swa
  // positions.
  uint32_t n_swa = 0;  ///< {arch}.attention.sliding_window; 0: every layer attends globally
  /// Of each `swa_period` layers, all but the last are local (gemma2 and gpt-oss 2, gemma3 6); 1: every
  /// layer is (phi3).
  uint32_t swa_period = 0;
  /// RoPE base of local layers ({arch}.rope.freq_base_swa; gemma3: 10000); they use no rope scaling
  /// unless swa_rope_scaled.
  float rope_freq_base_swa = 10000.0f;
  /// Local layers scale RoPE as the global ones do (gpt-oss: one YaRN table for every layer).
  bool swa_rope_scaled = false;
  /// YaRN's correction range used as computed rather than widened to whole dims (gpt-oss: Hugging
  /// Face's `truncate: false`; GGUF files carry no key for it).
  bool rope_yarn_unrounded = false;
  float attn_softcap = 0.0f;   ///< {arch}.attn_logit_softcapping; 0: off
  float final_softcap = 0.0f;  ///< {arch}.final_logit_softcapping; 0: off

  // Mixture of experts (qwen3moe, gpt-oss); n_expert 0 for dense models.
  uint32_t n_expert = 0;            ///< {arch}.expert_count
  uint32_t n_expert_used = 0;       ///< {arch}.expert_used_count
  uint32_t n_ff_exp = 0;            ///< {arch}.expert_feed_forward_length
  bool expert_weights_norm = true;  ///< {arch}.expert_weights_norm: selected weights renormalized to sum 1
  /// The router's top n_expert_used logits are picked first and softmaxed among themselves (gpt-oss),
  /// instead of a softmax over every expert followed by the top-k.
  bool expert_softmax_topk = false;
  /// > 0: the experts' GLU is gpt-oss's clamped SwiGLU (swiglu_oai) with these constants (1.702, 7;
  /// llama.cpp writes no key for them).
  float swiglu_oai_alpha = 0.0f;
  float swiglu_oai_limit = 0.0f;

  uint32_t n_embd_k_gqa() const { return head_dim_k * n_head_kv; }
  uint32_t n_embd_v_gqa() const { return head_dim_v * n_head_kv; }
  /// Whether layer `il` attends through the sliding window.
  bool is_swa(uint32_t il) const {
    return n_swa > 0 && (swa_period == 1 || (swa_period > 1 && il % swa_period < swa_period - 1));
  }
  /// Whether any layer does.
  bool has_swa() const { return n_swa > 0 && swa_period >= 1 && n_layer > 0; }
};

/// Reads and checks the hyperparameters of a GGUF model; errors name the file and key.
Result<HParams> read_hparams(const GgufFile& file);

/// How a model is loaded.
struct ModelLoadOptions {
  bool progress = true;       ///< progress on stderr while loading, only when stderr is a terminal
  bool print_summary = true;  ///< one line on stderr: architecture, parameters, size, types, context
  /// Host memory the weights may use; 0 reads MemAvailable from /proc/meminfo. Only checked when
  /// the backend computes on host memory (the weights stay in the file's mapping).
  uint64_t available_memory = 0;
  /// Layer offload, as llama.cpp's -ngl splits a model: the last `n_offload_layers` layers, the
  /// output norm and the output projection get their weights (and KV cache) in this backend's memory
  /// and run on it; the token embeddings and the first layers stay with the main backend. nullptr or
  /// 0 layers: no offload; more layers than the model has: all of them. Must outlive the model.
  Backend* offload_backend = nullptr;
  int n_offload_layers = 0;
  /// Tensor parallelism: the model split over these backends, one rank each, the first being the
  /// backend given to Model::load. Attention heads (and their KV cache), the FFN's columns and the
  /// vocabulary are divided among the ranks (Q/K/V, gate/up, the token embeddings and the output by
  /// rows; the attention output and FFN down by columns, on block boundaries), each rank's weights
  /// loaded straight into its backend's memory; the norms are copied to every rank. A pass runs on
  /// every rank at once (a thread each) and sums the row-split products with one all-reduce after the
  /// attention output and one after the FFN, and the embeddings with one more at the start (NCCL on
  /// CUDA, a host group on the CPU). The head counts and FFN widths must divide by the rank count.
  /// Empty or one backend: no split. Not with layer offload.
  std::vector<Backend*> tensor_parallel;
};

/// A loaded model: hyperparameters and weights in the backend's memory (on the CPU, the weights are
/// used straight from the file's read-only mapping; other backends get a copy in device memory).
/// With an offload backend (ModelLoadOptions), the offloaded layers' weights are copied into its
/// memory and the rest stay with the main backend.
class Model {
 public:
  /// Loads `path` for `backend`, which must outlive the model. Fails before touching the weights
  /// when they need more memory than there is, or when a tensor is missing or mis-shaped.
  static Result<std::unique_ptr<Model>> load(const std::string& path, Backend& backend,
                                             const ModelLoadOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const HParams& hparams() const;
  /// The file: metadata for the tokenizer and chat templates (valid while the model lives).
  const GgufFile& gguf() const;
  /// The main backend: embeddings and the layers not offloaded.
  Backend& backend() const;
  /// The backend of the offloaded layers and the output head; nullptr when nothing is offloaded.
  Backend* offload_backend() const;
  /// How many layers are offloaded: the last ones, [n_layer - n_offload_layers(), n_layer).
  int n_offload_layers() const;
  /// Ranks the model is split over by tensor parallelism (1: not split).
  int n_tensor_parallel() const;
  /// Sum of the elements of all weights.
  uint64_t n_params() const;
  /// Bytes of all weights.
  uint64_t n_bytes() const;
  /// "q4_K: 96, q6_K: 17, f32: 33": tensors per type, most frequent first.
  std::string type_mixture() const;
  /// The summary line printed on load (without "loom: ").
  std::string summary() const;

  const detail::ModelImpl& impl() const { return *impl_; }

 private:
  explicit Model(std::unique_ptr<detail::ModelImpl> impl);
  std::unique_ptr<detail::ModelImpl> impl_;
};

/// KV cache kinds (one implementation each behind one interface).
enum class KvCacheKind {
  /// Cells handed out first-fit; a lone sequence's attention reads the cache prefix in place.
  contiguous,
  /// Fixed-size blocks of one pool shared by all sequences, taken on demand through a block table
  /// per sequence and freed when the sequence is removed; attention gathers each sequence's cells.
  paged,
};

/// How a context is sized.
struct ContextParams {
  int n_ctx = 0;      ///< KV cache cells; 0: the training context, at most 4096
  int n_batch = 512;  ///< tokens per forward pass (prefill chunk, `-ub`)
  /// Host memory for the KV cache and activations; 0 reads MemAvailable (host backends only).
  uint64_t available_memory = 0;
  /// Attention reads the cache in extents rounded up to a multiple of this many cells (at most
  /// n_ctx), so decode steps within one extent build graphs of one structure and addresses, which a
  /// graph executor can replay. Cells past the used ones are masked out. 1: the exact extent.
  int n_kv_bucket = 256;
  KvCacheKind kv_cache = KvCacheKind::contiguous;
  int kv_block_size = 16;  ///< cells per block of a paged cache (n_ctx is rounded up to whole blocks)
  /// Sequences a paged cache serves at once (`loom serve -np`; parked ones count while they keep
  /// their cells). It sizes the paged cache's sliding-window ring: (n_seq_max - 1) * S(1) +
  /// S(n_batch) blocks, where S(n) = ceil((n_swa - 1) / kv_block_size) + ceil((n - 1) /
  /// kv_block_size) + 1 is the most a sequence holds in a step of n tokens (its window before the
  /// step's first block, and the step's tokens): every sequence decoding and one prompt chunk.
  /// More sequences than that fail to get window blocks (out_of_memory) like any sequence without
  /// room. 0: unknown, and a paged cache keeps every cell in its sliding-window layers (as swa_full).
  int n_seq_max = 0;
  /// Sliding-window layers (gemma2, gemma3, phi3, gpt-oss) keep every cell like the global ones,
  /// instead of a ring. More memory, and any rewind works (kv_cache_seq_rm refuses to rewind a
  /// windowed cache behind what its ring still holds, and a paged cache shares no prefix whose
  /// window its source has given back). A contiguous cache's ring holds one sequence's window
  /// (window + n_batch - 1 cells): decode_batch over several sequences needs swa_full there (it
  /// refuses otherwise). A paged cache has a ring only with n_seq_max (above), and gathers each
  /// sequence's window from it in batched passes.
  bool swa_full = false;
};

/// Per-call options of Context::decode.
struct DecodeOptions {
  bool all_logits = false;  ///< logits of every token (perplexity), not just the last one
  int seq_id = 0;           ///< sequence the tokens belong to
  /// Called after each prompt chunk (n_batch tokens) with the tokens done so far and the total, so
  /// a long prompt can show progress; empty: not called.
  std::function<void(size_t done, size_t total)> on_chunk;
};

/// One sequence's share of a batched step (Context::decode_batch): `tokens` at positions pos,
/// pos+1, ... of sequence `seq_id`.
struct SeqTokens {
  int seq_id = 0;
  int pos = 0;
  std::span<const int32_t> tokens;
};

/// Bookkeeping of the last decode, for logs and benchmarks. With an offload backend a pass is two
/// graphs (one per backend): node counts and arena bytes are their sums.
struct DecodeStats {
  int n_steps = 0;              ///< forward passes (chunks) of the last decode
  size_t n_nodes = 0;           ///< nodes of the last pass's graph
  size_t arena_bytes = 0;       ///< activation arena (kept across passes)
  int n_arena_allocations = 0;  ///< times the arena was (re)allocated since the context was made
  int n_kv = 0;                 ///< cache cells the last pass's attention read (bucketed, see n_kv_bucket)
  /// The last pass's structural hash (exec::structure_key, which the CUDA executor finds recorded
  /// passes by; one per backend segment, combined). Equal fingerprints: a recorded pass can be
  /// replayed as is.
  uint64_t graph_fingerprint = 0;
  /// Transfers of step inputs to the backends in the last decode: 1 per pass and backend (an
  /// offloaded model's second block carries the hidden state the first backend computed).
  int n_input_writes = 0;
  /// Passes of the last decode that built a graph; the others ran the previous pass's graph again
  /// (same shape: a decode step inside the bucket of the one before).
  int n_graph_builds = 0;
  // Host time of the last decode, summed over its passes (nanoseconds); a reused graph costs only
  // the inputs.
  uint64_t host_build_ns = 0;   ///< building the graphs
  uint64_t host_alloc_ns = 0;   ///< planning the arena, binding tensors, fingerprinting the graph
  uint64_t host_inputs_ns = 0;  ///< filling the masks and writing the inputs
  uint64_t host_compute_ns = 0;   ///< in the backends' compute calls: launches and the wait for the device
  uint64_t host_readback_ns = 0;  ///< reading the logits (or the sampled tokens) back
  /// Bytes of logits read back to the host by the last decode (n_vocab floats per row read).
  uint64_t logits_bytes_read = 0;
  /// Tensor parallelism (empty otherwise), per rank, summed over the last decode's passes: the host
  /// time of its part (its graph's launch and wait, its logits read-back), and how long after the
  /// passes' hand-off to the rank threads it began (ns). A pass's time beyond its slowest rank's part
  /// is the host's (inputs, hand-off).
  std::vector<uint64_t> tp_rank_busy_ns, tp_rank_start_lag_ns;
};

/// One sequence's sampling in Context::decode_batch_sampled: the settings of loom::Sampler's chain
/// after penalties, and the uniform its random generator drew for this token.
struct DeviceSampling {
  bool on_device = false;  ///< false: the row's logits come back for the host's sampler instead
  int32_t top_k = 40;      ///< 1..n_vocab-1 unless greedy (temperature <= 0)
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t min_keep = 0;
  double uniform = 0.0;  ///< SampleRng::uniform() for this token; unused when greedy
};

/// What Context::decode_batch_sampled gives back, valid until the next decode.
struct SampledStep {
  /// Per entry: the token the device sampled, or -1 (an entry not on the device, or a row the
  /// device could not sample: NaN/+inf logits, for the host sampler to report).
  std::span<const int32_t> tokens;
  /// n_vocab floats for each entry whose token is -1, in entry order; nothing else is read back.
  std::span<const float> host_logits;
};

/// A KV cache and the machinery to run forward passes of a model. Not thread-safe.
class Context {
 public:
  /// The model (and its backend) must outlive the context.
  static Result<std::unique_ptr<Context>> create(const Model& model, const ContextParams& params = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// Runs `tokens` at positions pos, pos+1, ... of sequence `seq_id`: in chunks of n_batch tokens,
  /// writing their keys and values into the cache. Returns the logits of the last token (n_vocab
  /// floats), or of every token (n_tokens * n_vocab, token-major) with `all_logits`. The span
  /// stays valid until the next decode. `pos` must follow the sequence's last cached position (use
  /// kv_cache_seq_rm to rewind). On error the cache is left as it was before the failing chunk.
  Result<std::span<const float>> decode(std::span<const int32_t> tokens, int pos,
                                        const DecodeOptions& options = {});

  /// One forward pass over several sequences at once: the weight mat-muls take every sequence's
  /// token columns together (one weight read serves them all), attention reads each sequence's own
  /// cells. Every sequence brings one token (a decode step), except that one of them may bring
  /// several (a prompt chunk: a mixed pass, whose chunk attends in a flash_attn of its own, the
  /// others in one together); or every sequence brings the same number of tokens (a packed pass:
  /// prompts of one length prefilled together, one weight read for all); a single sequence may
  /// bring any number (as decode). At most n_batch
  /// tokens in all, each sequence at most once. Returns the logits of each sequence's last token,
  /// n_seqs * n_vocab floats in the order given (the chunk's sequence first saves moving its row),
  /// valid until the next decode. A sequence's results do not depend on the others in the step (on
  /// the CPU bit for bit: every op computes a token's column the same whatever the other columns).
  /// On error (e.g. the cache has no room for a sequence) nothing is stored for any of them.
  Result<std::span<const float>> decode_batch(std::span<const SeqTokens> seqs);
  /// decode_batch, with the tokens of the entries `sampling` marks on_device sampled in the same
  /// graph (top_k and sample_tokens after the logits, loom/graph.h): only their ids come back, and
  /// the logits of the other entries. sampling.size() must equal seqs.size(). Refused where
  /// supports_device_sampling() is false. As decode_batch, a contiguous cache with a
  /// sliding-window ring (no swa_full) takes one sequence per call.
  Result<SampledStep> decode_batch_sampled(std::span<const SeqTokens> seqs,
                                           std::span<const DeviceSampling> sampling);
  /// Whether decode_batch_sampled can run here: always, since a tensor-parallel model's ranks gather
  /// their vocabulary slices in the graph (an all-reduce) and sample alike. Kept for callers that
  /// ask.
  bool supports_device_sampling() const;

  /// Empties the cache.
  void kv_cache_clear();
  /// Removes positions [p0, p1) of sequence `seq_id` (p1 < 0: to the end). A paged cache removes
  /// only a suffix (p1 < 0 or past the sequence's end); p0 = 0 frees all of the sequence's blocks.
  Status kv_cache_seq_rm(int seq_id, int p0, int p1 = -1);
  /// Prefix reuse: lets sequence `dst`, which holds nothing, start with positions [0, k) of `src`
  /// without computing them again (their keys and values are shared, not copied), for the largest
  /// k <= n_positions the cache can share: whole blocks of a paged cache (a system prompt shared by
  /// many requests is prefilled once); a contiguous cache shares nothing (k = 0). Returns k; decode
  /// `dst` on from position k. The error cases: dst holds positions, or dst == src.
  Result<int> kv_cache_seq_share_prefix(int src, int dst, int n_positions);
  /// Largest cached position of a sequence, -1 when it has none.
  int kv_cache_seq_pos_max(int seq_id) const;
  /// Cells in use.
  int kv_cache_used() const;

  int n_ctx() const;
  int n_batch() const;
  int n_vocab() const;
  KvCacheKind kv_cache_kind() const;
  /// Whether sliding-window layers keep every cell (ContextParams::swa_full, a paged cache, or a
  /// context no larger than their ring would be).
  bool swa_full() const;
  /// Bytes of the KV cache.
  size_t kv_cache_bytes() const;
  const Model& model() const;
  const DecodeStats& stats() const;

  const detail::ContextImpl& impl() const { return *impl_; }

 private:
  explicit Context(std::unique_ptr<detail::ContextImpl> impl);
  std::unique_ptr<detail::ContextImpl> impl_;
};

/// Everything `loom run` needs from the command line.
struct SessionParams {
  std::string model_path;
  std::string backend = "cpu";  ///< registry name: "cpu", "cuda"
  std::string offload_backend;  ///< "": none; else the registry name of the offload backend
  int n_offload_layers = 0;     ///< layers on the offload backend (see ModelLoadOptions)
  int n_threads = 0;            ///< CPU threads (0: all cores)
  int device = 0;               ///< GPU ordinal (the first of the tensor-parallel ranks)
  /// Tensor parallelism over this many backends (devices device, device + 1, ...); 1: none.
  int n_tensor_parallel = 1;
  int n_ctx = 0;                ///< see ContextParams
  int n_batch = 512;            ///< see ContextParams (-ub)
  KvCacheKind kv_cache = KvCacheKind::contiguous;  ///< see ContextParams
  bool swa_full = false;        ///< see ContextParams (--swa-full)
  int n_seq_max = 0;            ///< see ContextParams (the paged cache's sliding-window ring)
  /// Rounding mode of the backends (unset: LOOM_NUMERICS, else each backend's default).
  std::optional<Numerics> numerics;
  bool progress = true;
  bool print_summary = true;  ///< model summary and a context line on stderr
};

/// A backend (and an offload backend), a model on it and a context over the model. Members are
/// destroyed in reverse order, so the context goes before the model and the model before the backends.
struct Session {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Backend> offload_backend;  ///< null unless SessionParams::offload_backend is set
  std::vector<std::unique_ptr<Backend>> tp_backends;  ///< ranks 1.. of tensor parallelism (rank 0: backend)
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> context;
};

/// Creates the backend, loads the model and makes a context.
Result<Session> open_session(const SessionParams& params);

}  // namespace loom::llm
