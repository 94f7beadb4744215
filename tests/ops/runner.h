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
  /// The backend under test runs in the fast numerics mode: matrix products and attention are held
  /// to kNmseFast instead of their exact thresholds (docs/NUMERICS.md), every other op to its own.
  bool fast = false;
};

/// The fast mode's bound on matrix products and attention (tensor cores, f16 operands, float
/// accumulation): NMSE <= 5e-4 against the float64 reference, for every type, shape and head size.
inline constexpr double kNmseFast = 5e-4;
/// The threshold `c` is checked against under `run`.
double case_threshold(const OpCase& c, const RunSettings& run);

/// Checks `c` on `backend` against the float64 reference, or against `other` when it is given.
/// Prints one line.
Outcome check_case(const OpCase& c, Backend& backend, Backend* other, const RunSettings& run);

/// Times `c` on `backend` and prints µs per run, GB/s and TFLOP/s (with their shares of the H200's ceilings).
Outcome time_case(const OpCase& c, Backend& backend, const RunSettings& run);

/// Prints each op group with its case count and the dtypes of its inputs; every op kind of
/// graph.h that no case computes is named (and makes the result false).
bool list_cases(const CaseList& cases);

}  // namespace loom::optest
