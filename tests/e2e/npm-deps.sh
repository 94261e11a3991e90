#!/usr/bin/env bash
# The npm clients of the end-to-end suite and the chaos checker (tests/e2e/package-lock.json):
# `npm ci` only when node_modules is missing or the lock changed since the last install.
set -euo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.fluxon-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -d node_modules/nats ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  npm ci --no-audit --no-fund >&2
  echo "$want" >"$stamp"
fi
