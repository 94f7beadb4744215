// The `loom` command: one subcommand per cmd_*.cpp file.
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "loom_version.h"

namespace {

// llama.cpp's multi-letter single-dash flags, which CLI11 does not accept as names, spelled long.
const char* long_spelling(const char* arg) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"-ub", "--ubatch-size"},
      {"-ngl", "--n-gpu-layers"},
      {"-fa", "--flash-attn"},
      {"-pg", "--pp-tg"},
      {"-nkvo", "--no-kv-offload"},
      {"-sys", "--system-prompt"},
      {"-np", "--parallel"},
      {"-tp", "--tensor-parallel"},
      {"-npp", "--npp"},
      {"-ntg", "--ntg"},
      {"-npl", "--npl"},
  };
  for (const auto& [short_name, long_name] : kAliases)
    if (std::strcmp(arg, short_name) == 0) return long_name;
  return arg;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom: LLM inference on NVIDIA GPUs and CPUs"};
  app.require_subcommand(0, 1);
  std::string version = std::string("loom ") + LOOM_VERSION;
  if (*LOOM_GIT_COMMIT) version += std::string(" (git ") + LOOM_GIT_COMMIT + ")";
  app.set_version_flag("-V,--version", version);
  std::vector<loom::app::Command> commands;
  loom::app::add_run_command(app, commands);
  loom::app::add_backends_command(app, commands);
  loom::app::add_info_command(app, commands);
  loom::app::add_quantize_command(app, commands);
  loom::app::add_tokenize_command(app, commands);
  loom::app::add_gen_model_command(app, commands);
  loom::app::add_perplexity_command(app, commands);
  loom::app::add_chat_command(app, commands);
  loom::app::add_bench_command(app, commands);
  loom::app::add_template_command(app, commands);
  loom::app::add_serve_command(app, commands);
  std::vector<const char*> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) args[i] = long_spelling(args[i]);
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& c : commands)
    if (c.sub->parsed()) return c.run();
  return commands.front().run();  // `loom` alone runs the main job
}
