// `loom serve`: the OpenAI-compatible HTTP server (loom/serve.h) over one model; without -m, the
// built-in Shakespeare model. It listens first (GET /health says 503 while the model loads), prints
// the address, loads, then serves until SIGINT or SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "generate.h"
#include "loom/chat.h"
#include "loom/serve.h"
#include "loom/text.h"

namespace loom::app {

namespace {

struct ServeOptions {
  GenerateOptions gen;
  serve::ServerOptions server;
  std::string template_name;  ///< --chat-template
  std::string template_file;  ///< --chat-template-file
  int timeout_s = 600;
  std::optional<bool> mixed_steps;  ///< --mixed-steps[=B] / --no-mixed-steps[=B] (neither: the backend's default)
};

int fail(const Status& s) {
  std::fprintf(stderr, "loom: %s\n", s.to_string().c_str());
  return 1;
}

int run_serve(ServeOptions o) {
  // A misspelled --chat-template fails before anything loads.
  if (!o.template_name.empty() && o.template_name != "plain")
    if (auto t = chat_template_from_name(o.template_name); !t) return fail(t.status());
  if (!o.template_name.empty() && !o.template_file.empty())
    return fail(make_error(StatusCode::invalid_argument,
                           "--chat-template and --chat-template-file exclude each other"));
  o.server.timeout = std::chrono::seconds(o.timeout_s);
  // Batch-invariant decoding (--deterministic): a running request's token is computed in a pass of
  // decode tokens only, never beside another request's prompt chunk.
  if (o.mixed_steps) o.server.mixed_steps = o.mixed_steps;
  if (deterministic_from_env()) o.server.mixed_steps = false;

  // SIGINT and SIGTERM go to one thread that stops the server (blocked everywhere else, so every
  // thread started from here on inherits the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);  // from finish(): wakes the thread when the server stops otherwise
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = serve::Server::create(o.server);
  if (!server) return fail(server.status());
  serve::Server& srv = **server;
  srv.start();
  fmt::print(stderr, "loom: listening on http://{}:{} (loading the model)\n", o.server.host, srv.port());
  fmt::print("{}\n", srv.port());  // the port alone on stdout, for scripts and --port 0
  std::fflush(stdout);
  std::thread signal_thread([&srv, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != SIGUSR1) fmt::print(stderr, "\nloom: stopping\n");
    srv.stop();
  });
  auto finish = [&](int rc) {
    srv.stop();
    ::kill(::getpid(),
           SIGUSR1);  // wakes sigwait if no signal did (blocked everywhere: only sigwait takes it)
    signal_thread.join();
    return rc;
  };

  std::string backend_name;
  o.gen.serving = true;  // -ub defaults to kPassTokens: the serving context's mask spans every slot
  auto session = open_generate_session(o.gen, backend_name);
  if (!session) return finish(fail(session.status()));
  auto tok = Tokenizer::from_gguf(session->model->gguf());
  if (!tok) return finish(fail(tok.status()));
  std::string note;
  auto format = o.template_file.empty()
                    ? serve::chat_format_for_model(session->model->gguf(), *tok, o.template_name, &note)
                    : serve::chat_format_from_file(session->model->gguf(), *tok, o.template_file);
  if (!format) return finish(fail(format.status()));
  if (!note.empty()) fmt::print(stderr, "loom: {}\n", note);
  const int n_ctx = session->context->n_ctx();
  const std::string format_name = format->name;
  if (Status s = srv.attach(std::move(*session), std::move(*format)); !s.ok()) return finish(fail(s));
  fmt::print(stderr,
             "loom: serving on http://{}:{}: {} sequences of {} tokens batched (paged KV cache), queue {}, "
             "chat format "
             "{}, backend {}\n",
             o.server.host, srv.port(), o.server.n_parallel, n_ctx, o.server.queue_size, format_name,
             backend_name);
  srv.wait();
  return finish(0);
}

}  // namespace

void add_serve_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, a chat page at / "
      "(-m; default: the built-in Shakespeare model)");
  add_model_flags(*cmd, o->gen);
  add_sampling_flags(*cmd, o->gen);
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0: a free one, printed on stdout)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--kv-block-size", o->server.kv_block_size,
                  "Cells per block of the paged KV cache (prompt prefixes are shared in whole blocks)")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->server.prefill_chunk,
                  "Prompt tokens a step computes while other requests decode (0: 64 in a pass of its own, 128 mixed; "
                  "at most -ub)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  // by function, so that "--mixed-steps=false" (a count of -1) reads as the opposite choice, not as unset
  auto* mixed_on = cmd->add_flag_function(
      "--mixed-steps", [o](std::int64_t n) { o->mixed_steps = n > 0; },
      "Prompt chunks ride in the running requests' pass (default on the CPU)");
  cmd->add_flag_function(
         "--no-mixed-steps", [o](std::int64_t n) { o->mixed_steps = n <= 0; },
         "Prompt chunks in passes of their own before the running requests' (default on CUDA)")
      ->excludes(mixed_on);
  cmd->add_option("--parallel", o->server.n_parallel,
                  "Requests generated at the same time, in one batch (-np); each gets -c positions")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--queue", o->server.queue_size, "Requests that may wait for a slot; more get 429")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--api-key", o->server.api_key, "Require `Authorization: Bearer KEY`");
  cmd->add_option("--timeout", o->timeout_s, "Seconds a request may take, queue included")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--alias", o->server.model_name, "Model id in /v1/models (default: the file name)");
  cmd->add_option("--chat-template", o->template_name,
                  "Chat format (" + chat_template_names() + ", plain); default: detected from the model");
  cmd->add_option("--chat-template-file", o->template_file, "Jinja chat template file");
  cmd->add_flag("--log-requests", o->server.log_requests, "One line per request on stderr");
  out.push_back({cmd, [o, cmd] {
                   ServeOptions opts = *o;
                   opts.gen.gpu_if_usable = cmd->count("--n-gpu-layers") == 0;
                   // The sampling flags are the defaults of requests that leave a parameter out.
                   auto sampler = make_sampler(opts.gen);
                   if (!sampler) return fail(sampler.status());
                   opts.server.sampling = sampler->params();
                   opts.server.sampling.seed = opts.gen.seed;
                   opts.server.device_sampling = !opts.gen.host_sampling;
                   if (opts.gen.model_path.empty() && !use_builtin_model(*cmd, opts.gen)) return 1;
                   return run_serve(std::move(opts));
                 }});
}

}  // namespace loom::app
