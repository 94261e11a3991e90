/* test_admin.c -- the admin view of channels (plugin/admin.c) against a real etcd. Channel TTL
 * 3 s, client min_ttl_s 2. Each test uses its own key root.
 *
 * admin_info_backlog_claim_members: a consumer (claims and creates the sub-MPSC), a producer
 *   puts N = 10, the consumer gets and acks M = 4 and flushes: info shows mpmc_id, backlog N - M
 *   (channel, sub-MPSC and producer level, and fx_admin_channel_backlog), the sub-MPSC ready
 *   with the consumer as owner, the producer's offsets (produce - consume + 1 == N - M),
 *   capacity/ttl from the MPMC meta, members {producers:[p], consumers:[c]}. After the consumer
 *   closes: ready false, owner null, consumers [], backlog unchanged.
 * admin_unready_sub_mpsc: a producer alone creates an unready sub-MPSC: ready false, owner null.
 * admin_list: configured channels in config order; a channel without MPMC has "mpmc_id":null
 *   and backlog 0; with no config every mapped channel of the root is listed.
 * admin_unknown_channel: a name not configured (or, without config, not mapped) gets exactly
 *   {"error":{"code":404,"description":"channel not found"}}; fx_admin_channel_backlog of an
 *   unmapped name is FX_ENOTFOUND.
 * admin_etcd_down: etcd unreachable: info and list answer the error shape with code 503.
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

#include <cjson/cJSON.h>

#include "admin.h"
#include "config.h"
#include "etcd.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"

#define OP_MS 3000
#define TTL 3
#define CAPACITY 1000

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

/* ---- helpers ---------------------------------------------------------------------------------- */

static fx_mq_client *client_at(const char *const *eps, const char *root)
{
    fx_mq_client_opts o = {.etcd = {.endpoints = eps, .n_endpoints = 1}, .root = root,
                           .long_lease_ttl_s = 6, .min_ttl_s = 2, .op_timeout_ms = OP_MS,
                           .close_timeout_ms = 1000};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    return c;
}

static fx_mq_client *client_new(const char *root) { return client_at(G.eps, root); }

static const fx_mq_chan_cfg CFG = {.capacity = CAPACITY, .ttl_s = TTL, .weight = 1};

/* A config with the given channel names (configured, not DLQ), capacity/ttl as above. */
typedef struct test_cfg {
    char names[4][32];
    fx_chan_config ch[4];
    fx_config cfg;
} test_cfg;

static void cfg_init(test_cfg *t, const char *const *names, size_t n)
{
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < n && i < 4; i++) {
        snprintf(t->names[i], sizeof t->names[i], "%s", names[i]);
        t->ch[i].name = t->names[i];
        t->ch[i].s.capacity = 55555; /* differs from the MPMC meta: meta wins when present */
        t->ch[i].s.ttl_seconds = 77;
    }
    t->cfg.channels = t->ch;
    t->cfg.n_channels = n;
}

static cJSON *parse_take(char *s)
{
    assert_non_null(s);
    cJSON *j = cJSON_Parse(s);
    if (!j) fail_msg("not JSON: %s", s);
    free(s);
    return j;
}

static const cJSON *get(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) {
        char *p = cJSON_PrintUnformatted(o);
        fail_msg("field '%s' missing in %s", k, p ? p : "?");
    }
    return v;
}

static int64_t num(const cJSON *o, const char *k)
{
    const cJSON *v = get(o, k);
    if (!cJSON_IsNumber(v)) fail_msg("field '%s' is not a number", k);
    return (int64_t)v->valuedouble;
}

static void put_n(fx_mpmc_producer *p, int n)
{
    for (int i = 0; i < n; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "msg-%d", i);
        fx_slice v = FX_SLICE_STR(buf);
        size_t np = 0;
        CHECK(fx_mpmc_put(p, &v, 1, 2000, &np, NULL));
        assert_int_equal(np, 1);
    }
}

/* Get and ack exactly `want` messages (FIFO), then flush the commits. */
static void consume_ack(fx_mpmc_consumer *c, size_t want)
{
    size_t got = 0;
    int64_t deadline = fxt_now_ms() + 10000;
    while (got < want && fxt_now_ms() < deadline) {
        fx_mq_delivery d[16];
        size_t n = 0, max = want - got < 16 ? want - got : 16;
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
    CHECK(fx_mpmc_flush(c, 5000));
}

static void assert_ids(const cJSON *arr, const int64_t *want, size_t n)
{
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), (int)n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal((int64_t)cJSON_GetArrayItem(arr, (int)i)->valuedouble, want[i]);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void admin_info_backlog_claim_members(void **state)
{
    (void)state;
    const int N = 10, M = 4;
    fx_mq_client *c = client_new("/t_admin_info");
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "orders", &CFG, &mpmc));
    fx_mpmc_consumer *cons = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cons));
    fx_mpmc_producer *prod = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 1, &prod));
    put_n(prod, N);
    consume_ack(cons, (size_t)M);

    const char *const names[] = {"orders"};
    test_cfg t;
    cfg_init(&t, names, 1);

    char *raw = fx_admin_channel_info_json(c, &t.cfg, "orders");
    assert_non_null(raw);
    char want_id[64];
    snprintf(want_id, sizeof want_id, "\"mpmc_id\":%" PRId64 ",", mpmc);
    if (!strstr(raw, want_id)) fail_msg("%s not in %s", want_id, raw);
    cJSON *j = parse_take(raw);
    assert_string_equal(get(j, "name")->valuestring, "orders");
    assert_int_equal(num(j, "mpmc_id"), mpmc);
    assert_int_equal(num(j, "backlog"), N - M);
    assert_int_equal(num(j, "capacity"), CAPACITY);
    assert_int_equal(num(j, "ttl_seconds"), TTL);
    const cJSON *subs = get(j, "sub_mpscs");
    assert_int_equal(cJSON_GetArraySize(subs), 1);
    const cJSON *s0 = cJSON_GetArrayItem(subs, 0);
    assert_int_equal(num(s0, "chan_id"), fx_mpmc_consumer_chan(cons));
    assert_true(cJSON_IsTrue(get(s0, "ready")));
    assert_int_equal(num(s0, "owner_member"), fx_mpmc_consumer_member(cons));
    assert_int_equal(num(s0, "backlog"), N - M);
    const cJSON *prods = get(s0, "producers");
    assert_int_equal(cJSON_GetArraySize(prods), 1);
    const cJSON *p0 = cJSON_GetArrayItem(prods, 0);
    assert_int_equal(num(p0, "pidx"), fx_mpmc_producer_member(prod));
    int64_t po = num(p0, "produce_offset"), co = num(p0, "consume_offset");
    assert_int_equal(po - co + 1, N - M);
    const cJSON *mem = get(j, "members");
    int64_t pm = fx_mpmc_producer_member(prod), cm = fx_mpmc_consumer_member(cons);
    assert_ids(get(mem, "producers"), &pm, 1);
    assert_ids(get(mem, "consumers"), &cm, 1);
    cJSON_Delete(j);

    int64_t bl = -1;
    CHECK(fx_admin_channel_backlog(c, "orders", &bl));
    assert_int_equal(bl, N - M);

    /* The consumer leaves: its claim and role key go, the backlog stays. */
    CHECK(fx_mpmc_consumer_close(cons));
    j = parse_take(fx_admin_channel_info_json(c, &t.cfg, "orders"));
    assert_int_equal(num(j, "backlog"), N - M);
    s0 = cJSON_GetArrayItem(get(j, "sub_mpscs"), 0);
    assert_false(cJSON_IsTrue(get(s0, "ready")));
    assert_true(cJSON_IsNull(get(s0, "owner_member")));
    mem = get(j, "members");
    assert_ids(get(mem, "producers"), &pm, 1);
    assert_ids(get(mem, "consumers"), NULL, 0);
    cJSON_Delete(j);

    fx_mpmc_consumer_free(cons);
    fx_mpmc_producer_free(prod);
    fx_mq_client_free(c);
}

static void admin_unready_sub_mpsc(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/t_admin_unready");
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "solo", &CFG, &mpmc));
    fx_mpmc_producer *prod = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 1, &prod));
    put_n(prod, 3);
    cJSON *j = parse_take(fx_admin_channel_info_json(c, NULL, "solo"));
    assert_int_equal(num(j, "mpmc_id"), mpmc);
    assert_int_equal(num(j, "backlog"), 3);
    const cJSON *subs = get(j, "sub_mpscs");
    assert_int_equal(cJSON_GetArraySize(subs), 1);
    const cJSON *s0 = cJSON_GetArrayItem(subs, 0);
    assert_false(cJSON_IsTrue(get(s0, "ready")));
    assert_true(cJSON_IsNull(get(s0, "owner_member")));
    assert_int_equal(num(s0, "backlog"), 3);
    const cJSON *p0 = cJSON_GetArrayItem(get(s0, "producers"), 0);
    assert_non_null(p0);
    assert_int_equal(num(p0, "backlog"), 3);
    int64_t pm = fx_mpmc_producer_member(prod);
    assert_ids(get(get(j, "members"), "producers"), &pm, 1);
    assert_ids(get(get(j, "members"), "consumers"), NULL, 0);
    cJSON_Delete(j);
    fx_mpmc_producer_free(prod);
    fx_mq_client_free(c);
}

static void admin_list(void **state)
{
    (void)state;
    fx_mq_client *c = client_new("/t_admin_list");
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "alpha", &CFG, &mpmc));
    fx_mpmc_producer *prod = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 1, &prod));
    put_n(prod, 5);

    const char *const names[] = {"zeta", "alpha"};
    test_cfg t;
    cfg_init(&t, names, 2);
    char *raw = fx_admin_channel_list_json(c, &t.cfg);
    assert_non_null(raw);
    if (!strstr(raw, "{\"name\":\"zeta\",\"mpmc_id\":null,\"backlog\":0}"))
        fail_msg("unmapped entry wrong: %s", raw);
    cJSON *j = parse_take(raw);
    const cJSON *chans = get(j, "channels");
    assert_int_equal(cJSON_GetArraySize(chans), 2);
    const cJSON *z = cJSON_GetArrayItem(chans, 0), *a = cJSON_GetArrayItem(chans, 1);
    assert_string_equal(get(z, "name")->valuestring, "zeta");
    assert_true(cJSON_IsNull(get(z, "mpmc_id")));
    assert_int_equal(num(z, "backlog"), 0);
    assert_string_equal(get(a, "name")->valuestring, "alpha");
    assert_int_equal(num(a, "mpmc_id"), mpmc);
    assert_int_equal(num(a, "backlog"), 5);
    cJSON_Delete(j);

    /* A configured channel without MPMC: info answers with null id and zero backlog. */
    j = parse_take(fx_admin_channel_info_json(c, &t.cfg, "zeta"));
    assert_true(cJSON_IsNull(get(j, "mpmc_id")));
    assert_int_equal(num(j, "backlog"), 0);
    assert_int_equal(num(j, "capacity"), 55555);
    assert_int_equal(num(j, "ttl_seconds"), 77);
    assert_int_equal(cJSON_GetArraySize(get(j, "sub_mpscs")), 0);
    cJSON_Delete(j);

    /* No config: every mapped channel of this root. */
    j = parse_take(fx_admin_channel_list_json(c, NULL));
    chans = get(j, "channels");
    assert_int_equal(cJSON_GetArraySize(chans), 1);
    a = cJSON_GetArrayItem(chans, 0);
    assert_string_equal(get(a, "name")->valuestring, "alpha");
    assert_int_equal(num(a, "backlog"), 5);
    cJSON_Delete(j);

    fx_mpmc_producer_free(prod);
    fx_mq_client_free(c);
}

static void admin_unknown_channel(void **state)
{
    (void)state;
    static const char want[] = "{\"error\":{\"code\":404,\"description\":\"channel not found\"}}";
    fx_mq_client *c = client_new("/t_admin_unknown");
    const char *const names[] = {"orders"};
    test_cfg t;
    cfg_init(&t, names, 1);
    char *s = fx_admin_channel_info_json(c, &t.cfg, "nope");
    assert_string_equal(s, want);
    free(s);
    s = fx_admin_channel_info_json(c, NULL, "nope");
    assert_string_equal(s, want);
    free(s);
    s = fx_admin_channel_info_json(c, &t.cfg, "");
    assert_string_equal(s, want);
    free(s);
    int64_t bl = -1;
    assert_int_equal(fx_admin_channel_backlog(c, "nope", &bl), FX_ENOTFOUND);
    assert_int_equal(bl, 0);
    fx_mq_client_free(c);
}

static void admin_etcd_down(void **state)
{
    (void)state;
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", fxt_dead_port());
    const char *eps[1] = {ep};
    fx_mq_client *c = client_at(eps, "/t_admin_down");
    const char *const names[] = {"orders"};
    test_cfg t;
    cfg_init(&t, names, 1);
    cJSON *j = parse_take(fx_admin_channel_info_json(c, &t.cfg, "orders"));
    const cJSON *err = get(j, "error");
    assert_int_equal(num(err, "code"), 503);
    assert_true(cJSON_IsString(get(err, "description")));
    cJSON_Delete(j);
    j = parse_take(fx_admin_channel_list_json(c, &t.cfg));
    assert_int_equal(num(get(j, "error"), "code"), 503);
    cJSON_Delete(j);
    int64_t bl = -1;
    fx_err e = fx_admin_channel_backlog(c, "orders", &bl);
    assert_true(e == FX_EUNAVAIL || e == FX_ETIMEDOUT);
    fx_mq_client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(admin_info_backlog_claim_members),
        cmocka_unit_test(admin_unready_sub_mpsc),
        cmocka_unit_test(admin_list),
        cmocka_unit_test(admin_unknown_channel),
        cmocka_unit_test(admin_etcd_down),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
