/* claim.c -- interest polling, consumer claims (run by a pool of workers), delivery, acks,
 * redelivery and dead letters. Contract: daemon_int.h.
 *
 * Claims have no thread of their own (issue 13): FX_DM_CLAIM_WORKERS scheduler threads run each
 * claim in steps (claim_step: one turn of what used to be the claim thread's loop, never waiting
 * except in the bounded release), one worker at a time per claim, so "the claim thread" below
 * means "the claim's steps". A step is due when the claim is kicked (ack or no-responders event,
 * dead-letter completion, stop, durable attempt record) or when the wait it asked for is over.
 *
 * A claim owns its fx_mpmc_consumer and an in-flight table of at most max_ack_pending
 * entries (each a message handed out by fx_mpmc_get and not yet committed). Entry states:
 *   WAIT_SEND  due for (re)publication at `due` (new, NAKed, expired, publish failed)
 *   WAIT_ACK   published; `due` is the ack deadline (explicit) or the no-responders grace (none)
 *   WAIT_DLQ   dead letter queued to the <name>-dlq producer; waiting for its completion
 *   DLQ_RETRY  dead letter could not be queued/stored; retried at `due`
 * Every state change happens on the claim thread. Acks reach it through its bounded event queue;
 * an ack matches an entry by (claim seq, nonce) from the reply subject, so stale acks (of an
 * earlier attempt) are ignored.
 *
 * Interest: while the last interest poll did not see the claim's subject, the claim publishes
 * nothing (no new deliveries, no redeliveries); after release_after it is released. Every
 * delivery has a reply subject (the ack subject, FX_DM_ACK_PREFIX, or with ack none
 * "_FLUXON.NR.<bridge>.<channel>.<claim>.<claim seq>.<nonce>"), so a delivery over the client
 * connection that found no subscriber comes back as a no-responders 503 and releases the claim at
 * once (the message stays unacked for the next consumer; its delivery count is not changed).
 *
 * Control messages are trusted only when the bridge caused them (deploy/README.md "Securing a deployment"): an ack or a
 * no-responders status changes state only when its (claim seq, nonce) is the one of a delivery in
 * flight; a no-responders status only for a delivery made over the client connection (the leaf
 * path never asks for one). A claim seq never issued, a nonce that does not match, a status on
 * the leaf path or for an entry not waiting for its ack: counted (fluxon_invalid_control_total),
 * rate-logged, ignored. An ack for a claim seq issued earlier and no longer in flight is stale.
 *
 * Leaf path (nats.leaf_url set, ack explicit): deliveries are published over the leafnode
 * connection (leaf.h) with the exact "$JS.ACK.FLUXON...." reply, which a client connection may
 * not use. The header block is the same (built on a natsMsg, then serialised). A leaf connection
 * gets no no-responders status: a delivery to a subscriber that just left is lost until ack_wait
 * redelivers it, and the claim relies on interest polling alone. While the leaf connection is
 * down, or its write buffer is full, deliveries wait (retried like a failed publish).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attempts.h"
#include "claim_table.h"
#include "daemon_int.h"
#include "flatdict.h"
#include "fx_time.h"
#include "interest.h"
#include "jsack.h"
#include "subject.h"

#define NIL CTAB_NIL

typedef ctab_ent ent; /* an in-flight entry (claim_table.h) */

/* The persisted attempt record of one sub-MPSC the claim consumes (explicit ack): the record,
 * its writer thread and the generation of the last record built. */
typedef struct att_stream {
    fx_attempts *att;
    struct attw *w;
    uint64_t att_gen;
} att_stream;

typedef struct cst {
    dm_claim *cl;
    dm_chan *ch;
    fx_daemon *d;
    fx_mpmc_consumer *cons;
    /* Drain consumers bound to stranded sub-MPSCs (left by a released claim or a dead bridge),
     * drained next to `cons` until each stays empty, then closed (adopt_stranded). Each has its
     * own attempt record (explicit ack). */
    struct adopted {
        fx_mpmc_consumer *c;
        int64_t chan;
        int64_t empty_since; /* 0: its last get returned messages */
        uint64_t got, gets;  /* messages and get calls (log) */
        att_stream as;
    } adopt[FX_DM_ADOPT_MAX];
    size_t n_adopt;
    size_t adopt_rr; /* next slot fetch_adopted tries first */
    att_stream own;   /* explicit ack: persisted attempts of the sub-MPSC of cons */
    fx_attempt *attbuf;
    bool explicit_ack;
    bool use_leaf; /* explicit ack and d->leaf: deliveries over the leaf connection */
    ctab t; /* the in-flight table */
    uint32_t *sendq;
    uint32_t n_send;
    uint64_t next_cseq;
    fx_mq_msg_id *acks;
    size_t n_acks;
    dm_ackreply **replies; /* AckSync replies of the acks in `acks`, answered after flush_acks */
    size_t n_replies;
    size_t dlq_pending;
    fx_mq_delivery *getbuf;
    char *hbuf; /* delivery header block (leaf path), reused */
    size_t hcap;
    int64_t open_backoff_ms;
    uint64_t view_gen; /* last sub-MPSC view acted on (adopt_stranded) */
    int64_t backlog;   /* stored messages of our sub-MPSC at the last view (-1: unknown) */
    bool lost; /* consumer closed under us */
    fx_log_slot slot_get, slot_pub, slot_open, slot_ack, slot_att;
} cst;

/* ---- in-flight table (claim_table.h) --------------------------------------------------------- */

/* Grow hook of the table: the arrays holding up to one item per in-flight entry follow its size. */
static bool table_grow(void *arg, uint32_t nn)
{
    cst *s = arg;
    uint32_t *ns = realloc(s->sendq, nn * sizeof *ns);
    if (!ns) return false;
    s->sendq = ns;
    fx_mq_msg_id *na = realloc(s->acks, nn * sizeof *na);
    if (!na) return false;
    s->acks = na;
    dm_ackreply **nr = realloc(s->replies, nn * sizeof *nr);
    if (!nr) return false;
    s->replies = nr;
    fx_attempt *nab = realloc(s->attbuf, nn * sizeof *nab);
    if (!nab) return false;
    s->attbuf = nab;
    return true;
}

static bool table_init(cst *s)
{
    s->getbuf = calloc(FX_DM_FETCH_MAX, sizeof *s->getbuf);
    return ctab_init(&s->t, s->ch->s.max_ack_pending, table_grow, s) && s->getbuf;
}

static void release_all(cst *s)
{
    ctab_release_all(&s->t);
    s->n_send = 0;
}

static void ack_add(cst *s, const fx_mq_msg_id *id) { s->acks[s->n_acks++] = *id; }

/* ---- AckSync replies ------------------------------------------------------------------------- */

static dm_ackreply *ackreply_new(const char *subject)
{
    size_t l = strlen(subject);
    dm_ackreply *r = malloc(sizeof *r + l + 1);
    if (!r) return NULL;
    atomic_init(&r->refs, 1);
    atomic_init(&r->answered, false);
    memcpy(r->subject, subject, l + 1);
    return r;
}

/* Drop one reference. ok: the ack was applied: answer with an empty message (the first answer
 * wins). The last reference of an unanswered reply sends the error reply; d NULL: no publish
 * (the daemon is being torn down). */
static void ackreply_done(fx_daemon *d, dm_ackreply *r, bool ok)
{
    if (!r) return;
    if (ok && d && d->nc && !atomic_exchange(&r->answered, true))
        natsConnection_Publish(d->nc, r->subject, NULL, 0);
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    if (!atomic_load(&r->answered) && d && d->nc) {
        char buf[256];
        int n = fx_puback_err(409, "ack not applied: the delivery is no longer pending "
                                   "(already acknowledged, redelivered or released)",
                              buf, sizeof buf);
        if (n > 0) natsConnection_Publish(d->nc, r->subject, buf, n);
    }
    free(r);
}

static void replies_done(cst *s, bool ok)
{
    for (size_t i = 0; i < s->n_replies; i++) ackreply_done(s->d, s->replies[i], ok);
    s->n_replies = 0;
}

/* ---- consumer ---------------------------------------------------------------------------------- */

static bool stop_requested(cst *s)
{
    return atomic_load(&s->cl->stop) != STOP_NONE || atomic_load(&s->cl->noresp);
}


static void set_holding(cst *s, bool h);
static void sched_kick(dm_claim *cl);
static void adopt_close(cst *s, size_t i, bool lost);
static void attw_sync(cst *s, att_stream *st, int64_t ms);

static void consumer_drop(cst *s)
{
    attw_sync(s, &s->own, 2000);
    while (s->n_adopt) adopt_close(s, s->n_adopt - 1, true);
    release_all(s);
    s->n_acks = 0;
    replies_done(s, false);
    fx_attempts_free(s->own.att);
    s->own.att = NULL;
    if (s->cons) {
        set_holding(s, false);
        fx_mpmc_consumer_set_notify(s->cons, NULL, NULL);
        fx_mpmc_consumer_close(s->cons);
        fx_mpmc_consumer_free(s->cons);
        s->cons = NULL;
    }
    s->lost = false;
}

/* Consumer opens running at once (FX_DM_OPEN_MAX per process, fewer than the workers, so the
 * steps of open claims keep running while a burst of names opens): an open blocks its worker for
 * its etcd round trips. The sub-MPSC creations of concurrent opens run in parallel; only their
 * short publish step is taken in turn (mpmc.c). A claim that finds no free slot tries again after
 * FX_DM_OPEN_POLL_MS. */
static atomic_int open_running;

static bool open_slot_try(void)
{
    int cur = atomic_load(&open_running);
    while (cur < FX_DM_OPEN_MAX)
        if (atomic_compare_exchange_weak(&open_running, &cur, cur + 1)) return true;
    return false;
}

/* New messages for one of the claim's consumers (the client's watch thread): its next step now. */
static void claim_notify(void *arg) { sched_kick(arg); }

/* One attempt to open the claim's consumer: -1 when open, else the ms to wait before the next. */
static int64_t open_once(cst *s)
{
    if (!open_slot_try()) return FX_DM_OPEN_POLL_MS;
    int64_t id = -1;
    fx_err e = dm_chan_resolve(s->ch, false, &id);
    if (!e) e = fx_mpmc_consumer_open(s->d->mq, id, &s->cons);
    atomic_fetch_sub(&open_running, 1);
    if (!e) {
        s->open_backoff_ms = 0;
        fx_mpmc_consumer_set_notify(s->cons, claim_notify, s->cl);
        set_holding(s, true);
        FX_INF("claim %s: consumer open (MPMC %" PRId64 ", sub-MPSC %" PRId64 ", member %" PRId64
               ")",
               s->cl->subject, id, fx_mpmc_consumer_chan(s->cons), fx_mpmc_consumer_member(s->cons));
        return -1;
    }
    s->cons = NULL;
    if (e != FX_EEXISTS) dm_chan_forget_mpmc(s->ch);
    fx_log_ratelimited(&s->slot_open, 5000, FX_LOG_WRN, "claim %s: cannot open consumer: %s (%s)",
                       s->cl->subject, fx_strerror(e), fx_err_detail());
    s->open_backoff_ms = s->open_backoff_ms ? s->open_backoff_ms * 2 : 200;
    if (s->open_backoff_ms > 5000) s->open_backoff_ms = 5000;
    return s->open_backoff_ms;
}

/* ---- persisted attempts (bridge/attempts.h) -------------------------------------------------- */

/* Read the attempt record of the claimed sub-MPSC. With explicit acks nothing is fetched until
 * it is read (a message's attempts must be known before it is delivered again). */
static bool attempts_ready(cst *s)
{
    if (!s->explicit_ack || s->own.att) return true;
    if (!s->cons) return false;
    fx_err e = fx_attempts_open(s->d->mq, fx_mpmc_consumer_chan(s->cons), s->cons, 5000,
                                &s->own.att);
    if (e) {
        s->own.att = NULL;
        fx_log_ratelimited(&s->slot_att, 5000, FX_LOG_WRN,
                           "claim %s: cannot read the delivery attempts of sub-MPSC %" PRId64
                           ": %s (%s): retrying",
                           s->cl->subject, fx_mpmc_consumer_chan(s->cons), fx_strerror(e),
                           fx_err_detail());
        return false;
    }
    return true;
}

/* The record writers: a pool of FX_DM_ATTW_THREADS threads per process (issue 13: it was one
 * thread per claim and per adopted sub-MPSC) puts the newest record built by each claim (rounds
 * built while a put is in flight are coalesced into the next put). Each attw is one record stream
 * (a sub-MPSC's record); it is queued in the pool while it has a record to put and no pool thread
 * is putting it, so one stream's puts stay in order and a slow stream holds one pool thread at
 * most. A delivery waits until the record that holds its attempt count is durable (`durable` >=
 * the entry's rec_gen), so a crash can never forget an attempt that a subscriber may have seen;
 * meanwhile the claim thread keeps fetching and handling acks. A failed put is retried (newest
 * record) after 200 ms (the stream goes back to the tail of the queue with a not-before time),
 * except a fenced refusal (FX_ELEASE_LOST: the claim's consumer no longer owns the sub-MPSC, so
 * its deliveries must not go out; the claim finds the lost lease on its next call).
 * The pool's threads start with the first stream and stop with the last one. */
typedef struct attw {
    /* under pool.mu */
    bool queued, busy, stop;
    int64_t not_before;
    struct attw *qnext;
    uint8_t *val; /* pending record (gen > 0) */
    size_t len, cap;
    fx_attempts_dest dest; /* key, lease and the writer's fence */
    uint64_t gen;
    atomic_uint_fast64_t durable;
    dm_claim *cl;
    fx_mq_client *mq;
    fx_log_slot slot;
} attw;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* pool threads (monotonic) */
    pthread_cond_t done_cv; /* attw_stop waiting for a busy stream (monotonic) */
    bool init;
    uint64_t gen;           /* bumped when the pool stops: threads of older generations exit */
    size_t users;           /* streams alive */
    attw *head, *tail;
    pthread_t thr[FX_DM_ATTW_THREADS];
    size_t n_thr;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void pool_push_locked(attw *w)
{
    w->queued = true;
    w->qnext = NULL;
    if (pool.tail) pool.tail->qnext = w;
    else pool.head = w;
    pool.tail = w;
    pthread_cond_signal(&pool.cv);
}

/* The first queued stream whose not-before time has come (unlinked), or NULL and *until: the
 * earliest not-before time of the queue. */
static attw *pool_pop_ready_locked(int64_t *until)
{
    int64_t now = fx_now_ms();
    *until = now + 1000;
    attw *prev = NULL;
    for (attw *w = pool.head; w; prev = w, w = w->qnext) {
        if (w->not_before <= now) {
            if (prev) prev->qnext = w->qnext;
            else pool.head = w->qnext;
            if (pool.tail == w) pool.tail = prev;
            w->queued = false;
            return w;
        }
        if (w->not_before < *until) *until = w->not_before;
    }
    return NULL;
}

static void *attw_main(void *arg)
{
    uint64_t my = (uint64_t)(uintptr_t)arg;
    uint8_t *buf = NULL;
    size_t bcap = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        attw *w = NULL;
        int64_t until = 0;
        while (pool.gen == my && !(w = pool_pop_ready_locked(&until))) {
            struct timespec ts = fx_deadline_ts(until);
            pthread_cond_timedwait(&pool.cv, &pool.mu, &ts);
        }
        if (pool.gen != my) break;
        if (w->stop || !w->gen) continue;
        uint64_t g = w->gen;
        size_t len = w->len;
        if (len > bcap) {
            uint8_t *nb = realloc(buf, len);
            if (!nb) {
                w->not_before = fx_now_ms() + 200;
                pool_push_locked(w);
                continue;
            }
            buf = nb;
            bcap = len;
        }
        memcpy(buf, w->val, len);
        fx_attempts_dest d = w->dest;
        w->gen = 0;
        w->busy = true;
        pthread_mutex_unlock(&pool.mu);
        fx_err e = fx_attempts_put(w->mq, &d, buf, len, 5000);
        if (!e) {
            atomic_store(&w->durable, g);
            pthread_mutex_lock(&w->cl->mu); /* wake the claim: deliveries may go */
            pthread_cond_broadcast(&w->cl->cv);
            pthread_mutex_unlock(&w->cl->mu);
            sched_kick(w->cl);
        } else {
            fx_log_ratelimited(&w->slot, 5000, FX_LOG_WRN,
                               "claim %s: delivery attempts not recorded: %s (%s): retrying",
                               w->cl->subject, fx_strerror(e), fx_err_detail());
        }
        pthread_mutex_lock(&pool.mu);
        w->busy = false;
        if (e == FX_ELEASE_LOST) w->gen = 0; /* fenced: never retried */
        else if (e && !w->gen) w->gen = g; /* nothing newer: retry this one */
        if (w->stop) {
            pthread_cond_broadcast(&pool.done_cv);
        } else if (w->gen) {
            w->not_before = e ? fx_now_ms() + 200 : 0;
            pool_push_locked(w);
        }
    }
    pthread_mutex_unlock(&pool.mu);
    free(buf);
    nats_ReleaseThreadMemory();
    return NULL;
}

static attw *attw_start(dm_claim *cl, fx_mq_client *mq)
{
    attw *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    atomic_init(&w->durable, 0);
    w->cl = cl;
    w->mq = mq;
    pthread_mutex_lock(&pool.mu);
    if (!pool.init) {
        fx_cond_init_monotonic(&pool.cv);
        fx_cond_init_monotonic(&pool.done_cv);
        pool.init = true;
    }
    if (pool.users == 0 && pool.n_thr == 0) {
        for (size_t i = 0; i < FX_DM_ATTW_THREADS; i++) {
            if (pthread_create(&pool.thr[pool.n_thr], NULL, attw_main,
                               (void *)(uintptr_t)pool.gen) != 0)
                break;
            pool.n_thr++;
        }
    }
    if (pool.n_thr == 0) {
        pthread_mutex_unlock(&pool.mu);
        free(w);
        return NULL;
    }
    pool.users++;
    pthread_mutex_unlock(&pool.mu);
    return w;
}

static void attw_stop(attw *w)
{
    if (!w) return;
    pthread_mutex_lock(&pool.mu);
    w->stop = true;
    if (w->queued) { /* unlink */
        attw **pp = &pool.head, *prev = NULL;
        while (*pp && *pp != w) {
            prev = *pp;
            pp = &(*pp)->qnext;
        }
        if (*pp) {
            *pp = w->qnext;
            if (pool.tail == w) pool.tail = prev;
        }
        w->queued = false;
    }
    while (w->busy) {
        struct timespec ts = fx_deadline_ts(fx_now_ms() + 1000);
        pthread_cond_timedwait(&pool.done_cv, &pool.mu, &ts);
    }
    pthread_t thr[FX_DM_ATTW_THREADS];
    size_t n = 0;
    if (--pool.users == 0) { /* the last stream: the pool stops */
        pool.gen++;
        pthread_cond_broadcast(&pool.cv);
        n = pool.n_thr;
        memcpy(thr, pool.thr, n * sizeof thr[0]);
        pool.n_thr = 0;
    }
    pthread_mutex_unlock(&pool.mu);
    for (size_t i = 0; i < n; i++) pthread_join(thr[i], NULL);
    free(w->val);
    free(w);
}

/* Hand the record of generation gen to the writers (replacing one they have not started). */
static bool attw_submit(attw *w, fx_attempts *att, const uint8_t *val, size_t len, uint64_t gen)
{
    pthread_mutex_lock(&pool.mu);
    if (len > w->cap) {
        uint8_t *nb = realloc(w->val, len);
        if (!nb) {
            pthread_mutex_unlock(&pool.mu);
            return false;
        }
        w->val = nb;
        w->cap = len;
    }
    memcpy(w->val, val, len);
    w->len = len;
    fx_attempts_dest_of(att, &w->dest);
    w->gen = gen;
    if (!w->queued && !w->busy) {
        w->not_before = 0;
        pool_push_locked(w);
    }
    pthread_mutex_unlock(&pool.mu);
    return true;
}

/* The attempt stream of sub-MPSC chan: the claim's own or an adopted one's (NULL: neither). */
static att_stream *stream_of(cst *s, int64_t chan)
{
    if (s->cons && fx_mpmc_consumer_chan(s->cons) == chan) return &s->own;
    for (size_t i = 0; i < s->n_adopt; i++)
        if (s->adopt[i].chan == chan) return &s->adopt[i].as;
    return NULL;
}

/* Wait (bounded) until the last record built is durable: before the sub-MPSC is let go, so the
 * next consumer reads it. */
static void attw_sync(cst *s, att_stream *st, int64_t ms)
{
    if (!st->w || !st->att_gen) return;
    int64_t deadline = fx_now_ms() + ms;
    while (atomic_load(&st->w->durable) < st->att_gen && fx_ms_left(deadline) > 0) {
        pthread_mutex_lock(&s->cl->mu);
        if (atomic_load(&st->w->durable) < st->att_gen) {
            struct timespec ts = fx_deadline_ts(fx_now_ms() + 20);
            pthread_cond_timedwait(&s->cl->cv, &s->cl->mu, &ts);
        }
        pthread_mutex_unlock(&s->cl->mu);
    }
    if (atomic_load(&st->w->durable) < st->att_gen)
        FX_WRN("claim %s: the last delivery attempts were not recorded within %" PRId64 " ms",
               s->cl->subject, ms);
}

/* The record of one sub-MPSC (chan): its in-flight messages with the attempt count each will have
 * once the round is out; handed to its writer when it changed. Planned entries of that sub-MPSC
 * remember the generation that holds their count (do_sends waits for it). */
static void persist_one(cst *s, att_stream *st, int64_t chan)
{
    if (!st->att || !st->w) return;
    size_t k = 0;
    for (uint32_t i = 0; i < s->t.n_ents; i++) {
        ent *e = &s->t.ents[i];
        if (e->state == E_FREE || e->dv.id.chan != chan) continue;
        uint64_t n = e->delivered + (e->planned ? 1 : 0);
        s->attbuf[k++] = (fx_attempt){e->dv.id.pidx, e->dv.id.msg, n > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)n};
    }
    const uint8_t *val = NULL;
    size_t len = 0;
    if (fx_attempts_build(st->att, s->attbuf, k, &val, &len)) {
        if (attw_submit(st->w, st->att, val, len, st->att_gen + 1)) st->att_gen++;
    }
    for (uint32_t i = 0; i < s->t.n_ents; i++) {
        ent *e = &s->t.ents[i];
        if (!e->planned || e->dv.id.chan != chan) continue;
        e->planned = false;
        uint32_t n = (uint32_t)(e->delivered + 1);
        if (e->rec_n != n || !e->rec_gen) {
            e->rec_n = n;
            e->rec_gen = st->att_gen;
        }
    }
}

/* Before a round of deliveries: persist the attempt records of the claim's own sub-MPSC and of
 * every adopted one. */
static void persist_attempts(cst *s)
{
    if (!s->own.w) return;
    for (uint32_t i = 0; i < s->n_send; i++)
        if (s->t.ents[s->sendq[i]].state == E_WAIT_SEND) s->t.ents[s->sendq[i]].planned = true;
    if (s->cons) persist_one(s, &s->own, fx_mpmc_consumer_chan(s->cons));
    for (size_t a = 0; a < s->n_adopt; a++) persist_one(s, &s->adopt[a].as, s->adopt[a].chan);
    for (uint32_t i = 0; i < s->t.n_ents; i++) s->t.ents[i].planned = false;
}

/* May this entry be published now (its attempt count durable)? */
static bool attempt_durable(cst *s, const ent *e)
{
    att_stream *st = stream_of(s, e->dv.id.chan);
    if (!st || !st->att || !st->w) return true;
    return e->rec_n == e->delivered + 1 && e->rec_gen <= atomic_load(&st->w->durable);
}

/* Ack ids [0, n) through consumer c. *closed: c turned out closed. Returns FX_OK or the error. */
static fx_err ack_through(cst *s, fx_mpmc_consumer *c, const fx_mq_msg_id *ids, size_t n,
                         const char *what, bool *closed)
{
    fx_err e = fx_mpmc_ack(c, ids, n);
    *closed = e == FX_ECLOSED || e == FX_ELEASE_LOST;
    if (*closed)
        FX_WRN("claim %s: %s consumer closed (%s): %zu acks lost", s->cl->subject, what,
               fx_strerror(e), n);
    else if (e)
        fx_log_ratelimited(&s->slot_ack, 5000, FX_LOG_ERR, "claim %s: ack of %zu failed: %s (%s)",
                           s->cl->subject, n, fx_strerror(e), fx_err_detail());
    return e;
}

/* Commit the acks gathered: those of each adopted sub-MPSC through its drain consumer, the rest
 * through the claim's own; then answer the acks that asked for a reply (AckSync): ok only when
 * every ack was applied. */
static void flush_acks(cst *s)
{
    size_t n = s->n_acks;
    s->n_acks = 0;
    bool ok = n > 0, closed = false;
    for (size_t a = s->n_adopt; a-- > 0 && n;) {
        size_t j = n; /* move this sub-MPSC's acks to [j, n) */
        for (size_t i = 0; i < j;) {
            if (s->acks[i].chan == s->adopt[a].chan) {
                fx_mq_msg_id t = s->acks[i];
                s->acks[i] = s->acks[--j];
                s->acks[j] = t;
            } else {
                i++;
            }
        }
        if (n > j) {
            if (ack_through(s, s->adopt[a].c, s->acks + j, n - j, "adopted", &closed)) ok = false;
            if (closed) adopt_close(s, a, true);
        }
        n = j;
    }
    if (n) {
        if (!s->cons) {
            ok = false;
        } else {
            if (ack_through(s, s->cons, s->acks, n, "own", &closed)) ok = false;
            if (closed) s->lost = true;
        }
    }
    replies_done(s, ok);
}

/* ---- delivery ----------------------------------------------------------------------------------- */

static bool publish_ent(cst *s, uint32_t idx)
{
    fx_daemon *d = s->d;
    dm_chan *ch = s->ch;
    ent *e = &s->t.ents[idx];
    ctab_unhash(&s->t, idx);
    e->claim_seq = ++s->next_cseq;
    e->nonce = dm_rand64() & INT64_MAX;
    if (!e->nonce) e->nonce = 1;
    ctab_hash(&s->t, idx);
    uint64_t attempt = e->delivered + 1;

    char reply[FX_JSACK_SUBJECT_MAX + 64];
    if (s->explicit_ack) {
        fx_ack_meta meta = {0};
        snprintf(meta.bridge, sizeof meta.bridge, "%s", d->name);
        snprintf(meta.channel, sizeof meta.channel, "%s", ch->name);
        snprintf(meta.claim, sizeof meta.claim, "%s", s->cl->token);
        meta.delivered = attempt;
        meta.seq = DM_SEQ(&e->dv.id);
        meta.claim_seq = e->claim_seq;
        /* JetStream's metadata timestamp is the time the message was stored */
        meta.ts_ns = e->msg.publish_ns > 0 ? e->msg.publish_ns : fx_wall_ns();
        /* JetStream's pending: stored, not yet handed to this claim (house-keeping view) */
        meta.pending = s->backlog > (int64_t)s->t.n_used ? (uint64_t)(s->backlog - (int64_t)s->t.n_used) : 0;
        meta.nonce = e->nonce;
        char js[FX_JSACK_SUBJECT_MAX];
        if (fx_ack_subject_build(&meta, js, sizeof js) < 0 ||
            strncmp(js, FX_DM_JS_ACK_PREFIX, sizeof FX_DM_JS_ACK_PREFIX - 1) != 0) {
            fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_ERR,
                               "claim %s: cannot build the ack subject", s->cl->subject);
            return false;
        }
        if (s->use_leaf)
            snprintf(reply, sizeof reply, "%s", js); /* the exact JetStream form */
        else
            snprintf(reply, sizeof reply, "%s%s", FX_DM_ACK_PREFIX,
                     js + sizeof FX_DM_JS_ACK_PREFIX - 1);
    } else {
        snprintf(reply, sizeof reply, FX_DM_NR_PREFIX "%s.%s.%s.%" PRIu64 ".%" PRIu64, d->name,
                 ch->name, s->cl->token, e->claim_seq, e->nonce);
    }
    char orig[FX_SUBJECT_MAX + 1];
    size_t sl = e->msg.subject.len < FX_SUBJECT_MAX ? e->msg.subject.len : FX_SUBJECT_MAX;
    memcpy(orig, e->msg.subject.data, sl);
    orig[sl] = '\0';
    char seq[32], att[32], fid[96];
    snprintf(seq, sizeof seq, "%" PRIu64, DM_SEQ(&e->dv.id));
    snprintf(att, sizeof att, "%" PRIu64, attempt);
    snprintf(fid, sizeof fid, "%" PRId64 ".%" PRId64 ".%" PRId64, e->dv.id.chan, e->dv.id.pidx,
             e->dv.id.msg);

    char origin[FX_DM_ORIGIN_LEN + 1];
    dm_origin_tag(d, s->cl->subject, reply, origin, sizeof origin);

    const char *kv[] = {FX_DM_HDR_CHANNEL, ch->name, FX_DM_HDR_SUBJECT,   orig,
                        FX_DM_HDR_SEQ,     seq,      FX_DM_HDR_DELIVERED, att,
                        FX_DM_HDR_ID,      fid,      FX_DM_HDR_ORIGIN,    origin};
    enum { N_PAIRS = sizeof kv / sizeof kv[0] / 2 };
    natsStatus st = NATS_OK;
    if (s->use_leaf) { /* the header block is written directly: no natsMsg, no allocation */
        size_t hlen = 0;
        fx_err fe = dm_hdr_delivery(e->msg.headers, kv, N_PAIRS, &s->hbuf, &s->hcap, &hlen);
        if (!fe)
            fe = fx_leaf_publish(d->leaf, s->cl->subject, reply, s->hbuf, hlen, e->msg.data.data,
                                 e->msg.data.len);
        if (fe) {
            fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_WRN,
                               "claim %s: delivery publish (leaf) failed: %s (%s)", s->cl->subject,
                               fx_strerror(fe), fx_err_detail());
            return false;
        }
    } else {
        const char *data = e->msg.data.len ? (const char *)e->msg.data.data : "";
        natsMsg *m = NULL;
        st = natsMsg_Create(&m, s->cl->subject, reply, data, (int)e->msg.data.len);
        if (st == NATS_OK) st = dm_hdr_apply(m, e->msg.headers);
        for (size_t i = 0; st == NATS_OK && i < N_PAIRS; i++)
            st = natsMsgHeader_Set(m, kv[2 * i], kv[2 * i + 1]);
        if (st == NATS_OK) st = natsConnection_PublishMsg(d->nc, m);
        natsMsg_Destroy(m);
    }
    if (st != NATS_OK) {
        fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_WRN, "claim %s: delivery publish failed: %s",
                           s->cl->subject, natsStatus_GetText(st));
        return false;
    }
    e->delivered = attempt;
    fx_metric_inc(ch->m.delivered, 1);
    if (attempt > 1) fx_metric_inc(ch->m.redelivered, 1);
    return true;
}

static bool can_publish(cst *s)
{
    return atomic_load(&s->cl->present) && !atomic_load(&s->d->stopping) &&
           atomic_load(&s->cl->stop) == STOP_NONE && dm_nats_connected(s->d) &&
           (!s->use_leaf || fx_leaf_connected(s->d->leaf));
}

static void do_sends(cst *s)
{
    if (!s->n_send) return;
    int64_t now = fx_now_ms();
    bool ok_to_send = can_publish(s);
    if (ok_to_send) persist_attempts(s);
    if (ok_to_send && s->cons) { /* once per round: our sub-MPSC's backlog from the last view */
        int64_t own = fx_mpmc_consumer_chan(s->cons);
        s->backlog = -1;
        pthread_mutex_lock(&s->ch->mu);
        for (size_t i = 0; i < s->ch->n_held; i++)
            if (s->ch->held[i] == own) s->backlog = s->ch->held_backlog[i];
        pthread_mutex_unlock(&s->ch->mu);
    }
    uint32_t n_pub = 0, keep = 0;
    bool blocked = false; /* explicit ack only: waiting for the attempt record to be durable */
    for (uint32_t i = 0; i < s->n_send; i++) {
        uint32_t idx = s->sendq[i];
        ent *e = &s->t.ents[idx];
        if (e->state != E_WAIT_SEND) continue;
        if (ok_to_send && (blocked || !attempt_durable(s, e))) {
            /* this one and every later one wait, in order (per-producer FIFO), at the head of
             * the send queue; the writer wakes the claim thread when the record is durable */
            blocked = true;
            ctab_unschedule(&s->t, idx);
            s->sendq[keep++] = idx;
            continue;
        }
        if (!ok_to_send || !publish_ent(s, idx)) {
            ctab_schedule(&s->t, idx, now + (ok_to_send ? 200 : 100));
            continue;
        }
        e->state = E_WAIT_ACK;
        if (s->explicit_ack)
            ctab_schedule(&s->t, idx, now + s->ch->s.ack_wait_ms);
        else
            s->sendq[n_pub++] = idx; /* reuse the array: published this round */
    }
    s->n_send = keep;
    if (!s->explicit_ack && n_pub) {
        /* ack none: the server has processed the publishes once the PONG is back; any 503 for
         * them is then already in our ack-none subscription. Ack after a short grace. */
        natsConnection_FlushTimeout(s->d->nc, 1000);
        int64_t due = fx_now_ms() + FX_DM_NONE_GRACE_MS;
        for (uint32_t i = 0; i < n_pub; i++) ctab_schedule(&s->t, s->sendq[i], due);
    }
}

static void sendq_push(cst *s, uint32_t idx)
{
    if (s->n_send < s->t.n_ents)
        s->sendq[s->n_send++] = idx;
    else
        ctab_schedule(&s->t, idx, fx_now_ms()); /* defensive: picked up by the next round */
}

static void schedule_send(cst *s, uint32_t idx, int64_t delay_ms)
{
    ent *e = &s->t.ents[idx];
    e->state = E_WAIT_SEND;
    if (delay_ms <= 0) {
        ctab_unschedule(&s->t, idx);
        sendq_push(s, idx);
    } else {
        ctab_schedule(&s->t, idx, fx_now_ms() + delay_ms);
    }
}

/* ---- dead letters ------------------------------------------------------------------------------ */

static void dead_letter(cst *s, uint32_t idx, const char *reason)
{
    fx_daemon *d = s->d;
    dm_chan *ch = s->ch;
    ent *e = &s->t.ents[idx];
    e->dead_reason = reason;
    if (ch->is_dlq) {
        /* A dead letter's own channel has no DLQ: +TERM discards it, max_deliver never drops it. */
        if (strcmp(reason, "term") == 0) {
            FX_INF("claim %s: dead letter %" PRId64 ".%" PRId64 ".%" PRId64 " terminated: discarded",
                   s->cl->subject, e->dv.id.chan, e->dv.id.pidx, e->dv.id.msg);
            fx_metric_inc(ch->m.acked, 1);
            ack_add(s, &e->dv.id);
            ctab_release(&s->t, idx);
        } else {
            int64_t delay = ch->s.n_backoff ? ch->s.backoff_ms[ch->s.n_backoff - 1] : ch->s.ack_wait_ms;
            schedule_send(s, idx, delay);
        }
        return;
    }
    char dlq_name[160];
    snprintf(dlq_name, sizeof dlq_name, "%s-dlq", ch->name);
    char att[32], fid[96];
    snprintf(att, sizeof att, "%" PRIu64, e->delivered);
    snprintf(fid, sizeof fid, "%" PRId64 ".%" PRId64 ".%" PRId64, e->dv.id.chan, e->dv.id.pidx,
             e->dv.id.msg);
    const char *kv[] = {FX_DM_HDR_DEAD_REASON, reason, "Fluxon-Dead-Delivered", att,
                        "Fluxon-Dead-Id", fid};
    char *hdr = NULL;
    size_t hlen = 0;
    pq_item *it = NULL;
    fx_err err = dm_hdr_append(e->msg.headers, kv, 3, &hdr, &hlen);
    if (!err) {
        fx_mq_msg rec = {.subject = e->msg.subject,
                         .headers = {hdr, hlen},
                         .publish_ns = e->msg.publish_ns,
                         .data = e->msg.data};
        size_t rl = 0;
        err = fx_mq_msg_encoded_size(&rec, &rl);
        if (!err && !(it = dm_pq_item_new(PQ_DEADLETTER, NULL, rl))) err = FX_ENOMEM;
        if (!err) err = fx_mq_msg_encode_into(&rec, it->rec, rl, &it->rec_len);
    }
    free(hdr);
    bool queued = false, no_dlq = false;
    if (!err) {
        it->claim = s->cl;
        it->ent_idx = idx;
        it->ent_gen = e->gen;
        atomic_fetch_add(&s->cl->refs, 1);
        pthread_rwlock_rdlock(&d->reg);
        dm_chan *dq = dm_find_chan_locked(d, dlq_name);
        if (!dq)
            no_dlq = true;
        else
            queued = dm_pq_push(&dq->q, it);
        pthread_rwlock_unlock(&d->reg);
        if (!queued) {
            atomic_fetch_sub(&s->cl->refs, 1); /* the registry and the thread still hold refs */
            free(it);
        }
    } else {
        free(it);
    }
    if (queued) {
        ctab_unschedule(&s->t, idx);
        e->state = E_WAIT_DLQ;
        s->dlq_pending++;
        return;
    }
    if (no_dlq) {
        FX_ERR("claim %s: no dead-letter channel %s: message %s dropped (%s)", s->cl->subject,
               dlq_name, fid, reason);
        fx_metric_inc(ch->m.dropped, 1);
        ack_add(s, &e->dv.id);
        ctab_release(&s->t, idx);
        return;
    }
    static fx_log_slot slot;
    fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "claim %s: cannot queue dead letter %s (%s): retrying",
                       s->cl->subject, fid, err ? fx_strerror(err) : "queue full");
    e->state = E_DLQ_RETRY;
    ctab_schedule(&s->t, idx, fx_now_ms() + 1000);
}

/* Redeliver now / after delay, or dead-letter when the attempts are used up. */
static void redeliver_or_dlq(cst *s, uint32_t idx, int64_t delay_ms)
{
    ent *e = &s->t.ents[idx];
    if ((int64_t)e->delivered >= s->ch->s.max_deliver && !s->ch->is_dlq) {
        dead_letter(s, idx, "max_deliver");
        return;
    }
    schedule_send(s, idx, delay_ms);
}

/* ---- events ------------------------------------------------------------------------------------ */

/* Apply one event; true when it changed the state of a pending delivery. */
static bool apply_ev(cst *s, const dm_ev *ev)
{
    fx_daemon *d = s->d;
    uint32_t idx = ctab_find(&s->t, ev->claim_seq);
    ent *e = idx == NIL ? NULL : &s->t.ents[idx];
    /* Did the bridge cause this message? (see the header comment) */
    bool issued = ev->nonce != 0 && ev->claim_seq != 0 && ev->claim_seq <= s->next_cseq;
    if (ev->kind == EV_NORESP) {
        if (!issued || !e || e->nonce != ev->nonce || s->use_leaf || e->state != E_WAIT_ACK) {
            dm_invalid_control(d, "no-responders status");
            return false;
        }
        if (!atomic_exchange(&s->cl->noresp, true))
            FX_INF("claim %s: no responders: releasing the claim", s->cl->subject);
        return false;
    }
    if (!issued || !s->explicit_ack || (e && e->nonce != ev->nonce)) {
        dm_invalid_control(d, "ack");
        return false;
    }
    if (!e) {
        fx_metric_inc(d->g_stale_acks, 1);
        return false;
    }
    switch (ev->kind) {
    case EV_ACK:
        if (e->state != E_WAIT_ACK && e->state != E_WAIT_SEND) return false;
        fx_metric_inc(s->ch->m.acked, 1);
        ack_add(s, &e->dv.id);
        ctab_release(&s->t, idx);
        return true;
    case EV_NAK:
        if (e->state != E_WAIT_ACK) return false;
        {
            int64_t delay = ev->delay_ns > 0 ? ev->delay_ns / 1000000 : -1;
            if (delay < 0) {
                const fx_chan_settings *cs = &s->ch->s;
                if (cs->n_backoff) {
                    size_t i = e->delivered ? (size_t)e->delivered - 1 : 0;
                    if (i >= cs->n_backoff) i = cs->n_backoff - 1;
                    delay = cs->backoff_ms[i];
                } else {
                    delay = 0;
                }
            }
            redeliver_or_dlq(s, idx, delay);
        }
        return true;
    case EV_WPI:
        if (e->state != E_WAIT_ACK) return false;
        ctab_schedule(&s->t, idx, fx_now_ms() + s->ch->s.ack_wait_ms);
        return true;
    case EV_TERM:
        if (e->state != E_WAIT_ACK && e->state != E_WAIT_SEND) return false;
        dead_letter(s, idx, "term");
        return true;
    default:
        return false;
    }
}

static void handle_ev(cst *s, dm_ev *ev)
{
    bool applied = apply_ev(s, ev);
    if (!ev->reply) return;
    if (applied && ev->kind == EV_ACK && s->n_replies < s->n_acks)
        s->replies[s->n_replies++] = ev->reply; /* answered once flush_acks handed it to the MQ */
    else
        ackreply_done(s->d, ev->reply, applied);
    ev->reply = NULL;
}

static void handle_dlq_done(cst *s, pq_item *it)
{
    uint32_t idx = it->ent_idx;
    if (s->dlq_pending) s->dlq_pending--;
    if (idx < s->t.n_ents && s->t.ents[idx].state == E_WAIT_DLQ && s->t.ents[idx].gen == it->ent_gen) {
        ent *e = &s->t.ents[idx];
        if (it->result == FX_OK) {
            FX_INF("claim %s: message %" PRId64 ".%" PRId64 ".%" PRId64 " dead-lettered (%s)",
                   s->cl->subject, e->dv.id.chan, e->dv.id.pidx, e->dv.id.msg, e->dead_reason);
            fx_metric_inc(s->ch->m.dead, 1);
            ack_add(s, &e->dv.id);
            ctab_release(&s->t, idx);
        } else {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "claim %s: dead letter not stored (%s): retrying",
                               s->cl->subject, fx_strerror(it->result));
            e->state = E_DLQ_RETRY;
            ctab_schedule(&s->t, idx, fx_now_ms() + 1000);
        }
    }
    dm_claim *cl = it->claim;
    free(it);
    dm_claim_unref(cl);
}

/* Process queued events and dead-letter completions; returns how many were handled. */
static size_t drain_events(cst *s)
{
    dm_claim *cl = s->cl;
    size_t total = 0;
    for (int round = 0; round < 64; round++) {
        dm_ev local[256];
        size_t n = 0;
        pthread_mutex_lock(&cl->mu);
        while (cl->ev_n && n < 256) {
            local[n++] = cl->evs[cl->ev_head];
            cl->ev_head = (cl->ev_head + 1) % cl->ev_cap;
            cl->ev_n--;
        }
        pq_item *done = cl->dlq_done;
        cl->dlq_done = NULL;
        pthread_mutex_unlock(&cl->mu);
        for (size_t i = 0; i < n; i++) handle_ev(s, &local[i]);
        while (done) {
            pq_item *nx = done->next;
            handle_dlq_done(s, done);
            done = nx;
        }
        total += n;
        if (n < 256) break;
    }
    return total;
}


/* ---- timers ------------------------------------------------------------------------------------ */

static void run_due(cst *s)
{
    int64_t now = fx_now_ms();
    uint32_t idx;
    while ((idx = ctab_next(&s->t)) != NIL && s->t.ents[idx].due_ms <= now) {
        ent *e = &s->t.ents[idx];
        ctab_unschedule(&s->t, idx);
        switch (e->state) {
        case E_WAIT_ACK:
            if (!s->explicit_ack) { /* ack none: no no-responders came back */
                ack_add(s, &e->dv.id);
                ctab_release(&s->t, idx);
            } else if (!atomic_load(&s->cl->present)) {
                ctab_schedule(&s->t, idx, now + 200); /* nobody listens: hold, do not count */
            } else {
                redeliver_or_dlq(s, idx, 0);
            }
            break;
        case E_WAIT_SEND:
            sendq_push(s, idx);
            break;
        case E_DLQ_RETRY:
            dead_letter(s, idx, e->dead_reason ? e->dead_reason : "max_deliver");
            break;
        default:
            break;
        }
    }
}

static int64_t next_due_in(cst *s)
{
    uint32_t idx = ctab_next(&s->t);
    if (idx == NIL) return INT64_MAX;
    int64_t left = s->t.ents[idx].due_ms - fx_now_ms();
    return left < 0 ? 0 : left;
}

/* ---- fetch ------------------------------------------------------------------------------------- */

static void accept_msgs(cst *s, size_t got)
{
    for (size_t i = 0; i < got; i++) {
        fx_mq_delivery *dv = &s->getbuf[i];
        uint32_t idx = ctab_alloc(&s->t);
        if (idx == NIL) { /* cannot happen: we never fetch past the window */
            fx_mq_delivery_free(dv);
            continue;
        }
        ent *e = &s->t.ents[idx];
        e->dv = *dv;
        *dv = (fx_mq_delivery){0};
        if (fx_mq_msg_decode(e->dv.value.data, e->dv.value.len, e->dv.value.len + 1, &e->msg) !=
            FX_OK) {
            FX_ERR("claim %s: message %" PRId64 ".%" PRId64 ".%" PRId64
                   " is not a valid record (%s): dropped",
                   s->cl->subject, e->dv.id.chan, e->dv.id.pidx, e->dv.id.msg, fx_err_detail());
            fx_metric_inc(s->ch->m.dropped, 1);
            ack_add(s, &e->dv.id);
            ctab_release(&s->t, idx);
            continue;
        }
        e->state = E_WAIT_SEND;
        att_stream *st = stream_of(s, e->dv.id.chan);
        e->delivered = st && st->att ? fx_attempts_take(st->att, e->dv.id.pidx, e->dv.id.msg) : 0;
        if (e->delivered && (int64_t)e->delivered >= s->ch->s.max_deliver && !s->ch->is_dlq) {
            /* its attempts were used up under an earlier consumer (released, crashed, moved) */
            dead_letter(s, idx, "max_deliver");
            continue;
        }
        sendq_push(s, idx);
    }
}

/* ---- stranded backlog ---------------------------------------------------------------------------- */

/* Entries in flight that came from sub-MPSC `chan`. */
static size_t count_chan(cst *s, int64_t chan)
{
    size_t n = 0;
    for (uint32_t i = 0; i < s->t.n_ents; i++)
        if (s->t.ents[i].state != E_FREE && s->t.ents[i].dv.id.chan == chan) n++;
    return n;
}

/* Close adopted slot i. lost: its consumer closed under us (its entries are dropped: the
 * messages stay unacked in the sub-MPSC for its next consumer; dead letters in progress finish).
 * Else it was drained: its acks are committed first. */
static void adopt_close(cst *s, size_t i, bool lost)
{
    struct adopted a = s->adopt[i];
    s->adopt[i] = s->adopt[--s->n_adopt];
    if (lost) {
        for (uint32_t k = 0; k < s->t.n_ents; k++)
            if (s->t.ents[k].state != E_FREE && s->t.ents[k].state != E_WAIT_DLQ &&
                s->t.ents[k].dv.id.chan == a.chan)
                ctab_release(&s->t, k);
    } else {
        attw_sync(s, &a.as, 2000); /* its next consumer reads the attempts */
        fx_err e = fx_mpmc_flush(a.c, 2000);
        if (e && e != FX_ECLOSED && e != FX_ELEASE_LOST)
            FX_WRN("claim %s: adopted sub-MPSC %" PRId64 ": ack flush: %s", s->cl->subject, a.chan,
                   fx_strerror(e));
    }
    attw_stop(a.as.w);
    fx_attempts_free(a.as.att);
    fx_mpmc_consumer_set_notify(a.c, NULL, NULL);
    fx_mpmc_consumer_close(a.c);
    fx_mpmc_consumer_free(a.c);
    FX_INF("claim %s: %s adopted sub-MPSC %" PRId64 " (%" PRIu64 " message(s) in %" PRIu64
           " fetches)", s->cl->subject, lost ? "lost" : "drained", a.chan, a.got, a.gets);
}

static bool is_adopted(const cst *s, int64_t chan)
{
    for (size_t i = 0; i < s->n_adopt; i++)
        if (s->adopt[i].chan == chan) return true;
    return false;
}

/* A claim adopts the unready sub-MPSCs that still hold messages (left by a released claim or a
 * killed bridge whose member lease expired) as soon as the sub-MPSC view shows them, busy or not:
 * it opens a drain consumer on each (bound without a ready key, so producers route nothing new
 * there) and drains them next to its own sub-MPSC (adopted messages first) until each stays
 * empty, so no delivery waits on a departed claim. At most FX_DM_ADOPT_MAX at a time per claim;
 * another claim, here or on another bridge, may hold one (FX_EEXISTS: the next). */
static void adopt_stranded(cst *s)
{
    dm_chan *ch = s->ch;
    int64_t stranded[FX_DM_SWEEP_MAX];
    size_t ns;
    uint64_t gen;
    pthread_mutex_lock(&ch->mu);
    gen = ch->view_gen;
    ns = ch->n_stranded;
    memcpy(stranded, ch->stranded, ns * sizeof *stranded);
    pthread_mutex_unlock(&ch->mu);
    if (!ns || gen == s->view_gen || !s->cons || s->n_adopt >= FX_DM_ADOPT_MAX) return;
    s->view_gen = gen;
    int64_t own = fx_mpmc_consumer_chan(s->cons);
    int64_t mpmc = -1;
    if (dm_chan_resolve(ch, false, &mpmc)) return;
    for (size_t i = 0; i < ns && s->n_adopt < FX_DM_ADOPT_MAX && !stop_requested(s); i++) {
        if (stranded[i] == own || is_adopted(s, stranded[i])) continue;
        fx_mpmc_consumer *c = NULL;
        fx_err e = fx_mpmc_consumer_open_drain(s->d->mq, mpmc, stranded[i], &c);
        if (e == FX_EEXISTS || e == FX_ENOTFOUND) continue;
        if (e) {
            fx_log_ratelimited(&s->slot_open, 5000, FX_LOG_WRN,
                               "claim %s: cannot adopt sub-MPSC %" PRId64 ": %s (%s)",
                               s->cl->subject, stranded[i], fx_strerror(e), fx_err_detail());
            return;
        }
        struct adopted ad = {.c = c, .chan = stranded[i]};
        if (s->explicit_ack) { /* its messages keep their delivery counts (own record) */
            e = fx_attempts_open(s->d->mq, stranded[i], c, 5000, &ad.as.att);
            if (!e && !(ad.as.w = attw_start(s->cl, s->d->mq)))
                e = fx_seterr(FX_ENOMEM, "cannot start an attempt writer");
            if (e) {
                fx_log_ratelimited(&s->slot_att, 5000, FX_LOG_WRN,
                                   "claim %s: cannot adopt sub-MPSC %" PRId64 ": attempts: %s (%s)",
                                   s->cl->subject, stranded[i], fx_strerror(e), fx_err_detail());
                fx_attempts_free(ad.as.att);
                fx_mpmc_consumer_close(c);
                fx_mpmc_consumer_free(c);
                return;
            }
        }
        fx_mpmc_consumer_set_notify(c, claim_notify, s->cl);
        s->adopt[s->n_adopt++] = ad;
        FX_INF("claim %s: adopted sub-MPSC %" PRId64 " with stranded backlog (next to its own "
               "sub-MPSC %" PRId64 ")", s->cl->subject, stranded[i], own);
    }
}

/* Fetch from the adopted sub-MPSCs (without waiting), round robin. true when messages were
 * accepted. A drain consumer empty for FX_DM_ADOPT_IDLE_MS with nothing of it in flight is
 * closed (nothing new is routed to it). */
static bool fetch_adopted(cst *s, size_t want)
{
    for (size_t k = 0; k < s->n_adopt; k++) {
        size_t i = (s->adopt_rr + k) % s->n_adopt;
        struct adopted *a = &s->adopt[i];
        size_t got = 0;
        fx_err e = fx_mpmc_get(a->c, s->getbuf, want, &got, 0);
        a->gets++;
        a->got += got;
        if (e == FX_OK && got) {
            a->empty_since = 0;
            s->adopt_rr = i + 1;
            accept_msgs(s, got);
            return true;
        }
        if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
            adopt_close(s, i, true);
            return false; /* slots moved: next turn */
        }
        if (e != FX_ETIMEDOUT && e != FX_OK) {
            fx_log_ratelimited(&s->slot_get, 5000, FX_LOG_WRN,
                               "claim %s: get (adopted) failed: %s (%s)", s->cl->subject,
                               fx_strerror(e), fx_err_detail());
            continue;
        }
        int64_t now = fx_now_ms();
        if (!a->empty_since) a->empty_since = now;
        if (now - a->empty_since >= FX_DM_ADOPT_IDLE_MS && count_chan(s, a->chan) == 0) {
            flush_acks(s);
            for (size_t j = 0; j < s->n_adopt; j++)
                if (s->adopt[j].chan == a->chan) {
                    adopt_close(s, j, false);
                    break;
                }
            return false;
        }
    }
    return false;
}

/* ---- the claim thread -------------------------------------------------------------------------- */

static size_t count_state(cst *s, uint8_t st)
{
    size_t n = 0;
    for (uint32_t i = 0; i < s->t.n_ents; i++)
        if (s->t.ents[i].state == st) n++;
    return n;
}

/* One turn of the claim (on a scheduler worker): what the claim thread's loop did in one
 * iteration, without blocking: returns the ms until the claim wants its next turn (it is kicked
 * earlier by acks, dead-letter completions, a stop and durable attempt records), or -1 when the
 * claim is to be released. */
static int64_t claim_turn(cst *s)
{
    if (stop_requested(s)) return -1;
    if (!s->cons) {
        if (atomic_load(&s->d->stopping)) return -1;
        int64_t w = open_once(s);
        if (w >= 0) return w;
    }
    drain_events(s);
    flush_acks(s);
    if (s->lost) {
        consumer_drop(s);
        return 0;
    }
    run_due(s);
    do_sends(s);
    flush_acks(s);
    if (s->lost) {
        consumer_drop(s);
        return 0;
    }
    if (stop_requested(s)) return -1;
    adopt_stranded(s); /* no RPC unless the view shows stranded backlog not adopted yet */
    int64_t next = next_due_in(s);
    bool can_fetch = s->t.n_used < s->t.max_ents && can_publish(s);
    if (!can_fetch) {
        int64_t cap = s->n_send ? 2 : 50; /* deliveries waiting for their record */
        return next < cap ? next : cap;
    }
    if (!attempts_ready(s)) return 200;
    size_t want = s->t.max_ents - s->t.n_used;
    if (want > FX_DM_FETCH_MAX) want = FX_DM_FETCH_MAX;
    if (fetch_adopted(s, want)) {
        do_sends(s);
        return 0;
    }
    if (s->lost) return 0;
    size_t got = 0;
    fx_err e = fx_mpmc_get(s->cons, s->getbuf, want, &got, 0);
    if (e == FX_OK && got) {
        accept_msgs(s, got);
        do_sends(s);
        return 0;
    }
    if (e == FX_OK || e == FX_ETIMEDOUT) {
        /* Nothing stored for us: new messages kick the claim (claim_notify); the turn comes back
         * anyway after 20 ms while deliveries are in flight or backlog is adopted, else after
         * FX_DM_IDLE_GET_MS (a thousand idle claims: 4,000 cheap turns/s), which also adopts
         * stranded backlog if the view shows some. */
        int64_t cap = s->t.n_used || s->n_adopt ? 20 : FX_DM_IDLE_GET_MS;
        if (s->n_send && cap > 2) cap = 2; /* deliveries wait for their attempt record */
        return next < cap ? next : cap;
    }
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
        FX_WRN("claim %s: consumer closed (%s): reopening", s->cl->subject, fx_strerror(e));
        consumer_drop(s);
        return 0;
    }
    fx_log_ratelimited(&s->slot_get, 5000, FX_LOG_WRN, "claim %s: get failed: %s (%s)",
                       s->cl->subject, fx_strerror(e), fx_err_detail());
    return 200;
}

static void claim_release(cst *s)
{
    dm_claim *cl = s->cl;
    if (s->cons) {
        int mode = atomic_load(&cl->stop);
        if (mode == STOP_DRAIN && s->explicit_ack && atomic_load(&cl->present) &&
            !atomic_load(&cl->noresp)) {
            int64_t deadline = fx_now_ms() + FX_DM_DRAIN_LINGER_MS;
            while (count_state(s, E_WAIT_ACK) > 0 && fx_ms_left(deadline) > 0 && !s->lost) {
                size_t handled = drain_events(s);
                s->n_send = 0; /* nothing is (re)published while draining */
                if (!handled) {
                    flush_acks(s);
                    pthread_mutex_lock(&cl->mu);
                    if (cl->ev_n == 0 && !cl->dlq_done) {
                        struct timespec ts = fx_deadline_ts(fx_now_ms() + 50);
                        pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
                    }
                    pthread_mutex_unlock(&cl->mu);
                }
            }
        }
        int64_t deadline = fx_now_ms() + FX_DM_DLQ_WAIT_MS;
        while (s->dlq_pending > 0 && fx_ms_left(deadline) > 0) {
            size_t handled = drain_events(s);
            s->n_send = 0;
            if (!handled) {
                pthread_mutex_lock(&cl->mu);
                if (cl->ev_n == 0 && !cl->dlq_done) {
                    struct timespec ts = fx_deadline_ts(fx_now_ms() + 50);
                    pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
                }
                pthread_mutex_unlock(&cl->mu);
            }
        }
        flush_acks(s);
        while (s->n_adopt) adopt_close(s, s->n_adopt - 1, false);
        if (!s->lost) {
            fx_err e = fx_mpmc_flush(s->cons, 2000);
            if (e && e != FX_ECLOSED && e != FX_ELEASE_LOST)
                FX_WRN("claim %s: ack flush: %s", cl->subject, fx_strerror(e));
        }
        size_t unacked = s->t.n_used;
        consumer_drop(s);
        FX_INF("claim %s: released (%zu unacked message(s) left for the next consumer)",
               cl->subject, unacked);
    }
    release_all(s);
}

/* First turn: the claim's state (owned by its turns from now on). false: out of memory. */
static bool claim_start(dm_claim *cl)
{
    cst *s = calloc(1, sizeof *s);
    if (!s) return false;
    cl->st = s;
    s->cl = cl;
    s->ch = cl->ch;
    s->d = cl->ch->d;
    s->explicit_ack = cl->ch->s.ack == FX_ACK_EXPLICIT;
    s->use_leaf = s->explicit_ack && s->d->leaf != NULL;
    if (s->explicit_ack) s->own.w = attw_start(cl, s->d->mq);
    return table_init(s) && (!s->explicit_ack || s->own.w);
}

/* Last turn: release (bounded waits, on the worker) and free the claim's state. The caller then
 * marks the claim finished and drops the scheduler's reference. */
static void claim_end(dm_claim *cl, bool ran)
{
    cst *s = cl->st;
    if (!s) return;
    if (ran) {
        claim_release(s);
        dm_view_kick(s->d, s->ch); /* its sub-MPSC may hold stranded backlog now: adopt it at once */
    } else {
        FX_ERR("claim %s: out of memory", cl->subject);
    }
    /* completions of dead letters still in flight are freed by the producer side from now on;
     * acks still queued are not applied: their requesters get the error reply now */
    pthread_mutex_lock(&cl->mu);
    while (cl->ev_n) {
        dm_ev *ev = &cl->evs[cl->ev_head];
        ackreply_done(s->d, ev->reply, false);
        ev->reply = NULL;
        cl->ev_head = (cl->ev_head + 1) % cl->ev_cap;
        cl->ev_n--;
    }
    cl->dlq_closed = true;
    pq_item *done = cl->dlq_done;
    cl->dlq_done = NULL;
    pthread_mutex_unlock(&cl->mu);
    while (done) {
        pq_item *nx = done->next;
        free(done);
        dm_claim_unref(cl);
        done = nx;
    }
    ctab_free(&s->t);
    free(s->sendq);
    free(s->acks);
    free(s->replies);
    free(s->attbuf);
    fx_attempts_free(s->own.att);
    attw_stop(s->own.w);
    for (size_t i = 0; s->getbuf && i < FX_DM_FETCH_MAX; i++) fx_mq_delivery_free(&s->getbuf[i]);
    free(s->getbuf);
    free(s->hbuf);
    free(s);
    cl->st = NULL;
}

/* One step of claim cl: ms until its next step, or -1 when it has ended. */
static int64_t claim_step(dm_claim *cl)
{
    switch (cl->phase) {
    case 0: /* start */
        if (!claim_start(cl)) {
            claim_end(cl, false);
            return -1;
        }
        cl->phase = 1;
        return 0;
    case 1: { /* run */
        int64_t w = claim_turn(cl->st);
        if (w >= 0) return w;
        claim_end(cl, true);
        return -1;
    }
    default:
        return -1;
    }
}

/* ---- the claim scheduler ------------------------------------------------------------------------
 * FX_DM_CLAIM_WORKERS threads per process run the steps of every claim (issue 13: it was one
 * thread per claim). A claim is in the run queue when it was kicked or its wait is over; one
 * worker runs it at a time (a kick during its step queues it again right after). Waiting claims
 * are found by a scan of the claim list when the earliest known wait is over. The workers start
 * with the first claim and stay until dm_claims_sched_stop() (daemon free, no claim left).
 * Lock order: a claim's mu, then sched.mu. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* workers (monotonic) */
    pthread_cond_t fin_cv; /* a claim finished (monotonic) */
    bool init;
    uint64_t gen;      /* bumped when the pool stops: threads of older generations exit */
    size_t users;      /* claims scheduled */
    dm_claim *rq_head, *rq_tail;
    dm_claim *all;     /* every scheduled claim (sq_all_next) */
    int64_t min_due;   /* no waiting claim is due before this */
    pthread_t thr[FX_DM_CLAIM_WORKERS];
    size_t n_thr;
} sched = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void sched_push_locked(dm_claim *cl)
{
    cl->sq_queued = true;
    cl->sq_due = 0;
    cl->sq_next = NULL;
    if (sched.rq_tail) sched.rq_tail->sq_next = cl;
    else sched.rq_head = cl;
    sched.rq_tail = cl;
    pthread_cond_signal(&sched.cv);
}

static void sched_kick(dm_claim *cl)
{
    pthread_mutex_lock(&sched.mu);
    if (cl->sq_on) {
        if (cl->sq_running) cl->sq_kicked = true;
        else if (!cl->sq_queued) sched_push_locked(cl);
    }
    pthread_mutex_unlock(&sched.mu);
}

/* Waiting claims whose time has come go to the run queue; recomputes min_due. */
static void sched_scan_locked(int64_t now)
{
    int64_t min = now + 1000;
    for (dm_claim *x = sched.all; x; x = x->sq_all_next) {
        if (x->sq_queued || x->sq_running || !x->sq_due) continue;
        if (x->sq_due <= now) sched_push_locked(x);
        else if (x->sq_due < min) min = x->sq_due;
    }
    sched.min_due = min;
}

static void *sched_main(void *arg)
{
    uint64_t my = (uint64_t)(uintptr_t)arg;
    pthread_mutex_lock(&sched.mu);
    while (sched.gen == my) {
        int64_t now = fx_now_ms();
        if (now >= sched.min_due) sched_scan_locked(now);
        dm_claim *cl = sched.rq_head;
        if (!cl) {
            struct timespec ts = fx_deadline_ts(sched.min_due);
            pthread_cond_timedwait(&sched.cv, &sched.mu, &ts);
            continue;
        }
        sched.rq_head = cl->sq_next;
        if (!sched.rq_head) sched.rq_tail = NULL;
        cl->sq_queued = false;
        cl->sq_running = true;
        cl->sq_kicked = false;
        pthread_mutex_unlock(&sched.mu);
        int64_t w = claim_step(cl);
        pthread_mutex_lock(&sched.mu);
        cl->sq_running = false;
        if (w < 0) { /* ended: out of the scheduler, then finished */
            cl->sq_on = false;
            dm_claim **pp = &sched.all;
            while (*pp && *pp != cl) pp = &(*pp)->sq_all_next;
            if (*pp) *pp = cl->sq_all_next;
            sched.users--;
            atomic_store(&cl->finished, true);
            pthread_cond_broadcast(&sched.fin_cv);
            pthread_mutex_unlock(&sched.mu);
            dm_claim_unref(cl);
            pthread_mutex_lock(&sched.mu);
            continue;
        }
        if (cl->sq_kicked || w == 0) {
            sched_push_locked(cl);
        } else {
            cl->sq_due = fx_now_ms() + w;
            if (cl->sq_due < sched.min_due) sched.min_due = cl->sq_due;
        }
    }
    pthread_mutex_unlock(&sched.mu);
    nats_ReleaseThreadMemory();
    return NULL;
}

void dm_claims_sched_stop(void)
{
    pthread_mutex_lock(&sched.mu);
    pthread_t thr[FX_DM_CLAIM_WORKERS];
    size_t n = 0;
    if (sched.users == 0) {
        sched.gen++;
        pthread_cond_broadcast(&sched.cv);
        n = sched.n_thr;
        memcpy(thr, sched.thr, n * sizeof thr[0]);
        sched.n_thr = 0;
    } else {
        FX_WRN("claim scheduler: %zu claim(s) still scheduled at daemon free; workers kept",
               sched.users);
    }
    pthread_mutex_unlock(&sched.mu);
    for (size_t i = 0; i < n; i++) pthread_join(thr[i], NULL);
}

/* Hand a new claim to the scheduler (its first step runs at once). */
static bool sched_add(dm_claim *cl)
{
    pthread_mutex_lock(&sched.mu);
    if (!sched.init) {
        fx_cond_init_monotonic(&sched.cv);
        fx_cond_init_monotonic(&sched.fin_cv);
        sched.init = true;
    }
    if (sched.n_thr == 0) {
        for (size_t i = 0; i < FX_DM_CLAIM_WORKERS; i++) {
            if (pthread_create(&sched.thr[sched.n_thr], NULL, sched_main,
                               (void *)(uintptr_t)sched.gen) != 0)
                break;
            sched.n_thr++;
        }
    }
    if (sched.n_thr == 0) {
        pthread_mutex_unlock(&sched.mu);
        return false;
    }
    sched.users++;
    cl->sq_on = true;
    cl->sq_all_next = sched.all;
    sched.all = cl;
    sched_push_locked(cl);
    pthread_mutex_unlock(&sched.mu);
    return true;
}

/* ---- claim objects ----------------------------------------------------------------------------- */

void dm_claim_unref(dm_claim *cl)
{
    if (!cl || atomic_fetch_sub(&cl->refs, 1) != 1) return;
    pq_item *it = cl->dlq_done;
    while (it) { /* cannot hold refs (each would keep cl alive); defensive */
        pq_item *nx = it->next;
        free(it);
        it = nx;
    }
    for (size_t i = 0; i < cl->ev_n; i++) /* acks that never reached the thread */
        ackreply_done(NULL, cl->evs[(cl->ev_head + i) % cl->ev_cap].reply, false);
    free(cl->evs);
    pthread_mutex_destroy(&cl->mu);
    pthread_cond_destroy(&cl->cv);
    free(cl);
}

void dm_claim_dlq_complete(pq_item *it)
{
    dm_claim *cl = it->claim;
    pthread_mutex_lock(&cl->mu);
    if (cl->dlq_closed) {
        pthread_mutex_unlock(&cl->mu);
        free(it);
        dm_claim_unref(cl);
        return;
    }
    it->next = cl->dlq_done;
    cl->dlq_done = it;
    pthread_cond_signal(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    sched_kick(cl);
}

static bool ev_push(dm_claim *cl, const dm_ev *ev)
{
    pthread_mutex_lock(&cl->mu);
    if (cl->ev_n >= cl->ev_cap) {
        pthread_mutex_unlock(&cl->mu);
        return false;
    }
    cl->evs[(cl->ev_head + cl->ev_n) % cl->ev_cap] = *ev;
    cl->ev_n++;
    pthread_cond_signal(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    sched_kick(cl);
    return true;
}

static void request_stop(dm_claim *cl, int mode)
{
    int cur = STOP_NONE;
    atomic_compare_exchange_strong(&cl->stop, &cur, mode); /* the first reason wins */
    pthread_mutex_lock(&cl->mu);
    pthread_cond_broadcast(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    sched_kick(cl);
}

static dm_claim *claim_new(dm_chan *ch, const char *token)
{
    dm_claim *cl = calloc(1, sizeof *cl);
    if (!cl) return NULL;
    cl->ch = ch;
    snprintf(cl->token, sizeof cl->token, "%s", token);
    snprintf(cl->subject, sizeof cl->subject, "%s.%s", ch->deliver_prefix, token);
    uint64_t cap = (uint64_t)ch->s.max_ack_pending * 2;
    if (cap < FX_DM_EVQ_MIN) cap = FX_DM_EVQ_MIN;
    if (cap > FX_DM_EVQ_MAX) cap = FX_DM_EVQ_MAX;
    cl->ev_cap = (size_t)cap;
    cl->evs = malloc(cl->ev_cap * sizeof *cl->evs);
    if (!cl->evs) {
        free(cl);
        return NULL;
    }
    pthread_mutex_init(&cl->mu, NULL);
    fx_cond_init_monotonic(&cl->cv);
    atomic_init(&cl->refs, 2); /* the registry and the scheduler */
    atomic_init(&cl->stop, STOP_NONE);
    atomic_init(&cl->present, true);
    cl->started = false; /* no thread of its own: the scheduler runs it */
    if (!sched_add(cl)) {
        atomic_store(&cl->refs, 1);
        dm_claim_unref(cl);
        return NULL;
    }
    return cl;
}

/* ---- ack routing (NATS callbacks: parse, look up, enqueue; never block) ------------------------- */

/* ev->reply (if any) keeps the caller's reference; each queued event takes one more. */
static void route(fx_daemon *d, const char *chan, const char *claim, const dm_ev *ev, bool invalid)
{
    pthread_rwlock_rdlock(&d->reg);
    dm_chan *ch = dm_find_chan_locked(d, chan);
    if (!ch) {
        pthread_rwlock_unlock(&d->reg);
        fx_metric_inc(invalid ? d->g_invalid_acks : d->g_stale_acks, 1);
        return;
    }
    if (invalid) {
        fx_metric_inc(ch->m.invalid_acks, 1);
        pthread_rwlock_unlock(&d->reg);
        return;
    }
    bool routed = false;
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
        if (strcmp(cl->token, claim) != 0 || atomic_load(&cl->finished)) continue;
        routed = true;
        if (ev->reply) atomic_fetch_add(&ev->reply->refs, 1);
        if (!ev_push(cl, ev)) {
            if (ev->reply) atomic_fetch_sub(&ev->reply->refs, 1); /* ours is still held */
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "claim %s: ack queue full: ack dropped",
                               cl->subject);
            fx_metric_inc(d->g_acks_dropped, 1);
        }
    }
    pthread_rwlock_unlock(&d->reg);
    if (!routed) fx_metric_inc(d->g_stale_acks, 1);
}

void dm_on_ack(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    fx_ack_meta meta;
    const char *subj = natsMsg_GetSubject(m);
    char js[FX_JSACK_SUBJECT_MAX + 64];
    bool ok = false;
    if (subj && strncmp(subj, FX_DM_ACK_PREFIX, sizeof FX_DM_ACK_PREFIX - 1) == 0) {
        int n = snprintf(js, sizeof js, "%s%s", FX_DM_JS_ACK_PREFIX, subj + sizeof FX_DM_ACK_PREFIX - 1);
        ok = n > 0 && (size_t)n < sizeof js;
    } else if (subj && strncmp(subj, FX_DM_JS_ACK_PREFIX, sizeof FX_DM_JS_ACK_PREFIX - 1) == 0) {
        int n = snprintf(js, sizeof js, "%s", subj); /* an ack sent to the JetStream form */
        ok = n > 0 && (size_t)n < sizeof js;
    }
    if (!ok || fx_ack_subject_parse(js, &meta) != 0 || strcmp(meta.bridge, d->name) != 0) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "invalid ack subject ignored");
        fx_metric_inc(d->g_invalid_acks, 1);
        fx_metric_inc(d->g_invalid_control, 1);
        natsMsg_Destroy(m);
        return;
    }
    dm_ev ev = {.claim_seq = meta.claim_seq, .nonce = meta.nonce};
    bool invalid = false;
    if (natsMsg_IsNoResponders(m)) {
        ev.kind = EV_NORESP;
    } else {
        int64_t delay = 0;
        const char *data = natsMsg_GetData(m);
        int len = natsMsg_GetDataLength(m);
        fx_ack_kind k = fx_ack_body_parse(data ? data : "", len > 0 ? (size_t)len : 0, &delay);
        switch (k) {
        case FX_ACK_ACK: ev.kind = EV_ACK; break;
        case FX_ACK_NAK: ev.kind = EV_NAK; ev.delay_ns = delay; break;
        case FX_ACK_WPI: ev.kind = EV_WPI; break;
        case FX_ACK_TERM: ev.kind = EV_TERM; break;
        default: invalid = true; break;
        }
        if (invalid) {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "channel %s: invalid ack body ignored",
                               meta.channel);
        }
    }
    const char *rs = natsMsg_GetReply(m);
    if (ev.kind != EV_NORESP && rs && *rs)
        ev.reply = ackreply_new(rs); /* out of memory: the ack is still applied, unanswered */
    route(d, meta.channel, meta.claim, &ev, invalid);
    ackreply_done(d, ev.reply, false); /* the router's reference: error reply if nobody applied it */
    natsMsg_Destroy(m);
}

void dm_invalid_control(fx_daemon *d, const char *what)
{
    static fx_log_slot slot;
    fx_metric_inc(d->g_invalid_control, 1);
    fx_log_ratelimited(&slot, 10000, FX_LOG_WRN,
                       "%s the bridge did not cause ignored (fluxon_invalid_control_total)", what);
}

static bool parse_u64(const char *t, uint64_t *out)
{
    if (!t || *t < '0' || *t > '9') return false;
    char *end = NULL;
    *out = strtoull(t, &end, 10);
    return end && !*end;
}

/* "_FLUXON.NR.<bridge>.<channel>.<claim>.<claim seq>.<nonce>": only no-responders statuses matter;
 * anything else on this subject was not caused by the bridge. */
void dm_on_nr(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    const char *subj = natsMsg_GetSubject(m);
    if (!natsMsg_IsNoResponders(m) || !subj || strncmp(subj, FX_DM_NR_PREFIX, sizeof FX_DM_NR_PREFIX - 1)) {
        dm_invalid_control(d, "message on the no-responders subject");
        natsMsg_Destroy(m);
        return;
    }
    char buf[FX_JSACK_SUBJECT_MAX + 64];
    snprintf(buf, sizeof buf, "%s", subj + sizeof FX_DM_NR_PREFIX - 1);
    char *tok[5] = {0};
    char *save = NULL;
    int n = 0;
    for (char *t = strtok_r(buf, ".", &save); t && n < 6; t = strtok_r(NULL, ".", &save)) {
        if (n < 5) tok[n] = t;
        n++;
    }
    uint64_t cseq = 0, nonce = 0;
    if (n == 5 && strcmp(tok[0], d->name) == 0 && parse_u64(tok[3], &cseq) &&
        parse_u64(tok[4], &nonce) && nonce != 0) {
        dm_ev ev = {.kind = EV_NORESP, .claim_seq = cseq, .nonce = nonce};
        route(d, tok[1], tok[2], &ev, false);
    } else {
        dm_invalid_control(d, "no-responders status");
    }
    natsMsg_Destroy(m);
}

/* ---- interest thread --------------------------------------------------------------------------- */

/* fluxon_claims: claims that hold a sub-MPSC (consumer open) and are not being released. */
static size_t count_live(dm_chan *ch)
{
    size_t n = 0;
    for (dm_claim *cl = ch->claims; cl; cl = cl->next)
        if (atomic_load(&cl->stop) == STOP_NONE && atomic_load(&cl->holding)) n++;
    return n;
}

/* Called by the claim thread when its consumer opens or closes: refresh the gauge at once. */
static void set_holding(cst *s, bool h)
{
    atomic_store(&s->cl->holding, h);
    fx_daemon *d = s->d;
    pthread_rwlock_rdlock(&d->reg);
    size_t n = 0;
    for (dm_claim *cl = s->ch->claims; cl; cl = cl->next)
        if (atomic_load(&cl->stop) == STOP_NONE && atomic_load(&cl->holding)) n++;
    fx_metric_set(s->ch->m.claims, (int64_t)n);
    pthread_rwlock_unlock(&d->reg);
}

/* Release the claims whose interest has been gone for release_after (each at its own time, not at
 * the next poll: the wait of the interest thread is cut to the earliest due release). Returns the
 * monotonic time of the next due release, or INT64_MAX. Caller holds reg for writing. */
static int64_t release_due_locked(fx_daemon *d, int64_t now)
{
    int64_t next = INT64_MAX;
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        if (atomic_load(&ch->draining)) continue;
        for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
            if (atomic_load(&cl->stop) != STOP_NONE || atomic_load(&cl->present)) continue;
            int64_t due = cl->last_seen_ms + ch->s.release_after_ms;
            if (now >= due) {
                FX_INF("claim %s: no interest for %" PRId64 " ms: releasing", cl->subject,
                       now - cl->last_seen_ms);
                request_stop(cl, STOP_RELEASE);
            } else if (due < next) {
                next = due;
            }
        }
        fx_metric_set(ch->m.claims, (int64_t)count_live(ch));
    }
    return next;
}

static int64_t apply_interest(fx_daemon *d, const fx_interest *set)
{
    int64_t now = fx_now_ms();
    pthread_rwlock_wrlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        if (atomic_load(&ch->draining)) continue;
        for (size_t i = 0; i < set->n && !atomic_load(&d->stopping); i++) {
            const char *tok = fx_interest_claim_token(ch->deliver_prefix, set->subjects[i]);
            if (!tok || !fx_subject_token_valid(tok) || strlen(tok) >= sizeof ((dm_claim *)0)->token)
                continue;
            dm_claim *cl = ch->claims;
            while (cl && (strcmp(cl->token, tok) != 0 || atomic_load(&cl->stop) != STOP_NONE ||
                          atomic_load(&cl->noresp)))
                cl = cl->next;
            if (!cl) {
                cl = claim_new(ch, tok);
                if (!cl) {
                    FX_ERR("claim %s.%s: cannot start (out of resources)", ch->deliver_prefix, tok);
                    continue;
                }
                cl->next = ch->claims;
                ch->claims = cl;
                FX_INF("claim %s: interest appeared: claiming", cl->subject);
            }
            cl->last_seen_ms = now;
            atomic_store(&cl->present, true);
        }
        for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
            if (atomic_load(&cl->stop) != STOP_NONE || cl->last_seen_ms == now) continue;
            if (atomic_exchange(&cl->present, false))
                FX_DBG("claim %s: no subscriber seen", cl->subject);
        }
    }
    int64_t next = release_due_locked(d, now);
    pthread_rwlock_unlock(&d->reg);
    return next;
}

static void reap(fx_daemon *d)
{
    pthread_rwlock_wrlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        dm_claim **pp = &ch->claims;
        while (*pp) {
            dm_claim *cl = *pp;
            if (atomic_load(&cl->finished)) {
                *pp = cl->next;
                dm_claim_unref(cl);
            } else {
                pp = &cl->next;
            }
        }
        fx_metric_set(ch->m.claims, (int64_t)count_live(ch));
    }
    pthread_rwlock_unlock(&d->reg);
}

void *dm_interest_main(void *arg)
{
    fx_daemon *d = arg;
    char *url = NULL, *acc = NULL;
    pthread_mutex_lock(&d->cfg_mu);
    url = strdup(d->cfg->nats.monitor_url ? d->cfg->nats.monitor_url : "http://127.0.0.1:8222");
    acc = d->cfg->nats.account ? strdup(d->cfg->nats.account) : NULL;
    pthread_mutex_unlock(&d->cfg_mu);
    fx_log_slot slot = {0};
    bool failing = false;
    int64_t next_release = INT64_MAX;
    for (;;) {
        int64_t period = 1000;
        pthread_rwlock_rdlock(&d->reg);
        for (size_t c = 0; c < d->n_chans; c++)
            if (d->chans[c]->s.interest_poll_ms > 0 && d->chans[c]->s.interest_poll_ms < period)
                period = d->chans[c]->s.interest_poll_ms;
        pthread_rwlock_unlock(&d->reg);
        int64_t t0 = fx_now_ms();
        if (url && dm_nats_connected(d)) {
            uint64_t cid = 0;
            natsConnection_GetClientID(d->nc, &cid);
            fx_interest set = {0};
            fx_err e = fx_interest_fetch(url, acc, &cid, 1, 2000, &set);
            if (!e) {
                if (failing) FX_INF("interest: %s/subsz reachable again", url);
                failing = false;
                next_release = apply_interest(d, &set);
            } else {
                failing = true;
                fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "interest: poll failed: %s (%s)",
                                   fx_strerror(e), fx_err_detail());
            }
            fx_interest_free(&set);
        }
        reap(d);
        /* Until the next poll, wake for each release that falls due before it. */
        int64_t next_poll = t0 + period;
        bool stop = false;
        while (!stop) {
            int64_t now = fx_now_ms();
            int64_t until = next_release < next_poll ? next_release : next_poll;
            int64_t wait = until - now;
            stop = dm_bg_wait(d, wait > 10 ? wait : 10);
            if (stop || fx_now_ms() >= next_poll) break;
            pthread_rwlock_wrlock(&d->reg);
            next_release = release_due_locked(d, fx_now_ms());
            pthread_rwlock_unlock(&d->reg);
        }
        if (stop) break;
    }
    free(url);
    free(acc);
    return NULL;
}

void dm_claims_request_stop(fx_daemon *d, dm_chan *ch, int mode)
{
    pthread_rwlock_rdlock(&d->reg);
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) request_stop(cl, mode);
    pthread_rwlock_unlock(&d->reg);
}

void dm_claims_stop_all(fx_daemon *d, dm_chan *ch, int mode)
{
    dm_claims_request_stop(d, ch, mode);
    /* Only this thread changes ch->claims now (the interest thread is stopped or ch is retired). */
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
        /* run by the scheduler: wait for its last step (its release is bounded) */
        pthread_mutex_lock(&sched.mu);
        while (!atomic_load(&cl->finished)) {
            struct timespec ts = fx_deadline_ts(fx_now_ms() + 1000);
            pthread_cond_timedwait(&sched.fin_cv, &sched.mu, &ts);
        }
        pthread_mutex_unlock(&sched.mu);
    }
    pthread_rwlock_wrlock(&d->reg);
    dm_claim *list = ch->claims;
    ch->claims = NULL;
    pthread_rwlock_unlock(&d->reg);
    while (list) {
        dm_claim *nx = list->next;
        dm_claim_unref(list);
        list = nx;
    }
    fx_metric_set(ch->m.claims, 0);
}
