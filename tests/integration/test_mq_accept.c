/* test_mq_accept.c -- the named acceptance tests of the Fluxon MQ core (bridge/) against a
 * real etcd, through the public API only (bridge/fluxon_mq.h). etcd state is inspected and
 * injected directly with lease/etcd.h; key names come from bridge/keys.h. Channel TTL is 3 s.
 *
 * mq_chan_id_monotonic: channel A used and left to expire, then B = A + 1; the chan id counter
 *   has no lease; sub-MPSC ids come from the same counter (in blocks of 16 per client).
 * mq_mpsc_exact_once_graceful: 4 producers x 1000 messages into one MPSC, one consumer acking
 *   everything: received == sent, no duplicate, per-producer FIFO with contiguous ids, payloads
 *   deleted. Run twice: payloads on the control-plane etcd, and on a separate KV etcd.
 * mq_no_keys_after_ttl: MPSC + MPMC used and closed; after TTL only the two global unleased
 *   counters (chan ids, mpmc ids) and the unique mapping remain under the root (long allocator
 *   lease shortened to 4 s, so the per-channel counters, the MPMC member-id one included, go too).
 * mq_mpmc_dynamic: 3 phases, up to 6 producers and 4 consumers join; graceful drain; consumed
 *   multiset == produced set, per-(sub-MPSC, producer) order, every consumer got messages.
 * mq_consumer_crash_redelivers: a consumer in a child process (re-exec of this binary) takes 20
 *   messages, acks 10, is SIGKILLed; after its member lease expires a new consumer claims the
 *   orphaned sub-MPSC and gets exactly every message not acknowledged.
 * mq_member_lease_lost_closes: revoking a producer's (and a consumer's) member lease: next call
 *   FX_ELEASE_LOST, then FX_ECLOSED; the producer created no sub-MPSC.
 * mq_payload_lease_lost_closes: revoking the payload lease closes MPSC producer and consumer and
 *   an MPMC producer with FX_ELEASE_LOST, then FX_ECLOSED.
 * mq_capacity_blocks_then_fails: capacity 2: a batch of 3 stores 2 and fails FX_EFULL at its
 *   deadline; a third put fails at its deadline; exactly one slot frees per acked message; closing
 *   the producer releases a blocked put at once; the same for an MPMC producer.
 * mq_consumer_create_race: two consumers opened at once on a one-sub-MPSC MPMC: two sub-MPSCs,
 *   two ready keys, each owned by one of them (5 rounds).
 * mq_handoff_order: close deletes membership, then ready, then role (watch revisions). A proxy in
 *   front of etcd drops exactly the membership delete of a closing consumer: the ready key stays,
 *   the role key goes, ready and membership expire in one revision. With etcd stopped for the
 *   whole close: close is prompt and all three expire together.
 * mq_attach_keeps_channel_alive: the creator leaves; an attached producer alone keeps meta,
 *   payload and id-allocator leases alive > 3 x TTL; a later attach succeeds, payloads survive.
 * mq_close_idempotent_concurrent: for each endpoint kind, 4 threads close twice each while a put
 *   or get is blocked: all closes FX_OK and prompt, the blocked call FX_ECLOSED at once.
 * mq_no_id_gap: a batch failing while etcd is stopped and retried leaves contiguous ids; a hole
 *   made by hand below the produce offset is skipped and consumption goes on.
 * mq_client_close_closes_endpoints: closing the client with open endpoints closes them (later
 *   calls FX_ECLOSED) and leaves the same etcd key set as closing them one by one.
 *
 * kv_redis_lease_set_missing_is_lost_plane (Redis group only): a consumer that took and acked a
 *   first batch finds the channel's payload lease set deleted by hand (as an eviction or a data
 *   loss would) when it reads the second: a lost plane, not "payloads missing": the get fails
 *   with FX_ELEASE_LOST, the consumer is closed after it, nothing is counted as skipped, the
 *   consume offset stays at the first batch (no commit past the gap), the client counts one lost
 *   plane (fluxon_payload_plane_lost_total).
 *
 * Every test runs twice: on the etcd payload plane (fused; mq_mpsc_exact_once_graceful also on a
 * separate KV etcd), then, named with the suffix _redis, on the Redis plane (payloads in a
 * redis-server started by the harness; the split write order: payload put, then offset txn).
 * There the payload inspections/injections go to Redis: payload counts, the payload lease's
 * Redis key (DEL = the lease revoked, PTTL = alive), the hole made by hand.
 *
 * Usage: test_mq_accept [cmocka filter, e.g. mq_handoff_order]. Waits poll with deadlines; the only
 * fixed pauses are fault injection (etcd stopped) and settles that no result depends on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "etcd.h"
#include "flatdict.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "keys.h"
#include "meta.h"
#include "lease_mgr.h"
#include "tests/support/fxt.h"
#include "tests/support/fxt_check.h"
#include "tests/support/fxt_proxy.h"

#define OP_MS 5000
#define TTL 3
#define CHILD_FLAG "--mq-crash-child"
#define CHILD_FD 200

/* ---- global state (one etcd per program) ------------------------------------------------------ */

static struct {
    fxt_etcd etcd;
    fx_etcd *raw; /* inspection / injection client */
    const char *eps[1];
    const char *kv_eps[1];
    bool paused;
    pid_t child;
    int64_t t_start; /* of the running test */
    fxt_etcd kv_etcd; /* the separate payload etcd of one variant (pid 0 when not running) */
    bool redis_mode;  /* the _redis group: payloads in G.redis */
    fxt_redis redis;
} G;

#define CHECK_ERR(want, call)                                                                    \
    do {                                                                                         \
        fx_err chk_e_ = (call);                                                                  \
        if (chk_e_ != (want))                                                                    \
            fail_msg("%s: got %s (%s), want %s", #call, fx_errname(chk_e_), fx_err_detail(),     \
                     fx_errname(want));                                                          \
    } while (0)

static int64_t now_ms(void) { return fxt_now_ms(); }

/* ---- raw etcd helpers (main thread only: they assert) ---------------------------------------- */

static bool raw_get(const char *key, fx_kv *out)
{
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(G.raw, FX_SLICE_STR(key), &kv, OP_MS);
    if (e != FX_OK && e != FX_ENOTFOUND) fail_msg("get %s: %s (%s)", key, fx_errname(e), fx_err_detail());
    if (out) *out = kv;
    else fx_kv_free(&kv);
    return e == FX_OK;
}

static bool raw_exists(const char *key) { return raw_get(key, NULL); }

static int64_t raw_get_int(const char *key)
{
    fx_kv kv = {0};
    if (!raw_get(key, &kv)) return -1;
    int64_t v = strtoll((const char *)kv.value.data, NULL, 10);
    fx_kv_free(&kv);
    return v;
}

static void raw_range_prefix_on(fx_etcd *c, const char *prefix, bool count_only, fx_range_resp *out)
{
    uint8_t end[1024];
    fx_slice p = FX_SLICE_STR(prefix);
    size_t el = fx_prefix_end(p, end);
    fx_range_req r = {.key = p, .range_end = {end, el}, .count_only = count_only};
    fx_err e = fx_etcd_range(c, &r, out, OP_MS);
    if (e != FX_OK) fail_msg("range %s: %s (%s)", prefix, fx_errname(e), fx_err_detail());
}

static int64_t raw_count_on(fx_etcd *c, const char *prefix)
{
    fx_range_resp r = {0};
    raw_range_prefix_on(c, prefix, true, &r);
    int64_t n = r.count;
    fx_range_resp_free(&r);
    return n;
}

static int64_t raw_count(const char *prefix) { return raw_count_on(G.raw, prefix); }

static void raw_list(const char *prefix, fx_range_resp *out) { raw_range_prefix_on(G.raw, prefix, false, out); }

static void dump_prefix(const char *prefix)
{
    fx_range_resp r = {0};
    raw_list(prefix, &r);
    fprintf(stderr, "  keys under %s (%zu):\n", prefix, r.n_kvs);
    for (size_t i = 0; i < r.n_kvs; i++)
        fprintf(stderr, "    %s lease=%" PRId64 " value=%.80s\n", (const char *)r.kvs[i].key.data,
                r.kvs[i].lease, (const char *)r.kvs[i].value.data);
    fx_range_resp_free(&r);
}

static int64_t lease_ttl(int64_t id, int64_t *granted)
{
    int64_t ttl = 0;
    CHECK(fx_etcd_lease_timetolive(G.raw, id, &ttl, granted, OP_MS));
    return ttl;
}

/* The integer value of "field": N or "field":"N" in a flat JSON text; -1 if absent. */
static int64_t json_int(const char *json, const char *field)
{
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\"", field);
    const char *p = strstr(json, pat);
    if (!p) return -1;
    p += strlen(pat);
    while (*p == ' ' || *p == ':' || *p == '"') p++;
    return strtoll(p, NULL, 10);
}

/* Number of decimal ids in a JSON list like ["17","21"]. */
static int json_list_count(const char *json, int64_t *ids, int cap)
{
    int n = 0;
    for (const char *p = json; *p;) {
        if (*p >= '0' && *p <= '9') {
            char *end = NULL;
            int64_t v = strtoll(p, &end, 10);
            if (n < cap && ids) ids[n] = v;
            n++;
            p = end;
        } else {
            p++;
        }
    }
    return n;
}

static bool wait_absent(const char *key, int timeout_ms)
{
    int64_t dl = now_ms() + timeout_ms;
    for (;;) {
        if (!raw_exists(key)) return true;
        if (now_ms() > dl) return false;
        fxt_nap_ms(50);
    }
}

/* ---- keys ----------------------------------------------------------------------------------- */

static fx_mq_keys mkkeys(const char *root)
{
    fx_mq_keys k;
    CHECK(fx_mq_keys_init(&k, root));
    return k;
}

/* Control-plane copy of a payload key: root + "/kv/" + relative key (default kv prefix). */
static void payload_abs(const char *root, const fx_mq_key *rel, char *out, size_t cap)
{
    snprintf(out, cap, "%s/kv/%s", root, rel->s);
}

static void kv_prefix(const char *root, char *out, size_t cap) { snprintf(out, cap, "%s/kv/", root); }

/* ---- Redis plane inspection (the _redis group) ---------------------------------------------- */

/* A store on the Redis payload prefix of `root` (the clients' default kv prefix). */
static fx_kv_store *redis_store(const char *root)
{
    char kvp[256];
    kv_prefix(root, kvp, sizeof kvp);
    fx_kv_redis_opts o = {.url = G.redis.url, .prefix = kvp, .default_timeout_ms = OP_MS};
    fx_kv_store *s = NULL;
    CHECK(fx_kv_new_redis(&o, &s));
    return s;
}

/* Payload keys under root's kv prefix + rel_prefix, in Redis. */
static int64_t redis_count(const char *root, const char *rel_prefix)
{
    fx_kv_store *s = redis_store(root);
    int64_t n = -1;
    CHECK(fx_kv_count_prefix(s, FX_SLICE_STR(rel_prefix), &n, OP_MS));
    fx_kv_store_free(s);
    return n;
}

/* One raw Redis command on the payload lease's key: "DEL" (= the lease revoked) or "PTTL". */
static long long redis_lease_cmd(const char *root, const char *cmd, int64_t lease)
{
    redisContext *rc = redisConnect("127.0.0.1", G.redis.port);
    if (!rc || rc->err) fail_msg("redis connect: %s", rc ? rc->errstr : "oom");
    char key[300];
    snprintf(key, sizeof key, "%s/kv/l:%" PRId64, root, lease);
    redisReply *r = redisCommand(rc, "%s %s", cmd, key);
    if (!r || r->type != REDIS_REPLY_INTEGER) fail_msg("redis %s %s failed", cmd, key);
    long long v = r->integer;
    freeReplyObject(r);
    redisFree(rc);
    return v;
}

/* ---- clients ------------------------------------------------------------------------------------ */

typedef struct copts {
    int64_t long_ttl;
    int close_ms;
    int op_ms;
    bool separate_kv; /* payloads on G.kv_eps[0] */
    const char *const *eps; /* control-plane endpoints override (static storage); NULL: G.eps */
} copts;

static fx_err client_try_new(const char *root, const copts *o, fx_mq_client **out)
{
    fx_mq_client_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.etcd.endpoints = (o && o->eps) ? o->eps : G.eps;
    opts.etcd.n_endpoints = 1;
    opts.etcd.connect_timeout_ms = 500;
    opts.root = root;
    opts.min_ttl_s = 2;
    opts.op_timeout_ms = (o && o->op_ms) ? o->op_ms : 3000;
    opts.close_timeout_ms = o ? o->close_ms : 0;
    opts.long_lease_ttl_s = o ? o->long_ttl : 0;
    if (o && o->separate_kv) {
        opts.kv_endpoints = G.kv_eps;
        opts.n_kv_endpoints = 1;
    } else if (G.redis_mode) {
        opts.kv_redis_url = G.redis.url;
    }
    return fx_mq_client_new(&opts, out);
}

static fx_mq_client *client_new(const char *root, const copts *o)
{
    fx_mq_client *c = NULL;
    fx_err e = client_try_new(root, o, &c);
    if (e != FX_OK) fail_msg("fx_mq_client_new(%s): %s (%s)", root, fx_errname(e), fx_err_detail());
    assert_non_null(c);
    return c;
}

static fx_mq_chan_cfg cfg_of(int64_t capacity) { return (fx_mq_chan_cfg){.capacity = capacity, .ttl_s = TTL}; }

/* ---- messages: FlatDict MQ records whose data is "p<producer>-<seq>" --------------------------- */

static fx_bytes msg_make(int prod, int seq)
{
    char data[48];
    int n = snprintf(data, sizeof data, "p%d-%d", prod, seq);
    fx_mq_msg m = {.subject = FX_SLICE_STR("t.mq.accept"), .headers = {NULL, 0}, .publish_ns = 1,
                   .data = {data, (size_t)n}};
    fx_bytes b = {0};
    if (fx_mq_msg_encode(&m, &b) != FX_OK) {
        fprintf(stderr, "fx_mq_msg_encode failed\n");
        abort();
    }
    return b;
}

static bool msg_parse(const fx_bytes *v, int *prod, int *seq)
{
    fx_mq_msg m;
    if (fx_mq_msg_decode(v->data, v->len, 1u << 20, &m) != FX_OK) return false;
    char buf[48];
    if (m.data.len == 0 || m.data.len >= sizeof buf) return false;
    memcpy(buf, m.data.data, m.data.len);
    buf[m.data.len] = 0;
    return sscanf(buf, "p%d-%d", prod, seq) == 2;
}

/* ---- endpoints, generically ------------------------------------------------------------------- */

typedef enum { EP_SP, EP_SC, EP_MP, EP_MC } ep_kind;
typedef struct ep {
    ep_kind kind;
    void *h;
} ep;

static bool ep_is_producer(ep e) { return e.kind == EP_SP || e.kind == EP_MP; }

static fx_err ep_put(ep e, const fx_slice *v, size_t n, int tmo, size_t *n_put, fx_mq_msg_id *ids)
{
    if (e.kind == EP_SP) return fx_mpsc_put(e.h, v, n, tmo, n_put, ids);
    return fx_mpmc_put(e.h, v, n, tmo, n_put, ids);
}

static fx_err ep_get(ep e, fx_mq_delivery *out, size_t max, size_t *n, int tmo)
{
    if (e.kind == EP_SC) return fx_mpsc_get(e.h, out, max, n, tmo);
    return fx_mpmc_get(e.h, out, max, n, tmo);
}

static fx_err ep_ack(ep e, const fx_mq_msg_id *ids, size_t n)
{
    if (e.kind == EP_SC) return fx_mpsc_ack(e.h, ids, n);
    return fx_mpmc_ack(e.h, ids, n);
}

static fx_err ep_flush(ep e, int tmo)
{
    if (e.kind == EP_SC) return fx_mpsc_flush(e.h, tmo);
    return fx_mpmc_flush(e.h, tmo);
}

static fx_err ep_close(ep e)
{
    switch (e.kind) {
    case EP_SP: return fx_mpsc_producer_close(e.h);
    case EP_SC: return fx_mpsc_consumer_close(e.h);
    case EP_MP: return fx_mpmc_producer_close(e.h);
    default: return fx_mpmc_consumer_close(e.h);
    }
}

static void ep_free(ep e)
{
    if (!e.h) return;
    switch (e.kind) {
    case EP_SP: fx_mpsc_producer_free(e.h); break;
    case EP_SC: fx_mpsc_consumer_free(e.h); break;
    case EP_MP: fx_mpmc_producer_free(e.h); break;
    default: fx_mpmc_consumer_free(e.h); break;
    }
}

static ep open_sp(fx_mq_client *c, int64_t chan)
{
    fx_mpsc_producer *p = NULL;
    CHECK(fx_mpsc_producer_open(c, chan, 0, &p));
    return (ep){EP_SP, p};
}

static ep open_sc(fx_mq_client *c, int64_t chan)
{
    fx_mpsc_consumer *p = NULL;
    CHECK(fx_mpsc_consumer_open(c, chan, &p));
    return (ep){EP_SC, p};
}

static ep open_mp(fx_mq_client *c, int64_t mpmc)
{
    fx_mpmc_producer *p = NULL;
    CHECK(fx_mpmc_producer_open(c, mpmc, 0, &p));
    return (ep){EP_MP, p};
}

static ep open_mc(fx_mq_client *c, int64_t mpmc)
{
    fx_mpmc_consumer *p = NULL;
    CHECK(fx_mpmc_consumer_open(c, mpmc, &p));
    return (ep){EP_MC, p};
}

/* Put messages prod/seq0..seq0+n-1 as one batch (thread-safe, no asserts). */
static fx_err put_seq(ep e, int prod, int seq0, size_t n, int tmo, size_t *n_put, fx_mq_msg_id *ids)
{
    fx_bytes *b = calloc(n, sizeof *b);
    fx_slice *s = calloc(n, sizeof *s);
    if (!b || !s) abort();
    for (size_t i = 0; i < n; i++) {
        b[i] = msg_make(prod, seq0 + (int)i);
        s[i] = (fx_slice){b[i].data, b[i].len};
    }
    size_t np = 0;
    fx_err r = ep_put(e, s, n, tmo, &np, ids);
    if (n_put) *n_put = np;
    for (size_t i = 0; i < n; i++) fx_bytes_free(&b[i]);
    free(b);
    free(s);
    return r;
}

/* Main-thread put that must succeed completely. */
static void put_ok(ep e, int prod, int seq0, size_t n, fx_mq_msg_id *ids)
{
    size_t np = 0;
    fx_err r = put_seq(e, prod, seq0, n, 5000, &np, ids);
    if (r != FX_OK || np != n)
        fail_msg("put p%d-%d x%zu: %s (%s), n_put %zu", prod, seq0, n, fx_errname(r), fx_err_detail(), np);
}

/* ---- receive tracking ------------------------------------------------------------------------- */

#define RX_MAXP 16
#define RX_MAXSEQ 8192
#define RX_STREAMS 256
#define RX_MAXC 8

typedef struct rx_stream {
    int64_t chan, pidx, last_msg;
    int prod, last_seq;
} rx_stream;

typedef struct rx {
    pthread_mutex_t mu;
    uint16_t cnt[RX_MAXP][RX_MAXSEQ];
    int64_t total, bad, order, gaps, foreign;
    rx_stream st[RX_STREAMS];
    size_t nst;
    int64_t per_consumer[RX_MAXC];
    char first_problem[256];
} rx;

static rx *rx_new(void)
{
    rx *r = calloc(1, sizeof *r);
    if (!r) abort();
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void rx_free(rx *r)
{
    if (!r) return;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void rx_note(rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rx_note(rx *r, const char *fmt, ...)
{
    if (r->first_problem[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->first_problem, sizeof r->first_problem, fmt, ap);
    va_end(ap);
}

/* Record one delivery (any thread). strict: msg ids of one (chan, pidx) must be contiguous. */
static void rx_add(rx *r, const fx_mq_delivery *d, int consumer, bool strict)
{
    int prod = -1, seq = -1;
    bool ok = msg_parse(&d->value, &prod, &seq);
    pthread_mutex_lock(&r->mu);
    r->total++;
    if (consumer >= 0 && consumer < RX_MAXC) r->per_consumer[consumer]++;
    if (!ok || prod < 0 || prod >= RX_MAXP || seq < 0 || seq >= RX_MAXSEQ) {
        r->bad++;
        rx_note(r, "undecodable value (len %zu)", d->value.len);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    r->cnt[prod][seq]++;
    rx_stream *s = NULL;
    for (size_t i = 0; i < r->nst; i++)
        if (r->st[i].chan == d->id.chan && r->st[i].pidx == d->id.pidx) s = &r->st[i];
    if (!s && r->nst < RX_STREAMS) {
        s = &r->st[r->nst++];
        *s = (rx_stream){.chan = d->id.chan, .pidx = d->id.pidx, .last_msg = -2, .prod = prod,
                         .last_seq = -1};
    }
    if (s) {
        if (s->prod != prod) {
            r->foreign++;
            rx_note(r, "stream chan %" PRId64 " pidx %" PRId64 " carries p%d and p%d", s->chan,
                    s->pidx, s->prod, prod);
        }
        if (s->last_msg != -2 && d->id.msg <= s->last_msg) {
            r->order++;
            rx_note(r, "chan %" PRId64 " pidx %" PRId64 ": msg id %" PRId64 " after %" PRId64,
                    s->chan, s->pidx, d->id.msg, s->last_msg);
        } else if (strict && s->last_msg != -2 && d->id.msg != s->last_msg + 1) {
            r->gaps++;
            rx_note(r, "chan %" PRId64 " pidx %" PRId64 ": msg id %" PRId64 " after %" PRId64 " (gap)",
                    s->chan, s->pidx, d->id.msg, s->last_msg);
        }
        if (seq <= s->last_seq) {
            r->order++;
            rx_note(r, "p%d: seq %d after %d in chan %" PRId64, prod, seq, s->last_seq, s->chan);
        }
        s->last_msg = d->id.msg;
        s->last_seq = seq;
    }
    pthread_mutex_unlock(&r->mu);
}

static int64_t rx_total(rx *r)
{
    pthread_mutex_lock(&r->mu);
    int64_t t = r->total;
    pthread_mutex_unlock(&r->mu);
    return t;
}

/* Assert received == exactly seqs [0, sent[p]) of every producer p < nprod, once each. */
static void rx_assert_exact(rx *r, const int *sent, int nprod)
{
    int64_t missing = 0, dups = 0, extra = 0, expect = 0;
    char first[160] = "";
    for (int p = 0; p < RX_MAXP; p++) {
        int n = p < nprod ? sent[p] : 0;
        expect += n;
        for (int s = 0; s < RX_MAXSEQ; s++) {
            int c = r->cnt[p][s];
            if (s < n && c == 0) {
                if (!missing++ && !first[0]) snprintf(first, sizeof first, "missing p%d-%d", p, s);
            } else if (s < n && c > 1) {
                dups += c - 1;
                if (!first[0]) snprintf(first, sizeof first, "p%d-%d received %d times", p, s, c);
            } else if (s >= n && c > 0) {
                extra += c;
                if (!first[0]) snprintf(first, sizeof first, "p%d-%d never sent", p, s);
            }
        }
    }
    if (missing || dups || extra || r->bad || r->order || r->gaps || r->foreign)
        fail_msg("received %" PRId64 " of %" PRId64 ": missing %" PRId64 ", duplicates %" PRId64
                 ", extra %" PRId64 ", bad %" PRId64 ", order %" PRId64 ", gaps %" PRId64
                 ", foreign %" PRId64 "; %s; %s",
                 r->total, expect, missing, dups, extra, r->bad, r->order, r->gaps, r->foreign,
                 first, r->first_problem);
    assert_int_equal(r->total, expect);
}

/* ---- consumer / producer threads ---------------------------------------------------------------- */

typedef struct cons_thr {
    pthread_t t;
    ep e;
    rx *r;
    int idx;
    bool strict;
    atomic_bool stop;
    atomic_bool failed; /* set when the thread stopped on an error (readable while it runs) */
    fx_err err;         /* first unexpected error (read after join) */
    char where[64];
} cons_thr;

static void *cons_main(void *arg)
{
    cons_thr *ct = arg;
    fx_mq_delivery d[64];
    fx_mq_msg_id ids[64];
    while (!atomic_load(&ct->stop)) {
        size_t n = 0;
        memset(d, 0, sizeof d);
        fx_err e = ep_get(ct->e, d, 64, &n, 100);
        if (e == FX_ETIMEDOUT) {
            if (n != 0) {
                ct->err = FX_EPROTO;
                snprintf(ct->where, sizeof ct->where, "get: ETIMEDOUT with n=%zu", n);
                break;
            }
            continue;
        }
        if (e != FX_OK || n == 0 || n > 64) {
            ct->err = e != FX_OK ? e : FX_EPROTO;
            snprintf(ct->where, sizeof ct->where, "get: %s n=%zu", fx_errname(e), n);
            for (size_t i = 0; i < n && i < 64; i++) fx_mq_delivery_free(&d[i]);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            rx_add(ct->r, &d[i], ct->idx, ct->strict);
            ids[i] = d[i].id;
            fx_mq_delivery_free(&d[i]);
        }
        e = ep_ack(ct->e, ids, n);
        if (e != FX_OK) {
            ct->err = e;
            snprintf(ct->where, sizeof ct->where, "ack: %s", fx_errname(e));
            break;
        }
    }
    if (ct->err != FX_OK) atomic_store(&ct->failed, true);
    if (ct->err == FX_OK) {
        fx_err e = ep_flush(ct->e, 5000);
        if (e != FX_OK) {
            ct->err = e;
            snprintf(ct->where, sizeof ct->where, "flush: %s", fx_errname(e));
        }
    }
    return NULL;
}

static void cons_start(cons_thr *ct, ep e, rx *r, int idx, bool strict)
{
    memset(ct, 0, sizeof *ct);
    ct->e = e;
    ct->r = r;
    ct->idx = idx;
    ct->strict = strict;
    atomic_init(&ct->stop, false);
    atomic_init(&ct->failed, false);
    assert_int_equal(pthread_create(&ct->t, NULL, cons_main, ct), 0);
}

static void cons_stop(cons_thr *ct)
{
    atomic_store(&ct->stop, true);
    pthread_join(ct->t, NULL);
}

typedef struct prod_thr {
    pthread_t t;
    ep e;
    int prod;
    int quota; /* 0: until stop */
    int timeout_ms;
    atomic_int sent;
    atomic_bool stop;
    fx_err err;
    char where[96];
    int64_t pidx, chan; /* from the first put (MPSC: constant) */
    bool check_contig;  /* MPSC: ids contiguous in one stream */
    int64_t last_msg;
} prod_thr;

static void *prod_main(void *arg)
{
    prod_thr *pt = arg;
    int seq = 0, round = 0;
    fx_mq_msg_id ids[16];
    pt->last_msg = -2;
    pt->pidx = -1;
    while (!atomic_load(&pt->stop) && (pt->quota == 0 || seq < pt->quota) && seq < RX_MAXSEQ - 16) {
        size_t n = (size_t)(1 + (round++ * 7 + pt->prod) % 16);
        if (pt->quota && seq + (int)n > pt->quota) n = (size_t)(pt->quota - seq);
        size_t np = 0;
        fx_err e = put_seq(pt->e, pt->prod, seq, n, pt->timeout_ms, &np, ids);
        for (size_t i = 0; i < np; i++) {
            if (pt->pidx == -1) {
                pt->pidx = ids[i].pidx;
                pt->chan = ids[i].chan;
            }
            if (pt->check_contig && pt->err == FX_OK &&
                (ids[i].pidx != pt->pidx || ids[i].chan != pt->chan ||
                 (pt->last_msg != -2 && ids[i].msg != pt->last_msg + 1))) {
                pt->err = FX_EPROTO;
                snprintf(pt->where, sizeof pt->where,
                         "put ids: chan %" PRId64 " pidx %" PRId64 " msg %" PRId64 " after %" PRId64,
                         ids[i].chan, ids[i].pidx, ids[i].msg, pt->last_msg);
            }
            pt->last_msg = ids[i].msg;
        }
        seq += (int)np;
        atomic_store(&pt->sent, seq);
        if (e != FX_OK || np != n) {
            if (pt->err == FX_OK) {
                pt->err = e != FX_OK ? e : FX_EPROTO;
                snprintf(pt->where, sizeof pt->where, "put: %s n_put %zu of %zu (%s)", fx_errname(e),
                         np, n, fx_err_detail());
            }
            break;
        }
    }
    return NULL;
}

static void prod_start(prod_thr *pt, ep e, int prod, int quota, bool contig)
{
    memset(pt, 0, sizeof *pt);
    pt->e = e;
    pt->prod = prod;
    pt->quota = quota;
    pt->timeout_ms = 20000;
    pt->check_contig = contig;
    atomic_init(&pt->sent, 0);
    atomic_init(&pt->stop, false);
    assert_int_equal(pthread_create(&pt->t, NULL, prod_main, pt), 0);
}

/* ---- group setup / per-test teardown ---------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    if (fxt_etcd_start(&G.etcd) != 0) return -1;
    G.eps[0] = G.etcd.endpoint;
    fx_etcd_opts o = {.endpoints = G.eps, .n_endpoints = 1, .connect_timeout_ms = 500};
    if (fx_etcd_new(&o, &G.raw) != FX_OK) {
        fxt_etcd_destroy(&G.etcd);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    fx_etcd_free(G.raw);
    G.raw = NULL;
    fxt_etcd_destroy(&G.etcd);
    return 0;
}

static int test_setup(void **state)
{
    (void)state;
    G.t_start = fxt_now_ms();
    return 0;
}

/* After every test: kill a leftover child, resume / restart etcd if a test left it down. */
static int test_teardown(void **state)
{
    (void)state;
    fprintf(stderr, "  (%.1f s)\n", (double)(fxt_now_ms() - G.t_start) / 1000.0);
    if (G.child > 0) {
        kill(G.child, SIGKILL);
        waitpid(G.child, NULL, 0);
        G.child = 0;
    }
    if (G.kv_etcd.pid > 0) fxt_etcd_destroy(&G.kv_etcd);
    if (G.paused) {
        fxt_etcd_resume(&G.etcd);
        G.paused = false;
    }
    if (G.etcd.pid == 0) return fxt_etcd_restart(&G.etcd);
    return 0;
}

/* Wait until the client's lease manager has seen one more expiry than `before` and every expiry
 * callback it queued has returned. */
static void wait_lease_expiry_seen(fx_mq_client *c, uint64_t before)
{
    fx_lease_mgr *m = fx_mq_client_leases(c);
    assert_non_null(m);
    int64_t dl = now_ms() + 6000;
    fx_lease_mgr_stats st;
    for (;;) {
        fx_lease_mgr_get_stats(m, &st);
        if (st.expired > before && st.notify_pending == 0) break;
        if (now_ms() > dl) fail_msg("lease manager did not notice the revoked lease within 6 s");
        fxt_nap_ms(20);
    }
}

static uint64_t lease_expired_count(fx_mq_client *c)
{
    fx_lease_mgr_stats st;
    fx_lease_mgr_get_stats(fx_mq_client_leases(c), &st);
    return st.expired;
}

/* ===================================================================================================
 * mq_chan_id_monotonic
 * =================================================================================================*/

static void mq_chan_id_monotonic(void **state)
{
    (void)state;
    const char *root = "/t_chanid";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(100);

    int64_t a = -1;
    CHECK(fx_mpsc_create(c, &cfg, &a));
    assert_true(a >= 1);
    ep p = open_sp(c, a), q = open_sc(c, a);
    put_ok(p, 0, 0, 1, NULL);
    fx_mq_delivery d = {0};
    size_t n = 0;
    CHECK(ep_get(q, &d, 1, &n, 5000));
    assert_int_equal(n, 1);
    assert_int_equal(d.id.chan, a);
    CHECK(ep_ack(q, &d.id, 1));
    fx_mq_delivery_free(&d);
    CHECK(ep_flush(q, 5000));
    CHECK(ep_close(p));
    CHECK(ep_close(q));
    ep_free(p);
    ep_free(q);

    /* Channel A is closed: its meta goes with its global lease (TTL). */
    fx_mq_key meta;
    CHECK(fx_mq_key_chan_meta(&k, a, &meta));
    if (!wait_absent(meta.s, 3 * TTL * 1000 + 3000)) {
        dump_prefix(root);
        fail_msg("meta of closed channel %" PRId64 " still there after 3 x TTL", a);
    }

    int64_t b = -1;
    CHECK(fx_mpsc_create(c, &cfg, &b));
    assert_int_equal(b, a + 1);

    fx_mq_key ctr;
    CHECK(fx_mq_key_alloc_chan_ids(&k, &ctr));
    fx_kv kv = {0};
    assert_true(raw_get(ctr.s, &kv));
    assert_int_equal(kv.lease, 0);
    assert_int_equal(strtoll((const char *)kv.value.data, NULL, 10), b);
    fx_kv_free(&kv);

    /* Another client (another process) continues the same sequence. */
    fx_mq_client *c2 = client_new(root, NULL);
    int64_t b2 = -1;
    CHECK(fx_mpsc_create(c2, &cfg, &b2));
    assert_int_equal(b2, b + 1);

    /* Sub-MPSC ids come from the same counter: a consumer creating one gets a larger id. A
     * client takes them in blocks of 16 (one counter CAS per 16 creations), so the
     * counter is past the id, by less than a block. */
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c2, "mono", &cfg, &m));
    ep mc = open_mc(c2, m);
    int64_t sub = fx_mpmc_consumer_chan(mc.h);
    assert_true(sub > b2);
    assert_true(raw_get_int(ctr.s) >= sub && raw_get_int(ctr.s) < sub + 16);
    CHECK(ep_close(mc));
    ep_free(mc);
    fx_mq_client_free(c2);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_mpsc_exact_once_graceful
 * =================================================================================================*/

#define EO_PRODUCERS 4
#define EO_PER 1000

static void exact_once_run(const char *root, bool separate_kv, fx_etcd *kv_raw)
{
    copts o = {.separate_kv = separate_kv};
    fx_mq_client *cp = client_new(root, &o), *cc = client_new(root, &o);
    fx_mq_chan_cfg cfg = cfg_of(1000);
    int64_t chan = -1;
    CHECK(fx_mpsc_create(cp, &cfg, &chan));
    char kvp[256], payload_pfx[1024];
    kv_prefix(root, kvp, sizeof kvp);
    fx_mq_key rel;
    CHECK(fx_mq_mpsc_payload_prefix_chan(chan, &rel));
    snprintf(payload_pfx, sizeof payload_pfx, "%s%s", kvp, rel.s);

    ep prods[EO_PRODUCERS];
    prod_thr pt[EO_PRODUCERS];
    for (int i = 0; i < EO_PRODUCERS; i++) prods[i] = open_sp(cp, chan);
    for (int i = 0; i < EO_PRODUCERS; i++) prod_start(&pt[i], prods[i], i, EO_PER, true);

    /* Let the producers store some messages before the consumer starts, and look where. */
    int64_t dl = now_ms() + 20000;
    for (;;) {
        int s = 0;
        for (int i = 0; i < EO_PRODUCERS; i++) s += atomic_load(&pt[i].sent);
        if (s >= 100 || now_ms() > dl) break;
        fxt_nap_ms(10);
    }
    int64_t stored_cp = raw_count(payload_pfx);
    int64_t stored_kv = kv_raw ? raw_count_on(kv_raw, payload_pfx)
                               : G.redis_mode ? redis_count(root, rel.s) : -1;

    rx *r = rx_new();
    ep q = open_sc(cc, chan);
    cons_thr ct;
    cons_start(&ct, q, r, 0, true);
    for (int i = 0; i < EO_PRODUCERS; i++) pthread_join(pt[i].t, NULL);
    dl = now_ms() + 30000;
    while (rx_total(r) < EO_PRODUCERS * EO_PER && now_ms() < dl && !atomic_load(&ct.failed)) fxt_nap_ms(20);
    /* Graceful drain: nothing more may come (no duplicates) within a quiet period. */
    int64_t quiet = now_ms() + 500;
    while (now_ms() < quiet && !atomic_load(&ct.failed)) fxt_nap_ms(20);
    cons_stop(&ct);

    fx_err close_p[EO_PRODUCERS], close_c = ep_close(q);
    for (int i = 0; i < EO_PRODUCERS; i++) close_p[i] = ep_close(prods[i]);
    int64_t left_cp = raw_count(payload_pfx);
    int64_t left_kv = kv_raw ? raw_count_on(kv_raw, payload_pfx)
                             : G.redis_mode ? redis_count(root, rel.s) : -1;
    for (int i = 0; i < EO_PRODUCERS; i++) ep_free(prods[i]);
    ep_free(q);
    fx_mq_client_free(cp);
    fx_mq_client_free(cc);

    for (int i = 0; i < EO_PRODUCERS; i++) {
        if (pt[i].err != FX_OK) fail_msg("producer %d: %s", i, pt[i].where);
        assert_int_equal(atomic_load(&pt[i].sent), EO_PER);
        CHECK(close_p[i]);
    }
    if (ct.err != FX_OK) fail_msg("consumer: %s", ct.where);
    CHECK(close_c);
    int sent[EO_PRODUCERS];
    for (int i = 0; i < EO_PRODUCERS; i++) sent[i] = EO_PER;
    rx_assert_exact(r, sent, EO_PRODUCERS);
    /* Each producer's messages came from its own pidx stream. */
    for (size_t s = 0; s < r->nst; s++) {
        assert_int_equal(r->st[s].chan, chan);
        assert_int_equal(r->st[s].pidx, pt[r->st[s].prod].pidx);
    }
    assert_int_equal(r->nst, EO_PRODUCERS);
    rx_free(r);

    /* Payloads went to the payload plane, and acknowledged ones were deleted (after flush). */
    if (separate_kv || G.redis_mode) {
        assert_int_equal(stored_cp, 0);
        assert_true(stored_kv > 0);
        assert_int_equal(left_kv, 0);
    } else {
        assert_true(stored_cp > 0);
    }
    assert_int_equal(left_cp, 0);
}

static void mq_mpsc_exact_once_graceful(void **state)
{
    (void)state;
    exact_once_run("/t_exact", false, NULL);
    if (G.redis_mode) return; /* the Redis plane was the run above */

    /* Variant: the payload plane on a separate etcd. */
    memset(&G.kv_etcd, 0, sizeof G.kv_etcd);
    if (fxt_etcd_start(&G.kv_etcd) != 0) fail_msg("second etcd did not start");
    G.kv_eps[0] = G.kv_etcd.endpoint;
    fx_etcd *kv_raw = NULL;
    fx_etcd_opts o = {.endpoints = G.kv_eps, .n_endpoints = 1, .connect_timeout_ms = 500};
    CHECK(fx_etcd_new(&o, &kv_raw));
    exact_once_run("/t_exact_kv", true, kv_raw);
    fx_etcd_free(kv_raw);
    fxt_etcd_destroy(&G.kv_etcd);
}

/* ===================================================================================================
 * mq_no_keys_after_ttl
 * =================================================================================================*/

static bool nokeys_allowed(const fx_mq_keys *k, const fx_kv *kv, const char *chan_ctr,
                           const char *mpmc_ctr)
{
    const char *key = (const char *)kv->key.data;
    if (kv->lease != 0) return false;
    if (!strcmp(key, chan_ctr) || !strcmp(key, mpmc_ctr)) return true;
    char name[FX_MQ_NAME_MAX + 1];
    return fx_mq_parse_unique_key(k, (fx_slice){kv->key.data, kv->key.len}, name, sizeof name) == FX_OK;
}

static void mq_no_keys_after_ttl(void **state)
{
    (void)state;
    const char *root = "/t_nokeys";
    fx_mq_keys k = mkkeys(root);
    copts o = {.long_ttl = 4};
    fx_mq_client *c = client_new(root, &o);
    fx_mq_chan_cfg cfg = cfg_of(100);

    /* Standalone MPSC: 10 put, 5 consumed, 5 left stored. */
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    ep sp = open_sp(c, chan), sc = open_sc(c, chan);
    put_ok(sp, 0, 0, 10, NULL);
    fx_mq_delivery d[5];
    size_t got = 0;
    int64_t dl = now_ms() + 5000;
    while (got < 5 && now_ms() < dl) {
        size_t n = 0;
        fx_err e = ep_get(sc, d + got, 5 - got, &n, 500);
        if (e == FX_ETIMEDOUT) continue;
        CHECK(e);
        got += n;
    }
    assert_int_equal(got, 5);
    for (size_t i = 0; i < 5; i++) {
        CHECK(ep_ack(sc, &d[i].id, 1));
        fx_mq_delivery_free(&d[i]);
    }
    CHECK(ep_flush(sc, 5000));

    /* MPMC by name: producer + consumer, 10 put, 5 consumed. */
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "nokeys", &cfg, &m));
    ep mc = open_mc(c, m), mp = open_mp(c, m);
    put_ok(mp, 1, 0, 10, NULL);
    got = 0;
    dl = now_ms() + 5000;
    while (got < 5 && now_ms() < dl) {
        size_t n = 0;
        fx_err e = ep_get(mc, d + got, 5 - got, &n, 500);
        if (e == FX_ETIMEDOUT) continue;
        CHECK(e);
        got += n;
    }
    assert_int_equal(got, 5);
    for (size_t i = 0; i < 5; i++) {
        CHECK(ep_ack(mc, &d[i].id, 1));
        fx_mq_delivery_free(&d[i]);
    }
    CHECK(ep_flush(mc, 5000));

    /* Before: the state exists (so the final check can fail), and the allocator lease is the
     * configured long TTL. */
    char kvp[256];
    kv_prefix(root, kvp, sizeof kvp);
    if (G.redis_mode) /* a segment of 10 (5 unacked) in each channel */
        assert_true(redis_count(root, "") >= 2);
    else
        assert_true(raw_count(kvp) >= 2);
    fx_mq_key key;
    CHECK(fx_mq_key_chan_meta(&k, chan, &key));
    assert_true(raw_exists(key.s));
    CHECK(fx_mq_key_mpmc_meta(&k, m, &key));
    assert_true(raw_exists(key.s));
    CHECK(fx_mq_key_alloc_producer_idx(&k, chan, &key));
    fx_kv kv = {0};
    if (!raw_get(key.s, &kv)) {
        dump_prefix(root);
        fail_msg("producer idx counter %s missing", key.s);
    }
    assert_true(kv.lease != 0);
    int64_t granted = 0;
    assert_true(lease_ttl(kv.lease, &granted) > 0);
    assert_int_equal(granted, 4);
    fx_kv_free(&kv);

    CHECK(ep_close(sp));
    CHECK(ep_close(sc));
    CHECK(ep_close(mp));
    CHECK(ep_close(mc));
    ep_free(sp);
    ep_free(sc);
    ep_free(mp);
    ep_free(mc);
    CHECK(fx_mq_client_close(c));
    fx_mq_client_free(c);

    fx_mq_key chan_ctr, mpmc_ctr;
    CHECK(fx_mq_key_alloc_chan_ids(&k, &chan_ctr));
    CHECK(fx_mq_key_alloc_mpmc_ids(&k, &mpmc_ctr));
    char rootp[128];
    snprintf(rootp, sizeof rootp, "%s/", root);
    dl = now_ms() + (4 + TTL) * 1000 + 8000;
    size_t bad = 0;
    for (;;) {
        fx_range_resp r = {0};
        raw_list(rootp, &r);
        bad = 0;
        for (size_t i = 0; i < r.n_kvs; i++)
            if (!nokeys_allowed(&k, &r.kvs[i], chan_ctr.s, mpmc_ctr.s)) bad++;
        fx_range_resp_free(&r);
        if (bad == 0 || now_ms() > dl) break;
        fxt_nap_ms(200);
    }
    if (bad) {
        dump_prefix(rootp);
        fail_msg("%zu key(s) left under %s after TTL (+ long TTL) + margin", bad, rootp);
    }
    if (getenv("MQ_TEST_VERBOSE")) dump_prefix(rootp);
    if (G.redis_mode) { /* the payloads left in Redis go with their payload leases */
        int64_t left = -1;
        while ((left = redis_count(root, "")) != 0 && now_ms() < dl) fxt_nap_ms(200);
        if (left != 0) fail_msg("%" PRId64 " payload keys left in Redis after the TTL", left);
    }
    /* The unleased counters and the mapping are still there. */
    assert_true(raw_get_int(chan_ctr.s) > chan); /* the MPMC consumer's sub-MPSC came after */
    assert_true(raw_get_int(mpmc_ctr.s) >= m);
    CHECK(fx_mq_key_unique(&k, "nokeys", &key));
    assert_int_equal(raw_get_int(key.s), m);
}

/* ===================================================================================================
 * mq_mpmc_dynamic
 * =================================================================================================*/

#define DYN_MAXP 6
#define DYN_MAXC 4

static void mq_mpmc_dynamic(void **state)
{
    (void)state;
    const char *root = "/t_dyn";
    fx_mq_client *cp = client_new(root, NULL), *cc = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(1000);
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(cp, "dyn", &cfg, &m));

    static const int phase_p[3] = {2, 4, 6}, phase_c[3] = {1, 2, 4};
    ep prods[DYN_MAXP] = {{0}}, cons[DYN_MAXC] = {{0}};
    prod_thr *pt = calloc(DYN_MAXP, sizeof *pt);
    cons_thr *ct = calloc(DYN_MAXC, sizeof *ct);
    assert_non_null(pt);
    assert_non_null(ct);
    rx *r = rx_new();
    int np = 0, nc = 0;
    int64_t chans[DYN_MAXC];
    fx_err open_err = FX_OK;
    char open_what[64] = "";
    bool phase_timeout = false;
    for (int ph = 0; ph < 3 && open_err == FX_OK && !phase_timeout; ph++) {
        while (nc < phase_c[ph]) {
            fx_mpmc_consumer *h = NULL;
            open_err = fx_mpmc_consumer_open(cc, m, &h);
            if (open_err != FX_OK) {
                snprintf(open_what, sizeof open_what, "consumer %d open", nc);
                break;
            }
            cons[nc] = (ep){EP_MC, h};
            chans[nc] = fx_mpmc_consumer_chan(h);
            cons_start(&ct[nc], cons[nc], r, nc, true);
            nc++;
        }
        while (open_err == FX_OK && np < phase_p[ph]) {
            fx_mpmc_producer *h = NULL;
            open_err = fx_mpmc_producer_open(cp, m, 0, &h);
            if (open_err != FX_OK) {
                snprintf(open_what, sizeof open_what, "producer %d open", np);
                break;
            }
            prods[np] = (ep){EP_MP, h};
            prod_start(&pt[np], prods[np], np, 0, false);
            np++;
        }
        /* Each phase runs until 1500 more messages were produced. */
        int64_t dl = now_ms() + 30000;
        for (;;) {
            int s = 0;
            for (int i = 0; i < np; i++) s += atomic_load(&pt[i].sent);
            if (s >= 1500 * (ph + 1)) break;
            if (now_ms() > dl) {
                phase_timeout = true;
                break;
            }
            fxt_nap_ms(10);
        }
    }
    /* Graceful drain: stop producers, then consume until everything arrived. */
    int sent[RX_MAXP] = {0};
    int64_t total = 0;
    for (int i = 0; i < np; i++) atomic_store(&pt[i].stop, true);
    for (int i = 0; i < np; i++) {
        pthread_join(pt[i].t, NULL);
        sent[i] = atomic_load(&pt[i].sent);
        total += sent[i];
    }
    fx_err pclose[DYN_MAXP];
    for (int i = 0; i < np; i++) pclose[i] = ep_close(prods[i]);
    int64_t dl = now_ms() + 30000;
    while (rx_total(r) < total && now_ms() < dl) fxt_nap_ms(20);
    int64_t quiet = now_ms() + 500;
    while (now_ms() < quiet) fxt_nap_ms(20);
    for (int i = 0; i < nc; i++) cons_stop(&ct[i]);
    fx_err cclose[DYN_MAXC];
    for (int i = 0; i < nc; i++) cclose[i] = ep_close(cons[i]);
    for (int i = 0; i < np; i++) ep_free(prods[i]);
    for (int i = 0; i < nc; i++) ep_free(cons[i]);
    fx_mq_client_free(cp);
    fx_mq_client_free(cc);

    if (open_err != FX_OK) fail_msg("%s: %s", open_what, fx_errname(open_err));
    assert_false(phase_timeout);
    assert_int_equal(np, DYN_MAXP);
    assert_int_equal(nc, DYN_MAXC);
    for (int i = 0; i < np; i++) {
        if (pt[i].err != FX_OK) fail_msg("producer %d: %s", i, pt[i].where);
        CHECK(pclose[i]);
    }
    for (int i = 0; i < nc; i++) {
        if (ct[i].err != FX_OK) fail_msg("consumer %d: %s", i, ct[i].where);
        CHECK(cclose[i]);
    }
    /* Every consumer owns its own sub-MPSC, and every one got messages (rotation). */
    for (int i = 0; i < nc; i++)
        for (int j = i + 1; j < nc; j++) assert_true(chans[i] != chans[j]);
    for (int i = 0; i < nc; i++)
        if (r->per_consumer[i] == 0) fail_msg("consumer %d (sub-MPSC %" PRId64 ") got nothing", i, chans[i]);
    rx_assert_exact(r, sent, np);
    rx_free(r);
    free(pt);
    free(ct);
}

/* ===================================================================================================
 * mq_consumer_crash_redelivers (the child runs crash_child() in a re-exec of this binary)
 * =================================================================================================*/

#define CRASH_TOTAL 40
#define CRASH_TAKE 20
#define CRASH_ACK 10

static void child_say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void child_say(int fd, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    ssize_t w = write(fd, buf, (size_t)n);
    (void)w;
}

/* argv: exe CHILD_FLAG endpoint root mpmc parent_pid */
static int crash_child(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (argc < 6) return 2;
    if (getppid() != (pid_t)strtol(argv[5], NULL, 10)) return 3;
    if (!getenv("FX_LOG_LEVEL")) fx_log_set_level(FX_LOG_ERR);
    int fd = CHILD_FD;
    G.eps[0] = argv[2];
    const char *rurl = getenv("FXT_MQ_REDIS_URL"); /* set by the parent in the _redis group */
    if (rurl && *rurl) {
        G.redis_mode = true;
        snprintf(G.redis.url, sizeof G.redis.url, "%s", rurl);
    }
    int64_t m = strtoll(argv[4], NULL, 10);
    fx_mq_client *c = NULL;
    fx_err e = client_try_new(argv[3], NULL, &c);
    if (e != FX_OK) {
        child_say(fd, "err client %s %s\n", fx_errname(e), fx_err_detail());
        return 4;
    }
    fx_mpmc_consumer *q = NULL;
    e = fx_mpmc_consumer_open(c, m, &q);
    if (e != FX_OK) {
        child_say(fd, "err open %s %s\n", fx_errname(e), fx_err_detail());
        return 5;
    }
    child_say(fd, "member %" PRId64 " chan %" PRId64 "\n", fx_mpmc_consumer_member(q),
              fx_mpmc_consumer_chan(q));
    fx_mq_delivery d[CRASH_TAKE];
    memset(d, 0, sizeof d);
    size_t got = 0;
    int64_t dl = now_ms() + 15000;
    while (got < CRASH_TAKE && now_ms() < dl) {
        size_t n = 0;
        e = fx_mpmc_get(q, d + got, CRASH_TAKE - got, &n, 500);
        if (e == FX_ETIMEDOUT) continue;
        if (e != FX_OK) {
            child_say(fd, "err get %s %s\n", fx_errname(e), fx_err_detail());
            return 6;
        }
        got += n;
    }
    if (got < CRASH_TAKE) {
        child_say(fd, "err got only %zu\n", got);
        return 7;
    }
    for (size_t i = 0; i < CRASH_ACK; i++) {
        e = fx_mpmc_ack(q, &d[i].id, 1);
        if (e != FX_OK) {
            child_say(fd, "err ack %s\n", fx_errname(e));
            return 8;
        }
    }
    e = fx_mpmc_flush(q, 5000);
    if (e != FX_OK) {
        child_say(fd, "err flush %s\n", fx_errname(e));
        return 9;
    }
    for (size_t i = 0; i < got; i++) {
        int prod = -1, seq = -1;
        if (!msg_parse(&d[i].value, &prod, &seq)) {
            child_say(fd, "err undecodable message\n");
            return 10;
        }
        child_say(fd, "%s %d %d\n", i < CRASH_ACK ? "acked" : "held", prod, seq);
    }
    child_say(fd, "end\n");
    /* Hold everything until the parent kills us (bounded, in case it never does). */
    for (int i = 0; i < 600; i++) fxt_nap_ms(100);
    return 11;
}

static pid_t spawn_crash_child(const char *root, int64_t mpmc, int *rfd)
{
    int fds[2];
    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    char a_m[32], a_pp[32];
    char a_flag[] = CHILD_FLAG, a_exe[] = "/proc/self/exe";
    char a_ep[sizeof G.etcd.endpoint], a_root[128];
    snprintf(a_m, sizeof a_m, "%" PRId64, mpmc);
    snprintf(a_pp, sizeof a_pp, "%d", (int)getpid());
    snprintf(a_ep, sizeof a_ep, "%s", G.etcd.endpoint);
    snprintf(a_root, sizeof a_root, "%s", root);
    char *argv[] = {a_exe, a_flag, a_ep, a_root, a_m, a_pp, NULL};
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (dup2(fds[1], CHILD_FD) < 0) _exit(126);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

/* Read the child's report until "end\n" (or an error line / EOF / deadline). */
static void read_child_report(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t len = 0;
    buf[0] = 0;
    int64_t dl = now_ms() + timeout_ms;
    while (len + 1 < cap) {
        if (strstr(buf, "end\n") || strstr(buf, "err ")) break;
        int left = (int)(dl - now_ms());
        if (left <= 0) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
        buf[len] = 0;
    }
}

static void mq_consumer_crash_redelivers(void **state)
{
    (void)state;
    const char *root = "/t_crash";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(1000);
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "crash", &cfg, &m));
    ep p = open_mp(c, m);
    fx_mq_msg_id ids[10];
    int64_t sub = -1;
    for (int b = 0; b < CRASH_TOTAL / 10; b++) {
        put_ok(p, 0, b * 10, 10, ids);
        for (int i = 0; i < 10; i++) {
            if (sub < 0) sub = ids[i].chan;
            assert_int_equal(ids[i].chan, sub); /* the only (unready) sub-MPSC */
        }
    }

    int rfd = -1;
    G.child = spawn_crash_child(root, m, &rfd);
    char *rep = calloc(1, 16384);
    assert_non_null(rep);
    read_child_report(rfd, rep, 16384, 30000);
    if (!strstr(rep, "end\n")) {
        close(rfd);
        fail_msg("child report incomplete: %s", rep);
    }
    int64_t member = -1, cchan = -1;
    assert_int_equal(sscanf(rep, "member %" SCNd64 " chan %" SCNd64, &member, &cchan), 2);
    assert_int_equal(cchan, sub);
    bool acked[CRASH_TOTAL] = {0}, held[CRASH_TOTAL] = {0};
    int n_acked = 0, n_held = 0;
    for (char *line = strchr(rep, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        char what[16];
        int prod, seq;
        if (sscanf(line + 1, "%15s %d %d", what, &prod, &seq) != 3) continue;
        assert_int_equal(prod, 0);
        assert_true(seq >= 0 && seq < CRASH_TOTAL);
        if (!strcmp(what, "acked")) acked[seq] = true, n_acked++;
        else if (!strcmp(what, "held")) held[seq] = true, n_held++;
    }
    free(rep);
    assert_int_equal(n_acked, CRASH_ACK);
    assert_int_equal(n_held, CRASH_TAKE - CRASH_ACK);

    /* The child holds 10 unacknowledged messages: kill it. */
    fx_mq_key role, ready;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, m, member, &role));
    CHECK(fx_mq_key_mpmc_ready(&k, m, sub, &ready));
    assert_true(raw_exists(role.s));
    assert_int_equal(raw_get_int(ready.s), member);
    kill(G.child, SIGKILL);
    waitpid(G.child, NULL, 0);
    G.child = 0;
    close(rfd);
    if (!wait_absent(role.s, TTL * 1000 + 6000)) fail_msg("role key of the killed consumer did not expire");
    assert_false(raw_exists(ready.s)); /* same member lease */

    /* A new consumer claims the orphaned (now unready) sub-MPSC and gets every unacked message. */
    fx_mq_client *c2 = client_new(root, NULL);
    ep q = open_mc(c2, m);
    assert_int_equal(fx_mpmc_consumer_chan(q.h), sub);
    rx *r = rx_new();
    int expect = CRASH_TOTAL - CRASH_ACK;
    int64_t dl = now_ms() + 15000;
    fx_err ge = FX_OK;
    while (rx_total(r) < expect && now_ms() < dl) {
        fx_mq_delivery d[16];
        size_t n = 0;
        ge = ep_get(q, d, 16, &n, 500);
        if (ge == FX_ETIMEDOUT) continue;
        if (ge != FX_OK) break;
        for (size_t i = 0; i < n; i++) {
            rx_add(r, &d[i], 0, true);
            CHECK(ep_ack(q, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
    }
    if (ge != FX_OK && ge != FX_ETIMEDOUT) fail_msg("get: %s (%s)", fx_errname(ge), fx_err_detail());
    /* Quiet period: nothing acknowledged by the child comes again. */
    {
        fx_mq_delivery d[16];
        size_t n = 0;
        fx_err e = ep_get(q, d, 16, &n, 700);
        for (size_t i = 0; i < n; i++) {
            rx_add(r, &d[i], 0, true);
            fx_mq_delivery_free(&d[i]);
        }
        if (e != FX_ETIMEDOUT) fprintf(stderr, "quiet get: %s n=%zu\n", fx_errname(e), n);
    }
    CHECK(ep_flush(q, 5000));
    for (int s = 0; s < CRASH_TOTAL; s++) {
        int cnt = r->cnt[0][s];
        if (acked[s] && cnt != 0) fail_msg("p0-%d was acked by the crashed consumer, redelivered", s);
        if (!acked[s] && cnt != 1)
            fail_msg("p0-%d (%s) received %d times after the crash", s, held[s] ? "held" : "never delivered", cnt);
    }
    assert_int_equal(r->total, expect);
    assert_int_equal(r->order, 0);
    rx_free(r);
    CHECK(ep_close(q));
    CHECK(ep_close(p));
    ep_free(q);
    ep_free(p);
    fx_mq_client_free(c2);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_member_lease_lost_closes
 * =================================================================================================*/

static void mq_member_lease_lost_closes(void **state)
{
    (void)state;
    const char *root = "/t_mlost";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(100);

    /* A producer that has not put yet (so it would create the first sub-MPSC). */
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "mlost", &cfg, &m));
    ep p = open_mp(c, m);
    fx_mq_key role, list, ctr;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_PRODUCER, m, fx_mpmc_producer_member(p.h), &role));
    fx_kv kv = {0};
    assert_true(raw_get(role.s, &kv));
    int64_t lease = kv.lease;
    fx_kv_free(&kv);
    assert_true(lease > 0);
    uint64_t before = lease_expired_count(c);
    CHECK(fx_etcd_lease_revoke(G.raw, lease, OP_MS));
    wait_lease_expiry_seen(c, before);
    size_t np = 99;
    CHECK_ERR(FX_ELEASE_LOST, put_seq(p, 0, 0, 1, 1000, &np, NULL));
    assert_int_equal(np, 0);
    CHECK_ERR(FX_ECLOSED, put_seq(p, 0, 0, 1, 1000, &np, NULL));
    CHECK_ERR(FX_ECLOSED, put_seq(p, 0, 0, 3, 1000, &np, NULL));
    assert_int_equal(np, 0);
    /* No sub-MPSC was created. */
    CHECK(fx_mq_key_mpmc_mpsc_channels(&k, m, &list));
    assert_false(raw_exists(list.s));
    char pfx[256];
    snprintf(pfx, sizeof pfx, "%s/channels/", root);
    assert_int_equal(raw_count(pfx), 0);
    CHECK(fx_mq_key_alloc_chan_ids(&k, &ctr));
    assert_false(raw_exists(ctr.s));
    int64_t t0 = now_ms();
    fx_err ce = ep_close(p);
    assert_true(now_ms() - t0 < 3000);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    CHECK_ERR(FX_ECLOSED, put_seq(p, 0, 0, 1, 1000, &np, NULL));
    ep_free(p);

    /* A consumer: the same on get. */
    int64_t m2 = -1;
    CHECK(fx_mpmc_resolve(c, "mlost2", &cfg, &m2));
    ep q = open_mc(c, m2);
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, m2, fx_mpmc_consumer_member(q.h), &role));
    assert_true(raw_get(role.s, &kv));
    lease = kv.lease;
    fx_kv_free(&kv);
    before = lease_expired_count(c);
    CHECK(fx_etcd_lease_revoke(G.raw, lease, OP_MS));
    wait_lease_expiry_seen(c, before);
    fx_mq_delivery d[2];
    size_t n = 99;
    CHECK_ERR(FX_ELEASE_LOST, ep_get(q, d, 2, &n, 500));
    assert_int_equal(n, 0);
    CHECK_ERR(FX_ECLOSED, ep_get(q, d, 2, &n, 500));
    assert_int_equal(n, 0);
    ce = ep_close(q);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    ep_free(q);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_payload_lease_lost_closes
 * =================================================================================================*/

static int64_t meta_field(const char *key, const char *field)
{
    fx_kv kv = {0};
    if (!raw_get(key, &kv)) fail_msg("meta %s missing", key);
    int64_t v = json_int((const char *)kv.value.data, field);
    fx_kv_free(&kv);
    if (v <= 0) fail_msg("meta %s: no positive %s", key, field);
    return v;
}

/* Revoke a payload lease on the plane in use. */
static void revoke_payload_lease(const char *root, int64_t pl)
{
    if (G.redis_mode) {
        if (redis_lease_cmd(root, "DEL", pl) != 1) fail_msg("payload lease %" PRId64 " not in Redis", pl);
    } else {
        CHECK(fx_etcd_lease_revoke(G.raw, pl, OP_MS));
    }
}

static void mq_payload_lease_lost_closes(void **state)
{
    (void)state;
    const char *root = "/t_plost";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(100);

    /* Standalone MPSC: producer and consumer working, then the payload lease is revoked. */
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    ep p = open_sp(c, chan), q = open_sc(c, chan);
    put_ok(p, 0, 0, 2, NULL);
    fx_mq_delivery d[2];
    size_t n = 0;
    CHECK(ep_get(q, d, 1, &n, 5000));
    assert_int_equal(n, 1);
    CHECK(ep_ack(q, &d[0].id, 1));
    fx_mq_delivery_free(&d[0]);
    CHECK(ep_flush(q, 5000));
    fx_mq_key meta;
    CHECK(fx_mq_key_chan_meta(&k, chan, &meta));
    int64_t pl = meta_field(meta.s, "payload_lease_id");
    uint64_t before = lease_expired_count(c);
    revoke_payload_lease(root, pl);
    wait_lease_expiry_seen(c, before);
    size_t np = 99;
    CHECK_ERR(FX_ELEASE_LOST, put_seq(p, 0, 2, 1, 1000, &np, NULL));
    assert_int_equal(np, 0);
    CHECK_ERR(FX_ECLOSED, put_seq(p, 0, 2, 1, 1000, &np, NULL));
    n = 99;
    CHECK_ERR(FX_ELEASE_LOST, ep_get(q, d, 2, &n, 500));
    assert_int_equal(n, 0);
    CHECK_ERR(FX_ECLOSED, ep_get(q, d, 2, &n, 500));
    fx_err ce = ep_close(p);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    ce = ep_close(q);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    ep_free(p);
    ep_free(q);

    /* MPMC producer (the reference's bug: payload-lease loss never closed it). */
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "plost", &cfg, &m));
    ep mp = open_mp(c, m);
    put_ok(mp, 0, 0, 1, NULL);
    CHECK(fx_mq_key_mpmc_meta(&k, m, &meta));
    pl = meta_field(meta.s, "payload_lease_id");
    before = lease_expired_count(c);
    revoke_payload_lease(root, pl);
    wait_lease_expiry_seen(c, before);
    CHECK_ERR(FX_ELEASE_LOST, put_seq(mp, 0, 1, 1, 1000, &np, NULL));
    assert_int_equal(np, 0);
    CHECK_ERR(FX_ECLOSED, put_seq(mp, 0, 1, 1, 1000, &np, NULL));
    ce = ep_close(mp);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    ep_free(mp);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_capacity_blocks_then_fails
 * =================================================================================================*/

typedef struct blk {
    pthread_t t;
    ep e;
    int timeout_ms;
    atomic_bool entered, returned;
    bool blocked; /* the call had not returned after the window blk_start gives it */
    fx_err r;
    size_t n;
    int64_t t_ret;
} blk;

static void *blk_main(void *arg)
{
    blk *b = arg;
    atomic_store(&b->entered, true);
    if (ep_is_producer(b->e)) {
        b->r = put_seq(b->e, 9, 0, 1, b->timeout_ms, &b->n, NULL);
    } else {
        fx_mq_delivery d[4];
        memset(d, 0, sizeof d);
        b->r = ep_get(b->e, d, 4, &b->n, b->timeout_ms);
        for (size_t i = 0; i < b->n && i < 4; i++) fx_mq_delivery_free(&d[i]);
    }
    b->t_ret = now_ms();
    atomic_store(&b->returned, true);
    return NULL;
}

static void blk_start(blk *b, ep e, int timeout_ms)
{
    memset(b, 0, sizeof *b);
    b->e = e;
    b->timeout_ms = timeout_ms;
    b->n = 99;
    atomic_init(&b->entered, false);
    atomic_init(&b->returned, false);
    assert_int_equal(pthread_create(&b->t, NULL, blk_main, b), 0);
    int64_t dl = now_ms() + 2000 * fxt_slow();
    while (!atomic_load(&b->entered) && now_ms() < dl) fxt_nap_ms(5);
    if (!atomic_load(&b->entered)) {
        /* b is the caller's: join the thread (its call ends by its own timeout) before failing */
        pthread_join(b->t, NULL);
        fail_msg("the blocking call's thread did not start within %d ms", 2000 * fxt_slow());
    }
    /* An observation window: the call is blocked (not returned after it), so the close the
     * caller makes next interrupts a waiting call; callers check b->blocked after the join. */
    fxt_nap_ms(300);
    b->blocked = !atomic_load(&b->returned);
}

/* A put that must fail FX_EFULL at (not before) its deadline. */
static void put_full_at_deadline(ep p, int seq, size_t n, size_t want_nput)
{
    size_t np = 99;
    int64_t t0 = now_ms();
    fx_err e = put_seq(p, 0, seq, n, 1000, &np, NULL);
    int64_t dt = now_ms() - t0;
    if (e != FX_EFULL) fail_msg("put x%zu into a full channel: %s, want FX_EFULL", n, fx_errname(e));
    assert_int_equal(np, want_nput);
    if (dt < 900 || dt > 2500) fail_msg("FX_EFULL after %" PRId64 " ms, want ~1000", dt);
}

static void mq_capacity_blocks_then_fails(void **state)
{
    (void)state;
    const char *root = "/t_cap";
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(2);
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    ep p = open_sp(c, chan);

    /* A batch of 3 into an empty capacity-2 channel: 2 stored, the third waits, then EFULL. */
    put_full_at_deadline(p, 0, 3, 2);
    /* Full: the next put waits its whole timeout. */
    put_full_at_deadline(p, 2, 1, 0);

    /* Exact capacity: acknowledging one message frees exactly one slot. */
    ep q = open_sc(c, chan);
    fx_mq_delivery d[2];
    size_t n = 0;
    CHECK(ep_get(q, d, 1, &n, 5000));
    assert_int_equal(n, 1);
    int prod, seq;
    assert_true(msg_parse(&d[0].value, &prod, &seq));
    assert_int_equal(seq, 0);
    CHECK(ep_ack(q, &d[0].id, 1));
    fx_mq_delivery_free(&d[0]);
    CHECK(ep_flush(q, 5000));
    CHECK(ep_close(q));
    ep_free(q);
    size_t np = 0;
    CHECK(put_seq(p, 0, 2, 1, 5000, &np, NULL));
    assert_int_equal(np, 1);
    put_full_at_deadline(p, 3, 1, 0);

    /* A put blocked for 30 s is released at once when another thread closes the producer. */
    blk b;
    blk_start(&b, p, 30000);
    int64_t t0 = now_ms();
    fx_err ce = ep_close(p);
    int64_t tc = now_ms();
    pthread_join(b.t, NULL);
    assert_true(b.blocked);
    CHECK(ce);
    assert_int_equal(b.r, FX_ECLOSED);
    assert_int_equal(b.n, 0);
    if (b.t_ret - t0 >= FXT_MS(500)) fail_msg("blocked put returned %" PRId64 " ms after close", b.t_ret - t0);
    assert_true(tc - t0 < 3000);
    ep_free(p);

    /* MPMC producer, no consumer: the same at its deadline, and released by close. */
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "cap", &cfg, &m));
    ep mp = open_mp(c, m);
    put_ok(mp, 0, 0, 2, NULL);
    put_full_at_deadline(mp, 2, 1, 0);
    blk_start(&b, mp, 30000);
    t0 = now_ms();
    ce = ep_close(mp);
    pthread_join(b.t, NULL);
    assert_true(b.blocked);
    CHECK(ce);
    assert_int_equal(b.r, FX_ECLOSED);
    if (b.t_ret - t0 >= FXT_MS(500)) fail_msg("blocked MPMC put returned %" PRId64 " ms after close", b.t_ret - t0);
    ep_free(mp);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_consumer_create_race
 * =================================================================================================*/

typedef struct racer {
    pthread_t t;
    fx_mq_client *c;
    int64_t mpmc;
    pthread_barrier_t *bar;
    fx_err r;
    fx_mpmc_consumer *q;
} racer;

static void *racer_main(void *arg)
{
    racer *x = arg;
    pthread_barrier_wait(x->bar);
    x->r = fx_mpmc_consumer_open(x->c, x->mpmc, &x->q);
    return NULL;
}

static void mq_consumer_create_race(void **state)
{
    (void)state;
    const char *root = "/t_race";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *cp = client_new(root, NULL), *ca = client_new(root, NULL), *cb = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(100);
    for (int round = 0; round < 5; round++) {
        char name[32];
        snprintf(name, sizeof name, "race%d", round);
        int64_t m = -1;
        CHECK(fx_mpmc_resolve(cp, name, &cfg, &m));
        ep p = open_mp(cp, m);
        fx_mq_msg_id id;
        put_ok(p, 0, 0, 1, &id); /* creates the one sub-MPSC (unready) */
        int64_t first = id.chan;
        fx_mq_key list, rpfx;
        CHECK(fx_mq_key_mpmc_mpsc_channels(&k, m, &list));
        {
            fx_kv lkv = {0};
            assert_true(raw_get(list.s, &lkv));
            int64_t only[4];
            int nonly = json_list_count((const char *)lkv.value.data, only, 4);
            fx_kv_free(&lkv);
            assert_int_equal(nonly, 1);
            assert_int_equal(only[0], first);
        }

        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 2);
        racer x[2] = {{.c = ca, .mpmc = m, .bar = &bar}, {.c = cb, .mpmc = m, .bar = &bar}};
        for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&x[i].t, NULL, racer_main, &x[i]), 0);
        for (int i = 0; i < 2; i++) pthread_join(x[i].t, NULL);
        pthread_barrier_destroy(&bar);
        for (int i = 0; i < 2; i++)
            if (x[i].r != FX_OK) {
                for (int j = 0; j < 2; j++)
                    if (x[j].q) fx_mpmc_consumer_free(x[j].q);
                fail_msg("round %d: consumer %d open: %s", round, i, fx_errname(x[i].r));
            }
        int64_t ch[2] = {fx_mpmc_consumer_chan(x[0].q), fx_mpmc_consumer_chan(x[1].q)};
        int64_t mem[2] = {fx_mpmc_consumer_member(x[0].q), fx_mpmc_consumer_member(x[1].q)};
        assert_true(ch[0] != ch[1]);
        assert_true(ch[0] == first || ch[1] == first);
        /* Two sub-MPSCs listed, two ready keys, each naming its owner. */
        fx_kv kv = {0};
        assert_true(raw_get(list.s, &kv));
        int64_t lids[8];
        int nl = json_list_count((const char *)kv.value.data, lids, 8);
        fx_kv_free(&kv);
        assert_int_equal(nl, 2);
        assert_true((lids[0] == ch[0] && lids[1] == ch[1]) || (lids[0] == ch[1] && lids[1] == ch[0]));
        CHECK(fx_mq_prefix_mpmc_ready(&k, m, &rpfx));
        assert_int_equal(raw_count(rpfx.s), 2);
        for (int i = 0; i < 2; i++) {
            fx_mq_key rk;
            CHECK(fx_mq_key_mpmc_ready(&k, m, ch[i], &rk));
            assert_int_equal(raw_get_int(rk.s), mem[i]);
        }
        /* The owner of the first sub-MPSC gets the message stored there. */
        int owner = ch[0] == first ? 0 : 1;
        fx_mq_delivery d;
        size_t n = 0;
        CHECK(fx_mpmc_get(x[owner].q, &d, 1, &n, 5000));
        assert_int_equal(n, 1);
        assert_int_equal(d.id.chan, first);
        CHECK(fx_mpmc_ack(x[owner].q, &d.id, 1));
        fx_mq_delivery_free(&d);
        for (int i = 0; i < 2; i++) {
            CHECK(fx_mpmc_consumer_close(x[i].q));
            fx_mpmc_consumer_free(x[i].q);
        }
        CHECK(ep_close(p));
        ep_free(p);
    }
    fx_mq_client_free(ca);
    fx_mq_client_free(cb);
    fx_mq_client_free(cp);
}


/* ===================================================================================================
 * mq_handoff_order
 * =================================================================================================*/

typedef struct evrec {
    char key[200];
    int64_t rev;
    int type;
} evrec;

typedef struct evlog {
    pthread_mutex_t mu;
    evrec ev[4096];
    size_t n;
} evlog;

static void evlog_fn(void *arg, const fx_watch_update *u)
{
    evlog *l = arg;
    if (u->kind != FX_WATCH_EVENTS) return;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < u->n_events && l->n < 4096; i++) {
        evrec *r = &l->ev[l->n++];
        snprintf(r->key, sizeof r->key, "%.*s", (int)u->events[i].kv.key.len,
                 (const char *)u->events[i].kv.key.data);
        r->rev = u->events[i].kv.mod_revision;
        r->type = (int)u->events[i].type;
    }
    pthread_mutex_unlock(&l->mu);
}

/* Revision of the first DELETE of key at index >= from, or -1. */
static int64_t evlog_delete_rev(evlog *l, const char *key, size_t from)
{
    int64_t rev = -1;
    pthread_mutex_lock(&l->mu);
    for (size_t i = from; i < l->n; i++)
        if (l->ev[i].type == FX_EV_DELETE && !strcmp(l->ev[i].key, key)) {
            rev = l->ev[i].rev;
            break;
        }
    pthread_mutex_unlock(&l->mu);
    return rev;
}

static size_t evlog_len(evlog *l)
{
    pthread_mutex_lock(&l->mu);
    size_t n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

static bool evlog_wait_deletes(evlog *l, const char *const *keys, int64_t *revs, int nk, size_t from,
                               int timeout_ms)
{
    int64_t dl = now_ms() + timeout_ms;
    for (;;) {
        bool all = true;
        for (int i = 0; i < nk; i++) {
            revs[i] = evlog_delete_rev(l, keys[i], from);
            if (revs[i] < 0) all = false;
        }
        if (all) return true;
        if (now_ms() > dl) return false;
        fxt_nap_ms(20);
    }
}

/* The single consumer membership key of chan. */
static void membership_key(const fx_mq_keys *k, int64_t chan, char *out, size_t cap)
{
    fx_mq_key pfx;
    CHECK(fx_mq_prefix_consumer_members(k, chan, &pfx));
    fx_range_resp r = {0};
    raw_list(pfx.s, &r);
    if (r.n_kvs != 1) {
        size_t nk = r.n_kvs;
        fx_range_resp_free(&r);
        fail_msg("sub-MPSC %" PRId64 " has %zu consumer memberships, want 1", chan, nk);
    }
    snprintf(out, cap, "%s", (const char *)r.kvs[0].key.data);
    fx_range_resp_free(&r);
}

static void mq_handoff_order(void **state)
{
    (void)state;
    const char *root = "/t_handoff";
    fx_mq_keys k = mkkeys(root);
    copts o = {.close_ms = 500};
    fx_mq_client *c = client_new(root, &o);
    fx_mq_chan_cfg cfg = cfg_of(100);
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(c, "handoff", &cfg, &m));
    ep p = open_mp(c, m); /* keeps the shared leases alive between the two consumers */

    evlog *l = calloc(1, sizeof *l);
    assert_non_null(l);
    pthread_mutex_init(&l->mu, NULL);
    char rootp[64];
    snprintf(rootp, sizeof rootp, "%s/", root);
    uint8_t end[64];
    size_t el = fx_prefix_end(FX_SLICE_STR(rootp), end);
    fx_watch_opts wo = {.key = FX_SLICE_STR(rootp), .range_end = {end, el}, .fn = evlog_fn, .arg = l};
    fx_watch *w = NULL;
    CHECK(fx_watch_start(G.raw, &wo, OP_MS, &w));

    /* 1. Graceful close: membership, then ready, then role. */
    ep q1 = open_mc(c, m);
    int64_t sub = fx_mpmc_consumer_chan(q1.h);
    char mem1[FX_MQ_KEY_CAP];
    membership_key(&k, sub, mem1, sizeof mem1);
    fx_mq_key ready, role1;
    CHECK(fx_mq_key_mpmc_ready(&k, m, sub, &ready));
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, m, fx_mpmc_consumer_member(q1.h), &role1));
    assert_int_equal(raw_get_int(ready.s), fx_mpmc_consumer_member(q1.h));
    assert_true(raw_exists(role1.s));
    size_t mark = evlog_len(l);
    CHECK(ep_close(q1));
    ep_free(q1);
    const char *keys1[3] = {mem1, ready.s, role1.s};
    int64_t rev1[3];
    bool seen = evlog_wait_deletes(l, keys1, rev1, 3, mark, 5000);
    if (!seen) {
        fx_watch_stop(w);
        fail_msg("close did not delete membership/ready/role: revs %" PRId64 " %" PRId64 " %" PRId64,
                 rev1[0], rev1[1], rev1[2]);
    }
    if (!(rev1[0] < rev1[1] && rev1[1] < rev1[2])) {
        fx_watch_stop(w);
        fail_msg("delete order: membership@%" PRId64 " ready@%" PRId64 " role@%" PRId64
                 ", want strictly increasing",
                 rev1[0], rev1[1], rev1[2]);
    }

    /* 2. A new consumer (through a proxy) claims the now unready sub-MPSC. At its close exactly
     * the membership delete fails (the proxy drops that request): the ready key is not deleted
     * on its own (no handoff while the membership is visible); the member revokes its member
     * lease instead, so ready + membership go together in one revision, and the role key goes. */
    fxt_proxy *px = fxt_proxy_start(G.etcd.client_port);
    assert_non_null(px);
    copts po = {.close_ms = 500, .eps = fxt_proxy_eps(px)};
    fx_mq_client *cx = client_new(root, &po);
    ep q2 = open_mc(cx, m);
    assert_int_equal(fx_mpmc_consumer_chan(q2.h), sub);
    char mem2[FX_MQ_KEY_CAP];
    membership_key(&k, sub, mem2, sizeof mem2);
    assert_true(strcmp(mem1, mem2) != 0);
    fx_mq_key role2;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, m, fx_mpmc_consumer_member(q2.h), &role2));
    assert_int_equal(raw_get_int(ready.s), fx_mpmc_consumer_member(q2.h));
    mark = evlog_len(l);
    fxt_proxy_block_key(px, mem2);
    fx_err ce = ep_close(q2);
    fxt_proxy_block_key(px, NULL);
    int blocked = fxt_proxy_blocked(px);
    bool ready_kept = raw_exists(ready.s), mem_kept = raw_exists(mem2), role_kept = raw_exists(role2.s);
    const char *keys2[3] = {mem2, ready.s, role2.s};
    int64_t rev2[3];
    seen = evlog_wait_deletes(l, keys2, rev2, 3, mark, TTL * 1000 + 6000);
    ep_free(q2);
    fx_mq_client_free(cx);
    fxt_proxy_stop(px);
    if (blocked == 0) {
        fx_watch_stop(w);
        fail_msg("close never sent the membership delete of %s", mem2);
    }
    fprintf(stderr, "close with the membership delete failing: %s\n", fx_errname(ce));
    if (mem_kept != ready_kept || role_kept) {
        fx_watch_stop(w);
        fail_msg("after close with a failed membership delete: membership %s, ready %s, role %s; "
                 "want membership and ready together (kept or revoked), role deleted",
                 mem_kept ? "kept" : "deleted", ready_kept ? "kept" : "deleted",
                 role_kept ? "kept" : "deleted");
    }
    if (!seen || rev2[0] != rev2[1]) {
        fx_watch_stop(w);
        fail_msg("membership deleted @%" PRId64 ", ready @%" PRId64 ": want one lease revoke",
                 rev2[0], rev2[1]);
    }
    assert_true(rev2[2] < rev2[1]); /* the role key went at close, before the expiry */

    /* 3. etcd down for the whole close: close is prompt, nothing is deleted one by one, and
     * membership, ready and role go together (the member lease revoked by the client's revoker
     * once etcd is back, or its expiry). */
    ep q3 = open_mc(c, m);
    assert_int_equal(fx_mpmc_consumer_chan(q3.h), sub);
    char mem3[FX_MQ_KEY_CAP];
    membership_key(&k, sub, mem3, sizeof mem3);
    fx_mq_key role3;
    CHECK(fx_mq_key_mpmc_role(&k, FX_MQ_ROLE_CONSUMER, m, fx_mpmc_consumer_member(q3.h), &role3));
    mark = evlog_len(l);
    if (fxt_etcd_stop(&G.etcd) != 0) {
        fx_watch_stop(w);
        fail_msg("etcd stop");
    }
    int64_t t0 = now_ms();
    ce = ep_close(q3);
    int64_t dt = now_ms() - t0;
    int rs = fxt_etcd_restart(&G.etcd);
    ep_free(q3);
    if (rs != 0) {
        fx_watch_stop(w);
        fail_msg("etcd restart");
    }
    fprintf(stderr, "close with etcd down: %s in %" PRId64 " ms\n", fx_errname(ce), dt);
    /* Not read key by key here: the revoker may act between two reads. The revisions below (one
     * per key, from the watch) prove the three went together. */
    const char *keys3[3] = {mem3, ready.s, role3.s};
    int64_t rev3[3];
    seen = evlog_wait_deletes(l, keys3, rev3, 3, mark, TTL * 1000 + 10000);
    fx_watch_stop(w);
    pthread_mutex_destroy(&l->mu);
    free(l);
    if (dt > 4000) fail_msg("close with etcd down took %" PRId64 " ms", dt);
    if (!seen) fail_msg("membership/ready/role did not go: revs %" PRId64 " %" PRId64 " %" PRId64,
                        rev3[0], rev3[1], rev3[2]);
    if (rev3[0] != rev3[1] || rev3[1] != rev3[2])
        fail_msg("membership @%" PRId64 ", ready @%" PRId64 ", role @%" PRId64 ": want one revision",
                 rev3[0], rev3[1], rev3[2]);
    CHECK(ep_close(p));
    ep_free(p);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_attach_keeps_channel_alive
 * =================================================================================================*/

static void mq_attach_keeps_channel_alive(void **state)
{
    (void)state;
    const char *root = "/t_alive";
    fx_mq_keys k = mkkeys(root);
    copts o = {.long_ttl = 4};
    fx_mq_client *ca = client_new(root, &o), *cb = client_new(root, &o);
    fx_mq_chan_cfg cfg = cfg_of(100);
    int64_t m = -1;
    CHECK(fx_mpmc_resolve(ca, "alive", &cfg, &m));
    ep pa = open_mp(ca, m);
    put_ok(pa, 0, 0, 3, NULL);
    ep pb = open_mp(cb, m); /* attach only: it never puts, so it binds no sub-MPSC */

    fx_mq_key meta;
    CHECK(fx_mq_key_mpmc_meta(&k, m, &meta));
    int64_t lm = meta_field(meta.s, "metadata_lease_id");
    int64_t lp = meta_field(meta.s, "payload_lease_id");
    int64_t li = meta_field(meta.s, "id_allocator_cluster_lease_id");

    /* The creator leaves completely (its lease manager stops). */
    CHECK(ep_close(pa));
    ep_free(pa);
    fx_mq_client_free(ca);

    int64_t t_end = now_ms() + 3 * TTL * 1000 + 1500;
    while (now_ms() < t_end) {
        if (!raw_exists(meta.s)) fail_msg("MPMC meta expired while an attached member lives");
        if (lease_ttl(lm, NULL) <= 0) fail_msg("metadata lease expired");
        if (G.redis_mode ? redis_lease_cmd(root, "PTTL", lp) <= 0 : lease_ttl(lp, NULL) <= 0)
            fail_msg("payload lease expired");
        if (lease_ttl(li, NULL) <= 0) fail_msg("id-allocator cluster lease expired");
        fxt_nap_ms(250);
    }

    /* A later attach by name still gets the same MPMC and works; the payloads survived. */
    fx_mq_client *cc = client_new(root, &o);
    int64_t m2 = -1;
    CHECK(fx_mpmc_resolve(cc, "alive", &cfg, &m2));
    assert_int_equal(m2, m);
    ep pc = open_mp(cc, m);
    put_ok(pc, 1, 0, 1, NULL);
    ep qc = open_mc(cc, m);
    rx *r = rx_new();
    int64_t dl = now_ms() + 10000;
    while (rx_total(r) < 4 && now_ms() < dl) {
        fx_mq_delivery d[8];
        size_t n = 0;
        fx_err e = ep_get(qc, d, 8, &n, 500);
        if (e == FX_ETIMEDOUT) continue;
        CHECK(e);
        for (size_t i = 0; i < n; i++) {
            rx_add(r, &d[i], 0, true);
            CHECK(ep_ack(qc, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
    }
    int sent[2] = {3, 1};
    rx_assert_exact(r, sent, 2);
    rx_free(r);
    CHECK(ep_close(qc));
    CHECK(ep_close(pc));
    CHECK(ep_close(pb));
    ep_free(qc);
    ep_free(pc);
    ep_free(pb);
    fx_mq_client_free(cc);
    fx_mq_client_free(cb);
}

/* ===================================================================================================
 * mq_close_idempotent_concurrent
 * =================================================================================================*/

typedef struct closer {
    pthread_t t;
    ep e;
    pthread_barrier_t *bar;
    fx_err r1, r2;
    int64_t t_done;
} closer;

static void *closer_main(void *arg)
{
    closer *x = arg;
    pthread_barrier_wait(x->bar);
    x->r1 = ep_close(x->e);
    x->r2 = ep_close(x->e);
    x->t_done = now_ms();
    return NULL;
}

#define NCLOSERS 4

/* A call blocked in another thread, 4 threads closing twice each at once. */
static void close_race(ep e, const char *what)
{
    blk b;
    blk_start(&b, e, 30000);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NCLOSERS);
    closer x[NCLOSERS];
    int64_t t0 = now_ms();
    for (int i = 0; i < NCLOSERS; i++) {
        x[i] = (closer){.e = e, .bar = &bar};
        assert_int_equal(pthread_create(&x[i].t, NULL, closer_main, &x[i]), 0);
    }
    for (int i = 0; i < NCLOSERS; i++) pthread_join(x[i].t, NULL);
    pthread_join(b.t, NULL);
    pthread_barrier_destroy(&bar);
    if (!b.blocked) fail_msg("%s: the call had returned before the close (%s)", what, fx_errname(b.r));
    for (int i = 0; i < NCLOSERS; i++) {
        if (x[i].r1 != FX_OK || x[i].r2 != FX_OK)
            fail_msg("%s: concurrent close %d: %s then %s", what, i, fx_errname(x[i].r1), fx_errname(x[i].r2));
        if (x[i].t_done - t0 > FXT_MS(3000)) fail_msg("%s: close took %" PRId64 " ms", what, x[i].t_done - t0);
    }
    if (b.r != FX_ECLOSED) fail_msg("%s: blocked call returned %s, want FX_ECLOSED", what, fx_errname(b.r));
    assert_int_equal(b.n, 0);
    if (b.t_ret - t0 > FXT_MS(1000)) fail_msg("%s: blocked call returned %" PRId64 " ms after close", what, b.t_ret - t0);
    CHECK(ep_close(e));
    size_t n = 99;
    if (ep_is_producer(e)) {
        CHECK_ERR(FX_ECLOSED, put_seq(e, 0, 0, 1, 100, &n, NULL));
    } else {
        fx_mq_delivery d[1];
        CHECK_ERR(FX_ECLOSED, ep_get(e, d, 1, &n, 100));
    }
    assert_int_equal(n, 0);
}

static void mq_close_idempotent_concurrent(void **state)
{
    (void)state;
    const char *root = "/t_close";
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg1 = cfg_of(1), cfg = cfg_of(100);

    int64_t full = -1, empty = -1;
    CHECK(fx_mpsc_create(c, &cfg1, &full));
    CHECK(fx_mpsc_create(c, &cfg, &empty));
    ep sp = open_sp(c, full);
    put_ok(sp, 0, 0, 1, NULL);
    close_race(sp, "MPSC producer (blocked put)");
    ep_free(sp);
    ep sc = open_sc(c, empty);
    close_race(sc, "MPSC consumer (blocked get)");
    ep_free(sc);

    int64_t m1 = -1, m2 = -1;
    CHECK(fx_mpmc_resolve(c, "closefull", &cfg1, &m1));
    CHECK(fx_mpmc_resolve(c, "closeempty", &cfg, &m2));
    ep mp = open_mp(c, m1);
    put_ok(mp, 0, 0, 1, NULL);
    close_race(mp, "MPMC producer (blocked put)");
    ep_free(mp);
    ep mc = open_mc(c, m2);
    close_race(mc, "MPMC consumer (blocked get)");
    ep_free(mc);

    /* Plain repeated closes with nothing in flight. */
    ep a = open_sp(c, empty), b = open_sc(c, empty);
    for (int i = 0; i < 3; i++) {
        CHECK(ep_close(a));
        CHECK(ep_close(b));
    }
    ep_free(a);
    ep_free(b);
    CHECK(fx_mq_client_close(c));
    CHECK(fx_mq_client_close(c));
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_no_id_gap
 * =================================================================================================*/

/* Get until `want` deliveries or the deadline; acks each. */
static void drain(ep q, rx *r, int64_t want, int timeout_ms, bool strict)
{
    int64_t dl = now_ms() + timeout_ms;
    while (rx_total(r) < want && now_ms() < dl) {
        fx_mq_delivery d[16];
        size_t n = 0, max = (size_t)(want - rx_total(r));
        if (max > 16) max = 16;
        fx_err e = ep_get(q, d, max, &n, 300);
        if (e == FX_ETIMEDOUT) continue;
        if (e != FX_OK) fail_msg("get: %s (%s)", fx_errname(e), fx_err_detail());
        for (size_t i = 0; i < n; i++) {
            rx_add(r, &d[i], 0, strict);
            CHECK(ep_ack(q, &d[i].id, 1));
            fx_mq_delivery_free(&d[i]);
        }
    }
}

static void mq_no_id_gap(void **state)
{
    (void)state;
    const char *root = "/t_gap";
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(1000);
    /* On Redis the payload store goes down for a few seconds below: its payload lease (the
     * channel TTL) must outlive that, as a production retention (days) does. */
    if (G.redis_mode) cfg.ttl_s = 10;
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    ep p = open_sp(c, chan);
    fx_mq_msg_id ids[8];
    put_ok(p, 0, 0, 5, ids);
    int64_t pidx = ids[0].pidx, next = ids[4].msg + 1;
    for (int i = 1; i < 5; i++) assert_int_equal(ids[i].msg, ids[0].msg + i);

    /* Batch 2 fails: etcd stopped. */
    if (fxt_etcd_stop(&G.etcd) != 0) fail_msg("etcd stop");
    size_t np = 99;
    int64_t t0 = now_ms();
    fx_err fe = put_seq(p, 0, 5, 5, 2000, &np, ids);
    int64_t dt = now_ms() - t0;
    if (fxt_etcd_restart(&G.etcd) != 0) fail_msg("etcd restart");
    fprintf(stderr, "put with etcd down: %s (n_put %zu) in %" PRId64 " ms\n", fx_errname(fe), np, dt);
    assert_true(fe != FX_OK);
    assert_int_equal(np, 0);
    assert_true(dt < 8000);

    /* Retry the same batch: succeeds with the next ids (or the endpoint closed itself, and a new
     * producer takes over: the contract allows either). */
    fx_err re = put_seq(p, 0, 5, 5, 5000, &np, ids);
    if (re == FX_ECLOSED) {
        fprintf(stderr, "producer closed after the failed batch; retrying on a new producer\n");
        ep_free(p);
        p = open_sp(c, chan);
        re = put_seq(p, 0, 5, 5, 5000, &np, ids);
    } else if (re == FX_OK) {
        assert_int_equal(ids[0].pidx, pidx);
        assert_int_equal(ids[0].msg, next); /* no id consumed by the failed batch */
    }
    if (re != FX_OK) fail_msg("retry: %s (%s)", fx_errname(re), fx_err_detail());
    assert_int_equal(np, 5);
    for (int i = 1; i < 5; i++) assert_int_equal(ids[i].msg, ids[0].msg + i);
    int64_t pidx2 = ids[0].pidx;
    int total = 10;

    if (G.redis_mode) { /* Batch 3 fails: the payload store (Redis, AOF always) killed. */
        next = ids[4].msg + 1;
        if (fxt_redis_kill(&G.redis) != 0) fail_msg("redis kill");
        t0 = now_ms();
        fe = put_seq(p, 0, 10, 5, 2000, &np, ids);
        dt = now_ms() - t0;
        if (fxt_redis_restart(&G.redis) != 0) fail_msg("redis restart");
        fprintf(stderr, "put with redis down: %s (n_put %zu) in %" PRId64 " ms\n", fx_errname(fe), np, dt);
        assert_true(fe != FX_OK);
        assert_int_equal(np, 0);
        assert_true(dt < 8000);
        CHECK(put_seq(p, 0, 10, 5, 5000, &np, ids));
        assert_int_equal(np, 5);
        assert_int_equal(ids[0].pidx, pidx2);
        assert_int_equal(ids[0].msg, next); /* no id consumed by the failed batch */
        for (int i = 1; i < 5; i++) assert_int_equal(ids[i].msg, ids[0].msg + i);
        total = 15;
    }

    /* The consumer sees every message, ids contiguous per producer. */
    ep q = open_sc(c, chan);
    rx *r = rx_new();
    drain(q, r, total, 10000, true);
    int sent[1] = {total};
    rx_assert_exact(r, sent, 1); /* includes: no gap in the msg ids of any producer */
    CHECK(ep_flush(q, 5000));
    CHECK(ep_close(q));
    ep_free(q);
    rx_free(r);

    /* A hole below the produce offset: three messages, the middle payload deleted by hand. */
    fx_mq_msg_id h[3];
    for (int i = 0; i < 3; i++) put_ok(p, 0, total + i, 1, &h[i]);
    uint64_t missing0 = fx_mq_client_payload_missing(c);
    assert_int_equal(h[0].pidx, pidx2);
    assert_int_equal(h[1].msg, h[0].msg + 1);
    assert_int_equal(h[2].msg, h[1].msg + 1);
    fx_mq_key rel;
    CHECK(fx_mq_mpsc_payload_key(chan, pidx2, h[1].msg, &rel));
    char abs[FX_MQ_KEY_CAP + 128];
    payload_abs(root, &rel, abs, sizeof abs);
    int64_t deleted = 0;
    if (G.redis_mode) {
        fx_kv_store *rs = redis_store(root);
        uint8_t endk[FX_MQ_KEY_CAP + 1];
        size_t rl = strlen(rel.s);
        memcpy(endk, rel.s, rl);
        endk[rl] = 0;
        CHECK(fx_kv_delete_range(rs, FX_SLICE_STR(rel.s), (fx_slice){endk, rl + 1}, &deleted, OP_MS));
        fx_kv_store_free(rs);
    } else {
        fx_del_req del = {.key = FX_SLICE_STR(abs)};
        fx_del_resp dr = {0};
        CHECK(fx_etcd_delete(G.raw, &del, &dr, OP_MS));
        deleted = dr.deleted;
        fx_del_resp_free(&dr);
    }
    if (deleted != 1) {
        dump_prefix(root);
        fail_msg("payload key %s not found (deleted %" PRId64 ")", abs, deleted);
    }
    q = open_sc(c, chan);
    r = rx_new();
    drain(q, r, 2, 10000, false);
    put_ok(p, 0, total + 3, 1, NULL); /* and it keeps going */
    drain(q, r, 3, 10000, false);
    {
        fx_mq_delivery d[4];
        size_t n = 0;
        fx_err e = ep_get(q, d, 4, &n, 500);
        for (size_t i = 0; i < n; i++) {
            rx_add(r, &d[i], 0, false);
            fx_mq_delivery_free(&d[i]);
        }
        assert_int_equal(e, FX_ETIMEDOUT);
    }
    assert_int_equal(r->total, 3);
    assert_int_equal(r->cnt[0][total], 1);
    assert_int_equal(r->cnt[0][total + 1], 0);
    assert_int_equal(r->cnt[0][total + 2], 1);
    assert_int_equal(r->cnt[0][total + 3], 1);
    /* The skipped id is counted once as a missing payload (fluxon_payload_missing_total). */
    assert_int_equal(fx_mq_client_payload_missing(c), missing0 + 1);
    assert_int_equal(r->order, 0);
    rx_free(r);
    CHECK(ep_close(q));
    CHECK(ep_close(p));
    ep_free(q);
    ep_free(p);
    fx_mq_client_free(c);
}

/* ===================================================================================================
 * mq_client_close_closes_endpoints
 * =================================================================================================*/

typedef struct keyset {
    char **k;
    size_t n;
} keyset;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every key under root, with the root stripped, tagged with whether it has a lease; sorted. */
static keyset snapshot(const char *root)
{
    char rootp[64];
    snprintf(rootp, sizeof rootp, "%s/", root);
    fx_range_resp r = {0};
    raw_list(rootp, &r);
    keyset s = {calloc(r.n_kvs + 1, sizeof(char *)), r.n_kvs};
    assert_non_null(s.k);
    size_t rl = strlen(root);
    for (size_t i = 0; i < r.n_kvs; i++) {
        size_t len = r.kvs[i].key.len - rl + 16;
        s.k[i] = malloc(len);
        assert_non_null(s.k[i]);
        snprintf(s.k[i], len, "%s%s", (const char *)r.kvs[i].key.data + rl, r.kvs[i].lease ? " [leased]" : "");
    }
    fx_range_resp_free(&r);
    qsort(s.k, s.n, sizeof *s.k, cmp_str);
    return s;
}

static void keyset_free(keyset *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->k[i]);
    free(s->k);
}

typedef struct cc_setup {
    fx_mq_client *c;
    ep e[4];
} cc_setup;

static void cc_build(cc_setup *s, const char *root)
{
    s->c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(100);
    int64_t chan = -1, m = -1;
    CHECK(fx_mpsc_create(s->c, &cfg, &chan));
    s->e[0] = open_sp(s->c, chan);
    s->e[1] = open_sc(s->c, chan);
    CHECK(fx_mpmc_resolve(s->c, "cc", &cfg, &m));
    s->e[3] = open_mc(s->c, m);
    s->e[2] = open_mp(s->c, m);
    for (int i = 0; i < 2; i++) {
        ep p = s->e[2 * i], q = s->e[2 * i + 1];
        put_ok(p, i, 0, 5, NULL);
        rx *r = rx_new();
        drain(q, r, 2, 5000, true);
        assert_int_equal(r->total, 2);
        rx_free(r);
        CHECK(ep_flush(q, 5000));
    }
}

static void keyset_assert_equal(const keyset *a, const keyset *b)
{
    bool same = a->n == b->n;
    for (size_t i = 0; same && i < a->n; i++) same = !strcmp(a->k[i], b->k[i]);
    if (!same) {
        fprintf(stderr, "one by one (%zu keys):\n", a->n);
        for (size_t i = 0; i < a->n; i++) fprintf(stderr, "  %s\n", a->k[i]);
        fprintf(stderr, "by client close (%zu keys):\n", b->n);
        for (size_t i = 0; i < b->n; i++) fprintf(stderr, "  %s\n", b->k[i]);
        fail_msg("etcd state after client close differs from closing endpoints one by one");
    }
}

static void mq_client_close_closes_endpoints(void **state)
{
    (void)state;
    /* A: endpoints closed one by one, then the client. */
    cc_setup a;
    cc_build(&a, "/t_cc_a");
    for (int i = 0; i < 4; i++) CHECK(ep_close(a.e[i]));
    CHECK(fx_mq_client_close(a.c));
    keyset ka = snapshot("/t_cc_a");
    for (int i = 0; i < 4; i++) ep_free(a.e[i]);
    fx_mq_client_free(a.c);

    /* B: the same setup, closed only through the client root. */
    cc_setup b;
    cc_build(&b, "/t_cc_b");
    int64_t t0 = now_ms();
    CHECK(fx_mq_client_close(b.c));
    int64_t dt = now_ms() - t0;
    keyset kb = snapshot("/t_cc_b");
    CHECK(fx_mq_client_close(b.c)); /* idempotent */
    /* Every endpoint is closed. */
    size_t n = 99;
    CHECK_ERR(FX_ECLOSED, put_seq(b.e[0], 0, 5, 1, 100, &n, NULL));
    CHECK_ERR(FX_ECLOSED, put_seq(b.e[2], 1, 5, 1, 100, &n, NULL));
    fx_mq_delivery d[1];
    CHECK_ERR(FX_ECLOSED, ep_get(b.e[1], d, 1, &n, 100));
    CHECK_ERR(FX_ECLOSED, ep_get(b.e[3], d, 1, &n, 100));
    for (int i = 0; i < 4; i++) CHECK(ep_close(b.e[i]));
    for (int i = 0; i < 4; i++) ep_free(b.e[i]);
    fx_mq_client_free(b.c);

    assert_true(dt < 5000);
    assert_true(ka.n > 0);
    /* No member key survived in either (membership, role and ready keys were deleted). */
    for (size_t i = 0; i < ka.n; i++) {
        if (strstr(ka.k[i], "/consumer/consumer_") || strstr(ka.k[i], "/producer/producer_") ||
            strstr(ka.k[i], "/mpmc_channels/ready/") || strstr(ka.k[i], "/mpmc_channels/producer/") ||
            strstr(ka.k[i], "/mpmc_channels/consumer/"))
            fail_msg("member key left after close: %s", ka.k[i]);
    }
    keyset_assert_equal(&ka, &kb);
    keyset_free(&ka);
    keyset_free(&kb);
}

/* ===================================================================================================
 * kv_redis_lease_set_missing_is_lost_plane (Redis group only)
 * =================================================================================================*/

static int64_t consume_offset(const fx_mq_keys *k, int64_t chan, int64_t pidx)
{
    fx_mq_key ok;
    CHECK(fx_mq_key_consume_offset(k, chan, pidx, &ok));
    fx_kv kv = {0};
    if (!raw_get(ok.s, &kv)) return -1;
    int64_t v = -1;
    CHECK(fx_mq_consume_offset_decode(kv.value.data, kv.value.len, &v));
    fx_kv_free(&kv);
    return v;
}

static void kv_redis_lease_set_missing_is_lost_plane(void **state)
{
    (void)state;
    const char *root = "/t_lostplane";
    fx_mq_keys k = mkkeys(root);
    fx_mq_client *c = client_new(root, NULL);
    fx_mq_chan_cfg cfg = cfg_of(1000);
    int64_t chan = -1;
    CHECK(fx_mpsc_create(c, &cfg, &chan));
    ep p = open_sp(c, chan), q = open_sc(c, chan);
    fx_mq_msg_id ids[5];
    put_ok(p, 0, 0, 5, ids);
    rx *r = rx_new();
    drain(q, r, 5, 10000, true);
    CHECK(ep_flush(q, 5000));
    int64_t pidx = ids[0].pidx;
    int64_t off0 = consume_offset(&k, chan, pidx); /* the first batch, committed */
    assert_int_equal(off0, 5);
    put_ok(p, 0, 5, 5, NULL); /* ids 5..9: stored, then their plane loses them */
    fx_mq_key meta;
    CHECK(fx_mq_key_chan_meta(&k, chan, &meta));
    int64_t pl = meta_field(meta.s, "payload_lease_id");
    uint64_t missing0 = fx_mq_client_payload_missing(c);
    if (redis_lease_cmd(root, "DEL", pl) != 1) fail_msg("payload lease %" PRId64 " not in Redis", pl);

    fx_mq_delivery d[10];
    size_t n = 99;
    fx_err e = ep_get(q, d, 10, &n, 1000);
    for (size_t i = 0; i < n && n != 99; i++) fx_mq_delivery_free(&d[i]);
    if (e != FX_ELEASE_LOST)
        fail_msg("get after the lease set went: %s (%s), %zu delivered, %" PRIu64 " skipped as "
                 "missing, consume offset %" PRId64 " (want FX_ELEASE_LOST, offset 5)",
                 fx_errname(e), fx_err_detail(), n, fx_mq_client_payload_missing(c) - missing0,
                 consume_offset(&k, chan, pidx));
    assert_int_equal(n, 0);
    n = 99;
    CHECK_ERR(FX_ECLOSED, ep_get(q, d, 10, &n, 200)); /* the consumer stopped */
    /* Nothing committed past the gap, nothing skipped, one lost plane counted. */
    int64_t dl = now_ms() + 1500;
    while (now_ms() < dl) {
        assert_int_equal(consume_offset(&k, chan, pidx), off0);
        usleep(100 * 1000);
    }
    assert_int_equal(fx_mq_client_payload_missing(c) - missing0, 0);
    assert_int_equal(fx_mq_client_plane_lost(c), 1);
    fx_err ce = ep_close(q);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    ce = ep_close(p);
    assert_true(ce == FX_OK || ce == FX_ELEASE_LOST || ce == FX_ECLOSED);
    ep_free(q);
    ep_free(p);
    rx_free(r);
    fx_mq_client_free(c);
}

/* ================================================================================================ */

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], CHILD_FLAG)) return crash_child(argc, argv);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* run only the tests matching argv[1] */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(mq_chan_id_monotonic, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_mpsc_exact_once_graceful, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_no_keys_after_ttl, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_mpmc_dynamic, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_consumer_crash_redelivers, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_member_lease_lost_closes, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_payload_lease_lost_closes, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_capacity_blocks_then_fails, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_consumer_create_race, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_handoff_order, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_attach_keeps_channel_alive, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_close_idempotent_concurrent, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_no_id_gap, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(mq_client_close_closes_endpoints, test_setup, test_teardown),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);

    /* The same 14 tests on the Redis payload plane (a fresh etcd, plus a redis-server). */
    enum { NT = sizeof tests / sizeof tests[0] };
    struct CMUnitTest rtests[NT + 1];
    static char names[NT][64];
    for (size_t i = 0; i < NT; i++) {
        rtests[i] = tests[i];
        snprintf(names[i], sizeof names[i], "%s_redis", tests[i].name);
        rtests[i].name = names[i];
    }
    rtests[NT] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(
        kv_redis_lease_set_missing_is_lost_plane, test_setup, test_teardown); /* Redis only */
    memset(&G.redis, 0, sizeof G.redis);
    snprintf(G.redis.appendfsync, sizeof G.redis.appendfsync, "always"); /* kill + restart keeps data */
    if (fxt_redis_start(&G.redis) != 0) {
        fprintf(stderr, "redis-server did not start: the _redis tests fail\n");
        return failed + (int)(sizeof rtests / sizeof rtests[0]);
    }
    G.redis_mode = true;
    setenv("FXT_MQ_REDIS_URL", G.redis.url, 1); /* for the crash child (a re-exec) */
    failed += _cmocka_run_group_tests("mq_accept_redis", rtests, sizeof rtests / sizeof rtests[0],
                                      group_setup, group_teardown);
    fxt_redis_destroy(&G.redis);
    return failed;
}
