/* test_mpmc.c -- the MPMC layer (bridge/mpmc.c) against a real etcd. Channel TTL 3 s, client
 * min_ttl_s 2, long (id-allocator) lease TTL shortened. Each test uses its own key root, so the
 * keys it inspects are its own.
 *
 * mpmc_resolve_create_bind_idempotent: resolve creates one MPMC (one mpmc id consumed), the
 *   mapping is unleased, a second resolve returns the same id; two racing resolves agree.
 * mpmc_resolve_replaces_stale: the MPMC meta gone (metadata lease revoked): resolve maps the name
 *   to a new MPMC (CAS on the old value).
 * mpmc_producer_creates_first_only: producers create only the first sub-MPSC and never a ready
 *   key; a second producer uses it.
 * mpmc_rotation_lru: 3 consumers create 3 sub-MPSCs; a producer's batches go A,B,C,A,B,C.
 * mpmc_consumer_claims_unready_first: a consumer claims the producer-created unready sub-MPSC
 *   and receives what was put before it came.
 * mpmc_two_consumers_race: two consumers opened at once on a one-sub-MPSC MPMC end with two
 *   sub-MPSCs and two ready keys, each owned by one of them.
 * mpmc_not_enough_consumers: no unready sub-MPSC and active consumers <= sub-MPSCs: FX_EEXISTS.
 * mpmc_close_order_no_keys: close deletes membership, then ready, then role (watch order); no
 *   ready, role or membership key is left.
 * mpmc_member_lease_lost: member lease revoked: next call FX_ELEASE_LOST, then FX_ECLOSED
 *   (producer and consumer); no sub-MPSC is created.
 * mpmc_payload_lease_lost_fast: the payload lease revoked, a put at once: FX_ELEASE_LOST (found
 *   by the member, not only by its sub-producer), then FX_ECLOSED; the role key is gone.
 * mpmc_full_then_close: capacity 2: a put fails FX_EFULL at its deadline; close releases a put
 *   blocked on a full channel at once.
 * mpmc_attach_keeps_alive: the creator client leaves; an attach-only producer (another client)
 *   alone keeps meta, payload, id-allocator and the sub-MPSC's own long lease alive past 2 x TTL
 *   and the long TTL; a later member binds the sub-MPSC and gets the old message.
 * mpmc_puts_in_flight_distinct: 4 consumers (4 ready sub-MPSCs), one producer whose etcd calls
 *   go through a proxy that holds every txn: 4 threads putting at once have 4 put txns in
 *   flight together, each to its own sub-MPSC (a put reserves its sub-MPSC); fx_mpmc_put_hold
 *   keeps its sub-MPSC reserved until released (the next put goes elsewhere); ids are dense
 *   per sub-MPSC and every message is delivered once.
 * mpmc_reclaim_follows_consumers: 3 consumers, 3 sub-MPSCs; the one whose consumer
 *   consumed everything is reclaimed when it leaves (list and every key of it gone), the one
 *   left with a backlog is kept (fx_mpmc_reclaim keeps it too, and a ready one), a later
 *   consumer claims it and gets the backlog: every message put is received once.
 * mpmc_reclaim_racing_producer_loses_nothing: a producer puts without pause while
 *   consumers come and go (each close reclaims its sub-MPSC when it is not needed) and
 *   fx_mpmc_reclaim is called on every listed sub-MPSC in a loop; the producer's etcd calls go
 *   through a proxy that holds its first bind of each new sub-MPSC until that sub-MPSC's
 *   consumer has left and reclaimed it, so the race happens every round: reclaims > 0 and
 *   rerouted or refused puts > 0 are asserted; afterwards every message whose put succeeded is
 *   received, and the sub-MPSCs came back to what the consumers need.
 * mpmc_reclaim_vs_first_bind_no_loss: 50 rounds of a producer's first bind of a
 *   sub-MPSC held (proxy) while the owning consumer closes and reclaims it from another client;
 *   released, the put is refused or rerouted, never acknowledged into the unlisted sub-MPSC;
 *   every acknowledged message is delivered.
 * mpmc_reclaim_deletes_leftover_payloads: split payload plane: a payload left behind
 *   by a failed delete and the attempt record go when the sub-MPSC is reclaimed.
 * mq_attach_registers_data_leases: ttl 2 s, retention 4 s: metadata, payload, id-allocator and
 *   sub-MPSC global-long leases are granted with the retention, the member lease with the TTL;
 *   the attacher alone keeps them past 3 x TTL (and the retention); when it leaves too, the
 *   message is still there a member TTL later (retention outlives the members).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "keys.h"
#include "lease_mgr.h"
#include "meta.h"
#include "mq_int.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"
#include "tests/support/fxt_proxy.h"

#define OP_MS 3000
#define TTL 3

static struct {
    fxt_etcd etcd;
    fx_etcd *raw;
    const char *eps[1];
} G;

#define CHECK_ERR(want, call)                                                                    \
    do {                                                                                         \
        fx_err chk_e_ = (call);                                                                  \
        if (chk_e_ != (want))                                                                    \
            fail_msg("%s: got %s (%s), want %s", #call, fx_errname(chk_e_), fx_err_detail(),     \
                     fx_errname(want));                                                          \
    } while (0)

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

/* ---- helpers ---------------------------------------------------------------------------------- */

static fx_mq_client *client_new(const char *root, int64_t long_ttl)
{
    fx_mq_client_opts o = {.etcd = {.endpoints = G.eps, .n_endpoints = 1}, .root = root,
                           .long_lease_ttl_s = long_ttl, .min_ttl_s = 2, .op_timeout_ms = OP_MS,
                           .close_timeout_ms = 1000};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    return c;
}

static const fx_mq_chan_cfg CFG = {.capacity = 1000, .ttl_s = TTL, .weight = 1};

static bool raw_get(const char *key, fx_kv *out)
{
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(G.raw, FX_SLICE_STR(key), &kv, OP_MS);
    if (e != FX_OK && e != FX_ENOTFOUND) fail_msg("get %s: %s", key, fx_errname(e));
    if (out)
        *out = kv;
    else
        fx_kv_free(&kv);
    return e == FX_OK;
}

static int64_t raw_get_int(const char *key)
{
    fx_kv kv = {0};
    if (!raw_get(key, &kv)) return -1;
    int64_t v = strtoll((const char *)kv.value.data, NULL, 10);
    fx_kv_free(&kv);
    return v;
}

static int64_t raw_count(const char *prefix)
{
    uint8_t end[1024];
    fx_slice p = FX_SLICE_STR(prefix);
    size_t el = fx_prefix_end(p, end);
    fx_range_req r = {.key = p, .range_end = {end, el}, .count_only = true};
    fx_range_resp out = {0};
    fx_err e = fx_etcd_range(G.raw, &r, &out, OP_MS);
    if (e != FX_OK) fail_msg("range %s: %s", prefix, fx_errname(e));
    int64_t n = out.count;
    fx_range_resp_free(&out);
    return n;
}

static bool ids_in(const int64_t *ids, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static void keys_of(const char *root, fx_mq_keys *k) { CHECK(fx_mq_keys_init(k, root)); }

/* The mpsc_channels list (n = 0 when absent); ids into out[cap]. */
static size_t list_of(const fx_mq_keys *k, int64_t mpmc, int64_t *out, size_t cap)
{
    fx_mq_key key;
    CHECK(fx_mq_key_mpmc_mpsc_channels(k, mpmc, &key));
    fx_kv kv = {0};
    if (!raw_get(key.s, &kv)) return 0;
    int64_t *ids = NULL;
    size_t n = 0;
    CHECK(fx_mq_mpsc_list_decode(kv.value.data, kv.value.len, &ids, &n));
    fx_kv_free(&kv);
    for (size_t i = 0; i < n && i < cap; i++) out[i] = ids[i];
    free(ids);
    return n;
}

/* Value of the ready key of (mpmc, chan): the owner member id, or -1 when absent. */
static int64_t ready_owner(const fx_mq_keys *k, int64_t mpmc, int64_t chan)
{
    fx_mq_key key;
    CHECK(fx_mq_key_mpmc_ready(k, mpmc, chan, &key));
    return raw_get_int(key.s);
}

static int64_t count_ready(const fx_mq_keys *k, int64_t mpmc)
{
    fx_mq_key p;
    CHECK(fx_mq_prefix_mpmc_ready(k, mpmc, &p));
    return raw_count(p.s);
}

static int64_t count_role(const fx_mq_keys *k, fx_mq_role r, int64_t mpmc)
{
    fx_mq_key p;
    CHECK(fx_mq_prefix_mpmc_role(k, r, mpmc, &p));
    return raw_count(p.s);
}

static fx_mq_msg_id put_one(fx_mpmc_producer *p, const char *text)
{
    fx_slice v = FX_SLICE_STR(text);
    fx_mq_msg_id id = {-1, -1, -1};
    size_t n = 0;
    CHECK(fx_mpmc_put(p, &v, 1, 2000, &n, &id));
    assert_int_equal(n, 1);
    return id;
}

/* Get exactly `want` messages (acking them) within a deadline; returns how many were got. */
static size_t drain(fx_mpmc_consumer *c, size_t want, int timeout_ms)
{
    size_t got = 0;
    int64_t deadline = fxt_now_ms() + timeout_ms;
    while (got < want && fxt_now_ms() < deadline) {
        fx_mq_delivery d[16];
        size_t n = 0;
        fx_err e = fx_mpmc_get(c, d, 16, &n, 200);
        if (e == FX_ETIMEDOUT) continue;
        if (e != FX_OK) fail_msg("get: %s (%s)", fx_errname(e), fx_err_detail());
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(d[i].id.chan, fx_mpmc_consumer_chan(c));
            CHECK(fx_mpmc_ack(c, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
        got += n;
    }
    return got;
}

static int64_t lease_of_key(const char *key)
{
    fx_kv kv = {0};
    if (!raw_get(key, &kv)) fail_msg("key %s absent", key);
    int64_t l = kv.lease;
    fx_kv_free(&kv);
    return l;
}

/* ---- tests ------------------------------------------------------------------------------------ */

typedef struct resolve_arg {
    fx_mq_client *c;
    const char *name;
    pthread_barrier_t *bar;
    int64_t id;
    fx_err e;
} resolve_arg;

static void *resolve_thread(void *arg)
{
    resolve_arg *a = arg;
    pthread_barrier_wait(a->bar);
    a->e = fx_mpmc_resolve(a->c, a->name, &CFG, &a->id);
    return NULL;
}

static void mpmc_resolve_create_bind_idempotent(void **state)
{
    (void)state;
    const char *root = "/t_resolve";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    fx_mq_key ck, uk;
    CHECK(fx_mq_key_alloc_mpmc_ids(&k, &ck));
    int64_t before = raw_get_int(ck.s);

    int64_t id1 = -1, id2 = -1;
    CHECK(fx_mpmc_resolve(c, "orders", &CFG, &id1));
    assert_true(id1 >= 1);
    assert_int_equal(raw_get_int(ck.s), (before < 0 ? 0 : before) + 1); /* one id per creation */
    CHECK(fx_mq_key_unique(&k, "orders", &uk));
    assert_int_equal(raw_get_int(uk.s), id1);
    assert_int_equal(lease_of_key(uk.s), 0); /* the mapping is unleased */
    fx_mq_key mk;
    CHECK(fx_mq_key_mpmc_meta(&k, id1, &mk));
    fx_kv kv = {0};
    assert_true(raw_get(mk.s, &kv));
    fx_mq_mpmc_meta meta;
    CHECK(fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &meta));
    assert_int_equal(kv.lease, meta.metadata_lease_id);
    assert_int_equal(meta.ttl_seconds, TTL);
    assert_int_equal(meta.capacity, CFG.capacity);
    fx_kv_free(&kv);
    fx_mq_key nk;
    CHECK(fx_mq_key_mpmc_next_channel_id(&k, id1, &nk));
    assert_int_equal(raw_get_int(nk.s), 0);

    CHECK(fx_mpmc_resolve(c, "orders", NULL, &id2)); /* bind: cfg not needed */
    assert_int_equal(id2, id1);
    assert_int_equal(raw_get_int(ck.s), (before < 0 ? 0 : before) + 1);

    /* Two racing resolves of a new name agree. */
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    resolve_arg a[2] = {{c, "race", &bar, -1, FX_OK}, {c, "race", &bar, -1, FX_OK}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, resolve_thread, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    CHECK(a[0].e);
    CHECK(a[1].e);
    assert_int_equal(a[0].id, a[1].id);
    assert_int_not_equal(a[0].id, id1);

    CHECK_ERR(FX_EINVAL, fx_mpmc_resolve(c, "bad/name", &CFG, &id2));
    fx_mq_client_free(c);
}

static void mpmc_resolve_replaces_stale(void **state)
{
    (void)state;
    const char *root = "/t_stale";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t id1 = -1, id2 = -1;
    CHECK(fx_mpmc_resolve(c, "stale", &CFG, &id1));
    fx_mq_key mk, uk;
    CHECK(fx_mq_key_mpmc_meta(&k, id1, &mk));
    CHECK(fx_mq_key_unique(&k, "stale", &uk));
    CHECK(fx_etcd_lease_revoke(G.raw, lease_of_key(mk.s), OP_MS));
    assert_false(raw_get(mk.s, NULL));
    /* An open on the gone MPMC fails clearly. */
    fx_mpmc_producer *p = NULL;
    CHECK_ERR(FX_ENOTFOUND, fx_mpmc_producer_open(c, id1, 0, &p));
    CHECK(fx_mpmc_resolve(c, "stale", &CFG, &id2));
    assert_int_not_equal(id2, id1);
    assert_int_equal(raw_get_int(uk.s), id2);
    CHECK(fx_mpmc_producer_open(c, id2, 0, &p));
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

static void mpmc_producer_creates_first_only(void **state)
{
    (void)state;
    const char *root = "/t_first";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "first", &CFG, &mpmc));
    fx_mpmc_producer *p1 = NULL, *p2 = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p1));
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p2));
    assert_int_not_equal(fx_mpmc_producer_member(p1), fx_mpmc_producer_member(p2));
    assert_int_equal(count_role(&k, FX_MQ_ROLE_PRODUCER, mpmc), 2);
    int64_t list[8];
    assert_int_equal(list_of(&k, mpmc, list, 8), 0);
    fx_mq_msg_id a = put_one(p1, "a");
    assert_int_equal(list_of(&k, mpmc, list, 8), 1);
    assert_int_equal(a.chan, list[0]);
    assert_int_equal(a.pidx, fx_mpmc_producer_member(p1)); /* sub-producer idx = member id */
    fx_mq_msg_id b = put_one(p2, "b");
    assert_int_equal(b.chan, list[0]);
    for (int i = 0; i < 5; i++) put_one(p1, "x");
    assert_int_equal(list_of(&k, mpmc, list, 8), 1);
    assert_int_equal(count_ready(&k, mpmc), 0); /* producers never write ready keys */
    CHECK(fx_mpmc_producer_close(p1));
    CHECK(fx_mpmc_producer_close(p2));
    assert_int_equal(count_role(&k, FX_MQ_ROLE_PRODUCER, mpmc), 0);
    fx_mpmc_producer_free(p1);
    fx_mpmc_producer_free(p2);
    fx_mq_client_free(c);
}

static void mpmc_rotation_lru(void **state)
{
    (void)state;
    const char *root = "/t_lru";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "lru", &CFG, &mpmc));
    fx_mpmc_consumer *cs[3];
    for (int i = 0; i < 3; i++) CHECK(fx_mpmc_consumer_open(c, mpmc, &cs[i]));
    int64_t list[8];
    assert_int_equal(list_of(&k, mpmc, list, 8), 3);
    assert_int_equal(count_ready(&k, mpmc), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fx_mpmc_consumer_chan(cs[i]), list[i]);
        assert_int_equal(ready_owner(&k, mpmc, list[i]), fx_mpmc_consumer_member(cs[i]));
    }
    int64_t sorted[3] = {list[0], list[1], list[2]};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (sorted[j] < sorted[i]) {
                int64_t t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 3; i++) {
            fx_mq_msg_id id = put_one(p, "m");
            assert_int_equal(id.chan, sorted[i]);
        }
    /* A batch goes to one sub-MPSC. */
    fx_slice vs[4] = {FX_SLICE_STR("1"), FX_SLICE_STR("2"), FX_SLICE_STR("3"), FX_SLICE_STR("4")};
    fx_mq_msg_id ids[4];
    size_t n = 0;
    CHECK(fx_mpmc_put(p, vs, 4, 2000, &n, ids));
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(ids[i].chan, sorted[0]);
    for (int i = 0; i < 3; i++) {
        size_t want = fx_mpmc_consumer_chan(cs[i]) == sorted[0] ? 7 : 3;
        assert_int_equal(drain(cs[i], want, 5000), want);
    }
    CHECK(fx_mpmc_producer_close(p));
    fx_mpmc_producer_free(p);
    for (int i = 0; i < 3; i++) fx_mpmc_consumer_free(cs[i]);
    assert_int_equal(count_ready(&k, mpmc), 0);
    fx_mq_client_free(c);
}

static void mpmc_consumer_claims_unready_first(void **state)
{
    (void)state;
    const char *root = "/t_claim";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "claim", &CFG, &mpmc));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    for (int i = 0; i < 5; i++) put_one(p, "before");
    int64_t list[8];
    assert_int_equal(list_of(&k, mpmc, list, 8), 1);
    fx_mpmc_consumer *cs = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cs));
    assert_int_equal(fx_mpmc_consumer_chan(cs), list[0]);
    assert_int_equal(list_of(&k, mpmc, list, 8), 1); /* claimed, not created */
    assert_int_equal(ready_owner(&k, mpmc, list[0]), fx_mpmc_consumer_member(cs));
    assert_int_equal(drain(cs, 5, 5000), 5);
    /* The producer learns the ready key by watch and keeps routing there. */
    for (int i = 0; i < 3; i++) assert_int_equal(put_one(p, "after").chan, list[0]);
    assert_int_equal(drain(cs, 3, 5000), 3);
    CHECK(fx_mpmc_flush(cs, 3000));
    fx_mpmc_consumer_free(cs);
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

typedef struct open_arg {
    fx_mq_client *c;
    int64_t mpmc;
    pthread_barrier_t *bar;
    fx_mpmc_consumer *cs;
    fx_err e;
} open_arg;

static void *open_thread(void *arg)
{
    open_arg *a = arg;
    pthread_barrier_wait(a->bar);
    a->e = fx_mpmc_consumer_open(a->c, a->mpmc, &a->cs);
    return NULL;
}

static void mpmc_two_consumers_race(void **state)
{
    (void)state;
    const char *root = "/t_race";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    for (int round = 0; round < 2; round++) {
        char name[32];
        snprintf(name, sizeof name, "race%d", round);
        int64_t mpmc = -1;
        CHECK(fx_mpmc_resolve(c, name, &CFG, &mpmc));
        fx_mpmc_producer *p = NULL;
        CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
        put_one(p, "x"); /* one sub-MPSC, unready */
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 2);
        open_arg a[2] = {{c, mpmc, &bar, NULL, FX_OK}, {c, mpmc, &bar, NULL, FX_OK}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, open_thread, &a[i]);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&bar);
        CHECK(a[0].e);
        CHECK(a[1].e);
        int64_t list[8];
        assert_int_equal(list_of(&k, mpmc, list, 8), 2);
        assert_int_equal(count_ready(&k, mpmc), 2);
        int64_t c0 = fx_mpmc_consumer_chan(a[0].cs), c1 = fx_mpmc_consumer_chan(a[1].cs);
        assert_int_not_equal(c0, c1);
        assert_true(c0 == list[0] || c0 == list[1]);
        assert_true(c1 == list[0] || c1 == list[1]);
        assert_int_equal(ready_owner(&k, mpmc, c0), fx_mpmc_consumer_member(a[0].cs));
        assert_int_equal(ready_owner(&k, mpmc, c1), fx_mpmc_consumer_member(a[1].cs));
        for (int i = 0; i < 2; i++) fx_mpmc_consumer_free(a[i].cs);
        fx_mpmc_producer_free(p);
    }
    fx_mq_client_free(c);
}

static void mpmc_not_enough_consumers(void **state)
{
    (void)state;
    const char *root = "/t_enough";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "enough", &CFG, &mpmc));
    fx_mpmc_consumer *c1 = NULL, *c2 = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &c1));
    int64_t list[8];
    assert_int_equal(list_of(&k, mpmc, list, 8), 1);
    /* A second, ready sub-MPSC owned by somebody else (injected by hand): 2 sub-MPSCs, none
     * unready; with c2 there are 2 active consumers, not more. */
    int64_t ids[2] = {list[0], 999999};
    char *json = NULL;
    CHECK(fx_mq_mpsc_list_encode(ids, 2, &json));
    fx_mq_key lk, rk;
    CHECK(fx_mq_key_mpmc_mpsc_channels(&k, mpmc, &lk));
    CHECK(fx_mq_key_mpmc_ready(&k, mpmc, 999999, &rk));
    fx_put_req pr = {.key = fx_mq_key_slice(&lk), .value = FX_SLICE_STR(json),
                     .lease = lease_of_key(lk.s)};
    CHECK(fx_etcd_put(G.raw, &pr, NULL, OP_MS));
    free(json);
    fx_put_req rr = {.key = fx_mq_key_slice(&rk), .value = FX_SLICE_STR("424242")};
    CHECK(fx_etcd_put(G.raw, &rr, NULL, OP_MS));
    CHECK_ERR(FX_EEXISTS, fx_mpmc_consumer_open(c, mpmc, &c2));
    assert_null(c2);
    assert_int_equal(count_role(&k, FX_MQ_ROLE_CONSUMER, mpmc), 1); /* the failed one cleaned up */
    fx_del_req d = {.key = fx_mq_key_slice(&rk)};
    CHECK(fx_etcd_delete(G.raw, &d, NULL, OP_MS));
    fx_mpmc_consumer_free(c1);
    fx_mq_client_free(c);
}

/* Records DELETE events of a prefix in order. */
typedef struct del_log {
    pthread_mutex_t mu;
    char keys[64][256];
    int n;
} del_log;

static void del_log_cb(void *arg, const fx_watch_update *u)
{
    del_log *l = arg;
    if (u->kind != FX_WATCH_EVENTS) return;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < u->n_events && l->n < 64; i++)
        if (u->events[i].type == FX_EV_DELETE)
            snprintf(l->keys[l->n++], 256, "%.*s", (int)u->events[i].kv.key.len,
                     (const char *)u->events[i].kv.key.data);
    pthread_mutex_unlock(&l->mu);
}

static int del_index(del_log *l, const char *key)
{
    pthread_mutex_lock(&l->mu);
    int r = -1;
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->keys[i], key) == 0) {
            r = i;
            break;
        }
    pthread_mutex_unlock(&l->mu);
    return r;
}

typedef struct three_keys {
    del_log *l;
    const char *a, *b, *c;
} three_keys;

static bool all_deleted(void *arg)
{
    three_keys *t = arg;
    return del_index(t->l, t->a) >= 0 && del_index(t->l, t->b) >= 0 && del_index(t->l, t->c) >= 0;
}

static void mpmc_close_order_no_keys(void **state)
{
    (void)state;
    const char *root = "/t_order";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "order", &CFG, &mpmc));
    fx_mpmc_consumer *cs = NULL;
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cs));
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    int64_t chan = fx_mpmc_consumer_chan(cs);
    for (int i = 0; i < 3; i++) assert_int_equal(put_one(p, "m").chan, chan);
    assert_int_equal(drain(cs, 3, 5000), 3);
    CHECK(fx_mpmc_flush(cs, 3000));

    del_log l = {.n = 0};
    pthread_mutex_init(&l.mu, NULL);
    fx_slice rp = FX_SLICE_STR(root);
    uint8_t end[256];
    size_t el = fx_prefix_end(rp, end);
    fx_watch_opts wo = {.key = rp, .range_end = {end, el}, .fn = del_log_cb, .arg = &l};
    fx_watch *w = NULL;
    CHECK(fx_watch_start(G.raw, &wo, OP_MS, &w));

    fx_mq_key pre, ready, role;
    CHECK(fx_mq_prefix_consumer_members(&k, chan, &pre));
    fx_range_req rq = {.key = fx_mq_key_slice(&pre), .range_end = {end, 0}};
    uint8_t pend[FX_MQ_KEY_CAP];
    rq.range_end = (fx_slice){pend, fx_prefix_end(fx_mq_key_slice(&pre), pend)};
    fx_range_resp rr = {0};
    CHECK(fx_etcd_range(G.raw, &rq, &rr, OP_MS));
    assert_int_equal(rr.n_kvs, 1);
    char member_key[256];
    snprintf(member_key, sizeof member_key, "%.*s", (int)rr.kvs[0].key.len,
             (const char *)rr.kvs[0].key.data);
    fx_range_resp_free(&rr);
    CHECK(fx_mq_key_mpmc_ready(&k, mpmc, chan, &ready));
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, mpmc, fx_mpmc_consumer_member(cs), &role));
    assert_int_equal(lease_of_key(member_key), lease_of_key(ready.s)); /* one member lease */
    assert_int_equal(lease_of_key(role.s), lease_of_key(ready.s));

    CHECK(fx_mpmc_consumer_close(cs));
    CHECK(fx_mpmc_consumer_close(cs)); /* idempotent */
    CHECK(fx_mpmc_producer_close(p));
    three_keys t = {&l, member_key, ready.s, role.s};
    assert_true(fxt_wait_until(all_deleted, &t, 3000));
    int im = del_index(&l, member_key), ir = del_index(&l, ready.s), io = del_index(&l, role.s);
    assert_true(im < ir);
    assert_true(ir < io);
    fx_watch_stop(w);
    pthread_mutex_destroy(&l.mu);

    assert_int_equal(count_ready(&k, mpmc), 0);
    assert_int_equal(count_role(&k, FX_MQ_ROLE_CONSUMER, mpmc), 0);
    assert_int_equal(count_role(&k, FX_MQ_ROLE_PRODUCER, mpmc), 0);
    assert_int_equal(raw_count(pre.s), 0);
    CHECK(fx_mq_prefix_producer_members(&k, chan, &pre));
    assert_int_equal(raw_count(pre.s), 0);
    CHECK_ERR(FX_ECLOSED, fx_mpmc_put(p, NULL, 0, 0, NULL, NULL));
    size_t n = 0;
    fx_mq_delivery d;
    CHECK_ERR(FX_ECLOSED, fx_mpmc_get(cs, &d, 1, &n, 0));
    fx_mpmc_consumer_free(cs);
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

typedef struct expiry_wait {
    fx_mq_client *c;
    uint64_t before;
} expiry_wait;

static bool expiry_seen(void *arg)
{
    expiry_wait *w = arg;
    fx_lease_mgr_stats st;
    fx_lease_mgr_get_stats(fx_mq_client_leases(w->c), &st);
    return st.expired > w->before;
}

static void mpmc_member_lease_lost(void **state)
{
    (void)state;
    const char *root = "/t_lost";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "lost", &CFG, &mpmc));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    put_one(p, "a");
    int64_t list[8];
    assert_int_equal(list_of(&k, mpmc, list, 8), 1);
    fx_mpmc_consumer *cs = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cs));

    /* Producer. */
    fx_mq_key role;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_PRODUCER, mpmc, fx_mpmc_producer_member(p), &role));
    expiry_wait ew = {c, 0};
    fx_lease_mgr_stats st;
    fx_lease_mgr_get_stats(fx_mq_client_leases(c), &st);
    ew.before = st.expired;
    CHECK(fx_etcd_lease_revoke(G.raw, lease_of_key(role.s), OP_MS));
    assert_true(fxt_wait_until(expiry_seen, &ew, 4000));
    fx_slice v = FX_SLICE_STR("b");
    size_t n = 9;
    CHECK_ERR(FX_ELEASE_LOST, fx_mpmc_put(p, &v, 1, 1000, &n, NULL));
    assert_int_equal(n, 0);
    CHECK_ERR(FX_ECLOSED, fx_mpmc_put(p, &v, 1, 1000, &n, NULL));
    assert_int_equal(list_of(&k, mpmc, list, 8), 1); /* nothing created */
    CHECK(fx_mpmc_producer_close(p));
    fx_mpmc_producer_free(p);

    /* Consumer. */
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, mpmc, fx_mpmc_consumer_member(cs), &role));
    fx_lease_mgr_get_stats(fx_mq_client_leases(c), &st);
    ew.before = st.expired;
    CHECK(fx_etcd_lease_revoke(G.raw, lease_of_key(role.s), OP_MS));
    assert_true(fxt_wait_until(expiry_seen, &ew, 4000));
    fx_mq_delivery d[4];
    CHECK_ERR(FX_ELEASE_LOST, fx_mpmc_get(cs, d, 4, &n, 500));
    CHECK_ERR(FX_ECLOSED, fx_mpmc_get(cs, d, 4, &n, 500));
    fx_mpmc_consumer_free(cs);
    assert_int_equal(count_role(&k, FX_MQ_ROLE_CONSUMER, mpmc), 0);
    assert_int_equal(count_ready(&k, mpmc), 0);
    fx_mq_client_free(c);
}

/* The payload lease revoked and a put right away (before any keepalive noticed): the
 * sub-producer's write fails, the member finds its own lease gone and closes. */
static void mpmc_payload_lease_lost_fast(void **state)
{
    (void)state;
    const char *root = "/t_plost";
    fx_mq_client *c = client_new(root, 6);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "plost", &CFG, &mpmc));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    put_one(p, "a");
    fx_mq_key mk;
    CHECK(fx_mq_key_mpmc_meta(&k, mpmc, &mk));
    fx_kv kv = {0};
    assert_true(raw_get(mk.s, &kv));
    fx_mq_mpmc_meta meta;
    CHECK(fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &meta));
    fx_kv_free(&kv);
    CHECK(fx_etcd_lease_revoke(G.raw, meta.payload_lease_id, OP_MS));
    fx_slice v = FX_SLICE_STR("b");
    size_t n = 9;
    CHECK_ERR(FX_ELEASE_LOST, fx_mpmc_put(p, &v, 1, 1000, &n, NULL));
    assert_int_equal(n, 0);
    CHECK_ERR(FX_ECLOSED, fx_mpmc_put(p, &v, 1, 1000, &n, NULL));
    assert_int_equal(count_role(&k, FX_MQ_ROLE_PRODUCER, mpmc), 0); /* closed itself */
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

typedef struct put_arg {
    fx_mpmc_producer *p;
    fx_err e;
    int64_t ms;
    atomic_bool started, done;
} put_arg;

static void *blocked_put(void *arg)
{
    put_arg *a = arg;
    fx_slice v = FX_SLICE_STR("blocked");
    int64_t t0 = fxt_now_ms();
    atomic_store(&a->started, true);
    a->e = fx_mpmc_put(a->p, &v, 1, 20000, NULL, NULL);
    a->ms = fxt_now_ms() - t0;
    atomic_store(&a->done, true);
    return NULL;
}

static bool put_started(void *arg) { return atomic_load(&((put_arg *)arg)->started); }

static void mpmc_full_then_close(void **state)
{
    (void)state;
    const char *root = "/t_full";
    fx_mq_client *c = client_new(root, 6);
    int64_t mpmc = -1;
    fx_mq_chan_cfg cfg = {.capacity = 2, .ttl_s = TTL};
    CHECK(fx_mpmc_resolve(c, "full", &cfg, &mpmc));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    fx_slice vs[3] = {FX_SLICE_STR("1"), FX_SLICE_STR("2"), FX_SLICE_STR("3")};
    size_t n = 0;
    int64_t t0 = fxt_now_ms();
    CHECK_ERR(FX_EFULL, fx_mpmc_put(p, vs, 3, 300, &n, NULL)); /* partial batch */
    int64_t took = fxt_now_ms() - t0;
    assert_int_equal(n, 2);
    assert_true(took >= 250);
    assert_true(took < FXT_MS(3000));
    put_arg a = {p, FX_OK, 0, false, false};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, blocked_put, &a), 0);
    /* the put has begun (synchronisation: a flag, polled with a deadline) ... */
    bool started = fxt_wait_until(put_started, &a, 5000);
    /* ... and is blocked on the full channel: still not returned after an observation window
     * (a full put returns only on room, its 20 s timeout or close) */
    fxt_nap_ms(400);
    bool blocked = !atomic_load(&a.done);
    int64_t c0 = fxt_now_ms();
    fx_err ce = fx_mpmc_producer_close(p);
    pthread_join(th, NULL); /* joined before any check can leave this frame (a lives here) */
    int64_t close_ms = fxt_now_ms() - c0;
    assert_true(started);
    assert_true(blocked);
    CHECK(ce);
    assert_true(close_ms < FXT_MS(2000));
    assert_int_equal(a.e, FX_ECLOSED);
    assert_true(a.ms < FXT_MS(5000));
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

static void mpmc_attach_keeps_alive(void **state)
{
    (void)state;
    const char *root = "/t_alive";
    fx_mq_client *ca = client_new(root, 4), *cb = client_new(root, 4);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(ca, "alive", &CFG, &mpmc));
    fx_mpmc_producer *p = NULL, *pb = NULL;
    CHECK(fx_mpmc_producer_open(ca, mpmc, 0, &p));
    fx_mq_msg_id id = put_one(p, "kept");
    CHECK(fx_mpmc_producer_open(cb, mpmc, 0, &pb)); /* attach only: never puts */
    fx_mq_key mk, gk;
    CHECK(fx_mq_key_mpmc_meta(&k, mpmc, &mk));
    CHECK(fx_mq_key_chan_meta(&k, id.chan, &gk));
    fx_kv kv = {0};
    assert_true(raw_get(mk.s, &kv));
    fx_mq_mpmc_meta meta;
    CHECK(fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &meta));
    fx_kv_free(&kv);
    assert_true(raw_get(gk.s, &kv));
    fx_mq_chan_meta cm;
    CHECK(fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &cm));
    fx_kv_free(&kv);
    /* The creator leaves completely. */
    fx_mpmc_producer_free(p);
    fx_mq_client_free(ca);
    fxt_nap_ms(2 * TTL * 1000 + 1500); /* > 2 x TTL and > the long TTL (4 s) */
    assert_true(raw_get(mk.s, NULL));
    int64_t ttl = -1;
    CHECK(fx_etcd_lease_timetolive(G.raw, meta.id_allocator_cluster_lease_id, &ttl, NULL, OP_MS));
    assert_true(ttl > 0);
    CHECK(fx_etcd_lease_timetolive(G.raw, meta.payload_lease_id, &ttl, NULL, OP_MS));
    assert_true(ttl > 0);
    /* The sub-MPSC's own id-allocator lease too: a later member can still bind it. */
    CHECK(fx_etcd_lease_timetolive(G.raw, cm.global_long_lease_id, &ttl, NULL, OP_MS));
    assert_true(ttl > 0);
    fx_mq_client *cc = client_new(root, 4);
    int64_t again = -1;
    CHECK(fx_mpmc_resolve(cc, "alive", NULL, &again));
    assert_int_equal(again, mpmc);
    fx_mpmc_producer *pc = NULL;
    CHECK(fx_mpmc_producer_open(cc, mpmc, 0, &pc));
    assert_int_equal(put_one(pc, "later").chan, id.chan);
    fx_mpmc_consumer *cs = NULL;
    CHECK(fx_mpmc_consumer_open(cc, mpmc, &cs));
    assert_int_equal(drain(cs, 2, 5000), 2);
    fx_mpmc_consumer_free(cs);
    fx_mpmc_producer_free(pc);
    fx_mpmc_producer_free(pb);
    fx_mq_client_free(cc);
    fx_mq_client_free(cb);
}

/* The attacher alone keeps every data lease alive, each registered with the channel's retention
 * (not the member TTL): the channel outlives its members by its retention. */
static int64_t granted_ttl(int64_t lease)
{
    int64_t ttl = -1, granted = -1;
    CHECK(fx_etcd_lease_timetolive(G.raw, lease, &ttl, &granted, OP_MS));
    return ttl > 0 ? granted : -1; /* -1: expired */
}

static void mq_attach_registers_data_leases(void **state)
{
    (void)state;
    const char *root = "/t_dataleases";
    const int64_t MTTL = 2, RET = 4;
    fx_mq_chan_cfg cfg = {.capacity = 100, .ttl_s = MTTL, .retention_s = RET, .weight = 1};
    fx_mq_client *ca = client_new(root, 1800), *cb = client_new(root, 1800);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(ca, "dl", &cfg, &mpmc));
    fx_mpmc_producer *p = NULL, *pb = NULL;
    CHECK(fx_mpmc_producer_open(ca, mpmc, 0, &p));
    fx_mq_msg_id id = put_one(p, "kept"); /* a sub-MPSC with backlog and no consumer */
    CHECK(fx_mpmc_producer_open(cb, mpmc, 0, &pb)); /* attach only: never puts */
    fx_mq_key mk, gk, rk;
    CHECK(fx_mq_key_mpmc_meta(&k, mpmc, &mk));
    CHECK(fx_mq_key_chan_meta(&k, id.chan, &gk));
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_PRODUCER, mpmc, fx_mpmc_producer_member(pb), &rk));
    fx_kv kv = {0};
    assert_true(raw_get(mk.s, &kv));
    fx_mq_mpmc_meta meta;
    CHECK(fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &meta));
    fx_kv_free(&kv);
    assert_int_equal(meta.retention_seconds, RET);
    assert_int_equal(meta.ttl_seconds, MTTL);
    assert_true(raw_get(gk.s, &kv));
    fx_mq_chan_meta cm;
    CHECK(fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &cm));
    fx_kv_free(&kv);
    assert_true(raw_get(rk.s, &kv));
    int64_t member_lease = kv.lease;
    fx_kv_free(&kv);
    /* Data leases carry the retention, the member lease the member TTL. */
    assert_int_equal(granted_ttl(meta.metadata_lease_id), RET);
    assert_int_equal(granted_ttl(meta.payload_lease_id), RET);
    assert_int_equal(granted_ttl(meta.id_allocator_cluster_lease_id), RET);
    assert_int_equal(granted_ttl(cm.global_long_lease_id), RET);
    assert_int_equal(granted_ttl(member_lease), MTTL);
    /* The creator leaves completely; the attacher alone keeps everything past 3 x the member TTL
     * and past the retention. */
    fx_mpmc_producer_free(p);
    fx_mq_client_free(ca);
    fxt_nap_ms((int)(3 * MTTL * 1000 + 500));
    assert_true(raw_get(mk.s, NULL));
    assert_true(raw_get(gk.s, NULL));
    assert_true(granted_ttl(meta.metadata_lease_id) > 0);
    assert_true(granted_ttl(meta.payload_lease_id) > 0);
    assert_true(granted_ttl(meta.id_allocator_cluster_lease_id) > 0);
    assert_true(granted_ttl(cm.global_long_lease_id) > 0);
    /* The attacher leaves too: the message outlives every member by the retention... */
    fx_mpmc_producer_free(pb);
    /* its member lease expires (etcd: after MTTL; polled, not slept for) */
    int64_t exp_dl = fxt_now_ms() + FXT_MS((int64_t)(MTTL * 1000 + 5000));
    while (granted_ttl(member_lease) >= 0 && fxt_now_ms() < exp_dl) fxt_nap_ms(100);
    assert_true(granted_ttl(member_lease) < 0);
    assert_false(raw_get(rk.s, NULL));
    fx_mq_client *cc = client_new(root, 1800);
    int64_t again = -1;
    CHECK(fx_mpmc_resolve(cc, "dl", &cfg, &again));
    assert_int_equal(again, mpmc);
    fx_mpmc_consumer *cs = NULL;
    CHECK(fx_mpmc_consumer_open(cc, mpmc, &cs));
    assert_int_equal(drain(cs, 1, 5000), 1);
    fx_mpmc_consumer_free(cs);
    fx_mq_client_free(cc);
    fx_mq_client_free(cb);
}

typedef struct flight_arg {
    fx_mpmc_producer *p;
    pthread_barrier_t *bar;
    char text[16];
    fx_mq_msg_id id;
    fx_err e;
} flight_arg;

static void *flight_thread(void *arg)
{
    flight_arg *a = arg;
    pthread_barrier_wait(a->bar);
    fx_slice v = FX_SLICE_STR(a->text);
    size_t n = 0;
    a->e = fx_mpmc_put(a->p, &v, 1, 10000, &n, &a->id);
    return NULL;
}

static void mpmc_puts_in_flight_distinct(void **state)
{
    (void)state;
    enum { K = 4 };
    const char *root = "/t_inflight";
    fx_mq_client *c = client_new(root, 6);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "inflight", &CFG, &mpmc));
    fx_mpmc_consumer *cs[K];
    for (int i = 0; i < K; i++) CHECK(fx_mpmc_consumer_open(c, mpmc, &cs[i]));
    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    fx_mq_client_opts o = {.etcd = {.endpoints = fxt_proxy_eps(px), .n_endpoints = 1},
                           .root = root, .long_lease_ttl_s = 6, .min_ttl_s = 2,
                           .op_timeout_ms = 15000, .close_timeout_ms = 1000};
    fx_mq_client *cx = NULL;
    CHECK(fx_mq_client_new(&o, &cx));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(cx, mpmc, 0, &p));
    int64_t dl = fxt_now_ms() + 5000; /* the producer learns the ready sub-MPSCs by watch */
    while (fx_mpmc_producer_ready(p) < K && fxt_now_ms() < dl) fxt_nap_ms(20);
    assert_int_equal(fx_mpmc_producer_ready(p), K);
    for (int i = 0; i < K; i++) (void)put_one(p, "warm"); /* binds every sub-producer */

    /* Hold every txn of the producer's client: K puts at once must all be in flight. */
    const char *nd[1] = {"request_put"};
    fxt_proxy_hold(px, nd, 1);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, K);
    flight_arg a[K];
    pthread_t t[K];
    for (int i = 0; i < K; i++) {
        a[i] = (flight_arg){.p = p, .bar = &bar, .e = FX_EPROTO};
        snprintf(a[i].text, sizeof a[i].text, "f%d", i);
        assert_int_equal(pthread_create(&t[i], NULL, flight_thread, &a[i]), 0);
    }
    dl = fxt_now_ms() + 5000;
    while (fxt_proxy_held(px) < K && fxt_now_ms() < dl) fxt_nap_ms(10);
    int held = fxt_proxy_held(px);
    fprintf(stderr, "  put txns in flight at once: %d (of %d puts)\n", held, K);
    fxt_proxy_hold(px, NULL, 0);
    for (int i = 0; i < K; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);
    if (held < K) fail_msg("only %d of %d concurrent puts were in flight at once", held, K);
    for (int i = 0; i < K; i++) {
        CHECK(a[i].e);
        for (int j = 0; j < i; j++)
            if (a[i].id.chan == a[j].id.chan)
                fail_msg("puts %d and %d in flight together went to one sub-MPSC %" PRId64, j, i,
                         a[i].id.chan);
    }

    /* put_hold: the held sub-MPSC is not used by the next put until released. */
    fx_slice v = FX_SLICE_STR("h");
    fx_mq_msg_id h1, h2, h3;
    int64_t held1 = -1, held2 = -1;
    size_t n = 0;
    CHECK(fx_mpmc_put_hold(p, &v, 1, 2000, &n, &h1, &held1));
    assert_int_equal(n, 1);
    assert_int_equal(held1, h1.chan);
    for (int i = 0; i < K - 1; i++) {
        CHECK(fx_mpmc_put_hold(p, &v, 1, 2000, &n, &h2, &held2));
        assert_int_not_equal(h2.chan, h1.chan);
        fx_mpmc_put_release(p, held2);
    }
    fx_mpmc_put_release(p, held1);
    (void)h3;

    /* ids dense per sub-MPSC, every message delivered once: 1 warm + 1 f + held ones */
    const size_t want = (size_t)(K + K + 1 + (K - 1));
    size_t total = 0;
    dl = fxt_now_ms() + 10000;
    while (total < want && fxt_now_ms() < dl)
        for (int i = 0; i < K; i++) {
            fx_mq_delivery d[16];
            size_t got = 0;
            fx_err e = fx_mpmc_get(cs[i], d, 16, &got, 0);
            if (e == FX_ETIMEDOUT) continue;
            CHECK(e);
            for (size_t j = 0; j < got; j++) {
                assert_int_equal(d[j].id.chan, fx_mpmc_consumer_chan(cs[i]));
                CHECK(fx_mpmc_ack(cs[i], &d[j].id, 1));
                fx_mq_delivery_free(&d[j]);
            }
            total += got;
        }
    assert_int_equal(total, want);
    for (int i = 0; i < K; i++) { /* and nothing more (every message once) */
        fx_mq_delivery d[1];
        size_t got = 0;
        assert_int_equal(fx_mpmc_get(cs[i], d, 1, &got, 0), FX_ETIMEDOUT);
    }
    CHECK(fx_mpmc_producer_close(p));
    fx_mpmc_producer_free(p);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    for (int i = 0; i < K; i++) fx_mpmc_consumer_free(cs[i]);
    fx_mq_client_free(c);
}

/* Get what is there (acking it) until nothing came for idle_ms, at most max_ms in all (a
 * producer may still be putting); seen[i] counts payload "m<i>". */
static size_t drain_mark_for(fx_mpmc_consumer *c, int *seen, size_t cap, int idle_ms, int max_ms)
{
    size_t got = 0;
    int64_t quiet = fxt_now_ms() + idle_ms, end = fxt_now_ms() + max_ms;
    while (fxt_now_ms() < quiet && fxt_now_ms() < end) {
        fx_mq_delivery d[16];
        size_t n = 0;
        fx_err e = fx_mpmc_get(c, d, 16, &n, 100);
        if (e == FX_ETIMEDOUT) continue;
        if (e != FX_OK) fail_msg("get: %s (%s)", fx_errname(e), fx_err_detail());
        for (size_t i = 0; i < n; i++) {
            char buf[32] = {0};
            size_t l = d[i].value.len < sizeof buf - 1 ? d[i].value.len : sizeof buf - 1;
            memcpy(buf, d[i].value.data, l);
            long idx = buf[0] == 'm' ? strtol(buf + 1, NULL, 10) : -1;
            if (idx < 0 || (size_t)idx >= cap) fail_msg("unexpected payload '%s'", buf);
            seen[idx]++;
            CHECK(fx_mpmc_ack(c, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
        if (n) quiet = fxt_now_ms() + idle_ms;
        got += n;
    }
    CHECK(fx_mpmc_flush(c, 3000));
    return got;
}

static size_t drain_mark(fx_mpmc_consumer *c, int *seen, size_t cap, int idle_ms)
{
    return drain_mark_for(c, seen, cap, idle_ms, 60000);
}

static int64_t chan_keys(const fx_mq_keys *k, int64_t chan)
{
    fx_mq_key pc, mk;
    CHECK(fx_mq_prefix_chan(k, chan, &pc));
    CHECK(fx_mq_key_chan_meta(k, chan, &mk));
    return raw_count(pc.s) + (raw_get(mk.s, NULL) ? 1 : 0);
}

static void mpmc_reclaim_follows_consumers(void **state)
{
    (void)state;
    const char *root = "/t_reclaim";
    fx_mq_client *c = client_new(root, 60);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "rc", &CFG, &mpmc));
    fx_mpmc_consumer *a = NULL, *b = NULL, *cc = NULL, *d = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &a));
    CHECK(fx_mpmc_consumer_open(c, mpmc, &b));
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cc));
    int64_t list[8];
    assert_int_equal(list_of(&k, mpmc, list, 8), 3);
    int64_t ca = fx_mpmc_consumer_chan(a), cb = fx_mpmc_consumer_chan(b);
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    char txt[16];
    int seen[16] = {0};
    int na = 0, nb = 0;
    for (int i = 0; i < 6; i++) { /* rotation over the three ready sub-MPSCs */
        snprintf(txt, sizeof txt, "m%d", i);
        fx_mq_msg_id id = put_one(p, txt);
        na += id.chan == ca;
        nb += id.chan == cb;
    }
    assert_true(na > 0 && nb > 0);
    assert_int_equal(drain_mark(a, seen, 16, 300), (size_t)na);
    fx_mpmc_consumer_free(a); /* its sub-MPSC is empty, 2 consumers remain: reclaimed */
    assert_int_equal(list_of(&k, mpmc, list, 8), 2);
    assert_false(ids_in(list, 2, ca));
    assert_int_equal(chan_keys(&k, ca), 0);
    fx_mpmc_consumer_free(b); /* leaves a backlog: kept */
    assert_int_equal(list_of(&k, mpmc, list, 8), 2);
    assert_true(ids_in(list, 2, cb));
    for (int i = 6; i < 10; i++) {
        snprintf(txt, sizeof txt, "m%d", i);
        put_one(p, txt);
    }
    CHECK(fx_mpmc_consumer_open(c, mpmc, &d)); /* claims the one with the backlog */
    assert_int_equal(fx_mpmc_consumer_chan(d), cb);
    drain_mark(d, seen, 16, 300);
    drain_mark(cc, seen, 16, 300);
    for (int i = 0; i < 10; i++) assert_int_equal(seen[i], 1);
    fx_mpmc_consumer_free(d);
    fx_mpmc_consumer_free(cc);
    /* no consumer left: one sub-MPSC stays (store-and-forward) */
    assert_int_equal(list_of(&k, mpmc, list, 8), 1);
    fx_mpmc_producer_free(p);
    fx_mq_client_free(c);
}

typedef struct race_prod {
    fx_mpmc_producer *p;
    atomic_bool stop;
    int ok, failed; /* puts that succeeded / failed (not stored) */
    int *acked;     /* acked[i]: put of "m<i>" succeeded */
    int cap;
} race_prod;

static void *race_prod_main(void *arg)
{
    race_prod *r = arg;
    for (int i = 0; i < r->cap && !atomic_load(&r->stop); i++) {
        char txt[16];
        snprintf(txt, sizeof txt, "m%d", i);
        fx_slice v = FX_SLICE_STR(txt);
        size_t n = 0;
        fx_err e = fx_mpmc_put(r->p, &v, 1, 2000, &n, NULL);
        if (e == FX_OK && n == 1) {
            r->acked[i] = 1;
            r->ok++;
        } else {
            r->failed++;
        }
    }
    return NULL;
}

/* Hold the membership txn of member's first bind of sub-MPSC chan (the one txn that puts both
 * its producer membership and its weight key; a put txn carries the membership key only). */
static void hold_bind(fxt_proxy *px, const fx_mq_keys *k, int64_t chan, int64_t member)
{
    fx_mq_key mk, wk;
    CHECK(fx_mq_key_producer_member(k, chan, member, &mk));
    CHECK(fx_mq_key_producer_weight(k, chan, member, &wk));
    char m64[FXT_PROXY_NEEDLE_MAX], w64[FXT_PROXY_NEEDLE_MAX];
    fxt_proxy_b64(mk.s, m64, sizeof m64);
    fxt_proxy_b64(wk.s, w64, sizeof w64);
    const char *nd[2] = {m64, w64};
    fxt_proxy_hold(px, nd, 2);
}

typedef struct bind_put {
    fx_mpmc_producer *p;
    char text[16];
    fx_err e;
    size_t n;
    fx_mq_msg_id id;
} bind_put;

static void *bind_put_main(void *arg)
{
    bind_put *b = arg;
    fx_slice v = FX_SLICE_STR(b->text);
    b->e = fx_mpmc_put(b->p, &v, 1, 15000, &b->n, &b->id);
    return NULL;
}

/* Wait (deadline) until chan is no longer listed; true when it went. */
static bool wait_unlisted(const fx_mq_keys *k, int64_t mpmc, int64_t chan, int ms)
{
    int64_t list[64], dl = fxt_now_ms() + ms;
    for (;;) {
        size_t n = list_of(k, mpmc, list, 64);
        if (!ids_in(list, n < 64 ? n : 64, chan)) return true;
        if (fxt_now_ms() >= dl) return false;
        fxt_nap_ms(10);
    }
}

/* Open consumers until one creates a sub-MPSC (every unready one with a backlog is then claimed
 * and drained), then drain `keep`: every stored message is marked in seen. */
static void drain_everything(fx_mq_client *c, const fx_mq_keys *k, int64_t mpmc,
                             fx_mpmc_consumer *keep, int *seen, size_t cap)
{
    int64_t list[64];
    for (int i = 0; i < 16; i++) {
        size_t n = list_of(k, mpmc, list, 64);
        fx_mpmc_consumer *d = NULL;
        fx_err e = fx_mpmc_consumer_open(c, mpmc, &d);
        if (e == FX_EEXISTS) break; /* nothing unready left */
        CHECK(e);
        bool created = !ids_in(list, n < 64 ? n : 64, fx_mpmc_consumer_chan(d));
        drain_mark(d, seen, cap, 300);
        fx_mpmc_consumer_free(d);
        if (created) break;
    }
    if (keep) drain_mark(keep, seen, cap, 300);
}

static void mpmc_reclaim_racing_producer_loses_nothing(void **state)
{
    (void)state;
    const char *root = "/t_reclaim_race";
    enum { CAP = 100000, ROUNDS = 6 };
    fx_mq_client *c = client_new(root, 60);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "rr", &CFG, &mpmc));
    int *seen = calloc(CAP, sizeof *seen), *acked = calloc(CAP, sizeof *acked);
    assert_non_null(seen);
    assert_non_null(acked);
    fx_mpmc_consumer *a = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &a));
    /* The producer's etcd calls go through a proxy that holds its first bind of each new
     * sub-MPSC while that sub-MPSC's consumer leaves (and reclaims it): the race happens in
     * every round, not only when the timing happens to line up. */
    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    fx_mq_client_opts o = {.etcd = {.endpoints = fxt_proxy_eps(px), .n_endpoints = 1},
                           .root = root, .long_lease_ttl_s = 60, .min_ttl_s = 2,
                           .op_timeout_ms = 15000, .close_timeout_ms = 1000};
    fx_mq_client *cx = NULL;
    CHECK(fx_mq_client_new(&o, &cx));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(cx, mpmc, 0, &p));
    int64_t member = fx_mpmc_producer_member(p);
    race_prod r = {.p = p, .acked = acked, .cap = CAP};
    atomic_init(&r.stop, false);
    pthread_t th;
    pthread_create(&th, NULL, race_prod_main, &r);
    int removed_total = 0, close_reclaims = 0, held_binds = 0;
    for (int round = 0; round < ROUNDS; round++) {
        fx_mpmc_consumer *b = NULL;
        CHECK(fx_mpmc_consumer_open(c, mpmc, &b));
        int64_t sb = fx_mpmc_consumer_chan(b);
        hold_bind(px, &k, sb, member); /* the producer binds it once its watch shows it ready */
        int64_t dl = fxt_now_ms() + 10000;
        while (fxt_proxy_held(px) < 1 && fxt_now_ms() < dl) fxt_nap_ms(2);
        held_binds += fxt_proxy_held(px) > 0;
        drain_mark_for(b, seen, CAP, 150, 500);
        fx_mpmc_consumer_free(b); /* reclaims its sub-MPSC at close when not needed */
        close_reclaims += wait_unlisted(&k, mpmc, sb, 2000);
        fxt_proxy_hold(px, NULL, 0); /* the held bind goes on: refused, the put rerouted */
        int64_t list[64];
        size_t n = list_of(&k, mpmc, list, 64);
        for (size_t i = 0; i < n && i < 64; i++) {
            bool removed = false;
            CHECK(fx_mpmc_reclaim(c, mpmc, list[i], &removed));
            removed_total += removed;
        }
        drain_mark_for(a, seen, CAP, 50, 300);
    }
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    uint64_t reroutes = fx__mpmc_producer_reroutes(p);
    /* Drain every sub-MPSC: consumers claim the unready ones (a backlog) until one creates. */
    drain_everything(c, &k, mpmc, a, seen, CAP);
    int lost = 0, dup = 0;
    for (int i = 0; i < CAP; i++) {
        if (acked[i] && !seen[i]) lost++;
        if (seen[i] > 1) dup++;
    }
    print_message("      %d puts ok, %d failed (refused, not stored), %" PRIu64 " rerouted; %d "
                  "binds held; sub-MPSCs reclaimed: %d by a leaving consumer, %d by "
                  "fx_mpmc_reclaim; lost %d, duplicated %d\n",
                  r.ok, r.failed, reroutes, held_binds, close_reclaims, removed_total, lost, dup);
    assert_true(r.ok > 0);
    assert_int_equal(held_binds, ROUNDS);
    assert_true(close_reclaims + removed_total > 0); /* the race in the name happened */
    assert_true(reroutes + (uint64_t)r.failed > 0);  /* and puts met a reclaimed sub-MPSC */
    assert_int_equal(lost, 0);
    fx_mpmc_consumer_free(a);
    int64_t list[64];
    assert_true(list_of(&k, mpmc, list, 64) <= 1);
    fx_mpmc_producer_free(p);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    free(seen);
    free(acked);
    fx_mq_client_free(c);
}

/* mpmc_reclaim_vs_first_bind_no_loss: a producer's FIRST bind of a sub-MPSC (its
 * membership txn) is held by the proxy while the sub-MPSC's owning consumer closes and reclaims
 * it from another client; then the bind is let through. The put must either land in a listed
 * sub-MPSC and be delivered, or fail / be rerouted; never be acked into the reclaimed one.
 * 50 rounds, each a fresh sub-MPSC; a second consumer's sub-MPSC (held by fx_mpmc_put_hold
 * while the race runs, so the racing put can only go to the new one) takes the rerouted puts. */
static void mpmc_reclaim_vs_first_bind_no_loss(void **state)
{
    (void)state;
    enum { ROUNDS = 50, CAP = 2 * ROUNDS };
    const char *root = "/t_bind_race";
    fx_mq_client *c = client_new(root, 60);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "br", &CFG, &mpmc));
    int seen[CAP] = {0}, acked[CAP] = {0};
    fx_mpmc_consumer *b = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &b));
    int64_t sb = fx_mpmc_consumer_chan(b);
    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    fx_mq_client_opts o = {.etcd = {.endpoints = fxt_proxy_eps(px), .n_endpoints = 1},
                           .root = root, .long_lease_ttl_s = 60, .min_ttl_s = 2,
                           .op_timeout_ms = 15000, .close_timeout_ms = 1000};
    fx_mq_client *cx = NULL;
    CHECK(fx_mq_client_new(&o, &cx));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(cx, mpmc, 0, &p));
    int64_t member = fx_mpmc_producer_member(p);
    int reclaimed = 0, ok = 0, refused = 0, unlisted = 0;
    for (int r = 0; r < ROUNDS; r++) {
        fx_mpmc_consumer *a = NULL;
        CHECK(fx_mpmc_consumer_open(c, mpmc, &a));
        int64_t sa = fx_mpmc_consumer_chan(a);
        assert_int_not_equal(sa, sb);
        int64_t dl = fxt_now_ms() + 10000; /* the producer learns the new one by watch */
        while (fx_mpmc_producer_ready(p) < 2 && fxt_now_ms() < dl) fxt_nap_ms(5);
        assert_int_equal(fx_mpmc_producer_ready(p), 2);
        /* Reserve B's sub-MPSC (the least recently used): the racing put can only bind A's. */
        char txt[16];
        snprintf(txt, sizeof txt, "m%d", 2 * r);
        fx_slice v = FX_SLICE_STR(txt);
        fx_mq_msg_id hid;
        int64_t held = -1;
        size_t n = 0;
        CHECK(fx_mpmc_put_hold(p, &v, 1, 5000, &n, &hid, &held));
        assert_int_equal(held, sb);
        acked[2 * r] = 1;
        hold_bind(px, &k, sa, member);
        bind_put bp = {.p = p, .e = FX_EPROTO};
        snprintf(bp.text, sizeof bp.text, "m%d", 2 * r + 1);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, bind_put_main, &bp), 0);
        dl = fxt_now_ms() + 10000;
        while (fxt_proxy_held(px) < 1 && fxt_now_ms() < dl) fxt_nap_ms(2);
        if (fxt_proxy_held(px) < 1) {
            fxt_proxy_hold(px, NULL, 0);
            fx_mpmc_put_release(p, held);
            pthread_join(th, NULL);
            fail_msg("round %d: the producer's bind of sub-MPSC %" PRId64 " was never seen", r,
                     sa);
        }
        /* The owner leaves: its close reclaims the empty, unready sub-MPSC (B remains). */
        fx_mpmc_consumer_free(a);
        if (!wait_unlisted(&k, mpmc, sa, 2000)) {
            bool rm = false;
            CHECK(fx_mpmc_reclaim(c, mpmc, sa, &rm));
        }
        bool gone = wait_unlisted(&k, mpmc, sa, 2000);
        reclaimed += gone;
        fxt_proxy_hold(px, NULL, 0); /* the held bind goes on */
        fx_mpmc_put_release(p, held);
        pthread_join(th, NULL);
        if (bp.e == FX_OK && bp.n == 1) {
            acked[2 * r + 1] = 1;
            ok++;
            int64_t list[64];
            size_t nl = list_of(&k, mpmc, list, 64);
            if (!ids_in(list, nl < 64 ? nl : 64, bp.id.chan)) {
                unlisted++;
                print_message("      round %d: put acked into sub-MPSC %" PRId64
                              ", which is not listed\n", r, bp.id.chan);
            }
        } else {
            refused++;
        }
        drain_mark_for(b, seen, CAP, 0, 0);
    }
    drain_everything(c, &k, mpmc, b, seen, CAP);
    int lost = 0, dup = 0;
    for (int i = 0; i < CAP; i++) {
        if (acked[i] && !seen[i]) lost++;
        if (seen[i] > 1) dup++;
    }
    print_message("      %d rounds: %d sub-MPSCs reclaimed under a held bind; racing puts: %d ok "
                  "(%d into an unlisted sub-MPSC), %d refused; lost %d, duplicated %d\n",
                  ROUNDS, reclaimed, ok, unlisted, refused, lost, dup);
    assert_int_equal(reclaimed, ROUNDS);
    assert_int_equal(unlisted, 0);
    assert_int_equal(lost, 0);
    fx_mpmc_producer_free(p);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    fx_mpmc_consumer_free(b);
    fx_mq_client_free(c);
}

/* mpmc_reclaim_deletes_leftover_payloads: on a split payload plane (payloads in their
 * own KV store, here a prefix of the same etcd) a payload whose delete failed after its offsets
 * were committed (a stray key below the consume offset) goes when its sub-MPSC is reclaimed,
 * and so does the sub-MPSC's attempt record. */
static void mpmc_reclaim_deletes_leftover_payloads(void **state)
{
    (void)state;
    const char *root = "/t_leftover";
    fx_mq_client_opts o = {.etcd = {.endpoints = G.eps, .n_endpoints = 1}, .root = root,
                           .long_lease_ttl_s = 60, .min_ttl_s = 2, .op_timeout_ms = OP_MS,
                           .close_timeout_ms = 1000, .kv_endpoints = G.eps, .n_kv_endpoints = 1};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "lo", &CFG, &mpmc));
    fx_mpmc_consumer *a = NULL, *b = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &a));
    CHECK(fx_mpmc_consumer_open(c, mpmc, &b));
    int64_t sa = fx_mpmc_consumer_chan(a);
    fx_mq_key rel, pre;
    CHECK(fx_mq_payload_key(mpmc, sa, 5, 42, &rel));
    CHECK(fx_mq_payload_prefix_mpsc(mpmc, sa, &pre));
    char stray[1024], prefix[1024], akey[256];
    snprintf(stray, sizeof stray, "%s/kv/%s", root, rel.s);
    snprintf(prefix, sizeof prefix, "%s/kv/%s", root, pre.s);
    snprintf(akey, sizeof akey, "%s/attempts/%" PRId64, root, sa);
    fx_put_req pr = {.key = FX_SLICE_STR(stray), .value = FX_SLICE_STR("left behind")};
    CHECK(fx_etcd_put(G.raw, &pr, NULL, OP_MS));
    fx_put_req ar = {.key = FX_SLICE_STR(akey), .value = FX_SLICE_STR("FXA1")};
    CHECK(fx_etcd_put(G.raw, &ar, NULL, OP_MS));
    assert_int_equal(raw_count(prefix), 1);
    fx_mpmc_consumer_free(a); /* empty, unready, b remains: reclaimed at close */
    assert_true(wait_unlisted(&k, mpmc, sa, 5000));
    int64_t dl = fxt_now_ms() + 5000, left = 0;
    while ((left = raw_count(prefix)) > 0 && fxt_now_ms() < dl) fxt_nap_ms(20);
    print_message("      sub-MPSC %" PRId64 " reclaimed: %" PRId64 " payload key(s) left, attempt "
                  "record %s\n", sa, left, raw_get(akey, NULL) ? "left" : "gone");
    assert_int_equal(left, 0);
    assert_false(raw_get(akey, NULL));
    fx_mpmc_consumer_free(b);
    fx_mq_client_free(c);
}

/* mpmc_many_consumers_open: FXT_MANY (default 96) consumers opened by 8 threads on one
 * MPMC, no producer: each creates its own sub-MPSC, all distinct, every one listed and ready; the
 * open rate is printed (claims/s; FXT_MANY=1000 measures the scale case). */
typedef struct many_arg {
    fx_mq_client *c;
    int64_t mpmc;
    fx_mpmc_consumer **cs;
    size_t from, to;
    fx_err e;
    char detail[256];
} many_arg;

static void *many_thread(void *arg)
{
    many_arg *a = arg;
    for (size_t i = a->from; i < a->to; i++) {
        fx_err e = fx_mpmc_consumer_open(a->c, a->mpmc, &a->cs[i]);
        if (e && !a->e) {
            a->e = e;
            snprintf(a->detail, sizeof a->detail, "%s", fx_err_detail());
        }
    }
    return NULL;
}

static void mpmc_many_consumers_open(void **state)
{
    (void)state;
    const char *root = "/t_many";
    const char *env = getenv("FXT_MANY");
    size_t n = env ? (size_t)strtoul(env, NULL, 10) : 96;
    enum { T = 8 };
    fx_mq_client *c = client_new(root, 60);
    fx_mq_keys k;
    keys_of(root, &k);
    int64_t mpmc = -1;
    fx_mq_chan_cfg cfg = CFG;
    cfg.ttl_s = 30; /* no lease may lapse while a slow open runs */
    CHECK(fx_mpmc_resolve(c, "many", &cfg, &mpmc));
    fx_mpmc_consumer **cs = calloc(n, sizeof *cs);
    assert_non_null(cs);
    many_arg a[T];
    pthread_t th[T];
    struct timespec t0, t1;
    fx_etcd_stats s0, s1;
    fx_etcd_get_stats(fx_mq_client_etcd(c), &s0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < T; i++) {
        a[i] = (many_arg){.c = c, .mpmc = mpmc, .cs = cs, .from = n * i / T, .to = n * (i + 1) / T};
        pthread_create(&th[i], NULL, many_thread, &a[i]);
    }
    for (size_t i = 0; i < T; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fx_etcd_get_stats(fx_mq_client_etcd(c), &s1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    print_message("      %zu consumers opened in %.2f s: %.1f claims/s, %.1f etcd requests each\n",
                  n, s, (double)n / s, (double)(s1.requests - s0.requests) / (double)n);
    for (size_t i = 0; i < T; i++)
        if (a[i].e) fail_msg("open: %s (%s)", fx_errname(a[i].e), a[i].detail);
    int64_t *list = calloc(n + 1, sizeof *list);
    assert_non_null(list);
    assert_int_equal(list_of(&k, mpmc, list, n + 1), n);
    assert_int_equal(count_ready(&k, mpmc), (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        int64_t ch = fx_mpmc_consumer_chan(cs[i]);
        assert_int_equal(ready_owner(&k, mpmc, ch), fx_mpmc_consumer_member(cs[i]));
        for (size_t j = 0; j < i; j++) assert_int_not_equal(fx_mpmc_consumer_chan(cs[j]), ch);
    }
    for (size_t i = 0; i < n; i++) fx_mpmc_consumer_free(cs[i]);
    free(list);
    free(cs);
    fx_mq_client_free(c);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* run only the tests matching argv[1] */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mpmc_resolve_create_bind_idempotent),
        cmocka_unit_test(mpmc_resolve_replaces_stale),
        cmocka_unit_test(mpmc_producer_creates_first_only),
        cmocka_unit_test(mpmc_rotation_lru),
        cmocka_unit_test(mpmc_consumer_claims_unready_first),
        cmocka_unit_test(mpmc_two_consumers_race),
        cmocka_unit_test(mpmc_not_enough_consumers),
        cmocka_unit_test(mpmc_close_order_no_keys),
        cmocka_unit_test(mpmc_member_lease_lost),
        cmocka_unit_test(mpmc_payload_lease_lost_fast),
        cmocka_unit_test(mpmc_full_then_close),
        cmocka_unit_test(mpmc_attach_keeps_alive),
        cmocka_unit_test(mq_attach_registers_data_leases),
        cmocka_unit_test(mpmc_puts_in_flight_distinct),
        cmocka_unit_test(mpmc_many_consumers_open),
        cmocka_unit_test(mpmc_reclaim_follows_consumers),
        cmocka_unit_test(mpmc_reclaim_racing_producer_loses_nothing),
        cmocka_unit_test(mpmc_reclaim_vs_first_bind_no_loss),
        cmocka_unit_test(mpmc_reclaim_deletes_leftover_payloads),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
