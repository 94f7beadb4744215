// The C ABI for models and batched generation (include/loom-llm.h): thin wrappers over
// loom::llm::open_session, loom::Tokenizer and loom::llm::BatchGenerator. Every entry point turns
// a Status or a C++ exception into the thread's last error (capi_export.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "capi_export.h"
#include "loom-llm.h"
#include "loom/llm.h"
#include "loom/llm_batch.h"
#include "loom/sample.h"
#include "loom/text.h"

using loom::make_error;
using loom::Status;
using loom::StatusCode;

struct loom_model {
  loom::llm::Session session;  ///< backend + model; its context is not used (batches make their own)
  loom::Tokenizer tokenizer;
  std::string backend_name;
};

struct loom_batch {
  loom_model* model = nullptr;
  std::unique_ptr<loom::llm::Context> context;
  std::unique_ptr<loom::llm::BatchGenerator> generator;  ///< after context: destroyed before it
};

namespace {

template <typename T>
T fail(T failed, const Status& s) {
  loom::capi::report(s);
  return failed;
}

loom::Result<loom::llm::Session> open(const std::string& path, const loom_model_params& p, const std::string& backend) {
  loom::llm::SessionParams sp;
  sp.model_path = path;
  sp.backend = backend;
  sp.n_threads = std::max(p.n_threads, 0);
  sp.n_ctx = 8;  // the session's own context is a stub: batches make theirs
  sp.progress = false;
  sp.print_summary = false;
  if (p.numerics == LOOM_NUMERICS_EXACT) sp.numerics = loom::Numerics::exact;
  if (p.numerics == LOOM_NUMERICS_FAST) sp.numerics = loom::Numerics::fast;
  sp.n_tensor_parallel = std::max(p.n_tensor_parallel, 1);
  return loom::llm::open_session(sp);
}

// Copies `n` values into out[0..capacity) when they fit; returns n either way (C's two-call idiom).
template <typename T>
int copy_out(const T* values, size_t n, T* out, int capacity) {
  if (n <= static_cast<size_t>(std::max(capacity, 0)) && n > 0) std::memcpy(out, values, n * sizeof(T));
  return static_cast<int>(n);
}

}  // namespace

extern "C" {

LOOM_API loom_model_params loom_model_default_params(void) {
  loom_model_params p{};
  p.backend = nullptr;
  p.n_threads = 0;
  p.numerics = -1;
  p.n_tensor_parallel = 1;
  return p;
}

LOOM_API loom_model* loom_model_load(const char* path, const loom_model_params* params) {
  return loom::capi::guard_value<loom_model*>("loom_model_load", nullptr, [&]() -> loom_model* {
    if (!path) return fail<loom_model*>(nullptr, make_error(StatusCode::invalid_argument, "loom_model_load: path is NULL"));
    const loom_model_params p = params ? *params : loom_model_default_params();
    if (p.numerics != -1 && p.numerics != LOOM_NUMERICS_DEFAULT && p.numerics != LOOM_NUMERICS_EXACT &&
        p.numerics != LOOM_NUMERICS_FAST)
      return fail<loom_model*>(nullptr, make_error(StatusCode::invalid_argument,
                                                   "loom_model_load: numerics {} is not a loom_numerics", p.numerics));
    std::string backend = p.backend ? p.backend : "cuda";
    auto session = open(path, p, backend);
    if (!session && !p.backend) {  // no backend named: the GPU when usable, else the CPU
      backend = "cpu";
      session = open(path, p, backend);
    }
    if (!session) return fail<loom_model*>(nullptr, session.status());
    auto tokenizer = loom::Tokenizer::from_gguf(session->model->gguf());
    if (!tokenizer) return fail<loom_model*>(nullptr, tokenizer.status());
    auto* m = new loom_model{std::move(*session), std::move(*tokenizer), backend};
    m->session.context.reset();
    return m;
  });
}

LOOM_API void loom_model_free(loom_model* model) { delete model; }

LOOM_API int32_t loom_model_n_vocab(const loom_model* model) {
  return model ? model->tokenizer.n_tokens() : 0;
}

LOOM_API const char* loom_model_backend(const loom_model* model) {
  return model ? model->backend_name.c_str() : "";
}

LOOM_API int loom_tokenize(const loom_model* model, const char* text, bool add_special, int32_t* out,
                           int capacity) {
  return loom::capi::guard_value<int>("loom_tokenize", -1, [&]() -> int {
    if (!model || !text || (capacity > 0 && !out))
      return fail(-1, make_error(StatusCode::invalid_argument, "loom_tokenize: model, text or out is NULL"));
    auto ids = model->tokenizer.encode(text, add_special);
    if (!ids) return fail(-1, ids.status());
    return copy_out(ids->data(), ids->size(), out, capacity);
  });
}

LOOM_API int loom_token_to_piece(const loom_model* model, int32_t token, char* buf, int size) {
  return loom::capi::guard_value<int>("loom_token_to_piece", -1, [&]() -> int {
    if (!model || (size > 0 && !buf))
      return fail(-1, make_error(StatusCode::invalid_argument, "loom_token_to_piece: model or buf is NULL"));
    auto piece = model->tokenizer.token_to_piece(token);
    if (!piece) return fail(-1, piece.status());
    return copy_out(piece->data(), piece->size(), buf, size);
  });
}

LOOM_API bool loom_token_is_eog(const loom_model* model, int32_t token) {
  if (!model) return false;
  const auto& sp = model->tokenizer.special();
  return token == sp.eos || token == sp.eot;
}

LOOM_API loom_sampling loom_sampling_default(void) {
  const loom::SamplerParams d;
  loom_sampling s{};
  s.seed = d.seed;
  s.top_k = d.top_k;
  s.top_p = d.top_p;
  s.min_p = d.min_p;
  s.temperature = d.temperature;
  s.repeat_penalty = d.penalties.repeat;
  s.repeat_last_n = d.penalties.last_n;
  return s;
}

LOOM_API loom_batch* loom_batch_create(loom_model* model, int n_ctx, int max_sequences) {
  return loom::capi::guard_value<loom_batch*>("loom_batch_create", nullptr, [&]() -> loom_batch* {
    if (!model) return fail<loom_batch*>(nullptr, make_error(StatusCode::invalid_argument, "loom_batch_create: model is NULL"));
    if (n_ctx < 1 || max_sequences < 1)
      return fail<loom_batch*>(nullptr, make_error(StatusCode::invalid_argument,
                                                   "loom_batch_create: n_ctx {} and max_sequences {} must be at least 1",
                                                   n_ctx, max_sequences));
    loom::llm::ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_batch = std::max(cp.n_batch, max_sequences);  // one pass per step, however many sequences
    cp.kv_cache = loom::llm::KvCacheKind::paged;
    auto ctx = loom::llm::Context::create(*model->session.model, cp);
    if (!ctx) return fail<loom_batch*>(nullptr, ctx.status());
    auto* b = new loom_batch;
    b->model = model;
    b->context = std::move(*ctx);
    b->generator = std::make_unique<loom::llm::BatchGenerator>(*b->context);
    b->generator->set_device_sampling(true);  // nothing here reads logits back
    return b;
  });
}

LOOM_API void loom_batch_free(loom_batch* batch) { delete batch; }

LOOM_API loom_status loom_batch_set_device_sampling(loom_batch* batch, bool on) {
  return loom::capi::guard_status("loom_batch_set_device_sampling", [&]() -> Status {
    if (!batch)
      return make_error(StatusCode::invalid_argument, "loom_batch_set_device_sampling: batch is NULL");
    batch->generator->set_device_sampling(on);
    return {};
  });
}

namespace {

loom::SamplerParams sampler_params(const loom_sampling* sampling) {
  const loom_sampling s = sampling ? *sampling : loom_sampling_default();
  loom::SamplerParams p;
  p.seed = s.seed;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.min_p = s.min_p;
  p.temperature = s.temperature;
  p.penalties.repeat = s.repeat_penalty;
  p.penalties.last_n = s.repeat_last_n;
  return p;
}

// loom_batch_add and loom_batch_enqueue: chunk < 0 computes the prompt now.
int add_sequence(const char* fn, loom_batch* batch, const int32_t* prompt, int n_prompt, const loom_sampling* sampling,
                 int chunk, bool now) {
  return loom::capi::guard_value<int>(fn, -1, [&]() -> int {
    if (!batch || (n_prompt > 0 && !prompt))
      return fail(-1, make_error(StatusCode::invalid_argument, "{}: batch or prompt is NULL", fn));
    if (n_prompt < 1) return fail(-1, make_error(StatusCode::invalid_argument, "{}: empty prompt", fn));
    const std::span<const int32_t> tokens(prompt, static_cast<size_t>(n_prompt));
    auto id = now ? batch->generator->add(tokens, sampler_params(sampling))
                  : batch->generator->enqueue(tokens, sampler_params(sampling), chunk);
    if (!id) return fail(-1, id.status());
    return *id;
  });
}

}  // namespace

LOOM_API int loom_batch_add(loom_batch* batch, const int32_t* prompt, int n_prompt, const loom_sampling* sampling) {
  return add_sequence("loom_batch_add", batch, prompt, n_prompt, sampling, 0, true);
}

LOOM_API int loom_batch_enqueue(loom_batch* batch, const int32_t* prompt, int n_prompt, const loom_sampling* sampling,
                                int chunk) {
  return add_sequence("loom_batch_enqueue", batch, prompt, n_prompt, sampling, chunk, false);
}

LOOM_API loom_status loom_batch_remove(loom_batch* batch, int seq_id) {
  return loom::capi::guard_status("loom_batch_remove", [&]() -> Status {
    if (!batch) return make_error(StatusCode::invalid_argument, "loom_batch_remove: batch is NULL");
    return batch->generator->remove(seq_id);
  });
}

LOOM_API int loom_batch_step(loom_batch* batch, int32_t* seq_ids, int32_t* tokens, int capacity) {
  return loom::capi::guard_value<int>("loom_batch_step", -1, [&]() -> int {
    if (!batch || !seq_ids || !tokens)
      return fail(-1, make_error(StatusCode::invalid_argument, "loom_batch_step: batch, seq_ids or tokens is NULL"));
    if (capacity < batch->generator->n_sequences())
      return fail(-1, make_error(StatusCode::invalid_argument,
                                 "loom_batch_step: capacity {} is below the {} sequences", capacity,
                                 batch->generator->n_sequences()));
    auto step = batch->generator->step();
    if (!step) return fail(-1, step.status());
    int n = 0;
    for (const auto& t : *step) {
      seq_ids[n] = t.seq_id;
      tokens[n] = t.token;
      ++n;
    }
    return n;
  });
}

LOOM_API int loom_batch_n_sequences(const loom_batch* batch) { return batch ? batch->generator->n_sequences() : 0; }

LOOM_API int loom_batch_generated(const loom_batch* batch, int seq_id, int32_t* out, int capacity) {
  if (!batch) return -1;
  const auto seqs = batch->generator->sequences();
  if (std::find(seqs.begin(), seqs.end(), seq_id) == seqs.end()) {
    loom::capi::report(make_error(StatusCode::invalid_argument, "loom_batch_generated: no sequence {}", seq_id));
    return -1;
  }
  const auto g = batch->generator->generated(seq_id);
  return copy_out(g.data(), g.size(), out, capacity);
}

}  // extern "C"
