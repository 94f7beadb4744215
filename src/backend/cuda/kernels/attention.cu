// flash_attn: one block per (query, head); its kSplit warps take every kSplit-th key, each with an
// online softmax (running maximum m, running sum l, output accumulator rescaled by exp(m_old -
// m_new)), and the block merges the warps' partial results through shared memory at the end. So a
// decode step (one query, few heads) still spreads over n_head * kSplit warps. Keys the mask hides
// are skipped before their dot product. Each lane holds head elements lane, lane+32, ... of q and
// of the accumulator. A head's sink logit (src[4], optional) joins the merged denominator.
// Bytes model: K and V are read once per query head, (n_q * n_head) * n_kv * (d + dv) * size.
#include <algorithm>

#include "attention.cuh"
#include "common.cuh"

namespace loom::cuda {

namespace {

// Warps per (query, head). A decode step is latency-bound (each key costs a dependent load, a warp
// reduction and an exp): 16 warps per head give ~16 keys each at a 256-cell KV extent.
constexpr int kSplit = 16;

__device__ __forceinline__ double load_kv(const char* row, int64_t i, bool f16) {
  return f16 ? f16_to_float(reinterpret_cast<const uint16_t*>(row)[i])
             : reinterpret_cast<const float*>(row)[i];
}

// Scores, weights, sums and the output accumulator are doubles, rounded to float once at the end,
// as in the CPU backend's flash_attn (ops_attention.cpp): both then round the same exact value, and
// the output is the same float whatever the warps' order of keys (docs/NUMERICS.md). On the H200
// FP64 runs at half the FP32 rate; the decode kernel is bound by dependent loads, not arithmetic.
// kPerLane: head elements per lane (head size up to 32 * kPerLane), a template parameter so the
// registers of q and the accumulator match the head: 64- and 128-wide heads need 2 and 4 per lane
// rather than kFlashAttnMaxHead's 16, which leaves room for more blocks per SM.
template <int kPerLane>
__global__ void __launch_bounds__(kSplit* kWarpSize)
    flash_attn_kernel(TensorDesc dst, TensorDesc q, TensorDesc k, TensorDesc v, TensorDesc mask,
                      bool has_mask, bool mask_f16, bool k_f16, bool v_f16, float scale, float softcap,
                      const float* sinks) {
  pdl_wait();
  constexpr int kHalf = kSplit / 2;  // the merge goes through shared memory half the warps at a time
  __shared__ double sh_m[kSplit], sh_l[kSplit], sh_factor[kSplit];
  __shared__ double sh_acc[kHalf][kPerLane * kWarpSize];
  __shared__ double sh_total;
  const int lane = threadIdx.x % kWarpSize;
  const int split = static_cast<int>(threadIdx.x / kWarpSize);
  const int64_t w = blockIdx.x;  // one block per (query, head); the grid has exactly that many
  const int64_t n_q = q.ne[1], n_head = q.ne[2];
  const int64_t iq = w % n_q, h = (w / n_q) % n_head, i3 = w / (n_q * n_head);
  const int64_t h_kv = h / (n_head / k.ne[2]);  // consecutive query heads share a key head
  const int64_t d = q.ne[0], dv = v.ne[0], n_kv = k.ne[1];

  float q_reg[kPerLane];
  double acc[kPerLane];
  const auto* q_row = reinterpret_cast<const float*>(row_ptr(q, iq, h, i3));
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t e = lane + c * kWarpSize;
    q_reg[c] = e < d ? q_row[e] : 0.0f;
    acc[c] = 0.0;
  }
  const char* m_row = has_mask ? row_ptr(mask, iq, h % mask.ne[2], i3 % mask.ne[3]) : nullptr;

  double m = -INFINITY, l = 0.0;
  for (int64_t j = split; j < n_kv; j += kSplit) {
    float mv = 0.0f;
    if (m_row) {
      mv = mask_f16 ? f16_to_float(reinterpret_cast<const uint16_t*>(m_row)[j])
                    : reinterpret_cast<const float*>(m_row)[j];
      if (mv == -INFINITY) continue;  // hidden whatever the score (finite, inf or NaN plus -inf never passes)
    }
    const char* k_row = row_ptr(k, j, h_kv, i3);
    double s = 0.0;  // products of a float and an f16 or float are exact in double
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t e = lane + c * kWarpSize;
      if (e < d) s += static_cast<double>(q_reg[c]) * load_kv(k_row, e, k_f16);
    }
    s = warp_sum(s) * scale;
    if (softcap > 0.0f) s = softcap * tanh(s / softcap);
    s += mv;
    // masked key (or a NaN score, as on the CPU): weight exactly 0; s is the same in every lane
    if (!(s > -INFINITY)) continue;
    const double m_new = fmax(m, s);
    // 0 while m is still -inf; 1 when the maximum stands (most keys after the first few): no exp
    const double alpha = m_new == m ? 1.0 : exp(m - m_new);
    const double p = exp(s - m_new);
    l = l * alpha + p;
    const char* v_row = row_ptr(v, j, h_kv, i3);
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t e = lane + c * kWarpSize;
      if (e < dv) acc[c] = acc[c] * alpha + p * load_kv(v_row, e, v_f16);
    }
    m = m_new;
  }

  // merge the warps: M = max m_s, L = sum l_s exp(m_s - M), out = sum acc_s exp(m_s - M) / L
  if (lane == 0) {
    sh_m[split] = m;
    sh_l[split] = l;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double big = -INFINITY;
    for (int s2 = 0; s2 < kSplit; ++s2) big = fmax(big, sh_m[s2]);
    double total = 0.0;
    for (int s2 = 0; s2 < kSplit; ++s2) {
      // a warp that saw no visible key adds nothing
      sh_factor[s2] = sh_m[s2] == -INFINITY ? 0.0 : exp(sh_m[s2] - big);
      total += sh_l[s2] * sh_factor[s2];
    }
    // the head's sink joins the denominator as a key without a value (none when no key is visible)
    if (sinks && big != -INFINITY) total += exp(static_cast<double>(sinks[h]) - big);
    sh_total = total;
  }
  // each thread owns at most one output element (the block has kSplit * 32 >= kFlashAttnMaxHead)
  static_assert(kSplit * kWarpSize >= kPerLane * kWarpSize, "one output element per thread");
  const int64_t e_out = threadIdx.x;
  double out_sum = 0.0;
  for (int half = 0; half < 2; ++half) {
    if (split / kHalf == half) {
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) sh_acc[split % kHalf][lane + c * kWarpSize] = acc[c];
    }
    __syncthreads();
    if (e_out < dv) {
#pragma unroll
      for (int s2 = 0; s2 < kHalf; ++s2) out_sum += sh_acc[s2][e_out] * sh_factor[half * kHalf + s2];
    }
    __syncthreads();
  }
  // output [dv, n_head, n_q]: a query's heads are adjacent rows; no visible key gives zeros, as
  // soft_max does
  auto* out = reinterpret_cast<float*>(row_ptr(dst, h, iq, i3));
  if (e_out < dv) out[e_out] = sh_total > 0.0 ? static_cast<float>(out_sum / sh_total) : 0.0f;
}

}  // namespace

CudaError launch_flash_attn(const LaunchContext& ctx, const Tensor* dst, float scale, float softcap) {
  const Tensor* q = dst->src[0];
  const Tensor* k = dst->src[1];
  const Tensor* v = dst->src[2];
  const Tensor* mask = dst->src[3];
  const Tensor* sinks = dst->src[4];
  const int64_t rows = q->ne[1] * q->ne[2] * q->ne[3];  // (query, head) pairs: one block each
  if (rows == 0) return {};
  if (rows > INT32_MAX)
    return CudaError::runtime(cudaErrorInvalidConfiguration, "flash_attn: more than 2^31 query rows", __FILE__,
                              __LINE__);
  const TensorDesc mask_desc = mask ? desc_of(mask) : TensorDesc{};
  const int64_t head = std::max(q->ne[0], v->ne[0]);  // supports_op keeps it <= kFlashAttnMaxHead
  auto kernel = head <= 2 * kWarpSize   ? flash_attn_kernel<2>
                : head <= 4 * kWarpSize ? flash_attn_kernel<4>
                : head <= 8 * kWarpSize ? flash_attn_kernel<8>
                                        : flash_attn_kernel<kFlashAttnMaxHead / kWarpSize>;
  kernel<<<static_cast<unsigned>(rows), kSplit * kWarpSize, 0, ctx.stream>>>(
      desc_of(dst), desc_of(q), desc_of(k), desc_of(v), mask_desc, mask != nullptr,
      mask && mask->type == DType::f16, k->type == DType::f16, v->type == DType::f16, scale, softcap,
      sinks ? static_cast<const float*>(sinks->data) : nullptr);
  LOOM_CUDA_CHECK_LAUNCH("flash_attn_kernel");
  return {};
}

}  // namespace loom::cuda
