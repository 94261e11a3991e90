/* test_http.c -- the HTTP endpoint (plugin/http.c) over real sockets with libcurl, and the
 * systemd units of deploy/ checked by `systemd-analyze verify`.
 *
 * http_healthz_ok_then_503: 200 {"status":"ok"} (application/json), then, with the health
 *   callback failing, 503 {"status":"error","error":"<reason>"} (reason JSON-escaped); back to
 *   200 when it recovers. A query string does not change the route.
 * http_metrics_text: 200, Content-Type text/plain; version=0.0.4, body equal to
 *   fx_metrics_render() and containing the HELP/TYPE lines and the labelled series; an update is
 *   visible in the next scrape.
 * http_not_found_and_method: unknown paths 404; POST/PUT/DELETE 405 with Allow: GET, HEAD;
 *   HEAD /healthz 200 without a body; a GET with a body 400.
 * http_listen_errors: invalid listen strings FX_EINVAL; a port in use FX_EUNAVAIL; [::1]:0 works
 *   when the host has IPv6 loopback.
 * http_stop_prompt: stop returns within 1 s with an idle keep-alive connection and a silent TCP
 *   connection open; the port is closed afterwards.
 * http_fd_pressure_and_slow_clients: with 1,100 more descriptors open in the process after the
 *   start (so every accepted connection's descriptor is above FD_SETSIZE = 1024) and 64 clients
 *   sending a request head a byte at a time and never finishing it, /healthz answers 200 within
 *   1 s, five times; a 3 KB query string is answered at once; 3 KB of 1,500 empty arguments
 *   (more than the per-connection memory holds) gets a 4xx or an immediate close, not a hang;
 *   the slow clients are all still connected at the end.
 * http_slow_head_closed: a client that trickles a request head a byte every 100 ms (so the idle
 *   timeout never fires) is closed by the server 5 s after it connected (the request-head
 *   deadline), not before 4.5 s and not after 7 s; a client that sent nothing at all too.
 * systemd_units_verify: `systemd-analyze verify` reports nothing for the two units of deploy/systemd/
 *   (ExecStart's /usr/local/bin/fluxon-bridge is rewritten to an existing binary, since the
 *   daemon is not installed here). SKIPPED when systemd-analyze is missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "fx_log.h"
#include "http.h"
#include "metrics.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"

/* ---- controllable health ------------------------------------------------------------------------ */

static _Atomic int g_healthy = 1;
static _Atomic int g_health_calls;

static int health(void *arg, char *err, size_t errlen)
{
    (void)arg;
    atomic_fetch_add(&g_health_calls, 1);
    if (atomic_load(&g_healthy)) return 0;
    snprintf(err, errlen, "etcd unreachable: \"127.0.0.1:2379\"");
    return -1;
}

static int group_setup(void **state)
{
    (void)state;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

/* ---- libcurl helpers ---------------------------------------------------------------------------- */

typedef struct resp {
    long status;
    char body[65536];
    size_t len;
    char ctype[256];
    char allow[256];
} resp;

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    size_t k = sz * n;
    size_t room = sizeof r->body - 1 - r->len;
    size_t c = k < room ? k : room;
    memcpy(r->body + r->len, p, c);
    r->len += c;
    r->body[r->len] = '\0';
    return k;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    size_t k = sz * n;
    if (k > 6 && strncasecmp(p, "Allow:", 6) == 0) {
        size_t l = k - 6 < sizeof r->allow - 1 ? k - 6 : sizeof r->allow - 1;
        memcpy(r->allow, p + 6, l);
        r->allow[l] = '\0';
        /* trim */
        char *s = r->allow;
        while (*s == ' ') memmove(s, s + 1, strlen(s));
        size_t e = strlen(s);
        while (e > 0 && (s[e - 1] == '\r' || s[e - 1] == '\n' || s[e - 1] == ' ')) s[--e] = '\0';
    }
    return k;
}

/* method: NULL (GET), "HEAD", "POST", ...; body: sent when non-NULL. handle: reuse when given. */
static void request(CURL *reuse, int port, const char *method, const char *path, const char *body,
                    resp *r)
{
    memset(r, 0, sizeof *r);
    CURL *h = reuse ? reuse : curl_easy_init();
    assert_non_null(h);
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    if (method && strcmp(method, "HEAD") == 0)
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    else if (method)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        if (!method) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "GET");
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) fail_msg("%s %s: %s", method ? method : "GET", url, curl_easy_strerror(rc));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    char *ct = NULL;
    curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
    if (ct) snprintf(r->ctype, sizeof r->ctype, "%s", ct);
    if (!reuse) curl_easy_cleanup(h);
}

static fx_http *start_ok(fx_metrics *m)
{
    fx_http *h = NULL;
    CHECK(fx_http_start("127.0.0.1:0", health, NULL, m, &h));
    assert_non_null(h);
    assert_true(fx_http_port(h) > 0);
    return h;
}

/* ---- tests --------------------------------------------------------------------------------------- */

static void http_healthz_ok_then_503(void **state)
{
    (void)state;
    atomic_store(&g_healthy, 1);
    fx_http *h = start_ok(NULL);
    int port = fx_http_port(h);
    resp r;
    request(NULL, port, NULL, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}");
    assert_string_equal(r.ctype, "application/json");

    atomic_store(&g_healthy, 0);
    request(NULL, port, NULL, "/healthz", NULL, &r);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body, "{\"status\":\"error\",\"error\":\"etcd unreachable: \\\"127.0.0.1:2379\\\"\"}");
    assert_string_equal(r.ctype, "application/json");

    atomic_store(&g_healthy, 1);
    request(NULL, port, NULL, "/healthz?verbose=1", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}");
    fx_http_stop(h);
}

static void http_metrics_text(void **state)
{
    (void)state;
    fx_metrics *m = fx_metrics_new(16);
    assert_non_null(m);
    fx_metric *cap = fx_metrics_add(m, "fluxon_captured_total", "Messages captured.",
                                    FX_METRIC_COUNTER, "orders");
    fx_metric *bl = fx_metrics_add(m, "fluxon_backlog", "Stored, unconsumed messages.",
                                   FX_METRIC_GAUGE, "orders");
    assert_non_null(cap);
    assert_non_null(bl);
    fx_metric_inc(cap, 5);
    fx_metric_set(bl, 42);
    fx_http *h = start_ok(m);
    resp r;
    request(NULL, fx_http_port(h), NULL, "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/plain; version=0.0.4; charset=utf-8");
    char *want = fx_metrics_render(m);
    assert_non_null(want);
    assert_string_equal(r.body, want);
    free(want);
    assert_non_null(strstr(r.body, "# TYPE fluxon_captured_total counter\n"));
    assert_non_null(strstr(r.body, "fluxon_captured_total{channel=\"orders\"} 5\n"));
    assert_non_null(strstr(r.body, "# TYPE fluxon_backlog gauge\n"));
    assert_non_null(strstr(r.body, "fluxon_backlog{channel=\"orders\"} 42\n"));

    fx_metric_inc(cap, 2);
    request(NULL, fx_http_port(h), NULL, "/metrics", NULL, &r);
    assert_non_null(strstr(r.body, "fluxon_captured_total{channel=\"orders\"} 7\n"));
    fx_http_stop(h);
    fx_metrics_free(m);
}

static void http_not_found_and_method(void **state)
{
    (void)state;
    atomic_store(&g_healthy, 1);
    fx_http *h = start_ok(NULL);
    int port = fx_http_port(h);
    resp r;
    static const char *const paths[] = {"/", "/nope", "/healthz/", "/metrics/x", "/HEALTHZ"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        request(NULL, port, NULL, paths[i], NULL, &r);
        if (r.status != 404) fail_msg("GET %s: %ld", paths[i], r.status);
    }
    static const char *const methods[] = {"POST", "PUT", "DELETE", "PATCH"};
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        request(NULL, port, methods[i], "/healthz", NULL, &r);
        if (r.status != 405) fail_msg("%s /healthz: %ld", methods[i], r.status);
        assert_string_equal(r.allow, "GET, HEAD");
    }
    request(NULL, port, "POST", "/metrics", "x=1", &r);
    assert_int_equal(r.status, 405);
    request(NULL, port, "HEAD", "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 0);
    request(NULL, port, NULL, "/healthz", "a body", &r);
    assert_int_equal(r.status, 400);
    /* The server still answers after the refused body. */
    request(NULL, port, NULL, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    /* Without a metrics registry /metrics is an empty, valid exposition. */
    request(NULL, port, NULL, "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 0);
    fx_http_stop(h);
}

static void http_listen_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {"", "nope", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999",
                                      "127.0.0.1:80a", "[::1", "[::1]80", "::1:80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fx_http *h = (fx_http *)1;
        fx_err e = fx_http_start(bad[i], health, NULL, NULL, &h);
        if (e != FX_EINVAL) fail_msg("listen '%s': %s, want FX_EINVAL", bad[i], fx_errname(e));
        assert_null(h);
    }
    fx_http *a = start_ok(NULL);
    char busy[64];
    snprintf(busy, sizeof busy, "127.0.0.1:%d", fx_http_port(a));
    fx_http *b = NULL;
    assert_int_equal(fx_http_start(busy, health, NULL, NULL, &b), FX_EUNAVAIL);
    assert_null(b);
    fx_http_stop(a);
    fx_http_stop(NULL);

    fx_http *v6 = NULL;
    if (fx_http_start("[::1]:0", health, NULL, NULL, &v6) == FX_OK) {
        assert_true(fx_http_port(v6) > 0);
        CURL *c = curl_easy_init();
        char url[64];
        snprintf(url, sizeof url, "http://[::1]:%d/healthz", fx_http_port(v6));
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        assert_int_equal(curl_easy_perform(c), CURLE_OK);
        long st = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
        assert_int_equal(st, 200);
        curl_easy_cleanup(c);
        fx_http_stop(v6);
    }
}

static void http_stop_prompt(void **state)
{
    (void)state;
    fx_http *h = start_ok(NULL);
    int port = fx_http_port(h);
    /* An idle keep-alive connection (libcurl keeps it in the handle's cache). */
    CURL *keep = curl_easy_init();
    resp r;
    request(keep, port, NULL, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    /* A connection that never sends a request. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);

    int64_t t0 = fxt_now_ms();
    fx_http_stop(h);
    int64_t took = fxt_now_ms() - t0;
    if (took > 1000) fail_msg("stop took %lld ms", (long long)took);
    close(fd);
    curl_easy_cleanup(keep);

    /* Nothing listens any more. */
    int fd2 = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd2 >= 0);
    assert_int_not_equal(connect(fd2, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd2);
}

/* Send req on a new connection and read until the server closes it or timeout_ms passes.
 * Returns the HTTP status, 0 for a close without a status line, -1 for no answer in time. */
static int raw_request(int port, const char *req, int timeout_ms, int64_t *took_ms)
{
    int64_t t0 = fxt_now_ms();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    size_t n = strlen(req);
    assert_int_equal(send(fd, req, n, MSG_NOSIGNAL), (ssize_t)n);
    char buf[512];
    size_t got = 0;
    int status = -1;
    for (;;) {
        int left = timeout_ms - (int)(fxt_now_ms() - t0);
        if (left <= 0) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) continue;
        ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (k > 0 && got + (size_t)k < sizeof buf - 1) {
            got += (size_t)k;
            continue;
        }
        buf[got] = '\0';
        status = (got > 12 && strncmp(buf, "HTTP/1.", 7) == 0) ? atoi(buf + 9) : 0;
        break;
    }
    close(fd);
    *took_ms = fxt_now_ms() - t0;
    return status;
}

enum { HELD = 1100, SLOW = 64 };
static int g_held[HELD];
static int g_slow[SLOW];
static fx_http *g_ph;

/* Teardown of http_fd_pressure_and_slow_clients, also after a failure: later tests need the
 * descriptors back below 1024. */
static int close_pressure(void **state)
{
    (void)state;
    for (int i = 0; i < HELD; i++)
        if (g_held[i] > 0) close(g_held[i]);
    for (int i = 0; i < SLOW; i++)
        if (g_slow[i] > 0) close(g_slow[i]);
    memset(g_held, 0, sizeof g_held);
    memset(g_slow, 0, sizeof g_slow);
    fx_http_stop(g_ph);
    g_ph = NULL;
    return 0;
}

static void http_fd_pressure_and_slow_clients(void **state)
{
    (void)state;
    const int64_t slowf = getenv("FXT_SANITIZED") ? 3 : 1; /* sanitizer builds run slower */
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < HELD + SLOW + 200) {
        rl.rlim_cur = rl.rlim_max < HELD + SLOW + 200 ? rl.rlim_max : HELD + SLOW + 200;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
        if (rl.rlim_cur < HELD + SLOW + 200)
            fail_msg("RLIMIT_NOFILE hard limit %llu is too low for this test",
                     (unsigned long long)rl.rlim_max);
    }
    fx_http *h = g_ph = start_ok(NULL);
    int port = fx_http_port(h);
    int *held = g_held;
    for (int i = 0; i < HELD; i++) {
        held[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        assert_true(held[i] >= 0);
    }
    assert_true(held[HELD - 1] >= 1024);

    /* 64 slow clients: a request head a byte at a time (every 50 ms), never the blank line. */
    int *slow = g_slow;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < SLOW; i++) {
        slow[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(slow[i] >= 0);
        assert_int_equal(connect(slow[i], (struct sockaddr *)&sa, sizeof sa), 0);
    }
    const char *head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    size_t hl = strlen(head);
    for (size_t k = 0; k < 20; k++) {
        for (int i = 0; i < SLOW; i++)
            if (send(slow[i], k < hl ? head + k : "a", 1, MSG_NOSIGNAL) != 1)
                fail_msg("slow client %d: dropped by the server (%s)", i, strerror(errno));
        struct timespec ts = {0, 50 * 1000 * 1000}; /* pacing the slow clients, not a sync */
        nanosleep(&ts, NULL);
    }

    CURL *c = curl_easy_init();
    for (int i = 0; i < 5; i++) {
        resp r;
        int64_t t0 = fxt_now_ms();
        request(c, port, NULL, "/healthz", NULL, &r);
        int64_t took = fxt_now_ms() - t0;
        assert_int_equal(r.status, 200);
        if (took >= 1000 * slowf) fail_msg("/healthz took %lld ms", (long long)took);
        /* keep the slow clients dripping */
        for (int k = 0; k < SLOW; k++)
            if (send(slow[k], "a", 1, MSG_NOSIGNAL) != 1)
                fail_msg("slow client %d: dropped by the server (%s)", k, strerror(errno));
    }
    curl_easy_cleanup(c);

    char req[4096];
    char q[3001];
    memset(q, 'a', 3000);
    q[3000] = '\0';
    snprintf(req, sizeof req, "GET /healthz?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", q);
    int64_t took = 0;
    assert_int_equal(raw_request(port, req, 2000, &took), 200);
    for (int i = 0; i < 3000; i += 2) {
        q[i] = 'a';
        q[i + 1] = '&';
    }
    snprintf(req, sizeof req, "GET /healthz?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", q);
    int st = raw_request(port, req, 3000, &took);
    if (st < 0 || (st > 0 && (st < 400 || st >= 500)) || took >= 1000 * slowf)
        fail_msg("1,500 empty query arguments: status %d after %lld ms (want 4xx or a close, "
                 "promptly)", st, (long long)took);

    /* the slow clients were never dropped */
    for (int i = 0; i < SLOW; i++) {
        struct pollfd p = {.fd = slow[i], .events = POLLIN};
        assert_int_equal(poll(&p, 1, 0), 0);
    }
    fx_http_stop(h);
    g_ph = NULL;
}

static void http_slow_head_closed(void **state)
{
    (void)state;
    fx_http *h = start_ok(NULL);
    int port = fx_http_port(h);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int slow = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(slow >= 0 && silent >= 0);
    assert_int_equal(connect(slow, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(connect(silent, (struct sockaddr *)&sa, sizeof sa), 0);
    int64_t t0 = fxt_now_ms();
    const char *head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    size_t hl = strlen(head), k = 0;
    int64_t slow_closed = -1, silent_closed = -1;
    while ((slow_closed < 0 || silent_closed < 0) && fxt_now_ms() - t0 < 10000) {
        if (slow_closed < 0 && send(slow, k < hl ? head + k : "a", 1, MSG_NOSIGNAL) != 1)
            slow_closed = fxt_now_ms() - t0; /* reset by the server */
        k++;
        struct pollfd p[2] = {{.fd = slow, .events = POLLIN}, {.fd = silent, .events = POLLIN}};
        if (poll(p, 2, 100) > 0) { /* readable: the end of the stream (nothing else is sent) */
            char c;
            if (slow_closed < 0 && p[0].revents && recv(slow, &c, 1, MSG_DONTWAIT) <= 0)
                slow_closed = fxt_now_ms() - t0;
            if (silent_closed < 0 && p[1].revents && recv(silent, &c, 1, MSG_DONTWAIT) <= 0)
                silent_closed = fxt_now_ms() - t0;
        }
    }
    close(slow);
    close(silent);
    /* a prompt client is not affected */
    resp r;
    request(NULL, port, NULL, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    fx_http_stop(h);
    if (slow_closed < 4500 || slow_closed > 7000 || silent_closed < 4500 || silent_closed > 7000)
        fail_msg("closed after %lld ms (trickling) and %lld ms (silent), want 5 s (4.5-7 s)",
                 (long long)slow_closed, (long long)silent_closed);
}

/* ---- systemd units -------------------------------------------------------------------------------- */

static bool find_tool(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s:/usr/bin:/bin:/usr/sbin:/sbin", path ? path : "");
    for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/%s", dir, name);
        if (access(out, X_OK) == 0) return true;
    }
    return false;
}

/* Copy src to dst replacing every "/usr/local/bin/fluxon-bridge" by exe. */
static void copy_unit(const char *src, const char *dst, const char *exe)
{
    FILE *in = fopen(src, "r");
    if (!in) fail_msg("cannot open %s (run from the project root): %s", src, strerror(errno));
    FILE *out = fopen(dst, "w");
    assert_non_null(out);
    static const char needle[] = "/usr/local/bin/fluxon-bridge";
    char line[4096];
    while (fgets(line, sizeof line, in)) {
        char *p = line, *hit;
        while ((hit = strstr(p, needle)) != NULL) {
            fwrite(p, 1, (size_t)(hit - p), out);
            fputs(exe, out);
            p = hit + strlen(needle);
        }
        fputs(p, out);
    }
    fclose(in);
    fclose(out);
}

/* Run `systemd-analyze verify --man=no unit`; returns its exit status, output in out. */
static int run_verify(const char *tool, const char *unit, char *out, size_t cap)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        if (chdir("/") != 0) _exit(126);
        execl(tool, tool, "verify", "--man=no", unit, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    int64_t deadline = fxt_now_ms() + 30000;
    for (;;) {
        ssize_t k = read(pfd[0], out + n, cap - 1 - n);
        if (k > 0) {
            n += (size_t)k;
            if (n >= cap - 1) n = cap - 1;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        break;
    }
    out[n] = '\0';
    close(pfd[0]);
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (fxt_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("systemd-analyze verify %s timed out", unit);
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void systemd_units_verify(void **state)
{
    (void)state;
    char tool[512];
    if (!find_tool("systemd-analyze", tool, sizeof tool)) {
        print_message("systemd-analyze not installed: skipping the unit check\n");
        skip();
    }
    char exe[512];
    if (!find_tool("true", exe, sizeof exe)) fail_msg("no 'true' binary");
    const char *base = getenv("FXT_TMPDIR");
    char dir[600];
    snprintf(dir, sizeof dir, "%s/units.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) fail_msg("mkdtemp %s: %s", dir, strerror(errno));
    static const struct {
        const char *src, *as;
    } units[] = {{"deploy/systemd/fluxon-bridge.service", "fluxon-bridge.service"},
                 {"deploy/systemd/fluxon-bridge@.service", "fluxon-bridge@bridge-a.service"}};
    char paths[2][700];
    char out[8192];
    int failures = 0;
    for (size_t i = 0; i < 2; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", dir, units[i].as);
        copy_unit(units[i].src, paths[i], exe);
        int rc = run_verify(tool, paths[i], out, sizeof out);
        if (rc != 0 || out[0] != '\0') {
            print_error("systemd-analyze verify %s: exit %d\n%s\n", units[i].src, rc, out);
            failures++;
        }
    }
    for (size_t i = 0; i < 2; i++) unlink(paths[i]);
    rmdir(dir);
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(http_healthz_ok_then_503),
        cmocka_unit_test(http_metrics_text),
        cmocka_unit_test(http_not_found_and_method),
        cmocka_unit_test(http_listen_errors),
        cmocka_unit_test(http_stop_prompt),
        cmocka_unit_test_teardown(http_fd_pressure_and_slow_clients, close_pressure),
        cmocka_unit_test(http_slow_head_closed),
        cmocka_unit_test(systemd_units_verify),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
