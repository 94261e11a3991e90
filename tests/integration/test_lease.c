/* test_lease.c -- the LeaseManager (lease/lease_mgr.h) against a real etcd.
 *
 * lease_shared_entry: two handles of one lease share one entry: its keepalives over ~3 cadences
 *   match a one-handle lease's, not double.
 * lease_release_never_revokes: releasing the last handle leaves the lease and its key alive; the
 *   key disappears only by TTL.
 * lease_keepalive_survives_blip: etcd stopped ~2 s (< TTL) and restarted: the keepalive retries,
 *   recovers, and keeps the lease alive for more than one TTL after the restart.
 * lease_expiry_notifies_holders: a lease revoked behind the manager's back: every holder's
 *   callback runs within one cadence (+ margin).
 * lease_register_expired_fails: registering a revoked or unknown lease fails with
 *   FX_ELEASE_EXPIRED (and skip_probe on one is noticed within a cadence).
 * lease_not_starved: 4 threads saturate the client's connection pool with 64 KiB puts; the
 *   keepalives (reserved lane) stay on cadence.
 * lease_kv_backend: a KV payload lease (fx_lease_backend_kv) is kept alive through the KV store
 *   and is a separate registry entry from the same id under the etcd backend.
 */
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

#include "etcd.h"
#include "fx_log.h"
#include "fx_time.h"
#include "kv.h"
#include "lease_mgr.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"
#include "tests/support/fxt_slow.h"

#define OP_MS 3000

typedef struct ctx {
    fxt_etcd etcd;
    fx_etcd *c;
} ctx;

static fx_err new_client(ctx *x, int max_conns, fx_etcd **out)
{
    const char *eps[] = {x->etcd.endpoint};
    fx_etcd_opts o = {.endpoints = eps, .n_endpoints = 1, .max_conns = max_conns,
                      .connect_timeout_ms = 500};
    return fx_etcd_new(&o, out);
}

static int group_setup(void **state)
{
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    ctx *x = calloc(1, sizeof *x);
    if (!x) return -1;
    if (fxt_etcd_start(&x->etcd) != 0) {
        free(x);
        return -1;
    }
    fx_err e = new_client(x, 0, &x->c);
    if (e != FX_OK) {
        fprintf(stderr, "etcd client: %s (%s)\n", fx_errname(e), fx_err_detail());
        fxt_etcd_destroy(&x->etcd);
        free(x);
        return -1;
    }
    *state = x;
    return 0;
}

/* Managers not freed yet: a test that fails half-way leaves its manager's thread running, and
 * the group teardown must not free the etcd client under it. */
static int live_mgrs;

static int group_teardown(void **state)
{
    ctx *x = *state;
    if (!x) return 0;
    if (live_mgrs > 0) /* the process ends: left to it, not freed under a running thread */
        fprintf(stderr, "%d lease manager(s) left running by a failed test: the etcd client is "
                        "not freed\n", live_mgrs);
    else
        fx_etcd_free(x->c);
    fxt_etcd_destroy(&x->etcd);
    free(x);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static fx_lease_mgr *new_mgr(void)
{
    fx_lease_mgr *m = NULL;
    CHECK(fx_lease_mgr_new(NULL, &m));
    live_mgrs++;
    return m;
}

static void free_mgr(fx_lease_mgr *m)
{
    fx_lease_mgr_free(m);
    live_mgrs--;
}

static int64_t grant(fx_etcd *c, int64_t ttl)
{
    int64_t id = 0, got = 0;
    CHECK(fx_etcd_lease_grant(c, ttl, 0, &id, &got, OP_MS));
    assert_true(id > 0);
    assert_int_equal(got, ttl);
    return id;
}

static void put_key(fx_etcd *c, const char *key, const char *val, int64_t lease)
{
    fx_put_req r = {.key = FX_SLICE_STR(key), .value = FX_SLICE_STR(val), .lease = lease};
    CHECK(fx_etcd_put(c, &r, NULL, OP_MS));
}

static bool key_exists(fx_etcd *c, const char *key)
{
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(c, FX_SLICE_STR(key), &kv, OP_MS);
    fx_kv_free(&kv);
    if (e != FX_OK && e != FX_ENOTFOUND)
        fail_msg("get %s: %s (%s)", key, fx_errname(e), fx_err_detail());
    return e == FX_OK;
}

static int64_t ttl_left(fx_etcd *c, int64_t id)
{
    int64_t ttl = 0;
    CHECK(fx_etcd_lease_timetolive(c, id, &ttl, NULL, OP_MS));
    return ttl;
}

static fx_lease *reg(fx_lease_mgr *m, fx_etcd *c, int64_t ttl, int64_t id,
                     const fx_lease_reg_opts *o)
{
    fx_lease_backend b = fx_lease_backend_etcd(c);
    fx_lease *h = NULL;
    CHECK(fx_lease_register(m, &b, ttl, id, o, &h));
    assert_non_null(h);
    return h;
}

static uint64_t etcd_keepalives(fx_etcd *c)
{
    fx_etcd_stats s;
    fx_etcd_get_stats(c, &s);
    return s.keepalives;
}

static fx_lease_mgr_stats mstats(fx_lease_mgr *m)
{
    fx_lease_mgr_stats s;
    fx_lease_mgr_get_stats(m, &s);
    return s;
}

/* Poll `cond` every 20 ms until true or `ms` passed; `ok` receives the final value. */
#define WAIT_UNTIL(ok, cond, ms)                                                                 \
    do {                                                                                         \
        int64_t wu_deadline_ = fx_now_ms() + FXT_MS(ms);                                         \
        while (!((ok) = (cond)) && fx_now_ms() < wu_deadline_) fx_sleep_ms(20);                  \
    } while (0)

/* ---- tests --------------------------------------------------------------------------------- */

static void lease_shared_entry(void **state)
{
    ctx *x = *state;
    fx_lease_mgr *m = new_mgr();
    const char *uid = fx_etcd_uid(x->c);
    int64_t one = grant(x->c, 3), two = grant(x->c, 3); /* cadence 1 s */
    fx_lease_reg_opts skip = {.skip_probe = true};
    uint64_t ka0 = etcd_keepalives(x->c);
    fx_lease *h1 = reg(m, x->c, 3, one, &skip);
    fx_lease *h2a = reg(m, x->c, 3, two, &skip);
    fx_lease *h2b = reg(m, x->c, 3, two, &skip);
    fx_lease_mgr_stats s = mstats(m);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.handles, 3);
    /* ~3 cadences */
    bool ok;
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, uid, 3, one) >= 3, 5000);
    assert_true(ok);
    /* the other entry's renewal of this round (same cadence, registered together) */
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, uid, 3, two) >= 3, 2000);
    assert_true(ok);
    uint64_t k1 = fx_lease_mgr_entry_keepalives(m, uid, 3, one);
    uint64_t k2 = fx_lease_mgr_entry_keepalives(m, uid, 3, two);
    /* The manager counts a keepalive when it starts it (under its lock), the etcd client a moment
     * later, when the call goes out: wait for that moment (well inside the 1 s cadence). */
    uint64_t sent = 0;
    WAIT_UNTIL(ok, (sent = etcd_keepalives(x->c) - ka0) >= k1 + k2, 500);
    print_message("one handle: %llu keepalives; two handles: %llu; etcd keepalive requests %llu\n",
                  (unsigned long long)k1, (unsigned long long)k2, (unsigned long long)sent);
    assert_true(k2 >= 2);
    assert_true(k2 <= k1 + 1); /* two handles of one entry: not double */
    assert_true(sent <= k1 + k2 + 1);
    assert_true(sent >= k1 + k2);
    assert_true(ttl_left(x->c, two) > 0);
    fx_lease_release(h2a);
    assert_int_equal(mstats(m).entries, 2);
    fx_lease_release(h2b);
    fx_lease_release(h1);
    assert_int_equal(mstats(m).entries, 0);
    free_mgr(m);
    CHECK(fx_etcd_lease_revoke(x->c, one, OP_MS));
    CHECK(fx_etcd_lease_revoke(x->c, two, OP_MS));
}

static void lease_release_never_revokes(void **state)
{
    ctx *x = *state;
    fx_lease_mgr *m = new_mgr();
    int64_t id = grant(x->c, 3);
    put_key(x->c, "/fxt/lease/norevoke", "v", id);
    fx_lease *h = reg(m, x->c, 3, id, NULL);
    bool ok;
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, fx_etcd_uid(x->c), 3, id) >= 2, 3000);
    assert_true(ok);
    fx_lease_release(h);
    int64_t t_rel = fx_now_ms();
    assert_true(key_exists(x->c, "/fxt/lease/norevoke"));
    int64_t left = ttl_left(x->c, id);
    print_message("after the last release: key present, ttl left %lld s\n", (long long)left);
    assert_true(left > 0);
    free_mgr(m);
    WAIT_UNTIL(ok, !key_exists(x->c, "/fxt/lease/norevoke"), 6000);
    assert_true(ok);
    int64_t gone_ms = fx_now_ms() - t_rel;
    print_message("key gone %lld ms after the release (TTL 3 s)\n", (long long)gone_ms);
    assert_true(gone_ms >= 1000); /* by TTL, not by the release */
    assert_true(ttl_left(x->c, id) < 0);
}

static void lease_keepalive_survives_blip(void **state)
{
    ctx *x = *state;
    fx_lease_mgr *m = new_mgr();
    const char *uid = fx_etcd_uid(x->c);
    int64_t id = grant(x->c, 6); /* cadence 2 s */
    put_key(x->c, "/fxt/lease/blip/1", "a", id);
    put_key(x->c, "/fxt/lease/blip/2", "b", id);
    fx_lease *h = reg(m, x->c, 6, id, NULL);
    uint64_t fail0 = mstats(m).keepalive_failures;
    /* Place the outage so that a renewal falls ~1.2 s into it: wait for the first renewal
     * (2 s after registration), then 0.8 s. */
    bool ok;
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, uid, 6, id) >= 2, 4000);
    assert_true(ok);
    fx_sleep_ms(800);

    int64_t t_stop = fx_now_ms();
    assert_int_equal(fxt_etcd_stop(&x->etcd), 0);
    fx_sleep_ms(2000); /* fault injection: etcd down for ~2 s (< TTL) */
    assert_int_equal(fxt_etcd_restart(&x->etcd), 0);
    int64_t t_up = fx_now_ms();
    print_message("etcd down for %lld ms\n", (long long)(t_up - t_stop));
    uint64_t fail_down = mstats(m).keepalive_failures;
    uint64_t k_up = fx_lease_mgr_entry_keepalives(m, uid, 6, id);

    /* More than one TTL after the restart (etcd re-extends leases to their TTL when it starts,
     * so only our renewals can keep the lease alive past t_up + 6 s). */
    WAIT_UNTIL(ok, fx_now_ms() - t_up > 7000 || fx_lease_is_expired(h), 9000);
    assert_false(fx_lease_is_expired(h));
    int64_t left = ttl_left(x->c, id);
    fx_lease_mgr_stats s = mstats(m);
    uint64_t k_end = fx_lease_mgr_entry_keepalives(m, uid, 6, id);
    print_message("failures during the blip %llu, after %llu; keepalives since restart %llu; "
                  "ttl left %lld s\n",
                  (unsigned long long)(fail_down - fail0),
                  (unsigned long long)(s.keepalive_failures - fail0),
                  (unsigned long long)(k_end - k_up), (long long)left);
    assert_true(fail_down >= fail0 + 2);      /* failures (and retries) were seen ... */
    assert_true(left > 0);                    /* ... and the lease is alive */
    assert_true(k_end - k_up >= 2);           /* renewals resumed (7 s, cadence 2 s) */
    assert_true(key_exists(x->c, "/fxt/lease/blip/1"));
    assert_true(key_exists(x->c, "/fxt/lease/blip/2"));
    /* recovered: no new failure over one more cadence */
    uint64_t f1 = mstats(m).keepalive_failures;
    uint64_t k1 = fx_lease_mgr_entry_keepalives(m, uid, 6, id);
    WAIT_UNTIL(ok, fx_lease_mgr_entry_keepalives(m, uid, 6, id) > k1, 3000);
    assert_true(ok);
    assert_int_equal(mstats(m).keepalive_failures, f1);
    fx_lease_release(h);
    free_mgr(m);
    CHECK(fx_etcd_lease_revoke(x->c, id, OP_MS));
}

typedef struct cbrec {
    _Atomic int calls;
    _Atomic int64_t at_ms;
    _Atomic int64_t id;
} cbrec;

static void on_expired(void *arg, fx_lease *h, int64_t id)
{
    (void)h;
    cbrec *c = arg;
    atomic_store(&c->id, id);
    atomic_store(&c->at_ms, fx_now_ms());
    atomic_fetch_add(&c->calls, 1);
}

static void lease_expiry_notifies_holders(void **state)
{
    ctx *x = *state;
    fx_lease_mgr *m = new_mgr();
    int64_t id = grant(x->c, 3); /* cadence 1 s */
    cbrec c1 = {0}, c2 = {0};
    fx_lease_reg_opts o1 = {.on_expired = on_expired, .arg = &c1};
    fx_lease_reg_opts o2 = {.on_expired = on_expired, .arg = &c2};
    fx_lease *h1 = reg(m, x->c, 3, id, &o1);
    fx_lease *h2 = reg(m, x->c, 3, id, &o2);
    CHECK(fx_etcd_lease_revoke(x->c, id, OP_MS));
    int64_t t0 = fx_now_ms();
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&c1.calls) >= 1 && atomic_load(&c2.calls) >= 1, 3000);
    assert_true(ok);
    int64_t d1 = atomic_load(&c1.at_ms) - t0, d2 = atomic_load(&c2.at_ms) - t0;
    print_message("callbacks %lld ms and %lld ms after the revoke (cadence 1000 ms)\n",
                  (long long)d1, (long long)d2);
    assert_true(d1 <= FXT_MS(1500) && d2 <= FXT_MS(1500));
    assert_int_equal(atomic_load(&c1.id), id);
    assert_true(fx_lease_is_expired(h1));
    assert_true(fx_lease_is_expired(h2));
    assert_int_equal(mstats(m).expired, 1);
    fx_sleep_ms(1200); /* observe: once each */
    assert_int_equal(atomic_load(&c1.calls), 1);
    assert_int_equal(atomic_load(&c2.calls), 1);
    fx_lease_release(h1);
    fx_lease_release(h2);
    free_mgr(m);
}

static void lease_register_expired_fails(void **state)
{
    ctx *x = *state;
    fx_lease_mgr *m = new_mgr();
    fx_lease_backend b = fx_lease_backend_etcd(x->c);
    int64_t id = grant(x->c, 5);
    CHECK(fx_etcd_lease_revoke(x->c, id, OP_MS));
    fx_lease *h = NULL;
    assert_int_equal(fx_lease_register(m, &b, 5, id, NULL, &h), FX_ELEASE_EXPIRED);
    assert_null(h);
    /* never granted */
    assert_int_equal(fx_lease_register(m, &b, 5, INT64_C(0x1234567890abc), NULL, &h),
                     FX_ELEASE_EXPIRED);
    assert_null(h);
    fx_lease_mgr_stats s = mstats(m);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.handles, 0);
    assert_int_equal(s.keepalive_failures, 0);
    /* skip_probe on a dead lease: accepted, then found expired at the first renewal */
    cbrec c = {0};
    fx_lease_reg_opts o = {.skip_probe = true, .on_expired = on_expired, .arg = &c};
    CHECK(fx_lease_register(m, &b, 3, id, &o, &h));
    bool ok;
    WAIT_UNTIL(ok, atomic_load(&c.calls) == 1, 2500);
    assert_true(ok);
    assert_true(fx_lease_is_expired(h));
    fx_lease *h2 = NULL;
    assert_int_equal(fx_lease_register(m, &b, 3, id, &o, &h2), FX_ELEASE_EXPIRED);
    fx_lease_release(h);
    free_mgr(m);
}

/* A keepalive backend over the etcd lane that records when each call starts. */
typedef struct ts_backend {
    fx_etcd *c;
    _Atomic int n;
    _Atomic int64_t ts[64];
    _Atomic int64_t max_call_ms; /* slowest keepalive call */
} ts_backend;

static fx_err ts_keepalive(void *ctx_, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    ts_backend *t = ctx_;
    int i = atomic_fetch_add(&t->n, 1);
    int64_t t0 = fx_now_ms();
    if (i < 64) atomic_store(&t->ts[i], t0);
    fx_err e = fx_etcd_lease_keepalive_lane(t->c, id, out_ttl, timeout_ms);
    int64_t d = fx_now_ms() - t0;
    int64_t prev = atomic_load(&t->max_call_ms);
    while (d > prev && !atomic_compare_exchange_weak(&t->max_call_ms, &prev, d)) {
    }
    return e;
}

typedef struct hammer {
    fx_etcd *c;
    int idx;
    int64_t end_ms;
    const char *val;
    size_t len;
    int puts;
    int errors;
} hammer;

static void *hammer_thread(void *p)
{
    hammer *h = p;
    char key[64];
    for (int i = 0; i < 1500 && fx_now_ms() < h->end_ms; i++) {
        snprintf(key, sizeof key, "/fxt/lease/starve/%d/%d", h->idx, i % 4);
        fx_put_req r = {.key = FX_SLICE_STR(key), .value = {h->val, h->len}};
        if (fx_etcd_put(h->c, &r, NULL, 5000) == FX_OK) h->puts++;
        else h->errors++;
    }
    return NULL;
}

static void lease_not_starved(void **state)
{
    ctx *x = *state;
    fx_etcd *c = NULL;
    CHECK(new_client(x, 2, &c)); /* 2 pooled connections for 4 writers: the pool is saturated */
    fx_lease_mgr *m = new_mgr();
    int64_t id = grant(c, 3); /* cadence 1 s */
    ts_backend tb = {.c = c};
    fx_lease_backend b = {fx_etcd_uid(c), ts_keepalive, &tb};
    fx_lease *h = NULL;
    fx_lease_reg_opts skip = {.skip_probe = true};
    CHECK(fx_lease_register(m, &b, 3, id, &skip, &h));
    int64_t t_reg = fx_now_ms();

    size_t len = 64 * 1024;
    char *val = malloc(len);
    assert_non_null(val);
    memset(val, 'x', len);
    fx_etcd_stats s0;
    fx_etcd_get_stats(c, &s0);
    hammer hs[4];
    pthread_t th[4];
    int64_t end = fx_now_ms() + 5000;
    int started = 0;
    for (int i = 0; i < 4; i++) {
        hs[i] = (hammer){.c = c, .idx = i, .end_ms = end, .val = val, .len = len};
        if (pthread_create(&th[i], NULL, hammer_thread, &hs[i]) != 0) break;
        started++;
    }
    /* every started thread joined before any check can leave this frame (hs lives here) */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    assert_int_equal(started, 4);
    int64_t t_end = fx_now_ms();
    free(val);
    fx_etcd_stats s1;
    fx_etcd_get_stats(c, &s1);
    int puts = 0, errors = 0;
    for (int i = 0; i < 4; i++) {
        puts += hs[i].puts;
        errors += hs[i].errors;
    }
    int n = atomic_load(&tb.n);
    int64_t max_gap = 0;
    for (int i = 1; i < n && i < 64; i++) {
        int64_t gap = atomic_load(&tb.ts[i]) - atomic_load(&tb.ts[i - 1]);
        if (gap > max_gap) max_gap = gap;
    }
    int64_t first = n > 0 ? atomic_load(&tb.ts[0]) - t_reg : -1;
    fx_lease_mgr_stats ms = mstats(m);
    print_message("%d puts of 64 KiB (%d errors, %llu pool waits) in %lld ms; %d keepalives, "
                  "first after %lld ms, max gap %lld ms, slowest call %lld ms, %llu failures\n",
                  puts, errors, (unsigned long long)(s1.pool_waits - s0.pool_waits),
                  (long long)(t_end - t_reg), n, (long long)first, (long long)max_gap,
                  (long long)atomic_load(&tb.max_call_ms),
                  (unsigned long long)ms.keepalive_failures);
    assert_true(puts > 20);
    assert_true(n >= 4);
    assert_true(max_gap <= FXT_MS(1300));
    assert_true(atomic_load(&tb.max_call_ms) <= FXT_MS(500));
    assert_int_equal(ms.keepalive_failures, 0);
    assert_false(fx_lease_is_expired(h));
    assert_true(ttl_left(c, id) > 0);
    fx_lease_release(h);
    free_mgr(m);
    CHECK(fx_etcd_lease_revoke(c, id, OP_MS));
    fx_del_req d = {.key = FX_SLICE_STR("/fxt/lease/starve/"),
                    .range_end = FX_SLICE_STR("/fxt/lease/starve0")};
    CHECK(fx_etcd_delete(c, &d, NULL, OP_MS));
    fx_etcd_free(c);
}

static void lease_kv_backend(void **state)
{
    ctx *x = *state;
    const char *eps[] = {x->etcd.endpoint};
    fx_kv_etcd_opts ko = {.etcd = {.endpoints = eps, .n_endpoints = 1}, .prefix = "/fxt/lkv/"};
    fx_kv_store *s = NULL;
    CHECK(fx_kv_new_etcd(&ko, &s));
    fx_lease_mgr *m = new_mgr();
    int64_t id = 0;
    CHECK(fx_kv_allocate_lease(s, 3, &id, OP_MS));
    fx_kv_put_opts po = {.lease_id = id};
    CHECK(fx_kv_put(s, FX_SLICE_STR("p1"), FX_SLICE_STR("payload"), &po, OP_MS));

    fx_lease_backend kb = fx_lease_backend_kv(s);
    assert_non_null(kb.uid);
    assert_string_not_equal(kb.uid, fx_etcd_uid(x->c));
    fx_lease *h = NULL;
    CHECK(fx_lease_register(m, &kb, 3, id, NULL, &h));
    /* the same id under the control-plane backend is a separate entry */
    fx_lease *he = reg(m, x->c, 3, id, NULL);
    assert_int_equal(mstats(m).entries, 2);
    fx_lease_release(he);
    assert_int_equal(mstats(m).entries, 1);

    int64_t t0 = fx_now_ms();
    bool ok;
    WAIT_UNTIL(ok, fx_now_ms() - t0 > 4500 || fx_lease_is_expired(h), 6000); /* > TTL */
    uint64_t k = fx_lease_mgr_entry_keepalives(m, kb.uid, 3, id);
    print_message("kv lease: %llu keepalives in %lld ms\n", (unsigned long long)k,
                  (long long)(fx_now_ms() - t0));
    assert_true(k >= 4); /* probe + 4 renewals at 1 s cadence */
    assert_false(fx_lease_is_expired(h));
    fx_bytes v = {0};
    CHECK(fx_kv_get(s, FX_SLICE_STR("p1"), &v, OP_MS));
    fx_bytes_free(&v);
    fx_lease_release(h);
    free_mgr(m);

    /* an expired KV lease cannot be registered */
    m = new_mgr();
    CHECK(fx_etcd_lease_revoke(x->c, id, OP_MS));
    h = NULL;
    assert_int_equal(fx_lease_register(m, &kb, 3, id, NULL, &h), FX_ELEASE_EXPIRED);
    assert_null(h);
    assert_int_equal(fx_kv_get(s, FX_SLICE_STR("p1"), &v, OP_MS), FX_ENOTFOUND);
    free_mgr(m);
    fx_kv_store_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lease_shared_entry),
        cmocka_unit_test(lease_release_never_revokes),
        cmocka_unit_test(lease_keepalive_survives_blip),
        cmocka_unit_test(lease_expiry_notifies_holders),
        cmocka_unit_test(lease_register_expired_fails),
        cmocka_unit_test(lease_not_starved),
        cmocka_unit_test(lease_kv_backend),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
