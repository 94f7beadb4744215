#!/usr/bin/env bash
# End-to-end checks of `loom bench` (markdown, -o json, -o csv, --exec, model lists, errors) and of
# `loom run --stats`, on a generated tiny model on the CPU. The JSON is parsed properly by the unit
# test (tests/unit/test_bench.cpp, nlohmann); here its structure is checked with grep, so the test
# needs nothing beyond bash and coreutils.
#   usage: bench_cli.sh LOOM_BINARY
set -u
loom=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [[ -f $f ]] && { echo "--- $f"; cat -v "$f"; }; done
  exit 1
}
"$loom" gen-model --shape tiny --type q8_0 -o "$dir/tiny.gguf" 2>"$dir/gen.err" || fail "gen-model"

bench() {  # name args...
  local name=$1
  shift
  "$loom" bench -m "$dir/tiny.gguf" -ngl 0 -t 1 "$@" >"$dir/$name.out" 2>"$dir/$name.err" ||
    fail "loom bench $* exited with an error"
}
positive() { awk -v v="$1" 'BEGIN { exit !(v > 0) }'; }

# markdown: a header with llama-bench's columns, the alignment rule, one row per test
bench md -p 8 -n 4 -r 2
head -1 "$dir/md.out" | grep -Eq '^\| model +\| +size \| +params \| backend +\| +ngl \| +threads \| numerics \| +test \| +t/s \|$' ||
  fail "markdown header"
sed -n 2p "$dir/md.out" | grep -Eq '^\| -+ \| -+: \|' || fail "markdown alignment rule"
[[ $(wc -l <"$dir/md.out") == 4 ]] || fail "expected 2 header lines and 2 rows"
for t in pp8 tg4; do
  row=$(grep -E "\| +$t \| " "$dir/md.out") || fail "no $t row"
  grep -Eq '^\| llama [0-9]+[KMB] Q8_0 +\| +[0-9.]+ MiB \| +[0-9.]+ [KMB] \| CPU +\| +0 \| +1 \| ' <<<"$row" ||
    fail "$t row: model, size, params, backend, ngl or threads: $row"
  mean=$(sed -E "s/.*\| +$t \| +([0-9.]+) ± ([0-9.]+) \|\$/\1/" <<<"$row")
  sd=$(sed -E "s/.*\| +$t \| +([0-9.]+) ± ([0-9.]+) \|\$/\2/" <<<"$row")
  [[ $mean != "$row" && $sd != "$row" ]] || fail "$t row: no 'mean ± stdev': $row"
  positive "$mean" || fail "$t: t/s $mean is not positive"
done
# where a generated token's time went: one line for the tg test (the CPU has no executor part)
[[ $(grep -Ec '^loom: bench: tg4 a generated token: [0-9.]+ us = graph inputs [0-9.]+ \+ compute [0-9.]+ \+ read-back [0-9.]+ \+ other -?[0-9.]+$' "$dir/md.err") == 1 ]] ||
  fail "no time split of the tg test's tokens"
grep -q 'pp8 a generated token' "$dir/md.err" && fail "a time split for a test that generates nothing"

# -d: every test at every depth (depths innermost), llama-bench's "@ dN" names, n_depth in json
bench depth -p 8 -n 4 -d 0,16 -r 1
[[ $(wc -l <"$dir/depth.out") == 6 ]] || fail "-d 0,16: expected 2 header lines and 4 rows"
for t in "pp8" "pp8 @ d16" "tg4" "tg4 @ d16"; do
  grep -Eq "\| +$t \| +[0-9.]+ ± [0-9.]+ \|\$" "$dir/depth.out" || fail "-d: no '$t' row"
done
[[ $(grep -n "@ d16" "$dir/depth.out" | cut -d: -f1 | tr '\n' ' ') == "4 6 " ]] || fail "-d: depths not innermost"
bench depthjson -n 4 -p 0 -d 16 -r 1 -o json
grep -q '"n_depth": 16' "$dir/depthjson.out" || fail "json: no n_depth 16"
grep -q '"test": "tg4 @ d16"' "$dir/depthjson.out" || fail "json: no 'tg4 @ d16'"
"$loom" bench -m "$dir/tiny.gguf" -ngl 0 -t 1 -p 0 -n 4 -d -3 >"$dir/negdepth.out" 2>"$dir/negdepth.err" &&
  fail "-d -3 accepted"

# json: an array of two objects with llama-bench's fields, positive t/s and two samples each
bench json -p 8 -n 4 -r 2 -o json
[[ $(head -c1 "$dir/json.out") == "[" && $(tail -n1 "$dir/json.out") == "]" ]] || fail "json: not an array"
[[ $(grep -c '^  {$' "$dir/json.out") == 2 ]] || fail "json: expected two objects"
grep -q '"test": "pp8"' "$dir/json.out" || fail "json: no pp8"
grep -q '"test": "tg4"' "$dir/json.out" || fail "json: no tg4"
for key in model_filename model_type model_size model_n_params n_prompt n_gen avg_ns stddev_ns avg_ts stddev_ts \
  samples_ns samples_ts; do
  [[ $(grep -c "^    \"$key\": " "$dir/json.out") == 2 ]] || fail "json: '$key' not in both objects"
done
while read -r v; do positive "$v" || fail "json: avg_ts $v"; done < <(sed -nE 's/^    "avg_ts": ([0-9.e+-]+),$/\1/p' "$dir/json.out")
[[ $(sed -nE 's/^    "avg_ts": ([0-9.e+-]+),$/\1/p' "$dir/json.out" | wc -l) == 2 ]] || fail "json: avg_ts values"
# the two samples of each test: "samples_ns": [ a, b ] spans lines in dump(2) form
[[ $(awk '/"samples_ns": \[/ { n = 0; inside = 1; next } inside && /\]/ { print n; inside = 0 } inside { n++ }' \
  "$dir/json.out" | sort -u) == 2 ]] || fail "json: samples_ns should hold 2 values"
# braces and brackets balance
opens=$(tr -cd '{[' <"$dir/json.out" | wc -c)
closes=$(tr -cd '}]' <"$dir/json.out" | wc -c)
((opens == closes)) || fail "json: unbalanced brackets"

# csv: a header and two lines with the same number of fields
bench csv -p 8 -n 4 -r 2 -o csv
[[ $(wc -l <"$dir/csv.out") == 3 ]] || fail "csv: expected 3 lines"
head -1 "$dir/csv.out" | grep -q '^model_filename,model_type,' || fail "csv: header"
nf=$(head -1 "$dir/csv.out" | awk -F, '{ print NF }')
[[ $(tail -n +2 "$dir/csv.out" | awk -F'","' '{ print NF }' | sort -u) == "$nf" ]] || fail "csv: field count"

# --exec: one row per configuration and test, with the executor columns; the CPU backend says it
# ignores executor options
bench exec -p 8 -n 0 -r 2 --exec serialize,all
grep -q '| exec ' "$dir/exec.out" || fail "--exec: no exec column"
grep -q 'host us/tok' "$dir/exec.out" || fail "--exec: no host us/tok column"
[[ $(grep -Ec '\| serialize +\| +pp8 \|' "$dir/exec.out") == 1 ]] || fail "--exec: no serialize row"
[[ $(grep -Ec '\| all +\| +pp8 \|' "$dir/exec.out") == 1 ]] || fail "--exec: no all row"
grep -q 'does not take executor options' "$dir/exec.err" || fail "--exec: no note that cpu ignores the options"

# a comma-separated model list: the same tests on each
cp "$dir/tiny.gguf" "$dir/tiny2.gguf"
"$loom" bench -m "$dir/tiny.gguf,$dir/tiny2.gguf" -ngl 0 -t 2 -p 4 -n 0 -r 1 -o csv >"$dir/two.out" 2>"$dir/two.err" ||
  fail "two models"
grep -q "tiny2.gguf" "$dir/two.out" || fail "second model missing"
[[ $(wc -l <"$dir/two.out") == 3 ]] || fail "two models: expected a header and two lines"

# errors: unknown --exec name, unknown format, no tests
if "$loom" bench -m "$dir/tiny.gguf" -ngl 0 -p 4 -n 0 -r 1 --exec nope >"$dir/e1.out" 2>"$dir/e1.err"; then
  fail "--exec nope accepted"
fi
grep -q "serialize, graph, concurrency" "$dir/e1.err" || fail "--exec error does not list the names"
if "$loom" bench -m "$dir/tiny.gguf" -o xml >"$dir/e2.out" 2>"$dir/e2.err"; then fail "-o xml accepted"; fi
if "$loom" bench -m "$dir/tiny.gguf" -ngl 0 -p 0 -n 0 >"$dir/e3.out" 2>"$dir/e3.err"; then fail "no tests accepted"; fi
grep -q "no tests" "$dir/e3.err" || fail "no-tests error unclear"

# loom run --stats: the decode bookkeeping and the executor counters of prompt and generation
"$loom" run -m "$dir/tiny.gguf" -p "hello there" -n 4 --temp 0 -t 2 --stats >"$dir/run.out" 2>"$dir/run.err" ||
  fail "loom run --stats"
grep -q '^loom: stats: context ' "$dir/run.err" || fail "--stats: no context line"
grep -Eq '^loom: stats: prompt: [1-9][0-9]* tokens, forward passes [1-9][0-9]*, [1-9][0-9]* graph nodes' "$dir/run.err" ||
  fail "--stats: no prompt line"
grep -Eq '^loom: stats: generation: [0-9]+ one-token steps' "$dir/run.err" || fail "--stats: no generation line"
grep -Eq '^loom: stats: generation: a generated token: [0-9.]+ us = graph inputs ' "$dir/run.err" ||
  fail "--stats: no time split of the generated tokens"
[[ $(grep -c '^loom:   computes ' "$dir/run.err") == 2 ]] || fail "--stats: executor counters (prompt, generation)"
"$loom" run -m "$dir/tiny.gguf" -p "hello there" -n 4 --temp 0 -t 2 >"$dir/nostats.out" 2>"$dir/nostats.err" ||
  fail "loom run"
grep -q 'stats:' "$dir/nostats.err" && fail "stats printed without --stats"
# -tp 1,2: every test at each rank count, one table (two CPU ranks here)
"$loom" bench -m "$dir/tiny.gguf" -p 8 -n 2 -r 1 -t 1 --backend cpu -tp 1,2 >"$dir/tp.out" 2>"$dir/tp.err" ||
  fail "bench -tp 1,2"
[[ $(grep -Ec '^\| .*\| CPU +\|' "$dir/tp.out") == 2 ]] || fail "bench -tp 1,2: not two unsplit rows"
[[ $(grep -Ec '^\| .*\| CPU-TP2 +\|' "$dir/tp.out") == 2 ]] || fail "bench -tp 1,2: not two rows split in two"
echo "bench: ok"
exit 0
