// Devices, memory and buffer types of the CUDA backend.
#include "cuda_device.h"

#include <cstring>
#include <string>

#include "cuda_common.h"

namespace loom::cuda {

// ---- errors -----------------------------------------------------------------------------------------

namespace {
// "src/backend/cuda/x.cu" rather than the build machine's absolute path.
const char* short_path(const char* file) {
  if (!file) return "?";
  const char* p = std::strstr(file, "src/backend/cuda/");
  return p ? p : file;
}
}  // namespace

Status to_status(const CudaError& e, const std::string& context) {
  StatusCode code = StatusCode::device_error;
  std::string what;
  if (e.source == CudaError::Source::cublas) {
    const auto st = static_cast<cublasStatus_t>(e.code);
    what = fmt::format("{}: {}", cublasGetStatusName(st), cublasGetStatusString(st));
    if (st == CUBLAS_STATUS_ALLOC_FAILED) code = StatusCode::out_of_memory;
  } else {
    const auto err = static_cast<cudaError_t>(e.code);
    what = fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
    if (err == cudaErrorMemoryAllocation) code = StatusCode::out_of_memory;
    // A failed runtime call is also kept as the thread's last error; clear it, or the next launch
    // check would report it as its own.
    (void)cudaGetLastError();
  }
  return make_error(code, "cuda: {} failed at {}:{}: {}{}", e.call ? e.call : "?", short_path(e.file), e.line,
                    what, context.empty() ? std::string() : " (" + context + ")");
}

Result<int> device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(StatusCode::device_error, "cuda: no usable device: cudaGetDeviceCount failed: {}: {}",
                      cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (n <= 0)
    return make_error(StatusCode::device_error, "cuda: no usable device: the driver reports no CUDA device");
  return n;
}

// ---- device memory ------------------------------------------------------------------------------------

namespace {

bool range_ok(size_t offset, size_t n, size_t size) { return offset <= size && n <= size - offset; }

/// Memory on one device: a block from DeviceContext::allocate, which goes back to the device's
/// cache with the buffer, or borrowed memory (loom_backend_cuda_buffer_from_ptr), which stays
/// with its owner.
class DeviceBuffer final : public Buffer {
 public:
  /// The `capacity` of borrowed memory: nothing to give back (pool blocks are never empty).
  static constexpr size_t kBorrowed = 0;

  DeviceBuffer(DeviceContext& dev, void* ptr, size_t size, size_t capacity)
      : dev_(dev), ptr_(ptr), size_(size), capacity_(capacity) {}
  ~DeviceBuffer() override {
    if (capacity_ != kBorrowed) dev_.release(ptr_, capacity_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* base() override { return ptr_; }
  size_t size() const override { return size_; }
  BufferType& type() const override { return dev_.buffer_type(); }

  Status write(size_t offset, const void* src, size_t n) override {
    return on_stream("write", offset, n, [&](cudaStream_t stream) -> Status {
      LOOM_CUDA_STATUS(cudaMemcpyAsync(at(offset), src, n, cudaMemcpyHostToDevice, stream));
      return {};
    });
  }

  Status read(size_t offset, void* dst, size_t n) const override {
    return on_stream("read", offset, n, [&](cudaStream_t stream) -> Status {
      LOOM_CUDA_STATUS(cudaMemcpyAsync(dst, at(offset), n, cudaMemcpyDeviceToHost, stream));
      return {};
    });
  }

  Status read_rows(size_t offset, size_t src_pitch, void* dst, size_t dst_pitch, size_t width,
                   size_t height) const override {
    if (height == 0 || width == 0) return {};
    return on_stream("read_rows", offset, (height - 1) * src_pitch + width, [&](cudaStream_t stream) -> Status {
      LOOM_CUDA_STATUS(cudaMemcpy2DAsync(dst, dst_pitch, at(offset), src_pitch, width, height, cudaMemcpyDeviceToHost,
                                         stream));
      return {};
    });
  }

  Status fill(size_t offset, uint8_t value, size_t n) override {
    return on_stream("fill", offset, n, [&](cudaStream_t stream) -> Status {
      LOOM_CUDA_STATUS(cudaMemsetAsync(at(offset), value, n, stream));
      return {};
    });
  }

 private:
  char* at(size_t offset) const { return static_cast<char*>(ptr_) + offset; }

  // Checks [offset, offset + n), then runs `op` on the device's stream and waits for it, so the
  // host memory of a copy may be reused as soon as this returns.
  template <typename Op>
  Status on_stream(const char* what, size_t offset, size_t n, Op&& op) const {
    if (!range_ok(offset, n, size_))
      return make_error(StatusCode::invalid_argument, "cuda buffer {}: [{}, {}) exceeds its {} bytes", what,
                        offset, offset + n, size_);
    if (n == 0) return {};
    std::lock_guard lock(dev_.stream_mutex());
    LOOM_TRY(dev_.make_current());
    LOOM_TRY(op(dev_.stream()));
    LOOM_CUDA_STATUS(cudaStreamSynchronize(dev_.stream()));
    return {};
  }

  DeviceContext& dev_;
  void* ptr_;
  size_t size_;
  size_t capacity_;  // of the pool block, or kBorrowed
};

}  // namespace

class DeviceBufferType final : public BufferType {
 public:
  explicit DeviceBufferType(DeviceContext& dev) : dev_(dev), name_(fmt::format("cuda{}", dev.ordinal())) {}
  const char* name() const override { return name_.c_str(); }
  size_t alignment() const override { return kDeviceAlignment; }
  bool is_host() const override { return false; }
  Result<std::unique_ptr<Buffer>> allocate(size_t size) override {
    size_t capacity = 0;
    Result<void*> p = dev_.allocate(size, &capacity);
    if (!p.ok()) return p.status();
    return std::unique_ptr<Buffer>(new DeviceBuffer(dev_, *p, size, capacity));
  }

 private:
  DeviceContext& dev_;
  std::string name_;
};

// ---- pinned host memory --------------------------------------------------------------------------------

namespace {

class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(BufferType& type, void* ptr, size_t size) : type_(type), ptr_(ptr), size_(size) {}
  ~PinnedBuffer() override {
    // At process exit the runtime may already be unloaded; nothing useful to do with an error.
    if (cudaFreeHost(ptr_) != cudaSuccess) (void)cudaGetLastError();
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* base() override { return ptr_; }
  size_t size() const override { return size_; }
  BufferType& type() const override { return type_; }
  Status write(size_t offset, const void* src, size_t n) override {
    if (!range_ok(offset, n, size_))
      return make_error(StatusCode::invalid_argument, "cuda_host buffer write past its end");
    std::memcpy(static_cast<char*>(ptr_) + offset, src, n);
    return {};
  }
  Status read(size_t offset, void* dst, size_t n) const override {
    if (!range_ok(offset, n, size_))
      return make_error(StatusCode::invalid_argument, "cuda_host buffer read past its end");
    std::memcpy(dst, static_cast<const char*>(ptr_) + offset, n);
    return {};
  }
  Status fill(size_t offset, uint8_t value, size_t n) override {
    if (!range_ok(offset, n, size_))
      return make_error(StatusCode::invalid_argument, "cuda_host buffer fill past its end");
    std::memset(static_cast<char*>(ptr_) + offset, value, n);
    return {};
  }

 private:
  BufferType& type_;
  void* ptr_;
  size_t size_;
};

class PinnedBufferType final : public BufferType {
 public:
  const char* name() const override { return "cuda_host"; }
  size_t alignment() const override { return kDeviceAlignment; }  // cudaHostAlloc returns pages
  bool is_host() const override { return true; }
  Result<std::unique_ptr<Buffer>> allocate(size_t size) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, size > 0 ? size : 1, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return make_error(StatusCode::out_of_memory, "cuda: cannot allocate {} bytes of pinned host memory",
                        size);
    }
    if (err != cudaSuccess)
      return to_status(CudaError::runtime(err, "cudaHostAlloc", __FILE__, __LINE__),
                       fmt::format("{} bytes", size));
    return std::unique_ptr<Buffer>(new PinnedBuffer(*this, p, size));
  }
};

}  // namespace

// ---- device context ------------------------------------------------------------------------------------

Result<DeviceContext*> DeviceContext::get(int ordinal) {
  static std::mutex mutex;
  static std::map<int, DeviceContext*> contexts;  // never freed: see the class comment
  std::lock_guard lock(mutex);
  if (auto it = contexts.find(ordinal); it != contexts.end()) return it->second;
  Result<int> n = device_count();
  if (!n.ok()) return n.status();
  if (ordinal < 0 || ordinal >= *n)
    return make_error(StatusCode::invalid_argument, "cuda: device {} does not exist ({} device(s) found)",
                      ordinal, *n);
  std::unique_ptr<DeviceContext> ctx(new DeviceContext());
  Status s = ctx->init(ordinal);
  if (!s.ok()) {
    ctx->destroy();
    return s;
  }
  contexts[ordinal] = ctx.get();
  return ctx.release();
}

Status DeviceContext::init(int ordinal) {
  info_.ordinal = ordinal;
  LOOM_CUDA_STATUS(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  LOOM_CUDA_STATUS(cudaGetDeviceProperties(&prop, ordinal));
  info_.name = prop.name;
  info_.cc_major = prop.major;
  info_.cc_minor = prop.minor;
  info_.sm_count = prop.multiProcessorCount;
  info_.total_bytes = prop.totalGlobalMem;
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_STATUS(cudaMemGetInfo(&free_bytes, &total_bytes));
  info_.free_bytes = free_bytes;
  LOOM_CUDA_STATUS(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LOOM_CUBLAS_STATUS(cublasCreate(&cublas_));
  LOOM_CUBLAS_STATUS(cublasSetStream(cublas_, stream_));
  LOOM_CUDA_STATUS(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  LOOM_CUBLAS_STATUS(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
  buffer_type_ = std::make_unique<DeviceBufferType>(*this);
  return {};
}

// Releases what a failed init() created (a context that initialized is never destroyed).
void DeviceContext::destroy() {
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
  if (cublas_workspace_) cudaFree(cublas_workspace_);
  cublas_workspace_ = nullptr;
  cublas_ = nullptr;
  stream_ = nullptr;
  (void)cudaGetLastError();
}

BufferType& DeviceContext::buffer_type() { return *buffer_type_; }

std::unique_ptr<Buffer> borrow_device_memory(DeviceContext& dev, void* ptr, size_t size) {
  return std::make_unique<DeviceBuffer>(dev, ptr, size, DeviceBuffer::kBorrowed);
}

Status DeviceContext::make_current() const {
  LOOM_CUDA_STATUS(cudaSetDevice(info_.ordinal));
  return {};
}

Result<void*> DeviceContext::allocate(size_t size, size_t* capacity) {
  const size_t rounded =
      (std::max<size_t>(size, 1) + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  std::lock_guard lock(pool_mutex_);
  // Reuse a cached block of up to twice the request; a larger one would mostly go to waste.
  if (auto it = cache_.lower_bound(rounded); it != cache_.end() && it->first <= 2 * rounded) {
    void* p = it->second;
    *capacity = it->first;
    cache_.erase(it);
    return p;
  }
  LOOM_TRY(make_current());
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, rounded);
  if (err == cudaErrorMemoryAllocation && !cache_.empty()) {  // give the cache back and retry
    (void)cudaGetLastError();
    trim_cache_locked();
    err = cudaMalloc(&p, rounded);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    return make_error(StatusCode::out_of_memory,
                      "cuda: device {} ({}): cannot allocate {} bytes; {} of {} bytes are free",
                      info_.ordinal, info_.name, size, free_bytes, total_bytes);
  }
  if (err != cudaSuccess)
    return to_status(CudaError::runtime(err, "cudaMalloc", __FILE__, __LINE__),
                     fmt::format("{} bytes", rounded));
  *capacity = rounded;
  return p;
}

void DeviceContext::release(void* ptr, size_t capacity) {
  if (!ptr) return;
  std::lock_guard lock(pool_mutex_);
  cache_.emplace(capacity, ptr);
}

void DeviceContext::trim_cache_locked() {
  for (auto& [capacity, ptr] : cache_)
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();  // nothing better to do with it
  cache_.clear();
}

}  // namespace loom::cuda

// ---- public entry points (loom/cuda.h) ------------------------------------------------------------------

namespace loom {

Result<int> cuda_device_count() { return cuda::device_count(); }

Result<CudaDeviceInfo> cuda_device_info(int ordinal) {
  Result<cuda::DeviceContext*> dev = cuda::DeviceContext::get(ordinal);
  if (!dev.ok()) return dev.status();
  CudaDeviceInfo info = (*dev)->info();
  LOOM_TRY((*dev)->make_current());
  size_t total_bytes = 0;
  LOOM_CUDA_STATUS(cudaMemGetInfo(&info.free_bytes, &total_bytes));
  return info;
}

Result<BufferType*> cuda_buffer_type(int ordinal) {
  Result<cuda::DeviceContext*> dev = cuda::DeviceContext::get(ordinal);
  if (!dev.ok()) return dev.status();
  return &(*dev)->buffer_type();
}

Result<BufferType*> cuda_host_buffer_type() {
  Result<int> n = cuda::device_count();  // pinned memory needs a working driver
  if (!n.ok()) return n.status();
  static cuda::PinnedBufferType type;
  return static_cast<BufferType*>(&type);
}

Result<std::unique_ptr<Buffer>> cuda_buffer_from_device_memory(void* ptr, size_t size) {
  if (Result<int> n = cuda::device_count(); !n.ok()) return n.status();
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
    (void)cudaGetLastError();
    return make_error(StatusCode::invalid_argument, "{} is not device memory{}", ptr,
                      err != cudaSuccess ? fmt::format(" ({})", cudaGetErrorString(err)) : std::string());
  }
  Result<cuda::DeviceContext*> dev = cuda::DeviceContext::get(attr.device);
  if (!dev.ok()) return dev.status();
  return cuda::borrow_device_memory(**dev, ptr, size);
}

}  // namespace loom
