// OpenAI request parsing and response pieces (serve_api.h).
#include "serve_api.h"

#include <cmath>

#include <fmt/format.h>

#include "loom/text_stream.h"

namespace loom::serve {

namespace {

const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

const char* json_type_name(const json& v) { return v.type_name(); }

[[noreturn]] void bad_type(const std::string& param, const char* want, const json& v) {
  throw ApiError(400, fmt::format("'{}': expected {}, got {}", param, want, json_type_name(v)), param,
                 "invalid_type");
}

// An optional field: absent or null leaves `out` as it is.
template <typename T>
bool get(const json& body, const std::string& key, T& out);

template <>
bool get<bool>(const json& body, const std::string& key, bool& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_boolean()) bad_type(key, "a boolean", *it);
  out = it->get<bool>();
  return true;
}

template <>
bool get<double>(const json& body, const std::string& key, double& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_number()) bad_type(key, "a number", *it);
  out = it->get<double>();
  if (!std::isfinite(out)) throw ApiError(400, fmt::format("'{}' must be finite", key), key);
  return true;
}

template <>
bool get<int64_t>(const json& body, const std::string& key, int64_t& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if (it->is_number_integer()) {
    out = it->get<int64_t>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
             std::fabs(it->get<double>()) < 9e15) {
    out = static_cast<int64_t>(it->get<double>());
  } else {
    bad_type(key, "an integer", *it);
  }
  return true;
}

// `key` when present (else `fallback`), refused with a 400 naming it outside [lo, hi].
template <class T>
T get_range(const json& body, const std::string& key, T lo, T hi, T fallback) {
  T v = fallback;
  if (get(body, key, v) && (v < lo || v > hi))
    throw ApiError(400, fmt::format("'{}' is {}; it must lie in [{}, {}]", key, v, lo, hi), key,
                   "invalid_value");
  return v;
}

std::string text_of_content(const json& content, const std::string& param) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_type(param, "a string or an array of content parts", content);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) bad_type(p, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text")
      throw ApiError(400, fmt::format("'{}': only content parts of type \"text\" are supported", p), p);
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      bad_type(p + ".text", "a string", text == part.end() ? json() : *text);
    out += text->get<std::string>();
  }
  return out;
}

void check_utf8(const std::string& s, const std::string& param) {
  if (text::utf8_first_invalid(s) != std::string::npos)
    throw ApiError(400, fmt::format("'{}' is not valid UTF-8", param), param);
}

}  // namespace

ApiError::ApiError(int status_, std::string message_, std::string param_, std::string code_)
    : status(status_),
      message(std::move(message_)),
      type(error_type(status_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

json ApiError::body() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

std::vector<ChatMessage> parse_messages(const json& messages) {
  if (!messages.is_array()) bad_type("messages", "an array", messages);
  if (messages.empty()) throw ApiError(400, "'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_type(p, "an object", m);
    auto role = m.find("role");
    if (role == m.end()) throw ApiError(400, fmt::format("'{}.role' is missing", p), p + ".role");
    if (!role->is_string()) bad_type(p + ".role", "a string", *role);
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for the system role
    auto content = m.find("content");
    msg.content = content == m.end() ? "" : text_of_content(*content, p + ".content");
    check_utf8(msg.content, p + ".content");
    check_utf8(msg.role, p + ".role");
    out.push_back(std::move(msg));
  }
  return out;
}

GenerationParams parse_generation(const json& body, Endpoint endpoint, const SamplerParams& defaults) {
  if (!body.is_object()) bad_type("body", "a JSON object", body);
  GenerationParams p;
  p.endpoint = endpoint;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) bad_type("model", "a string", *it);
    p.model = it->get<std::string>();
  }
  if (endpoint == Endpoint::chat) {
    auto it = body.find("messages");
    if (it == body.end()) throw ApiError(400, "'messages' is missing", "messages");
    p.messages = parse_messages(*it);
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is missing", "prompt");
    const json& pr = *it;
    if (pr.is_string()) {
      p.prompt_text = pr.get<std::string>();
    } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
      p.prompt_text = pr[0].get<std::string>();
    } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
      p.prompt_is_tokens = true;
      for (const json& t : pr) {
        if (!t.is_number_integer()) bad_type("prompt", "a string or an array of token ids", pr);
        p.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else if (pr.is_array() && !pr.empty() && pr[0].is_array()) {
      throw ApiError(400, "'prompt': several prompts in one request are not supported (n = 1)", "prompt");
    } else {
      bad_type("prompt", "a string or an array of token ids", pr);
    }
    check_utf8(p.prompt_text, "prompt");
  }
  get(body, "stream", p.stream);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad_type("stream_options", "an object", *it);
    get(*it, "include_usage", p.include_usage);
  }
  if (int64_t n = get_range<int64_t>(body, "n", 1, 128, 1); n != 1)
    throw ApiError(400, "'n': only n = 1 is supported", "n", "unsupported_value");

  SamplerParams& s = p.sampling;
  s = defaults;
  s.temperature = static_cast<float>(get_range<double>(body, "temperature", 0.0, 2.0, defaults.temperature));
  s.top_p = static_cast<float>(get_range<double>(body, "top_p", 0.0, 1.0, defaults.top_p));
  s.min_p = static_cast<float>(get_range<double>(body, "min_p", 0.0, 1.0, defaults.min_p));
  s.top_k = static_cast<int32_t>(get_range<int64_t>(body, "top_k", 0, 1 << 30, defaults.top_k));
  s.penalties.presence =
      static_cast<float>(get_range<double>(body, "presence_penalty", -2.0, 2.0, defaults.penalties.presence));
  s.penalties.frequency = static_cast<float>(
      get_range<double>(body, "frequency_penalty", -2.0, 2.0, defaults.penalties.frequency));
  s.penalties.repeat =
      static_cast<float>(get_range<double>(body, "repeat_penalty", 0.0, 10.0, defaults.penalties.repeat));
  int64_t seed = -1;
  if (get(body, "seed", seed)) s.seed = static_cast<uint32_t>(seed);  // any integer: its low 32 bits
  // max_completion_tokens is the newer name; both accepted, the newer wins.
  int64_t max_tokens = -1;
  get(body, "max_tokens", max_tokens);
  get(body, "max_completion_tokens", max_tokens);
  if (body.contains("max_tokens") || body.contains("max_completion_tokens")) {
    const char* key = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                          ? "max_completion_tokens"
                          : "max_tokens";
    if (max_tokens != -1 && (max_tokens < 0 || max_tokens > (1 << 24)))
      throw ApiError(400, fmt::format("'{}' is {}; it must be at least 0", key, max_tokens), key,
                     "invalid_value");
  }
  p.max_tokens = static_cast<int>(max_tokens);
  get(body, "ignore_eos", p.ignore_eos);

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 16) throw ApiError(400, "'stop': at most 16 strings", "stop");
      for (const json& x : *it) {
        if (!x.is_string()) bad_type("stop", "a string or an array of strings", *it);
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_type("stop", "a string or an array of strings", *it);
    }
    for (const auto& x : p.stop) check_utf8(x, "stop");
  }

  if (endpoint == Endpoint::chat) {
    bool logprobs = false;
    get(body, "logprobs", logprobs);
    const int64_t top = get_range<int64_t>(body, "top_logprobs", 0, 20, 0);
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null() && !logprobs)
      throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    p.top_logprobs = logprobs ? static_cast<int>(top) : -1;
  } else {
    int64_t n = -1;
    if (auto it = body.find("logprobs"); it != body.end() && it->is_boolean()) {
      n = it->get<bool>() ? 0 : -1;  // some clients send a boolean here too
    } else {
      n = get_range<int64_t>(body, "logprobs", 0, 20, -1);
    }
    p.top_logprobs = static_cast<int>(n);
  }
  return p;
}

std::string token_text(const Tokenizer& tok, int32_t id) {
  auto piece = tok.token_to_piece(id, /*render_special=*/true);
  return piece ? to_valid_utf8(*piece) : std::string();
}

namespace {

json bytes_of(const Tokenizer& tok, int32_t id) {
  json out = json::array();
  if (auto piece = tok.token_to_piece(id, true))
    for (char c : *piece) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

json chat_logprob(const Tokenizer& tok, const TokenLogprob& lp) {
  json top = json::array();
  for (const auto& [id, l] : lp.top)
    top.push_back({{"token", token_text(tok, id)}, {"logprob", l}, {"bytes", bytes_of(tok, id)}});
  return {{"token", token_text(tok, lp.id)},
          {"logprob", lp.logprob},
          {"bytes", bytes_of(tok, lp.id)},
          {"top_logprobs", top}};
}

void add_completion_logprob(json& logprobs, const Tokenizer& tok, const TokenLogprob& lp, size_t offset) {
  if (logprobs.is_null())
    logprobs = {{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
  logprobs["tokens"].push_back(token_text(tok, lp.id));
  logprobs["token_logprobs"].push_back(lp.logprob);
  json top = json::object();
  for (const auto& [id, l] : lp.top) top[token_text(tok, id)] = l;
  logprobs["top_logprobs"].push_back(top);
  logprobs["text_offset"].push_back(offset);
}

json usage_json(int n_prompt, int n_generated, int n_cached) {
  return {{"prompt_tokens", n_prompt},
          {"completion_tokens", n_generated},
          {"total_tokens", n_prompt + n_generated},
          {"prompt_tokens_details", {{"cached_tokens", n_cached}}}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace loom::serve
