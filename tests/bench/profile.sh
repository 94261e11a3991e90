#!/usr/bin/env bash
# Where the CPU goes per message: tests/bench/run.sh (make bench) runs this after the bridge rows.
#   tests/bench/profile.sh [-d seconds] [-o rows] [-s sizes] [-K "plane plane"] [-n top]
# For each payload plane (default "etcd redis-everysec") it runs nats_bench's rows (default 4a and
# 4c at 128 B and 4 KiB) and prints, per row:
#   - the CPU-per-message table of nats_bench (us of CPU per message: bridge, etcd, nats-server,
#     redis, the bench client), from /proc/<pid>/stat over the measured window;
#   - with perf (Debian linux-perf; scripts/install-deps.sh installs it): `perf record -F 999` of
#     those processes over the same window (nats_bench -p), then per process its share of the
#     samples, its kernel share, and its top symbols (self time, % of that process's samples);
#     and the bridge's samples by thread name (its threads are named "fx-<role>").
# Then one more pass per plane with nats_bench -X (the bridge's etcd behind a counting proxy): etcd
# requests, request bytes and answer bytes per consumed message by kind (a separate pass, because
# the proxy adds a hop to every etcd call and its own CPU).
# Output: markdown on stdout (run.sh records it in BENCHMARKS.md); progress on stderr. Exit 1 when
# a nats_bench run failed. Environment: BUILD (default build); FXT_TMPDIR (default /tmp): perf
# data goes into a temp dir under it, removed at exit.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NB="$BUILD/tests/bench/nats_bench"
DUR=5
ROWS=4a,4c
SIZES=128,4096
PLANES="etcd redis-everysec"
TOP=6
while getopts "d:o:s:K:n:" o; do
  case $o in
    d) DUR=$OPTARG ;;
    o) ROWS=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    K) PLANES=$OPTARG ;;
    n) TOP=$OPTARG ;;
    *) echo "usage: $0 [-d seconds] [-o rows] [-s sizes] [-K \"planes\"] [-n top]" >&2; exit 2 ;;
  esac
done
if [ ! -x "$NB" ] || [ ! -x "$BUILD/fluxon-bridge" ]; then
  echo "missing $NB or $BUILD/fluxon-bridge: run make first" >&2
  exit 1
fi
PD=$(mktemp -d "${FXT_TMPDIR:-/tmp}/fluxon-profile.XXXXXX")
trap 'rm -rf "$PD"' EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

PERF=
if command -v perf >/dev/null 2>&1 && perf record -q -o "$PD/probe.data" -- true >/dev/null 2>&1; then
  PERF=perf
fi
rm -f "$PD/probe.data"

# The processes of one perf.data (pids: bridge etcd nats redis client): each one's share of the
# samples, its kernel share and its top symbols (self time), from `perf script` (its pid field is
# the process, where perf report's pid key is the thread).
perf_table() {
  local data=$1 bp=$2 ep=$3 np=$4 rp=$5 cp=$6
  perf script -i "$data" -F pid,ip,sym,dso 2>/dev/null | awk -v top="$TOP" \
      -v pids="$bp $ep $np $rp $cp" -v names="bridge,etcd,nats-server,redis,bench client" '
    BEGIN { split(pids, p, " "); split(names, nm, ","); k = 0
            for (i = 1; i <= 5; i++) if (p[i] + 0 > 0) { name[p[i]] = nm[i]; order[++k] = p[i] } }
    NF >= 3 {
      pid = $1; all++; tot[pid]++
      dso = $NF; gsub(/[()]/, "", dso); sub(/.*\//, "", dso)
      sym = ""; for (i = 3; i < NF; i++) sym = sym (i > 3 ? " " : "") $i
      if (sym == "[unknown]") sym = "[unknown]"
      if (dso ~ /kernel/) kern[pid]++
      c[pid SUBSEP sym " (" dso ")"]++
    }
    END {
      for (o = 1; o <= k; o++) {
        pid = order[o]; if (!(pid in name)) continue
        if (!tot[pid]) { printf "| %s | 0%% | | |\n", name[pid]; continue }
        out = ""; delete best
        for (key in c) { split(key, kk, SUBSEP); if (kk[1] == pid) best[kk[2]] = c[key] }
        for (t = 0; t < top; t++) {
          bk = ""; bv = 0
          for (s in best) if (best[s] > bv) { bv = best[s]; bk = s }
          if (bk == "") break
          sy = bk; gsub(/\|/, "/", sy); if (length(sy) > 60) sy = substr(sy, 1, 60) "..."
          out = out (t ? "; " : "") sprintf("%.1f%% %s", 100 * bv / tot[pid], sy)
          delete best[bk]
        }
        printf "| %s | %.0f%% | %.0f%% | %s |\n", name[pid], 100 * tot[pid] / all, 100 * kern[pid] / tot[pid], out
      }
    }'
}

# The bridge's samples by thread name (fx_log.h fx_thread_name: "fx-<role>"; "fluxon-bridge" is
# the main thread and the threads of cnats (its socket reader and flusher) and libcurl).
thread_line() {
  local data=$1 bp=$2
  perf script -i "$data" -F pid,comm 2>/dev/null | awk -v bp="$bp" '
    $2 == bp { c[$1]++; t++ }
    END {
      if (!t) exit
      out = ""
      for (n = 0; n < 10; n++) {
        bk = ""; bv = 0
        for (k in c) if (c[k] > bv) { bv = c[k]; bk = k }
        if (bk == "") break
        out = out (n ? "; " : "") sprintf("%.1f%% %s", 100 * bv / t, bk)
        delete c[bk]
      }
      print "bridge samples by thread: " out
    }'
}

rc=0
echo "Per-message CPU and top symbols per process, rows $ROWS at $SIZES, ${DUR} s windows; machine: $(nproc) CPUs${PERF:+; $(perf --version 2>/dev/null)}."
echo "CPU us/msg = CPU time of the process over the measured window / messages of the row in it. perf: \`perf record -F 999\` of the bench's own processes over the same window (self time, no call graphs); the share of samples is of all samples of those processes; symbols are % of that process's samples. etcd's binary carries no symbols (Go, stripped): its rows name the kernel and [unknown]."
[ -n "$PERF" ] || echo "(perf not available: the symbol tables are left out; scripts/install-deps.sh installs linux-perf)"
echo
for plane in $PLANES; do
  echo "#### Plane: $plane"
  echo
  hook=
  if [ -n "$PERF" ]; then
    hook="pids=\$BRIDGE_PID,\$ETCD_PID,\$NATS_PID,\$BENCH_PID; [ \"\$REDIS_PID\" -gt 0 ] && pids=\$pids,\$REDIS_PID; "
    hook+="echo \"\$BRIDGE_PID \$ETCD_PID \$NATS_PID \$REDIS_PID \$BENCH_PID\" > $PD/$plane-\$ROW-\$SIZE.pids; "
    hook+="exec perf record -q -F 999 -o $PD/$plane-\$ROW-\$SIZE.data -p \$pids -- sleep \$WINDOW_S >/dev/null 2>&1"
  fi
  echo "command: $NB -d $DUR -o $ROWS -s $SIZES -K $plane -b $BUILD/fluxon-bridge${PERF:+ -p '<perf record of the pids>'}"
  echo
  out="$PD/$plane.md"
  if ! "$NB" -d "$DUR" -o "$ROWS" -s "$SIZES" -K "$plane" -b "$BUILD/fluxon-bridge" ${hook:+-p "$hook"} \
      >"$out" 2>"$PD/$plane.err"; then
    rc=1
    tail -5 "$PD/$plane.err" >&2
  fi
  # the main table (msgs/s, latencies) and the CPU-per-message table
  awk '/^\| # \| scenario/ || /^CPU per message/ { on = 1 } on && !/^\| 6 \| raw etcd/ { print }
       on && /^\|/ { seen = 1 } on && seen && /^$/ { on = 0; seen = 0 }' "$out"
  if [ -n "$PERF" ]; then
    for f in "$PD/$plane"-*.data; do
      [ -f "$f" ] || continue
      base=${f%.data}
      tag=${base#"$PD/$plane"-}
      read -r bp ep np rp cp <"$base.pids"
      echo "perf, $plane, row ${tag%-*} at ${tag##*-} B:"
      echo
      echo "| process | share of samples | kernel | top symbols (% of the process) |"
      echo "|---|---|---|---|"
      perf_table "$f" "$bp" "$ep" "$np" "${rp:-0}" "$cp"
      echo
      thread_line "$f" "$bp"
      echo
    done
  fi
done

echo "#### etcd requests and bytes per message by kind"
echo
for plane in $PLANES; do
  echo "command: $NB -X -d $DUR -o 4a -s $SIZES -K $plane -b $BUILD/fluxon-bridge"
  echo
  out="$PD/$plane-X.md"
  if ! "$NB" -X -d "$DUR" -o 4a -s "$SIZES" -K "$plane" -b "$BUILD/fluxon-bridge" >"$out" 2>"$PD/$plane-X.err"; then
    rc=1
    tail -5 "$PD/$plane-X.err" >&2
  fi
  echo "plane $plane:"
  echo
  sed -n '/^| # | size | kind/,/^$/p' "$out"
done
exit $rc
