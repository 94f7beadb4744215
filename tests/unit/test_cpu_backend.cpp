// CPU backend plumbing: the thread pool, the backend registry, compute's checks, tensor data
// helpers on plain and strided tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/thread_pool.h"
#include "loom/backend.h"
#include "loom/cpu.h"
#include "loom/graph.h"
#include "loom/planner.h"

namespace loom {
namespace {

// ---- thread pool -----------------------------------------------------------------------------------

TEST(ThreadPool, Sizes) {
  EXPECT_EQ(cpu::ThreadPool(1).size(), 1);
  EXPECT_EQ(cpu::ThreadPool(0).size(), 1);
  EXPECT_EQ(cpu::ThreadPool(-4).size(), 1);
  EXPECT_EQ(cpu::ThreadPool(5).size(), 5);
}

// Each phase every thread writes its slot (plain, non-atomic memory) and, after a barrier, checks
// every other thread's slot: a barrier that let a thread through early, or did not publish the
// writes, shows up as a stale value.
void barrier_phases(int n_threads, int n_phases) {
  cpu::ThreadPool pool(n_threads);
  std::vector<int64_t> slots(static_cast<size_t>(n_threads), -1);
  std::vector<int64_t> errors(static_cast<size_t>(n_threads), 0);
  std::vector<int64_t> seen_sum(static_cast<size_t>(n_threads), 0);
  pool.run([&](int ith) {
    for (int p = 0; p < n_phases; ++p) {
      slots[ith] = static_cast<int64_t>(p) * 1000 + ith;
      pool.barrier();
      for (int j = 0; j < n_threads; ++j) {
        if (slots[j] != static_cast<int64_t>(p) * 1000 + j) ++errors[ith];
        seen_sum[ith] += slots[j];
      }
      pool.barrier();  // nobody overwrites a slot before all have read it
    }
  });
  int64_t expect_sum = 0;
  for (int p = 0; p < n_phases; ++p)
    for (int j = 0; j < n_threads; ++j) expect_sum += static_cast<int64_t>(p) * 1000 + j;
  for (int i = 0; i < n_threads; ++i) {
    EXPECT_EQ(errors[i], 0) << "thread " << i << " of " << n_threads;
    EXPECT_EQ(seen_sum[i], expect_sum) << "thread " << i;
  }
}

TEST(ThreadPool, BarrierPublishesEachPhase) {
  barrier_phases(2, 2000);
  barrier_phases(4, 1000);
  barrier_phases(7, 300);  // more threads than cores: waiters must sleep, not spin forever
}

TEST(ThreadPool, RunWaitsForEveryThread) {
  constexpr int kThreads = 4;
  constexpr int kRuns = 5000;
  cpu::ThreadPool pool(kThreads);
  std::vector<int> count(kThreads, 0);  // each slot written by one thread only
  int wrong = 0;
  for (int r = 0; r < kRuns; ++r) {
    pool.run([&](int ith) { ++count[ith]; });
    // run() returned: every thread's increment of this run is visible.
    for (int i = 0; i < kThreads; ++i) wrong += count[i] != r + 1;
  }
  EXPECT_EQ(wrong, 0);
}

TEST(ThreadPool, EachIndexRunsOncePerJob) {
  cpu::ThreadPool pool(6);
  std::atomic<int> seen_mask{0};
  std::atomic<int> calls{0};
  std::atomic<int> main_thread_index{-1};
  const auto caller = std::this_thread::get_id();
  for (int r = 0; r < 200; ++r) {
    seen_mask = 0;
    calls = 0;
    pool.run([&](int ith) {
      seen_mask.fetch_or(1 << ith);
      calls.fetch_add(1);
      if (std::this_thread::get_id() == caller) main_thread_index = ith;
    });
    ASSERT_EQ(seen_mask.load(), 0b111111);
    ASSERT_EQ(calls.load(), 6);
    ASSERT_EQ(main_thread_index.load(), 0);  // the caller is thread 0
  }
}

TEST(ThreadPool, BarriersInsideManyShortRuns) {
  cpu::ThreadPool pool(3);
  std::vector<int> data(3, 0);
  int errors = 0;
  for (int r = 0; r < 2000; ++r) {
    std::vector<int> got(3, 0);
    pool.run([&](int ith) {
      data[ith] = r + ith;
      pool.barrier();
      got[ith] = data[(ith + 1) % 3];
      pool.barrier();
    });
    for (int i = 0; i < 3; ++i) errors += got[i] != r + (i + 1) % 3;
  }
  EXPECT_EQ(errors, 0);
}

TEST(ThreadPool, OneThreadRunsOnTheCaller) {
  cpu::ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  for (int r = 0; r < 1000; ++r) {
    pool.run([&](int ith) {
      EXPECT_EQ(ith, 0);
      EXPECT_EQ(std::this_thread::get_id(), caller);
      pool.barrier();  // returns at once with one thread
      ++calls;
    });
  }
  EXPECT_EQ(calls, 1000);
}

TEST(ThreadPool, CreateAndDestroyWithoutRunning) {
  for (int i = 0; i < 50; ++i) {
    cpu::ThreadPool pool(1 + i % 4);
    if (i % 2) pool.run([](int) {});
  }
  SUCCEED();  // reaching here means no destructor hung
}

TEST(KernelContext, SplitCoversEveryItemOnce) {
  for (int nth = 1; nth <= 9; ++nth) {
    for (int64_t n : {0, 1, 2, 5, 8, 9, 31, 100}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      for (int ith = 0; ith < nth; ++ith) {
        cpu::KernelContext ctx;
        ctx.ith = ith;
        ctx.nth = nth;
        int64_t b = -1, e = -1;
        ctx.split(n, b, e);
        ASSERT_LE(0, b);
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        for (int64_t i = b; i < e; ++i) ++hits[i];
      }
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1) << "n " << n << " nth " << nth << " item " << i;
    }
  }
}

// ---- registry ----------------------------------------------------------------------------------------

TEST(Registry, CpuIsRegistered) {
  const auto names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  auto b = create_backend("cpu");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_STREQ(b.value()->name(), "cpu");
  EXPECT_TRUE(b.value()->buffer_type().is_host());
  EXPECT_EQ(b.value()->buffer_type().alignment(), 64u);
  EXPECT_STREQ(b.value()->buffer_type().name(), "cpu");
  EXPECT_EQ(&b.value()->buffer_type(), &cpu_buffer_type());
  auto b2 = create_backend("cpu", BackendOptions{2, 0, std::nullopt});
  ASSERT_TRUE(b2.ok());
}

TEST(Registry, UnknownNameListsAvailableBackends) {
  auto b = create_backend("nope");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::unsupported);
  const Status status = b.status();
  const std::string& msg = status.message();
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
  for (const std::string& name : backend_names()) EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
}

TEST(Registry, RegisterAndReplace) {
  register_backend("unit-test-backend", [](const BackendOptions&) -> Result<std::unique_ptr<Backend>> {
    return make_error(StatusCode::device_error, "first factory");
  });
  auto b = create_backend("unit-test-backend");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::device_error);
  EXPECT_EQ(b.status().message(), "first factory");
  int threads_seen = -1;
  register_backend("unit-test-backend", [&](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
    threads_seen = o.n_threads;
    return make_cpu_backend(o.n_threads);
  });
  auto b2 = create_backend("unit-test-backend", BackendOptions{3, 0, std::nullopt});
  ASSERT_TRUE(b2.ok()) << b2.status().to_string();
  EXPECT_EQ(threads_seen, 3);
  const auto names = backend_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "unit-test-backend"), 1);
}

// ---- compute's checks --------------------------------------------------------------------------------

TEST(CpuCompute, RejectsUnallocatedTensors) {
  auto backend = make_cpu_backend(2);
  Graph g;
  Tensor* x = g.input(DType::f32, {8, 2, 1, 1}, "x");
  Tensor* y = silu(g, x);
  ASSERT_NE(y, nullptr);
  y->name = "y";
  Status s = backend->compute(g);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("'y'"), std::string::npos) << s.message();

  // The node has memory now, its operand still has none.
  auto buf = cpu_buffer_type().allocate(y->nbytes());
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(tensor_bind(y, buf.value().get(), 0).ok());
  s = backend->compute(g);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("silu"), std::string::npos) << s.message();

  // Both bound: it runs.
  auto xbuf = cpu_buffer_type().allocate(x->nbytes());
  ASSERT_TRUE(xbuf.ok());
  ASSERT_TRUE(tensor_bind(x, xbuf.value().get(), 0).ok());
  std::vector<float> xv(16, 2.0f);
  ASSERT_TRUE(tensor_from_floats(x, xv.data(), 16).ok());
  ASSERT_TRUE(backend->compute(g).ok());
  auto yv = tensor_to_floats(y);
  ASSERT_TRUE(yv.ok());
  EXPECT_FLOAT_EQ((*yv)[15], 2.0f / (1.0f + std::exp(-2.0f)));
}

TEST(CpuCompute, RejectsAFailedGraph) {
  auto backend = make_cpu_backend(2);
  Graph g;
  Tensor* x = g.input(DType::f32, {8, 2, 1, 1}, "x");
  EXPECT_EQ(add(g, x, g.input(DType::f32, {3, 1, 1, 1}, "b")), nullptr);
  Status s = backend->compute(g);
  EXPECT_EQ(s.code(), StatusCode::shape_mismatch);
  EXPECT_EQ(s.message(), g.status().message());
  auto alloc = allocate_graph(g, cpu_buffer_type());
  EXPECT_FALSE(alloc.ok());
  EXPECT_EQ(alloc.status().code(), StatusCode::shape_mismatch);
}

TEST(CpuCompute, ComputesAndRepeats) {
  auto backend = make_cpu_backend(3);
  Graph g;
  Tensor* x = g.input(DType::f32, {5, 7, 1, 1}, "x");
  Tensor* b = g.input(DType::f32, {5, 1, 1, 1}, "b");
  Tensor* y = scale(g, add(g, x, b), 2.0f, -1.0f);
  Tensor* s = sum_rows(g, y);
  g.mark_output(y);
  g.mark_output(s);
  EXPECT_TRUE(backend->supports_op(*y));
  auto alloc = allocate_graph(g, backend->buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
  std::vector<float> xv(35), bv = {1, 2, 3, 4, 5};
  for (int i = 0; i < 35; ++i) xv[i] = static_cast<float>(i);
  ASSERT_TRUE(tensor_from_floats(x, xv.data(), 35).ok());
  ASSERT_TRUE(tensor_from_floats(b, bv.data(), 5).ok());
  for (int rep = 0; rep < 3; ++rep) {  // same graph, computed again
    ASSERT_TRUE(backend->compute(g).ok());
    auto yv = tensor_to_floats(y);
    auto sv = tensor_to_floats(s);
    ASSERT_TRUE(yv.ok() && sv.ok());
    for (int r = 0; r < 7; ++r) {
      float row = 0.0f;
      for (int i = 0; i < 5; ++i) {
        const float expect = (xv[r * 5 + i] + bv[i]) * 2.0f - 1.0f;
        EXPECT_EQ((*yv)[r * 5 + i], expect);
        row += expect;
      }
      EXPECT_EQ((*sv)[r], row);
    }
    xv[rep] += 100.0f;  // the next repetition must see new input
    ASSERT_TRUE(tensor_from_floats(x, xv.data(), 35).ok());
  }
}

// ---- tensor data -----------------------------------------------------------------------------------------

class TensorData : public ::testing::Test {
 protected:
  // Allocates every leaf and resolves views.
  void allocate() {
    ASSERT_TRUE(g_.status().ok()) << g_.status().to_string();
    auto alloc = allocate_graph(g_, cpu_buffer_type());
    ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
    alloc_ = std::move(alloc.value());
  }
  Graph g_;
  GraphAllocation alloc_;
};

TEST_F(TensorData, WriteAndReadRanges) {
  Tensor* a = g_.input(DType::f32, {4, 3, 1, 1}, "a");  // 48 bytes
  allocate();
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = 0.5f * static_cast<float>(i + 1);
  ASSERT_TRUE(tensor_write(a, v.data(), 0, 48).ok());
  float part[3] = {-1.0f, -2.0f, -3.0f};
  ASSERT_TRUE(tensor_write(a, part, 20, 12).ok());  // elements 5..7
  std::vector<float> back(12);
  ASSERT_TRUE(tensor_read(a, back.data(), 0, 48).ok());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(back[i], (i >= 5 && i < 8) ? part[i - 5] : v[i]) << i;
  float one = 0.0f;
  ASSERT_TRUE(tensor_read(a, &one, 44, 4).ok());
  EXPECT_EQ(one, v[11]);
  EXPECT_TRUE(tensor_write(a, v.data(), 48, 0).ok());  // empty range at the end

  const struct {
    size_t offset, n;
  } bad[] = {{0, 52}, {44, 8}, {48, 1}, {1000, 4}, {std::numeric_limits<size_t>::max() - 2, 8},
             {8, std::numeric_limits<size_t>::max()}};
  for (auto r : bad) {
    Status w = tensor_write(a, v.data(), r.offset, r.n);
    EXPECT_EQ(w.code(), StatusCode::invalid_argument) << r.offset << "+" << r.n;
    EXPECT_NE(w.message().find("tensor_write"), std::string::npos);
    EXPECT_NE(w.message().find("'a'"), std::string::npos) << w.message();
    Status rd = tensor_read(a, back.data(), r.offset, r.n);
    EXPECT_EQ(rd.code(), StatusCode::invalid_argument) << r.offset << "+" << r.n;
    EXPECT_NE(rd.message().find("tensor_read"), std::string::npos);
  }
  // failed writes changed nothing
  std::vector<float> after(12);
  ASSERT_TRUE(tensor_read(a, after.data(), 0, 48).ok());
  EXPECT_EQ(after, back);

  EXPECT_EQ(tensor_write(nullptr, v.data(), 0, 4).code(), StatusCode::invalid_argument);
  EXPECT_EQ(tensor_read(nullptr, v.data(), 0, 4).code(), StatusCode::invalid_argument);
}

// tensor_read_rows: each row lands dst_pitch bytes after the one before (a tensor-parallel rank's
// logits slice at its vocabulary offset of every output row); the bytes between stay as they were.
TEST_F(TensorData, ReadRowsAtAPitch) {
  Tensor* a = g_.input(DType::f32, {3, 2, 2, 1}, "a");         // 4 packed rows of 3
  Tensor* cols = view(g_, a, {2, 4, 1, 1}, {4, 12, 48, 48}, 4);  // columns 1..2 of each row: rows 12 bytes apart
  Tensor* t = transpose(g_, a);                                 // not packed rows
  allocate();
  const std::vector<float> av = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  ASSERT_TRUE(tensor_write(a, av.data(), 0, 48).ok());
  std::vector<float> dst(4 * 5, -7.0f);
  ASSERT_TRUE(tensor_read_rows(a, dst.data() + 1, 5 * sizeof(float)).ok());
  EXPECT_EQ(dst, (std::vector<float>{-7, 1, 2, 3, -7, -7, 4, 5, 6, -7, -7, 7, 8, 9, -7, -7, 10, 11, 12, -7}));
  std::vector<float> two(4 * 2);
  ASSERT_TRUE(tensor_read_rows(cols, two.data(), 2 * sizeof(float)).ok());
  EXPECT_EQ(two, (std::vector<float>{2, 3, 5, 6, 8, 9, 11, 12}));

  Status s = tensor_read_rows(a, dst.data(), 2 * sizeof(float));  // a pitch below the row
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  EXPECT_EQ(tensor_read_rows(t, dst.data(), 5 * sizeof(float)).code(), StatusCode::invalid_argument);
  EXPECT_EQ(tensor_read_rows(nullptr, dst.data(), 16).code(), StatusCode::invalid_argument);
}

TEST(TensorDataErrors, UnallocatedTensor) {
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 1, 1, 1}, "a");
  float v[4] = {1, 2, 3, 4};
  Status s = tensor_write(a, v, 0, 16);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("no memory"), std::string::npos) << s.message();
  EXPECT_EQ(tensor_read(a, v, 0, 16).code(), StatusCode::invalid_argument);
  EXPECT_FALSE(tensor_to_floats(a).ok());
  EXPECT_FALSE(tensor_from_floats(a, v, 4).ok());
  EXPECT_FALSE(tensor_to_floats(nullptr).ok());
  EXPECT_EQ(tensor_from_floats(nullptr, v, 4).code(), StatusCode::invalid_argument);
}

TEST(TensorDataErrors, BindAndBufferBounds) {
  auto buf = cpu_buffer_type().allocate(40);
  ASSERT_TRUE(buf.ok());
  Buffer& b = *buf.value();
  EXPECT_EQ(b.size(), 40u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.base()) % 64, 0u);
  Graph g;
  Tensor* a = g.input(DType::f32, {4, 2, 1, 1}, "a");  // 32 bytes
  EXPECT_TRUE(tensor_bind(a, &b, 8).ok());
  Status s = tensor_bind(a, &b, 12);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("'a'"), std::string::npos);
  EXPECT_EQ(tensor_bind(nullptr, &b, 0).code(), StatusCode::invalid_argument);
  EXPECT_EQ(tensor_bind(a, nullptr, 0).code(), StatusCode::invalid_argument);
  uint8_t bytes[48] = {};
  EXPECT_FALSE(b.write(0, bytes, 41).ok());
  EXPECT_FALSE(b.read(36, bytes, 8).ok());
  EXPECT_FALSE(b.fill(1, 0, 40).ok());
  EXPECT_TRUE(b.fill(0, 7, 40).ok());
  EXPECT_TRUE(b.read(0, bytes, 40).ok());
  EXPECT_EQ(bytes[39], 7);
}

TEST_F(TensorData, StridedViewsToAndFromFloats) {
  Tensor* a = g_.input(DType::f32, {4, 3, 1, 1}, "a");
  Tensor* t = transpose(g_, a);                                // [3, 4], nb {16, 4}
  Tensor* cols = view(g_, a, {2, 3, 1, 1}, {0, 16, 48, 48}, 4);  // columns 1..2
  allocate();
  const std::vector<float> av = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  ASSERT_TRUE(tensor_from_floats(a, av.data(), 12).ok());

  auto tv = tensor_to_floats(t);
  ASSERT_TRUE(tv.ok()) << tv.status().to_string();
  EXPECT_EQ(*tv, (std::vector<float>{1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12}));
  auto cv = tensor_to_floats(cols);
  ASSERT_TRUE(cv.ok());
  EXPECT_EQ(*cv, (std::vector<float>{2, 3, 6, 7, 10, 11}));

  // Writing through the transpose: t(j0, j1) = w[j1*3 + j0] lands at a(j1, j0).
  const std::vector<float> w = {101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112};
  ASSERT_TRUE(tensor_from_floats(t, w.data(), 12).ok());
  auto back = tensor_to_floats(a);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, (std::vector<float>{101, 104, 107, 110, 102, 105, 108, 111, 103, 106, 109, 112}));

  // Writing the column block leaves the other columns as they were.
  const std::vector<float> c = {-1, -2, -3, -4, -5, -6};
  ASSERT_TRUE(tensor_from_floats(cols, c.data(), 6).ok());
  back = tensor_to_floats(a);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, (std::vector<float>{101, -1, -2, 110, 102, -3, -4, 111, 103, -5, -6, 112}));

  Status s = tensor_from_floats(cols, c.data(), 5);
  EXPECT_EQ(s.code(), StatusCode::shape_mismatch);
  EXPECT_NE(s.message().find("5"), std::string::npos);
}

TEST_F(TensorData, StridedViewsOfHalfAndInt) {
  Tensor* h = g_.input(DType::f16, {4, 2, 2, 1}, "h");
  Tensor* p = permute(g_, h, 2, 0, 1, 3);  // ne {2, 2, 4}: p(j0, j1, j2) = h(j2, j0, j1)
  Tensor* i = g_.input(DType::i32, {3, 2, 1, 1}, "i");
  Tensor* it = transpose(g_, i);
  allocate();
  std::vector<float> hv(16);
  for (int k = 0; k < 16; ++k) hv[k] = 0.25f * static_cast<float>(k) - 1.0f;  // exact in f16
  ASSERT_TRUE(tensor_from_floats(h, hv.data(), 16).ok());
  auto pv = tensor_to_floats(p);
  ASSERT_TRUE(pv.ok());
  for (int j2 = 0; j2 < 4; ++j2)
    for (int j1 = 0; j1 < 2; ++j1)
      for (int j0 = 0; j0 < 2; ++j0)
        EXPECT_EQ((*pv)[j2 * 4 + j1 * 2 + j0], hv[j1 * 8 + j0 * 4 + j2]) << j0 << j1 << j2;

  const std::vector<float> iv = {-3, 7, 100000, 4, -5, 6};
  ASSERT_TRUE(tensor_from_floats(i, iv.data(), 6).ok());
  auto itv = tensor_to_floats(it);
  ASSERT_TRUE(itv.ok());
  EXPECT_EQ(*itv, (std::vector<float>{-3, 4, 7, -5, 100000, 6}));
  int32_t raw[6];
  ASSERT_TRUE(tensor_read(i, raw, 0, sizeof(raw)).ok());
  EXPECT_EQ(raw[2], 100000);
  EXPECT_EQ(raw[4], -5);
}

TEST_F(TensorData, QuantizedRowViews) {
  Tensor* q = g_.weight(DType::q8_0, {64, 3, 1, 1}, "q");
  Tensor* row1 = view(g_, q, {64, 1, 1, 1}, q->nb, q->nb[1]);
  allocate();
  std::vector<float> v(192);
  for (int k = 0; k < 192; ++k) v[k] = static_cast<float>((k * 37) % 127 - 63);  // exact in q8_0
  ASSERT_TRUE(tensor_from_floats(q, v.data(), 192).ok());
  auto r = tensor_to_floats(row1);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 64u);
  // q8_0 scale d = amax/127 <= 63/127 (stored as f16): each value comes back within d/2 plus
  // 127 * d's f16 rounding (2^-11 relative), under 0.3. Row 0 or 2 instead would be off by far more.
  for (int k = 0; k < 64; ++k) EXPECT_NEAR((*r)[k], v[64 + k], 0.3f) << k;
}

TEST(EnvInt, TakesIntegersInRangeOnly) {
  const char* name = "LOOM_TEST_ENV_INT";
  unsetenv(name);
  EXPECT_EQ(env_int(name, 7, 1, 10), 7);
  setenv(name, "4", 1);
  EXPECT_EQ(env_int(name, 7, 1, 10), 4);
  setenv(name, "11", 1);
  EXPECT_EQ(env_int(name, 7, 1, 10), 7);
  setenv(name, "4x", 1);
  EXPECT_EQ(env_int(name, 7, 1, 10), 7);
  setenv(name, "", 1);
  EXPECT_EQ(env_int(name, 7, 1, 10), 7);
  unsetenv(name);
}

}  // namespace
}  // namespace loom
