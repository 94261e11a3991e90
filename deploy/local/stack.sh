#!/usr/bin/env bash
# Local stack for development and `make run`: one etcd and one nats-server (monitoring on),
# on loopback, data under $FX_STACK_DIR (default .stack/ in the project).
#   deploy/local/stack.sh start | stop | status | env
# `start` prints shell assignments (FX_ETCD_ENDPOINT, FX_NATS_URL, FX_NATS_MONITOR) also written
# to $FX_STACK_DIR/env. Ports: FX_ETCD_PORT (default 23790), FX_NATS_PORT (24222),
# FX_NATS_MONITOR_PORT (28222); the etcd peer port is FX_ETCD_PORT+1.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${FX_STACK_DIR:-$PWD/.stack}
ETCD_PORT=${FX_ETCD_PORT:-23790}
NATS_PORT=${FX_NATS_PORT:-24222}
MON_PORT=${FX_NATS_MONITOR_PORT:-28222}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_http() { # url, seconds
  local url=$1 deadline=$((SECONDS + $2))
  until curl -fsS -m 1 "$url" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1   # polling interval of a bounded wait
  done
}

start() {
  mkdir -p "$DIR"
  if ! pid_alive "$DIR/etcd.pid"; then
    etcd --name=local --data-dir="$DIR/etcd" \
      --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
      --listen-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" \
      --initial-cluster="local=http://127.0.0.1:$((ETCD_PORT + 1))" \
      --logger=zap --log-level=warn >"$DIR/etcd.log" 2>&1 &
    echo $! >"$DIR/etcd.pid"
  fi
  if ! pid_alive "$DIR/nats.pid"; then
    nats-server -a 127.0.0.1 -p "$NATS_PORT" -m "$MON_PORT" -l "$DIR/nats.log" &
    echo $! >"$DIR/nats.pid"
  fi
  wait_http "http://127.0.0.1:$ETCD_PORT/health" 20 || { echo "etcd did not start; see $DIR/etcd.log" >&2; stop; exit 1; }
  wait_http "http://127.0.0.1:$MON_PORT/healthz" 20 || { echo "nats-server did not start; see $DIR/nats.log" >&2; stop; exit 1; }
  env_out | tee "$DIR/env"
}

env_out() {
  echo "FX_ETCD_ENDPOINT=http://127.0.0.1:$ETCD_PORT"
  echo "FX_NATS_URL=nats://127.0.0.1:$NATS_PORT"
  echo "FX_NATS_MONITOR=http://127.0.0.1:$MON_PORT"
}

stop() {
  for s in nats etcd; do
    if pid_alive "$DIR/$s.pid"; then
      pid=$(cat "$DIR/$s.pid"); kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/$s.pid"
  done
}

status() {
  for s in etcd nats; do
    if pid_alive "$DIR/$s.pid"; then echo "$s: running (pid $(cat "$DIR/$s.pid"))"; else echo "$s: stopped"; fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) env_out ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
