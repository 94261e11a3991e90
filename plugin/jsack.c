/* jsack.c -- JetStream-shaped ack subjects, ack bodies and PubAcks (see jsack.h).
 *
 * Subject layout (12 tokens, the JetStream "v2" ack layout; nats.go GetMetadataFields and
 * nats.js parseInfo read tokens 2..10 by position):
 *   0 "$JS"  1 "ACK"  2 domain "FLUXON"  3 account hash = bridge  4 stream = channel
 *   5 consumer = claim  6 delivered  7 stream seq  8 consumer seq  9 timestamp ns  10 pending
 *   11 nonce
 * Numeric tokens 6..10 are canonical decimal: digits only, no sign, no leading zero (except "0"),
 * no overflow (uint64; the timestamp at most INT64_MAX).
 * Nonce format: canonical lowercase base-36 of the uint64 ([0-9a-z], 1..13 chars, no leading
 * zero except "0", at most "3w5e11264sgsf" = UINT64_MAX). JetStream clients never interpret
 * token 11, so any single token works for them; base-36 keeps it short.
 * Canonical forms make parse and build exact inverses: a subject parses only if
 * fx_ack_subject_build(parse(subject)) reproduces it byte for byte.
 * Names (bridge, channel, claim): 1..127 bytes, no '.', no space or control byte (<= 0x20, 0x7f),
 * not a whole-token wildcard ("*" or ">"). The whole subject is shorter than
 * FX_JSACK_SUBJECT_MAX; build refuses longer ones (and a negative timestamp), parse rejects them.
 */
#include "jsack.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define NAME_MAX_LEN 127          /* fits the 128-byte fields of fx_ack_meta */
#define DESC_MAX 256              /* PubAck error description: longer input is cut (UTF-8 safe) */
#define NAK_JSON_MAX 256          /* bound for the JSON after "-NAK " */

static bool name_valid(const char *s)
{
    if (!s) return false;
    size_t n = 0;
    for (; n <= NAME_MAX_LEN && s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (c == '.' || c <= 0x20 || c == 0x7f) return false;
    }
    if (n == 0 || n > NAME_MAX_LEN) return false;
    if (n == 1 && (s[0] == '*' || s[0] == '>')) return false;
    return true;
}

/* Canonical base-36 of v into buf (>= 14 bytes); returns the length. */
static size_t b36(uint64_t v, char *buf)
{
    static const char dig[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    char tmp[16];
    size_t n = 0;
    do {
        tmp[n++] = dig[v % 36];
        v /= 36;
    } while (v);
    for (size_t i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    buf[n] = '\0';
    return n;
}

/* Canonical decimal of v at w (room for 20 bytes); returns the length. */
static size_t dec(uint64_t v, char *w)
{
    char t[20];
    size_t i = sizeof t;
    do {
        t[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(w, t + i, sizeof t - i);
    return sizeof t - i;
}

/* Built once per delivery, so without printf. */
int fx_ack_subject_build(const fx_ack_meta *m, char *out, size_t cap)
{
    if (!m || !out || cap == 0) return -1;
    if (!name_valid(m->bridge) || !name_valid(m->channel) || !name_valid(m->claim)) return -1;
    if (m->ts_ns < 0) return -1;
    /* the prefix, three names of at most NAME_MAX_LEN, five numbers, a nonce and the dots */
    char tmp[sizeof FX_JSACK_PREFIX + 3 * NAME_MAX_LEN + 5 * 20 + 14 + 8];
    const char *names[3] = {m->bridge, m->channel, m->claim};
    const uint64_t nums[5] = {m->delivered, m->seq, m->claim_seq, (uint64_t)m->ts_ns, m->pending};
    char *w = tmp;
    memcpy(w, FX_JSACK_PREFIX, sizeof FX_JSACK_PREFIX - 1);
    w += sizeof FX_JSACK_PREFIX - 1;
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(names[i]);
        memcpy(w, names[i], l);
        w += l;
        *w++ = '.';
    }
    for (int i = 0; i < 5; i++) {
        w += dec(nums[i], w);
        *w++ = '.';
    }
    w += b36(m->nonce, w);
    size_t n = (size_t)(w - tmp);
    if (n >= FX_JSACK_SUBJECT_MAX || n >= cap) return -1;
    memcpy(out, tmp, n);
    out[n] = '\0';
    return (int)n;
}

/* Canonical decimal uint64 in [p, p+n). */
static bool parse_dec(const char *p, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20) return false;
    if (n > 1 && p[0] == '0') return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return false;
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* Canonical lowercase base-36 uint64 in [p, p+n). */
static bool parse_b36(const char *p, size_t n, uint64_t *out)
{
    if (n == 0 || n > 13) return false;
    if (n > 1 && p[0] == '0') return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d;
        if (p[i] >= '0' && p[i] <= '9') d = (unsigned)(p[i] - '0');
        else if (p[i] >= 'a' && p[i] <= 'z') d = (unsigned)(p[i] - 'a') + 10;
        else return false;
        if (v > (UINT64_MAX - d) / 36) return false;
        v = v * 36 + d;
    }
    *out = v;
    return true;
}

static bool copy_name(const char *p, size_t n, char *dst)
{
    if (n == 0 || n > NAME_MAX_LEN) return false;
    memcpy(dst, p, n);
    dst[n] = '\0';
    return name_valid(dst);
}

int fx_ack_subject_parse(const char *subject, fx_ack_meta *out)
{
    if (!subject || !out) return -1;
    size_t len = strnlen(subject, FX_JSACK_SUBJECT_MAX);
    if (len >= FX_JSACK_SUBJECT_MAX) return -1;
    const size_t plen = sizeof FX_JSACK_PREFIX - 1;
    if (len <= plen || memcmp(subject, FX_JSACK_PREFIX, plen) != 0) return -1;

    /* Split the 9 tokens after the prefix; exactly 9, none empty. */
    const char *tok[9];
    size_t tlen[9];
    size_t nt = 0;
    const char *p = subject + plen, *end = subject + len;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        if (nt == 9) return -1; /* 13 or more tokens */
        tok[nt] = p;
        tlen[nt] = (size_t)(e - p);
        if (tlen[nt] == 0) return -1;
        nt++;
        if (!dot) break;
        p = dot + 1;
    }
    if (nt != 9) return -1;

    fx_ack_meta m;
    memset(&m, 0, sizeof m);
    uint64_t ts;
    if (!copy_name(tok[0], tlen[0], m.bridge) || !copy_name(tok[1], tlen[1], m.channel) ||
        !copy_name(tok[2], tlen[2], m.claim) || !parse_dec(tok[3], tlen[3], &m.delivered) ||
        !parse_dec(tok[4], tlen[4], &m.seq) || !parse_dec(tok[5], tlen[5], &m.claim_seq) ||
        !parse_dec(tok[6], tlen[6], &ts) || ts > (uint64_t)INT64_MAX ||
        !parse_dec(tok[7], tlen[7], &m.pending) || !parse_b36(tok[8], tlen[8], &m.nonce))
        return -1;
    m.ts_ns = (int64_t)ts;
    *out = m;
    return 0;
}

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

static bool body_is(const char *b, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n == l && memcmp(b, lit, l) == 0;
}

/* The argument after "-NAK ": a JSON object with a numeric "delay" (ns, integral, 0..INT64_MAX);
 * other keys are ignored (forward compatible with ConsumerNakOptions). */
static bool parse_nak_json(const char *arg, size_t n, int64_t *delay)
{
    while (n && is_ws((unsigned char)*arg)) {
        arg++;
        n--;
    }
    if (n == 0 || n > NAK_JSON_MAX || arg[0] != '{') return false;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(arg, n, &end, false);
    if (!j) return false;
    if (end != arg + n) { /* trailing bytes after the object (trailing space was trimmed) */
        cJSON_Delete(j);
        return false;
    }
    bool ok = false;
    const cJSON *d = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "delay") : NULL;
    if (d && cJSON_IsNumber(d)) {
        double v = d->valuedouble;
        /* 9223372036854775807.0 rounds up to 2^63: require strictly below it. */
        if (isfinite(v) && v >= 0 && v < 9223372036854775808.0 && floor(v) == v) {
            *delay = (int64_t)v;
            ok = true;
        }
    }
    cJSON_Delete(j);
    return ok;
}

fx_ack_kind fx_ack_body_parse(const void *body, size_t len, int64_t *delay_ns)
{
    int64_t dummy;
    if (!delay_ns) delay_ns = &dummy;
    *delay_ns = 0;
    if (!body) return len == 0 ? FX_ACK_ACK : FX_ACK_INVALID;
    const char *b = body;
    while (len && is_ws((unsigned char)b[len - 1])) len--;
    if (len == 0 || body_is(b, len, "+ACK")) return FX_ACK_ACK;
    if (body_is(b, len, "+WPI")) return FX_ACK_WPI;
    if (len >= 5 && memcmp(b, "+TERM", 5) == 0 && (len == 5 || b[5] == ' ')) return FX_ACK_TERM;
    if (len >= 4 && memcmp(b, "-NAK", 4) == 0) {
        if (len == 4) return FX_ACK_NAK;
        if (b[4] != ' ') return FX_ACK_INVALID;
        int64_t d = 0;
        if (!parse_nak_json(b + 5, len - 5, &d)) return FX_ACK_INVALID;
        *delay_ns = d;
        return FX_ACK_NAK;
    }
    return FX_ACK_INVALID;
}

/* Append s JSON-escaped to out at *pos. Input longer than max bytes is cut on a UTF-8 boundary
 * when truncate, else refused. Returns false when refused or it does not fit (keeping room for
 * the NUL). */
static bool put_json_str(char *out, size_t cap, size_t *pos, const char *s, size_t max,
                         bool truncate)
{
    size_t n = strnlen(s, max + 1);
    if (n > max) {
        if (!truncate) return false;
        n = max;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* do not split a sequence */
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        size_t el;
        switch (c) {
        case '"': el = 2; memcpy(esc, "\\\"", 2); break;
        case '\\': el = 2; memcpy(esc, "\\\\", 2); break;
        case '\n': el = 2; memcpy(esc, "\\n", 2); break;
        case '\r': el = 2; memcpy(esc, "\\r", 2); break;
        case '\t': el = 2; memcpy(esc, "\\t", 2); break;
        case '\b': el = 2; memcpy(esc, "\\b", 2); break;
        case '\f': el = 2; memcpy(esc, "\\f", 2); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                el = 6;
            } else {
                esc[0] = (char)c;
                el = 1;
            }
        }
        if (*pos + el >= cap) return false;
        memcpy(out + *pos, esc, el);
        *pos += el;
    }
    return true;
}

static bool put_raw(char *out, size_t cap, size_t *pos, const char *s)
{
    size_t l = strlen(s);
    if (*pos + l >= cap) return false;
    memcpy(out + *pos, s, l);
    *pos += l;
    return true;
}

int fx_puback_ok(const char *stream, uint64_t seq, char *out, size_t cap)
{
    if (!stream || !out || cap == 0) return -1;
    size_t pos = 0;
    char num[32];
    snprintf(num, sizeof num, "\",\"seq\":%" PRIu64 "}", seq);
    if (!put_raw(out, cap, &pos, "{\"stream\":\"") ||
        !put_json_str(out, cap, &pos, stream, FX_JSACK_SUBJECT_MAX, false) ||
        !put_raw(out, cap, &pos, num)) {
        out[0] = '\0';
        return -1;
    }
    out[pos] = '\0';
    return (int)pos;
}

int fx_puback_err(int code, const char *description, char *out, size_t cap)
{
    return fx_puback_err_code(code, 0, description, out, cap);
}

int fx_puback_err_code(int code, int err_code, const char *description, char *out, size_t cap)
{
    if (!out || cap == 0) return -1;
    if (!description) description = "";
    size_t pos = 0;
    char head[96];
    if (err_code > 0)
        snprintf(head, sizeof head, "{\"error\":{\"code\":%d,\"err_code\":%d,\"description\":\"",
                 code, err_code);
    else
        snprintf(head, sizeof head, "{\"error\":{\"code\":%d,\"description\":\"", code);
    if (!put_raw(out, cap, &pos, head) || !put_json_str(out, cap, &pos, description, DESC_MAX, true) ||
        !put_raw(out, cap, &pos, "\"}}")) {
        out[0] = '\0';
        return -1;
    }
    out[pos] = '\0';
    return (int)pos;
}
