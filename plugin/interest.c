/* interest.c -- literal-subject interest from nats-server's /subsz monitoring endpoint (see
 * interest.h; the /subsz shapes are those of nats-server 2.9).
 *
 * Parsing is defensive about the 2.9.x quirks: an empty page comes back as the bare sublist
 * stats object (page_len 0), `total` is ignored, '>' arrives as \u003e (cJSON decodes it), the
 * order of entries is arbitrary. An entry counts when it has a string "subject" that is a valid
 * literal subject (no empty token, no space/control byte, no '*' or '>' token) not starting with
 * '$', and its "cid" (if present) is not excluded. Entries of another shape are skipped but still
 * counted in page_len (so paging stops correctly).
 *
 * Paging (fx_interest_fetch): nats-server builds the /subsz list by walking its sublist, whose
 * levels are Go maps, so the ORDER CHANGES ON EVERY CALL (seen on nats-server 2.9): offset/limit pages of
 * different calls are samples of different orderings and their union misses subscriptions
 * (measured: 1367 of 2500 found with offset paging by 1024). So every request asks for offset=0:
 * first limit=1024; when that page comes back full, the fetch starts over with a page big
 * enough for everything (max(2 x limit, num_subscriptions + 1/8 + 64), at most 2^20) until a
 * short page arrives. Each accepted answer is one consistent snapshot. The server's cost is
 * O(all subscriptions) per request whatever the limit, so a big page costs only bytes.
 *
 * Bounds: body <= 16 MiB (about 130k subscriptions), <= 1000 requests per fetch,
 * <= FX_INTEREST_MAX_SUBJECTS distinct subjects, subject <= 1024 bytes, one deadline (timeout_ms;
 * <= 0 means 5000) for the whole fetch. Errors: transport failure or non-200 -> FX_EUNAVAIL,
 * deadline -> FX_ETIMEDOUT, bad body or over a bound -> FX_EPROTO (detail via fx_err_detail).
 * An empty account name omits acc= (all accounts).
 */
#include "interest.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fx_url.h"

#define PAGE_LIMIT 1024          /* first request; the server default page size */
#define MAX_LIMIT (1u << 20)     /* largest page asked for (the body cap binds first) */
#define MAX_PAGES 1000           /* requests per fetch (in practice <= 12) */
#define MAX_BODY (16u * 1024u * 1024u)
#define FX_INTEREST_MAX_SUBJECTS (1u << 20)
#define SUBJ_MAX 1024
#define DEFAULT_TIMEOUT_MS 5000

void fx_interest_free(fx_interest *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->subjects[i]);
    free(s->subjects);
    s->subjects = NULL;
    s->n = 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

bool fx_interest_has(const fx_interest *s, const char *subject)
{
    if (!s || !subject || s->n == 0) return false;
    return bsearch(&subject, s->subjects, s->n, sizeof s->subjects[0], cmp_str) != NULL;
}

/* A literal subject with at least one (non-bridge) subscriber counts; see the file comment. */
static bool literal_subject(const char *s)
{
    size_t n = strnlen(s, SUBJ_MAX + 1);
    if (n == 0 || n > SUBJ_MAX || s[0] == '$') return false;
    size_t tok_start = 0;
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == n || c == '.') {
            size_t tl = i - tok_start;
            if (tl == 0) return false;
            if (tl == 1 && (s[tok_start] == '*' || s[tok_start] == '>')) return false;
            tok_start = i + 1;
        } else if (c <= 0x20 || c == 0x7f) {
            return false;
        }
    }
    return true;
}

static bool cid_excluded(const cJSON *e, const uint64_t *ex, size_t n_ex)
{
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(e, "cid");
    if (!cid || !cJSON_IsNumber(cid) || n_ex == 0) return false;
    double v = cid->valuedouble;
    if (!(v >= 0 && v < 18446744073709551616.0)) return false;
    uint64_t c = (uint64_t)v;
    for (size_t i = 0; i < n_ex; i++)
        if (ex[i] == c) return true;
    return false;
}

/* Sort acc and drop duplicates (freeing them). */
static void sort_dedup(fx_interest *acc)
{
    if (acc->n < 2) return;
    qsort(acc->subjects, acc->n, sizeof acc->subjects[0], cmp_str);
    size_t w = 1;
    for (size_t r = 1; r < acc->n; r++) {
        if (strcmp(acc->subjects[r], acc->subjects[w - 1]) == 0) {
            free(acc->subjects[r]);
        } else {
            acc->subjects[w++] = acc->subjects[r];
        }
    }
    acc->n = w;
}

fx_err fx_interest_parse(const char *body, size_t len, const uint64_t *exclude_cids,
                         size_t n_exclude, fx_interest *acc, size_t *page_len)
{
    if (page_len) *page_len = 0;
    if (!body || !acc || (n_exclude && !exclude_cids))
        return fx_seterr(FX_EINVAL, "interest: bad argument");
    if (len > MAX_BODY) return fx_seterr(FX_EPROTO, "interest: /subsz body over %u bytes", MAX_BODY);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!j) return fx_seterr(FX_EPROTO, "interest: /subsz body is not JSON");
    while (end && end < body + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
        end++;
    if (end != body + len) {
        cJSON_Delete(j);
        return fx_seterr(FX_EPROTO, "interest: trailing bytes after the /subsz JSON");
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fx_seterr(FX_EPROTO, "interest: /subsz body is not a JSON object");
    }
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "subscriptions_list");
    if (!list || cJSON_IsNull(list)) { /* stats-only shape: an empty page */
        cJSON_Delete(j);
        return FX_OK;
    }
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(j);
        return fx_seterr(FX_EPROTO, "interest: subscriptions_list is not an array");
    }
    size_t entries = (size_t)cJSON_GetArraySize(list);
    if (entries > FX_INTEREST_MAX_SUBJECTS || acc->n > FX_INTEREST_MAX_SUBJECTS - entries) {
        cJSON_Delete(j);
        return fx_seterr(FX_EPROTO, "interest: more than %u subscriptions",
                         FX_INTEREST_MAX_SUBJECTS);
    }
    fx_err rc = FX_OK;
    if (entries > 0) {
        char **grown = realloc(acc->subjects, (acc->n + entries) * sizeof *grown);
        if (!grown) {
            rc = fx_seterr(FX_ENOMEM, "interest: out of memory");
            goto out;
        }
        acc->subjects = grown;
        const cJSON *e;
        cJSON_ArrayForEach(e, list) {
            if (!cJSON_IsObject(e)) continue;
            const cJSON *subj = cJSON_GetObjectItemCaseSensitive(e, "subject");
            if (!cJSON_IsString(subj) || !subj->valuestring) continue;
            if (!literal_subject(subj->valuestring)) continue;
            if (cid_excluded(e, exclude_cids, n_exclude)) continue;
            char *dup = strdup(subj->valuestring);
            if (!dup) {
                rc = fx_seterr(FX_ENOMEM, "interest: out of memory");
                break;
            }
            acc->subjects[acc->n++] = dup;
        }
        sort_dedup(acc);
        if (acc->n == 0) { /* keep "empty set owns no memory" */
            free(acc->subjects);
            acc->subjects = NULL;
        }
    }
out:
    if (page_len) *page_len = entries;
    cJSON_Delete(j);
    return rc;
}

/* Append a copy of subject to acc (room grown as needed). */
static fx_err acc_push(fx_interest *acc, const char *subject)
{
    if (acc->n >= FX_INTEREST_MAX_SUBJECTS)
        return fx_seterr(FX_EPROTO, "interest: more than %u subscriptions", FX_INTEREST_MAX_SUBJECTS);
    char **grown = realloc(acc->subjects, (acc->n + 1) * sizeof *grown);
    if (!grown) return fx_seterr(FX_ENOMEM, "interest: out of memory");
    acc->subjects = grown;
    char *dup = strdup(subject);
    if (!dup) return fx_seterr(FX_ENOMEM, "interest: out of memory");
    acc->subjects[acc->n++] = dup;
    return FX_OK;
}

fx_err fx_interest_parse_routez(const char *body, size_t len, const char *account,
                                fx_interest *acc)
{
    if (!body || !acc) return fx_seterr(FX_EINVAL, "interest: bad argument");
    if (len > MAX_BODY) return fx_seterr(FX_EPROTO, "interest: /routez body over %u bytes", MAX_BODY);
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fx_seterr(FX_EPROTO, "interest: /routez body is not a JSON object");
    }
    size_t al = account ? strnlen(account, 1024) : 0;
    fx_err rc = FX_OK;
    const cJSON *routes = cJSON_GetObjectItemCaseSensitive(j, "routes");
    if (!cJSON_IsArray(routes)) routes = NULL; /* no routes: null or absent */
    const cJSON *r;
    cJSON_ArrayForEach(r, routes) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(r, "subscriptions_list_detail");
        if (!cJSON_IsArray(list)) continue;
        const cJSON *e;
        cJSON_ArrayForEach(e, list) {
            const cJSON *subj = cJSON_GetObjectItemCaseSensitive(e, "subject");
            const cJSON *sid = cJSON_GetObjectItemCaseSensitive(e, "sid");
            if (!cJSON_IsString(subj) || !subj->valuestring || !literal_subject(subj->valuestring))
                continue;
            if (al) { /* "<account> <subject>[ <queue>]" */
                if (!cJSON_IsString(sid) || !sid->valuestring ||
                    strncmp(sid->valuestring, account, al) != 0 || sid->valuestring[al] != ' ')
                    continue;
            }
            if ((rc = acc_push(acc, subj->valuestring))) goto out;
        }
    }
out:
    sort_dedup(acc);
    if (acc->n == 0) {
        free(acc->subjects);
        acc->subjects = NULL;
    }
    cJSON_Delete(j);
    return rc;
}

const char *fx_interest_claim_token(const char *deliver_prefix, const char *subject)
{
    if (!deliver_prefix || !subject) return NULL;
    size_t pl = strnlen(deliver_prefix, SUBJ_MAX + 1);
    if (pl == 0 || pl > SUBJ_MAX) return NULL;
    if (strncmp(subject, deliver_prefix, pl) != 0 || subject[pl] != '.') return NULL;
    const char *tok = subject + pl + 1;
    size_t tl = strnlen(tok, SUBJ_MAX + 1);
    if (tl == 0 || tl > SUBJ_MAX) return NULL;
    if (tl == 1 && (tok[0] == '*' || tok[0] == '>')) return NULL;
    for (size_t i = 0; i < tl; i++) {
        unsigned char c = (unsigned char)tok[i];
        if (c == '.' || c <= 0x20 || c == 0x7f) return NULL;
    }
    return tok;
}

/* ---- HTTP ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
static void curl_init_once(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct body_buf {
    char *p;
    size_t n, cap;
    bool overflow;
} body_buf;

static size_t body_write(char *data, size_t size, size_t nmemb, void *ud)
{
    body_buf *b = ud;
    size_t add = size * nmemb;
    if (add > MAX_BODY || b->n > MAX_BODY - add) {
        b->overflow = true;
        return 0;
    }
    if (b->n + add + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 16384;
        while (nc < b->n + add + 1) nc *= 2;
        if (nc > MAX_BODY + 1) nc = MAX_BODY + 1;
        char *np = realloc(b->p, nc);
        if (!np) return 0;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, data, add);
    b->n += add;
    b->p[b->n] = '\0';
    return add;
}

/* "num_subscriptions" (the account sublist count, >= the entries listed) from the head of a
 * NUL-terminated /subsz body; 0 when absent. Only a hint for the next page size. */
static size_t subs_hint(const char *body, size_t n)
{
    static const char key[] = "\"num_subscriptions\"";
    if (!body) return 0;
    size_t scan = n < 4096 ? n : 4096;
    const char *k = memmem(body, scan, key, sizeof key - 1);
    if (!k) return 0;
    const char *p = k + sizeof key - 1;
    while (*p == ' ' || *p == ':' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    size_t v = 0;
    for (int i = 0; i < 9 && *p >= '0' && *p <= '9'; i++, p++) v = v * 10 + (size_t)(*p - '0');
    return v;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

fx_err fx_interest_fetch(const char *monitor_url, const char *account,
                         const uint64_t *exclude_cids, size_t n_exclude, int timeout_ms,
                         fx_interest *out)
{
    if (!out) return fx_seterr(FX_EINVAL, "interest: bad argument");
    out->subjects = NULL;
    out->n = 0;
    if (!monitor_url || !*monitor_url || (n_exclude && !exclude_cids))
        return fx_seterr(FX_EINVAL, "interest: bad argument");
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) return fx_seterr(FX_ENOMEM, "interest: curl_global_init failed");
    if (timeout_ms <= 0) timeout_ms = DEFAULT_TIMEOUT_MS;
    int64_t deadline = now_ms() + timeout_ms;

    size_t ul = strnlen(monitor_url, 2048);
    if (ul >= 2048) return fx_seterr(FX_EINVAL, "interest: monitor_url too long");
    {
        static const char *const http[] = {"http", "https", NULL};
        fx_url u;
        char why[160];
        fx_url_status st =
            fx_url_parse(monitor_url, FX_URL_USERINFO | FX_URL_PATH, &u, why, sizeof why);
        bool ok = st == FX_URL_OK && fx_url_scheme_is(&u, http);
        fx_url_wipe(&u);
        if (!ok)
            return fx_seterr(FX_EINVAL, "interest: monitor_url: %s",
                             st ? why : "must be an http:// or https:// URL");
    }
    while (ul > 0 && monitor_url[ul - 1] == '/') ul--;

    CURL *h = curl_easy_init();
    if (!h) return fx_seterr(FX_ENOMEM, "interest: curl_easy_init failed");
    char *acc_enc = NULL;
    if (account && *account) {
        acc_enc = curl_easy_escape(h, account, (int)strnlen(account, 1024));
        if (!acc_enc) {
            curl_easy_cleanup(h);
            return fx_seterr(FX_ENOMEM, "interest: out of memory");
        }
    }
    char errbuf[CURL_ERROR_SIZE];
    body_buf b = {0};
    char url[4096];
    fx_err rc = FX_OK;
    fx_interest acc = {0};

    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*"); /* the local monitor port: never via http_proxy */
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);

    size_t limit = PAGE_LIMIT;
    for (int page = 0;; page++) {
        if (page >= MAX_PAGES) {
            rc = fx_seterr(FX_EPROTO, "interest: more than %d /subsz pages", MAX_PAGES);
            break;
        }
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            rc = fx_seterr(FX_ETIMEDOUT, "interest: /subsz fetch over %d ms", timeout_ms);
            break;
        }
        int un = snprintf(url, sizeof url, "%.*s/subsz?subs=1%s%s&offset=0&limit=%zu", (int)ul,
                          monitor_url, acc_enc ? "&acc=" : "", acc_enc ? acc_enc : "", limit);
        if (un < 0 || (size_t)un >= sizeof url) {
            rc = fx_seterr(FX_EINVAL, "interest: URL too long");
            break;
        }
        b.n = 0;
        b.overflow = false;
        errbuf[0] = '\0';
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)left);
        CURLcode cc = curl_easy_perform(h);
        if (cc != CURLE_OK) {
            const char *why = errbuf[0] ? errbuf : curl_easy_strerror(cc);
            if (b.overflow)
                rc = fx_seterr(FX_EPROTO, "interest: GET %s: body over %u bytes", url, MAX_BODY);
            else if (cc == CURLE_OPERATION_TIMEDOUT)
                rc = fx_seterr(FX_ETIMEDOUT, "interest: GET %s: %s", url, why);
            else if (cc == CURLE_OUT_OF_MEMORY || cc == CURLE_WRITE_ERROR)
                rc = fx_seterr(FX_ENOMEM, "interest: GET %s: %s", url, why);
            else
                rc = fx_seterr(FX_EUNAVAIL, "interest: GET %s: %s", url, why);
            break;
        }
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200) {
            rc = fx_seterr(FX_EUNAVAIL, "interest: GET %s: HTTP %ld", url, status);
            break;
        }
        size_t page_len = 0;
        rc = fx_interest_parse(b.p ? b.p : "", b.n, exclude_cids, n_exclude, &acc, &page_len);
        if (rc != FX_OK) break;
        if (page_len < limit) break; /* a short page: the whole list, one snapshot */
        /* A full page: start over with a page that holds everything (see the file comment). */
        fx_interest_free(&acc);
        if (limit >= MAX_LIMIT) {
            rc = fx_seterr(FX_EPROTO, "interest: more than %u subscriptions in the account",
                           MAX_LIMIT);
            break;
        }
        size_t hint = subs_hint(b.p, b.n);
        size_t next = limit * 2;
        if (hint < MAX_LIMIT && hint + hint / 8 + 64 > next) next = hint + hint / 8 + 64;
        limit = next < MAX_LIMIT ? next : MAX_LIMIT;
    }
    /* Routed interest: subscribers connected to the other servers of the cluster (see header). */
    int64_t left = deadline - now_ms();
    if (rc == FX_OK && left <= 0)
        rc = fx_seterr(FX_ETIMEDOUT, "interest: /subsz + /routez fetch over %d ms", timeout_ms);
    if (rc == FX_OK) {
        int un = snprintf(url, sizeof url, "%.*s/routez?subs=detail", (int)ul, monitor_url);
        b.n = 0;
        b.overflow = false;
        errbuf[0] = '\0';
        if (un < 0 || (size_t)un >= sizeof url) {
            rc = fx_seterr(FX_EINVAL, "interest: URL too long");
        } else {
            curl_easy_setopt(h, CURLOPT_URL, url);
            curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
            curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)left);
            CURLcode cc = curl_easy_perform(h);
            long status = 0;
            if (cc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
            if (cc != CURLE_OK)
                rc = fx_seterr(cc == CURLE_OPERATION_TIMEDOUT ? FX_ETIMEDOUT
                               : b.overflow                 ? FX_EPROTO
                                                            : FX_EUNAVAIL,
                               "interest: GET %s: %s", url,
                               errbuf[0] ? errbuf : curl_easy_strerror(cc));
            else if (status != 200)
                rc = fx_seterr(FX_EUNAVAIL, "interest: GET %s: HTTP %ld", url, status);
            else
                rc = fx_interest_parse_routez(b.p ? b.p : "", b.n, account, &acc);
        }
    }

    free(b.p);
    curl_free(acc_enc);
    curl_easy_cleanup(h);
    if (rc != FX_OK) {
        fx_interest_free(&acc);
        return rc;
    }
    *out = acc;
    return FX_OK;
}
