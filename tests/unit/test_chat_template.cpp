// Chat templates: each built-in format rendered for a known conversation equals, byte for byte,
// what the family's reference Jinja template (Hugging Face tokenizer_config.json) produces for it;
// detection from template texts as GGUF files carry them; errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/chat.h"
#include "loom/gguf.h"
#include "loom/text_stream.h"

namespace loom {
namespace {

// The conversation the Hugging Face chat-template tests use.
const std::vector<ChatMessage> kChat = {
    {"user", "Hello, how are you?"},
    {"assistant", "I'm doing great. How can I help you today?"},
    {"user", "I'd like to show off how chat templating works!"},
};
const char* kSystem = "You are a friendly chatbot who always responds in the style of a pirate";

std::vector<ChatMessage> with_system() {
  std::vector<ChatMessage> m = {{"system", kSystem}};
  m.insert(m.end(), kChat.begin(), kChat.end());
  return m;
}

std::string render(ChatTemplate t, const std::vector<ChatMessage>& m, const ChatRenderOptions& o) {
  auto r = render_chat(t, m, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::string();
}

ChatRenderOptions reference_options(bool add_generation_prompt) {
  ChatRenderOptions o;
  o.add_bos = true;  // the reference templates write bos_token themselves
  o.add_generation_prompt = add_generation_prompt;
  return o;
}

// meta-llama/Llama-2-7b-chat-hf (transformers' llama default template), with a system message.
TEST(ChatTemplate, Llama2MatchesReference) {
  ChatRenderOptions o = reference_options(false);
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  EXPECT_EQ(render(ChatTemplate::llama2, with_system(), o),
            "<s>[INST] <<SYS>>\nYou are a friendly chatbot who always responds in the style of a "
            "pirate\n<</SYS>>\n\n"
            "Hello, how are you? [/INST] I'm doing great. How can I help you today? </s>"
            "<s>[INST] I'd like to show off how chat templating works! [/INST]");
  // The family defaults are the same texts; add_generation_prompt adds nothing (the prompt ends
  // with [/INST] already).
  EXPECT_EQ(render(ChatTemplate::llama2, with_system(), reference_options(true)),
            render(ChatTemplate::llama2, with_system(), o));
  // Without a system message, and without the leading BOS (left to the tokenizer).
  ChatRenderOptions no_bos;
  EXPECT_EQ(render(ChatTemplate::llama2, kChat, no_bos),
            "[INST] Hello, how are you? [/INST] I'm doing great. How can I help you today? </s>"
            "<s>[INST] I'd like to show off how chat templating works! [/INST]");
}

// meta-llama/Meta-Llama-3-8B-Instruct.
TEST(ChatTemplate, Llama3MatchesReference) {
  EXPECT_EQ(
      render(ChatTemplate::llama3, with_system(), reference_options(true)),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "You are a friendly chatbot who always responds in the style of a pirate<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nI'm doing great. How can I help you today?<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nI'd like to show off how chat templating works!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(
      render(ChatTemplate::llama3, kChat, reference_options(false)),
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nI'm doing great. How can I help you today?<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nI'd like to show off how chat templating "
      "works!<|eot_id|>");
}

// transformers' ChatML default template (Qwen and many fine-tunes use the same text).
TEST(ChatTemplate, ChatmlMatchesReference) {
  EXPECT_EQ(render(ChatTemplate::chatml, kChat, reference_options(false)),
            "<|im_start|>user\nHello, how are you?<|im_end|>\n"
            "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
            "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n");
  EXPECT_EQ(render(ChatTemplate::chatml, with_system(), reference_options(true)),
            "<|im_start|>system\nYou are a friendly chatbot who always responds in the style of a "
            "pirate<|im_end|>\n"
            "<|im_start|>user\nHello, how are you?<|im_end|>\n"
            "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
            "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"
            "<|im_start|>assistant\n");
  // "qwen" names the same format
  auto q = chat_template_from_name("qwen");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, ChatTemplate::chatml);
}

// google/gemma-2b-it (no system message) and google/gemma-3-4b-it (system text opens the first
// user turn).
TEST(ChatTemplate, GemmaMatchesReference) {
  ChatRenderOptions o;  // the reference test renders without a bos_token
  o.add_generation_prompt = false;
  EXPECT_EQ(render(ChatTemplate::gemma, kChat, o),
            "<start_of_turn>user\nHello, how are you?<end_of_turn>\n"
            "<start_of_turn>model\nI'm doing great. How can I help you today?<end_of_turn>\n"
            "<start_of_turn>user\nI'd like to show off how chat templating works!<end_of_turn>\n");
  EXPECT_EQ(
      render(ChatTemplate::gemma, with_system(), reference_options(true)),
      "<bos><start_of_turn>user\nYou are a friendly chatbot who always responds in the style of a pirate\n\n"
      "Hello, how are you?<end_of_turn>\n"
      "<start_of_turn>model\nI'm doing great. How can I help you today?<end_of_turn>\n"
      "<start_of_turn>user\nI'd like to show off how chat templating works!<end_of_turn>\n"
      "<start_of_turn>model\n");
}

// mistralai/Mixtral-8x7B-Instruct-v0.1 (= Mistral-7B-Instruct-v0.2).
TEST(ChatTemplate, MistralMatchesReference) {
  EXPECT_EQ(render(ChatTemplate::mistral, kChat, reference_options(true)),
            "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you today?</s>"
            "[INST] I'd like to show off how chat templating works! [/INST]");
  // Loom's documented choice for a system message: in front of the first user message.
  EXPECT_EQ(render(ChatTemplate::mistral, with_system(), ChatRenderOptions{}),
            "[INST] You are a friendly chatbot who always responds in the style of a pirate\n\n"
            "Hello, how are you? [/INST]I'm doing great. How can I help you today?</s>"
            "[INST] I'd like to show off how chat templating works! [/INST]");
}

// llama2, llama3 and gemma strip each message (their templates trim); chatml and mistral do not.
TEST(ChatTemplate, WhitespaceHandling) {
  const std::vector<ChatMessage> m = {{"user", "  hi there \n"}};
  ChatRenderOptions o;
  EXPECT_EQ(render(ChatTemplate::llama2, m, o), "[INST] hi there [/INST]");
  EXPECT_EQ(render(ChatTemplate::llama3, m, o),
            "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(ChatTemplate::gemma, m, o),
            "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render(ChatTemplate::chatml, m, o),
            "<|im_start|>user\n  hi there \n<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(ChatTemplate::mistral, m, o), "[INST]   hi there \n [/INST]");
}

// The model's own BOS/EOS texts replace the family defaults.
TEST(ChatTemplate, ModelTokenTexts) {
  ChatRenderOptions o;
  o.bos_token = "<|begin_of_text|>";
  o.eos_token = "<|end_of_text|>";
  EXPECT_EQ(render(ChatTemplate::llama2, kChat, o),
            "[INST] Hello, how are you? [/INST] I'm doing great. How can I help you today? <|end_of_text|>"
            "<|begin_of_text|>[INST] I'd like to show off how chat templating works! [/INST]");
  EXPECT_EQ(chat_end_of_turn(ChatTemplate::llama2, o), "<|end_of_text|>");
  EXPECT_EQ(chat_end_of_turn(ChatTemplate::mistral, {}), "</s>");
  EXPECT_EQ(chat_end_of_turn(ChatTemplate::llama3, o), "<|eot_id|>");
  EXPECT_EQ(chat_end_of_turn(ChatTemplate::chatml, o), "<|im_end|>");
  EXPECT_EQ(chat_end_of_turn(ChatTemplate::gemma, o), "<end_of_turn>");
}

// Each rendering of a growing conversation starts with the previous turn's prompt, generation
// prompt included: what lets `loom chat` keep its KV cache across turns.
TEST(ChatTemplate, EarlierTurnsAreAPrefix) {
  for (ChatTemplate t : {ChatTemplate::llama2, ChatTemplate::llama3, ChatTemplate::chatml,
                         ChatTemplate::gemma, ChatTemplate::mistral}) {
    SCOPED_TRACE(chat_template_name(t));
    std::vector<ChatMessage> m = with_system();
    const std::string before = render(t, m, ChatRenderOptions{});
    m.push_back({"assistant", "Arr."});
    m.push_back({"user", "And now?"});
    const std::string after = render(t, m, ChatRenderOptions{});
    ASSERT_GE(after.size(), before.size());
    EXPECT_EQ(after.substr(0, before.size()), before);
  }
}

TEST(ChatTemplate, RoleErrors) {
  ChatRenderOptions o;
  // system message not first
  const std::vector<ChatMessage> late_system = {{"user", "a"}, {"system", "b"}};
  for (ChatTemplate t : {ChatTemplate::llama2, ChatTemplate::chatml}) {
    auto r = render_chat(t, late_system, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(r.status().message().find("message 1"), std::string::npos) << r.status().message();
  }
  // strict alternation for llama2, gemma, mistral
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  for (ChatTemplate t : {ChatTemplate::llama2, ChatTemplate::gemma, ChatTemplate::mistral}) {
    auto r = render_chat(t, two_users, o);
    ASSERT_FALSE(r.ok()) << chat_template_name(t);
    EXPECT_NE(r.status().message().find("alternate"), std::string::npos);
  }
  // chatml and llama3 take them, and other roles too
  EXPECT_TRUE(render_chat(ChatTemplate::chatml, two_users, o).ok());
  const std::vector<ChatMessage> tool = {{"user", "a"}, {"tool", "42"}};
  EXPECT_EQ(
      render(ChatTemplate::llama3, tool, o),
      "<|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>tool<|end_header_id|>\n\n42"
      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // empty role
  EXPECT_FALSE(render_chat(ChatTemplate::chatml, std::vector<ChatMessage>{{"", "x"}}, o).ok());
}

TEST(ChatTemplate, Names) {
  for (ChatTemplate t : {ChatTemplate::llama2, ChatTemplate::llama3, ChatTemplate::chatml,
                         ChatTemplate::gemma, ChatTemplate::mistral}) {
    auto r = chat_template_from_name(chat_template_name(t));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, t);
  }
  auto bad = chat_template_from_name("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  const std::string& msg = bad.status().message();
  EXPECT_NE(msg.find("vicuna"), std::string::npos);
  for (const char* name : {"llama2", "llama3", "chatml", "qwen", "gemma", "mistral"})
    EXPECT_NE(msg.find(name), std::string::npos) << name;
}

// Template texts in the style of the published tokenizer_config.json files.
TEST(ChatTemplate, DetectFromJinja) {
  const char* qwen25 =
      "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n{%- else %}\n    {%- if messages[0]['role'] == "
      "'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    "
      "{%- else "
      "%}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}";
  const char* llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
      "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content "
      "}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
      "{% endif %}";
  const char* gemma =
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
      "supported') }}"
      "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = "
      "'model' %}"
      "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
      "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
      "{{'<start_of_turn>model\\n'}}{% endif %}";
  const char* llama2 =
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
      "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
      "{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}"
      "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
      "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
      "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
      "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
  const char* mixtral =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == "
      "0) "
      "%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% "
      "endif %}"
      "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
      "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}";
  const char* zephyr =
      "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
      "message['content'] + "
      "eos_token }}\n{% endif %}\n{% endfor %}";
  EXPECT_EQ(detect_chat_template(qwen25), ChatTemplate::chatml);
  EXPECT_EQ(detect_chat_template(llama3), ChatTemplate::llama3);
  EXPECT_EQ(detect_chat_template(gemma), ChatTemplate::gemma);
  EXPECT_EQ(detect_chat_template(llama2), ChatTemplate::llama2);
  EXPECT_EQ(detect_chat_template(mixtral), ChatTemplate::mistral);
  EXPECT_EQ(detect_chat_template(zephyr), std::nullopt);
  EXPECT_EQ(detect_chat_template(""), std::nullopt);
}

Result<GgufFile> parse_kvs(const GgufWriter& w, std::vector<uint8_t>& bytes) {
  auto b = w.serialize();
  if (!b) return b.status();
  bytes = std::move(*b);
  return GgufFile::parse(bytes, "test.gguf");
}

TEST(ChatTemplate, ForModel) {
  std::vector<uint8_t> bytes;
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_string("tokenizer.chat_template", "{{ '<start_of_turn>user\\n' }}").ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    auto t = chat_template_for_model(*f, "");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(*t, ChatTemplate::gemma);
    // --chat-template overrides the file
    auto o = chat_template_for_model(*f, "llama3");
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(*o, ChatTemplate::llama3);
    auto bad = chat_template_for_model(*f, "nope");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("chatml"), std::string::npos);
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_string("tokenizer.chat_template", "{{ 'USER: ' + message['content'] }}").ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok());
    auto t = chat_template_for_model(*f, "");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("--chat-template"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("test.gguf"), std::string::npos);
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_u32("general.alignment", 32).ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok());
    auto t = chat_template_for_model(*f, "");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("no tokenizer.chat_template"), std::string::npos)
        << t.status().message();
    EXPECT_TRUE(chat_template_for_model(*f, "mistral").ok());
  }
}

TEST(ChatTemplate, FormatForModelRendersTheJinjaTemplate) {
  std::vector<uint8_t> bytes;
  const std::vector<ChatMessage> conv = {{"system", "S"}, {"user", "U1"}};
  ChatRenderOptions ro;
  ro.bos_token = "<s>";
  ro.eos_token = "</s>";
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_string("tokenizer.chat_template",
                             "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                             "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
                    .ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok());
    auto fmt = chat_format_for_model(*f, "");
    ASSERT_TRUE(fmt.ok()) << fmt.status().to_string();
    ASSERT_TRUE(fmt->jinja.has_value());
    EXPECT_NE(fmt->description.find("test.gguf: tokenizer.chat_template"), std::string::npos) << fmt->description;
    // the template's leading BOS text is removed unless add_bos (the caller adds the id)
    EXPECT_EQ(*render_chat(*fmt, conv, ro),
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n");
    ro.add_bos = true;
    EXPECT_EQ(render_chat(*fmt, conv, ro)->substr(0, 15), "<s><|im_start|>");
    EXPECT_EQ(chat_end_of_turn(*fmt, ro), "<|im_end|>");
    // --chat-template still picks a built-in
    auto builtin = chat_format_for_model(*f, "llama3");
    ASSERT_TRUE(builtin.ok());
    EXPECT_FALSE(builtin->jinja.has_value());
    EXPECT_EQ(builtin->builtin, ChatTemplate::llama3);
  }
  {
    // a template that rejects the conversation: the error names the template and the line
    GgufWriter w;
    ASSERT_TRUE(w.add_string("tokenizer.chat_template",
                             "{% for m in messages %}\n{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
                             "{% endif %}{% endfor %}")
                    .ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok());
    auto fmt = chat_format_for_model(*f, "");
    ASSERT_TRUE(fmt.ok());
    auto r = render_chat(*fmt, conv, ro);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(), "test.gguf: tokenizer.chat_template: line 2: no system role");
  }
  {
    // no template: the plain fallback, chatml, says so
    GgufWriter w;
    ASSERT_TRUE(w.add_u32("general.alignment", 32).ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok());
    auto fmt = chat_format_for_model(*f, "");
    ASSERT_TRUE(fmt.ok());
    EXPECT_FALSE(fmt->jinja.has_value());
    EXPECT_EQ(fmt->builtin, ChatTemplate::chatml);
    EXPECT_NE(fmt->description.find("fallback"), std::string::npos);
  }
  {
    // a template that does not parse, with known markers: the built-in family
    GgufWriter w;
    ASSERT_TRUE(w.add_string("tokenizer.chat_template", "{% for m in messages %}<start_of_turn>{{ m.content }").ok());
    auto f = parse_kvs(w, bytes);
    ASSERT_TRUE(f.ok());
    auto fmt = chat_format_for_model(*f, "");
    ASSERT_TRUE(fmt.ok()) << fmt.status().to_string();
    EXPECT_FALSE(fmt->jinja.has_value());
    EXPECT_EQ(fmt->builtin, ChatTemplate::gemma);
  }
}

// `loom chat` streaming: the end-of-turn text spelled across pieces is held back and never printed.
TEST(ChatStream, StopFilterHoldsBackAndCuts) {
  std::string printed;
  std::vector<std::string> calls;
  StopFilter f("<|im_end|>", [&](std::string_view s) {
    printed += s;
    calls.emplace_back(s);
  });
  EXPECT_FALSE(f.add("Hello"));
  EXPECT_EQ(printed, "Hello");
  EXPECT_FALSE(f.add(" <"));  // could start the stop string: held back
  EXPECT_EQ(printed, "Hello ");
  EXPECT_FALSE(f.add("b>"));  // it did not: released
  EXPECT_EQ(printed, "Hello <b>");
  EXPECT_FALSE(f.add("!<|im"));
  EXPECT_EQ(printed, "Hello <b>!");
  EXPECT_TRUE(f.add("_end|>\nmore"));  // completed: cut with what follows
  EXPECT_EQ(printed, "Hello <b>!");
  EXPECT_EQ(f.text(), "Hello <b>!");
  f.finish();
  EXPECT_EQ(printed, "Hello <b>!");
  for (const std::string& c : calls) EXPECT_FALSE(c.empty());

  // no stop string: a held-back tail comes out at finish
  std::string out2;
  StopFilter g("</s>", [&](std::string_view s) { out2 += s; });
  EXPECT_FALSE(g.add("a</"));
  EXPECT_EQ(out2, "a");
  g.finish();
  EXPECT_EQ(out2, "a</");
  EXPECT_EQ(g.text(), "a</");

  // the stop string in one piece, at the very start
  std::string out3;
  StopFilter h("<end_of_turn>", [&](std::string_view s) { out3 += s; });
  EXPECT_TRUE(h.add("<end_of_turn>"));
  EXPECT_EQ(out3, "");
  EXPECT_EQ(h.text(), "");

  // an empty stop string passes everything through
  std::string out4;
  StopFilter pass("", [&](std::string_view s) { out4 += s; });
  EXPECT_FALSE(pass.add("<|im_end|>"));
  EXPECT_EQ(out4, "<|im_end|>");
}

TEST(ChatStream, ValidUtf8) {
  EXPECT_EQ(to_valid_utf8("plain"), "plain");
  EXPECT_EQ(to_valid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(to_valid_utf8("ab\xE2\x82"), "ab" + fffd + fffd);               // truncated at the end
  EXPECT_EQ(to_valid_utf8("\x80x"), fffd + "x");                            // stray continuation byte
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), fffd + fffd);                        // overlong '/'
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), fffd + fffd + fffd);             // surrogate U+D800
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // past U+10FFFF
  EXPECT_EQ(to_valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

// `loom serve`: a request's several stop strings (the earliest wins) and UTF-8 that never splits.
TEST(ChatStream, StopFilterSeveralStops) {
  std::string out;
  StopFilter f(std::vector<std::string>{"", "END", "\n\n"}, [&](std::string_view s) { out += s; });
  EXPECT_FALSE(f.add("a\n"));
  EXPECT_EQ(out, "a");  // "\n" may start "\n\n"
  EXPECT_FALSE(f.add("E"));
  EXPECT_EQ(out, "a\n");  // now only "E" may start a stop string ("END")
  EXPECT_FALSE(f.add("x"));
  EXPECT_EQ(out, "a\nEx");
  EXPECT_TRUE(f.add("y\n\nEND"));
  EXPECT_EQ(out, "a\nExy");
  EXPECT_EQ(f.text(), "a\nExy");
}

TEST(ChatStream, Utf8Joiner) {
  EXPECT_EQ(utf8_complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\xE2\x82"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xE2\x82\xAC"), 4u);
  EXPECT_EQ(utf8_complete_prefix("a\xF0"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);  // invalid: nothing to wait for
  Utf8Joiner j;
  EXPECT_EQ(j.add("caf\xC3"), "caf");
  EXPECT_EQ(j.add("\xA9 \xF0\x9F"), "\xC3\xA9 ");
  EXPECT_EQ(j.add("\x98"), "");
  EXPECT_EQ(j.add("\x80!"), "\xF0\x9F\x98\x80!");
  EXPECT_EQ(j.add("\xE2\x82"), "");
  EXPECT_EQ(j.finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace loom
