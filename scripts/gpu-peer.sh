#!/usr/bin/env bash
# Loom beside llama.cpp (the peer, ../shared/peer copied into .peer/ and carried) on the same GGUF files,
# in one run on the GPU machine.
#   gpu-peer.sh prepare BUILD_BIN_DIR   builds the peer into /tmp/peer and makes the synthetic 8B/1B files
#                                       (minutes: start it under setsid in an earlier call; it writes
#                                       /tmp/peer/prepared when done)
#   gpu-peer.sh bench BUILD_BIN_DIR     loom bench (fast) and llama-bench -fa 1 on each file, pp512/pp4096/tg128
# LOOM_PEER_MODELS="llama3-8b:q4_K_M ..." picks the files.
#
# When the tracked tree (the built-in models) plus .peer/ pass the device tool's 64 MiB carry limit, the peer
# goes over in parts, on one warm machine, in calls made back to back (it is given back after 30 s idle):
#   here:  scripts/gpu-peer.sh split            .peer/ into .peer-part1/ and .peer-part2/ (git-ignored)
#   call:  gpu-peer.sh stash   (carry .peer-part1)   its files into /tmp/peer-parts
#   call:  gpu-peer.sh stash   (carry .peer-part2)   the same, then the peer is joined and built in /tmp/peer
#   call:  gpu-peer.sh prepare BUILD_BIN_DIR, then bench (carry the binaries): prepare only makes the files
#          when /tmp/peer/build/bin holds the peer
set -uo pipefail
mode=${1:?usage: gpu-peer.sh split|stash|prepare|bench [BUILD_BIN_DIR]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=/tmp/loom-e2e
peer=/tmp/peer
mkdir -p "$work" "$peer"
models=${LOOM_PEER_MODELS:-llama3-8b:q4_K_M llama3-8b:q4_0 llama3-8b:f16 llama3-1b:q4_0 llama3-1b:f16}

case $mode in
  split)  # on the development machine
    src=$root/.peer
    [[ -d $src ]] || { echo "peer: no .peer/ (copy ../shared/peer there)"; exit 1; }
    rm -rf "$root"/.peer-part1 "$root"/.peer-part2
    mkdir -p "$root/.peer-part1" "$root/.peer-part2"
    cp "$src"/build-llama-cpp.sh "$src"/README.md "$root/.peer-part1/"
    tarball=$(cd "$src" && ls llama.cpp-*.tar.xz)
    half=$(( ($(stat -c %s "$src/$tarball") + 1) / 2 ))
    head -c "$half" "$src/$tarball" >"$root/.peer-part1/$tarball.part1"
    tail -c +$((half + 1)) "$src/$tarball" >"$root/.peer-part2/$tarball.part2"
    sha256sum "$src/$tarball" | awk '{print $1}' >"$root/.peer-part2/$tarball.sha256"
    ls -la "$root"/.peer-part1 "$root"/.peer-part2
    exit 0 ;;
  stash)  # on the GPU machine: this call's part; with both there, join and build
    parts=/tmp/peer-parts
    mkdir -p "$parts"
    for d in "$root"/.peer-part*/; do [[ -d $d ]] && cp "$d"* "$parts/"; done
    ls "$parts"
    tarball=$(cd "$parts" && ls llama.cpp-*.tar.xz.part1 2>/dev/null | sed 's/\.part1$//')
    if [[ -n $tarball && -f $parts/$tarball.part2 ]]; then
      cat "$parts/$tarball.part1" "$parts/$tarball.part2" >"$parts/$tarball"
      [[ $(sha256sum "$parts/$tarball" | awk '{print $1}') == $(cat "$parts/$tarball.sha256") ]] ||
        { echo "peer: the joined tarball's checksum differs"; exit 1; }
      bash "$parts/build-llama-cpp.sh" "$peer" >"$peer/peer-build.out" 2>&1
      echo "peer build rc=$?"; tail -2 "$peer/peer-build.out"
    fi
    exit 0 ;;
esac
bin=${2:?usage: gpu-peer.sh prepare|bench BUILD_BIN_DIR}
case $mode in
  prepare)
    rm -f "$peer/prepared"
    if [[ -x $peer/build/bin/llama-bench ]]; then
      :  # built by stash
    else
      bash "$root/.peer/build-llama-cpp.sh" "$peer" >"$peer/peer-build.out" 2>&1 &
    fi
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
