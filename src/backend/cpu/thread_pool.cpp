#include "thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_CPU_RELAX() _mm_pause()
#else
#define LOOM_CPU_RELAX() ((void)0)
#endif

namespace loom::cpu {

namespace {
// About 50 µs of spinning before sleeping: long enough to cover the gap between two nodes,
// short enough not to burn a core while the caller is idle, or one another thread needs when
// there are more threads than free cores. Bounded by time, not by a count of pause
// instructions: a pause takes ~10 cycles on older x86 cores and ~140 on Skylake and later
// (20000 of them measured 260 µs on this project's Xeon build machine).
constexpr auto kSpinTime = std::chrono::microseconds(50);
constexpr int kSpinsPerClockRead = 64;

template <typename T>
void spin_then_wait(const std::atomic<T>& value, T old) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < kSpinsPerClockRead; ++i) {
      if (value.load(std::memory_order_acquire) != old) return;
      LOOM_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  while (value.load(std::memory_order_acquire) == old) value.wait(old, std::memory_order_acquire);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  job_generation_.fetch_add(1, std::memory_order_acq_rel);
  job_generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run(const std::function<void(int)>& job) {
  if (n_threads_ == 1) {
    job(0);
    return;
  }
  job_ = &job;
  job_done_.store(0, std::memory_order_relaxed);
  job_generation_.fetch_add(1, std::memory_order_acq_rel);
  job_generation_.notify_all();
  job(0);
  // wait for the workers
  for (;;) {
    int done = job_done_.load(std::memory_order_acquire);
    if (done == n_threads_ - 1) break;
    spin_then_wait(job_done_, done);
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int ith) {
  uint32_t seen = 0;
  for (;;) {
    spin_then_wait(job_generation_, seen);
    seen = job_generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(ith);
    job_done_.fetch_add(1, std::memory_order_acq_rel);
    job_done_.notify_one();
  }
}

void ThreadPool::barrier() {
  if (n_threads_ == 1) return;
  const uint32_t gen = barrier_generation_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_generation_.fetch_add(1, std::memory_order_acq_rel);
    barrier_generation_.notify_all();
    return;
  }
  spin_then_wait(barrier_generation_, gen);
}

}  // namespace loom::cpu
