#!/usr/bin/env bash
# `make run`: start the local stack and run fluxon-bridge in the foreground against it.
# Ctrl-C stops the bridge and the stack.
set -euo pipefail
cd "$(dirname "$0")/../.."
NATS_PORT=${FX_NATS_PORT:-24222}
ETCD_PORT=${FX_ETCD_PORT:-23790}
MON_PORT=${FX_NATS_MONITOR_PORT:-28222}
LEAF_PORT=${FX_NATS_LEAF_PORT:-24223}
REDIS_PORT=${FX_REDIS_PORT:-26379}
CFG=deploy/local/bridge.json
HTTP=http://127.0.0.1:28080 # http.listen of $CFG

# The bridge runs in the foreground, so Ctrl-C reaches it directly (it drains and exits; a second
# Ctrl-C exits at once); the EXIT trap then stops the stack.
trap 'deploy/local/stack.sh stop' EXIT

deploy/local/stack.sh start

if [ -x build/fluxon-bridge ]; then
  if [ "$NATS_PORT" != 24222 ] || [ "$ETCD_PORT" != 23790 ] || [ "$MON_PORT" != 28222 ] ||
     [ "$LEAF_PORT" != 24223 ] || [ "$REDIS_PORT" != 26379 ]; then
    echo "note: $CFG expects the default ports (NATS 24222, monitor 28222, leafnode 24223, etcd 23790, redis 26379)" >&2
  fi
  S="--server nats://127.0.0.1:$NATS_PORT"
  cat <<TXT

The local stack is up. fluxon-bridge runs below in the foreground ($CFG); Ctrl-C stops it and the
stack. In another terminal, try:

  build/fluxonctl $S sub q.orders.alice --ack          # a consumer claim named "alice"
  build/fluxonctl $S pub orders.eu.new 'hello' --ack   # capture + PubAck {"stream":"orders",...}
  build/fluxonctl $S pub orders.us.new 'hi' -H Trace-Id:42 --count 5
  build/fluxonctl $S channels                          # channels and their backlog
  build/fluxonctl $S info orders                       # sub-MPSCs, claims, members, offsets
  curl -s $HTTP/healthz
  curl -s $HTTP/metrics

TXT
  echo "running: build/fluxon-bridge -c $CFG"
  set +e
  build/fluxon-bridge -c "$CFG"
  rc=$?
  set -e
  echo "fluxon-bridge exited with status $rc"
  exit "$rc"
else
  cat <<TXT

The local stack is up (etcd, nats-server and redis-server above), but build/fluxon-bridge is not built
(run make first). Meanwhile, try the stack:
  etcdctl --endpoints=http://127.0.0.1:$ETCD_PORT put hello world
  curl -s http://127.0.0.1:$MON_PORT/varz | head

Press Ctrl-C to stop the stack.
TXT
  while :; do sleep 3600; done
fi
