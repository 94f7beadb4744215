// `loom run`. Until the model runner lands, `loom run` evaluates a built-in LLaMA-style
// graph (random weights, byte vocabulary) to show the engine end to end.
#include <filesystem>
#include <optional>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "llm/llama_block.h"
#include "loom/backend.h"
#include "loom/planner.h"
#include "commands.h"
#include "generate.h"

namespace {

struct RunOptions {
  std::string backend = "cpu";
  std::string prompt = "To be, or not to be";
  int n_predict = 16;
  int n_threads = 0;
  uint32_t seed = 42;
};

int fail(const loom::Status& s) {
  std::fprintf(stderr, "loom: %s\n", s.to_string().c_str());
  return 1;
}

// Greedy decoding by recomputing the whole sequence each step (no KV cache yet).
int run_demo(const RunOptions& o) {
  loom::llm::LlamaConfig cfg;
  cfg.n_vocab = 256;
  cfg.n_embd = 256;
  cfg.n_head = 8;
  cfg.n_head_kv = 2;
  cfg.n_ff = 704;
  cfg.n_layer = 4;
  loom::BackendOptions bo;
  bo.n_threads = o.n_threads;
  auto backend = loom::create_backend(o.backend, bo);
  if (!backend) return fail(backend.status());

  std::vector<int32_t> tokens(o.prompt.begin(), o.prompt.end());
  for (int32_t& t : tokens) t &= 0xff;
  if (tokens.empty()) tokens.push_back(' ');
  const size_t n_prompt = tokens.size();

  // Weights are drawn once and re-uploaded for each step's graph: the demo has no weight store.
  std::mt19937 rng(o.seed);
  std::vector<std::vector<float>> weight_values;
  fmt::print(stderr, "loom: built-in demo model: llama-style, {} layers, {} embd, {}/{} heads, {} ffn, random weights (seed {}), backend {}\n",
             cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.n_ff, o.seed, o.backend);
  fmt::print("prompt tokens: {}\n", n_prompt);
  fmt::print("generated:");
  double total_ms = 0.0;
  size_t peak = 0;
  size_t n_nodes = 0;
  for (int step = 0; step < o.n_predict; ++step) {
    const int T = static_cast<int>(tokens.size());
    loom::Graph g;
    auto w = loom::llm::declare_llama_weights(g, cfg);
    auto in = loom::llm::declare_llama_inputs(g, T);
    loom::Tensor* logits = loom::llm::build_llama(g, cfg, w, in);
    if (!g.status().ok()) return fail(g.status());
    // only the last position's logits matter; argmax on the device keeps the readback tiny
    loom::Tensor* last = loom::view(g, logits, {cfg.n_vocab, 1, 1, 1}, logits->nb, logits->nb[1] * (T - 1));
    loom::Tensor* next = loom::argmax(g, last);
    g.mark_output(next);
    if (!g.status().ok()) return fail(g.status());
    auto alloc = loom::allocate_graph(g, (*backend)->buffer_type());
    if (!alloc) return fail(alloc.status());
    if (weight_values.empty()) {
      for (loom::Tensor* leaf : g.leafs()) {
        if (!(leaf->flags & loom::kTensorWeight)) continue;
        const bool is_norm = leaf->ne[1] == 1;
        const float r = is_norm ? 0.2f : 1.7f / std::sqrt(static_cast<float>(leaf->ne[0]));
        std::uniform_real_distribution<float> d(is_norm ? 1.0f - r : -r, is_norm ? 1.0f + r : r);
        std::vector<float> v(static_cast<size_t>(leaf->nelements()));
        for (float& x : v) x = d(rng);
        weight_values.push_back(std::move(v));
      }
    }
    size_t wi = 0;
    for (loom::Tensor* leaf : g.leafs())
      if (leaf->flags & loom::kTensorWeight) {
        auto& v = weight_values[wi++];
        if (auto s = loom::tensor_from_floats(leaf, v.data(), static_cast<int64_t>(v.size())); !s.ok()) return fail(s);
      }
    std::vector<float> tok_f(tokens.begin(), tokens.end()), pos_f(T);
    for (int i = 0; i < T; ++i) pos_f[i] = static_cast<float>(i);
    auto mask = loom::llm::causal_mask(T);
    if (auto s = loom::tensor_from_floats(in.tokens, tok_f.data(), T); !s.ok()) return fail(s);
    if (auto s = loom::tensor_from_floats(in.positions, pos_f.data(), T); !s.ok()) return fail(s);
    if (auto s = loom::tensor_from_floats(in.mask, mask.data(), static_cast<int64_t>(mask.size())); !s.ok()) return fail(s);

    auto t0 = std::chrono::steady_clock::now();
    if (auto s = (*backend)->compute(g); !s.ok()) return fail(s);
    int32_t id = 0;
    if (auto s = loom::tensor_read(next, &id, 0, sizeof(id)); !s.ok()) return fail(s);
    total_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    peak = std::max(peak, alloc->plan.peak_bytes);
    n_nodes = g.nodes().size();
    tokens.push_back(id);
    fmt::print(" {}", id);
    std::fflush(stdout);
  }
  fmt::print("\n");
  fmt::print(stderr, "loom: {} steps in {:.1f} ms ({:.1f} steps/s, full recompute per step), {} nodes per graph, arena peak {:.2f} MiB\n",
             o.n_predict, total_ms, o.n_predict / (total_ms / 1000.0), n_nodes, peak / 1048576.0);
  return 0;
}

}  // namespace

namespace loom::app {

namespace {

constexpr const char* kBuiltinModelFile = "loom-shakespeare-q8_0.gguf";

// The built-in model ships in the repository's models/ folder: found from $LOOM_MODEL, then next to
// the program's build or install tree, then in ./models.
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

}  // namespace

void add_run_command(CLI::App& app, std::vector<Command>& out) {
  auto g = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text with a GGUF model (-m; default: the built-in Shakespeare model)");
  add_model_flags(*cmd, *g);
  cmd->add_option("-p,--prompt", g->prompt, "Prompt");
  cmd->add_option("-f,--file", g->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", g->n_predict, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  add_sampling_flags(*cmd, *g);
  cmd->add_option("--dump-logits", g->dump_logits, "Write the prompt's logits (f32) to FILE and its ids to FILE.tokens");
  out.push_back({cmd, [g, cmd] {
                   if (!g->model_path.empty()) return run_generate(*g);
                   // No -m: the built-in Shakespeare model, on the GPU when one is usable.
                   if (auto path = find_builtin_model()) {
                     GenerateOptions o = *g;
                     o.model_path = *path;
                     if (cmd->count("--prompt") == 0 && cmd->count("--file") == 0) o.prompt = "ROMEO:";
                     if (cmd->count("--n-predict") == 0) o.n_predict = 200;
                     if (o.backend.empty() && cmd->count("--n-gpu-layers") == 0)
                       o.backend = create_backend("cuda").ok() ? "cuda" : "cpu";
                     return run_generate(o);
                   }
                   fmt::print(stderr, "loom: the built-in model (models/{}) was not found next to the program; "
                                      "running the demo graph with random weights instead (LOOM_MODEL=FILE or -m FILE)\n",
                              kBuiltinModelFile);
                   RunOptions demo;
                   demo.backend = g->backend.empty() ? (g->n_gpu_layers > 0 ? "cuda" : "cpu") : g->backend;
                   if (!g->prompt.empty()) demo.prompt = g->prompt;
                   demo.n_predict = g->n_predict > 0 ? std::min(g->n_predict, 64) : 16;
                   demo.n_threads = g->n_threads;
                   if (g->seed != kRandomSeed) demo.seed = g->seed;
                   return run_demo(demo);
                 }});
}

void add_backends_command(CLI::App& app, std::vector<Command>& out) {
  auto* cmd = app.add_subcommand("backends", "List the available backends");
  out.push_back({cmd, [] {
                   for (const auto& n : loom::backend_names()) fmt::print("{}\n", n);
                   return 0;
                 }});
}

}  // namespace loom::app
