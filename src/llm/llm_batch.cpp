// BatchGenerator: per-sequence samplers over Context::decode_batch.
#include "loom/llm_batch.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "loom/llm_sampling.h"

namespace loom::llm {

namespace {

// Runs f(0..n-1) on the calling thread and n_threads - 1 threads kept for the generator's life (a
// step's samplers: each sequence's is its own, so they run in any order with the same results).
class ForkJoin {
 public:
  explicit ForkJoin(int n_threads) {
    for (int i = 1; i < n_threads; ++i) threads_.emplace_back([this] { work(); });
  }
  ~ForkJoin() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  ForkJoin(const ForkJoin&) = delete;
  ForkJoin& operator=(const ForkJoin&) = delete;

  void run(size_t n, const std::function<void(size_t)>& f) {
    {
      std::lock_guard lock(mu_);
      job_ = &f;
      n_ = n;
      next_.store(0);
      busy_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    start_.notify_all();
    take(f, n);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    job_ = nullptr;
  }

 private:
  void take(const std::function<void(size_t)>& f, size_t n) {
    for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) f(i);
  }
  void work() {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(size_t)>* f = nullptr;
      size_t n = 0;
      {
        std::unique_lock lock(mu_);
        start_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        f = job_;
        n = n_;
      }
      take(*f, n);
      {
        std::lock_guard lock(mu_);
        --busy_;
      }
      done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  int busy_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
};

struct Sequence {
  int id = 0;
  Sampler sampler;
  std::vector<int32_t> history;  // prompt, then the sampled tokens (penalties look at both)
  size_t n_prompt = 0;
  int n_shared = 0;               // prompt positions shared from another sequence's cache
  size_t n_computed = 0;          // prompt positions in the cache (enqueued sequences fill it step by step)
  int chunk = 0;                  // enqueued: prompt tokens per step
  uint64_t order = 0;             // enqueued: prompts are computed in this order
  bool parked = false;            // keeps its cells for prefix sharing, generates nothing
  bool host_sampling = false;     // set_host_sampling: never sampled on the device
  const float* logits = nullptr;  // what the newest token was sampled from (until the next call)
  bool pending() const { return n_computed < n_prompt; }
};

}  // namespace

struct BatchGenerator::Impl {
  Context* ctx = nullptr;
  std::vector<Sequence> seqs;  // increasing id
  std::vector<GeneratedToken> out;
  uint64_t next_order = 0;
  BatchStepStats last;
  // step()'s buffers, kept so that a step allocates nothing once warmed up
  std::vector<Sequence*> run;
  std::vector<SeqTokens> batch;
  std::vector<float> logits, pf_logits;
  std::vector<int32_t> next;
  std::vector<Status> sample_status;
  bool mixed = true;                           // prompt chunks ride in the running sequences' pass
  bool pack = true;                            // set_packed_prompts
  std::vector<Sequence*> packed;               // a packed prompt step's sequences
  Result<std::span<const GeneratedToken>> packed_prompt_step(std::vector<Sequence*>& pack, size_t c);
  bool device_sampling = false;                // set_device_sampling
  // device sampling's per-step buffers: a pass's settings, each running sequence's device token
  // (-1: sampled on the host) or host row, and the generators a step drew from (put back on error)
  std::vector<DeviceSampling> dev;
  std::vector<int32_t> dev_token;
  std::vector<const float*> host_row;
  std::vector<std::pair<Sequence*, SampleRng>> rng_saved;
  std::unique_ptr<ForkJoin> sampling_threads;  // null: sampling on the caller's thread

  int lowest_free_id() const {
    int id = 0;
    for (const Sequence& s : seqs) {  // sorted by id
      if (s.id != id) break;
      ++id;
    }
    return id;
  }
};

BatchGenerator::BatchGenerator(Context& ctx) : impl_(std::make_unique<Impl>()) { impl_->ctx = &ctx; }
BatchGenerator::~BatchGenerator() = default;

namespace {

// `s`'s next token as the device samples it (device_sampling_settings, its generator's state saved
// in `saved` when drawn), or on_device = false where only the host chain is exact or `s` is kept on
// the host (set_host_sampling).
DeviceSampling device_settings(Sequence& s, int64_t n_vocab,
                               std::vector<std::pair<Sequence*, SampleRng>>& saved) {
  if (s.host_sampling) return DeviceSampling{};
  std::optional<SampleRng> before;
  DeviceSampling d = device_sampling_settings(s.sampler, n_vocab, s.history, before);
  if (before) saved.emplace_back(&s, *before);
  return d;
}

// Puts back `s`'s generator as it was before this step's draw (if it drew): the device gave no
// token for it, and the host samples as if the device had never drawn.
void restore_rng(Sequence& s, const std::vector<std::pair<Sequence*, SampleRng>>& saved) {
  for (const auto& [seq, rng] : saved)
    if (seq == &s) {
      s.sampler.set_rng(rng);
      return;
    }
}

// A new sequence of `g`: its sampler, the lowest free id, and the prompt's longest common prefix with
// a sequence already there shared from that one's cache. Nothing is computed yet.
Result<Sequence> start_sequence(Context& ctx, const std::vector<Sequence>& seqs, int id,
                                std::span<const int32_t> prompt, const SamplerParams& sampling) {
  if (prompt.empty()) return make_error(StatusCode::invalid_argument, "batch: a sequence needs a prompt");
  auto sampler = Sampler::create(sampling);
  if (!sampler) return sampler.status();
  (void)ctx.kv_cache_seq_rm(id, 0);  // whatever an earlier user left there
  // The longest common prefix with a sequence's stored tokens (all of its computed history),
  // leaving at least the prompt's last token to compute for the logits.
  int best = -1;
  size_t best_len = 0;
  for (const Sequence& s : seqs) {
    const size_t stored = s.pending() ? s.n_computed : s.history.size() - 1;
    const size_t limit = std::min(stored, prompt.size() - 1);
    size_t n = 0;
    while (n < limit && s.history[n] == prompt[n]) ++n;
    if (n > best_len) best = s.id, best_len = n;
  }
  int shared = 0;
  if (best >= 0) {
    auto k = ctx.kv_cache_seq_share_prefix(best, id, static_cast<int>(best_len));
    if (!k) return k.status();
    shared = *k;
  }
  Sequence s{id, std::move(*sampler), std::vector<int32_t>(prompt.begin(), prompt.end()), prompt.size(),
             shared};
  s.n_computed = static_cast<size_t>(shared);
  return s;
}

void insert_sorted(std::vector<Sequence>& seqs, Sequence s) {
  const auto at =
      std::lower_bound(seqs.begin(), seqs.end(), s.id, [](const Sequence& x, int v) { return x.id < v; });
  seqs.insert(at, std::move(s));
}

}  // namespace

Result<int> BatchGenerator::add(std::span<const int32_t> prompt, const SamplerParams& sampling) {
  Impl& g = *impl_;
  const int id = g.lowest_free_id();
  auto started = start_sequence(*g.ctx, g.seqs, id, prompt, sampling);
  if (!started) return started.status();
  Sequence& s = *started;
  DecodeOptions o;
  o.seq_id = id;
  auto logits = g.ctx->decode(prompt.subspan(s.n_computed), static_cast<int>(s.n_computed), o);
  if (!logits) {
    (void)g.ctx->kv_cache_seq_rm(id, 0);
    return make_error(logits.status().code(), "batch: sequence {}: {}", id, logits.status().message());
  }
  s.n_computed = s.n_prompt;
  auto token = s.sampler.sample(*logits, s.history);
  if (!token) {
    (void)g.ctx->kv_cache_seq_rm(id, 0);
    return token.status();
  }
  s.history.push_back(*token);
  for (Sequence& other : g.seqs) other.logits = nullptr;  // the context's logits are this decode's now
  s.logits = logits->data();
  insert_sorted(g.seqs, std::move(s));
  return id;
}

Result<int> BatchGenerator::enqueue(std::span<const int32_t> prompt, const SamplerParams& sampling,
                                    int chunk) {
  Impl& g = *impl_;
  if (chunk < 0) return make_error(StatusCode::invalid_argument, "batch: prompt chunk {} is negative", chunk);
  const int id = g.lowest_free_id();
  auto started = start_sequence(*g.ctx, g.seqs, id, prompt, sampling);
  if (!started) return started.status();
  Sequence& s = *started;
  // the last prompt token is computed by a step even when the whole prefix was shared
  if (s.n_computed >= s.n_prompt) s.n_computed = s.n_prompt - 1;
  s.chunk = chunk > 0 ? chunk : std::max(1, g.ctx->n_batch());
  s.order = g.next_order++;
  insert_sorted(g.seqs, std::move(s));
  return id;
}

bool BatchGenerator::prefilling(int seq_id) const {
  for (const Sequence& s : impl_->seqs)
    if (s.id == seq_id) return s.pending();
  return false;
}

Status BatchGenerator::remove(int seq_id) {
  Impl& g = *impl_;
  const auto it =
      std::find_if(g.seqs.begin(), g.seqs.end(), [&](const Sequence& s) { return s.id == seq_id; });
  if (it == g.seqs.end())
    return make_error(StatusCode::invalid_argument, "batch: no sequence {} to remove", seq_id);
  g.seqs.erase(it);
  return g.ctx->kv_cache_seq_rm(seq_id, 0);
}

Status BatchGenerator::park(int seq_id) {
  for (Sequence& s : impl_->seqs)
    if (s.id == seq_id) {
      s.parked = true;
      s.logits = nullptr;
      return {};
    }
  return make_error(StatusCode::invalid_argument, "batch: no sequence {} to park", seq_id);
}

bool BatchGenerator::parked(int seq_id) const {
  for (const Sequence& s : impl_->seqs)
    if (s.id == seq_id) return s.parked;
  return false;
}

const BatchStepStats& BatchGenerator::last_step() const { return impl_->last; }

void BatchGenerator::set_mixed_steps(bool on) { impl_->mixed = on; }
void BatchGenerator::set_packed_prompts(bool on) { impl_->pack = on; }

void BatchGenerator::set_device_sampling(bool on) { impl_->device_sampling = on; }

Status BatchGenerator::set_host_sampling(int seq_id, bool on) {
  for (Sequence& s : impl_->seqs)
    if (s.id == seq_id) {
      s.host_sampling = on;
      return {};
    }
  return make_error(StatusCode::invalid_argument, "batch: no sequence {} to sample on the host", seq_id);
}

void BatchGenerator::set_sampling_threads(int n_threads) {
  impl_->sampling_threads.reset();
  if (n_threads > 1) impl_->sampling_threads = std::make_unique<ForkJoin>(n_threads);
}

std::span<const float> BatchGenerator::logits(int seq_id) const {
  for (const Sequence& s : impl_->seqs)
    if (s.id == seq_id)
      return s.logits ? std::span<const float>(s.logits, static_cast<size_t>(impl_->ctx->n_vocab()))
                      : std::span<const float>{};
  return {};
}

// One pass of c prompt tokens from each of `pack` (nothing decoding); the prompts it finishes get their
// first token from the host sampler, as a prompt finished alone does.
Result<std::span<const GeneratedToken>> BatchGenerator::Impl::packed_prompt_step(std::vector<Sequence*>& pack,
                                                                                  size_t c) {
  Impl& g = *this;
  const size_t n_vocab = static_cast<size_t>(g.ctx->n_vocab());
  std::vector<SeqTokens>& batch = g.batch;
  batch.clear();
  for (Sequence* s : pack)
    batch.push_back(SeqTokens{s->id, static_cast<int>(s->n_computed),
                              std::span<const int32_t>(s->history).subspan(s->n_computed, c)});
  auto undo = [&] {
    for (Sequence* s : pack) (void)g.ctx->kv_cache_seq_rm(s->id, static_cast<int>(s->n_computed));
  };
  auto got = g.ctx->decode_batch(batch);
  if (!got) {
    undo();
    return make_error(got.status().code(), "batch: prompts of sequences {} ({} more): {}", pack[0]->id,
                      pack.size() - 1, got.status().message());
  }
  g.last.n_passes = 1;
  g.last.n_prefill_tokens = static_cast<int>(c * pack.size());
  g.last.add_pass(g.ctx->stats());
  const float* rows = got->data();  // the last row of each sequence's chunk, in pack order
  std::vector<int32_t>& next = g.next;
  next.assign(pack.size(), -1);
  for (size_t i = 0; i < pack.size(); ++i) {
    Sequence& s = *pack[i];
    if (s.n_computed + c < s.n_prompt) continue;  // more of its prompt to come
    auto token = s.sampler.sample(std::span<const float>(rows + i * n_vocab, n_vocab), s.history);
    if (!token) {
      undo();
      return make_error(token.status().code(), "batch: sequence {}: {}", s.id, token.status().message());
    }
    next[i] = *token;
  }
  for (size_t i = 0; i < pack.size(); ++i) {
    Sequence& s = *pack[i];
    s.n_computed += c;
    if (s.pending()) continue;
    s.history.push_back(next[i]);
    s.logits = rows + i * n_vocab;
    ++g.last.n_host_sampled;
  }
  for (const Sequence& s : g.seqs)
    if (!s.pending() && !s.parked) g.out.push_back(GeneratedToken{s.id, s.history.back()});
  return std::span<const GeneratedToken>(g.out);
}

Result<std::span<const GeneratedToken>> BatchGenerator::step() {
  Impl& g = *impl_;
  g.out.clear();
  g.last = BatchStepStats{};
  for (Sequence& s : g.seqs) s.logits = nullptr;
  const size_t n_vocab = static_cast<size_t>(g.ctx->n_vocab());
  const size_t per_pass = static_cast<size_t>(std::max(1, g.ctx->n_batch()));

  // The running sequences (one token each), and the oldest enqueued prompt, of which the step
  // computes one chunk: in the running sequences' pass (a mixed pass) when they fit one pass,
  // else in a pass of its own before theirs.
  Sequence* pf = nullptr;
  for (Sequence& s : g.seqs)
    if (s.pending() && !s.parked && (!pf || s.order < pf->order)) pf = &s;
  std::vector<Sequence*>& run = g.run;
  run.clear();
  for (Sequence& s : g.seqs)
    if (!s.pending() && !s.parked) run.push_back(&s);
  // Nothing decoding and several prompts waiting: chunks of one length from as many of them as a
  // pass holds, in one packed pass (Context::decode_batch), the oldest prompt's next chunk setting
  // the length. A 512-token pass costs far less than four of 128 (8B Q4_K_M: 25.9 against 4 x 15.8 ms).
  if (pf && run.empty() && g.pack) {
    const size_t c = std::min(per_pass, pf->n_prompt - pf->n_computed);
    std::vector<Sequence*>& pack = g.packed;
    pack.assign(1, pf);
    for (Sequence& s : g.seqs)  // the others in arrival order: the oldest first
      if (&s != pf && s.pending() && !s.parked && s.n_prompt - s.n_computed >= c) pack.push_back(&s);
    std::sort(pack.begin() + 1, pack.end(), [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
    pack.resize(std::min(pack.size(), per_pass / c));
    if (pack.size() >= 2) return g.packed_prompt_step(pack, c);
  }
  const size_t pf_before = pf ? pf->n_computed : 0;
  size_t pf_n = 0;  // prompt tokens this step
  bool mixed = false;
  if (pf) {
    // While others decode, a chunk stalls them: at most `chunk` tokens; alone, a whole pass.
    const size_t left = pf->n_prompt - pf->n_computed;
    pf_n = std::min(run.empty() ? per_pass : static_cast<size_t>(pf->chunk), left);
    mixed = g.mixed && !run.empty() && run.size() < per_pass;
    if (mixed) pf_n = std::min(pf_n, per_pass - run.size());
  }
  g.last.n_prefill_tokens = static_cast<int>(pf_n);
  g.last.mixed = mixed;

  // 1. Without a mixed pass, the prompt chunk alone first.
  std::vector<float>& pf_logits = g.pf_logits;
  pf_logits.clear();
  const float* pf_row = nullptr;  // the finished prompt's logits
  if (pf && !mixed) {
    DecodeOptions o;
    o.seq_id = pf->id;
    auto got = g.ctx->decode(std::span<const int32_t>(pf->history).subspan(pf->n_computed, pf_n),
                             static_cast<int>(pf->n_computed), o);
    if (!got) {
      (void)g.ctx->kv_cache_seq_rm(pf->id, static_cast<int>(pf_before));
      return make_error(got.status().code(), "batch: sequence {}: {}", pf->id, got.status().message());
    }
    ++g.last.n_passes;
    g.last.add_pass(g.ctx->stats());
    pf->n_computed += pf_n;
    if (!pf->pending()) {
      pf_logits.assign(got->begin(), got->end());  // the running sequences' pass comes next
      pf_row = pf_logits.data();
    }
  }
  auto undo_prefill = [&] {
    if (!pf) return;
    (void)g.ctx->kv_cache_seq_rm(pf->id, static_cast<int>(pf_before));
    pf->n_computed = pf_before;
  };

  // 2. The running sequences' passes of up to n_batch sequences (the first also carrying the prompt
  //    chunk when mixed); all are computed before any sampler runs, so a failing pass leaves every
  //    sampler (and its random state) where it was.
  std::vector<SeqTokens>& batch = g.batch;
  std::vector<float>& logits = g.logits;
  // One pass (the usual case: n_batch >= the sequences) leaves its logits in the context until the
  // next decode, and the samplers read them there; several passes are gathered here (a copy of
  // n_vocab floats per sequence, 32 MB a step for 64 sequences of a 128k vocabulary).
  const bool one_pass = run.size() <= per_pass;
  const float* rows = nullptr;
  if (!one_pass) logits.resize(run.size() * n_vocab);
  // Takes back the positions the first n running sequences stored this step, and the prompt chunk.
  const bool device = g.device_sampling && g.ctx->supports_device_sampling();
  g.rng_saved.clear();
  if (device) {
    g.dev_token.assign(run.size(), -1);
    g.host_row.assign(run.size(), nullptr);
  }
  int32_t pf_device_token = -1;  // the enqueued sequence's first token, when the device sampled it
  auto undo = [&](size_t n) {
    for (auto& [seq, rng] : g.rng_saved) seq->sampler.set_rng(rng);
    for (size_t i = 0; i < n; ++i)
      (void)g.ctx->kv_cache_seq_rm(run[i]->id, static_cast<int>(run[i]->history.size()) - 1);
    undo_prefill();
  };
  size_t done = 0;
  while (done < run.size()) {
    const size_t n = std::min(per_pass, run.size() - done);
    batch.clear();
    const bool with_chunk = mixed && done == 0;
    if (with_chunk)  // first, so that the running sequences' rows follow its row
      batch.push_back(SeqTokens{pf->id, static_cast<int>(pf->n_computed),
                                std::span<const int32_t>(pf->history).subspan(pf->n_computed, pf_n)});
    for (size_t i = done; i < done + n; ++i) {
      const Sequence& s = *run[i];
      batch.push_back(SeqTokens{s.id, static_cast<int>(s.history.size()) - 1,
                                std::span<const int32_t>(&s.history.back(), 1)});
    }
    if (device) {
      // Only token ids come back, and the rows of sequences the host samples (copied out: the
      // next pass reuses the context's buffer).
      g.dev.clear();
      if (with_chunk) {
        DeviceSampling d;
        d.on_device = true;  // an unfinished chunk's row: a greedy pick nobody reads, no logits back
        if (pf->n_computed + pf_n >= pf->n_prompt)
          d = device_settings(*pf, static_cast<int64_t>(n_vocab), g.rng_saved);
        g.dev.push_back(d);
      }
      for (size_t i = done; i < done + n; ++i)
        g.dev.push_back(device_settings(*run[i], static_cast<int64_t>(n_vocab), g.rng_saved));
      auto got = g.ctx->decode_batch_sampled(batch, g.dev);
      if (!got) {
        undo(done);
        return got.status();
      }
      g.last.add_pass(g.ctx->stats());
      const float* host = got->host_logits.data();
      size_t e = 0;
      if (with_chunk) {
        pf->n_computed += pf_n;
        if (!pf->pending()) {
          pf_device_token = got->tokens[0];
          if (pf_device_token < 0) {
            restore_rng(*pf, g.rng_saved);
            pf_logits.assign(host, host + n_vocab);
            pf_row = pf_logits.data();
            host += n_vocab;
          }
        } else if (got->tokens[0] < 0) {
          host += n_vocab;
        }
        e = 1;
      }
      for (size_t i = done; i < done + n; ++i, ++e) {
        g.dev_token[i] = got->tokens[e];
        if (g.dev_token[i] >= 0) continue;
        restore_rng(*run[i], g.rng_saved);
        if (logits.size() < run.size() * n_vocab) logits.resize(run.size() * n_vocab);
        float* row = logits.data() + i * n_vocab;
        std::copy(host, host + n_vocab, row);
        g.host_row[i] = row;
        host += n_vocab;
      }
      done += n;
      ++g.last.n_passes;
      continue;
    }
    auto got = g.ctx->decode_batch(batch);
    if (!got) {
      undo(done);
      return got.status();
    }
    g.last.add_pass(g.ctx->stats());
    const float* got_rows = got->data();
    if (with_chunk) {
      pf->n_computed += pf_n;
      if (!pf->pending()) pf_row = got_rows;  // stays in the context: no later pass this step
      got_rows += n_vocab;
    }
    if (one_pass)
      rows = got_rows;
    else
      std::copy(got_rows, got_rows + n * n_vocab,
                logits.begin() + static_cast<std::ptrdiff_t>(done * n_vocab));
    done += n;
    ++g.last.n_passes;
  }
  g.last.n_decoded = static_cast<int>(run.size());
  if (!one_pass && !device) rows = logits.data();

  // 3. Sampling: the running sequences' next tokens (over the sampling threads when there are
  //    enough sequences to share) and, when its prompt is done, the enqueued sequence's first.
  std::vector<int32_t>& next = g.next;
  next.resize(run.size());
  std::vector<Status>& status = g.sample_status;
  status.assign(run.size(), Status{});
  const std::function<void(size_t)> sample_one = [&](size_t i) {
    Sequence& s = *run[i];
    if (device && g.dev_token[i] >= 0) {
      next[i] = g.dev_token[i];
      return;
    }
    const float* row = device ? g.host_row[i] : rows + i * n_vocab;
    auto token = s.sampler.sample(std::span<const float>(row, n_vocab), s.history);
    if (token)
      next[i] = *token;
    else
      status[i] = token.status();
  };
  constexpr size_t kSequencesPerThread = 4;  // fewer: waking threads costs more than it saves
  if (g.sampling_threads && run.size() >= 2 * kSequencesPerThread)
    g.sampling_threads->run(run.size(), sample_one);
  else
    for (size_t i = 0; i < run.size(); ++i) sample_one(i);
  for (size_t i = 0; i < run.size(); ++i)
    if (!status[i].ok()) {
      undo(run.size());
      return make_error(status[i].code(), "batch: sequence {}: {}", run[i]->id, status[i].message());
    }
  int32_t first = pf_device_token;
  if (pf_row) {
    auto token = pf->sampler.sample(std::span<const float>(pf_row, n_vocab), pf->history);
    if (!token) {
      undo(run.size());
      return make_error(token.status().code(), "batch: sequence {}: {}", pf->id, token.status().message());
    }
    first = *token;
  }
  for (size_t i = 0; i < run.size(); ++i) {
    run[i]->history.push_back(next[i]);
    run[i]->logits = device ? g.host_row[i] : rows + i * n_vocab;
    const bool on_device = device && g.dev_token[i] >= 0;
    ++(on_device ? g.last.n_device_sampled : g.last.n_host_sampled);
  }
  if (pf_row || pf_device_token >= 0) {
    pf->history.push_back(first);
    pf->logits = pf_row;
    ++(pf_row ? g.last.n_host_sampled : g.last.n_device_sampled);
  }
  // every sequence not prefilling or parked now ran this step or finished its prompt in it
  // (increasing id)
  for (const Sequence& s : g.seqs)
    if (!s.pending() && !s.parked) g.out.push_back(GeneratedToken{s.id, s.history.back()});
  return std::span<const GeneratedToken>(g.out);
}

std::vector<int> BatchGenerator::sequences() const {
  std::vector<int> ids;
  for (const Sequence& s : impl_->seqs) ids.push_back(s.id);
  return ids;
}

int BatchGenerator::shared_prompt_tokens(int seq_id) const {
  for (const Sequence& s : impl_->seqs)
    if (s.id == seq_id) return s.n_shared;
  return 0;
}

int BatchGenerator::n_sequences() const { return static_cast<int>(impl_->seqs.size()); }

std::span<const int32_t> BatchGenerator::generated(int seq_id) const {
  for (const Sequence& s : impl_->seqs)
    if (s.id == seq_id) return std::span<const int32_t>(s.history).subspan(s.n_prompt);
  return {};
}

}  // namespace loom::llm
