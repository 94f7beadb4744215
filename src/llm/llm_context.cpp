// Context: a KV cache plus the per-step machinery. Each forward pass builds a fresh graph (cheap:
// a few hundred nodes), places its activations in one arena that is kept across passes (sized at
// creation for the largest pass, n_batch tokens over a full cache, and grown only if a pass needs
// more, e.g. all-token logits), writes the inputs, computes and reads the logits back.
#include <fmt/format.h>

#include "llm/llm_kv_cache.h"
#include "llm/llm_model_impl.h"
#include "loom/planner.h"

namespace loom::llm {

namespace detail {

namespace {
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
constexpr int kDefaultMaxCtx = 4096;
}  // namespace

struct ContextImpl {
  const Model* model = nullptr;
  const ModelImpl* m = nullptr;
  Backend* backend = nullptr;
  int n_ctx = 0;
  int n_batch = 0;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<Buffer> arena;   // activations, reused across passes
  std::unique_ptr<Buffer> inputs;  // input leafs, reused across passes
  std::vector<float> logits;       // host copy returned by decode
  std::vector<float> mask;         // host staging of the masks
  std::vector<float> mask_swa;
  DecodeStats stats;

  // Gives every tensor of `g` memory: input leafs in `inputs`, activations in `arena` (both
  // reallocated only when too small), views resolved to their source.
  Status allocate(Graph& g) {
    BufferType& type = backend->buffer_type();
    const size_t align = type.alignment();
    size_t in_bytes = 0;
    for (Tensor* t : g.leafs())
      if (!t->data) in_bytes += align_up(t->nbytes(), align);
    if (!inputs || inputs->size() < in_bytes) {
      inputs.reset();
      auto buf = type.allocate(in_bytes);
      if (!buf) return buf.status();
      inputs = std::move(buf.value());
    }
    size_t off = 0;
    for (Tensor* t : g.leafs()) {
      if (t->data) continue;
      LOOM_TRY(tensor_bind(t, inputs.get(), off));
      off += align_up(t->nbytes(), align);
    }

    const MemoryPlan plan = plan_memory(g, align);
    if (!arena || arena->size() < plan.peak_bytes) {
      arena.reset();  // free the old arena first: peak memory is one arena, not two
      auto buf = type.allocate(plan.peak_bytes);
      if (!buf)
        return make_error(buf.status().code(), "activation arena of {}: {}", format_bytes(plan.peak_bytes),
                          buf.status().message());
      arena = std::move(buf.value());
      ++stats.n_arena_allocations;
    }
    for (Tensor* t : g.nodes()) {
      if (t->view_src) {
        const Tensor* src = t->view_src;
        LOOM_ASSERT(src->data != nullptr);
        t->buffer = src->buffer;
        t->data = static_cast<uint8_t*>(src->data) + t->view_offset;
      } else {
        LOOM_TRY(tensor_bind(t, arena.get(), plan.offsets[t->index]));
      }
    }
    stats.n_nodes = g.nodes().size();
    stats.arena_bytes = arena->size();
    return {};
  }

  // Builds the pass for `shape`; its logits tensor, nullptr on error (see g.status()).
  Tensor* build(Graph& g, const StepShape& shape, StepInputs& in) {
    StepBuilder b(g, m->hp, m->w, *kv, m->arch->rope_mode(), shape);
    Tensor* logits_t = m->arch->build(b);
    in = b.inputs();
    if (logits_t) g.mark_output(logits_t);
    return logits_t;
  }

  // One forward pass over tokens already given cache cells; appends the logits to `out` if given.
  Status run_step(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                  std::span<const int32_t> cells, int seq, int n_kv, bool all_outputs,
                  std::vector<float>* out) {
    const int n = static_cast<int>(tokens.size());
    Graph g;
    StepInputs in;
    Tensor* logits_t = build(g, StepShape{n, n_kv, all_outputs}, in);
    LOOM_TRY(g.status());
    LOOM_TRY(allocate(g));
    const size_t n_bytes = static_cast<size_t>(n) * sizeof(int32_t);
    LOOM_TRY(tensor_write(in.tokens, tokens.data(), 0, n_bytes));
    LOOM_TRY(tensor_write(in.positions, positions.data(), 0, n_bytes));
    LOOM_TRY(tensor_write(in.kv_cells, cells.data(), 0, n_bytes));
    mask.resize(static_cast<size_t>(n_kv) * n);
    kv->fill_mask(positions, seq, n_kv, mask.data());
    LOOM_TRY(tensor_write(in.kq_mask, mask.data(), 0, mask.size() * sizeof(float)));
    if (in.kq_mask_swa) {
      mask_swa.resize(mask.size());
      kv->fill_mask(positions, seq, n_kv, mask_swa.data(), static_cast<int>(m->hp.n_swa));
      LOOM_TRY(tensor_write(in.kq_mask_swa, mask_swa.data(), 0, mask_swa.size() * sizeof(float)));
    }
    LOOM_TRY(backend->compute(g));
    ++stats.n_steps;
    if (out) {
      const size_t count = static_cast<size_t>(logits_t->nelements());
      const size_t old = out->size();
      out->resize(old + count);
      LOOM_TRY(tensor_read(logits_t, out->data() + old, 0, count * sizeof(float)));
    }
    return {};
  }
};

}  // namespace detail

Context::Context(std::unique_ptr<detail::ContextImpl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

Result<std::unique_ptr<Context>> Context::create(const Model& model, const ContextParams& params) {
  const HParams& hp = model.hparams();
  auto impl = std::make_unique<detail::ContextImpl>();
  detail::ContextImpl& c = *impl;
  c.model = &model;
  c.m = &model.impl();
  c.backend = &model.backend();
  if (params.n_ctx < 0 || params.n_batch < 1)
    return make_error(StatusCode::invalid_argument, "context: n_ctx {} must be >= 0 and n_batch {} >= 1",
                      params.n_ctx, params.n_batch);
  c.n_ctx = params.n_ctx > 0 ? params.n_ctx
                             : static_cast<int>(std::min<uint32_t>(hp.n_ctx_train, detail::kDefaultMaxCtx));
  c.n_batch = std::min(params.n_batch, c.n_ctx);

  BufferType& type = c.backend->buffer_type();
  if (type.is_host()) {
    const uint64_t need = detail::KvCache::bytes_needed(hp, c.n_ctx);
    const uint64_t avail =
        params.available_memory ? params.available_memory : detail::host_memory_available();
    if (avail && need > avail)
      return make_error(
          StatusCode::out_of_memory,
          "context: a KV cache of {} cells needs {} but only {} of memory is available (MemAvailable); "
          "use a smaller n_ctx",
          c.n_ctx, detail::format_bytes(need), detail::format_bytes(avail));
  }
  auto kv = detail::KvCache::create(hp, c.n_ctx, type);
  if (!kv) return kv.status();
  c.kv = std::move(kv.value());

  // Reserve the arena with the largest pass, so decoding never reallocates it.
  Graph g;
  detail::StepInputs in;
  c.build(g, detail::StepShape{c.n_batch, c.n_ctx, false}, in);
  LOOM_TRY(g.status());
  LOOM_TRY(c.allocate(g));
  return std::unique_ptr<Context>(new Context(std::move(impl)));
}

Result<std::span<const float>> Context::decode(std::span<const int32_t> tokens, int pos,
                                               const DecodeOptions& options) {
  detail::ContextImpl& c = *impl_;
  const int n_vocab = static_cast<int>(c.m->hp.n_vocab);
  if (tokens.empty()) return make_error(StatusCode::invalid_argument, "decode: no tokens");
  if (options.seq_id < 0)
    return make_error(StatusCode::invalid_argument, "decode: seq_id {} must be >= 0", options.seq_id);
  if (pos < 0) return make_error(StatusCode::invalid_argument, "decode: position {} must be >= 0", pos);
  if (static_cast<int64_t>(pos) + static_cast<int64_t>(tokens.size()) > (1ll << 30))
    return make_error(StatusCode::invalid_argument, "decode: positions up to {} are too large",
                      static_cast<int64_t>(pos) + static_cast<int64_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      return make_error(StatusCode::invalid_argument,
                        "decode: token {} at index {} is outside the vocabulary [0, {})", tokens[i], i,
                        n_vocab);
  const int last = c.kv->seq_pos_max(options.seq_id);
  if (pos <= last)
    return make_error(
        StatusCode::invalid_argument,
        "decode: sequence {} already holds positions up to {}; position {} must come after them "
        "(kv_cache_seq_rm rewinds)",
        options.seq_id, last, pos);
  if (tokens.size() > static_cast<size_t>(c.n_ctx - c.kv->used()))
    return make_error(StatusCode::out_of_memory,
                      "decode: {} tokens do not fit the context: {} of {} cells are free", tokens.size(),
                      c.n_ctx - c.kv->used(), c.n_ctx);

  c.logits.clear();
  c.stats.n_steps = 0;
  std::vector<int32_t> positions;
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(c.n_batch)) {
    const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(c.n_batch));
    const bool last_chunk = begin + n == tokens.size();
    positions.resize(n);
    for (size_t i = 0; i < n; ++i) positions[i] = pos + static_cast<int32_t>(begin + i);
    auto cells = c.kv->claim(positions, options.seq_id);
    if (!cells) return cells.status();
    // Chunks before the last compute one row of logits and drop it (cheaper than a second graph shape).
    std::vector<float>* out = (options.all_logits || last_chunk) ? &c.logits : nullptr;
    Status s = c.run_step(tokens.subspan(begin, n), positions, *cells, options.seq_id, c.kv->n_kv(),
                          options.all_logits, out);
    if (!s.ok()) {
      c.kv->release(*cells);
      return s;
    }
  }
  return std::span<const float>(c.logits);
}

void Context::kv_cache_clear() { impl_->kv->clear(); }

Status Context::kv_cache_seq_rm(int seq_id, int p0, int p1) {
  if (seq_id < 0 || p0 < 0 || (p1 >= 0 && p1 < p0))
    return make_error(StatusCode::invalid_argument, "kv_cache_seq_rm: bad range: seq {}, positions [{}, {})",
                      seq_id, p0, p1);
  impl_->kv->seq_rm(seq_id, p0, p1);
  return {};
}

int Context::kv_cache_seq_pos_max(int seq_id) const { return impl_->kv->seq_pos_max(seq_id); }
int Context::kv_cache_used() const { return impl_->kv->used(); }
int Context::n_ctx() const { return impl_->n_ctx; }
int Context::n_batch() const { return impl_->n_batch; }
int Context::n_vocab() const { return static_cast<int>(impl_->m->hp.n_vocab); }
size_t Context::kv_cache_bytes() const { return impl_->kv->bytes(); }
const Model& Context::model() const { return *impl_->model; }
const DecodeStats& Context::stats() const { return impl_->stats; }

Result<Session> open_session(const SessionParams& p) {
  Session s;
  BackendOptions bo;
  bo.n_threads = p.n_threads;
  bo.device = p.device;
  auto backend = create_backend(p.backend, bo);
  if (!backend) return backend.status();
  s.backend = std::move(backend.value());
  ModelLoadOptions mo;
  mo.progress = p.progress;
  mo.print_summary = p.print_summary;
  auto model = Model::load(p.model_path, *s.backend, mo);
  if (!model) return model.status();
  s.model = std::move(model.value());
  ContextParams cp;
  cp.n_ctx = p.n_ctx;
  cp.n_batch = p.n_batch;
  auto ctx = Context::create(*s.model, cp);
  if (!ctx) return ctx.status();
  s.context = std::move(ctx.value());
  if (p.print_summary)
    fmt::print(stderr, "loom: context {} cells, batch {}, KV cache {} (f16), activations {}, backend {}\n",
               s.context->n_ctx(), s.context->n_batch(), detail::format_bytes(s.context->kv_cache_bytes()),
               detail::format_bytes(s.context->stats().arena_bytes), s.backend->name());
  return s;
}

}  // namespace loom::llm
