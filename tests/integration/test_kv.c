/* test_kv.c -- the KV payload store (lease/kv.h) against a real etcd.
 *
 * kv_lease_semantics: lease_id 0 is a plain put that survives a lease's expiry, never a fallback
 *   to an earlier lease; a lease-bound key disappears when its (not kept-alive) lease expires;
 *   lease puts on an expired lease fail with FX_ELEASE_EXPIRED; reject_if_inflight_same_key
 *   refuses a second in-flight put of the same key at once (etcd paused with SIGSTOP keeps the
 *   first put in flight deterministically), never another key, and without the flag concurrent
 *   puts of one key are admitted.
 * kv_batch_and_range: put_many atomicity (one revision; a failing batch writes nothing), ranges
 *   with relative ascending keys, count_prefix, exact single-key delete, delete_range, batch
 *   limits, FX_ENOTFOUND, and prefix isolation between two stores on one client.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "tests/support/fxt.h"

#define PREFIX_A "/fxt/kvA/"
#define PREFIX_B "/fxt/kvB/"

typedef struct ctx {
    fxt_etcd etcd;
    fx_kv_store *a; /* owns its client */
    fx_kv_store *b; /* shares a's client, other prefix */
} ctx;

static int group_setup(void **state)
{
    ctx *x = calloc(1, sizeof *x);
    if (!x) return -1;
    if (fxt_etcd_start(&x->etcd) != 0) {
        free(x);
        return -1;
    }
    const char *eps[] = {x->etcd.endpoint};
    fx_kv_etcd_opts o = {.etcd = {.endpoints = eps, .n_endpoints = 1}, .prefix = PREFIX_A};
    fx_err e = fx_kv_new_etcd(&o, &x->a);
    if (e == FX_OK) e = fx_kv_new_etcd_shared(fx_kv_etcd(x->a), PREFIX_B, 0, &x->b);
    if (e != FX_OK) {
        fprintf(stderr, "store: %s (%s)\n", fx_errname(e), fx_err_detail());
        fx_kv_store_free(x->a);
        fxt_etcd_destroy(&x->etcd);
        free(x);
        return -1;
    }
    *state = x;
    return 0;
}

static int group_teardown(void **state)
{
    ctx *x = *state;
    if (!x) return 0;
    fx_kv_store_free(x->b);
    fx_kv_store_free(x->a);
    fxt_etcd_destroy(&x->etcd);
    free(x);
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static void check_value(fx_kv_store *s, const char *key, const void *val, size_t len)
{
    fx_bytes b = {0};
    fx_err e = fx_kv_get(s, FX_SLICE_STR(key), &b, 0);
    if (e != FX_OK) fprintf(stderr, "get %s: %s (%s)\n", key, fx_errname(e), fx_err_detail());
    assert_int_equal(e, FX_OK);
    assert_int_equal(b.len, len);
    if (len) assert_memory_equal(b.data, val, len);
    fx_bytes_free(&b);
}

typedef struct gone_arg {
    fx_kv_store *s;
    const char *key;
    fx_err last;
} gone_arg;

static bool key_gone(void *arg)
{
    gone_arg *g = arg;
    fx_bytes b = {0};
    g->last = fx_kv_get(g->s, FX_SLICE_STR(g->key), &b, 2000);
    fx_bytes_free(&b);
    return g->last == FX_ENOTFOUND;
}

/* Etcd lease attached to a full key, read through the raw client. */
static int64_t raw_lease_of(fx_kv_store *s, const char *rel)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", fx_kv_prefix(s), rel);
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(fx_kv_etcd(s), FX_SLICE_STR(full), &kv, 0);
    int64_t lease = e == FX_OK ? kv.lease : -1;
    fx_kv_free(&kv);
    return lease;
}

typedef struct req_arg {
    fx_etcd *c;
    uint64_t target;
} req_arg;

static bool requests_reached(void *arg)
{
    req_arg *r = arg;
    fx_etcd_stats st;
    fx_etcd_get_stats(r->c, &st);
    return st.requests >= r->target;
}

static uint64_t requests_now(fx_etcd *c)
{
    fx_etcd_stats st;
    fx_etcd_get_stats(c, &st);
    return st.requests;
}

typedef struct put_job {
    fx_kv_store *s;
    const char *key;
    fx_slice value;
    fx_kv_put_opts opts;
    int timeout_ms;
    fx_err result;
    pthread_t th;
} put_job;

static void *put_thread(void *arg)
{
    put_job *j = arg;
    j->result = fx_kv_put(j->s, FX_SLICE_STR(j->key), j->value, &j->opts, j->timeout_ms);
    return NULL;
}

/* ---- kv_lease_semantics --------------------------------------------------------------------- */

static void lease_expiry(ctx *x)
{
    fx_kv_store *s = x->a;
    int64_t lease = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 2, &lease, 0), FX_OK);
    assert_true(lease > 0);

    fx_kv_put_opts with_lease = {.lease_id = lease};
    fx_kv_put_opts plain = {.lease_id = 0};
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/plain"), FX_SLICE_STR("p"), &plain, 0), FX_OK);
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/nullopts"), FX_SLICE_STR("n"), NULL, 0), FX_OK);
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/leased"), FX_SLICE_STR("l"), &with_lease, 0),
                     FX_OK);
    /* A lease put followed by a plain put of the same key: the plain put must not reuse the
     * lease ("the last lease" fallback is forbidden), so this key survives the expiry. */
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/detached"), FX_SLICE_STR("d1"), &with_lease, 0),
                     FX_OK);
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/detached"), FX_SLICE_STR("d2"), &plain, 0),
                     FX_OK);
    assert_int_equal(raw_lease_of(s, "lease/leased"), lease);
    assert_int_equal(raw_lease_of(s, "lease/plain"), 0);
    assert_int_equal(raw_lease_of(s, "lease/nullopts"), 0);
    assert_int_equal(raw_lease_of(s, "lease/detached"), 0);

    int64_t t0 = fxt_now_ms();
    gone_arg g = {s, "lease/leased", FX_OK};
    bool gone = fxt_wait_until(key_gone, &g, 15000);
    if (!gone) fprintf(stderr, "leased key still there: %s\n", fx_errname(g.last));
    assert_true(gone);
    assert_true(fxt_now_ms() - t0 < 15000);

    check_value(s, "lease/plain", "p", 1);
    check_value(s, "lease/nullopts", "n", 1);
    check_value(s, "lease/detached", "d2", 2);

    /* The lease is gone: lease puts fail (single and batch, nothing written), keepalive says so. */
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/late"), FX_SLICE_STR("x"), &with_lease, 0),
                     FX_ELEASE_EXPIRED);
    fx_kv_item late[2] = {{FX_SLICE_STR("lease/late1"), FX_SLICE_STR("a")},
                          {FX_SLICE_STR("lease/late2"), FX_SLICE_STR("b")}};
    assert_int_equal(fx_kv_put_many(s, late, 2, &with_lease, 0), FX_ELEASE_EXPIRED);
    int64_t n = -1;
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("lease/late"), &n, 0), FX_OK);
    assert_int_equal(n, 0);
    int64_t ttl = 99;
    assert_int_equal(fx_kv_keepalive_lease(s, lease, &ttl, 0), FX_ELEASE_EXPIRED);
    assert_int_equal(ttl, 0);

    /* A live lease renews with a positive TTL. */
    int64_t live = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 30, &live, 0), FX_OK);
    assert_int_equal(fx_kv_keepalive_lease(s, live, &ttl, 0), FX_OK);
    assert_true(ttl > 0 && ttl <= 30);
    assert_int_equal(fx_kv_keepalive_lease(s, live, NULL, 0), FX_OK);
    assert_int_equal(fx_etcd_lease_revoke(fx_kv_etcd(s), live, 0), FX_OK);

    /* Invalid arguments are refused locally. */
    fx_kv_put_opts neg = {.lease_id = -1};
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("lease/x"), FX_SLICE_STR("x"), &neg, 0), FX_EINVAL);
    assert_int_equal(fx_kv_put(s, (fx_slice){"", 0}, FX_SLICE_STR("x"), NULL, 0), FX_EINVAL);
    assert_int_equal(fx_kv_allocate_lease(s, 0, &live, 0), FX_EINVAL);
}

static void inflight_admission(ctx *x)
{
    fx_kv_store *s = x->a;
    fx_etcd *c = fx_kv_etcd(s);
    static uint8_t big[16 * 1024];
    memset(big, 'v', sizeof big);
    const fx_kv_put_opts reject = {.reject_if_inflight_same_key = true};
    const fx_kv_put_opts allow = {0};

    put_job j1 = {s, "rej/k", {big, sizeof big}, reject, 20000, FX_EINVAL};
    put_job j2 = {s, "rej/other", FX_SLICE_STR("o"), reject, 20000, FX_EINVAL};
    put_job j3 = {s, "rej/k", FX_SLICE_STR("third"), allow, 20000, FX_EINVAL};
    put_job j4 = {s, "rej/k2", FX_SLICE_STR("k2a"), allow, 20000, FX_EINVAL};
    bool w1 = false, w2 = false, w3 = false, w4 = false;
    fx_err r_same = FX_OK, r_batch = FX_OK, r_after_flagless = FX_OK;
    int64_t dt_same = -1;
    bool started[4] = {false};

    /* etcd stopped: connections are accepted by the kernel, nothing is answered, so every put
     * admitted now stays in flight until resume. An admitted put is visible as an HTTP request
     * counted by the client (admission happens before the request is sent). */
    uint64_t base = requests_now(c);
    assert_int_equal(fxt_etcd_pause(&x->etcd), 0);

    started[0] = pthread_create(&j1.th, NULL, put_thread, &j1) == 0;
    req_arg ra = {c, base + 1};
    w1 = started[0] && fxt_wait_until(requests_reached, &ra, 5000);

    /* Same key, flag set: refused at once. */
    int64_t t0 = fxt_now_ms();
    r_same = fx_kv_put(s, FX_SLICE_STR("rej/k"), FX_SLICE_STR("second"), &reject, 3000);
    dt_same = fxt_now_ms() - t0;
    /* A batch containing the key is refused as a whole. */
    fx_kv_item batch[2] = {{FX_SLICE_STR("rej/free"), FX_SLICE_STR("f")},
                           {FX_SLICE_STR("rej/k"), FX_SLICE_STR("b")}};
    r_batch = fx_kv_put_many(s, batch, 2, &reject, 3000);

    /* Another key with the flag: admitted (it reaches etcd). */
    started[1] = pthread_create(&j2.th, NULL, put_thread, &j2) == 0;
    ra.target = base + 2;
    w2 = started[1] && fxt_wait_until(requests_reached, &ra, 5000);

    /* Same key without the flag: admitted too (last committed wins). */
    started[2] = pthread_create(&j3.th, NULL, put_thread, &j3) == 0;
    ra.target = base + 3;
    w3 = started[2] && fxt_wait_until(requests_reached, &ra, 5000);

    /* A flag-less put in flight also makes a flagged put of its key wait its turn: refused. */
    started[3] = pthread_create(&j4.th, NULL, put_thread, &j4) == 0;
    ra.target = base + 4;
    w4 = started[3] && fxt_wait_until(requests_reached, &ra, 5000);
    r_after_flagless = fx_kv_put(s, FX_SLICE_STR("rej/k2"), FX_SLICE_STR("k2b"), &reject, 3000);

    int rr = fxt_etcd_resume(&x->etcd);
    put_job *jobs[4] = {&j1, &j2, &j3, &j4};
    for (int i = 0; i < 4; i++)
        if (started[i]) pthread_join(jobs[i]->th, NULL);

    assert_int_equal(rr, 0);
    for (int i = 0; i < 4; i++) assert_true(started[i]);
    assert_true(w1);
    assert_int_equal(r_same, FX_EKEY_BEING_WRITTEN);
    assert_true(dt_same >= 0 && dt_same < 1000);
    assert_int_equal(r_batch, FX_EKEY_BEING_WRITTEN);
    assert_true(w2);
    assert_true(w3);
    assert_true(w4);
    assert_int_equal(r_after_flagless, FX_EKEY_BEING_WRITTEN);
    if (j1.result != FX_OK) fprintf(stderr, "j1: %s (%s)\n", fx_errname(j1.result), fx_err_detail());
    assert_int_equal(j1.result, FX_OK);
    assert_int_equal(j2.result, FX_OK);
    assert_int_equal(j3.result, FX_OK);
    assert_int_equal(j4.result, FX_OK);

    /* The refused batch wrote nothing; the refused put did not overwrite. */
    fx_bytes b = {0};
    assert_int_equal(fx_kv_get(s, FX_SLICE_STR("rej/free"), &b, 0), FX_ENOTFOUND);
    check_value(s, "rej/k2", "k2a", 3);
    assert_int_equal(fx_kv_get(s, FX_SLICE_STR("rej/k"), &b, 0), FX_OK);
    assert_true(b.len == sizeof big || (b.len == 5 && memcmp(b.data, "third", 5) == 0));
    fx_bytes_free(&b);

    /* Counts were released: the same key is admitted again. */
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("rej/k"), FX_SLICE_STR("last"), &reject, 0), FX_OK);
    check_value(s, "rej/k", "last", 4);
    int64_t del = 0;
    assert_int_equal(fx_kv_delete_range(s, FX_SLICE_STR("rej/"), (fx_slice){NULL, 0}, &del, 0), FX_OK);
    assert_int_equal(del, 3);
}

static void kv_lease_semantics(void **state)
{
    ctx *x = *state;
    lease_expiry(x);
    inflight_admission(x);
}

/* ---- kv_batch_and_range ---------------------------------------------------------------------- */

#define NB 100

static size_t item_value(int i, uint8_t *out) /* binary values incl. 0x00 and 0xff */
{
    size_t len = 1 + (size_t)(i % 50);
    for (size_t j = 0; j < len; j++) out[j] = (uint8_t)(i * 31 + (int)j * 7);
    out[0] = (uint8_t)(i % 2 ? 0x00 : 0xff);
    return len;
}

static void kv_batch_and_range(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = x->a;
    static char keys[FX_KV_MAX_BATCH + 1][32];
    static uint8_t vals[FX_KV_MAX_BATCH + 1][64];
    fx_kv_item items[FX_KV_MAX_BATCH + 1];
    const fx_slice none = {NULL, 0};

    /* 100 items, one txn. */
    for (int i = 0; i < NB; i++) {
        snprintf(keys[i], sizeof keys[i], "batch/item-%03d", i);
        size_t vl = item_value(i, vals[i]);
        items[i] = (fx_kv_item){FX_SLICE_STR(keys[i]), {vals[i], vl}};
    }
    fx_err e = fx_kv_put_many(s, items, NB, NULL, 0);
    if (e) fprintf(stderr, "put_many: %s (%s)\n", fx_errname(e), fx_err_detail());
    assert_int_equal(e, FX_OK);

    fx_range_resp r = {0};
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR("batch/"), none, 0, &r, 0), FX_OK);
    assert_int_equal(r.n_kvs, NB);
    assert_int_equal(r.count, NB);
    assert_false(r.more);
    for (int i = 0; i < NB; i++) {
        uint8_t v[64];
        size_t vl = item_value(i, v);
        assert_int_equal(r.kvs[i].key.len, strlen(keys[i]));
        assert_memory_equal(r.kvs[i].key.data, keys[i], strlen(keys[i]));
        assert_int_equal(r.kvs[i].value.len, vl);
        assert_memory_equal(r.kvs[i].value.data, v, vl);
        /* atomic: every item was written by the same revision */
        assert_int_equal(r.kvs[i].mod_revision, r.kvs[0].mod_revision);
        assert_int_equal(r.kvs[i].lease, 0);
    }
    fx_range_resp_free(&r);

    /* limit, and [start, end). */
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR("batch/"), none, 10, &r, 0), FX_OK);
    assert_int_equal(r.n_kvs, 10);
    assert_int_equal(r.count, NB);
    assert_true(r.more);
    assert_memory_equal(r.kvs[9].key.data, "batch/item-009", 15);
    fx_range_resp_free(&r);
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR("batch/item-010"),
                                     FX_SLICE_STR("batch/item-020"), 0, &r, 0), FX_OK);
    assert_int_equal(r.n_kvs, 10);
    assert_memory_equal(r.kvs[0].key.data, "batch/item-010", 15);
    assert_memory_equal(r.kvs[9].key.data, "batch/item-019", 15);
    fx_range_resp_free(&r);

    int64_t n = -1;
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("batch/"), &n, 0), FX_OK);
    assert_int_equal(n, NB);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("batch/item-05"), &n, 0), FX_OK);
    assert_int_equal(n, 10);

    /* Single delete is exact, not a prefix delete; deleting a missing key is fine. */
    assert_int_equal(fx_kv_delete(s, FX_SLICE_STR("batch/item-00"), 0), FX_OK);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("batch/"), &n, 0), FX_OK);
    assert_int_equal(n, NB);
    assert_int_equal(fx_kv_delete(s, FX_SLICE_STR("batch/item-000"), 0), FX_OK);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("batch/"), &n, 0), FX_OK);
    assert_int_equal(n, NB - 1);

    /* get of a missing key. */
    fx_bytes b = {(uint8_t *)"junk", 4};
    assert_int_equal(fx_kv_get(s, FX_SLICE_STR("batch/item-000"), &b, 0), FX_ENOTFOUND);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(fx_kv_get(s, FX_SLICE_STR("no/such/key"), &b, 0), FX_ENOTFOUND);

    /* A failing batch writes nothing (duplicate key makes etcd refuse the txn). */
    fx_kv_item dup[3] = {{FX_SLICE_STR("atom/a"), FX_SLICE_STR("1")},
                         {FX_SLICE_STR("atom/b"), FX_SLICE_STR("2")},
                         {FX_SLICE_STR("atom/a"), FX_SLICE_STR("3")}};
    assert_int_equal(fx_kv_put_many(s, dup, 3, NULL, 0), FX_EDUPLICATE_KEY);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("atom/"), &n, 0), FX_OK);
    assert_int_equal(n, 0);

    /* Batch limits: 129 refused before any I/O, 128 accepted. */
    for (int i = 0; i < FX_KV_MAX_BATCH + 1; i++) {
        snprintf(keys[i], sizeof keys[i], "max/%04d", i);
        items[i] = (fx_kv_item){FX_SLICE_STR(keys[i]), FX_SLICE_STR("m")};
    }
    assert_int_equal(fx_kv_put_many(s, items, FX_KV_MAX_BATCH + 1, NULL, 0), FX_ETXN_TOO_MANY_OPS);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("max/"), &n, 0), FX_OK);
    assert_int_equal(n, 0);
    assert_int_equal(fx_kv_put_many(s, items, FX_KV_MAX_BATCH, NULL, 0), FX_OK);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("max/"), &n, 0), FX_OK);
    assert_int_equal(n, FX_KV_MAX_BATCH);

    /* Prefix isolation: store b shares a's client under another prefix. */
    assert_string_equal(fx_kv_prefix(x->b), PREFIX_B);
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("iso/x"), FX_SLICE_STR("A"), NULL, 0), FX_OK);
    assert_int_equal(fx_kv_put(x->b, FX_SLICE_STR("iso/x"), FX_SLICE_STR("B"), NULL, 0), FX_OK);
    check_value(s, "iso/x", "A", 1);
    check_value(x->b, "iso/x", "B", 1);
    assert_int_equal(fx_kv_count_prefix(x->b, FX_SLICE_STR(""), &n, 0), FX_OK);
    assert_int_equal(n, 1);
    assert_int_equal(fx_kv_get_range(x->b, FX_SLICE_STR(""), none, 0, &r, 0), FX_OK);
    assert_int_equal(r.n_kvs, 1);
    assert_int_equal(r.kvs[0].key.len, 5);
    assert_memory_equal(r.kvs[0].key.data, "iso/x", 5);
    fx_range_resp_free(&r);
    int64_t del = 0;
    assert_int_equal(fx_kv_delete_range(x->b, FX_SLICE_STR(""), none, &del, 0), FX_OK);
    assert_int_equal(del, 1);
    check_value(s, "iso/x", "A", 1);

    /* delete_range of a prefix. */
    assert_int_equal(fx_kv_delete_range(s, FX_SLICE_STR("batch/"), none, &del, 0), FX_OK);
    assert_int_equal(del, NB - 1);
    assert_int_equal(fx_kv_delete_range(s, FX_SLICE_STR("max/"), none, &del, 0), FX_OK);
    assert_int_equal(del, FX_KV_MAX_BATCH);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("batch/"), &n, 0), FX_OK);
    assert_int_equal(n, 0);

    /* Backend identity. */
    char uid[512];
    snprintf(uid, sizeof uid, "kv(%s)", fx_etcd_uid(fx_kv_etcd(s)));
    assert_string_equal(fx_kv_backend_uid(s), uid);
    assert_string_equal(fx_kv_backend_uid(x->b), uid);
    assert_string_not_equal(fx_kv_backend_uid(s), fx_etcd_uid(fx_kv_etcd(s)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv_lease_semantics),
        cmocka_unit_test(kv_batch_and_range),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
