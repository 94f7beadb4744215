// Matrix multiplication: mul_mat and the expert-routed mul_mat_id.
//
// Both run in two phases. Phase 1: the threads split the activation rows and convert them to the
// weight type's activation type (q8_0 or q8_K; f32 rows are used where they are unless strided) in
// the shared scratch; barrier. Phase 2: the threads take tiles of the output from an atomic counter
// (dynamic, because the 2-core machines this runs on are shared and a static split waits for the
// slowest thread). A tile is a block of weight rows times a block of activation columns; within it
// the dot kernels take kDotMaxCols columns per call, so each weight block is unpacked once per group
// of columns and the weight tile is re-read from L1/L2 for the next group instead of from memory.
//
// Cost model: a decode step (one column) reads every weight byte once (2*m*k FLOPs per m*k weights),
// so it would be bound by memory bandwidth if the dot kernels kept up; with 32+ columns the work is
// compute-bound in the dot kernels. Measured with bench/bench_mul_mat (4096x4096, 2 threads on a quiet
// 2-vCPU Xeon VM whose 260 MB L3 holds the weights): one column f16 45 GB/s, q4_K 17.6 GB/s, q4_0
// 15.6 GB/s -- the quantized ones are limited by the kernels (~7 cycles per q4_0 block), not by memory;
// 32 columns f16 84, q4_0 82, q4_K 139 GFLOP/s (single-core kernel peaks: 38, 46, 77 GFLOP/s).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_ops.h"
#include "vec_dot.h"

namespace loom::cpu {

namespace {

constexpr size_t kAlign = 64;
constexpr int64_t kMaxTileRows = 64;
constexpr int64_t kMinTileRows = 4;
constexpr size_t kTileWeightBytes = 256 * 1024;
constexpr int64_t kTileCols = 32;  // activation rows per tile: 32 q8_0 rows of 4096 are ~140 KB (L2)

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Scratch layout shared by both ops: [tile counter][converted activation rows][op-specific][per-thread
// gather rows]. Every thread derives the same layout from the node.
struct ActLayout {
  const VecDotKernel* kernel = nullptr;
  size_t row_stride = 0;   // bytes between converted rows
  size_t rows_offset = 0;  // where converted rows start
  size_t rows_bytes = 0;
  bool in_place = false;  // f32 activations with contiguous rows are used where they are
};

ActLayout act_layout(const Tensor& weights, const Tensor& b, int64_t n_rows) {
  ActLayout l;
  l.kernel = vec_dot_kernel(weights.type);
  if (!l.kernel) return l;
  l.in_place = l.kernel->act_type == ActType::f32 && b.nb[0] == sizeof(float);
  l.row_stride = align_up(act_row_size(l.kernel->act_type, b.ne[0]));
  l.rows_offset = kAlign;
  l.rows_bytes = l.in_place ? 0 : l.row_stride * static_cast<size_t>(n_rows);
  return l;
}

size_t gather_bytes(const Tensor& b, int nth) {
  return b.nb[0] == sizeof(float) ? 0 : static_cast<size_t>(nth) * align_up(b.ne[0] * sizeof(float));
}

std::atomic_ref<int64_t> tile_counter(const KernelContext& ctx) {
  return std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(ctx.work));
}

// Converts activation row (i1, i2, i3) of b into `dst`; rows with a stride between elements are
// first gathered into this thread's f32 scratch row.
void convert_row(const KernelContext& ctx, const ActLayout& l, const Tensor* b, int64_t i1, int64_t i2,
                 int64_t i3, size_t gather_offset, void* dst) {
  const uint8_t* src = at(b, 0, i1, i2, i3);
  const int64_t k = b->ne[0];
  if (b->nb[0] == sizeof(float)) {
    l.kernel->from_float(reinterpret_cast<const float*>(src), dst, k);
    return;
  }
  float* tmp = reinterpret_cast<float*>(ctx.work + gather_offset + ctx.ith * align_up(k * sizeof(float)));
  for (int64_t i = 0; i < k; ++i) std::memcpy(&tmp[i], src + i * b->nb[0], sizeof(float));
  l.kernel->from_float(tmp, dst, k);
}

// Rows per tile: at most kMaxTileRows and about kTileWeightBytes of weights (so the tile stays in
// L2 while the column groups sweep over it), fewer when needed to give every thread several tiles.
int64_t tile_rows(int64_t m, size_t row_bytes, int64_t other_tiles, int nth) {
  int64_t rows = kMaxTileRows;
  while (rows > kMinTileRows && static_cast<size_t>(rows) * row_bytes > kTileWeightBytes) rows /= 2;
  while (rows > kMinTileRows && other_tiles * ((m + rows - 1) / rows) < 8 * static_cast<int64_t>(nth))
    rows /= 2;
  return rows;
}

// dst(i, col c) = dot(weight row i, xs[c]) for i in [m0, m1) and the given columns, kDotMaxCols
// columns per kernel call. out[c] points at dst element (0, column c); rows are 4 bytes apart.
void run_tile(const VecDotKernel& k, int64_t n, const uint8_t* w, size_t w_row_stride, int64_t m0, int64_t m1,
              const void* const* xs, float* const* out, int64_t n_cols) {
  for (int64_t c0 = 0; c0 < n_cols; c0 += kDotMaxCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kDotMaxCols, n_cols - c0));
    float r[kDotMaxCols];
    for (int64_t i = m0; i < m1; ++i) {
      k.dot(n, w + i * w_row_stride, xs + c0, nc, r);
      for (int c = 0; c < nc; ++c) out[c0 + c][i] = r[c];
    }
  }
}

}  // namespace

// ---- mul_mat ----------------------------------------------------------------------------------------

size_t mul_mat_work_size(const Tensor& node, int nth) {
  const Tensor& a = *node.src[0];
  const Tensor& b = *node.src[1];
  const ActLayout l = act_layout(a, b, b.nrows());
  if (!l.kernel) return 0;
  return l.rows_offset + l.rows_bytes + gather_bytes(b, nth);
}

void op_mul_mat(const KernelContext& ctx, Tensor* dst) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  const ActLayout l = act_layout(*a, *b, b->nrows());
  LOOM_ASSERT(l.kernel != nullptr);
  const int64_t k = a->ne[0], m = a->ne[1];
  const int64_t n = b->ne[1], b2 = b->ne[2], b3 = b->ne[3];
  const int64_t r2 = b2 / a->ne[2], r3 = b3 / a->ne[3];
  uint8_t* rows = ctx.work + l.rows_offset;

  // Phase 1: convert activations.
  if (!l.in_place) {
    const size_t gather_offset = l.rows_offset + l.rows_bytes;
    int64_t begin, end;
    ctx.split(b->nrows(), begin, end);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i1 = r % n, i2 = (r / n) % b2, i3 = r / (n * b2);
      convert_row(ctx, l, b, i1, i2, i3, gather_offset, rows + r * l.row_stride);
    }
  }
  if (ctx.ith == 0) tile_counter(ctx).store(0, std::memory_order_relaxed);
  ctx.barrier();

  // Phase 2: tiles over (batch, column block, row block); row blocks vary fastest so consecutive
  // tiles share the same converted columns.
  const int64_t col_tiles = (n + kTileCols - 1) / kTileCols;
  const int64_t rows_per_tile = tile_rows(m, a->row_size(), col_tiles * b2 * b3, ctx.nth);
  const int64_t row_tiles = (m + rows_per_tile - 1) / rows_per_tile;
  const int64_t n_tiles = row_tiles * col_tiles * b2 * b3;
  const void* xs[kTileCols];
  float* out[kTileCols];
  auto counter = tile_counter(ctx);
  for (int64_t t = counter.fetch_add(1, std::memory_order_relaxed); t < n_tiles;
       t = counter.fetch_add(1, std::memory_order_relaxed)) {
    const int64_t rt = t % row_tiles;
    const int64_t ct = (t / row_tiles) % col_tiles;
    const int64_t batch = t / (row_tiles * col_tiles);
    const int64_t i2 = batch % b2, i3 = batch / b2;
    const int64_t j0 = ct * kTileCols, j1 = std::min(n, j0 + kTileCols);
    for (int64_t j = j0; j < j1; ++j) {
      xs[j - j0] = l.in_place ? static_cast<const void*>(at(b, 0, j, i2, i3))
                              : rows + (j + n * (i2 + b2 * i3)) * l.row_stride;
      out[j - j0] = reinterpret_cast<float*>(at(dst, 0, j, i2, i3));
    }
    const uint8_t* w = at(a, 0, 0, i2 / r2, i3 / r3);
    const int64_t m0 = rt * rows_per_tile, m1 = std::min(m, m0 + rows_per_tile);
    run_tile(*l.kernel, k, w, a->nb[1], m0, m1, xs, out, j1 - j0);
  }
}

// ---- mul_mat_id -------------------------------------------------------------------------------------
//
// The (slot, token) pairs are grouped by expert in phase 1 (thread 0, while the others convert), so
// phase 2 multiplies each used expert's weights by all of its columns at once: the expert's weights
// are read once per step rather than once per token.

namespace {

struct IdLayout {
  ActLayout act;
  size_t offsets_offset = 0;  // int32 [n_expert + 1]: start of each expert's columns
  size_t columns_offset = 0;  // int32 [n_used * n_tokens]: column = slot + n_used * token
  size_t active_offset = 0;   // int32 [n_expert + 1]: used experts, then their count
  size_t gather_offset = 0;
  size_t total = 0;
};

IdLayout id_layout(const Tensor& node, int nth) {
  const Tensor& as = *node.src[0];
  const Tensor& b = *node.src[1];
  const int64_t n_expert = as.ne[2];
  const int64_t n_cols = node.ne[1] * node.ne[2];
  IdLayout l;
  l.act = act_layout(as, b, b.ne[1] * b.ne[2]);
  l.offsets_offset = l.act.rows_offset + l.act.rows_bytes;
  l.columns_offset = l.offsets_offset + align_up((n_expert + 1) * sizeof(int32_t));
  l.active_offset = l.columns_offset + align_up(n_cols * sizeof(int32_t));
  l.gather_offset = l.active_offset + align_up((n_expert + 1) * sizeof(int32_t));
  l.total = l.gather_offset + gather_bytes(b, nth);
  return l;
}

// Counting sort of the columns by expert; columns with an out-of-range id get NaN output.
void group_by_expert(const Tensor* dst, const Tensor* ids, int64_t n_expert, int32_t* offsets,
                     int32_t* columns, int32_t* active) {
  const int64_t n_used = dst->ne[1], n_tokens = dst->ne[2];
  auto id_at = [&](int64_t e, int64_t t) {
    int32_t v;
    std::memcpy(&v, static_cast<const uint8_t*>(ids->data) + e * ids->nb[0] + t * ids->nb[1], sizeof(v));
    return v;
  };
  std::fill(offsets, offsets + n_expert + 1, 0);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t e = 0; e < n_used; ++e) {
      const int32_t id = id_at(e, t);
      if (id >= 0 && id < n_expert) {
        ++offsets[id + 1];
      } else {
        float* o = reinterpret_cast<float*>(at(dst, 0, e, t, 0));
        std::fill(o, o + dst->ne[0], std::numeric_limits<float>::quiet_NaN());
      }
    }
  int32_t n_active = 0;
  for (int64_t x = 0; x < n_expert; ++x) {
    if (offsets[x + 1] > 0) active[n_active++] = static_cast<int32_t>(x);
    offsets[x + 1] += offsets[x];
  }
  active[n_expert] = n_active;
  // offsets[x] is now expert x's start; filling advances it to the next expert's start
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t e = 0; e < n_used; ++e) {
      const int32_t id = id_at(e, t);
      if (id >= 0 && id < n_expert) columns[offsets[id]++] = static_cast<int32_t>(e + n_used * t);
    }
  for (int64_t x = n_expert; x > 0; --x) offsets[x] = offsets[x - 1];
  offsets[0] = 0;
}

}  // namespace

size_t mul_mat_id_work_size(const Tensor& node, int nth) {
  const IdLayout l = id_layout(node, nth);
  return l.act.kernel ? l.total : 0;
}

void op_mul_mat_id(const KernelContext& ctx, Tensor* dst) {
  const Tensor* as = dst->src[0];
  const Tensor* b = dst->src[1];
  const Tensor* ids = dst->src[2];
  const IdLayout l = id_layout(*dst, ctx.nth);
  LOOM_ASSERT(l.act.kernel != nullptr);
  const int64_t k = as->ne[0], m = as->ne[1], n_expert = as->ne[2];
  const int64_t n_used = dst->ne[1];
  const int64_t b1 = b->ne[1];
  uint8_t* rows = ctx.work + l.act.rows_offset;
  auto* offsets = reinterpret_cast<int32_t*>(ctx.work + l.offsets_offset);
  auto* columns = reinterpret_cast<int32_t*>(ctx.work + l.columns_offset);
  auto* active = reinterpret_cast<int32_t*>(ctx.work + l.active_offset);

  if (!l.act.in_place) {
    int64_t begin, end;
    ctx.split(b->ne[1] * b->ne[2], begin, end);
    for (int64_t r = begin; r < end; ++r)
      convert_row(ctx, l.act, b, r % b1, r / b1, 0, l.gather_offset, rows + r * l.act.row_stride);
  }
  if (ctx.ith == 0) {
    group_by_expert(dst, ids, n_expert, offsets, columns, active);
    tile_counter(ctx).store(0, std::memory_order_relaxed);
  }
  ctx.barrier();

  const int64_t n_active = active[n_expert];
  const int64_t rows_per_tile = tile_rows(m, as->row_size(), n_active, ctx.nth);
  const int64_t row_tiles = (m + rows_per_tile - 1) / rows_per_tile;
  const void* xs[kTileCols];
  float* out[kTileCols];
  auto counter = tile_counter(ctx);
  for (int64_t t = counter.fetch_add(1, std::memory_order_relaxed); t < n_active * row_tiles;
       t = counter.fetch_add(1, std::memory_order_relaxed)) {
    const int32_t expert = active[t / row_tiles];
    const int64_t m0 = (t % row_tiles) * rows_per_tile, m1 = std::min(m, m0 + rows_per_tile);
    const uint8_t* w = at(as, 0, 0, expert, 0);
    // all of the expert's columns, kTileCols at a time (the weight tile stays in cache between them)
    for (int32_t c0 = offsets[expert]; c0 < offsets[expert + 1]; c0 += kTileCols) {
      const int64_t nc = std::min<int64_t>(kTileCols, offsets[expert + 1] - c0);
      for (int64_t c = 0; c < nc; ++c) {
        const int64_t col = columns[c0 + c];
        const int64_t slot = col % n_used, token = col / n_used;
        const int64_t brow = (b1 == 1 ? 0 : slot) + b1 * token;
        xs[c] = l.act.in_place ? static_cast<const void*>(at(b, 0, brow % b1, brow / b1, 0))
                               : rows + brow * l.act.row_stride;
        out[c] = reinterpret_cast<float*>(at(dst, 0, slot, token, 0));
      }
      run_tile(*l.act.kernel, k, w, as->nb[1], m0, m1, xs, out, nc);
    }
  }
}

}  // namespace loom::cpu
