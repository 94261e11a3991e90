/* chanq_prod.c -- a channel's producer: open and keep attached, batches in flight as put jobs of
 * the executor (bridge/executor.h), completions in order per stream. Contract: chanq_prod.h.
 *
 * Thread rules: `mu` guards every slot's hand-over (busy and the batch fields while a batch is
 * handed over), n_busy, peak, the counters, reopen, stopping, open_err. `prod` is opened
 * and closed by the owner only, closed only while no slot is busy; a worker uses the producer it
 * was handed (slot->prod). A slot's batch (vals, ids, done) belongs to whoever stores it from the
 * hand-over until slot_done. */
#include "chanq_prod.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "fx_log.h"
#include "fx_time.h"

typedef struct slot {
    fx_chanq_prod *p;
    bool busy; /* handed a batch, its last completion not run yet */
    fx_mpmc_producer *prod;
    const fx_slice *vals;
    size_t n;
    int64_t deadline_ms;
    fx_chanq_done_fn done;
    void *arg;
    fx_mq_msg_id ids[FX_CHANQ_BATCH_MAX];
} slot;

struct fx_chanq_prod {
    fx_mq_client *c;
    char *name;
    fx_chanq_prod_cfg cfg; /* name points to `name` */
    unsigned bound;
    fx_exec *ex;      /* runs the put jobs: cfg.exec, or own_ex */
    fx_exec *own_ex;  /* a private one (cfg.exec NULL): kind FX_EXEC_K_PUT, `bound` threads */
    int kind;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* a slot went free; stopping */
    fx_mpmc_producer *prod;
    unsigned n_busy, peak;
    uint64_t submitted, refused, reopens;
    bool reopen, stopping;
    int64_t backoff_ms, next_open_ms;
    char open_err[320];
    fx_log_slot put_slot, open_slot;
    slot slots[FX_CHANQ_INFLIGHT_MAX];
};

fx_err fx_chanq_prod_new(fx_mq_client *c, const fx_chanq_prod_cfg *cfg, fx_chanq_prod **out)
{
    *out = NULL;
    if (!c || !cfg || !cfg->name || cfg->inflight > FX_CHANQ_INFLIGHT_MAX)
        return fx_seterr(FX_EINVAL, "chanq producer: bad configuration");
    fx_chanq_prod *p = calloc(1, sizeof *p);
    if (!p || !(p->name = strdup(cfg->name))) {
        free(p);
        return fx_seterr(FX_ENOMEM, "chanq producer: out of memory");
    }
    p->c = c;
    p->cfg = *cfg;
    p->cfg.name = p->name;
    p->bound = cfg->inflight ? cfg->inflight : FX_CHANQ_INFLIGHT;
    p->ex = cfg->exec;
    p->kind = cfg->exec ? cfg->exec_kind : FX_EXEC_K_PUT;
    if (!p->ex) {
        fx_exec_cfg ec = {.name = "chanq-put"};
        ec.kinds[FX_EXEC_K_PUT] = (fx_exec_kind_cfg){"put", p->bound, p->bound};
        fx_err e = fx_exec_new(&ec, &p->own_ex);
        if (e) {
            free(p->name);
            free(p);
            return e;
        }
        p->ex = p->own_ex;
    }
    pthread_mutex_init(&p->mu, NULL);
    fx_cond_init_monotonic(&p->cv);
    snprintf(p->open_err, sizeof p->open_err, "attaching");
    for (unsigned i = 0; i < FX_CHANQ_INFLIGHT_MAX; i++) p->slots[i].p = p;
    *out = p;
    return FX_OK;
}

/* ---- open, keep, close ------------------------------------------------------------------------ */

static fx_err resolve(fx_chanq_prod *p, int64_t *id)
{
    if (p->cfg.resolve) return p->cfg.resolve(p->cfg.resolve_arg, false, id);
    return fx_mpmc_resolve(p->c, p->name, &p->cfg.chan, id);
}

static void forget(fx_chanq_prod *p)
{
    int64_t unused;
    if (p->cfg.resolve) (void)p->cfg.resolve(p->cfg.resolve_arg, true, &unused);
}

/* Owner. Interrupts the puts in flight, waits for their slots, frees the producer. */
static void prod_close(fx_chanq_prod *p)
{
    if (!p->prod) return;
    fx_mpmc_producer_close(p->prod);
    pthread_mutex_lock(&p->mu);
    while (p->n_busy) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    fx_mpmc_producer *prod = p->prod;
    pthread_mutex_lock(&p->mu);
    p->prod = NULL;
    pthread_mutex_unlock(&p->mu);
    fx_mpmc_producer_free(prod);
}

static fx_err prod_open(fx_chanq_prod *p)
{
    if (p->prod) return FX_OK;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping && fx_ms_left(p->next_open_ms) > 0) { /* backoff, interrupted by stop */
        struct timespec ts = fx_deadline_ts(p->next_open_ms);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    int64_t id = -1;
    fx_mpmc_producer *prod = NULL;
    fx_err e = resolve(p, &id);
    if (!e) e = fx_mpmc_producer_open(p->c, id, 0, &prod);
    if (e) {
        bool held = fx_err_hold();
        forget(p);
        fx_err_release(held);
        const char *detail = fx_err_detail();
        p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : 100;
        if (p->backoff_ms > 2000) p->backoff_ms = 2000;
        pthread_mutex_lock(&p->mu);
        p->next_open_ms = fx_now_ms() + p->backoff_ms;
        snprintf(p->open_err, sizeof p->open_err, "%s (%s)", fx_strerror(e), detail);
        pthread_mutex_unlock(&p->mu);
        fx_log_ratelimited(&p->open_slot, 2000, FX_LOG_ERR,
                           "channel %s: cannot open producer: %s (%s)", p->name, fx_strerror(e),
                           detail);
        return e;
    }
    p->backoff_ms = 0;
    pthread_mutex_lock(&p->mu);
    p->next_open_ms = 0;
    p->prod = prod;
    pthread_mutex_unlock(&p->mu);
    FX_INF("channel %s: attached, producer open (member %" PRId64 ")", p->name,
           fx_mpmc_producer_member(prod));
    return FX_OK;
}

bool fx_chanq_prod_keep(fx_chanq_prod *p)
{
    pthread_mutex_lock(&p->mu);
    bool reopen = p->reopen, stopping = p->stopping;
    p->reopen = false;
    pthread_mutex_unlock(&p->mu);
    if (p->prod && (reopen || fx_mpmc_producer_check(p->prod) != FX_OK)) {
        if (!reopen)
            FX_WRN("channel %s: producer closed by itself (%s): reattaching", p->name,
                   fx_err_detail());
        prod_close(p);
        forget(p);
        pthread_mutex_lock(&p->mu);
        p->reopens++;
        snprintf(p->open_err, sizeof p->open_err, "reattaching");
        pthread_mutex_unlock(&p->mu);
    }
    if (!p->prod && !stopping) (void)prod_open(p);
    return p->prod != NULL;
}

bool fx_chanq_prod_attached(fx_chanq_prod *p, char *err, size_t cap)
{
    pthread_mutex_lock(&p->mu);
    bool open = p->prod != NULL;
    if (!open && err && cap) snprintf(err, cap, "%s", p->open_err);
    pthread_mutex_unlock(&p->mu);
    return open;
}

int64_t fx_chanq_prod_member(fx_chanq_prod *p)
{
    return p->prod ? fx_mpmc_producer_member(p->prod) : -1;
}

void fx_chanq_prod_stop(fx_chanq_prod *p)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* ---- batches in flight ------------------------------------------------------------------------ */

/* Store a slot's batch, run after run, each run answered before its sub-MPSC is released. */
static void store(fx_chanq_prod *p, slot *s)
{
    size_t n = s->n, done = 0;
    fx_err e = FX_OK;
    while (done < n) {
        int left = (int)fx_ms_left(s->deadline_ms);
        if (left <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "put deadline passed");
            break;
        }
        int wait = p->cfg.full_wait_ms < left ? (int)p->cfg.full_wait_ms : left;
        size_t np = 0;
        int64_t held = -1;
        e = fx_mpmc_put_hold(s->prod, s->vals + done, n - done, wait, &np, s->ids + done, &held);
        if (np > n - done) np = n - done;
        if (np) {
            fx_chanq_done d = {.first = done, .n = np, .ids = s->ids + done, .e = FX_OK};
            s->done(s->arg, &d);
        }
        fx_mpmc_put_release(s->prod, held); /* after the completions: in order per stream */
        done += np;
        if (!e && np) continue; /* the rest did not fit into that sub-MPSC */
        if (!e) {
            e = fx_seterr(FX_ESERVER, "put stored nothing");
            break;
        }
        if (e == FX_ELEASE_LOST || e == FX_ECLOSED) {
            FX_WRN("channel %s: producer closed (%s): reopening", p->name, fx_strerror(e));
            pthread_mutex_lock(&p->mu);
            p->reopen = true;
            pthread_mutex_unlock(&p->mu);
            break;
        }
        fx_log_ratelimited(&p->put_slot, 2000, e == FX_EFULL ? FX_LOG_WRN : FX_LOG_ERR,
                           "channel %s: put of %zu messages failed: %s (%s)", p->name, n - done,
                           fx_strerror(e), fx_err_detail());
        break;
    }
    fx_chanq_done d = {.first = done, .n = n - done, .e = done < n ? e : FX_OK, .last = true};
    s->done(s->arg, &d);
}

/* The slot's last completion ran: free it, wake a closer, tell the owner there is room. */
static void slot_done(fx_chanq_prod *p, slot *s)
{
    pthread_mutex_lock(&p->mu);
    s->busy = false;
    s->n = 0;
    s->vals = NULL;
    p->n_busy--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->cfg.on_room) p->cfg.on_room(p->cfg.room_arg);
}

/* The put job of a slot, on a thread of the executor's put kind. */
static void slot_work(void *arg)
{
    slot *s = arg;
    store(s->p, s);
}

/* After slot_work, or instead of it when the executor is freed first: the batch ends unstored. */
static void slot_job_done(void *arg, bool cancelled)
{
    slot *s = arg;
    if (cancelled) {
        fx_chanq_done d = {.first = 0, .n = s->n, .e = FX_ECANCELED, .last = true};
        s->done(s->arg, &d);
    }
    slot_done(s->p, s);
}

/* Owner: batches in flight at once now, one per ready sub-MPSC, at most the bound. */
static unsigned limit_now(fx_chanq_prod *p)
{
    size_t ready = p->prod ? fx_mpmc_producer_ready(p->prod) : 0;
    if (ready < 1) return 1;
    return ready < p->bound ? (unsigned)ready : p->bound;
}

unsigned fx_chanq_prod_room(fx_chanq_prod *p)
{
    unsigned limit = limit_now(p);
    pthread_mutex_lock(&p->mu);
    unsigned room = p->n_busy < limit ? limit - p->n_busy : 0;
    pthread_mutex_unlock(&p->mu);
    return room;
}

size_t fx_chanq_prod_streams(fx_chanq_prod *p)
{
    return p->prod ? fx_mpmc_producer_ready(p->prod) : 0;
}

fx_err fx_chanq_submit(fx_chanq_prod *p, const fx_slice *values, size_t n, int64_t deadline_ms,
                       fx_chanq_done_fn done, void *arg)
{
    if (!n || n > FX_CHANQ_BATCH_MAX || !values || !done)
        return fx_seterr(FX_EINVAL, "chanq submit: %zu values (1 to %d, with a callback)", n,
                         FX_CHANQ_BATCH_MAX);
    fx_err e = prod_open(p);
    if (e) return e;
    unsigned limit = limit_now(p);
    pthread_mutex_lock(&p->mu);
    slot *s = NULL;
    if (p->n_busy < limit) /* the bound; the slots (FX_CHANQ_INFLIGHT_MAX) are never the limit */
        for (unsigned i = 0; i < FX_CHANQ_INFLIGHT_MAX && !s; i++)
            if (!p->slots[i].busy) s = &p->slots[i];
    if (!s) {
        p->refused++;
        unsigned busy = p->n_busy;
        pthread_mutex_unlock(&p->mu);
        return fx_seterr(FX_EFULL, "channel %s: %u batches in flight (bound %u now)", p->name,
                         busy, limit);
    }
    s->prod = p->prod;
    s->vals = values;
    s->n = n;
    s->deadline_ms = deadline_ms;
    s->done = done;
    s->arg = arg;
    s->busy = true;
    p->n_busy++;
    p->submitted++;
    if (p->n_busy > p->peak) p->peak = p->n_busy;
    /* One batch at most in flight: store it here, no thread hop on the one-at-a-time path. */
    bool here = limit <= 1 && p->n_busy == 1;
    pthread_mutex_unlock(&p->mu);
    if (here) {
        store(p, s);
        slot_done(p, s);
        return FX_OK;
    }
    e = fx_exec_submit(p->ex, p->kind, slot_work, slot_job_done, s);
    if (e) { /* the executor's put queue is full, or it is stopping: not taken */
        pthread_mutex_lock(&p->mu);
        s->busy = false;
        s->vals = NULL;
        p->n_busy--;
        p->submitted--;
        if (e == FX_EFULL) p->refused++;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        return e;
    }
    return FX_OK;
}

void fx_chanq_prod_stats_get(fx_chanq_prod *p, fx_chanq_prod_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = (fx_chanq_prod_stats){.in_flight = p->n_busy, .peak = p->peak,
                                 .submitted = p->submitted, .refused = p->refused,
                                 .reopens = p->reopens};
    pthread_mutex_unlock(&p->mu);
}

void fx_chanq_prod_free(fx_chanq_prod *p)
{
    if (!p) return;
    prod_close(p);
    pthread_mutex_lock(&p->mu);
    while (p->n_busy) pthread_cond_wait(&p->cv, &p->mu); /* never opened: nothing in flight */
    pthread_mutex_unlock(&p->mu);
    fx_exec_free(p->own_ex); /* idle: joins its threads */
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->name);
    free(p);
}
