/* idalloc.c -- etcd CAS id counters, cluster leases, lease registration helpers (mq_int.h).
 *
 * CAS counter (the reference implementation's, with its re-read fixed): the value is the last allocated
 * id; allocating n moves it from old to old+n and returns old+1 (ids start at 1). One txn per
 * attempt: compare (create==0 when absent, else value==old), put the new value; the failure
 * branch reads the key back, so a lost race costs no extra round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "mq_int.h"

#define CAS_ATTEMPTS 100
#define CLUSTER_LEASE_ATTEMPTS 5

/* Current value of a counter from a range response: *present, *val. */
static fx_err counter_from(const fx_range_resp *r, bool *present, int64_t *val, fx_bytes *raw)
{
    *present = false;
    *val = 0;
    if (!r || r->n_kvs == 0) return FX_OK;
    fx_err e = fx_mq_counter_decode(r->kvs[0].value.data, r->kvs[0].value.len, val);
    if (e) return e;
    *present = true;
    if (raw) {
        fx_bytes_free(raw);
        raw->data = malloc(r->kvs[0].value.len + 1);
        if (!raw->data) return fx_seterr(FX_ENOMEM, "id allocator: out of memory");
        memcpy(raw->data, r->kvs[0].value.data, r->kvs[0].value.len);
        raw->data[r->kvs[0].value.len] = 0;
        raw->len = r->kvs[0].value.len;
    }
    return FX_OK;
}

static fx_err alloc_ids(fx_mq_client *c, const fx_mq_key *key, int64_t lease, int64_t n,
                        bool fresh, int64_t *first)
{
    if (!c || !key || !first || n < 1 || lease < 0)
        return fx_seterr(FX_EINVAL, "id allocator: bad arguments");
    fx_slice k = fx_mq_key_slice(key);
    bool present = false;
    int64_t old = 0;
    fx_bytes raw = {0};
    fx_err e = FX_OK;
    if (!fresh) {
        fx_range_req rq = {.key = k};
        fx_range_resp rr = {0};
        if ((e = fx_etcd_range(c->etcd, &rq, &rr, c->op_timeout_ms))) return e;
        e = counter_from(&rr, &present, &old, &raw);
        fx_range_resp_free(&rr);
        if (e) goto out;
    }
    for (int attempt = 0; attempt < CAS_ATTEMPTS; attempt++) {
        if (old > INT64_MAX - n) {
            e = fx_seterr(FX_EPROTO, "id allocator %s: counter exhausted", key->s);
            goto out;
        }
        char nv[FX_MQ_DEC_BUF];
        size_t nl = fx_mq_dec_format(old + n, nv);
        fx_cmp cmp = present ? (fx_cmp){.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL, .key = k,
                                        .value = {raw.data, raw.len}}
                             : (fx_cmp){.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = k,
                                        .num = 0};
        fx_op put = {.type = FX_OP_PUT, .u.put = {.key = k, .value = {nv, nl}, .lease = lease}};
        fx_op get = {.type = FX_OP_RANGE, .u.range = {.key = k}};
        fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1,
                         .failure = &get, .n_failure = 1};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
        if (e) {
            fx_txn_resp_free(&resp);
            goto out;
        }
        if (resp.succeeded) {
            fx_txn_resp_free(&resp);
            *first = old + 1;
            goto out;
        }
        /* Lost the race: the failure branch carries the current value. */
        const fx_range_resp *cur =
            resp.n_responses == 1 && resp.responses[0].type == FX_OP_RANGE
                ? &resp.responses[0].u.range
                : NULL;
        if (!cur) {
            fx_txn_resp_free(&resp);
            e = fx_seterr(FX_EPROTO, "id allocator %s: txn failure without a range", key->s);
            goto out;
        }
        e = counter_from(cur, &present, &old, &raw);
        fx_txn_resp_free(&resp);
        if (e) goto out;
    }
    e = fx_seterr(FX_ETIMEDOUT, "id allocator %s: %d CAS attempts lost", key->s, CAS_ATTEMPTS);
out:
    fx_bytes_free(&raw);
    return e;
}

fx_err fx__mq_alloc_ids(fx_mq_client *c, const fx_mq_key *key, int64_t lease, int64_t n,
                        int64_t *first)
{
    return alloc_ids(c, key, lease, n, false, first);
}

fx_err fx__mq_alloc_ids_fresh(fx_mq_client *c, const fx_mq_key *key, int64_t lease, int64_t n,
                              int64_t *first)
{
    return alloc_ids(c, key, lease, n, true, first);
}

fx_err fx__mq_grant(fx_mq_client *c, int64_t ttl_s, int64_t *id)
{
    if (!c || !id || ttl_s < 1) return fx_seterr(FX_EINVAL, "lease grant: bad arguments");
    return fx_etcd_lease_grant(c->etcd, ttl_s, 0, id, NULL, c->op_timeout_ms);
}

fx_err fx__mq_cluster_lease(fx_mq_client *c, const fx_mq_key *key, int64_t ttl_s, int64_t *id,
                            bool *granted)
{
    if (!c || !key || !id || ttl_s < 1) return fx_seterr(FX_EINVAL, "cluster lease: bad arguments");
    if (granted) *granted = false;
    fx_slice k = fx_mq_key_slice(key);
    fx_err e;
    for (int attempt = 0; attempt < CLUSTER_LEASE_ATTEMPTS; attempt++) {
        fx_kv kv = {0};
        e = fx_etcd_get(c->etcd, k, &kv, c->op_timeout_ms);
        if (e == FX_OK) {
            e = fx_mq_lease_id_decode(kv.value.data, kv.value.len, id);
            fx_kv_free(&kv);
            return e; /* reused; registration validates it */
        }
        fx_kv_free(&kv);
        if (e != FX_ENOTFOUND) return e;
        int64_t lid = 0;
        if ((e = fx__mq_grant(c, ttl_s, &lid))) return e;
        char v[FX_MQ_DEC_BUF];
        size_t vl = fx_mq_dec_format(lid, v);
        fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = k, .num = 0};
        fx_op put = {.type = FX_OP_PUT, .u.put = {.key = k, .value = {v, vl}, .lease = lid}};
        fx_op get = {.type = FX_OP_RANGE, .u.range = {.key = k}};
        fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1,
                         .failure = &get, .n_failure = 1};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
        if (e == FX_OK && resp.succeeded) {
            fx_txn_resp_free(&resp);
            *id = lid;
            if (granted) *granted = true;
            return FX_OK;
        }
        /* Lost (or failed): our fresh lease guards nothing; revoke it (best effort). */
        fx_err re = fx_etcd_lease_revoke(c->etcd, lid, c->op_timeout_ms);
        if (re && re != FX_ENOTFOUND)
            FX_DBG("cluster lease %s: revoke of unused lease %lld: %s", key->s, (long long)lid,
                   fx_errname(re));
        if (e) {
            fx_txn_resp_free(&resp);
            return e;
        }
        if (resp.n_responses == 1 && resp.responses[0].type == FX_OP_RANGE &&
            resp.responses[0].u.range.n_kvs == 1) {
            const fx_kv *w = &resp.responses[0].u.range.kvs[0];
            e = fx_mq_lease_id_decode(w->value.data, w->value.len, id);
            fx_txn_resp_free(&resp);
            return e;
        }
        fx_txn_resp_free(&resp); /* the winner's key expired meanwhile: try again */
    }
    return fx_seterr(FX_ETIMEDOUT, "cluster lease %s: no stable winner after %d attempts", key->s,
                     CLUSTER_LEASE_ATTEMPTS);
}

static fx_err hold(fx_mq_client *c, bool kv_backend, int64_t ttl_s, int64_t id, bool skip_probe,
                   bool join_held, fx_lease_expired_fn on_expired, void *arg, fx_lease **out)
{
    if (!c || !out) return fx_seterr(FX_EINVAL, "lease hold: bad arguments");
    *out = NULL;
    if (!c->leases) return fx_seterr(FX_ECLOSED, "lease hold: client closed");
    fx_lease_reg_opts o = {.skip_probe = skip_probe, .join_held = join_held,
                           .on_expired = on_expired, .arg = arg};
    fx_err e = fx_lease_register(c->leases, kv_backend ? &c->kv_backend : &c->etcd_backend, ttl_s,
                                 id, &o, out);
    if (e)
        return fx_err_wrap(e, "%s lease %lld (ttl %lld s): ", kv_backend ? "kv" : "etcd",
                           (long long)id, (long long)ttl_s);
    return FX_OK;
}

fx_err fx__mq_hold(fx_mq_client *c, bool kv_backend, int64_t ttl_s, int64_t id, bool skip_probe,
                   fx_lease_expired_fn on_expired, void *arg, fx_lease **out)
{
    return hold(c, kv_backend, ttl_s, id, skip_probe, false, on_expired, arg, out);
}

fx_err fx__mq_hold_shared(fx_mq_client *c, bool kv_backend, int64_t ttl_s, int64_t id,
                          fx_lease_expired_fn on_expired, void *arg, fx_lease **out)
{
    return hold(c, kv_backend, ttl_s, id, false, true, on_expired, arg, out);
}
