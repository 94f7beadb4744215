// `loom serve` in-process: the server on a free port over the built-in model (CPU), driven by
// httplib clients. Every endpoint, streaming and not; the error cases; many concurrent streams,
// each equal to the same request run alone (no cross-talk between slots); a client that goes
// away mid-stream; a full queue.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/llm.h"
#include "loom/quant_mixture.h"
#include "loom/serve.h"
#include "loom/text.h"
#include "loom/text_stream.h"
#include "synth_model.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// A server on a free port with the built-in model loaded (or not, for the loading tests).
class TestServer {
 public:
  explicit TestServer(ServerOptions o = {}, int n_ctx = 0, bool load = true,
                      std::string model = LOOM_TEST_MODEL, std::string chat_template = "")
      : model_(std::move(model)), chat_template_(std::move(chat_template)) {
    o.port = 0;
    auto s = Server::create(o);
    if (!s) throw std::runtime_error(s.status().to_string());
    server_ = std::move(*s);
    server_->start();
    n_ctx_ = n_ctx;
    if (load) attach();
  }
  ~TestServer() { server_->stop(); }

  void attach() {
    llm::SessionParams sp;
    sp.model_path = model_;
    // LOOM_TEST_BACKEND=cuda runs the same tests on the GPU (with LOOM_NUMERICS=exact, so that a
    // prompt decoded in other chunks, as a reused prefix is, gives the same bits).
    const char* backend = std::getenv("LOOM_TEST_BACKEND");
    sp.backend = backend && *backend ? backend : "cpu";
    sp.n_threads = 1;  // the machines that run CI are small and shared
    sp.n_ctx = n_ctx_;
    sp.progress = false;
    sp.print_summary = false;
    auto session = llm::open_session(sp);
    if (!session) throw std::runtime_error(session.status().to_string());
    auto tok = Tokenizer::from_gguf(session->model->gguf());
    if (!tok) throw std::runtime_error(tok.status().to_string());
    auto format = chat_format_for_model(session->model->gguf(), *tok, chat_template_);
    if (!format) throw std::runtime_error(format.status().to_string());
    if (Status st = server_->attach(std::move(*session), std::move(*format)); !st.ok())
      throw std::runtime_error(st.to_string());
  }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    c->set_read_timeout(60, 0);
    c->set_write_timeout(10, 0);
    return c;
  }
  Server& server() { return *server_; }

 private:
  std::unique_ptr<Server> server_;
  int n_ctx_ = 0;
  std::string model_;
  std::string chat_template_;
};

struct Reply {
  int status = 0;
  json body;
  std::string raw;
};

Reply post(const TestServer& s, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}) {
  auto res = s.client()->Post(path.c_str(), headers, body, "application/json");
  Reply r;
  if (!res) return r;
  r.status = res->status;
  r.raw = res->body;
  r.body = json::parse(res->body, nullptr, false);
  return r;
}

Reply post(const TestServer& s, const std::string& path, const json& body) {
  return post(s, path, body.dump());
}

Reply get(const TestServer& s, const std::string& path) {
  auto res = s.client()->Get(path.c_str());
  Reply r;
  if (!res) return r;
  r.status = res->status;
  r.raw = res->body;
  r.body = json::parse(res->body, nullptr, false);
  return r;
}

// The "data: " payloads of an SSE body, in order ("[DONE]" included); comment lines skipped.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

// A streamed generation: its text, its finish reason and its usage chunk, checked for shape.
struct Streamed {
  int status = 0;
  std::string error;  ///< the client's, when there was no response
  std::string text;
  std::string finish_reason;
  json usage;
  size_t n_chunks = 0;
  bool done = false;
};

Streamed parse_stream(const std::string& body, bool chat) {
  Streamed s;
  for (const std::string& e : sse_events(body)) {
    if (e == "[DONE]") {
      s.done = true;
      continue;
    }
    EXPECT_FALSE(s.done) << "data after [DONE]";
    json j = json::parse(e, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << e;
    if (j.contains("error")) {
      ADD_FAILURE() << "stream error: " << e;
      continue;
    }
    EXPECT_EQ(j["object"], chat ? "chat.completion.chunk" : "text_completion");
    ++s.n_chunks;
    if (j.contains("usage") && j["usage"].is_object()) s.usage = j["usage"];
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (chat && c["delta"].contains("content")) s.text += c["delta"]["content"].get<std::string>();
    if (!chat) s.text += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
  }
  return s;
}

Streamed stream(const TestServer& srv, const std::string& path, json body) {
  body["stream"] = true;
  auto res = srv.client()->Post(path.c_str(), body.dump(), "application/json");
  Streamed s;
  if (!res) {
    s.error = httplib::to_string(res.error());
    return s;
  }
  s = parse_stream(res->body, path.find("chat") != std::string::npos);
  s.status = res->status;
  return s;
}

// A streaming completion request whose chunks go to `receiver` (return false to hang up).
httplib::Request stream_request(const std::string& prompt, int max_tokens,
                                httplib::ContentReceiverWithProgress receiver) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", true}}.dump();
  req.content_receiver = std::move(receiver);
  return req;
}

void expect_error(const Reply& r, int status, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.raw;
  ASSERT_TRUE(r.body.is_object()) << r.raw;
  ASSERT_TRUE(r.body.contains("error")) << r.raw;
  const json& e = r.body["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.raw;
  EXPECT_TRUE(e["type"].is_string()) << r.raw;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r.raw;
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r.raw;
  }
}

TEST(Serve, HealthModelsPageMetrics) {
  TestServer s;
  auto h = get(s, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body["status"], "ok");
  auto m = get(s, "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.body["object"], "list");
  EXPECT_EQ(m.body["data"][0]["id"], "loom-shakespeare-q8_0.gguf");
  EXPECT_EQ(m.body["data"][0]["object"], "model");
  auto page = get(s, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.raw.find("<!doctype html>"), std::string::npos);
  EXPECT_NE(page.raw.find("/v1/chat/completions"), std::string::npos);
  ASSERT_EQ(post(s, "/v1/completions", json{{"prompt", "ROMEO:"}, {"max_tokens", 3}}).status, 200);
  auto metrics = get(s, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  for (const char* line :
       {"loom_requests_total 1", "loom_generated_tokens_total 3", "loom_queue_depth 0",
        "loom_kv_cache_used_cells", "loom_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
        "loom_inter_token_seconds_count 2", "# TYPE loom_inter_token_seconds histogram"})
    EXPECT_NE(metrics.raw.find(line), std::string::npos) << line << "\n" << metrics.raw;
}

TEST(Serve, LoadingAnswers503) {
  TestServer s({}, 0, /*load=*/false);
  expect_error(get(s, "/health"), 503);
  expect_error(post(s, "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}),
               503);
  EXPECT_EQ(get(s, "/").status, 200);
  EXPECT_EQ(get(s, "/metrics").status, 200);
  s.attach();
  EXPECT_EQ(get(s, "/health").status, 200);
}

TEST(Serve, CompletionNonStreaming) {
  ServerOptions o;
  o.kv_block_size = 1;  // prefixes are shared in whole blocks: "ROMEO:" is a few tokens
  TestServer s(o);
  auto r = post(s, "/v1/completions", json{{"prompt", "ROMEO:"}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_TRUE(r.body["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  const json& c = r.body["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_FALSE(c["text"].get<std::string>().empty());
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 16);
  auto t = post(s, "/tokenize", json{{"content", "ROMEO:"}, {"add_special", true}});
  ASSERT_EQ(t.status, 200);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], t.body["tokens"].size());
  EXPECT_EQ(r.body["usage"]["total_tokens"], 16 + t.body["tokens"].size());
  // the same request again: the same text (greedy), and its prompt found in the cache (the first
  // request's cells, kept after it finished)
  auto again = post(s, "/v1/completions", json{{"prompt", "ROMEO:"}, {"max_tokens", 16}, {"temperature", 0}});
  EXPECT_EQ(again.body["choices"][0]["text"], c["text"]);
  // all of the prompt but its last token, whose logits are needed
  EXPECT_EQ(again.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            r.body["usage"]["prompt_tokens"].get<int>() - 1);
  // a prompt of token ids, and max_completion_tokens
  auto ids = post(s, "/v1/completions",
                  json{{"prompt", t.body["tokens"]}, {"max_completion_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(ids.status, 200) << ids.raw;
  EXPECT_EQ(ids.body["choices"][0]["text"], c["text"]);
}

TEST(Serve, StreamingEqualsNonStreaming) {
  TestServer s;
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    const bool chat = path.find("chat") != std::string::npos;
    json body = {{"max_tokens", 20}, {"temperature", 0.9}, {"seed", 7}};
    if (chat)
      body["messages"] = {{{"role", "system"}, {"content", "Speak as a king."}},
                          {{"role", "user"}, {"content", "Who goes there?"}}};
    else
      body["prompt"] = "KING HENRY:";
    auto whole = post(s, path, body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const json& c = whole.body["choices"][0];
    const std::string text = chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    if (chat) {
      EXPECT_EQ(whole.body["object"], "chat.completion");
      EXPECT_EQ(c["message"]["role"], "assistant");
    }
    body["stream_options"] = {{"include_usage", true}};
    Streamed st = stream(s, path, body);
    EXPECT_EQ(st.status, 200);
    EXPECT_TRUE(st.done);
    EXPECT_EQ(st.text, text) << path;
    EXPECT_EQ(st.finish_reason, c["finish_reason"]);
    EXPECT_EQ(st.usage["completion_tokens"], whole.body["usage"]["completion_tokens"]);
    EXPECT_EQ(st.usage["prompt_tokens"], whole.body["usage"]["prompt_tokens"]);
    EXPECT_GT(st.n_chunks, 3u);
  }
}

TEST(Serve, ChatStreamShape) {
  TestServer s;
  auto res = s.client()->Post(
      "/v1/chat/completions",
      json{{"messages", {{{"role", "user"}, {"content", "Speak."}}}}, {"stream", true}, {"max_tokens", 5}}
          .dump(),
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto events = sse_events(res->body);
  ASSERT_GE(events.size(), 3u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events.back(), "[DONE]");
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_FALSE(last.contains("usage") && last["usage"].is_object());  // only with include_usage
}

TEST(Serve, StopStrings) {
  TestServer s;
  json body = {{"prompt", "ROMEO:"}, {"max_tokens", 40}, {"temperature", 0}};
  auto whole = post(s, "/v1/completions", body);
  ASSERT_EQ(whole.status, 200);
  const std::string text = whole.body["choices"][0]["text"];
  ASSERT_GT(text.size(), 12u) << text;
  const std::string stop = text.substr(6, 3);
  const std::string expected = text.substr(0, text.find(stop));
  body["stop"] = {"no such text", stop};
  auto cut = post(s, "/v1/completions", body);
  EXPECT_EQ(cut.body["choices"][0]["text"], expected);
  EXPECT_EQ(cut.body["choices"][0]["finish_reason"], "stop");
  Streamed st = stream(s, "/v1/completions", body);
  EXPECT_EQ(st.text, expected);
  EXPECT_EQ(st.finish_reason, "stop");
  body["stop"] = stop;  // a single string
  EXPECT_EQ(post(s, "/v1/completions", body).body["choices"][0]["text"], expected);
}

TEST(Serve, SeedsAndSampling) {
  TestServer s;
  json body = {{"prompt", "JULIET:"}, {"max_tokens", 24}, {"temperature", 1.0}, {"top_p", 0.9}, {"seed", 42}};
  auto a = post(s, "/v1/completions", body);
  auto b = post(s, "/v1/completions", body);
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.body["choices"][0]["text"], b.body["choices"][0]["text"]);
  body["seed"] = 43;
  body["presence_penalty"] = 0.5;
  body["frequency_penalty"] = 0.5;
  body["top_k"] = 20;
  body["min_p"] = 0.1;
  auto c = post(s, "/v1/completions", body);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_NE(a.body["choices"][0]["text"], c.body["choices"][0]["text"]);
}

TEST(Serve, Logprobs) {
  TestServer s;
  auto r = post(s, "/v1/chat/completions",
                json{{"messages", {{{"role", "user"}, {"content", "Hail!"}}}},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"logprobs", true},
                     {"top_logprobs", 3}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& lp = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 6u);
  std::string joined;
  for (const json& e : lp) {
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    // greedy: the chosen token is the best one
    EXPECT_NEAR(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>(), 1e-6);
    EXPECT_EQ(e["token"], e["top_logprobs"][0]["token"]);
    joined += e["token"].get<std::string>();
  }
  EXPECT_EQ(joined, r.body["choices"][0]["message"]["content"]);
  auto c = post(s, "/v1/completions", json{{"prompt", "ROMEO:"}, {"max_tokens", 4}, {"logprobs", 2}});
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(c.body["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
}

TEST(Serve, TokenizeDetokenizeTemplate) {
  TestServer s;
  auto t = post(s, "/tokenize", json{{"content", "To be, or not to be"}});
  ASSERT_EQ(t.status, 200);
  ASSERT_FALSE(t.body["tokens"].empty());
  auto with_bos = post(s, "/tokenize", json{{"content", "To be, or not to be"}, {"add_special", true}});
  EXPECT_EQ(with_bos.body["tokens"].size(), t.body["tokens"].size() + 1);
  auto d = post(s, "/detokenize", json{{"tokens", t.body["tokens"]}});
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(d.body["content"], "To be, or not to be");
  auto pieces = post(s, "/tokenize", json{{"content", "To be"}, {"with_pieces", true}});
  std::string joined;
  for (const json& p : pieces.body["tokens"]) joined += p["piece"].get<std::string>();
  EXPECT_EQ(joined, "To be");
  auto a = post(
      s, "/apply-template",
      json{{"messages", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}}});
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.body["prompt"], "SYSTEM:\nS\n\nUSER:\nU\n\nASSISTANT:\n");
  expect_error(post(s, "/detokenize", json{{"tokens", {1, 999999}}}), 400, "tokens");
  expect_error(post(s, "/tokenize", json{{"text", "x"}}), 400, "content");
  expect_error(post(s, "/apply-template", json{{"messages", "hi"}}), 400, "messages");
}

TEST(Serve, Errors) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}};
  expect_error(post(s, "/v1/chat/completions", std::string("{not json")), 400);
  expect_error(post(s, "/v1/chat/completions", std::string("[1, 2]")), 400);
  expect_error(post(s, "/v1/chat/completions", json{{"max_tokens", 2}}), 400, "messages");
  auto bad = chat;
  bad["temperature"] = "hot";
  expect_error(post(s, "/v1/chat/completions", bad), 400, "temperature");
  bad = chat;
  bad["temperature"] = 3;
  expect_error(post(s, "/v1/chat/completions", bad), 400, "temperature");
  bad = chat;
  bad["n"] = 2;
  expect_error(post(s, "/v1/chat/completions", bad), 400, "n");
  bad = chat;
  bad["max_tokens"] = -5;
  expect_error(post(s, "/v1/chat/completions", bad), 400, "max_tokens");
  bad = chat;
  bad["stop"] = 5;
  expect_error(post(s, "/v1/chat/completions", bad), 400, "stop");
  bad = chat;
  bad["messages"] = {{{"role", 1}, {"content", "hi"}}};
  expect_error(post(s, "/v1/chat/completions", bad), 400, "messages[0].role");
  expect_error(post(s, "/v1/completions", json{{"prompt", 5}}), 400, "prompt");
  expect_error(post(s, "/v1/completions", json{{"prompt", {1, 2, 1 << 30}}}), 400, "prompt");
  // a prompt longer than the context (256 tokens)
  std::vector<int> ids(300, 100);
  auto long_prompt = post(s, "/v1/completions", json{{"prompt", ids}});
  expect_error(long_prompt, 400, "prompt");
  EXPECT_EQ(long_prompt.body["error"]["code"], "context_length_exceeded");
  // too large a body
  expect_error(post(s, "/v1/completions", json{{"prompt", std::string(8000, 'a')}}), 413);
  // unknown route
  expect_error(get(s, "/v1/nothing"), 404);
  // unknown fields are ignored
  auto extra = chat;
  extra["some_future_field"] = {{"x", 1}};
  extra["user"] = "abc";
  EXPECT_EQ(post(s, "/v1/chat/completions", extra).status, 200);
  // the server still answers after all that
  EXPECT_EQ(get(s, "/health").status, 200);
}

TEST(Serve, ApiKey) {
  ServerOptions o;
  o.api_key = "sesame";
  TestServer s(o);
  const std::string body = json{{"prompt", "ROMEO:"}, {"max_tokens", 2}}.dump();
  expect_error(post(s, "/v1/completions", body), 401);
  expect_error(post(s, "/v1/completions", body, {{"Authorization", "Bearer wrong"}}), 401);
  EXPECT_EQ(post(s, "/v1/completions", body, {{"Authorization", "Bearer sesame"}}).status, 200);
  EXPECT_EQ(get(s, "/health").status, 200);  // open: load balancers probe it
  expect_error(get(s, "/v1/models"), 401);
}

// A byte-level vocabulary splits characters across tokens, and a random model writes any bytes:
// streamed deltas hold whole characters only (a split one would reach the client as two U+FFFD),
// so the stream equals the non-streamed text. Also: the chatml format, its <|im_end|> as a stop.
TEST(Serve, ByteLevelStreamsWholeCharacters) {
  const std::string path = ::testing::TempDir() + "loom_serve_qwen2_tiny.gguf";
  llm::SynthOptions so;
  so.progress = false;
  ASSERT_TRUE(
      llm::write_synth_model(path, *llm::find_synth_shape("qwen2-tiny"), llm::FileType::f32, so).ok());
  TestServer s({}, 0, true, path, "chatml");
  auto t = post(s, "/apply-template", json{{"messages", {{{"role", "user"}, {"content", "h\u00e9"}}}}});
  EXPECT_EQ(t.body["prompt"], "<|im_start|>user\nh\u00e9<|im_end|>\n<|im_start|>assistant\n");
  int non_ascii = 0;
  for (int seed = 1; seed <= 12; ++seed) {
    json body = {{"messages", {{{"role", "user"}, {"content", "h\u00e9llo \u4e16\u754c"}}}},
                 {"max_tokens", 48},
                 {"temperature", 1.5},
                 {"top_k", 0},
                 {"top_p", 1.0},
                 {"min_p", 0.0},
                 {"seed", seed}};
    Streamed st = stream(s, "/v1/chat/completions", body);
    body["logprobs"] = true;
    auto whole = post(s, "/v1/chat/completions", body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const std::string text = whole.body["choices"][0]["message"]["content"];
    EXPECT_EQ(text::utf8_first_invalid(text), std::string::npos);
    // the tokens' bytes, made valid as a whole: what the text must be
    std::string raw;
    for (const json& e : whole.body["choices"][0]["logprobs"]["content"])
      for (const json& b : e["bytes"]) raw += static_cast<char>(b.get<int>());
    if (whole.body["choices"][0]["finish_reason"] == "length") {
      EXPECT_EQ(text, to_valid_utf8(raw)) << "seed " << seed;
    }
    EXPECT_EQ(st.text, text) << "seed " << seed;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      if (b >= 0xC2 && b < 0xF5 && text.compare(i, 3, "\xEF\xBF\xBD") != 0) ++non_ascii;  // a real character
    }
  }
  std::printf("valid multi-byte characters generated: %d\n", non_ascii);
  EXPECT_GT(non_ascii, 0) << "the test saw no multi-byte character; try more seeds";
}

// Many streams at once, chat and completions, each checked against the same request run alone
// afterwards: equal text means no token reached the wrong stream and a slot's result does not
// depend on its neighbours (nor on the prefix its slot had cached).
TEST(Serve, ConcurrentStreamsEqualAlone) {
  ServerOptions o;
  o.n_parallel = 4;
  o.queue_size = 64;
  TestServer s(o);
  constexpr int kClients = 64;
  const char* prompts[] = {"ROMEO:", "JULIET:", "KING HENRY:", "First Citizen:", "HAMLET:", "MACBETH:"};
  auto path = [](int i) { return i % 4 == 1 ? "/v1/chat/completions" : "/v1/completions"; };
  auto request = [&](int i) {
    json r = {{"max_tokens", 8 + i % 7}, {"temperature", i % 3 == 0 ? 0.0 : 0.9}, {"seed", 1000 + i}};
    const std::string text = std::string(prompts[i % 6]) + (i % 2 ? " Good" : "");
    if (i % 4 == 1)
      r["messages"] = {{{"role", "user"}, {"content", text}}};
    else
      r["prompt"] = text;
    return r;
  };
  std::vector<Streamed> got(kClients);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] { got[static_cast<size_t>(i)] = stream(s, path(i), request(i)); });
  for (auto& t : threads) t.join();
  const double concurrent_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < kClients; ++i) {
    const Streamed& g = got[static_cast<size_t>(i)];
    ASSERT_EQ(g.status, 200) << "client " << i << ": " << g.error;
    EXPECT_TRUE(g.done) << i;
    EXPECT_FALSE(g.finish_reason.empty()) << i;
  }
  const ServerStats st = s.server().stats();
  EXPECT_EQ(st.requests_finished, static_cast<uint64_t>(kClients));
  EXPECT_EQ(st.requests_cancelled, 0u);
  for (int i = 0; i < kClients; ++i) {
    auto alone = post(s, path(i), request(i));
    ASSERT_EQ(alone.status, 200);
    const json& c = alone.body["choices"][0];
    const std::string text =
        i % 4 == 1 ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    EXPECT_EQ(got[static_cast<size_t>(i)].text, text) << "client " << i;
    EXPECT_EQ(got[static_cast<size_t>(i)].finish_reason, c["finish_reason"]) << "client " << i;
  }
  std::printf("%d concurrent streams on 4 slots: %.2f s\n", kClients, concurrent_s);
}

// A chat's next turn finds the conversation so far in the cache (the first turn's cells, kept after
// it finished) and decodes only the rest: all but what the last partly filled block held.
TEST(Serve, ChatTurnReusesCache) {
  ServerOptions o;
  o.kv_block_size = 4;
  TestServer s(o);
  json messages = {{{"role", "user"}, {"content", "Who goes there?"}}};
  auto first =
      post(s, "/v1/chat/completions", json{{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}});
  ASSERT_EQ(first.status, 200);
  messages.push_back({{"role", "assistant"}, {"content", first.body["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "Speak again."}});
  const int first_prompt = first.body["usage"]["prompt_tokens"];
  auto second =
      post(s, "/v1/chat/completions", json{{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}});
  ASSERT_EQ(second.status, 200);
  const int cached = second.body["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, first_prompt / o.kv_block_size * o.kv_block_size);
  EXPECT_EQ(cached % o.kv_block_size, 0);
  EXPECT_EQ(s.server().stats().cached_sequences, 1);  // at most -np finished requests are kept
  // and the answer is the one a fresh server gives
  TestServer fresh;
  auto cold = post(fresh, "/v1/chat/completions",
                   json{{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}});
  EXPECT_EQ(cold.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(cold.body["choices"][0]["message"]["content"], second.body["choices"][0]["message"]["content"]);
}

// The value of a metric line ("name value") in /metrics' text; -1 when it is not there.
double metric_value(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
}

// Tokens are sampled in the forward pass's graph by default (the /metrics counters say where),
// with the text of a server sampling on the host (ServerOptions::device_sampling off, `loom serve
// --host-sampling`); a request asking for log-probabilities is sampled on the host, since they come
// from its logits, and gets the same tokens.
TEST(Serve, DeviceSamplingAndLogprobs) {
  const json sampled = {{"prompt", "JULIET:"}, {"max_tokens", 12}, {"temperature", 0.9}, {"seed", 5}};
  json with_logprobs = sampled;
  with_logprobs["logprobs"] = 3;
  std::string texts[2];
  for (bool device : {false, true}) {
    ServerOptions o;
    o.device_sampling = device;
    TestServer s(o);
    auto a = post(s, "/v1/completions", sampled);
    ASSERT_EQ(a.status, 200) << a.raw;
    std::string m = get(s, "/metrics").raw;
    const double on_device = metric_value(m, "loom_tokens_sampled_device_total");
    const double on_host = metric_value(m, "loom_tokens_sampled_host_total");
    EXPECT_GE(on_device + on_host, a.body["usage"]["completion_tokens"].get<double>()) << m;
    EXPECT_EQ(on_device > 0, device) << m;
    auto b = post(s, "/v1/completions", with_logprobs);
    ASSERT_EQ(b.status, 200) << b.raw;
    EXPECT_EQ(b.body["choices"][0]["text"], a.body["choices"][0]["text"]) << device;
    EXPECT_EQ(b.body["choices"][0]["logprobs"]["tokens"].size(),
              b.body["usage"]["completion_tokens"].get<size_t>());
    m = get(s, "/metrics").raw;
    EXPECT_EQ(metric_value(m, "loom_tokens_sampled_device_total"), on_device) << m;
    EXPECT_GT(metric_value(m, "loom_tokens_sampled_host_total"), on_host) << m;
    texts[device ? 1 : 0] = a.body["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(texts[1], texts[0]);
}

// Concurrent requests are decoded together: one forward pass per step advances all of them, which
// the histogram of sequences per step shows.
TEST(Serve, ConcurrentRequestsShareForwardPasses) {
  ServerOptions o;
  o.n_parallel = 4;
  TestServer s(o);
  const char* prompts[] = {"ROMEO:", "JULIET:", "HAMLET:", "MACBETH:"};
  std::vector<Streamed> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      got[static_cast<size_t>(i)] =
          stream(s, "/v1/completions", json{{"prompt", prompts[i]}, {"max_tokens", 48}, {"temperature", 0}});
    });
  for (auto& t : threads) t.join();
  for (const Streamed& g : got) ASSERT_EQ(g.status, 200) << g.error;
  const std::string m = get(s, "/metrics").raw;
  const double steps = metric_value(m, "loom_batch_sequences_count");
  const double alone = metric_value(m, "loom_batch_sequences_bucket{le=\"1\"}");
  ASSERT_GT(steps, 0) << m;
  EXPECT_LT(alone, steps) << "no step decoded two requests together\n" << m;
  EXPECT_GT(metric_value(m, "loom_batch_sequences_bucket{le=\"4\"}") -
                metric_value(m, "loom_batch_sequences_bucket{le=\"2\"}"),
            0)
      << "no step decoded all four requests\n"
      << m;
  // alone, each of the 4 x 47 tokens after the first would take a pass of its own
  EXPECT_LT(steps, static_cast<double>(s.server().stats().generated_tokens) / 2);
}

// A prompt that arrives while another request decodes is computed in that request's forward
// passes (mixed steps, --prefill-chunk tokens each): no step takes a second pass; with mixed steps
// off each of its chunks is a pass of its own. The texts are the same either way.
TEST(Serve, PromptChunksRideInTheDecodePass) {
  std::string texts[2];
  for (const bool mixed : {true, false}) {
    SCOPED_TRACE(mixed ? "mixed" : "chunk passes");
    ServerOptions o;
    o.n_parallel = 2;
    o.prefill_chunk = 8;
    if (!mixed) o.mixed_steps = false;  // mixed: the default on the CPU (unset: the backend's choice)
    TestServer s(o, /*n_ctx=*/512);
    Streamed first;
    std::thread runner([&] {
      first =
          stream(s, "/v1/completions",
                 json{{"prompt", "ROMEO:"}, {"max_tokens", 120}, {"temperature", 0}, {"ignore_eos", true}});
    });
    while (s.server().stats().active_slots == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<int> prompt;  // 60 token ids: 8 chunks of at most 8 while ROMEO decodes
    for (int i = 0; i < 60; ++i) prompt.push_back(10 + i % 50);
    auto second = post(s, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}});
    runner.join();
    ASSERT_EQ(second.status, 200) << second.body.dump();
    ASSERT_EQ(first.status, 200) << first.error;
    texts[mixed ? 0 : 1] = second.body["choices"][0]["text"];
    const std::string m = get(s, "/metrics").raw;
    const double steps = metric_value(m, "loom_steps_total"),
                 passes = metric_value(m, "loom_forward_passes_total");
    const double chunks = metric_value(m, "loom_prompt_chunk_steps_total");
    const double mixed_steps = metric_value(m, "loom_mixed_steps_total");
    ASSERT_GT(steps, 0) << m;
    // ROMEO's prompt (a step with nothing decoding: one pass, the prompt's), then the 60 tokens in
    // 8 chunks of at most 8 while ROMEO decodes
    EXPECT_EQ(chunks, 9) << m;
    // every step's wall time in one of the two histograms, by whether it computed a prompt chunk
    EXPECT_EQ(metric_value(m, "loom_prompt_step_seconds_count"), chunks) << m;
    EXPECT_EQ(metric_value(m, "loom_decode_step_seconds_count"), steps - chunks) << m;
    EXPECT_GT(metric_value(m, "loom_prompt_step_seconds_sum"), 0.0) << m;
    // passes of new shapes built their graphs: ROMEO's prompt at least
    EXPECT_GE(metric_value(m, "loom_graph_builds_total"), 1) << m;
    if (mixed) {
      EXPECT_EQ(mixed_steps, 8) << m;
      EXPECT_EQ(passes, steps) << m;
    } else {
      EXPECT_EQ(mixed_steps, 0) << m;
      EXPECT_EQ(passes, steps + 8) << m;
    }
  }
  EXPECT_EQ(texts[0], texts[1]);
}

// A cancelled request's sequence leaves the cache at once: its blocks are free again (a finished
// request's are kept for reuse; a cancelled one's are not).
TEST(Serve, CancelFreesCacheBlocks) {
  ServerOptions o;
  o.n_parallel = 2;
  TestServer s(o, /*n_ctx=*/1024);
  int chunks = 0;
  int64_t used_while_running = 0;
  auto req = stream_request("ROMEO:", 900, [&](const char*, size_t, uint64_t, uint64_t) {
    if (++chunks == 3) used_while_running = s.server().stats().kv_cells_used;
    return chunks < 3;
  });
  s.client()->send(req);
  EXPECT_GE(chunks, 3);
  EXPECT_GT(used_while_running, 0);
  const auto t0 = std::chrono::steady_clock::now();
  while ((s.server().stats().requests_cancelled == 0 || s.server().stats().kv_cells_used != 0) &&
         std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(10ms);
  const ServerStats st = s.server().stats();
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_EQ(st.kv_cells_used, 0);
  EXPECT_EQ(st.cached_sequences, 0);
  EXPECT_EQ(metric_value(get(s, "/metrics").raw, "loom_kv_cache_used_cells"), 0.0);
  // a request that ends normally keeps its cells for reuse
  auto done = post(s, "/v1/completions", json{{"prompt", "JULIET:"}, {"max_tokens", 4}});
  EXPECT_EQ(done.status, 200);
  EXPECT_EQ(s.server().stats().cached_sequences, 1);
  EXPECT_GT(s.server().stats().kv_cells_used, 0);
}

// A request that runs past --timeout ends there: with what it has (finish_reason "length").
TEST(Serve, Timeout) {
  ServerOptions o;
  o.timeout = std::chrono::seconds(1);
  TestServer s(o, /*n_ctx=*/2048);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = post(s, "/v1/completions", json{{"prompt", "ROMEO:"}, {"max_tokens", 2000}});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_LT(r.body["usage"]["completion_tokens"].get<int>(), 2000);
  EXPECT_LT(took, 5.0);
}

// A client that closes the connection mid-stream frees its slot at once: a second request on the
// single slot starts right away instead of after the first one's 900 tokens.
TEST(Serve, DisconnectFreesSlot) {
  ServerOptions o;
  o.n_parallel = 1;
  TestServer s(o, /*n_ctx=*/1024);
  int chunks = 0;
  auto req =
      stream_request("ROMEO:", 900, [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; });
  auto c = s.client();
  auto res = c->send(req);
  EXPECT_GE(chunks, 3);
  const auto t0 = std::chrono::steady_clock::now();
  while (s.server().stats().requests_cancelled == 0 && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(10ms);
  const ServerStats st = s.server().stats();
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_EQ(st.active_slots, 0);
  EXPECT_LT(st.generated_tokens, 300u);
  auto next = post(s, "/v1/completions", json{{"prompt", "JULIET:"}, {"max_tokens", 4}});
  EXPECT_EQ(next.status, 200);
}

// A client that goes away while its request waits for a slot: the request leaves the queue
// (noticed at the next keep-alive comment) and never runs.
TEST(Serve, DisconnectWhileQueued) {
  ServerOptions o;
  o.n_parallel = 1;
  TestServer s(o, /*n_ctx=*/2048);
  std::atomic<bool> release_first{false};
  std::atomic<int> first_chunks{0};
  auto long_stream = [&] {
    auto req = stream_request("ROMEO:", 2000, [&](const char*, size_t, uint64_t, uint64_t) {
      ++first_chunks;
      return !release_first.load();
    });
    s.client()->send(req);
  };
  std::thread first(long_stream);
  const auto t0 = std::chrono::steady_clock::now();
  while (first_chunks.load() == 0 && std::chrono::steady_clock::now() - t0 < 30s)
    std::this_thread::sleep_for(5ms);
  std::atomic<bool> got_comment{false};
  std::thread queued([&] {
    auto req = stream_request("JULIET:", 4, [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (std::string(data, n).rfind(": waiting", 0) == 0) got_comment = true;
      return false;  // hang up at the first byte
    });
    s.client()->send(req);
  });
  queued.join();
  EXPECT_TRUE(got_comment.load());
  const auto t1 = std::chrono::steady_clock::now();
  while (s.server().stats().requests_cancelled == 0 && std::chrono::steady_clock::now() - t1 < 10s)
    std::this_thread::sleep_for(10ms);
  const ServerStats st = s.server().stats();
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_EQ(st.queue_depth, 0);
  EXPECT_EQ(st.active_slots, 1);  // the first still runs
  release_first = true;
  first.join();
}

// Stopping the server ends a running stream with an error event and returns promptly.
TEST(Serve, StopEndsStreams) {
  ServerOptions o;
  o.n_parallel = 1;
  TestServer s(o, /*n_ctx=*/2048);
  std::atomic<int> chunks{0};
  std::string body;
  std::mutex mu;
  std::thread client([&] {
    auto req = stream_request("ROMEO:", 2000, [&](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard lock(mu);
      body.append(data, n);
      ++chunks;
      return true;
    });
    s.client()->send(req);
  });
  const auto t0 = std::chrono::steady_clock::now();
  while (chunks.load() < 2 && std::chrono::steady_clock::now() - t0 < 30s) std::this_thread::sleep_for(5ms);
  const auto t1 = std::chrono::steady_clock::now();
  s.server().stop();
  client.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 10.0);
  std::lock_guard lock(mu);
  EXPECT_NE(body.find("the server is stopping"), std::string::npos)
      << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
}

// One slot, a queue of one: a third request is answered 429 while the first generates and the
// second waits; the waiting one is served once the first goes away.
TEST(Serve, QueueFull) {
  ServerOptions o;
  o.n_parallel = 1;
  o.queue_size = 1;
  TestServer s(o, /*n_ctx=*/1024);
  std::mutex mu;
  std::condition_variable cv;
  bool first_started = false;
  std::atomic<bool> release_first{false};
  std::thread first([&] {
    auto req = stream_request("ROMEO:", 900, [&](const char*, size_t, uint64_t, uint64_t) {
      {
        std::lock_guard lock(mu);
        first_started = true;
      }
      cv.notify_all();
      return !release_first.load();
    });
    s.client()->send(req);
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return first_started; }));
  }
  Streamed second;
  std::thread waiting([&] {
    second = stream(s, "/v1/completions", json{{"prompt", "JULIET:"}, {"max_tokens", 4}});
  });
  const auto t0 = std::chrono::steady_clock::now();
  while (s.server().stats().queue_depth < 1 && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(s.server().stats().queue_depth, 1);
  auto third = s.client()->Post("/v1/completions", json{{"prompt", "HAMLET:"}, {"max_tokens", 4}}.dump(),
                                "application/json");
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 429);
  EXPECT_EQ(third->get_header_value("Retry-After"), "1");
  expect_error(Reply{third->status, json::parse(third->body), third->body}, 429);
  release_first = true;
  first.join();
  waiting.join();
  EXPECT_EQ(second.status, 200);
  EXPECT_TRUE(second.done);
  EXPECT_EQ(s.server().stats().requests_cancelled, 1u);
  auto metrics = get(s, "/metrics");
  EXPECT_NE(metrics.raw.find("loom_requests_rejected_total 1"), std::string::npos);
}

}  // namespace
}  // namespace loom::serve
