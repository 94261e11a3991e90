/* chanq_keeper.c -- the keeper of the consumed channels: views, reclaim of idle parts, release
 * watch, resolve cache and the consumers' slow jobs (on the executor). Contract: chanq_keeper.h, chanq_int.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "chanq_int.h"
#include "fx_log.h"
#include "fx_time.h"
#include "inspect.h"

struct fx_chanq_keeper {
    fx_mq_client *mq;
    void (*on_reclaim)(void *arg, const char *name);
    void *arg;
    pthread_mutex_t mu; /* chans, kick, stop */
    pthread_cond_t cv;  /* the keeper thread (monotonic) */
    fx__chanq_chan **chans;
    size_t n_chans, cap_chans;
    bool kick, stop;
    pthread_t thr;
    bool started;
    fx_exec *ex;        /* borrowed */
    size_t jobs;        /* slow jobs submitted, not done (under mu) */
    pthread_cond_t jobs_cv; /* jobs reached 0 (monotonic) */
    atomic_bool stopping;
};

/* ---- slow jobs ------------------------------------------------------------------------------------ */

static void job_end(fx_chanq_keeper *k)
{
    pthread_mutex_lock(&k->mu);
    if (--k->jobs == 0) pthread_cond_broadcast(&k->jobs_cv);
    pthread_mutex_unlock(&k->mu);
}

/* fn may free j: the keeper is read first. */
static void job_work(void *arg)
{
    fx__chanq_job *j = arg;
    fx_chanq_keeper *k = j->k;
    j->fn(j);
    job_end(k);
}

static void job_done(void *arg, bool cancelled)
{
    if (cancelled) job_work(arg); /* the executor was freed first: the job runs here (bounded) */
}

bool fx__chanq_post(fx_chanq_keeper *k, fx__chanq_job *j)
{
    j->k = k;
    pthread_mutex_lock(&k->mu);
    k->jobs++;
    pthread_mutex_unlock(&k->mu);
    fx_err e = fx_exec_submit(k->ex, FX_EXEC_K_CHANQ, job_work, job_done, j);
    if (!e) return true;
    job_end(k);
    static fx_log_slot slot;
    fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "keeper: a consumer job was refused by the "
                       "executor (%s): run in place or retried", fx_strerror(e));
    return false;
}

bool fx__chanq_stopping(fx_chanq_keeper *k) { return atomic_load(&k->stopping); }

fx_mq_client *fx__chanq_mq(fx_chanq_keeper *k) { return k->mq; }

fx_exec *fx__chanq_exec(fx_chanq_keeper *k) { return k->ex; }

/* ---- channel entries ------------------------------------------------------------------------------ */

static fx__chanq_chan *chan_find_locked(fx_chanq_keeper *k, const char *name)
{
    for (size_t i = 0; i < k->n_chans; i++)
        if (strcmp(k->chans[i]->name, name) == 0) return k->chans[i];
    return NULL;
}

static fx__chanq_chan *chan_add_locked(fx_chanq_keeper *k, const char *name)
{
    fx__chanq_chan *ch = chan_find_locked(k, name);
    if (ch) return ch;
    if (k->n_chans == k->cap_chans) {
        size_t nc = k->cap_chans ? k->cap_chans * 2 : 16;
        fx__chanq_chan **nv = realloc(k->chans, nc * sizeof *nv);
        if (!nv) return NULL;
        k->chans = nv;
        k->cap_chans = nc;
    }
    ch = calloc(1, sizeof *ch);
    if (!ch || !(ch->name = strdup(name))) {
        free(ch);
        return NULL;
    }
    pthread_mutex_init(&ch->mu, NULL);
    ch->due = true; /* a first view at once */
    k->chans[k->n_chans++] = ch;
    k->kick = true;
    pthread_cond_broadcast(&k->cv);
    return ch;
}

fx__chanq_chan *fx__chanq_chan_get(fx_chanq_keeper *k, const char *name)
{
    pthread_mutex_lock(&k->mu);
    fx__chanq_chan *ch = chan_add_locked(k, name);
    if (ch) ch->consumers++;
    pthread_mutex_unlock(&k->mu);
    return ch;
}

void fx__chanq_chan_put(fx_chanq_keeper *k, fx__chanq_chan *ch)
{
    pthread_mutex_lock(&k->mu);
    ch->consumers--;
    pthread_mutex_unlock(&k->mu);
}

fx_err fx__chanq_resolve(fx_chanq_keeper *k, fx__chanq_chan *ch, const fx_mq_chan_cfg *cfg,
                         int64_t *out)
{
    pthread_mutex_lock(&ch->mu);
    if (ch->have_mpmc) {
        *out = ch->mpmc;
        pthread_mutex_unlock(&ch->mu);
        return FX_OK;
    }
    pthread_mutex_unlock(&ch->mu);
    int64_t id = -1;
    fx_err e = fx_mpmc_resolve(k->mq, ch->name, cfg, &id);
    if (e) return e;
    pthread_mutex_lock(&ch->mu);
    ch->mpmc = id;
    ch->have_mpmc = true;
    pthread_mutex_unlock(&ch->mu);
    *out = id;
    return FX_OK;
}

void fx__chanq_forget(fx__chanq_chan *ch)
{
    pthread_mutex_lock(&ch->mu);
    ch->have_mpmc = false;
    pthread_mutex_unlock(&ch->mu);
}

/* ---- views ---------------------------------------------------------------------------------------- */

/* Reclaim idle parts a dead process left (a consumer's own close reclaims its part, a killed
 * one cannot). fx_mpmc_reclaim re-checks everything in one txn and keeps a part the remaining
 * consumers need, so a stale view only costs a read. */
static void reclaim(fx_chanq_keeper *k, fx__chanq_chan *ch, int64_t mpmc, const int64_t *idle,
                    size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bool removed = false;
        fx_err e = fx_mpmc_reclaim(k->mq, mpmc, idle[i], &removed);
        if (e) {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 30000, FX_LOG_WRN, "channel %s: reclaim of idle sub-MPSC %"
                               PRId64 ": %s (%s)", ch->name, idle[i], fx_strerror(e),
                               fx_err_detail());
            return;
        }
        if (!removed) return; /* kept: the rest is needed too (or changed meanwhile) */
        pthread_mutex_lock(&ch->mu);
        ch->reclaimed++;
        pthread_mutex_unlock(&ch->mu);
        if (k->on_reclaim) k->on_reclaim(k->arg, ch->name);
        FX_INF("channel %s: reclaimed idle sub-MPSC %" PRId64 " (no consumer, no backlog)",
               ch->name, idle[i]);
    }
}

/* One channel's view at one etcd revision: backlog, the parts holding a departed consumer's
 * backlog (unready, no consumer bound, messages waiting; an unready one with a consumer is being
 * drained by one that adopted it), the consumed ones with their backlog, the idle ones. */
static void chan_view(fx_chanq_keeper *k, fx__chanq_chan *ch)
{
    fx_mq_channel_info info;
    if (fx_mq_inspect_channel(k->mq, ch->name, &info)) return; /* etcd down: keep the old view */
    if (!info.mapped || !info.has_meta) {
        pthread_mutex_lock(&ch->mu);
        ch->known = true;
        if (!info.mapped) ch->backlog = 0;
        pthread_mutex_unlock(&ch->mu);
        fx_mq_channel_info_free(&info);
        return;
    }
    int64_t stranded[FX_CHANQ_STRANDED_MAX], idle[FX_CHANQ_RECLAIM_SWEEP];
    int64_t *held = malloc(FX_CHANQ_HELD_MAX * 2 * sizeof *held);
    if (!held) {
        fx_mq_channel_info_free(&info);
        return;
    }
    int64_t *held_bl = held + FX_CHANQ_HELD_MAX;
    size_t ns = 0, nh = 0, ni = 0;
    for (size_t i = 0; i < info.n_subs; i++) {
        const fx_mq_sub_mpsc_info *sm = &info.subs[i];
        if (sm->ready && nh < FX_CHANQ_HELD_MAX) {
            held[nh] = sm->chan_id;
            held_bl[nh++] = sm->backlog;
        }
        if (sm->ready || sm->consumers > 0) continue;
        if (sm->backlog > 0 && ns < FX_CHANQ_STRANDED_MAX) stranded[ns++] = sm->chan_id;
        if (sm->backlog == 0 && ni < FX_CHANQ_RECLAIM_SWEEP) idle[ni++] = sm->chan_id;
    }
    /* Idle ones beyond what the consumers need (one stays for store-and-forward). */
    size_t need = info.n_consumers > 0 ? info.n_consumers : 1;
    bool sweep = !info.truncated && info.n_subs > need;
    int64_t mpmc = info.mpmc_id;
    pthread_mutex_lock(&ch->mu);
    ch->known = true;
    ch->backlog = info.backlog;
    bool changed = ns != ch->n_stranded || memcmp(stranded, ch->stranded, ns * sizeof *stranded);
    memcpy(ch->stranded, stranded, ns * sizeof *stranded);
    ch->n_stranded = ns;
    memcpy(ch->held, held, nh * sizeof *held);
    memcpy(ch->held_backlog, held_bl, nh * sizeof *held_bl);
    ch->n_held = nh;
    if (changed || ns) ch->view_gen++;
    pthread_mutex_unlock(&ch->mu);
    free(held);
    fx_mq_channel_info_free(&info);
    if (sweep && ni) reclaim(k, ch, mpmc, idle, ni);
}

/* Refresh the kept channels: all, or only the kicked ones. */
static void views(fx_chanq_keeper *k, bool all)
{
    pthread_mutex_lock(&k->mu);
    size_t n = k->n_chans;
    fx__chanq_chan **list = n ? malloc(n * sizeof *list) : NULL;
    size_t m = 0;
    for (size_t i = 0; list && i < n; i++) {
        fx__chanq_chan *ch = k->chans[i];
        bool due = ch->due;
        ch->due = false;
        if ((all || due) && (ch->named || ch->consumers > 0)) list[m++] = ch;
    }
    pthread_mutex_unlock(&k->mu);
    for (size_t i = 0; i < m; i++) {
        pthread_mutex_lock(&k->mu);
        bool stop = k->stop;
        pthread_mutex_unlock(&k->mu);
        if (stop) break;
        chan_view(k, list[i]);
    }
    free(list);
}

/* A ready key of MPMC `mpmc` was deleted (a consumer released, anywhere): kick its channel. */
static void on_release(void *arg, int64_t mpmc)
{
    fx_chanq_keeper *k = arg;
    pthread_mutex_lock(&k->mu);
    bool hit = false;
    for (size_t i = 0; i < k->n_chans; i++) {
        fx__chanq_chan *ch = k->chans[i];
        pthread_mutex_lock(&ch->mu);
        bool h = ch->have_mpmc && ch->mpmc == mpmc;
        pthread_mutex_unlock(&ch->mu);
        if (h) ch->due = hit = true;
    }
    if (hit) {
        k->kick = true;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
}

static void *keeper_main(void *arg)
{
    fx_thread_name("fx-keeper");
    fx_chanq_keeper *k = arg;
    int64_t next_all = 0, next_watch = 0, last_kick = 0;
    bool kicked = false;
    fx_mq_release_watch *rw = NULL;
    for (;;) {
        int64_t now = fx_now_ms();
        if (!rw && now >= next_watch) {
            if (fx_mq_release_watch_start(k->mq, on_release, k, FX_CHANQ_WATCH_START_MS, &rw)) {
                static fx_log_slot slot;
                fx_log_ratelimited(&slot, 30000, FX_LOG_WRN, "release watch: %s (retrying; the "
                                   "sub-MPSC view is refreshed every %d ms meanwhile)",
                                   fx_err_detail(), FX_CHANQ_VIEW_MS);
                rw = NULL;
            }
            next_watch = fx_now_ms() + 1000;
        }
        now = fx_now_ms();
        if (now >= next_all) {
            views(k, true);
            next_all = fx_now_ms() + FX_CHANQ_VIEW_MS;
        } else if (kicked && now >= last_kick + FX_CHANQ_KICK_MIN_MS) {
            kicked = false;
            last_kick = now;
            views(k, false);
        }
        pthread_mutex_lock(&k->mu);
        int64_t until = next_all;
        if (!rw && next_watch < until) until = next_watch;
        if (kicked && last_kick + FX_CHANQ_KICK_MIN_MS < until) until = last_kick + FX_CHANQ_KICK_MIN_MS;
        while (!k->stop && !k->kick && fx_ms_left(until) > 0) {
            struct timespec ts = fx_deadline_ts(until);
            pthread_cond_timedwait(&k->cv, &k->mu, &ts);
        }
        bool stop = k->stop;
        if (k->kick) { /* at most one kicked refresh per FX_CHANQ_KICK_MIN_MS */
            k->kick = false;
            kicked = true;
        }
        pthread_mutex_unlock(&k->mu);
        if (stop) break;
    }
    fx_mq_release_watch_stop(rw);
    return NULL;
}

/* ---- API ------------------------------------------------------------------------------------------ */

fx_err fx_chanq_keeper_new(fx_mq_client *mq, fx_exec *ex,
                           void (*on_reclaim)(void *arg, const char *name), void *arg,
                           fx_chanq_keeper **out)
{
    *out = NULL;
    fx_chanq_keeper *k = calloc(1, sizeof *k);
    if (!k) return fx_seterr(FX_ENOMEM, "keeper");
    k->mq = mq;
    k->ex = ex;
    k->on_reclaim = on_reclaim;
    k->arg = arg;
    pthread_mutex_init(&k->mu, NULL);
    fx_cond_init_monotonic(&k->cv);
    fx_cond_init_monotonic(&k->jobs_cv);
    atomic_init(&k->stopping, false);
    bool ok = pthread_create(&k->thr, NULL, keeper_main, k) == 0;
    k->started = ok;
    if (!ok) {
        fx_chanq_keeper_free(k);
        return fx_seterr(FX_ENOMEM, "cannot start the keeper's thread");
    }
    *out = k;
    return FX_OK;
}

void fx_chanq_keeper_free(fx_chanq_keeper *k)
{
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (k->started) pthread_join(k->thr, NULL);
    atomic_store(&k->stopping, true);
    /* the queued closes run to their end (each bounded by its etcd deadlines) */
    pthread_mutex_lock(&k->mu);
    while (k->jobs > 0) {
        struct timespec ts = fx_deadline_ts(fx_now_ms() + 1000);
        pthread_cond_timedwait(&k->jobs_cv, &k->mu, &ts);
    }
    pthread_mutex_unlock(&k->mu);
    for (size_t i = 0; i < k->n_chans; i++) {
        fx__chanq_chan *ch = k->chans[i];
        if (ch->consumers > 0)
            FX_WRN("channel %s: %d consumer(s) still open when the keeper stopped", ch->name,
                   ch->consumers);
        pthread_mutex_destroy(&ch->mu);
        free(ch->name);
        free(ch);
    }
    free(k->chans);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    pthread_cond_destroy(&k->jobs_cv);
    free(k);
}

void fx_chanq_keeper_set_channels(fx_chanq_keeper *k, const char *const *names, size_t n)
{
    pthread_mutex_lock(&k->mu);
    for (size_t i = 0; i < k->n_chans; i++) k->chans[i]->named = false;
    for (size_t i = 0; i < n; i++) {
        fx__chanq_chan *ch = chan_add_locked(k, names[i]);
        if (ch) ch->named = true;
    }
    pthread_mutex_unlock(&k->mu);
}

void fx_chanq_keeper_kick(fx_chanq_keeper *k, const char *name)
{
    pthread_mutex_lock(&k->mu);
    fx__chanq_chan *ch = chan_find_locked(k, name);
    if (ch) {
        ch->due = true;
        k->kick = true;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
}

bool fx_chanq_keeper_stats(fx_chanq_keeper *k, const char *name, fx_chanq_chan_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&k->mu);
    fx__chanq_chan *ch = chan_find_locked(k, name);
    pthread_mutex_unlock(&k->mu);
    if (!ch) return false;
    pthread_mutex_lock(&ch->mu);
    out->known = ch->known;
    out->backlog = ch->backlog;
    out->reclaimed = ch->reclaimed;
    pthread_mutex_unlock(&ch->mu);
    return true;
}
