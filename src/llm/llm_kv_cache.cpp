#include "llm_kv_cache.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>

namespace loom::llm::detail {

namespace {
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

// ---- storage -----------------------------------------------------------------------------------------

uint64_t KvStorage::bytes_needed(const HParams& hp, int n_cells, int n_layers) {
  const uint64_t per_layer =
      static_cast<uint64_t>(n_cells) * hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v) * 2;
  return per_layer * (n_layers < 0 ? hp.n_layer : static_cast<uint32_t>(n_layers));
}

Result<KvStorage> KvStorage::create(const HParams& hp, int n_cells, BufferType& type,
                                    BufferType* offload_type, int first_offload_layer) {
  if (n_cells < 1)
    return make_error(StatusCode::invalid_argument, "kv cache: n_ctx {} must be positive", n_cells);
  const int n_layer = static_cast<int>(hp.n_layer);
  const int split =
      offload_type && first_offload_layer >= 0 ? std::min(first_offload_layer, n_layer) : n_layer;
  KvStorage kv;
  kv.n_cells_ = n_cells;
  kv.tensors_ = std::make_unique<Graph>();
  for (int il = 0; il < n_layer; ++il) {
    kv.k_.push_back(kv.tensors_->new_tensor(DType::f16, {hp.head_dim_k, n_cells, hp.n_head_kv, 1},
                                            fmt::format("cache_k_l{}", il)));
    kv.v_.push_back(kv.tensors_->new_tensor(DType::f16, {hp.head_dim_v, n_cells, hp.n_head_kv, 1},
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
                                               int first_offload_layer) {
  if (kind == KvCacheKind::paged) {
    auto kv = PagedKvCache::create(hp, n_ctx, block_size, type, offload_type, first_offload_layer);
    if (!kv) return kv.status();
    return std::unique_ptr<KvCache>(std::move(kv.value()));
  }
  auto kv = ContiguousKvCache::create(hp, n_ctx, type, offload_type, first_offload_layer);
  if (!kv) return kv.status();
  return std::unique_ptr<KvCache>(std::move(kv.value()));
}

// ---- contiguous --------------------------------------------------------------------------------------

ContiguousKvCache::ContiguousKvCache(KvStorage storage) : KvCache(std::move(storage)) {
  cells_.assign(static_cast<size_t>(n_cells()), Cell{});
}

Result<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::create(const HParams& hp, int n_ctx,
                                                                     BufferType& type,
                                                                     BufferType* offload_type,
                                                                     int first_offload_layer) {
  auto storage = KvStorage::create(hp, n_ctx, type, offload_type, first_offload_layer);
  if (!storage) return storage.status();
  return std::unique_ptr<ContiguousKvCache>(new ContiguousKvCache(std::move(storage.value())));
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
  LOOM_ASSERT(n_kv >= 0 && n_kv <= n_cells());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < positions.size(); ++i) {
    float* row = mask + i * static_cast<size_t>(n_kv);
    for (int j = 0; j < n_kv; ++j) {
      const Cell& c = cells_[j];
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

void ContiguousKvCache::clear() {
  std::fill(cells_.begin(), cells_.end(), Cell{});
  n_used_ = 0;
}

Status ContiguousKvCache::seq_rm(int seq, int p0, int p1) {
  if (p1 < 0) p1 = std::numeric_limits<int>::max();
  for (Cell& c : cells_)
    if (c.pos >= 0 && c.seq == seq && c.pos >= p0 && c.pos < p1) {
      c = Cell{};
      --n_used_;
    }
  return {};
}

int ContiguousKvCache::seq_pos_max(int seq) const {
  int m = -1;
  for (const Cell& c : cells_)
    if (c.pos >= 0 && c.seq == seq) m = std::max(m, c.pos);
  return m;
}

}  // namespace loom::llm::detail
