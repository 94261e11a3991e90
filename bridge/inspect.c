/* inspect.c -- a read-only view of one channel as plain data (contract: inspect.h).
 *
 * Reads, all at the revision R of the name mapping, batched in read-only txns:
 *   txn 1: MPMC meta, mpsc_channels list, ready prefix, producer and consumer role prefixes;
 *   txn 2..: produce- and consume-offset prefixes and the consumer-membership count of up to
 *            INSPECT_SUBS_PER_TXN sub-MPSCs each (3 ops per sub-MPSC, under etcd's default limit
 *            of 128 ops per txn).
 * A compaction between the reads (FX_ECOMPACTED) restarts the read (INSPECT_ATTEMPTS).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "inspect.h"
#include "mq_int.h"

#define INSPECT_SUBS_PER_TXN 40
#define INSPECT_ATTEMPTS 3

typedef struct ready_ent {
    int64_t chan;
    int64_t owner;
} ready_ent;

void fx_mq_channel_info_free(fx_mq_channel_info *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_subs; i++) free(s->subs[i].producers);
    free(s->subs);
    free(s->producers);
    free(s->consumers);
    memset(s, 0, sizeof *s);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_ready(const void *a, const void *b)
{
    return cmp_i64(&((const ready_ent *)a)->chan, &((const ready_ent *)b)->chan);
}

static int cmp_prod(const void *a, const void *b)
{
    const fx_mq_producer_offsets *x = a, *y = b;
    return cmp_i64(&x->pidx, &y->pidx);
}

static fx_slice key_slice(const fx_mq_key *k) { return fx_mq_key_slice(k); }
static fx_slice kv_key(const fx_kv *kv) { return (fx_slice){kv->key.data, kv->key.len}; }

/* A prefix range op at revision rev; `end` receives the range end (FX_MQ_KEY_CAP bytes). */
static fx_op prefix_op(const fx_mq_key *prefix, uint8_t *end, int64_t rev)
{
    size_t el = fx_prefix_end(key_slice(prefix), end);
    fx_op op;
    memset(&op, 0, sizeof op);
    op.type = FX_OP_RANGE;
    op.u.range.key = key_slice(prefix);
    op.u.range.range_end = (fx_slice){end, el};
    op.u.range.limit = FX_MQ_INSPECT_RANGE_LIMIT;
    op.u.range.revision = rev;
    return op;
}

static fx_op key_op(const fx_mq_key *key, int64_t rev)
{
    fx_op op;
    memset(&op, 0, sizeof op);
    op.type = FX_OP_RANGE;
    op.u.range.key = key_slice(key);
    op.u.range.revision = rev;
    return op;
}

static fx_err run_txn(fx_mq_client *c, const fx_op *ops, size_t n, fx_txn_resp *r)
{
    fx_txn_req t = {.success = ops, .n_success = n};
    fx_err e = fx_etcd_txn(c->etcd, &t, r, c->op_timeout_ms);
    if (e) return e;
    if (!r->succeeded || r->n_responses != n) return fx_seterr(FX_EPROTO, "inspect: unexpected txn response");
    for (size_t i = 0; i < n; i++)
        if (r->responses[i].type != FX_OP_RANGE)
            return fx_seterr(FX_EPROTO, "inspect: unexpected txn response");
    return FX_OK;
}

/* Member ids of one role prefix, sorted. */
static fx_err parse_roles(fx_mq_client *c, const fx_range_resp *rr, int64_t mpmc, fx_mq_role want,
                          int64_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (rr->n_kvs == 0) return FX_OK;
    int64_t *ids = calloc(rr->n_kvs, sizeof *ids);
    if (!ids) return FX_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < rr->n_kvs; i++) {
        fx_mq_role role;
        int64_t m = -1, member = -1;
        if (fx_mq_parse_role_key(&c->keys, kv_key(&rr->kvs[i]), &role, &m, &member) != FX_OK ||
            role != want || m != mpmc)
            continue;
        ids[k++] = member;
    }
    qsort(ids, k, sizeof *ids, cmp_i64);
    *out = ids;
    *n = k;
    return FX_OK;
}

/* Merge produce offsets (po) and consume offsets (co) of sub-MPSC `sub` into its producer list. */
static fx_err parse_offsets(fx_mq_client *c, fx_mq_sub_mpsc_info *sub, const fx_range_resp *po,
                            const fx_range_resp *co)
{
    size_t cap = po->n_kvs + co->n_kvs;
    sub->producers = NULL;
    sub->n_producers = 0;
    sub->backlog = 0;
    if (cap == 0) return FX_OK;
    fx_mq_producer_offsets *p = calloc(cap, sizeof *p);
    if (!p) return FX_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < po->n_kvs; i++) {
        int64_t ch = -1, pidx = -1, v = 0;
        const fx_kv *kv = &po->kvs[i];
        if (fx_mq_parse_produce_offset_key(&c->keys, kv_key(kv), &ch, &pidx) != FX_OK ||
            ch != sub->chan_id || fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &v) != FX_OK) {
            FX_WRN("inspect: ignoring malformed produce offset of sub-MPSC %" PRId64, sub->chan_id);
            continue;
        }
        p[n++] = (fx_mq_producer_offsets){
            .pidx = pidx, .produce_offset = v, .consume_offset = FX_MQ_CONSUME_OFFSET_BEGIN};
    }
    qsort(p, n, sizeof *p, cmp_prod);
    size_t n_prod = n;
    for (size_t i = 0; i < co->n_kvs; i++) {
        int64_t ch = -1, pidx = -1, v = 0;
        const fx_kv *kv = &co->kvs[i];
        if (fx_mq_parse_consume_offset_key(&c->keys, kv_key(kv), &ch, &pidx) != FX_OK ||
            ch != sub->chan_id || fx_mq_consume_offset_decode(kv->value.data, kv->value.len, &v) != FX_OK) {
            FX_WRN("inspect: ignoring malformed consume offset of sub-MPSC %" PRId64, sub->chan_id);
            continue;
        }
        fx_mq_producer_offsets key = {.pidx = pidx};
        fx_mq_producer_offsets *hit = n_prod ? bsearch(&key, p, n_prod, sizeof *p, cmp_prod) : NULL;
        if (hit)
            hit->consume_offset = v;
        else
            p[n++] = (fx_mq_producer_offsets){
                .pidx = pidx, .produce_offset = FX_MQ_PRODUCE_OFFSET_BEGIN, .consume_offset = v};
    }
    qsort(p, n, sizeof *p, cmp_prod);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t b = p[i].produce_offset - p[i].consume_offset + 1;
        p[i].backlog = b > 0 ? b : 0;
        total += p[i].backlog;
    }
    sub->producers = p;
    sub->n_producers = n;
    sub->backlog = total;
    return FX_OK;
}


/* Offsets and consumer counts of subs[from, from+n) at revision rev, in one txn. */
static fx_err read_offsets(fx_mq_client *c, fx_mq_channel_info *s, size_t from, size_t n, int64_t rev)
{
    fx_err e = FX_OK;
    fx_mq_key *keys = calloc(3 * n, sizeof *keys);
    uint8_t(*ends)[FX_MQ_KEY_CAP] = calloc(3 * n, sizeof *ends);
    fx_op *ops = calloc(3 * n, sizeof *ops);
    fx_txn_resp r;
    memset(&r, 0, sizeof r);
    if (!keys || !ends || !ops) {
        e = FX_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n && !e; i++) {
        int64_t chan = s->subs[from + i].chan_id;
        e = fx_mq_prefix_produce_offsets(&c->keys, chan, &keys[3 * i]);
        if (!e) e = fx_mq_prefix_consume_offsets(&c->keys, chan, &keys[3 * i + 1]);
        if (!e) e = fx_mq_prefix_consumer_members(&c->keys, chan, &keys[3 * i + 2]);
        if (!e) {
            ops[3 * i] = prefix_op(&keys[3 * i], ends[3 * i], rev);
            ops[3 * i + 1] = prefix_op(&keys[3 * i + 1], ends[3 * i + 1], rev);
            ops[3 * i + 2] = prefix_op(&keys[3 * i + 2], ends[3 * i + 2], rev);
            ops[3 * i + 2].u.range.count_only = true;
        }
    }
    if (!e) e = run_txn(c, ops, 3 * n, &r);
    for (size_t i = 0; i < n && !e; i++) {
        const fx_range_resp *po = &r.responses[3 * i].u.range, *co = &r.responses[3 * i + 1].u.range;
        if (po->more || co->more) s->truncated = true;
        e = parse_offsets(c, &s->subs[from + i], po, co);
        s->subs[from + i].consumers = r.responses[3 * i + 2].u.range.count;
    }
out:
    fx_txn_resp_free(&r);
    free(ops);
    free(ends);
    free(keys);
    return e;
}

static fx_err read_once(fx_mq_client *c, const char *name, fx_mq_channel_info *s)
{
    memset(s, 0, sizeof *s);
    fx_mq_key uk;
    fx_err e = fx_mq_key_unique(&c->keys, name, &uk);
    if (e) return e;

    /* 1. The mapping; its revision pins every other read. */
    fx_range_req rq;
    memset(&rq, 0, sizeof rq);
    rq.key = key_slice(&uk);
    fx_range_resp rr;
    memset(&rr, 0, sizeof rr);
    if ((e = fx_etcd_range(c->etcd, &rq, &rr, c->op_timeout_ms))) return e;
    int64_t rev = rr.revision;
    s->revision = rev;
    if (rr.n_kvs == 0) {
        fx_range_resp_free(&rr);
        return FX_OK; /* not mapped */
    }
    e = fx_mq_id_decode(rr.kvs[0].value.data, rr.kvs[0].value.len, &s->mpmc_id);
    fx_range_resp_free(&rr);
    if (e) return e;
    s->mapped = true;

    /* 2. Meta, list, ready keys, role keys. */
    fx_mq_key mk, lk, rp, pp, cp;
    uint8_t rend[FX_MQ_KEY_CAP], pend[FX_MQ_KEY_CAP], cend[FX_MQ_KEY_CAP];
    e = fx_mq_key_mpmc_meta(&c->keys, s->mpmc_id, &mk);
    if (!e) e = fx_mq_key_mpmc_mpsc_channels(&c->keys, s->mpmc_id, &lk);
    if (!e) e = fx_mq_prefix_mpmc_ready(&c->keys, s->mpmc_id, &rp);
    if (!e) e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_PRODUCER, s->mpmc_id, &pp);
    if (!e) e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_CONSUMER, s->mpmc_id, &cp);
    if (e) return e;
    fx_op ops[5] = {key_op(&mk, rev), key_op(&lk, rev), prefix_op(&rp, rend, rev),
                    prefix_op(&pp, pend, rev), prefix_op(&cp, cend, rev)};
    fx_txn_resp r;
    memset(&r, 0, sizeof r);
    ready_ent *ready = NULL;
    size_t n_ready = 0;
    int64_t *list = NULL;
    size_t n_list = 0;
    if ((e = run_txn(c, ops, 5, &r))) goto out;

    const fx_range_resp *meta = &r.responses[0].u.range, *lst = &r.responses[1].u.range,
                        *rdy = &r.responses[2].u.range, *prd = &r.responses[3].u.range,
                        *con = &r.responses[4].u.range;
    if (meta->n_kvs > 0) {
        fx_mq_mpmc_meta mm;
        if (fx_mq_mpmc_meta_decode(meta->kvs[0].value.data, meta->kvs[0].value.len, &mm) == FX_OK) {
            s->has_meta = true;
            s->capacity = mm.capacity;
            s->ttl_seconds = mm.ttl_seconds;
            s->retention_seconds = mm.retention_seconds ? mm.retention_seconds : mm.ttl_seconds;
        } else
            FX_WRN("inspect: channel '%s': malformed MPMC meta (%s)", name, fx_err_detail());
    }
    if (lst->n_kvs > 0) {
        e = fx_mq_mpsc_list_decode(lst->kvs[0].value.data, lst->kvs[0].value.len, &list, &n_list);
        if (e) goto out;
    }
    if (rdy->more || prd->more || con->more) s->truncated = true;
    if (rdy->n_kvs > 0) {
        if (!(ready = calloc(rdy->n_kvs, sizeof *ready))) {
            e = FX_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < rdy->n_kvs; i++) {
            int64_t m = -1, ch = -1, owner = -1;
            const fx_kv *kv = &rdy->kvs[i];
            if (fx_mq_parse_ready_key(&c->keys, kv_key(kv), &m, &ch) != FX_OK || m != s->mpmc_id)
                continue;
            if (fx_mq_id_decode(kv->value.data, kv->value.len, &owner) != FX_OK) owner = -1;
            ready[n_ready++] = (ready_ent){ch, owner};
        }
        qsort(ready, n_ready, sizeof *ready, cmp_ready);
    }
    if ((e = parse_roles(c, prd, s->mpmc_id, FX_MQ_ROLE_PRODUCER, &s->producers, &s->n_producers)))
        goto out;
    if ((e = parse_roles(c, con, s->mpmc_id, FX_MQ_ROLE_CONSUMER, &s->consumers, &s->n_consumers)))
        goto out;

    if (n_list > 0) {
        if (!(s->subs = calloc(n_list, sizeof *s->subs))) {
            e = FX_ENOMEM;
            goto out;
        }
        s->n_subs = n_list;
        for (size_t i = 0; i < n_list; i++) {
            fx_mq_sub_mpsc_info *si = &s->subs[i];
            si->chan_id = list[i];
            si->owner_member = -1;
            ready_ent key = {.chan = list[i]};
            ready_ent *hit = n_ready ? bsearch(&key, ready, n_ready, sizeof *ready, cmp_ready) : NULL;
            if (hit) {
                si->ready = true;
                si->owner_member = hit->owner;
            }
        }
    }
    fx_txn_resp_free(&r);

    /* 3. Offsets of every sub-MPSC. */
    for (size_t i = 0; i < s->n_subs && !e; i += INSPECT_SUBS_PER_TXN) {
        size_t n = s->n_subs - i < INSPECT_SUBS_PER_TXN ? s->n_subs - i : INSPECT_SUBS_PER_TXN;
        e = read_offsets(c, s, i, n, rev);
    }
    for (size_t i = 0; i < s->n_subs && !e; i++) s->backlog += s->subs[i].backlog;
out:
    fx_txn_resp_free(&r);
    free(ready);
    free(list);
    if (e) fx_mq_channel_info_free(s);
    return e;
}

fx_err fx_mq_inspect_channel(fx_mq_client *c, const char *name, fx_mq_channel_info *s)
{
    if (!s) return fx_seterr(FX_EINVAL, "inspect: NULL argument");
    memset(s, 0, sizeof *s);
    if (!c || !name) return fx_seterr(FX_EINVAL, "inspect: NULL argument");
    fx_err e = fx_mq_name_validate(name);
    if (e) return e;
    if ((e = fx__mq_op_enter(c))) return e;
    for (int a = 0; a < INSPECT_ATTEMPTS; a++) {
        e = read_once(c, name, s);
        if (e != FX_ECOMPACTED) break;
    }
    fx__mq_op_leave(c);
    return e;
}

fx_err fx_mq_inspect_names(fx_mq_client *c, size_t max, char ***names, size_t *n)
{
    if (!names || !n) return fx_seterr(FX_EINVAL, "inspect: NULL argument");
    *names = NULL;
    *n = 0;
    if (!c) return fx_seterr(FX_EINVAL, "inspect: NULL argument");
    fx_mq_key pk;
    fx_err e = fx_mq_prefix_unique(&c->keys, &pk);
    if (e) return e;
    uint8_t end[FX_MQ_KEY_CAP];
    fx_range_req rq;
    memset(&rq, 0, sizeof rq);
    rq.key = key_slice(&pk);
    rq.range_end = (fx_slice){end, fx_prefix_end(key_slice(&pk), end)};
    rq.limit = (int64_t)max;
    rq.keys_only = true;
    fx_range_resp rr;
    memset(&rr, 0, sizeof rr);
    if ((e = fx__mq_op_enter(c))) return e;
    e = fx_etcd_range(c->etcd, &rq, &rr, c->op_timeout_ms);
    fx__mq_op_leave(c);
    char **out = NULL;
    size_t k = 0;
    if (!e && rr.n_kvs > 0 && !(out = calloc(rr.n_kvs, sizeof *out))) e = FX_ENOMEM;
    for (size_t i = 0; !e && i < rr.n_kvs; i++) {
        char name[FX_MQ_NAME_MAX + 1];
        if (fx_mq_parse_unique_key(&c->keys, kv_key(&rr.kvs[i]), name, sizeof name) != FX_OK) continue;
        if (!(out[k] = strdup(name))) {
            e = FX_ENOMEM;
            break;
        }
        k++;
    }
    fx_range_resp_free(&rr);
    if (e) {
        fx_mq_inspect_names_free(out, k);
        return e;
    }
    *names = out;
    *n = k;
    return FX_OK;
}

void fx_mq_inspect_names_free(char **names, size_t n)
{
    if (!names) return;
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}
