#!/usr/bin/env bash
# Checks the Debian/Ubuntu packages Loom builds with; installs the missing ones with apt when run as
# root, otherwise prints the exact command and fails. Sourced by run.sh and test.sh.
#   usage: scripts/deps.sh [--tests]
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config libfmt-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(libgtest-dev libbenchmark-dev python3-jinja2)  # Jinja2: the chat-template test's oracle
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "loom: missing build dependencies: ${missing[*]}" >&2
  echo "loom: this is not a Debian/Ubuntu system; install the equivalents of those packages." >&2
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  echo "loom: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "loom: missing build dependencies. Install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
