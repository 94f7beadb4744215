// Shared pieces of the model-layer tests: a scratch directory with synthetic models, GGUF
// rewriting for the error cases, and logit comparisons.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "synth_model.h"
#include "loom/cpu.h"
#include "loom/gguf.h"
#include "loom/llm.h"

namespace loom::llm::testing {

namespace fs = std::filesystem;

/// A scratch directory removed at the end of each test, with synthetic models made on demand.
class ModelFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "loom-llm-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// Writes shape `shape` in type `type` (once per test) and returns its path.
  std::string model(const std::string& shape, const std::string& type = "f32", uint64_t seed = 1) {
    const std::string p = path(shape + "-" + type + "-" + std::to_string(seed) + ".gguf");
    if (fs::exists(p)) return p;
    const SynthShape* s = find_synth_shape(shape);
    auto ft = file_type_from_name(type);
    EXPECT_TRUE(s && ft) << shape << " " << type;
    if (!s || !ft) return p;
    SynthOptions o;
    o.seed = seed;
    o.n_threads = 2;
    o.progress = false;
    Status st = write_synth_model(p, *s, *ft, o);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return p;
  }

  fs::path dir_;
};

inline ModelLoadOptions quiet_load() {
  ModelLoadOptions o;
  o.progress = false;
  o.print_summary = false;
  return o;
}

/// Changes to apply while copying a GGUF file.
struct Rewrite {
  std::set<std::string> drop_tensors;
  std::set<std::string> drop_keys;
  /// Extra key/values and tensors, added after the copied ones (the source stays open meanwhile).
  std::function<Status(GgufWriter&, const GgufFile&)> add;
};

/// A CPU backend, a model loaded on it and a context (members destroyed in reverse order).
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

/// Loads `file` on a CPU backend of n_threads and makes a context with `cp`; failures are test
/// failures (and leave the missing members null).
inline LoadedModel open_cpu_model(const std::string& file, int n_threads, const ContextParams& cp) {
  LoadedModel l;
  l.backend = make_cpu_backend(n_threads);
  auto m = Model::load(file, *l.backend, quiet_load());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return l;
  l.model = std::move(m.value());
  auto c = Context::create(*l.model, cp);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (c.ok()) l.ctx = std::move(c.value());
  return l;
}

inline LoadedModel open_cpu_model(const std::string& file, int n_threads, int n_ctx, int n_batch) {
  return open_cpu_model(file, n_threads, ContextParams{n_ctx, n_batch, 0});
}

/// Copies `src` to `dst` with the changes of `r`.
inline Status rewrite_gguf(const std::string& src, const std::string& dst, const Rewrite& r) {
  auto f = GgufFile::open(src);
  if (!f) return f.status();
  GgufWriter w;
  for (const GgufKV& kv : f->kvs()) {
    if (r.drop_keys.count(std::string(kv.key))) continue;
    LOOM_TRY(w.add_value(kv.key, kv.value));
  }
  for (const GgufTensorInfo& t : f->tensors()) {
    if (r.drop_tensors.count(std::string(t.name))) continue;
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    LOOM_TRY(w.add_tensor_ggml(t.name, t.ggml_type, ne, t.data));
  }
  if (r.add) LOOM_TRY(r.add(w, *f));
  return w.write(dst);
}

/// Normalized mean squared error of `a` against reference `b`.
template <typename A, typename B>
double nmse(const A& a, const B& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den > 0.0 ? num / den : num;
}

inline int argmax_of(std::span<const float> v) {
  int best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int>(i);
  return best;
}

/// Deterministic token ids in [0, n_vocab).
inline std::vector<int32_t> test_tokens(int n, int n_vocab, uint32_t seed = 7) {
  std::vector<int32_t> t;
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(n_vocab)));
  }
  return t;
}

}  // namespace loom::llm::testing
