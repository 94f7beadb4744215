#!/usr/bin/env bash
# Every CUDA kernel must start with pdl_wait() (griddepcontrol.wait): the executor records
# programmatic (PDL) edges into any kernel with a single predecessor, and a kernel that reads its
# inputs without waiting would race with the kernel before it. A kernel that first touches only what
# no kernel writes (weights) may wait later: it says so on its first line with a comment
# "// pdl_wait later: WHY", and its pdl_wait(); must still come within its first 80 lines.
set -euo pipefail
dir=${1:?usage: pdl_wait_check.sh KERNELS_DIR}
status=0
for f in "$dir"/*.cu; do
  awk -v file="$f" '
    /__global__/ { in_sig = 1; name = $0 }
    in_sig && /\{/ { in_sig = 0; pending = 4; late = 0; next }
    late > 0 {
      if ($0 ~ /pdl_wait\(\);/) { late = 0; next }
      if (--late == 0) { print file ": kernel announcing a late pdl_wait() without one: " name; bad = 1 }
    }
    pending > 0 {
      if ($0 ~ /pdl_wait\(\);/) { pending = 0; next }
      if (pending == 4 && $0 ~ /\/\/ pdl_wait later: /) { pending = 0; late = 80; next }
      if (--pending == 0) { print file ": kernel without an early pdl_wait(): " name; bad = 1 }
    }
    END { exit bad }' "$f" || status=1
done
[[ $status == 0 ]] && echo "pdl_wait_check: every kernel in $dir starts with pdl_wait()"
exit $status
