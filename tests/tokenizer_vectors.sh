#!/usr/bin/env bash
# Checks `loom tokenize --vectors` against a reference vocabulary's .out file, line by line.
#   usage: tokenizer_vectors.sh LOOM_BINARY VOCAB_DIR VOCAB_NAME
# VOCAB_DIR holds ggml-vocab-NAME.gguf, .inp and .out (tests/data/tokenizer); a missing file fails.
set -u
loom=$1
vocab="$2/ggml-vocab-$3.gguf"
for f in "$vocab" "$vocab.inp" "$vocab.out"; do
  if [[ ! -f $f ]]; then
    echo "FAIL: $f not found"
    exit 1
  fi
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$loom" tokenize -m "$vocab" --vectors "$vocab.inp" >"$out"; then
  echo "FAIL: loom tokenize exited with an error"
  exit 1
fi
mapfile -t got <"$out"
mapfile -t want <"$vocab.out"
matched=0
for i in "${!want[@]}"; do
  if [[ "${got[i]-<missing>}" == "${want[i]}" ]]; then
    matched=$((matched + 1))
  else
    echo "line $((i + 1)): got '${got[i]-<missing>}'"
    echo "line $((i + 1)): want '${want[i]}'"
  fi
done
echo "$3: $matched/${#want[@]} lines match"
if ((${#got[@]} != ${#want[@]})); then
  echo "FAIL: ${#got[@]} lines printed, ${#want[@]} expected"
  exit 1
fi
# Byte for byte too (line ends, trailing newline).
cmp -s "$out" "$vocab.out" || { echo "FAIL: the output differs from $vocab.out"; exit 1; }
((matched == ${#want[@]}))
