// The serving engine: one worker thread that generates up to N requests together (continuous
// batching over one context with a paged KV cache), a bounded queue of requests waiting for one of
// the N places, and the channel through which a request's tokens reach its HTTP handler.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loom/llm.h"
#include "loom/llm_batch.h"
#include "loom/sample.h"
#include "loom/serve.h"
#include "loom/text.h"
#include "serve_metrics.h"

namespace loom::serve {

using Clock = std::chrono::steady_clock;

/// One generation request, ready for the engine: tokens, not text.
struct GenRequest {
  std::vector<int32_t> prompt;
  SamplerParams sampling;
  int max_tokens = -1;            ///< -1: until the context is full
  std::vector<std::string> stop;  ///< the request's stop strings and the chat format's
  int top_logprobs = -1;          ///< -1: no logprobs; else the alternatives per token (0..20)
  bool ignore_eos = false;        ///< end-of-generation tokens are text like any other
  Clock::time_point deadline = Clock::time_point::max();
};

/// The log-probability of a generated token and of its best alternatives.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  ///< best first
};

enum class FinishReason { stop, length, cancelled, timeout, error };
const char* finish_reason_name(FinishReason r);

/// What the engine tells a request's handler. A request's events end with one `done`.
struct StreamEvent {
  enum class Kind { delta, done } kind = Kind::delta;
  std::string text;                          ///< delta: new text, whole UTF-8 characters (may be empty)
  std::optional<TokenLogprob> logprob;       ///< delta: the token's, when asked for
  FinishReason finish = FinishReason::stop;  ///< done
  std::string error;                         ///< done with FinishReason::error or timeout: why
  int n_prompt = 0;                          ///< done: usage
  int n_cached = 0;                          ///< done: prompt tokens shared from the KV cache
  int n_generated = 0;                       ///< done: usage
};

/// A submitted request: the engine pushes events, the handler pops them; either side may end it.
class Task {
 public:
  explicit Task(GenRequest req) : req_(std::move(req)), submitted_(Clock::now()) {}

  /// Moves every event waiting into `out` (waiting at most `timeout` for one); false when none came.
  bool pop(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout);
  /// The client is gone or gave up: the engine ends the request and frees its cache blocks at its next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  /// Whether the engine has sent `done`.
  bool finished() const { return finished_.load(); }

  void push(StreamEvent e);
  const GenRequest& request() const { return req_; }
  Clock::time_point submitted() const { return submitted_; }

 private:
  GenRequest req_;
  Clock::time_point submitted_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

/// The worker thread and the one context it drives: every running request is a sequence of a
/// BatchGenerator over a paged KV cache, and each step advances all of them in one forward pass.
class Engine {
 public:
  /// Replaces the session's context by a paged one with room for `n_parallel` sequences of the
  /// session context's size (whole blocks of `kv_block_size` cells each), and starts the worker.
  /// Takes -np, --queue, --kv-block-size, --prefill-chunk and the mixed steps from `options`.
  static Result<std::unique_ptr<Engine>> create(llm::Session session, const Tokenizer& tok,
                                                std::set<int32_t> stop_ids, const ServerOptions& options,
                                                Metrics& metrics);
  ~Engine();

  /// Queues a request; nullptr when the queue is full.
  std::shared_ptr<Task> submit(GenRequest req);
  /// Cancels everything and joins the worker.
  void stop();

  /// Positions one request may use (prompt and generated tokens): `-c`.
  int n_ctx() const { return n_ctx_; }
  const llm::Model& model() const { return *session_.model; }
  ServerStats stats() const;
  /// KV cells in use (running requests and finished ones kept for prefix reuse), and the total.
  std::pair<int64_t, int64_t> kv_cells() const;

 private:
  struct Running;
  Engine(llm::Session session, const Tokenizer& tok, std::set<int32_t> stop_ids, int n_parallel,
         int queue_size, Metrics& metrics);
  void run();
  /// Makes a request a sequence of the generator (its prompt is computed by the next steps).
  void start(std::shared_ptr<Task> task);
  /// One step of the generator for every running request, and their tokens to their streams.
  void step_all();
  void deliver(Running& r, int32_t token);
  /// Ends a request and takes it out of running_: its sequence is parked (stop, length: kept as a
  /// prefix for later requests) or removed (anything else: its blocks are freed at once).
  void finish(Running& r, FinishReason reason, std::string error = {});
  /// Frees parked sequences, oldest first, until the next step surely has the cells it needs.
  void make_room();
  void evict_oldest_parked();

  llm::Session session_;
  std::unique_ptr<llm::BatchGenerator> gen_;  // over session_.context; declared after it, so destroyed first
  Tokenizer tok_;
  std::set<int32_t> stop_ids_;
  int n_parallel_ = 1;
  bool traced_ = false;  // LOOM_SERVE_TRACE's step was traced
  int queue_size_;
  int n_ctx_ = 0;
  int prefill_chunk_ = 0;
  int kv_block_size_ = 16;
  Metrics& metrics_;

  // The worker's own state.
  std::vector<std::unique_ptr<Running>> running_;
  std::deque<int> parked_;  // sequences of finished requests, oldest first

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> pending_;
  bool stopping_ = false;
  std::atomic<int> active_{0};  // requests taken from the queue and not finished
  std::atomic<int64_t> kv_used_{0};
  std::atomic<int> n_parked_{0};
  std::thread worker_;
};

}  // namespace loom::serve
