#!/usr/bin/env bash
# One call on the GPU machine: unpack the Debian dependency packages carried in .debs/ into a private
# prefix, build everything with CUDA for sm_90, run the CUDA op test against the CPU, the unit tests,
# and print a summary table. Usage (device tool): carry [".debs"], command `bash scripts/gpu-check.sh`.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/loom-out}
mkdir -p "$out"
prefix=/tmp/loom-deps
if [[ -d .debs ]]; then
  mkdir -p "$prefix"
  for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
fi
export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH=/usr/local/cuda/bin:$PATH

declare -A result
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records pass/fail
  local name=$1; shift
  # LOOM_GPU_ONLY="ops_cuda exec": run only those steps (besides configure and build)
  if [[ -n ${LOOM_GPU_ONLY:-} && $name != configure && $name != build && " $LOOM_GPU_ONLY " != *" $name "* ]]; then
    return
  fi
  local t0=$(date +%s)
  # Every check written before the fast mode runs in exact numerics (docs/NUMERICS.md); `fast` runs
  # in the GPU's default mode.
  local numerics=exact
  [[ $name == fast ]] && numerics=${LOOM_NUMERICS:-}
  if LOOM_NUMERICS=$numerics "$@" >"$out/$name.log" 2>&1; then result[$name]="ok"; else result[$name]="FAIL(rc=$?)"; fi
  result[$name]="${result[$name]} $(( $(date +%s) - t0 ))s"
  tail -n 3 "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
build=build-gpu
step configure cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_BUILD_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90
step build cmake --build $build -j 16
step unit_tests ctest --test-dir $build --output-on-failure -j 8 -E loom-test-ops
step ops_cpu $build/bin/loom-test-ops -t 16
step ops_cuda $build/bin/loom-test-ops --backend cuda,cpu -t 16
[[ ${LOOM_GPU_PERF:-0} == 1 ]] && step ops_cuda_perf $build/bin/loom-test-ops --backend cuda perf
step builtin_cuda $build/bin/loom run --backend cuda -n 8
step capi_cuda $build/bin/loom-test-capi-cuda
step e2e bash scripts/gpu-e2e.sh $build/bin "$out"
step ngl bash scripts/gpu-ngl.sh $build/bin "$out"
step exec bash scripts/gpu-exec.sh $build/bin "$out" ${LOOM_GPU_QUICK:+quick}
step fast bash scripts/gpu-fast.sh $build/bin "$out" ${LOOM_GPU_QUICK:+quick}

echo
echo "== summary =="
printf '%-16s %s\n' step result
for k in configure build unit_tests ops_cpu ops_cuda ops_cuda_perf builtin_cuda capi_cuda e2e ngl exec fast; do
  printf '%-16s %s\n' "$k" "${result[$k]:-skipped}"
done
grep -h -E '^[0-9]+ passed' "$out"/ops_*.log 2>/dev/null | sed 's/^/ops: /'
grep -h -E '^e2e: |^compare_logits|^hf_reference' "$out"/e2e.log 2>/dev/null
grep -h -E '^ngl|^compare_logits' "$out"/ngl.log 2>/dev/null
grep -h -E '^exec|^\|' "$out"/exec.log 2>/dev/null
grep -h -E '^fast|^compare_logits|^\|' "$out"/fast.log 2>/dev/null
