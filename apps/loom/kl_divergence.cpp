// KL divergence against a saved base run (see kl_divergence.h for the file format and the error
// analysis of its 16-bit storage).
#include "kl_divergence.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

namespace loom::app {

static_assert(std::endian::native == std::endian::little, "the KL-divergence base file is little-endian");

namespace {

constexpr uint32_t kFlagClamped = 1;
constexpr double kMaxCode = 65535.0;

template <typename T>
void put(uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof(T));
  p += sizeof(T);
}

template <typename T>
T get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

struct RowHeader {
  double nll;
  float lo;
  float step;
  int32_t top;
  uint32_t flags;
};

RowHeader read_row_header(const uint8_t* row) {
  RowHeader h{};
  h.nll = get<double>(row);
  h.lo = get<float>(row);
  h.step = get<float>(row);
  h.top = get<int32_t>(row);
  h.flags = get<uint32_t>(row);
  return h;
}

uint16_t code_at(const uint8_t* codes, size_t i) {
  uint16_t c;
  std::memcpy(&c, codes + 2 * i, 2);
  return c;
}

// Max (in double) and the first index holding it; NaNs are never the max.
std::pair<double, size_t> row_max(std::span<const float> logits) {
  double max = -INFINITY;
  size_t top = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (static_cast<double>(logits[i]) > max) {
      max = logits[i];
      top = i;
    }
  }
  return {max, top};
}

// sum_i exp(l_i - max) in index order: the same arithmetic as token_nll, so the NLLs here equal
// compute_perplexity's bit for bit.
double row_sum_exp(std::span<const float> logits, double max) {
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  return sum;
}

// Linear interpolation between the closest ranks of sorted `v`.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

// Standard error of a mean from the sums of x and x^2 over n values (llama.cpp's estimate).
double mean_stderr(double sum, double sum_sq, double n) {
  if (n < 2.0) return 0.0;
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  return var > 0.0 ? std::sqrt(var / (n - 1.0)) : 0.0;
}

struct KldSums {
  double nll = 0, nll2 = 0, nll_base = 0, nll_base2 = 0, d = 0, d2 = 0;
  double kld = 0, kld2 = 0, dp = 0, dp2 = 0, dp4 = 0, dp_max = 0;
  int64_t same = 0, n = 0;
  std::vector<double> kld_values;

  void add(const KldRowStats& s) {
    nll += s.nll;
    nll2 += s.nll * s.nll;
    nll_base += s.nll_base;
    nll_base2 += s.nll_base * s.nll_base;
    const double diff = s.nll - s.nll_base;
    d += diff;
    d2 += diff * diff;
    kld += s.kld;
    kld2 += s.kld * s.kld;
    const double p_diff = std::exp(-s.nll) - std::exp(-s.nll_base);
    dp += p_diff;
    dp2 += p_diff * p_diff;
    dp4 += p_diff * p_diff * p_diff * p_diff;
    dp_max = std::max(dp_max, std::fabs(p_diff));
    same += s.same_top ? 1 : 0;
    ++n;
    kld_values.push_back(s.kld);
  }

  KlDivergenceResult result(bool with_quantiles) const {
    KlDivergenceResult r;
    r.n_scored = n;
    if (n == 0) return r;
    const double c = static_cast<double>(n);
    r.run.n_scored = n;
    r.run.nll_mean = nll / c;
    r.run.nll_stderr = mean_stderr(nll, nll2, c);
    r.run.ppl = std::exp(r.run.nll_mean);
    r.run.ppl_err = r.run.ppl * r.run.nll_stderr;
    r.base_nll_mean = nll_base / c;
    r.base_ppl = std::exp(r.base_nll_mean);
    r.base_ppl_err = r.base_ppl * mean_stderr(nll_base, nll_base2, c);
    r.ln_ppl_ratio = d / c;
    r.ln_ppl_ratio_err = mean_stderr(d, d2, c);
    r.ppl_ratio = std::exp(r.ln_ppl_ratio);
    r.ppl_ratio_err = r.ppl_ratio * r.ln_ppl_ratio_err;
    r.kld_mean = kld / c;
    r.kld_stderr = mean_stderr(kld, kld2, c);
    r.same_top = static_cast<double>(same) / c;
    r.same_top_err = n > 1 ? std::sqrt(r.same_top * (1.0 - r.same_top) / (c - 1.0)) : 0.0;
    r.dp_mean = dp / c;
    r.dp_mean_err = mean_stderr(dp, dp2, c);
    r.dp_rms = std::sqrt(dp2 / c);
    // d(sqrt(m))/dm = 1 / (2 sqrt(m)) applied to the standard error of mean(dp^2)
    r.dp_rms_err = r.dp_rms > 0.0 ? mean_stderr(dp2, dp4, c) / (2.0 * r.dp_rms) : 0.0;
    r.dp_max = dp_max;
    if (with_quantiles) {
      std::vector<double> sorted = kld_values;
      std::sort(sorted.begin(), sorted.end());
      r.kld_min = sorted.front();
      r.kld_median = quantile(sorted, 0.5);
      r.kld_p90 = quantile(sorted, 0.9);
      r.kld_p99 = quantile(sorted, 0.99);
      r.kld_max = sorted.back();
      r.kld = kld_values;
    }
    return r;
  }
};

}  // namespace

bool encode_kld_row(std::span<const float> logits, int32_t next, uint8_t* out) {
  const auto [max, top] = row_max(logits);
  const double sum = row_sum_exp(logits, max);
  const double log_sum = std::log(sum);
  const double lse = max + log_sum;
  if (!std::isfinite(lse)) return false;
  double min = max;
  for (float l : logits) min = std::min(min, static_cast<double>(l));
  const double hi = max - lse;  // the top log-probability
  const double lo_exact = std::max(min - lse, hi - kKldLogProbRange);
  const bool clamped = min - lse < lo_exact;
  const float lo = static_cast<float>(lo_exact);
  const float step = static_cast<float>((hi - static_cast<double>(lo)) / kMaxCode);
  uint8_t* p = out;
  put<double>(p, -((static_cast<double>(logits[static_cast<size_t>(next)]) - max) - log_sum));
  put<float>(p, lo);
  put<float>(p, step);
  put<int32_t>(p, static_cast<int32_t>(top));
  put<uint32_t>(p, clamped ? kFlagClamped : 0u);
  const double inv_step = step > 0.0f ? 1.0 / static_cast<double>(step) : 0.0;
  for (float l : logits) {
    // NaN-free here (lse is finite); -inf logits land on code 0
    const double x = (static_cast<double>(l) - lse - static_cast<double>(lo)) * inv_step;
    const double code = std::clamp(std::nearbyint(x), 0.0, kMaxCode);
    put<uint16_t>(p, static_cast<uint16_t>(code));
  }
  return true;
}

KldRowStats compare_kld_row(const uint8_t* row, std::span<const float> logits, int32_t next) {
  const RowHeader h = read_row_header(row);
  const uint8_t* codes = row + kKldRowHeaderBytes;
  const size_t n = logits.size();
  KldRowStats s;
  s.nll_base = h.nll;

  const auto [max, top] = row_max(logits);
  const double log_sum = std::log(row_sum_exp(logits, max));
  s.nll = -((static_cast<double>(logits[static_cast<size_t>(next)]) - max) - log_sum);
  s.same_top = static_cast<int32_t>(top) == h.top;
  const double lse = max + log_sum;

  // The dequantized base row, renormalized (see the header: this makes the rounding error's effect
  // on the KL second order).
  const double lo = h.lo, step = h.step;
  uint16_t max_code = 0;
  for (size_t i = 0; i < n; ++i) max_code = std::max(max_code, code_at(codes, i));
  const double base_max = lo + max_code * step;
  double base_sum = 0.0;
  for (size_t i = 0; i < n; ++i) base_sum += std::exp(lo + code_at(codes, i) * step - base_max);
  const double base_lse = base_max + std::log(base_sum);
  const bool clamped = (h.flags & kFlagClamped) != 0;

  double kld = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t c = code_at(codes, i);
    const double log_p = lo + c * step - base_lse;
    const double log_q = static_cast<double>(logits[i]) - lse;
    if (clamped && c == 0 && log_q <= log_p) continue;  // both below the stored range
    kld += std::exp(log_p) * (log_p - log_q);
  }
  s.kld = kld;
  return s;
}

Result<KldBaseFile> KldBaseFile::open(const std::string& path) {
  KldBaseFile f;
  f.path_ = path;
  f.in_.open(path, std::ios::binary);
  if (!f.in_) return make_error(StatusCode::io_error, "{}: cannot open the KL-divergence base file", path);
  f.in_.seekg(0, std::ios::end);
  const auto end = f.in_.tellg();
  if (end < 0) return make_error(StatusCode::io_error, "{}: cannot determine the file's size", path);
  const uint64_t size = static_cast<uint64_t>(end);
  f.in_.seekg(0);
  if (size < kKldHeaderBytes)
    return make_error(StatusCode::format_error,
                      "{}: {} bytes, too short for a KL-divergence base file (header of {} bytes)", path,
                      size, kKldHeaderBytes);
  uint8_t header[kKldHeaderBytes];
  if (!f.in_.read(reinterpret_cast<char*>(header), sizeof(header)))
    return make_error(StatusCode::io_error, "{}: cannot read the header", path);
  if (std::memcmp(header, "_logits_", 8) == 0)
    return make_error(StatusCode::format_error,
                      "{}: a llama-perplexity KL-divergence file; loom reads the files `loom perplexity "
                      "--kl-divergence-base` writes",
                      path);
  if (std::memcmp(header, kKldMagic, sizeof(kKldMagic)) != 0)
    return make_error(StatusCode::format_error, "{}: not a loom KL-divergence base file (bad magic)", path);
  const uint8_t* p = header + sizeof(kKldMagic);
  const uint32_t version = get<uint32_t>(p), n_vocab = get<uint32_t>(p), n_ctx = get<uint32_t>(p),
                 n_chunks = get<uint32_t>(p);
  if (version != kKldVersion)
    return make_error(StatusCode::unsupported, "{}: format version {}; this loom reads version {}", path,
                      version, kKldVersion);
  // Bounds that keep every size below 2^63 (and far above any real model or run).
  constexpr uint32_t kLimit = 1u << 24;
  if (n_vocab < 1 || n_vocab > kLimit || n_ctx < 4 || n_ctx > kLimit || n_chunks < 1 || n_chunks > kLimit ||
      static_cast<uint64_t>(n_ctx) * n_chunks > (uint64_t{1} << 31))
    return make_error(StatusCode::format_error,
                      "{}: corrupt header: n_vocab {}, n_ctx {}, n_chunks {} (out of range)", path, n_vocab,
                      n_ctx, n_chunks);
  const uint64_t n_tokens = static_cast<uint64_t>(n_ctx) * n_chunks;
  const uint64_t rows = static_cast<uint64_t>(n_chunks) * (n_ctx - 1 - n_ctx / 2);
  const uint64_t row_bytes = kld_row_bytes(n_vocab);
  const uint64_t expected = kKldHeaderBytes + 4 * n_tokens + rows * row_bytes;
  if (size < expected)
    return make_error(
        StatusCode::format_error,
        "{}: truncated: {} bytes, the header promises {} ({} chunks of {} tokens, {} rows of {} bytes)", path,
        size, expected, n_chunks, n_ctx, rows, row_bytes);
  if (size > expected)
    return make_error(StatusCode::format_error, "{}: {} unexpected bytes after the last row", path,
                      size - expected);
  f.n_vocab_ = static_cast<int>(n_vocab);
  f.n_ctx_ = static_cast<int>(n_ctx);
  f.n_chunks_ = static_cast<int>(n_chunks);
  f.tokens_.resize(n_tokens);
  if (!f.in_.read(reinterpret_cast<char*>(f.tokens_.data()), static_cast<std::streamsize>(4 * n_tokens)))
    return make_error(StatusCode::io_error, "{}: cannot read the tokens", path);
  for (size_t i = 0; i < f.tokens_.size(); ++i)
    if (f.tokens_[i] < 0 || f.tokens_[i] >= f.n_vocab_)
      return make_error(StatusCode::format_error, "{}: token {} is {}, outside the vocabulary of {}", path, i,
                        f.tokens_[i], n_vocab);
  return f;
}

Status KldBaseFile::read_chunk(int c, std::vector<uint8_t>& out) {
  if (c < 0 || c >= n_chunks_)
    return make_error(StatusCode::invalid_argument, "{}: chunk {} of {}", path_, c, n_chunks_);
  const uint64_t row_bytes = kld_row_bytes(static_cast<size_t>(n_vocab_));
  const uint64_t chunk_bytes = static_cast<uint64_t>(rows_per_chunk()) * row_bytes;
  const uint64_t offset = kKldHeaderBytes + 4 * tokens_.size() + static_cast<uint64_t>(c) * chunk_bytes;
  out.resize(chunk_bytes);
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(offset));
  if (!in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(chunk_bytes)))
    return make_error(StatusCode::io_error, "{}: cannot read chunk {} ({} bytes at offset {})", path_, c,
                      chunk_bytes, offset);
  for (int r = 0; r < rows_per_chunk(); ++r) {
    const RowHeader h = read_row_header(out.data() + static_cast<uint64_t>(r) * row_bytes);
    if (!std::isfinite(h.nll) || h.nll < 0.0 || !std::isfinite(h.lo) || !std::isfinite(h.step) ||
        h.step < 0.0f || h.top < 0 || h.top >= n_vocab_ || (h.flags & ~kFlagClamped) != 0)
      return make_error(
          StatusCode::format_error,
          "{}: chunk {} row {}: corrupt row header (nll {}, lo {}, step {}, top {}, flags {:#x})", path_, c,
          r, h.nll, h.lo, h.step, h.top, h.flags);
  }
  return {};
}

Result<PerplexityResult> compute_perplexity_saving_base(llm::Context& ctx, std::span<const int32_t> tokens,
                                                        const PerplexityParams& params,
                                                        const std::string& path,
                                                        const std::function<void(int, double)>& on_chunk) {
  const std::string partial = path + ".partial";
  const size_t n_vocab = static_cast<size_t>(ctx.n_vocab());
  const size_t row_bytes = kld_row_bytes(n_vocab);
  const int first = params.n_ctx / 2;
  std::ofstream out;
  std::vector<uint8_t> rows;
  auto write_chunk = [&](int c, std::span<const int32_t> chunk, std::span<const float> logits) -> Status {
    if (c == 0) {  // compute_perplexity has checked its arguments by now
      out.open(partial, std::ios::binary | std::ios::trunc);
      if (!out) return make_error(StatusCode::io_error, "{}: cannot create the file", partial);
      const int n_chunks = perplexity_chunk_count(tokens.size(), params);
      std::vector<uint8_t> header(kKldHeaderBytes);
      uint8_t* p = header.data();
      std::memcpy(p, kKldMagic, sizeof(kKldMagic));
      p += sizeof(kKldMagic);
      put<uint32_t>(p, kKldVersion);
      put<uint32_t>(p, static_cast<uint32_t>(n_vocab));
      put<uint32_t>(p, static_cast<uint32_t>(params.n_ctx));
      put<uint32_t>(p, static_cast<uint32_t>(n_chunks));
      out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size()));
      std::vector<int32_t> stored(tokens.begin(),
                                  tokens.begin() + static_cast<ptrdiff_t>(n_chunks) * params.n_ctx);
      if (params.bos != kNoToken)
        for (int k = 0; k < n_chunks; ++k) stored[static_cast<size_t>(k) * params.n_ctx] = params.bos;
      out.write(reinterpret_cast<const char*>(stored.data()),
                static_cast<std::streamsize>(4 * stored.size()));
    }
    const int n_rows = params.n_ctx - 1 - first;
    rows.resize(static_cast<size_t>(n_rows) * row_bytes);
    std::vector<uint8_t> ok(static_cast<size_t>(n_rows), 1);
    for_row_ranges(n_rows, params.n_threads, [&](int r0, int r1) {
      for (int r = r0; r < r1; ++r) {
        const size_t j = static_cast<size_t>(first + r);
        ok[static_cast<size_t>(r)] = encode_kld_row(logits.subspan(j * n_vocab, n_vocab), chunk[j + 1],
                                                    rows.data() + static_cast<size_t>(r) * row_bytes);
      }
    });
    for (int r = 0; r < n_rows; ++r)
      if (!ok[static_cast<size_t>(r)])
        return make_error(StatusCode::internal, "{}: chunk {} position {}: the logits are not finite", path,
                          c, first + r);
    out.write(reinterpret_cast<const char*>(rows.data()), static_cast<std::streamsize>(rows.size()));
    if (!out) return make_error(StatusCode::io_error, "{}: write failed (disk full?)", partial);
    return {};
  };
  auto r = compute_perplexity(ctx, tokens, params, on_chunk, write_chunk);
  std::error_code ec;
  if (out.is_open()) out.close();
  if (!r.ok() || !out) {
    std::filesystem::remove(partial, ec);
    if (!r.ok()) return r;
    return make_error(StatusCode::io_error, "{}: write failed (disk full?)", partial);
  }
  std::filesystem::rename(partial, path, ec);
  if (ec)
    return make_error(StatusCode::io_error, "{}: cannot rename {} to it: {}", path, partial, ec.message());
  return r;
}

Result<KlDivergenceResult> compute_kl_divergence(
    llm::Context& ctx, KldBaseFile& base, const PerplexityParams& params,
    const std::function<void(int, const KlDivergenceResult&)>& on_chunk) {
  if (base.n_vocab() != ctx.n_vocab())
    return make_error(StatusCode::invalid_argument,
                      "{}: the base run's vocabulary has {} tokens, this model's {}; KL divergence compares "
                      "runs of one vocabulary",
                      base.path(), base.n_vocab(), ctx.n_vocab());
  if (base.n_ctx() != params.n_ctx)
    return make_error(StatusCode::invalid_argument,
                      "{}: the base run used chunks of {} tokens (-c {}), this run {}; use the same -c",
                      base.path(), base.n_ctx(), base.n_ctx(), params.n_ctx);
  PerplexityParams p = params;
  p.bos = kNoToken;
  const size_t n_vocab = static_cast<size_t>(base.n_vocab());
  const size_t row_bytes = kld_row_bytes(n_vocab);
  const int first = p.n_ctx / 2;
  const int n_rows = base.rows_per_chunk();
  KldSums sums;
  std::vector<uint8_t> rows;
  std::vector<KldRowStats> stats(static_cast<size_t>(n_rows));
  auto compare_chunk = [&](int c, std::span<const int32_t> chunk, std::span<const float> logits) -> Status {
    LOOM_TRY(base.read_chunk(c, rows));
    for_row_ranges(n_rows, p.n_threads, [&](int r0, int r1) {
      for (int r = r0; r < r1; ++r) {
        const size_t j = static_cast<size_t>(first + r);
        stats[static_cast<size_t>(r)] = compare_kld_row(rows.data() + static_cast<size_t>(r) * row_bytes,
                                                        logits.subspan(j * n_vocab, n_vocab), chunk[j + 1]);
      }
    });
    for (const KldRowStats& s : stats) sums.add(s);  // in token order: independent of the thread count
    return {};
  };
  auto chunk_done = [&](int c, double) {
    if (on_chunk) on_chunk(c, sums.result(/*with_quantiles=*/false));
  };
  auto run = compute_perplexity(ctx, base.tokens(), p, chunk_done, compare_chunk);
  if (!run) return run.status();
  KlDivergenceResult r = sums.result(/*with_quantiles=*/true);
  r.run = std::move(*run);
  return r;
}

std::string kl_divergence_table_header() {
  return fmt::format("{:>5} {:>23} {:>25} {:>25} {:>18} {:>18}", "chunk", "PPL", "ln(PPL(Q)/PPL(base))",
                     "KL Divergence", "Δp RMS", "Same top p");
}

std::string kl_divergence_table_row(int chunk, const KlDivergenceResult& r) {
  return fmt::format(
      "{:5d} {:10.4f} ± {:10.4f} {:11.6f} ± {:11.6f} {:11.8f} ± {:11.8f} {:7.3f} ± {:6.3f} % "
      "{:7.3f} ± {:6.3f} %",
      chunk, r.run.ppl, r.run.ppl_err, r.ln_ppl_ratio, r.ln_ppl_ratio_err, r.kld_mean, r.kld_stderr,
      100.0 * r.dp_rms, 100.0 * r.dp_rms_err, 100.0 * r.same_top, 100.0 * r.same_top_err);
}

std::string kl_divergence_summary(const KlDivergenceResult& r) {
  std::string s;
  auto line = [&s](fmt::string_view text) {
    s.append(text.data(), text.size());
    s += '\n';
  };
  line("====== Perplexity statistics ======");
  line(fmt::format("Mean PPL(Q)                   : {:12.6f} ± {:10.6f}", r.run.ppl, r.run.ppl_err));
  line(fmt::format("Mean PPL(base)                : {:12.6f} ± {:10.6f}", r.base_ppl, r.base_ppl_err));
  line(
      fmt::format("Mean ln(PPL(Q)/PPL(base))     : {:12.6f} ± {:10.6f}", r.ln_ppl_ratio, r.ln_ppl_ratio_err));
  line(fmt::format("Mean PPL(Q)/PPL(base)         : {:12.6f} ± {:10.6f}", r.ppl_ratio, r.ppl_ratio_err));
  line("");
  line(fmt::format("====== KL divergence statistics ({} tokens) ======", r.n_scored));
  line(fmt::format("Mean    KLD: {:12.8f} ± {:10.8f}", r.kld_mean, r.kld_stderr));
  line(fmt::format("Maximum KLD: {:12.8f}", r.kld_max));
  line(fmt::format("99.0%   KLD: {:12.8f}", r.kld_p99));
  line(fmt::format("90.0%   KLD: {:12.8f}", r.kld_p90));
  line(fmt::format("Median  KLD: {:12.8f}", r.kld_median));
  line(fmt::format("Minimum KLD: {:12.8f}", r.kld_min));
  line("");
  line("====== Token probability statistics ======");
  line(fmt::format("Mean    Δp: {:8.4f} ± {:7.4f} %", 100.0 * r.dp_mean, 100.0 * r.dp_mean_err));
  line(fmt::format("Max   |Δp|: {:8.4f} %", 100.0 * r.dp_max));
  line(fmt::format("RMS     Δp: {:8.4f} ± {:7.4f} %", 100.0 * r.dp_rms, 100.0 * r.dp_rms_err));
  line(fmt::format("Same top p: {:8.4f} ± {:7.4f} %", 100.0 * r.same_top, 100.0 * r.same_top_err));
  return s;
}

}  // namespace loom::app
