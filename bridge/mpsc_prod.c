/* mpsc_prod.c -- the MPSC producer: open/close and the batched, gap-free write path (described
 * in mpsc.c's head comment; the payload planes: plane.h). Shared bits: mpsc_int.h. */
#include "mpsc_int.h"

/* ======================================================================================== *
 * Producer                                                                                 *
 * ======================================================================================== */

struct fx_mpsc_producer {
    fx__mq_endpoint ep;
    fx_mq_client *c;
    chan_mgr m;
    int64_t pidx, weight, capacity;
    fx_mq_key k_member, k_weight, k_offset, k_prefix;
    bool member_written;

    pthread_mutex_t put_mu; /* serialises puts; guards next, offset_unknown */
    int64_t next;           /* next message id to write */
    int64_t budget;         /* messages we may still write before counting again (capacity) */
    bool offset_unknown;    /* re-read the produce offset before choosing ids */

    pthread_mutex_t mu; /* guards lf */
    pthread_cond_t cv;  /* capacity waits, retry naps, close progress */
    life lf;
    stats st;
};

static void prod_on_expired(void *arg, fx_lease *h, int64_t id)
{
    (void)h;
    fx_mpsc_producer *p = arg;
    pthread_mutex_lock(&p->mu);
    if (life_lease_lost(&p->lf))
        FX_WRN("mpsc producer %lld/%lld: lease %lld expired; closing the producer",
               (long long)p->m.chan, (long long)p->pidx, (long long)id);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Called with p->mu held: FX_OK to proceed, FX_ELEASE_LOST (once; *self_close) or FX_ECLOSED. */
static fx_err prod_gate_locked(fx_mpsc_producer *p, bool *self_close)
{
    return life_gate(&p->lf, "producer", p->m.chan, p->pidx, self_close);
}

static fx_err prod_gate(fx_mpsc_producer *p, bool *self_close)
{
    pthread_mutex_lock(&p->mu);
    fx_err e = prod_gate_locked(p, self_close);
    pthread_mutex_unlock(&p->mu);
    return e;
}

/* Mark a lease loss found by the write path (reported by this call). */
static fx_err prod_fault_now(fx_mpsc_producer *p, const char *why)
{
    pthread_mutex_lock(&p->mu);
    fx_life_fault_now(&p->lf, 0);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    FX_WRN("mpsc producer %lld/%lld: %s; closing the producer", (long long)p->m.chan,
           (long long)p->pidx, why);
    return fx_seterr(FX_ELEASE_LOST, "mpsc producer %lld/%lld: %s", (long long)p->m.chan,
                     (long long)p->pidx, why);
}

static bool prod_stopping(fx_mpsc_producer *p)
{
    pthread_mutex_lock(&p->mu);
    bool s = p->lf.stop;
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Read the produce offset (-1 when absent). */
static fx_err read_offset(fx_mq_client *c, const fx_mq_key *k, int64_t *out)
{
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(c->etcd, fx_mq_key_slice(k), &kv, c->op_timeout_ms);
    if (e == FX_ENOTFOUND) {
        *out = FX_MQ_PRODUCE_OFFSET_BEGIN;
        return FX_OK;
    }
    if (e == FX_OK) e = fx_mq_produce_offset_decode(kv.value.data, kv.value.len, out);
    fx_kv_free(&kv);
    return e;
}

typedef struct off_ent {
    int64_t pidx, off;
} off_ent;

static int off_cmp(const void *a, const void *b)
{
    const off_ent *x = a, *y = b;
    return (x->pidx > y->pidx) - (x->pidx < y->pidx);
}

/* Stored, unconsumed messages of channel `chan` from its offsets: sum over producers of
 * produce - consume + 1 (a produce offset is the last id written, a consume offset the next id
 * to consume: docs/ARCHITECTURE.md "Keys and objects"), and the number of producers with a
 * produce offset.
 * One etcd request (a txn of two range reads, so both are read at one revision). */
static fx_err stored_count(fx_mq_client *c, int64_t chan, int64_t *stored, int64_t *producers)
{
    fx_mq_key pp, cp;
    fx_err e;
    if ((e = key_err(fx_mq_prefix_produce_offsets(&c->keys, chan, &pp), "prefix")) ||
        (e = key_err(fx_mq_prefix_consume_offsets(&c->keys, chan, &cp), "prefix")))
        return e;
    uint8_t pe[FX_MQ_KEY_CAP], ce[FX_MQ_KEY_CAP];
    fx_slice ps = fx_mq_key_slice(&pp), cs = fx_mq_key_slice(&cp);
    fx_op ops[2] = {
        {.type = FX_OP_RANGE, .u.range = {.key = ps, .range_end = {pe, fx_prefix_end(ps, pe)}}},
        {.type = FX_OP_RANGE, .u.range = {.key = cs, .range_end = {ce, fx_prefix_end(cs, ce)}}},
    };
    fx_txn_req tx = {.success = ops, .n_success = 2};
    fx_txn_resp r = {0};
    if ((e = fx_etcd_txn(c->etcd, &tx, &r, c->op_timeout_ms))) return e;
    if (!r.succeeded || r.n_responses != 2 || r.responses[0].type != FX_OP_RANGE ||
        r.responses[1].type != FX_OP_RANGE) {
        fx_txn_resp_free(&r);
        return fx_seterr(FX_EPROTO, "mpsc capacity: unexpected txn response");
    }
    const fx_range_resp *pr = &r.responses[0].u.range, *cr = &r.responses[1].u.range;
    off_ent *cons = cr->n_kvs ? malloc(cr->n_kvs * sizeof *cons) : NULL;
    if (cr->n_kvs && !cons) {
        fx_txn_resp_free(&r);
        return fx_seterr(FX_ENOMEM, "mpsc capacity: out of memory");
    }
    size_t nc = 0;
    for (size_t i = 0; i < cr->n_kvs; i++) { /* foreign or malformed entries are ignored */
        const fx_kv *kv = &cr->kvs[i];
        int64_t ch, pidx, off;
        if (fx_mq_parse_consume_offset_key(&c->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) == FX_OK &&
            ch == chan && fx_mq_consume_offset_decode(kv->value.data, kv->value.len, &off) == FX_OK)
            cons[nc++] = (off_ent){pidx, off};
    }
    if (nc > 1) qsort(cons, nc, sizeof *cons, off_cmp);
    int64_t sum = 0, np = 0;
    for (size_t i = 0; i < pr->n_kvs; i++) {
        const fx_kv *kv = &pr->kvs[i];
        int64_t ch, pidx, prod;
        if (fx_mq_parse_produce_offset_key(&c->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) != FX_OK ||
            ch != chan || fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &prod))
            continue;
        off_ent k = {pidx, 0};
        const off_ent *f = nc ? bsearch(&k, cons, nc, sizeof *cons, off_cmp) : NULL;
        int64_t cons_off = f ? f->off : FX_MQ_CONSUME_OFFSET_BEGIN;
        if (prod >= cons_off) sum += prod - cons_off + 1;
        np++;
    }
    free(cons);
    fx_txn_resp_free(&r);
    *stored = sum;
    *producers = np;
    return FX_OK;
}

/* One chunk write: ids [p->next, p->next + m). Retries transient failures with the same ids
 * until wdeadline. Called with put_mu held. */
static fx_err write_chunk(fx_mpsc_producer *p, const fx_slice *vals, size_t m, int64_t wdeadline)
{
    fx_mq_client *c = p->c;
    int64_t first = p->next, last = first + (int64_t)m - 1;
    fx_err e = FX_OK;
    bool seg = p->m.meta.segments;
    size_t nkeys = seg ? 1 : m; /* payload keys written by this chunk */
    uint8_t *segbuf = NULL;
    fx_slice segval = {0};
    fx_plane_batch pb;
    if ((e = fx__plane_batch_init(&pb, c, nkeys, p->m.meta.payload_lease_id))) return e;
    if (seg) { /* one value: the batch back to back, under the key of its last id */
        size_t sz = fx_seg_size(vals, m);
        if (!(segbuf = malloc(sz))) {
            e = fx_seterr(FX_ENOMEM, "mpsc put: out of memory");
            goto out;
        }
        segval = (fx_slice){segbuf, fx_seg_encode(vals, m, segbuf, sz)};
        if (!segval.len) {
            e = fx_seterr(FX_EINVAL, "mpsc put: batch of %zu values cannot form a segment", m);
            goto out;
        }
    }
    for (size_t i = 0; i < nkeys; i++) {
        int64_t id = seg ? last : first + (int64_t)i;
        fx_mq_key rel;
        if ((e = key_err(pay_key(&p->m, p->pidx, id, &rel), "payload")) ||
            (e = fx__plane_batch_set(&pb, i, &rel, seg ? segval : vals[i])))
            goto out;
    }
    char lastv[FX_MQ_DEC_BUF], prevv[FX_MQ_DEC_BUF];
    size_t lastl = fx_mq_dec_format(last, lastv), prevl = fx_mq_dec_format(first - 1, prevv);
    *fx__plane_batch_offset_op(&pb) = (fx_op){.type = FX_OP_PUT,
                                              .u.put = {.key = fx_mq_key_slice(&p->k_offset),
                                                        .value = {lastv, lastl},
                                                        .lease = p->m.meta.global_lease_id}};
    /* The membership and the channel's meta must exist (the bind's proof, mpsc.c member_txn):
     * a reclaim between the bind and this txn deletes both, so the chunk fails with nothing
     * stored and the MPMC producer routes it elsewhere. One compare more, no round trip. */
    fx_cmp cmps[3] = {
        first == 0 ? (fx_cmp){.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL,
                              .key = fx_mq_key_slice(&p->k_offset), .num = 0}
                   : (fx_cmp){.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL,
                              .key = fx_mq_key_slice(&p->k_offset), .value = {prevv, prevl}},
        {.target = FX_CMP_CREATE, .result = FX_CMP_GREATER, .key = fx_mq_key_slice(&p->k_member),
         .num = 0},
        {.target = FX_CMP_CREATE, .result = FX_CMP_GREATER, .key = fx_mq_key_slice(&p->m.k_meta),
         .num = 0},
    };
    fx_op fail[3] = {
        {.type = FX_OP_RANGE, .u.range = {.key = fx_mq_key_slice(&p->k_offset)}},
        {.type = FX_OP_RANGE, .u.range = {.key = fx_mq_key_slice(&p->k_member)}},
        {.type = FX_OP_RANGE, .u.range = {.key = fx_mq_key_slice(&p->m.k_meta),
                                          .count_only = true}},
    };
    int64_t backoff = RETRY_MIN_MS;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            p->st.put_retries++;
            if (fx_now_ms() + backoff >= wdeadline) {
                p->offset_unknown = true; /* the last attempt's fate is unknown */
                goto out;                 /* e: the last failure */
            }
            nap(&p->mu, &p->cv, &p->lf.stop, backoff);
            backoff = min64(backoff * 2, RETRY_MAX_MS);
            if (prod_stopping(p)) {
                p->offset_unknown = true;
                e = fx_seterr(FX_ECLOSED, "mpsc producer closed during a put retry");
                goto out;
            }
        }
        e = fx__plane_batch_write(&pb, c->kv_timeout_ms); /* split planes: payloads first */
        if (e == FX_ELEASE_EXPIRED) {
            e = prod_fault_now(p, "payload lease expired");
            goto out;
        }
        /* The payload store is full (Redis at maxmemory under noeviction refused the put before
         * writing): answer at once, as JetStream does when its storage is full (a retry would
         * only wait for consumers' acks). An earlier attempt whose txn was ambiguous may have
         * landed: the offset is re-read before the next put. */
        if (e == FX_ENOSPACE) {
            if (attempt > 0) p->offset_unknown = true;
            goto out;
        }
        if (e) {
            if (transient(e)) continue;
            goto out;
        }
        fx_txn_req tx = {.cmp = cmps, .n_cmp = 3, .success = pb.ops, .n_success = pb.nops,
                         .failure = fail, .n_failure = 3};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
        if (e == FX_OK && resp.succeeded) {
            fx_txn_resp_free(&resp);
            p->next = last + 1;
            p->st.put_txns++;
            goto out;
        }
        if (e == FX_ELEASE_EXPIRED) {
            fx_txn_resp_free(&resp);
            e = prod_fault_now(p, fx__plane_fused(c) ? "payload or global lease expired"
                                                     : "global lease expired");
            goto out;
        }
        if (e) {
            fx_txn_resp_free(&resp);
            if (transient(e)) continue; /* ambiguous: the compare makes the retry safe */
            goto out;
        }
        /* A compare failed: learn why from the failure branch. */
        bool have = resp.n_responses == 3 && resp.responses[0].type == FX_OP_RANGE &&
                    resp.responses[1].type == FX_OP_RANGE && resp.responses[2].type == FX_OP_RANGE;
        bool member = have && resp.responses[1].u.range.n_kvs > 0;
        bool listed = have && resp.responses[2].u.range.count > 0;
        int64_t cur = FX_MQ_PRODUCE_OFFSET_BEGIN;
        fx_err de = FX_OK;
        if (have && resp.responses[0].u.range.n_kvs > 0) {
            const fx_kv *kv = &resp.responses[0].u.range.kvs[0];
            de = fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &cur);
        }
        fx_txn_resp_free(&resp);
        if (!have || de) {
            p->offset_unknown = true;
            e = have ? de : fx_seterr(FX_EPROTO, "mpsc put: txn failure without reads");
            goto out;
        }
        if (cur == last) { /* an earlier ambiguous attempt of this chunk landed */
            p->next = last + 1;
            p->st.put_txns++;
            e = FX_OK;
            goto out;
        }
        if (!member || !listed) {
            fx_mq_key s, en; /* split: orphans above the offset: remove them (best effort) */
            if (!pay_key(&p->m, p->pidx, first, &s) && !pay_key(&p->m, p->pidx, last + 1, &en))
                fx__plane_batch_undo(&pb, &s, &en, c->close_timeout_ms);
            e = prod_fault_now(p, !listed ? "channel meta gone (reclaimed); nothing stored"
                                          : "membership key gone (member lease lost, or the "
                                            "sub-MPSC reclaimed)");
            goto out;
        }
        p->offset_unknown = true;
        e = fx_seterr(FX_EPROTO,
                      "mpsc producer %lld/%lld: produce offset is %lld, expected %lld (another "
                      "writer?)",
                      (long long)p->m.chan, (long long)p->pidx, (long long)cur,
                      (long long)(first - 1));
        goto out;
    }
out:
    free(segbuf);
    fx__plane_batch_free(&pb);
    return e;
}

/* Split planes: a chunk whose offset txn failed or was never confirmed may have left its payload
 * keys (or segment, keyed by its last id) above the produce offset. The ids from `from` on are
 * about to be written again, possibly cut into other chunks: a stale segment among them would
 * overlap the new ones and the consumer would skip them as corrupt (acked messages lost). So
 * before a producer reuses ids after an unknown outcome, it deletes every payload of its own
 * index from `from` on (it is the only writer of that index). Called with put_mu held. */
static fx_err drop_orphans(fx_mpsc_producer *p, int64_t from)
{
    fx_mq_key s, en;
    fx_err e;
    if ((e = key_err(pay_key(&p->m, p->pidx, from, &s), "payload")) ||
        (e = key_err(pay_key(&p->m, p->pidx, INT64_MAX, &en), "payload")))
        return e;
    int64_t n = 0;
    if ((e = fx_kv_delete_range(p->c->kv, fx_mq_key_slice(&s), fx_mq_key_slice(&en), &n,
                                p->c->kv_timeout_ms)))
        return e;
    if (n > 0)
        FX_INF("mpsc producer %lld/%lld: removed %lld payload key(s) from id %lld on that an "
               "unconfirmed write left",
               (long long)p->m.chan, (long long)p->pidx, (long long)n, (long long)from);
    return FX_OK;
}

/* Chunk size starting at vals[0], >= 1. One key per message: <= CHUNK_MSGS values and
 * <= CHUNK_BYTES counting 128 bytes of key/JSON per value. Segment: <= FX_SEG_MAX_MSGS values and
 * an encoded segment of <= CHUNK_BYTES. */
static size_t chunk_len(const fx_slice *vals, size_t max, bool seg)
{
    size_t per = seg ? FX_SEG_PER_MSG : 128, bytes = seg ? FX_SEG_HDR : 0, i = 0;
    size_t lim = seg ? FX_SEG_MAX_MSGS : CHUNK_MSGS;
    if (max < lim) lim = max;
    for (; i < lim; i++) {
        if (i > 0 && bytes + vals[i].len + per > CHUNK_BYTES) break;
        bytes += vals[i].len + per;
    }
    return i ? i : 1;
}

static fx_err prod_close_impl(fx_mpsc_producer *p);

static fx_err put_impl(fx_mpsc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                       bool wait, size_t *n_put, fx_mq_msg_id *ids)
{
    if (n_put) *n_put = 0;
    if (!p || (n && !values)) return fx_seterr(FX_EINVAL, "mpsc put: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!values[i].data && values[i].len)
            return fx_seterr(FX_EINVAL, "mpsc put: value %zu: NULL data", i);
    bool self_close = false;
    fx_err e = prod_gate(p, &self_close);
    if (e) {
        if (self_close) prod_close_impl(p);
        return e;
    }
    if (n == 0) return FX_OK;
    fx_mq_client *c = p->c;
    if ((e = fx__mq_op_enter(c))) return e;
    p->st.put_calls++;
    pthread_mutex_lock(&p->put_mu);
    int64_t start = fx_now_ms();
    int64_t deadline = start + (wait && timeout_ms > 0 ? timeout_ms : 0);
    int64_t wdeadline = start + (timeout_ms > c->op_timeout_ms ? timeout_ms : c->op_timeout_ms);
    size_t done = 0;
    int64_t backoff = RETRY_MIN_MS;
    bool waited = false;
    while (done < n) {
        pthread_mutex_lock(&p->mu);
        e = prod_gate_locked(p, &self_close);
        pthread_mutex_unlock(&p->mu);
        if (e) break;
        if (p->offset_unknown) {
            int64_t cur;
            p->st.offset_rereads++;
            e = read_offset(c, &p->k_offset, &cur);
            if (e) {
                if (transient(e) && fx_now_ms() + backoff < wdeadline) {
                    nap(&p->mu, &p->cv, &p->lf.stop, backoff);
                    backoff = min64(backoff * 2, RETRY_MAX_MS);
                    continue;
                }
                break;
            }
            if (!fx__plane_fused(c) && (e = drop_orphans(p, cur + 1))) {
                if (transient(e) && fx_now_ms() + backoff < wdeadline) {
                    nap(&p->mu, &p->cv, &p->lf.stop, backoff);
                    backoff = min64(backoff * 2, RETRY_MAX_MS);
                    continue;
                }
                break; /* offset_unknown stays: the next put re-reads and drops again */
            }
            if (cur + 1 != p->next)
                FX_INF("mpsc producer %lld/%lld: produce offset re-read: next id %lld -> %lld",
                       (long long)p->m.chan, (long long)p->pidx, (long long)p->next,
                       (long long)(cur + 1));
            p->next = cur + 1;
            p->offset_unknown = false;
        }
        int64_t rest = (int64_t)(n - done);
        if (p->budget < rest) { /* spent our share of the room: count again */
            int64_t count = 0, np = 0;
            p->st.cap_checks++;
            e = stored_count(c, p->m.chan, &count, &np);
            if (e) {
                p->budget = 0;
                if (transient(e) && fx_now_ms() + backoff < wdeadline) {
                    nap(&p->mu, &p->cv, &p->lf.stop, backoff);
                    backoff = min64(backoff * 2, RETRY_MAX_MS);
                    continue;
                }
                break;
            }
            int64_t room = p->capacity - count;
            if (np < 1) np = 1;
            /* Each of the np producers may use 1/np of the room before counting again, so the
             * sum stays within capacity (plus at most np when room < np). */
            p->budget = room <= 0 ? 0 : room >= np ? room / np : 1;
            if (room <= 0) {
                if (!waited) p->st.full_waits++;
                waited = true;
                int64_t left = fx_ms_left(deadline);
                if (left <= 0) {
                    e = fx_seterr(FX_EFULL, "mpsc channel %lld full (%lld stored, capacity %lld)",
                                  (long long)p->m.chan, (long long)count,
                                  (long long)p->capacity);
                    break;
                }
                nap(&p->mu, &p->cv, &p->lf.stop, min64(left, CAP_POLL_MS));
                continue;
            }
        }
        int64_t room = p->budget;
        size_t k = (size_t)min64(room, (int64_t)(n - done));
        while (k > 0) {
            size_t m = chunk_len(values + done, k, p->m.meta.segments);
            int64_t first = p->next;
            e = write_chunk(p, values + done, m, wdeadline);
            if (e) break;
            if (ids)
                for (size_t i = 0; i < m; i++)
                    ids[done + i] = (fx_mq_msg_id){p->m.chan, p->pidx, first + (int64_t)i};
            done += m;
            k -= m;
            p->budget -= (int64_t)m;
            p->st.put_msgs += m;
        }
        if (e) break;
        backoff = RETRY_MIN_MS;
    }
    pthread_mutex_unlock(&p->put_mu);
    fx__mq_op_leave(c);
    if (e == FX_EFULL) p->st.full_errors++;
    if (e == FX_ELEASE_LOST) self_close = true;
    if (self_close) {
        bool held = fx_err_hold();
        prod_close_impl(p);
        fx_err_release(held);
    }
    if (n_put) *n_put = done;
    return e;
}

fx_err fx_mpsc_put(fx_mpsc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                   size_t *n_put, fx_mq_msg_id *ids)
{
    return put_impl(p, values, n, timeout_ms, true, n_put, ids);
}

fx_err fx__mpsc_try_put(fx_mpsc_producer *p, const fx_slice *values, size_t n, size_t *n_put,
                        fx_mq_msg_id *ids)
{
    return put_impl(p, values, n, 0, false, n_put, ids);
}

fx_err fx__mpsc_backlog(fx_mpsc_producer *p, int64_t *out)
{
    if (!p || !out) return fx_seterr(FX_EINVAL, "mpsc backlog: NULL argument");
    bool sc = false;
    fx_err e = prod_gate(p, &sc);
    if (e) {
        if (sc) prod_close_impl(p);
        return e;
    }
    if ((e = fx__mq_op_enter(p->c))) return e;
    int64_t np;
    e = stored_count(p->c, p->m.chan, out, &np);
    fx__mq_op_leave(p->c);
    return e;
}

/* ---- producer open / close -------------------------------------------------------------------- */

static fx_err prod_close_cb(void *self) { return fx_mpsc_producer_close(self); }

static void prod_destroy(fx_mpsc_producer *p)
{
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->put_mu);
    free(p);
}

/* Close work (the first closer): best-effort delete of membership + weight (one pass),
 * release handles, unregister. */
static fx_err prod_close_impl(fx_mpsc_producer *p)
{
    pthread_mutex_lock(&p->mu);
    fx_err r = FX_OK; /* a producer close never fails retryably: RUN or DONE */
    if (fx_life_close_begin(&p->lf, &p->mu, &p->cv, &r) != FX_LIFE_CLOSE_RUN) {
        fx_life_close_leave(&p->lf, &p->cv);
        pthread_mutex_unlock(&p->mu);
        return r;
    }
    pthread_mutex_unlock(&p->mu);

    fx_mq_client *c = p->c;
    if (p->member_written && fx__mq_op_enter(c) == FX_OK) {
        fx_op del[2] = {
            {.type = FX_OP_DELETE, .u.del = {.key = fx_mq_key_slice(&p->k_member)}},
            {.type = FX_OP_DELETE, .u.del = {.key = fx_mq_key_slice(&p->k_weight)}},
        };
        fx_txn_req tx = {.success = del, .n_success = 2};
        fx_err e = fx_etcd_txn(c->etcd, &tx, NULL, c->close_timeout_ms);
        if (e)
            FX_WRN("mpsc producer %lld/%lld close: deleting membership and weight failed: %s "
                   "(%s); the lease TTL removes them",
                   (long long)p->m.chan, (long long)p->pidx, fx_errname(e), fx_err_detail());
        fx__mq_op_leave(c);
    }
    mgr_release(&p->m);
    life_finish(&p->lf, &p->mu, &p->cv, c, &p->ep, !p->m.sub);
    return FX_OK;
}

fx_err fx_mpsc_producer_close(fx_mpsc_producer *p)
{
    if (!p) return fx_seterr(FX_EINVAL, "mpsc producer close: NULL");
    return prod_close_impl(p);
}

void fx_mpsc_producer_free(fx_mpsc_producer *p)
{
    if (!p) return;
    prod_close_impl(p);
    life_wait_finished(&p->lf, &p->mu, &p->cv);
    prod_destroy(p);
}

int64_t fx_mpsc_producer_idx(const fx_mpsc_producer *p) { return p ? p->pidx : -1; }
int64_t fx__mpsc_producer_chan(const fx_mpsc_producer *p) { return p ? p->m.chan : -1; }

fx_err fx__mpsc_producer_fault(const fx_mpsc_producer *p)
{
    if (!p) return FX_OK;
    fx_mpsc_producer *q = (fx_mpsc_producer *)p;
    pthread_mutex_lock(&q->mu);
    fx_err f = q->lf.fault;
    pthread_mutex_unlock(&q->mu);
    return f;
}

void fx__mpsc_producer_stats(const fx_mpsc_producer *p, fx__mpsc_stats *out)
{
    if (p && out) stats_copy(&p->st, out);
}

static bool prod_abort_requested(fx_mpsc_producer *p)
{
    pthread_mutex_lock(&p->mu);
    bool s = p->lf.stop;
    pthread_mutex_unlock(&p->mu);
    return s;
}

static fx_err prod_build(fx_mpsc_producer *p, int64_t chan, const fx__mpsc_parent *parent)
{
    fx_mq_client *c = p->c;
    fx_err e = mgr_open(c, chan, parent, prod_on_expired, p, &p->m);
    if (e) return e;
    p->capacity = p->m.meta.capacity;
    if (prod_abort_requested(p)) return fx_seterr(FX_ECLOSED, "mpsc producer closed while opening");
    if (parent) {
        p->pidx = parent->member;
    } else {
        fx_mq_key k;
        if ((e = key_err(fx_mq_key_alloc_producer_idx(&c->keys, chan, &k), "producer counter")))
            return e;
        if ((e = fx__mq_alloc_ids(c, &k, p->m.meta.global_long_lease_id, 1, &p->pidx))) return e;
    }
    if ((e = key_err(fx_mq_key_producer_member(&c->keys, chan, p->pidx, &p->k_member), "member")) ||
        (e = key_err(fx_mq_key_producer_weight(&c->keys, chan, p->pidx, &p->k_weight), "weight")) ||
        (e = key_err(fx_mq_key_produce_offset(&c->keys, chan, p->pidx, &p->k_offset), "offset")) ||
        (e = key_err(pay_prefix(&p->m, &p->k_prefix), "payload prefix")))
        return e;
    if (prod_abort_requested(p)) return fx_seterr(FX_ECLOSED, "mpsc producer closed while opening");
    fx_mq_producer_meta pm = {.producer_idx = p->pidx, .has_external_client_id = true};
    snprintf(pm.external_client_id, sizeof pm.external_client_id, "%s", c->client_id);
    char *js = NULL;
    if ((e = fx_mq_producer_meta_encode(&pm, &js))) return e;
    char wv[FX_MQ_DEC_BUF];
    size_t wl = fx_mq_dec_format(p->weight, wv);
    fx_slice wk = fx_mq_key_slice(&p->k_weight);
    e = member_txn(c, fx_mq_key_slice(&p->m.k_meta), fx_mq_key_slice(&p->k_member),
                   FX_SLICE_STR(js), p->m.member_lease, &wk,
                   (fx_slice){wv, wl}, p->m.meta.global_lease_id, NULL, NULL);
    free(js);
    if (e) return e;
    p->member_written = true;
    int64_t cur;
    if ((e = read_offset(c, &p->k_offset, &cur))) return e;
    p->next = cur + 1;
    return FX_OK;
}

static fx_err prod_open(fx_mq_client *c, int64_t chan, int64_t weight,
                        const fx__mpsc_parent *parent, fx_mpsc_producer **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mpsc producer open: NULL out");
    *out = NULL;
    if (!c || chan < 0 || weight < 0)
        return fx_seterr(FX_EINVAL, "mpsc producer open: bad arguments");
    if (parent && (parent->member < 0 || parent->member_lease <= 0))
        return fx_seterr(FX_EINVAL, "mpsc producer open: parent member and member lease required");
    fx_mpsc_producer *p = calloc(1, sizeof *p);
    if (!p) return fx_seterr(FX_ENOMEM, "mpsc producer open: out of memory");
    p->c = c;
    p->weight = weight ? weight : 1;
    p->pidx = -1;
    p->m.chan = chan;
    p->m.sub = parent != NULL;
    fx_life_init(&p->lf, true);
    if (pthread_mutex_init(&p->mu, NULL) || pthread_mutex_init(&p->put_mu, NULL) ||
        fx_cond_init_monotonic(&p->cv)) {
        free(p); /* (a failed init leaves nothing to destroy on Linux) */
        return fx_seterr(FX_ENOMEM, "mpsc producer open: sync init failed");
    }
    fx_err e;
    if (!parent) {
        p->ep.close = prod_close_cb;
        p->ep.self = p;
        if ((e = fx__mq_register(c, &p->ep))) {
            prod_destroy(p);
            return e;
        }
    }
    if ((e = fx__mq_op_enter(c)) == FX_OK) {
        e = prod_build(p, chan, parent);
        fx__mq_op_leave(c);
    }
    pthread_mutex_lock(&p->mu);
    bool aborted = fx_life_constructed(&p->lf, &p->cv);
    pthread_mutex_unlock(&p->mu);
    if (e || aborted) {
        if (!e) e = fx_seterr(FX_ECLOSED, "mpsc producer closed while opening");
        bool held = fx_err_hold();
        fx_mpsc_producer_free(p);
        fx_err_release(held);
        return e;
    }
    FX_DBG("mpsc producer %lld/%lld open (next id %lld)", (long long)chan, (long long)p->pidx,
           (long long)p->next);
    *out = p;
    return FX_OK;
}

fx_err fx_mpsc_producer_open(fx_mq_client *c, int64_t chan, int64_t weight,
                             fx_mpsc_producer **out)
{
    return prod_open(c, chan, weight, NULL, out);
}

fx_err fx__mpsc_producer_open_sub(fx_mq_client *c, int64_t chan, int64_t weight,
                                  const fx__mpsc_parent *parent, fx_mpsc_producer **out)
{
    if (!parent) {
        if (out) *out = NULL;
        return fx_seterr(FX_EINVAL, "sub-producer open: NULL parent");
    }
    return prod_open(c, chan, weight, parent, out);
}
