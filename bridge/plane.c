/* plane.c -- the payload plane of the MPSC data path. Contract: plane.h. */
#include "plane.h"

#include <stdlib.h>
#include <string.h>

#define FULLKEY_CAP (FX_MQ_KEY_CAP + 1024)

fx_plane_kind fx__plane_kind(const fx_mq_client *c)
{
    if (c->kv_shared) return FX_PLANE_FUSED;
    return fx_kv_is_redis(c->kv) ? FX_PLANE_REDIS : FX_PLANE_SPLIT;
}

/* Full etcd key (kv prefix + relative key) for an op inside a control-plane txn. */
static fx_err full_key(const fx_mq_client *c, const fx_mq_key *rel, char *buf, fx_slice *out)
{
    const char *kp = fx_kv_prefix(c->kv);
    size_t pl = strlen(kp);
    if (pl + rel->len > FULLKEY_CAP) return fx_seterr(FX_EINVAL, "mpsc: payload key too long");
    memcpy(buf, kp, pl);
    memcpy(buf + pl, rel->s, rel->len);
    *out = (fx_slice){buf, pl + rel->len};
    return FX_OK;
}

fx_err fx__plane_batch_init(fx_plane_batch *b, fx_mq_client *c, size_t nkeys, int64_t lease)
{
    bool fused = fx__plane_fused(c);
    *b = (fx_plane_batch){.c = c, .nkeys = nkeys, .lease = lease, .nops = fused ? nkeys + 1 : 1};
    b->rel = calloc(nkeys, sizeof *b->rel);
    b->ops = calloc(b->nops, sizeof *b->ops);
    if (fused)
        b->fk = malloc(nkeys * FULLKEY_CAP);
    else
        b->items = calloc(nkeys, sizeof *b->items);
    if (!b->rel || !b->ops || (fused ? !b->fk : !b->items)) {
        fx__plane_batch_free(b);
        return fx_seterr(FX_ENOMEM, "mpsc put: out of memory");
    }
    return FX_OK;
}

fx_err fx__plane_batch_set(fx_plane_batch *b, size_t i, const fx_mq_key *rel, fx_slice value)
{
    b->rel[i] = *rel;
    if (!fx__plane_fused(b->c)) {
        b->items[i] = (fx_kv_item){fx_mq_key_slice(&b->rel[i]), value};
        return FX_OK;
    }
    fx_slice full;
    fx_err e = full_key(b->c, &b->rel[i], b->fk + i * FULLKEY_CAP, &full);
    if (e) return e;
    b->ops[i] = (fx_op){.type = FX_OP_PUT,
                        .u.put = {.key = full, .value = value, .lease = b->lease}};
    return FX_OK;
}

fx_err fx__plane_batch_write(fx_plane_batch *b, int timeout_ms)
{
    if (fx__plane_fused(b->c)) return FX_OK;
    fx_kv_put_opts po = {.lease_id = b->lease};
    fx_err e = fx_kv_put_many(b->c->kv, b->items, b->nkeys, &po, timeout_ms);
    if (!e) b->written = true;
    return e;
}

void fx__plane_batch_undo(fx_plane_batch *b, const fx_mq_key *start, const fx_mq_key *end,
                          int timeout_ms)
{
    if (!b->written) return;
    fx_kv_delete_range(b->c->kv, fx_mq_key_slice(start), fx_mq_key_slice(end), NULL, timeout_ms);
}

void fx__plane_batch_free(fx_plane_batch *b)
{
    free(b->items);
    free(b->ops);
    free(b->fk);
    free(b->rel);
    b->items = NULL;
    b->ops = NULL;
    b->fk = NULL;
    b->rel = NULL;
}

fx_err fx__plane_dels_init(fx_plane_dels *d, fx_mq_client *c, size_t n)
{
    *d = (fx_plane_dels){.c = c, .n = n};
    if (!fx__plane_fused(c) || !n) return FX_OK;
    if (!(d->fk = malloc(n * 2 * FULLKEY_CAP)))
        return fx_seterr(FX_ENOMEM, "mpsc commit: out of memory");
    return FX_OK;
}

fx_err fx__plane_dels_txn_op(fx_plane_dels *d, size_t i, const fx_mq_key *start,
                             const fx_mq_key *end, fx_op *ops, size_t *nops)
{
    if (!fx__plane_fused(d->c)) return FX_OK;
    fx_slice fs, fe;
    fx_err e = full_key(d->c, start, d->fk + 2 * i * FULLKEY_CAP, &fs);
    if (!e) e = full_key(d->c, end, d->fk + (2 * i + 1) * FULLKEY_CAP, &fe);
    if (e) return e;
    ops[(*nops)++] = (fx_op){.type = FX_OP_DELETE, .u.del = {.key = fs, .range_end = fe}};
    return FX_OK;
}

fx_err fx__plane_dels_after(fx_plane_dels *d, const fx_mq_key *start, const fx_mq_key *end,
                            int timeout_ms)
{
    if (fx__plane_fused(d->c)) return FX_OK;
    return fx_kv_delete_range(d->c->kv, fx_mq_key_slice(start), fx_mq_key_slice(end), NULL,
                              timeout_ms);
}

void fx__plane_dels_free(fx_plane_dels *d)
{
    free(d->fk);
    d->fk = NULL;
}
