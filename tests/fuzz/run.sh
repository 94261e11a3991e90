#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz/ (built by `make fuzz` into BUILD_DIR/tests/fuzz/)
# for SECONDS each, starting from its seed corpus tests/fuzz/corpus/<name>/ (read only: new inputs
# go to a temp dir that is removed afterwards). Prints one line per target with its executions;
# exits non-zero when any target crashed, leaked, hit a UBSan report, timed out or did not run.
# A crashing input is kept as BUILD_DIR/fuzz-artifacts/<name>/crash-* with the target's log.
#   tests/fuzz/run.sh [BUILD_DIR (build-fuzz)] [SECONDS (30)]
# Environment: FUZZ_ONLY=<regex> runs only the matching targets.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build-fuzz}
SECONDS_PER=${2:-30}
case "$SECONDS_PER" in '' | *[!0-9]*) echo "fuzz: SECONDS must be a number" >&2; exit 2 ;; esac

work=$(mktemp -d "${TMPDIR:-/tmp}/fluxon-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

n=0
failed=0
for bin in "$BUILD_DIR"/tests/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  case "$bin" in *.o | *.d) continue ;; esac
  name=$(basename "$bin")
  name=${name#fuzz_}
  if [ -n "${FUZZ_ONLY:-}" ] && ! [[ "$name" =~ $FUZZ_ONLY ]]; then continue; fi
  seeds="tests/fuzz/corpus/$name"
  if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
    echo "fuzz_$name: FAILED (no seed corpus in $seeds)"
    failed=$((failed + 1))
    continue
  fi
  n=$((n + 1))
  art="$BUILD_DIR/fuzz-artifacts/$name"
  rm -rf "$art"
  mkdir -p "$art" "$work/$name"
  log="$art/fuzz.log"
  # -timeout: one input taking longer than 10 s is a hang (reported as a failure);
  # -rss_limit_mb: a bound on memory; -max_len: inputs up to 64 KiB.
  "$bin" -max_total_time="$SECONDS_PER" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$art/" "$work/$name" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  corpus=$(find "$work/$name" -type f | wc -l)
  if [ "$rc" -ne 0 ] || ls "$art"/crash-* "$art"/leak-* "$art"/timeout-* "$art"/oom-* >/dev/null 2>&1; then
    failed=$((failed + 1))
    echo "fuzz_$name: FAILED (exit $rc) after ${execs:-?} executions; log and input in $art/"
    grep -m1 -E 'ERROR: |runtime error:|SUMMARY:' "$log" | sed 's/^/    /'
  else
    rm -rf "$art"
    echo "fuzz_$name: ok, ${execs:-?} executions in ${SECONDS_PER} s (${cov:-cov: ?}, $corpus new inputs)"
  fi
done
[ "$n" -gt 0 ] || { echo "fuzz: no targets built in $BUILD_DIR/tests/fuzz" >&2; exit 1; }
echo "fuzz: $((n - failed)) passed, $failed failed"  # one line per target above; closing line as tests/run.sh
[ "$failed" -eq 0 ]
