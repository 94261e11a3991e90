/* leaf.c -- minimal NATS leafnode publisher (see leaf.h for the protocol and the threads).
 *
 * State under l->mu: fd (writes), state, wbuf, want_out, broken, max_payload, ping/pong
 * counters, why, server_name. `stop` and `state` are also atomics so the I/O thread and
 * fx_leaf_connected can read them without the lock. The read side (the protocol reader rd,
 * handshake flags) belongs to the I/O thread alone.
 *
 * Queue interest (qlk, a rwlock): the hub's LS+/LS- lines for queue subscriptions, kept as
 * (subject pattern, queue name, weight) so that publishes can name the queue groups (see
 * leaf.h). Written by the I/O thread only, read by publishers. mu and qlk are never held
 * together: fx_leaf_publish collects the names under qlk, releases it, then takes mu.
 * The same nodes record plain interest (LS+/LS- without a queue: `plain`), for
 * fx_leaf_has_interest.
 */
#include "leaf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fx_log.h"
#include "fx_time.h"
#include "fx_url.h"
#include "leaf_proto.h"
#include "subject.h"

#define LINE_MAX_IN (64 * 1024)  /* longest protocol line accepted from the server */
#define WBUF_INIT (64 * 1024)
#define CORK_FLUSH_BYTES (32 * 1024) /* a corked batch is sent once this much is pending */
#define CTRL_RESERVE 4096        /* PING/PONG may go this far over max_pending */
#define CTRL_LINE_MAX 4096       /* nats-server's default max_control_line */
#define ERR_TEXT_MAX 200         /* -ERR text quoted in logs */
#define LQ_MAX_ENTRIES 65536     /* (subject, queue) pairs remembered from LS+ */
#define LQ_BUCKETS 4096          /* hash buckets over the subject (power of two) */

/* Queue interest: one node per subject (pattern) with its queue groups. Literal subjects are
 * found through the hash; wildcard patterns are also on the `wild` list and matched one by one. */
typedef struct lq_queue {
    struct lq_queue *next;
    int64_t weight;
    char name[];
} lq_queue;

typedef struct lq_subj {
    struct lq_subj *hnext, *wnext;
    lq_queue *queues;
    bool wild;
    bool valid; /* wild and a valid pattern: matched without validating it again */
    bool plain; /* a plain (non-queue) subscriber is interested (LS+ without a queue) */
    char subject[];
} lq_subj;

enum { ST_DOWN = 0, ST_UP = 1 };

struct fx_leaf {
    fx_leaf_url u;
    char name[128];
    char where[300]; /* "host:port" for logs and status (never credentials) */
    int64_t connect_timeout_ms, ping_interval_ms, rc_min_ms, rc_max_ms;
    int max_pings_out;
    size_t max_pending;
    int wake_fd;
    pthread_t thr;
    bool started;
    atomic_bool stop;
    atomic_int state;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd;
    bool want_out; /* the socket said EAGAIN: the I/O thread waits for POLLOUT */
    bool broken;   /* a write failed: the I/O thread drops the connection */
    char *wbuf;
    size_t wcap, woff, wlen;
    int64_t max_payload;
    uint64_t gen, ping_seq, pong_seq;
    char why[256];
    char server_name[128];

    _Atomic uint64_t st_connects, st_msgs, st_bytes, st_server_pings, st_pongs, st_errors, st_writes;
    _Atomic uint64_t st_q_dropped, st_q_truncated, st_q_bad;

    pthread_rwlock_t qlk;
    lq_subj **qb;     /* LQ_BUCKETS heads, allocated at the first queue LS+ */
    lq_subj *qwild;   /* wildcard subjects */
    size_t qn;        /* (subject, queue) entries */
    bool q_full_logged;
    size_t pn;        /* subjects with plain interest */
    bool p_full;      /* a plain LS+ was not recorded: fx_leaf_has_interest answers true */

    /* I/O thread only */
    fx_lp_reader *rd; /* leaf_proto.h: what the server sends, framed */
    int hs_fd;          /* >= 0 during the handshake: PONG answers go straight to it */
    bool feed_info;     /* fx_leaf_feed: the INFO line was seen */
    bool hs_pong;       /* the handshake PONG arrived */
    char hs_err[256];   /* -ERR received during the handshake */
    uint64_t rng;
    fx_log_slot slot_err, slot_conn, slot_q;
};

/* ---- URL ----------------------------------------------------------------------------------- */

static void wipe_url(fx_leaf_url *u)
{
    explicit_bzero(u->user, sizeof u->user);
    explicit_bzero(u->pass, sizeof u->pass);
    explicit_bzero(u->host, sizeof u->host);
    u->has_user = false;
}

static int uerr(char *err, size_t errlen, const char *msg)
{
    if (err && errlen) snprintf(err, errlen, "%s", msg);
    return -1;
}

/* lease/fx_url.h parses; this maps its refusals to the leaf's wording. */
int fx_leaf_url_parse(const char *url, fx_leaf_url *out, char *err, size_t errlen)
{
    if (!url || !out) return uerr(err, errlen, "missing URL");
    if (strncmp(url, "tls://", 6) == 0)
        return uerr(err, errlen,
                    "tls:// is not supported for the leaf connection (use a plain nats:// "
                    "leafnode listener on loopback)");
    fx_url u;
    char why[160];
    fx_url_status st = fx_url_parse(url, FX_URL_USERINFO, &u, why, sizeof why);
    if (st == FX_URL_OK && strcmp(u.scheme, "nats") != 0) st = FX_URL_ESCHEME;
    if (st == FX_URL_ESCHEME && strncmp(url, "nats://", 7) != 0) {
        fx_url_wipe(&u);
        return uerr(err, errlen, "must be a nats://host:port URL");
    }
    const char *msg = why;
    switch (st) {
    case FX_URL_OK: break;
    case FX_URL_EHOST:
    case FX_URL_ESCHEME: msg = "must be nats://host:port with a host (IPv6 in brackets)"; break;
    case FX_URL_EPATH:
    case FX_URL_EQUERY:
    case FX_URL_EFRAGMENT: msg = "must not have a path"; break;
    case FX_URL_EUSER: msg = "invalid user name (bad %-escape or too long)"; break;
    case FX_URL_EPASSWORD: msg = "invalid password (bad %-escape or too long)"; break;
    default: break;
    }
    if (st != FX_URL_OK) return uerr(err, errlen, msg);
    if (u.has_user && !u.user[0]) {
        fx_url_wipe(&u);
        return uerr(err, errlen, "empty user name before '@'");
    }
    fx_leaf_url r;
    memset(&r, 0, sizeof r);
    bool fit = strlen(u.host) < sizeof r.host && strlen(u.user) < sizeof r.user &&
               strlen(u.password) < sizeof r.pass;
    if (fit) {
        snprintf(r.host, sizeof r.host, "%s", u.host);
        r.port = u.port ? u.port : FX_LEAF_DEFAULT_PORT;
        r.has_user = u.has_user;
        snprintf(r.user, sizeof r.user, "%s", u.user);
        snprintf(r.pass, sizeof r.pass, "%s", u.password);
        *out = r;
    }
    fx_url_wipe(&u);
    wipe_url(&r);
    return fit ? 0 : uerr(err, errlen, "user, password or host too long");
}

/* ---- small helpers --------------------------------------------------------------------------- */

static void wake(fx_leaf *l)
{
    uint64_t one = 1;
    ssize_t w = write(l->wake_fd, &one, sizeof one);
    (void)w; /* EAGAIN only when the counter is saturated: already awake */
}

static void drain_wake(fx_leaf *l)
{
    uint64_t v;
    ssize_t r = read(l->wake_fd, &v, sizeof v);
    (void)r;
}

static uint64_t rnd(fx_leaf *l)
{
    l->rng ^= l->rng >> 12;
    l->rng ^= l->rng << 25;
    l->rng ^= l->rng >> 27;
    return l->rng * 0x2545F4914F6CDD1DULL;
}

/* Poll fd for events (fd < 0: only the stop eventfd) until deadline. Returns 1 ready (revents
 * in *rev), 0 timeout (or a wake-up when on_wake: the caller re-evaluates), -1 stop requested. */
static int wait_io(fx_leaf *l, int fd, short events, int64_t deadline, short *rev, bool on_wake)
{
    for (;;) {
        if (atomic_load(&l->stop)) return -1;
        int64_t left = fx_ms_left(deadline);
        struct pollfd p[2] = {{.fd = l->wake_fd, .events = POLLIN}, {.fd = fd, .events = events}};
        int n = poll(p, fd >= 0 ? 2 : 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 0;
        if (p[0].revents) drain_wake(l);
        if (atomic_load(&l->stop)) return -1;
        if (fd >= 0 && p[1].revents) {
            if (rev) *rev = p[1].revents;
            return 1;
        }
        if (n == 0 || left == 0 || (on_wake && p[0].revents)) return 0;
    }
}

static void set_why(fx_leaf *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_why(fx_leaf *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&l->mu);
    vsnprintf(l->why, sizeof l->why, fmt, ap);
    pthread_mutex_unlock(&l->mu);
    va_end(ap);
}

/* Text safe to log: printable ASCII only, bounded. */
static void sanitize(const char *s, size_t n, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[j++] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c;
    }
    out[j] = '\0';
}

/* ---- write buffer (under mu) ------------------------------------------------------------------ */

static bool wroom_locked(fx_leaf *l, size_t n, size_t limit)
{
    if (l->wlen + n > limit) return false;
    if (l->woff + l->wlen + n <= l->wcap) return true;
    if (l->woff) {
        memmove(l->wbuf, l->wbuf + l->woff, l->wlen);
        l->woff = 0;
        if (l->wlen + n <= l->wcap) return true;
    }
    size_t nc = l->wcap ? l->wcap : WBUF_INIT;
    while (nc < l->wlen + n) nc *= 2;
    if (nc > l->max_pending + CTRL_RESERVE) nc = l->max_pending + CTRL_RESERVE;
    if (nc < l->wlen + n) return false;
    char *nb = realloc(l->wbuf, nc);
    if (!nb) return false;
    l->wbuf = nb;
    l->wcap = nc;
    return true;
}

static void wput_locked(fx_leaf *l, const void *p, size_t n)
{
    if (n) memcpy(l->wbuf + l->woff + l->wlen, p, n);
    l->wlen += n;
}

/* Write what the socket takes now (non-blocking). */
static void flush_locked(fx_leaf *l)
{
    while (l->wlen && l->fd >= 0 && !l->broken) {
        ssize_t n = send(l->fd, l->wbuf + l->woff, l->wlen, MSG_NOSIGNAL | MSG_DONTWAIT);
        atomic_fetch_add_explicit(&l->st_writes, 1, memory_order_relaxed);
        if (n > 0) {
            l->woff += (size_t)n;
            l->wlen -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!l->want_out) {
                l->want_out = true;
                wake(l);
            }
            return;
        }
        char eb[96];
        snprintf(l->why, sizeof l->why, "write failed: %s",
                 n == 0 ? "no progress" : strerror_r(errno, eb, sizeof eb));
        l->broken = true;
        wake(l);
        return;
    }
    if (!l->wlen) {
        l->woff = 0;
        l->want_out = false;
    }
}

/* Control line (PING/PONG): allowed a little over the bound. */
static bool ctrl_locked(fx_leaf *l, const char *line)
{
    size_t n = strlen(line);
    if (l->fd < 0 || !wroom_locked(l, n, l->max_pending + CTRL_RESERVE)) return false;
    wput_locked(l, line, n);
    if (!l->want_out) flush_locked(l);
    return true;
}

/* ---- socket I/O with deadlines (handshake) ------------------------------------------------------ */

static fx_err write_all(fx_leaf *l, int fd, const char *p, size_t n, int64_t deadline)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = wait_io(l, fd, POLLOUT, deadline, NULL, false);
            if (r < 0) return FX_ECANCELED;
            if (r == 0) return fx_seterr(FX_ETIMEDOUT, "write timed out");
            continue;
        }
        char eb[96];
        return fx_seterr(FX_EUNAVAIL, "write failed: %s", strerror_r(errno, eb, sizeof eb));
    }
    return FX_OK;
}

static fx_err tcp_connect(fx_leaf *l, int64_t deadline, int *out)
{
    *out = -1;
    char port[16];
    snprintf(port, sizeof port, "%d", l->u.port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(l->u.host, port, &hints, &res);
    if (g != 0) return fx_seterr(FX_EUNAVAIL, "resolve %s: %s", l->u.host, gai_strerror(g));
    fx_err e = fx_seterr(FX_EUNAVAIL, "no address for %s", l->u.host);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            short rev = 0;
            int r = wait_io(l, fd, POLLOUT, deadline, &rev, false);
            if (r < 0) {
                close(fd);
                e = FX_ECANCELED;
                break;
            }
            if (r == 0) {
                close(fd);
                e = fx_seterr(FX_ETIMEDOUT, "connect timed out");
                continue;
            }
            int so = 0;
            socklen_t sl = sizeof so;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0) so = errno;
            rc = so ? -1 : 0;
            errno = so;
        }
        if (rc != 0) {
            char eb[96];
            e = fx_seterr(FX_EUNAVAIL, "connect: %s", strerror_r(errno, eb, sizeof eb));
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        *out = fd;
        e = FX_OK;
        break;
    }
    freeaddrinfo(res);
    return e;
}

/* ---- queue interest (LS+ / LS-) ------------------------------------------------------------------ */

static uint32_t lq_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h & (LQ_BUCKETS - 1);
}

static bool lq_is_wild(const char *s)
{
    for (const char *t = s; *t;) {
        const char *e = strchr(t, '.');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        if (n == 1 && (*t == '*' || *t == '>')) return true;
        if (!e) break;
        t = e + 1;
    }
    return false;
}

static void lq_free_subj(lq_subj *n)
{
    for (lq_queue *q = n->queues, *nx; q; q = nx) {
        nx = q->next;
        free(q);
    }
    free(n);
}

/* Forget every entry (a new connection: the server sends its interest again). */
static void lq_clear(fx_leaf *l)
{
    pthread_rwlock_wrlock(&l->qlk);
    if (l->qb) {
        for (size_t i = 0; i < LQ_BUCKETS; i++) {
            for (lq_subj *n = l->qb[i], *nx; n; n = nx) {
                nx = n->hnext;
                lq_free_subj(n);
            }
            l->qb[i] = NULL;
        }
    }
    l->qwild = NULL;
    l->qn = 0;
    l->q_full_logged = false;
    l->pn = 0;
    l->p_full = false;
    pthread_rwlock_unlock(&l->qlk);
}

/* Under qlk (any mode). */
static lq_subj *lq_find(fx_leaf *l, const char *subject, lq_subj ***link)
{
    if (!l->qb) return NULL;
    lq_subj **pp = &l->qb[lq_hash(subject)];
    for (; *pp; pp = &(*pp)->hnext)
        if (strcmp((*pp)->subject, subject) == 0) break;
    if (link) *link = pp;
    return *pp;
}

/* A new subject entry (no queues, no plain interest) linked at *link (the end of its hash chain,
 * from lq_find) and, for a wildcard subject, on the wildcard list. NULL: out of memory. Under
 * qlk (write). */
static lq_subj *lq_link(fx_leaf *l, lq_subj **link, const char *subject)
{
    size_t sl = strlen(subject) + 1;
    lq_subj *n = malloc(sizeof *n + sl);
    if (!n) return NULL;
    memcpy(n->subject, subject, sl);
    n->queues = NULL;
    n->wild = lq_is_wild(subject);
    n->valid = n->wild && fx_subject_valid(subject, true);
    n->plain = false;
    n->hnext = NULL;
    n->wnext = NULL;
    *link = n;
    if (n->wild) {
        n->wnext = l->qwild;
        l->qwild = n;
    }
    return n;
}

/* LS+ <subject> <queue> <weight>: the weight is the current one (replace). */
static void lq_set(fx_leaf *l, const char *subject, const char *queue, int64_t weight)
{
    pthread_rwlock_wrlock(&l->qlk);
    if (!l->qb && !(l->qb = calloc(LQ_BUCKETS, sizeof *l->qb))) goto nomem;
    lq_subj **link = NULL;
    lq_subj *n = lq_find(l, subject, &link);
    if (n)
        for (lq_queue *q = n->queues; q; q = q->next)
            if (strcmp(q->name, queue) == 0) {
                q->weight = weight;
                pthread_rwlock_unlock(&l->qlk);
                return;
            }
    if (l->qn >= LQ_MAX_ENTRIES) {
        bool first = !l->q_full_logged;
        l->q_full_logged = true;
        pthread_rwlock_unlock(&l->qlk);
        atomic_fetch_add(&l->st_q_dropped, 1);
        if (first)
            FX_WRN("nats leaf: more than %d queue subscriptions announced by %s; messages on "
                   "further ones are published without their queue names (their queue "
                   "subscribers on the hub will not get them)",
                   LQ_MAX_ENTRIES, l->where);
        return;
    }
    size_t ql = strlen(queue) + 1;
    lq_queue *q = malloc(sizeof *q + ql);
    if (!q) goto nomem;
    memcpy(q->name, queue, ql);
    q->weight = weight;
    if (!n && !(n = lq_link(l, link, subject))) {
        free(q);
        goto nomem;
    }
    q->next = n->queues;
    n->queues = q;
    l->qn++;
    pthread_rwlock_unlock(&l->qlk);
    return;
nomem:
    pthread_rwlock_unlock(&l->qlk);
    atomic_fetch_add(&l->st_q_dropped, 1);
    fx_log_ratelimited(&l->slot_q, 10000, FX_LOG_WRN,
                       "nats leaf: out of memory recording a queue subscription");
}

/* Unlink subject entry n (at *link in its hash chain; on the wildcard list too) and free it: it
 * holds neither queues nor plain interest any more. Under qlk (write). */
static void lq_unlink(fx_leaf *l, lq_subj **link, lq_subj *n)
{
    *link = n->hnext;
    if (n->wild)
        for (lq_subj **wp = &l->qwild; *wp; wp = &(*wp)->wnext)
            if (*wp == n) {
                *wp = n->wnext;
                break;
            }
    free(n);
}

/* LS- <subject> <queue> */
static void lq_del(fx_leaf *l, const char *subject, const char *queue)
{
    pthread_rwlock_wrlock(&l->qlk);
    lq_subj **link = NULL;
    lq_subj *n = lq_find(l, subject, &link);
    if (n) {
        for (lq_queue **qp = &n->queues; *qp; qp = &(*qp)->next) {
            if (strcmp((*qp)->name, queue) != 0) continue;
            lq_queue *q = *qp;
            *qp = q->next;
            free(q);
            l->qn--;
            break;
        }
        if (!n->queues && !n->plain) lq_unlink(l, link, n);
    }
    pthread_rwlock_unlock(&l->qlk);
}

/* Append the names of n's queues not yet in out (space-separated) while they fit.
 * Under qlk. */
static void lq_add_names(const lq_subj *n, char *out, size_t cap, size_t *len, int *count,
                         bool *trunc)
{
    for (const lq_queue *q = n->queues; q; q = q->next) {
        size_t ql = strlen(q->name);
        bool dup = false;
        for (const char *p = out; p < out + *len;) {
            const char *e = memchr(p, ' ', (size_t)(out + *len - p));
            size_t tl = e ? (size_t)(e - p) : (size_t)(out + *len - p);
            if (tl == ql && memcmp(p, q->name, ql) == 0) {
                dup = true;
                break;
            }
            if (!e) break;
            p = e + 1;
        }
        if (dup) continue;
        size_t need = ql + (*len ? 1 : 0);
        if (*count >= FX_LEAF_MAX_QUEUES_PER_MSG || *len + need + 1 > cap) {
            *trunc = true;
            continue;
        }
        if (*len) out[(*len)++] = ' ';
        memcpy(out + *len, q->name, ql);
        *len += ql;
        out[*len] = '\0';
        (*count)++;
    }
}

/* The distinct queue names a message on `subject` must carry, space-separated in out. */
static int lq_collect(fx_leaf *l, const char *subject, char *out, size_t cap, bool *trunc)
{
    size_t len = 0;
    int count = 0;
    *trunc = false;
    if (cap) out[0] = '\0';
    if (cap < 2) return 0;
    pthread_rwlock_rdlock(&l->qlk);
    if (l->qn) {
        const lq_subj *n = lq_find(l, subject, NULL);
        if (n && !n->wild) lq_add_names(n, out, cap, &len, &count, trunc);
        /* the literal is validated once, each stored pattern was at its LS+ */
        if (l->qwild && fx_subject_valid(subject, false))
            for (const lq_subj *w = l->qwild; w; w = w->wnext)
                if (w->valid && fx_subject_match_valid(w->subject, subject))
                    lq_add_names(w, out, cap, &len, &count, trunc);
    }
    pthread_rwlock_unlock(&l->qlk);
    return count;
}

/* Plain LS+ <subject> (plus) / LS- <subject>: the hub sends one LS+ when the first plain
 * subscriber of a subject (pattern) appears and one LS- when the last one leaves. At most
 * LQ_MAX_ENTRIES subjects; past that (or out of memory) p_full makes every subject count as
 * interested until the next connection. */
static void lp_plain(fx_leaf *l, const char *subject, bool plus)
{
    pthread_rwlock_wrlock(&l->qlk);
    lq_subj **link = NULL;
    lq_subj *n = l->qb ? lq_find(l, subject, &link) : NULL;
    if (!plus) {
        if (n && n->plain) {
            n->plain = false;
            l->pn--;
            if (!n->queues) lq_unlink(l, link, n);
        }
        pthread_rwlock_unlock(&l->qlk);
        return;
    }
    if (n && n->plain) {
        pthread_rwlock_unlock(&l->qlk);
        return;
    }
    if (l->pn >= LQ_MAX_ENTRIES) {
        l->p_full = true;
        pthread_rwlock_unlock(&l->qlk);
        fx_log_ratelimited(&l->slot_q, 10000, FX_LOG_WRN,
                           "nats leaf: more than %d subjects with subscribers announced by %s; "
                           "every delivery subject now counts as having a subscriber",
                           LQ_MAX_ENTRIES, l->where);
        return;
    }
    if (!n) {
        if (!l->qb && !(l->qb = calloc(LQ_BUCKETS, sizeof *l->qb))) goto nomem;
        lq_find(l, subject, &link);
        if (!(n = lq_link(l, link, subject))) goto nomem;
    }
    n->plain = true;
    l->pn++;
    pthread_rwlock_unlock(&l->qlk);
    return;
nomem:
    l->p_full = true;
    pthread_rwlock_unlock(&l->qlk);
    fx_log_ratelimited(&l->slot_q, 10000, FX_LOG_WRN,
                       "nats leaf: out of memory recording a subscription");
}

/* LS+ <subject> [<queue> <weight>] / LS- <subject> [<queue>] (server/leafnode.go writeLeafSub,
 * processLeafSub, processLeafUnsub: no account token on a leaf connection), parsed by
 * leaf_proto.h. Queue interest names the queue groups of a publish; plain interest only answers
 * fx_leaf_has_interest (plain subscribers get every leaf message anyway). A malformed line is
 * counted and ignored. */
static void handle_ls(fx_leaf *l, const fx_lp_frame *f)
{
    bool plus = f->kind == FX_LP_LS_ADD;
    if (f->malformed) {
        atomic_fetch_add(&l->st_q_bad, 1);
        fx_log_ratelimited(&l->slot_q, 10000, FX_LOG_WRN, "nats leaf: malformed %s line ignored",
                           plus ? "LS+" : "LS-");
        return;
    }
    if (!f->queue) {
        lp_plain(l, f->subject, plus);
        return;
    }
    if (plus)
        lq_set(l, f->subject, f->queue, f->weight < 1 ? 1 : f->weight); /* as the server does */
    else
        lq_del(l, f->subject, f->queue);
}

/* ---- protocol input (I/O thread) --------------------------------------------------------------- */

static void handle_info(fx_leaf *l, const char *json, bool first, fx_err *hs_fail)
{
    cJSON *j = cJSON_Parse(json);
    if (!j) {
        if (first) *hs_fail = fx_seterr(FX_EPROTO, "malformed INFO from the server");
        return;
    }
    const cJSON *tls = cJSON_GetObjectItemCaseSensitive(j, "tls_required");
    const cJSON *hdr = cJSON_GetObjectItemCaseSensitive(j, "headers");
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(j, "max_payload");
    const cJSON *sn = cJSON_GetObjectItemCaseSensitive(j, "server_name");
    if (first && cJSON_GetObjectItemCaseSensitive(j, "client_ip") &&
        !cJSON_GetObjectItemCaseSensitive(j, "leafnode_urls"))
        *hs_fail = fx_seterr(FX_EPROTO, "this is a client port, not a leafnode port (nats-server "
                                        "leafnodes { listen: ... })");
    else if (first && cJSON_IsTrue(tls))
        *hs_fail = fx_seterr(FX_EPROTO, "the leafnode listener requires TLS (not supported: use a "
                                        "plain listener on loopback)");
    else if (first && !cJSON_IsTrue(hdr))
        *hs_fail = fx_seterr(FX_EPROTO, "the server does not support headers");
    pthread_mutex_lock(&l->mu);
    if (cJSON_IsNumber(mp) && mp->valuedouble > 0 && mp->valuedouble < 1e15)
        l->max_payload = (int64_t)mp->valuedouble;
    if (cJSON_IsString(sn) && sn->valuestring)
        sanitize(sn->valuestring, strlen(sn->valuestring), l->server_name, sizeof l->server_name);
    pthread_mutex_unlock(&l->mu);
    cJSON_Delete(j);
}

/* One frame from the reader. Returns 0, or -1 on a protocol error (why / hs_fail set). */
static int handle_frame(fx_leaf *l, const fx_lp_frame *f, bool *got_info, fx_err *hs_fail)
{
    if (!*got_info) {
        if (f->kind != FX_LP_INFO) {
            *hs_fail = fx_seterr(FX_EPROTO, "the server did not start with INFO (not a leafnode "
                                            "port?)");
            return -1;
        }
        *got_info = true;
        handle_info(l, f->arg, true, hs_fail);
        return *hs_fail ? -1 : 0;
    }
    switch (f->kind) {
    case FX_LP_PING: {
        atomic_fetch_add(&l->st_server_pings, 1);
        if (l->hs_fd >= 0)
            return write_all(l, l->hs_fd, "PONG\r\n", 6, fx_now_ms() + l->connect_timeout_ms) ? -1
                                                                                             : 0;
        pthread_mutex_lock(&l->mu);
        bool ok = ctrl_locked(l, "PONG\r\n");
        pthread_mutex_unlock(&l->mu);
        if (!ok) set_why(l, "write buffer full (PONG)");
        return ok ? 0 : -1;
    }
    case FX_LP_PONG:
        if (l->hs_fd >= 0 && !l->hs_pong) {
            l->hs_pong = true;
            return 0;
        }
        atomic_fetch_add(&l->st_pongs, 1);
        pthread_mutex_lock(&l->mu);
        l->pong_seq++;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        return 0;
    case FX_LP_INFO: handle_info(l, f->arg, false, hs_fail); return 0;
    case FX_LP_OK: return 0;
    case FX_LP_LS_ADD:
    case FX_LP_LS_DEL: handle_ls(l, f); return 0;
    case FX_LP_ERR: {
        atomic_fetch_add(&l->st_errors, 1);
        char txt[ERR_TEXT_MAX + 1];
        sanitize(f->arg, f->arg_len, txt, sizeof txt);
        if (l->hs_fd >= 0) {
            snprintf(l->hs_err, sizeof l->hs_err, "%s", txt);
            return 0;
        }
        fx_log_ratelimited(&l->slot_err, 5000, FX_LOG_WRN, "nats leaf: server error: %s", txt);
        return 0;
    }
    case FX_LP_MSG: return 0; /* never subscribed: the reader skips the payload */
    }
    return 0;
}

/* Take every complete frame out of the reader. Returns 0, or -1 (why / hs_fail set). */
static int process_input(fx_leaf *l, bool *got_info, fx_err *hs_fail)
{
    fx_lp_frame f;
    for (;;) {
        int r = fx_lp_next(l->rd, &f);
        if (r == 0) return 0;
        if (r < 0) {
            set_why(l, "protocol error: %s", fx_lp_error(l->rd));
            if (!*hs_fail) *hs_fail = fx_seterr(FX_EPROTO, "protocol error: %s", fx_lp_error(l->rd));
            return -1;
        }
        if (handle_frame(l, &f, got_info, hs_fail) != 0) return -1;
    }
}

/* Read what is there into the reader. Returns >0 bytes, 0 nothing (EAGAIN), -1 closed or error
 * (why set). */
static ssize_t read_some(fx_leaf *l, int fd)
{
    char buf[16384];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            if (fx_lp_feed(l->rd, buf, (size_t)n) != 0) {
                set_why(l, "read: %s", fx_lp_error(l->rd));
                return -1;
            }
            return n;
        }
        if (n == 0) {
            set_why(l, "connection closed by the server");
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        char eb[96];
        set_why(l, "read failed: %s", strerror_r(errno, eb, sizeof eb));
        return -1;
    }
}

int fx_leaf_feed(fx_leaf *l, const void *data, size_t len)
{
    if (!l || l->started) return -1;
    const char *p = data;
    fx_err fail = FX_OK;
    while (len) {
        size_t n = len < 16384 ? len : 16384; /* as the I/O thread's reads */
        int rc = fx_lp_feed(l->rd, p, n);
        p += n;
        len -= n;
        if (rc != 0 || process_input(l, &l->feed_info, &fail) != 0) {
            fx_lp_reset(l->rd);
            l->feed_info = false;
            return -1;
        }
    }
    return 0;
}

/* ---- connection --------------------------------------------------------------------------------- */

static fx_err handshake(fx_leaf *l, int fd, int64_t deadline)
{
    bool got_info = false;
    fx_err fail = FX_OK;
    fx_lp_reset(l->rd);
    l->hs_fd = fd;
    l->hs_pong = false;
    l->hs_err[0] = '\0';
    lq_clear(l); /* the server sends its interest again after our CONNECT */
    bool sent = false;
    fx_err e = FX_OK;
    while (!e) {
        if (got_info && !sent) {
            cJSON *c = cJSON_CreateObject();
            char *js = NULL;
            if (c && cJSON_AddStringToObject(c, "name", l->name) &&
                cJSON_AddFalseToObject(c, "tls_required") && cJSON_AddTrueToObject(c, "headers") &&
                (!l->u.has_user || (cJSON_AddStringToObject(c, "user", l->u.user) &&
                                    cJSON_AddStringToObject(c, "pass", l->u.pass))))
                js = cJSON_PrintUnformatted(c);
            if (c && l->u.has_user) { /* wipe the copies of the credentials */
                const cJSON *pu = cJSON_GetObjectItemCaseSensitive(c, "user");
                const cJSON *pp = cJSON_GetObjectItemCaseSensitive(c, "pass");
                if (pu && pu->valuestring) explicit_bzero(pu->valuestring, strlen(pu->valuestring));
                if (pp && pp->valuestring) explicit_bzero(pp->valuestring, strlen(pp->valuestring));
            }
            cJSON_Delete(c);
            if (!js) {
                e = fx_seterr(FX_ENOMEM, "out of memory");
                break;
            }
            size_t jl = strlen(js);
            size_t ml = jl + 32;
            char *msg = malloc(ml);
            if (!msg) {
                explicit_bzero(js, jl);
                free(js);
                e = fx_seterr(FX_ENOMEM, "out of memory");
                break;
            }
            int n = snprintf(msg, ml, "CONNECT %s\r\nPING\r\n", js);
            explicit_bzero(js, jl);
            free(js);
            e = write_all(l, fd, msg, (size_t)n, deadline);
            explicit_bzero(msg, ml);
            free(msg);
            sent = true;
            continue;
        }
        if (l->hs_err[0]) {
            e = fx_seterr(strstr(l->hs_err, "Authorization") ? FX_EAUTH : FX_EPROTO,
                          "server: %s", l->hs_err);
            break;
        }
        if (l->hs_pong) break;
        short rev = 0;
        int r = wait_io(l, fd, POLLIN, deadline, &rev, false);
        if (r < 0) {
            e = FX_ECANCELED;
            break;
        }
        if (r == 0) {
            e = fx_seterr(FX_ETIMEDOUT, got_info ? "no PONG after CONNECT" : "no INFO from the server");
            break;
        }
        ssize_t n = read_some(l, fd);
        if (n < 0) {
            char w[256];
            pthread_mutex_lock(&l->mu);
            snprintf(w, sizeof w, "%s", l->why);
            pthread_mutex_unlock(&l->mu);
            e = fx_seterr(FX_EUNAVAIL, "%s%s%s", w, l->hs_err[0] ? ": " : "", l->hs_err);
            break;
        }
        if (process_input(l, &got_info, &fail) != 0) {
            if (fail)
                e = fail;
            else
                e = fx_seterr(FX_EPROTO, "protocol error during the handshake");
            break;
        }
    }
    l->hs_fd = -1;
    return e;
}

static void go_up(fx_leaf *l, int fd)
{
    pthread_mutex_lock(&l->mu);
    l->fd = fd;
    l->woff = l->wlen = 0;
    l->want_out = l->broken = false;
    l->gen++;
    l->ping_seq = l->pong_seq = 0;
    snprintf(l->why, sizeof l->why, "connected");
    atomic_store(&l->state, ST_UP);
    pthread_cond_broadcast(&l->cv);
    char sn[128];
    snprintf(sn, sizeof sn, "%s", l->server_name);
    int64_t mp = l->max_payload;
    pthread_mutex_unlock(&l->mu);
    uint64_t n = atomic_fetch_add(&l->st_connects, 1) + 1;
    FX_INF("nats leaf: %s %s (server %s, max_payload %lld)", n > 1 ? "reconnected to" : "connected to",
           l->where, sn[0] ? sn : "?", (long long)mp);
}

static void go_down(fx_leaf *l, int fd)
{
    pthread_mutex_lock(&l->mu);
    atomic_store(&l->state, ST_DOWN);
    l->fd = -1;
    l->woff = l->wlen = 0;
    l->want_out = l->broken = false;
    if (l->wcap > 4 * WBUF_INIT) { /* give a burst's memory back */
        free(l->wbuf);
        l->wbuf = NULL;
        l->wcap = 0;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    close(fd);
}

/* Connected: reads, PONGs, keepalive, flushing. Returns when the connection is unusable or on
 * stop (why set). */
static void run_connected(fx_leaf *l, int fd)
{
    bool got_info = true;
    fx_err unused = FX_OK;
    int64_t next_ping = fx_now_ms() + l->ping_interval_ms;
    /* bytes read after the handshake PONG */
    if (fx_lp_buffered(l->rd) && process_input(l, &got_info, &unused) != 0) return;
    for (;;) {
        if (atomic_load(&l->stop)) return;
        pthread_mutex_lock(&l->mu);
        bool broken = l->broken, out = l->wlen > 0;
        pthread_mutex_unlock(&l->mu);
        if (broken) return;
        short rev = 0;
        int r = wait_io(l, fd, (short)(POLLIN | (out ? POLLOUT : 0)), next_ping, &rev, true);
        if (r < 0) return;
        if (r > 0) {
            if (rev & POLLIN) {
                ssize_t n = read_some(l, fd);
                if (n < 0) return;
                if (n > 0 && process_input(l, &got_info, &unused) != 0) return;
            } else if (rev & (POLLERR | POLLHUP | POLLNVAL)) {
                set_why(l, "connection error");
                return;
            }
            if (rev & POLLOUT) {
                pthread_mutex_lock(&l->mu);
                flush_locked(l);
                pthread_mutex_unlock(&l->mu);
            }
        }
        if (fx_now_ms() >= next_ping) {
            pthread_mutex_lock(&l->mu);
            bool stale = l->ping_seq - l->pong_seq >= (uint64_t)l->max_pings_out;
            bool ok = !stale && ctrl_locked(l, "PING\r\n");
            if (ok) l->ping_seq++;
            if (stale) snprintf(l->why, sizeof l->why, "stale connection: %d PINGs unanswered",
                                l->max_pings_out);
            else if (!ok) snprintf(l->why, sizeof l->why, "write buffer full (PING)");
            pthread_mutex_unlock(&l->mu);
            if (!ok) return;
            next_ping = fx_now_ms() + l->ping_interval_ms;
        }
    }
}

static void *io_main(void *arg)
{
    fx_thread_name("fx-leaf");
    fx_leaf *l = arg;
    int64_t backoff = 0;
    bool logged_fail = false;
    while (!atomic_load(&l->stop)) {
        int fd = -1;
        int64_t deadline = fx_now_ms() + l->connect_timeout_ms;
        fx_err e = tcp_connect(l, deadline, &fd);
        if (!e) e = handshake(l, fd, deadline);
        if (e == FX_ECANCELED || atomic_load(&l->stop)) {
            if (fd >= 0) close(fd);
            break;
        }
        if (e) {
            if (fd >= 0) close(fd);
            set_why(l, "cannot connect to %s: %s", l->where, fx_err_detail());
            fx_log_ratelimited(&l->slot_conn, 10000, logged_fail ? FX_LOG_DBG : FX_LOG_WRN,
                               "nats leaf: cannot connect to %s: %s; retrying", l->where,
                               fx_err_detail());
            logged_fail = true;
            backoff = backoff ? backoff * 2 : l->rc_min_ms;
            if (backoff > l->rc_max_ms) backoff = l->rc_max_ms;
            int64_t jitter = (int64_t)(rnd(l) % (uint64_t)(backoff / 4 + 1));
            wait_io(l, -1, 0, fx_now_ms() + backoff + jitter, NULL, false);
            continue;
        }
        backoff = 0;
        logged_fail = false;
        go_up(l, fd);
        run_connected(l, fd);
        char w[256];
        pthread_mutex_lock(&l->mu);
        snprintf(w, sizeof w, "%s", l->why);
        pthread_mutex_unlock(&l->mu);
        go_down(l, fd);
        if (atomic_load(&l->stop)) break;
        FX_WRN("nats leaf: connection to %s lost: %s; reconnecting", l->where, w);
        /* a short pause keeps a server that accepts and drops at once from spinning us */
        wait_io(l, -1, 0, fx_now_ms() + l->rc_min_ms, NULL, false);
    }
    set_why(l, "stopped");
    return NULL;
}

/* ---- public ---------------------------------------------------------------------------------- */

fx_err fx_leaf_new(const fx_leaf_opts *o, fx_leaf **out)
{
    *out = NULL;
    if (!o || !o->url) return fx_seterr(FX_EINVAL, "leaf: no URL");
    char err[160];
    fx_leaf_url u;
    if (fx_leaf_url_parse(o->url, &u, err, sizeof err) != 0)
        return fx_seterr(FX_EINVAL, "leaf URL: %s", err);
    fx_leaf *l = calloc(1, sizeof *l);
    if (!l) {
        wipe_url(&u);
        return fx_seterr(FX_ENOMEM, "leaf: out of memory");
    }
    l->u = u;
    wipe_url(&u);
    sanitize(o->name ? o->name : "fluxon", strlen(o->name ? o->name : "fluxon"), l->name,
             sizeof l->name);
    if (strchr(l->u.host, ':'))
        snprintf(l->where, sizeof l->where, "[%s]:%d", l->u.host, l->u.port);
    else
        snprintf(l->where, sizeof l->where, "%s:%d", l->u.host, l->u.port);
    l->connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 2000;
    l->ping_interval_ms = o->ping_interval_ms > 0 ? o->ping_interval_ms : 10000;
    l->max_pings_out = o->max_pings_out > 0 ? o->max_pings_out : 3;
    l->rc_min_ms = o->reconnect_min_ms > 0 ? o->reconnect_min_ms : 100;
    l->rc_max_ms = o->reconnect_max_ms > 0 ? o->reconnect_max_ms : 2000;
    if (l->rc_max_ms < l->rc_min_ms) l->rc_max_ms = l->rc_min_ms;
    l->max_pending = o->max_pending_bytes > 0 ? o->max_pending_bytes : (8u << 20);
    l->fd = -1;
    l->hs_fd = -1;
    atomic_init(&l->stop, false);
    atomic_init(&l->state, ST_DOWN);
    snprintf(l->why, sizeof l->why, "not connected yet");
    l->rd = fx_lp_reader_new(LINE_MAX_IN);
    l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (getrandom(&l->rng, sizeof l->rng, GRND_NONBLOCK) != (ssize_t)sizeof l->rng)
        l->rng = (uint64_t)fx_now_us() ^ (uint64_t)(uintptr_t)l;
    l->rng |= 1;
    if (!l->rd || l->wake_fd < 0) {
        if (l->wake_fd >= 0) close(l->wake_fd);
        fx_lp_reader_free(l->rd);
        wipe_url(&l->u);
        free(l);
        return fx_seterr(FX_ENOMEM, "leaf: out of resources");
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_rwlock_init(&l->qlk, NULL);
    fx_cond_init_monotonic(&l->cv);
    *out = l;
    return FX_OK;
}

fx_err fx_leaf_start(fx_leaf *l)
{
    if (l->started) return FX_OK;
    if (pthread_create(&l->thr, NULL, io_main, l) != 0)
        return fx_seterr(FX_ENOMEM, "leaf: cannot start the I/O thread");
    l->started = true;
    return FX_OK;
}

bool fx_leaf_connected(fx_leaf *l) { return l && atomic_load(&l->state) == ST_UP; }

bool fx_leaf_has_interest(fx_leaf *l, const char *subject)
{
    if (!l || atomic_load(&l->state) != ST_UP) return false;
    bool yes = false;
    pthread_rwlock_rdlock(&l->qlk);
    if (l->p_full) {
        yes = true;
    } else {
        const lq_subj *n = lq_find(l, subject, NULL);
        yes = n && !n->wild && (n->plain || n->queues);
        if (!yes && l->qwild && fx_subject_valid(subject, false))
            for (const lq_subj *w = l->qwild; w && !yes; w = w->wnext)
                yes = (w->plain || w->queues) && w->valid &&
                      fx_subject_match_valid(w->subject, subject);
    }
    pthread_rwlock_unlock(&l->qlk);
    return yes;
}

void fx_leaf_status(fx_leaf *l, char *buf, size_t cap)
{
    if (!cap) return;
    pthread_mutex_lock(&l->mu);
    snprintf(buf, cap, "%s", atomic_load(&l->state) == ST_UP && !l->broken ? "connected" : l->why);
    pthread_mutex_unlock(&l->mu);
}

void fx_leaf_get_stats(fx_leaf *l, fx_leaf_stats *o)
{
    o->connects = atomic_load(&l->st_connects);
    o->msgs = atomic_load(&l->st_msgs);
    o->bytes = atomic_load(&l->st_bytes);
    o->writes = atomic_load(&l->st_writes);
    o->server_pings = atomic_load(&l->st_server_pings);
    o->pongs = atomic_load(&l->st_pongs);
    o->server_errors = atomic_load(&l->st_errors);
    pthread_rwlock_rdlock(&l->qlk);
    o->queue_entries = l->qn;
    pthread_rwlock_unlock(&l->qlk);
    o->queue_dropped = atomic_load(&l->st_q_dropped);
    o->queue_truncated = atomic_load(&l->st_q_truncated);
    o->queue_bad_lines = atomic_load(&l->st_q_bad);
}

int fx_leaf_queue_names(fx_leaf *l, const char *subject, char *buf, size_t cap)
{
    bool trunc;
    if (!l || !subject || !buf) return 0;
    return lq_collect(l, subject, buf, cap, &trunc);
}

static bool subject_ok(const char *s, size_t *len)
{
    size_t n = 0;
    for (; s[n]; n++) {
        if (n >= CTRL_LINE_MAX) return false;
        unsigned char c = (unsigned char)s[n];
        if (c <= 0x20 || c == 0x7f) return false;
    }
    *len = n;
    return n > 0;
}

/* Bounded line builder: `over` once something did not fit (the rest is dropped). */
typedef struct lb {
    char *p, *end;
    bool over;
} lb;

static void lb_put(lb *b, const char *s, size_t n)
{
    if (b->over || n > (size_t)(b->end - b->p)) {
        b->over = true;
        return;
    }
    if (n) memcpy(b->p, s, n); /* s may be NULL when n is 0 (no headers) */
    b->p += n;
}

static void lb_num(lb *b, size_t v)
{
    char t[24];
    size_t i = sizeof t;
    do {
        t[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    lb_put(b, t + i, sizeof t - i);
}

/* fx_leaf_cork: the leaf this thread corked (NULL: none) and how often (nesting). */
static _Thread_local fx_leaf *t_cork;
static _Thread_local unsigned t_cork_depth;

void fx_leaf_cork(fx_leaf *l)
{
    if (!l) return;
    if (t_cork && t_cork != l) { /* one leaf at a time per thread: the first is sent now */
        t_cork_depth = 1;
        fx_leaf_uncork(t_cork);
    }
    if (t_cork != l) t_cork_depth = 0;
    t_cork = l;
    t_cork_depth++;
}

void fx_leaf_uncork(fx_leaf *l)
{
    if (!l || t_cork != l) return;
    if (--t_cork_depth) return;
    t_cork = NULL;
    pthread_mutex_lock(&l->mu);
    if (atomic_load(&l->state) == ST_UP && l->fd >= 0 && !l->broken && !l->want_out && l->wlen)
        flush_locked(l);
    pthread_mutex_unlock(&l->mu);
}

fx_err fx_leaf_publish(fx_leaf *l, const char *subject, const char *reply, const void *hdr,
                       size_t hlen, const void *data, size_t dlen)
{
    size_t sl = 0, rl = 0;
    if (!l || !subject || !subject_ok(subject, &sl))
        return fx_seterr(FX_EINVAL, "leaf publish: invalid subject");
    if (reply && *reply && !subject_ok(reply, &rl))
        return fx_seterr(FX_EINVAL, "leaf publish: invalid reply subject");
    if ((hlen && (!hdr || hlen < 12 || memcmp(hdr, "NATS/1.0", 8) != 0 ||
                  memcmp((const char *)hdr + hlen - 4, "\r\n\r\n", 4) != 0)) ||
        (dlen && !data))
        return fx_seterr(FX_EINVAL, "leaf publish: invalid header block or payload");
    /* Queue groups on the hub get a leaf message only when the frame names them
     * (server/leafnode.go processLeafMsgArgs / processLeafHeaderMsgArgs, client.go
     * processMsgResults): "LMSG <subj> + <reply> <q>... <size>" or "LMSG <subj> | <q>... <size>",
     * "HMSG <subj> + <reply> <q>... <hdr> <total>" or "HMSG <subj> | <q>... <hdr> <total>". */
    char qn[CTRL_LINE_MAX];
    bool trunc = false;
    int nq = 0;
    size_t fixed = sl + rl + 64; /* op, indicator, sizes, CRLF */
    if (fixed < sizeof qn)
        nq = lq_collect(l, subject, qn, sizeof qn - fixed, &trunc);
    if (trunc) {
        atomic_fetch_add(&l->st_q_truncated, 1);
        fx_log_ratelimited(&l->slot_q, 10000, FX_LOG_WRN,
                           "nats leaf: a message on %.200s matches more queue groups than one "
                           "frame may name (%d names, %d bytes); the others do not get it",
                           subject, FX_LEAF_MAX_QUEUES_PER_MSG, CTRL_LINE_MAX);
    }
    /* "HMSG <subj> + <reply> <q...> <hdr> <total>", "HMSG <subj> | <q...> <hdr> <total>",
     * "HMSG <subj> [<reply>] <hdr> <total>", and the LMSG forms with <size> only. */
    char line[CTRL_LINE_MAX];
    lb b = {line, line + sizeof line - 1, false}; /* one byte kept: the line stays a C string */
    lb_put(&b, hlen ? "HMSG " : "LMSG ", 5);
    lb_put(&b, subject, sl);
    if (nq) {
        lb_put(&b, rl ? " + " : " |", rl ? 3 : 2);
        lb_put(&b, reply, rl);
        lb_put(&b, " ", 1);
        lb_put(&b, qn, strlen(qn));
    } else if (rl) {
        lb_put(&b, " ", 1);
        lb_put(&b, reply, rl);
    }
    if (hlen) {
        lb_put(&b, " ", 1);
        lb_num(&b, hlen);
    }
    lb_put(&b, " ", 1);
    lb_num(&b, hlen + dlen);
    lb_put(&b, "\r\n", 2);
    if (b.over)
        return fx_seterr(FX_EINVAL, "leaf publish: subjects longer than the protocol allows");
    size_t n = (size_t)(b.p - line);
    size_t total = n + hlen + dlen + 2;
    fx_err e = FX_OK;
    pthread_mutex_lock(&l->mu);
    if (atomic_load(&l->state) != ST_UP || l->broken || l->fd < 0) {
        e = fx_seterr(FX_EUNAVAIL, "nats leaf: not connected (%s)", l->why);
    } else if (l->max_payload > 0 && (int64_t)(hlen + dlen) > l->max_payload) {
        e = fx_seterr(FX_ETOO_LARGE, "nats leaf: message of %zu bytes over max_payload %lld",
                      hlen + dlen, (long long)l->max_payload);
    } else if (!wroom_locked(l, total, l->max_pending)) {
        e = fx_seterr(FX_EFULL, "nats leaf: write buffer full (%zu bytes pending)", l->wlen);
    } else {
        wput_locked(l, line, n);
        wput_locked(l, hdr, hlen);
        wput_locked(l, data, dlen);
        wput_locked(l, "\r\n", 2);
        /* corked by this thread: the frame waits for fx_leaf_uncork (or a full batch) */
        if (!l->want_out && (t_cork != l || l->wlen >= CORK_FLUSH_BYTES)) flush_locked(l);
        if (l->broken) {
            e = fx_seterr(FX_EUNAVAIL, "nats leaf: %s", l->why);
        } else {
            atomic_fetch_add(&l->st_msgs, 1);
            atomic_fetch_add(&l->st_bytes, total);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return e;
}

fx_err fx_leaf_flush(fx_leaf *l, int64_t timeout_ms)
{
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    fx_err e = FX_OK;
    pthread_mutex_lock(&l->mu);
    if (atomic_load(&l->state) != ST_UP || l->broken || !ctrl_locked(l, "PING\r\n")) {
        pthread_mutex_unlock(&l->mu);
        return fx_seterr(FX_EUNAVAIL, "nats leaf: not connected");
    }
    uint64_t target = ++l->ping_seq, gen = l->gen;
    for (;;) {
        if (l->pong_seq >= target && l->gen == gen) break;
        if (atomic_load(&l->stop)) {
            e = FX_ECANCELED;
            break;
        }
        if (l->gen != gen || atomic_load(&l->state) != ST_UP) {
            e = fx_seterr(FX_EUNAVAIL, "nats leaf: disconnected during flush");
            break;
        }
        if (fx_ms_left(deadline) <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "nats leaf: flush timed out");
            break;
        }
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    }
    pthread_mutex_unlock(&l->mu);
    return e;
}

void fx_leaf_stop(fx_leaf *l)
{
    if (!l) return;
    atomic_store(&l->stop, true);
    pthread_mutex_lock(&l->mu);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    wake(l);
    if (l->started) {
        pthread_join(l->thr, NULL);
        l->started = false;
    }
}

void fx_leaf_free(fx_leaf *l)
{
    if (!l) return;
    fx_leaf_stop(l);
    if (l->fd >= 0) close(l->fd);
    close(l->wake_fd);
    free(l->wbuf);
    fx_lp_reader_free(l->rd);
    lq_clear(l);
    free(l->qb);
    pthread_rwlock_destroy(&l->qlk);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    wipe_url(&l->u);
    free(l);
}
