#!/usr/bin/env bash
# make_install_layout: `make install` into a temporary DESTDIR puts the binaries, the systemd
# units, the docs, the example configs and a default config where deploy/README.md says, with
# the modes it says; the installed units name the installed binary and config; the installed
# binary accepts the installed config (--check); a second install keeps an edited config;
# PREFIX moves the binaries and the unit paths with them.
# make_install_units_verify: `systemd-analyze verify` reports nothing for the installed units.
# Without systemd-analyze (Debian package systemd, which scripts/install-deps.sh installs) it is
# reported as "[  SKIPPED ]" with the reason, never as passed.
# Prints cmocka-style lines (counted by tests/run.sh). Environment: BUILD (build dir with
# fluxon-bridge and fluxonctl, default build), FXT_TMPDIR (temp root).
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ROOT=$(mktemp -d "${FXT_TMPDIR:-/tmp}/install.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
errors=0
verrors=0
err() { echo "make_install_layout: $*" >&2; errors=$((errors + 1)); }
verr() { echo "make_install_units_verify: $*" >&2; verrors=$((verrors + 1)); }
verify_skip=""

echo "[==========] Running 2 test(s)."
echo "[ RUN      ] make_install_layout"

# mode_is PATH MODE
mode_is() {
  local m
  if [ ! -e "$1" ]; then err "missing: ${1#"$ROOT"/d}"; return; fi
  m=$(stat -c %a "$1")
  [ "$m" = "$2" ] || err "${1#"$ROOT"/d}: mode $m, want $2"
}

# Install the binaries this suite built as they are: -o keeps make from rebuilding them here (with
# other flags than the build's, e.g. without the sanitizers of `make check`).
inst() { make --no-print-directory BUILD="$BUILD" -o "$BUILD/fluxon-bridge" -o "$BUILD/fluxonctl" "$@" install; }
D=$ROOT/d
if ! inst DESTDIR="$D" >"$ROOT/install.log" 2>&1; then
  tail -n 20 "$ROOT/install.log" >&2
  err "make install failed"
else
  P=$D/usr/local
  mode_is "$P/bin/fluxon-bridge" 755
  mode_is "$P/bin/fluxonctl" 755
  mode_is "$P/lib/systemd/system/fluxon-bridge.service" 644
  mode_is "$P/lib/systemd/system/fluxon-bridge@.service" 644
  mode_is "$P/share/doc/fluxon/README.md" 644
  mode_is "$P/share/doc/fluxon/ARCHITECTURE.md" 644
  mode_is "$P/share/doc/fluxon/EXECUTOR.md" 644
  mode_is "$P/share/doc/fluxon/DEPLOY.md" 644
  for f in bridge-single.json bridge-a.json bridge-b.json bridge-redis.json nats-server.conf; do
    mode_is "$P/share/doc/fluxon/examples/$f" 644
  done
  mode_is "$D/etc/fluxon" 750
  mode_is "$D/etc/fluxon/bridge.json" 640
  cmp -s deploy/bridge-single.json "$D/etc/fluxon/bridge.json" || err "etc/fluxon/bridge.json is not deploy/bridge-single.json"

  # Every absolute path a unit runs or reads that belongs to us is installed.
  for u in "$P"/lib/systemd/system/*.service; do
    for path in $(grep -v '^#' "$u" | sed 's|file://||g' | grep -oE '/(usr|etc|opt)/[^ ]*fluxon[^ ]*' | sort -u); do
      case "$path" in
        */%i.json) ;; # an instance's config is written by the operator
        *) [ -e "$D$path" ] || err "$(basename "$u") names $path, not installed" ;;
      esac
    done
    grep -q "^ExecStart=/usr/local/bin/fluxon-bridge " "$u" || err "$(basename "$u"): ExecStart is not /usr/local/bin/fluxon-bridge"
  done

  # The installed binary accepts the installed config.
  out=$("$P/bin/fluxon-bridge" --check -c "$D/etc/fluxon/bridge.json" 2>&1) ||
    err "fluxon-bridge --check of the installed config: $out"

  # systemd-analyze verify on the installed units, the binary path pointed into DESTDIR (the
  # second test; run here, while the first install is in place).
  if command -v systemd-analyze >/dev/null; then
    V=$ROOT/verify
    mkdir -p "$V"
    sed "s|/usr/local/bin/fluxon-bridge|$P/bin/fluxon-bridge|g" "$P/lib/systemd/system/fluxon-bridge.service" >"$V/fluxon-bridge.service"
    sed "s|/usr/local/bin/fluxon-bridge|$P/bin/fluxon-bridge|g" "$P/lib/systemd/system/fluxon-bridge@.service" >"$V/fluxon-bridge@bridge-a.service"
    for u in "$V"/*.service; do
      out=$(cd / && timeout 60 systemd-analyze verify --man=no "$u" 2>&1)
      rc=$?
      { [ $rc -eq 0 ] && [ -z "$out" ]; } || verr "systemd-analyze verify $(basename "$u"): exit $rc: $out"
    done
  else
    verify_skip="systemd-analyze not installed (Debian package systemd; scripts/install-deps.sh installs it)"
  fi

  # A second install keeps an edited config.
  echo '{"edited": true}' >"$D/etc/fluxon/bridge.json"
  inst DESTDIR="$D" >"$ROOT/install2.log" 2>&1 || err "second make install failed"
  grep -q edited "$D/etc/fluxon/bridge.json" || err "a second make install overwrote etc/fluxon/bridge.json"

  # PREFIX moves the binaries and the units follow.
  D2=$ROOT/d2
  if inst DESTDIR="$D2" PREFIX=/opt/fluxon >"$ROOT/install3.log" 2>&1; then
    [ -x "$D2/opt/fluxon/bin/fluxon-bridge" ] || err "PREFIX=/opt/fluxon: no bin/fluxon-bridge"
    grep -q "^ExecStart=/opt/fluxon/bin/fluxon-bridge " "$D2/opt/fluxon/lib/systemd/system/fluxon-bridge.service" ||
      err "PREFIX=/opt/fluxon: the unit does not run /opt/fluxon/bin/fluxon-bridge"
  else
    err "make install PREFIX=/opt/fluxon failed"
  fi
fi

failed=()
if [ $errors -eq 0 ]; then
  echo "[       OK ] make_install_layout"
else
  echo "[  FAILED  ] make_install_layout"
  failed+=(make_install_layout)
fi
echo "[ RUN      ] make_install_units_verify"
if [ $errors -ne 0 ] && [ ! -d "${P:-/nonexistent}/lib/systemd/system" ]; then
  verr "no installed units to verify (make install failed)"
fi
if [ -n "$verify_skip" ] && [ $verrors -eq 0 ]; then
  echo "make_install_units_verify: skipped: $verify_skip"
  echo "[  SKIPPED ] make_install_units_verify"
elif [ $verrors -eq 0 ]; then
  echo "[       OK ] make_install_units_verify"
else
  echo "[  FAILED  ] make_install_units_verify"
  failed+=(make_install_units_verify)
fi
echo "[==========] 2 test(s) run."
if [ ${#failed[@]} -eq 0 ]; then
  echo "[  PASSED  ] $(( ${#verify_skip} ? 1 : 2 )) test(s)."
  exit 0
fi
echo "[  FAILED  ] ${#failed[@]} test(s), listed below:"
for n in "${failed[@]}"; do echo "[  FAILED  ] $n"; done
exit 1
