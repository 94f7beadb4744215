#!/usr/bin/env bash
# The executor's checks on the GPU machine (called by gpu-check.sh after the build):
# equivalence of every executor configuration with the serialized mode on one model of every
# architecture (64 greedy steps, NMSE, run-to-run stability), then the benchmarks: the launch chain
# (bench_launch) and decode per configuration (loom bench --exec) on llama3-1b/8b F16 and Q4_0.
set -uo pipefail
bin=${1:?usage: gpu-exec.sh BUILD_BIN_DIR OUT_DIR [quick]}
out=${2:?}
quick=${3:-}
work=/tmp/loom-e2e  # gpu-e2e.sh leaves its models here
mkdir -p "$work"
fails=0
model() {  # model SHAPE TYPE: path of a generated model (made if missing)
  local f="$work/$1-$2.gguf"
  [[ -s $f ]] || "$bin/loom" gen-model --shape "$1" --type "$2" -o "$f" -t 16 >/dev/null 2>&1 || return 1
  echo "$f"
}
eq_models=()
for m in "tiny f16" "qwen2-tiny f32" "qwen3-tiny f16" "gemma2-tiny f32" "gemma3-tiny f16" "qwen3moe-tiny f32" \
         "qwen3moe-tiny q8_0" "llama3-1b q4_0" "llama3-1b f16"; do
  read -r shape type <<<"$m"
  f=$(model "$shape" "$type") && eq_models+=("$f") || { echo "exec: gen-model $m FAIL"; fails=$((fails + 1)); }
done
"$bin/loom-exec-equivalence" --steps 64 --runs 3 "${eq_models[@]}" || fails=$((fails + 1))

if [[ -x $bin/bench_launch ]]; then
  "$bin/bench_launch" || fails=$((fails + 1))
fi
# Decoding 1,000 tokens from an empty cache: how often the executable graph is built (n_kv buckets).
if f=$(model llama3-1b q4_0); then
  "$bin/loom" bench -m "$f" -p 0 -n 1000 -r 1 --no-warmup --exec all || fails=$((fails + 1))
fi
if [[ -z $quick ]]; then
  # LOOM_BENCH_MODELS="llama3-1b:q4_0 ..." narrows the decode benchmark
  for m in ${LOOM_BENCH_MODELS:-llama3-1b:q4_0 llama3-1b:f16 llama3-8b:q4_0 llama3-8b:f16}; do
    m=${m/:/ }
    read -r shape type <<<"$m"
    f=$(model "$shape" "$type") || { echo "exec: gen-model $m FAIL"; fails=$((fails + 1)); continue; }
    "$bin/loom" bench -m "$f" -p 512 -n 128 -r 3 --exec serialize,graph,concurrency,fusion,reorder,all \
      || fails=$((fails + 1))
    [[ $shape == llama3-8b ]] && rm -f "$f"  # 16 GB of disk each
  done
fi
echo "exec: $fails failures"
exit $((fails > 0))
