/* leaf_proto.c -- feed-bytes reader of the leafnode protocol (see leaf_proto.h). No I/O. */
#include "leaf_proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct fx_lp_reader {
    char *buf;
    size_t cap, len, pos; /* bytes [pos, len) not consumed yet */
    size_t max_line;
    uint64_t skip;        /* LMSG/HMSG payload bytes still to skip */
    int trailer;          /* then the CRLF after it: 2, 1, 0 bytes left */
    bool failed;
    char err[128];
};

fx_lp_reader *fx_lp_reader_new(size_t max_line)
{
    if (max_line < 64) max_line = 64;
    fx_lp_reader *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->max_line = max_line;
    r->cap = 4096;
    r->buf = malloc(r->cap);
    if (!r->buf) {
        free(r);
        return NULL;
    }
    return r;
}

void fx_lp_reader_free(fx_lp_reader *r)
{
    if (!r) return;
    free(r->buf);
    free(r);
}

void fx_lp_reset(fx_lp_reader *r)
{
    r->len = r->pos = 0;
    r->skip = 0;
    r->trailer = 0;
    r->failed = false;
    r->err[0] = '\0';
}

const char *fx_lp_error(const fx_lp_reader *r) { return r->err[0] ? r->err : "no error"; }

size_t fx_lp_buffered(const fx_lp_reader *r) { return r->len - r->pos; }

static int fail(fx_lp_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(fx_lp_reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    r->failed = true;
    return -1;
}

int fx_lp_feed(fx_lp_reader *r, const void *buf, size_t len)
{
    if (r->failed) return -1;
    if (!len) return 0;
    if (r->pos) { /* frames handed out before are void now: compact */
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    if (len > SIZE_MAX / 2 - r->len - 1) return fail(r, "out of memory");
    size_t need = r->len + len + 1; /* + the NUL a line ending at the end may need */
    if (need > r->cap) {
        size_t nc = r->cap;
        while (nc < need) nc *= 2;
        char *nb = realloc(r->buf, nc);
        if (!nb) return fail(r, "out of memory");
        r->buf = nb;
        r->cap = nc;
    }
    memcpy(r->buf + r->len, buf, len);
    r->len += len;
    return 0;
}

/* Printable excerpt of at most 16 bytes for an error text. */
static void excerpt(const char *s, size_t n, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; i < n && i < 16 && j + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[j++] = c >= 0x20 && c < 0x7f && c != '"' ? (char)c : '?';
    }
    out[j] = '\0';
}

static bool name_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        if (n >= FX_LP_NAME_MAX) return false;
        unsigned char c = (unsigned char)s[n];
        if (c < 0x21 || c == 0x7f) return false;
    }
    return n > 0;
}

/* Split arg in place into at most max blank-separated tokens; max + 1 when there are more. */
static int split(char *arg, char **tok, int max)
{
    int n = 0;
    char *p = arg;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) return n;
        if (n == max) return max + 1;
        tok[n++] = p;
        while (*p && *p != ' ' && *p != '\t') p++;
        if (*p) *p++ = '\0';
    }
}

static void parse_ls(fx_lp_frame *f, char *arg)
{
    char *t[4];
    bool plus = f->kind == FX_LP_LS_ADD;
    int n = split(arg, t, 3);
    bool ok = plus ? (n == 1 || n == 3) : (n == 1 || n == 2);
    for (int i = 0; ok && i < n && i < 2; i++) ok = name_ok(t[i]);
    int64_t w = 0;
    if (ok && plus && n == 3) {
        const char *p = t[2];
        for (; *p && ok; p++) {
            if (*p < '0' || *p > '9' || w > (1LL << 40)) ok = false;
            else w = w * 10 + (*p - '0');
        }
    }
    f->malformed = !ok;
    if (!ok) return;
    f->subject = t[0];
    f->queue = n >= 2 ? t[1] : NULL;
    f->weight = plus && n == 3 ? w : 0;
}

/* The last blank-separated token as a size; false if it is not a decimal of <= 10 digits. */
static bool last_size(const char *line, size_t len, uint64_t *out)
{
    size_t e = len;
    while (e && (line[e - 1] == ' ' || line[e - 1] == '\t')) e--;
    size_t b = e;
    while (b && line[b - 1] != ' ' && line[b - 1] != '\t') b--;
    if (b == e || e - b > 10) return false;
    uint64_t v = 0;
    for (size_t i = b; i < e; i++) {
        if (line[i] < '0' || line[i] > '9') return false;
        v = v * 10 + (uint64_t)(line[i] - '0');
    }
    *out = v;
    return true;
}

int fx_lp_next(fx_lp_reader *r, fx_lp_frame *out)
{
    if (r->failed) return -1;
    memset(out, 0, sizeof *out);
    for (;;) {
        size_t avail = r->len - r->pos;
        if (r->skip) {
            size_t n = avail < r->skip ? avail : (size_t)r->skip;
            r->pos += n;
            r->skip -= n;
            if (r->skip) return 0;
            avail = r->len - r->pos;
        }
        while (r->trailer && avail) {
            char want = r->trailer == 2 ? '\r' : '\n';
            if (r->buf[r->pos] != want) return fail(r, "message payload not followed by CRLF");
            r->pos++;
            r->trailer--;
            avail--;
        }
        if (r->trailer) return 0;
        if (!avail) return 0;

        char *start = r->buf + r->pos;
        size_t look = avail < r->max_line + 2 ? avail : r->max_line + 2;
        char *nl = memchr(start, '\n', look);
        if (!nl) {
            if (avail > r->max_line + 1)
                return fail(r, "protocol line longer than %zu bytes", r->max_line);
            return 0;
        }
        size_t len = (size_t)(nl - start);
        if (len && start[len - 1] == '\r') len--;
        if (len > r->max_line) return fail(r, "protocol line longer than %zu bytes", r->max_line);
        if (memchr(start, '\0', len)) return fail(r, "NUL byte in a protocol line");
        start[len] = '\0';
        r->pos += (size_t)(nl - start) + 1;

        size_t ol = 0;
        while (ol < len && start[ol] != ' ' && start[ol] != '\t') ol++;
        char *arg = start + ol;
        while (*arg == ' ' || *arg == '\t') arg++;
        out->arg = arg;
        out->arg_len = len - (size_t)(arg - start);
#define OP(s) (ol == sizeof(s) - 1 && strncasecmp(start, s, ol) == 0)
        if (OP("INFO")) out->kind = FX_LP_INFO;
        else if (OP("PING")) out->kind = FX_LP_PING;
        else if (OP("PONG")) out->kind = FX_LP_PONG;
        else if (OP("+OK")) out->kind = FX_LP_OK;
        else if (OP("-ERR")) out->kind = FX_LP_ERR;
        else if (OP("LS+")) out->kind = FX_LP_LS_ADD;
        else if (OP("LS-")) out->kind = FX_LP_LS_DEL;
        else if (OP("LMSG") || OP("HMSG")) out->kind = FX_LP_MSG;
#undef OP
        else {
            char op[24];
            excerpt(start, ol, op, sizeof op);
            return fail(r, ol ? "unexpected \"%s\"" : "empty protocol line%s", op);
        }
        if (out->kind == FX_LP_LS_ADD || out->kind == FX_LP_LS_DEL) {
            parse_ls(out, arg);
        } else if (out->kind == FX_LP_MSG) {
            uint64_t sz = 0;
            if (!last_size(start, len, &sz) || sz > FX_LP_MSG_MAX)
                return fail(r, "bad message size");
            out->msg_size = sz;
            r->skip = sz;
            r->trailer = 2;
        }
        return 1;
    }
}
