/* Unit tests for bridge/lifecycle.c: transitions, idempotent and concurrent close, construction,
 * the lease-lost fault (FX_ELEASE_LOST once, then FX_ECLOSED), the retryable close, and
 * waiting for in-flight op references. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "fx_time.h"
#include "lifecycle.h"
#include "tests/support/fxt_soft.h"

/* An owner as the endpoints have it: mutex + monotonic condvar + lifecycle. */
typedef struct owner {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fx_life lf;
    atomic_int work_runs; /* times the close work ran */
    fx_err work_result;
} owner;

static void owner_init(owner *o, bool constructing)
{
    assert_int_equal(pthread_mutex_init(&o->mu, NULL), 0);
    assert_int_equal(fx_cond_init_monotonic(&o->cv), 0);
    fx_life_init(&o->lf, constructing);
    atomic_init(&o->work_runs, 0);
    o->work_result = FX_OK;
}

static void owner_destroy(owner *o)
{
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
}

/* The close protocol as the endpoints run it (the work outside the mutex). */
static fx_err owner_close(owner *o)
{
    pthread_mutex_lock(&o->mu);
    fx_err r = FX_OK;
    fx_life_close k = fx_life_close_begin(&o->lf, &o->mu, &o->cv, &r);
    if (k == FX_LIFE_CLOSE_RUN || k == FX_LIFE_CLOSE_RERUN) {
        pthread_mutex_unlock(&o->mu);
        atomic_fetch_add(&o->work_runs, 1);
        pthread_mutex_lock(&o->mu);
        r = o->work_result;
        fx_life_close_done(&o->lf, &o->cv, r);
    } else if (k == FX_LIFE_CLOSE_RETRY) {
        r = FX_ETIMEDOUT;
    }
    fx_life_close_leave(&o->lf, &o->cv);
    pthread_mutex_unlock(&o->mu);
    return r;
}

static fx_err owner_gate(owner *o)
{
    pthread_mutex_lock(&o->mu);
    fx_err e = fx_life_gate(&o->lf);
    pthread_mutex_unlock(&o->mu);
    return e;
}

static void owner_wait_closed(owner *o)
{
    pthread_mutex_lock(&o->mu);
    fx_life_wait_closed(&o->lf, &o->mu, &o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void life_transitions(void **state)
{
    (void)state;
    owner o;
    owner_init(&o, false);
    assert_int_equal(o.lf.state, FX_LIFE_OPEN);
    assert_int_equal(owner_gate(&o), FX_OK);
    pthread_mutex_lock(&o.mu);
    fx_err r = FX_EINVAL;
    assert_int_equal(fx_life_close_begin(&o.lf, &o.mu, &o.cv, &r), FX_LIFE_CLOSE_RUN);
    assert_int_equal(o.lf.state, FX_LIFE_CLOSING);
    assert_true(o.lf.stop);
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED); /* closing: new calls refused */
    fx_life_close_done(&o.lf, &o.cv, FX_EUNAVAIL);
    assert_int_equal(o.lf.state, FX_LIFE_CLOSED);
    assert_int_equal(o.lf.closers, 1);
    fx_life_close_leave(&o.lf, &o.cv);
    assert_int_equal(o.lf.closers, 0);
    fx_life_wait_closed(&o.lf, &o.mu, &o.cv); /* returns at once */
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED);
    pthread_mutex_unlock(&o.mu);
    owner_destroy(&o);
}

static void life_close_idempotent(void **state)
{
    (void)state;
    owner o;
    owner_init(&o, false);
    o.work_result = FX_EUNAVAIL;
    assert_int_equal(owner_close(&o), FX_EUNAVAIL);
    assert_int_equal(owner_close(&o), FX_EUNAVAIL); /* the first close's result, no new work */
    assert_int_equal(owner_close(&o), FX_EUNAVAIL);
    assert_int_equal(atomic_load(&o.work_runs), 1);
    owner_wait_closed(&o);
    /* The client's cooperative form: OPEN -> CLOSING once. */
    owner q;
    owner_init(&q, false);
    pthread_mutex_lock(&q.mu);
    assert_true(fx_life_closing(&q.lf, &q.cv));
    assert_false(fx_life_closing(&q.lf, &q.cv));
    assert_int_equal(q.lf.state, FX_LIFE_CLOSING);
    pthread_mutex_unlock(&q.mu);
    owner_destroy(&q);
    owner_destroy(&o);
}

/* A closer that holds the work until released, so the others find the close running. */
typedef struct slow_owner {
    owner o;
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    bool in_work, release;
} slow_owner;

static fx_err slow_close(slow_owner *s)
{
    owner *o = &s->o;
    pthread_mutex_lock(&o->mu);
    fx_err r = FX_OK;
    fx_life_close k = fx_life_close_begin(&o->lf, &o->mu, &o->cv, &r);
    if (k == FX_LIFE_CLOSE_RUN) {
        pthread_mutex_unlock(&o->mu);
        atomic_fetch_add(&o->work_runs, 1);
        pthread_mutex_lock(&s->gate_mu);
        s->in_work = true;
        pthread_cond_broadcast(&s->gate_cv);
        while (!s->release) pthread_cond_wait(&s->gate_cv, &s->gate_mu);
        pthread_mutex_unlock(&s->gate_mu);
        pthread_mutex_lock(&o->mu);
        r = FX_ESERVER;
        fx_life_close_done(&o->lf, &o->cv, r);
    }
    fx_life_close_leave(&o->lf, &o->cv);
    pthread_mutex_unlock(&o->mu);
    return r;
}

static void *slow_close_thr(void *arg)
{
    slow_owner *s = arg;
    return (void *)(intptr_t)slow_close(s);
}

static void life_close_concurrent(void **state)
{
    (void)state;
    enum { N = 8 };
    slow_owner s = {0};
    owner_init(&s.o, false);
    pthread_mutex_init(&s.gate_mu, NULL);
    pthread_cond_init(&s.gate_cv, NULL);
    pthread_t t[N];
    int started = 0;
    while (started < N && pthread_create(&t[started], NULL, slow_close_thr, &s) == 0) started++;
    /* The threads use s (this frame) and wait on its gate: checks until they are joined are
     * soft (fxt_soft.h), so a failure still opens the gate and joins them. */
    fxt_soft soft = {0};
    FXT_SOFT_CHECK(soft, started == N);
    /* Wait (deadline) until one thread runs the work and the others wait inside the close. */
    int64_t until = fx_now_ms() + 10000;
    for (; started == N;) {
        pthread_mutex_lock(&s.gate_mu);
        bool in = s.in_work;
        pthread_mutex_unlock(&s.gate_mu);
        pthread_mutex_lock(&s.o.mu);
        int closers = s.o.lf.closers;
        pthread_mutex_unlock(&s.o.mu);
        if (in && closers == N) break;
        if (fx_now_ms() >= until) {
            FXT_SOFT_CHECK(soft, in && closers == N);
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&s.o.mu);
    FXT_SOFT_CHECK(soft, s.o.lf.state == FX_LIFE_CLOSING);
    pthread_mutex_unlock(&s.o.mu);
    pthread_mutex_lock(&s.gate_mu);
    s.release = true;
    pthread_cond_broadcast(&s.gate_cv);
    pthread_mutex_unlock(&s.gate_mu);
    if (started == N) owner_wait_closed(&s.o); /* returns only once every closer has left */
    pthread_mutex_lock(&s.o.mu);
    FXT_SOFT_CHECK(soft, s.o.lf.closers == 0);
    pthread_mutex_unlock(&s.o.mu);
    fx_err rv_of[N];
    for (int i = 0; i < started; i++) {
        void *rv = NULL;
        pthread_join(t[i], &rv);
        rv_of[i] = (fx_err)(intptr_t)rv;
    }
    FXT_SOFT_END(soft);
    for (int i = 0; i < N; i++)
        assert_int_equal(rv_of[i], FX_ESERVER); /* everybody gets the one result */
    assert_int_equal(atomic_load(&s.o.work_runs), 1);
    pthread_cond_destroy(&s.gate_cv);
    pthread_mutex_destroy(&s.gate_mu);
    owner_destroy(&s.o);
}

/* Close during construction: waits for fx_life_constructed, which reports the stop. */
typedef struct close_arg {
    owner *o;
    fx_err r;
} close_arg;

static void *close_thr(void *arg)
{
    close_arg *a = arg;
    a->r = owner_close(a->o);
    return NULL;
}

static void life_close_waits_for_construction(void **state)
{
    (void)state;
    owner o;
    owner_init(&o, true);
    close_arg a = {&o, FX_EINVAL};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, close_thr, &a), 0);
    /* The closer uses o and a (this frame): soft checks until it is joined (fxt_soft.h). */
    fxt_soft soft = {0};
    int64_t until = fx_now_ms() + 10000;
    for (;;) { /* the closer is inside, waiting */
        pthread_mutex_lock(&o.mu);
        bool in = o.lf.closers == 1 && o.lf.close_req;
        pthread_mutex_unlock(&o.mu);
        if (in) break;
        if (fx_now_ms() >= until) {
            FXT_SOFT_CHECK(soft, in);
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    FXT_SOFT_CHECK(soft, atomic_load(&o.work_runs) == 0); /* no work while constructing */
    pthread_mutex_lock(&o.mu);
    FXT_SOFT_CHECK(soft, o.lf.state == FX_LIFE_OPEN);
    bool learned = fx_life_constructed(&o.lf, &o.cv); /* the open learns it was closed */
    FXT_SOFT_CHECK(soft, learned);
    pthread_mutex_unlock(&o.mu);
    pthread_join(t, NULL);
    FXT_SOFT_END(soft);
    assert_int_equal(a.r, FX_OK);
    assert_int_equal(atomic_load(&o.work_runs), 1);
    owner_wait_closed(&o);
    owner_destroy(&o);
}

static void life_lease_lost_once_then_closed(void **state)
{
    (void)state;
    owner o;
    owner_init(&o, false);
    pthread_mutex_lock(&o.mu);
    assert_true(fx_life_lease_lost(&o.lf, 42));
    assert_false(fx_life_lease_lost(&o.lf, 43)); /* the first loss is kept */
    assert_int_equal(o.lf.fault, FX_ELEASE_LOST);
    assert_int_equal(o.lf.fault_lease, 42);
    assert_true(o.lf.stop);
    assert_int_equal(o.lf.state, FX_LIFE_OPEN); /* the owner closes itself on its next call */
    /* Not armed yet (the MPMC way): a plain close. */
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED);
    fx_life_fault_arm(&o.lf);
    assert_int_equal(fx_life_gate(&o.lf), FX_ELEASE_LOST);
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED);
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED);
    pthread_mutex_unlock(&o.mu);
    /* The self-close after it, then still FX_ECLOSED. */
    assert_int_equal(owner_close(&o), FX_OK);
    assert_int_equal(owner_gate(&o), FX_ECLOSED);
    owner_wait_closed(&o);
    pthread_mutex_lock(&o.mu);
    assert_false(fx_life_lease_lost(&o.lf, 44)); /* ignored once closed */
    pthread_mutex_unlock(&o.mu);
    owner_destroy(&o);

    /* Armed at the loss (the MPSC way), reported by the first call even after a user close. */
    owner p;
    owner_init(&p, false);
    pthread_mutex_lock(&p.mu);
    assert_true(fx_life_lease_lost(&p.lf, 7));
    fx_life_fault_arm(&p.lf);
    pthread_mutex_unlock(&p.mu);
    assert_int_equal(owner_close(&p), FX_OK);
    assert_int_equal(owner_gate(&p), FX_ELEASE_LOST);
    assert_int_equal(owner_gate(&p), FX_ECLOSED);
    owner_wait_closed(&p);
    owner_destroy(&p);

    /* A loss after a clean close is no fault. */
    owner q;
    owner_init(&q, false);
    assert_int_equal(owner_close(&q), FX_OK);
    pthread_mutex_lock(&q.mu);
    assert_false(fx_life_lease_lost(&q.lf, 9));
    fx_life_fault_arm(&q.lf);
    assert_int_equal(fx_life_gate(&q.lf), FX_ECLOSED);
    /* The data path's own finding counts as reported by that call. */
    fx_life_fault_now(&q.lf, 9);
    assert_int_equal(q.lf.fault, FX_ELEASE_LOST);
    assert_int_equal(fx_life_gate(&q.lf), FX_ECLOSED);
    pthread_mutex_unlock(&q.mu);
    owner_destroy(&q);
}

static void life_retryable_close(void **state)
{
    (void)state;
    owner o;
    owner_init(&o, false);
    pthread_mutex_lock(&o.mu);
    fx_err r = FX_OK;
    assert_int_equal(fx_life_close_begin(&o.lf, &o.mu, &o.cv, &r), FX_LIFE_CLOSE_RUN);
    fx_life_close_retry(&o.lf, &o.cv);
    fx_life_close_leave(&o.lf, &o.cv);
    assert_int_equal(o.lf.state, FX_LIFE_RETRY);
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED);
    assert_int_equal(fx_life_op_enter(&o.lf, true), FX_ECLOSED);
    assert_false(fx_life_lease_lost(&o.lf, 5)); /* ignored: the close is over for the caller */
    assert_int_equal(fx_life_gate(&o.lf), FX_ECLOSED);
    assert_int_equal(fx_life_close_begin(&o.lf, &o.mu, &o.cv, &r), FX_LIFE_CLOSE_RERUN);
    assert_int_equal(o.lf.state, FX_LIFE_CLOSING);
    fx_life_close_done(&o.lf, &o.cv, FX_OK);
    fx_life_close_leave(&o.lf, &o.cv);
    fx_life_wait_closed(&o.lf, &o.mu, &o.cv);
    pthread_mutex_unlock(&o.mu);
    owner_destroy(&o);
}

/* In-flight op references: new work refused once closing, all refused once closed, and the
 * drain waits for the last one (bounded). */
typedef struct op_arg {
    owner *o;
    atomic_bool entered;
    atomic_bool go;
    fx_err enter_err;
} op_arg;

static void *op_thr(void *arg)
{
    op_arg *a = arg;
    pthread_mutex_lock(&a->o->mu);
    fx_err e = fx_life_op_enter(&a->o->lf, false);
    pthread_mutex_unlock(&a->o->mu);
    a->enter_err = e; /* checked by the main thread (cmocka asserts belong there) */
    atomic_store(&a->entered, true);
    while (!atomic_load(&a->go)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&a->o->mu);
    fx_life_op_leave(&a->o->lf, &a->o->cv);
    pthread_mutex_unlock(&a->o->mu);
    return NULL;
}

static void life_waits_for_inflight_ops(void **state)
{
    (void)state;
    owner o;
    owner_init(&o, false);
    op_arg a = {.o = &o};
    atomic_init(&a.entered, false);
    atomic_init(&a.go, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, op_thr, &a), 0);
    /* The op thread uses a and o (this frame) and waits for a.go: soft checks until it is
     * joined (fxt_soft.h), so a failure still lets it go and joins it. */
    fxt_soft soft = {0};
    int64_t until = fx_now_ms() + 10000;
    while (!atomic_load(&a.entered)) {
        if (fx_now_ms() >= until) {
            FXT_SOFT_CHECK(soft, atomic_load(&a.entered));
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    bool entered = atomic_load(&a.entered);
    pthread_mutex_lock(&o.mu);
    if (entered) {
        FXT_SOFT_CHECK(soft, a.enter_err == FX_OK);
        FXT_SOFT_CHECK(soft, o.lf.ops == 1);
        FXT_SOFT_CHECK(soft, fx_life_closing(&o.lf, &o.cv));
        FXT_SOFT_CHECK(soft, fx_life_op_enter(&o.lf, true) == FX_ECLOSED); /* new work: refused */
        fx_err in_flight = fx_life_op_enter(&o.lf, false); /* in-flight work: allowed */
        FXT_SOFT_CHECK(soft, in_flight == FX_OK);
        if (in_flight == FX_OK) fx_life_op_leave(&o.lf, &o.cv);
        fx_life_close_done(&o.lf, &o.cv, FX_OK);
        FXT_SOFT_CHECK(soft, fx_life_op_enter(&o.lf, false) == FX_ECLOSED); /* closed: none any more */
        /* Held: a short drain times out. */
        FXT_SOFT_CHECK(soft, !fx_life_drain(&o.lf, &o.mu, &o.cv, fx_now_ms() + 50));
        FXT_SOFT_CHECK(soft, o.lf.ops == 1);
    }
    atomic_store(&a.go, true);
    if (entered) {
        FXT_SOFT_CHECK(soft, fx_life_drain(&o.lf, &o.mu, &o.cv, fx_now_ms() + 10000));
        FXT_SOFT_CHECK(soft, o.lf.ops == 0);
    }
    pthread_mutex_unlock(&o.mu);
    pthread_join(t, NULL);
    FXT_SOFT_END(soft);
    owner_destroy(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(life_transitions),
        cmocka_unit_test(life_close_idempotent),
        cmocka_unit_test(life_close_concurrent),
        cmocka_unit_test(life_close_waits_for_construction),
        cmocka_unit_test(life_lease_lost_once_then_closed),
        cmocka_unit_test(life_retryable_close),
        cmocka_unit_test(life_waits_for_inflight_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
