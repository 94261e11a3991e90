#!/usr/bin/env bash
# Lists the dependency edges between the modules of each layer (lease/, bridge/, plugin/) and
# finds the cycles among them (run by `make layers`).
#
# A module is one .c file and the header of the same name (bridge/revoker.c + bridge/revoker.h),
# together with the files named after it: x_part.c / x_part.h / x_int.h belong to module x when
# x.c exists (etcd_json and etcd_watch are parts of etcd, mpsc_cons and mpsc_int.h of mpsc,
# leaf_proto of leaf); edges inside one module are not listed.
# A edge A -> B is either
#   - include: A.c or A.h has `#include "B.h"` and B.c exists, or
#   - call:    A's object uses a symbol that B's object defines (a declaration reached through a
#              shared header such as mq_int.h, and called: the include edge that a shared header
#              hides).
# The call edges need the objects: $BUILD/<layer>/*.o (build first). Cycles are found with tsort
# (each loop it reports is printed with its members).
#
# Usage: scripts/include_cycles.sh [-v]      -v: print every edge
# Environment: BUILD (default build); CYCLES_STRICT (layers whose cycles fail the run, default
# "lease bridge plugin": every layer; a layer left out is reported only).
# Exit 1 when a strict layer has a cycle.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STRICT=${CYCLES_STRICT-lease bridge plugin}
verbose=0
[ "${1:-}" = -v ] && verbose=1
bad=0

# mod_of DIR NAME: the module of file NAME (no extension) in DIR: the longest prefix p of NAME
# ending before an underscore with DIR/p.c present, else NAME itself.
mod_of() {
  local d=$1 n=$2 p=$2
  while [[ "$p" == *_* ]]; do
    p=${p%_*}
    [ -f "$d/$p.c" ] && { echo "$p"; return; }
  done
  echo "$n"
}

edges_of_layer() { # prints "A B kind" lines for layer $1
  local d=$1 f m inc mi
  for f in "$d"/*.c "$d"/*.h; do
    [ -f "$f" ] || continue
    m=$(basename "$f"); m=$(mod_of "$d" "${m%.*}")
    [ -f "$d/$m.c" ] || continue # a header of no module (e.g. a shared *_int.h)
    while IFS= read -r inc; do
      mi=$(mod_of "$d" "${inc%.h}")
      [ "$mi" != "$m" ] && [ -f "$d/$mi.c" ] && echo "$m $mi include"
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"/]*\.h\)".*/\1/p' "$f")
  done
  local objs=()
  for f in "$d"/*.c; do
    m=$(basename "$f" .c)
    [ -f "$BUILD/$d/$m.o" ] && objs+=("$BUILD/$d/$m.o")
  done
  [ ${#objs[@]} -gt 0 ] || return 0
  for f in "${objs[@]}"; do
    m=$(mod_of "$d" "$(basename "$f" .o)")
    nm -g --defined-only "$f" 2>/dev/null | awk -v m="$m" 'NF==3 {print "D", m, $3}'
    nm -u "$f" 2>/dev/null | awk -v m="$m" 'NF==2 {print "U", m, $2}'
  done | awk '$1=="D" {def[$3]=$2; next} {use[++n]=$2" "$3}
              END {for (i=1; i<=n; i++) {split(use[i], a, " ");
                   if ((a[2] in def) && def[a[2]] != a[1]) print a[1], def[a[2]], "call"}}'
}

for layer in lease bridge plugin; do
  [ -d "$layer" ] || continue
  missing=0
  for f in "$layer"/*.c; do [ -f "$BUILD/$layer/$(basename "$f" .c).o" ] || missing=1; done
  [ $missing = 1 ] && echo "cycles: $layer: some objects missing in $BUILD/$layer (call edges incomplete; build first)" >&2
  edges=$(edges_of_layer "$layer" | sort -u)
  pairs=$(echo "$edges" | awk 'NF==3 {print $1, $2}' | sort -u)
  if [ $verbose = 1 ]; then
    echo "$edges" | awk -v l="$layer" 'NF==3 {k[$1" -> "$2]=k[$1" -> "$2] (k[$1" -> "$2]?",":"") $3}
                                         END {for (e in k) print l ": " e " (" k[e] ")"}' | sort
  fi
  # tsort prints "input contains a loop:" followed by the members of each loop it breaks.
  loops=$(echo "$pairs" | tsort 2>&1 >/dev/null | awk '
      /input contains a loop/ {if (cur != "") print cur; cur = ""; next}
      {sub(/^tsort: /, ""); cur = cur (cur == "" ? "" : " ") $0}
      END {if (cur != "") print cur}')
  n=0
  [ -n "$loops" ] && n=$(echo "$loops" | wc -l)
  strict=0
  for s in $STRICT; do [ "$s" = "$layer" ] && strict=1; done
  if [ "$n" -eq 0 ]; then
    echo "cycles: $layer: 0 ($(echo "$pairs" | grep -c .) module edges)"
    continue
  fi
  while IFS= read -r loop; do
    # the edges of the loop, with their kind, for the report
    via=$(echo "$edges" | awk -v members=" $loop " 'NF==3 && index(members, " "$1" ") && index(members, " "$2" ") {print $1"->"$2"("$3")"}' | sort -u | tr '\n' ' ')
    echo "cycles: $layer: loop: $loop  [$via]"
  done <<<"$loops"
  if [ $strict = 1 ]; then
    echo "cycles: $layer: $n loop(s) (strict layer: fails)" >&2
    bad=1
  else
    echo "cycles: $layer: $n loop(s) (reported only; CYCLES_STRICT=\"$STRICT\")"
  fi
done
exit $bad
