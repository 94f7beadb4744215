// Backend interface: buffer types, buffers, backends, and the run-time registry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/graph.h"
#include "loom/status.h"

namespace loom {

class BufferType;

/// A block of memory in some address space (host or device).
class Buffer {
 public:
  virtual ~Buffer() = default;
  /// Start address in the buffer's address space.
  virtual void* base() = 0;
  virtual size_t size() const = 0;
  virtual BufferType& type() const = 0;
  /// Copies `n` host bytes to `offset`.
  virtual Status write(size_t offset, const void* src, size_t n) = 0;
  /// Copies `n` bytes at `offset` to host memory.
  virtual Status read(size_t offset, void* dst, size_t n) const = 0;
  /// Copies `height` rows of `width` bytes, the first at `offset` and each `src_pitch` after the one
  /// before, to host memory `dst_pitch` apart (a strided read: a device does it as one 2-D copy; by
  /// default row by row through read()).
  virtual Status read_rows(size_t offset, size_t src_pitch, void* dst, size_t dst_pitch, size_t width,
                           size_t height) const;
  /// Sets `n` bytes at `offset` to `value`.
  virtual Status fill(size_t offset, uint8_t value, size_t n) = 0;
};

/// A kind of memory a backend computes on.
class BufferType {
 public:
  virtual ~BufferType() = default;
  virtual const char* name() const = 0;
  virtual size_t alignment() const = 0;
  /// Host-addressable memory (the CPU can dereference base()).
  virtual bool is_host() const = 0;
  virtual Result<std::unique_ptr<Buffer>> allocate(size_t size) = 0;
};

/// How a backend rounds (docs/NUMERICS.md).
/// - exact: every backend computes each rounded value from the same exact number (dot products and
///   attention in double): CUDA equals the CPU bit for bit. The CPU backend always computes this way.
/// - fast: tensor cores and float32 accumulation, fused rounding allowed; deterministic run to run
///   (no atomics whose order varies, no split chosen by timing), within the op-level bounds of
///   docs/NUMERICS.md of the exact result. The GPU default.
enum class Numerics : uint8_t { exact, fast };

/// "exact" / "fast".
const char* numerics_name(Numerics n);
/// Parses "exact" / "fast"; an error naming `what` (a flag or variable) otherwise.
Result<Numerics> parse_numerics(std::string_view text, std::string_view what = "numerics");
/// The mode a backend runs in: `requested` when set, else LOOM_NUMERICS when set (an invalid value
/// is an error), else `backend_default`.
Result<Numerics> resolve_numerics(std::optional<Numerics> requested, Numerics backend_default);
/// Whether LOOM_DETERMINISTIC is set and not "0" (`--deterministic`): batch-invariant fast numerics on
/// CUDA, a sequence's results the same whatever else a step holds (docs/BATCHING.md).
bool deterministic_from_env();
/// A default-on switch from the environment: on unless `name` is set to "0" (the LOOM_* variables
/// that turn a faster path off to compare against it). Callers read it once.
bool env_switch(const char* name);
/// An integer setting from the environment: `name`'s value where it is set to an integer in [lo, hi],
/// else `fallback` (the LOOM_* variables that replace a tuned constant to compare). Callers read it once.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi);

/// Options a backend is created with.
struct BackendOptions {
  int n_threads = 0;  ///< CPU worker threads (0: hardware concurrency)
  int device = 0;     ///< device ordinal for GPU backends
  /// Rounding mode (unset: LOOM_NUMERICS, else the backend's default: fast on CUDA, exact on the CPU).
  std::optional<Numerics> numerics;
};

/// Something that evaluates graphs.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  /// Memory the backend computes on; tensors of a graph must live in it.
  virtual BufferType& buffer_type() = 0;
  /// Host memory the backend copies to and from fastest (CUDA: page-locked, copied by DMA without a
  /// staging bounce), or nullptr when plain host memory is as good.
  virtual BufferType* host_buffer_type() { return nullptr; }
  /// Whether this backend has a kernel for this node (op, dtypes, shape).
  virtual bool supports_op(const Tensor& node) const = 0;
  /// Evaluates every node of `g` in order. Every tensor must be allocated.
  virtual Status compute(const Graph& g) = 0;
  /// Waits for work queued on the backend.
  virtual Status synchronize() { return {}; }
  /// The rounding mode the backend computes in (fixed at creation).
  virtual Numerics numerics() const { return Numerics::exact; }

  /// Clears a sticky error state left by a failed launch or sync (see compute()).
  virtual Status reset() { return {}; }

  /// An interface this backend offers beyond this one, named by `id`, or nullptr. The layers above
  /// the core define them (exec::ExecutorControl in loom/exec.h: the graph executor's switches and
  /// counters); the core only passes them through.
  virtual void* extension(std::string_view id) {
    (void)id;
    return nullptr;
  }
  /// The extension of type T (named by T::kExtensionId), or nullptr when this backend has none.
  template <class T>
  T* extension() {
    return static_cast<T*>(extension(std::string_view(T::kExtensionId)));
  }
  template <class T>
  const T* extension() const {
    return const_cast<Backend*>(this)->extension<T>();
  }
};

using BackendFactory = std::function<Result<std::unique_ptr<Backend>>(const BackendOptions&)>;

/// Registers a backend under `name` (later registrations of the same name replace earlier ones).
void register_backend(std::string name, BackendFactory factory);
/// Names of registered backends; loads backend libraries (libloom_cuda.so) on first call.
std::vector<std::string> backend_names();
/// Creates the backend called `name` ("cpu", "cuda").
Result<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                const BackendOptions& options = {});

// ---- tensor data ---------------------------------------------------------------------------------

/// Copies host bytes into a tensor's memory (tensor must be allocated; range within nbytes()).
Status tensor_write(Tensor* t, const void* src, size_t offset, size_t n);
/// Copies a tensor's bytes to the host.
Status tensor_read(const Tensor* t, void* dst, size_t offset, size_t n);
/// Copies a tensor whose rows are packed (nb[0] the element size, rows nb[1] apart, dims 2-3 packed
/// over rows) to the host with its rows `dst_pitch` bytes apart, in one strided read.
Status tensor_read_rows(const Tensor* t, void* dst, size_t dst_pitch);
/// Reads a tensor of any type and layout as packed floats (dequantizing).
Result<std::vector<float>> tensor_to_floats(const Tensor* t);
/// Writes packed floats into a tensor of any type and layout (quantizing).
Status tensor_from_floats(Tensor* t, const float* values, int64_t n);

/// Binds a tensor to memory at `offset` of `buffer`; resolves nothing else.
Status tensor_bind(Tensor* t, Buffer* buffer, size_t offset);

}  // namespace loom
