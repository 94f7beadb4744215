#!/usr/bin/env bash
# SASS of one CUDA source of the build, on a machine without a GPU: compiles FILE (a path under
# src/backend/cuda/kernels) with build-gpu's own command to one cubin of the file's own architecture
# (sm_90, or sm_90a for the warpgroup kernels' files) and disassembles it with
# nvdisasm from Debian 12's nvidia-cuda-toolkit package (non-free; fetched with apt-get download into
# .nvdisasm/, git-ignored, and unpacked there, never installed). CUDA 13 writes the ELF header's
# architecture flags in a newer form than that nvdisasm (11.8) reads, so the copy it disassembles gets
# the older form (sm_90, 64-bit, unified textures) in e_flags; the instructions themselves are sm_90's.
#   scripts/sass-local.sh FILE [OUT]   -> OUT (default /tmp/NAME.sass, NAME the file's name without .cu)
# Needs build-gpu configured (cmake -B build-gpu ... with CUDA) and, for the first run, Debian's non-free
# component in apt's sources (Components: non-free).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
file=${1:?usage: scripts/sass-local.sh src/backend/cuda/kernels/FILE.cu [OUT]}
out=${2:-/tmp/$(basename "$file" .cu).sass}
tool=$root/.nvdisasm/usr/bin/nvdisasm
if [[ ! -x $tool ]]; then
  mkdir -p "$root/.nvdisasm" && cd "$root/.nvdisasm"
  apt-get download nvidia-cuda-toolkit >/dev/null 2>&1 || {
    echo "sass-local: apt-get download nvidia-cuda-toolkit failed: add Debian's non-free component to apt's sources and run apt-get update" >&2
    exit 1
  }
  dpkg -x nvidia-cuda-toolkit_*.deb . && rm -f nvidia-cuda-toolkit_*.deb
  cd "$root"
fi
cmd=$(ninja -C "$root/build-gpu" -t commands bin/libloom_cuda.so | grep -F "$(basename "$file") " | grep -F "$file" | head -1)
[[ -n $cmd ]] || { echo "sass-local: no build command for $file in build-gpu" >&2; exit 1; }
cubin=$(mktemp /tmp/sass-local-XXXXXX.cubin)
cmd=$(sed 's/^.*ccache //; s/-MD -MT [^ ]* -MF [^ ]*//; s/ -c / -cubin /; s/--generate-code=arch=compute_\(90a\?\),code=\[[^]]*\]/-arch=sm_\1/g' <<<"$cmd")
cmd=$(sed "s#-o [^ ]*\.o#-o $cubin#" <<<"$cmd")
(cd "$root/build-gpu" && eval "$cmd")
python3 - "$cubin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
struct.pack_into('<I', b, 0x30, 0x005a055a)  # EF_CUDA_SM90 | 64-bit | unified textures | virtual sm_90
open(sys.argv[1], 'wb').write(b)
PY
"$tool" -c "$cubin" >"$out"
rm -f "$cubin"
echo "$out: $(grep -c '^        /\*' "$out") instructions"
