/* dedup.c -- publish-deduplication window in etcd (see dedup.h). */
#include "dedup.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_time.h"

struct fx_dedup {
    fx_mq_client *c;
    fx_etcd *etcd;
    char *prefix; /* <root>/dedup/<scope>/ */
    size_t plen;
    int64_t window_ms, bucket_ms;
    int64_t lease;        /* current bucket lease, 0: none (the ring's newest entry) */
    int64_t lease_until;  /* monotonic ms: record with a new lease from then on */
    uint8_t *kbuf;        /* 2 * FX_DEDUP_TXN_OPS keys back to back */
    /* The bound (dedup.h): the leases this fx_dedup granted whose keys may still exist, oldest
     * first, with what was recorded on each; live_* are their sums. */
    int64_t max_ids, max_bytes;
    int64_t lease_ids, lease_bytes; /* per lease: rotate before a record would pass these */
    struct dd_lease {
        int64_t id, first_ms, gone_ms; /* granted; all its keys expired by etcd at gone_ms */
        int64_t ids, bytes;
    } ring[FX_DEDUP_RING];
    size_t r_head, r_n;
    fx_dedup_stats st;
};

static struct dd_lease *ring_at(fx_dedup *d, size_t i)
{
    return &d->ring[(d->r_head + i) % FX_DEDUP_RING];
}

static struct dd_lease *ring_newest(fx_dedup *d)
{
    return d->r_n ? ring_at(d, d->r_n - 1) : NULL;
}

static void ring_pop_oldest(fx_dedup *d)
{
    struct dd_lease *l = ring_at(d, 0);
    d->st.live_ids -= l->ids;
    d->st.live_bytes -= l->bytes;
    d->r_head = (d->r_head + 1) % FX_DEDUP_RING;
    d->r_n--;
    if (!d->r_n) d->lease = 0;
}

/* Forget the leases etcd has expired by now (their keys are gone). */
static void ring_prune(fx_dedup *d, int64_t now)
{
    while (d->r_n && ring_at(d, 0)->gone_ms <= now) ring_pop_oldest(d);
}

/* Revoke the oldest lease before its time (the window shortens): its keys, at most lease_ids,
 * go in one small raft apply. The newest (current) lease is kept unless `any`. */
static fx_err evict_oldest(fx_dedup *d, bool any, int timeout_ms)
{
    if (!d->r_n || (d->r_n == 1 && !any)) return FX_ENOTFOUND;
    struct dd_lease *l = ring_at(d, 0);
    fx_err e = fx_etcd_lease_revoke(d->etcd, l->id, timeout_ms < 2000 ? timeout_ms : 2000);
    if (e && e != FX_ENOTFOUND) {
        d->st.revoke_errors++;
        return e;
    }
    int64_t now = fx_now_ms();
    d->st.revokes++;
    d->st.forgotten += (uint64_t)l->ids;
    d->st.forgotten_age_ms = now - l->first_ms;
    if (l->id == d->lease) d->lease = 0;
    ring_pop_oldest(d);
    return FX_OK;
}

/* Before recording `ids` more ids of `bytes` footprint: revoke the oldest leases until they fit
 * the bound. Never fails the record: a revoke that fails leaves the bound passed until the next
 * record tries again (counted in revoke_errors). */
static void make_room(fx_dedup *d, int64_t ids, int64_t bytes, int timeout_ms)
{
    ring_prune(d, fx_now_ms());
    while (d->st.live_ids + ids > d->max_ids || d->st.live_bytes + bytes > d->max_bytes)
        if (evict_oldest(d, false, timeout_ms)) break;
}

fx_err fx_dedup_new(fx_mq_client *c, const char *scope, int64_t window_ms, fx_dedup **out)
{
    *out = NULL;
    if (!c || !scope || !*scope || window_ms < 1) return fx_seterr(FX_EINVAL, "dedup: bad arguments");
    fx_dedup *d = calloc(1, sizeof *d);
    if (!d) return fx_seterr(FX_ENOMEM, "dedup: out of memory");
    const char *root = fx_mq_client_root(c);
    size_t n = strlen(root) + strlen(scope) + sizeof "/dedup//";
    d->prefix = malloc(n);
    d->kbuf = malloc((size_t)2 * FX_DEDUP_TXN_OPS * (n + FX_DEDUP_ID_MAX));
    if (!d->prefix || !d->kbuf) {
        fx_dedup_free(d);
        return fx_seterr(FX_ENOMEM, "dedup: out of memory");
    }
    d->plen = (size_t)snprintf(d->prefix, n, "%s/dedup/%s/", root, scope);
    d->c = c;
    d->etcd = fx_mq_client_etcd(c);
    d->window_ms = window_ms;
    int64_t b = window_ms / 8;
    d->bucket_ms = b < 1000 ? 1000 : b > 60000 ? 60000 : b;
    fx_dedup_set_bound(d, FX_DEDUP_MAX_IDS_DEFAULT, FX_DEDUP_MAX_BYTES_DEFAULT);
    *out = d;
    return FX_OK;
}

void fx_dedup_set_bound(fx_dedup *d, int64_t max_ids, int64_t max_bytes)
{
    if (max_ids < FX_DEDUP_TXN_OPS) max_ids = FX_DEDUP_TXN_OPS;
    int64_t min_bytes = FX_DEDUP_TXN_OPS * (FX_DEDUP_ID_MAX + 80 + FX_DEDUP_ID_OVERHEAD);
    if (max_bytes < min_bytes) max_bytes = min_bytes;
    d->max_ids = max_ids;
    d->max_bytes = max_bytes;
    int64_t li = max_ids / FX_DEDUP_LEASE_SHARE;
    d->lease_ids = li < FX_DEDUP_TXN_OPS     ? FX_DEDUP_TXN_OPS
                   : li > FX_DEDUP_LEASE_IDS ? FX_DEDUP_LEASE_IDS
                                             : li;
    int64_t lb = max_bytes / FX_DEDUP_LEASE_SHARE;
    d->lease_bytes = lb < min_bytes ? min_bytes : lb;
}

void fx_dedup_free(fx_dedup *d)
{
    if (!d) return;
    free(d->prefix);
    free(d->kbuf);
    free(d);
}

void fx_dedup_get_stats(const fx_dedup *d, fx_dedup_stats *out) { *out = d->st; }

/* Write the key of id into d->kbuf slot i; returns its slice. */
static fx_slice key_of(fx_dedup *d, size_t i, fx_slice id)
{
    uint8_t *k = d->kbuf + i * (d->plen + FX_DEDUP_ID_MAX);
    memcpy(k, d->prefix, d->plen);
    memcpy(k + d->plen, id.data, id.len);
    return (fx_slice){k, d->plen + id.len};
}

static fx_err check_ids(const fx_slice *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i].len == 0 || ids[i].len > FX_DEDUP_ID_MAX)
            return fx_seterr(FX_EINVAL, "dedup: id of %zu bytes (1..%d)", ids[i].len, FX_DEDUP_ID_MAX);
    return FX_OK;
}

/* The lease for the next `ids` records of `bytes`: the current one, or a new one when its
 * bucket time is over, it would pass its share of the bound, or `force` (it is gone). */
static fx_err bucket_lease(fx_dedup *d, int timeout_ms, bool force, int64_t ids, int64_t bytes)
{
    int64_t now = fx_now_ms();
    struct dd_lease *cur = ring_newest(d);
    if (d->lease && cur && !force && now < d->lease_until &&
        (cur->ids == 0 || (cur->ids + ids <= d->lease_ids && cur->bytes + bytes <= d->lease_bytes)))
        return FX_OK;
    if (force && cur && cur->id == d->lease) { /* etcd lost it: so are its keys */
        d->st.live_ids -= cur->ids;
        d->st.live_bytes -= cur->bytes;
        d->r_n--;
        d->lease = 0;
    }
    /* a full ring: the oldest lease goes early (ring_prune first: it may be gone already) */
    ring_prune(d, now);
    while (d->r_n >= FX_DEDUP_RING)
        if (evict_oldest(d, true, timeout_ms))
            return fx_seterr(FX_EUNAVAIL, "dedup: %zu leases live", d->r_n);
    int64_t ttl_s = (d->window_ms + d->bucket_ms + 999) / 1000;
    int64_t id = 0, granted = 0;
    fx_err e = fx_etcd_lease_grant(d->etcd, ttl_s, 0, &id, &granted, timeout_ms);
    if (e) return e;
    if (granted < ttl_s) granted = ttl_s;
    d->st.grants++;
    d->lease = id;
    d->lease_until = now + d->bucket_ms;
    struct dd_lease *l = ring_at(d, d->r_n++);
    /* etcd deletes the keys some time after the TTL (its expiry check runs every 500 ms and
     * paces revokes): count them 2 s longer */
    *l = (struct dd_lease){.id = id, .first_ms = now, .gone_ms = now + granted * 1000 + 2000};
    return FX_OK;
}

fx_err fx_dedup_record_lookup(fx_dedup *d, const fx_slice *rec_ids, const fx_slice *rec_vals,
                              size_t nrec, const fx_slice *ids, size_t n, fx_bytes *vals,
                              int timeout_ms)
{
    for (size_t i = 0; i < n; i++) vals[i] = (fx_bytes){0};
    fx_err e = check_ids(ids, n);
    if (!e) e = check_ids(rec_ids, nrec);
    if (e) return e;
    fx_op ops[2 * FX_DEDUP_TXN_OPS];
    size_t ro = 0, lo = 0; /* records / lookups done */
    while (ro < nrec || lo < n) {
        size_t kr = 0, kl = n - lo < FX_DEDUP_TXN_OPS ? n - lo : FX_DEDUP_TXN_OPS;
        size_t rtake = nrec - ro < FX_DEDUP_TXN_OPS ? nrec - ro : FX_DEDUP_TXN_OPS;
        int64_t rbytes = 0;
        for (size_t i = 0; i < rtake; i++)
            rbytes += (int64_t)(d->plen + rec_ids[ro + i].len + rec_vals[ro + i].len) +
                      FX_DEDUP_ID_OVERHEAD;
        if (rtake) {
            if ((e = bucket_lease(d, timeout_ms, false, (int64_t)rtake, rbytes))) return e;
            make_room(d, (int64_t)rtake, rbytes, timeout_ms);
        }
        for (int attempt = 0;; attempt++) {
            kr = 0;
            for (size_t i = 0; i < rtake; i++) {
                fx_slice id = rec_ids[ro + i];
                bool again = false; /* etcd refuses two puts of one key in a txn */
                for (size_t j = 0; j < i && !again; j++)
                    again = rec_ids[ro + j].len == id.len && memcmp(rec_ids[ro + j].data, id.data, id.len) == 0;
                if (again) continue;
                memset(&ops[kr], 0, sizeof ops[kr]);
                ops[kr].type = FX_OP_PUT;
                ops[kr].u.put.key = key_of(d, kr, id);
                ops[kr].u.put.value = rec_vals[ro + i];
                ops[kr].u.put.lease = d->lease;
                kr++;
            }
            for (size_t i = 0; i < kl; i++) {
                memset(&ops[kr + i], 0, sizeof ops[kr + i]);
                ops[kr + i].type = FX_OP_RANGE;
                ops[kr + i].u.range.key = key_of(d, kr + i, ids[lo + i]);
            }
            fx_txn_req t = {.success = ops, .n_success = kr + kl};
            fx_txn_resp r = {0};
            e = fx_etcd_txn(d->etcd, &t, &r, timeout_ms);
            d->st.txns++;
            if (!e && r.n_responses != kr + kl)
                e = fx_seterr(FX_EPROTO, "dedup: %zu responses to %zu ops", r.n_responses, kr + kl);
            for (size_t i = 0; !e && i < kl; i++) {
                fx_range_resp *rr = &r.responses[kr + i].u.range;
                if (rr->n_kvs == 1 && rr->kvs[0].value.len > 0) {
                    vals[lo + i] = rr->kvs[0].value; /* take it */
                    rr->kvs[0].value = (fx_bytes){0};
                    d->st.hits++;
                }
            }
            fx_txn_resp_free(&r);
            /* the bucket lease is gone (etcd lost it, or a clock jump): one retry with a new one */
            if (kr && (e == FX_ELEASE_EXPIRED || e == FX_ENOTFOUND) && attempt == 0) {
                if ((e = bucket_lease(d, timeout_ms, true, (int64_t)rtake, rbytes))) return e;
                continue;
            }
            break;
        }
        if (e) return e;
        if (kr) {
            struct dd_lease *cur = ring_newest(d);
            cur->ids += (int64_t)kr;
            cur->bytes += rbytes; /* an id repeated in the batch counts twice: on the safe side */
            d->st.live_ids += (int64_t)kr;
            d->st.live_bytes += rbytes;
        }
        d->st.records += kr;
        d->st.lookups += kl;
        ro += rtake;
        lo += kl;
    }
    return FX_OK;
}

fx_err fx_dedup_lookup(fx_dedup *d, const fx_slice *ids, size_t n, fx_bytes *vals, int timeout_ms)
{
    return fx_dedup_record_lookup(d, NULL, NULL, 0, ids, n, vals, timeout_ms);
}

fx_err fx_dedup_record(fx_dedup *d, const fx_slice *ids, const fx_slice *vals, size_t n,
                       int timeout_ms)
{
    return fx_dedup_record_lookup(d, ids, vals, n, NULL, 0, NULL, timeout_ms);
}
