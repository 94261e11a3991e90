/* test_interest_nats.c -- fx_interest_fetch against a real nats-server (monitoring on), with a
 * cnats client making the subscriptions.
 *
 * interest_literal_subjects_only: q.orders.alice, q.orders.bob (twice, one queue group),
 *   q.orders.> and $foo -> exactly {q.orders.alice, q.orders.bob}; with the client's cid excluded
 *   the set is empty; after unsubscribing alice it disappears.
 * interest_paging_2500: 2500 literal subjects (more than two pages of 1024) are all found.
 * interest_http_errors: a non-200 answer and a refused connection are FX_EUNAVAIL; a server
 *   that never answers is FX_ETIMEDOUT within the deadline.
 *
 * The nats-server comes from the harness (fxt_nats_start: PR_SET_PDEATHSIG, pidfile under
 * $FXT_TMPDIR so tests/run.sh kills leftovers) and is destroyed in the group teardown.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#include "interest.h"
#include "tests/support/fxt.h"

#define ACCOUNT "$G" /* no config file: every client is in the global account */
#define FETCH_MS 5000
#define N_PAGING 2500

static fxt_nats srv;

static int group_setup(void **state)
{
    (void)state;
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

static natsSubscription *sub(natsConnection *nc, const char *subject, const char *queue)
{
    natsSubscription *s = NULL;
    natsStatus st = queue ? natsConnection_QueueSubscribeSync(&s, nc, subject, queue)
                          : natsConnection_SubscribeSync(&s, nc, subject);
    if (st != NATS_OK) fail_msg("subscribe %s: %s", subject, natsStatus_GetText(st));
    return s;
}

static void flush(natsConnection *nc)
{
    natsStatus s = natsConnection_FlushTimeout(nc, 5000);
    if (s != NATS_OK) fail_msg("flush: %s", natsStatus_GetText(s));
}

static size_t count_prefix(const fx_interest *set, const char *prefix)
{
    size_t n = 0, pl = strlen(prefix);
    for (size_t i = 0; i < set->n; i++)
        if (strncmp(set->subjects[i], prefix, pl) == 0) n++;
    return n;
}

typedef struct {
    uint64_t cid;
    bool want_alice;
} poll_arg;

static bool alice_state_is(void *p)
{
    const poll_arg *a = p;
    fx_interest set = {0};
    if (fx_interest_fetch(srv.monitor_url, ACCOUNT, NULL, 0, FETCH_MS, &set) != FX_OK) return false;
    bool ok = fx_interest_has(&set, "q.orders.alice") == a->want_alice &&
              fx_interest_has(&set, "q.orders.bob") && count_prefix(&set, "q.orders.") ==
                                                           (a->want_alice ? 2u : 1u);
    fx_interest_free(&set);
    return ok;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void interest_literal_subjects_only(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *alice = sub(nc, "q.orders.alice", NULL);
    natsSubscription *bob1 = sub(nc, "q.orders.bob", "workers");
    natsSubscription *bob2 = sub(nc, "q.orders.bob", "workers");
    natsSubscription *wild = sub(nc, "q.orders.>", NULL);
    natsSubscription *dollar = sub(nc, "$foo", NULL);
    flush(nc);

    fx_interest set = {0};
    fx_err rc = fx_interest_fetch(srv.monitor_url, ACCOUNT, NULL, 0, FETCH_MS, &set);
    if (rc != FX_OK) fail_msg("fetch: %s: %s", fx_errname(rc), fx_err_detail());
    /* Nothing else literal is subscribed in $G, so the whole set is exact. */
    assert_int_equal(set.n, 2);
    assert_string_equal(set.subjects[0], "q.orders.alice");
    assert_string_equal(set.subjects[1], "q.orders.bob");
    assert_false(fx_interest_has(&set, "q.orders.>"));
    assert_false(fx_interest_has(&set, "$foo"));
    assert_string_equal(fx_interest_claim_token("q.orders", set.subjects[0]), "alice");
    fx_interest_free(&set);

    /* The monitor URL may end with '/'; the account is URL-encoded ($ -> %24). */
    char slash[80];
    snprintf(slash, sizeof slash, "%s/", srv.monitor_url);
    assert_int_equal(fx_interest_fetch(slash, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_OK);
    assert_int_equal(set.n, 2);
    fx_interest_free(&set);

    /* Another account sees nothing. */
    assert_int_equal(fx_interest_fetch(srv.monitor_url, "$SYS", NULL, 0, FETCH_MS, &set), FX_OK);
    assert_int_equal(set.n, 0);
    fx_interest_free(&set);

    /* This client's own subscriptions excluded (as the bridge excludes its own). */
    uint64_t cid = 0;
    assert_int_equal(natsConnection_GetClientID(nc, &cid), NATS_OK);
    const uint64_t ex[] = {cid + 1000, cid};
    assert_int_equal(fx_interest_fetch(srv.monitor_url, ACCOUNT, ex, 2, FETCH_MS, &set), FX_OK);
    assert_int_equal(set.n, 0);
    fx_interest_free(&set);

    /* alice leaves: gone from the next fetches (poll with a deadline), bob stays. */
    assert_int_equal(natsSubscription_Unsubscribe(alice), NATS_OK);
    flush(nc);
    poll_arg pa = {cid, false};
    assert_true(fxt_wait_until(alice_state_is, &pa, 5000));

    /* One queue member of bob leaves: bob still has interest. */
    assert_int_equal(natsSubscription_Unsubscribe(bob1), NATS_OK);
    flush(nc);
    assert_int_equal(fx_interest_fetch(srv.monitor_url, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_OK);
    assert_true(fx_interest_has(&set, "q.orders.bob"));
    fx_interest_free(&set);

    natsSubscription_Destroy(alice);
    natsSubscription_Destroy(bob1);
    natsSubscription_Destroy(bob2);
    natsSubscription_Destroy(wild);
    natsSubscription_Destroy(dollar);
    natsConnection_Destroy(nc);
}

typedef struct {
    size_t want;
    size_t got;
} paging_arg;

static bool all_paging_subjects_found(void *p)
{
    paging_arg *a = p;
    fx_interest set = {0};
    fx_err rc = fx_interest_fetch(srv.monitor_url, ACCOUNT, NULL, 0, FETCH_MS, &set);
    if (rc != FX_OK) {
        fprintf(stderr, "fetch: %s: %s\n", fx_errname(rc), fx_err_detail());
        return false;
    }
    a->got = count_prefix(&set, "page.");
    bool ok = a->got == a->want;
    for (size_t i = 0; ok && i < a->want; i++) {
        char s[32];
        snprintf(s, sizeof s, "page.%zu", i);
        ok = fx_interest_has(&set, s);
    }
    fx_interest_free(&set);
    return ok;
}

static void interest_paging_2500(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription **subs = calloc(N_PAGING, sizeof *subs);
    assert_non_null(subs);
    for (size_t i = 0; i < N_PAGING; i++) {
        char s[32];
        snprintf(s, sizeof s, "page.%zu", i);
        subs[i] = sub(nc, s, NULL);
    }
    flush(nc);
    paging_arg pa = {N_PAGING, 0};
    /* Every fetch must be complete: check several in a row, not just one lucky one. */
    for (int round = 0; round < 5; round++) {
        if (!all_paging_subjects_found(&pa))
            fail_msg("round %d: %zu of %d subjects found", round, pa.got, N_PAGING);
    }
    for (size_t i = 0; i < N_PAGING; i++) natsSubscription_Destroy(subs[i]);
    free(subs);
    natsConnection_Destroy(nc);
}

static void interest_http_errors(void **state)
{
    (void)state;
    fx_interest set = {0};
    char url[96];
    /* nats-server answers 404 below an unknown path. */
    snprintf(url, sizeof url, "%s/nope", srv.monitor_url);
    assert_int_equal(fx_interest_fetch(url, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_EUNAVAIL);
    assert_non_null(strstr(fx_err_detail(), "HTTP 404"));
    assert_int_equal(set.n, 0);

    int dead = fxt_dead_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d", dead);
    assert_int_equal(fx_interest_fetch(url, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_EUNAVAIL);

    int bport = 0;
    int bfd = fxt_blackhole_listen(&bport);
    assert_true(bfd >= 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", bport);
    int64_t t0 = fxt_now_ms();
    assert_int_equal(fx_interest_fetch(url, ACCOUNT, NULL, 0, 300, &set), FX_ETIMEDOUT);
    int64_t took = fxt_now_ms() - t0;
    assert_true(took >= 250 && took < 2000);
    assert_int_equal(set.n, 0);
    close(bfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(interest_literal_subjects_only),
        cmocka_unit_test(interest_paging_2500),
        cmocka_unit_test(interest_http_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
