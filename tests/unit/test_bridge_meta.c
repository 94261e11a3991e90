/* Unit tests for bridge/meta.c: JSON codecs, aliases, exact big ints, strictness, fuzz. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "meta.h"

#define BIG1 4611686018427387905LL /* 2^62 + 1: not representable as a double */
#define BIG2 7587869432749186305LL /* an etcd-style lease id */
#define P53 9007199254740993LL     /* 2^53 + 1 */

/* Decoders read from an exact-size heap copy so ASan catches any read past the input. */
static char *hc;
static size_t hn;
static const char *HN(const void *txt, size_t n)
{
    free(hc);
    hc = malloc(n ? n : 1);
    assert_non_null(hc);
    if (n) memcpy(hc, txt, n);
    hn = n;
    return hc;
}
#define DEC(fn, txt, out) (HN((txt), strlen(txt)), fn(hc, hn, (out)))
#define DECN(fn, txt, n, out) (HN((txt), (n)), fn(hc, hn, (out)))
static int teardown(void **state)
{
    (void)state;
    free(hc);
    hc = NULL;
    return 0;
}

static void detail_has(const char *s)
{
    if (!strstr(fx_err_detail(), s)) fail_msg("detail '%s' lacks '%s'", fx_err_detail(), s);
}

/* ---- decimal ------------------------------------------------------------------------------------ */

static void test_dec(void **state)
{
    (void)state;
    int64_t v = 0;
    struct {
        const char *s;
        int64_t v;
    } ok[] = {{"0", 0},
              {"7", 7},
              {"-1", -1},
              {"10", 10},
              {"9223372036854775807", INT64_MAX},
              {"-9223372036854775808", INT64_MIN},
              {"4611686018427387905", BIG1}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(fx_mq_dec_parse(ok[i].s, strlen(ok[i].s), INT64_MIN, INT64_MAX, "x", &v),
                         FX_OK);
        assert_true(v == ok[i].v);
        char b[FX_MQ_DEC_BUF];
        assert_int_equal(fx_mq_dec_format(ok[i].v, b), strlen(ok[i].s));
        assert_string_equal(b, ok[i].s);
    }
    const char *bad[] = {"",   "-",   "+1",  "01",  "-0",   "-01", " 1", "1 ", "1a", "0x10",
                         "1.0", "1e3", "9223372036854775808", "-9223372036854775809",
                         "99999999999999999999", "000000000000000000001", "\xd9\xa1", "--1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 42;
        assert_int_equal(fx_mq_dec_parse(bad[i], strlen(bad[i]), INT64_MIN, INT64_MAX, "thing", &v),
                         FX_EPROTO);
        assert_int_equal(v, 42);
        detail_has("thing");
    }
    /* not NUL-terminated: only len bytes count */
    assert_int_equal(fx_mq_dec_parse("123456", 3, 0, 1000, NULL, &v), FX_OK);
    assert_int_equal(v, 123);
    assert_int_equal(fx_mq_dec_parse("1\0002", 3, 0, 1000, NULL, &v), FX_EPROTO);
    /* range */
    assert_int_equal(fx_mq_dec_parse("5", 1, 6, 10, "r", &v), FX_EPROTO);
    detail_has("out of range");
    assert_int_equal(fx_mq_dec_parse(NULL, 1, 0, 1, "r", &v), FX_EINVAL);
    assert_int_equal(fx_mq_dec_parse("1", 1, 0, 1, "r", NULL), FX_EINVAL);

    assert_int_equal(fx_mq_counter_decode("17", 2, &v), FX_OK);
    assert_int_equal(v, 17);
    assert_int_equal(fx_mq_counter_decode("-1", 2, &v), FX_EPROTO);
    assert_int_equal(fx_mq_produce_offset_decode("-1", 2, &v), FX_OK);
    assert_int_equal(v, -1);
    assert_int_equal(fx_mq_produce_offset_decode("-2", 2, &v), FX_EPROTO);
    assert_int_equal(fx_mq_consume_offset_decode("0", 1, &v), FX_OK);
    assert_int_equal(fx_mq_consume_offset_decode("-1", 2, &v), FX_EPROTO);
    assert_int_equal(fx_mq_lease_id_decode("7587869432749186305", 19, &v), FX_OK);
    assert_true(v == BIG2);
    assert_int_equal(fx_mq_lease_id_decode("0", 1, &v), FX_EPROTO);
    assert_int_equal(fx_mq_id_decode("33", 2, &v), FX_OK);
    assert_int_equal(fx_mq_id_decode(FX_MQ_ROLE_KEY_VALUE, strlen(FX_MQ_ROLE_KEY_VALUE), &v),
                     FX_EPROTO);
    assert_int_equal(fx_mq_counter_decode(FX_MQ_NEXT_CHANNEL_ID_VALUE, 1, &v), FX_OK);
    assert_int_equal(fx_mq_id_decode(FX_MQ_DEFAULT_WEIGHT_VALUE, 1, &v), FX_OK);
    assert_int_equal(v, 1);
}

static void test_dec_random_roundtrip(void **state)
{
    (void)state;
    srand(777);
    for (int i = 0; i < 100000; i++) {
        int64_t x = (int64_t)((uint64_t)rand() << 42 ^ (uint64_t)rand() << 21 ^ (uint64_t)rand());
        x >>= rand() % 63;
        if (rand() & 1) x = -x;
        char b[FX_MQ_DEC_BUF];
        size_t n = fx_mq_dec_format(x, b);
        int64_t y;
        assert_int_equal(fx_mq_dec_parse(b, n, INT64_MIN, INT64_MAX, NULL, &y), FX_OK);
        assert_true(x == y);
    }
}

/* ---- ChanGlobalMeta ----------------------------------------------------------------------------- */

static const char CHAN_OK[] =
    "{\"capacity\":100,\"ttl_seconds\":90,\"global_lease_id\":4611686018427387905,"
    "\"global_long_lease_id\":9223372036854775807,\"payload_lease_id\":7587869432749186305}";

static void test_chan_meta_roundtrip(void **state)
{
    (void)state;
    fx_mq_chan_meta m = {100, 90, BIG1, INT64_MAX, BIG2}, d;
    char *js = NULL;
    assert_int_equal(fx_mq_chan_meta_encode(&m, &js), FX_OK);
    assert_string_equal(js, CHAN_OK);
    memset(&d, 0, sizeof d);
    assert_int_equal(DEC(fx_mq_chan_meta_decode, js, &d), FX_OK);
    assert_memory_equal(&m, &d, sizeof m);
    free(js);
    /* whitespace, other field order, unknown fields (also nested, with numbers) */
    const char *t =
        " {\n\"x\": {\"a\": [1, 2.5e3, \"3\", {\"q\": -7}], \"b\": null},"
        " \"note\": \"say \\\"12\\\" 34 \\\\\", \"payload_lease_id\" : 7587869432749186305,"
        " \"capacity\": 100, \"y\": 1.5, \"ttl_seconds\": 90, \"global_lease_id\":4611686018427387905,"
        "\"z\":[-1e400],\"global_long_lease_id\": 9223372036854775807 }\r\n";
    memset(&d, 0, sizeof d);
    assert_int_equal(DEC(fx_mq_chan_meta_decode, t, &d), FX_OK);
    assert_memory_equal(&m, &d, sizeof m);
}

/* payload_format: written only for segments; absent means one key per message (the reference
 * layout); any other value is refused, so a reader never misreads a layout it does not know. */
static void test_chan_meta_payload_format(void **state)
{
    (void)state;
    fx_mq_chan_meta m = {.capacity = 10, .ttl_seconds = 90, .global_lease_id = 1,
                         .global_long_lease_id = 2, .payload_lease_id = 3, .segments = true};
    fx_mq_chan_meta d;
    char *js = NULL;
    assert_int_equal(fx_mq_chan_meta_encode(&m, &js), FX_OK);
    assert_non_null(strstr(js, "\"payload_format\":\"segment\""));
    memset(&d, 0, sizeof d);
    assert_int_equal(DEC(fx_mq_chan_meta_decode, js, &d), FX_OK);
    assert_true(d.segments);
    free(js);
    m.segments = false;
    assert_int_equal(fx_mq_chan_meta_encode(&m, &js), FX_OK);
    assert_null(strstr(js, "payload_format"));
    d.segments = true;
    assert_int_equal(DEC(fx_mq_chan_meta_decode, js, &d), FX_OK);
    assert_false(d.segments);
    free(js);
    const char *bad = "{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,"
                      "\"global_long_lease_id\":2,\"payload_lease_id\":3,"
                      "\"payload_format\":\"zstd\"}";
    assert_int_equal(DEC(fx_mq_chan_meta_decode, bad, &d), FX_EPROTO);
    assert_non_null(strstr(fx_err_detail(), "unsupported value 'zstd'"));
}

/* The codecs accept any ttl >= FX_MQ_CODEC_MIN_TTL_SECONDS (1): the product minimum (90 by
 * default) is the client's min_ttl_s, checked by fx__mq_cfg_validate, not here. */
static void test_short_ttl_accepted(void **state)
{
    (void)state;
    fx_mq_chan_meta m = {2, 1, 5, 6, 7}, d;
    char *js = NULL;
    assert_int_equal(fx_mq_chan_meta_encode(&m, &js), FX_OK);
    memset(&d, 0, sizeof d);
    assert_int_equal(DEC(fx_mq_chan_meta_decode, js, &d), FX_OK);
    assert_memory_equal(&m, &d, sizeof m);
    free(js);
    fx_mq_mpmc_meta mm = {2, 3, 1.0, 5, 6, 7}, md;
    assert_int_equal(fx_mq_mpmc_meta_encode(&mm, &js), FX_OK);
    memset(&md, 0, sizeof md);
    assert_int_equal(DEC(fx_mq_mpmc_meta_decode, js, &md), FX_OK);
    assert_true(md.ttl_seconds == 3 && md.capacity == 2 && md.metadata_lease_id == 5);
    free(js);
}

static void test_chan_meta_aliases_and_forms(void **state)
{
    (void)state;
    fx_mq_chan_meta d;
    /* aliases (the reference's older field names) */
    const char *a1 = "{\"capacity\":1,\"ttl_seconds\":90,\"meta_lease_id\":7587869432749186305,"
                     "\"cluster_long_lease_id\":9223372036854775807,\"payload_lease_id\":3}";
    assert_int_equal(DEC(fx_mq_chan_meta_decode, a1, &d), FX_OK);
    assert_true(d.global_lease_id == BIG2 && d.global_long_lease_id == INT64_MAX);
    assert_true(d.capacity == 1 && d.payload_lease_id == 3);
    const char *a2 = "{\"capacity\":1,\"ttl_seconds\":90,\"cluster_lease_id\":5,"
                     "\"global_long_lease_id\":6,\"payload_lease_id\":3}";
    assert_int_equal(DEC(fx_mq_chan_meta_decode, a2, &d), FX_OK);
    assert_true(d.global_lease_id == 5 && d.global_long_lease_id == 6);
    /* string forms and integral non-literal forms */
    const char *s1 = "{\"capacity\":\"10\",\"ttl_seconds\":9e1,\"global_lease_id\":\"4611686018427387905\","
                     "\"global_long_lease_id\":6.0,\"payload_lease_id\":9007199254740993}";
    assert_int_equal(DEC(fx_mq_chan_meta_decode, s1, &d), FX_OK);
    assert_true(d.capacity == 10 && d.ttl_seconds == 90 && d.global_lease_id == BIG1);
    assert_true(d.global_long_lease_id == 6 && d.payload_lease_id == P53); /* exact past 2^53 */
    /* non-literal exactly at 2^53 is fine; beyond is refused (cannot be exact) */
    const char *s2 = "{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":9.007199254740992e15,"
                     "\"global_long_lease_id\":6,\"payload_lease_id\":3}";
    assert_int_equal(DEC(fx_mq_chan_meta_decode, s2, &d), FX_OK);
    assert_true(d.global_lease_id == 9007199254740992LL);
    const char *s3 = "{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":4.6e18,"
                     "\"global_long_lease_id\":6,\"payload_lease_id\":3}";
    assert_int_equal(DEC(fx_mq_chan_meta_decode, s3, &d), FX_EPROTO);
    detail_has("global_lease_id");
}

static void chan_bad(const char *json, const char *detail)
{
    fx_mq_chan_meta d = {-5, -5, -5, -5, -5};
    fx_err e = DEC(fx_mq_chan_meta_decode, json, &d);
    if (e != FX_EPROTO) fail_msg("accepted (%d): %s", (int)e, json);
    if (detail) detail_has(detail);
    assert_true(d.capacity == -5 && d.payload_lease_id == -5); /* untouched */
}

#define CM(cap, ttl, gl, gll, pl)                                                                  \
    "{\"capacity\":" cap ",\"ttl_seconds\":" ttl ",\"global_lease_id\":" gl                        \
    ",\"global_long_lease_id\":" gll ",\"payload_lease_id\":" pl "}"

static void test_chan_meta_reject(void **state)
{
    (void)state;
    chan_bad(CM("1", "90", "1", "1", "null"), "payload_lease_id");
    chan_bad(CM("1", "90", "1", "1", "0"), "payload_lease_id");
    chan_bad(CM("1", "90", "1", "1", "-4"), "payload_lease_id");
    chan_bad(CM("1", "0", "1", "1", "1"), "ttl_seconds");
    chan_bad(CM("1", "-3", "1", "1", "1"), "ttl_seconds");
    chan_bad(CM("1", "9000000001", "1", "1", "1"), "ttl_seconds");
    chan_bad(CM("0", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("-1", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("1.5", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("1e300", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("1e400", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("01", "90", "1", "1", "1"), "capacity");   /* leading zero literal */
    chan_bad(CM("-0", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("\"01\"", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("\" 1\"", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("\"1.0\"", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("\"\"", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("true", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("[1]", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("{}", "90", "1", "1", "1"), "capacity");
    chan_bad(CM("1", "90", "9223372036854775808", "1", "1"), "global_lease_id");
    chan_bad(CM("1", "90", "\"9223372036854775808\"", "1", "1"), "global_lease_id");
    chan_bad(CM("1", "90", "-9223372036854775809", "1", "1"), "global_lease_id");
    chan_bad(CM("1", "90", "1", "0", "1"), "global_long_lease_id");
    /* missing fields */
    chan_bad("{\"ttl_seconds\":90,\"global_lease_id\":1,\"global_long_lease_id\":1,"
             "\"payload_lease_id\":1}", "capacity");
    chan_bad("{\"capacity\":1,\"ttl_seconds\":90,\"global_long_lease_id\":1,\"payload_lease_id\":1}",
             "global_lease_id");
    chan_bad("{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,\"payload_lease_id\":1}",
             "global_long_lease_id");
    chan_bad("{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,\"global_long_lease_id\":1}",
             "payload_lease_id");
    /* names are case-sensitive */
    chan_bad("{\"Capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,\"global_long_lease_id\":1,"
             "\"payload_lease_id\":1}", "capacity");
    /* duplicates, and a field together with its alias */
    chan_bad("{\"capacity\":1,\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,"
             "\"global_long_lease_id\":1,\"payload_lease_id\":1}", "duplicate");
    chan_bad("{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,\"meta_lease_id\":1,"
             "\"global_long_lease_id\":1,\"payload_lease_id\":1}", "alias");
    chan_bad("{\"capacity\":1,\"ttl_seconds\":90,\"cluster_lease_id\":1,\"meta_lease_id\":1,"
             "\"global_long_lease_id\":1,\"payload_lease_id\":1}", "duplicate");
    chan_bad("{\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,\"cluster_long_lease_id\":2,"
             "\"global_long_lease_id\":1,\"payload_lease_id\":1}", "duplicate");
    /* not one JSON object */
    chan_bad("", "empty");
    chan_bad("   ", NULL);
    chan_bad("[]", "object");
    chan_bad("17", "object");
    chan_bad("\"x\"", "object");
    chan_bad("null", "object");
    chan_bad("{", "JSON");
    chan_bad("{\"capacity\":1,}", "JSON");
    chan_bad("{'capacity':1}", "JSON");
    chan_bad(CM("1", "90", "1", "1", "1") "x", "trailing");
    chan_bad(CM("1", "90", "1", "1", "1") "{}", "trailing");
    chan_bad(CM("1", "90", "1", "1", "1") CM("1", "90", "1", "1", "1"), "trailing");
    chan_bad(CM("NaN", "90", "1", "1", "1"), NULL);
    chan_bad(CM("Infinity", "90", "1", "1", "1"), NULL);
    chan_bad(CM("-Infinity", "90", "1", "1", "1"), NULL);
    chan_bad(CM("0x10", "90", "1", "1", "1"), NULL);
    chan_bad(CM("+1", "90", "1", "1", "1"), NULL);
    chan_bad(CM("1.", "90", "1", "1", "1"), NULL);
    /* 70-digit number: longer than cJSON's number buffer */
    chan_bad(CM("1000000000000000000000000000000000000000000000000000000000000000000000", "90",
                "1", "1", "1"), NULL);
    /* nesting too deep (in an unknown field) */
    chan_bad("{\"x\":[[[[[[[[[1]]]]]]]]]," CM("1", "90", "1", "1", "1") "}", "nesting");
    /* \u0000 in a field name would alias "capacity" after truncation */
    chan_bad("{\"capacity\\u0000x\":5,\"capacity\":1,\"ttl_seconds\":90,\"global_lease_id\":1,"
             "\"global_long_lease_id\":1,\"payload_lease_id\":1}", "u0000");
    /* raw NUL byte */
    {
        char b[] = "{\"capacity\":1 ,\"ttl_seconds\":90,\"global_lease_id\":1,"
                   "\"global_long_lease_id\":1,\"payload_lease_id\":1}";
        b[13] = '\0';
        fx_mq_chan_meta d;
        assert_int_equal(DECN(fx_mq_chan_meta_decode, b, sizeof b - 1, &d), FX_EPROTO);
        detail_has("NUL");
    }
    /* too large */
    {
        size_t n = FX_MQ_META_JSON_MAX + 1;
        char *b = malloc(n);
        memset(b, ' ', n);
        const char *core = CM("1", "90", "1", "1", "1");
        memcpy(b, core, strlen(core));
        fx_mq_chan_meta d;
        assert_int_equal(DECN(fx_mq_chan_meta_decode, b, n, &d), FX_EPROTO);
        detail_has("more than");
        assert_int_equal(DECN(fx_mq_chan_meta_decode, b, n - 1, &d), FX_OK);
        free(b);
    }
    /* argument errors */
    fx_mq_chan_meta d;
    assert_int_equal(fx_mq_chan_meta_decode(NULL, 5, &d), FX_EINVAL);
    assert_int_equal(fx_mq_chan_meta_decode("{}", 2, NULL), FX_EINVAL);
    assert_int_equal(fx_mq_chan_meta_decode(NULL, 0, &d), FX_EPROTO);
}

static void test_chan_meta_encode_reject(void **state)
{
    (void)state;
    char *js = (char *)1;
    fx_mq_chan_meta good = {1, 90, 1, 1, 1};
    fx_mq_chan_meta bad[] = {
        {0, 90, 1, 1, 1}, {1, 0, 1, 1, 1}, {1, 90, 0, 1, 1}, {1, 90, 1, -1, 1}, {1, 90, 1, 1, 0},
        {1, FX_MQ_MAX_TTL_SECONDS + 1, 1, 1, 1}, {INT64_MIN, 90, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        js = (char *)1;
        assert_int_equal(fx_mq_chan_meta_encode(&bad[i], &js), FX_EINVAL);
        assert_null(js);
    }
    assert_int_equal(fx_mq_chan_meta_encode(NULL, &js), FX_EINVAL);
    assert_null(js);
    assert_int_equal(fx_mq_chan_meta_encode(&good, NULL), FX_EINVAL);
    assert_int_equal(fx_mq_chan_meta_encode(&good, &js), FX_OK);
    assert_string_equal(js, CM("1", "90", "1", "1", "1"));
    free(js);
}

/* ---- ProducerMemberMeta --------------------------------------------------------------------------- */

static void test_producer_meta(void **state)
{
    (void)state;
    fx_mq_producer_meta m, d;
    memset(&m, 0, sizeof m);
    m.producer_idx = 33;
    char *js = NULL;
    assert_int_equal(fx_mq_producer_meta_encode(&m, &js), FX_OK);
    assert_string_equal(js, "{\"producer_idx\":\"33\",\"external_client_id\":null}");
    memset(&d, 0x55, sizeof d);
    assert_int_equal(DEC(fx_mq_producer_meta_decode, js, &d), FX_OK);
    assert_true(d.producer_idx == 33 && !d.has_external_client_id && d.external_client_id[0] == 0);
    free(js);

    m.producer_idx = INT64_MAX;
    m.has_external_client_id = true;
    strcpy(m.external_client_id, "kv-\"member\"\\7\n\xc3\xa9");
    assert_int_equal(fx_mq_producer_meta_encode(&m, &js), FX_OK);
    assert_non_null(strstr(js, "\"producer_idx\":\"9223372036854775807\""));
    assert_int_equal(DEC(fx_mq_producer_meta_decode, js, &d), FX_OK);
    assert_true(d.producer_idx == INT64_MAX && d.has_external_client_id);
    assert_string_equal(d.external_client_id, m.external_client_id);
    free(js);

    /* forms accepted on read */
    assert_int_equal(DEC(fx_mq_producer_meta_decode, "{\"producer_idx\":5}", &d), FX_OK);
    assert_true(d.producer_idx == 5 && !d.has_external_client_id);
    assert_int_equal(DEC(fx_mq_producer_meta_decode,
                         "{\"producer_idx\":\"0\",\"external_client_id\":\"\\u00e9\",\"w\":1}", &d),
                     FX_OK);
    assert_string_equal(d.external_client_id, "\xc3\xa9");
    /* a 255-byte id is fine, 256 is not */
    char b[400];
    char id[FX_MQ_STR_MAX + 2];
    memset(id, 'i', sizeof id);
    id[FX_MQ_STR_MAX] = '\0';
    snprintf(b, sizeof b, "{\"producer_idx\":\"1\",\"external_client_id\":\"%s\"}", id);
    assert_int_equal(DEC(fx_mq_producer_meta_decode, b, &d), FX_OK);
    assert_int_equal(strlen(d.external_client_id), FX_MQ_STR_MAX);
    id[FX_MQ_STR_MAX] = 'i';
    id[FX_MQ_STR_MAX + 1] = '\0';
    snprintf(b, sizeof b, "{\"producer_idx\":\"1\",\"external_client_id\":\"%s\"}", id);
    assert_int_equal(DEC(fx_mq_producer_meta_decode, b, &d), FX_EPROTO);
    detail_has("external_client_id");

    const char *bad[] = {
        "{}",
        "{\"producer_idx\":null}",
        "{\"producer_idx\":\"-1\"}",
        "{\"producer_idx\":-1}",
        "{\"producer_idx\":\"x\"}",
        "{\"producer_idx\":\"1\",\"external_client_id\":5}",
        "{\"producer_idx\":\"1\",\"external_client_id\":true}",
        "{\"producer_idx\":\"1\",\"external_client_id\":[\"a\"]}",
        "{\"producer_idx\":\"1\",\"producer_idx\":\"1\"}",
        "{\"producer_idx\":\"1\",\"external_client_id\":null,\"external_client_id\":null}",
        "[\"producer_idx\",\"1\"]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(DEC(fx_mq_producer_meta_decode, bad[i], &d), FX_EPROTO);

    /* encoder refuses a negative idx and an unterminated string */
    m.producer_idx = -1;
    assert_int_equal(fx_mq_producer_meta_encode(&m, &js), FX_EINVAL);
    assert_null(js);
    m.producer_idx = 1;
    memset(m.external_client_id, 'a', sizeof m.external_client_id);
    assert_int_equal(fx_mq_producer_meta_encode(&m, &js), FX_EINVAL);
    m.has_external_client_id = false; /* ignored when null */
    assert_int_equal(fx_mq_producer_meta_encode(&m, &js), FX_OK);
    assert_string_equal(js, "{\"producer_idx\":\"1\",\"external_client_id\":null}");
    free(js);
}

/* ---- ChanMemberMeta -------------------------------------------------------------------------------- */

static void test_member_meta(void **state)
{
    (void)state;
    fx_mq_member_meta m, d;
    memset(&m, 0, sizeof m);
    m.member_id = 4;
    m.role = FX_MQ_ROLE_CONSUMER;
    char *js = NULL;
    assert_int_equal(fx_mq_member_meta_encode(&m, &js), FX_OK);
    assert_string_equal(js, "{\"member_id\":\"4\",\"role\":\"consumer\",\"external_client_id\":null,"
                            "\"kvclient_sub_cluster\":null}");
    assert_int_equal(DEC(fx_mq_member_meta_decode, js, &d), FX_OK);
    assert_true(d.member_id == 4 && d.role == FX_MQ_ROLE_CONSUMER);
    assert_false(d.has_external_client_id);
    assert_false(d.has_kvclient_sub_cluster);
    free(js);

    m.role = FX_MQ_ROLE_PRODUCER;
    m.member_id = BIG1;
    m.has_external_client_id = true;
    strcpy(m.external_client_id, "c1");
    m.has_kvclient_sub_cluster = true;
    strcpy(m.kvclient_sub_cluster, "");
    assert_int_equal(fx_mq_member_meta_encode(&m, &js), FX_OK);
    assert_string_equal(js, "{\"member_id\":\"4611686018427387905\",\"role\":\"producer\","
                            "\"external_client_id\":\"c1\",\"kvclient_sub_cluster\":\"\"}");
    assert_int_equal(DEC(fx_mq_member_meta_decode, js, &d), FX_OK);
    assert_true(d.member_id == BIG1 && d.role == FX_MQ_ROLE_PRODUCER);
    assert_true(d.has_external_client_id && d.has_kvclient_sub_cluster);
    assert_string_equal(d.external_client_id, "c1");
    assert_string_equal(d.kvclient_sub_cluster, "");
    free(js);

    /* optional fields may be absent */
    assert_int_equal(DEC(fx_mq_member_meta_decode, "{\"member_id\":7,\"role\":\"consumer\"}", &d),
                     FX_OK);
    assert_true(d.member_id == 7);
    const char *bad[] = {
        "{\"role\":\"consumer\"}",
        "{\"member_id\":\"1\"}",
        "{\"member_id\":\"1\",\"role\":\"Consumer\"}",
        "{\"member_id\":\"1\",\"role\":\"\"}",
        "{\"member_id\":\"1\",\"role\":1}",
        "{\"member_id\":\"1\",\"role\":null}",
        "{\"member_id\":\"1\",\"role\":\"consumer\",\"kvclient_sub_cluster\":1}",
        "{\"member_id\":\"1\",\"role\":\"consumer\",\"role\":\"consumer\"}",
        "{\"member_id\":\"01\",\"role\":\"consumer\"}",
        "{\"member_id\":1.5,\"role\":\"consumer\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(DEC(fx_mq_member_meta_decode, bad[i], &d), FX_EPROTO);
    assert_int_equal(DEC(fx_mq_member_meta_decode, "{\"member_id\":\"1\",\"role\":\"admin\"}", &d),
                     FX_EPROTO);
    detail_has("role");

    m.role = (fx_mq_role)9;
    assert_int_equal(fx_mq_member_meta_encode(&m, &js), FX_EINVAL);
    assert_null(js);
    m.role = FX_MQ_ROLE_CONSUMER;
    m.member_id = -3;
    assert_int_equal(fx_mq_member_meta_encode(&m, &js), FX_EINVAL);
}

/* ---- MPMC meta --------------------------------------------------------------------------------------- */

static void test_mpmc_meta(void **state)
{
    (void)state;
    fx_mq_mpmc_meta m = {2048, 300, 1700000000.123456, BIG1, BIG2, INT64_MAX}, d;
    char *js = NULL;
    assert_int_equal(fx_mq_mpmc_meta_encode(&m, &js), FX_OK);
    assert_non_null(strstr(js, "\"capacity\":2048,\"ttl_seconds\":300,\"created_at\":"));
    assert_non_null(strstr(js, ",\"metadata_lease_id\":4611686018427387905,\"payload_lease_id\":"
                               "7587869432749186305,\"id_allocator_cluster_lease_id\":"
                               "9223372036854775807}"));
    assert_int_equal(DEC(fx_mq_mpmc_meta_decode, js, &d), FX_OK);
    assert_memory_equal(&m, &d, sizeof m); /* created_at survives bit-exactly */
    free(js);

    /* the reference's Python writer: float created_at, int lease ids */
    const char *py = "{\"capacity\": 10, \"ttl_seconds\": 90, \"created_at\": 1717171717.5, "
                     "\"metadata_lease_id\": 7587869432749186305, \"payload_lease_id\": 2, "
                     "\"id_allocator_cluster_lease_id\": 3}";
    assert_int_equal(DEC(fx_mq_mpmc_meta_decode, py, &d), FX_OK);
    assert_true(d.capacity == 10 && d.ttl_seconds == 90 && d.created_at == 1717171717.5);
    assert_true(d.metadata_lease_id == BIG2 && d.payload_lease_id == 2 &&
                d.id_allocator_cluster_lease_id == 3);
    /* created_at optional; integer created_at fine */
    assert_int_equal(DEC(fx_mq_mpmc_meta_decode,
                         "{\"capacity\":1,\"ttl_seconds\":90,\"metadata_lease_id\":1,"
                         "\"payload_lease_id\":1,\"id_allocator_cluster_lease_id\":1}", &d),
                     FX_OK);
    assert_true(d.created_at == 0.0);
    assert_int_equal(DEC(fx_mq_mpmc_meta_decode,
                         "{\"capacity\":1,\"ttl_seconds\":90,\"created_at\":17,\"metadata_lease_id\":1,"
                         "\"payload_lease_id\":1,\"id_allocator_cluster_lease_id\":1}", &d),
                     FX_OK);
    assert_true(d.created_at == 17.0);

#define MM(cap, ttl, at, ml, pl, il)                                                               \
    "{\"capacity\":" cap ",\"ttl_seconds\":" ttl ",\"created_at\":" at                             \
    ",\"metadata_lease_id\":" ml ",\"payload_lease_id\":" pl                                       \
    ",\"id_allocator_cluster_lease_id\":" il "}"
    struct {
        const char *j, *field;
    } bad[] = {
        {MM("0", "90", "1.5", "1", "1", "1"), "capacity"},
        {MM("1", "0", "1.5", "1", "1", "1"), "ttl_seconds"},
        {MM("1", "90", "-1.5", "1", "1", "1"), "created_at"},
        {MM("1", "90", "\"1.5\"", "1", "1", "1"), "created_at"},
        {MM("1", "90", "1.5", "0", "1", "1"), "metadata_lease_id"},
        {MM("1", "90", "1.5", "1", "null", "1"), "payload_lease_id"},
        {MM("1", "90", "1.5", "1", "1", "-1"), "id_allocator_cluster_lease_id"},
        {MM("1", "90", "1e999", "1", "1", "1"), "created_at"},
        {"{\"capacity\":1,\"ttl_seconds\":90,\"metadata_lease_id\":1,\"payload_lease_id\":1}",
         "id_allocator_cluster_lease_id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (DEC(fx_mq_mpmc_meta_decode, bad[i].j, &d) != FX_EPROTO) fail_msg("accepted %s", bad[i].j);
        detail_has(bad[i].field);
    }
    fx_mq_mpmc_meta e1 = m;
    e1.created_at = -1;
    assert_int_equal(fx_mq_mpmc_meta_encode(&e1, &js), FX_EINVAL);
    e1.created_at = 0.0 / 0.0;
    assert_int_equal(fx_mq_mpmc_meta_encode(&e1, &js), FX_EINVAL);
    e1 = m;
    e1.payload_lease_id = 0;
    assert_int_equal(fx_mq_mpmc_meta_encode(&e1, &js), FX_EINVAL);
    assert_null(js);
}

/* ---- mpsc_channels list -------------------------------------------------------------------------------- */

static void test_mpsc_list(void **state)
{
    (void)state;
    char *js = NULL;
    int64_t *ids = NULL;
    size_t n = 99;
    assert_int_equal(fx_mq_mpsc_list_encode(NULL, 0, &js), FX_OK);
    assert_string_equal(js, "[]");
    assert_int_equal(fx_mq_mpsc_list_decode(js, strlen(js), &ids, &n), FX_OK);
    assert_int_equal(n, 0);
    assert_null(ids);
    free(js);
    int64_t v[] = {17, 21, 0, BIG2, INT64_MAX};
    assert_int_equal(fx_mq_mpsc_list_encode(v, 5, &js), FX_OK);
    assert_string_equal(js, "[\"17\",\"21\",\"0\",\"7587869432749186305\",\"9223372036854775807\"]");
    assert_int_equal(fx_mq_mpsc_list_decode(js, strlen(js), &ids, &n), FX_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(ids, v, sizeof v);
    free(ids);
    free(js);
    /* numbers accepted on read, exactly */
    const char *t = " [ 17, \"21\", 9223372036854775807 ] ";
    assert_int_equal(fx_mq_mpsc_list_decode(t, strlen(t), &ids, &n), FX_OK);
    assert_int_equal(n, 3);
    assert_true(ids[0] == 17 && ids[1] == 21 && ids[2] == INT64_MAX);
    free(ids);
    assert_int_equal(fx_mq_mpsc_list_decode("[]", 2, &ids, &n), FX_OK);
    assert_int_equal(n, 0);
    assert_null(ids);

    const char *bad[] = {"",       "{}",          "[\"1\",\"1\"]",   "[1,\"1\"]", "[\"-1\"]",
                         "[-1]",   "[\"01\"]",    "[null]",          "[[1]]",     "[{}]",
                         "[1.5]",  "[\"1\",]",    "[\"1\"] x",       "[true]",    "\"1\"",
                         "[1e400]", "[\"\"]",     "[9223372036854775808]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ids = (int64_t *)1;
        n = 9;
        if (fx_mq_mpsc_list_decode(bad[i], strlen(bad[i]), &ids, &n) != FX_EPROTO)
            fail_msg("accepted %s", bad[i]);
        assert_null(ids);
        assert_int_equal(n, 0);
    }
    int64_t dup[] = {3, 4, 3};
    assert_int_equal(fx_mq_mpsc_list_encode(dup, 3, &js), FX_EINVAL);
    assert_null(js);
    int64_t neg[] = {3, -4};
    assert_int_equal(fx_mq_mpsc_list_encode(neg, 2, &js), FX_EINVAL);
    assert_int_equal(fx_mq_mpsc_list_encode(NULL, 1, &js), FX_EINVAL);
    assert_int_equal(fx_mq_mpsc_list_decode("[]", 2, NULL, &n), FX_EINVAL);

    /* bounds: 4096 entries of the largest ids fit; 4097 do not */
    int64_t *many = malloc((FX_MQ_MAX_MPSC_CHANNELS + 1) * sizeof *many);
    for (int64_t i = 0; i <= FX_MQ_MAX_MPSC_CHANNELS; i++) many[i] = INT64_MAX - i;
    assert_int_equal(fx_mq_mpsc_list_encode(many, FX_MQ_MAX_MPSC_CHANNELS + 1, &js), FX_EINVAL);
    assert_int_equal(fx_mq_mpsc_list_encode(many, FX_MQ_MAX_MPSC_CHANNELS, &js), FX_OK);
    assert_true(strlen(js) <= FX_MQ_LIST_JSON_MAX);
    assert_int_equal(fx_mq_mpsc_list_decode(js, strlen(js), &ids, &n), FX_OK);
    assert_int_equal(n, FX_MQ_MAX_MPSC_CHANNELS);
    assert_memory_equal(ids, many, n * sizeof *ids);
    free(ids);
    free(js);
    /* 4097 small entries (hand-written) */
    char *b = malloc(FX_MQ_LIST_JSON_MAX);
    size_t o = 0;
    b[o++] = '[';
    for (int i = 0; i <= FX_MQ_MAX_MPSC_CHANNELS; i++) o += (size_t)sprintf(b + o, i ? ",%d" : "%d", i);
    b[o++] = ']';
    assert_int_equal(fx_mq_mpsc_list_decode(b, o, &ids, &n), FX_EPROTO);
    detail_has("more than");
    free(b);
    free(many);
}

/* ---- fuzz ------------------------------------------------------------------------------------------------ */

static const char *SEEDS[] = {
    CHAN_OK,
    "{\"capacity\":\"10\",\"ttl_seconds\":9e1,\"meta_lease_id\":\"4611686018427387905\","
    "\"cluster_long_lease_id\":6.0,\"payload_lease_id\":9007199254740993,\"x\":[1,{\"y\":\"\\\"\"}]}",
    "{\"producer_idx\":\"33\",\"external_client_id\":\"a\\u00e9\\\"b\"}",
    "{\"member_id\":\"4\",\"role\":\"consumer\",\"external_client_id\":null,"
    "\"kvclient_sub_cluster\":\"sc\"}",
    "{\"capacity\": 10, \"ttl_seconds\": 90, \"created_at\": 1717171717.5, "
    "\"metadata_lease_id\": 7587869432749186305, \"payload_lease_id\": 2, "
    "\"id_allocator_cluster_lease_id\": 3}",
    "[\"17\",21,\"7587869432749186305\"]",
};

static int fuzz_one(const uint8_t *buf, size_t len)
{
    int ok = 0;
    char *js = NULL;
    fx_mq_chan_meta c, c2;
    if (fx_mq_chan_meta_decode(buf, len, &c) == FX_OK) {
        ok++; /* accepted => re-encodes identically */
        assert_int_equal(fx_mq_chan_meta_encode(&c, &js), FX_OK);
        assert_int_equal(fx_mq_chan_meta_decode(js, strlen(js), &c2), FX_OK);
        assert_memory_equal(&c, &c2, sizeof c);
        free(js);
    }
    fx_mq_producer_meta p, p2;
    if (fx_mq_producer_meta_decode(buf, len, &p) == FX_OK) {
        ok++;
        assert_int_equal(fx_mq_producer_meta_encode(&p, &js), FX_OK);
        assert_int_equal(fx_mq_producer_meta_decode(js, strlen(js), &p2), FX_OK);
        assert_true(p.producer_idx == p2.producer_idx);
        assert_string_equal(p.external_client_id, p2.external_client_id);
        free(js);
    }
    fx_mq_member_meta m, m2;
    if (fx_mq_member_meta_decode(buf, len, &m) == FX_OK) {
        ok++;
        assert_int_equal(fx_mq_member_meta_encode(&m, &js), FX_OK);
        assert_int_equal(fx_mq_member_meta_decode(js, strlen(js), &m2), FX_OK);
        assert_true(m.member_id == m2.member_id && m.role == m2.role);
        free(js);
    }
    fx_mq_mpmc_meta mm, mm2;
    if (fx_mq_mpmc_meta_decode(buf, len, &mm) == FX_OK) {
        ok++;
        assert_int_equal(fx_mq_mpmc_meta_encode(&mm, &js), FX_OK);
        assert_int_equal(fx_mq_mpmc_meta_decode(js, strlen(js), &mm2), FX_OK);
        assert_memory_equal(&mm, &mm2, sizeof mm);
        free(js);
    }
    int64_t *ids = NULL, *ids2 = NULL;
    size_t n = 0, n2 = 0;
    if (fx_mq_mpsc_list_decode(buf, len, &ids, &n) == FX_OK) {
        ok++;
        assert_int_equal(fx_mq_mpsc_list_encode(ids, n, &js), FX_OK);
        assert_int_equal(fx_mq_mpsc_list_decode(js, strlen(js), &ids2, &n2), FX_OK);
        assert_int_equal(n, n2);
        if (n) assert_memory_equal(ids, ids2, n * sizeof *ids);
        free(ids);
        free(ids2);
        free(js);
    }
    int64_t v;
    (void)fx_mq_counter_decode(buf, len, &v);
    (void)fx_mq_produce_offset_decode(buf, len, &v);
    return ok;
}

static void test_fuzz(void **state)
{
    (void)state;
    srand(0xC0FFEEu);
    const char alphabet[] = "{}[]\":,0123456789-+.eE \\unlrtfa\x01\xff";
    size_t ns = sizeof SEEDS / sizeof SEEDS[0];
    int accepted = 0;
    for (int it = 0; it < 40000; it++) {
        uint8_t tmp[1024];
        size_t len;
        if (it % 4 == 0) {
            len = (size_t)(rand() % 64);
            for (size_t i = 0; i < len; i++)
                tmp[i] = (uint8_t)(rand() % 2 ? alphabet[rand() % (int)(sizeof alphabet - 1)]
                                              : rand());
        } else {
            const char *s = SEEDS[rand() % (int)ns];
            len = strlen(s);
            memcpy(tmp, s, len);
            int muts = 1 + rand() % 4;
            for (int m = 0; m < muts; m++) {
                size_t pos = len ? (size_t)rand() % len : 0;
                int op = rand() % 4;
                char ch = alphabet[rand() % (int)(sizeof alphabet - 1)];
                if (op == 0 && len) {
                    tmp[pos] = (uint8_t)ch;
                } else if (op == 1 && len) {
                    memmove(tmp + pos, tmp + pos + 1, len - pos - 1);
                    len--;
                } else if (op == 2 && len < sizeof tmp - 1) {
                    memmove(tmp + pos + 1, tmp + pos, len - pos);
                    tmp[pos] = (uint8_t)ch;
                    len++;
                } else if (len) {
                    len = pos;
                }
            }
        }
        uint8_t *buf = malloc(len ? len : 1); /* exact size: ASan sees over-reads */
        memcpy(buf, tmp, len);
        accepted += fuzz_one(buf, len);
        free(buf);
    }
    assert_true(accepted > 1000); /* mutations also reach the success paths */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dec),
        cmocka_unit_test(test_dec_random_roundtrip),
        cmocka_unit_test(test_chan_meta_roundtrip),
        cmocka_unit_test(test_chan_meta_payload_format),
        cmocka_unit_test(test_short_ttl_accepted),
        cmocka_unit_test(test_chan_meta_aliases_and_forms),
        cmocka_unit_test(test_chan_meta_reject),
        cmocka_unit_test(test_chan_meta_encode_reject),
        cmocka_unit_test(test_producer_meta),
        cmocka_unit_test(test_member_meta),
        cmocka_unit_test(test_mpmc_meta),
        cmocka_unit_test(test_mpsc_list),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
