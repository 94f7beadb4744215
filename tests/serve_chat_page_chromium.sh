#!/usr/bin/env bash
# The chat page (GET /) in headless Chromium: types a message, sends it, waits for the streamed answer
# to stop growing, and checks it equals what /v1/chat/completions returns for the same request at
# temperature 0, that the page shows tokens/s and has its Stop button; a second turn (sent with Enter)
# is checked against the API with the whole conversation. It saves a screenshot (a 1000x700 page).
# WebDriver through python3's standard library (tests/serve/chat_page_webdriver.py). Opt-in (it needs
# a browser, which CI does not have): not registered with ctest.
#   usage: tests/serve_chat_page_chromium.sh [LOOM_BINARY] [SCREENSHOT]
#          (defaults: build/bin/loom, docs/chat-page.png)
#   needs: chromium and chromedriver (Debian: apt-get install chromium chromium-driver), python3.
#   CHROMEDRIVER and CHROMIUM name other binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
loom=${1:-$root/build/bin/loom}
shot=${2:-$root/docs/chat-page.png}
driver=${CHROMEDRIVER:-chromedriver}
missing() { echo "serve_chat_page_chromium: $1 is not installed ($2)" >&2; exit 1; }
command -v python3 >/dev/null || missing python3 "apt-get install python3"
command -v "$driver" >/dev/null || missing "$driver" "Debian: apt-get install chromium-driver; or set CHROMEDRIVER"
if [[ -z ${CHROMIUM:-} ]] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null &&
   ! command -v google-chrome >/dev/null; then
  missing chromium "Debian: apt-get install chromium; or set CHROMIUM to the browser's binary"
fi
[[ -x $loom ]] || { echo "serve_chat_page_chromium: no $loom (build it: ninja -C build loom)" >&2; exit 1; }
echo "serve_chat_page_chromium: $("$driver" --version | head -1)"

out=$(mktemp)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$out" "$out.err"' EXIT
"$loom" serve --port 0 -t 2 >"$out" 2>"$out.err" &  # the built-in model
pid=$!
for _ in $(seq 100); do [[ -s $out ]] && break; sleep 0.1; done
port=$(head -1 "$out")
[[ -n $port ]] || { echo "serve_chat_page_chromium: the server printed no port" >&2; cat "$out.err" >&2; exit 1; }
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
python3 "$root/tests/serve/chat_page_webdriver.py" "$port" "$shot"
echo "serve_chat_page_chromium: passed"
