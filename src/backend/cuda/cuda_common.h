// Host-side helpers of the CUDA backend: CudaError -> Status, checks that return a Status.
#pragma once

#include <memory>
#include <string>

#include "cuda_error.h"
#include "loom/backend.h"
#include "loom/graph.h"
#include "loom/status.h"
#include "loom/tensor.h"

namespace loom::cuda {

/// "cuda: cudaMemcpyAsync(...) failed at src/backend/cuda/cuda_device.cpp:88: cudaErrorInvalidValue:
/// invalid argument (<context>)". Out of memory maps to StatusCode::out_of_memory.
Status to_status(const CudaError& e, const std::string& context = {});

}  // namespace loom::cuda

/// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define LOOM_CUDA_STATUS(expr)                                                          \
  do {                                                                                  \
    const cudaError_t loom_cuda_err_ = (expr);                                          \
    if (loom_cuda_err_ != cudaSuccess)                                                  \
      return ::loom::cuda::to_status(                                                   \
          ::loom::cuda::CudaError::runtime(loom_cuda_err_, #expr, __FILE__, __LINE__)); \
  } while (0)

/// Returns a Status when a cuBLAS call fails.
#define LOOM_CUBLAS_STATUS(expr)                                                        \
  do {                                                                                  \
    const cublasStatus_t loom_cublas_st_ = (expr);                                      \
    if (loom_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      return ::loom::cuda::to_status(                                                   \
          ::loom::cuda::CudaError::cublas(loom_cublas_st_, #expr, __FILE__, __LINE__)); \
  } while (0)
