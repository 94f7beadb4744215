// C ABI: status and errors, element types, contexts and their arena, tensors, buffers.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "capi_internal.h"
#include "loom/cpu.h"

using loom::make_error;
using loom::Status;
using loom::StatusCode;
using loom::Tensor;
using namespace loom::capi;

static_assert(LOOM_STATUS_OK == static_cast<int>(StatusCode::ok));
static_assert(LOOM_STATUS_INVALID_ARGUMENT == static_cast<int>(StatusCode::invalid_argument));
static_assert(LOOM_STATUS_SHAPE_MISMATCH == static_cast<int>(StatusCode::shape_mismatch));
static_assert(LOOM_STATUS_TYPE_MISMATCH == static_cast<int>(StatusCode::type_mismatch));
static_assert(LOOM_STATUS_OUT_OF_MEMORY == static_cast<int>(StatusCode::out_of_memory));
static_assert(LOOM_STATUS_IO_ERROR == static_cast<int>(StatusCode::io_error));
static_assert(LOOM_STATUS_FORMAT_ERROR == static_cast<int>(StatusCode::format_error));
static_assert(LOOM_STATUS_DEVICE_ERROR == static_cast<int>(StatusCode::device_error));
static_assert(LOOM_STATUS_UNSUPPORTED == static_cast<int>(StatusCode::unsupported));
static_assert(LOOM_STATUS_ABORTED == static_cast<int>(StatusCode::aborted));
static_assert(LOOM_STATUS_INTERNAL == static_cast<int>(StatusCode::internal));
static_assert(LOOM_MAX_DIMS == loom::kMaxDims);

namespace {

thread_local std::string t_last_error;

Status null_arg(const char* fn, const char* what) {
  return make_error(StatusCode::invalid_argument, "{}: {} is NULL", fn, what);
}

// The host range an arena spans, as a buffer type for the backends' "is it host memory" checks.
class ArenaBufferType final : public loom::BufferType {
 public:
  const char* name() const override { return "context_arena"; }
  size_t alignment() const override { return LOOM_TENSOR_ALIGNMENT; }
  bool is_host() const override { return true; }
  loom::Result<std::unique_ptr<loom::Buffer>> allocate(size_t size) override {
    return loom::cpu_buffer_type().allocate(size);  // arenas are made by contexts, not by this
  }
};

Status range_check(const char* what, size_t offset, size_t n, size_t size) {
  if (offset > size || n > size - offset)
    return make_error(StatusCode::invalid_argument, "{}: bytes [{}, {}) exceed the arena's {} bytes", what,
                      offset, offset + n, size);
  return {};
}

std::optional<loom::DType> to_dtype(loom_type type) {
  return loom::dtype_from_gguf(static_cast<uint32_t>(type));
}

}  // namespace

// ---- internal helpers -------------------------------------------------------------------------------

extern "C" LOOM_API void loom_capi_set_last_error(loom_status status, const char* message) {
  try {
    t_last_error = fmt::format("{}: {}", loom_status_string(status), message ? message : "");
  } catch (...) {
    t_last_error.clear();  // formatting a message can only fail for lack of memory
  }
}

namespace loom::capi {

BufferType& ArenaBuffer::type() const {
  static ArenaBufferType type;
  return type;
}
Status ArenaBuffer::write(size_t offset, const void* src, size_t n) {
  LOOM_TRY(range_check("arena write", offset, n, size_));
  if (n) std::memcpy(static_cast<uint8_t*>(base_) + offset, src, n);
  return {};
}
Status ArenaBuffer::read(size_t offset, void* dst, size_t n) const {
  LOOM_TRY(range_check("arena read", offset, n, size_));
  if (n) std::memcpy(dst, static_cast<const uint8_t*>(base_) + offset, n);
  return {};
}
Status ArenaBuffer::fill(size_t offset, uint8_t value, size_t n) {
  LOOM_TRY(range_check("arena fill", offset, n, size_));
  if (n) std::memset(static_cast<uint8_t*>(base_) + offset, value, n);
  return {};
}

void resolve_view(Tensor* t) {
  if (!t || !t->view_src) return;
  resolve_view(t->view_src);
  const Tensor* src = t->view_src;
  t->buffer = src->data ? src->buffer : nullptr;
  t->data = src->data ? static_cast<uint8_t*>(src->data) + t->view_offset : nullptr;
}

Status place_tensor(loom_context* ctx, Tensor* t) {
  if (t->view_src) {
    resolve_view(t);
    return {};
  }
  if (ctx->no_alloc) return {};
  const size_t offset = align_up(ctx->used, LOOM_TENSOR_ALIGNMENT);
  const size_t n = t->nbytes();
  if (offset > ctx->arena->size() || n > ctx->arena->size() - offset)
    return make_error(StatusCode::out_of_memory,
                      "context arena full: tensor {} needs {} bytes at offset {}, the arena has {} bytes",
                      describe(*t), n, offset, ctx->arena->size());
  t->buffer = ctx->arena.get();
  t->data = static_cast<uint8_t*>(ctx->arena->base()) + offset;
  ctx->used = offset + n;
  return {};
}

}  // namespace loom::capi

loom_context::~loom_context() {
  graphs.clear();
  std::free(owned_memory);
}

bool loom_context::owns(const Tensor* t) const {
  if (!t || t->index < 0) return false;
  const auto i = static_cast<size_t>(t->index);
  const auto& list = t->is_leaf() ? graph.leafs() : graph.nodes();
  return i < list.size() && list[i] == t;
}

void loom_context::fail(const Status& s) {
  graph.fail(s);
  report(s);
}

// ---- status and errors ---------------------------------------------------------------------------------

extern "C" {

LOOM_API const char* loom_status_string(loom_status status) {
  if (status < LOOM_STATUS_OK || status > LOOM_STATUS_INTERNAL) return "unknown";
  return loom::status_code_name(static_cast<StatusCode>(status));
}

LOOM_API const char* loom_last_error(void) { return t_last_error.c_str(); }

LOOM_API void loom_clear_last_error(void) { t_last_error.clear(); }

// ---- types ---------------------------------------------------------------------------------------------

LOOM_API const char* loom_type_name(loom_type type) {
  const auto t = to_dtype(type);
  return t ? loom::dtype_name(*t) : nullptr;
}

LOOM_API int64_t loom_type_block_size(loom_type type) {
  const auto t = to_dtype(type);
  return t ? loom::dtype_block_size(*t) : 0;
}

LOOM_API size_t loom_type_size(loom_type type) {
  const auto t = to_dtype(type);
  return t ? loom::dtype_type_size(*t) : 0;
}

LOOM_API bool loom_type_is_quantized(loom_type type) {
  const auto t = to_dtype(type);
  return t && loom::dtype_is_quantized(*t);
}

LOOM_API size_t loom_row_size(loom_type type, int64_t ne0) {
  return guard_value<size_t>("loom_row_size", 0, [&]() -> size_t {
    const auto t = to_dtype(type);
    if (!t) {
      report(make_error(StatusCode::type_mismatch, "loom_row_size: type id {} is not supported",
                        static_cast<int>(type)));
      return 0;
    }
    if (ne0 < 0 || ne0 % loom::dtype_block_size(*t) != 0) {
      report(make_error(StatusCode::shape_mismatch,
                        "loom_row_size: {} elements are not whole {} blocks of {}", ne0, loom::dtype_name(*t),
                        loom::dtype_block_size(*t)));
      return 0;
    }
    return loom::dtype_row_size(*t, ne0);
  });
}

// ---- contexts ------------------------------------------------------------------------------------------

LOOM_API loom_context* loom_context_create(size_t mem_size) {
  loom_context_params params{};
  params.mem_size = mem_size;
  return loom_context_create_ex(params);
}

LOOM_API loom_context* loom_context_create_ex(loom_context_params params) {
  return guard_value<loom_context*>("loom_context_create", nullptr, [&]() -> loom_context* {
    auto ctx = std::make_unique<loom_context>();
    ctx->no_alloc = params.no_alloc;
    if (params.no_alloc) return ctx.release();
    void* base = params.mem_buffer;
    size_t size = params.mem_size;
    if (base) {
      // start at the first aligned byte of the caller's memory
      const auto addr = reinterpret_cast<uintptr_t>(base);
      const size_t pad = align_up(addr, LOOM_TENSOR_ALIGNMENT) - addr;
      base = static_cast<uint8_t*>(base) + pad;
      size = size > pad ? size - pad : 0;
    } else if (size > 0) {
      ctx->owned_memory = std::aligned_alloc(LOOM_ARENA_ALIGNMENT, align_up(size, LOOM_ARENA_ALIGNMENT));
      if (!ctx->owned_memory) {
        report(make_error(StatusCode::out_of_memory,
                          "loom_context_create: cannot allocate an arena of {} bytes", size));
        return nullptr;
      }
      base = ctx->owned_memory;
    }
    ctx->arena = std::make_unique<ArenaBuffer>(base, size);
    return ctx.release();
  });
}

LOOM_API void loom_context_destroy(loom_context* ctx) { delete ctx; }

LOOM_API void* loom_context_mem_base(const loom_context* ctx) {
  return ctx && ctx->arena ? ctx->arena->base() : nullptr;
}

LOOM_API size_t loom_context_mem_size(const loom_context* ctx) {
  return ctx && ctx->arena ? ctx->arena->size() : 0;
}

LOOM_API size_t loom_context_mem_used(const loom_context* ctx) { return ctx ? ctx->used : 0; }

LOOM_API loom_status loom_context_status(const loom_context* ctx) {
  if (!ctx) return report(null_arg("loom_context_status", "context"));
  return to_c(ctx->graph.status().code());
}

LOOM_API const char* loom_context_error(const loom_context* ctx) {
  return ctx ? ctx->graph.status().message().c_str() : "";
}

LOOM_API loom_buffer* loom_context_alloc_tensors(loom_context* ctx, loom_buffer_type* type) {
  return guard_value<loom_buffer*>("loom_context_alloc_tensors", nullptr, [&]() -> loom_buffer* {
    if (!ctx || !type) {
      report(null_arg("loom_context_alloc_tensors", !ctx ? "context" : "buffer type"));
      return nullptr;
    }
    loom::BufferType& bt = *to_cpp(type);
    const size_t alignment = std::max<size_t>(LOOM_TENSOR_ALIGNMENT, bt.alignment());
    std::vector<std::pair<Tensor*, size_t>> placements;
    size_t total = 0;
    auto plan = [&](const std::vector<Tensor*>& list) {
      for (Tensor* t : list) {
        if (t->data || t->view_src) continue;
        const size_t offset = align_up(total, alignment);
        placements.emplace_back(t, offset);
        total = offset + t->nbytes();
      }
    };
    plan(ctx->graph.leafs());
    plan(ctx->graph.nodes());
    auto buffer = bt.allocate(total);
    if (!buffer.ok()) {
      report(buffer.status());
      return nullptr;
    }
    for (auto& [t, offset] : placements) {
      const Status s = loom::tensor_bind(t, buffer->get(), offset);
      LOOM_ASSERT(s.ok());  // offsets were planned within `total`
    }
    for (Tensor* t : ctx->graph.nodes()) resolve_view(t);
    return to_c(buffer->release());
  });
}

// ---- tensors -------------------------------------------------------------------------------------------

LOOM_API loom_tensor* loom_new_tensor(loom_context* ctx, loom_type type, int n_dims, const int64_t* ne) {
  return guard_value<loom_tensor*>("loom_new_tensor", nullptr, [&]() -> loom_tensor* {
    if (!ctx) {
      report(null_arg("loom_new_tensor", "context"));
      return nullptr;
    }
    if (n_dims < 1 || n_dims > LOOM_MAX_DIMS || !ne) {
      ctx->fail(make_error(StatusCode::invalid_argument, "loom_new_tensor: {} dimensions{}; expected 1 to 4",
                           n_dims, ne ? "" : " with a NULL shape"));
      return nullptr;
    }
    loom::Shape shape{1, 1, 1, 1};
    for (int i = 0; i < n_dims; ++i) shape[i] = ne[i];
    return build_in_context(ctx, [&](loom::Graph& g) {
      const auto dtype = to_dtype(type);
      if (!dtype)
        return g.fail(make_error(StatusCode::type_mismatch, "loom_new_tensor: type id {} is not supported",
                                 static_cast<int>(type)));
      return g.new_tensor(*dtype, shape);
    });
  });
}

LOOM_API loom_tensor* loom_new_tensor_1d(loom_context* ctx, loom_type type, int64_t ne0) {
  return loom_new_tensor(ctx, type, 1, &ne0);
}

LOOM_API loom_tensor* loom_new_tensor_2d(loom_context* ctx, loom_type type, int64_t ne0, int64_t ne1) {
  const int64_t ne[2] = {ne0, ne1};
  return loom_new_tensor(ctx, type, 2, ne);
}

LOOM_API loom_tensor* loom_new_tensor_3d(loom_context* ctx, loom_type type, int64_t ne0, int64_t ne1,
                                         int64_t ne2) {
  const int64_t ne[3] = {ne0, ne1, ne2};
  return loom_new_tensor(ctx, type, 3, ne);
}

LOOM_API loom_tensor* loom_new_tensor_4d(loom_context* ctx, loom_type type, int64_t ne0, int64_t ne1,
                                         int64_t ne2, int64_t ne3) {
  const int64_t ne[4] = {ne0, ne1, ne2, ne3};
  return loom_new_tensor(ctx, type, 4, ne);
}

LOOM_API void* loom_tensor_data(const loom_tensor* t) {
  if (!t) return nullptr;
  Tensor* tc = const_cast<Tensor*>(to_cpp(t));  // a view's address follows its source's binding
  resolve_view(tc);
  return tc->data;
}

LOOM_API int64_t loom_tensor_ne(const loom_tensor* t, int dim) {
  if (!t || dim < 0 || dim >= LOOM_MAX_DIMS) {
    report(make_error(StatusCode::invalid_argument, "loom_tensor_ne: {}",
                      !t ? "NULL tensor" : "dim out of [0, 3]"));
    return 0;
  }
  return to_cpp(t)->ne[dim];
}

LOOM_API size_t loom_tensor_nb(const loom_tensor* t, int dim) {
  if (!t || dim < 0 || dim >= LOOM_MAX_DIMS) {
    report(make_error(StatusCode::invalid_argument, "loom_tensor_nb: {}",
                      !t ? "NULL tensor" : "dim out of [0, 3]"));
    return 0;
  }
  return to_cpp(t)->nb[dim];
}

LOOM_API int64_t loom_tensor_nelements(const loom_tensor* t) { return t ? to_cpp(t)->nelements() : 0; }

LOOM_API size_t loom_tensor_nbytes(const loom_tensor* t) { return t ? to_cpp(t)->nbytes() : 0; }

LOOM_API loom_type loom_tensor_type(const loom_tensor* t) {
  if (!t) {
    report(null_arg("loom_tensor_type", "tensor"));
    return LOOM_TYPE_F32;
  }
  return static_cast<loom_type>(loom::dtype_traits(to_cpp(t)->type).gguf_id);
}

LOOM_API bool loom_tensor_is_contiguous(const loom_tensor* t) { return t && to_cpp(t)->is_contiguous(); }

LOOM_API const char* loom_tensor_op_name(const loom_tensor* t) {
  return t ? loom::op_name(to_cpp(t)->op) : "";
}

LOOM_API loom_tensor* loom_tensor_src(const loom_tensor* t, int i) {
  if (!t || i < 0 || i >= loom::kMaxSrc) return nullptr;
  return to_c(to_cpp(t)->src[i]);
}

LOOM_API loom_tensor* loom_set_name(loom_tensor* t, const char* name) {
  return guard_value<loom_tensor*>("loom_set_name", t, [&] {
    if (t) to_cpp(t)->name = name ? name : "";
    return t;
  });
}

LOOM_API const char* loom_get_name(const loom_tensor* t) { return t ? to_cpp(t)->name.c_str() : ""; }

LOOM_API loom_status loom_tensor_set(loom_tensor* t, const void* src, size_t offset, size_t n) {
  return guard_status("loom_tensor_set", [&]() -> Status {
    if (!t || (!src && n)) return null_arg("loom_tensor_set", !t ? "tensor" : "source");
    resolve_view(to_cpp(t));
    return loom::tensor_write(to_cpp(t), src, offset, n);
  });
}

LOOM_API loom_status loom_tensor_get(const loom_tensor* t, void* dst, size_t offset, size_t n) {
  return guard_status("loom_tensor_get", [&]() -> Status {
    if (!t || (!dst && n)) return null_arg("loom_tensor_get", !t ? "tensor" : "destination");
    resolve_view(const_cast<Tensor*>(to_cpp(t)));
    return loom::tensor_read(to_cpp(t), dst, offset, n);
  });
}

LOOM_API loom_status loom_tensor_set_f32(loom_tensor* t, const float* values, int64_t n) {
  return guard_status("loom_tensor_set_f32", [&]() -> Status {
    if (!t || !values) return null_arg("loom_tensor_set_f32", !t ? "tensor" : "values");
    resolve_view(to_cpp(t));
    return loom::tensor_from_floats(to_cpp(t), values, n);
  });
}

LOOM_API loom_status loom_tensor_get_f32(const loom_tensor* t, float* values, int64_t n) {
  return guard_status("loom_tensor_get_f32", [&]() -> Status {
    if (!t || !values) return null_arg("loom_tensor_get_f32", !t ? "tensor" : "values");
    const Tensor* tc = to_cpp(t);
    if (n != tc->nelements())
      return make_error(StatusCode::shape_mismatch,
                        "loom_tensor_get_f32: tensor {} has {} elements, asked for {}", describe(*tc),
                        tc->nelements(), n);
    resolve_view(const_cast<Tensor*>(tc));
    auto floats = loom::tensor_to_floats(tc);
    if (!floats.ok()) return floats.status();
    std::memcpy(values, floats->data(), floats->size() * sizeof(float));
    return {};
  });
}

LOOM_API loom_status loom_tensor_bind(loom_tensor* t, loom_buffer* buffer, size_t offset) {
  return guard_status("loom_tensor_bind", [&]() -> Status {
    if (!t || !buffer) return null_arg("loom_tensor_bind", !t ? "tensor" : "buffer");
    if (to_cpp(t)->view_src)
      return make_error(
          StatusCode::invalid_argument,
          "loom_tensor_bind: tensor {} is a view (or writes into another tensor): bind its source",
          describe(*to_cpp(t)));
    if (offset % LOOM_TENSOR_ALIGNMENT != 0)
      return make_error(StatusCode::invalid_argument,
                        "loom_tensor_bind: tensor {}: offset {} is not a multiple of {}",
                        describe(*to_cpp(t)), offset, LOOM_TENSOR_ALIGNMENT);
    return loom::tensor_bind(to_cpp(t), to_cpp(buffer), offset);
  });
}

// ---- buffers -------------------------------------------------------------------------------------------

LOOM_API loom_buffer_type* loom_cpu_buffer_type(void) { return to_c(&loom::cpu_buffer_type()); }

LOOM_API const char* loom_buffer_type_name(const loom_buffer_type* type) {
  return type ? to_cpp(type)->name() : "";
}

LOOM_API bool loom_buffer_type_is_host(const loom_buffer_type* type) {
  return type && to_cpp(type)->is_host();
}

LOOM_API size_t loom_buffer_type_alignment(const loom_buffer_type* type) {
  return type ? to_cpp(type)->alignment() : 0;
}

LOOM_API loom_buffer* loom_buffer_type_alloc_buffer(loom_buffer_type* type, size_t size) {
  return guard_value<loom_buffer*>("loom_buffer_type_alloc_buffer", nullptr, [&]() -> loom_buffer* {
    if (!type) {
      report(null_arg("loom_buffer_type_alloc_buffer", "buffer type"));
      return nullptr;
    }
    auto buffer = to_cpp(type)->allocate(size);
    if (!buffer.ok()) {
      report(buffer.status());
      return nullptr;
    }
    return to_c(buffer->release());
  });
}

LOOM_API void loom_buffer_free(loom_buffer* buffer) { delete to_cpp(buffer); }

LOOM_API void* loom_buffer_base(loom_buffer* buffer) { return buffer ? to_cpp(buffer)->base() : nullptr; }

LOOM_API size_t loom_buffer_size(const loom_buffer* buffer) { return buffer ? to_cpp(buffer)->size() : 0; }

LOOM_API loom_buffer_type* loom_buffer_get_type(const loom_buffer* buffer) {
  return buffer ? to_c(&to_cpp(buffer)->type()) : nullptr;
}

LOOM_API loom_status loom_buffer_set(loom_buffer* buffer, const void* src, size_t offset, size_t n) {
  return guard_status("loom_buffer_set", [&]() -> Status {
    if (!buffer || (!src && n)) return null_arg("loom_buffer_set", !buffer ? "buffer" : "source");
    return to_cpp(buffer)->write(offset, src, n);
  });
}

LOOM_API loom_status loom_buffer_get(const loom_buffer* buffer, void* dst, size_t offset, size_t n) {
  return guard_status("loom_buffer_get", [&]() -> Status {
    if (!buffer || (!dst && n)) return null_arg("loom_buffer_get", !buffer ? "buffer" : "destination");
    return to_cpp(buffer)->read(offset, dst, n);
  });
}

}  // extern "C"
