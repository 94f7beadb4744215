// The context's host logits buffer (src/llm/logits_buffer.h): growth keeps what was appended, a
// backend's fast host memory is used when offered, and a refused allocation falls back to plain
// memory with nothing lost.
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "llm/logits_buffer.h"

namespace loom::llm::detail {
namespace {

// Host memory from a vector; the type refuses every allocation after `budget` of them.
class VecBuffer final : public Buffer {
 public:
  VecBuffer(BufferType& type, size_t size) : type_(type), bytes_(size) {}
  void* base() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }
  BufferType& type() const override { return type_; }
  Status write(size_t offset, const void* src, size_t n) override {
    std::memcpy(bytes_.data() + offset, src, n);
    return {};
  }
  Status read(size_t offset, void* dst, size_t n) const override {
    std::memcpy(dst, bytes_.data() + offset, n);
    return {};
  }
  Status fill(size_t offset, uint8_t value, size_t n) override {
    std::memset(bytes_.data() + offset, value, n);
    return {};
  }

 private:
  BufferType& type_;
  std::vector<char> bytes_;
};

class LimitedHostType final : public BufferType {
 public:
  explicit LimitedHostType(int budget) : budget_(budget) {}
  const char* name() const override { return "test_host"; }
  size_t alignment() const override { return 64; }
  bool is_host() const override { return true; }
  Result<std::unique_ptr<Buffer>> allocate(size_t size) override {
    ++calls;
    if (budget_-- <= 0) return make_error(StatusCode::out_of_memory, "test: no more host memory ({} bytes)", size);
    return std::unique_ptr<Buffer>(new VecBuffer(*this, size));
  }
  int calls = 0;

 private:
  int budget_;
};

// Appends `count` floats numbered from `first`.
void put(LogitsBuffer& b, size_t count, float first) {
  float* p = b.append(count);
  std::iota(p, p + count, first);
}

void expect_numbered(const LogitsBuffer& b, size_t count) {
  ASSERT_EQ(b.view().size(), count);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(b.view()[i], static_cast<float>(i)) << "at " << i;
}

TEST(LogitsBuffer, PlainMemoryGrowsKeepingEarlierRows) {
  LogitsBuffer b;
  put(b, 5, 0.0f);
  put(b, 1000, 5.0f);
  expect_numbered(b, 1005);
  EXPECT_EQ(b.fast, nullptr);
  b.clear();
  put(b, 3, 0.0f);
  expect_numbered(b, 3);
}

TEST(LogitsBuffer, FastMemoryIsUsedAndDoubles) {
  LimitedHostType type(100);
  LogitsBuffer b;
  b.fast_type = &type;
  put(b, 10, 0.0f);
  ASSERT_NE(b.fast, nullptr);
  EXPECT_EQ(b.view().data(), static_cast<const float*>(b.fast->base()));
  put(b, 11, 10.0f);  // past 10: doubled to 21 at least, the first 10 kept
  expect_numbered(b, 21);
  EXPECT_EQ(type.calls, 2);
  b.clear();
  put(b, 20, 0.0f);  // fits: no allocation
  expect_numbered(b, 20);
  EXPECT_EQ(type.calls, 2);
}

TEST(LogitsBuffer, RefusedFastMemoryFallsBackWithNothingLost) {
  LimitedHostType type(1);  // the first allocation only
  LogitsBuffer b;
  b.fast_type = &type;
  put(b, 8, 0.0f);
  ASSERT_NE(b.fast, nullptr);
  put(b, 100, 8.0f);  // the growth is refused: plain memory, the 8 rows copied over
  EXPECT_EQ(b.fast, nullptr);
  EXPECT_EQ(b.fast_type, nullptr);
  expect_numbered(b, 108);
  put(b, 50, 108.0f);  // and it stays plain, without asking again
  expect_numbered(b, 158);
  EXPECT_EQ(type.calls, 2);
}

TEST(LogitsBuffer, RefusedFirstAllocationUsesPlainMemory) {
  LimitedHostType type(0);
  LogitsBuffer b;
  b.fast_type = &type;
  put(b, 16, 0.0f);
  EXPECT_EQ(b.fast, nullptr);
  expect_numbered(b, 16);
}

}  // namespace
}  // namespace loom::llm::detail
