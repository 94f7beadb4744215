#!/usr/bin/env bash
# The layers of docs/ARCHITECTURE.md, checked on the sources' #include lines:
#   1. each layer includes public headers (include/loom/..., loom.h, loom-cuda.h) only of the layers
#      it may depend on, and other headers only from its own folder (no "../");
#   2. no include cycle: files are grouped into modules (foo.h + foo.cpp, foo.cuh + foo.cu) and the
#      module graph must sort topologically (tsort).
# The compiler enforces the private side too (each library sees only its own folder; the
# layer-probe-* tests show a wrong include failing to compile); this adds the public side and cycles.
#   usage: tests/layers_check.sh SOURCE_ROOT
set -euo pipefail
root=${1:?usage: layers_check.sh SOURCE_ROOT}
cd "$root"

# Which layer owns each public header.
declare -A owner=(
  [loom/status.h]=core [loom/dtype.h]=core [loom/tensor.h]=core [loom/graph.h]=core
  [loom/backend.h]=core [loom/planner.h]=core [loom/comm.h]=core [loom/quant.h]=core
  [loom/exec.h]=exec [loom/exec_plan.h]=exec [loom/exec_graph_cache.h]=exec
  [loom/gguf.h]=gguf
  [loom/cpu.h]=backend_cpu [loom/cuda.h]=backend_cuda
  [loom/text.h]=text [loom/chat.h]=text [loom/jinja.h]=text [loom/text_stream.h]=text
  [loom/llm.h]=llm [loom/llm_batch.h]=llm [loom/llm_sampling.h]=llm [loom/quant_mixture.h]=llm [loom/progress.h]=llm
  [loom/sample.h]=sample
  [loom/serve.h]=serve
  [loom.h]=capi [loom-llm.h]=capi [loom-cuda.h]=capi_cuda
)
# What each layer may include (itself and everything below it).
declare -A allowed=(
  [core]="core"
  [exec]="core exec"
  [gguf]="core gguf"
  [backend_cpu]="core backend_cpu"
  [backend_cuda]="core exec backend_cuda"
  [text]="core gguf text"
  [sample]="core sample"
  [llm]="core exec gguf backend_cpu sample llm"
  [synth]="core gguf backend_cpu sample llm synth"
  [serve]="core exec gguf backend_cpu llm text sample serve"
  [capi]="core exec gguf backend_cpu text sample llm capi"
  [capi_cuda]="core exec backend_cuda capi capi_cuda"
)
# Each layer's folder (its private headers resolve against it).
declare -A folder=(
  [core]=src/core [exec]=src/exec [gguf]=src/gguf [backend_cpu]=src/backend/cpu
  [backend_cuda]=src/backend/cuda [text]=src/text [sample]=src/sample [llm]=src/llm
  [synth]=src/synth [serve]=src/serve [capi]=src/capi [capi_cuda]=src/capi
)

layer_of() {  # layer of a source file or public header
  local f=$1
  case $f in
    include/loom/*) echo "${owner[${f#include/}]:-}" ;;
    include/loom.h | include/loom-llm.h) echo capi ;;
    include/loom-cuda.h) echo capi_cuda ;;
    src/capi/cuda_seed_api.cpp) echo capi_cuda ;;
    src/backend/cpu/*) echo backend_cpu ;;
    src/backend/cuda/*) echo backend_cuda ;;
    src/*) local l=${f#src/}; echo "${l%%/*}" ;;
  esac
}

errors=0
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
err() { echo "layers_check: $*" >&2; errors=$((errors + 1)); }
module() { local m=${1%.*}; echo "$m"; }

files=$(find include src -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)
for f in $files; do
  layer=$(layer_of "$f")
  if [[ -z $layer ]]; then
    err "$f: no layer owns it (add it to tests/layers_check.sh)"
    continue
  fi
  echo "$(module "$f") $(module "$f")" >>"$edges"
  while IFS= read -r inc; do
    target=""
    if [[ $inc == loom/* || $inc == loom.h || $inc == loom-llm.h || $inc == loom-cuda.h ]]; then
      target=include/$inc
      to=$(layer_of "$target")
      if [[ ! -f $target || -z $to ]]; then
        err "$f: includes \"$inc\", which is not a public header"
        continue
      fi
      if [[ " ${allowed[$layer]} " != *" $to "* ]]; then
        err "$f ($layer) includes \"$inc\" of layer $to; $layer may include: ${allowed[$layer]}"
      fi
    else
      if [[ $inc == *..* ]]; then
        err "$f: includes \"$inc\" (no ../: a layer reaches only its own folder)"
        continue
      fi
      if [[ -f $(dirname "$f")/$inc ]]; then
        target=$(dirname "$f")/$inc
      elif [[ $f == src/* && -f ${folder[$layer]}/$inc ]]; then
        target=${folder[$layer]}/$inc
      else
        err "$f: includes \"$inc\", which is neither a public header nor in ${folder[$layer]:-its folder}"
        continue
      fi
    fi
    echo "$(module "$f") $(module "$target")" >>"$edges"
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done

if ! tsort "$edges" >/dev/null 2>"$edges.err"; then
  err "include cycle between modules (a module is foo.h with foo.cpp/.cu):"
  grep -v 'input contains a loop:$' "$edges.err" | sed 's/^tsort: /  /' >&2 || true
fi
rm -f "$edges.err"

if ((errors > 0)); then
  echo "layers_check: $errors problem(s); the layers and what each may include: docs/ARCHITECTURE.md" >&2
  exit 1
fi
echo "layers_check: $(echo "$files" | wc -l) files, layers and includes as docs/ARCHITECTURE.md says, no cycle"
