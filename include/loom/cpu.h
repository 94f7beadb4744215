// CPU backend entry points.
#pragma once

#include <memory>

#include "loom/backend.h"

namespace loom {

/// Host memory buffer type (64-byte aligned).
BufferType& cpu_buffer_type();
/// A CPU backend running graphs on `n_threads` threads (0: hardware concurrency).
std::unique_ptr<Backend> make_cpu_backend(int n_threads = 0, Numerics numerics = Numerics::exact);
/// Registers "cpu" with the backend registry (done automatically in programs linking loom_cpu).
void register_cpu_backend();

}  // namespace loom
