/* lease_mgr.h -- the LeaseManager and lease handles (docs/ARCHITECTURE.md "Leases").
 *
 * Model:
 *  - A registry keyed by (ttl_s, backend uid, lease id). Registering a key that is already
 *    registered shares its entry; every registration returns its own handle (a guard). The entry
 *    lives while any handle lives; its keepalive runs while the entry lives.
 *  - Registration does one synchronous keepalive probe (unless opts->skip_probe, for a lease the
 *    caller has just granted) and fails with FX_ELEASE_EXPIRED if the backend says the lease is
 *    gone. Transient probe failures are retried (up to 3 attempts within probe_timeout_ms).
 *  - Cadence: an entry is renewed every clamp(ttl/3, 1, FX_LEASE_MAX_CADENCE_S) seconds (a lease
 *    of days is renewed every minute, so it keeps nearly its whole TTL when its holders stop), the
 *    first renewal one cadence after
 *    registration. A failed renewal (timeout, unreachable backend) is retried every
 *    retry_interval_ms (default 200 ms) until it succeeds or the backend reports the lease expired;
 *    each backend call has a deadline of min(op_timeout_ms, cadence). When one call to a backend
 *    fails with a transport error, the other entries of that backend due in the same round are
 *    deferred to the retry interval instead of each waiting out its own deadline.
 *  - Keepalives run on the manager's own thread and use the backend's reserved keepalive lane
 *    (etcd: fx_etcd_lease_keepalive_lane), so data-path traffic cannot starve them.
 *  - Releasing a handle NEVER revokes the lease or deletes keys. Releasing the last handle of an
 *    entry only stops this process's keepalive; the backend TTL does the rest.
 *  - Expiry: when a keepalive reports the lease expired (etcd: answered without TTL), the entry
 *    stops renewing and every handle's on_expired callback is called once, on the manager thread,
 *    within one cadence of the expiry being observable. A handle registered on an entry that is
 *    already known expired fails with FX_ELEASE_EXPIRED.
 *
 * Counters (fx_lease_mgr_stats) make every bound visible: keepalives sent, failures, retries,
 * expiries, entries, handles.
 *
 * Thread rules:
 *  - All functions are thread-safe, except fx_lease_mgr_free(), called once after every handle
 *    has been released (it asserts that in debug builds and otherwise releases leftovers).
 *  - on_expired runs on the manager thread without any manager lock held. It must not block for
 *    long (no etcd calls; set a flag or enqueue). It may call fx_lease_release() on any handle,
 *    including its own.
 *  - fx_lease_release() of a handle whose callback is running on another thread waits until the
 *    callback has returned; after fx_lease_release() returns, that handle's callback never runs.
 *  - fx_lease_release() of the last handle using a backend ctx also waits for a keepalive call
 *    on that ctx that is in flight (bounded by min(op_timeout_ms, cadence)), so the caller may
 *    free the fx_etcd / fx_kv_store right after releasing its last handle.
 *  - Every registration probes (unless skip_probe, or join_held and the entry it joins is active
 *    and not overdue), also when it joins an existing entry; a probe that finds the lease expired
 *    marks the shared entry expired and notifies its holders.
 */
#ifndef FX_LEASE_MGR_H
#define FX_LEASE_MGR_H

#include <stdbool.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"
#include "kv.h"

#define FX_LEASE_MAX_CADENCE_S 60 /* longest renewal interval, whatever the TTL */

typedef struct fx_lease_mgr fx_lease_mgr;
typedef struct fx_lease fx_lease; /* one handle (guard) */

/* A lease backend: its identity and its keepalive operation. Copied at registration; `ctx`
 * (an fx_etcd or fx_kv_store) is borrowed and must outlive every entry registered with it. */
typedef struct fx_lease_backend {
    const char *uid; /* identity, e.g. fx_etcd_uid() or fx_kv_backend_uid() */
    /* One keepalive: FX_OK with *out_ttl > 0, FX_ELEASE_EXPIRED, or another (transient) error. */
    fx_err (*keepalive)(void *ctx, int64_t id, int64_t *out_ttl, int timeout_ms);
    void *ctx;
} fx_lease_backend;

/* Backend descriptors for the two shipped backends. */
fx_lease_backend fx_lease_backend_etcd(fx_etcd *c);
fx_lease_backend fx_lease_backend_kv(fx_kv_store *s);

typedef struct fx_lease_mgr_opts {
    int op_timeout_ms;     /* per keepalive call, 0 -> 1500 */
    int retry_interval_ms; /* after a failed keepalive, 0 -> 200 */
    int probe_timeout_ms;  /* registration probe budget, 0 -> 5000 */
} fx_lease_mgr_opts;

/* Create a manager and start its thread. opts may be NULL. */
fx_err fx_lease_mgr_new(const fx_lease_mgr_opts *opts, fx_lease_mgr **out);
/* Stop the thread (interrupting any wait) and free. NULL is a no-op. */
void fx_lease_mgr_free(fx_lease_mgr *m);

typedef void (*fx_lease_expired_fn)(void *arg, fx_lease *h, int64_t lease_id);

typedef struct fx_lease_reg_opts {
    bool skip_probe;             /* the caller just granted this lease */
    /* Skip the probe when the registration joins an entry of this manager that is active (its
     * last renewal or probe succeeded) and not overdue: another holder in this process keeps it
     * alive, so a probe tells nothing new but a revoke since the last renewal, which the next
     * renewal finds (then every holder is notified). For callers that register the same shared
     * lease for many members (a thousand claims of one channel share its data leases). */
    bool join_held;
    fx_lease_expired_fn on_expired; /* may be NULL */
    void *arg;
} fx_lease_reg_opts;

/* Register a lease for keepalive and return a handle. opts may be NULL.
 * FX_EINVAL: ttl_s <= 0, id <= 0, bad backend. FX_ELEASE_EXPIRED: the probe says it is gone.
 * FX_ETIMEDOUT / FX_EUNAVAIL: the probe could not reach the backend. FX_ECLOSED: manager closing.
 * On FX_OK *out is a handle owned by the caller, released with fx_lease_release(). */
fx_err fx_lease_register(fx_lease_mgr *m, const fx_lease_backend *b, int64_t ttl_s, int64_t id,
                         const fx_lease_reg_opts *opts, fx_lease **out);
/* Release a handle: never revokes, never deletes. NULL is a no-op. */
void fx_lease_release(fx_lease *h);

int64_t fx_lease_id(const fx_lease *h);
int64_t fx_lease_ttl(const fx_lease *h);
/* True once the backend reported the lease expired. */
bool fx_lease_is_expired(const fx_lease *h);
/* Monotonic ms (fx_now_ms) until which the backend is known to keep the lease: the start of the
 * last keepalive it answered with a TTL (periodic or registration probe; with skip_probe the
 * registration itself) plus that TTL. 0 once the lease is known expired. Past it, the holder
 * cannot tell whether the lease still exists (the backend is unreachable or slow): a holder whose
 * exclusive right hangs on the lease (a consumer's claim) must act as if it were gone until the
 * manager knows (renewed, or expired and notified). Transient failures never expire an entry. */
int64_t fx_lease_confirmed_until_ms(const fx_lease *h);

typedef struct fx_lease_mgr_stats {
    uint64_t keepalives;     /* keepalive calls made (periodic and probes) */
    uint64_t keepalive_failures; /* failed keepalive calls (transient) */
    uint64_t expired;        /* entries found expired */
    uint64_t deferred;       /* renewals deferred because their backend just failed */
    uint64_t entries;        /* live entries now */
    uint64_t handles;        /* live handles now */
    uint64_t notify_pending; /* expiry callbacks queued or running now (0: all delivered) */
} fx_lease_mgr_stats;
void fx_lease_mgr_get_stats(fx_lease_mgr *m, fx_lease_mgr_stats *out);

/* Keepalive calls made for one (ttl, backend, id) entry so far (0 if not registered). For tests
 * and diagnostics. */
uint64_t fx_lease_mgr_entry_keepalives(fx_lease_mgr *m, const char *backend_uid, int64_t ttl_s,
                                       int64_t id);

#endif
