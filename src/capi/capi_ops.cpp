// C ABI: one function per op of include/loom/graph.h. Each checks its handles (NULL, another
// context's tensor), lets the C++ op front end validate shapes and types, and places the result.
#include <initializer_list>

#include "capi_internal.h"

using loom::Graph;
using loom::make_error;
using loom::Shape;
using loom::Status;
using loom::StatusCode;
using namespace loom::capi;

namespace {

struct Operand {
  const char* name;
  loom_tensor* t;
  bool required = true;
};

// The shared body of every op: handle checks, then build_in_context. `build` takes the Graph.
template <typename F>
loom_tensor* make_op(const char* fn, loom_context* ctx, std::initializer_list<Operand> operands, F&& build) {
  return guard_value<loom_tensor*>(fn, nullptr, [&]() -> loom_tensor* {
    if (!ctx) {
      report(make_error(StatusCode::invalid_argument, "{}: context is NULL", fn));
      return nullptr;
    }
    for (const Operand& o : operands) {
      if (!o.t && o.required) {
        // Usually an earlier op failed and its NULL was passed on: say so, the root cause is there.
        const Status& first = ctx->graph.status();
        ctx->fail(make_error(StatusCode::invalid_argument, "{}: operand '{}' is NULL{}{}", fn, o.name,
                             first.ok() ? "" : "; an earlier op failed: ", first.message()));
        return nullptr;
      }
      if (o.t && !ctx->owns(to_cpp(o.t))) {
        ctx->fail(make_error(StatusCode::invalid_argument, "{}: operand '{}' {} belongs to another context",
                             fn, o.name, describe(*to_cpp(o.t))));
        return nullptr;
      }
    }
    return build_in_context(ctx, build);
  });
}

loom::Tensor* cpp(loom_tensor* t) { return to_cpp(t); }

std::array<size_t, loom::kMaxDims> strides_of(const loom_tensor* a, const Shape& ne) {
  return loom::contiguous_strides(to_cpp(a)->type, ne);
}

}  // namespace

extern "C" {

// ---- views -------------------------------------------------------------------------------------------

LOOM_API loom_tensor* loom_view_1d(loom_context* ctx, loom_tensor* a, int64_t ne0, size_t offset) {
  return make_op("loom_view_1d", ctx, {{"a", a}}, [&](Graph& g) {
    const Shape ne{ne0, 1, 1, 1};
    return loom::view(g, cpp(a), ne, strides_of(a, ne), offset);
  });
}

LOOM_API loom_tensor* loom_view_2d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1, size_t nb1,
                                   size_t offset) {
  return make_op("loom_view_2d", ctx, {{"a", a}}, [&](Graph& g) {
    const Shape ne{ne0, ne1, 1, 1};
    const size_t nb2 = nb1 * static_cast<size_t>(ne1);
    return loom::view(g, cpp(a), ne, {0, nb1, nb2, nb2}, offset);
  });
}

LOOM_API loom_tensor* loom_view_3d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1, int64_t ne2,
                                   size_t nb1, size_t nb2, size_t offset) {
  return make_op("loom_view_3d", ctx, {{"a", a}}, [&](Graph& g) {
    const Shape ne{ne0, ne1, ne2, 1};
    return loom::view(g, cpp(a), ne, {0, nb1, nb2, nb2 * static_cast<size_t>(ne2)}, offset);
  });
}

LOOM_API loom_tensor* loom_view_4d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1, int64_t ne2,
                                   int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset) {
  return make_op("loom_view_4d", ctx, {{"a", a}}, [&](Graph& g) {
    return loom::view(g, cpp(a), {ne0, ne1, ne2, ne3}, {0, nb1, nb2, nb3}, offset);
  });
}

LOOM_API loom_tensor* loom_reshape_1d(loom_context* ctx, loom_tensor* a, int64_t ne0) {
  return make_op("loom_reshape_1d", ctx, {{"a", a}}, [&](Graph& g) {
    return loom::reshape(g, cpp(a), {ne0, 1, 1, 1});
  });
}

LOOM_API loom_tensor* loom_reshape_2d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1) {
  return make_op("loom_reshape_2d", ctx, {{"a", a}}, [&](Graph& g) {
    return loom::reshape(g, cpp(a), {ne0, ne1, 1, 1});
  });
}

LOOM_API loom_tensor* loom_reshape_3d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1,
                                      int64_t ne2) {
  return make_op("loom_reshape_3d", ctx, {{"a", a}}, [&](Graph& g) {
    return loom::reshape(g, cpp(a), {ne0, ne1, ne2, 1});
  });
}

LOOM_API loom_tensor* loom_reshape_4d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1,
                                      int64_t ne2, int64_t ne3) {
  return make_op("loom_reshape_4d", ctx, {{"a", a}}, [&](Graph& g) {
    return loom::reshape(g, cpp(a), {ne0, ne1, ne2, ne3});
  });
}

LOOM_API loom_tensor* loom_permute(loom_context* ctx, loom_tensor* a, int ax0, int ax1, int ax2, int ax3) {
  return make_op("loom_permute", ctx, {{"a", a}},
                 [&](Graph& g) { return loom::permute(g, cpp(a), ax0, ax1, ax2, ax3); });
}

LOOM_API loom_tensor* loom_transpose(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_transpose", ctx, {{"a", a}}, [&](Graph& g) { return loom::transpose(g, cpp(a)); });
}

LOOM_API loom_tensor* loom_cont(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_cont", ctx, {{"a", a}}, [&](Graph& g) { return loom::cont(g, cpp(a)); });
}

// ---- compute ops ----------------------------------------------------------------------------------------

LOOM_API loom_tensor* loom_get_rows(loom_context* ctx, loom_tensor* a, loom_tensor* idx) {
  return make_op("loom_get_rows", ctx, {{"a", a}, {"idx", idx}},
                 [&](Graph& g) { return loom::get_rows(g, cpp(a), cpp(idx)); });
}

LOOM_API loom_tensor* loom_add(loom_context* ctx, loom_tensor* a, loom_tensor* b) {
  return make_op("loom_add", ctx, {{"a", a}, {"b", b}},
                 [&](Graph& g) { return loom::add(g, cpp(a), cpp(b)); });
}

LOOM_API loom_tensor* loom_sub(loom_context* ctx, loom_tensor* a, loom_tensor* b) {
  return make_op("loom_sub", ctx, {{"a", a}, {"b", b}},
                 [&](Graph& g) { return loom::sub(g, cpp(a), cpp(b)); });
}

LOOM_API loom_tensor* loom_mul(loom_context* ctx, loom_tensor* a, loom_tensor* b) {
  return make_op("loom_mul", ctx, {{"a", a}, {"b", b}},
                 [&](Graph& g) { return loom::mul(g, cpp(a), cpp(b)); });
}

LOOM_API loom_tensor* loom_div(loom_context* ctx, loom_tensor* a, loom_tensor* b) {
  return make_op("loom_div", ctx, {{"a", a}, {"b", b}},
                 [&](Graph& g) { return loom::div(g, cpp(a), cpp(b)); });
}

LOOM_API loom_tensor* loom_scale(loom_context* ctx, loom_tensor* a, float s) {
  return make_op("loom_scale", ctx, {{"a", a}}, [&](Graph& g) { return loom::scale(g, cpp(a), s, 0.0f); });
}

LOOM_API loom_tensor* loom_scale_bias(loom_context* ctx, loom_tensor* a, float s, float bias) {
  return make_op("loom_scale_bias", ctx, {{"a", a}},
                 [&](Graph& g) { return loom::scale(g, cpp(a), s, bias); });
}

LOOM_API loom_tensor* loom_rms_norm(loom_context* ctx, loom_tensor* a, float eps) {
  return make_op("loom_rms_norm", ctx, {{"a", a}}, [&](Graph& g) { return loom::rms_norm(g, cpp(a), eps); });
}

LOOM_API loom_tensor* loom_norm(loom_context* ctx, loom_tensor* a, float eps) {
  return make_op("loom_norm", ctx, {{"a", a}}, [&](Graph& g) { return loom::norm(g, cpp(a), eps); });
}

LOOM_API loom_tensor* loom_mul_mat(loom_context* ctx, loom_tensor* a, loom_tensor* b) {
  return make_op("loom_mul_mat", ctx, {{"a", a}, {"b", b}},
                 [&](Graph& g) { return loom::mul_mat(g, cpp(a), cpp(b)); });
}

LOOM_API loom_tensor* loom_mul_mat_id(loom_context* ctx, loom_tensor* as, loom_tensor* b, loom_tensor* ids) {
  return make_op("loom_mul_mat_id", ctx, {{"as", as}, {"b", b}, {"ids", ids}},
                 [&](Graph& g) { return loom::mul_mat_id(g, cpp(as), cpp(b), cpp(ids)); });
}

LOOM_API loom_rope_params loom_rope_default_params(int32_t n_dims, loom_rope_mode mode) {
  loom_rope_params p;
  p.n_dims = n_dims;
  p.mode = mode;
  p.n_ctx_orig = 0;
  p.freq_base = 10000.0f;
  p.freq_scale = 1.0f;
  p.ext_factor = 0.0f;
  p.attn_factor = 1.0f;
  p.beta_fast = 32.0f;
  p.beta_slow = 1.0f;
  return p;
}

LOOM_API loom_tensor* loom_rope(loom_context* ctx, loom_tensor* a, loom_tensor* pos,
                                loom_tensor* freq_factors, const loom_rope_params* params) {
  return make_op("loom_rope", ctx, {{"a", a}, {"pos", pos}, {"freq_factors", freq_factors, false}},
                 [&](Graph& g) {
                   if (!params)
                     return g.fail(make_error(StatusCode::invalid_argument, "loom_rope: params is NULL"));
                   loom::RopeParams p{};
                   p.n_dims = params->n_dims;
                   p.mode = static_cast<loom::RopeMode>(params->mode);
                   p.n_ctx_orig = params->n_ctx_orig;
                   p.freq_base = params->freq_base;
                   p.freq_scale = params->freq_scale;
                   p.ext_factor = params->ext_factor;
                   p.attn_factor = params->attn_factor;
                   p.beta_fast = params->beta_fast;
                   p.beta_slow = params->beta_slow;
                   return loom::rope(g, cpp(a), cpp(pos), freq_factors ? cpp(freq_factors) : nullptr, p);
                 });
}

LOOM_API loom_tensor* loom_soft_max(loom_context* ctx, loom_tensor* a, loom_tensor* mask, float scale) {
  return make_op("loom_soft_max", ctx, {{"a", a}, {"mask", mask, false}},
                 [&](Graph& g) { return loom::soft_max(g, cpp(a), mask ? cpp(mask) : nullptr, scale); });
}

LOOM_API loom_tensor* loom_flash_attn(loom_context* ctx, loom_tensor* q, loom_tensor* k, loom_tensor* v,
                                      loom_tensor* mask, float scale, float softcap) {
  return make_op(
      "loom_flash_attn", ctx, {{"q", q}, {"k", k}, {"v", v}, {"mask", mask, false}}, [&](Graph& g) {
        return loom::flash_attn(g, cpp(q), cpp(k), cpp(v), mask ? cpp(mask) : nullptr, scale, softcap);
      });
}

LOOM_API loom_tensor* loom_silu(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_silu", ctx, {{"a", a}}, [&](Graph& g) { return loom::silu(g, cpp(a)); });
}

LOOM_API loom_tensor* loom_gelu(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_gelu", ctx, {{"a", a}}, [&](Graph& g) { return loom::gelu(g, cpp(a)); });
}

LOOM_API loom_tensor* loom_gelu_erf(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_gelu_erf", ctx, {{"a", a}}, [&](Graph& g) { return loom::gelu_erf(g, cpp(a)); });
}

LOOM_API loom_tensor* loom_swiglu(loom_context* ctx, loom_tensor* gate, loom_tensor* up) {
  return make_op("loom_swiglu", ctx, {{"gate", gate}, {"up", up}},
                 [&](Graph& g) { return loom::swiglu(g, cpp(gate), cpp(up)); });
}

LOOM_API loom_tensor* loom_geglu(loom_context* ctx, loom_tensor* gate, loom_tensor* up) {
  return make_op("loom_geglu", ctx, {{"gate", gate}, {"up", up}},
                 [&](Graph& g) { return loom::geglu(g, cpp(gate), cpp(up)); });
}

LOOM_API loom_tensor* loom_softcap(loom_context* ctx, loom_tensor* a, float cap) {
  return make_op("loom_softcap", ctx, {{"a", a}}, [&](Graph& g) { return loom::softcap(g, cpp(a), cap); });
}

LOOM_API loom_tensor* loom_argmax(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_argmax", ctx, {{"a", a}}, [&](Graph& g) { return loom::argmax(g, cpp(a)); });
}

LOOM_API loom_tensor* loom_top_k(loom_context* ctx, loom_tensor* a, int k) {
  return make_op("loom_top_k", ctx, {{"a", a}}, [&](Graph& g) { return loom::top_k(g, cpp(a), k); });
}

LOOM_API loom_tensor* loom_set_rows(loom_context* ctx, loom_tensor* dst, loom_tensor* src, loom_tensor* idx) {
  return make_op("loom_set_rows", ctx, {{"dst", dst}, {"src", src}, {"idx", idx}},
                 [&](Graph& g) { return loom::set_rows(g, cpp(dst), cpp(src), cpp(idx)); });
}

LOOM_API loom_tensor* loom_cpy(loom_context* ctx, loom_tensor* src, loom_tensor* dst) {
  return make_op("loom_cpy", ctx, {{"src", src}, {"dst", dst}},
                 [&](Graph& g) { return loom::cpy(g, cpp(src), cpp(dst)); });
}

LOOM_API loom_tensor* loom_convert(loom_context* ctx, loom_tensor* a, loom_type type) {
  return make_op("loom_convert", ctx, {{"a", a}}, [&](Graph& g) {
    const auto dtype = loom::dtype_from_gguf(static_cast<uint32_t>(type));
    if (!dtype)
      return g.fail(make_error(StatusCode::type_mismatch, "loom_convert: type id {} is not supported",
                               static_cast<int>(type)));
    return loom::convert(g, cpp(a), *dtype);
  });
}

LOOM_API loom_tensor* loom_concat(loom_context* ctx, loom_tensor* a, loom_tensor* b, int dim) {
  return make_op("loom_concat", ctx, {{"a", a}, {"b", b}},
                 [&](Graph& g) { return loom::concat(g, cpp(a), cpp(b), dim); });
}

LOOM_API loom_tensor* loom_sum_rows(loom_context* ctx, loom_tensor* a) {
  return make_op("loom_sum_rows", ctx, {{"a", a}}, [&](Graph& g) { return loom::sum_rows(g, cpp(a)); });
}

}  // extern "C"
