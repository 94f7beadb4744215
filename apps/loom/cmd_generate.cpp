// `loom run -m MODEL`: tokenize the prompt, prefill, then sample and stream tokens.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench.h"
#include "generate.h"
#include "loom/exec.h"
#include "loom/gguf.h"
#include "loom/llm.h"
#include "loom/llm_sampling.h"
#include "loom/sample.h"
#include "loom/text.h"

namespace loom::app {

namespace {

int fail(const Status& s) {
  std::fflush(stdout);
  std::fprintf(stderr, "\nloom: %s\n", s.to_string().c_str());
  return 1;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Status write_logits(const std::string& path, std::span<const float> logits, std::span<const int32_t> tokens) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return make_error(StatusCode::io_error, "{}: cannot open for writing", path);
  f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size_bytes()));
  std::ofstream t(path + ".tokens");
  for (size_t i = 0; i < tokens.size(); ++i) t << (i ? "," : "") << tokens[i];
  t << "\n";
  if (!f || !t) return make_error(StatusCode::io_error, "{}: write failed", path);
  return {};
}

// The --stats report: the context's bookkeeping of the prompt and of the last step, and what the
// backend's graph executor did for the prompt and for the `n_steps` one-token steps.
void print_stats(int n_prompt, const llm::DecodeStats& prompt, const ExecCounters& prompt_exec,
                 const llm::DecodeStats& step, const ExecCounters& step_exec, int n_steps,
                 const llm::Context& ctx) {
  auto indent = [](const std::string& s) {
    std::string out;
    size_t start = 0;
    while (start < s.size()) {
      const size_t end = std::min(s.find('\n', start), s.size());
      out += "loom:   " + s.substr(start, end - start) + "\n";
      start = end + 1;
    }
    return out;
  };
  fmt::print(
      stderr,
      "loom: stats: context {} cells ({} used), batch {}, KV cache {:.1f} MiB, activation arena {:.1f} MiB "
      "(allocated {} times)\n",
      ctx.n_ctx(), ctx.kv_cache_used(), ctx.n_batch(), ctx.kv_cache_bytes() / (1024.0 * 1024.0),
      step.arena_bytes / (1024.0 * 1024.0), step.n_arena_allocations);
  fmt::print(stderr,
             "loom: stats: prompt: {} tokens, forward passes {}, {} graph nodes in the last; executor:\n{}",
             n_prompt, prompt.n_steps, prompt.n_nodes, indent(exec_counters_string(prompt_exec)));
  fmt::print(stderr, "loom: stats: generation: {} one-token steps, {} graph nodes in the last; executor:\n{}",
             n_steps, n_steps > 0 ? step.n_nodes : 0, indent(exec_counters_string(step_exec)));
  if (n_steps > 0) {
    const uint32_t n_layer = std::max<uint32_t>(1, ctx.model().hparams().n_layer);
    fmt::print(stderr, "loom: stats: generation: {:.1f} kernels/token ({:.1f} per layer), host {:.1f} us/token\n",
               static_cast<double>(step_exec.kernels) / n_steps,
               static_cast<double>(step_exec.kernels) / n_steps / n_layer,
               static_cast<double>(step_exec.host_ns) / n_steps / 1e3);
    if (!step.tp_rank_busy_ns.empty()) {  // the last step's ranks: their parts and their starts
      std::string ranks;
      for (size_t k = 0; k < step.tp_rank_busy_ns.size(); ++k)
        ranks += fmt::format("{}rank {} {:.1f} us (from +{:.1f})", k ? ", " : "", k, step.tp_rank_busy_ns[k] / 1e3,
                             step.tp_rank_start_lag_ns[k] / 1e3);
      fmt::print(stderr, "loom: stats: generation: last step's tensor-parallel ranks: {}\n", ranks);
    }
  }
}

}  // namespace

std::string sampling_where(int n_device_steps, int n_steps) {
  if (n_device_steps == 0) return "host";
  if (n_device_steps == n_steps) return "device";
  return fmt::format("device ({} of {} steps)", n_device_steps, n_steps);
}

namespace {

// --backend, else what -ngl implies: any -ngl > 0 means the GPU (open_generate_session splits the
// layers when -ngl is below the layer count).
std::string resolve_backend(const GenerateOptions& o) {
  if (!o.backend.empty()) return o.backend;
  return o.n_gpu_layers > 0 || o.gpu_if_usable ? "cuda" : "cpu";
}

// Errors that say there is no usable GPU (no CUDA build, no driver, no device), as opposed to a
// problem with the model or the request.
bool gpu_unusable(const Status& s) {
  return s.code() == StatusCode::device_error || s.code() == StatusCode::unsupported;
}

// The layer count of a model file, read before the backends are made (the header and metadata
// only; the weights stay unread).
Result<int> layer_count(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file) return file.status();
  auto hp = llm::read_hparams(*file);
  if (!hp) return hp.status();
  return static_cast<int>(hp->n_layer);
}

}  // namespace

std::optional<std::string> find_builtin_model() {
  if (const char* env = std::getenv("LOOM_MODEL"); env && *env) return std::string(env);
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto bin = exe.parent_path();
    dirs = {bin / "../../models", bin / "../models", bin / "../share/loom/models"};
  }
  dirs.emplace_back("models");
  for (const auto& d : dirs) {
    const auto f = d / kBuiltinModelFile;
    if (std::filesystem::is_regular_file(f, ec)) return std::filesystem::weakly_canonical(f, ec).string();
  }
  return std::nullopt;
}

bool use_builtin_model(const CLI::App& cmd, GenerateOptions& o) {
  auto path = find_builtin_model();
  if (!path) {
    fmt::print(stderr,
               "loom: no model given (-m FILE) and the built-in model (models/{}) was not found next to the "
               "program; set LOOM_MODEL=FILE or pass -m FILE\n",
               kBuiltinModelFile);
    return false;
  }
  o.model_path = *path;
  o.gpu_if_usable = cmd.count("--n-gpu-layers") == 0;
  return true;
}

void add_model_flags(CLI::App& cmd, GenerateOptions& o) {
  cmd.add_option("-m,--model", o.model_path, "GGUF model file");
  cmd.add_option("-c,--ctx-size", o.n_ctx, "Context size (0: the model's, at most 4096)")
      ->check(CLI::Range(0, 1 << 24));
  cmd.add_option("-t,--threads", o.n_threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd.add_option("--ubatch-size", o.n_batch, fmt::format("Prompt tokens per forward pass (default {} on CUDA, {} on the CPU and for serve)",
                             kLongPassTokens, kPassTokens))->check(CLI::Range(1, 1 << 16));
  cmd.add_flag("--swa-full", o.swa_full,
               "Sliding-window layers keep the whole context instead of their window (more memory; "
               "for comparisons)");
  cmd.add_option("--n-gpu-layers", o.n_gpu_layers, "Layers on the GPU (0: CPU only; >= layer count: all)")
      ->check(CLI::Range(0, 100000));
  cmd.add_option("--trace", o.trace_path,
                 "Write a Chrome trace (per-dispatch GPU times) of the third decode step to FILE, and its "
                 "plan to FILE.dot");
  cmd.add_option("--trace-prompt", o.trace_prompt_path,
                 "Write a Chrome trace of the prompt's second chunk (a prompt longer than -ub) to FILE");
  cmd.add_option("--backend", o.backend, "Backend by name (cpu, cuda); overrides -ngl");
  add_tensor_parallel_flag(cmd, o.n_tensor_parallel);
  add_numerics_flag(cmd, o.numerics);
}

void add_tensor_parallel_flag(CLI::App& cmd, int& n) {
  cmd.add_option("--tensor-parallel", n,
                 "Split the model over N GPUs (-tp; devices 0..N-1): heads, FFN columns and vocabulary "
                 "divided, one NCCL all-reduce after attention and one after the FFN")
      ->check(CLI::Range(1, 64));
}

void add_numerics_flag(CLI::App& cmd, std::string& numerics) {
  cmd.add_option("--numerics", numerics,
                 "Rounding mode: exact (CUDA equals the CPU bit for bit) or fast (tensor cores; the GPU "
                 "default). Default: LOOM_NUMERICS, else the backend's")
      ->check(CLI::IsMember({"exact", "fast"}));
  // The CUDA backend reads LOOM_DETERMINISTIC once, when its first kernel is planned: set it before.
  cmd.add_flag_callback(
      "--deterministic", [] { setenv("LOOM_DETERMINISTIC", "1", 1); },
      "Batch-invariant fast numerics on CUDA: a sequence's tokens do not depend on what else a step "
      "holds (LOOM_DETERMINISTIC=1; slower at small batches; docs/BATCHING.md)");
}

CLI::Validator number_in(double lo, double hi, bool lo_open) {
  const std::string range =
      fmt::format("{}{}, {}", lo_open ? "(" : "[", lo, std::isinf(hi) ? "inf)" : fmt::format("{}]", hi));
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& in) -> std::string {
        double v = 0.0;
        // isfinite first: NaN fails every comparison, so CLI::Range lets it through.
        if (!CLI::detail::lexical_cast(in, v) || !std::isfinite(v) || (lo_open ? v <= lo : v < lo) || v > hi)
          return fmt::format("Value {} not in range {}", in, range);
        return {};
      },
      "FLOAT in " + range);
}

void add_sampling_flags(CLI::App& cmd, GenerateOptions& o) {
  // Out-of-range values are refused rather than clamped or read as "off", so a typo (--top-p 7
  // for 0.7) does not silently change the sampling.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  cmd.add_option("--temp", o.temperature, "Temperature (0: greedy)")->check(number_in(0.0, kInf));
  cmd.add_option("--top-k", o.top_k, "Top-k (0: off)")->check(CLI::Range(0, 1 << 30));
  cmd.add_option("--top-p", o.top_p, "Top-p (1: off)")->check(number_in(0.0, 1.0));
  cmd.add_option("--min-p", o.min_p, "Min-p (0: off)")->check(number_in(0.0, 1.0));
  cmd.add_option("--repeat-penalty", o.repeat_penalty, "Repetition penalty (1: off)")
      ->check(number_in(0.0, kInf, /*lo_open=*/true));
  cmd.add_option("-s,--seed", o.seed, "Sampling seed (default: random)");
  cmd.add_flag("--host-sampling", o.host_sampling,
               "Sample on the host from logits read back, not in the forward pass's graph (the same "
               "tokens; for comparisons)");
}

Result<llm::Session> open_generate_session(const GenerateOptions& o, std::string& backend_name) {
  backend_name = resolve_backend(o);
  const int pass_tokens = backend_name == "cuda" && !o.serving ? kLongPassTokens : kPassTokens;
  llm::SessionParams sp;
  sp.model_path = o.model_path;
  sp.backend = backend_name;
  sp.n_threads = o.n_threads;
  sp.n_ctx = o.n_ctx;
  sp.n_batch = std::max(o.n_batch > 0 ? o.n_batch : pass_tokens, o.n_batch_at_least);
  sp.kv_cache = o.kv_cache;
  sp.swa_full = o.swa_full;
  sp.n_seq_max = o.n_seq_max;
  sp.n_tensor_parallel = o.n_tensor_parallel;
  if (!o.numerics.empty()) {
    auto n = parse_numerics(o.numerics, "--numerics");
    if (!n) return n.status();
    sp.numerics = *n;
  }
  // -ngl N below the layer count: llama.cpp's split. The CPU is the main backend (embeddings and
  // the first layers, weights used from the mapping); the last N layers and the head go to the GPU.
  if (o.backend.empty() && o.n_gpu_layers > 0 && o.n_tensor_parallel == 1) {
    auto n_layer = layer_count(o.model_path);
    if (!n_layer) return n_layer.status();
    if (o.n_gpu_layers < *n_layer) {
      sp.backend = "cpu";
      sp.offload_backend = "cuda";
      sp.n_offload_layers = o.n_gpu_layers;
      backend_name = "cuda+cpu";
    }
  }
  // bench tables and logs tell a split model apart: "cuda-tp2"
  const std::string tp_suffix = o.n_tensor_parallel > 1 ? fmt::format("-tp{}", o.n_tensor_parallel) : "";
  backend_name += tp_suffix;
  auto session = llm::open_session(sp);
  if (session || !gpu_unusable(session.status()) || !o.backend.empty()) return session;
  // No usable GPU: the CPU, when the GPU was only wished for (no -ngl) or asked for by -ngl (with a
  // note, as llama.cpp falls back); --backend cuda stays an error.
  if (o.n_gpu_layers > 0)
    fmt::print(stderr, "loom: -ngl {}: no usable GPU ({}); running every layer on the CPU\n", o.n_gpu_layers,
               session.status().message());
  else if (!o.gpu_if_usable)
    return session;
  sp.backend = "cpu";
  backend_name = "cpu" + tp_suffix;
  sp.offload_backend.clear();
  sp.n_offload_layers = 0;
  return llm::open_session(sp);
}

Status check_utf8(std::string_view text, std::string_view source) {
  if (size_t bad = text::utf8_first_invalid(text); bad != std::string_view::npos)
    return make_error(StatusCode::invalid_argument, "{}: not valid UTF-8 at byte {}", source, bad);
  return {};
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::io_error, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(StatusCode::io_error, "{}: read failed", path);
  return ss.str();
}

Result<Sampler> make_sampler(const GenerateOptions& o) {
  SamplerParams spar;
  spar.seed = o.seed;
  spar.temperature = o.temperature;
  spar.top_k = o.top_k;
  spar.top_p = o.top_p;
  spar.min_p = o.min_p;
  spar.penalties.repeat = o.repeat_penalty;
  return Sampler::create(spar);
}

int run_generate(const GenerateOptions& o) {
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    auto text = read_file(o.prompt_file);
    if (!text) return fail(text.status());
    prompt = std::move(*text);
  }
  // Checked here, before the model loads, so that the error names the prompt's source: the
  // tokenizer would name the model file.
  if (Status s = check_utf8(prompt, o.prompt_file.empty() ? "the prompt (-p)" : o.prompt_file); !s.ok())
    return fail(s);
  std::string backend_name;
  auto session = open_generate_session(o, backend_name);
  if (!session) return fail(session.status());
  llm::Context& ctx = *session->context;

  auto tok = Tokenizer::from_gguf(session->model->gguf());
  if (!tok) return fail(tok.status());
  auto ids = tok->encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  if (!ids) return fail(ids.status());
  std::vector<int32_t> tokens(ids->begin(), ids->end());
  if (tokens.empty()) return fail(make_error(StatusCode::invalid_argument, "the prompt has no tokens"));
  if (static_cast<int>(tokens.size()) + o.n_predict > ctx.n_ctx())
    return fail(make_error(StatusCode::invalid_argument,
                           "prompt ({} tokens) + -n {} exceeds the context of {} (-c)", tokens.size(),
                           o.n_predict, ctx.n_ctx()));

  auto sampler = make_sampler(o);
  if (!sampler) return fail(sampler.status());

  fmt::print("{}", prompt);
  std::fflush(stdout);
  const int n_prompt = static_cast<int>(tokens.size());
  // The backend whose executor --stats reports: the GPU's when the layers are split.
  Backend& backend = executing_backend(*session);
  reset_exec_counters(backend);  // loading may have computed; --stats covers prompt and generation only
  auto t0 = std::chrono::steady_clock::now();
  llm::DecodeOptions dopt;
  dopt.all_logits = !o.dump_logits.empty();
  // A prompt of several chunks shows its progress on a terminal's stderr (logs and pipes get nothing).
  const bool show_progress = n_prompt > ctx.n_batch() && ::isatty(2);
  if (show_progress)
    dopt.on_chunk = [t0](size_t done, size_t total) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print(stderr, "\r[prompt {}/{} tokens, {:.0f} t/s]", done, total,
                 s > 0 ? static_cast<double>(done) / s : 0.0);
      std::fflush(stderr);
    };
  if (!o.trace_prompt_path.empty()) {
    if (n_prompt <= ctx.n_batch())
      return fail(make_error(StatusCode::invalid_argument,
                             "--trace-prompt: the prompt ({} tokens) has one chunk; it needs more than -ub {}",
                             n_prompt, ctx.n_batch()));
    // After the first chunk (whose pass also records the graph), the next compute is traced.
    dopt.on_chunk = [&, progress = dopt.on_chunk](size_t done, size_t total) {
      if (progress) progress(done, total);
      if (done == static_cast<size_t>(ctx.n_batch()))
        if (Status st = capture_next_compute(backend, o.trace_prompt_path); !st.ok())
          fmt::print(stderr, "loom: --trace-prompt: {}\n", st.to_string());
    };
  }
  auto logits = ctx.decode(tokens, 0, dopt);
  if (show_progress) fmt::print(stderr, "\r\033[K");
  if (!logits) return fail(logits.status());
  const double prompt_ms = ms_since(t0);
  std::span<const float> last = *logits;
  if (dopt.all_logits) {
    if (auto s = write_logits(o.dump_logits, *logits, tokens); !s.ok()) return fail(s);
    last = logits->subspan(logits->size() - static_cast<size_t>(ctx.n_vocab()));
  }

  // The prompt's pass and the one-token steps differ in shape: --stats reports them apart.
  const ExecCounters prompt_counters = exec_counters(backend);
  const llm::DecodeStats prompt_stats = ctx.stats();
  reset_exec_counters(backend);

  // The first token comes from the prompt's logits (read back by its pass); each step after that
  // samples its token in the pass's graph where the chain can run there (decode_and_sample).
  const auto& special = tok->special();
  llm::DecodeSampleOptions step_options;
  // --dump-step-logits: the steps' logits have to come back, so the host samples
  step_options.device = !o.host_sampling && o.dump_step_logits.empty();
  std::vector<float> step_logits;   // --dump-step-logits: n_vocab floats a step
  std::vector<int32_t> step_ids;    // the tokens those steps were fed
  int n_gen = 0;
  int n_steps = 0;
  int n_device_steps = 0;  // steps whose token was sampled in the graph
  auto t1 = std::chrono::steady_clock::now();
  TokenSplit split;  // --stats: the one-token steps' time
  int32_t next = -1;
  if (o.n_predict > 0) {
    auto first = sampler->sample(last, tokens);
    if (!first) return fail(first.status());
    next = *first;
  }
  for (; n_gen < o.n_predict; ++n_gen) {
    if (next == special.eos || next == special.eot) break;
    tokens.push_back(next);
    auto piece = tok->token_to_piece(next);
    if (!piece) return fail(piece.status());
    std::fwrite(piece->data(), 1, piece->size(), stdout);
    std::fflush(stdout);
    if (n_gen + 1 == o.n_predict) {
      ++n_gen;
      break;
    }
    if (!o.trace_path.empty() && n_steps == 2) {  // a replayed step: trace the third one
      if (Status s = capture_next_compute(backend, o.trace_path); !s.ok()) return fail(s);
    }
    const ExecCounters before = o.stats ? exec_counters(backend) : ExecCounters{};
    const auto step_t0 = std::chrono::steady_clock::now();
    auto step = llm::decode_and_sample(ctx, *sampler, std::span<const int32_t>(&tokens.back(), 1),
                                       static_cast<int>(tokens.size()) - 1, tokens, step_options);
    if (!step) return fail(step.status());
    if (!o.dump_step_logits.empty()) {
      step_logits.insert(step_logits.end(), step->logits.begin(), step->logits.end());
      step_ids.push_back(tokens.back());
    }
    if (o.stats)  // where the step's time went (--stats), its sampling on the host in "other"
      split.add(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - step_t0).count(),
                ctx.stats(), before, exec_counters(backend));
    if (!o.trace_path.empty() && n_steps == 2)
      fmt::print(stderr, "loom: trace of decode step 3 written to {} (plan: {}.dot)\n", o.trace_path,
                 o.trace_path);
    ++n_steps;
    n_device_steps += step->on_device ? 1 : 0;
    next = step->token;
  }
  const double gen_ms = ms_since(t1);
  if (!o.dump_step_logits.empty())
    if (auto s = write_logits(o.dump_step_logits, step_logits, step_ids); !s.ok()) return fail(s);
  fmt::print("\n");
  std::fflush(stdout);  // the stats line on stderr comes after the text
  fmt::print(stderr,
             "loom: prompt {} tokens in {:.1f} ms ({:.1f} tokens/s); generated {} tokens in {:.1f} ms "
             "({:.1f} tokens/s); "
             "backend {}, seed {}, sampling {}\n",
             n_prompt, prompt_ms, n_prompt / (prompt_ms / 1000.0), n_gen, gen_ms,
             n_gen > 0 ? n_gen / (gen_ms / 1000.0) : 0.0, backend_name, sampler->seed(),
             sampling_where(n_device_steps, n_steps));
  if (o.stats) {
    print_stats(n_prompt, prompt_stats, prompt_counters, ctx.stats(), exec_counters(backend), n_steps, ctx);
    if (split.steps > 0) fmt::print(stderr, "loom: stats: generation: {}\n", split.to_string());
  }
  return 0;
}

}  // namespace loom::app
