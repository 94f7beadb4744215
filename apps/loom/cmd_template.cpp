// `loom template`: renders a Jinja chat template (a .jinja file, or a GGUF file's
// tokenizer.chat_template) with a conversation, as transformers' apply_chat_template would.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "generate.h"
#include "loom/gguf.h"
#include "loom/jinja.h"

namespace {

struct TemplateOptions {
  std::string file;
  std::string model;
  std::string messages;
  std::string tools;
  std::string cases;
  std::string bos;
  std::string eos;
  bool no_generation_prompt = false;
  int64_t now = -1;
};

int fail(const loom::Status& s) {
  std::fprintf(stderr, "loom: %s\n", s.to_string().c_str());
  return 1;
}

loom::Result<nlohmann::ordered_json> read_json(const std::string& path) {
  auto text = loom::app::read_file(path);
  if (!text) return text.status();
  try {
    return nlohmann::ordered_json::parse(*text);
  } catch (const std::exception& e) {
    return loom::make_error(loom::StatusCode::format_error, "{}: {}", path, e.what());
  }
}

int run_template(const TemplateOptions& o) {
  std::string source, name;
  if (!o.file.empty()) {
    auto text = loom::app::read_file(o.file);
    if (!text) return fail(text.status());
    source = std::move(*text);
    name = o.file;
  } else {
    auto gguf = loom::GgufFile::open(o.model);
    if (!gguf) return fail(gguf.status());
    auto text = gguf->get_string("tokenizer.chat_template");
    if (!text) return fail(text.status());
    source = std::move(*text);
    name = o.model + ": tokenizer.chat_template";
  }
  auto tmpl = loom::JinjaTemplate::parse(source, name);
  loom::JinjaRenderOptions ro;
  ro.now = o.now;
  if (!o.cases.empty()) {
    // Batch mode for the differential test: a JSON list of {messages, tools, add_generation_prompt,
    // bos_token, eos_token}; prints a JSON list of {"text": ...} or {"error": ...}.
    auto cases = read_json(o.cases);
    if (!cases) return fail(cases.status());
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& c : *cases) {
      if (!tmpl) {
        results.push_back({{"error", tmpl.status().message()}});
        continue;
      }
      loom::JinjaChatInputs in;
      in.messages = &c.at("messages");
      in.tools = c.contains("tools") && !c["tools"].is_null() ? &c["tools"] : nullptr;
      in.add_generation_prompt = c.value("add_generation_prompt", true);
      in.bos_token = c.value("bos_token", "");
      in.eos_token = c.value("eos_token", "");
      auto text = loom::render_jinja_chat(*tmpl, in, ro);
      if (text)
        results.push_back({{"text", *text}});
      else
        results.push_back({{"error", text.status().message()}});
    }
    fmt::print("{}\n", results.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    return 0;
  }
  if (!tmpl) return fail(tmpl.status());
  nlohmann::ordered_json messages = nlohmann::ordered_json::array(), tools;
  if (!o.messages.empty()) {
    auto m = read_json(o.messages);
    if (!m) return fail(m.status());
    messages = std::move(*m);
  }
  if (!o.tools.empty()) {
    auto t = read_json(o.tools);
    if (!t) return fail(t.status());
    tools = std::move(*t);
  }
  loom::JinjaChatInputs in;
  in.messages = &messages;
  in.tools = o.tools.empty() ? nullptr : &tools;
  in.add_generation_prompt = !o.no_generation_prompt;
  in.bos_token = o.bos;
  in.eos_token = o.eos;
  auto text = loom::render_jinja_chat(*tmpl, in, ro);
  if (!text) return fail(text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

namespace loom::app {

void add_template_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<TemplateOptions>();
  auto* cmd = app.add_subcommand("template",
                                 "Render a Jinja chat template with a conversation (as transformers does)");
  auto* file = cmd->add_option("-f,--file", opts->file, "Jinja template file");
  auto* model =
      cmd->add_option("-m,--model", opts->model, "GGUF file whose tokenizer.chat_template to render");
  file->excludes(model);
  cmd->add_option("--messages", opts->messages,
                  "JSON file with the messages (a list of {role, content, ...})");
  cmd->add_option("--tools", opts->tools, "JSON file with the tool schemas (a list)");
  cmd->add_option("--cases", opts->cases,
                  "JSON file with a list of {messages, tools, add_generation_prompt, bos_token, eos_token}; "
                  "prints a JSON list of {text} or {error}");
  cmd->add_option("--bos", opts->bos, "bos_token text");
  cmd->add_option("--eos", opts->eos, "eos_token text");
  cmd->add_flag("--no-generation-prompt", opts->no_generation_prompt, "add_generation_prompt = false");
  cmd->add_option("--now", opts->now, "Seconds since the epoch for strftime_now (default: the current time)");
  out.push_back({cmd, [opts, file, model] {
                   if (file->count() + model->count() == 0)
                     return fail(loom::make_error(loom::StatusCode::invalid_argument,
                                                  "template: give --file or --model"));
                   return run_template(*opts);
                 }});
}

}  // namespace loom::app
