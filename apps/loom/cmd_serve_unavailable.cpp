// `loom serve` in a build without cpp-httplib: the subcommand exists and says what is missing.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"

namespace loom::app {

void add_serve_command(CLI::App& app, std::vector<Command>& out) {
  auto* cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server (not in this build: needs cpp-httplib)");
  cmd->allow_extras();
  out.push_back({cmd, [] {
                   fmt::print(stderr,
                              "loom: this build has no `loom serve`: cpp-httplib was not found when it was "
                              "configured (Debian: apt-get install libcpp-httplib-dev, then build again)\n");
                   return 1;
                 }});
}

}  // namespace loom::app
