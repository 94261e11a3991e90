/* http.c -- the bridge's HTTP endpoint on libmicrohttpd (contract: http.h).
 *
 *   GET|HEAD /healthz  200 {"status":"ok"} | 503 {"status":"error","error":"<reason>"}
 *   GET|HEAD /metrics  200 Prometheus text format 0.0.4
 *   other paths        404 (text)          other methods: 405 with "Allow: GET, HEAD"
 *   a request body     400 (refused before it is read)
 * libmicrohttpd runs one internal polling thread on poll() (never select(), which refuses
 * descriptors >= FD_SETSIZE = 1024, so a busy bridge holding more than 1,024 descriptors would
 * stop answering; not epoll, see fx_http_start). Bounds, each with a rule when hit:
 *   HTTP_CONN_LIMIT       connections in all; more are accepted and closed at once (logged)
 *   HTTP_PER_IP_LIMIT     connections from one address, so one slow client cannot fill the rest
 *   HTTP_CONN_TIMEOUT_S   a connection idle (no byte either way) this long is closed
 *   HTTP_HEAD_DEADLINE_MS a connection must deliver a complete request head this soon after it
 *                         opened or after its previous answer, however slowly it trickles bytes
 *                         (the idle timeout alone restarts at every byte); else the reaper
 *                         thread shuts its socket down and libmicrohttpd closes it (counted,
 *                         rate-logged)
 *   HTTP_CONN_MEMORY      per-connection memory for the request line, headers and parsed query
 *                         arguments: a larger head is answered 414 (URL) or 431 (headers), or
 *                         the connection is closed at once when no room is left for the answer
 * A slowloris (a head sent a byte at a time) therefore holds at most HTTP_PER_IP_LIMIT of the
 * HTTP_CONN_LIMIT slots per source address, each for at most HTTP_HEAD_DEADLINE_MS. MHD errors
 * go to the log as [WRN], rate-limited (one line per HTTP_LOG_INTERVAL_MS, with a count of the
 * suppressed ones).
 * Threads: libmicrohttpd's polling thread runs the callbacks; the reaper thread only reads the
 * connection list and calls shutdown() under `mu`. A connection leaves the list (NOTIFY_CLOSED)
 * before libmicrohttpd closes its descriptor, so the reaper never touches a reused descriptor.
 */
#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "fx_log.h"
#include "fx_time.h"
#include "http.h"

#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result fx_mhd_ret;
#else
typedef int fx_mhd_ret;
#endif

#define HTTP_CONN_LIMIT 512
#define HTTP_PER_IP_LIMIT 128
#define HTTP_CONN_TIMEOUT_S 10
#define HTTP_HEAD_DEADLINE_MS 5000
#define HTTP_REAP_PERIOD_MS 250
#define HTTP_LOG_INTERVAL_MS 10000
#define HTTP_CONN_MEMORY (32 * 1024)
#define HTTP_LISTEN_BACKLOG 128
#define HTTP_HEALTH_ERR_MAX 256

#define CT_JSON "application/json"
#define CT_TEXT "text/plain; charset=utf-8"
#define CT_PROM "text/plain; version=0.0.4; charset=utf-8"

/* One TCP connection (socket context): linked in fx_http.conns while open. */
typedef struct hconn {
    struct hconn *prev, *next;
    int fd;
    bool in_request; /* a complete head arrived; its answer is not finished */
    bool reaped;     /* shut down by the reaper */
    bool linked;     /* in fx_http.conns */
    int64_t since_ms; /* opened, or the previous answer finished */
} hconn;

struct fx_http {
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hconn *conns;    /* under mu */
    bool stopping;   /* under mu */
    bool reaper_started;
    pthread_t reaper;
    uint64_t reaped; /* under mu */
    fx_log_slot slot_mhd, slot_reap;
    fx_health_fn health;
    void *health_arg;
    fx_metrics *metrics;
    int port;
    struct sockaddr_storage addr;
};

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct fx_http *h = cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
    /* one client can cause one line per connection: rate-limited */
    fx_log_ratelimited(&h->slot_mhd, HTTP_LOG_INTERVAL_MS, FX_LOG_WRN, "http: %s", buf);
}

/* ---- request-head deadline ------------------------------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct fx_http *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hconn *c = calloc(1, sizeof *c);
        *socket_context = c;
        if (!c || !ci) return; /* not watched: the idle timeout still applies */
        c->fd = ci->connect_fd;
        c->since_ms = fx_now_ms();
        pthread_mutex_lock(&h->mu);
        c->linked = true;
        c->next = h->conns;
        if (h->conns) h->conns->prev = c;
        h->conns = c;
        pthread_mutex_unlock(&h->mu);
        return;
    }
    hconn *c = *socket_context; /* MHD_CONNECTION_NOTIFY_CLOSED, before the descriptor closes */
    if (!c) return;
    *socket_context = NULL;
    pthread_mutex_lock(&h->mu);
    if (c->linked) {
        if (c->prev) c->prev->next = c->next;
        else if (h->conns == c) h->conns = c->next;
        if (c->next) c->next->prev = c->prev;
    }
    pthread_mutex_unlock(&h->mu);
    free(c);
}

static hconn *conn_ctx(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void set_in_request(struct fx_http *h, struct MHD_Connection *conn, bool in)
{
    hconn *c = conn_ctx(conn);
    if (!c) return;
    pthread_mutex_lock(&h->mu);
    c->in_request = in;
    if (!in) c->since_ms = fx_now_ms();
    pthread_mutex_unlock(&h->mu);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)con_cls;
    (void)toe;
    set_in_request(cls, conn, false);
}

static void *reaper_main(void *arg)
{
    fx_thread_name("fx-http-reaper");
    struct fx_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        int64_t now = fx_now_ms();
        unsigned n = 0;
        for (hconn *c = h->conns; c; c = c->next) {
            if (c->in_request || c->reaped || now - c->since_ms < HTTP_HEAD_DEADLINE_MS) continue;
            c->reaped = true;
            shutdown(c->fd, SHUT_RDWR); /* MHD sees the end and closes it */
            n++;
        }
        h->reaped += n;
        uint64_t total = h->reaped;
        if (n)
            fx_log_ratelimited(&h->slot_reap, HTTP_LOG_INTERVAL_MS, FX_LOG_WRN,
                               "http: closed %u connection(s) that sent no complete request within "
                               "%d ms (%llu in all)", n, HTTP_HEAD_DEADLINE_MS,
                               (unsigned long long)total);
        struct timespec ts = fx_deadline_ts(fx_now_ms() + HTTP_REAP_PERIOD_MS);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Queue a response owning `body` (malloc'd; freed by MHD) or copying a static text. */
static fx_mhd_ret reply(struct MHD_Connection *conn, unsigned int status, const char *ctype,
                        char *body, bool owned, const char *allow)
{
    struct MHD_Response *r;
    if (owned)
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    else
        r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (owned) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    fx_mhd_ret ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static fx_mhd_ret reply_static(struct MHD_Connection *conn, unsigned int status, const char *ctype,
                               const char *body, const char *allow)
{
    return reply(conn, status, ctype, (char *)body, false, allow);
}

static fx_mhd_ret do_healthz(struct fx_http *h, struct MHD_Connection *conn)
{
    char err[HTTP_HEALTH_ERR_MAX];
    err[0] = '\0';
    if (!h->health || h->health(h->health_arg, err, sizeof err) == 0)
        return reply_static(conn, MHD_HTTP_OK, CT_JSON, "{\"status\":\"ok\"}", NULL);
    err[sizeof err - 1] = '\0';
    cJSON *root = cJSON_CreateObject();
    char *body = NULL;
    if (root && cJSON_AddStringToObject(root, "status", "error") &&
        cJSON_AddStringToObject(root, "error", err[0] ? err : "unhealthy"))
        body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!body)
        return reply_static(conn, MHD_HTTP_SERVICE_UNAVAILABLE, CT_JSON,
                            "{\"status\":\"error\",\"error\":\"unhealthy\"}", NULL);
    return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, CT_JSON, body, true, NULL);
}

static fx_mhd_ret do_metrics(struct fx_http *h, struct MHD_Connection *conn)
{
    if (!h->metrics) return reply_static(conn, MHD_HTTP_OK, CT_PROM, "", NULL);
    char *body = fx_metrics_render(h->metrics);
    if (!body)
        return reply_static(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, CT_TEXT, "out of memory\n", NULL);
    return reply(conn, MHD_HTTP_OK, CT_PROM, body, true, NULL);
}

static bool has_body(struct MHD_Connection *conn)
{
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strcmp(cl, "0") != 0) return true;
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

static fx_mhd_ret on_request(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload_data,
                             size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    struct fx_http *h = cls;
    (void)con_cls;
    set_in_request(h, conn, true); /* the head is complete: the deadline is met */
    /* Every answer is queued on the first call for the request, so no body is ever read:
     * a body left unread makes MHD close the connection after the response. */
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* not reached in practice; discard */
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_static(conn, MHD_HTTP_METHOD_NOT_ALLOWED, CT_TEXT, "method not allowed\n",
                            "GET, HEAD");
    if (has_body(conn))
        return reply_static(conn, MHD_HTTP_BAD_REQUEST, CT_TEXT, "request body not allowed\n", NULL);
    if (strcmp(url, "/healthz") == 0) return do_healthz(h, conn);
    if (strcmp(url, "/metrics") == 0) return do_metrics(h, conn);
    return reply_static(conn, MHD_HTTP_NOT_FOUND, CT_TEXT, "404 page not found\n", NULL);
}

/* "host:port", "[v6]:port" or ":port" (all interfaces) -> a socket address. */
static fx_err parse_listen(const char *listen, struct sockaddr_storage *out, socklen_t *len)
{
    if (!listen || !*listen) return fx_seterr(FX_EINVAL, "http.listen: empty");
    size_t n = strlen(listen);
    if (n > 255) return fx_seterr(FX_EINVAL, "http.listen: too long");
    char host[256], port[16];
    const char *colon;
    if (listen[0] == '[') {
        const char *rb = strchr(listen, ']');
        if (!rb || rb[1] != ':') return fx_seterr(FX_EINVAL, "http.listen: expected [ipv6]:port");
        size_t hl = (size_t)(rb - listen - 1);
        memcpy(host, listen + 1, hl);
        host[hl] = '\0';
        colon = rb + 1;
    } else {
        colon = strrchr(listen, ':');
        if (!colon) return fx_seterr(FX_EINVAL, "http.listen: expected host:port");
        size_t hl = (size_t)(colon - listen);
        memcpy(host, listen, hl);
        host[hl] = '\0';
        if (strchr(host, ':')) return fx_seterr(FX_EINVAL, "http.listen: IPv6 needs [addr]:port");
    }
    const char *p = colon + 1;
    size_t pl = strlen(p);
    if (pl == 0 || pl > 5 || strspn(p, "0123456789") != pl)
        return fx_seterr(FX_EINVAL, "http.listen: invalid port '%s'", p);
    long pv = strtol(p, NULL, 10);
    if (pv > 65535) return fx_seterr(FX_EINVAL, "http.listen: port out of range");
    memcpy(port, p, pl + 1);

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (rc != 0 || !res)
        return fx_seterr(FX_EINVAL, "http.listen: cannot resolve '%s': %s", host, gai_strerror(rc));
    /* Prefer IPv4 for a name or the wildcard (both families come back). */
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    if (pick->ai_addrlen > sizeof *out) {
        freeaddrinfo(res);
        return fx_seterr(FX_EINVAL, "http.listen: unsupported address");
    }
    memset(out, 0, sizeof *out);
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    *len = pick->ai_addrlen;
    freeaddrinfo(res);
    return FX_OK;
}

static void http_free(struct fx_http *h)
{
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

fx_err fx_http_start(const char *listen, fx_health_fn health, void *health_arg,
                     fx_metrics *metrics, fx_http **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "http: NULL out");
    *out = NULL;
    struct fx_http *h = calloc(1, sizeof *h);
    if (!h) return FX_ENOMEM;
    socklen_t alen = 0;
    fx_err e = parse_listen(listen, &h->addr, &alen);
    if (e) {
        free(h);
        return e;
    }
    h->health = health;
    h->health_arg = health_arg;
    h->metrics = metrics;
    pthread_mutex_init(&h->mu, NULL);
    fx_cond_init_monotonic(&h->cv);
    unsigned int flags = MHD_USE_ERROR_LOG | MHD_USE_ITC;
    /* poll(), not epoll: libmicrohttpd 0.9.75 (Debian 12) in epoll mode leaves a connection whose
     * request head ran out of pool memory (e.g. a 3 KB query of 1,500 empty arguments) open
     * until the idle timeout; with poll() it is closed at once. */
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) != MHD_YES) {
        http_free(h);
        return fx_seterr(FX_EUNAVAIL, "http: libmicrohttpd lacks poll() support");
    }
    flags |= MHD_USE_POLL_INTERNAL_THREAD;
    if (h->addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    errno = 0;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, (void *)h, /* first */
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, (void *)h,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, (void *)h,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_CONN_LIMIT,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)HTTP_PER_IP_LIMIT,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTP_CONN_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_CONN_MEMORY,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)HTTP_LISTEN_BACKLOG,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&h->addr,
                            MHD_OPTION_END);
    if (!h->d) {
        int err = errno;
        http_free(h);
        return fx_seterr(FX_EUNAVAIL, "http: cannot listen on %s%s%s", listen, err ? ": " : "",
                         err ? strerror(err) : "");
    }
    int rc = pthread_create(&h->reaper, NULL, reaper_main, h);
    if (rc != 0) {
        MHD_stop_daemon(h->d);
        http_free(h);
        return fx_seterr(FX_EUNAVAIL, "http: cannot start the reaper thread: %s", strerror(rc));
    }
    h->reaper_started = true;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? (int)info->port : 0;
    char host[INET6_ADDRSTRLEN] = "?";
    if (h->addr.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&h->addr)->sin6_addr, host, sizeof host);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&h->addr)->sin_addr, host, sizeof host);
    FX_INF("http: listening on http://%s%s%s:%d (/healthz, /metrics; poll, %d connections)",
           h->addr.ss_family == AF_INET6 ? "[" : "", host, h->addr.ss_family == AF_INET6 ? "]" : "",
           h->port, HTTP_CONN_LIMIT);
    *out = h;
    return FX_OK;
}

int fx_http_port(const fx_http *h) { return h ? h->port : 0; }

void fx_http_stop(fx_http *h)
{
    if (!h) return;
    if (h->reaper_started) {
        pthread_mutex_lock(&h->mu);
        h->stopping = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->reaper, NULL);
    }
    if (h->d) MHD_stop_daemon(h->d); /* NOTIFY_CLOSED for every connection: the list empties */
    http_free(h);
}
