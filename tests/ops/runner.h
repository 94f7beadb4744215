// Runs op cases on backends and compares the results.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/backend.h"
#include "op_test.h"

namespace loom::optest {

/// How a case ended.
enum class Outcome { passed, failed, unsupported };

/// Counts for the final line.
struct Tally {
  int passed = 0;
  int failed = 0;
  int unsupported = 0;
  void add(Outcome o) {
    if (o == Outcome::passed)
      ++passed;
    else if (o == Outcome::failed)
      ++failed;
    else
      ++unsupported;
  }
};

/// What every case run shares.
struct RunSettings {
  bool verbose = false;  ///< details of passing cases too
  uint64_t seed = 0;     ///< mixed into every case's seed (0: the data the suite is tuned on)
};

/// Checks `c` on `backend` against the float64 reference, or against `other` when it is given.
/// Prints one line.
Outcome check_case(const OpCase& c, Backend& backend, Backend* other, const RunSettings& run);

/// Times `c` on `backend` and prints µs per run, GB/s and GFLOP/s.
Outcome time_case(const OpCase& c, Backend& backend, const RunSettings& run);

/// Prints each op group with its case count and the dtypes of its inputs; every op kind of
/// graph.h that no case computes is named (and makes the result false).
bool list_cases(const CaseList& cases);

}  // namespace loom::optest
