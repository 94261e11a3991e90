/* test_chanq_prod.c -- the channel's producer (bridge/chanq_prod.h) against a real etcd: the
 * pipelined submit, its in-order completions per stream, its in-flight bound.
 *
 * chanq_submit_order_per_stream: 4 consumers (4 ready streams), 160 batches submitted as fast as
 *   the producer takes them (up to 4 in flight, every third batch's completion slow on purpose, as a
 *   PubAck publish can be): per stream (sub-MPSC, producer index) the completions report ids in
 *   the order they were assigned; every batch gets exactly one last completion; batches were in
 *   flight together (peak >= 2); and every value is delivered under the id its completion
 *   reported (ids and completions agree).
 * chanq_submit_reroute_keeps_order: 3 consumers that do not consume, capacity 40 per sub-MPSC,
 *   one batch at a time (the inline path): batches of 7 no longer fit where they start and are
 *   split, the rest rerouted to another sub-MPSC (several stored runs per batch): still in order
 *   per stream, every value delivered under its reported id; once everything is full, the last
 *   completion reports the unstored range with FX_EFULL.
 * chanq_submit_bound_refuses: bound 2 with 4 ready streams, every put txn held at a proxy: two
 *   submits are in flight, room is 0, a third is refused (FX_EFULL, nothing taken, no callback,
 *   counted in refused); released, both complete, the room hook ran and the room is back.
 * chanq_prod_reopens_after_lease_loss: the producer's member lease revoked behind its back: the
 *   next submit's last completion hands the whole batch back with FX_ELEASE_LOST, the keeper
 *   reopens the producer (a new member, reopens 1), the batch submitted again is stored, and
 *   every value is delivered once under its reported id.
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

#include "chanq_prod.h"
#include "etcd.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "fx_time.h"
#include "keys.h"
#include "lease_mgr.h"
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

static fx_mq_client *client_new(const char *const *eps, const char *root)
{
    fx_mq_client_opts o = {.etcd = {.endpoints = eps, .n_endpoints = 1}, .root = root,
                           .long_lease_ttl_s = 6, .min_ttl_s = 2, .op_timeout_ms = OP_MS,
                           .close_timeout_ms = 1000};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    return c;
}

/* ---- recording completions -------------------------------------------------------------------- */

#define MAXB 200
#define MAXV 16

typedef struct rec {
    fx_mq_msg_id id;
    int batch;
    size_t idx;
} rec;

typedef struct tctx tctx;

typedef struct tbatch {
    tctx *t;
    int no;
    size_t n;
    fx_slice vals[MAXV];
    char text[MAXV][24];
    int runs, lasts;
    size_t stored, last_first, last_n;
    fx_err last_e;
    fx_mq_msg_id ids[MAXV]; /* reported per value */
} tbatch;

struct tctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rec log[MAXB * MAXV];
    size_t nlog;
    int lasts, room_calls;
    int slow_ms; /* every third batch's stored runs take this long to complete */
    bool bad_range;
    tbatch b[MAXB];
};

static void t_done(void *arg, const fx_chanq_done *d)
{
    tbatch *b = arg;
    tctx *t = b->t;
    /* The shape of the fault: every third batch's callback is slow (a PubAck publish that
     * blocks), so a later batch of the same stream would overtake it if it could. */
    if (!d->last && t->slow_ms && b->no % 3 == 0) fxt_nap_ms(t->slow_ms);
    pthread_mutex_lock(&t->mu);
    if (d->first + d->n > b->n) t->bad_range = true;
    if (!d->last) {
        for (size_t i = 0; i < d->n && d->first + i < b->n; i++) {
            t->log[t->nlog++] = (rec){.id = d->ids[i], .batch = b->no, .idx = d->first + i};
            b->ids[d->first + i] = d->ids[i];
        }
        b->runs++;
        b->stored += d->n;
    } else {
        b->lasts++;
        t->lasts++;
        b->last_first = d->first;
        b->last_n = d->n;
        b->last_e = d->e;
    }
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void t_room(void *arg)
{
    tctx *t = arg;
    pthread_mutex_lock(&t->mu);
    t->room_calls++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static tctx *tctx_new(void)
{
    tctx *t = calloc(1, sizeof *t);
    assert_non_null(t);
    pthread_mutex_init(&t->mu, NULL);
    fx_cond_init_monotonic(&t->cv);
    return t;
}

static void tctx_free(tctx *t)
{
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static void batch_fill(tctx *t, int no, size_t n)
{
    tbatch *b = &t->b[no];
    b->t = t;
    b->no = no;
    b->n = n;
    for (size_t i = 0; i < n; i++) {
        snprintf(b->text[i], sizeof b->text[i], "b%d.%zu", no, i);
        b->vals[i] = FX_SLICE_STR(b->text[i]);
    }
}

/* Submit batch no once the producer has room (waits for the room hook, bounded). */
static fx_err submit_when_room(fx_chanq_prod *p, tctx *t, int no)
{
    int64_t dl = fxt_now_ms() + FXT_MS(10000);
    pthread_mutex_lock(&t->mu);
    while (!fx_chanq_prod_room(p) && fxt_now_ms() < dl) {
        struct timespec ts = fx_deadline_ts(fx_now_ms() + 100);
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    tbatch *b = &t->b[no];
    return fx_chanq_submit(p, b->vals, b->n, fx_now_ms() + FXT_MS(8000), t_done, b);
}

static bool wait_lasts(tctx *t, int want, int ms)
{
    int64_t dl = fxt_now_ms() + FXT_MS(ms);
    pthread_mutex_lock(&t->mu);
    while (t->lasts < want && fxt_now_ms() < dl) {
        struct timespec ts = fx_deadline_ts(fx_now_ms() + 100);
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    bool ok = t->lasts >= want;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

/* Per stream (chan, pidx) the logged ids must come in assigned order: dense and increasing. */
static void check_order_per_stream(tctx *t)
{
    enum { MAXS = 64 };
    int64_t sc[MAXS], sp[MAXS], last[MAXS];
    size_t ns = 0;
    for (size_t i = 0; i < t->nlog; i++) {
        const rec *r = &t->log[i];
        size_t s = 0;
        while (s < ns && !(sc[s] == r->id.chan && sp[s] == r->id.pidx)) s++;
        if (s == ns) {
            assert_true(ns < MAXS);
            sc[ns] = r->id.chan;
            sp[ns] = r->id.pidx;
            last[ns++] = r->id.msg;
            continue;
        }
        if (r->id.msg != last[s] + 1)
            fail_msg("stream %" PRId64 ".%" PRId64 ": completion %zu reports id %" PRId64
                     " (batch %d value %zu) after id %" PRId64 ": not in assigned order",
                     sc[s], sp[s], i, r->id.msg, r->batch, r->idx, last[s]);
        last[s] = r->id.msg;
    }
    fprintf(stderr, "  %zu completions checked over %zu streams\n", t->nlog, ns);
}

/* Drain every consumer: each value must arrive under the id its completion reported. */
static size_t drain_check(tctx *t, fx_mpmc_consumer **cs, int k, size_t want)
{
    size_t total = 0;
    int64_t dl = fxt_now_ms() + FXT_MS(15000);
    while (total < want && fxt_now_ms() < dl)
        for (int i = 0; i < k; i++) {
            fx_mq_delivery d[64];
            size_t got = 0;
            fx_err e = fx_mpmc_get(cs[i], d, 64, &got, 0);
            if (e == FX_ETIMEDOUT) continue;
            CHECK(e);
            for (size_t j = 0; j < got; j++) {
                char buf[32] = {0};
                size_t l = d[j].value.len < sizeof buf - 1 ? d[j].value.len : sizeof buf - 1;
                memcpy(buf, d[j].value.data, l);
                int no = -1;
                size_t idx = 0;
                if (sscanf(buf, "b%d.%zu", &no, &idx) != 2 || no < 0 || no >= MAXB ||
                    idx >= t->b[no].n)
                    fail_msg("unexpected value '%s'", buf);
                const fx_mq_msg_id *want_id = &t->b[no].ids[idx];
                if (want_id->chan != d[j].id.chan || want_id->pidx != d[j].id.pidx ||
                    want_id->msg != d[j].id.msg)
                    fail_msg("value %s delivered as %" PRId64 ".%" PRId64 ".%" PRId64
                             ", its completion reported %" PRId64 ".%" PRId64 ".%" PRId64,
                             buf, d[j].id.chan, d[j].id.pidx, d[j].id.msg, want_id->chan,
                             want_id->pidx, want_id->msg);
                CHECK(fx_mpmc_ack(cs[i], &d[j].id, 1));
                fx_mq_delivery_free(&d[j]);
            }
            total += got;
        }
    return total;
}

static fx_chanq_prod *prod_new(fx_mq_client *c, const char *name, const fx_mq_chan_cfg *chan,
                               unsigned inflight, tctx *t)
{
    fx_chanq_prod_cfg cfg = {.name = name, .chan = *chan, .inflight = inflight,
                             .on_room = t_room, .room_arg = t};
    fx_chanq_prod *p = NULL;
    CHECK(fx_chanq_prod_new(c, &cfg, &p));
    int64_t dl = fxt_now_ms() + FXT_MS(5000);
    while (!fx_chanq_prod_keep(p) && fxt_now_ms() < dl) fxt_nap_ms(20);
    assert_true(fx_chanq_prod_attached(p, NULL, 0));
    return p;
}

static void wait_streams(fx_chanq_prod *p, size_t k)
{
    int64_t dl = fxt_now_ms() + FXT_MS(5000); /* the producer learns ready sub-MPSCs by watch */
    while (fx_chanq_prod_streams(p) < k && fxt_now_ms() < dl) fxt_nap_ms(20);
    assert_int_equal(fx_chanq_prod_streams(p), k);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void chanq_submit_order_per_stream(void **state)
{
    (void)state;
    enum { K = 4, NB = 160 };
    fx_mq_client *c = client_new(G.eps, "/t_cq_order");
    const fx_mq_chan_cfg chan = {.capacity = 100000, .ttl_s = TTL, .weight = 1};
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "order", &chan, &mpmc));
    fx_mpmc_consumer *cs[K];
    for (int i = 0; i < K; i++) CHECK(fx_mpmc_consumer_open(c, mpmc, &cs[i]));
    tctx *t = tctx_new();
    t->slow_ms = 15;
    fx_chanq_prod *p = prod_new(c, "order", &chan, 0, t);
    wait_streams(p, K);
    size_t total = 0;
    for (int i = 0; i < NB; i++) {
        batch_fill(t, i, 1 + (size_t)(i * 7 % MAXV));
        total += t->b[i].n;
        CHECK(submit_when_room(p, t, i));
    }
    assert_true(wait_lasts(t, NB, 20000));
    fx_chanq_prod_stats st;
    fx_chanq_prod_stats_get(p, &st);
    fprintf(stderr, "  %d batches, %zu values; peak in flight %u, refused %" PRIu64 "\n", NB,
            total, st.peak, st.refused);
    assert_false(t->bad_range);
    for (int i = 0; i < NB; i++) {
        assert_int_equal(t->b[i].lasts, 1);
        assert_int_equal(t->b[i].stored, t->b[i].n);
        assert_int_equal(t->b[i].last_n, 0);
    }
    assert_true(st.peak >= 2);
    assert_true(st.peak <= FX_CHANQ_INFLIGHT);
    assert_int_equal(st.submitted, NB);
    check_order_per_stream(t);
    assert_int_equal(drain_check(t, cs, K, total), total);
    fx_chanq_prod_free(p);
    for (int i = 0; i < K; i++) fx_mpmc_consumer_free(cs[i]);
    fx_mq_client_free(c);
    tctx_free(t);
}

static void chanq_submit_reroute_keeps_order(void **state)
{
    (void)state;
    enum { K = 3, CAP = 40, BN = 7 };
    fx_mq_client *c = client_new(G.eps, "/t_cq_reroute");
    const fx_mq_chan_cfg chan = {.capacity = CAP, .ttl_s = TTL, .weight = 1};
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "reroute", &chan, &mpmc));
    fx_mpmc_consumer *cs[K];
    for (int i = 0; i < K; i++) CHECK(fx_mpmc_consumer_open(c, mpmc, &cs[i]));
    tctx *t = tctx_new();
    /* One batch at a time (stored on the submitting thread): with several in flight, a batch
     * whose sub-MPSC fills finds the others reserved and may end FX_EFULL instead of moving on;
     * the order under many in flight is chanq_submit_order_per_stream's. */
    fx_chanq_prod *p = prod_new(c, "reroute", &chan, 1, t);
    wait_streams(p, K);
    /* K * CAP = 120 places: 17 batches of 7 = 119 fit in all, but not where they start. */
    const int nb = (K * CAP) / BN;
    size_t total = 0;
    for (int i = 0; i < nb; i++) {
        batch_fill(t, i, BN);
        total += BN;
        CHECK(submit_when_room(p, t, i));
    }
    assert_true(wait_lasts(t, nb, 20000));
    assert_false(t->bad_range);
    int split = 0;
    for (int i = 0; i < nb; i++) {
        assert_int_equal(t->b[i].lasts, 1);
        if (t->b[i].stored != t->b[i].n)
            fail_msg("batch %d: %zu of %zu stored (last: %s)", i, t->b[i].stored, t->b[i].n,
                     fx_errname(t->b[i].last_e));
        if (t->b[i].runs > 1) split++;
    }
    fprintf(stderr, "  %d batches of %d, %d split over sub-MPSCs\n", nb, BN, split);
    assert_true(split >= 1);
    check_order_per_stream(t);
    /* Full now (119 of 120): a batch of 7 stores 1, the last completion reports the other 6. */
    batch_fill(t, nb, BN);
    CHECK(submit_when_room(p, t, nb));
    assert_true(wait_lasts(t, nb + 1, 20000));
    const tbatch *fb = &t->b[nb];
    fprintf(stderr, "  full: stored %zu, last completion [%zu, +%zu) %s\n", fb->stored,
            fb->last_first, fb->last_n, fx_errname(fb->last_e));
    assert_int_equal(fb->last_e, FX_EFULL);
    assert_int_equal(fb->last_first, fb->stored);
    assert_int_equal(fb->last_first + fb->last_n, BN);
    total += fb->stored;
    check_order_per_stream(t);
    assert_int_equal(drain_check(t, cs, K, total), total);
    fx_chanq_prod_free(p);
    for (int i = 0; i < K; i++) fx_mpmc_consumer_free(cs[i]);
    fx_mq_client_free(c);
    tctx_free(t);
}

static void chanq_submit_bound_refuses(void **state)
{
    (void)state;
    enum { K = 4, BOUND = 2 };
    const char *root = "/t_cq_bound";
    fx_mq_client *c = client_new(G.eps, root);
    const fx_mq_chan_cfg chan = {.capacity = 1000, .ttl_s = TTL, .weight = 1};
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "bound", &chan, &mpmc));
    fx_mpmc_consumer *cs[K];
    for (int i = 0; i < K; i++) CHECK(fx_mpmc_consumer_open(c, mpmc, &cs[i]));
    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    fx_mq_client_opts o = {.etcd = {.endpoints = fxt_proxy_eps(px), .n_endpoints = 1},
                           .root = root, .long_lease_ttl_s = 6, .min_ttl_s = 2,
                           .op_timeout_ms = 15000, .close_timeout_ms = 1000};
    fx_mq_client *cx = NULL;
    CHECK(fx_mq_client_new(&o, &cx));
    tctx *t = tctx_new();
    fx_chanq_prod *p = prod_new(cx, "bound", &chan, BOUND, t);
    wait_streams(p, K);
    assert_int_equal(fx_chanq_prod_room(p), BOUND);
    for (int i = 0; i < K; i++) { /* warm: binds a sub-producer per stream */
        batch_fill(t, i, 1);
        CHECK(submit_when_room(p, t, i));
    }
    assert_true(wait_lasts(t, K, 10000));
    int64_t dl = fxt_now_ms() + FXT_MS(2000); /* slots go free just after their last completion */
    while (fx_chanq_prod_room(p) != BOUND && fxt_now_ms() < dl) fxt_nap_ms(5);
    assert_int_equal(fx_chanq_prod_room(p), BOUND);

    /* Every put txn held: BOUND batches in flight, the next submit refused. */
    const char *nd[1] = {"request_put"};
    fxt_proxy_hold(px, nd, 1);
    for (int i = K; i < K + BOUND; i++) {
        batch_fill(t, i, 2);
        CHECK(fx_chanq_submit(p, t->b[i].vals, 2, fx_now_ms() + FXT_MS(20000), t_done, &t->b[i]));
    }
    dl = fxt_now_ms() + FXT_MS(5000);
    while (fxt_proxy_held(px) < BOUND && fxt_now_ms() < dl) fxt_nap_ms(10);
    int held = fxt_proxy_held(px);
    unsigned room = fx_chanq_prod_room(p);
    batch_fill(t, K + BOUND, 2);
    fx_err e = fx_chanq_submit(p, t->b[K + BOUND].vals, 2, fx_now_ms() + FXT_MS(20000), t_done,
                               &t->b[K + BOUND]);
    fx_chanq_prod_stats st;
    fx_chanq_prod_stats_get(p, &st);
    pthread_mutex_lock(&t->mu);
    int rooms_before = t->room_calls;
    pthread_mutex_unlock(&t->mu);
    fxt_proxy_hold(px, NULL, 0); /* release before any check: the puts must finish */
    bool done = wait_lasts(t, K + BOUND, 15000);
    fprintf(stderr, "  held txns %d, room %u, third submit %s, in flight %u, refused %" PRIu64 "\n",
            held, room, fx_errname(e), st.in_flight, st.refused);
    assert_int_equal(held, BOUND);
    assert_int_equal(room, 0);
    assert_int_equal(e, FX_EFULL);
    assert_int_equal(st.in_flight, BOUND);
    assert_int_equal(st.refused, 1);
    assert_true(done);
    /* the room hook runs just after each slot went free (after the last completion) */
    dl = fxt_now_ms() + FXT_MS(2000);
    int rooms = 0, lasts = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        rooms = t->room_calls;
        lasts = t->lasts;
        pthread_mutex_unlock(&t->mu);
        if (rooms - rooms_before >= BOUND || fxt_now_ms() >= dl) break;
        fxt_nap_ms(5);
    }
    assert_int_equal(lasts, K + BOUND); /* the refused one never completes */
    assert_int_equal(t->b[K + BOUND].lasts, 0);
    assert_int_equal(rooms - rooms_before, BOUND);
    assert_int_equal(fx_chanq_prod_room(p), BOUND);
    for (int i = K; i < K + BOUND; i++) assert_int_equal(t->b[i].stored, 2);
    fx_chanq_prod_free(p);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    for (int i = 0; i < K; i++) fx_mpmc_consumer_free(cs[i]);
    fx_mq_client_free(c);
    tctx_free(t);
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

static void chanq_prod_reopens_after_lease_loss(void **state)
{
    (void)state;
    const char *root = "/t_cq_reopen";
    fx_mq_client *c = client_new(G.eps, root);
    const fx_mq_chan_cfg chan = {.capacity = 1000, .ttl_s = TTL, .weight = 1};
    int64_t mpmc = -1;
    CHECK(fx_mpmc_resolve(c, "reopen", &chan, &mpmc));
    fx_mpmc_consumer *cs[1];
    CHECK(fx_mpmc_consumer_open(c, mpmc, &cs[0]));
    tctx *t = tctx_new();
    fx_chanq_prod *p = prod_new(c, "reopen", &chan, 0, t);
    batch_fill(t, 0, 2);
    CHECK(submit_when_room(p, t, 0));
    assert_true(wait_lasts(t, 1, 10000));
    assert_int_equal(t->b[0].stored, 2);

    /* Revoke the producer's member lease; wait until its lease manager knows. */
    int64_t member = fx_chanq_prod_member(p);
    fx_mq_keys k;
    CHECK(fx_mq_keys_init(&k, root));
    fx_mq_key role;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_PRODUCER, mpmc, member, &role));
    fx_kv kv = {0};
    CHECK(fx_etcd_get(G.raw, FX_SLICE_STR(role.s), &kv, OP_MS));
    int64_t lease = kv.lease;
    fx_kv_free(&kv);
    expiry_wait ew = {c, 0};
    fx_lease_mgr_stats lst;
    fx_lease_mgr_get_stats(fx_mq_client_leases(c), &lst);
    ew.before = lst.expired;
    CHECK(fx_etcd_lease_revoke(G.raw, lease, OP_MS));
    assert_true(fxt_wait_until(expiry_seen, &ew, FXT_MS(6000)));

    batch_fill(t, 1, 3);
    CHECK(submit_when_room(p, t, 1));
    assert_true(wait_lasts(t, 2, 10000));
    const tbatch *b1 = &t->b[1];
    fprintf(stderr, "  after the revoke: stored %zu, handed back [%zu, +%zu) %s\n", b1->stored,
            b1->last_first, b1->last_n, fx_errname(b1->last_e));
    assert_int_equal(b1->stored, 0);
    assert_int_equal(b1->last_n, 3);
    assert_true(b1->last_e == FX_ELEASE_LOST || b1->last_e == FX_ECLOSED);

    int64_t dl = fxt_now_ms() + FXT_MS(8000);
    while (!fx_chanq_prod_keep(p) && fxt_now_ms() < dl) fxt_nap_ms(50);
    fx_chanq_prod_stats st;
    fx_chanq_prod_stats_get(p, &st);
    int64_t member2 = fx_chanq_prod_member(p);
    fprintf(stderr, "  reopened: member %" PRId64 " -> %" PRId64 ", reopens %" PRIu64 "\n", member,
            member2, st.reopens);
    assert_true(fx_chanq_prod_attached(p, NULL, 0));
    assert_int_equal(st.reopens, 1);
    assert_true(member2 >= 0 && member2 != member);

    pthread_mutex_lock(&t->mu);
    t->b[1].runs = t->b[1].lasts = 0;
    pthread_mutex_unlock(&t->mu);
    CHECK(submit_when_room(p, t, 1));
    assert_true(wait_lasts(t, 3, 10000));
    assert_int_equal(t->b[1].stored, 3);
    assert_int_equal(t->b[1].last_n, 0);
    check_order_per_stream(t);
    assert_int_equal(drain_check(t, cs, 1, 5), 5);
    fx_mq_delivery d[1];
    size_t got = 0;
    assert_int_equal(fx_mpmc_get(cs[0], d, 1, &got, 0), FX_ETIMEDOUT); /* nothing twice */
    fx_chanq_prod_free(p);
    fx_mpmc_consumer_free(cs[0]);
    fx_mq_client_free(c);
    tctx_free(t);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chanq_submit_order_per_stream),
        cmocka_unit_test(chanq_submit_reroute_keeps_order),
        cmocka_unit_test(chanq_submit_bound_refuses),
        cmocka_unit_test(chanq_prod_reopens_after_lease_loss),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
