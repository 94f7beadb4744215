// The serving engine (serve_engine.h): slots, the worker's round-robin, prefix reuse, sampling and
// the events a request's handler receives.
#include "serve_engine.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

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

// A slot: a context, the tokens its cache holds, and the request it is generating for.
struct Engine::Slot {
  int index = 0;
  std::unique_ptr<llm::Context> owned;  // null for slot 0, whose context the session owns
  llm::Context* ctx = nullptr;
  std::vector<int32_t> cached;  // tokens whose keys and values are in the cache, positions 0..

  // The request in progress (task null: free).
  std::shared_ptr<Task> task;
  std::optional<Sampler> sampler;
  std::vector<int32_t> tokens;  // prompt and generated tokens: the penalties' history
  size_t n_prompt = 0;
  size_t n_cached = 0;  // prompt tokens reused from the cache
  bool prefilled = false;
  std::span<const float> logits;  // of the last decoded token; valid until this slot's next decode
  int n_generated = 0;
  std::unique_ptr<StopFilter> stop_filter;
  Utf8Joiner utf8;
  std::string out_text;  // what the stop filter passed on during the current token
  Clock::time_point last_token;
};

Result<std::unique_ptr<Engine>> Engine::create(llm::Session session, const Tokenizer& tok,
                                               std::set<int32_t> stop_ids, int n_parallel, int queue_size,
                                               Metrics& metrics) {
  if (!session.model || !session.context)
    return make_error(StatusCode::invalid_argument, "serve: the session has no model or context");
  if (n_parallel < 1)
    return make_error(StatusCode::invalid_argument, "serve: --parallel {} (at least 1)", n_parallel);
  std::unique_ptr<Engine> e(new Engine(std::move(session), tok, std::move(stop_ids), queue_size, metrics));
  llm::ContextParams cp;
  cp.n_ctx = e->session_.context->n_ctx();
  cp.n_batch = e->session_.context->n_batch();
  cp.swa_full = e->session_.context->swa_full();
  for (int i = 0; i < n_parallel; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->index = i;
    if (i == 0) {
      slot->ctx = e->session_.context.get();
      slot->ctx->kv_cache_clear();
    } else {
      auto ctx = llm::Context::create(*e->session_.model, cp);
      if (!ctx) return make_error(ctx.status().code(), "serve: slot {}: {}", i, ctx.status().message());
      slot->owned = std::move(*ctx);
      slot->ctx = slot->owned.get();
    }
    e->slots_.push_back(std::move(slot));
  }
  e->n_ctx_ = cp.n_ctx;
  e->worker_ = std::thread([p = e.get()] { p->run(); });
  return e;
}

Engine::Engine(llm::Session session, const Tokenizer& tok, std::set<int32_t> stop_ids, int queue_size,
               Metrics& metrics)
    : session_(std::move(session)),
      tok_(tok),
      stop_ids_(std::move(stop_ids)),
      queue_size_(queue_size),
      metrics_(metrics) {}

Engine::~Engine() {
  stop();
  slots_.clear();  // the contexts before the session's model
}

std::shared_ptr<Task> Engine::submit(GenRequest req) {
  auto task = std::make_shared<Task>(std::move(req));
  {
    std::lock_guard lock(mu_);
    if (stopping_) return nullptr;
    // Only requests beyond the free slots wait: a free slot takes its request at the worker's next turn.
    const int free_slots = static_cast<int>(slots_.size()) - active_.load();
    if (static_cast<int>(pending_.size()) >= queue_size_ + std::max(free_slots, 0)) return nullptr;
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
  s.n_slots = static_cast<int>(slots_.size());
  s.requests_finished = metrics_.requests_finished.load();
  s.requests_cancelled = metrics_.requests_cancelled.load();
  s.prompt_tokens = metrics_.prompt_tokens.load();
  s.prompt_tokens_cached = metrics_.prompt_tokens_cached.load();
  s.generated_tokens = metrics_.generated_tokens.load();
  return s;
}

std::pair<int64_t, int64_t> Engine::kv_cells() const {
  return {kv_used_.load(), static_cast<int64_t>(n_ctx_) * static_cast<int64_t>(slots_.size())};
}

void Engine::run() {
  size_t next = 0;  // round-robin start, so no slot always goes first
  while (true) {
    std::vector<std::pair<Slot*, std::shared_ptr<Task>>> starts;
    {
      std::unique_lock lock(mu_);
      auto has_free = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return !s->task; });
      };
      cv_.wait(lock, [&] { return stopping_ || active_.load() > 0 || (!pending_.empty() && has_free()); });
      if (stopping_) break;
      // Requests that ended while waiting (client gone, deadline passed) never take a slot.
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
      // Each waiting request, oldest first, takes the free slot whose cache shares the longest
      // prefix with its prompt (ties: the lowest index).
      std::vector<Slot*> free_slots;
      for (auto& s : slots_)
        if (!s->task) free_slots.push_back(s.get());
      while (!pending_.empty() && !free_slots.empty()) {
        auto task = pending_.front();
        pending_.pop_front();
        const auto& prompt = task->request().prompt;
        size_t best = 0, best_len = 0;
        for (size_t i = 0; i < free_slots.size(); ++i) {
          const auto& c = free_slots[i]->cached;
          const size_t n = static_cast<size_t>(
              std::mismatch(c.begin(), c.end(), prompt.begin(), prompt.end()).first - c.begin());
          if (n > best_len) best = i, best_len = n;
        }
        free_slots[best]->task = task;  // taken now, under the lock, so submit() counts it busy
        starts.emplace_back(free_slots[best], std::move(task));
        free_slots.erase(free_slots.begin() + static_cast<std::ptrdiff_t>(best));
        active_.fetch_add(1);
      }
    }
    for (auto& start : starts) {
      Slot& slot = *start.first;
      guarded_turn(slot, [&] { assign(slot, std::move(start.second)); });
    }
    for (size_t k = 0; k < slots_.size(); ++k) {
      Slot& s = *slots_[(next + k) % slots_.size()];
      if (s.task) guarded_turn(s, [&] { step(s); });
    }
    next = (next + 1) % slots_.size();
    int64_t used = 0;
    for (const auto& s : slots_) used += static_cast<int64_t>(s->cached.size());
    kv_used_.store(used);
  }
  // Stopping: every request still here ends.
  for (auto& s : slots_)
    if (s->task) finish(*s, FinishReason::cancelled, "the server is stopping");
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

// Runs one piece of a slot's work; an exception (out of memory, a bug) ends that request with an
// error instead of the worker thread and the server with it.
template <typename F>
void Engine::guarded_turn(Slot& s, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if (!s.task) return;
    fail_cache(s);
    finish(s, FinishReason::error, fmt::format("internal error: {}", e.what()));
  }
}

void Engine::assign(Slot& s, std::shared_ptr<Task> task) {
  const GenRequest& req = task->request();
  s.task = std::move(task);
  s.tokens = req.prompt;
  s.n_prompt = req.prompt.size();
  s.n_cached = 0;
  s.prefilled = false;
  s.n_generated = 0;
  s.logits = {};
  s.utf8 = Utf8Joiner();
  s.out_text.clear();
  s.stop_filter = std::make_unique<StopFilter>(req.stop, [&s](std::string_view t) { s.out_text += t; });
  auto sampler = Sampler::create(req.sampling);  // validated by the handler; a failure here is a bug
  if (!sampler) {
    finish(s, FinishReason::error, sampler.status().to_string());
    return;
  }
  s.sampler.emplace(std::move(*sampler));
  // Keep the cached prefix the prompt starts with; the last prompt token is always decoded again,
  // since its logits are needed.
  size_t keep = static_cast<size_t>(
      std::mismatch(s.cached.begin(), s.cached.end(), req.prompt.begin(), req.prompt.end()).first -
      s.cached.begin());
  if (keep == req.prompt.size() && keep > 0) --keep;
  if (keep < s.cached.size()) {
    if (Status st = s.ctx->kv_cache_seq_rm(0, static_cast<int>(keep)); !st.ok()) {
      fail_cache(s);
      keep = 0;
    } else {
      s.cached.resize(keep);
    }
  }
  s.n_cached = keep;
}

void Engine::step(Slot& s) {
  const auto now = Clock::now();
  if (s.task->cancelled()) return finish(s, FinishReason::cancelled);
  if (now > s.task->request().deadline) return finish(s, FinishReason::timeout, "the request timed out");
  if (!s.prefilled && !prefill(s)) return;
  if (s.prefilled) generate(s);
}

// Decodes the next chunk of the prompt (at most n_batch tokens, so a long prompt does not stall the
// other streams); true once the whole prompt is in the cache.
bool Engine::prefill(Slot& s) {
  const size_t done = s.cached.size();
  const size_t n = std::min(s.n_prompt - done, static_cast<size_t>(s.ctx->n_batch()));
  auto chunk = std::span<const int32_t>(s.tokens).subspan(done, n);
  auto logits = s.ctx->decode(chunk, static_cast<int>(done));
  if (!logits) {
    fail_cache(s);
    finish(s, FinishReason::error, logits.status().to_string());
    return false;
  }
  s.cached.insert(s.cached.end(), chunk.begin(), chunk.end());
  s.logits = *logits;
  s.prefilled = s.cached.size() == s.n_prompt;
  return s.prefilled;
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

void Engine::generate(Slot& s) {
  const GenRequest& req = s.task->request();
  if (req.max_tokens == 0) return finish(s, FinishReason::length);
  auto next = s.sampler->sample(s.logits, s.tokens);
  if (!next) return finish(s, FinishReason::error, next.status().to_string());
  const auto now = Clock::now();
  if (s.n_generated == 0)
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - s.task->submitted()).count());
  else
    metrics_.inter_token.observe(std::chrono::duration<double>(now - s.last_token).count());
  s.last_token = now;
  if (stop_ids_.count(*next)) return finish(s, FinishReason::stop);
  ++s.n_generated;
  s.tokens.push_back(*next);
  StreamEvent ev;
  if (req.top_logprobs >= 0) ev.logprob = logprobs_of(s.logits, *next, req.top_logprobs);
  auto piece = tok_.token_to_piece(*next);
  if (!piece) return finish(s, FinishReason::error, piece.status().to_string());
  const bool stopped = s.stop_filter->add(*piece);
  ev.text = s.utf8.add(s.out_text);
  s.out_text.clear();
  s.task->push(std::move(ev));
  if (stopped) return finish(s, FinishReason::stop);
  if (req.max_tokens >= 0 && s.n_generated >= req.max_tokens) return finish(s, FinishReason::length);
  if (s.cached.size() >= static_cast<size_t>(n_ctx_)) return finish(s, FinishReason::length);
  auto logits =
      s.ctx->decode(std::span<const int32_t>(&s.tokens.back(), 1), static_cast<int>(s.cached.size()));
  if (!logits) {
    fail_cache(s);
    return finish(s, FinishReason::error, logits.status().to_string());
  }
  s.cached.push_back(s.tokens.back());
  s.logits = *logits;
}

void Engine::finish(Slot& s, FinishReason reason, std::string error) {
  StreamEvent done;
  done.kind = StreamEvent::Kind::done;
  // What the stop filter held back is text (after a stop string it holds nothing).
  if (s.stop_filter) s.stop_filter->finish();
  done.text = s.utf8.add(s.out_text) + s.utf8.finish();
  s.out_text.clear();
  done.finish = reason;
  done.error = std::move(error);
  done.n_prompt = static_cast<int>(s.n_prompt);
  done.n_cached = static_cast<int>(s.n_cached);
  done.n_generated = s.n_generated;
  metrics_.requests_finished.fetch_add(1);
  if (reason == FinishReason::cancelled) metrics_.requests_cancelled.fetch_add(1);
  if (reason == FinishReason::timeout) metrics_.requests_timed_out.fetch_add(1);
  metrics_.prompt_tokens.fetch_add(s.n_prompt);
  metrics_.prompt_tokens_cached.fetch_add(s.n_cached);
  metrics_.generated_tokens.fetch_add(static_cast<uint64_t>(s.n_generated));
  metrics_.request_duration.observe(
      std::chrono::duration<double>(Clock::now() - s.task->submitted()).count());
  auto task = std::move(s.task);
  {
    std::lock_guard lock(mu_);
    s.task.reset();
    active_.fetch_sub(1);
  }
  s.sampler.reset();
  task->push(std::move(done));
}

// After a failed decode the cache may hold part of a batch: the slot starts from scratch.
void Engine::fail_cache(Slot& s) {
  s.ctx->kv_cache_clear();
  s.cached.clear();
}

}  // namespace loom::serve
