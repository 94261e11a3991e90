/* dedup.h -- a publish-deduplication window kept in etcd (JetStream's Nats-Msg-Id semantics).
 *
 * Each recorded id is one etcd key  <root>/dedup/<scope>/<id>  whose value is the caller's
 * record of the stored message (opaque bytes, for example its identity). The state lives in the
 * store, not in a process: every bridge of the cluster sees it, and it survives restarts.
 *
 * Expiry without any keepalive or delete: keys are bound to a "bucket" lease. A bucket lease is
 * granted with TTL window + bucket and used for the keys recorded during the next `bucket`
 * (window / 8, between 1 s and 60 s), then a new one is granted; nobody keeps it alive, so etcd
 * deletes its keys at once when it expires. A key therefore lives between `window` and
 * `window + bucket` after it was recorded (etcd raises TTLs under its minimum, 2 s by default).
 * Cost: one lease grant per bucket, one txn per lookup and one per record, each covering a
 * whole batch of ids (FX_DEDUP_TXN_OPS per txn; larger batches take several); a caller that
 * records a batch together with the next batch's lookup (fx_dedup_record_lookup) pays one.
 *
 * The bound (fx_dedup_set_bound; defaults FX_DEDUP_MAX_IDS_DEFAULT ids and
 * FX_DEDUP_MAX_BYTES_DEFAULT bytes): every id costs etcd space until its lease expires (its key,
 * and, counted here, key + value + FX_DEDUP_ID_OVERHEAD bytes per id), and etcd's quota is shared
 * with every channel (NOSPACE stops them all). An fx_dedup therefore keeps the ids it recorded
 * within max_ids and max_bytes: a lease carries at most 1/FX_DEDUP_LEASE_SHARE of the bound (and
 * at most FX_DEDUP_LEASE_IDS ids), so its expiry or revoke deletes a small batch of keys (one
 * small raft apply, never one giant revoke: etcd paces the expiries of many small leases), and
 * when a record would pass the bound the OLDEST lease is revoked first, the way a JetStream
 * stream's limits drop its oldest messages: the window shortens, the oldest ids are forgotten
 * early (stats.forgotten, forgotten_age_ms: how old they were), and a duplicate of such an id is
 * stored again. A record or a lookup is never refused because of the bound, and nothing that was
 * stored is ever lost by it. The bound is per fx_dedup (one channel of one bridge process); the
 * leases of a previous process with the same scope expire within window + bucket.
 *
 * Lookup-then-record is not atomic: two publishes of the same id racing through two bridges
 * within one batch time (milliseconds) can both be stored. A publisher retrying after a timeout
 * (the case dedup exists for) is well outside that gap.
 *
 * Ownership: fx_dedup copies its scope and borrows the client, which must outlive it.
 * Thread rules: one fx_dedup is used by one thread at a time (the channel's producer thread).
 */
#ifndef FX_BRIDGE_DEDUP_H
#define FX_BRIDGE_DEDUP_H

#include <stddef.h>
#include <stdint.h>

#include "fluxon_mq.h"

#define FX_DEDUP_ID_MAX 512   /* longer ids are refused (FX_EINVAL) */
#define FX_DEDUP_TXN_OPS 64   /* ids per etcd txn (etcd allows 128 ops by default) */
#define FX_DEDUP_MAX_IDS_DEFAULT 100000
#define FX_DEDUP_MAX_BYTES_DEFAULT (32LL << 20)
/* Bytes counted per id beside its key and value: etcd's stored record (revision key, create/mod
 * revision, version, lease), bbolt's page overhead and the in-memory index entry (measured:
 * e2e_dedup_window_bounded logs the db bytes per id). */
#define FX_DEDUP_ID_OVERHEAD 192
#define FX_DEDUP_LEASE_SHARE 16 /* a lease carries at most 1/16 of the bound */
#define FX_DEDUP_LEASE_IDS 2048 /* and at most this many ids */
#define FX_DEDUP_RING 64        /* leases tracked per fx_dedup (more: the oldest is revoked) */

typedef struct fx_dedup fx_dedup;

/* scope: a name for the id space (the channel name); window_ms >= 1. */
fx_err fx_dedup_new(fx_mq_client *c, const char *scope, int64_t window_ms, fx_dedup **out);
void fx_dedup_free(fx_dedup *d);
/* The bound (see above); values under the minimum (one txn of ids) are raised to it. It applies
 * from the next record on. */
void fx_dedup_set_bound(fx_dedup *d, int64_t max_ids, int64_t max_bytes);

/* Look up ids[0..n): vals[i] receives the recorded value (len 0 and data NULL when the id is not
 * in the window). The caller frees each vals[i] with fx_bytes_free, also on error. */
fx_err fx_dedup_lookup(fx_dedup *d, const fx_slice *ids, size_t n, fx_bytes *vals,
                       int timeout_ms);
/* Record ids[0..n) with vals (ids distinct within one call). */
fx_err fx_dedup_record(fx_dedup *d, const fx_slice *ids, const fx_slice *vals, size_t n,
                       int timeout_ms);

/* Both in the same txns: record rec_ids (with rec_vals) and look up ids, records first, so a
 * lookup sees them. Up to FX_DEDUP_TXN_OPS of each per txn; a repeated id among the records of
 * one txn is written once. vals as for fx_dedup_lookup (n may be 0, and so may nrec). */
fx_err fx_dedup_record_lookup(fx_dedup *d, const fx_slice *rec_ids, const fx_slice *rec_vals,
                              size_t nrec, const fx_slice *ids, size_t n, fx_bytes *vals,
                              int timeout_ms);

/* Counters (for metrics and benchmarks). */
typedef struct fx_dedup_stats {
    uint64_t lookups, hits, records, txns, grants;
    int64_t live_ids, live_bytes; /* recorded and not expired yet (bytes as counted above) */
    uint64_t forgotten;           /* ids revoked before their window ended (the bound) */
    int64_t forgotten_age_ms;     /* the age of the last ones forgotten: the window then */
    uint64_t revokes, revoke_errors;
} fx_dedup_stats;
void fx_dedup_get_stats(const fx_dedup *d, fx_dedup_stats *out);

#endif
