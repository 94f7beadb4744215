// `loom serve`: an HTTP server with OpenAI's API over one model.
//
// The server listens before the model is loaded (GET /health answers 503 until then), then
// generates up to N requests at once: one worker thread owns the backend and one context with a
// paged KV cache, every request is a sequence of an llm::BatchGenerator, and each step advances all
// running requests in one forward pass (a new prompt is computed a chunk per step meanwhile). A
// request waits in a bounded queue while N run (429 when the queue is full). Typical use (what `loom serve`
// does):
//
//   loom::serve::ServerOptions so; so.port = 0; so.n_parallel = 4;
//   auto server = loom::serve::Server::create(so);      // binds; (*server)->port() is the port
//   (*server)->start();                                  // HTTP on a background thread
//   auto session = loom::llm::open_session(sp);
//   (*server)->attach(std::move(*session), format);      // paged cache, worker: /health says ok
//   (*server)->wait();                                   // until stop()
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/chat.h"
#include "loom/llm.h"
#include "loom/sample.h"
#include "loom/status.h"
#include "loom/text.h"

namespace loom::serve {

/// Renders a conversation into the prompt text the model continues. The seam where a template
/// engine plugs in: the built-in families (loom/chat.h) are one implementation, a Jinja
/// interpreter of `tokenizer.chat_template` another.
using ChatRenderer =
    std::function<Result<std::string>(std::span<const ChatMessage> messages, bool add_generation_prompt)>;

/// How chat requests become prompts, and where the model's turn ends.
struct ChatFormat {
  std::string name;               ///< "chatml", "plain", ... (logs, /props)
  ChatRenderer render;            ///< conversation -> prompt text (without the leading BOS)
  std::vector<std::string> stop;  ///< end-of-turn texts: generation stops there, never shows them
};

/// The built-in family `t` with the model's BOS and EOS spellings from `tok`.
ChatFormat builtin_chat_format(ChatTemplate t, const Tokenizer& tok);
/// A model's own format (loom/chat.h: its Jinja template rendered as transformers does, or a
/// built-in family) with the model's BOS and EOS spellings from `tok`.
ChatFormat model_chat_format(loom::ChatFormat format, const Tokenizer& tok);
/// --chat-template-file: the Jinja template in `path`, rendered by Loom's interpreter.
Result<ChatFormat> chat_format_from_file(const GgufFile& file, const Tokenizer& tok, const std::string& path);
/// For models without a chat template: each message as "ROLE:\n" + content + "\n\n" (the role in
/// capitals), then "ASSISTANT:\n" as the generation prompt; the turn ends at "\n\nUSER:".
ChatFormat plain_chat_format();
/// The model's format: the family named by `template_name` when not empty ("plain" included), else
/// the file's `tokenizer.chat_template` rendered by the Jinja interpreter, else (no template in the
/// file, which `note` then says) the plain format.
Result<ChatFormat> chat_format_for_model(const GgufFile& file, const Tokenizer& tok,
                                         const std::string& template_name, std::string* note = nullptr);

/// Server settings; the defaults are `loom serve`'s.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;     ///< 0: a free port, chosen when binding (Server::port)
  int n_parallel = 1;  ///< requests generated at the same time (sequences of one batch)
  /// Cells per block of the paged KV cache; prompt prefixes are shared between requests in whole
  /// blocks, so `cached_tokens` is a multiple of it.
  int kv_block_size = 16;
  /// Prompt tokens a step computes while other requests decode (the prefill budget of a step that
  /// also advances every running request; a step with none decoding takes a whole -ub). Smaller:
  /// a steadier inter-token time for the running streams, a later first token for new ones.
  /// 0: 64 in a pass of its own, 128 in a mixed pass; at most -ub.
  int prefill_chunk = 0;
  /// A step's prompt chunk rides in the running requests' forward pass (a mixed pass); false: a
  /// pass of its own before theirs (the decode cadence then stalls by that pass). Unset: a pass of
  /// its own on CUDA, where the running requests' pass keeps its small-batch products (8B Q4_K_M,
  /// 64 streams of 256 + 256 tokens, H200: inter-token times <= 25 ms 76% -> 88%, time to first
  /// token p50 2.2 -> 1.2 s against mixed 128-token chunks), mixed elsewhere.
  std::optional<bool> mixed_steps;
  /// Tokens are sampled in the forward pass's graph where the request's chain can run there exactly
  /// (llm::BatchGenerator::set_device_sampling: only token ids come back, the same tokens as the
  /// host's); a request asking for log-probabilities is sampled on the host (its logits are read
  /// back). false: every token on the host (`--host-sampling`).
  bool device_sampling = true;
  int queue_size = 64;                ///< requests that may wait for a slot; more get 429
  std::string api_key;                ///< "": no authentication; else `Authorization: Bearer KEY` is required
  std::chrono::seconds timeout{600};  ///< per request, queue wait included
  std::string model_name;             ///< the id /v1/models lists (default: the file's name)
  SamplerParams sampling;             ///< what a request that names no sampling parameter gets
  int n_http_threads = 0;             ///< 0: n_parallel + queue_size + 8 (a waiting stream holds a thread)
  size_t max_body_bytes = 8u << 20;   ///< larger requests get 413
  bool log_requests = false;          ///< one stderr line per request
};

/// Counters the tests and /metrics read.
struct ServerStats {
  int queue_depth = 0;              ///< requests waiting for a slot
  int active_slots = 0;             ///< requests generating (sequences of the batch)
  int n_slots = 0;                  ///< n_parallel
  int64_t kv_cells_used = 0;        ///< KV cells held by running requests and by finished ones kept for reuse
  int cached_sequences = 0;         ///< finished requests whose cells are kept for prefix reuse
  uint64_t requests_finished = 0;   ///< generation requests completed (any reason)
  uint64_t requests_cancelled = 0;  ///< of which stopped because the client went away
  uint64_t prompt_tokens = 0;       ///< prompt tokens of finished requests
  uint64_t prompt_tokens_cached = 0;  ///< of which were shared from the KV cache
  uint64_t generated_tokens = 0;
};

namespace detail {
struct ServerImpl;
}

/// The HTTP server and its engine. Thread-safe; stop() may come from any thread.
class Server {
 public:
  /// Checks the options and binds host:port (port 0: a free one).
  static Result<std::unique_ptr<Server>> create(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The bound port.
  int port() const;
  /// Serves HTTP on a background thread; until attach(), only /health (503), / and /metrics answer.
  void start();
  /// Takes over a loaded model: its context is replaced by one paged KV cache for n_parallel
  /// sequences of the context's size, the worker starts, and generation endpoints open.
  Status attach(llm::Session session, ChatFormat format);
  /// Stops accepting, cancels what runs, joins the threads. Idempotent.
  void stop();
  /// Blocks until stop() (from another thread or a signal handler's thread).
  void wait();
  ServerStats stats() const;

 private:
  explicit Server(std::unique_ptr<detail::ServerImpl> impl);
  std::unique_ptr<detail::ServerImpl> impl_;
};

}  // namespace loom::serve
