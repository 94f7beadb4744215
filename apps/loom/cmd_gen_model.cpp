// `loom gen-model`: writes a synthetic GGUF model of a named shape (random weights, synthetic
// byte-level BPE vocabulary) for tests and benchmarks.
#include <chrono>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "loom/quant_mixture.h"
#include "synth_model.h"

namespace {

struct GenModelOptions {
  std::string shape;
  std::string type = "f16";
  std::string output;
  uint64_t seed = 1;
  int n_threads = 0;
};

int gen_model(const GenModelOptions& o) {
  const loom::llm::SynthShape* shape = loom::llm::find_synth_shape(o.shape);
  if (!shape) {
    std::string names;
    for (const auto& s : loom::llm::synth_shapes())
      names += fmt::format("{}{}", names.empty() ? "" : ", ", s.name);
    fmt::print(stderr, "loom: gen-model: unknown shape '{}' (shapes: {})\n", o.shape, names);
    return 1;
  }
  auto type = loom::llm::file_type_from_name(o.type);
  if (!type) {
    fmt::print(stderr, "loom: gen-model: unknown type '{}' ({})\n", o.type, loom::llm::file_type_names());
    return 1;
  }
  loom::llm::SynthOptions so;
  so.seed = o.seed;
  so.n_threads = o.n_threads;
  const auto t0 = std::chrono::steady_clock::now();
  if (auto s = loom::llm::write_synth_model(o.output, *shape, *type, so); !s.ok()) {
    fmt::print(stderr, "loom: gen-model: {}\n", s.to_string());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "loom: wrote {} ({} {}, seed {}) in {:.1f} s\n", o.output, shape->name,
             loom::llm::file_type_name(*type), o.seed, secs);
  return 0;
}

}  // namespace

namespace loom::app {

void add_gen_model_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<GenModelOptions>();
  std::string shapes;
  for (const auto& s : loom::llm::synth_shapes())
    shapes += fmt::format("{}{}", shapes.empty() ? "" : ", ", s.name);
  auto* cmd =
      app.add_subcommand("gen-model", "Write a synthetic GGUF model (random weights) of a named shape");
  cmd->add_option("--shape", opts->shape, "Shape: " + shapes)->required();
  cmd->add_option("--type", opts->type, "Weight type (default f16): " + loom::llm::file_type_names());
  cmd->add_option("-o,--output", opts->output, "Output file")->required();
  cmd->add_option("--seed", opts->seed, "Weight seed (default 1)");
  cmd->add_option("-t,--threads", opts->n_threads, "Quantization threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  out.push_back({cmd, [opts] { return gen_model(*opts); }});
}

}  // namespace loom::app
