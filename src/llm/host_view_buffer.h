// A Buffer over host memory someone else owns, such as a model file's read-only mapping, so CPU
// kernels read weights where they lie instead of from a copy.
#pragma once

#include <cstring>

#include "loom/backend.h"
#include "loom/cpu.h"

namespace loom::llm {

/// Read-only: write() and fill() fail (the mapping is PROT_READ; a write would fault). The memory
/// must outlive the buffer. Its type is the CPU's host type, so CPU graphs accept its tensors.
class HostViewBuffer final : public Buffer {
 public:
  HostViewBuffer(const void* data, size_t size) : data_(const_cast<void*>(data)), size_(size) {}
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  BufferType& type() const override { return cpu_buffer_type(); }
  Status write(size_t, const void*, size_t) override {
    return make_error(StatusCode::invalid_argument,
                      "write into a read-only view of host memory (model weights)");
  }
  Status read(size_t offset, void* dst, size_t n) const override {
    if (offset > size_ || n > size_ - offset)
      return make_error(StatusCode::invalid_argument, "read of [{}, {}) past the end of a {}-byte host view",
                        offset, offset + n, size_);
    std::memcpy(dst, static_cast<const uint8_t*>(data_) + offset, n);
    return {};
  }
  Status fill(size_t, uint8_t, size_t) override {
    return make_error(StatusCode::invalid_argument,
                      "fill of a read-only view of host memory (model weights)");
  }

 private:
  void* data_;  // never written through: the interface's base() is non-const
  size_t size_;
};

}  // namespace loom::llm
