// `loom bench`: llama-bench's tests and tables, plus a sweep over graph-executor configurations.
//
// Tests, as llama-bench runs them:
//   ppP     one decode call of P random tokens into an empty KV cache;
//   tgN     N one-token decode calls from an empty cache (random tokens, no sampling);
//   ppP+tgN both, timed together.
// Only the decode calls are timed. Each test runs once as a warm-up (not counted; CUDA graphs get
// built there) and then `repetitions` times; t/s is reported as mean ± sample stdev over the
// repetitions (llama-bench's statistic) and, for --exec sweeps, the median. The backend's
// executor counters are reset after the warm-up, so they cover exactly the measured repetitions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/exec.h"
#include "loom/llm.h"
#include "loom/status.h"

namespace loom::app {

/// One executor configuration of `--exec`.
struct ExecConfig {
  std::string name;                    ///< serialize, graph, concurrency, fusion, reorder, all, default
  std::optional<ExecOptions> options;  ///< nullopt ("default"): leave the backend's options alone
};

/// Parses a comma-separated list of configuration names:
///   serialize   ExecOptions{serialize = true}
///   graph       CUDA graph only (concurrency, fusion, reorder, pdl off)
///   concurrency graph + concurrency
///   fusion      graph + concurrency + fusion
///   reorder     graph + concurrency + fusion + reorder
///   all         everything, PDL included
///   default     whatever the backend has (its defaults with the LOOM_EXEC_* environment)
/// n_cb and lookahead come from the environment (exec_options_from_env). An unknown or empty name
/// is an invalid_argument error listing the known ones.
Result<std::vector<ExecConfig>> parse_exec_configs(std::string_view list);

/// Whether two option sets switch the same techniques with the same parameters.
bool same_exec_options(const ExecOptions& a, const ExecOptions& b);

/// One test: n_prompt > 0 and/or n_gen > 0.
struct BenchTest {
  int n_prompt = 0;
  int n_gen = 0;
  /// Tokens already in the KV cache when the timed part starts (llama-bench's -d): filled before each
  /// repetition, not timed.
  int n_depth = 0;
  /// "pp512", "tg128", "pp512+tg128"; with a depth, llama-bench's " @ d4096" after it.
  std::string name() const;
  /// Timed tokens (the depth is not counted).
  int n_tokens() const { return n_prompt + n_gen; }
  /// Context cells the test needs: the depth and the timed tokens.
  int n_ctx() const { return n_depth + n_prompt + n_gen; }
};

/// Mean, sample standard deviation and median of tokens per second.
struct TsStats {
  double mean = 0.0;
  double stddev = 0.0;  ///< 0 with fewer than two samples
  double median = 0.0;
};
/// t/s of each sample (n_tokens / seconds) and their statistics.
TsStats ts_stats(const std::vector<double>& samples_ns, int n_tokens);

/// The model columns of a result (same for every test of one model).
struct BenchModelInfo {
  std::string filename;  ///< as given on the command line
  std::string type;      ///< "llama 1B Q4_0": architecture, size label, main weight type
  uint64_t size = 0;     ///< weight bytes
  uint64_t n_params = 0;
};
/// The info of a loaded model (`filename` as given).
BenchModelInfo bench_model_info(const llm::Model& model, const std::string& filename);

/// Where one-token decode steps' time went, summed over steps (ns): their wall time and its host parts
/// from the context's DecodeStats (the floor of a step: issue 14), and the executor's counters over
/// those calls only (host_ns, and device_ns over device_timed replays with LOOM_EXEC_GPU_TIME=1).
struct TokenSplit {
  double wall_ns = 0, inputs_ns = 0, compute_ns = 0, readback_ns = 0;
  uint64_t steps = 0;
  uint64_t host_ns = 0, device_ns = 0, device_timed = 0;
  /// Adds one step: its wall time, the context's statistics of it, the executor's counters around it.
  void add(double step_wall_ns, const llm::DecodeStats& st, const ExecCounters& before, const ExecCounters& after);
  /// A step's parts in microseconds (zeros before any step): what to_string and the JSON report show.
  struct PerStep {
    double wall, inputs, compute, readback, other;
  };
  PerStep per_step_us() const;
  /// "a generated token: W us = graph inputs I + compute C (host in it H, device D) + read-back R + other O"
  std::string to_string() const;
};

/// One row of the report.
struct BenchResult {
  BenchModelInfo model;
  std::string backend;  ///< registry name: cpu, cuda
  std::string numerics;  ///< numerics_name of the mode the (GPU) backend runs in
  int n_gpu_layers = 0;
  int n_threads = 0;
  int n_batch = 0;
  std::string exec;          ///< configuration name; empty without --exec
  std::string exec_options;  ///< exec_options_string of what the backend reports it runs with
  BenchTest test;
  std::vector<double> samples_ns;  ///< time in decode calls, per measured repetition
  ExecCounters counters;           ///< summed over the measured repetitions
  /// The generated tokens' decode calls, summed over the measured repetitions (TokenSplit).
  TokenSplit tg_split;
  TsStats stats() const { return ts_stats(samples_ns, test.n_tokens()); }
  /// Tokens decoded in the measured repetitions.
  uint64_t tokens() const { return samples_ns.size() * static_cast<uint64_t>(test.n_tokens()); }
};

/// How run_bench_test runs.
struct BenchRunOptions {
  int repetitions = 5;
  bool warmup = true;
  uint32_t seed = 1234;  ///< random tokens
};

/// Runs `test` on `ctx` (whose model's backend is `backend`): fills samples_ns and counters of
/// `out`; leaves the other fields alone. The context must hold test.n_tokens() tokens; its KV cache
/// is cleared before every repetition.
Status run_bench_test(llm::Context& ctx, Backend& backend, const BenchTest& test,
                      const BenchRunOptions& options, BenchResult& out);

/// One test of llama-batched-bench's: `n_pl` sequences, each prefilled with `n_pp` random tokens,
/// then `n_tg` steps that decode one token of every sequence together.
struct BatchedBenchTest {
  int n_pp = 128;
  int n_tg = 128;
  int n_pl = 1;
  /// KV cells the test fills: every sequence's prompt and generated tokens.
  int n_kv() const { return n_pl * (n_pp + n_tg); }
};

/// One row of the batched report (llama-batched-bench's columns).
struct BatchedBenchResult {
  BatchedBenchTest test;
  double t_pp_s = 0.0;  ///< prefilling every sequence's prompt
  double t_tg_s = 0.0;  ///< the n_tg decode steps
  /// Tensor parallelism: each rank's part of the decode steps (llm::DecodeStats::tp_rank_busy_ns) and
  /// its start after the hand-off, summed over them (seconds); empty on one device.
  std::vector<double> tp_busy_s, tp_lag_s;
  int n_tg_passes = 0;  ///< decode passes in t_tg_s
  double speed_pp() const { return t_pp_s > 0 ? test.n_pl * static_cast<double>(test.n_pp) / t_pp_s : 0.0; }
  double speed_tg() const { return t_tg_s > 0 ? test.n_pl * static_cast<double>(test.n_tg) / t_tg_s : 0.0; }
  double speed() const { return t_pp_s + t_tg_s > 0 ? test.n_kv() / (t_pp_s + t_tg_s) : 0.0; }
};

/// Runs `test` on `ctx` once (after a warm-up run unless `warmup` is false): each sequence's prompt
/// alone, then n_tg Context::decode_batch steps over all of them (in passes of up to n_batch
/// sequences). The context needs room for test.n_kv() cells; a paged KV cache holds exactly that.
/// The cache is cleared before and after. With a non-empty `trace_path`, the measured run's third
/// decode step's GPU dispatches are written there as a Chrome trace (capture_next_compute on `backend`).
Status run_batched_bench_test(llm::Context& ctx, const BatchedBenchTest& test, bool warmup, uint32_t seed,
                              BatchedBenchResult& out, Backend* backend = nullptr,
                              const std::string& trace_path = {});

enum class BenchFormat { md, json, csv };
/// md: llama-bench's markdown table (with the executor columns when any result has `exec`);
/// json: an array of objects with llama-bench's field names plus Loom's; csv: one header line and
/// one line per result, every field quoted.
std::string format_bench(const std::vector<BenchResult>& results, BenchFormat format);

/// md: llama-batched-bench's table (PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, T s, S t/s);
/// json: one object per line with its field names (pp, tg, pl, n_kv, t_pp, speed_pp, t_tg,
/// speed_tg, t, speed).
std::string format_batched_bench(const std::vector<BatchedBenchResult>& results, BenchFormat format);

}  // namespace loom::app
