/* fxt.h -- test harness: real etcd (and later nats-server) processes on free loopback ports.
 *
 * Every process started here:
 *  - runs with a temporary data dir under $FXT_TMPDIR (set by tests/run.sh; else /tmp), removed by
 *    fxt_etcd_destroy();
 *  - gets PR_SET_PDEATHSIG=SIGKILL, so it dies with the test process even on a crash;
 *  - writes its pid to <dir>.pid, so tests/run.sh can kill leftovers after an interrupted run.
 * Waits poll with a deadline (no fixed sleeps), stretched by the slow-build factor (FXT_SLOW,
 * fxt_slow.h). Ports are picked below the kernel's ephemeral range (no outgoing connection can
 * take one between the pick and the bind); a start that fails is retried on fresh ports, a
 * restart whose log says "address already in use" is retried on the same ports after a pause.
 * Functions return 0 on success, -1 on failure (with a message on stderr). Not thread-safe:
 * call from the test's main thread.
 */
#ifndef FXT_H
#define FXT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "tests/support/fxt_slow.h" /* fxt_slow(), FXT_MS(): the slow-build factor for time bounds */

typedef struct fxt_etcd {
    pid_t pid;         /* 0 when not running */
    int client_port;
    int peer_port;
    char dir[512];      /* data dir (kept across stop/restart) */
    char endpoint[64];  /* "http://127.0.0.1:<client_port>" */
    char log_path[600];
    char extra_args[256]; /* optional extra etcd flags, space separated, set before start */
} fxt_etcd;

/* Start a fresh etcd on free ports and wait until /health says true (deadline 20 s). */
int fxt_etcd_start(fxt_etcd *e);
/* Stop (SIGTERM, then SIGKILL after 5 s); keeps the data dir and ports. */
int fxt_etcd_stop(fxt_etcd *e);
/* Start again with the same data dir and ports; wait healthy. */
int fxt_etcd_restart(fxt_etcd *e);
/* SIGSTOP / SIGCONT: etcd keeps accepting TCP connections but answers nothing while stopped. */
int fxt_etcd_pause(fxt_etcd *e);
int fxt_etcd_resume(fxt_etcd *e);
/* Stop if running and remove the data dir. Safe to call twice. */
void fxt_etcd_destroy(fxt_etcd *e);

/* A nats-server with a generated config: client port, monitoring port and, when `leafnodes`
 * is set before start, a leafnode listener; `extra_conf` lines are appended to the config. */
typedef struct fxt_nats {
    pid_t pid;          /* 0 when not running */
    int port, mport, lport;
    char url[64];       /* "nats://127.0.0.1:<port>" */
    char monitor_url[64];
    char leaf_url[64];  /* "nats://127.0.0.1:<lport>" when leafnodes */
    char conf[512], log_path[512], pidfile[512];
    bool leafnodes;            /* set before start */
    char extra_conf[256];      /* set before start */
} fxt_nats;

/* Start on free ports and wait until /healthz answers ok (deadline 20 s). */
int fxt_nats_start(fxt_nats *n);
/* Stop (SIGTERM, then SIGKILL after 5 s); keeps ports and config. */
int fxt_nats_stop(fxt_nats *n);
/* Start again with the same config and ports; wait healthy. */
int fxt_nats_restart(fxt_nats *n);
/* SIGSTOP / SIGCONT (connections stay open, nothing is answered while stopped). */
int fxt_nats_pause(fxt_nats *n);
int fxt_nats_resume(fxt_nats *n);
/* Stop if running and remove config, log and pidfile. Safe to call twice. */
void fxt_nats_destroy(fxt_nats *n);

/* A redis-server on a free loopback port with a temp dir (AOF file and log live there). Set
 * `appendfsync` ("always", "everysec", "no"; "" = no AOF) before start. */
typedef struct fxt_redis {
    pid_t pid;          /* 0 when not running */
    int port;
    char dir[512];      /* working dir (AOF), kept across stop/restart */
    char url[64];       /* "redis://127.0.0.1:<port>" */
    char log_path[600], pidfile[600];
    char appendfsync[16]; /* set before start */
} fxt_redis;

/* Start on a free port and wait until PING answers PONG (deadline 20 s). */
int fxt_redis_start(fxt_redis *r);
/* SIGKILL (no shutdown save): what a crash looks like. Keeps dir and port. */
int fxt_redis_kill(fxt_redis *r);
/* Start again with the same dir and port (reloads its AOF); wait for PONG. */
int fxt_redis_restart(fxt_redis *r);
/* Kill if running and remove the dir. Safe to call twice. */
void fxt_redis_destroy(fxt_redis *r);

/* A TCP port on 127.0.0.1 with nothing listening (connections are refused). */
int fxt_dead_port(void);
/* A listening socket that never accepts and never answers: connects succeed (kernel backlog),
 * requests get no reply. Returns the fd (close it when done) and sets *port. */
int fxt_blackhole_listen(int *port);

/* Poll `cond(arg)` every 20 ms until it returns true or timeout_ms (times the slow-build factor)
 * passes. Returns cond's last value. Use this instead of sleeps. */
bool fxt_wait_until(bool (*cond)(void *arg), void *arg, int timeout_ms);

/* Milliseconds on the monotonic clock. */
int64_t fxt_now_ms(void);

#endif
