// ExecOptions from the environment, and the text forms of options and counters.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "loom/exec.h"

namespace loom {

const char* fused_kind_name(FusedKind k) {
  switch (k) {
    case FusedKind::none: return "none";
    case FusedKind::rms_norm_mul: return "rms_norm_mul";
    case FusedKind::add_rms_norm_mul: return "add_rms_norm_mul";
    case FusedKind::all_reduce_add_rms_norm_mul: return "all_reduce_add_rms_norm_mul";
    case FusedKind::mat_vec_bias: return "mat_vec_bias";
    case FusedKind::glu_mat_vec: return "glu_mat_vec";
    case FusedKind::rope_set_rows: return "rope_set_rows";
    case FusedKind::scale_mask_soft_max: return "scale_mask_soft_max";
    case FusedKind::moe_route: return "moe_route";
    case FusedKind::mat_vec_multi: return "mat_vec_multi";
    case FusedKind::gather_flash_attn: return "gather_flash_attn";
    case FusedKind::rope_flash_attn: return "rope_flash_attn";
    case FusedKind::count_: break;
  }
  return "?";
}

namespace {
// "0"/"off"/"false" -> false, anything else set -> true; unset leaves `value` alone.
void env_flag(const char* name, bool& value) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  value = !(std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 || std::strcmp(v, "false") == 0);
}
void env_int(const char* name, int& value, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end && *end == '\0' && n >= lo && n <= hi) value = static_cast<int>(n);
}
}  // namespace

ExecOptions exec_options_from_env(ExecOptions o) {
  env_flag("LOOM_EXEC_SERIALIZE", o.serialize);
  env_flag("LOOM_EXEC_GRAPH", o.graph);
  env_flag("LOOM_EXEC_CONCURRENCY", o.concurrency);
  env_flag("LOOM_EXEC_FUSION", o.fusion);
  env_flag("LOOM_EXEC_REORDER", o.reorder);
  env_flag("LOOM_EXEC_PDL", o.pdl);
  env_int("LOOM_EXEC_N_CB", o.n_cb, 1, 64);
  env_int("LOOM_EXEC_LOOKAHEAD", o.lookahead, 1, 4096);
  return o;
}

std::optional<ExecOptions> exec_options_named(std::string_view name, ExecOptions o) {
  static constexpr std::string_view kCumulative[] = {"graph", "concurrency", "fusion", "reorder", "all"};
  if (name == "serialize") {
    o.serialize = true;
    return o;
  }
  for (int level = 1; level <= 5; ++level) {
    if (name != kCumulative[level - 1]) continue;
    o.serialize = false;
    o.graph = level >= 1;
    o.concurrency = level >= 2;
    o.fusion = level >= 3;
    o.reorder = level >= 4;
    o.pdl = level >= 5;
    return o;
  }
  return std::nullopt;
}

std::string exec_options_string(const ExecOptions& o) {
  if (o.serialize) return "serialize";
  std::string s;
  auto add = [&s](bool on, const char* what) {
    if (!on) return;
    if (!s.empty()) s += '+';
    s += what;
  };
  add(o.graph, "graph");
  add(o.concurrency, "concurrency");
  add(o.fusion, "fusion");
  add(o.reorder, "reorder");
  add(o.pdl, "pdl");
  return s.empty() ? "plain" : s;
}

int group_hist_bucket(uint64_t size) {
  int b = 0;
  for (uint64_t limit = 1; b < 8 && size > limit; limit *= 2) ++b;
  return b;
}

std::string exec_counters_string(const ExecCounters& c) {
  const double per = c.computes ? 1.0 / static_cast<double>(c.computes) : 0.0;
  std::string s = fmt::format(
      "computes {}  graph nodes {:.1f}/compute  dispatches {:.1f}  kernels {:.1f}  edges {:.1f} (pdl {:.1f})\n"
      "concurrent groups {:.1f}/compute, sizes:",
      c.computes, c.graph_nodes * per, c.dispatches * per, c.kernels * per, c.edges * per, c.pdl_edges * per,
      c.groups * per);
  static const char* kBuckets[] = {"1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", ">128"};
  for (size_t i = 0; i < c.group_hist.size(); ++i)
    if (c.group_hist[i]) s += fmt::format(" {}:{}", kBuckets[i], c.group_hist[i]);
  s += "\nfusions:";
  bool any = false;
  for (int k = 1; k < kFusedKindCount; ++k)
    if (c.fusions[k]) {
      s += fmt::format(" {} {}", fused_kind_name(static_cast<FusedKind>(k)), c.fusions[k]);
      any = true;
    }
  if (!any) s += " none";
  if (c.act_handoffs) s += fmt::format("\nactivation hand-offs {:.1f}/compute", static_cast<double>(c.act_handoffs) * per);
  s += fmt::format(
      "\nreordered {}  graph builds {}  chunk graphs {}  updates {}  replays {}  hash collisions {}  host "
      "syncs {}  "
      "host {:.1f} us/compute (hashing {:.1f}, planning {:.1f}, recording {:.1f}, instantiating {:.1f})\n",
      c.reordered, c.graph_builds, c.chunk_graphs, c.graph_updates, c.graph_replays, c.hash_collisions,
      c.host_syncs, static_cast<double>(c.host_ns) * per / 1e3,
      static_cast<double>(c.host_hash_ns) * per / 1e3, static_cast<double>(c.host_plan_ns) * per / 1e3,
      static_cast<double>(c.host_record_ns) * per / 1e3, static_cast<double>(c.host_instantiate_ns) * per / 1e3);
  if (c.device_timed)
    s += fmt::format("device {:.1f} us/replay over {} timed replays (LOOM_EXEC_GPU_TIME)\n",
                     static_cast<double>(c.device_ns) / static_cast<double>(c.device_timed) / 1e3, c.device_timed);
  return s;
}

}  // namespace loom
