#!/usr/bin/env bash
# The chaos checker (tests/chaos/chaos.mjs, checker.mjs): a seeded random schedule of faults
# against 3 etcd members, nats-server, Redis and three bridges under acked load, then a final
# drain and a checker that fails on any acked message lost, phantom or corrupt delivery.
#   tests/chaos/run.sh           chaos_fixed_seed: 60 s, seed 19 (part of make test; the
#                                CHAOS_* variables are ignored so the test stays what it is)
#   tests/chaos/run.sh --full    make chaos: CHAOS_SECONDS (default 600), CHAOS_SEED (default
#                                random; printed, with the command that replays it)
# Prints cmocka-style lines (counted by tests/run.sh). Environment: BUILD (build dir, default
# build), FXT_TMPDIR (temp root; a private one is made and removed when unset), CHAOS_KEEP
# (where the histories and logs are copied, default $BUILD/<test name>-last).
# Every child runs under setpriv --pdeathsig KILL: nothing outlives the runner, not even after
# a SIGKILL of the runner; SIGINT/SIGTERM kill every child and remove the temp dir.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
export FXE2E_BUILD="$BUILD" FXE2E_PDEATHSIG=1

if [ "${1:-}" = --full ]; then
  export CHAOS_NAME=chaos CHAOS_SECONDS=${CHAOS_SECONDS:-600}
  export CHAOS_SEED=${CHAOS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
else
  export CHAOS_NAME=chaos_fixed_seed CHAOS_SECONDS=60 CHAOS_SEED=19
fi

# Sanitizer builds (make check): skipped, and counted as skipped: the CI budget holds one chaos
# pass (make test), and ASan's slowdown against 2 s leases measures the machine more than the
# bridge. CHAOS_SANITIZED=1 runs it anyway.
if [ -n "${FXT_SANITIZED:-}" ] && [ -z "${CHAOS_SANITIZED:-}" ]; then
  echo "[==========] Running 1 test(s)."
  echo "[ RUN      ] $CHAOS_NAME"
  echo "skipped: a sanitizer pass (FXT_SANITIZED) runs no chaos; make test does (CHAOS_SANITIZED=1 runs it here)"
  echo "[  SKIPPED ] $CHAOS_NAME"
  exit 0
fi

for tool in node npm etcd nats-server redis-server redis-cli setpriv; do
  command -v "$tool" >/dev/null || { echo "chaos: $tool not found (make deps installs it)" >&2; exit 1; }
done

# The npm `nats` client of the e2e suite (npm ci only when missing or the lock changed).
bash "$ROOT/tests/e2e/npm-deps.sh"
cd "$ROOT/tests/e2e"

# Under tests/run.sh (FXT_TMPDIR given), node replaces this shell: the runner's signals reach it.
[ -n "${FXT_TMPDIR:-}" ] && exec node "$HERE/chaos.mjs"

# Alone (make chaos): a private temp root, removed on exit, and whatever a pidfile in it names is
# killed (also if node was killed). node dies with this shell (parent-death signal); SIGINT and
# SIGTERM are passed on to it as SIGTERM (a background job of a script ignores SIGINT), and it
# kills every child and exits.
FXT_TMPDIR=$(mktemp -d /tmp/fluxon-chaos.XXXXXX)
export FXT_TMPDIR
cleanup() {
  for pf in "$FXT_TMPDIR"/*/*.pid; do
    [ -f "$pf" ] && kill -9 "$(cat "$pf")" 2>/dev/null
  done
  rm -rf "$FXT_TMPDIR"
}
trap cleanup EXIT
set +e
setpriv --pdeathsig KILL -- node "$HERE/chaos.mjs" &
child=$!
trap 'kill -TERM $child 2>/dev/null' INT TERM
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break
done
exit "$rc"
