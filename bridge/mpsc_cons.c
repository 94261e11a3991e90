/* mpsc_cons.c -- the MPSC consumer: open/close, the watch-driven read path, acks and commits
 * (described in mpsc.c's head comment; when commits run: commit_pool.h; payload deletes per
 * plane: plane.h). Shared bits: mpsc_int.h. */
#include "mpsc_int.h"

#include "commit_pool.h"

/* ======================================================================================== *
 * Consumer                                                                                 *
 * ======================================================================================== */

/* One fetched payload segment: ids [first, last]; `next` is the next id to hand out from it.
 * bad: the value did not decode (its ids are skipped). */
typedef struct seg_run {
    int64_t first, last, next;
    bool bad;
    fx_seg_iter it;
} seg_run;

static void runs_clear(fx_range_resp *segs, seg_run **runs, size_t *n_runs, size_t *run_i)
{
    fx_range_resp_free(segs);
    free(*runs);
    *runs = NULL;
    *n_runs = *run_i = 0;
}

/* Per-producer read state. Ids: [0, ack_base) acked (or skipped), [ack_base, next_fetch) handed
 * out (win holds their acked flags), [next_fetch, produce] stored and not yet handed out. */
typedef struct pstate {
    int64_t pidx;
    int64_t produce;    /* last written id (watch; -1 none) */
    int64_t start;      /* resume point: ids below were never handed out by this consumer */
    int64_t next_fetch; /* next id to hand out */
    int64_t ack_base;   /* every id below is acked */
    int64_t committed;  /* consume offset written to etcd */
    bool del_pending;   /* payloads below `committed` may still exist (split planes) */
    uint8_t *win;       /* ring of acked flags for [ack_base, next_fetch) */
    size_t cap, head;
    /* Segment layout: segments fetched and not yet fully handed out (touched by get() under mu).
     * Invariant while n_runs > run_i: every id in [next_fetch, runs[run_i].first) is known to
     * have no message, and runs[run_i..] hold ids >= next_fetch in id order. */
    fx_range_resp segs; /* owns the values the runs point into */
    seg_run *runs;
    size_t n_runs, run_i;
} pstate;

typedef struct resume_pt {
    int64_t pidx, off;
} resume_pt;

struct fx_mpsc_consumer {
    fx__mq_endpoint ep;
    fx_mq_client *c;
    chan_mgr m;
    int64_t cidx;
    fx_mq_key k_member;
    int64_t member_rev; /* create revision of k_member (the attempt writes' fence) */
    bool member_written;
    bool member_deleted;
    fx_pwatch *pw; /* registered with the client's produce-offset watch (NULL: not) */
    void (*notify)(void *arg); /* fx_mpmc_consumer_set_notify (under mu) */
    void *notify_arg;
    fx_commit_slot *cslot; /* commit rounds on the client's executor (under mu; NULL: none) */
    bool cq_attached; /* closing thread only: a final commit is due at close */

    pthread_mutex_t get_mu; /* serialises gets */

    pthread_mutex_t mu;        /* everything below and lf */
    pthread_cond_t cv;         /* close progress, flush waiters */
    pthread_cond_t data_cv;    /* get waiters (watch, close, fault) */
    pthread_cond_t commit_cv;  /* unused (kept for the destroy order) */
    life lf;
    pstate *ps;
    size_t n_ps, cap_ps, rr;
    resume_pt *resume;
    size_t n_resume;
    uint64_t ack_seq;    /* bumps when some ack_base advances */
    uint64_t commit_seq; /* ack_seq value fully committed */
    fx_log_slot skip_log, commit_log;
    stats st;
    fx_err final_err;       /* the commit thread's final commit failed (written before join) */
    char final_detail[256];
    fx_err retry_err;       /* FX_LIFE_RETRY: the strong error of the last close (under mu) */
};

static pstate *ps_find(fx_mpsc_consumer *c, int64_t pidx)
{
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].pidx == pidx) return &c->ps[i];
    return NULL;
}

static pstate *ps_add(fx_mpsc_consumer *c, int64_t pidx)
{
    pstate *s = ps_find(c, pidx);
    if (s) return s;
    if (c->n_ps >= MAX_PRODUCERS) return NULL;
    if (c->n_ps == c->cap_ps) {
        size_t nc = c->cap_ps ? c->cap_ps * 2 : 8;
        pstate *np = realloc(c->ps, nc * sizeof *np);
        if (!np) return NULL;
        c->ps = np;
        c->cap_ps = nc;
    }
    int64_t start = FX_MQ_CONSUME_OFFSET_BEGIN;
    for (size_t i = 0; i < c->n_resume; i++)
        if (c->resume[i].pidx == pidx) start = c->resume[i].off;
    s = &c->ps[c->n_ps++];
    *s = (pstate){.pidx = pidx, .produce = FX_MQ_PRODUCE_OFFSET_BEGIN, .start = start,
                  .next_fetch = start, .ack_base = start, .committed = start,
                  .del_pending = !fx__plane_fused(c->c)};
    return s;
}

static size_t win_len(const pstate *s) { return (size_t)(s->next_fetch - s->ack_base); }

static uint8_t *win_at(pstate *s, size_t i) { return &s->win[(s->head + i) & (s->cap - 1)]; }

/* Room for `add` more flags. */
static bool win_reserve(pstate *s, size_t add)
{
    size_t len = win_len(s), need = len + add;
    if (need <= s->cap) return true;
    size_t nc = s->cap ? s->cap : 64;
    while (nc < need) nc *= 2;
    uint8_t *nw = malloc(nc);
    if (!nw) return false;
    for (size_t i = 0; i < len; i++) nw[i] = *win_at(s, i);
    free(s->win);
    s->win = nw;
    s->cap = nc;
    s->head = 0;
    return true;
}

/* Pop the acked prefix; true when ack_base moved. */
static bool win_advance(pstate *s)
{
    bool moved = false;
    while (s->ack_base < s->next_fetch && *win_at(s, 0)) {
        *win_at(s, 0) = 0;
        s->head = (s->head + 1) & (s->cap - 1);
        s->ack_base++;
        moved = true;
    }
    return moved;
}

static void cons_on_expired(void *arg, fx_lease *h, int64_t id)
{
    (void)h;
    fx_mpsc_consumer *c = arg;
    pthread_mutex_lock(&c->mu);
    if (life_lease_lost(&c->lf))
        FX_WRN("mpsc consumer %lld/%lld: lease %lld expired; closing the consumer",
               (long long)c->m.chan, (long long)c->cidx, (long long)id);
    pthread_cond_broadcast(&c->data_cv);
    if (c->notify && !c->lf.constructing) c->notify(c->notify_arg);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static fx_err cons_gate_locked(fx_mpsc_consumer *c, bool *self_close)
{
    return life_gate(&c->lf, "consumer", c->m.chan, c->cidx, self_close);
}

/* A produce offset (shared watch or the read at open): merge monotonically (max) under mu, wake
 * getters when it moved. */
static bool cons_merge_locked(fx_mpsc_consumer *c, int64_t pidx, int64_t off)
{
    pstate *s = ps_add(c, pidx);
    if (!s) {
        FX_ERR("mpsc consumer %lld: cannot track producer %lld (memory or %d producers)",
               (long long)c->m.chan, (long long)pidx, MAX_PRODUCERS);
        return false;
    }
    if (off <= s->produce) return false;
    s->produce = off;
    return true;
}

static void cons_pwatch_cb(void *arg, int64_t pidx, int64_t off)
{
    fx_mpsc_consumer *c = arg;
    pthread_mutex_lock(&c->mu);
    if (cons_merge_locked(c, pidx, off)) {
        pthread_cond_broadcast(&c->data_cv);
        if (c->notify) c->notify(c->notify_arg);
    }
    pthread_mutex_unlock(&c->mu);
}

void fx__mpsc_consumer_set_notify(fx_mpsc_consumer *c, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->notify = fn;
    c->notify_arg = arg;
    pthread_mutex_unlock(&c->mu);
}

/* Every key under prefix `pre` (one range read, the client's op deadline); on error *rr is
 * empty. */
static fx_err range_prefix(fx_mq_client *cl, const fx_mq_key *pre, fx_range_resp *rr)
{
    uint8_t end[FX_MQ_KEY_CAP];
    size_t el = fx_prefix_end(fx_mq_key_slice(pre), end);
    fx_range_req rq = {.key = fx_mq_key_slice(pre), .range_end = {end, el}};
    fx_err e = fx_etcd_range(cl->etcd, &rq, rr, cl->op_timeout_ms);
    if (e) {
        fx_range_resp_free(rr);
        memset(rr, 0, sizeof *rr);
    }
    return e;
}

/* The channel's produce offsets, read once after registering with the shared watch (events
 * written before the registration are in this read; later ones come from the watch). */
static fx_err read_produce(fx_mpsc_consumer *c)
{
    fx_mq_client *cl = c->c;
    fx_mq_key pre;
    fx_err e = key_err(fx_mq_prefix_produce_offsets(&cl->keys, c->m.chan, &pre), "prefix");
    if (e) return e;
    fx_range_resp rr = {0};
    if ((e = range_prefix(cl, &pre, &rr))) return e;
    bool changed = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < rr.n_kvs; i++) {
        int64_t ch = -1, pidx = -1, off = -1;
        const fx_kv *kv = &rr.kvs[i];
        if (fx_mq_parse_produce_offset_key(&cl->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) ||
            ch != c->m.chan || fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &off)) {
            FX_WRN("mpsc consumer %lld: ignoring a malformed produce offset entry",
                   (long long)c->m.chan);
            continue;
        }
        if (cons_merge_locked(c, pidx, off)) changed = true;
    }
    if (changed) pthread_cond_broadcast(&c->data_cv);
    pthread_mutex_unlock(&c->mu);
    fx_range_resp_free(&rr);
    return FX_OK;
}

/* ---- commit --------------------------------------------------------------------------------- */

typedef struct commit_item {
    int64_t pidx, to;
    bool advance; /* offset moves to `to` */
} commit_item;

/* Write one group: offsets (global lease) and payload deletes of [0, to). Fused plane: one txn.
 * Else the offsets txn, then one delete_range per producer. *landed: the offsets were written;
 * deleted[i]: the payloads below it[i].to are gone. */
static fx_err commit_group(fx_mpsc_consumer *c, const commit_item *it, size_t n, int timeout_ms,
                           bool *landed, bool *deleted)
{
    fx_mq_client *cl = c->c;
    fx_err e = FX_OK;
    *landed = false;
    for (size_t i = 0; i < n; i++) deleted[i] = false;
    fx_mq_key *ok = calloc(n, sizeof *ok);
    fx_mq_key (*rng)[2] = calloc(n, sizeof *rng); /* the payload range [0, to) of each */
    char (*vals)[FX_MQ_DEC_BUF] = calloc(n, sizeof *vals);
    fx_op *ops = calloc(2 * n, sizeof *ops);
    fx_plane_dels pd = {0};
    if (!ok || !rng || !vals || !ops) {
        e = fx_seterr(FX_ENOMEM, "mpsc commit: out of memory");
        goto out;
    }
    if ((e = fx__plane_dels_init(&pd, cl, n))) goto out;
    size_t nops = 0;
    for (size_t i = 0; i < n; i++) {
        if (!it[i].advance) continue;
        if ((e = key_err(fx_mq_key_consume_offset(&cl->keys, c->m.chan, it[i].pidx, &ok[i]),
                         "consume offset")))
            goto out;
        size_t vl = fx_mq_dec_format(it[i].to, vals[i]);
        ops[nops++] = (fx_op){.type = FX_OP_PUT,
                              .u.put = {.key = fx_mq_key_slice(&ok[i]), .value = {vals[i], vl},
                                        .lease = c->m.meta.global_lease_id}};
    }
    for (size_t i = 0; i < n; i++) {
        if ((e = key_err(pay_key(&c->m, it[i].pidx, 0, &rng[i][0]), "payload")) ||
            (e = key_err(pay_key(&c->m, it[i].pidx, it[i].to, &rng[i][1]), "payload")) ||
            (e = fx__plane_dels_txn_op(&pd, i, &rng[i][0], &rng[i][1], ops, &nops)))
            goto out;
    }
    if (nops) {
        /* Fencing: the offsets move only while this consumer's membership key exists.
         * It lives under the member lease, so a consumer whose lease expired (a bridge cut off
         * from etcd for longer than the TTL, its sub-MPSC claimed by another member since) cannot
         * commit late: the compare fails and the commit is refused. */
        fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_GREATER,
                      .key = fx_mq_key_slice(&c->k_member), .num = 0};
        fx_txn_req tx = {.cmp = &cmp, .n_cmp = c->member_written ? 1 : 0, .success = ops,
                         .n_success = nops};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(cl->etcd, &tx, &resp, timeout_ms);
        bool refused = e == FX_OK && !resp.succeeded;
        fx_txn_resp_free(&resp);
        if (e) goto out;
        if (refused) {
            FX_WRN("mpsc consumer %lld/%lld: commit refused: its membership is gone (member lease "
                   "expired): fenced; %zu producer offset(s) not moved",
                   (long long)c->m.chan, (long long)c->cidx, nops);
            e = fx_seterr(FX_ELEASE_LOST, "mpsc consumer %lld/%lld: commit refused (fenced): "
                          "membership gone", (long long)c->m.chan, (long long)c->cidx);
            goto out;
        }
    }
    *landed = true;
    for (size_t i = 0; i < n; i++) {
        /* offsets landed; a failed delete is retried next round (del_pending) */
        if ((e = fx__plane_dels_after(&pd, &rng[i][0], &rng[i][1], timeout_ms))) goto out;
        deleted[i] = true;
    }
out:
    fx__plane_dels_free(&pd);
    free(ops);
    free(vals);
    free(rng);
    free(ok);
    return e;
}

/* One commit round over every producer whose acked prefix moved (or whose payload delete is
 * pending). FX_OK when everything gathered was written; then commit_seq catches up. */
static fx_err commit_round(fx_mpsc_consumer *c, int timeout_ms, bool *did)
{
    *did = false;
    pthread_mutex_lock(&c->mu);
    uint64_t seq = c->ack_seq;
    size_t n = 0;
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].ack_base > c->ps[i].committed || c->ps[i].del_pending) n++;
    commit_item *it = n ? calloc(n, sizeof *it) : NULL;
    if (n && !it) {
        pthread_mutex_unlock(&c->mu);
        return fx_seterr(FX_ENOMEM, "mpsc commit: out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < c->n_ps && k < n; i++) {
        pstate *s = &c->ps[i];
        if (s->ack_base > s->committed)
            it[k++] = (commit_item){s->pidx, s->ack_base, true};
        else if (s->del_pending)
            it[k++] = (commit_item){s->pidx, s->committed, false};
    }
    pthread_mutex_unlock(&c->mu);
    fx_err e = FX_OK;
    bool deleted[COMMIT_GROUP];
    for (size_t g = 0; g < n && !e; g += COMMIT_GROUP) {
        size_t gn = n - g < COMMIT_GROUP ? n - g : COMMIT_GROUP;
        bool landed = false;
        e = commit_group(c, it + g, gn, timeout_ms, &landed, deleted);
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < gn; i++) {
            pstate *s = ps_find(c, it[g + i].pidx);
            if (!s) continue;
            if (landed && it[g + i].advance) {
                if (it[g + i].to > s->committed) s->committed = it[g + i].to;
                s->del_pending = !fx__plane_fused(c->c);
            }
            if (deleted[i] && s->committed == it[g + i].to) s->del_pending = false;
        }
        pthread_mutex_unlock(&c->mu);
        if (landed) *did = true;
    }
    free(it);
    if (!e) {
        pthread_mutex_lock(&c->mu);
        if (seq > c->commit_seq) c->commit_seq = seq;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return e;
}

static bool commit_dirty(const fx_mpsc_consumer *c)
{
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].ack_base > c->ps[i].committed || c->ps[i].del_pending) return true;
    return false;
}

/* ---- commits -------------------------------------------------------------------------------------
 * Each consumer has a commit slot (commit_pool.h) on the client's executor: its rounds run on the
 * executor's commit kind (FX_MQ_COMMIT_THREADS threads per client-owned executor), one at a time
 * per consumer and in order, and a slow consumer holds one of those threads at most; a failed
 * round is retried after a backoff (50 ms doubling to 1 s). The final commit of a close runs in
 * the closing thread after the consumer left its slot. Lock order: a consumer's mu, then the
 * executor's (commit_kick); rounds take the consumer's mu themselves. */

/* Acks to commit (or a flush): run a round soon. c->mu held. */
static void commit_kick(fx_mpsc_consumer *c)
{
    fx_commit_slot_kick(c->cslot);
}

/* One round (on a commit thread of the executor). */
static fx_commit_res commit_step(void *arg, int64_t retry_in_ms)
{
    fx_mpsc_consumer *c = arg;
    pthread_mutex_lock(&c->mu);
    bool skip = c->lf.stop || c->lf.fault != FX_OK || !commit_dirty(c);
    pthread_mutex_unlock(&c->mu);
    if (skip) return FX_COMMIT_IDLE;
    fx_err e = fx__mq_op_enter(c->c);
    if (e) return FX_COMMIT_RETRY; /* the client is closing: retried until the consumer leaves */
    bool did = false;
    e = commit_round(c, c->c->op_timeout_ms, &did);
    fx__mq_op_leave(c->c);
    if (did) c->st.commits++;
    if (e == FX_ELEASE_LOST) { /* fenced: the consumer is over (its next call closes it) */
        pthread_mutex_lock(&c->mu);
        life_lease_lost(&c->lf);
        pthread_cond_broadcast(&c->data_cv);
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return FX_COMMIT_IDLE;
    }
    if (e) {
        c->st.commit_retries++;
        fx_log_ratelimited(&c->commit_log, 5000, FX_LOG_WRN,
                           "mpsc consumer %lld/%lld: commit failed: %s (%s); retrying in %lld ms",
                           (long long)c->m.chan, (long long)c->cidx, fx_errname(e),
                           fx_err_detail(), (long long)retry_in_ms);
        return FX_COMMIT_RETRY;
    }
    pthread_mutex_lock(&c->mu);
    bool redo = !c->lf.stop && c->lf.fault == FX_OK && commit_dirty(c);
    pthread_mutex_unlock(&c->mu);
    return redo ? FX_COMMIT_AGAIN : FX_COMMIT_IDLE;
}

/* Leave the slot: after it returns no commit round runs for c. */
static void commit_detach(fx_mpsc_consumer *c)
{
    pthread_mutex_lock(&c->mu);
    fx_commit_slot *s = c->cslot;
    c->cslot = NULL;
    pthread_mutex_unlock(&c->mu);
    fx_commit_slot_free(s); /* waits for a running round (it takes c->mu: not held here) */
}

/* The close's one final bounded commit attempt (in the closing thread, after commit_detach). */
static void commit_final(fx_mpsc_consumer *c)
{
    pthread_mutex_lock(&c->mu);
    bool faulted = c->lf.fault != FX_OK;
    pthread_mutex_unlock(&c->mu);
    if (faulted) return; /* a lost lease: no more writes */
    if (fx__mq_op_enter(c->c) != FX_OK) return;
    bool did = false;
    fx_err e = commit_round(c, c->c->close_timeout_ms, &did);
    fx__mq_op_leave(c->c);
    if (did) c->st.commits++;
    if (e == FX_ELEASE_LOST) { /* fenced: nothing of ours may be committed any more */
        pthread_mutex_lock(&c->mu);
        life_lease_lost(&c->lf);
        pthread_mutex_unlock(&c->mu);
    }
    if (e) {
        c->final_err = e;
        snprintf(c->final_detail, sizeof c->final_detail, "%s", fx_err_detail());
        if (c->m.sub)
            FX_WRN("mpsc consumer %lld/%lld close: final commit failed: %s (%s); the "
                   "uncommitted messages will be delivered again",
                   (long long)c->m.chan, (long long)c->cidx, fx_errname(e), fx_err_detail());
    }
}

/* ---- get / ack / flush ------------------------------------------------------------------------- */

static fx_err cons_close_impl(fx_mpsc_consumer *c, bool force, bool *unfinished);

void fx_mq_delivery_free(fx_mq_delivery *d)
{
    if (!d) return;
    fx_bytes_free(&d->value);
    memset(d, 0, sizeof *d);
}

/* Pick a ready producer round robin; fills *pidx, *from, *to. Called with mu held. */
static bool pick(fx_mpsc_consumer *c, size_t want, int64_t *pidx, int64_t *from, int64_t *to,
                 int64_t *hi)
{
    for (size_t k = 0; k < c->n_ps; k++) {
        size_t i = (c->rr + k) % c->n_ps;
        pstate *s = &c->ps[i];
        size_t inflight = win_len(s);
        if (s->produce < s->next_fetch || inflight >= MAX_UNACKED) continue;
        int64_t n = min64((int64_t)want, (int64_t)(MAX_UNACKED - inflight));
        n = min64(n, s->produce - s->next_fetch + 1);
        *pidx = s->pidx;
        *from = s->next_fetch;
        *to = s->next_fetch + n - 1;
        *hi = s->produce;
        c->rr = i + 1;
        return true;
    }
    return false;
}

/* Skipped ids of producer pidx in [from, to]: one rate-limited warning. Called with mu held. */
static void note_skipped(fx_mpsc_consumer *c, pstate *s, uint64_t skipped, int64_t from,
                         int64_t to, const char *why)
{
    c->st.skipped_ids += skipped;
    atomic_fetch_add(&c->c->payload_missing, skipped);
    fx_log_ratelimited(&c->skip_log, SKIP_LOG_MS, FX_LOG_ERR,
                       "mpsc consumer %lld/%lld: %llu message id(s) of producer %lld in "
                       "[%lld, %lld] %s; skipped",
                       (long long)c->m.chan, (long long)c->cidx, (unsigned long long)skipped,
                       (long long)s->pidx, (long long)from, (long long)to, why);
    if (win_advance(s)) {
        c->ack_seq++;
        commit_kick(c);
    }
}

/* A read found the channel's whole payload lease gone from the payload plane (Redis: the lease's
 * set expired, was evicted or deleted; fx_kv_get_range_lease): a lost plane, never "payloads
 * missing, skip". The consumer stops as on a lost lease (the data path stops, the next call
 * reports FX_ELEASE_LOST and closes without committing): nothing is committed past the gap, so
 * the ids stay unconsumed in the control plane. Counted in the client's plane_lost. Called without
 * mu. */
static void plane_lost(fx_mpsc_consumer *c, int64_t pidx, int64_t from)
{
    char why[256];
    snprintf(why, sizeof why, "%s", fx_err_detail());
    pthread_mutex_lock(&c->mu);
    bool first = life_lease_lost(&c->lf);
    pthread_cond_broadcast(&c->data_cv);
    if (first && c->notify && !c->lf.constructing) c->notify(c->notify_arg);
    pthread_mutex_unlock(&c->mu);
    if (!first) return;
    atomic_fetch_add(&c->c->plane_lost, 1);
    FX_ERR("mpsc consumer %lld/%lld: payload lease %lld is gone from the payload plane (%s): the "
           "messages of producer %lld from id %lld on are lost; the consumer stops without "
           "committing past them (fluxon_payload_plane_lost_total)",
           (long long)c->m.chan, (long long)c->cidx, (long long)c->m.meta.payload_lease_id, why,
           (long long)pidx, (long long)from);
}

/* Segment fetch for producer pidx, ids from `from` on (hi: its produce offset). Every index scan
 * is bounded (etcd 3.4 walks every key of a range's interval, whatever its limit):
 *   1. every segment whose key (last id) is in [from, wend]: one range, no limit; wend <= hi
 *      and wend - from < the caller's window, so at most that many keys;
 *   2. if none: the first segment with last id in (wend, min(hi, from + FX_SEG_MAX_MSGS - 1)]
 *      (limit 1): it holds `from` when `from` is inside a segment longer than the window, since
 *      a segment holds at most FX_SEG_MAX_MSGS ids.
 * On FX_OK *segs owns the values and *runs (malloc'd, *n runs, key order) describe them;
 * *scanned is the last id the fetch looked at: ids in [from, *scanned] that no run covers have
 * no message. Foreign keys in the range are ignored (a window of nothing else counts as empty);
 * values that do not decode become bad runs. */
static fx_err seg_fetch(fx_mpsc_consumer *c, int64_t pidx, int64_t from, int64_t wend, int64_t hi,
                        fx_range_resp *segs, seg_run **runs, size_t *n, int64_t *scanned)
{
    fx_mq_client *cl = c->c;
    int64_t lo = from, end = wend, limit = 0;
    *runs = NULL;
    *n = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            lo = wend + 1;
            end = min64(hi, from + FX_SEG_MAX_MSGS - 1);
            limit = 1;
            if (lo > end) break;
        }
        fx_mq_key ks, ke;
        fx_err e;
        if ((e = key_err(pay_key(&c->m, pidx, lo, &ks), "payload")) ||
            (e = key_err(pay_key(&c->m, pidx, end + 1, &ke), "payload")))
            return e;
        c->st.fetches++;
        if ((e = fx_kv_get_range_lease(cl->kv, c->m.meta.payload_lease_id, fx_mq_key_slice(&ks),
                                       fx_mq_key_slice(&ke), limit, segs, cl->kv_timeout_ms))) {
            fx_range_resp_free(segs);
            return e;
        }
        *scanned = end;
        if (segs->n_kvs == 0) {
            fx_range_resp_free(segs);
            continue;
        }
        seg_run *r = calloc(segs->n_kvs, sizeof *r);
        if (!r) {
            fx_range_resp_free(segs);
            return fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
        }
        size_t k = 0;
        for (size_t i = 0; i < segs->n_kvs; i++) {
            const fx_kv *kv = &segs->kvs[i];
            int64_t kp = -1, last = -1;
            if (pay_parse(&c->m, (fx_slice){kv->key.data, kv->key.len}, &kp, &last) != FX_OK ||
                kp != pidx || last < from || (k > 0 && last <= r[k - 1].last))
                continue;
            seg_run *x = &r[k];
            bool ok = fx_seg_open(kv->value.data, kv->value.len, &x->it) == FX_OK &&
                      (int64_t)x->it.n <= last + 1;
            int64_t first = ok ? last - (int64_t)x->it.n + 1 : 0;
            if (ok && k > 0 && first <= r[k - 1].last) { /* overlaps the previous segment */
                ok = false;
                fx_seterr(FX_EPROTO, "segment overlaps the one ending at %lld",
                          (long long)r[k - 1].last);
            }
            if (!ok) {
                FX_WRN("mpsc consumer %lld/%lld: payload segment of producer %lld ending at id "
                       "%lld is corrupt (%s)", (long long)c->m.chan, (long long)c->cidx,
                       (long long)pidx, (long long)last, fx_err_detail());
                x->bad = true;
                first = k > 0 ? r[k - 1].last + 1 : from;
            }
            x->first = x->next = first;
            x->last = last;
            k++;
        }
        if (k == 0) { /* only foreign keys: as if empty, so the next pass still looks */
            free(r);
            fx_range_resp_free(segs);
            continue;
        }
        *runs = r;
        *n = k;
        return FX_OK;
    }
    return FX_OK;
}

/* Segment layout: hand out ids [from, <= to] of producer pidx (hi: its produce offset when
 * picked) from the fetched segments, fetching (seg_fetch) when none is buffered. Ids known to
 * have no message (a hole, a corrupt segment, nothing stored for them) are skipped as acked.
 * Called from get() with get_mu held and mu not held. */
static fx_err seg_get(fx_mpsc_consumer *c, int64_t pidx, int64_t from, int64_t to, int64_t hi,
                      fx_mq_delivery *out, size_t *got)
{
    pthread_mutex_lock(&c->mu);
    pstate *s = ps_find(c, pidx);
    bool have = s && s->run_i < s->n_runs;
    pthread_mutex_unlock(&c->mu);

    fx_range_resp segs = {0};
    seg_run *runs = NULL;
    size_t n_runs = 0;
    int64_t scanned = from - 1;
    fx_err e;
    if (!have && (e = seg_fetch(c, pidx, from, to, hi, &segs, &runs, &n_runs, &scanned)))
        return e;

    pthread_mutex_lock(&c->mu);
    s = ps_find(c, pidx);
    if (!s || s->next_fetch != from || c->lf.stop) {
        bool stopped = c->lf.stop;
        pthread_mutex_unlock(&c->mu);
        size_t z = 0;
        runs_clear(&segs, &runs, &n_runs, &z);
        return stopped ? FX_OK : fx_seterr(FX_EPROTO, "mpsc get: producer state moved");
    }
    if (!have) {
        runs_clear(&s->segs, &s->runs, &s->n_runs, &s->run_i);
        s->segs = segs;
        s->runs = runs;
        s->n_runs = n_runs;
    }
    /* Last id this call may settle: up to `to`, and not past what is buffered (ids after the
     * last run are unknown yet) unless the fetch found nothing for them. */
    int64_t end = s->run_i < s->n_runs ? min64(to, s->runs[s->n_runs - 1].last)
                                       : min64(to, scanned);
    if (end < from) end = from; /* nothing buffered and nothing scanned: cannot happen */
    if (!win_reserve(s, (size_t)(end - from + 1))) {
        pthread_mutex_unlock(&c->mu);
        return fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
    }
    uint64_t skipped = 0, corrupt = 0;
    e = FX_OK;
    for (int64_t id = from; id <= end; id++) {
        while (s->run_i < s->n_runs && s->runs[s->run_i].last < id) s->run_i++;
        seg_run *r = s->run_i < s->n_runs ? &s->runs[s->run_i] : NULL;
        size_t slot = win_len(s);
        if (r && !r->bad && id >= r->first) {
            fx_seg_iter peek = r->it;
            fx_slice m;
            while (r->next < id && fx_seg_next(&peek, &m)) r->next++; /* resume inside it */
            uint8_t *buf = fx_seg_next(&peek, &m) ? malloc(m.len + 1) : NULL;
            if (!buf) {
                e = fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
                break;
            }
            memcpy(buf, m.data, m.len);
            buf[m.len] = 0;
            r->it = peek;
            r->next = id + 1;
            out[*got] = (fx_mq_delivery){.id = {c->m.chan, pidx, id}, .value = {buf, m.len}};
            (*got)++;
            *win_at(s, slot) = 0;
        } else {
            skipped++;
            if (r && r->bad && id >= r->first) corrupt++;
            *win_at(s, slot) = 1; /* treated as acked */
        }
        s->next_fetch = id + 1;
    }
    while (s->run_i < s->n_runs && s->runs[s->run_i].last < s->next_fetch) s->run_i++;
    if (s->run_i >= s->n_runs) runs_clear(&s->segs, &s->runs, &s->n_runs, &s->run_i);
    if (skipped)
        note_skipped(c, s, skipped, from, s->next_fetch - 1,
                     corrupt ? "are missing or in a corrupt segment"
                             : "are missing below the produce offset");
    pthread_mutex_unlock(&c->mu);
    return e;
}

fx_err fx_mpsc_get(fx_mpsc_consumer *c, fx_mq_delivery *out, size_t max, size_t *n,
                   int timeout_ms)
{
    if (n) *n = 0;
    if (!c || !out || !n || max == 0) return fx_seterr(FX_EINVAL, "mpsc get: bad arguments");
    bool self_close = false;
    pthread_mutex_lock(&c->mu);
    fx_err e = cons_gate_locked(c, &self_close);
    pthread_mutex_unlock(&c->mu);
    if (e) {
        if (self_close) cons_close_impl(c, false, NULL);
        return e;
    }
    fx_mq_client *cl = c->c;
    if ((e = fx__mq_op_enter(cl))) return e;
    pthread_mutex_lock(&c->get_mu);
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    size_t got = 0;
    for (;;) {
        int64_t pidx, from, to, hi;
        pthread_mutex_lock(&c->mu);
        e = cons_gate_locked(c, &self_close);
        if (e) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        if (!pick(c, max - got, &pidx, &from, &to, &hi)) {
            if (got > 0) {
                pthread_mutex_unlock(&c->mu);
                break;
            }
            if (fx_ms_left(deadline) <= 0) {
                pthread_mutex_unlock(&c->mu);
                e = fx_seterr(FX_ETIMEDOUT, "mpsc get: no message");
                break;
            }
            struct timespec ts = fx_deadline_ts(deadline);
            pthread_cond_timedwait(&c->data_cv, &c->mu, &ts);
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);

        if (c->m.meta.segments) {
            e = seg_get(c, pidx, from, to, hi, out, &got);
            if (e == FX_ELEASE_EXPIRED) {
                plane_lost(c, pidx, from);
                continue; /* the gate reports it and closes */
            }
            if (e) break;
            if (got >= max) break;
            continue;
        }
        fx_mq_key ks, ke;
        if ((e = key_err(pay_key(&c->m, pidx, from, &ks), "payload")) ||
            (e = key_err(pay_key(&c->m, pidx, to + 1, &ke), "payload")))
            break;
        fx_range_resp rr = {0};
        c->st.fetches++;
        e = fx_kv_get_range_lease(cl->kv, c->m.meta.payload_lease_id, fx_mq_key_slice(&ks),
                                  fx_mq_key_slice(&ke), to - from + 1, &rr, cl->kv_timeout_ms);
        if (e == FX_ELEASE_EXPIRED) {
            fx_range_resp_free(&rr);
            plane_lost(c, pidx, from);
            continue; /* the gate reports it and closes */
        }
        if (e) {
            fx_range_resp_free(&rr);
            break;
        }
        pthread_mutex_lock(&c->mu);
        pstate *s = ps_find(c, pidx);
        bool ok = s && s->next_fetch == from && !c->lf.stop &&
                  win_reserve(s, (size_t)(to - from + 1));
        if (!ok) {
            bool stopped = c->lf.stop;
            pthread_mutex_unlock(&c->mu);
            fx_range_resp_free(&rr);
            if (stopped) continue; /* the gate reports it */
            e = fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
            break;
        }
        size_t j = 0; /* next kv */
        uint64_t skipped = 0;
        for (int64_t id = from; id <= to; id++) {
            int64_t kp = -1, kid = -1;
            while (j < rr.n_kvs) {
                fx_slice key = {rr.kvs[j].key.data, rr.kvs[j].key.len};
                if (pay_parse(&c->m, key, &kp, &kid) == FX_OK && kp == pidx && kid >= id) break;
                j++; /* foreign or malformed key inside the range: ignore */
            }
            size_t slot = win_len(s);
            s->next_fetch = id + 1;
            if (j < rr.n_kvs && kid == id) {
                out[got].id = (fx_mq_msg_id){c->m.chan, pidx, id};
                out[got].value = rr.kvs[j].value;
                rr.kvs[j].value = (fx_bytes){0};
                got++;
                j++;
                *win_at(s, slot) = 0;
            } else {
                skipped++;
                *win_at(s, slot) = 1; /* treated as acked */
            }
        }
        if (skipped) note_skipped(c, s, skipped, from, to, "are missing below the produce offset");
        pthread_mutex_unlock(&c->mu);
        fx_range_resp_free(&rr);
        if (got >= max) break;
    }
    pthread_mutex_unlock(&c->get_mu);
    fx__mq_op_leave(cl);
    if (e && got > 0) {
        if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
            for (size_t i = 0; i < got; i++) fx_mq_delivery_free(&out[i]);
            got = 0;
        } else {
            e = FX_OK; /* a later fetch failed: return what we have */
        }
    }
    if (self_close) cons_close_impl(c, false, NULL);
    c->st.got_msgs += got;
    *n = got;
    return e;
}

fx_err fx_mpsc_ack(fx_mpsc_consumer *c, const fx_mq_msg_id *ids, size_t n)
{
    if (!c || (n && !ids)) return fx_seterr(FX_EINVAL, "mpsc ack: bad arguments");
    bool self_close = false;
    pthread_mutex_lock(&c->mu);
    fx_err e = cons_gate_locked(c, &self_close);
    for (size_t i = 0; i < n && !e; i++) {
        pstate *s = ids[i].chan == c->m.chan ? ps_find(c, ids[i].pidx) : NULL;
        if (!s || ids[i].msg < s->start || ids[i].msg >= s->next_fetch)
            e = fx_seterr(FX_EINVAL, "mpsc ack: id %lld/%lld/%lld was never handed out",
                          (long long)ids[i].chan, (long long)ids[i].pidx, (long long)ids[i].msg);
    }
    if (!e) {
        bool moved = false;
        for (size_t i = 0; i < n; i++) {
            pstate *s = ps_find(c, ids[i].pidx);
            if (ids[i].msg < s->ack_base) continue;
            uint8_t *f = win_at(s, (size_t)(ids[i].msg - s->ack_base));
            if (!*f) c->st.acked++;
            *f = 1;
            moved |= win_advance(s);
        }
        if (moved) {
            c->ack_seq++;
            commit_kick(c);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (self_close) cons_close_impl(c, false, NULL);
    return e;
}

fx_err fx_mpsc_flush(fx_mpsc_consumer *c, int timeout_ms)
{
    if (!c) return fx_seterr(FX_EINVAL, "mpsc flush: NULL");
    bool self_close = false;
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&c->mu);
    fx_err e = cons_gate_locked(c, &self_close);
    uint64_t want = c->ack_seq;
    if (!e) commit_kick(c);
    while (!e && c->commit_seq < want) {
        if ((e = cons_gate_locked(c, &self_close))) break;
        if (fx_ms_left(deadline) <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "mpsc flush: acks not committed within %d ms", timeout_ms);
            break;
        }
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    if (self_close) cons_close_impl(c, false, NULL);
    return e;
}

/* ---- consumer open / close -------------------------------------------------------------------- */

static fx_err cons_close_cb(void *self) { return fx_mpsc_consumer_close(self); }
static fx_err cons_close_ex_cb(void *self, bool force, bool *unfinished)
{
    return cons_close_impl(self, force, unfinished);
}

static void cons_destroy(fx_mpsc_consumer *c)
{
    for (size_t i = 0; i < c->n_ps; i++) {
        free(c->ps[i].win);
        runs_clear(&c->ps[i].segs, &c->ps[i].runs, &c->ps[i].n_runs, &c->ps[i].run_i);
    }
    free(c->ps);
    free(c->resume);
    pthread_cond_destroy(&c->commit_cv);
    pthread_cond_destroy(&c->data_cv);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->get_mu);
    free(c);
}

/* Acknowledged ids not committed yet (mu held). */
static int64_t uncommitted_acks(const fx_mpsc_consumer *c)
{
    int64_t n = 0;
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].ack_base > c->ps[i].committed) n += c->ps[i].ack_base - c->ps[i].committed;
    return n;
}

/* Close. The first call leaves the shared watch, stops the commit thread (which makes one final bounded
 * commit attempt). Strong error (standalone consumer, no lease lost, force false): acknowledged
 * ids are still uncommitted after that attempt -> the close returns that error, *unfinished is
 * set and the endpoint stays in FX_LIFE_RETRY (leases, membership and acks kept): the next close
 * retries the commit (one bounded attempt) and, when it lands, finishes. force: finish anyway
 * (the uncommitted messages are delivered again; WARN). Sub-consumers (MPMC) never fail strongly:
 * their MPMC close goes on (the same WARN). */
static fx_err cons_close_impl(fx_mpsc_consumer *c, bool force, bool *unfinished)
{
    if (unfinished) *unfinished = false;
    pthread_mutex_lock(&c->mu);
    c->lf.stop = true;
    pthread_cond_broadcast(&c->data_cv);
    pthread_cond_broadcast(&c->commit_cv);
    fx_err r = FX_OK;
    fx_life_close k = fx_life_close_begin(&c->lf, &c->mu, &c->cv, &r);
    if (k == FX_LIFE_CLOSE_DONE || k == FX_LIFE_CLOSE_RETRY) {
        if (k == FX_LIFE_CLOSE_RETRY) { /* the closer waited for left it retryable */
            r = fx_seterr(c->retry_err, "mpsc consumer %lld/%lld: close failed (acknowledged "
                          "messages not committed); close again to retry",
                          (long long)c->m.chan, (long long)c->cidx);
            if (unfinished) *unfinished = true;
        }
        fx_life_close_leave(&c->lf, &c->cv);
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    bool retry = k == FX_LIFE_CLOSE_RERUN;
    pthread_mutex_unlock(&c->mu);

    fx_mq_client *cl = c->c;
    if (!retry) {
        fx_pwatch_remove(c->pw, c); /* no callback for c runs after this */
        c->pw = NULL;
        bool attached = c->cq_attached;
        commit_detach(c);
        if (attached) {
            c->cq_attached = false;
            commit_final(c); /* one final bounded commit attempt */
        }
    }
    if (!c->m.sub) {
        pthread_mutex_lock(&c->mu);
        bool faulted = c->lf.fault != FX_OK;
        int64_t left = faulted ? 0 : uncommitted_acks(c);
        pthread_mutex_unlock(&c->mu);
        if (left > 0 && retry) { /* the retry: one bounded commit attempt of its own */
            fx_err e = fx__mq_op_enter(cl);
            bool did = false;
            if (!e) {
                e = commit_round(c, cl->close_timeout_ms, &did);
                fx__mq_op_leave(cl);
            }
            if (did) c->st.commits++;
            if (e) {
                c->final_err = e;
                snprintf(c->final_detail, sizeof c->final_detail, "%s", fx_err_detail());
            }
            pthread_mutex_lock(&c->mu);
            left = uncommitted_acks(c);
            pthread_mutex_unlock(&c->mu);
        }
        if (left > 0 && !force) {
            fx_err e = c->final_err ? c->final_err : FX_ETIMEDOUT;
            pthread_mutex_lock(&c->mu);
            c->retry_err = e;
            fx_life_close_retry(&c->lf, &c->cv);
            fx_life_close_leave(&c->lf, &c->cv);
            pthread_mutex_unlock(&c->mu);
            if (unfinished) *unfinished = true;
            FX_WRN("mpsc consumer %lld/%lld close: %lld acknowledged message(s) not committed "
                   "(%s: %s); the close stays retryable",
                   (long long)c->m.chan, (long long)c->cidx, (long long)left, fx_errname(e),
                   c->final_detail);
            return fx_seterr(e, "mpsc consumer %lld/%lld close: %lld acknowledged message(s) not "
                             "committed (%s); close again to retry",
                             (long long)c->m.chan, (long long)c->cidx, (long long)left,
                             c->final_detail);
        }
        if (left > 0)
            FX_WRN("mpsc consumer %lld/%lld closed with %lld acknowledged message(s) not "
                   "committed (%s); they will be delivered again",
                   (long long)c->m.chan, (long long)c->cidx, (long long)left, c->final_detail);
        else if (c->final_err)
            FX_WRN("mpsc consumer %lld/%lld close: final commit failed: %s (%s); offsets are "
                   "committed, payloads left behind are deleted when the sub-MPSC is reclaimed",
                   (long long)c->m.chan, (long long)c->cidx, fx_errname(c->final_err),
                   c->final_detail);
    }
    bool deleted = false;
    if (c->member_written && fx__mq_op_enter(cl) == FX_OK) {
        fx_del_req dr = {.key = fx_mq_key_slice(&c->k_member)};
        fx_err e = fx_etcd_delete(cl->etcd, &dr, NULL, cl->close_timeout_ms);
        if (e)
            FX_WRN("mpsc consumer %lld/%lld close: deleting the membership failed: %s (%s); the "
                   "member lease TTL removes it",
                   (long long)c->m.chan, (long long)c->cidx, fx_errname(e), fx_err_detail());
        else
            deleted = true;
        fx__mq_op_leave(cl);
    }
    mgr_release(&c->m);

    pthread_mutex_lock(&c->mu);
    c->member_deleted = deleted; /* read by the MPMC close once this close has returned */
    pthread_mutex_unlock(&c->mu);
    life_finish(&c->lf, &c->mu, &c->cv, cl, &c->ep, !c->m.sub);
    return FX_OK;
}

fx_err fx_mpsc_consumer_close(fx_mpsc_consumer *c)
{
    if (!c) return fx_seterr(FX_EINVAL, "mpsc consumer close: NULL");
    return cons_close_impl(c, false, NULL);
}

void fx_mpsc_consumer_free(fx_mpsc_consumer *c)
{
    if (!c) return;
    cons_close_impl(c, true, NULL);
    life_wait_finished(&c->lf, &c->mu, &c->cv);
    cons_destroy(c);
}

bool fx__mpsc_consumer_membership_deleted(const fx_mpsc_consumer *c)
{
    if (!c) return false;
    fx_mpsc_consumer *q = (fx_mpsc_consumer *)c;
    pthread_mutex_lock(&q->mu);
    bool d = q->member_deleted;
    pthread_mutex_unlock(&q->mu);
    return d;
}

fx_err fx__mpsc_consumer_fault(const fx_mpsc_consumer *c)
{
    if (!c) return FX_OK;
    fx_mpsc_consumer *q = (fx_mpsc_consumer *)c;
    pthread_mutex_lock(&q->mu);
    fx_err f = q->lf.fault;
    pthread_mutex_unlock(&q->mu);
    return f;
}

void fx__mpsc_consumer_stats(const fx_mpsc_consumer *c, fx__mpsc_stats *out)
{
    if (c && out) stats_copy(&c->st, out);
}

int64_t fx__mpsc_consumer_chan(const fx_mpsc_consumer *c) { return c ? c->m.chan : -1; }
int64_t fx__mpsc_consumer_idx(const fx_mpsc_consumer *c) { return c ? c->cidx : -1; }

fx_err fx__mpsc_consumer_fence(const fx_mpsc_consumer *c, fx_mq_key *key, int64_t *create_rev)
{
    if (!c || !c->member_written || c->member_rev <= 0)
        return fx_seterr(FX_EINVAL, "mpsc consumer: no membership to fence with");
    *key = c->k_member;
    *create_rev = c->member_rev;
    return FX_OK;
}

void fx__mpsc_consumer_committed(const fx_mpsc_consumer *cc, const int64_t *pidx, size_t n,
                                 int64_t *out)
{
    fx_mpsc_consumer *c = (fx_mpsc_consumer *)cc;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        int64_t v = FX_MQ_CONSUME_OFFSET_BEGIN;
        const pstate *s = ps_find(c, pidx[i]);
        if (s) {
            v = s->committed;
        } else {
            for (size_t j = 0; j < c->n_resume; j++)
                if (c->resume[j].pidx == pidx[i]) v = c->resume[j].off;
        }
        out[i] = v;
    }
    pthread_mutex_unlock(&c->mu);
}

static bool cons_abort_requested(fx_mpsc_consumer *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->lf.stop;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Resume points: every consume offset of the channel, read once. */
static fx_err read_resume(fx_mpsc_consumer *c)
{
    fx_mq_client *cl = c->c;
    fx_mq_key pre;
    fx_err e = key_err(fx_mq_prefix_consume_offsets(&cl->keys, c->m.chan, &pre), "prefix");
    if (e) return e;
    fx_range_resp rr = {0};
    if ((e = range_prefix(cl, &pre, &rr))) return e;
    c->resume = rr.n_kvs ? calloc(rr.n_kvs, sizeof *c->resume) : NULL;
    if (rr.n_kvs && !c->resume) {
        fx_range_resp_free(&rr);
        return fx_seterr(FX_ENOMEM, "mpsc consumer: out of memory");
    }
    for (size_t i = 0; i < rr.n_kvs; i++) {
        int64_t ch, pidx, off;
        const fx_kv *kv = &rr.kvs[i];
        if (fx_mq_parse_consume_offset_key(&cl->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) ||
            ch != c->m.chan || fx_mq_consume_offset_decode(kv->value.data, kv->value.len, &off)) {
            FX_WRN("mpsc consumer %lld: ignoring a malformed consume offset entry",
                   (long long)c->m.chan);
            continue;
        }
        c->resume[c->n_resume++] = (resume_pt){pidx, off};
    }
    fx_range_resp_free(&rr);
    /* Producers with a consume offset are tracked at once (their produce offset comes from the
     * watch snapshot). */
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_resume; i++) ps_add(c, c->resume[i].pidx);
    pthread_mutex_unlock(&c->mu);
    return FX_OK;
}

static fx_err cons_build(fx_mpsc_consumer *c, int64_t chan, const fx__mpsc_parent *parent)
{
    fx_mq_client *cl = c->c;
    fx_err e = mgr_open(cl, chan, parent, cons_on_expired, c, &c->m);
    if (e) return e;
    if (cons_abort_requested(c)) return fx_seterr(FX_ECLOSED, "mpsc consumer closed while opening");
    fx_mq_key k;
    if ((e = key_err(fx_mq_key_alloc_consumer_idx(&cl->keys, chan, &k), "consumer counter")))
        return e;
    bool fresh = parent && parent->fresh_meta; /* see fx__mpsc_parent: nothing to read back */
    if ((e = (fresh ? fx__mq_alloc_ids_fresh : fx__mq_alloc_ids)(
             cl, &k, c->m.meta.global_long_lease_id, 1, &c->cidx)))
        return e;
    if ((e = key_err(fx_mq_key_consumer_member(&cl->keys, chan, c->cidx, &c->k_member), "member")))
        return e;
    fx_mq_key cpre;
    if ((e = key_err(fx_mq_prefix_consumer_members(&cl->keys, chan, &cpre), "consumer prefix")))
        return e;
    fx_mq_member_meta mm = {.member_id = c->cidx, .role = FX_MQ_ROLE_CONSUMER,
                            .has_external_client_id = true};
    snprintf(mm.external_client_id, sizeof mm.external_client_id, "%s", cl->client_id);
    char *js = NULL;
    if ((e = fx_mq_member_meta_encode(&mm, &js))) return e;
    fx_slice cps = fx_mq_key_slice(&cpre);
    e = member_txn(cl, fx_mq_key_slice(&c->m.k_meta), fx_mq_key_slice(&c->k_member),
                   FX_SLICE_STR(js), c->m.member_lease, NULL,
                   (fx_slice){NULL, 0}, 0, &cps, &c->member_rev);
    free(js);
    if (e) return e;
    c->member_written = true;
    if (cons_abort_requested(c)) return fx_seterr(FX_ECLOSED, "mpsc consumer closed while opening");
    if (!fresh && (e = read_resume(c))) return e;
    fx_pwatch *pw = NULL;
    if ((e = fx__mq_pwatch(cl, &pw))) return e;
    if ((e = fx_pwatch_add(pw, chan, cons_pwatch_cb, c))) return e;
    c->pw = pw;
    if (!fresh && (e = read_produce(c))) return e;
    fx_exec *ex = NULL;
    fx_commit_slot *slot = NULL;
    if ((e = fx__mq_exec(cl, &ex))) return e;
    if ((e = fx_commit_slot_new(ex, commit_step, c, &slot))) return e;
    c->cq_attached = true;
    pthread_mutex_lock(&c->mu); /* acks may have come in already (none before the first get) */
    c->cslot = slot;
    if (commit_dirty(c)) commit_kick(c);
    pthread_mutex_unlock(&c->mu);
    return FX_OK;
}

static fx_err cons_open(fx_mq_client *cl, int64_t chan, const fx__mpsc_parent *parent,
                        fx_mpsc_consumer **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mpsc consumer open: NULL out");
    *out = NULL;
    if (!cl || chan < 0) return fx_seterr(FX_EINVAL, "mpsc consumer open: bad arguments");
    if (parent && parent->member_lease <= 0)
        return fx_seterr(FX_EINVAL, "mpsc consumer open: parent member lease required");
    fx_mpsc_consumer *c = calloc(1, sizeof *c);
    if (!c) return fx_seterr(FX_ENOMEM, "mpsc consumer open: out of memory");
    c->c = cl;
    c->cidx = -1;
    c->m.chan = chan;
    c->m.sub = parent != NULL;
    fx_life_init(&c->lf, true);
    if (pthread_mutex_init(&c->mu, NULL) || pthread_mutex_init(&c->get_mu, NULL) ||
        fx_cond_init_monotonic(&c->cv) || fx_cond_init_monotonic(&c->data_cv) ||
        fx_cond_init_monotonic(&c->commit_cv)) {
        free(c);
        return fx_seterr(FX_ENOMEM, "mpsc consumer open: sync init failed");
    }
    fx_err e;
    if (!parent) {
        c->ep.close = cons_close_cb;
        c->ep.close_ex = cons_close_ex_cb;
        c->ep.self = c;
        if ((e = fx__mq_register(cl, &c->ep))) {
            cons_destroy(c);
            return e;
        }
    }
    if ((e = fx__mq_op_enter(cl)) == FX_OK) {
        e = cons_build(c, chan, parent);
        fx__mq_op_leave(cl);
    }
    pthread_mutex_lock(&c->mu);
    bool aborted = fx_life_constructed(&c->lf, &c->cv);
    pthread_mutex_unlock(&c->mu);
    if (e || aborted) {
        if (!e) e = fx_seterr(FX_ECLOSED, "mpsc consumer closed while opening");
        bool held = fx_err_hold();
        fx_mpsc_consumer_free(c);
        fx_err_release(held);
        return e;
    }
    FX_DBG("mpsc consumer %lld/%lld open", (long long)chan, (long long)c->cidx);
    *out = c;
    return FX_OK;
}

fx_err fx_mpsc_consumer_open(fx_mq_client *c, int64_t chan, fx_mpsc_consumer **out)
{
    return cons_open(c, chan, NULL, out);
}

fx_err fx__mpsc_consumer_open_sub(fx_mq_client *c, int64_t chan, const fx__mpsc_parent *parent,
                                  fx_mpsc_consumer **out)
{
    if (!parent) {
        if (out) *out = NULL;
        return fx_seterr(FX_EINVAL, "sub-consumer open: NULL parent");
    }
    return cons_open(c, chan, parent, out);
}
