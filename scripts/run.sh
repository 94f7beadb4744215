#!/usr/bin/env bash
# The main job: builds Loom (Release) and runs `loom run` with any arguments given.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/deps.sh"
build=${LOOM_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target loom
exec "$build/bin/loom" run "$@"
