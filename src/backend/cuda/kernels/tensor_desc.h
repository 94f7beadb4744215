// A tensor as kernels see it: base address, shape and byte strides, passed by value to kernels.
// Plain data shared by device code (common.cuh) and host launch code (launch.h).
#pragma once

#include <cstdint>

namespace loom::cuda {

struct TensorDesc {
  char* data;
  int64_t ne[4];  ///< elements per dimension (ne[0] innermost)
  int64_t nb[4];  ///< byte stride per dimension (per block along dim 0 for quantized types)
};

}  // namespace loom::cuda
