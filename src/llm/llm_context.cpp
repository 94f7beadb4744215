// Context: a KV cache plus the per-step machinery. A forward pass builds a graph (a few hundred
// nodes; the previous pass's graph is run again when the shape is the same), places its
// activations in one arena that is kept across passes (sized at creation for the largest pass,
// n_batch tokens over a full cache, and grown only if a pass needs more, e.g. all-token logits),
// writes the inputs in one transfer, computes and reads the logits back. A model whose last layers
// are offloaded to a second backend runs each pass as two such graphs (Segment), one per backend.
// A tensor-parallel model runs each pass as one graph per rank (a Segment each, over every layer),
// all at once on threads of their own; each computes its slice of the logits.
//
// Decode steps are made replayable by a graph executor that caches passes by structure (ops,
// shapes, strides, data addresses): attention reads the cache in extents rounded up to
// n_kv_bucket cells, so every step inside one extent builds the same graph; the inputs buffer and
// the arena are reused, and plan_memory is a deterministic function of the graph, so the same
// structure gets the same addresses. Decoding 1,000 tokens from an empty cache (n_ctx >= 1,024,
// bucket 256) therefore makes 1 prompt pass structure + ceil(1,000 / 256) = 4 decode structures
// (one more when the prompt pushes the last token past a bucket boundary), not 1,001.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "loom/exec_plan.h"
#include "llm_kv_cache.h"
#include "logits_buffer.h"
#include "llm_model_impl.h"
#include "loom/planner.h"

namespace loom::llm {

namespace detail {

namespace {
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
constexpr int kDefaultMaxCtx = 4096;

using Clock = std::chrono::steady_clock;
uint64_t elapsed_ns(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

// Cells attention reads: the used extent rounded up to whole buckets, never past the cache. The
// padding cells are free (or hold another sequence): the mask gives them -inf and both kernels
// skip such keys before reading V, so the result equals the exact extent's bit for bit on the CPU.
int bucketed_n_kv(int n_kv, int bucket, int n_ctx) {
  const int64_t up = (static_cast<int64_t>(n_kv) + bucket - 1) / bucket * bucket;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(up, 1), n_ctx));
}

// The tokens of one pass: n_seqs runs of n_q tokens, sequence after sequence, already given cells;
// or (a mixed pass, n_chunk > 0) the first sequence's n_chunk tokens, then one token of each other.
struct StepBatch {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;
  std::span<const int32_t> cells;
  std::span<const int> seqs;
  std::span<const int32_t> window_cells = {};  // ring cell of each token (windowed cache), else empty
  int n_chunk = 0;
};

// Runs fn(rank) for every rank at once: rank 0 on the caller's thread, the others on threads kept
// for the context's life (a decode step is too short to start threads for). Returns the first
// failing rank's status (by rank).
class RankThreads {
 public:
  explicit RankThreads(int n_ranks) : status_(static_cast<size_t>(n_ranks)) {
    for (int r = 1; r < n_ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status run(const std::function<Status(int)>& fn) {
    {
      std::lock_guard lock(mutex_);
      fn_ = &fn;
      pending_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    cv_.notify_all();
    status_[0] = fn(0);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    for (Status& s : status_)
      if (!s.ok()) return s;
    return {};
  }

 private:
  void loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<Status(int)>* fn = nullptr;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      Status s = (*fn)(rank);
      std::lock_guard lock(mutex_);
      status_[static_cast<size_t>(rank)] = std::move(s);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::vector<Status> status_;
  std::mutex mutex_;
  std::condition_variable cv_, done_;
  const std::function<Status(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace

// The graph of one backend's share of a pass: every layer (one backend), or with an offload
// backend the embeddings and first layers, then the last layers and the head. Each part has its
// own inputs block, arena and cached graph in its backend's memory; the hidden state crosses from
// one to the next through the host, inside the next part's inputs block (still one transfer each).
struct Segment {
  Backend* backend = nullptr;
  StepRange range;
  // The model it runs: the whole one, or a tensor-parallel rank's shard.
  const HParams* hp = nullptr;
  const ModelWeights* w = nullptr;
  TensorSplit split;
  int64_t vocab_begin = 0;         // a rank's first logits row
  std::unique_ptr<Buffer> arena;   // activations, reused across passes
  std::unique_ptr<Buffer> inputs;  // input leafs, reused across passes
  size_t inputs_used = 0;          // bytes of `inputs` the last allocated graph's leafs span
  // Host image of `inputs`, written in one transfer per pass. Floats because the masks are most of
  // it (and are filled in place); the i32 inputs are copied in bytewise.
  std::vector<float> staging;

  // The last pass's graph, run again while passes keep its shape. A graph is a function of its
  // shape alone (the weights and cache tensors never move; tokens, positions, cells, masks and the
  // hidden state are inputs), and its tensors stay bound while neither the arena nor the inputs
  // buffer is reallocated. Reuse skips building, planning and fingerprinting: 110-190 us of host
  // time per decode step of a 16-layer graph (llama3-1b shape, 452 nodes; about half building, half
  // planning + binding + ~16 us fingerprint; shared 2-core Xeon VM, quiet to loaded), comparable to
  // the whole step of a 1B model on a fast GPU. A reused step costs ~1.6 us (the inputs).
  struct CachedStep {
    std::unique_ptr<Graph> graph;
    StepShape shape;
    StepInputs in;
    Tensor* out = nullptr;          // the logits, or the hidden state for the next segment
    const Buffer* arena = nullptr;  // the buffers it was bound to
    const Buffer* inputs = nullptr;
    size_t inputs_used = 0;
    uint64_t fingerprint = 0;
    Tensor* sample_params = nullptr;  // shape.sample_k > 0, last segment: the rows' settings (input)
    Tensor* sampled = nullptr;        // and their tokens
    Tensor* sampled_logits = nullptr;  // the logits they were drawn from (tensor-parallel: gathered)

    bool reusable(const StepShape& s, const Buffer* arena_now, const Buffer* inputs_now) const {
      return graph && s == shape && arena == arena_now && inputs == inputs_now;
    }
  } step;
};

struct ContextImpl {
  const Model* model = nullptr;
  const ModelImpl* m = nullptr;
  int n_ctx = 0;
  int n_batch = 0;
  int n_kv_bucket = 1;
  std::unique_ptr<KvCache> kv;
  std::vector<Segment> segments;  // in layer order; the last one computes the logits
  // Tensor parallelism: `segments` are the ranks (each over every layer), run at once.
  bool tensor_parallel = false;
  std::unique_ptr<RankThreads> rank_threads;
  // The host copy of the logits decode returns (logits_buffer.h).
  using LogitsBuffer = detail::LogitsBuffer;
  LogitsBuffer logits;
  DecodeStats stats;
  // decode_batch_sampled: the next run_step's top-k width (0: no sampling in the graph), its rows'
  // SampleParamWord words, and what it sampled.
  int sample_k = 0;
  std::vector<int32_t> sample_words;
  std::vector<int32_t> sampled;         // per output row
  std::vector<int32_t> sampled_tokens;  // per entry
  // A gathering pass's view of each of its sequences: cells and positions in position order, and
  // those of its window cells (a windowed paged cache's sliding-window layers).
  std::vector<std::vector<int32_t>> seq_cells, seq_positions;
  std::vector<std::vector<int32_t>> seq_window_cells, seq_window_positions;

  // Gives every tensor of `g` memory: input leafs in the segment's `inputs`, activations in its
  // `arena` (both reallocated only when too small), views resolved to their source. Input offsets
  // depend only on the leafs' order and shapes, arena offsets only on the graph (plan_memory is
  // deterministic), so the same structure gets the same addresses while the buffers are kept.
  Status allocate(Segment& s, Graph& g) {
    BufferType& type = s.backend->buffer_type();
    const size_t align = type.alignment();
    size_t in_bytes = 0;
    for (Tensor* t : g.leafs())
      if (!t->data) in_bytes += align_up(t->nbytes(), align);
    if (!s.inputs || s.inputs->size() < in_bytes) {
      s.inputs.reset();
      auto buf = type.allocate(in_bytes);
      if (!buf) return buf.status();
      s.inputs = std::move(buf.value());
    }
    size_t off = 0;
    for (Tensor* t : g.leafs()) {
      if (t->data) continue;
      LOOM_TRY(tensor_bind(t, s.inputs.get(), off));
      off += align_up(t->nbytes(), align);
    }
    s.inputs_used = in_bytes;

    const MemoryPlan plan = plan_memory(g, align);
    if (!s.arena || s.arena->size() < plan.peak_bytes) {
      s.arena.reset();  // free the old arena first: peak memory is one arena, not two
      auto buf = type.allocate(plan.peak_bytes);
      if (!buf)
        return make_error(buf.status().code(), "activation arena of {}: {}", format_bytes(plan.peak_bytes),
                          buf.status().message());
      s.arena = std::move(buf.value());
      ++stats.n_arena_allocations;
    }
    for (Tensor* t : g.nodes()) {
      if (t->view_src) {
        const Tensor* src = t->view_src;
        LOOM_ASSERT(src->data != nullptr);
        t->buffer = src->buffer;
        t->data = static_cast<uint8_t*>(src->data) + t->view_offset;
      } else {
        LOOM_TRY(tensor_bind(t, s.arena.get(), plan.offsets[t->index]));
      }
    }
    return {};
  }

  // Builds the segment's part of the pass for `shape`; its output (logits or hidden state),
  // nullptr on error (see g.status()).
  Tensor* build(const Segment& s, Graph& g, const StepShape& shape, StepInputs& in) {
    StepBuilder b(g, *s.hp, *s.w, *kv, m->arch->rope_mode(), shape, s.range, s.split);
    Tensor* out = m->arch->build(b);
    in = b.inputs();
    if (out) g.mark_output(out);
    return out;
  }

  // The sums DecodeStats reports over the segments.
  void update_sizes() {
    stats.n_nodes = 0;
    stats.arena_bytes = 0;
    for (const Segment& s : segments) {
      stats.n_nodes += s.step.graph ? s.step.graph->nodes().size() : 0;
      stats.arena_bytes += s.arena ? s.arena->size() : 0;
    }
  }

  // Byte offset of an input leaf in the segment's `inputs`.
  static size_t input_offset(const Segment& s, const Tensor* t) {
    LOOM_ASSERT(t->buffer == s.inputs.get());
    return static_cast<size_t>(static_cast<const uint8_t*>(t->data) -
                               static_cast<const uint8_t*>(s.inputs->base()));
  }

  // A tensor-parallel rank's logits rows [V_r, n] as the whole vocabulary's [V, n] on every rank: its
  // rows at its offset, zeros elsewhere, summed over the ranks (adding zeros changes no bits, so the
  // rows are the ranks' own). The zeros come from its rows: softcap maps +-inf into (-1, 1), so the
  // product by 0 is 0 for every finite or infinite logit; only a NaN survives, in a row the sampler
  // refuses anyway (sample_tokens gives -1 and the host reads the row back).
  Tensor* gather_vocabulary(Graph& g, const Segment& s, Tensor* rows) {
    Tensor* zeros = scale(g, softcap(g, rows, 1.0f), 0.0f);
    const int64_t mine = rows->ne[0], n = rows->ne[1];
    auto zero_rows = [&](int64_t count) {  // [count, n] zeros, from pieces of `zeros`
      Tensor* z = nullptr;
      for (int64_t done = 0; done < count;) {
        const int64_t take = std::min(count - done, mine);
        Tensor* piece = view(g, zeros, {take, n, 1, 1}, {sizeof(float), zeros->nb[1], zeros->nb[2], zeros->nb[3]}, 0);
        z = z ? concat(g, z, piece, 0) : piece;
        done += take;
      }
      return z;
    };
    Tensor* all = nullptr;
    for (const Segment& q : segments) {
      Tensor* part = &q == &s ? rows : zero_rows(q.hp->n_vocab);
      all = all ? concat(g, all, part, 0) : part;
    }
    return all_reduce(g, all, s.split.comm);
  }

  // Stages every input of the segment's step where allocate() bound it and sends the whole block in
  // one transfer: one host-to-device copy per pass instead of one per input (a copy's fixed cost
  // dominates inputs this small, and a replayed device graph then reads one block written before
  // launch). `hidden` is the previous segment's output, read back into the block.
  Status write_inputs(Segment& s, const StepBatch& b, const StepShape& shape, const Tensor* hidden) {
    const StepInputs& in = s.step.in;
    int n_inputs = 0, n_expected = 0;
    for (const Tensor* t : s.step.graph->leafs()) n_inputs += t->buffer == s.inputs.get();
    for (const Tensor* t :
         {in.tokens, in.hidden, in.positions, in.kv_cells, in.kq_mask, in.kq_mask_swa, in.kv_gather,
          in.kv_cells_swa, in.kq_mask_chunk, in.kq_mask_swa_chunk, in.kv_gather_chunk, in.embd_mask,
          in.kv_gather_swa, in.kv_gather_swa_chunk})
      n_expected += t != nullptr;
    n_expected += s.step.sample_params != nullptr;
    // The block is written whole: a leaf in it that is not a step input would get stale bytes.
    LOOM_ASSERT(n_inputs == n_expected);
    const size_t used = s.step.inputs_used;
    LOOM_ASSERT(used % sizeof(float) == 0);
    s.staging.resize(used / sizeof(float));
    auto* base = reinterpret_cast<uint8_t*>(s.staging.data());
    const size_t n_bytes = b.tokens.size() * sizeof(int32_t);
    if (in.tokens && !in.embd_mask) std::memcpy(base + input_offset(s, in.tokens), b.tokens.data(), n_bytes);
    if (in.tokens && in.embd_mask) {  // a rank's vocabulary slice of the embeddings (StepInputs::embd_mask)
      auto* rows = reinterpret_cast<int32_t*>(base + input_offset(s, in.tokens));
      float* mask = s.staging.data() + input_offset(s, in.embd_mask) / sizeof(float);
      const int64_t first = s.vocab_begin, n_rows = s.hp->n_vocab;
      for (size_t i = 0; i < b.tokens.size(); ++i) {
        const int64_t row = b.tokens[i] - first;
        const bool mine = row >= 0 && row < n_rows;
        rows[i] = mine ? static_cast<int32_t>(row) : 0;
        mask[i] = mine ? 1.0f : 0.0f;
      }
    }
    if (s.step.sample_params) {
      LOOM_ASSERT(sample_words.size() * sizeof(int32_t) == s.step.sample_params->nbytes());
      std::memcpy(base + input_offset(s, s.step.sample_params), sample_words.data(),
                  sample_words.size() * sizeof(int32_t));
    }
    if (in.positions) std::memcpy(base + input_offset(s, in.positions), b.positions.data(), n_bytes);
    if (in.kv_cells) std::memcpy(base + input_offset(s, in.kv_cells), b.cells.data(), n_bytes);
    if (in.kv_cells_swa) {
      LOOM_ASSERT(b.window_cells.size() == b.tokens.size());
      std::memcpy(base + input_offset(s, in.kv_cells_swa), b.window_cells.data(), n_bytes);
    }
    auto mask_at = [&](const Tensor* t) { return s.staging.data() + input_offset(s, t) / sizeof(float); };
    if (shape.gather) {
      // The one-token group of a mixed pass is its sequences after the first; the chunk is the first.
      const size_t first = shape.n_chunk > 0 ? 1 : 0, n_seqs = b.seqs.size();
      const size_t tok0 = static_cast<size_t>(shape.n_chunk), n_q = first ? 1 : b.tokens.size() / n_seqs;
      const int n_swa = static_cast<int>(m->hp.n_swa);
      const int n_kv = shape.n_kv, n_kv_chunk = shape.n_kv_chunk;
      const int64_t n_head_kv = s.hp->n_head_kv, n_cells = kv->n_cells();
      // Local layers read the window cells when the cache has a ring (their own slots and rows).
      const bool windowed = shape.n_kv_swa > 0;
      const auto& swa_pos = windowed ? seq_window_positions : seq_positions;
      const int n_kv_swa = windowed ? shape.n_kv_swa : n_kv;
      const int n_kv_swa_chunk = windowed ? shape.n_kv_swa_chunk : n_kv_chunk;
      auto rows_at = [&](const Tensor* t) { return reinterpret_cast<int32_t*>(base + input_offset(s, t)); };
      if (in.kq_mask)
        fill_gathered_mask(b, seq_positions, first, n_seqs, tok0, n_q, n_kv, mask_at(in.kq_mask), 0);
      if (in.kq_mask_swa)
        fill_gathered_mask(b, swa_pos, first, n_seqs, tok0, n_q, n_kv_swa, mask_at(in.kq_mask_swa), n_swa);
      if (in.kv_gather)
        fill_gather_rows(seq_cells, n_cells, first, n_seqs, n_kv, n_head_kv, rows_at(in.kv_gather));
      if (in.kv_gather_swa)
        fill_gather_rows(seq_window_cells, kv->n_window_cells(), first, n_seqs, n_kv_swa, n_head_kv,
                         rows_at(in.kv_gather_swa));
      if (in.kq_mask_chunk)
        fill_gathered_mask(b, seq_positions, 0, 1, 0, tok0, n_kv_chunk, mask_at(in.kq_mask_chunk), 0);
      if (in.kq_mask_swa_chunk)
        fill_gathered_mask(b, swa_pos, 0, 1, 0, tok0, n_kv_swa_chunk, mask_at(in.kq_mask_swa_chunk), n_swa);
      if (in.kv_gather_chunk)
        fill_gather_rows(seq_cells, n_cells, 0, 1, n_kv_chunk, n_head_kv, rows_at(in.kv_gather_chunk));
      if (in.kv_gather_swa_chunk)
        fill_gather_rows(seq_window_cells, kv->n_window_cells(), 0, 1, n_kv_swa_chunk, n_head_kv,
                         rows_at(in.kv_gather_swa_chunk));
    } else {
      const int seq = b.seqs[0];
      if (in.kq_mask) kv->fill_mask(b.positions, seq, shape.n_kv, mask_at(in.kq_mask));
      if (in.kq_mask_swa && shape.n_kv_swa > 0)
        kv->fill_mask_window(b.positions, seq, shape.n_kv_swa, mask_at(in.kq_mask_swa));
      else if (in.kq_mask_swa)
        kv->fill_mask(b.positions, seq, shape.n_kv, mask_at(in.kq_mask_swa), static_cast<int>(m->hp.n_swa));
    }
    if (in.hidden) {
      LOOM_ASSERT(hidden && hidden->nbytes() == in.hidden->nbytes());
      LOOM_TRY(tensor_read(hidden, base + input_offset(s, in.hidden), 0, in.hidden->nbytes()));
    }
    LOOM_TRY(s.inputs->write(0, s.staging.data(), used));
    ++stats.n_input_writes;
    return {};
  }

  // Gathering mask [n_kv, n_q, 1, seq_end - seq_begin] of the step's sequences [seq_begin, seq_end),
  // whose n_q tokens each start at token tok0: slot j of a sequence is its j-th cell in position
  // order (`positions`: each sequence's cells' positions); slots past its cells (the bucket's
  // padding) are -inf.
  static void fill_gathered_mask(const StepBatch& b, const std::vector<std::vector<int32_t>>& positions,
                                 size_t seq_begin, size_t seq_end, size_t tok0, size_t n_q, int n_kv_slots,
                                 float* mask, int n_swa) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const size_t n_kv = static_cast<size_t>(n_kv_slots);
    for (size_t si = seq_begin; si < seq_end; ++si) {
      const std::vector<int32_t>& pos = positions[si];
      const size_t g = si - seq_begin;
      for (size_t i = 0; i < n_q; ++i) {
        const int32_t qp = b.positions[tok0 + g * n_q + i];
        float* row = mask + (g * n_q + i) * n_kv;
        for (size_t j = 0; j < n_kv; ++j)
          row[j] = j < pos.size() && pos[j] <= qp && (n_swa <= 0 || qp - pos[j] < n_swa) ? 0.0f : neg_inf;
      }
    }
  }

  // Gather rows [n_kv, n_head_kv, seq_end - seq_begin] of the step's sequences [seq_begin, seq_end)
  // into a store of `n_cells` cells (`cells`: each sequence's) viewed as [head_dim, n_cells *
  // n_head_kv]. Padding slots read the sequence's first cell: finite data the mask gives no weight.
  // n_head_kv: the segment's (a rank's share).
  static void fill_gather_rows(const std::vector<std::vector<int32_t>>& seq_cells_of, int64_t n_cells,
                               size_t seq_begin, size_t seq_end, int n_kv_slots, int64_t n_head_kv,
                               int32_t* rows) {
    const int64_t n_kv = n_kv_slots;
    for (size_t si = seq_begin; si < seq_end; ++si) {
      const std::vector<int32_t>& cells = seq_cells_of[si];
      LOOM_ASSERT(!cells.empty() && cells.size() <= static_cast<size_t>(n_kv));
      for (int64_t h = 0; h < n_head_kv; ++h) {
        int32_t* out = rows + n_kv * (h + n_head_kv * static_cast<int64_t>(si - seq_begin));
        for (int64_t j = 0; j < n_kv; ++j)
          out[j] = static_cast<int32_t>(h * n_cells + cells[j < static_cast<int64_t>(cells.size()) ? j : 0]);
      }
    }
  }

  // A decode call starts: no logits yet, its own step statistics.
  void begin_call() {
    logits.clear();
    stats.n_steps = 0;
    stats.n_input_writes = 0;
    stats.n_graph_builds = 0;
    stats.host_build_ns = stats.host_alloc_ns = stats.host_inputs_ns = 0;
    stats.host_compute_ns = stats.host_readback_ns = 0;
    stats.logits_bytes_read = 0;
    stats.tp_rank_busy_ns.assign(tensor_parallel ? segments.size() : 0, 0);
    stats.tp_rank_start_lag_ns.assign(tensor_parallel ? segments.size() : 0, 0);
  }

  // One forward pass over tokens already given cache cells, segment after segment; appends the
  // logits to `out` if given.
  Status run_step(const StepBatch& b, bool all_outputs, LogitsBuffer* out) {
    const int n_seqs = static_cast<int>(b.seqs.size());
    const bool gather = n_seqs > 1 || !kv->reads_prefix();
    // The contiguous ring serves one sequence reading the prefix (decode_batch refuses more); a
    // paged cache's ring is gathered per sequence.
    const bool windowed = kv->windowed();
    LOOM_ASSERT(!gather || !windowed || !kv->reads_prefix());
    LOOM_ASSERT(b.n_chunk == 0 || (gather && n_seqs >= 2));
    int extent = 0, extent_chunk = 0;  // a mixed pass: the one-token sequences', the chunk's
    int extent_swa = 0, extent_swa_chunk = 0;
    if (gather) {
      seq_cells.resize(b.seqs.size());
      seq_positions.resize(b.seqs.size());
      seq_window_cells.resize(b.seqs.size());
      seq_window_positions.resize(b.seqs.size());
      for (size_t si = 0; si < b.seqs.size(); ++si) {
        kv->seq_cells(b.seqs[si], seq_cells[si], seq_positions[si]);
        const bool chunk = b.n_chunk > 0 && si == 0;
        int& e = chunk ? extent_chunk : extent;
        e = std::max(e, static_cast<int>(seq_cells[si].size()));
        if (!windowed) continue;
        kv->seq_window_cells(b.seqs[si], seq_window_cells[si], seq_window_positions[si]);
        int& w = chunk ? extent_swa_chunk : extent_swa;
        w = std::max(w, static_cast<int>(seq_window_cells[si].size()));
      }
    } else {
      extent = kv->n_kv();
      extent_swa = windowed ? kv->n_kv_window() : 0;
    }
    // n_kv never exceeds the cache's cells: a single sequence's pass never needs more than
    // Context::create reserved the arenas and the inputs for (n_batch tokens over the whole cache).
    // Likewise n_kv_swa never exceeds the window cells.
    const StepShape shape{
        static_cast<int>(b.tokens.size()),
        bucketed_n_kv(extent, n_kv_bucket, kv->n_cells()),
        all_outputs,
        n_seqs,
        gather,
        windowed ? bucketed_n_kv(extent_swa, n_kv_bucket, kv->n_window_cells()) : 0,
        b.n_chunk,
        b.n_chunk > 0 ? bucketed_n_kv(extent_chunk, n_kv_bucket, kv->n_cells()) : 0,
        b.n_chunk > 0 && windowed ? bucketed_n_kv(extent_swa_chunk, n_kv_bucket, kv->n_window_cells()) : 0,
        sample_k};
    const Tensor* carried = nullptr;  // the previous segment's hidden state
    bool built = false;
    uint64_t fingerprint = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      Segment& s = segments[i];
      const Clock::time_point t0 = Clock::now();
      Clock::time_point t1 = t0, t2 = t0;
      if (!s.step.reusable(shape, s.arena.get(), s.inputs.get())) {
        s.step = Segment::CachedStep{};
        auto g = std::make_unique<Graph>();
        StepInputs in;
        Tensor* out_t = build(s, *g, shape, in);
        Tensor *sample_params = nullptr, *sampled_t = nullptr, *logits_t = out_t;
        // the last segment samples; tensor-parallel ranks each gather the vocabulary and sample alike
        // (sampling on the last rank only left the ranks' graphs unequal: 64-sequence -tp 2 steps
        // ~20% slower on 2x H200, docs/PERFORMANCE.md)
        if (shape.sample_k > 0 && (tensor_parallel || i + 1 == segments.size()) && out_t) {
          if (tensor_parallel) logits_t = gather_vocabulary(*g, s, out_t);
          // After the logits: each row's sample_k best, then its token (sample_tokens' definition
          // is the host sampler's chain after penalties, so the tokens are the host's).
          sample_params = g->input(DType::i32, {kSampleParamWords, out_t->ne[1], 1, 1}, "sample_params");
          sampled_t = sample_tokens(*g, logits_t, top_k(*g, logits_t, shape.sample_k), sample_params);
          if (sampled_t) g->mark_output(sampled_t);
          if (logits_t) g->mark_output(logits_t);
        }
        LOOM_TRY(g->status());
        t1 = Clock::now();
        LOOM_TRY(allocate(s, *g));
        // The step's one structure encoding: attached to the graph, so an executor that caches per
        // structure reads it on every compute of this step instead of encoding the graph again.
        g->set_structure_key(exec::structure_key(*g));
        const uint64_t fp = g->structure_key()->hash;
        t2 = Clock::now();
        const Buffer* arena_now = s.arena.get();
        const Buffer* inputs_now = s.inputs.get();
        s.step = Segment::CachedStep{std::move(g), shape,         in, out_t,         arena_now,
                                     inputs_now,   s.inputs_used, fp, sample_params, sampled_t,
                                     logits_t};
        built = true;
      }
      LOOM_TRY(write_inputs(s, b, shape, carried));
      const Clock::time_point t3 = Clock::now();
      stats.host_build_ns += elapsed_ns(t0, t1);
      stats.host_alloc_ns += elapsed_ns(t1, t2);
      stats.host_inputs_ns += elapsed_ns(t2, t3);
      fingerprint = fingerprint * 0x9e3779b97f4a7c15ull + s.step.fingerprint;  // segments in order
      if (tensor_parallel) continue;  // the ranks compute together below
      LOOM_TRY(s.backend->compute(*s.step.graph));
      stats.host_compute_ns += elapsed_ns(t3, Clock::now());
      carried = s.step.out;
    }
    if (tensor_parallel) {
      // Every rank's graph at once (their all-reduces meet); each reads its logits rows back and
      // puts them at its vocabulary offset of every output row.
      const int64_t n_vocab = m->hp.n_vocab, n_out = segments[0].step.out->ne[1];
      float* dst = out ? out->append(static_cast<size_t>(n_vocab * n_out)) : nullptr;
      const Clock::time_point handed = Clock::now();
      auto part = [&](Segment& s) -> Status {
        Status st = s.backend->compute(*s.step.graph);
        if (!st.ok()) {
          s.split.comm->abort();  // ranks waiting for this one in a collective give up
          return st;
        }
        if (!dst) return {};
        // the rank's slice of every output row, in place: one strided read into the logits buffer,
        // page-locked where the backend has such memory (it was read into a vector, pageable, then
        // copied row by row; the one-GPU path's page-locked read-back was worth 17% at 64 sequences,
        // docs/PERFORMANCE.md)
        return tensor_read_rows(s.step.out, dst + s.vocab_begin, static_cast<size_t>(n_vocab) * sizeof(float));
      };
      LOOM_TRY(rank_threads->run([&](int r) -> Status {  // each rank times its part in its own entries
        const auto k = static_cast<size_t>(r);
        const Clock::time_point began = Clock::now();
        Status st = part(segments[k]);
        stats.tp_rank_busy_ns[k] += elapsed_ns(began, Clock::now());
        stats.tp_rank_start_lag_ns[k] += elapsed_ns(handed, began);
        return st;
      }));
      stats.host_compute_ns += elapsed_ns(handed, Clock::now());  // the ranks' parts, read-backs included
      if (dst) stats.logits_bytes_read += static_cast<uint64_t>(n_vocab * n_out) * sizeof(float);
    }
    if (built) {
      ++stats.n_graph_builds;
      update_sizes();
    }
    stats.n_kv = shape.n_kv;
    stats.graph_fingerprint = fingerprint;
    ++stats.n_steps;
    const Clock::time_point read0 = Clock::now();
    if (out && !tensor_parallel) {
      const size_t count = static_cast<size_t>(carried->nelements());
      LOOM_TRY(tensor_read(carried, out->append(count), 0, count * sizeof(float)));
      stats.logits_bytes_read += count * sizeof(float);
    }
    if (shape.sample_k > 0) {
      const Tensor* t = segments.back().step.sampled;
      LOOM_ASSERT(t != nullptr);
      sampled.resize(static_cast<size_t>(t->nelements()));
      LOOM_TRY(tensor_read(t, sampled.data(), 0, sampled.size() * sizeof(int32_t)));
    }
    stats.host_readback_ns += elapsed_ns(read0, Clock::now());
    return {};
  }
};

const KvCache& context_kv_cache(const Context& ctx) { return *ctx.impl().kv; }

}  // namespace detail

Context::Context(std::unique_ptr<detail::ContextImpl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

Result<std::unique_ptr<Context>> Context::create(const Model& model, const ContextParams& params) {
  const HParams& hp = model.hparams();
  auto impl = std::make_unique<detail::ContextImpl>();
  detail::ContextImpl& c = *impl;
  c.model = &model;
  c.m = &model.impl();
  if (params.n_ctx < 0 || params.n_batch < 1 || params.n_kv_bucket < 1 || params.kv_block_size < 1 ||
      params.n_seq_max < 0)
    return make_error(StatusCode::invalid_argument,
                      "context: n_ctx {} must be >= 0, n_batch {} >= 1, n_kv_bucket {} >= 1, kv_block_size {} "
                      ">= 1 and n_seq_max {} >= 0",
                      params.n_ctx, params.n_batch, params.n_kv_bucket, params.kv_block_size, params.n_seq_max);
  c.n_ctx = params.n_ctx > 0 ? params.n_ctx
                             : static_cast<int>(std::min<uint32_t>(hp.n_ctx_train, detail::kDefaultMaxCtx));
  if (params.kv_cache == KvCacheKind::paged)  // whole blocks
    c.n_ctx = static_cast<int>(
        std::min<int64_t>((static_cast<int64_t>(c.n_ctx) + params.kv_block_size - 1) / params.kv_block_size *
                              params.kv_block_size,
                          std::numeric_limits<int32_t>::max() / params.kv_block_size * params.kv_block_size));
  c.n_batch = std::min(params.n_batch, c.n_ctx);
  c.n_kv_bucket = params.n_kv_bucket;

  const int n_layer = static_cast<int>(hp.n_layer);
  const int first_offload = c.m->first_offload_layer();
  Backend* offload = c.m->n_offload > 0 ? c.m->offload_backend : nullptr;
  BufferType& type = model.backend().buffer_type();
  BufferType* offload_type = offload ? &offload->buffer_type() : nullptr;
  // Sliding-window layers keep a ring (llm_kv_cache.h). A contiguous cache's holds one sequence:
  // window + n_batch - 1 cells, so a step's tokens land in it without overwriting a position that
  // the step's first query still sees (decode_batch refuses several sequences on it). A paged
  // cache's is a pool of blocks sized for n_seq_max sequences (PagedKvCache::window_blocks_needed);
  // without n_seq_max it keeps every cell, as with swa_full.
  const bool paged = params.kv_cache == KvCacheKind::paged;
  const int64_t ring =
      paged ? detail::PagedKvCache::window_blocks_needed(static_cast<int>(hp.n_swa), params.kv_block_size,
                                                         params.n_seq_max, c.n_batch) *
                  params.kv_block_size
            : static_cast<int64_t>(hp.n_swa) + c.n_batch - 1;
  const int n_window_cells =
      !params.swa_full && hp.has_swa() && (!paged || params.n_seq_max > 0) && ring < c.n_ctx
          ? static_cast<int>(ring)
          : 0;
  const uint64_t host_need =
      (type.is_host() ? detail::KvStorage::bytes_needed(hp, c.n_ctx, first_offload, 0, n_window_cells) : 0) +
      (offload_type && offload_type->is_host()
           ? detail::KvStorage::bytes_needed(hp, c.n_ctx, n_layer - first_offload, first_offload,
                                             n_window_cells)
           : 0);
  if (host_need > 0) {
    const uint64_t avail =
        params.available_memory ? params.available_memory : detail::host_memory_available();
    if (avail && host_need > avail)
      return make_error(
          StatusCode::out_of_memory,
          "context: a KV cache of {} cells needs {} but only {} of memory is available (MemAvailable); "
          "use a smaller n_ctx",
          c.n_ctx, detail::format_bytes(host_need), detail::format_bytes(avail));
  }
  const std::vector<detail::Shard>& shards = c.m->shards;
  // A tensor-parallel model: rank 0's KV heads in the cache's own storage, the others' added.
  auto kv = detail::make_kv_cache(params.kv_cache, shards.empty() ? hp : shards[0].hp, c.n_ctx,
                                  params.kv_block_size, type, offload_type, first_offload, n_window_cells);
  if (!kv) return kv.status();
  c.kv = std::move(kv.value());
  for (size_t r = 1; r < shards.size(); ++r) {
    auto storage = detail::KvStorage::create(shards[r].hp, c.kv->n_cells(), shards[r].backend->buffer_type(),
                                             nullptr, -1, c.kv->windowed() ? c.kv->n_window_cells() : 0);
    if (!storage)
      return make_error(storage.status().code(), "context: rank {}: {}", r, storage.status().message());
    c.kv->add_rank_storage(std::move(storage.value()));
  }

  if (!shards.empty()) {
    c.tensor_parallel = true;
    c.segments.resize(shards.size());
    for (size_t r = 0; r < shards.size(); ++r) {
      detail::Segment& s = c.segments[r];
      s.backend = shards[r].backend;
      s.range = detail::StepRange{0, n_layer};
      s.hp = &shards[r].hp;
      s.w = &shards[r].w;
      s.split = detail::TensorSplit{shards[r].comm, static_cast<int>(r)};
      s.vocab_begin = shards[r].vocab_begin;
    }
    c.rank_threads = std::make_unique<detail::RankThreads>(static_cast<int>(shards.size()));
  } else if (offload) {
    c.segments.resize(2);
    c.segments[0].backend = &model.backend();
    c.segments[0].range = detail::StepRange{0, first_offload};
    c.segments[1].backend = offload;
    c.segments[1].range = detail::StepRange{first_offload, n_layer};
  } else {
    c.segments.resize(1);
    c.segments[0].backend = &model.backend();
    c.segments[0].range = detail::StepRange{0, n_layer};
  }
  for (detail::Segment& s : c.segments)
    if (!s.hp) {
      s.hp = &c.m->hp;
      s.w = &c.m->w;
    }
  // Reserve the arenas with the largest pass, so decoding never reallocates them.
  for (detail::Segment& s : c.segments) {
    Graph g;
    detail::StepInputs in;
    c.build(s, g,
            detail::StepShape{c.n_batch, c.n_ctx, false, 1, !c.kv->reads_prefix(),
                              c.kv->windowed() ? c.kv->n_window_cells() : 0},
            in);
    LOOM_TRY(g.status());
    LOOM_TRY(c.allocate(s, g));
    c.stats.n_nodes += g.nodes().size();
  }
  c.stats.arena_bytes = 0;
  for (const detail::Segment& s : c.segments) c.stats.arena_bytes += s.arena->size();
  static const bool pinned = env_switch("LOOM_PINNED_LOGITS");  // =0: plain host memory, to compare
  if (pinned)
    c.logits.fast_type = c.segments.back().backend->host_buffer_type();
  return std::unique_ptr<Context>(new Context(std::move(impl)));
}

Result<std::span<const float>> Context::decode(std::span<const int32_t> tokens, int pos,
                                               const DecodeOptions& options) {
  detail::ContextImpl& c = *impl_;
  const int n_vocab = static_cast<int>(c.m->hp.n_vocab);
  if (tokens.empty()) return make_error(StatusCode::invalid_argument, "decode: no tokens");
  if (options.seq_id < 0)
    return make_error(StatusCode::invalid_argument, "decode: seq_id {} must be >= 0", options.seq_id);
  if (pos < 0) return make_error(StatusCode::invalid_argument, "decode: position {} must be >= 0", pos);
  if (static_cast<int64_t>(pos) + static_cast<int64_t>(tokens.size()) > (1ll << 30))
    return make_error(StatusCode::invalid_argument, "decode: positions up to {} are too large",
                      static_cast<int64_t>(pos) + static_cast<int64_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      return make_error(StatusCode::invalid_argument,
                        "decode: token {} at index {} is outside the vocabulary [0, {})", tokens[i], i,
                        n_vocab);
  const int last = c.kv->seq_pos_max(options.seq_id);
  if (pos <= last)
    return make_error(
        StatusCode::invalid_argument,
        "decode: sequence {} already holds positions up to {}; position {} must come after them "
        "(kv_cache_seq_rm rewinds)",
        options.seq_id, last, pos);
  if (tokens.size() > static_cast<size_t>(c.kv->room(options.seq_id)))
    return make_error(
        StatusCode::out_of_memory,
        "decode: {} tokens do not fit the context: sequence {} has room for {} ({} of {} cells are "
        "used)",
        tokens.size(), options.seq_id, c.kv->room(options.seq_id), c.kv->used(), c.n_ctx);

  c.begin_call();
  std::vector<int32_t> positions;
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(c.n_batch)) {
    const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(c.n_batch));
    const bool last_chunk = begin + n == tokens.size();
    positions.resize(n);
    for (size_t i = 0; i < n; ++i) positions[i] = pos + static_cast<int32_t>(begin + i);
    auto cells = c.kv->claim(positions, options.seq_id);
    if (!cells) return cells.status();
    std::vector<int32_t> window;
    if (c.kv->windowed()) {
      auto w = c.kv->claim_window(positions, options.seq_id);
      if (!w) {
        c.kv->release(*cells);
        return w.status();
      }
      window = std::move(*w);
    }
    // Chunks before the last compute one row of logits and drop it (cheaper than a second graph shape).
    detail::ContextImpl::LogitsBuffer* out = (options.all_logits || last_chunk) ? &c.logits : nullptr;
    const int seqs[1] = {options.seq_id};
    Status s = c.run_step(detail::StepBatch{tokens.subspan(begin, n), positions, *cells, seqs, window},
                          options.all_logits, out);
    if (!s.ok()) {
      c.kv->release(*cells);
      c.kv->release_window(window);
      return s;
    }
    c.kv->commit_window(seqs);
    if (options.on_chunk) options.on_chunk(begin + n, tokens.size());
  }
  return c.logits.view();
}

namespace {

// decode_batch's pass: checks the entries, claims their cells and runs one step (the chunk's
// sequence first); the logits are read back into c.logits when `read_logits`. Returns the entry
// of the chunk (seqs.size() when none); on error nothing is stored.
Result<size_t> run_batch_step(detail::ContextImpl& c, std::span<const SeqTokens> seqs, bool read_logits) {
  const int n_vocab = static_cast<int>(c.m->hp.n_vocab);
  // The contiguous cache's ring holds one sequence's window (window + n_batch - 1 cells), and its
  // steps over several sequences gather full-cache cells: such a context must keep every cell in its
  // sliding-window layers (swa_full), or be a paged cache, whose ring holds each sequence's window.
  // Refused rather than mixed up. A single sequence reads the ring in place, as decode does
  // (decode_batch_sampled of one sequence: `loom run`'s steps on a gemma or gpt-oss model).
  if (seqs.size() > 1 && c.kv->windowed() && c.kv->reads_prefix())
    return make_error(StatusCode::invalid_argument,
                      "decode_batch: {} sequences in one step need every cell of the sliding-window layers, "
                      "but this context keeps only a ring of {} cells for them; create it with swa_full "
                      "(--swa-full) or a paged KV cache",
                      seqs.size(), c.kv->n_window_cells());
  // A mixed pass: at most one sequence brings several tokens (a prompt chunk); it goes first in the
  // pass (its last row and the others' rows are then one contiguous block of outputs). A packed pass:
  // every sequence brings the same number of tokens (prompts of one length), in the order given.
  size_t chunk_at = seqs.size(), n_tokens = 0, n_several = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqTokens& st = seqs[i];
    if (st.tokens.empty())
      return make_error(StatusCode::invalid_argument, "decode_batch: sequence {} (entry {}) brings no tokens",
                        st.seq_id, i);
    if (st.tokens.size() > 1) {
      if (n_several++ == 0) chunk_at = i;
    }
    n_tokens += st.tokens.size();
  }
  const bool packed = n_several > 1;
  if (packed) {
    for (const SeqTokens& st : seqs)
      if (st.tokens.size() != seqs[0].tokens.size())
        return make_error(StatusCode::invalid_argument,
                          "decode_batch: sequences {} and {} bring {} and {} tokens; a step over several "
                          "sequences takes one token each, at most one of them more, or the same number from "
                          "every one",
                          seqs[0].seq_id, st.seq_id, seqs[0].tokens.size(), st.tokens.size());
    chunk_at = seqs.size();  // no chunk: equal runs, in the order given
  }
  if (n_tokens > static_cast<size_t>(c.n_batch))
    return make_error(StatusCode::invalid_argument,
                      "decode_batch: {} tokens of {} sequences exceed the batch size {}", n_tokens,
                      seqs.size(), c.n_batch);
  std::vector<int32_t> tokens, positions;
  std::vector<int> ids;
  auto take = [&](size_t i) -> Status {
    const SeqTokens& st = seqs[i];
    if (st.seq_id < 0)
      return make_error(StatusCode::invalid_argument, "decode_batch: seq_id {} must be >= 0", st.seq_id);
    if (std::find(ids.begin(), ids.end(), st.seq_id) != ids.end())
      return make_error(StatusCode::invalid_argument, "decode_batch: sequence {} appears twice", st.seq_id);
    for (int32_t t : st.tokens)
      if (t < 0 || t >= n_vocab)
        return make_error(StatusCode::invalid_argument,
                          "decode_batch: token {} of sequence {} is outside the vocabulary [0, {})", t,
                          st.seq_id, n_vocab);
    const int last = c.kv->seq_pos_max(st.seq_id);
    if (st.pos <= last || st.pos < 0 ||
        static_cast<int64_t>(st.pos) + static_cast<int64_t>(st.tokens.size()) > (1 << 30))
      return make_error(
          StatusCode::invalid_argument,
          "decode_batch: sequence {} holds positions up to {}; position {} must come after them", st.seq_id,
          last, st.pos);
    ids.push_back(st.seq_id);
    for (size_t j = 0; j < st.tokens.size(); ++j) {
      tokens.push_back(st.tokens[j]);
      positions.push_back(st.pos + static_cast<int32_t>(j));
    }
    return {};
  };
  if (chunk_at < seqs.size()) LOOM_TRY(take(chunk_at));
  for (size_t i = 0; i < seqs.size(); ++i)
    if (i != chunk_at) LOOM_TRY(take(i));
  // Cells for every sequence, or for none: a sequence the cache cannot hold fails the step without
  // touching the others' cells.
  std::vector<int32_t> cells, window;
  size_t tok = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t n = packed                                 ? seqs[i].tokens.size()
                     : i == 0 && chunk_at < seqs.size() ? seqs[chunk_at].tokens.size()
                                                        : 1;
    const auto pos = std::span<const int32_t>(positions).subspan(tok, n);
    auto got = c.kv->claim(pos, ids[i]);
    Result<std::vector<int32_t>> got_window = std::vector<int32_t>{};
    if (got && c.kv->windowed()) {
      got_window = c.kv->claim_window(pos, ids[i]);
      if (!got_window) c.kv->release(*got);
    }
    if (!got || !got_window) {
      c.kv->release(cells);
      c.kv->release_window(window);
      const Status& e = got ? got_window.status() : got.status();
      return make_error(e.code(), "decode_batch: sequence {}: {}", ids[i], e.message());
    }
    cells.insert(cells.end(), got->begin(), got->end());
    window.insert(window.end(), got_window->begin(), got_window->end());
    tok += n;
  }
  c.begin_call();
  // A single sequence's several tokens are a plain pass (as decode), not a mixed one.
  const int n_chunk =
      chunk_at < seqs.size() && seqs.size() > 1 ? static_cast<int>(seqs[chunk_at].tokens.size()) : 0;
  Status s = c.run_step(detail::StepBatch{tokens, positions, cells, ids, window, n_chunk}, false,
                        read_logits ? &c.logits : nullptr);
  if (!s.ok()) {
    c.kv->release(cells);
    c.kv->release_window(window);
    return s;
  }
  c.kv->commit_window(ids);
  return chunk_at;
}

// A step's rows come out the chunk's first, then the others' in the order given: the chunk's row
// moves to its entry `chunk_at` (nothing moves when the caller put it first, as BatchGenerator does).
void rows_in_entry_order(detail::ContextImpl& c, size_t chunk_at, size_t n_entries) {
  if (chunk_at == 0 || chunk_at >= n_entries) return;
  const size_t n_vocab = static_cast<size_t>(c.m->hp.n_vocab);
  float* rows = c.logits.base();
  std::rotate(rows, rows + n_vocab, rows + (chunk_at + 1) * n_vocab);
}

}  // namespace

Result<std::span<const float>> Context::decode_batch(std::span<const SeqTokens> seqs) {
  detail::ContextImpl& c = *impl_;
  if (seqs.empty()) return make_error(StatusCode::invalid_argument, "decode_batch: no sequences");
  if (seqs.size() == 1) {
    DecodeOptions o;
    o.seq_id = seqs[0].seq_id;
    return decode(seqs[0].tokens, seqs[0].pos, o);
  }
  auto chunk = run_batch_step(c, seqs, true);
  if (!chunk) return chunk.status();
  rows_in_entry_order(c, *chunk, seqs.size());
  return c.logits.view();
}

bool Context::supports_device_sampling() const { return true; }

Result<SampledStep> Context::decode_batch_sampled(std::span<const SeqTokens> seqs,
                                                  std::span<const DeviceSampling> sampling) {
  detail::ContextImpl& c = *impl_;
  if (seqs.empty()) return make_error(StatusCode::invalid_argument, "decode_batch_sampled: no sequences");
  if (sampling.size() != seqs.size())
    return make_error(StatusCode::invalid_argument,
                      "decode_batch_sampled: {} sampling settings for {} sequences", sampling.size(),
                      seqs.size());
  const int64_t n_vocab = c.m->hp.n_vocab;
  // The top-k width: the widest on-device setting, rounded up to a power of two so that the graph
  // (cached per shape) changes rarely; greedy needs 1.
  int64_t widest = 0;
  for (size_t i = 0; i < sampling.size(); ++i) {
    const DeviceSampling& d = sampling[i];
    if (!d.on_device) continue;
    const bool greedy = d.temperature <= 0.0f;
    if (!greedy && (d.top_k < 1 || d.top_k >= n_vocab || !(d.uniform >= 0.0 && d.uniform < 1.0)))
      return make_error(
          StatusCode::invalid_argument,
          "decode_batch_sampled: entry {}: top_k {} must be in [1, {}) and uniform {} in [0, 1)", i, d.top_k,
          n_vocab, d.uniform);
    widest = std::max<int64_t>(widest, greedy ? 1 : d.top_k);
  }
  int64_t k = 0;
  if (widest > 0) {
    k = 1;
    while (k < widest) k *= 2;
    k = std::min(k, n_vocab);
  }
  // The rows come out chunk first, then the others in entry order.
  size_t chunk_at = seqs.size();
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs[i].tokens.size() > 1) chunk_at = i;
  std::vector<size_t> row_entry;
  if (chunk_at < seqs.size()) row_entry.push_back(chunk_at);
  for (size_t i = 0; i < seqs.size(); ++i)
    if (i != chunk_at) row_entry.push_back(i);
  c.sample_words.assign(seqs.size() * kSampleParamWords, 0);
  auto bits = [](float f) {
    int32_t w;
    std::memcpy(&w, &f, sizeof w);
    return w;
  };
  for (size_t r = 0; r < row_entry.size(); ++r) {
    const DeviceSampling& d = sampling[row_entry[r]];
    int32_t* w = c.sample_words.data() + r * kSampleParamWords;
    if (!d.on_device) {
      w[kSampleTemperature] = bits(0.0f);  // a cheap greedy pick nobody reads
      continue;
    }
    w[kSampleTopK] = d.temperature <= 0.0f ? 1 : d.top_k;
    w[kSampleTemperature] = bits(d.temperature);
    w[kSampleTopP] = bits(d.top_p);
    w[kSampleMinP] = bits(d.min_p);
    // the host sampler's threshold term, computed by the same function (apply_min_p)
    w[kSampleLogMinP] = bits(d.min_p > 0.0f ? std::log(d.min_p) : 0.0f);
    w[kSampleMinKeep] = d.min_keep;
    uint64_t u;
    std::memcpy(&u, &d.uniform, sizeof u);
    w[kSampleUniformLo] = static_cast<int32_t>(static_cast<uint32_t>(u));
    w[kSampleUniformHi] = static_cast<int32_t>(static_cast<uint32_t>(u >> 32));
  }
  c.sample_k = static_cast<int>(k);
  auto ran = run_batch_step(c, seqs, k == 0);
  c.sample_k = 0;
  if (!ran) return ran.status();
  c.sampled_tokens.assign(seqs.size(), -1);
  if (k == 0) {  // nothing on the device: every row came back, as decode_batch gives them
    rows_in_entry_order(c, chunk_at, seqs.size());
    return SampledStep{c.sampled_tokens, c.logits.view()};
  }
  // Tokens to their entries; the rows the host samples are read back, and only those.
  for (size_t r = 0; r < row_entry.size(); ++r)
    if (sampling[row_entry[r]].on_device) c.sampled_tokens[row_entry[r]] = c.sampled[r];
  const Tensor* logits_t = c.segments.back().step.sampled_logits;
  const size_t row_bytes = static_cast<size_t>(n_vocab) * sizeof(float);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (c.sampled_tokens[i] >= 0) continue;
    const size_t r =
        static_cast<size_t>(std::find(row_entry.begin(), row_entry.end(), i) - row_entry.begin());
    LOOM_TRY(tensor_read(logits_t, c.logits.append(static_cast<size_t>(n_vocab)), r * row_bytes, row_bytes));
    c.stats.logits_bytes_read += row_bytes;
  }
  return SampledStep{c.sampled_tokens, c.logits.view()};
}

void Context::kv_cache_clear() { impl_->kv->clear(); }

Status Context::kv_cache_seq_rm(int seq_id, int p0, int p1) {
  if (seq_id < 0 || p0 < 0 || (p1 >= 0 && p1 < p0))
    return make_error(StatusCode::invalid_argument, "kv_cache_seq_rm: bad range: seq {}, positions [{}, {})",
                      seq_id, p0, p1);
  detail::KvCache& kv = *impl_->kv;
  // A sequence cut at p0 continues at p0, which needs the window before it: refuse to cut where the
  // sliding-window ring has already dropped part of that (the cache is left as it was).
  if (p0 > 0 && p1 < 0 && p0 <= kv.seq_pos_max(seq_id) && p0 < kv.seq_rewind_min(seq_id))
    return make_error(
        StatusCode::invalid_argument,
        "kv_cache_seq_rm: sequence {} cannot be rewound to position {}: its sliding-window layers "
        "keep only the last {} positions (rewind to {} or later, or from 0 to clear it)",
        seq_id, p0, impl_->m->hp.n_swa, kv.seq_rewind_min(seq_id));
  return kv.seq_rm(seq_id, p0, p1);
}

Result<int> Context::kv_cache_seq_share_prefix(int src, int dst, int n_positions) {
  if (src < 0 || dst < 0 || src == dst)
    return make_error(StatusCode::invalid_argument,
                      "kv_cache_seq_share_prefix: sequences {} and {} must be two ids >= 0", src, dst);
  if (impl_->kv->seq_pos_max(dst) >= 0)
    return make_error(StatusCode::invalid_argument,
                      "kv_cache_seq_share_prefix: sequence {} already holds positions up to {}", dst,
                      impl_->kv->seq_pos_max(dst));
  return impl_->kv->seq_share_prefix(src, dst, n_positions);
}

int Context::kv_cache_seq_pos_max(int seq_id) const { return impl_->kv->seq_pos_max(seq_id); }
int Context::kv_cache_used() const { return impl_->kv->used(); }
int Context::n_ctx() const { return impl_->n_ctx; }
int Context::n_batch() const { return impl_->n_batch; }
int Context::n_vocab() const { return static_cast<int>(impl_->m->hp.n_vocab); }
size_t Context::kv_cache_bytes() const { return impl_->kv->bytes(); }
KvCacheKind Context::kv_cache_kind() const { return impl_->kv->kind(); }
bool Context::swa_full() const { return !impl_->kv->windowed(); }
const Model& Context::model() const { return *impl_->model; }
const DecodeStats& Context::stats() const { return impl_->stats; }

Result<Session> open_session(const SessionParams& p) {
  Session s;
  BackendOptions bo;
  bo.n_threads = p.n_threads;
  bo.device = p.device;
  bo.numerics = p.numerics;
  auto backend = create_backend(p.backend, bo);
  if (!backend) return backend.status();
  s.backend = std::move(backend.value());
  ModelLoadOptions mo;
  mo.progress = p.progress;
  mo.print_summary = p.print_summary;
  if (!p.offload_backend.empty() && p.n_offload_layers > 0) {
    auto offload = create_backend(p.offload_backend, bo);
    if (!offload) return offload.status();
    s.offload_backend = std::move(offload.value());
    mo.offload_backend = s.offload_backend.get();
    mo.n_offload_layers = p.n_offload_layers;
  }
  if (p.n_tensor_parallel < 1)
    return make_error(StatusCode::invalid_argument, "tensor parallelism over {} ranks: must be at least 1",
                      p.n_tensor_parallel);
  if (p.n_tensor_parallel > 1) {
    if (!p.offload_backend.empty() && p.n_offload_layers > 0)
      return make_error(StatusCode::invalid_argument,
                        "tensor parallelism and layer offload do not go together");
    mo.tensor_parallel.push_back(s.backend.get());
    for (int r = 1; r < p.n_tensor_parallel; ++r) {
      BackendOptions rank_options = bo;
      rank_options.device = p.device + r;
      auto rank = create_backend(p.backend, rank_options);
      if (!rank)
        return make_error(rank.status().code(), "tensor-parallel rank {}: {}", r, rank.status().message());
      s.tp_backends.push_back(std::move(rank.value()));
      mo.tensor_parallel.push_back(s.tp_backends.back().get());
    }
  }
  auto model = Model::load(p.model_path, *s.backend, mo);
  if (!model) return model.status();
  s.model = std::move(model.value());
  ContextParams cp;
  cp.n_ctx = p.n_ctx;
  cp.n_batch = p.n_batch;
  cp.kv_cache = p.kv_cache;
  cp.swa_full = p.swa_full;
  cp.n_seq_max = p.n_seq_max;
  auto ctx = Context::create(*s.model, cp);
  if (!ctx) return ctx.status();
  s.context = std::move(ctx.value());
  if (p.print_summary)
    fmt::print(stderr, "loom: context {} cells, batch {}, KV cache {} (f16), activations {}, backend {}{}\n",
               s.context->n_ctx(), s.context->n_batch(), detail::format_bytes(s.context->kv_cache_bytes()),
               detail::format_bytes(s.context->stats().arena_bytes), s.backend->name(),
               s.model->offload_backend() ? fmt::format(" + {}", s.model->offload_backend()->name())
               : s.tp_backends.empty()    ? std::string()
                                          : fmt::format(" x {} (tensor parallel)", s.tp_backends.size() + 1));
  return s;
}

}  // namespace loom::llm
