// Chat formats of the server (loom/serve.h): the built-in families and the plain fallback.
#include <cctype>
#include <memory>

#include "loom/serve.h"

namespace loom::serve {

namespace {

// The model's own BOS/EOS spellings, so that the tokenizer matches them as special tokens.
ChatRenderOptions model_render_options(const Tokenizer& tok) {
  ChatRenderOptions options;
  const SpecialTokens& sp = tok.special();
  if (sp.bos != kNoToken) options.bos_token = std::string(tok.token_text(sp.bos));
  if (sp.eos != kNoToken) options.eos_token = std::string(tok.token_text(sp.eos));
  return options;
}

}  // namespace

ChatFormat builtin_chat_format(ChatTemplate t, const Tokenizer& tok) {
  const ChatRenderOptions options = model_render_options(tok);
  ChatFormat f;
  f.name = chat_template_name(t);
  f.stop = {chat_end_of_turn(t, options)};
  f.render = [t, options](std::span<const ChatMessage> messages, bool add_generation_prompt) {
    ChatRenderOptions o = options;
    o.add_generation_prompt = add_generation_prompt;
    return render_chat(t, messages, o);
  };
  return f;
}

ChatFormat model_chat_format(loom::ChatFormat format, const Tokenizer& tok) {
  const ChatRenderOptions options = model_render_options(tok);
  ChatFormat f;
  f.name = format.description;
  f.stop = {chat_end_of_turn(format, options)};
  auto shared = std::make_shared<const loom::ChatFormat>(std::move(format));
  f.render = [shared, options](std::span<const ChatMessage> messages, bool add_generation_prompt) {
    ChatRenderOptions o = options;
    o.add_generation_prompt = add_generation_prompt;
    return render_chat(*shared, messages, o);
  };
  return f;
}

Result<ChatFormat> chat_format_from_file(const GgufFile& file, const Tokenizer& tok, const std::string& path) {
  auto format = loom::chat_format_for_model(file, "", path);
  if (!format) return format.status();
  return model_chat_format(std::move(*format), tok);
}

ChatFormat plain_chat_format() {
  ChatFormat f;
  f.name = "plain";
  f.stop = {"\n\nUSER:"};
  f.render = [](std::span<const ChatMessage> messages, bool add_generation_prompt) -> Result<std::string> {
    std::string out;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role.empty()) return make_error(StatusCode::invalid_argument, "message {}: empty role", i);
      for (char c : m.role) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      out += ":\n" + m.content + "\n\n";
    }
    if (add_generation_prompt) out += "ASSISTANT:\n";
    return out;
  };
  return f;
}

Result<ChatFormat> chat_format_for_model(const GgufFile& file, const Tokenizer& tok,
                                         const std::string& template_name, std::string* note) {
  if (!template_name.empty()) {
    if (template_name == "plain") return plain_chat_format();
    auto t = chat_template_from_name(template_name);
    if (!t) return t.status();
    return builtin_chat_format(*t, tok);
  }
  if (!file.has("tokenizer.chat_template")) {
    if (note) *note = file.name() + " has no tokenizer.chat_template; using the plain format";
    return plain_chat_format();
  }
  // The model's Jinja template, rendered as transformers renders it (when it does not parse: the
  // built-in family its markers name; else the parse error).
  auto format = loom::chat_format_for_model(file, "");
  if (!format) return format.status();
  return model_chat_format(std::move(*format), tok);
}

}  // namespace loom::serve
