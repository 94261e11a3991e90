#!/usr/bin/env bash
# `make run`: start the local stack and run fluxon-bridge in the foreground against it.
# Ctrl-C stops the bridge and the stack.
set -euo pipefail
cd "$(dirname "$0")/../.."
trap 'deploy/local/stack.sh stop' EXIT
deploy/local/stack.sh start
if [ -x build/fluxon-bridge ]; then
  exec_cfg=deploy/local/bridge.json
  echo "running: build/fluxon-bridge -c $exec_cfg"
  build/fluxon-bridge -c "$exec_cfg"
else
  cat <<TXT

The local stack is up (etcd and nats-server above). The fluxon-bridge daemon is not built yet:
it arrives with the NATS plugin (issue 4). What exists today is the lease/ layer (etcd client,
KV payload store, LeaseManager) and its tests (make test) and benchmark (make bench).
Try the stack meanwhile:
  etcdctl --endpoints=http://127.0.0.1:${FX_ETCD_PORT:-23790} put hello world
  curl -s http://127.0.0.1:${FX_NATS_MONITOR_PORT:-28222}/varz | head

Press Ctrl-C to stop the stack.
TXT
  while :; do sleep 3600; done
fi
