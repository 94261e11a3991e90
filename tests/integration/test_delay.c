/* test_delay.c -- bridge/delay.h: the header-value parsers (no etcd), and against a real etcd the
 * due-time index (order, the scan window's bound, the channel's metadata lease on every key,
 * count and next due) and the mover lock (one holder; a dead holder's lock taken over once its
 * lease expires, never before; an unlock hands over at once).
 *
 *   build/tests/integration/test_delay [cmocka filter]
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "delay.h"
#include "etcd.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "tests/support/fxt.h"

static struct {
    fxt_etcd etcd;
    const char *eps[1];
    fx_etcd *raw;
} G;

static fx_mq_client *client_new(const char *root, const char *id)
{
    fx_mq_client_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.etcd.endpoints = G.eps;
    opts.etcd.n_endpoints = 1;
    opts.etcd.connect_timeout_ms = 500;
    opts.root = root;
    opts.min_ttl_s = 2;
    opts.op_timeout_ms = 3000;
    opts.client_id = id;
    fx_mq_client *c = NULL;
    fx_err e = fx_mq_client_new(&opts, &c);
    if (e != FX_OK) fail_msg("fx_mq_client_new(%s): %s (%s)", root, fx_errname(e), fx_err_detail());
    return c;
}

/* ---- parsers ---------------------------------------------------------------------------------- */

static void delay_parse_values(void **state)
{
    (void)state;
    int64_t ms = 0;
#define RFC(s, want)                                                                               \
    do {                                                                                           \
        assert_int_equal(fx_delay_parse_rfc3339(s, strlen(s), &ms), FX_OK);                        \
        assert_int_equal(ms, (int64_t)(want));                                                     \
    } while (0)
    RFC("1970-01-01T00:00:00Z", 0);
    RFC("2026-12-02T10:00:00Z", 1796205600000LL);
    RFC("2026-12-02T10:00:00.25Z", 1796205600250LL);
    RFC("2026-12-02T10:00:00.123456789z", 1796205600123LL);
    RFC("2026-12-02T11:30:00+01:30", 1796205600000LL);
    RFC("2026-12-02T08:00:00-02:00", 1796205600000LL);
    const char *bad[] = {"2026-12-02T10:00:00", "2026-12-02 10:00Z", "2026-13-02T10:00:00Z",
                         "2026-12-32T10:00:00Z", "2026-12-02T25:00:00Z", "tomorrow",
                         "2026-12-02T10:00:00Zx", "2026-12-02T10:00:00.Z", "1969-12-31T23:59:59Z"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(fx_delay_parse_rfc3339(bad[i], strlen(bad[i]), &ms), FX_EINVAL);

    bool unsup = false;
    const char *s = "@at 2026-12-02T10:00:00Z";
    assert_int_equal(fx_delay_parse_schedule(s, strlen(s), &ms, &unsup), FX_OK);
    assert_int_equal(ms, 1796205600000LL);
    s = "@every 1m";
    assert_int_equal(fx_delay_parse_schedule(s, strlen(s), &ms, &unsup), FX_EINVAL);
    assert_true(unsup);
    s = "0 30 * * * *";
    assert_int_equal(fx_delay_parse_schedule(s, strlen(s), &ms, &unsup), FX_EINVAL);
    assert_true(unsup);
    s = "at noon";
    assert_int_equal(fx_delay_parse_schedule(s, strlen(s), &ms, &unsup), FX_EINVAL);
    assert_false(unsup);

#define DUR(s, want)                                                                               \
    do {                                                                                           \
        assert_int_equal(fx_delay_parse_duration(s, strlen(s), &ms), FX_OK);                       \
        assert_int_equal(ms, (int64_t)(want));                                                     \
    } while (0)
    DUR("30s", 30000);
    DUR("1m30s", 90000);
    DUR("250ms", 250);
    DUR("1h", 3600000);
    DUR("1.5s", 1500);
    DUR("1500us", 2); /* rounded up: never early */
    DUR("2h45m", 9900000);
    const char *bd[] = {"", "30", "s", "-5s", "1x", "1.2.3s", "5 s", "200000000h"};
    for (size_t i = 0; i < sizeof bd / sizeof bd[0]; i++)
        assert_int_equal(fx_delay_parse_duration(bd[i], strlen(bd[i]), &ms), FX_EINVAL);
}

/* ---- index ------------------------------------------------------------------------------------- */

static int64_t resolve_lease(fx_mq_client *c, fx_delay *dl, const char *name)
{
    fx_mq_chan_cfg cfg = {.capacity = 1000, .ttl_s = 2, .retention_s = 60};
    int64_t mpmc = 0, lease = 0;
    assert_int_equal(fx_mpmc_resolve(c, name, &cfg, &mpmc), FX_OK);
    /* a producer registers the channel's data leases (keeps the metadata lease alive) */
    assert_int_equal(fx_delay_chan_lease(dl, mpmc, &lease), FX_OK);
    assert_true(lease > 0);
    return lease;
}

static void delay_index_order_window(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/t_delay_idx", "a");
    fx_delay *dl = NULL;
    assert_int_equal(fx_delay_new(c, "a", 2, &dl), FX_OK);
    int64_t lease = resolve_lease(c, dl, "orders");
    /* 300 entries with due times in a scrambled order: 1,000,000 + (i * 7919 mod 300) * 10 */
    enum { N = 300 };
    fx_delay_put p[N];
    char rec[N][16];
    for (int i = 0; i < N; i++) {
        int k = (int)(((int64_t)i * 7919) % N);
        snprintf(rec[i], sizeof rec[i], "r%d", k);
        p[i] = (fx_delay_put){.chan = "orders", .lease = lease, .due_ms = 1000000 + k * 10,
                              .id = 0x1000u + (uint64_t)i, .rec = {rec[i], strlen(rec[i])}};
    }
    size_t stored = 0;
    assert_int_equal(fx_delay_put_batch(dl, p, N, &stored, 5000), FX_OK);
    assert_int_equal(stored, N);
    int64_t n = 0;
    assert_int_equal(fx_delay_count(dl, "orders", &n, 0), FX_OK);
    assert_int_equal(n, N);
    int64_t nd = 0;
    assert_int_equal(fx_delay_next_due(dl, "orders", &nd, 0), FX_OK);
    assert_int_equal(nd, 1000000);

    /* due by 1,000,995: the 100 earliest, but the window is 64: 64, earliest first, more */
    fx_delay_entry *en = NULL;
    size_t ne = 0;
    bool more = false;
    assert_int_equal(fx_delay_scan(dl, "orders", 1000995, 64, &en, &ne, &more, 0), FX_OK);
    assert_int_equal(ne, 64);
    assert_true(more);
    for (size_t i = 0; i < ne; i++) {
        assert_int_equal(en[i].due_ms, 1000000 + (int64_t)i * 10);
        char want[32];
        snprintf(want, sizeof want, "r%d", (int)i);
        assert_int_equal(en[i].rec.len, strlen(want));
        assert_memory_equal(en[i].rec.data, want, strlen(want));
        /* every key carries the channel's metadata lease */
        fx_kv kv = {0};
        assert_int_equal(fx_etcd_get(G.raw, (fx_slice){en[i].key.data, en[i].key.len}, &kv, 3000), FX_OK);
        assert_int_equal(kv.lease, lease);
        fx_kv_free(&kv);
    }
    assert_int_equal(fx_delay_remove(dl, en, ne, 0), FX_OK);
    fx_delay_entries_free(en, ne);
    /* the rest of the due ones (36), nothing later than now */
    assert_int_equal(fx_delay_scan(dl, "orders", 1000995, 1000, &en, &ne, &more, 0), FX_OK);
    assert_int_equal(ne, 36);
    assert_false(more);
    assert_int_equal(en[0].due_ms, 1000640);
    assert_int_equal(en[35].due_ms, 1000990);
    assert_int_equal(fx_delay_remove(dl, en, ne, 0), FX_OK);
    fx_delay_entries_free(en, ne);
    /* nothing due before the earliest left */
    assert_int_equal(fx_delay_scan(dl, "orders", 1000999, 1000, &en, &ne, &more, 0), FX_OK);
    assert_int_equal(ne, 0);
    assert_int_equal(fx_delay_count(dl, "orders", &n, 0), FX_OK);
    assert_int_equal(n, N - 100);
    assert_int_equal(fx_delay_next_due(dl, "orders", &nd, 0), FX_OK);
    assert_int_equal(nd, 1001000);
    /* a scan never reads more than FX_DELAY_SCAN_MAX */
    assert_int_equal(fx_delay_scan(dl, "orders", FX_DELAY_DUE_MAX, 1u << 20, &en, &ne, &more, 0), FX_OK);
    assert_true(ne <= FX_DELAY_SCAN_MAX);
    assert_int_equal(ne, N - 100);
    fx_delay_entries_free(en, ne);
    /* another channel's index is separate */
    assert_int_equal(fx_delay_count(dl, "orders2", &n, 0), FX_OK);
    assert_int_equal(n, 0);
    assert_int_equal(fx_delay_purge(dl, "orders", 0), FX_OK);
    assert_int_equal(fx_delay_count(dl, "orders", &n, 0), FX_OK);
    assert_int_equal(n, 0);
    /* a put with a gone lease fails and stores nothing */
    p[0].lease = 0x7fffffff12345LL;
    assert_int_equal(fx_delay_put_batch(dl, p, 1, &stored, 3000), FX_ELEASE_EXPIRED);
    assert_int_equal(stored, 0);
    fx_delay_free(dl);
    fx_mq_client_free(c);
}

/* ---- mover lock --------------------------------------------------------------------------------- */

typedef struct lockwait {
    fx_delay *dl;
} lockwait;

static bool b_holds(void *arg)
{
    lockwait *w = arg;
    bool held = false;
    fx_delay_lock(w->dl, "orders", &held, 2000);
    return held;
}

static void delay_mover_takeover(void **state)
{
    (void)state;
    fx_mq_client *ca = client_new("/t_delay_lock", "a");
    fx_mq_client *cb = client_new("/t_delay_lock", "b");
    fx_delay *a = NULL, *b = NULL;
    assert_int_equal(fx_delay_new(ca, "bridge-a", 2, &a), FX_OK);
    assert_int_equal(fx_delay_new(cb, "bridge-b", 2, &b), FX_OK);
    bool held = false;
    assert_int_equal(fx_delay_lock(a, "orders", &held, 2000), FX_OK);
    assert_true(held);
    assert_int_equal(fx_delay_lock(a, "orders", &held, 2000), FX_OK);
    assert_true(held); /* confirmed again */
    assert_int_equal(fx_delay_lock(b, "orders", &held, 2000), FX_OK);
    assert_false(held);
    /* an unlock hands over at once */
    fx_delay_unlock(a, "orders", 2000);
    assert_int_equal(fx_delay_lock(b, "orders", &held, 2000), FX_OK);
    assert_true(held);
    assert_int_equal(fx_delay_lock(a, "orders", &held, 2000), FX_OK);
    assert_false(held);

    /* b dies (no unlock, its keepalives stop): a takes over once b's lease expired, not before */
    int64_t t0 = fxt_now_ms();
    fx_delay_free(b);
    fx_mq_client_free(cb);
    assert_int_equal(fx_delay_lock(a, "orders", &held, 2000), FX_OK);
    assert_false(held); /* the lease (TTL 2 s) is still there right after the death */
    lockwait w = {a};
    assert_true(fxt_wait_until(b_holds, &w, FXT_MS(8000)));
    int64_t took = fxt_now_ms() - t0;
    fprintf(stderr, "  takeover %" PRId64 " ms after the holder died (lock lease TTL 2 s)\n", took);
    assert_true(took >= 1000); /* not before its lease could expire (etcd: TTL 2 s, +-1 s) */
    fx_delay_release_lease(a);
    fx_delay_free(a);
    fx_mq_client_free(ca);
}

static int group_setup(void **state)
{
    (void)state;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    if (fxt_etcd_start(&G.etcd) != 0) return -1;
    G.eps[0] = G.etcd.endpoint;
    fx_etcd_opts o = {.endpoints = G.eps, .n_endpoints = 1, .connect_timeout_ms = 500};
    if (fx_etcd_new(&o, &G.raw) != FX_OK) {
        fxt_etcd_destroy(&G.etcd);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    fx_etcd_free(G.raw);
    fxt_etcd_destroy(&G.etcd);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(delay_parse_values),
        cmocka_unit_test(delay_index_order_window),
        cmocka_unit_test(delay_mover_takeover),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
