/* test_etcd.c -- the etcd v3 JSON-gateway client (lease/etcd.h) against a real etcd.
 *
 * etcd_kv_roundtrip: put/get/range by prefix (limit, count_only)/delete; binary keys and values
 *   with 0x00 and 0xff; an empty value; a 1 MiB value.
 * etcd_txn_cas: create-if-absent wins exactly once among 8 racing threads; value compares;
 *   129 ops -> FX_ETXN_TOO_MANY_OPS, > 1.5 MiB -> FX_ETOO_LARGE, with distinct texts and the
 *   server message in fx_err_detail().
 * etcd_lease_expiry_deletes_keys: keys of a TTL-2 lease that is not kept alive vanish and a
 *   prefix watch sees one DELETE per key; keepalive/put on the dead lease -> FX_ELEASE_EXPIRED;
 *   keepalive (pool and lane), timetolive and revoke on a live lease.
 * etcd_watch_resync: a prefix watch survives an etcd stop/restart and delivers every update
 *   exactly once in revision order; a watch from a compacted revision delivers a snapshot first
 *   and then continues.
 * etcd_failover: [dead port, live etcd] works within the deadline, failovers counted, and later
 *   calls start at the endpoint that worked.
 * etcd_deadline: a blackhole endpoint makes put and range return FX_ETIMEDOUT on time; a call
 *   that waits for an exhausted pool times out too.
 * etcd_auth (own etcd with auth enabled): token auth for unary calls and watches, re-auth once
 *   after the server dropped the token (401), FX_EAUTH without or with wrong credentials, and
 *   the password never appears in error details.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "etcd.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_slow.h"

typedef struct ctx {
    fxt_etcd etcd;      /* shared by every test but etcd_auth */
    fxt_etcd auth_etcd; /* etcd_auth's own, with auth enabled */
    fx_etcd *c;
} ctx;

#define CHECK(expr)                                                                         \
    do {                                                                                    \
        fx_err e_ = (expr);                                                                 \
        if (e_ != FX_OK)                                                                    \
            fail_msg("%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #expr, fx_errname(e_),     \
                     fx_err_detail());                                                      \
    } while (0)

#define EXPECT_ERR(want, expr)                                                              \
    do {                                                                                    \
        fx_err e_ = (expr);                                                                 \
        if (e_ != (want))                                                                   \
            fail_msg("%s:%d: %s -> %s, want %s (%s)", __FILE__, __LINE__, #expr,            \
                     fx_errname(e_), fx_errname(want), fx_err_detail());                    \
    } while (0)

/* Every test runs twice: KV calls over the JSON gateway, then over etcd's gRPC API. */
static bool g_grpc;

static fx_etcd *new_client(const char *const *eps, size_t n, int timeout_ms, int max_conns)
{
    fx_etcd_opts o = {.endpoints = eps, .n_endpoints = n, .default_timeout_ms = timeout_ms,
                      .max_conns = max_conns, .grpc = g_grpc};
    fx_etcd *c = NULL;
    CHECK(fx_etcd_new(&o, &c));
    assert_non_null(c);
    return c;
}

static int group_setup(void **state)
{
    ctx *x = calloc(1, sizeof *x);
    if (!x) return -1;
    if (fxt_etcd_start(&x->etcd) != 0) {
        free(x);
        return -1;
    }
    const char *eps[] = {x->etcd.endpoint};
    fx_etcd_opts o = {.endpoints = eps, .n_endpoints = 1, .grpc = g_grpc};
    if (fx_etcd_new(&o, &x->c) != FX_OK) {
        fprintf(stderr, "fx_etcd_new: %s\n", fx_err_detail());
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
    fx_etcd_free(x->c);
    fxt_etcd_destroy(&x->etcd);
    fxt_etcd_destroy(&x->auth_etcd);
    free(x);
    return 0;
}

/* Before each test: a test that failed while etcd was stopped must not fail the next ones. */
static int ensure_etcd(void **state)
{
    ctx *x = *state;
    return x->etcd.pid > 0 ? 0 : fxt_etcd_restart(&x->etcd);
}

/* ---- helpers --------------------------------------------------------------------------------- */

static int64_t put_str(fx_etcd *c, const char *key, const char *val, int64_t lease)
{
    fx_put_req p = {.key = FX_SLICE_STR(key), .value = FX_SLICE_STR(val), .lease = lease};
    fx_put_resp r;
    CHECK(fx_etcd_put(c, &p, &r, 0));
    int64_t rev = r.revision;
    fx_put_resp_free(&r);
    assert_true(rev > 0);
    return rev;
}

static int64_t del_key(fx_etcd *c, const char *key)
{
    fx_del_req d = {.key = FX_SLICE_STR(key)};
    fx_del_resp r;
    CHECK(fx_etcd_delete(c, &d, &r, 0));
    assert_int_equal(r.deleted, 1);
    int64_t rev = r.revision;
    fx_del_resp_free(&r);
    return rev;
}

static int64_t count_prefix(fx_etcd *c, const char *prefix)
{
    uint8_t end[128];
    size_t n = fx_prefix_end(FX_SLICE_STR(prefix), end);
    fx_range_req q = {.key = FX_SLICE_STR(prefix), .range_end = {end, n}, .count_only = true};
    fx_range_resp r;
    CHECK(fx_etcd_range(c, &q, &r, 0));
    int64_t cnt = r.count;
    fx_range_resp_free(&r);
    return cnt;
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        p[i] = (uint8_t)(s >> 16);
    }
}

/* ---- watch recorder -------------------------------------------------------------------------- */

typedef struct rec_event {
    char key[64];
    fx_event_type type;
    int64_t rev;
} rec_event;

typedef struct recorder {
    pthread_mutex_t mu;
    rec_event ev[512];
    size_t n_ev;
    size_t overflow;
    size_t n_snapshots;
    size_t snapshot_n_kvs;   /* of the last snapshot */
    char snapshot_keys[16][64];
    int64_t snapshot_rev;
    int64_t last_update_rev; /* update revisions must never go backwards */
    int64_t last_ev_rev;     /* event revisions must be in order */
    int order_errors;
} recorder;

static void rec_init(recorder *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
}

static void on_update(void *arg, const fx_watch_update *u)
{
    recorder *r = arg;
    pthread_mutex_lock(&r->mu);
    if (u->revision < r->last_update_rev) r->order_errors++;
    r->last_update_rev = u->revision;
    if (u->kind == FX_WATCH_SNAPSHOT) {
        r->n_snapshots++;
        r->snapshot_n_kvs = u->n_kvs;
        r->snapshot_rev = u->revision;
        for (size_t i = 0; i < u->n_kvs && i < 16; i++)
            snprintf(r->snapshot_keys[i], sizeof r->snapshot_keys[i], "%.*s",
                     (int)u->kvs[i].key.len, (const char *)u->kvs[i].key.data);
        r->last_ev_rev = u->revision;
    } else {
        for (size_t i = 0; i < u->n_events; i++) {
            const fx_event *e = &u->events[i];
            if (e->kv.mod_revision < r->last_ev_rev || e->kv.mod_revision > u->revision)
                r->order_errors++;
            r->last_ev_rev = e->kv.mod_revision;
            if (r->n_ev == sizeof r->ev / sizeof r->ev[0]) {
                r->overflow++;
                continue;
            }
            rec_event *o = &r->ev[r->n_ev++];
            snprintf(o->key, sizeof o->key, "%.*s", (int)e->kv.key.len,
                     (const char *)e->kv.key.data);
            o->type = e->type;
            o->rev = e->kv.mod_revision;
        }
    }
    pthread_mutex_unlock(&r->mu);
}

typedef struct wait_n {
    recorder *r;
    size_t n;
} wait_n;

static bool has_n_events(void *arg)
{
    wait_n *w = arg;
    pthread_mutex_lock(&w->r->mu);
    bool ok = w->r->n_ev >= w->n;
    pthread_mutex_unlock(&w->r->mu);
    return ok;
}

static fx_watch *start_watch(fx_etcd *c, const char *prefix, uint8_t *end_buf, int64_t start_rev,
                             recorder *r)
{
    size_t n = fx_prefix_end(FX_SLICE_STR(prefix), end_buf);
    fx_watch_opts o = {.key = FX_SLICE_STR(prefix), .range_end = {end_buf, n},
                       .start_revision = start_rev, .fn = on_update, .arg = r};
    fx_watch *w = NULL;
    CHECK(fx_watch_start(c, &o, 5000, &w));
    assert_non_null(w);
    return w;
}

/* ---- etcd_kv_roundtrip ------------------------------------------------------------------------- */

static void etcd_kv_roundtrip(void **state)
{
    ctx *x = *state;
    fx_etcd *c = x->c;

    /* put / get / prev_kv */
    int64_t r1 = put_str(c, "/fxt/kv/a", "v1", 0);
    fx_kv kv;
    CHECK(fx_etcd_get(c, FX_SLICE_STR("/fxt/kv/a"), &kv, 0));
    assert_int_equal(kv.value.len, 2);
    assert_memory_equal(kv.value.data, "v1", 2);
    assert_int_equal(kv.mod_revision, r1);
    assert_int_equal(kv.create_revision, r1);
    assert_int_equal(kv.version, 1);
    fx_kv_free(&kv);
    fx_put_req p = {.key = FX_SLICE_STR("/fxt/kv/a"), .value = FX_SLICE_STR("v2"), .prev_kv = true};
    fx_put_resp pr;
    CHECK(fx_etcd_put(c, &p, &pr, 0));
    assert_true(pr.has_prev);
    assert_int_equal(pr.prev_kv.value.len, 2);
    assert_memory_equal(pr.prev_kv.value.data, "v1", 2);
    assert_true(pr.revision > r1);
    fx_put_resp_free(&pr);

    /* range by prefix, limit, count_only */
    put_str(c, "/fxt/kv/b", "vb", 0);
    put_str(c, "/fxt/kv/c", "", 0); /* empty value */
    put_str(c, "/fxt/kv0", "outside", 0); /* just past the prefix */
    uint8_t end[64];
    size_t n = fx_prefix_end(FX_SLICE_STR("/fxt/kv/"), end);
    fx_range_req q = {.key = FX_SLICE_STR("/fxt/kv/"), .range_end = {end, n}};
    fx_range_resp rr;
    CHECK(fx_etcd_range(c, &q, &rr, 0));
    assert_int_equal(rr.n_kvs, 3);
    assert_int_equal(rr.count, 3);
    assert_false(rr.more);
    assert_memory_equal(rr.kvs[0].key.data, "/fxt/kv/a", 9);
    assert_memory_equal(rr.kvs[1].key.data, "/fxt/kv/b", 9);
    assert_memory_equal(rr.kvs[2].key.data, "/fxt/kv/c", 9);
    assert_int_equal(rr.kvs[2].value.len, 0);
    assert_non_null(rr.kvs[2].value.data);
    fx_range_resp_free(&rr);
    q.limit = 2;
    CHECK(fx_etcd_range(c, &q, &rr, 0));
    assert_int_equal(rr.n_kvs, 2);
    assert_int_equal(rr.count, 3);
    assert_true(rr.more);
    fx_range_resp_free(&rr);
    q.limit = 0;
    q.sort_order = FX_SORT_DESCEND;
    q.sort_target = FX_SORT_KEY;
    q.keys_only = true;
    CHECK(fx_etcd_range(c, &q, &rr, 0));
    assert_int_equal(rr.n_kvs, 3);
    assert_memory_equal(rr.kvs[0].key.data, "/fxt/kv/c", 9);
    assert_int_equal(rr.kvs[1].value.len, 0); /* keys_only */
    fx_range_resp_free(&rr);
    assert_int_equal(count_prefix(c, "/fxt/kv/"), 3);

    /* binary key and value, 0x00 and 0xff included */
    const uint8_t bkey[] = {'/', 'f', 'x', 't', '/', 'b', 'i', 'n', '/', 0x00, 0xff, 0x01, 0x00};
    uint8_t bval[256];
    for (int i = 0; i < 256; i++) bval[i] = (uint8_t)(255 - i);
    fx_put_req bp = {.key = {bkey, sizeof bkey}, .value = {bval, sizeof bval}};
    CHECK(fx_etcd_put(c, &bp, NULL, 0));
    CHECK(fx_etcd_get(c, (fx_slice){bkey, sizeof bkey}, &kv, 0));
    assert_int_equal(kv.key.len, sizeof bkey);
    assert_memory_equal(kv.key.data, bkey, sizeof bkey);
    assert_int_equal(kv.value.len, sizeof bval);
    assert_memory_equal(kv.value.data, bval, sizeof bval);
    fx_kv_free(&kv);
    /* a key that differs only after the 0x00 is another key */
    const uint8_t bkey2[] = {'/', 'f', 'x', 't', '/', 'b', 'i', 'n', '/', 0x00, 0xff, 0x01, 0x01};
    EXPECT_ERR(FX_ENOTFOUND, fx_etcd_get(c, (fx_slice){bkey2, sizeof bkey2}, &kv, 0));
    assert_null(kv.key.data);

    /* 1 MiB value */
    size_t big_n = (size_t)1 << 20;
    uint8_t *big = malloc(big_n);
    assert_non_null(big);
    fill_pattern(big, big_n, 42);
    fx_put_req bigp = {.key = FX_SLICE_STR("/fxt/big"), .value = {big, big_n}};
    CHECK(fx_etcd_put(c, &bigp, NULL, 10000));
    CHECK(fx_etcd_get(c, FX_SLICE_STR("/fxt/big"), &kv, 10000));
    assert_int_equal(kv.value.len, big_n);
    assert_true(memcmp(kv.value.data, big, big_n) == 0);
    fx_kv_free(&kv);
    free(big);
    del_key(c, "/fxt/big");

    /* delete one key, then the prefix */
    fx_del_req d = {.key = FX_SLICE_STR("/fxt/kv/a"), .prev_kv = true};
    fx_del_resp dr;
    CHECK(fx_etcd_delete(c, &d, &dr, 0));
    assert_int_equal(dr.deleted, 1);
    assert_int_equal(dr.n_prev_kvs, 1);
    assert_memory_equal(dr.prev_kvs[0].value.data, "v2", 2);
    fx_del_resp_free(&dr);
    EXPECT_ERR(FX_ENOTFOUND, fx_etcd_get(c, FX_SLICE_STR("/fxt/kv/a"), &kv, 0));
    fx_del_req dp = {.key = FX_SLICE_STR("/fxt/kv/"), .range_end = {end, n}};
    CHECK(fx_etcd_delete(c, &dp, &dr, 0));
    assert_int_equal(dr.deleted, 2);
    fx_del_resp_free(&dr);
    assert_int_equal(count_prefix(c, "/fxt/kv/"), 0);
    CHECK(fx_etcd_get(c, FX_SLICE_STR("/fxt/kv0"), &kv, 0)); /* untouched */
    fx_kv_free(&kv);

    /* status */
    fx_etcd_status st;
    CHECK(fx_etcd_status_get(c, &st, 0));
    assert_true(strncmp(st.version, "3.", 2) == 0);
    assert_true(st.revision > 0);
    assert_true(st.db_size > 0);
    assert_true(st.leader != 0);
}

/* ---- etcd_txn_cas ----------------------------------------------------------------------------- */

typedef struct racer {
    fx_etcd *c;
    pthread_barrier_t *bar;
    int id;
    fx_err err;
    bool won;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    char val[32];
    snprintf(val, sizeof val, "racer-%d", r->id);
    fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL,
                  .key = FX_SLICE_STR("/fxt/txn/owner"), .num = 0};
    fx_op put = {.type = FX_OP_PUT};
    put.u.put = (fx_put_req){.key = FX_SLICE_STR("/fxt/txn/owner"), .value = FX_SLICE_STR(val)};
    fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
    fx_txn_resp tr;
    pthread_barrier_wait(r->bar);
    r->err = fx_etcd_txn(r->c, &t, &tr, 5000);
    r->won = r->err == FX_OK && tr.succeeded;
    fx_txn_resp_free(&tr);
    return NULL;
}

static void etcd_txn_cas(void **state)
{
    ctx *x = *state;
    fx_etcd *c = x->c;

    /* create-if-absent: exactly one of 8 racing threads wins */
    enum { N = 8 };
    pthread_t th[N];
    racer rs[N];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++) {
        rs[i] = (racer){.c = c, .bar = &bar, .id = i};
        /* a racer that cannot start would leave the others in the barrier: abort at once
         * (no check may leave this frame while they use rs and bar) */
        if (pthread_create(&th[i], NULL, race, &rs[i]) != 0) {
            fprintf(stderr, "pthread_create failed with %d racer(s) in the barrier\n", i);
            abort();
        }
    }
    int wins = 0, winner = -1;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (rs[i].err != FX_OK) fail_msg("racer %d: %s", i, fx_errname(rs[i].err));
        if (rs[i].won) {
            wins++;
            winner = i;
        }
    }
    pthread_barrier_destroy(&bar);
    assert_int_equal(wins, 1);
    char want[32];
    snprintf(want, sizeof want, "racer-%d", winner);
    fx_kv kv;
    CHECK(fx_etcd_get(c, FX_SLICE_STR("/fxt/txn/owner"), &kv, 0));
    assert_int_equal(kv.value.len, strlen(want));
    assert_memory_equal(kv.value.data, want, strlen(want));
    assert_int_equal(kv.version, 1);
    fx_kv_free(&kv);

    /* value compare: equal -> success branch; different -> failure branch with its range */
    fx_cmp vc = {.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL,
                 .key = FX_SLICE_STR("/fxt/txn/owner"), .value = FX_SLICE_STR(want)};
    fx_op ok_op = {.type = FX_OP_PUT};
    ok_op.u.put = (fx_put_req){.key = FX_SLICE_STR("/fxt/txn/owner"),
                               .value = FX_SLICE_STR("taken"), .prev_kv = true};
    fx_op fail_op = {.type = FX_OP_RANGE};
    fail_op.u.range = (fx_range_req){.key = FX_SLICE_STR("/fxt/txn/owner")};
    fx_txn_req t = {.cmp = &vc, .n_cmp = 1, .success = &ok_op, .n_success = 1,
                    .failure = &fail_op, .n_failure = 1};
    fx_txn_resp tr;
    CHECK(fx_etcd_txn(c, &t, &tr, 0));
    assert_true(tr.succeeded);
    assert_int_equal(tr.n_responses, 1);
    assert_int_equal(tr.responses[0].type, FX_OP_PUT);
    assert_true(tr.responses[0].u.put.has_prev);
    assert_memory_equal(tr.responses[0].u.put.prev_kv.value.data, want, strlen(want));
    fx_txn_resp_free(&tr);
    CHECK(fx_etcd_txn(c, &t, &tr, 0)); /* the value is "taken" now */
    assert_false(tr.succeeded);
    assert_int_equal(tr.n_responses, 1);
    assert_int_equal(tr.responses[0].type, FX_OP_RANGE);
    assert_int_equal(tr.responses[0].u.range.n_kvs, 1);
    assert_memory_equal(tr.responses[0].u.range.kvs[0].value.data, "taken", 5);
    fx_txn_resp_free(&tr);

    /* 129 ops -> too many operations */
    enum { OPS = 129 };
    static char keys[OPS][32];
    static fx_op ops[OPS];
    for (int i = 0; i < OPS; i++) {
        snprintf(keys[i], sizeof keys[i], "/fxt/txn/many/%03d", i);
        ops[i] = (fx_op){.type = FX_OP_PUT};
        ops[i].u.put = (fx_put_req){.key = FX_SLICE_STR(keys[i]), .value = FX_SLICE_STR("x")};
    }
    fx_txn_req many = {.success = ops, .n_success = OPS};
    fx_clearerr();
    EXPECT_ERR(FX_ETXN_TOO_MANY_OPS, fx_etcd_txn(c, &many, &tr, 0));
    assert_non_null(strstr(fx_err_detail(), "too many operations"));
    assert_int_equal(tr.n_responses, 0);
    assert_null(tr.responses);
    many.n_success = 128; /* the limit itself is fine */
    CHECK(fx_etcd_txn(c, &many, NULL, 0));
    assert_int_equal(count_prefix(c, "/fxt/txn/many/"), 128);

    /* > 1.5 MiB -> request too large */
    size_t big_n = 1600 * 1000;
    uint8_t *big = malloc(big_n);
    assert_non_null(big);
    fill_pattern(big, big_n, 7);
    fx_op bigop = {.type = FX_OP_PUT};
    bigop.u.put = (fx_put_req){.key = FX_SLICE_STR("/fxt/txn/big"), .value = {big, big_n}};
    fx_txn_req bigt = {.success = &bigop, .n_success = 1};
    fx_clearerr();
    EXPECT_ERR(FX_ETOO_LARGE, fx_etcd_txn(c, &bigt, NULL, 10000));
    assert_non_null(strstr(fx_err_detail(), "request is too large"));
    free(big);
    assert_string_not_equal(fx_strerror(FX_ETXN_TOO_MANY_OPS), fx_strerror(FX_ETOO_LARGE));
    EXPECT_ERR(FX_ENOTFOUND, fx_etcd_get(c, FX_SLICE_STR("/fxt/txn/big"), &kv, 0));

    /* duplicate keys in one txn */
    fx_op dup[2] = {ops[0], ops[0]};
    fx_txn_req dupt = {.success = dup, .n_success = 2};
    EXPECT_ERR(FX_EDUPLICATE_KEY, fx_etcd_txn(c, &dupt, NULL, 0));
    assert_non_null(strstr(fx_err_detail(), "duplicate key"));
}

/* ---- etcd_lease_expiry_deletes_keys ------------------------------------------------------------- */

typedef struct gone {
    fx_etcd *c;
    const char *prefix;
} gone;

static bool prefix_empty(void *arg)
{
    gone *g = arg;
    return count_prefix(g->c, g->prefix) == 0;
}

static void etcd_lease_expiry_deletes_keys(void **state)
{
    ctx *x = *state;
    fx_etcd *c = x->c;
    int64_t id = 0, ttl = 0, granted = 0;
    CHECK(fx_etcd_lease_grant(c, 2, 0, &id, &ttl, 0));
    assert_true(id != 0);
    assert_true(ttl >= 2);

    recorder rec;
    rec_init(&rec);
    uint8_t end[64];
    fx_watch *w = start_watch(c, "/fxt/lease/", end, 0, &rec);
    assert_int_equal(rec.n_snapshots, 1);
    assert_int_equal(rec.snapshot_n_kvs, 0);

    const char *keys[] = {"/fxt/lease/a", "/fxt/lease/b", "/fxt/lease/c"};
    for (int i = 0; i < 3; i++) put_str(c, keys[i], "leased", id);
    CHECK(fx_etcd_lease_timetolive(c, id, &ttl, &granted, 0));
    assert_true(ttl > 0 && ttl <= 2);
    assert_int_equal(granted, 2);

    /* no keepalive: the keys vanish */
    gone g = {c, "/fxt/lease/"};
    assert_true(fxt_wait_until(prefix_empty, &g, 10000));
    /* and the watch sees one DELETE per key (after the three PUTs) */
    wait_n wn = {&rec, 6};
    assert_true(fxt_wait_until(has_n_events, &wn, 5000));
    fx_watch_stats ws;
    fx_watch_get_stats(w, &ws);
    int64_t t0 = fxt_now_ms();
    fx_watch_stop(w); /* idle in curl_multi_poll: the wakeup must interrupt it */
    assert_true(fxt_now_ms() - t0 < FXT_MS(500));
    assert_int_equal(rec.n_ev, 6);
    int deletes[3] = {0, 0, 0};
    for (size_t i = 0; i < rec.n_ev; i++) {
        if (i < 3) assert_int_equal(rec.ev[i].type, FX_EV_PUT);
        if (rec.ev[i].type != FX_EV_DELETE) continue;
        for (int k = 0; k < 3; k++)
            if (!strcmp(rec.ev[i].key, keys[k])) deletes[k]++;
    }
    assert_int_equal(deletes[0], 1);
    assert_int_equal(deletes[1], 1);
    assert_int_equal(deletes[2], 1);
    assert_int_equal(rec.order_errors, 0);
    assert_int_equal(ws.events, 6);
    assert_int_equal(ws.snapshots, 1);

    /* the dead lease */
    EXPECT_ERR(FX_ELEASE_EXPIRED, fx_etcd_lease_keepalive(c, id, &ttl, 0));
    assert_int_equal(ttl, 0);
    EXPECT_ERR(FX_ELEASE_EXPIRED, fx_etcd_lease_keepalive_lane(c, id, &ttl, 0));
    fx_put_req p = {.key = FX_SLICE_STR("/fxt/lease/late"), .value = FX_SLICE_STR("x"), .lease = id};
    EXPECT_ERR(FX_ELEASE_EXPIRED, fx_etcd_put(c, &p, NULL, 0));
    assert_non_null(strstr(fx_err_detail(), "lease not found"));
    CHECK(fx_etcd_lease_timetolive(c, id, &ttl, NULL, 0));
    assert_int_equal(ttl, -1);
    EXPECT_ERR(FX_ENOTFOUND, fx_etcd_lease_revoke(c, id, 0));

    /* a live lease: keepalive on the pool and on the lane, then revoke deletes its keys */
    int64_t id2 = 0;
    CHECK(fx_etcd_lease_grant(c, 30, 0, &id2, NULL, 0));
    put_str(c, "/fxt/lease/live", "x", id2);
    fx_etcd_stats before, after;
    fx_etcd_get_stats(c, &before);
    CHECK(fx_etcd_lease_keepalive(c, id2, &ttl, 0));
    assert_int_equal(ttl, 30);
    CHECK(fx_etcd_lease_keepalive_lane(c, id2, &ttl, 0));
    assert_int_equal(ttl, 30);
    fx_etcd_get_stats(c, &after);
    assert_int_equal(after.keepalives - before.keepalives, 2);
    /* granting an existing id is refused */
    EXPECT_ERR(FX_EEXISTS, fx_etcd_lease_grant(c, 30, id2, NULL, NULL, 0));
    CHECK(fx_etcd_lease_revoke(c, id2, 0));
    assert_int_equal(count_prefix(c, "/fxt/lease/"), 0);
    pthread_mutex_destroy(&rec.mu);
}

/* ---- etcd_watch_resync -------------------------------------------------------------------------- */

typedef struct expect {
    rec_event ev[256];
    size_t n;
} expect;

static void expect_put(expect *ex, fx_etcd *c, const char *key, const char *val)
{
    rec_event *e = &ex->ev[ex->n++];
    snprintf(e->key, sizeof e->key, "%s", key);
    e->type = FX_EV_PUT;
    e->rev = put_str(c, key, val, 0);
}

static void expect_del(expect *ex, fx_etcd *c, const char *key)
{
    rec_event *e = &ex->ev[ex->n++];
    snprintf(e->key, sizeof e->key, "%s", key);
    e->type = FX_EV_DELETE;
    e->rev = del_key(c, key);
}

static void write_batch(expect *ex, fx_etcd *c, int from, int to)
{
    char key[64], val[32];
    for (int i = from; i < to; i++) {
        snprintf(key, sizeof key, "/fxt/w/k%03d", i);
        snprintf(val, sizeof val, "v%d", i);
        expect_put(ex, c, key, val);
        if (i % 5 == 4) { /* some updates and deletes too */
            expect_put(ex, c, key, "again");
            expect_del(ex, c, key);
        }
    }
}

static void compare_events(recorder *rec, const expect *ex)
{
    pthread_mutex_lock(&rec->mu);
    size_t n = rec->n_ev;
    pthread_mutex_unlock(&rec->mu);
    if (n != ex->n) fail_msg("watch delivered %zu events, %zu written", n, ex->n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(rec->ev[i].key, ex->ev[i].key) || rec->ev[i].type != ex->ev[i].type ||
            rec->ev[i].rev != ex->ev[i].rev)
            fail_msg("event %zu: got %s %d @%" PRId64 ", want %s %d @%" PRId64, i,
                     rec->ev[i].key, rec->ev[i].type, rec->ev[i].rev, ex->ev[i].key,
                     ex->ev[i].type, ex->ev[i].rev);
        if (i > 0) assert_true(rec->ev[i].rev > rec->ev[i - 1].rev);
    }
    assert_int_equal(rec->order_errors, 0);
    assert_int_equal(rec->overflow, 0);
}

typedef struct wstat {
    fx_watch *w;
    uint64_t reconnects;
} wstat;

static bool reconnected(void *arg)
{
    wstat *s = arg;
    fx_watch_stats st;
    fx_watch_get_stats(s->w, &st);
    return st.reconnects >= s->reconnects;
}

static void etcd_watch_resync(void **state)
{
    ctx *x = *state;
    fx_etcd *c = x->c;
    static expect ex;
    memset(&ex, 0, sizeof ex);
    static recorder rec;
    rec_init(&rec);

    put_str(c, "/fxt/w/pre1", "p", 0);
    int64_t pre_rev = put_str(c, "/fxt/w/pre2", "p", 0);
    uint8_t end[64];
    fx_watch *w = start_watch(c, "/fxt/w/", end, 0, &rec);
    /* snapshot first, with what was there */
    assert_int_equal(rec.n_snapshots, 1);
    assert_int_equal(rec.snapshot_n_kvs, 2);
    assert_string_equal(rec.snapshot_keys[0], "/fxt/w/pre1");
    assert_string_equal(rec.snapshot_keys[1], "/fxt/w/pre2");
    assert_true(rec.snapshot_rev >= pre_rev);

    write_batch(&ex, c, 0, 20);
    wait_n wn = {&rec, ex.n};
    assert_true(fxt_wait_until(has_n_events, &wn, 10000));

    static recorder rec2;
    rec_init(&rec2);
    uint8_t end2[64];
    fx_watch *w2 = start_watch(c, "/fxt/w2/", end2, 0, &rec2);

    /* etcd goes away: the stream breaks and reconnects fail until it is back */
    assert_int_equal(fxt_etcd_stop(&x->etcd), 0);
    wstat ws = {w, 1};
    assert_true(fxt_wait_until(reconnected, &ws, 10000));
    /* a watch that is backing off stops promptly */
    wstat ws2 = {w2, 4};
    assert_true(fxt_wait_until(reconnected, &ws2, 10000));
    int64_t t0 = fxt_now_ms();
    fx_watch_stop(w2);
    assert_true(fxt_now_ms() - t0 < FXT_MS(300));
    assert_int_equal(rec2.n_snapshots, 1);
    assert_int_equal(rec2.n_ev, 0);
    pthread_mutex_destroy(&rec2.mu);
    assert_int_equal(fxt_etcd_restart(&x->etcd), 0);
    write_batch(&ex, c, 20, 40);
    wn.n = ex.n;
    assert_true(fxt_wait_until(has_n_events, &wn, 20000));
    /* nothing extra trickles in */
    put_str(c, "/fxt/w/zz-marker", "m", 0);
    wn.n = ex.n + 1;
    assert_true(fxt_wait_until(has_n_events, &wn, 10000));
    fx_watch_stats st;
    fx_watch_get_stats(w, &st);
    fx_watch_stop(w);
    assert_int_equal(rec.n_ev, ex.n + 1);
    rec.n_ev--; /* the marker */
    compare_events(&rec, &ex);
    assert_int_equal(rec.n_snapshots, 1); /* resumed, no new snapshot */
    assert_true(st.reconnects >= 1);
    assert_true(st.streams >= 2);
    assert_int_equal(st.snapshots, 1);
    assert_int_equal(st.events, ex.n + 1);
    assert_int_equal(st.last_revision, rec.last_ev_rev);
    pthread_mutex_destroy(&rec.mu);

    /* a watch from a compacted revision: snapshot first, then live events */
    int64_t old_rev = ex.ev[0].rev;
    fx_etcd_status status;
    CHECK(fx_etcd_status_get(c, &status, 0));
    CHECK(fx_etcd_compact(c, status.revision, 0));
    fx_range_req hist = {.key = FX_SLICE_STR("/fxt/w/pre1"), .revision = old_rev};
    fx_range_resp hr;
    EXPECT_ERR(FX_ECOMPACTED, fx_etcd_range(c, &hist, &hr, 0));
    rec_init(&rec);
    w = start_watch(c, "/fxt/w/", end, old_rev, &rec);
    assert_int_equal(rec.n_snapshots, 1);
    int64_t live = count_prefix(c, "/fxt/w/");
    assert_int_equal(rec.snapshot_n_kvs, (size_t)live);
    assert_true(rec.snapshot_rev >= status.revision);
    int64_t rev_after = put_str(c, "/fxt/w/after-compaction", "x", 0);
    wn = (wait_n){&rec, 1};
    assert_true(fxt_wait_until(has_n_events, &wn, 10000));
    fx_watch_get_stats(w, &st);
    fx_watch_stop(w);
    assert_int_equal(rec.n_ev, 1);
    assert_string_equal(rec.ev[0].key, "/fxt/w/after-compaction");
    assert_int_equal(rec.ev[0].rev, rev_after);
    assert_true(st.compactions >= 1);
    assert_int_equal(st.snapshots, 1);
    assert_int_equal(rec.order_errors, 0);
    pthread_mutex_destroy(&rec.mu);

    /* a watch from a non-compacted revision replays history without a snapshot */
    rec_init(&rec);
    w = start_watch(c, "/fxt/w/", end, rev_after, &rec);
    wn = (wait_n){&rec, 1};
    assert_true(fxt_wait_until(has_n_events, &wn, 10000));
    fx_watch_stop(w);
    assert_int_equal(rec.n_snapshots, 0);
    assert_int_equal(rec.ev[0].rev, rev_after);
    pthread_mutex_destroy(&rec.mu);
}

/* ---- etcd_failover ------------------------------------------------------------------------------ */

static void etcd_failover(void **state)
{
    ctx *x = *state;
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d", fxt_dead_port());
    const char *eps[] = {dead, x->etcd.endpoint};
    fx_etcd *c = new_client(eps, 2, 2000, 0);

    int64_t t0 = fxt_now_ms();
    put_str(c, "/fxt/fo/a", "1", 0); /* a write: refused connections prove it was not sent */
    assert_true(fxt_now_ms() - t0 < FXT_MS(2000));
    fx_etcd_stats st;
    fx_etcd_get_stats(c, &st);
    assert_true(st.failovers > 0);
    assert_int_equal(st.failovers, 1);
    assert_int_equal(st.errors, 0);

    /* later calls start at the endpoint that worked: no more failovers */
    fx_kv kv;
    for (int i = 0; i < 10; i++) {
        CHECK(fx_etcd_get(c, FX_SLICE_STR("/fxt/fo/a"), &kv, 0));
        fx_kv_free(&kv);
    }
    fx_etcd_get_stats(c, &st);
    assert_int_equal(st.failovers, 1);
    assert_true(st.latency_count >= 11);
    assert_true(st.requests >= 12);

    /* a watch on the same client works too */
    recorder rec;
    rec_init(&rec);
    uint8_t end[64];
    fx_watch *w = start_watch(c, "/fxt/fo/", end, 0, &rec);
    assert_int_equal(rec.snapshot_n_kvs, 1);
    fx_watch_stop(w);
    pthread_mutex_destroy(&rec.mu);

    /* only dead endpoints: FX_EUNAVAIL quickly, both tried */
    char dead2[64];
    snprintf(dead2, sizeof dead2, "http://127.0.0.1:%d", fxt_dead_port());
    const char *deads[] = {dead, dead2};
    fx_etcd *d = new_client(deads, 2, 2000, 0);
    t0 = fxt_now_ms();
    EXPECT_ERR(FX_EUNAVAIL, fx_etcd_get(d, FX_SLICE_STR("/fxt/fo/a"), &kv, 0));
    assert_true(fxt_now_ms() - t0 < FXT_MS(2000));
    fx_etcd_get_stats(d, &st);
    assert_int_equal(st.failovers, 1);
    assert_int_equal(st.requests, 2);
    assert_int_equal(st.errors, 1);
    assert_non_null(strstr(fx_err_detail(), "no endpoint reachable"));
    rec_init(&rec);
    fx_watch_opts wo = {.key = FX_SLICE_STR("/fxt/fo/"), .fn = on_update, .arg = &rec};
    fx_watch *dw = NULL;
    EXPECT_ERR(FX_EUNAVAIL, fx_watch_start(d, &wo, 2000, &dw));
    assert_null(dw);
    assert_int_equal(rec.n_snapshots, 0);
    pthread_mutex_destroy(&rec.mu);
    fx_etcd_free(d);
    fx_etcd_free(c);
}

/* ---- etcd_deadline ------------------------------------------------------------------------------ */

typedef struct slow_call {
    fx_etcd *c;
    fx_err err;
} slow_call;

static void *slow_put(void *arg)
{
    slow_call *s = arg;
    fx_put_req p = {.key = FX_SLICE_STR("/fxt/dl/x"), .value = FX_SLICE_STR("x")};
    s->err = fx_etcd_put(s->c, &p, NULL, 1500);
    return NULL;
}

static bool one_request_in_flight(void *arg)
{
    fx_etcd_stats st;
    fx_etcd_get_stats(arg, &st);
    return st.requests >= 1;
}

static void etcd_deadline(void **state)
{
    (void)state;
    int port = 0;
    int fd = fxt_blackhole_listen(&port);
    assert_true(fd >= 0);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", port);
    const char *eps[] = {ep};
    fx_etcd *c = new_client(eps, 1, 0, 0);

    fx_put_req p = {.key = FX_SLICE_STR("/fxt/dl/a"), .value = FX_SLICE_STR("x")};
    int64_t t0 = fxt_now_ms();
    EXPECT_ERR(FX_ETIMEDOUT, fx_etcd_put(c, &p, NULL, 500));
    int64_t dt = fxt_now_ms() - t0;
    if (dt < 450 || dt > FXT_MS(1500)) fail_msg("put took %" PRId64 " ms", dt);

    fx_range_req q = {.key = FX_SLICE_STR("/fxt/dl/a")};
    fx_range_resp r;
    t0 = fxt_now_ms();
    EXPECT_ERR(FX_ETIMEDOUT, fx_etcd_range(c, &q, &r, 500));
    dt = fxt_now_ms() - t0;
    if (dt < 450 || dt > FXT_MS(1500)) fail_msg("range took %" PRId64 " ms", dt);
    assert_int_equal(r.n_kvs, 0);
    fx_etcd_stats st;
    fx_etcd_get_stats(c, &st);
    assert_int_equal(st.errors, 2);

    /* a watch whose stream is never created */
    recorder rec;
    rec_init(&rec);
    fx_watch_opts wo = {.key = FX_SLICE_STR("/fxt/dl/"), .fn = on_update, .arg = &rec};
    fx_watch *w = NULL;
    t0 = fxt_now_ms();
    EXPECT_ERR(FX_ETIMEDOUT, fx_watch_start(c, &wo, 500, &w));
    dt = fxt_now_ms() - t0;
    if (dt < 450 || dt > FXT_MS(1500)) fail_msg("watch start took %" PRId64 " ms", dt);
    assert_null(w);
    assert_int_equal(rec.n_snapshots, 0);
    pthread_mutex_destroy(&rec.mu);
    fx_etcd_free(c);

    /* a pool of one connection held by a slow call: the next call times out waiting for it */
    fx_etcd *one = new_client(eps, 1, 0, 1);
    slow_call sc = {one, FX_OK};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_put, &sc), 0);
    bool in_flight = fxt_wait_until(one_request_in_flight, one, 2000);
    fx_err pool_err = FX_OK;
    dt = 0;
    if (in_flight) {
        t0 = fxt_now_ms();
        pool_err = fx_etcd_range(one, &q, &r, 300);
        dt = fxt_now_ms() - t0;
    }
    pthread_join(th, NULL); /* joined before any check can leave this frame (sc lives here) */
    assert_true(in_flight);
    EXPECT_ERR(FX_ETIMEDOUT, pool_err);
    if (dt < 250 || dt > FXT_MS(1000)) fail_msg("pool wait took %" PRId64 " ms", dt);
    assert_int_equal(sc.err, FX_ETIMEDOUT);
    fx_etcd_get_stats(one, &st);
    assert_int_equal(st.pool_waits, 1);
    assert_int_equal(st.conns_created, 1);
    assert_int_equal(st.requests, 1); /* the waiting call never sent anything */
    fx_etcd_free(one);
    close(fd);
}

/* ---- etcd_auth ------------------------------------------------------------------------------------ */

typedef struct raw_buf {
    char data[4096];
    size_t len;
} raw_buf;

static size_t raw_write(char *p, size_t sz, size_t n, void *ud)
{
    raw_buf *b = ud;
    size_t take = sz * n;
    if (take > sizeof b->data - 1 - b->len) take = sizeof b->data - 1 - b->len;
    memcpy(b->data + b->len, p, take);
    b->len += take;
    b->data[b->len] = '\0';
    return sz * n;
}

/* A plain POST to the gateway, outside the client under test. Returns the HTTP status. */
static long raw_post(const char *ep, const char *path, const char *body, const char *token,
                     raw_buf *out)
{
    char url[256], auth[512];
    snprintf(url, sizeof url, "%s%s", ep, path);
    CURL *h = curl_easy_init();
    assert_non_null(h);
    struct curl_slist *hdrs = NULL;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: %s", token);
        hdrs = curl_slist_append(hdrs, auth);
    }
    out->len = 0;
    out->data[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, raw_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return status;
}

static void raw_token(const char *ep, char *tok, size_t size)
{
    raw_buf b;
    assert_int_equal(raw_post(ep, "/v3/auth/authenticate",
                              "{\"name\":\"root\",\"password\":\"s3cret-pw\"}", NULL, &b), 200);
    const char *t = strstr(b.data, "\"token\":\"");
    assert_non_null(t);
    t += 9;
    size_t n = strcspn(t, "\"");
    assert_true(n > 0 && n < size);
    memcpy(tok, t, n);
    tok[n] = '\0';
}

static void etcd_auth(void **state)
{
    ctx *x = *state;
    fxt_etcd *e = &x->auth_etcd;
    assert_int_equal(fxt_etcd_start(e), 0);
    raw_buf b;
    assert_int_equal(raw_post(e->endpoint, "/v3/auth/user/add",
                              "{\"name\":\"root\",\"password\":\"s3cret-pw\"}", NULL, &b), 200);
    assert_int_equal(raw_post(e->endpoint, "/v3/auth/user/grant",
                              "{\"user\":\"root\",\"role\":\"root\"}", NULL, &b), 200);
    assert_int_equal(raw_post(e->endpoint, "/v3/auth/enable", "{}", NULL, &b), 200);

    const char *eps[] = {e->endpoint};
    fx_etcd_opts o = {.endpoints = eps, .n_endpoints = 1, .username = "root",
                      .password = "s3cret-pw", .grpc = g_grpc};
    fx_etcd *c = NULL;
    CHECK(fx_etcd_new(&o, &c));
    put_str(c, "/fxt/auth/a", "1", 0);
    fx_kv kv;
    CHECK(fx_etcd_get(c, FX_SLICE_STR("/fxt/auth/a"), &kv, 0));
    fx_kv_free(&kv);
    fx_etcd_stats s0;
    fx_etcd_get_stats(c, &s0);
    assert_int_equal(s0.requests, 3); /* authenticate once, then two calls with the token */

    /* a watch carries the token too */
    recorder rec;
    rec_init(&rec);
    uint8_t end[64];
    fx_watch *w = start_watch(c, "/fxt/auth/", end, 0, &rec);
    assert_int_equal(rec.snapshot_n_kvs, 1);
    fx_watch_stop(w);
    pthread_mutex_destroy(&rec.mu);

    /* auth disable + enable drops every simple token: the next call gets 401, authenticates
     * again and succeeds, once */
    char tok[256];
    raw_token(e->endpoint, tok, sizeof tok);
    assert_int_equal(raw_post(e->endpoint, "/v3/auth/disable", "{}", tok, &b), 200);
    assert_int_equal(raw_post(e->endpoint, "/v3/auth/enable", "{}", NULL, &b), 200);
    assert_int_equal(raw_post(e->endpoint, "/v3/kv/range", "{\"key\":\"YQ==\"}", tok, &b), 401);
    fx_etcd_stats s1, s2;
    fx_etcd_get_stats(c, &s1);
    put_str(c, "/fxt/auth/b", "2", 0);
    fx_etcd_get_stats(c, &s2);
    assert_int_equal(s2.requests - s1.requests, 3); /* 401, authenticate, retry */
    assert_int_equal(s2.errors, s1.errors);

    /* wrong password and no credentials */
    fx_etcd_opts bad = o;
    bad.password = "wrong-pw-123";
    fx_etcd *cb = NULL;
    CHECK(fx_etcd_new(&bad, &cb));
    fx_clearerr();
    EXPECT_ERR(FX_EAUTH, fx_etcd_get(cb, FX_SLICE_STR("/fxt/auth/a"), &kv, 0));
    assert_non_null(strstr(fx_err_detail(), "authentication"));
    assert_null(strstr(fx_err_detail(), "wrong-pw-123"));
    fx_etcd_free(cb);
    fx_etcd_opts none = {.endpoints = eps, .n_endpoints = 1, .grpc = g_grpc};
    fx_etcd *cn = NULL;
    CHECK(fx_etcd_new(&none, &cn));
    EXPECT_ERR(FX_EAUTH, fx_etcd_get(cn, FX_SLICE_STR("/fxt/auth/a"), &kv, 0));
    fx_etcd_free(cn);

    fx_etcd_free(c);
    fxt_etcd_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(etcd_kv_roundtrip, ensure_etcd),
        cmocka_unit_test_setup(etcd_txn_cas, ensure_etcd),
        cmocka_unit_test_setup(etcd_lease_expiry_deletes_keys, ensure_etcd),
        cmocka_unit_test_setup(etcd_watch_resync, ensure_etcd),
        cmocka_unit_test_setup(etcd_failover, ensure_etcd),
        cmocka_unit_test(etcd_deadline),
        cmocka_unit_test(etcd_auth),
    };
    int failed = cmocka_run_group_tests_name("etcd over the JSON gateway", tests, group_setup,
                                             group_teardown);
    g_grpc = true;
    failed += cmocka_run_group_tests_name("etcd, KV calls over gRPC", tests, group_setup,
                                          group_teardown);
    return failed;
}
