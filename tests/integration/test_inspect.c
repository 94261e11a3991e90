/* test_inspect.c -- the channel inspection API (bridge/inspect.h) against a real etcd: what the
 * admin view renders, read at the bridge layer as plain data.
 *
 * inspect_channel_states: a channel with 5 messages and no consumer: mapped, its MPMC id, the
 *   meta (capacity, ttl, retention), one unready sub-MPSC with the producer's offsets (produce 4,
 *   consume 0, backlog 5), the producer member listed, no consumer. After a consumer claims the
 *   sub-MPSC, gets 2 and acks them (flushed): ready, owned by that consumer's member id, one
 *   consumer, consume offset 2, backlog 3. Every read names the revision it was made at.
 * inspect_unmapped_invalid_and_names: a name without MPMC is FX_OK with mapped = false; a name
 *   that breaks the channel-name rules is FX_EINVAL; fx_mq_inspect_names lists the mapped names
 *   (and only those); freeing a zeroed info and an empty name list is safe.
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

#include "fluxon_mq.h"
#include "fx_log.h"
#include "inspect.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"

#define OP_MS 3000

static struct {
    fxt_etcd etcd;
    const char *eps[1];
} G;

static int group_setup(void **state)
{
    (void)state;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    if (fxt_etcd_start(&G.etcd) != 0) return -1;
    G.eps[0] = G.etcd.endpoint;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
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

/* Get exactly `want` messages (at most `want` per call) within 5 s and ack them. */
static void get_ack(fx_mpmc_consumer *c, size_t want)
{
    size_t got = 0;
    int64_t deadline = fxt_now_ms() + 5000;
    while (got < want && fxt_now_ms() < deadline) {
        fx_mq_delivery d[8];
        size_t n = 0;
        size_t max = want - got < 8 ? want - got : 8;
        fx_err e = fx_mpmc_get(c, d, max, &n, 200);
        if (e == FX_ETIMEDOUT) continue;
        if (e != FX_OK) fail_msg("get: %s (%s)", fx_errname(e), fx_err_detail());
        for (size_t i = 0; i < n; i++) {
            CHECK(fx_mpmc_ack(c, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
        got += n;
    }
    assert_int_equal(got, want);
}

static void inspect_channel_states(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/t_inspect");
    const fx_mq_chan_cfg cfg = {.capacity = 1000, .ttl_s = 3, .retention_s = 7, .weight = 1};
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "orders", &cfg, &mpmc));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    for (int i = 0; i < 5; i++) {
        fx_slice v = FX_SLICE_STR("m");
        size_t n = 0;
        CHECK(fx_mpmc_put(p, &v, 1, 2000, &n, NULL));
        assert_int_equal(n, 1);
    }

    fx_mq_channel_info in;
    CHECK(fx_mq_inspect_channel(c, "orders", &in));
    assert_true(in.mapped);
    assert_int_equal(in.mpmc_id, mpmc);
    assert_true(in.revision > 0);
    assert_true(in.has_meta);
    assert_int_equal(in.capacity, 1000);
    assert_int_equal(in.ttl_seconds, 3);
    assert_int_equal(in.retention_seconds, 7);
    assert_false(in.truncated);
    assert_int_equal(in.n_subs, 1);
    const fx_mq_sub_mpsc_info *s = &in.subs[0];
    int64_t chan = s->chan_id;
    assert_false(s->ready);
    assert_int_equal(s->owner_member, -1);
    assert_int_equal(s->consumers, 0);
    assert_int_equal(s->n_producers, 1);
    assert_int_equal(s->producers[0].produce_offset, 4);
    assert_int_equal(s->producers[0].consume_offset, 0);
    assert_int_equal(s->producers[0].backlog, 5);
    assert_int_equal(s->backlog, 5);
    assert_int_equal(in.backlog, 5);
    assert_int_equal(in.n_producers, 1);
    assert_int_equal(in.producers[0], fx_mpmc_producer_member(p));
    assert_int_equal(in.n_consumers, 0);
    int64_t rev1 = in.revision;
    fx_mq_channel_info_free(&in);
    assert_null(in.subs);

    fx_mpmc_consumer *cs = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cs));
    assert_int_equal(fx_mpmc_consumer_chan(cs), chan);
    get_ack(cs, 2);
    CHECK(fx_mpmc_flush(cs, 3000));

    CHECK(fx_mq_inspect_channel(c, "orders", &in));
    assert_true(in.revision > rev1);
    assert_int_equal(in.n_subs, 1);
    s = &in.subs[0];
    assert_int_equal(s->chan_id, chan);
    assert_true(s->ready);
    assert_int_equal(s->owner_member, fx_mpmc_consumer_member(cs));
    assert_int_equal(s->consumers, 1);
    assert_int_equal(s->n_producers, 1);
    assert_int_equal(s->producers[0].produce_offset, 4);
    assert_int_equal(s->producers[0].consume_offset, 2);
    assert_int_equal(s->producers[0].backlog, 3);
    assert_int_equal(in.backlog, 3);
    assert_int_equal(in.n_consumers, 1);
    assert_int_equal(in.consumers[0], fx_mpmc_consumer_member(cs));
    fx_mq_channel_info_free(&in);

    fx_mpmc_consumer_free(cs);
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

static void inspect_unmapped_invalid_and_names(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/t_inspect_names");
    fx_mq_channel_info in;
    memset(&in, 0, sizeof in);
    fx_mq_channel_info_free(&in);
    fx_mq_inspect_names_free(NULL, 0);

    char **names = NULL;
    size_t n = 99;
    CHECK(fx_mq_inspect_names(c, 100, &names, &n));
    assert_int_equal(n, 0);
    fx_mq_inspect_names_free(names, n);

    CHECK(fx_mq_inspect_channel(c, "nothing", &in));
    assert_false(in.mapped);
    assert_int_equal(in.n_subs, 0);
    assert_int_equal(in.backlog, 0);
    fx_mq_channel_info_free(&in);
    assert_int_equal(fx_mq_inspect_channel(c, "bad name", &in), FX_EINVAL);
    assert_int_equal(fx_mq_inspect_channel(c, "a/b", &in), FX_EINVAL);

    const fx_mq_chan_cfg cfg = {.capacity = 10, .ttl_s = 3, .weight = 1};
    int64_t m1 = -1, m2 = -1;
    CHECK(fx_mpmc_resolve(c, "beta", &cfg, &m1));
    CHECK(fx_mpmc_resolve(c, "alpha", &cfg, &m2));
    CHECK(fx_mq_inspect_names(c, 100, &names, &n));
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "alpha");
    assert_string_equal(names[1], "beta");
    fx_mq_inspect_names_free(names, n);
    CHECK(fx_mq_inspect_names(c, 1, &names, &n));
    assert_int_equal(n, 1);
    assert_string_equal(names[0], "alpha");
    fx_mq_inspect_names_free(names, n);

    CHECK(fx_mq_inspect_channel(c, "beta", &in));
    assert_true(in.mapped);
    assert_int_equal(in.mpmc_id, m1);
    assert_int_equal(in.retention_seconds, 3); /* retention 0: the ttl */
    fx_mq_channel_info_free(&in);
    fx_mq_client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(inspect_channel_states),
        cmocka_unit_test(inspect_unmapped_invalid_and_names),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
