// Data movement kernels. Types are chosen at run time inside the kernels (a uniform switch per
// element) rather than by template, to keep the number of instantiations small; these ops move
// little data next to mul_mat and attention.
#include <cstddef>

#include "common.cuh"
#include "copy.cuh"
#include "loom/dtype.h"
#include "quant.cuh"
#include "quant_dispatch.cuh"

namespace loom::cuda {

// The device formats in quant.cuh must be GGUF's layouts, as described by loom/dtype.h.
static_assert(FormatQ8_0::kBytes == sizeof(BlockQ8_0) && FormatQ8_0::kBlock == kQK8_0);
static_assert(FormatQ4_0::kBytes == sizeof(BlockQ4_0) && FormatQ4_0::kBlock == kQK4_0);
static_assert(FormatQ4_K::kBytes == sizeof(BlockQ4_K) && FormatQ4_K::kBlock == kQK_K);
static_assert(FormatQ6_K::kBytes == sizeof(BlockQ6_K) && FormatQ6_K::kBlock == kQK_K);
static_assert(offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ4_K, qs) == 16);
static_assert(offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 &&
              offsetof(BlockQ6_K, d) == 208);
// The read-only formats (quant_blocks.cuh; the byte offsets its decoders use).
static_assert(FormatQ4_1::kBytes == sizeof(BlockQ4_1) && FormatQ4_1::kBlock == kQK32 &&
              offsetof(BlockQ4_1, qs) == 4);
static_assert(FormatQ5_0::kBytes == sizeof(BlockQ5_0) && FormatQ5_0::kBlock == kQK32 &&
              offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6);
static_assert(FormatQ5_1::kBytes == sizeof(BlockQ5_1) && FormatQ5_1::kBlock == kQK32 &&
              offsetof(BlockQ5_1, qh) == 4 && offsetof(BlockQ5_1, qs) == 8);
static_assert(FormatQ2_K::kBytes == sizeof(BlockQ2_K) && FormatQ2_K::kBlock == kQK_K &&
              offsetof(BlockQ2_K, qs) == 16 && offsetof(BlockQ2_K, d) == 80 &&
              offsetof(BlockQ2_K, dmin) == 82);
static_assert(FormatQ3_K::kBytes == sizeof(BlockQ3_K) && FormatQ3_K::kBlock == kQK_K &&
              offsetof(BlockQ3_K, qs) == 32 && offsetof(BlockQ3_K, scales) == 96 &&
              offsetof(BlockQ3_K, d) == 108);
static_assert(FormatQ5_K::kBytes == sizeof(BlockQ5_K) && FormatQ5_K::kBlock == kQK_K &&
              offsetof(BlockQ5_K, scales) == 4 && offsetof(BlockQ5_K, qh) == 16 &&
              offsetof(BlockQ5_K, qs) == 48);
static_assert(FormatIQ4_NL::kBytes == sizeof(BlockIQ4_NL) && FormatIQ4_NL::kBlock == kQK32 &&
              offsetof(BlockIQ4_NL, qs) == 2);
static_assert(FormatIQ4_XS::kBytes == sizeof(BlockIQ4_XS) && FormatIQ4_XS::kBlock == kQK_K &&
              offsetof(BlockIQ4_XS, scales_h) == 2 && offsetof(BlockIQ4_XS, scales_l) == 4 &&
              offsetof(BlockIQ4_XS, qs) == 8);
static_assert(FormatMXFP4::kBytes == sizeof(BlockMXFP4) && FormatMXFP4::kBlock == kQK32 &&
              offsetof(BlockMXFP4, qs) == 1);

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlock = 32;  // largest block stored by the generic kernels (q8_0, q4_0)
// The K-quant kernels run one thread per 256-element block, each a long serial scale search
// (quant_k.cuh); small CTAs spread the few blocks of a typical copy over more SMs.
constexpr int kKQuantThreads = 32;

// Element (i0, i1, i2, i3) of a tensor of any type, as float. Quantized tensors have contiguous
// rows (the op front ends check it), so their elements are found from the row start.
__device__ float load_any(DType type, const TensorDesc& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  switch (type) {
    case DType::f32:
      return FormatF32::load(reinterpret_cast<const uint8_t*>(element_ptr(t, i0, i1, i2, i3)), 0);
    case DType::f16:
      return FormatF16::load(reinterpret_cast<const uint8_t*>(element_ptr(t, i0, i1, i2, i3)), 0);
    case DType::bf16:
      return FormatBF16::load(reinterpret_cast<const uint8_t*>(element_ptr(t, i0, i1, i2, i3)), 0);
    case DType::i32:
      return FormatI32::load(reinterpret_cast<const uint8_t*>(element_ptr(t, i0, i1, i2, i3)), 0);
    default:
      break;
  }
  const char* row = row_ptr(t, i1, i2, i3);
  return visit_quant_type(type, 0.0f,
                          [&](auto q) { return load_element<typename decltype(q)::Format>(row, i0); });
}

// Writes one block of `type` (1 element for plain types) from x.
__device__ void store_any(DType type, const float* x, uint8_t* block) {
  switch (type) {
    case DType::f32:
      FormatF32::store(x, block);
      return;
    case DType::f16:
      FormatF16::store(x, block);
      return;
    case DType::bf16:
      FormatBF16::store(x, block);
      return;
    case DType::i32:
      FormatI32::store(x, block);
      return;
    case DType::q8_0:
      FormatQ8_0::store(x, block);
      return;
    case DType::q4_0:
      FormatQ4_0::store(x, block);
      return;
    case DType::q4_k:
    case DType::q6_k:
      return;  // 256-element blocks: set_rows_kquant_kernel and cpy_kquant_kernel
    default:   // the read-only formats: cuda_ops.cpp never launches a node that writes them
      return;
  }
}

__global__ void get_rows_kernel(TensorDesc dst, TensorDesc a, DType a_type, TensorDesc idx) {
  pdl_wait();
  for (int64_t r = blockIdx.x; r < nrows(dst); r += gridDim.x) {
    int64_t i1, i2, i3;  // i1: position in the index list; i2, i3: batch shared with a
    split_row(r, dst.ne[1], dst.ne[2], i1, i2, i3);
    const int32_t row =
        *reinterpret_cast<const int32_t*>(idx.data + i1 * idx.nb[0] + i2 * idx.nb[1] + i3 * idx.nb[2]);
    auto* y = reinterpret_cast<float*>(row_ptr(dst, i1, i2, i3));
    const bool valid = row >= 0 && row < a.ne[1];  // out of range gives NaN, never a wild read
    for (int64_t i = threadIdx.x; i < dst.ne[0]; i += blockDim.x)
      y[i] = valid ? load_any(a_type, a, i, row, i2, i3) : __int_as_float(0x7fc00000);
  }
}

// Source block q of a set_rows (blocks of `block` floats, row after row): its floats and the
// destination block they go to, or false where the row's index is out of range (nothing written).
__device__ bool set_rows_block(const TensorDesc& dst, const TensorDesc& src, const TensorDesc& idx, int64_t q,
                               int64_t blocks_per_row, int block, int block_bytes, const float*& from,
                               uint8_t*& to) {
  const int64_t b = q % blocks_per_row;
  int64_t i1, i2, i3;
  split_row(q / blocks_per_row, src.ne[1], src.ne[2], i1, i2, i3);
  const int32_t row = *reinterpret_cast<const int32_t*>(
      idx.data + i1 * idx.nb[0] + (i2 % idx.ne[1]) * idx.nb[1] + (i3 % idx.ne[2]) * idx.nb[2]);
  if (row < 0 || row >= dst.ne[1]) return false;
  from = reinterpret_cast<const float*>(row_ptr(src, i1, i2, i3)) + b * block;
  to = reinterpret_cast<uint8_t*>(row_ptr(dst, row, i2, i3)) + b * block_bytes;
  return true;
}

// One thread per destination block: gathers the block's source floats, then stores it.
__global__ void set_rows_kernel(TensorDesc dst, DType dst_type, int block, int block_bytes, TensorDesc src,
                                TensorDesc idx) {
  pdl_wait();
  const int64_t blocks_per_row = src.ne[0] / block;
  const int64_t n = nrows(src) * blocks_per_row;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* s;
    uint8_t* out;
    if (!set_rows_block(dst, src, idx, q, blocks_per_row, block, block_bytes, s, out)) continue;
    float x[kMaxBlock];
    for (int j = 0; j < block; ++j) x[j] = s[j];
    store_any(dst_type, x, out);
  }
}

// set_rows into a K-quant (F = FormatQ4_K or FormatQ6_K): one thread per 256-element block. The
// quantizer reads its floats in place, from the contiguous f32 source row.
template <class F>
__global__ void set_rows_kquant_kernel(TensorDesc dst, TensorDesc src, TensorDesc idx) {
  pdl_wait();
  const int64_t blocks_per_row = src.ne[0] / F::kBlock;
  const int64_t n = nrows(src) * blocks_per_row;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* s;
    uint8_t* out;
    if (set_rows_block(dst, src, idx, q, blocks_per_row, F::kBlock, F::kBytes, s, out)) F::store(s, out);
  }
}

// cpy into a non-quantized destination: element e of the source in logical order goes to element
// e of the destination; either side may have any strides. i32 is copied bit for bit.
__global__ void cpy_kernel(TensorDesc dst, DType dst_type, TensorDesc src, DType src_type) {
  pdl_wait();
  const int64_t n = nelements(dst);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s[4], d[4];
    split_index(e, src.ne, s);
    split_index(e, dst.ne, d);
    auto* out = reinterpret_cast<uint8_t*>(element_ptr(dst, d[0], d[1], d[2], d[3]));
    if (src_type == DType::i32) {
      *reinterpret_cast<int32_t*>(out) =
          *reinterpret_cast<const int32_t*>(element_ptr(src, s[0], s[1], s[2], s[3]));
      continue;
    }
    const float v = load_any(src_type, src, s[0], s[1], s[2], s[3]);
    store_any(dst_type, &v, out);
  }
}

// cpy into a quantized destination (contiguous, rows of whole blocks): one thread per block.
__global__ void cpy_quantize_kernel(TensorDesc dst, DType dst_type, int block, int block_bytes,
                                    TensorDesc src, DType src_type) {
  pdl_wait();
  const int64_t n = nelements(dst) / block;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[kMaxBlock];
    for (int j = 0; j < block; ++j) {
      int64_t s[4];
      split_index(q * block + j, src.ne, s);
      x[j] = load_any(src_type, src, s[0], s[1], s[2], s[3]);
    }
    store_any(dst_type, x, reinterpret_cast<uint8_t*>(dst.data) + q * block_bytes);
  }
}

// cpy into a K-quant (contiguous, rows of whole blocks): one thread per block, which gathers its 256
// source elements in logical order into its own row of shared memory (padded by one float so the
// threads' rows fall in different banks), then quantizes them.
template <class F>
__global__ void cpy_kquant_kernel(TensorDesc dst, TensorDesc src, DType src_type) {
  pdl_wait();
  __shared__ float staged[kKQuantThreads][F::kBlock + 1];
  float* x = staged[threadIdx.x];
  const int64_t n = nelements(dst) / F::kBlock;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int j = 0; j < F::kBlock; ++j) {
      int64_t s[4];
      split_index(q * F::kBlock + j, src.ne, s);
      x[j] = load_any(src_type, src, s[0], s[1], s[2], s[3]);
    }
    F::store(x, reinterpret_cast<uint8_t*>(dst.data) + q * F::kBytes);
  }
}

__global__ void concat_kernel(TensorDesc dst, TensorDesc a, TensorDesc b, int dim, int type_size) {
  pdl_wait();
  for_each_element(dst, [&](int64_t* i) {
    char* out = element_ptr(dst, i[0], i[1], i[2], i[3]);
    const TensorDesc* from = &a;
    if (i[dim] >= a.ne[dim]) {
      i[dim] -= a.ne[dim];
      from = &b;
    }
    const char* in = element_ptr(*from, i[0], i[1], i[2], i[3]);
    if (type_size == 4) {
      *reinterpret_cast<uint32_t*>(out) = *reinterpret_cast<const uint32_t*>(in);
    } else {
      *reinterpret_cast<uint16_t*>(out) = *reinterpret_cast<const uint16_t*>(in);
    }
  });
}

}  // namespace

CudaError launch_get_rows(const LaunchContext& ctx, const Tensor* dst) {
  if (dst->nrows() == 0 || dst->ne[0] == 0) return {};
  const Tensor* a = dst->src[0];
  get_rows_kernel<<<row_grid(dst->nrows()), row_block_threads(dst->ne[0]), 0, ctx.stream>>>(
      desc_of(dst), desc_of(a), a->type, desc_of(dst->src[1]));
  LOOM_CUDA_CHECK_LAUNCH("get_rows_kernel");
  return {};
}

CudaError launch_set_rows(const LaunchContext& ctx, const Tensor* dst) {
  const Tensor* src = dst->src[0];
  const int block = static_cast<int>(dtype_block_size(dst->type));
  const int64_t n = src->nrows() * (src->ne[0] / block);
  if (n == 0) return {};
  if (dst->type == DType::q4_k || dst->type == DType::q6_k) {
    const unsigned grid = grid_for(n, kKQuantThreads);
    if (dst->type == DType::q4_k) {
      set_rows_kquant_kernel<FormatQ4_K>
          <<<grid, kKQuantThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(src), desc_of(dst->src[1]));
    } else {
      set_rows_kquant_kernel<FormatQ6_K>
          <<<grid, kKQuantThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(src), desc_of(dst->src[1]));
    }
    LOOM_CUDA_CHECK_LAUNCH("set_rows_kquant_kernel");
    return {};
  }
  set_rows_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      desc_of(dst), dst->type, block, static_cast<int>(dtype_type_size(dst->type)), desc_of(src),
      desc_of(dst->src[1]));
  LOOM_CUDA_CHECK_LAUNCH("set_rows_kernel");
  return {};
}

CudaError launch_cpy(const LaunchContext& ctx, const Tensor* dst) {
  const Tensor* src = dst->src[0];
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  if (dst->type == DType::q4_k || dst->type == DType::q6_k) {
    const unsigned grid = grid_for(n / kQK_K, kKQuantThreads);
    if (dst->type == DType::q4_k) {
      cpy_kquant_kernel<FormatQ4_K>
          <<<grid, kKQuantThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(src), src->type);
    } else {
      cpy_kquant_kernel<FormatQ6_K>
          <<<grid, kKQuantThreads, 0, ctx.stream>>>(desc_of(dst), desc_of(src), src->type);
    }
    LOOM_CUDA_CHECK_LAUNCH("cpy_kquant_kernel");
    return {};
  }
  if (dtype_is_quantized(dst->type)) {
    const int block = static_cast<int>(dtype_block_size(dst->type));
    cpy_quantize_kernel<<<grid_for(n / block, kThreads), kThreads, 0, ctx.stream>>>(
        desc_of(dst), dst->type, block, static_cast<int>(dtype_type_size(dst->type)), desc_of(src),
        src->type);
    LOOM_CUDA_CHECK_LAUNCH("cpy_quantize_kernel");
    return {};
  }
  cpy_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(desc_of(dst), dst->type, desc_of(src),
                                                                 src->type);
  LOOM_CUDA_CHECK_LAUNCH("cpy_kernel");
  return {};
}

CudaError launch_concat(const LaunchContext& ctx, const Tensor* dst, int dim) {
  const int64_t n = dst->nelements();
  if (n == 0) return {};
  concat_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), dim,
      static_cast<int>(dtype_type_size(dst->type)));
  LOOM_CUDA_CHECK_LAUNCH("concat_kernel");
  return {};
}

}  // namespace loom::cuda
