// Chat templates: how a conversation (system, user and assistant messages) becomes the prompt text
// a chat model was fine-tuned on. A GGUF file's Jinja template (`tokenizer.chat_template`) is
// rendered by Loom's interpreter (loom/jinja.h) exactly as transformers renders it: see ChatFormat
// and chat_format_for_model below. Besides, Loom has built-in formats for the common families
// (chosen with --chat-template, used where a template does not parse, and chatml as the plain
// fallback for a file without a template). They follow each family's reference template
// (Hugging Face `tokenizer_config.json`), with the conversation
//   system "S", user "U1", assistant "A1", user "U2", add_generation_prompt:
//
//   llama2   <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]
//   llama3   <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>
//            <|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|> ... (Meta-Llama-3-*-Instruct)
//            <|start_header_id|>assistant<|end_header_id|>\n\n
//   chatml   <|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n ...
//            <|im_start|>assistant\n                                  (Qwen, many fine-tunes)
//   gemma    <bos><start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n
//            ... <start_of_turn>model\n              (Gemma 3: the system text opens the first user turn)
//   mistral  <s>[INST] S\n\nU1 [/INST]A1</s>[INST] U2 [/INST]   (Mistral-7B-Instruct-v0.2 and
//            Mixtral-8x7B-Instruct-v0.1, "v1"; their template rejects a system message, Loom puts it
//            in front of the first user message, see render_chat)
//
// Whitespace: llama2, llama3 and gemma strip the content of each message (as their templates'
// `trim` / `.strip()` do, ASCII whitespace here); chatml and mistral keep it as given.
// BOS: with add_bos (default off) the text starts with the BOS text as the reference templates
// write it. Loom's own callers leave it off and add the BOS id when the model's tokenizer says to
// (tokenizer.ggml.add_bos_token), as llama.cpp does, so the BOS is never doubled. BOS and EOS that
// appear inside the conversation (llama2's "</s><s>" between turns, mistral's "</s>") are always
// written, as text, to be matched as special tokens by the tokenizer.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "loom/gguf.h"
#include "loom/jinja.h"
#include "loom/status.h"

namespace loom {

/// One message of a conversation. Roles: "system", "user", "assistant" (chatml and llama3 also
/// take other role names, such as "tool", and write them as given).
struct ChatMessage {
  std::string role;
  std::string content;
};

/// The built-in chat formats.
enum class ChatTemplate { llama2, llama3, chatml, gemma, mistral };

/// "llama2", "llama3", "chatml", "gemma", "mistral".
const char* chat_template_name(ChatTemplate t);
/// The names chat_template_from_name accepts, comma-separated ("llama2, llama3, chatml, qwen, ...").
std::string chat_template_names();
/// Parses a template name ("qwen" is chatml); invalid_argument listing the names otherwise.
Result<ChatTemplate> chat_template_from_name(std::string_view name);

/// Recognizes a family from a Jinja chat template by its markers, checked in this order:
/// "<|im_start|>" chatml, "<|start_header_id|>" llama3, "<start_of_turn>" gemma, "[INST]" with
/// "<<SYS>>" llama2, "[INST]" mistral. nullopt when none is present.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja);

/// The template for a model: `override_name` when not empty, else detected from the file's
/// `tokenizer.chat_template`. Errors name the file, say what was found, and list the names.
Result<ChatTemplate> chat_template_for_model(const GgufFile& file, std::string_view override_name);

/// How render_chat writes the conversation.
struct ChatRenderOptions {
  /// End with the header of an assistant turn, so the model's next tokens are the reply. llama2
  /// and mistral have no such header (the prompt already ends with "[/INST]").
  bool add_generation_prompt = true;
  /// Start with the BOS text (see the file comment).
  bool add_bos = false;
  /// The model's BOS and EOS texts; empty: the family's ("<s>"/"</s>" for llama2 and mistral,
  /// "<|begin_of_text|>" for llama3, "<bos>" for gemma, none for chatml).
  std::string bos_token;
  std::string eos_token;
};

/// The prompt text of `messages`. invalid_argument (naming the message) for an empty or unknown
/// role, a system message after the first, or, for llama2, gemma and mistral, turns that do not
/// alternate user, assistant, user, ... after the optional system message.
Result<std::string> render_chat(ChatTemplate t, std::span<const ChatMessage> messages,
                                const ChatRenderOptions& options = {});

/// The text that closes an assistant turn: "<|im_end|>", "<|eot_id|>", "<end_of_turn>", or the
/// EOS text for llama2 and mistral. Generation stops when the model produces it.
std::string chat_end_of_turn(ChatTemplate t, const ChatRenderOptions& options = {});

/// How a model's conversations become prompt text: its own Jinja template (rendered by Loom's
/// interpreter as transformers renders it, see loom/jinja.h) or one of the built-in formats.
struct ChatFormat {
  /// Set: render with this template. Unset: the built-in `builtin`.
  std::optional<JinjaTemplate> jinja;
  /// The built-in format; with a Jinja template, the family its markers suggest (for the end of
  /// turn), chatml when none.
  ChatTemplate builtin = ChatTemplate::chatml;
  /// Whether `builtin` was recognized in (or chosen instead of) the Jinja text.
  bool family_known = false;
  /// One line for the user: "jinja (model.gguf: tokenizer.chat_template)", "chatml (--chat-template)".
  std::string description;
};

/// The format for a model, in this order: the built-in `override_name` when not empty; the Jinja
/// template in `template_file` when not empty; the file's `tokenizer.chat_template` rendered by
/// the interpreter (when it does not parse, the built-in family its markers name, else the parse
/// error); with no template in the file, the plain fallback chatml (as llama.cpp does), which
/// the description says.
Result<ChatFormat> chat_format_for_model(const GgufFile& file, std::string_view override_name,
                                         const std::string& template_file = {});

/// The prompt text of `messages` in `format`. With a Jinja template, the messages are passed as
/// transformers passes them (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, no
/// tools); `add_bos` false removes a BOS text the template writes first, so that callers that add
/// the BOS id themselves (see the file comment) do not double it. Template errors (a template that
/// rejects the conversation with raise_exception) name the template and line.
Result<std::string> render_chat(const ChatFormat& format, std::span<const ChatMessage> messages,
                                const ChatRenderOptions& options = {});

/// The text that closes an assistant turn in `format` (the family's, or the EOS text for a Jinja
/// template of no known family).
std::string chat_end_of_turn(const ChatFormat& format, const ChatRenderOptions& options = {});

}  // namespace loom
