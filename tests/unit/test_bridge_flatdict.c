/* Unit tests for bridge/flatdict.c: wire format, bounds, truncation, strictness, fuzz. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flatdict.h"

#define MAXE 64
#define MAXS (1u << 20)

/* Decode from an exact-size heap copy so ASan catches any read past the buffer. */
static fx_err dec_heap(const uint8_t *b, size_t n, size_t max_e, size_t max_s, fx_fd_entry *out,
                       size_t *on, uint8_t **keep)
{
    uint8_t *c = malloc(n ? n : 1);
    assert_non_null(c);
    if (n) memcpy(c, b, n);
    fx_err e = fx_fd_decode(c, n, max_e, max_s, out, on);
    if (keep)
        *keep = c; /* caller frees after using the zero-copy entries */
    else
        free(c);
    return e;
}

static void detail_has(const char *s)
{
    if (!strstr(fx_err_detail(), s)) fail_msg("detail '%s' lacks '%s'", fx_err_detail(), s);
}

static fx_slice SL(const char *s) { return (fx_slice){s, strlen(s)}; }

static void test_exact_bytes(void **state)
{
    (void)state;
    fx_fd_entry e[2] = {fx_fd_int64("a", 1), fx_fd_string("s", SL("hi"))};
    static const uint8_t want[] = {2, 0, 0, 0,                                  /* count */
                                   1, 0, 0, 0, 'a', 1, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                   1, 0, 0, 0, 's', 4, 2, 0, 0, 0, 'h', 'i'};
    size_t sz = 0;
    assert_int_equal(fx_fd_encoded_size(e, 2, &sz), FX_OK);
    assert_int_equal(sz, sizeof want);
    fx_bytes b = {0};
    assert_int_equal(fx_fd_encode(e, 2, &b), FX_OK);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    assert_int_equal(b.data[b.len], 0); /* fx_bytes convention: NUL one past len */
    free(b.data);
    /* negative int64 is two's complement little endian */
    fx_fd_entry n1 = fx_fd_int64("n", -2);
    uint8_t buf[64];
    size_t len;
    assert_int_equal(fx_fd_encode_into(&n1, 1, buf, sizeof buf, &len), FX_OK);
    static const uint8_t wn[] = {1, 0, 0, 0, 1, 0, 0, 0, 'n', 1, 8, 0, 0, 0,
                                 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(len, sizeof wn);
    assert_memory_equal(buf, wn, sizeof wn);
    /* empty dict */
    assert_int_equal(fx_fd_encode_into(NULL, 0, buf, sizeof buf, &len), FX_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(buf, "\0\0\0\0", 4);
    fx_fd_entry out[1];
    size_t on = 9;
    assert_int_equal(fx_fd_decode(buf, 4, 0, 4, out, &on), FX_OK);
    assert_int_equal(on, 0);
    assert_int_equal(fx_fd_decode(buf, 4, 0, 4, NULL, &on), FX_OK);
}

static void test_roundtrip_all_types(void **state)
{
    (void)state;
    uint8_t blob[300];
    for (size_t i = 0; i < sizeof blob; i++) blob[i] = (uint8_t)i;
    fx_fd_entry e[9] = {
        fx_fd_int64("i", INT64_MIN),
        fx_fd_int64("j", INT64_MAX),
        {.key = SL("f"), .type = FX_FD_FLOAT64, .f64 = -1.5e300},
        {.key = SL("nan"), .type = FX_FD_FLOAT64, .f64 = NAN},
        {.key = SL("t"), .type = FX_FD_BOOL, .b = true},
        {.key = SL("\xc3\xa9t\xc3\xa9"), .type = FX_FD_BOOL, .b = false},
        fx_fd_string("s", SL("sub.\xff\xfe")), /* string bytes are not UTF-8-checked */
        fx_fd_bytes("b", (fx_slice){blob, sizeof blob}),
        fx_fd_bytes("empty", (fx_slice){NULL, 0}),
    };
    fx_bytes b;
    assert_int_equal(fx_fd_encode(e, 9, &b), FX_OK);
    fx_fd_entry d[MAXE];
    size_t n = 0;
    uint8_t *keep = NULL;
    assert_int_equal(dec_heap(b.data, b.len, MAXE, MAXS, d, &n, &keep), FX_OK);
    assert_int_equal(n, 9);
    for (size_t i = 0; i < 9; i++) {
        assert_int_equal(d[i].key.len, e[i].key.len);
        assert_memory_equal(d[i].key.data, e[i].key.data, e[i].key.len);
        assert_int_equal(d[i].type, e[i].type);
    }
    assert_true(d[0].i64 == INT64_MIN && d[1].i64 == INT64_MAX);
    assert_true(d[2].f64 == -1.5e300);
    assert_true(isnan(d[3].f64));
    uint64_t b1, b2;
    memcpy(&b1, &d[3].f64, 8);
    memcpy(&b2, &e[3].f64, 8);
    assert_true(b1 == b2);
    assert_true(d[4].b && !d[5].b);
    assert_int_equal(d[6].val.len, 6);
    assert_memory_equal(d[6].val.data, "sub.\xff\xfe", 6);
    assert_int_equal(d[7].val.len, sizeof blob);
    assert_memory_equal(d[7].val.data, blob, sizeof blob);
    assert_int_equal(d[8].val.len, 0);
    /* values point into the decoded buffer (zero copy) */
    assert_true((const uint8_t *)d[7].val.data > keep &&
                (const uint8_t *)d[7].val.data < keep + b.len);
    assert_ptr_equal(fx_fd_find(d, n, "b"), &d[7]);
    assert_ptr_equal(fx_fd_find(d, n, "\xc3\xa9t\xc3\xa9"), &d[5]);
    assert_null(fx_fd_find(d, n, "x"));
    assert_null(fx_fd_find(d, n, "bb"));
    assert_null(fx_fd_find(d, n, ""));
    assert_null(fx_fd_find(NULL, 0, "b"));
    /* re-encoding the decoded entries reproduces the bytes */
    fx_bytes b2x;
    assert_int_equal(fx_fd_encode(d, n, &b2x), FX_OK);
    assert_int_equal(b2x.len, b.len);
    assert_memory_equal(b2x.data, b.data, b.len);
    free(b2x.data);
    free(keep);
    free(b.data);
}

static void test_many_entries_and_dups(void **state)
{
    (void)state;
    /* 200 entries: exercises the sorted duplicate check */
    enum { N = 200 };
    char keys[N][16];
    fx_fd_entry e[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "k%03d", (i * 37) % N);
        e[i] = fx_fd_int64(keys[i], i);
    }
    fx_bytes b;
    assert_int_equal(fx_fd_encode(e, N, &b), FX_OK);
    fx_fd_entry *d = malloc(N * sizeof *d);
    size_t n;
    assert_int_equal(dec_heap(b.data, b.len, N, MAXS, d, &n, NULL), FX_OK);
    assert_int_equal(n, N);
    assert_int_equal(dec_heap(b.data, b.len, N - 1, MAXS, d, &n, NULL), FX_EPROTO);
    detail_has("limit");
    assert_int_equal(n, 0);
    free(b.data);
    /* duplicate at the end of a long list: encoder and decoder both refuse */
    e[N - 1] = fx_fd_int64(keys[5], 1);
    assert_int_equal(fx_fd_encode(e, N, &b), FX_EINVAL);
    assert_null(b.data);
    detail_has("duplicate");
    /* craft a decoder input with a duplicate by encoding a unique set, then patching a key */
    e[N - 1] = fx_fd_int64("zzzz", 1);
    assert_int_equal(fx_fd_encode(e, N, &b), FX_OK);
    uint8_t *z = memmem(b.data, b.len, "zzzz", 4);
    assert_non_null(z);
    memcpy(z, keys[7], 4);
    assert_int_equal(dec_heap(b.data, b.len, N, MAXS, d, &n, NULL), FX_EPROTO);
    detail_has("duplicate");
    free(b.data);
    free(d);
    /* short list duplicate (quadratic path), keys differing only in length are distinct */
    fx_fd_entry s[3] = {fx_fd_int64("a", 1), fx_fd_int64("ab", 2), fx_fd_int64("a", 3)};
    assert_int_equal(fx_fd_encode(s, 3, &b), FX_EINVAL);
    assert_int_equal(fx_fd_encode(s, 2, &b), FX_OK);
    fx_fd_entry dd[4];
    assert_int_equal(dec_heap(b.data, b.len, 4, MAXS, dd, &n, NULL), FX_OK);
    assert_int_equal(n, 2);
    free(b.data);
}

/* Every strict prefix and every one-byte extension of a valid encoding is rejected. */
static void truncations(const uint8_t *b, size_t len)
{
    fx_fd_entry d[MAXE];
    size_t n = 7;
    for (size_t l = 0; l < len; l++) {
        if (dec_heap(b, l, MAXE, MAXS, d, &n, NULL) != FX_EPROTO)
            fail_msg("prefix of %zu/%zu bytes accepted", l, len);
        assert_int_equal(n, 0);
    }
    uint8_t *x = malloc(len + 1);
    memcpy(x, b, len);
    x[len] = 0;
    assert_int_equal(dec_heap(x, len + 1, MAXE, MAXS, d, &n, NULL), FX_EPROTO);
    free(x);
    assert_int_equal(dec_heap(b, len, MAXE, MAXS, d, &n, NULL), FX_OK);
}

static void test_truncated_every_length(void **state)
{
    (void)state;
    uint8_t blob[40];
    memset(blob, 0xab, sizeof blob);
    fx_fd_entry e[6] = {
        fx_fd_string("subject", SL("orders.eu.new")),
        fx_fd_bytes("headers", SL("NATS/1.0\r\nA: b\r\n\r\n")),
        fx_fd_int64("publish_ns", 1700000000123456789LL),
        {.key = SL("f"), .type = FX_FD_FLOAT64, .f64 = 2.5},
        {.key = SL("ok"), .type = FX_FD_BOOL, .b = true},
        fx_fd_bytes("data", (fx_slice){blob, sizeof blob}),
    };
    fx_bytes b;
    assert_int_equal(fx_fd_encode(e, 6, &b), FX_OK);
    truncations(b.data, b.len);
    free(b.data);
    fx_mq_msg m = {SL("a"), {NULL, 0}, 0, {NULL, 0}};
    assert_int_equal(fx_mq_msg_encode(&m, &b), FX_OK);
    truncations(b.data, b.len);
    fx_mq_msg o;
    for (size_t l = 0; l < b.len; l++) {
        uint8_t *c = malloc(l ? l : 1);
        memcpy(c, b.data, l);
        assert_int_equal(fx_mq_msg_decode(c, l, MAXS, &o), FX_EPROTO);
        free(c);
    }
    free(b.data);
}

/* Hand-built malformed inputs. */
static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* One entry: key, type, declared value length, actual value bytes. */
static size_t one(uint8_t *b, const void *key, uint32_t klen, uint8_t type, uint32_t vlen,
                  const void *val, size_t actual)
{
    size_t o = 0;
    put32(b, 1);
    o += 4;
    put32(b + o, klen);
    o += 4;
    memcpy(b + o, key, klen);
    o += klen;
    b[o++] = type;
    put32(b + o, vlen);
    o += 4;
    memcpy(b + o, val, actual);
    return o + actual;
}

static void expect_bad(const uint8_t *b, size_t n, const char *detail)
{
    fx_fd_entry d[MAXE];
    size_t on = 3;
    fx_err e = dec_heap(b, n, MAXE, MAXS, d, &on, NULL);
    if (e != FX_EPROTO) fail_msg("accepted (%d), wanted '%s'", (int)e, detail);
    assert_int_equal(on, 0);
    if (detail) detail_has(detail);
}

static void test_malformed(void **state)
{
    (void)state;
    uint8_t b[2048];
    size_t n;
    const uint8_t eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    /* a valid baseline */
    n = one(b, "k", 1, 1, 8, eight, 8);
    fx_fd_entry d[2];
    size_t on;
    assert_int_equal(dec_heap(b, n, 2, MAXS, d, &on, NULL), FX_OK);
    assert_true(d[0].i64 == 0x0807060504030201LL);
    /* unknown types */
    const uint8_t types[] = {0, 2, 6, 8, 9, 100, 255};
    for (size_t i = 0; i < sizeof types; i++) {
        n = one(b, "k", 1, types[i], 8, eight, 8);
        expect_bad(b, n, "unknown type");
    }
    /* fixed sizes */
    n = one(b, "k", 1, 1, 7, eight, 7);
    expect_bad(b, n, "8 bytes");
    n = one(b, "k", 1, 1, 0, eight, 0);
    expect_bad(b, n, "8 bytes");
    n = one(b, "k", 1, 3, 9, eight, 8), b[n++] = 0;
    expect_bad(b, n, "8 bytes");
    n = one(b, "k", 1, 7, 1, "\x02", 1);
    expect_bad(b, n, "bool");
    n = one(b, "k", 1, 7, 2, "\x01\x00", 2);
    expect_bad(b, n, "bool");
    n = one(b, "k", 1, 7, 1, "\x01", 1);
    assert_int_equal(dec_heap(b, n, 2, MAXS, d, &on, NULL), FX_OK);
    assert_true(d[0].b);
    /* keys */
    n = one(b, "", 0, 5, 5, "abcde", 5);
    expect_bad(b, n, "empty key");
    const char *badkeys[] = {"\xc0\x80", "\xed\xa0\x80", "\xf5\x80\x80\x80", "\xe2\x82", "\x80",
                             "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xff"};
    for (size_t i = 0; i < sizeof badkeys / sizeof badkeys[0]; i++) {
        n = one(b, badkeys[i], (uint32_t)strlen(badkeys[i]), 5, 0, "", 0);
        expect_bad(b, n, "UTF-8");
    }
    n = one(b, "\xf0\x9f\x98\x80", 4, 5, 0, "", 0); /* U+1F600 is fine */
    assert_int_equal(dec_heap(b, n, 2, MAXS, d, &on, NULL), FX_OK);
    char longkey[FX_FD_KEY_MAX + 1];
    memset(longkey, 'k', sizeof longkey);
    n = one(b, longkey, FX_FD_KEY_MAX + 1, 5, 0, "", 0);
    expect_bad(b, n, "key of");
    n = one(b, longkey, FX_FD_KEY_MAX, 5, 0, "", 0);
    assert_int_equal(dec_heap(b, n, 2, MAXS, d, &on, NULL), FX_OK);
    /* lengths that point past the end, including huge ones that could wrap */
    n = one(b, "k", 1, 5, 100, "abc", 3);
    expect_bad(b, n, "truncated");
    n = one(b, "k", 1, 5, 0xffffffffu, "abc", 3);
    expect_bad(b, n, "truncated");
    put32(b, 1);
    put32(b + 4, 0xffffffffu);
    memset(b + 8, 'a', 10);
    expect_bad(b, 18, NULL);
    put32(b + 4, 0xfffffff0u);
    expect_bad(b, 18, NULL);
    /* counts */
    put32(b, 0xffffffffu);
    expect_bad(b, 4, "limit");
    put32(b, 3); /* 3 entries cannot fit in 20 bytes */
    memset(b + 4, 0, 16);
    expect_bad(b, 20, "cannot fit");
    put32(b, 0);
    expect_bad(b, 5, "trailing");
    expect_bad(b, 3, "header");
    expect_bad(b, 0, "header");
    /* size limit */
    n = one(b, "k", 1, 5, 100, longkey, 100);
    assert_int_equal(dec_heap(b, n, 2, n, d, &on, NULL), FX_OK);
    assert_int_equal(dec_heap(b, n, 2, n - 1, d, &on, NULL), FX_EPROTO);
    detail_has("limit");
    /* NULL arguments */
    assert_int_equal(fx_fd_decode(NULL, 4, 1, 10, d, &on), FX_EINVAL);
    assert_int_equal(fx_fd_decode(b, n, 2, MAXS, d, NULL), FX_EINVAL);
    assert_int_equal(fx_fd_decode(b, n, 2, MAXS, NULL, &on), FX_EINVAL);
    assert_int_equal(fx_fd_decode(NULL, 0, 1, 10, d, &on), FX_EPROTO);
}

static void test_encode_errors(void **state)
{
    (void)state;
    fx_bytes b = {(uint8_t *)1, 5};
    fx_fd_entry bad_type = {.key = SL("k"), .type = (fx_fd_type)2};
    assert_int_equal(fx_fd_encode(&bad_type, 1, &b), FX_EINVAL);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    fx_fd_entry empty_key = fx_fd_int64("", 1);
    assert_int_equal(fx_fd_encode(&empty_key, 1, &b), FX_EINVAL);
    fx_fd_entry null_key = {.key = {NULL, 3}, .type = FX_FD_INT64};
    assert_int_equal(fx_fd_encode(&null_key, 1, &b), FX_EINVAL);
    fx_fd_entry bad_utf8 = fx_fd_int64("\xc3", 1);
    assert_int_equal(fx_fd_encode(&bad_utf8, 1, &b), FX_EINVAL);
    fx_fd_entry null_val = fx_fd_bytes("k", (fx_slice){NULL, 4});
    assert_int_equal(fx_fd_encode(&null_val, 1, &b), FX_EINVAL);
    char longkey[FX_FD_KEY_MAX + 2];
    memset(longkey, 'k', sizeof longkey);
    longkey[FX_FD_KEY_MAX + 1] = '\0';
    fx_fd_entry lk = fx_fd_int64(longkey, 1);
    assert_int_equal(fx_fd_encode(&lk, 1, &b), FX_EINVAL);
    assert_int_equal(fx_fd_encode(NULL, 1, &b), FX_EINVAL);
    assert_int_equal(fx_fd_encode(NULL, 0, NULL), FX_EINVAL);
    /* values over 4 GiB are refused without touching the (fake) data */
    if (sizeof(size_t) > 4) {
        fx_fd_entry huge = fx_fd_bytes("k", (fx_slice){"x", (size_t)UINT32_MAX + 1});
        size_t sz;
        assert_int_equal(fx_fd_encoded_size(&huge, 1, &sz), FX_ETOO_LARGE);
        fx_fd_entry two[2] = {fx_fd_bytes("a", (fx_slice){"x", (size_t)UINT32_MAX / 2}),
                              fx_fd_bytes("b", (fx_slice){"x", (size_t)UINT32_MAX / 2})};
        assert_int_equal(fx_fd_encoded_size(two, 2, &sz), FX_ETOO_LARGE);
    }
    /* a buffer too small */
    fx_fd_entry ok = fx_fd_string("k", SL("value"));
    size_t need, len = 77;
    assert_int_equal(fx_fd_encoded_size(&ok, 1, &need), FX_OK);
    uint8_t buf[64];
    assert_int_equal(fx_fd_encode_into(&ok, 1, buf, need - 1, &len), FX_ETOO_LARGE);
    assert_int_equal(len, 0);
    assert_int_equal(fx_fd_encode_into(&ok, 1, buf, need, &len), FX_OK);
    assert_int_equal(len, need);
    assert_int_equal(fx_fd_encode_into(&ok, 1, NULL, 10, &len), FX_EINVAL);
    assert_int_equal(fx_fd_encode_into(&ok, 1, NULL, 0, &len), FX_ETOO_LARGE);
}

/* ---- message record ----------------------------------------------------------------------------- */

static void test_msg(void **state)
{
    (void)state;
    const char hdr[] = "NATS/1.0\r\nNats-Msg-Id: 7\r\n\r\n";
    uint8_t data[1000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7);
    fx_mq_msg m = {SL("orders.eu.new"), SL(hdr), 1700000000123456789LL, {data, sizeof data}};
    fx_bytes b;
    assert_int_equal(fx_mq_msg_encode(&m, &b), FX_OK);
    size_t sz;
    assert_int_equal(fx_mq_msg_encoded_size(&m, &sz), FX_OK);
    assert_int_equal(sz, b.len);
    /* the record is a plain FlatDict with the documented keys, in order */
    fx_fd_entry d[8];
    size_t n;
    assert_int_equal(fx_fd_decode(b.data, b.len, 8, MAXS, d, &n), FX_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(d[0].key.data, "subject", 7);
    assert_int_equal(d[0].type, FX_FD_STRING);
    assert_memory_equal(d[1].key.data, "headers", 7);
    assert_int_equal(d[1].type, FX_FD_BYTES);
    assert_memory_equal(d[2].key.data, "publish_ns", 10);
    assert_int_equal(d[2].type, FX_FD_INT64);
    assert_memory_equal(d[3].key.data, "data", 4);
    assert_int_equal(d[3].type, FX_FD_BYTES);
    fx_mq_msg o;
    uint8_t *c = malloc(b.len);
    memcpy(c, b.data, b.len);
    assert_int_equal(fx_mq_msg_decode(c, b.len, b.len, &o), FX_OK);
    assert_int_equal(o.subject.len, strlen("orders.eu.new"));
    assert_memory_equal(o.subject.data, "orders.eu.new", o.subject.len);
    assert_int_equal(o.headers.len, strlen(hdr));
    assert_memory_equal(o.headers.data, hdr, o.headers.len);
    assert_true(o.publish_ns == 1700000000123456789LL);
    assert_int_equal(o.data.len, sizeof data);
    assert_memory_equal(o.data.data, data, sizeof data);
    assert_int_equal(fx_mq_msg_decode(c, b.len, b.len - 1, &o), FX_EPROTO);
    free(c);
    /* encode_into a batch buffer */
    uint8_t *seg = malloc(2 * sz);
    size_t l1, l2;
    assert_int_equal(fx_mq_msg_encode_into(&m, seg, 2 * sz, &l1), FX_OK);
    assert_int_equal(fx_mq_msg_encode_into(&m, seg + l1, 2 * sz - l1, &l2), FX_OK);
    assert_int_equal(l1 + l2, 2 * sz);
    assert_memory_equal(seg + l1, b.data, sz);
    assert_int_equal(fx_mq_msg_encode_into(&m, seg, sz - 1, &l1), FX_ETOO_LARGE);
    free(seg);
    free(b.data);

    /* empty headers and data; non-UTF-8 subject bytes survive */
    fx_mq_msg m2 = {SL("a.\xff"), {NULL, 0}, 0, {NULL, 0}};
    assert_int_equal(fx_mq_msg_encode(&m2, &b), FX_OK);
    assert_int_equal(fx_mq_msg_decode(b.data, b.len, MAXS, &o), FX_OK);
    assert_int_equal(o.subject.len, 3);
    assert_int_equal(o.headers.len, 0);
    assert_int_equal(o.data.len, 0);
    assert_true(o.publish_ns == 0);
    free(b.data);

    /* encoder checks */
    fx_mq_msg bad = m;
    bad.subject = (fx_slice){NULL, 0};
    assert_int_equal(fx_mq_msg_encode(&bad, &b), FX_EINVAL);
    assert_null(b.data);
    bad = m;
    bad.publish_ns = -1;
    assert_int_equal(fx_mq_msg_encode(&bad, &b), FX_EINVAL);
    bad = m;
    bad.data = (fx_slice){NULL, 5};
    assert_int_equal(fx_mq_msg_encode(&bad, &b), FX_EINVAL);
    assert_int_equal(fx_mq_msg_encode(NULL, &b), FX_EINVAL);
    assert_int_equal(fx_mq_msg_decode(b.data, 0, MAXS, NULL), FX_EINVAL);
}

static fx_err msg_from(const fx_fd_entry *e, size_t n, fx_mq_msg *o)
{
    fx_bytes b;
    fx_err r = fx_fd_encode(e, n, &b);
    assert_int_equal(r, FX_OK);
    uint8_t *c = malloc(b.len);
    memcpy(c, b.data, b.len);
    r = fx_mq_msg_decode(c, b.len, MAXS, o);
    free(c);
    free(b.data);
    return r;
}

static void test_msg_decode_rules(void **state)
{
    (void)state;
    fx_mq_msg o;
    fx_fd_entry subj = fx_fd_string("subject", SL("s")), hdr = fx_fd_bytes("headers", SL("h")),
                ts = fx_fd_int64("publish_ns", 5), data = fx_fd_bytes("data", SL("d"));
    /* any order; headers optional; unknown keys ignored */
    fx_fd_entry a[5] = {data, fx_fd_int64("future", 1), ts, subj, hdr};
    assert_int_equal(msg_from(a, 5, &o), FX_OK);
    assert_true(o.publish_ns == 5 && o.headers.len == 1);
    fx_fd_entry nohdr[3] = {subj, ts, data};
    assert_int_equal(msg_from(nohdr, 3, &o), FX_OK);
    assert_null(o.headers.data);
    assert_int_equal(o.headers.len, 0);
    /* missing / wrong type / bad value */
    fx_fd_entry m1[3] = {hdr, ts, data};
    assert_int_equal(msg_from(m1, 3, &o), FX_EPROTO);
    detail_has("subject");
    fx_fd_entry m2[3] = {subj, hdr, data};
    assert_int_equal(msg_from(m2, 3, &o), FX_EPROTO);
    detail_has("publish_ns");
    fx_fd_entry m3[3] = {subj, hdr, ts};
    assert_int_equal(msg_from(m3, 3, &o), FX_EPROTO);
    detail_has("data");
    fx_fd_entry w1[3] = {fx_fd_bytes("subject", SL("s")), ts, data};
    assert_int_equal(msg_from(w1, 3, &o), FX_EPROTO);
    fx_fd_entry w2[3] = {fx_fd_string("subject", SL("")), ts, data};
    assert_int_equal(msg_from(w2, 3, &o), FX_EPROTO);
    fx_fd_entry w3[4] = {subj, fx_fd_string("headers", SL("h")), ts, data};
    assert_int_equal(msg_from(w3, 4, &o), FX_EPROTO);
    detail_has("headers");
    fx_fd_entry w4[3] = {subj, fx_fd_int64("publish_ns", -1), data};
    assert_int_equal(msg_from(w4, 3, &o), FX_EPROTO);
    fx_fd_entry w5[3] = {subj, fx_fd_string("publish_ns", SL("5")), data};
    assert_int_equal(msg_from(w5, 3, &o), FX_EPROTO);
    fx_fd_entry w6[3] = {subj, ts, fx_fd_string("data", SL("d"))};
    assert_int_equal(msg_from(w6, 3, &o), FX_EPROTO);
    /* at most FX_MQ_MSG_MAX_ENTRIES entries */
    fx_fd_entry many[FX_MQ_MSG_MAX_ENTRIES + 1];
    char names[FX_MQ_MSG_MAX_ENTRIES + 1][16];
    many[0] = subj, many[1] = ts, many[2] = data;
    for (int i = 3; i <= FX_MQ_MSG_MAX_ENTRIES; i++) {
        snprintf(names[i], sizeof names[i], "x%d", i);
        many[i] = fx_fd_int64(names[i], i);
    }
    assert_int_equal(msg_from(many, FX_MQ_MSG_MAX_ENTRIES, &o), FX_OK);
    assert_int_equal(msg_from(many, FX_MQ_MSG_MAX_ENTRIES + 1, &o), FX_EPROTO);
}

/* ---- fuzz ------------------------------------------------------------------------------------------ */

static void fuzz_one(const uint8_t *buf, size_t len)
{
    fx_fd_entry d[8];
    size_t n = 0;
    if (fx_fd_decode(buf, len, 8, 4096, d, &n) == FX_OK) {
        /* anything accepted is canonical: re-encoding reproduces the input exactly */
        uint8_t out[4096];
        size_t ol;
        assert_int_equal(fx_fd_encode_into(d, n, out, sizeof out, &ol), FX_OK);
        assert_int_equal(ol, len);
        assert_memory_equal(out, buf, len);
    }
    fx_mq_msg m;
    if (fx_mq_msg_decode(buf, len, 4096, &m) == FX_OK) {
        assert_true(m.subject.len > 0 && m.publish_ns >= 0);
        assert_true((const uint8_t *)m.data.data >= buf &&
                    (const uint8_t *)m.data.data + m.data.len <= buf + len);
    }
}

static void test_fuzz(void **state)
{
    (void)state;
    srand(20240601u);
    /* seeds */
    fx_bytes seeds[3];
    fx_mq_msg m = {SL("orders.eu"), SL("NATS/1.0\r\n\r\n"), 123, SL("payload")};
    assert_int_equal(fx_mq_msg_encode(&m, &seeds[0]), FX_OK);
    fx_fd_entry e[4] = {fx_fd_int64("a", -1), {.key = SL("b"), .type = FX_FD_BOOL, .b = true},
                        {.key = SL("f"), .type = FX_FD_FLOAT64, .f64 = 1.0},
                        fx_fd_string("s", SL("xyz"))};
    assert_int_equal(fx_fd_encode(e, 4, &seeds[1]), FX_OK);
    assert_int_equal(fx_fd_encode(NULL, 0, &seeds[2]), FX_OK);
    int accepted = 0;
    for (int it = 0; it < 200000; it++) {
        uint8_t tmp[256];
        size_t len;
        if (it % 4 == 0) { /* random bytes with a plausible small count */
            len = (size_t)(rand() % 64);
            for (size_t i = 0; i < len; i++) tmp[i] = (uint8_t)rand();
            if (len >= 4 && rand() % 2) put32(tmp, (uint32_t)(rand() % 4));
            for (size_t i = 4; i + 4 <= len && rand() % 2; i += 4)
                if (rand() % 3 == 0) put32(tmp + i, (uint32_t)(rand() % 10));
        } else {
            const fx_bytes *s = &seeds[rand() % 3];
            len = s->len;
            memcpy(tmp, s->data, len);
            int muts = 1 + rand() % 3;
            for (int k = 0; k < muts; k++) {
                size_t pos = len ? (size_t)rand() % len : 0;
                int op = rand() % 5;
                if (op == 0 && len) {
                    tmp[pos] ^= (uint8_t)(1u << (rand() % 8));
                } else if (op == 1 && len) {
                    tmp[pos] = (uint8_t)rand();
                } else if (op == 2 && len) {
                    memmove(tmp + pos, tmp + pos + 1, len - pos - 1);
                    len--;
                } else if (op == 3 && len < sizeof tmp) {
                    memmove(tmp + pos + 1, tmp + pos, len - pos);
                    tmp[pos] = (uint8_t)rand();
                    len++;
                } else {
                    len = pos;
                }
            }
        }
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, tmp, len);
        fx_fd_entry d[8];
        size_t n;
        if (fx_fd_decode(buf, len, 8, 4096, d, &n) == FX_OK) accepted++;
        fuzz_one(buf, len);
        free(buf);
    }
    assert_true(accepted > 1000); /* the mutations also reach the success path */
    for (int i = 0; i < 3; i++) free(seeds[i].data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_bytes),        cmocka_unit_test(test_roundtrip_all_types),
        cmocka_unit_test(test_many_entries_and_dups), cmocka_unit_test(test_truncated_every_length),
        cmocka_unit_test(test_malformed),          cmocka_unit_test(test_encode_errors),
        cmocka_unit_test(test_msg),                cmocka_unit_test(test_msg_decode_rules),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
