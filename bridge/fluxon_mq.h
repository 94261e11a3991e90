/* fluxon_mq.h -- Fluxon MQ in C: the whole API the daemon (plugin/) uses.
 *
 * Objects (Fluxon MQ's lifecycle-and-lease design; docs/ARCHITECTURE.md):
 *   fx_mq_client      the client root (Fluxon's KvClient): owns the control-plane etcd client,
 *                     the KV payload store and the LeaseManager. Endpoints register with it;
 *                     fx_mq_client_close() closes every endpoint first, then the backends.
 *   fx_mpsc_producer  a producer of one standalone MPSC channel (or of a sub-MPSC of an MPMC,
 *   fx_mpsc_consumer  inside mpmc.c). A consumer of one MPSC.
 *   fx_mpmc_producer  a member of an MPMC channel that produces: rotates (LRU) over the ready
 *                     sub-MPSCs learned by watch, falling back to the first unready one.
 *   fx_mpmc_consumer  a member that consumes: claims one sub-MPSC (an unready one first, else
 *                     creates one) and consumes it for its whole life.
 *
 * Delivery guarantee: at-least-once. A consumer's get() hands out messages; ack() marks them;
 * the consume offset advances only over the contiguous acknowledged prefix of each producer, and
 * the committed payloads are deleted in the same step (batched). A consumer that crashes or
 * closes with unacknowledged messages leaves them to the next consumer of that (sub-)MPSC.
 * Per-producer FIFO within one (sub-)MPSC; no order across sub-MPSCs.
 *
 * Leases (every handle is a real LeaseManager registration; releasing never revokes):
 *   MPSC: member, global, global-long (id allocators, long_lease_ttl_s), payload.
 *   MPMC: metadata, payload, id-allocator cluster lease (every member registers all three, the
 *   creator and every attach alike), plus one member lease per member. Sub-MPSCs reuse the MPMC
 *   metadata lease as global, the member lease as member, the payload lease as payload.
 *   When the member or payload lease of an endpoint expires, the endpoint closes itself: the next
 *   call returns FX_ELEASE_LOST, every later call FX_ECLOSED.
 *
 * Errors: fx_err (lease/fx_err.h). Endpoint calls after close: FX_ECLOSED (or FX_ELEASE_LOST
 * once, see above). Capacity: FX_EFULL when a put cannot place its batch before its deadline.
 *
 * Close (every endpoint): one public close, idempotent (except the retryable failure of an MPSC
 * consumer close, see there), safe to call concurrently and while a
 * put or get is blocked in another thread (that call returns FX_ECLOSED promptly). Local
 * resources are released strictly; owned leased keys get one best-effort delete pass
 * (close_timeout_ms; WARN on failure, the lease TTL removes them). Shared keys (meta, offsets,
 * payloads, counters) are never deleted by close: their leases expire after the last member.
 * close() does not free: fx_*_free() frees (and closes first if needed). free() must not race
 * with any other call on the same endpoint.
 *
 * Thread rules: one fx_mq_client may be shared by any number of threads. An endpoint may be used
 * from several threads; calls of the same kind (two puts, two gets) are serialised internally,
 * except MPMC producer puts, which run at once to distinct sub-MPSCs (fx_mpmc_put).
 * close() may be called from any thread at any time.
 *
 * Callbacks: exactly two hooks run the caller's code, and on threads that are not the caller's:
 *   - a consumer's notify hook (fx_mpmc_consumer_set_notify): on the client's produce-offset
 *     watch thread (new messages), the LeaseManager thread (a lease of the consumer expired) or
 *     the thread of the caller's own get that found the payload plane lost; always with the
 *     consumer's lock held;
 *   - a release watch's fn (fx_mq_release_watch_start): on that watch's own thread, one call at
 *     a time, with no MQ lock held.
 * Both must only wake something up: no MQ call, no blocking. No other call of this API calls
 * the caller back.
 *
 * Threads of the client: the LeaseManager's, the etcd watches' (pwatch.h, the release watch,
 * MPMC producers' ready watches), and the executor's (executor.h, docs/EXECUTOR.md), on which
 * consumer commit rounds (commit_pool.h) and member-lease revoke retries (revoker.h) run: the
 * client's own executor or the one given in fx_mq_client_opts.exec. None of them runs caller
 * code except the two hooks above.
 */
#ifndef FX_FLUXON_MQ_H
#define FX_FLUXON_MQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "executor.h"
#include "fx_err.h"
#include "kv.h"
#include "lease_mgr.h"

/* ---- client root ---------------------------------------------------------------------------- */

typedef struct fx_mq_client fx_mq_client;

typedef struct fx_mq_client_opts {
    fx_etcd_opts etcd;           /* control plane (required) */
    const char *root;            /* key root prefix; NULL -> "/fluxon" */
    /* Payload plane. kv_endpoints NULL/0 -> payloads share the control-plane client (and then a
     * batch's payload write and offset advance go in one txn). */
    const char *const *kv_endpoints;
    size_t n_kv_endpoints;
    const char *kv_prefix;       /* NULL -> root + "/kv/" (also the Redis key prefix) */
    /* Redis payload plane (lease/kv.h fx_kv_new_redis): non-NULL -> payloads live in Redis
     * (kv_endpoints must then be empty); the split write order holds: payload put, then the
     * produce-offset txn. "redis://[user:pass@]host:port[/db]" or "unix:/path[?db=N]". */
    const char *kv_redis_url;
    int kv_redis_pool;           /* Redis data-path connections; 0 -> 4 */
    bool kv_redis_require_fsync; /* Redis write guard: appendonly yes + appendfsync always */
    int kv_redis_min_replicas;   /* Redis: every payload put waits (WAIT) for that many replicas */
    int kv_timeout_ms;           /* deadline of each data-path KV call; 0 -> op_timeout_ms */
    int64_t long_lease_ttl_s;    /* id-allocator leases; 0 -> 1800 (tests shorten it) */
    int64_t min_ttl_s;           /* smallest accepted channel ttl; 0 -> 90. Tests use 2..3. */
    int op_timeout_ms;           /* deadline of each etcd/KV call; 0 -> 5000 */
    int close_timeout_ms;        /* best-effort delete pass on close; 0 -> 1000 */
    /* Payload layout of the channels this client CREATES (readers and writers of an existing
     * channel follow its meta): false (default) = one segment per batch; true = one key per
     * message, the reference layout (kept for interoperability and for the benchmark). */
    bool per_message_keys;
    fx_lease_mgr_opts lease;     /* LeaseManager tuning */
    /* Identity of this client root, written as "external_client_id" into every membership
     * record it creates (producer membership of an MPSC / sub-MPSC, consumer membership), so an
     * operator can tell which process holds a membership. Fluxon MQ writes the KV client's
     * member id; this project has no KV cluster membership, so the client root's own identity is
     * used. NULL -> "<hostname>-<pid>-<16 random hex>" generated once by fx_mq_client_new (stable
     * for the client's life). At most 255 bytes, no control characters. */
    const char *client_id;
    /* Where the client's background work runs (bridge/executor.h; rules: docs/EXECUTOR.md):
     * consumer commit rounds (kind FX_EXEC_K_COMMIT, one strand per consumer) and member-lease
     * revoke retries (FX_EXEC_K_REVOKE). NULL (default): fx_mq_client_new creates its own
     * executor with those two kinds (4 commit threads, 1 revoke thread, started on first use)
     * and fx_mq_client_close frees it with the backends. Non-NULL: borrowed (the process's one
     * executor; both kinds must be registered, else FX_EINVAL); it must outlive
     * fx_mq_client_free, and is not stopped by the client. */
    fx_exec *exec;
} fx_mq_client_opts;

/* Create the root: etcd client, KV store, LeaseManager. No I/O beyond what they do lazily. */
fx_err fx_mq_client_new(const fx_mq_client_opts *opts, fx_mq_client **out);
/* Close every registered endpoint (as its own close would), then stop the LeaseManager and the
 * backends. Idempotent. Returns the first endpoint close error (closing continues past it).
 * Strong errors (Fluxon MQ's rule): when an endpoint's close fails strongly (today: a standalone
 * MPSC consumer whose acknowledged messages could not be committed, see fx_mpsc_consumer_close)
 * the client close returns that error and keeps the backends and that endpoint; the next client
 * close retries it and tears the backends down once it succeeds. fx_mq_client_free forces such
 * closes to finish (the uncommitted messages are then delivered again). Local teardown steps
 * (watch stop, thread join, lease-handle release) cannot fail; leased-key deletes stay
 * best-effort (TTL fallback) and are never strong errors. */
fx_err fx_mq_client_close(fx_mq_client *c);
/* Close if needed (forcing a strong failure to finish) and free. Endpoints still open are
 * closed, never freed: their owners free them, before this call. */
void fx_mq_client_free(fx_mq_client *c);

/* Borrowed accessors (valid until fx_mq_client_free). */
fx_etcd *fx_mq_client_etcd(fx_mq_client *c);
fx_kv_store *fx_mq_client_kv(fx_mq_client *c);
/* The payload plane of a client: "etcd-fused" (payload and offset in one txn on the control-plane
 * client), "etcd-split" (a separate KV etcd), "redis" (split, payloads in Redis). */
const char *fx_mq_client_plane(const fx_mq_client *c);
/* Payload ids found missing below a produce offset by this client's consumers (skipped, each
 * logged once at ERR with the ids): a payload plane that lost data (e.g. Redis without fsync). */
uint64_t fx_mq_client_payload_missing(const fx_mq_client *c);
/* Payload planes found lost by this client's consumers: a consumer's read found its channel's
 * whole payload lease gone (Redis: the lease's set expired, was evicted or deleted). The consumer
 * stopped (FX_ELEASE_LOST, nothing committed past the gap) with an ERR line. */
uint64_t fx_mq_client_plane_lost(const fx_mq_client *c);
fx_lease_mgr *fx_mq_client_leases(fx_mq_client *c);
/* The executor the client runs its background work on: opts.exec, or its own (then NULL once
 * fx_mq_client_close has freed it with the backends). */
fx_exec *fx_mq_client_exec(fx_mq_client *c);
const char *fx_mq_client_root(const fx_mq_client *c);
/* The client identity written as external_client_id (opts.client_id or the generated one). */
const char *fx_mq_client_id(const fx_mq_client *c);

/* ---- channel configuration -------------------------------------------------------------------- */

typedef struct fx_mq_chan_cfg {
    int64_t capacity; /* >= 1: max stored, unconsumed messages per (sub-)MPSC */
    /* >= client min_ttl_s. MPMC: TTL of member leases (membership, role and ready keys: how fast
     * a dead member's claims are released). Standalone MPSC: TTL of every lease but global-long. */
    int64_t ttl_s;
    /* MPMC only: TTL of the channel's data leases (metadata, payload, id-allocator cluster lease
     * and the sub-MPSCs' global-long leases), i.e. how long the channel and its messages outlive
     * its last member. 0 -> ttl_s. Must be >= ttl_s and <= FX_MQ_MAX_TTL_SECONDS. */
    int64_t retention_s;
    int64_t weight;   /* producer weight written to producer_weight; 0 -> 1 */
} fx_mq_chan_cfg;

/* ---- messages --------------------------------------------------------------------------------- */

/* Identity of one stored message: (sub-)MPSC chan id, producer idx, message id. */
typedef struct fx_mq_msg_id {
    int64_t chan;
    int64_t pidx;
    int64_t msg;
} fx_mq_msg_id;

/* A message handed out by get(): owned by the caller, freed with fx_mq_delivery_free(). */
typedef struct fx_mq_delivery {
    fx_mq_msg_id id;
    fx_bytes value; /* the stored value (a FlatDict, bridge/flatdict.h) */
} fx_mq_delivery;
void fx_mq_delivery_free(fx_mq_delivery *d);

/* ---- standalone MPSC -------------------------------------------------------------------------- */

typedef struct fx_mpsc_producer fx_mpsc_producer;
typedef struct fx_mpsc_consumer fx_mpsc_consumer;

/* create_mpsc_channel: allocate a new chan id (never reused: unleased counter), its leases and
 * meta. *out_chan is the new id. The creator keeps no endpoint: open producers/consumers on it. */
fx_err fx_mpsc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, int64_t *out_chan);

/* new_with_chan_id: bind to an existing channel (meta must exist and be valid). weight may be 0. */
fx_err fx_mpsc_producer_open(fx_mq_client *c, int64_t chan, int64_t weight,
                             fx_mpsc_producer **out);
fx_err fx_mpsc_consumer_open(fx_mq_client *c, int64_t chan, fx_mpsc_consumer **out);

/* Put a batch of values (each becomes one message, in order). Waits for capacity until
 * timeout_ms (FX_EFULL after). Returns FX_OK when all n were stored; otherwise the error of the
 * first value not stored, with *n_put (may be NULL) the count stored before it (a partial batch
 * is returned, never dropped). ids (may be NULL) receives the ids of the stored values.
 * Values are borrowed for the call. No id gaps: ids are consumed only by stored messages. */
fx_err fx_mpsc_put(fx_mpsc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                   size_t *n_put, fx_mq_msg_id *ids);
fx_err fx_mpsc_producer_close(fx_mpsc_producer *p);
void fx_mpsc_producer_free(fx_mpsc_producer *p);
int64_t fx_mpsc_producer_idx(const fx_mpsc_producer *p);

/* Get up to max messages (FIFO per producer, round robin across producers). Waits up to
 * timeout_ms for the first one; returns FX_OK with *n >= 1, or FX_ETIMEDOUT with *n == 0.
 * Messages stay unacknowledged until ack; a message handed out is not handed out again by this
 * consumer. out[] entries are owned by the caller on FX_OK. */
fx_err fx_mpsc_get(fx_mpsc_consumer *c, fx_mq_delivery *out, size_t max, size_t *n,
                   int timeout_ms);
/* Acknowledge messages handed out by get. Commits (offset advance + payload delete) are batched
 * and happen asynchronously, in order. FX_EINVAL for an id that was never handed out. */
fx_err fx_mpsc_ack(fx_mpsc_consumer *c, const fx_mq_msg_id *ids, size_t n);
/* Wait until every ack given so far is committed to etcd (or timeout). */
fx_err fx_mpsc_flush(fx_mpsc_consumer *c, int timeout_ms);
/* Close: stops the read path and makes one final bounded commit of the acknowledged messages.
 * If acknowledged messages are still uncommitted after it (etcd unreachable; not after a lost
 * lease), the close fails strongly: it returns that error (FX_ETIMEDOUT, FX_EUNAVAIL...), the
 * consumer stays bound (membership, leases, acks kept; get/ack return FX_ECLOSED) and the next
 * close retries the commit. free() finishes it in any case. */
fx_err fx_mpsc_consumer_close(fx_mpsc_consumer *c);
void fx_mpsc_consumer_free(fx_mpsc_consumer *c);

/* ---- MPMC ------------------------------------------------------------------------------------- */

typedef struct fx_mpmc_producer fx_mpmc_producer;
typedef struct fx_mpmc_consumer fx_mpmc_consumer;

/* Map a channel name to its MPMC id: create the MPMC if the unique key is absent (create-if-
 * absent txn), else return the existing id. A mapping is replaced by a new MPMC (CAS on the old
 * value, logged at ERR) only when its channel is provably gone: meta absent (its metadata lease
 * expired: no member for longer than its retention) or payload lease expired (its messages are
 * gone). Any error while checking (timeout, undecodable meta) is returned, never a reason to
 * replace. For an existing channel, cfg is reconciled with its meta:
 *  - ttl_s differs: the meta's ttl_seconds is updated (CAS; member leases granted from then on
 *    use it; INF line);
 *  - retention_s (when > 0) differs from the recorded retention: FX_EINVAL naming `retention`
 *    (data leases cannot change their TTL), unless the retention was recorded by an upgrade;
 *  - no retention recorded (created before retention existed): the meta is upgraded to record
 *    the TTL its data leases really have (retention_legacy) and one INF line says so. */
fx_err fx_mpmc_resolve(fx_mq_client *c, const char *name, const fx_mq_chan_cfg *cfg,
                       int64_t *out_mpmc);

/* Join as a producer / consumer: attach (read and validate meta, register every shared lease),
 * grant the member lease, write the role key. The consumer also claims its sub-MPSC (unready
 * first; else creates one when active consumers outnumber sub-MPSCs; else
 * FX_EEXISTS "not enough active consumers"). weight may be 0. */
fx_err fx_mpmc_producer_open(fx_mq_client *c, int64_t mpmc, int64_t weight,
                             fx_mpmc_producer **out);
fx_err fx_mpmc_consumer_open(fx_mq_client *c, int64_t mpmc, fx_mpmc_consumer **out);

/* As fx_mpsc_put, routed to one sub-MPSC per batch (LRU over ready sub-MPSCs; a full one is
 * skipped; the first unready one when none is ready; the producer creates the first sub-MPSC
 * when there is none). Puts from several threads run at once, each to a sub-MPSC no other put
 * holds (it waits for one when all are taken: see fx_mpmc_put_hold). */
fx_err fx_mpmc_put(fx_mpmc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                   size_t *n_put, fx_mq_msg_id *ids);
/* For several batches in flight at once (one caller thread per batch): store into ONE sub-MPSC
 * that no other put of this producer has reserved, and keep it reserved (no other put routes
 * to it) until fx_mpmc_put_release(p, *held), so the caller can answer its batch before the next
 * batch of that sub-MPSC is stored. *n_put may be < n with FX_OK: the rest did not fit there
 * (call again for it). *held is -1 when nothing was stored (nothing to release); otherwise it
 * must be released, whatever the result. A put finding every candidate reserved waits for one
 * (up to max(timeout_ms, 10 s), then FX_ETIMEDOUT); timeout_ms bounds the wait for room only. */
fx_err fx_mpmc_put_hold(fx_mpmc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                        size_t *n_put, fx_mq_msg_id *ids, int64_t *held);
void fx_mpmc_put_release(fx_mpmc_producer *p, int64_t held);
/* The ready sub-MPSCs (claimed by a consumer) this producer knows of: how many batches can be
 * in flight to distinct sub-MPSCs, and how far a burst can spread. No RPC. */
size_t fx_mpmc_producer_ready(fx_mpmc_producer *p);
fx_err fx_mpmc_producer_close(fx_mpmc_producer *p);
void fx_mpmc_producer_free(fx_mpmc_producer *p);
int64_t fx_mpmc_producer_member(const fx_mpmc_producer *p);
/* No RPC: FX_OK while the producer is open and none of its leases is known to be expired;
 * otherwise what the next put would return (FX_ELEASE_LOST once, then FX_ECLOSED). A keeper
 * (the daemon) calls it periodically to reopen a producer that closed itself. */
fx_err fx_mpmc_producer_check(fx_mpmc_producer *p);

/* Fencing: while the consumer's member lease is not confirmed by etcd (its last confirmation,
 * fx_lease_confirmed_until_ms, is over: etcd unreachable or slow for the lease's whole TTL), get
 * hands out nothing (FX_EUNAVAIL) and fx_mpmc_consumer_fenced() is true: etcd may have expired
 * the lease and another member may be draining the sub-MPSC already. Once the lease manager
 * knows, the lease is renewed (gets go on) or expired (the next call: FX_ELEASE_LOST). */
fx_err fx_mpmc_get(fx_mpmc_consumer *c, fx_mq_delivery *out, size_t max, size_t *n,
                   int timeout_ms);
/* No RPC: true while messages got from c must not be (re)delivered (see fx_mpmc_get). */
bool fx_mpmc_consumer_fenced(fx_mpmc_consumer *c);
fx_err fx_mpmc_ack(fx_mpmc_consumer *c, const fx_mq_msg_id *ids, size_t n);
fx_err fx_mpmc_flush(fx_mpmc_consumer *c, int timeout_ms);
/* Close order: sub-MPSC consumer close (membership delete) -> ready key delete only if the
 * membership delete was confirmed -> role key delete -> release lease handles -> when both
 * deletes were confirmed, the reclaim of its sub-MPSC if no longer needed (fx_mpmc_reclaim). */
fx_err fx_mpmc_consumer_close(fx_mpmc_consumer *c);
void fx_mpmc_consumer_free(fx_mpmc_consumer *c);
int64_t fx_mpmc_consumer_member(const fx_mpmc_consumer *c);
/* The sub-MPSC this consumer owns. */
int64_t fx_mpmc_consumer_chan(const fx_mpmc_consumer *c);
/* Call fn(arg) whenever new messages may be there for this consumer (a produce offset of its
 * sub-MPSC moved) or it faulted, so a caller that polls with fx_mpmc_get(..., 0) can sleep until
 * then. fn runs with internal locks held, on the client's produce-offset watch thread (new
 * messages), the LeaseManager thread (a lease expired) or the thread of a get that found the
 * payload plane lost: it must only wake something up (no MQ call, no blocking). NULL fn: none.
 * It is not called any more once fx_mpmc_consumer_close() has returned. */
void fx_mpmc_consumer_set_notify(fx_mpmc_consumer *c, void (*fn)(void *arg), void *arg);
/* Drain an unready sub-MPSC `chan` that holds messages (left by a consumer that departed): join
 * as a consumer member and bind that sub-MPSC's consumer directly, WITHOUT a ready key, so
 * producers do not route new messages to it while it is drained. The binding itself is the lock
 * (a second consumer is refused): FX_EEXISTS when it is ready (claimed) or another consumer is
 * bound to it, FX_ENOTFOUND when it is not in the MPMC's list. Otherwise a consumer like any
 * other (get/ack/flush/close); its close deletes the membership (no ready key to delete). */
fx_err fx_mpmc_consumer_open_drain(fx_mq_client *c, int64_t mpmc, int64_t chan,
                                   fx_mpmc_consumer **out);

/* Reclaim sub-MPSC `chan` of MPMC `mpmc` when nobody needs it, so sub-MPSCs follow the
 * consumers in use, not the peak: it is removed from the MPMC's list and its keys are deleted
 * in ONE txn, and its global-long lease is revoked, only when it is unready (no ready key), has
 * no consumer membership, holds no backlog (every produce offset below its consume offset), the
 * list keeps more entries than the active consumers need (at least one: store-and-forward), and
 * nothing under it changed since the read (the txn compares the list value, the ready key's
 * absence and mod_revision <= the read revision over every key of the channel). *removed says
 * whether it was. A consumer's close calls it for its own sub-MPSC; protocol and races: mpmc.c.
 * FX_OK with *removed false: kept. Errors: of etcd (nothing or everything was applied). */
fx_err fx_mpmc_reclaim(fx_mq_client *c, int64_t mpmc, int64_t chan, bool *removed);

/* ---- released claims ---------------------------------------------------------------------------- */

/* A watch on the ready keys of every MPMC under the client's root: fn(arg, mpmc) is called (on
 * the watch's own thread, one call at a time; it must not block) whenever one is deleted, i.e. a
 * consumer released its sub-MPSC or its member lease expired, so the caller can let an idle
 * consumer adopt the backlog left there at once instead of at its next poll. The watch survives
 * etcd restarts (lease/etcd.h). start fails when etcd does not answer within timeout_ms. stop
 * must be called before fx_mq_client_close. */
typedef struct fx_mq_release_watch fx_mq_release_watch;
fx_err fx_mq_release_watch_start(fx_mq_client *c, void (*fn)(void *arg, int64_t mpmc), void *arg,
                                 int timeout_ms, fx_mq_release_watch **out);
void fx_mq_release_watch_stop(fx_mq_release_watch *rw);

#endif
