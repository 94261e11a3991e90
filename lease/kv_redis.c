/* kv_redis.c -- the Redis backend of the KV payload store (kv.h), over hiredis.
 * Contract: kv.h (Fluxon KV's lease_id semantics).
 *
 * Mapping (one Redis key per lease, so a lease's keys live and die together)
 *  - Lease L is the sorted set <prefix>l:<L>. Every key bound to L is one member "key NUL value",
 *    all scores 0, so ZRANGEBYLEX orders members by key (keys hold no NUL: see the bounds below).
 *    A marker member "NUL <ttl_ms>" sorts before every key and keeps the set alive while empty;
 *    the set's PEXPIRE is the lease, so Redis expiry deletes every key of the lease at once.
 *  - Plain puts (lease_id 0) go to <prefix>l:0, without TTL.
 *  - <prefix>leases: sorted set of live lease ids, score = the lease's deadline (ms, Redis TIME),
 *    refreshed by keepalives; entries past their deadline are pruned at each allocation. Reads,
 *    deletes and counts visit every live lease plus l:0 (one Lua script = one round trip, atomic);
 *    the cost is O(live leases) per call: one lease per MQ channel keeps it small, and a
 *    deployment with thousands of channels would want a routing index (not built).
 *  - Lease ids: Redis-time-ms * 1000 + a sequence (mod 1000), so ids never repeat, also after
 *    Redis lost its data (an old id in the control plane can never alias a new lease).
 *  - Scripts declare their flags (Redis >= 7.0 shebang, see SH_WRITE): grants and a put's
 *    PUT_PRE are deny-oom as a whole (with the put's ZADD, a MULTI that Redis discards whole when
 *    one queued command is refused), keepalives and deletes allow-oom, reads no-writes. Writes pass the
 *    write guard first (end of this file: eviction policy, require_fsync); puts then WAIT for
 *    min_replicas when set. Consumers read one lease's set (fx_kv_get_range_lease), so a set that
 *    is gone is reported (FX_ELEASE_EXPIRED), not read as "no keys".
 *  - Every write is atomic in one round trip: a put is one MULTI/EXEC (LUA_PUT_PRE, a native
 *    ZADD of the members, LUA_PUT_POST) that first checks the lease set exists (refused with
 *    "FXLEASE": FX_ELEASE_EXPIRED, nothing written) and removes the key from any other live lease
 *    (re-binding, as etcd does), so a put is idempotent (a retried put rewrites the same member).
 *    Payloads never pass through Lua (LUA_PUT_PRE says why); the other writes are one script.
    A put's pipeline is encoded in one buffer (fx_resp.h) and written straight to the socket:
    each payload is copied once (hiredis's formatting would copy it three times).
 *    A lease read (fx_kv_get_range_lease) is MULTI, EXISTS, ZRANGEBYLEX, EXEC.
 *  - Range bounds: member "k NUL v" compares against a bound B like key k against B when B holds
 *    no NUL; a bound "X NUL ..." (e.g. fx_kv_delete's [key, key NUL)) is mapped to X\1 (keys have
 *    no NUL, so k < X NUL.. <=> k <= X <=> k < X\1).
 *
 * Connections: a pool of pool_size data-path connections (a call waits for a free one until its
 * deadline: FX_ETIMEDOUT), one keepalive connection (keepalives never wait behind data-path
 * calls) and one for fx_kv_redis_check. Connections are dialled lazily with a connect timeout; any transport error or timeout
 * drops the connection (its reply stream is unusable) and the next call dials again, so the store
 * recovers by itself when Redis returns. No TLS: hiredis 0.14 (Debian 12) has none.
 */
#include "kv.h"

#include <assert.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "fx_log.h"
#include "fx_resp.h"
#include "fx_time.h"
#include "fx_url.h"

#define KR_DEFAULT_TIMEOUT_MS 5000
#define KR_CONNECT_TIMEOUT_MS 2000
#define KR_DEFAULT_POOL 4
#define KR_MAX_POOL 32

/* Shared head of every script: prefix, Redis time, the live leases. */
#define LUA_HEAD                                                                                   \
    "local p = ARGV[1]\n"                                                                          \
    "local t = redis.call('TIME')\n"                                                               \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"                      \
    "local function live()\n"                                                                      \
    "  local r = redis.call('ZRANGEBYSCORE', p .. 'leases', string.format('%d', now), '+inf')\n"   \
    "  r[#r + 1] = '0'\n"                                                                          \
    "  return r\n"                                                                                 \
    "end\n"

/* Script flags (Redis >= 7.0 shebang): a script without flags is deny-oom as a whole: with
 * maxmemory set and used memory above it, Redis refuses it with OOM before it runs (a script
 * without a shebang is only checked before its first deny-oom command, which for these scripts
 * came after ZREMRANGEBYLEX / PEXPIRE: Redis grew past maxmemory). Keepalives and deletes never
 * grow memory and must go on when Redis is full (allow-oom); reads are no-writes. */
#define SH_WRITE "#!lua\n"
#define SH_NOOOM "#!lua flags=allow-oom\n"
#define SH_READ "#!lua flags=no-writes\n"

static const char LUA_ALLOC[] = SH_WRITE LUA_HEAD
    "local ttl = tonumber(ARGV[2])\n"
    "redis.call('ZREMRANGEBYSCORE', p .. 'leases', '-inf', string.format('(%d', now))\n"
    "for i = 1, 1000 do\n"
    "  local seq = redis.call('INCR', p .. 'seq') % 1000\n"
    "  local id = string.format('%d', now * 1000 + seq)\n"
    "  local k = p .. 'l:' .. id\n"
    "  if redis.call('EXISTS', k) == 0 then\n"
    "    redis.call('ZADD', k, 0, '\\0' .. ARGV[2])\n"
    "    redis.call('PEXPIRE', k, ttl)\n"
    "    redis.call('ZADD', p .. 'leases', string.format('%d', now + ttl), id)\n"
    "    return id\n"
    "  end\n"
    "end\n"
    "return redis.error_reply('FXFULL no free lease id in this millisecond')\n";

static const char LUA_KEEPALIVE[] = SH_NOOOM LUA_HEAD
    "local k = p .. 'l:' .. ARGV[2]\n"
    "local m = redis.call('ZRANGEBYLEX', k, '-', '(\\1', 'LIMIT', 0, 1)\n"
    "if #m == 0 then\n"
    "  redis.call('ZREM', p .. 'leases', ARGV[2])\n"
    "  return -1\n"
    "end\n"
    "local ttl = tonumber(string.sub(m[1], 2))\n"
    "redis.call('PEXPIRE', k, ttl)\n"
    "redis.call('ZADD', p .. 'leases', string.format('%d', now + ttl), ARGV[2])\n"
    "return ttl\n";

/* A put is one MULTI/EXEC (kr_put_many): PUT_PRE, then a native ZADD of the members, then
 * PUT_POST. The payloads never pass through Lua: Redis 7 hashes every byte of every string that
 * enters or leaves a script (its Lua string interning), which cost more than the rest of a 4 KiB
 * put and fetch together (BENCHMARKS.md, issue 24). PUT_PRE refuses a gone lease before anything
 * is written and removes each key from every live lease (re-binding, as etcd does, and the old
 * member of a re-put key in its own lease). A gone lease's ZADD still runs inside EXEC (MULTI does
 * not stop at an error) and creates the set without a TTL: PUT_POST deletes a lease set that has
 * no TTL (every granted one has one), so a refused put leaves nothing behind. */
static const char LUA_PUT_PRE[] = SH_WRITE LUA_HEAD
    "local id = ARGV[2]\n"
    "local k = p .. 'l:' .. id\n"
    "if id ~= '0' and redis.call('EXISTS', k) == 0 then\n"
    "  return redis.error_reply('FXLEASE lease ' .. id .. ' not found (expired or never granted)')\n"
    "end\n"
    "local ls = live()\n"
    "for i = 3, #ARGV do\n"
    "  local lo, hi = '[' .. ARGV[i] .. '\\0', '(' .. ARGV[i] .. '\\1'\n"
    "  for _, o in ipairs(ls) do\n"
    "    if o ~= id then redis.call('ZREMRANGEBYLEX', p .. 'l:' .. o, lo, hi) end\n"
    "  end\n"
    "  redis.call('ZREMRANGEBYLEX', k, lo, hi)\n"
    "end\n"
    "return #ARGV - 2\n";

static const char LUA_PUT_POST[] = SH_NOOOM
    "local k = ARGV[1] .. 'l:' .. ARGV[2]\n"
    "if ARGV[2] ~= '0' and redis.call('PTTL', k) == -1 then\n"
    "  redis.call('DEL', k)\n"
    "  return redis.error_reply('FXLEASE lease ' .. ARGV[2] .. ' not found (expired or never granted)')\n"
    "end\n"
    "return 0\n";

static const char LUA_RANGE[] = SH_READ LUA_HEAD
    "local lim = tonumber(ARGV[4])\n"
    "local out = {}\n"
    "for _, o in ipairs(live()) do\n"
    "  local r\n"
    "  if lim > 0 then\n"
    "    r = redis.call('ZRANGEBYLEX', p .. 'l:' .. o, ARGV[2], ARGV[3], 'LIMIT', 0, lim)\n"
    "  else\n"
    "    r = redis.call('ZRANGEBYLEX', p .. 'l:' .. o, ARGV[2], ARGV[3])\n"
    "  end\n"
    "  for _, m in ipairs(r) do out[#out + 1] = m end\n"
    "end\n"
    "return out\n";

static const char LUA_DELETE[] = SH_NOOOM LUA_HEAD
    "local n = 0\n"
    "for _, o in ipairs(live()) do\n"
    "  n = n + redis.call('ZREMRANGEBYLEX', p .. 'l:' .. o, ARGV[2], ARGV[3])\n"
    "end\n"
    "return n\n";

static const char LUA_COUNT[] = SH_READ LUA_HEAD
    "local n = 0\n"
    "for _, o in ipairs(live()) do\n"
    "  n = n + redis.call('ZLEXCOUNT', p .. 'l:' .. o, ARGV[2], ARGV[3])\n"
    "end\n"
    "return n\n";

typedef struct kr_conn {
    redisContext *ctx;
    bool busy;
    /* write guard (under the connection's ownership: busy, or ka_mu) */
    int64_t checked_ms; /* last guard check on this ctx; 0: not since the dial */
    uint64_t epoch;     /* g_epoch at that check */
    bool refused;       /* that check did not hold */
    char why[224];      /* what did not hold */
} kr_conn;

typedef struct kv_redis {
    char *prefix;
    size_t plen;
    char *host;     /* TCP host, or NULL for a unix socket */
    int port;
    char *path;     /* unix socket path */
    char *user, *pass;
    int db;
    int connect_timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_conns;
    kr_conn conns[KR_MAX_POOL];
    pthread_mutex_t ka_mu;
    kr_conn ka;
    pthread_mutex_t chk_mu; /* fx_kv_redis_check's own connection (never waits for the pool) */
    kr_conn chk;
    /* write guard */
    bool require_fsync;
    int min_replicas;
    int recheck_ms;
    _Atomic bool g_refused; /* the last check (any connection) did not hold */
    _Atomic uint64_t g_epoch; /* bumped when g_refused changes: every connection checks again */
    _Atomic uint64_t n_refused, n_oom, n_wait_short;
} kv_redis;

static const fx_kv_ops kv_redis_ops;

/* ---- connections ----------------------------------------------------------------------------- */

static struct timeval tv_of(int64_t ms)
{
    if (ms < 1) ms = 1;
    return (struct timeval){.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
}

static void where_of(const kv_redis *k, char *where, size_t n)
{
    if (k->host) snprintf(where, n, "%s:%d", k->host, k->port);
    else snprintf(where, n, "unix:%s", k->path);
}

/* Map a hiredis context error to an fx_err (and record the detail). */
static fx_err ctx_err(const kv_redis *k, const redisContext *c, const char *what)
{
    char where[300];
    where_of(k, where, sizeof where);
    /* A read/write past SO_RCVTIMEO/SO_SNDTIMEO: hiredis reports an I/O error with EAGAIN's
     * text (errno may be gone by now, so look at both). */
    bool timeout = c && (c->err == REDIS_ERR_IO || c->err == REDIS_ERR_OTHER) &&
                   (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT ||
                    strstr(c->errstr, "temporarily unavailable") || strstr(c->errstr, "timed out"));
    if (timeout) return fx_seterr(FX_ETIMEDOUT, "redis %s (%s): timed out", what, where);
    return fx_seterr(FX_EUNAVAIL, "redis %s (%s): %s", what, where,
                     c && c->errstr[0] ? c->errstr : "connection failed");
}

/* Map an error reply to an fx_err. */
static fx_err reply_err(const redisReply *r, const char *what)
{
    const char *s = r->str ? r->str : "";
    int n = (int)(r->len > 300 ? 300 : r->len);
    fx_err e = FX_ESERVER;
    if (strstr(s, "FXLEASE")) e = FX_ELEASE_EXPIRED;
    else if (strstr(s, "FXFULL")) e = FX_EFULL;
    else if (!strncmp(s, "NOAUTH", 6) || !strncmp(s, "WRONGPASS", 9)) e = FX_EAUTH;
    else if (!strncmp(s, "NOPERM", 6)) e = FX_EPERM;
    else if (!strncmp(s, "OOM", 3)) e = FX_ENOSPACE;
    else if (!strncmp(s, "LOADING", 7) || !strncmp(s, "BUSY", 4) || !strncmp(s, "MASTERDOWN", 10))
        e = FX_EUNAVAIL;
    return fx_seterr(e, "redis %s: %.*s", what, n, s);
}

/* Run one command on a connected context with the given timeout; the reply or NULL (then the
 * context is broken). */
static redisReply *kr_cmd(redisContext *c, int64_t timeout_ms, int argc, const char **argv,
                          const size_t *lens)
{
    redisSetTimeout(c, tv_of(timeout_ms));
    return redisCommandArgv(c, argc, argv, lens);
}

static fx_err kr_dial(kv_redis *k, kr_conn *cn, int64_t deadline)
{
    int64_t left = deadline - fx_now_ms();
    if (left <= 0) return fx_seterr(FX_ETIMEDOUT, "redis: deadline passed before connecting");
    int ct = k->connect_timeout_ms ? k->connect_timeout_ms : KR_CONNECT_TIMEOUT_MS;
    if (ct > left) ct = (int)left;
    redisContext *c = k->host ? redisConnectWithTimeout(k->host, k->port, tv_of(ct))
                              : redisConnectUnixWithTimeout(k->path, tv_of(ct));
    if (!c) return fx_seterr(FX_ENOMEM, "redis: out of memory");
    if (c->err) {
        fx_err e = ctx_err(k, c, "connect");
        redisFree(c);
        return e;
    }
    fx_err e = FX_OK;
    if (k->pass) {
        const char *av[3] = {"AUTH", k->user ? k->user : k->pass, k->pass};
        size_t al[3] = {4, strlen(av[1]), strlen(k->pass)};
        int ac = k->user ? 3 : 2;
        redisReply *r = kr_cmd(c, deadline - fx_now_ms(), ac, av, al);
        if (!r) e = ctx_err(k, c, "AUTH");
        else if (r->type == REDIS_REPLY_ERROR)
            e = fx_seterr(FX_EAUTH, "redis AUTH refused (credentials not shown)");
        if (r) freeReplyObject(r);
    }
    if (!e && k->db) {
        char db[16];
        snprintf(db, sizeof db, "%d", k->db);
        const char *av[2] = {"SELECT", db};
        size_t al[2] = {6, strlen(db)};
        redisReply *r = kr_cmd(c, deadline - fx_now_ms(), 2, av, al);
        if (!r) e = ctx_err(k, c, "SELECT");
        else if (r->type == REDIS_REPLY_ERROR) e = reply_err(r, "SELECT");
        if (r) freeReplyObject(r);
    }
    if (e) {
        redisFree(c);
        return e;
    }
    cn->ctx = c;
    cn->checked_ms = 0; /* a new connection may reach another Redis: check it before writing */
    return FX_OK;
}

static fx_err kr_acquire(kv_redis *k, int64_t deadline, kr_conn **out)
{
    struct timespec ts = fx_deadline_ts(deadline);
    pthread_mutex_lock(&k->mu);
    for (;;) {
        for (int i = 0; i < k->n_conns; i++) {
            if (!k->conns[i].busy) {
                k->conns[i].busy = true;
                pthread_mutex_unlock(&k->mu);
                *out = &k->conns[i];
                return FX_OK;
            }
        }
        if (pthread_cond_timedwait(&k->cv, &k->mu, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&k->mu);
            return fx_seterr(FX_ETIMEDOUT, "redis: no free connection before the deadline (%d busy)",
                             k->n_conns);
        }
    }
}

static void kr_release(kv_redis *k, kr_conn *cn)
{
    pthread_mutex_lock(&k->mu);
    cn->busy = false;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

/* One command of a pipeline. */
typedef struct kr_cmdv {
    int argc;
    const char **argv;
    const size_t *lens;
} kr_cmdv;

/* Write raw[0, len) on cn's socket (blocking, SO_SNDTIMEO set by the caller): true when all of
 * it went out; false with errno. Only called while hiredis's output buffer is empty, so the bytes
 * keep their place in the command stream. */
static bool write_all(redisContext *c, const char *raw, size_t len, int64_t deadline)
{
    while (len) {
        ssize_t w = send(c->fd, raw, len, MSG_NOSIGNAL);
        if (w > 0) {
            raw += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR && fx_now_ms() < deadline) continue;
        if (w == 0) errno = EPIPE;
        return false;
    }
    return true;
}

/* n commands pipelined on cn (dialled if needed), one round trip: first the nraw commands already
 * encoded in raw[0, rawlen) (fx_resp.h; raw is owned and freed as soon as it is written, so a
 * batch is not held twice while its replies are awaited), then cmds[0, n - nraw) through
 * hiredis. FX_OK with every reply in rep[0..n) (error replies included; the caller frees each). A
 * transport failure or timeout drops the connection (its reply stream is unusable) and leaves
 * rep all NULL. */
static fx_err kr_pipe_raw(kv_redis *k, kr_conn *cn, int64_t deadline, const char *what, char *raw,
                          size_t rawlen, int nraw, int n, const kr_cmdv *cmds, redisReply **rep)
{
    for (int i = 0; i < n; i++) rep[i] = NULL;
    fx_err e;
    if (!cn->ctx && (e = kr_dial(k, cn, deadline))) {
        free(raw);
        return e;
    }
    int64_t left = deadline - fx_now_ms();
    if (left <= 0) {
        free(raw);
        return fx_seterr(FX_ETIMEDOUT, "redis %s: deadline passed", what);
    }
    redisSetTimeout(cn->ctx, tv_of(left));
    bool ok = true;
    if (rawlen) {
        /* Straight to the socket when hiredis holds nothing unsent (always, between round trips:
         * a failed one drops the connection); else behind what it holds. */
        if (sdslen(cn->ctx->obuf) == 0) {
            if (!write_all(cn->ctx, raw, rawlen, deadline)) {
                int err = errno;
                free(raw);
                char where[300];
                where_of(k, where, sizeof where);
                redisFree(cn->ctx);
                cn->ctx = NULL;
                if (err == EAGAIN || err == EWOULDBLOCK)
                    return fx_seterr(FX_ETIMEDOUT, "redis %s (%s): write timed out", what, where);
                return fx_seterr(FX_EUNAVAIL, "redis %s (%s): write: %s", what, where, strerror(err));
            }
        } else {
            ok = redisAppendFormattedCommand(cn->ctx, raw, rawlen) == REDIS_OK;
        }
    }
    free(raw);
    for (int i = 0; ok && i < n - nraw; i++)
        ok = redisAppendCommandArgv(cn->ctx, cmds[i].argc, cmds[i].argv, cmds[i].lens) == REDIS_OK;
    for (int i = 0; ok && i < n; i++)
        ok = redisGetReply(cn->ctx, (void **)&rep[i]) == REDIS_OK && rep[i];
    if (ok && !cn->ctx->err) return FX_OK;
    e = ctx_err(k, cn->ctx, what);
    for (int i = 0; i < n; i++) {
        if (rep[i]) freeReplyObject(rep[i]);
        rep[i] = NULL;
    }
    redisFree(cn->ctx);
    cn->ctx = NULL;
    return e;
}

/* n commands pipelined on cn, one round trip (kr_pipe_raw without encoded ones). */
static fx_err kr_pipe(kv_redis *k, kr_conn *cn, int64_t deadline, const char *what, int n,
                      const kr_cmdv *cmds, redisReply **rep)
{
    return kr_pipe_raw(k, cn, deadline, what, NULL, 0, 0, n, cmds, rep);
}

/* One command on a connection (a pipeline of one): FX_OK with *out (caller frees) for any reply
 * that is not an error; a transport failure drops the connection. */
static fx_err kr_run(kv_redis *k, kr_conn *cn, int64_t deadline, const char *what, int argc,
                     const char **argv, const size_t *lens, redisReply **out)
{
    kr_cmdv cmd = {argc, argv, lens};
    fx_err e = kr_pipe(k, cn, deadline, what, 1, &cmd, out);
    if (e || (*out)->type != REDIS_REPLY_ERROR) return e;
    e = reply_err(*out, what);
    freeReplyObject(*out);
    *out = NULL;
    return e;
}

/* What a script call is, for the write guard: a read or a call that frees / only renews (never
 * guarded), or a write (guarded). Puts are not scripts (kr_put_many). */
typedef enum kr_kind { KR_READ, KR_WRITE } kr_kind;

static fx_err kr_guard(kv_redis *k, kr_conn *cn, int64_t deadline);

/* Run a script on a pool connection (or the keepalive one). */
static fx_err kr_eval(kv_redis *k, bool ka, kr_kind kind, int timeout_ms, const char *what,
                      const char *script, int nargs, const char **args, const size_t *lens,
                      redisReply **out)
{
    int64_t deadline = fx_now_ms() + timeout_ms;
    int argc = nargs + 4;
    const char *sav[8];
    size_t sal[8];
    const char **av = argc <= 8 ? sav : malloc(sizeof *av * (size_t)argc);
    size_t *al = argc <= 8 ? sal : malloc(sizeof *al * (size_t)argc);
    if (!av || !al) {
        if (av != sav) free(av);
        if (al != sal) free(al);
        return fx_seterr(FX_ENOMEM, "redis: out of memory");
    }
    av[0] = "EVAL";
    al[0] = 4;
    av[1] = script;
    al[1] = strlen(script);
    av[2] = "0";
    al[2] = 1;
    av[3] = k->prefix;
    al[3] = k->plen;
    for (int i = 0; i < nargs; i++) {
        av[4 + i] = args[i];
        al[4 + i] = lens[i];
    }
    fx_err e;
    if (ka) {
        pthread_mutex_lock(&k->ka_mu);
        e = kr_run(k, &k->ka, deadline, what, argc, av, al, out);
        pthread_mutex_unlock(&k->ka_mu);
    } else {
        kr_conn *cn = NULL;
        e = kr_acquire(k, deadline, &cn);
        if (!e) {
            if (kind != KR_READ) e = kr_guard(k, cn, deadline);
            if (!e) e = kr_run(k, cn, deadline, what, argc, av, al, out);
            kr_release(k, cn);
        }
        if (e == FX_ENOSPACE) atomic_fetch_add(&k->n_oom, 1);
    }
    if (av != sav) free(av);
    if (al != sal) free(al);
    return e;
}

/* ---- bounds ---------------------------------------------------------------------------------- */

/* A ZRANGEBYLEX bound: '[' or '(' + bytes, or "+". */
typedef struct kr_bound {
    char *p;
    size_t len;
    char small[256];
} kr_bound;

static fx_err bound_make(kr_bound *b, char open, const uint8_t *d, size_t n, const char *tail,
                         size_t tn)
{
    size_t need = 1 + n + tn;
    b->p = need <= sizeof b->small ? b->small : malloc(need);
    if (!b->p) return fx_seterr(FX_ENOMEM, "redis: out of memory");
    b->p[0] = open;
    if (n) memcpy(b->p + 1, d, n);
    if (tn) memcpy(b->p + 1 + n, tail, tn);
    b->len = need;
    return FX_OK;
}

static void bound_done(kr_bound *b)
{
    if (b->p && b->p != b->small) free(b->p);
    b->p = NULL;
}

/* Lower bound for keys >= start. */
static fx_err lo_bound(kr_bound *b, fx_slice start)
{
    const uint8_t *z = start.len ? memchr(start.data, 0, start.len) : NULL;
    if (start.len == 0) return bound_make(b, '[', NULL, 0, "\1", 1);
    if (z) return bound_make(b, '[', start.data, (size_t)(z - (const uint8_t *)start.data), "\1", 1);
    return bound_make(b, '[', start.data, start.len, NULL, 0);
}

/* Upper bound for keys < end; end empty: keys with prefix `start`. */
static fx_err hi_bound(kr_bound *b, fx_slice start, fx_slice end)
{
    if (end.len == 0) {
        if (start.len == 0) return bound_make(b, '+', NULL, 0, NULL, 0), b->len = 1, FX_OK;
        uint8_t small[256];
        uint8_t *pe = start.len <= sizeof small ? small : malloc(start.len);
        if (!pe) return fx_seterr(FX_ENOMEM, "redis: out of memory");
        size_t n = fx_prefix_end(start, pe);
        fx_err e;
        if (n == 1 && pe[0] == 0) {
            e = bound_make(b, '+', NULL, 0, NULL, 0);
        } else {
            end = (fx_slice){pe, n};
            const uint8_t *z = memchr(end.data, 0, end.len);
            e = z ? bound_make(b, '(', end.data, (size_t)(z - (const uint8_t *)end.data), "\1", 1)
                  : bound_make(b, '(', end.data, end.len, NULL, 0);
        }
        if (pe != small) free(pe);
        return e;
    }
    const uint8_t *z = memchr(end.data, 0, end.len);
    if (z) return bound_make(b, '(', end.data, (size_t)(z - (const uint8_t *)end.data), "\1", 1);
    return bound_make(b, '(', end.data, end.len, NULL, 0);
}

/* ---- operations ------------------------------------------------------------------------------ */

static fx_err kr_int(const redisReply *r, const char *what, long long *out)
{
    if (r->type == REDIS_REPLY_INTEGER) {
        *out = r->integer;
        return FX_OK;
    }
    if (r->type == REDIS_REPLY_STRING && r->len > 0 && r->len < 24) {
        char buf[24];
        memcpy(buf, r->str, r->len);
        buf[r->len] = 0;
        char *end = NULL;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (!errno && end && *end == 0) {
            *out = v;
            return FX_OK;
        }
    }
    return fx_seterr(FX_EPROTO, "redis %s: unexpected reply type %d", what, r->type);
}

/* Run `script` with one integer argument and read its integer reply. */
static fx_err kr_eval_int(kv_redis *k, bool ka, kr_kind kind, int timeout_ms, const char *what,
                          const char *script, int64_t arg, long long *out)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)arg);
    const char *a[1] = {num};
    size_t l[1] = {strlen(num)};
    redisReply *r = NULL;
    fx_err e = kr_eval(k, ka, kind, timeout_ms, what, script, 1, a, l, &r);
    if (e) return e;
    e = kr_int(r, what, out);
    freeReplyObject(r);
    return e;
}

static fx_err kr_allocate_lease(void *self, int64_t ttl_s, int64_t *out_id, int timeout_ms)
{
    long long id = 0;
    fx_err e = kr_eval_int(self, false, KR_WRITE, timeout_ms, "lease grant", LUA_ALLOC, ttl_s * 1000, &id);
    if (!e) *out_id = id;
    return e;
}

static fx_err kr_keepalive_lease(void *self, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    long long ttl = 0;
    fx_err e = kr_eval_int(self, true, KR_READ, timeout_ms, "lease keepalive", LUA_KEEPALIVE, id, &ttl);
    if (e) return e;
    if (ttl < 0) return fx_seterr(FX_ELEASE_EXPIRED, "redis: lease %lld expired or unknown",
                                  (long long)id);
    *out_ttl = (ttl + 999) / 1000;
    return FX_OK;
}

/* The lease set's Redis key: <prefix>l:<id>. */
static fx_err lease_key(const kv_redis *k, int64_t id, char *buf, size_t cap, size_t *len)
{
    int n = snprintf(buf, cap, "%sl:%lld", k->prefix, (long long)id);
    if (n < 0 || (size_t)n >= cap) return fx_seterr(FX_EINVAL, "kv redis: key prefix too long");
    *len = (size_t)n;
    return FX_OK;
}

/* The first error among a MULTI's replies (the queueing ones, then EXEC's, then the results of
 * the queued commands in order), as an fx_err; FX_OK when there is none. A command refused while
 * queueing (OOM: deny-oom) makes EXEC discard the whole transaction, and that first error names
 * why. */
static fx_err multi_err(redisReply **rep, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (rep[i]->type == REDIS_REPLY_ERROR) return reply_err(rep[i], what);
    const redisReply *x = rep[n - 1];
    if (x->type != REDIS_REPLY_ARRAY || x->elements != (size_t)(n - 2))
        return fx_seterr(FX_EPROTO, "redis %s: EXEC answered type %d with %zu replies", what,
                         x->type, x->type == REDIS_REPLY_ARRAY ? x->elements : (size_t)0);
    for (size_t i = 0; i < x->elements; i++)
        if (x->element[i]->type == REDIS_REPLY_ERROR) return reply_err(x->element[i], what);
    return FX_OK;
}

/* The WAIT reply of a put: FX_OK when min_replicas replicas acknowledged it within wt ms. A short
 * WAIT fails the put (FX_EUNAVAIL): the caller retries it (the put is idempotent) or reports. */
static fx_err wait_ok(kv_redis *k, const redisReply *w, int64_t wt)
{
    if (w->type == REDIS_REPLY_ERROR) return reply_err(w, "WAIT");
    if (w->type != REDIS_REPLY_INTEGER) return fx_seterr(FX_EPROTO, "redis WAIT: not an integer");
    if (w->integer >= k->min_replicas) return FX_OK;
    atomic_fetch_add(&k->n_wait_short, 1);
    return fx_seterr(FX_EUNAVAIL, "redis WAIT: %lld of %d replica(s) acknowledged the put within "
                     "%lld ms (kv.min_replicas)", (long long)w->integer, k->min_replicas,
                     (long long)wt);
}

/* One round trip: MULTI, PUT_PRE, ZADD of every member "key NUL value", PUT_POST, EXEC (see
 * LUA_PUT_PRE for why the members bypass Lua), then WAIT min_replicas when set. The first five
 * are encoded in one buffer (fx_resp.h), each value copied once, into the bytes that are sent. */
static fx_err kr_put_many(void *self, const fx_kv_item *items, size_t n, const fx_kv_put_opts *o,
                          int timeout_ms)
{
    kv_redis *k = self;
    for (size_t i = 0; i < n; i++)
        if (memchr(items[i].key.data, 0, items[i].key.len))
            return fx_seterr(FX_EINVAL, "kv redis: item %zu: key holds a NUL byte", i);
    int64_t deadline = fx_now_ms() + timeout_ms;
    char ids[32], lk[512];
    size_t lkn = 0;
    snprintf(ids, sizeof ids, "%lld", (long long)o->lease_id);
    fx_err e = lease_key(k, o->lease_id, lk, sizeof lk, &lkn);
    if (e) return e;
    const char *multi = "MULTI", *exec = "EXEC";
    size_t multil = 5, execl = 4;
    const char *head[5] = {"EVAL", LUA_PUT_PRE, "0", k->prefix, ids};
    size_t headl[5];
    for (int i = 0; i < 5; i++) headl[i] = strlen(head[i]);
    const char *post[5] = {"EVAL", LUA_PUT_POST, "0", k->prefix, ids};
    size_t postl[5] = {4, strlen(LUA_PUT_POST), 1, headl[3], headl[4]};
    /* MULTI | EVAL PRE 0 p id keys.. | ZADD lk (0 member)*n | EVAL POST 0 p id | EXEC */
    size_t size = fx_resp_cmd_size(1, &multil) + fx_resp_arr_size(5 + n) +
                  fx_resp_cmd_size(5, headl) - fx_resp_arr_size(5) + fx_resp_arr_size(2 + 2 * n) +
                  fx_resp_bulk_size(4) + fx_resp_bulk_size(lkn) + fx_resp_cmd_size(5, postl) +
                  fx_resp_cmd_size(1, &execl);
    for (size_t i = 0; i < n; i++)
        size += fx_resp_bulk_size(items[i].key.len) + fx_resp_bulk_size(1) +
                fx_resp_bulk_size(items[i].key.len + 1 + items[i].value.len);
    char *raw = malloc(size);
    if (!raw) return fx_seterr(FX_ENOMEM, "redis: out of memory (a put of %zu bytes)", size);
    char *w = fx_resp_cmd(raw, 1, &multi, &multil);
    w = fx_resp_arr(w, 5 + n);
    for (int i = 0; i < 5; i++) w = fx_resp_bulk(w, head[i], headl[i]);
    for (size_t i = 0; i < n; i++) w = fx_resp_bulk(w, items[i].key.data, items[i].key.len);
    w = fx_resp_arr(w, 2 + 2 * n);
    w = fx_resp_bulk(w, "ZADD", 4);
    w = fx_resp_bulk(w, lk, lkn);
    for (size_t i = 0; i < n; i++) {
        const fx_kv_item *it = &items[i];
        w = fx_resp_bulk(w, "0", 1);
        w = fx_resp_bulk_head(w, it->key.len + 1 + it->value.len);
        memcpy(w, it->key.data, it->key.len);
        w += it->key.len;
        *w++ = 0;
        if (it->value.len) memcpy(w, it->value.data, it->value.len);
        w = fx_resp_bulk_end(w + it->value.len);
    }
    w = fx_resp_cmd(w, 5, post, postl);
    w = fx_resp_cmd(w, 1, &exec, &execl);
    assert((size_t)(w - raw) == size); /* sized above; test_resp and the ASan build check it */
    int64_t wt = 0;
    char nb[16], tb[24];
    const char *wait[3] = {"WAIT", nb, tb};
    size_t waitl[3] = {4, 0, 0};
    kr_cmdv waitc = {3, wait, waitl};
    int nc = k->min_replicas > 0 ? 6 : 5;
    redisReply *rep[6] = {0};
    kr_conn *cn = NULL;
    e = kr_acquire(k, deadline, &cn);
    if (!e) {
        e = kr_guard(k, cn, deadline);
        if (!e && nc == 6) {
            int64_t left = deadline - fx_now_ms();
            wt = left > 200 ? left - 100 : left / 2; /* WAIT answers before the read times out */
            if (wt < 1) wt = 1;
            snprintf(nb, sizeof nb, "%d", k->min_replicas);
            snprintf(tb, sizeof tb, "%lld", (long long)wt);
            waitl[1] = strlen(nb);
            waitl[2] = strlen(tb);
        }
        if (!e) e = kr_pipe_raw(k, cn, deadline, "put", raw, size, 5, nc, &waitc, rep);
        else free(raw);
        kr_release(k, cn);
    } else {
        free(raw);
    }
    if (!e) e = multi_err(rep, 5, "put");
    if (!e && nc == 6) e = wait_ok(k, rep[5], wt);
    if (e == FX_ENOSPACE) atomic_fetch_add(&k->n_oom, 1);
    for (int i = 0; i < nc; i++)
        if (rep[i]) freeReplyObject(rep[i]);
    return e;
}

typedef struct kr_member {
    const char *key;
    size_t klen;
    const char *val;
    size_t vlen;
    redisReply *el; /* the member's reply string (key and val point into it) */
} kr_member;

static int member_cmp(const void *a, const void *b)
{
    const kr_member *x = a, *y = b;
    size_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(x->key, y->key, n);
    if (c) return c;
    return x->klen < y->klen ? -1 : x->klen > y->klen;
}

static uint8_t *dup_bytes(const char *p, size_t n)
{
    uint8_t *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, p, n);
    d[n] = 0;
    return d;
}

/* The members of a range reply (an array of "key NUL value") into out, in key order, at most
 * limit (0: all); `sorted`: the array is already in key order (one set's ZRANGEBYLEX). A value
 * is not copied: it is moved to the front of its reply string, which out takes over (hiredis
 * allocates strings with malloc, len + 1 bytes: room for the value and its NUL); the key is. */
static fx_err range_out(redisReply *r, int64_t limit, bool sorted, fx_range_resp *out)
{
    if (r->type != REDIS_REPLY_ARRAY) return fx_seterr(FX_EPROTO, "redis range: reply is not an array");
    size_t n = r->elements;
    kr_member *m = n ? calloc(n, sizeof *m) : NULL;
    if (n && !m) return fx_seterr(FX_ENOMEM, "redis: out of memory");
    for (size_t i = 0; i < n; i++) {
        redisReply *el = r->element[i];
        const char *z = el->type == REDIS_REPLY_STRING ? memchr(el->str, 0, el->len) : NULL;
        if (!z) {
            free(m);
            return fx_seterr(FX_EPROTO, "redis range: malformed member");
        }
        m[i] = (kr_member){el->str, (size_t)(z - el->str), z + 1,
                           el->len - (size_t)(z - el->str) - 1, el};
    }
    if (n > 1 && !sorted) qsort(m, n, sizeof *m, member_cmp);
    size_t keep = limit > 0 && (size_t)limit < n ? (size_t)limit : n;
    out->count = (int64_t)n;
    out->more = keep < n;
    out->kvs = keep ? calloc(keep, sizeof *out->kvs) : NULL;
    fx_err e = keep && !out->kvs ? fx_seterr(FX_ENOMEM, "redis: out of memory") : FX_OK;
    for (size_t i = 0; !e && i < keep; i++) {
        fx_kv *kv = &out->kvs[i];
        kv->key.data = dup_bytes(m[i].key, m[i].klen);
        out->n_kvs = i + 1;
        if (!kv->key.data) {
            e = fx_seterr(FX_ENOMEM, "redis: out of memory");
            break;
        }
        kv->key.len = m[i].klen;
        char *str = m[i].el->str;
        memmove(str, m[i].val, m[i].vlen);
        str[m[i].vlen] = 0;
        m[i].el->str = NULL; /* freeReplyObject frees it no more: out owns it */
        m[i].el->len = 0;
        kv->value.data = (uint8_t *)str;
        kv->value.len = m[i].vlen;
    }
    free(m);
    if (e) {
        fx_range_resp_free(out);
        memset(out, 0, sizeof *out);
    }
    return e;
}

/* Every live lease's set (LUA_RANGE: one script, atomic). */
static fx_err kr_range(kv_redis *k, const kr_bound *lo, const kr_bound *hi, int64_t limit,
                       fx_range_resp *out, int timeout_ms)
{
    char lim[32];
    snprintf(lim, sizeof lim, "%lld", (long long)limit);
    const char *a[3] = {lo->p, hi->p, lim};
    size_t l[3] = {lo->len, hi->len, strlen(lim)};
    redisReply *r = NULL;
    fx_err e = kr_eval(k, false, KR_READ, timeout_ms, "range", LUA_RANGE, 3, a, l, &r);
    if (e) return e;
    e = range_out(r, limit, false, out);
    freeReplyObject(r);
    return e;
}

/* One lease's set only, FX_ELEASE_EXPIRED when the set is gone: MULTI, EXISTS, ZRANGEBYLEX, EXEC
 * in one round trip, without Lua (the members are payloads: see LUA_PUT_PRE). */
static fx_err kr_range_lease(kv_redis *k, int64_t lease, const kr_bound *lo, const kr_bound *hi,
                             int64_t limit, fx_range_resp *out, int timeout_ms)
{
    int64_t deadline = fx_now_ms() + timeout_ms;
    char lk[512], lim[32];
    size_t lkn = 0;
    fx_err e = lease_key(k, lease, lk, sizeof lk, &lkn);
    if (e) return e;
    snprintf(lim, sizeof lim, "%lld", (long long)limit);
    const char *multi[1] = {"MULTI"}, *exec[1] = {"EXEC"}, *ex[2] = {"EXISTS", lk};
    const char *zr[7] = {"ZRANGEBYLEX", lk, lo->p, hi->p, "LIMIT", "0", lim};
    size_t multil[1] = {5}, execl[1] = {4}, exl[2] = {6, lkn};
    size_t zrl[7] = {11, lkn, lo->len, hi->len, 5, 1, strlen(lim)};
    kr_cmdv cmds[4] = {{1, multi, multil}, {2, ex, exl}, {limit > 0 ? 7 : 4, zr, zrl}, {1, exec, execl}};
    redisReply *rep[4] = {0};
    kr_conn *cn = NULL;
    if ((e = kr_acquire(k, deadline, &cn))) return e;
    e = kr_pipe(k, cn, deadline, "range", 4, cmds, rep);
    kr_release(k, cn);
    if (!e) e = multi_err(rep, 4, "range");
    if (!e && (rep[3]->element[0]->type != REDIS_REPLY_INTEGER))
        e = fx_seterr(FX_EPROTO, "redis range: EXISTS answered type %d", rep[3]->element[0]->type);
    if (!e && rep[3]->element[0]->integer == 0)
        e = fx_seterr(FX_ELEASE_EXPIRED, "redis range: the set of lease %lld is gone (expired, "
                      "evicted or deleted)", (long long)lease);
    if (!e) e = range_out(rep[3]->element[1], limit, true, out);
    for (int i = 0; i < 4; i++)
        if (rep[i]) freeReplyObject(rep[i]);
    return e;
}

/* Both bounds of [start, end) (lo_bound / hi_bound rules); both released with bound_done on
 * success, nothing held on error. */
static fx_err range_bounds(kr_bound *lo, kr_bound *hi, fx_slice start, fx_slice end)
{
    fx_err e = lo_bound(lo, start);
    if (e) return e;
    if ((e = hi_bound(hi, start, end))) bound_done(lo);
    return e;
}

static fx_err kr_get_range(void *self, fx_slice start, fx_slice end, int64_t limit,
                           fx_range_resp *out, int timeout_ms)
{
    kr_bound lo, hi;
    fx_err e = range_bounds(&lo, &hi, start, end);
    if (e) return e;
    e = kr_range(self, &lo, &hi, limit, out, timeout_ms);
    bound_done(&lo);
    bound_done(&hi);
    return e;
}

static fx_err kr_get_range_lease(void *self, int64_t lease, fx_slice start, fx_slice end,
                                 int64_t limit, fx_range_resp *out, int timeout_ms)
{
    kr_bound lo, hi;
    fx_err e = range_bounds(&lo, &hi, start, end);
    if (e) return e;
    e = kr_range_lease(self, lease, &lo, &hi, limit, out, timeout_ms);
    bound_done(&lo);
    bound_done(&hi);
    return e;
}

static fx_err kr_get(void *self, fx_slice key, fx_bytes *out, int timeout_ms)
{
    if (memchr(key.data, 0, key.len)) return fx_seterr(FX_ENOTFOUND, "kv redis: key not found");
    kr_bound lo, hi;
    fx_err e = bound_make(&lo, '[', key.data, key.len, "\0", 1);
    if (e) return e;
    if ((e = bound_make(&hi, '(', key.data, key.len, "\1", 1))) {
        bound_done(&lo);
        return e;
    }
    fx_range_resp rr = {0};
    e = kr_range(self, &lo, &hi, 1, &rr, timeout_ms);
    bound_done(&lo);
    bound_done(&hi);
    if (e) return e;
    if (rr.n_kvs == 0) {
        fx_range_resp_free(&rr);
        return fx_seterr(FX_ENOTFOUND, "kv redis: key not found");
    }
    *out = rr.kvs[0].value;
    rr.kvs[0].value = (fx_bytes){0};
    fx_range_resp_free(&rr);
    return FX_OK;
}

static fx_err kr_count_or_delete(kv_redis *k, const char *script, const char *what, fx_slice start,
                                 fx_slice end, int64_t *out, int timeout_ms)
{
    kr_bound lo, hi;
    fx_err e = range_bounds(&lo, &hi, start, end);
    if (e) return e;
    const char *a[2] = {lo.p, hi.p};
    size_t l[2] = {lo.len, hi.len};
    redisReply *r = NULL;
    e = kr_eval(k, false, KR_READ, timeout_ms, what, script, 2, a, l, &r);
    bound_done(&lo);
    bound_done(&hi);
    if (e) return e;
    long long n = 0;
    e = kr_int(r, what, &n);
    freeReplyObject(r);
    if (!e) *out = n;
    return e;
}

static fx_err kr_delete_range(void *self, fx_slice start, fx_slice end, int64_t *out_deleted,
                              int timeout_ms)
{
    return kr_count_or_delete(self, LUA_DELETE, "delete", start, end, out_deleted, timeout_ms);
}

static fx_err kr_count_prefix(void *self, fx_slice prefix, int64_t *out_count, int timeout_ms)
{
    return kr_count_or_delete(self, LUA_COUNT, "count", prefix, (fx_slice){NULL, 0}, out_count,
                              timeout_ms);
}

static void kr_destroy(void *self)
{
    kv_redis *k = self;
    if (!k) return;
    for (int i = 0; i < KR_MAX_POOL; i++)
        if (k->conns[i].ctx) redisFree(k->conns[i].ctx);
    if (k->ka.ctx) redisFree(k->ka.ctx);
    if (k->chk.ctx) redisFree(k->chk.ctx);
    pthread_mutex_destroy(&k->chk_mu);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->ka_mu);
    free(k->prefix);
    free(k->host);
    free(k->path);
    free(k->user);
    free(k->pass);
    free(k);
}

static const fx_kv_ops kv_redis_ops = {
    .allocate_lease = kr_allocate_lease,
    .keepalive_lease = kr_keepalive_lease,
    .put_many = kr_put_many,
    .get = kr_get,
    .get_range = kr_get_range,
    .delete_range = kr_delete_range,
    .count_prefix = kr_count_prefix,
    .destroy = kr_destroy,
    .get_range_lease = kr_get_range_lease,
};

/* ---- url, construction ----------------------------------------------------------------------- */

static bool parse_db(const char *s, int *db)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < 0 || v > 65535) return false;
    *db = (int)v;
    return true;
}

/* Parse the url into k (host/port/path/user/pass/db) with the one URL parser (fx_url.h):
 * redis://[[user]:password@]host[:port][/db] or unix:/path[?db=N]. Errors never quote the url. */
static fx_err parse_url(kv_redis *k, const char *url)
{
    if (!strncmp(url, "rediss://", 9))
        return fx_seterr(FX_EINVAL, "kv.url: rediss:// (TLS) is not supported: hiredis 0.14 "
                                    "(Debian 12) has no TLS; use a unix socket or a tunnel");
    fx_url u;
    char why[160];
    fx_url_status st = fx_url_parse(url, FX_URL_USERINFO | FX_URL_PATH | FX_URL_QUERY, &u, why, sizeof why);
    static const char *const schemes[] = {"redis", "unix", NULL};
    if (st == FX_URL_ESCHEME || (st == FX_URL_OK && !fx_url_scheme_is(&u, schemes))) {
        fx_url_wipe(&u);
        return fx_seterr(FX_EINVAL, "kv.url: must start with redis:// or unix:");
    }
    if (st) return fx_seterr(st == FX_URL_ENOMEM ? FX_ENOMEM : FX_EINVAL, "kv.url: %s", why);
    fx_err e = FX_OK;
    if (!strcmp(u.scheme, "unix")) {
        if (u.has_query && (strncmp(u.query, "db=", 3) || !parse_db(u.query + 3, &k->db)))
            e = fx_seterr(FX_EINVAL, "kv.url: unix: only ?db=N is understood");
        else if (!(k->path = strdup(u.path)))
            e = fx_seterr(FX_ENOMEM, "kv: out of memory");
        fx_url_wipe(&u);
        return e;
    }
    k->port = u.port ? u.port : 6379;
    if (u.has_query) e = fx_seterr(FX_EINVAL, "kv.url: redis:// takes no ?query");
    else if (u.has_user && !u.has_password)
        e = fx_seterr(FX_EINVAL, "kv.url: credentials must be [user]:password@");
    else if (u.path[0] && !parse_db(u.path + 1, &k->db))
        e = fx_seterr(FX_EINVAL, "kv.url: bad database number");
    else if (!(k->host = strdup(u.host)) || (u.has_user && u.user[0] && !(k->user = strdup(u.user))) ||
             (u.has_password && !(k->pass = strdup(u.password))))
        e = fx_seterr(FX_ENOMEM, "kv: out of memory");
    fx_url_wipe(&u);
    return e;
}

fx_err fx_kv_new_redis(const fx_kv_redis_opts *opts, fx_kv_store **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "kv: NULL out");
    *out = NULL;
    if (!opts || !opts->url || !opts->prefix || !opts->prefix[0])
        return fx_seterr(FX_EINVAL, "kv redis: a url and a non-empty prefix are required");
    if (opts->pool_size < 0 || opts->pool_size > KR_MAX_POOL || opts->connect_timeout_ms < 0 ||
        opts->min_replicas < 0 || opts->min_replicas > FX_KV_REDIS_MAX_REPLICAS ||
        opts->recheck_ms < 0)
        return fx_seterr(FX_EINVAL, "kv redis: pool_size 0..%d, connect_timeout_ms >= 0, "
                         "min_replicas 0..%d, recheck_ms >= 0", KR_MAX_POOL,
                         FX_KV_REDIS_MAX_REPLICAS);
    kv_redis *k = calloc(1, sizeof *k);
    if (!k) return fx_seterr(FX_ENOMEM, "kv: out of memory");
    pthread_mutex_init(&k->mu, NULL);
    fx_cond_init_monotonic(&k->cv);
    pthread_mutex_init(&k->ka_mu, NULL);
    pthread_mutex_init(&k->chk_mu, NULL);
    k->n_conns = opts->pool_size ? opts->pool_size : KR_DEFAULT_POOL;
    k->connect_timeout_ms = opts->connect_timeout_ms;
    k->require_fsync = opts->require_fsync;
    k->min_replicas = opts->min_replicas;
    k->recheck_ms = opts->recheck_ms ? opts->recheck_ms : FX_KV_REDIS_RECHECK_MS;
    fx_err e = parse_url(k, opts->url);
    if (!e && !(k->prefix = strdup(opts->prefix))) e = fx_seterr(FX_ENOMEM, "kv: out of memory");
    if (e) {
        kr_destroy(k);
        return e;
    }
    k->plen = strlen(k->prefix);
    char uid[768];
    if (k->host)
        snprintf(uid, sizeof uid, "kv(redis(%s:%d/%d %s))", k->host, k->port, k->db, k->prefix);
    else
        snprintf(uid, sizeof uid, "kv(redis(unix:%s/%d %s))", k->path, k->db, k->prefix);
    e = fx_kv__wrap(&kv_redis_ops, k, uid, opts->prefix,
                    opts->default_timeout_ms > 0 ? opts->default_timeout_ms : KR_DEFAULT_TIMEOUT_MS,
                    out);
    if (e) kr_destroy(k);
    return e;
}

bool fx_kv_is_redis(const fx_kv_store *s) { return fx_kv__self(s, &kv_redis_ops) != NULL; }

/* A line "name:value" of an INFO reply. */
static bool info_field(const char *info, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = info; p && *p;) {
        if (!strncmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            size_t n = strcspn(v, "\r\n");
            if (n >= cap) n = cap - 1;
            memcpy(out, v, n);
            out[n] = 0;
            return true;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return false;
}

/* CONFIG GET name -> value into out ("" if refused or absent). */
static fx_err config_get(kv_redis *k, kr_conn *cn, int64_t deadline, const char *name, char *out,
                         size_t cap)
{
    const char *av[3] = {"CONFIG", "GET", name};
    size_t al[3] = {6, 3, strlen(name)};
    redisReply *r = NULL;
    out[0] = 0;
    fx_err e = kr_run(k, cn, deadline, "CONFIG GET", 3, av, al, &r);
    if (e == FX_ESERVER || e == FX_EPERM) return FX_OK; /* CONFIG may be renamed/forbidden */
    if (e) return e;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING)
        snprintf(out, cap, "%.*s", (int)r->element[1]->len, r->element[1]->str);
    freeReplyObject(r);
    return FX_OK;
}

fx_err fx_kv_redis_read_persistence(fx_kv_store *s, fx_kv_redis_persistence *out, int timeout_ms)
{
    kv_redis *k = fx_kv__self(s, &kv_redis_ops);
    if (!k || !out) return fx_seterr(FX_EINVAL, "kv: not a Redis store");
    memset(out, 0, sizeof *out);
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : KR_DEFAULT_TIMEOUT_MS);
    kr_conn *cn = NULL;
    fx_err e = kr_acquire(k, deadline, &cn);
    if (e) return e;
    const char *av[2] = {"INFO", "persistence"};
    size_t al[2] = {4, 11};
    redisReply *r = NULL;
    e = kr_run(k, cn, deadline, "INFO persistence", 2, av, al, &r);
    if (!e) {
        char v[32];
        if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
            if (info_field(r->str, "aof_enabled", v, sizeof v)) out->aof_enabled = !strcmp(v, "1");
        }
        freeReplyObject(r);
        char save[256];
        e = config_get(k, cn, deadline, "appendfsync", out->appendfsync, sizeof out->appendfsync);
        if (!e) e = config_get(k, cn, deadline, "save", save, sizeof save);
        if (!e) out->rdb_enabled = save[0] != 0;
    }
    kr_release(k, cn);
    return e;
}

/* ---- write guard ------------------------------------------------------------------------------
 *
 * Writes (puts, lease grants) are refused while Redis may drop what a PubAck promised:
 *  - maxmemory-policy other than noeviction: every volatile-* and allkeys-* policy evicts whole
 *    keys, and one key is a channel's whole backlog (its lease set). Refused also with maxmemory
 *    0 (nothing evicts then, but CONFIG SET maxmemory at runtime would start evicting at once,
 *    faster than any re-check).
 *  - with require_fsync: anything but appendonly yes + appendfsync always;
 *  - a Redis older than 7.0 (the scripts declare their flags with a shebang).
 * The check (INFO server memory persistence, plus CONFIG GET appendfsync with require_fsync: one
 * or two round trips) runs on a connection after each dial (a re-dial may reach another Redis)
 * and again before a write once the connection's last check is recheck_ms old, so a runtime
 * CONFIG SET is seen within one period; nothing is added per message. A check whose result
 * differs from the last one (on any connection, or fx_kv_redis_check's, which the daemon runs
 * every second) makes every connection check again before its next write. Reads, keepalives and
 * deletes are never refused (consumers drain, leases stay alive). The state changes are logged
 * (ERR when writes start being refused, INF when they are accepted again). */

/* The check on one connection: FX_OK, FX_EINVAL with why, or a transport error. */
static fx_err guard_check(kv_redis *k, kr_conn *cn, int64_t deadline, char *why, size_t cap)
{
    const char *av[4] = {"INFO", "server", "memory", "persistence"};
    size_t al[4] = {4, 6, 6, 11};
    redisReply *r = NULL;
    why[0] = 0;
    fx_err e = kr_run(k, cn, deadline, "INFO", 4, av, al, &r);
    if (e == FX_ESERVER || e == FX_EPERM) {
        snprintf(why, cap, "INFO is refused (%.120s): cannot verify maxmemory-policy noeviction",
                 fx_err_detail());
        return FX_EINVAL;
    }
    if (e) return e;
    char ver[32] = "", pol[48] = "", aof[8] = "";
    bool have_pol = false;
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
        info_field(r->str, "redis_version", ver, sizeof ver);
        have_pol = info_field(r->str, "maxmemory_policy", pol, sizeof pol);
        info_field(r->str, "aof_enabled", aof, sizeof aof);
    }
    freeReplyObject(r);
    if (atoi(ver) < 7) {
        snprintf(why, cap, "Redis %s: the bridge needs Redis >= 7.0 (its scripts declare flags)",
                 ver[0] ? ver : "(version unknown)");
        return FX_EINVAL;
    }
    if (!have_pol) {
        snprintf(why, cap, "INFO memory has no maxmemory_policy: cannot verify noeviction");
        return FX_EINVAL;
    }
    if (strcmp(pol, "noeviction") != 0) {
        snprintf(why, cap, "maxmemory-policy %s evicts keys (a channel's whole backlog is one "
                 "key): set maxmemory-policy noeviction", pol);
        return FX_EINVAL;
    }
    if (k->require_fsync) {
        char fs[16];
        if ((e = config_get(k, cn, deadline, "appendfsync", fs, sizeof fs))) return e;
        if (strcmp(aof, "1") != 0 || strcmp(fs, "always") != 0) {
            snprintf(why, cap, "kv.require_fsync: Redis has appendonly %s, appendfsync %s; need "
                     "appendonly yes and appendfsync always", strcmp(aof, "1") ? "no" : "yes",
                     fs[0] ? fs : "(unknown: CONFIG GET refused)");
            return FX_EINVAL;
        }
    }
    return FX_OK;
}

/* Record a check's result on cn and in the store's state (logging the transitions). */
static void guard_note(kv_redis *k, kr_conn *cn, bool refused, const char *why, bool quiet)
{
    cn->checked_ms = fx_now_ms();
    cn->refused = refused;
    snprintf(cn->why, sizeof cn->why, "%s", refused ? why : "");
    if (atomic_exchange(&k->g_refused, refused) != refused) {
        atomic_fetch_add(&k->g_epoch, 1); /* the other connections check before their next write */
        if (!quiet && refused)
            FX_ERR("kv redis: refusing writes (publishes get errors, nothing is acked) until it "
                   "holds: %s", why);
        else if (!quiet)
            FX_INF("kv redis: maxmemory-policy noeviction%s holds again: writes accepted",
                   k->require_fsync ? " and appendfsync always" : "");
    }
    cn->epoch = atomic_load(&k->g_epoch);
}

/* Before a write on cn (busy: owned by the caller): dial, check when due, refuse when it does not
 * hold. */
static fx_err kr_guard(kv_redis *k, kr_conn *cn, int64_t deadline)
{
    fx_err e;
    if (!cn->ctx && (e = kr_dial(k, cn, deadline))) return e;
    if (cn->checked_ms == 0 || fx_now_ms() - cn->checked_ms >= k->recheck_ms ||
        cn->epoch != atomic_load(&k->g_epoch)) {
        char why[sizeof cn->why];
        e = guard_check(k, cn, deadline, why, sizeof why);
        if (e && e != FX_EINVAL) return e;
        guard_note(k, cn, e == FX_EINVAL, why, false);
    }
    if (!cn->refused) return FX_OK;
    atomic_fetch_add(&k->n_refused, 1);
    static fx_log_slot slot;
    fx_log_ratelimited(&slot, 30000, FX_LOG_ERR, "kv redis: writes refused: %s "
                       "(fluxon_kv_redis_writes_refused_total)", cn->why);
    return fx_seterr(FX_EUNAVAIL, "redis refuses writes: %s", cn->why);
}

fx_err fx_kv_redis_check(fx_kv_store *s, bool quiet, char *why, size_t cap, int timeout_ms)
{
    kv_redis *k = fx_kv__self(s, &kv_redis_ops);
    if (why && cap) why[0] = 0;
    if (!k) return fx_seterr(FX_EINVAL, "kv: not a Redis store");
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : KR_DEFAULT_TIMEOUT_MS);
    kr_conn *cn = &k->chk;
    char w[sizeof cn->why] = "";
    fx_err e = FX_OK;
    pthread_mutex_lock(&k->chk_mu);
    if (!cn->ctx) e = kr_dial(k, cn, deadline);
    if (!e) e = guard_check(k, cn, deadline, w, sizeof w);
    if (!e || e == FX_EINVAL) guard_note(k, cn, e == FX_EINVAL, w, quiet);
    pthread_mutex_unlock(&k->chk_mu);
    if (why && cap) snprintf(why, cap, "%s", w);
    return e == FX_EINVAL ? fx_seterr(FX_EINVAL, "%s", w) : e;
}

void fx_kv_redis_get_stats(const fx_kv_store *s, fx_kv_redis_stats *out)
{
    memset(out, 0, sizeof *out);
    kv_redis *k = fx_kv__self(s, &kv_redis_ops);
    if (!k) return;
    out->refused = atomic_load(&k->g_refused);
    out->refused_writes = atomic_load(&k->n_refused);
    out->oom = atomic_load(&k->n_oom);
    out->wait_short = atomic_load(&k->n_wait_short);
}
