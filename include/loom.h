/* Loom's C ABI: contexts, tensors, graph building, CPU compute and backends.
 *
 * The model follows the seed interface (ggml's contexts): a context owns a host memory arena, and
 * every tensor created in it -- leafs and op results alike -- gets its memory there as it is
 * created. A graph built in a context can therefore be computed on the CPU directly
 * (loom_graph_compute_cpu), and the arena's host range can be mapped to a GPU with
 * loom_cuda_add_buffer (loom-cuda.h) to compute the very same graph there.
 *
 * Errors: no function aborts on bad input. Functions return a loom_status, or a handle that is NULL
 * on failure; either way loom_last_error() then says what went wrong and where. An op whose operands
 * do not fit returns NULL and records its error in the context too (loom_context_status); passing
 * that NULL to later ops makes them return NULL as well, so a whole graph can be built and checked
 * once at the end, as with loom::Graph.
 *
 * Threads: the last error is per thread. A context, its tensors and its graphs must be used by one
 * thread at a time. Handles are opaque; loom_tensor, loom_buffer and loom_buffer_type stand for the
 * C++ objects loom::Tensor, loom::Buffer and loom::BufferType (include/loom/).
 */
#ifndef LOOM_H
#define LOOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors -------------------------------------------------------------------------- */

/** Result of a call; the values equal loom::StatusCode's. */
typedef enum loom_status {
  LOOM_STATUS_OK = 0,
  LOOM_STATUS_INVALID_ARGUMENT = 1, /**< unusable argument (NULL handle, bad parameter) */
  LOOM_STATUS_SHAPE_MISMATCH = 2,   /**< tensor shapes do not fit the op */
  LOOM_STATUS_TYPE_MISMATCH = 3,    /**< element type not accepted by the op */
  LOOM_STATUS_OUT_OF_MEMORY = 4,    /**< host, arena or device memory exhausted */
  LOOM_STATUS_IO_ERROR = 5,         /**< a file could not be opened, read or written */
  LOOM_STATUS_FORMAT_ERROR = 6,     /**< a file's contents are malformed */
  LOOM_STATUS_DEVICE_ERROR = 7,     /**< a device call or kernel failed, or there is no device */
  LOOM_STATUS_UNSUPPORTED = 8,      /**< valid request this build or backend cannot do */
  LOOM_STATUS_ABORTED = 9,          /**< stopped by an abort callback */
  LOOM_STATUS_INTERNAL = 10,        /**< a broken invariant inside Loom (please report) */
} loom_status;

/** Stable lowercase name of a status ("shape_mismatch"); "unknown" for values outside the enum. */
LOOM_API const char* loom_status_string(loom_status status);
/** Message of the last failure on the calling thread ("" if none). Kept until the next failure;
 *  successful calls leave it alone. The pointer is valid until the thread's next Loom call. */
LOOM_API const char* loom_last_error(void);
/** Forgets the calling thread's last error (so a test can see whether a call sets one). */
LOOM_API void loom_clear_last_error(void);

/** Severity of a log message. */
typedef enum loom_log_level {
  LOOM_LOG_DEBUG = 0,
  LOOM_LOG_INFO = 1,
  LOOM_LOG_WARN = 2,
  LOOM_LOG_ERROR = 3,
} loom_log_level;

/** Receives log messages (one line, no trailing newline). */
typedef void (*loom_log_callback)(loom_log_level level, const char* text, void* user_data);
/** Asked between units of work; returning true stops the computation with LOOM_STATUS_ABORTED. */
typedef bool (*loom_abort_callback)(void* user_data);

/* ---- element types ------------------------------------------------------------------------------- */

/** Element types, numbered as GGUF's ggml_type so ids read from a file can be passed through. */
typedef enum loom_type {
  LOOM_TYPE_F32 = 0,
  LOOM_TYPE_F16 = 1,
  LOOM_TYPE_Q4_0 = 2,
  LOOM_TYPE_Q4_1 = 3,
  LOOM_TYPE_Q5_0 = 6,
  LOOM_TYPE_Q5_1 = 7,
  LOOM_TYPE_Q8_0 = 8,
  LOOM_TYPE_Q2_K = 10,
  LOOM_TYPE_Q3_K = 11,
  LOOM_TYPE_Q4_K = 12,
  LOOM_TYPE_Q5_K = 13,
  LOOM_TYPE_Q6_K = 14,
  LOOM_TYPE_IQ4_NL = 20, /* this and q4_1, q5_0, q5_1, q2_K, q3_K, q5_K, iq4_xs, mxfp4: CUDA reads, never writes them */
  LOOM_TYPE_IQ4_XS = 23,
  LOOM_TYPE_I32 = 26,
  LOOM_TYPE_BF16 = 30,
  LOOM_TYPE_MXFP4 = 39,
} loom_type;

/** "f32", "q4_K", ...; NULL for an id Loom does not support. */
LOOM_API const char* loom_type_name(loom_type type);
/** Elements per block (1 for plain types, 32 for q8_0, 256 for the K-quants); 0 if unsupported. */
LOOM_API int64_t loom_type_block_size(loom_type type);
/** Bytes per block; 0 if unsupported. */
LOOM_API size_t loom_type_size(loom_type type);
/** Whether the type stores quantized blocks. */
LOOM_API bool loom_type_is_quantized(loom_type type);
/** Bytes of a row of `ne0` elements; 0 (and an error) if ne0 is not a whole number of blocks. */
LOOM_API size_t loom_row_size(loom_type type, int64_t ne0);

/* ---- handles ------------------------------------------------------------------------------------- */

/** A set of tensors (and the graphs built from them) with a host memory arena. */
typedef struct loom_context loom_context;
/** A tensor of up to 4 dimensions; ne[0] is the innermost, strides nb[] are in bytes. */
typedef struct loom_tensor loom_tensor;
/** The nodes needed to compute some outputs, in a topological order. */
typedef struct loom_graph loom_graph;
/** Something that evaluates graphs (the CPU, a CUDA device). */
typedef struct loom_backend loom_backend;
/** A block of memory in some address space (host or device). */
typedef struct loom_buffer loom_buffer;
/** A kind of memory (host, pinned host, one CUDA device's memory). */
typedef struct loom_buffer_type loom_buffer_type;

#define LOOM_MAX_DIMS 4
/** Alignment of tensor data placed in a context's arena or by loom_context_alloc_tensors. */
#define LOOM_TENSOR_ALIGNMENT 64
/** Alignment of the arena a context allocates itself (a page, so it can be mapped or pinned). */
#define LOOM_ARENA_ALIGNMENT 4096

/* ---- contexts ------------------------------------------------------------------------------------ */

/** How a context is created (the seed's ggml_init_params). */
typedef struct loom_context_params {
  size_t mem_size;  /**< arena bytes for tensor data (metadata lives elsewhere) */
  void* mem_buffer; /**< caller's memory for the arena (not freed by Loom), or NULL to allocate */
  bool no_alloc;    /**< tensors get no memory; bind them later (loom_context_alloc_tensors) */
} loom_context_params;

/** A context with its own arena of `mem_size` bytes (page-aligned). NULL if out of memory. */
LOOM_API loom_context* loom_context_create(size_t mem_size);
/** A context from explicit parameters. With `mem_buffer` (for example from loom_cuda_host_malloc)
 *  the arena starts at its first LOOM_TENSOR_ALIGNMENT-aligned byte. */
LOOM_API loom_context* loom_context_create_ex(loom_context_params params);
/** Frees the context, its tensors and graphs (not memory given as mem_buffer). NULL is ignored. */
LOOM_API void loom_context_destroy(loom_context* ctx);
/** First byte of the arena (NULL for no_alloc contexts). */
LOOM_API void* loom_context_mem_base(const loom_context* ctx);
/** Usable bytes of the arena. */
LOOM_API size_t loom_context_mem_size(const loom_context* ctx);
/** Arena bytes taken by tensors so far (alignment padding included). */
LOOM_API size_t loom_context_mem_used(const loom_context* ctx);
/** First error any op or allocation in this context recorded, or LOOM_STATUS_OK. */
LOOM_API loom_status loom_context_status(const loom_context* ctx);
/** Message of that first error ("" when none). Valid while the context lives. */
LOOM_API const char* loom_context_error(const loom_context* ctx);
/** Gives every tensor of the context that has no memory yet (leafs and op results) a place in one
 *  new buffer of `type`, tensor after tensor with no reuse, and returns that buffer (free it with
 *  loom_buffer_free after the tensors' last use). Views follow their source. NULL on failure. */
LOOM_API loom_buffer* loom_context_alloc_tensors(loom_context* ctx, loom_buffer_type* type);

/* ---- tensors ------------------------------------------------------------------------------------- */

/** New leaf tensor (weight or input) of `n_dims` (1..4) dimensions `ne`; missing dims are 1.
 *  In an allocating context its memory comes from the arena (contents undefined). NULL on failure
 *  (bad shape, ne0 not a multiple of the type's block size, arena full). */
LOOM_API loom_tensor* loom_new_tensor(loom_context* ctx, loom_type type, int n_dims, const int64_t* ne);
/** loom_new_tensor with 1, 2, 3 or 4 dimensions. */
LOOM_API loom_tensor* loom_new_tensor_1d(loom_context* ctx, loom_type type, int64_t ne0);
LOOM_API loom_tensor* loom_new_tensor_2d(loom_context* ctx, loom_type type, int64_t ne0, int64_t ne1);
LOOM_API loom_tensor* loom_new_tensor_3d(loom_context* ctx, loom_type type, int64_t ne0, int64_t ne1,
                                         int64_t ne2);
LOOM_API loom_tensor* loom_new_tensor_4d(loom_context* ctx, loom_type type, int64_t ne0, int64_t ne1,
                                         int64_t ne2, int64_t ne3);

/** Address of the tensor's first element in its buffer's address space: a host pointer for tensors
 *  in a context's arena or a host buffer, a device pointer in a device buffer; NULL if unplaced. */
LOOM_API void* loom_tensor_data(const loom_tensor* t);
/** Elements along dimension `dim` (0..3); 0 and an error for a NULL tensor or another dim. */
LOOM_API int64_t loom_tensor_ne(const loom_tensor* t, int dim);
/** Byte stride of dimension `dim` (0..3); 0 and an error for a NULL tensor or another dim. */
LOOM_API size_t loom_tensor_nb(const loom_tensor* t, int dim);
/** Number of elements. */
LOOM_API int64_t loom_tensor_nelements(const loom_tensor* t);
/** Bytes spanned from the first element to one past the last (strides included). */
LOOM_API size_t loom_tensor_nbytes(const loom_tensor* t);
/** Element type (LOOM_TYPE_F32 for NULL, with an error). */
LOOM_API loom_type loom_tensor_type(const loom_tensor* t);
/** Rows packed with no gaps, dimensions in order. */
LOOM_API bool loom_tensor_is_contiguous(const loom_tensor* t);
/** Name of the op that produces the tensor ("none" for leafs, "view", "mul_mat", ...). */
LOOM_API const char* loom_tensor_op_name(const loom_tensor* t);
/** Operand `i` (0..3) of the op, or NULL. */
LOOM_API loom_tensor* loom_tensor_src(const loom_tensor* t, int i);
/** Sets the tensor's name (used in every error message about it); returns `t`. */
LOOM_API loom_tensor* loom_set_name(loom_tensor* t, const char* name);
/** The tensor's name ("" if none). */
LOOM_API const char* loom_get_name(const loom_tensor* t);

/** Copies `n` bytes from host memory `src` into the tensor's memory at byte `offset`, whatever
 *  memory it is in (host or device). */
LOOM_API loom_status loom_tensor_set(loom_tensor* t, const void* src, size_t offset, size_t n);
/** Copies `n` bytes at byte `offset` of the tensor's memory to host memory `dst`. */
LOOM_API loom_status loom_tensor_get(const loom_tensor* t, void* dst, size_t offset, size_t n);
/** Writes `n` (= element count) floats into the tensor in row order, converting or quantizing to
 *  its type and respecting its strides. */
LOOM_API loom_status loom_tensor_set_f32(loom_tensor* t, const float* values, int64_t n);
/** Reads the tensor as `n` (= element count) floats in row order, dequantizing. */
LOOM_API loom_status loom_tensor_get_f32(const loom_tensor* t, float* values, int64_t n);
/** Places the tensor at byte `offset` of `buffer` (must fit); views of it follow at compute. */
LOOM_API loom_status loom_tensor_bind(loom_tensor* t, loom_buffer* buffer, size_t offset);

/* ---- ops (include/loom/graph.h documents each op's semantics) ------------------------------------ */

/* Views share their source's memory; strides nb1..nb3 and offsets are in bytes. */

/** 1-d view of `ne0` elements at byte `offset`. */
LOOM_API loom_tensor* loom_view_1d(loom_context* ctx, loom_tensor* a, int64_t ne0, size_t offset);
/** 2-d view with row stride nb1. */
LOOM_API loom_tensor* loom_view_2d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1, size_t nb1,
                                   size_t offset);
/** 3-d view with strides nb1, nb2. */
LOOM_API loom_tensor* loom_view_3d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1, int64_t ne2,
                                   size_t nb1, size_t nb2, size_t offset);
/** 4-d view with strides nb1, nb2, nb3. */
LOOM_API loom_tensor* loom_view_4d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1, int64_t ne2,
                                   int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset);
/** Same elements, new shape; `a` must be contiguous. */
LOOM_API loom_tensor* loom_reshape_1d(loom_context* ctx, loom_tensor* a, int64_t ne0);
LOOM_API loom_tensor* loom_reshape_2d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1);
LOOM_API loom_tensor* loom_reshape_3d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1,
                                      int64_t ne2);
LOOM_API loom_tensor* loom_reshape_4d(loom_context* ctx, loom_tensor* a, int64_t ne0, int64_t ne1,
                                      int64_t ne2, int64_t ne3);
/** Dimension i of `a` becomes dimension ax_i of the result. */
LOOM_API loom_tensor* loom_permute(loom_context* ctx, loom_tensor* a, int ax0, int ax1, int ax2, int ax3);
/** Swaps dims 0 and 1. */
LOOM_API loom_tensor* loom_transpose(loom_context* ctx, loom_tensor* a);
/** Packed copy of `a` (same type). */
LOOM_API loom_tensor* loom_cont(loom_context* ctx, loom_tensor* a);

/** Rows of `a` picked by i32 indices `idx` [k, a.ne2, a.ne3] -> f32 [a.ne0, k, a.ne2, a.ne3]. */
LOOM_API loom_tensor* loom_get_rows(loom_context* ctx, loom_tensor* a, loom_tensor* idx);
/** Elementwise f32 a + b, b broadcast over a (each a.ne[i] a multiple of b.ne[i]). */
LOOM_API loom_tensor* loom_add(loom_context* ctx, loom_tensor* a, loom_tensor* b);
/** Elementwise a - b (broadcasting like loom_add). */
LOOM_API loom_tensor* loom_sub(loom_context* ctx, loom_tensor* a, loom_tensor* b);
/** Elementwise a * b (broadcasting like loom_add). */
LOOM_API loom_tensor* loom_mul(loom_context* ctx, loom_tensor* a, loom_tensor* b);
/** Elementwise a / b (broadcasting like loom_add). */
LOOM_API loom_tensor* loom_div(loom_context* ctx, loom_tensor* a, loom_tensor* b);
/** a * s. */
LOOM_API loom_tensor* loom_scale(loom_context* ctx, loom_tensor* a, float s);
/** a * s + bias. */
LOOM_API loom_tensor* loom_scale_bias(loom_context* ctx, loom_tensor* a, float s, float bias);
/** x / sqrt(mean(x^2) + eps) over dim 0. */
LOOM_API loom_tensor* loom_rms_norm(loom_context* ctx, loom_tensor* a, float eps);
/** (x - mean) / sqrt(var + eps) over dim 0. */
LOOM_API loom_tensor* loom_norm(loom_context* ctx, loom_tensor* a, float eps);
/** a [k, m, a2, a3] (any type) times f32 b [k, n, b2, b3] -> f32 [m, n, b2, b3]:
 *  result[i, j] = dot(row i of a, row j of b); a's batches broadcast over b's (grouped). */
LOOM_API loom_tensor* loom_mul_mat(loom_context* ctx, loom_tensor* a, loom_tensor* b);
/** Expert-routed mul_mat: as [k, m, n_expert], b f32 [k, 1 or n_used, n_tokens],
 *  ids i32 [n_used, n_tokens] -> f32 [m, n_used, n_tokens]. */
LOOM_API loom_tensor* loom_mul_mat_id(loom_context* ctx, loom_tensor* as, loom_tensor* b, loom_tensor* ids);

/** Rotary embedding layouts: pairs (2i, 2i+1), or NeoX's (i, i + n_dims/2). */
typedef enum loom_rope_mode { LOOM_ROPE_NORMAL = 0, LOOM_ROPE_NEOX = 2 } loom_rope_mode;
/** Rotary embedding parameters (loom::RopeParams). */
typedef struct loom_rope_params {
  int32_t n_dims; /**< leading dims of each head that rotate (even, <= head size) */
  loom_rope_mode mode;
  int32_t n_ctx_orig; /**< training context, for YaRN's correction range */
  float freq_base;    /**< theta_i = pos * freq_base^(-2i/n_dims) / freq_factor_i */
  float freq_scale;   /**< 1 / linear scaling factor */
  float ext_factor;   /**< YaRN extrapolation mix (0 disables YaRN) */
  float attn_factor;  /**< magnitude scale */
  float beta_fast;
  float beta_slow;
} loom_rope_params;
/** Plain RoPE over `n_dims` dims: base 10000, no scaling, attn_factor 1, YaRN betas 32 and 1. */
LOOM_API loom_rope_params loom_rope_default_params(int32_t n_dims, loom_rope_mode mode);
/** Rotates f32 a [head_dim, n_head, n_tokens] by i32 positions pos [n_tokens]; freq_factors is
 *  NULL or f32 [>= n_dims/2]. */
LOOM_API loom_tensor* loom_rope(loom_context* ctx, loom_tensor* a, loom_tensor* pos,
                                loom_tensor* freq_factors, const loom_rope_params* params);
/** softmax(a * scale + mask) over dim 0; mask NULL or f32/f16 [a.ne0, >= a.ne1]. */
LOOM_API loom_tensor* loom_soft_max(loom_context* ctx, loom_tensor* a, loom_tensor* mask, float scale);
/** softmax(softcap(q k^T * scale) + mask) v. q f32 [d, n_q, n_head]; k f32/f16 [d, n_kv, n_head_kv];
 *  v f32/f16 [dv, n_kv, n_head_kv]; mask NULL or [n_kv, >= n_q] -> f32 [dv, n_head, n_q].
 *  softcap 0 disables it. */
LOOM_API loom_tensor* loom_flash_attn(loom_context* ctx, loom_tensor* q, loom_tensor* k, loom_tensor* v,
                                      loom_tensor* mask, float scale, float softcap);
/** x * sigmoid(x). */
LOOM_API loom_tensor* loom_silu(loom_context* ctx, loom_tensor* a);
/** GELU, tanh approximation. */
LOOM_API loom_tensor* loom_gelu(loom_context* ctx, loom_tensor* a);
/** GELU, exact (erf). */
LOOM_API loom_tensor* loom_gelu_erf(loom_context* ctx, loom_tensor* a);
/** silu(gate) * up (equal shapes). */
LOOM_API loom_tensor* loom_swiglu(loom_context* ctx, loom_tensor* gate, loom_tensor* up);
/** gelu(gate) * up (equal shapes, tanh form). */
LOOM_API loom_tensor* loom_geglu(loom_context* ctx, loom_tensor* gate, loom_tensor* up);
/** cap * tanh(a / cap), cap > 0. */
LOOM_API loom_tensor* loom_softcap(loom_context* ctx, loom_tensor* a, float cap);
/** Index of the largest element of each row -> i32 [ne1, ne2, ne3]. */
LOOM_API loom_tensor* loom_argmax(loom_context* ctx, loom_tensor* a);
/** Indices of the k largest elements of each row, largest first -> i32 [k, ne1, ne2, ne3]. */
LOOM_API loom_tensor* loom_top_k(loom_context* ctx, loom_tensor* a, int k);
/** Writes rows of f32 src [n, r, s2, s3] into dst [n, R, s2, s3] (any type) at rows idx (i32 [r, ...]).
 *  Returns a view of dst that carries the write: later readers must use it. */
LOOM_API loom_tensor* loom_set_rows(loom_context* ctx, loom_tensor* dst, loom_tensor* src, loom_tensor* idx);
/** Copies src into dst (same element count, converting type). Returns a view of dst carrying it. */
LOOM_API loom_tensor* loom_cpy(loom_context* ctx, loom_tensor* src, loom_tensor* dst);
/** Packed copy of `a` converted to `type`. */
LOOM_API loom_tensor* loom_convert(loom_context* ctx, loom_tensor* a, loom_type type);
/** Joins a and b along `dim` (other dims equal, same non-quantized type). */
LOOM_API loom_tensor* loom_concat(loom_context* ctx, loom_tensor* a, loom_tensor* b, int dim);
/** Sum over dim 0 -> f32 [1, ne1, ne2, ne3]. */
LOOM_API loom_tensor* loom_sum_rows(loom_context* ctx, loom_tensor* a);

/* ---- graphs -------------------------------------------------------------------------------------- */

/** An empty graph in `ctx`. Graphs belong to their context and are freed with it. */
LOOM_API loom_graph* loom_graph_new(loom_context* ctx);
/** Adds `t` and every node it depends on (the seed's build_forward_expand). Nodes keep the order
 *  in which they were created, which is a topological order. `t` must belong to the graph's context. */
LOOM_API loom_status loom_graph_build_forward_expand(loom_graph* graph, loom_tensor* t);
/** A new graph computing `output`: loom_graph_new + loom_graph_build_forward_expand. */
LOOM_API loom_graph* loom_graph_build(loom_context* ctx, loom_tensor* output);
/** Frees a graph before its context does (optional). NULL is ignored. */
LOOM_API void loom_graph_free(loom_graph* graph);
/** Number of nodes (op results and views) the graph computes. */
LOOM_API int loom_graph_n_nodes(const loom_graph* graph);
/** Node `i` in execution order; negative `i` counts from the end (-1: the last). NULL if out of range. */
LOOM_API loom_tensor* loom_graph_node(const loom_graph* graph, int i);
/** Number of leafs (weights and inputs) the graph reads. */
LOOM_API int loom_graph_n_leafs(const loom_graph* graph);
/** Leaf `i` (negative counts from the end); NULL if out of range. */
LOOM_API loom_tensor* loom_graph_leaf(const loom_graph* graph, int i);
/** Computes the graph on the CPU with `n_threads` threads (<= 0: all cores), in place in host
 *  memory. The context keeps a thread pool between calls. */
LOOM_API loom_status loom_graph_compute_cpu(loom_graph* graph, int n_threads);

/* ---- buffers ------------------------------------------------------------------------------------- */

/** Plain host memory (64-byte aligned). */
LOOM_API loom_buffer_type* loom_cpu_buffer_type(void);
/** "cpu", "cuda0", "cuda_host", ... */
LOOM_API const char* loom_buffer_type_name(const loom_buffer_type* type);
/** Whether the CPU can dereference this memory. */
LOOM_API bool loom_buffer_type_is_host(const loom_buffer_type* type);
/** Alignment of the buffers it allocates. */
LOOM_API size_t loom_buffer_type_alignment(const loom_buffer_type* type);
/** A new buffer of `size` bytes (contents undefined); NULL on failure. */
LOOM_API loom_buffer* loom_buffer_type_alloc_buffer(loom_buffer_type* type, size_t size);
/** Frees a buffer (tensors in it must no longer be used). NULL is ignored. */
LOOM_API void loom_buffer_free(loom_buffer* buffer);
/** Start address in the buffer's address space. */
LOOM_API void* loom_buffer_base(loom_buffer* buffer);
/** Bytes. */
LOOM_API size_t loom_buffer_size(const loom_buffer* buffer);
/** The buffer's type. */
LOOM_API loom_buffer_type* loom_buffer_get_type(const loom_buffer* buffer);
/** Copies `n` host bytes into the buffer at `offset`. */
LOOM_API loom_status loom_buffer_set(loom_buffer* buffer, const void* src, size_t offset, size_t n);
/** Copies `n` bytes at `offset` of the buffer to host memory. */
LOOM_API loom_status loom_buffer_get(const loom_buffer* buffer, void* dst, size_t offset, size_t n);

/* ---- backends ------------------------------------------------------------------------------------ */

/** A CPU backend on `n_threads` threads (<= 0: all cores). */
LOOM_API loom_backend* loom_backend_cpu_init(int n_threads);
/** The backend registered as `name` ("cpu", "cuda": the CUDA library is loaded on first use) on
 *  GPU `device`, with `n_threads` CPU threads. NULL (and a message listing what is available) if
 *  it cannot be created. */
LOOM_API loom_backend* loom_backend_init_by_name(const char* name, int device, int n_threads);

/** Rounding modes (docs/NUMERICS.md). DEFAULT: the LOOM_NUMERICS environment variable when set,
 *  else the backend's own default (FAST on CUDA, EXACT on the CPU). EXACT: CUDA equals the CPU bit
 *  for bit. FAST: tensor cores, float32 accumulation; deterministic run to run. */
typedef enum loom_numerics {
  LOOM_NUMERICS_DEFAULT = 0,
  LOOM_NUMERICS_EXACT = 1,
  LOOM_NUMERICS_FAST = 2,
} loom_numerics;

/** Like loom_backend_init_by_name, in the rounding mode `numerics`. */
LOOM_API loom_backend* loom_backend_init_ex(const char* name, int device, int n_threads, loom_numerics numerics);
/** The mode the backend computes in (EXACT or FAST); DEFAULT for NULL. */
LOOM_API loom_numerics loom_backend_numerics(const loom_backend* backend);
/** Frees the backend. NULL is ignored. */
LOOM_API void loom_backend_free(loom_backend* backend);
/** "cpu", "cuda". */
LOOM_API const char* loom_backend_name(const loom_backend* backend);
/** Device ordinal it was created for (0 for the CPU). */
LOOM_API int loom_backend_device(const loom_backend* backend);
/** Memory the backend computes on. */
LOOM_API loom_buffer_type* loom_backend_get_buffer_type(loom_backend* backend);
/** Whether the backend has a kernel for this node (its op, types and shape). */
LOOM_API bool loom_backend_supports_op(const loom_backend* backend, const loom_tensor* node);
/** Computes every node of the graph in order; all tensors must be in memory the backend can use
 *  (the context's arena for the CPU; device buffers for CUDA, see loom_context_alloc_tensors). */
LOOM_API loom_status loom_backend_graph_compute(loom_backend* backend, loom_graph* graph);
/** Waits for work queued on the backend. */
LOOM_API loom_status loom_backend_synchronize(loom_backend* backend);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_H */
