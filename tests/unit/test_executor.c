/* Unit tests: the executor (bridge/executor): bounded queues refuse when full, strands run one
 * item at a time in submit order and a blocked strand holds up only itself, kicks coalesce, a
 * timed kick is never early, free() interrupts waits and cancels what is queued, two executors
 * live in one process.
 *
 * Waits poll with a deadline stretched by the slow-build factor (FXT_MS); lower time bounds (a
 * timed kick not early) are never stretched. Gates are condition variables, never sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "executor.h"
#include "fx_log.h"
#include "fx_time.h"
#include "tests/support/fxt_slow.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

/* A gate jobs wait at until the test opens it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    int waiting;
} gate;

static void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = false;
    g->waiting = 0;
}

static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static void gate_pass(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->waiting++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    g->waiting--;
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Wait until n jobs wait at the gate (deadline: 5 s, stretched). */
static bool gate_wait_for(gate *g, int n)
{
    int64_t deadline = fx_now_ms() + FXT_MS(5000);
    pthread_mutex_lock(&g->mu);
    while (g->waiting < n && fx_now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    bool ok = g->waiting >= n;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

/* Poll cond(arg) every 5 ms until true or 5 s (stretched). */
static bool poll_until(bool (*cond)(void *), void *arg)
{
    int64_t deadline = fx_now_ms() + FXT_MS(5000);
    while (!cond(arg)) {
        if (fx_now_ms() >= deadline) return false;
        fx_sleep_ms(5);
    }
    return true;
}

static fx_exec *new_exec(const char *name, size_t queue_max, unsigned threads)
{
    fx_exec_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.name = name;
    cfg.kinds[0] = (fx_exec_kind_cfg){"k0", queue_max, threads};
    cfg.kinds[1] = (fx_exec_kind_cfg){"k1", queue_max, threads};
    fx_exec *ex = NULL;
    assert_int_equal(fx_exec_new(&cfg, &ex), FX_OK);
    assert_non_null(ex);
    return ex;
}

typedef struct counter {
    atomic_int work, done_ok, done_cancelled;
} counter;

static void count_work(void *arg) { atomic_fetch_add(&((counter *)arg)->work, 1); }
static void count_done(void *arg, bool cancelled)
{
    counter *c = arg;
    if (cancelled) atomic_fetch_add(&c->done_cancelled, 1);
    else atomic_fetch_add(&c->done_ok, 1);
}

typedef struct gated {
    gate *g;
    counter *c;
} gated;

static void gated_work(void *arg)
{
    gated *gj = arg;
    gate_pass(gj->g);
    atomic_fetch_add(&gj->c->work, 1);
}
static void gated_done(void *arg, bool cancelled) { count_done(((gated *)arg)->c, cancelled); }

typedef struct stat_q {
    fx_exec *ex;
    int kind;
    uint64_t completed;
} stat_q;

static bool completed_reached(void *arg)
{
    stat_q *q = arg;
    fx_exec_stats st;
    fx_exec_get_stats(q->ex, q->kind, &st);
    return st.completed >= q->completed;
}

/* ---- bounded queue ---------------------------------------------------------------------------- */

static void executor_bounded_queue_refuses_when_full(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("bounded", 2, 1);
    gate g;
    gate_init(&g);
    counter c = {0};
    gated gj = {&g, &c};
    /* The one thread is held by the gated job: what follows stays queued. */
    assert_int_equal(fx_exec_submit(ex, 0, gated_work, gated_done, &gj), FX_OK);
    assert_true(gate_wait_for(&g, 1));
    assert_int_equal(fx_exec_submit(ex, 0, count_work, count_done, &c), FX_OK);
    assert_int_equal(fx_exec_submit(ex, 0, count_work, count_done, &c), FX_OK);
    assert_int_equal(fx_exec_submit(ex, 0, count_work, count_done, &c), FX_EFULL);
    fx_exec_strand *s = NULL;
    assert_int_equal(fx_exec_strand_new(ex, 0, NULL, NULL, &s), FX_OK);
    assert_int_equal(fx_exec_strand_submit(s, count_work, count_done, &c), FX_EFULL);
    fx_exec_stats st;
    fx_exec_get_stats(ex, 0, &st);
    assert_int_equal(st.queued, 2);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.rejected_full, 2);
    assert_int_equal(st.peak_queued, 2);
    /* Another kind has its own queue: not full. */
    assert_int_equal(fx_exec_submit(ex, 1, count_work, count_done, &c), FX_OK);
    /* An unregistered kind is refused. */
    assert_int_equal(fx_exec_submit(ex, 5, count_work, count_done, &c), FX_EINVAL);
    gate_open(&g);
    stat_q q = {ex, 0, 3};
    assert_true(poll_until(completed_reached, &q));
    stat_q q1 = {ex, 1, 1};
    assert_true(poll_until(completed_reached, &q1));
    /* The refused submits called nothing. */
    assert_int_equal(atomic_load(&c.work), 4);
    assert_int_equal(atomic_load(&c.done_ok), 4);
    assert_int_equal(atomic_load(&c.done_cancelled), 0);
    /* Room again once the queue drained. */
    assert_int_equal(fx_exec_strand_submit(s, count_work, count_done, &c), FX_OK);
    q.completed = 4;
    assert_true(poll_until(completed_reached, &q));
    fx_exec_strand_free(s);
    fx_exec_free(ex);
    gate_destroy(&g);
}

/* ---- thread names ------------------------------------------------------------------------------ */

typedef struct named {
    char name[32];
    atomic_int done;
} named;

static void read_name(void *arg)
{
    named *n = arg;
    if (pthread_getname_np(pthread_self(), n->name, sizeof n->name) != 0) strcpy(n->name, "?");
}
static void named_done(void *arg, bool cancelled)
{
    (void)cancelled;
    atomic_store(&((named *)arg)->done, 1);
}
static bool named_ready(void *arg) { return atomic_load(&((named *)arg)->done) == 1; }

static void *long_name_thread(void *arg)
{
    fx_thread_name("fx-a-role-name-too-long-for-linux");
    read_name(arg);
    return NULL;
}

/* A worker is named after its kind ("fx-<kind>", what top -H and perf show); a name longer than
 * the kernel's 15 characters is cut, not refused (pthread_setname_np alone fails with ERANGE). */
static void executor_threads_named_by_kind(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("names", 4, 1);
    named n0 = {{0}, 0}, n1 = {{0}, 0};
    assert_int_equal(fx_exec_submit(ex, 0, read_name, named_done, &n0), FX_OK);
    assert_int_equal(fx_exec_submit(ex, 1, read_name, named_done, &n1), FX_OK);
    assert_true(poll_until(named_ready, &n0));
    assert_true(poll_until(named_ready, &n1));
    assert_string_equal(n0.name, "fx-k0");
    assert_string_equal(n1.name, "fx-k1");
    fx_exec_free(ex);

    named nl = {{0}, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, long_name_thread, &nl), 0);
    pthread_join(t, NULL);
    assert_string_equal(nl.name, "fx-a-role-name-");
}

/* ---- strands ---------------------------------------------------------------------------------- */

#define N_STRANDS 4
#define N_JOBS 200

/* Spin (yielding) until cond holds or 5 s (stretched) passed. */
#define SPIN_UNTIL(cond)                                                                            \
    do {                                                                                           \
        int64_t dl_ = fx_now_ms() + FXT_MS(5000);                                                  \
        while (!(cond) && fx_now_ms() < dl_) sched_yield();                                        \
    } while (0)

typedef struct serial_strand {
    fx_exec_strand *s;
    atomic_int inside;    /* jobs of this strand running now */
    atomic_int overlap;   /* times two ran at once */
    atomic_int next;      /* the next job index expected */
    atomic_int out_of_order;
    atomic_int started;   /* index + 1 of the last job that started */
    atomic_int submitted; /* jobs submitted so far */
    atomic_int ran;
    atomic_int submit_err;
} serial_strand;

typedef struct serial_job {
    serial_strand *st;
    int idx;
} serial_job;

static serial_strand g_ss[N_STRANDS];
static serial_job g_jobs[N_STRANDS][N_JOBS];

/* Each job stays running until the next job of its strand was submitted: every submit lands on a
 * running strand with nothing queued, the case where a second thread could pick the strand up. */
static void serial_work(void *arg)
{
    serial_job *j = arg;
    serial_strand *st = j->st;
    if (atomic_fetch_add(&st->inside, 1) != 0) atomic_fetch_add(&st->overlap, 1);
    if (j->idx != atomic_load(&st->next)) atomic_fetch_add(&st->out_of_order, 1);
    atomic_store(&st->next, j->idx + 1);
    atomic_store(&st->started, j->idx + 1);
    if (j->idx + 1 < N_JOBS) SPIN_UNTIL(atomic_load(&st->submitted) > j->idx + 1);
    /* Stay 1 ms (or until a wrongly scheduled twin started): room for a second thread. */
    int64_t until_us = fx_now_us() + 1000;
    while (atomic_load(&st->started) == j->idx + 1 && fx_now_us() < until_us) sched_yield();
    atomic_fetch_sub(&st->inside, 1);
    atomic_fetch_add(&st->ran, 1);
}

/* One submitter per strand: job n+1 is submitted once job n started. */
static void *serial_submitter(void *arg)
{
    serial_strand *st = arg;
    int i = (int)(st - g_ss);
    for (int n = 0; n < N_JOBS; n++) {
        g_jobs[i][n] = (serial_job){st, n};
        if (fx_exec_strand_submit(st->s, serial_work, NULL, &g_jobs[i][n]) != FX_OK)
            atomic_fetch_add(&st->submit_err, 1);
        atomic_store(&st->submitted, n + 1);
        SPIN_UNTIL(atomic_load(&st->started) >= n + 1);
    }
    return NULL;
}

static bool all_ran(void *arg)
{
    serial_strand *ss = arg;
    for (int i = 0; i < N_STRANDS; i++)
        if (atomic_load(&ss[i].ran) < N_JOBS) return false;
    return true;
}

static void executor_strand_serial_in_order(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("serial", N_STRANDS * N_JOBS, 4);
    memset(g_ss, 0, sizeof g_ss);
    pthread_t sub[N_STRANDS];
    for (int i = 0; i < N_STRANDS; i++)
        assert_int_equal(fx_exec_strand_new(ex, 0, NULL, NULL, &g_ss[i].s), FX_OK);
    for (int i = 0; i < N_STRANDS; i++)
        assert_int_equal(pthread_create(&sub[i], NULL, serial_submitter, &g_ss[i]), 0);
    for (int i = 0; i < N_STRANDS; i++) pthread_join(sub[i], NULL);
    assert_true(poll_until(all_ran, g_ss));
    fx_exec_stats st;
    fx_exec_get_stats(ex, 0, &st);
    for (int i = 0; i < N_STRANDS; i++) {
        assert_int_equal(atomic_load(&g_ss[i].submit_err), 0);
        assert_int_equal(atomic_load(&g_ss[i].overlap), 0);
        assert_int_equal(atomic_load(&g_ss[i].out_of_order), 0);
        fx_exec_strand_free(g_ss[i].s);
    }
    assert_int_equal(st.completed, N_STRANDS * N_JOBS);
    assert_true(st.peak_running > 1); /* the strands did run side by side */
    assert_true(st.threads <= 4);
    fx_exec_free(ex);
}

/* A job blocked on one strand holds up that strand only: another strand of the same kind keeps
 * going on the kind's other thread, and the blocked strand's later jobs wait their turn. */
static void executor_strand_blocked_holds_only_itself(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("blocked", 64, 2);
    gate g;
    gate_init(&g);
    counter ca = {0}, cb = {0};
    gated gj = {&g, &ca};
    fx_exec_strand *a = NULL, *b = NULL;
    assert_int_equal(fx_exec_strand_new(ex, 0, NULL, NULL, &a), FX_OK);
    assert_int_equal(fx_exec_strand_new(ex, 0, NULL, NULL, &b), FX_OK);
    assert_int_equal(fx_exec_strand_submit(a, gated_work, gated_done, &gj), FX_OK);
    assert_true(gate_wait_for(&g, 1));
    for (int i = 0; i < 10; i++) {
        assert_int_equal(fx_exec_strand_submit(a, count_work, count_done, &ca), FX_OK);
        assert_int_equal(fx_exec_strand_submit(b, count_work, count_done, &cb), FX_OK);
    }
    stat_q q = {ex, 0, 10};
    assert_true(poll_until(completed_reached, &q)); /* b's ten, a still blocked */
    assert_int_equal(atomic_load(&cb.done_ok), 10);
    assert_int_equal(atomic_load(&ca.work), 0); /* a's later jobs did not pass its blocked one */
    gate_open(&g);
    q.completed = 21;
    assert_true(poll_until(completed_reached, &q));
    assert_int_equal(atomic_load(&ca.work), 11);
    fx_exec_strand_free(a);
    fx_exec_strand_free(b);
    fx_exec_free(ex);
    gate_destroy(&g);
}

/* ---- kicks ------------------------------------------------------------------------------------ */

typedef struct kicked {
    gate *g;         /* the first step waits here (NULL: never waits) */
    atomic_int steps;
    atomic_llong first_at_ms;
} kicked;

static void kicked_step(void *arg)
{
    kicked *k = arg;
    int n = atomic_fetch_add(&k->steps, 1);
    if (n == 0) atomic_store(&k->first_at_ms, fx_now_ms());
    if (n == 0 && k->g) gate_pass(k->g);
}

typedef struct idle_q {
    fx_exec *ex;
    kicked *k;
    int steps;
} idle_q;

/* The kind is idle (nothing queued or running) and at least `steps` steps ran. */
static bool idle_after(void *arg)
{
    idle_q *q = arg;
    fx_exec_stats st;
    fx_exec_get_stats(q->ex, 0, &st);
    return st.running == 0 && st.queued == 0 && atomic_load(&q->k->steps) >= q->steps;
}

static void executor_kick_coalesces(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("kick", 16, 2);
    gate g;
    gate_init(&g);
    kicked k = {&g};
    fx_exec_strand *s = NULL;
    assert_int_equal(fx_exec_strand_new(ex, 0, kicked_step, &k, &s), FX_OK);
    /* Kicks while the step runs: it runs exactly once more after. */
    fx_exec_strand_kick(s, 0);
    assert_true(gate_wait_for(&g, 1));
    for (int i = 0; i < 5; i++) fx_exec_strand_kick(s, 0);
    gate_open(&g);
    idle_q q = {ex, &k, 2};
    assert_true(poll_until(idle_after, &q));
    assert_int_equal(atomic_load(&k.steps), 2);
    /* Kicks while the step is queued behind a job of the strand: one step. */
    gate g2;
    gate_init(&g2);
    counter c = {0};
    gated gj = {&g2, &c};
    assert_int_equal(fx_exec_strand_submit(s, gated_work, gated_done, &gj), FX_OK);
    assert_true(gate_wait_for(&g2, 1));
    for (int i = 0; i < 5; i++) fx_exec_strand_kick(s, 0);
    gate_open(&g2);
    q.steps = 3;
    assert_true(poll_until(idle_after, &q));
    assert_int_equal(atomic_load(&k.steps), 3);
    fx_exec_stats st;
    fx_exec_get_stats(ex, 0, &st);
    assert_int_equal(st.steps, 3);
    fx_exec_strand_free(s);
    fx_exec_free(ex);
    gate_destroy(&g);
    gate_destroy(&g2);
}

static bool stepped(void *arg) { return atomic_load(&((kicked *)arg)->steps) >= 1; }

static void executor_timed_kick_not_early(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("timed", 16, 1);
    kicked k1 = {0}, k2 = {0};
    fx_exec_strand *s1 = NULL, *s2 = NULL;
    assert_int_equal(fx_exec_strand_new(ex, 0, kicked_step, &k1, &s1), FX_OK);
    assert_int_equal(fx_exec_strand_new(ex, 0, kicked_step, &k2, &s2), FX_OK);
    int64_t t0 = fx_now_ms();
    /* s1: a later kick while armed does not postpone it; s2: an earlier one moves it earlier. */
    fx_exec_strand_kick(s1, t0 + 150);
    fx_exec_strand_kick(s1, t0 + 60000);
    fx_exec_strand_kick(s2, t0 + 60000);
    fx_exec_strand_kick(s2, t0 + 250);
    assert_true(poll_until(stepped, &k1));
    assert_true(poll_until(stepped, &k2));
    assert_true(atomic_load(&k1.first_at_ms) >= t0 + 150);
    assert_true(atomic_load(&k2.first_at_ms) >= t0 + 250);
    assert_true(atomic_load(&k1.first_at_ms) <= atomic_load(&k2.first_at_ms));
    assert_int_equal(atomic_load(&k1.steps), 1);
    assert_int_equal(atomic_load(&k2.steps), 1);
    /* A timer left armed at free is dropped (no step after free; valgrind sees no leak). */
    fx_exec_strand_kick(s1, fx_now_ms() + 60000);
    fx_exec_strand_free(s1);
    fx_exec_strand_kick(s2, fx_now_ms() + 60000);
    fx_exec_free(ex); /* s2 detached with its timer */
    fx_exec_strand_free(s2);
}

/* ---- shutdown --------------------------------------------------------------------------------- */

typedef struct waiter {
    fx_exec *ex;
    atomic_int started;
    atomic_int interrupted;
    counter c;
} waiter;

static void waiter_work(void *arg)
{
    waiter *w = arg;
    atomic_store(&w->started, 1);
    if (!fx_exec_wait_ms(w->ex, 60000)) atomic_store(&w->interrupted, 1);
}
static void waiter_done(void *arg, bool cancelled) { count_done(&((waiter *)arg)->c, cancelled); }
static bool waiter_started(void *arg) { return atomic_load(&((waiter *)arg)->started) == 1; }

static void executor_free_cancels_queued(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("free", 64, 1);
    waiter w = {.ex = ex};
    counter plain = {0}, strand = {0};
    assert_int_equal(fx_exec_submit(ex, 0, waiter_work, waiter_done, &w), FX_OK);
    assert_true(poll_until(waiter_started, &w));
    for (int i = 0; i < 5; i++)
        assert_int_equal(fx_exec_submit(ex, 0, count_work, count_done, &plain), FX_OK);
    fx_exec_strand *s = NULL;
    assert_int_equal(fx_exec_strand_new(ex, 0, NULL, NULL, &s), FX_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(fx_exec_strand_submit(s, count_work, count_done, &strand), FX_OK);
    int64_t t0 = fx_now_ms();
    fx_exec_free(ex); /* interrupts the 60 s wait, cancels the 8 queued, joins */
    assert_true(fx_now_ms() - t0 < FXT_MS(2000));
    assert_int_equal(atomic_load(&w.interrupted), 1);
    assert_int_equal(atomic_load(&w.c.done_ok), 1);
    assert_int_equal(atomic_load(&plain.work), 0);
    assert_int_equal(atomic_load(&plain.done_cancelled), 5);
    assert_int_equal(atomic_load(&plain.done_ok), 0);
    assert_int_equal(atomic_load(&strand.work), 0);
    assert_int_equal(atomic_load(&strand.done_cancelled), 3);
    /* The detached strand refuses work and frees its memory. */
    assert_int_equal(fx_exec_strand_submit(s, count_work, count_done, &strand), FX_ECLOSED);
    fx_exec_strand_free(s);
}

/* A strand freed from its own job: its later jobs are cancelled, the job itself completes. */
typedef struct self_free {
    fx_exec_strand *s;
    counter c;
} self_free;

static void self_free_work(void *arg)
{
    self_free *sf = arg;
    atomic_fetch_add(&sf->c.work, 1);
    fx_exec_strand_free(sf->s);
}
static void self_free_done(void *arg, bool cancelled) { count_done(&((self_free *)arg)->c, cancelled); }

static bool self_freed(void *arg)
{
    self_free *sf = arg;
    return atomic_load(&sf->c.done_ok) == 1 && atomic_load(&sf->c.done_cancelled) == 4;
}

static void executor_strand_free_from_own_job(void **state)
{
    (void)state;
    fx_exec *ex = new_exec("selffree", 64, 1);
    gate g;
    gate_init(&g);
    counter gc = {0};
    gated gj = {&g, &gc};
    self_free sf = {0};
    assert_int_equal(fx_exec_strand_new(ex, 0, NULL, NULL, &sf.s), FX_OK);
    assert_int_equal(fx_exec_strand_submit(sf.s, gated_work, gated_done, &gj), FX_OK);
    assert_int_equal(fx_exec_strand_submit(sf.s, self_free_work, self_free_done, &sf), FX_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(fx_exec_strand_submit(sf.s, self_free_work, self_free_done, &sf), FX_OK);
    assert_true(gate_wait_for(&g, 1));
    gate_open(&g);
    assert_true(poll_until(self_freed, &sf));
    assert_int_equal(atomic_load(&sf.c.work), 1);
    fx_exec_free(ex);
    gate_destroy(&g);
}

/* ---- two executors ---------------------------------------------------------------------------- */

static void executor_two_in_one_process(void **state)
{
    (void)state;
    fx_exec *a = new_exec("a", 8, 1);
    fx_exec *b = new_exec("b", 8, 2);
    gate g;
    gate_init(&g);
    counter ca = {0}, cb = {0};
    gated gj = {&g, &ca};
    /* a's only thread is blocked and its queue filled: b is unaffected. */
    assert_int_equal(fx_exec_submit(a, 0, gated_work, gated_done, &gj), FX_OK);
    assert_true(gate_wait_for(&g, 1));
    for (int i = 0; i < 8; i++) assert_int_equal(fx_exec_submit(a, 0, count_work, count_done, &ca), FX_OK);
    assert_int_equal(fx_exec_submit(a, 0, count_work, count_done, &ca), FX_EFULL);
    for (int i = 0; i < 8; i++) assert_int_equal(fx_exec_submit(b, 0, count_work, count_done, &cb), FX_OK);
    stat_q qb = {b, 0, 8};
    assert_true(poll_until(completed_reached, &qb));
    fx_exec_stats sa, sb;
    fx_exec_get_stats(a, 0, &sa);
    fx_exec_get_stats(b, 0, &sb);
    assert_int_equal(sa.rejected_full, 1);
    assert_int_equal(sb.rejected_full, 0);
    assert_int_equal(sa.completed, 0);
    assert_int_equal(sb.completed, 8);
    assert_string_equal(fx_exec_kind_name(a, 0), "k0");
    /* Freeing b leaves a working. */
    fx_exec_free(b);
    gate_open(&g);
    stat_q qa = {a, 0, 9};
    assert_true(poll_until(completed_reached, &qa));
    assert_int_equal(atomic_load(&ca.done_ok), 9);
    fx_exec_free(a);
    gate_destroy(&g);
}

static void executor_cfg_checked(void **state)
{
    (void)state;
    fx_exec_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    fx_exec *ex = NULL;
    assert_int_equal(fx_exec_new(&cfg, &ex), FX_EINVAL); /* no kind */
    cfg.kinds[2] = (fx_exec_kind_cfg){"zero", 0, 1};
    assert_int_equal(fx_exec_new(&cfg, &ex), FX_EINVAL);
    assert_null(ex);
    fx_exec_cfg_defaults(&cfg);
    assert_int_equal(fx_exec_new(&cfg, &ex), FX_OK);
    assert_string_equal(fx_exec_kind_name(ex, FX_EXEC_K_COMMIT), "commit");
    assert_null(fx_exec_kind_name(ex, FX_EXEC_MAX_KINDS - 1));
    fx_exec_free(ex);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* run only the tests matching argv[1] */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(executor_bounded_queue_refuses_when_full),
        cmocka_unit_test(executor_strand_serial_in_order),
        cmocka_unit_test(executor_strand_blocked_holds_only_itself),
        cmocka_unit_test(executor_kick_coalesces),
        cmocka_unit_test(executor_timed_kick_not_early),
        cmocka_unit_test(executor_free_cancels_queued),
        cmocka_unit_test(executor_strand_free_from_own_job),
        cmocka_unit_test(executor_two_in_one_process),
        cmocka_unit_test(executor_cfg_checked),
        cmocka_unit_test(executor_threads_named_by_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
