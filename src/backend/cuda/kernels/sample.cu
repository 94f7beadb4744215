// sample_tokens: the host sampler's chain (src/sample/sample_ops.cpp, and its CPU port
// src/backend/cpu/ops_sample.cpp) over each row's top-k candidates. The row is checked for NaN/+inf
// (n_vocab floats, the only part that grows with the vocabulary) by a block per 4096 floats
// (sample_scan_kernel; one block scanning a 128256-float row took 34 us on an H100 even with 1024
// threads and 16-byte loads), then one block per row:
// then thread 0 walks the candidates in the host's order, because the host's float/double sums
// are sequential and the token must be the one the host would pick. The walk is O(top_k) (40 by
// default) per row; not measured.
//
// Where the result can differ from the host: exp. The host calls glibc's expf (< 1 ulp, not
// always correctly rounded), CUDA's expf is within 2 ulp; here each exp is computed in double and
// rounded once to float, which is the correctly rounded value except in ~2^-28 of cases. A weight
// 1 ulp apart moves a cumulative boundary by ~1e-7 relative, so a token differs only when the
// uniform falls that close to a boundary. Greedy rows (argmax) and every comparison, division and
// sum are exact (IEEE, no contraction: __fadd_rn/__dmul_rn keep nvcc from fusing).
#include "common.cuh"
#include "loom/graph.h"
#include "sample.cuh"

namespace loom::cuda {

namespace {

constexpr int kSampleThreads = 1024;

__device__ __forceinline__ float exp_f(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// The chain over one row's first k candidates: cand(i) is candidate i's token, logit(i) its logit,
// p_top(i) = exp_f(logit(i) - logit(0)) (top-p's weights) and p_temp(i) = exp_f(logit(i) / t - logit(0) / t)
// (the draw's), each computed the same way whether read from shared memory or formed here; the sums
// run in the host's order.
template <class Cand, class Logit, class PTop, class PTemp>
__device__ int32_t sample_row(int64_t k, const int32_t* w, Cand cand, Logit logit, PTop p_top, PTemp p_temp) {
  int64_t n = 0;
  while (n < k && logit(n) > -INFINITY) ++n;
  if (n == 0) return -1;
  const float temperature = __int_as_float(w[kSampleTemperature]);
  if (temperature <= 0.0f) return cand(0);
  const int64_t min_keep = max(w[kSampleMinKeep], 1);
  const float top_p = __int_as_float(w[kSampleTopP]);
  if (top_p < 1.0f) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum = __dadd_rn(sum, p_top(i));
    const double inv = __drcp_rn(sum);
    int64_t cut = n;
    double cum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      cum = __dadd_rn(cum, static_cast<float>(__dmul_rn(p_top(i), inv)));
      if (cum >= top_p) {
        cut = i + 1;
        break;
      }
    }
    n = max(cut, min(min_keep, n));
  }
  if (__int_as_float(w[kSampleMinP]) > 0.0f) {
    const float threshold = __fadd_rn(logit(0), __int_as_float(w[kSampleLogMinP]));
    int64_t cut = 0;
    while (cut < n && logit(cut) >= threshold) ++cut;
    n = max(cut, min(min_keep, n));
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum = __dadd_rn(sum, p_temp(i));
  const double u = __hiloint2double(w[kSampleUniformHi], w[kSampleUniformLo]);
  const double target = __dmul_rn(u, sum);
  double cum = 0.0;
  int32_t last_possible = cand(0);
  for (int64_t i = 0; i < n; ++i) {
    const float p = p_temp(i);
    if (p <= 0.0f) continue;
    cum = __dadd_rn(cum, p);
    last_possible = cand(i);
    if (target < cum) return cand(i);
  }
  return last_possible;
}

__device__ __forceinline__ float p_top_of(float l, float l0) { return exp_f(__fsub_rn(l, l0)); }
__device__ __forceinline__ float p_temp_of(float l, float l0, float t) {
  return exp_f(__fsub_rn(__fdiv_rn(l, t), __fdiv_rn(l0, t)));
}

constexpr int kStaged = 2048;  ///< candidates whose logits and weights are formed in parallel first

// Step 1 (rows of kScanMin floats and more, with the scratch): block (c, r) checks chunk c
// (kScanChunk floats) of row r for NaN/+inf and writes one flag byte; step 2 reads a row's flags.
constexpr int kScanThreads = 256;
constexpr int64_t kScanChunk = 4096;  // 16-byte loads, 4 per thread, all in flight before any test
constexpr int64_t kScanMin = 2 * kScanChunk;

__device__ __forceinline__ int nonfinite_in(const char* row, int64_t stride, int64_t begin, int64_t end,
                                            int tid, int threads) {
  int bad = 0;
  if (stride == sizeof(float) && (reinterpret_cast<uintptr_t>(row) + begin * 4) % 16 == 0) {
    constexpr int kBatch = 4;
    const auto* v4 = reinterpret_cast<const float4*>(row + begin * 4);
    const int64_t n4 = (end - begin) / 4;
    for (int64_t base = 0; base < n4; base += kBatch * threads) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = base + j * threads + tid;
        v[j] = i < n4 ? v4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        bad |= !(v[j].x < INFINITY) | !(v[j].y < INFINITY) | !(v[j].z < INFINITY) | !(v[j].w < INFINITY);
    }
    begin += 4 * n4;
  }
  for (int64_t i = begin + tid; i < end; i += threads)
    bad |= !(*reinterpret_cast<const float*>(row + i * stride) < INFINITY);
  return bad;
}

__global__ void __launch_bounds__(kScanThreads) sample_scan_kernel(TensorDesc logits, uint8_t* flags, int n_chunks) {
  pdl_wait();
  __shared__ int bad;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  const int64_t r = blockIdx.y, begin = blockIdx.x * kScanChunk;
  const int64_t end = begin + kScanChunk < logits.ne[0] ? begin + kScanChunk : logits.ne[0];
  if (nonfinite_in(logits.data + r * logits.nb[1], logits.nb[0], begin, end, threadIdx.x, blockDim.x))
    atomicOr(&bad, 1);
  __syncthreads();
  if (threadIdx.x == 0) flags[r * n_chunks + blockIdx.x] = static_cast<uint8_t>(bad);
}

// flags: step 1's n_chunks bytes per row, or null: the block scans the row itself.
__global__ void sample_tokens_kernel(TensorDesc dst, TensorDesc logits, TensorDesc cand, TensorDesc params,
                                     const uint8_t* flags, int n_chunks) {
  pdl_wait();
  __shared__ int bad;
  __shared__ float s_logit[kStaged], s_top[kStaged], s_temp[kStaged];
  for (int64_t r = blockIdx.x; r < dst.ne[0]; r += gridDim.x) {
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const char* row = logits.data + r * logits.nb[1];
    const int mine = flags ? (static_cast<int>(threadIdx.x) < n_chunks && flags[r * n_chunks + threadIdx.x])
                           : nonfinite_in(row, logits.nb[0], 0, logits.ne[0], threadIdx.x, blockDim.x);
    if (mine) atomicOr(&bad, 1);
    __syncthreads();
    const auto* c = reinterpret_cast<const int32_t*>(cand.data + r * cand.nb[1]);
    const auto* w = reinterpret_cast<const int32_t*>(params.data + r * params.nb[1]);
    const int64_t k = min(static_cast<int64_t>(max(w[kSampleTopK], 1)), cand.ne[0]);
    const int64_t n_vocab = logits.ne[0], stride = logits.nb[0];
    auto global_logit = [&](int64_t i) { return *reinterpret_cast<const float*>(row + c[i] * stride); };
    // the candidates' logits and both weights by every thread (thread 0 alone walked them through
    // dependent global loads and a double exp each: 32 us per row at k = 40 on an H100)
    const bool staged = k <= kStaged;
    const float temperature = __int_as_float(w[kSampleTemperature]);
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
      if (c[i] < 0 || c[i] >= n_vocab) atomicOr(&bad, 1);
    __syncthreads();
    if (staged && !bad) {
      for (int64_t i = threadIdx.x; i < k; i += blockDim.x) s_logit[i] = global_logit(i);
      __syncthreads();
      if (temperature > 0.0f)
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
          s_top[i] = p_top_of(s_logit[i], s_logit[0]);
          s_temp[i] = p_temp_of(s_logit[i], s_logit[0], temperature);
        }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      auto cand_at = [&](int64_t i) { return c[i]; };
      int32_t token = -1;
      if (bad)
        token = -1;
      else if (staged)
        token = sample_row(
            k, w, cand_at, [&](int64_t i) { return s_logit[i]; }, [&](int64_t i) { return s_top[i]; },
            [&](int64_t i) { return s_temp[i]; });
      else
        token = sample_row(
            k, w, cand_at, global_logit, [&](int64_t i) { return p_top_of(global_logit(i), global_logit(0)); },
            [&](int64_t i) { return p_temp_of(global_logit(i), global_logit(0), temperature); });
      reinterpret_cast<int32_t*>(dst.data)[r] = token;
    }
    __syncthreads();
  }
}

int scan_chunks(const Tensor* dst) {
  const int64_t n = dst->src[0]->ne[0];
  return n >= kScanMin && dst->ne[0] <= 65535 ? static_cast<int>((n + kScanChunk - 1) / kScanChunk) : 0;
}

}  // namespace

size_t sample_tokens_scratch_bytes(const Tensor* dst) {
  return static_cast<size_t>(scan_chunks(dst)) * static_cast<size_t>(dst->ne[0]);
}

CudaError launch_sample_tokens(const LaunchContext& ctx, const Tensor* dst) {
  const int64_t rows = dst->ne[0];
  if (rows == 0) return {};
  const int chunks = scan_chunks(dst);
  uint8_t* flags = nullptr;
  if (chunks > 0 && chunks <= kSampleThreads && ctx.scratch && ctx.scratch_size >= sample_tokens_scratch_bytes(dst)) {
    flags = static_cast<uint8_t*>(ctx.scratch);
    sample_scan_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), kScanThreads, 0,
                         ctx.stream>>>(desc_of(dst->src[0]), flags, chunks);
    LOOM_CUDA_CHECK_LAUNCH("sample_scan_kernel");
  }
  sample_tokens_kernel<<<static_cast<unsigned>(rows < 65535 ? rows : 65535), kSampleThreads, 0, ctx.stream>>>(
      desc_of(dst), desc_of(dst->src[0]), desc_of(dst->src[1]), desc_of(dst->src[2]), flags, flags ? chunks : 0);
  LOOM_CUDA_CHECK_LAUNCH("sample_tokens_kernel");
  return {};
}

}  // namespace loom::cuda
