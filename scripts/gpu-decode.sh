#!/usr/bin/env bash
# Decode on the GPU machine in one call, with binaries built elsewhere (carried build dir) or here:
# the fast mat-vec kernels against the CPU (op test, both numerics), their bandwidth (op-test perf:
# GB/s and % of 4,350 GB/s), whole-model fast vs exact logits and run-to-run determinism, and
# `loom bench` tg128 in both modes on the built-in model and the 1B files.
#   gpu-decode.sh BUILD_BIN_DIR OUT_DIR [STEPS]
# STEPS (default "ops models bench trace perf") picks the parts; also "depth" (tg128 at depth 4096),
# "batched" (llama-batched-bench's table, -npl 1,8,32,64) and "serve" (tools/serve_load.py against
# `loom serve -np 16`, 64 streaming requests), not in the default.
# LOOM_DECODE_MODELS="llama3-1b:q4_0 ..." picks the generated files (8B ones take minutes to make).
set -uo pipefail
bin=${1:?usage: gpu-decode.sh BUILD_BIN_DIR OUT_DIR}
out=${2:?}
steps=" ${3:-ops models bench trace perf} "
want() { [[ $steps == *" $1 "* ]]; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mkdir -p "$out"
prefix=/tmp/loom-deps
if [[ -d .debs && ! -d $prefix/usr ]]; then
  mkdir -p "$prefix"
  for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
fi
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:$root/$bin:$root/$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=$root/$bin
work=/tmp/loom-e2e
mkdir -p "$work"
fails=0
check() {  # check LABEL COMMAND...
  local label=$1; shift
  if "$@"; then echo "decode: $label ok"; else echo "decode: $label FAIL"; fails=$((fails + 1)); fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
t0=$(date +%s)
stamp() { echo "decode: [$(($(date +%s) - t0)) s] $*"; }

# 1. Correctness: every op, CUDA fast against the CPU; the mat-vec family also in exact.
want ops && check "ops cuda(fast) vs cpu" "$bin/loom-test-ops" --backend cuda,cpu --numerics fast -t 16 >"$out/ops-fast.log" 2>&1
want ops && tail -n 4 "$out/ops-fast.log"
want ops && check "mat-vec ops cuda(exact) vs cpu" "$bin/loom-test-ops" --backend cuda,cpu --numerics exact -t 16 \
  --op mul_mat,mat_vec_bias,mat_vec_multi,glu_mat_vec >"$out/ops-exact.log" 2>&1
want ops && tail -n 2 "$out/ops-exact.log"
stamp "ops done"

# 2. Whole model: fast vs exact logits, fast run-to-run bit-identical.
prompt="It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of \
foolishness, it was the epoch of belief."
model() {  # model SHAPE TYPE: path of a generated model (made if missing)
  local f="$work/$1-$2.gguf"
  [[ -s $f ]] || "$bin/loom" gen-model --shape "$1" --type "$2" -o "$f" -t 16 >/dev/null 2>&1 || return 1
  echo "$f"
}
models=${LOOM_DECODE_MODELS:-llama3-1b:q4_0 llama3-1b:q4_K_M llama3-1b:f16}
want models && for m in builtin $models; do
  if [[ $m == builtin ]]; then f=models/loom-shakespeare-f16.gguf; else
    read -r shape type <<<"${m/:/ }"
    f=$(model "$shape" "$type") || { echo "decode: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
  fi
  tag=${m/:/-}
  for mode in exact fast fast2; do
    "$bin/loom" run -m "$f" --backend cuda --numerics ${mode%2} -p "$prompt" -n 32 --temp 0 \
      --dump-logits "$work/$tag-$mode.bin" >"$work/$tag-$mode.txt" 2>"$work/$tag-$mode.err" ||
      { echo "decode: run $m $mode FAIL: $(tail -1 "$work/$tag-$mode.err")"; fails=$((fails + 1)); }
  done
  check "$m fast run-to-run bit-identical" cmp -s "$work/$tag-fast.bin" "$work/$tag-fast2.bin"
  python3 tools/compare_logits.py "$work/$tag-fast.bin" "$work/$tag-exact.bin" --threshold 1 --label "$m fast vs exact"
  cmp -s "$work/$tag-fast.txt" "$work/$tag-exact.txt" && echo "decode: $m greedy 32 tokens fast == exact" ||
    echo "decode: $m greedy 32 tokens differ (fast vs exact)"
done
stamp "models done"

# 3. Speed: tg128 in both modes.
want bench && for m in builtin $models; do
  if [[ $m == builtin ]]; then args=(-m models/loom-shakespeare-f16.gguf); else
    read -r shape type <<<"${m/:/ }"
    f=$(model "$shape" "$type") || { echo "decode: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
    args=(-m "$f")
  fi
  for mode in fast exact; do
    "$bin/loom" bench "${args[@]}" -p 0 -n 128 -r 3 --numerics $mode 2>/dev/null | grep -E "^\|" |
      grep -v -- "---" || fails=$((fails + 1))
  done
done
stamp "bench done"

# 4. Where one decode step's GPU time goes (one dispatch at a time, events), fast mode.
want trace && for m in $models; do
  read -r shape type <<<"${m/:/ }"
  "$bin/loom" run -m "$work/$shape-$type.gguf" --backend cuda -p "$prompt" -n 8 --temp 0 \
    --trace "$out/trace-$shape-$type.json" >/dev/null 2>&1 || { echo "decode: trace $m FAIL"; continue; }
  echo "== decode step trace $m (fast)"
  python3 tools/trace_summary.py "$out/trace-$shape-$type.json" --by-shape | head -24
done
stamp "traces done"

# 5. Mat-vec bandwidth (op-test perf, 1..8 columns of the 8B shapes).
if want perf; then
  "$bin/loom-test-ops" --backend cuda --numerics fast perf --op mul_mat --exclude ", 16]" --exclude ", 64]" \
    --exclude ", 256]" --exclude ", 512]" --exclude ", 2048]" --exclude ", 4096]" >"$out/perf-matvec.log" 2>&1 ||
    { echo "decode: perf FAIL"; fails=$((fails + 1)); }
fi
want perf && grep -E "b=f32\[[0-9]+, [1-8]\]" "$out/perf-matvec.log" | head -120
stamp "perf done"

# 6. Depth, batched decode and the server, on each model of LOOM_DECODE_MODELS.
for m in $models; do
  want depth || want batched || want serve || break
  read -r shape type <<<"${m/:/ }"
  f=$(model "$shape" "$type") || { echo "decode: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
  want depth && "$bin/loom" bench -m "$f" -p 0 -n 128 -r 2 -d 4096 2>/dev/null | grep -E "tg128"
  want batched && "$bin/loom" bench -m "$f" -npp 128 -ntg 128 -npl 1,8,32,64 2>&1 | grep -E "^\|"
  if want serve; then
    "$bin/loom" serve -m "$f" --port 0 -np 16 >"$out/serve-$shape-$type.out" 2>"$out/serve-$shape-$type.err" &
    spid=$!
    for _ in $(seq 600); do [[ -s $out/serve-$shape-$type.out ]] && break; sleep 0.1; done
    port=$(head -1 "$out/serve-$shape-$type.out")
    for _ in $(seq 600); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
        2>/dev/null && break
      sleep 0.2
    done
    echo "== serve $m: 64 streaming requests, 16 concurrent"
    python3 tools/serve_load.py --url "http://127.0.0.1:$port" -c 16 -n 64 --max-tokens 128 --check ||
      { echo "decode: serve $m FAIL"; fails=$((fails + 1)); }
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  fi
done
stamp "depth/batched/serve done"
echo "decode: $fails failures"
exit $((fails > 0))
