/* Unit tests: JetStream-shaped ack subjects, ack bodies and PubAcks (plugin/jsack). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsack.h"

static fx_ack_meta sample(void)
{
    fx_ack_meta m;
    memset(&m, 0, sizeof m);
    strcpy(m.bridge, "b1");
    strcpy(m.channel, "orders");
    strcpy(m.claim, "alice");
    m.delivered = 3;
    m.seq = 42;
    m.claim_seq = 7;
    m.ts_ns = 1700000000000000000LL;
    m.pending = 5;
    m.nonce = 623698779; /* "abc123" in base 36 */
    return m;
}

#define EXAMPLE "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc123"

static void build_exact_layout(void **state)
{
    (void)state;
    fx_ack_meta m = sample();
    char out[FX_JSACK_SUBJECT_MAX];
    int n = fx_ack_subject_build(&m, out, sizeof out);
    assert_int_equal(n, (int)strlen(EXAMPLE));
    assert_string_equal(out, EXAMPLE);
}

/* Split like nats.go GetMetadataFields / nats.js parseInfo and read the positions they read. */
static void token_positions_a_jetstream_client_reads(void **state)
{
    (void)state;
    fx_ack_meta m = sample();
    char out[FX_JSACK_SUBJECT_MAX];
    assert_true(fx_ack_subject_build(&m, out, sizeof out) > 0);
    char *toks[16];
    int nt = 0;
    for (char *save = NULL, *t = strtok_r(out, ".", &save); t && nt < 16;
         t = strtok_r(NULL, ".", &save))
        toks[nt++] = t;
    assert_int_equal(nt, 12); /* v2 layout: 12 tokens (nats.go accepts >= 11) */
    assert_string_equal(toks[0], "$JS");
    assert_string_equal(toks[1], "ACK");
    assert_string_equal(toks[2], "FLUXON");  /* AckDomainTokenPos */
    assert_string_equal(toks[3], "b1");      /* AckAccHashTokenPos */
    assert_string_equal(toks[4], "orders");  /* AckStreamTokenPos = stream */
    assert_string_equal(toks[5], "alice");   /* AckConsumerTokenPos = consumer */
    assert_string_equal(toks[6], "3");       /* AckNumDeliveredTokenPos */
    assert_string_equal(toks[7], "42");      /* AckStreamSeqTokenPos */
    assert_string_equal(toks[8], "7");       /* AckConsumerSeqTokenPos */
    assert_string_equal(toks[9], "1700000000000000000"); /* AckTimestampSeqTokenPos */
    assert_string_equal(toks[10], "5");      /* AckNumPendingTokenPos */
    assert_string_equal(toks[11], "abc123"); /* random token, opaque to clients */
}

static void parse_example(void **state)
{
    (void)state;
    fx_ack_meta m;
    memset(&m, 0xAA, sizeof m);
    assert_int_equal(fx_ack_subject_parse(EXAMPLE, &m), 0);
    assert_string_equal(m.bridge, "b1");
    assert_string_equal(m.channel, "orders");
    assert_string_equal(m.claim, "alice");
    assert_true(m.delivered == 3);
    assert_true(m.seq == 42);
    assert_true(m.claim_seq == 7);
    assert_true(m.ts_ns == 1700000000000000000LL);
    assert_true(m.pending == 5);
    assert_true(m.nonce == 623698779u);
}

static void round_trips(void **state)
{
    (void)state;
    const uint64_t vals[] = {0, 1, 9, 10, 35, 36, 1295, 1296, 4294967295u, 1ull << 63,
                             UINT64_MAX - 1, UINT64_MAX};
    size_t nv = sizeof vals / sizeof vals[0];
    for (size_t i = 0; i < nv; i++) {
        fx_ack_meta m = sample(), p;
        m.delivered = vals[i];
        m.seq = vals[(i + 1) % nv];
        m.claim_seq = vals[(i + 2) % nv];
        m.pending = vals[(i + 3) % nv];
        m.nonce = vals[(i + 4) % nv];
        m.ts_ns = (int64_t)(vals[i] & INT64_MAX);
        char out[FX_JSACK_SUBJECT_MAX], again[FX_JSACK_SUBJECT_MAX];
        int n = fx_ack_subject_build(&m, out, sizeof out);
        assert_true(n > 0);
        assert_int_equal(fx_ack_subject_parse(out, &p), 0);
        assert_memory_equal(&m, &p, sizeof m);
        assert_int_equal(fx_ack_subject_build(&p, again, sizeof again), n);
        assert_string_equal(out, again);
    }
    /* Extremes of the nonce encoding. */
    fx_ack_meta m = sample(), p;
    char out[FX_JSACK_SUBJECT_MAX];
    m.nonce = UINT64_MAX;
    assert_true(fx_ack_subject_build(&m, out, sizeof out) > 0);
    assert_non_null(strstr(out, ".3w5e11264sgsf"));
    m.nonce = 0;
    assert_true(fx_ack_subject_build(&m, out, sizeof out) > 0);
    assert_int_equal(fx_ack_subject_parse(out, &p), 0);
    assert_true(p.nonce == 0);
    /* Names with bytes a token allows. */
    strcpy(m.bridge, "host-1_pid:42");
    strcpy(m.channel, "orders-dlq");
    strcpy(m.claim, "caf\xc3\xa9");
    assert_true(fx_ack_subject_build(&m, out, sizeof out) > 0);
    assert_int_equal(fx_ack_subject_parse(out, &p), 0);
    assert_memory_equal(&m, &p, sizeof m);
}

static void build_rejects_bad_names_and_small_buffers(void **state)
{
    (void)state;
    char out[FX_JSACK_SUBJECT_MAX];
    const char *bad[] = {"", "a.b", "*", ">", "a b", "a\tb", "a\nb", "a\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fx_ack_meta m = sample();
        strcpy(m.claim, bad[i]);
        assert_int_equal(fx_ack_subject_build(&m, out, sizeof out), -1);
        m = sample();
        strcpy(m.channel, bad[i]);
        assert_int_equal(fx_ack_subject_build(&m, out, sizeof out), -1);
        m = sample();
        strcpy(m.bridge, bad[i]);
        assert_int_equal(fx_ack_subject_build(&m, out, sizeof out), -1);
    }
    fx_ack_meta m = sample();
    memset(m.claim, 'x', sizeof m.claim); /* not terminated within the field */
    assert_int_equal(fx_ack_subject_build(&m, out, sizeof out), -1);
    m = sample();
    m.ts_ns = -1;
    assert_int_equal(fx_ack_subject_build(&m, out, sizeof out), -1);
    m = sample();
    size_t len = strlen(EXAMPLE);
    assert_int_equal(fx_ack_subject_build(&m, out, len), -1); /* no room for the NUL */
    assert_int_equal(fx_ack_subject_build(&m, out, len + 1), (int)len);
    assert_int_equal(fx_ack_subject_build(&m, out, 0), -1);
    assert_int_equal(fx_ack_subject_build(NULL, out, sizeof out), -1);
    /* Three 127-byte names and max numbers exceed FX_JSACK_SUBJECT_MAX: refused, not cut. */
    memset(m.bridge, 'b', 127);
    m.bridge[127] = '\0';
    memset(m.channel, 'c', 127);
    m.channel[127] = '\0';
    memset(m.claim, 'd', 127);
    m.claim[127] = '\0';
    m.delivered = m.seq = m.claim_seq = m.pending = m.nonce = UINT64_MAX;
    m.ts_ns = INT64_MAX;
    char big[2048];
    assert_int_equal(fx_ack_subject_build(&m, big, sizeof big), -1);
    m.delivered = m.seq = m.claim_seq = m.pending = m.nonce = 1;
    m.ts_ns = 1;
    int n = fx_ack_subject_build(&m, big, sizeof big);
    assert_true(n > 0 && n < FX_JSACK_SUBJECT_MAX);
    fx_ack_meta p;
    assert_int_equal(fx_ack_subject_parse(big, &p), 0);
    assert_memory_equal(&m, &p, sizeof m);
}

static void parse_rejects_malformed(void **state)
{
    (void)state;
    static const char *bad[] = {
        /* token count */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5",          /* 11 */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc.x",    /* 13 */
        "$JS.ACK.orders.alice.3.42.7.1700000000000000000.5",                    /* v1, 9 */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc123.",  /* trailing dot */
        "$JS.ACK.FLUXON.b1..alice.3.42.7.1700000000000000000.5.abc123",         /* empty token */
        ".$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc123",
        "", "$JS.ACK.FLUXON.", "$JS.ACK.FLUXON",
        /* prefix */
        "$JS.ACK.OTHER.b1.orders.alice.3.42.7.1700000000000000000.5.abc123",
        "$JS.ACK._.b1.orders.alice.3.42.7.1700000000000000000.5.abc123",
        "$js.ack.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc123",
        "JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc123",
        "$JS.NAK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc123",
        /* non-numeric / non-canonical numbers */
        "$JS.ACK.FLUXON.b1.orders.alice.x.42.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.-42.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.+42.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42x.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.0x7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.042.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1.7e18.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000. 5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.ABC123",   /* nonce case */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.0abc",     /* nonce zero pad */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1700000000000000000.5.abc-1",
        /* overflow */
        "$JS.ACK.FLUXON.b1.orders.alice.18446744073709551616.42.7.1.5.abc123",  /* 2^64 */
        "$JS.ACK.FLUXON.b1.orders.alice.3.99999999999999999999.7.1.5.abc123",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1.123456789012345678901.abc123", /* 21 digits */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.9223372036854775808.5.abc123",   /* ts > INT64 */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1.5.3w5e11264sgsg",              /* nonce 2^64 */
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1.5.zzzzzzzzzzzzz",
        "$JS.ACK.FLUXON.b1.orders.alice.3.42.7.1.5.10000000000000",             /* 14 digits */
        /* names */
        "$JS.ACK.FLUXON.b1.orders.*.3.42.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b1.>.alice.3.42.7.1700000000000000000.5.abc123",
        "$JS.ACK.FLUXON.b 1.orders.alice.3.42.7.1700000000000000000.5.abc123",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fx_ack_meta m;
        if (fx_ack_subject_parse(bad[i], &m) != -1) fail_msg("accepted: %s", bad[i]);
    }
    /* Edges that are valid. */
    fx_ack_meta m;
    assert_int_equal(fx_ack_subject_parse(
                         "$JS.ACK.FLUXON.b1.orders.alice.18446744073709551615.0.0.9223372036854775807.0.3w5e11264sgsf",
                         &m),
                     0);
    assert_true(m.delivered == UINT64_MAX && m.ts_ns == INT64_MAX && m.nonce == UINT64_MAX);
    assert_int_equal(fx_ack_subject_parse(NULL, &m), -1);
    assert_int_equal(fx_ack_subject_parse(EXAMPLE, NULL), -1);
    /* A 128-byte name does not fit the fields; an over-long subject is refused unread. */
    char s[4096];
    char name[129];
    memset(name, 'n', 128);
    name[128] = '\0';
    snprintf(s, sizeof s, "$JS.ACK.FLUXON.b1.orders.%s.3.42.7.1.5.a", name);
    assert_int_equal(fx_ack_subject_parse(s, &m), -1);
    memset(s, 'a', sizeof s - 1);
    s[sizeof s - 1] = '\0';
    memcpy(s, "$JS.ACK.FLUXON.", 15);
    assert_int_equal(fx_ack_subject_parse(s, &m), -1);
}

static fx_ack_kind body(const char *s, int64_t *d)
{
    return fx_ack_body_parse(s, strlen(s), d);
}

static void ack_bodies(void **state)
{
    (void)state;
    int64_t d = 77;
    assert_int_equal(fx_ack_body_parse("", 0, &d), FX_ACK_ACK);
    assert_true(d == 0);
    assert_int_equal(fx_ack_body_parse(NULL, 0, &d), FX_ACK_ACK);
    assert_int_equal(body("+ACK", &d), FX_ACK_ACK);
    assert_int_equal(body("+ACK\r\n", &d), FX_ACK_ACK);
    assert_int_equal(body("  \n", &d), FX_ACK_ACK);
    assert_int_equal(body("+WPI", &d), FX_ACK_WPI);
    assert_int_equal(body("+WPI ", &d), FX_ACK_WPI);
    assert_int_equal(body("+TERM", &d), FX_ACK_TERM);
    assert_int_equal(body("+TERM bad payload", &d), FX_ACK_TERM);
    assert_int_equal(body("+TERM \n", &d), FX_ACK_TERM);
    d = 77;
    assert_int_equal(body("-NAK", &d), FX_ACK_NAK);
    assert_true(d == 0);
    /* nats.js: `-NAK ${JSON.stringify({delay})}`; nats.go: `-NAK {"delay": %d}`. */
    assert_int_equal(body("-NAK {\"delay\":5000000000}", &d), FX_ACK_NAK);
    assert_true(d == 5000000000LL);
    assert_int_equal(body("-NAK {\"delay\": 250000000}\n", &d), FX_ACK_NAK);
    assert_true(d == 250000000LL);
    assert_int_equal(body("-NAK {\"delay\":0}", &d), FX_ACK_NAK);
    assert_true(d == 0);
    assert_int_equal(body("-NAK  { \"delay\" : 7 , \"x\":1 }", &d), FX_ACK_NAK);
    assert_true(d == 7);
    assert_int_equal(fx_ack_body_parse("-NAK", 4, NULL), FX_ACK_NAK);

    static const char *junk[] = {
        "ACK", "+ack", "+ACKX", "+ACK extra", " +ACK", "+NXT", "+OK", "+WPIX", "+WPI x",
        "+TERMINATE", "+TERM\treason", "-NAKED", "-NAK5s", "-NAK 5s", "-NAK {}",
        "-NAK {\"delay\":-1}", "-NAK {\"delay\":1.5}", "-NAK {\"delay\":\"5s\"}",
        "-NAK {\"delay\":1e30}", "-NAK {\"delay\":5", "-NAK [5]", "-NAK {\"delay\":5} x",
        "hello", "\xff\xfe",
    };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        d = 99;
        if (body(junk[i], &d) != FX_ACK_INVALID) fail_msg("accepted body: %s", junk[i]);
        assert_true(d == 0);
    }
    /* Embedded NUL and a bounded NAK argument. */
    assert_int_equal(fx_ack_body_parse("+ACK\0", 5, &d), FX_ACK_INVALID);
    char big[600];
    memset(big, ' ', sizeof big);
    memcpy(big, "-NAK {\"delay\":1", 15);
    big[sizeof big - 2] = '}';
    big[sizeof big - 1] = 'x';
    assert_int_equal(fx_ack_body_parse(big, sizeof big, &d), FX_ACK_INVALID);
}

static void pubacks(void **state)
{
    (void)state;
    char out[512];
    assert_int_equal(fx_puback_ok("orders", 12, out, sizeof out), 28);
    assert_string_equal(out, "{\"stream\":\"orders\",\"seq\":12}");
    assert_int_equal(fx_puback_err(503, "channel full", out, sizeof out),
                     (int)strlen("{\"error\":{\"code\":503,\"description\":\"channel full\"}}"));
    assert_string_equal(out, "{\"error\":{\"code\":503,\"description\":\"channel full\"}}");
    /* JetStream's shape for a full stream, with err_code. */
    assert_true(fx_puback_err_code(503, FX_JS_ERR_MAX_MSGS, "maximum messages exceeded", out,
                                   sizeof out) > 0);
    assert_string_equal(out, "{\"error\":{\"code\":503,\"err_code\":10077,"
                             "\"description\":\"maximum messages exceeded\"}}");
    assert_true(fx_puback_err_code(400, 0, "x", out, sizeof out) > 0);
    assert_string_equal(out, "{\"error\":{\"code\":400,\"description\":\"x\"}}");
    assert_true(fx_puback_ok("orders", UINT64_MAX, out, sizeof out) > 0);
    assert_string_equal(out, "{\"stream\":\"orders\",\"seq\":18446744073709551615}");
    /* Escaping. */
    assert_true(fx_puback_err(500, "a\"b\\c\nd\te\x01", out, sizeof out) > 0);
    assert_string_equal(out,
                        "{\"error\":{\"code\":500,\"description\":\"a\\\"b\\\\c\\nd\\te\\u0001\"}}");
    assert_true(fx_puback_ok("o\"s", 1, out, sizeof out) > 0);
    assert_string_equal(out, "{\"stream\":\"o\\\"s\",\"seq\":1}");
    assert_true(fx_puback_err(413, NULL, out, sizeof out) > 0);
    assert_string_equal(out, "{\"error\":{\"code\":413,\"description\":\"\"}}");
    /* Exact fit and one byte short. */
    int n = (int)strlen("{\"stream\":\"orders\",\"seq\":12}");
    char small[64];
    assert_int_equal(fx_puback_ok("orders", 12, small, (size_t)n + 1), n);
    assert_int_equal(fx_puback_ok("orders", 12, small, (size_t)n), -1);
    assert_int_equal(fx_puback_err(503, "channel full", small, 20), -1);
    assert_int_equal(fx_puback_ok(NULL, 1, out, sizeof out), -1);
    /* A long description is cut (bounded) on a UTF-8 boundary; a huge stream name is refused. */
    char desc[2000];
    for (size_t i = 0; i + 2 < sizeof desc; i += 2) memcpy(desc + i, "\xc3\xa9", 2);
    desc[sizeof desc - 2] = '\0';
    char big[4096];
    int bl = fx_puback_err(500, desc, big, sizeof big);
    assert_true(bl > 0 && bl < 400);
    const char *q = strstr(big, "\"description\":\"") + 15;
    size_t dl = strlen(q) - 3; /* minus "}} */
    assert_true(dl % 2 == 0 && dl <= 256);
    assert_string_equal(q + dl, "\"}}");
    char longname[1000];
    memset(longname, 's', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(fx_puback_ok(longname, 1, big, sizeof big), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(build_exact_layout),
        cmocka_unit_test(token_positions_a_jetstream_client_reads),
        cmocka_unit_test(parse_example),
        cmocka_unit_test(round_trips),
        cmocka_unit_test(build_rejects_bad_names_and_small_buffers),
        cmocka_unit_test(parse_rejects_malformed),
        cmocka_unit_test(ack_bodies),
        cmocka_unit_test(pubacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
