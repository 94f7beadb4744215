// StepBuilder: the graph pieces every LLaMA-family architecture shares.
#include <fmt/format.h>

#include <array>
#include <cmath>

#include "llm_arch.h"
#include "llm_kv_cache.h"

namespace loom::llm::detail {

StepBuilder::StepBuilder(Graph& g, const HParams& hp, const ModelWeights& w, KvCache& kv, RopeMode rope_mode,
                         const StepShape& shape, const StepRange& range, const TensorSplit& split)
    : g_(g), hp_(hp), w_(w), kv_(kv), shape_(shape), split_(split) {
  const int n_layer = static_cast<int>(hp.n_layer);
  layer_end_ = range.layer_end < 0 ? n_layer : range.layer_end;
  layer_begin_ = range.layer_begin;
  LOOM_ASSERT(0 <= layer_begin_ && layer_begin_ <= layer_end_ && layer_end_ <= n_layer);
  // Only the inputs the range reads: every input leaf is written each pass (one block per backend).
  bool any_global = false, any_local = false;
  for (int il = layer_begin_; il < layer_end_; ++il)
    (hp.is_swa(static_cast<uint32_t>(il)) ? any_local : any_global) = true;
  const int64_t t = shape.n_tokens;
  const bool mixed = shape.n_chunk > 0;
  if (mixed)
    LOOM_ASSERT(shape.gather && shape.n_chunk > 1 && shape.n_seqs >= 2 && shape.n_kv_chunk >= 1 &&
                t == shape.n_chunk + shape.n_seqs - 1);
  else
    LOOM_ASSERT(shape.n_seqs >= 1 && t % shape.n_seqs == 0);
  LOOM_ASSERT(shape.gather || shape.n_seqs == 1);
  // The one-token group of a mixed pass uses the inputs of a decode step over its sequences.
  const int64_t n_q = mixed ? 1 : t / shape.n_seqs;
  const int64_t n_group = shape.n_decode();
  if (layer_begin_ == 0) {
    in_.tokens = g.input(DType::i32, {t, 1, 1, 1}, "inp_tokens");
    if (split_.comm) in_.embd_mask = g.input(DType::f32, {1, t, 1, 1}, "inp_embd_mask");
  } else
    in_.hidden = g.input(DType::f32, {hp.n_embd, t, 1, 1}, "inp_hidden");
  if (layer_begin_ < layer_end_) {
    in_.positions = g.input(DType::i32, {t, 1, 1, 1}, "inp_pos");
    in_.kv_cells = g.input(DType::i32, {t, 1, 1, 1}, "inp_kv_cells");
  }
  if (any_global) in_.kq_mask = g.input(DType::f32, {shape.n_kv, n_q, 1, n_group}, "inp_kq_mask");
  // A windowed cache gives local layers their own ring of cells (gathered per sequence by a
  // gathering pass, like the global layers' cells).
  const bool windowed = shape.n_kv_swa > 0;
  LOOM_ASSERT(!windowed || !mixed || shape.n_kv_swa_chunk >= 1);
  if (any_local) {
    in_.kq_mask_swa =
        g.input(DType::f32, {windowed ? shape.n_kv_swa : shape.n_kv, n_q, 1, n_group}, "inp_kq_mask_swa");
    if (windowed && layer_begin_ < layer_end_)
      in_.kv_cells_swa = g.input(DType::i32, {t, 1, 1, 1}, "inp_kv_cells_swa");
    if (windowed && shape.gather && layer_begin_ < layer_end_)
      in_.kv_gather_swa =
          g.input(DType::i32, {static_cast<int64_t>(shape.n_kv_swa) * hp.n_head_kv * n_group, 1, 1, 1},
                  "inp_kv_gather_swa");
  }
  if (shape.gather && layer_begin_ < layer_end_)
    in_.kv_gather = g.input(DType::i32, {static_cast<int64_t>(shape.n_kv) * hp.n_head_kv * n_group, 1, 1, 1},
                            "inp_kv_gather");
  if (mixed) {
    if (any_global)
      in_.kq_mask_chunk = g.input(DType::f32, {shape.n_kv_chunk, shape.n_chunk, 1, 1}, "inp_kq_mask_chunk");
    if (any_local)
      in_.kq_mask_swa_chunk = g.input(
          DType::f32, {windowed ? shape.n_kv_swa_chunk : shape.n_kv_chunk, shape.n_chunk, 1, 1},
          "inp_kq_mask_swa_chunk");
    if (layer_begin_ < layer_end_)
      in_.kv_gather_chunk =
          g.input(DType::i32, {static_cast<int64_t>(shape.n_kv_chunk) * hp.n_head_kv, 1, 1, 1},
                  "inp_kv_gather_chunk");
    if (any_local && windowed && layer_begin_ < layer_end_)
      in_.kv_gather_swa_chunk =
          g.input(DType::i32, {static_cast<int64_t>(shape.n_kv_swa_chunk) * hp.n_head_kv, 1, 1, 1},
                  "inp_kv_gather_swa_chunk");
  }

  rope_ = RopeParams{};
  rope_.n_dims = static_cast<int32_t>(hp.n_rot);
  rope_.mode = rope_mode;
  rope_.n_ctx_orig = static_cast<int32_t>(hp.n_ctx_orig);
  rope_.freq_base = hp.rope_freq_base;
  rope_.freq_scale = hp.rope_scaling == RopeScaling::none ? 1.0f : 1.0f / hp.rope_scaling_factor;
  // YaRN mixes interpolation and extrapolation fully (ext_factor 1) with the paper's beta range.
  rope_.ext_factor = hp.rope_scaling == RopeScaling::yarn ? 1.0f : 0.0f;
  rope_.attn_factor = hp.rope_attn_factor;
  rope_.beta_fast = 32.0f;
  rope_.beta_slow = 1.0f;
  rope_.yarn_unrounded = hp.rope_yarn_unrounded ? 1 : 0;
  rope_swa_ = rope_;
  rope_swa_.freq_base = hp.rope_freq_base_swa;
  if (!hp.swa_rope_scaled) {  // gemma3's local layers: plain RoPE
    rope_swa_.freq_scale = 1.0f;
    rope_swa_.ext_factor = 0.0f;
  }
  // Phi-3 LongRoPE: like llama.cpp, the long factors for a context longer than the original one.
  rope_long_ = w.rope_freqs_long && kv.n_cells() > static_cast<int>(hp.n_ctx_orig);
}

Tensor* StepBuilder::name(Tensor* t, const char* what, int il) {
  if (t) t->name = il < 0 ? std::string(what) : fmt::format("blk.{}.{}", il, what);
  return t;
}

namespace {

// The node inside a named helper: "{outer's name}.{op}".
Tensor* name_inner(Tensor* t, const Tensor* outer) {
  if (t && outer) t->name = fmt::format("{}.{}", outer->name, op_name(t->op));
  return t;
}

}  // namespace

Tensor* StepBuilder::embed() {
  Tensor* rows = get_rows(g_, w_.tok_embd, in_.tokens);
  if (!split_.comm) return name(rows, "inp_embd");
  // each rank's rows of the tokens in its vocabulary slice, zeros for the others': their sum
  return reduce(name(mul(g_, rows, in_.embd_mask), "inp_embd_masked"), "inp_embd");
}

Tensor* StepBuilder::stream_in(float embed_scale) {
  if (layer_begin_ > 0) return in_.hidden;
  return embed_scale == 1.0f ? embed() : name(scale(g_, embed(), embed_scale), "inp_scaled");
}

Tensor* StepBuilder::stream_out(Tensor* x) {
  if (layer_end_ == static_cast<int>(hp_.n_layer)) return logits(x);
  if (x) x->name = "hidden_out";
  return x;
}

Tensor* StepBuilder::rms_norm(Tensor* x, Tensor* weight, const char* what, int il) {
  Tensor* n = loom::rms_norm(g_, x, hp_.norm_rms_eps);
  Tensor* y = name(mul(g_, n, weight), what, il);
  name_inner(n, y);
  return y;
}

Tensor* StepBuilder::linear(Tensor* w, Tensor* x, Tensor* bias, const char* what, int il) {
  Tensor* y = mul_mat(g_, w, x);
  if (!bias) return name(y, what, il);
  Tensor* b = name(add(g_, y, bias), what, il);
  name_inner(y, b);
  return b;
}

Tensor* StepBuilder::reduce(Tensor* x, const char* what, int il) {
  if (!split_.comm || !x) return x;
  return name(all_reduce(g_, x, split_.comm), fmt::format("{}_sum", what).c_str(), il);
}

Tensor* StepBuilder::linear_reduce(Tensor* w, Tensor* x, Tensor* bias, const char* what, int il) {
  if (!split_.comm) return linear(w, x, bias, what, il);
  Tensor* y = reduce(mul_mat(g_, w, x), what, il);
  if (!bias) return y;
  return name(add(g_, y, bias), what, il);
}

Tensor* StepBuilder::split_heads(Tensor* x, int64_t head_dim, int64_t n_heads) {
  return reshape(g_, x, {head_dim, n_heads, shape_.n_tokens, 1});
}

StepBuilder::Qkv StepBuilder::project_qkv(const LayerWeights& l, Tensor* h, int il) {
  const int64_t dk = hp_.head_dim_k, dv = hp_.head_dim_v;
  if (!l.wqkv)
    return {split_heads(linear(l.wq, h, l.bq, "attn_q", il), dk, hp_.n_head),
            split_heads(linear(l.wk, h, l.bk, "attn_k", il), dk, hp_.n_head_kv),
            split_heads(linear(l.wv, h, l.bv, "attn_v", il), dv, hp_.n_head_kv)};
  // One product, then strided views: each token's column holds q, k and v one after the other.
  Tensor* qkv = linear(l.wqkv, h, nullptr, "attn_qkv", il);
  if (!qkv) return {nullptr, nullptr, nullptr};
  const size_t f = sizeof(float), col = qkv->nb[1];
  auto part = [&](int64_t head_dim, int64_t n_heads, int64_t first_row, const char* what) {
    const std::array<size_t, kMaxDims> nb{f, static_cast<size_t>(head_dim) * f, col, col * qkv->ne[1]};
    return name(view(g_, qkv, {head_dim, n_heads, qkv->ne[1], 1}, nb, static_cast<size_t>(first_row) * f),
                what, il);
  };
  const int64_t q_rows = dk * hp_.n_head, k_rows = dk * hp_.n_head_kv;
  return {part(dk, hp_.n_head, 0, "attn_q"), part(dk, hp_.n_head_kv, q_rows, "attn_k"),
          part(dv, hp_.n_head_kv, q_rows + k_rows, "attn_v")};
}

Tensor* StepBuilder::rope(Tensor* x, int il, const char* what) {
  const bool local = hp_.is_swa(static_cast<uint32_t>(il));
  Tensor* freq_factors = rope_long_ ? w_.layers[il].rope_freqs_long : w_.layers[il].rope_freqs;
  LOOM_ASSERT(freq_factors || !w_.rope_freqs);  // the loader gives every layer its copy
  return name(loom::rope(g_, x, in_.positions, freq_factors, local ? rope_swa_ : rope_), what, il);
}

Tensor* StepBuilder::attention(int il, Tensor* q, Tensor* k, Tensor* v) {
  if (!q || !k || !v) return nullptr;
  const bool local = hp_.is_swa(static_cast<uint32_t>(il));
  // Local layers of a windowed cache have their own ring of cells, their own gather rows.
  const bool window_cells = local && shape_.n_kv_swa > 0;
  const int64_t n_kv = window_cells ? shape_.n_kv_swa : shape_.n_kv;
  Tensor* cells = window_cells ? in_.kv_cells_swa : in_.kv_cells;
  Tensor* gather_rows = window_cells ? in_.kv_gather_swa : in_.kv_gather;
  Tensor* cache_k = kv_.k(il, split_.rank);
  Tensor* cache_v = kv_.v(il, split_.rank);
  // Rows go into the cache as [head_dim, n_tokens, n_head_kv], one row per (token, head).
  Tensor* k_stored = name(set_rows(g_, cache_k, permute(g_, k, 0, 2, 1, 3), cells), "k_cache_store", il);
  Tensor* v_stored = name(set_rows(g_, cache_v, permute(g_, v, 0, 2, 1, 3), cells), "v_cache_store", il);
  if (!k_stored || !v_stored) return nullptr;
  Tensor* mask = local ? in_.kq_mask_swa : in_.kq_mask;
  if (shape_.n_chunk == 0) {
    const int64_t n_seqs = shape_.n_seqs;
    return attend(il, q, k_stored, v_stored, mask, gather_rows, n_kv, shape_.n_tokens / n_seqs, n_seqs);
  }
  // Mixed pass: the chunk's queries (the first n_chunk columns) and the one-token sequences' (the
  // rest) attend separately, each group exactly as a pass of its own would, after every token's K
  // and V are stored (the chunk sees its own keys; the others never see the chunk's).
  const int64_t n_chunk = shape_.n_chunk, n_dec = shape_.n_decode();
  Tensor* q_chunk = view(g_, q, {q->ne[0], q->ne[1], n_chunk, 1}, q->nb, 0);
  Tensor* q_dec = view(g_, q, {q->ne[0], q->ne[1], n_dec, 1}, q->nb, static_cast<size_t>(n_chunk) * q->nb[2]);
  Tensor* out_chunk =
      attend(il, q_chunk, k_stored, v_stored, local ? in_.kq_mask_swa_chunk : in_.kq_mask_chunk,
             window_cells ? in_.kv_gather_swa_chunk : in_.kv_gather_chunk,
             window_cells ? shape_.n_kv_swa_chunk : shape_.n_kv_chunk, n_chunk, 1);
  Tensor* out_dec = attend(il, q_dec, k_stored, v_stored, mask, gather_rows, n_kv, 1, n_dec);
  return name(concat(g_, out_chunk, out_dec, 1), "kqv_out_mixed", il);
}

Tensor* StepBuilder::attend(int il, Tensor* q, Tensor* k_stored, Tensor* v_stored, Tensor* mask,
                            Tensor* gather_rows, int64_t n_kv, int64_t n_q, int64_t n_seqs) {
  if (!q || !k_stored || !v_stored) return nullptr;
  const Tensor* cache_k = kv_.k(il, split_.rank);
  const Tensor* cache_v = kv_.v(il, split_.rank);
  const float scale =
      hp_.attn_scale > 0.0f ? hp_.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp_.head_dim_k));
  Tensor *keys = nullptr, *vals = nullptr;
  if (shape_.gather) {
    // Each sequence's slots gathered from the store (a view of it, so the gather is ordered after
    // the write), in position order: a sequence's keys sit at the same slots whatever else the step
    // runs and wherever its blocks are, so attention sums them in the same order (batch invariance).
    auto gathered = [&](Tensor* stored, const Tensor* cache, const char* what) {
      const size_t row = cache->nb[1], n_rows = static_cast<size_t>(cache->ne[1] * cache->ne[2]);
      Tensor* rows = view(g_, stored, {cache->ne[0], cache->ne[1] * cache->ne[2], 1, 1},
                          {cache->nb[0], row, row * n_rows, row * n_rows}, 0);
      Tensor* got = name(get_rows(g_, rows, gather_rows), what, il);  // f32 [d, n_kv * n_head_kv * n_seqs]
      got = reshape(g_, got, {cache->ne[0], n_kv, cache->ne[2], n_seqs});
      // A prompt chunk of kTileQueries or more queries attends over the gathered rows as f16 again,
      // the cache's own values (the round trip through f32 is exact), so that a backend's tensor-core
      // attention, which takes f16 K/V, applies: on CUDA the fast mode's flash_attn over a 128-token
      // chunk of a mixed serving step took 186 us a layer through the generic kernel (8B, H200).
      // Fewer queries keep the f32 rows: CUDA's fusion then turns the gathers and the attention into
      // one gathered flash-decoding dispatch that reads the cache's f16 rows itself.
      constexpr int64_t kTileQueries = 16;  // CUDA's tensor-core attention: kFlashAttnMmaMinQueries
      if (n_q >= kTileQueries && cache->type == DType::f16) got = name(convert(g_, got, DType::f16), what, il);
      return got;
    };
    keys = gathered(k_stored, cache_k, "k_gathered");
    vals = gathered(v_stored, cache_v, "v_gathered");
  } else {
    // Views of the stores (not of the cache leafs), so attention is ordered after the writes.
    keys = view(g_, k_stored, {cache_k->ne[0], n_kv, cache_k->ne[2], 1}, k_stored->nb, 0);
    vals = view(g_, v_stored, {cache_v->ne[0], n_kv, cache_v->ne[2], 1}, v_stored->nb, 0);
  }
  if (n_seqs > 1 && !q->is_contiguous()) q = cont(g_, q);
  Tensor* qs = n_seqs == 1 ? permute(g_, q, 0, 2, 1, 3)  // [d, n_q, H]
                           : permute(g_, reshape(g_, q, {q->ne[0], q->ne[1], n_q, n_seqs}), 0, 2, 1,
                                     3);  // [d, n_q, H, S]
  Tensor* out = name(flash_attn(g_, qs, keys, vals, mask, scale, hp_.attn_softcap, w_.layers[il].attn_sinks),
                     "kqv_out", il);  // [dv, H, n_q, S]
  return reshape(g_, out, {static_cast<int64_t>(hp_.head_dim_v) * hp_.n_head, n_q * n_seqs, 1, 1});
}

Tensor* StepBuilder::ffn_swiglu(const LayerWeights& l, Tensor* x, int il) {
  if (l.ffn_gate_up) {  // gate rows, then up rows: two views of one product
    Tensor* gu = linear(l.ffn_gate_up, x, nullptr, "ffn_gate_up", il);
    if (!gu) return nullptr;
    const int64_t n_ff = gu->ne[0] / 2;
    Tensor* gate = name(view(g_, gu, {n_ff, gu->ne[1], 1, 1}, gu->nb, 0), "ffn_gate", il);
    Tensor* up =
        name(view(g_, gu, {n_ff, gu->ne[1], 1, 1}, gu->nb, static_cast<size_t>(n_ff) * sizeof(float)),
             "ffn_up", il);
    return linear_reduce(l.ffn_down, name(swiglu(g_, gate, up), "ffn_glu", il), nullptr, "ffn_down", il);
  }
  Tensor* h =
      swiglu(g_, linear(l.ffn_gate, x, nullptr, "ffn_gate", il), linear(l.ffn_up, x, nullptr, "ffn_up", il));
  return linear_reduce(l.ffn_down, name(h, "ffn_glu", il), nullptr, "ffn_down", il);
}

Tensor* StepBuilder::ffn_geglu(const LayerWeights& l, Tensor* x, int il) {
  Tensor* h =
      geglu(g_, linear(l.ffn_gate, x, nullptr, "ffn_gate", il), linear(l.ffn_up, x, nullptr, "ffn_up", il));
  return linear_reduce(l.ffn_down, name(h, "ffn_glu", il), nullptr, "ffn_down", il);
}

Tensor* StepBuilder::ffn_moe(const LayerWeights& l, Tensor* x, int il) {
  if (!x) return nullptr;
  const int64_t n_embd = x->ne[0], n_tokens = x->ne[1];
  const int64_t n_expert = hp_.n_expert, n_used = hp_.n_expert_used;
  Tensor* logits = linear(l.ffn_gate_inp, x, l.ffn_gate_inp_b, "ffn_moe_logits", il);  // [n_expert, T]
  Tensor* weights = nullptr;
  Tensor* ids = nullptr;
  if (hp_.expert_softmax_topk) {
    // gpt-oss: the top logits, softmaxed among themselves (each token's logits gathered as rows of one
    // element, as the probabilities are below)
    ids = name(top_k(g_, logits, static_cast<int>(n_used)), "ffn_moe_topk", il);  // i32 [n_used, T]
    Tensor* chosen = name(get_rows(g_, reshape(g_, logits, {1, n_expert, n_tokens, 1}), ids),
                          "ffn_moe_logits_topk", il);  // [1, n_used, T]
    weights = name(soft_max(g_, reshape(g_, chosen, {n_used, n_tokens, 1, 1}), nullptr, 1.0f),
                   "ffn_moe_weights", il);
    weights = reshape(g_, weights, {1, n_used, n_tokens, 1});
  } else {
    Tensor* probs = name(soft_max(g_, logits, nullptr, 1.0f), "ffn_moe_probs", il);  // [n_expert, T]
    ids = name(top_k(g_, probs, static_cast<int>(n_used)), "ffn_moe_topk", il);      // i32 [n_used, T]
    // The chosen experts' probabilities: each token's probabilities become rows of one element, so
    // get_rows with that token's ids gathers them without leaving the device.
    weights = name(get_rows(g_, reshape(g_, probs, {1, n_expert, n_tokens, 1}), ids), "ffn_moe_weights",
                   il);  // [1, n_used, T]
  }
  if (hp_.expert_weights_norm) {
    Tensor* w2 = reshape(g_, weights, {n_used, n_tokens, 1, 1});
    Tensor* sum = name(sum_rows(g_, w2), "ffn_moe_weights_sum", il);
    w2 = name(div(g_, w2, sum), "ffn_moe_weights_norm", il);  // [n_used, T] / [1, T]
    weights = reshape(g_, w2, {1, n_used, n_tokens, 1});
  }
  Tensor* xe = reshape(g_, x, {n_embd, 1, n_tokens, 1});  // every selected expert reads the same row
  // A chosen expert's bias row (bias [m, n_expert]) added to its product [m, n_used, T]: the rows
  // gathered by the flattened ids (llama.cpp's add_id as get_rows + add).
  auto expert_bias = [&](Tensor* y, Tensor* bias, const char* what) {
    if (!bias || !y || !ids) return y;
    Tensor* flat_ids = reshape(g_, ids, {n_used * n_tokens, 1, 1, 1});
    Tensor* rows = get_rows(g_, bias, flat_ids);  // [m, n_used * T]
    return name(add(g_, y, reshape(g_, rows, {y->ne[0], n_used, n_tokens, 1})), what, il);
  };
  Tensor* gate = name(mul_mat_id(g_, l.ffn_gate_exps, xe, ids), "ffn_moe_gate", il);  // [n_ff_exp, n_used, T]
  gate = expert_bias(gate, l.ffn_gate_exps_b, "ffn_moe_gate_biased");
  Tensor* up = name(mul_mat_id(g_, l.ffn_up_exps, xe, ids), "ffn_moe_up", il);
  up = expert_bias(up, l.ffn_up_exps_b, "ffn_moe_up_biased");
  Tensor* glu = hp_.swiglu_oai_limit > 0.0f
                    ? swiglu_oai(g_, gate, up, hp_.swiglu_oai_alpha, hp_.swiglu_oai_limit)
                    : swiglu(g_, gate, up);
  glu = name(glu, "ffn_moe_glu", il);
  Tensor* down = name(mul_mat_id(g_, l.ffn_down_exps, glu, ids), "ffn_moe_down", il);  // [n_embd, n_used, T]
  // Split over tensor-parallel ranks, each rank's down product is a partial sum: the bias joins it
  // on rank 0 only, so the all-reduce below adds it once.
  if (split_.rank == 0) down = expert_bias(down, l.ffn_down_exps_b, "ffn_moe_down_biased");
  down = name(mul(g_, down, weights), "ffn_moe_weighted", il);
  // Sum over the experts: with the expert dim innermost (a strided view), one sum_rows reduces it.
  Tensor* sum = name(sum_rows(g_, permute(g_, down, 1, 0, 2, 3)), "ffn_moe_out", il);  // [1, n_embd, T]
  return reduce(reshape(g_, sum, {n_embd, n_tokens, 1, 1}), "ffn_moe_out", il);
}

Tensor* StepBuilder::select_outputs(Tensor* x) {
  if (!x || shape_.all_outputs || x->ne[1] == 1) return x;
  if (shape_.n_chunk > 0) {                     // the chunk's last row, then the one-token sequences' rows
    if (x->ne[1] != shape_.n_tokens) return x;  // selected already
    return view(g_, x, {x->ne[0], shape_.n_seqs, 1, 1}, x->nb,
                x->nb[1] * static_cast<size_t>(shape_.n_chunk - 1));
  }
  if (shape_.n_seqs > 1) {
    if (x->ne[1] != shape_.n_tokens || shape_.n_tokens == shape_.n_seqs) return x;  // one row each already
    // several sequences' equal runs of tokens (packed prompts): the last row of each run
    const auto n_q = static_cast<size_t>(shape_.n_tokens / shape_.n_seqs);
    std::array<size_t, 4> nb = x->nb;
    nb[1] = x->nb[1] * n_q;
    nb[2] = nb[3] = nb[1] * static_cast<size_t>(shape_.n_seqs);
    return cont(g_, view(g_, x, {x->ne[0], shape_.n_seqs, 1, 1}, nb, x->nb[1] * (n_q - 1)));
  }
  return view(g_, x, {x->ne[0], 1, 1, 1}, x->nb, x->nb[1] * static_cast<size_t>(x->ne[1] - 1));
}

Tensor* StepBuilder::logits(Tensor* x) {
  Tensor* h = rms_norm(select_outputs(x), w_.output_norm, "result_norm");
  if (hp_.final_softcap <= 0.0f) return linear(w_.output, h, nullptr, "result_output");
  Tensor* y = name(softcap(g_, mul_mat(g_, w_.output, h), hp_.final_softcap), "result_output");
  name_inner(y ? y->src[0] : nullptr, y);
  return y;
}

}  // namespace loom::llm::detail
