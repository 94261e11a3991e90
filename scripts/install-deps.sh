#!/usr/bin/env bash
# Installs what fluxon-nats needs from Debian packages, only what is missing.
# The Go toolchain and nats.go (Debian's source package in /usr/share/gocode) build the Go
# client of the end-to-end suite offline (GOPATH mode, tests/e2e/14_go_client_compat.test.mjs).
# Idempotent; used by `make run`, `make test` and CI. Needs root (or sudo) when
# something is missing; prints nothing and exits 0 when all is there.
set -euo pipefail

# --bench: also what only benchmarking needs (etcd's own Go client, for the gateway-vs-gRPC table;
# heaptrack, for the bridge's memory by allocation site: BENCHMARKS.md, issue 24 sixth round).
BENCH=
[ "${1:-}" = "--bench" ] && BENCH=1

PKGS=(
  build-essential pkg-config
  libcurl4-openssl-dev libcjson-dev libcmocka-dev libnats-dev libmicrohttpd-dev libssl-dev
  libhiredis-dev
  etcd-server etcd-client nats-server redis-server
  curl valgrind
  linux-perf              # make bench: perf record / report for the per-process profile
  systemd                 # systemd-analyze: the install test verifies the installed units
  clang libclang-rt-dev   # make fuzz: clang -fsanitize=fuzzer (libFuzzer runtime)
  golang-go golang-github-nats-io-go-nats-dev
)

[ -n "$BENCH" ] && PKGS+=(golang-etcd-server-dev heaptrack)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js and npm (for the npm `nats` client in end-to-end tests): the machine
# may carry a nodejs build that bundles npm (and conflicts with Debian's npm),
# so look for the commands, not the packages.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the index once if it is empty or a package is unknown to it.
  if ! apt-cache show "${missing[0]}" >/dev/null 2>&1 || [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v lock)" ]; then
    $SUDO apt-get update -qq
  fi
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Debian's etcd-server and nats-server packages start system services;
  # the project runs its own instances on free ports, so stop the packaged ones.
  for svc in etcd nats-server redis-server; do
    if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop "$svc" >/dev/null 2>&1 || true; fi
  done
fi
