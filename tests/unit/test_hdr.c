/* Unit tests for the delivery header block (plugin/hdr.c, dm_hdr_delivery): it must carry
 * the same headers as the cnats path it replaces on the leaf connection (dm_hdr_apply onto a
 * natsMsg, natsMsgHeader_Set of the Fluxon-* headers, dm_hdr_from_msg), for every shape of
 * stored block; line order may differ (cnats keeps headers in a hash map). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hdr.h"

#define MAXL 64

/* Split a block into its header lines (after the status line, up to the empty line), sorted. */
static int lines_of(const char *b, size_t n, char out[MAXL][256])
{
    assert_true(n >= 12);
    assert_memory_equal(b, "NATS/1.0\r\n", 10);
    assert_memory_equal(b + n - 2, "\r\n", 2);
    int k = 0;
    const char *p = b + 10, *end = b + n - 2;
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        assert_non_null(eol);
        assert_true(k < MAXL && (size_t)(eol - p) < 256);
        memcpy(out[k], p, (size_t)(eol - p));
        out[k][eol - p] = 0;
        k++;
        p = eol + 2;
    }
    qsort(out, (size_t)k, sizeof out[0], (int (*)(const void *, const void *))strcmp);
    return k;
}

static const char *const KV[] = {"Fluxon-Channel", "orders", "Fluxon-Subject", "orders.eu.new",
                                 "Fluxon-Seq", "42", "Fluxon-Delivered", "1",
                                 "Fluxon-Id", "3.0.41"};

static void same_as_cnats(const char *stored)
{
    fx_slice block = {stored, strlen(stored)};
    /* reference: the natsMsg path */
    natsMsg *m = NULL;
    assert_int_equal(natsMsg_Create(&m, "q.orders.a", "r", "x", 1), NATS_OK);
    assert_int_equal(dm_hdr_apply(m, block), NATS_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(natsMsgHeader_Set(m, KV[2 * i], KV[2 * i + 1]), NATS_OK);
    char *ref = NULL;
    size_t rl = 0;
    assert_int_equal(dm_hdr_from_msg(m, &ref, &rl), FX_OK);
    natsMsg_Destroy(m);
    /* direct */
    char *buf = NULL;
    size_t cap = 0, len = 0;
    assert_int_equal(dm_hdr_delivery(block, KV, 5, &buf, &cap, &len), FX_OK);
    assert_true(len <= cap);
    static char a[MAXL][256], b[MAXL][256];
    int na = lines_of(ref, rl, a), nb = lines_of(buf, len, b);
    if (na != nb) fail_msg("stored %s: %d lines vs %d", stored, na, nb);
    for (int i = 0; i < na; i++) assert_string_equal(a[i], b[i]);
    free(ref);
    free(buf);
}

static void hdr_same_headers_as_cnats(void **state)
{
    (void)state;
    same_as_cnats("");                                  /* no stored headers */
    same_as_cnats("NATS/1.0\r\n\r\n");                  /* an empty block */
    same_as_cnats("NATS/1.0\r\nTrace-Id: abc\r\n\r\n"); /* one header */
    same_as_cnats("NATS/1.0\r\nA: 1\r\nA: 2\r\nB:  spaced \r\n\r\n"); /* multi-value, spaces */
    /* a publisher's own Fluxon-* values are replaced, other case is another key */
    same_as_cnats("NATS/1.0\r\nFluxon-Channel: fake\r\nFluxon-Seq: 9\r\nfluxon-seq: 7\r\n\r\n");
    same_as_cnats("NATS/1.0 503\r\nX: y\r\n\r\n");            /* a status code is dropped */
    same_as_cnats("NATS/1.0\r\nno colon line\r\n:empty key\r\nK: v\r\n\r\n"); /* skipped lines */
    same_as_cnats("NATS/1.0\r\nK: v\r\n");                     /* no terminating empty line */
    /* lines without a space after the colon grow by one byte each when rewritten */
    static char tight[4096];
    strcpy(tight, "NATS/1.0\r\n");
    for (int i = 0; i < 26; i++) {
        char l[8] = {(char)('a' + i), ':', 'v', '\r', '\n', 0};
        strcat(tight, l);
    }
    strcat(tight, "\r\n");
    same_as_cnats(tight);
}

/* A block of nothing but minimal lines ("k:\r\n") grows by a quarter when rewritten. 989 lines
 * make a 3,968-byte block: a bound without that quarter rounds the buffer to 4,096 bytes and
 * the 5,068-byte result overflows it (len > cap here; ASan in make check sees the write). */
static void hdr_bound_minimal_lines(void **state)
{
    (void)state;
    static char blk[8192];
    size_t n = 10;
    memcpy(blk, "NATS/1.0\r\n", 10);
    for (int i = 0; i < 989; i++, n += 4) memcpy(blk + n, "k:\r\n", 4);
    memcpy(blk + n, "\r\n", 2);
    n += 2;
    assert_int_equal(n, 3968);
    char *buf = NULL;
    size_t cap = 0, len = 0;
    assert_int_equal(dm_hdr_delivery((fx_slice){blk, n}, KV, 5, &buf, &cap, &len), FX_OK);
    assert_int_equal(len, 10 + 989 * 5 + 111 + 2); /* every "k:" became "k: " */
    assert_true(len <= cap);
    free(buf);
}

/* The caller's buffer is reused and grown, never shrunk; big blocks fit. */
static void hdr_buffer_reuse(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    assert_int_equal(dm_hdr_delivery((fx_slice){"", 0}, KV, 5, &buf, &cap, &len), FX_OK);
    size_t cap1 = cap;
    char *p1 = buf;
    assert_int_equal(dm_hdr_delivery((fx_slice){"", 0}, KV, 5, &buf, &cap, &len), FX_OK);
    assert_ptr_equal(buf, p1); /* no reallocation for the same size */
    assert_int_equal(cap, cap1);
    static char big[20000];
    strcpy(big, "NATS/1.0\r\nBig: ");
    size_t o = strlen(big);
    memset(big + o, 'v', 15000);
    strcpy(big + o + 15000, "\r\n\r\n");
    assert_int_equal(dm_hdr_delivery((fx_slice){big, strlen(big)}, KV, 5, &buf, &cap, &len), FX_OK);
    assert_true(cap >= len && len > 15000);
    assert_non_null(memmem(buf, len, "Fluxon-Id: 3.0.41\r\n\r\n", 21));
    free(buf);
}

static int setup(void **state)
{
    (void)state;
    return nats_Open(-1) == NATS_OK ? 0 : -1; /* natsMsg needs the library's globals */
}

static int teardown(void **state)
{
    (void)state;
    nats_Close();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hdr_same_headers_as_cnats),
        cmocka_unit_test(hdr_buffer_reuse),
        cmocka_unit_test(hdr_bound_minimal_lines),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
