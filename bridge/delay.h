/* delay.h -- delayed messages: an etcd index ordered by due time, and the mover's lock.
 *
 * A delayed message is one etcd key
 *     <root>/delay/<channel>/<due ms since the epoch, 13 digits>/<id, 16 hex digits>
 * whose value is the stored record (bridge/flatdict.h fx_mq_msg, exactly what the channel would
 * store). Keys sort by due time, so "everything due by now" is one range with a limit, and the
 * number waiting is one count_only range. The keys carry the channel's MPMC metadata lease
 * (fx_delay_chan_lease): every bridge with the channel configured keeps it alive for the
 * channel's `retention`, and they go with the channel when it is reclaimed (no bridge for longer
 * than its retention). Nothing else keeps them alive and nothing else deletes them but a mover.
 *
 * The mover's lock: one key <root>/delay_lock/<channel> whose value names the holder
 * ("<owner>/<lease hex>"), bound to a short lease of the holder's process (lock_ttl_s, kept
 * alive by the client's LeaseManager). A holder's process that dies leaves the lock to expire
 * with that lease; another process takes it at its next fx_delay_lock call. The holder is
 * fenced: fx_delay_lock answers held only while the lease is confirmed by etcd
 * (fx_lease_confirmed_until_ms), so two movers overlap at most by one scan (the move itself is
 * at least once: the caller deduplicates by the entry's id).
 *
 * Scheduling is the caller's: fx_delay_scan reads at most `limit` keys due by `now_ms`, oldest
 * first (a bounded window: memory independent of how many wait), fx_delay_remove deletes moved
 * ones, fx_delay_next_due and fx_delay_count are cheap reads.
 *
 * Bounds: FX_DELAY_TXN_OPS keys per txn (etcd allows 128 ops by default), FX_DELAY_SCAN_MAX keys
 * per scan; every etcd call has the caller's deadline (or the client's op deadline) and holds an
 * op reference on the client (FX_ECLOSED once it is closing).
 *
 * Ownership: fx_delay borrows the client (it must outlive it) and copies owner. Entries returned
 * by fx_delay_scan belong to the caller (fx_delay_entries_free).
 * Thread rules: the put, scan, remove, next_due and count calls may run on any thread at once;
 * fx_delay_lock (it manages the lock lease) is called by one thread at a time (the mover).
 */
#ifndef FX_BRIDGE_DELAY_H
#define FX_BRIDGE_DELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fluxon_mq.h"

#define FX_DELAY_TXN_OPS 128  /* puts or deletes per etcd txn (etcd allows 128 ops by default) */
#define FX_DELAY_SCAN_MAX 1024 /* keys one scan reads at most */
#define FX_DELAY_DUE_DIGITS 13 /* ms since the epoch up to year 2286 */
#define FX_DELAY_ID_HEX 16
/* Latest due time accepted (9999999999999 ms: November 2286); beyond -> FX_EINVAL. */
#define FX_DELAY_DUE_MAX 9999999999999LL

typedef struct fx_delay fx_delay;

/* owner: names the holder in lock values (the bridge name); lock_ttl_s >= 2. */
fx_err fx_delay_new(fx_mq_client *c, const char *owner, int64_t lock_ttl_s, fx_delay **out);
/* Releases the lock lease handle (the lease is not revoked: the lock keys expire with it). */
void fx_delay_free(fx_delay *dl);

/* ---- header values (pure, any thread) ---------------------------------------------------- */

/* An RFC 3339 date-time ("2026-12-02T10:00:00Z", "...T10:00:00.250+01:00", lower-case t and z
 * accepted) -> ms since the epoch. FX_EINVAL when malformed or out of range. */
fx_err fx_delay_parse_rfc3339(const char *s, size_t len, int64_t *ms);
/* A Nats-Schedule value: only "@at <RFC 3339>" is supported -> *due_ms. FX_EINVAL otherwise;
 * *unsupported (may be NULL) then says whether it is another schedule form of JetStream (a cron
 * expression, "@every", "@hourly"...) rather than malformed. */
fx_err fx_delay_parse_schedule(const char *s, size_t len, int64_t *due_ms, bool *unsupported);
/* A Go-style duration: "30s", "1m30s", "250ms", "1h", "1.5s" (units h, m, s, ms, us, ns; at
 * least one; no sign) -> ms (sub-ms parts rounded up). FX_EINVAL when malformed or > 100 years. */
fx_err fx_delay_parse_duration(const char *s, size_t len, int64_t *ms);

/* ---- index ------------------------------------------------------------------------------- */

typedef struct fx_delay_put {
    const char *chan; /* channel name (a single subject token) */
    int64_t lease;    /* the channel's MPMC metadata lease (fx_delay_chan_lease) */
    int64_t due_ms;   /* 0..FX_DELAY_DUE_MAX */
    uint64_t id;      /* unique per message (random) */
    fx_slice rec;     /* the stored record */
} fx_delay_put;

/* The metadata lease of MPMC `mpmc` (read from its meta). FX_ENOTFOUND when the meta is gone. */
fx_err fx_delay_chan_lease(fx_delay *dl, int64_t mpmc, int64_t *lease);
/* Store n entries in ceil(n / FX_DELAY_TXN_OPS) txns, in order. On error, the entries of the
 * txns before the failing one are stored (*stored says how many: a multiple of the txn size),
 * the rest not. FX_ELEASE_EXPIRED: a lease is gone (etcd "requested lease not found"). */
fx_err fx_delay_put_batch(fx_delay *dl, const fx_delay_put *p, size_t n, size_t *stored,
                          int timeout_ms);

typedef struct fx_delay_entry {
    fx_bytes key;   /* the full etcd key */
    int64_t due_ms;
    char id[FX_DELAY_ID_HEX + 1];
    fx_bytes rec;
} fx_delay_entry;

/* Read at most min(limit, FX_DELAY_SCAN_MAX) entries of chan due by now_ms (due <= now_ms),
 * earliest first. *more: some due entries were left for the next scan. */
fx_err fx_delay_scan(fx_delay *dl, const char *chan, int64_t now_ms, size_t limit,
                     fx_delay_entry **out, size_t *n, bool *more, int timeout_ms);
void fx_delay_entries_free(fx_delay_entry *e, size_t n);
/* Delete the keys of e[0..n) (already moved); absent keys are no error. */
fx_err fx_delay_remove(fx_delay *dl, const fx_delay_entry *e, size_t n, int timeout_ms);
/* Earliest due time of chan (-1: nothing waits). One range, limit 1, keys only. */
fx_err fx_delay_next_due(fx_delay *dl, const char *chan, int64_t *due_ms, int timeout_ms);
/* Entries of chan waiting (count_only range: etcd counts keys without reading values). */
fx_err fx_delay_count(fx_delay *dl, const char *chan, int64_t *n, int timeout_ms);
/* Delete every entry of chan (range delete). For tests and operators. */
fx_err fx_delay_purge(fx_delay *dl, const char *chan, int timeout_ms);

/* ---- the mover's lock -------------------------------------------------------------------- */

/* Take or confirm the mover lock of chan. *held: this process holds it and its lease is
 * confirmed by etcd now. Grants (and registers) a new lock lease when there is none or the last
 * one expired. Errors: etcd unreachable (then *held is false). */
fx_err fx_delay_lock(fx_delay *dl, const char *chan, bool *held, int timeout_ms);
/* The lock lease this process holds locks with, while etcd confirms it now; 0 otherwise. A lock
 * taken under a lease stays this process's while that lease lives (only its holder deletes it),
 * so a holder may skip fx_delay_lock while this returns the same lease. Same thread as
 * fx_delay_lock. */
int64_t fx_delay_lock_lease(fx_delay *dl);
/* Give the lock of chan up (delete it if this process holds it). Best effort. */
void fx_delay_unlock(fx_delay *dl, const char *chan, int timeout_ms);
/* Release the lock lease's handle (no revoke: the locks expire with it); a later fx_delay_lock
 * grants a new one. Must run before the client closes (its LeaseManager goes with it). */
void fx_delay_release_lease(fx_delay *dl);

#endif
