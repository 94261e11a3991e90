/* kv.c -- the KV payload store: generic layer (dispatch, deadlines, same-key admission control)
 * and the etcd backend. Contract: kv.h (Fluxon KV's lease semantics: lease_id and
 * reject_if_inflight_same_key).
 *
 * Generic layer
 *  - Every put (put and put_many, with or without the reject flag) counts its keys as in flight
 *    from admission until the backend call returns, in a small chained hash table of per-key
 *    counts (Fluxon KV's inflight_put_key_counts) under one mutex. The mutex is held only for the
 *    lookups/updates, never across I/O, so other keys are never blocked.
 *  - A put with reject_if_inflight_same_key is refused with FX_EKEY_BEING_WRITTEN when any of its
 *    keys has a count > 0 (a batch is all-or-nothing: either every key is admitted or none).
 *  - Bounded: at most FX_KV_MAX_BATCH items per call, at most KV_MAX_INFLIGHT_KEYS distinct keys
 *    in flight per store (beyond: FX_EFULL, which needs ~500 threads doing full batches).
 *  - fx_kv_delete(key) is delete_range over [key, key"\0"), which holds exactly `key`. Deleting a
 *    missing key is FX_OK (idempotent).
 *
 * etcd backend
 *  - Payload key = prefix + key. put_many of one item is a plain put, of more items one txn
 *    without compares (atomic: one revision for all items).
 *  - A lease put that etcd refuses because the lease is unknown ("requested lease not found",
 *    FX_ENOTFOUND from etcd.c) is reported as FX_ELEASE_EXPIRED. lease_id 0 is a plain put (etcd
 *    then also detaches the key from any lease an earlier version had).
 *  - Keepalives go through fx_etcd_lease_keepalive_lane(), never the data-path pool.
 */
#include "kv.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_DEFAULT_TIMEOUT_MS 5000
#define KV_BUCKETS 1024 /* power of two */
#define KV_MAX_INFLIGHT_KEYS 65536
#define KV_SMALL_KEY 256

/* ---- generic layer ------------------------------------------------------------------------- */

typedef struct kv_inflight {
    struct kv_inflight *next;
    uint64_t hash;
    uint32_t count;
    size_t len;
    uint8_t key[];
} kv_inflight;

struct fx_kv_store {
    const fx_kv_ops *ops;
    void *self;
    char *uid;
    char *prefix;
    fx_etcd *etcd; /* etcd backend only */
    int default_timeout_ms;
    pthread_mutex_t mu;
    size_t n_inflight; /* distinct keys in the table */
    kv_inflight *buckets[KV_BUCKETS];
};

static uint64_t kv_hash(fx_slice k)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    const uint8_t *p = k.data;
    for (size_t i = 0; i < k.len; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* Caller holds s->mu. */
static kv_inflight **kv_find(fx_kv_store *s, fx_slice k, uint64_t h)
{
    kv_inflight **pp = &s->buckets[h & (KV_BUCKETS - 1)];
    for (; *pp; pp = &(*pp)->next) {
        kv_inflight *e = *pp;
        if (e->hash == h && e->len == k.len && (k.len == 0 || memcmp(e->key, k.data, k.len) == 0))
            return pp;
    }
    return pp;
}

/* Caller holds s->mu. Decrement the count of one key (which must be in the table). */
static void kv_dec(fx_kv_store *s, fx_slice k)
{
    kv_inflight **pp = kv_find(s, k, kv_hash(k));
    kv_inflight *e = *pp;
    if (!e) return;
    if (--e->count == 0) {
        *pp = e->next;
        free(e);
        s->n_inflight--;
    }
}

/* Admit items[0..n) as in flight; with reject, refuse if any key already is. */
static fx_err kv_enter(fx_kv_store *s, const fx_kv_item *items, size_t n, bool reject)
{
    pthread_mutex_lock(&s->mu);
    if (reject) {
        for (size_t i = 0; i < n; i++) {
            if (*kv_find(s, items[i].key, kv_hash(items[i].key))) {
                pthread_mutex_unlock(&s->mu);
                return fx_seterr(FX_EKEY_BEING_WRITTEN, "kv: key %.*s is being written",
                                 (int)(items[i].key.len > 200 ? 200 : items[i].key.len),
                                 (const char *)items[i].key.data);
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t h = kv_hash(items[i].key);
        kv_inflight **pp = kv_find(s, items[i].key, h);
        if (*pp) {
            (*pp)->count++;
            continue;
        }
        kv_inflight *e = NULL;
        if (s->n_inflight < KV_MAX_INFLIGHT_KEYS)
            e = malloc(sizeof *e + items[i].key.len);
        if (!e) {
            for (size_t j = 0; j < i; j++) kv_dec(s, items[j].key);
            bool full = s->n_inflight >= KV_MAX_INFLIGHT_KEYS;
            pthread_mutex_unlock(&s->mu);
            return full ? fx_seterr(FX_EFULL, "kv: more than %d keys in flight",
                                    KV_MAX_INFLIGHT_KEYS)
                        : fx_seterr(FX_ENOMEM, "kv: out of memory");
        }
        e->next = NULL;
        e->hash = h;
        e->count = 1;
        e->len = items[i].key.len;
        if (e->len) memcpy(e->key, items[i].key.data, e->len);
        *pp = e;
        s->n_inflight++;
    }
    pthread_mutex_unlock(&s->mu);
    return FX_OK;
}

static void kv_leave(fx_kv_store *s, const fx_kv_item *items, size_t n)
{
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++) kv_dec(s, items[i].key);
    pthread_mutex_unlock(&s->mu);
}

static fx_err kv_timeout(const fx_kv_store *s, int timeout_ms, int *out)
{
    if (timeout_ms < 0) return fx_seterr(FX_EINVAL, "kv: negative timeout_ms %d", timeout_ms);
    *out = timeout_ms ? timeout_ms : s->default_timeout_ms;
    return FX_OK;
}

static bool slice_ok(fx_slice k) { return k.len == 0 || k.data != NULL; }

static fx_err kv_store_new(const fx_kv_ops *ops, void *self, const char *uid, const char *prefix,
                           fx_etcd *etcd, int default_timeout_ms, fx_kv_store **out)
{
    fx_kv_store *s = calloc(1, sizeof *s);
    if (!s) return fx_seterr(FX_ENOMEM, "kv: out of memory");
    s->uid = strdup(uid);
    s->prefix = strdup(prefix);
    if (!s->uid || !s->prefix || pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s->uid);
        free(s->prefix);
        free(s);
        return fx_seterr(FX_ENOMEM, "kv: out of memory");
    }
    s->ops = ops;
    s->self = self;
    s->etcd = etcd;
    s->default_timeout_ms = default_timeout_ms > 0 ? default_timeout_ms : KV_DEFAULT_TIMEOUT_MS;
    *out = s;
    return FX_OK;
}

void fx_kv_store_free(fx_kv_store *s)
{
    if (!s) return;
    if (s->ops && s->ops->destroy) s->ops->destroy(s->self);
    for (size_t b = 0; b < KV_BUCKETS; b++) {
        kv_inflight *e = s->buckets[b];
        while (e) {
            kv_inflight *n = e->next;
            free(e);
            e = n;
        }
    }
    pthread_mutex_destroy(&s->mu);
    free(s->uid);
    free(s->prefix);
    free(s);
}

fx_err fx_kv__wrap(const fx_kv_ops *ops, void *self, const char *uid, const char *prefix,
                   int default_timeout_ms, fx_kv_store **out)
{
    if (!ops || !uid || !prefix || !out) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    return kv_store_new(ops, self, uid, prefix, NULL, default_timeout_ms, out);
}

void *fx_kv__self(const fx_kv_store *s, const fx_kv_ops *ops)
{
    return s && s->ops == ops ? s->self : NULL;
}

const char *fx_kv_backend_uid(const fx_kv_store *s) { return s ? s->uid : ""; }
const char *fx_kv_prefix(const fx_kv_store *s) { return s ? s->prefix : ""; }
fx_etcd *fx_kv_etcd(const fx_kv_store *s) { return s ? s->etcd : NULL; }

fx_err fx_kv_allocate_lease(fx_kv_store *s, int64_t ttl_s, int64_t *out_id, int timeout_ms)
{
    int t = 0;
    if (!s || !out_id) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    *out_id = 0;
    if (ttl_s <= 0) return fx_seterr(FX_EINVAL, "kv: lease ttl %lld <= 0", (long long)ttl_s);
    fx_err e = kv_timeout(s, timeout_ms, &t);
    return e ? e : s->ops->allocate_lease(s->self, ttl_s, out_id, t);
}

fx_err fx_kv_keepalive_lease(fx_kv_store *s, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    int t = 0;
    int64_t ttl = 0;
    if (out_ttl) *out_ttl = 0;
    if (!s) return fx_seterr(FX_EINVAL, "kv: NULL store");
    if (id <= 0) return fx_seterr(FX_EINVAL, "kv: lease id %lld <= 0", (long long)id);
    fx_err e = kv_timeout(s, timeout_ms, &t);
    if (e) return e;
    e = s->ops->keepalive_lease(s->self, id, &ttl, t);
    if (e == FX_OK && out_ttl) *out_ttl = ttl;
    return e;
}

fx_err fx_kv_put_many(fx_kv_store *s, const fx_kv_item *items, size_t n,
                      const fx_kv_put_opts *opts, int timeout_ms)
{
    static const fx_kv_put_opts plain = {0, false};
    int t = 0;
    if (!s || (n && !items)) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    if (!opts) opts = &plain;
    if (opts->lease_id < 0)
        return fx_seterr(FX_EINVAL, "kv: lease id %lld < 0", (long long)opts->lease_id);
    if (n > FX_KV_MAX_BATCH)
        return fx_seterr(FX_ETXN_TOO_MANY_OPS, "kv: %zu items in one batch (max %d)", n,
                         FX_KV_MAX_BATCH);
    for (size_t i = 0; i < n; i++) {
        if (items[i].key.len == 0 || !items[i].key.data || !slice_ok(items[i].value))
            return fx_seterr(FX_EINVAL, "kv: item %zu: empty key or NULL data", i);
    }
    fx_err e = kv_timeout(s, timeout_ms, &t);
    if (e || n == 0) return e;
    e = kv_enter(s, items, n, opts->reject_if_inflight_same_key);
    if (e) return e;
    e = s->ops->put_many(s->self, items, n, opts, t);
    kv_leave(s, items, n);
    return e;
}

fx_err fx_kv_put(fx_kv_store *s, fx_slice key, fx_slice value, const fx_kv_put_opts *opts,
                 int timeout_ms)
{
    fx_kv_item it = {key, value};
    return fx_kv_put_many(s, &it, 1, opts, timeout_ms);
}

fx_err fx_kv_get(fx_kv_store *s, fx_slice key, fx_bytes *out, int timeout_ms)
{
    int t = 0;
    if (!out) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    *out = (fx_bytes){0};
    if (!s || key.len == 0 || !key.data) return fx_seterr(FX_EINVAL, "kv: NULL store or empty key");
    fx_err e = kv_timeout(s, timeout_ms, &t);
    return e ? e : s->ops->get(s->self, key, out, t);
}

fx_err fx_kv_get_range(fx_kv_store *s, fx_slice start, fx_slice end, int64_t limit,
                       fx_range_resp *out, int timeout_ms)
{
    int t = 0;
    if (!out) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    memset(out, 0, sizeof *out);
    if (!s || !slice_ok(start) || !slice_ok(end) || limit < 0)
        return fx_seterr(FX_EINVAL, "kv: bad range arguments");
    fx_err e = kv_timeout(s, timeout_ms, &t);
    return e ? e : s->ops->get_range(s->self, start, end, limit, out, t);
}

fx_err fx_kv_get_range_lease(fx_kv_store *s, int64_t lease_id, fx_slice start, fx_slice end,
                             int64_t limit, fx_range_resp *out, int timeout_ms)
{
    int t = 0;
    if (!out) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    memset(out, 0, sizeof *out);
    if (!s || !slice_ok(start) || !slice_ok(end) || limit < 0 || lease_id < 0)
        return fx_seterr(FX_EINVAL, "kv: bad range arguments");
    fx_err e = kv_timeout(s, timeout_ms, &t);
    if (e) return e;
    if (!s->ops->get_range_lease || lease_id == 0)
        return s->ops->get_range(s->self, start, end, limit, out, t);
    return s->ops->get_range_lease(s->self, lease_id, start, end, limit, out, t);
}

fx_err fx_kv_delete_range(fx_kv_store *s, fx_slice start, fx_slice end, int64_t *out_deleted,
                          int timeout_ms)
{
    int t = 0;
    int64_t n = 0;
    if (out_deleted) *out_deleted = 0;
    if (!s || !slice_ok(start) || !slice_ok(end))
        return fx_seterr(FX_EINVAL, "kv: bad range arguments");
    fx_err e = kv_timeout(s, timeout_ms, &t);
    if (e) return e;
    e = s->ops->delete_range(s->self, start, end, &n, t);
    if (e == FX_OK && out_deleted) *out_deleted = n;
    return e;
}

fx_err fx_kv_delete(fx_kv_store *s, fx_slice key, int timeout_ms)
{
    uint8_t small[KV_SMALL_KEY];
    if (!s || key.len == 0 || !key.data) return fx_seterr(FX_EINVAL, "kv: NULL store or empty key");
    /* [key, key"\0") is exactly {key}. */
    uint8_t *end = key.len + 1 <= sizeof small ? small : malloc(key.len + 1);
    if (!end) return fx_seterr(FX_ENOMEM, "kv: out of memory");
    memcpy(end, key.data, key.len);
    end[key.len] = 0;
    fx_err e = fx_kv_delete_range(s, key, (fx_slice){end, key.len + 1}, NULL, timeout_ms);
    if (end != small) free(end);
    return e;
}

fx_err fx_kv_count_prefix(fx_kv_store *s, fx_slice prefix, int64_t *out_count, int timeout_ms)
{
    int t = 0;
    if (!out_count) return fx_seterr(FX_EINVAL, "kv: NULL argument");
    *out_count = 0;
    if (!s || !slice_ok(prefix)) return fx_seterr(FX_EINVAL, "kv: bad arguments");
    fx_err e = kv_timeout(s, timeout_ms, &t);
    return e ? e : s->ops->count_prefix(s->self, prefix, out_count, t);
}

/* ---- etcd backend ---------------------------------------------------------------------------- */

typedef struct kv_etcd {
    fx_etcd *c;
    bool owned;
    char *prefix;
    size_t plen;
} kv_etcd;

/* prefix + rel (+ optional extra trailing bytes of room), on the stack when small. */
typedef struct kbuf {
    uint8_t *p;
    size_t len;
    uint8_t small[KV_SMALL_KEY];
} kbuf;

static fx_err kbuf_make(kbuf *b, const kv_etcd *k, fx_slice rel)
{
    size_t need = k->plen + rel.len;
    b->p = need <= sizeof b->small ? b->small : malloc(need ? need : 1);
    if (!b->p) return fx_seterr(FX_ENOMEM, "kv: out of memory");
    memcpy(b->p, k->prefix, k->plen);
    if (rel.len) memcpy(b->p + k->plen, rel.data, rel.len);
    b->len = need;
    return FX_OK;
}

static void kbuf_done(kbuf *b)
{
    if (b->p && b->p != b->small) free(b->p);
    b->p = NULL;
}

static fx_slice kbuf_slice(const kbuf *b) { return (fx_slice){b->p, b->len}; }

/* Range end in etcd terms for a relative [start, end): prefix+end, or the prefix end of
 * prefix+start when end is empty. `full_start` is prefix+start. */
static fx_err kv_etcd_end(const kv_etcd *k, const kbuf *full_start, fx_slice end, kbuf *out)
{
    if (end.len) return kbuf_make(out, k, end);
    out->p = full_start->len <= sizeof out->small ? out->small : malloc(full_start->len);
    if (!out->p) return fx_seterr(FX_ENOMEM, "kv: out of memory");
    out->len = fx_prefix_end(kbuf_slice(full_start), out->p);
    return FX_OK;
}

static fx_err kv_etcd_allocate_lease(void *self, int64_t ttl_s, int64_t *out_id, int timeout_ms)
{
    kv_etcd *k = self;
    return fx_etcd_lease_grant(k->c, ttl_s, 0, out_id, NULL, timeout_ms);
}

static fx_err kv_etcd_keepalive_lease(void *self, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    kv_etcd *k = self;
    return fx_etcd_lease_keepalive_lane(k->c, id, out_ttl, timeout_ms);
}

static fx_err kv_etcd_put_many(void *self, const fx_kv_item *items, size_t n,
                               const fx_kv_put_opts *o, int timeout_ms)
{
    kv_etcd *k = self;
    fx_err e;
    if (n == 1) {
        kbuf kb;
        if ((e = kbuf_make(&kb, k, items[0].key))) return e;
        fx_put_req req = {.key = kbuf_slice(&kb), .value = items[0].value, .lease = o->lease_id};
        e = fx_etcd_put(k->c, &req, NULL, timeout_ms);
        kbuf_done(&kb);
    } else {
        size_t total = 0;
        for (size_t i = 0; i < n; i++) total += k->plen + items[i].key.len;
        uint8_t *keys = malloc(total);
        fx_op *ops = calloc(n, sizeof *ops);
        if (!keys || !ops) {
            free(keys);
            free(ops);
            return fx_seterr(FX_ENOMEM, "kv: out of memory");
        }
        uint8_t *p = keys;
        for (size_t i = 0; i < n; i++) {
            memcpy(p, k->prefix, k->plen);
            memcpy(p + k->plen, items[i].key.data, items[i].key.len);
            ops[i].type = FX_OP_PUT;
            ops[i].u.put.key = (fx_slice){p, k->plen + items[i].key.len};
            ops[i].u.put.value = items[i].value;
            ops[i].u.put.lease = o->lease_id;
            p += k->plen + items[i].key.len;
        }
        fx_txn_req req = {.success = ops, .n_success = n};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(k->c, &req, &resp, timeout_ms);
        if (e == FX_OK && !resp.succeeded)
            e = fx_seterr(FX_EPROTO, "kv: txn without compares reported failure");
        fx_txn_resp_free(&resp);
        free(ops);
        free(keys);
    }
    if (o->lease_id != 0 && (e == FX_ENOTFOUND || e == FX_ELEASE_EXPIRED))
        e = fx_err_wrap(FX_ELEASE_EXPIRED, "kv: put with lease %lld: ", (long long)o->lease_id);
    return e;
}

static fx_err kv_etcd_get(void *self, fx_slice key, fx_bytes *out, int timeout_ms)
{
    kv_etcd *k = self;
    kbuf kb;
    fx_kv kv = {0};
    fx_err e = kbuf_make(&kb, k, key);
    if (e) return e;
    e = fx_etcd_get(k->c, kbuf_slice(&kb), &kv, timeout_ms);
    kbuf_done(&kb);
    if (e == FX_OK) {
        *out = kv.value;
        kv.value = (fx_bytes){0};
    }
    fx_kv_free(&kv);
    return e;
}

/* The prefixed start key and range end of [start, end) (kv_etcd_end rules); both released
 * with kbuf_done on success, nothing held on error. */
static fx_err kbuf_range(kv_etcd *k, fx_slice start, fx_slice end, kbuf *ks, kbuf *ke)
{
    fx_err e = kbuf_make(ks, k, start);
    if (e) return e;
    if ((e = kv_etcd_end(k, ks, end, ke))) kbuf_done(ks);
    return e;
}

static fx_err kv_etcd_get_range(void *self, fx_slice start, fx_slice end, int64_t limit,
                                fx_range_resp *out, int timeout_ms)
{
    kv_etcd *k = self;
    kbuf ks, ke;
    fx_err e = kbuf_range(k, start, end, &ks, &ke);
    if (e) return e;
    fx_range_req req = {.key = kbuf_slice(&ks), .range_end = kbuf_slice(&ke), .limit = limit,
                        .sort_order = FX_SORT_ASCEND, .sort_target = FX_SORT_KEY};
    e = fx_etcd_range(k->c, &req, out, timeout_ms);
    kbuf_done(&ks);
    kbuf_done(&ke);
    if (e) return e;
    for (size_t i = 0; i < out->n_kvs; i++) {
        fx_bytes *kb = &out->kvs[i].key;
        if (kb->len < k->plen || memcmp(kb->data, k->prefix, k->plen) != 0) {
            fx_range_resp_free(out);
            memset(out, 0, sizeof *out);
            return fx_seterr(FX_EPROTO, "kv: range returned a key outside the prefix");
        }
        memmove(kb->data, kb->data + k->plen, kb->len - k->plen);
        kb->len -= k->plen;
        kb->data[kb->len] = 0;
    }
    return FX_OK;
}

static fx_err kv_etcd_delete_range(void *self, fx_slice start, fx_slice end, int64_t *out_deleted,
                                   int timeout_ms)
{
    kv_etcd *k = self;
    kbuf ks, ke;
    fx_err e = kbuf_range(k, start, end, &ks, &ke);
    if (e) return e;
    fx_del_req req = {.key = kbuf_slice(&ks), .range_end = kbuf_slice(&ke)};
    fx_del_resp resp = {0};
    e = fx_etcd_delete(k->c, &req, &resp, timeout_ms);
    kbuf_done(&ks);
    kbuf_done(&ke);
    if (e == FX_OK) *out_deleted = resp.deleted;
    fx_del_resp_free(&resp);
    return e;
}

static fx_err kv_etcd_count_prefix(void *self, fx_slice prefix, int64_t *out_count,
                                   int timeout_ms)
{
    kv_etcd *k = self;
    kbuf ks, ke;
    fx_err e = kbuf_make(&ks, k, prefix);
    if (e) return e;
    if ((e = kv_etcd_end(k, &ks, (fx_slice){NULL, 0}, &ke))) {
        kbuf_done(&ks);
        return e;
    }
    fx_range_req req = {.key = kbuf_slice(&ks), .range_end = kbuf_slice(&ke), .count_only = true};
    fx_range_resp resp = {0};
    e = fx_etcd_range(k->c, &req, &resp, timeout_ms);
    kbuf_done(&ks);
    kbuf_done(&ke);
    if (e == FX_OK) *out_count = resp.count;
    fx_range_resp_free(&resp);
    return e;
}

static void kv_etcd_destroy(void *self)
{
    kv_etcd *k = self;
    if (!k) return;
    if (k->owned) fx_etcd_free(k->c);
    free(k->prefix);
    free(k);
}

static const fx_kv_ops kv_etcd_ops = {
    .allocate_lease = kv_etcd_allocate_lease,
    .keepalive_lease = kv_etcd_keepalive_lease,
    .put_many = kv_etcd_put_many,
    .get = kv_etcd_get,
    .get_range = kv_etcd_get_range,
    .delete_range = kv_etcd_delete_range,
    .count_prefix = kv_etcd_count_prefix,
    .destroy = kv_etcd_destroy,
};

static fx_err kv_etcd_make(fx_etcd *c, bool owned, const char *prefix, int default_timeout_ms,
                           fx_kv_store **out)
{
    kv_etcd *k = calloc(1, sizeof *k);
    if (!k || !(k->prefix = strdup(prefix))) {
        free(k);
        return fx_seterr(FX_ENOMEM, "kv: out of memory");
    }
    k->c = c;
    k->plen = strlen(prefix);
    const char *euid = fx_etcd_uid(c);
    size_t ulen = strlen(euid) + 5;
    char *uid = malloc(ulen);
    if (!uid) {
        free(k->prefix);
        free(k);
        return fx_seterr(FX_ENOMEM, "kv: out of memory");
    }
    snprintf(uid, ulen, "kv(%s)", euid);
    fx_err e = kv_store_new(&kv_etcd_ops, k, uid, prefix, c, default_timeout_ms, out);
    free(uid);
    if (e) {
        free(k->prefix);
        free(k);
        return e;
    }
    k->owned = owned; /* only now: on failure the caller still owns c */
    return FX_OK;
}

fx_err fx_kv_new_etcd(const fx_kv_etcd_opts *opts, fx_kv_store **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "kv: NULL out");
    *out = NULL;
    if (!opts || !opts->prefix || !opts->prefix[0])
        return fx_seterr(FX_EINVAL, "kv: a non-empty prefix is required");
    fx_etcd *c = NULL;
    fx_err e = fx_etcd_new(&opts->etcd, &c);
    if (e) return e;
    e = kv_etcd_make(c, true, opts->prefix, opts->default_timeout_ms, out);
    if (e) fx_etcd_free(c);
    return e;
}

fx_err fx_kv_new_etcd_shared(fx_etcd *client, const char *prefix, int default_timeout_ms,
                             fx_kv_store **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "kv: NULL out");
    *out = NULL;
    if (!client || !prefix || !prefix[0])
        return fx_seterr(FX_EINVAL, "kv: a client and a non-empty prefix are required");
    return kv_etcd_make(client, false, prefix, default_timeout_ms, out);
}
