#!/usr/bin/env bash
# Packs the GPU build's binaries for scripts/gpu-carried.sh (the device tool carries at most 64 MiB with
# the tracked tree): build-carry/bins.tar.xz from build-gpu/bin (or $1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# --base: as build-carry/base.tar.xz instead, the build that gpu-carried.sh's "@base" mode runs. The
# device tool carries at most 64 MiB with the tracked tree (~57 MiB): with both tarballs, move
# models/loom-shakespeare-q8_0.gguf aside for that call (no GPU step reads it) and back after.
out=$root/build-carry/bins.tar.xz
if [[ ${1:-} == --base ]]; then out=$root/build-carry/base.tar.xz; shift; fi
bin=${1:-$root/build-gpu/bin}
mkdir -p "$root/build-carry"
extra=()
[[ -x $bin/bench_phases ]] && extra+=(bench_phases)  # the phases micro-benchmark (gpu-carried.sh phases)
tar cf - -C "$bin" loom loom-test-ops loom-exec-equivalence libloom_cuda.so "${extra[@]}" | xz -6 -T2 >"$out"
ls -la "$out"
