// The driver's tensor-map encoder (cuTensorMapEncodeTiled) for Hopper's tensor copies (TMA), fetched
// through the runtime once, so that the backend links no driver library: gemm_q's weight maps
// (gemm_q_device.cuh) and flash attention's K and V maps (encode_rows_map: attention_mma_kernel.cuh,
// attention_decode.cu).
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

/// A map of the f16 rows of a K or V tensor, dimensions {piece, rows, d / piece, ne[2], ne[3]} (piece:
/// swizzle / 2 halves; rows = ne[1], nb the tensor's byte strides), so that a box {piece, box_rows, d /
/// piece, 1, 1} lands piece after piece, box_rows rows of `swizzle` bytes each, in the swizzle of that
/// width (32, 64 or 128 bytes; the destination aligned to 8 x swizzle bytes). Rows past ne[1] come as
/// zeros. False where the driver has no encoder or refuses the map (alignment, strides).
inline bool encode_rows_map(CUtensorMap& map, void* data, const int64_t* ne, const size_t* nb, int d, int box_rows,
                            int swizzle) {
  const auto encode = tensor_map_encoder();
  if (!encode) return false;
  const int piece = swizzle / 2;  // halves
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(piece), static_cast<cuuint64_t>(ne[1]),
                              static_cast<cuuint64_t>(d / piece), static_cast<cuuint64_t>(ne[2]),
                              static_cast<cuuint64_t>(ne[3])};
  const cuuint64_t strides[4] = {static_cast<cuuint64_t>(nb[1]), static_cast<cuuint64_t>(piece * 2),
                                 static_cast<cuuint64_t>(nb[2]), static_cast<cuuint64_t>(nb[3])};
  const cuuint32_t box[5] = {static_cast<cuuint32_t>(piece), static_cast<cuuint32_t>(box_rows),
                             static_cast<cuuint32_t>(d / piece), 1, 1};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 5, data, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                : CU_TENSOR_MAP_SWIZZLE_32B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace loom::cuda
