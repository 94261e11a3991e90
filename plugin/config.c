/* config.c -- fluxon-bridge configuration: JSON parsing, defaults and validation (config.h).
 *
 * Shape of the code:
 *  - Every default lives in the "Defaults" block below; every per-channel setting is one row of
 *    k_settings (key, kind, field, min, max).
 *  - Each JSON object is walked once against its list of known keys: unknown and duplicate keys
 *    are rejected there (cJSON keeps duplicates; we detect them), with the full path.
 *  - Sections are then read in a fixed order (name, nats, etcd, kv, http, defaults, channels), so
 *    "defaults" applies to the channels wherever it appears in the file.
 *  - Cross-field rules (names, prefixes, overlaps) run once, after everything was read, then the
 *    dead-letter channels are generated.
 * The result is built in a scratch struct and handed over only when everything passed; on
 * failure *out is left untouched.
 */
#include "config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fx_url.h"
#include "leaf.h"
#include "subject.h"

/* ---- Limits ----------------------------------------------------------------------------- */

#define CFG_FILE_MAX      (1024 * 1024) /* bytes of JSON */
#define CFG_NAME_MAX      64            /* bridge and channel names */
#define CFG_PREFIX_MAX    256           /* deliver_prefix */
#define CFG_ROOT_MAX      128           /* etcd.prefix (bridge/keys.h FX_MQ_ROOT_MAX) */
#define CFG_STR_MAX       4096          /* any other string */
#define CFG_CHANNELS_MAX  256
#define CFG_SUBJECTS_MAX  256           /* per channel */
#define CFG_SUBJECTS_ALL  4096          /* all channels (overlap checks are pairwise) */
#define CFG_ENDPOINTS_MAX 16
#define CFG_PATH_CAP      256           /* "channels[12].backoff[3]" and friends */
#define DLQ_SUFFIX        "-dlq"

#define MS_HOUR (3600LL * 1000)
#define MS_DAY  (24 * MS_HOUR)

/* ---- Defaults (the only place they are written down) -------------------------------------- */

#define DEF_NATS_URL      "nats://127.0.0.1:4222"
#define DEF_MONITOR_URL   "http://127.0.0.1:8222"
#define DEF_ACCOUNT       "$G"
#define DEF_ETCD_ENDPOINT "http://127.0.0.1:2379"
#define DEF_ETCD_PREFIX   "/fluxon"
#define DEF_KV_BACKEND    "etcd"
#define DEF_ETCD_TRANSPORT "grpc"
/* http.listen: no default (NULL = HTTP disabled). kv.endpoints: the etcd endpoints.
 * name: "<hostname>-<pid>", see default_name(). */

static const fx_chan_settings k_default_settings = {
    .ttl_seconds = 90,
    .capacity = 100000,
    .ack = FX_ACK_EXPLICIT,
    .ack_wait_ms = 30 * 1000,
    .max_deliver = 5,
    .max_ack_pending = 1000,
    .backoff_ms = {1000, 5000},
    .n_backoff = 2,
    .release_after_ms = 5 * 1000,
    .interest_poll_ms = 1000,
    .retention_ms = 7 * MS_DAY,
    .full_wait_ms = 0,
    .duplicate_window_ms = 2 * 60 * 1000,
    .duplicate_max_ids = 100000,
    .max_delay_ms = MS_DAY,
    .duplicate_max_bytes = 0, /* auto: a share of FX_CFG_DEDUP_BYTES_ALL (read_channels) */
};

/* ---- Per-channel settings: one row per key ---------------------------------------------- */

typedef enum { SK_INT, SK_DURATION, SK_ACK, SK_BACKOFF } setting_kind;

typedef struct {
    const char *key;
    setting_kind kind;
    size_t off;          /* offset of the int64_t field (backoff: of backoff_ms) */
    int64_t min, max;    /* inclusive; durations (and backoff entries) in ms */
} setting_key;

#define SOFF(f) offsetof(fx_chan_settings, f)
static const setting_key k_settings[] = {
    {"ttl_seconds",     SK_INT,      SOFF(ttl_seconds),      2,   9000000000LL}, /* etcd MaxLeaseTTL */
    {"capacity",        SK_INT,      SOFF(capacity),         1,   1000000000000LL},
    {"ack",             SK_ACK,      SOFF(ack),              0,   0},
    {"ack_wait",        SK_DURATION, SOFF(ack_wait_ms),      100, MS_DAY},
    {"max_deliver",     SK_INT,      SOFF(max_deliver),      1,   1000000},
    {"max_ack_pending", SK_INT,      SOFF(max_ack_pending),  1,   1000000},
    {"backoff",         SK_BACKOFF,  SOFF(backoff_ms),       0,   MS_DAY},
    {"nak_delay",       SK_DURATION, SOFF(nak_delay_ms),     0,   MS_DAY},
    {"release_after",   SK_DURATION, SOFF(release_after_ms), 0,   MS_DAY},
    {"interest_poll",   SK_DURATION, SOFF(interest_poll_ms), 50,  MS_HOUR},
    {"retention",       SK_DURATION, SOFF(retention_ms),     2000, 9000000000LL * 1000}, /* MaxLeaseTTL */
    {"full_wait",       SK_DURATION, SOFF(full_wait_ms),     0,   60 * 1000},
    {"duplicate_window", SK_DURATION, SOFF(duplicate_window_ms), 0, MS_DAY},
    {"duplicate_max_ids", SK_INT,    SOFF(duplicate_max_ids),   1000, 10000000},
    {"duplicate_max_bytes", SK_INT,  SOFF(duplicate_max_bytes), 1LL << 20, 1LL << 30},
    {"max_delay",       SK_DURATION, SOFF(max_delay_ms),     0,   9000000000LL * 1000},
};
#define N_SETTINGS (sizeof k_settings / sizeof k_settings[0])

/* ---- Errors ------------------------------------------------------------------------------ */

typedef struct {
    char *err;
    size_t errlen;
} pctx;

/* Write "path: message" (just "message" for an empty path); always returns -1. */
__attribute__((format(printf, 3, 4)))
static int fail(pctx *p, const char *path, const char *fmt, ...)
{
    if (!p->err || p->errlen == 0) return -1;
    int n = 0;
    if (path && path[0]) n = snprintf(p->err, p->errlen, "%s: ", path);
    if (n < 0) n = 0;
    if ((size_t)n < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Copy s for an error message: control bytes become '?', long text is cut with "...". */
static const char *show(char *buf, size_t cap, const char *s)
{
    size_t i = 0, j = 0;
    if (!s) s = "";
    for (; s[i] && j + 4 < cap; i++, j++) {
        unsigned char c = (unsigned char)s[i];
        buf[j] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (s[i]) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}
#define SHOW(s) show((char[80]){0}, 80, (s))

/* snprintf for text that may be cut (paths and values shown in messages). */
__attribute__((format(printf, 3, 4)))
static void bprintf(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

static void path_key(char *dst, const char *base, const char *key)
{
    char k[80];
    show(k, sizeof k, key);
    bprintf(dst, CFG_PATH_CAP, "%s%s%s", base, base[0] ? "." : "", k);
}

static void path_idx(char *dst, const char *base, size_t i)
{
    bprintf(dst, CFG_PATH_CAP, "%s[%zu]", base, i);
}

/* ---- Memory ------------------------------------------------------------------------------ */

/* Every string of a config is wiped before it is freed: passwords and tokens obviously, URLs
 * because they may carry user:password. */
static void free_str(char *s)
{
    if (!s) return;
    explicit_bzero(s, strlen(s));
    free(s);
}

static void free_strv(char **v, size_t n)
{
    if (!v) return;
    for (size_t i = 0; i < n; i++) free_str(v[i]);
    free(v);
}

static void wipe_json(cJSON *j)
{
    for (; j; j = j->next) {
        if (j->string) explicit_bzero(j->string, strlen(j->string));
        if (j->valuestring) explicit_bzero(j->valuestring, strlen(j->valuestring));
        if (j->child) wipe_json(j->child); /* depth bounded by cJSON's nesting limit */
    }
}

static void free_channel(fx_chan_config *ch)
{
    free_str(ch->name);
    free_strv(ch->subjects, ch->n_subjects);
    free_str(ch->deliver_prefix);
    memset(ch, 0, sizeof *ch);
}

void fx_config_share(fx_config *c)
{
    if (c) atomic_store(&c->refs, 1);
}

fx_config *fx_config_ref(fx_config *c)
{
    if (c) atomic_fetch_add(&c->refs, 1);
    return c;
}

void fx_config_unref(fx_config *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    fx_config_free(c);
    free(c);
}

void fx_config_free(fx_config *c)
{
    if (!c) return;
    free_str(c->name);
    free_str(c->nats.url);
    free_str(c->nats.monitor_url);
    free_str(c->nats.account);
    free_str(c->nats.leaf_url);
    free_str(c->nats.user);
    free_str(c->nats.password);
    free_str(c->nats.token);
    free_str(c->nats.creds_file);
    free_str(c->nats.nkey_seed_file);
    free_str(c->nats.ca_file);
    free_str(c->nats.cert_file);
    free_str(c->nats.key_file);
    free_strv(c->etcd.endpoints, c->etcd.n_endpoints);
    free_str(c->etcd.prefix);
    free_str(c->etcd.transport);
    free_str(c->etcd.username);
    free_str(c->etcd.password);
    free_str(c->etcd.ca_file);
    free_str(c->etcd.cert_file);
    free_str(c->etcd.key_file);
    free_str(c->kv.backend);
    free_strv(c->kv.endpoints, c->kv.n_endpoints);
    if (c->kv.url) explicit_bzero(c->kv.url, strlen(c->kv.url)); /* may hold a password */
    free_str(c->kv.url);
    free_str(c->http.listen);
    free_str(c->jetstream.domain);
    for (size_t i = 0; i < c->n_channels; i++) free_channel(&c->channels[i]);
    free(c->channels);
    memset(c, 0, sizeof *c);
}

/* ---- Durations --------------------------------------------------------------------------- */

/* digits ["." digits] [unit]; unit one of ms, s, m, h, d; no unit = seconds. Nothing else: no sign,
 * no whitespace, no exponent. Fractions are rounded to the nearest millisecond. */
int fx_parse_duration_ms(const char *s, int64_t *out_ms)
{
    if (!s || !out_ms || s[0] < '0' || s[0] > '9') return -1;
    char *end = NULL;
    errno = 0;
    long long whole = strtoll(s, &end, 10);
    if (errno == ERANGE || whole < 0 || end == s) return -1;
    const char *q = end;
    int64_t frac = 0, den = 1;
    if (*q == '.') {
        q++;
        if (*q < '0' || *q > '9') return -1;
        for (; *q >= '0' && *q <= '9'; q++) {
            if (den < 1000000000) { /* 9 digits are plenty; later ones cannot change the ms */
                frac = frac * 10 + (*q - '0');
                den *= 10;
            }
        }
    }
    int64_t mult;
    if (strcmp(q, "") == 0 || strcmp(q, "s") == 0) mult = 1000;
    else if (strcmp(q, "ms") == 0) mult = 1;
    else if (strcmp(q, "m") == 0) mult = 60 * 1000;
    else if (strcmp(q, "h") == 0) mult = MS_HOUR;
    else if (strcmp(q, "d") == 0) mult = MS_DAY;
    else return -1;
    if (whole > INT64_MAX / mult) return -1;
    int64_t ms = (int64_t)whole * mult;
    int64_t part = (frac * mult + den / 2) / den; /* frac < 1e9, mult <= 3.6e6: no overflow */
    if (ms > INT64_MAX - part) return -1;
    *out_ms = ms + part;
    return 0;
}

/* "250ms", "30s", "5m", "1h" whenever exact, for messages. */
static const char *fmt_ms(char *buf, size_t cap, int64_t ms)
{
    if (ms != 0 && ms % MS_HOUR == 0) snprintf(buf, cap, "%lldh", (long long)(ms / MS_HOUR));
    else if (ms != 0 && ms % 60000 == 0) snprintf(buf, cap, "%lldm", (long long)(ms / 60000));
    else if (ms != 0 && ms % 1000 == 0) snprintf(buf, cap, "%llds", (long long)(ms / 1000));
    else snprintf(buf, cap, "%lldms", (long long)ms);
    return buf;
}
#define FMT_MS(ms) fmt_ms((char[32]){0}, 32, (ms))

/* ---- Typed readers (node NULL = key absent: keep what is there) ---------------------------- */

static int read_string(pctx *p, const cJSON *node, const char *path, char **dst)
{
    if (!node) return 0;
    if (!cJSON_IsString(node) || !node->valuestring) return fail(p, path, "must be a string");
    if (strlen(node->valuestring) > CFG_STR_MAX)
        return fail(p, path, "longer than %d bytes", CFG_STR_MAX);
    char *s = strdup(node->valuestring);
    if (!s) return fail(p, path, "out of memory");
    free_str(*dst);
    *dst = s;
    return 0;
}

/* Optional string where "" means "not set" (credentials, file names, http.listen). */
static int read_opt_string(pctx *p, const cJSON *node, const char *path, char **dst)
{
    if (read_string(p, node, path, dst) != 0) return -1;
    if (*dst && (*dst)[0] == '\0') {
        free_str(*dst);
        *dst = NULL;
    }
    return 0;
}

/* String that must not be empty when given. */
static int read_nonempty_string(pctx *p, const cJSON *node, const char *path, char **dst)
{
    if (read_string(p, node, path, dst) != 0) return -1;
    if (node && (*dst)[0] == '\0') return fail(p, path, "must not be empty");
    return 0;
}

static int read_bool(pctx *p, const cJSON *node, const char *path, bool *dst)
{
    if (!node) return 0;
    if (!cJSON_IsBool(node)) return fail(p, path, "must be true or false");
    *dst = cJSON_IsTrue(node);
    return 0;
}

static int read_string_array(pctx *p, const cJSON *node, const char *path, size_t max_n,
                             char ***dst, size_t *dst_n)
{
    if (!node) return 0;
    if (!cJSON_IsArray(node)) return fail(p, path, "must be an array of strings");
    size_t n = (size_t)cJSON_GetArraySize(node);
    if (n == 0) return fail(p, path, "must not be empty");
    if (n > max_n) return fail(p, path, "at most %zu entries", max_n);
    char **v = calloc(n, sizeof *v);
    if (!v) return fail(p, path, "out of memory");
    size_t i = 0;
    for (const cJSON *it = node->child; it; it = it->next, i++) {
        char ip[CFG_PATH_CAP];
        path_idx(ip, path, i);
        if (read_nonempty_string(p, it, ip, &v[i]) != 0) {
            free_strv(v, n);
            return -1;
        }
    }
    free_strv(*dst, *dst_n);
    *dst = v;
    *dst_n = n;
    return 0;
}

static int read_int(pctx *p, const cJSON *node, const char *path, int64_t min, int64_t max,
                    int64_t *dst)
{
    if (!node) return 0;
    if (!cJSON_IsNumber(node)) return fail(p, path, "must be an integer");
    double d = node->valuedouble;
    /* Range first: converting an out-of-range double to int64_t is undefined. */
    if (!(d >= (double)min && d <= (double)max))
        return fail(p, path, "%.15g out of range [%lld, %lld]", d, (long long)min, (long long)max);
    int64_t v = (int64_t)d;
    if ((double)v != d) return fail(p, path, "must be an integer");
    *dst = v;
    return 0;
}

static int read_duration(pctx *p, const cJSON *node, const char *path, int64_t min, int64_t max,
                         int64_t *dst)
{
    if (!node) return 0;
    int64_t ms;
    if (cJSON_IsNumber(node)) {
        double d = node->valuedouble;
        if (!(d >= 0)) return fail(p, path, "must not be negative");
        if (d > 9.0e12) /* beyond every max; keeps the conversion defined */
            return fail(p, path, "%.15g seconds out of range [%s, %s]", d, FMT_MS(min),
                        FMT_MS(max));
        ms = (int64_t)(d * 1000.0 + 0.5);
    } else if (cJSON_IsString(node)) {
        if (fx_parse_duration_ms(node->valuestring, &ms) != 0)
            return fail(p, path,
                        "\"%s\" is not a duration (use \"250ms\", \"30s\", \"5m\", \"1h\" or a "
                        "number of seconds)",
                        SHOW(node->valuestring));
    } else {
        return fail(p, path,
                    "must be a duration (\"250ms\", \"30s\", \"5m\", \"1h\") or a number of seconds");
    }
    if (ms < min || ms > max)
        return fail(p, path, "%s out of range [%s, %s]", FMT_MS(ms), FMT_MS(min), FMT_MS(max));
    *dst = ms;
    return 0;
}

/* ---- Objects ----------------------------------------------------------------------------- */

/* Check obj is an object whose keys are all in keys[] and appear once; slots[i] receives the
 * value of keys[i] or NULL. */
static int walk_object(pctx *p, const cJSON *obj, const char *path, const char *const *keys,
                       size_t nkeys, const cJSON **slots)
{
    if (!cJSON_IsObject(obj)) {
        if (path[0]) return fail(p, path, "must be an object");
        return fail(p, "", "the configuration must be a JSON object");
    }
    for (size_t i = 0; i < nkeys; i++) slots[i] = NULL;
    for (const cJSON *it = obj->child; it; it = it->next) {
        const char *key = it->string ? it->string : "";
        char kp[CFG_PATH_CAP];
        path_key(kp, path, key);
        size_t k = 0;
        while (k < nkeys && strcmp(keys[k], key) != 0) k++;
        if (k == nkeys) return fail(p, kp, "unknown key");
        if (slots[k]) return fail(p, kp, "duplicate key");
        slots[k] = it;
    }
    return 0;
}

static int64_t *setting_field(fx_chan_settings *s, const setting_key *k)
{
    return (int64_t *)(void *)((char *)s + k->off);
}

/* Overlay the settings keys found (slots parallel to k_settings) onto s. */
static int read_settings(pctx *p, const cJSON *const *slots, const char *path, fx_chan_settings *s)
{
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const setting_key *k = &k_settings[i];
        const cJSON *node = slots[i];
        if (!node) continue;
        char kp[CFG_PATH_CAP];
        path_key(kp, path, k->key);
        switch (k->kind) {
        case SK_INT:
            if (read_int(p, node, kp, k->min, k->max, setting_field(s, k)) != 0) return -1;
            break;
        case SK_DURATION:
            if (read_duration(p, node, kp, k->min, k->max, setting_field(s, k)) != 0) return -1;
            break;
        case SK_ACK:
            if (cJSON_IsString(node) && strcmp(node->valuestring, "explicit") == 0)
                s->ack = FX_ACK_EXPLICIT;
            else if (cJSON_IsString(node) && strcmp(node->valuestring, "none") == 0)
                s->ack = FX_ACK_NONE;
            else
                return fail(p, kp, "must be \"explicit\" or \"none\"");
            break;
        case SK_BACKOFF: {
            if (!cJSON_IsArray(node)) return fail(p, kp, "must be an array of durations");
            size_t n = (size_t)cJSON_GetArraySize(node);
            if (n > FX_CFG_MAX_BACKOFF) return fail(p, kp, "at most %d entries", FX_CFG_MAX_BACKOFF);
            int64_t v[FX_CFG_MAX_BACKOFF];
            size_t i2 = 0;
            for (const cJSON *it = node->child; it; it = it->next, i2++) {
                char ip[CFG_PATH_CAP];
                path_idx(ip, kp, i2);
                if (read_duration(p, it, ip, k->min, k->max, &v[i2]) != 0) return -1;
            }
            memcpy(s->backoff_ms, v, n * sizeof v[0]);
            s->n_backoff = n;
            break;
        }
        }
    }
    return 0;
}

/* ---- Value checks ------------------------------------------------------------------------ */

static bool has_bad_byte(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s == 0x7f) return true;
    return false;
}

/* scheme://host[...]: a known scheme and a valid URL with a host (lease/fx_url.h). */
static bool url_ok(const char *u, size_t len, const char *const *schemes)
{
    if (len > FX_URL_MAX) return false;
    char buf[FX_URL_MAX + 1];
    memcpy(buf, u, len);
    buf[len] = '\0';
    fx_url pu;
    bool ok = fx_url_parse(buf, FX_URL_USERINFO | FX_URL_PATH | FX_URL_QUERY, &pu, NULL, 0) ==
                  FX_URL_OK &&
              fx_url_scheme_is(&pu, schemes);
    fx_url_wipe(&pu);
    explicit_bzero(buf, len);
    return ok;
}

static const char *const k_http_schemes[] = {"http", "https", NULL};
static const char *const k_nats_schemes[] = {"nats", "tls", NULL};

/* Drop trailing '/' after the host ("http://h:2379/" -> "http://h:2379"): the users append
 * their own paths ("/v3/kv/range", "/subsz"). */
static void strip_slashes(char *u)
{
    const char *host = strstr(u, "://");
    size_t min = host ? (size_t)(host - u) + 4 : 1;
    size_t n = strlen(u);
    while (n > min && u[n - 1] == '/') u[--n] = '\0';
}

static int check_http_url(pctx *p, const char *path, char *u)
{
    if (!url_ok(u, strlen(u), k_http_schemes))
        return fail(p, path, "must be an http:// or https:// URL with a host");
    strip_slashes(u);
    return 0;
}

/* nats.url: one URL or a comma-separated list (as natsOptions_SetURL takes it). */
static int check_nats_url(pctx *p, const char *path, const char *u)
{
    const char *s = u;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (!url_ok(s, len, k_nats_schemes))
            return fail(p, path,
                        "must be a nats:// or tls:// URL with a host (several: comma-separated)");
        if (!comma) return 0;
        s = comma + 1;
    }
}

/* host:port, [v6]:port or :port; port 1..65535. */
static int check_listen(pctx *p, const char *path, const char *s)
{
    if (strlen(s) > 255) return fail(p, path, "longer than 255 bytes");
    const char *colon = strrchr(s, ':');
    if (!colon || has_bad_byte(s))
        return fail(p, path, "must be host:port (\"127.0.0.1:8080\", \"[::1]:8080\", \":8080\")");
    if (s[0] == '[' && (colon == s || colon[-1] != ']'))
        return fail(p, path, "must be host:port (\"127.0.0.1:8080\", \"[::1]:8080\", \":8080\")");
    if (s[0] != '[' && memchr(s, ':', (size_t)(colon - s)))
        return fail(p, path, "IPv6 addresses need brackets (\"[::1]:8080\")");
    const char *port = colon + 1;
    char *end = NULL;
    errno = 0;
    long v = (port[0] >= '0' && port[0] <= '9') ? strtol(port, &end, 10) : -1;
    if (v < 0 || errno == ERANGE || !end || *end != '\0' || v < 1 || v > 65535)
        return fail(p, path, "port must be 1..65535");
    return 0;
}

/* bridge/keys.h root rules: '/'-led, no trailing '/', no "//", printable ASCII, 2..128 bytes. */
static int check_root_prefix(pctx *p, const char *path, const char *s)
{
    size_t n = strlen(s);
    bool ok = n >= 2 && n <= CFG_ROOT_MAX && s[0] == '/' && s[n - 1] != '/' && !strstr(s, "//");
    for (size_t i = 0; ok && i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) ok = false;
    if (!ok)
        return fail(p, path,
                    "must start with '/', not end with '/', have no empty segment and be 2..%d "
                    "printable ASCII bytes",
                    CFG_ROOT_MAX);
    return 0;
}

/* Bridge and channel names: a single subject token (they appear in ack subjects and in
 * $FLUXON.API.CHANNEL.INFO.<name>), at most 64 bytes, and no '/' or '\' (they also appear in
 * etcd keys, and '\' is not allowed in a JetStream stream name). */
static int check_name(pctx *p, const char *path, const char *name, bool channel)
{
    size_t n = strlen(name);
    if (n == 0) return fail(p, path, "must not be empty");
    if (n > CFG_NAME_MAX) return fail(p, path, "longer than %d bytes", CFG_NAME_MAX);
    if (!fx_subject_token_valid(name) || strpbrk(name, "/\\"))
        return fail(p, path,
                    "\"%s\" is not a single subject token (no '.', '*', '>', '/', '\\', "
                    "whitespace or control characters)",
                    SHOW(name));
    size_t sl = strlen(DLQ_SUFFIX);
    if (channel && n >= sl && strcmp(name + n - sl, DLQ_SUFFIX) == 0)
        return fail(p, path, "\"%s\": names ending in \"" DLQ_SUFFIX
                             "\" are reserved for dead-letter channels", SHOW(name));
    return 0;
}

/* ---- Sections ---------------------------------------------------------------------------- */

static int read_nats(pctx *p, const cJSON *node, fx_config *c)
{
    enum { URL, MONITOR, ACCOUNT, USER, PASSWORD, TOKEN, CREDS, NKEY, CA, CERT, KEY, INSECURE,
           LEAF, LEAF_PUBACKS, NK };
    static const char *const keys[NK] = {
        [URL] = "url", [MONITOR] = "monitor_url", [ACCOUNT] = "account", [USER] = "user",
        [PASSWORD] = "password", [TOKEN] = "token", [CREDS] = "creds_file",
        [NKEY] = "nkey_seed_file", [CA] = "ca_file", [CERT] = "cert_file", [KEY] = "key_file",
        [INSECURE] = "tls_insecure", [LEAF] = "leaf_url", [LEAF_PUBACKS] = "leaf_pubacks",
    };
    const cJSON *v[NK];
    if (!node) return 0;
    if (walk_object(p, node, "nats", keys, NK, v) != 0) return -1;
    char **opt[NK] = {
        [USER] = &c->nats.user, [PASSWORD] = &c->nats.password, [TOKEN] = &c->nats.token,
        [CREDS] = &c->nats.creds_file, [NKEY] = &c->nats.nkey_seed_file, [CA] = &c->nats.ca_file,
        [CERT] = &c->nats.cert_file, [KEY] = &c->nats.key_file, [LEAF] = &c->nats.leaf_url,
    };
    if (read_nonempty_string(p, v[URL], "nats.url", &c->nats.url) != 0 ||
        read_nonempty_string(p, v[MONITOR], "nats.monitor_url", &c->nats.monitor_url) != 0 ||
        read_nonempty_string(p, v[ACCOUNT], "nats.account", &c->nats.account) != 0 ||
        read_bool(p, v[INSECURE], "nats.tls_insecure", &c->nats.tls_insecure) != 0 ||
        read_bool(p, v[LEAF_PUBACKS], "nats.leaf_pubacks", &c->nats.leaf_pubacks) != 0)
        return -1;
    for (int i = 0; i < NK; i++) {
        if (!opt[i]) continue;
        char kp[CFG_PATH_CAP];
        path_key(kp, "nats", keys[i]);
        if (read_opt_string(p, v[i], kp, opt[i]) != 0) return -1;
    }
    return 0;
}

static int read_etcd(pctx *p, const cJSON *node, fx_config *c)
{
    enum { ENDPOINTS, PREFIX, USERNAME, PASSWORD, CA, CERT, KEY, INSECURE, TRANSPORT, NK };
    static const char *const keys[NK] = {
        [ENDPOINTS] = "endpoints", [PREFIX] = "prefix", [USERNAME] = "username",
        [PASSWORD] = "password", [CA] = "ca_file", [CERT] = "cert_file", [KEY] = "key_file",
        [INSECURE] = "tls_insecure", [TRANSPORT] = "transport",
    };
    const cJSON *v[NK];
    if (!node) return 0;
    if (walk_object(p, node, "etcd", keys, NK, v) != 0) return -1;
    char **opt[NK] = {
        [USERNAME] = &c->etcd.username, [PASSWORD] = &c->etcd.password, [CA] = &c->etcd.ca_file,
        [CERT] = &c->etcd.cert_file, [KEY] = &c->etcd.key_file,
    };
    if (read_string_array(p, v[ENDPOINTS], "etcd.endpoints", CFG_ENDPOINTS_MAX, &c->etcd.endpoints,
                          &c->etcd.n_endpoints) != 0 ||
        read_nonempty_string(p, v[PREFIX], "etcd.prefix", &c->etcd.prefix) != 0 ||
        read_bool(p, v[INSECURE], "etcd.tls_insecure", &c->etcd.tls_insecure) != 0 ||
        read_nonempty_string(p, v[TRANSPORT], "etcd.transport", &c->etcd.transport) != 0)
        return -1;
    for (int i = 0; i < NK; i++) {
        if (!opt[i]) continue;
        char kp[CFG_PATH_CAP];
        path_key(kp, "etcd", keys[i]);
        if (read_opt_string(p, v[i], kp, opt[i]) != 0) return -1;
    }
    return 0;
}

static int read_kv(pctx *p, const cJSON *node, fx_config *c)
{
    enum { BACKEND, ENDPOINTS, URL, FSYNC, TIMEOUT, REPLICAS, NK };
    static const char *const keys[NK] = {[BACKEND] = "backend", [ENDPOINTS] = "endpoints",
                                         [URL] = "url", [FSYNC] = "require_fsync",
                                         [TIMEOUT] = "timeout_ms", [REPLICAS] = "min_replicas"};
    const cJSON *v[NK];
    if (!node) return 0;
    if (walk_object(p, node, "kv", keys, NK, v) != 0) return -1;
    if (read_nonempty_string(p, v[BACKEND], "kv.backend", &c->kv.backend) != 0 ||
        read_string_array(p, v[ENDPOINTS], "kv.endpoints", CFG_ENDPOINTS_MAX, &c->kv.endpoints,
                          &c->kv.n_endpoints) != 0 ||
        read_nonempty_string(p, v[URL], "kv.url", &c->kv.url) != 0 ||
        read_bool(p, v[FSYNC], "kv.require_fsync", &c->kv.require_fsync) != 0 ||
        read_int(p, v[TIMEOUT], "kv.timeout_ms", 100, 60000, &c->kv.timeout_ms) != 0 ||
        read_int(p, v[REPLICAS], "kv.min_replicas", 0, 16 /* FX_KV_REDIS_MAX_REPLICAS */,
                 &c->kv.min_replicas) != 0)
        return -1;
    return 0;
}

static int read_http(pctx *p, const cJSON *node, fx_config *c)
{
    static const char *const keys[] = {"listen"};
    const cJSON *v[1];
    if (!node) return 0;
    if (walk_object(p, node, "http", keys, 1, v) != 0) return -1;
    return read_opt_string(p, v[0], "http.listen", &c->http.listen);
}

/* jetstream: {"api": true|false, "domain": "<single token>"} (jsapi.h) */
static int read_jetstream(pctx *p, const cJSON *node, fx_config *c)
{
    static const char *const keys[] = {"api", "domain"};
    const cJSON *v[2];
    c->jetstream.api = true;
    if (!node) return 0;
    if (walk_object(p, node, "jetstream", keys, 2, v) != 0) return -1;
    if (read_bool(p, v[0], "jetstream.api", &c->jetstream.api) != 0 ||
        read_opt_string(p, v[1], "jetstream.domain", &c->jetstream.domain) != 0)
        return -1;
    const char *dom = c->jetstream.domain;
    if (dom && (strlen(dom) > CFG_NAME_MAX || !fx_subject_token_valid(dom)))
        return fail(p, "jetstream.domain",
                    "\"%s\" is not a single subject token of at most %d bytes (no '.', '*', '>', "
                    "whitespace or control characters)",
                    SHOW(dom), CFG_NAME_MAX);
    return 0;
}

static int read_defaults(pctx *p, const cJSON *node, fx_config *c)
{
    const char *keys[N_SETTINGS];
    const cJSON *v[N_SETTINGS];
    if (!node) return 0;
    for (size_t i = 0; i < N_SETTINGS; i++) keys[i] = k_settings[i].key;
    if (walk_object(p, node, "defaults", keys, N_SETTINGS, v) != 0) return -1;
    return read_settings(p, v, "defaults", &c->defaults);
}

static int read_channel(pctx *p, const cJSON *node, const char *path, fx_config *c,
                        fx_chan_config *ch)
{
    enum { NAME, SUBJECTS, PREFIX, NFIXED };
    const char *keys[NFIXED + N_SETTINGS] = {[NAME] = "name", [SUBJECTS] = "subjects",
                                             [PREFIX] = "deliver_prefix"};
    const cJSON *v[NFIXED + N_SETTINGS];
    for (size_t i = 0; i < N_SETTINGS; i++) keys[NFIXED + i] = k_settings[i].key;
    if (walk_object(p, node, path, keys, NFIXED + N_SETTINGS, v) != 0) return -1;

    char kp[CFG_PATH_CAP];
    path_key(kp, path, "name");
    if (!v[NAME]) return fail(p, kp, "required");
    if (read_string(p, v[NAME], kp, &ch->name) != 0 || check_name(p, kp, ch->name, true) != 0)
        return -1;

    path_key(kp, path, "subjects");
    if (!v[SUBJECTS]) return fail(p, kp, "required");
    if (read_string_array(p, v[SUBJECTS], kp, CFG_SUBJECTS_MAX, &ch->subjects, &ch->n_subjects))
        return -1;
    for (size_t i = 0; i < ch->n_subjects; i++) {
        char ip[CFG_PATH_CAP];
        path_idx(ip, kp, i);
        const char *s = ch->subjects[i];
        if (!fx_subject_valid(s, true))
            return fail(p, ip,
                        "\"%s\" is not a valid subject (tokens separated by '.', no empty token, "
                        "'*' and '>' only as whole tokens, '>' last)",
                        SHOW(s));
        if (s[0] == '$') return fail(p, ip, "\"%s\": subjects starting with '$' are reserved",
                                     SHOW(s));
    }

    path_key(kp, path, "deliver_prefix");
    if (!v[PREFIX]) return fail(p, kp, "required");
    if (read_string(p, v[PREFIX], kp, &ch->deliver_prefix) != 0) return -1;
    const char *dp = ch->deliver_prefix;
    if (strlen(dp) > CFG_PREFIX_MAX) return fail(p, kp, "longer than %d bytes", CFG_PREFIX_MAX);
    if (!fx_subject_valid(dp, false))
        return fail(p, kp, "\"%s\" is not a literal subject (no wildcards, no empty token)",
                    SHOW(dp));
    if (dp[0] == '$') return fail(p, kp, "\"%s\": must not start with '$'", SHOW(dp));

    ch->s = c->defaults;
    if (read_settings(p, v + NFIXED, path, &ch->s) != 0) return -1;
    if (ch->s.retention_ms < ch->s.ttl_seconds * 1000) {
        path_key(kp, path, "retention");
        return fail(p, kp, "%lld ms is shorter than ttl_seconds (%lld s): a channel's data must "
                    "outlive its members' leases", (long long)ch->s.retention_ms,
                    (long long)ch->s.ttl_seconds);
    }
    return 0;
}

/* ---- Cross-field rules ------------------------------------------------------------------- */

/* The delivery subject spaces of a channel: "<prefix>.>" and "<prefix>-dlq.>". The -dlq space
 * is reserved even with ack none, so that switching ack mode never creates a collision. */
static void delivery_space(char *dst, size_t cap, const char *prefix, bool dlq)
{
    snprintf(dst, cap, "%s%s.>", prefix, dlq ? DLQ_SUFFIX : "");
}

/* Would s capture reply inboxes ("_INBOX.<nuid>" and "_INBOX.<nuid>.<n>")? The inbox id is
 * random, so only a subject whose first token is "_INBOX", '*' or '>' and whose second token is
 * free ("*.*", "*.>", ">", "_INBOX.x") can match one; "*.new" cannot in practice. */
static bool captures_inboxes(const char *s)
{
    const char *dot = strchr(s, '.');
    size_t l1 = dot ? (size_t)(dot - s) : strlen(s);
    if (l1 == 1 && s[0] == '>') return true;
    if (l1 == 6 && strncmp(s, "_INBOX", 6) == 0) return true;
    if (l1 == 1 && s[0] == '*' && dot)
        return (dot[1] == '*' || dot[1] == '>') && (dot[2] == '\0' || dot[2] == '.');
    return false;
}

static int check_channels(pctx *p, const fx_config *c)
{
    char pi[CFG_PATH_CAP], pj[CFG_PATH_CAP];
    char si[CFG_PREFIX_MAX + 16], sj[CFG_PREFIX_MAX + 16];
    size_t n = c->n_channels;
    for (size_t j = 0; j < n; j++) {
        const fx_chan_config *b = &c->channels[j];
        for (size_t i = 0; i < j; i++) {
            const fx_chan_config *a = &c->channels[i];
            bprintf(pj, sizeof pj, "channels[%zu].name", j);
            if (strcmp(a->name, b->name) == 0)
                return fail(p, pj, "\"%s\" is also the name of channels[%zu]", SHOW(b->name), i);
            bprintf(pj, sizeof pj, "channels[%zu].deliver_prefix", j);
            if (strcmp(a->deliver_prefix, b->deliver_prefix) == 0)
                return fail(p, pj, "\"%s\" is also the deliver_prefix of channels[%zu] (\"%s\")",
                            SHOW(b->deliver_prefix), i, SHOW(a->name));
            for (int da = 0; da < 2; da++) {
                for (int db = 0; db < 2; db++) {
                    delivery_space(si, sizeof si, a->deliver_prefix, da);
                    delivery_space(sj, sizeof sj, b->deliver_prefix, db);
                    if (fx_subject_overlap(si, sj))
                        return fail(p, pj,
                                    "delivery subjects \"%s\" overlap \"%s\" of channels[%zu] "
                                    "(\"%s\")",
                                    SHOW(sj), SHOW(si), i, SHOW(a->name));
                }
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        const fx_chan_config *a = &c->channels[i];
        for (size_t k = 0; k < a->n_subjects; k++) {
            const char *s = a->subjects[k];
            bprintf(pi, sizeof pi, "channels[%zu].subjects[%zu]", i, k);
            if (captures_inboxes(s))
                return fail(p, pi, "\"%s\" would capture request replies (\"_INBOX.<id>\")",
                            SHOW(s));
            /* Capture vs capture: across channels a publish would land in two channels; within
             * one channel it would be captured twice (one queue subscription per subject). */
            for (size_t j = 0; j <= i; j++) {
                const fx_chan_config *b = &c->channels[j];
                size_t kmax = (j == i) ? k : b->n_subjects;
                for (size_t l = 0; l < kmax; l++) {
                    if (fx_subject_overlap(s, b->subjects[l])) {
                        bprintf(pj, sizeof pj, "channels[%zu].subjects[%zu]", j, l);
                        return fail(p, pi, "\"%s\" overlaps %s (\"%s\")", SHOW(s), pj,
                                    SHOW(b->subjects[l]));
                    }
                }
            }
            /* Capture vs any delivery space (a delivery must never be captured again). */
            for (size_t j = 0; j < n; j++) {
                for (int d = 0; d < 2; d++) {
                    delivery_space(sj, sizeof sj, c->channels[j].deliver_prefix, d);
                    if (fx_subject_overlap(s, sj))
                        return fail(p, pi,
                                    "\"%s\" overlaps the delivery subjects \"%s\" of channels[%zu] "
                                    "(\"%s\")",
                                    SHOW(s), SHOW(sj), j, SHOW(c->channels[j].name));
                }
            }
        }
    }
    return 0;
}

static char *concat(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

/* Append "<name>-dlq" for every configured channel with ack explicit (channels has room). */
static int add_dlq_channels(pctx *p, fx_config *c)
{
    size_t n = c->n_channels;
    for (size_t i = 0; i < n; i++) {
        const fx_chan_config *src = &c->channels[i];
        if (src->s.ack != FX_ACK_EXPLICIT) continue;
        fx_chan_config *d = &c->channels[c->n_channels];
        memset(d, 0, sizeof *d);
        c->n_channels++; /* counted before filling, so fx_config_free sees partial entries */
        d->name = concat(src->name, DLQ_SUFFIX);
        d->deliver_prefix = concat(src->deliver_prefix, DLQ_SUFFIX);
        if (!d->name || !d->deliver_prefix) return fail(p, "channels", "out of memory");
        d->s = src->s;
        d->is_dlq = true;
    }
    return 0;
}

static int read_channels(pctx *p, const cJSON *node, fx_config *c)
{
    if (!node) return fail(p, "channels", "at least one channel is required");
    if (!cJSON_IsArray(node)) return fail(p, "channels", "must be an array of objects");
    size_t n = (size_t)cJSON_GetArraySize(node);
    if (n == 0) return fail(p, "channels", "at least one channel is required");
    if (n > CFG_CHANNELS_MAX) return fail(p, "channels", "at most %d channels", CFG_CHANNELS_MAX);
    c->channels = calloc(2 * n, sizeof *c->channels); /* room for the DLQ channels */
    if (!c->channels) return fail(p, "channels", "out of memory");
    size_t i = 0, total = 0;
    for (const cJSON *it = node->child; it; it = it->next, i++) {
        char cp[CFG_PATH_CAP];
        path_idx(cp, "channels", i);
        c->n_channels++;
        if (read_channel(p, it, cp, c, &c->channels[i]) != 0) return -1;
        total += c->channels[i].n_subjects;
        if (total > CFG_SUBJECTS_ALL) {
            char sp[CFG_PATH_CAP];
            path_key(sp, cp, "subjects");
            return fail(p, sp, "more than %d capture subjects in all channels", CFG_SUBJECTS_ALL);
        }
    }
    if (check_channels(p, c) != 0) return -1;
    /* The dedup windows of all channels share etcd's quota with everything else: together at
     * most FX_CFG_DEDUP_BYTES_ALL. A channel without duplicate_max_bytes gets an equal share of
     * what the others leave, at most FX_CFG_DEDUP_BYTES_AUTO_MAX. */
    int64_t dd_bytes = 0, n_auto = 0;
    for (size_t k = 0; k < c->n_channels; k++) {
        const fx_chan_settings *cs = &c->channels[k].s;
        if (cs->duplicate_window_ms <= 0) continue;
        if (cs->duplicate_max_bytes) dd_bytes += cs->duplicate_max_bytes;
        else n_auto++;
    }
    int64_t share = n_auto ? (FX_CFG_DEDUP_BYTES_ALL - dd_bytes) / n_auto : 0;
    if (share > FX_CFG_DEDUP_BYTES_AUTO_MAX) share = FX_CFG_DEDUP_BYTES_AUTO_MAX;
    if (dd_bytes > FX_CFG_DEDUP_BYTES_ALL || (n_auto && share < (1LL << 20)))
        return fail(p, "channels",
                    "duplicate_max_bytes of all channels with a duplicate_window add up to "
                    "%lld MiB%s: at most %lld MiB per bridge (a quarter of etcd's default 2 GiB "
                    "quota)",
                    (long long)(dd_bytes >> 20),
                    n_auto ? " (and 1 MiB for each channel without it)" : "",
                    (long long)(FX_CFG_DEDUP_BYTES_ALL >> 20));
    for (size_t k = 0; k < c->n_channels; k++)
        if (!c->channels[k].s.duplicate_max_bytes)
            c->channels[k].s.duplicate_max_bytes = share ? share : FX_CFG_DEDUP_BYTES_AUTO_MAX;
    return add_dlq_channels(p, c);
}

/* "<hostname>-<pid>", at most 64 bytes, bytes outside [A-Za-z0-9_-] replaced by '_'. */
static char *default_name(void)
{
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') strcpy(host, "fluxon");
    host[sizeof host - 1] = '\0';
    char pid[32];
    int pl = snprintf(pid, sizeof pid, "-%ld", (long)getpid());
    size_t hmax = CFG_NAME_MAX - (size_t)pl;
    if (strlen(host) > hmax) host[hmax] = '\0';
    char *s = concat(host, pid);
    if (!s) return NULL;
    for (char *q = s; *q; q++) {
        char ch = *q;
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                  ch == '_' || ch == '-';
        if (!ok) *q = '_';
    }
    return s;
}

static char **strv_dup(const char *const *v, size_t n)
{
    char **d = calloc(n, sizeof *d);
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (!(d[i] = strdup(v[i]))) {
            free_strv(d, n);
            return NULL;
        }
    }
    return d;
}

/* Fill what the file left out. Only for fields still NULL. */
static int apply_defaults(pctx *p, fx_config *c)
{
    struct { char **dst; const char *def; } strs[] = {
        {&c->nats.url, DEF_NATS_URL},       {&c->nats.monitor_url, DEF_MONITOR_URL},
        {&c->nats.account, DEF_ACCOUNT},    {&c->etcd.prefix, DEF_ETCD_PREFIX},
        {&c->kv.backend, DEF_KV_BACKEND},
        {&c->etcd.transport, DEF_ETCD_TRANSPORT},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!*strs[i].dst && !(*strs[i].dst = strdup(strs[i].def))) return fail(p, "", "out of memory");
    if (!c->name && !(c->name = default_name())) return fail(p, "", "out of memory");
    if (!c->etcd.endpoints) {
        static const char *const def_ep[] = {DEF_ETCD_ENDPOINT};
        if (!(c->etcd.endpoints = strv_dup(def_ep, 1))) return fail(p, "", "out of memory");
        c->etcd.n_endpoints = 1;
    }
    if (!c->kv.timeout_ms) c->kv.timeout_ms = 5000;
    if (!c->kv.endpoints && strcmp(c->kv.backend, "redis") != 0) {
        if (!(c->kv.endpoints = strv_dup((const char *const *)c->etcd.endpoints, c->etcd.n_endpoints)))
            return fail(p, "", "out of memory");
        c->kv.n_endpoints = c->etcd.n_endpoints;
    }
    return 0;
}

/* Rules on the non-channel sections, after defaults are in place. */
static int check_sections(pctx *p, fx_config *c)
{
    if (check_name(p, "name", c->name, false) != 0) return -1;
    if (check_nats_url(p, "nats.url", c->nats.url) != 0) return -1;
    if (check_http_url(p, "nats.monitor_url", c->nats.monitor_url) != 0) return -1;
    if (c->nats.leaf_url) {
        fx_leaf_url lu;
        char why[160];
        int rc = fx_leaf_url_parse(c->nats.leaf_url, &lu, why, sizeof why);
        explicit_bzero(lu.user, sizeof lu.user);
        explicit_bzero(lu.pass, sizeof lu.pass);
        if (rc != 0) return fail(p, "nats.leaf_url", "%s", why);
    }
    if (has_bad_byte(c->nats.account) || strlen(c->nats.account) > CFG_NAME_MAX * 2)
        return fail(p, "nats.account", "must be a name without whitespace, at most %d bytes",
                    CFG_NAME_MAX * 2);
    int auth = !!c->nats.user + !!c->nats.token + !!c->nats.creds_file + !!c->nats.nkey_seed_file;
    if (auth > 1)
        return fail(p, "nats", "set only one of user, token, creds_file, nkey_seed_file");
    if (c->nats.password && !c->nats.user) return fail(p, "nats.password", "requires nats.user");
    if (!!c->nats.cert_file != !!c->nats.key_file)
        return fail(p, c->nats.cert_file ? "nats.key_file" : "nats.cert_file",
                    "cert_file and key_file go together");
    for (size_t i = 0; i < c->etcd.n_endpoints; i++) {
        char ip[CFG_PATH_CAP];
        path_idx(ip, "etcd.endpoints", i);
        if (check_http_url(p, ip, c->etcd.endpoints[i]) != 0) return -1;
    }
    if (check_root_prefix(p, "etcd.prefix", c->etcd.prefix) != 0) return -1;
    if (!!c->etcd.username != !!c->etcd.password)
        return fail(p, c->etcd.username ? "etcd.password" : "etcd.username",
                    "username and password go together");
    if (!!c->etcd.cert_file != !!c->etcd.key_file)
        return fail(p, c->etcd.cert_file ? "etcd.key_file" : "etcd.cert_file",
                    "cert_file and key_file go together");
    if (strcmp(c->etcd.transport, "grpc") != 0 && strcmp(c->etcd.transport, "json") != 0)
        return fail(p, "etcd.transport", "\"%s\" is not supported (\"grpc\" or \"json\")",
                    SHOW(c->etcd.transport));
    bool redis = strcmp(c->kv.backend, "redis") == 0;
    if (!redis && strcmp(c->kv.backend, "etcd") != 0)
        return fail(p, "kv.backend", "\"%s\" is not supported (\"etcd\" or \"redis\")",
                    SHOW(c->kv.backend));
    if (redis && !c->kv.url) return fail(p, "kv.url", "required with kv.backend \"redis\"");
    if (redis && c->kv.endpoints) return fail(p, "kv.endpoints", "only with kv.backend \"etcd\"");
    if (!redis && (c->kv.url || c->kv.require_fsync || c->kv.min_replicas))
        return fail(p, c->kv.url ? "kv.url" : c->kv.require_fsync ? "kv.require_fsync" : "kv.min_replicas",
                    "only with kv.backend \"redis\"");
    if (c->kv.url) {
        static const char *const redis_schemes[] = {"redis", "unix", NULL};
        fx_url u;
        char why[160];
        fx_url_status st = fx_url_parse(c->kv.url, FX_URL_USERINFO | FX_URL_PATH | FX_URL_QUERY,
                                        &u, why, sizeof why);
        bool scheme_ok =
            st != FX_URL_ESCHEME && (st != FX_URL_OK || fx_url_scheme_is(&u, redis_schemes));
        fx_url_wipe(&u);
        if (!scheme_ok)
            return fail(p, "kv.url", "must start with redis:// or unix: (rediss:// is not "
                                     "supported: Debian 12's hiredis has no TLS)");
        if (st != FX_URL_OK) return fail(p, "kv.url", "%s", why);
    }
    for (size_t i = 0; i < c->kv.n_endpoints; i++) {
        char ip[CFG_PATH_CAP];
        path_idx(ip, "kv.endpoints", i);
        if (check_http_url(p, ip, c->kv.endpoints[i]) != 0) return -1;
    }
    if (c->http.listen && check_listen(p, "http.listen", c->http.listen) != 0) return -1;
    return 0;
}

static int build(pctx *p, const cJSON *root, fx_config *c)
{
    enum { NAME, NATS, ETCD, KV, HTTP, JETSTREAM, DEFAULTS, CHANNELS, NK };
    static const char *const keys[NK] = {
        [NAME] = "name", [NATS] = "nats", [ETCD] = "etcd", [KV] = "kv", [HTTP] = "http",
        [JETSTREAM] = "jetstream", [DEFAULTS] = "defaults", [CHANNELS] = "channels",
    };
    const cJSON *v[NK];
    if (walk_object(p, root, "", keys, NK, v) != 0) return -1;
    c->defaults = k_default_settings;
    if (read_string(p, v[NAME], "name", &c->name) != 0 || read_nats(p, v[NATS], c) != 0 ||
        read_etcd(p, v[ETCD], c) != 0 || read_kv(p, v[KV], c) != 0 ||
        read_http(p, v[HTTP], c) != 0 || read_jetstream(p, v[JETSTREAM], c) != 0 ||
        read_defaults(p, v[DEFAULTS], c) != 0 ||
        apply_defaults(p, c) != 0 || check_sections(p, c) != 0 ||
        read_channels(p, v[CHANNELS], c) != 0)
        return -1;
    return 0;
}

/* ---- Entry points ------------------------------------------------------------------------ */

static void line_col(const char *s, size_t pos, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* Offset of a "\u0000" escape inside a JSON string, or len. cJSON ends the C string there, so a
 * name or subject holding one would be silently truncated ("or\u0000ders" -> "or"); no setting
 * may contain NUL. Other control characters reach the field checks (names, subjects, URLs
 * refuse them). */
static size_t find_nul_escape(const char *s, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) {
            in_str = s[i] == '"';
        } else if (s[i] == '"') {
            in_str = false;
        } else if (s[i] == '\\') {
            if (len - i >= 6 && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0) return i;
            i++; /* the escaped character */
        }
    }
    return len;
}

int fx_config_parse(const char *json, size_t len, fx_config *out, char *err, size_t errlen)
{
    pctx p = {err, errlen};
    if (err && errlen) err[0] = '\0';
    if (!json || !out) return fail(&p, "", "invalid argument");
    if (len > CFG_FILE_MAX) return fail(&p, "", "configuration larger than %d bytes", CFG_FILE_MAX);
    const char *nul = memchr(json, '\0', len);
    if (nul) {
        size_t line, col;
        line_col(json, (size_t)(nul - json), &line, &col);
        return fail(&p, "", "invalid JSON at line %zu, column %zu: NUL byte", line, col);
    }
    size_t esc = find_nul_escape(json, len);
    if (esc < len) {
        size_t line, col;
        line_col(json, esc, &line, &col);
        return fail(&p, "", "line %zu, column %zu: \\u0000 (NUL) in a string: control characters "
                            "are not allowed", line, col);
    }
    /* cJSON wants a terminated buffer; the caller's need not be. */
    char *copy = malloc(len + 1);
    if (!copy) return fail(&p, "", "out of memory");
    memcpy(copy, json, len);
    copy[len] = '\0';

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(copy, &end, 1);
    int rc = 0;
    if (!root) {
        size_t pos = (end && end >= copy && end <= copy + len) ? (size_t)(end - copy) : len;
        size_t line, col;
        line_col(copy, pos, &line, &col);
        rc = fail(&p, "", "invalid JSON at line %zu, column %zu", line, col);
    } else {
        fx_config c;
        memset(&c, 0, sizeof c);
        rc = build(&p, root, &c);
        if (rc == 0) *out = c;
        else fx_config_free(&c);
        wipe_json(root);
        cJSON_Delete(root);
    }
    explicit_bzero(copy, len);
    free(copy);
    return rc;
}

int fx_config_load_file(const char *path, fx_config *out, char *err, size_t errlen)
{
    pctx p = {err, errlen};
    if (err && errlen) err[0] = '\0';
    if (!path || !out) return fail(&p, "", "invalid argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        char eb[128];
        return fail(&p, path, "cannot open: %s", strerror_r(errno, eb, sizeof eb));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) memset(&st, 0, sizeof st); /* then just read, bounded below */
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return fail(&p, path, "is a directory");
    }
    if (S_ISREG(st.st_mode) && st.st_size > CFG_FILE_MAX) {
        close(fd);
        return fail(&p, path, "larger than %d bytes", CFG_FILE_MAX);
    }
    size_t cap = CFG_FILE_MAX + 1, n = 0; /* read one byte more to detect an oversized stream */
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return fail(&p, path, "out of memory");
    }
    while (n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            char eb[128];
            int e = errno;
            close(fd);
            explicit_bzero(buf, n);
            free(buf);
            return fail(&p, path, "read failed: %s", strerror_r(e, eb, sizeof eb));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    int rc;
    if (n > CFG_FILE_MAX) {
        rc = fail(&p, path, "larger than %d bytes", CFG_FILE_MAX);
    } else {
        char inner[512];
        rc = fx_config_parse(buf, n, out, inner, sizeof inner);
        if (rc != 0) fail(&p, path, "%s", inner);
    }
    explicit_bzero(buf, n);
    free(buf);
    return rc;
}

const fx_chan_config *fx_config_channel(const fx_config *c, const char *name)
{
    if (!c || !name) return NULL;
    for (size_t i = 0; i < c->n_channels; i++)
        if (c->channels[i].name && strcmp(c->channels[i].name, name) == 0) return &c->channels[i];
    return NULL;
}
