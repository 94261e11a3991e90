/* fx_url.c -- the one URL parser (see fx_url.h): curl_url underneath, bounded parts, errors that
 * never quote the URL. */
#include "fx_url.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fx_url_status uerr(fx_url *u, fx_url_status st, char *err, size_t errlen, const char *msg)
{
    if (u) fx_url_wipe(u);
    if (err && errlen) snprintf(err, errlen, "%s", msg);
    return st;
}

void fx_url_wipe(fx_url *u)
{
    if (!u) return;
    volatile unsigned char *p = (volatile unsigned char *)u;
    for (size_t i = 0; i < sizeof *u; i++) p[i] = 0;
}

bool fx_url_scheme_is(const fx_url *u, const char *const *schemes)
{
    for (; schemes && *schemes; schemes++)
        if (strcmp(u->scheme, *schemes) == 0) return true;
    return false;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode s into dst (cap with the NUL): false on a bad escape, a NUL, or no room. */
static bool pct_decode(const char *s, char *dst, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        if (c == '%') {
            int h = s[i + 1] ? hexval(s[i + 1]) : -1;
            int l = h >= 0 && s[i + 2] ? hexval(s[i + 2]) : -1;
            if (h < 0 || l < 0) return false;
            c = (char)(h * 16 + l);
            if (c == '\0') return false;
            i += 2;
        }
        if (j + 1 >= cap) return false;
        dst[j++] = c;
    }
    dst[j] = '\0';
    return true;
}

static bool copy_bounded(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap) return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

static fx_url_status parse_unix(const char *rest, unsigned flags, fx_url *u, char *err, size_t errlen)
{
    if (strncmp(rest, "//", 2) == 0) rest += 2;
    if (strchr(rest, '#')) return uerr(u, FX_URL_EFRAGMENT, err, errlen, "must not have a fragment (#)");
    const char *q = strchr(rest, '?');
    size_t n = q ? (size_t)(q - rest) : strlen(rest);
    if (n == 0 || rest[0] != '/') return uerr(u, FX_URL_EPATH, err, errlen, "unix: needs an absolute path");
    if (!copy_bounded(u->path, sizeof u->path, rest, n))
        return uerr(u, FX_URL_EPATH, err, errlen, "path too long");
    if (q) {
        if (!(flags & FX_URL_QUERY)) return uerr(u, FX_URL_EQUERY, err, errlen, "must not have a query");
        if (!copy_bounded(u->query, sizeof u->query, q + 1, strlen(q + 1)))
            return uerr(u, FX_URL_EQUERY, err, errlen, "query too long");
        u->has_query = true;
    }
    return FX_URL_OK;
}

static fx_url_status map_curl(CURLUcode rc, fx_url *u, char *err, size_t errlen)
{
    switch (rc) {
    case CURLUE_BAD_PORT_NUMBER: return uerr(u, FX_URL_EPORT, err, errlen, "port must be 1..65535");
    case CURLUE_NO_HOST:
    case CURLUE_BAD_HOSTNAME:
    case CURLUE_BAD_IPV6:
        return uerr(u, FX_URL_EHOST, err, errlen, "needs a host (IPv6 in brackets)");
    case CURLUE_BAD_LOGIN:
    case CURLUE_BAD_USER:
        return uerr(u, FX_URL_EUSER, err, errlen, "invalid user name");
    case CURLUE_BAD_PASSWORD: return uerr(u, FX_URL_EPASSWORD, err, errlen, "invalid password");
    case CURLUE_BAD_PATH: return uerr(u, FX_URL_EPATH, err, errlen, "bad path");
    case CURLUE_BAD_QUERY: return uerr(u, FX_URL_EQUERY, err, errlen, "bad query");
    case CURLUE_BAD_FRAGMENT: return uerr(u, FX_URL_EFRAGMENT, err, errlen, "must not have a fragment (#)");
    case CURLUE_BAD_SCHEME: return uerr(u, FX_URL_ESCHEME, err, errlen, "must start with scheme://");
    case CURLUE_OUT_OF_MEMORY: return uerr(u, FX_URL_ENOMEM, err, errlen, "out of memory");
    default: return uerr(u, FX_URL_EMALFORMED, err, errlen, "malformed URL");
    }
}

/* The parts of an accepted URL, read back from the curl handle. */
static fx_url_status read_parts(CURLU *h, unsigned flags, fx_url *u, char *err, size_t errlen)
{
    char *s = NULL;
    fx_url_status st = FX_URL_OK;
    CURLUcode rc = curl_url_get(h, CURLUPART_USER, &s, 0);
    if (rc == CURLUE_OK) {
        u->has_user = true;
        bool ok = pct_decode(s, u->user, sizeof u->user);
        curl_free(s);
        if (!ok) return uerr(u, FX_URL_EUSER, err, errlen, "invalid user name (bad %-escape or too long)");
    } else if (rc != CURLUE_NO_USER) {
        return map_curl(rc, u, err, errlen);
    }
    s = NULL;
    rc = curl_url_get(h, CURLUPART_PASSWORD, &s, 0);
    if (rc == CURLUE_OK) {
        u->has_user = u->has_password = true;
        bool ok = pct_decode(s, u->password, sizeof u->password);
        curl_free(s);
        if (!ok) return uerr(u, FX_URL_EPASSWORD, err, errlen, "invalid password (bad %-escape or too long)");
    } else if (rc != CURLUE_NO_PASSWORD) {
        return map_curl(rc, u, err, errlen);
    }
    if (u->has_user && !(flags & FX_URL_USERINFO))
        return uerr(u, FX_URL_EUSER, err, errlen, "must not hold credentials (user@)");

    s = NULL;
    if ((rc = curl_url_get(h, CURLUPART_HOST, &s, 0)) != CURLUE_OK) return map_curl(rc, u, err, errlen);
    size_t hl = strlen(s);
    const char *hp = s;
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        hp = s + 1;
        hl -= 2;
    }
    bool ok = hl > 0 && copy_bounded(u->host, sizeof u->host, hp, hl);
    curl_free(s);
    if (!ok) return uerr(u, FX_URL_EHOST, err, errlen, "needs a host (IPv6 in brackets), at most 255 bytes");

    s = NULL;
    rc = curl_url_get(h, CURLUPART_PORT, &s, 0);
    if (rc == CURLUE_OK) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        ok = end && *end == '\0' && v >= 1 && v <= 65535;
        curl_free(s);
        if (!ok) return uerr(u, FX_URL_EPORT, err, errlen, "port must be 1..65535");
        u->port = (int)v;
    } else if (rc != CURLUE_NO_PORT) {
        return map_curl(rc, u, err, errlen);
    }

    s = NULL;
    if ((rc = curl_url_get(h, CURLUPART_PATH, &s, CURLU_URLDECODE)) != CURLUE_OK)
        return rc == CURLUE_URLDECODE ? uerr(u, FX_URL_EPATH, err, errlen, "bad path")
                                      : map_curl(rc, u, err, errlen);
    const char *path = strcmp(s, "/") == 0 ? "" : s;
    if (*path && !(flags & FX_URL_PATH)) st = FX_URL_EPATH;
    else if (!copy_bounded(u->path, sizeof u->path, path, strlen(path))) st = FX_URL_ENOMEM;
    curl_free(s);
    if (st == FX_URL_EPATH) return uerr(u, st, err, errlen, "must not have a path");
    if (st) return uerr(u, FX_URL_EPATH, err, errlen, "path too long");

    s = NULL;
    rc = curl_url_get(h, CURLUPART_QUERY, &s, 0);
    if (rc == CURLUE_OK) {
        u->has_query = true;
        if (!(flags & FX_URL_QUERY)) st = FX_URL_EQUERY;
        else if (!copy_bounded(u->query, sizeof u->query, s, strlen(s))) st = FX_URL_ENOMEM;
        curl_free(s);
        if (st == FX_URL_EQUERY) return uerr(u, st, err, errlen, "must not have a query");
        if (st) return uerr(u, FX_URL_EQUERY, err, errlen, "query too long");
    } else if (rc != CURLUE_NO_QUERY) {
        return map_curl(rc, u, err, errlen);
    }
    s = NULL;
    rc = curl_url_get(h, CURLUPART_FRAGMENT, &s, 0);
    if (rc == CURLUE_OK) {
        curl_free(s);
        return uerr(u, FX_URL_EFRAGMENT, err, errlen, "must not have a fragment (#)");
    }
    return FX_URL_OK;
}

/* Copy url[0..len) into out (room for len + 2 per '@' + 1) with each '@' of the authority
 * before last_at written %40: the form curl and cnats read (they end the userinfo at the first
 * '@'). Returns the length written. */
static size_t escape_early_ats(const char *url, size_t len, const char *auth, const char *last_at,
                               char *out)
{
    size_t j = 0;
    for (size_t i = 0; i < len; i++) {
        if (last_at && url[i] == '@' && url + i >= auth && url + i < last_at) {
            memcpy(out + j, "%40", 3);
            j += 3;
        } else {
            out[j++] = url[i];
        }
    }
    out[j] = '\0';
    return j;
}

/* The authority of url (after "scheme://", up to '/', '?' or '#') and its last '@'. */
static const char *authority(const char *url, size_t *al, const char **last_at, size_t *n_at)
{
    const char *sep = strstr(url, "://");
    const char *auth = sep ? sep + 3 : url;
    *al = strcspn(auth, "/?#");
    *last_at = NULL;
    *n_at = 0;
    for (size_t i = 0; i < *al; i++)
        if (auth[i] == '@') {
            *last_at = auth + i;
            (*n_at)++;
        }
    return auth;
}

fx_url_status fx_url_normalize(const char *url, char *out, size_t cap)
{
    if (!out || !cap) return FX_URL_EMISSING;
    out[0] = '\0';
    if (!url || !*url) return FX_URL_EMISSING;
    size_t len = strnlen(url, FX_URL_MAX + 1);
    if (len > FX_URL_MAX) return FX_URL_ELONG;
    size_t al, n_at;
    const char *last_at;
    const char *auth = authority(url, &al, &last_at, &n_at);
    if (len + 2 * n_at + 1 > cap) return FX_URL_ELONG;
    escape_early_ats(url, len, auth, last_at, out);
    return FX_URL_OK;
}

fx_url_status fx_url_parse(const char *url, unsigned flags, fx_url *out, char *err, size_t errlen)
{
    if (!out) return uerr(NULL, FX_URL_EMISSING, err, errlen, "missing URL");
    memset(out, 0, sizeof *out);
    if (!url || !*url) return uerr(out, FX_URL_EMISSING, err, errlen, "missing URL");
    size_t len = strnlen(url, FX_URL_MAX + 1);
    if (len > FX_URL_MAX) return uerr(out, FX_URL_ELONG, err, errlen, "longer than 4096 bytes");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] == 0x7f)
            return uerr(out, FX_URL_ESPACE, err, errlen,
                        "must not contain whitespace or control characters");
    if (strchr(url, ',')) return uerr(out, FX_URL_ELIST, err, errlen, "one URL only (no comma-separated list)");

    /* scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":" */
    size_t sl = 0;
    while (sl < len && url[sl] != ':') {
        char c = url[sl];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (sl > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'));
        if (!ok) break;
        sl++;
    }
    if (sl == 0 || sl >= sizeof out->scheme || sl >= len || url[sl] != ':')
        return uerr(out, FX_URL_ESCHEME, err, errlen, "must start with scheme://");
    for (size_t i = 0; i < sl; i++)
        out->scheme[i] = (char)(url[i] >= 'A' && url[i] <= 'Z' ? url[i] - 'A' + 'a' : url[i]);
    if (strcmp(out->scheme, "unix") == 0) return parse_unix(url + sl + 1, flags, out, err, errlen);
    if (strncmp(url + sl, "://", 3) != 0)
        return uerr(out, FX_URL_ESCHEME, err, errlen, "must start with scheme://");

    /* The authority: the userinfo ends at its last '@'; an earlier '@' goes to curl as %40. */
    const char *auth = url + sl + 3;
    size_t al = strcspn(auth, "/?#");
    const char *last_at = NULL;
    size_t n_at = 0;
    for (size_t i = 0; i < al; i++)
        if (auth[i] == '@') {
            last_at = auth + i;
            n_at++;
        }
    const char *hostport = last_at ? last_at + 1 : auth;
    size_t hpl = (size_t)(auth + al - hostport);
    if (hpl == 0) return uerr(out, FX_URL_EHOST, err, errlen, "needs a host (IPv6 in brackets)");
    if (hostport[0] != '[' && memchr(hostport, ':', hpl) &&
        memchr(hostport, ':', hpl) != memrchr(hostport, ':', hpl)) /* "::1:7422" */
        return uerr(out, FX_URL_EHOST, err, errlen, "needs a host (IPv6 in brackets)");
    if (hostport[hpl - 1] == ':') return uerr(out, FX_URL_EPORT, err, errlen, "port must be 1..65535");
    char *norm = malloc(len + 2 * n_at + 1);
    if (!norm) return uerr(out, FX_URL_ENOMEM, err, errlen, "out of memory");
    size_t j = escape_early_ats(url, len, auth, last_at, norm);

    fx_url_status st;
    CURLU *h = curl_url();
    if (!h) {
        st = uerr(out, FX_URL_ENOMEM, err, errlen, "out of memory");
    } else {
        CURLUcode rc = curl_url_set(h, CURLUPART_URL, norm, CURLU_NON_SUPPORT_SCHEME);
        st = rc == CURLUE_OK ? read_parts(h, flags, out, err, errlen) : map_curl(rc, out, err, errlen);
        curl_url_cleanup(h);
    }
    /* norm may hold a password */
    volatile char *vp = norm;
    for (size_t i = 0; i < j; i++) vp[i] = 0;
    free(norm);
    return st;
}

/* ---- redaction and credentials apart from the URL ------------------------------------------- */

/* Length of "scheme://" at s (0 when s does not start with one). */
static size_t scheme_prefix(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                     (i > 0 && ((s[i] >= '0' && s[i] <= '9') || s[i] == '+' || s[i] == '-' ||
                                s[i] == '.'))))
        i++;
    return i > 0 && i + 3 <= n && memcmp(s + i, "://", 3) == 0 ? i + 3 : 0;
}

/* End of the element that starts at s (a ',' followed by "scheme://", or the end). */
static size_t element_len(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (s[i] == ',' && scheme_prefix(s + i + 1, n - i - 1)) return i;
    return n;
}

static void put_bytes(char *out, size_t cap, size_t *j, const char *s, size_t n)
{
    for (size_t i = 0; i < n && *j + 1 < cap; i++) out[(*j)++] = s[i];
}

void fx_url_redact(const char *url, char *out, size_t cap)
{
    if (!out || !cap) return;
    if (!url) {
        snprintf(out, cap, "-");
        return;
    }
    size_t j = 0;
    const char *s = url;
    for (;;) {
        size_t n = element_len(s);
        size_t sp = scheme_prefix(s, n);
        const char *at = NULL;
        for (size_t i = sp; i < n; i++)
            if (s[i] == '@') at = s + i;
        if (at) {
            put_bytes(out, cap, &j, s, sp);
            put_bytes(out, cap, &j, "***", 3);
            put_bytes(out, cap, &j, at, (size_t)(s + n - at));
        } else {
            put_bytes(out, cap, &j, s, n);
        }
        if (!s[n]) break;
        put_bytes(out, cap, &j, ",", 1);
        s += n + 1;
    }
    out[j] = '\0';
}

fx_url_status fx_url_split_userinfo(const char *url, char *out, size_t cap, fx_url *cred,
                                    char *err, size_t errlen)
{
    if (!out || !cap || !cred) return uerr(cred, FX_URL_EMISSING, err, errlen, "missing URL");
    memset(cred, 0, sizeof *cred);
    out[0] = '\0';
    if (!url || !*url) return uerr(cred, FX_URL_EMISSING, err, errlen, "missing URL");
    size_t total = strnlen(url, FX_URL_MAX + 1);
    if (total > FX_URL_MAX) return uerr(cred, FX_URL_ELONG, err, errlen, "longer than 4096 bytes");
    fx_url_status st = FX_URL_OK;
    size_t j = 0;
    char el[FX_URL_MAX + 8];
    const char *s = url;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        size_t sp = scheme_prefix(s, n);
        /* cnats reads "host:port" as nats://host:port */
        size_t pre = sp ? 0 : 7;
        memcpy(el, "nats://", pre);
        memcpy(el + pre, s, n);
        el[pre + n] = '\0';
        fx_url u;
        st = fx_url_parse(el, FX_URL_USERINFO | FX_URL_PATH | FX_URL_QUERY, &u, err, errlen);
        if (st == FX_URL_OK) {
            /* the userinfo is what the parser took: up to the last '@' of the authority */
            const char *auth = s + sp;
            size_t al = strcspn(auth, "/?#");
            if (al > (size_t)(s + n - auth)) al = (size_t)(s + n - auth);
            const char *rest = auth;
            for (size_t i = 0; i < al; i++)
                if (auth[i] == '@') rest = auth + i + 1;
            if (j + (size_t)(auth - s) + (size_t)(s + n - rest) + 2 > cap) {
                st = uerr(&u, FX_URL_ELONG, err, errlen, "too long");
            } else {
                memcpy(out + j, s, (size_t)(auth - s));
                j += (size_t)(auth - s);
                memcpy(out + j, rest, (size_t)(s + n - rest));
                j += (size_t)(s + n - rest);
                if (comma) out[j++] = ',';
                out[j] = '\0';
                if (u.has_user && !cred->has_user) {
                    cred->has_user = true;
                    cred->has_password = u.has_password;
                    memcpy(cred->user, u.user, sizeof cred->user);
                    memcpy(cred->password, u.password, sizeof cred->password);
                }
            }
            fx_url_wipe(&u);
        }
        volatile char *ve = el;
        for (size_t i = 0; i < pre + n; i++) ve[i] = 0;
        if (st != FX_URL_OK || !comma) break;
        s = comma + 1;
    }
    if (st != FX_URL_OK) {
        fx_url_wipe(cred);
        volatile char *vo = out;
        for (size_t i = 0; i < cap; i++) vo[i] = 0;
    }
    return st;
}
