#!/usr/bin/env bash
# `loom serve` as a program: --port 0 prints the port, /health turns 200 once loaded, a completion
# answers, SIGTERM stops it cleanly; --chat-template-file and --chat-template errors come before
# loading; -tp 2 answers as one rank does; --host-sampling answers as the default (sampling in the
# forward pass's graph) does. HTTP through bash's /dev/tcp, so the test needs nothing
# installed.
#   usage: tests/serve_cli.sh LOOM_BINARY
set -euo pipefail
loom=${1:?usage: serve_cli.sh LOOM_BINARY}
dir=$(mktemp -d)
pid=""
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "serve_cli: $*" >&2; [[ -f $dir/err ]] && cat "$dir/err" >&2; exit 1; }

http() {  # METHOD PATH [BODY]: the whole response, headers included
  local body=${3:-}
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
    "$1" "$2" "${#body}" "$body" >&3
  cat <&3
  exec 3>&-
}

start_server() {  # FLAGS...: loom serve on a free port in the background; sets pid and port, waits for /health
  rm -f "$dir/out"  # the background server truncates it later: an old port must not be read meanwhile
  "$loom" serve --port 0 -t 1 "$@" >"$dir/out" 2>"$dir/err" &
  pid=$!
  for _ in $(seq 100); do [[ -s $dir/out ]] && break; sleep 0.1; done
  port=$(head -1 "$dir/out")
  [[ $port =~ ^[0-9]+$ ]] || fail "no port on stdout: '$port'"
  for _ in $(seq 200); do
    http GET /health 2>/dev/null | head -1 | grep -q " 200 " && break
    sleep 0.05
  done
}

start_server
http GET /health | head -1 | grep -q " 200 " || fail "/health never said 200"
reply=$(http POST /v1/completions '{"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0}')
grep -q '"completion_tokens":4' <<<"$reply" || fail "completion: $reply"
grep -q '"object":"text_completion"' <<<"$reply" || fail "completion: $reply"
text_tp1=$(grep -o '"text":"[^"]*"' <<<"$reply")
sampled='{"prompt": "ROMEO:", "max_tokens": 12, "temperature": 0.9, "seed": 3}'
text_device=$(http POST /v1/completions "$sampled" | grep -o '"text":"[^"]*"')
[[ -n $text_device ]] || fail "no sampled completion"
reply=$(http POST /v1/chat/completions '{"messages": "nope"}')
head -1 <<<"$reply" | grep -q " 400 " || fail "bad request: $reply"
kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "still running 10 s after SIGTERM"
wait "$pid" || fail "exit status $? after SIGTERM"
pid=""

# --chat-template-file: rendered by the Jinja interpreter; a template that does not parse is refused,
# naming the file
printf '{%% for m in messages %%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%% endfor %%}{%% if add_generation_prompt %%}<|im_start|>assistant\n{%% endif %%}' >"$dir/chatml.jinja"
printf '{%% for m in messages %%}{{ m.content }' >"$dir/bad.jinja"
if timeout 60 "$loom" serve --port 0 --chat-template-file "$dir/bad.jinja" >"$dir/out" 2>"$dir/err"; then
  fail "a Jinja template that does not parse was accepted"
fi
grep -q "bad.jinja" "$dir/err" || fail "the error for a broken Jinja template does not name the file: $(cat "$dir/err")"
if timeout 60 "$loom" serve --port 0 --chat-template nosuch >"$dir/out" 2>"$dir/err"; then
  fail "--chat-template nosuch was accepted"
fi
start_server --chat-template-file "$dir/chatml.jinja"
grep -q "chat format jinja (.*chatml.jinja)" "$dir/err" || fail "--chat-template-file chatml.jinja: not served as Jinja"
reply=$(http POST /apply-template '{"messages": [{"role": "user", "content": "hi"}]}')
grep -q '"prompt":"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"' <<<"$reply" || fail "apply-template: $reply"
kill -TERM "$pid"; wait "$pid" || fail "exit status $? after SIGTERM (jinja server)"
pid=""

# -tp 2 (two CPU ranks here): the same greedy completion as one rank
start_server --backend cpu -tp 2
grep -q "split over 2 cpu ranks" "$dir/err" || fail "-tp 2: the model is not split"
reply=$(http POST /v1/completions '{"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0}')
[[ $(grep -o '"text":"[^"]*"' <<<"$reply") == "$text_tp1" ]] || fail "-tp 2 answered $reply, -tp 1 $text_tp1"
kill -TERM "$pid"; wait "$pid" || fail "exit status $? after SIGTERM (-tp 2 server)"
pid=""

# --host-sampling (listed in --help): every token sampled on the host, the same sampled text
"$loom" serve --help | grep -q -- "--host-sampling" || fail "serve --help: no --host-sampling"
start_server --host-sampling
reply=$(http POST /v1/completions "$sampled")
[[ $(grep -o '"text":"[^"]*"' <<<"$reply") == "$text_device" ]] ||
  fail "--host-sampling answered $reply, the default $text_device"
http GET /metrics | grep -q "^loom_tokens_sampled_device_total 0" || fail "--host-sampling: tokens sampled on the device"
echo "serve_cli: ok"
