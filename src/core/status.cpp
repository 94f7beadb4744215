#include "loom/status.h"

#include <cstdio>
#include <cstdlib>

namespace loom {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::shape_mismatch: return "shape_mismatch";
    case StatusCode::type_mismatch: return "type_mismatch";
    case StatusCode::out_of_memory: return "out_of_memory";
    case StatusCode::io_error: return "io_error";
    case StatusCode::format_error: return "format_error";
    case StatusCode::device_error: return "device_error";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::aborted: return "aborted";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

namespace detail {
void assert_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "loom: internal invariant failed: %s (%s:%d)\n", cond, file, line);
  std::abort();
}
}  // namespace detail

}  // namespace loom
