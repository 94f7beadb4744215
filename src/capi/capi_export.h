// What the C ABI's two libraries share. libloom_capi.so implements include/loom.h;
// libloom_capi_cuda.so implements include/loom-cuda.h on top of it (cuda_seed_api.cpp) and links
// libloom_capi.so for the last-error slot and the graph accessors. Each library has its own private copy of loom_core, so
// they exchange only C functions and plain loom::Tensor/Buffer/BufferType objects (same layout,
// virtual calls dispatch into the library that made the object).
#pragma once

#include <exception>
#include <new>

#include "loom.h"
#include "loom/backend.h"

extern "C" {
/// Records `message` as the calling thread's last error (what loom_last_error returns).
LOOM_API void loom_capi_set_last_error(loom_status status, const char* message);
}

namespace loom::capi {

// The C handles are the C++ objects under another name: the C header keeps them opaque.
inline Tensor* to_cpp(loom_tensor* t) { return reinterpret_cast<Tensor*>(t); }
inline const Tensor* to_cpp(const loom_tensor* t) { return reinterpret_cast<const Tensor*>(t); }
inline loom_tensor* to_c(Tensor* t) { return reinterpret_cast<loom_tensor*>(t); }
inline Buffer* to_cpp(loom_buffer* b) { return reinterpret_cast<Buffer*>(b); }
inline const Buffer* to_cpp(const loom_buffer* b) { return reinterpret_cast<const Buffer*>(b); }
inline loom_buffer* to_c(Buffer* b) { return reinterpret_cast<loom_buffer*>(b); }
inline BufferType* to_cpp(loom_buffer_type* t) { return reinterpret_cast<BufferType*>(t); }
inline const BufferType* to_cpp(const loom_buffer_type* t) { return reinterpret_cast<const BufferType*>(t); }
inline loom_buffer_type* to_c(BufferType* t) { return reinterpret_cast<loom_buffer_type*>(t); }

inline loom_status to_c(StatusCode code) { return static_cast<loom_status>(code); }

/// Records `s` as the thread's last error and returns its code.
inline loom_status report(const Status& s) {
  loom_capi_set_last_error(to_c(s.code()), s.message().c_str());
  return to_c(s.code());
}

/// Runs `body` (returning a Status) at the C boundary: a failure becomes the thread's last error
/// and its code; C++ exceptions become out_of_memory or internal codes instead of crossing into C.
template <typename F>
loom_status guard_status(const char* fn, F&& body) {
  try {
    const Status s = body();
    return s.ok() ? LOOM_STATUS_OK : report(s);
  } catch (const std::bad_alloc&) {
    return report(make_error(StatusCode::out_of_memory, "{}: out of host memory", fn));
  } catch (const std::exception& e) {
    return report(make_error(StatusCode::internal, "{}: unexpected exception: {}", fn, e.what()));
  } catch (...) {
    return report(make_error(StatusCode::internal, "{}: unexpected exception", fn));
  }
}

/// Like guard_status for functions that return a value: `fallback` when `body` throws.
template <typename T, typename F>
T guard_value(const char* fn, T fallback, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    report(make_error(StatusCode::out_of_memory, "{}: out of host memory", fn));
  } catch (const std::exception& e) {
    report(make_error(StatusCode::internal, "{}: unexpected exception: {}", fn, e.what()));
  } catch (...) {
    report(make_error(StatusCode::internal, "{}: unexpected exception", fn));
  }
  return fallback;
}

}  // namespace loom::capi
