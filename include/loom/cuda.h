// CUDA backend entry points beyond the registry. The backend lives in libloom_cuda.so, which the
// registry loads at run time (create_backend("cuda")); programs that call these functions link
// the loom_backend_cuda target directly.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "loom/backend.h"

#if defined(LOOM_CUDA_BUILDING)
#define LOOM_CUDA_API __attribute__((visibility("default")))
#else
#define LOOM_CUDA_API
#endif

namespace loom {

/// Facts about one CUDA device.
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;  ///< "NVIDIA H200"
  int cc_major = 0;  ///< compute capability (9.0 for Hopper)
  int cc_minor = 0;
  int sm_count = 0;        ///< streaming multiprocessors
  size_t total_bytes = 0;  ///< device memory
  size_t free_bytes = 0;   ///< free device memory when asked
};

/// Number of usable CUDA devices; a device_error status when there is no driver or no GPU.
LOOM_CUDA_API Result<int> cuda_device_count();
/// Properties of device `ordinal`.
LOOM_CUDA_API Result<CudaDeviceInfo> cuda_device_info(int ordinal);
/// Device memory of device `ordinal` (256-byte aligned, cached on free): the memory the "cuda"
/// backend computes on.
LOOM_CUDA_API Result<BufferType*> cuda_buffer_type(int ordinal = 0);
/// Page-locked host memory (cudaHostAlloc): host-addressable, and copies between it and the
/// device run at full bus speed. Usable by the CPU backend.
LOOM_CUDA_API Result<BufferType*> cuda_host_buffer_type();
/// A buffer over `size` bytes of device memory at `ptr` that Loom did not allocate (cudaMalloc'd by
/// the caller, on any device); freeing the buffer leaves the memory to its owner.
LOOM_CUDA_API Result<std::unique_ptr<Buffer>> cuda_buffer_from_device_memory(void* ptr, size_t size);
/// A "cuda" backend on device options.device, without the registry (what create_backend("cuda")
/// makes). Its graph executor is its extension<exec::ExecutorControl>() (loom/exec.h).
LOOM_CUDA_API Result<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options = {});

}  // namespace loom
