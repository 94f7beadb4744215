// BatchGenerator: per-sequence samplers over Context::decode_batch.
#include "loom/llm_batch.h"

#include <algorithm>

namespace loom::llm {

namespace {

struct Sequence {
  int id = 0;
  Sampler sampler;
  std::vector<int32_t> history;  // prompt, then the sampled tokens (penalties look at both)
  size_t n_prompt = 0;
  int n_shared = 0;  // prompt positions shared from another sequence's cache
};

}  // namespace

struct BatchGenerator::Impl {
  Context* ctx = nullptr;
  std::vector<Sequence> seqs;  // increasing id
  std::vector<GeneratedToken> out;

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

Result<int> BatchGenerator::add(std::span<const int32_t> prompt, const SamplerParams& sampling) {
  Impl& g = *impl_;
  if (prompt.empty()) return make_error(StatusCode::invalid_argument, "batch: a sequence needs a prompt");
  auto sampler = Sampler::create(sampling);
  if (!sampler) return sampler.status();
  const int id = g.lowest_free_id();
  DecodeOptions o;
  o.seq_id = id;
  (void)g.ctx->kv_cache_seq_rm(id, 0);  // whatever an earlier user left there
  // The longest common prefix with a sequence's stored tokens (all of its history but the last
  // sampled token), leaving at least the prompt's last token to compute for the logits.
  int best = -1;
  size_t best_len = 0;
  for (const Sequence& s : g.seqs) {
    const size_t limit = std::min(s.history.size() - 1, prompt.size() - 1);
    size_t n = 0;
    while (n < limit && s.history[n] == prompt[n]) ++n;
    if (n > best_len) best = s.id, best_len = n;
  }
  int shared = 0;
  if (best >= 0) {
    auto k = g.ctx->kv_cache_seq_share_prefix(best, id, static_cast<int>(best_len));
    if (!k) return k.status();
    shared = *k;
  }
  auto logits = g.ctx->decode(prompt.subspan(static_cast<size_t>(shared)), shared, o);
  if (!logits) {
    (void)g.ctx->kv_cache_seq_rm(id, 0);
    return make_error(logits.status().code(), "batch: sequence {}: {}", id, logits.status().message());
  }
  Sequence s{id, std::move(*sampler), std::vector<int32_t>(prompt.begin(), prompt.end()), prompt.size(),
             shared};
  auto token = s.sampler.sample(*logits, s.history);
  if (!token) {
    (void)g.ctx->kv_cache_seq_rm(id, 0);
    return token.status();
  }
  s.history.push_back(*token);
  const auto at =
      std::lower_bound(g.seqs.begin(), g.seqs.end(), id, [](const Sequence& x, int v) { return x.id < v; });
  g.seqs.insert(at, std::move(s));
  return id;
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

Result<std::span<const GeneratedToken>> BatchGenerator::step() {
  Impl& g = *impl_;
  g.out.clear();
  const size_t n_vocab = static_cast<size_t>(g.ctx->n_vocab());
  const size_t per_pass = static_cast<size_t>(std::max(1, g.ctx->n_batch()));
  std::vector<SeqTokens> batch;
  std::vector<int32_t> next(g.seqs.size());
  // Passes of up to n_batch sequences; all are computed before any sampler runs, so a failing pass
  // leaves every sampler (and its random state) where it was.
  size_t done = 0;
  std::vector<float> logits(g.seqs.size() * n_vocab);
  while (done < g.seqs.size()) {
    const size_t n = std::min(per_pass, g.seqs.size() - done);
    batch.clear();
    for (size_t i = done; i < done + n; ++i) {
      const Sequence& s = g.seqs[i];
      batch.push_back(SeqTokens{s.id, static_cast<int>(s.history.size()) - 1,
                                std::span<const int32_t>(&s.history.back(), 1)});
    }
    auto got = g.ctx->decode_batch(batch);
    if (!got) {
      // Take back the positions the passes before this one stored.
      for (size_t i = 0; i < done; ++i)
        (void)g.ctx->kv_cache_seq_rm(g.seqs[i].id, static_cast<int>(g.seqs[i].history.size()) - 1);
      return got.status();
    }
    std::copy(got->begin(), got->end(), logits.begin() + static_cast<std::ptrdiff_t>(done * n_vocab));
    done += n;
  }
  for (size_t i = 0; i < g.seqs.size(); ++i) {
    Sequence& s = g.seqs[i];
    auto token = s.sampler.sample(std::span<const float>(logits).subspan(i * n_vocab, n_vocab), s.history);
    if (!token) {
      for (const Sequence& r : g.seqs)
        (void)g.ctx->kv_cache_seq_rm(r.id, static_cast<int>(r.history.size()) - 1);
      return make_error(token.status().code(), "batch: sequence {}: {}", s.id, token.status().message());
    }
    next[i] = *token;
  }
  for (size_t i = 0; i < g.seqs.size(); ++i) {
    g.seqs[i].history.push_back(next[i]);
    g.out.push_back(GeneratedToken{g.seqs[i].id, next[i]});
  }
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
