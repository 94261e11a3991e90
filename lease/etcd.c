/* etcd.c -- etcd v3 client over the JSON gateway (contract in etcd.h, wire codecs in etcd_json.c).
 *
 * Layout:
 *   1. client: options, endpoints, uid, stats
 *   2. connections: a pool of libcurl easy handles (+ the reserved keepalive lane)
 *   3. one HTTP exchange with deadline, endpoint failover and auth
 *   4. unary calls (kv, txn, lease, maintenance)
 *   5. the resilient watch (own thread, curl multi)
 *
 * Deadline arithmetic: every call computes deadline = now + timeout once; the pool wait, each
 * connect (CURLOPT_CONNECTTIMEOUT_MS = min(connect_timeout, left)) and each transfer
 * (CURLOPT_TIMEOUT_MS = left) are bounded by what is left of it, and so is Grpc-Timeout.
 */
#include "etcd.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_json.h"
#include "fx_log.h"
#include "fx_time.h"
#include "fx_url.h"

#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_CONNECT_MS 1000
#define DEFAULT_MAX_CONNS 64
#define MAX_ENDPOINT_LEN 256

/* Watch reconnect backoff bounds and the log rate limit. */
#define WATCH_BACKOFF_MIN_MS 50
#define WATCH_BACKOFF_MAX_MS 2000
#define WATCH_HEALTHY_MS 1000 /* a stream that lived this long resets the backoff */
#define WATCH_LOG_EVERY_MS 5000

/* ==== 1. client ================================================================================= */

/* One pooled connection: an easy handle and its error buffer. */
typedef struct conn {
    CURL *h;
    char errbuf[CURL_ERROR_SIZE];
} conn;

struct fx_etcd {
    char **eps; /* normalised endpoint URLs, no trailing '/' */
    size_t n_eps;
    char *uid;
    char *username, *password; /* password: never logged */
    char *ca_file, *cert_file, *key_file;
    bool insecure;
    int default_timeout_ms, connect_timeout_ms, max_conns;

    _Atomic size_t cur_ep; /* the endpoint that last worked */

    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv; /* CLOCK_MONOTONIC */
    conn **idle;            /* max_conns slots */
    int n_idle, n_conns;

    pthread_mutex_t lane_mu; /* the keepalive lane */
    conn *lane;

    pthread_mutex_t auth_mu;
    char *token; /* never logged */
    uint64_t token_gen;

    struct {
        _Atomic uint64_t requests, failovers, errors, conns_created, pool_waits, keepalives,
            latency_us_sum, latency_count;
    } st;
    fx_log_slot log_slot;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void wipe_free(char *s)
{
    if (!s) return;
    explicit_bzero(s, strlen(s));
    free(s);
}

/* "etcd(a,b)" from the sorted endpoint list. */
static char *make_uid(char *const *eps, size_t n)
{
    char **sorted = malloc(n * sizeof *sorted);
    if (!sorted) return NULL;
    memcpy(sorted, eps, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_str);
    size_t len = sizeof "etcd()";
    for (size_t i = 0; i < n; i++) len += strlen(sorted[i]) + 1;
    char *uid = malloc(len);
    if (uid) {
        char *p = uid;
        p += sprintf(p, "etcd(");
        for (size_t i = 0; i < n; i++) p += sprintf(p, "%s%s", i ? "," : "", sorted[i]);
        sprintf(p, ")");
    }
    free(sorted);
    return uid;
}

fx_err fx_etcd_new(const fx_etcd_opts *o, fx_etcd **out)
{
    *out = NULL;
    if (!o || !o->endpoints || o->n_endpoints == 0)
        return fx_seterr(FX_EINVAL, "etcd: no endpoints");
    if (o->default_timeout_ms < 0 || o->connect_timeout_ms < 0 || o->max_conns < 0)
        return fx_seterr(FX_EINVAL, "etcd: negative timeout or max_conns");
    for (size_t i = 0; i < o->n_endpoints; i++) {
        const char *e = o->endpoints[i];
        fx_url u;
        static const char *const http[] = {"http", "https", NULL};
        bool ok = e && strlen(e) <= MAX_ENDPOINT_LEN &&
                  fx_url_parse(e, FX_URL_PATH, &u, NULL, 0) == FX_URL_OK && fx_url_scheme_is(&u, http);
        if (!ok)
            return fx_seterr(FX_EINVAL, "etcd: bad endpoint #%zu (want http[s]://host:port, "
                                        "no credentials, at most %d chars)", i, MAX_ENDPOINT_LEN);
    }
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) return fx_seterr(FX_ENOMEM, "etcd: curl_global_init failed");

    fx_etcd *c = calloc(1, sizeof *c);
    if (!c) return fx_seterr(FX_ENOMEM, "etcd: out of memory");
    c->default_timeout_ms = o->default_timeout_ms ? o->default_timeout_ms : DEFAULT_TIMEOUT_MS;
    c->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : DEFAULT_CONNECT_MS;
    c->max_conns = o->max_conns ? o->max_conns : DEFAULT_MAX_CONNS;
    c->insecure = o->insecure_skip_verify;
    bool ok = (c->eps = calloc(o->n_endpoints, sizeof *c->eps)) != NULL;
    for (size_t i = 0; ok && i < o->n_endpoints; i++) {
        c->eps[i] = strdup(o->endpoints[i]);
        ok = c->eps[i] != NULL;
        if (ok) {
            size_t n = strlen(c->eps[i]);
            while (n > 0 && c->eps[i][n - 1] == '/') c->eps[i][--n] = '\0';
            c->n_eps = i + 1;
        }
    }
    if (ok && o->username && o->username[0]) {
        c->username = strdup(o->username);
        c->password = strdup(o->password ? o->password : "");
        ok = c->username && c->password;
    }
    if (ok && o->ca_file) ok = (c->ca_file = xstrdup(o->ca_file)) != NULL;
    if (ok && o->cert_file) ok = (c->cert_file = xstrdup(o->cert_file)) != NULL;
    if (ok && o->key_file) ok = (c->key_file = xstrdup(o->key_file)) != NULL;
    if (ok) ok = (c->uid = make_uid(c->eps, c->n_eps)) != NULL;
    if (ok) ok = (c->idle = calloc((size_t)c->max_conns, sizeof *c->idle)) != NULL;
    if (!ok) {
        fx_etcd_free(c);
        return fx_seterr(FX_ENOMEM, "etcd: out of memory");
    }
    pthread_mutex_init(&c->pool_mu, NULL);
    fx_cond_init_monotonic(&c->pool_cv);
    pthread_mutex_init(&c->lane_mu, NULL);
    pthread_mutex_init(&c->auth_mu, NULL);
    *out = c;
    return FX_OK;
}

static void conn_free(conn *k)
{
    if (!k) return;
    curl_easy_cleanup(k->h);
    free(k);
}

void fx_etcd_free(fx_etcd *c)
{
    if (!c) return;
    if (c->idle) { /* fully constructed: every handle is idle by contract */
        for (int i = 0; i < c->n_idle; i++) conn_free(c->idle[i]);
        conn_free(c->lane);
        pthread_mutex_destroy(&c->pool_mu);
        pthread_cond_destroy(&c->pool_cv);
        pthread_mutex_destroy(&c->lane_mu);
        pthread_mutex_destroy(&c->auth_mu);
    }
    free(c->idle);
    for (size_t i = 0; i < c->n_eps; i++) free(c->eps[i]);
    free(c->eps);
    free(c->uid);
    free(c->username);
    wipe_free(c->password);
    wipe_free(c->token);
    free(c->ca_file);
    free(c->cert_file);
    free(c->key_file);
    free(c);
}

const char *fx_etcd_uid(const fx_etcd *c) { return c->uid; }

void fx_etcd_get_stats(fx_etcd *c, fx_etcd_stats *out)
{
    out->requests = atomic_load(&c->st.requests);
    out->failovers = atomic_load(&c->st.failovers);
    out->errors = atomic_load(&c->st.errors);
    out->conns_created = atomic_load(&c->st.conns_created);
    out->pool_waits = atomic_load(&c->st.pool_waits);
    out->keepalives = atomic_load(&c->st.keepalives);
    out->latency_us_sum = atomic_load(&c->st.latency_us_sum);
    out->latency_count = atomic_load(&c->st.latency_count);
}

/* ==== 2. connections ============================================================================== */

/* Options common to unary and watch handles. */
static void set_common_opts(fx_etcd *c, CURL *h, char *errbuf)
{
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    if (c->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
    if (c->cert_file) curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert_file);
    if (c->key_file) curl_easy_setopt(h, CURLOPT_SSLKEY, c->key_file);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, c->insecure ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, c->insecure ? 0L : 2L);
}

static conn *conn_new(fx_etcd *c)
{
    conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->h = curl_easy_init();
    if (!k->h) {
        free(k);
        return NULL;
    }
    set_common_opts(c, k->h, k->errbuf);
    atomic_fetch_add(&c->st.conns_created, 1);
    return k;
}

/* Borrow a handle: an idle one, a new one while below max_conns, else wait until deadline. */
static fx_err pool_get(fx_etcd *c, int64_t deadline, conn **out)
{
    bool waited = false;
    *out = NULL;
    pthread_mutex_lock(&c->pool_mu);
    while (c->n_idle == 0 && c->n_conns >= c->max_conns) {
        if (!waited) {
            waited = true;
            atomic_fetch_add(&c->st.pool_waits, 1);
        }
        struct timespec ts = fx_deadline_ts(deadline);
        if (pthread_cond_timedwait(&c->pool_cv, &c->pool_mu, &ts) == ETIMEDOUT &&
            c->n_idle == 0 && c->n_conns >= c->max_conns) {
            pthread_mutex_unlock(&c->pool_mu);
            return fx_seterr(FX_ETIMEDOUT, "etcd: no free connection within the deadline "
                                           "(max_conns %d)", c->max_conns);
        }
    }
    if (c->n_idle > 0) {
        *out = c->idle[--c->n_idle];
        pthread_mutex_unlock(&c->pool_mu);
        return FX_OK;
    }
    c->n_conns++;
    pthread_mutex_unlock(&c->pool_mu);
    *out = conn_new(c);
    if (*out) return FX_OK;
    pthread_mutex_lock(&c->pool_mu);
    c->n_conns--;
    pthread_cond_signal(&c->pool_cv);
    pthread_mutex_unlock(&c->pool_mu);
    return fx_seterr(FX_ENOMEM, "etcd: cannot create a connection");
}

static void pool_put(fx_etcd *c, conn *k)
{
    pthread_mutex_lock(&c->pool_mu);
    c->idle[c->n_idle++] = k;
    pthread_cond_signal(&c->pool_cv);
    pthread_mutex_unlock(&c->pool_mu);
}

/* Prepend a formatted prefix to the calling thread's error detail; returns e. */
static fx_err prefix_detail(fx_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fx_err prefix_detail(fx_err e, const char *fmt, ...)
{
    char prev[512], pre[256];
    snprintf(prev, sizeof prev, "%s", fx_err_detail());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    return fx_seterr(e, "%s%s", pre, prev);
}

/* ==== 3. one exchange ============================================================================= */

/* A bounded response body. */
typedef struct rbuf {
    char *data;
    size_t len, cap, limit;
    bool overflow;
} rbuf;

static size_t rbuf_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    rbuf *b = ud;
    size_t n = size * nmemb;
    if (n > b->limit - b->len) {
        b->overflow = true;
        return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

typedef enum { CALL_WRITE = 0, CALL_READ = 1 } call_kind;

/* Build the request headers; auth_hdr ("Authorization: <token>") may be NULL. */
static struct curl_slist *make_headers(int64_t left_ms, const char *auth_hdr)
{
    char gt[40];
    /* Grpc-Timeout allows at most 8 digits. */
    snprintf(gt, sizeof gt, "Grpc-Timeout: %" PRId64 "m", left_ms > 99999999 ? 99999999 : left_ms);
    struct curl_slist *h = NULL, *t;
    const char *lines[] = {"Content-Type: application/json", "Expect:", gt, auth_hdr};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i]) continue;
        t = curl_slist_append(h, lines[i]);
        if (!t) {
            curl_slist_free_all(h);
            return NULL;
        }
        h = t;
    }
    return h;
}

/* POST body to path, trying endpoints from the last good one. FX_OK when an HTTP response (any
 * status) was received: *status, rb and *ep_out are set. Transport failures map to FX_ETIMEDOUT,
 * FX_EUNAVAIL or FX_EPROTO (response over the limit). */
static fx_err perform(fx_etcd *c, conn *k, const char *path, const char *body, call_kind kind,
                      int64_t deadline, const char *auth_hdr, rbuf *rb, long *status,
                      size_t *ep_out)
{
    size_t start = atomic_load(&c->cur_ep) % c->n_eps;
    char url[MAX_ENDPOINT_LEN + 64];
    const char *last_err = "not attempted";
    char last_buf[CURL_ERROR_SIZE + 64];

    for (size_t i = 0; i < c->n_eps; i++) {
        size_t ep = (start + i) % c->n_eps;
        int64_t left = fx_ms_left(deadline);
        if (left <= 0) break;
        if (i > 0) atomic_fetch_add(&c->st.failovers, 1);
        snprintf(url, sizeof url, "%s%s", c->eps[ep], path);
        struct curl_slist *hdrs = make_headers(left, auth_hdr);
        if (!hdrs) return fx_seterr(FX_ENOMEM, "etcd: out of memory");
        rb->len = 0;
        rb->overflow = false;
        k->errbuf[0] = '\0';
        CURL *h = k->h;
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)(left < c->connect_timeout_ms ? left : c->connect_timeout_ms));
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbuf_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, rb);
        atomic_fetch_add(&c->st.requests, 1);
        CURLcode rc = curl_easy_perform(h);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_slist_free_all(hdrs);

        if (rc == CURLE_OK) {
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
            if (ep != start) atomic_store(&c->cur_ep, ep);
            *ep_out = ep;
            return FX_OK;
        }
        if (rb->overflow)
            return fx_seterr(FX_EPROTO, "etcd %s: response too large (over %zu bytes)", url,
                             rb->limit);
        /* Was the request provably not delivered? Connect failures, and a timeout before the
         * transfer began: libcurl stamps PRETRANSFER just before it sends the request (on new
         * and reused connections alike; CONNECT_TIME is 0 on a reused one, so it cannot tell). */
        curl_off_t pretransfer_us = 0;
        curl_easy_getinfo(h, CURLINFO_PRETRANSFER_TIME_T, &pretransfer_us);
        bool timed_out = rc == CURLE_OPERATION_TIMEDOUT;
        bool not_sent = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                        rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_SSL_CONNECT_ERROR ||
                        (timed_out && pretransfer_us == 0);
        snprintf(last_buf, sizeof last_buf, "%s", k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
        last_err = last_buf;
        /* A timeout after the request was sent is the call's deadline (CURLOPT_TIMEOUT_MS is
         * what was left of it), whatever our clock says a microsecond later. */
        if (timed_out && (!not_sent || fx_ms_left(deadline) <= 0))
            return fx_seterr(FX_ETIMEDOUT, "etcd %s: %s (deadline exceeded%s)", url, last_err,
                             kind == CALL_WRITE && !not_sent ? "; the write may have been applied"
                                                             : "");
        if (!not_sent && kind == CALL_WRITE)
            return fx_seterr(FX_EUNAVAIL, "etcd %s: %s (the write may have been applied)", url,
                             last_err);
        fx_log_ratelimited(&c->log_slot, 5000, FX_LOG_DBG, "etcd %s: %s; trying the next endpoint",
                           url, last_err);
    }
    if (fx_ms_left(deadline) <= 0)
        return fx_seterr(FX_ETIMEDOUT, "etcd %s: deadline exceeded (%s)", path, last_err);
    return fx_seterr(FX_EUNAVAIL, "etcd %s: no endpoint reachable (last error: %s)", path,
                     last_err);
}

/* Fetch a token with the given handle (auth requests carry no Authorization header). */
static fx_err authenticate(fx_etcd *c, conn *k, int64_t deadline, char **token)
{
    char *body = NULL;
    *token = NULL;
    fx_err e = fx_ej_auth_req(c->username, c->password, &body);
    if (e != FX_OK) return e;
    rbuf rb = {.limit = 1 << 20};
    long status = 0;
    size_t ep = 0;
    e = perform(c, k, "/v3/auth/authenticate", body, CALL_READ, deadline, NULL, &rb, &status, &ep);
    wipe_free(body);
    if (e == FX_OK) {
        if (status == 200) {
            e = fx_ej_parse_auth(rb.data, rb.len, token);
        } else {
            fx_ej_error er;
            e = fx_ej_parse_error((int)status, rb.data, rb.len, &er);
            /* Refused credentials (400/401), auth not enabled (412), ...: all are auth
             * failures; server trouble (429, 5xx) keeps its own code. */
            if (status >= 400 && status < 500 && status != 429) e = FX_EAUTH;
            fx_seterr(e, "etcd %s: authentication as \"%s\" failed: HTTP %ld: %s", c->eps[ep],
                      c->username, status, er.message);
        }
    }
    free(rb.data);
    return e;
}

/* "Authorization: <token>" for this call, authenticating first if no token is cached. k may be
 * NULL (a pooled handle is borrowed for the authentication). *hdr is NULL without auth; *gen
 * identifies the token, for auth_invalidate(). */
static fx_err auth_header(fx_etcd *c, conn *k, int64_t deadline, char **hdr, uint64_t *gen)
{
    *hdr = NULL;
    *gen = 0;
    if (!c->username) return FX_OK;
    /* Two rounds at most: another thread may invalidate the token we just stored. */
    for (int round = 0; round < 2; round++) {
        pthread_mutex_lock(&c->auth_mu);
        if (c->token) {
            fx_err e = FX_OK;
            if (asprintf(hdr, "Authorization: %s", c->token) < 0) {
                *hdr = NULL;
                e = fx_seterr(FX_ENOMEM, "etcd: out of memory");
            }
            *gen = c->token_gen;
            pthread_mutex_unlock(&c->auth_mu);
            return e;
        }
        pthread_mutex_unlock(&c->auth_mu);
        /* Authenticate without holding the lock (bounded by our deadline); concurrent callers
         * may authenticate twice, the first stored token wins. */
        char *tok = NULL;
        conn *own = NULL;
        fx_err e = FX_OK;
        if (!k) e = pool_get(c, deadline, &own);
        if (e == FX_OK) e = authenticate(c, k ? k : own, deadline, &tok);
        if (own) pool_put(c, own);
        if (e != FX_OK) return e;
        pthread_mutex_lock(&c->auth_mu);
        if (!c->token) {
            c->token = tok;
            c->token_gen++;
            tok = NULL;
        }
        pthread_mutex_unlock(&c->auth_mu);
        wipe_free(tok);
    }
    return fx_seterr(FX_EAUTH, "etcd: auth token invalidated while authenticating");
}

/* Drop the cached token if it is still the one of generation gen (a 401 said it expired). */
static void auth_invalidate(fx_etcd *c, uint64_t gen)
{
    pthread_mutex_lock(&c->auth_mu);
    if (c->token && c->token_gen == gen) {
        wipe_free(c->token);
        c->token = NULL;
        c->token_gen++;
    }
    pthread_mutex_unlock(&c->auth_mu);
}

/* One unary call as seen by the public functions. */
typedef struct call {
    const char *path;
    const char *body;
    call_kind kind;
    bool lane;  /* on the reserved keepalive handle */
    int timeout_ms;
    fx_err (*parse)(const char *body, size_t len, void *out);
    void *out;
    fx_ej_error srv; /* filled when etcd answered with an error status */
} call;

static fx_err run_call(fx_etcd *c, call *s)
{
    int64_t t0 = fx_now_us();
    int64_t deadline = fx_now_ms() + (s->timeout_ms > 0 ? s->timeout_ms : c->default_timeout_ms);
    conn *k = NULL;
    fx_err e = FX_OK;
    s->srv.http_status = 0;
    s->srv.grpc_code = -1;
    s->srv.message[0] = '\0';

    if (s->lane) {
        pthread_mutex_lock(&c->lane_mu);
        if (!c->lane) c->lane = conn_new(c);
        k = c->lane;
        if (!k) e = fx_seterr(FX_ENOMEM, "etcd: cannot create the keepalive connection");
    } else {
        e = pool_get(c, deadline, &k);
    }

    rbuf rb = {.limit = FX_EJ_MAX_BODY};
    bool reauthed = false;
    while (e == FX_OK) {
        char *auth = NULL;
        uint64_t gen = 0;
        long status = 0;
        size_t ep = 0;
        e = auth_header(c, k, deadline, &auth, &gen);
        if (e == FX_OK)
            e = perform(c, k, s->path, s->body, s->kind, deadline, auth, &rb, &status, &ep);
        free(auth);
        if (e != FX_OK) break;
        if (status == 200) {
            e = s->parse(rb.data, rb.len, s->out);
            if (e != FX_OK) prefix_detail(e, "etcd %s%s: ", c->eps[ep], s->path);
            break;
        }
        e = fx_ej_parse_error((int)status, rb.data, rb.len, &s->srv);
        if (status == 401 && c->username && !reauthed) {
            /* Simple tokens expire after idling: authenticate again, once. The request was
             * refused before it ran, so repeating a write is safe. */
            auth_invalidate(c, gen);
            reauthed = true;
            e = FX_OK;
            continue;
        }
        fx_seterr(e, "etcd %s%s: HTTP %ld (code %d): %s", c->eps[ep], s->path, status,
                  s->srv.grpc_code, s->srv.message);
        break;
    }
    free(rb.data);

    if (s->lane)
        pthread_mutex_unlock(&c->lane_mu);
    else if (k)
        pool_put(c, k);
    if (e == FX_OK) {
        atomic_fetch_add(&c->st.latency_us_sum, (uint64_t)(fx_now_us() - t0));
        atomic_fetch_add(&c->st.latency_count, 1);
    } else {
        atomic_fetch_add(&c->st.errors, 1);
    }
    return e;
}

/* ==== 4. unary calls ============================================================================== */

static fx_err p_range(const char *b, size_t n, void *out) { return fx_ej_parse_range(b, n, out); }
static fx_err p_put(const char *b, size_t n, void *out) { return fx_ej_parse_put(b, n, out); }
static fx_err p_del(const char *b, size_t n, void *out) { return fx_ej_parse_del(b, n, out); }
static fx_err p_txn(const char *b, size_t n, void *out) { return fx_ej_parse_txn(b, n, out); }
static fx_err p_header(const char *b, size_t n, void *out) { return fx_ej_parse_header(b, n, out); }
static fx_err p_status(const char *b, size_t n, void *out) { return fx_ej_parse_status(b, n, out); }

/* Count a call that failed before run_call (bad request). */
static fx_err early_fail(fx_etcd *c, fx_err e)
{
    atomic_fetch_add(&c->st.errors, 1);
    return e;
}

fx_err fx_etcd_range(fx_etcd *c, const fx_range_req *req, fx_range_resp *out, int timeout_ms)
{
    fx_range_resp tmp;
    fx_range_resp *r = out ? out : &tmp;
    memset(r, 0, sizeof *r);
    char *body = NULL;
    fx_err e = fx_ej_range_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/range", .body = body, .kind = CALL_READ, .timeout_ms = timeout_ms,
              .parse = p_range, .out = r};
    e = run_call(c, &s);
    free(body);
    if (!out) fx_range_resp_free(&tmp);
    return e;
}

/* "requested lease not found" on a write with a lease: the lease is gone (etcd_json.h). */
static fx_err lease_ctx(fx_err e, const call *s)
{
    if (e == FX_ENOTFOUND && fx_ej_is_lease_not_found(s->srv.message))
        return FX_ELEASE_EXPIRED; /* the detail (server message) stays as set */
    return e;
}

fx_err fx_etcd_put(fx_etcd *c, const fx_put_req *req, fx_put_resp *out, int timeout_ms)
{
    fx_put_resp tmp;
    fx_put_resp *r = out ? out : &tmp;
    memset(r, 0, sizeof *r);
    char *body = NULL;
    fx_err e = fx_ej_put_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/put", .body = body, .kind = CALL_WRITE, .timeout_ms = timeout_ms,
              .parse = p_put, .out = r};
    e = run_call(c, &s);
    free(body);
    if (req->lease) e = lease_ctx(e, &s);
    if (!out) fx_put_resp_free(&tmp);
    return e;
}

fx_err fx_etcd_delete(fx_etcd *c, const fx_del_req *req, fx_del_resp *out, int timeout_ms)
{
    fx_del_resp tmp;
    fx_del_resp *r = out ? out : &tmp;
    memset(r, 0, sizeof *r);
    char *body = NULL;
    fx_err e = fx_ej_del_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/deleterange", .body = body, .kind = CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_del, .out = r};
    e = run_call(c, &s);
    free(body);
    if (!out) fx_del_resp_free(&tmp);
    return e;
}

fx_err fx_etcd_get(fx_etcd *c, fx_slice key, fx_kv *out, int timeout_ms)
{
    memset(out, 0, sizeof *out);
    fx_range_req req = {.key = key};
    fx_range_resp r;
    fx_err e = fx_etcd_range(c, &req, &r, timeout_ms);
    if (e != FX_OK) return e;
    if (r.n_kvs == 0) {
        fx_range_resp_free(&r);
        return fx_seterr(FX_ENOTFOUND, "etcd: key not found");
    }
    *out = r.kvs[0];
    memset(&r.kvs[0], 0, sizeof r.kvs[0]); /* moved */
    fx_range_resp_free(&r);
    return FX_OK;
}

/* A txn is a read (retryable on another endpoint) when every op of both branches is a range. */
static bool ops_read_only(const fx_op *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i].type != FX_OP_RANGE) return false;
    return true;
}

static bool ops_have_lease(const fx_op *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i].type == FX_OP_PUT && ops[i].u.put.lease) return true;
    return false;
}

fx_err fx_etcd_txn(fx_etcd *c, const fx_txn_req *req, fx_txn_resp *out, int timeout_ms)
{
    fx_txn_resp tmp;
    fx_txn_resp *r = out ? out : &tmp;
    memset(r, 0, sizeof *r);
    char *body = NULL;
    fx_err e = fx_ej_txn_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    bool ro = ops_read_only(req->success, req->n_success) &&
              ops_read_only(req->failure, req->n_failure);
    call s = {.path = "/v3/kv/txn", .body = body, .kind = ro ? CALL_READ : CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_txn, .out = r};
    e = run_call(c, &s);
    free(body);
    if (ops_have_lease(req->success, req->n_success) || ops_have_lease(req->failure, req->n_failure))
        e = lease_ctx(e, &s);
    if (!out) fx_txn_resp_free(&tmp);
    return e;
}

typedef struct lease_out {
    int64_t a, b;
} lease_out;

static fx_err p_grant(const char *b, size_t n, void *out)
{
    lease_out *o = out;
    return fx_ej_parse_lease_grant(b, n, &o->a, &o->b);
}

static fx_err p_keepalive(const char *b, size_t n, void *out)
{
    lease_out *o = out;
    return fx_ej_parse_keepalive(b, n, &o->a);
}

static fx_err p_ttl(const char *b, size_t n, void *out)
{
    lease_out *o = out;
    return fx_ej_parse_timetolive(b, n, &o->a, &o->b);
}

fx_err fx_etcd_lease_grant(fx_etcd *c, int64_t ttl_s, int64_t id, int64_t *out_id,
                           int64_t *out_ttl, int timeout_ms)
{
    lease_out o = {0, 0};
    char *body = NULL;
    if (out_id) *out_id = 0;
    if (out_ttl) *out_ttl = 0;
    fx_err e = fx_ej_lease_grant_req(ttl_s, id, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/lease/grant", .body = body, .kind = CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_grant, .out = &o};
    e = run_call(c, &s);
    free(body);
    if (e == FX_OK) {
        if (out_id) *out_id = o.a;
        if (out_ttl) *out_ttl = o.b;
    }
    return e;
}

fx_err fx_etcd_lease_revoke(fx_etcd *c, int64_t id, int timeout_ms)
{
    char *body = NULL;
    int64_t rev = 0;
    fx_err e = fx_ej_lease_id_req(id, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/lease/revoke", .body = body, .kind = CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_header, .out = &rev};
    e = run_call(c, &s);
    free(body);
    return e;
}

static fx_err keepalive(fx_etcd *c, int64_t id, int64_t *out_ttl, int timeout_ms, bool lane)
{
    lease_out o = {0, 0};
    char *body = NULL;
    if (out_ttl) *out_ttl = 0;
    fx_err e = fx_ej_lease_id_req(id, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/lease/keepalive", .body = body, .kind = CALL_READ, .lane = lane,
              .timeout_ms = timeout_ms, .parse = p_keepalive, .out = &o};
    atomic_fetch_add(&c->st.keepalives, 1);
    e = run_call(c, &s);
    free(body);
    if (e == FX_ENOTFOUND) e = FX_ELEASE_EXPIRED; /* keeps the detail */
    if (e == FX_OK && out_ttl) *out_ttl = o.a;
    return e;
}

fx_err fx_etcd_lease_keepalive(fx_etcd *c, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    return keepalive(c, id, out_ttl, timeout_ms, false);
}

fx_err fx_etcd_lease_keepalive_lane(fx_etcd *c, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    return keepalive(c, id, out_ttl, timeout_ms, true);
}

fx_err fx_etcd_lease_timetolive(fx_etcd *c, int64_t id, int64_t *out_ttl, int64_t *out_granted,
                                int timeout_ms)
{
    lease_out o = {0, 0};
    char *body = NULL;
    if (out_ttl) *out_ttl = 0;
    if (out_granted) *out_granted = 0;
    fx_err e = fx_ej_lease_id_req(id, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/lease/timetolive", .body = body, .kind = CALL_READ,
              .timeout_ms = timeout_ms, .parse = p_ttl, .out = &o};
    e = run_call(c, &s);
    free(body);
    if (e == FX_OK) {
        if (out_ttl) *out_ttl = o.a;
        if (out_granted) *out_granted = o.b;
    }
    return e;
}

fx_err fx_etcd_status_get(fx_etcd *c, fx_etcd_status *out, int timeout_ms)
{
    memset(out, 0, sizeof *out);
    call s = {.path = "/v3/maintenance/status", .body = "{}", .kind = CALL_READ,
              .timeout_ms = timeout_ms, .parse = p_status, .out = out};
    return run_call(c, &s);
}

fx_err fx_etcd_compact(fx_etcd *c, int64_t revision, int timeout_ms)
{
    char *body = NULL;
    int64_t rev = 0;
    fx_err e = fx_ej_compact_req(revision, true, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/compaction", .body = body, .kind = CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_header, .out = &rev};
    e = run_call(c, &s);
    free(body);
    return e;
}

/* ==== 5. watch ====================================================================================
 *
 * The watch thread owns a curl multi handle with at most one stream (easy handle) in it. It loops:
 *   session: open a stream (create_request from last_rev+1, or from "now" when a snapshot is
 *            needed), wait for `created`, take the snapshot if needed, pump events until the
 *            stream fails or stop is requested;
 *   backoff: 50 ms doubling to 2 s between failed sessions (reset by a stream that lived 1 s),
 *            interruptible by fx_watch_stop().
 * Only the initial session reports to fx_watch_start(); a failure there ends the watch.
 */

enum { START_PENDING = 0, START_OK = 1, START_FAILED = -1 };

struct fx_watch {
    fx_etcd *c;
    uint8_t *key, *end;
    size_t key_len, end_len;
    bool prev_kv;
    fx_watch_fn fn;
    void *arg;
    char desc[64]; /* printable form of the key, for logs */

    pthread_t thr;
    bool thr_started;
    CURLM *multi;
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* start handshake and backoff waits; CLOCK_MONOTONIC */
    int start_state;
    fx_err start_err;
    char start_detail[512];
    int64_t start_deadline;

    /* watch-thread state */
    int64_t last_rev;   /* every update up to this revision has been delivered */
    bool need_snapshot;
    bool started;       /* fx_watch_start() has been answered */
    size_t ep;
    CURL *easy;         /* the current stream */
    struct curl_slist *hdrs;
    char *body;
    char errbuf[CURL_ERROR_SIZE];
    rbuf buf;           /* stream bytes not yet split into lines */
    size_t scanned;     /* buf[0..scanned) holds no '\n' */

    struct {
        _Atomic uint64_t streams, reconnects, snapshots, compactions, events;
        _Atomic int64_t last_revision;
    } st;
    fx_log_slot log_slot;
};

static bool watch_stopping(fx_watch *w) { return atomic_load(&w->stop); }

static void stream_close(fx_watch *w)
{
    if (w->easy) {
        /* Removing an unfinished transfer closes its connection: etcd frees the watcher. */
        curl_multi_remove_handle(w->multi, w->easy);
        curl_easy_cleanup(w->easy);
        w->easy = NULL;
    }
    curl_slist_free_all(w->hdrs);
    w->hdrs = NULL;
    free(w->body);
    w->body = NULL;
    w->buf.len = 0;
    w->buf.overflow = false;
    w->scanned = 0;
}

static fx_err stream_open(fx_watch *w, int64_t start_rev, int64_t deadline, uint64_t *auth_gen)
{
    fx_etcd *c = w->c;
    fx_ej_watch_create wc = {.key = {w->key, w->key_len},
                             .range_end = {w->end, w->end_len},
                             .start_revision = start_rev,
                             .prev_kv = w->prev_kv};
    fx_err e = fx_ej_watch_create_req(&wc, &w->body);
    if (e != FX_OK) return e;
    char *auth = NULL;
    e = auth_header(c, NULL, deadline, &auth, auth_gen);
    if (e != FX_OK) return e;
    const char *lines[] = {"Content-Type: application/json", "Expect:", auth};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i]) continue;
        struct curl_slist *t = curl_slist_append(w->hdrs, lines[i]);
        if (!t) {
            free(auth);
            return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
        }
        w->hdrs = t;
    }
    free(auth);
    w->easy = curl_easy_init();
    if (!w->easy) return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
    char url[MAX_ENDPOINT_LEN + 16];
    snprintf(url, sizeof url, "%s/v3/watch", c->eps[w->ep % c->n_eps]);
    CURL *h = w->easy;
    w->errbuf[0] = '\0';
    set_common_opts(c, h, w->errbuf);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, w->hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, w->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(w->body));
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    int64_t left = fx_ms_left(deadline);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(left > 0 && left < c->connect_timeout_ms ? left : c->connect_timeout_ms));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbuf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &w->buf);
    if (curl_multi_add_handle(w->multi, h) != CURLM_OK)
        return fx_seterr(FX_ENOMEM, "etcd watch: curl_multi_add_handle failed");
    atomic_fetch_add(&w->st.streams, 1);
    atomic_fetch_add(&c->st.requests, 1);
    return FX_OK;
}

static void deliver(fx_watch *w, const fx_watch_update *u)
{
    w->fn(w->arg, u);
    if (u->revision > w->last_rev) w->last_rev = u->revision;
    atomic_store(&w->st.last_revision, w->last_rev);
}

/* Range the watched keys at the latest revision R and deliver them; events up to R are then
 * skipped (they are in the snapshot). */
static fx_err take_snapshot(fx_watch *w, int64_t deadline)
{
    int left = (int)fx_ms_left(deadline);
    if (left <= 0) return fx_seterr(FX_ETIMEDOUT, "etcd watch: no time left for the snapshot");
    fx_range_req req = {.key = {w->key, w->key_len}, .range_end = {w->end, w->end_len}};
    fx_range_resp r;
    fx_err e = fx_etcd_range(w->c, &req, &r, left);
    if (e != FX_OK) return e;
    /* Revisions never go backwards, even across a compaction resync. */
    fx_watch_update u = {.kind = FX_WATCH_SNAPSHOT,
                         .revision = r.revision > w->last_rev ? r.revision : w->last_rev,
                         .kvs = r.kvs,
                         .n_kvs = r.n_kvs};
    deliver(w, &u);
    fx_range_resp_free(&r);
    w->need_snapshot = false;
    atomic_fetch_add(&w->st.snapshots, 1);
    return FX_OK;
}

/* Deliver the events newer than last_rev (moved to the front of the array, so the line still
 * owns and frees all of them). */
static void deliver_events(fx_watch *w, fx_ej_watch_line *l)
{
    size_t n = 0;
    int64_t top = w->last_rev;
    for (size_t i = 0; i < l->n_events; i++) {
        if (l->events[i].kv.mod_revision <= w->last_rev) continue;
        if (i != n) {
            fx_event t = l->events[n];
            l->events[n] = l->events[i];
            l->events[i] = t;
        }
        if (l->events[n].kv.mod_revision > top) top = l->events[n].kv.mod_revision;
        n++;
    }
    if (n == 0) return;
    fx_watch_update u = {.kind = FX_WATCH_EVENTS, .revision = top, .events = l->events,
                         .n_events = n};
    deliver(w, &u);
    atomic_fetch_add(&w->st.events, n);
}

static void start_report(fx_watch *w, fx_err e)
{
    pthread_mutex_lock(&w->mu);
    w->start_state = e == FX_OK ? START_OK : START_FAILED;
    w->start_err = e;
    if (e != FX_OK) snprintf(w->start_detail, sizeof w->start_detail, "%s", fx_err_detail());
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    w->started = true;
}

/* Handle one complete line. Returns FX_OK to go on, or why the session ends
 * (FX_ECOMPACTED: resync with a snapshot). *created tracks the create ack. */
static fx_err handle_line(fx_watch *w, const char *line, size_t len, bool *created,
                          int64_t deadline)
{
    fx_ej_watch_line l;
    fx_err e = fx_ej_parse_watch_line(line, len, &l);
    if (e != FX_OK) return prefix_detail(e, "etcd watch: bad stream line: ");
    switch (l.kind) {
    case FX_WL_CREATED:
        *created = true;
        if (w->need_snapshot) e = take_snapshot(w, w->started ? fx_now_ms() + w->c->default_timeout_ms
                                                              : deadline);
        if (e == FX_OK && !w->started) start_report(w, FX_OK);
        break;
    case FX_WL_CANCELED:
        if (l.compact_revision > 0) {
            atomic_fetch_add(&w->st.compactions, 1);
            w->need_snapshot = true;
            e = fx_seterr(FX_ECOMPACTED, "etcd watch: revision %" PRId64 " compacted (at %" PRId64
                          ")", w->last_rev + 1, l.compact_revision);
        } else {
            e = fx_seterr(l.err, "etcd watch canceled by the server: %s", l.reason);
        }
        break;
    case FX_WL_EVENTS:
        if (!*created) {
            e = fx_seterr(FX_EPROTO, "etcd watch: events before created");
            break;
        }
        deliver_events(w, &l);
        break;
    case FX_WL_PROGRESS:
        /* Every event up to header.revision has been sent (etcd-notes §2.7). */
        if (*created && !w->need_snapshot && l.revision > w->last_rev) {
            w->last_rev = l.revision;
            atomic_store(&w->st.last_revision, w->last_rev);
        }
        break;
    case FX_WL_ERROR:
        e = fx_seterr(l.err, "etcd watch stream error (code %d): %s", l.grpc_code, l.reason);
        break;
    }
    fx_ej_watch_line_free(&l);
    return e;
}

/* Split buffered bytes into lines and handle them. */
static fx_err drain_lines(fx_watch *w, bool *created, int64_t deadline)
{
    size_t off = 0;
    fx_err e = FX_OK;
    while (e == FX_OK && !watch_stopping(w)) {
        size_t from = off > w->scanned ? off : w->scanned;
        char *nl = from < w->buf.len ? memchr(w->buf.data + from, '\n', w->buf.len - from) : NULL;
        if (!nl) {
            w->scanned = w->buf.len;
            break;
        }
        size_t end = (size_t)(nl - w->buf.data);
        if (end > off) e = handle_line(w, w->buf.data + off, end - off, created, deadline);
        off = end + 1;
    }
    if (off > 0) { /* keep only the partial line; off <= len, and cap > len */
        size_t rest = w->buf.len - off;
        memmove(w->buf.data, w->buf.data + off, rest);
        w->buf.len = rest;
        w->buf.data[rest] = '\0';
        w->scanned = w->scanned > off ? w->scanned - off : 0;
    }
    return e;
}

/* One stream from open to failure. Returns FX_ECANCELED when stopping, FX_ECOMPACTED for a
 * resync, else the failure. *lived_ms: how long the stream was up after `created`. */
static fx_err watch_session(fx_watch *w, int64_t *lived_ms)
{
    fx_etcd *c = w->c;
    int64_t start_rev = w->need_snapshot ? 0 : w->last_rev + 1;
    int64_t deadline = w->started ? fx_now_ms() + c->default_timeout_ms : w->start_deadline;
    int64_t created_at = 0;
    bool created = false;
    uint64_t auth_gen = 0;
    *lived_ms = 0;

    fx_err e = stream_open(w, start_rev, deadline, &auth_gen);
    while (e == FX_OK) {
        if (watch_stopping(w)) {
            e = FX_ECANCELED;
            break;
        }
        int running = 0;
        curl_multi_perform(w->multi, &running);
        long status = 0;
        curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200) {
            bool was_created = created;
            e = drain_lines(w, &created, deadline);
            if (created && !was_created) created_at = fx_now_ms();
            if (e != FX_OK) break;
        }
        int left_msgs = 0;
        CURLMsg *m;
        while ((m = curl_multi_info_read(w->multi, &left_msgs)) != NULL) {
            if (m->msg != CURLMSG_DONE || m->easy_handle != w->easy) continue;
            CURLcode rc = m->data.result;
            if (w->buf.overflow) {
                e = fx_seterr(FX_EPROTO, "etcd watch: stream line over %zu bytes", w->buf.limit);
            } else if (rc != CURLE_OK) {
                e = fx_seterr(rc == CURLE_OPERATION_TIMEDOUT ? FX_ETIMEDOUT : FX_EUNAVAIL,
                              "etcd watch %s: %s", c->eps[w->ep % c->n_eps],
                              w->errbuf[0] ? w->errbuf : curl_easy_strerror(rc));
            } else if (status != 200) {
                fx_ej_error er;
                e = fx_ej_parse_error((int)status, w->buf.data, w->buf.len, &er);
                fx_seterr(e, "etcd watch %s: HTTP %ld (code %d): %s", c->eps[w->ep % c->n_eps],
                          status, er.grpc_code, er.message);
            } else {
                e = fx_seterr(FX_EUNAVAIL, "etcd watch %s: stream closed by the server",
                              c->eps[w->ep % c->n_eps]);
            }
        }
        if (e != FX_OK) break;
        int timeout = 1000;
        if (!created) {
            int64_t left = fx_ms_left(deadline);
            if (left <= 0) {
                e = fx_seterr(FX_ETIMEDOUT, "etcd watch %s: stream not created in time",
                              c->eps[w->ep % c->n_eps]);
                break;
            }
            if (left < timeout) timeout = (int)left;
        }
        curl_multi_poll(w->multi, NULL, 0, timeout, NULL);
    }
    if (created) *lived_ms = fx_now_ms() - created_at;
    /* A token refused on the stream (401, or a cancel_reason saying Unauthenticated) must not be
     * reused by the next attempt. */
    if (e == FX_EAUTH && c->username) auth_invalidate(c, auth_gen);
    if (watch_stopping(w)) e = FX_ECANCELED;
    stream_close(w);
    return e;
}

/* Sleep ms unless stopped; false when stopped. */
static bool watch_sleep(fx_watch *w, int64_t ms)
{
    int64_t until = fx_now_ms() + ms;
    struct timespec ts = fx_deadline_ts(until);
    pthread_mutex_lock(&w->mu);
    while (!watch_stopping(w) && fx_now_ms() < until)
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    pthread_mutex_unlock(&w->mu);
    return !watch_stopping(w);
}

static void *watch_main(void *arg)
{
    fx_watch *w = arg;
    int64_t backoff = 0;
    while (!watch_stopping(w)) {
        int64_t lived = 0;
        fx_err e = watch_session(w, &lived);
        if (e == FX_ECANCELED && watch_stopping(w)) break;
        if (!w->started && e != FX_ECOMPACTED) {
            start_report(w, e);
            break;
        }
        if (e == FX_ECOMPACTED) {
            /* Not a failure: resync right away with a snapshot. */
            fx_log_ratelimited(&w->log_slot, WATCH_LOG_EVERY_MS, FX_LOG_WRN,
                               "watch %s: %s; resyncing with a snapshot", w->desc, fx_err_detail());
            continue;
        }
        atomic_fetch_add(&w->st.reconnects, 1);
        if (lived >= WATCH_HEALTHY_MS || backoff == 0)
            backoff = WATCH_BACKOFF_MIN_MS;
        else
            backoff = backoff * 2 > WATCH_BACKOFF_MAX_MS ? WATCH_BACKOFF_MAX_MS : backoff * 2;
        w->ep = (w->ep + 1) % w->c->n_eps; /* try the next endpoint (a no-op with one) */
        fx_log_ratelimited(&w->log_slot, WATCH_LOG_EVERY_MS, FX_LOG_WRN,
                           "watch %s: %s (%s); reconnecting from revision %" PRId64
                           " in %" PRId64 " ms", w->desc, fx_err_detail(), fx_errname(e),
                           w->last_rev + 1, backoff);
        if (!watch_sleep(w, backoff)) break;
    }
    return NULL;
}

static void watch_free(fx_watch *w)
{
    stream_close(w);
    if (w->multi) curl_multi_cleanup(w->multi);
    free(w->buf.data);
    free(w->key);
    free(w->end);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* "prefix/..." with non-printable bytes as '?', truncated, for log lines. */
static void describe_key(fx_slice k, bool range, char *out, size_t size)
{
    size_t o = 0, max = size - 5; /* room for "...*" and NUL */
    const uint8_t *p = k.data;
    for (size_t i = 0; i < k.len && o < max; i++)
        out[o++] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    if (o < k.len) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    if (range) out[o++] = '*';
    out[o] = '\0';
}

static uint8_t *dup_bytes(fx_slice s)
{
    uint8_t *p = malloc(s.len ? s.len : 1);
    if (p && s.len) memcpy(p, s.data, s.len);
    return p;
}

fx_err fx_watch_start(fx_etcd *c, const fx_watch_opts *o, int timeout_ms, fx_watch **out)
{
    *out = NULL;
    if (!c || !o || !o->fn || o->key.len == 0 || !o->key.data || (o->range_end.len && !o->range_end.data))
        return fx_seterr(FX_EINVAL, "etcd watch: key and callback are required");
    if (o->start_revision < 0) return fx_seterr(FX_EINVAL, "etcd watch: negative start revision");
    fx_watch *w = calloc(1, sizeof *w);
    if (!w) return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
    pthread_mutex_init(&w->mu, NULL);
    fx_cond_init_monotonic(&w->cv);
    w->c = c;
    w->fn = o->fn;
    w->arg = o->arg;
    w->prev_kv = o->prev_kv;
    w->key = dup_bytes(o->key);
    w->key_len = o->key.len;
    w->end = dup_bytes(o->range_end);
    w->end_len = o->range_end.len;
    w->buf.limit = FX_EJ_MAX_BODY;
    describe_key(o->key, o->range_end.len > 0, w->desc, sizeof w->desc);
    w->ep = atomic_load(&c->cur_ep) % c->n_eps;
    w->multi = curl_multi_init();
    if (!w->key || !w->end || !w->multi) {
        watch_free(w);
        return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
    }
    w->start_deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : c->default_timeout_ms);

    if (o->start_revision > 0) {
        /* Learn up front whether the start revision is compacted, so that the snapshot that
         * replaces it is delivered before we return (the stream would only say so ~100 ms after
         * `created`). Other errors (future revision, etcd down) are left to the stream. */
        fx_range_req probe = {.key = o->key, .range_end = o->range_end,
                              .revision = o->start_revision, .count_only = true};
        fx_range_resp r;
        int left = (int)fx_ms_left(w->start_deadline);
        fx_err e = left > 0 ? fx_etcd_range(c, &probe, &r, left) : FX_ETIMEDOUT;
        if (e == FX_OK) fx_range_resp_free(&r);
        if (e == FX_ECOMPACTED) {
            atomic_fetch_add(&w->st.compactions, 1);
            w->need_snapshot = true;
        } else {
            w->last_rev = o->start_revision - 1;
        }
    } else {
        w->need_snapshot = true;
    }
    atomic_store(&w->st.last_revision, w->last_rev);

    if (pthread_create(&w->thr, NULL, watch_main, w) != 0) {
        watch_free(w);
        return fx_seterr(FX_ENOMEM, "etcd watch: cannot create the thread");
    }
    w->thr_started = true;

    /* The thread bounds its own initial session by start_deadline; the extra second here only
     * guards against a snapshot range that overruns it slightly. */
    struct timespec ts = fx_deadline_ts(w->start_deadline + 1000);
    pthread_mutex_lock(&w->mu);
    while (w->start_state == START_PENDING)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) break;
    int state = w->start_state;
    fx_err err = w->start_err;
    char detail[sizeof w->start_detail];
    memcpy(detail, w->start_detail, sizeof detail);
    pthread_mutex_unlock(&w->mu);

    if (state == START_OK) {
        *out = w;
        return FX_OK;
    }
    fx_watch_stop(w);
    if (state == START_PENDING) return fx_seterr(FX_ETIMEDOUT, "etcd watch: not started in time");
    return fx_seterr(err, "%s", detail);
}

void fx_watch_stop(fx_watch *w)
{
    if (!w) return;
    atomic_store(&w->stop, true);
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    curl_multi_wakeup(w->multi);
    if (w->thr_started) pthread_join(w->thr, NULL);
    watch_free(w);
}

void fx_watch_get_stats(fx_watch *w, fx_watch_stats *out)
{
    out->streams = atomic_load(&w->st.streams);
    out->reconnects = atomic_load(&w->st.reconnects);
    out->snapshots = atomic_load(&w->st.snapshots);
    out->compactions = atomic_load(&w->st.compactions);
    out->events = atomic_load(&w->st.events);
    out->last_revision = atomic_load(&w->st.last_revision);
}
