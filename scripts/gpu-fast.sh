#!/usr/bin/env bash
# The fast numerics mode on the GPU machine (called by gpu-check.sh after the build): op-level bounds
# (CUDA fast against the CPU and against the float64 reference), run-to-run determinism, whole-model
# logits fast vs exact, and the prefill benchmarks in both modes.
#   gpu-fast.sh BUILD_BIN_DIR OUT_DIR [quick]
# LOOM_FAST_MODELS="llama3-1b:q4_0 ..." narrows the benchmark models (llama3-8b ones take minutes to make).
set -uo pipefail
bin=${1:?usage: gpu-fast.sh BUILD_BIN_DIR OUT_DIR [quick]}
out=${2:?}
quick=${3:-}
work=/tmp/loom-e2e  # shared with gpu-e2e.sh / gpu-exec.sh: models made once
mkdir -p "$work"
fails=0
check() {  # check LABEL COMMAND...
  local label=$1; shift
  if "$@"; then echo "fast: $label ok"; else echo "fast: $label FAIL"; fails=$((fails + 1)); fi
}
model() {  # model SHAPE TYPE: path of a generated model (made if missing)
  local f="$work/$1-$2.gguf"
  [[ -s $f ]] || "$bin/loom" gen-model --shape "$1" --type "$2" -o "$f" -t 16 >/dev/null 2>&1 || return 1
  echo "$f"
}

# Op level: every op CUDA-fast against the CPU; matrix products and attention also against float64.
check "ops cuda(fast) vs cpu" "$bin/loom-test-ops" --backend cuda,cpu --numerics fast -t 16
check "ops cuda(fast) vs float64 (mul_mat, flash_attn)" "$bin/loom-test-ops" --backend cuda --numerics fast \
  --op mul_mat,mul_mat_id,flash_attn

# Whole model: fast against exact on the same prompt (prefill of ~90 tokens + greedy decode), and
# two fast runs bit-identical.
prompt="It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of \
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was \
the season of Darkness, it was the spring of hope, it was the winter of despair."
for m in "tiny f16" "gemma2-tiny f32" "qwen3moe-tiny q8_0" "llama3-1b q4_0" "llama3-1b q4_K_M" "llama3-1b f16"; do
  read -r shape type <<<"$m"
  f=$(model "$shape" "$type") || { echo "fast: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
  for mode in exact fast fast2; do
    "$bin/loom" run -m "$f" --backend cuda --numerics ${mode%2} -p "$prompt" -n 16 --temp 0 \
      --dump-logits "$work/$shape-$type-$mode.bin" >"$work/$shape-$type-$mode.txt" 2>"$work/$shape-$type-$mode.err" ||
      { echo "fast: run $m $mode FAIL: $(tail -1 "$work/$shape-$type-$mode.err")"; fails=$((fails + 1)); }
  done
  check "$m fast run-to-run bit-identical logits" cmp -s "$work/$shape-$type-fast.bin" "$work/$shape-$type-fast2.bin"
  python3 tools/compare_logits.py "$work/$shape-$type-fast.bin" "$work/$shape-$type-exact.bin" --threshold 1 \
    --label "$m fast vs exact"
  cmp -s "$work/$shape-$type-fast.txt" "$work/$shape-$type-exact.txt" && echo "fast: $m greedy 16 tokens fast == exact" ||
    echo "fast: $m greedy 16 tokens differ (fast vs exact)"
done

# Speed: GEMM kernels, then prefill of whole models in both modes.
"$bin/loom-test-ops" --backend cuda --numerics fast perf --op mul_mat,flash_attn >"$out/perf-fast.log" 2>&1 ||
  { echo "fast: perf FAIL"; fails=$((fails + 1)); }
grep -E "mul_mat|flash_attn" "$out/perf-fast.log" | grep -E "\[4096, (16|64|256|512|2048|4096)\]|flash|128256|14336" | head -80
if [[ -z $quick ]]; then
  for m in ${LOOM_FAST_MODELS:-llama3-1b:f16 llama3-1b:q4_0 llama3-1b:q4_K_M}; do
    m=${m/:/ }
    read -r shape type <<<"$m"
    f=$(model "$shape" "$type") || { echo "fast: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
    for mode in fast exact; do
      "$bin/loom" bench -m "$f" -p ${LOOM_FAST_PP:-512,4096} -n ${LOOM_FAST_TG:-128} -r 3 --numerics $mode ||
        fails=$((fails + 1))
      [[ $mode == fast && $shape == llama3-8b ]] && break  # exact 8b prefill is minutes
    done
  done
fi
echo "fast: $fails failures"
exit $((fails > 0))
