/* executor.c -- kinds of job with bounded queues, strands and timed kicks. Contract: executor.h;
 * rules: docs/EXECUTOR.md.
 *
 * One mutex (ex->mu) guards everything: the run queues of the kinds, the strands' job lists and
 * flags, the timer heap and the counters. Work, done and step callbacks run without it. A kind's
 * run queue holds nodes: a plain job, or a strand that has something to run (then the strand's
 * own FIFO says what). A strand is in its kind's run queue at most once (in_runq) and never while
 * it runs (running): that is what makes it serial.
 */
#include "executor.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"

typedef struct node {
    struct node *next;
    fx_exec_strand *strand; /* NULL: this node is a plain job */
} node;

typedef struct job {
    node n; /* in a kind's run queue (plain job) or in a strand's FIFO */
    fx_exec_work_fn work;
    fx_exec_done_fn done;
    void *arg;
} job;

typedef struct kind {
    fx_exec *ex;
    int idx;
    fx_exec_kind_cfg cfg;
    node *head, *tail; /* run queue */
    size_t n_items;    /* nodes in the run queue */
    unsigned idle;     /* threads waiting on cv */
    pthread_cond_t cv;
    pthread_t *thr;
    unsigned n_thr;
    fx_exec_stats st;
} kind;

struct fx_exec_strand {
    node n; /* n.strand == this strand: its entry in the kind's run queue */
    fx_exec *ex; /* NULL once the executor was freed (detached) */
    int kind;
    fx_exec_step_fn step;
    void *arg;
    job *jhead, *jtail; /* queued jobs, oldest first */
    bool in_runq, running, step_pending, closing, free_on_return;
    pthread_t runner; /* valid while running */
    int64_t timer_due;
    size_t heap_pos; /* valid while timer_armed */
    bool timer_armed;
    pthread_cond_t cv; /* running ended (fx_exec_strand_free waits on it) */
    fx_exec_strand *prev, *next; /* all strands of the executor */
};

struct fx_exec {
    char name[32];
    pthread_mutex_t mu;
    bool stopping;
    pthread_cond_t stop_cv; /* monotonic: fx_exec_wait_ms */
    kind k[FX_EXEC_MAX_KINDS];
    /* timers: min-heap by timer_due of the strands with an armed timer */
    fx_exec_strand **heap;
    size_t heap_n, heap_cap;
    pthread_cond_t tcv; /* monotonic */
    pthread_t tthr;
    bool t_started;
    fx_exec_strand *strands;
};

void fx_exec_cfg_defaults(fx_exec_cfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->name = "fx";
    cfg->kinds[FX_EXEC_K_COMMIT] = (fx_exec_kind_cfg){"commit", 4096, 4};
    cfg->kinds[FX_EXEC_K_REVOKE] = (fx_exec_kind_cfg){"revoke", 256, 1};
    cfg->kinds[FX_EXEC_K_CLAIM] = (fx_exec_kind_cfg){"claim", 65536, 8};
    cfg->kinds[FX_EXEC_K_WRITE] = (fx_exec_kind_cfg){"write", 65536, 4};
    cfg->kinds[FX_EXEC_K_PUT] = (fx_exec_kind_cfg){"put", 65536, 32};
    cfg->kinds[FX_EXEC_K_CHANQ] = (fx_exec_kind_cfg){"chanq", 4096, 6};
}

/* ---- run queues and threads (under ex->mu) ---------------------------------------------------- */

static void *worker_main(void *arg);

static void runq_push(kind *k, node *n)
{
    n->next = NULL;
    if (k->tail) k->tail->next = n;
    else k->head = n;
    k->tail = n;
    k->n_items++;
    /* One more thread when every idle one is already spoken for. */
    if (k->n_items > k->idle && k->n_thr < k->cfg.threads_max) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker_main, k) == 0) {
            k->thr[k->n_thr++] = t;
            k->st.threads = k->n_thr;
        } else if (k->n_thr == 0) {
            FX_ERR("executor %s: kind %s: cannot start a thread; its queue waits", k->ex->name,
                   k->cfg.name);
        }
    }
    pthread_cond_signal(&k->cv);
}

static node *runq_pop(kind *k)
{
    node *n = k->head;
    if (!n) return NULL;
    k->head = n->next;
    if (!k->head) k->tail = NULL;
    k->n_items--;
    n->next = NULL;
    return n;
}

static void runq_remove(kind *k, node *n)
{
    node *prev = NULL;
    for (node *it = k->head; it; prev = it, it = it->next) {
        if (it != n) continue;
        if (prev) prev->next = it->next;
        else k->head = it->next;
        if (k->tail == it) k->tail = prev;
        k->n_items--;
        it->next = NULL;
        return;
    }
}

static void note_queued(kind *k)
{
    k->st.queued++;
    if (k->st.queued > k->st.peak_queued) k->st.peak_queued = k->st.queued;
}

static void note_running(kind *k)
{
    k->st.running++;
    if (k->st.running > k->st.peak_running) k->st.peak_running = k->st.running;
}

static void schedule_strand(fx_exec_strand *s)
{
    if (s->in_runq || s->running) return;
    s->in_runq = true;
    runq_push(&s->ex->k[s->kind], &s->n);
}

/* ---- timers (under ex->mu) -------------------------------------------------------------------- */

static void heap_set(fx_exec *ex, size_t i, fx_exec_strand *s)
{
    ex->heap[i] = s;
    s->heap_pos = i;
}

static void heap_up(fx_exec *ex, size_t i)
{
    fx_exec_strand *s = ex->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (ex->heap[p]->timer_due <= s->timer_due) break;
        heap_set(ex, i, ex->heap[p]);
        i = p;
    }
    heap_set(ex, i, s);
}

static void heap_down(fx_exec *ex, size_t i)
{
    fx_exec_strand *s = ex->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= ex->heap_n) break;
        if (c + 1 < ex->heap_n && ex->heap[c + 1]->timer_due < ex->heap[c]->timer_due) c++;
        if (s->timer_due <= ex->heap[c]->timer_due) break;
        heap_set(ex, i, ex->heap[c]);
        i = c;
    }
    heap_set(ex, i, s);
}

static void timer_disarm(fx_exec *ex, fx_exec_strand *s)
{
    if (!s->timer_armed) return;
    s->timer_armed = false;
    size_t i = s->heap_pos;
    ex->heap_n--;
    if (i == ex->heap_n) return;
    fx_exec_strand *m = ex->heap[ex->heap_n];
    heap_set(ex, i, m);
    heap_up(ex, i);
    heap_down(ex, m->heap_pos);
}

static void step_now(fx_exec_strand *s)
{
    timer_disarm(s->ex, s);
    s->step_pending = true;
    schedule_strand(s);
}

static void *timer_main(void *arg)
{
    fx_thread_name("fx-exec-timer");
    fx_exec *ex = arg;
    pthread_mutex_lock(&ex->mu);
    while (!ex->stopping) {
        if (ex->heap_n == 0) {
            pthread_cond_wait(&ex->tcv, &ex->mu);
            continue;
        }
        fx_exec_strand *s = ex->heap[0];
        if (s->timer_due > fx_now_ms()) {
            struct timespec ts = fx_deadline_ts(s->timer_due);
            pthread_cond_timedwait(&ex->tcv, &ex->mu, &ts);
            continue;
        }
        step_now(s);
    }
    pthread_mutex_unlock(&ex->mu);
    return NULL;
}

/* ---- workers ---------------------------------------------------------------------------------- */

static void strand_destroy(fx_exec_strand *s)
{
    pthread_cond_destroy(&s->cv);
    free(s);
}

static void strand_unlink(fx_exec *ex, fx_exec_strand *s)
{
    if (s->prev) s->prev->next = s->next;
    else if (ex->strands == s) ex->strands = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void *worker_main(void *arg)
{
    kind *k = arg;
    fx_exec *ex = k->ex;
    char tn[32];
    snprintf(tn, sizeof tn, "fx-%s", k->cfg.name ? k->cfg.name : "exec");
    fx_thread_name(tn);
    pthread_mutex_lock(&ex->mu);
    for (;;) {
        while (!k->head && !ex->stopping) {
            k->idle++;
            pthread_cond_wait(&k->cv, &ex->mu);
            k->idle--;
        }
        if (ex->stopping) break; /* fx_exec_free cancels what is queued */
        node *n = runq_pop(k);
        if (!n->strand) {
            job *j = (job *)n;
            k->st.queued--;
            note_running(k);
            pthread_mutex_unlock(&ex->mu);
            j->work(j->arg);
            if (j->done) j->done(j->arg, false);
            free(j);
            pthread_mutex_lock(&ex->mu);
            k->st.running--;
            k->st.completed++;
            continue;
        }
        fx_exec_strand *s = n->strand;
        s->in_runq = false;
        job *j = s->jhead;
        if (j) {
            s->jhead = (job *)j->n.next;
            if (!s->jhead) s->jtail = NULL;
            k->st.queued--;
        } else if (s->step_pending) {
            s->step_pending = false;
        } else {
            continue;
        }
        s->running = true;
        s->runner = pthread_self();
        note_running(k);
        pthread_mutex_unlock(&ex->mu);
        if (j) {
            j->work(j->arg);
            if (j->done) j->done(j->arg, false);
            free(j);
        } else {
            s->step(s->arg);
        }
        pthread_mutex_lock(&ex->mu);
        k->st.running--;
        if (j) k->st.completed++;
        else k->st.steps++;
        s->running = false;
        if (s->free_on_return) {
            strand_unlink(ex, s);
            strand_destroy(s);
            continue;
        }
        if (s->jhead || s->step_pending) schedule_strand(s);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&ex->mu);
    return NULL;
}

/* ---- public ----------------------------------------------------------------------------------- */

fx_err fx_exec_new(const fx_exec_cfg *cfg, fx_exec **out)
{
    *out = NULL;
    unsigned n_kinds = 0;
    for (int i = 0; i < FX_EXEC_MAX_KINDS; i++) {
        const fx_exec_kind_cfg *kc = &cfg->kinds[i];
        if (!kc->name) continue;
        if (kc->queue_max == 0 || kc->threads_max == 0)
            return fx_seterr(FX_EINVAL, "executor: kind %s: zero queue or thread bound", kc->name);
        n_kinds++;
    }
    if (n_kinds == 0) return fx_seterr(FX_EINVAL, "executor: no kind registered");
    fx_exec *ex = calloc(1, sizeof *ex);
    if (!ex) return fx_seterr(FX_ENOMEM, "executor: out of memory");
    snprintf(ex->name, sizeof ex->name, "%s", cfg->name ? cfg->name : "fx");
    int ok = 0, n_cv = 0;
    if (pthread_mutex_init(&ex->mu, NULL) == 0) ok++;
    if (ok == 1 && fx_cond_init_monotonic(&ex->stop_cv) == 0) ok++;
    if (ok == 2 && fx_cond_init_monotonic(&ex->tcv) == 0) ok++;
    for (int i = 0; ok == 3 && i < FX_EXEC_MAX_KINDS; i++) {
        kind *k = &ex->k[i];
        k->ex = ex;
        k->idx = i;
        k->cfg = cfg->kinds[i];
        if (pthread_cond_init(&k->cv, NULL) != 0) break;
        n_cv++;
        if (k->cfg.name && !(k->thr = calloc(k->cfg.threads_max, sizeof *k->thr))) break;
    }
    if (ok < 3 || n_cv < FX_EXEC_MAX_KINDS) {
        for (int i = 0; i < n_cv; i++) {
            pthread_cond_destroy(&ex->k[i].cv);
            free(ex->k[i].thr);
        }
        if (ok > 2) pthread_cond_destroy(&ex->tcv);
        if (ok > 1) pthread_cond_destroy(&ex->stop_cv);
        if (ok > 0) pthread_mutex_destroy(&ex->mu);
        free(ex);
        return fx_seterr(FX_ENOMEM, "executor: cannot initialise");
    }
    *out = ex;
    return FX_OK;
}

static void cancel_all(job *list)
{
    while (list) {
        job *next = (job *)list->n.next;
        if (list->done) list->done(list->arg, true);
        free(list);
        list = next;
    }
}

/* Prepend the strand's queued jobs (in order) to *list; counts them cancelled. */
static void take_strand_jobs(fx_exec_strand *s, kind *k, job **list)
{
    if (!s->jhead) return;
    for (job *j = s->jhead; j; j = (job *)j->n.next) {
        k->st.queued--;
        k->st.cancelled++;
    }
    s->jtail->n.next = *list ? &(*list)->n : NULL; /* (no member access through NULL) */
    *list = s->jhead;
    s->jhead = s->jtail = NULL;
}

void fx_exec_free(fx_exec *ex)
{
    if (!ex) return;
    job *cancel = NULL, *ctail = NULL;
    pthread_mutex_lock(&ex->mu);
    ex->stopping = true;
    pthread_cond_broadcast(&ex->stop_cv);
    pthread_cond_broadcast(&ex->tcv);
    for (int i = 0; i < FX_EXEC_MAX_KINDS; i++) {
        kind *k = &ex->k[i];
        node *n;
        while ((n = runq_pop(k))) {
            if (n->strand) {
                n->strand->in_runq = false;
                continue;
            }
            job *j = (job *)n;
            k->st.queued--;
            k->st.cancelled++;
            if (ctail) ctail->n.next = &j->n;
            else cancel = j;
            ctail = j;
        }
        pthread_cond_broadcast(&k->cv);
    }
    for (fx_exec_strand *s = ex->strands; s; s = s->next) {
        take_strand_jobs(s, &ex->k[s->kind], &cancel);
        s->step_pending = false;
        s->timer_armed = false;
    }
    ex->heap_n = 0;
    pthread_mutex_unlock(&ex->mu);
    cancel_all(cancel);
    for (int i = 0; i < FX_EXEC_MAX_KINDS; i++)
        for (unsigned t = 0; t < ex->k[i].n_thr; t++) pthread_join(ex->k[i].thr[t], NULL);
    if (ex->t_started) pthread_join(ex->tthr, NULL);
    /* Strands still alive (their owners free them later) no longer point here. */
    for (fx_exec_strand *s = ex->strands, *next; s; s = next) {
        next = s->next;
        s->ex = NULL;
        s->prev = s->next = NULL;
    }
    for (int i = 0; i < FX_EXEC_MAX_KINDS; i++) {
        pthread_cond_destroy(&ex->k[i].cv);
        free(ex->k[i].thr);
    }
    free(ex->heap);
    pthread_cond_destroy(&ex->tcv);
    pthread_cond_destroy(&ex->stop_cv);
    pthread_mutex_destroy(&ex->mu);
    free(ex);
}

static fx_err check_kind(fx_exec *ex, int kind_idx)
{
    if (kind_idx < 0 || kind_idx >= FX_EXEC_MAX_KINDS || !ex->k[kind_idx].cfg.name)
        return fx_seterr(FX_EINVAL, "executor %s: kind %d is not registered", ex->name, kind_idx);
    return FX_OK;
}

/* Under ex->mu: room for one more queued job of k? */
static fx_err admit_locked(fx_exec *ex, kind *k)
{
    if (ex->stopping) return fx_seterr(FX_ECLOSED, "executor %s: stopping", ex->name);
    if (k->st.queued >= k->cfg.queue_max) {
        k->st.rejected_full++;
        return fx_seterr(FX_EFULL, "executor %s: kind %s: queue full (%zu jobs)", ex->name,
                         k->cfg.name, k->cfg.queue_max);
    }
    return FX_OK;
}

fx_err fx_exec_submit(fx_exec *ex, int kind_idx, fx_exec_work_fn work, fx_exec_done_fn done,
                      void *arg)
{
    fx_err e;
    if (!work) return fx_seterr(FX_EINVAL, "executor: no work function");
    if ((e = check_kind(ex, kind_idx))) return e;
    job *j = calloc(1, sizeof *j);
    if (!j) return fx_seterr(FX_ENOMEM, "executor: out of memory");
    j->work = work;
    j->done = done;
    j->arg = arg;
    kind *k = &ex->k[kind_idx];
    pthread_mutex_lock(&ex->mu);
    if ((e = admit_locked(ex, k))) {
        pthread_mutex_unlock(&ex->mu);
        free(j);
        return e;
    }
    note_queued(k);
    k->st.submitted++;
    runq_push(k, &j->n);
    pthread_mutex_unlock(&ex->mu);
    return FX_OK;
}

fx_err fx_exec_strand_new(fx_exec *ex, int kind_idx, fx_exec_step_fn step, void *arg,
                          fx_exec_strand **out)
{
    fx_err e;
    *out = NULL;
    if ((e = check_kind(ex, kind_idx))) return e;
    fx_exec_strand *s = calloc(1, sizeof *s);
    if (!s) return fx_seterr(FX_ENOMEM, "executor: out of memory");
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        free(s);
        return fx_seterr(FX_ENOMEM, "executor: cannot initialise a strand");
    }
    s->n.strand = s;
    s->ex = ex;
    s->kind = kind_idx;
    s->step = step;
    s->arg = arg;
    pthread_mutex_lock(&ex->mu);
    if (ex->stopping) {
        pthread_mutex_unlock(&ex->mu);
        strand_destroy(s);
        return fx_seterr(FX_ECLOSED, "executor %s: stopping", ex->name);
    }
    s->next = ex->strands;
    if (ex->strands) ex->strands->prev = s;
    ex->strands = s;
    pthread_mutex_unlock(&ex->mu);
    *out = s;
    return FX_OK;
}

fx_err fx_exec_strand_submit(fx_exec_strand *s, fx_exec_work_fn work, fx_exec_done_fn done,
                             void *arg)
{
    fx_err e;
    fx_exec *ex = s->ex;
    if (!work) return fx_seterr(FX_EINVAL, "executor: no work function");
    if (!ex) return fx_seterr(FX_ECLOSED, "executor: strand detached (executor freed)");
    job *j = calloc(1, sizeof *j);
    if (!j) return fx_seterr(FX_ENOMEM, "executor: out of memory");
    j->work = work;
    j->done = done;
    j->arg = arg;
    kind *k = &ex->k[s->kind];
    pthread_mutex_lock(&ex->mu);
    if (s->closing) e = fx_seterr(FX_ECLOSED, "executor %s: strand closing", ex->name);
    else e = admit_locked(ex, k);
    if (e) {
        pthread_mutex_unlock(&ex->mu);
        free(j);
        return e;
    }
    note_queued(k);
    k->st.submitted++;
    if (s->jtail) s->jtail->n.next = &j->n;
    else s->jhead = j;
    s->jtail = j;
    schedule_strand(s);
    pthread_mutex_unlock(&ex->mu);
    return FX_OK;
}

void fx_exec_strand_kick(fx_exec_strand *s, int64_t due_ms)
{
    fx_exec *ex = s->ex;
    if (!ex || !s->step) return;
    pthread_mutex_lock(&ex->mu);
    if (s->closing || ex->stopping || s->step_pending) goto out;
    if (due_ms <= fx_now_ms()) {
        step_now(s);
        goto out;
    }
    if (s->timer_armed) {
        if (due_ms < s->timer_due) {
            s->timer_due = due_ms;
            heap_up(ex, s->heap_pos);
            pthread_cond_signal(&ex->tcv);
        }
        goto out;
    }
    if (ex->heap_n == ex->heap_cap) {
        size_t cap = ex->heap_cap ? ex->heap_cap * 2 : 16;
        fx_exec_strand **h = realloc(ex->heap, cap * sizeof *h);
        if (!h) {
            FX_WRN("executor %s: out of memory for a timer: the step runs now", ex->name);
            step_now(s);
            goto out;
        }
        ex->heap = h;
        ex->heap_cap = cap;
    }
    if (!ex->t_started) {
        if (pthread_create(&ex->tthr, NULL, timer_main, ex) != 0) {
            FX_WRN("executor %s: cannot start the timer thread: the step runs now", ex->name);
            step_now(s);
            goto out;
        }
        ex->t_started = true;
    }
    s->timer_due = due_ms;
    s->timer_armed = true;
    ex->heap[ex->heap_n] = s;
    s->heap_pos = ex->heap_n++;
    heap_up(ex, s->heap_pos);
    pthread_cond_signal(&ex->tcv);
out:
    pthread_mutex_unlock(&ex->mu);
}

void fx_exec_strand_free(fx_exec_strand *s)
{
    if (!s) return;
    fx_exec *ex = s->ex;
    if (!ex) {
        strand_destroy(s);
        return;
    }
    job *cancel = NULL;
    kind *k = &ex->k[s->kind];
    pthread_mutex_lock(&ex->mu);
    s->closing = true;
    take_strand_jobs(s, k, &cancel);
    s->step_pending = false;
    timer_disarm(ex, s);
    if (s->in_runq) {
        runq_remove(k, &s->n);
        s->in_runq = false;
    }
    bool self = s->running && pthread_equal(s->runner, pthread_self());
    if (self) {
        s->free_on_return = true; /* the worker frees it when this job returns */
    } else {
        while (s->running) pthread_cond_wait(&s->cv, &ex->mu);
        strand_unlink(ex, s);
    }
    pthread_mutex_unlock(&ex->mu);
    cancel_all(cancel);
    if (!self) strand_destroy(s);
}

bool fx_exec_stopping(fx_exec *ex)
{
    pthread_mutex_lock(&ex->mu);
    bool st = ex->stopping;
    pthread_mutex_unlock(&ex->mu);
    return st;
}

bool fx_exec_wait_ms(fx_exec *ex, int64_t ms)
{
    int64_t deadline = fx_now_ms() + ms;
    pthread_mutex_lock(&ex->mu);
    while (!ex->stopping && fx_now_ms() < deadline) {
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&ex->stop_cv, &ex->mu, &ts);
    }
    bool ok = !ex->stopping;
    pthread_mutex_unlock(&ex->mu);
    return ok;
}

void fx_exec_get_stats(fx_exec *ex, int kind_idx, fx_exec_stats *out)
{
    memset(out, 0, sizeof *out);
    if (kind_idx < 0 || kind_idx >= FX_EXEC_MAX_KINDS) return;
    pthread_mutex_lock(&ex->mu);
    if (ex->k[kind_idx].cfg.name) *out = ex->k[kind_idx].st;
    pthread_mutex_unlock(&ex->mu);
}

const char *fx_exec_kind_name(const fx_exec *ex, int kind_idx)
{
    if (kind_idx < 0 || kind_idx >= FX_EXEC_MAX_KINDS) return NULL;
    return ex->k[kind_idx].cfg.name;
}
