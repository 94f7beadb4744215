// Runs a case on a backend: build, allocate, fill inputs, poison outputs, compute, read back; and
// the comparison of the result with the reference or with a second backend.
#include "runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/planner.h"

namespace loom::optest {

namespace {

// FNV-1a of the case's name: the seed depends only on the case (and --seed), so `--op` and the
// order of the case list do not change the data a case sees.
uint64_t case_seed(const OpCase& c, uint64_t run_seed) {
  uint64_t h = 1469598103934665603ull ^ (run_seed * 0x9E3779B97F4A7C15ull);
  for (char ch : c.op + "/" + c.desc) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return h;
}

/// Host bytes of every input of a case, in spec order.
using InputBytes = std::vector<std::vector<uint8_t>>;

/// One build of a case's graph, allocated on a backend.
struct Execution {
  std::unique_ptr<Graph> graph = std::make_unique<Graph>();
  std::unique_ptr<CaseInputs> inputs = std::make_unique<CaseInputs>(*graph);
  Tensor* out = nullptr;
  std::vector<const Tensor*> results;  ///< out, then the case's other marked outputs
  GraphAllocation alloc;
};

Status build(const OpCase& c, Execution& e) {
  e.out = c.build(*e.graph, *e.inputs);
  if (!e.graph->status().ok()) return e.graph->status();
  if (!e.out) return make_error(StatusCode::internal, "the case returned no output tensor");
  e.results.push_back(e.out);
  for (const Tensor* t : e.graph->outputs())
    if (std::find(e.results.begin(), e.results.end(), t) == e.results.end()) e.results.push_back(t);
  e.graph->mark_output(e.out);
  return {};
}

// fn(r0, r1) over [0, n) split in contiguous ranges, one a thread, on up to the machine's threads: for
// work whose rows are independent (the same bytes whatever the split). The perf mode's large weights (58 M
// q5_K weights took ~7 s to quantize on one core) made each big case's setup, not its timing, most of a
// GPU call.
template <class F>
void for_row_ranges(int64_t n, F fn) {
  const int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t threads = std::min<int64_t>(cores, n / 256);  // small tensors: not worth a thread
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&fn, t, n, threads] { fn(t * n / threads, (t + 1) * n / threads); });
  for (std::thread& th : pool) th.join();
}

InputBytes generate_inputs(const CaseInputs& in, uint64_t seed) {
  Rng rng(seed);
  InputBytes bytes;
  for (const InputSpec& s : in.specs()) {
    const Tensor* t = s.tensor;
    std::vector<uint8_t>& b = bytes.emplace_back(t->nbytes());
    if (s.poison) {
      std::fill(b.begin(), b.end(), 0xFF);
      continue;
    }
    if (s.words) {
      std::vector<int32_t> words(static_cast<size_t>(t->nelements()));
      s.words(rng, t->ne, words);
      std::memcpy(b.data(), words.data(), b.size());
      continue;
    }
    std::vector<float> values(static_cast<size_t>(t->nelements()));
    s.generate(rng, t->ne, values);
    const int64_t n0 = t->ne[0];
    const size_t row = t->row_size();  // leafs are packed
    for_row_ranges(t->nrows(), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) quantize_row(t->type, values.data() + r * n0, b.data() + r * row, n0);
    });
  }
  return bytes;
}

// What the op sees: the stored inputs, dequantized (i32: the stored integers, which a double holds
// exactly where a float would round those above 2^24).
std::vector<RefTensor> reference_inputs(const CaseInputs& in, const InputBytes& bytes) {
  std::vector<RefTensor> refs;
  for (size_t i = 0; i < in.specs().size(); ++i) {
    const Tensor* t = in.specs()[i].tensor;
    RefTensor& r = refs.emplace_back(t->ne);
    if (t->type == DType::i32) {
      std::vector<int32_t> words(static_cast<size_t>(t->nelements()));
      std::memcpy(words.data(), bytes[i].data(), bytes[i].size());
      std::copy(words.begin(), words.end(), r.v.begin());
      continue;
    }
    const int64_t n0 = t->ne[0];
    const std::vector<uint8_t>& src = bytes[i];
    for_row_ranges(t->nrows(), [&](int64_t k0, int64_t k1) {
      std::vector<float> row(static_cast<size_t>(n0));  // one buffer a range
      for (int64_t k = k0; k < k1; ++k) {
        dequantize_row(t->type, src.data() + k * t->row_size(), row.data(), n0);
        for (int64_t j = 0; j < n0; ++j) r.v[k * n0 + j] = row[j];
      }
    });
  }
  return refs;
}

// The first node the backend has no kernel for, or null.
const Tensor* unsupported_node(const Backend& backend, const Graph& g) {
  for (const Tensor* t : g.nodes())
    if (!backend.supports_op(*t)) return t;
  return nullptr;
}

Status allocate_and_fill(Backend& backend, Execution& e, const InputBytes& bytes) {
  auto alloc = allocate_graph(*e.graph, backend.buffer_type());
  if (!alloc) return alloc.status();
  e.alloc = std::move(alloc.value());
  const auto& specs = e.inputs->specs();
  for (size_t i = 0; i < specs.size(); ++i)
    LOOM_TRY(tensor_write(specs[i].tensor, bytes[i].data(), 0, bytes[i].size()));
  return {};
}

// Poisons every activation (NaN in every float type, -1 in i32) so that an element a kernel forgets
// to write cannot pass by holding a stale right answer; destinations that live in leafs (cpy) are
// poisoned as inputs.
Status poison_and_compute(Backend& backend, Execution& e) {
  if (e.alloc.arena) LOOM_TRY(e.alloc.arena->fill(0, 0xFF, e.alloc.arena->size()));
  LOOM_TRY(backend.compute(*e.graph));
  return backend.synchronize();
}

struct Comparison {
  bool ok = true;
  double nmse = 0.0;
  std::string detail;  ///< why it failed, or the worst element
};

// NMSE over the positions where the reference is finite; a non-finite output passes only where
// the reference holds the same non-finite value.
Comparison compare_values(const std::vector<float>& out, const std::vector<double>& ref, double max_nmse) {
  Comparison c;
  if (out.size() != ref.size()) {
    c.ok = false;
    c.detail = fmt::format("output has {} elements, reference {}", out.size(), ref.size());
    return c;
  }
  double err = 0.0, norm = 0.0, worst = -1.0;
  size_t worst_i = 0, bad = 0, first_bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double a = out[i], b = ref[i];
    if (!std::isfinite(b) || !std::isfinite(a)) {
      const bool same = (std::isnan(a) && std::isnan(b)) || a == b;
      if (!same && bad++ == 0) first_bad = i;
      continue;
    }
    err += (a - b) * (a - b);
    norm += b * b;
    if (std::fabs(a - b) > worst) worst = std::fabs(a - b), worst_i = i;
  }
  c.nmse = norm > 0.0 ? err / norm : (err > 0.0 ? INFINITY : 0.0);
  if (bad) {
    c.ok = false;
    c.detail = fmt::format("{} non-finite mismatches, first at [{}]: got {} expected {}", bad, first_bad,
                           out[first_bad], ref[first_bad]);
  } else if (!(c.nmse <= max_nmse)) {
    c.ok = false;
  }
  if (c.detail.empty() && worst >= 0.0)
    c.detail = fmt::format("max |err| {:.3g} at [{}]: got {} expected {}", worst, worst_i, out[worst_i],
                           ref[worst_i]);
  return c;
}

// Integer results (argmax, top_k): every element must be equal.
Comparison compare_exact(const std::vector<float>& out, const std::vector<double>& ref) {
  Comparison c;
  if (out.size() != ref.size()) {
    c.ok = false;
    c.detail = fmt::format("output has {} elements, reference {}", out.size(), ref.size());
    return c;
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (static_cast<double>(out[i]) != ref[i] && bad++ == 0) first = i;
  c.ok = bad == 0;
  c.nmse = static_cast<double>(bad);
  if (bad)
    c.detail = fmt::format("{} of {} differ, first at [{}]: got {} expected {}", bad, out.size(), first,
                           out[first], ref[first]);
  return c;
}

// The case's name goes out before it runs, so a kernel that crashes the process is named by the
// last line of the log.
void begin_line(const OpCase& c) {
  fmt::print("  {:<11} {:<70} ", c.op, c.desc);
  std::fflush(stdout);
}

void end_line(const char* verdict, const std::string& metric, const std::string& detail, bool show_detail) {
  fmt::print("{:<26} {}\n", metric, verdict);
  if (show_detail && !detail.empty()) fmt::print("      {}\n", detail);
  std::fflush(stdout);
}

Outcome fail(const std::string& what) {
  end_line("FAIL", "-", what, true);
  return Outcome::failed;
}

/// One checked result of a case: its type and how many of the values it contributes.
struct ResultPart {
  DType type = DType::f32;
  size_t count = 0;
  std::string name;
};

// Builds, allocates, fills, computes and reads one backend's result.
struct BackendResult {
  Outcome outcome = Outcome::passed;
  std::string message;
  std::vector<float> values;      ///< every result's values, one after another
  std::vector<ResultPart> parts;  ///< where each result's values are
  int n_in_place = 0;             ///< nodes the planner ran over their operand's memory
  std::string fusion_note;        ///< what the executor fused (verbose)
};

// With a graph executor that ran (computes > 0) and fusion on, the case's expected fusion must
// show in the counters; a backend without an executor reports zeros and is not checked.
// CUDA in fast numerics sends products of f16 / bf16 weights at 2-8 columns (LOOM_CUDA_FLOAT_GEMM_MIN_COLS
// to 8; 0 or more than 8: none) to cuBLAS instead of the mat-vec kernels: whether g's first product is one.
bool cuda_float_gemm_few_cols(const Graph& g) {
  static const long min_cols = [] {
    const char* v = std::getenv("LOOM_CUDA_FLOAT_GEMM_MIN_COLS");
    return v ? std::atol(v) : 2L;
  }();
  for (const Tensor* n : g.nodes()) {
    if (n->op != OpKind::mul_mat) continue;
    const DType t = n->src[0]->type;
    return (t == DType::f16 || t == DType::bf16) && min_cols > 0 && n->ne[1] >= min_cols && n->ne[1] <= 8;
  }
  return false;
}

Status check_expected_fusion(const OpCase& c, const Backend& backend, const Graph& g, std::string& note) {
  if (c.expected_fusion == FusedKind::none) return {};
  const ExecCounters counters = exec_counters(backend);
  if (counters.computes == 0) return {};
  const ExecOptions options = exec_options(backend);
  const auto k = static_cast<size_t>(c.expected_fusion);
  note = fmt::format("{} {} fusion(s), {} dispatches for {} nodes", counters.fusions[k],
                     fused_kind_name(c.expected_fusion), counters.dispatches, counters.graph_nodes);
  if (options.serialize || !options.fusion) {
    note += " (fusion off: not checked)";
    return {};
  }
  if (c.fusion_fast_only && backend.numerics() != Numerics::fast) {
    if (counters.fusions[k] != 0)
      return make_error(StatusCode::internal, "fast-only fusion {} happened in the {} numerics mode",
                        fused_kind_name(c.expected_fusion), numerics_name(backend.numerics()));
    note += " (exact numerics: must not fuse)";
    return {};
  }
  // Batch-invariant fast numerics (LOOM_DETERMINISTIC): the CUDA backend's fused mat-vec kernels sum
  // a column unlike gemm_q, which then takes every product, so they must stand aside there.
  const bool mat_vec_kind = c.expected_fusion == FusedKind::mat_vec_bias ||
                            c.expected_fusion == FusedKind::glu_mat_vec || c.expected_fusion == FusedKind::mat_vec_multi;
  if (mat_vec_kind && backend.numerics() == Numerics::fast && deterministic_from_env() &&
      std::string_view(backend.name()) == "cuda") {
    if (counters.fusions[k] != 0)
      return make_error(StatusCode::internal, "fusion {} happened in batch-invariant numerics (LOOM_DETERMINISTIC)",
                        fused_kind_name(c.expected_fusion));
    note += " (batch-invariant numerics: must not fuse)";
    return {};
  }
  if (mat_vec_kind && backend.numerics() == Numerics::fast && std::string_view(backend.name()) == "cuda" &&
      cuda_float_gemm_few_cols(g)) {
    if (counters.fusions[k] != 0)
      return make_error(StatusCode::internal, "fusion {} happened where float weights at 2-8 columns take cuBLAS",
                        fused_kind_name(c.expected_fusion));
    note += " (float weights at 2-8 columns on cuBLAS: must not fuse)";
    return {};
  }
  if (counters.fusions[k] == 0 && c.fusion_device_dependent) {
    note += " (not on this device)";
    return {};
  }
  if (counters.fusions[k] == 0)
    return make_error(StatusCode::internal, "expected fusion {} did not happen ({} dispatches for {} nodes)",
                      fused_kind_name(c.expected_fusion), counters.dispatches, counters.graph_nodes);
  // (the counters sum over the case's computes)
  if (c.fast_max_dispatches > 0 && backend.numerics() == Numerics::fast &&
      counters.dispatches > static_cast<uint64_t>(c.fast_max_dispatches) * counters.computes)
    return make_error(StatusCode::internal,
                      "{} dispatches in {} computes where the fast mode's {} takes at most {} a compute",
                      counters.dispatches, counters.computes, fused_kind_name(c.expected_fusion),
                      c.fast_max_dispatches);
  return {};
}

// A kernel must not write into its operands. The leaf that the output is a view of (the
// destination of cpy or set_rows) changes only inside the bytes the output view spans.
Status check_inputs_intact(const Execution& e, const InputBytes& bytes) {
  const auto& specs = e.inputs->specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor* t = specs[i].tensor;
    std::vector<uint8_t> now(bytes[i].size());
    LOOM_TRY(tensor_read(t, now.data(), 0, now.size()));
    size_t begin = now.size(), end = now.size();  // the span allowed to change: none
    for (const Tensor* r : e.results) {
      if (t != r->root()) continue;
      begin =
          static_cast<size_t>(static_cast<const uint8_t*>(r->data) - static_cast<const uint8_t*>(t->data));
      end = begin + r->nbytes();
    }
    for (size_t k = 0; k < now.size(); ++k) {
      if (k == begin) k = end;
      if (k < now.size() && now[k] != bytes[i][k])
        return make_error(StatusCode::internal, "input {} was modified by compute at byte {}{}", describe(*t),
                          k, begin < now.size() ? " (outside the output's view)" : "");
    }
  }
  return {};
}

// `under_test`: the backend whose executor must show the case's expected fusion (not the one
// that provides the expected values).
BackendResult run_on(const OpCase& c, Backend& backend, const InputBytes& bytes, bool under_test) {
  BackendResult r;
  Execution e;
  Status s = build(c, e);
  if (s.ok()) {
    if (const Tensor* t = unsupported_node(backend, *e.graph)) {
      r.outcome = Outcome::unsupported;
      r.message = fmt::format("{}: {} of {}", backend.name(), op_name(t->op), describe(*t));
      return r;
    }
    s = allocate_and_fill(backend, e, bytes);
  }
  if (s.ok()) {
    reset_exec_counters(backend);
    s = poison_and_compute(backend, e);
  }
  if (s.ok() && under_test) s = check_expected_fusion(c, backend, *e.graph, r.fusion_note);
  if (s.ok()) s = check_inputs_intact(e, bytes);
  if (s.ok()) r.n_in_place = e.alloc.plan.n_in_place;
  for (const Tensor* t : e.results) {
    if (!s.ok()) break;
    auto values = tensor_to_floats(t);
    if (!values) {
      s = values.status();
      break;
    }
    const std::string name = fmt::format("result {} ({}{}{})", r.parts.size() + 1, op_name(t->op),
                                         t->name.empty() ? "" : " ", t->name);
    r.parts.push_back({t->type, values.value().size(), name});
    r.values.insert(r.values.end(), values.value().begin(), values.value().end());
  }
  if (!s.ok()) {
    r.outcome = Outcome::failed;
    r.message = fmt::format("{}: {}", backend.name(), s.to_string());
  }
  return r;
}

// Compares every result of a case with its slice of the expected values; fills the line's metric.
Comparison compare_results(const BackendResult& a, const std::vector<double>& expected, double max_nmse,
                           std::string& metric) {
  size_t total = 0;
  for (const ResultPart& p : a.parts) total += p.count;
  if (total != expected.size() || total != a.values.size()) {
    Comparison c;
    c.ok = false;
    c.detail = fmt::format("the results have {} values, the expected {}", a.values.size(), expected.size());
    metric.assign(1, '-');  // not = "-": GCC 12 misreports -Wrestrict on that (its bug 105329)
    return c;
  }
  Comparison all;
  std::vector<std::string> failed, details;
  double worst_nmse = -1.0;
  int64_t mismatches = -1;
  size_t at = 0;
  for (const ResultPart& p : a.parts) {
    const std::vector<float> out(a.values.begin() + at, a.values.begin() + at + p.count);
    const std::vector<double> ref(expected.begin() + at, expected.begin() + at + p.count);
    at += p.count;
    const bool integer = p.type == DType::i32;
    const Comparison c = integer ? compare_exact(out, ref) : compare_values(out, ref, max_nmse);
    if (integer)
      mismatches = std::max<int64_t>(mismatches, 0) + static_cast<int64_t>(c.nmse);
    else
      worst_nmse = std::max(worst_nmse, c.nmse);
    all.ok = all.ok && c.ok;
    std::string detail = a.parts.size() > 1 ? fmt::format("{}: {}", p.name, c.detail) : c.detail;
    if (!c.ok) failed.push_back(detail);
    details.push_back(std::move(detail));
  }
  all.detail = fmt::format("{}", fmt::join(failed.empty() ? details : failed, "; "));
  std::vector<std::string> metrics;
  if (worst_nmse >= 0.0) metrics.push_back(fmt::format("nmse={:.2e} <= {:.0e}", worst_nmse, max_nmse));
  if (mismatches >= 0) metrics.push_back(fmt::format("mismatches={}", mismatches));
  metric = fmt::format("{}", fmt::join(metrics, " "));
  all.nmse = worst_nmse;
  return all;
}

}  // namespace

double case_threshold(const OpCase& c, const RunSettings& run) {
  static const char* const kTensorCoreOps[] = {"mul_mat",          "mul_mat_id",    "flash_attn",
                                               "mat_vec_bias",     "mat_vec_multi", "glu_mat_vec",
                                               "gather_flash_attn"};
  if (!run.fast) return c.max_nmse;
  for (const char* op : kTensorCoreOps)
    if (c.op == op) return std::max(c.max_nmse, kNmseFast);
  return c.max_nmse;
}

Outcome check_case(const OpCase& c, Backend& backend, Backend* other, const RunSettings& run) {
  const bool verbose = run.verbose;
  begin_line(c);
  Execution probe;
  if (Status s = build(c, probe); !s.ok()) return fail("graph: " + s.to_string());
  const InputBytes bytes = generate_inputs(*probe.inputs, case_seed(c, run.seed));

  BackendResult a = run_on(c, backend, bytes, true);
  if (a.outcome == Outcome::unsupported) {
    end_line("not supported", "-", a.message, verbose);
    return Outcome::unsupported;
  }
  if (a.outcome == Outcome::failed) return fail(a.message);

  std::vector<double> expected;
  if (other) {
    BackendResult b = run_on(c, *other, bytes, false);
    if (b.outcome == Outcome::unsupported) {
      end_line("not supported", "-", b.message, verbose);
      return Outcome::unsupported;
    }
    if (b.outcome == Outcome::failed) return fail(b.message);
    expected.assign(b.values.begin(), b.values.end());
  } else {
    expected = c.reference(reference_inputs(*probe.inputs, bytes)).v;
  }

  std::string metric;
  const Comparison cmp = compare_results(a, expected, case_threshold(c, run), metric);
  std::string detail = cmp.detail;
  if (verbose && a.n_in_place) detail += fmt::format("; {} node(s) ran in place", a.n_in_place);
  if (verbose && !a.fusion_note.empty()) detail += "; " + a.fusion_note;
  end_line(cmp.ok ? "OK" : "FAIL", metric, detail, !cmp.ok || verbose);
  return cmp.ok ? Outcome::passed : Outcome::failed;
}

Outcome time_case(const OpCase& c, Backend& backend, const RunSettings& run) {
  const bool verbose = run.verbose;
  begin_line(c);
  Execution e;
  if (Status s = build(c, e); !s.ok()) return fail("graph: " + s.to_string());
  if (const Tensor* t = unsupported_node(backend, *e.graph)) {
    end_line("not supported", "-", fmt::format("{} of {}", op_name(t->op), describe(*t)), verbose);
    return Outcome::unsupported;
  }
  const InputBytes bytes = generate_inputs(*e.inputs, case_seed(c, run.seed));
  if (Status s = allocate_and_fill(backend, e, bytes); !s.ok()) return fail(s.to_string());
  if (Status s = poison_and_compute(backend, e); !s.ok()) return fail(s.to_string());  // warm-up

  // Enough runs for about half a second (the warm-up above is not counted).
  using clock = std::chrono::steady_clock;
  int runs = 0;
  const auto start = clock::now();
  double elapsed = 0.0;
  while (runs < 1 || (elapsed < 0.5 && runs < 100000)) {
    if (Status s = backend.compute(*e.graph); !s.ok()) return fail(s.to_string());
    if (Status s = backend.synchronize(); !s.ok()) return fail(s.to_string());
    ++runs;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  }
  const double us = elapsed / runs * 1e6;

  // Bytes the case must move at least: each input read once and the output written once (a
  // destination leaf of cpy/set_rows counts as the output, not as an input).
  double moved = static_cast<double>(e.out->nbytes());
  for (const InputSpec& s : e.inputs->specs())
    if (s.tensor != e.out->root()) moved += static_cast<double>(s.tensor->nbytes());
  // Beside each rate, its share of the H200's measured ceilings (issues 13 and 14): 4,350 GB/s of
  // read bandwidth (the bytes here include the output's writes), 785 TFLOP/s of dense bf16/f16 GEMM
  // (cuBLAS). On other devices read the shares as fractions of those figures, not of the device's own.
  constexpr double kReadGBs = 4350.0, kGemmTFLOPs = 785.0;
  const double gbs = moved / us * 1e-3;
  std::string metric =
      fmt::format("{:>10.1f} us/run {:>8.1f} GB/s ({:>5.1f}% of {:g})", us, gbs, 100.0 * gbs / kReadGBs, kReadGBs);
  if (c.flops > 0) {
    const double tflops = c.flops / us * 1e-6;
    metric += fmt::format(" {:>8.3f} TFLOP/s ({:>5.1f}% of {:g})", tflops, 100.0 * tflops / kGemmTFLOPs, kGemmTFLOPs);
  }
  fmt::print("{}  ({} runs)\n", metric, runs);
  std::fflush(stdout);
  return Outcome::passed;
}

bool list_cases(const CaseList& cases) {
  struct Group {
    int count = 0;
    std::set<std::string> dtypes;
  };
  std::map<std::string, Group> groups;
  std::vector<std::string> order;
  std::set<OpKind> computed;
  bool ok = true;
  for (const OpCase& c : cases) {
    Execution e;
    if (Status s = build(c, e); !s.ok()) {
      fmt::print("  {} {}: graph error: {}\n", c.op, c.desc, s.to_string());
      ok = false;
      continue;
    }
    if (!groups.count(c.op)) order.push_back(c.op);
    Group& grp = groups[c.op];
    ++grp.count;
    for (const Tensor* t : e.graph->leafs()) grp.dtypes.insert(dtype_name(t->type));
    for (const Tensor* t : e.graph->nodes()) computed.insert(t->op);
  }
  for (const std::string& op : order) {
    std::string types;
    for (const std::string& t : groups[op].dtypes) types += (types.empty() ? "" : " ") + t;
    fmt::print("  {:<11} {:>4} cases   dtypes: {}\n", op, groups[op].count, types);
  }
  std::string missing;
  for (int k = 0; k < kOpCount; ++k) {
    const auto op = static_cast<OpKind>(k);
    if (op != OpKind::none && !computed.count(op))
      missing += std::string(missing.empty() ? "" : ", ") + op_name(op);
  }
  if (!missing.empty()) {
    fmt::print("ops of graph.h without a case: {}\n", missing);
    ok = false;
  }
  fmt::print("{} cases\n", cases.size());
  return ok;
}

}  // namespace loom::optest
