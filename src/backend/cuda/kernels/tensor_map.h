// The driver's tensor-map encoder (cuTensorMapEncodeTiled) for Hopper's tensor copies (TMA), fetched
// through the runtime once, so that the backend links no driver library: gemm_q's weight maps
// (gemm_q_device.cuh) and flash attention's K and V maps (attention_mma_kernel.cuh).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace loom::cuda {

/// The encoder, or null where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace loom::cuda
