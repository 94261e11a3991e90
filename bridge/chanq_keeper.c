/* chanq_keeper.c -- the keeper of the consumed channels: views, reclaim of idle parts, release
 * watch, resolve cache and the job lanes. Contract: chanq_keeper.h, chanq_int.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "chanq_int.h"
#include "fx_log.h"
#include "fx_time.h"
#include "inspect.h"

typedef struct lane {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* monotonic */
    fx__chanq_job *head, *tail;
    bool stop;  /* run what is queued, then exit */
    bool closed; /* no more posts */
    pthread_t thr[FX_CHANQ_SLOW_THREADS > FX_CHANQ_WRITE_THREADS ? FX_CHANQ_SLOW_THREADS
                                                                  : FX_CHANQ_WRITE_THREADS];
    size_t n_thr;
} lane;

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
    lane lanes[FX__CHANQ_LANES];
    atomic_bool stopping;
};

/* ---- lanes -------------------------------------------------------------------------------------- */

typedef struct lane_arg {
    fx_chanq_keeper *k;
    int lane;
} lane_arg;

static fx__chanq_job *lane_pop_locked(lane *l, int64_t *until)
{
    int64_t now = fx_now_ms();
    *until = now + 1000;
    fx__chanq_job *prev = NULL;
    for (fx__chanq_job *j = l->head; j; prev = j, j = j->next) {
        if (l->stop || j->not_before <= now) {
            if (prev) prev->next = j->next;
            else l->head = j->next;
            if (l->tail == j) l->tail = prev;
            j->queued = false;
            j->next = NULL;
            return j;
        }
        if (j->not_before < *until) *until = j->not_before;
    }
    return NULL;
}

static void *lane_main(void *arg)
{
    lane_arg *a = arg;
    lane *l = &a->k->lanes[a->lane];
    free(a);
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int64_t until = 0;
        fx__chanq_job *j = lane_pop_locked(l, &until);
        if (!j) {
            if (l->stop) break;
            struct timespec ts = fx_deadline_ts(until);
            pthread_cond_timedwait(&l->cv, &l->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        j->fn(j);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

bool fx__chanq_post(fx_chanq_keeper *k, int ln, fx__chanq_job *j)
{
    lane *l = &k->lanes[ln];
    pthread_mutex_lock(&l->mu);
    bool ok = !l->closed;
    if (ok && !j->queued) {
        j->queued = true;
        j->next = NULL;
        if (l->tail) l->tail->next = j;
        else l->head = j;
        l->tail = j;
        pthread_cond_signal(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}

bool fx__chanq_unpost(fx_chanq_keeper *k, int ln, fx__chanq_job *j)
{
    lane *l = &k->lanes[ln];
    pthread_mutex_lock(&l->mu);
    bool was = j->queued;
    if (was) {
        fx__chanq_job *prev = NULL, *x = l->head;
        while (x && x != j) {
            prev = x;
            x = x->next;
        }
        if (x) {
            if (prev) prev->next = j->next;
            else l->head = j->next;
            if (l->tail == j) l->tail = prev;
        }
        j->queued = false;
        j->next = NULL;
    }
    pthread_mutex_unlock(&l->mu);
    return was;
}

bool fx__chanq_stopping(fx_chanq_keeper *k) { return atomic_load(&k->stopping); }

fx_mq_client *fx__chanq_mq(fx_chanq_keeper *k) { return k->mq; }

static bool lane_start(fx_chanq_keeper *k, int ln, size_t n)
{
    lane *l = &k->lanes[ln];
    pthread_mutex_init(&l->mu, NULL);
    fx_cond_init_monotonic(&l->cv);
    for (size_t i = 0; i < n; i++) {
        lane_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->k = k;
        a->lane = ln;
        if (pthread_create(&l->thr[l->n_thr], NULL, lane_main, a) != 0) {
            free(a);
            break;
        }
        l->n_thr++;
    }
    return l->n_thr > 0;
}

/* Run what is queued (not-before times ignored), then join. */
static void lane_stop(fx_chanq_keeper *k, int ln)
{
    lane *l = &k->lanes[ln];
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    for (size_t i = 0; i < l->n_thr; i++) pthread_join(l->thr[i], NULL);
    pthread_mutex_lock(&l->mu);
    l->closed = true;
    l->n_thr = 0;
    fx__chanq_job *rest = l->head; /* posted after the threads left: dropped (none expected) */
    l->head = l->tail = NULL;
    pthread_mutex_unlock(&l->mu);
    for (; rest; rest = rest->next) rest->queued = false;
}

static void lane_destroy(lane *l)
{
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
}

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

fx_err fx_chanq_keeper_new(fx_mq_client *mq, void (*on_reclaim)(void *arg, const char *name),
                           void *arg, fx_chanq_keeper **out)
{
    *out = NULL;
    fx_chanq_keeper *k = calloc(1, sizeof *k);
    if (!k) return fx_seterr(FX_ENOMEM, "keeper");
    k->mq = mq;
    k->on_reclaim = on_reclaim;
    k->arg = arg;
    pthread_mutex_init(&k->mu, NULL);
    fx_cond_init_monotonic(&k->cv);
    atomic_init(&k->stopping, false);
    bool ok = lane_start(k, FX__CHANQ_SLOW, FX_CHANQ_SLOW_THREADS);
    ok = lane_start(k, FX__CHANQ_WRITE, FX_CHANQ_WRITE_THREADS) && ok;
    if (ok) ok = pthread_create(&k->thr, NULL, keeper_main, k) == 0;
    k->started = ok;
    if (!ok) {
        fx_chanq_keeper_free(k);
        return fx_seterr(FX_ENOMEM, "cannot start the keeper's threads");
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
    lane_stop(k, FX__CHANQ_SLOW); /* closes may wait for their last attempt writes */
    lane_stop(k, FX__CHANQ_WRITE);
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
    for (int l = 0; l < FX__CHANQ_LANES; l++) lane_destroy(&k->lanes[l]);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
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
