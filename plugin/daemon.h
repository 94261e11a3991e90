/* daemon.h -- the fluxon-bridge daemon core (docs/ARCHITECTURE.md: the message path, threads).
 *
 * Lifecycle (driven by main.c):
 *   fx_daemon_new(cfg)     takes ownership of a validated config; no I/O, no threads.
 *   fx_daemon_check(d)     every refusal of a setting that start makes, without I/O or a
 *                          connection: MQ client (etcd/KV endpoints, credentials, TLS), NATS
 *                          options (credentials, TLS files), leaf URL. main runs it for --check
 *                          and before start, so both refuse the same configs with the same text.
 *   fx_daemon_start(d)     starts everything: NATS connection (retry on failed connect, unlimited
 *                          reconnect), MQ client, HTTP, metrics, capture subscriptions, producer
 *                          threads, ack/admin subscriptions, interest, house-keeping, admin and
 *                          control threads. Returns FX_OK, or an error after which only
 *                          fx_daemon_free() may be called (main exits 1).
 *   fx_daemon_request_reload(d)  SIGHUP: reload the config file on the control thread; added
 *                          channels start, removed (or changed) ones drain; an invalid file is
 *                          logged and ignored. Non-channel fields are not reloaded (WRN).
 *   fx_daemon_request_stop(d)    SIGTERM/SIGINT: drain on the control thread (stop interest,
 *                          drain capture subscriptions, release claims, flush producer queues and
 *                          answer every pending publish, close producers, close the MQ client).
 *   fx_daemon_done_fd(d)   an fd that becomes readable when the daemon has finished (drain
 *                          complete or fatal error); then fx_daemon_exit_code() is 0 or 1.
 *   fx_daemon_free(d)      after done (or after a failed start).
 *
 * Threads (all created after main blocked SIGINT/SIGTERM/SIGHUP):
 *   cnats: reader, flusher, timers and a global delivery pool of FX_DM_DELIVERY_THREADS; NATS
 *          callbacks only copy and enqueue (never etcd).
 *   producer (one per channel, DLQ channels included, capture.c): capture queue -> batches
 *          (what queued, <= 1024 msgs / 1 MiB, <= queued / ready streams with many) -> the
 *          channel's producer (bridge/chanq_prod.h fx_chanq_submit: up to FX_DM_INFLIGHT
 *          batches in flight as put jobs of the executor, bridge/executor.h; one batch at a
 *          time on the producer thread itself) -> completions in order per stream: PubAck
 *          replies, dead-letter completion hooks (pqueue.h).
 *   executor (bridge/executor.h, docs/EXECUTOR.md; one per daemon, created at start, freed
 *          last): a claim has no thread of its own, it is a strand of the executor's "claim"
 *          kind, which runs its steps one at a time (fx_chanq_cons_get -> delivery engine ->
 *          publish; acks, redelivery, dead letters); a step never blocks on etcd. A claim owns
 *          its channel consumer (bridge/chanq_cons.h), whose opens, inheritances and closes run
 *          as "chanq" jobs and whose attempt-record writes as "write" strands.
 *   keeper (bridge/chanq_keeper.h, one per MQ client, owned by the daemon): a thread for the
 *          channels' views (backlog, departed consumers' backlog, reclaim of idle parts) and the
 *          release watch; its consumers' jobs run on the executor.
 *   interest (one): polls /subsz, opens and releases claims.
 *   house-keeping (one): etcd status probe (health), backlog/claims/etcd/lease metrics (the
 *          backlog gauges from the keeper's views).
 *   admin (one): answers $FLUXON.API.* requests (etcd reads).
 *   jsapi (one): answers the JetStream API subset (jsapi.h: $JS.API.* or $JS.<domain>.API.*).
 *   control (one): reload and drain, so main keeps handling signals.
 *   leaf I/O (one, with nats.leaf_url), HTTP (libmicrohttpd and a reaper), and the MQ client's
 *   own (LeaseManager, etcd watches, commit pool, revoker): docs/ARCHITECTURE.md "Threads".
 *
 * Thread rules: every function here is called from the main thread only.
 */
#ifndef FX_PLUGIN_DAEMON_H
#define FX_PLUGIN_DAEMON_H

#include "config.h"
#include "fx_err.h"

#define FX_BRIDGE_VERSION "0.1.0"

typedef struct fx_daemon fx_daemon;

/* Takes ownership of *cfg (the struct content is moved; *cfg is zeroed). cfg_path is copied
 * (used by reload). */
fx_err fx_daemon_new(fx_config *cfg, const char *cfg_path, fx_daemon **out);
fx_err fx_daemon_check(fx_daemon *d);
fx_err fx_daemon_start(fx_daemon *d);
void fx_daemon_request_reload(fx_daemon *d);
void fx_daemon_request_stop(fx_daemon *d);
int fx_daemon_done_fd(const fx_daemon *d);
int fx_daemon_exit_code(const fx_daemon *d);
void fx_daemon_free(fx_daemon *d);

#endif
