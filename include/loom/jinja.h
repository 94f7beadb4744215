// Jinja chat templates: an interpreter for the subset of Jinja2 that model chat templates
// (`tokenizer.chat_template`) use, rendering them as Hugging Face transformers does: Jinja2 with
// trim_blocks and lstrip_blocks, the loopcontrols extension (break/continue), `raise_exception`,
// `strftime_now`, transformers' `tojson` (non-ASCII kept, key order kept, `indent`), and
// `{% generation %}` as a plain wrapper. Written here because no C++ Jinja library is packaged.
//
// Values follow Python's semantics where templates can see them: `{{ [1, 'a'] }}` prints
// "[1, 'a']", `{{ none }}` prints "None", a missing key or index gives undefined (prints nothing),
// attribute access on undefined is an error. Errors (syntax, undefined, type, raise_exception)
// come back as a Status naming the template and the line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "loom/status.h"

namespace loom {

namespace jinja {
struct Program;
}

/// Limits and the clock for one render.
struct JinjaRenderOptions {
  /// Seconds since the Unix epoch that `strftime_now` formats (local time); -1: the current time.
  int64_t now = -1;
  /// The rendered text may not grow past this many bytes (a template that loops forever stops).
  size_t max_output_bytes = size_t{64} << 20;
  /// Macro calls and nested expressions deeper than this fail instead of exhausting the stack.
  int max_depth = 100;
};

/// A parsed template; cheap to copy, immutable, safe to render from several threads.
class JinjaTemplate {
 public:
  /// Parses `source`; `name` (a file name, "model.gguf: tokenizer.chat_template") starts every
  /// error message. format_error with the line for a syntax error or an unknown filter or test
  /// outside a conditional (Jinja2 rejects those when compiling too).
  static Result<JinjaTemplate> parse(std::string_view source, std::string name);

  /// Renders with the top-level variables of `context` (a JSON object). invalid_argument for an
  /// error while rendering (raise_exception, undefined attribute, a type error), with the line.
  Result<std::string> render(const nlohmann::ordered_json& context,
                             const JinjaRenderOptions& options = {}) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

/// What a chat template gets besides the messages, as transformers' apply_chat_template passes it.
struct JinjaChatInputs {
  /// OpenAI-style messages: objects with "role", "content" and, where used, "tool_calls" etc.
  const nlohmann::ordered_json* messages = nullptr;
  /// Tool schemas (a list) or nullptr: the template then sees `tools` as none, as in transformers.
  const nlohmann::ordered_json* tools = nullptr;
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
};

/// Renders a chat template with `messages`, `tools`, `documents` (none), `add_generation_prompt`,
/// `bos_token` and `eos_token` defined, as transformers does.
Result<std::string> render_jinja_chat(const JinjaTemplate& t, const JinjaChatInputs& in,
                                      const JinjaRenderOptions& options = {});

}  // namespace loom
