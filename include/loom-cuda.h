/* Loom's CUDA C ABI: the counterpart of the seed's Metal interface (ggml-metal.h), on CUDA.
 *
 * As long as a program can build and compute a graph on the CPU (loom.h), it can compute the same
 * graph on a GPU with loom_cuda_graph_compute instead of loom_graph_compute_cpu. It only has to map
 * every host memory range its graph's tensors live in (typically a context's arena:
 * loom_context_mem_base / loom_context_mem_size) with loom_cuda_add_buffer. Each mapping gets a
 * device copy of the range; at compute, every tensor's host address is translated to the same
 * offset in the device copy. Inputs go to the device with loom_cuda_set_tensor, results come back
 * with loom_cuda_get_tensor.
 *
 * The functions live in libloom_cuda.so, which programs using this header link directly (it also
 * links libloom_capi.so, loom.h's library). On a machine without a usable GPU, loom_cuda_init
 * returns NULL and loom_last_error() says why. Errors are reported as in loom.h: a status code or
 * NULL, with the message in loom_last_error(); nothing aborts.
 *
 * Execution today is Loom's plain mode: one kernel after another on the device's stream, in node
 * order. The concurrency list and n_cb (command-buffer chunks) are accepted and reported so that
 * programs written against the seed interface run unchanged; the CUDA graph executor (reordering,
 * concurrency, replay) will give them effect.
 */
#ifndef LOOM_CUDA_H
#define LOOM_CUDA_H

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most host ranges one context can map (the seed's GGML_METAL_MAX_BUFFERS). */
#define LOOM_CUDA_MAX_BUFFERS 64
/** Most command-buffer chunks (the seed's GGML_METAL_MAX_COMMAND_BUFFERS). */
#define LOOM_CUDA_MAX_COMMAND_BUFFERS 32

/** A CUDA device, its stream, and the host ranges mapped to it. */
typedef struct loom_cuda_context loom_cuda_context;

/* ---- the seed interface ------------------------------------------------------------------------- */

/** Sends the library's log messages (device found, buffers mapped, failures) to `callback`; NULL
 *  restores the default, which writes warnings and errors to stderr. Process-wide. */
LOOM_API void loom_cuda_log_set_callback(loom_log_callback callback, void* user_data);

/** A context on CUDA device 0 that splits work into `n_cb` chunks (1..LOOM_CUDA_MAX_COMMAND_BUFFERS).
 *  NULL if there is no usable device (no driver, no GPU) or n_cb is out of range. */
LOOM_API loom_cuda_context* loom_cuda_init(int n_cb);
/** loom_cuda_init on device `device`. */
LOOM_API loom_cuda_context* loom_cuda_init_device(int device, int n_cb);
/** Waits for the device, frees the device copies of every mapped range and the context. NULL is
 *  ignored. The host ranges are the caller's and stay. */
LOOM_API void loom_cuda_free(loom_cuda_context* ctx);

/** `n` bytes of page-locked host memory (cudaHostAlloc): copies between it and the device run at
 *  full bus speed, so it is the best memory for a context's arena (loom_context_create_ex with
 *  mem_buffer). NULL (and loom_last_error) on failure or without a usable device. */
LOOM_API void* loom_cuda_host_malloc(size_t n);
/** Frees memory from loom_cuda_host_malloc. NULL is ignored. */
LOOM_API void loom_cuda_host_free(void* data);

/** Sets the number of chunks the next computes split their work into (1..LOOM_CUDA_MAX_COMMAND_BUFFERS).
 *  Plain mode launches one chunk after another, so it changes no result; it is recorded, reported
 *  in traces, and used by the executor once that exists. */
LOOM_API loom_status loom_cuda_set_n_cb(loom_cuda_context* ctx, int n_cb);
/** Number of chunks currently set. */
LOOM_API int loom_cuda_get_n_cb(const loom_cuda_context* ctx);

/** Maps the host range [data, data + size) to a new device copy named `name`, filled with the
 *  range's current contents. Map every range the graph's tensors live in before computing; at
 *  compute, tensors whose bytes lie in the range read and write the device copy at the same offset.
 *  - `name` (non-empty, unique in the context) names the range in messages.
 *  - `max_size` is the seed's largest-tensor hint and must be <= size; CUDA has no per-allocation
 *    limit, so one device copy always spans the whole range (0 is fine).
 *  - Ranges must not overlap one another; at most LOOM_CUDA_MAX_BUFFERS per context.
 *  Unlike the seed's shared Metal buffers, the device copy is separate memory: after changing host
 *  bytes, send them with loom_cuda_set_tensor. */
LOOM_API loom_status loom_cuda_add_buffer(loom_cuda_context* ctx, const char* name, void* data, size_t size,
                                          size_t max_size);

/** Copies the tensor's bytes from its host memory to its device copy (it must lie in a mapped
 *  range). Views with gaps copy only their elements. Returns when the copy is done. */
LOOM_API loom_status loom_cuda_set_tensor(loom_cuda_context* ctx, loom_tensor* t);
/** Copies the tensor's bytes from its device copy back to its host memory; waits for the computes
 *  queued before it. */
LOOM_API loom_status loom_cuda_get_tensor(loom_cuda_context* ctx, loom_tensor* t);

/** Looks for nodes of `graph` that could run concurrently and records the order to run them in
 *  (run it again when the graph's topology changes). `check_mem`: also keep apart nodes whose memory
 *  overlaps. Until the executor lands, the order recorded is the plain node order (0, 1, 2, ...),
 *  one node per group, and check_mem has no effect. */
LOOM_API loom_status loom_cuda_graph_find_concurrency(loom_cuda_context* ctx, loom_graph* graph,
                                                      bool check_mem);
/** Length of the concurrency list if loom_cuda_graph_find_concurrency has run, else 0. */
LOOM_API int loom_cuda_if_optimized(const loom_cuda_context* ctx);
/** The concurrency list: node indices in the order they will run (the seed marks group boundaries
 *  with -1; plain mode has none). Valid until the next find_concurrency or loom_cuda_free; NULL if
 *  find_concurrency has not run. */
LOOM_API int* loom_cuda_get_concur_list(loom_cuda_context* ctx);

/** Computes `graph` on the device (the seed's ggml_metal_graph_compute). Every tensor the graph
 *  reads or writes must lie in a range mapped with loom_cuda_add_buffer; otherwise nothing runs and
 *  the error names the tensor. Returns after the device has finished: LOOM_STATUS_OK, a kernel's or
 *  the device's error (naming the node), LOOM_STATUS_UNSUPPORTED for a node without a CUDA kernel,
 *  or LOOM_STATUS_ABORTED if the abort callback asked to stop. */
LOOM_API loom_status loom_cuda_graph_compute(loom_cuda_context* ctx, loom_graph* graph);

/* ---- Loom's additions --------------------------------------------------------------------------- */

/** `callback(user_data)` is asked before each node is launched; when it returns true the compute
 *  launches nothing more, waits for what was launched and returns LOOM_STATUS_ABORTED. It runs on
 *  the computing thread with the device's stream held: it must not call into this context. NULL
 *  removes it. */
LOOM_API void loom_cuda_set_abort_callback(loom_cuda_context* ctx, loom_abort_callback callback,
                                           void* user_data);
/** Traces the next loom_cuda_graph_compute into `path` as Chrome trace JSON (chrome://tracing,
 *  Perfetto): one event per node with its GPU time from CUDA events, plus the node's op, shape and
 *  type. A trace that cannot be written makes that compute return LOOM_STATUS_IO_ERROR (its results
 *  are still valid). NULL cancels a pending capture. */
LOOM_API loom_status loom_cuda_capture_next_compute(loom_cuda_context* ctx, const char* path);
/** Device ordinal of the context. */
LOOM_API int loom_cuda_context_device(const loom_cuda_context* ctx);

/* ---- backend interface ---------------------------------------------------------------------------- */

/** The "cuda" backend (loom.h) on device `device`: computes graphs whose tensors are in that
 *  device's memory (loom_backend_cuda_buffer_type, loom_context_alloc_tensors). NULL without a
 *  usable device. */
LOOM_API loom_backend* loom_backend_cuda_init(int device);
/** Whether `backend` is a CUDA backend. */
LOOM_API bool loom_backend_is_cuda(const loom_backend* backend);
/** Sets the backend's command-buffer chunks (1..LOOM_CUDA_MAX_COMMAND_BUFFERS). Checked, then without
 *  effect: the backend runs in plain mode. */
LOOM_API loom_status loom_backend_cuda_set_n_cb(loom_backend* backend, int n_cb);
/** Device memory of `device` (256-byte aligned): the memory the "cuda" backend computes on. NULL
 *  without a usable device. */
LOOM_API loom_buffer_type* loom_backend_cuda_buffer_type(int device);
/** Page-locked host memory as a buffer type (host-addressable, fast to copy to the device). */
LOOM_API loom_buffer_type* loom_backend_cuda_host_buffer_type(void);
/** A buffer over `size` bytes of existing device memory at `data` (from cudaMalloc or another
 *  library), on the device that owns it. Freeing the buffer leaves the memory alone. NULL if `data`
 *  is not device memory. */
LOOM_API loom_buffer* loom_backend_cuda_buffer_from_ptr(void* data, size_t size);
/** Whether the backend's device has compute capability `compute_capability` (major * 10 + minor,
 *  90 for Hopper) or newer: the seed's supports_family. False for a non-CUDA backend. */
LOOM_API bool loom_backend_cuda_supports_arch(const loom_backend* backend, int compute_capability);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_CUDA_H */
