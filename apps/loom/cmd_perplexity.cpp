// `loom perplexity -m MODEL -f TEXT`: perplexity by llama.cpp's method (see perplexity.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "generate.h"
#include "kl_divergence.h"
#include "perplexity.h"

namespace loom::app {

double token_nll(std::span<const float> logits, int32_t next) {
  double max = -INFINITY;
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  return -((static_cast<double>(logits[static_cast<size_t>(next)]) - max) - std::log(sum));
}

void for_row_ranges(int n_rows, int n_threads, const std::function<void(int, int)>& work) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  const int nt = std::max(1, std::min({n_threads, 16, n_rows}));
  if (nt == 1) {
    if (n_rows > 0) work(0, n_rows);
    return;
  }
  std::vector<std::thread> threads;
  const int per = (n_rows + nt - 1) / nt;
  for (int t = 0; t < nt; ++t) {
    const int r0 = t * per, r1 = std::min(n_rows, r0 + per);
    if (r0 < r1) threads.emplace_back(work, r0, r1);
  }
  for (auto& th : threads) th.join();
}

int perplexity_chunk_count(size_t n_tokens, const PerplexityParams& p) {
  if (p.n_ctx <= 0) return 0;
  int n_chunks = static_cast<int>(n_tokens / static_cast<size_t>(p.n_ctx));
  if (p.max_chunks > 0) n_chunks = std::min(n_chunks, p.max_chunks);
  return n_chunks;
}

namespace {

// NLLs of the scored positions of one chunk: out[k] for position first + k.
void chunk_nlls(std::span<const float> logits, size_t n_vocab, std::span<const int32_t> chunk, int first,
                int n_threads, std::vector<double>& out) {
  const int n_rows = static_cast<int>(chunk.size()) - 1 - first;
  out.assign(static_cast<size_t>(n_rows), 0.0);
  for_row_ranges(n_rows, n_threads, [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
      const size_t j = static_cast<size_t>(first + r);
      out[static_cast<size_t>(r)] = token_nll(logits.subspan(j * n_vocab, n_vocab), chunk[j + 1]);
    }
  });
}

}  // namespace

Result<PerplexityResult> compute_perplexity(llm::Context& ctx, std::span<const int32_t> tokens,
                                            const PerplexityParams& p,
                                            const std::function<void(int, double)>& on_chunk,
                                            const ChunkLogitsFn& on_logits) {
  const int n_ctx = p.n_ctx;
  if (n_ctx < 4)
    return make_error(StatusCode::invalid_argument, "perplexity: chunk size {} is too small (at least 4)",
                      n_ctx);
  if (ctx.n_ctx() < n_ctx)
    return make_error(StatusCode::invalid_argument,
                      "perplexity: chunks of {} tokens do not fit a context of {}", n_ctx, ctx.n_ctx());
  if (tokens.size() < static_cast<size_t>(n_ctx))
    return make_error(StatusCode::invalid_argument,
                      "perplexity: the text has {} tokens; at least one chunk of {} (-c) is needed",
                      tokens.size(), n_ctx);
  const int n_chunks = perplexity_chunk_count(tokens.size(), p);
  const int first = n_ctx / 2;
  const size_t n_vocab = static_cast<size_t>(ctx.n_vocab());
  int n_threads = p.n_threads > 0 ? p.n_threads : static_cast<int>(std::thread::hardware_concurrency());
  n_threads = std::clamp(n_threads, 1, 16);

  PerplexityResult r;
  double sum = 0.0, sum_sq = 0.0;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  std::vector<double> nll;
  llm::DecodeOptions all;
  all.all_logits = true;
  for (int c = 0; c < n_chunks; ++c) {
    const auto begin = tokens.begin() + static_cast<ptrdiff_t>(c) * n_ctx;
    std::copy(begin, begin + n_ctx, chunk.begin());
    if (p.bos != kNoToken) chunk[0] = p.bos;
    ctx.kv_cache_clear();
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = ctx.decode(chunk, 0, all);
    if (!logits) return logits.status();
    r.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.n_decoded += n_ctx;
    if (logits->size() != chunk.size() * n_vocab)
      return make_error(StatusCode::internal, "perplexity: decode returned {} logits, expected {}",
                        logits->size(), chunk.size() * n_vocab);
    if (on_logits) LOOM_TRY(on_logits(c, chunk, *logits));
    chunk_nlls(*logits, n_vocab, chunk, first, n_threads, nll);
    for (double v : nll) {
      sum += v;
      sum_sq += v * v;
    }
    r.n_scored += static_cast<int64_t>(nll.size());
    r.n_chunks = c + 1;
    r.running.push_back(std::exp(sum / static_cast<double>(r.n_scored)));
    if (on_chunk) on_chunk(c + 1, r.running.back());
  }
  const double n = static_cast<double>(r.n_scored);
  r.nll_mean = sum / n;
  const double var = sum_sq / n - r.nll_mean * r.nll_mean;
  r.nll_stderr = (r.n_scored > 1 && var > 0.0) ? std::sqrt(var / (n - 1.0)) : 0.0;
  r.ppl = std::exp(r.nll_mean);
  r.ppl_err = r.ppl * r.nll_stderr;
  return r;
}

namespace {

struct PerplexityOptions {
  GenerateOptions model;
  std::string text_file;
  int max_chunks = -1;
  std::string kld_base;        ///< --kl-divergence-base
  bool kl_divergence = false;  ///< --kl-divergence: compare with kld_base instead of writing it
  bool ctx_given = false;      ///< -c on the command line (else --kl-divergence takes the base's)
};

int fail(const Status& s) {
  std::fflush(stdout);
  std::fprintf(stderr, "\nloom: %s\n", s.to_string().c_str());
  return 1;
}

// --kl-divergence: the tokens come from the base file, not from a text.
int run_kl_divergence(PerplexityOptions o) {
  auto base = KldBaseFile::open(o.kld_base);
  if (!base) return fail(base.status());
  if (!o.ctx_given) o.model.n_ctx = base->n_ctx();
  std::string backend_name;
  auto session = open_generate_session(o.model, backend_name);
  if (!session) return fail(session.status());
  llm::Context& ctx = *session->context;

  PerplexityParams p;
  p.n_ctx = ctx.n_ctx();
  p.max_chunks = o.max_chunks;
  p.n_threads = o.model.n_threads;
  const int n_chunks = perplexity_chunk_count(base->tokens().size(), p);
  fmt::print(stderr,
             "loom: KL divergence against {}: {} chunks of {} tokens{}, scoring the last {} of each; backend "
             "{}\n",
             o.kld_base, n_chunks, base->n_ctx(),
             o.text_file.empty() ? "" : " (stored there; -f is not read)", base->rows_per_chunk(),
             backend_name);
  fmt::print("{}\n", kl_divergence_table_header());
  auto r = compute_kl_divergence(ctx, *base, p, [](int chunk, const KlDivergenceResult& running) {
    fmt::print("{}\n", kl_divergence_table_row(chunk, running));
    std::fflush(stdout);
  });
  if (!r) return fail(r.status());
  fmt::print("\n{}", kl_divergence_summary(*r));
  fmt::print(
      stderr, "loom: {} tokens in {} chunks decoded in {:.2f} s ({:.1f} tokens/s); {} tokens compared\n",
      r->run.n_decoded, r->run.n_chunks, r->run.decode_seconds,
      r->run.decode_seconds > 0.0 ? static_cast<double>(r->run.n_decoded) / r->run.decode_seconds : 0.0,
      r->n_scored);
  return 0;
}

int run_perplexity(const PerplexityOptions& o) {
  if (o.kl_divergence) return run_kl_divergence(o);
  if (o.text_file.empty())
    return fail(
        make_error(StatusCode::invalid_argument,
                   "perplexity: no text to evaluate: pass -f TEXT, a plain-text file (not needed with "
                   "--kl-divergence)"));
  auto read = read_file(o.text_file);
  if (!read) return fail(read.status());
  const std::string text = std::move(*read);
  if (Status s = check_utf8(text, o.text_file); !s.ok()) return fail(s);

  std::string backend_name;
  auto session = open_generate_session(o.model, backend_name);
  if (!session) return fail(session.status());
  llm::Context& ctx = *session->context;
  auto tok = Tokenizer::from_gguf(session->model->gguf());
  if (!tok) return fail(tok.status());

  const auto t0 = std::chrono::steady_clock::now();
  // Raw text: special-token spellings in it stay text (llama-perplexity does the same).
  auto ids = tok->encode(text, /*add_special=*/true, /*parse_special=*/false);
  if (!ids) return fail(make_error(ids.status().code(), "{}: {}", o.text_file, ids.status().message()));
  const double tok_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  PerplexityParams p;
  p.n_ctx = ctx.n_ctx();
  p.max_chunks = o.max_chunks;
  p.bos = tok->special().add_bos ? tok->special().bos : kNoToken;
  p.n_threads = o.model.n_threads;
  const size_t n_complete = ids->size() / static_cast<size_t>(p.n_ctx);
  const size_t n_chunks =
      o.max_chunks > 0 ? std::min(n_complete, static_cast<size_t>(o.max_chunks)) : n_complete;
  fmt::print(
      stderr,
      "loom: perplexity: {} tokens ({:.1f} ms to tokenize), {} chunks of {} tokens, scoring the last {} of "
      "each; backend {}\n",
      ids->size(), tok_ms, n_chunks, p.n_ctx, p.n_ctx - 1 - p.n_ctx / 2, backend_name);
  auto print_chunk = [](int chunk, double ppl) {
    fmt::print("{}[{}]{:.4f}", chunk > 1 ? "," : "", chunk, ppl);
    std::fflush(stdout);
  };
  auto r = o.kld_base.empty() ? compute_perplexity(ctx, *ids, p, print_chunk)
                              : compute_perplexity_saving_base(ctx, *ids, p, o.kld_base, print_chunk);
  if (!r) return fail(r.status());
  fmt::print("\nFinal estimate: PPL = {:.4f} +/- {:.5f}\n", r->ppl, r->ppl_err);
  fmt::print(stderr, "loom: {} tokens in {} chunks decoded in {:.2f} s ({:.1f} tokens/s); {} tokens scored\n",
             r->n_decoded, r->n_chunks, r->decode_seconds,
             r->decode_seconds > 0.0 ? static_cast<double>(r->n_decoded) / r->decode_seconds : 0.0,
             r->n_scored);
  if (!o.kld_base.empty())
    fmt::print(stderr, "loom: saved the base distributions of {} tokens to {} ({:.1f} MiB)\n", r->n_scored,
               o.kld_base,
               static_cast<double>(kKldHeaderBytes + 4 * static_cast<size_t>(r->n_decoded) +
                                   static_cast<size_t>(r->n_scored) *
                                       kld_row_bytes(static_cast<size_t>(ctx.n_vocab()))) /
                   (1024.0 * 1024.0));
  return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<PerplexityOptions>();
  // 512 is the context llama.cpp's published wikitext-2 perplexities use.
  o->model.n_ctx = 512;
  auto* cmd = app.add_subcommand("perplexity",
                                 "Perplexity of a model on a text file, by llama.cpp's method: chunks of -c "
                                 "tokens (default 512), the second "
                                 "half of each scored; needs at least one complete chunk");
  add_model_flags(*cmd, o->model);
  cmd->get_option("--model")->description(
      "GGUF model file (default: the built-in Shakespeare model, with -c "
      "its context of 256 unless given)");
  cmd->add_option("-f,--file", o->text_file, "Text file to evaluate (not needed with --kl-divergence)");
  cmd->add_option("--chunks", o->max_chunks, "Evaluate at most N chunks (default: all)")
      ->check(CLI::Range(1, 1 << 30));
  auto* base = cmd->add_option("--kl-divergence-base", o->kld_base,
                               "Save every scored position's next-token distribution to FILE (16 bits per "
                               "entry); with --kl-divergence, the file to compare with");
  cmd->add_flag("--kl-divergence", o->kl_divergence,
                "Run over the tokens of --kl-divergence-base FILE and report KL divergence, PPL ratio and "
                "top-token agreement against it")
      ->needs(base);
  CLI::Option* ctx_flag = cmd->get_option("--ctx-size");
  out.push_back({cmd, [o, cmd, ctx_flag] {
                   o->ctx_given = ctx_flag->count() > 0;
                   if (!o->model.model_path.empty()) return run_perplexity(*o);
                   PerplexityOptions builtin = *o;
                   if (!use_builtin_model(*cmd, builtin.model)) return 1;
                   // 512 would exceed the built-in model's training context; its own (256) is what
                   // models/README.md reports the held-out perplexity at.
                   if (!builtin.ctx_given) builtin.model.n_ctx = 0;
                   return run_perplexity(builtin);
                 }});
}

}  // namespace loom::app
