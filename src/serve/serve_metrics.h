// The server's counters and latency histograms, written out in Prometheus' text format.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "loom/exec.h"

namespace loom::serve {

/// A Prometheus histogram with fixed upper bounds (seconds, or counts). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double value);
  /// The `_bucket`, `_sum` and `_count` lines of metric `name`, with HELP and TYPE.
  std::string format(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  ///< per bucket (not cumulative); the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

/// Everything /metrics reports that is counted as it happens (gauges are read when asked).
struct Metrics {
  std::atomic<uint64_t> http_requests{0};            ///< every HTTP request
  std::array<std::atomic<uint64_t>, 6> responses{};  ///< by status class: 1xx..5xx (index 1..5)
  std::atomic<uint64_t> requests_rejected{0};        ///< 429: queue full
  std::atomic<uint64_t> requests_finished{0};
  std::atomic<uint64_t> requests_cancelled{0};
  std::atomic<uint64_t> requests_timed_out{0};
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> prompt_tokens_cached{0};
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<uint64_t> steps{0};               ///< the worker's generator steps
  std::atomic<uint64_t> forward_passes{0};      ///< their forward passes (a chunk alone is one more)
  std::atomic<uint64_t> prompt_chunk_steps{0};  ///< steps that computed a prompt chunk
  std::atomic<uint64_t> mixed_steps{0};         ///< of which in the running requests' pass
  std::atomic<uint64_t> device_sampled{0};      ///< tokens sampled in a forward pass's graph
  std::atomic<uint64_t> host_sampled{0};        ///< tokens sampled on the host from logits read back
  std::atomic<uint64_t> graph_builds{0};        ///< forward passes that built their graph (new shapes)
  std::atomic<uint64_t> decode_host_ns{0};      ///< host time on the graphs of steps without a prompt chunk
  std::atomic<uint64_t> prompt_host_ns{0};      ///< ... and of steps with one
  Histogram time_to_first_token{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram inter_token{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  Histogram request_duration{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  /// Running requests decoded together per step (one forward pass up to n_batch of them).
  Histogram batch_sequences{{1, 2, 4, 8, 16, 32, 64, 128, 256}};
  /// A step's wall time (the generator's step: forward passes, sampling, read-back), split by whether
  /// it computed a prompt chunk: what the running requests' inter-token times are made of.
  static std::vector<double> step_bounds() {
    return {0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.1, 0.25};
  }
  Histogram decode_step{step_bounds()};
  Histogram prompt_step{step_bounds()};
  /// The backend executor's counters since the server started, as of the last step (the worker
  /// copies them; /metrics reads them on another thread).
  void set_exec(const ExecCounters& c) {
    std::lock_guard lock(exec_mu_);
    exec_ = c;
  }
  ExecCounters exec() const {
    std::lock_guard lock(exec_mu_);
    return exec_;
  }

 private:
  mutable std::mutex exec_mu_;
  ExecCounters exec_;
};

}  // namespace loom::serve
