// `loom bench`: llama-bench's flags and tables (bench.h), plus --exec sweeps of the graph executor.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench.h"
#include "commands.h"
#include "generate.h"

namespace loom::app {

Status run_bench_test(llm::Context& ctx, Backend& backend, const BenchTest& test,
                      const BenchRunOptions& options, BenchResult& out) {
  if (test.n_prompt < 0 || test.n_gen < 0 || test.n_tokens() == 0)
    return make_error(StatusCode::invalid_argument,
                      "bench: a test needs prompt or generated tokens (got p {}, n {})", test.n_prompt,
                      test.n_gen);
  if (test.n_depth < 0)
    return make_error(StatusCode::invalid_argument, "bench: depth {} must be >= 0", test.n_depth);
  if (test.n_ctx() > ctx.n_ctx())
    return make_error(StatusCode::invalid_argument,
                      "bench: {} needs {} tokens of context; the context has {}", test.name(),
                      test.n_ctx(), ctx.n_ctx());
  if (options.repetitions < 1)
    return make_error(StatusCode::invalid_argument, "bench: repetitions {} must be >= 1",
                      options.repetitions);

  // Random ids: what the tokens say does not change the work of a dense model's forward pass.
  std::mt19937 rng(options.seed);
  std::uniform_int_distribution<int32_t> pick(0, ctx.n_vocab() - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(test.n_ctx()));
  for (auto& t : tokens) t = pick(rng);

  using clock = std::chrono::steady_clock;
  auto once = [&](double& ns) -> Status {
    ctx.kv_cache_clear();
    ns = 0.0;
    const int d = test.n_depth;
    if (d > 0) {  // the depth: cached before the timed part, as llama-bench fills it
      auto r = ctx.decode(std::span<const int32_t>(tokens.data(), static_cast<size_t>(d)), 0);
      if (!r) return r.status();
    }
    if (test.n_prompt > 0) {
      const auto t0 = clock::now();
      auto r = ctx.decode(std::span<const int32_t>(&tokens[static_cast<size_t>(d)], static_cast<size_t>(test.n_prompt)), d);
      ns += std::chrono::duration<double, std::nano>(clock::now() - t0).count();
      if (!r) return r.status();
    }
    for (int i = 0; i < test.n_gen; ++i) {
      const int pos = d + test.n_prompt + i;
      const ExecCounters c0 = exec_counters(backend);
      const auto t0 = clock::now();
      auto r = ctx.decode(std::span<const int32_t>(&tokens[static_cast<size_t>(pos)], 1), pos);
      const double step_ns = std::chrono::duration<double, std::nano>(clock::now() - t0).count();
      ns += step_ns;
      if (!r) return r.status();
      out.tg_split.add(step_ns, ctx.stats(), c0, exec_counters(backend));
    }
    return {};
  };

  double ns = 0.0;
  // Two warm-up runs: the GPU executor records a structure's graph on its second sighting, so with
  // one the first repetition paid for the recording (8B Q4_0 pp512 on the H200: 36.8 ms, then
  // 28.2 ms for each replay).
  if (options.warmup)
    for (int w = 0; w < 2; ++w) LOOM_TRY(once(ns));
  reset_exec_counters(backend);
  out.samples_ns.clear();
  out.tg_split = {};
  for (int rep = 0; rep < options.repetitions; ++rep) {
    LOOM_TRY(once(ns));
    out.samples_ns.push_back(ns);
  }
  out.counters = exec_counters(backend);
  ctx.kv_cache_clear();
  return {};
}

namespace {

struct BenchOptions {
  std::vector<std::string> models;
  std::vector<int> n_prompt = {512};
  std::vector<int> n_gen = {128};
  std::vector<std::string> pp_tg;  // "P,N"
  std::vector<int> n_depth = {0};
  int repetitions = 5;
  int n_gpu_layers = 99;
  std::vector<int> n_tensor_parallel = {1};  // -tp 1,2,4: each model at each rank count
  int n_threads = 0;
  int n_batch = 0;  // -ub (0: GenerateOptions::n_batch's default)
  std::string output = "md";
  std::string flash_attn;
  std::string backend;
  std::string numerics;
  std::string exec;
  bool no_warmup = false;
  // Batched mode (llama-batched-bench), on when npl is given.
  std::vector<int> npp = {128};
  std::vector<int> ntg = {128};
  std::vector<int> npl;
  std::string trace_path;  // batched mode: a Chrome trace of one decode step per test
};

int fail(const Status& s) {
  std::fflush(stdout);
  std::fprintf(stderr, "loom: %s\n", s.to_string().c_str());
  return 1;
}

Result<std::vector<BenchTest>> collect_tests(const BenchOptions& o) {
  std::vector<BenchTest> tests;
  for (int p : o.n_prompt)
    if (p > 0) tests.push_back({p, 0});
  for (int n : o.n_gen)
    if (n > 0) tests.push_back({0, n});
  for (const std::string& pg : o.pp_tg) {
    BenchTest t;
    char tail = 0;
    if (std::sscanf(pg.c_str(), "%d,%d%c", &t.n_prompt, &t.n_gen, &tail) != 2 || t.n_prompt < 0 ||
        t.n_gen < 0 || t.n_tokens() == 0)
      return make_error(StatusCode::invalid_argument, "-pg '{}': expected PROMPT,GEN (e.g. 512,128)", pg);
    tests.push_back(t);
  }
  if (tests.empty())
    return make_error(StatusCode::invalid_argument, "bench: no tests (every -p and -n is 0 and no -pg)");
  // Every test at every depth, depths innermost (llama-bench's order).
  std::vector<BenchTest> all;
  for (const BenchTest& t : tests)
    for (int d : o.n_depth) {
      BenchTest td = t;
      td.n_depth = d;
      all.push_back(td);
    }
  return all;
}

// The session every bench mode opens on a model: -ngl > 0 takes the GPU when one is usable (below
// the layer count: the last -ngl layers), else the CPU (the backend column says which ran).
GenerateOptions session_options(const BenchOptions& o, const std::string& path, int n_tp, int n_ctx,
                                int n_batch) {
  GenerateOptions g;
  g.model_path = path;
  g.n_threads = o.n_threads;
  g.n_ctx = n_ctx;
  g.n_batch = n_batch;
  g.backend = o.backend;
  g.numerics = o.numerics;
  g.n_gpu_layers = o.n_gpu_layers;
  g.n_tensor_parallel = n_tp;
  g.gpu_if_usable = o.backend.empty() && o.n_gpu_layers > 0;
  return g;
}

// Every model at every -tp rank count, models outermost.
std::vector<std::pair<std::string, int>> model_runs(const BenchOptions& o) {
  std::vector<std::pair<std::string, int>> runs;
  for (const std::string& path : o.models)
    for (int tp : o.n_tensor_parallel) runs.emplace_back(path, tp);
  return runs;
}

// llama-batched-bench: every (npp, ntg, npl) in that nesting, one table per model, over a paged
// KV cache sized for the largest test (n_kv_max in the header: its cells, whole blocks per sequence).
int run_batched_bench(const BenchOptions& o) {
  std::vector<BatchedBenchTest> tests;
  int n_ctx = 1, max_pl = 1;
  const int block = llm::ContextParams{}.kv_block_size;  // each sequence holds whole blocks
  for (int pp : o.npp)
    for (int tg : o.ntg)
      for (int pl : o.npl) {
        tests.push_back(BatchedBenchTest{pp, tg, pl});
        n_ctx = std::max(n_ctx, pl * ((pp + tg + block - 1) / block * block));
        max_pl = std::max(max_pl, pl);
      }
  const BenchFormat format = o.output == "json" ? BenchFormat::json : BenchFormat::md;
  if (o.output == "csv") fmt::print(stderr, "loom: bench: batched mode prints md or json; md it is\n");
  for (const auto& [path, n_tp] : model_runs(o)) {
    // one pass per decode step, however many sequences
    GenerateOptions g = session_options(o, path, n_tp, n_ctx, o.n_batch);
    g.n_batch_at_least = max_pl;
    g.kv_cache = llm::KvCacheKind::paged;
    g.n_seq_max = max_pl;  // sliding-window layers keep a ring for that many sequences, as a server's would
    std::string backend_name;
    auto session = open_generate_session(g, backend_name);
    if (!session) return fail(session.status());
    llm::Context& ctx = *session->context;
    const BenchModelInfo info = bench_model_info(*session->model, path);
    if (format == BenchFormat::md)
      fmt::print("\n{}: {} on {}: n_kv_max = {}, n_batch = {}, n_threads = {}, paged KV cache\n\n", path,
                 info.type, backend_name, ctx.n_ctx(), ctx.n_batch(), o.n_threads);
    std::vector<BatchedBenchResult> results;
    Backend& backend = executing_backend(*session);
    for (const BatchedBenchTest& t : tests) {
      BatchedBenchResult r;
      const std::string trace =
          o.trace_path.empty() ? std::string{} : fmt::format("{}-pl{}.json", o.trace_path, t.n_pl);
      if (auto s = run_batched_bench_test(ctx, t, !o.no_warmup, 1234, r, &backend, trace); !s.ok())
        return fail(make_error(s.code(), "bench: {} npp {} ntg {} npl {}: {}", path, t.n_pp, t.n_tg, t.n_pl,
                               s.message()));
      fmt::print(stderr, "loom: bench: {} {} pp {} tg {} pl {}: S_PP {:.2f} t/s, S_TG {:.2f} t/s\n",
                 info.type, backend_name, t.n_pp, t.n_tg, t.n_pl, r.speed_pp(), r.speed_tg());
      if (!r.tp_busy_s.empty() && r.n_tg_passes > 0) {  // where a split step's time goes
        std::string ranks;
        for (size_t k = 0; k < r.tp_busy_s.size(); ++k)
          ranks += fmt::format("{}rank {} {:.3f} ms (from +{:.3f})", k ? ", " : "", k,
                               1e3 * r.tp_busy_s[k] / r.n_tg_passes, 1e3 * r.tp_lag_s[k] / r.n_tg_passes);
        fmt::print(stderr, "loom: bench: -tp {} pl {}: decode pass {:.3f} ms; ranks' parts: {}\n", r.tp_busy_s.size(),
                   t.n_pl, 1e3 * r.t_tg_s / r.n_tg_passes, ranks);
      }
      results.push_back(r);
    }
    std::fflush(stderr);
    const std::string report = format_batched_bench(results, format);
    std::fwrite(report.data(), 1, report.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

int run_bench(const BenchOptions& o) {
  if (o.models.empty())
    return fail(make_error(StatusCode::invalid_argument, "bench: no model (-m FILE[,FILE...])"));
  if (!o.npl.empty()) return run_batched_bench(o);
  auto tests = collect_tests(o);
  if (!tests) return fail(tests.status());
  std::vector<ExecConfig> configs = {ExecConfig{"", std::nullopt}};
  if (!o.exec.empty()) {
    auto parsed = parse_exec_configs(o.exec);
    if (!parsed) return fail(parsed.status());
    configs = std::move(*parsed);
  }
  if (o.flash_attn == "0" || o.flash_attn == "off")
    fmt::print(stderr, "loom: bench: -fa {}: Loom always uses flash attention; the flag is ignored\n",
               o.flash_attn);
  const BenchFormat format = o.output == "json"  ? BenchFormat::json
                             : o.output == "csv" ? BenchFormat::csv
                                                 : BenchFormat::md;
  int n_ctx = 1;
  for (const BenchTest& t : *tests) n_ctx = std::max(n_ctx, t.n_ctx());

  BenchRunOptions run;
  run.repetitions = o.repetitions;
  run.warmup = !o.no_warmup;
  std::vector<BenchResult> results;
  for (const auto& [path, n_tp] : model_runs(o)) {
    GenerateOptions g = session_options(o, path, n_tp, n_ctx, o.n_batch);
    std::string backend_name;
    auto session = open_generate_session(g, backend_name);
    if (!session) return fail(session.status());  // without a usable GPU it noted the CPU fallback
    // Executor options and counters: the GPU's when the layers are split.
    Backend& backend = executing_backend(*session);
    llm::Context& ctx = *session->context;
    const BenchModelInfo info = bench_model_info(*session->model, path);
    bool warned_ignored = false;
    for (const ExecConfig& config : configs) {
      if (config.options) {
        set_exec_options(backend, *config.options);
        if (!warned_ignored && !same_exec_options(exec_options(backend), *config.options)) {
          fmt::print(stderr,
                     "loom: bench: the {} backend does not take executor options ({} asked, it reports {})\n",
                     backend_name, exec_options_string(*config.options),
                     exec_options_string(exec_options(backend)));
          warned_ignored = true;
        }
      }
      for (const BenchTest& test : *tests) {
        const std::string label = config.name.empty() ? std::string() : fmt::format(" [{}]", config.name);
        BenchResult r;
        r.model = info;
        r.backend = backend_name;
        r.n_gpu_layers = o.n_gpu_layers;
        r.numerics = numerics_name(backend.numerics());
        r.n_threads = o.n_threads;
        r.n_batch = ctx.n_batch();
        r.exec = config.name;
        r.exec_options = exec_options_string(exec_options(backend));
        r.test = test;
        if (auto s = run_bench_test(ctx, backend, test, run, r); !s.ok())
          return fail(make_error(s.code(), "bench: {} {}{}: {}", path, test.name(), label, s.message()));
        const TsStats st = r.stats();
        fmt::print(stderr, "loom: bench: {} {}{} {}: {:.2f} ± {:.2f} t/s (median {:.2f})\n", info.type,
                   backend_name, label, test.name(), st.mean, st.stddev, st.median);
        if (r.tg_split.steps > 0)  // where a generated token's time went
          fmt::print(stderr, "loom: bench: {} {}\n", test.name(), r.tg_split.to_string());
        results.push_back(std::move(r));
      }
    }
  }
  std::fflush(stderr);
  const std::string report = format_bench(results, format);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench", "Measure prompt processing (ppN) and generation (tgN) speed, as llama-bench does");
  cmd->add_option("-m,--model", o->models, "GGUF model file(s), comma-separated")->delimiter(',')->required();
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens of each pp test, comma-separated (0: none)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", o->n_gen, "Generated tokens of each tg test, comma-separated (0: none)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--pp-tg", o->pp_tg, "Combined test PROMPT,GEN (-pg; repeatable)");
  cmd->add_option("-d,--n-depth", o->n_depth,
                  "Tokens already in the KV cache before each test, comma-separated (filled untimed)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-r,--repetitions", o->repetitions, "Measured repetitions of each test")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--n-gpu-layers", o->n_gpu_layers,
                  "-ngl: 0 runs on the CPU; > 0 on the GPU when one is usable (below the layer count: "
                  "that many last layers, the rest on the CPU)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("-t,--threads", o->n_threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--ubatch-size", o->n_batch, fmt::format("-ub: prompt tokens per forward pass (default {} on CUDA, {} on the CPU)",
                                                 kLongPassTokens, kPassTokens))
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("-o,--output", o->output, "Output format: md, json or csv")
      ->check(CLI::IsMember({"md", "json", "csv"}));
  cmd->add_option("--flash-attn", o->flash_attn, "-fa: accepted for llama-bench compatibility (always on)")
      ->check(CLI::IsMember({"0", "1", "on", "off", "auto"}));
  cmd->add_option("--backend", o->backend, "Backend by name (cpu, cuda); overrides -ngl");
  cmd->add_option("--tensor-parallel", o->n_tensor_parallel,
                  "Split each model over N GPUs (-tp), comma-separated: -tp 1,2,4 runs every test at each")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  add_numerics_flag(*cmd, o->numerics);
  cmd->add_option(
      "--exec", o->exec,
      "Executor configurations to compare, comma-separated: serialize, graph, concurrency, fusion, "
      "reorder, all, default");
  cmd->add_flag("--no-warmup", o->no_warmup, "Skip the warm-up run of each test");
  cmd->add_option("--trace", o->trace_path,
                  "Batched mode: write a Chrome trace (per-dispatch GPU times) of each test's third decode "
                  "step to PREFIX-plN.json");
  cmd->add_option("--npl", o->npl,
                  "-npl: batched mode (llama-batched-bench): sequences decoded together, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--npp", o->npp, "-npp: batched mode: prompt tokens of each sequence, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--ntg", o->ntg, "-ntg: batched mode: generated tokens of each sequence, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  out.push_back({cmd, [o] { return run_bench(*o); }});
}

}  // namespace loom::app
