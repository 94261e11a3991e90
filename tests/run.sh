#!/usr/bin/env bash
# Runs the test programs (and the shell tests tests/<suite>/test_*.sh) and prints one closing line "N passed, N failed, N skipped".
#   tests/run.sh [--slow N] [--e2e-filter REGEX [--e2e-skip-reason TEXT]] [unit|integration|e2e|chaos ...]
#   (default: all suites)
# --slow N: the slow-build factor (FXT_SLOW, an integer >= 1) every test multiplies its time
#   bounds and deadlines by (tests/support/fxt_slow.h, tests/e2e/lib/stack.mjs); the Makefile
#   passes it per target (make test 1, make check 3, make tsan 5, make valgrind 5); on a loaded
#   machine `make test SLOW=2`. Also stretches the per-program timeout.
# --e2e-filter REGEX: run only the e2e tests whose name matches; every other one is reported as
#   "[  SKIPPED ]" with the reason (--e2e-skip-reason) and counted (make tsan's daemon subset).
# Environment: BUILD (build dir, default build), FXT_VALGRIND=1 (unit tests under valgrind),
# FXT_TEST_TIMEOUT (seconds per program, default 600, times the slow factor); the e2e suite is one
# program of many tests, each with its own timeout: FXT_E2E_TIMEOUT (default 2400, times the factor).
# A suite run never shrinks or stretches silently: FXT_SLOW, FXE2E_SLOW, FXE2E_FILTER,
# FXE2E_EXCLUDE and FXE2E_SKIP_REASON in the caller's environment are refused (exit 2) unless
# FXT_ALLOW_FILTER=1 is set too (then they apply, and are printed).
# Every program runs with FXT_TMPDIR set to a fresh directory; whatever a program started is
# killed and that directory removed when the run ends, also on failure or Ctrl-C.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD

inherited=()
for v in FXT_SLOW FXE2E_SLOW FXE2E_FILTER FXE2E_EXCLUDE FXE2E_SKIP_REASON; do
  [ -n "${!v+x}" ] && inherited+=("$v=${!v}")
done
if [ ${#inherited[@]} -gt 0 ]; then
  if [ "${FXT_ALLOW_FILTER:-0}" != 1 ]; then
    echo "tests/run.sh: refusing ${inherited[*]} from the environment: it would shrink or stretch this run" >&2
    echo "  silently. Unset it, use --slow / --e2e-filter, or set FXT_ALLOW_FILTER=1 to apply it." >&2
    exit 2
  fi
  echo "tests/run.sh: FXT_ALLOW_FILTER=1: applying ${inherited[*]} from the environment"
fi

SLOW=${FXT_SLOW:-${FXE2E_SLOW:-1}}
unset FXE2E_SLOW
while [ $# -gt 0 ]; do
  case "$1" in
    --slow) SLOW=$2; shift 2 ;;
    --e2e-filter) export FXE2E_FILTER=$2; shift 2 ;;
    --e2e-skip-reason) export FXE2E_SKIP_REASON=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "tests/run.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ "$SLOW" =~ ^[1-9][0-9]?$ ]] || { echo "tests/run.sh: --slow wants an integer 1..99, got '$SLOW'" >&2; exit 2; }
export FXT_SLOW=$SLOW
[ "$SLOW" -gt 1 ] && echo "tests/run.sh: slow-build factor $SLOW (time bounds and deadlines x$SLOW)"

SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(unit integration e2e chaos)
TIMEOUT=$(( ${FXT_TEST_TIMEOUT:-600} * SLOW ))

export FXT_TMPDIR
FXT_TMPDIR=$(mktemp -d /tmp/fluxon-test.XXXXXX)

cleanup() {
  # Kill anything a test left running (pidfiles written by tests/support), then the temp dir.
  for pf in "$FXT_TMPDIR"/*.pid "$FXT_TMPDIR"/*/*.pid; do
    [ -f "$pf" ] || continue
    pid=$(cat "$pf" 2>/dev/null)
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$FXT_TMPDIR"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

passed=0; failed=0; skipped=0
failed_names=()

run_prog() { # $1 = suite, $2 = binary
  local suite=$1 bin=$2 name out rc total ok fail skip
  name=$(basename "$bin")
  out="$FXT_TMPDIR/$name.out"
  echo "=== $suite/$name"
  local cmd=("$bin")
  if [ "$suite" = unit ] && [ "${FXT_VALGRIND:-0}" = 1 ] && [[ "$bin" != *.sh ]]; then
    cmd=(valgrind -q --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect --error-exitcode=99 "$bin")
  fi
  local limit=$TIMEOUT
  [ "$suite" = e2e ] && limit=$(( ${FXT_E2E_TIMEOUT:-2400} * SLOW ))
  timeout --signal=TERM --kill-after=10 "$limit" "${cmd[@]}" >"$out" 2>&1
  rc=$?
  cat "$out"
  total=$(sed -n 's/^\[==========\] Running \([0-9]*\) test(s)\./\1/p' "$out" | awk '{s+=$1} END {print s+0}')
  ok=$(grep -c '^\[       OK \]' "$out")
  skip=$(grep -c '^\[  SKIPPED \]' "$out")
  fail=$(( total - ok - skip ))
  if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
    # Crash, timeout, leak report or setup failure with no test counted as failed: count one.
    fail=1
    echo "!!! $suite/$name exited with status $rc"
  fi
  [ "$rc" -eq 124 ] && echo "!!! $suite/$name timed out after ${limit}s"
  passed=$((passed + ok)); failed=$((failed + fail)); skipped=$((skipped + skip))
  if [ "$fail" -gt 0 ]; then
    failed_names+=("$suite/$name")
  fi
}

for suite in "${SUITES[@]}"; do
  case "$suite" in
    unit|integration)
      for bin in "$BUILD"/tests/"$suite"/test_*; do
        [ -x "$bin" ] && [ -f "$bin" ] && [[ "$bin" != *.o ]] && [[ "$bin" != *.d ]] || continue
        run_prog "$suite" "$bin"
      done
      # Shell tests of the suite (tests/<suite>/test_*.sh), same cmocka-style output.
      for sh in tests/"$suite"/test_*.sh; do
        [ -x "$sh" ] || continue
        run_prog "$suite" "$sh"
      done ;;
    e2e)
      if [ -x tests/e2e/run.sh ]; then
        run_prog e2e tests/e2e/run.sh
      fi ;;
    chaos) run_prog chaos tests/chaos/run.sh ;; # chaos_fixed_seed (60 s of faults, seed 19)
    *) echo "unknown suite: $suite" >&2; exit 2 ;;
  esac
done

echo
[ ${#failed_names[@]} -gt 0 ] && echo "failing programs: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
