// ChatFormat: a model's Jinja chat template through the interpreter, or a built-in format (see
// loom/chat.h for the order in which they are chosen).
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/chat.h"

namespace loom {

Result<ChatFormat> chat_format_for_model(const GgufFile& file, std::string_view override_name,
                                         const std::string& template_file) {
  ChatFormat f;
  if (!override_name.empty()) {
    auto t = chat_template_from_name(override_name);
    if (!t) return t.status();
    f.builtin = *t;
    f.family_known = true;
    f.description = fmt::format("{} (--chat-template)", chat_template_name(*t));
    return f;
  }
  std::string source, name;
  if (!template_file.empty()) {
    std::ifstream in(template_file, std::ios::binary);
    if (!in) return make_error(StatusCode::io_error, "{}: cannot open", template_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    source = ss.str();
    name = template_file;
  } else {
    const char* key = "tokenizer.chat_template";
    if (!file.has(key)) {
      f.builtin = ChatTemplate::chatml;
      f.description = fmt::format("chatml (the fallback: {} has no {})", file.name(), key);
      return f;
    }
    auto jinja = file.get_string(key);
    if (!jinja) return jinja.status();
    source = std::move(*jinja);
    name = fmt::format("{}: {}", file.name(), key);
  }
  const auto family = detect_chat_template(source);
  auto parsed = JinjaTemplate::parse(source, name);
  if (!parsed) {
    if (!family || !template_file.empty()) return parsed.status();
    // A template the interpreter cannot parse still names its family by its markers.
    f.builtin = *family;
    f.family_known = true;
    f.description = fmt::format("{} (built-in; the Jinja template does not parse: {})",
                                chat_template_name(*family), parsed.status().message());
    return f;
  }
  f.jinja = std::move(*parsed);
  f.builtin = family.value_or(ChatTemplate::chatml);
  f.family_known = family.has_value();
  f.description = fmt::format("jinja ({})", name);
  return f;
}

Result<std::string> render_chat(const ChatFormat& format, std::span<const ChatMessage> messages,
                                const ChatRenderOptions& options) {
  if (!format.jinja) return render_chat(format.builtin, messages, options);
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  JinjaChatInputs in;
  in.messages = &list;
  in.add_generation_prompt = options.add_generation_prompt;
  in.bos_token = options.bos_token;
  in.eos_token = options.eos_token;
  auto text = render_jinja_chat(*format.jinja, in);
  if (!text) return text.status();
  if (!options.add_bos && !options.bos_token.empty() &&
      text->compare(0, options.bos_token.size(), options.bos_token) == 0)
    text->erase(0, options.bos_token.size());
  return text;
}

std::string chat_end_of_turn(const ChatFormat& format, const ChatRenderOptions& options) {
  if (!format.jinja || format.family_known) return chat_end_of_turn(format.builtin, options);
  return options.eos_token;
}

}  // namespace loom
