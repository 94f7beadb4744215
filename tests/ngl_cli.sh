#!/usr/bin/env bash
# `loom run` and `loom bench` with -ngl below the layer count (a GPU/CPU split) on a generated tiny
# model (2 layers). Without a usable GPU (a CPU build, no device) the split falls back to the CPU with
# a note, and the logits equal -ngl 0's byte for byte; with one, the load summary names the layers on
# the GPU and the logits stay within tools/compare_logits.py's default threshold of the CPU's.
#   usage: ngl_cli.sh LOOM_BINARY SOURCE_DIR
set -u
loom=$1
src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [[ -f $f ]] && { echo "--- $f"; cat -v "$f"; }; done
  exit 1
}
"$loom" gen-model --shape tiny --type f32 -o "$dir/tiny.gguf" 2>"$dir/gen.err" || fail "gen-model"

run() {  # name ngl
  "$loom" run -m "$dir/tiny.gguf" -ngl "$2" -t 2 -n 8 --temp 0 -p "hello world" --dump-logits "$dir/$1.bin" \
    >"$dir/$1.out" 2>"$dir/$1.err" || fail "loom run -ngl $2 exited with an error"
}
run cpu 0
run split 1
grep -q "not supported" "$dir/split.err" && fail "-ngl 1 refused"
[[ -s $dir/split.bin ]] || fail "no logits dumped"
if grep -q "no usable GPU" "$dir/split.err"; then
  grep -q "^loom: -ngl 1: no usable GPU .*running every layer on the CPU" "$dir/split.err" || fail "fallback note"
  cmp -s "$dir/cpu.bin" "$dir/split.bin" || fail "the CPU fallback's logits differ from -ngl 0's"
  cmp -s "$dir/cpu.out" "$dir/split.out" || fail "the CPU fallback's text differs from -ngl 0's"
  grep -q "backend cpu," "$dir/split.err" || fail "fallback run does not report the cpu backend"
  # -ngl at or above the layer count (all on the GPU) falls back the same way
  run all 99
  grep -q "^loom: -ngl 99: no usable GPU" "$dir/all.err" || fail "-ngl 99 fallback note"
  cmp -s "$dir/cpu.bin" "$dir/all.bin" || fail "-ngl 99's CPU fallback logits differ from -ngl 0's"
  echo "ngl: no usable GPU; -ngl 1 and -ngl 99 fell back to the CPU"
else
  grep -q "1 of 2 layers on cuda: layer 1 and the output" "$dir/split.err" || fail "split summary"
  grep -q "layers on cuda" "$dir/cpu.err" && fail "-ngl 0 offloaded layers"
  grep -q "backend cuda+cpu," "$dir/split.err" || fail "split run does not report cuda+cpu"
  if python3 -c "import numpy" 2>/dev/null; then
    python3 "$src/tools/compare_logits.py" "$dir/split.bin" "$dir/cpu.bin" --label "-ngl 1 vs cpu" ||
      fail "split logits differ from the CPU's"
  fi
  echo "ngl: -ngl 1 split the model between cuda and cpu"
fi

# bench: -ngl 1 runs (split or CPU fallback) and reports its rows
"$loom" bench -m "$dir/tiny.gguf" -ngl 1 -t 2 -p 8 -n 4 -r 1 >"$dir/bench.out" 2>"$dir/bench.err" ||
  fail "loom bench -ngl 1 exited with an error"
[[ $(grep -Ec '\| +(pp8|tg4) +\|' "$dir/bench.out") == 2 ]] || fail "bench rows"
echo "ngl: ok"
