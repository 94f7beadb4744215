// Subcommands of the `loom` program: each lives in its own cmd_*.cpp and registers itself here.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace loom::app {

/// A parsed subcommand and what runs when it was chosen.
struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

/// Each adds its subcommand to `app` and appends it to `out`; options live in the lambda's state.
void add_run_command(CLI::App& app, std::vector<Command>& out);
void add_backends_command(CLI::App& app, std::vector<Command>& out);
void add_info_command(CLI::App& app, std::vector<Command>& out);
void add_quantize_command(CLI::App& app, std::vector<Command>& out);
void add_tokenize_command(CLI::App& app, std::vector<Command>& out);
void add_gen_model_command(CLI::App& app, std::vector<Command>& out);
void add_perplexity_command(CLI::App& app, std::vector<Command>& out);
void add_chat_command(CLI::App& app, std::vector<Command>& out);
void add_bench_command(CLI::App& app, std::vector<Command>& out);
void add_template_command(CLI::App& app, std::vector<Command>& out);
void add_serve_command(CLI::App& app, std::vector<Command>& out);

}  // namespace loom::app
