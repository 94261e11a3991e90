/* Integration tests (real etcd) for the JetStream extras of bridge/: persisted delivery attempts
 * (attempts.h) and the Nats-Msg-Id window (dedup.h).
 *
 * attempts_persist_and_inherit: a record saved by one consumer is read by the next one (another
 *   client): implicit "1 attempt" up to the producer's high mark, exceptions (2, and 0 for a
 *   fetched but never published message below it), nothing beyond; the key is bound to the sub-MPSC's
 *   global lease; an unchanged record is not written again.
 * attempts_committed_entries_dropped: inherited exceptions below the first message fetched from
 *   their producer are committed and left out of the next record.
 * attempts_codec_rejects_garbage: truncated / wrong magic / wrong counts are FX_EPROTO.
 * dedup_window_in_etcd: lookups and records in one txn per 64 ids, shared by every client,
 *   bound to a lease, gone after the window (and not before it); ids over 512 bytes refused.
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

#include "attempts.h"
#include "dedup.h"
#include "etcd.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "keys.h"
#include "meta.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"

#define OP_MS 3000

static struct {
    fxt_etcd etcd;
    fx_etcd *raw;
    const char *eps[1];
} G;

static int group_setup(void **state)
{
    (void)state;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    if (fxt_etcd_start(&G.etcd) != 0) return -1;
    G.eps[0] = G.etcd.endpoint;
    fx_etcd_opts o = {.endpoints = G.eps, .n_endpoints = 1};
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

static fx_mq_client *client_new(const char *root)
{
    fx_mq_client_opts o = {.etcd = {.endpoints = G.eps, .n_endpoints = 1}, .root = root,
                           .long_lease_ttl_s = 5, .min_ttl_s = 2, .op_timeout_ms = OP_MS,
                           .close_timeout_ms = 1000};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    return c;
}

static fx_kv raw_get(const char *key)
{
    fx_kv kv = {0};
    CHECK(fx_etcd_get(G.raw, FX_SLICE_STR(key), &kv, OP_MS));
    return kv;
}

/* A standalone MPSC (its meta carries the global lease the record binds to). */
static int64_t new_chan(fx_mq_client *c)
{
    fx_mq_chan_cfg cfg = {.capacity = 100, .ttl_s = 30, .weight = 1};
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    return chan;
}

static void attempts_persist_and_inherit(void **state)
{
    (void)state;
    fx_mq_client *c1 = client_new("/jsx1"), *c2 = client_new("/jsx1");
    int64_t chan = new_chan(c1);
    fx_attempts *a = NULL;
    CHECK(fx_attempts_open(c1, chan, NULL, OP_MS, &a));
    assert_int_equal(fx_attempts_take(a, 1, 5), 0); /* nothing recorded yet */
    const fx_attempt fl[] = {{1, 4, 0}, {1, 5, 1}, {1, 6, 2}, {1, 7, 0}, {2, 3, 1}, {1, 9, 0}};
    bool wrote = false;
    CHECK(fx_attempts_save(a, fl, 6, OP_MS, &wrote));
    assert_true(wrote);
    CHECK(fx_attempts_save(a, fl, 6, OP_MS, &wrote));
    assert_false(wrote); /* unchanged: no put */
    fx_attempts_stats st;
    fx_attempts_get_stats(a, &st);
    assert_int_equal(st.writes, 1);
    /* hi {1:6, 2:3}, exceptions {(1,4,0), (1,6,2)} (7 and 9 are above the high mark: implicit
     * 0): 4 + 4 + 2*16 + 4 + 2*20 bytes */
    assert_int_equal(st.last_bytes, 84);
    fx_attempts_free(a);

    /* The key is bound to the sub-MPSC's global lease. */
    char key[128], mkey[128];
    snprintf(key, sizeof key, "/jsx1/attempts/%" PRId64, chan);
    snprintf(mkey, sizeof mkey, "/jsx1/channels/meta/%" PRId64, chan);
    fx_kv kv = raw_get(key), mkv = raw_get(mkey);
    fx_mq_chan_meta meta;
    CHECK(fx_mq_chan_meta_decode(mkv.value.data, mkv.value.len, &meta));
    assert_true(kv.lease != 0);
    assert_int_equal(kv.lease, meta.global_lease_id);
    fx_kv_free(&kv);
    fx_kv_free(&mkv);

    /* The next consumer (another client, as on another bridge) inherits the counts. */
    CHECK(fx_attempts_open(c2, chan, NULL, OP_MS, &a));
    assert_int_equal(fx_attempts_take(a, 1, 4), 0); /* fetched, never published */
    assert_int_equal(fx_attempts_take(a, 1, 5), 1);
    assert_int_equal(fx_attempts_take(a, 1, 6), 2);
    assert_int_equal(fx_attempts_take(a, 1, 7), 0);
    assert_int_equal(fx_attempts_take(a, 2, 3), 1);
    assert_int_equal(fx_attempts_take(a, 1, 8), 0); /* above the high mark (1,9 had 0) */
    assert_int_equal(fx_attempts_take(a, 3, 1), 0); /* unknown producer */
    /* It redelivers (1,6) a third time. */
    const fx_attempt f2[] = {{1, 6, 3}};
    CHECK(fx_attempts_save(a, f2, 1, OP_MS, &wrote));
    assert_true(wrote);
    fx_attempts_free(a);
    CHECK(fx_attempts_open(c1, chan, NULL, OP_MS, &a));
    assert_int_equal(fx_attempts_take(a, 1, 6), 3);
    assert_int_equal(fx_attempts_take(a, 1, 6), 1); /* taken: only the implicit count is left */
    fx_attempts_free(a);
    fx_mq_client_free(c1);
    fx_mq_client_free(c2);
}

static void attempts_committed_entries_dropped(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/jsx2");
    int64_t chan = new_chan(c);
    fx_attempts *a = NULL;
    CHECK(fx_attempts_open(c, chan, NULL, OP_MS, &a));
    const fx_attempt fl[] = {{1, 2, 4}, {1, 3, 2}, {1, 4, 1}};
    CHECK(fx_attempts_save(a, fl, 3, OP_MS, NULL));
    fx_attempts_free(a);
    /* The next consumer's first fetch from producer 1 starts at 4: 2 and 3 were committed. */
    CHECK(fx_attempts_open(c, chan, NULL, OP_MS, &a));
    assert_int_equal(fx_attempts_take(a, 1, 4), 1);
    const fx_attempt f2[] = {{1, 4, 2}};
    CHECK(fx_attempts_save(a, f2, 1, OP_MS, NULL));
    fx_attempts_stats st;
    fx_attempts_get_stats(a, &st);
    assert_int_equal(st.last_bytes, 4 + 4 + 16 + 4 + 20); /* only (1,4,2) left */
    fx_attempts_free(a);
    fx_mq_client_free(c);
}

static void attempts_codec_rejects_garbage(void **state)
{
    (void)state;
    int64_t hp[1] = {7}, hi[1] = {9};
    fx_attempt ex[1] = {{7, 8, 3}};
    fx_attempts_rec r = {.hi_pidx = hp, .hi = hi, .nh = 1, .exc = ex, .ne = 1};
    uint8_t buf[64];
    size_t n = fx_attempts_encode(&r, buf, sizeof buf);
    assert_int_equal(n, 48);
    assert_int_equal(fx_attempts_encode(&r, buf, n - 1), 0);
    fx_attempts_rec d;
    CHECK(fx_attempts_decode(buf, n, &d));
    assert_int_equal(d.nh, 1);
    assert_int_equal(d.hi[0], 9);
    assert_int_equal(d.exc[0].n, 3);
    fx_attempts_rec_free(&d);
    for (size_t k = 0; k < n; k++) assert_int_equal(fx_attempts_decode(buf, k, &d), FX_EPROTO);
    uint8_t bad[64];
    memcpy(bad, buf, n);
    bad[0] = 'X';
    assert_int_equal(fx_attempts_decode(bad, n, &d), FX_EPROTO);
    memcpy(bad, buf, n);
    bad[4] = 2; /* two producers claimed, one present */
    assert_int_equal(fx_attempts_decode(bad, n, &d), FX_EPROTO);
}

static bool dedup_gone(void *arg)
{
    fx_slice id = FX_SLICE_STR("id-0");
    fx_bytes one;
    if (fx_dedup_lookup(arg, &id, 1, &one, OP_MS) != FX_OK) return false;
    bool gone = one.len == 0;
    fx_bytes_free(&one);
    return gone;
}

static void dedup_window_in_etcd(void **state)
{
    (void)state;
    fx_mq_client *c1 = client_new("/jsx3"), *c2 = client_new("/jsx3");
    fx_dedup *d1 = NULL, *d2 = NULL;
    CHECK(fx_dedup_new(c1, "orders", 2000, &d1));
    CHECK(fx_dedup_new(c2, "orders", 2000, &d2));
    enum { N = 100 }; /* more than one txn (64 ids each) */
    char idb[N][16], vb[N][16];
    fx_slice ids[N], vals[N];
    for (int i = 0; i < N; i++) {
        snprintf(idb[i], sizeof idb[i], "id-%d", i);
        snprintf(vb[i], sizeof vb[i], "v%d", i);
        ids[i] = FX_SLICE_STR(idb[i]);
        vals[i] = FX_SLICE_STR(vb[i]);
    }
    fx_bytes got[N];
    CHECK(fx_dedup_lookup(d1, ids, N, got, OP_MS));
    for (int i = 0; i < N; i++) assert_int_equal(got[i].len, 0);
    CHECK(fx_dedup_record(d1, ids, vals, N - 1, OP_MS)); /* all but the last */
    int64_t t_rec = fxt_now_ms();
    CHECK(fx_dedup_lookup(d2, ids, N, got, OP_MS)); /* the other client sees them */
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(got[i].len, strlen(vb[i]));
        assert_memory_equal(got[i].data, vb[i], got[i].len);
        fx_bytes_free(&got[i]);
    }
    assert_int_equal(got[N - 1].len, 0);
    fx_dedup_stats st;
    fx_dedup_get_stats(d1, &st);
    assert_int_equal(st.txns, 2 + 2); /* 100 lookups + 99 records, 64 per txn */
    assert_int_equal(st.grants, 1);
    fx_kv kv = raw_get("/jsx3/dedup/orders/id-0");
    assert_true(kv.lease != 0);
    fx_kv_free(&kv);
    /* Gone after the window (lease TTL window + bucket = 3 s), not before it. */
    assert_true(fxt_wait_until(dedup_gone, d2, 8000));
    int64_t gone_at = fxt_now_ms() - t_rec;
    assert_true(gone_at >= 1900);
    assert_true(gone_at > 0 && gone_at < 6000);
    /* ids over 512 bytes are refused */
    char big[600];
    memset(big, 'x', sizeof big);
    fx_slice bid = {big, sizeof big};
    fx_bytes bv;
    assert_int_equal(fx_dedup_lookup(d1, &bid, 1, &bv, OP_MS), FX_EINVAL);
    fx_dedup_free(d1);
    fx_dedup_free(d2);
    fx_mq_client_free(c1);
    fx_mq_client_free(c2);
}

static int64_t raw_count(const char *prefix)
{
    uint8_t end[256];
    fx_slice p = FX_SLICE_STR(prefix);
    fx_range_req rq = {.key = p, .range_end = {end, fx_prefix_end(p, end)}, .count_only = true};
    fx_range_resp rr = {0};
    CHECK(fx_etcd_range(G.raw, &rq, &rr, OP_MS));
    int64_t n = rr.count;
    fx_range_resp_free(&rr);
    return n;
}

/* The bound (dedup.h): past max_ids the oldest leases are revoked (the window shortens), the
 * keys in etcd never pass the bound, a recent id is still found, nothing is refused. */
static void dedup_bound_forgets_oldest(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/jsx4");
    fx_dedup *d = NULL;
    CHECK(fx_dedup_new(c, "orders", 600000, &d));
    fx_dedup_set_bound(d, 640, 64LL << 20); /* 640 ids, 64 per lease */
    enum { N = 3200, B = 64 };
    static char idb[N][16];
    fx_slice ids[B], vals[B];
    int64_t max_keys = 0;
    for (int i = 0; i < N; i += B) {
        for (int k = 0; k < B; k++) {
            snprintf(idb[i + k], sizeof idb[i + k], "id-%d", i + k);
            ids[k] = FX_SLICE_STR(idb[i + k]);
            vals[k] = FX_SLICE_STR("1.2.3");
        }
        CHECK(fx_dedup_record(d, ids, vals, B, OP_MS));
        int64_t n = raw_count("/jsx4/dedup/orders/");
        if (n > max_keys) max_keys = n;
    }
    fx_dedup_stats st;
    fx_dedup_get_stats(d, &st);
    assert_true(max_keys <= 640);
    assert_true(st.live_ids <= 640);
    assert_int_equal(st.forgotten + (uint64_t)st.live_ids, N);
    assert_true(st.revokes >= (N - 640) / 64);
    assert_int_equal(st.revoke_errors, 0);
    fx_slice probe[2] = {FX_SLICE_STR("id-0"), FX_SLICE_STR("id-3199")};
    fx_bytes got[2];
    CHECK(fx_dedup_lookup(d, probe, 2, got, OP_MS));
    assert_int_equal(got[0].len, 0); /* forgotten early */
    assert_int_equal(got[1].len, 5); /* recent: still caught */
    fx_bytes_free(&got[0]);
    fx_bytes_free(&got[1]);
    fx_dedup_free(d);
    fx_mq_client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attempts_persist_and_inherit),
        cmocka_unit_test(attempts_committed_entries_dropped),
        cmocka_unit_test(attempts_codec_rejects_garbage),
        cmocka_unit_test(dedup_window_in_etcd),
        cmocka_unit_test(dedup_bound_forgets_oldest),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
