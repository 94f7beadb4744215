/* The C ABI tests' checks (C11): counters and CHECK macros that print the failing expression with
 * loom_last_error(), never stopping the test. Include after loom.h. */
#ifndef LOOM_TEST_CAPI_CHECK_H
#define LOOM_TEST_CAPI_CHECK_H

#include <stdio.h>
#include <string.h>

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                                                       \
  do {                                                                                                    \
    ++g_checks;                                                                                           \
    if (!(cond)) {                                                                                        \
      fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, loom_last_error()); \
      ++g_failures;                                                                                       \
    }                                                                                                     \
  } while (0)

/* A failed status check prints the status and the message. */
#define CHECK_OK(expr)                                                                                  \
  do {                                                                                                  \
    loom_status st_ = (expr);                                                                           \
    ++g_checks;                                                                                         \
    if (st_ != LOOM_STATUS_OK) {                                                                        \
      fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, loom_status_string(st_), \
              loom_last_error());                                                                       \
      ++g_failures;                                                                                     \
    }                                                                                                   \
  } while (0)

#define CHECK_CONTAINS(text, needle)                                                      \
  do {                                                                                    \
    const char* text_ = (text);                                                           \
    ++g_checks;                                                                           \
    if (!text_ || !strstr(text_, (needle))) {                                             \
      fprintf(stderr, "FAIL %s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
              text_ ? text_ : "(null)", (needle));                                        \
      ++g_failures;                                                                       \
    }                                                                                     \
  } while (0)

#endif /* LOOM_TEST_CAPI_CHECK_H */
