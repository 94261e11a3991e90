/* capture.c -- the NATS side of a channel's producer: capture subscriptions and their callback
 * (header policy, size, origin), Nats-Msg-Id dedup, PubAck and error replies, and the producer
 * thread that batches the channel's producer queue (pqueue.h) into the channel's producer
 * (bridge/chanq_prod.h: storing, batches in flight, reopening). Stored header blocks are built by
 * hdr.h, the channel itself is chan.h. Contract: capture.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "chanq_prod.h"
#include "capture.h"
#include "dedup.h"
#include "delayq.h"
#include "flatdict.h"
#include "fx_time.h"
#include "jsack.h"

/* ---- small helpers -------------------------------------------------------------------------- */

size_t dm_max_msg_bytes(fx_daemon *d)
{
    int64_t mp = atomic_load(&d->max_payload);
    size_t lim = FX_DM_MAX_MSG_BYTES;
    if (mp > 0 && (uint64_t)mp < lim) lim = (size_t)mp;
    return lim > FX_DM_DELIVERY_HEADROOM ? lim - FX_DM_DELIVERY_HEADROOM : 0;
}

void dm_reply_error(fx_daemon *d, const char *reply, int code, const char *desc)
{
    if (!reply || !*reply || !d->nc) return;
    char buf[512];
    int n = fx_puback_err(code, desc, buf, sizeof buf);
    if (n > 0) natsConnection_Publish(d->nc, reply, buf, n);
}

static void reply_ok(fx_daemon *d, dm_chan *ch, const char *reply, const fx_mq_msg_id *id,
                     bool duplicate)
{
    if (!reply || !*reply || !d->nc) return;
    char buf[768];
    int n = fx_puback_ok(ch->name, DM_SEQ(id), buf, sizeof buf - 128);
    if (n <= 0) return;
    if (buf[n - 1] == '}') { /* extra fields: JetStream's duplicate flag, the full identity */
        n--;
        int k = snprintf(buf + n, sizeof buf - (size_t)n,
                         "%s,\"fluxon_id\":\"%" PRId64 ".%" PRId64 ".%" PRId64 "\"}",
                         duplicate ? ",\"duplicate\":true" : "", id->chan, id->pidx, id->msg);
        if (k <= 0 || (size_t)k >= sizeof buf - (size_t)n) return;
        n += k;
    }
    /* nats.leaf_pubacks: over the leaf while it is up (a corked batch leaves in one write),
     * else, or when the leaf refuses it (down, buffer full), over the client connection */
    if (d->leaf && d->cfg_start->nats.leaf_pubacks && fx_leaf_connected(d->leaf) &&
        fx_leaf_publish(d->leaf, reply, NULL, NULL, 0, buf, (size_t)n) == FX_OK)
        return;
    natsStatus s = natsConnection_Publish(d->nc, reply, buf, n);
    if (s != NATS_OK) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "channel %s: PubAck publish failed: %s",
                           ch->name, natsStatus_GetText(s));
    }
}

/* ---- capture callback -------------------------------------------------------------------------- */

static void on_capture(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    static _Thread_local bool named; /* cnats's delivery thread of this subscription */
    if (!named) {
        named = true;
        fx_thread_name("fx-capture");
    }
    dm_chan *ch = arg;
    fx_daemon *d = ch->d;
    char *hdr = NULL;
    size_t hlen = 0;
    const char *v = NULL;
    const char *subj = natsMsg_GetSubject(m);
    const char *reply = natsMsg_GetReply(m);
    if (reply && !*reply) reply = NULL;
    if (natsMsgHeader_Get(m, FX_DM_HDR_ORIGIN, &v) == NATS_OK && dm_origin_ours(d->origin_key, subj, reply, v)) {
        fx_metric_inc(ch->m.own_skipped, 1); /* our own delivery: no loop */
        goto out;
    }
    const char *data = natsMsg_GetData(m);
    int dlen = natsMsg_GetDataLength(m);
    if (!data || dlen < 0) {
        data = "";
        dlen = 0;
    }
    if (dm_hdr_from_msg(m, &hdr, &hlen) != FX_OK) {
        fx_metric_inc(ch->m.dropped, 1);
        dm_reply_error(d, reply, 500, "bridge out of memory");
        goto out;
    }
    char msgid[FX_DEDUP_ID_MAX + 1];
    bool has_msgid = false, foreign = false;
    if (hlen) { /* Fluxon-* headers not proven ours; JetStream's Nats-Expected-*, Nats-Msg-Id */
        hdr_iter hi;
        fx_slice hk, hv;
        dm_hdr_iter_init(&hi, hdr, hlen);
        const size_t el = sizeof FX_DM_HDR_EXPECTED - 1;
        while (dm_hdr_iter_next(&hi, &hk, &hv)) {
            if (!foreign && hk.len > 7 && strncasecmp(hk.data, "Fluxon-", 7) == 0 &&
                !dm_delayq_is_header(hk)) {
                foreign = true; /* captured, counted */
                static fx_log_slot fslot;
                fx_log_ratelimited(&fslot, 10000, FX_LOG_INF,
                                   "channel %s: message on %s carries Fluxon-* headers of no "
                                   "delivery of this bridge: captured (fluxon_foreign_headers_total)",
                                   ch->name, subj);
                fx_metric_inc(ch->m.foreign_headers, 1);
                continue;
            }
            if (hk.len > el && memcmp(hk.data, FX_DM_HDR_EXPECTED, el) == 0) {
                char desc[160];
                int code = 400, err_code = 0;
                if (hk.len == sizeof FX_DM_HDR_EXPECTED_STREAM - 1 &&
                    memcmp(hk.data, FX_DM_HDR_EXPECTED_STREAM, hk.len) == 0) {
                    if (hv.len == strlen(ch->name) && memcmp(hv.data, ch->name, hv.len) == 0) continue;
                    err_code = FX_JS_ERR_STREAM_MISMATCH;
                    snprintf(desc, sizeof desc, "expected stream does not match");
                } else {
                    snprintf(desc, sizeof desc, "header %.*s is not supported by fluxon-bridge",
                             (int)(hk.len < 64 ? hk.len : 64), (const char *)hk.data);
                }
                fx_metric_inc(ch->m.dropped, 1);
                char buf[256];
                int n = fx_puback_err_code(code, err_code, desc, buf, sizeof buf);
                if (reply && n > 0) natsConnection_Publish(d->nc, reply, buf, n);
                goto out;
            }
            if (ch->s.duplicate_window_ms > 0 && !has_msgid && hk.len == sizeof FX_DM_HDR_MSG_ID - 1 &&
                memcmp(hk.data, FX_DM_HDR_MSG_ID, hk.len) == 0 && hv.len > 0) {
                if (hv.len > FX_DEDUP_ID_MAX) {
                    fx_metric_inc(ch->m.dropped, 1);
                    dm_reply_error(d, reply, 400, "Nats-Msg-Id longer than 512 bytes");
                    goto out;
                }
                memcpy(msgid, hv.data, hv.len);
                msgid[hv.len] = '\0';
                has_msgid = true;
            }
        }
    }
    size_t lim = dm_max_msg_bytes(d);
    if (hlen + (size_t)dlen > lim) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN,
                           "channel %s: message on %s too large (%zu bytes > %zu): rejected",
                           ch->name, subj, hlen + (size_t)dlen, lim);
        fx_metric_inc(ch->m.dropped, 1);
        dm_reply_error(d, reply, 413, "message too large");
        goto out;
    }
    /* Nats-Schedule / Fluxon-Delay: stored in the delay index (or refused) by delayq.h */
    if (hlen && dm_delayq_capture(ch, subj, reply, hdr, hlen, data, (size_t)dlen)) goto out;
    fx_mq_msg rec = {.subject = FX_SLICE_STR(subj),
                     .headers = {hdr ? hdr : "", hlen},
                     .publish_ns = fx_wall_ns(),
                     .data = {data, (size_t)dlen}};
    size_t rl = 0;
    pq_item *it = NULL;
    if (fx_mq_msg_encoded_size(&rec, &rl) != FX_OK ||
        !(it = dm_pq_item_new_id(PQ_CAPTURE, reply, has_msgid ? msgid : NULL, rl)) ||
        fx_mq_msg_encode_into(&rec, it->rec, rl, &rl) != FX_OK) {
        free(it);
        fx_metric_inc(ch->m.dropped, 1);
        dm_reply_error(d, reply, 500, "cannot encode message");
        goto out;
    }
    it->rec_len = rl;
    if (!dm_pq_push(&ch->q, it)) {
        free(it);
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "channel %s: bridge queue full: message dropped",
                           ch->name);
        fx_metric_inc(ch->m.dropped, 1);
        dm_reply_error(d, reply, 503, "bridge queue full");
        goto out;
    }
    fx_metric_inc(ch->m.captured, 1);
out:
    free(hdr);
    natsMsg_Destroy(m);
}

/* ---- the producer thread's state (see "producer thread" below) ---------------------------- */

typedef struct dm_cap dm_cap;

typedef struct cap_batch {
    dm_cap *cp;
    bool busy;    /* submitted, its last completion not run yet */
    bool has_ids; /* holds Nats-Msg-Id captures of a dedup channel */
    size_t n;
    pq_item *items[FX_DM_BATCH_MSGS];
    fx_slice vals[FX_DM_BATCH_MSGS];
} cap_batch;

struct dm_cap {
    dm_chan *ch;
    fx_chanq_prod *prod;
    unsigned n_idbusy;
    bool ids_pending;    /* a Nats-Msg-Id batch was stored: its ids may wait to be recorded */
    atomic_bool give_up; /* stopping and a put failed: answer the rest at once (bounded drain) */
    pthread_mutex_t dd_mu;
    struct dm_dedup *dedup;
    cap_batch b[FX_DM_INFLIGHT]; /* a free one exists whenever the producer has room */
};

_Static_assert(FX_DM_BATCH_MSGS <= FX_CHANQ_BATCH_MAX, "a batch fits one submit");
_Static_assert(FX_DM_INFLIGHT <= FX_CHANQ_INFLIGHT_MAX, "in-flight bound");

/* ---- replies ------------------------------------------------------------------------------------ */

static void complete(dm_chan *ch, pq_item *it, fx_err e, const fx_mq_msg_id *id)
{
    fx_daemon *d = ch->d;
    if (it->done) { /* a dead letter, a due delayed message: back to whoever queued it */
        dm_pq_item_done(it, e);
        return;
    }
    if (!e) {
        fx_metric_inc(ch->m.stored, 1);
        reply_ok(d, ch, it->reply, id, false);
    } else {
        fx_metric_inc(ch->m.store_errors, 1);
        if (e == FX_EFULL && it->reply) {
            /* JetStream's answer for a full stream (DiscardNew), so clients fail fast with a
             * code they know. */
            char buf[256];
            int n = fx_puback_err_code(503, FX_JS_ERR_MAX_MSGS, "maximum messages exceeded", buf,
                                       sizeof buf);
            if (n > 0 && d->nc) natsConnection_Publish(d->nc, it->reply, buf, n);
        } else if (e == FX_EFULL) {
            /* fire and forget: nobody hears about it but the operator */
            fx_metric_inc(ch->m.full_dropped, 1);
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 5000, FX_LOG_WRN,
                               "channel %s: full: publish without reply dropped "
                               "(fluxon_full_dropped_total)", ch->name);
        } else if (e == FX_ENOSPACE && it->reply) {
            /* The payload store is full (Redis at maxmemory under noeviction refused the put
             * before writing, or etcd's quota): JetStream's answer when its storage is full.
             * Nothing was stored; the publisher may retry later. */
            char buf[256];
            int n = fx_puback_err_code(503, FX_JS_ERR_INSUFFICIENT_RESOURCES,
                                       "insufficient resources", buf, sizeof buf);
            if (n > 0 && d->nc) natsConnection_Publish(d->nc, it->reply, buf, n);
        } else if (e == FX_EUNAVAIL || e == FX_ETIMEDOUT)
            dm_reply_error(d, it->reply, 503, "store unavailable (payload or control plane down)");
        else
            dm_reply_error(d, it->reply, 500, fx_strerror(e));
    }
    free(it);
}

/* ---- Nats-Msg-Id dedup (bridge/dedup.h) ---------------------------------------------------- */

/* The channel's window and the captures stored but whose id is not recorded yet. Their PubAcks
 * wait for the record (a PubAck means the id is in the window, on every bridge); the record of
 * a stored batch goes in the same txn as the next batch's lookup, or alone as soon as the
 * producer is idle, so under load dedup costs one txn per batch. */
typedef struct dm_dedup {
    fx_dedup *dd;
    uint64_t forgotten;     /* stats.forgotten already counted in the metric */
    uint64_t revoke_errors; /* stats.revoke_errors already logged */
    size_t n;
    pq_item *items[FX_DM_BATCH_MSGS];
    fx_mq_msg_id sids[FX_DM_BATCH_MSGS];
    char vals[FX_DM_BATCH_MSGS][72];
} dm_dedup;

static fx_log_slot dedup_slot, dedup_bound_slot;

/* The window's bound (bridge/dedup.h): ids forgotten early go to the metric and a WARN. */
static void dedup_report(dm_chan *ch, dm_dedup *dd)
{
    fx_dedup_stats st;
    fx_dedup_get_stats(dd->dd, &st);
    fx_metric_set(ch->m.dedup_ids, st.live_ids);
    if (st.revoke_errors != dd->revoke_errors) {
        dd->revoke_errors = st.revoke_errors;
        fx_log_ratelimited(&dedup_slot, 5000, FX_LOG_WRN,
                           "channel %s: dedup: revoking the oldest ids' lease failed (%" PRIu64
                           " times): the window holds %" PRId64 " ids, over duplicate_max_ids "
                           "until a revoke succeeds",
                           ch->name, st.revoke_errors, st.live_ids);
    }
    if (st.forgotten == dd->forgotten) return;
    fx_metric_inc(ch->m.dedup_forgotten, (int64_t)(st.forgotten - dd->forgotten));
    dd->forgotten = st.forgotten;
    fx_log_ratelimited(&dedup_bound_slot, 10000, FX_LOG_WRN,
                       "channel %s: dedup window bound reached (duplicate_max_ids %" PRId64
                       ", duplicate_max_bytes %" PRId64 "): the oldest Nats-Msg-Ids are forgotten "
                       "after %.1f s instead of duplicate_window %.1f s (%" PRIu64 " so far); a "
                       "duplicate of an older id is stored again",
                       ch->name, ch->s.duplicate_max_ids, ch->s.duplicate_max_bytes,
                       (double)st.forgotten_age_ms / 1000.0,
                       (double)ch->s.duplicate_window_ms / 1000.0,
                       st.forgotten);
}

/* The held captures are stored: answer them (their ids recorded or, after an error, not). */
static void dedup_pending_clear(dm_chan *ch, dm_dedup *dd)
{
    fx_leaf *lf = ch->d->cfg_start->nats.leaf_pubacks ? ch->d->leaf : NULL;
    if (lf) fx_leaf_cork(lf); /* the PubAcks in one write (reply_ok) */
    for (size_t i = 0; i < dd->n; i++) complete(ch, dd->items[i], FX_OK, &dd->sids[i]);
    if (lf) fx_leaf_uncork(lf);
    dd->n = 0;
}

/* Record the pending ids, and look up ids[0..n) in the same txns. */
static fx_err dedup_sync(dm_chan *ch, const fx_slice *ids, size_t n, fx_bytes *vals)
{
    dm_dedup *dd = ch->cap->dedup;
    fx_slice rids[FX_DM_BATCH_MSGS], rvals[FX_DM_BATCH_MSGS];
    for (size_t i = 0; i < dd->n; i++) {
        rids[i] = FX_SLICE_STR(dd->items[i]->msgid);
        rvals[i] = FX_SLICE_STR(dd->vals[i]);
    }
    fx_dedup_set_bound(dd->dd, ch->s.duplicate_max_ids, ch->s.duplicate_max_bytes); /* reloads */
    fx_err e = fx_dedup_record_lookup(dd->dd, rids, rvals, dd->n, ids, n, vals, FX_DM_PUT_TIMEOUT_MS);
    dedup_report(ch, dd);
    if (e && dd->n)
        fx_log_ratelimited(&dedup_slot, 5000, FX_LOG_WRN,
                           "channel %s: dedup: %zu stored id(s) not recorded: %s (%s)", ch->name,
                           dd->n, fx_strerror(e), fx_err_detail());
    dedup_pending_clear(ch, dd); /* an unrecorded id loses its window entry, never the message */
    return e;
}

static void dedup_free(dm_chan *ch)
{
    if (!ch->cap->dedup) return;
    if (ch->cap->dedup->n) dedup_sync(ch, NULL, 0, NULL);
    fx_dedup_free(ch->cap->dedup->dd);
    dedup_pending_clear(ch, ch->cap->dedup);
    free(ch->cap->dedup);
    ch->cap->dedup = NULL;
}

/* Answer and drop the captures whose Nats-Msg-Id is in the window; a second capture of an id
 * already in this batch goes back to the head of the queue (the next batch finds the first one
 * recorded). Returns the new count. Batches without any Nats-Msg-Id cost nothing. */
static size_t dedup_filter(dm_chan *ch, pq_item **batch, size_t n)
{
    size_t nid = 0;
    for (size_t i = 0; i < n; i++)
        if (batch[i]->kind == PQ_CAPTURE && batch[i]->msgid) nid++;
    if (!nid) return n;
    if (!ch->cap->dedup) {
        dm_dedup *dd = calloc(1, sizeof *dd);
        fx_err e = dd ? fx_dedup_new(ch->d->mq, ch->name, ch->s.duplicate_window_ms, &dd->dd)
                      : FX_ENOMEM;
        if (e) {
            free(dd);
            fx_log_ratelimited(&dedup_slot, 5000, FX_LOG_ERR, "channel %s: dedup: %s (%s)",
                               ch->name, fx_strerror(e), fx_err_detail());
            return n;
        }
        ch->cap->dedup = dd;
    }
    fx_slice ids[FX_DM_BATCH_MSGS];
    uint32_t at[FX_DM_BATCH_MSGS];
    pq_item *later[FX_DM_BATCH_MSGS];
    size_t k = 0, nl = 0;
    for (size_t i = 0; i < n; i++) {
        pq_item *it = batch[i];
        if (it->kind != PQ_CAPTURE || !it->msgid) continue;
        fx_slice id = FX_SLICE_STR(it->msgid);
        bool again = false;
        for (size_t j = 0; j < k && !again; j++)
            again = ids[j].len == id.len && memcmp(ids[j].data, id.data, id.len) == 0;
        if (again) {
            later[nl++] = it;
            batch[i] = NULL;
            continue;
        }
        ids[k] = id;
        at[k++] = (uint32_t)i;
    }
    fx_bytes vals[FX_DM_BATCH_MSGS];
    fx_err e = dedup_sync(ch, ids, k, vals);
    if (e) {
        fx_log_ratelimited(&dedup_slot, 5000, FX_LOG_WRN,
                           "channel %s: dedup lookup failed: %s (%s): storing without the check",
                           ch->name, fx_strerror(e), fx_err_detail());
    }
    for (size_t j = 0; j < k; j++) {
        fx_mq_msg_id id;
        long long a, b, c;
        char tail;
        if (!e && vals[j].len &&
            sscanf((const char *)vals[j].data, "%lld.%lld.%lld%c", &a, &b, &c, &tail) == 3) {
            id = (fx_mq_msg_id){a, b, c};
            pq_item *it = batch[at[j]];
            fx_metric_inc(ch->m.duplicates, 1);
            if (it->done) {
                dm_pq_item_done(it, FX_OK); /* a delayed message moved twice: stored once */
            } else {
                reply_ok(ch->d, ch, it->reply, &id, true);
                free(it);
            }
            batch[at[j]] = NULL;
        }
        fx_bytes_free(&vals[j]);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (batch[i]) batch[m++] = batch[i];
    dm_pq_requeue_front(&ch->q, later, nl);
    return m;
}

/* Hold the stored captures that carry a Nats-Msg-Id (taken: items[i] set to NULL) until their
 * ids are recorded (with the next lookup or when idle). */
static void dedup_hold(dm_chan *ch, pq_item **items, const fx_mq_msg_id *sids, size_t n)
{
    dm_dedup *dd = ch->cap->dedup;
    for (size_t i = 0; i < n; i++) {
        if (items[i]->kind != PQ_CAPTURE || !items[i]->msgid) continue;
        if (dd->n == FX_DM_BATCH_MSGS) dedup_sync(ch, NULL, 0, NULL);
        dd->items[dd->n] = items[i];
        dd->sids[dd->n] = sids[i];
        snprintf(dd->vals[dd->n], sizeof dd->vals[dd->n], "%" PRId64 ".%" PRId64 ".%" PRId64,
                 sids[i].chan, sids[i].pidx, sids[i].msg);
        dd->n++;
        items[i] = NULL;
    }
}

/* Messages in the next batch. With at most FX_DM_INFLIGHT ready streams (fx_chanq_prod_streams:
 * one per claim): everything queued (up to FX_DM_BATCH_MSGS): the batches in flight already
 * rotate over all of them, and splitting only adds per-batch cost (measured: 128 B rows 4b/4c of
 * the bench lost 40% with queued / 4). With more: queued / R, so a burst reaches every ready
 * stream (every claim), but never fewer than FX_DM_SPREAD_MIN messages. */
static size_t batch_cap(size_t queued, size_t ready)
{
    if (ready <= FX_DM_INFLIGHT) return FX_DM_BATCH_MSGS;
    size_t cap = queued / ready;
    if (cap < FX_DM_SPREAD_MIN) cap = FX_DM_SPREAD_MIN;
    if (cap > FX_DM_BATCH_MSGS) cap = FX_DM_BATCH_MSGS;
    return cap;
}

/* ---- producer thread ------------------------------------------------------------------------------
 * The producer thread takes a batch from the queue (what queued while earlier batches were being
 * stored), filters its Nats-Msg-Id duplicates and submits it to the channel's producer
 * (bridge/chanq_prod.h), which stores it on a put worker of its own, or on this thread while at
 * most one batch can be in flight. The completions come back in order per stream of ids: each
 * stored run is answered at once (PubAcks, dead-letter completions), and the batch's last
 * completion answers or requeues what was not stored and frees its batch here.
 * Thread rules: under q.mu: every batch's busy flag, n_idbusy, ids_pending. cp->prod: the
 * producer thread only (chanq_prod.h "owner"). cp->dedup: under dd_mu (dd_mu before q.mu).
 * Nats-Msg-Id batches are stored one at a time (n_idbusy <= 1): the next one is filtered once the
 * ids of the previous one are held, so a duplicate in flight is still found. */
static bool prod_stopping(dm_chan *ch)
{
    pthread_mutex_lock(&ch->q.mu);
    bool st = ch->q.stop;
    pthread_mutex_unlock(&ch->q.mu);
    return st;
}

/* The batch's completions (chanq_prod.h): a stored run, or the end of the batch. */
static void cap_done(void *arg, const fx_chanq_done *d)
{
    cap_batch *b = arg;
    dm_cap *cp = b->cp;
    dm_chan *ch = cp->ch;
    pq_item **items = b->items + d->first;
    if (!d->last) {
        if (b->has_ids) {
            pthread_mutex_lock(&cp->dd_mu);
            if (cp->dedup) dedup_hold(ch, items, d->ids, d->n);
            pthread_mutex_unlock(&cp->dd_mu);
        }
        fx_leaf *lf = ch->d->cfg_start->nats.leaf_pubacks ? ch->d->leaf : NULL;
        if (lf) fx_leaf_cork(lf); /* the run's PubAcks in one write (reply_ok) */
        for (size_t i = 0; i < d->n; i++) {
            if (items[i]) complete(ch, items[i], FX_OK, &d->ids[i]);
            items[i] = NULL;
        }
        if (lf) fx_leaf_uncork(lf);
        return;
    }
    bool reopen = d->e == FX_ELEASE_LOST || d->e == FX_ECLOSED;
    pq_item *back[FX_DM_BATCH_MSGS];
    size_t nb = 0;
    for (size_t i = 0; i < d->n; i++) {
        /* The producer is reopened: the rest goes back to the head of the queue (twice at most). */
        if (reopen && items[i]->reopens < 2) {
            items[i]->reopens++;
            back[nb++] = items[i];
        } else {
            complete(ch, items[i], d->e, NULL);
        }
        items[i] = NULL;
    }
    if (d->n && !reopen && prod_stopping(ch)) {
        FX_WRN("channel %s: storing failed while draining: answering the remaining publishes "
               "with errors", ch->name);
        atomic_store(&cp->give_up, true);
    }
    pthread_mutex_lock(&ch->q.mu);
    dm_pq_requeue_front_locked(&ch->q, back, nb);
    b->busy = false;
    b->n = 0;
    if (b->has_ids) {
        cp->n_idbusy--;
        cp->ids_pending = true;
    }
    pthread_cond_broadcast(&ch->q.cv);
    pthread_mutex_unlock(&ch->q.mu);
}

/* The producer has room again (a batch's slot is free): wake the producer thread. */
static void cap_room(void *arg)
{
    dm_cap *cp = arg;
    fx_chanq_prod_stats st;
    fx_chanq_prod_stats_get(cp->prod, &st);
    fx_metric_set(cp->ch->m.inflight, st.in_flight);
    pthread_mutex_lock(&cp->ch->q.mu);
    pthread_cond_broadcast(&cp->ch->q.cv);
    pthread_mutex_unlock(&cp->ch->q.mu);
}

static fx_err cap_resolve(void *arg, bool forget, int64_t *out)
{
    dm_chan *ch = arg;
    if (forget) {
        dm_chan_forget_mpmc(ch);
        return FX_OK;
    }
    return dm_chan_resolve(ch, false, out);
}

static dm_cap *cap_new(dm_chan *ch)
{
    dm_cap *cp = calloc(1, sizeof *cp);
    if (!cp) return NULL;
    cp->ch = ch;
    atomic_init(&cp->give_up, false);
    fx_chanq_prod_cfg cfg = {.name = ch->name,
                             .resolve = cap_resolve,
                             .resolve_arg = ch,
                             .full_wait_ms = ch->s.full_wait_ms,
                             .inflight = FX_DM_INFLIGHT,
                             .exec = ch->d->exec, /* the daemon's one executor */
                             .exec_kind = FX_EXEC_K_PUT,
                             .on_room = cap_room,
                             .room_arg = cp};
    if (fx_chanq_prod_new(ch->d->mq, &cfg, &cp->prod) != FX_OK) {
        free(cp);
        return NULL;
    }
    pthread_mutex_init(&cp->dd_mu, NULL);
    for (int i = 0; i < FX_DM_INFLIGHT; i++) cp->b[i].cp = cp;
    return cp;
}

/* After the producer thread returned, or when it never started: closes the channel's producer and
 * joins its put workers (nothing is in flight by then). */
static void cap_free(dm_cap *cp)
{
    if (!cp) return;
    fx_chanq_prod_free(cp->prod);
    pthread_mutex_destroy(&cp->dd_mu);
    free(cp);
}

/* Keep the channel attached while the bridge runs (the durability contract): the producer is
 * opened at once (registering the channel's data leases) and reopened when it closed itself (a
 * lease expired), with or without traffic (fx_chanq_prod_keep: no RPC when all is well). */
static void cap_keep(dm_cap *cp)
{
    dm_chan *ch = cp->ch;
    bool open = fx_chanq_prod_keep(cp->prod);
    if (!open) {
        char err[sizeof ch->attach_err];
        if (!fx_chanq_prod_attached(cp->prod, err, sizeof err)) {
            pthread_mutex_lock(&ch->mu);
            memcpy(ch->attach_err, err, sizeof err);
            pthread_mutex_unlock(&ch->mu);
        }
    }
    atomic_store(&ch->attached, open);
}

static void *producer_main(void *arg)
{
    fx_thread_name("fx-producer");
    dm_cap *cp = arg;
    dm_chan *ch = cp->ch;
    dm_pq *q = &ch->q;
    for (;;) {
        cap_keep(cp);
        size_t ready = fx_chanq_prod_streams(cp->prod);
        pthread_mutex_lock(&q->mu);
        fx_chanq_prod_stats st;
        fx_chanq_prod_stats_get(cp->prod, &st);
        if (!q->head && q->stop && !st.in_flight) {
            pthread_mutex_unlock(&q->mu);
            break; /* stop, empty, nothing in flight */
        }
        if (!q->head && !cp->n_idbusy && cp->ids_pending) {
            cp->ids_pending = false; /* idle: record the stored ids now */
            pthread_mutex_unlock(&q->mu);
            pthread_mutex_lock(&cp->dd_mu);
            if (cp->dedup && cp->dedup->n) dedup_sync(ch, NULL, 0, NULL);
            pthread_mutex_unlock(&cp->dd_mu);
            continue;
        }
        /* q.mu held from the room check to the wait: a freed slot's wake-up (cap_room) is not
         * lost. */
        if (!q->head || !fx_chanq_prod_room(cp->prod)) {
            /* Wait for a message or room; wake up to re-check the producer (sooner while it is
             * not open yet). */
            int64_t wait = atomic_load(&ch->attached) ? FX_DM_KEEPER_MS : 10;
            struct timespec ts = fx_deadline_ts(fx_now_ms() + wait);
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
            pthread_mutex_unlock(&q->mu);
            continue;
        }
        cap_batch *b = NULL;
        for (int i = 0; i < FX_DM_INFLIGHT && !b; i++)
            if (!cp->b[i].busy) b = &cp->b[i];
        size_t cap = batch_cap(q->n, ready), n = 0, bytes = 0;
        while (q->head && n < cap && (n == 0 || bytes + q->head->rec_len <= FX_DM_BATCH_BYTES)) {
            pq_item *it = dm_pq_take_locked(q);
            bytes += it->rec_len;
            b->items[n++] = it;
        }
        bool has_ids = false;
        for (size_t i = 0; i < n && !has_ids; i++)
            has_ids = b->items[i]->kind == PQ_CAPTURE && b->items[i]->msgid;
        has_ids = has_ids && ch->s.duplicate_window_ms > 0;
        /* the ids of the Nats-Msg-Id batch in flight are held before this one is looked up */
        while (has_ids && cp->n_idbusy) pthread_cond_wait(&q->cv, &q->mu);
        b->busy = true;
        b->has_ids = has_ids;
        if (has_ids) cp->n_idbusy++;
        pthread_mutex_unlock(&q->mu);
        fx_err e = FX_OK;
        if (atomic_load(&cp->give_up)) {
            e = FX_ECANCELED;
        } else if (has_ids) {
            pthread_mutex_lock(&cp->dd_mu);
            n = dedup_filter(ch, b->items, n);
            pthread_mutex_unlock(&cp->dd_mu);
        }
        if (!e && n) {
            /* The put deadline runs from the oldest message's arrival, so a publish waiting behind
             * a failing batch (store down) is answered within FX_DM_PUT_TIMEOUT_MS of its arrival
             * too; full_wait (default 0): how long a put may wait for room on top. */
            int64_t oldest = fx_now_ms();
            for (size_t i = 0; i < n; i++) {
                b->vals[i] = (fx_slice){b->items[i]->rec, b->items[i]->rec_len};
                if (b->items[i]->in_ms && b->items[i]->in_ms < oldest) oldest = b->items[i]->in_ms;
            }
            b->n = n;
            e = fx_chanq_submit(cp->prod, b->vals, n, oldest + FX_DM_PUT_TIMEOUT_MS + ch->s.full_wait_ms,
                                cap_done, b);
            if (!e) {
                fx_chanq_prod_stats_get(cp->prod, &st);
                fx_metric_set(ch->m.inflight_peak, st.peak);
                fx_metric_set(ch->m.inflight, st.in_flight);
                continue; /* the batch is cap_done's now */
            }
        }
        /* Not submitted: nothing left, given up, the producer cannot be opened, or no room after
         * all (fewer ready streams than at the check: refused, counted, requeued). */
        bool refused = e == FX_EFULL;
        if (!refused)
            for (size_t i = 0; i < n; i++) complete(ch, b->items[i], e, NULL);
        pthread_mutex_lock(&q->mu);
        if (refused) dm_pq_requeue_front_locked(q, b->items, n);
        b->busy = false;
        b->n = 0;
        if (has_ids) cp->n_idbusy--;
        if (refused) { /* no spinning while a shared executor's put queue is full */
            struct timespec ts = fx_deadline_ts(fx_now_ms() + 10);
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        }
        pthread_mutex_unlock(&q->mu);
        if (e && !refused && e != FX_ECANCELED && prod_stopping(ch)) atomic_store(&cp->give_up, true);
    }
    atomic_store(&ch->attached, false);
    pthread_mutex_lock(&cp->dd_mu);
    dedup_free(ch);
    pthread_mutex_unlock(&cp->dd_mu);
    nats_ReleaseThreadMemory();
    return NULL;
}

/* ---- channel lifecycle -------------------------------------------------------------------------- */

/* cnats: the capture subscription is closed and its last message callback has returned. */
static void on_capture_complete(void *arg) { dm_chan_unref(arg); }

fx_err dm_chan_start(dm_chan *ch)
{
    fx_daemon *d = ch->d;
    if (!ch->cap && !(ch->cap = cap_new(ch)))
        return fx_seterr(FX_ENOMEM, "channel %s: out of memory", ch->name);
    if (pthread_create(&ch->prod_thr, NULL, producer_main, ch->cap) != 0) {
        cap_free(ch->cap);
        ch->cap = NULL;
        return fx_seterr(FX_ENOMEM, "channel %s: cannot start the producer thread", ch->name);
    }
    ch->prod_started = true;
    /* The channel is already in d->chans (chan_add registers, then starts it): house-keeping
     * reads subs, sub_dropped and n_subs under d->reg (read), so they are published under it
     * (write). */
    if (ch->n_subjects) {
        natsSubscription **subs = calloc(ch->n_subjects, sizeof *subs);
        int64_t *dropped = calloc(ch->n_subjects, sizeof *dropped);
        if (!subs || !dropped) {
            free(subs);
            free(dropped);
            return fx_seterr(FX_ENOMEM, "channel: out of memory");
        }
        pthread_rwlock_wrlock(&d->reg);
        ch->subs = subs;
        ch->sub_dropped = dropped;
        pthread_rwlock_unlock(&d->reg);
    }
    for (size_t i = 0; i < ch->n_subjects; i++) {
        natsSubscription *sub = NULL;
        natsStatus s = natsConnection_QueueSubscribe(&sub, d->nc, ch->subjects[i], "fluxon",
                                                     on_capture, ch);
        if (s != NATS_OK)
            return fx_seterr(FX_EUNAVAIL, "channel %s: subscribe %s: %s", ch->name,
                             ch->subjects[i], natsStatus_GetText(s));
        natsSubscription_SetPendingLimits(sub, FX_DM_SUB_PENDING_MSGS, FX_DM_SUB_PENDING_BYTES);
        pthread_rwlock_wrlock(&d->reg);
        ch->subs[i] = sub;
        ch->n_subs = i + 1;
        pthread_rwlock_unlock(&d->reg);
        /* The subscription's reference: on_capture may run until the completion callback. */
        dm_chan_ref(ch);
        if (natsSubscription_SetOnCompleteCB(sub, on_capture_complete, ch) != NATS_OK) {
            /* Not expected (a fresh async subscription): keep the channel until exit instead. */
            FX_WRN("channel %s: no completion callback on %s: the channel is kept after a reload",
                   ch->name, ch->subjects[i]);
        }
    }
    if (ch->is_dlq)
        FX_INF("channel %s (dead letters): deliver %s.<claim>", ch->name, ch->deliver_prefix);
    else
        FX_INF("channel %s: capturing %zu subject(s) (first %s), deliver %s.<claim>, ack %s",
               ch->name, ch->n_subjects, ch->n_subjects ? ch->subjects[0] : "-",
               ch->deliver_prefix, ch->s.ack == FX_ACK_NONE ? "none" : "explicit");
    FX_DBG("channel %s: up to %d batches stored at once (one per ready sub-MPSC)", ch->name,
           FX_DM_INFLIGHT);
    return FX_OK;
}

void dm_chan_drain_capture_begin(dm_chan *ch)
{
    natsConnection *nc = ch->d->nc;
    bool connected = nc && natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED;
    for (size_t i = 0; i < ch->n_subs; i++) {
        if (!ch->subs[i]) continue;
        /* Drain delivers what the client already holds, after the server stopped sending. It
         * needs the server (UNSUB + flush): when NATS is down, just unsubscribe. */
        natsStatus s = connected ? natsSubscription_Drain(ch->subs[i]) : NATS_CONNECTION_DISCONNECTED;
        if (s != NATS_OK) natsSubscription_Unsubscribe(ch->subs[i]);
    }
}

void dm_chan_drain_capture_wait(dm_chan *ch, int64_t deadline_ms)
{
    for (size_t i = 0; i < ch->n_subs; i++) {
        if (!ch->subs[i]) continue;
        int64_t left = fx_ms_left(deadline_ms);
        natsStatus s = natsSubscription_WaitForDrainCompletion(ch->subs[i], left > 0 ? left : 1);
        if (s == NATS_TIMEOUT) {
            FX_WRN("channel %s: capture drain timed out; unsubscribing", ch->name);
            natsSubscription_Unsubscribe(ch->subs[i]);
        }
    }
}

void dm_chan_stop_producer_begin(dm_chan *ch)
{
    if (ch->cap) fx_chanq_prod_stop(ch->cap->prod); /* backoff waits end (before q.stop: the
                                                     * thread exits only after that) */
    pthread_mutex_lock(&ch->q.mu);
    ch->q.closed = true;
    ch->q.stop = true;
    pthread_cond_broadcast(&ch->q.cv);
    pthread_mutex_unlock(&ch->q.mu);
}

void dm_chan_stop_producer_wait(dm_chan *ch)
{
    if (!ch->prod_started) return;
    pthread_join(ch->prod_thr, NULL);
    ch->prod_started = false;
    cap_free(ch->cap); /* closes the producer, joins its put workers */
    ch->cap = NULL;
}
