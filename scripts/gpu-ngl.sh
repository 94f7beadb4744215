#!/usr/bin/env bash
# -ngl N on the GPU machine: the last N layers (and the output) on CUDA, the rest on the CPU.
# Logits of the prompt against the CPU's (-ngl 0): NMSE <= 1e-4 and the same greedy tokens for 16 steps
# (quantized models match exactly since docs/NUMERICS.md; float ones within rounding).
# Also a trace and the executor's counters of a replayed decode step.
set -uo pipefail
bin=${1:?usage: gpu-ngl.sh BUILD_BIN_DIR OUT_DIR}
out=${2:?}
work=/tmp/loom-e2e
mkdir -p "$work"
prompt="The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun"
fails=0
for m in "small f16" "gemma2-tiny f32" "gemma3-tiny f16" "qwen3moe-tiny f32" "qwen2-tiny f32" "llama3-1b f16" "llama3-1b q4_0"; do
  read -r shape type <<<"$m"
  f="$work/$shape-$type.gguf"
  [[ -s $f ]] || "$bin/loom" gen-model --shape "$shape" --type "$type" -o "$f" -t 16 >/dev/null 2>&1 || { echo "ngl: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
  n_layer=$("$bin/loom" info -m "$f" 2>/dev/null | awk '/block_count/ {print $NF; exit}')
  n_layer=${n_layer:-2}
  "$bin/loom" run -m "$f" -ngl 0 -t 16 -p "$prompt" -n 16 --temp 0 --dump-logits "$work/ngl-$shape-$type-0.bin" \
    >"$work/ngl-$shape-$type-0.txt" 2>/dev/null || { echo "ngl: $m -ngl 0 FAIL"; fails=$((fails + 1)); continue; }
  for n in 1 $((n_layer / 2)) $((n_layer - 1)); do
    (( n >= 1 && n < n_layer )) || continue
    "$bin/loom" run -m "$f" -ngl $n -t 16 -p "$prompt" -n 16 --temp 0 --dump-logits "$work/ngl-$shape-$type-$n.bin" \
      >"$work/ngl-$shape-$type-$n.txt" 2>"$work/ngl-$shape-$type-$n.err" || { echo "ngl: $m -ngl $n FAIL: $(tail -1 "$work/ngl-$shape-$type-$n.err")"; fails=$((fails + 1)); continue; }
    grep -q "layers on cuda" "$work/ngl-$shape-$type-$n.err" || { echo "ngl: $m -ngl $n did not split"; fails=$((fails + 1)); continue; }
    python3 tools/compare_logits.py "$work/ngl-$shape-$type-$n.bin" "$work/ngl-$shape-$type-0.bin" --threshold 1e-4 \
      --label "$m -ngl $n/$n_layer vs cpu" || fails=$((fails + 1))
    cmp -s "$work/ngl-$shape-$type-$n.txt" "$work/ngl-$shape-$type-0.txt" && echo "ngl: $m -ngl $n greedy 16 tokens equal ok" \
      || { echo "ngl: $m -ngl $n greedy tokens differ FAIL"; fails=$((fails + 1)); }
  done
done
# a replayed decode step on the GPU: trace, plan and counters (PDL edges, groups, fusions)
f="$work/llama3-1b-q4_0.gguf"
if [[ -s $f ]]; then
  "$bin/loom" run -m "$f" --backend cuda -n 8 --temp 0 -p "$prompt" --stats --trace "$out/trace-1b-q4_0.json" 2>&1 | grep -E "stats|trace|edges|fusions|groups|reordered" | head -20
fi
f="$work/llama3-1b-f16.gguf"
if [[ -s $f ]]; then
  "$bin/loom" run -m "$f" --backend cuda -n 8 --temp 0 -p "$prompt" --stats --trace "$out/trace-1b-f16.json" 2>&1 | grep -E "edges|host" | head -6
  "$bin/loom" bench -m "$f" -ngl 8 -p 512 -n 128 -r 3 || fails=$((fails + 1))
fi
echo "ngl: $fails failures"
exit $((fails > 0))
