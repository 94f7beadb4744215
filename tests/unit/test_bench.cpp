// `loom bench` (apps/loom/bench.h): the --exec names map to the documented switches, the t/s
// statistics match values worked out by hand, and pp/tg tests on a tiny synthetic model time every
// repetition and come out as a llama-bench markdown table, JSON that parses, and CSV.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

using app::BenchResult;
using app::BenchTest;

TEST(BenchExecConfigs, NamesMapToCumulativeSwitches) {
  auto c = app::parse_exec_configs("serialize,graph,concurrency,fusion,reorder,all,default");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->size(), 7u);
  EXPECT_EQ((*c)[0].name, "serialize");
  ASSERT_TRUE((*c)[0].options);
  EXPECT_TRUE((*c)[0].options->serialize);
  EXPECT_EQ(exec_options_string(*(*c)[0].options), "serialize");
  // graph .. all switch on one more technique each, in this order
  const char* expected[] = {"graph", "graph+concurrency", "graph+concurrency+fusion",
                            "graph+concurrency+fusion+reorder", "graph+concurrency+fusion+reorder+pdl"};
  for (int i = 0; i < 5; ++i) {
    const auto& cfg = (*c)[static_cast<size_t>(i + 1)];
    ASSERT_TRUE(cfg.options) << cfg.name;
    EXPECT_FALSE(cfg.options->serialize) << cfg.name;
    EXPECT_EQ(exec_options_string(*cfg.options), expected[i]) << cfg.name;
  }
  EXPECT_FALSE((*c)[6].options.has_value());  // default: the backend's own
}

TEST(BenchExecConfigs, UnknownAndEmptyNamesAreErrors) {
  for (const char* bad : {"graph,nope", "", "graph,", "Graph"}) {
    auto c = app::parse_exec_configs(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(c.status().message().find("serialize, graph"), std::string::npos) << c.status().message();
  }
}

TEST(BenchExecConfigs, SameOptions) {
  ExecOptions a, b;
  EXPECT_TRUE(app::same_exec_options(a, b));
  b.fusion = false;
  EXPECT_FALSE(app::same_exec_options(a, b));
  a.serialize = b.serialize = true;  // serialize overrides the rest
  EXPECT_TRUE(app::same_exec_options(a, b));
}

TEST(BenchStats, MeanSampleStddevMedian) {
  // 10 tokens in 1 s, 2 s and 0.5 s: 10, 5 and 20 t/s.
  const auto s = app::ts_stats({1e9, 2e9, 0.5e9}, 10);
  EXPECT_NEAR(s.mean, 35.0 / 3.0, 1e-9);
  const double m = 35.0 / 3.0;
  const double var = ((10 - m) * (10 - m) + (5 - m) * (5 - m) + (20 - m) * (20 - m)) / 2.0;
  EXPECT_NEAR(s.stddev, std::sqrt(var), 1e-9);
  EXPECT_NEAR(s.median, 10.0, 1e-9);
  const auto one = app::ts_stats({4e9}, 8);
  EXPECT_NEAR(one.mean, 2.0, 1e-12);
  EXPECT_EQ(one.stddev, 0.0);
  EXPECT_NEAR(app::ts_stats({1e9, 3e9}, 6).median, 4.0, 1e-9);  // (6 + 2) / 2
}

TEST(BenchTestNames, LikeLlamaBench) {
  EXPECT_EQ((BenchTest{512, 0}).name(), "pp512");
  EXPECT_EQ((BenchTest{0, 128}).name(), "tg128");
  EXPECT_EQ((BenchTest{512, 128}).name(), "pp512+tg128");
  EXPECT_EQ((BenchTest{512, 0, 4096}).name(), "pp512 @ d4096");
  EXPECT_EQ((BenchTest{0, 128, 4096}).name(), "tg128 @ d4096");
  EXPECT_EQ((BenchTest{0, 128, 4096}).n_tokens(), 128);
  EXPECT_EQ((BenchTest{0, 128, 4096}).n_ctx(), 4224);
}

class Bench : public ModelFiles {};

// The trimmed cells of a markdown table line "| a | b |".
std::vector<std::string> md_cells(const std::string& line) {
  std::vector<std::string> cells;
  size_t start = line.find('|');
  while (start != std::string::npos) {
    const size_t end = line.find('|', start + 1);
    if (end == std::string::npos) break;
    std::string c = line.substr(start + 1, end - start - 1);
    c.erase(0, c.find_first_not_of(' '));
    c.erase(c.find_last_not_of(' ') + 1);
    cells.push_back(c);
    start = end;
  }
  return cells;
}

// The lines of a markdown table, each as its cells.
std::vector<std::vector<std::string>> md_table(const std::string& md) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(md);
  for (std::string line; std::getline(lines, line);) rows.push_back(md_cells(line));
  return rows;
}

TEST_F(Bench, TinyModelOnTheCpu) {
  const std::string file = model("tiny", "q8_0");
  LoadedModel l = open_cpu_model(file, 2, 16, 512);
  ASSERT_TRUE(l.ctx);
  const app::BenchModelInfo info = app::bench_model_info(*l.model, file);
  EXPECT_EQ(info.type.rfind("llama ", 0), 0u) << info.type;
  EXPECT_NE(info.type.find("Q8_0"), std::string::npos) << info.type;
  EXPECT_EQ(info.size, l.model->n_bytes());
  EXPECT_GT(info.n_params, 0u);

  app::BenchRunOptions run;
  run.repetitions = 3;
  std::vector<BenchResult> results;
  for (BenchTest t : {BenchTest{8, 0}, BenchTest{0, 4}, BenchTest{4, 2}}) {
    BenchResult r;
    r.model = info;
    r.backend = "cpu";
    r.numerics = numerics_name(l.backend->numerics());
    r.n_threads = 2;
    r.n_batch = l.ctx->n_batch();
    r.test = t;
    auto s = app::run_bench_test(*l.ctx, *l.backend, t, run, r);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(r.samples_ns.size(), 3u);
    for (double ns : r.samples_ns) EXPECT_GT(ns, 0.0);
    EXPECT_GT(r.stats().mean, 0.0);
    EXPECT_EQ(r.tokens(), 3u * static_cast<uint64_t>(t.n_tokens()));
    EXPECT_EQ(l.ctx->kv_cache_used(), 0);  // left empty for the next test
    results.push_back(std::move(r));
  }
  // A test larger than the context (16 cells) is refused before decoding.
  BenchResult big;
  auto s = app::run_bench_test(*l.ctx, *l.backend, BenchTest{12, 8}, run, big);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(big.samples_ns.empty());

  // markdown: header, alignment rule, one row per test with "mean ± stdev"
  const auto md = md_table(app::format_bench(results, app::BenchFormat::md));
  ASSERT_EQ(md.size(), 5u);
  const std::vector<std::string> header = {"model",   "size",     "params", "backend", "ngl",
                                           "threads", "numerics", "test",   "t/s"};
  EXPECT_EQ(md[0], header);  // CPU rows carry the thread count; no executor columns without --exec
  ASSERT_EQ(md[1].size(), header.size());
  EXPECT_EQ(md[1][0].find_first_not_of('-'), std::string::npos);  // text: left-aligned
  EXPECT_EQ(md[1][1].back(), ':');                                // numbers: right-aligned
  const char* names[] = {"pp8", "tg4", "pp4+tg2"};
  for (size_t i = 0; i < 3; ++i) {
    const auto& row = md[i + 2];
    ASSERT_EQ(row.size(), header.size());
    EXPECT_EQ(row[0], info.type);
    EXPECT_EQ(row[3], "CPU");
    EXPECT_EQ(row[5], "2");
    EXPECT_EQ(row[6], "exact");  // the CPU backend's default mode
    EXPECT_EQ(row[7], names[i]);
    const auto st = results[i].stats();
    EXPECT_EQ(row[8], fmt::format("{:.2f} ± {:.2f}", st.mean, st.stddev));
  }

  // json: llama-bench's fields, consistent with the samples
  auto j = nlohmann::json::parse(app::format_bench(results, app::BenchFormat::json));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["test"], "pp8");
  EXPECT_EQ(j[0]["n_prompt"], 8);
  EXPECT_EQ(j[1]["n_gen"], 4);
  EXPECT_EQ(j[0]["model_filename"], file);
  EXPECT_EQ(j[0]["backends"], "CPU");
  for (size_t i = 0; i < 3; ++i) {
    const auto st = results[i].stats();
    EXPECT_NEAR(j[i]["avg_ts"].get<double>(), st.mean, 1e-9 * st.mean);
    EXPECT_EQ(j[i]["samples_ns"].size(), 3u);
    EXPECT_EQ(j[i]["samples_ts"].size(), 3u);
    EXPECT_GT(j[i]["avg_ns"].get<uint64_t>(), 0u);
  }

  // csv: a header and one line per result, same number of fields
  const std::string csv = app::format_bench(results, app::BenchFormat::csv);
  std::istringstream cl(csv);
  std::vector<std::string> csv_lines;
  for (std::string line; std::getline(cl, line);) csv_lines.push_back(line);
  ASSERT_EQ(csv_lines.size(), 4u);
  EXPECT_EQ(csv_lines[0].rfind("model_filename,model_type,", 0), 0u) << csv_lines[0];
  auto fields = [](const std::string& line) {  // commas outside quotes + 1
    size_t n = 1;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) ++n;
    }
    return n;
  };
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(fields(csv_lines[i]), fields(csv_lines[0])) << csv_lines[i];
}

TEST_F(Bench, ExecColumnsShowConfigurationAndCounters) {
  BenchResult r;
  r.model.type = "llama 1B Q4_0";
  r.model.size = 700u << 20;
  r.model.n_params = 1'240'000'000;
  r.backend = "cuda";
  r.n_gpu_layers = 99;
  r.numerics = "fast";
  r.exec = "graph";
  r.test = BenchTest{0, 4};
  r.samples_ns = {4e7, 5e7};      // 100 and 80 t/s
  r.counters.kernels = 8 * 100;   // 8 tokens: 100 kernels each
  r.counters.host_ns = 8 * 2500;  // 2.5 us each
  r.counters.device_ns = 8 * 40000;  // LOOM_EXEC_GPU_TIME: 40 us each
  r.counters.device_timed = 7;
  r.counters.graph_builds = 1;
  r.counters.graph_replays = 7;
  const auto md = md_table(app::format_bench({r}, app::BenchFormat::md));
  ASSERT_EQ(md.size(), 3u);
  const std::vector<std::string> header = {"model",      "size",     "params",      "backend",
                                           "ngl",        "numerics", "exec",        "test", "t/s",
                                           "median t/s", "kern/tok", "host us/tok", "gpu us/tok", "graphs b/r"};
  EXPECT_EQ(md[0], header);  // no threads column: no CPU rows
  const std::vector<std::string> row = {"llama 1B Q4_0",
                                        "700.00 MiB",
                                        "1.24 B",
                                        "CUDA",
                                        "99",
                                        "fast",
                                        "graph",
                                        "tg4",
                                        "90.00 ± 14.14",  // 100 and 80 t/s
                                        "90.00",          // median of two
                                        "100.0",          // kernels per token
                                        "2.5",            // host us per token
                                        "40.0",           // device us per token
                                        "1/7"};
  EXPECT_EQ(md[2], row);
  auto j = nlohmann::json::parse(app::format_bench({r}, app::BenchFormat::json));
  EXPECT_DOUBLE_EQ(j[0]["kernels_per_token"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(j[0]["host_us_per_token"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j[0]["gpu_us_per_token"].get<double>(), 40.0);
  EXPECT_DOUBLE_EQ(j[0]["generated_token_us"]["wall"].get<double>(), 0.0);  // no split recorded
  r.tg_split = {8 * 50e3, 8 * 2e3, 8 * 45e3, 8 * 1e3, 8};  // 8 steps: 50 us = 2 + 45 + 1 + 2 other
  const auto split = nlohmann::json::parse(app::format_bench({r}, app::BenchFormat::json))[0]["generated_token_us"];
  EXPECT_DOUBLE_EQ(split["wall"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(split["graph_inputs"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(split["compute"].get<double>(), 45.0);
  EXPECT_DOUBLE_EQ(split["read_back"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(split["other"].get<double>(), 2.0);
  r.counters.device_timed = 0;  // not timed: a dash, 0 in JSON
  EXPECT_EQ(md_table(app::format_bench({r}, app::BenchFormat::md))[2][12], "-");
  const auto untimed = nlohmann::json::parse(app::format_bench({r}, app::BenchFormat::json));
  EXPECT_DOUBLE_EQ(untimed[0]["gpu_us_per_token"].get<double>(), 0.0);
  EXPECT_EQ(j[0]["graph_builds"], 1);
  EXPECT_EQ(j[0]["graph_replays"], 7);
  EXPECT_EQ(j[0]["numerics"], "fast");
}

// Batched mode (llama-batched-bench): every sequence prefilled, then decode steps over all of them;
// the table has its columns and its arithmetic (N_KV = B * (PP + TG), S = N_KV / T).
TEST_F(Bench, BatchedModeOnTheCpu) {
  const std::string file = model("tiny", "q8_0");
  auto backend = make_cpu_backend(2);
  auto m = Model::load(file, *backend, quiet_load());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ContextParams cp;
  cp.n_ctx = 4 * 16;  // a sequence of 12 tokens holds a whole block of 16
  cp.n_batch = 16;
  cp.kv_cache = KvCacheKind::paged;
  auto ctx = Context::create(**m, cp);
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  std::vector<app::BatchedBenchResult> results;
  for (int pl : {1, 4}) {
    app::BatchedBenchResult r;
    auto s = app::run_batched_bench_test(**ctx, app::BatchedBenchTest{8, 4, pl}, true, 1, r);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_GT(r.t_pp_s, 0.0);
    EXPECT_GT(r.t_tg_s, 0.0);
    EXPECT_EQ((*ctx)->kv_cache_used(), 0);
    results.push_back(r);
  }
  app::BatchedBenchResult too_big;
  EXPECT_FALSE(app::run_batched_bench_test(**ctx, app::BatchedBenchTest{8, 9, 4}, false, 1, too_big).ok());

  const auto rows = md_table(app::format_batched_bench(results, app::BenchFormat::md));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s",
                                               "S_TG t/s", "T s", "S t/s"}));
  EXPECT_EQ(rows[3][2], "4");
  EXPECT_EQ(rows[3][3], "48");
  const std::string json = app::format_batched_bench(results, app::BenchFormat::json);
  std::istringstream lines(json);
  std::string line;
  int n = 0;
  for (; std::getline(lines, line); ++n) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["n_kv"].get<int>(), j["pl"].get<int>() * 12);
    EXPECT_NEAR(j["speed"].get<double>(), j["n_kv"].get<double>() / j["t"].get<double>(),
                1e-3 * j["speed"].get<double>());
  }
  EXPECT_EQ(n, 2);
}

// TokenSplit adds each step's parts: the context's statistics and the executor's counter deltas.
TEST(BenchTokenSplit, AddsStepsAndNamesTheParts) {
  app::TokenSplit sp;
  llm::DecodeStats st;
  st.host_build_ns = 1000;
  st.host_alloc_ns = 500;
  st.host_inputs_ns = 2500;  // graph inputs 4 us
  st.host_compute_ns = 40000;
  st.host_readback_ns = 3000;
  ExecCounters before, after;
  before.host_ns = 7000;
  after.host_ns = 12000;  // 5 us in the executor
  sp.add(50000, st, before, after);
  sp.add(50000, st, before, after);
  EXPECT_EQ(sp.steps, 2u);
  EXPECT_DOUBLE_EQ(sp.inputs_ns, 8000.0);
  EXPECT_EQ(sp.host_ns, 10000u);
  EXPECT_EQ(sp.to_string(),
            "a generated token: 50.0 us = graph inputs 4.0 + compute 40.0 (host in it 5.0, device: "
            "LOOM_EXEC_GPU_TIME=1) + read-back 3.0 + other 3.0");
  after.device_ns = 30000;  // timed: 30 us a step
  after.device_timed = 1;
  app::TokenSplit timed;
  timed.add(50000, st, before, after);
  EXPECT_NE(timed.to_string().find("(host in it 5.0, device 30.0)"), std::string::npos);
  app::TokenSplit cpu;  // no executor counters: no host/device part
  cpu.add(50000, st, ExecCounters{}, ExecCounters{});
  EXPECT_EQ(cpu.to_string().find("host in it"), std::string::npos);
}

}  // namespace
}  // namespace loom::llm::testing
