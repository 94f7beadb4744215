// The KV cache: per layer, K and V as F16 [head_dim, n_ctx, n_head_kv] in one persistent buffer of
// the backend (two when the last layers are offloaded: each layer's K and V live where the layer
// runs), plus host-side bookkeeping of which cell holds which position of which sequence.
//
// Cells are handed out first-fit, so a single sequence grown from position 0 has cell i = position
// i and attention reads the prefix [0, pos + n_tokens). The causal mask is built from the cells'
// absolute positions, so truncating (seq_rm) and refilling needs no data movement.
#pragma once

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
  static Result<std::unique_ptr<KvCache>> create(const HParams& hp, int n_ctx, BufferType& type,
                                                 BufferType* offload_type = nullptr,
                                                 int first_offload_layer = -1);
  /// Bytes the cache of this model and size needs for `n_layers` layers (-1: all).
  static uint64_t bytes_needed(const HParams& hp, int n_ctx, int n_layers = -1);

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

  void clear();
  void seq_rm(int seq, int p0, int p1);
  int seq_pos_max(int seq) const;
  int used() const { return n_used_; }

 private:
  struct Cell {
    int32_t pos = -1;  // -1: free
    int32_t seq = -1;
  };
  KvCache() = default;
  Graph tensors_;  // owns the K/V tensor objects (leafs, never computed)
  std::vector<Tensor*> k_, v_;
  std::unique_ptr<Buffer> buffer_;
  std::unique_ptr<Buffer> offload_buffer_;  // the offloaded layers' K and V
  std::vector<Cell> cells_;
  int n_used_ = 0;
};

/// The cache of a context (for tests: where its layers' tensors live).
const KvCache& context_kv_cache(const Context& ctx);

}  // namespace loom::llm::detail
