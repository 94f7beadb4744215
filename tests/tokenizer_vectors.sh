#!/usr/bin/env bash
# Checks `loom tokenize --vectors` against a reference vocabulary's .out file, line by line.
#   usage: tokenizer_vectors.sh LOOM_BINARY SHARED_DATA_DIR VOCAB_NAME
# Exits 77 (CTest: skipped) when the vocabulary files are absent.
set -u
loom=$1
vocab="$2/tokenizer/ggml-vocab-$3.gguf"
for f in "$vocab" "$vocab.inp" "$vocab.out"; do
  if [[ ! -f $f ]]; then
    echo "SKIP: $f not found (../shared/data is absent)"
    exit 77
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
