// Many sequences generated together: each with its own sampling parameters and seed, joining and
// leaving at any step, all advanced by one forward pass per step (Context::decode_batch).
//
//   loom::llm::BatchGenerator gen(ctx);                 // a context, best with a paged KV cache
//   auto a = gen.add(prompt_a, params_a);               // prefills, samples the first token
//   auto b = gen.add(prompt_b, params_b);
//   while (...) {
//     auto step = gen.step();                           // one token more for every sequence
//     for (const auto& t : *step) ... t.seq_id, t.token ...
//     if (done) gen.remove(t.seq_id);                   // frees its cache
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "loom/llm.h"
#include "loom/sample.h"
#include "loom/status.h"

namespace loom::llm {

/// A token one step produced for one sequence.
struct GeneratedToken {
  int seq_id = 0;
  int32_t token = 0;
};

/// What the last step() computed.
struct BatchStepStats {
  int n_decoded = 0;         ///< running sequences that took one token each
  int n_passes = 0;          ///< forward passes of the step, the prompt chunk's included
  int n_prefill_tokens = 0;  ///< prompt tokens of the enqueued sequences' chunks (several when packed)
  bool mixed = false;        ///< the chunk rode in the running sequences' pass (else a pass of its own)
  int n_device_sampled = 0;  ///< tokens sampled in the pass's graph (set_device_sampling)
  int n_host_sampled = 0;    ///< tokens sampled on the host from logits read back
  uint64_t logits_bytes_read = 0;  ///< logits the step's passes read back to the host
  int n_graph_builds = 0;          ///< passes that built their graph (DecodeStats::n_graph_builds)
  uint64_t host_graph_ns = 0;      ///< host time building, planning and feeding the passes' graphs
  /// Adds a finished pass's figures (Context::stats()).
  void add_pass(const DecodeStats& s) {
    logits_bytes_read += s.logits_bytes_read;
    n_graph_builds += s.n_graph_builds;
    host_graph_ns += s.host_build_ns + s.host_alloc_ns + s.host_inputs_ns;
  }
};

/// Sequences of one context generated together. A sequence's tokens do not depend on the others
/// (greedy outputs equal the sequence generated alone, token for token). Not thread-safe.
class BatchGenerator {
 public:
  /// `ctx` must outlive the generator, which owns the sequence ids it hands out in that context
  /// (the lowest unused ids from 0; nothing else should decode into them meanwhile).
  explicit BatchGenerator(Context& ctx);
  ~BatchGenerator();
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;

  /// Adds a sequence: runs its prompt (in n_batch chunks, alone) and samples its first token with a
  /// sampler of its own (`sampling`, including the seed). Returns the sequence's id. On error
  /// (an empty prompt, bad sampling parameters, no room in the cache) nothing stays behind.
  /// Prefix reuse: the prompt's longest common prefix with a sequence already here is shared
  /// from that sequence's cache where the cache can (Context::kv_cache_seq_share_prefix) and only
  /// the rest is computed; the tokens are the same either way.
  Result<int> add(std::span<const int32_t> prompt, const SamplerParams& sampling);
  /// Like add, but the prompt is computed by the following step() calls, one chunk per step, so a
  /// long prompt does not stall the running sequences: at most `chunk` tokens (0: the context's
  /// n_batch) while any of them decodes, in their pass (see set_mixed_steps), and up to n_batch
  /// in a step where none does. Enqueued prompts are taken in order. The sequence produces no
  /// token until the step that finishes its prompt, which samples its first one (the tokens are the
  /// same as with add). Prefix reuse as in add. Returns the id at once; errors as add.
  Result<int> enqueue(std::span<const int32_t> prompt, const SamplerParams& sampling, int chunk = 0);
  /// Whether `seq_id` is an enqueued sequence whose prompt is not finished.
  bool prefilling(int seq_id) const;
  /// Removes a sequence and frees its cache cells.
  Status remove(int seq_id);
  /// Stops generating for `seq_id` but keeps its cache cells as a prefix later add/enqueue calls may
  /// share (a server keeps a finished conversation this way for its next turn); step() skips it from
  /// now on and remove() frees it. A parked sequence still holds its id.
  Status park(int seq_id);
  /// Whether `seq_id` is parked.
  bool parked(int seq_id) const;
  /// One forward pass for every sequence (several when there are more than n_batch of them): each
  /// takes its last sampled token and samples the next; the same pass computes one prompt chunk of
  /// the oldest enqueued sequence (a mixed pass; the chunk is cut to what the pass has room for),
  /// or, when mixed steps are off or the sequences need several passes, a pass of its own first. Returns one
  /// token per sequence that has one (not those still prefilling), in increasing id order, valid until the
  /// next call. On error (e.g. a sequence out of cache room, named in the message) no sequence advances.
  Result<std::span<const GeneratedToken>> step();

  /// Whether a step's prompt chunk rides in the running sequences' pass (on, the default: no pass
  /// is decode-free while sequences run, Context::decode_batch's mixed pass) or runs as a pass of
  /// its own before it (off). The tokens are the same either way.
  void set_mixed_steps(bool on);
  /// Whether a step with nothing decoding computes several waiting prompts together (on, the
  /// default): chunks of one length (the oldest prompt's next chunk, up to n_batch) from as many
  /// prompts as n_batch holds, in one packed pass. The tokens are the same either way in exact
  /// numerics; off: one prompt per step.
  void set_packed_prompts(bool on);
  /// Samples a step's sequences on `n_threads` threads (the caller's and n_threads - 1 kept by the
  /// generator) when there are several of them; 1 (the default): on the caller's thread. The tokens
  /// are the same either way (each sequence has its own sampler); what changes is the host time of a
  /// step with many sequences and a large vocabulary.
  void set_sampling_threads(int n_threads);
  /// Samples the running sequences' tokens in the step's graph (Context::decode_batch_sampled): only
  /// token ids come back. Off by default. The tokens are the host sampler's (each sequence's own
  /// generator draws the uniform; on the CPU backend bit for bit, see sample_tokens in graph.h for
  /// the GPU's exp). Per sequence and step, the host samples instead, from its logits read back,
  /// when the chain cannot run there exactly: penalties active over a non-empty history, top-k off
  /// or >= n_vocab with temperature > 0, a sequence kept there by set_host_sampling, a row with
  /// NaN/+inf logits (the host samples it with the generator put back as before the device's draw,
  /// and reports it); the whole step when the context cannot (Context::supports_device_sampling).
  /// Prompts finished by add() or by a pass of their own are sampled on the host. logits(seq_id) is
  /// empty for a sequence sampled on the device.
  void set_device_sampling(bool on);
  /// Keeps `seq_id` on the host sampler while set_device_sampling samples the others in the graph:
  /// its logits are read back every step, so logits(seq_id) has the row each of its tokens was
  /// sampled from (a request that asks for log-probabilities). Off for a new sequence; the tokens
  /// are the same either way. Error for an unknown id.
  Status set_host_sampling(int seq_id, bool on);
  /// What the last step() computed (zeros before the first).
  const BatchStepStats& last_step() const;
  /// The logits (n_vocab floats, as the model gave them: before any penalty or temperature) from
  /// which `seq_id`'s newest token was sampled, for log-probabilities; empty when the last add or
  /// step gave it no token or sampled it on the device (set_device_sampling). Valid until the next
  /// add, enqueue, step or remove.
  std::span<const float> logits(int seq_id) const;

  /// Ids of the sequences, increasing (parked ones included).
  std::vector<int> sequences() const;
  int n_sequences() const;
  /// The tokens sampled for `seq_id` so far (the first one by add); empty for an unknown id.
  std::span<const int32_t> generated(int seq_id) const;
  /// Prompt tokens of `seq_id` that add() took from another sequence's cache instead of computing.
  int shared_prompt_tokens(int seq_id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::llm
