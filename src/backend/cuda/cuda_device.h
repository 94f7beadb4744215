// Per-device state of the CUDA backend: stream, cuBLAS handle and workspace, memory cache, and the
// device buffer type.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>

#include "kernels/launch.h"
#include "loom/backend.h"
#include "loom/cuda.h"

namespace loom::cuda {

/// Memory blocks are rounded to this; cudaMalloc itself returns at least 256-byte alignment.
inline constexpr size_t kDeviceAlignment = 256;

class DeviceBufferType;

/// One device's resources, shared by every backend and buffer on that device. Created on first
/// use and never destroyed: buffers may outlive backends, and the CUDA runtime can be unloaded
/// before static destructors run, so tearing down at exit would only race it.
class DeviceContext {
 public:
  /// The context of device `ordinal`; a device_error when CUDA has no usable device.
  static Result<DeviceContext*> get(int ordinal);

  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int ordinal() const { return info_.ordinal; }
  const CudaDeviceInfo& info() const { return info_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  /// The cuBLAS workspace (set on the handle, so cuBLAS never allocates inside a graph capture);
  /// every cuBLAS call writes it, so the executor orders them.
  void* cublas_workspace() const { return cublas_workspace_; }
  size_t cublas_workspace_size() const { return kCublasWorkspaceBytes; }
  BufferType& buffer_type();
  /// Held while work runs on the stream (compute, buffer copies), so that callers on several
  /// threads take turns on one device.
  std::mutex& stream_mutex() { return stream_mutex_; }
  /// Makes this device current on the calling thread.
  Status make_current() const;

  /// A block of at least `size` bytes from the cache or cudaMalloc; `*capacity` receives its
  /// real size, to be passed back to release().
  Result<void*> allocate(size_t size, size_t* capacity);
  /// Returns a block to the cache (no device work may still use it).
  void release(void* ptr, size_t capacity);

 private:
  DeviceContext() = default;
  Status init(int ordinal);
  void destroy();
  // Frees every cached block; the pool mutex is held.
  void trim_cache_locked();

  CudaDeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<DeviceBufferType> buffer_type_;
  std::mutex stream_mutex_;
  std::mutex pool_mutex_;
  std::multimap<size_t, void*> cache_;  // free blocks by capacity
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  void* cublas_workspace_ = nullptr;
};

/// A buffer over `size` bytes of device memory that Loom did not allocate
/// (loom_backend_cuda_buffer_from_ptr); freeing the buffer leaves the memory to its owner.
std::unique_ptr<Buffer> borrow_device_memory(DeviceContext& dev, void* ptr, size_t size);

/// Number of devices, or a device_error naming CUDA's reason (no driver, no GPU).
Result<int> device_count();

}  // namespace loom::cuda
