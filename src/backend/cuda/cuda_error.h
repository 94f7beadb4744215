// Failures of CUDA and cuBLAS calls as plain values. Kernel launchers (.cu files, compiled by nvcc)
// cannot build a loom::Status, whose fmt-based formatting nvcc does not compile, so they return a
// CudaError and the host side turns it into a Status (cuda_common.h: to_status).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace loom::cuda {

/// Where and how a CUDA call failed; `ok()` when nothing failed.
struct CudaError {
  enum class Source : unsigned char { none, runtime, cublas };
  Source source = Source::none;
  int code = 0;                ///< cudaError_t or cublasStatus_t
  const char* call = nullptr;  ///< the failing expression or "launch of <kernel>"
  const char* file = nullptr;
  int line = 0;

  bool ok() const { return source == Source::none; }
  static CudaError runtime(cudaError_t e, const char* call, const char* file, int line) {
    return {Source::runtime, static_cast<int>(e), call, file, line};
  }
  static CudaError cublas(cublasStatus_t s, const char* call, const char* file, int line) {
    return {Source::cublas, static_cast<int>(s), call, file, line};
  }
};

}  // namespace loom::cuda

/// Returns a CudaError from the enclosing function when a CUDA runtime call fails.
#define LOOM_CUDA_CHECK(expr)                                                             \
  do {                                                                                    \
    const cudaError_t loom_cuda_err_ = (expr);                                            \
    if (loom_cuda_err_ != cudaSuccess)                                                    \
      return ::loom::cuda::CudaError::runtime(loom_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

/// Returns a CudaError when a cuBLAS call fails.
#define LOOM_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                    \
    const cublasStatus_t loom_cublas_st_ = (expr);                                        \
    if (loom_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      return ::loom::cuda::CudaError::cublas(loom_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

/// Checks the launch just made (bad configuration, missing kernel image) by cudaGetLastError.
#define LOOM_CUDA_CHECK_LAUNCH(kernel_name)                                                                  \
  do {                                                                                                       \
    const cudaError_t loom_cuda_err_ = cudaGetLastError();                                                   \
    if (loom_cuda_err_ != cudaSuccess)                                                                       \
      return ::loom::cuda::CudaError::runtime(loom_cuda_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

/// Propagates a CudaError returned by a helper.
#define LOOM_CUDA_TRY(expr)                              \
  do {                                                   \
    const ::loom::cuda::CudaError loom_cuda_e_ = (expr); \
    if (!loom_cuda_e_.ok()) return loom_cuda_e_;         \
  } while (0)
