// Robustness of the Jinja interpreter: every template of a directory, truncated and mutated with
// template syntax fragments (a fixed seed), is parsed and rendered; each must come back as text or
// as an error, never a crash, a hang or (under LOOM_SANITIZE) a memory error or leak.
//
//   loom-jinja-mutate TEMPLATE_DIR [MUTANTS_PER_TEMPLATE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/jinja.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TEMPLATE_DIR [MUTANTS_PER_TEMPLATE]\n", argv[0]);
    return 2;
  }
  const int per_template = argc > 2 ? std::atoi(argv[2]) : 200;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[1]))
    if (e.path().extension() == ".jinja") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  const auto ctx = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                 {"role": "assistant", "content": "A", "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "tool", "content": "r"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  static const char* const kPieces[] = {"{%",
                                        "%}",
                                        "{{",
                                        "}}",
                                        "(",
                                        ")",
                                        "[",
                                        "]",
                                        "|",
                                        ".",
                                        "'",
                                        "\"",
                                        "-",
                                        " if ",
                                        " for ",
                                        "\xff",
                                        "{#",
                                        "loop",
                                        " is ",
                                        "~",
                                        "*",
                                        "**",
                                        "//",
                                        "not ",
                                        "{% endfor %}",
                                        "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"};
  std::mt19937 rng(42);
  long rendered = 0, errors = 0;
  loom::JinjaRenderOptions options;
  options.max_output_bytes = size_t{1} << 20;
  options.now = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int k = 0; k < per_template; ++k) {
      std::string s = source;
      if (k % 3 == 0) {
        s.resize(rng() % (s.size() + 1));
      } else {
        for (int m = 0; m < 1 + k % 5; ++m) {
          const size_t at = rng() % (s.size() + 1);
          if (rng() % 2 && at < s.size())
            s.erase(at, 1 + rng() % 8);
          else
            s.insert(at, kPieces[rng() % std::size(kPieces)]);
        }
      }
      auto t = loom::JinjaTemplate::parse(s, path.filename().string());
      if (!t) {
        ++errors;
        continue;
      }
      auto r = t->render(ctx, options);
      r.ok() ? ++rendered : ++errors;
    }
  }
  std::printf("jinja-mutate: %zu templates, %ld mutants rendered, %ld rejected with an error\n", files.size(),
              rendered, errors);
  return 0;
}
