// Thread pool for graph compute: persistent workers, spin-then-wait barrier.
#pragma once

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace loom::cpu {

/// Runs one job on n threads (the caller is thread 0). Workers spin briefly between jobs and
/// barriers before sleeping on an atomic wait, so back-to-back nodes cost no syscalls.
class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  /// Calls job(ith) on every thread 0..size()-1 and returns when all finished.
  void run(const std::function<void(int ith)>& job);
  /// All threads of the current job wait here until each arrived.
  void barrier();

 private:
  void worker_loop(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint32_t> job_generation_{0};
  std::atomic<int> job_done_{0};
  std::atomic<bool> stop_{false};
  // barrier state
  std::atomic<int> barrier_count_{0};
  std::atomic<uint32_t> barrier_generation_{0};
};

}  // namespace loom::cpu
