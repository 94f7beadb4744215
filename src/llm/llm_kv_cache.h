// The KV cache: per layer, K and V as F16 [head_dim, n_ctx, n_head_kv] in one persistent buffer of
// the backend (two when the last layers are offloaded: each layer's K and V live where the layer
// runs), plus host-side bookkeeping of which cell holds which position of which sequence.
//
// Cells are handed out first-fit, so a single sequence grown from position 0 has cell i = position
// i and attention reads the prefix [0, pos + n_tokens). The causal mask is built from the cells'
// absolute positions, so truncating (seq_rm) and refilling needs no data movement.
//
// Sliding-window layers may instead keep a ring of window + n_batch - 1 cells with bookkeeping of its
// own ("window cells"): a token's K/V go to a free ring cell or over one whose position no later
// query can see, so their memory is bounded by the window whatever n_ctx. A rewind (seq_rm) behind
// what the ring still holds is refused; clearing the sequence always works.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "loom/backend.h"
#include "loom/graph.h"
#include "loom/llm.h"

namespace loom::llm::detail {

class KvCache {
 public:
  /// Allocates and zeroes the cache (zeros, not garbage, in cells masked out of attention, so no
  /// NaN can leak through a 0 weight). Layers from `first_offload_layer` on go in `offload_type`
  /// memory when it is given.
  /// With `n_window_cells` in [1, n_ctx), the sliding-window layers (hp.is_swa) get only that many
  /// cells, a ring (claim_window); it must be at least n_swa + n_batch - 1. 0: n_ctx cells everywhere.
  static Result<std::unique_ptr<KvCache>> create(const HParams& hp, int n_ctx, BufferType& type,
                                                 BufferType* offload_type = nullptr,
                                                 int first_offload_layer = -1, int n_window_cells = 0);
  /// Bytes the cache of this model and size needs for `n_layers` layers (-1: all) from `first_layer`.
  static uint64_t bytes_needed(const HParams& hp, int n_ctx, int n_layers = -1, int first_layer = 0,
                               int n_window_cells = 0);

  Tensor* k(int il) const { return k_[il]; }
  Tensor* v(int il) const { return v_[il]; }
  int n_ctx() const { return static_cast<int>(cells_.size()); }
  size_t bytes() const {
    return (buffer_ ? buffer_->size() : 0) + (offload_buffer_ ? offload_buffer_->size() : 0);
  }

  /// Takes free cells for `positions` of `seq`: returns their indices, or an error when the cache
  /// cannot hold them. The cells count as used until release().
  Result<std::vector<int32_t>> claim(std::span<const int32_t> positions, int seq);
  /// Frees cells (a failed step).
  void release(std::span<const int32_t> cells);
  /// One past the highest used cell: how many cells attention must read.
  int n_kv() const;
  /// Mask for queries at `positions` of `seq` over cells [0, n_kv): row i, column j is 0 when cell j
  /// holds a position <= positions[i] of the sequence, else -inf. With a sliding window `n_swa` > 0,
  /// also -inf where positions[i] - position >= n_swa (the cells stay: global layers still read them).
  /// n_kv may exceed n_kv() (a bucketed extent, up to n_ctx()): free cells get -inf like any cell of
  /// another sequence, so the zeros or stale K/V they hold never get a weight.
  void fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask, int n_swa = 0) const;

  /// Whether the sliding-window layers have their ring of window cells; then their K/V tensors have
  /// n_window_cells() cells and tokens need window cells too.
  bool windowed() const { return !window_cells_.empty(); }
  int n_window_cells() const { return static_cast<int>(window_cells_.size()); }
  /// Window cells for `positions` (ascending) of `seq`: free cells first, then cells of the sequence
  /// whose position no query at positions[0] or later sees (positions[0] - pos >= n_swa). Fails when
  /// the window before positions[0] holds positions the ring has already dropped.
  Result<std::vector<int32_t>> claim_window(std::span<const int32_t> positions, int seq);
  /// Frees window cells (a failed step).
  void release_window(std::span<const int32_t> cells);
  /// One past the highest used window cell.
  int n_kv_window() const;
  /// As fill_mask with the window, over window cells [0, n_kv).
  void fill_mask_window(std::span<const int32_t> positions, int seq, int n_kv, float* mask) const;
  /// The lowest p0 from which seq_rm(seq, p0) leaves a sequence that can be continued: 0 unless the
  /// ring has dropped positions of `seq` (then the oldest position whose window it still holds whole).
  int seq_rewind_min(int seq) const;

  void clear();
  void seq_rm(int seq, int p0, int p1);
  int seq_pos_max(int seq) const;
  int used() const { return n_used_; }

 private:
  struct Cell {
    int32_t pos = -1;  // -1: free
    int32_t seq = -1;
  };
  static void fill_mask_cells(std::span<const Cell> cells, std::span<const int32_t> positions, int seq,
                              int n_kv, float* mask, int n_swa);
  KvCache() = default;
  Graph tensors_;  // owns the K/V tensor objects (leafs, never computed)
  std::vector<Tensor*> k_, v_;
  std::unique_ptr<Buffer> buffer_;
  std::unique_ptr<Buffer> offload_buffer_;  // the offloaded layers' K and V
  std::vector<Cell> cells_;
  int n_used_ = 0;
  int n_swa_ = 0;
  std::vector<Cell> window_cells_;         // empty: the sliding-window layers use cells_
  std::map<int, int> window_dropped_max_;  // per sequence: the highest position the ring dropped
};

/// The cache of a context (for tests: where its layers' tensors live).
const KvCache& context_kv_cache(const Context& ctx);

}  // namespace loom::llm::detail
