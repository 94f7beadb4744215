#!/usr/bin/env bash
# `loom serve` against a client nobody here wrote: the official `openai` npm package, streaming and
# not (tests/serve/openai_client.mjs). Opt-in (it needs node and the npm registry, which CI does not
# have): not registered with ctest.
#   usage: tests/serve_openai_npm.sh [LOOM_BINARY]   (default: build/bin/loom)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
loom=${1:-$root/build/bin/loom}
deps=$root/tests/.npm-openai  # git-ignored
command -v node >/dev/null || { echo "serve_openai_npm: node is not installed" >&2; exit 1; }
if [[ ! -d $deps/node_modules/openai ]]; then
  mkdir -p "$deps"
  (cd "$deps" && npm install --silent --no-audit --no-fund openai >/dev/null)
fi
echo "serve_openai_npm: openai $(node -p "require('$deps/node_modules/openai/package.json').version")"

out=$(mktemp)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$out" "$out.err"' EXIT
"$loom" serve --port 0 -np 2 --api-key sk-loom-test -t 2 >"$out" 2>"$out.err" &
pid=$!
for _ in $(seq 100); do [[ -s $out ]] && break; sleep 0.1; done
port=$(head -1 "$out")
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
# node resolves packages next to the script, so the test runs from a copy in the deps folder.
cp "$root/tests/serve/openai_client.mjs" "$deps/"
node "$deps/openai_client.mjs" "$port" sk-loom-test
