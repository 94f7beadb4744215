// `loom bench --npl`: llama-batched-bench's measurement (bench.h) over Context::decode_batch.
#include <algorithm>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "bench.h"
#include "loom/exec.h"

namespace loom::app {

Status run_batched_bench_test(llm::Context& ctx, const BatchedBenchTest& test, bool warmup, uint32_t seed,
                              BatchedBenchResult& out, Backend* backend, const std::string& trace_path) {
  if (test.n_pp < 1 || test.n_tg < 0 || test.n_pl < 1)
    return make_error(StatusCode::invalid_argument,
                      "bench: a batched test needs a prompt and a sequence (got npp {}, ntg {}, npl {})",
                      test.n_pp, test.n_tg, test.n_pl);
  if (test.n_kv() > ctx.n_ctx())
    return make_error(StatusCode::invalid_argument,
                      "bench: npp {} ntg {} npl {} needs {} KV cells; the context has {}", test.n_pp,
                      test.n_tg, test.n_pl, test.n_kv(), ctx.n_ctx());
  // Random ids: what the tokens say does not change the work of a dense model's forward pass.
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, ctx.n_vocab() - 1);
  const size_t n_pl = static_cast<size_t>(test.n_pl);
  std::vector<std::vector<int32_t>> prompts(n_pl, std::vector<int32_t>(static_cast<size_t>(test.n_pp)));
  for (auto& p : prompts)
    for (auto& t : p) t = pick(rng);
  std::vector<int32_t> gen(n_pl * static_cast<size_t>(std::max(test.n_tg, 1)));
  for (auto& t : gen) t = pick(rng);
  const size_t per_pass = static_cast<size_t>(std::max(1, ctx.n_batch()));

  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  auto once = [&](BatchedBenchResult& r, bool trace) -> Status {
    ctx.kv_cache_clear();
    const auto t0 = clock::now();
    // The prompts packed as llama-batched-bench packs them: as many whole prompts a pass as the
    // batch holds (one weight read for all), each alone when one fills it.
    const size_t per_pack = std::max<size_t>(1, per_pass / static_cast<size_t>(test.n_pp));
    std::vector<llm::SeqTokens> pack;
    for (size_t s0 = 0; s0 < n_pl; s0 += per_pack) {
      const size_t s1 = std::min(n_pl, s0 + per_pack);
      if (s1 - s0 == 1) {
        llm::DecodeOptions o;
        o.seq_id = static_cast<int>(s0);
        auto x = ctx.decode(prompts[s0], 0, o);
        if (!x) return x.status();
        continue;
      }
      pack.clear();
      for (size_t s = s0; s < s1; ++s) pack.push_back(llm::SeqTokens{static_cast<int>(s), 0, prompts[s]});
      auto x = ctx.decode_batch(pack);
      if (!x) return x.status();
    }
    const auto t1 = clock::now();
    std::vector<llm::SeqTokens> batch;
    for (int i = 0; i < test.n_tg; ++i) {
      for (size_t s0 = 0; s0 < n_pl; s0 += per_pass) {
        batch.clear();
        for (size_t s = s0; s < std::min(n_pl, s0 + per_pass); ++s)
          batch.push_back(llm::SeqTokens{static_cast<int>(s), test.n_pp + i,
                                         std::span<const int32_t>(&gen[s * test.n_tg + i], 1)});
        if (trace && i == 2 && s0 == 0) LOOM_TRY(capture_next_compute(*backend, trace_path));
        auto x = ctx.decode_batch(batch);
        if (!x) return x.status();
        const llm::DecodeStats& st = ctx.stats();
        r.tp_busy_s.resize(st.tp_rank_busy_ns.size());
        r.tp_lag_s.resize(st.tp_rank_start_lag_ns.size());
        for (size_t k = 0; k < st.tp_rank_busy_ns.size(); ++k) {
          r.tp_busy_s[k] += 1e-9 * static_cast<double>(st.tp_rank_busy_ns[k]);
          r.tp_lag_s[k] += 1e-9 * static_cast<double>(st.tp_rank_start_lag_ns[k]);
        }
        ++r.n_tg_passes;
      }
    }
    const auto t2 = clock::now();
    r.t_pp_s = seconds(t0, t1);
    r.t_tg_s = seconds(t1, t2);
    ctx.kv_cache_clear();
    return {};
  };
  out.test = test;
  if (warmup) {
    BatchedBenchResult ignored;
    LOOM_TRY(once(ignored, false));
  }
  return once(out, backend && !trace_path.empty() && test.n_tg > 2);
}

std::string format_batched_bench(const std::vector<BatchedBenchResult>& results, BenchFormat format) {
  std::string s;
  if (format == BenchFormat::json) {
    for (const BatchedBenchResult& r : results)
      s += fmt::format(
          "{{\"pp\": {}, \"tg\": {}, \"pl\": {}, \"n_kv\": {}, \"t_pp\": {:.6f}, \"speed_pp\": {:.6f}, "
          "\"t_tg\": "
          "{:.6f}, \"speed_tg\": {:.6f}, \"t\": {:.6f}, \"speed\": {:.6f}}}\n",
          r.test.n_pp, r.test.n_tg, r.test.n_pl, r.test.n_kv(), r.t_pp_s, r.speed_pp(), r.t_tg_s,
          r.speed_tg(), r.t_pp_s + r.t_tg_s, r.speed());
    return s;
  }
  s += "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s "
       "|\n";
  s += "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|"
       "\n";
  for (const BatchedBenchResult& r : results)
    s += fmt::format(
        "| {:5} | {:6} | {:4} | {:6} | {:8.3f} | {:8.2f} | {:8.3f} | {:8.2f} | {:8.3f} | {:8.2f} |\n",
        r.test.n_pp, r.test.n_tg, r.test.n_pl, r.test.n_kv(), r.t_pp_s, r.speed_pp(), r.t_tg_s, r.speed_tg(),
        r.t_pp_s + r.t_tg_s, r.speed());
  return s;
}

}  // namespace loom::app
