// `loom run -m MODEL`: tokenize the prompt, prefill, then sample and stream tokens.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "generate.h"
#include "loom/llm.h"
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

}  // namespace

Result<std::string> resolve_backend(const GenerateOptions& o) {
  if (!o.backend.empty()) return o.backend;
  if (o.n_gpu_layers == 0) return std::string("cpu");
  // -ngl N: N layers on the GPU. Splitting a model between the GPU and the CPU is not built yet,
  // so any N > 0 puts the whole model on the GPU; say so rather than silently differ from
  // llama.cpp when N is smaller than the layer count.
  return std::string("cuda");
}

int run_generate(const GenerateOptions& o) {
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream f(o.prompt_file, std::ios::binary);
    if (!f) return fail(make_error(StatusCode::io_error, "{}: cannot open prompt file", o.prompt_file));
    std::ostringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
  }
  auto backend_name = resolve_backend(o);
  if (!backend_name) return fail(backend_name.status());

  llm::SessionParams sp;
  sp.model_path = o.model_path;
  sp.backend = *backend_name;
  sp.n_threads = o.n_threads;
  sp.n_ctx = o.n_ctx;
  sp.n_batch = o.n_batch;
  auto session = llm::open_session(sp);
  if (!session) return fail(session.status());
  llm::Context& ctx = *session->context;
  const int n_layer = static_cast<int>(session->model->hparams().n_layer);
  if (o.n_gpu_layers > 0 && o.n_gpu_layers < n_layer && o.backend.empty())
    return fail(make_error(StatusCode::unsupported,
                           "-ngl {}: splitting {} layers between GPU and CPU is not supported yet; use -ngl 0 (CPU) "
                           "or -ngl {} or more (all on the GPU)", o.n_gpu_layers, n_layer, n_layer));

  auto tok = Tokenizer::from_gguf(session->model->gguf());
  if (!tok) return fail(tok.status());
  auto ids = tok->encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  if (!ids) return fail(ids.status());
  std::vector<int32_t> tokens(ids->begin(), ids->end());
  if (tokens.empty()) return fail(make_error(StatusCode::invalid_argument, "the prompt has no tokens"));
  if (static_cast<int>(tokens.size()) + o.n_predict > ctx.n_ctx())
    return fail(make_error(StatusCode::invalid_argument, "prompt ({} tokens) + -n {} exceeds the context of {} (-c)",
                           tokens.size(), o.n_predict, ctx.n_ctx()));

  SamplerParams spar;
  spar.seed = o.seed;
  spar.temperature = o.temperature;
  spar.top_k = o.top_k;
  spar.top_p = o.top_p;
  spar.min_p = o.min_p;
  spar.penalties.repeat = o.repeat_penalty;
  auto sampler = Sampler::create(spar);
  if (!sampler) return fail(sampler.status());

  fmt::print("{}", prompt);
  std::fflush(stdout);
  const int n_prompt = static_cast<int>(tokens.size());
  auto t0 = std::chrono::steady_clock::now();
  llm::DecodeOptions dopt;
  dopt.all_logits = !o.dump_logits.empty();
  auto logits = ctx.decode(tokens, 0, dopt);
  if (!logits) return fail(logits.status());
  const double prompt_ms = ms_since(t0);
  std::span<const float> last = *logits;
  if (dopt.all_logits) {
    if (auto s = write_logits(o.dump_logits, *logits, tokens); !s.ok()) return fail(s);
    last = logits->subspan(logits->size() - static_cast<size_t>(ctx.n_vocab()));
  }

  const auto& special = tok->special();
  int n_gen = 0;
  auto t1 = std::chrono::steady_clock::now();
  for (; n_gen < o.n_predict; ++n_gen) {
    auto next = sampler->sample(last, tokens);
    if (!next) return fail(next.status());
    if (*next == special.eos || *next == special.eot) break;
    tokens.push_back(*next);
    auto piece = tok->token_to_piece(*next);
    if (!piece) return fail(piece.status());
    std::fwrite(piece->data(), 1, piece->size(), stdout);
    std::fflush(stdout);
    if (n_gen + 1 == o.n_predict) {
      ++n_gen;
      break;
    }
    auto step = ctx.decode(std::span<const int32_t>(&tokens.back(), 1), static_cast<int>(tokens.size()) - 1);
    if (!step) return fail(step.status());
    last = *step;
  }
  const double gen_ms = ms_since(t1);
  fmt::print("\n");
  fmt::print(stderr, "loom: prompt {} tokens in {:.1f} ms ({:.1f} tokens/s); generated {} tokens in {:.1f} ms ({:.1f} tokens/s); "
             "backend {}, seed {}\n",
             n_prompt, prompt_ms, n_prompt / (prompt_ms / 1000.0), n_gen, gen_ms,
             n_gen > 0 ? n_gen / (gen_ms / 1000.0) : 0.0, *backend_name, sampler->seed());
  return 0;
}

}  // namespace loom::app
