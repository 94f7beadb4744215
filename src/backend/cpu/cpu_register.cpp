// Compiled into every program that links loom_cpu (an INTERFACE source), so the registry knows
// "cpu" before main() without the program naming the backend.
#include "loom/cpu.h"

namespace {
const bool kRegistered = [] {
  loom::register_cpu_backend();
  return true;
}();
}  // namespace
