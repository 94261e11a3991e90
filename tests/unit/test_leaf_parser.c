/* test_leaf_parser.c -- plugin/leaf_proto.h: the leafnode protocol reader (feed bytes, take
 * frames; no I/O).
 *
 * leaf_parser_frames: every frame kind the server sends, with its fields (INFO json, -ERR text,
 *   LS+ subject/queue/weight, LS- subject/queue, LMSG/HMSG sizes with the payload skipped),
 *   CRLF and bare LF, ops in any case.
 * leaf_parser_split_every_byte_boundary: the same stream fed in two parts split at every byte,
 *   and one byte at a time, gives the same frames.
 * leaf_parser_oversized_line_refused: a line of max_line bytes passes; one byte more is refused
 *   with a clear error as soon as it cannot end in time (no newline needed), and the reader holds
 *   at most max_line + 1 bytes of it; the error is sticky until fx_lp_reset.
 * leaf_parser_malformed_frames: unknown op, empty line, a NUL byte in a line, LMSG/HMSG without a
 *   valid size, a payload not followed by CRLF: errors; malformed LS+/LS- lines are frames flagged `malformed`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "leaf_proto.h"

static const char STREAM[] =
    "INFO {\"server_id\":\"S1\",\"headers\":true,\"max_payload\":1048576}\r\n"
    "PING\r\n"
    "pong\r\n"
    "+OK\r\n"
    "LS+ orders.> q.orders 1\r\n"
    "LS+ foo.bar\r\n"
    "LS+ a.*  grp   7\r\n"
    "LS- orders.> q.orders\r\n"
    "LS- foo.bar\n"
    "LMSG foo.bar reply.x 5\r\nhello\r\n"
    "HMSG foo.bar + r q1 q2 12 17\r\nNATS/1.0\r\n\r\nhello\r\n"
    "LMSG empty 0\r\n\r\n"
    "-ERR 'Authorization Violation'\r\n"
    "Ping\n";

static const char *const WANT[] = {
    "INFO|{\"server_id\":\"S1\",\"headers\":true,\"max_payload\":1048576}",
    "PING|",
    "PONG|",
    "OK|",
    "LS+|orders.>|q.orders|1",
    "LS+|foo.bar|-|0",
    "LS+|a.*|grp|7",
    "LS-|orders.>|q.orders|0",
    "LS-|foo.bar|-|0",
    "MSG|5",
    "MSG|17",
    "MSG|0",
    "ERR|'Authorization Violation'",
    "PING|",
};
#define N_WANT (sizeof WANT / sizeof WANT[0])

/* One frame as text, for comparisons. */
static void fmt(const fx_lp_frame *f, char *out, size_t cap)
{
    switch (f->kind) {
    case FX_LP_INFO: snprintf(out, cap, "INFO|%s", f->arg); break;
    case FX_LP_PING: snprintf(out, cap, "PING|%s", f->arg); break;
    case FX_LP_PONG: snprintf(out, cap, "PONG|%s", f->arg); break;
    case FX_LP_OK: snprintf(out, cap, "OK|%s", f->arg); break;
    case FX_LP_ERR: snprintf(out, cap, "ERR|%s", f->arg); break;
    case FX_LP_LS_ADD:
    case FX_LP_LS_DEL:
        if (f->malformed)
            snprintf(out, cap, "%s|malformed", f->kind == FX_LP_LS_ADD ? "LS+" : "LS-");
        else
            snprintf(out, cap, "%s|%s|%s|%lld", f->kind == FX_LP_LS_ADD ? "LS+" : "LS-", f->subject,
                     f->queue ? f->queue : "-", (long long)f->weight);
        break;
    case FX_LP_MSG: snprintf(out, cap, "MSG|%llu", (unsigned long long)f->msg_size); break;
    default: snprintf(out, cap, "?%d", (int)f->kind);
    }
}

/* Take every available frame into got[*n]; returns fx_lp_next's last result (0 or -1). */
static int drain(fx_lp_reader *r, char got[][160], size_t cap, size_t *n)
{
    fx_lp_frame f;
    int rc;
    while ((rc = fx_lp_next(r, &f)) == 1) {
        assert_true(*n < cap);
        fmt(&f, got[*n], sizeof got[0]);
        (*n)++;
    }
    return rc;
}

static void check_all(char got[][160], size_t n)
{
    assert_int_equal(n, N_WANT);
    for (size_t i = 0; i < n; i++)
        if (strcmp(got[i], WANT[i]) != 0) fail_msg("frame %zu: got [%s], want [%s]", i, got[i], WANT[i]);
}

static void leaf_parser_frames(void **state)
{
    (void)state;
    fx_lp_reader *r = fx_lp_reader_new(4096);
    assert_non_null(r);
    char got[32][160];
    size_t n = 0;
    assert_int_equal(fx_lp_feed(r, STREAM, sizeof STREAM - 1), 0);
    assert_int_equal(drain(r, got, 32, &n), 0);
    check_all(got, n);
    assert_int_equal(fx_lp_buffered(r), 0);
    fx_lp_reader_free(r);
}

static void leaf_parser_split_every_byte_boundary(void **state)
{
    (void)state;
    const size_t len = sizeof STREAM - 1;
    char got[32][160];
    for (size_t cut = 0; cut <= len; cut++) {
        fx_lp_reader *r = fx_lp_reader_new(4096);
        assert_non_null(r);
        size_t n = 0;
        assert_int_equal(fx_lp_feed(r, STREAM, cut), 0);
        assert_int_equal(drain(r, got, 32, &n), 0);
        assert_int_equal(fx_lp_feed(r, STREAM + cut, len - cut), 0);
        assert_int_equal(drain(r, got, 32, &n), 0);
        if (n != N_WANT) fail_msg("split at %zu: %zu frames, want %zu", cut, n, N_WANT);
        check_all(got, n);
        fx_lp_reader_free(r);
    }
    /* one byte at a time */
    fx_lp_reader *r = fx_lp_reader_new(4096);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        assert_int_equal(fx_lp_feed(r, STREAM + i, 1), 0);
        assert_int_equal(drain(r, got, 32, &n), 0);
    }
    check_all(got, n);
    fx_lp_reader_free(r);
}

static void leaf_parser_oversized_line_refused(void **state)
{
    (void)state;
    enum { MAX = 100 };
    char line[MAX + 8];
    fx_lp_frame f;
    /* exactly MAX bytes (op + arg) passes, with CRLF */
    fx_lp_reader *r = fx_lp_reader_new(MAX);
    memset(line, 'x', sizeof line);
    memcpy(line, "-ERR ", 5);
    memcpy(line + MAX, "\r\n", 2);
    assert_int_equal(fx_lp_feed(r, line, MAX + 2), 0);
    assert_int_equal(fx_lp_next(r, &f), 1);
    assert_int_equal(f.kind, FX_LP_ERR);
    assert_int_equal(f.arg_len, MAX - 5);
    fx_lp_reader_free(r);

    /* MAX + 1 bytes with its CRLF: refused */
    r = fx_lp_reader_new(MAX);
    memset(line, 'x', sizeof line);
    memcpy(line, "-ERR ", 5);
    memcpy(line + MAX + 1, "\r\n", 2);
    assert_int_equal(fx_lp_feed(r, line, MAX + 3), 0);
    assert_int_equal(fx_lp_next(r, &f), -1);
    assert_non_null(strstr(fx_lp_error(r), "longer than 100 bytes"));
    fx_lp_reader_free(r);

    /* no end in sight: refused once MAX + 2 bytes are held without a newline, before the end of
     * the line arrives; the reader never held more than that */
    r = fx_lp_reader_new(MAX);
    memset(line, 'x', sizeof line);
    memcpy(line, "INFO ", 5);
    size_t fed = 0;
    int rc = 0;
    while (rc == 0 && fed < sizeof line) {
        assert_int_equal(fx_lp_feed(r, line + fed, 1), 0);
        fed++;
        assert_true(fx_lp_buffered(r) <= MAX + 2);
        rc = fx_lp_next(r, &f);
    }
    assert_int_equal(rc, -1);
    assert_int_equal(fed, MAX + 2);
    assert_non_null(strstr(fx_lp_error(r), "protocol line longer than"));
    /* sticky until reset */
    assert_int_equal(fx_lp_feed(r, "PING\r\n", 6), -1);
    assert_int_equal(fx_lp_next(r, &f), -1);
    fx_lp_reset(r);
    assert_int_equal(fx_lp_feed(r, "PING\r\n", 6), 0);
    assert_int_equal(fx_lp_next(r, &f), 1);
    assert_int_equal(f.kind, FX_LP_PING);
    assert_int_equal(fx_lp_next(r, &f), 0);
    fx_lp_reader_free(r);
}

static void expect_error(const char *in, const char *why)
{
    fx_lp_reader *r = fx_lp_reader_new(4096);
    fx_lp_frame f;
    assert_int_equal(fx_lp_feed(r, in, strlen(in)), 0);
    int rc;
    while ((rc = fx_lp_next(r, &f)) == 1) {
    }
    if (rc != -1 || !strstr(fx_lp_error(r), why))
        fail_msg("input [%s]: rc %d, error [%s], want [%s]", in, rc, fx_lp_error(r), why);
    fx_lp_reader_free(r);
}

static void leaf_parser_malformed_frames(void **state)
{
    (void)state;
    expect_error("PING\r\nFOO bar\r\n", "unexpected \"FOO\"");
    expect_error("\r\n", "empty protocol line");
    expect_error("PINGX\r\n", "unexpected \"PINGX\"");
    expect_error("MSG a 1 2\r\n", "unexpected \"MSG\""); /* a client-protocol op */
    expect_error("LMSG foo\r\n", "bad message size");
    expect_error("LMSG foo -1\r\n", "bad message size");
    expect_error("LMSG foo 12345678901\r\n", "bad message size");
    expect_error("HMSG foo 1 1073741825\r\n", "bad message size"); /* over 1 GiB */
    expect_error("LMSG foo 3\r\nabcd\r\n", "not followed by CRLF");
    expect_error("LMSG foo 3\r\nabc\rX", "not followed by CRLF");
    {
        fx_lp_reader *r = fx_lp_reader_new(4096);
        fx_lp_frame f;
        assert_int_equal(fx_lp_feed(r, "INFO {\"a\0\"}\r\n", 14), 0);
        assert_int_equal(fx_lp_next(r, &f), -1);
        assert_non_null(strstr(fx_lp_error(r), "NUL byte"));
        fx_lp_reader_free(r);
    }
    /* an op is not fooled by a control byte */
    expect_error("PI\x01NG\r\n", "unexpected \"PI?NG\"");

    /* malformed LS lines are frames with `malformed` (counted by the caller, not fatal) */
    static const char *const bad_ls[] = {
        "LS+\r\n", "LS+ a q\r\n", "LS+ a q w\r\n", "LS+ a q 1 x\r\n", "LS+ a q 99999999999999\r\n",
        "LS-\r\n", "LS- a q x\r\n",
    };
    for (size_t i = 0; i < sizeof bad_ls / sizeof bad_ls[0]; i++) {
        fx_lp_reader *r = fx_lp_reader_new(4096);
        fx_lp_frame f;
        assert_int_equal(fx_lp_feed(r, bad_ls[i], strlen(bad_ls[i])), 0);
        assert_int_equal(fx_lp_next(r, &f), 1);
        if (!f.malformed) fail_msg("[%s] not flagged malformed", bad_ls[i]);
        assert_int_equal(fx_lp_feed(r, "PONG\r\n", 6), 0);
        assert_int_equal(fx_lp_next(r, &f), 1); /* and the stream goes on */
        assert_int_equal(f.kind, FX_LP_PONG);
        fx_lp_reader_free(r);
    }
    /* a name of FX_LP_NAME_MAX + 1 bytes is malformed */
    char *big = malloc(FX_LP_NAME_MAX + 16);
    assert_non_null(big);
    memcpy(big, "LS- ", 4);
    memset(big + 4, 'a', FX_LP_NAME_MAX + 1);
    memcpy(big + 4 + FX_LP_NAME_MAX + 1, "\r\n", 3);
    fx_lp_reader *r = fx_lp_reader_new(4096);
    fx_lp_frame f;
    assert_int_equal(fx_lp_feed(r, big, strlen(big)), 0);
    assert_int_equal(fx_lp_next(r, &f), 1);
    assert_true(f.malformed);
    fx_lp_reader_free(r);
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(leaf_parser_frames),
        cmocka_unit_test(leaf_parser_split_every_byte_boundary),
        cmocka_unit_test(leaf_parser_oversized_line_refused),
        cmocka_unit_test(leaf_parser_malformed_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
