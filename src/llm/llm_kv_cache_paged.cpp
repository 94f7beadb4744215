// PagedKvCache: block tables over one pool of fixed-size blocks (llm_kv_cache.h).
//
// Blocks are taken lowest index first, so a run is reproducible whatever freed what before: the
// cells a sequence lands in never change its results (attention gathers them in position order),
// but a fixed policy keeps memory traces and debugging deterministic.
#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "llm_kv_cache.h"

namespace loom::llm::detail {

PagedKvCache::PagedKvCache(KvStorage storage, int block_size, int n_window_blocks, int n_swa)
    : KvCache(std::move(storage)), block_size_(block_size), n_swa_(n_swa) {
  const int n_blocks = n_cells() / block_size_;
  block_refs_.assign(static_cast<size_t>(n_blocks), 0);
  block_fill_.assign(static_cast<size_t>(n_blocks), 0);
  window_refs_.assign(static_cast<size_t>(n_window_blocks), 0);
  clear();
}

int64_t PagedKvCache::window_blocks_needed(int n_swa, int block_size, int n_seq_max, int n_batch) {
  // A step of n tokens from q = Q * block_size + r holds the blocks from the one of
  // Q * block_size - n_swa + 1 (window_drop_point) to the one of q + n - 1: at most
  // ceil((n_swa - 1) / block_size) + ceil((n - 1) / block_size) + 1 of them (r = block_size - 1).
  const auto ceil_div = [&](int64_t a) { return (std::max<int64_t>(a, 0) + block_size - 1) / block_size; };
  auto step_blocks = [&](int64_t n) { return ceil_div(n_swa - 1) + ceil_div(n - 1) + 1; };
  const int64_t decode = step_blocks(1), chunk = step_blocks(std::max(n_batch, 1));
  return static_cast<int64_t>(std::max(n_seq_max, 1) - 1) * decode + std::max(decode, chunk);
}

int PagedKvCache::window_drop_point(int first_query) const {
  // Blocks before the returned one hold only positions no query at first_query or later sees. The
  // window is taken back to the start of first_query's block, so that a sequence at rest still holds
  // the window of its last block boundary: seq_share_prefix can lend it all but its partial block
  // (a chat's next turn starts with the whole previous one).
  const int aligned = first_query / block_size_ * block_size_;
  return std::max(0, aligned - n_swa_ + 1) / block_size_;
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(const HParams& hp, int n_ctx, int block_size,
                                                           BufferType& type, BufferType* offload_type,
                                                           int first_offload_layer, int n_window_blocks) {
  if (block_size < 1 || n_ctx < 1 || n_window_blocks < 0)
    return make_error(StatusCode::invalid_argument,
                      "paged kv cache: block size {} and n_ctx {} must be positive, window blocks {} >= 0",
                      block_size, n_ctx, n_window_blocks);
  const int64_t n_blocks = (static_cast<int64_t>(n_ctx) + block_size - 1) / block_size;
  if (n_blocks * block_size > std::numeric_limits<int32_t>::max())
    return make_error(StatusCode::invalid_argument, "paged kv cache: {} blocks of {} cells are too many",
                      n_blocks, block_size);
  if (n_window_blocks >= n_blocks || !hp.has_swa()) n_window_blocks = 0;  // no smaller than the cache
  // A window block must exist for every position a query sees: n_swa positions at least.
  if (n_window_blocks > 0 && static_cast<int64_t>(n_window_blocks) * block_size < hp.n_swa)
    return make_error(StatusCode::invalid_argument,
                      "paged kv cache: {} window blocks of {} cells cannot hold a window of {}", n_window_blocks,
                      block_size, hp.n_swa);
  auto storage = KvStorage::create(hp, static_cast<int>(n_blocks * block_size), type, offload_type,
                                   first_offload_layer, n_window_blocks * block_size);
  if (!storage) return storage.status();
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(std::move(storage.value()), block_size,
                                                        n_window_blocks, static_cast<int>(hp.n_swa)));
}

PagedKvCache::Sequence* PagedKvCache::find(int seq) {
  for (auto& [id, s] : seqs_)
    if (id == seq) return &s;
  return nullptr;
}

const PagedKvCache::Sequence* PagedKvCache::find(int seq) const {
  for (const auto& [id, s] : seqs_)
    if (id == seq) return &s;
  return nullptr;
}

std::span<const int32_t> PagedKvCache::block_table(int seq) const {
  const Sequence* s = find(seq);
  return s ? std::span<const int32_t>(s->blocks) : std::span<const int32_t>();
}

int PagedKvCache::room(int seq) const {
  const Sequence* s = find(seq);
  const int in_last = s ? static_cast<int>(s->blocks.size()) * block_size_ - s->length : 0;
  return in_last + n_free_blocks() * block_size_;
}

Result<std::vector<int32_t>> PagedKvCache::claim(std::span<const int32_t> positions, int seq) {
  if (seq < 0)
    return make_error(StatusCode::invalid_argument, "paged kv cache: sequence id {} must be >= 0", seq);
  if (positions.empty()) return std::vector<int32_t>{};
  const Sequence* existing = find(seq);
  const int32_t length = existing ? existing->length : 0;
  for (size_t i = 0; i < positions.size(); ++i)
    if (positions[i] != length + static_cast<int32_t>(i))
      return make_error(
          StatusCode::invalid_argument,
          "paged kv cache: sequence {} holds positions [0, {}); position {} at index {} must be {} "
          "(a sequence grows at its end)",
          seq, length, positions[i], i, length + static_cast<int32_t>(i));
  const int64_t new_length = static_cast<int64_t>(length) + static_cast<int64_t>(positions.size());
  const int64_t have = existing ? static_cast<int64_t>(existing->blocks.size()) : 0;
  const int64_t need = (new_length + block_size_ - 1) / block_size_ - have;
  if (need > n_free_blocks())
    return make_error(
        StatusCode::out_of_memory,
        "paged kv cache full: sequence {} needs {} more block(s) of {} cells for {} tokens, {} of {} "
        "blocks are free",
        seq, need, block_size_, positions.size(), n_free_blocks(), n_blocks());
  Sequence* s = existing ? find(seq) : &seqs_.emplace_back(seq, Sequence{}).second;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = free_blocks_.back();
    free_blocks_.pop_back();
    block_refs_[b] = 1;
    block_fill_[b] = 0;
    s->blocks.push_back(b);
  }
  std::vector<int32_t> cells(positions.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    const int32_t p = positions[i];
    const int32_t b = s->blocks[p / block_size_];
    LOOM_ASSERT(block_refs_[b] == 1);  // shared blocks are full: nobody writes into them
    cells[i] = b * block_size_ + p % block_size_;
    block_fill_[b] = p % block_size_ + 1;
  }
  s->length = static_cast<int32_t>(new_length);
  n_used_ += static_cast<int>(positions.size());
  return cells;
}

void PagedKvCache::release(std::span<const int32_t> cells) {
  // A failed step's cells are the last positions of their sequences: cut each sequence back to the
  // first position released.
  // Those cells lie in blocks of one table each (shared blocks are full, so never claimed from).
  std::vector<std::pair<int, int>> cut;  // (seq, new length)
  for (const auto& [seq, s] : seqs_) {
    int length = s.length;
    for (int32_t c : cells) {
      if (c < 0 || c >= n_cells()) continue;
      const auto it = std::find(s.blocks.begin(), s.blocks.end(), c / block_size_);
      if (it == s.blocks.end() || block_refs_[*it] != 1) continue;
      length = std::min(length, static_cast<int>(it - s.blocks.begin()) * block_size_ + c % block_size_);
    }
    if (length < s.length) cut.emplace_back(seq, length);
  }
  for (const auto& [seq, length] : cut) truncate(seq, length);
}

void PagedKvCache::truncate(int seq, int length) {
  Sequence* s = find(seq);
  if (!s || length >= s->length) return;
  truncate_window(*s, length);
  const size_t keep = static_cast<size_t>((length + block_size_ - 1) / block_size_);
  for (size_t i = keep; i < s->blocks.size(); ++i) {
    const int32_t b = s->blocks[i];
    if (--block_refs_[b] > 0) continue;  // still in another table
    n_used_ -= block_fill_[b];
    block_fill_[b] = 0;
    free_blocks_.push_back(b);
  }
  s->blocks.resize(keep);
  if (length % block_size_ != 0) {  // the kept last block is this sequence's own (seq_rm checks)
    const int32_t b = s->blocks.back();
    LOOM_ASSERT(block_refs_[b] == 1);
    n_used_ -= block_fill_[b] - length % block_size_;
    block_fill_[b] = length % block_size_;
  }
  s->length = length;
  std::sort(free_blocks_.begin(), free_blocks_.end(), std::greater<>());
  if (length == 0)
    seqs_.erase(std::find_if(seqs_.begin(), seqs_.end(), [&](const auto& x) { return x.first == seq; }));
}

void PagedKvCache::clear() {
  seqs_.clear();
  std::fill(window_refs_.begin(), window_refs_.end(), 0);
  free_window_.resize(window_refs_.size());
  for (size_t i = 0; i < free_window_.size(); ++i)
    free_window_[i] = static_cast<int32_t>(free_window_.size() - 1 - i);
  std::fill(block_refs_.begin(), block_refs_.end(), 0);
  std::fill(block_fill_.begin(), block_fill_.end(), 0);
  free_blocks_.resize(block_refs_.size());
  for (size_t i = 0; i < free_blocks_.size(); ++i)
    free_blocks_[i] = static_cast<int32_t>(free_blocks_.size() - 1 - i);
  n_used_ = 0;
}

Status PagedKvCache::seq_rm(int seq, int p0, int p1) {
  const Sequence* s = find(seq);
  if (!s || p0 >= s->length) return {};
  if (p1 >= 0 && p1 < s->length)
    return make_error(
        StatusCode::invalid_argument,
        "paged kv cache: sequence {} holds positions [0, {}); only a suffix can be removed, not "
        "[{}, {})",
        seq, s->length, p0, p1);
  if (p0 % block_size_ != 0 && block_refs_[s->blocks[static_cast<size_t>(p0 / block_size_)]] > 1)
    return make_error(
        StatusCode::invalid_argument,
        "paged kv cache: sequence {} shares block {} (positions [{}, {})) with another sequence; cut "
        "it at a multiple of {}, not at {}",
        seq, s->blocks[static_cast<size_t>(p0 / block_size_)], p0 / block_size_ * block_size_,
        (p0 / block_size_ + 1) * block_size_, block_size_, p0);
  // Continuing at p0 needs the window before it, which the ring may have given back (Context
  // checks this first with its own message; this guards direct callers).
  if (p0 > 0 && p0 < seq_rewind_min(seq))
    return make_error(StatusCode::invalid_argument,
                      "paged kv cache: sequence {} cannot be cut at {}: its sliding-window layers hold only "
                      "positions from {} (cut at {} or later, or from 0)",
                      seq, p0, s->w_dropped * block_size_, seq_rewind_min(seq));
  truncate(seq, p0);
  return {};
}

int PagedKvCache::seq_share_prefix(int src, int dst, int n_positions) {
  const Sequence* from = find(src);
  if (!from || src == dst || dst < 0 || find(dst) || n_positions <= 0) return 0;
  const int n_blocks = std::min(n_positions, from->length) / block_size_;
  if (n_blocks == 0) return 0;
  const int k = n_blocks * block_size_;
  // With a ring, dst continues at k, whose queries need positions from k - n_swa + 1: src must still
  // hold them (a shorter prefix would need even older ones), else nothing is shared.
  if (windowed() && (from->w_length < k || from->w_dropped * block_size_ > std::max(0, k - n_swa_ + 1)))
    return 0;
  std::vector<int32_t> shared(from->blocks.begin(), from->blocks.begin() + n_blocks);
  for (int32_t b : shared) ++block_refs_[b];
  Sequence s;
  s.blocks = std::move(shared);
  s.length = k;
  if (windowed()) {
    s.window.assign(from->window.begin(), from->window.begin() + n_blocks);
    for (int32_t b : s.window)
      if (b >= 0) ++window_refs_[b];
    s.w_length = k;
    s.w_dropped = std::min(from->w_dropped, n_blocks);
    drop_window(s, k);
  }
  seqs_.emplace_back(dst, std::move(s));
  return k;
}

int PagedKvCache::seq_pos_max(int seq) const {
  const Sequence* s = find(seq);
  return s ? s->length - 1 : -1;
}

void PagedKvCache::seq_cells(int seq, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const {
  cells.clear();
  positions.clear();
  const Sequence* s = find(seq);
  if (!s) return;
  cells.resize(static_cast<size_t>(s->length));
  positions.resize(static_cast<size_t>(s->length));
  for (int32_t p = 0; p < s->length; ++p) {
    cells[p] = s->blocks[p / block_size_] * block_size_ + p % block_size_;
    positions[p] = p;
  }
}

void PagedKvCache::fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask,
                             int n_swa) const {
  LOOM_ASSERT(n_kv >= 0 && n_kv <= n_cells());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill(mask, mask + positions.size() * static_cast<size_t>(n_kv), neg_inf);
  std::vector<int32_t> cells, pos;
  seq_cells(seq, cells, pos);
  for (size_t i = 0; i < positions.size(); ++i) {
    float* row = mask + i * static_cast<size_t>(n_kv);
    for (size_t j = 0; j < cells.size(); ++j)
      if (cells[j] < n_kv && pos[j] <= positions[i] && (n_swa <= 0 || positions[i] - pos[j] < n_swa))
        row[cells[j]] = 0.0f;
  }
}

// ---- the sliding-window ring: window blocks -------------------------------------------------------

void PagedKvCache::unref_window(int32_t b) {
  if (b < 0 || --window_refs_[b] > 0) return;  // still in another window table
  free_window_.insert(std::upper_bound(free_window_.begin(), free_window_.end(), b, std::greater<>()), b);
}

int PagedKvCache::droppable_window(const Sequence& s, int first_query) const {
  const int n_drop = std::min(window_drop_point(first_query), static_cast<int>(s.window.size()));
  int freed = 0;
  for (int i = s.w_dropped; i < n_drop; ++i)
    if (s.window[i] >= 0 && window_refs_[s.window[i]] == 1) ++freed;
  return freed;
}

void PagedKvCache::drop_window(Sequence& s, int first_query) {
  const int n_drop = std::min(window_drop_point(first_query), static_cast<int>(s.window.size()));
  for (int i = s.w_dropped; i < n_drop; ++i) {
    unref_window(s.window[i]);
    s.window[i] = -1;
  }
  s.w_dropped = std::max(s.w_dropped, n_drop);
}

void PagedKvCache::truncate_window(Sequence& s, int length) {
  if (length >= s.w_length) return;
  const size_t keep = static_cast<size_t>((length + block_size_ - 1) / block_size_);
  for (size_t i = keep; i < s.window.size(); ++i) unref_window(s.window[i]);
  if (s.window.size() > keep) s.window.resize(keep);
  s.w_length = length;
  s.w_dropped = std::min(s.w_dropped, static_cast<int32_t>(keep));
}

Result<std::vector<int32_t>> PagedKvCache::claim_window(std::span<const int32_t> positions, int seq) {
  LOOM_ASSERT(windowed());
  if (positions.empty()) return std::vector<int32_t>{};
  Sequence* s = find(seq);
  const int32_t first = positions[0];
  if (!s || s->w_length != first || s->length < first + static_cast<int32_t>(positions.size()))
    return make_error(StatusCode::internal,
                      "paged kv cache: window cells of sequence {} for positions from {}: claim its cells first "
                      "(its window holds [0, {}))",
                      seq, first, s ? s->w_length : 0);
  if (const int rewind = seq_rewind_min(seq); first < rewind)
    return make_error(
        StatusCode::invalid_argument,
        "paged kv cache: sequence {} continues at position {}, but its sliding-window layers keep only "
        "the last {} positions and hold none before {}; clear the sequence (kv_cache_seq_rm from 0) "
        "and decode it again",
        seq, first, n_swa_, s->w_dropped * block_size_);
  const int64_t end = static_cast<int64_t>(first) + static_cast<int64_t>(positions.size());
  const int64_t need = (end + block_size_ - 1) / block_size_ - static_cast<int64_t>(s->window.size());
  // The step's queries start at `first`: blocks none of them sees go back before new ones are taken.
  const int64_t avail = n_free_window_blocks() + droppable_window(*s, first);
  if (need > avail)
    return make_error(StatusCode::out_of_memory,
                      "paged kv cache: sequence {} needs {} more sliding-window block(s) of {} cells, {} of "
                      "{} are free (ContextParams::n_seq_max sizes them)",
                      seq, need, block_size_, avail, n_window_blocks());
  drop_window(*s, first);
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = free_window_.back();
    free_window_.pop_back();
    window_refs_[b] = 1;
    s->window.push_back(b);
  }
  std::vector<int32_t> cells(positions.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    const int32_t p = positions[i];
    const int32_t b = s->window[static_cast<size_t>(p / block_size_)];
    LOOM_ASSERT(b >= 0 && window_refs_[b] == 1);  // shared window blocks are full, like shared blocks
    cells[i] = b * block_size_ + p % block_size_;
  }
  s->w_length = static_cast<int32_t>(end);
  return cells;
}

void PagedKvCache::release_window(std::span<const int32_t> cells) {
  // Like release: the failed step's cells are the last positions of their sequences.
  for (auto& [seq, s] : seqs_) {
    int length = s.w_length;
    for (int32_t c : cells) {
      if (c < 0 || c >= n_window_cells()) continue;
      const auto it = std::find(s.window.begin(), s.window.end(), c / block_size_);
      if (it == s.window.end() || window_refs_[*it] != 1) continue;
      length = std::min(length, static_cast<int>(it - s.window.begin()) * block_size_ + c % block_size_);
    }
    truncate_window(s, length);
  }
}

void PagedKvCache::commit_window(std::span<const int> seqs) {
  if (!windowed()) return;
  for (int seq : seqs)
    if (Sequence* s = find(seq)) drop_window(*s, s->w_length);
}

int PagedKvCache::seq_rewind_min(int seq) const {
  const Sequence* s = find(seq);
  // Continuing at p needs positions (p - n_swa, p), none of them before the first one held.
  return s && s->w_dropped > 0 ? s->w_dropped * block_size_ + n_swa_ - 1 : 0;
}

void PagedKvCache::seq_window_cells(int seq, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const {
  cells.clear();
  positions.clear();
  const Sequence* s = find(seq);
  if (!s) return;
  for (int32_t p = s->w_dropped * block_size_; p < s->w_length; ++p) {
    cells.push_back(s->window[static_cast<size_t>(p / block_size_)] * block_size_ + p % block_size_);
    positions.push_back(p);
  }
}

}  // namespace loom::llm::detail
