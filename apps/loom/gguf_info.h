// What `loom info` prints about a GGUF file.
#pragma once

#include <cstddef>
#include <string>

#include "loom/gguf.h"

namespace loom::app {

/// A report of `f`: file facts, every metadata key with its type and value (arrays show their
/// first `max_elements` elements and their count), a table of tensors (name, type, shape, bytes,
/// offset) and totals (parameters, bytes per tensor type).
std::string describe_gguf(const GgufFile& f, size_t max_elements = 8);

/// "1.50 MiB", "3.80 GiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace loom::app
