// mul_mat throughput on the CPU backend: weights [k, m] of each dtype times n activation columns.
//
//   loom-bench-mul-mat [--benchmark_filter=q4_K] ; LOOM_BENCH_THREADS sets the thread count (default 2)
//
// Reports GFLOP/s (2*m*n*k per run) and weight GB/s (weight bytes per run): a decode step (n = 1)
// should approach memory bandwidth, a batch (n = 32) measures the integer dot kernels.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "loom/cpu.h"
#include "loom/planner.h"

namespace {

using namespace loom;

int bench_threads() {
  const char* v = std::getenv("LOOM_BENCH_THREADS");
  return v ? std::max(1, std::atoi(v)) : 2;
}

struct MulMatSetup {
  Graph graph;
  GraphAllocation alloc;
  std::unique_ptr<Backend> backend;
  Tensor* a = nullptr;
};

std::unique_ptr<MulMatSetup> make_setup(DType type, int64_t k, int64_t m, int64_t n) {
  auto s = std::make_unique<MulMatSetup>();
  s->a = s->graph.weight(type, {k, m, 1, 1}, "w");
  Tensor* b = s->graph.input(DType::f32, {k, n, 1, 1}, "x");
  Tensor* y = mul_mat(s->graph, s->a, b);
  s->graph.mark_output(y);
  auto alloc = allocate_graph(s->graph, cpu_buffer_type());
  if (!alloc.ok()) return nullptr;
  s->alloc = std::move(alloc.value());
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(k * m)), x(static_cast<size_t>(k * n));
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng) * 50;
  if (!tensor_from_floats(s->a, w.data(), k * m).ok() || !tensor_from_floats(b, x.data(), k * n).ok())
    return nullptr;
  s->backend = make_cpu_backend(bench_threads());
  return s;
}

void bm_mul_mat(benchmark::State& state, DType type) {
  const int64_t k = 4096, m = 4096, n = state.range(0);
  auto s = make_setup(type, k, m, n);
  if (!s) {
    state.SkipWithError("setup failed");
    return;
  }
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = s->backend->compute(s->graph);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      return;
    }
  }
  const double runs = static_cast<double>(state.iterations());
  const double flops = 2.0 * static_cast<double>(k * m * n);
  const double bytes = static_cast<double>(s->a->nbytes());
  state.counters["GFLOP/s"] = benchmark::Counter(flops * runs / 1e9, benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] = benchmark::Counter(bytes * runs / 1e9, benchmark::Counter::kIsRate);
  // the fastest run: on a shared machine the mean mostly measures the other tenants
  state.counters["best_GFLOP/s"] = flops / best / 1e9;
  state.counters["best_GB/s"] = bytes / best / 1e9;
  state.SetLabel(cpu::vec_dot_isa());
}

void register_all() {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k}) {
    benchmark::RegisterBenchmark((std::string("mul_mat_4096x4096/") + dtype_name(t)).c_str(), bm_mul_mat, t)
        ->Arg(1)
        ->Arg(32)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
