/* test_mq_edges.c -- lease lifecycle edges of bridge/ against a real etcd, through the
 * public API (bridge/fluxon_mq.h); etcd state is inspected and injected with lease/etcd.h, key
 * names come from bridge/keys.h, faults come from a filtering proxy (tests/support/fxt_proxy.h).
 * Channel TTL 2 s, id-allocator (long) lease 3 s where a test waits for expiry.
 *
 * mq_client_close_races_open: 200 rounds; per round a fresh client, four threads open MPSC
 *   producers, an MPSC consumer, MPMC producers and an MPMC consumer while a fifth thread closes
 *   the client at a varying moment. Every open returns an endpoint (closed and freed afterwards)
 *   or FX_ECLOSED; nothing else. Run under ASan / TSan: no report, no leak.
 * mq_member_id_allocator_reclaimed: the MPMC member-id counter is bound to the channel's
 *   id-allocator cluster lease; after every member left and the leases expired, nothing of the
 *   channel is left under the root (only the global id counters and the name mapping).
 * mq_client_close_strong_error: an endpoint whose close fails locally (the MPSC consumer's final
 *   commit of acknowledged messages cannot be made): the client close reports it and keeps the
 *   backends; a retry once etcd answers again commits, succeeds and frees the backends.
 * mq_rollback_verified: a sub-MPSC created by an MPMC consumer whose bind fails is rolled back;
 *   when the proxy drops the rollback's delete, the read-back sees the keys and the open reports
 *   the rollback failure (and the meta left is bound to the sub-MPSC's own global-long lease, not
 *   to the channel's metadata lease); when the delete goes through, the keys are gone and the
 *   open reports the bind error.
 * mpsc_second_consumer_refused: a second consumer of a standalone MPSC is refused (FX_EEXISTS)
 *   while the first is bound, and accepted once it closed; membership records carry the client's
 *   external_client_id.
 * mpsc_global_lease_lost_closes_consumer: revoking the MPSC global lease closes its consumer:
 *   next get FX_ELEASE_LOST, then FX_ECLOSED.
 * mpmc_unconfirmed_member_lease_fences_get: the proxy drops only the keepalives of an
 *   MPMC consumer's member lease; within about its TTL the consumer is fenced (get FX_EUNAVAIL,
 *   fx_mpmc_consumer_fenced) while messages are stored; once etcd expired the lease and the
 *   keepalives pass, FX_ELEASE_LOST; a new consumer gets every message.
 * mq_attempts_write_fenced: consumer A records 2 attempts of a message; A's member
 *   lease is revoked (as after a SIGSTOP past ttl_seconds); a drain consumer on another client
 *   adopts the sub-MPSC, inherits 2 and records 3; A's stale writer then writes its own view: it
 *   is refused (FX_ELEASE_LOST) and the record still says 3 (no count rolled back); when the
 *   drain consumer leaves, the sub-MPSC is reclaimed with its record and the stale writer cannot
 *   re-create it.
 * mq_attempts_pruned: 5,000 producer ids churn through one sub-MPSC over 20 consumer
 *   lifetimes (moves), 250 each, every id of them published once and committed (the consume
 *   offsets a commit leaves are written for them); then a message is delivered twice and the
 *   sub-MPSC moves: the next consumer inherits 2 attempts (max_deliver still holds), and the record
 *   holds the live producers only (pruned with the offsets, far below the 4,096 bound).
 *
 * Usage: test_mq_edges [cmocka filter]. Waits poll with deadlines; the only timed pauses are the
 * closer's varying delay in the race test (fault timing, not synchronisation).
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

#include "attempts.h"
#include "etcd.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "keys.h"
#include "meta.h"
#include "lease_mgr.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"
#include "tests/support/fxt_proxy.h"

#define OP_MS 5000
#define TTL 2
#define LONG_TTL 3

static struct {
    fxt_etcd etcd;
    fx_etcd *raw;
    const char *eps[1];
    int64_t t_start;
} G;

static int64_t now_ms(void) { return fxt_now_ms(); }

/* ---- raw etcd helpers (main thread) ------------------------------------------------------------ */

static bool raw_get(const char *key, fx_kv *out)
{
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(G.raw, FX_SLICE_STR(key), &kv, OP_MS);
    if (e != FX_OK && e != FX_ENOTFOUND) fail_msg("get %s: %s (%s)", key, fx_errname(e), fx_err_detail());
    if (out)
        *out = kv;
    else
        fx_kv_free(&kv);
    return e == FX_OK;
}

static bool raw_exists(const char *key) { return raw_get(key, NULL); }

static int64_t raw_get_int(const char *key)
{
    fx_kv kv = {0};
    if (!raw_get(key, &kv)) return -1;
    int64_t v = strtoll((const char *)kv.value.data, NULL, 10);
    fx_kv_free(&kv);
    return v;
}

static void raw_list(const char *prefix, fx_range_resp *out)
{
    uint8_t end[1024];
    fx_slice p = FX_SLICE_STR(prefix);
    size_t el = fx_prefix_end(p, end);
    fx_range_req r = {.key = p, .range_end = {end, el}};
    fx_err e = fx_etcd_range(G.raw, &r, out, OP_MS);
    if (e != FX_OK) fail_msg("range %s: %s (%s)", prefix, fx_errname(e), fx_err_detail());
}

static int64_t raw_count(const char *prefix)
{
    fx_range_resp r = {0};
    raw_list(prefix, &r);
    int64_t n = (int64_t)r.n_kvs;
    fx_range_resp_free(&r);
    return n;
}

static void dump_prefix(const char *prefix)
{
    fx_range_resp r = {0};
    raw_list(prefix, &r);
    fprintf(stderr, "  keys under %s (%zu):\n", prefix, r.n_kvs);
    for (size_t i = 0; i < r.n_kvs; i++)
        fprintf(stderr, "    %s lease=%" PRId64 " value=%.120s\n", (const char *)r.kvs[i].key.data,
                r.kvs[i].lease, (const char *)r.kvs[i].value.data);
    fx_range_resp_free(&r);
}

/* The integer value of "field": N or "field":"N" in a flat JSON text; -1 if absent. */
static int64_t json_int(const char *json, const char *field)
{
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\"", field);
    const char *p = strstr(json, pat);
    if (!p) return -1;
    p += strlen(pat);
    while (*p == ' ' || *p == ':' || *p == '"') p++;
    return strtoll(p, NULL, 10);
}

static int64_t key_json_int(const char *key, const char *field)
{
    fx_kv kv = {0};
    if (!raw_get(key, &kv)) fail_msg("%s: missing", key);
    int64_t v = json_int((const char *)kv.value.data, field);
    fx_kv_free(&kv);
    return v;
}

static fx_mq_keys mkkeys(const char *root)
{
    fx_mq_keys k;
    CHECK(fx_mq_keys_init(&k, root));
    return k;
}

/* ---- clients ------------------------------------------------------------------------------------ */

typedef struct copts {
    int64_t long_ttl;
    int close_ms;
    int op_ms;
    const char *client_id;
    const char *const *eps; /* NULL: G.eps */
} copts;

static fx_mq_client *client_new(const char *root, const copts *o)
{
    fx_mq_client_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.etcd.endpoints = (o && o->eps) ? o->eps : G.eps;
    opts.etcd.n_endpoints = 1;
    opts.etcd.connect_timeout_ms = 500;
    opts.root = root;
    opts.min_ttl_s = 2;
    opts.op_timeout_ms = (o && o->op_ms) ? o->op_ms : 3000;
    opts.close_timeout_ms = o ? o->close_ms : 0;
    opts.long_lease_ttl_s = o ? o->long_ttl : 0;
    opts.client_id = o ? o->client_id : NULL;
    fx_mq_client *c = NULL;
    fx_err e = fx_mq_client_new(&opts, &c);
    if (e != FX_OK) fail_msg("fx_mq_client_new(%s): %s (%s)", root, fx_errname(e), fx_err_detail());
    return c;
}

static fx_mq_chan_cfg cfg_ttl(void) { return (fx_mq_chan_cfg){.capacity = 1000, .ttl_s = TTL}; }

/* Wait until the client's lease manager has seen more expiries than `before` and delivered them. */
static void wait_lease_expiry_seen(fx_mq_client *c, uint64_t before)
{
    fx_lease_mgr *m = fx_mq_client_leases(c);
    assert_non_null(m);
    int64_t dl = now_ms() + 8000;
    fx_lease_mgr_stats st;
    for (;;) {
        fx_lease_mgr_get_stats(m, &st);
        if (st.expired > before && st.notify_pending == 0) break;
        if (now_ms() > dl) fail_msg("lease manager did not notice the revoked lease within 8 s");
        fxt_nap_ms(20);
    }
}

static uint64_t lease_expired_count(fx_mq_client *c)
{
    fx_lease_mgr_stats st;
    fx_lease_mgr_get_stats(fx_mq_client_leases(c), &st);
    return st.expired;
}

/* ---- group setup ------------------------------------------------------------------------------ */

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
    G.raw = NULL;
    fxt_etcd_destroy(&G.etcd);
    return 0;
}

static int test_setup(void **state)
{
    (void)state;
    G.t_start = fxt_now_ms();
    return 0;
}

static int test_teardown(void **state)
{
    (void)state;
    fprintf(stderr, "  (%.1f s)\n", (double)(fxt_now_ms() - G.t_start) / 1000.0);
    if (G.etcd.pid == 0) return fxt_etcd_restart(&G.etcd);
    return 0;
}

/* ===================================================================================================
 * mq_client_close_races_open
 * =================================================================================================*/

#define RACE_ROUNDS 200
#define RACE_MAX_OPENS 3

enum { RK_SP, RK_SC, RK_MP, RK_MC, RK_N };

typedef struct racer {
    pthread_t t;
    int kind;
    fx_mq_client *c;
    int64_t chan, mpmc;
    atomic_bool *go;
    void *h[RACE_MAX_OPENS];
    int n;
    int refused; /* FX_ECLOSED */
    fx_err bad;  /* any other error */
    char bad_detail[300];
} racer;

static void *racer_main(void *arg)
{
    racer *r = arg;
    while (!atomic_load(r->go)) {
    }
    /* Consumers: one per channel at a time (a second MPSC consumer is refused by design). */
    int max = (r->kind == RK_SC || r->kind == RK_MC) ? 1 : RACE_MAX_OPENS;
    for (int i = 0; i < max; i++) {
        void *h = NULL;
        fx_err e;
        switch (r->kind) {
        case RK_SP: e = fx_mpsc_producer_open(r->c, r->chan, 0, (fx_mpsc_producer **)&h); break;
        case RK_SC: e = fx_mpsc_consumer_open(r->c, r->chan, (fx_mpsc_consumer **)&h); break;
        case RK_MP: e = fx_mpmc_producer_open(r->c, r->mpmc, 0, (fx_mpmc_producer **)&h); break;
        default: e = fx_mpmc_consumer_open(r->c, r->mpmc, (fx_mpmc_consumer **)&h); break;
        }
        if (e == FX_OK) {
            if (!h) {
                r->bad = FX_EPROTO;
                snprintf(r->bad_detail, sizeof r->bad_detail, "open FX_OK with a NULL endpoint");
                return NULL;
            }
            r->h[r->n++] = h;
            continue;
        }
        if (e == FX_ECLOSED) {
            r->refused++;
        } else {
            r->bad = e;
            snprintf(r->bad_detail, sizeof r->bad_detail, "%s", fx_err_detail());
        }
        break;
    }
    return NULL;
}

typedef struct closer {
    pthread_t t;
    fx_mq_client *c;
    atomic_bool *go;
    int delay_us;
    fx_err e;
} closer;

static void *closer_main(void *arg)
{
    closer *cl = arg;
    while (!atomic_load(cl->go)) {
    }
    struct timespec ts = {0, (long)cl->delay_us * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    cl->e = fx_mq_client_close(cl->c);
    return NULL;
}

static fx_err racer_close_free(racer *r, int i)
{
    fx_err e;
    switch (r->kind) {
    case RK_SP: e = fx_mpsc_producer_close(r->h[i]); fx_mpsc_producer_free(r->h[i]); break;
    case RK_SC: e = fx_mpsc_consumer_close(r->h[i]); fx_mpsc_consumer_free(r->h[i]); break;
    case RK_MP: e = fx_mpmc_producer_close(r->h[i]); fx_mpmc_producer_free(r->h[i]); break;
    default: e = fx_mpmc_consumer_close(r->h[i]); fx_mpmc_consumer_free(r->h[i]); break;
    }
    return e;
}

static void mq_client_close_races_open(void **state)
{
    (void)state;
    const char *root = "/t_race";
    copts ko = {.close_ms = 500};
    fx_mq_client *keeper = client_new(root, &ko);
    fx_mq_chan_cfg cfg = {.capacity = 1000, .ttl_s = 3};
    int64_t chan = -1, mpmc = -1;
    CHECK(fx_mpsc_create(keeper, &cfg, &chan));
    CHECK(fx_mpmc_resolve(keeper, "race", &cfg, &mpmc));
    /* The keeper's producers keep both channels' shared leases alive for the whole test. */
    fx_mpsc_producer *kp = NULL;
    fx_mpmc_producer *kmp = NULL;
    CHECK(fx_mpsc_producer_open(keeper, chan, 0, &kp));
    CHECK(fx_mpmc_producer_open(keeper, mpmc, 0, &kmp));

    int opened = 0, refused = 0, closed_before = 0;
    for (int round = 0; round < RACE_ROUNDS; round++) {
        copts o = {.close_ms = 500};
        fx_mq_client *c = client_new(root, &o);
        atomic_bool go;
        atomic_init(&go, false);
        racer rs[RK_N];
        memset(rs, 0, sizeof rs);
        for (int k = 0; k < RK_N; k++) {
            rs[k] = (racer){.kind = k, .c = c, .chan = chan, .mpmc = mpmc, .go = &go};
            assert_int_equal(pthread_create(&rs[k].t, NULL, racer_main, &rs[k]), 0);
        }
        /* The close lands anywhere from before the first open to after the last one. */
        closer cl = {.c = c, .go = &go, .delay_us = (round * 7919) % 40000};
        assert_int_equal(pthread_create(&cl.t, NULL, closer_main, &cl), 0);
        atomic_store(&go, true);
        pthread_join(cl.t, NULL);
        for (int k = 0; k < RK_N; k++) pthread_join(rs[k].t, NULL);
        if (cl.e != FX_OK) fail_msg("round %d: client close: %s", round, fx_errname(cl.e));
        for (int k = 0; k < RK_N; k++) {
            if (rs[k].bad)
                fail_msg("round %d, opener kind %d: open returned %s (%s), want an endpoint or "
                         "FX_ECLOSED", round, k, fx_errname(rs[k].bad), rs[k].bad_detail);
            refused += rs[k].refused;
            opened += rs[k].n;
            for (int i = 0; i < rs[k].n; i++) {
                fx_err e = racer_close_free(&rs[k], i);
                if (e != FX_OK)
                    fail_msg("round %d: close of an endpoint the client closed: %s (%s)", round,
                             fx_errname(e), fx_err_detail());
            }
        }
        if (rs[RK_SP].n == 0 && rs[RK_MP].n == 0) closed_before++;
        fx_mq_client_free(c);
    }
    fprintf(stderr, "  %d rounds: %d endpoints opened then closed by the client, %d opens refused "
            "with FX_ECLOSED, %d rounds with no producer opened\n",
            RACE_ROUNDS, opened, refused, closed_before);
    /* The rounds covered both outcomes (so the close did race the opens). */
    assert_true(opened > 0);
    assert_true(refused > 0);
    fx_mpmc_producer_free(kmp);
    fx_mpsc_producer_free(kp);
    CHECK(fx_mq_client_close(keeper));
    fx_mq_client_free(keeper);
}

/* ===================================================================================================
 * mq_member_id_allocator_reclaimed
 * =================================================================================================*/

static void mq_member_id_allocator_reclaimed(void **state)
{
    (void)state;
    const char *root = "/t_memid";
    fx_mq_keys k = mkkeys(root);
    copts o = {.long_ttl = LONG_TTL};
    fx_mq_client *c = client_new(root, &o);
    fx_mq_chan_cfg cfg = cfg_ttl();
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "memid", &cfg, &m));
    fx_mpmc_producer *p = NULL;
    fx_mpmc_consumer *q = NULL;
    CHECK(fx_mpmc_producer_open(c, m, 0, &p));
    CHECK(fx_mpmc_consumer_open(c, m, &q));
    assert_true(fx_mpmc_consumer_member(q) > fx_mpmc_producer_member(p));

    /* The member-id counter exists, bound to the MPMC's id-allocator cluster lease. */
    fx_mq_key mk, ak;
    CHECK(fx_mq_key_mpmc_meta(&k, m, &mk));
    CHECK(fx_mq_key_alloc_mpmc_member_ids(&k, m, &ak));
    int64_t il = key_json_int(mk.s, "id_allocator_cluster_lease_id");
    assert_true(il > 0);
    fx_kv kv = {0};
    if (!raw_get(ak.s, &kv)) fail_msg("member-id counter %s missing", ak.s);
    int64_t ctr_lease = kv.lease;
    int64_t ctr_val = strtoll((const char *)kv.value.data, NULL, 10);
    fx_kv_free(&kv);
    if (ctr_lease != il)
        fail_msg("member-id counter %s: lease %" PRId64 ", want the id-allocator lease %" PRId64,
                 ak.s, ctr_lease, il);
    assert_int_equal(ctr_val, fx_mpmc_consumer_member(q));

    CHECK(fx_mpmc_consumer_close(q));
    CHECK(fx_mpmc_producer_close(p));
    fx_mpmc_consumer_free(q);
    fx_mpmc_producer_free(p);
    CHECK(fx_mq_client_close(c));
    fx_mq_client_free(c);

    /* After TTL + long TTL: only the global id counters and the name mapping remain. */
    fx_mq_key chan_ctr, mpmc_ctr, uk;
    CHECK(fx_mq_key_alloc_chan_ids(&k, &chan_ctr));
    CHECK(fx_mq_key_alloc_mpmc_ids(&k, &mpmc_ctr));
    CHECK(fx_mq_key_unique(&k, "memid", &uk));
    char rootp[64];
    snprintf(rootp, sizeof rootp, "%s/", root);
    int64_t dl = now_ms() + (TTL + LONG_TTL) * 1000 + 8000;
    size_t bad = 0;
    for (;;) {
        fx_range_resp r = {0};
        raw_list(rootp, &r);
        bad = 0;
        for (size_t i = 0; i < r.n_kvs; i++) {
            const char *key = (const char *)r.kvs[i].key.data;
            if (strcmp(key, chan_ctr.s) && strcmp(key, mpmc_ctr.s) && strcmp(key, uk.s)) bad++;
        }
        fx_range_resp_free(&r);
        if (bad == 0 || now_ms() > dl) break;
        fxt_nap_ms(200);
    }
    if (bad) {
        dump_prefix(rootp);
        fail_msg("%zu key(s) of MPMC %" PRId64 " left under %s after TTL + long TTL + margin", bad,
                 m, rootp);
    }
    assert_false(raw_exists(ak.s));
    assert_int_equal(raw_get_int(uk.s), m); /* the mapping (unleased) stays */
}

/* ===================================================================================================
 * mq_client_close_strong_error
 * =================================================================================================*/

static void mq_client_close_strong_error(void **state)
{
    (void)state;
    const char *root = "/t_strong";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c0 = client_new(root, NULL);
    fx_mq_chan_cfg cfg = {.capacity = 100, .ttl_s = 3};
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c0, &cfg, &chan));
    fx_mpsc_producer *p = NULL;
    CHECK(fx_mpsc_producer_open(c0, chan, 0, &p));

    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    copts po = {.close_ms = 300, .op_ms = 1500, .eps = fxt_proxy_eps(px)};
    fx_mq_client *cx = client_new(root, &po);
    fx_mpsc_consumer *q = NULL;
    CHECK(fx_mpsc_consumer_open(cx, chan, &q));
    fx_slice v[3] = {FX_SLICE_STR("a"), FX_SLICE_STR("b"), FX_SLICE_STR("c")};
    CHECK(fx_mpsc_put(p, v, 3, 2000, NULL, NULL));
    fx_mq_delivery d[3];
    size_t got = 0;
    int64_t dl = now_ms() + 5000;
    while (got < 3 && now_ms() < dl) {
        size_t n = 0;
        fx_err e = fx_mpsc_get(q, d + got, 3 - got, &n, 300);
        if (e != FX_ETIMEDOUT) CHECK(e);
        got += n;
    }
    assert_int_equal(got, 3);

    /* Every commit (it writes the consume offset) is dropped by the proxy. */
    fx_mq_key off, mem_pre;
    CHECK(fx_mq_key_consume_offset(&k, chan, fx_mpsc_producer_idx(p), &off));
    CHECK(fx_mq_prefix_consumer_members(&k, chan, &mem_pre));
    fxt_proxy_block_key(px, off.s);
    for (int i = 0; i < 3; i++) {
        CHECK(fx_mpsc_ack(q, &d[i].id, 1));
        fx_mq_delivery_free(&d[i]);
    }

    /* The client close reports the consumer's failed close and keeps the backends. */
    fx_err e = fx_mq_client_close(cx);
    char detail[600];
    snprintf(detail, sizeof detail, "%s", fx_err_detail());
    fprintf(stderr, "  client close with the final commit dropped: %s (%s)\n", fx_errname(e),
            detail);
    if (e == FX_OK || !strstr(detail, "not committed"))
        fail_msg("client close: %s (%s); want the consumer's strong close error", fx_errname(e),
                 detail);
    assert_true(fxt_proxy_blocked(px) >= 1);
    if (fx_mq_client_etcd(cx) == NULL) fail_msg("the backends were freed after a strong failure");
    assert_false(raw_exists(off.s));          /* nothing committed */
    assert_int_equal(raw_count(mem_pre.s), 1); /* still bound: no second consumer can start */
    size_t n = 0;
    assert_int_equal(fx_mpsc_get(q, d, 1, &n, 100), FX_ECLOSED);
    fx_mpsc_consumer *q2 = NULL;
    assert_int_equal(fx_mpsc_consumer_open(cx, chan, &q2), FX_ECLOSED); /* the client is closing */

    /* Once commits go through again, a retry of the client close commits, closes, tears down. */
    fxt_proxy_block_key(px, NULL);
    e = fx_mq_client_close(cx);
    if (e != FX_OK) fail_msg("client close retry: %s (%s)", fx_errname(e), fx_err_detail());
    if (fx_mq_client_etcd(cx) != NULL) fail_msg("backends not freed after the successful retry");
    fx_mq_key poff;
    CHECK(fx_mq_key_produce_offset(&k, chan, fx_mpsc_producer_idx(p), &poff));
    int64_t produced = raw_get_int(poff.s);
    assert_true(produced >= 0);
    /* all three acks committed: the consume offset (next id) is past the last produced id */
    assert_int_equal(raw_get_int(off.s), produced + 1);
    assert_int_equal(raw_count(mem_pre.s), 0);      /* membership deleted by the finished close */
    CHECK(fx_mpsc_consumer_close(q));               /* finished: idempotent again */
    fx_mpsc_consumer_free(q);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    fx_mpsc_producer_free(p);
    fx_mq_client_free(c0);
}

/* ===================================================================================================
 * mq_rollback_verified
 * =================================================================================================*/

/* One MPMC consumer open (through the proxy) whose new sub-MPSC cannot be bound: the proxy drops
 * every request naming the new channel's consumer-idx counter; with drop_delete also the
 * rollback's delete txn. Returns the open error; *chan_out the sub-MPSC id that was created. */
static fx_err rollback_case(const char *root, const char *name, bool drop_delete, int64_t *chan_out,
                            char *detail, size_t dcap)
{
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c0 = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_ttl();
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c0, name, &cfg, &m));
    fx_mq_key chan_ctr;
    CHECK(fx_mq_key_alloc_chan_ids(&k, &chan_ctr));
    int64_t cur = raw_get_int(chan_ctr.s);
    int64_t chan = (cur < 0 ? 0 : cur) + 1; /* the next chan id: nobody else creates under root */
    *chan_out = chan;

    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    fx_mq_key cidx, meta;
    CHECK(fx_mq_key_alloc_consumer_idx(&k, chan, &cidx));
    CHECK(fx_mq_key_chan_meta(&k, chan, &meta));
    char b_cidx[FXT_PROXY_NEEDLE_MAX], b_meta[FXT_PROXY_NEEDLE_MAX];
    fxt_proxy_b64(cidx.s, b_cidx, sizeof b_cidx);
    fxt_proxy_b64(meta.s, b_meta, sizeof b_meta);
    const char *r1[1] = {b_cidx};
    const char *r2[2] = {"request_delete_range", b_meta};
    fxt_proxy_block(px, r1, 1);
    if (drop_delete) fxt_proxy_block_add(px, r2, 2);

    copts po = {.close_ms = 500, .op_ms = 1500, .eps = fxt_proxy_eps(px)};
    fx_mq_client *cx = client_new(root, &po);
    fx_mpmc_consumer *q = NULL;
    fx_err e = fx_mpmc_consumer_open(cx, m, &q);
    snprintf(detail, dcap, "%s", fx_err_detail());
    int blocked = fxt_proxy_blocked(px);
    fxt_proxy_block(px, NULL, 0);
    if (q) fx_mpmc_consumer_free(q);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    fx_mq_client_free(c0);
    fprintf(stderr, "  drop_delete=%d: open -> %s (%s); %d request(s) dropped\n", drop_delete,
            fx_errname(e), detail, blocked);
    assert_true(blocked >= (drop_delete ? 2 : 1));
    return e;
}

static void mq_rollback_verified(void **state)
{
    (void)state;
    const char *root = "/t_rollback";
    fx_mq_keys k = mkkeys(root);
    char detail[600];
    int64_t chan = -1;
    fx_mq_key meta;

    /* 1. The delete goes through: the sub-MPSC is gone, the open reports the bind failure. */
    fx_err e = rollback_case(root, "rb1", false, &chan, detail, sizeof detail);
    assert_int_not_equal(e, FX_OK);
    CHECK(fx_mq_key_chan_meta(&k, chan, &meta));
    if (raw_exists(meta.s)) {
        dump_prefix(root);
        fail_msg("sub-MPSC %" PRId64 " was not rolled back", chan);
    }
    if (strstr(detail, "rollback"))
        fail_msg("a verified rollback was reported as a failure: %s", detail);

    /* 2. The proxy drops the rollback's delete: the read-back sees the keys and the open says so. */
    e = rollback_case(root, "rb2", true, &chan, detail, sizeof detail);
    CHECK(fx_mq_key_chan_meta(&k, chan, &meta));
    bool left = raw_exists(meta.s);
    if (!left) fail_msg("sub-MPSC %" PRId64 ": meta gone although every delete was dropped", chan);
    if (e != FX_EEXISTS || !strstr(detail, "rollback") || !strstr(detail, "still present"))
        fail_msg("open with an unverified rollback returned %s (%s); want FX_EEXISTS naming the "
                 "rollback and the keys still present", fx_errname(e), detail);
    char want[64];
    snprintf(want, sizeof want, "sub-MPSC %" PRId64, chan);
    if (!strstr(detail, want)) fail_msg("error does not name %s: %s", want, detail);
    /* The keys left are bound to the sub-MPSC's own global-long lease (which nobody renews once
     * its creator let go), not to the channel's metadata lease that every member renews: they go
     * with it. */
    fx_kv mkv = {0};
    assert_true(raw_get(meta.s, &mkv));
    int64_t meta_lease = mkv.lease;
    fx_kv_free(&mkv);
    fx_mq_key cll;
    CHECK(fx_mq_key_cluster_lease_id_alloc(&k, chan, &cll));
    int64_t own = raw_get_int(cll.s);
    print_message("      leftover meta lease %" PRId64 ", its own global-long lease %" PRId64 "\n",
                  meta_lease, own);
    assert_true(own > 0);
    assert_int_equal(meta_lease, own);
}

/* ===================================================================================================
 * mpsc_second_consumer_refused (+ external_client_id)
 * =================================================================================================*/

static void mpsc_second_consumer_refused(void **state)
{
    (void)state;
    const char *root = "/t_second";
    fx_mq_keys k = mkkeys(root);
    copts o1 = {.client_id = "edge-client-A"};
    fx_mq_client *c1 = client_new(root, &o1);
    fx_mq_client *c2 = client_new(root, NULL); /* generated identity */
    assert_string_equal(fx_mq_client_id(c1), "edge-client-A");
    assert_true(strlen(fx_mq_client_id(c2)) > 0);
    fx_mq_chan_cfg cfg = cfg_ttl();
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c1, &cfg, &chan));
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *q1 = NULL, *q2 = NULL;
    CHECK(fx_mpsc_producer_open(c1, chan, 0, &p));
    CHECK(fx_mpsc_consumer_open(c1, chan, &q1));

    /* A second consumer (same client or another one) is refused while the first is bound. */
    fx_mq_key pk, cpre;
    CHECK(fx_mq_prefix_consumer_members(&k, chan, &cpre));
    fx_err e = fx_mpsc_consumer_open(c2, chan, &q2);
    if (e != FX_EEXISTS || q2)
        fail_msg("second consumer from another client: %s (%s), want FX_EEXISTS", fx_errname(e),
                 fx_err_detail());
    e = fx_mpsc_consumer_open(c1, chan, &q2);
    if (e != FX_EEXISTS || q2)
        fail_msg("second consumer from the same client: %s (%s), want FX_EEXISTS", fx_errname(e),
                 fx_err_detail());
    assert_int_equal(raw_count(cpre.s), 1);
    /* Membership records carry the client identity. */
    CHECK(fx_mq_key_producer_member(&k, chan, fx_mpsc_producer_idx(p), &pk));
    fx_kv kv = {0};
    assert_true(raw_get(pk.s, &kv));
    if (!strstr((const char *)kv.value.data, "\"external_client_id\":\"edge-client-A\""))
        fail_msg("producer membership %s = %s: no external_client_id of the client", pk.s,
                 (const char *)kv.value.data);
    fx_kv_free(&kv);
    fx_range_resp r = {0};
    raw_list(cpre.s, &r);
    assert_int_equal(r.n_kvs, 1);
    if (!strstr((const char *)r.kvs[0].value.data, "\"external_client_id\":\"edge-client-A\""))
        fail_msg("consumer membership %s = %s: no external_client_id of the client",
                 (const char *)r.kvs[0].key.data, (const char *)r.kvs[0].value.data);
    fx_range_resp_free(&r);

    /* The producer still works (the binding state stayed valid). */
    fx_slice v = FX_SLICE_STR("m1");
    CHECK(fx_mpsc_put(p, &v, 1, 2000, NULL, NULL));

    /* Once the first consumer closed, a new one binds, with its own client's identity. */
    CHECK(fx_mpsc_consumer_close(q1));
    fx_mpsc_consumer_free(q1);
    CHECK(fx_mpsc_consumer_open(c2, chan, &q2));
    raw_list(cpre.s, &r);
    assert_int_equal(r.n_kvs, 1);
    char want[300];
    snprintf(want, sizeof want, "\"external_client_id\":\"%s\"", fx_mq_client_id(c2));
    if (!strstr((const char *)r.kvs[0].value.data, want))
        fail_msg("consumer membership %s: want %s", (const char *)r.kvs[0].value.data, want);
    fx_range_resp_free(&r);
    fx_mq_delivery d[1];
    size_t n = 0;
    int64_t dl = now_ms() + 5000;
    while (n == 0 && now_ms() < dl) {
        e = fx_mpsc_get(q2, d, 1, &n, 500);
        if (e != FX_ETIMEDOUT) CHECK(e);
    }
    assert_int_equal(n, 1);
    fx_mq_delivery_free(&d[0]);

    fx_mpsc_consumer_free(q2);
    fx_mpsc_producer_free(p);
    fx_mq_client_free(c2);
    fx_mq_client_free(c1);
}

/* ===================================================================================================
 * mpsc_global_lease_lost_closes_consumer
 * =================================================================================================*/

static void mpsc_global_lease_lost_closes_consumer(void **state)
{
    (void)state;
    const char *root = "/t_globlost";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_ttl();
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    fx_mpsc_consumer *q = NULL;
    CHECK(fx_mpsc_consumer_open(c, chan, &q));
    fx_mq_key mk;
    CHECK(fx_mq_key_chan_meta(&k, chan, &mk));
    int64_t gl = key_json_int(mk.s, "global_lease_id");
    assert_true(gl > 0);

    uint64_t before = lease_expired_count(c);
    CHECK(fx_etcd_lease_revoke(G.raw, gl, OP_MS));
    wait_lease_expiry_seen(c, before);

    /* The next call reports the loss (within a bounded wait), then the consumer is closed. */
    fx_mq_delivery d[1];
    size_t n = 0;
    fx_err e = FX_ETIMEDOUT;
    int64_t dl = now_ms() + 3000;
    while (e == FX_ETIMEDOUT && now_ms() < dl) e = fx_mpsc_get(q, d, 1, &n, 200);
    if (e != FX_ELEASE_LOST)
        fail_msg("get after the global lease was revoked: %s (%s), want FX_ELEASE_LOST",
                 fx_errname(e), fx_err_detail());
    e = fx_mpsc_get(q, d, 1, &n, 200);
    if (e != FX_ECLOSED) fail_msg("second get: %s, want FX_ECLOSED", fx_errname(e));
    fx_mq_msg_id id = {chan, 1, 1};
    e = fx_mpsc_ack(q, &id, 1);
    if (e != FX_ECLOSED) fail_msg("ack: %s, want FX_ECLOSED", fx_errname(e));
    fx_mpsc_consumer_free(q);
    CHECK(fx_mq_client_close(c));
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mpmc_unconfirmed_member_lease_fences_get
 *
 * A consumer whose member lease etcd has not confirmed for its TTL hands out nothing. The proxy in
 * front of the consumer's client drops only the keepalives of that lease (every other call goes
 * through: the state right after a partition heals, before the keepalive says "expired"). Messages
 * are stored meanwhile by a producer on a direct client. Once the TTL since the last confirmation
 * is over, fx_mpmc_get answers FX_EUNAVAIL and fx_mpmc_consumer_fenced() is true, and nothing of
 * the stored messages is handed out; when etcd has expired the lease and the keepalives pass again,
 * the consumer reports FX_ELEASE_LOST; a new consumer receives every message.
 * =================================================================================================*/

/* Get up to `want` messages within timeout_ms (acking them); returns how many; *last: the last
 * result that was not FX_OK/FX_ETIMEDOUT (FX_OK if none). */
static size_t fence_drain(fx_mpmc_consumer *q, size_t want, int timeout_ms, fx_err *last)
{
    size_t got = 0;
    *last = FX_OK;
    int64_t dl = now_ms() + timeout_ms;
    while (got < want && now_ms() < dl) {
        fx_mq_delivery d[16];
        size_t n = 0;
        fx_err e = fx_mpmc_get(q, d, 16, &n, 100);
        for (size_t i = 0; i < n; i++) {
            CHECK(fx_mpmc_ack(q, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
        got += n;
        if (e != FX_OK && e != FX_ETIMEDOUT) {
            *last = e;
            break;
        }
    }
    return got;
}

static void fence_put(fx_mpmc_producer *p, const char *text)
{
    fx_slice v = FX_SLICE_STR(text);
    size_t n = 0;
    CHECK(fx_mpmc_put(p, &v, 1, OP_MS, &n, NULL));
    assert_int_equal(n, 1);
}

static void mpmc_unconfirmed_member_lease_fences_get(void **state)
{
    (void)state;
    const char *root = "/t_fence";
    fx_mq_keys k = mkkeys(root);
    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    copts po = {.eps = fxt_proxy_eps(px)};
    fx_mq_client *cc = client_new(root, &po); /* the consumer's, through the proxy */
    fx_mq_client *pc = client_new(root, NULL); /* the producer's, direct */
    fx_mq_chan_cfg cfg = cfg_ttl();
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(pc, "fence", &cfg, &m));
    fx_mpmc_consumer *q = NULL;
    CHECK(fx_mpmc_consumer_open(cc, m, &q));
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(pc, m, 0, &p));

    /* Positive control: the consumer hands out what is stored. */
    fence_put(p, "before");
    fx_err last = FX_OK;
    assert_int_equal(fence_drain(q, 1, 5000, &last), 1);
    assert_false(fx_mpmc_consumer_fenced(q));

    /* Only the keepalives of the consumer's member lease are dropped from now on. */
    fx_mq_key role;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, m, fx_mpmc_consumer_member(q), &role));
    fx_kv kv = {0};
    if (!raw_get(role.s, &kv)) fail_msg("role key %s absent", role.s);
    int64_t lease = kv.lease;
    fx_kv_free(&kv);
    assert_true(lease > 0);
    char needle[32];
    snprintf(needle, sizeof needle, "%" PRId64, lease);
    const char *rule[1] = {needle};
    int64_t t_block = now_ms();
    fxt_proxy_block(px, rule, 1);
    for (int i = 0; i < 5; i++) fence_put(p, "during");

    /* Within the TTL the consumer may still hand messages out; past it (+ slack) it must not. */
    int64_t dl = t_block + TTL * 1000 + 3000;
    while (!fx_mpmc_consumer_fenced(q) && now_ms() < dl) fxt_nap_ms(20);
    int64_t t_fenced = now_ms();
    if (!fx_mpmc_consumer_fenced(q))
        fail_msg("consumer not fenced %" PRId64 " ms after its member lease's keepalives stopped "
                 "passing (TTL %d s)", t_fenced - t_block, TTL);
    print_message("fenced %" PRId64 " ms after the keepalives stopped passing (TTL %d s)\n",
                  t_fenced - t_block, TTL);
    /* whatever it handed out before the fence, it hands out nothing now */
    (void)fence_drain(q, 5, 200, &last);
    fx_mq_delivery d[4];
    size_t n = 9;
    fx_err e = fx_mpmc_get(q, d, 4, &n, 200);
    if (e != FX_EUNAVAIL || n != 0)
        fail_msg("get while the member lease is unconfirmed: %s, %zu message(s) (%s); want FX_EUNAVAIL",
                 fx_errname(e), n, fx_err_detail());

    /* etcd expires the lease (TTL after its last keepalive: its role key goes with it); then the
     * keepalives pass again and report it: lost. */
    dl = now_ms() + TTL * 1000 + 5000;
    while (raw_exists(role.s) && now_ms() < dl) fxt_nap_ms(50);
    if (raw_exists(role.s)) fail_msg("etcd did not expire the member lease %" PRId64, lease);
    uint64_t before = lease_expired_count(cc);
    fxt_proxy_block(px, NULL, 0);
    wait_lease_expiry_seen(cc, before);
    e = fx_mpmc_get(q, d, 4, &n, 200);
    if (e != FX_ELEASE_LOST)
        fail_msg("get after the member lease expired: %s (%s), want FX_ELEASE_LOST", fx_errname(e),
                 fx_err_detail());
    fx_mpmc_consumer_free(q);

    /* Nothing is lost: a new consumer gets what the fenced one did not hand out (and, redelivered,
     * what it handed out without a commit). */
    fx_mpmc_consumer *q2 = NULL;
    CHECK(fx_mpmc_consumer_open(pc, m, &q2));
    size_t got = fence_drain(q2, 5, 10000, &last);
    if (got < 5) fail_msg("new consumer got %zu of the 5 messages stored during the block (last: %s)",
                          got, fx_errname(last));
    CHECK(fx_mpmc_consumer_close(q2));
    fx_mpmc_consumer_free(q2);
    CHECK(fx_mpmc_producer_close(p));
    fx_mpmc_producer_free(p);
    fx_mq_client_free(cc);
    CHECK(fx_mq_client_close(pc));
    fx_mq_client_free(pc);
    fxt_proxy_stop(px);
}

/* ---- attempt records --------------------------------------------------------------------------- */

#ifdef FX_ATTEMPTS_FENCED
#define ATT_OPEN(c, owner, out) \
    fx_attempts_open((c), fx_mpmc_consumer_chan(owner), (owner), OP_MS, (out))
#else /* the API before the fence (to run the tests against it) */
#define ATT_OPEN(c, owner, out) fx_attempts_open((c), fx_mpmc_consumer_chan(owner), OP_MS, (out))
#endif

/* Attempts of (pidx, msg) as the stored record of chan says; *nh: producer entries in it. */
static uint32_t raw_attempts(const char *root, int64_t chan, int64_t pidx, int64_t msg, size_t *nh)
{
    char key[256];
    snprintf(key, sizeof key, "%s/attempts/%" PRId64, root, chan);
    fx_kv kv = {0};
    if (nh) *nh = 0;
    if (!raw_get(key, &kv)) return 0;
    fx_attempts_rec r;
    CHECK(fx_attempts_decode(kv.value.data, kv.value.len, &r));
    fx_kv_free(&kv);
    uint32_t n = 0;
    for (size_t i = 0; i < r.nh; i++)
        if (r.hi_pidx[i] == pidx && msg <= r.hi[i]) n = 1;
    for (size_t i = 0; i < r.ne; i++)
        if (r.exc[i].pidx == pidx && r.exc[i].msg == msg) n = r.exc[i].n;
    if (nh) *nh = r.nh;
    fx_attempts_rec_free(&r);
    return n;
}

static void mq_attempts_write_fenced(void **state)
{
    (void)state;
    const char *root = "/t_attf";
    copts o = {.long_ttl = 60, .close_ms = 1000};
    fx_mq_client *c1 = client_new(root, &o), *c2 = client_new(root, &o);
    fx_mq_keys k = mkkeys(root);
    fx_mq_chan_cfg cfg = {.capacity = 1000, .ttl_s = 10};
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c1, "attf", &cfg, &mpmc));
    fx_mpmc_consumer *a = NULL, *b = NULL, *d = NULL;
    CHECK(fx_mpmc_consumer_open(c1, mpmc, &a));
    CHECK(fx_mpmc_consumer_open(c2, mpmc, &b)); /* a second sub-MPSC: a is reclaimable later */
    int64_t s = fx_mpmc_consumer_chan(a);
    fx_attempts *aa = NULL, *da = NULL;
    CHECK(ATT_OPEN(c1, a, &aa));
    const fx_attempt f1[] = {{7, 3, 2}}; /* message (7, 3) delivered twice, not acked */
    CHECK(fx_attempts_save(aa, f1, 1, OP_MS, NULL));
    assert_int_equal(raw_attempts(root, s, 7, 3, NULL), 2);

    /* A's member lease is gone (its bridge stopped past ttl_seconds): memberships deleted. */
    fx_mq_key cp;
    CHECK(fx_mq_prefix_consumer_members(&k, s, &cp));
    fx_range_resp mr = {0};
    raw_list(cp.s, &mr);
    assert_int_equal(mr.n_kvs, 1);
    int64_t lease = mr.kvs[0].lease;
    fx_range_resp_free(&mr);
    CHECK(fx_etcd_lease_revoke(G.raw, lease, OP_MS));
    assert_int_equal(raw_count(cp.s), 0);

    /* Another bridge adopts the sub-MPSC, inherits 2 attempts and delivers a third time. */
    fx_err e = FX_EEXISTS;
    int64_t dl = now_ms() + 10000;
    while ((e = fx_mpmc_consumer_open_drain(c2, mpmc, s, &d)) == FX_EEXISTS && now_ms() < dl)
        fxt_nap_ms(20); /* the ready key goes with A's lease */
    CHECK(e);
    CHECK(ATT_OPEN(c2, d, &da));
    assert_int_equal(fx_attempts_take(da, 7, 3), 2);
    const fx_attempt f2[] = {{7, 3, 3}};
    CHECK(fx_attempts_save(da, f2, 1, OP_MS, NULL));
    assert_int_equal(raw_attempts(root, s, 7, 3, NULL), 3);

    /* The stale A writes its own view (the message left its table): refused, nothing changes. */
    bool wrote = true;
    e = fx_attempts_save(aa, NULL, 0, OP_MS, &wrote);
    uint32_t now = raw_attempts(root, s, 7, 3, NULL);
    print_message("      stale writer's save: %s (wrote %d); attempts of (7,3) now %u (want 3)\n",
                  fx_errname(e), wrote, now);
    assert_int_equal(now, 3);
    assert_int_equal(e, FX_ELEASE_LOST);
    assert_false(wrote);
    /* The owner's writes go on. */
    const fx_attempt f3[] = {{7, 3, 4}};
    CHECK(fx_attempts_save(da, f3, 1, OP_MS, NULL));
    assert_int_equal(raw_attempts(root, s, 7, 3, NULL), 4);
    /* The drain consumer leaves; the sub-MPSC is reclaimed with its record, and the stale
     * writer cannot re-create it. */
    fx_attempts_free(da);
    fx_mpmc_consumer_free(d);
    char akey[256];
    snprintf(akey, sizeof akey, "%s/attempts/%" PRId64, root, s);
    fx_mq_key lk;
    CHECK(fx_mq_key_mpmc_mpsc_channels(&k, mpmc, &lk));
    dl = now_ms() + 10000;
    while (now_ms() < dl) {
        fx_kv kv = {0};
        bool listed = false;
        if (raw_get(lk.s, &kv)) {
            int64_t *ids = NULL;
            size_t n = 0;
            CHECK(fx_mq_mpsc_list_decode(kv.value.data, kv.value.len, &ids, &n));
            for (size_t i = 0; i < n; i++) listed = listed || ids[i] == s;
            free(ids);
        }
        fx_kv_free(&kv);
        if (!listed) break;
        fxt_nap_ms(20);
    }
    assert_false(raw_exists(akey)); /* reclaimed with the sub-MPSC */
    e = fx_attempts_save(aa, f1, 1, OP_MS, &wrote);
    assert_int_equal(e, FX_ELEASE_LOST);
    assert_false(raw_exists(akey));
    fx_attempts_free(aa);
    fx_mpmc_consumer_free(b);
    fx_mpmc_consumer_free(a);
    fx_mq_client_free(c2);
    fx_mq_client_free(c1);
}

static void mq_attempts_pruned(void **state)
{
    (void)state;
    enum { LIVES = 20, PER = 250 };
    const char *root = "/t_attp";
    copts o = {.long_ttl = 60, .close_ms = 1000};
    fx_mq_client *c = client_new(root, &o);
    fx_mq_keys k = mkkeys(root);
    fx_mq_chan_cfg cfg = {.capacity = 1000, .ttl_s = 10};
    int64_t mpmc = -1, s = -1;
    CHECK(fx_mpmc_resolve(c, "attp", &cfg, &mpmc));
    static fx_attempt fl[PER];
    for (int life = 0; life <= LIVES + 1; life++) {
        fx_mpmc_consumer *d = NULL;
        if (life == 0) {
            CHECK(fx_mpmc_consumer_open(c, mpmc, &d));
            s = fx_mpmc_consumer_chan(d);
        } else {
            CHECK(fx_mpmc_consumer_open_drain(c, mpmc, s, &d));
        }
        fx_attempts *att = NULL;
        CHECK(ATT_OPEN(c, d, &att));
        if (life < LIVES) {
            /* 100 new producer ids, each message 0 delivered once ... */
            for (int i = 0; i < PER; i++) {
                int64_t pid = 1000 + (int64_t)life * PER + i;
                assert_int_equal(fx_attempts_take(att, pid, 0), 0);
                fl[i] = (fx_attempt){pid, 0, 1};
            }
            CHECK(fx_attempts_save(att, fl, PER, OP_MS, NULL));
            /* ... acked and committed: the consume offsets a commit leaves (next id 1) */
            fx_mq_key ck[PER];
            fx_op ops[PER];
            for (int i = 0; i < PER; i++) {
                CHECK(fx_mq_key_consume_offset(&k, s, fl[i].pidx, &ck[i]));
                ops[i] = (fx_op){.type = FX_OP_PUT,
                                 .u.put = {.key = fx_mq_key_slice(&ck[i]), .value = {"1", 1}}};
            }
            for (int i = 0; i < PER; i += 125) { /* etcd: <= 128 ops per txn */
                fx_txn_req t = {.success = ops + i, .n_success = PER - i < 125 ? PER - i : 125};
                CHECK(fx_etcd_txn(G.raw, &t, NULL, OP_MS));
            }
            CHECK(fx_attempts_save(att, NULL, 0, OP_MS, NULL));
        } else if (life == LIVES) { /* a live producer's message delivered twice, then a move */
            assert_int_equal(fx_attempts_take(att, 99, 0), 0);
            const fx_attempt f[] = {{99, 0, 2}};
            CHECK(fx_attempts_save(att, f, 1, OP_MS, NULL));
        } else {
            uint32_t n = fx_attempts_take(att, 99, 0);
            size_t nh = 0;
            (void)raw_attempts(root, s, 99, 0, &nh);
            fx_attempts_stats st;
            fx_attempts_get_stats(att, &st);
            print_message("      after %d producer ids: attempts of (99,0) inherited %u (want 2); "
                          "record holds %zu producer entries; %" PRIu64 " dropped\n",
                          LIVES * PER, n, nh, st.dropped);
            assert_int_equal(n, 2);
            assert_true(nh <= 2 * PER);
        }
        fx_attempts_free(att);
        fx_mpmc_consumer_free(d);
    }
    fx_mq_client_free(c);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(mq_client_close_races_open, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_member_id_allocator_reclaimed, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_client_close_strong_error, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_rollback_verified, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_second_consumer_refused, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_global_lease_lost_closes_consumer, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpmc_unconfirmed_member_lease_fences_get, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mq_attempts_write_fenced, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_attempts_pruned, test_setup, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
