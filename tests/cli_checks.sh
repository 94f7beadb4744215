#!/usr/bin/env bash
# What a new user runs into with the `loom` command: non-regular model files, --version, sampler
# values out of range, a prompt file that is not UTF-8, chat and perplexity without -m; --swa-full;
# -tp on the CPU; run and chat sampling in the graph or (--host-sampling) on the host, the same text;
# --deterministic.
#   usage: cli_checks.sh LOOM_BINARY PROJECT_VERSION SOURCE_DIR
set -u
loom=$1
version=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [[ -f $f ]] && { echo "--- $f"; cat -v "$f"; }; done
  exit 1
}
# Runs `loom ARGS...` with a time limit, output in $dir/NAME.out and .err; returns loom's exit code.
run() {  # name args...
  local name=$1
  shift
  timeout 60 "$loom" "$@" </dev/null >"$dir/$name.out" 2>"$dir/$name.err"
}
# `loom ARGS...` must fail, with TEXT on stderr, and neither hang nor crash.
refused() {  # name text args...
  local name=$1 text=$2
  shift 2
  run "$name" "$@"
  local rc=$?
  ((rc == 124)) && fail "$name: 'loom $*' hung"
  ((rc == 0)) && fail "$name: 'loom $*' was accepted"
  ((rc > 128)) && fail "$name: 'loom $*' crashed (exit $rc)"
  grep -qF -- "$text" "$dir/$name.err" || fail "$name: 'loom $*': no '$text' in the error"
}
"$loom" gen-model --shape tiny --type f32 -o "$dir/tiny.gguf" 2>"$dir/gen.err" || fail "gen-model"
# an unknown weight type is refused with every type it takes (the file-type table's names)
refused gen-model-type "unknown type 'q9_9' (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K, q4_K_M" \
  gen-model --shape tiny --type q9_9 -o "$dir/never.gguf"
grep -qF "MXFP4_MOE)" "$dir/gen-model-type.err" || fail "gen-model-type: MXFP4_MOE not listed"
[[ -e $dir/never.gguf ]] && fail "gen-model-type: a file was written"

# ---- model files that are not regular files fail at once -------------------------------------------
mkfifo "$dir/fifo.gguf"
refused info-fifo "fifo.gguf: not a regular file (a FIFO" info -m "$dir/fifo.gguf"
refused info-fifo-positional "fifo.gguf: not a regular file (a FIFO" info "$dir/fifo.gguf"
refused run-fifo "fifo.gguf: not a regular file (a FIFO" run -m "$dir/fifo.gguf" -n 1
refused info-dir "not a regular file (a directory)" info "$dir"
refused info-missing "no-such.gguf: cannot open" info "$dir/no-such.gguf"
refused info-none "file" info
refused info-both "file" info -m "$dir/tiny.gguf" "$dir/tiny.gguf"
run info-positional info "$dir/tiny.gguf" || fail "loom info FILE"
run info-m info -m "$dir/tiny.gguf" || fail "loom info -m FILE"
cmp -s "$dir/info-positional.out" "$dir/info-m.out" || fail "loom info FILE and -m FILE differ"
grep -q "^support:  Loom can run this file: architecture llama" "$dir/info-m.out" || fail "info: no support line"

# ---- --version and -V ------------------------------------------------------------------------------
for flag in --version -V; do
  run "version$flag" "$flag" || fail "loom $flag exited with an error"
  grep -Eq "^loom $version( \(git [0-9a-f]+(-modified)?\))?\$" "$dir/version$flag.out" || fail "loom $flag printed something else"
done

# ---- sampler values out of range are refused, naming the flag ---------------------------------------
m=(-m "$dir/tiny.gguf" -t 2 -n 2 -p hi)
refused top-p "--top-p" run "${m[@]}" --top-p 7
refused top-p-neg "--top-p" run "${m[@]}" --top-p -0.1
refused top-p-nan "--top-p" run "${m[@]}" --top-p nan
refused min-p "--min-p" run "${m[@]}" --min-p 2
refused temp "--temp" run "${m[@]}" --temp -1
refused temp-inf "--temp" run "${m[@]}" --temp inf
refused top-k "--top-k" run "${m[@]}" --top-k -3
refused repeat-zero "--repeat-penalty" run "${m[@]}" --repeat-penalty 0
refused repeat-neg "--repeat-penalty" run "${m[@]}" --repeat-penalty -1.5
refused n-predict "--n-predict" run "${m[@]}" -n -5
refused chat-top-p "--top-p" chat -m "$dir/tiny.gguf" --top-p 1.5
refused chunks "--chunks" perplexity -m "$dir/tiny.gguf" -f /dev/null --chunks 0
# the edges of each range are accepted
run edges run "${m[@]}" --top-p 1 --min-p 0 --temp 0 --top-k 0 --repeat-penalty 1.1 || fail "edge values refused"
run edges2 run "${m[@]}" --top-p 0 --min-p 1 --temp 2.5 --top-k 5 --repeat-penalty 0.5 || fail "edge values refused"

# ---- a prompt file that is not UTF-8 is reported under its own name ---------------------------------
printf 'hello \xff\xfe world\n' >"$dir/bad-prompt.txt"
refused bad-utf8 "bad-prompt.txt: not valid UTF-8 at byte 6" run -m "$dir/tiny.gguf" -f "$dir/bad-prompt.txt" -n 2
grep -q "tiny.gguf" "$dir/bad-utf8.err" && fail "the UTF-8 error names the model file"
refused bad-utf8-p "the prompt (-p): not valid UTF-8 at byte 1" run -m "$dir/tiny.gguf" -p $'a\xc3' -n 2
printf 'text \xc3\x28 more\n' >"$dir/bad-text.txt"
refused bad-utf8-ppl "bad-text.txt: not valid UTF-8 at byte 5" perplexity -m "$dir/tiny.gguf" -f "$dir/bad-text.txt"
grep -q "tiny.gguf" "$dir/bad-utf8-ppl.err" && fail "the perplexity UTF-8 error names the model file"

# ---- chat and perplexity without -m use the built-in model ------------------------------------------
# LOOM_MODEL picks the built-in model's file (run does the same); the tiny model keeps this fast.
printf 'hello\n' | LOOM_MODEL="$dir/tiny.gguf" timeout 60 "$loom" chat --chat-template chatml -n 4 --temp 0 -t 2 \
  >"$dir/chat.out" 2>"$dir/chat.err" || fail "loom chat without -m"
grep -q "^loom: turn 1:" "$dir/chat.err" || fail "chat without -m: no turn"
for i in $(seq 12); do echo "The river ran quickly past the old mill, line $i."; done >"$dir/text.txt"
LOOM_MODEL="$dir/tiny.gguf" timeout 60 "$loom" perplexity -f "$dir/text.txt" -c 64 -t 2 --chunks 1 \
  >"$dir/ppl.out" 2>"$dir/ppl.err" || fail "loom perplexity without -m"
grep -q '^Final estimate: PPL = ' "$dir/ppl.out" || fail "perplexity without -m: no estimate"
# the built-in model itself: chat falls back to chatml (the model has no template), perplexity to
# the model's context of 256
builtin="$src/models/loom-shakespeare-q8_0.gguf"
printf 'ROMEO:\n' | LOOM_MODEL="$builtin" timeout 120 "$loom" chat -n 8 --temp 0 -t 2 \
  >"$dir/chat-builtin.out" 2>"$dir/chat-builtin.err" || fail "loom chat with the built-in model"
grep -q "^loom: chat template chatml (the fallback: .* has no tokenizer.chat_template)" "$dir/chat-builtin.err" ||
  fail "chat with the built-in model: no note on the template"
grep -q "^loom: turn 1:.*reply 8 tokens" "$dir/chat-builtin.err" || fail "chat with the built-in model: no reply"
LOOM_MODEL="$builtin" timeout 120 "$loom" perplexity -f "$src/tests/data/shakespeare_heldout_sample.txt" \
  --chunks 1 -t 2 >"$dir/ppl-builtin.out" 2>"$dir/ppl-builtin.err" || fail "loom perplexity with the built-in model"
grep -q "chunks of 256 tokens" "$dir/ppl-builtin.err" || fail "perplexity with the built-in model: not -c 256"
grep -q '^Final estimate: PPL = ' "$dir/ppl-builtin.out" || fail "perplexity with the built-in model: no estimate"
# without -f there is nothing to evaluate: a clear error before any model loads
refused ppl-no-text "no text to evaluate: pass -f TEXT" perplexity
LOOM_MODEL="$dir/tiny.gguf" refused ppl-no-text-env "no text to evaluate: pass -f TEXT" perplexity
# no built-in model to be found: the error says how to give one
LOOM_MODEL="$dir/no-such.gguf" refused chat-no-model "no-such.gguf: cannot open" chat --chat-template chatml
# ---- sliding-window layers: the ring of the window, or with --swa-full the whole context ---------------
"$loom" gen-model --shape gemma3-tiny --type f16 -o "$dir/gemma3.gguf" 2>"$dir/gen-gemma3.err" || fail "gen-model gemma3"
p="The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun"
# (--dump-step-logits: the 7 one-token steps' logits too, where the ring wraps)
run swa-ring run -m "$dir/gemma3.gguf" -t 2 --ubatch-size 4 -p "$p" -n 8 --temp 0 --dump-logits "$dir/ring.bin" \
  --dump-step-logits "$dir/ring.steps" || fail "run gemma3 (window ring)"
run swa-full run -m "$dir/gemma3.gguf" -t 2 --ubatch-size 4 --swa-full -p "$p" -n 8 --temp 0 \
  --dump-logits "$dir/full.bin" --dump-step-logits "$dir/full.steps" || fail "run gemma3 --swa-full"
grep -q "KV cache 273.5 KiB" "$dir/swa-ring.err" || fail "gemma3: the local layers' cache is not their ring"
grep -q "KV cache 1.5 MiB" "$dir/swa-full.err" || fail "gemma3 --swa-full: not the whole context"
cmp -s "$dir/ring.bin" "$dir/full.bin" || fail "gemma3: the ring's logits differ from the full cache's"
cmp -s "$dir/ring.steps" "$dir/full.steps" || fail "gemma3: the ring's step logits differ from the full cache's"
cmp -s "$dir/swa-ring.out" "$dir/swa-full.out" || fail "gemma3: the ring's tokens differ from the full cache's"
# the step logits: one row a step (-n 8: 7 steps), and greedy's next token is each row's argmax
python3 - "$dir/ring.steps" <<'PY' || fail "gemma3: --dump-step-logits rows do not match the tokens generated"
import array, sys
path = sys.argv[1]
ids = [int(t) for t in open(path + ".tokens").read().strip().split(",")]
rows = array.array("f")
rows.frombytes(open(path, "rb").read())
assert len(ids) == 7, f"{len(ids)} step ids, 7 expected"
assert len(rows) % len(ids) == 0 and len(rows) > 0, f"{len(rows)} floats for {len(ids)} steps"
n_vocab = len(rows) // len(ids)
for i in range(len(ids) - 1):
    row = rows[i * n_vocab:(i + 1) * n_vocab]
    best = max(range(n_vocab), key=row.__getitem__)
    assert best == ids[i + 1], f"step {i}: argmax {best}, next token fed {ids[i + 1]}"
PY
# ---- tensor parallelism on the CPU: -tp 2 gives -tp 1's greedy text; what cannot split is refused ----
run tp1 run -t 1 --backend cpu -p "$p" -n 16 --temp 0 || fail "run -tp 1"
run tp2 run -t 1 --backend cpu -p "$p" -n 16 --temp 0 -tp 2 || fail "run -tp 2"
grep -q "split over 2 cpu ranks" "$dir/tp2.err" || fail "-tp 2: no split in the model summary"
cmp -s "$dir/tp1.out" "$dir/tp2.out" || fail "-tp 2: the built-in model's greedy text differs from -tp 1's"
refused tp4-heads "needs the attention heads (6) to divide by 4" run -t 1 --backend cpu -n 1 -tp 4
refused tp0 "--tensor-parallel: Value 0 not in range" run -t 1 --backend cpu -n 1 -tp 0
# ---- sampling in the forward pass's graph (the default) or with --host-sampling: the same text -------
for cmd in run chat; do  # serve: serve_cli.sh (builds without cpp-httplib have no serve)
  run "help-$cmd" "$cmd" --help || fail "loom $cmd --help"
  grep -q -- "--host-sampling" "$dir/help-$cmd.out" || fail "loom $cmd --help: no --host-sampling"
done
same_text() {  # name args... (of loom run): the default and --host-sampling print the same text
  local name=$1
  shift
  run "$name-dev" run "$@" || fail "$name: loom run $*"
  run "$name-host" run "$@" --host-sampling || fail "$name: loom run $* --host-sampling"
  cmp -s "$dir/$name-dev.out" "$dir/$name-host.out" || fail "$name: the text differs with --host-sampling"
  grep -q "sampling host\$" "$dir/$name-host.err" || fail "$name: --host-sampling: no 'sampling host'"
}
same_text sample-default -m "$builtin" --backend cpu -t 2 -s 7 -n 48
grep -q "sampling device\$" "$dir/sample-default-dev.err" || fail "sample-default: not sampled on the device"
same_text sample-wide -m "$builtin" --backend cpu -t 2 -s 3 -n 48 --temp 1.3 --top-k 100 --top-p 0.9 --min-p 0.02
grep -q "sampling device\$" "$dir/sample-wide-dev.err" || fail "sample-wide: not sampled on the device"
same_text sample-greedy -m "$builtin" --backend cpu -t 2 -n 32 --temp 0
# penalties over the history only run on the host
same_text sample-penalty -m "$builtin" --backend cpu -t 2 -s 3 -n 32 --repeat-penalty 1.2
grep -q "sampling host\$" "$dir/sample-penalty-dev.err" || fail "sample-penalty: penalties were not left to the host"
# one sequence on the sliding-window ring
same_text sample-ring -m "$dir/gemma3.gguf" -t 2 --ubatch-size 4 -p "$p" -s 5 -n 12
grep -q "sampling device\$" "$dir/sample-ring-dev.err" || fail "sample-ring: not sampled on the device"
for how in dev host; do
  flag=()
  [[ $how == host ]] && flag=(--host-sampling)
  printf 'ROMEO:\nAnd then?\n' | timeout 120 "$loom" chat -m "$builtin" --backend cpu -n 24 -s 11 -t 2 "${flag[@]}" \
    >"$dir/chat-$how.out" 2>"$dir/chat-$how.err" || fail "loom chat ${flag[*]}"
done
cmp -s "$dir/chat-dev.out" "$dir/chat-host.out" || fail "chat: the replies differ with --host-sampling"
grep -q "^loom: turn 2:.*sampling device$" "$dir/chat-dev.err" || fail "chat: not sampled on the device"
grep -q "^loom: turn 2:.*sampling host$" "$dir/chat-host.err" || fail "chat --host-sampling: not on the host"
# --deterministic (batch-invariant fast numerics, a CUDA matter) is accepted everywhere; the CPU's text
# is the same with it
run det-off run -m "$builtin" --backend cpu -t 2 -s 3 -n 24 || fail "loom run (for --deterministic)"
run det-on run -m "$builtin" --backend cpu -t 2 -s 3 -n 24 --deterministic || fail "loom run --deterministic"
cmp -s "$dir/det-off.out" "$dir/det-on.out" || fail "run: --deterministic changed the CPU's text"
for c in chat serve bench perplexity; do
  "$loom" $c --help 2>&1 | grep -q -- "--deterministic" || fail "loom $c: no --deterministic"
done
echo "cli checks: ok"
