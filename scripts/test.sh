#!/usr/bin/env bash
# Builds everything (the CUDA backend too when nvcc is found) and runs the whole CPU test suite.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/deps.sh" --tests
build=${LOOM_BUILD_DIR:-$root/build-test}
jobs=${LOOM_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=ON ${LOOM_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 600
