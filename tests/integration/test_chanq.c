/* test_chanq.c -- the channel consumer (bridge/chanq_cons.h) and its keeper against a real etcd:
 * backlog a departed consumer left (closed, or its member lease lost) is inherited with its
 * delivery counts; acks commit and what was not acked goes to the next consumer. The keepers'
 * jobs run on one executor (bridge/executor.h), as in the daemon. Channel TTL 3 s. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chanq.h"
#include "etcd.h"
#include "executor.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "keys.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"

#define OP_MS 3000
#define TTL 3
#define WAIT_MS 15000

static struct {
    fxt_etcd etcd;
    const char *eps[1];
    fx_etcd *raw; /* direct etcd access (revoke a lease) */
    fx_exec *ex;  /* the keepers' jobs */
} G;

static int group_setup(void **state)
{
    (void)state;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    if (fxt_etcd_start(&G.etcd) != 0) return -1;
    G.eps[0] = G.etcd.endpoint;
    fx_etcd_opts o = {.endpoints = G.eps, .n_endpoints = 1};
    fx_exec_cfg xc;
    fx_exec_cfg_defaults(&xc);
    if (fx_etcd_new(&o, &G.raw) != FX_OK || fx_exec_new(&xc, &G.ex) != FX_OK) {
        fx_etcd_free(G.raw);
        fxt_etcd_destroy(&G.etcd);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    fx_exec_free(G.ex);
    fx_etcd_free(G.raw);
    fxt_etcd_destroy(&G.etcd);
    return 0;
}

static fx_mq_client *client_new(const char *root)
{
    fx_mq_client_opts o = {.etcd = {.endpoints = G.eps, .n_endpoints = 1}, .root = root,
                           .min_ttl_s = 2, .op_timeout_ms = OP_MS, .close_timeout_ms = 1000};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    return c;
}

static const fx_mq_chan_cfg CFG = {.capacity = 1000, .ttl_s = TTL, .weight = 1};

/* The front-end side of a consumer: what it was told. */
typedef struct fe {
    int released_all;
    size_t held; /* what held() answers */
} fe;

static void fe_notify(void *arg) { (void)arg; }
static void fe_release(void *arg, int64_t src)
{
    if (src == FX_CHANQ_ALL) ((fe *)arg)->released_all++;
}
static size_t fe_held(void *arg, int64_t src)
{
    (void)src;
    return ((fe *)arg)->held;
}

static fx_chanq_cons *cons_open(fx_chanq_keeper *k, const char *label, fe *f)
{
    fx_chanq_cons_opts o = {.channel = "orders", .cfg = CFG, .label = label, .attempts = true};
    fx_chanq_cons_cb cb = {.notify = fe_notify, .release = fe_release, .held = fe_held, .arg = f};
    fx_chanq_cons *c = NULL;
    CHECK(fx_chanq_cons_new(k, &o, &cb, &c));
    int64_t deadline = fxt_now_ms() + WAIT_MS;
    while (fx_chanq_cons_poll(c) >= 0) {
        if (fxt_now_ms() > deadline) fail_msg("consumer %s did not open", label);
        fxt_nap_ms(20);
    }
    return c;
}

/* Get until `want` deliveries arrived (ids and counts out), polling like a front-end. */
static void get_n(fx_chanq_cons *c, size_t want, fx_mq_msg_id *ids, uint64_t *counts)
{
    fx_mq_delivery dv[16];
    uint64_t cn[16];
    size_t have = 0;
    int64_t deadline = fxt_now_ms() + WAIT_MS;
    while (have < want) {
        if (fxt_now_ms() > deadline) fail_msg("got %zu of %zu deliveries", have, want);
        if (fx_chanq_cons_poll(c) >= 0) {
            fxt_nap_ms(20);
            continue;
        }
        fx_chanq_cons_inherit(c);
        size_t n = 0;
        fx_err e = fx_chanq_cons_get(c, dv, cn, 16, &n);
        if (e == FX_ETIMEDOUT || (e == FX_OK && !n)) {
            fxt_nap_ms(20);
            continue;
        }
        CHECK(e);
        for (size_t i = 0; i < n; i++) {
            if (have >= want) fail_msg("more deliveries than the %zu stored", want);
            ids[have] = dv[i].id;
            counts[have++] = cn[i];
            fx_mq_delivery_free(&dv[i]);
        }
    }
}

/* Nothing more is delivered for ms. */
static void get_none(fx_chanq_cons *c, int ms)
{
    fx_mq_delivery dv[4];
    uint64_t cn[4];
    int64_t until = fxt_now_ms() + ms;
    while (fxt_now_ms() < until) {
        if (fx_chanq_cons_poll(c) < 0) {
            fx_chanq_cons_inherit(c);
            size_t n = 0;
            fx_chanq_cons_get(c, dv, cn, 4, &n);
            if (n) fail_msg("unexpected delivery %" PRId64 ".%" PRId64 ".%" PRId64, dv[0].id.chan,
                            dv[0].id.pidx, dv[0].id.msg);
        }
        fxt_nap_ms(20);
    }
}

static fx_mpmc_producer *prod_open(fx_mq_client *mq)
{
    int64_t id = -1;
    CHECK(fx_mpmc_resolve(mq, "orders", &CFG, &id));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(mq, id, 1, &p));
    return p;
}

static void put_n(fx_mpmc_producer *p, size_t n)
{
    fx_slice v[16];
    char buf[16][24];
    for (size_t i = 0; i < n; i++) {
        snprintf(buf[i], sizeof buf[i], "m%zu", i);
        v[i] = FX_SLICE_STR(buf[i]);
    }
    size_t put = 0;
    CHECK(fx_mpmc_put(p, v, n, OP_MS, &put, NULL));
    assert_int_equal(put, n);
}

/* Record `count` attempts for ids[0, n) and wait until the record is durable. */
static void count_durable(fx_chanq_cons *c, const fx_mq_msg_id *ids, size_t n, uint32_t count)
{
    fx_chanq_attempt it[16];
    for (size_t i = 0; i < n; i++) it[i] = (fx_chanq_attempt){ids[i], count, 0};
    fx_chanq_cons_count(c, it, n);
    int64_t deadline = fxt_now_ms() + WAIT_MS;
    for (size_t i = 0; i < n; i++) {
        assert_true(it[i].gen > 0);
        while (!fx_chanq_cons_durable(c, it[i].id, it[i].gen)) {
            if (fxt_now_ms() > deadline) fail_msg("attempt record not durable");
            fxt_nap_ms(10);
        }
    }
}

/* A consumer opened beside one that then departs without acking (closed, its deliveries counted
 * twice) inherits that backlog: every message once, with its delivery count. */
static void chanq_consumer_adopts_departed_backlog(void **state)
{
    (void)state;
    fx_mq_client *mq = client_new("/t_chanq_adopt");
    fx_chanq_keeper *ka = NULL, *kb = NULL;
    CHECK(fx_chanq_keeper_new(mq, G.ex, NULL, NULL, &ka));
    CHECK(fx_chanq_keeper_new(mq, G.ex, NULL, NULL, &kb));
    fe f1 = {0}, f2 = {0};
    fx_chanq_cons *c1 = cons_open(ka, "c1", &f1);
    int64_t part1 = -1;
    fx_chanq_cons_ids(c1, NULL, &part1, NULL);
    fx_mpmc_producer *p = prod_open(mq);
    put_n(p, 5);
    fx_mq_msg_id ids[16];
    uint64_t counts[16];
    get_n(c1, 5, ids, counts);
    for (size_t i = 0; i < 5; i++) assert_int_equal(counts[i], 0);
    count_durable(c1, ids, 5, 2); /* two attempts each, none acked */

    fx_chanq_cons *c2 = cons_open(kb, "c2", &f2); /* beside c1: a part of its own */
    int64_t part2 = -1;
    fx_chanq_cons_ids(c2, NULL, &part2, NULL);
    assert_true(part2 != part1);
    f1.held = 5; /* c1's front-end still holds them: they are released with it */
    fx_chanq_cons_close(c1); /* departs without an ack */

    fx_mq_msg_id ids2[16];
    uint64_t counts2[16];
    get_n(c2, 5, ids2, counts2);
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(ids2[i].chan, part1); /* the departed consumer's part */
        assert_int_equal(counts2[i], 2);       /* delivery counts intact */
    }
    assert_true(fx_chanq_cons_inherited(c2) >= 1);
    get_none(c2, 500);
    fx_chanq_cons_close(c2);
    fx_mpmc_producer_free(p);
    fx_chanq_keeper_free(kb);
    fx_chanq_keeper_free(ka);
    fx_mq_client_free(mq);
}

/* The lease of consumer member `member` of MPMC `mpmc` under root. */
static int64_t member_lease(const char *root, int64_t mpmc, int64_t member)
{
    fx_mq_keys keys;
    CHECK(fx_mq_keys_init(&keys, root));
    fx_mq_key role;
    CHECK(fx_mq_key_mpmc_role(&keys, FX_MQ_ROLE_CONSUMER, mpmc, member, &role));
    fx_kv kv = {0};
    CHECK(fx_etcd_get(G.raw, FX_SLICE_STR(role.s), &kv, OP_MS));
    int64_t lease = kv.lease;
    fx_kv_free(&kv);
    return lease;
}

/* The same departure by a lost member lease (revoked in etcd: what an expiry does) instead of a
 * close: the consumer, still polled by its front-end, tells it to forget every delivery it holds
 * and opens a new part; the consumer beside it inherits the backlog with its delivery counts. */
static void chanq_consumer_adopts_lost_lease_backlog(void **state)
{
    (void)state;
    const char *root = "/t_chanq_lost";
    fx_mq_client *mq = client_new(root);
    fx_chanq_keeper *ka = NULL, *kb = NULL;
    CHECK(fx_chanq_keeper_new(mq, G.ex, NULL, NULL, &ka));
    CHECK(fx_chanq_keeper_new(mq, G.ex, NULL, NULL, &kb));
    fe f1 = {0}, f2 = {0};
    fx_chanq_cons *c1 = cons_open(ka, "c1", &f1);
    int64_t mpmc = -1, part1 = -1, member1 = -1;
    fx_chanq_cons_ids(c1, &mpmc, &part1, &member1);
    fx_mpmc_producer *p = prod_open(mq);
    put_n(p, 5);
    fx_mq_msg_id ids[16];
    uint64_t counts[16];
    get_n(c1, 5, ids, counts);
    count_durable(c1, ids, 5, 2); /* two attempts each, none acked */

    fx_chanq_cons *c2 = cons_open(kb, "c2", &f2);
    int64_t part2 = -1;
    fx_chanq_cons_ids(c2, NULL, &part2, NULL);
    assert_true(part2 != part1);
    f1.held = 5;
    CHECK(fx_etcd_lease_revoke(G.raw, member_lease(root, mpmc, member1), OP_MS));

    /* c1's front-end goes on polling: it is told to forget what it holds, once */
    int64_t deadline = fxt_now_ms() + WAIT_MS;
    while (f1.released_all == 0) {
        if (fxt_now_ms() > deadline) fail_msg("c1 was not told that its consumer was lost");
        if (fx_chanq_cons_poll(c1) < 0) {
            fx_mq_delivery dv[4];
            uint64_t cn[4];
            size_t n = 0;
            fx_chanq_cons_get(c1, dv, cn, 4, &n);
            if (n) fail_msg("c1 delivered %zu message(s) after its lease was revoked", n);
        }
        fxt_nap_ms(20);
    }
    f1.held = 0;
    assert_int_equal(f1.released_all, 1);

    fx_mq_msg_id ids2[16];
    uint64_t counts2[16];
    get_n(c2, 5, ids2, counts2);
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(ids2[i].chan, part1); /* the lost consumer's part */
        assert_int_equal(counts2[i], 2);       /* delivery counts intact */
    }
    get_none(c2, 500);
    assert_int_equal(f1.released_all, 1);
    fx_chanq_cons_close(c1);
    fx_chanq_cons_close(c2);
    fx_mpmc_producer_free(p);
    fx_chanq_keeper_free(kb);
    fx_chanq_keeper_free(ka);
    fx_mq_client_free(mq);
}

/* Acks commit: the next consumer gets exactly what was not acked; the own part's pending (from
 * the keeper's view) counts what is stored. */
static void chanq_consumer_ack_pending(void **state)
{
    (void)state;
    fx_mq_client *mq = client_new("/t_chanq_ack");
    fx_chanq_keeper *k = NULL;
    CHECK(fx_chanq_keeper_new(mq, G.ex, NULL, NULL, &k));
    fe f = {0};
    fx_chanq_cons *c = cons_open(k, "c", &f);
    fx_mpmc_producer *p = prod_open(mq);
    put_n(p, 4);
    int64_t deadline = fxt_now_ms() + WAIT_MS;
    for (;;) { /* the keeper's view names the backlog of our part */
        fx_chanq_keeper_kick(k, "orders");
        fx_chanq_cons_round(c);
        if (fx_chanq_cons_pending(c) == 4) break;
        if (fxt_now_ms() > deadline)
            fail_msg("pending %" PRId64 ", want 4", fx_chanq_cons_pending(c));
        fxt_nap_ms(50);
    }
    fx_mq_msg_id ids[16];
    uint64_t counts[16];
    get_n(c, 4, ids, counts);
    fx_mq_msg_id acks[2] = {ids[0], ids[1]}; /* a prefix: commits move over it */
    assert_true(fx_chanq_cons_ack(c, acks, 2));
    fx_chanq_cons_close(c); /* commits the acks (bounded) */
    fx_chanq_keeper_free(k);  /* the close has run */

    CHECK(fx_chanq_keeper_new(mq, G.ex, NULL, NULL, &k));
    fe g = {0};
    fx_chanq_cons *c2 = cons_open(k, "c2", &g);
    fx_mq_msg_id got[16];
    get_n(c2, 2, got, counts);
    bool saw2 = false, saw3 = false;
    for (size_t i = 0; i < 2; i++) {
        if (got[i].pidx == ids[2].pidx && got[i].msg == ids[2].msg) saw2 = true;
        if (got[i].pidx == ids[3].pidx && got[i].msg == ids[3].msg) saw3 = true;
    }
    assert_true(saw2 && saw3);
    get_none(c2, 500);
    fx_chanq_cons_close(c2);
    fx_mpmc_producer_free(p);
    fx_chanq_keeper_free(k);
    fx_mq_client_free(mq);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chanq_consumer_adopts_departed_backlog),
        cmocka_unit_test(chanq_consumer_adopts_lost_lease_backlog),
        cmocka_unit_test(chanq_consumer_ack_pending),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
