#!/usr/bin/env bash
# Proves the layering plugin/ -> bridge/ -> lease/ (run by `make layers`, and so by `make test`).
#   1. includes: every `#include "x"` of a layer names a header of that layer or of a lower one
#      (lease: lease/; bridge: bridge/, lease/; plugin: plugin/, bridge/, lease/), with no
#      directory part; an internal header (*_int.h, e.g. bridge/mq_int.h) is included only from
#      its own directory (and by tests of its layer); the test
#      programs of a layer (Makefile LEASE_TESTS, BRIDGE_TESTS) include only that layer's headers
#      and tests/support/.
#   2. compile: every .c and .h of a layer compiles (-fsyntax-only) with only the include paths
#      of that layer, so no header of a higher layer can be reached even by accident.
#   3. link: no symbol left undefined in libfxlease.a is defined by libfxbridge.a or libfxplugin.a,
#      and none left undefined in libfxbridge.a is defined by libfxplugin.a.
#   4. the channel wall: plugin/ talks to channels (bridge/chanq.h), not to sub-MPSCs. Its
#      library uses no bridge-internal symbol (fx__*) and no MPMC/sub-MPSC endpoint call (every
#      fx_mpmc_* but fx_mpmc_resolve, every fx_mpsc_*, fx_attempts_*: PLUGIN_FORBIDDEN below), and
#      no plugin/ source file names one of them (a macro or a function pointer would escape nm).
# Environment: CC, CFLAGS (language and warning flags, no include paths), BUILD (dir of the
# libraries), LEASE_TESTS, BRIDGE_TESTS (space-separated program names). Exit 1 on a violation.
set -u
cd "$(dirname "$0")/.."
CC=${CC:-cc}
CFLAGS=${CFLAGS:--std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread}
BUILD=${BUILD:-build}
bad=0
fail() { echo "layers: $*" >&2; bad=1; }

# Directories a layer may include from.
allowed_dirs() {
  case "$1" in
    lease) echo "lease" ;;
    bridge) echo "bridge lease" ;;
    plugin) echo "plugin bridge lease" ;;
  esac
}

# check_includes LAYER FILE...: each quoted include must be a bare header name found in an
# allowed directory (test programs may also include tests/support/*.h by path).
check_includes() {
  local layer=$1 f inc d ok
  shift
  for f in "$@"; do
    while IFS= read -r inc; do
      ok=0
      case "$inc" in
        tests/support/*.h) [[ "$f" == tests/* ]] && [ -f "$inc" ] && ok=1 ;;
        */*) ;;
        *) for d in $(allowed_dirs "$layer"); do [ -f "$d/$inc" ] && ok=1; done ;;
      esac
      # Internal headers (*_int.h: mq_int.h, etcd_int.h) stay in their directory
      # (tests of the layer may use them).
      if [ $ok = 1 ] && [[ "$inc" == *_int.h ]] && [[ "$f" != tests/* ]] && [ ! -f "$(dirname "$f")/$inc" ]; then
        ok=0
      fi
      [ $ok = 1 ] || fail "$f ($layer layer) includes \"$inc\": not a header of its layer or a lower one"
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  done
}

inc_flags() {
  local d out=""
  for d in $(allowed_dirs "$1"); do out="$out -I$d"; done
  echo "$out"
}

# 1. includes
for layer in lease bridge plugin; do
  check_includes "$layer" $layer/*.c $layer/*.h
done
test_files() { # test program sources named in $1 (space-separated names)
  local n f
  for n in $1; do
    for f in tests/unit/$n.c tests/integration/$n.c tests/bench/$n.c tests/fuzz/$n.c; do
      [ -f "$f" ] && echo "$f"
    done
  done
}
lease_tests=$(test_files "${LEASE_TESTS:-}")
bridge_tests=$(test_files "${BRIDGE_TESTS:-}")
[ -n "$lease_tests" ] && check_includes lease $lease_tests
[ -n "$bridge_tests" ] && check_includes bridge $bridge_tests

# 2. compile each file with only its layer's include paths
for layer in lease bridge plugin; do
  flags=$(inc_flags "$layer")
  for f in $layer/*.c $layer/*.h; do
    lang=c
    [[ "$f" == *.h ]] && lang=c-header
    # shellcheck disable=SC2086
    out=$($CC $CFLAGS $flags -fsyntax-only -x "$lang" "$f" 2>&1) ||
      fail "$f does not compile with only$flags: $(echo "$out" | head -3)"
  done
done

# 3. link: undefined symbols of a lower library defined only by a higher one
defined() { [ -f "$1" ] && nm -g --defined-only "$1" 2>/dev/null | awk 'NF==3 {print $3}' | sort -u; }
undefined() { [ -f "$1" ] && nm -u "$1" 2>/dev/null | awk 'NF==2 {print $2}' | sort -u; }
lease_lib=$BUILD/libfxlease.a bridge_lib=$BUILD/libfxbridge.a plugin_lib=$BUILD/libfxplugin.a
for lib in "$lease_lib" "$bridge_lib" "$plugin_lib"; do
  [ -f "$lib" ] || fail "$lib missing (build first)"
done
if [ $bad = 0 ]; then
  up=$(sort -u <(defined "$bridge_lib") <(defined "$plugin_lib"))
  hit=$(comm -12 <(undefined "$lease_lib") <(echo "$up"))
  [ -z "$hit" ] || fail "libfxlease.a uses symbols of a higher layer: $(echo $hit)"
  hit=$(comm -12 <(undefined "$bridge_lib") <(defined "$plugin_lib"))
  [ -z "$hit" ] || fail "libfxbridge.a uses symbols of the plugin layer: $(echo $hit)"
fi

# 4. plugin/ talks to channels, not to sub-MPSCs
PLUGIN_FORBIDDEN='^(fx__[A-Za-z0-9_]*|fx_mpsc_[A-Za-z0-9_]*|fx_attempts_[A-Za-z0-9_]*|fx_mpmc_(put|put_hold|put_release|get|ack|flush|reclaim|producer_[a-z_]+|consumer_[a-z_]+))$'
if [ $bad = 0 ]; then
  hit=$(undefined "$plugin_lib" | grep -E "$PLUGIN_FORBIDDEN")
  [ -z "$hit" ] || fail "libfxplugin.a uses sub-MPSC or bridge-internal calls: $(echo $hit)" \
    "($(for o in "$BUILD"/plugin/*.o; do for h in $hit; do nm -u "$o" | grep -qw "$h" && echo -n "$(basename "$o" .o):$h "; done; done))"
  # the same names in the sources (comments included: the wall is also what plugin/ talks about)
  while IFS= read -r line; do
    fail "${line%%:*} names a sub-MPSC API ($(echo "$line" | grep -oE '\bfx_(mpsc|attempts|mpmc)_[A-Za-z0-9_]+|\bfx__[A-Za-z0-9_]+' | grep -E "$PLUGIN_FORBIDDEN" | sort -u | tr '\n' ' ')): $line"
  done < <(grep -nowE 'fx_(mpsc|attempts|mpmc)_[A-Za-z0-9_]+|fx__[A-Za-z0-9_]+' plugin/*.c plugin/*.h |
           awk -F: -v re="$PLUGIN_FORBIDDEN" '$3 ~ re {print $1":"$2}' | sort -u |
           while IFS=: read -r f n; do echo "$f:$n: $(sed -n "${n}p" "$f" | sed 's/^[[:space:]]*//')"; done)
fi

if [ $bad = 0 ]; then
  echo "layers: ok (lease <- bridge <- plugin: includes, per-layer compile, library symbols, no sub-MPSC call in plugin/)"
fi
exit $bad
