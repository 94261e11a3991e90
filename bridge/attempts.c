/* attempts.c -- persisted delivery attempts per sub-MPSC (see attempts.h). */
#include "attempts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "keys.h"
#include "meta.h"
#include "mq_int.h"

#define MAGIC "FXA1"

struct fx_attempts {
    fx_mq_client *c;
    fx_etcd *etcd;
    char key[FX_ATTEMPTS_KEY_CAP];
    size_t klen;
    int64_t lease;
    /* inherited record, exceptions sorted by (pidx, msg); taken ones have n = UINT32_MAX */
    fx_attempts_rec in;
    /* per producer: highest id published at least once (inherited, then raised) and the first
     * id this consumer fetched (inherited exceptions below it are committed) */
    int64_t *p_pidx, *p_hi, *p_floor;
    size_t np, p_cap;
    /* the last value written (or read), for "changed?" */
    uint8_t *last;
    size_t last_len;
    uint8_t *buf;
    size_t buf_cap;
    fx_attempt *exc; /* scratch for save */
    size_t exc_cap;
    fx_attempts_stats st;
    const fx_mpmc_consumer *owner; /* NULL: unfenced, unpruned */
    fx_mq_key fence;               /* owner's membership key */
    int64_t fence_rev;             /* its create revision */
    int64_t *cbuf;                 /* prune scratch: committed offsets */
    size_t cbuf_cap;
    size_t prune_at; /* prune when np reaches this */
};

/* ---- codec ----------------------------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_i64(uint8_t *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(u >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static int64_t get_i64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return (int64_t)v;
}

size_t fx_attempts_encoded_size(const fx_attempts_rec *r)
{
    return 4 + 4 + r->nh * 16 + 4 + r->ne * 20;
}

size_t fx_attempts_encode(const fx_attempts_rec *r, uint8_t *out, size_t cap)
{
    size_t need = fx_attempts_encoded_size(r);
    if (need > cap || r->nh > UINT32_MAX || r->ne > UINT32_MAX) return 0;
    uint8_t *p = out;
    memcpy(p, MAGIC, 4);
    p += 4;
    put_u32(p, (uint32_t)r->nh);
    p += 4;
    for (size_t i = 0; i < r->nh; i++, p += 16) {
        put_i64(p, r->hi_pidx[i]);
        put_i64(p + 8, r->hi[i]);
    }
    put_u32(p, (uint32_t)r->ne);
    p += 4;
    for (size_t i = 0; i < r->ne; i++, p += 20) {
        put_i64(p, r->exc[i].pidx);
        put_i64(p + 8, r->exc[i].msg);
        put_u32(p + 16, r->exc[i].n);
    }
    return need;
}

void fx_attempts_rec_free(fx_attempts_rec *r)
{
    free(r->hi_pidx);
    free(r->hi);
    free(r->exc);
    memset(r, 0, sizeof *r);
}

static int cmp_att(const void *a, const void *b)
{
    const fx_attempt *x = a, *y = b;
    if (x->pidx != y->pidx) return x->pidx < y->pidx ? -1 : 1;
    if (x->msg != y->msg) return x->msg < y->msg ? -1 : 1;
    return 0;
}

fx_err fx_attempts_decode(const uint8_t *p, size_t len, fx_attempts_rec *out)
{
    memset(out, 0, sizeof *out);
    if (len < 12 || memcmp(p, MAGIC, 4) != 0) return fx_seterr(FX_EPROTO, "attempts: bad magic");
    size_t nh = get_u32(p + 4);
    if (nh > FX_ATTEMPTS_MAX_PRODUCERS || len < 12 + nh * 16)
        return fx_seterr(FX_EPROTO, "attempts: bad producer count %zu", nh);
    size_t ne = get_u32(p + 8 + nh * 16);
    if (ne > FX_ATTEMPTS_MAX_EXC || len != 12 + nh * 16 + ne * 20)
        return fx_seterr(FX_EPROTO, "attempts: bad length %zu", len);
    out->hi_pidx = calloc(nh ? nh : 1, sizeof *out->hi_pidx);
    out->hi = calloc(nh ? nh : 1, sizeof *out->hi);
    out->exc = calloc(ne ? ne : 1, sizeof *out->exc);
    if (!out->hi_pidx || !out->hi || !out->exc) {
        fx_attempts_rec_free(out);
        return fx_seterr(FX_ENOMEM, "attempts: out of memory");
    }
    const uint8_t *q = p + 8;
    for (size_t i = 0; i < nh; i++, q += 16) {
        out->hi_pidx[i] = get_i64(q);
        out->hi[i] = get_i64(q + 8);
    }
    q += 4;
    for (size_t i = 0; i < ne; i++, q += 20)
        out->exc[i] = (fx_attempt){get_i64(q), get_i64(q + 8), get_u32(q + 16)};
    out->nh = nh;
    out->ne = ne;
    return FX_OK;
}

/* ---- state ------------------------------------------------------------------------------------- */

static ssize_t prod_find(const fx_attempts *a, int64_t pidx)
{
    for (size_t i = 0; i < a->np; i++)
        if (a->p_pidx[i] == pidx) return (ssize_t)i;
    return -1;
}

#define PRUNE_MIN 64

/* Inherited exceptions of pidx: taken (they are committed). in.exc is sorted by (pidx, msg). */
static void drop_inherited(fx_attempts *a, int64_t pidx)
{
    size_t lo = 0, hi = a->in.ne;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->in.exc[mid].pidx < pidx) lo = mid + 1;
        else hi = mid;
    }
    for (size_t i = lo; i < a->in.ne && a->in.exc[i].pidx == pidx; i++) a->in.exc[i].n = UINT32_MAX;
}

/* Drop the producer entries whose every published id is committed by the owner (see the
 * header). One lock of the owner, no I/O. */
static void prune(fx_attempts *a)
{
    if (!a->owner || !a->np) return;
    if (a->np > a->cbuf_cap) {
        int64_t *nb = realloc(a->cbuf, a->np * sizeof *nb);
        if (!nb) return; /* out of memory: no prune this time */
        a->cbuf = nb;
        a->cbuf_cap = a->np;
    }
    fx__mpmc_consumer_committed(a->owner, a->p_pidx, a->np, a->cbuf);
    for (size_t i = 0; i < a->np;) {
        if (a->p_hi[i] < a->cbuf[i]) {
            drop_inherited(a, a->p_pidx[i]);
            size_t l = --a->np;
            a->p_pidx[i] = a->p_pidx[l];
            a->p_hi[i] = a->p_hi[l];
            a->p_floor[i] = a->p_floor[l];
            a->cbuf[i] = a->cbuf[l];
            a->st.pruned++;
        } else {
            i++;
        }
    }
    a->prune_at = a->np * 2 > PRUNE_MIN ? a->np * 2 : PRUNE_MIN;
}

/* The producer's slot, created (hi -1: nothing published; floor INT64_MAX: nothing fetched).
 * -1 when the bound is reached (after a prune). */
static ssize_t prod_slot(fx_attempts *a, int64_t pidx)
{
    ssize_t i = prod_find(a, pidx);
    if (i >= 0) return i;
    if (a->np >= FX_ATTEMPTS_MAX_PRODUCERS) prune(a);
    if (a->np >= FX_ATTEMPTS_MAX_PRODUCERS) {
        a->st.dropped++;
        return -1;
    }
    if (a->np == a->p_cap) {
        size_t nc = a->p_cap ? a->p_cap * 2 : 8;
        int64_t *x = realloc(a->p_pidx, nc * sizeof *x);
        if (!x) return -1;
        a->p_pidx = x;
        x = realloc(a->p_hi, nc * sizeof *x);
        if (!x) return -1;
        a->p_hi = x;
        x = realloc(a->p_floor, nc * sizeof *x);
        if (!x) return -1;
        a->p_floor = x;
        a->p_cap = nc;
    }
    a->p_pidx[a->np] = pidx;
    a->p_hi[a->np] = -1;
    a->p_floor[a->np] = INT64_MAX;
    return (ssize_t)a->np++;
}

fx_err fx_attempts_open(fx_mq_client *c, int64_t chan, const fx_mpmc_consumer *owner,
                        int timeout_ms, fx_attempts **out)
{
    *out = NULL;
    if (owner && fx_mpmc_consumer_chan(owner) != chan)
        return fx_seterr(FX_EINVAL, "attempts: the owner is bound to sub-MPSC %" PRId64 ", not %"
                         PRId64, fx_mpmc_consumer_chan(owner), chan);
    fx_mq_keys keys;
    fx_mq_key mk;
    fx_err e = fx_mq_keys_init(&keys, fx_mq_client_root(c));
    if (!e) e = fx_mq_key_chan_meta(&keys, chan, &mk);
    if (e) return e;
    fx_attempts *a = calloc(1, sizeof *a);
    if (!a) return fx_seterr(FX_ENOMEM, "attempts: out of memory");
    a->prune_at = PRUNE_MIN;
    if (owner) {
        a->owner = owner;
        if ((e = fx__mpmc_consumer_fence(owner, &a->fence, &a->fence_rev))) {
            free(a);
            return e;
        }
    }
    a->c = c;
    a->etcd = fx_mq_client_etcd(c);
    int kl = snprintf(a->key, sizeof a->key, "%s/attempts/%" PRId64, fx_mq_client_root(c), chan);
    if (kl < 0 || (size_t)kl >= sizeof a->key) {
        free(a);
        return fx_seterr(FX_EINVAL, "attempts: key too long");
    }
    a->klen = (size_t)kl;
    /* The sub-MPSC meta (for its lease) and the record, in one read. */
    fx_op ops[2] = {{.type = FX_OP_RANGE}, {.type = FX_OP_RANGE}};
    ops[0].u.range.key = fx_mq_key_slice(&mk);
    ops[1].u.range.key = (fx_slice){a->key, a->klen};
    fx_txn_req t = {.success = ops, .n_success = 2};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(a->etcd, &t, &r, timeout_ms);
    if (!e && r.n_responses != 2) e = fx_seterr(FX_EPROTO, "attempts: %zu responses", r.n_responses);
    if (!e && r.responses[0].u.range.n_kvs != 1)
        e = fx_seterr(FX_ENOTFOUND, "attempts: sub-MPSC %" PRId64 " has no meta", chan);
    if (!e) {
        fx_mq_chan_meta m;
        const fx_kv *kv = &r.responses[0].u.range.kvs[0];
        e = fx_mq_chan_meta_decode(kv->value.data, kv->value.len, &m);
        if (!e) a->lease = m.global_lease_id;
    }
    if (!e && r.responses[1].u.range.n_kvs == 1) {
        const fx_kv *kv = &r.responses[1].u.range.kvs[0];
        if (fx_attempts_decode(kv->value.data, kv->value.len, &a->in) == FX_OK) {
            if (a->in.ne > 1) qsort(a->in.exc, a->in.ne, sizeof *a->in.exc, cmp_att);
            for (size_t i = 0; i < a->in.nh; i++) {
                ssize_t s = prod_slot(a, a->in.hi_pidx[i]);
                if (s >= 0 && a->in.hi[i] > a->p_hi[s]) a->p_hi[s] = a->in.hi[i];
            }
            a->last = malloc(kv->value.len);
            if (a->last) {
                memcpy(a->last, kv->value.data, kv->value.len);
                a->last_len = kv->value.len;
            }
        } else {
            a->st.dropped++; /* unreadable: treated as empty, rewritten by the next save */
        }
    }
    fx_txn_resp_free(&r);
    if (e) {
        fx_attempts_free(a);
        return e;
    }
    prune(a); /* entries the owner's resume points show committed */
    *out = a;
    return FX_OK;
}

void fx_attempts_free(fx_attempts *a)
{
    if (!a) return;
    fx_attempts_rec_free(&a->in);
    free(a->p_pidx);
    free(a->p_hi);
    free(a->p_floor);
    free(a->last);
    free(a->buf);
    free(a->exc);
    free(a->cbuf);
    free(a);
}

void fx_attempts_get_stats(const fx_attempts *a, fx_attempts_stats *out) { *out = a->st; }

uint32_t fx_attempts_take(fx_attempts *a, int64_t pidx, int64_t msg)
{
    ssize_t s = prod_slot(a, pidx);
    if (s >= 0 && msg < a->p_floor[s]) a->p_floor[s] = msg;
    fx_attempt key = {pidx, msg, 0};
    fx_attempt *hit = a->in.ne ? bsearch(&key, a->in.exc, a->in.ne, sizeof key, cmp_att) : NULL;
    if (hit && hit->n != UINT32_MAX) {
        uint32_t n = hit->n;
        hit->n = UINT32_MAX;
        a->st.inherited++;
        return n;
    }
    if (s >= 0 && msg <= a->p_hi[s]) {
        a->st.inherited++;
        return 1;
    }
    return 0;
}

static bool exc_push(fx_attempts *a, size_t *ne, const fx_attempt *x)
{
    if (*ne >= FX_ATTEMPTS_MAX_EXC) {
        a->st.dropped++;
        return false;
    }
    if (*ne == a->exc_cap) {
        size_t nc = a->exc_cap ? a->exc_cap * 2 : 64;
        fx_attempt *ne2 = realloc(a->exc, nc * sizeof *ne2);
        if (!ne2) return false;
        a->exc = ne2;
        a->exc_cap = nc;
    }
    a->exc[(*ne)++] = *x;
    return true;
}

bool fx_attempts_build(fx_attempts *a, const fx_attempt *inflight, size_t n, const uint8_t **val,
                       size_t *len)
{
    if (a->owner && a->np >= a->prune_at) prune(a);
    /* raise hi over what has been published at least once */
    for (size_t i = 0; i < n; i++) {
        if (inflight[i].n == 0) continue;
        ssize_t s = prod_slot(a, inflight[i].pidx);
        if (s >= 0 && inflight[i].msg > a->p_hi[s]) a->p_hi[s] = inflight[i].msg;
    }
    size_t ne = 0;
    for (size_t i = 0; i < n; i++) {
        ssize_t s = prod_find(a, inflight[i].pidx);
        if (s < 0 || inflight[i].msg > a->p_hi[s] || inflight[i].n == 1) continue;
        exc_push(a, &ne, &inflight[i]);
    }
    for (size_t i = 0; i < a->in.ne; i++) { /* inherited, not fetched yet, not committed */
        const fx_attempt *x = &a->in.exc[i];
        if (x->n == UINT32_MAX || x->n == 1) continue;
        ssize_t s = prod_find(a, x->pidx);
        if (s >= 0 && x->msg < a->p_floor[s]) continue;
        exc_push(a, &ne, x);
    }
    if (ne > 1) qsort(a->exc, ne, sizeof *a->exc, cmp_att);
    fx_attempts_rec rec = {.hi_pidx = a->p_pidx, .hi = a->p_hi, .nh = a->np, .exc = a->exc, .ne = ne};
    size_t need = fx_attempts_encoded_size(&rec);
    if (need > a->buf_cap) {
        uint8_t *nb = realloc(a->buf, need);
        if (!nb) return false; /* out of memory: keep the last record */
        a->buf = nb;
        a->buf_cap = need;
    }
    size_t l = fx_attempts_encode(&rec, a->buf, a->buf_cap);
    if (l == a->last_len && a->last && memcmp(a->buf, a->last, l) == 0) return false;
    uint8_t *nl = realloc(a->last, l);
    if (!nl) return false;
    memcpy(nl, a->buf, l);
    a->last = nl;
    a->last_len = l;
    a->st.last_bytes = l;
    *val = a->last;
    *len = l;
    return true;
}

void fx_attempts_dest_of(const fx_attempts *a, fx_attempts_dest *out)
{
    memcpy(out->key, a->key, a->klen);
    out->klen = a->klen;
    out->lease = a->lease;
    out->flen = a->owner ? strlen(a->fence.s) : 0;
    if (out->flen) memcpy(out->fence, a->fence.s, out->flen);
    out->fence_rev = a->fence_rev;
}

/* One put; fenced: ONE txn compare(create(owner membership) == its bind's revision). */
fx_err fx_attempts_put(fx_mq_client *c, const fx_attempts_dest *d, const uint8_t *val,
                       size_t len, int timeout_ms)
{
    fx_etcd *etcd = fx_mq_client_etcd(c);
    fx_op put = {.type = FX_OP_PUT,
                 .u.put = {.key = {d->key, d->klen}, .value = {val, len}, .lease = d->lease}};
    if (!d->flen) return fx_etcd_put(etcd, &put.u.put, NULL, timeout_ms);
    fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL,
                  .key = {d->fence, d->flen}, .num = d->fence_rev};
    fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
    fx_txn_resp r = {0};
    fx_err e = fx_etcd_txn(etcd, &t, &r, timeout_ms);
    bool won = !e && r.succeeded;
    fx_txn_resp_free(&r);
    if (e) return e;
    if (!won)
        return fx_seterr(FX_ELEASE_LOST, "attempts %.*s: the writer's membership %.*s is gone "
                         "(member lease lost or sub-MPSC reclaimed): not written",
                         (int)d->klen, d->key, (int)d->flen, d->fence);
    return FX_OK;
}

fx_err fx_attempts_save(fx_attempts *a, const fx_attempt *inflight, size_t n, int timeout_ms,
                        bool *wrote)
{
    if (wrote) *wrote = false;
    const uint8_t *val = NULL;
    size_t len = 0;
    if (!fx_attempts_build(a, inflight, n, &val, &len)) return FX_OK;
    fx_attempts_dest d;
    fx_attempts_dest_of(a, &d);
    fx_err e = fx_attempts_put(a->c, &d, val, len, timeout_ms);
    if (e) {
        free(a->last); /* not written: the next build must not look unchanged */
        a->last = NULL;
        a->last_len = 0;
        return e;
    }
    a->st.writes++;
    if (wrote) *wrote = true;
    return FX_OK;
}
