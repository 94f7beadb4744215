/* Test of Loom's C ABI, compiled as C11.
 *
 * CPU half (always): builds a small transformer-like graph through loom.h (rms_norm * weight, mul_mat
 * with f32 and q8_0 weights, rope, soft_max with a mask, silu, add, views), computes it on the CPU and
 * checks every result against a double-precision computation written here; then the backend API,
 * graphs as node subsets, no_alloc contexts, and the error paths (NULL and a message, never abort).
 *
 * CUDA half (when built with LOOM_TEST_CAPI_CUDA): the seed interface of loom-cuda.h -- map the
 * context's arena, compute the same graph on the GPU, compare with the CPU -- plus its error paths,
 * abort callback, trace capture and the CUDA backend API. Without a usable device it prints why and
 * exits with 77, which CTest reports as skipped.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#ifdef LOOM_TEST_CAPI_CUDA
#include "loom-cuda.h"
#endif

#include "capi_check.h"

/* Normalised mean squared error sum((a-r)^2)/sum(r^2); NaN or infinity never passes. */
static double nmse(const float* a, const double* ref, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!isfinite(a[i])) return INFINITY;
    const double d = (double)a[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? num / den : num;
}

#define CHECK_NMSE(err, limit)                                                                 \
  do {                                                                                         \
    const double e_ = (err);                                                                   \
    ++g_checks;                                                                                \
    if (!(e_ < (limit))) {                                                                     \
      fprintf(stderr, "FAIL %s:%d: NMSE of %s = %g, limit %g\n", __FILE__, __LINE__, #err, e_, \
              (double)(limit));                                                                \
      ++g_failures;                                                                            \
    }                                                                                          \
  } while (0)

/* Deterministic values in [-1, 1). */
static uint32_t g_rng = 1;
static float rnd(void) {
  g_rng = g_rng * 1664525u + 1013904223u;
  return (float)((g_rng >> 8) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* ---- the model ------------------------------------------------------------------------------------ */

enum { E = 64, T = 4, F = 96, D = 16, H = 4 }; /* embedding, tokens, ffn, head size, heads (H*D = E) */
static const float kEps = 1e-5f;
static const float kSoftMaxScale = 0.5f;

typedef struct Model {
  loom_tensor *x, *g, *w1, *wq, *pos, *mask;    /* leafs */
  loom_tensor *h, *a, *q, *qr, *sm, *act, *out; /* results */
} Model;

static void build_model(loom_context* ctx, Model* m) {
  m->x = loom_set_name(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, E, T), "x");
  m->g = loom_set_name(loom_new_tensor_1d(ctx, LOOM_TYPE_F32, E), "norm.weight");
  m->w1 = loom_set_name(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, E, F), "w1");
  m->wq = loom_set_name(loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, E, E), "wq");
  m->pos = loom_set_name(loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T), "pos");
  m->mask = loom_set_name(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, F, T), "mask");
  m->h = loom_set_name(loom_mul(ctx, loom_rms_norm(ctx, m->x, kEps), m->g), "h");
  m->a = loom_set_name(loom_mul_mat(ctx, m->w1, m->h), "a");
  m->q = loom_set_name(loom_mul_mat(ctx, m->wq, m->h), "q");
  const loom_rope_params rp = loom_rope_default_params(D, LOOM_ROPE_NEOX);
  m->qr = loom_set_name(loom_rope(ctx, loom_reshape_3d(ctx, m->q, D, H, T), m->pos, NULL, &rp), "q_rope");
  m->sm = loom_set_name(loom_soft_max(ctx, m->a, m->mask, kSoftMaxScale), "probs");
  m->act = loom_set_name(loom_silu(ctx, m->a), "act");
  m->out = loom_set_name(loom_add(ctx, m->act, m->sm), "out");
}

/* Host copies of the inputs, kept for the double-precision reference. */
typedef struct Inputs {
  float x[T][E], g[E], w1[F][E], wq[E][E], mask[T][F];
  int32_t pos[T];
} Inputs;

static void make_inputs(Inputs* in, uint32_t seed) {
  g_rng = seed;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < E; ++i) in->x[t][i] = 2.0f * rnd();
  for (int i = 0; i < E; ++i) in->g[i] = 1.0f + 0.5f * rnd();
  for (int f = 0; f < F; ++f)
    for (int i = 0; i < E; ++i) in->w1[f][i] = 0.3f * rnd();
  for (int r = 0; r < E; ++r)
    for (int i = 0; i < E; ++i) in->wq[r][i] = 0.3f * rnd();
  for (int t = 0; t < T; ++t) {
    in->pos[t] = 3 * t + (int32_t)(seed % 5);
    for (int f = 0; f < F; ++f) in->mask[t][f] = f > 24 * (t + 1) ? -INFINITY : 0.0f;
  }
}

/* Writes the inputs through loom.h: works whatever memory the tensors are in. */
static void set_inputs(const Model* m, const Inputs* in) {
  CHECK_OK(loom_tensor_set_f32(m->x, &in->x[0][0], E * T));
  CHECK_OK(loom_tensor_set_f32(m->g, in->g, E));
  CHECK_OK(loom_tensor_set_f32(m->w1, &in->w1[0][0], E * F));
  CHECK_OK(loom_tensor_set_f32(m->wq, &in->wq[0][0], E * E)); /* quantized to q8_0 here */
  CHECK_OK(loom_tensor_set(m->pos, in->pos, 0, sizeof in->pos));
  CHECK_OK(loom_tensor_set_f32(m->mask, &in->mask[0][0], F * T));
}

/* Double-precision results of the model. */
typedef struct Reference {
  double h[T][E], a[T][F], q[T][E], qr[T][E], sm[T][F], out[T][F];
} Reference;

static void reference(const Inputs* in, const float* wq_dequantized, Reference* r) {
  for (int t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int i = 0; i < E; ++i) ss += (double)in->x[t][i] * in->x[t][i];
    const double inv = 1.0 / sqrt(ss / E + kEps);
    for (int i = 0; i < E; ++i) r->h[t][i] = in->x[t][i] * inv * in->g[i];
    for (int f = 0; f < F; ++f) {
      double s = 0.0;
      for (int i = 0; i < E; ++i) s += (double)in->w1[f][i] * r->h[t][i];
      r->a[t][f] = s;
    }
    /* q8_0 weights: the reference uses the values they actually hold */
    for (int o = 0; o < E; ++o) {
      double s = 0.0;
      for (int i = 0; i < E; ++i) s += (double)wq_dequantized[o * E + i] * r->h[t][i];
      r->q[t][o] = s;
    }
    /* NeoX rope: pairs (i, i + D/2) of each head turn by pos * 10000^(-2i/D) */
    for (int hd = 0; hd < H; ++hd)
      for (int i = 0; i < D / 2; ++i) {
        const double theta = in->pos[t] * pow(10000.0, -2.0 * i / D);
        const double x0 = r->q[t][hd * D + i], x1 = r->q[t][hd * D + i + D / 2];
        r->qr[t][hd * D + i] = x0 * cos(theta) - x1 * sin(theta);
        r->qr[t][hd * D + i + D / 2] = x0 * sin(theta) + x1 * cos(theta);
      }
    double mx = -INFINITY, sum = 0.0;
    for (int f = 0; f < F; ++f) mx = fmax(mx, r->a[t][f] * kSoftMaxScale + in->mask[t][f]);
    for (int f = 0; f < F; ++f) sum += exp(r->a[t][f] * kSoftMaxScale + in->mask[t][f] - mx);
    for (int f = 0; f < F; ++f) {
      r->sm[t][f] = exp(r->a[t][f] * kSoftMaxScale + in->mask[t][f] - mx) / sum;
      r->out[t][f] = r->a[t][f] / (1.0 + exp(-r->a[t][f])) + r->sm[t][f];
    }
  }
}

/* Reads an f32 result (any memory) into a new array. */
static float* read_f32(const loom_tensor* t) {
  const int64_t n = loom_tensor_nelements(t);
  float* v = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; ++i) v[i] = NAN;
  CHECK_OK(loom_tensor_get_f32(t, v, n));
  return v;
}

/* Checks the results of a model against the reference. */
static void check_model(const Model* m, const Reference* r, const char* where) {
  float* h = read_f32(m->h);
  float* a = read_f32(m->a);
  float* q = read_f32(m->q);
  float* qr = read_f32(m->qr);
  float* sm = read_f32(m->sm);
  float* out = read_f32(m->out);
  printf("  %s: NMSE h %.2e  a %.2e  q(q8_0) %.2e  rope %.2e  soft_max %.2e  out %.2e\n", where,
         nmse(h, &r->h[0][0], E * T), nmse(a, &r->a[0][0], F * T), nmse(q, &r->q[0][0], E * T),
         nmse(qr, &r->qr[0][0], E * T), nmse(sm, &r->sm[0][0], F * T), nmse(out, &r->out[0][0], F * T));
  CHECK_NMSE(nmse(h, &r->h[0][0], E * T), 1e-10);
  CHECK_NMSE(nmse(a, &r->a[0][0], F * T), 1e-10);
  /* the CPU quantizes activations to 8 bits for q8_0 products: about 1e-5 expected */
  CHECK_NMSE(nmse(q, &r->q[0][0], E * T), 1e-3);
  CHECK_NMSE(nmse(qr, &r->qr[0][0], E * T), 1e-3);
  CHECK_NMSE(nmse(sm, &r->sm[0][0], F * T), 1e-10);
  CHECK_NMSE(nmse(out, &r->out[0][0], F * T), 1e-10);
  free(h);
  free(a);
  free(q);
  free(qr);
  free(sm);
  free(out);
}

static float* dequantized_wq(const Model* m) { return read_f32(m->wq); }

/* ---- CPU half -------------------------------------------------------------------------------------- */

static void test_types(void) {
  CHECK(strcmp(loom_status_string(LOOM_STATUS_SHAPE_MISMATCH), "shape_mismatch") == 0);
  CHECK(strcmp(loom_status_string((loom_status)99), "unknown") == 0);
  CHECK(loom_type_size(LOOM_TYPE_Q8_0) == 34 && loom_type_block_size(LOOM_TYPE_Q8_0) == 32);
  CHECK(loom_type_size(LOOM_TYPE_Q4_K) == 144 && loom_type_block_size(LOOM_TYPE_Q4_K) == 256);
  CHECK(strcmp(loom_type_name(LOOM_TYPE_BF16), "bf16") == 0);
  CHECK(loom_type_name((loom_type)21) == NULL); /* GGUF's iq3_s: not supported */
  CHECK(strcmp(loom_type_name(LOOM_TYPE_Q5_K), "q5_K") == 0 && loom_type_size(LOOM_TYPE_Q5_K) == 176);
  CHECK(loom_type_is_quantized(LOOM_TYPE_Q6_K) && !loom_type_is_quantized(LOOM_TYPE_F16));
  CHECK(loom_row_size(LOOM_TYPE_Q8_0, 64) == 68);
  loom_clear_last_error();
  CHECK(loom_row_size(LOOM_TYPE_Q8_0, 30) == 0);
  CHECK_CONTAINS(loom_last_error(), "blocks");
}

static void test_model_cpu(void) {
  printf("model on the CPU\n");
  loom_context* ctx = loom_context_create(1 << 20);
  CHECK(ctx != NULL);
  CHECK((uintptr_t)loom_context_mem_base(ctx) % LOOM_ARENA_ALIGNMENT == 0);
  CHECK(loom_context_mem_used(ctx) == 0);
  Model m;
  build_model(ctx, &m);
  CHECK(loom_context_status(ctx) == LOOM_STATUS_OK);
  CHECK(m.out != NULL && m.qr != NULL);
  /* every tensor, op results included, has host memory in the arena */
  const char* base = loom_context_mem_base(ctx);
  const char* end = base + loom_context_mem_size(ctx);
  const loom_tensor* all[] = {m.x, m.g, m.w1, m.wq, m.pos, m.mask, m.h, m.a, m.q, m.qr, m.sm, m.act, m.out};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
    const char* p = loom_tensor_data(all[i]);
    CHECK(p >= base && p + loom_tensor_nbytes(all[i]) <= end);
    CHECK((uintptr_t)p % LOOM_TENSOR_ALIGNMENT == 0);
  }
  CHECK(loom_context_mem_used(ctx) >= (E * T + E + E * F + F * T) * 4 + 68 * E);
  CHECK(loom_tensor_ne(m.qr, 0) == D && loom_tensor_ne(m.qr, 1) == H && loom_tensor_ne(m.qr, 2) == T);
  CHECK(loom_tensor_nb(m.wq, 1) == 68 && loom_tensor_type(m.wq) == LOOM_TYPE_Q8_0);
  CHECK(strcmp(loom_tensor_op_name(m.a), "mul_mat") == 0 && loom_tensor_src(m.a, 0) == m.w1);
  CHECK(strcmp(loom_get_name(m.out), "out") == 0);

  Inputs in;
  make_inputs(&in, 7);
  set_inputs(&m, &in);
  /* the host pointer is the tensor's memory: what loom_tensor_set wrote is there */
  CHECK(((const float*)loom_tensor_data(m.x))[5] == in.x[0][5]);

  loom_graph* gf = loom_graph_new(ctx);
  CHECK_OK(loom_graph_build_forward_expand(gf, m.qr));
  CHECK_OK(loom_graph_build_forward_expand(gf, m.out));
  CHECK(loom_graph_n_leafs(gf) == 6);
  /* rms_norm, mul, 2 mul_mat, reshape view, rope, soft_max, silu, add */
  CHECK(loom_graph_n_nodes(gf) == 9);
  CHECK(loom_graph_node(gf, -1) == m.out && loom_graph_node(gf, 0) != NULL);
  CHECK(loom_graph_node(gf, 9) == NULL && loom_graph_node(gf, -10) == NULL);
  CHECK_OK(loom_graph_compute_cpu(gf, 2));

  Reference* ref = malloc(sizeof *ref);
  float* wq = dequantized_wq(&m);
  reference(&in, wq, ref);
  check_model(&m, ref, "cpu, 2 threads");

  /* A graph is the subset of nodes its outputs need: computing h runs 2 nodes and leaves `out` alone. */
  const size_t out_bytes = loom_tensor_nbytes(m.out);
  memset(loom_tensor_data(m.out), 0xFF, out_bytes); /* NaN */
  memset(loom_tensor_data(m.h), 0xFF, loom_tensor_nbytes(m.h));
  loom_graph* gh = loom_graph_build(ctx, m.h);
  CHECK(gh != NULL && loom_graph_n_nodes(gh) == 2 && loom_graph_n_leafs(gh) == 2);
  CHECK_OK(loom_graph_compute_cpu(gh, 1));
  CHECK(isnan(((const float*)loom_tensor_data(m.out))[0]));
  float* h = read_f32(m.h);
  CHECK_NMSE(nmse(h, &ref->h[0][0], E * T), 1e-10);
  free(h);

  /* The backend API on the CPU gives the same results. */
  loom_backend* cpu = loom_backend_cpu_init(1);
  CHECK(cpu != NULL && strcmp(loom_backend_name(cpu), "cpu") == 0);
  CHECK(loom_buffer_type_is_host(loom_backend_get_buffer_type(cpu)));
  CHECK(loom_backend_supports_op(cpu, m.q));
  CHECK_OK(loom_backend_graph_compute(cpu, gf));
  check_model(&m, ref, "cpu backend, 1 thread");
  loom_backend_free(cpu);
  loom_backend* by_name = loom_backend_init_by_name("cpu", 0, 1);
  CHECK(by_name != NULL);
  loom_backend_free(by_name);
  /* numerics: the CPU accepts both modes; an unknown mode is an error */
  loom_backend* fast_cpu = loom_backend_init_ex("cpu", 0, 1, LOOM_NUMERICS_FAST);
  CHECK(fast_cpu != NULL && loom_backend_numerics(fast_cpu) == LOOM_NUMERICS_FAST);
  CHECK_OK(loom_backend_graph_compute(fast_cpu, gf));
  check_model(&m, ref, "cpu backend, fast numerics");
  loom_backend_free(fast_cpu);
  loom_backend* exact_cpu = loom_backend_init_ex("cpu", 0, 1, LOOM_NUMERICS_EXACT);
  CHECK(exact_cpu != NULL && loom_backend_numerics(exact_cpu) == LOOM_NUMERICS_EXACT);
  loom_backend_free(exact_cpu);
  CHECK(loom_backend_init_ex("cpu", 0, 1, (loom_numerics)7) == NULL);
  CHECK(strstr(loom_last_error(), "numerics") != NULL);

  /* views: cont(transpose(x)) is x transposed */
  loom_tensor* xt = loom_cont(ctx, loom_transpose(ctx, m.x));
  loom_tensor* row2 = loom_view_1d(ctx, m.x, E, 2 * loom_tensor_nb(m.x, 1));
  loom_tensor* row2_scaled = loom_scale_bias(ctx, row2, 2.0f, 1.0f);
  loom_graph* gv = loom_graph_build(ctx, xt);
  CHECK_OK(loom_graph_build_forward_expand(gv, row2_scaled));
  CHECK_OK(loom_graph_compute_cpu(gv, 2));
  CHECK(loom_tensor_ne(xt, 0) == T && loom_tensor_ne(xt, 1) == E && loom_tensor_is_contiguous(xt));
  const float* xtd = loom_tensor_data(xt);
  const float* r2 = loom_tensor_data(row2_scaled);
  int mismatches = 0;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < E; ++i) mismatches += xtd[i * T + t] != in.x[t][i];
  for (int i = 0; i < E; ++i) mismatches += fabsf(r2[i] - (2.0f * in.x[2][i] + 1.0f)) > 1e-6f;
  CHECK(mismatches == 0);

  free(wq);
  free(ref);
  loom_context_destroy(ctx);
}

/* A no_alloc context whose tensors are placed afterwards in a buffer of the CPU's type. */
static void test_no_alloc_cpu(void) {
  printf("no_alloc context on the CPU\n");
  loom_context_params params = {0, NULL, true};
  loom_context* ctx = loom_context_create_ex(params);
  Model m;
  build_model(ctx, &m);
  CHECK(loom_context_status(ctx) == LOOM_STATUS_OK);
  CHECK(loom_tensor_data(m.x) == NULL && loom_context_mem_base(ctx) == NULL);
  loom_graph* gf = loom_graph_build(ctx, m.out);
  CHECK_OK(loom_graph_build_forward_expand(gf, m.qr));
  loom_clear_last_error();
  CHECK(loom_graph_compute_cpu(gf, 1) == LOOM_STATUS_INVALID_ARGUMENT); /* nothing has memory yet */
  CHECK_CONTAINS(loom_last_error(), "not in host memory");
  CHECK(loom_tensor_set_f32(m.x, (const float[E * T]){0}, E * T) == LOOM_STATUS_INVALID_ARGUMENT);

  loom_buffer* buf = loom_context_alloc_tensors(ctx, loom_cpu_buffer_type());
  CHECK(buf != NULL && loom_buffer_size(buf) >= (size_t)(E * T + E + E * F + F * T) * 4);
  CHECK(strcmp(loom_buffer_type_name(loom_buffer_get_type(buf)), "cpu") == 0);
  const char* b = loom_buffer_base(buf);
  CHECK((const char*)loom_tensor_data(m.qr) >= b &&
        (const char*)loom_tensor_data(m.qr) < b + loom_buffer_size(buf));
  Inputs in;
  make_inputs(&in, 11);
  set_inputs(&m, &in);
  CHECK_OK(loom_graph_compute_cpu(gf, 3));
  Reference* ref = malloc(sizeof *ref);
  float* wq = dequantized_wq(&m);
  reference(&in, wq, ref);
  check_model(&m, ref, "no_alloc + cpu buffer");
  free(wq);
  free(ref);
  loom_context_destroy(ctx);
  loom_buffer_free(buf);
}

static void test_errors(void) {
  printf("error paths\n");
  loom_context* ctx = loom_context_create(1 << 16);
  loom_tensor* x = loom_set_name(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 4), "x");
  loom_tensor* y = loom_set_name(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 7, 3), "y");
  CHECK(x != NULL && y != NULL && loom_context_status(ctx) == LOOM_STATUS_OK);

  /* wrong shapes: NULL, the context keeps the first error, the thread's last error says why */
  loom_clear_last_error();
  CHECK(loom_add(ctx, x, y) == NULL);
  CHECK(loom_context_status(ctx) == LOOM_STATUS_SHAPE_MISMATCH);
  CHECK_CONTAINS(loom_context_error(ctx), "add");
  CHECK_CONTAINS(loom_context_error(ctx), "'y'");
  CHECK_CONTAINS(loom_last_error(), "shape_mismatch");
  /* a later, different failure: its own message in the last error, the first one in the context */
  CHECK(loom_mul_mat(ctx, y, x) == NULL);
  CHECK_CONTAINS(loom_last_error(), "mul_mat");
  CHECK_CONTAINS(loom_context_error(ctx), "add");
  /* passing the NULL on: NULL again, pointing at the earlier failure */
  CHECK(loom_silu(ctx, loom_add(ctx, x, y)) == NULL);
  CHECK_CONTAINS(loom_last_error(), "operand 'a' is NULL");
  CHECK(loom_graph_build(ctx, NULL) == NULL);
  CHECK_CONTAINS(loom_last_error(), "NULL");
  /* type errors */
  loom_tensor* idx = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 4);
  CHECK(loom_silu(ctx, idx) == NULL);
  CHECK_CONTAINS(loom_last_error(), "type_mismatch");
  CHECK(loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 30, 2) == NULL); /* not whole blocks */
  CHECK_CONTAINS(loom_last_error(), "block");
  CHECK(loom_new_tensor_1d(ctx, (loom_type)21, 256) == NULL);
  CHECK_CONTAINS(loom_last_error(), "not supported");
  CHECK(loom_new_tensor(ctx, LOOM_TYPE_F32, 5, (const int64_t[5]){1, 1, 1, 1, 1}) == NULL);
  loom_rope_params rp = loom_rope_default_params(5, LOOM_ROPE_NORMAL); /* odd n_dims */
  CHECK(loom_rope(ctx, loom_reshape_3d(ctx, x, 16, 4, 4), idx, NULL, &rp) == NULL);
  CHECK_CONTAINS(loom_last_error(), "n_dims");
  CHECK(loom_rope(ctx, x, idx, NULL, NULL) == NULL);
  CHECK_CONTAINS(loom_last_error(), "params is NULL");
  CHECK(loom_permute(ctx, x, 0, 0, 1, 2) == NULL);
  CHECK(loom_view_2d(ctx, x, 64, 8, 256, 0) == NULL); /* past the end */
  CHECK_CONTAINS(loom_last_error(), "view");
  CHECK(loom_tensor_ne(x, 4) == 0);
  CHECK_CONTAINS(loom_last_error(), "dim");
  CHECK(loom_tensor_get_f32(x, (float[8]){0}, 8) == LOOM_STATUS_SHAPE_MISMATCH);

  /* a tensor of another context */
  loom_context* other = loom_context_create(4096);
  loom_tensor* z = loom_set_name(loom_new_tensor_2d(other, LOOM_TYPE_F32, 64, 4), "z");
  CHECK(loom_add(ctx, x, z) == NULL);
  CHECK_CONTAINS(loom_last_error(), "another context");
  /* the arena is full: NULL and out_of_memory, not an abort */
  CHECK(loom_new_tensor_2d(other, LOOM_TYPE_F32, 1024, 2) == NULL);
  CHECK(loom_context_status(other) == LOOM_STATUS_OUT_OF_MEMORY);
  CHECK_CONTAINS(loom_context_error(other), "arena");
  loom_graph* gz = loom_graph_new(other);
  CHECK(loom_graph_build_forward_expand(gz, x) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_CONTAINS(loom_last_error(), "does not belong");

  /* bad handles */
  CHECK(loom_backend_init_by_name("no-such-backend", 0, 1) == NULL);
  CHECK_CONTAINS(loom_last_error(), "not available");
  CHECK(loom_graph_compute_cpu(NULL, 1) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK(loom_tensor_bind(loom_transpose(ctx, x), NULL, 0) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK(loom_context_create_ex((loom_context_params){(size_t)1 << 62, NULL, false}) == NULL);
  CHECK_CONTAINS(loom_last_error(), "out_of_memory");

  /* The context still builds and computes valid graphs after its errors. */
  loom_tensor* x2 = loom_scale(ctx, x, 3.0f);
  loom_graph* g2 = loom_graph_build(ctx, x2);
  for (int i = 0; i < 64 * 4; ++i) ((float*)loom_tensor_data(x))[i] = (float)i;
  CHECK_OK(loom_graph_compute_cpu(g2, 1));
  CHECK(((const float*)loom_tensor_data(x2))[100] == 300.0f);

  loom_context_destroy(other);
  loom_context_destroy(ctx);
}

/* ---- CUDA half ---------------------------------------------------------------------------------------- */

#ifdef LOOM_TEST_CAPI_CUDA

static double nmse_f(const float* a, const float* b, int64_t n) {
  double* r = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; ++i) r[i] = b[i];
  const double e = nmse(a, r, n);
  free(r);
  return e;
}

static int g_log_lines = 0;
static void count_logs(loom_log_level level, const char* text, void* user_data) {
  (void)level;
  (void)text;
  ++*(int*)user_data;
}

static bool abort_on_first(void* user_data) { return ++*(int*)user_data >= 1; }
static bool never_abort(void* user_data) { return ++*(int*)user_data < 0; }

static void poison_results(const Model* m) {
  const loom_tensor* results[] = {m->h, m->a, m->q, m->qr, m->sm, m->act, m->out};
  for (size_t i = 0; i < sizeof results / sizeof results[0]; ++i)
    memset(loom_tensor_data(results[i]), 0xFF, loom_tensor_nbytes(results[i]));
}

static int file_contains(const char* path, const char* needle) {
  FILE* f = fopen(path, "rb");
  if (!f) return 0;
  static char text[1 << 20];
  const size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  return strstr(text, needle) != NULL;
}

/* Compares a model's results read back from the GPU with the CPU's. */
static void compare_results(const Model* m, float* const cpu[7], const char* where) {
  const loom_tensor* results[] = {m->h, m->a, m->q, m->qr, m->sm, m->act, m->out};
  const char* names[] = {"h", "a", "q(q8_0)", "rope", "soft_max", "silu", "out"};
  printf("  %s: NMSE vs CPU", where);
  for (int i = 0; i < 7; ++i) {
    float* v = read_f32(results[i]);
    const int64_t n = loom_tensor_nelements(results[i]);
    const double e = nmse_f(v, cpu[i], n);
    printf("  %s %.2e", names[i], e);
    /* f32 paths within 1e-5; the q8_0 product may quantize activations differently */
    CHECK_NMSE(e, (i == 2 || i == 3) ? 1e-3 : 1e-5);
    free(v);
  }
  printf("\n");
}

static void save_results(const Model* m, float* out[7]) {
  const loom_tensor* results[] = {m->h, m->a, m->q, m->qr, m->sm, m->act, m->out};
  for (int i = 0; i < 7; ++i) out[i] = read_f32(results[i]);
}

static void free_results(float* r[7]) {
  for (int i = 0; i < 7; ++i) free(r[i]);
}

static int test_cuda(void) {
  loom_cuda_log_set_callback(count_logs, &g_log_lines);
  loom_cuda_context* cuda = loom_cuda_init(2);
  if (!cuda) {
    printf("SKIP: CUDA half not run: %s\n", loom_last_error());
    loom_cuda_log_set_callback(NULL, NULL);
    return 77;
  }
  printf("seed interface on CUDA device %d\n", loom_cuda_context_device(cuda));
  CHECK(g_log_lines > 0); /* init logs the device */
  CHECK(loom_cuda_init(0) == NULL);
  CHECK_CONTAINS(loom_last_error(), "n_cb");
  CHECK(loom_cuda_set_n_cb(cuda, LOOM_CUDA_MAX_COMMAND_BUFFERS + 1) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_OK(loom_cuda_set_n_cb(cuda, 4));
  CHECK(loom_cuda_get_n_cb(cuda) == 4);

  /* The arena in pinned memory, as a seed program would do it. */
  const size_t arena = 1 << 20;
  void* pinned = loom_cuda_host_malloc(arena);
  CHECK(pinned != NULL);
  loom_context* ctx = loom_context_create_ex((loom_context_params){arena, pinned, false});
  Model m;
  build_model(ctx, &m);
  Inputs in;
  make_inputs(&in, 21);
  set_inputs(&m, &in);
  loom_graph* gf = loom_graph_build(ctx, m.qr);
  CHECK_OK(loom_graph_build_forward_expand(gf, m.out));
  CHECK_OK(loom_graph_compute_cpu(gf, 2));
  float* cpu1[7];
  save_results(&m, cpu1);
  poison_results(&m); /* the device copy starts from the host bytes: no CPU result may leak into it */

  /* nothing mapped yet: an error naming the first tensor, nothing runs */
  loom_clear_last_error();
  CHECK(loom_cuda_graph_compute(cuda, gf) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_CONTAINS(loom_last_error(), "'x'");
  CHECK_CONTAINS(loom_last_error(), "loom_cuda_add_buffer");

  void* base = loom_context_mem_base(ctx);
  const size_t size = loom_context_mem_size(ctx);
  CHECK(loom_cuda_add_buffer(cuda, "arena", base, size, size + 1) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_CONTAINS(loom_last_error(), "max_size");
  CHECK(loom_cuda_add_buffer(cuda, NULL, base, size, 0) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK(loom_cuda_add_buffer(cuda, "arena", NULL, size, 0) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_OK(loom_cuda_add_buffer(cuda, "arena", base, size, loom_tensor_nbytes(m.w1)));
  CHECK(loom_cuda_add_buffer(cuda, "inside", (char*)base + 4096, 128, 0) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_CONTAINS(loom_last_error(), "overlaps");
  static char spare[64];
  CHECK(loom_cuda_add_buffer(cuda, "arena", spare, sizeof spare, 0) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_CONTAINS(loom_last_error(), "already mapped");

  CHECK(loom_cuda_if_optimized(cuda) == 0 && loom_cuda_get_concur_list(cuda) == NULL);
  CHECK_OK(loom_cuda_graph_find_concurrency(cuda, gf, true));
  /* the executor's plan, level by level (-1 between levels): every node that launches work appears
   * once, after every node it reads */
  {
    const int n_list = loom_cuda_if_optimized(cuda);
    const int* order = loom_cuda_get_concur_list(cuda);
    const int n_nodes = loom_graph_n_nodes(gf);
    CHECK(n_list > 0 && order != NULL);
    int seen_at[256];
    for (int i = 0; i < 256; ++i) seen_at[i] = -1;
    int level = 0, listed = 0, ok = n_nodes <= 256;
    for (int i = 0; ok && order && i < n_list; ++i) {
      if (order[i] < 0) {
        ++level;
        continue;
      }
      ok &= order[i] < n_nodes && seen_at[order[i]] < 0;
      if (ok) seen_at[order[i]] = level;
      ++listed;
    }
    for (int i = 0; ok && i < n_nodes; ++i) {
      const loom_tensor* t = loom_graph_node(gf, i);
      const int is_view = strcmp(loom_tensor_op_name(t), "view") == 0;
      ok &= is_view ? seen_at[i] < 0 : seen_at[i] >= 0;
      for (int k = 0; ok && !is_view && k < 4; ++k) {
        const loom_tensor* src = loom_tensor_src(t, k);
        /* follow views to the node that produced the data */
        while (src && strcmp(loom_tensor_op_name(src), "view") == 0) src = loom_tensor_src(src, 0);
        for (int j = 0; ok && src && j < n_nodes; ++j)
          if (loom_graph_node(gf, j) == src) ok &= seen_at[j] <= seen_at[i];
      }
    }
    CHECK(ok && listed > 0 && level >= 1);
  }

  /* LOOM_TEST_CAPI_TRACE=path keeps the trace there for a look in chrome://tracing */
  const char* keep_trace = getenv("LOOM_TEST_CAPI_TRACE");
  const char* trace = keep_trace ? keep_trace : "loom-test-capi-trace.json";
  remove(trace);
  CHECK_OK(loom_cuda_capture_next_compute(cuda, trace));
  CHECK_OK(loom_cuda_graph_compute(cuda, gf));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.h));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.a));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.q));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.qr));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.sm));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.act));
  CHECK_OK(loom_cuda_get_tensor(cuda, m.out));
  compare_results(&m, cpu1, "seed interface");
  CHECK(file_contains(trace, "\"traceEvents\"") && file_contains(trace, "mul_mat") &&
        file_contains(trace, "\"dur\""));
  {
    char dot[512];
    snprintf(dot, sizeof dot, "%s.dot", trace);
    CHECK(file_contains(dot, "digraph plan") && file_contains(dot, "->"));
    if (!keep_trace) remove(dot);
  }
  if (!keep_trace) remove(trace);

  /* new inputs: host writes reach the device only through set_tensor */
  make_inputs(&in, 22);
  set_inputs(&m, &in);
  CHECK_OK(loom_cuda_set_tensor(cuda, m.x));
  CHECK_OK(loom_cuda_set_tensor(cuda, m.pos));
  CHECK_OK(loom_cuda_set_tensor(cuda, m.g));
  CHECK_OK(loom_cuda_set_tensor(cuda, m.w1));
  CHECK_OK(loom_cuda_set_tensor(cuda, m.wq));
  CHECK_OK(loom_cuda_set_tensor(cuda, m.mask));
  CHECK_OK(loom_cuda_graph_compute(cuda, gf));
  if (!keep_trace) CHECK(!file_contains(trace, "traceEvents")); /* the capture was for one compute only */
  CHECK_OK(loom_graph_compute_cpu(gf, 2));
  float* cpu2[7];
  save_results(&m, cpu2);
  CHECK(nmse_f(cpu2[6], cpu1[6], F * T) > 1e-2); /* the new inputs change the result */
  poison_results(&m);
  const loom_tensor* results[] = {m.h, m.a, m.q, m.qr, m.sm, m.act, m.out};
  for (int i = 0; i < 7; ++i) CHECK_OK(loom_cuda_get_tensor(cuda, (loom_tensor*)results[i]));
  compare_results(&m, cpu2, "after set_tensor");

  /* a strided view: get_tensor copies its rows only, leaving the gaps' host bytes alone */
  loom_tensor* col_half = loom_view_2d(ctx, m.out, F / 2, T, loom_tensor_nb(m.out, 1), 0);
  memset(loom_tensor_data(m.out), 0xFF, loom_tensor_nbytes(m.out));
  CHECK_OK(loom_cuda_get_tensor(cuda, col_half));
  const float* od = loom_tensor_data(m.out);
  CHECK(!isnan(od[F + 3]) && isnan(od[F + F / 2 + 3]) && fabsf(od[F + 3] - cpu2[6][F + 3]) < 1e-4f);

  /* the abort callback is asked before each chunk of a pass (a replay is one chunk) */
  int calls = 0;
  loom_cuda_set_abort_callback(cuda, abort_on_first, &calls);
  CHECK(loom_cuda_graph_compute(cuda, gf) == LOOM_STATUS_ABORTED);
  CHECK(calls == 1);
  CHECK_CONTAINS(loom_last_error(), "abort");
  calls = 0;
  loom_cuda_set_abort_callback(cuda, never_abort, &calls);
  CHECK_OK(loom_cuda_graph_compute(cuda, gf));
  CHECK(calls >= 1);
  loom_cuda_set_abort_callback(cuda, NULL, NULL);
  CHECK_OK(loom_cuda_graph_compute(cuda, gf));

  /* a graph whose tensors are in no mapped range */
  loom_context* other = loom_context_create(1 << 16);
  loom_tensor* y = loom_set_name(loom_new_tensor_1d(other, LOOM_TYPE_F32, 256), "unmapped_y");
  loom_graph* gy = loom_graph_build(other, loom_silu(other, y));
  CHECK(loom_cuda_graph_compute(cuda, gy) == LOOM_STATUS_INVALID_ARGUMENT);
  CHECK_CONTAINS(loom_last_error(), "unmapped_y");
  CHECK(loom_cuda_set_tensor(cuda, y) == LOOM_STATUS_INVALID_ARGUMENT);
  loom_context_destroy(other);

  /* ---- the backend interface ---- */
  printf("CUDA backend interface\n");
  loom_backend* gpu = loom_backend_cuda_init(0);
  CHECK(gpu != NULL && loom_backend_is_cuda(gpu) && strcmp(loom_backend_name(gpu), "cuda") == 0);
  loom_backend* cpu = loom_backend_cpu_init(1);
  CHECK(!loom_backend_is_cuda(cpu) && !loom_backend_cuda_supports_arch(cpu, 50));
  CHECK(loom_backend_cuda_supports_arch(gpu, 50));
  CHECK(!loom_backend_cuda_supports_arch(gpu, 990));
  CHECK_OK(loom_backend_cuda_set_n_cb(gpu, 2));
  CHECK(loom_backend_cuda_set_n_cb(cpu, 2) == LOOM_STATUS_INVALID_ARGUMENT);
  loom_buffer_type* dev_type = loom_backend_cuda_buffer_type(0);
  CHECK(dev_type != NULL && !loom_buffer_type_is_host(dev_type));
  CHECK(loom_backend_get_buffer_type(gpu) == dev_type);
  loom_buffer_type* host_type = loom_backend_cuda_host_buffer_type();
  CHECK(host_type != NULL && loom_buffer_type_is_host(host_type));

  loom_context* dctx = loom_context_create_ex((loom_context_params){0, NULL, true});
  Model dm;
  build_model(dctx, &dm);
  loom_graph* dg = loom_graph_build(dctx, dm.qr);
  CHECK_OK(loom_graph_build_forward_expand(dg, dm.out));
  loom_buffer* dbuf = loom_context_alloc_tensors(dctx, dev_type);
  CHECK(dbuf != NULL);
  set_inputs(&dm, &in);                                                 /* same inputs as cpu2 */
  CHECK(loom_graph_compute_cpu(dg, 1) == LOOM_STATUS_INVALID_ARGUMENT); /* device memory */
  CHECK_OK(loom_backend_graph_compute(gpu, dg));
  compare_results(&dm, cpu2, "cuda backend, device buffers");

  /* a buffer over existing device memory: reads what the tensors hold */
  loom_buffer* view = loom_backend_cuda_buffer_from_ptr(loom_buffer_base(dbuf), loom_buffer_size(dbuf));
  CHECK(view != NULL && loom_buffer_get_type(view) == dev_type);
  float row[E];
  const size_t x_offset = (size_t)((char*)loom_tensor_data(dm.x) - (char*)loom_buffer_base(dbuf));
  CHECK_OK(loom_buffer_get(view, row, x_offset + sizeof row, sizeof row));
  CHECK(memcmp(row, in.x[1], sizeof row) == 0);
  loom_buffer_free(view); /* leaves the memory to dbuf */
  CHECK_OK(loom_tensor_get(dm.x, row, 0, sizeof row));
  CHECK(memcmp(row, in.x[0], sizeof row) == 0);
  CHECK(loom_backend_cuda_buffer_from_ptr(row, sizeof row) == NULL);
  CHECK_CONTAINS(loom_last_error(), "not device memory");

  loom_context_destroy(dctx);
  loom_buffer_free(dbuf);
  loom_backend_free(gpu);
  loom_backend_free(cpu);
  free_results(cpu1);
  free_results(cpu2);
  loom_cuda_free(cuda);
  loom_context_destroy(ctx);
  loom_cuda_host_free(pinned);
  loom_cuda_log_set_callback(NULL, NULL);
  return 0;
}

#endif /* LOOM_TEST_CAPI_CUDA */

int main(void) {
  test_types();
  test_model_cpu();
  test_no_alloc_cpu();
  test_errors();
  int cuda_result = 0;
#ifdef LOOM_TEST_CAPI_CUDA
  cuda_result = test_cuda();
#endif
  printf("%d checks, %d failed\n", g_checks, g_failures);
  if (g_failures) return 1;
  return cuda_result;
}
