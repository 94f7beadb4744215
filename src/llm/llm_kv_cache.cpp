#include "llm/llm_kv_cache.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

namespace loom::llm::detail {

namespace {
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

uint64_t KvCache::bytes_needed(const HParams& hp, int n_ctx) {
  const uint64_t per_layer =
      static_cast<uint64_t>(n_ctx) * hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v) * 2;
  return per_layer * hp.n_layer;
}

Result<std::unique_ptr<KvCache>> KvCache::create(const HParams& hp, int n_ctx, BufferType& type) {
  if (n_ctx < 1)
    return make_error(StatusCode::invalid_argument, "kv cache: n_ctx {} must be positive", n_ctx);
  std::unique_ptr<KvCache> kv(new KvCache());
  const size_t align = type.alignment();
  size_t total = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    Tensor* k = kv->tensors_.new_tensor(DType::f16, {hp.head_dim_k, n_ctx, hp.n_head_kv, 1},
                                        fmt::format("cache_k_l{}", il));
    Tensor* v = kv->tensors_.new_tensor(DType::f16, {hp.head_dim_v, n_ctx, hp.n_head_kv, 1},
                                        fmt::format("cache_v_l{}", il));
    kv->k_.push_back(k);
    kv->v_.push_back(v);
    total += align_up(k->nbytes(), align) + align_up(v->nbytes(), align);
  }
  auto buf = type.allocate(total);
  if (!buf)
    return make_error(buf.status().code(), "kv cache of {} cells ({:.1f} MiB): {}", n_ctx, total / 1048576.0,
                      buf.status().message());
  kv->buffer_ = std::move(buf.value());
  LOOM_TRY(kv->buffer_->fill(0, 0, total));
  size_t off = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    for (Tensor* t : {kv->k_[il], kv->v_[il]}) {
      LOOM_TRY(tensor_bind(t, kv->buffer_.get(), off));
      off += align_up(t->nbytes(), align);
    }
  }
  kv->cells_.assign(static_cast<size_t>(n_ctx), Cell{});
  return kv;
}

Result<std::vector<int32_t>> KvCache::claim(std::span<const int32_t> positions, int seq) {
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

void KvCache::release(std::span<const int32_t> cells) {
  for (int32_t c : cells) {
    if (c < 0 || c >= n_ctx() || cells_[c].pos < 0) continue;
    cells_[c] = Cell{};
    --n_used_;
  }
}

int KvCache::n_kv() const {
  for (int c = n_ctx() - 1; c >= 0; --c)
    if (cells_[c].pos >= 0) return c + 1;
  return 0;
}

void KvCache::fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask, int n_swa) const {
  LOOM_ASSERT(n_kv >= 0 && n_kv <= n_ctx());
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

void KvCache::clear() {
  std::fill(cells_.begin(), cells_.end(), Cell{});
  n_used_ = 0;
}

void KvCache::seq_rm(int seq, int p0, int p1) {
  if (p1 < 0) p1 = std::numeric_limits<int>::max();
  for (Cell& c : cells_)
    if (c.pos >= 0 && c.seq == seq && c.pos >= p0 && c.pos < p1) {
      c = Cell{};
      --n_used_;
    }
}

int KvCache::seq_pos_max(int seq) const {
  int m = -1;
  for (const Cell& c : cells_)
    if (c.pos >= 0 && c.seq == seq) m = std::max(m, c.pos);
  return m;
}

}  // namespace loom::llm::detail
