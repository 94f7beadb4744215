// `loom run`: text generation; without -m, the built-in Shakespeare model.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "generate.h"
#include "loom/backend.h"

namespace loom::app {

void add_run_command(CLI::App& app, std::vector<Command>& out) {
  auto g = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text with a GGUF model (-m; default: the built-in Shakespeare model)");
  add_model_flags(*cmd, *g);
  cmd->add_option("-p,--prompt", g->prompt, "Prompt");
  cmd->add_option("-f,--file", g->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", g->n_predict, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  add_sampling_flags(*cmd, *g);
  cmd->add_option("--dump-logits", g->dump_logits, "Write the prompt's logits (f32) to FILE and its ids to FILE.tokens");
  cmd->add_option("--dump-step-logits", g->dump_step_logits,
                  "Write each generated step's logits (f32, sampled on the host) to FILE and the generated ids to "
                  "FILE.tokens");
  cmd->add_flag("--stats", g->stats, "Print decode and graph-executor statistics to stderr after generating");
  out.push_back({cmd, [g, cmd] {
                   // Without -ngl and --backend: the GPU when one is usable (all layers), else the CPU.
                   GenerateOptions o = *g;
                   o.gpu_if_usable = cmd->count("--n-gpu-layers") == 0;
                   if (!o.model_path.empty()) return run_generate(o);
                   // No -m: the built-in Shakespeare model.
                   if (!use_builtin_model(*cmd, o)) return 1;
                   if (cmd->count("--prompt") == 0 && cmd->count("--file") == 0) o.prompt = "ROMEO:";
                   if (cmd->count("--n-predict") == 0) o.n_predict = 200;
                   return run_generate(o);
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
