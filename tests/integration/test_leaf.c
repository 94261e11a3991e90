/* test_leaf.c -- the leafnode publisher (plugin/leaf.h) against a real nats-server 2.9.
 *
 * The server runs from a generated config: client port, monitoring, ping_interval 1s and a
 * leafnode listener, all on free loopback ports, started by the harness (fxt_nats_start:
 * PR_SET_PDEATHSIG, pidfile under $FXT_TMPDIR so tests/run.sh kills leftovers).
 *
 * leaf_publish_headers_and_reply: HMSG with headers and the reply
 *   "$JS.ACK.FLUXON.b1.orders.a.1.5.1.1700000000000000000.0.abc" reaches a cnats subscriber of
 *   q.orders.a with data, headers (multi-value too) and exactly that reply (a client connection
 *   may not publish with it); the subscriber's "+ACK" to the reply reaches a subscription on
 *   "$JS.ACK.FLUXON.b1.>". LMSG (no headers), an empty payload, and the flush round trip too.
 * leaf_rejects: bad subjects, header blocks, a message over max_payload (the connection stays).
 * leaf_keepalive: a leaf that does not ping answers the server's 1 s PINGs (3 of them) and one
 *   that pings every 200 ms gets 5 PONGs: each still on its first connection.
 * leaf_bounded_buffer: with the server stopped (SIGSTOP), publishing fills the bounded buffer
 *   and then fails with FX_EFULL; after SIGCONT publishing works again.
 * leaf_wrong_port: pointed at the client port, the leaf refuses to connect and says why.
 * leaf_stop_is_prompt: stop returns within 1 s while waiting for INFO (a listener that accepts
 *   and never answers), while in reconnect backoff (refused port), while connected, and when
 *   never started.
 * leaf_reconnect_after_restart: the server is restarted on the same ports; the leaf reconnects
 *   (polled with a deadline) and delivers again; publishing while down fails at once. The queue
 *   interest of the old connection is forgotten, and a new queue subscriber gets messages.
 * leaf_queue_group_exactly_once: two members of queue group "workers" on q.orders.b get every
 *   message published over the leaf (LMSG/HMSG, with and without reply) exactly once in total.
 * leaf_queue_and_plain: a plain subscriber of q.mix.c and group "audit" on q.mix.* each get
 *   every message once; group "workers" with one member on q.mix.c and one on q.mix.> (one
 *   group for the server: same queue name; one name in the frame) gets each once in total.
 * leaf_queue_unsubscribe: one member leaves (LS+ with weight 1: the other gets everything), then
 *   the other (LS-: polled until the leaf forgot the group); publishing still works and reaches
 *   a plain subscriber; one connection, no server error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include "leaf.h"
#include "tests/support/fxt.h"

#define JS_REPLY "$JS.ACK.FLUXON.b1.orders.a.1.5.1.1700000000000000000.0.abc"
#define HDR_BLOCK                                                                                  \
    "NATS/1.0\r\nFluxon-Channel: orders\r\nFluxon-Subject: orders.eu.new\r\nX-Multi: one\r\n"   \
    "X-Multi: two\r\n\r\n"
#define WAIT_MS 15000

static fxt_nats srv;

static int group_setup(void **state)
{
    (void)state;
    srv.leafnodes = true;
    snprintf(srv.extra_conf, sizeof srv.extra_conf, "ping_interval: \"1s\"");
    return fxt_nats_start(&srv) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    fxt_nats_destroy(&srv);
    nats_Close();
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static natsConnection *connect_client(void)
{
    natsConnection *nc = NULL;
    natsStatus s = natsConnection_ConnectTo(&nc, srv.url);
    if (s != NATS_OK) fail_msg("connect %s: %s", srv.url, natsStatus_GetText(s));
    return nc;
}

static natsSubscription *sub(natsConnection *nc, const char *subject)
{
    natsSubscription *s = NULL;
    natsStatus st = natsConnection_SubscribeSync(&s, nc, subject);
    if (st != NATS_OK) fail_msg("subscribe %s: %s", subject, natsStatus_GetText(st));
    st = natsConnection_FlushTimeout(nc, 5000);
    if (st != NATS_OK) fail_msg("flush: %s", natsStatus_GetText(st));
    return s;
}

/* Each leaf gets its own name: the server replaces an older leaf connection of the same name
 * ("Duplicate Remote LeafNode Connection"). */
static fx_leaf *leaf_new(const char *url, int64_t ping_ms, size_t max_pending)
{
    static int seq;
    char name[32];
    snprintf(name, sizeof name, "fxt-leaf-%d", ++seq);
    fx_leaf_opts o = {.url = url, .name = name, .ping_interval_ms = ping_ms,
                      .max_pending_bytes = max_pending, .reconnect_max_ms = 500};
    fx_leaf *l = NULL;
    assert_int_equal(fx_leaf_new(&o, &l), FX_OK);
    assert_int_equal(fx_leaf_start(l), FX_OK);
    return l;
}

static bool is_connected(void *p) { return fx_leaf_connected(p); }
static bool is_down(void *p) { return !fx_leaf_connected(p); }

static void wait_connected(fx_leaf *l)
{
    if (!fxt_wait_until(is_connected, l, WAIT_MS)) {
        char why[256];
        fx_leaf_status(l, why, sizeof why);
        fail_msg("leaf not connected within %d ms: %s", WAIT_MS, why);
    }
}

static natsMsg *next_msg(natsSubscription *s)
{
    natsMsg *m = NULL;
    natsStatus st = natsSubscription_NextMsg(&m, s, 5000);
    if (st != NATS_OK) fail_msg("no message on %s: %s", natsSubscription_GetSubject(s),
                                natsStatus_GetText(st));
    return m;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void leaf_publish_headers_and_reply(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *q = sub(nc, "q.orders.a");
    natsSubscription *acks = sub(nc, "$JS.ACK.FLUXON.b1.>");
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);

    /* HMSG: headers, data and the exact $JS.ACK. reply */
    assert_int_equal(fx_leaf_publish(l, "q.orders.a", JS_REPLY, HDR_BLOCK, strlen(HDR_BLOCK),
                                     "hello", 5),
                     FX_OK);
    natsMsg *m = next_msg(q);
    assert_string_equal(natsMsg_GetSubject(m), "q.orders.a");
    assert_non_null(natsMsg_GetReply(m));
    assert_string_equal(natsMsg_GetReply(m), JS_REPLY);
    assert_int_equal(natsMsg_GetDataLength(m), 5);
    assert_memory_equal(natsMsg_GetData(m), "hello", 5);
    const char *v = NULL;
    assert_int_equal(natsMsgHeader_Get(m, "Fluxon-Channel", &v), NATS_OK);
    assert_string_equal(v, "orders");
    assert_int_equal(natsMsgHeader_Get(m, "Fluxon-Subject", &v), NATS_OK);
    assert_string_equal(v, "orders.eu.new");
    const char **vals = NULL;
    int nv = 0;
    assert_int_equal(natsMsgHeader_Values(m, "X-Multi", &vals, &nv), NATS_OK);
    assert_int_equal(nv, 2);
    assert_string_equal(vals[0], "one");
    assert_string_equal(vals[1], "two");
    free((void *)vals);

    /* the subscriber acks to the reply; the bridge-side subscription sees it */
    assert_int_equal(natsConnection_Publish(nc, natsMsg_GetReply(m), "+ACK", 4), NATS_OK);
    natsMsg_Destroy(m);
    natsMsg *a = next_msg(acks);
    assert_string_equal(natsMsg_GetSubject(a), JS_REPLY);
    assert_int_equal(natsMsg_GetDataLength(a), 4);
    assert_memory_equal(natsMsg_GetData(a), "+ACK", 4);
    natsMsg_Destroy(a);

    /* LMSG: no headers, no reply */
    assert_int_equal(fx_leaf_publish(l, "q.orders.a", NULL, NULL, 0, "plain", 5), FX_OK);
    m = next_msg(q);
    assert_null(natsMsg_GetReply(m));
    assert_memory_equal(natsMsg_GetData(m), "plain", 5);
    assert_int_equal(natsMsgHeader_Get(m, "Fluxon-Channel", &v), NATS_NOT_FOUND);
    natsMsg_Destroy(m);

    /* headers and an empty payload */
    assert_int_equal(fx_leaf_publish(l, "q.orders.a", JS_REPLY, HDR_BLOCK, strlen(HDR_BLOCK), NULL,
                                     0),
                     FX_OK);
    m = next_msg(q);
    assert_int_equal(natsMsg_GetDataLength(m), 0);
    assert_int_equal(natsMsgHeader_Get(m, "Fluxon-Channel", &v), NATS_OK);
    assert_string_equal(natsMsg_GetReply(m), JS_REPLY);
    natsMsg_Destroy(m);

    /* many in a row, in order; then a flush round trip */
    for (int i = 0; i < 1000; i++) {
        char d[32];
        int n = snprintf(d, sizeof d, "m%d", i);
        assert_int_equal(fx_leaf_publish(l, "q.orders.a", JS_REPLY, HDR_BLOCK, strlen(HDR_BLOCK),
                                         d, (size_t)n),
                         FX_OK);
    }
    assert_int_equal(fx_leaf_flush(l, 5000), FX_OK);
    for (int i = 0; i < 1000; i++) {
        char d[32];
        int n = snprintf(d, sizeof d, "m%d", i);
        m = next_msg(q);
        assert_int_equal(natsMsg_GetDataLength(m), n);
        assert_memory_equal(natsMsg_GetData(m), d, (size_t)n);
        natsMsg_Destroy(m);
    }
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    assert_int_equal(st.msgs, 1003);
    assert_int_equal(st.connects, 1);
    assert_int_equal(st.server_errors, 0);

    fx_leaf_free(l);
    natsSubscription_Destroy(q);
    natsSubscription_Destroy(acks);
    natsConnection_Destroy(nc);
}

static void leaf_rejects(void **state)
{
    (void)state;
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    assert_int_equal(fx_leaf_publish(l, "", NULL, NULL, 0, "x", 1), FX_EINVAL);
    assert_int_equal(fx_leaf_publish(l, "a b", NULL, NULL, 0, "x", 1), FX_EINVAL);
    assert_int_equal(fx_leaf_publish(l, "a", "r\r\n", NULL, 0, "x", 1), FX_EINVAL);
    assert_int_equal(fx_leaf_publish(l, "a", NULL, "X: y\r\n\r\n", 8, "x", 1), FX_EINVAL);
    assert_int_equal(fx_leaf_publish(l, "a", NULL, "NATS/1.0\r\nX: y\r\n", 16, "x", 1), FX_EINVAL);
    /* over the server's max_payload (1 MiB): refused here, the connection stays */
    size_t big = (1u << 20) + 1;
    char *p = calloc(1, big);
    assert_non_null(p);
    assert_int_equal(fx_leaf_publish(l, "a", NULL, NULL, 0, p, big), FX_ETOO_LARGE);
    free(p);
    assert_true(fx_leaf_connected(l));
    assert_int_equal(fx_leaf_flush(l, 5000), FX_OK);
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    assert_int_equal(st.msgs, 0);
    assert_int_equal(st.server_errors, 0);
    fx_leaf_free(l);
}

typedef struct {
    fx_leaf *l;
    uint64_t pings, pongs;
} ka_arg;

static bool keepalive_seen(void *p)
{
    ka_arg *a = p;
    fx_leaf_stats st;
    fx_leaf_get_stats(a->l, &st);
    return st.server_pings >= a->pings && st.pongs >= a->pongs;
}

/* The server skips its PING when the other side pinged within ping_interval, so the two
 * directions are checked with two leaves: one that never pings (the server's 1 s PINGs must be
 * answered, or it closes the connection after 2), one that pings every 200 ms. */
static void leaf_keepalive(void **state)
{
    (void)state;
    fx_leaf *l = leaf_new(srv.leaf_url, 3600 * 1000, 0);
    wait_connected(l);
    ka_arg a = {l, 3, 0};
    bool ok = fxt_wait_until(keepalive_seen, &a, WAIT_MS);
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    bool up = fx_leaf_connected(l);
    fx_leaf_free(l);
    assert_true(ok);
    assert_true(up);
    assert_int_equal(st.connects, 1); /* the same connection all along */
    assert_int_equal(st.server_errors, 0);

    l = leaf_new(srv.leaf_url, 200, 0);
    wait_connected(l);
    ka_arg b = {l, 0, 5};
    ok = fxt_wait_until(keepalive_seen, &b, WAIT_MS);
    fx_leaf_get_stats(l, &st);
    up = fx_leaf_connected(l);
    fx_leaf_free(l);
    assert_true(ok);
    assert_true(up);
    assert_int_equal(st.connects, 1);
    assert_int_equal(st.server_errors, 0);
}

static void leaf_bounded_buffer(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *q = sub(nc, "q.orders.big");
    natsSubscription_SetPendingLimits(q, -1, -1); /* no client-side limit: count every message */
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 256 * 1024);
    wait_connected(l);
    assert_int_equal(fxt_nats_pause(&srv), 0);
    size_t sz = 64 * 1024;
    char *p = malloc(sz);
    assert_non_null(p);
    memset(p, 'x', sz);
    fx_err e = FX_OK;
    int sent = 0;
    for (int i = 0; i < 4000 && e == FX_OK; i++) {
        e = fx_leaf_publish(l, "q.orders.big", NULL, NULL, 0, p, sz);
        if (e == FX_OK) sent++;
    }
    assert_int_equal(e, FX_EFULL);
    assert_true(sent > 0);
    assert_true(fx_leaf_connected(l));
    assert_int_equal(fxt_nats_resume(&srv), 0);
    /* the I/O thread drains the buffer once the server reads again */
    assert_int_equal(fx_leaf_flush(l, WAIT_MS), FX_OK);
    assert_int_equal(fx_leaf_publish(l, "q.orders.big", NULL, NULL, 0, "end", 3), FX_OK);
    int got = 0;
    for (;;) {
        natsMsg *m = next_msg(q);
        bool end = natsMsg_GetDataLength(m) == 3;
        if (!end) assert_int_equal(natsMsg_GetDataLength(m), (int)sz);
        natsMsg_Destroy(m);
        if (end) break;
        got++;
    }
    assert_int_equal(got, sent);
    free(p);
    fx_leaf_free(l);
    natsSubscription_Destroy(q);
    natsConnection_Destroy(nc);
}

static bool status_has(fx_leaf *l, const char *what)
{
    char why[256];
    fx_leaf_status(l, why, sizeof why);
    return strstr(why, what) != NULL;
}

typedef struct {
    fx_leaf *l;
    const char *what;
} st_arg;

static bool status_says(void *p)
{
    st_arg *a = p;
    return status_has(a->l, a->what);
}

static void leaf_wrong_port(void **state)
{
    (void)state;
    fx_leaf *l = leaf_new(srv.url, 0, 0); /* the client port */
    st_arg a = {l, "client port"};
    assert_true(fxt_wait_until(status_says, &a, WAIT_MS));
    assert_false(fx_leaf_connected(l));
    assert_int_equal(fx_leaf_publish(l, "a", NULL, NULL, 0, "x", 1), FX_EUNAVAIL);
    fx_leaf_free(l);
}

static void assert_prompt_stop(fx_leaf *l)
{
    int64_t t0 = fxt_now_ms();
    fx_leaf_free(l);
    int64_t took = fxt_now_ms() - t0;
    if (took > 1000) fail_msg("stop took %lld ms", (long long)took);
}

static void leaf_stop_is_prompt(void **state)
{
    (void)state;
    /* waiting for INFO from a listener that never answers (30 s handshake timeout) */
    int bport = 0;
    int bfd = fxt_blackhole_listen(&bport);
    assert_true(bfd >= 0);
    char url[64];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", bport);
    fx_leaf_opts o = {.url = url, .name = "fxt-stop", .connect_timeout_ms = 30000};
    fx_leaf *l = NULL;
    assert_int_equal(fx_leaf_new(&o, &l), FX_OK);
    assert_int_equal(fx_leaf_start(l), FX_OK);
    int cfd = accept(bfd, NULL, NULL); /* the leaf's TCP connection: it now waits for INFO */
    assert_true(cfd >= 0);
    assert_false(fx_leaf_connected(l));
    assert_prompt_stop(l);
    close(cfd);
    close(bfd);

    /* in reconnect backoff (refused port, 30 s max backoff) */
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", fxt_dead_port());
    fx_leaf_opts o2 = {.url = url, .reconnect_min_ms = 30000, .reconnect_max_ms = 30000};
    assert_int_equal(fx_leaf_new(&o2, &l), FX_OK);
    assert_int_equal(fx_leaf_start(l), FX_OK);
    st_arg b = {l, "cannot connect"};
    assert_true(fxt_wait_until(status_says, &b, WAIT_MS));
    assert_prompt_stop(l);

    /* connected */
    l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    assert_prompt_stop(l);

    /* never started */
    assert_int_equal(fx_leaf_new(&o2, &l), FX_OK);
    assert_prompt_stop(l);
}

/* ---- queue groups ------------------------------------------------------------------------------ */

static natsSubscription *qsub(natsConnection *nc, const char *subject, const char *queue)
{
    natsSubscription *s = NULL;
    natsStatus st = natsConnection_QueueSubscribeSync(&s, nc, subject, queue);
    if (st != NATS_OK) fail_msg("queue subscribe %s %s: %s", subject, queue, natsStatus_GetText(st));
    natsSubscription_SetPendingLimits(s, -1, -1);
    st = natsConnection_FlushTimeout(nc, 5000);
    if (st != NATS_OK) fail_msg("flush: %s", natsStatus_GetText(st));
    return s;
}

typedef struct {
    fx_leaf *l;
    const char *subject, *queue;
    bool present;
} qn_arg;

static bool has_queue_name(fx_leaf *l, const char *subject, const char *queue)
{
    char buf[4096];
    int n = fx_leaf_queue_names(l, subject, buf, sizeof buf);
    size_t ql = strlen(queue);
    for (const char *p = buf; n > 0 && *p;) {
        const char *e = strchr(p, ' ');
        size_t tl = e ? (size_t)(e - p) : strlen(p);
        if (tl == ql && memcmp(p, queue, ql) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static bool queue_state(void *p)
{
    qn_arg *a = p;
    return has_queue_name(a->l, a->subject, a->queue) == a->present;
}

/* Poll until the leaf has processed the LS+ (present) or LS- (absent) for the group. */
static void wait_queue(fx_leaf *l, const char *subject, const char *queue, bool present)
{
    qn_arg a = {l, subject, queue, present};
    if (!fxt_wait_until(queue_state, &a, WAIT_MS))
        fail_msg("leaf: queue %s %s on %s not seen within %d ms", queue,
                 present ? "present" : "gone", subject, WAIT_MS);
}

/* Publish n messages "<tag><i>", cycling through LMSG/HMSG with and without a reply. */
static void publish_n(fx_leaf *l, const char *subject, const char *tag, int n)
{
    for (int i = 0; i < n; i++) {
        char d[48];
        int dl = snprintf(d, sizeof d, "%s%d", tag, i);
        const char *reply = (i & 1) ? JS_REPLY : NULL;
        bool hdr = (i & 2) != 0;
        assert_int_equal(fx_leaf_publish(l, subject, reply, hdr ? HDR_BLOCK : NULL,
                                         hdr ? strlen(HDR_BLOCK) : 0, d, (size_t)dl),
                         FX_OK);
    }
    assert_int_equal(fx_leaf_flush(l, 5000), FX_OK);
}

/* Receive from the subscriptions until n messages "<tag><i>" arrived in total; each index
 * exactly once, with the reply and headers it was published with; then nothing more. */
static void expect_n_once(natsSubscription **subs, int nsubs, const char *tag, int n, int *per_sub)
{
    char *seen = calloc((size_t)n, 1);
    assert_non_null(seen);
    int got = 0;
    int64_t deadline = fxt_now_ms() + WAIT_MS;
    for (int k = 0; k < nsubs; k++) per_sub[k] = 0;
    while (got < n) {
        if (fxt_now_ms() > deadline) fail_msg("only %d of %d messages %s arrived", got, n, tag);
        for (int k = 0; k < nsubs; k++) {
            natsMsg *m = NULL;
            if (natsSubscription_NextMsg(&m, subs[k], 20) != NATS_OK) continue;
            char d[48];
            int dl = natsMsg_GetDataLength(m);
            assert_true(dl > 0 && dl < (int)sizeof d);
            memcpy(d, natsMsg_GetData(m), (size_t)dl);
            d[dl] = '\0';
            size_t tl = strlen(tag);
            assert_true(strncmp(d, tag, tl) == 0);
            int i = atoi(d + tl);
            assert_true(i >= 0 && i < n);
            if (seen[i]) fail_msg("message %s delivered twice", d);
            seen[i] = 1;
            if (i & 1) {
                assert_non_null(natsMsg_GetReply(m));
                assert_string_equal(natsMsg_GetReply(m), JS_REPLY);
            } else {
                assert_null(natsMsg_GetReply(m));
            }
            const char *v = NULL;
            assert_int_equal(natsMsgHeader_Get(m, "Fluxon-Channel", &v),
                             (i & 2) ? NATS_OK : NATS_NOT_FOUND);
            natsMsg_Destroy(m);
            per_sub[k]++;
            got++;
        }
    }
    for (int k = 0; k < nsubs; k++) { /* nothing more */
        natsMsg *m = NULL;
        natsStatus st = natsSubscription_NextMsg(&m, subs[k], 200);
        if (st == NATS_OK) {
            natsMsg_Destroy(m);
            fail_msg("an extra message arrived after all %d of %s", n, tag);
        }
    }
    free(seen);
}

static void leaf_queue_group_exactly_once(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsConnection *nc2 = connect_client();
    natsSubscription *w[2] = {qsub(nc, "q.orders.b", "workers"), qsub(nc2, "q.orders.b", "workers")};
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    wait_queue(l, "q.orders.b", "workers", true);
    assert_false(has_queue_name(l, "q.orders.other", "workers"));
    const int n = 400;
    publish_n(l, "q.orders.b", "w", n);
    int per[2];
    expect_n_once(w, 2, "w", n, per);
    /* the server picks a member per message at random: both get some */
    assert_true(per[0] > 0 && per[1] > 0);
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    assert_int_equal(st.server_errors, 0);
    assert_int_equal(st.queue_truncated, 0);
    assert_int_equal(st.queue_dropped, 0);
    assert_int_equal(st.queue_bad_lines, 0);
    assert_int_equal(st.connects, 1);
    fx_leaf_free(l);
    natsSubscription_Destroy(w[0]);
    natsSubscription_Destroy(w[1]);
    natsConnection_Destroy(nc);
    natsConnection_Destroy(nc2);
}

static void leaf_queue_and_plain(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *subs[4] = {
        sub(nc, "q.mix.c"),
        qsub(nc, "q.mix.*", "audit"),
        qsub(nc, "q.mix.c", "workers"),
        qsub(nc, "q.mix.>", "workers"),
    };
    natsSubscription_SetPendingLimits(subs[0], -1, -1);
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    wait_queue(l, "q.mix.c", "workers", true);
    wait_queue(l, "q.mix.c", "audit", true);
    char names[256];
    assert_int_equal(fx_leaf_queue_names(l, "q.mix.c", names, sizeof names), 2); /* distinct */
    assert_int_equal(fx_leaf_queue_names(l, "q.mix.c.d", names, sizeof names), 1);
    assert_string_equal(names, "workers");
    assert_int_equal(fx_leaf_queue_names(l, "q.other", names, sizeof names), 0);
    const int n = 200;
    publish_n(l, "q.mix.c", "p", n);
    int per[2];
    for (int k = 0; k < 2; k++) {
        expect_n_once(&subs[k], 1, "p", n, per);
        assert_int_equal(per[0], n);
    }
    expect_n_once(&subs[2], 2, "p", n, per);
    assert_true(per[0] > 0 && per[1] > 0);
    fx_leaf_free(l);
    for (int k = 0; k < 4; k++) natsSubscription_Destroy(subs[k]);
    natsConnection_Destroy(nc);
}

/* A corked round of publishes goes out in one write (not one per message), nothing leaves before
 * the uncork, and every frame form arrives intact and once: plain subscriber and queue group. */
static void leaf_cork_one_write_per_round(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *subs[2] = {sub(nc, "q.cork.a"), qsub(nc, "q.cork.*", "workers")};
    natsSubscription_SetPendingLimits(subs[0], -1, -1);
    natsSubscription_SetPendingLimits(subs[1], -1, -1);
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    wait_queue(l, "q.cork.a", "workers", true);
    const int n = 100; /* ~20 KB of frames: under the corked batch bound */
    fx_leaf_stats st0, st1, st2;
    fx_leaf_get_stats(l, &st0);
    fx_leaf_cork(l);
    fx_leaf_cork(l); /* nested: only the outer uncork sends */
    for (int i = 0; i < n; i++) {
        char d[48];
        int dl = snprintf(d, sizeof d, "k%d", i);
        const char *reply = (i & 1) ? JS_REPLY : NULL;
        bool hdr = (i & 2) != 0;
        assert_int_equal(fx_leaf_publish(l, "q.cork.a", reply, hdr ? HDR_BLOCK : NULL,
                                         hdr ? strlen(HDR_BLOCK) : 0, d, (size_t)dl),
                         FX_OK);
    }
    fx_leaf_uncork(l);
    fx_leaf_get_stats(l, &st1);
    fx_leaf_uncork(l);
    fx_leaf_get_stats(l, &st2);
    assert_int_equal(st2.msgs - st0.msgs, n);
    /* the I/O thread may write a PONG meanwhile; never one write per message */
    if (st1.writes - st0.writes > 2)
        fail_msg("corked publishes wrote %llu times before the uncork",
                 (unsigned long long)(st1.writes - st0.writes));
    if (st2.writes - st0.writes > 4)
        fail_msg("a corked round of %d publishes took %llu writes", n,
                 (unsigned long long)(st2.writes - st0.writes));
    int per[1];
    expect_n_once(&subs[0], 1, "k", n, per);
    assert_int_equal(per[0], n);
    expect_n_once(&subs[1], 1, "k", n, per);
    assert_int_equal(per[0], n);
    /* uncorked: one write per publish again (positive control of the write counter) */
    fx_leaf_get_stats(l, &st0);
    for (int i = 0; i < 10; i++) assert_int_equal(fx_leaf_publish(l, "q.cork.a", NULL, NULL, 0, "u", 1), FX_OK);
    fx_leaf_get_stats(l, &st1);
    assert_true(st1.writes - st0.writes >= 10);
    assert_int_equal(fx_leaf_flush(l, 5000), FX_OK);
    fx_leaf_free(l);
    for (int k = 0; k < 2; k++) natsSubscription_Destroy(subs[k]);
    natsConnection_Destroy(nc);
}

/* A corked round is bounded: past 32 KiB pending the frames go out without waiting for the
 * uncork, and every one arrives once. */
static void leaf_cork_bounded(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *s = sub(nc, "q.corkb.a");
    natsSubscription_SetPendingLimits(s, -1, -1);
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    static char big[1024];
    memset(big, 'b', sizeof big);
    const int n = 100; /* 100 KiB of payload: three times the bound */
    fx_leaf_stats st0, st1;
    fx_leaf_get_stats(l, &st0);
    fx_leaf_cork(l);
    for (int i = 0; i < n; i++) {
        int dl = snprintf(big, 16, "c%d", i);
        big[dl] = ' ';
        assert_int_equal(fx_leaf_publish(l, "q.corkb.a", NULL, NULL, 0, big, sizeof big), FX_OK);
    }
    fx_leaf_get_stats(l, &st1);
    fx_leaf_uncork(l);
    if (st1.writes - st0.writes < 2)
        fail_msg("a corked round of %d KiB was held whole (%llu writes before the uncork)", n,
                 (unsigned long long)(st1.writes - st0.writes));
    char *seen = calloc((size_t)n, 1);
    assert_non_null(seen);
    for (int got = 0; got < n; got++) {
        natsMsg *m = next_msg(s);
        assert_int_equal(natsMsg_GetDataLength(m), (int)sizeof big);
        int i = atoi(natsMsg_GetData(m) + 1);
        assert_true(i >= 0 && i < n && !seen[i]);
        seen[i] = 1;
        natsMsg_Destroy(m);
    }
    free(seen);
    fx_leaf_free(l);
    natsSubscription_Destroy(s);
    natsConnection_Destroy(nc);
}

static void leaf_queue_unsubscribe(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *plain = sub(nc, "q.orders.d");
    natsSubscription_SetPendingLimits(plain, -1, -1);
    natsSubscription *w1 = qsub(nc, "q.orders.d", "workers");
    natsSubscription *w2 = qsub(nc, "q.orders.d", "workers");
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    wait_queue(l, "q.orders.d", "workers", true);
    fx_leaf_stats st0;
    fx_leaf_get_stats(l, &st0);

    /* one member leaves: LS+ with weight 1, the group stays */
    assert_int_equal(natsSubscription_Unsubscribe(w1), NATS_OK);
    assert_int_equal(natsConnection_FlushTimeout(nc, 5000), NATS_OK);
    assert_int_equal(fx_leaf_flush(l, 5000), FX_OK);
    assert_true(has_queue_name(l, "q.orders.d", "workers"));
    publish_n(l, "q.orders.d", "a", 50);
    int per;
    expect_n_once(&w2, 1, "a", 50, &per);
    assert_int_equal(per, 50);
    expect_n_once(&plain, 1, "a", 50, &per);

    /* the last member leaves: LS-, the leaf forgets the group */
    assert_int_equal(natsSubscription_Unsubscribe(w2), NATS_OK);
    assert_int_equal(natsConnection_FlushTimeout(nc, 5000), NATS_OK);
    wait_queue(l, "q.orders.d", "workers", false);
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    assert_int_equal(st.queue_entries, st0.queue_entries - 1);
    publish_n(l, "q.orders.d", "b", 50);
    expect_n_once(&plain, 1, "b", 50, &per);
    assert_int_equal(per, 50);
    fx_leaf_get_stats(l, &st);
    assert_int_equal(st.server_errors, 0);
    assert_int_equal(st.queue_bad_lines, 0);
    assert_int_equal(st.connects, 1);
    assert_true(fx_leaf_connected(l));
    fx_leaf_free(l);
    natsSubscription_Destroy(w1);
    natsSubscription_Destroy(w2);
    natsSubscription_Destroy(plain);
    natsConnection_Destroy(nc);
}

static void leaf_reconnect_after_restart(void **state)
{
    (void)state;
    fx_leaf *l = leaf_new(srv.leaf_url, 0, 0);
    wait_connected(l);
    natsConnection *old = connect_client();
    natsSubscription *gone = qsub(old, "q.orders.z", "gone");
    wait_queue(l, "q.orders.z", "gone", true);
    natsSubscription_Destroy(gone);
    natsConnection_Destroy(old);
    wait_queue(l, "q.orders.z", "gone", false);
    old = connect_client();
    gone = qsub(old, "q.orders.z", "gone");
    wait_queue(l, "q.orders.z", "gone", true);
    /* the server goes while the group is known: the next connection must not keep it */
    assert_int_equal(fxt_nats_stop(&srv), 0);
    natsSubscription_Destroy(gone);
    natsConnection_Destroy(old);
    assert_true(fxt_wait_until(is_down, l, WAIT_MS));
    assert_int_equal(fx_leaf_publish(l, "q.orders.a", JS_REPLY, HDR_BLOCK, strlen(HDR_BLOCK), "x",
                                     1),
                     FX_EUNAVAIL);
    assert_int_equal(fx_leaf_flush(l, 100), FX_EUNAVAIL);
    assert_int_equal(fxt_nats_restart(&srv), 0); /* same config, same ports */
    wait_connected(l);
    natsConnection *nc = connect_client();
    natsSubscription *q = sub(nc, "q.orders.a");
    assert_int_equal(fx_leaf_publish(l, "q.orders.a", JS_REPLY, HDR_BLOCK, strlen(HDR_BLOCK),
                                     "again", 5),
                     FX_OK);
    natsMsg *m = next_msg(q);
    assert_string_equal(natsMsg_GetReply(m), JS_REPLY);
    assert_memory_equal(natsMsg_GetData(m), "again", 5);
    natsMsg_Destroy(m);
    assert_false(has_queue_name(l, "q.orders.z", "gone"));
    natsSubscription *w = qsub(nc, "q.orders.a", "workers");
    wait_queue(l, "q.orders.a", "workers", true);
    publish_n(l, "q.orders.a", "r", 20);
    int per;
    expect_n_once(&w, 1, "r", 20, &per);
    assert_int_equal(per, 20);
    natsSubscription_Destroy(w);
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    assert_int_equal(st.connects, 2);
    fx_leaf_free(l);
    natsSubscription_Destroy(q);
    natsConnection_Destroy(nc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(leaf_publish_headers_and_reply),
        cmocka_unit_test(leaf_rejects),
        cmocka_unit_test(leaf_keepalive),
        cmocka_unit_test(leaf_bounded_buffer),
        cmocka_unit_test(leaf_wrong_port),
        cmocka_unit_test(leaf_stop_is_prompt),
        cmocka_unit_test(leaf_queue_group_exactly_once),
        cmocka_unit_test(leaf_queue_and_plain),
        cmocka_unit_test(leaf_queue_unsubscribe),
        cmocka_unit_test(leaf_cork_one_write_per_round),
        cmocka_unit_test(leaf_cork_bounded),
        cmocka_unit_test(leaf_reconnect_after_restart),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
