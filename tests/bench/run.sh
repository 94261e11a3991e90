#!/usr/bin/env bash
# Runs the benchmarks (built by make; this script builds nothing) and prints their tables.
#   tests/bench/run.sh [etcd_bench options, e.g. -d 5 -c 8 -r 1]
# Environment: BUILD (build dir, default build); FX_ETCD_ENDPOINT to bench an existing etcd
# instead of one started by the program. The etcd a bench starts lives in a fresh temp dir that
# is removed (and any leftover process killed) when this script ends, also on failure or Ctrl-C.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BIN="$BUILD/tests/bench/etcd_bench"
if [ ! -x "$BIN" ]; then
  echo "missing $BIN: run make first" >&2
  exit 1
fi

export FXT_TMPDIR
FXT_TMPDIR=$(mktemp -d /tmp/fluxon-bench.XXXXXX)
cleanup() {
  for pf in "$FXT_TMPDIR"/*.pid; do
    [ -f "$pf" ] || continue
    pid=$(cat "$pf" 2>/dev/null)
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$FXT_TMPDIR"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

echo "## etcd client vs raw libcurl"
echo
echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); $(etcd --version 2>/dev/null | head -1)"
echo "command: $BIN $*"
echo
"$BIN" "$@" || exit 1

echo
echo "## Fluxon MQ (bridge/): MPMC put -> get -> ack"
echo
MQ="$BUILD/tests/bench/mq_bench"
echo "command: $MQ -d 5"
echo
"$MQ" -d 5 2>/dev/null || exit 1

echo
echo "## Bridge vs JetStream and NATS core (issue 5)"
echo
NB="$BUILD/tests/bench/nats_bench"
if [ ! -x "$NB" ] || [ ! -x "$BUILD/fluxon-bridge" ]; then
  echo "missing $NB or $BUILD/fluxon-bridge: run make first" >&2
  exit 1
fi
echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); $(nats-server --version 2>/dev/null | head -1); $(etcd --version 2>/dev/null | head -1)"
echo "command: $NB -d 5 -b $BUILD/fluxon-bridge"
echo "row 6 (raw etcd txn rate at the bridge's concurrency): the txn rows of the etcd_bench table above"
echo
"$NB" -d 5 -b "$BUILD/fluxon-bridge" || exit 1
