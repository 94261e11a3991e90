/* subject.c -- NATS subject syntax: validation, matching and overlap (subject.h).
 *
 * Pure functions, no allocation. Every entry point validates its inputs first and answers
 * false for an invalid subject, so a caller can never get "match"/"overlap" out of garbage.
 */
#include "subject.h"

#include <string.h>

/* Bytes that may never appear in a subject: whitespace, ASCII control characters and DEL.
 * Bytes >= 0x80 are allowed (UTF-8 tokens). */
static bool bad_byte(unsigned char c)
{
    return c <= 0x20 || c == 0x7f;
}

/* Length of s if it is 1..FX_SUBJECT_MAX bytes, else 0. */
static size_t subject_len(const char *s)
{
    if (!s) return 0;
    size_t n = strnlen(s, FX_SUBJECT_MAX + 1);
    return n > FX_SUBJECT_MAX ? 0 : n;
}

bool fx_subject_valid(const char *s, bool allow_wildcards)
{
    size_t n = subject_len(s);
    if (n == 0) return false;
    size_t start = 0;
    for (;;) {
        size_t end = start;
        bool wild = false;
        while (end < n && s[end] != '.') {
            unsigned char c = (unsigned char)s[end];
            if (bad_byte(c)) return false;
            if (c == '*' || c == '>') wild = true;
            end++;
        }
        size_t tlen = end - start;
        if (tlen == 0) return false; /* empty token: leading/trailing '.' or ".." */
        if (wild) {
            if (!allow_wildcards || tlen != 1) return false; /* wildcards are whole tokens */
            if (s[start] == '>' && end != n) return false;   /* '>' only as the last token */
        }
        if (end == n) return true;
        start = end + 1;
    }
}

bool fx_subject_token_valid(const char *s)
{
    size_t n = subject_len(s);
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (bad_byte(c) || c == '.' || c == '*' || c == '>') return false;
    }
    return true;
}

/* Token cursor over an already validated subject. */
typedef struct {
    const char *p;  /* start of the current token */
    size_t len;     /* its length */
    const char *end;/* end of the subject */
} tok_iter;

static void tok_first(tok_iter *t, const char *s)
{
    t->p = s;
    t->end = s + strlen(s);
    const char *dot = memchr(s, '.', (size_t)(t->end - s));
    t->len = dot ? (size_t)(dot - s) : (size_t)(t->end - s);
}

/* Advance; false when there is no further token. */
static bool tok_next(tok_iter *t)
{
    const char *next = t->p + t->len;
    if (next >= t->end) return false;
    next++; /* skip '.' */
    t->p = next;
    const char *dot = memchr(next, '.', (size_t)(t->end - next));
    t->len = dot ? (size_t)(dot - next) : (size_t)(t->end - next);
    return true;
}

static bool tok_is(const tok_iter *t, char c)
{
    return t->len == 1 && t->p[0] == c;
}

static bool tok_eq(const tok_iter *a, const tok_iter *b)
{
    return a->len == b->len && memcmp(a->p, b->p, a->len) == 0;
}

bool fx_subject_match(const char *pattern, const char *lit)
{
    if (!fx_subject_valid(pattern, true) || !fx_subject_valid(lit, false)) return false;
    return fx_subject_match_valid(pattern, lit);
}

bool fx_subject_match_valid(const char *pattern, const char *lit)
{
    tok_iter p, l;
    tok_first(&p, pattern);
    tok_first(&l, lit);
    for (;;) {
        if (tok_is(&p, '>')) return true; /* matches this token and everything after it */
        if (!tok_is(&p, '*') && !tok_eq(&p, &l)) return false;
        bool pm = tok_next(&p), lm = tok_next(&l);
        if (!pm || !lm) return pm == lm; /* both exhausted at once */
    }
}

bool fx_subject_overlap(const char *a, const char *b)
{
    if (!fx_subject_valid(a, true) || !fx_subject_valid(b, true)) return false;
    tok_iter x, y;
    tok_first(&x, a);
    tok_first(&y, b);
    for (;;) {
        /* '>' needs one or more tokens; the other side has at least this one. */
        if (tok_is(&x, '>') || tok_is(&y, '>')) return true;
        if (!tok_is(&x, '*') && !tok_is(&y, '*') && !tok_eq(&x, &y)) return false;
        bool xm = tok_next(&x), ym = tok_next(&y);
        if (!xm || !ym) return xm == ym;
    }
}
