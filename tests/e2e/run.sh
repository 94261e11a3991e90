#!/usr/bin/env bash
# End-to-end suite: real etcd, real nats-server, fluxon-bridge as a separate process, the npm
# `nats` client. Prints cmocka-style lines (counted by tests/run.sh); exits non-zero on failure.
#   tests/e2e/run.sh [test-name-regex]   (the regex: a developer's selection, others not counted)
# Environment: BUILD (build dir with fluxon-bridge and fluxonctl, default build),
# FXT_TMPDIR (temp root; a private one is made and removed when unset), FXT_SLOW=N (slow-build
# factor for every bounded wait and time bound; FXT_SANITIZED=1 alone means 3), FXT_SANITIZED=1
# (sanitizer build: bounds that mean nothing under a sanitizer's allocator are logged, not
# asserted), FXE2E_FILTER / FXE2E_EXCLUDE (regexes; tests left out are reported as skipped, with
# FXE2E_SKIP_REASON), FXE2E_KEEP=1 (keep each test's directory with its logs and configs).
# tests/run.sh refuses FXT_SLOW / FXE2E_* selection variables from the caller's environment
# unless FXT_ALLOW_FILTER=1: a suite run never shrinks or stretches silently.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
export FXE2E_BUILD="$BUILD"

for tool in node npm etcd nats-server; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool not found (make deps installs it)" >&2; exit 1; }
done

# npm ci only when node_modules is missing or the lock changed since the last install.
bash "$HERE/npm-deps.sh"
cd "$HERE"

# (e2e_thousand_claims runs in every pass; under a sanitizer with 200 names instead of 1,000: see
# the test.)

# The runner runs under a subreaper (tests/e2e/reap/fxt_reap.c, built by make): whatever it
# started is killed when it ends, also when it is killed with SIGKILL and runs no exit handler.
# The temp root is made here (unless the caller gave one) and removed after the runner, so a
# killed runner leaves no directory either.
REAP="$BUILD/tests/e2e/fxt-reap"
if [ ! -x "$REAP" ]; then
  echo "e2e: $REAP not built (make builds it): a SIGKILLed runner would leave its processes running" >&2
  exec node lib/main.mjs "$@"
fi
if [ -z "${FXT_TMPDIR:-}" ]; then
  FXT_TMPDIR=$(mktemp -d /tmp/fluxon-e2e.XXXXXX)
  export FXT_TMPDIR
  [ -n "${FXE2E_KEEP:-}" ] || trap 'rm -rf "$FXT_TMPDIR"' EXIT
fi
trap 'kill -TERM "$reap_pid" 2>/dev/null' INT TERM HUP
"$REAP" node lib/main.mjs "$@" &
reap_pid=$!
while :; do
  wait "$reap_pid"
  rc=$?
  kill -0 "$reap_pid" 2>/dev/null || break # (a trapped signal ended wait early: wait again)
done
exit $rc
