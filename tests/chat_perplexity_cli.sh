#!/usr/bin/env bash
# End-to-end checks of `loom chat` (piped stdin) and `loom perplexity` against a generated tiny model.
#   usage: chat_perplexity_cli.sh LOOM_BINARY chat|perplexity
set -u
loom=$1
mode=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [[ -f $f ]] && { echo "--- $f"; cat -v "$f"; }; done
  exit 1
}
"$loom" gen-model --shape tiny --type f32 -o "$dir/tiny.gguf" 2>"$dir/gen.err" || fail "gen-model"

# "loom: turn N: prompt P tokens (C from the cache, ...); reply R tokens ..." -> field values
turn_field() {  # file turn field(cached|reply)
  local line
  line=$(grep "^loom: turn $2:" "$1") || return 1
  case $3 in
    cached) sed -E 's/.*\(([0-9]+) from the cache.*/\1/' <<<"$line" ;;
    reply) sed -E 's/.*; reply ([0-9]+) tokens.*/\1/' <<<"$line" ;;
  esac
}

if [[ $mode == chat ]]; then
  chat() {  # name input
    printf "$2" | "$loom" chat -m "$dir/tiny.gguf" --chat-template chatml -n 8 --temp 0 -t 2 \
      >"$dir/$1.out" 2>"$dir/$1.err" || fail "loom chat ($1) exited with an error"
  }
  chat a 'hello\nhow are you\n'
  [[ $(grep -c '^loom: turn ' "$dir/a.err") == 2 ]] || fail "expected two turns"
  for t in 1 2; do
    r=$(turn_field "$dir/a.err" $t reply) || fail "no turn $t"
    ((r >= 1 && r <= 8)) || fail "turn $t: reply of $r tokens (want 1..8 with -n 8)"
  done
  [[ -s $dir/a.out ]] || fail "no reply on stdout"
  # the second turn decodes only what follows the first turn's tokens in the KV cache
  c=$(turn_field "$dir/a.err" 2 cached)
  ((c > 0)) || fail "turn 2 reused no cached tokens"
  # greedy decoding: the same replies again
  chat b 'hello\nhow are you\n'
  cmp -s "$dir/a.out" "$dir/b.out" || fail "greedy replies differ between runs"
  # /reset forgets the conversation (same reply to the same message, nothing cached);
  # /exit ends before the last line
  chat c 'hello\n/reset\nhello\n/exit\nnever read\n'
  [[ $(grep -c '^loom: turn ' "$dir/c.err") == 2 ]] || fail "/reset or /exit: expected two turns"
  [[ $(turn_field "$dir/c.err" 2 cached) == 0 ]] || fail "/reset kept cached tokens"
  n=$(stat -c %s "$dir/c.out")
  half=$((n / 2))
  [[ $((n % 2)) == 0 && $(head -c $half "$dir/c.out" | od -An -tx1) == $(tail -c $half "$dir/c.out" | od -An -tx1) ]] ||
    fail "after /reset the same message got a different reply"
  # an unknown template is an error naming the built-in ones
  if printf 'hi\n' | "$loom" chat -m "$dir/tiny.gguf" --chat-template nope >"$dir/d.out" 2>"$dir/d.err"; then
    fail "unknown template accepted"
  fi
  grep -q "chatml" "$dir/d.err" || fail "unknown-template error does not list the templates"
  # a Jinja template file, rendered by the interpreter
  tdir=$(dirname "$0")/data/chat-templates
  printf 'hello\nhow are you\n' | "$loom" chat -m "$dir/tiny.gguf" --chat-template-file "$tdir/Qwen-Qwen2.5-7B-Instruct.jinja" \
    -n 4 --temp 0 -t 2 >"$dir/e.out" 2>"$dir/e.err" || fail "loom chat --chat-template-file exited with an error"
  grep -q "chat template jinja (" "$dir/e.err" || fail "the Jinja template was not used"
  [[ $(grep -c '^loom: turn ' "$dir/e.err") == 2 ]] || fail "Jinja template: expected two turns"
  ((  $(turn_field "$dir/e.err" 2 cached) > 0 )) || fail "Jinja template: turn 2 reused no cached tokens"
  # a template that rejects the conversation: the message is dropped with the template's words and line
  printf 'hello\n' | "$loom" chat -m "$dir/tiny.gguf" -sys "be brief" --chat-template-file "$tdir/google-gemma-2-2b-it.jinja" \
    -n 4 --temp 0 -t 2 >"$dir/f.out" 2>"$dir/f.err" || fail "loom chat with a rejecting template exited with an error"
  grep -q "google-gemma-2-2b-it.jinja: line 1: System role not supported" "$dir/f.err" || fail "template error not reported"
  # no tokenizer.chat_template in the file: the chatml fallback, said so
  printf 'hello\n' | "$loom" chat -m "$dir/tiny.gguf" -n 2 --temp 0 -t 2 >"$dir/g.out" 2>"$dir/g.err" || fail "fallback chat failed"
  grep -q "chatml (the fallback" "$dir/g.err" || fail "the fallback format was not announced"
  echo "chat: ok"
  exit 0
fi

if [[ $mode == perplexity ]]; then
  for i in $(seq 12); do
    echo "The river ran quickly past the old mill, carrying leaves and small branches toward the sea, line $i."
  done >"$dir/text.txt"
  "$loom" perplexity -m "$dir/tiny.gguf" -f "$dir/text.txt" -c 64 -t 2 >"$dir/p.out" 2>"$dir/p.err" ||
    fail "loom perplexity exited with an error"
  grep -q '^\[1\][0-9.]*,\[2\][0-9.]*' "$dir/p.out" || fail "no running values [1]..,[2].."
  line=$(grep '^Final estimate: PPL = ' "$dir/p.out") || fail "no final estimate"
  ppl=$(sed -E 's/^Final estimate: PPL = ([0-9.]+) \+\/- ([0-9.]+)$/\1/' <<<"$line")
  err=$(sed -E 's/^Final estimate: PPL = ([0-9.]+) \+\/- ([0-9.]+)$/\2/' <<<"$line")
  awk -v p="$ppl" -v e="$err" 'BEGIN { exit !(p > 1 && p < 1e6 && e > 0 && e < p) }' || fail "PPL $ppl +/- $err"
  grep -q 'tokens/s' "$dir/p.err" || fail "no tokens/s"
  # --chunks 1 stops after the first chunk, whose running value it prints
  "$loom" perplexity -m "$dir/tiny.gguf" -f "$dir/text.txt" -c 64 -t 2 --chunks 1 >"$dir/q.out" 2>"$dir/q.err" ||
    fail "--chunks 1"
  first=$(grep -oE '^\[1\][0-9.]+' "$dir/p.out")
  grep -q "^${first//[/\\[}\$" "$dir/q.out" || fail "--chunks 1 printed something else than '$first'"
  # too short for one chunk
  if "$loom" perplexity -m "$dir/tiny.gguf" -f "$dir/text.txt" -c 4096 >"$dir/r.out" 2>"$dir/r.err"; then
    fail "a text shorter than one chunk was accepted"
  fi
  grep -q "at least one chunk" "$dir/r.err" || fail "short-text error unclear"
  # --kl-divergence-base saves the base run (same PPL printed); --kl-divergence against it, with -c
  # taken from the file and no -f, gives the same PPL twice and every top token the same
  "$loom" perplexity -m "$dir/tiny.gguf" -f "$dir/text.txt" -c 64 -t 2 --kl-divergence-base "$dir/base.kld" \
    >"$dir/s.out" 2>"$dir/s.err" || fail "--kl-divergence-base"
  grep -q "^$line\$" "$dir/s.out" || fail "saving the base changed the PPL"
  [[ -s $dir/base.kld && ! -e $dir/base.kld.partial ]] || fail "no base file"
  "$loom" perplexity -m "$dir/tiny.gguf" -t 2 --kl-divergence --kl-divergence-base "$dir/base.kld" \
    >"$dir/k.out" 2>"$dir/k.err" || fail "--kl-divergence"
  for which in Q base; do
    v=$(grep -E "^Mean PPL\($which\) +:" "$dir/k.out" | awk '{ print $4 }')
    awk -v v="$v" -v p="$ppl" 'BEGIN { exit !(v - p < 5e-5 && p - v < 5e-5) }' ||
      fail "--kl-divergence: PPL($which) $v, not $ppl"
  done
  grep -qE "^Mean +KLD: +0\.0000000" "$dir/k.out" || fail "--kl-divergence: KLD of a run against itself"
  grep -qE "^Same top p: +100\.0000" "$dir/k.out" || fail "--kl-divergence: top tokens differ"
  # a truncated base file is an error naming it
  head -c 1000 "$dir/base.kld" >"$dir/short.kld"
  if "$loom" perplexity -m "$dir/tiny.gguf" --kl-divergence --kl-divergence-base "$dir/short.kld" \
    >"$dir/t.out" 2>"$dir/t.err"; then
    fail "a truncated base file was accepted"
  fi
  grep -q "short.kld: truncated" "$dir/t.err" || fail "truncated-base error unclear"
  echo "perplexity: ok ($line)"
  exit 0
fi
echo "usage: $0 LOOM_BINARY chat|perplexity"
exit 2
