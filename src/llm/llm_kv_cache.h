// KV caches: one interface (KvCache), one implementation per kind.
//
// Every kind stores, per layer, K and V as F16 [head_dim, n_cells, n_head_kv] in one persistent
// buffer of the backend (two when the last layers are offloaded: each layer's K and V live where
// the layer runs; KvStorage). The kinds differ in the host-side bookkeeping of which cell holds which
// position of which sequence, and so in how attention reads them:
//
// - ContiguousKvCache: cells handed out first-fit, so a single sequence grown from position 0 has
//   cell i = position i and attention reads the prefix [0, n_kv) of the cells in place, with a mask
//   built from the cells' absolute positions (truncating and refilling needs no data movement).
// - PagedKvCache: the cells form blocks of block_size cells in one pool shared by all sequences; a
//   sequence owns a block table (its positions 0, 1, ... fill its blocks in order), takes blocks on
//   demand and gives them back when it is removed or truncated. Sequences whose prompts begin alike
//   share their first whole blocks, counted by reference (prefix reuse, seq_share_prefix).
//
// Any kind can list a sequence's cells in position order (seq_cells); a step over several sequences
// gathers each sequence's keys and values through those lists (StepBuilder::attention).
//
// Sliding-window layers (gemma2, gemma3, phi3, gpt-oss) may instead keep far fewer cells than the
// context ("window cells", their own K/V tensors), with bookkeeping of their own, so their memory is
// bounded by the window whatever n_ctx. A rewind (seq_rm) behind what they still hold is refused
// (seq_rewind_min); clearing the sequence always works.
//
// - ContiguousKvCache: a ring of window + n_batch - 1 cells for one sequence: a token's K/V go to a
//   free ring cell or over one whose position no later query can see. It serves single-sequence
//   passes (reading the prefix), so Context::decode_batch refuses several sequences on it.
// - PagedKvCache: a second pool of blocks (of block_size cells) for those layers. Each sequence has
//   a window table beside its block table: the window blocks of its logical blocks whose positions
//   a query at or after the sequence's next position can still see. A claim_window takes blocks for
//   the step's tokens after dropping those no query of the step sees; commit_window (after a step
//   has run) drops those no later query sees; both go back to the pool. A sequence keeps the window
//   of its current block's first position (so a prefix up to its last block boundary can be lent):
//   window_blocks_needed() bounds what a step holds and sizes the pool for n_seq_max sequences
//   decoding together plus one prompt chunk of n_batch. Several sequences' passes gather each one's
//   window cells (their own gather rows and masks), like the global layers gather their cells.
//   Prefix sharing shares the window blocks too, when the source still holds the window before the
//   shared prefix's end (else nothing is shared); a sequence that cannot get a window block fails
//   with out_of_memory.
//
// Without a ring (ContextParams::swa_full, or a paged cache not told how many sequences it serves)
// the sliding-window layers keep every cell like the global ones.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "loom/backend.h"
#include "loom/graph.h"
#include "loom/llm.h"

namespace loom::llm::detail {

/// The K and V tensors of every layer over `n_cells` cells, zeroed (zeros, not garbage, in cells
/// masked out of attention, so no NaN can leak through a 0 weight).
class KvStorage {
 public:
  /// Layers from `first_offload_layer` on go in `offload_type` memory when it is given. With
  /// `n_window_cells` > 0, the sliding-window layers (hp.is_swa) get only that many cells (a ring).
  static Result<KvStorage> create(const HParams& hp, int n_cells, BufferType& type,
                                  BufferType* offload_type = nullptr, int first_offload_layer = -1,
                                  int n_window_cells = 0);
  /// Bytes the storage of this model and size needs for `n_layers` layers (-1: all) from `first_layer`.
  static uint64_t bytes_needed(const HParams& hp, int n_cells, int n_layers = -1, int first_layer = 0,
                               int n_window_cells = 0);

  KvStorage() = default;
  KvStorage(KvStorage&&) = default;
  KvStorage& operator=(KvStorage&&) = default;

  Tensor* k(int il) const { return k_[il]; }
  Tensor* v(int il) const { return v_[il]; }
  int n_cells() const { return n_cells_; }
  size_t bytes() const {
    return (buffer_ ? buffer_->size() : 0) + (offload_buffer_ ? offload_buffer_->size() : 0);
  }

 private:
  std::unique_ptr<Graph> tensors_;  // owns the K/V tensor objects (leafs, never computed)
  std::vector<Tensor*> k_, v_;
  std::unique_ptr<Buffer> buffer_;
  std::unique_ptr<Buffer> offload_buffer_;  // the offloaded layers' K and V
  int n_cells_ = 0;
};

/// What every cache kind offers the context and the graph builder.
class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual KvCacheKind kind() const = 0;

  /// Layer il's K and V; with tensor parallelism, those of rank `rank`'s KV heads.
  Tensor* k(int il, int rank = 0) const { return storage(rank).k(il); }
  Tensor* v(int il, int rank = 0) const { return storage(rank).v(il); }
  /// Cells of the storage (the context size; the global layers' cells).
  int n_cells() const { return storage_.n_cells(); }
  size_t bytes() const {
    size_t n = storage_.bytes();
    for (const KvStorage& s : rank_storage_) n += s.bytes();
    return n;
  }
  /// Tensor parallelism: the storage of the next rank (rank 1, 2, ...: the constructor's is rank
  /// 0's), its own KV heads over the same cells. Every rank's cells are the same; the bookkeeping
  /// here serves them all.
  void add_rank_storage(KvStorage s) { rank_storage_.push_back(std::move(s)); }

  /// Takes cells for `positions` of `seq`: returns their indices, or an error (out_of_memory when
  /// the cache cannot hold them; nothing is taken then). They count as used until released.
  virtual Result<std::vector<int32_t>> claim(std::span<const int32_t> positions, int seq) = 0;
  /// Gives back cells a failed step claimed (the last ones of their sequences).
  virtual void release(std::span<const int32_t> cells) = 0;
  /// Positions `seq` can still take (before claim fails).
  virtual int room(int seq) const = 0;
  /// Empties the cache.
  virtual void clear() = 0;
  /// Removes positions [p0, p1) of `seq` (p1 < 0: to the end); an error when the kind cannot.
  virtual Status seq_rm(int seq, int p0, int p1) = 0;
  /// Largest cached position of a sequence, -1 when it has none.
  virtual int seq_pos_max(int seq) const = 0;
  /// Lets `dst`, which holds nothing, start with positions [0, k) of `src` without storing them
  /// again, for the largest k <= n_positions the kind can share; returns k (0: nothing shared).
  virtual int seq_share_prefix(int src, int dst, int n_positions) = 0;
  /// Cells holding a position (a cell shared by several sequences counts once).
  virtual int used() const = 0;

  /// True when a single sequence's attention may read the cells [0, n_kv()) in place with
  /// fill_mask(); false when it always gathers the sequence's cells (seq_cells).
  virtual bool reads_prefix() const = 0;
  /// One past the highest used cell (reads_prefix kinds).
  virtual int n_kv() const = 0;
  /// Mask for queries at `positions` of `seq` over cells [0, n_kv) (reads_prefix kinds): row i,
  /// column j is 0 when cell j holds a position <= positions[i] of the sequence, else -inf. With a
  /// sliding window `n_swa` > 0, also -inf where positions[i] - position >= n_swa. n_kv may exceed
  /// n_kv() (a bucketed extent, up to n_cells()): free cells get -inf like any cell of another
  /// sequence, so the zeros or stale K/V they hold never get a weight.
  virtual void fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask,
                         int n_swa = 0) const = 0;
  /// The cells of `seq` in increasing position order, and those positions.
  virtual void seq_cells(int seq, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const = 0;

  // The sliding-window ring (see the file comment); kinds without one keep these defaults.
  /// Whether the sliding-window layers have their ring of window cells; then their K/V tensors have
  /// n_window_cells() cells and tokens need window cells too.
  virtual bool windowed() const { return false; }
  virtual int n_window_cells() const { return 0; }
  /// Window cells for `positions` (ascending) of `seq`: free cells first, then cells of the sequence
  /// whose position no query at positions[0] or later sees (positions[0] - pos >= n_swa). Fails when
  /// the window before positions[0] holds positions the ring has already dropped.
  virtual Result<std::vector<int32_t>> claim_window(std::span<const int32_t> positions, int seq);
  /// Frees window cells (a failed step).
  virtual void release_window(std::span<const int32_t> /*cells*/) {}
  /// One past the highest used window cell (reads_prefix kinds; a gathering kind: its window cells).
  virtual int n_kv_window() const { return 0; }
  /// As fill_mask with the window, over window cells [0, n_kv).
  virtual void fill_mask_window(std::span<const int32_t> positions, int seq, int n_kv, float* mask) const;
  /// The lowest p0 from which seq_rm(seq, p0) leaves a sequence that can be continued: 0 unless the
  /// ring has dropped positions of `seq` (then the oldest position whose window it still holds whole).
  virtual int seq_rewind_min(int /*seq*/) const { return 0; }
  /// Kinds that gather (reads_prefix() false): the window cells of `seq` in increasing position
  /// order, and those positions (positions no query can see any more may be among them, masked).
  virtual void seq_window_cells(int /*seq*/, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const {
    cells.clear();
    positions.clear();
  }
  /// The step whose window cells were claimed for `seqs` has run: window cells no later query of
  /// theirs can see may go back to the ring (a failed step calls release_window instead).
  virtual void commit_window(std::span<const int> /*seqs*/) {}

 protected:
  explicit KvCache(KvStorage storage) : storage_(std::move(storage)) {}
  const KvStorage& storage(int rank) const {
    return rank == 0 ? storage_ : rank_storage_[static_cast<size_t>(rank - 1)];
  }
  KvStorage storage_;
  std::vector<KvStorage> rank_storage_;
};

/// Cells handed out first-fit to any sequence (see the file comment).
class ContiguousKvCache final : public KvCache {
 public:
  /// With `n_window_cells` in [1, n_ctx), the sliding-window layers get only that many cells, a ring
  /// (claim_window); it must be at least n_swa + n_batch - 1. 0: n_ctx cells everywhere.
  static Result<std::unique_ptr<ContiguousKvCache>> create(const HParams& hp, int n_ctx, BufferType& type,
                                                           BufferType* offload_type = nullptr,
                                                           int first_offload_layer = -1,
                                                           int n_window_cells = 0);
  KvCacheKind kind() const override { return KvCacheKind::contiguous; }
  Result<std::vector<int32_t>> claim(std::span<const int32_t> positions, int seq) override;
  void release(std::span<const int32_t> cells) override;
  int room(int seq) const override;
  void clear() override;
  Status seq_rm(int seq, int p0, int p1) override;
  int seq_pos_max(int seq) const override;
  /// Shares nothing: a cell belongs to one sequence.
  int seq_share_prefix(int, int, int) override { return 0; }
  int used() const override { return n_used_; }
  bool reads_prefix() const override { return true; }
  int n_kv() const override;
  void fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask,
                 int n_swa = 0) const override;
  void seq_cells(int seq, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const override;

  bool windowed() const override { return !window_cells_.empty(); }
  int n_window_cells() const override { return static_cast<int>(window_cells_.size()); }
  Result<std::vector<int32_t>> claim_window(std::span<const int32_t> positions, int seq) override;
  void release_window(std::span<const int32_t> cells) override;
  int n_kv_window() const override;
  void fill_mask_window(std::span<const int32_t> positions, int seq, int n_kv, float* mask) const override;
  int seq_rewind_min(int seq) const override;

 private:
  struct Cell {
    int32_t pos = -1;  // -1: free
    int32_t seq = -1;
  };
  ContiguousKvCache(KvStorage storage, int n_window_cells, int n_swa);
  static void fill_mask_cells(std::span<const Cell> cells, std::span<const int32_t> positions, int seq,
                              int n_kv, float* mask, int n_swa);
  std::vector<Cell> cells_;
  int n_used_ = 0;
  int n_swa_ = 0;
  std::vector<Cell> window_cells_;         // empty: the sliding-window layers use cells_
  std::map<int, int> window_dropped_max_;  // per sequence: the highest position the ring dropped
};

/// Fixed-size blocks of one pool shared by all sequences (see the file comment). A sequence's
/// positions are dense: it grows at its end (claim must continue from seq_pos_max + 1) and shrinks
/// from its end (seq_rm of a suffix, or of everything).
///
/// Prefix reuse: seq_share_prefix gives a new sequence another's first full blocks (the same
/// prompt prefix, e.g. a system prompt), counted by reference; a block is free when no table holds
/// it. Shared blocks are full and nobody writes into them: a sequence only writes past its end, and
/// cutting a sequence inside a block it shares is refused (cut at a block boundary instead).
class PagedKvCache final : public KvCache {
 public:
  /// n_ctx cells rounded up to whole blocks of `block_size`. With `n_window_blocks` > 0 (and fewer
  /// cells than the context), the sliding-window layers get a pool of that many blocks (see the
  /// file comment; window_blocks_needed sizes it).
  static Result<std::unique_ptr<PagedKvCache>> create(const HParams& hp, int n_ctx, int block_size,
                                                      BufferType& type, BufferType* offload_type = nullptr,
                                                      int first_offload_layer = -1, int n_window_blocks = 0);
  /// Window blocks that `n_seq_max` sequences decoding together need, one of them bringing a prompt
  /// chunk of up to `n_batch` tokens: a step of n tokens holds at most ceil((n_swa - 1) / block_size)
  /// + ceil((n - 1) / block_size) + 1 blocks (the window before the step's first block, its tokens).
  static int64_t window_blocks_needed(int n_swa, int block_size, int n_seq_max, int n_batch);
  KvCacheKind kind() const override { return KvCacheKind::paged; }
  Result<std::vector<int32_t>> claim(std::span<const int32_t> positions, int seq) override;
  void release(std::span<const int32_t> cells) override;
  int room(int seq) const override;
  void clear() override;
  Status seq_rm(int seq, int p0, int p1) override;
  int seq_pos_max(int seq) const override;
  /// Shares the whole blocks of the prefix: k = min(n_positions, src's length) rounded down to a
  /// multiple of block_size.
  int seq_share_prefix(int src, int dst, int n_positions) override;
  int used() const override { return n_used_; }
  bool reads_prefix() const override { return false; }
  int n_kv() const override { return n_cells(); }
  void fill_mask(std::span<const int32_t> positions, int seq, int n_kv, float* mask,
                 int n_swa = 0) const override;
  void seq_cells(int seq, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const override;

  int block_size() const { return block_size_; }
  int n_blocks() const { return static_cast<int>(block_refs_.size()); }
  /// Block tables holding block `b` (0: free).
  int block_refs(int b) const { return block_refs_[b]; }
  int n_free_blocks() const { return static_cast<int>(free_blocks_.size()); }
  /// The block table of `seq` (empty when it holds nothing).
  std::span<const int32_t> block_table(int seq) const;

  bool windowed() const override { return !window_refs_.empty(); }
  int n_window_cells() const override { return static_cast<int>(window_refs_.size()) * block_size_; }
  /// Positions must be those claim() just took for `seq` (its window grows with its blocks).
  Result<std::vector<int32_t>> claim_window(std::span<const int32_t> positions, int seq) override;
  void release_window(std::span<const int32_t> cells) override;
  int n_kv_window() const override { return n_window_cells(); }
  int seq_rewind_min(int seq) const override;
  void seq_window_cells(int seq, std::vector<int32_t>& cells, std::vector<int32_t>& positions) const override;
  void commit_window(std::span<const int> seqs) override;
  int n_window_blocks() const { return static_cast<int>(window_refs_.size()); }
  int n_free_window_blocks() const { return static_cast<int>(free_window_.size()); }
  /// Window tables holding window block `b` (0: free).
  int window_refs(int b) const { return window_refs_[b]; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;  // block table: position p lives in blocks[p / block_size]
    int32_t length = 0;           // positions [0, length) are held
    // Window table (windowed caches): the window block of logical block i, -1 for the leading
    // w_dropped ones the ring gave back; positions [0, w_length) were written.
    std::vector<int32_t> window;
    int32_t w_length = 0;
    int32_t w_dropped = 0;
  };
  PagedKvCache(KvStorage storage, int block_size, int n_window_blocks, int n_swa);
  Sequence* find(int seq);
  const Sequence* find(int seq) const;
  void truncate(int seq, int length);
  // Window blocks: cut the window table to `length` positions; give back the leading blocks no
  // query at `first_query` or later sees; blocks such a drop would free.
  void truncate_window(Sequence& s, int length);
  void drop_window(Sequence& s, int first_query);
  int droppable_window(const Sequence& s, int first_query) const;
  int window_drop_point(int first_query) const;
  void unref_window(int32_t b);

  int block_size_ = 0;
  std::vector<int32_t> block_refs_;   // block tables holding each block, 0: free
  std::vector<int32_t> block_fill_;   // positions written into each block
  std::vector<int32_t> free_blocks_;  // kept sorted in decreasing order: the lowest free block is taken first
  std::vector<std::pair<int, Sequence>> seqs_;  // by sequence id, few enough for a linear search
  int n_used_ = 0;
  int n_swa_ = 0;
  std::vector<int32_t> window_refs_;  // window tables holding each window block (empty: no ring)
  std::vector<int32_t> free_window_;  // decreasing order, like free_blocks_
};

/// A cache of `kind` for a context (`block_size` only for paged caches). `n_window_cells`: the
/// sliding-window layers' cells (0: every cell), for a paged cache a multiple of block_size.
Result<std::unique_ptr<KvCache>> make_kv_cache(KvCacheKind kind, const HParams& hp, int n_ctx, int block_size,
                                               BufferType& type, BufferType* offload_type = nullptr,
                                               int first_offload_layer = -1, int n_window_cells = 0);

/// The cache of a context (for tests: where its layers' tensors live, its bookkeeping).
const KvCache& context_kv_cache(const Context& ctx);

}  // namespace loom::llm::detail
