#!/usr/bin/env bash
# Loom beside llama.cpp (the peer, ../shared/peer copied into .peer/ and carried) on the same GGUF files,
# in one run on the GPU machine.
#   gpu-peer.sh prepare BUILD_BIN_DIR   builds the peer into /tmp/peer and makes the synthetic 8B/1B files
#                                       (minutes: start it under setsid in an earlier call; it writes
#                                       /tmp/peer/prepared when done)
#   gpu-peer.sh bench BUILD_BIN_DIR     loom bench (fast) and llama-bench -fa 1 on each file, pp512/pp4096/tg128
# LOOM_PEER_MODELS="llama3-8b:q4_K_M ..." picks the files.
set -uo pipefail
mode=${1:?usage: gpu-peer.sh prepare|bench BUILD_BIN_DIR}
bin=${2:?}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=/tmp/loom-e2e
peer=/tmp/peer
mkdir -p "$work" "$peer"
models=${LOOM_PEER_MODELS:-llama3-8b:q4_K_M llama3-8b:q4_0 llama3-8b:f16 llama3-1b:q4_0 llama3-1b:f16}

case $mode in
  prepare)
    rm -f "$peer/prepared"
    bash "$root/.peer/build-llama-cpp.sh" "$peer" >"$peer/peer-build.out" 2>&1 &
    for m in $models; do
      m=${m/:/ }
      read -r shape type <<<"$m"
      f="$work/$shape-$type.gguf"
      [[ -s $f ]] || "$bin/loom" gen-model --shape "$shape" --type "$type" -o "$f" -t 8 >"$work/gen-$shape-$type.log" 2>&1
    done
    wait
    touch "$peer/prepared"
    ;;
  bench)
    [[ -f $peer/prepared ]] || { echo "peer: not prepared (run gpu-peer.sh prepare first)"; cat "$peer/peer-build.out" 2>/dev/null; exit 1; }
    for m in $models; do
      m=${m/:/ }
      read -r shape type <<<"$m"
      f="$work/$shape-$type.gguf"
      [[ -s $f ]] || { echo "peer: no $f"; continue; }
      echo "== $shape $type"
      "$bin/loom" bench -m "$f" -p ${LOOM_PEER_PP:-512,4096} -n 128 -r 3 2>/dev/null
      "$peer/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p ${LOOM_PEER_PP:-512,4096} -n 128 -r 3 2>/dev/null |
        grep -E "^\|"
    done
    ;;
esac
