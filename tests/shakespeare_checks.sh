#!/usr/bin/env bash
# Binds the built-in model to the engine (run by CTest on every CI run):
#   tokenizer  - Loom's ids for the held-out sample equal the training tokenizer's (stored vectors);
#   perplexity - `loom perplexity` on the held-out text at context 256 matches exp(held-out loss)
#                that PyTorch computed at training (models/loom-shakespeare-results.json) within 2%,
#                for the f16 file and for its q8_0 quantization.
#   usage: shakespeare_checks.sh LOOM_BINARY REPO_ROOT (tokenizer|perplexity)
set -euo pipefail
loom=$1; root=$2; what=$3
models=$root/models
data=$root/tests/data
case $what in
  tokenizer)
    got=$("$loom" tokenize -m "$models/loom-shakespeare-q8_0.gguf" -f "$data/shakespeare_heldout_sample.txt" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
    want=$(tr -s ' \n' ' ' <"$data/shakespeare_heldout_ids.txt" | sed 's/^ //; s/ $//')
    n=$(wc -w <<<"$want")
    if [[ "$got" != "$want" ]]; then
      echo "shakespeare tokenizer: ids differ from the training tokenizer's ($n expected)"
      diff <(tr ' ' '\n' <<<"$got") <(tr ' ' '\n' <<<"$want") | head -20
      exit 1
    fi
    echo "shakespeare tokenizer: $n ids equal the training tokenizer's"
    ;;
  perplexity)
    want=$(sed -n 's/.*"heldout_ppl_ctx256": *\([0-9.eE+-]*\).*/\1/p' "$models/loom-shakespeare-results.json")
    [[ -n $want ]] || { echo "no heldout_ppl_ctx256 in results.json"; exit 1; }
    status=0
    for f in f16 q8_0; do
      got=$("$loom" perplexity -m "$models/loom-shakespeare-$f.gguf" -f "$data/shakespeare_heldout.txt" -c 256 2>&1 \
            | sed -n 's/.*PPL = \([0-9.]*\).*/\1/p')
      [[ -n $got ]] || { echo "$f: loom perplexity printed no PPL"; status=1; continue; }
      if awk -v g="$got" -v w="$want" 'BEGIN { d = (g - w) / w; if (d < 0) d = -d; exit !(d <= 0.02) }'; then
        echo "shakespeare perplexity $f: loom $got vs PyTorch $want: within 2%"
      else
        echo "shakespeare perplexity $f: loom $got vs PyTorch $want: MORE than 2% apart"; status=1
      fi
    done
    exit $status
    ;;
  *) echo "usage: $0 LOOM ROOT tokenizer|perplexity"; exit 2 ;;
esac
