/* Unit tests for bridge/segment.c: wire format, round trip, every malformed shape, fuzz. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "segment.h"

/* Open from an exact-size heap copy so ASan catches any read past the buffer. */
static fx_err open_heap(const uint8_t *b, size_t n, fx_seg_iter *it, uint8_t **keep)
{
    uint8_t *c = malloc(n ? n : 1);
    assert_non_null(c);
    if (n) memcpy(c, b, n);
    fx_err e = fx_seg_open(c, n, it);
    *keep = c;
    return e;
}

static void seg_wire_format(void **state)
{
    (void)state;
    fx_slice v[2] = {FX_SLICE_STR("ab"), {NULL, 0}};
    uint8_t out[32];
    assert_int_equal(fx_seg_size(v, 2), 8 + 4 + 2 + 4);
    size_t n = fx_seg_encode(v, 2, out, sizeof out);
    static const uint8_t want[] = {'F', 'X', 'S', '1', 0, 0, 0, 2, 0, 0, 0, 2, 'a', 'b', 0, 0, 0, 0};
    assert_int_equal(n, sizeof want);
    assert_memory_equal(out, want, sizeof want);
}

static void seg_roundtrip(void **state)
{
    (void)state;
    enum { N = 300 };
    static char txt[N][16];
    fx_slice v[N];
    for (int i = 0; i < N; i++) {
        int l = snprintf(txt[i], sizeof txt[i], "msg-%d", i);
        v[i] = (fx_slice){txt[i], (size_t)(i % 7 == 0 ? 0 : l)}; /* some empty messages */
    }
    size_t sz = fx_seg_size(v, N);
    uint8_t *buf = malloc(sz);
    assert_non_null(buf);
    assert_int_equal(fx_seg_encode(v, N, buf, sz), sz);
    assert_int_equal(fx_seg_encode(v, N, buf, sz - 1), 0); /* short buffer */
    fx_seg_iter it;
    uint8_t *keep;
    assert_int_equal(open_heap(buf, sz, &it, &keep), FX_OK);
    assert_int_equal(it.n, N);
    fx_slice m;
    for (int i = 0; i < N; i++) {
        assert_int_equal(fx_seg_next(&it, &m), 1);
        assert_int_equal(m.len, v[i].len);
        if (m.len) assert_memory_equal(m.data, v[i].data, m.len);
    }
    assert_int_equal(fx_seg_next(&it, &m), 0);
    free(keep);
    free(buf);
}

static void seg_encode_limits(void **state)
{
    (void)state;
    static fx_slice v[FX_SEG_MAX_MSGS + 1];
    static uint8_t out[8 + 4 * (FX_SEG_MAX_MSGS + 1)];
    assert_int_equal(fx_seg_encode(v, 0, out, sizeof out), 0);
    assert_int_equal(fx_seg_encode(v, FX_SEG_MAX_MSGS + 1, out, sizeof out), 0);
    assert_int_equal(fx_seg_encode(v, FX_SEG_MAX_MSGS, out, sizeof out),
                     8 + 4 * FX_SEG_MAX_MSGS);
}

static void expect_bad(const uint8_t *b, size_t n, const char *detail_part)
{
    fx_seg_iter it;
    uint8_t *keep;
    assert_int_equal(open_heap(b, n, &it, &keep), FX_EPROTO);
    free(keep);
    if (!strstr(fx_err_detail(), detail_part))
        fail_msg("detail '%s' lacks '%s'", fx_err_detail(), detail_part);
}

static void seg_rejects_malformed(void **state)
{
    (void)state;
    expect_bad((const uint8_t *)"", 0, "bad header");
    expect_bad((const uint8_t *)"FXS1\0\0\0", 7, "bad header");
    expect_bad((const uint8_t *)"FXS2\0\0\0\1\0\0\0\0", 12, "bad header");
    expect_bad((const uint8_t *)"FXS1\0\0\0\0", 8, "count 0");
    expect_bad((const uint8_t *)"FXS1\0\0\x10\x01", 8, "count 4097");
    expect_bad((const uint8_t *)"FXS1\0\0\0\1\0\0", 10, "truncated length");
    expect_bad((const uint8_t *)"FXS1\0\0\0\1\0\0\0\3ab", 14, "past the end");
    expect_bad((const uint8_t *)"FXS1\0\0\0\1\xff\xff\xff\xff", 12, "past the end");
    expect_bad((const uint8_t *)"FXS1\0\0\0\1\0\0\0\1ab", 14, "1 trailing bytes");
    expect_bad((const uint8_t *)"FXS1\0\0\0\2\0\0\0\1a", 13, "message 1: truncated");
}

/* Random bytes, and mutations of a valid segment: never a crash or an out-of-bounds read (ASan);
 * anything accepted walks to exactly its end. */
static void seg_fuzz(void **state)
{
    (void)state;
    srand(12345);
    fx_slice v[3] = {FX_SLICE_STR("one"), FX_SLICE_STR("two!"), FX_SLICE_STR("")};
    uint8_t valid[64];
    size_t vl = fx_seg_encode(v, 3, valid, sizeof valid);
    assert_true(vl > 0);
    int accepted = 0;
    for (int round = 0; round < 20000; round++) {
        uint8_t b[64];
        size_t n;
        if (round % 2) {
            n = (size_t)rand() % sizeof b;
            for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rand();
            if (n >= 4) memcpy(b, "FXS1", 4);
        } else {
            n = vl - (size_t)(rand() % 3 == 0 ? rand() % (int)vl : 0);
            memcpy(b, valid, n);
            b[rand() % (int)(n ? n : 1)] ^= (uint8_t)(1u << (rand() % 8));
        }
        fx_seg_iter it;
        uint8_t *keep;
        if (open_heap(b, n, &it, &keep) == FX_OK) {
            accepted++;
            fx_slice m;
            size_t total = 8, k = 0;
            while (fx_seg_next(&it, &m)) {
                total += 4 + m.len;
                k++;
            }
            assert_int_equal(k, it.n);
            assert_int_equal(total, n);
        }
        free(keep);
    }
    assert_true(accepted > 0); /* some mutations (inside message bytes) stay valid */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seg_wire_format),   cmocka_unit_test(seg_roundtrip),
        cmocka_unit_test(seg_encode_limits), cmocka_unit_test(seg_rejects_malformed),
        cmocka_unit_test(seg_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
