// The executor's switches on any backend (loom/exec.h): through its ExecutorControl, or the plain
// in-order evaluation of backends without one.
#include "loom/backend.h"
#include "loom/exec.h"

namespace loom {

void set_exec_options(Backend& backend, const ExecOptions& options) {
  if (auto* control = backend.extension<exec::ExecutorControl>()) control->set_options(options);
}

ExecOptions exec_options(const Backend& backend) {
  auto* control = backend.extension<exec::ExecutorControl>();
  return control ? control->options() : ExecOptions{};
}

ExecCounters exec_counters(const Backend& backend) {
  auto* control = backend.extension<exec::ExecutorControl>();
  return control ? control->counters() : ExecCounters{};
}

void reset_exec_counters(Backend& backend) {
  if (auto* control = backend.extension<exec::ExecutorControl>()) control->reset_counters();
}

Status capture_next_compute(Backend& backend, const std::string& path) {
  auto* control = backend.extension<exec::ExecutorControl>();
  if (!control) return make_error(StatusCode::unsupported, "{}: no trace capture", backend.name());
  return control->capture_next_compute(path);
}

}  // namespace loom
