/* Test of Loom's C ABI for models (loom-llm.h), compiled as C11: load the built-in model, tokenize and
 * detokenize, generate several sequences at once with loom_batch_* and check that each sequence's
 * greedy tokens equal the same sequence generated alone (also after one leaves mid-way), seeds,
 * sampling in the graph (the default) against the host, and the error paths (a NULL handle or -1
 * with a message, never an abort).
 *   usage: loom-test-capi-llm MODEL.gguf
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loom-llm.h"

#include "capi_check.h"

enum { kSeqs = 3, kSteps = 12, kMaxTokens = 64 };

static const char* const kPrompts[kSeqs] = {"ROMEO:", "First Citizen:\nBefore we proceed", "KING HENRY:\nOnce more"};

/* The tokens of one prompt generated alone: the first (from add) and kSteps more, sampled in the
 * forward pass's graph or (device false) on the host. */
static int generate_on(loom_model* m, const int32_t* prompt, int n, const loom_sampling* s, int32_t* out,
                       bool device) {
  loom_batch* b = loom_batch_create(m, 256, 1);
  if (!b) return -1;
  if (loom_batch_set_device_sampling(b, device) != LOOM_STATUS_OK) {
    loom_batch_free(b);
    return -1;
  }
  int seq = loom_batch_add(b, prompt, n, s);
  int32_t ids[1], toks[1];
  for (int i = 0; i < kSteps && seq >= 0; ++i)
    if (loom_batch_step(b, ids, toks, 1) != 1) seq = -1;
  int count = seq >= 0 ? loom_batch_generated(b, seq, out, kMaxTokens) : -1;
  loom_batch_free(b);
  return count;
}

static int generate_alone(loom_model* m, const int32_t* prompt, int n, const loom_sampling* s, int32_t* out) {
  return generate_on(m, prompt, n, s, out, true);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  /* errors: no abort, a message naming what */
  CHECK(loom_model_load(NULL, NULL) == NULL && strstr(loom_last_error(), "NULL") != NULL);
  CHECK(loom_model_load("/nonexistent/model.gguf", NULL) == NULL &&
        strstr(loom_last_error(), "/nonexistent/model.gguf") != NULL);

  loom_model_params mp = loom_model_default_params();
  mp.backend = "cpu";
  mp.n_threads = 2;
  loom_model* m = loom_model_load(argv[1], &mp);
  CHECK(m != NULL);
  if (!m) return 1;
  CHECK(strcmp(loom_model_backend(m), "cpu") == 0);
  CHECK(loom_model_n_vocab(m) > 0);

  /* tokenize: the two-call idiom, and the pieces give the text back */
  int32_t prompts[kSeqs][kMaxTokens];
  int n_prompt[kSeqs];
  for (int i = 0; i < kSeqs; ++i) {
    const int need = loom_tokenize(m, kPrompts[i], false, NULL, 0);
    CHECK(need > 0 && need <= kMaxTokens);
    n_prompt[i] = loom_tokenize(m, kPrompts[i], false, prompts[i], kMaxTokens);
    CHECK(n_prompt[i] == need);
  }
  char text[256] = {0};
  int len = 0;
  for (int t = 0; t < n_prompt[0]; ++t) {
    const int k = loom_token_to_piece(m, prompts[0][t], text + len, (int)sizeof(text) - 1 - len);
    CHECK(k >= 0);
    if (k > 0) len += k;
  }
  CHECK(strstr(text, "ROMEO:") != NULL);
  CHECK(loom_token_to_piece(m, -5, text, (int)sizeof(text)) == -1);

  /* greedy: every sequence generated together equals itself alone */
  loom_sampling greedy = loom_sampling_default();
  greedy.temperature = 0.0f;
  int32_t alone[kSeqs][kMaxTokens];
  int n_alone[kSeqs];
  for (int i = 0; i < kSeqs; ++i) {
    n_alone[i] = generate_alone(m, prompts[i], n_prompt[i], &greedy, alone[i]);
    CHECK(n_alone[i] == kSteps + 1);
  }
  /* the same greedy tokens from the model split over two CPU ranks; a split that cannot be is refused */
  {
    loom_model_params tp = mp;
    tp.n_tensor_parallel = 2;
    loom_model* m2 = loom_model_load(argv[1], &tp);
    CHECK(m2 != NULL);
    if (m2) {
      int32_t got[kMaxTokens];
      CHECK(generate_alone(m2, prompts[0], n_prompt[0], &greedy, got) == n_alone[0]);
      CHECK(memcmp(got, alone[0], (size_t)n_alone[0] * sizeof(int32_t)) == 0);
      loom_model_free(m2);
    }
    tp.n_tensor_parallel = 4;
    CHECK(loom_model_load(argv[1], &tp) == NULL && strstr(loom_last_error(), "divide by 4") != NULL);
  }
  loom_batch* b = loom_batch_create(m, 512, kSeqs);
  CHECK(b != NULL);
  if (!b) return 1;
  int seq[kSeqs];
  for (int i = 0; i < kSeqs; ++i) {
    seq[i] = loom_batch_add(b, prompts[i], n_prompt[i], &greedy);
    CHECK(seq[i] >= 0);
  }
  CHECK(loom_batch_n_sequences(b) == kSeqs);
  int32_t ids[kSeqs], toks[kSeqs];
  CHECK(loom_batch_step(b, ids, toks, 1) == -1 && strstr(loom_last_error(), "capacity") != NULL);
  for (int step = 0; step < kSteps; ++step) {
    if (step == kSteps / 2) { /* the middle sequence leaves; the others go on unchanged */
      int32_t got[kMaxTokens];
      const int n = loom_batch_generated(b, seq[1], got, kMaxTokens);
      CHECK(n == step + 1 && memcmp(got, alone[1], (size_t)n * sizeof(int32_t)) == 0);
      CHECK(loom_batch_remove(b, seq[1]) == LOOM_STATUS_OK);
    }
    const int n = loom_batch_step(b, ids, toks, kSeqs);
    CHECK(n == (step < kSteps / 2 ? kSeqs : kSeqs - 1));
    for (int k = 1; k < n; ++k) CHECK(ids[k] > ids[k - 1]);
  }
  for (int i = 0; i < kSeqs; i += 2) {
    int32_t got[kMaxTokens];
    const int n = loom_batch_generated(b, seq[i], got, kMaxTokens);
    CHECK(n == kSteps + 1 && memcmp(got, alone[i], (size_t)n * sizeof(int32_t)) == 0);
  }
  CHECK(loom_batch_generated(b, seq[1], toks, kSeqs) == -1);

  /* an enqueued prompt: computed 2 tokens per step beside the running ones, then the same tokens */
  {
    const int late = loom_batch_enqueue(b, prompts[1], n_prompt[1], &greedy, 2);
    CHECK(late >= 0);
    int32_t got[kMaxTokens];
    int steps = 0, n_got = 0;
    while (steps < 64 && (n_got = loom_batch_generated(b, late, got, kMaxTokens)) < kSteps + 1) {
      const int n = loom_batch_step(b, ids, toks, kSeqs);
      CHECK(n >= 2); /* the two running sequences advance every step */
      ++steps;
    }
    CHECK(steps >= (n_prompt[1] + 1) / 2);
    CHECK(n_got == kSteps + 1 && memcmp(got, alone[1], (size_t)n_got * sizeof(int32_t)) == 0);
    CHECK(loom_batch_remove(b, late) == LOOM_STATUS_OK);
  }
  CHECK(loom_batch_remove(b, 99) != LOOM_STATUS_OK);
  CHECK(loom_batch_add(b, prompts[0], 0, &greedy) == -1);

  /* seeds: the same seed gives the same sampled tokens, in a batch or alone */
  loom_sampling sampled = loom_sampling_default();
  sampled.temperature = 0.9f;
  sampled.seed = 1234;
  int32_t a1[kMaxTokens], a2[kMaxTokens];
  CHECK(generate_alone(m, prompts[2], n_prompt[2], &sampled, a1) == kSteps + 1);
  CHECK(generate_alone(m, prompts[2], n_prompt[2], &sampled, a2) == kSteps + 1);
  CHECK(memcmp(a1, a2, sizeof(int32_t) * (kSteps + 1)) == 0);
  /* on the host (loom_batch_set_device_sampling off): the same tokens, greedy and sampled */
  CHECK(generate_on(m, prompts[2], n_prompt[2], &sampled, a2, false) == kSteps + 1);
  CHECK(memcmp(a1, a2, sizeof(int32_t) * (kSteps + 1)) == 0);
  CHECK(generate_on(m, prompts[0], n_prompt[0], &greedy, a2, false) == n_alone[0]);
  CHECK(memcmp(alone[0], a2, (size_t)n_alone[0] * sizeof(int32_t)) == 0);
  CHECK(loom_batch_set_device_sampling(NULL, true) != LOOM_STATUS_OK &&
        strstr(loom_last_error(), "NULL") != NULL);
  sampled.temperature = -1.0f / 0.0f * 0.0f; /* NaN: refused by the sampler */
  CHECK(loom_batch_add(b, prompts[0], n_prompt[0], &sampled) == -1);

  loom_batch_free(b);
  CHECK(loom_batch_create(NULL, 16, 1) == NULL);
  CHECK(loom_batch_create(m, 0, 1) == NULL);
  loom_model_free(m);
  printf("loom-test-capi-llm: %d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
