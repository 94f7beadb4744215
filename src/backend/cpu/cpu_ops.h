// CPU kernels. Each kernel is called on every thread of the pool at once with the thread's index
// and splits the work itself; kernels trust their operands (validated by the op front end).
#pragma once

#include <cstddef>
#include <cstdint>

#include "thread_pool.h"
#include "loom/status.h"
#include "loom/tensor.h"

namespace loom::cpu {

/// What a kernel invocation knows about its thread.
struct KernelContext {
  int ith = 0;                 ///< this thread's index
  int nth = 1;                 ///< threads running the kernel
  uint8_t* work = nullptr;     ///< scratch shared by all threads (work_size bytes)
  size_t work_size = 0;
  ThreadPool* pool = nullptr;  ///< for barrier() inside multi-phase kernels

  void barrier() const {
    if (pool) pool->barrier();
  }
  /// This thread's share [begin, end) of n items.
  void split(int64_t n, int64_t& begin, int64_t& end) const {
    const int64_t per = (n + nth - 1) / nth;
    begin = per * ith < n ? per * ith : n;
    end = begin + per < n ? begin + per : n;
  }
};

/// Scratch bytes the node's kernel needs with nth threads.
size_t work_size(const Tensor& node, int nth);
/// Whether a CPU kernel exists for this node's op and types.
bool supports(const Tensor& node);
/// Runs the node's kernel (a no-op for views).
void compute_node(const KernelContext& ctx, Tensor* node);

// One function per op family; see the .cpp files of the same name.
void op_binary(const KernelContext& ctx, Tensor* dst);     // add sub mul div
void op_unary(const KernelContext& ctx, Tensor* dst);      // scale silu gelu gelu_erf softcap
void op_gated(const KernelContext& ctx, Tensor* dst);      // swiglu geglu
void op_swiglu_oai(const KernelContext& ctx, Tensor* dst);
void op_rms_norm(const KernelContext& ctx, Tensor* dst);
void op_norm(const KernelContext& ctx, Tensor* dst);
void op_soft_max(const KernelContext& ctx, Tensor* dst);
void op_sum_rows(const KernelContext& ctx, Tensor* dst);
void op_all_reduce(const KernelContext& ctx, Tensor* dst);
void op_argmax(const KernelContext& ctx, Tensor* dst);
void op_top_k(const KernelContext& ctx, Tensor* dst);
void op_sample_tokens(const KernelContext& ctx, Tensor* dst);
void op_get_rows(const KernelContext& ctx, Tensor* dst);
void op_set_rows(const KernelContext& ctx, Tensor* dst);
void op_cpy(const KernelContext& ctx, Tensor* dst);
void op_concat(const KernelContext& ctx, Tensor* dst);
void op_mul_mat(const KernelContext& ctx, Tensor* dst);
void op_mul_mat_id(const KernelContext& ctx, Tensor* dst);
size_t mul_mat_work_size(const Tensor& node, int nth);
size_t mul_mat_id_work_size(const Tensor& node, int nth);
void op_rope(const KernelContext& ctx, Tensor* dst);
void op_flash_attn(const KernelContext& ctx, Tensor* dst);
size_t flash_attn_work_size(const Tensor& node, int nth);

/// Pointer to element (i0, i1, i2, i3) of a tensor in host memory.
inline uint8_t* at(const Tensor* t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return static_cast<uint8_t*>(t->data) + t->offset_of(i0, i1, i2, i3);
}

/// Splits the rows of `dst` across threads and calls fn(i1, i2, i3) for each of this thread's rows.
template <typename Fn>
void for_each_row(const KernelContext& ctx, const Tensor* dst, Fn&& fn) {
  int64_t begin, end;
  ctx.split(dst->nrows(), begin, end);
  const int64_t n1 = dst->ne[1], n2 = dst->ne[2];
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i1 = r % n1, i2 = (r / n1) % n2, i3 = r / (n1 * n2);
    fn(i1, i2, i3);
  }
}

}  // namespace loom::cpu
