// loom-test-ops: the differential op test (standalone, no GoogleTest, so the same binary runs on
// the GPU machine).
//
//   loom-test-ops                      CPU kernels against the float64 reference
//   loom-test-ops --backend cuda,cpu   CUDA against CPU on identical inputs
//   loom-test-ops --backend cuda       CUDA against the float64 reference
//   loom-test-ops perf [--op mul_mat]  time larger cases: µs per run, GB/s and TFLOP/s with their shares
//                                      of the H200's 4,350 GB/s and 785 TFLOP/s
//   loom-test-ops --list               ops, dtypes and case counts
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/backend.h"
#include "op_test.h"
#include "runner.h"

namespace {

using namespace loom;
using namespace loom::optest;

struct Options {
  bool perf = false;
  bool list = false;
  RunSettings run;
  int n_threads = 0;
  std::vector<std::string> backends{"cpu"};
  std::vector<std::string> ops;       // empty: all
  std::vector<std::string> filters;   // the description must contain each
  std::vector<std::string> excludes;  // ... and none of these
  std::optional<Numerics> numerics;   // --numerics
};

void usage(const char* prog) {
  fmt::print(
      "usage: {} [perf] [--backend A[,B]] [--op NAME[,NAME...]] [--filter TEXT] [--exclude TEXT]\n       "
      "[--list] [--seed N] [-t N] [--numerics exact|fast] [-v]\n"
      "  perf             time larger cases instead of checking (prints us/run, GB/s and TFLOP/s, each with\n"
      "                   its share of the H200's 4,350 GB/s read and 785 TFLOP/s f16 GEMM)\n"
      "  --backend A      check backend A against the float64 reference (default: cpu)\n"
      "  --backend A,B    check backend A against backend B on identical inputs\n"
      "  --op NAME        only the cases of these ops (see --list)\n"
      "  --filter TEXT    only cases whose description contains TEXT (repeatable)\n"
      "  --exclude TEXT   skip cases whose description contains TEXT (repeatable)\n"
      "  --list           print every op with its dtypes and number of cases\n"
      "  -t N             threads of the cpu backend (default: all cores)\n"
      "  --numerics M     exact or fast: the mode the backends are created in (default: each backend's);\n"
      "                   fast holds matrix products and attention to NMSE 5e-4 of the reference\n"
      "  --seed N         vary the random inputs (default 0: the data the thresholds were checked on)\n"
      "  -v               verbose: print details of passing cases too\n",
      prog);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(',', start);
    const std::string part = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) parts.push_back(part);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

// Returns false (after printing why) on a malformed command line.
bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        fmt::print(stderr, "{} needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    if (arg == "perf") {
      o.perf = true;
    } else if (arg == "--list") {
      o.list = true;
    } else if (arg == "-v" || arg == "--verbose") {
      o.run.verbose = true;
    } else if (arg == "--backend" || arg == "-b") {
      const char* v = value("--backend");
      if (!v) return false;
      o.backends = split_commas(v);
      if (o.backends.empty() || o.backends.size() > 2) {
        fmt::print(stderr, "--backend takes one or two names (A or A,B), got '{}'\n", v);
        return false;
      }
    } else if (arg == "--op" || arg == "-o") {
      const char* v = value("--op");
      if (!v) return false;
      for (const std::string& op : split_commas(v)) o.ops.push_back(op);
    } else if (arg == "--filter" || arg == "--exclude") {
      const char* v = value(arg.c_str());
      if (!v) return false;
      (arg == "--filter" ? o.filters : o.excludes).push_back(v);
    } else if (arg == "--seed") {
      const char* v = value("--seed");
      if (!v) return false;
      char* end = nullptr;
      o.run.seed = std::strtoull(v, &end, 10);
      if (!end || *end) {
        fmt::print(stderr, "--seed needs a number, got '{}'\n", v);
        return false;
      }
    } else if (arg == "-t" || arg == "--threads") {
      const char* v = value("-t");
      if (!v) return false;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (!end || *end || n < 1 || n > 1024) {
        fmt::print(stderr, "-t needs a thread count in [1, 1024], got '{}'\n", v);
        return false;
      }
      o.n_threads = static_cast<int>(n);
    } else if (arg == "--numerics") {
      const char* v = value("--numerics");
      if (!v) return false;
      auto n = parse_numerics(v, "--numerics");
      if (!n) {
        fmt::print(stderr, "{}\n", n.status().message());
        return false;
      }
      o.numerics = *n;
    } else if (arg == "-h" || arg == "--help") {
      usage(argv[0]);
      std::exit(0);
    } else {
      fmt::print(stderr, "unknown argument '{}'\n", arg);
      return false;
    }
  }
  return true;
}

}  // namespace

namespace loom::optest {

CaseList all_cases(CaseSet set) {
  CaseList cases;
  add_elementwise_cases(cases, set);
  add_row_cases(cases, set);
  add_matmul_cases(cases, set);
  add_attention_cases(cases, set);
  add_data_cases(cases, set);
  add_fused_cases(cases, set);
  return cases;
}

}  // namespace loom::optest

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) {
    usage(argv[0]);
    return 2;
  }

  CaseList cases;
  for (OpCase& c : all_cases(opt.perf ? CaseSet::perf : CaseSet::check)) {
    bool keep = opt.ops.empty() || std::find(opt.ops.begin(), opt.ops.end(), c.op) != opt.ops.end();
    for (const std::string& f : opt.filters) keep = keep && c.desc.find(f) != std::string::npos;
    for (const std::string& x : opt.excludes) keep = keep && c.desc.find(x) == std::string::npos;
    if (keep) cases.push_back(std::move(c));
  }
  if (cases.empty()) {
    fmt::print(stderr, "no cases match op '{}' and the filters (see --list)\n", fmt::join(opt.ops, ","));
    return 2;
  }
  if (opt.list) return list_cases(cases) ? 0 : 1;

  BackendOptions bo;
  bo.n_threads = opt.n_threads;
  bo.numerics = opt.numerics;
  std::vector<std::unique_ptr<Backend>> backends;
  for (const std::string& name : opt.backends) {
    auto b = create_backend(name, bo);
    if (!b) {
      fmt::print(stderr, "cannot create backend '{}': {}\n", name, b.status().to_string());
      return 2;
    }
    backends.push_back(std::move(b.value()));
  }

  Backend* other = backends.size() > 1 ? backends[1].get() : nullptr;
  opt.run.fast = backends[0]->numerics() == Numerics::fast;
  if (opt.perf) {
    fmt::print("perf: backend {} ({} numerics)\n", backends[0]->name(), numerics_name(backends[0]->numerics()));
  } else if (other) {
    fmt::print("checking backend {} ({} numerics) against backend {}\n", backends[0]->name(),
               numerics_name(backends[0]->numerics()), other->name());
  } else {
    fmt::print("checking backend {} ({} numerics) against the float64 reference\n", backends[0]->name(),
               numerics_name(backends[0]->numerics()));
  }

  Tally tally;
  for (const OpCase& c : cases)
    tally.add(opt.perf ? time_case(c, *backends[0], opt.run) : check_case(c, *backends[0], other, opt.run));

  std::string line = fmt::format("{} passed, {} failed", tally.passed, tally.failed);
  if (tally.unsupported) line += fmt::format(", {} not supported", tally.unsupported);
  fmt::print("{}\n", line);
  return tally.failed ? 1 : 0;
}
