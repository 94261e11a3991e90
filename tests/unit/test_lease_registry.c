/* test_lease_registry.c -- unit tests of the LeaseManager registry, cadence, retries, expiry
 * notification and release rules, against a fake in-process backend (no etcd).
 *
 * Synchronisation is by polling with a deadline (WAIT_UNTIL). A few tests keep watching for a
 * bounded window after the fact to assert that something does NOT happen (no second callback,
 * no keepalive after release); those windows are observation, not synchronisation.
 * Upper time bounds and deadlines are multiplied by the slow-build factor (FXT_MS,
 * tests/support/fxt_slow.h: sanitizers, valgrind, a loaded machine); lower bounds (nothing
 * happens too early) are not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"
#include "lease_mgr.h"
#include "tests/support/fxt_slow.h"

/* Poll `cond` every 5 ms until true or `ms` passed; `ok` receives the final value. */
#define WAIT_UNTIL(ok, cond, ms)                                                                 \
    do {                                                                                         \
        int64_t wu_deadline_ = fx_now_ms() + FXT_MS(ms);                                         \
        while (!((ok) = (cond)) && fx_now_ms() < wu_deadline_) fx_sleep_ms(5);                   \
    } while (0)

/* ---- the fake backend ----------------------------------------------------------------------- */

enum { FAKE_OK = 0, FAKE_TIMEOUT, FAKE_UNAVAIL, FAKE_SERVER, FAKE_EXPIRED };

#define FAKE_MAX_TS 64

typedef struct fake {
    char uid[32];
    _Atomic int calls;
    _Atomic int mode;          /* FAKE_* for every id */
    _Atomic int fail_next;     /* the next N calls fail with FX_ETIMEDOUT */
    _Atomic int64_t expired_id;/* this id answers expired */
    _Atomic int delay_ms;      /* each call takes this long (bounded by its timeout) */
    _Atomic int in_call;
    _Atomic int last_timeout_ms;
    _Atomic int64_t ts[FAKE_MAX_TS]; /* call start times */
} fake;

static void fake_init(fake *f, const char *uid)
{
    memset(f, 0, sizeof *f);
    snprintf(f->uid, sizeof f->uid, "%s", uid);
}

static fx_err fake_keepalive(void *ctx, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    fake *f = ctx;
    int n = atomic_fetch_add(&f->calls, 1);
    if (n < FAKE_MAX_TS) atomic_store(&f->ts[n], fx_now_ms());
    atomic_store(&f->last_timeout_ms, timeout_ms);
    atomic_store(&f->in_call, 1);
    int delay = atomic_load(&f->delay_ms);
    if (delay > 0) fx_sleep_ms(delay < timeout_ms ? delay : timeout_ms);
    atomic_store(&f->in_call, 0);
    *out_ttl = 0;
    if (delay > timeout_ms) return FX_ETIMEDOUT;
    int fail = atomic_load(&f->fail_next);
    while (fail > 0 && !atomic_compare_exchange_weak(&f->fail_next, &fail, fail - 1)) {
    }
    if (fail > 0) return FX_ETIMEDOUT;
    if (atomic_load(&f->expired_id) == id) return FX_ELEASE_EXPIRED;
    switch (atomic_load(&f->mode)) {
    case FAKE_TIMEOUT: return FX_ETIMEDOUT;
    case FAKE_UNAVAIL: return FX_EUNAVAIL;
    case FAKE_SERVER: return FX_ESERVER;
    case FAKE_EXPIRED: return FX_ELEASE_EXPIRED;
    default: break;
    }
    *out_ttl = 3;
    return FX_OK;
}

static fx_lease_backend fake_backend(fake *f)
{
    fx_lease_backend b = {f->uid, fake_keepalive, f};
    return b;
}

static fx_lease_mgr *new_mgr(int retry_ms)
{
    fx_lease_mgr_opts o = {.op_timeout_ms = 1500, .retry_interval_ms = retry_ms,
                           .probe_timeout_ms = 2000};
    fx_lease_mgr *m = NULL;
    assert_int_equal(fx_lease_mgr_new(&o, &m), FX_OK);
    assert_non_null(m);
    return m;
}

static fx_lease_mgr_stats stats(fx_lease_mgr *m)
{
    fx_lease_mgr_stats s;
    fx_lease_mgr_get_stats(m, &s);
    return s;
}

static fx_lease *reg(fx_lease_mgr *m, fake *f, int64_t ttl, int64_t id, const fx_lease_reg_opts *o)
{
    fx_lease_backend b = fake_backend(f);
    fx_lease *h = NULL;
    fx_err r = fx_lease_register(m, &b, ttl, id, o, &h);
    if (r != FX_OK) fail_msg("register(%lld, %lld): %s %s", (long long)ttl, (long long)id,
                             fx_errname(r), fx_err_detail());
    assert_non_null(h);
    return h;
}

/* ---- callbacks -------------------------------------------------------------------------------- */

typedef struct cbrec {
    _Atomic int calls;
    _Atomic int64_t id;
    _Atomic(fx_lease *) h;
    pthread_t thread;
    _Atomic bool thread_set;
    /* behaviour */
    bool release_self;
    _Atomic(fx_lease *) release_other;
    _Atomic int block;   /* 1: wait (bounded) until `go` */
    _Atomic int started;
    _Atomic int go;
    _Atomic int64_t finished_ms;
} cbrec;

static void on_expired(void *arg, fx_lease *h, int64_t lease_id)
{
    cbrec *c = arg;
    if (!atomic_exchange(&c->thread_set, true)) c->thread = pthread_self();
    atomic_store(&c->id, lease_id);
    atomic_store(&c->h, h);
    atomic_store(&c->started, 1);
    if (atomic_load(&c->block)) {
        int64_t deadline = fx_now_ms() + FXT_MS(3000); /* bounded */
        while (!atomic_load(&c->go) && fx_now_ms() < deadline) fx_sleep_ms(2);
    }
    fx_lease *other = atomic_exchange(&c->release_other, NULL);
    if (other) fx_lease_release(other);
    if (c->release_self) fx_lease_release(h);
    atomic_store(&c->finished_ms, fx_now_ms());
    atomic_fetch_add(&c->calls, 1);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_invalid_args(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    fx_lease_backend b = fake_backend(&f);
    fx_lease *h = (fx_lease *)&b; /* must be reset to NULL on failure */
    assert_int_equal(fx_lease_register(m, &b, 0, 1, NULL, &h), FX_EINVAL);
    assert_null(h);
    assert_int_equal(fx_lease_register(m, &b, 3, 0, NULL, &h), FX_EINVAL);
    assert_int_equal(fx_lease_register(m, &b, -1, 1, NULL, &h), FX_EINVAL);
    assert_int_equal(fx_lease_register(m, NULL, 3, 1, NULL, &h), FX_EINVAL);
    fx_lease_backend nouid = {NULL, fake_keepalive, &f};
    assert_int_equal(fx_lease_register(m, &nouid, 3, 1, NULL, &h), FX_EINVAL);
    fx_lease_backend noka = {"x", NULL, &f};
    assert_int_equal(fx_lease_register(m, &noka, 3, 1, NULL, &h), FX_EINVAL);
    assert_int_equal(atomic_load(&f.calls), 0);
    fx_lease_release(NULL);
    fx_lease_mgr_free(NULL);
    assert_int_equal(fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 1), 0);
    fx_lease_mgr_opts bad = {.op_timeout_ms = -1};
    fx_lease_mgr *m2 = NULL;
    assert_int_equal(fx_lease_mgr_new(&bad, &m2), FX_EINVAL);
    assert_null(m2);
    fx_lease_mgr_free(m);
}

static void test_shared_and_separate_entries(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake a, b;
    fake_init(&a, "fake-a");
    fake_init(&b, "fake-b");
    fx_lease *h1 = reg(m, &a, 30, 7, NULL);
    fx_lease *h2 = reg(m, &a, 30, 7, NULL);  /* same key: shared */
    assert_ptr_not_equal(h1, h2);
    fx_lease_mgr_stats s = stats(m);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.handles, 2);
    fx_lease *h3 = reg(m, &a, 60, 7, NULL);  /* other ttl: separate */
    fx_lease *h4 = reg(m, &b, 30, 7, NULL);  /* other backend uid: separate */
    fx_lease *h5 = reg(m, &a, 30, 8, NULL);  /* other id: separate */
    s = stats(m);
    assert_int_equal(s.entries, 4);
    assert_int_equal(s.handles, 5);
    /* Every registration probed once (not skip_probe); probes are attributed to the entry. */
    assert_int_equal(atomic_load(&a.calls), 4);
    assert_int_equal(atomic_load(&b.calls), 1);
    assert_int_equal(s.keepalives, 5);
    assert_int_equal(fx_lease_mgr_entry_keepalives(m, "fake-a", 30, 7), 2);
    assert_int_equal(fx_lease_mgr_entry_keepalives(m, "fake-a", 60, 7), 1);
    assert_int_equal(fx_lease_mgr_entry_keepalives(m, "fake-b", 30, 7), 1);
    assert_int_equal(fx_lease_id(h4), 7);
    assert_int_equal(fx_lease_ttl(h3), 60);
    assert_false(fx_lease_is_expired(h1));
    fx_lease_release(h1);
    fx_lease_release(h2);
    fx_lease_release(h3);
    fx_lease_release(h4);
    fx_lease_release(h5);
    s = stats(m);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.handles, 0);
    fx_lease_mgr_free(m);
}

static void test_refcount_last_release_removes_entry(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    fx_lease_reg_opts o = {.skip_probe = true};
    fx_lease *h1 = reg(m, &f, 3, 11, &o);
    fx_lease *h2 = reg(m, &f, 3, 11, &o);
    fx_lease_release(h1);
    fx_lease_mgr_stats s = stats(m);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.handles, 1);
    /* The remaining handle keeps the entry renewing (cadence 1 s). */
    bool ok;
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 11) >= 2, 3500);
    assert_true(ok);
    fx_lease_release(h2);
    s = stats(m);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.handles, 0);
    assert_int_equal(fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 11), 0);
    /* No keepalive after the last release (observe 1.5 cadences). */
    int calls = atomic_load(&f.calls);
    fx_sleep_ms(1500);
    assert_int_equal(atomic_load(&f.calls), calls);
    fx_lease_mgr_free(m);
}

static void test_probe_expired_fails(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    atomic_store(&f.expired_id, 5);
    fx_lease_backend b = fake_backend(&f);
    fx_lease *h = NULL;
    assert_int_equal(fx_lease_register(m, &b, 3, 5, NULL, &h), FX_ELEASE_EXPIRED);
    assert_null(h);
    assert_int_equal(atomic_load(&f.calls), 1); /* expired is final: no retry */
    fx_lease_mgr_stats s = stats(m);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.handles, 0);
    assert_int_equal(s.keepalive_failures, 0);
    fx_lease_mgr_free(m);
}

static void test_probe_retries_transient(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(50);
    fake f;
    fake_init(&f, "fake-a");
    fx_lease_backend b = fake_backend(&f);
    /* Two transient failures, then success: registration succeeds on the third attempt. */
    atomic_store(&f.fail_next, 2);
    fx_lease *h = NULL;
    assert_int_equal(fx_lease_register(m, &b, 3, 9, NULL, &h), FX_OK);
    assert_int_equal(atomic_load(&f.calls), 3);
    assert_int_equal(stats(m).keepalive_failures, 2);
    fx_lease_release(h);
    /* Three failures: registration fails with the transport error, nothing registered. */
    atomic_store(&f.calls, 0);
    atomic_store(&f.fail_next, 3);
    h = NULL;
    assert_int_equal(fx_lease_register(m, &b, 3, 9, NULL, &h), FX_ETIMEDOUT);
    assert_null(h);
    assert_int_equal(atomic_load(&f.calls), 3);
    assert_int_equal(stats(m).entries, 0);
    /* The probe's per-call deadline is min(op_timeout, cadence): ttl 3 -> 1000 ms. */
    assert_true(atomic_load(&f.last_timeout_ms) <= 1000);
    fx_lease_mgr_free(m);
}

static void test_skip_probe_and_first_renewal_after_cadence(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    fx_lease_reg_opts o = {.skip_probe = true};
    int64_t t0 = fx_now_ms();
    fx_lease *h = reg(m, &f, 3, 12, &o);
    assert_int_equal(atomic_load(&f.calls), 0);
    assert_int_equal(stats(m).keepalives, 0);
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&f.calls) >= 3, 5000);
    assert_true(ok);
    int64_t first = atomic_load(&f.ts[0]) - t0;
    print_message("first renewal after %lld ms; intervals %lld, %lld ms\n", (long long)first,
                  (long long)(atomic_load(&f.ts[1]) - atomic_load(&f.ts[0])),
                  (long long)(atomic_load(&f.ts[2]) - atomic_load(&f.ts[1])));
    /* cadence max(3/3, 1) = 1 s; the first renewal one cadence after registration */
    assert_true(first >= 990 && first <= FXT_MS(1400));
    for (int i = 1; i < 3; i++) {
        int64_t d = atomic_load(&f.ts[i]) - atomic_load(&f.ts[i - 1]);
        assert_true(d >= 950 && d <= FXT_MS(1300));
    }
    /* per-call deadline min(op_timeout 1500, cadence 1000) */
    assert_int_equal(atomic_load(&f.last_timeout_ms), 1000);
    fx_lease_release(h);
    fx_lease_mgr_free(m);
}

static void test_retry_on_failure_then_recover(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    fx_lease_reg_opts o = {.skip_probe = true};
    atomic_store(&f.mode, FAKE_SERVER);
    fx_lease *h = reg(m, &f, 6, 13, &o); /* cadence 2 s */
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&f.calls) >= 5, 4000);
    assert_true(ok);
    /* after the first (failed) renewal, retries come every retry interval (100 ms): paced (one
     * late call may be followed by one on time, so the floor is on the three intervals together)
     * and never slower than the slow-build factor allows */
    for (int i = 2; i < 5; i++) {
        int64_t d = atomic_load(&f.ts[i]) - atomic_load(&f.ts[i - 1]);
        assert_true(d >= 0 && d <= FXT_MS(400));
    }
    assert_true(atomic_load(&f.ts[4]) - atomic_load(&f.ts[1]) >= 3 * 90);
    assert_true(stats(m).keepalive_failures >= 4);
    assert_false(fx_lease_is_expired(h)); /* transient failures never expire an entry */
    atomic_store(&f.mode, FAKE_OK);
    /* every call numbered n0 or later starts after the switch and succeeds */
    int n0 = atomic_load(&f.calls);
    WAIT_UNTIL(ok, atomic_load(&f.calls) >= n0 + 2, 3500);
    assert_true(ok);
    /* back on cadence: the call after the successful one comes ~2 s later */
    int64_t d = atomic_load(&f.ts[n0 + 1]) - atomic_load(&f.ts[n0]);
    print_message("interval after recovery: %lld ms\n", (long long)d);
    assert_true(d >= 1900 && d <= FXT_MS(2400));
    fx_lease_release(h);
    fx_lease_mgr_free(m);
}

static void test_transport_failure_defers_same_backend(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f, g;
    fake_init(&f, "fake-a");
    fake_init(&g, "fake-b");
    fx_lease_reg_opts o = {.skip_probe = true};
    fx_lease *h1 = reg(m, &f, 3, 21, &o);
    fx_lease *h2 = reg(m, &f, 3, 22, &o);
    fx_lease *h3 = reg(m, &g, 3, 23, &o); /* other backend: never deferred */
    atomic_store(&f.mode, FAKE_UNAVAIL);
    bool ok;
    WAIT_UNTIL(ok, stats(m).deferred >= 5, 4000);
    assert_true(ok);
    uint64_t k1 = fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 21);
    uint64_t k2 = fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 22);
    /* counted from the snapshot: on a slow build the calls before it may already number 12 */
    int c0 = atomic_load(&f.calls);
    WAIT_UNTIL(ok, atomic_load(&f.calls) >= c0 + 5, 3000);
    assert_true(ok);
    uint64_t d1 = fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 21) - k1;
    uint64_t d2 = fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 22) - k2;
    print_message("while unavailable: entry 21 +%llu calls, entry 22 +%llu calls, deferred %llu\n",
                  (unsigned long long)d1, (unsigned long long)d2,
                  (unsigned long long)stats(m).deferred);
    /* one call per retry interval probes the dead backend; the other entry waits */
    assert_true((d1 <= 1 && d2 >= 3) || (d2 <= 1 && d1 >= 3));
    /* the healthy backend keeps its cadence */
    assert_true(atomic_load(&g.calls) >= 1);
    /* A non-transport error does not defer. */
    atomic_store(&f.mode, FAKE_SERVER);
    uint64_t def0 = stats(m).deferred;
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 21) >= k1 + d1 + 3 &&
                       fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 22) >= k2 + d2 + 3, 3000);
    assert_true(ok);
    assert_true(stats(m).deferred <= def0 + 1); /* at most one from a call already running */
    atomic_store(&f.mode, FAKE_OK);
    fx_lease_release(h1);
    fx_lease_release(h2);
    fx_lease_release(h3);
    fx_lease_mgr_free(m);
}

static void test_expiry_notifies_every_holder_once(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    cbrec c1 = {0}, c2 = {0};
    fx_lease_reg_opts o1 = {.skip_probe = true, .on_expired = on_expired, .arg = &c1};
    fx_lease_reg_opts o2 = {.on_expired = on_expired, .arg = &c2};
    fx_lease *h1 = reg(m, &f, 3, 31, &o1);
    fx_lease *h2 = reg(m, &f, 3, 31, &o2);
    fx_lease *h3 = reg(m, &f, 3, 31, NULL); /* no callback: only the flag */
    fx_lease *other = reg(m, &f, 3, 32, NULL); /* another lease on the same backend */
    int64_t t0 = fx_now_ms();
    atomic_store(&f.expired_id, 31);
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&c1.calls) == 1 && atomic_load(&c2.calls) == 1, 2500);
    assert_true(ok);
    print_message("both holders notified %lld ms after the lease became expired\n",
                  (long long)(fx_now_ms() - t0));
    assert_true(fx_now_ms() - t0 <= FXT_MS(1500)); /* within one cadence (+ margin) */
    assert_true(fx_lease_is_expired(h1));
    assert_true(fx_lease_is_expired(h2));
    assert_true(fx_lease_is_expired(h3));
    assert_false(fx_lease_is_expired(other));
    assert_int_equal(atomic_load(&c1.id), 31);
    assert_ptr_equal(atomic_load(&c1.h), h1);
    assert_ptr_equal(atomic_load(&c2.h), h2);
    /* on the manager thread, not ours */
    assert_false(pthread_equal(c1.thread, pthread_self()));
    assert_true(pthread_equal(c1.thread, c2.thread));
    fx_lease_mgr_stats s = stats(m);
    assert_int_equal(s.expired, 1);
    /* a later registration on the known-expired entry fails, with or without probe */
    fx_lease_backend b = fake_backend(&f);
    fx_lease *h4 = NULL;
    fx_lease_reg_opts skip = {.skip_probe = true};
    int calls = atomic_load(&f.calls);
    assert_int_equal(fx_lease_register(m, &b, 3, 31, &skip, &h4), FX_ELEASE_EXPIRED);
    assert_int_equal(fx_lease_register(m, &b, 3, 31, NULL, &h4), FX_ELEASE_EXPIRED);
    assert_null(h4);
    assert_int_equal(atomic_load(&f.calls), calls); /* known expired: no call needed */
    /* exactly once, and the expired entry is no longer renewed (observe > one cadence) */
    uint64_t k = fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 31);
    fx_sleep_ms(1300);
    assert_int_equal(atomic_load(&c1.calls), 1);
    assert_int_equal(atomic_load(&c2.calls), 1);
    assert_int_equal(fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 31), k);
    assert_true(fx_lease_mgr_entry_keepalives(m, "fake-a", 3, 32) >= 2); /* other lease renews */
    assert_int_equal(stats(m).expired, 1);
    fx_lease_release(h1);
    fx_lease_release(h2);
    fx_lease_release(h3);
    fx_lease_release(other);
    s = stats(m);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.handles, 0);
    fx_lease_mgr_free(m);
}

static void test_probe_expired_marks_known_entry(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    cbrec c = {0};
    fx_lease_reg_opts o = {.skip_probe = true, .on_expired = on_expired, .arg = &c};
    fx_lease *h = reg(m, &f, 30, 33, &o); /* cadence 10 s: the thread will not look soon */
    atomic_store(&f.expired_id, 33);
    fx_lease_backend b = fake_backend(&f);
    fx_lease *h2 = NULL;
    assert_int_equal(fx_lease_register(m, &b, 30, 33, NULL, &h2), FX_ELEASE_EXPIRED);
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&c.calls) == 1, 1000);
    assert_true(ok);
    assert_true(fx_lease_is_expired(h));
    fx_lease_release(h);
    fx_lease_mgr_free(m);
}

static void test_release_inside_callback(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    cbrec self1 = {.release_self = true}, self2 = {.release_self = true};
    cbrec ca = {0}, cb = {0};
    fx_lease_reg_opts os1 = {.skip_probe = true, .on_expired = on_expired, .arg = &self1};
    fx_lease_reg_opts os2 = {.skip_probe = true, .on_expired = on_expired, .arg = &self2};
    fx_lease_reg_opts oa = {.skip_probe = true, .on_expired = on_expired, .arg = &ca};
    fx_lease_reg_opts ob = {.skip_probe = true, .on_expired = on_expired, .arg = &cb};
    fx_lease *s1 = reg(m, &f, 3, 41, &os1);
    fx_lease *a = reg(m, &f, 3, 41, &oa);
    fx_lease *bh = reg(m, &f, 3, 41, &ob);
    fx_lease *s2 = reg(m, &f, 3, 41, &os2);
    (void)s1;
    (void)s2;
    /* a's callback releases b and b's callback releases a: whichever runs first wins, and
     * the released one's callback must then never run. */
    atomic_store(&ca.release_other, bh);
    atomic_store(&cb.release_other, a);
    atomic_store(&f.expired_id, 41);
    bool ok;
    /* s1, s2 and one of a/b are released from callbacks; the survivor stays */
    WAIT_UNTIL(ok, stats(m).handles == 1 && atomic_load(&self1.calls) == 1 &&
                       atomic_load(&self2.calls) == 1, 2500);
    assert_true(ok);
    assert_int_equal(atomic_load(&ca.calls) + atomic_load(&cb.calls), 1);
    fx_lease *survivor = atomic_load(&ca.calls) ? a : bh;
    assert_true(fx_lease_is_expired(survivor));
    fx_sleep_ms(200); /* observe: the released one's callback does not run late */
    assert_int_equal(atomic_load(&ca.calls) + atomic_load(&cb.calls), 1);
    fx_lease_release(survivor);
    fx_lease_mgr_stats s = stats(m);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.expired, 1);
    fx_lease_mgr_free(m);
}

typedef struct rel_arg {
    fx_lease *h;
    _Atomic int64_t returned_ms;
} rel_arg;

static void *release_thread(void *p)
{
    rel_arg *r = p;
    fx_lease_release(r->h);
    atomic_store(&r->returned_ms, fx_now_ms());
    return NULL;
}

static void test_release_waits_for_running_callback(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    cbrec c = {0};
    atomic_store(&c.block, 1);
    fx_lease_reg_opts o = {.skip_probe = true, .on_expired = on_expired, .arg = &c};
    fx_lease *h = reg(m, &f, 3, 51, &o);
    atomic_store(&f.expired_id, 51);
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&c.started) == 1, 2500);
    assert_true(ok);
    rel_arg r = {.h = h};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_thread, &r), 0);
    /* observe: release must not return while the callback runs */
    fx_sleep_ms(200);
    int64_t returned_early = atomic_load(&r.returned_ms);
    atomic_store(&c.go, 1);
    pthread_join(t, NULL); /* joined before any check can leave this frame (r, c live here) */
    assert_int_equal(returned_early, 0);
    assert_int_equal(atomic_load(&c.calls), 1);
    assert_true(atomic_load(&r.returned_ms) >= atomic_load(&c.finished_ms));
    assert_int_equal(stats(m).handles, 0);
    fx_lease_mgr_free(m);
}

static void test_release_without_callback_is_prompt(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    cbrec c1 = {0}, c2 = {0};
    fx_lease_reg_opts o1 = {.skip_probe = true, .on_expired = on_expired, .arg = &c1};
    fx_lease_reg_opts o2 = {.skip_probe = true, .on_expired = on_expired, .arg = &c2};
    fx_lease *h1 = reg(m, &f, 3, 61, &o1);
    fx_lease *h2 = reg(m, &f, 3, 61, &o2);
    int64_t t0 = fx_now_ms();
    fx_lease_release(h1);
    assert_true(fx_now_ms() - t0 < FXT_MS(50)); /* release does not wait for the thread */
    atomic_store(&f.expired_id, 61);
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&c2.calls) == 1, 2500);
    assert_true(ok);
    /* after release() returned, the released handle's callback never runs */
    assert_int_equal(atomic_load(&c1.calls), 0);
    fx_lease_release(h2);
    fx_lease_mgr_free(m);
}

static void test_release_waits_for_call_using_its_ctx(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    atomic_store(&f.delay_ms, 400);
    fx_lease_reg_opts o = {.skip_probe = true};
    fx_lease *h = reg(m, &f, 3, 71, &o);
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&f.in_call) == 1, 2500);
    assert_true(ok);
    fx_lease_release(h);
    /* the backend ctx may be freed now: the running call must have returned */
    assert_int_equal(atomic_load(&f.in_call), 0);
    int calls = atomic_load(&f.calls);
    assert_int_equal(stats(m).entries, 0);
    int64_t t0 = fx_now_ms();
    fx_lease_mgr_free(m);
    assert_true(fx_now_ms() - t0 < FXT_MS(500));
    assert_int_equal(atomic_load(&f.calls), calls);
}

static void test_free_interrupts_thread_promptly(void **state)
{
    (void)state;
    /* idle manager (the thread is in its wait) */
    fx_lease_mgr *m = new_mgr(100);
    fx_sleep_ms(50);
    int64_t t0 = fx_now_ms();
    fx_lease_mgr_free(m);
    int64_t idle_ms = fx_now_ms() - t0;
    /* a manager whose thread sleeps until a far due time (ttl 60: cadence 20 s) */
    m = new_mgr(100);
    fake f;
    fake_init(&f, "fake-a");
    fx_lease *h = reg(m, &f, 60, 81, NULL);
    fx_lease_release(h);
    t0 = fx_now_ms();
    fx_lease_mgr_free(m);
    int64_t far_ms = fx_now_ms() - t0;
    /* a manager that was in its retry loop until the handle went away */
    m = new_mgr(100);
    atomic_store(&f.mode, FAKE_UNAVAIL);
    fx_lease_reg_opts o = {.skip_probe = true};
    h = reg(m, &f, 3, 82, &o);
    bool ok;
    WAIT_UNTIL(ok, stats(m).keepalive_failures >= 2, 3000);
    assert_true(ok);
    fx_lease_release(h);
    t0 = fx_now_ms();
    fx_lease_mgr_free(m);
    int64_t retry_ms = fx_now_ms() - t0;
    print_message("free took %lld ms (idle), %lld ms (far due), %lld ms (after retry loop)\n",
                  (long long)idle_ms, (long long)far_ms, (long long)retry_ms);
    assert_true(idle_ms < FXT_MS(500));
    assert_true(far_ms < FXT_MS(500));
    assert_true(retry_ms < FXT_MS(500));
}

/* Several threads register and release handles on a few keys while leases expire: for TSan,
 * ASan and the counters. */
typedef struct stress_arg {
    fx_lease_mgr *m;
    fake *f;
    int seed;
    _Atomic int *cb_calls;
} stress_arg;

static void stress_cb(void *arg, fx_lease *h, int64_t id)
{
    (void)h;
    (void)id;
    atomic_fetch_add((_Atomic int *)arg, 1);
}

static void *stress_thread(void *p)
{
    stress_arg *a = p;
    fx_lease_backend b = fake_backend(a->f);
    fx_lease *held[8] = {0};
    unsigned s = (unsigned)a->seed;
    int64_t end = fx_now_ms() + 1500;
    for (int i = 0; i < 5000 && fx_now_ms() < end; i++) {
        s = s * 1103515245u + 12345u;
        int slot = (int)((s >> 8) % 8);
        if (held[slot]) {
            fx_lease_release(held[slot]);
            held[slot] = NULL;
        } else {
            fx_lease_reg_opts o = {.skip_probe = (s >> 4) & 1, .on_expired = stress_cb,
                                   .arg = a->cb_calls};
            fx_err r = fx_lease_register(a->m, &b, 3, 100 + slot % 4, &o, &held[slot]);
            if (r != FX_OK && r != FX_ELEASE_EXPIRED) return (void *)1;
        }
        if (i % 16 == 0) fx_sleep_ms(1);
    }
    for (int k = 0; k < 8; k++) fx_lease_release(held[k]);
    return NULL;
}

static void test_concurrent_register_release(void **state)
{
    (void)state;
    fx_lease_mgr *m = new_mgr(50);
    fake f;
    fake_init(&f, "fake-a");
    atomic_store(&f.expired_id, 102); /* one of the keys is expired: exercises notifications */
    _Atomic int cb_calls = 0;
    stress_arg args[4];
    pthread_t t[4];
    int started = 0;
    for (int i = 0; i < 4; i++) {
        args[i] = (stress_arg){m, &f, i + 1, &cb_calls};
        if (pthread_create(&t[i], NULL, stress_thread, &args[i]) != 0) break;
        started++;
    }
    /* every started thread joined before any check can leave this frame (args live here) */
    void *rv[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < started; i++) pthread_join(t[i], &rv[i]);
    assert_int_equal(started, 4);
    for (int i = 0; i < 4; i++) assert_null(rv[i]);
    fx_lease_mgr_stats s = stats(m);
    print_message("stress: %llu keepalives, %llu expired, %d callbacks\n",
                  (unsigned long long)s.keepalives, (unsigned long long)s.expired,
                  atomic_load(&cb_calls));
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.handles, 0);
    assert_true(s.keepalives > 0);
    fx_lease_mgr_free(m);
}

int main(void)
{
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_shared_and_separate_entries),
        cmocka_unit_test(test_refcount_last_release_removes_entry),
        cmocka_unit_test(test_probe_expired_fails),
        cmocka_unit_test(test_probe_retries_transient),
        cmocka_unit_test(test_skip_probe_and_first_renewal_after_cadence),
        cmocka_unit_test(test_retry_on_failure_then_recover),
        cmocka_unit_test(test_transport_failure_defers_same_backend),
        cmocka_unit_test(test_expiry_notifies_every_holder_once),
        cmocka_unit_test(test_probe_expired_marks_known_entry),
        cmocka_unit_test(test_release_inside_callback),
        cmocka_unit_test(test_release_waits_for_running_callback),
        cmocka_unit_test(test_release_without_callback_is_prompt),
        cmocka_unit_test(test_release_waits_for_call_using_its_ctx),
        cmocka_unit_test(test_free_interrupts_thread_promptly),
        cmocka_unit_test(test_concurrent_register_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
