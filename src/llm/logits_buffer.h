// The host copy of a context's logits (llm_context.cpp): grown, never shrunk, in the logits backend's
// fast host memory when it has one.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "loom/backend.h"

namespace loom::llm::detail {

// Host copy returned by decode: it only grows, so a step does not zero-fill the megabytes it then
// overwrites (64 sequences x a 128k vocabulary: 33 MB per batched step). In the logits backend's
// fast host memory when it has one (CUDA: page-locked, so the read-back is one DMA instead of a
// copy through the driver's staging buffers); in a vector when it has none or cannot get it.
struct LogitsBuffer {
  BufferType* fast_type = nullptr;  // set at creation from the last segment's backend
  std::unique_ptr<Buffer> fast;     // capacity fast->size() / sizeof(float)
  std::vector<float> plain;
  size_t n = 0;
  void clear() { n = 0; }
  float* base() { return fast ? static_cast<float*>(fast->base()) : plain.data(); }
  const float* base() const { return const_cast<LogitsBuffer*>(this)->base(); }
  float* append(size_t count) {
    const size_t need = n + count;
    if (fast_type && (!fast || fast->size() < need * sizeof(float))) {
      // grows by doubling, keeping the n floats already there
      const size_t have = fast ? fast->size() / sizeof(float) : plain.size();
      Result<std::unique_ptr<Buffer>> grown = fast_type->allocate(std::max(need, 2 * have) * sizeof(float));
      if (grown.ok()) {
        if (n > 0) std::memcpy((*grown)->base(), base(), n * sizeof(float));
        fast = std::move(grown.value());
        plain = {};
      } else {  // no page-locked memory left: plain host memory from here on, the n floats kept
        if (fast) {
          plain.assign(base(), base() + n);
          fast.reset();
        }
        fast_type = nullptr;
      }
    }
    if (!fast && plain.size() < need) plain.resize(need);
    float* p = base() + n;
    n = need;
    return p;
  }
  std::span<const float> view() const { return {base(), n}; }
};

}  // namespace loom::llm::detail
