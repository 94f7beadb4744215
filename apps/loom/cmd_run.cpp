// `loom run`: text generation; without -m, the built-in Shakespeare model.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "generate.h"
#include "loom/backend.h"

namespace loom::app {

// The built-in model ships in the repository's models/ folder: found from $LOOM_MODEL, then next to
// the program's build or install tree, then in ./models.
std::optional<std::string> find_builtin_model() {
  if (const char* env = std::getenv("LOOM_MODEL"); env && *env) return std::string(env);
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto bin = exe.parent_path();
    dirs = {bin / "../../models", bin / "../models", bin / "../share/loom/models"};
  }
  dirs.emplace_back("models");
  for (const auto& d : dirs) {
    const auto f = d / kBuiltinModelFile;
    if (std::filesystem::is_regular_file(f, ec)) return std::filesystem::weakly_canonical(f, ec).string();
  }
  return std::nullopt;
}

void add_run_command(CLI::App& app, std::vector<Command>& out) {
  auto g = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text with a GGUF model (-m; default: the built-in Shakespeare model)");
  add_model_flags(*cmd, *g);
  cmd->add_option("-p,--prompt", g->prompt, "Prompt");
  cmd->add_option("-f,--file", g->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", g->n_predict, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  add_sampling_flags(*cmd, *g);
  cmd->add_option("--dump-logits", g->dump_logits, "Write the prompt's logits (f32) to FILE and its ids to FILE.tokens");
  cmd->add_flag("--stats", g->stats, "Print decode and graph-executor statistics to stderr after generating");
  out.push_back({cmd, [g, cmd] {
                   // Without -ngl and --backend: the GPU when one is usable (all layers), else the CPU.
                   GenerateOptions o = *g;
                   o.gpu_if_usable = cmd->count("--n-gpu-layers") == 0;
                   if (!o.model_path.empty()) return run_generate(o);
                   // No -m: the built-in Shakespeare model.
                   if (auto path = find_builtin_model()) {
                     o.model_path = *path;
                     if (cmd->count("--prompt") == 0 && cmd->count("--file") == 0) o.prompt = "ROMEO:";
                     if (cmd->count("--n-predict") == 0) o.n_predict = 200;
                     return run_generate(o);
                   }
                   fmt::print(stderr, "loom: no model given (-m FILE) and the built-in model (models/{}) was not "
                                      "found next to the program; set LOOM_MODEL=FILE or pass -m FILE\n",
                              kBuiltinModelFile);
                   return 1;
                 }});
}

void add_backends_command(CLI::App& app, std::vector<Command>& out) {
  auto* cmd = app.add_subcommand("backends", "List the available backends");
  out.push_back({cmd, [] {
                   for (const auto& n : loom::backend_names()) fmt::print("{}\n", n);
                   return 0;
                 }});
}

}  // namespace loom::app
