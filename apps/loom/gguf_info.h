// What `loom info` prints about a GGUF file.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "loom/gguf.h"

namespace loom::app {

/// What keeps Loom from running a GGUF file, found from its metadata and tensor table alone (no
/// weights are read): its architecture (llm::arch_from_name) and its tensors' types
/// (dtype_from_gguf).
struct SupportReport {
  std::string arch;  ///< general.architecture; "" when the key is missing or not a string
  bool arch_supported = false;
  /// The tensors of each type Loom cannot compute with, by type name ("iq2_xxs"), in file order.
  std::map<std::string, std::vector<std::string>> unsupported_types;
  bool ok() const { return arch_supported && unsupported_types.empty(); }
};
SupportReport check_support(const GgufFile& f);
/// The "support:" lines of `loom info`: that Loom can run the file, or each reason it cannot, with
/// the architectures and types Loom supports.
std::string describe_support(const SupportReport& r);

/// A report of `f`: file facts, every metadata key with its type and value (arrays show their
/// first `max_elements` elements and their count), a table of tensors (name, type, shape, bytes,
/// offset), totals (parameters, bytes per tensor type) and describe_support's lines.
std::string describe_gguf(const GgufFile& f, size_t max_elements = 8);

/// "1.50 MiB", "3.80 GiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace loom::app
