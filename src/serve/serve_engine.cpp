// The serving engine (serve_engine.h): the worker's batched steps, admission, prefix reuse through
// parked sequences, and the events a request's handler receives.
#include "serve_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "loom/exec.h"
#include "loom/text_stream.h"

namespace loom::serve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::timeout:
      return "timeout";
    case FinishReason::error:
      return "error";
  }
  return "error";
}

bool Task::pop(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

void Task::push(StreamEvent e) {
  {
    std::lock_guard lock(mu_);
    if (e.kind == StreamEvent::Kind::done) finished_.store(true);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

// A request being generated: its sequence in the generator and what its stream needs.
struct Engine::Running {
  std::shared_ptr<Task> task;
  int seq = -1;  // -1: not in the generator
  size_t n_prompt = 0;
  int n_cached = 0;  // prompt tokens shared from another sequence's cache
  int n_generated = 0;
  std::unique_ptr<StopFilter> stop_filter;
  Utf8Joiner utf8;
  std::string out_text;  // what the stop filter passed on during the current token
  Clock::time_point last_token;
};

Result<std::unique_ptr<Engine>> Engine::create(llm::Session session, const Tokenizer& tok,
                                               std::set<int32_t> stop_ids, const ServerOptions& options,
                                               Metrics& metrics) {
  const int n_parallel = options.n_parallel, queue_size = options.queue_size;
  const int kv_block_size = options.kv_block_size;
  if (!session.model || !session.context)
    return make_error(StatusCode::invalid_argument, "serve: the session has no model or context");
  if (n_parallel < 1)
    return make_error(StatusCode::invalid_argument, "serve: --parallel {} (at least 1)", n_parallel);
  if (kv_block_size < 1)
    return make_error(StatusCode::invalid_argument, "serve: KV block size {} (at least 1)", kv_block_size);
  const int n_ctx = session.context->n_ctx();
  const int n_batch = session.context->n_batch();
  const bool swa_full = session.context->swa_full();  // --swa-full, or a window covering the context
  // Each request may hold n_ctx positions in whole blocks; the pool has that for every one of the
  // n_parallel requests, so running requests never run out of cells (finished requests kept for
  // reuse give theirs back first). The session's context goes before the new one is made.
  const int64_t per_seq = (static_cast<int64_t>(n_ctx) + kv_block_size - 1) / kv_block_size * kv_block_size;
  if (per_seq * n_parallel > std::numeric_limits<int32_t>::max() / 2)
    return make_error(StatusCode::invalid_argument, "serve: {} sequences of {} cells are too many",
                      n_parallel, per_seq);
  session.context.reset();
  llm::ContextParams cp;
  cp.n_ctx = static_cast<int>(per_seq * n_parallel);
  cp.n_batch = std::max(n_batch, n_parallel);  // one pass per step, however many requests run
  cp.kv_cache = llm::KvCacheKind::paged;
  cp.kv_block_size = kv_block_size;
  // Sliding-window layers (gemma, gpt-oss) keep each sequence's window only: n_parallel running
  // requests and at most n_parallel parked ones hold windows at once. --swa-full (the session's
  // context keeps every cell) keeps every cell here too.
  cp.n_seq_max = 2 * n_parallel;
  cp.swa_full = swa_full;
  auto ctx = llm::Context::create(*session.model, cp);
  if (!ctx)
    return make_error(ctx.status().code(), "serve: a paged KV cache of {} sequences x {} cells: {}",
                      n_parallel, per_seq, ctx.status().message());
  session.context = std::move(*ctx);
  std::unique_ptr<Engine> e(
      new Engine(std::move(session), tok, std::move(stop_ids), n_parallel, queue_size, metrics));
  e->gen_ = std::make_unique<llm::BatchGenerator>(*e->session_.context);
  // Sampling 64 sequences of a 128k vocabulary takes milliseconds on one thread, against a
  // forward pass of tens of milliseconds on a GPU: spread it when many requests run.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (n_parallel >= 8) e->gen_->set_sampling_threads(std::clamp(cores / 2, 1, 8));
  e->n_ctx_ = n_ctx;
  // While requests decode, a step carries at most this many prompt tokens. In a pass of its own (the
  // CUDA default) 64: that pass takes the batched-decode products (gemm_q, no weight dequantized to
  // f16) and costs about one 64-sequence decode step, so a running stream's gap between tokens is at
  // most about two steps (8B Q4_K_M, 64 streams of 256 + 256 tokens, H200, 2026-11-27: inter-token
  // p99 22.2 ms against 31.3 at 256-token passes and 37.3 at 128, first token p50 1.76 s against
  // 0.88; issue 16 asks p99 <= 25 ms). In the running requests' pass (mixed) every product runs at
  // 64 + chunk columns, so 128. A step with nothing decoding takes a whole -ub either way.
  auto is_cuda = [](const std::unique_ptr<Backend>& b) { return b && std::string_view(b->name()) == "cuda"; };
  const bool mixed =
      options.mixed_steps.value_or(!is_cuda(e->session_.backend) && !is_cuda(e->session_.offload_backend));
  const int default_chunk = mixed ? 128 : 64;
  e->prefill_chunk_ = std::clamp(options.prefill_chunk > 0 ? options.prefill_chunk : default_chunk, 1,
                                 std::max(1, n_batch));
  e->gen_->set_mixed_steps(mixed);
  e->gen_->set_device_sampling(options.device_sampling);
  e->kv_block_size_ = kv_block_size;
  e->worker_ = std::thread([p = e.get()] { p->run(); });
  return e;
}

Engine::Engine(llm::Session session, const Tokenizer& tok, std::set<int32_t> stop_ids, int n_parallel,
               int queue_size, Metrics& metrics)
    : session_(std::move(session)),
      tok_(tok),
      stop_ids_(std::move(stop_ids)),
      n_parallel_(n_parallel),
      queue_size_(queue_size),
      metrics_(metrics) {}

Engine::~Engine() {
  stop();
  gen_.reset();  // its sequences before the context, the context before the session's model
}

std::shared_ptr<Task> Engine::submit(GenRequest req) {
  auto task = std::make_shared<Task>(std::move(req));
  {
    std::lock_guard lock(mu_);
    if (stopping_) return nullptr;
    // Only requests beyond the free places wait: a free place takes its request at the worker's next turn.
    const int free_places = n_parallel_ - active_.load();
    if (static_cast<int>(pending_.size()) >= queue_size_ + std::max(free_places, 0)) return nullptr;
    pending_.push_back(task);
  }
  cv_.notify_all();
  return task;
}

void Engine::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

ServerStats Engine::stats() const {
  ServerStats s;
  {
    std::lock_guard lock(mu_);
    s.queue_depth = static_cast<int>(pending_.size());
  }
  s.active_slots = active_.load();
  s.n_slots = n_parallel_;
  s.kv_cells_used = kv_used_.load();
  s.cached_sequences = n_parked_.load();
  s.requests_finished = metrics_.requests_finished.load();
  s.requests_cancelled = metrics_.requests_cancelled.load();
  s.prompt_tokens = metrics_.prompt_tokens.load();
  s.prompt_tokens_cached = metrics_.prompt_tokens_cached.load();
  s.generated_tokens = metrics_.generated_tokens.load();
  return s;
}

std::pair<int64_t, int64_t> Engine::kv_cells() const {
  return {kv_used_.load(), static_cast<int64_t>(session_.context->n_ctx())};
}

void Engine::run() {
  while (true) {
    std::vector<std::shared_ptr<Task>> starts;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !running_.empty() || (!pending_.empty() && active_.load() < n_parallel_);
      });
      if (stopping_) break;
      // Requests that ended while waiting (client gone, deadline passed) never start.
      const auto now = Clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        const auto& t = *it;
        if (t->cancelled() || now > t->request().deadline) {
          StreamEvent done;
          done.kind = StreamEvent::Kind::done;
          done.finish = t->cancelled() ? FinishReason::cancelled : FinishReason::timeout;
          if (!t->cancelled()) done.error = "timed out waiting for a free slot";
          (t->cancelled() ? metrics_.requests_cancelled : metrics_.requests_timed_out).fetch_add(1);
          t->push(std::move(done));
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
      // Waiting requests join, oldest first, while fewer than n_parallel run (counted now, under
      // the lock, so that submit() sees the places taken).
      while (!pending_.empty() && active_.load() < n_parallel_) {
        starts.push_back(std::move(pending_.front()));
        pending_.pop_front();
        active_.fetch_add(1);
      }
    }
    for (auto& task : starts) start(std::move(task));
    // Cancelled and timed-out requests leave before the step, so their blocks are free for it.
    for (size_t i = 0; i < running_.size();) {
      Running& r = *running_[i];
      if (r.task->cancelled())
        finish(r, FinishReason::cancelled);
      else if (Clock::now() > r.task->request().deadline)
        finish(r, FinishReason::timeout, "the request timed out");
      else
        ++i;
    }
    if (!running_.empty()) step_all();
    kv_used_.store(session_.context->kv_cache_used());
  }
  // Stopping: every request still here ends.
  while (!running_.empty()) finish(*running_.back(), FinishReason::cancelled, "the server is stopping");
  std::lock_guard lock(mu_);
  for (auto& t : pending_) {
    StreamEvent done;
    done.kind = StreamEvent::Kind::done;
    done.finish = FinishReason::cancelled;  // by the server: its handler answers 503
    done.error = "the server is stopping";
    t->push(std::move(done));
  }
  pending_.clear();
}

void Engine::start(std::shared_ptr<Task> task) {
  const GenRequest& req = task->request();
  auto r = std::make_unique<Running>();
  Running& run = *r;
  run.task = std::move(task);
  run.n_prompt = req.prompt.size();
  run.stop_filter = std::make_unique<StopFilter>(req.stop, [&run](std::string_view t) { run.out_text += t; });
  running_.push_back(std::move(r));
  if (req.max_tokens == 0) return finish(run, FinishReason::length);
  try {
    // The prompt is computed by the next steps, a chunk (--prefill-chunk tokens; a whole -ub in a
    // step where nothing else decodes) per step in the running requests' pass, while they keep
    // taking a token each; its longest common prefix with a sequence in the cache
    // (running, or a finished request's) is shared in whole blocks instead of computed.
    auto seq = gen_->enqueue(req.prompt, req.sampling, prefill_chunk_);
    if (!seq) return finish(run, FinishReason::error, seq.status().to_string());
    run.seq = *seq;
    run.n_cached = gen_->shared_prompt_tokens(run.seq);
    // Log-probabilities come from the logits each token was sampled from: read back every step.
    if (req.top_logprobs >= 0)
      if (Status s = gen_->set_host_sampling(run.seq, true); !s.ok())
        return finish(run, FinishReason::error, s.to_string());
  } catch (const std::exception& e) {
    finish(run, FinishReason::error, fmt::format("internal error: {}", e.what()));
  }
}

void Engine::evict_oldest_parked() {
  (void)gen_->remove(parked_.front());
  parked_.pop_front();
  n_parked_.store(static_cast<int>(parked_.size()));
}

void Engine::make_room() {
  // A step claims at most one block per running sequence and the blocks of one prompt chunk; free
  // cells are at least those of no block minus what the partly filled last blocks may leave.
  const int64_t block = kv_block_size_;
  const int64_t n_seqs = static_cast<int64_t>(running_.size() + parked_.size());
  int64_t chunk = 0;  // the prompt chunk of the step, if a prompt is unfinished (a whole pass at most)
  const int64_t per_step = std::max(prefill_chunk_, session_.context->n_batch());
  for (const auto& r : running_)
    if (r->seq >= 0 && gen_->prefilling(r->seq))
      chunk = std::max<int64_t>(chunk, std::min<int64_t>(per_step, static_cast<int64_t>(r->n_prompt)));
  const int64_t need = (static_cast<int64_t>(running_.size()) + 2) * block + chunk;
  while (!parked_.empty()) {
    const int64_t free = static_cast<int64_t>(session_.context->n_ctx()) - session_.context->kv_cache_used() -
                         n_seqs * (block - 1);
    if (free >= need) break;
    evict_oldest_parked();
  }
}

void Engine::step_all() {
  make_room();
  // LOOM_SERVE_TRACE=FILE: a Chrome trace (dispatches timed one at a time) of the first forward pass
  // of the first step that computes a prompt chunk while at least 32 requests decode: the mixed pass,
  // or with prompt chunks in passes of their own (CUDA's default) the chunk's pass.
  static const char* trace_path = std::getenv("LOOM_SERVE_TRACE");
  if (trace_path && *trace_path && !traced_ && session_.backend) {
    int decoding = 0, prefilling = 0;
    for (const auto& r : running_)
      if (r->seq >= 0) ++(gen_->prefilling(r->seq) ? prefilling : decoding);
    if (decoding >= 32 && prefilling > 0) {
      traced_ = true;
      (void)capture_next_compute(*session_.backend, trace_path);
    }
  }
  Result<std::span<const llm::GeneratedToken>> got = make_error(StatusCode::internal, "no step");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    while (true) {
      got = gen_->step();
      // The estimate of make_room can fall short (prompt chunks sharing blocks); then the oldest
      // finished requests give their cells back and the step runs again (a failed step changes nothing).
      if (!got && got.status().code() == StatusCode::out_of_memory && !parked_.empty()) {
        evict_oldest_parked();
        continue;
      }
      break;
    }
  } catch (const std::exception& e) {
    got = make_error(StatusCode::internal, "internal error: {}", e.what());
  }
  if (!got) {
    // A step that fails names the sequence in its message but changes none: every request ends.
    const std::string error = got.status().to_string();
    while (!running_.empty()) finish(*running_.back(), FinishReason::error, error);
    return;
  }
  const llm::BatchStepStats& st = gen_->last_step();
  const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (st.n_prefill_tokens > 0 ? metrics_.prompt_step : metrics_.decode_step).observe(step_s);
  (st.n_prefill_tokens > 0 ? metrics_.prompt_host_ns : metrics_.decode_host_ns).fetch_add(st.host_graph_ns);
  metrics_.graph_builds.fetch_add(static_cast<uint64_t>(st.n_graph_builds));
  if (session_.backend) metrics_.set_exec(exec_counters(*session_.backend));
  if (st.n_decoded > 0) metrics_.batch_sequences.observe(st.n_decoded);
  metrics_.steps.fetch_add(1);
  metrics_.forward_passes.fetch_add(static_cast<uint64_t>(st.n_passes));
  if (st.n_prefill_tokens > 0) metrics_.prompt_chunk_steps.fetch_add(1);
  if (st.mixed) metrics_.mixed_steps.fetch_add(1);
  metrics_.device_sampled.fetch_add(static_cast<uint64_t>(st.n_device_sampled));
  metrics_.host_sampled.fetch_add(static_cast<uint64_t>(st.n_host_sampled));
  // running_ is small (n_parallel at most): a linear search per token is cheap next to the step
  for (const llm::GeneratedToken& t : *got) {
    const auto it =
        std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r->seq == t.seq_id; });
    if (it == running_.end()) continue;
    Running& r = **it;
    try {
      deliver(r, t.token);
    } catch (const std::exception& e) {
      finish(r, FinishReason::error, fmt::format("internal error: {}", e.what()));
    }
  }
}

namespace {

// log-softmax of one token, and the `n` best alternatives, from the model's raw logits.
TokenLogprob logprobs_of(std::span<const float> logits, int32_t id, int n) {
  float max = -INFINITY;
  for (float l : logits) max = std::max(max, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max));
  const double log_z = static_cast<double>(max) + std::log(sum);
  TokenLogprob out;
  out.id = id;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(id)] - log_z);
  if (n > 0) {
    TokenCandidates c;
    candidates_top_k(logits, n, c);
    for (const TokenData& d : c.data) out.top.emplace_back(d.id, static_cast<float>(d.logit - log_z));
  }
  return out;
}

}  // namespace

void Engine::deliver(Running& r, int32_t token) {
  const GenRequest& req = r.task->request();
  const auto now = Clock::now();
  if (r.n_generated == 0)
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - r.task->submitted()).count());
  else
    metrics_.inter_token.observe(std::chrono::duration<double>(now - r.last_token).count());
  r.last_token = now;
  if (!req.ignore_eos && stop_ids_.count(token)) return finish(r, FinishReason::stop);
  ++r.n_generated;
  StreamEvent ev;
  if (req.top_logprobs >= 0) {
    const std::span<const float> logits = gen_->logits(r.seq);  // start() kept it on the host
    if (logits.empty())
      return finish(r, FinishReason::error, "internal error: no logits for the log-probabilities");
    ev.logprob = logprobs_of(logits, token, req.top_logprobs);
  }
  auto piece = tok_.token_to_piece(token);
  if (!piece) return finish(r, FinishReason::error, piece.status().to_string());
  const bool stopped = r.stop_filter->add(*piece);
  ev.text = r.utf8.add(r.out_text);
  r.out_text.clear();
  r.task->push(std::move(ev));
  if (stopped) return finish(r, FinishReason::stop);
  if (req.max_tokens >= 0 && r.n_generated >= req.max_tokens) return finish(r, FinishReason::length);
  // The next step would store this token at position n_prompt + n_generated - 1.
  if (r.n_prompt + static_cast<size_t>(r.n_generated) > static_cast<size_t>(n_ctx_))
    return finish(r, FinishReason::length);
}

void Engine::finish(Running& r, FinishReason reason, std::string error) {
  StreamEvent done;
  done.kind = StreamEvent::Kind::done;
  // What the stop filter held back is text (after a stop string it holds nothing).
  if (r.stop_filter) r.stop_filter->finish();
  done.text = r.utf8.add(r.out_text) + r.utf8.finish();
  r.out_text.clear();
  done.finish = reason;
  done.error = std::move(error);
  done.n_prompt = static_cast<int>(r.n_prompt);
  done.n_cached = r.n_cached;
  done.n_generated = r.n_generated;
  metrics_.requests_finished.fetch_add(1);
  if (reason == FinishReason::cancelled) metrics_.requests_cancelled.fetch_add(1);
  if (reason == FinishReason::timeout) metrics_.requests_timed_out.fetch_add(1);
  metrics_.prompt_tokens.fetch_add(r.n_prompt);
  metrics_.prompt_tokens_cached.fetch_add(static_cast<uint64_t>(r.n_cached));
  metrics_.generated_tokens.fetch_add(static_cast<uint64_t>(r.n_generated));
  metrics_.request_duration.observe(
      std::chrono::duration<double>(Clock::now() - r.task->submitted()).count());
  if (r.seq >= 0) {
    // A request that ended normally keeps its cells for the next one that starts the same way (a
    // chat's next turn), up to n_parallel such sequences, the oldest freed first and whenever
    // running requests need the room; anything else (cancelled, timed out, failed, prompt not
    // finished) frees them at once.
    const bool keep = (reason == FinishReason::stop || reason == FinishReason::length) &&
                      !gen_->prefilling(r.seq) && gen_->park(r.seq).ok();
    if (keep) {
      parked_.push_back(r.seq);
      if (static_cast<int>(parked_.size()) > n_parallel_) evict_oldest_parked();
      n_parked_.store(static_cast<int>(parked_.size()));
    } else {
      (void)gen_->remove(r.seq);
    }
    r.seq = -1;
  }
  auto task = std::move(r.task);
  const auto it =
      std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == &r; });
  if (it != running_.end()) running_.erase(it);  // r is gone from here on
  {
    std::lock_guard lock(mu_);
    active_.fetch_sub(1);
  }
  kv_used_.store(session_.context->kv_cache_used());
  task->push(std::move(done));
}

}  // namespace loom::serve
