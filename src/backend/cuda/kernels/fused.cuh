// Fused kernels: one launch for a group of graph nodes the executor's fusion pass matched
// (include/loom/exec_plan.h lists each kind's node roles). Each must equal the unfused composition within
// the ops' NMSE thresholds. Kernels in fused.cu.
#pragma once

#include "launch.h"
#include "rope.cuh"
#include "loom/exec.h"

namespace loom::cuda {

/// mul = rms_norm(norm->src[0]) * mul->src[1]  (weight broadcast over rows like the binary kernel).
CudaError launch_rms_norm_mul(const LaunchContext& ctx, const Tensor* norm, const Tensor* mul);
/// Whether a fused rms_norm_mul / add_rms_norm_mul dispatch (its nodes) runs the fast kernel with its
/// output written as the fast mat-vec's quantized activations of `block` (ctx.act_out_block), or as
/// gemm_q's activation tiles (block kActGemmQTiles).
bool norm_act_out_supported(FusedKind kind, const Tensor* const* nodes, int block);
/// add = add->src[0] + add->src[1] (written: it is the residual); mul = rms_norm(add) * mul->src[1].
/// all_reduce -> add -> rms_norm -> mul: the ranks' partials exchanged and summed in the norm's kernel
/// (LL protocol, allreduce.cuh); fused_supported checks the operands.
CudaError launch_all_reduce_add_rms_norm_mul(const LaunchContext& ctx, const Tensor* ar, const Tensor* add,
                                             const Tensor* norm, const Tensor* mul);
CudaError launch_add_rms_norm_mul(const LaunchContext& ctx, const Tensor* add, const Tensor* norm,
                                  const Tensor* mul);
/// add = mul_mat(mm->src[0], mm->src[1]) + add->src[1]; any weight type mul_mat takes, n columns
/// small enough for the mat-vec path (supports_fused checks).
CudaError launch_mat_vec_bias(const LaunchContext& ctx, const Tensor* mm, const Tensor* add);
/// glu = swiglu/geglu(mm_gate, mm_up): both projections of one activation row in one kernel.
CudaError launch_glu_mat_vec(const LaunchContext& ctx, const Tensor* mm_gate, const Tensor* mm_up,
                             const Tensor* glu);
/// Rotates rope_k's input and stores it through set_rows into the cache; rope_q (may be null) is
/// rotated in the same launch. Both ropes share `args` (same params, same positions tensor).
CudaError launch_rope_set_rows(const LaunchContext& ctx, const Tensor* rope_k, const Tensor* set_rows,
                               const Tensor* rope_q, const Tensor* set_rows_v, const RopeArgs& args);
/// soft_max = softmax(scale(x) + mask) with scale/bias from the scale node and mask = add->src[1].
CudaError launch_scale_mask_soft_max(const LaunchContext& ctx, const Tensor* scale, const Tensor* add,
                                     const Tensor* soft_max);
/// MoE routing per token: probabilities (softmax of the router logits), the top-k expert ids
/// (top_k's output) and their weights (get_rows' output, or div's: normalised by their sum).
CudaError launch_moe_route(const LaunchContext& ctx, const Tensor* soft_max, const Tensor* top_k,
                           const Tensor* get_rows, const Tensor* sum_rows, const Tensor* div);

/// mm0, mm1 (and mm2 when not null) = mul_mat(mmK->src[0], x) for one activation x = mm0->src[1]:
/// the activations quantized once (quantized weights), all products in one kernel launch.
/// Two launches for quantized weights (activation quantization + products), one for float weights.
CudaError launch_mat_vec_multi(const LaunchContext& ctx, const Tensor* mm0, const Tensor* mm1,
                               const Tensor* mm2);

/// flash_attn = flash_attn(q, reshape(get_k), reshape(get_v), mask) with K/V read from the rows of
/// the gathers' sources (the f16 cache stores) their i32 indices pick: the fast decode kernel
/// (attention_decode.cu) with the row indirection; the gathers' outputs are never written.
CudaError launch_gather_flash_attn(const LaunchContext& ctx, const Tensor* get_k, const Tensor* get_v,
                                   const Tensor* flash_attn);
/// flash_attn over the K/V stores of one token's rope_set_rows (set_rows_k of permute(rope_k),
/// set_rows_v), its Q rope_q: the fast decode kernel rotates Q and the new key and stores the new K/V
/// row itself (attention_decode.cu, FlashAttnRope); rope_q and rope_k are never written.
CudaError launch_rope_flash_attn(const LaunchContext& ctx, const Tensor* rope_k, const Tensor* set_rows_k,
                                 const Tensor* rope_q, const Tensor* set_rows_v, const Tensor* flash_attn,
                                 const RopeArgs& args);

/// What a fused dispatch's kernels depend on beyond its operands: the numerics mode (some kinds are
/// fast-mode kernels only) and the device (sm90a: compute capability 9.0, LaunchContext::sm90a).
struct FusedTarget {
  bool fast = false;
  bool sm90a = false;
};

/// Whether the fused dispatch calls cuBLAS (the executor orders those: they share its workspace).
bool fused_uses_cublas(FusedKind kind, const Tensor* const* nodes, FusedTarget t);
/// Device scratch a fused dispatch needs (quantized activations of glu_mat_vec / mat_vec_bias /
/// mat_vec_multi, or in the fast mode past the mat-vecs' columns their gemm_q or cuBLAS form's packed
/// activations and partial sums or stacked products; the key splits of gather_flash_attn).
size_t fused_scratch_bytes(FusedKind kind, const Tensor* const* nodes, FusedTarget t);
/// Whether the fused kernels handle these nodes' types and shapes on target t.
bool fused_supported(FusedKind kind, const Tensor* const* nodes, FusedTarget t);
/// Whether a fused dispatch (glu_mat_vec, mat_vec_multi) runs its products as gemm_q on the warpgroup
/// kernel's packed activation tiles on target t (which a producer may hand it: kActGemmQTiles).
bool fused_takes_gemm_q_tiles(FusedKind kind, const Tensor* const* nodes, FusedTarget t);
/// Whether a fused dispatch (glu_mat_vec, mat_vec_multi) runs its products through cuBLAS on f16
/// activations packed from a contiguous 2-D operand (which a producer may hand it: kActF16).
bool fused_takes_f16_b(FusedKind kind, const Tensor* const* nodes, FusedTarget t);
/// Whether a glu_mat_vec dispatch on target t can write its gated activation as contiguous f16 rows
/// (kActF16) for the product after it: its cuBLAS form over stacked gate and up weights, whose gated
/// kernel reads the GEMM's result from the scratch, with a contiguous, aligned output.
bool glu_writes_f16(const Tensor* const* nodes, FusedTarget t);

}  // namespace loom::cuda
