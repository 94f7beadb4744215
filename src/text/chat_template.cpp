// Built-in chat templates: detection from a GGUF's Jinja text and rendering (see loom/chat.h for
// the formats and where they come from).
#include <fmt/format.h>

#include <array>

#include "loom/chat.h"

namespace loom {

namespace {

struct NamedTemplate {
  const char* name;
  ChatTemplate t;
};
// "qwen" is an alias: Qwen 1.5 to 3 use ChatML. (Qwen 2 and 2.5 templates also add a default
// system message when there is none; Loom leaves that to -sys.)
constexpr std::array<NamedTemplate, 6> kNames = {{
    {"llama2", ChatTemplate::llama2},
    {"llama3", ChatTemplate::llama3},
    {"chatml", ChatTemplate::chatml},
    {"qwen", ChatTemplate::chatml},
    {"gemma", ChatTemplate::gemma},
    {"mistral", ChatTemplate::mistral},
}};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The family's BOS/EOS text where the caller gave none.
std::string bos_text(ChatTemplate t, const ChatRenderOptions& o) {
  if (!o.bos_token.empty()) return o.bos_token;
  switch (t) {
    case ChatTemplate::llama2:
    case ChatTemplate::mistral:
      return "<s>";
    case ChatTemplate::llama3:
      return "<|begin_of_text|>";
    case ChatTemplate::gemma:
      return "<bos>";
    case ChatTemplate::chatml:
      return "";
  }
  return "";
}

std::string eos_text(ChatTemplate t, const ChatRenderOptions& o) {
  if (!o.eos_token.empty()) return o.eos_token;
  switch (t) {
    case ChatTemplate::llama2:
    case ChatTemplate::mistral:
      return "</s>";
    case ChatTemplate::llama3:
      return "<|end_of_text|>";
    case ChatTemplate::gemma:
      return "<eos>";
    case ChatTemplate::chatml:
      return "";
  }
  return "";
}

// Roles a template accepts. llama2, gemma and mistral have user/assistant turns only, strictly
// alternating after an optional leading system message (their reference templates raise an
// exception otherwise); chatml and llama3 write any role name into their headers.
Status check_roles(ChatTemplate t, std::span<const ChatMessage> messages) {
  const bool strict = t == ChatTemplate::llama2 || t == ChatTemplate::gemma || t == ChatTemplate::mistral;
  size_t turn = 0;  // index among the non-system messages
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role.empty() || role.find_first_of("\n\r") != std::string::npos)
      return make_error(StatusCode::invalid_argument, "chat message {}: invalid role '{}'", i, role);
    if (role == "system") {
      if (i != 0)
        return make_error(StatusCode::invalid_argument,
                          "chat message {}: a system message may only come first", i);
      continue;
    }
    if (strict) {
      const char* want = turn % 2 == 0 ? "user" : "assistant";
      if (role != want)
        return make_error(StatusCode::invalid_argument,
                          "chat message {}: role '{}' where the {} template expects '{}' (turns must "
                          "alternate user, assistant, user, ...)",
                          i, role, chat_template_name(t), want);
    } else if (role != "user" && role != "assistant" && role.find_first_of("<>|") != std::string::npos) {
      return make_error(StatusCode::invalid_argument, "chat message {}: invalid role '{}'", i, role);
    }
    ++turn;
  }
  return {};
}

// The leading system message, if any, and the messages after it.
struct Split {
  const ChatMessage* system = nullptr;
  std::span<const ChatMessage> turns;
};
Split split_system(std::span<const ChatMessage> messages) {
  if (!messages.empty() && messages.front().role == "system") return {&messages.front(), messages.subspan(1)};
  return {nullptr, messages};
}

std::string render_llama2(std::span<const ChatMessage> messages, const ChatRenderOptions& o) {
  const std::string bos = bos_text(ChatTemplate::llama2, o), eos = eos_text(ChatTemplate::llama2, o);
  const Split s = split_system(messages);
  std::string out;
  for (size_t i = 0; i < s.turns.size(); ++i) {
    const ChatMessage& m = s.turns[i];
    if (m.role == "user") {
      std::string content = m.content;
      if (i == 0 && s.system) content = "<<SYS>>\n" + s.system->content + "\n<</SYS>>\n\n" + content;
      if (i > 0 || o.add_bos) out += bos;
      out += "[INST] ";
      out += trim(content);
      out += " [/INST]";
    } else {
      out += ' ';
      out += trim(m.content);
      out += ' ';
      out += eos;
    }
  }
  // A system message alone: the reference template writes nothing until a user message comes.
  return out;
}

std::string render_mistral(std::span<const ChatMessage> messages, const ChatRenderOptions& o) {
  const std::string eos = eos_text(ChatTemplate::mistral, o);
  const Split s = split_system(messages);
  std::string out = o.add_bos ? bos_text(ChatTemplate::mistral, o) : "";
  for (size_t i = 0; i < s.turns.size(); ++i) {
    const ChatMessage& m = s.turns[i];
    if (m.role == "user") {
      out += "[INST] ";
      // The v1 template has no system slot. Mistral's later (v0.3) template writes the system
      // text + "\n\n" in front of the *last* user message; Loom uses the first, so that the text
      // of earlier turns never changes and a chat can keep its KV cache.
      if (i == 0 && s.system) out += s.system->content + "\n\n";
      out += m.content;
      out += " [/INST]";
    } else {
      out += m.content;
      out += eos;
    }
  }
  return out;
}

std::string render_llama3(std::span<const ChatMessage> messages, const ChatRenderOptions& o) {
  std::string out = o.add_bos ? bos_text(ChatTemplate::llama3, o) : "";
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += trim(m.content);
    out += "<|eot_id|>";
  }
  if (o.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_chatml(std::span<const ChatMessage> messages, const ChatRenderOptions& o) {
  std::string out = o.add_bos ? bos_text(ChatTemplate::chatml, o) : "";
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (o.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_gemma(std::span<const ChatMessage> messages, const ChatRenderOptions& o) {
  const Split s = split_system(messages);
  std::string out = o.add_bos ? bos_text(ChatTemplate::gemma, o) : "";
  for (size_t i = 0; i < s.turns.size(); ++i) {
    const ChatMessage& m = s.turns[i];
    out += m.role == "assistant" ? "<start_of_turn>model\n" : "<start_of_turn>user\n";
    if (i == 0 && s.system) out += s.system->content + "\n\n";
    out += trim(m.content);
    out += "<end_of_turn>\n";
  }
  if (o.add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::llama2:
      return "llama2";
    case ChatTemplate::llama3:
      return "llama3";
    case ChatTemplate::chatml:
      return "chatml";
    case ChatTemplate::gemma:
      return "gemma";
    case ChatTemplate::mistral:
      return "mistral";
  }
  return "invalid";
}

std::string chat_template_names() {
  std::string out;
  for (const NamedTemplate& n : kNames) out += fmt::format("{}{}", out.empty() ? "" : ", ", n.name);
  return out;
}

Result<ChatTemplate> chat_template_from_name(std::string_view name) {
  for (const NamedTemplate& n : kNames)
    if (name == n.name) return n.t;
  return make_error(StatusCode::invalid_argument, "unknown chat template '{}' (built-in templates: {})", name,
                    chat_template_names());
}

std::optional<ChatTemplate> detect_chat_template(std::string_view jinja) {
  auto has = [&](std::string_view marker) { return jinja.find(marker) != std::string_view::npos; };
  if (has("<|im_start|>")) return ChatTemplate::chatml;
  if (has("<|start_header_id|>")) return ChatTemplate::llama3;
  if (has("<start_of_turn>")) return ChatTemplate::gemma;
  if (has("[INST]")) return has("<<SYS>>") ? ChatTemplate::llama2 : ChatTemplate::mistral;
  return std::nullopt;
}

Result<ChatTemplate> chat_template_for_model(const GgufFile& file, std::string_view override_name) {
  if (!override_name.empty()) return chat_template_from_name(override_name);
  const char* key = "tokenizer.chat_template";
  if (!file.has(key))
    return make_error(StatusCode::invalid_argument,
                      "{}: no {} in the file; choose one with --chat-template (built-in templates: {})",
                      file.name(), key, chat_template_names());
  auto jinja = file.get_string(key);
  if (!jinja) return jinja.status();
  if (auto t = detect_chat_template(*jinja)) return *t;
  return make_error(StatusCode::unsupported,
                    "{}: {} matches none of the built-in templates; choose one with --chat-template "
                    "(built-in templates: {})",
                    file.name(), key, chat_template_names());
}

Result<std::string> render_chat(ChatTemplate t, std::span<const ChatMessage> messages,
                                const ChatRenderOptions& options) {
  LOOM_TRY(check_roles(t, messages));
  switch (t) {
    case ChatTemplate::llama2:
      return render_llama2(messages, options);
    case ChatTemplate::llama3:
      return render_llama3(messages, options);
    case ChatTemplate::chatml:
      return render_chatml(messages, options);
    case ChatTemplate::gemma:
      return render_gemma(messages, options);
    case ChatTemplate::mistral:
      return render_mistral(messages, options);
  }
  return make_error(StatusCode::invalid_argument, "render_chat: invalid template {}", static_cast<int>(t));
}

std::string chat_end_of_turn(ChatTemplate t, const ChatRenderOptions& options) {
  switch (t) {
    case ChatTemplate::llama2:
    case ChatTemplate::mistral:
      return eos_text(t, options);
    case ChatTemplate::llama3:
      return "<|eot_id|>";
    case ChatTemplate::chatml:
      return "<|im_end|>";
    case ChatTemplate::gemma:
      return "<end_of_turn>";
  }
  return "";
}

}  // namespace loom
