// OpenAI's request and response shapes: parsing and checking requests (unknown fields ignored, as
// OpenAI does), building responses, stream chunks and errors.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/chat.h"
#include "loom/sample.h"
#include "loom/text.h"
#include "serve_engine.h"

namespace loom::serve {

using json = nlohmann::json;

/// An error answered to the client: HTTP status and OpenAI's {"error": {...}} body. Thrown inside a
/// handler, caught at its boundary.
struct ApiError : std::exception {
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
  const char* what() const noexcept override { return message.c_str(); }
  json body() const;

  int status;
  std::string message;
  std::string type;
  std::string param;
  std::string code;
};

enum class Endpoint { chat, completion };

/// A generation request as the client sent it, checked; the prompt is still text or messages.
struct GenerationParams {
  Endpoint endpoint = Endpoint::chat;
  std::string model;
  bool stream = false;
  bool include_usage = false;          ///< stream_options.include_usage
  std::vector<ChatMessage> messages;   ///< chat
  std::string prompt_text;             ///< completion with a text prompt
  std::vector<int32_t> prompt_tokens;  ///< completion with a token prompt
  bool prompt_is_tokens = false;
  SamplerParams sampling;
  int max_tokens = -1;
  std::vector<std::string> stop;
  int top_logprobs = -1;    ///< -1: no logprobs
  bool ignore_eos = false;  ///< llama-server's: end-of-generation tokens do not end the request (benchmarks)
};

/// Parses a /v1/chat/completions or /v1/completions body; `defaults` fills what it leaves out.
/// Throws ApiError (400) naming the parameter.
GenerationParams parse_generation(const json& body, Endpoint endpoint, const SamplerParams& defaults);
/// Parses a `messages` array (content as a string or a list of text parts). Throws ApiError.
std::vector<ChatMessage> parse_messages(const json& messages);

/// Everything a response or chunk repeats.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

/// Token text for logprobs: the piece with special tokens spelled out, made valid UTF-8.
std::string token_text(const Tokenizer& tok, int32_t id);
/// One entry of a chat response's logprobs.content.
json chat_logprob(const Tokenizer& tok, const TokenLogprob& lp);
/// Appends one token to a completion response's logprobs object (tokens, token_logprobs, top_logprobs,
/// text_offset), `offset` being the token's offset in the completion text.
void add_completion_logprob(json& logprobs, const Tokenizer& tok, const TokenLogprob& lp, size_t offset);
json usage_json(int n_prompt, int n_generated, int n_cached);

/// A body as text, with invalid UTF-8 replaced instead of throwing.
std::string dump(const json& j);

}  // namespace loom::serve
