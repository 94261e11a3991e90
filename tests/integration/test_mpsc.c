/* test_mpsc.c -- the standalone MPSC layer (bridge/mpsc*.c, client.c, idalloc.c) against a real
 * etcd. Channels use ttl 3 s (client min_ttl_s 2).
 *
 * mpsc_roundtrip: create/bind/put/get/ack/flush: payloads deleted, consume offset committed,
 *   membership keys removed by close, per-producer FIFO, ack of an unknown id rejected.
 * mpsc_batch_over_127: one put of 5000 values (40 chunk txns of <= 127 keys, or 2 segments of
 *   <= 4096): ids 0..4999, produce offset 4999, all delivered in order.
 * mpsc_capacity_full_then_close: capacity 2: a 3-value put stores 2 and returns FX_EFULL at its
 *   deadline; a waiting put is released by close at once (FX_ECLOSED).
 * mpsc_gap_skipped: a payload deleted by hand below the produce offset: the consumer skips it with
 *   a counter and keeps going; the commit moves past it.
 * mpsc_put_retry_no_gap: through a proxy that loses chosen put txns in transit (the request: it
 *   never lands; or only etcd's answer: it landed): a put retried within its deadline keeps its
 *   ids either way; a put that gives up with its chunk unconfirmed makes the next put re-read the
 *   produce offset. Delivered ids are contiguous from 0 with the values put (no hole, no reuse).
 *   On a split plane too: the payload a lost chunk left above the offset is removed before its
 *   ids are written again (else a later segment overlaps it and acked messages are skipped).
 * mpsc_payload_lease_revoked: revoking the payload lease: next put FX_ELEASE_LOST, then FX_ECLOSED.
 * mpsc_client_close_closes_endpoints: closing the client root with open endpoints (one get
 *   blocked) closes them (memberships deleted) and later calls return FX_ECLOSED.
 * mpsc_sub_overrides: fx__mpsc_create with parent overrides; sub-producer/consumer bind with the
 *   right overrides works (payloads under the MPMC namespace), wrong overrides -> FX_EPROTO.
 * mpsc_ids_and_cluster_lease: CAS counters return disjoint ranges under concurrency; the chan
 *   counter has no lease; cluster lease reuse; config validation against min_ttl_s.
 * mpsc_member_lease_lost: producer member lease revoked: the next put FX_ELEASE_LOST (membership
 *   compare in the write txn), then FX_ECLOSED; consumer member lease revoked: get reports
 *   FX_ELEASE_LOST once (LeaseManager callback), then FX_ECLOSED.
 * mpsc_long_lease_renewed: the id-allocator lease expired while the meta lives: a bind renews it.
 * mpsc_close_commits_pending_acks: close commits the acked prefix; a new consumer gets exactly
 *   the unacknowledged rest.
 * mpsc_segment_corrupt_skipped: a segment value that does not decode is skipped as a whole
 *   (counter), the next segment is delivered, the commit removes the bad value.
 * mpsc_segment_fetch_bounded: 300 one-message segments drain with a few range reads (a window
 *   of ids each), and a consumer resuming inside a 1000-message segment finds it.
 * Several tests run more than once: with the payload plane sharing the control-plane client (one
 * txn per batch) and with a separate KV client; and in both payload layouts (one segment per
 * batch, the default; one key per message, the reference layout).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fluxon_mq.h"
#include "fx_log.h"
#include "fx_time.h"
#include "mq_int.h"
#include "segment.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"
#include "tests/support/fxt_proxy.h"

#define OP_MS 3000
#define TTL 3

typedef struct ctx {
    fxt_etcd etcd;
    fx_mq_client *cl;
    bool per_key; /* channels use the one-key-per-message layout (else segments) */
} ctx;

#define EXPECT(err, call)                                                                        \
    do {                                                                                         \
        fx_err chk_e_ = (call);                                                                  \
        if (chk_e_ != (err))                                                                     \
            fail_msg("%s: got %s (%s), want %s", #call, fx_errname(chk_e_), fx_err_detail(),     \
                     fx_errname(err));                                                           \
    } while (0)

static fx_mq_client *new_client_kv(ctx *x, int op_ms, bool kv_apart)
{
    const char *eps[] = {x->etcd.endpoint};
    fx_mq_client_opts o = {.etcd = {.endpoints = eps, .n_endpoints = 1, .connect_timeout_ms = 500},
                           .min_ttl_s = 2,
                           .op_timeout_ms = op_ms,
                           .close_timeout_ms = 1000,
                           .per_message_keys = x->per_key};
    if (kv_apart) { /* its own KV client: payload write and offset advance are separate calls */
        o.kv_endpoints = eps;
        o.n_kv_endpoints = 1;
    }
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    assert_true(c->kv_shared == !kv_apart);
    return c;
}

static fx_mq_client *new_client(ctx *x, int op_ms) { return new_client_kv(x, op_ms, false); }

static int group_setup(void **state)
{
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    ctx *x = calloc(1, sizeof *x);
    if (!x) return -1;
    if (fxt_etcd_start(&x->etcd) != 0) {
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
    fxt_etcd_destroy(&x->etcd);
    free(x);
    return 0;
}

/* Each test gets a fresh client: payload layout (per_key) and payload plane (kv_apart). */
static int setup_with(void **state, bool per_key, bool kv_apart)
{
    ctx *x = *state;
    x->per_key = per_key;
    x->cl = new_client_kv(x, OP_MS, kv_apart);
    return 0;
}

static int test_setup(void **state) { return setup_with(state, false, false); }
static int test_setup_kv_apart(void **state) { return setup_with(state, false, true); }
static int test_setup_per_key(void **state) { return setup_with(state, true, false); }
static int test_setup_per_key_apart(void **state) { return setup_with(state, true, true); }

static int test_teardown(void **state)
{
    ctx *x = *state;
    fx_mq_client_free(x->cl);
    x->cl = NULL;
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static int64_t create_chan(fx_mq_client *c, int64_t capacity)
{
    fx_mq_chan_cfg cfg = {.capacity = capacity, .ttl_s = TTL};
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    assert_true(chan >= 1);
    return chan;
}

static bool key_exists(fx_etcd *e, const fx_mq_key *k)
{
    fx_kv kv = {0};
    fx_err r = fx_etcd_get(e, fx_mq_key_slice(k), &kv, OP_MS);
    fx_kv_free(&kv);
    if (r != FX_OK && r != FX_ENOTFOUND) fail_msg("get %s: %s", k->s, fx_errname(r));
    return r == FX_OK;
}

static int64_t key_int(fx_etcd *e, const fx_mq_key *k, int64_t absent)
{
    fx_kv kv = {0};
    fx_err r = fx_etcd_get(e, fx_mq_key_slice(k), &kv, OP_MS);
    if (r == FX_ENOTFOUND) return absent;
    if (r) fail_msg("get %s: %s", k->s, fx_errname(r));
    int64_t v = 0;
    CHECK(fx_mq_dec_parse(kv.value.data, kv.value.len, INT64_MIN, INT64_MAX, "v", &v));
    fx_kv_free(&kv);
    return v;
}

/* Messages stored under the channel's payload prefix: one per key, or the message count of each
 * segment (read from the values themselves, independent of the offsets the MQ uses). */
static int64_t stored(fx_mq_client *c, int64_t chan)
{
    fx_mq_key pre;
    CHECK(fx_mq_mpsc_payload_prefix_chan(chan, &pre));
    uint8_t end[FX_MQ_KEY_CAP];
    fx_slice ps = fx_mq_key_slice(&pre);
    fx_range_resp rr = {0};
    CHECK(fx_kv_get_range(fx_mq_client_kv(c), ps, (fx_slice){end, fx_prefix_end(ps, end)}, 0,
                          &rr, OP_MS));
    int64_t n = 0;
    for (size_t i = 0; i < rr.n_kvs; i++) {
        fx_seg_iter it;
        n += fx_seg_open(rr.kvs[i].value.data, rr.kvs[i].value.len, &it) == FX_OK ? it.n : 1;
    }
    fx_range_resp_free(&rr);
    return n;
}

/* Payload keys (not messages) under the channel's payload prefix. */
static int64_t payload_keys(fx_mq_client *c, int64_t chan)
{
    fx_mq_key pre;
    CHECK(fx_mq_mpsc_payload_prefix_chan(chan, &pre));
    int64_t n = -1;
    CHECK(fx_kv_count_prefix(fx_mq_client_kv(c), fx_mq_key_slice(&pre), &n, OP_MS));
    return n;
}

static void vals_make(fx_slice *v, char (*buf)[32], size_t n, const char *tag)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(buf[i], 32, "%s-%zu", tag, i);
        v[i] = FX_SLICE_STR(buf[i]);
    }
}

/* Get until `want` messages arrived (or 10 s); acks each; returns the count. */
/* Get (and ack) until `want` messages arrived, in gets of at most `per_get` (0: all of cap). */
static size_t drain_by(fx_mpsc_consumer *cs, fx_mq_delivery *out, size_t cap, size_t want,
                       size_t per_get)
{
    size_t got = 0;
    int64_t dl = fx_now_ms() + 10000;
    while (got < want && fx_now_ms() < dl) {
        size_t n = 0, room = cap - got;
        if (per_get && room > per_get) room = per_get;
        fx_err e = fx_mpsc_get(cs, out + got, room, &n, 500);
        if (e == FX_ETIMEDOUT) continue;
        CHECK(e);
        for (size_t i = 0; i < n; i++) CHECK(fx_mpsc_ack(cs, &out[got + i].id, 1));
        got += n;
    }
    return got;
}

static size_t drain(fx_mpsc_consumer *cs, fx_mq_delivery *out, size_t cap, size_t want)
{
    return drain_by(cs, out, cap, want, 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void mpsc_roundtrip(void **state)
{
    ctx *x = *state;
    fx_etcd *e = fx_mq_client_etcd(x->cl);
    int64_t chan = create_chan(x->cl, 1000);
    fx_mpsc_producer *p1 = NULL, *p2 = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p1));
    CHECK(fx_mpsc_producer_open(x->cl, chan, 3, &p2));
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    int64_t i1 = fx_mpsc_producer_idx(p1), i2 = fx_mpsc_producer_idx(p2);
    assert_true(i1 >= 1 && i2 == i1 + 1);
    const fx_mq_keys *ks = &x->cl->keys;
    fx_mq_key km1, kw2, kcm;
    CHECK(fx_mq_key_producer_member(ks, chan, i1, &km1));
    CHECK(fx_mq_key_producer_weight(ks, chan, i2, &kw2));
    CHECK(fx_mq_key_consumer_member(ks, chan, fx__mpsc_consumer_idx(cs), &kcm));
    assert_true(key_exists(e, &km1));
    assert_int_equal(key_int(e, &kw2, -9), 3);
    assert_true(key_exists(e, &kcm));

    fx_slice v[10];
    char b1[10][32], b2[10][32];
    vals_make(v, b1, 10, "a");
    size_t np = 0;
    fx_mq_msg_id ids[10];
    CHECK(fx_mpsc_put(p1, v, 10, 1000, &np, ids));
    assert_int_equal(np, 10);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(ids[i].msg, i);
        assert_int_equal(ids[i].pidx, i1);
        assert_int_equal(ids[i].chan, chan);
    }
    vals_make(v, b2, 10, "b");
    CHECK(fx_mpsc_put(p2, v, 10, 1000, &np, NULL));
    assert_int_equal(stored(x->cl, chan), 20);

    fx_mq_delivery out[32];
    size_t got = 0;
    int64_t dl = fx_now_ms() + 10000;
    while (got < 20 && fx_now_ms() < dl) {
        size_t n = 0;
        fx_err r = fx_mpsc_get(cs, out + got, 3, &n, 500); /* small batches: round robin */
        if (r == FX_ETIMEDOUT) continue;
        CHECK(r);
        assert_true(n >= 1 && n <= 3);
        got += n;
    }
    assert_int_equal(got, 20);
    int64_t next1 = 0, next2 = 0;
    for (size_t i = 0; i < got; i++) { /* per-producer FIFO, exact content */
        char want[32];
        if (out[i].id.pidx == i1) {
            assert_int_equal(out[i].id.msg, next1);
            snprintf(want, sizeof want, "a-%lld", (long long)next1++);
        } else {
            assert_int_equal(out[i].id.pidx, i2);
            assert_int_equal(out[i].id.msg, next2);
            snprintf(want, sizeof want, "b-%lld", (long long)next2++);
        }
        assert_int_equal(out[i].value.len, strlen(want));
        assert_memory_equal(out[i].value.data, want, strlen(want));
    }
    /* nothing more; an id never handed out is rejected */
    size_t n = 9;
    EXPECT(FX_ETIMEDOUT, fx_mpsc_get(cs, out + got, 4, &n, 100));
    assert_int_equal(n, 0);
    fx_mq_msg_id bogus = {chan, i1, 10};
    EXPECT(FX_EINVAL, fx_mpsc_ack(cs, &bogus, 1));
    /* ack all but p1's id 5: p1 commits to 5, p2 to 10 */
    for (size_t i = 0; i < got; i++)
        if (!(out[i].id.pidx == i1 && out[i].id.msg == 5)) CHECK(fx_mpsc_ack(cs, &out[i].id, 1));
    CHECK(fx_mpsc_flush(cs, 3000));
    fx_mq_key co1, co2, po1;
    CHECK(fx_mq_key_consume_offset(ks, chan, i1, &co1));
    CHECK(fx_mq_key_consume_offset(ks, chan, i2, &co2));
    CHECK(fx_mq_key_produce_offset(ks, chan, i1, &po1));
    assert_int_equal(key_int(e, &co1, -1), 5);
    assert_int_equal(key_int(e, &co2, -1), 10);
    assert_int_equal(key_int(e, &po1, -9), 9);
    int64_t bl = -1;
    CHECK(fx__mpsc_backlog(p1, &bl));
    assert_int_equal(bl, 5);
    /* per key: ids 5..9 of p1; segments: p1's whole segment until its id 5 is acked */
    assert_int_equal(stored(x->cl, chan), x->per_key ? 5 : 10);
    for (size_t i = 0; i < got; i++)
        if (out[i].id.pidx == i1 && out[i].id.msg == 5) CHECK(fx_mpsc_ack(cs, &out[i].id, 1));
    CHECK(fx_mpsc_flush(cs, 3000));
    assert_int_equal(key_int(e, &co1, -1), 10);
    assert_int_equal(stored(x->cl, chan), 0);
    fx__mpsc_stats st;
    fx__mpsc_consumer_stats(cs, &st);
    assert_int_equal(st.got_msgs, 20);
    assert_int_equal(st.skipped_ids, 0);
    for (size_t i = 0; i < got; i++) fx_mq_delivery_free(&out[i]);

    CHECK(fx_mpsc_producer_close(p1));
    CHECK(fx_mpsc_producer_close(p1)); /* idempotent */
    EXPECT(FX_ECLOSED, fx_mpsc_put(p1, v, 1, 100, &np, NULL));
    assert_false(key_exists(e, &km1));
    CHECK(fx_mpsc_consumer_close(cs));
    assert_true(fx__mpsc_consumer_membership_deleted(cs));
    assert_false(key_exists(e, &kcm));
    EXPECT(FX_ECLOSED, fx_mpsc_get(cs, out, 1, &n, 10));
    fx_mpsc_producer_free(p1);
    fx_mpsc_producer_free(p2);
    fx_mpsc_consumer_free(cs);
    assert_false(key_exists(e, &kw2));

    /* a new consumer resumes at the committed offsets: nothing to redeliver */
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    EXPECT(FX_ETIMEDOUT, fx_mpsc_get(cs, out, 4, &n, 300));
    fx_mpsc_consumer_free(cs);
}

static void mpsc_batch_over_127(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 100000);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    enum { N = 5000 };
    static char buf[N][32];
    static fx_slice v[N];
    vals_make(v, buf, N, "m");
    static fx_mq_msg_id ids[N];
    size_t np = 0;
    fx__mpsc_stats st0, st1;
    fx__mpsc_producer_stats(p, &st0);
    CHECK(fx_mpsc_put(p, v, N, 10000, &np, ids));
    fx__mpsc_producer_stats(p, &st1);
    assert_int_equal(np, N);
    /* per key: 39 x 127 + 47; segments: 4096 + 904, i.e. two payload keys */
    assert_int_equal(st1.put_txns - st0.put_txns, x->per_key ? 40 : 2);
    assert_int_equal(payload_keys(x->cl, chan), x->per_key ? N : 2);
    for (int i = 0; i < N; i++) assert_int_equal(ids[i].msg, i);
    fx_mq_key po;
    CHECK(fx_mq_key_produce_offset(&x->cl->keys, chan, fx_mpsc_producer_idx(p), &po));
    assert_int_equal(key_int(fx_mq_client_etcd(x->cl), &po, -9), N - 1);
    assert_int_equal(stored(x->cl, chan), N);
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    static fx_mq_delivery out[N];
    size_t got = drain(cs, out, N, N);
    assert_int_equal(got, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].id.msg, i);
        char want[32];
        snprintf(want, sizeof want, "m-%d", i);
        assert_memory_equal(out[i].value.data, want, strlen(want) + 1); /* NUL-terminated */
        fx_mq_delivery_free(&out[i]);
    }
    CHECK(fx_mpsc_flush(cs, 3000));
    assert_int_equal(stored(x->cl, chan), 0);
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
}

typedef struct put_arg {
    fx_mpsc_producer *p;
    int timeout_ms;
    fx_err result;
    size_t n_put;
    int64_t ms;
    atomic_bool done;
} put_arg;

static void *put_thread(void *a_)
{
    put_arg *a = a_;
    fx_slice v = FX_SLICE_STR("late");
    int64_t t0 = fx_now_ms();
    a->result = fx_mpsc_put(a->p, &v, 1, a->timeout_ms, &a->n_put, NULL);
    a->ms = fx_now_ms() - t0;
    atomic_store(&a->done, true);
    return NULL;
}

typedef struct waits_arg {
    fx_mpsc_producer *p;
    uint64_t before;
} waits_arg;

static bool waits_started(void *arg)
{
    waits_arg *w = arg;
    fx__mpsc_stats st;
    fx__mpsc_producer_stats(w->p, &st);
    return st.full_waits > w->before;
}

static void mpsc_capacity_full_then_close(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 2);
    fx_mpsc_producer *p = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    fx_slice v[3] = {FX_SLICE_STR("x0"), FX_SLICE_STR("x1"), FX_SLICE_STR("x2")};
    size_t np = 9;
    fx_mq_msg_id ids[3];
    int64_t t0 = fx_now_ms();
    EXPECT(FX_EFULL, fx_mpsc_put(p, v, 3, 600, &np, ids));
    int64_t took = fx_now_ms() - t0;
    assert_int_equal(np, 2); /* partial batch returned, not dropped */
    assert_int_equal(ids[1].msg, 1);
    assert_true(took >= 550 && took < 3000);
    assert_int_equal(stored(x->cl, chan), 2);
    /* try_put: no wait at all */
    t0 = fx_now_ms();
    EXPECT(FX_EFULL, fx__mpsc_try_put(p, v, 1, &np, NULL));
    assert_int_equal(np, 0);
    assert_true(fx_now_ms() - t0 < 1000);
    int64_t bl = -1;
    CHECK(fx__mpsc_backlog(p, &bl));
    assert_int_equal(bl, 2);
    /* a waiting put is released by close at once */
    fx__mpsc_stats st;
    fx__mpsc_producer_stats(p, &st);
    assert_int_equal(st.full_errors, 2);
    waits_arg w = {p, st.full_waits};
    put_arg a = {.p = p, .timeout_ms = 20000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, put_thread, &a), 0);
    bool waiting = fxt_wait_until(waits_started, &w, 5000);
    t0 = fx_now_ms();
    fx_err close_err = fx_mpsc_producer_close(p); /* releases the put whether it waits or not */
    pthread_join(th, NULL); /* joined before a check can leave this frame (a lives here) */
    int64_t rel = fx_now_ms() - t0;
    assert_true(waiting);
    CHECK(close_err);
    print_message("waiting put released %lld ms after close (put waited %lld ms)\n",
                  (long long)rel, (long long)a.ms);
    assert_int_equal(a.result, FX_ECLOSED);
    assert_int_equal(a.n_put, 0);
    assert_true(rel < FXT_MS(1500));
    fx_mpsc_producer_free(p);
}

static void mpsc_gap_skipped(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 100);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    fx_slice v[6];
    char b[6][32];
    vals_make(v, b, 6, "g");
    size_t np = 0;
    int64_t pidx = fx_mpsc_producer_idx(p);
    fx_mq_key hole;
    int64_t want[4] = {0, 1, 3, 4};
    if (x->per_key) {
        CHECK(fx_mpsc_put(p, v, 6, 1000, &np, NULL));
        CHECK(fx_mq_mpsc_payload_key(chan, pidx, 2, &hole));
        CHECK(fx_kv_delete(fx_mq_client_kv(x->cl), fx_mq_key_slice(&hole), OP_MS));
        CHECK(fx_mq_mpsc_payload_key(chan, pidx, 5, &hole)); /* a hole at the end, too */
        CHECK(fx_kv_delete(fx_mq_client_kv(x->cl), fx_mq_key_slice(&hole), OP_MS));
    } else { /* segments [0,1] [2] [3,4] [5]: delete [2] and the last one */
        size_t sizes[4] = {2, 1, 2, 1}, at = 0;
        for (int i = 0; i < 4; i++) {
            CHECK(fx_mpsc_put(p, v + at, sizes[i], 1000, &np, NULL));
            at += sizes[i];
        }
        assert_int_equal(payload_keys(x->cl, chan), 4);
        CHECK(fx_mq_mpsc_payload_key(chan, pidx, 2, &hole));
        CHECK(fx_kv_delete(fx_mq_client_kv(x->cl), fx_mq_key_slice(&hole), OP_MS));
        CHECK(fx_mq_mpsc_payload_key(chan, pidx, 5, &hole));
        CHECK(fx_kv_delete(fx_mq_client_kv(x->cl), fx_mq_key_slice(&hole), OP_MS));
    }
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    fx_mq_delivery out[8];
    size_t got = drain(cs, out, 8, 4);
    assert_int_equal(got, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i].id.msg, want[i]);
    fx__mpsc_stats st;
    fx__mpsc_consumer_stats(cs, &st);
    assert_int_equal(st.skipped_ids, 2);
    CHECK(fx_mpsc_flush(cs, 3000));
    fx_mq_key co;
    CHECK(fx_mq_key_consume_offset(&x->cl->keys, chan, pidx, &co));
    assert_int_equal(key_int(fx_mq_client_etcd(x->cl), &co, -1), 6);
    /* the consumer keeps going */
    CHECK(fx_mpsc_put(p, v, 1, 1000, &np, NULL));
    got = drain(cs, out + 4, 4, 1);
    assert_int_equal(got, 1);
    assert_int_equal(out[4].id.msg, 6);
    for (int i = 0; i < 5; i++) fx_mq_delivery_free(&out[i]);
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
}

/* Put one chunk of `n` values "<tag>-<i>" (remembered in vals[id] for the final check); returns
 * the put's result and the first id it was given (-1: none). */
#define RETRY_IDS 64
typedef struct retry_vals {
    char v[RETRY_IDS][32];
    bool set[RETRY_IDS];
} retry_vals;

static fx_err retry_put(fx_mpsc_producer *p, retry_vals *rv, const char *tag, size_t n,
                        int64_t *first_id)
{
    char b[8][32];
    fx_slice v[8];
    fx_mq_msg_id ids[8];
    size_t np = 0;
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        snprintf(b[i], sizeof b[i], "%s-%zu", tag, i);
        v[i] = (fx_slice){b[i], strlen(b[i])};
    }
    fx_err e = fx_mpsc_put(p, v, n, 1500, &np, ids);
    *first_id = np ? ids[0].msg : -1;
    for (size_t i = 0; i < np; i++) {
        assert_int_equal(ids[i].msg, ids[0].msg + (int64_t)i);
        assert_true(ids[i].msg >= 0 && ids[i].msg < RETRY_IDS);
        snprintf(rv->v[ids[i].msg], sizeof rv->v[0], "%s", b[i]);
        rv->set[ids[i].msg] = true;
    }
    return e;
}

static void mpsc_put_retry_no_gap(void **state)
{
    ctx *x = *state;
    /* Every etcd call of this client goes through the proxy, which loses chosen put txns in
     * transit: either the request (it never lands) or only etcd's answer (it landed). The producer
     * sees the same transport error both ways and must find out which before choosing ids. */
    fxt_proxy *px = fxt_proxy_start(x->etcd.client_port);
    assert_non_null(px);
    fx_mq_client_opts o = {.etcd = {.endpoints = fxt_proxy_eps(px), .n_endpoints = 1,
                                    .connect_timeout_ms = 500},
                           .min_ttl_s = 2,
                           .op_timeout_ms = 700,
                           .close_timeout_ms = 1000,
                           .per_message_keys = x->per_key};
    const char *direct[] = {x->etcd.endpoint};
    if (!x->cl->kv_shared) { /* split plane: payloads through their own client, not the proxy */
        o.kv_endpoints = direct;
        o.n_kv_endpoints = 1;
    }
    fx_mq_client *cl = NULL;
    CHECK(fx_mq_client_new(&o, &cl));
    assert_true(cl->kv_shared == x->cl->kv_shared);
    int64_t chan = create_chan(cl, 1000);
    fx_mpsc_producer *p = NULL;
    CHECK(fx_mpsc_producer_open(cl, chan, 0, &p));
    fx_mq_key off;
    CHECK(fx_mq_key_produce_offset(&cl->keys, chan, fx_mpsc_producer_idx(p), &off));
    char off64[FXT_PROXY_NEEDLE_MAX];
    fxt_proxy_b64(off.s, off64, sizeof off64);
    const char *put_txn[2] = {off64, "\"compare\""}; /* a put txn (an offset read has no compare) */
    static retry_vals rv;
    memset(&rv, 0, sizeof rv);
    int64_t id = -1;
    fx__mpsc_stats st;

    CHECK(retry_put(p, &rv, "warm", 2, &id)); /* ids 0, 1 */
    assert_int_equal(id, 0);

    /* 1. The answer of the next put txn is lost; the txn landed. Within the same put the retry
     * must see the offset already at the chunk's last id: success, ids 2..4, stored once. */
    fxt_proxy_fail_next(px, FXT_PROXY_DROP_ANSWER, put_txn, 2, 1);
    CHECK(retry_put(p, &rv, "landed", 3, &id));
    assert_int_equal(fxt_proxy_failed(px, FXT_PROXY_DROP_ANSWER), 1);
    assert_int_equal(id, 2);

    /* 2. The next put txn never reaches etcd: the retry writes the same ids 5..7. */
    fxt_proxy_fail_next(px, FXT_PROXY_DROP_REQUEST, put_txn, 2, 1);
    CHECK(retry_put(p, &rv, "lost", 3, &id));
    assert_int_equal(fxt_proxy_failed(px, FXT_PROXY_DROP_REQUEST), 1);
    assert_int_equal(id, 5);

    /* 3. Every answer is lost until the put gives up: its chunk (ids 8..10) landed unconfirmed.
     * The next put re-reads the produce offset and continues at 11: no reuse of 8..10. */
    fxt_proxy_fail_next(px, FXT_PROXY_DROP_ANSWER, put_txn, 2, -1);
    fx_err e = retry_put(p, &rv, "unconfirmed", 3, &id);
    fxt_proxy_fail_next(px, FXT_PROXY_DROP_ANSWER, NULL, 0, 0);
    print_message("put with every answer lost: %s\n", fx_errname(e));
    assert_true(e == FX_ETIMEDOUT || e == FX_EUNAVAIL);
    assert_int_equal(id, -1);
    assert_true(fxt_proxy_failed(px, FXT_PROXY_DROP_ANSWER) >= 2);
    for (int i = 0; i < 3; i++) { /* what landed: the first attempt's values */
        snprintf(rv.v[8 + i], sizeof rv.v[0], "unconfirmed-%d", i);
        rv.set[8 + i] = true;
    }
    fx__mpsc_producer_stats(p, &st);
    uint64_t rereads = st.offset_rereads;
    CHECK(retry_put(p, &rv, "after-unconfirmed", 2, &id));
    fx__mpsc_producer_stats(p, &st);
    assert_true(st.offset_rereads > rereads);
    assert_int_equal(id, 11);

    /* 4. Every request is lost until the put gives up: nothing landed. The next put re-reads the
     * offset and writes ids 13.. (no hole where the lost chunk would have been). */
    fxt_proxy_fail_next(px, FXT_PROXY_DROP_REQUEST, put_txn, 2, -1);
    e = retry_put(p, &rv, "never", 2, &id);
    fxt_proxy_fail_next(px, FXT_PROXY_DROP_REQUEST, NULL, 0, 0);
    assert_true(e == FX_ETIMEDOUT || e == FX_EUNAVAIL);
    assert_int_equal(id, -1);
    /* On a split plane the lost chunk's payload (ids 13..14, a segment keyed 14) was written
     * before its offset txn was lost. The next put takes ids 13..15: the re-read must remove the
     * stale payload first, or the consumer takes the stale segment for 13..14 and skips the acked
     * one [13, 15] as overlapping it (id 15 lost, 13..14 with values never acked). */
    CHECK(retry_put(p, &rv, "after-never", 3, &id));
    assert_int_equal(id, 13);
    CHECK(retry_put(p, &rv, "past-never", 3, &id));
    assert_int_equal(id, 16);

    /* Every id 0..18 delivered once, contiguous, each with the value its put wrote. */
    enum { WANT = 19 };
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_consumer_open(cl, chan, &cs));
    static fx_mq_delivery out[RETRY_IDS];
    size_t got = drain(cs, out, RETRY_IDS, WANT);
    assert_int_equal(got, WANT);
    for (size_t i = 0; i < got; i++) {
        assert_int_equal(out[i].id.msg, (int64_t)i); /* contiguous: no hole, no reuse */
        assert_true(rv.set[i]);
        assert_int_equal(out[i].value.len, strlen(rv.v[i]));
        assert_memory_equal(out[i].value.data, rv.v[i], strlen(rv.v[i]));
        fx_mq_delivery_free(&out[i]);
    }
    fx__mpsc_consumer_stats(cs, &st);
    assert_int_equal(st.skipped_ids, 0);
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
    fx_mq_client_free(cl);
    fxt_proxy_stop(px);
}

static void mpsc_payload_lease_revoked(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 100);
    fx_mpsc_producer *p = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    fx_slice v = FX_SLICE_STR("before");
    size_t np = 0;
    CHECK(fx_mpsc_put(p, &v, 1, 1000, &np, NULL));
    fx_mq_key mk;
    CHECK(fx_mq_key_chan_meta(&x->cl->keys, chan, &mk));
    fx_kv kv = {0};
    CHECK(fx_etcd_get(fx_mq_client_etcd(x->cl), fx_mq_key_slice(&mk), &kv, OP_MS));
    fx_mq_chan_meta meta;
    CHECK(fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &meta));
    fx_kv_free(&kv);
    CHECK(fx_etcd_lease_revoke(fx_mq_client_etcd(x->cl), meta.payload_lease_id, OP_MS));
    v = FX_SLICE_STR("after");
    EXPECT(FX_ELEASE_LOST, fx_mpsc_put(p, &v, 1, 1000, &np, NULL));
    assert_int_equal(np, 0);
    EXPECT(FX_ECLOSED, fx_mpsc_put(p, &v, 1, 1000, &np, NULL));
    assert_int_equal(fx__mpsc_producer_fault(p), FX_ELEASE_LOST);
    /* the membership key was deleted by the self-close */
    fx_mq_key pm;
    CHECK(fx_mq_key_producer_member(&x->cl->keys, chan, fx_mpsc_producer_idx(p), &pm));
    assert_false(key_exists(fx_mq_client_etcd(x->cl), &pm));
    CHECK(fx_mpsc_producer_close(p));
    fx_mpsc_producer_free(p);
}

typedef struct get_arg {
    fx_mpsc_consumer *c;
    fx_err result;
    atomic_bool started, done;
} get_arg;

static bool get_started(void *a) { return atomic_load(&((get_arg *)a)->started); }

static void *get_thread(void *a_)
{
    get_arg *a = a_;
    fx_mq_delivery d[2];
    size_t n = 0;
    atomic_store(&a->started, true);
    a->result = fx_mpsc_get(a->c, d, 2, &n, 20000);
    for (size_t i = 0; i < n; i++) fx_mq_delivery_free(&d[i]);
    atomic_store(&a->done, true);
    return NULL;
}

static void mpsc_client_close_closes_endpoints(void **state)
{
    ctx *x = *state;
    fx_mq_client *cl = new_client(x, OP_MS);
    fx_etcd *e = fx_mq_client_etcd(x->cl); /* observe with the other client */
    int64_t chan = create_chan(cl, 100);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(cl, chan, 0, &p));
    CHECK(fx_mpsc_consumer_open(cl, chan, &cs));
    fx_mq_key pm, cm;
    CHECK(fx_mq_key_producer_member(&x->cl->keys, chan, fx_mpsc_producer_idx(p), &pm));
    CHECK(fx_mq_key_consumer_member(&x->cl->keys, chan, fx__mpsc_consumer_idx(cs), &cm));
    assert_true(key_exists(e, &pm) && key_exists(e, &cm));
    get_arg a = {.c = cs};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, get_thread, &a), 0);
    /* the get has begun (a flag, polled with a deadline) and is blocked on the empty channel:
     * not returned after an observation window (it returns on a message, its 20 s timeout or
     * close) */
    bool started = fxt_wait_until(get_started, &a, 5000);
    fx_sleep_ms(100);
    bool blocked = !atomic_load(&a.done);
    int64_t t0 = fx_now_ms();
    fx_err close_err = fx_mq_client_close(cl);
    pthread_join(th, NULL); /* joined before a check can leave this frame (a lives here) */
    int64_t took = fx_now_ms() - t0;
    assert_true(started);
    assert_true(blocked);
    CHECK(close_err);
    print_message("client close with 2 endpoints and a blocked get: %lld ms\n", (long long)took);
    assert_true(took < FXT_MS(3000));
    assert_int_equal(a.result, FX_ECLOSED);
    assert_false(key_exists(e, &pm));
    assert_false(key_exists(e, &cm));
    fx_slice v = FX_SLICE_STR("x");
    size_t np = 0;
    EXPECT(FX_ECLOSED, fx_mpsc_put(p, &v, 1, 100, &np, NULL));
    fx_mq_delivery d;
    EXPECT(FX_ECLOSED, fx_mpsc_get(cs, &d, 1, &np, 10));
    CHECK(fx_mq_client_close(cl)); /* idempotent */
    fx_mpsc_producer *p2 = NULL;
    EXPECT(FX_ECLOSED, fx_mpsc_producer_open(cl, chan, 0, &p2));
    fx_mq_chan_cfg cfg = {.capacity = 1, .ttl_s = TTL};
    int64_t ch2;
    EXPECT(FX_ECLOSED, fx_mpsc_create(cl, &cfg, &ch2));
    fx_mpsc_producer_free(p);
    fx_mpsc_consumer_free(cs);
    fx_mq_client_free(cl);
}

static void mpsc_sub_overrides(void **state)
{
    ctx *x = *state;
    fx_mq_client *c = x->cl;
    int64_t gl = 0, ml = 0, pl = 0;
    CHECK(fx__mq_grant(c, TTL, &gl));
    CHECK(fx__mq_grant(c, TTL, &ml));
    CHECK(fx_kv_allocate_lease(fx_mq_client_kv(c), TTL, &pl, OP_MS));
    fx_lease *hg = NULL, *hm = NULL, *hp = NULL; /* the "MPMC" keeps its leases alive */
    CHECK(fx__mq_hold(c, false, TTL, gl, true, NULL, NULL, &hg));
    CHECK(fx__mq_hold(c, false, TTL, ml, true, NULL, NULL, &hm));
    CHECK(fx__mq_hold(c, true, TTL, pl, true, NULL, NULL, &hp));
    fx__mpsc_parent par = {.mpmc = 77, .global_lease = gl, .member_lease = ml,
                           .payload_lease = pl, .member = 5, .ttl_s = TTL};
    fx_mq_chan_cfg cfg = {.capacity = 10, .ttl_s = TTL};
    int64_t chan = -1;
    CHECK(fx__mpsc_create(c, &cfg, &par, &chan));
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    fx__mpsc_parent bad = par;
    bad.payload_lease = pl + 1;
    EXPECT(FX_EPROTO, fx__mpsc_producer_open_sub(c, chan, 0, &bad, &p));
    assert_null(p);
    bad = par;
    bad.global_lease = gl + 1;
    EXPECT(FX_EPROTO, fx__mpsc_consumer_open_sub(c, chan, &bad, &cs));
    assert_null(cs);
    CHECK(fx__mpsc_producer_open_sub(c, chan, 0, &par, &p));
    assert_int_equal(fx_mpsc_producer_idx(p), 5);
    /* a second sub-producer of the same member on the same channel is refused */
    fx_mpsc_producer *p2 = NULL;
    EXPECT(FX_EEXISTS, fx__mpsc_producer_open_sub(c, chan, 0, &(fx__mpsc_parent){.mpmc = 77,
        .global_lease = gl, .member_lease = gl, .payload_lease = pl, .member = 5, .ttl_s = TTL},
        &p2));
    CHECK(fx__mpsc_consumer_open_sub(c, chan, &par, &cs));
    fx_slice v[2] = {FX_SLICE_STR("s0"), FX_SLICE_STR("s1")};
    size_t np = 0;
    CHECK(fx__mpsc_try_put(p, v, 2, &np, NULL));
    fx_mq_key pre;
    CHECK(fx_mq_payload_prefix_mpsc(77, chan, &pre));
    int64_t cnt = -1;
    CHECK(fx_kv_count_prefix(fx_mq_client_kv(c), fx_mq_key_slice(&pre), &cnt, OP_MS));
    assert_int_equal(cnt, x->per_key ? 2 : 1); /* two messages: two keys, or one segment */
    fx_mq_key pm;
    CHECK(fx_mq_key_producer_member(&c->keys, chan, 5, &pm));
    fx_kv kv = {0};
    CHECK(fx_etcd_get(fx_mq_client_etcd(c), fx_mq_key_slice(&pm), &kv, OP_MS));
    assert_int_equal(kv.lease, ml); /* membership on the parent's member lease */
    fx_kv_free(&kv);
    fx_mq_delivery out[2];
    assert_int_equal(drain(cs, out, 2, 2), 2);
    assert_int_equal(out[0].id.pidx, 5);
    for (int i = 0; i < 2; i++) fx_mq_delivery_free(&out[i]);
    CHECK(fx_mpsc_flush(cs, 3000));
    CHECK(fx_kv_count_prefix(fx_mq_client_kv(c), fx_mq_key_slice(&pre), &cnt, OP_MS));
    assert_int_equal(cnt, 0);
    /* a rebind of the same member continues after its produce offset */
    fx_mpsc_producer_free(p);
    CHECK(fx__mpsc_producer_open_sub(c, chan, 0, &par, &p));
    fx_mq_msg_id id;
    CHECK(fx__mpsc_try_put(p, v, 1, &np, &id));
    assert_int_equal(id.msg, 2);
    CHECK(fx_mpsc_consumer_close(cs));
    assert_true(fx__mpsc_consumer_membership_deleted(cs));
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
    fx_lease_release(hp);
    fx_lease_release(hm);
    fx_lease_release(hg);
}

typedef struct alloc_arg {
    fx_mq_client *c;
    fx_mq_key key;
    int64_t firsts[20];
    fx_err err;
} alloc_arg;

static void *alloc_thread(void *a_)
{
    alloc_arg *a = a_;
    for (int i = 0; i < 20 && !a->err; i++) a->err = fx__mq_alloc_ids(a->c, &a->key, 0, 3, &a->firsts[i]);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void mpsc_ids_and_cluster_lease(void **state)
{
    ctx *x = *state;
    fx_mq_key k = {0};
    snprintf(k.s, sizeof k.s, "%s/test_counter", fx_mq_client_root(x->cl));
    k.len = strlen(k.s);
    alloc_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (alloc_arg){.c = x->cl, .key = k};
        assert_int_equal(pthread_create(&th[i], NULL, alloc_thread, &a[i]), 0);
    }
    int64_t all[80];
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].err);
        memcpy(all + 20 * i, a[i].firsts, sizeof a[i].firsts);
    }
    qsort(all, 80, sizeof all[0], cmp64);
    for (int i = 0; i < 80; i++) assert_int_equal(all[i], 1 + 3 * i); /* disjoint, dense */
    /* the chan counter has no lease */
    int64_t c1 = create_chan(x->cl, 1);
    fx_mq_key ck;
    CHECK(fx_mq_key_alloc_chan_ids(&x->cl->keys, &ck));
    fx_kv kv = {0};
    CHECK(fx_etcd_get(fx_mq_client_etcd(x->cl), fx_mq_key_slice(&ck), &kv, OP_MS));
    assert_int_equal(kv.lease, 0);
    fx_kv_free(&kv);
    assert_int_equal(create_chan(x->cl, 1), c1 + 1);
    /* cluster lease: the second call reuses */
    fx_mq_key lk;
    CHECK(fx_mq_key_cluster_lease_chan(&x->cl->keys, 999999, &lk));
    int64_t l1 = 0, l2 = 0;
    bool g1 = false, g2 = true;
    CHECK(fx__mq_cluster_lease(x->cl, &lk, TTL, &l1, &g1));
    CHECK(fx__mq_cluster_lease(x->cl, &lk, TTL, &l2, &g2));
    assert_true(g1 && !g2 && l1 == l2);
    CHECK(fx_etcd_lease_revoke(fx_mq_client_etcd(x->cl), l1, OP_MS));
    /* config validation uses the client minimum */
    fx_mq_chan_cfg bad = {.capacity = 1, .ttl_s = 1};
    int64_t ch;
    EXPECT(FX_EINVAL, fx_mpsc_create(x->cl, &bad, &ch));
    bad = (fx_mq_chan_cfg){.capacity = 0, .ttl_s = 3};
    EXPECT(FX_EINVAL, fx_mpsc_create(x->cl, &bad, &ch));
    EXPECT(FX_ENOTFOUND, fx_mpsc_producer_open(x->cl, 987654, 0, &(fx_mpsc_producer *){NULL}));
}

static int64_t key_lease(fx_etcd *e, const fx_mq_key *k)
{
    fx_kv kv = {0};
    CHECK(fx_etcd_get(e, fx_mq_key_slice(k), &kv, OP_MS));
    int64_t l = kv.lease;
    fx_kv_free(&kv);
    return l;
}

typedef struct gate_arg {
    fx_mpsc_consumer *c;
    fx_err seen;
} gate_arg;

static bool consumer_faulted(void *arg)
{
    gate_arg *g = arg;
    fx_mq_delivery d;
    size_t n = 0;
    g->seen = fx_mpsc_get(g->c, &d, 1, &n, 50);
    for (size_t i = 0; i < n; i++) fx_mq_delivery_free(&d);
    return g->seen != FX_OK && g->seen != FX_ETIMEDOUT;
}

static void mpsc_member_lease_lost(void **state)
{
    ctx *x = *state;
    fx_etcd *e = fx_mq_client_etcd(x->cl);
    int64_t chan = create_chan(x->cl, 100);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    fx_mq_key pm, cm;
    CHECK(fx_mq_key_producer_member(&x->cl->keys, chan, fx_mpsc_producer_idx(p), &pm));
    CHECK(fx_mq_key_consumer_member(&x->cl->keys, chan, fx__mpsc_consumer_idx(cs), &cm));
    /* producer: the very next put sees the membership gone (txn compare) */
    CHECK(fx_etcd_lease_revoke(e, key_lease(e, &pm), OP_MS));
    fx_slice v = FX_SLICE_STR("m");
    size_t np = 9;
    EXPECT(FX_ELEASE_LOST, fx_mpsc_put(p, &v, 1, 1000, &np, NULL));
    assert_int_equal(np, 0);
    EXPECT(FX_ECLOSED, fx_mpsc_put(p, &v, 1, 1000, &np, NULL));
    assert_int_equal(stored(x->cl, chan), 0); /* nothing written past the lost membership */
    /* consumer: the LeaseManager reports the expiry within a cadence (1 s): get returns
     * FX_ELEASE_LOST once, then FX_ECLOSED */
    CHECK(fx_etcd_lease_revoke(e, key_lease(e, &cm), OP_MS));
    gate_arg g = {.c = cs};
    assert_true(fxt_wait_until(consumer_faulted, &g, 5000));
    assert_int_equal(g.seen, FX_ELEASE_LOST);
    assert_int_equal(fx__mpsc_consumer_fault(cs), FX_ELEASE_LOST);
    fx_mq_delivery d;
    EXPECT(FX_ECLOSED, fx_mpsc_get(cs, &d, 1, &np, 10));
    EXPECT(FX_ECLOSED, fx_mpsc_flush(cs, 10));
    CHECK(fx_mpsc_consumer_close(cs));
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
}

/* Fencing: acks of a consumer whose membership is gone on the server (its member
 * lease expired there: a bridge cut off from etcd), before the client noticed, must not commit:
 * the commit is refused (WRN "commit refused ... fenced"), the consume offset does not move, the
 * payloads stay, and the consumer is over (FX_ELEASE_LOST once). */
static void mpsc_late_commit_fenced(void **state)
{
    ctx *x = *state;
    fx_etcd *e = fx_mq_client_etcd(x->cl);
    int64_t chan = create_chan(x->cl, 100);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    fx_slice v[4];
    char b[4][32];
    vals_make(v, b, 4, "f");
    size_t np = 0;
    CHECK(fx_mpsc_put(p, v, 4, 1000, &np, NULL));
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    fx_mq_delivery out[4];
    size_t got = 0;
    int64_t dl = fx_now_ms() + 5000;
    while (got < 4 && fx_now_ms() < dl) {
        size_t n = 0;
        fx_err r = fx_mpsc_get(cs, out + got, 4 - got, &n, 500);
        if (r != FX_ETIMEDOUT) CHECK(r);
        got += n;
    }
    assert_int_equal(got, 4);
    fx_mq_key cm;
    CHECK(fx_mq_key_consumer_member(&x->cl->keys, chan, fx__mpsc_consumer_idx(cs), &cm));
    fx_del_req dr = {.key = fx_mq_key_slice(&cm)};
    CHECK(fx_etcd_delete(e, &dr, NULL, OP_MS)); /* the server forgot the member */
    for (int i = 0; i < 4; i++) CHECK(fx_mpsc_ack(cs, &out[i].id, 1));
    EXPECT(FX_ELEASE_LOST, fx_mpsc_flush(cs, 3000));
    fx_mq_key co;
    CHECK(fx_mq_key_consume_offset(&x->cl->keys, chan, fx_mpsc_producer_idx(p), &co));
    assert_int_equal(key_int(e, &co, -1), -1); /* never committed */
    assert_int_equal(payload_keys(x->cl, chan), x->per_key ? 4 : 1); /* nothing deleted */
    fx_mpsc_consumer_close(cs);
    fx_mpsc_consumer_free(cs);
    for (int i = 0; i < 4; i++) fx_mq_delivery_free(&out[i]);
    fx_mpsc_producer_free(p);
}

static void mpsc_close_commits_pending_acks(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 100);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    fx_slice v[8];
    char b[8][32];
    vals_make(v, b, 8, "c");
    size_t np = 0;
    CHECK(fx_mpsc_put(p, v, 8, 1000, &np, NULL));
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    fx_mq_delivery out[8];
    size_t got = 0;
    int64_t dl = fx_now_ms() + 5000;
    while (got < 8 && fx_now_ms() < dl) {
        size_t n = 0;
        fx_err r = fx_mpsc_get(cs, out + got, 8 - got, &n, 500);
        if (r != FX_ETIMEDOUT) CHECK(r);
        got += n;
    }
    assert_int_equal(got, 8);
    /* ack 0..4 and 6, then close at once: the close commits the contiguous prefix 0..4 */
    for (int i = 0; i < 8; i++)
        if (i <= 4 || i == 6) CHECK(fx_mpsc_ack(cs, &out[i].id, 1));
    CHECK(fx_mpsc_ack(cs, &out[0].id, 1)); /* acking twice is harmless */
    CHECK(fx_mpsc_consumer_close(cs));
    fx_mpsc_consumer_free(cs);
    for (int i = 0; i < 8; i++) fx_mq_delivery_free(&out[i]);
    fx_mq_key co;
    CHECK(fx_mq_key_consume_offset(&x->cl->keys, chan, fx_mpsc_producer_idx(p), &co));
    assert_int_equal(key_int(fx_mq_client_etcd(x->cl), &co, -1), 5);
    int64_t bl = -1;
    CHECK(fx__mpsc_backlog(p, &bl));
    assert_int_equal(bl, 3);
    /* per key: the 3 unacked payloads; segments: the one segment stays until all 8 are acked */
    assert_int_equal(payload_keys(x->cl, chan), x->per_key ? 3 : 1);
    /* a new consumer gets exactly the unacknowledged window again (at-least-once); with
     * segments it starts in the middle of the segment */
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    got = drain(cs, out, 8, 3);
    assert_int_equal(got, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].id.msg, 5 + i);
        fx_mq_delivery_free(&out[i]);
    }
    CHECK(fx_mpsc_flush(cs, 3000));
    assert_int_equal(stored(x->cl, chan), 0);
    assert_int_equal(payload_keys(x->cl, chan), 0);
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
}

/* Segments only: a segment value that does not decode is skipped as a whole (counted, logged),
 * the next segment is delivered, and the commit removes the bad value too. */
static void mpsc_segment_corrupt_skipped(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 100);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    fx_slice v[5];
    char b[5][32];
    vals_make(v, b, 5, "s");
    size_t np = 0;
    CHECK(fx_mpsc_put(p, v, 3, 1000, &np, NULL));     /* segment [0,2] */
    CHECK(fx_mpsc_put(p, v + 3, 2, 1000, &np, NULL)); /* segment [3,4] */
    int64_t pidx = fx_mpsc_producer_idx(p);
    fx_mq_key k;
    CHECK(fx_mq_mpsc_payload_key(chan, pidx, 2, &k));
    /* a plausible header whose first length runs past the end */
    static const char bad[] = "FXS1\0\0\0\x03\0\0\0\x09" "abc";
    CHECK(fx_kv_put(fx_mq_client_kv(x->cl), fx_mq_key_slice(&k), (fx_slice){bad, sizeof bad - 1},
                    NULL, OP_MS));
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    fx_mq_delivery out[8];
    size_t got = drain(cs, out, 8, 2);
    assert_int_equal(got, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(out[i].id.msg, 3 + i);
        char want[32];
        snprintf(want, sizeof want, "s-%d", 3 + i);
        assert_memory_equal(out[i].value.data, want, strlen(want) + 1);
        fx_mq_delivery_free(&out[i]);
    }
    fx__mpsc_stats st;
    fx__mpsc_consumer_stats(cs, &st);
    assert_int_equal(st.skipped_ids, 3);
    CHECK(fx_mpsc_flush(cs, 3000));
    assert_int_equal(payload_keys(x->cl, chan), 0);
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
}

/* Segments only: fetches stay cheap whatever the backlog looks like.
 * 300 one-message segments (a publisher one at a time, nobody consuming): a consumer drains them
 * with a handful of range reads (each reads the segments of a window of ids), not one per
 * message. Then one 1000-message segment: a consumer that resumes at id 10 (window [10, 19],
 * inside the segment) finds it with the bounded second read and continues in order. */
static void mpsc_segment_fetch_bounded(void **state)
{
    ctx *x = *state;
    int64_t chan = create_chan(x->cl, 100000);
    fx_mpsc_producer *p = NULL;
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_producer_open(x->cl, chan, 0, &p));
    enum { N = 300, BIG = 1000 };
    static char b[BIG][32];
    static fx_slice v[BIG];
    vals_make(v, b, BIG, "f");
    size_t np = 0;
    for (int i = 0; i < N; i++) CHECK(fx_mpsc_put(p, v + i, 1, 1000, &np, NULL));
    assert_int_equal(payload_keys(x->cl, chan), N);
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    static fx_mq_delivery out[BIG];
    assert_int_equal(drain_by(cs, out, BIG, N, 128), N); /* gets of at most 128 */
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].id.msg, i);
        fx_mq_delivery_free(&out[i]);
    }
    fx__mpsc_stats st;
    fx__mpsc_consumer_stats(cs, &st);
    print_message("%d one-message segments drained with %llu range reads\n", N,
                  (unsigned long long)st.fetches);
    assert_true(st.fetches <= 8); /* 300 / 128 windows, plus empty waits at the end */
    assert_int_equal(st.skipped_ids, 0);
    CHECK(fx_mpsc_flush(cs, 3000));
    assert_int_equal(payload_keys(x->cl, chan), 0);
    /* one big segment; take 10, ack, close; the next consumer resumes inside it */
    CHECK(fx_mpsc_put(p, v, BIG, 3000, &np, NULL));
    assert_int_equal(payload_keys(x->cl, chan), 1);
    assert_int_equal(drain_by(cs, out, BIG, 10, 10), 10);
    for (int i = 0; i < 10; i++) fx_mq_delivery_free(&out[i]);
    fx_mpsc_consumer_free(cs);
    CHECK(fx_mpsc_consumer_open(x->cl, chan, &cs));
    assert_int_equal(drain_by(cs, out, BIG, BIG - 10, 10), BIG - 10);
    for (int i = 0; i < BIG - 10; i++) {
        assert_int_equal(out[i].id.msg, N + 10 + i);
        char want[32];
        snprintf(want, sizeof want, "f-%d", 10 + i);
        assert_memory_equal(out[i].value.data, want, strlen(want) + 1);
        fx_mq_delivery_free(&out[i]);
    }
    fx__mpsc_consumer_stats(cs, &st);
    assert_int_equal(st.skipped_ids, 0);
    CHECK(fx_mpsc_flush(cs, 3000));
    assert_int_equal(payload_keys(x->cl, chan), 0);
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
}

static fx_mq_chan_meta read_meta(fx_mq_client *c, int64_t chan)
{
    fx_mq_key mk;
    CHECK(fx_mq_key_chan_meta(&c->keys, chan, &mk));
    fx_kv kv = {0};
    CHECK(fx_etcd_get(fx_mq_client_etcd(c), fx_mq_key_slice(&mk), &kv, OP_MS));
    fx_mq_chan_meta m;
    CHECK(fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &m));
    fx_kv_free(&kv);
    return m;
}

typedef struct lease_arg {
    fx_etcd *e;
    int64_t id;
} lease_arg;

static bool lease_gone(void *arg)
{
    lease_arg *l = arg;
    int64_t ttl = 0;
    return fx_etcd_lease_timetolive(l->e, l->id, &ttl, NULL, OP_MS) == FX_OK && ttl < 0;
}

/* The id-allocator (global-long) lease expires while the meta lives on (kept by its global
 * lease, as an MPMC keeps a sub-MPSC's meta): the next bind renews it instead of failing. */
static void mpsc_long_lease_renewed(void **state)
{
    ctx *x = *state;
    const char *eps[] = {x->etcd.endpoint};
    fx_mq_client_opts o = {.etcd = {.endpoints = eps, .n_endpoints = 1}, .min_ttl_s = 2,
                           .long_lease_ttl_s = 2, .op_timeout_ms = OP_MS};
    fx_mq_client *c = NULL;
    CHECK(fx_mq_client_new(&o, &c));
    int64_t chan = create_chan(c, 100);
    fx_mq_chan_meta m0 = read_meta(c, chan);
    fx_lease *hg = NULL, *hp = NULL; /* keep meta and payloads alive, not the long lease */
    CHECK(fx__mq_hold(c, false, TTL, m0.global_lease_id, false, NULL, NULL, &hg));
    CHECK(fx__mq_hold(c, true, TTL, m0.payload_lease_id, false, NULL, NULL, &hp));
    fx_mpsc_producer *p = NULL;
    CHECK(fx_mpsc_producer_open(c, chan, 0, &p));
    fx_slice v[2] = {FX_SLICE_STR("l0"), FX_SLICE_STR("l1")};
    size_t np = 0;
    CHECK(fx_mpsc_put(p, v, 2, 1000, &np, NULL));
    int64_t idx0 = fx_mpsc_producer_idx(p);
    fx_mpsc_producer_free(p);
    lease_arg la = {fx_mq_client_etcd(c), m0.global_long_lease_id};
    assert_true(fxt_wait_until(lease_gone, &la, 8000));
    CHECK(fx_mpsc_producer_open(c, chan, 0, &p)); /* renews instead of failing */
    fx_mq_chan_meta m1 = read_meta(c, chan);
    assert_true(m1.global_long_lease_id != m0.global_long_lease_id);
    assert_int_equal(m1.global_lease_id, m0.global_lease_id);
    assert_int_equal(fx_mpsc_producer_idx(p), idx0); /* the counter restarted */
    fx_mq_msg_id id;
    CHECK(fx_mpsc_put(p, v, 1, 1000, &np, &id));
    assert_int_equal(id.msg, 2); /* continues after its produce offset */
    fx_mpsc_consumer *cs = NULL;
    CHECK(fx_mpsc_consumer_open(c, chan, &cs));
    fx_mq_delivery out[4];
    assert_int_equal(drain(cs, out, 4, 3), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].id.msg, i);
        fx_mq_delivery_free(&out[i]);
    }
    fx_mpsc_consumer_free(cs);
    fx_mpsc_producer_free(p);
    fx_lease_release(hp);
    fx_lease_release(hg);
    fx_mq_client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(mpsc_roundtrip, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_batch_over_127, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_capacity_full_then_close, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_gap_skipped, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_segment_corrupt_skipped, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_segment_fetch_bounded, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_put_retry_no_gap, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_payload_lease_revoked, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_client_close_closes_endpoints, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_sub_overrides, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_ids_and_cluster_lease, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_member_lease_lost, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_long_lease_renewed, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_close_commits_pending_acks, test_setup,
                                        test_teardown),
        /* the same data path with a separate KV client (put_many + offset txn; offsets, then
         * payload delete_range) */
        cmocka_unit_test_setup_teardown(mpsc_roundtrip, test_setup_kv_apart, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_batch_over_127, test_setup_kv_apart, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_gap_skipped, test_setup_kv_apart, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_put_retry_no_gap, test_setup_kv_apart, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_segment_corrupt_skipped, test_setup_kv_apart,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_payload_lease_revoked, test_setup_kv_apart,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_close_commits_pending_acks, test_setup_kv_apart,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_late_commit_fenced, test_setup_kv_apart,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_late_commit_fenced, test_setup_per_key, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_member_lease_lost, test_setup_kv_apart,
                                        test_teardown),
        /* the reference layout (one key per message), both payload planes */
        cmocka_unit_test_setup_teardown(mpsc_roundtrip, test_setup_per_key, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_batch_over_127, test_setup_per_key, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_capacity_full_then_close, test_setup_per_key,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_gap_skipped, test_setup_per_key, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_put_retry_no_gap, test_setup_per_key, test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_close_commits_pending_acks, test_setup_per_key,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_batch_over_127, test_setup_per_key_apart,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(mpsc_gap_skipped, test_setup_per_key_apart,
                                        test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
