#!/usr/bin/env bash
# Runs the benchmarks (built by make; this script builds nothing) and prints their tables.
#   tests/bench/run.sh [etcd_bench options, e.g. -d 5 -c 8 -r 1]
#   tests/bench/run.sh --soak [seconds]   only the bridge memory soak (nats_bench -S, default 300)
#   tests/bench/run.sh --cluster          only the cluster-shape row (2 bridges vs 1)
#   tests/bench/run.sh --claims           only the claims-scale table (1,000 claims)
#   tests/bench/run.sh --natscli          only the nats bench rows (bridge vs JetStream WorkQueue)
#   tests/bench/run.sh --profile          only the CPU-per-message / perf / etcd-kinds tables
#   tests/bench/run.sh --gateway          only etcd's JSON gateway vs its gRPC API (etcd CPU)
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

SOAK=
CLUSTER_ONLY=
CLAIMS_ONLY=
NATSCLI_ONLY=
PROFILE_ONLY=
GATEWAY_ONLY=
if [ "${1:-}" = "--soak" ]; then
  SOAK=${2:-300}
elif [ "${1:-}" = "--cluster" ]; then
  CLUSTER_ONLY=1
elif [ "${1:-}" = "--claims" ]; then
  CLAIMS_ONLY=1
elif [ "${1:-}" = "--natscli" ]; then
  NATSCLI_ONLY=1
elif [ "${1:-}" = "--profile" ]; then
  PROFILE_ONLY=1
elif [ "${1:-}" = "--gateway" ]; then
  GATEWAY_ONLY=1
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

run_soak() {
  NB="$BUILD/tests/bench/nats_bench"
  echo "## Bridge memory soak (issue 5)"
  echo
  echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "command: $NB -S $SOAK -b $BUILD/fluxon-bridge"
  echo
  "$NB" -S "$SOAK" -b "$BUILD/fluxon-bridge"
}

# nats_bench with one retry when it died of a signal: the crash stays visible (a line in the
# tables, and nats_bench's own report on stderr: the row and a backtrace), the run goes on.
run_nb() {
  "$NB" "$@"
  local rc=$?
  if [ "$rc" -gt 128 ]; then
    echo "nats_bench $* died of signal $((rc - 128)) (the row and a backtrace are on stderr); run again once:"
    echo
    "$NB" "$@"
    rc=$?
  fi
  return "$rc"
}

run_all() {
  echo "## etcd client vs raw libcurl"
  echo
  echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); $(etcd --version 2>/dev/null | head -1)"
  echo "command: $BIN $*"
  echo
  "$BIN" "$@" || exit 1
  run_gateway >"$FXT_TMPDIR/gateway.txt" || { cat "$FXT_TMPDIR/gateway.txt"; exit 1; }
  cat "$FXT_TMPDIR/gateway.txt"

  echo
  echo "## Fluxon MQ (bridge/): MPMC put -> get -> ack"
  echo
  MQ="$BUILD/tests/bench/mq_bench"
  for t in json grpc; do
    echo "command: $MQ -d 5 -T $t"
    echo
    "$MQ" -d 5 -T "$t" 2>/dev/null || exit 1
    echo
  done

  echo
  echo "## Row 6: the MQ's etcd work per batch, without MQ code (the physical limit of the design)"
  echo
  PB="$BUILD/tests/bench/payload_bench"
  echo "command: $PB -d 4"
  echo
  "$PB" -d 4 2>/dev/null || exit 1

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
  echo "row 6 (raw etcd rate at the bridge's concurrency): the txn rows of the etcd_bench table and the payload_bench table above"
  echo
  run_nb -d 5 -b "$BUILD/fluxon-bridge" >"$FXT_TMPDIR/nb-etcd.txt" || { cat "$FXT_TMPDIR/nb-etcd.txt"; exit 1; }
  cat "$FXT_TMPDIR/nb-etcd.txt"
  # The one-at-a-time target of issue 24: a PubAck (row 5n, 128 B) against a raw etcd txn (1
  # compare + 1 put, 128 B, concurrency 1) over gRPC, the bridge's transport, from this run.
  awk -F'|' '
    FNR == 1 { f++ }
    f == 1 && $2 ~ /^ txn $/ && $3 ~ /128 B/ && $4 ~ /^ 1 $/ && $5 ~ /gRPC/ { split($8, a, " "); txn = a[1] }
    f == 1 && $2 ~ /^ fused1 $/ && $5 ~ /^ gRPC $/ { split($8, a, " "); own = a[1] }
    f == 1 && $2 ~ /^ fused1 $/ && $5 ~ /idle/ { split($8, a, " "); idle = a[1] }
    f == 2 && $2 ~ /^ 3 $/ && $4 ~ /128 B/ { split($8, a, " "); js = a[1] }
    f == 2 && $2 ~ /^ 5n $/ && $4 ~ /128 B/ { split($8, a, " "); pa = a[1] }
    END { if (txn > 0 && pa > 0)
            printf "- publish-ack p50 one at a time (5n, 128 B) %.2f ms / raw gRPC txn p50 (etcd_gateway, conc 1, 128 B) %.2f ms = %.2f\n", pa, txn, pa / txn
          if (own > 0 && pa > 0)
            printf "- publish-ack p50 one at a time (5n, 128 B) %.2f ms / the bridge'"'"'s own one-message txn p50 (etcd_gateway fused1, gRPC, back to back) %.2f ms = %.2f\n", pa, own, pa / own
          if (idle > 0 && pa > 0)
            printf "- publish-ack p50 one at a time (5n, 128 B) %.2f ms / the same txn with etcd idle between requests (as a one-at-a-time publisher leaves it) %.2f ms = %.2f; over it: %.2f ms, against %.2f ms for a whole JetStream PubAck round trip (row 3)\n", pa, idle, pa / idle, pa - idle, js }
  ' "$FXT_TMPDIR/gateway.txt" "$FXT_TMPDIR/nb-etcd.txt"

  # The same bridge rows on the Redis payload plane (kv.backend "redis", split: payload put then
  # the offset txn), with the JetStream rows again so each table's ratios are from one run.
  for plane in redis-everysec redis-always; do
    echo
    echo "## Bridge on the Redis payload plane ($plane) vs JetStream (issue 12)"
    echo
    echo "command: $NB -d 5 -K $plane -o 2,3,4,5 -b $BUILD/fluxon-bridge"
    echo
    run_nb -d 5 -K "$plane" -o 2,3,4,5 -b "$BUILD/fluxon-bridge" || exit 1
  done
  run_profile
  run_cluster
  run_claims
  run_natscli
}

# The standard tool: the same `nats bench` command lines (--js publish with --syncpub and async,
# --pull --consumer C --sub N) against the bridge and against a JetStream WorkQueue stream on this
# machine (an e2e scale test; its table rows are the lines starting with "|" of its log). The nats
# CLI is the one the e2e harness builds (natscli 0.0.35, once, into build-tools/natscli).
# FXBENCH_NATSCLI_MSGS (default 10000) and FXBENCH_NATSCLI_SUBS (default 2) size it.
run_natscli() {
  echo
  echo "## nats bench: bridge vs JetStream WorkQueue, the same command lines (issue 22)"
  echo
  echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); $(nats-server --version 2>/dev/null | head -1)"
  echo "command: FXE2E_SCALE=1 BUILD=$BUILD tests/e2e/run.sh '^bench_natscli_js\$'"
  echo "(two nats-servers: one with the bridge beside it, etcd payload plane; one with JetStream, stream orders: WorkQueue, file storage, its default sync; only --server differs; the rates are the ones nats bench prints)"
  echo
  local log="$FXT_TMPDIR/natscli-bench.log"
  FXE2E_SCALE=1 BUILD=$BUILD tests/e2e/run.sh '^bench_natscli_js$' >"$log" 2>&1 ||
    { tail -20 "$log" >&2; exit 1; }
  sed -n 's/^ *\[bench_natscli_js [^]]*\] //p' "$log" | grep '^|'
}

# What etcd's JSON gateway costs etcd itself against its gRPC API, for the bridge's requests
# (tests/bench/go/etcd_gateway, built here in GOPATH mode against Debian's etcd client source,
# golang-etcd-server-dev, which `make bench` installs).
run_gateway() {
  echo
  echo "## etcd's JSON gateway vs its gRPC API: etcd CPU per request (issue 24)"
  echo
  local b gw
  b=$(cd "$BUILD" && pwd)
  gw="$b/tests/bench/etcd_gateway"
  (cd tests/bench/go/etcd_gateway && GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS= \
     GOCACHE="$b/go-cache" go build -o "$gw" .) ||
    { echo "go build of tests/bench/go/etcd_gateway failed (make bench installs golang-etcd-server-dev)" >&2; exit 1; }
  echo "machine: $(nproc) CPUs; $(etcd --version 2>/dev/null | head -1)"
  echo "command: $gw -d 3"
  echo
  "$gw" -d 3 || exit 1
}

# CPU per message per process, the top symbols of each (perf) and etcd requests per message by
# kind, on the bridge rows of both payload planes (tests/bench/profile.sh).
run_profile() {
  echo
  echo "## CPU per message and where it goes (issue 24)"
  echo
  echo "command: BUILD=$BUILD tests/bench/profile.sh"
  echo
  BUILD=$BUILD bash tests/bench/profile.sh || exit 1
}

# Claims scale on one bridge: threads, descriptors, RSS per 100 claims opened and the
# idle etcd request rate with 1,000 claims, from the e2e_thousand_claims test's phase log (its
# table rows are the lines starting with "|"). FXE2E_CLAIMS_WAIT_MS=120000 so a slow machine
# still yields the table (the test's own bound is 45 s).
run_claims() {
  echo
  echo "## Claims scale: 1,000 claims on one bridge (issue 13)"
  echo
  echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "command: FXE2E_CLAIMS_WAIT_MS=120000 BUILD=$BUILD tests/e2e/run.sh '^e2e_thousand_claims\$'"
  echo "(the e2e stack: one etcd, one nats-server, one bridge; 1,000 subscriber names of one channel; idle: etcd's request counters over 5 s with every claim open)"
  echo
  local log="$FXT_TMPDIR/claims-bench.log"
  FXE2E_CLAIMS_WAIT_MS=120000 BUILD=$BUILD tests/e2e/run.sh '^e2e_thousand_claims$' >"$log" 2>&1 ||
    { tail -20 "$log" >&2; exit 1; }
  sed -n 's/^ *\[e2e_thousand_claims [^]]*\] //p' "$log" | grep '^|'
}

# End-to-end throughput on the cluster shape with 2 bridges vs 1 (an e2e scale test;
# its table rows are the lines starting with "|" of its log).
run_cluster() {
  echo
  echo "## Cluster shape: 2 bridges vs 1 (issue 13)"
  echo
  echo "command: FXE2E_SCALE=1 BUILD=$BUILD tests/e2e/run.sh '^bench_cluster_two_bridges_vs_one\$'"
  echo "(three routed nats-servers, one etcd member; subscriber and publisher on the server without a bridge)"
  echo
  local log="$FXT_TMPDIR/cluster-bench.log"
  FXE2E_SCALE=1 BUILD=$BUILD tests/e2e/run.sh '^bench_cluster_two_bridges_vs_one$' >"$log" 2>&1 ||
    { tail -20 "$log" >&2; exit 1; }
  sed -n 's/^ *\[bench_cluster_two_bridges_vs_one [^]]*\] //p' "$log" | grep '^|'
}

# The output also goes into BENCHMARKS.md, between the markers of its "latest run" section
# (FX_BENCH_NO_RECORD=1 skips that), and only when every program exited 0.
record() {
  local marker=$1 out=$2 file=BENCHMARKS.md
  [ -f "$file" ] || return 0
  if ! grep -q "^<!-- $marker:latest -->$" "$file"; then
    printf '\n<!-- %s:latest -->\n<!-- /%s:latest -->\n' "$marker" "$marker" >>"$file"
  fi
  awk -v s="<!-- $marker:latest -->" -v e="<!-- /$marker:latest -->" -v out="$out" \
      -v when="$(date -u '+%Y-%m-%d %H:%M UTC')" -v cmd="$CMDLINE" -v secs="$SECONDS" '
    $0 == s { print; print ""; print "Recorded " when " by `" cmd "` (" secs " s):"; print "";
              while ((getline l < out) > 0) { sub(/^## /, "### ", l); print l }
              skip = 1; next }
    $0 == e { skip = 0 }
    !skip { print }' "$file" >"$FXT_TMPDIR/bench.md" && cat "$FXT_TMPDIR/bench.md" >"$file"
  echo "(recorded in $file)" >&2
}

CMDLINE="BUILD=$BUILD tests/bench/run.sh${*:+ $*}"
OUT="$FXT_TMPDIR/out.md"
if [ -n "$CLUSTER_ONLY" ]; then
  run_cluster
  exit $?
elif [ -n "$CLAIMS_ONLY" ]; then
  run_claims
  exit $?
elif [ -n "$NATSCLI_ONLY" ]; then
  run_natscli
  exit $?
elif [ -n "$PROFILE_ONLY" ]; then
  run_profile
  exit $?
elif [ -n "$GATEWAY_ONLY" ]; then
  run_gateway
  exit $?
elif [ -n "$SOAK" ]; then
  run_soak | tee "$OUT"
  rc=${PIPESTATUS[0]}
  marker=soak
else
  run_all "$@" | tee "$OUT"
  rc=${PIPESTATUS[0]}
  marker=bench
fi
if [ "$rc" -eq 0 ] && [ -z "${FX_BENCH_NO_RECORD:-}" ]; then
  record "$marker" "$OUT"
fi
exit "$rc"
