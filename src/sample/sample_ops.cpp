// The sampler building blocks: each narrows or reshapes a candidate set. Definitions follow
// llama.cpp's samplers (src/llama-sampler.cpp) so that settings mean the same thing in both.
#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/sample.h"

namespace loom {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Strict order "a ranks before b": larger logit, then lower id, so every sort is deterministic.
bool better(const TokenData& a, const TokenData& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

size_t keep_at_least(size_t min_keep) { return std::max<size_t>(1, min_keep); }

// Puts the best of data[from..] in sorted order at [from, to): nth_element is linear, so a prefix of
// k costs O(n + k log k) where std::partial_sort's heap costs O(n log k).
void sort_prefix(std::vector<TokenData>& data, size_t from, size_t to) {
  const auto first = data.begin() + static_cast<std::ptrdiff_t>(from);
  const auto mid = data.begin() + static_cast<std::ptrdiff_t>(to);
  if (mid != data.end()) std::nth_element(first, mid, data.end(), better);
  std::sort(first, mid, better);
}

}  // namespace

Status validate_logits(std::span<const float> logits) {
  if (logits.empty()) return make_error(StatusCode::invalid_argument, "sampler: no logits (n_vocab is 0)");
  // Integer flags rather than bools or early exits keep this loop vectorizable: it runs on the whole
  // vocabulary every step.
  int bad = 0, finite = 0;
  for (float x : logits) {
    bad |= !(x < kInf);  // NaN or +inf
    finite |= x > -kInf;
  }
  if (bad) {
    for (size_t i = 0; i < logits.size(); ++i)
      if (!(logits[i] < kInf))
        return make_error(StatusCode::invalid_argument, "sampler: logits[{}] is {}", i,
                          std::isnan(logits[i]) ? "NaN" : "+inf");
  }
  if (!finite)
    return make_error(StatusCode::invalid_argument, "sampler: all {} logits are -inf: no token can be drawn",
                      logits.size());
  return {};
}

Status apply_penalties(std::span<float> logits, std::span<const int32_t> history, const PenaltyParams& p) {
  if (!p.active() || history.empty()) return {};
  const size_t window =
      p.last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(p.last_n));
  std::vector<int32_t> ids(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= logits.size())
      return make_error(StatusCode::invalid_argument,
                        "sampler: history token {} is outside the vocabulary [0, {})", id, logits.size());
  // The window is short (64 by default): sorting it counts repeats without a hash map.
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    const float count = static_cast<float>(j - i);
    float& l = logits[static_cast<size_t>(ids[i])];
    l = l <= 0.0f ? l * p.repeat : l / p.repeat;
    l -= count * p.frequency + p.presence;
    // only absurd settings (|penalty| near FLT_MAX) get here; -inf stays a masked token
    if (!(l < kInf))
      return make_error(StatusCode::invalid_argument, "sampler: penalties turned token {}'s logit into {}",
                        ids[i], std::isnan(l) ? "NaN" : "+inf");
    i = j;
  }
  return {};
}

int32_t sample_greedy(std::span<const float> logits) {
  // Two passes: the maximum over 16 independent lanes (no loop-carried index, so the compiler
  // interleaves them; about 2x the single running argmax on 128k logits), then its first position.
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -kInf);
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  float best = -kInf;
  for (float m : lane) best = m > best ? m : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  if (!(best > -kInf)) return -1;
  for (size_t k = 0; k < n; ++k)
    if (logits[k] == best) return static_cast<int32_t>(k);
  return -1;  // unreachable: best came from the span
}

void candidates_from_logits(std::span<const float> logits, TokenCandidates& out) {
  out.data.clear();
  out.data.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > -kInf) out.data.push_back({static_cast<int32_t>(i), logits[i], 0.0f});
  out.sorted = false;
}

void candidates_top_k(std::span<const float> logits, int32_t k, TokenCandidates& out) {
  const size_t n = logits.size();
  if (k <= 0 || static_cast<size_t>(k) >= n) return candidates_from_logits(logits, out);
  // A heap of the k best so far with the worst at the front: most tokens fail one comparison with
  // it, so this is one pass over the vocabulary (measured: see tests/unit/test_sample.cpp).
  auto& h = out.data;
  h.clear();
  h.reserve(static_cast<size_t>(k));
  size_t i = 0;
  for (; i < n && h.size() < static_cast<size_t>(k); ++i)
    if (logits[i] > -kInf) h.push_back({static_cast<int32_t>(i), logits[i], 0.0f});
  std::make_heap(h.begin(), h.end(), better);
  for (; i < n; ++i) {
    const float v = logits[i];
    // ids grow with i, so a later token with an equal logit ranks lower and stays out
    if (!(v > h.front().logit)) continue;
    std::pop_heap(h.begin(), h.end(), better);
    h.back() = {static_cast<int32_t>(i), v, 0.0f};
    std::push_heap(h.begin(), h.end(), better);
  }
  std::sort_heap(h.begin(), h.end(), better);
  out.sorted = true;
}

void apply_top_k(TokenCandidates& c, int32_t k) {
  if (k <= 0 || c.data.empty()) return;
  const size_t kk = std::min(static_cast<size_t>(k), c.data.size());
  if (!c.sorted) sort_prefix(c.data, 0, kk);
  c.data.resize(kk);
  c.sorted = true;
}

void softmax_candidates(TokenCandidates& c) {
  if (c.data.empty()) return;
  float max_logit = c.data[0].logit;
  if (!c.sorted)
    for (const TokenData& t : c.data) max_logit = std::max(max_logit, t.logit);
  double sum = 0.0;
  for (TokenData& t : c.data) {
    t.p = std::exp(t.logit - max_logit);
    sum += t.p;
  }
  const double inv = 1.0 / sum;
  for (TokenData& t : c.data) t.p = static_cast<float>(t.p * inv);
}

namespace {

// Reorders `d` so that its best m tokens come first, m being the smallest count whose probability
// mass reaches `p`, and returns m (d.size() when rounding keeps the total below p). A quickselect
// weighted by probability: expected O(n) whatever the nucleus size, where sorting costs
// O(n log n) -- a flat distribution's nucleus can hold most of a 128k vocabulary.
size_t select_nucleus(std::vector<TokenData>& d, double p) {
  size_t lo = 0, hi = d.size();
  double need = p;  // mass still missing once every token before `lo` is in
  // Median-of-3 pivots make a bad split unlikely; past this many rounds, sort what is left.
  int rounds_left = 64;
  while (hi - lo > 32 && rounds_left-- > 0) {
    const size_t a = lo, b = lo + (hi - lo) / 2, c = hi - 1;
    size_t med = better(d[a], d[b]) ? (better(d[b], d[c]) ? b : (better(d[a], d[c]) ? c : a))
                                    : (better(d[a], d[c]) ? a : (better(d[b], d[c]) ? c : b));
    std::swap(d[med], d[hi - 1]);
    const TokenData pivot = d[hi - 1];
    const auto first = d.begin() + static_cast<std::ptrdiff_t>(lo);
    const auto mid_it = std::partition(first, d.begin() + static_cast<std::ptrdiff_t>(hi - 1),
                                       [&](const TokenData& t) { return better(t, pivot); });
    const size_t mid = static_cast<size_t>(mid_it - d.begin());
    std::swap(d[mid], d[hi - 1]);  // [lo, mid) beat the pivot, which sits at mid
    double top = 0.0;
    for (size_t i = lo; i < mid; ++i) top += d[i].p;
    if (top >= need) {
      hi = mid;
      continue;
    }
    need -= top + d[mid].p;
    if (need <= 0.0) return mid + 1;
    lo = mid + 1;
  }
  std::sort(d.begin() + static_cast<std::ptrdiff_t>(lo), d.begin() + static_cast<std::ptrdiff_t>(hi), better);
  for (size_t i = lo; i < hi; ++i) {
    need -= d[i].p;
    if (need <= 0.0) return i + 1;
  }
  return hi;  // rounding: [0, hi) was known to hold mass >= p
}

}  // namespace

void apply_top_p(TokenCandidates& c, float p, size_t min_keep) {
  if (p >= 1.0f || c.data.empty()) return;
  softmax_candidates(c);
  const size_t n = c.data.size();
  const size_t keep = std::min(keep_at_least(min_keep), n);
  // Small sets are simply sorted; large unsorted ones go through the linear-time selection and
  // stay unsorted (min-p, temperature and the draw do not need order).
  if (!c.sorted && n <= 1024) {
    sort_prefix(c.data, 0, n);
    c.sorted = true;
  }
  size_t cut = n;
  if (c.sorted) {
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      cum += c.data[i].p;
      if (cum >= p) {
        cut = i + 1;
        break;
      }
    }
  } else {
    cut = select_nucleus(c.data, p);
    if (cut < keep) {
      sort_prefix(c.data, cut, keep);  // everything after the nucleus ranks below it
      cut = keep;
    }
  }
  c.data.resize(std::max(cut, keep));
}

void apply_min_p(TokenCandidates& c, float p, size_t min_keep) {
  if (p <= 0.0f || c.data.empty()) return;
  const size_t keep = std::min(keep_at_least(min_keep), c.data.size());
  float max_logit = c.data[0].logit;
  if (!c.sorted)
    for (const TokenData& t : c.data) max_logit = std::max(max_logit, t.logit);
  // p_i >= p * p_max  <=>  logit_i >= logit_max + log(p): no softmax needed.
  const float threshold = max_logit + std::log(p);
  if (c.sorted) {
    size_t cut = 0;
    while (cut < c.data.size() && c.data[cut].logit >= threshold) ++cut;
    c.data.resize(std::max(cut, keep));
    return;
  }
  size_t passing = 0;
  for (const TokenData& t : c.data) passing += t.logit >= threshold;
  if (passing < keep) return apply_top_k(c, static_cast<int32_t>(keep));
  c.data.erase(
      std::remove_if(c.data.begin(), c.data.end(), [&](const TokenData& t) { return t.logit < threshold; }),
      c.data.end());
}

void apply_temperature(TokenCandidates& c, float t) {
  if (c.data.empty()) return;
  if (t <= 0.0f) {
    const TokenData best = c.sorted ? c.data[0] : *std::min_element(c.data.begin(), c.data.end(), better);
    c.data.assign(1, best);
    c.sorted = true;
    return;
  }
  for (TokenData& d : c.data) d.logit /= t;
}

double SampleRng::uniform() {
  // Two 32-bit draws give 27 + 26 bits: the 53-bit construction of the MT19937 reference code.
  const uint64_t a = gen_() >> 5;
  const uint64_t b = gen_() >> 6;
  return static_cast<double>((a << 26) | b) * 0x1p-53;
}

int32_t sample_distribution(TokenCandidates& c, SampleRng& rng) {
  if (c.data.empty()) return -1;
  float max_logit = c.data[0].logit;
  if (!c.sorted)
    for (const TokenData& t : c.data) max_logit = std::max(max_logit, t.logit);
  // Unnormalized weights go in p so each exp is computed once (the whole vocabulary when every
  // filter is off); the running sums are double so a 128k-token tail is not lost to rounding.
  double sum = 0.0;
  for (TokenData& t : c.data) {
    t.p = std::exp(t.logit - max_logit);
    sum += t.p;
  }
  const double target = rng.uniform() * sum;
  double cum = 0.0;
  int32_t last_possible = c.data[0].id;
  for (const TokenData& t : c.data) {
    if (t.p <= 0.0f) continue;
    cum += t.p;
    last_possible = t.id;
    if (target < cum) return t.id;
  }
  return last_possible;  // rounding left the running sum a hair below the total
}

}  // namespace loom
