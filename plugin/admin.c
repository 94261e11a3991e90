/* admin.c -- the admin view of channels, read from etcd (contract: admin.h).
 *
 * One channel is read as one snapshot: the name mapping first (its header revision R), then
 * every other key at revision R, batched in read-only txns:
 *   txn 1: MPMC meta, mpsc_channels list, ready prefix, producer and consumer role prefixes;
 *   txn 2..: produce- and consume-offset prefixes and the consumer-membership count of up to
 *            ADMIN_SUBS_PER_TXN sub-MPSCs each (3 ops per sub-MPSC, under etcd's default limit of
 *            128 ops per txn).
 * A compaction between the reads (FX_ECOMPACTED) restarts the snapshot (bounded attempts).
 * Bounds: at most FX_MQ_MAX_MPSC_CHANNELS sub-MPSCs (the list decoder's bound) and at most
 * ADMIN_RANGE_LIMIT keys per prefix range; a hit bound is reported as "truncated":true.
 * Every etcd call uses the client's op deadline and holds a backend reference (fx__mq_op_enter).
 *
 * Integers are written from their exact decimal text (cJSON raw values), never through double.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "admin.h"
#include "fx_log.h"
#include "mq_int.h"

#define ADMIN_SUBS_PER_TXN 40
#define ADMIN_RANGE_LIMIT 4096
#define ADMIN_ATTEMPTS 3
#define ADMIN_LIST_MAX 4096 /* channel mappings listed when no config is given */

/* ---- snapshot of one channel -------------------------------------------------------------- */

typedef struct prod_off {
    int64_t pidx;
    int64_t produce; /* last written id; FX_MQ_PRODUCE_OFFSET_BEGIN when absent */
    int64_t consume; /* next id to consume; FX_MQ_CONSUME_OFFSET_BEGIN when absent */
} prod_off;

typedef struct sub_info {
    int64_t chan;
    bool ready;
    int64_t owner;
    prod_off *prods;
    size_t n_prods;
    int64_t backlog;
    int64_t consumers; /* consumer membership keys (a bound consumer, ready or draining) */
} sub_info;

typedef struct ready_ent {
    int64_t chan;
    int64_t owner;
} ready_ent;

typedef struct snapshot {
    bool mapped;
    int64_t mpmc;
    bool has_meta;
    fx_mq_mpmc_meta meta;
    sub_info *subs;
    size_t n_subs;
    int64_t *producers;
    size_t n_producers;
    int64_t *consumers;
    size_t n_consumers;
    int64_t backlog;
    bool truncated;
} snapshot;

static void snapshot_free(snapshot *s)
{
    for (size_t i = 0; i < s->n_subs; i++) free(s->subs[i].prods);
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
    return cmp_i64(&((const prod_off *)a)->pidx, &((const prod_off *)b)->pidx);
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
    op.u.range.limit = ADMIN_RANGE_LIMIT;
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
    if (!r->succeeded || r->n_responses != n) return fx_seterr(FX_EPROTO, "admin: unexpected txn response");
    for (size_t i = 0; i < n; i++)
        if (r->responses[i].type != FX_OP_RANGE)
            return fx_seterr(FX_EPROTO, "admin: unexpected txn response");
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
static fx_err parse_offsets(fx_mq_client *c, sub_info *sub, const fx_range_resp *po,
                            const fx_range_resp *co)
{
    size_t cap = po->n_kvs + co->n_kvs;
    sub->prods = NULL;
    sub->n_prods = 0;
    sub->backlog = 0;
    if (cap == 0) return FX_OK;
    prod_off *p = calloc(cap, sizeof *p);
    if (!p) return FX_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < po->n_kvs; i++) {
        int64_t ch = -1, pidx = -1, v = 0;
        const fx_kv *kv = &po->kvs[i];
        if (fx_mq_parse_produce_offset_key(&c->keys, kv_key(kv), &ch, &pidx) != FX_OK ||
            ch != sub->chan || fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &v) != FX_OK) {
            FX_WRN("admin: ignoring malformed produce offset of sub-MPSC %" PRId64, sub->chan);
            continue;
        }
        p[n++] = (prod_off){.pidx = pidx, .produce = v, .consume = FX_MQ_CONSUME_OFFSET_BEGIN};
    }
    qsort(p, n, sizeof *p, cmp_prod);
    size_t n_prod = n;
    for (size_t i = 0; i < co->n_kvs; i++) {
        int64_t ch = -1, pidx = -1, v = 0;
        const fx_kv *kv = &co->kvs[i];
        if (fx_mq_parse_consume_offset_key(&c->keys, kv_key(kv), &ch, &pidx) != FX_OK ||
            ch != sub->chan || fx_mq_consume_offset_decode(kv->value.data, kv->value.len, &v) != FX_OK) {
            FX_WRN("admin: ignoring malformed consume offset of sub-MPSC %" PRId64, sub->chan);
            continue;
        }
        prod_off key = {.pidx = pidx};
        prod_off *hit = n_prod ? bsearch(&key, p, n_prod, sizeof *p, cmp_prod) : NULL;
        if (hit)
            hit->consume = v;
        else
            p[n++] = (prod_off){.pidx = pidx, .produce = FX_MQ_PRODUCE_OFFSET_BEGIN, .consume = v};
    }
    qsort(p, n, sizeof *p, cmp_prod);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t b = p[i].produce - p[i].consume + 1;
        if (b > 0) total += b;
    }
    sub->prods = p;
    sub->n_prods = n;
    sub->backlog = total;
    return FX_OK;
}

static int64_t prod_backlog(const prod_off *p)
{
    int64_t b = p->produce - p->consume + 1;
    return b > 0 ? b : 0;
}

/* Offsets and consumer counts of subs[from, from+n) at revision rev, in one txn. */
static fx_err read_offsets(fx_mq_client *c, snapshot *s, size_t from, size_t n, int64_t rev)
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
        int64_t chan = s->subs[from + i].chan;
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

static fx_err read_once(fx_mq_client *c, const char *name, snapshot *s)
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
    if (rr.n_kvs == 0) {
        fx_range_resp_free(&rr);
        return FX_OK; /* not mapped */
    }
    e = fx_mq_id_decode(rr.kvs[0].value.data, rr.kvs[0].value.len, &s->mpmc);
    fx_range_resp_free(&rr);
    if (e) return e;
    s->mapped = true;

    /* 2. Meta, list, ready keys, role keys. */
    fx_mq_key mk, lk, rp, pp, cp;
    uint8_t rend[FX_MQ_KEY_CAP], pend[FX_MQ_KEY_CAP], cend[FX_MQ_KEY_CAP];
    e = fx_mq_key_mpmc_meta(&c->keys, s->mpmc, &mk);
    if (!e) e = fx_mq_key_mpmc_mpsc_channels(&c->keys, s->mpmc, &lk);
    if (!e) e = fx_mq_prefix_mpmc_ready(&c->keys, s->mpmc, &rp);
    if (!e) e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_PRODUCER, s->mpmc, &pp);
    if (!e) e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_CONSUMER, s->mpmc, &cp);
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
        if (fx_mq_mpmc_meta_decode(meta->kvs[0].value.data, meta->kvs[0].value.len, &s->meta) == FX_OK)
            s->has_meta = true;
        else
            FX_WRN("admin: channel '%s': malformed MPMC meta (%s)", name, fx_err_detail());
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
            if (fx_mq_parse_ready_key(&c->keys, kv_key(kv), &m, &ch) != FX_OK || m != s->mpmc)
                continue;
            if (fx_mq_id_decode(kv->value.data, kv->value.len, &owner) != FX_OK) owner = -1;
            ready[n_ready++] = (ready_ent){ch, owner};
        }
        qsort(ready, n_ready, sizeof *ready, cmp_ready);
    }
    if ((e = parse_roles(c, prd, s->mpmc, FX_MQ_ROLE_PRODUCER, &s->producers, &s->n_producers)))
        goto out;
    if ((e = parse_roles(c, con, s->mpmc, FX_MQ_ROLE_CONSUMER, &s->consumers, &s->n_consumers)))
        goto out;

    if (n_list > 0) {
        if (!(s->subs = calloc(n_list, sizeof *s->subs))) {
            e = FX_ENOMEM;
            goto out;
        }
        s->n_subs = n_list;
        for (size_t i = 0; i < n_list; i++) {
            sub_info *si = &s->subs[i];
            si->chan = list[i];
            si->owner = -1;
            ready_ent key = {.chan = list[i]};
            ready_ent *hit = n_ready ? bsearch(&key, ready, n_ready, sizeof *ready, cmp_ready) : NULL;
            if (hit) {
                si->ready = true;
                si->owner = hit->owner;
            }
        }
    }
    fx_txn_resp_free(&r);

    /* 3. Offsets of every sub-MPSC. */
    for (size_t i = 0; i < s->n_subs && !e; i += ADMIN_SUBS_PER_TXN) {
        size_t n = s->n_subs - i < ADMIN_SUBS_PER_TXN ? s->n_subs - i : ADMIN_SUBS_PER_TXN;
        e = read_offsets(c, s, i, n, rev);
    }
    for (size_t i = 0; i < s->n_subs && !e; i++) s->backlog += s->subs[i].backlog;
out:
    fx_txn_resp_free(&r);
    free(ready);
    free(list);
    if (e) snapshot_free(s);
    return e;
}

static fx_err read_snapshot(fx_mq_client *c, const char *name, snapshot *s)
{
    memset(s, 0, sizeof *s);
    if (!c || !name) return fx_seterr(FX_EINVAL, "admin: NULL argument");
    fx_err e = fx_mq_name_validate(name);
    if (e) return e;
    if ((e = fx__mq_op_enter(c))) return e;
    for (int a = 0; a < ADMIN_ATTEMPTS; a++) {
        e = read_once(c, name, s);
        if (e != FX_ECOMPACTED) break;
    }
    fx__mq_op_leave(c);
    return e;
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static bool add_i64(cJSON *obj, const char *field, int64_t v)
{
    char buf[FX_MQ_DEC_BUF];
    fx_mq_dec_format(v, buf);
    return cJSON_AddRawToObject(obj, field, buf) != NULL;
}

static bool push_i64(cJSON *arr, int64_t v)
{
    char buf[FX_MQ_DEC_BUF];
    fx_mq_dec_format(v, buf);
    cJSON *it = cJSON_CreateRaw(buf);
    if (it && cJSON_AddItemToArray(arr, it)) return true;
    cJSON_Delete(it);
    return false;
}

static char *print_free(cJSON *root)
{
    char *out = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out;
}

static char *error_json(int code, const char *desc)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = root ? cJSON_AddObjectToObject(root, "error") : NULL;
    if (!err || !cJSON_AddNumberToObject(err, "code", code) ||
        !cJSON_AddStringToObject(err, "description", desc)) {
        cJSON_Delete(root);
        return NULL;
    }
    return print_free(root);
}

/* The error shape for a failed read: 503 when etcd is unreachable or the client is closing,
 * 400 for an invalid name, 500 otherwise. NULL only on OOM. */
static char *read_error_json(fx_err e, const char *what)
{
    if (e == FX_ENOMEM) return NULL;
    int code = 500;
    switch (e) {
    case FX_ETIMEDOUT:
    case FX_EUNAVAIL:
    case FX_ECLOSED:
    case FX_ECANCELED: code = 503; break;
    case FX_EINVAL: code = 400; break;
    default: break;
    }
    char desc[640];
    const char *d = fx_err_detail();
    if (d && *d)
        snprintf(desc, sizeof desc, "%s: %s (%s)", what, fx_strerror(e), d);
    else
        snprintf(desc, sizeof desc, "%s: %s", what, fx_strerror(e));
    return error_json(code, desc);
}

static const fx_chan_config *cfg_channel(const fx_config *cfg, const char *name)
{
    if (!cfg || !name) return NULL;
    for (size_t i = 0; i < cfg->n_channels; i++)
        if (cfg->channels[i].name && strcmp(cfg->channels[i].name, name) == 0) return &cfg->channels[i];
    return NULL;
}

static bool add_mpmc_id(cJSON *o, const snapshot *s)
{
    return s->mapped ? add_i64(o, "mpmc_id", s->mpmc) : cJSON_AddNullToObject(o, "mpmc_id") != NULL;
}

static char *info_json(const char *name, const fx_chan_config *cc, const snapshot *s)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root && cJSON_AddStringToObject(root, "name", name) && add_mpmc_id(root, s) &&
              add_i64(root, "backlog", s->backlog);
    if (ok) {
        if (s->has_meta)
            ok = add_i64(root, "capacity", s->meta.capacity) &&
                 add_i64(root, "ttl_seconds", s->meta.ttl_seconds) &&
                 add_i64(root, "retention_seconds", s->meta.retention_seconds
                                                        ? s->meta.retention_seconds
                                                        : s->meta.ttl_seconds);
        else if (cc)
            ok = add_i64(root, "capacity", cc->s.capacity) &&
                 add_i64(root, "ttl_seconds", cc->s.ttl_seconds);
        else
            ok = cJSON_AddNullToObject(root, "capacity") && cJSON_AddNullToObject(root, "ttl_seconds");
    }
    cJSON *subs = ok ? cJSON_AddArrayToObject(root, "sub_mpscs") : NULL;
    ok = subs != NULL;
    for (size_t i = 0; ok && i < s->n_subs; i++) {
        const sub_info *si = &s->subs[i];
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(subs, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        ok = add_i64(o, "chan_id", si->chan) && cJSON_AddBoolToObject(o, "ready", si->ready) &&
             (si->ready && si->owner >= 0 ? add_i64(o, "owner_member", si->owner)
                                          : cJSON_AddNullToObject(o, "owner_member") != NULL) &&
             add_i64(o, "backlog", si->backlog) && add_i64(o, "consumers", si->consumers);
        cJSON *prods = ok ? cJSON_AddArrayToObject(o, "producers") : NULL;
        ok = prods != NULL;
        for (size_t j = 0; ok && j < si->n_prods; j++) {
            const prod_off *p = &si->prods[j];
            cJSON *po = cJSON_CreateObject();
            ok = po && cJSON_AddItemToArray(prods, po);
            if (!ok) {
                cJSON_Delete(po);
                break;
            }
            ok = add_i64(po, "pidx", p->pidx) && add_i64(po, "produce_offset", p->produce) &&
                 add_i64(po, "consume_offset", p->consume) && add_i64(po, "backlog", prod_backlog(p));
        }
    }
    cJSON *mem = ok ? cJSON_AddObjectToObject(root, "members") : NULL;
    cJSON *pa = mem ? cJSON_AddArrayToObject(mem, "producers") : NULL;
    cJSON *ca = pa ? cJSON_AddArrayToObject(mem, "consumers") : NULL;
    ok = ca != NULL;
    for (size_t i = 0; ok && i < s->n_producers; i++) ok = push_i64(pa, s->producers[i]);
    for (size_t i = 0; ok && i < s->n_consumers; i++) ok = push_i64(ca, s->consumers[i]);
    if (ok && s->truncated) ok = cJSON_AddTrueToObject(root, "truncated") != NULL;
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return print_free(root);
}

/* ---- public ---------------------------------------------------------------------------------- */

char *fx_admin_channel_info_json(fx_mq_client *c, const fx_config *cfg, const char *name)
{
    if (!name || !*name) return error_json(404, "channel not found");
    const fx_chan_config *cc = cfg_channel(cfg, name);
    if (cfg && !cc) return error_json(404, "channel not found");
    if (fx_mq_name_validate(name) != FX_OK) return error_json(404, "channel not found");
    snapshot s;
    fx_err e = read_snapshot(c, name, &s);
    if (e) return read_error_json(e, "reading channel from etcd");
    char *out = NULL;
    if (!cfg && !s.mapped)
        out = error_json(404, "channel not found");
    else
        out = info_json(name, cc, &s);
    snapshot_free(&s);
    return out;
}

/* One entry of the list: {"name":..,"mpmc_id":..,"backlog":..}. */
static fx_err list_entry(fx_mq_client *c, cJSON *arr, const char *name)
{
    snapshot s;
    fx_err e = read_snapshot(c, name, &s);
    if (e) return e;
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddItemToArray(arr, o);
    if (!ok) cJSON_Delete(o);
    ok = ok && cJSON_AddStringToObject(o, "name", name) && add_mpmc_id(o, &s) &&
         add_i64(o, "backlog", s.backlog);
    if (ok && s.truncated) ok = cJSON_AddTrueToObject(o, "truncated") != NULL;
    snapshot_free(&s);
    return ok ? FX_OK : FX_ENOMEM;
}

/* Names of every mapping under R/mq_unique_keys/ (no config given), sorted by etcd. */
static fx_err list_mapped(fx_mq_client *c, cJSON *arr)
{
    fx_mq_key pk;
    fx_err e = fx_mq_prefix_unique(&c->keys, &pk);
    if (e) return e;
    uint8_t end[FX_MQ_KEY_CAP];
    fx_range_req rq;
    memset(&rq, 0, sizeof rq);
    rq.key = key_slice(&pk);
    rq.range_end = (fx_slice){end, fx_prefix_end(key_slice(&pk), end)};
    rq.limit = ADMIN_LIST_MAX;
    rq.keys_only = true;
    fx_range_resp rr;
    memset(&rr, 0, sizeof rr);
    if ((e = fx__mq_op_enter(c))) return e;
    e = fx_etcd_range(c->etcd, &rq, &rr, c->op_timeout_ms);
    fx__mq_op_leave(c);
    for (size_t i = 0; !e && i < rr.n_kvs; i++) {
        char name[FX_MQ_NAME_MAX + 1];
        if (fx_mq_parse_unique_key(&c->keys, kv_key(&rr.kvs[i]), name, sizeof name) != FX_OK) continue;
        e = list_entry(c, arr, name);
    }
    fx_range_resp_free(&rr);
    return e;
}

char *fx_admin_channel_list_json(fx_mq_client *c, const fx_config *cfg)
{
    if (!c) return error_json(500, "no MQ client");
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "channels") : NULL;
    if (!arr) {
        cJSON_Delete(root);
        return NULL;
    }
    fx_err e = FX_OK;
    if (cfg) {
        for (size_t i = 0; !e && i < cfg->n_channels; i++) {
            const char *name = cfg->channels[i].name;
            if (!name) continue;
            e = list_entry(c, arr, name);
        }
    } else {
        e = list_mapped(c, arr);
    }
    if (e) {
        cJSON_Delete(root);
        return read_error_json(e, "reading channels from etcd");
    }
    return print_free(root);
}

fx_err fx_admin_channel_backlog(fx_mq_client *c, const char *name, int64_t *out)
{
    if (!out) return fx_seterr(FX_EINVAL, "admin: NULL argument");
    *out = 0;
    snapshot s;
    fx_err e = read_snapshot(c, name, &s);
    if (e) return e;
    if (!s.mapped) {
        snapshot_free(&s);
        return fx_seterr(FX_ENOTFOUND, "channel '%s' has no MPMC yet", name);
    }
    *out = s.backlog;
    snapshot_free(&s);
    return FX_OK;
}
