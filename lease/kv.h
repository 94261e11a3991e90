/* kv.h -- the KV payload store the MQ uses for message payloads (docs/ARCHITECTURE.md).
 *
 * The payload plane is a KV store with Fluxon KV's lease semantics. This is its interface, with
 * two shipped backends:
 *  - etcd (fx_kv_new_etcd), keeping payloads under the store's own key prefix, on its own
 *    endpoint list (may be a different etcd cluster than the control plane), with etcd leases as
 *    KV payload leases;
 *  - Redis (fx_kv_new_redis, lease/kv_redis.c, hiredis): one Redis sorted set per lease holds
 *    every key bound to it (member = key NUL value, all scores 0, so ranges are lexicographic);
 *    the set's TTL is the lease, so expiry deletes every key of the lease at once. Keys must not
 *    contain NUL bytes there (FX_EINVAL). See kv_redis.c for the mapping and its costs.
 *
 * Semantics (Fluxon KV's):
 *  - Keys given to the store are relative to its prefix; keys returned are relative too.
 *  - opts->lease_id == 0 means a plain, non-lease put. It never falls back to "the last lease".
 *    A lease-bound key disappears when its lease expires.
 *  - opts->reject_if_inflight_same_key: while another put of the same key *from this store
 *    object* is in flight, the put returns FX_EKEY_BEING_WRITTEN at once (admission control by a
 *    per-key in-flight count; other keys are never blocked). Without it, concurrent puts of one
 *    key are allowed and the last committed wins.
 *  - put_many writes all items atomically (one etcd txn); at most FX_KV_MAX_BATCH items
 *    (FX_ETXN_TOO_MANY_OPS beyond). An item with the reject flag counts as in flight for the
 *    whole batch.
 *  - get of a missing key: FX_ENOTFOUND.
 *  - Every call has a deadline (timeout_ms; 0 = the store's default).
 *
 * Ownership: inputs are borrowed for the call. Outputs are owned by the caller (free with the
 * fx_*_free functions of etcd.h).
 * Thread rules: thread-safe; fx_kv_store_free() once, after all other calls returned.
 */
#ifndef FX_KV_H
#define FX_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"

#define FX_KV_MAX_BATCH 128

typedef struct fx_kv_store fx_kv_store;

typedef struct fx_kv_put_opts {
    int64_t lease_id;                 /* 0: plain put */
    bool reject_if_inflight_same_key; /* FX_EKEY_BEING_WRITTEN if the key is being written */
} fx_kv_put_opts;

typedef struct fx_kv_item {
    fx_slice key;
    fx_slice value;
} fx_kv_item;

/* Backend operations: the interface a KV backend implements. All functions follow the semantics
 * above; `self` is the backend's private state. */
typedef struct fx_kv_ops {
    fx_err (*allocate_lease)(void *self, int64_t ttl_s, int64_t *out_id, int timeout_ms);
    fx_err (*keepalive_lease)(void *self, int64_t id, int64_t *out_ttl, int timeout_ms);
    fx_err (*put_many)(void *self, const fx_kv_item *items, size_t n, const fx_kv_put_opts *o,
                       int timeout_ms);
    fx_err (*get)(void *self, fx_slice key, fx_bytes *out, int timeout_ms);
    fx_err (*get_range)(void *self, fx_slice start, fx_slice end, int64_t limit,
                        fx_range_resp *out, int timeout_ms);
    fx_err (*delete_range)(void *self, fx_slice start, fx_slice end, int64_t *out_deleted,
                           int timeout_ms);
    fx_err (*count_prefix)(void *self, fx_slice prefix, int64_t *out_count, int timeout_ms);
    void (*destroy)(void *self);
    /* Optional (NULL: get_range, the lease unchecked): get_range over the keys bound to lease_id
     * only, FX_ELEASE_EXPIRED when the lease's storage is gone. */
    fx_err (*get_range_lease)(void *self, int64_t lease_id, fx_slice start, fx_slice end,
                              int64_t limit, fx_range_resp *out, int timeout_ms);
} fx_kv_ops;

typedef struct fx_kv_etcd_opts {
    fx_etcd_opts etcd;  /* endpoints etc. of the payload cluster */
    const char *prefix; /* key prefix of the store, e.g. "/fluxon/kv/"; required */
    int default_timeout_ms; /* 0 -> 5000 */
} fx_kv_etcd_opts;

/* Create the etcd-backed store. It owns its own etcd client (its own connections). */
fx_err fx_kv_new_etcd(const fx_kv_etcd_opts *opts, fx_kv_store **out);
/* Create a store over an existing etcd client (borrowed: must outlive the store). Used when the
 * payload plane shares the control plane's endpoints. */
fx_err fx_kv_new_etcd_shared(fx_etcd *client, const char *prefix, int default_timeout_ms,
                             fx_kv_store **out);
void fx_kv_store_free(fx_kv_store *s); /* (named so: etcd.h owns fx_kv_free(fx_kv *)) */

/* Lease backend identity: "kv(etcd(http://a:1,...))". Distinct from the control plane's
 * fx_etcd_uid() even on the same endpoints, as the LeaseManager keys leases by backend. */
const char *fx_kv_backend_uid(const fx_kv_store *s);
/* The store's key prefix (as given). */
const char *fx_kv_prefix(const fx_kv_store *s);
/* The etcd client behind an etcd-backed store (for one-txn payload+offset writes when the
 * planes share endpoints); NULL for other backends. */
fx_etcd *fx_kv_etcd(const fx_kv_store *s);

fx_err fx_kv_allocate_lease(fx_kv_store *s, int64_t ttl_s, int64_t *out_id, int timeout_ms);
/* FX_OK with *out_ttl > 0, or FX_ELEASE_EXPIRED. out_ttl may be NULL. */
fx_err fx_kv_keepalive_lease(fx_kv_store *s, int64_t id, int64_t *out_ttl, int timeout_ms);
/* opts may be NULL (plain put). A lease put on an expired lease -> FX_ELEASE_EXPIRED. */
fx_err fx_kv_put(fx_kv_store *s, fx_slice key, fx_slice value, const fx_kv_put_opts *opts,
                 int timeout_ms);
fx_err fx_kv_put_many(fx_kv_store *s, const fx_kv_item *items, size_t n,
                      const fx_kv_put_opts *opts, int timeout_ms);
fx_err fx_kv_get(fx_kv_store *s, fx_slice key, fx_bytes *out, int timeout_ms);
/* Keys in [start, end) (end len 0: keys with prefix `start`), ascending, at most limit (0: all);
 * keys in out are relative to the store prefix. */
fx_err fx_kv_get_range(fx_kv_store *s, fx_slice start, fx_slice end, int64_t limit,
                       fx_range_resp *out, int timeout_ms);
/* get_range over the keys bound to lease_id (every key of the range must have been put with it).
 * Redis: reads only that lease's sorted set (one key, not every live lease) and answers
 * FX_ELEASE_EXPIRED when the set is gone (expired, evicted, deleted by hand): a reader can tell
 * "this key is missing" from "every key of the lease is gone". etcd: exactly get_range (etcd
 * deletes a lease's keys only with the lease, which its keepalive reports). */
fx_err fx_kv_get_range_lease(fx_kv_store *s, int64_t lease_id, fx_slice start, fx_slice end,
                             int64_t limit, fx_range_resp *out, int timeout_ms);
fx_err fx_kv_delete(fx_kv_store *s, fx_slice key, int timeout_ms);
/* Delete [start, end) (end len 0: every key with prefix `start`). out_deleted may be NULL. */
fx_err fx_kv_delete_range(fx_kv_store *s, fx_slice start, fx_slice end, int64_t *out_deleted,
                          int timeout_ms);
fx_err fx_kv_count_prefix(fx_kv_store *s, fx_slice prefix, int64_t *out_count, int timeout_ms);

/* ---- Redis backend (lease/kv_redis.c) -------------------------------------------------------- */

typedef struct fx_kv_redis_opts {
    /* "redis://[user:pass@]host:port[/db]" or "unix:/path/to.sock[?db=N]" (no TLS: Debian 12's
     * hiredis 0.14 has no TLS support). Credentials are never logged nor part of the uid. */
    const char *url;
    const char *prefix;      /* Redis key prefix of the store, e.g. "fluxon/kv/"; required */
    int default_timeout_ms;  /* per-call deadline; 0 -> 5000 */
    int connect_timeout_ms;  /* 0 -> min(2000, the call's deadline) */
    int pool_size;           /* data-path connections, 0 -> 4 (max 32); keepalives have their own */
    /* The write guard (kv_redis.c "Write guard"): writes (puts, lease grants) are refused with
     * FX_EUNAVAIL while Redis may drop acknowledged payloads: a maxmemory-policy other than
     * noeviction (always checked), or, with require_fsync, anything but appendonly yes +
     * appendfsync always. Checked on every connection after it is dialled and again before a
     * write once the last check is recheck_ms old. */
    bool require_fsync;
    int min_replicas;        /* > 0: every put then waits (WAIT) for that many replicas, else fails
                              * with FX_EUNAVAIL (0..16) */
    int recheck_ms;          /* 0 -> FX_KV_REDIS_RECHECK_MS */
} fx_kv_redis_opts;

#define FX_KV_REDIS_RECHECK_MS 2000
#define FX_KV_REDIS_MAX_REPLICAS 16

/* Create the Redis-backed store. Connects lazily (the first call connects; a broken connection
 * is dropped and re-dialled by the next call), so it succeeds while Redis is down; FX_EINVAL on
 * a malformed url. Errors of calls: FX_EUNAVAIL (cannot connect / connection lost),
 * FX_ETIMEDOUT (deadline), FX_EAUTH, FX_ENOSPACE (Redis OOM: maxmemory reached; puts and grants
 * are refused before they write), FX_ESERVER (other Redis errors), FX_ELEASE_EXPIRED (put or
 * keepalive on a gone lease). Writes refused by the write guard and puts whose WAIT fell short
 * of min_replicas: FX_EUNAVAIL, with the reason in fx_err_detail(). */
fx_err fx_kv_new_redis(const fx_kv_redis_opts *opts, fx_kv_store **out);
/* True for a Redis-backed store. */
bool fx_kv_is_redis(const fx_kv_store *s);

/* Redis persistence as read from INFO persistence and CONFIG GET appendfsync. */
typedef struct fx_kv_redis_persistence {
    bool aof_enabled;      /* aof_enabled:1 */
    char appendfsync[16];  /* "always", "everysec", "no" ("" when CONFIG GET is refused) */
    bool rdb_enabled;      /* CONFIG GET save is non-empty */
} fx_kv_redis_persistence;
fx_err fx_kv_redis_read_persistence(fx_kv_store *s, fx_kv_redis_persistence *out, int timeout_ms);

/* Run the write guard's check now (on its own connection): FX_OK when it holds; FX_EINVAL when it
 * does not, with why (and fx_err_detail) naming the setting ("maxmemory-policy volatile-lru ...");
 * a transport error when Redis cannot be asked. Updates the guard state like any check; quiet:
 * without the guard's own log line for a change (the caller reports it, e.g. a refused start). */
fx_err fx_kv_redis_check(fx_kv_store *s, bool quiet, char *why, size_t cap, int timeout_ms);

/* Write-guard counters (monotonic) and state, for metrics. */
typedef struct fx_kv_redis_stats {
    bool refused;            /* the last check did not hold */
    uint64_t refused_writes; /* writes refused by the guard */
    uint64_t oom;            /* writes Redis refused with OOM (full under noeviction) */
    uint64_t wait_short;     /* puts whose WAIT reached fewer than min_replicas replicas */
} fx_kv_redis_stats;
void fx_kv_redis_get_stats(const fx_kv_store *s, fx_kv_redis_stats *out);

/* ---- for backends (kv.c, kv_redis.c) --------------------------------------------------------- */
/* Wrap backend state in a store (the store owns `self`: ops->destroy on free; on failure the
 * caller still owns it). */
fx_err fx_kv__wrap(const fx_kv_ops *ops, void *self, const char *uid, const char *prefix,
                   int default_timeout_ms, fx_kv_store **out);
/* The backend state of s if its ops are `ops`, else NULL. */
void *fx_kv__self(const fx_kv_store *s, const fx_kv_ops *ops);

#endif
