/* etcd.c -- etcd v3 client over the JSON gateway and gRPC (contract in etcd.h, wire codecs in
 * etcd_json.c and, for gRPC KV calls, etcd_pb.c).
 *
 * Layout:
 *   1. client: options, endpoints, uid, stats
 *   2. connections: a pool of libcurl easy handles (+ the reserved keepalive lane)
 *   3. one HTTP exchange with deadline, endpoint failover and auth
 *   4. unary calls (kv, txn, lease, maintenance)
 * The resilient watch (own thread, curl multi) is etcd_watch.c; what the two share is etcd_int.h.
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
#include <strings.h>

#include "etcd_int.h"
#include "etcd_json.h"
#include "etcd_pb.h"
#include "fx_log.h"
#include "fx_time.h"
#include "fx_url.h"

#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_CONNECT_MS 1000
#define DEFAULT_MAX_CONNS 64

/* ==== 1. client ================================================================================= */


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
    c->grpc = o->grpc;
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
    if (k->m) curl_multi_cleanup(k->m); /* its connection cache: the HTTP/2 connection */
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
void fx__etcd_set_common_opts(fx_etcd *c, CURL *h, char *errbuf)
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

static conn *conn_new(fx_etcd *c, bool h2)
{
    conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->h2 = h2;
    k->h2_ep = -1;
    k->h = curl_easy_init();
    if (!k->h) {
        free(k);
        return NULL;
    }
    fx__etcd_set_common_opts(c, k->h, k->errbuf);
    atomic_fetch_add(&c->st.conns_created, 1);
    return k;
}

/* The topmost idle handle of kind h2, or -1 (pool_mu held). */
static int idle_find(fx_etcd *c, bool h2)
{
    for (int i = c->n_idle - 1; i >= 0; i--)
        if (c->idle[i]->h2 == h2) return i;
    return -1;
}

/* Borrow a handle of kind h2: an idle one, a new one while below max_conns (closing an idle one
 * of the other kind when at the bound), else wait until deadline. */
static fx_err pool_get(fx_etcd *c, int64_t deadline, bool h2, conn **out)
{
    bool waited = false;
    conn *evict = NULL;
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
    int i = idle_find(c, h2);
    if (i >= 0) {
        *out = c->idle[i];
        c->idle[i] = c->idle[--c->n_idle];
        pthread_mutex_unlock(&c->pool_mu);
        return FX_OK;
    }
    if (c->n_conns >= c->max_conns) { /* only the other kind idle: replace one */
        evict = c->idle[--c->n_idle];
        c->n_conns--;
    }
    c->n_conns++;
    pthread_mutex_unlock(&c->pool_mu);
    conn_free(evict);
    *out = conn_new(c, h2);
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

/* ==== 3. one exchange ============================================================================= */

size_t fx__etcd_rbuf_write(char *ptr, size_t size, size_t nmemb, void *ud)
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

/* Build the request headers; auth_hdr ("Authorization: <token>") may be NULL. gRPC: its content
 * type, TE: trailers, and the token as the "token" metadata etcd's gRPC API reads. */
static struct curl_slist *make_headers(int64_t left_ms, const char *auth_hdr, bool grpc)
{
    char gt[40], *tok = NULL;
    /* Grpc-Timeout allows at most 8 digits. */
    snprintf(gt, sizeof gt, "Grpc-Timeout: %" PRId64 "m", left_ms > 99999999 ? 99999999 : left_ms);
    static const char az[] = "Authorization: ";
    if (grpc && auth_hdr && strncmp(auth_hdr, az, sizeof az - 1) == 0) {
        if (asprintf(&tok, "token: %s", auth_hdr + sizeof az - 1) < 0) return NULL;
        auth_hdr = tok;
    }
    struct curl_slist *h = NULL, *t;
    const char *lines[] = {grpc ? "Content-Type: application/grpc" : "Content-Type: application/json",
                           "Expect:", gt, grpc ? "TE: trailers" : NULL, auth_hdr};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i]) continue;
        t = curl_slist_append(h, lines[i]);
        if (!t) {
            curl_slist_free_all(h);
            h = NULL;
            break;
        }
        h = t;
    }
    wipe_free(tok); /* curl keeps its own copy */
    return h;
}

/* The gRPC status of an exchange: grpc-status and grpc-message, from the headers of a
 * trailers-only answer or from the trailers (libcurl hands both to the header callback). */
typedef struct grpc_st {
    int code; /* -1: none seen */
    char message[256];
} grpc_st;

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static size_t grpc_header(char *line, size_t size, size_t nitems, void *ud)
{
    grpc_st *g = ud;
    size_t n = size * nitems, o = 0;
    static const char st[] = "grpc-status:", msg[] = "grpc-message:";
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    if (n > sizeof st - 1 && strncasecmp(line, st, sizeof st - 1) == 0) {
        int v = 0;
        size_t i = sizeof st - 1;
        while (i < n && line[i] == ' ') i++;
        for (; i < n && line[i] >= '0' && line[i] <= '9' && v < 1000; i++) v = v * 10 + (line[i] - '0');
        g->code = v;
    } else if (n >= sizeof msg - 1 && strncasecmp(line, msg, sizeof msg - 1) == 0) {
        size_t i = sizeof msg - 1; /* percent-encoded (gRPC over HTTP/2), printable kept */
        while (i < n && line[i] == ' ') i++;
        for (; i < n && o < sizeof g->message - 1; i++) {
            int ch = (unsigned char)line[i];
            if (ch == '%' && i + 2 < n && hexval(line[i + 1]) >= 0 && hexval(line[i + 2]) >= 0) {
                ch = hexval(line[i + 1]) * 16 + hexval(line[i + 2]);
                i += 2;
            }
            g->message[o++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
        }
        g->message[o] = '\0';
    }
    return size * nitems;
}

/* One transfer of an h2 handle, on its own multi handle (whose connection cache keeps the HTTP/2
 * connection). Not curl_easy_perform: libcurl 7.88's HTTP/2 code can leave received data in
 * its buffers while the socket has nothing more to read, and curl_easy_perform then sleeps in
 * poll for up to 1 s before it looks again (seen: range answers over ~32 KiB took 1.0 or 2.0 s).
 * Here each wait is short and grows while nothing arrives (0.5 ms doubling to 16 ms), and
 * every wake-up runs the transfer on. The transfer's own CURLOPT_TIMEOUT_MS bounds the loop. */
static CURLcode h2_perform(conn *k)
{
    if (!k->m && !(k->m = curl_multi_init())) return CURLE_OUT_OF_MEMORY;
    if (curl_multi_add_handle(k->m, k->h) != CURLM_OK) return CURLE_FAILED_INIT;
    CURLcode rc = CURLE_OK;
    int running = 1, wait_us = 500;
    curl_off_t got = 0;
    while (running) {
        if (curl_multi_perform(k->m, &running) != CURLM_OK) {
            rc = CURLE_FAILED_INIT;
            break;
        }
        if (!running) break;
        curl_off_t now = 0;
        curl_easy_getinfo(k->h, CURLINFO_SIZE_DOWNLOAD_T, &now);
        if (now != got) { /* progress: look again soon */
            got = now;
            wait_us = 500;
        }
        int nfds = 0;
        if (curl_multi_poll(k->m, NULL, 0, wait_us < 1000 ? 1 : wait_us / 1000, &nfds) != CURLM_OK) {
            rc = CURLE_FAILED_INIT;
            break;
        }
        if (!nfds && wait_us < 16000) wait_us *= 2;
    }
    CURLMsg *msg;
    int left = 0;
    while ((msg = curl_multi_info_read(k->m, &left)) != NULL)
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == k->h) rc = msg->data.result;
    curl_multi_remove_handle(k->m, k->h);
    return rc;
}

/* POST body (len bytes) to path, trying endpoints from the last good one. FX_OK when an HTTP
 * response (any status) was received: *status, rb and *ep_out are set, and with gs (a gRPC call
 * on an h2 handle) the gRPC status. Transport failures map to FX_ETIMEDOUT, FX_EUNAVAIL or
 * FX_EPROTO (response over the limit). */
static fx_err perform(fx_etcd *c, conn *k, const char *path, const void *body, size_t len,
                      call_kind kind, int64_t deadline, const char *auth_hdr, rbuf *rb,
                      long *status, size_t *ep_out, grpc_st *gs)
{
    size_t start = atomic_load(&c->cur_ep) % c->n_eps;
    char url[MAX_ENDPOINT_LEN + 64];
    const char *last_err = "not attempted";
    char last_buf[CURL_ERROR_SIZE + 64];

    bool again = false; /* see "prior knowledge" below */
    for (size_t i = 0; i < c->n_eps; i++) {
        size_t ep = (start + i) % c->n_eps;
        int64_t left = fx_ms_left(deadline);
        if (left <= 0) break;
        if (i > 0 && !again) atomic_fetch_add(&c->st.failovers, 1);
        again = false;
        snprintf(url, sizeof url, "%s%s", c->eps[ep], path);
        struct curl_slist *hdrs = make_headers(left, auth_hdr, gs != NULL);
        if (!hdrs) return fx_seterr(FX_ENOMEM, "etcd: out of memory");
        rb->len = 0;
        rb->overflow = false;
        k->errbuf[0] = '\0';
        CURL *h = k->h;
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        /* Prior knowledge: cleartext HTTP/2 starts with the connection preface
         * (CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE). libcurl 7.88 (Debian 12) fails every request
         * that reuses a prior-knowledge connection ("Error in the HTTP2 framing layer", curl
         * PR #10643, fixed in 8.0), so a handle whose HTTP/2 connection to this endpoint is up
         * asks for CURL_HTTP_VERSION_2_0, which reuses it. Had that connection closed meanwhile,
         * libcurl sends the request as HTTP/1.1 with an h2c upgrade, which etcd's JSON gateway
         * answers 404 (no route for a gRPC path: nothing ran); the request goes again at once
         * with prior knowledge (again). A prior-knowledge request always opens a fresh
         * connection, so it never reuses one. And as libcurl does for HTTP/1.1 on its own, a
         * request on a reused connection that failed in transit before any answer byte (the
         * server closed it while idle: a restart) goes again once on a fresh connection. */
        bool tls = strncmp(c->eps[ep], "https:", 6) == 0, reuse = false;
        if (gs) {
            gs->code = -1;
            gs->message[0] = '\0';
            reuse = !tls && k->h2_ep == (int)ep;
            curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                             (long)(tls ? CURL_HTTP_VERSION_2TLS
                                        : reuse ? CURL_HTTP_VERSION_2_0
                                                : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE));
            curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, (long)(!tls && !reuse));
            curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, grpc_header);
            curl_easy_setopt(h, CURLOPT_HEADERDATA, gs);
        }
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)(left < c->connect_timeout_ms ? left : c->connect_timeout_ms));
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fx__etcd_rbuf_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, rb);
        atomic_fetch_add(&c->st.requests, 1);
        CURLcode rc = gs ? h2_perform(k) : curl_easy_perform(h);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_slist_free_all(hdrs);

        if (rc == CURLE_OK && gs && !tls) {
            long ver = 0;
            curl_easy_getinfo(h, CURLINFO_HTTP_VERSION, &ver);
            k->h2_ep = ver == CURL_HTTP_VERSION_2_0 ? (int)ep : -1;
            if (ver != CURL_HTTP_VERSION_2_0 && reuse) { /* went as HTTP/1.1: not run */
                again = true;
                i--;
                continue;
            }
        }
        if (gs && rc != CURLE_OK) {
            k->h2_ep = -1;
            long got = 0;
            curl_easy_getinfo(h, CURLINFO_HEADER_SIZE, &got);
            if (reuse && got == 0 && fx_ms_left(deadline) > 0 &&
                (rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING ||
                 rc == CURLE_HTTP2 || rc == CURLE_HTTP2_STREAM)) {
                again = true;
                i--;
                continue;
            }
        }
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
    e = perform(c, k, "/v3/auth/authenticate", body, strlen(body), CALL_READ, deadline, NULL, &rb,
                &status, &ep, NULL);
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
 * identifies the token, for fx__etcd_auth_invalidate(). */
fx_err fx__etcd_auth_header(fx_etcd *c, conn *k, int64_t deadline, char **hdr, uint64_t *gen)
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
        if (!k) e = pool_get(c, deadline, false, &own);
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
void fx__etcd_auth_invalidate(fx_etcd *c, uint64_t gen)
{
    pthread_mutex_lock(&c->auth_mu);
    if (c->token && c->token_gen == gen) {
        wipe_free(c->token);
        c->token = NULL;
        c->token_gen++;
    }
    pthread_mutex_unlock(&c->auth_mu);
}

/* One unary call as seen by the public functions: JSON (path, body, parse) or, with grpc set,
 * a gRPC call (grpc_path, pb/pb_len: one framed message, pb_parse). */
typedef struct call {
    const char *path;
    const char *body;
    call_kind kind;
    bool lane;  /* on the reserved keepalive handle */
    int timeout_ms;
    fx_err (*parse)(const char *body, size_t len, void *out);
    void *out;
    bool grpc;
    const char *grpc_path;
    const uint8_t *pb;
    size_t pb_len;
    fx_err (*pb_parse)(const uint8_t *msg, size_t len, void *out);
    fx_ej_error srv; /* filled when etcd answered with an error status */
} call;

/* The answer of a gRPC exchange: its message parsed into s->out, or the mapped error. */
static fx_err grpc_answer(fx_etcd *c, call *s, size_t ep, long status, const grpc_st *gs,
                          const rbuf *rb)
{
    if (status == 200 && gs->code == 0) {
        const uint8_t *msg;
        size_t n;
        fx_err e = fx_pb_frame((const uint8_t *)rb->data, rb->len, &msg, &n);
        if (e == FX_OK) e = s->pb_parse(msg, n, s->out);
        if (e != FX_OK) fx_err_wrap(e, "etcd %s%s: ", c->eps[ep], s->grpc_path);
        return e;
    }
    if (status == 200 && gs->code < 0) /* the answer ended without its trailers */
        return fx_seterr(s->kind == CALL_WRITE ? FX_EUNAVAIL : FX_EPROTO,
                         "etcd %s%s: answer without a gRPC status%s", c->eps[ep], s->grpc_path,
                         s->kind == CALL_WRITE ? " (the write may have been applied)" : "");
    s->srv.http_status = (int)status;
    s->srv.grpc_code = gs->code;
    snprintf(s->srv.message, sizeof s->srv.message, "%s",
             gs->code >= 0 ? gs->message : "no gRPC status (not etcd's gRPC API?)");
    fx_err e = fx_ej_map_error(status == 200 ? 0 : (int)status, gs->code, s->srv.message);
    return fx_seterr(e, "etcd %s%s: HTTP %ld (code %d): %s", c->eps[ep], s->grpc_path, status,
                     gs->code, s->srv.message);
}

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
        if (!c->lane) c->lane = conn_new(c, false);
        k = c->lane;
        if (!k) e = fx_seterr(FX_ENOMEM, "etcd: cannot create the keepalive connection");
    } else {
        e = pool_get(c, deadline, s->grpc, &k);
    }

    rbuf rb = {.limit = FX_EJ_MAX_BODY};
    bool reauthed = false;
    while (e == FX_OK) {
        char *auth = NULL;
        uint64_t gen = 0;
        long status = 0;
        size_t ep = 0;
        grpc_st gs;
        /* authentication is a JSON call: an h2 handle cannot carry it */
        e = fx__etcd_auth_header(c, s->grpc ? NULL : k, deadline, &auth, &gen);
        if (e == FX_OK && s->grpc)
            e = perform(c, k, s->grpc_path, s->pb, s->pb_len, s->kind, deadline, auth, &rb, &status,
                        &ep, &gs);
        else if (e == FX_OK)
            e = perform(c, k, s->path, s->body, strlen(s->body), s->kind, deadline, auth, &rb,
                        &status, &ep, NULL);
        wipe_free(auth);
        if (e != FX_OK) break;
        if (s->grpc) {
            e = grpc_answer(c, s, ep, status, &gs, &rb);
            /* an expired simple token: Unauthenticated, refused before it ran (as a 401) */
            if (e == FX_EAUTH && gs.code == 16 && c->username && !reauthed) {
                fx__etcd_auth_invalidate(c, gen);
                reauthed = true;
                e = FX_OK;
                continue;
            }
            break;
        }
        if (status == 200) {
            e = s->parse(rb.data, rb.len, s->out);
            if (e != FX_OK) fx_err_wrap(e, "etcd %s%s: ", c->eps[ep], s->path);
            break;
        }
        e = fx_ej_parse_error((int)status, rb.data, rb.len, &s->srv);
        if (status == 401 && c->username && !reauthed) {
            /* Simple tokens expire after idling: authenticate again, once. The request was
             * refused before it ran, so repeating a write is safe. */
            fx__etcd_auth_invalidate(c, gen);
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
static fx_err pb_range(const uint8_t *b, size_t n, void *out) { return fx_pb_parse_range(b, n, out); }
static fx_err pb_put(const uint8_t *b, size_t n, void *out) { return fx_pb_parse_put(b, n, out); }
static fx_err pb_del(const uint8_t *b, size_t n, void *out) { return fx_pb_parse_del(b, n, out); }
static fx_err pb_txn(const uint8_t *b, size_t n, void *out) { return fx_pb_parse_txn(b, n, out); }

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
    uint8_t *pb = NULL;
    size_t pbl = 0;
    fx_err e = c->grpc ? fx_pb_range_req(req, &pb, &pbl) : fx_ej_range_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/range", .body = body, .kind = CALL_READ, .timeout_ms = timeout_ms,
              .parse = p_range, .out = r, .grpc = c->grpc, .grpc_path = "/etcdserverpb.KV/Range",
              .pb = pb, .pb_len = pbl, .pb_parse = pb_range};
    e = run_call(c, &s);
    free(body);
    free(pb);
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
    uint8_t *pb = NULL;
    size_t pbl = 0;
    fx_err e = c->grpc ? fx_pb_put_req(req, &pb, &pbl) : fx_ej_put_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/put", .body = body, .kind = CALL_WRITE, .timeout_ms = timeout_ms,
              .parse = p_put, .out = r, .grpc = c->grpc, .grpc_path = "/etcdserverpb.KV/Put",
              .pb = pb, .pb_len = pbl, .pb_parse = pb_put};
    e = run_call(c, &s);
    free(body);
    free(pb);
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
    uint8_t *pb = NULL;
    size_t pbl = 0;
    fx_err e = c->grpc ? fx_pb_del_req(req, &pb, &pbl) : fx_ej_del_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    call s = {.path = "/v3/kv/deleterange", .body = body, .kind = CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_del, .out = r, .grpc = c->grpc,
              .grpc_path = "/etcdserverpb.KV/DeleteRange", .pb = pb, .pb_len = pbl,
              .pb_parse = pb_del};
    e = run_call(c, &s);
    free(body);
    free(pb);
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
    uint8_t *pb = NULL;
    size_t pbl = 0;
    fx_err e = c->grpc ? fx_pb_txn_req(req, &pb, &pbl) : fx_ej_txn_req(req, &body);
    if (e != FX_OK) return early_fail(c, e);
    bool ro = ops_read_only(req->success, req->n_success) &&
              ops_read_only(req->failure, req->n_failure);
    call s = {.path = "/v3/kv/txn", .body = body, .kind = ro ? CALL_READ : CALL_WRITE,
              .timeout_ms = timeout_ms, .parse = p_txn, .out = r, .grpc = c->grpc,
              .grpc_path = "/etcdserverpb.KV/Txn", .pb = pb, .pb_len = pbl, .pb_parse = pb_txn};
    e = run_call(c, &s);
    free(body);
    free(pb);
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
