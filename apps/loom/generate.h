// Options and entry point of text generation (`loom run -m MODEL`), with llama.cpp's flag names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "loom/llm.h"
#include "loom/sample.h"
#include "loom/status.h"

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace loom::app {

/// Prompt tokens per forward pass unless -ub says otherwise: kLongPassTokens for `run`, `chat` and
/// `bench` on CUDA, where a quantized weight is dequantized once a pass for the prompt's GEMMs (8B
/// Q4_K_M pp4096 on the H200: 18.4k t/s at 512 against 22.8k at 2048, docs/PERFORMANCE.md);
/// kPassTokens on the CPU and for `serve`, whose context spans every slot's cells, so its
/// [cells x pass] mask would grow with the pass (64 slots x 4096 cells x 2048 x 4 bytes = 2 GiB).
inline constexpr int kPassTokens = 512;
inline constexpr int kLongPassTokens = 2048;

struct GenerateOptions {
  std::string model_path;                   ///< -m
  std::string prompt = "Once upon a time";  ///< -p
  std::string prompt_file;                  ///< -f
  int n_predict = 64;                       ///< -n
  int n_ctx = 0;                            ///< -c (0: the model's, at most 4096)
  int n_threads = 0;                        ///< -t
  int n_batch = 0;                          ///< -ub (0: kLongPassTokens on CUDA unless serving, else kPassTokens)
  int n_batch_at_least = 0;                 ///< a pass at least this long (batched bench: a step's sequences)
  bool serving = false;                     ///< `loom serve`: kPassTokens unless -ub
  llm::KvCacheKind kv_cache = llm::KvCacheKind::contiguous;  ///< paged for batched work
  bool swa_full = false;                    ///< --swa-full
  int n_seq_max = 0;                        ///< sequences alive at once (sizes a paged cache's window ring)
  float temperature = 0.8f;                 ///< --temp
  int top_k = 40;                           ///< --top-k
  float top_p = 0.95f;                      ///< --top-p
  float min_p = 0.05f;                      ///< --min-p
  float repeat_penalty = 1.0f;              ///< --repeat-penalty
  uint32_t seed = kRandomSeed;              ///< -s
  int n_gpu_layers = 0;                     ///< -ngl
  int n_tensor_parallel = 1;                ///< -tp: ranks (GPUs) of tensor parallelism
  std::string backend;                      ///< --backend overrides -ngl's choice
  std::string numerics;        ///< --numerics exact|fast ("": LOOM_NUMERICS, else the backend's default)
  bool gpu_if_usable = false;  ///< the GPU when one is usable, else the CPU (no --backend)
  std::string dump_logits;     ///< --dump-logits: all prompt logits (f32) to this file, ids to FILE.tokens
  /// --dump-step-logits: each generated step's logits (f32, n_vocab a step; the steps sample on the
  /// host) to this file, the generated ids to FILE.tokens
  std::string dump_step_logits;
  bool stats = false;          ///< --stats: decode and graph-executor statistics on stderr at the end
  bool host_sampling = false;  ///< --host-sampling: tokens sampled on the host, never in the graph
  std::string trace_path;      ///< --trace: Chrome trace of the third decode step (CUDA)
  std::string trace_prompt_path;  ///< --trace-prompt: Chrome trace of the prompt's second chunk (CUDA)
};

int run_generate(const GenerateOptions& o);
/// --tensor-parallel N (-tp).
void add_tensor_parallel_flag(CLI::App& cmd, int& n);

// Pieces shared by the commands that load a model (run, chat, perplexity).

/// The built-in model's file name (models/ in the repository).
inline constexpr const char* kBuiltinModelFile = "loom-shakespeare-q8_0.gguf";
/// The built-in model, for commands run without -m: $LOOM_MODEL, else models/kBuiltinModelFile next
/// to the program's build or install tree, else in ./models; nullopt when none is found.
std::optional<std::string> find_builtin_model();
/// Points `o` at the built-in model, on the GPU when one is usable unless `cmd` had -ngl; false
/// (with an error on stderr saying how to give a model) when there is none.
bool use_builtin_model(const CLI::App& cmd, GenerateOptions& o);

/// Registers -m, -c, -t, -ub, --swa-full, -ngl and --backend on `cmd`, writing into `o`.
void add_model_flags(CLI::App& cmd, GenerateOptions& o);
/// Registers --numerics exact|fast on `cmd`, writing into `numerics`.
void add_numerics_flag(CLI::App& cmd, std::string& numerics);
/// A CLI11 check: a finite number in [lo, hi], or (lo, hi] with `lo_open`; hi may be infinity.
/// Unlike CLI::Range it refuses NaN (which compares false with both bounds).
CLI::Validator number_in(double lo, double hi, bool lo_open = false);
/// Registers --temp, --top-k, --top-p, --min-p, --repeat-penalty, -s and --host-sampling on `cmd`,
/// writing into `o`.
void add_sampling_flags(CLI::App& cmd, GenerateOptions& o);
/// Opens the backend `o` asks for (its name in `backend_name`), the model and a context. Without
/// --backend, -ngl N below the layer count splits the model: the last N layers and the output head
/// on the GPU, the rest on the CPU (backend_name "cuda+cpu"). Without a usable GPU, -ngl > 0 notes
/// that on stderr and runs everything on the CPU (gpu_if_usable: silently); --backend cuda fails.
Result<llm::Session> open_generate_session(const GenerateOptions& o, std::string& backend_name);
/// The backend whose executor a session's passes end on (traces, counters): the offload backend
/// (the GPU) when the model is split, else the only one.
inline Backend& executing_backend(llm::Session& s) {
  return s.offload_backend ? *s.offload_backend : *s.backend;
}
/// An error naming `source` (a file name, "the prompt (-p)") when `text` is not valid UTF-8.
Status check_utf8(std::string_view text, std::string_view source);
/// The whole of a file (binary); io_error naming `path` when it cannot be opened or read.
Result<std::string> read_file(const std::string& path);
/// The sampler chain of `o`'s sampling flags.
Result<Sampler> make_sampler(const GenerateOptions& o);
/// Where the stats line says the generation steps' tokens were sampled: "device" (in the forward
/// pass's graph), "host", or "device (N of M steps)" when both.
std::string sampling_where(int n_device_steps, int n_steps);

}  // namespace loom::app
