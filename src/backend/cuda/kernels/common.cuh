// Device helpers shared by the kernels: tensor addressing, half conversions, warp and block
// reductions. Includes nothing outside src/backend/cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tensor_desc.h"

namespace loom::cuda {

constexpr int kWarpSize = 32;
/// The largest grid.y / grid.z a launch may have.
constexpr unsigned kMaxGridYZ = 65535;

// ---- programmatic dependent launch (PDL) ----------------------------------------------------------
// A kernel launched with the programmatic-stream-serialization attribute may start while the kernel
// before it still runs. griddepcontrol.wait blocks until the prerequisite grids have completed and
// their memory operations are visible, so nothing an earlier kernel writes may be read before it. Every
// kernel calls pdl_wait() first, in all threads, so that any launch may be made programmatic; a kernel
// may first read what no kernel of the step writes (weights, the step's inputs: read_before_wait in
// launch.h) if it says so ("// pdl_wait later: WHY", tests/pdl_wait_check.sh). Such a kernel reads what
// the kernel before it writes with coherent loads (ld_act below), not __ldg: ptxas may schedule an
// ld.global.nc above the wait. Without the attribute (and below sm_90, where it compiles to nothing) it
// returns at once.

// After the wait each kernel also lets its own dependents launch (griddepcontrol.launch_dependents):
// a programmatic dependent is then scheduled once every block of this grid has passed its wait,
// instead of when the last block exits, so its launch and its loads that need no earlier output
// (the mat-vecs' first weights) overlap this kernel's work. Its own pdl_wait still waits for this
// grid's completion and memory flush, so where the trigger sits never changes what it reads.
// LOOM_EXEC_PDL=0 records no programmatic edges: the trigger is then a no-op.

/// Waits for the grids this one depends on programmatically, then triggers its dependents; first
/// statement of every kernel.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/// A load of what an earlier kernel of the step wrote (activations), in a kernel that reads weights before its
/// pdl_wait(): a coherent load (ld.global.ca), never __ldg's ld.global.nc. ld.global.nc promises data that no
/// grid writes while this one runs, and ptxas acts on it: in a direct mat-vec's loop whose first step waits
/// under a flag, it scheduled the activation loads of that step above the griddepcontrol.wait (SASS of the
/// mixed Q/K/V kernel, stop 45: under PDL its logits moved from run to run).
template <class T>
__device__ __forceinline__ T ld_act(const T* p) {
  return __ldca(p);
}

__device__ __forceinline__ int64_t nelements(const TensorDesc& t) {
  return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}
__device__ __forceinline__ int64_t nrows(const TensorDesc& t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

/// Address of element (i0, i1, i2, i3) of a non-quantized tensor.
__device__ __forceinline__ char* element_ptr(const TensorDesc& t, int64_t i0, int64_t i1, int64_t i2,
                                             int64_t i3) {
  return t.data + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/// Address of row (i1, i2, i3).
__device__ __forceinline__ char* row_ptr(const TensorDesc& t, int64_t i1, int64_t i2, int64_t i3) {
  return t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/// Splits a flat row index into (i1, i2, i3) for a tensor with ne1 x ne2 rows per i3.
__device__ __forceinline__ void split_row(int64_t r, int64_t ne1, int64_t ne2, int64_t& i1, int64_t& i2,
                                          int64_t& i3) {
  i1 = r % ne1;
  i2 = (r / ne1) % ne2;
  i3 = r / (ne1 * ne2);
}

/// Splits a flat element index into (i0, i1, i2, i3) in the order ne[0] fastest.
__device__ __forceinline__ void split_index(int64_t e, const int64_t* ne, int64_t* i) {
  i[0] = e % ne[0];
  e /= ne[0];
  i[1] = e % ne[1];
  e /= ne[1];
  i[2] = e % ne[2];
  i[3] = e / ne[2];
}

__device__ __forceinline__ float f16_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
/// Entry j of an attention mask row (f16 or f32) as float, through the read-only path (a kernel reads
/// masks after its pdl_wait: step inputs, or what an earlier kernel wrote).
__device__ __forceinline__ float mask_at(const char* row, int64_t j, bool f16) {
  return f16 ? __half2float(__ldg(reinterpret_cast<const __half*>(row) + j))
             : __ldg(reinterpret_cast<const float*>(row) + j);
}
__device__ __forceinline__ uint16_t float_to_f16(float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t float_to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// Reduces v (float or double) over the warp with `op`; every lane gets the result.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Reduces v over the whole block with `op` (blockDim.x a multiple of 32, at most 1024); every
/// thread gets it. `identity` fills the lanes past the last warp. `scratch` holds 32 values of
/// shared memory; the call ends with the block synchronized, so the scratch may be reused at once.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, Op op) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : identity;
  v = warp_reduce(v, op);
  __syncthreads();
  return v;
}

// Sums are taken in double wherever their result feeds a value the CPU backend computes too
// (norms, softmax, mat-vec and attention accumulators): see docs/NUMERICS.md. In double, any
// summation order gives the exact sum to ~1e-16, so the float both backends round it to is the same.
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }
__device__ __forceinline__ double warp_sum(double v) { return warp_reduce(v, SumOp{}); }
/// Sum over the whole block; the contract of block_reduce.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, 0.0f, SumOp{});
}
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  return block_reduce(v, scratch, 0.0, SumOp{});
}
/// Maximum over the whole block; the contract of block_reduce.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, MaxOp{});
}

/// Calls f(i) with the index i[4] of every element of `t`, one thread per element in a
/// grid-stride loop (launch with grid_for(nelements, threads)).
template <typename F>
__device__ __forceinline__ void for_each_element(const TensorDesc& t, F&& f) {
  const int64_t n = nelements(t);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i[4];
    split_index(e, t.ne, i);
    f(i);
  }
}

}  // namespace loom::cuda
