/* Loom's C ABI for models: load a GGUF model, tokenize, and generate many sequences at once, each
 * with its own sampling parameters and seed, joining and leaving at any step (the C face of
 * loom::llm::BatchGenerator, include/loom/llm_batch.h). Part of libloom_capi.so, with loom.h.
 *
 *   loom_model* m = loom_model_load("model.gguf", NULL);        // NULL params: defaults
 *   loom_batch* b = loom_batch_create(m, 4096, 16);             // cells, sequences per step
 *   int32_t prompt[256]; int n = loom_tokenize(m, "Hello", true, prompt, 256);
 *   loom_sampling s = loom_sampling_default(); s.seed = 42;
 *   int seq = loom_batch_add(b, prompt, n, &s);                  // prefills, samples a first token
 *   int32_t ids[16], toks[16];
 *   int k = loom_batch_step(b, ids, toks, 16);                   // one token more per sequence
 *   loom_batch_remove(b, seq); loom_batch_free(b); loom_model_free(m);
 *
 * Errors as in loom.h: nothing aborts; a NULL handle or a negative count, and loom_last_error()
 * says what and where. A batch and its model are used by one thread at a time; the model must
 * outlive its batches.
 */
#ifndef LOOM_LLM_H
#define LOOM_LLM_H

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_model loom_model;
typedef struct loom_batch loom_batch;

/** How to load a model. */
typedef struct loom_model_params {
  const char* backend; /**< "cpu", "cuda", or NULL: the GPU when one is usable, else the CPU */
  int n_threads;       /**< CPU threads (0: all cores) */
  int numerics;        /**< -1: the backend's default; else a loom_numerics value of loom-cuda.h */
  /** Tensor parallelism: the model split over this many backends (GPUs 0..n-1); 1 (or 0): none */
  int n_tensor_parallel;
} loom_model_params;

LOOM_API loom_model_params loom_model_default_params(void);
/** NULL on failure (the error names the file). params may be NULL. */
LOOM_API loom_model* loom_model_load(const char* path, const loom_model_params* params);
LOOM_API void loom_model_free(loom_model* model);
/** Tokens of the vocabulary. */
LOOM_API int32_t loom_model_n_vocab(const loom_model* model);
/** The backend the model runs on ("cpu", "cuda"). */
LOOM_API const char* loom_model_backend(const loom_model* model);

/** Tokens of UTF-8 `text` into out[0..capacity); returns their count, or -1 on error. When the
 * count exceeds capacity, nothing is written and the count is returned: call again. */
LOOM_API int loom_tokenize(const loom_model* model, const char* text, bool add_special, int32_t* out,
                           int capacity);
/** The bytes of one token into buf (not NUL-terminated); returns their count (more than size:
 * nothing written, call again), or -1 for an id out of range. */
LOOM_API int loom_token_to_piece(const loom_model* model, int32_t token, char* buf, int size);
/** Whether the token ends a generation (EOS, EOT). */
LOOM_API bool loom_token_is_eog(const loom_model* model, int32_t token);

/** Sampling of one sequence (llama.cpp's chain: penalties, top-k, top-p, min-p, temperature). */
typedef struct loom_sampling {
  uint32_t seed;        /**< 0xFFFFFFFF: a random seed */
  int32_t top_k;        /**< <= 0: off */
  float top_p;          /**< >= 1: off */
  float min_p;          /**< <= 0: off */
  float temperature;    /**< <= 0: greedy */
  float repeat_penalty; /**< 1: off */
  int32_t repeat_last_n;
} loom_sampling;

LOOM_API loom_sampling loom_sampling_default(void);

/** A context of n_ctx KV cells (a paged cache shared by every sequence) for up to max_sequences
 * sequences per step, sampling in the forward pass's graph (loom_batch_set_device_sampling). NULL
 * on failure. */
LOOM_API loom_batch* loom_batch_create(loom_model* model, int n_ctx, int max_sequences);
LOOM_API void loom_batch_free(loom_batch* batch);
/** Whether loom_batch_step samples the sequences' tokens in the forward pass's graph, so that only
 * token ids come back (on by default), or on the host from logits read back (off). The tokens are
 * the same either way; sequences whose sampling cannot run there exactly (an active repeat penalty,
 * top_k <= 0 with temperature > 0) are sampled on the host regardless. */
LOOM_API loom_status loom_batch_set_device_sampling(loom_batch* batch, bool on);
/** Adds a sequence: prefills its prompt and samples its first token (loom_batch_generated).
 * Returns its id (>= 0), or -1 on error (nothing stays behind). sampling may be NULL (defaults). */
LOOM_API int loom_batch_add(loom_batch* batch, const int32_t* prompt, int n_prompt, const loom_sampling* sampling);
/** Like loom_batch_add, but the prompt is computed by the following loom_batch_step calls, one chunk
 * of at most `chunk` tokens (0: the context's batch) per step beside the running sequences, so a
 * long prompt does not stall them; the sequence yields its first token from the step that finishes
 * its prompt. Returns its id at once, or -1. */
LOOM_API int loom_batch_enqueue(loom_batch* batch, const int32_t* prompt, int n_prompt, const loom_sampling* sampling,
                                int chunk);
/** Removes a sequence and frees its cells. */
LOOM_API loom_status loom_batch_remove(loom_batch* batch, int seq_id);
/** One forward pass for every sequence (and one prompt chunk of an enqueued one): writes one
 * (sequence id, token) pair per sequence that produced a token (not those still prefilling), ids
 * increasing, into seq_ids/tokens (capacity at least loom_batch_n_sequences); returns the number
 * of pairs, or -1 on error (then no sequence advanced). */
LOOM_API int loom_batch_step(loom_batch* batch, int32_t* seq_ids, int32_t* tokens, int capacity);
LOOM_API int loom_batch_n_sequences(const loom_batch* batch);
/** The tokens sampled for seq_id so far into out[0..capacity); returns their count (-1: unknown
 * id). As loom_tokenize when the count exceeds capacity. */
LOOM_API int loom_batch_generated(const loom_batch* batch, int seq_id, int32_t* out, int capacity);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LLM_H */
