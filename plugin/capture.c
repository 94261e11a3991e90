/* capture.c -- channels: capture subscriptions, the producer thread and its put workers (batches
 * in flight to distinct sub-MPSCs, PubAck replies, dead-letter stores), fed by the channel's
 * producer queue (pqueue.h); stored header blocks are built by hdr.h.
 * Contract: daemon_int.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon_int.h"
#include "dedup.h"
#include "delayq.h"
#include "flatdict.h"
#include "fx_time.h"
#include "jsack.h"

/* ---- small helpers -------------------------------------------------------------------------- */

static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

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
    natsStatus s = natsConnection_Publish(d->nc, reply, buf, n);
    if (s != NATS_OK) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "channel %s: PubAck publish failed: %s",
                           ch->name, natsStatus_GetText(s));
    }
}

/* ---- Fluxon-Origin (loop prevention by proof) --------------------------------------------------- */

/* SipHash-2-4 (Aumasson, Bernstein) of subject, a 0 byte and reply under a 128-bit key. */
#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                    \
    do {                                                                                            \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                   \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                      \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                      \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                   \
    } while (0)

typedef struct sip {
    uint64_t v0, v1, v2, v3, m;
    size_t n; /* bytes absorbed */
} sip;

static void sip_block(sip *h, uint64_t m)
{
    uint64_t v0 = h->v0, v1 = h->v1, v2 = h->v2, v3 = h->v3;
    v3 ^= m;
    SIPROUND;
    SIPROUND;
    v0 ^= m;
    h->v0 = v0, h->v1 = v1, h->v2 = v2, h->v3 = v3;
}

static void sip_bytes(sip *h, const void *p, size_t len)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++) {
        h->m |= (uint64_t)b[i] << (8 * (h->n & 7));
        if ((++h->n & 7) == 0) {
            sip_block(h, h->m);
            h->m = 0;
        }
    }
}

static uint64_t siphash_origin(const uint64_t key[2], const char *subject, const char *reply)
{
    sip h = {.v0 = 0x736f6d6570736575ULL ^ key[0], .v1 = 0x646f72616e646f6dULL ^ key[1],
             .v2 = 0x6c7967656e657261ULL ^ key[0], .v3 = 0x7465646279746573ULL ^ key[1]};
    sip_bytes(&h, subject, strlen(subject));
    sip_bytes(&h, "", 1);
    if (reply) sip_bytes(&h, reply, strlen(reply));
    sip_block(&h, h.m | (uint64_t)(h.n & 0xff) << 56);
    uint64_t v0 = h.v0, v1 = h.v1, v2 = h.v2 ^ 0xff, v3 = h.v3;
    for (int i = 0; i < 4; i++) SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

void dm_origin_tag(const fx_daemon *d, const char *subject, const char *reply, char *out, size_t cap)
{
    snprintf(out, cap, "%016" PRIx64, siphash_origin(d->origin_key, subject ? subject : "", reply));
}

bool dm_origin_ours(const fx_daemon *d, const char *subject, const char *reply, const char *value)
{
    if (!value || strlen(value) != FX_DM_ORIGIN_LEN) return false;
    char want[FX_DM_ORIGIN_LEN + 1];
    dm_origin_tag(d, subject, reply, want, sizeof want);
    unsigned diff = 0; /* constant time: the tag is a secret */
    for (size_t i = 0; i < FX_DM_ORIGIN_LEN; i++) diff |= (unsigned)(want[i] ^ value[i]);
    return diff == 0;
}

/* ---- capture callback -------------------------------------------------------------------------- */

static void on_capture(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    dm_chan *ch = arg;
    fx_daemon *d = ch->d;
    char *hdr = NULL;
    size_t hlen = 0;
    const char *v = NULL;
    const char *subj = natsMsg_GetSubject(m);
    const char *reply = natsMsg_GetReply(m);
    if (reply && !*reply) reply = NULL;
    if (natsMsgHeader_Get(m, FX_DM_HDR_ORIGIN, &v) == NATS_OK && dm_origin_ours(d, subj, reply, v)) {
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

/* ---- MPMC id ------------------------------------------------------------------------------------ */

fx_err dm_chan_resolve(dm_chan *ch, bool force, int64_t *out)
{
    pthread_mutex_lock(&ch->mu);
    if (ch->have_mpmc && !force) {
        *out = ch->mpmc;
        pthread_mutex_unlock(&ch->mu);
        return FX_OK;
    }
    pthread_mutex_unlock(&ch->mu);
    fx_mq_chan_cfg cfg = {.capacity = ch->s.capacity, .ttl_s = ch->s.ttl_seconds,
                          .retention_s = (ch->s.retention_ms + 999) / 1000, .weight = 0};
    int64_t id = -1;
    fx_err e = fx_mpmc_resolve(ch->d->mq, ch->name, &cfg, &id);
    if (e) return e;
    pthread_mutex_lock(&ch->mu);
    if (!ch->have_mpmc || ch->mpmc != id)
        FX_INF("channel %s: MPMC %" PRId64, ch->name, id);
    ch->mpmc = id;
    ch->have_mpmc = true;
    pthread_mutex_unlock(&ch->mu);
    *out = id;
    return FX_OK;
}

void dm_chan_forget_mpmc(dm_chan *ch)
{
    pthread_mutex_lock(&ch->mu);
    ch->have_mpmc = false;
    pthread_mutex_unlock(&ch->mu);
}

/* ---- producer thread ---------------------------------------------------------------------------- */

typedef struct prod_state {
    int64_t backoff_ms;
    int64_t next_open_ms;
} prod_state;

/* ---- put workers: batches in flight ------------------------------------------------------------
 * The producer thread (the dispatcher) takes a batch from the queue, filters its duplicates and
 * hands it to an idle slot; the slot's worker thread stores it with fx_mpmc_put_hold (into a
 * sub-MPSC no other worker holds), answers it (PubAcks in order), releases the sub-MPSC and goes
 * idle. At most min(FX_DM_INFLIGHT, ready sub-MPSCs) batches are in flight, so per sub-MPSC one
 * batch at a time: its messages and PubAcks keep their order.
 * Thread rules: under q.mu: every slot's busy/n/batch hand-over, n_busy, n_idbusy, quit, reopen.
 * ch->prod is opened and closed by the dispatcher only, closed only while no slot is busy (a
 * worker uses the producer it was handed). ch->dedup: under dd_mu (dd_mu before q.mu).
 * Nats-Msg-Id batches are stored one at a time (n_idbusy <= 1): the next one is filtered once the
 * ids of the previous one are held, so a duplicate in flight is still found. */
typedef struct dm_flight dm_flight;

typedef struct dm_slot {
    dm_flight *fl;
    pthread_t thr;
    bool started;
    bool busy;         /* handed a batch, not answered yet */
    bool has_ids;      /* the batch holds Nats-Msg-Id captures of a dedup channel */
    bool mine;         /* busy, stored by the dispatcher itself (not by the worker) */
    pthread_cond_t cv; /* busy set, or quit */
    fx_mpmc_producer *prod;
    size_t n;
    pq_item *batch[FX_DM_BATCH_MSGS];
} dm_slot;

struct dm_flight {
    dm_chan *ch;
    unsigned n_busy, n_idbusy, peak;
    bool quit;   /* workers exit */
    bool reopen; /* a put found the producer closed: the dispatcher reopens it */
    bool ids_pending; /* a Nats-Msg-Id batch was stored: its ids may wait to be recorded */
    atomic_bool give_up; /* stopping and a put failed: answer the rest at once (bounded drain) */
    pthread_mutex_t dd_mu;
    dm_slot slot[FX_DM_INFLIGHT];
};

/* Dispatcher only. The close interrupts the puts in flight; the free waits for their workers. */
static void prod_close(dm_chan *ch)
{
    if (!ch->prod) return;
    fx_mpmc_producer_close(ch->prod);
    dm_flight *fl = ch->fl;
    pthread_mutex_lock(&ch->q.mu);
    while (fl && fl->n_busy) pthread_cond_wait(&ch->q.cv, &ch->q.mu);
    pthread_mutex_unlock(&ch->q.mu);
    fx_mpmc_producer_free(ch->prod);
    ch->prod = NULL;
}

/* Interruptible (by stop) wait on the queue condvar until deadline. */
static void prod_sleep_until(dm_chan *ch, int64_t deadline)
{
    pthread_mutex_lock(&ch->q.mu);
    while (!ch->q.stop && fx_ms_left(deadline) > 0) {
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&ch->q.cv, &ch->q.mu, &ts);
    }
    pthread_mutex_unlock(&ch->q.mu);
}

static fx_err prod_open(dm_chan *ch, prod_state *ps)
{
    if (ch->prod) return FX_OK;
    bool stopping;
    pthread_mutex_lock(&ch->q.mu);
    stopping = ch->q.stop;
    pthread_mutex_unlock(&ch->q.mu);
    if (!stopping && ps->next_open_ms > fx_now_ms()) prod_sleep_until(ch, ps->next_open_ms);
    int64_t id = -1;
    fx_err e = dm_chan_resolve(ch, false, &id);
    if (!e) e = fx_mpmc_producer_open(ch->d->mq, id, 0, &ch->prod);
    if (e) {
        bool held = fx_err_hold();
        dm_chan_forget_mpmc(ch);
        fx_err_release(held);
        const char *detail = fx_err_detail();
        ch->prod = NULL;
        ps->backoff_ms = ps->backoff_ms ? ps->backoff_ms * 2 : 100;
        if (ps->backoff_ms > 2000) ps->backoff_ms = 2000;
        ps->next_open_ms = fx_now_ms() + ps->backoff_ms;
        pthread_mutex_lock(&ch->mu);
        snprintf(ch->attach_err, sizeof ch->attach_err, "%s (%s)", fx_strerror(e), detail);
        pthread_mutex_unlock(&ch->mu);
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 2000, FX_LOG_ERR, "channel %s: cannot open producer: %s (%s)",
                           ch->name, fx_strerror(e), detail);
        return e;
    }
    ps->backoff_ms = 0;
    ps->next_open_ms = 0;
    FX_INF("channel %s: attached, producer open (member %" PRId64 ")", ch->name,
           fx_mpmc_producer_member(ch->prod));
    return FX_OK;
}

static void complete(dm_chan *ch, pq_item *it, fx_err e, const fx_mq_msg_id *id)
{
    fx_daemon *d = ch->d;
    if (it->kind == PQ_DEADLETTER) {
        it->result = e;
        dm_claim_dlq_complete(it);
        return;
    }
    if (it->done) { /* a due delayed message (delayq.h) */
        it->done(it, e);
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

static bool prod_stopping(dm_chan *ch)
{
    pthread_mutex_lock(&ch->q.mu);
    bool st = ch->q.stop;
    pthread_mutex_unlock(&ch->q.mu);
    return st;
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
    for (size_t i = 0; i < dd->n; i++) complete(ch, dd->items[i], FX_OK, &dd->sids[i]);
    dd->n = 0;
}

/* Record the pending ids, and look up ids[0..n) in the same txns. */
static fx_err dedup_sync(dm_chan *ch, const fx_slice *ids, size_t n, fx_bytes *vals)
{
    dm_dedup *dd = ch->dedup;
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
    if (!ch->dedup) return;
    if (ch->dedup->n) dedup_sync(ch, NULL, 0, NULL);
    fx_dedup_free(ch->dedup->dd);
    dedup_pending_clear(ch, ch->dedup);
    free(ch->dedup);
    ch->dedup = NULL;
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
    if (!ch->dedup) {
        dm_dedup *dd = calloc(1, sizeof *dd);
        fx_err e = dd ? fx_dedup_new(ch->d->mq, ch->name, ch->s.duplicate_window_ms, &dd->dd)
                      : FX_ENOMEM;
        if (e) {
            free(dd);
            fx_log_ratelimited(&dedup_slot, 5000, FX_LOG_ERR, "channel %s: dedup: %s (%s)",
                               ch->name, fx_strerror(e), fx_err_detail());
            return n;
        }
        ch->dedup = dd;
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
                it->done(it, FX_OK); /* a delayed message moved twice: stored once */
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
    dm_dedup *dd = ch->dedup;
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

/* Worker: store the slot's batch (it may take several puts: a sub-MPSC full after part of it). */
static void store_batch(dm_chan *ch, dm_flight *fl, dm_slot *sl)
{
    pq_item **batch = sl->batch;
    size_t n = sl->n;
    fx_slice vals[FX_DM_BATCH_MSGS];
    fx_mq_msg_id ids[FX_DM_BATCH_MSGS];
    for (size_t i = 0; i < n; i++) vals[i] = (fx_slice){batch[i]->rec, batch[i]->rec_len};
    size_t done = 0;
    /* The put deadline runs from the oldest message's arrival, so a publish waiting behind a
     * failing batch (store down) is answered within FX_DM_PUT_TIMEOUT_MS of its arrival too;
     * full_wait (default 0): how long a put may wait for room on top (0 answers "full" at once). */
    int64_t oldest = fx_now_ms();
    for (size_t i = 0; i < n; i++)
        if (batch[i]->in_ms && batch[i]->in_ms < oldest) oldest = batch[i]->in_ms;
    int64_t deadline = oldest + FX_DM_PUT_TIMEOUT_MS + ch->s.full_wait_ms;
    fx_err e = FX_OK;
    while (done < n) {
        size_t np = 0;
        int left = (int)fx_ms_left(deadline);
        if (left <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "put deadline passed");
            break;
        }
        int wait = ch->s.full_wait_ms < left ? (int)ch->s.full_wait_ms : left;
        int64_t held = -1;
        e = fx_mpmc_put_hold(sl->prod, vals + done, n - done, wait, &np, ids + done, &held);
        if (np > n - done) np = n - done;
        if (sl->has_ids && np) {
            pthread_mutex_lock(&fl->dd_mu);
            if (ch->dedup) dedup_hold(ch, batch + done, ids + done, np);
            pthread_mutex_unlock(&fl->dd_mu);
        }
        for (size_t i = done; i < done + np; i++)
            if (batch[i]) complete(ch, batch[i], FX_OK, &ids[i]);
        for (size_t i = done; i < done + np; i++) batch[i] = NULL;
        fx_mpmc_put_release(sl->prod, held); /* after the PubAcks: in order per sub-MPSC */
        done += np;
        if (!e && np) continue; /* the rest did not fit into that sub-MPSC */
        if (!e) {
            e = fx_seterr(FX_ESERVER, "put stored nothing");
            break;
        }
        if (e == FX_ELEASE_LOST || e == FX_ECLOSED) {
            /* The producer closed itself (a lease expired) or is being replaced: the dispatcher
             * reopens it; the rest goes back to the head of the queue for it (twice at most). */
            FX_WRN("channel %s: producer closed (%s): reopening", ch->name, fx_strerror(e));
            pq_item *back[FX_DM_BATCH_MSGS];
            size_t nb = 0;
            for (size_t i = done; i < n; i++) {
                if (batch[i]->reopens < 2) {
                    batch[i]->reopens++;
                    back[nb++] = batch[i];
                } else {
                    complete(ch, batch[i], e, NULL);
                }
                batch[i] = NULL;
            }
            pthread_mutex_lock(&ch->q.mu);
            dm_pq_requeue_front_locked(&ch->q, back, nb);
            fl->reopen = true;
            pthread_mutex_unlock(&ch->q.mu);
            return;
        }
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 2000, e == FX_EFULL ? FX_LOG_WRN : FX_LOG_ERR,
                           "channel %s: put of %zu messages failed: %s (%s)", ch->name, n - done,
                           fx_strerror(e), fx_err_detail());
        break;
    }
    for (size_t i = done; i < n; i++)
        if (batch[i]) complete(ch, batch[i], e ? e : FX_ESERVER, NULL);
    if (done < n && prod_stopping(ch)) {
        FX_WRN("channel %s: storing failed while draining: answering the remaining publishes "
               "with errors", ch->name);
        atomic_store(&fl->give_up, true);
    }
}

/* q->mu held: a slot's batch is stored (by its worker or by the producer thread itself); the
 * slot is free again and the dispatcher is woken. */
static void slot_done_locked(dm_chan *ch, dm_flight *fl, dm_slot *sl)
{
    sl->busy = sl->mine = false;
    sl->n = 0;
    fl->n_busy--;
    if (sl->has_ids) {
        fl->n_idbusy--;
        fl->ids_pending = true;
    }
    fx_metric_set(ch->m.inflight, fl->n_busy);
    pthread_cond_broadcast(&ch->q.cv);
}

static void *worker_main(void *arg)
{
    dm_slot *sl = arg;
    dm_flight *fl = sl->fl;
    dm_chan *ch = fl->ch;
    dm_pq *q = &ch->q;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!(sl->busy && !sl->mine) && !fl->quit) pthread_cond_wait(&sl->cv, &q->mu);
        if (!sl->busy || sl->mine) break; /* quit, nothing handed */
        pthread_mutex_unlock(&q->mu);
        store_batch(ch, fl, sl);
        pthread_mutex_lock(&q->mu);
        slot_done_locked(ch, fl, sl);
    }
    pthread_mutex_unlock(&q->mu);
    nats_ReleaseThreadMemory();
    return NULL;
}

static dm_flight *flight_new(dm_chan *ch)
{
    dm_flight *fl = calloc(1, sizeof *fl);
    if (!fl) return NULL;
    fl->ch = ch;
    atomic_init(&fl->give_up, false);
    pthread_mutex_init(&fl->dd_mu, NULL);
    for (int i = 0; i < FX_DM_INFLIGHT; i++) {
        fl->slot[i].fl = fl;
        pthread_cond_init(&fl->slot[i].cv, NULL);
    }
    return fl;
}

/* After the dispatcher returned: stop and join the workers (all idle by then). */
static void flight_free(dm_flight *fl)
{
    if (!fl) return;
    dm_pq *q = &fl->ch->q;
    pthread_mutex_lock(&q->mu);
    fl->quit = true;
    for (int i = 0; i < FX_DM_INFLIGHT; i++) pthread_cond_signal(&fl->slot[i].cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < FX_DM_INFLIGHT; i++) {
        if (fl->slot[i].started) pthread_join(fl->slot[i].thr, NULL);
        pthread_cond_destroy(&fl->slot[i].cv);
    }
    pthread_mutex_destroy(&fl->dd_mu);
    free(fl);
}

/* Batches in flight at once now: one per ready sub-MPSC, at most FX_DM_INFLIGHT. */
static unsigned flight_limit(dm_chan *ch, size_t ready)
{
    (void)ch;
    if (ready < 1) return 1;
    return ready < FX_DM_INFLIGHT ? (unsigned)ready : FX_DM_INFLIGHT;
}

/* Messages in the next batch. With at most FX_DM_INFLIGHT ready sub-MPSCs: everything queued
 * (up to FX_DM_BATCH_MSGS): the batches in flight already rotate over all of them, and splitting
 * only adds per-batch cost (measured: 128 B rows 4b/4c of the bench lost 40% with queued / 4).
 * With more: queued / R, so a burst reaches every ready sub-MPSC (every claim), but never fewer
 * than FX_DM_SPREAD_MIN messages. */
static size_t batch_cap(size_t queued, size_t ready)
{
    if (ready <= FX_DM_INFLIGHT) return FX_DM_BATCH_MSGS;
    size_t cap = queued / ready;
    if (cap < FX_DM_SPREAD_MIN) cap = FX_DM_SPREAD_MIN;
    if (cap > FX_DM_BATCH_MSGS) cap = FX_DM_BATCH_MSGS;
    return cap;
}

/* Keep the channel attached while the bridge runs (the durability contract): open the producer at
 * once (registering the channel's data leases and those of every sub-MPSC in its list) and
 * reopen it when it closed itself (a lease expired), with or without traffic. Checked every
 * FX_DM_KEEPER_MS; no RPC when all is well. */
static void prod_keep(dm_chan *ch, prod_state *ps)
{
    if (ch->prod && fx_mpmc_producer_check(ch->prod) != FX_OK) {
        FX_WRN("channel %s: producer closed by itself (%s): reattaching", ch->name,
               fx_err_detail());
        prod_close(ch);
        dm_chan_forget_mpmc(ch);
    }
    if (!ch->prod && !prod_stopping(ch)) (void)prod_open(ch, ps);
    atomic_store(&ch->attached, ch->prod != NULL);
}

/* Dispatcher: hand the filtered batch of slot sl to its worker (started on first use). With one
 * batch at most in flight (limit 1: one ready sub-MPSC or none) the dispatcher stores it itself:
 * no thread hop on the one-at-a-time path. */
static void flight_hand(dm_chan *ch, dm_flight *fl, dm_slot *sl, unsigned limit)
{
    dm_pq *q = &ch->q;
    pthread_mutex_lock(&q->mu);
    sl->prod = ch->prod;
    sl->busy = true;
    fl->n_busy++;
    if (sl->has_ids) fl->n_idbusy++;
    if (fl->n_busy > fl->peak) {
        fl->peak = fl->n_busy;
        fx_metric_set(ch->m.inflight_peak, fl->peak);
    }
    fx_metric_set(ch->m.inflight, fl->n_busy);
    bool run_here = limit <= 1 && fl->n_busy == 1;
    sl->mine = run_here;
    if (!run_here && !sl->started) {
        if (pthread_create(&sl->thr, NULL, worker_main, sl) == 0)
            sl->started = true;
        else
            run_here = sl->mine = true; /* no thread: store it on this one */
    }
    if (!run_here) pthread_cond_signal(&sl->cv);
    pthread_mutex_unlock(&q->mu);
    if (!run_here) return;
    store_batch(ch, fl, sl);
    pthread_mutex_lock(&q->mu);
    slot_done_locked(ch, fl, sl);
    pthread_mutex_unlock(&q->mu);
}

static void *producer_main(void *arg)
{
    dm_chan *ch = arg;
    dm_pq *q = &ch->q;
    dm_flight *fl = ch->fl;
    prod_state ps = {0};
    for (;;) {
        prod_keep(ch, &ps);
        size_t ready = ch->prod ? fx_mpmc_producer_ready(ch->prod) : 0;
        unsigned limit = flight_limit(ch, ready);
        pthread_mutex_lock(&q->mu);
        if (fl->reopen) {
            fl->reopen = false;
            pthread_mutex_unlock(&q->mu);
            prod_close(ch); /* waits for the workers in flight */
            dm_chan_forget_mpmc(ch);
            continue;
        }
        if (!q->head && q->stop && !fl->n_busy) {
            pthread_mutex_unlock(&q->mu);
            break; /* stop, empty, nothing in flight */
        }
        if (!q->head && !fl->n_idbusy && fl->ids_pending) {
            fl->ids_pending = false; /* idle: record the stored ids now */
            pthread_mutex_unlock(&q->mu);
            pthread_mutex_lock(&fl->dd_mu);
            if (ch->dedup && ch->dedup->n) dedup_sync(ch, NULL, 0, NULL);
            pthread_mutex_unlock(&fl->dd_mu);
            continue;
        }
        if (!q->head || fl->n_busy >= limit) {
            /* Wait for a message or a free slot; wake up to re-check the producer (sooner while
             * it is not open yet). */
            int64_t wait = ch->prod ? FX_DM_KEEPER_MS : ps.next_open_ms - fx_now_ms();
            if (wait < 10) wait = 10;
            if (wait > FX_DM_KEEPER_MS) wait = FX_DM_KEEPER_MS;
            struct timespec ts = fx_deadline_ts(fx_now_ms() + wait);
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
            pthread_mutex_unlock(&q->mu);
            continue;
        }
        dm_slot *sl = NULL;
        for (int i = 0; i < FX_DM_INFLIGHT && !sl; i++)
            if (!fl->slot[i].busy) sl = &fl->slot[i];
        size_t cap = batch_cap(q->n, ready), n = 0, bytes = 0;
        while (q->head && n < cap && (n == 0 || bytes + q->head->rec_len <= FX_DM_BATCH_BYTES)) {
            pq_item *it = dm_pq_take_locked(q);
            bytes += it->rec_len;
            sl->batch[n++] = it;
        }
        bool has_ids = false;
        for (size_t i = 0; i < n && !has_ids; i++)
            has_ids = sl->batch[i]->kind == PQ_CAPTURE && sl->batch[i]->msgid;
        has_ids = has_ids && ch->s.duplicate_window_ms > 0;
        /* the ids of the Nats-Msg-Id batch in flight are held before this one is looked up */
        while (has_ids && fl->n_idbusy) pthread_cond_wait(&q->cv, &q->mu);
        pthread_mutex_unlock(&q->mu);
        if (atomic_load(&fl->give_up)) {
            for (size_t i = 0; i < n; i++) complete(ch, sl->batch[i], FX_ECANCELED, NULL);
            continue;
        }
        if (has_ids) {
            pthread_mutex_lock(&fl->dd_mu);
            n = dedup_filter(ch, sl->batch, n);
            pthread_mutex_unlock(&fl->dd_mu);
            if (!n) continue;
        }
        fx_err e = prod_open(ch, &ps);
        if (e) {
            for (size_t i = 0; i < n; i++) complete(ch, sl->batch[i], e, NULL);
            if (prod_stopping(ch)) atomic_store(&fl->give_up, true);
            continue;
        }
        sl->n = n;
        sl->has_ids = has_ids;
        flight_hand(ch, fl, sl, limit);
    }
    prod_close(ch);
    atomic_store(&ch->attached, false);
    pthread_mutex_lock(&fl->dd_mu);
    dedup_free(ch);
    pthread_mutex_unlock(&fl->dd_mu);
    nats_ReleaseThreadMemory();
    return NULL;
}

/* ---- channel lifecycle -------------------------------------------------------------------------- */

static fx_metric *cmetric(fx_daemon *d, const char *name, const char *help, fx_metric_kind k,
                          const char *label)
{
    return fx_metrics_add(d->metrics, name, help, k, label);
}

static void chan_free(dm_chan *ch);

dm_chan *dm_chan_new(fx_daemon *d, const fx_chan_config *cc)
{
    dm_chan *ch = calloc(1, sizeof *ch);
    if (!ch) return NULL;
    atomic_init(&ch->refs, 1);
    ch->d = d;
    ch->name = dupstr(cc->name);
    ch->deliver_prefix = dupstr(cc->deliver_prefix);
    ch->s = cc->s;
    ch->is_dlq = cc->is_dlq;
    ch->n_subjects = cc->n_subjects;
    ch->subjects = calloc(cc->n_subjects ? cc->n_subjects : 1, sizeof *ch->subjects);
    bool ok = ch->name && ch->deliver_prefix && ch->subjects;
    for (size_t i = 0; ok && i < cc->n_subjects; i++) ok = (ch->subjects[i] = dupstr(cc->subjects[i]));
    pthread_mutex_init(&ch->mu, NULL);
    atomic_init(&ch->attached, false);
    snprintf(ch->attach_err, sizeof ch->attach_err, "attaching");
    dm_pq_init(&ch->q);
    ch->mpmc = -1;
    if (!ok) {
        chan_free(ch);
        return NULL;
    }
    const char *l = ch->name;
    dm_chan_metrics *m = &ch->m;
    m->captured = cmetric(d, "fluxon_captured_total", "Messages captured from NATS and queued for storing",
                          FX_METRIC_COUNTER, l);
    m->stored = cmetric(d, "fluxon_stored_total", "Messages stored durably (PubAck sent)",
                        FX_METRIC_COUNTER, l);
    m->delivered = cmetric(d, "fluxon_delivered_total", "Deliveries published (every attempt)",
                           FX_METRIC_COUNTER, l);
    m->acked = cmetric(d, "fluxon_acked_total", "Deliveries acknowledged by subscribers",
                       FX_METRIC_COUNTER, l);
    m->redelivered = cmetric(d, "fluxon_redelivered_total", "Redeliveries (attempt > 1)",
                             FX_METRIC_COUNTER, l);
    m->nak_delay_held = cmetric(d, "fluxon_nak_delay_held_total",
                                "NAKs that kept their max_ack_pending slot while waiting out their "
                                "delay (max_ack_pending messages were waiting out NAK delays already)",
                                FX_METRIC_COUNTER, l);
    m->dead = cmetric(d, "fluxon_dead_lettered_total", "Messages moved to the dead-letter channel",
                      FX_METRIC_COUNTER, l);
    m->dropped = cmetric(d, "fluxon_dropped_total",
                         "Messages not captured (bridge queue full, too large, slow consumer)",
                         FX_METRIC_COUNTER, l);
    m->invalid_acks = cmetric(d, "fluxon_invalid_acks_total", "Malformed ack replies ignored",
                              FX_METRIC_COUNTER, l);
    m->backlog = cmetric(d, "fluxon_backlog", "Stored, unconsumed messages (from etcd)",
                         FX_METRIC_GAUGE, l);
    m->reclaimed = cmetric(d, "fluxon_sub_mpscs_reclaimed_total",
                           "Idle sub-MPSCs (no consumer, no backlog, left by a bridge that died) "
                           "reclaimed by this bridge's sweep", FX_METRIC_COUNTER, l);
    m->foreign_headers = cmetric(d, "fluxon_foreign_headers_total",
                                 "Captured messages carrying Fluxon-* headers that are not a delivery "
                                 "of this bridge (stored like any other)", FX_METRIC_COUNTER, l);
    m->own_skipped = cmetric(d, "fluxon_own_deliveries_skipped_total",
                             "Own deliveries (proven by Fluxon-Origin) seen on a capture subject and "
                             "not captured (loop prevention)", FX_METRIC_COUNTER, l);
    m->claims = cmetric(d, "fluxon_claims", "Consumer claims held by this bridge", FX_METRIC_GAUGE, l);
    m->store_errors = cmetric(d, "fluxon_store_errors_total",
                              "Captured messages that could not be stored (error PubAck)",
                              FX_METRIC_COUNTER, l);
    m->duplicates = cmetric(d, "fluxon_duplicates_total",
                            "Publishes not stored: their Nats-Msg-Id was in the duplicate window",
                            FX_METRIC_COUNTER, l);
    m->dedup_forgotten = cmetric(d, "fluxon_dedup_forgotten_total",
                                 "Nats-Msg-Ids forgotten before duplicate_window ended: the "
                                 "window's bound (duplicate_max_ids / duplicate_max_bytes) was "
                                 "reached", FX_METRIC_COUNTER, l);
    m->dedup_ids = cmetric(d, "fluxon_dedup_ids",
                           "Nats-Msg-Ids this bridge recorded that are still in the window",
                           FX_METRIC_GAUGE, l);
    m->inflight = cmetric(d, "fluxon_put_batches_in_flight",
                          "Batches being stored right now (each to its own sub-MPSC)",
                          FX_METRIC_GAUGE, l);
    m->inflight_peak = cmetric(d, "fluxon_put_batches_in_flight_peak",
                               "Most batches stored at once since start (bound: "
                               "min(4, ready sub-MPSCs))", FX_METRIC_GAUGE, l);
    m->full_dropped = cmetric(d, "fluxon_full_dropped_total",
                              "Publishes without a reply subject dropped because the channel was full",
                              FX_METRIC_COUNTER, l);
    return ch;
}

dm_chan *dm_chan_ref(dm_chan *ch)
{
    atomic_fetch_add(&ch->refs, 1);
    return ch;
}

void dm_chan_unref(dm_chan *ch)
{
    if (ch && atomic_fetch_sub(&ch->refs, 1) == 1) chan_free(ch);
}

/* cnats: the capture subscription is closed and its last message callback has returned. */
static void on_capture_complete(void *arg) { dm_chan_unref(arg); }

static void chan_free(dm_chan *ch)
{
    if (!ch) return;
    for (size_t i = 0; i < ch->n_subs; i++)
        if (ch->subs[i]) natsSubscription_Destroy(ch->subs[i]);
    free(ch->subs);
    free(ch->sub_dropped);
    pq_item *it = ch->q.head;
    while (it) {
        pq_item *nx = it->next;
        if (it->kind == PQ_DEADLETTER) {
            it->result = FX_ECLOSED;
            dm_claim_dlq_complete(it);
        } else if (it->done) {
            it->done(it, FX_ECLOSED);
        } else {
            free(it);
        }
        it = nx;
    }
    flight_free(ch->fl); /* never started (else stop_producer_wait freed it) */
    for (size_t i = 0; ch->subjects && i < ch->n_subjects; i++) free(ch->subjects[i]);
    free(ch->subjects);
    free(ch->name);
    free(ch->deliver_prefix);
    pthread_mutex_destroy(&ch->mu);
    dm_pq_destroy(&ch->q);
    free(ch);
}

static bool settings_same(const fx_chan_settings *a, const fx_chan_settings *b)
{
    if (a->ttl_seconds != b->ttl_seconds || a->capacity != b->capacity || a->ack != b->ack ||
        a->ack_wait_ms != b->ack_wait_ms || a->max_deliver != b->max_deliver ||
        a->max_ack_pending != b->max_ack_pending || a->n_backoff != b->n_backoff ||
        a->nak_delay_ms != b->nak_delay_ms ||
        a->release_after_ms != b->release_after_ms || a->interest_poll_ms != b->interest_poll_ms ||
        a->retention_ms != b->retention_ms || a->full_wait_ms != b->full_wait_ms ||
        a->duplicate_window_ms != b->duplicate_window_ms || a->max_delay_ms != b->max_delay_ms)
        return false;
    for (size_t i = 0; i < a->n_backoff && i < FX_CFG_MAX_BACKOFF; i++)
        if (a->backoff_ms[i] != b->backoff_ms[i]) return false;
    return true;
}

bool dm_chan_same(const dm_chan *ch, const fx_chan_config *cc)
{
    if (strcmp(ch->name, cc->name) || strcmp(ch->deliver_prefix, cc->deliver_prefix) ||
        ch->is_dlq != cc->is_dlq || ch->n_subjects != cc->n_subjects || !settings_same(&ch->s, &cc->s))
        return false;
    for (size_t i = 0; i < ch->n_subjects; i++)
        if (strcmp(ch->subjects[i], cc->subjects[i])) return false;
    return true;
}

fx_err dm_chan_start(dm_chan *ch)
{
    fx_daemon *d = ch->d;
    if (!ch->fl && !(ch->fl = flight_new(ch)))
        return fx_seterr(FX_ENOMEM, "channel %s: out of memory", ch->name);
    if (pthread_create(&ch->prod_thr, NULL, producer_main, ch) != 0)
        return fx_seterr(FX_ENOMEM, "channel %s: cannot start the producer thread", ch->name);
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
    bool connected = dm_nats_connected(ch->d);
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
    flight_free(ch->fl);
    ch->fl = NULL;
}
