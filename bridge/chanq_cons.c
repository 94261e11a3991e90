/* chanq_cons.c -- a channel consumer: its own part (an MPMC consumer), the departed consumers'
 * parts it adopts, their attempt records and writers; blocking work as executor jobs.
 * Contract: chanq_cons.h; jobs and channel entries: chanq_int.h.
 *
 * A "part" below is one sub-MPSC the consumer reads: its own (bound by fx_mpmc_consumer_open,
 * ready) or an adopted one (bound by fx_mpmc_consumer_open_drain, unready, so producers route
 * nothing new to it while it is drained).
 *
 * Lifetime: the consumer is reference counted: the owner holds one reference until
 * fx_chanq_cons_close, every job in flight one. The last reference frees it (after its parts
 * were closed by the jobs that held them), kicking the keeper's view of the channel.
 * Lock order: the MQ's internal locks (a notify hook), then c->mu; then a writer's mu; then the
 * executor's lock. Nothing calls into the MQ with c->mu held.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempts.h"
#include "chanq_cons.h"
#include "chanq_int.h"
#include "fx_log.h"
#include "fx_time.h"

/* ---- attempt-record writers -----------------------------------------------------------------------
 * One writer per part's record: a strand of the executor's write kind (FX_EXEC_K_WRITE) whose
 * step puts the newest record built (records built while a put is in flight are coalesced into
 * the next put), so one part's puts stay in order and a slow part holds one write thread at most.
 * A failed put is retried (newest record) after 200 ms (a timed kick), except a fenced refusal
 * (FX_ELEASE_LOST: the consumer no longer owns the part, so its deliveries must not go out; the
 * consumer finds the lost lease on its next call). */
typedef struct attw {
    fx_exec_strand *strand;
    struct fx_chanq_cons *c;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* durable moved, or the step left (monotonic) */
    uint8_t *val;      /* pending record (gen > 0) */
    size_t len, cap;
    fx_attempts_dest dest;
    uint64_t gen;
    bool pending; /* kicked, or running: a put is still to come */
    bool stop;
    atomic_uint_fast64_t durable;
    fx_log_slot slot;
} attw;

typedef struct stream {
    fx_attempts *att;
    attw *w;
    uint64_t gen; /* last record built */
} stream;

typedef struct part {
    fx_mpmc_consumer *mc;
    int64_t chan;
    stream as;
    int64_t empty_since; /* adopted: 0 while its last get returned messages */
    bool lost;           /* its consumer turned out closed */
    bool fenced;         /* at the last round */
    uint64_t got, gets;  /* messages and get calls (log) */
} part;

enum { ST_IDLE = 0, ST_OPENING, ST_OPEN, ST_DROPPING };

struct fx_chanq_cons {
    fx_chanq_keeper *k;
    fx__chanq_chan *kc;
    fx_chanq_cons_opts o; /* channel and label copied */
    fx_chanq_cons_cb cb;

    pthread_mutex_t mu; /* the fields below up to the owner's */
    int refs;
    bool notify_on;
    bool closing;
    bool open_done;
    fx_err open_err;
    part open_res;
    int64_t open_mpmc;
    part adopt_res[FX_CHANQ_ADOPT_MAX];
    size_t n_adopt_res;
    int64_t adopt_fail[FX_CHANQ_ADOPT_MAX];
    size_t n_adopt_fail;
    bool drop_done;

    /* the owner's thread only */
    int state;
    part own;
    part adopt[FX_CHANQ_ADOPT_MAX];
    size_t n_adopt, rr;
    int64_t adopting[FX_CHANQ_ADOPT_MAX]; /* parts whose adoption job runs */
    size_t n_adopting;
    bool lost;
    int64_t mpmc;
    int64_t next_open_ms, backoff_ms;
    uint64_t view_gen;
    int64_t backlog;
    fx_attempt *attbuf;
    size_t attcap;
    fx_log_slot slot_get, slot_open, slot_ack, slot_att;
};

static void cons_notify(void *arg)
{
    fx_chanq_cons *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->notify_on && c->cb.notify) c->cb.notify(c->cb.arg);
    pthread_mutex_unlock(&c->mu);
}

static void cons_ref(fx_chanq_cons *c)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

static void cons_unref(fx_chanq_cons *c)
{
    pthread_mutex_lock(&c->mu);
    int r = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (r) return;
    fx_chanq_keeper_kick(c->k, c->o.channel); /* its backlog may be adoptable now */
    fx__chanq_chan_put(c->k, c->kc);
    pthread_mutex_destroy(&c->mu);
    free(c->attbuf);
    free((char *)c->o.channel);
    free((char *)c->o.label);
    free(c);
}

static void attw_run(void *arg)
{
    attw *w = arg;
    fx_chanq_cons *c = w->c;
    pthread_mutex_lock(&w->mu);
    if (w->stop || !w->gen) {
        w->pending = false;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    uint64_t g = w->gen;
    size_t len = w->len;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        fx_exec_strand_kick(w->strand, fx_now_ms() + 200);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    memcpy(buf, w->val, len);
    fx_attempts_dest d = w->dest;
    w->gen = 0;
    pthread_mutex_unlock(&w->mu);
    fx_err e = fx_attempts_put(fx__chanq_mq(c->k), &d, buf, len, 5000);
    free(buf);
    if (!e) {
        atomic_store(&w->durable, g);
        cons_notify(c); /* deliveries may go */
    } else {
        fx_log_ratelimited(&w->slot, 5000, FX_LOG_WRN,
                           "consumer %s: delivery attempts not recorded: %s (%s): retrying",
                           c->o.label, fx_strerror(e), fx_err_detail());
    }
    pthread_mutex_lock(&w->mu);
    if (e == FX_ELEASE_LOST) w->gen = 0;      /* fenced: never retried */
    else if (e && !w->gen) w->gen = g;        /* nothing newer: retry this one */
    if (e && fx__chanq_stopping(c->k)) w->gen = 0; /* the keeper stops: no retry */
    bool again = !w->stop && w->gen && !fx_exec_stopping(fx__chanq_exec(c->k));
    if (again) fx_exec_strand_kick(w->strand, e ? fx_now_ms() + 200 : 0);
    else w->pending = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static attw *attw_new(fx_chanq_cons *c)
{
    attw *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    if (fx_exec_strand_new(fx__chanq_exec(c->k), FX_EXEC_K_WRITE, attw_run, w, &w->strand)) {
        free(w);
        return NULL;
    }
    w->c = c;
    pthread_mutex_init(&w->mu, NULL);
    fx_cond_init_monotonic(&w->cv);
    atomic_init(&w->durable, 0);
    return w;
}

static void attw_free(fx_chanq_cons *c, attw *w)
{
    if (!w) return;
    (void)c;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_mutex_unlock(&w->mu);
    fx_exec_strand_free(w->strand); /* drops a pending step, waits for a running one */
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->val);
    free(w);
}

static bool attw_submit(fx_chanq_cons *c, attw *w, fx_attempts *att, const uint8_t *val,
                        size_t len, uint64_t gen)
{
    pthread_mutex_lock(&w->mu);
    if (len > w->cap) {
        uint8_t *nb = realloc(w->val, len);
        if (!nb) {
            pthread_mutex_unlock(&w->mu);
            return false;
        }
        w->val = nb;
        w->cap = len;
    }
    memcpy(w->val, val, len);
    w->len = len;
    fx_attempts_dest_of(att, &w->dest);
    w->gen = gen;
    (void)c;
    if (!w->pending) {
        w->pending = true;
        fx_exec_strand_kick(w->strand, 0);
    }
    pthread_mutex_unlock(&w->mu);
    return true;
}

/* Wait (bounded) until record gen is durable: before a part is let go, so its next consumer
 * reads it. On a slow job (a write step never waits for a slow job). */
static void attw_sync(fx_chanq_cons *c, const part *p, int64_t ms)
{
    attw *w = p->as.w;
    if (!w || !p->as.gen) return;
    int64_t deadline = fx_now_ms() + ms;
    pthread_mutex_lock(&w->mu);
    while (atomic_load(&w->durable) < p->as.gen && w->pending && fx_ms_left(deadline) > 0) {
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    if (atomic_load(&w->durable) < p->as.gen)
        FX_WRN("consumer %s: the last delivery attempts of sub-MPSC %" PRId64
               " were not recorded within %" PRId64 " ms", c->o.label, p->chan, ms);
}

/* ---- closing parts (on slow jobs) --------------------------------------------------------- */

/* drained: its last record and its acks are made durable first. */
static void part_close(fx_chanq_cons *c, part *p, bool drained, bool adopted)
{
    if (!p->mc) return;
    if (drained || !adopted) attw_sync(c, p, FX_CHANQ_SYNC_MS);
    if (drained) {
        fx_err e = fx_mpmc_flush(p->mc, FX_CHANQ_SYNC_MS);
        if (e && e != FX_ECLOSED && e != FX_ELEASE_LOST)
            FX_WRN("consumer %s: sub-MPSC %" PRId64 ": ack flush: %s", c->o.label, p->chan,
                   fx_strerror(e));
    }
    attw_free(c, p->as.w);
    fx_attempts_free(p->as.att);
    fx_mpmc_consumer_set_notify(p->mc, NULL, NULL);
    fx_mpmc_consumer_close(p->mc);
    fx_mpmc_consumer_free(p->mc);
    if (adopted)
        FX_INF("consumer %s: %s adopted sub-MPSC %" PRId64 " (%" PRIu64 " message(s) in %" PRIu64
               " fetches)", c->o.label, drained ? "drained" : "lost", p->chan, p->got, p->gets);
    memset(p, 0, sizeof *p);
}

typedef struct close_job {
    fx__chanq_job job; /* first */
    fx_chanq_cons *c;
    part own;       /* mc NULL: none */
    bool own_lost;  /* no ack flush (its consumer is gone) */
    bool drop;      /* a lost consumer: parts released, the owner reopens after */
    part adopt[FX_CHANQ_ADOPT_MAX];
    bool adopt_drained[FX_CHANQ_ADOPT_MAX];
    size_t n_adopt;
} close_job;

static void close_run(fx__chanq_job *j)
{
    close_job *cj = (close_job *)j;
    fx_chanq_cons *c = cj->c;
    for (size_t i = 0; i < cj->n_adopt; i++)
        part_close(c, &cj->adopt[i], cj->adopt_drained[i], true);
    if (cj->own.mc) {
        if (!cj->own_lost) part_close(c, &cj->own, true, false);
        else part_close(c, &cj->own, false, false);
    }
    if (cj->drop) {
        pthread_mutex_lock(&c->mu);
        c->drop_done = true;
        pthread_mutex_unlock(&c->mu);
        cons_notify(c);
    }
    free(cj);
    cons_unref(c);
}

static bool post_close(fx_chanq_cons *c, close_job *cj)
{
    cj->job.fn = close_run;
    cj->c = c;
    cons_ref(c);
    if (fx__chanq_post(c->k, &cj->job)) return true;
    close_run(&cj->job); /* refused by the executor: here (bounded) */
    return true;
}

/* ---- open and adoption (slow jobs) ---------------------------------------------------------------- */

typedef struct open_job {
    fx__chanq_job job; /* first */
    fx_chanq_cons *c;
    int64_t chan; /* adoption: the part; -1: the own open */
    int64_t mpmc;
} open_job;

/* Read the attempt record of p and start its writer. */
static fx_err part_attempts(fx_chanq_cons *c, part *p)
{
    if (!c->o.attempts) return FX_OK;
    fx_err e = fx_attempts_open(fx__chanq_mq(c->k), p->chan, p->mc, 5000, &p->as.att);
    if (!e && !(p->as.w = attw_new(c))) e = fx_seterr(FX_ENOMEM, "cannot start an attempt writer");
    return e;
}

static void open_run(fx__chanq_job *j)
{
    open_job *oj = (open_job *)j;
    fx_chanq_cons *c = oj->c;
    fx_mq_client *mq = fx__chanq_mq(c->k);
    part p = {.chan = oj->chan};
    int64_t mpmc = oj->mpmc;
    fx_err e;
    if (oj->chan < 0) {
        e = fx__chanq_resolve(c->k, c->kc, &c->o.cfg, &mpmc);
        if (!e) e = fx_mpmc_consumer_open(mq, mpmc, &p.mc);
        if (!e) p.chan = fx_mpmc_consumer_chan(p.mc);
    } else {
        e = fx_mpmc_consumer_open_drain(mq, mpmc, oj->chan, &p.mc);
    }
    if (!e) {
        e = part_attempts(c, &p);
        if (e) {
            fx_log_ratelimited(&c->slot_att, 5000, FX_LOG_WRN,
                               "consumer %s: cannot read the delivery attempts of sub-MPSC %" PRId64
                               ": %s (%s)", c->o.label, p.chan, fx_strerror(e), fx_err_detail());
            part_close(c, &p, false, false);
        }
    }
    char detail[256];
    snprintf(detail, sizeof detail, "%s", e ? fx_err_detail() : "");
    if (!e) fx_mpmc_consumer_set_notify(p.mc, cons_notify, c);
    pthread_mutex_lock(&c->mu);
    bool closing = c->closing;
    if (!closing) {
        if (oj->chan < 0) {
            c->open_done = true;
            c->open_err = e;
            c->open_res = p;
            c->open_mpmc = mpmc;
        } else if (!e) {
            c->adopt_res[c->n_adopt_res++] = p;
        } else {
            c->adopt_fail[c->n_adopt_fail++] = oj->chan;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (closing && !e) part_close(c, &p, false, oj->chan >= 0);
    if (e && oj->chan < 0)
        fx_log_ratelimited(&c->slot_open, 5000, FX_LOG_WRN,
                           "consumer %s: cannot open: %s (%s)", c->o.label, fx_strerror(e),
                           detail);
    else if (e && e != FX_EEXISTS && e != FX_ENOTFOUND)
        fx_log_ratelimited(&c->slot_open, 5000, FX_LOG_WRN,
                           "consumer %s: cannot adopt sub-MPSC %" PRId64 ": %s (%s)", c->o.label,
                           oj->chan, fx_strerror(e), detail);
    else if (!e && oj->chan >= 0)
        FX_INF("consumer %s: adopted sub-MPSC %" PRId64 " with stranded backlog", c->o.label,
               oj->chan);
    cons_notify(c);
    free(oj);
    cons_unref(c);
}

static bool post_open(fx_chanq_cons *c, int64_t chan, int64_t mpmc)
{
    open_job *oj = calloc(1, sizeof *oj);
    if (!oj) return false;
    oj->job.fn = open_run;
    oj->c = c;
    oj->chan = chan;
    oj->mpmc = mpmc;
    cons_ref(c);
    if (fx__chanq_post(c->k, &oj->job)) return true;
    free(oj);
    cons_unref(c);
    return false;
}

/* ---- API ------------------------------------------------------------------------------------------- */

fx_err fx_chanq_cons_new(fx_chanq_keeper *k, const fx_chanq_cons_opts *o,
                         const fx_chanq_cons_cb *cb, fx_chanq_cons **out)
{
    *out = NULL;
    fx_chanq_cons *c = calloc(1, sizeof *c);
    if (!c) return fx_seterr(FX_ENOMEM, "consumer");
    c->k = k;
    c->o = *o;
    c->cb = *cb;
    c->o.channel = strdup(o->channel);
    c->o.label = strdup(o->label ? o->label : o->channel);
    c->kc = c->o.channel ? fx__chanq_chan_get(k, c->o.channel) : NULL;
    if (!c->o.channel || !c->o.label || !c->kc) {
        if (c->kc) fx__chanq_chan_put(k, c->kc);
        free((char *)c->o.channel);
        free((char *)c->o.label);
        free(c);
        return fx_seterr(FX_ENOMEM, "consumer");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->refs = 1;
    c->notify_on = true;
    c->mpmc = -1;
    c->backlog = -1;
    *out = c;
    return FX_OK;
}

static void remove_adopting(fx_chanq_cons *c, int64_t chan)
{
    for (size_t i = 0; i < c->n_adopting; i++)
        if (c->adopting[i] == chan) {
            c->adopting[i] = c->adopting[--c->n_adopting];
            return;
        }
}

/* Let adopted part i go (drained: last record and acks first; else lost). */
static void adopt_let_go(fx_chanq_cons *c, size_t i, bool drained)
{
    close_job *cj = calloc(1, sizeof *cj);
    part p = c->adopt[i];
    c->adopt[i] = c->adopt[--c->n_adopt];
    if (!cj) { /* out of memory: close here (rare) */
        part_close(c, &p, drained, true);
        return;
    }
    cj->adopt[0] = p;
    cj->adopt_drained[0] = drained;
    cj->n_adopt = 1;
    post_close(c, cj);
}

int64_t fx_chanq_cons_poll(fx_chanq_cons *c)
{
    part res[FX_CHANQ_ADOPT_MAX];
    int64_t fail[FX_CHANQ_ADOPT_MAX];
    pthread_mutex_lock(&c->mu);
    bool open_done = c->open_done, drop_done = c->drop_done;
    fx_err open_err = c->open_err;
    part open_res = c->open_res;
    int64_t open_mpmc = c->open_mpmc;
    c->open_done = c->drop_done = false;
    size_t nr = c->n_adopt_res, nf = c->n_adopt_fail;
    memcpy(res, c->adopt_res, nr * sizeof *res);
    memcpy(fail, c->adopt_fail, nf * sizeof *fail);
    c->n_adopt_res = c->n_adopt_fail = 0;
    pthread_mutex_unlock(&c->mu);

    int64_t now = fx_now_ms();
    if (open_done) {
        if (!open_err) {
            c->own = open_res;
            c->mpmc = open_mpmc;
            c->state = ST_OPEN;
            c->backoff_ms = 0;
            c->view_gen = 0;
            FX_INF("consumer %s: open (MPMC %" PRId64 ", sub-MPSC %" PRId64 ", member %" PRId64 ")",
                   c->o.label, c->mpmc, c->own.chan, fx_mpmc_consumer_member(c->own.mc));
        } else {
            if (open_err != FX_EEXISTS) fx__chanq_forget(c->kc);
            c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : 200;
            if (c->backoff_ms > 5000) c->backoff_ms = 5000;
            c->next_open_ms = now + c->backoff_ms;
            c->state = ST_IDLE;
        }
    }
    for (size_t i = 0; i < nf; i++) remove_adopting(c, fail[i]);
    for (size_t i = 0; i < nr; i++) {
        remove_adopting(c, res[i].chan);
        if (c->state == ST_OPEN && c->n_adopt < FX_CHANQ_ADOPT_MAX) {
            c->adopt[c->n_adopt++] = res[i];
        } else { /* lost meanwhile: let it go again */
            close_job *cj = calloc(1, sizeof *cj);
            if (cj) {
                cj->adopt[0] = res[i];
                cj->n_adopt = 1;
                post_close(c, cj);
            } else {
                part_close(c, &res[i], false, true);
            }
        }
    }
    if (drop_done) {
        c->state = ST_IDLE;
        c->next_open_ms = now;
    }
    if (c->state == ST_OPEN && c->lost) { /* own consumer lost: everything goes, then reopen */
        if (c->cb.release) c->cb.release(c->cb.arg, FX_CHANQ_ALL);
        close_job *cj = calloc(1, sizeof *cj);
        if (cj) {
            cj->own = c->own;
            cj->own_lost = true;
            cj->drop = true;
            memcpy(cj->adopt, c->adopt, c->n_adopt * sizeof *cj->adopt);
            cj->n_adopt = c->n_adopt;
            post_close(c, cj);
            c->state = ST_DROPPING;
        } else {
            for (size_t i = 0; i < c->n_adopt; i++) part_close(c, &c->adopt[i], false, true);
            part_close(c, &c->own, false, false);
            c->state = ST_IDLE;
            c->next_open_ms = now;
        }
        memset(&c->own, 0, sizeof c->own);
        c->n_adopt = 0;
        c->lost = false;
        return 50;
    }
    if (c->state == ST_OPEN) {
        for (size_t i = c->n_adopt; i-- > 0;) {
            part *a = &c->adopt[i];
            if (a->lost) {
                if (c->cb.release) c->cb.release(c->cb.arg, a->chan);
                adopt_let_go(c, i, false);
            } else if (a->empty_since && now - a->empty_since >= FX_CHANQ_ADOPT_IDLE_MS &&
                       (!c->cb.held || c->cb.held(c->cb.arg, a->chan) == 0)) {
                adopt_let_go(c, i, true);
            }
        }
        return -1;
    }
    if (c->state == ST_IDLE) {
        if (now < c->next_open_ms) return c->next_open_ms - now;
        if (post_open(c, -1, -1)) c->state = ST_OPENING;
        else return 200;
    }
    return 200;
}

static bool is_adopted(const fx_chanq_cons *c, int64_t chan)
{
    for (size_t i = 0; i < c->n_adopt; i++)
        if (c->adopt[i].chan == chan) return true;
    for (size_t i = 0; i < c->n_adopting; i++)
        if (c->adopting[i] == chan) return true;
    return false;
}

void fx_chanq_cons_inherit(fx_chanq_cons *c)
{
    if (c->state != ST_OPEN || c->lost) return;
    int64_t stranded[FX_CHANQ_STRANDED_MAX];
    size_t ns;
    uint64_t gen;
    pthread_mutex_lock(&c->kc->mu);
    gen = c->kc->view_gen;
    ns = c->kc->n_stranded;
    memcpy(stranded, c->kc->stranded, ns * sizeof *stranded);
    pthread_mutex_unlock(&c->kc->mu);
    if (!ns || gen == c->view_gen || c->n_adopt + c->n_adopting >= FX_CHANQ_ADOPT_MAX) return;
    c->view_gen = gen;
    for (size_t i = 0; i < ns && c->n_adopt + c->n_adopting < FX_CHANQ_ADOPT_MAX; i++) {
        if (stranded[i] == c->own.chan || is_adopted(c, stranded[i])) continue;
        if (!post_open(c, stranded[i], c->mpmc)) return;
        c->adopting[c->n_adopting++] = stranded[i];
    }
}

size_t fx_chanq_cons_inherited(const fx_chanq_cons *c) { return c->n_adopt + c->n_adopting; }

static void take_counts(part *p, const fx_mq_delivery *out, uint64_t *counts, size_t got)
{
    for (size_t i = 0; i < got; i++)
        counts[i] = p->as.att ? fx_attempts_take(p->as.att, out[i].id.pidx, out[i].id.msg) : 0;
}

fx_err fx_chanq_cons_get(fx_chanq_cons *c, fx_mq_delivery *out, uint64_t *counts, size_t max,
                         size_t *n)
{
    *n = 0;
    if (c->state != ST_OPEN) return FX_EUNAVAIL;
    if (c->lost) return FX_ECLOSED;
    int64_t now = fx_now_ms();
    for (size_t k = 0; k < c->n_adopt; k++) {
        size_t i = (c->rr + k) % c->n_adopt;
        part *a = &c->adopt[i];
        if (a->lost) continue;
        size_t got = 0;
        fx_err e = fx_mpmc_get(a->mc, out, max, &got, 0);
        a->gets++;
        a->got += got;
        if (e == FX_OK && got) {
            a->empty_since = 0;
            c->rr = i + 1;
            take_counts(a, out, counts, got);
            *n = got;
            return FX_OK;
        }
        if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
            a->lost = true;
            continue;
        }
        if (e != FX_ETIMEDOUT && e != FX_OK) {
            fx_log_ratelimited(&c->slot_get, 5000, FX_LOG_WRN,
                               "consumer %s: get (adopted) failed: %s (%s)", c->o.label,
                               fx_strerror(e), fx_err_detail());
            continue;
        }
        if (!a->empty_since) a->empty_since = now;
    }
    size_t got = 0;
    fx_err e = fx_mpmc_get(c->own.mc, out, max, &got, 0);
    if (e == FX_OK && got) {
        take_counts(&c->own, out, counts, got);
        *n = got;
        return FX_OK;
    }
    if (e == FX_OK) return FX_ETIMEDOUT;
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) c->lost = true;
    return e;
}

/* Ack ids [0, n) through part p. */
static bool ack_part(fx_chanq_cons *c, part *p, const fx_mq_msg_id *ids, size_t n, bool *lost)
{
    fx_err e = fx_mpmc_ack(p->mc, ids, n);
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
        *lost = true;
        FX_WRN("consumer %s: consumer of sub-MPSC %" PRId64 " closed (%s): %zu acks lost",
               c->o.label, p->chan, fx_strerror(e), n);
    } else if (e) {
        fx_log_ratelimited(&c->slot_ack, 5000, FX_LOG_ERR, "consumer %s: ack of %zu failed: %s (%s)",
                           c->o.label, n, fx_strerror(e), fx_err_detail());
    }
    return !e;
}

bool fx_chanq_cons_ack(fx_chanq_cons *c, fx_mq_msg_id *ids, size_t n)
{
    bool ok = n > 0;
    for (size_t a = c->n_adopt; a-- > 0 && n;) {
        size_t j = n; /* move this part's acks to [j, n) */
        for (size_t i = 0; i < j;) {
            if (ids[i].chan == c->adopt[a].chan) {
                fx_mq_msg_id t = ids[i];
                ids[i] = ids[--j];
                ids[j] = t;
            } else {
                i++;
            }
        }
        if (n > j && !ack_part(c, &c->adopt[a], ids + j, n - j, &c->adopt[a].lost)) ok = false;
        n = j;
    }
    if (n) {
        if (c->state != ST_OPEN || c->lost) ok = false;
        else if (!ack_part(c, &c->own, ids, n, &c->lost)) ok = false;
    }
    return ok;
}

bool fx_chanq_cons_lost(const fx_chanq_cons *c) { return c->lost; }

static part *part_of(fx_chanq_cons *c, int64_t chan)
{
    if (c->state == ST_OPEN && c->own.chan == chan && c->own.mc) return &c->own;
    for (size_t i = 0; i < c->n_adopt; i++)
        if (c->adopt[i].chan == chan) return &c->adopt[i];
    return NULL;
}

static void count_part(fx_chanq_cons *c, part *p, fx_chanq_attempt *items, size_t n)
{
    if (!p->as.att || !p->as.w) return;
    /* A record is the producers' high marks plus the exceptions (attempts.h): an item counted
     * once only raises its producer's mark, so of those only the highest per producer is
     * passed (the record built is the same); unpublished and redelivered items all are. Past
     * ATT_PRODS producers in one part the rest are passed as they are. */
    enum { ATT_PRODS = 16 };
    int64_t pp[ATT_PRODS];
    size_t pk[ATT_PRODS], npp = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].id.chan != p->chan) continue;
        fx_attempt x = {items[i].id.pidx, items[i].id.msg, items[i].count};
        if (x.n == 1) {
            size_t j = 0;
            while (j < npp && pp[j] != x.pidx) j++;
            if (j < npp) {
                if (x.msg > c->attbuf[pk[j]].msg) c->attbuf[pk[j]] = x;
                continue;
            }
            if (npp < ATT_PRODS) {
                pp[npp] = x.pidx;
                pk[npp++] = k;
            }
        }
        c->attbuf[k++] = x;
    }
    const uint8_t *val = NULL;
    size_t len = 0;
    if (fx_attempts_build(p->as.att, c->attbuf, k, &val, &len) &&
        attw_submit(c, p->as.w, p->as.att, val, len, p->as.gen + 1))
        p->as.gen++;
    for (size_t i = 0; i < n; i++)
        if (items[i].id.chan == p->chan) items[i].gen = p->as.gen;
}

void fx_chanq_cons_count(fx_chanq_cons *c, fx_chanq_attempt *items, size_t n)
{
    if (!c->o.attempts || c->state != ST_OPEN) return;
    if (n > c->attcap) {
        fx_attempt *nb = realloc(c->attbuf, n * sizeof *nb);
        if (!nb) return; /* not recorded: those deliveries wait (durable stays false) */
        c->attbuf = nb;
        c->attcap = n;
    }
    count_part(c, &c->own, items, n);
    for (size_t a = 0; a < c->n_adopt; a++) count_part(c, &c->adopt[a], items, n);
}

bool fx_chanq_cons_durable(const fx_chanq_cons *c, fx_mq_msg_id id, uint64_t gen)
{
    const part *p = part_of((fx_chanq_cons *)c, id.chan);
    if (!p || !p->as.att || !p->as.w) return true;
    return gen <= atomic_load(&p->as.w->durable);
}

void fx_chanq_cons_round(fx_chanq_cons *c)
{
    if (c->state != ST_OPEN) return;
    c->backlog = -1;
    pthread_mutex_lock(&c->kc->mu);
    for (size_t i = 0; i < c->kc->n_held; i++)
        if (c->kc->held[i] == c->own.chan) c->backlog = c->kc->held_backlog[i];
    pthread_mutex_unlock(&c->kc->mu);
    c->own.fenced = fx_mpmc_consumer_fenced(c->own.mc);
    for (size_t a = 0; a < c->n_adopt; a++) c->adopt[a].fenced = fx_mpmc_consumer_fenced(c->adopt[a].mc);
}

bool fx_chanq_cons_fenced(const fx_chanq_cons *c, fx_mq_msg_id id)
{
    const part *p = part_of((fx_chanq_cons *)c, id.chan);
    return p && p->fenced;
}

int64_t fx_chanq_cons_pending(const fx_chanq_cons *c) { return c->backlog; }

void fx_chanq_cons_ids(const fx_chanq_cons *c, int64_t *mpmc, int64_t *chan, int64_t *member)
{
    bool open = c->state == ST_OPEN && c->own.mc;
    if (mpmc) *mpmc = open ? c->mpmc : -1;
    if (chan) *chan = open ? c->own.chan : -1;
    if (member) *member = open ? fx_mpmc_consumer_member(c->own.mc) : -1;
}

void fx_chanq_cons_close(fx_chanq_cons *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->notify_on = false;
    c->closing = true; /* jobs in flight close what they open */
    pthread_mutex_unlock(&c->mu);
    /* results that came in since the last poll */
    pthread_mutex_lock(&c->mu);
    if (c->open_done && !c->open_err) {
        c->own = c->open_res;
        c->state = ST_OPEN;
        c->lost = false;
    }
    c->open_done = false;
    for (size_t i = 0; i < c->n_adopt_res; i++)
        if (c->n_adopt < FX_CHANQ_ADOPT_MAX) c->adopt[c->n_adopt++] = c->adopt_res[i];
    c->n_adopt_res = 0;
    pthread_mutex_unlock(&c->mu);
    close_job *cj = calloc(1, sizeof *cj);
    if (cj) {
        if (c->state == ST_OPEN) {
            cj->own = c->own;
            cj->own_lost = c->lost;
        }
        for (size_t i = 0; i < c->n_adopt; i++) {
            cj->adopt[i] = c->adopt[i];
            cj->adopt_drained[i] = !c->adopt[i].lost;
        }
        cj->n_adopt = c->n_adopt;
        post_close(c, cj);
    } else {
        for (size_t i = 0; i < c->n_adopt; i++)
            part_close(c, &c->adopt[i], !c->adopt[i].lost, true);
        if (c->state == ST_OPEN) part_close(c, &c->own, !c->lost, false);
    }
    c->n_adopt = 0;
    memset(&c->own, 0, sizeof c->own);
    cons_unref(c);
}
