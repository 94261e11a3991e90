/* fxt_proxy.c -- a deterministic, filtering TCP proxy in front of etcd (see fxt_proxy.h). */
#include "fxt_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PX_MAXCONN 256

typedef struct px_conn {
    struct fxt_proxy *px;
    int cfd, sfd;
    pthread_t t_c2s, t_s2c;
    bool started;
    atomic_bool swallow; /* FXT_PROXY_DROP_ANSWER: the next bytes from etcd are dropped */
    atomic_int cls;      /* accounting class of the last request forwarded (-1: none) */
} px_conn;

typedef struct px_rule {
    size_t n;
    char needle[FXT_PROXY_NEEDLES][FXT_PROXY_NEEDLE_MAX];
} px_rule;

struct fxt_proxy {
    int lfd, port, up_port;
    pthread_t t_acc;
    atomic_bool stop;
    pthread_mutex_t mu; /* rules, conns */
    px_rule rules[FXT_PROXY_RULES];
    size_t n_rules;
    px_rule counted; /* fxt_proxy_fail_next (under mu) */
    fxt_proxy_mode counted_mode;
    int counted_left;
    atomic_int failed[2];
    atomic_int blocked;
    pthread_cond_t hold_cv; /* hold lifted or stop (with mu) */
    px_rule hold;           /* under mu; n == 0: no hold */
    int held, held_peak;    /* under mu */
    px_conn *conns[PX_MAXCONN];
    int nconn;
    char ep[64];
    const char *eps[1];
    _Atomic(fxt_proxy_classify_fn) classify;
    atomic_llong st_reqs[FXT_PROXY_CLASSES], st_req_bytes[FXT_PROXY_CLASSES],
        st_resp_bytes[FXT_PROXY_CLASSES];
};

static bool px_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static void px_kill(px_conn *c)
{
    shutdown(c->cfd, SHUT_RDWR);
    shutdown(c->sfd, SHUT_RDWR);
}

static void *px_s2c(void *arg)
{
    px_conn *c = arg;
    char buf[65536];
    for (;;) {
        ssize_t n = recv(c->sfd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n > 0 && atomic_load(&c->swallow)) break; /* etcd answered: the client never sees it */
        int cls = atomic_load(&c->cls);
        if (n > 0 && cls >= 0) atomic_fetch_add(&c->px->st_resp_bytes[cls], (long long)n);
        if (n <= 0 || !px_write_all(c->cfd, buf, (size_t)n)) break;
    }
    px_kill(c);
    return NULL;
}

static bool rule_hit(const px_rule *ru, const char *body, size_t len)
{
    bool all = ru->n > 0;
    for (size_t i = 0; i < ru->n && all; i++)
        all = memmem(body, len, ru->needle[i], strlen(ru->needle[i])) != NULL;
    return all;
}

/* Does the body match the counted rule? Consumes one count; -1: no, else the mode. */
static int px_match_counted(struct fxt_proxy *px, const char *body, size_t len)
{
    int mode = -1;
    pthread_mutex_lock(&px->mu);
    if (px->counted_left != 0 && rule_hit(&px->counted, body, len)) {
        mode = (int)px->counted_mode;
        if (px->counted_left > 0) px->counted_left--;
        atomic_fetch_add(&px->failed[mode], 1);
    }
    pthread_mutex_unlock(&px->mu);
    return mode;
}

/* Does the body match an armed rule? */
static bool px_match(struct fxt_proxy *px, const char *body, size_t len)
{
    bool hit = false;
    pthread_mutex_lock(&px->mu);
    for (size_t r = 0; r < px->n_rules && !hit; r++) hit = rule_hit(&px->rules[r], body, len);
    pthread_mutex_unlock(&px->mu);
    return hit;
}

/* Hold a request matching the hold rule until the hold is lifted or the proxy stops. */
static void px_hold(struct fxt_proxy *px, const char *body, size_t len)
{
    pthread_mutex_lock(&px->mu);
    const px_rule *ru = &px->hold;
    bool all = ru->n > 0;
    for (size_t i = 0; i < ru->n && all; i++)
        all = memmem(body, len, ru->needle[i], strlen(ru->needle[i])) != NULL;
    if (all) {
        px->held++;
        if (px->held > px->held_peak) px->held_peak = px->held;
        while (px->hold.n > 0 && !atomic_load(&px->stop)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&px->hold_cv, &px->mu, &ts);
        }
        px->held--;
    }
    pthread_mutex_unlock(&px->mu);
}

/* Request accounting: classify the request (request line + body) and count it. */
static void px_account(px_conn *c, const char *req, size_t hlen, size_t clen)
{
    fxt_proxy_classify_fn fn = atomic_load(&c->px->classify);
    if (!fn) return;
    const char *eol = memchr(req, '\r', hlen);
    int cls = fn(req, eol ? (size_t)(eol - req) : hlen, req + hlen, clen);
    if (cls < 0 || cls >= FXT_PROXY_CLASSES) cls = -1;
    atomic_store(&c->cls, cls);
    if (cls < 0) return;
    atomic_fetch_add(&c->px->st_reqs[cls], 1);
    atomic_fetch_add(&c->px->st_req_bytes[cls], (long long)(hlen + clen));
}

static void *px_c2s(void *arg)
{
    px_conn *c = arg;
    struct fxt_proxy *px = c->px;
    size_t cap = 1 << 16, len = 0, hdr_sent = 0; /* hdr_sent: bytes of the current request sent */
    char *buf = malloc(cap);
    if (!buf) abort();
    for (;;) {
        /* Complete requests in buf? */
        for (;;) {
            char *eoh = len ? memmem(buf, len, "\r\n\r\n", 4) : NULL;
            if (!eoh) break;
            size_t hlen = (size_t)(eoh - buf) + 4, clen = 0;
            for (char *h = buf; h < eoh; h = memchr(h, '\n', (size_t)(eoh - h)) + 1) {
                if (!strncasecmp(h, "Content-Length:", 15)) clen = strtoul(h + 15, NULL, 10);
                if (!memchr(h, '\n', (size_t)(eoh - h))) break;
            }
            bool expect = memmem(buf, hlen, "100-continue", 12) != NULL;
            if (expect && hdr_sent == 0) {
                if (!px_write_all(c->sfd, buf, hlen)) goto out;
                hdr_sent = hlen;
            }
            if (len < hlen + clen) break; /* body incomplete */
            int mode = clen ? px_match_counted(px, buf + hlen, clen) : -1;
            if (mode == FXT_PROXY_DROP_REQUEST) goto out;
            if (mode == FXT_PROXY_DROP_ANSWER) {
                /* Forward, then read nothing more from the client: px_s2c drops the answer and
                 * closes the connection once etcd has applied the request and answered. */
                atomic_store(&c->swallow, true);
                if (!px_write_all(c->sfd, buf + hdr_sent, hlen + clen - hdr_sent)) goto out;
                free(buf);
                return NULL;
            }
            if (clen && px_match(px, buf + hlen, clen)) {
                atomic_fetch_add(&px->blocked, 1);
                goto out;
            }
            if (clen) px_hold(px, buf + hlen, clen);
            px_account(c, buf, hlen, clen);
            if (!px_write_all(c->sfd, buf + hdr_sent, hlen + clen - hdr_sent)) goto out;
            memmove(buf, buf + hlen + clen, len - hlen - clen);
            len -= hlen + clen;
            hdr_sent = 0;
        }
        if (len == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) abort();
            buf = nb;
        }
        ssize_t n = recv(c->cfd, buf + len, cap - len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
out:
    free(buf);
    px_kill(c);
    return NULL;
}

static void *px_accept(void *arg)
{
    struct fxt_proxy *px = arg;
    while (!atomic_load(&px->stop)) {
        struct pollfd p = {.fd = px->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        int cfd = accept4(px->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0) continue;
        int sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)px->up_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (sfd < 0 || connect(sfd, (struct sockaddr *)&a, sizeof a) != 0) {
            if (sfd >= 0) close(sfd);
            close(cfd);
            continue;
        }
        px_conn *c = calloc(1, sizeof *c);
        pthread_mutex_lock(&px->mu);
        bool room = c && px->nconn < PX_MAXCONN;
        if (room) px->conns[px->nconn++] = c;
        pthread_mutex_unlock(&px->mu);
        if (!room) {
            fprintf(stderr, "fxt_proxy: connection limit (%d) reached; refusing\n", PX_MAXCONN);
            free(c);
            close(sfd);
            close(cfd);
            continue;
        }
        c->px = px;
        atomic_init(&c->swallow, false);
        atomic_init(&c->cls, -1);
        c->cfd = cfd;
        c->sfd = sfd;
        c->started = pthread_create(&c->t_c2s, NULL, px_c2s, c) == 0;
        if (c->started && pthread_create(&c->t_s2c, NULL, px_s2c, c) != 0) {
            px_kill(c);
            pthread_join(c->t_c2s, NULL);
            c->started = false;
        }
        if (!c->started) px_kill(c);
    }
    return NULL;
}

fxt_proxy *fxt_proxy_start(int up_port)
{
    struct fxt_proxy *px = calloc(1, sizeof *px);
    if (!px) return NULL;
    pthread_mutex_init(&px->mu, NULL);
    pthread_cond_init(&px->hold_cv, NULL);
    atomic_init(&px->stop, false);
    atomic_init(&px->blocked, 0);
    atomic_init(&px->failed[0], 0);
    atomic_init(&px->failed[1], 0);
    px->up_port = up_port;
    px->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (px->lfd < 0 || bind(px->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(px->lfd, 128) != 0 || getsockname(px->lfd, (struct sockaddr *)&a, &al) != 0) {
        fprintf(stderr, "fxt_proxy: listen: %s\n", strerror(errno));
        if (px->lfd >= 0) close(px->lfd);
        pthread_mutex_destroy(&px->mu);
        pthread_cond_destroy(&px->hold_cv);
        free(px);
        return NULL;
    }
    px->port = ntohs(a.sin_port);
    snprintf(px->ep, sizeof px->ep, "http://127.0.0.1:%d", px->port);
    px->eps[0] = px->ep;
    if (pthread_create(&px->t_acc, NULL, px_accept, px) != 0) {
        fprintf(stderr, "fxt_proxy: cannot start the accept thread\n");
        close(px->lfd);
        pthread_mutex_destroy(&px->mu);
        pthread_cond_destroy(&px->hold_cv);
        free(px);
        return NULL;
    }
    return px;
}

const char *const *fxt_proxy_eps(fxt_proxy *px) { return px->eps; }

int fxt_proxy_blocked(fxt_proxy *px) { return atomic_load(&px->blocked); }

int fxt_proxy_failed(fxt_proxy *px, fxt_proxy_mode mode)
{
    return atomic_load(&px->failed[mode == FXT_PROXY_DROP_ANSWER ? 1 : 0]);
}

static void rule_set(px_rule *r, const char *const *needles, size_t n)
{
    if (n > FXT_PROXY_NEEDLES) n = FXT_PROXY_NEEDLES;
    r->n = n;
    for (size_t i = 0; i < n; i++) snprintf(r->needle[i], sizeof r->needle[i], "%s", needles[i]);
}

void fxt_proxy_block(fxt_proxy *px, const char *const *needles, size_t n)
{
    pthread_mutex_lock(&px->mu);
    px->n_rules = 0;
    if (needles && n) rule_set(&px->rules[px->n_rules++], needles, n);
    pthread_mutex_unlock(&px->mu);
}

void fxt_proxy_block_add(fxt_proxy *px, const char *const *needles, size_t n)
{
    if (!needles || !n) return;
    pthread_mutex_lock(&px->mu);
    if (px->n_rules < FXT_PROXY_RULES)
        rule_set(&px->rules[px->n_rules++], needles, n);
    else
        fprintf(stderr, "fxt_proxy: %d rules armed already; rule ignored\n", FXT_PROXY_RULES);
    pthread_mutex_unlock(&px->mu);
}

void fxt_proxy_fail_next(fxt_proxy *px, fxt_proxy_mode mode, const char *const *needles, size_t n,
                         int count)
{
    pthread_mutex_lock(&px->mu);
    px->counted_left = 0;
    if (needles && n && count) {
        rule_set(&px->counted, needles, n);
        px->counted_mode = mode == FXT_PROXY_DROP_ANSWER ? FXT_PROXY_DROP_ANSWER
                                                         : FXT_PROXY_DROP_REQUEST;
        px->counted_left = count;
    }
    pthread_mutex_unlock(&px->mu);
}

void fxt_proxy_hold(fxt_proxy *px, const char *const *needles, size_t n)
{
    pthread_mutex_lock(&px->mu);
    px->hold.n = 0;
    if (needles && n) rule_set(&px->hold, needles, n);
    pthread_cond_broadcast(&px->hold_cv);
    pthread_mutex_unlock(&px->mu);
}

int fxt_proxy_held(fxt_proxy *px)
{
    pthread_mutex_lock(&px->mu);
    int n = px->held;
    pthread_mutex_unlock(&px->mu);
    return n;
}

int fxt_proxy_held_peak(fxt_proxy *px)
{
    pthread_mutex_lock(&px->mu);
    int n = px->held_peak;
    pthread_mutex_unlock(&px->mu);
    return n;
}

void fxt_proxy_b64(const char *s, char *out, size_t cap)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *k = (const unsigned char *)s;
    size_t n = strlen(s), o = 0;
    if (!cap) return;
    for (size_t i = 0; i < n && o + 5 < cap; i += 3) {
        unsigned v = (unsigned)k[i] << 16 | (i + 1 < n ? (unsigned)k[i + 1] << 8 : 0) |
                     (i + 2 < n ? k[i + 2] : 0);
        out[o++] = tbl[(v >> 18) & 63];
        out[o++] = tbl[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tbl[v & 63] : '=';
    }
    out[o] = 0;
}

void fxt_proxy_set_classifier(fxt_proxy *px, fxt_proxy_classify_fn fn) { atomic_store(&px->classify, fn); }

void fxt_proxy_class_stats_get(fxt_proxy *px, int cls, fxt_proxy_class_stats *out)
{
    memset(out, 0, sizeof *out);
    if (cls < 0 || cls >= FXT_PROXY_CLASSES) return;
    out->reqs = atomic_load(&px->st_reqs[cls]);
    out->req_bytes = atomic_load(&px->st_req_bytes[cls]);
    out->resp_bytes = atomic_load(&px->st_resp_bytes[cls]);
}

size_t fxt_proxy_unb64(const char *in, size_t len, char *out, size_t cap)
{
    unsigned v = 0;
    int bits = 0;
    size_t o = 0;
    if (!cap) return 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)in[i], d;
        if (c >= 'A' && c <= 'Z') d = c - 'A';
        else if (c >= 'a' && c <= 'z') d = c - 'a' + 26;
        else if (c >= '0' && c <= '9') d = c - '0' + 52;
        else if (c == '+') d = 62;
        else if (c == '/') d = 63;
        else break;
        v = (v << 6) | (unsigned)d;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 < cap) out[o++] = (char)((v >> bits) & 0xff);
        }
    }
    out[o] = 0;
    return o;
}

void fxt_proxy_block_key(fxt_proxy *px, const char *key)
{
    if (!key) {
        fxt_proxy_block(px, NULL, 0);
        return;
    }
    char b[FXT_PROXY_NEEDLE_MAX];
    fxt_proxy_b64(key, b, sizeof b);
    const char *nd[1] = {b};
    fxt_proxy_block(px, nd, 1);
}

void fxt_proxy_stop(fxt_proxy *px)
{
    if (!px) return;
    atomic_store(&px->stop, true);
    pthread_mutex_lock(&px->mu);
    pthread_cond_broadcast(&px->hold_cv);
    pthread_mutex_unlock(&px->mu);
    pthread_join(px->t_acc, NULL);
    close(px->lfd);
    for (int i = 0; i < px->nconn; i++) {
        px_conn *c = px->conns[i];
        px_kill(c);
        if (c->started) {
            pthread_join(c->t_c2s, NULL);
            pthread_join(c->t_s2c, NULL);
        }
        close(c->cfd);
        close(c->sfd);
        free(c);
    }
    pthread_mutex_destroy(&px->mu);
    pthread_cond_destroy(&px->hold_cv);
    free(px);
}
