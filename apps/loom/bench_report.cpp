// `loom bench`: executor configurations, statistics and the md / json / csv reports (bench.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench.h"

namespace loom::app {

// ---- executor configurations ---------------------------------------------------------------------

Result<std::vector<ExecConfig>> parse_exec_configs(std::string_view list) {
  std::vector<ExecConfig> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string name(list.substr(start, comma - start));
    start = comma + 1;
    ExecConfig c;
    c.name = name;
    if (name == "default") {
      c.options = std::nullopt;  // the backend's own
    } else if (auto o = exec_options_named(name, exec_options_from_env())) {
      c.options = *o;
    } else {
      return make_error(StatusCode::invalid_argument, "--exec: unknown configuration '{}' (known: {}, default)", name,
                        kExecConfigurationNames);
    }
    out.push_back(std::move(c));
  }
  return out;
}

bool same_exec_options(const ExecOptions& a, const ExecOptions& b) {
  if (a.serialize || b.serialize) return a.serialize == b.serialize;  // serialize overrides the rest
  return a.graph == b.graph && a.concurrency == b.concurrency && a.fusion == b.fusion &&
         a.reorder == b.reorder && a.pdl == b.pdl && a.n_cb == b.n_cb && a.lookahead == b.lookahead;
}

// ---- tests and statistics ------------------------------------------------------------------------

std::string BenchTest::name() const {
  const std::string depth = n_depth > 0 ? fmt::format(" @ d{}", n_depth) : std::string();
  if (n_prompt > 0 && n_gen > 0) return fmt::format("pp{}+tg{}{}", n_prompt, n_gen, depth);
  if (n_prompt > 0) return fmt::format("pp{}{}", n_prompt, depth);
  return fmt::format("tg{}{}", n_gen, depth);
}

TsStats ts_stats(const std::vector<double>& samples_ns, int n_tokens) {
  TsStats s;
  if (samples_ns.empty()) return s;
  std::vector<double> ts;
  for (double ns : samples_ns) ts.push_back(ns > 0.0 ? n_tokens / (ns * 1e-9) : 0.0);
  const double n = static_cast<double>(ts.size());
  for (double v : ts) s.mean += v;
  s.mean /= n;
  if (ts.size() > 1) {
    double ss = 0.0;
    for (double v : ts) ss += (v - s.mean) * (v - s.mean);
    s.stddev = std::sqrt(ss / (n - 1.0));
  }
  std::sort(ts.begin(), ts.end());
  const size_t m = ts.size();
  s.median = m % 2 ? ts[m / 2] : 0.5 * (ts[m / 2 - 1] + ts[m / 2]);
  return s;
}

// ---- model info ----------------------------------------------------------------------------------

namespace {

// "1B", "8B", "135M": the file's general.size_label, else rounded from the parameter count.
std::string size_label(const llm::Model& model) {
  if (model.gguf().has("general.size_label"))
    if (auto s = model.gguf().get_string("general.size_label"); s && !s->empty()) return std::string(*s);
  const double p = static_cast<double>(model.n_params());
  if (p >= 1e9) return fmt::format("{:.0f}B", p / 1e9);
  if (p >= 1e6) return fmt::format("{:.0f}M", p / 1e6);
  return fmt::format("{:.0f}K", p / 1e3);
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

BenchModelInfo bench_model_info(const llm::Model& model, const std::string& filename) {
  BenchModelInfo m;
  m.filename = filename;
  m.size = model.n_bytes();
  m.n_params = model.n_params();
  // type_mixture() lists the weight types by tensor count, most frequent first: "q4_0: 113, f32: 33".
  const std::string mix = model.type_mixture();
  const std::string main_type = upper(mix.substr(0, mix.find(':')));
  m.type = fmt::format("{} {} {}", llm::arch_name(model.hparams().arch), size_label(model), main_type);
  return m;
}

// ---- reports -------------------------------------------------------------------------------------

namespace {

std::string size_string(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
}

std::string params_string(uint64_t n) {
  const double p = static_cast<double>(n);
  if (p >= 1e9) return fmt::format("{:.2f} B", p / 1e9);
  if (p >= 1e6) return fmt::format("{:.2f} M", p / 1e6);
  return fmt::format("{:.2f} K", p / 1e3);
}

// Characters on screen: UTF-8 continuation bytes take no column ("±").
size_t display_width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

struct Column {
  std::string header;
  bool numeric;  // right-aligned
};

int resolved_threads(int n) {
  return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

void TokenSplit::add(double step_wall_ns, const llm::DecodeStats& st, const ExecCounters& before,
                     const ExecCounters& after) {
  wall_ns += step_wall_ns;
  inputs_ns += static_cast<double>(st.host_build_ns + st.host_alloc_ns + st.host_inputs_ns);
  compute_ns += static_cast<double>(st.host_compute_ns);
  readback_ns += static_cast<double>(st.host_readback_ns);
  host_ns += after.host_ns - before.host_ns;
  device_ns += after.device_ns - before.device_ns;
  device_timed += after.device_timed - before.device_timed;
  ++steps;
}

TokenSplit::PerStep TokenSplit::per_step_us() const {
  const double n = static_cast<double>(std::max<uint64_t>(steps, 1)) * 1e3;
  return {wall_ns / n, inputs_ns / n, compute_ns / n, readback_ns / n,
          (wall_ns - inputs_ns - compute_ns - readback_ns) / n};
}

std::string TokenSplit::to_string() const {
  const double n = static_cast<double>(std::max<uint64_t>(steps, 1)) * 1e3;  // us per step
  const PerStep us = per_step_us();
  // the executor's part of compute (a backend with counters: CUDA), its device time where timed
  std::string inside;
  if (host_ns > 0) {
    inside = fmt::format(" (host in it {:.1f}", static_cast<double>(host_ns) / n);
    inside += device_timed == steps ? fmt::format(", device {:.1f})", static_cast<double>(device_ns) / n)
              : device_timed > 0    ? std::string(", device: not every step was a replay)")
                                    : std::string(", device: LOOM_EXEC_GPU_TIME=1)");
  }
  return fmt::format(
      "a generated token: {:.1f} us = graph inputs {:.1f} + compute {:.1f}{} + read-back {:.1f} + other {:.1f}",
      us.wall, us.inputs, us.compute, inside, us.readback, us.other);
}

namespace {

std::string format_markdown(const std::vector<BenchResult>& results) {
  const bool exec =
      std::any_of(results.begin(), results.end(), [](const BenchResult& r) { return !r.exec.empty(); });
  const bool cpu =
      std::any_of(results.begin(), results.end(), [](const BenchResult& r) { return r.backend == "cpu"; });
  std::vector<Column> cols = {
      {"model", false}, {"size", true}, {"params", true}, {"backend", false}, {"ngl", true}};
  if (cpu) cols.push_back({"threads", true});
  cols.push_back({"numerics", false});  // llama-bench's place for parameters of its own: before test
  if (exec) cols.push_back({"exec", false});
  cols.push_back({"test", true});
  cols.push_back({"t/s", true});
  if (exec) {
    for (const char* h : {"median t/s", "kern/tok", "host us/tok", "gpu us/tok", "graphs b/r"})
      cols.push_back({h, true});
  }
  std::vector<std::vector<std::string>> rows;
  for (const BenchResult& r : results) {
    const TsStats st = r.stats();
    std::vector<std::string> row = {r.model.type, size_string(r.model.size), params_string(r.model.n_params),
                                    upper(r.backend), fmt::format("{}", r.n_gpu_layers)};
    if (cpu) row.push_back(fmt::format("{}", resolved_threads(r.n_threads)));
    row.push_back(r.numerics);
    if (exec) row.push_back(r.exec);
    row.push_back(r.test.name());
    row.push_back(fmt::format("{:.2f} ± {:.2f}", st.mean, st.stddev));
    if (exec) {
      const double tokens = static_cast<double>(std::max<uint64_t>(1, r.tokens()));
      row.push_back(fmt::format("{:.2f}", st.median));
      row.push_back(fmt::format("{:.1f}", static_cast<double>(r.counters.kernels) / tokens));
      row.push_back(fmt::format("{:.1f}", static_cast<double>(r.counters.host_ns) / tokens / 1e3));
      // LOOM_EXEC_GPU_TIME=1: the replays' device time per token ("-": not timed)
      row.push_back(r.counters.device_timed
                        ? fmt::format("{:.1f}", static_cast<double>(r.counters.device_ns) / tokens / 1e3)
                        : std::string("-"));
      row.push_back(fmt::format("{}/{}", r.counters.graph_builds, r.counters.graph_replays));
    }
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) {
    width[c] = std::max<size_t>(display_width(cols[c].header), cols[c].numeric ? 4 : 3);
    if (c == 0) width[c] = std::max<size_t>(width[c], 30);  // llama-bench's model column
    for (const auto& row : rows) width[c] = std::max(width[c], display_width(row[c]));
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (size_t c = 0; c < cols.size(); ++c) {
      const std::string pad(width[c] - display_width(cells[c]), ' ');
      s += ' ';
      s += cols[c].numeric ? pad : cells[c];
      s += cols[c].numeric ? cells[c] : pad;
      s += " |";
    }
    return s + "\n";
  };
  std::vector<std::string> headers, rule;
  for (size_t c = 0; c < cols.size(); ++c) {
    headers.push_back(cols[c].header);
    rule.push_back(cols[c].numeric ? std::string(width[c] - 1, '-') + ":" : std::string(width[c], '-'));
  }
  std::string out = line(headers) + line(rule);
  for (const auto& row : rows) out += line(row);
  return out;
}

nlohmann::ordered_json result_json(const BenchResult& r) {
  const TsStats st = r.stats();
  nlohmann::ordered_json j;
  j["model_filename"] = r.model.filename;
  j["model_type"] = r.model.type;
  j["model_size"] = r.model.size;
  j["model_n_params"] = r.model.n_params;
  j["backends"] = upper(r.backend);  // llama-bench's spelling: CPU, CUDA
  j["n_gpu_layers"] = r.n_gpu_layers;
  j["numerics"] = r.numerics;
  j["n_threads"] = resolved_threads(r.n_threads);
  j["n_batch"] = r.n_batch;
  j["n_ubatch"] = r.n_batch;  // one forward pass takes n_batch tokens
  j["flash_attn"] = true;
  j["n_prompt"] = r.test.n_prompt;
  j["n_gen"] = r.test.n_gen;
  j["n_depth"] = r.test.n_depth;
  j["test"] = r.test.name();
  j["exec"] = r.exec;
  j["exec_options"] = r.exec_options;
  double avg_ns = 0.0, sd_ns = 0.0;
  for (double v : r.samples_ns) avg_ns += v;
  if (!r.samples_ns.empty()) avg_ns /= static_cast<double>(r.samples_ns.size());
  if (r.samples_ns.size() > 1) {
    for (double v : r.samples_ns) sd_ns += (v - avg_ns) * (v - avg_ns);
    sd_ns = std::sqrt(sd_ns / static_cast<double>(r.samples_ns.size() - 1));
  }
  j["avg_ns"] = static_cast<uint64_t>(std::llround(avg_ns));
  j["stddev_ns"] = static_cast<uint64_t>(std::llround(sd_ns));
  j["avg_ts"] = st.mean;
  j["stddev_ts"] = st.stddev;
  j["median_ts"] = st.median;
  auto samples_ns = nlohmann::json::array(), samples_ts = nlohmann::json::array();
  for (double v : r.samples_ns) {
    samples_ns.push_back(static_cast<uint64_t>(std::llround(v)));
    samples_ts.push_back(v > 0.0 ? r.test.n_tokens() / (v * 1e-9) : 0.0);
  }
  j["samples_ns"] = samples_ns;
  j["samples_ts"] = samples_ts;
  const ExecCounters& c = r.counters;
  const double tokens = static_cast<double>(std::max<uint64_t>(1, r.tokens()));
  j["kernels_per_token"] = static_cast<double>(c.kernels) / tokens;
  j["host_us_per_token"] = static_cast<double>(c.host_ns) / tokens / 1e3;
  // every row has every key (the CSV's columns): 0 where not timed (LOOM_EXEC_GPU_TIME) or no token generated
  j["gpu_us_per_token"] = c.device_timed ? static_cast<double>(c.device_ns) / tokens / 1e3 : 0.0;
  const TokenSplit::PerStep us = r.tg_split.per_step_us();  // a generated token's time
  j["generated_token_us"] = {{"wall", us.wall},     {"graph_inputs", us.inputs}, {"compute", us.compute},
                             {"read_back", us.readback}, {"other", us.other}};
  j["computes"] = c.computes;
  j["dispatches"] = c.dispatches;
  j["graph_nodes"] = c.graph_nodes;
  j["kernels"] = c.kernels;
  j["edges"] = c.edges;
  j["pdl_edges"] = c.pdl_edges;
  j["groups"] = c.groups;
  j["group_hist"] = c.group_hist;
  nlohmann::ordered_json fusions = nlohmann::ordered_json::object();
  for (int k = 1; k < kFusedKindCount; ++k)
    fusions[fused_kind_name(static_cast<FusedKind>(k))] = c.fusions[k];
  j["fusions"] = fusions;
  j["reordered"] = c.reordered;
  j["act_handoffs"] = c.act_handoffs;
  j["graph_builds"] = c.graph_builds;
  j["chunk_graphs"] = c.chunk_graphs;
  j["graph_updates"] = c.graph_updates;
  j["graph_replays"] = c.graph_replays;
  j["hash_collisions"] = c.hash_collisions;
  j["host_syncs"] = c.host_syncs;
  j["host_ns"] = c.host_ns;
  j["host_hash_ns"] = c.host_hash_ns;
  j["host_plan_ns"] = c.host_plan_ns;
  j["host_record_ns"] = c.host_record_ns;
  j["host_instantiate_ns"] = c.host_instantiate_ns;
  return j;
}

// Appends `item` to a `sep`-separated list.
void append_item(std::string& list, char sep, const std::string& item) {
  if (!list.empty()) list += sep;
  list += item;
}

// A CSV field: arrays as "a;b;c", objects as "k=v;k=v", strings bare; quoted, with quotes doubled.
std::string csv_field(const nlohmann::ordered_json& v) {
  std::string s;
  if (v.is_string()) {
    s = v.get<std::string>();
  } else if (v.is_array()) {
    for (const auto& e : v) append_item(s, ';', e.dump());
  } else if (v.is_object()) {
    for (const auto& [k, e] : v.items()) append_item(s, ';', fmt::format("{}={}", k, e.dump()));
  } else {
    s = v.dump();
  }
  std::string q(1, '"');
  for (char ch : s) {
    q += ch;
    if (ch == '"') q += ch;
  }
  q += '"';
  return q;
}

}  // namespace

std::string format_bench(const std::vector<BenchResult>& results, BenchFormat format) {
  switch (format) {
    case BenchFormat::md:
      return format_markdown(results);
    case BenchFormat::json: {
      auto arr = nlohmann::ordered_json::array();
      for (const BenchResult& r : results) arr.push_back(result_json(r));
      return arr.dump(2) + "\n";
    }
    case BenchFormat::csv: {
      std::string out;
      for (size_t i = 0; i < results.size(); ++i) {
        const auto j = result_json(results[i]);
        if (i == 0) {
          std::string header;
          for (const auto& [k, v] : j.items()) append_item(header, ',', k);
          out += header + "\n";
        }
        std::string line;
        for (const auto& [k, v] : j.items()) append_item(line, ',', csv_field(v));
        out += line + "\n";
      }
      return out;
    }
  }
  return {};
}

}  // namespace loom::app
