/* Unit tests: /subsz parsing, the interest set and claim tokens (plugin/interest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "interest.h"

/* nats-server 2.9 /subsz: the stats-only shape (no subs, or an empty page). */
static const char STATS_ONLY[] =
    "{\"num_subscriptions\":59,\"num_cache\":14,\"num_inserts\":59,\"num_removes\":0,\"num_matches\":19,\n"
    " \"cache_hit_rate\":0.263,\"max_fanout\":3,\"avg_fanout\":1.21}";

/* nats-server 2.9 /subsz?subs=1&acc=APP&test=orders.created, as the server printed it. */
static const char CAPTURED[] =
    "{\n"
    "  \"server_id\": \"NDUDI6AU\xe2\x80\xa6\", \"now\": \"2026-11-30T11:08:19.08631577Z\",\n"
    "  \"num_subscriptions\": 11, \"num_cache\": 2, \"num_inserts\": 11, \"num_removes\": 0, \"num_matches\": 2,\n"
    "  \"cache_hit_rate\": 0, \"max_fanout\": 3, \"avg_fanout\": 2.5,\n"
    "  \"total\": 4, \"offset\": 0, \"limit\": 1024,\n"
    "  \"subscriptions_list\": [\n"
    "    {\"account\":\"APP\",\"subject\":\"orders.created\",\"qgroup\":\"workers\",\"sid\":\"2\",\"msgs\":1,\"cid\":6},\n"
    "    {\"account\":\"APP\",\"subject\":\"orders.created\",\"qgroup\":\"workers\",\"sid\":\"3\",\"msgs\":2,\"cid\":6},\n"
    "    {\"account\":\"APP\",\"subject\":\"orders.\\u003e\",\"sid\":\"1\",\"msgs\":3,\"cid\":7},\n"
    "    {\"account\":\"APP\",\"subject\":\"orders.\\u003e\",\"sid\":\"1\",\"msgs\":4,\"cid\":6}\n"
    "  ]\n"
    "}\n";

/* The unfiltered shape: internal service-import subs (cid 1/2/3, '$' subjects), a bridge (cid 7)
 * and a user (cid 6) with literal, wildcard and AutoUnsubscribe subs. */
static const char MIXED[] =
    "{\"server_id\":\"NX\",\"now\":\"2026-11-30T11:08:19Z\",\"num_subscriptions\":12,\"total\":12,"
    "\"offset\":0,\"limit\":1024,\"subscriptions_list\":["
    "{\"account\":\"APP\",\"subject\":\"$JS.API.\\u003e\",\"sid\":\"1\",\"msgs\":0,\"cid\":3},"
    "{\"account\":\"APP\",\"subject\":\"$SYS.REQ.ACCOUNT.PING.CONNZ\",\"sid\":\"2\",\"msgs\":0,\"cid\":3},"
    "{\"account\":\"APP\",\"subject\":\"$JS.ACK.FLUXON.b1.\\u003e\",\"sid\":\"3\",\"msgs\":0,\"cid\":7},"
    "{\"account\":\"APP\",\"subject\":\"q.orders.bob\",\"qgroup\":\"g\",\"sid\":\"4\",\"msgs\":0,\"cid\":6},"
    "{\"account\":\"APP\",\"subject\":\"q.orders.alice\",\"sid\":\"5\",\"msgs\":0,\"cid\":6},"
    "{\"account\":\"APP\",\"subject\":\"q.orders.*\",\"sid\":\"6\",\"msgs\":0,\"cid\":6},"
    "{\"account\":\"APP\",\"subject\":\"q.*.alice\",\"sid\":\"7\",\"msgs\":0,\"cid\":6},"
    "{\"account\":\"APP\",\"subject\":\"q.orders.bob\",\"qgroup\":\"g\",\"sid\":\"8\",\"msgs\":0,\"cid\":6},"
    "{\"account\":\"APP\",\"subject\":\"foo\",\"sid\":\"9\",\"msgs\":0,\"max\":5,\"cid\":6},"
    "{\"account\":\"APP\",\"subject\":\"orders.\\u003e\",\"qgroup\":\"fluxon\",\"sid\":\"4\",\"msgs\":9,\"cid\":7},"
    "{\"account\":\"APP\",\"subject\":\"q.orders.carol\",\"sid\":\"5\",\"msgs\":0,\"cid\":7},"
    "{\"account\":\"APP\",\"subject\":\"q.\\u0061\\u006c.x\",\"sid\":\"10\",\"msgs\":0,\"cid\":8}"
    "]}";

static fx_err parse(const char *body, const uint64_t *ex, size_t nex, fx_interest *acc,
                    size_t *page_len)
{
    return fx_interest_parse(body, strlen(body), ex, nex, acc, page_len);
}

static void assert_set(const fx_interest *s, const char *const *want, size_t n)
{
    assert_int_equal(s->n, n);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(s->subjects[i], want[i]); /* sorted */
        assert_true(fx_interest_has(s, want[i]));
    }
}

static void stats_only_shape_is_an_empty_page(void **state)
{
    (void)state;
    fx_interest acc = {0};
    size_t pl = 99;
    assert_int_equal(parse(STATS_ONLY, NULL, 0, &acc, &pl), FX_OK);
    assert_int_equal(pl, 0);
    assert_int_equal(acc.n, 0);
    assert_false(fx_interest_has(&acc, "orders.created"));
    /* An explicit empty list and null are empty pages too. */
    assert_int_equal(parse("{\"subscriptions_list\":[]}", NULL, 0, &acc, &pl), FX_OK);
    assert_int_equal(pl, 0);
    assert_int_equal(parse("{\"subscriptions_list\":null}", NULL, 0, &acc, &pl), FX_OK);
    assert_int_equal(pl, 0);
    assert_int_equal(acc.n, 0);
    fx_interest_free(&acc);
}

static void captured_body(void **state)
{
    (void)state;
    fx_interest acc = {0};
    size_t pl = 0;
    assert_int_equal(parse(CAPTURED, NULL, 0, &acc, &pl), FX_OK);
    assert_int_equal(pl, 4); /* every entry counts for paging, skipped or not */
    static const char *const want[] = {"orders.created"};
    assert_set(&acc, want, 1); /* two queue members, one subject; orders.> is a wildcard */
    assert_false(fx_interest_has(&acc, "orders.>"));
    fx_interest_free(&acc);
    assert_int_equal(acc.n, 0);
    assert_null(acc.subjects);

    /* Excluding cid 6 (the only literal subscriber) leaves nothing; excluding 7 changes nothing. */
    const uint64_t ex6[] = {7, 6};
    assert_int_equal(parse(CAPTURED, ex6, 2, &acc, &pl), FX_OK);
    assert_int_equal(pl, 4);
    assert_int_equal(acc.n, 0);
    const uint64_t ex7[] = {7};
    assert_int_equal(parse(CAPTURED, ex7, 1, &acc, &pl), FX_OK);
    assert_set(&acc, want, 1);
    fx_interest_free(&acc);
}

static void own_cids_dollar_subjects_and_wildcards_are_skipped(void **state)
{
    (void)state;
    fx_interest acc = {0};
    size_t pl = 0;
    const uint64_t bridge[] = {7};
    assert_int_equal(parse(MIXED, bridge, 1, &acc, &pl), FX_OK);
    assert_int_equal(pl, 12);
    /* \u0061\u006c decodes to "al"; q.orders.carol belongs to the bridge (cid 7). */
    static const char *const want[] = {"foo", "q.al.x", "q.orders.alice", "q.orders.bob"};
    assert_set(&acc, want, 4);
    assert_false(fx_interest_has(&acc, "q.orders.carol"));
    assert_false(fx_interest_has(&acc, "q.orders.*"));
    assert_false(fx_interest_has(&acc, "$JS.API.>"));
    assert_false(fx_interest_has(&acc, "q.orders"));
    assert_false(fx_interest_has(&acc, "q.orders.alicex"));
    assert_false(fx_interest_has(&acc, ""));
    assert_false(fx_interest_has(NULL, "foo"));
    assert_false(fx_interest_has(&acc, NULL));
    fx_interest_free(&acc);

    /* Without exclusions the bridge's literal sub counts. */
    assert_int_equal(parse(MIXED, NULL, 0, &acc, &pl), FX_OK);
    assert_true(fx_interest_has(&acc, "q.orders.carol"));
    assert_int_equal(acc.n, 5);
    fx_interest_free(&acc);
}

static void pages_accumulate_sorted_and_deduplicated(void **state)
{
    (void)state;
    fx_interest acc = {0};
    size_t pl = 0;
    assert_int_equal(parse("{\"subscriptions_list\":[{\"subject\":\"z.1\",\"cid\":9},"
                           "{\"subject\":\"a.1\",\"cid\":9},{\"subject\":\"m.1\",\"cid\":9},"
                           "{\"subject\":\"a.1\",\"cid\":10}]}",
                           NULL, 0, &acc, &pl),
                     FX_OK);
    assert_int_equal(pl, 4);
    assert_int_equal(parse("{\"subscriptions_list\":[{\"subject\":\"m.1\",\"cid\":11},"
                           "{\"subject\":\"b.1\",\"cid\":11},{\"subject\":\"z.1\",\"cid\":12}]}",
                           NULL, 0, &acc, &pl),
                     FX_OK);
    assert_int_equal(pl, 3);
    static const char *const want[] = {"a.1", "b.1", "m.1", "z.1"};
    assert_set(&acc, want, 4);
    fx_interest_free(&acc);

    /* Many entries, shuffled, with duplicates: has() finds each (bsearch over the sorted set). */
    size_t cap = 64u * 3000u;
    char *body = malloc(cap);
    assert_non_null(body);
    size_t o = (size_t)snprintf(body, cap, "{\"subscriptions_list\":[");
    for (unsigned i = 0; i < 3000; i++) {
        unsigned k = (i * 7919u) % 1000u; /* each of 1000 subjects three times */
        o += (size_t)snprintf(body + o, cap - o, "%s{\"subject\":\"s.%u\",\"cid\":%u}",
                              i ? "," : "", k, i);
    }
    o += (size_t)snprintf(body + o, cap - o, "]}");
    assert_int_equal(fx_interest_parse(body, o, NULL, 0, &acc, &pl), FX_OK);
    assert_int_equal(pl, 3000);
    assert_int_equal(acc.n, 1000);
    for (size_t i = 1; i < acc.n; i++) assert_true(strcmp(acc.subjects[i - 1], acc.subjects[i]) < 0);
    for (unsigned k = 0; k < 1000; k++) {
        char s[32];
        snprintf(s, sizeof s, "s.%u", k);
        assert_true(fx_interest_has(&acc, s));
    }
    assert_false(fx_interest_has(&acc, "s.1000"));
    free(body);
    fx_interest_free(&acc);
}

static void odd_entries_are_skipped_but_counted(void **state)
{
    (void)state;
    fx_interest acc = {0};
    size_t pl = 0;
    assert_int_equal(parse("{\"total\":\"x\",\"subscriptions_list\":[1,null,\"q.a.b\",{},"
                           "{\"subject\":5},{\"subject\":\"\"},{\"subject\":\"a..b\"},"
                           "{\"subject\":\".a\"},{\"subject\":\"a.\"},{\"subject\":\"a b\"},"
                           "{\"subject\":\"a\\tb\"},{\"subject\":\">\"},{\"subject\":\"*\"},"
                           "{\"subject\":\"ok.one\",\"cid\":\"6\"},{\"subject\":\"ok.two\",\"cid\":-1},"
                           "{\"subject\":\"ok.three\"}]}",
                           NULL, 0, &acc, &pl),
                     FX_OK);
    assert_int_equal(pl, 16);
    static const char *const want[] = {"ok.one", "ok.three", "ok.two"};
    assert_set(&acc, want, 3);
    fx_interest_free(&acc);

    /* Subject length bound. */
    char body[3000];
    char subj[1100];
    memset(subj, 'x', sizeof subj - 1);
    subj[sizeof subj - 1] = '\0';
    snprintf(body, sizeof body, "{\"subscriptions_list\":[{\"subject\":\"%s\"}]}", subj);
    assert_int_equal(parse(body, NULL, 0, &acc, &pl), FX_OK);
    assert_int_equal(pl, 1);
    assert_int_equal(acc.n, 0);
    assert_null(acc.subjects); /* an empty set owns no memory */
    fx_interest_free(&acc);
}

static void malformed_bodies(void **state)
{
    (void)state;
    fx_interest acc = {0};
    size_t pl = 7;
    static const char *const bad[] = {
        "", "   ", "{", "not json", "[]", "[{\"subject\":\"a\"}]", "\"str\"", "42", "null",
        "{\"subscriptions_list\":{}}", "{\"subscriptions_list\":\"a\"}",
        "{\"subscriptions_list\":[{\"subject\":\"a.b\"}]} trailing",
        "{\"subscriptions_list\":[{\"subject\":\"a.b\"}", "cb({\"subscriptions_list\":[]})",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pl = 7;
        if (parse(bad[i], NULL, 0, &acc, &pl) != FX_EPROTO) fail_msg("accepted: %s", bad[i]);
        assert_int_equal(pl, 0);
        assert_int_equal(acc.n, 0);
    }
    assert_int_equal(fx_interest_parse(NULL, 0, NULL, 0, &acc, &pl), FX_EINVAL);
    assert_int_equal(fx_interest_parse("{}", 2, NULL, 0, NULL, &pl), FX_EINVAL);
    assert_int_equal(fx_interest_parse("{}", 2, NULL, 1, &acc, &pl), FX_EINVAL);
    /* Trailing whitespace is fine; length is honoured (no NUL needed). */
    assert_int_equal(parse("{\"subscriptions_list\":[{\"subject\":\"a.b\"}]} \n", NULL, 0, &acc, &pl),
                     FX_OK);
    assert_int_equal(fx_interest_parse("{\"subscriptions_list\":[]}GARBAGE", 25, NULL, 0, &acc, &pl),
                     FX_OK);
    assert_int_equal(acc.n, 1);
    fx_interest_free(&acc);
    fx_interest_free(&acc); /* twice is fine */
    fx_interest_free(NULL);
}

static void claim_tokens(void **state)
{
    (void)state;
    const char *s = "q.orders.alice";
    const char *t = fx_interest_claim_token("q.orders", s);
    assert_non_null(t);
    assert_string_equal(t, "alice");
    assert_ptr_equal(t, s + 9); /* a pointer into subject */
    assert_null(fx_interest_claim_token("q.orders", "q.orders"));
    assert_null(fx_interest_claim_token("q.orders", "q.orders."));
    assert_null(fx_interest_claim_token("q.orders", "q.orders.a.b"));
    assert_null(fx_interest_claim_token("q.orders", "q.ordersx.a"));
    assert_null(fx_interest_claim_token("q.orders", "q.orders.*"));
    assert_null(fx_interest_claim_token("q.orders", "q.orders.>"));
    assert_null(fx_interest_claim_token("q.orders", "q.orders.a b"));
    assert_null(fx_interest_claim_token("q.orders", "x.q.orders.a"));
    assert_null(fx_interest_claim_token("q.orders", "q.order.a"));
    assert_null(fx_interest_claim_token("q.orders", "q"));
    assert_null(fx_interest_claim_token("q.orders", ""));
    assert_null(fx_interest_claim_token("", "q.orders.a"));
    assert_null(fx_interest_claim_token(NULL, "q.orders.a"));
    assert_null(fx_interest_claim_token("q.orders", NULL));
    assert_string_equal(fx_interest_claim_token("q.orders-dlq", "q.orders-dlq.alice"), "alice");
    assert_null(fx_interest_claim_token("q.orders", "q.orders-dlq.alice"));
    assert_string_equal(fx_interest_claim_token("q", "q.x"), "x");
}

static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void fetch_connection_refused_is_unavailable(void **state)
{
    (void)state;
    int port = dead_port();
    assert_true(port > 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    fx_interest out = {(char **)1, 5}; /* garbage in: reset by fetch */
    assert_int_equal(fx_interest_fetch(url, "APP", NULL, 0, 2000, &out), FX_EUNAVAIL);
    assert_int_equal(out.n, 0);
    assert_null(out.subjects);
    assert_non_null(strstr(fx_err_detail(), url));
    assert_int_equal(fx_interest_fetch(NULL, "APP", NULL, 0, 2000, &out), FX_EINVAL);
    assert_int_equal(fx_interest_fetch(url, "APP", NULL, 0, 2000, NULL), FX_EINVAL);
}

/* A /routez?subs=detail answer of nats-server 2.9.10 (trimmed): server A with two routes; a
 * plain and a queue subscription of q.orders.remote on server B (account $G), one of another
 * account, a wildcard and a $SYS one. */
static const char ROUTEZ[] =
    "{\"server_id\":\"NA\",\"now\":\"2026-12-01T16:27:00Z\",\"num_routes\":2,\"routes\":["
    "{\"rid\":6,\"remote_id\":\"NB\",\"ip\":\"127.0.0.1\",\"port\":45760,"
    "\"subscriptions_list_detail\":["
    "{\"subject\":\"$SYS.REQ.SERVER.PING\",\"sid\":\"$SYS $SYS.REQ.SERVER.PING\",\"msgs\":0,\"cid\":6},"
    "{\"subject\":\"q.orders.remote\",\"sid\":\"$G q.orders.remote\",\"msgs\":0,\"cid\":6},"
    "{\"subject\":\"q.orders.remote\",\"qgroup\":\"g1\",\"sid\":\"$G q.orders.remote g1\",\"msgs\":0,\"cid\":6},"
    "{\"subject\":\"q.orders.other\",\"sid\":\"APP q.orders.other\",\"msgs\":0,\"cid\":6},"
    "{\"subject\":\"q.orders.>\",\"sid\":\"$G q.orders.>\",\"msgs\":0,\"cid\":6}]},"
    "{\"rid\":7,\"remote_id\":\"NC\",\"ip\":\"127.0.0.1\",\"port\":45762,"
    "\"subscriptions_list_detail\":[]}]}";

static void routed_interest_from_routez(void **state)
{
    (void)state;
    fx_interest acc = {0};
    assert_int_equal(fx_interest_parse_routez(ROUTEZ, strlen(ROUTEZ), "$G", &acc), FX_OK);
    static const char *const want[] = {"q.orders.remote"};
    assert_set(&acc, want, 1); /* queue member deduplicated; APP, wildcard, $SYS skipped */
    fx_interest_free(&acc);
    assert_int_equal(fx_interest_parse_routez(ROUTEZ, strlen(ROUTEZ), "", &acc), FX_OK);
    static const char *const all[] = {"q.orders.other", "q.orders.remote"};
    assert_set(&acc, all, 2); /* no account: every account */
    fx_interest_free(&acc);
    static const char noroutes[] = "{\"server_id\":\"NA\",\"num_routes\":0,\"routes\":null}";
    assert_int_equal(fx_interest_parse_routez(noroutes, strlen(noroutes), "$G", &acc), FX_OK);
    assert_int_equal(acc.n, 0);
    assert_int_equal(fx_interest_parse_routez("[1,", 3, "$G", &acc), FX_EPROTO);
    assert_int_equal(acc.n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stats_only_shape_is_an_empty_page),
        cmocka_unit_test(captured_body),
        cmocka_unit_test(own_cids_dollar_subjects_and_wildcards_are_skipped),
        cmocka_unit_test(pages_accumulate_sorted_and_deduplicated),
        cmocka_unit_test(odd_entries_are_skipped_but_counted),
        cmocka_unit_test(malformed_bodies),
        cmocka_unit_test(claim_tokens),
        cmocka_unit_test(fetch_connection_refused_is_unavailable),
        cmocka_unit_test(routed_interest_from_routez),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
