#include "llm_kv_cache.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>

namespace loom::llm::detail {

namespace {
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Cells of layer `il`'s K and V.
int cells_of_layer(const HParams& hp, int il, int n_cells, int n_window_cells) {
  return n_window_cells > 0 && hp.is_swa(static_cast<uint32_t>(il)) ? n_window_cells : n_cells;
}
}  // namespace

// ---- storage -----------------------------------------------------------------------------------------

uint64_t KvStorage::bytes_needed(const HParams& hp, int n_cells, int n_layers, int first_layer,
                                 int n_window_cells) {
  const uint64_t per_cell = static_cast<uint64_t>(hp.n_head_kv) * (hp.head_dim_k + hp.head_dim_v) * 2;
  const int end = n_layers < 0 ? static_cast<int>(hp.n_layer) : first_layer + n_layers;
  uint64_t total = 0;
  for (int il = first_layer; il < end; ++il)
    total += per_cell * static_cast<uint64_t>(cells_of_layer(hp, il, n_cells, n_window_cells));
  return total;
}

Result<KvStorage> KvStorage::create(const HParams& hp, int n_cells, BufferType& type,
                                    BufferType* offload_type, int first_offload_layer, int n_window_cells) {
  if (n_cells < 1)
    return make_error(StatusCode::invalid_argument, "kv cache: n_ctx {} must be positive", n_cells);
  if (n_window_cells < 0)
    return make_error(StatusCode::invalid_argument, "kv cache: {} window cells", n_window_cells);
  const int n_layer = static_cast<int>(hp.n_layer);
  const int split =
      offload_type && first_offload_layer >= 0 ? std::min(first_offload_layer, n_layer) : n_layer;
  KvStorage kv;
  kv.n_cells_ = n_cells;
  kv.tensors_ = std::make_unique<Graph>();
  for (int il = 0; il < n_layer; ++il) {
    const int64_t cells = cells_of_layer(hp, il, n_cells, n_window_cells);
    kv.k_.push_back(kv.tensors_->new_tensor(DType::f16, {hp.head_dim_k, cells, hp.n_head_kv, 1},
                                            fmt::format("cache_k_l{}", il)));
    kv.v_.push_back(kv.tensors_->new_tensor(DType::f16, {hp.head_dim_v, cells, hp.n_head_kv, 1},
                                            fmt::format("cache_v_l{}", il)));
  }
  // Layers [begin, end) in one zeroed buffer of `t`.
  auto place = [&](BufferType& t, int begin, int end, std::unique_ptr<Buffer>& out) -> Status {
    if (begin == end) return {};
    const size_t align = t.alignment();
    size_t total = 0;
    for (int il = begin; il < end; ++il)
      total += align_up(kv.k_[il]->nbytes(), align) + align_up(kv.v_[il]->nbytes(), align);
    auto buf = t.allocate(total);
    if (!buf)
      return make_error(buf.status().code(), "kv cache of {} cells, layers {}-{} ({:.1f} MiB of {}): {}",
                        n_cells, begin, end - 1, total / 1048576.0, t.name(), buf.status().message());
    out = std::move(buf.value());
    LOOM_TRY(out->fill(0, 0, total));
    size_t off = 0;
    for (int il = begin; il < end; ++il) {
      for (Tensor* x : {kv.k_[il], kv.v_[il]}) {
        LOOM_TRY(tensor_bind(x, out.get(), off));
        off += align_up(x->nbytes(), align);
      }
    }
    return {};
  };
  LOOM_TRY(place(type, 0, split, kv.buffer_));
  if (split < n_layer) LOOM_TRY(place(*offload_type, split, n_layer, kv.offload_buffer_));
  return kv;
}

Result<std::unique_ptr<KvCache>> make_kv_cache(KvCacheKind kind, const HParams& hp, int n_ctx, int block_size,
                                               BufferType& type, BufferType* offload_type,
                                               int first_offload_layer, int n_window_cells) {
  if (kind == KvCacheKind::paged) {
    // The paged ring is a pool of whole blocks (PagedKvCache::window_blocks_needed sizes it).
    if (n_window_cells > 0 && block_size > 0 && n_window_cells % block_size != 0)
      return make_error(StatusCode::invalid_argument,
                        "kv cache: {} sliding-window cells are not whole blocks of {}", n_window_cells,
                        block_size);
    auto kv = PagedKvCache::create(hp, n_ctx, block_size, type, offload_type, first_offload_layer,
                                   block_size > 0 ? n_window_cells / block_size : 0);
    if (!kv) return kv.status();
    return std::unique_ptr<KvCache>(std::move(kv.value()));
  }
  auto kv = ContiguousKvCache::create(hp, n_ctx, type, offload_type, first_offload_layer, n_window_cells);
  if (!kv) return kv.status();
  return std::unique_ptr<KvCache>(std::move(kv.value()));
}

// ---- the sliding-window ring: defaults of the kinds without one ---------------------------------------

Result<std::vector<int32_t>> KvCache::claim_window(std::span<const int32_t>, int) {
  return make_error(StatusCode::internal, "kv cache: this cache has no sliding-window ring");
}

void KvCache::fill_mask_window(std::span<const int32_t>, int, int n_kv, float*) const {
  LOOM_ASSERT(n_kv == 0);  // no window cells to mask
}

// ---- contiguous --------------------------------------------------------------------------------------

ContiguousKvCache::ContiguousKvCache(KvStorage storage, int n_window_cells, int n_swa)
    : KvCache(std::move(storage)), n_swa_(n_swa) {
  cells_.assign(static_cast<size_t>(n_cells()), Cell{});
  window_cells_.assign(static_cast<size_t>(n_window_cells), Cell{});
}

Result<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::create(const HParams& hp, int n_ctx,
                                                                     BufferType& type,
                                                                     BufferType* offload_type,
                                                                     int first_offload_layer,
                                                                     int n_window_cells) {
  if (n_window_cells >= n_ctx || !hp.has_swa()) n_window_cells = 0;  // a ring no smaller than the cache
  if (n_window_cells < 0 || (n_window_cells > 0 && n_window_cells < static_cast<int>(hp.n_swa)))
    return make_error(StatusCode::invalid_argument, "kv cache: {} window cells cannot hold a window of {}",
                      n_window_cells, hp.n_swa);
  auto storage = KvStorage::create(hp, n_ctx, type, offload_type, first_offload_layer, n_window_cells);
  if (!storage) return storage.status();
  return std::unique_ptr<ContiguousKvCache>(
      new ContiguousKvCache(std::move(storage.value()), n_window_cells, static_cast<int>(hp.n_swa)));
}

Result<std::vector<int32_t>> ContiguousKvCache::claim(std::span<const int32_t> positions, int seq) {
  std::vector<int32_t> cells;
  cells.reserve(positions.size());
  for (size_t c = 0; c < cells_.size() && cells.size() < positions.size(); ++c)
    if (cells_[c].pos < 0) cells.push_back(static_cast<int32_t>(c));
  if (cells.size() < positions.size())
    return make_error(StatusCode::out_of_memory, "kv cache full: {} tokens need cells, {} of {} are free",
                      positions.size(), cells_.size() - n_used_, cells_.size());
  for (size_t i = 0; i < cells.size(); ++i) cells_[cells[i]] = Cell{positions[i], seq};
  n_used_ += static_cast<int>(cells.size());
  return cells;
}

void ContiguousKvCache::release(std::span<const int32_t> cells) {
  for (int32_t c : cells) {
    if (c < 0 || c >= n_cells() || cells_[c].pos < 0) continue;
    cells_[c] = Cell{};
    --n_used_;
  }
}

int ContiguousKvCache::room(int /*seq*/) const { return n_cells() - n_used_; }

int ContiguousKvCache::n_kv() const {
  for (int c = n_cells() - 1; c >= 0; --c)
    if (cells_[c].pos >= 0) return c + 1;
  return 0;
}

void ContiguousKvCache::fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask,
                                  int n_swa) const {
  fill_mask_cells(cells_, positions, seq, n_kv, mask, n_swa);
}

void ContiguousKvCache::fill_mask_window(std::span<const int32_t> positions, int seq, int n_kv,
                                         float* mask) const {
  fill_mask_cells(window_cells_, positions, seq, n_kv, mask, n_swa_);
}

void ContiguousKvCache::fill_mask_cells(std::span<const Cell> cells, std::span<const int32_t> positions,
                                        int seq, int n_kv, float* mask, int n_swa) {
  LOOM_ASSERT(n_kv >= 0 && static_cast<size_t>(n_kv) <= cells.size());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < positions.size(); ++i) {
    float* row = mask + i * static_cast<size_t>(n_kv);
    for (int j = 0; j < n_kv; ++j) {
      const Cell& c = cells[j];
      const bool visible =
          c.pos >= 0 && c.seq == seq && c.pos <= positions[i] && (n_swa <= 0 || positions[i] - c.pos < n_swa);
      row[j] = visible ? 0.0f : neg_inf;
    }
  }
}

void ContiguousKvCache::seq_cells(int seq, std::vector<int32_t>& cells,
                                  std::vector<int32_t>& positions) const {
  cells.clear();
  for (size_t c = 0; c < cells_.size(); ++c)
    if (cells_[c].pos >= 0 && cells_[c].seq == seq) cells.push_back(static_cast<int32_t>(c));
  std::stable_sort(cells.begin(), cells.end(),
                   [&](int32_t a, int32_t b) { return cells_[a].pos < cells_[b].pos; });
  positions.resize(cells.size());
  for (size_t i = 0; i < cells.size(); ++i) positions[i] = cells_[cells[i]].pos;
}

Result<std::vector<int32_t>> ContiguousKvCache::claim_window(std::span<const int32_t> positions, int seq) {
  LOOM_ASSERT(windowed() && !positions.empty());
  const int first = positions[0];
  if (const int dropped = seq_rewind_min(seq); first < dropped)
    return make_error(
        StatusCode::invalid_argument,
        "kv cache: sequence {} continues at position {}, but its sliding-window layers keep only "
        "the last {} positions and have dropped position {}; clear the sequence (kv_cache_seq_rm "
        "from 0) and decode it again",
        seq, first, n_swa_, dropped - n_swa_);
  std::vector<int32_t> out;
  out.reserve(positions.size());
  int dropped_max = -1;
  // Free cells first (first-fit, so a short sequence reads a short prefix), then the sequence's
  // cells that have left every later query's window, oldest first.
  for (size_t c = 0; c < window_cells_.size() && out.size() < positions.size(); ++c)
    if (window_cells_[c].pos < 0) out.push_back(static_cast<int32_t>(c));
  if (out.size() < positions.size()) {
    std::vector<int32_t> stale;
    for (size_t c = 0; c < window_cells_.size(); ++c) {
      const Cell& cell = window_cells_[c];
      if (cell.pos >= 0 && cell.seq == seq && first - cell.pos >= n_swa_)
        stale.push_back(static_cast<int32_t>(c));
    }
    // only the oldest `need` are taken
    const size_t need = std::min(stale.size(), positions.size() - out.size());
    std::partial_sort(stale.begin(), stale.begin() + static_cast<std::ptrdiff_t>(need), stale.end(),
                      [this](int32_t a, int32_t b) { return window_cells_[a].pos < window_cells_[b].pos; });
    for (size_t i = 0; i < stale.size() && out.size() < positions.size(); ++i) {
      dropped_max = std::max(dropped_max, static_cast<int>(window_cells_[stale[i]].pos));
      out.push_back(stale[i]);
    }
  }
  if (out.size() < positions.size())
    return make_error(StatusCode::out_of_memory,
                      "kv cache: {} tokens need sliding-window cells, but only {} of the {} can be reused",
                      positions.size(), out.size(), window_cells_.size());
  for (size_t i = 0; i < out.size(); ++i) window_cells_[out[i]] = Cell{positions[i], seq};
  if (dropped_max >= 0) {
    int& m = window_dropped_max_[seq];
    m = std::max(m, dropped_max);
  }
  return out;
}

void ContiguousKvCache::release_window(std::span<const int32_t> cells) {
  for (int32_t c : cells)
    if (c >= 0 && c < n_window_cells()) window_cells_[c] = Cell{};
}

int ContiguousKvCache::n_kv_window() const {
  for (int c = n_window_cells() - 1; c >= 0; --c)
    if (window_cells_[c].pos >= 0) return c + 1;
  return 0;
}

int ContiguousKvCache::seq_rewind_min(int seq) const {
  const auto it = window_dropped_max_.find(seq);
  // Continuing at p needs positions (p - n_swa, p): none of them dropped.
  return it == window_dropped_max_.end() ? 0 : it->second + n_swa_;
}

void ContiguousKvCache::clear() {
  std::fill(cells_.begin(), cells_.end(), Cell{});
  std::fill(window_cells_.begin(), window_cells_.end(), Cell{});
  window_dropped_max_.clear();
  n_used_ = 0;
}

Status ContiguousKvCache::seq_rm(int seq, int p0, int p1) {
  if (p1 < 0) p1 = std::numeric_limits<int>::max();
  for (Cell& c : cells_)
    if (c.pos >= 0 && c.seq == seq && c.pos >= p0 && c.pos < p1) {
      c = Cell{};
      --n_used_;
    }
  for (Cell& c : window_cells_)
    if (c.pos >= 0 && c.seq == seq && c.pos >= p0 && c.pos < p1) c = Cell{};
  if (p0 == 0 && p1 == std::numeric_limits<int>::max()) window_dropped_max_.erase(seq);
  return {};
}

int ContiguousKvCache::seq_pos_max(int seq) const {
  int m = -1;
  for (const Cell& c : cells_)
    if (c.pos >= 0 && c.seq == seq) m = std::max(m, c.pos);
  return m;
}

}  // namespace loom::llm::detail
