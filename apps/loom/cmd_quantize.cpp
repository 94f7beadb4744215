// `loom quantize IN.gguf OUT.gguf TYPE [-t threads] [--pure] [--dry-run]`.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "gguf_info.h"
#include "quantize_model.h"

namespace loom::app {

namespace {

struct QuantizeCliOptions {
  std::string input;
  std::string output;
  std::string type;
  int n_threads = 0;
  bool dry_run = false;
  bool pure = false;
};

const char* ggml_name(uint32_t id) {
  const GgmlTypeInfo* t = ggml_type_info(id);
  return t ? t->name : "?";
}

// The file types `loom quantize` writes: the quantized ones.
std::string valid_types() {
  std::string s;
  for (llm::FileType f : llm::all_file_types())
    if (llm::file_type_is_quantized(f))
      s += fmt::format("{}{}", s.empty() ? "" : ", ", llm::file_type_name(f));
  return s;
}

int fail(const Status& s) {
  std::fprintf(stderr, "loom: %s\n", s.to_string().c_str());
  return 1;
}

void print_plan(const QuantizePlan& plan) {
  for (const TensorPlan& p : plan.tensors)
    fmt::print(
        "{:<40} {:>6} -> {}{}\n", p.name, ggml_name(p.src_type), ggml_name(p.dst_type),
        p.fell_back ? fmt::format("  (fallback: ne0 = {} does not fit the chosen block)", p.ne[0]) : "");
}

int run_quantize(const QuantizeCliOptions& o) {
  const auto ftype = llm::file_type_from_name(o.type);
  if (!ftype)
    return fail(make_error(StatusCode::invalid_argument, "quantize: unknown type '{}'; expected one of {}",
                           o.type, valid_types()));
  if (!llm::file_type_is_quantized(*ftype))
    return fail(make_error(StatusCode::invalid_argument,
                           "quantize: '{}' is not a quantized type; expected one of {} (loom gen-model "
                           "writes float models)",
                           o.type, valid_types()));
  if (o.dry_run) {
    auto in = GgufFile::open(o.input);
    if (!in) return fail(in.status());
    auto plan = plan_quantization(*in, *ftype, o.pure);
    if (!plan) return fail(plan.status());
    print_plan(*plan);
    return 0;
  }
  QuantizeOptions qo;
  qo.n_threads = o.n_threads;
  qo.pure = o.pure;
  // One line rewritten in place on a terminal; nothing per tensor when stderr is a log file.
  if (::isatty(STDERR_FILENO)) {
    qo.on_tensor = [](const QuantizeProgress& p) {
      if (p.done) return;  // the line names the tensor being converted, which may take seconds
      fmt::print(stderr, "\r\x1b[2K[{:>{}}/{}] {:5.1f}%  {} {} -> {}", p.index + 1,
                 fmt::format("{}", p.count).size(), p.count,
                 p.bytes_total
                     ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
                     : 100.0,
                 p.tensor->name, ggml_name(p.tensor->src_type), ggml_name(p.tensor->dst_type));
      std::fflush(stderr);
    };
  }
  auto r = quantize_gguf(o.input, o.output, *ftype, qo);
  if (qo.on_tensor) fmt::print(stderr, "\r\x1b[2K");
  if (!r) return fail(r.status());
  std::map<std::string, size_t> counts;
  size_t fallbacks = 0;
  for (const TensorPlan& p : r->plan.tensors) {
    ++counts[ggml_name(p.dst_type)];
    fallbacks += p.fell_back;
  }
  std::string mix;
  for (const auto& [name, n] : counts) mix += fmt::format("{}{} {}", mix.empty() ? "" : ", ", n, name);
  fmt::print(
      stderr,
      "loom: {} -> {} ({}): {} tensors ({}), {} -> {} of tensor data, file {}, {:.1f} s on {} threads\n",
      o.input, o.output, llm::file_type_name(*ftype), r->plan.tensors.size(), mix, format_bytes(r->bytes_in),
      format_bytes(r->bytes_out), format_bytes(r->file_bytes), r->seconds, r->n_threads);
  if (fallbacks)
    fmt::print(
        stderr,
        "loom: {} tensor(s) have a row length the chosen block does not divide and used a fallback type "
        "(see --dry-run)\n",
        fallbacks);
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<QuantizeCliOptions>();
  auto* cmd = app.add_subcommand("quantize", "Quantize a GGUF model's f32/f16/bf16 weights");
  cmd->add_option("input", opts->input, "Input GGUF file")->required();
  cmd->add_option("output", opts->output, "Output GGUF file (written atomically)")->required();
  cmd->add_option("type", opts->type,
                  "q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K, or llama.cpp's mixtures q2_K, q3_K_S, q3_K_M, "
                  "q3_K_L, q4_K_S, q4_K_M, q5_K_S, q5_K_M, iq4_nl, iq4_xs, MXFP4_MOE (MoE experts mxfp4, the "
                  "rest q8_0)")
      ->required();
  cmd->add_option("-t,--threads", opts->n_threads, "Threads (0: all hardware threads)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--pure", opts->pure,
                "No mixture: every quantized tensor, output included, in the type's base type (row lengths the "
                "block does not divide still fall back)");
  cmd->add_flag("--dry-run", opts->dry_run, "Print each tensor's input and output type; write nothing");
  out.push_back({cmd, [opts] { return run_quantize(*opts); }});
}

}  // namespace loom::app
