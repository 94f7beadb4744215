// Matrix products: mul_mat (cuBLAS for float weights with many columns, a mat-vec kernel
// otherwise; quantized weights multiply activations quantized as the CPU backend quantizes them)
// and the expert-routed mul_mat_id. Kernels in matmul.cu.
#pragma once

#include "backend/cuda/kernels/launch.h"

namespace loom::cuda {

/// Device scratch mul_mat needs for this node (activations converted for cuBLAS, or quantized).
size_t mul_mat_scratch_bytes(const Tensor* dst);
/// Device scratch mul_mat_id needs for this node (quantized activations).
size_t mul_mat_id_scratch_bytes(const Tensor* dst);
CudaError launch_mul_mat(const LaunchContext& ctx, const Tensor* dst);
/// Whether launch_mul_mat calls cuBLAS for this node (the executor orders cuBLAS calls, which share
/// the device's cuBLAS workspace).
bool mul_mat_uses_cublas(const Tensor* dst);
/// Expert ids out of range give NaN columns.
CudaError launch_mul_mat_id(const LaunchContext& ctx, const Tensor* dst);

}  // namespace loom::cuda
