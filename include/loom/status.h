// Status and Result: how every public Loom function reports failure. The library never aborts on
// user input, a file or a device error; it returns a Status whose message says what and where.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace loom {

/// Broad class of a failure; the message carries the detail.
enum class StatusCode {
  ok = 0,
  invalid_argument,  ///< a caller passed something unusable (null tensor, bad parameter)
  shape_mismatch,    ///< tensor shapes do not fit the op
  type_mismatch,     ///< dtype not accepted by the op
  out_of_memory,     ///< host or device allocation failed
  io_error,          ///< file could not be opened or read
  format_error,      ///< a file's contents are malformed
  device_error,      ///< a device call or kernel failed
  unsupported,       ///< valid request this build or backend cannot do
  aborted,           ///< stopped by an abort callback
  internal,          ///< a broken invariant inside Loom
};

/// Stable lowercase name of a code ("shape_mismatch").
const char* status_code_name(StatusCode code);

/// Success, or a code and a message. Cheap to copy when ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "shape_mismatch: mul_mat: ..." for logs.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

/// Builds a Status with a fmt-formatted message.
template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

/// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& value() const& { return std::get<T>(v_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  Status status() const { return ok() ? Status{} : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace loom

/// Returns the Status of an expression early when it is an error.
#define LOOM_TRY(expr)                       \
  do {                                       \
    ::loom::Status loom_try_status_ = (expr); \
    if (!loom_try_status_.ok()) return loom_try_status_; \
  } while (0)

/// Internal invariant: a violation is a Loom bug, never a user error.
#define LOOM_ASSERT(cond)                                                         \
  do {                                                                            \
    if (!(cond)) ::loom::detail::assert_failed(#cond, __FILE__, __LINE__);        \
  } while (0)

namespace loom::detail {
[[noreturn]] void assert_failed(const char* cond, const char* file, int line);
}
