// The `loom` command: one subcommand per cmd_*.cpp file.
#include <vector>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Loom: LLM inference on NVIDIA GPUs and CPUs"};
  app.require_subcommand(0, 1);
  std::vector<loom::app::Command> commands;
  loom::app::add_run_command(app, commands);
  loom::app::add_backends_command(app, commands);
  loom::app::add_info_command(app, commands);
  loom::app::add_quantize_command(app, commands);
  loom::app::add_tokenize_command(app, commands);
  loom::app::add_gen_model_command(app, commands);
  CLI11_PARSE(app, argc, argv);
  for (auto& c : commands)
    if (c.sub->parsed()) return c.run();
  return commands.front().run();  // `loom` alone runs the main job
}
