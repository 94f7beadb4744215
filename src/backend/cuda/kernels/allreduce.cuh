// All-reduces of small tensors between the GPUs of one process (tensor parallelism's decode steps)
// by the LL ("low latency") protocol over NVLink peer access: a rank stores each float of its partial
// into every peer's receive buffer as one 8-byte word {float bits, call epoch}, which a store writes
// whole, so a reader that polls its own buffer until a word carries this call's epoch has that
// word's data: no fence, no separate flag, one kernel and one NVLink crossing. Every rank sums the
// partials in rank order, so all ranks hold the same bits.
//
// The helpers below are used by the stand-alone kernel (allreduce.cu) and by the fused
// all-reduce + residual add + RMS norm (fused.cu), which exchanges a row's partials in its prologue.
//
// Ordering, per slot s and call epoch e (each slot counts the calls that use it; every rank makes the
// same calls with the same slots, so the counts agree): call e writes parity e & 1. Rank p can write
// call e + 2 into rank q's buffer only after finishing call e + 1, which needed q's words of call
// e + 1, which q sends after its call e (stream order: a collective is a barrier of the plan) and so
// after reading p's words of call e. Two parities suffice.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_error.h"

namespace loom {
class Communicator;
}

namespace loom::cuda {

inline constexpr int kLLMaxRanks = 8;
inline constexpr int kLLSlots = 64;           ///< concurrent blocks (a fused norm's rows) per call
inline constexpr int64_t kLLSlotWords = 8192;  ///< floats a slot carries (a row of up to 8192)

/// One rank's view of its group's buffers (device pointers; peers' reachable by peer access).
/// recv[q]: rank q's words [2 parities][n_ranks senders][kLLSlots][kLLSlotWords], zeroed at setup;
/// epoch: this rank's per-slot call counters (u32 [kLLSlots]), zeroed at setup.
struct LLGroup {
  int rank = 0;
  int n_ranks = 0;
  uint64_t* recv[kLLMaxRanks] = {};
  uint32_t* epoch = nullptr;
};

/// Bytes of one rank's receive buffer and of its epochs.
inline constexpr size_t ll_recv_bytes(int n_ranks) {
  return sizeof(uint64_t) * 2 * static_cast<size_t>(n_ranks) * kLLSlots * kLLSlotWords;
}
inline constexpr size_t ll_epoch_bytes() { return sizeof(uint32_t) * kLLSlots; }

#ifdef __CUDACC__

/// The words rank `from` sends to rank `owner` in slot `slot` of a call with this epoch.
__device__ __forceinline__ uint64_t* ll_words(const LLGroup& g, int owner, uint32_t epoch, int from, int slot) {
  const size_t parity = epoch & 1u;
  return g.recv[owner] + ((parity * g.n_ranks + from) * kLLSlots + slot) * kLLSlotWords;
}

/// This block's epoch for `slot` (the slot's call count + 1); every thread of the block must call
/// it (a barrier). ll_end stores it back.
__device__ __forceinline__ uint32_t ll_begin(const LLGroup& g, int slot) {
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = g.epoch[slot] + 1;
  __syncthreads();
  return epoch_s;
}
__device__ __forceinline__ void ll_end(const LLGroup& g, int slot, uint32_t epoch) {
  if (threadIdx.x == 0) g.epoch[slot] = epoch;
}

/// A peer that never sends (it failed before this call) would keep a reader spinning for good: after
/// kLLTimeoutNs of waiting the kernel traps, and the launch's error reaches the caller.
inline constexpr uint64_t kLLTimeoutNs = 20'000'000'000ull;
__device__ __forceinline__ void ll_check_timeout(uint64_t& since) {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  if (since == 0) since = now;
  else if (now - since > kLLTimeoutNs) __trap();
}

__device__ __forceinline__ uint64_t ll_word(float v, uint32_t epoch) {
  return static_cast<uint64_t>(__float_as_uint(v)) | (static_cast<uint64_t>(epoch) << 32);
}

/// Sends floats [w, w + 4) of this rank's partial (w a multiple of 4) to every peer.
__device__ __forceinline__ void ll_send4(const LLGroup& g, uint32_t epoch, int slot, int64_t w, float4 v) {
  const uint64_t a = ll_word(v.x, epoch), b = ll_word(v.y, epoch), c = ll_word(v.z, epoch),
                 d = ll_word(v.w, epoch);
  for (int q = 0; q < g.n_ranks; ++q) {
    if (q == g.rank) continue;
    uint64_t* p = ll_words(g, q, epoch, g.rank, slot) + w;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p + 2), "l"(c), "l"(d) : "memory");
  }
}

/// Floats [w, w + 4) of rank `from`'s partial, once they have arrived in this rank's buffer.
__device__ __forceinline__ float4 ll_recv4(const LLGroup& g, uint32_t epoch, int slot, int from, int64_t w) {
  const uint64_t* p = ll_words(g, g.rank, epoch, from, slot) + w;
  uint64_t a, b, c, d;
  uint64_t since = 0;
  do {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"(p + 2) : "memory");
    if (static_cast<uint32_t>(a >> 32) == epoch && static_cast<uint32_t>(b >> 32) == epoch &&
        static_cast<uint32_t>(c >> 32) == epoch && static_cast<uint32_t>(d >> 32) == epoch)
      break;
    ll_check_timeout(since);
  } while (true);
  return make_float4(__uint_as_float(static_cast<uint32_t>(a)), __uint_as_float(static_cast<uint32_t>(b)),
                     __uint_as_float(static_cast<uint32_t>(c)), __uint_as_float(static_cast<uint32_t>(d)));
}

/// The sum over the ranks of floats [w, w + 4), in rank order (`mine` is this rank's): the same bits
/// on every rank. Call after ll_send4 of the same floats.
__device__ __forceinline__ float4 ll_sum4(const LLGroup& g, uint32_t epoch, int slot, int64_t w, float4 mine) {
  float4 s = g.rank == 0 ? mine : ll_recv4(g, epoch, slot, 0, w);
  for (int q = 1; q < g.n_ranks; ++q) {
    const float4 v = q == g.rank ? mine : ll_recv4(g, epoch, slot, q, w);
    s = make_float4(s.x + v.x, s.y + v.y, s.z + v.z, s.w + v.w);
  }
  return s;
}

#endif  // __CUDACC__

/// The LL buffers of `comm` (its rank's view) when it is an NCCL communicator whose group has them
/// (peer access between every pair of its GPUs), else nullptr (cuda_nccl.cpp).
const LLGroup* ll_group(Communicator& comm);

/// Floats the stand-alone kernel takes (n % 4 == 0); larger tensors go through NCCL.
inline constexpr int64_t kLLAllReduceMaxElems = 1024 * kLLSlots;

/// Sums n floats over the ranks (n % 4 == 0, n <= kLLAllReduceMaxElems); every rank must launch it
/// with the same n, in the same order as its other collectives. src may equal dst.
CudaError launch_ll_all_reduce(const LLGroup& g, const float* src, float* dst, int64_t n, cudaStream_t stream);

}  // namespace loom::cuda
