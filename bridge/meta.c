/* meta.c -- Fluxon MQ value codecs (contract in meta.h). Pure: no I/O. */
#include "meta.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- decimal ----------------------------------------------------------------------------------- */

typedef enum { DEC_OK = 0, DEC_EMPTY, DEC_LONG, DEC_CHAR, DEC_ZERO, DEC_RANGE } dec_status;

static const char *dec_reason(dec_status s)
{
    switch (s) {
    case DEC_OK: return "ok";
    case DEC_EMPTY: return "empty";
    case DEC_LONG: return "too long";
    case DEC_CHAR: return "not a decimal integer";
    case DEC_ZERO: return "leading zero or -0";
    case DEC_RANGE: return "out of int64 range";
    }
    return "?";
}

/* Canonical: -?(0|[1-9][0-9]*), within int64. */
static dec_status dec_scan(const char *s, size_t n, int64_t *out)
{
    if (n == 0) return DEC_EMPTY;
    if (n > FX_MQ_DEC_MAX) return DEC_LONG;
    size_t i = 0;
    bool neg = false;
    if (s[0] == '-') {
        neg = true;
        i = 1;
        if (n == 1) return DEC_CHAR;
    }
    for (size_t j = i; j < n; j++)
        if (s[j] < '0' || s[j] > '9') return DEC_CHAR;
    if (s[i] == '0' && (n - i > 1 || neg)) return DEC_ZERO;
    if (n - i > 19) return DEC_RANGE;
    uint64_t v = 0;
    for (size_t j = i; j < n; j++) v = v * 10u + (uint64_t)(s[j] - '0'); /* <= 19 digits */
    uint64_t lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    if (v > lim) return DEC_RANGE;
    if (neg)
        *out = v == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return DEC_OK;
}

fx_err fx_mq_dec_parse(const void *data, size_t len, int64_t min, int64_t max, const char *what,
                       int64_t *out)
{
    if (!what) what = "value";
    if (!out || (!data && len)) return fx_seterr(FX_EINVAL, "%s: NULL argument", what);
    int64_t v = 0;
    dec_status st = dec_scan(data ? data : "", len, &v);
    if (st != DEC_OK) return fx_seterr(FX_EPROTO, "%s: %s", what, dec_reason(st));
    if (v < min || v > max)
        return fx_seterr(FX_EPROTO, "%s: %lld out of range [%lld, %lld]", what, (long long)v,
                         (long long)min, (long long)max);
    *out = v;
    return FX_OK;
}

size_t fx_mq_dec_format(int64_t v, char buf[FX_MQ_DEC_BUF])
{
    char tmp[FX_MQ_DEC_BUF];
    size_t n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + (u % 10u));
        u /= 10u;
    } while (u);
    size_t o = 0;
    if (v < 0) buf[o++] = '-';
    while (n) buf[o++] = tmp[--n];
    buf[o] = '\0';
    return o;
}

fx_err fx_mq_counter_decode(const void *data, size_t len, int64_t *out)
{
    return fx_mq_dec_parse(data, len, 0, INT64_MAX, "id counter", out);
}
fx_err fx_mq_produce_offset_decode(const void *data, size_t len, int64_t *out)
{
    return fx_mq_dec_parse(data, len, FX_MQ_PRODUCE_OFFSET_BEGIN, INT64_MAX, "produce offset", out);
}
fx_err fx_mq_consume_offset_decode(const void *data, size_t len, int64_t *out)
{
    return fx_mq_dec_parse(data, len, FX_MQ_CONSUME_OFFSET_BEGIN, INT64_MAX, "consume offset", out);
}
fx_err fx_mq_lease_id_decode(const void *data, size_t len, int64_t *out)
{
    return fx_mq_dec_parse(data, len, 1, INT64_MAX, "lease id", out);
}
fx_err fx_mq_id_decode(const void *data, size_t len, int64_t *out)
{
    return fx_mq_dec_parse(data, len, 0, INT64_MAX, "id", out);
}

/* ---- JSON input: bounds, exact number text ------------------------------------------------------ */

/* Bounded pre-scan of the raw text: length, NUL bytes, "\u0000" escapes (cJSON would truncate
 * the string there), nesting depth. Runs before cJSON sees the input. */
static fx_err json_precheck(const char *p, size_t n, size_t max, const char *what)
{
    if (n == 0) return fx_seterr(FX_EPROTO, "%s: empty input", what);
    if (n > max) return fx_seterr(FX_EPROTO, "%s: %zu bytes, more than %zu", what, n, max);
    if (memchr(p, '\0', n)) return fx_seterr(FX_EPROTO, "%s: NUL byte in input", what);
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_str) {
            if (c == '\\') {
                if (i + 5 < n && memcmp(p + i + 1, "u0000", 5) == 0)
                    return fx_seterr(FX_EPROTO, "%s: \\u0000 in a string", what);
                i++; /* skip the escaped byte (a 'u' escape's hex digits are plain bytes) */
            } else if (c == '"') {
                in_str = false;
            }
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            if (++depth > FX_MQ_JSON_MAX_DEPTH)
                return fx_seterr(FX_EPROTO, "%s: nesting deeper than %d", what,
                                 FX_MQ_JSON_MAX_DEPTH);
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return FX_OK;
}

/* Walks the number tokens of the text in document order (outside strings). cJSON keeps object
 * members and array elements in document order, so the k-th number item met by a pre-order
 * walk of the tree is the k-th number token of the text. */
typedef struct numscan {
    const char *p;
    size_t n, i;
} numscan;

static bool num_char(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

static bool next_num(numscan *s, const char **tok, size_t *tlen)
{
    bool in_str = false;
    while (s->i < s->n) {
        char c = s->p[s->i];
        if (in_str) {
            if (c == '\\')
                s->i++;
            else if (c == '"')
                in_str = false;
            s->i++;
        } else if (c == '"') {
            in_str = true;
            s->i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t b = s->i;
            while (s->i < s->n && num_char(s->p[s->i])) s->i++;
            *tok = s->p + b;
            *tlen = s->i - b;
            return true;
        } else {
            s->i++;
        }
    }
    return false;
}

/* RFC 8259 number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? (cJSON is laxer:
 * it takes "01", "1." and "-0." too). */
static bool json_number_ok(const char *t, size_t n)
{
    size_t i = 0;
    if (i < n && t[i] == '-') i++;
    if (i >= n) return false;
    if (t[i] == '0') {
        i++;
    } else if (t[i] >= '1' && t[i] <= '9') {
        while (i < n && t[i] >= '0' && t[i] <= '9') i++;
    } else {
        return false;
    }
    if (i < n && t[i] == '.') {
        size_t b = ++i;
        while (i < n && t[i] >= '0' && t[i] <= '9') i++;
        if (i == b) return false;
    }
    if (i < n && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (i < n && (t[i] == '+' || t[i] == '-')) i++;
        size_t b = i;
        while (i < n && t[i] >= '0' && t[i] <= '9') i++;
        if (i == b) return false;
    }
    return i == n;
}

static bool is_int_literal(const char *t, size_t n);

/* Take the next token for number item `it`: it must be a valid JSON number. For integer
 * literals that fit int64, cross-check the text against cJSON's value (a guard on the
 * document-order correspondence; done without strtod, so the locale cannot interfere). */
static bool take_num(numscan *s, const cJSON *it, const char **tok, size_t *tlen)
{
    if (!next_num(s, tok, tlen) || !json_number_ok(*tok, *tlen)) return false;
    int64_t v;
    if (is_int_literal(*tok, *tlen) && dec_scan(*tok, *tlen, &v) == DEC_OK)
        return (double)v == it->valuedouble;
    return true;
}

/* Consume the tokens of every number inside `it` (pre-order). */
static bool skip_nums(numscan *s, const cJSON *it, int depth)
{
    if (depth > FX_MQ_JSON_MAX_DEPTH + 1) return false;
    const char *t;
    size_t tl;
    if (cJSON_IsNumber(it)) return take_num(s, it, &t, &tl);
    if (cJSON_IsArray(it) || cJSON_IsObject(it))
        for (const cJSON *c = it->child; c; c = c->next)
            if (!skip_nums(s, c, depth + 1)) return false;
    return true;
}

static fx_err json_parse(const void *data, size_t len, size_t max, const char *what, cJSON **out)
{
    *out = NULL;
    if (!data && len) return fx_seterr(FX_EINVAL, "%s: NULL input", what);
    const char *p = data ? data : "";
    fx_err e = json_precheck(p, len, max, what);
    if (e) return e;
    const char *endp = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(p, len, &endp, 0);
    if (!root) return fx_seterr(FX_EPROTO, "%s: not valid JSON", what);
    if (!endp || endp < p || endp > p + len) {
        cJSON_Delete(root);
        return fx_seterr(FX_EPROTO, "%s: not valid JSON", what);
    }
    while (endp < p + len && (*endp == ' ' || *endp == '\t' || *endp == '\n' || *endp == '\r'))
        endp++;
    if (endp != p + len) {
        cJSON_Delete(root);
        return fx_seterr(FX_EPROTO, "%s: trailing bytes after the JSON value", what);
    }
    *out = root;
    return FX_OK;
}

/* ---- flat objects ------------------------------------------------------------------------------- */

typedef struct jf {
    const cJSON *item; /* NULL: absent */
    const char *tok;   /* exact text when item is a number */
    size_t tok_len;
    const char *name;  /* the name it was found under (field or alias) */
} jf;

typedef struct jname {
    const char *name;
    int slot;
} jname;

/* Parse an object and bind its members to slots by (case-sensitive) name. Unknown members are
 * ignored; a slot bound twice (duplicate member, or a field and its alias) is an error. */
static fx_err obj_parse(const void *data, size_t len, const char *what, const jname *names,
                        size_t n_names, jf *slots, size_t n_slots, cJSON **root_out)
{
    memset(slots, 0, n_slots * sizeof *slots);
    cJSON *root = NULL;
    fx_err e = json_parse(data, len, FX_MQ_META_JSON_MAX, what, &root);
    if (e) return e;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fx_seterr(FX_EPROTO, "%s: not a JSON object", what);
    }
    numscan ns = {data, len, 0};
    for (const cJSON *c = root->child; c; c = c->next) {
        const char *tok = NULL;
        size_t tl = 0;
        bool ok = cJSON_IsNumber(c) ? take_num(&ns, c, &tok, &tl) : skip_nums(&ns, c, 1);
        if (!ok) {
            fx_err d = fx_seterr(FX_EPROTO, "%s: field '%s': invalid JSON number", what,
                                 c->string ? c->string : "?");
            cJSON_Delete(root); /* after formatting: c->string lives in root */
            return d;
        }
        if (!c->string) continue;
        for (size_t i = 0; i < n_names; i++) {
            if (strcmp(c->string, names[i].name) != 0) continue;
            jf *s = &slots[names[i].slot];
            if (s->item) {
                fx_err d = strcmp(s->name, names[i].name) == 0
                               ? fx_seterr(FX_EPROTO, "%s: duplicate field '%s'", what,
                                           names[i].name)
                               : fx_seterr(FX_EPROTO, "%s: duplicate field '%s' (alias of '%s')",
                                           what, names[i].name, s->name);
                cJSON_Delete(root);
                return d;
            }
            s->item = c;
            s->tok = tok;
            s->tok_len = tl;
            s->name = names[i].name;
        }
    }
    *root_out = root;
    return FX_OK;
}

static bool is_int_literal(const char *t, size_t n)
{
    size_t i = 0;
    if (n && t[0] == '-') i = 1;
    if (i >= n) return false;
    for (size_t j = i; j < n; j++)
        if (t[j] < '0' || t[j] > '9') return false;
    return true;
}

#define EXACT_DOUBLE_MAX 9007199254740992.0 /* 2^53 */

/* An int64 field: JSON string with canonical decimal, or JSON number (exact, see meta.h). */
static fx_err get_i64(const jf *f, const char *what, const char *field, int64_t min, int64_t max,
                      int64_t *out)
{
    const cJSON *it = f->item;
    int64_t v = 0;
    if (!it) return fx_seterr(FX_EPROTO, "%s: missing field '%s'", what, field);
    if (cJSON_IsNull(it)) return fx_seterr(FX_EPROTO, "%s: field '%s' is null", what, field);
    if (cJSON_IsString(it)) {
        dec_status st = dec_scan(it->valuestring, strlen(it->valuestring), &v);
        if (st != DEC_OK)
            return fx_seterr(FX_EPROTO, "%s: field '%s': %s", what, f->name, dec_reason(st));
    } else if (cJSON_IsNumber(it)) {
        if (!f->tok) return fx_seterr(FX_EPROTO, "%s: field '%s': number text lost", what, f->name);
        if (is_int_literal(f->tok, f->tok_len)) {
            dec_status st = dec_scan(f->tok, f->tok_len, &v);
            if (st != DEC_OK)
                return fx_seterr(FX_EPROTO, "%s: field '%s': %s", what, f->name, dec_reason(st));
        } else {
            double d = it->valuedouble;
            if (!isfinite(d) || d != trunc(d))
                return fx_seterr(FX_EPROTO, "%s: field '%s': not an integer", what, f->name);
            if (fabs(d) > EXACT_DOUBLE_MAX)
                return fx_seterr(FX_EPROTO,
                                 "%s: field '%s': non-literal number beyond 2^53 (write it as a "
                                 "decimal integer)", what, f->name);
            v = (int64_t)d;
        }
    } else {
        return fx_seterr(FX_EPROTO, "%s: field '%s': expected an integer", what, f->name);
    }
    if (v < min || v > max)
        return fx_seterr(FX_EPROTO, "%s: field '%s': %lld out of range [%lld, %lld]", what, f->name,
                         (long long)v, (long long)min, (long long)max);
    *out = v;
    return FX_OK;
}

/* An optional string field: absent or null -> *has = false. */
static fx_err get_opt_str(const jf *f, const char *what, const char *field, bool *has, char *buf)
{
    *has = false;
    buf[0] = '\0';
    const cJSON *it = f->item;
    if (!it || cJSON_IsNull(it)) return FX_OK;
    if (!cJSON_IsString(it))
        return fx_seterr(FX_EPROTO, "%s: field '%s': expected a string or null", what, field);
    size_t n = strnlen(it->valuestring, FX_MQ_STR_MAX + 1);
    if (n > FX_MQ_STR_MAX)
        return fx_seterr(FX_EPROTO, "%s: field '%s': longer than %d bytes", what, field,
                         FX_MQ_STR_MAX);
    memcpy(buf, it->valuestring, n + 1);
    *has = true;
    return FX_OK;
}

/* ---- encoding helpers -------------------------------------------------------------------------- */

static bool add_num(cJSON *o, const char *name, int64_t v)
{
    char b[FX_MQ_DEC_BUF];
    fx_mq_dec_format(v, b);
    return cJSON_AddRawToObject(o, name, b) != NULL;
}

static bool add_numstr(cJSON *o, const char *name, int64_t v)
{
    char b[FX_MQ_DEC_BUF];
    fx_mq_dec_format(v, b);
    return cJSON_AddStringToObject(o, name, b) != NULL;
}

static bool add_opt_str(cJSON *o, const char *name, bool has, const char *s)
{
    return (has ? cJSON_AddStringToObject(o, name, s) : cJSON_AddNullToObject(o, name)) != NULL;
}

/* Print `root` into a malloc'd copy (independent of cJSON's hooks), then delete root. */
static fx_err finish(cJSON *root, bool ok, const char *what, char **out)
{
    char *txt = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!txt) return fx_seterr(FX_ENOMEM, "%s: out of memory encoding JSON", what);
    size_t n = strlen(txt);
    char *cp = malloc(n + 1);
    if (cp) memcpy(cp, txt, n + 1);
    cJSON_free(txt);
    if (!cp) return fx_seterr(FX_ENOMEM, "%s: out of memory encoding JSON", what);
    *out = cp;
    return FX_OK;
}

static fx_err enc_start(const void *m, char **out, const char *what, cJSON **root)
{
    if (out) *out = NULL;
    if (!m || !out) return fx_seterr(FX_EINVAL, "%s: NULL argument", what);
    *root = cJSON_CreateObject();
    if (!*root) return fx_seterr(FX_ENOMEM, "%s: out of memory encoding JSON", what);
    return FX_OK;
}

static fx_err range_chk(fx_err code, const char *what, const char *field, int64_t v, int64_t min,
                        int64_t max)
{
    if (v < min || v > max)
        return fx_seterr(code, "%s: field '%s': %lld out of range [%lld, %lld]", what, field,
                         (long long)v, (long long)min, (long long)max);
    return FX_OK;
}

static fx_err str_chk(fx_err code, const char *what, const char *field, bool has, const char *s,
                      size_t cap)
{
    if (has && strnlen(s, cap) >= cap)
        return fx_seterr(code, "%s: field '%s': not NUL-terminated within %zu bytes", what, field,
                         cap);
    return FX_OK;
}

/* ---- ChanGlobalMeta ------------------------------------------------------------------------------ */

static const char W_CHAN[] = "channel meta";

static fx_err chan_meta_check(const fx_mq_chan_meta *m, fx_err code)
{
    fx_err e = range_chk(code, W_CHAN, "capacity", m->capacity, 1, INT64_MAX);
    if (!e) e = range_chk(code, W_CHAN, "ttl_seconds", m->ttl_seconds, FX_MQ_CODEC_MIN_TTL_SECONDS,
                          FX_MQ_MAX_TTL_SECONDS);
    if (!e) e = range_chk(code, W_CHAN, "global_lease_id", m->global_lease_id, 1, INT64_MAX);
    if (!e)
        e = range_chk(code, W_CHAN, "global_long_lease_id", m->global_long_lease_id, 1, INT64_MAX);
    if (!e) e = range_chk(code, W_CHAN, "payload_lease_id", m->payload_lease_id, 1, INT64_MAX);
    return e;
}

fx_err fx_mq_chan_meta_encode(const fx_mq_chan_meta *m, char **out)
{
    cJSON *o;
    fx_err e = enc_start(m, out, W_CHAN, &o);
    if (e) return e;
    e = chan_meta_check(m, FX_EINVAL);
    if (e) {
        cJSON_Delete(o);
        return e;
    }
    bool ok = add_num(o, "capacity", m->capacity) && add_num(o, "ttl_seconds", m->ttl_seconds) &&
              add_num(o, "global_lease_id", m->global_lease_id) &&
              add_num(o, "global_long_lease_id", m->global_long_lease_id) &&
              add_num(o, "payload_lease_id", m->payload_lease_id) &&
              (!m->segments || cJSON_AddStringToObject(o, "payload_format", "segment"));
    return finish(o, ok, W_CHAN, out);
}

fx_err fx_mq_chan_meta_decode(const void *json, size_t len, fx_mq_chan_meta *out)
{
    enum { CAP, TTL, GL, GLL, PL, PF, N };
    static const jname names[] = {
        {"capacity", CAP},        {"ttl_seconds", TTL},          {"global_lease_id", GL},
        {"meta_lease_id", GL},    {"cluster_lease_id", GL},      {"global_long_lease_id", GLL},
        {"cluster_long_lease_id", GLL}, {"payload_lease_id", PL}, {"payload_format", PF},
    };
    if (!out) return fx_seterr(FX_EINVAL, "%s: NULL output", W_CHAN);
    jf f[N];
    cJSON *root = NULL;
    fx_mq_chan_meta m = {0};
    fx_err e = obj_parse(json, len, W_CHAN, names, sizeof names / sizeof names[0], f, N, &root);
    if (e) return e;
    e = get_i64(&f[CAP], W_CHAN, "capacity", 1, INT64_MAX, &m.capacity);
    if (!e) e = get_i64(&f[TTL], W_CHAN, "ttl_seconds", FX_MQ_CODEC_MIN_TTL_SECONDS,
                        FX_MQ_MAX_TTL_SECONDS, &m.ttl_seconds);
    if (!e) e = get_i64(&f[GL], W_CHAN, "global_lease_id", 1, INT64_MAX, &m.global_lease_id);
    if (!e) e = get_i64(&f[GLL], W_CHAN, "global_long_lease_id", 1, INT64_MAX,
                        &m.global_long_lease_id);
    if (!e) e = get_i64(&f[PL], W_CHAN, "payload_lease_id", 1, INT64_MAX, &m.payload_lease_id);
    bool has_pf = false;
    char pf[FX_MQ_STR_MAX + 1];
    if (!e) e = get_opt_str(&f[PF], W_CHAN, "payload_format", &has_pf, pf);
    if (!e && has_pf) {
        if (strcmp(pf, "segment") == 0)
            m.segments = true;
        else
            e = fx_seterr(FX_EPROTO, "%s: field 'payload_format': unsupported value '%s'", W_CHAN,
                          pf);
    }
    cJSON_Delete(root);
    if (!e) *out = m;
    return e;
}

/* ---- ProducerMemberMeta -------------------------------------------------------------------------- */

static const char W_PROD[] = "producer member meta";

fx_err fx_mq_producer_meta_encode(const fx_mq_producer_meta *m, char **out)
{
    cJSON *o;
    fx_err e = enc_start(m, out, W_PROD, &o);
    if (e) return e;
    e = range_chk(FX_EINVAL, W_PROD, "producer_idx", m->producer_idx, 0, INT64_MAX);
    if (!e) e = str_chk(FX_EINVAL, W_PROD, "external_client_id", m->has_external_client_id,
                        m->external_client_id, sizeof m->external_client_id);
    if (e) {
        cJSON_Delete(o);
        return e;
    }
    bool ok = add_numstr(o, "producer_idx", m->producer_idx) &&
              add_opt_str(o, "external_client_id", m->has_external_client_id,
                          m->external_client_id);
    return finish(o, ok, W_PROD, out);
}

fx_err fx_mq_producer_meta_decode(const void *json, size_t len, fx_mq_producer_meta *out)
{
    enum { IDX, EXT, N };
    static const jname names[] = {{"producer_idx", IDX}, {"external_client_id", EXT}};
    if (!out) return fx_seterr(FX_EINVAL, "%s: NULL output", W_PROD);
    jf f[N];
    cJSON *root = NULL;
    fx_mq_producer_meta m;
    memset(&m, 0, sizeof m);
    fx_err e = obj_parse(json, len, W_PROD, names, 2, f, N, &root);
    if (e) return e;
    e = get_i64(&f[IDX], W_PROD, "producer_idx", 0, INT64_MAX, &m.producer_idx);
    if (!e) e = get_opt_str(&f[EXT], W_PROD, "external_client_id", &m.has_external_client_id,
                            m.external_client_id);
    cJSON_Delete(root);
    if (!e) *out = m;
    return e;
}

/* ---- ChanMemberMeta ------------------------------------------------------------------------------- */

static const char W_MEMB[] = "member meta";

fx_err fx_mq_member_meta_encode(const fx_mq_member_meta *m, char **out)
{
    cJSON *o;
    fx_err e = enc_start(m, out, W_MEMB, &o);
    if (e) return e;
    e = range_chk(FX_EINVAL, W_MEMB, "member_id", m->member_id, 0, INT64_MAX);
    if (!e && m->role != FX_MQ_ROLE_PRODUCER && m->role != FX_MQ_ROLE_CONSUMER)
        e = fx_seterr(FX_EINVAL, "%s: field 'role': invalid value %d", W_MEMB, (int)m->role);
    if (!e) e = str_chk(FX_EINVAL, W_MEMB, "external_client_id", m->has_external_client_id,
                        m->external_client_id, sizeof m->external_client_id);
    if (!e) e = str_chk(FX_EINVAL, W_MEMB, "kvclient_sub_cluster", m->has_kvclient_sub_cluster,
                        m->kvclient_sub_cluster, sizeof m->kvclient_sub_cluster);
    if (e) {
        cJSON_Delete(o);
        return e;
    }
    bool ok = add_numstr(o, "member_id", m->member_id) &&
              cJSON_AddStringToObject(o, "role", fx_mq_role_name(m->role)) != NULL &&
              add_opt_str(o, "external_client_id", m->has_external_client_id,
                          m->external_client_id) &&
              add_opt_str(o, "kvclient_sub_cluster", m->has_kvclient_sub_cluster,
                          m->kvclient_sub_cluster);
    return finish(o, ok, W_MEMB, out);
}

fx_err fx_mq_member_meta_decode(const void *json, size_t len, fx_mq_member_meta *out)
{
    enum { ID, ROLE, EXT, SUB, N };
    static const jname names[] = {{"member_id", ID},
                                  {"role", ROLE},
                                  {"external_client_id", EXT},
                                  {"kvclient_sub_cluster", SUB}};
    if (!out) return fx_seterr(FX_EINVAL, "%s: NULL output", W_MEMB);
    jf f[N];
    cJSON *root = NULL;
    fx_mq_member_meta m;
    memset(&m, 0, sizeof m);
    fx_err e = obj_parse(json, len, W_MEMB, names, 4, f, N, &root);
    if (e) return e;
    e = get_i64(&f[ID], W_MEMB, "member_id", 0, INT64_MAX, &m.member_id);
    if (!e) {
        const cJSON *r = f[ROLE].item;
        if (!r)
            e = fx_seterr(FX_EPROTO, "%s: missing field 'role'", W_MEMB);
        else if (!cJSON_IsString(r))
            e = fx_seterr(FX_EPROTO, "%s: field 'role': expected a string", W_MEMB);
        else if (strcmp(r->valuestring, "consumer") == 0)
            m.role = FX_MQ_ROLE_CONSUMER;
        else if (strcmp(r->valuestring, "producer") == 0)
            m.role = FX_MQ_ROLE_PRODUCER;
        else
            e = fx_seterr(FX_EPROTO, "%s: field 'role': expected \"producer\" or \"consumer\"",
                          W_MEMB);
    }
    if (!e) e = get_opt_str(&f[EXT], W_MEMB, "external_client_id", &m.has_external_client_id,
                            m.external_client_id);
    if (!e) e = get_opt_str(&f[SUB], W_MEMB, "kvclient_sub_cluster", &m.has_kvclient_sub_cluster,
                            m.kvclient_sub_cluster);
    cJSON_Delete(root);
    if (!e) *out = m;
    return e;
}

/* ---- MPMC meta ------------------------------------------------------------------------------------ */

static const char W_MPMC[] = "mpmc meta";

static fx_err mpmc_meta_check(const fx_mq_mpmc_meta *m, fx_err code)
{
    fx_err e = range_chk(code, W_MPMC, "capacity", m->capacity, 1, INT64_MAX);
    if (!e) e = range_chk(code, W_MPMC, "ttl_seconds", m->ttl_seconds, FX_MQ_CODEC_MIN_TTL_SECONDS,
                          FX_MQ_MAX_TTL_SECONDS);
    if (!e && (!isfinite(m->created_at) || m->created_at < 0))
        e = fx_seterr(code, "%s: field 'created_at': must be finite and >= 0", W_MPMC);
    if (!e) e = range_chk(code, W_MPMC, "metadata_lease_id", m->metadata_lease_id, 1, INT64_MAX);
    if (!e) e = range_chk(code, W_MPMC, "payload_lease_id", m->payload_lease_id, 1, INT64_MAX);
    if (!e) e = range_chk(code, W_MPMC, "id_allocator_cluster_lease_id",
                          m->id_allocator_cluster_lease_id, 1, INT64_MAX);
    if (!e && m->retention_seconds)
        e = range_chk(code, W_MPMC, "retention_seconds", m->retention_seconds,
                      FX_MQ_CODEC_MIN_TTL_SECONDS, FX_MQ_MAX_TTL_SECONDS);
    if (!e && m->retention_legacy && !m->retention_seconds)
        e = fx_seterr(code, "%s: field 'retention_legacy' without 'retention_seconds'", W_MPMC);
    return e;
}

fx_err fx_mq_mpmc_meta_encode(const fx_mq_mpmc_meta *m, char **out)
{
    cJSON *o;
    fx_err e = enc_start(m, out, W_MPMC, &o);
    if (e) return e;
    e = mpmc_meta_check(m, FX_EINVAL);
    if (e) {
        cJSON_Delete(o);
        return e;
    }
    bool ok = add_num(o, "capacity", m->capacity) && add_num(o, "ttl_seconds", m->ttl_seconds) &&
              cJSON_AddNumberToObject(o, "created_at", m->created_at) != NULL &&
              add_num(o, "metadata_lease_id", m->metadata_lease_id) &&
              add_num(o, "payload_lease_id", m->payload_lease_id) &&
              add_num(o, "id_allocator_cluster_lease_id", m->id_allocator_cluster_lease_id) &&
              (!m->retention_seconds || add_num(o, "retention_seconds", m->retention_seconds)) &&
              (!m->retention_legacy || cJSON_AddTrueToObject(o, "retention_legacy") != NULL);
    return finish(o, ok, W_MPMC, out);
}

fx_err fx_mq_mpmc_meta_decode(const void *json, size_t len, fx_mq_mpmc_meta *out)
{
    enum { CAP, TTL, AT, ML, PL, IL, RET, RLEG, N };
    static const jname names[] = {
        {"capacity", CAP},          {"ttl_seconds", TTL},      {"created_at", AT},
        {"metadata_lease_id", ML},  {"payload_lease_id", PL},  {"id_allocator_cluster_lease_id", IL},
        {"retention_seconds", RET}, {"retention_legacy", RLEG},
    };
    if (!out) return fx_seterr(FX_EINVAL, "%s: NULL output", W_MPMC);
    jf f[N];
    cJSON *root = NULL;
    fx_mq_mpmc_meta m = {0};
    fx_err e = obj_parse(json, len, W_MPMC, names, sizeof names / sizeof names[0], f, N, &root);
    if (e) return e;
    e = get_i64(&f[CAP], W_MPMC, "capacity", 1, INT64_MAX, &m.capacity);
    if (!e) e = get_i64(&f[TTL], W_MPMC, "ttl_seconds", FX_MQ_CODEC_MIN_TTL_SECONDS,
                        FX_MQ_MAX_TTL_SECONDS, &m.ttl_seconds);
    if (!e) {
        const cJSON *a = f[AT].item;
        if (a && !cJSON_IsNull(a)) {
            if (!cJSON_IsNumber(a) || !isfinite(a->valuedouble) || a->valuedouble < 0)
                e = fx_seterr(FX_EPROTO, "%s: field 'created_at': expected a number >= 0", W_MPMC);
            else
                m.created_at = a->valuedouble;
        }
    }
    if (!e) e = get_i64(&f[ML], W_MPMC, "metadata_lease_id", 1, INT64_MAX, &m.metadata_lease_id);
    if (!e) e = get_i64(&f[PL], W_MPMC, "payload_lease_id", 1, INT64_MAX, &m.payload_lease_id);
    if (!e) e = get_i64(&f[IL], W_MPMC, "id_allocator_cluster_lease_id", 1, INT64_MAX,
                        &m.id_allocator_cluster_lease_id);
    if (!e && f[RET].item && !cJSON_IsNull(f[RET].item))
        e = get_i64(&f[RET], W_MPMC, "retention_seconds", FX_MQ_CODEC_MIN_TTL_SECONDS,
                    FX_MQ_MAX_TTL_SECONDS, &m.retention_seconds);
    if (!e && f[RLEG].item && !cJSON_IsNull(f[RLEG].item)) {
        if (!cJSON_IsBool(f[RLEG].item))
            e = fx_seterr(FX_EPROTO, "%s: field 'retention_legacy': expected a boolean", W_MPMC);
        else
            m.retention_legacy = cJSON_IsTrue(f[RLEG].item);
    }
    if (!e && m.retention_legacy && !m.retention_seconds)
        e = fx_seterr(FX_EPROTO, "%s: field 'retention_legacy' without 'retention_seconds'", W_MPMC);
    cJSON_Delete(root);
    if (!e) *out = m;
    return e;
}

/* ---- mpsc_channels list --------------------------------------------------------------------------- */

static const char W_LIST[] = "mpsc_channels";

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* FX_OK if ids has no duplicates; code otherwise. */
static fx_err dup_check(const int64_t *ids, size_t n, fx_err code)
{
    if (n < 2) return FX_OK;
    int64_t *s = malloc(n * sizeof *s);
    if (!s) return fx_seterr(FX_ENOMEM, "%s: out of memory", W_LIST);
    memcpy(s, ids, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_i64);
    fx_err e = FX_OK;
    for (size_t i = 1; i < n && !e; i++)
        if (s[i] == s[i - 1])
            e = fx_seterr(code, "%s: duplicate id %lld", W_LIST, (long long)s[i]);
    free(s);
    return e;
}

fx_err fx_mq_mpsc_list_encode(const int64_t *ids, size_t n, char **out)
{
    if (out) *out = NULL;
    if (!out || (n && !ids)) return fx_seterr(FX_EINVAL, "%s: NULL argument", W_LIST);
    if (n > FX_MQ_MAX_MPSC_CHANNELS)
        return fx_seterr(FX_EINVAL, "%s: %zu entries, more than %d", W_LIST, n,
                         FX_MQ_MAX_MPSC_CHANNELS);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0)
            return fx_seterr(FX_EINVAL, "%s: entry %zu: %lld is negative", W_LIST, i,
                             (long long)ids[i]);
    fx_err e = dup_check(ids, n, FX_EINVAL);
    if (e) return e;
    /* Written by hand: every entry is a decimal string, no escaping needed. */
    size_t cap = 2 + n * (FX_MQ_DEC_MAX + 3) + 1;
    char *b = malloc(cap);
    if (!b) return fx_seterr(FX_ENOMEM, "%s: out of memory", W_LIST);
    size_t o = 0;
    b[o++] = '[';
    for (size_t i = 0; i < n; i++) {
        if (i) b[o++] = ',';
        b[o++] = '"';
        char d[FX_MQ_DEC_BUF];
        size_t dl = fx_mq_dec_format(ids[i], d);
        memcpy(b + o, d, dl);
        o += dl;
        b[o++] = '"';
    }
    b[o++] = ']';
    b[o] = '\0';
    *out = b;
    return FX_OK;
}

fx_err fx_mq_mpsc_list_decode(const void *json, size_t len, int64_t **out_ids, size_t *out_n)
{
    if (out_ids) *out_ids = NULL;
    if (out_n) *out_n = 0;
    if (!out_ids || !out_n) return fx_seterr(FX_EINVAL, "%s: NULL output", W_LIST);
    cJSON *root = NULL;
    fx_err e = json_parse(json, len, FX_MQ_LIST_JSON_MAX, W_LIST, &root);
    if (e) return e;
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return fx_seterr(FX_EPROTO, "%s: not a JSON array", W_LIST);
    }
    size_t n = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (++n > FX_MQ_MAX_MPSC_CHANNELS) {
            cJSON_Delete(root);
            return fx_seterr(FX_EPROTO, "%s: more than %d entries", W_LIST,
                             FX_MQ_MAX_MPSC_CHANNELS);
        }
    }
    int64_t *ids = NULL;
    if (n) {
        ids = malloc(n * sizeof *ids);
        if (!ids) {
            cJSON_Delete(root);
            return fx_seterr(FX_ENOMEM, "%s: out of memory", W_LIST);
        }
    }
    numscan ns = {json, len, 0};
    size_t i = 0;
    char field[32];
    for (const cJSON *c = root->child; c && !e; c = c->next, i++) {
        jf f = {c, NULL, 0, field};
        snprintf(field, sizeof field, "[%zu]", i);
        if (cJSON_IsNumber(c) && !take_num(&ns, c, &f.tok, &f.tok_len))
            e = fx_seterr(FX_EPROTO, "%s: entry %zu: invalid JSON number", W_LIST, i);
        else if (!cJSON_IsNumber(c) && !cJSON_IsString(c))
            e = fx_seterr(FX_EPROTO, "%s: entry %zu: expected a decimal string", W_LIST, i);
        else
            e = get_i64(&f, W_LIST, field, 0, INT64_MAX, &ids[i]);
    }
    cJSON_Delete(root);
    if (!e) e = dup_check(ids, n, FX_EPROTO);
    if (e) {
        free(ids);
        return e;
    }
    *out_ids = ids;
    *out_n = n;
    return FX_OK;
}
