/* delayq.c -- delayed delivery in the daemon (contract: delayq.h). */
#include "delayq.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "delay.h"
#include "flatdict.h"
#include "fx_time.h"
#include "jsack.h"

typedef struct dq_w { /* one delayed publish waiting to be stored */
    struct dq_w *next;
    dm_chan *ch; /* reference */
    char *reply; /* into the allocation, or NULL */
    int64_t due_ms;
    uint64_t id;
    size_t rec_len;
    uint8_t *rec;
} dq_w;

typedef struct dq_chan { /* per channel name (under dq->mu) */
    char name[128];
    int64_t lease;       /* metadata lease of its MPMC; 0: resolve */
    int64_t count;       /* waiting, as last counted plus our stores minus our moves; -1 unknown */
    int64_t count_ms;    /* fx_now_ms of the last count */
    int64_t count_every; /* ms between counts: FX_DQ_COUNT_MS, or 20 x the last count's time */
    int64_t next_scan_ms;
    bool held;           /* the mover holds its lock ... */
    int64_t held_lease;  /* ... under this lock lease ... */
    int64_t held_ms;     /* ... as etcd said at this time */
    bool hot;            /* a local store since the last scan */
    fx_metric *m_waiting, *m_stored, *m_moved, *m_refused;
} dq_chan;

typedef struct mv_batch {
    struct dm_delayq *dq;
    int refs;     /* under dq->mu */
    size_t ended; /* under dq->mu */
    fx_err res[FX_DQ_WINDOW];
} mv_batch;

struct dm_delayq {
    fx_daemon *d;
    fx_delay *dl;
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* writers: queue non-empty or wstop; mover: batch ended or mstop */
    dq_w *head, *tail;
    size_t n, bytes;
    bool wstop, mstop, stopped;
    bool kick; /* a delayed publish was stored: the mover looks again now */
    pthread_t writers[FX_DQ_WRITERS], mover, counter;
    size_t n_writers;
    size_t idle_writers; /* writers waiting for work (under mu) */
    bool mover_started, counter_started;
    dq_chan *chans[FX_DQ_CHANS_MAX];
    size_t n_chans;
};

static void *writer_main(void *arg);

static int64_t wall_ms(void) { return fx_wall_ns() / 1000000; }

/* dq->mu held */
static dq_chan *chan_get_locked(struct dm_delayq *q, const char *name)
{
    for (size_t i = 0; i < q->n_chans; i++)
        if (strcmp(q->chans[i]->name, name) == 0) return q->chans[i];
    if (q->n_chans == FX_DQ_CHANS_MAX || strlen(name) >= sizeof q->chans[0]->name) return NULL;
    dq_chan *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->count = -1;
    fx_metrics *m = q->d->metrics;
    c->m_waiting = fx_metrics_add(m, "fluxon_delayed_messages",
                                  "Delayed messages waiting for their time (Nats-Schedule, Fluxon-Delay)",
                                  FX_METRIC_GAUGE, name);
    c->m_stored = fx_metrics_add(m, "fluxon_delayed_stored_total",
                                 "Delayed publishes stored in the delay index by this bridge",
                                 FX_METRIC_COUNTER, name);
    c->m_moved = fx_metrics_add(m, "fluxon_delayed_moved_total",
                                "Due delayed messages moved into their channel by this bridge",
                                FX_METRIC_COUNTER, name);
    c->m_refused = fx_metrics_add(m, "fluxon_delayed_refused_total",
                                  "Delayed publishes refused (bad header, above max_delay, full, store error)",
                                  FX_METRIC_COUNTER, name);
    q->chans[q->n_chans++] = c;
    return c;
}

bool dm_delayq_is_header(fx_slice key)
{
    return key.len == sizeof FX_DQ_HDR_DELAY - 1 &&
           strncasecmp(key.data, FX_DQ_HDR_DELAY, key.len) == 0;
}

int64_t dm_delayq_waiting(fx_daemon *d, const char *chan)
{
    struct dm_delayq *q = d->dq;
    if (!q) return -1;
    int64_t v = -1;
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->n_chans; i++)
        if (strcmp(q->chans[i]->name, chan) == 0) v = q->chans[i]->count;
    pthread_mutex_unlock(&q->mu);
    return v;
}

/* ---- publish side ------------------------------------------------------------------------- */

static void refuse(dm_chan *ch, const char *reply, int code, int err_code, const char *desc)
{
    fx_metric_inc(ch->m.dropped, 1);
    struct dm_delayq *q = ch->d->dq;
    if (q) {
        pthread_mutex_lock(&q->mu);
        dq_chan *c = chan_get_locked(q, ch->name);
        if (c) fx_metric_inc(c->m_refused, 1);
        pthread_mutex_unlock(&q->mu);
    }
    if (!reply || !ch->d->nc) return;
    char buf[512];
    int n = fx_puback_err_code(code, err_code, desc, buf, sizeof buf);
    if (n > 0) natsConnection_Publish(ch->d->nc, reply, buf, n);
}

static void fmt_ms(int64_t ms, char *out, size_t cap)
{
    if (ms % 3600000 == 0) snprintf(out, cap, "%" PRId64 "h", ms / 3600000);
    else if (ms % 60000 == 0) snprintf(out, cap, "%" PRId64 "m", ms / 60000);
    else if (ms % 1000 == 0) snprintf(out, cap, "%" PRId64 "s", ms / 1000);
    else snprintf(out, cap, "%" PRId64 "ms", ms);
}

bool dm_delayq_capture(dm_chan *ch, const char *subj, const char *reply, const char *hdr,
                       size_t hlen, const char *data, size_t dlen)
{
    hdr_iter hi;
    fx_slice hk, hv, sched = {0}, rel = {0};
    int n_sched = 0, n_rel = 0;
    dm_hdr_iter_init(&hi, hdr, hlen);
    while (dm_hdr_iter_next(&hi, &hk, &hv)) {
        if (hk.len == sizeof FX_DQ_HDR_SCHEDULE - 1 &&
            strncasecmp(hk.data, FX_DQ_HDR_SCHEDULE, hk.len) == 0) {
            sched = hv;
            n_sched++;
        } else if (dm_delayq_is_header(hk)) {
            rel = hv;
            n_rel++;
        }
    }
    if (!n_sched && !n_rel) return false;
    char desc[256];
    if (ch->is_dlq) {
        refuse(ch, reply, 400, 0, "delayed messages are not supported on a dead-letter channel");
        return true;
    }
    if (n_sched + n_rel > 1) {
        refuse(ch, reply, 400, 0,
               "at most one of Nats-Schedule and Fluxon-Delay, once, per message");
        return true;
    }
    int64_t now = wall_ms(), due;
    if (n_sched) {
        bool unsupported = false;
        if (fx_delay_parse_schedule(sched.data, sched.len, &due, &unsupported)) {
            snprintf(desc, sizeof desc,
                     unsupported ? "Nats-Schedule \"%.*s\" is not supported: only \"@at <RFC 3339 time>\""
                                 : "Nats-Schedule \"%.*s\" is malformed: expected \"@at <RFC 3339 time>\"",
                     (int)(sched.len < 64 ? sched.len : 64), (const char *)sched.data);
            refuse(ch, reply, 400, 0, desc);
            return true;
        }
    } else {
        int64_t ms;
        if (fx_delay_parse_duration(rel.data, rel.len, &ms)) {
            snprintf(desc, sizeof desc,
                     "Fluxon-Delay \"%.*s\" is malformed: expected a duration such as 30s, 1m30s, 250ms",
                     (int)(rel.len < 64 ? rel.len : 64), (const char *)rel.data);
            refuse(ch, reply, 400, 0, desc);
            return true;
        }
        due = now + ms;
    }
    if (due <= now) return false; /* its time has come: stored at once, as any publish */
    int64_t maxd = ch->s.max_delay_ms < ch->s.retention_ms ? ch->s.max_delay_ms : ch->s.retention_ms;
    if (due - now > maxd) {
        char a[32];
        fmt_ms(maxd, a, sizeof a);
        snprintf(desc, sizeof desc, "delay of %.1f s is above the channel's max_delay (%s)",
                 (double)(due - now) / 1000.0, a);
        refuse(ch, reply, 400, 0, desc);
        return true;
    }
    fx_daemon *d = ch->d;
    struct dm_delayq *q = d->dq;
    if (!q) {
        refuse(ch, reply, 503, 0, "delayed delivery is not running");
        return true;
    }
    /* capacity: backlog + waiting delayed */
    int64_t backlog = ch->m.backlog ? atomic_load(&ch->m.backlog->value) : 0;
    pthread_mutex_lock(&q->mu);
    dq_chan *c = chan_get_locked(q, ch->name);
    int64_t waiting = c && c->count > 0 ? c->count : 0;
    pthread_mutex_unlock(&q->mu);
    if (!c) {
        refuse(ch, reply, 503, 0, "too many channels with delayed messages on this bridge");
        return true;
    }
    if (backlog + waiting >= ch->s.capacity) {
        refuse(ch, reply, 503, FX_JS_ERR_MAX_MSGS, "maximum messages exceeded");
        return true;
    }
    fx_mq_msg rec = {.subject = FX_SLICE_STR(subj),
                     .headers = {hdr, hlen},
                     .publish_ns = fx_wall_ns(),
                     .data = {data, dlen}};
    size_t rl = 0, repl = reply ? strlen(reply) + 1 : 0;
    if (fx_mq_msg_encoded_size(&rec, &rl) != FX_OK) {
        refuse(ch, reply, 500, 0, "cannot encode message");
        return true;
    }
    dq_w *w = malloc(sizeof *w + repl + rl);
    if (!w) {
        refuse(ch, reply, 500, 0, "bridge out of memory");
        return true;
    }
    memset(w, 0, sizeof *w);
    w->rec = (uint8_t *)(w + 1);
    if (reply) {
        w->reply = (char *)w->rec + rl;
        memcpy(w->reply, reply, repl);
    }
    if (fx_mq_msg_encode_into(&rec, w->rec, rl, &w->rec_len) != FX_OK) {
        free(w);
        refuse(ch, reply, 500, 0, "cannot encode message");
        return true;
    }
    w->due_ms = due;
    w->id = dm_rand64();
    pthread_mutex_lock(&q->mu);
    bool ok = !q->wstop && q->n < FX_DQ_WQ_MSGS && (q->n == 0 || q->bytes + rl <= FX_DQ_WQ_BYTES);
    if (ok) {
        w->ch = dm_chan_ref(ch);
        if (q->tail) q->tail->next = w;
        else q->head = w;
        q->tail = w;
        q->n++;
        q->bytes += rl;
        /* writers start on demand (an idle bridge keeps none), up to FX_DQ_WRITERS */
        if (q->idle_writers == 0 && q->n_writers < FX_DQ_WRITERS &&
            pthread_create(&q->writers[q->n_writers], NULL, writer_main, q) == 0)
            q->n_writers++;
        pthread_cond_broadcast(&q->cv);
    }
    bool writer = q->n_writers > 0;
    pthread_mutex_unlock(&q->mu);
    if (ok && !writer) { /* not even one writer thread: the stop answers what is queued */
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_ERR, "delayed publishes: cannot start a writer thread");
    }
    if (!ok) {
        free(w);
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN,
                           "channel %s: delayed write queue full: publish refused", ch->name);
        refuse(ch, reply, 503, 0, "bridge queue full");
        return true;
    }
    fx_metric_inc(ch->m.captured, 1);
    return true;
}

static void answer(fx_daemon *d, dq_w *w, fx_err e)
{
    if (!w->reply || !d->nc) return;
    char buf[512];
    int n;
    if (!e) {
        n = fx_puback_ok(w->ch->name, 0, buf, sizeof buf - 64);
        if (n > 0 && buf[n - 1] == '}') {
            int k = snprintf(buf + n - 1, sizeof buf - (size_t)n + 1,
                             ",\"fluxon_due_ms\":%" PRId64 "}", w->due_ms);
            n = k > 0 ? n - 1 + k : -1;
        }
    } else if (e == FX_ENOSPACE) {
        n = fx_puback_err_code(503, FX_JS_ERR_INSUFFICIENT_RESOURCES, "insufficient resources",
                               buf, sizeof buf);
    } else {
        n = fx_puback_err_code(503, 0, "store unavailable (delay index not written)", buf,
                               sizeof buf);
    }
    if (n > 0) natsConnection_Publish(d->nc, w->reply, buf, n);
}

/* The metadata lease of the channel (cached in c; dq->mu not held). */
static fx_err chan_lease(struct dm_delayq *q, dm_chan *ch, int64_t *lease)
{
    pthread_mutex_lock(&q->mu);
    dq_chan *c = chan_get_locked(q, ch->name);
    *lease = c ? c->lease : 0;
    pthread_mutex_unlock(&q->mu);
    if (!c) return fx_seterr(FX_ENOMEM, "delay: channel table full");
    if (*lease > 0) return FX_OK;
    int64_t mpmc = 0;
    fx_err e = dm_chan_resolve(ch, false, &mpmc);
    if (!e) e = fx_delay_chan_lease(q->dl, mpmc, lease);
    if (e == FX_ENOTFOUND) dm_chan_forget_mpmc(ch);
    if (e) return e;
    pthread_mutex_lock(&q->mu);
    c->lease = *lease;
    pthread_mutex_unlock(&q->mu);
    return FX_OK;
}

static void forget_lease(struct dm_delayq *q, dm_chan *ch)
{
    pthread_mutex_lock(&q->mu);
    dq_chan *c = chan_get_locked(q, ch->name);
    if (c) c->lease = 0;
    pthread_mutex_unlock(&q->mu);
    dm_chan_forget_mpmc(ch);
}

static void *writer_main(void *arg)
{
    fx_thread_name("fx-delay-write");
    struct dm_delayq *q = arg;
    fx_daemon *d = q->d;
    dq_w *batch[FX_DELAY_TXN_OPS];
    fx_delay_put puts[FX_DELAY_TXN_OPS];
    for (;;) {
        pthread_mutex_lock(&q->mu);
        q->idle_writers++;
        while (!q->head && !q->wstop) pthread_cond_wait(&q->cv, &q->mu);
        q->idle_writers--;
        if (!q->head) {
            pthread_mutex_unlock(&q->mu);
            break;
        }
        size_t n = 0, bytes = 0;
        while (q->head && n < FX_DELAY_TXN_OPS && (n == 0 || bytes + q->head->rec_len <= FX_DQ_TXN_BYTES)) {
            dq_w *w = q->head;
            q->head = w->next;
            if (!q->head) q->tail = NULL;
            q->n--;
            q->bytes -= w->rec_len;
            bytes += w->rec_len;
            w->next = NULL;
            batch[n++] = w;
        }
        pthread_mutex_unlock(&q->mu);
        size_t np = 0;
        fx_err e = FX_OK;
        for (size_t i = 0; i < n; i++) {
            int64_t lease = 0;
            fx_err le = chan_lease(q, batch[i]->ch, &lease);
            if (le) {
                static fx_log_slot slot;
                fx_log_ratelimited(&slot, 5000, FX_LOG_WRN,
                                   "channel %s: delayed publish refused: channel lease: %s (%s)",
                                   batch[i]->ch->name, fx_strerror(le), fx_err_detail());
                answer(d, batch[i], le);
                fx_metric_inc(batch[i]->ch->m.store_errors, 1);
                dm_chan_unref(batch[i]->ch);
                free(batch[i]);
                batch[i] = NULL;
                continue;
            }
            batch[np] = batch[i];
            puts[np++] = (fx_delay_put){.chan = batch[i]->ch->name, .lease = lease,
                                        .due_ms = batch[i]->due_ms, .id = batch[i]->id,
                                        .rec = {batch[i]->rec, batch[i]->rec_len}};
        }
        size_t stored = 0;
        if (np) e = fx_delay_put_batch(q->dl, puts, np, &stored, FX_DQ_ETCD_MS);
        if (e) {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "delayed publishes: store failed: %s (%s)",
                               fx_strerror(e), fx_err_detail());
            if (e == FX_ELEASE_EXPIRED)
                for (size_t i = stored; i < np; i++) forget_lease(q, batch[i]->ch);
        }
        for (size_t i = 0; i < np; i++) {
            fx_err r = i < stored ? FX_OK : (e ? e : FX_ESERVER);
            dm_chan *ch = batch[i]->ch;
            answer(d, batch[i], r);
            pthread_mutex_lock(&q->mu);
            dq_chan *c = chan_get_locked(q, ch->name);
            if (c && !r) {
                if (c->count >= 0) c->count++;
                c->hot = true;
                q->kick = true;
                pthread_cond_broadcast(&q->cv);
                fx_metric_inc(c->m_stored, 1);
                fx_metric_set(c->m_waiting, c->count > 0 ? c->count : 0);
            } else if (c) {
                fx_metric_inc(c->m_refused, 1);
            }
            pthread_mutex_unlock(&q->mu);
            if (!r) fx_metric_inc(ch->m.stored, 1);
            else fx_metric_inc(ch->m.store_errors, 1);
            dm_chan_unref(ch);
            free(batch[i]);
        }
    }
    return NULL;
}

/* ---- mover -------------------------------------------------------------------------------- */

/* pqueue.h `done`: a moved message ended (producer side). */
static void moved(pq_item *it, fx_err e)
{
    mv_batch *b = it->done_arg;
    struct dm_delayq *q = b->dq;
    pthread_mutex_lock(&q->mu);
    if (it->ent_idx < FX_DQ_WINDOW) b->res[it->ent_idx] = e;
    b->ended++;
    bool last = --b->refs == 0;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (last) free(b);
    free(it);
}

/* Move due entries of ch (mover thread). Returns how many were moved (keys deleted). */
static size_t move_entries(struct dm_delayq *q, dm_chan *ch, dq_chan *c, fx_delay_entry *en,
                           size_t n)
{
    mv_batch *b = calloc(1, sizeof *b);
    if (!b) return 0;
    b->dq = q;
    b->refs = 1;
    size_t pushed = 0;
    for (size_t i = 0; i < n; i++) {
        char msgid[8 + FX_DELAY_ID_HEX + 1];
        snprintf(msgid, sizeof msgid, "fxd:%s", en[i].id);
        pq_item *it = dm_pq_item_new_id(PQ_CAPTURE, NULL, ch->s.duplicate_window_ms > 0 ? msgid : NULL,
                                        en[i].rec.len);
        if (!it) break;
        memcpy(it->rec, en[i].rec.data, en[i].rec.len);
        it->done = moved;
        it->done_arg = b;
        it->ent_idx = (uint32_t)i;
        b->res[i] = FX_ECANCELED;
        pthread_mutex_lock(&q->mu);
        b->refs++;
        pthread_mutex_unlock(&q->mu);
        if (!dm_pq_push(&ch->q, it)) {
            pthread_mutex_lock(&q->mu);
            b->refs--;
            pthread_mutex_unlock(&q->mu);
            free(it);
            break;
        }
        pushed++;
    }
    /* Wait for the stores: the producer's put deadline plus full_wait, plus a margin. */
    int64_t deadline = fx_now_ms() + FX_DM_PUT_TIMEOUT_MS + ch->s.full_wait_ms + 2000;
    pthread_mutex_lock(&q->mu);
    while (b->ended < pushed && !q->mstop && fx_ms_left(deadline) > 0) {
        struct timespec ts = fx_deadline_ts(fx_ms_left(deadline) < 100 ? deadline : fx_now_ms() + 100);
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    fx_delay_entry ok[FX_DQ_WINDOW];
    size_t nok = 0, full = 0, failed = 0;
    for (size_t i = 0; i < pushed; i++) {
        if (b->res[i] == FX_OK) ok[nok++] = en[i];
        else if (b->res[i] == FX_EFULL) full++;
        else failed++;
    }
    bool last = --b->refs == 0;
    pthread_mutex_unlock(&q->mu);
    if (last) free(b);
    if (full || failed || pushed < n) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN,
                           "channel %s: %zu due delayed message(s) not moved yet (%zu full, %zu "
                           "failed or unanswered, %zu not queued): retried",
                           ch->name, n - nok, full, failed, n - pushed);
    }
    if (!nok) return 0;
    fx_err e = fx_delay_remove(q->dl, ok, nok, FX_DQ_ETCD_MS);
    if (e) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN,
                           "channel %s: moved delayed messages' keys not deleted: %s (%s): moved "
                           "again later (deduplicated within duplicate_window)",
                           ch->name, fx_strerror(e), fx_err_detail());
        return 0;
    }
    pthread_mutex_lock(&q->mu);
    if (c->count > 0) c->count = c->count > (int64_t)nok ? c->count - (int64_t)nok : 0;
    fx_metric_set(c->m_waiting, c->count > 0 ? c->count : 0);
    fx_metric_inc(c->m_moved, (int64_t)nok);
    pthread_mutex_unlock(&q->mu);
    return nok;
}

/* One channel's turn. Returns true when more is due right away; *wake: when it wants its next
 * turn (monotonic ms). A scan reads the keys due within FX_DQ_LOOKAHEAD_MS, moves those due now
 * and sets the next turn to the earliest of the others' due time (no polling slack). */
static bool mover_chan(struct dm_delayq *q, dm_chan *ch, int64_t *budget, int64_t *wake)
{
    pthread_mutex_lock(&q->mu);
    dq_chan *c = chan_get_locked(q, ch->name);
    bool hot = c && c->hot, idle = c && c->count == 0 && !hot;
    if (c) c->hot = false;
    pthread_mutex_unlock(&q->mu);
    if (!c) return false;
    int64_t now = fx_now_ms();
    if (!hot && now < c->next_scan_ms) {
        if (c->next_scan_ms < *wake) *wake = c->next_scan_ms;
        return false;
    }
    c->next_scan_ms = now + (idle ? FX_DQ_IDLE_POLL_MS : FX_DQ_POLL_MS);
    if (*budget <= 0) return true;
    size_t win = *budget < FX_DQ_WINDOW ? (size_t)*budget : FX_DQ_WINDOW;
    fx_delay_entry *en = NULL;
    size_t n = 0, k = 0;
    bool more = false;
    int64_t wall = wall_ms();
    fx_err e = fx_delay_scan(q->dl, ch->name, wall + FX_DQ_LOOKAHEAD_MS, win, &en, &n, &more,
                             FX_DQ_ETCD_MS);
    if (!e) {
        wall = wall_ms();
        while (k < n && en[k].due_ms <= wall) k++; /* due now: [0, k) */
        if (k < n) { /* the next one is due soon: a turn right then */
            int64_t at = fx_now_ms() + (en[k].due_ms - wall);
            if (at < c->next_scan_ms) c->next_scan_ms = at;
            more = false;
        }
    }
    if (c->next_scan_ms < *wake) *wake = c->next_scan_ms;
    if (e || !k) {
        fx_delay_entries_free(en, n);
        return false;
    }
    /* the lock: confirmed by etcd at most FX_DQ_LOCK_CHECK_MS ago under the same live lease */
    int64_t lease = fx_delay_lock_lease(q->dl);
    bool held = c->held && lease && lease == c->held_lease && now - c->held_ms < FX_DQ_LOCK_CHECK_MS;
    if (!held) {
        fx_delay_lock(q->dl, ch->name, &held, FX_DQ_ETCD_MS);
        if (held != c->held)
            FX_INF("channel %s: delayed messages: %s the mover", ch->name,
                   held ? "this bridge is" : "this bridge is no longer");
        c->held = held;
        c->held_lease = held ? fx_delay_lock_lease(q->dl) : 0;
        c->held_ms = now;
    }
    if (!held) {
        fx_delay_entries_free(en, n);
        return false;
    }
    size_t moved_n = move_entries(q, ch, c, en, k);
    *budget -= (int64_t)k;
    fx_delay_entries_free(en, n);
    return more && moved_n == k;
}

/* Counter thread: a count_only of each channel's index every FX_DQ_COUNT_MS, or 20 times as
 * long as its last count took (etcd walks its index: seconds for millions of keys), off the
 * mover's thread so a long count never delays a move. */
static void *counter_main(void *arg)
{
    fx_thread_name("fx-delay-count");
    struct dm_delayq *q = arg;
    fx_daemon *d = q->d;
    char (*names)[128] = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        bool stop = q->mstop;
        pthread_mutex_unlock(&q->mu);
        if (stop) break;
        size_t n = 0;
        pthread_rwlock_rdlock(&d->reg);
        if (d->n_chans > cap) {
            char(*nn)[128] = realloc(names, d->n_chans * sizeof *nn);
            if (nn) {
                names = nn;
                cap = d->n_chans;
            }
        }
        for (size_t i = 0; i < d->n_chans && i < cap; i++)
            if (!d->chans[i]->is_dlq) snprintf(names[n++], sizeof names[0], "%s", d->chans[i]->name);
        pthread_rwlock_unlock(&d->reg);
        for (size_t i = 0; i < n; i++) {
            pthread_mutex_lock(&q->mu);
            dq_chan *c = q->mstop ? NULL : chan_get_locked(q, names[i]);
            int64_t now = fx_now_ms();
            bool due = c && now - c->count_ms >= c->count_every;
            pthread_mutex_unlock(&q->mu);
            if (!due) continue;
            int64_t cnt = 0;
            fx_err e = fx_delay_count(q->dl, names[i], &cnt, FX_DQ_COUNT_ETCD_MS);
            int64_t took = fx_now_ms() - now;
            pthread_mutex_lock(&q->mu);
            c->count_ms = now;
            c->count_every = took * 20 > FX_DQ_COUNT_MS ? took * 20 : FX_DQ_COUNT_MS;
            if (e == FX_OK) {
                c->count = cnt;
                fx_metric_set(c->m_waiting, cnt);
            }
            pthread_mutex_unlock(&q->mu);
        }
        pthread_mutex_lock(&q->mu);
        if (!q->mstop) {
            struct timespec ts = fx_deadline_ts(fx_now_ms() + FX_DQ_POLL_MS);
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        }
        pthread_mutex_unlock(&q->mu);
    }
    free(names);
    return NULL;
}

static void *mover_main(void *arg)
{
    fx_thread_name("fx-delay-move");
    struct dm_delayq *q = arg;
    fx_daemon *d = q->d;
    int64_t budget = FX_DQ_MOVE_RATE / 10, refill_ms = fx_now_ms();
    dm_chan **snap = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        bool stop = q->mstop;
        pthread_mutex_unlock(&q->mu);
        if (stop) break;
        int64_t now = fx_now_ms();
        if (now - refill_ms >= 100) { /* token bucket: FX_DQ_MOVE_RATE per second */
            budget += (now - refill_ms) * FX_DQ_MOVE_RATE / 1000;
            if (budget > FX_DQ_MOVE_RATE / 5) budget = FX_DQ_MOVE_RATE / 5;
            refill_ms = now;
        }
        size_t n = 0;
        pthread_rwlock_rdlock(&d->reg);
        if (d->n_chans > cap) {
            dm_chan **ns = realloc(snap, d->n_chans * sizeof *ns);
            if (ns) {
                snap = ns;
                cap = d->n_chans;
            }
        }
        for (size_t i = 0; i < d->n_chans && i < cap; i++)
            if (!d->chans[i]->is_dlq && !atomic_load(&d->chans[i]->draining))
                snap[n++] = dm_chan_ref(d->chans[i]);
        pthread_rwlock_unlock(&d->reg);
        bool busy = false;
        int64_t wake = fx_now_ms() + FX_DQ_POLL_MS;
        for (size_t i = 0; i < n; i++) {
            pthread_mutex_lock(&q->mu);
            stop = q->mstop;
            pthread_mutex_unlock(&q->mu);
            if (!stop && mover_chan(q, snap[i], &budget, &wake)) busy = true;
            dm_chan_unref(snap[i]);
        }
        if (busy && budget > 0) continue;
        int64_t left = fx_ms_left(wake);
        if (busy && left > 100) left = 100; /* the rate budget refills */
        pthread_mutex_lock(&q->mu);
        if (!q->mstop && left > 0 && !q->kick) {
            struct timespec ts = fx_deadline_ts(fx_now_ms() + left);
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        }
        q->kick = false;
        pthread_mutex_unlock(&q->mu);
    }
    free(snap);
    /* Hand the locks over at once (another bridge moves without waiting for the lease). The
     * table only grows, and `held` is this thread's: the entries up to n_chans are stable. */
    pthread_mutex_lock(&q->mu);
    size_t nc = q->n_chans;
    pthread_mutex_unlock(&q->mu);
    for (size_t i = 0; i < nc; i++)
        if (q->chans[i]->held) fx_delay_unlock(q->dl, q->chans[i]->name, 1000);
    fx_delay_release_lease(q->dl); /* before the MQ client closes (drain) */
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

fx_err dm_delayq_start(fx_daemon *d)
{
    struct dm_delayq *q = calloc(1, sizeof *q);
    if (!q) return fx_seterr(FX_ENOMEM, "delayq: out of memory");
    q->d = d;
    fx_err e = fx_delay_new(d->mq, d->name, FX_DQ_LOCK_TTL_S, &q->dl);
    if (e) {
        free(q);
        return e;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    d->dq = q;
    if (pthread_create(&q->mover, NULL, mover_main, q) != 0)
        return fx_seterr(FX_ENOMEM, "cannot start the delayed-message mover");
    q->mover_started = true;
    if (pthread_create(&q->counter, NULL, counter_main, q) != 0)
        return fx_seterr(FX_ENOMEM, "cannot start the delayed-message counter");
    q->counter_started = true;
    return FX_OK;
}

void dm_delayq_stop(fx_daemon *d)
{
    struct dm_delayq *q = d->dq;
    if (!q || q->stopped) return;
    q->stopped = true;
    pthread_mutex_lock(&q->mu);
    q->mstop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (q->mover_started) pthread_join(q->mover, NULL);
    q->mover_started = false;
    if (q->counter_started) pthread_join(q->counter, NULL);
    q->counter_started = false;
    pthread_mutex_lock(&q->mu);
    q->wstop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (size_t i = 0; i < q->n_writers; i++) pthread_join(q->writers[i], NULL);
    q->n_writers = 0;
}

void dm_delayq_free(fx_daemon *d)
{
    struct dm_delayq *q = d->dq;
    if (!q) return;
    dm_delayq_stop(d);
    dq_w *w = q->head; /* none after stop; kept for a start that failed half way */
    while (w) {
        dq_w *nx = w->next;
        dm_chan_unref(w->ch);
        free(w);
        w = nx;
    }
    for (size_t i = 0; i < q->n_chans; i++) free(q->chans[i]);
    fx_delay_free(q->dl);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
    d->dq = NULL;
}
