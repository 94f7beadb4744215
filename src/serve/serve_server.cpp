// The HTTP side of `loom serve` (loom/serve.h): routes, authentication, the generation endpoints
// (streaming and not), tokenizer and template endpoints, metrics, and errors at every handler's
// boundary.
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>

#include <fmt/format.h>

#include "loom/serve.h"
#include "loom/text_stream.h"
#include "serve_api.h"
#include "serve_engine.h"
#include "serve_metrics.h"

namespace loom::serve {

const char* chat_page_html();

namespace detail {

struct ServerImpl {
  ServerOptions options;
  httplib::Server http;
  int port = 0;
  std::thread http_thread;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;  // stop() began (it runs once)
  bool stopped = false;   // stop() finished: wait() returns

  Metrics metrics;
  // Set once by attach(); read by handlers after `ready`.
  std::atomic<bool> ready{false};
  std::optional<Tokenizer> tok;
  ChatFormat format;
  std::unique_ptr<Engine> engine;
  std::string model_name;
  int64_t created = 0;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> open_streams{0};  ///< streaming responses not yet released
  std::atomic<bool> listen_returned{false};

  void routes();
  void handle_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  std::vector<int32_t> prompt_tokens(const GenerationParams& p) const;
  Engine& ready_engine() const;
  std::string new_id(const char* prefix);
  std::string metrics_text() const;
};

}  // namespace detail

namespace {

using detail::ServerImpl;

void send_json(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.body(), e.status);
}

json parse_body(const httplib::Request& req) {
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");
  return body;
}

// Runs a handler with every exception turned into an error response: a request never brings the
// server down.
template <typename F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, fmt::format("internal error: {}", e.what())));
    } catch (...) {
      send_error(res, ApiError(500, "internal error"));
    }
  };
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

// cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian compiled
// the library), so a burst of clients (64 connecting at once) overflows the accept queue and some
// connections are dropped. listen() again on the bound socket raises the backlog; the socket is
// found among the process's descriptors by being the listening one on our port.
void raise_listen_backlog(int port) {
  for (int fd = 0; fd < 65536; ++fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) {
      if (errno == EBADF && fd > 1024) break;  // past the descriptors in use
      continue;
    }
    if (!listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
    if (p == port) ::listen(fd, SOMAXCONN);
  }
}

}  // namespace

namespace detail {

Engine& ServerImpl::ready_engine() const {
  if (!ready.load()) throw ApiError(503, "the model is loading", "", "model_loading");
  return *engine;
}

std::string ServerImpl::new_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:x}{:012x}", prefix, next_id.fetch_add(1), rng() & 0xFFFFFFFFFFFFull);
}

// The prompt's token ids: the rendered conversation or the completion prompt, with the model's BOS
// in front when its tokenizer adds one (the rendered text carries none, see loom/chat.h).
std::vector<int32_t> ServerImpl::prompt_tokens(const GenerationParams& p) const {
  std::vector<int32_t> out;
  const SpecialTokens& sp = tok->special();
  if (p.prompt_is_tokens) {
    for (int32_t id : p.prompt_tokens)
      if (id < 0 || id >= tok->n_tokens())
        throw ApiError(
            400, fmt::format("'prompt': token id {} is outside the vocabulary [0, {})", id, tok->n_tokens()),
            "prompt");
    return p.prompt_tokens;
  }
  std::string text = p.prompt_text;
  if (p.endpoint == Endpoint::chat) {
    auto rendered = format.render(p.messages, /*add_generation_prompt=*/true);
    if (!rendered) throw ApiError(400, rendered.status().message(), "messages");
    text = std::move(*rendered);
  }
  auto ids = tok->encode(text, /*add_special=*/false, /*parse_special=*/true);
  if (!ids) throw ApiError(400, ids.status().message(), p.endpoint == Endpoint::chat ? "messages" : "prompt");
  if (sp.add_bos && sp.bos != kNoToken) out.push_back(sp.bos);
  out.insert(out.end(), ids->begin(), ids->end());
  return out;
}

void ServerImpl::handle_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  const json body = parse_body(req);
  Engine& eng = ready_engine();
  GenerationParams p = parse_generation(body, endpoint, options.sampling);
  if (auto s = Sampler::create(p.sampling); !s) throw ApiError(400, s.status().message());
  GenRequest gen;
  gen.prompt = prompt_tokens(p);
  if (gen.prompt.empty()) throw ApiError(400, "the prompt has no tokens", "prompt");
  if (static_cast<int>(gen.prompt.size()) >= eng.n_ctx())
    throw ApiError(
        400,
        fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens, which "
                    "leaves no room to generate",
                    eng.n_ctx(), gen.prompt.size()),
        endpoint == Endpoint::chat ? "messages" : "prompt", "context_length_exceeded");
  gen.sampling = p.sampling;
  gen.max_tokens = p.max_tokens;
  gen.stop = p.stop;
  if (endpoint == Endpoint::chat) gen.stop.insert(gen.stop.end(), format.stop.begin(), format.stop.end());
  gen.top_logprobs = p.top_logprobs;
  gen.ignore_eos = p.ignore_eos;
  gen.deadline = Clock::now() + options.timeout;
  auto task = eng.submit(std::move(gen));
  if (!task) {
    metrics.requests_rejected.fetch_add(1);
    throw ApiError(429, "the server is busy: every slot is generating and the queue is full; retry later", "",
                   "queue_full");
  }

  const bool chat = endpoint == Endpoint::chat;
  ResponseMeta meta{new_id(chat ? "chatcmpl-" : "cmpl-"), unix_now(), model_name};
  const char* object = chat ? "chat.completion" : "text_completion";
  const char* chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  const Tokenizer& tk = *tok;

  if (!p.stream) {
    std::string text;
    json logprobs = nullptr;
    if (chat && p.top_logprobs >= 0) logprobs = {{"content", json::array()}};
    StreamEvent done;
    bool finished = false;
    std::vector<StreamEvent> events;
    while (!finished) {
      events.clear();
      task->pop(events, std::chrono::milliseconds(500));
      for (auto& e : events) {
        if (e.logprob) {
          if (chat)
            logprobs["content"].push_back(chat_logprob(tk, *e.logprob));
          else
            add_completion_logprob(logprobs, tk, *e.logprob, text.size());
        }
        text += e.text;
        if (e.kind == StreamEvent::Kind::done) {
          done = std::move(e);
          finished = true;
        }
      }
    }
    if (done.finish == FinishReason::error) throw ApiError(500, done.error);
    // Only the server itself cancels a request whose client is still there: it is stopping.
    if (done.finish == FinishReason::cancelled) throw ApiError(503, done.error, "", "server_stopping");
    if (done.finish == FinishReason::timeout && done.n_generated == 0)
      throw ApiError(503, done.error, "", "timeout");
    const char* reason = done.finish == FinishReason::stop ? "stop" : "length";
    json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", reason}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
      choice["text"] = text;
    send_json(res, {{"id", meta.id},
                    {"object", object},
                    {"created", meta.created},
                    {"model", meta.model},
                    {"system_fingerprint", "loom"},
                    {"choices", json::array({choice})},
                    {"usage", usage_json(done.n_prompt, done.n_generated, done.n_cached)}});
    return;
  }

  // Streaming: one SSE chunk per token (or per complete UTF-8 character), then the finish reason,
  // the usage when asked for, and [DONE]. A write that fails (the client went away) cancels the
  // request, which frees its place and cache blocks at the worker's next turn.
  struct StreamState {
    bool sent_role = false;
    size_t text_offset = 0;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto state = std::make_shared<StreamState>();
  const bool include_usage = p.include_usage;
  const bool want_logprobs = p.top_logprobs >= 0;
  open_streams.fetch_add(1);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [task, state, meta, chat, chunk_object, include_usage, want_logprobs, &tk](
          size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) {
          state->last_write = std::chrono::steady_clock::now();
          if (!sink.write(s.data(), s.size())) {
            task->cancel();
            return false;
          }
          return true;
        };
        auto chunk = [&](json choice) {
          return json{{"id", meta.id},
                      {"object", chunk_object},
                      {"created", meta.created},
                      {"model", meta.model},
                      {"system_fingerprint", "loom"},
                      {"choices", json::array({std::move(choice)})}};
        };
        if (chat && !state->sent_role) {
          state->sent_role = true;
          json choice = {{"index", 0},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}};
          if (!write(sse(chunk(choice)))) return false;
        }
        std::vector<StreamEvent> events;
        if (!task->pop(events, std::chrono::milliseconds(250))) {
          // Nothing yet (waiting for a slot, a long prompt): a comment line now and then, which
          // SSE clients ignore, shows whether the client is still there.
          if (std::chrono::steady_clock::now() - state->last_write > std::chrono::seconds(1))
            return write(": waiting\n\n");
          return true;
        }
        for (auto& e : events) {
          // One chunk per generated token, its text possibly empty (held back as part of a UTF-8
          // character or a possible stop string), so that clients see progress token by token.
          if (e.kind != StreamEvent::Kind::done || !e.text.empty() || e.logprob) {
            json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
            if (chat) {
              choice["delta"] = {{"content", e.text}};
              if (want_logprobs && e.logprob)
                choice["logprobs"] = {{"content", json::array({chat_logprob(tk, *e.logprob)})}};
            } else {
              choice["text"] = e.text;
              if (want_logprobs && e.logprob) {
                json lp = nullptr;
                add_completion_logprob(lp, tk, *e.logprob, state->text_offset);
                choice["logprobs"] = lp;
              }
            }
            state->text_offset += e.text.size();
            if (!write(sse(chunk(choice)))) return false;
          }
          if (e.kind != StreamEvent::Kind::done) continue;
          if (e.finish == FinishReason::error || e.finish == FinishReason::cancelled ||
              (e.finish == FinishReason::timeout && e.n_generated == 0)) {
            ApiError err(e.finish == FinishReason::error ? 500 : 503, e.error);
            write(sse(err.body()));
          } else {
            const char* reason = e.finish == FinishReason::stop ? "stop" : "length";
            json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}};
            if (chat)
              choice["delta"] = json::object();
            else
              choice["text"] = "";
            if (!write(sse(chunk(choice)))) return false;
            if (include_usage) {
              json u = chunk(nullptr);
              u["choices"] = json::array();
              u["usage"] = usage_json(e.n_prompt, e.n_generated, e.n_cached);
              if (!write(sse(u))) return false;
            }
          }
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        }
        return true;
      },
      // The response ended, completely or not: nothing more to generate.
      [task, this](bool) {
        task->cancel();
        open_streams.fetch_sub(1);
      });
}

std::string ServerImpl::metrics_text() const {
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  auto seconds = [&](const char* name, const char* help, uint64_t ns) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, static_cast<double>(ns) * 1e-9);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  out +=
      "# HELP loom_http_responses_total HTTP responses by status class.\n# TYPE loom_http_responses_total "
      "counter\n";
  for (int c = 1; c <= 5; ++c)
    out += fmt::format("loom_http_responses_total{{code=\"{}xx\"}} {}\n", c,
                       metrics.responses[static_cast<size_t>(c)].load());
  counter("loom_requests_total", "Generation requests finished (any reason).",
          metrics.requests_finished.load());
  counter("loom_requests_cancelled_total", "Generation requests stopped because the client went away.",
          metrics.requests_cancelled.load());
  counter("loom_requests_timed_out_total", "Generation requests that ran out of time.",
          metrics.requests_timed_out.load());
  counter("loom_requests_rejected_total", "Generation requests answered 429 (queue full).",
          metrics.requests_rejected.load());
  counter("loom_prompt_tokens_total", "Prompt tokens of finished requests.", metrics.prompt_tokens.load());
  counter("loom_prompt_tokens_cached_total", "Prompt tokens shared from the KV cache (not decoded again).",
          metrics.prompt_tokens_cached.load());
  counter("loom_generated_tokens_total", "Generated tokens.", metrics.generated_tokens.load());
  counter("loom_steps_total", "Steps of the batch: each advances every running request by a token.",
          metrics.steps.load());
  counter("loom_forward_passes_total", "Forward passes of those steps (a prompt chunk run alone adds one).",
          metrics.forward_passes.load());
  counter("loom_prompt_chunk_steps_total", "Steps that computed a chunk of a prompt.",
          metrics.prompt_chunk_steps.load());
  counter("loom_mixed_steps_total",
          "Steps whose prompt chunk rode in the running requests' forward pass (a mixed pass).",
          metrics.mixed_steps.load());
  counter("loom_graph_builds_total", "Forward passes that built their graph (a shape not seen the step before).",
          metrics.graph_builds.load());
  seconds("loom_decode_step_host_seconds_total", "Host time building and feeding the graphs of steps without a prompt chunk.",
          metrics.decode_host_ns.load());
  seconds("loom_prompt_step_host_seconds_total", "Host time building and feeding the graphs of steps with a prompt chunk.",
          metrics.prompt_host_ns.load());
  const ExecCounters ec = metrics.exec();
  seconds("loom_exec_host_seconds_total", "The executor's host time inside its computes (recording and launching).",
          ec.host_ns);
  seconds("loom_exec_plan_seconds_total", "Of the executor's host time: planning passes of new structures.",
          ec.host_plan_ns);
  seconds("loom_exec_record_seconds_total", "Of the executor's host time: recording passes (stream capture).",
          ec.host_record_ns);
  seconds("loom_exec_instantiate_seconds_total", "Of the executor's host time: instantiating executable graphs.",
          ec.host_instantiate_ns);
  counter("loom_exec_chunk_graphs_total", "Chunk graphs of passes of a new structure, launched as recorded.",
          ec.chunk_graphs);
  counter("loom_exec_graphs_instantiated_total", "Whole-pass executable graphs instantiated for replay.",
          ec.graph_builds);
  counter("loom_exec_graph_replays_total", "Replays of instantiated whole-pass graphs.", ec.graph_replays);
  counter("loom_tokens_sampled_device_total",
          "Tokens sampled in the forward pass's graph (only their ids read back).",
          metrics.device_sampled.load());
  counter("loom_tokens_sampled_host_total",
          "Tokens sampled on the host from logits read back (log-probabilities, penalties, --host-sampling).",
          metrics.host_sampled.load());
  if (ready.load()) {
    const ServerStats s = engine->stats();
    const auto [used, total] = engine->kv_cells();
    gauge("loom_queue_depth", "Requests waiting for a slot.", s.queue_depth);
    gauge("loom_slots_active", "Requests generating (sequences of the batch).", s.active_slots);
    gauge("loom_slots_total", "Requests that may generate at once (--parallel).", s.n_slots);
    gauge("loom_kv_cache_used_cells",
          "KV cache cells in use: running requests and finished ones kept for reuse.",
          static_cast<double>(used));
    gauge("loom_kv_cache_total_cells", "KV cache cells (the paged pool).", static_cast<double>(total));
    gauge("loom_kv_cache_kept_sequences", "Finished requests whose cells are kept for prefix reuse.",
          s.cached_sequences);
    gauge("loom_kv_cache_usage_ratio", "KV cache cells in use over all cells.",
          total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0);
  }
  gauge("loom_model_loaded", "1 once the model is loaded.", ready.load() ? 1 : 0);
  out += metrics.time_to_first_token.format("loom_time_to_first_token_seconds",
                                            "From a request's arrival to its first generated token.");
  out += metrics.inter_token.format("loom_inter_token_seconds", "Between consecutive tokens of one request.");
  out += metrics.request_duration.format("loom_request_duration_seconds",
                                         "From a request's arrival to its end.");
  out += metrics.batch_sequences.format("loom_batch_sequences",
                                        "Running requests decoded together per step (one forward pass).");
  out += metrics.decode_step.format("loom_decode_step_seconds", "Steps that computed no prompt chunk, wall time.");
  out += metrics.prompt_step.format("loom_prompt_step_seconds", "Steps that computed a prompt chunk, wall time.");
  return out;
}

void ServerImpl::routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics.http_requests.fetch_add(1);
    res.set_header("Access-Control-Allow-Origin", "*");
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Content-Type, Authorization");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool open_path = req.path == "/" || req.path == "/health" || req.path == "/index.html";
    if (!options.api_key.empty() && !open_path &&
        req.get_header_value("Authorization") != "Bearer " + options.api_key) {
      send_error(res, ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", "",
                               "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    metrics.responses[static_cast<size_t>(std::clamp(res.status / 100, 1, 5))].fetch_add(1);
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res,
                 ApiError(404, fmt::format("no route for {} {}", req.method, req.path), "", "not_found"));
    else if (res.status == 413)
      send_error(res, ApiError(413, "the request body is too large", "", "payload_too_large"));
    else
      send_error(res, ApiError(res.status, fmt::format("HTTP {}", res.status)));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, ApiError(500, "internal error"));
  });

  http.Get("/", guarded([](const httplib::Request&, httplib::Response& res) {
             res.set_content(chat_page_html(), "text/html; charset=utf-8");
           }));
  http.Get("/health", guarded([this](const httplib::Request&, httplib::Response& res) {
             if (!ready.load()) throw ApiError(503, "the model is loading", "", "model_loading");
             send_json(res, {{"status", "ok"}});
           }));
  auto models = guarded([this](const httplib::Request&, httplib::Response& res) {
    Engine& eng = ready_engine();
    const llm::HParams& hp = eng.model().hparams();
    send_json(res, {{"object", "list"},
                    {"data", json::array({{{"id", model_name},
                                           {"object", "model"},
                                           {"created", created},
                                           {"owned_by", "loom"},
                                           {"meta",
                                            {{"n_ctx", eng.n_ctx()},
                                             {"n_ctx_train", hp.n_ctx_train},
                                             {"n_vocab", hp.n_vocab},
                                             {"n_params", eng.model().n_params()},
                                             {"chat_format", format.name}}}}})}});
  });
  http.Get("/v1/models", models);
  http.Get("/models", models);
  auto chat = guarded([this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Endpoint::chat);
  });
  auto completions = guarded([this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Endpoint::completion);
  });
  http.Post("/v1/chat/completions", chat);
  http.Post("/chat/completions", chat);
  http.Post("/v1/completions", completions);
  http.Post("/completions", completions);
  http.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              ready_engine();
              auto it = body.find("content");
              if (it == body.end() || !it->is_string())
                throw ApiError(400, "'content' must be a string", "content",
                               it == body.end() ? "missing" : "invalid_type");
              bool add_special = false, with_pieces = false;
              if (auto a = body.find("add_special"); a != body.end() && !a->is_null()) {
                if (!a->is_boolean())
                  throw ApiError(400, "'add_special' must be a boolean", "add_special", "invalid_type");
                add_special = a->get<bool>();
              }
              if (auto w = body.find("with_pieces"); w != body.end() && !w->is_null()) {
                if (!w->is_boolean())
                  throw ApiError(400, "'with_pieces' must be a boolean", "with_pieces", "invalid_type");
                with_pieces = w->get<bool>();
              }
              const std::string content = it->get<std::string>();
              auto ids = tok->encode(content, false, /*parse_special=*/true);
              if (!ids) throw ApiError(400, ids.status().message(), "content");
              std::vector<int32_t> out;
              const SpecialTokens& sp = tok->special();
              if (add_special && sp.add_bos && sp.bos != kNoToken) out.push_back(sp.bos);
              out.insert(out.end(), ids->begin(), ids->end());
              json tokens = json::array();
              for (int32_t id : out) {
                if (with_pieces)
                  tokens.push_back({{"id", id}, {"piece", token_text(*tok, id)}});
                else
                  tokens.push_back(id);
              }
              send_json(res, {{"tokens", tokens}});
            }));
  http.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              ready_engine();
              auto it = body.find("tokens");
              if (it == body.end() || !it->is_array())
                throw ApiError(400, "'tokens' must be an array of token ids", "tokens",
                               it == body.end() ? "missing" : "invalid_type");
              std::vector<int32_t> ids;
              for (const json& t : *it) {
                if (!t.is_number_integer())
                  throw ApiError(400, "'tokens' must be an array of token ids", "tokens", "invalid_type");
                const int64_t id = t.get<int64_t>();
                if (id < 0 || id >= tok->n_tokens())
                  throw ApiError(
                      400,
                      fmt::format("'tokens': id {} is outside the vocabulary [0, {})", id, tok->n_tokens()),
                      "tokens");
                ids.push_back(static_cast<int32_t>(id));
              }
              auto text = tok->decode(ids);
              if (!text) throw ApiError(400, text.status().message(), "tokens");
              send_json(res, {{"content", to_valid_utf8(*text)}});
            }));
  http.Post("/apply-template", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              ready_engine();
              auto it = body.find("messages");
              if (it == body.end()) throw ApiError(400, "'messages' is missing", "messages", "missing");
              const auto messages = parse_messages(*it);
              bool add_generation_prompt = true;
              if (auto a = body.find("add_generation_prompt"); a != body.end() && !a->is_null()) {
                if (!a->is_boolean())
                  throw ApiError(400, "'add_generation_prompt' must be a boolean", "add_generation_prompt");
                add_generation_prompt = a->get<bool>();
              }
              auto text = format.render(messages, add_generation_prompt);
              if (!text) throw ApiError(400, text.status().message(), "messages");
              send_json(res, {{"prompt", *text}});
            }));
  http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
             res.set_content(metrics_text(), "text/plain; version=0.0.4");
           }));
}

}  // namespace detail

Server::Server(std::unique_ptr<detail::ServerImpl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options) {
  if (options.n_parallel < 1 || options.n_parallel > 1024)
    return make_error(StatusCode::invalid_argument, "--parallel {}: 1 to 1024 slots", options.n_parallel);
  if (options.queue_size < 0)
    return make_error(StatusCode::invalid_argument, "--queue {}: at least 0", options.queue_size);
  if (options.kv_block_size < 1 || options.kv_block_size > 4096)
    return make_error(StatusCode::invalid_argument, "--kv-block-size {}: 1 to 4096", options.kv_block_size);
  if (options.prefill_chunk < 0)
    return make_error(StatusCode::invalid_argument, "--prefill-chunk {}: at least 0", options.prefill_chunk);
  if (options.port < 0 || options.port > 65535)
    return make_error(StatusCode::invalid_argument, "--port {}: 0 to 65535", options.port);
  auto impl = std::make_unique<detail::ServerImpl>();
  impl->options = options;
  const size_t n_threads = options.n_http_threads > 0
                               ? static_cast<size_t>(options.n_http_threads)
                               : static_cast<size_t>(options.n_parallel + options.queue_size + 8);
  impl->http.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
  impl->http.set_payload_max_length(options.max_body_bytes);
  impl->http.set_read_timeout(std::chrono::seconds(30));
  impl->http.set_write_timeout(std::chrono::seconds(30));
  impl->http.set_keep_alive_max_count(1000);
  if (options.log_requests)
    impl->http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      fmt::print(stderr, "loom: {} {} -> {}\n", req.method, req.path, res.status);
    });
  impl->routes();
  if (options.port == 0) {
    impl->port = impl->http.bind_to_any_port(options.host);
  } else {
    impl->port = impl->http.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (impl->port <= 0)
    return make_error(StatusCode::io_error,
                      "cannot listen on {}:{} (address in use, or not a local address?)", options.host,
                      options.port);
  raise_listen_backlog(impl->port);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }

void Server::start() {
  if (impl_->http_thread.joinable()) return;
  impl_->http_thread = std::thread([this] {
    impl_->http.listen_after_bind();
    impl_->listen_returned.store(true);
  });
  // httplib's stop() does nothing before its listen loop runs: wait for it, so that a stop() right
  // after start() (a model that fails to load) does not leave the loop running forever.
  while (!impl_->http.is_running() && !impl_->listen_returned.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

Status Server::attach(llm::Session session, ChatFormat format) {
  if (impl_->ready.load())
    return make_error(StatusCode::invalid_argument, "serve: a model is already attached");
  if (!session.model) return make_error(StatusCode::invalid_argument, "serve: the session has no model");
  auto tok = Tokenizer::from_gguf(session.model->gguf());
  if (!tok) return tok.status();
  std::set<int32_t> stop_ids;
  const SpecialTokens& sp = tok->special();
  for (TokenId id : {sp.eos, sp.eot})
    if (id != kNoToken) stop_ids.insert(id);
  // An end-of-turn text that is one token in the vocabulary ("<|im_end|>") stops as that token.
  for (const std::string& s : format.stop)
    if (TokenId id = tok->find_token(s); id != kNoToken && tok->is_special(id)) stop_ids.insert(id);
  if (impl_->options.model_name.empty())
    impl_->model_name = std::filesystem::path(session.model->gguf().name()).filename().string();
  else
    impl_->model_name = impl_->options.model_name;
  auto engine = Engine::create(std::move(session), *tok, std::move(stop_ids), impl_->options, impl_->metrics);
  if (!engine) return engine.status();
  impl_->tok.emplace(std::move(*tok));
  impl_->format = std::move(format);
  impl_->engine = std::move(*engine);
  impl_->created = unix_now();
  impl_->ready.store(true);
  return {};
}

void Server::stop() {
  {
    std::lock_guard lock(impl_->stop_mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  if (impl_->engine) impl_->engine->stop();  // running streams end, so their handlers return
  // Give the streams a moment to send their last event before the sockets close.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (impl_->open_streams.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->http.stop();
  if (impl_->http_thread.joinable()) impl_->http_thread.join();
  {
    std::lock_guard lock(impl_->stop_mu);
    impl_->stopped = true;
  }
  impl_->stop_cv.notify_all();
}

void Server::wait() {
  std::unique_lock lock(impl_->stop_mu);
  impl_->stop_cv.wait(lock, [&] { return impl_->stopped; });
}

ServerStats Server::stats() const {
  if (!impl_->ready.load()) return {};
  return impl_->engine->stats();
}

}  // namespace loom::serve
