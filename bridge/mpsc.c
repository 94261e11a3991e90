/* mpsc.c -- Fluxon MPSC: create, ChanManager (four real lease handles), producer with the
 * batched, gap-free write path, consumer with the watch-driven at-least-once read path.
 * Contracts: fluxon_mq.h (public), mq_int.h (fx__mpsc_*). DESIGN.md §4.
 *
 * Producer write path (one put call, serialised per producer):
 *   capacity: count_prefix(payload prefix of the channel) -> room = capacity - count; no room:
 *   wait on the producer condvar (woken by close / lease loss) polling the count every
 *   CAP_POLL_MS until the put's deadline (FX_EFULL then). Store min(room, rest) values in chunks
 *   of <= CHUNK_MSGS values / CHUNK_BYTES bytes. One chunk = ids [next, next+m):
 *     kv shared:  ONE txn  compare(produce offset == next-1 (absent when next == 0),
 *                                  membership key exists)
 *                          success: m payload puts (payload lease) + offset put (global lease)
 *                          failure: read offset, read membership
 *     kv apart:   put_many (payload lease), then the same txn with only the offset put.
 *   The compare makes a retry of an ambiguous failure (timeout after send) idempotent: a retry
 *   that finds the offset already at next+m-1 knows the first attempt landed. `next` advances only
 *   after success; a chunk that cannot be confirmed before the deadline leaves `offset_unknown`,
 *   and the next put re-reads the produce offset before choosing ids. So no id is skipped and no
 *   id is written twice with different values. A missing membership key means the member lease
 *   is gone: the producer closes itself (FX_ELEASE_LOST). A write refused because a lease is gone
 *   (payload or global): the same.
 *
 * Consumer read path:
 *   resume points = consume offsets read once at open; the client's shared produce-offset watch
 *   (pwatch.h: one stream per client, registered first) plus one read of the channel's produce
 *   offsets right after registering raise produce[p] monotonically and wake get(). get() picks producers
 *   round robin among those with produce >= next_fetch, reads a run with ONE range read, skips
 *   (ERR with the ids + counters: the consumer's skipped_ids and the client's payload_missing,
 *   treated as acked) ids missing below the produce offset: the payload plane lost them (e.g.
 *   Redis without fsync); a consumer never waits for them. ack() marks ids in a
 *   per-producer window; the commit thread advances each consume offset over the contiguous
 *   acked prefix and deletes the payloads below it: one txn (offset puts + payload range deletes)
 *   when kv is shared, else offsets first, then payload delete_range. Failed commits retry with
 *   a bounded backoff; close makes one final bounded attempt.
 *
 * Bounds: at most MAX_UNACKED (65536) handed-out, unacknowledged ids per producer: get() skips a
 * producer at that bound (and times out if nothing else is ready) until acks come in.
 *
 * Endpoint lifecycle (both kinds): `mu` guards the state; close is a small state machine
 * (OPEN -> RUNNING -> DONE -> FINISHED): the first caller does the work, concurrent callers wait
 * for DONE, the worker unregisters from the client root after DONE and then sets FINISHED; free
 * waits for FINISHED and for every concurrent closer to have left.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"
#include "mq_int.h"
#include "pwatch.h"
#include "segment.h"

#define CHUNK_MSGS 127                 /* payload puts per txn (+1 offset put <= 128 ops) */
#define CHUNK_BYTES (1024 * 1024)      /* payload bytes per txn (etcd max request 1.5 MiB) */
#define CAP_POLL_MS 100                /* capacity re-count interval while full */
#define RETRY_MIN_MS 50                /* write / commit retry backoff */
#define RETRY_MAX_MS 1000
#define MEMBER_TXN_ATTEMPTS 3
#define MAX_UNACKED 65536              /* handed-out, unacknowledged ids per producer */
#define MAX_PRODUCERS 100000           /* producers tracked by one consumer */
#define COMMIT_GROUP 64                /* producers per commit txn (2 ops each) */
#define SKIP_LOG_MS 1000

/* ST_RETRY (standalone consumer only): a close failed strongly (acknowledged messages could not
 * be committed); the data path is closed, the endpoint keeps its leases and membership, and the
 * next close runs again (free() forces it to finish). */
enum { ST_OPEN = 0, ST_RUNNING, ST_DONE, ST_FINISHED, ST_RETRY };

/* ---- shared pieces --------------------------------------------------------------------------- */

typedef struct stats {
    _Atomic uint64_t put_calls, put_msgs, put_txns, put_retries, offset_rereads, full_waits,
        full_errors, cap_checks, got_msgs, fetches, skipped_ids, acked, commits, commit_retries;
} stats;

static void stats_copy(const stats *s, fx__mpsc_stats *o)
{
    o->put_calls = s->put_calls;
    o->put_msgs = s->put_msgs;
    o->put_txns = s->put_txns;
    o->put_retries = s->put_retries;
    o->offset_rereads = s->offset_rereads;
    o->full_waits = s->full_waits;
    o->full_errors = s->full_errors;
    o->cap_checks = s->cap_checks;
    o->got_msgs = s->got_msgs;
    o->fetches = s->fetches;
    o->skipped_ids = s->skipped_ids;
    o->acked = s->acked;
    o->commits = s->commits;
    o->commit_retries = s->commit_retries;
}

/* ChanManager: the channel's meta and this endpoint's four real lease handles. */
typedef struct chan_mgr {
    fx_mq_client *c;
    int64_t chan;
    bool sub;
    int64_t mpmc; /* sub only: payload namespace */
    fx_mq_chan_meta meta;
    int64_t ttl_s;        /* registration ttl of the member lease (standalone: also global, payload) */
    int64_t data_ttl_s;   /* registration ttl of global / payload (sub: the MPMC's retention) */
    int64_t long_ttl_s;   /* ttl of the global-long lease (grant on renewal, registration) */
    int64_t member_lease;
    fx_lease *h_member, *h_global, *h_long, *h_payload;
} chan_mgr;

/* Endpoint lifecycle state (guarded by the endpoint's mu). */
typedef struct life {
    bool constructing;
    bool stop;           /* the data path must stop: close requested or lease lost */
    fx_err fault;        /* FX_ELEASE_LOST once a member/payload lease is lost */
    bool fault_reported; /* the fault was returned once */
    int state;           /* ST_* */
    int waiters;         /* concurrent closers waiting for DONE */
    fx_err result;
} life;

/* A lease of the endpoint expired (expiry callback, endpoint mutex held): stop the data path and
 * remember the fault. Returns true the first time (the caller logs). */
static bool life_lease_lost(life *lf)
{
    if (lf->fault || lf->state >= ST_DONE) return false;
    lf->fault = FX_ELEASE_LOST;
    lf->stop = true;
    return true;
}

/* Entry gate of every data-path call (endpoint mutex held): FX_OK to proceed; FX_ELEASE_LOST once
 * after a lease loss (*self_close set: the caller runs the endpoint's close); FX_ECLOSED after. */
static fx_err life_gate(life *lf, const char *what, int64_t chan, int64_t idx, bool *self_close)
{
    if (lf->fault && !lf->fault_reported) {
        lf->fault_reported = true;
        *self_close = true;
        return fx_seterr(FX_ELEASE_LOST, "mpsc %s %lld/%lld: a lease it depends on was lost", what,
                         (long long)chan, (long long)idx);
    }
    if (lf->stop || lf->state != ST_OPEN) return fx_seterr(FX_ECLOSED, "mpsc %s closed", what);
    return FX_OK;
}

/* End of a close: mark DONE (wakes concurrent closers and waiting calls), unregister a standalone
 * endpoint from the client root (which may wait for the root's own close of it), then FINISHED. */
static void life_finish(life *lf, pthread_mutex_t *mu, pthread_cond_t *cv, fx_mq_client *c,
                        fx__mq_endpoint *ep, bool registered)
{
    pthread_mutex_lock(mu);
    lf->state = ST_DONE;
    lf->result = FX_OK;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    if (registered) fx__mq_unregister(c, ep);
    pthread_mutex_lock(mu);
    lf->state = ST_FINISHED;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}

/* free(): wait until the close has finished and no concurrent closer is still inside it. */
static void life_wait_finished(life *lf, pthread_mutex_t *mu, pthread_cond_t *cv)
{
    pthread_mutex_lock(mu);
    while (lf->state != ST_FINISHED || lf->waiters > 0) pthread_cond_wait(cv, mu);
    pthread_mutex_unlock(mu);
}

static bool transient(fx_err e)
{
    return e == FX_ETIMEDOUT || e == FX_EUNAVAIL || e == FX_ESERVER || e == FX_ENOSPACE;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static fx_err key_err(fx_err e, const char *what)
{
    return e ? fx_seterr(e, "mpsc: building %s key failed", what) : FX_OK;
}

/* Relative payload key of (pidx, id) in this channel's namespace. */
static fx_err pay_key(const chan_mgr *m, int64_t pidx, int64_t id, fx_mq_key *out)
{
    return m->sub ? fx_mq_payload_key(m->mpmc, m->chan, pidx, id, out)
                  : fx_mq_mpsc_payload_key(m->chan, pidx, id, out);
}

/* Count prefix of every payload of the channel. */
static fx_err pay_prefix(const chan_mgr *m, fx_mq_key *out)
{
    return m->sub ? fx_mq_payload_prefix_mpsc(m->mpmc, m->chan, out)
                  : fx_mq_mpsc_payload_prefix_chan(m->chan, out);
}

static fx_err pay_parse(const chan_mgr *m, fx_slice key, int64_t *pidx, int64_t *id)
{
    int64_t mp = 0, ch = 0;
    fx_err e = m->sub ? fx_mq_parse_payload_key(key, &mp, &ch, pidx, id)
                      : fx_mq_parse_mpsc_payload_key(key, &ch, pidx, id);
    if (e) return e;
    if (ch != m->chan || (m->sub && mp != m->mpmc))
        return fx_seterr(FX_EPROTO, "mpsc: payload key of another channel");
    return FX_OK;
}

/* Full etcd key (kv prefix + relative key) for writes inside a control-plane txn. */
static fx_err full_key(const fx_mq_client *c, const fx_mq_key *rel, char *buf, size_t cap,
                       fx_slice *out)
{
    const char *kp = fx_kv_prefix(c->kv);
    size_t pl = strlen(kp);
    if (pl + rel->len > cap) return fx_seterr(FX_EINVAL, "mpsc: payload key too long");
    memcpy(buf, kp, pl);
    memcpy(buf + pl, rel->s, rel->len);
    *out = (fx_slice){buf, pl + rel->len};
    return FX_OK;
}

#define FULLKEY_CAP (FX_MQ_KEY_CAP + 1024)

/* Interruptible sleep on an endpoint condvar: returns early when *stop becomes true. */
static void nap(pthread_mutex_t *mu, pthread_cond_t *cv, const bool *stop, int64_t ms)
{
    int64_t dl = fx_now_ms() + ms;
    pthread_mutex_lock(mu);
    while (!*stop && fx_ms_left(dl) > 0) {
        struct timespec ts = fx_deadline_ts(dl);
        pthread_cond_timedwait(cv, mu, &ts);
    }
    pthread_mutex_unlock(mu);
}

/* ---- ChanManager ------------------------------------------------------------------------------ */

static void mgr_release(chan_mgr *m)
{
    fx_lease_release(m->h_member);
    fx_lease_release(m->h_payload);
    fx_lease_release(m->h_long);
    fx_lease_release(m->h_global);
    m->h_member = m->h_payload = m->h_long = m->h_global = NULL;
}

static fx_err read_meta(fx_mq_client *c, int64_t chan, fx_mq_chan_meta *out)
{
    fx_mq_key k;
    fx_err e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &k), "meta");
    if (e) return e;
    fx_kv kv = {0};
    e = fx_etcd_get(c->etcd, fx_mq_key_slice(&k), &kv, c->op_timeout_ms);
    if (e == FX_ENOTFOUND)
        return fx_seterr(FX_ENOTFOUND, "mpsc channel %lld: meta not found", (long long)chan);
    if (e) return e;
    e = fx_mq_chan_meta_decode(kv.value.data, kv.value.len, out);
    fx_kv_free(&kv);
    return e;
}

/* The channel's global-long (id-allocator) lease expired while its meta lives on (a sub-MPSC
 * whose meta is kept by the MPMC metadata lease, unbound by anyone for long_lease_ttl_s). Its
 * counters went with it; no handle of the channel is alive (each holds that lease), so starting
 * them again cannot collide with a live membership, and producers resume after their produce
 * offset. Publish a fresh cluster lease and CAS it into the meta (the meta keeps its lease), then
 * register it. Concurrent binders converge on one lease (create==0 on the cluster-lease key, CAS
 * on the meta). */
static fx_err mgr_renew_long(fx_mq_client *c, chan_mgr *m)
{
    fx_mq_key lk, mk;
    fx_err e = key_err(fx_mq_key_cluster_lease_id_alloc(&c->keys, m->chan, &lk), "cluster lease");
    if (!e) e = key_err(fx_mq_key_chan_meta(&c->keys, m->chan, &mk), "meta");
    if (e) return e;
    int64_t old = m->meta.global_long_lease_id;
    for (int attempt = 0; attempt < 3; attempt++) {
        int64_t nl = 0;
        bool granted = false;
        if ((e = fx__mq_cluster_lease(c, &lk, m->long_ttl_s, &nl, &granted))) return e;
        fx_kv kv = {0};
        if ((e = fx_etcd_get(c->etcd, fx_mq_key_slice(&mk), &kv, c->op_timeout_ms))) {
            fx_kv_free(&kv);
            return e == FX_ENOTFOUND ? fx_seterr(FX_ENOTFOUND, "mpsc channel %lld: meta gone",
                                                 (long long)m->chan)
                                     : e;
        }
        fx_mq_chan_meta cur;
        if ((e = fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &cur))) {
            fx_kv_free(&kv);
            return e;
        }
        if (cur.global_long_lease_id == old) {
            fx_mq_chan_meta nm = cur;
            nm.global_long_lease_id = nl;
            char *js = NULL;
            if ((e = fx_mq_chan_meta_encode(&nm, &js))) {
                fx_kv_free(&kv);
                return e;
            }
            fx_cmp cmp = {.target = FX_CMP_MOD, .result = FX_CMP_EQUAL,
                          .key = fx_mq_key_slice(&mk), .num = kv.mod_revision};
            fx_op put = {.type = FX_OP_PUT,
                         .u.put = {.key = fx_mq_key_slice(&mk), .value = FX_SLICE_STR(js),
                                   .lease = kv.lease}};
            fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
            fx_txn_resp resp = {0};
            e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
            bool won = e == FX_OK && resp.succeeded;
            fx_txn_resp_free(&resp);
            free(js);
            fx_kv_free(&kv);
            if (e) return e;
            if (!won) continue; /* the meta changed under us: look again */
            cur = nm;
            FX_WRN("mpsc channel %lld: id-allocator lease %lld had expired; renewed as %lld "
                   "(its idx counters restart)",
                   (long long)m->chan, (long long)old, (long long)nl);
        } else {
            fx_kv_free(&kv);
            if (cur.global_long_lease_id != nl) continue; /* someone else's renewal: reread */
        }
        m->meta.global_long_lease_id = cur.global_long_lease_id;
        return fx__mq_hold(c, false, m->long_ttl_s, m->meta.global_long_lease_id, granted, NULL,
                           NULL, &m->h_long);
    }
    return fx_seterr(FX_ELEASE_EXPIRED, "mpsc channel %lld: id-allocator lease %lld expired and "
                     "could not be renewed", (long long)m->chan, (long long)old);
}

/* Bind a ChanManager to an existing channel (new_with_chan_id / new_mpmc_subchannel_with_chan_id):
 * read and validate meta, register global, global-long, payload, and the member lease (granted
 * here for a standalone endpoint, the parent's for a sub endpoint). Global, member and payload
 * handles carry the endpoint's expiry callback (the global lease holds the meta and the offsets:
 * without it a consumer would retry its commits forever). On error everything acquired is
 * released. */
static fx_err mgr_open(fx_mq_client *c, int64_t chan, const fx__mpsc_parent *parent,
                       fx_lease_expired_fn cb, void *arg, chan_mgr *m)
{
    memset(m, 0, sizeof *m);
    m->c = c;
    m->chan = chan;
    m->sub = parent != NULL;
    /* A fresh sub-MPSC (just created by this caller, unpublished): its meta is known and the
     * leases it shares with the parent are held by the parent member, the long one was just
     * granted: no read, no probes. */
    bool fresh = parent && parent->fresh_meta;
    fx_err e = FX_OK;
    if (fresh)
        m->meta = *parent->fresh_meta;
    else if ((e = read_meta(c, chan, &m->meta)))
        return e;
    if (parent) {
        if (m->meta.global_lease_id != parent->global_lease ||
            m->meta.payload_lease_id != parent->payload_lease)
            return fx_seterr(FX_EPROTO,
                             "sub-mpsc %lld: meta leases (global %lld, payload %lld) differ from "
                             "the parent's (%lld, %lld)",
                             (long long)chan, (long long)m->meta.global_lease_id,
                             (long long)m->meta.payload_lease_id, (long long)parent->global_lease,
                             (long long)parent->payload_lease);
        m->mpmc = parent->mpmc;
        m->ttl_s = parent->ttl_s > 0 ? parent->ttl_s : m->meta.ttl_seconds;
        m->data_ttl_s = parent->data_ttl_s > 0 ? parent->data_ttl_s : m->ttl_s;
        m->long_ttl_s = parent->long_ttl_s > 0 ? parent->long_ttl_s : c->long_ttl_s;
    } else {
        m->ttl_s = m->data_ttl_s = m->meta.ttl_seconds;
        m->long_ttl_s = c->long_ttl_s;
    }
    if ((e = fx__mq_hold(c, false, m->data_ttl_s, m->meta.global_lease_id, fresh, cb, arg,
                         &m->h_global)))
        goto fail;
    e = fx__mq_hold(c, false, m->long_ttl_s, m->meta.global_long_lease_id, fresh, NULL, NULL,
                    &m->h_long);
    if (e == FX_ELEASE_EXPIRED) e = mgr_renew_long(c, m);
    if (e) goto fail;
    if ((e = fx__mq_hold(c, true, m->data_ttl_s, m->meta.payload_lease_id, fresh, cb, arg,
                         &m->h_payload)))
        goto fail;
    bool granted = false;
    if (parent) {
        m->member_lease = parent->member_lease;
    } else {
        if ((e = fx__mq_grant(c, m->ttl_s, &m->member_lease))) goto fail;
        granted = true;
    }
    if ((e = fx__mq_hold(c, false, m->ttl_s, m->member_lease, granted || fresh, cb, arg,
                         &m->h_member)))
        goto fail;
    return FX_OK;
fail:
    mgr_release(m);
    return e;
}

/* ---- create ----------------------------------------------------------------------------------- */

fx_err fx__mpsc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, const fx__mpsc_parent *parent,
                       int64_t *out_chan)
{
    if (!c || !cfg || !out_chan) return fx_seterr(FX_EINVAL, "mpsc create: NULL argument");
    fx_err e = fx__mq_cfg_validate(c, cfg);
    if (e) return e;
    if (parent && (parent->global_lease <= 0 || parent->payload_lease <= 0 || parent->mpmc < 0))
        return fx_seterr(FX_EINVAL, "mpsc create: parent overrides need global and payload leases");
    if ((e = fx__mq_new_op_enter(c))) return e;
    fx_lease *hg = NULL, *hl = NULL, *hp = NULL;
    char *js = NULL;
    int64_t chan = 0, gl = 0, gll = 0, pl = 0;
    bool g_new = false, l_new = false, p_new = false;
    fx_mq_key k;
    int64_t ttl = parent && parent->data_ttl_s > 0 ? parent->data_ttl_s : cfg->ttl_s;
    int64_t long_ttl = parent && parent->long_ttl_s > 0 ? parent->long_ttl_s : c->long_ttl_s;

    if ((e = key_err(fx_mq_key_alloc_chan_ids(&c->keys, &k), "chan counter"))) goto out;
    if ((e = fx__mq_alloc_ids(c, &k, 0, 1, &chan))) goto out;
    if (parent) {
        gl = parent->global_lease;
    } else {
        if ((e = key_err(fx_mq_key_cluster_lease_chan(&c->keys, chan, &k), "cluster lease")))
            goto out;
        if ((e = fx__mq_cluster_lease(c, &k, cfg->ttl_s, &gl, &g_new))) goto out;
    }
    if ((e = key_err(fx_mq_key_cluster_lease_id_alloc(&c->keys, chan, &k), "cluster lease")))
        goto out;
    if ((e = fx__mq_cluster_lease(c, &k, long_ttl, &gll, &l_new))) goto out;
    if (parent) {
        pl = parent->payload_lease;
    } else {
        if ((e = fx_kv_allocate_lease(c->kv, cfg->ttl_s, &pl, c->op_timeout_ms))) goto out;
        p_new = true;
    }
    if ((e = fx__mq_hold(c, false, ttl, gl, g_new, NULL, NULL, &hg))) goto out;
    if ((e = fx__mq_hold(c, false, long_ttl, gll, l_new, NULL, NULL, &hl))) goto out;
    if ((e = fx__mq_hold(c, true, ttl, pl, p_new, NULL, NULL, &hp))) goto out;

    fx_mq_chan_meta meta = {.capacity = cfg->capacity, .ttl_seconds = cfg->ttl_s,
                            .global_lease_id = gl, .global_long_lease_id = gll,
                            .payload_lease_id = pl, .segments = c->segments};
    if ((e = fx_mq_chan_meta_encode(&meta, &js))) goto out;
    if ((e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &k), "meta"))) goto out;
    fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = fx_mq_key_slice(&k)};
    fx_op put = {.type = FX_OP_PUT,
                 .u.put = {.key = fx_mq_key_slice(&k), .value = FX_SLICE_STR(js), .lease = gl}};
    fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
    fx_txn_resp resp = {0};
    e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
    if (e == FX_OK && !resp.succeeded)
        e = fx_seterr(FX_EEXISTS, "mpsc create: meta of channel %lld already exists",
                      (long long)chan);
    fx_txn_resp_free(&resp);
    if (e == FX_OK) {
        *out_chan = chan;
        FX_DBG("mpsc channel %lld created (global %lld, long %lld, payload %lld)",
               (long long)chan, (long long)gl, (long long)gll, (long long)pl);
    }
out:
    free(js);
    fx_lease_release(hp);
    fx_lease_release(hl);
    fx_lease_release(hg);
    fx__mq_op_leave(c);
    return e;
}

#define SUB_CHAN_ID_BLOCK 16

/* A sub-MPSC channel id: from this client's block, a new block of SUB_CHAN_ID_BLOCK ids from the
 * shared counter when it is used up (ids stay unique; a client that exits leaves a gap). */
static fx_err sub_chan_id(fx_mq_client *c, int64_t *out)
{
    pthread_mutex_lock(&c->ids_mu);
    fx_err e = FX_OK;
    if (c->chan_next >= c->chan_end) {
        fx_mq_key k;
        int64_t first = 0;
        e = key_err(fx_mq_key_alloc_chan_ids(&c->keys, &k), "chan counter");
        if (!e) e = fx__mq_alloc_ids(c, &k, 0, SUB_CHAN_ID_BLOCK, &first);
        if (!e) {
            c->chan_next = first;
            c->chan_end = first + SUB_CHAN_ID_BLOCK;
        }
    }
    if (!e) *out = c->chan_next++;
    pthread_mutex_unlock(&c->ids_mu);
    return e;
}

/* The sub-MPSC creation in two round trips (issue 13; fx__mpsc_create took about eight): a
 * channel id from the client's block, a grant of the new global-long lease, then ONE txn that
 * creates the id-allocator cluster-lease key and the meta (both create==0). The global and
 * payload leases are the parent's, held by the parent member: no registration here. On an error
 * after the txn was sent *out_chan is set: the txn may have landed and the caller rolls the
 * channel's keys back (rollback_unpublished); otherwise *out_chan is -1. */
fx_err fx__mpsc_create_sub(fx_mq_client *c, const fx_mq_chan_cfg *cfg,
                           const fx__mpsc_parent *parent, int64_t *out_chan,
                           fx_mq_chan_meta *out_meta)
{
    if (!c || !cfg || !out_chan || !out_meta || !parent)
        return fx_seterr(FX_EINVAL, "mpsc create: NULL argument");
    *out_chan = -1;
    fx_err e = fx__mq_cfg_validate(c, cfg);
    if (e) return e;
    if (parent->global_lease <= 0 || parent->payload_lease <= 0 || parent->mpmc < 0)
        return fx_seterr(FX_EINVAL, "mpsc create: parent overrides need global and payload leases");
    if ((e = fx__mq_new_op_enter(c))) return e;
    int64_t chan = -1, gll = 0;
    int64_t long_ttl = parent->long_ttl_s > 0 ? parent->long_ttl_s : c->long_ttl_s;
    char *js = NULL;
    fx_mq_key lk, mk;
    if ((e = sub_chan_id(c, &chan))) goto out;
    if ((e = key_err(fx_mq_key_cluster_lease_id_alloc(&c->keys, chan, &lk), "cluster lease")))
        goto out;
    if ((e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &mk), "meta"))) goto out;
    if ((e = fx__mq_grant(c, long_ttl, &gll))) goto out;
    fx_mq_chan_meta meta = {.capacity = cfg->capacity, .ttl_seconds = cfg->ttl_s,
                            .global_lease_id = parent->global_lease, .global_long_lease_id = gll,
                            .payload_lease_id = parent->payload_lease, .segments = c->segments};
    if ((e = fx_mq_chan_meta_encode(&meta, &js))) goto out;
    char lv[FX_MQ_DEC_BUF];
    size_t lvl = fx_mq_dec_format(gll, lv);
    fx_cmp cmp[2] = {
        {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = fx_mq_key_slice(&lk)},
        {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = fx_mq_key_slice(&mk)}};
    fx_op put[2] = {
        {.type = FX_OP_PUT, .u.put = {.key = fx_mq_key_slice(&lk), .value = {lv, lvl},
                                      .lease = gll}},
        {.type = FX_OP_PUT, .u.put = {.key = fx_mq_key_slice(&mk), .value = FX_SLICE_STR(js),
                                      .lease = parent->global_lease}}};
    fx_txn_req tx = {.cmp = cmp, .n_cmp = 2, .success = put, .n_success = 2};
    fx_txn_resp resp = {0};
    e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
    if (e) {
        *out_chan = chan; /* maybe landed: the caller rolls back */
    } else if (!resp.succeeded) {
        e = fx_seterr(FX_EEXISTS, "mpsc create: keys of channel %lld already exist",
                      (long long)chan);
    }
    fx_txn_resp_free(&resp);
    if (e == FX_OK) {
        *out_chan = chan;
        *out_meta = meta;
        FX_DBG("sub-mpsc channel %lld created (global %lld, long %lld, payload %lld)",
               (long long)chan, (long long)meta.global_lease_id, (long long)gll,
               (long long)meta.payload_lease_id);
    } else if (gll && *out_chan < 0) {
        fx_err re = fx_etcd_lease_revoke(c->etcd, gll, c->op_timeout_ms);
        if (re && re != FX_ENOTFOUND)
            FX_DBG("sub-mpsc create: revoke of unused lease %lld: %s", (long long)gll,
                   fx_errname(re));
    }
out:
    free(js);
    fx__mq_op_leave(c);
    return e;
}

fx_err fx_mpsc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, int64_t *out_chan)
{
    return fx__mpsc_create(c, cfg, NULL, out_chan);
}

/* Membership txn: create(key)==0 -> put key (member lease) [+ put weight key (global lease)].
 * Retry-safe: when the key exists with our value and our lease, a previous attempt landed.
 * excl (may be NULL): a prefix that must hold no key but ours (the consumer memberships of the
 * channel: an MPSC never has two live consumers, the reference's "invalid binding state" that
 * fails every producer put); the compare covers the whole prefix, so two binders racing cannot
 * both win. */
static fx_err member_txn(fx_mq_client *c, fx_slice key, fx_slice val, int64_t lease,
                         const fx_slice *wkey, fx_slice wval, int64_t wlease, const fx_slice *excl)
{
    fx_err e = FX_OK;
    uint8_t xend[FX_MQ_KEY_CAP];
    fx_slice xe = {NULL, 0};
    if (excl) xe = (fx_slice){xend, fx_prefix_end(*excl, xend)};
    for (int attempt = 0; attempt < MEMBER_TXN_ATTEMPTS; attempt++) {
        fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL,
                      .key = excl ? *excl : key, .range_end = xe};
        fx_op ok[2] = {
            {.type = FX_OP_PUT, .u.put = {.key = key, .value = val, .lease = lease}},
            {.type = FX_OP_PUT, .u.put = {.key = wkey ? *wkey : key, .value = wval,
                                          .lease = wlease}},
        };
        fx_op get = {.type = FX_OP_RANGE, .u.range = {.key = excl ? *excl : key, .range_end = xe}};
        fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = ok, .n_success = wkey ? 2 : 1,
                         .failure = &get, .n_failure = 1};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
        if (e == FX_OK) {
            if (!resp.succeeded) {
                const fx_range_resp *r = resp.n_responses == 1 ? &resp.responses[0].u.range : NULL;
                const fx_kv *other = NULL;
                for (size_t i = 0; r && i < r->n_kvs && !other; i++) {
                    const fx_kv *kv = &r->kvs[i];
                    bool ours = kv->key.len == key.len &&
                                memcmp(kv->key.data, key.data, key.len) == 0 &&
                                kv->lease == lease && kv->value.len == val.len &&
                                memcmp(kv->value.data, val.data, val.len) == 0;
                    if (!ours) other = kv;
                }
                if (r && r->n_kvs >= 1 && !other) {
                    e = FX_OK; /* our earlier attempt landed */
                } else if (excl && other) {
                    e = fx_seterr(FX_EEXISTS, "channel already has a consumer (membership %.*s): "
                                  "an MPSC takes one consumer at a time",
                                  (int)other->key.len, (const char *)other->key.data);
                } else {
                    e = fx_seterr(FX_EEXISTS, "membership key %.*s is held by another member",
                                  (int)key.len, (const char *)key.data);
                }
            }
            fx_txn_resp_free(&resp);
            return e;
        }
        fx_txn_resp_free(&resp);
        if (!transient(e)) return e;
        fx_sleep_ms(RETRY_MIN_MS); /* bounded: MEMBER_TXN_ATTEMPTS x op deadline */
    }
    return e;
}

/* ======================================================================================== *
 * Producer                                                                                 *
 * ======================================================================================== */

struct fx_mpsc_producer {
    fx__mq_endpoint ep;
    fx_mq_client *c;
    chan_mgr m;
    int64_t pidx, weight, capacity;
    fx_mq_key k_member, k_weight, k_offset, k_prefix;
    bool member_written;

    pthread_mutex_t put_mu; /* serialises puts; guards next, offset_unknown */
    int64_t next;           /* next message id to write */
    int64_t budget;         /* messages we may still write before counting again (capacity) */
    bool offset_unknown;    /* re-read the produce offset before choosing ids */

    pthread_mutex_t mu; /* guards lf */
    pthread_cond_t cv;  /* capacity waits, retry naps, close progress */
    life lf;
    stats st;
};

static void prod_on_expired(void *arg, fx_lease *h, int64_t id)
{
    (void)h;
    fx_mpsc_producer *p = arg;
    pthread_mutex_lock(&p->mu);
    if (life_lease_lost(&p->lf))
        FX_WRN("mpsc producer %lld/%lld: lease %lld expired; closing the producer",
               (long long)p->m.chan, (long long)p->pidx, (long long)id);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Called with p->mu held: FX_OK to proceed, FX_ELEASE_LOST (once; *self_close) or FX_ECLOSED. */
static fx_err prod_gate_locked(fx_mpsc_producer *p, bool *self_close)
{
    return life_gate(&p->lf, "producer", p->m.chan, p->pidx, self_close);
}

static fx_err prod_gate(fx_mpsc_producer *p, bool *self_close)
{
    pthread_mutex_lock(&p->mu);
    fx_err e = prod_gate_locked(p, self_close);
    pthread_mutex_unlock(&p->mu);
    return e;
}

/* Mark a lease loss found by the write path (reported by this call). */
static fx_err prod_fault_now(fx_mpsc_producer *p, const char *why)
{
    pthread_mutex_lock(&p->mu);
    if (!p->lf.fault) p->lf.fault = FX_ELEASE_LOST;
    p->lf.fault_reported = true;
    p->lf.stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    FX_WRN("mpsc producer %lld/%lld: %s; closing the producer", (long long)p->m.chan,
           (long long)p->pidx, why);
    return fx_seterr(FX_ELEASE_LOST, "mpsc producer %lld/%lld: %s", (long long)p->m.chan,
                     (long long)p->pidx, why);
}

static bool prod_stopping(fx_mpsc_producer *p)
{
    pthread_mutex_lock(&p->mu);
    bool s = p->lf.stop;
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Read the produce offset (-1 when absent). */
static fx_err read_offset(fx_mq_client *c, const fx_mq_key *k, int64_t *out)
{
    fx_kv kv = {0};
    fx_err e = fx_etcd_get(c->etcd, fx_mq_key_slice(k), &kv, c->op_timeout_ms);
    if (e == FX_ENOTFOUND) {
        *out = FX_MQ_PRODUCE_OFFSET_BEGIN;
        return FX_OK;
    }
    if (e == FX_OK) e = fx_mq_produce_offset_decode(kv.value.data, kv.value.len, out);
    fx_kv_free(&kv);
    return e;
}

typedef struct off_ent {
    int64_t pidx, off;
} off_ent;

static int off_cmp(const void *a, const void *b)
{
    const off_ent *x = a, *y = b;
    return (x->pidx > y->pidx) - (x->pidx < y->pidx);
}

/* Stored, unconsumed messages of channel `chan` from its offsets: sum over producers of
 * produce - consume + 1 (DESIGN §4.2), and the number of producers with a produce offset.
 * One etcd request (a txn of two range reads, so both are read at one revision). */
static fx_err stored_count(fx_mq_client *c, int64_t chan, int64_t *stored, int64_t *producers)
{
    fx_mq_key pp, cp;
    fx_err e;
    if ((e = key_err(fx_mq_prefix_produce_offsets(&c->keys, chan, &pp), "prefix")) ||
        (e = key_err(fx_mq_prefix_consume_offsets(&c->keys, chan, &cp), "prefix")))
        return e;
    uint8_t pe[FX_MQ_KEY_CAP], ce[FX_MQ_KEY_CAP];
    fx_slice ps = fx_mq_key_slice(&pp), cs = fx_mq_key_slice(&cp);
    fx_op ops[2] = {
        {.type = FX_OP_RANGE, .u.range = {.key = ps, .range_end = {pe, fx_prefix_end(ps, pe)}}},
        {.type = FX_OP_RANGE, .u.range = {.key = cs, .range_end = {ce, fx_prefix_end(cs, ce)}}},
    };
    fx_txn_req tx = {.success = ops, .n_success = 2};
    fx_txn_resp r = {0};
    if ((e = fx_etcd_txn(c->etcd, &tx, &r, c->op_timeout_ms))) return e;
    if (!r.succeeded || r.n_responses != 2 || r.responses[0].type != FX_OP_RANGE ||
        r.responses[1].type != FX_OP_RANGE) {
        fx_txn_resp_free(&r);
        return fx_seterr(FX_EPROTO, "mpsc capacity: unexpected txn response");
    }
    const fx_range_resp *pr = &r.responses[0].u.range, *cr = &r.responses[1].u.range;
    off_ent *cons = cr->n_kvs ? malloc(cr->n_kvs * sizeof *cons) : NULL;
    if (cr->n_kvs && !cons) {
        fx_txn_resp_free(&r);
        return fx_seterr(FX_ENOMEM, "mpsc capacity: out of memory");
    }
    size_t nc = 0;
    for (size_t i = 0; i < cr->n_kvs; i++) { /* foreign or malformed entries are ignored */
        const fx_kv *kv = &cr->kvs[i];
        int64_t ch, pidx, off;
        if (fx_mq_parse_consume_offset_key(&c->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) == FX_OK &&
            ch == chan && fx_mq_consume_offset_decode(kv->value.data, kv->value.len, &off) == FX_OK)
            cons[nc++] = (off_ent){pidx, off};
    }
    if (nc > 1) qsort(cons, nc, sizeof *cons, off_cmp);
    int64_t sum = 0, np = 0;
    for (size_t i = 0; i < pr->n_kvs; i++) {
        const fx_kv *kv = &pr->kvs[i];
        int64_t ch, pidx, prod;
        if (fx_mq_parse_produce_offset_key(&c->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) != FX_OK ||
            ch != chan || fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &prod))
            continue;
        off_ent k = {pidx, 0};
        const off_ent *f = nc ? bsearch(&k, cons, nc, sizeof *cons, off_cmp) : NULL;
        int64_t cons_off = f ? f->off : FX_MQ_CONSUME_OFFSET_BEGIN;
        if (prod >= cons_off) sum += prod - cons_off + 1;
        np++;
    }
    free(cons);
    fx_txn_resp_free(&r);
    *stored = sum;
    *producers = np;
    return FX_OK;
}

/* One chunk write: ids [p->next, p->next + m). Retries transient failures with the same ids
 * until wdeadline. Called with put_mu held. */
static fx_err write_chunk(fx_mpsc_producer *p, const fx_slice *vals, size_t m, int64_t wdeadline)
{
    fx_mq_client *c = p->c;
    int64_t first = p->next, last = first + (int64_t)m - 1;
    fx_err e = FX_OK;
    bool seg = p->m.meta.segments;
    size_t nkeys = seg ? 1 : m; /* payload keys written by this chunk */
    uint8_t *segbuf = NULL;
    fx_slice segval = {0};
    fx_mq_key *rel = malloc(nkeys * sizeof *rel);
    char *fk = c->kv_shared ? malloc(nkeys * FULLKEY_CAP) : NULL;
    size_t nops = c->kv_shared ? nkeys + 1 : 1;
    fx_op *ops = calloc(nops, sizeof *ops);
    fx_kv_item *items = c->kv_shared ? NULL : calloc(nkeys, sizeof *items);
    if (!rel || !ops || (c->kv_shared ? !fk : !items)) {
        e = fx_seterr(FX_ENOMEM, "mpsc put: out of memory");
        goto out;
    }
    if (seg) { /* one value: the batch back to back, under the key of its last id */
        size_t sz = fx_seg_size(vals, m);
        if (!(segbuf = malloc(sz))) {
            e = fx_seterr(FX_ENOMEM, "mpsc put: out of memory");
            goto out;
        }
        segval = (fx_slice){segbuf, fx_seg_encode(vals, m, segbuf, sz)};
        if (!segval.len) {
            e = fx_seterr(FX_EINVAL, "mpsc put: batch of %zu values cannot form a segment", m);
            goto out;
        }
    }
    for (size_t i = 0; i < nkeys; i++) {
        int64_t id = seg ? last : first + (int64_t)i;
        fx_slice v = seg ? segval : vals[i];
        if ((e = key_err(pay_key(&p->m, p->pidx, id, &rel[i]), "payload"))) goto out;
        if (c->kv_shared) {
            fx_slice full;
            if ((e = full_key(c, &rel[i], fk + i * FULLKEY_CAP, FULLKEY_CAP, &full))) goto out;
            ops[i] = (fx_op){.type = FX_OP_PUT,
                             .u.put = {.key = full, .value = v,
                                       .lease = p->m.meta.payload_lease_id}};
        } else {
            items[i] = (fx_kv_item){fx_mq_key_slice(&rel[i]), v};
        }
    }
    char lastv[FX_MQ_DEC_BUF], prevv[FX_MQ_DEC_BUF];
    size_t lastl = fx_mq_dec_format(last, lastv), prevl = fx_mq_dec_format(first - 1, prevv);
    ops[nops - 1] = (fx_op){.type = FX_OP_PUT,
                            .u.put = {.key = fx_mq_key_slice(&p->k_offset),
                                      .value = {lastv, lastl},
                                      .lease = p->m.meta.global_lease_id}};
    fx_cmp cmps[2] = {
        first == 0 ? (fx_cmp){.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL,
                              .key = fx_mq_key_slice(&p->k_offset), .num = 0}
                   : (fx_cmp){.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL,
                              .key = fx_mq_key_slice(&p->k_offset), .value = {prevv, prevl}},
        {.target = FX_CMP_CREATE, .result = FX_CMP_GREATER, .key = fx_mq_key_slice(&p->k_member),
         .num = 0},
    };
    fx_op fail[2] = {
        {.type = FX_OP_RANGE, .u.range = {.key = fx_mq_key_slice(&p->k_offset)}},
        {.type = FX_OP_RANGE, .u.range = {.key = fx_mq_key_slice(&p->k_member)}},
    };
    fx_kv_put_opts po = {.lease_id = p->m.meta.payload_lease_id};
    int64_t backoff = RETRY_MIN_MS;
    bool payload_written = false;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            p->st.put_retries++;
            if (fx_now_ms() + backoff >= wdeadline) {
                p->offset_unknown = true; /* the last attempt's fate is unknown */
                goto out;                 /* e: the last failure */
            }
            nap(&p->mu, &p->cv, &p->lf.stop, backoff);
            backoff = min64(backoff * 2, RETRY_MAX_MS);
            if (prod_stopping(p)) {
                p->offset_unknown = true;
                e = fx_seterr(FX_ECLOSED, "mpsc producer closed during a put retry");
                goto out;
            }
        }
        if (!c->kv_shared) {
            e = fx_kv_put_many(c->kv, items, nkeys, &po, c->kv_timeout_ms);
            if (e == FX_ELEASE_EXPIRED) {
                e = prod_fault_now(p, "payload lease expired");
                goto out;
            }
            if (e) {
                if (transient(e)) continue;
                goto out;
            }
            payload_written = true;
        }
        fx_txn_req tx = {.cmp = cmps, .n_cmp = 2, .success = ops, .n_success = nops,
                         .failure = fail, .n_failure = 2};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
        if (e == FX_OK && resp.succeeded) {
            fx_txn_resp_free(&resp);
            p->next = last + 1;
            p->st.put_txns++;
            goto out;
        }
        if (e == FX_ELEASE_EXPIRED) {
            fx_txn_resp_free(&resp);
            e = prod_fault_now(p, c->kv_shared ? "payload or global lease expired"
                                               : "global lease expired");
            goto out;
        }
        if (e) {
            fx_txn_resp_free(&resp);
            if (transient(e)) continue; /* ambiguous: the compare makes the retry safe */
            goto out;
        }
        /* A compare failed: learn why from the failure branch. */
        bool have = resp.n_responses == 2 && resp.responses[0].type == FX_OP_RANGE &&
                    resp.responses[1].type == FX_OP_RANGE;
        bool member = have && resp.responses[1].u.range.n_kvs > 0;
        int64_t cur = FX_MQ_PRODUCE_OFFSET_BEGIN;
        fx_err de = FX_OK;
        if (have && resp.responses[0].u.range.n_kvs > 0) {
            const fx_kv *kv = &resp.responses[0].u.range.kvs[0];
            de = fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &cur);
        }
        fx_txn_resp_free(&resp);
        if (!have || de) {
            p->offset_unknown = true;
            e = have ? de : fx_seterr(FX_EPROTO, "mpsc put: txn failure without reads");
            goto out;
        }
        if (cur == last) { /* an earlier ambiguous attempt of this chunk landed */
            p->next = last + 1;
            p->st.put_txns++;
            e = FX_OK;
            goto out;
        }
        if (!member) {
            if (payload_written) { /* orphans above the offset: remove them (best effort) */
                fx_mq_key s, en;
                if (!pay_key(&p->m, p->pidx, first, &s) && !pay_key(&p->m, p->pidx, last + 1, &en))
                    fx_kv_delete_range(c->kv, fx_mq_key_slice(&s), fx_mq_key_slice(&en), NULL,
                                       c->close_timeout_ms);
            }
            e = prod_fault_now(p, "membership key gone (member lease lost)");
            goto out;
        }
        p->offset_unknown = true;
        e = fx_seterr(FX_EPROTO,
                      "mpsc producer %lld/%lld: produce offset is %lld, expected %lld (another "
                      "writer?)",
                      (long long)p->m.chan, (long long)p->pidx, (long long)cur,
                      (long long)(first - 1));
        goto out;
    }
out:
    free(segbuf);
    free(items);
    free(ops);
    free(fk);
    free(rel);
    return e;
}

/* Chunk size starting at vals[0], >= 1. One key per message: <= CHUNK_MSGS values and
 * <= CHUNK_BYTES counting 128 bytes of key/JSON per value. Segment: <= FX_SEG_MAX_MSGS values and
 * an encoded segment of <= CHUNK_BYTES. */
static size_t chunk_len(const fx_slice *vals, size_t max, bool seg)
{
    size_t per = seg ? FX_SEG_PER_MSG : 128, bytes = seg ? FX_SEG_HDR : 0, i = 0;
    size_t lim = seg ? FX_SEG_MAX_MSGS : CHUNK_MSGS;
    if (max < lim) lim = max;
    for (; i < lim; i++) {
        if (i > 0 && bytes + vals[i].len + per > CHUNK_BYTES) break;
        bytes += vals[i].len + per;
    }
    return i ? i : 1;
}

static fx_err prod_close_impl(fx_mpsc_producer *p);

static fx_err put_impl(fx_mpsc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                       bool wait, size_t *n_put, fx_mq_msg_id *ids)
{
    if (n_put) *n_put = 0;
    if (!p || (n && !values)) return fx_seterr(FX_EINVAL, "mpsc put: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!values[i].data && values[i].len)
            return fx_seterr(FX_EINVAL, "mpsc put: value %zu: NULL data", i);
    bool self_close = false;
    fx_err e = prod_gate(p, &self_close);
    if (e) {
        if (self_close) prod_close_impl(p);
        return e;
    }
    if (n == 0) return FX_OK;
    fx_mq_client *c = p->c;
    if ((e = fx__mq_op_enter(c))) return e;
    p->st.put_calls++;
    pthread_mutex_lock(&p->put_mu);
    int64_t start = fx_now_ms();
    int64_t deadline = start + (wait && timeout_ms > 0 ? timeout_ms : 0);
    int64_t wdeadline = start + (timeout_ms > c->op_timeout_ms ? timeout_ms : c->op_timeout_ms);
    size_t done = 0;
    int64_t backoff = RETRY_MIN_MS;
    bool waited = false;
    while (done < n) {
        pthread_mutex_lock(&p->mu);
        e = prod_gate_locked(p, &self_close);
        pthread_mutex_unlock(&p->mu);
        if (e) break;
        if (p->offset_unknown) {
            int64_t cur;
            p->st.offset_rereads++;
            e = read_offset(c, &p->k_offset, &cur);
            if (e) {
                if (transient(e) && fx_now_ms() + backoff < wdeadline) {
                    nap(&p->mu, &p->cv, &p->lf.stop, backoff);
                    backoff = min64(backoff * 2, RETRY_MAX_MS);
                    continue;
                }
                break;
            }
            if (cur + 1 != p->next)
                FX_INF("mpsc producer %lld/%lld: produce offset re-read: next id %lld -> %lld",
                       (long long)p->m.chan, (long long)p->pidx, (long long)p->next,
                       (long long)(cur + 1));
            p->next = cur + 1;
            p->offset_unknown = false;
        }
        int64_t rest = (int64_t)(n - done);
        if (p->budget < rest) { /* spent our share of the room: count again */
            int64_t count = 0, np = 0;
            p->st.cap_checks++;
            e = stored_count(c, p->m.chan, &count, &np);
            if (e) {
                p->budget = 0;
                if (transient(e) && fx_now_ms() + backoff < wdeadline) {
                    nap(&p->mu, &p->cv, &p->lf.stop, backoff);
                    backoff = min64(backoff * 2, RETRY_MAX_MS);
                    continue;
                }
                break;
            }
            int64_t room = p->capacity - count;
            if (np < 1) np = 1;
            /* Each of the np producers may use 1/np of the room before counting again, so the
             * sum stays within capacity (plus at most np when room < np). */
            p->budget = room <= 0 ? 0 : room >= np ? room / np : 1;
            if (room <= 0) {
                if (!waited) p->st.full_waits++;
                waited = true;
                int64_t left = fx_ms_left(deadline);
                if (left <= 0) {
                    e = fx_seterr(FX_EFULL, "mpsc channel %lld full (%lld stored, capacity %lld)",
                                  (long long)p->m.chan, (long long)count,
                                  (long long)p->capacity);
                    break;
                }
                nap(&p->mu, &p->cv, &p->lf.stop, min64(left, CAP_POLL_MS));
                continue;
            }
        }
        int64_t room = p->budget;
        size_t k = (size_t)min64(room, (int64_t)(n - done));
        while (k > 0) {
            size_t m = chunk_len(values + done, k, p->m.meta.segments);
            int64_t first = p->next;
            e = write_chunk(p, values + done, m, wdeadline);
            if (e) break;
            if (ids)
                for (size_t i = 0; i < m; i++)
                    ids[done + i] = (fx_mq_msg_id){p->m.chan, p->pidx, first + (int64_t)i};
            done += m;
            k -= m;
            p->budget -= (int64_t)m;
            p->st.put_msgs += m;
        }
        if (e) break;
        backoff = RETRY_MIN_MS;
    }
    pthread_mutex_unlock(&p->put_mu);
    fx__mq_op_leave(c);
    if (e == FX_EFULL) p->st.full_errors++;
    if (e == FX_ELEASE_LOST) self_close = true;
    if (self_close) {
        char d[512];
        snprintf(d, sizeof d, "%s", fx_err_detail());
        prod_close_impl(p);
        fx_seterr(e, "%s", d);
    }
    if (n_put) *n_put = done;
    return e;
}

fx_err fx_mpsc_put(fx_mpsc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                   size_t *n_put, fx_mq_msg_id *ids)
{
    return put_impl(p, values, n, timeout_ms, true, n_put, ids);
}

fx_err fx__mpsc_try_put(fx_mpsc_producer *p, const fx_slice *values, size_t n, size_t *n_put,
                        fx_mq_msg_id *ids)
{
    return put_impl(p, values, n, 0, false, n_put, ids);
}

fx_err fx__mpsc_backlog(fx_mpsc_producer *p, int64_t *out)
{
    if (!p || !out) return fx_seterr(FX_EINVAL, "mpsc backlog: NULL argument");
    bool sc = false;
    fx_err e = prod_gate(p, &sc);
    if (e) {
        if (sc) prod_close_impl(p);
        return e;
    }
    if ((e = fx__mq_op_enter(p->c))) return e;
    int64_t np;
    e = stored_count(p->c, p->m.chan, out, &np);
    fx__mq_op_leave(p->c);
    return e;
}

/* ---- producer open / close -------------------------------------------------------------------- */

static fx_err prod_close_cb(void *self) { return fx_mpsc_producer_close(self); }

static void prod_destroy(fx_mpsc_producer *p)
{
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->put_mu);
    free(p);
}

/* Close work (the first closer): best-effort delete of membership + weight (one pass),
 * release handles, unregister. */
static fx_err prod_close_impl(fx_mpsc_producer *p)
{
    pthread_mutex_lock(&p->mu);
    p->lf.stop = true;
    pthread_cond_broadcast(&p->cv);
    while (p->lf.constructing) pthread_cond_wait(&p->cv, &p->mu);
    if (p->lf.state >= ST_DONE) {
        fx_err r = p->lf.result;
        pthread_mutex_unlock(&p->mu);
        return r;
    }
    if (p->lf.state == ST_RUNNING) {
        p->lf.waiters++;
        while (p->lf.state < ST_DONE) pthread_cond_wait(&p->cv, &p->mu);
        fx_err r = p->lf.result;
        if (--p->lf.waiters == 0) pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        return r;
    }
    p->lf.state = ST_RUNNING;
    pthread_mutex_unlock(&p->mu);

    fx_mq_client *c = p->c;
    if (p->member_written && fx__mq_op_enter(c) == FX_OK) {
        fx_op del[2] = {
            {.type = FX_OP_DELETE, .u.del = {.key = fx_mq_key_slice(&p->k_member)}},
            {.type = FX_OP_DELETE, .u.del = {.key = fx_mq_key_slice(&p->k_weight)}},
        };
        fx_txn_req tx = {.success = del, .n_success = 2};
        fx_err e = fx_etcd_txn(c->etcd, &tx, NULL, c->close_timeout_ms);
        if (e)
            FX_WRN("mpsc producer %lld/%lld close: deleting membership and weight failed: %s "
                   "(%s); the lease TTL removes them",
                   (long long)p->m.chan, (long long)p->pidx, fx_errname(e), fx_err_detail());
        fx__mq_op_leave(c);
    }
    mgr_release(&p->m);
    life_finish(&p->lf, &p->mu, &p->cv, c, &p->ep, !p->m.sub);
    return FX_OK;
}

fx_err fx_mpsc_producer_close(fx_mpsc_producer *p)
{
    if (!p) return fx_seterr(FX_EINVAL, "mpsc producer close: NULL");
    return prod_close_impl(p);
}

void fx_mpsc_producer_free(fx_mpsc_producer *p)
{
    if (!p) return;
    prod_close_impl(p);
    life_wait_finished(&p->lf, &p->mu, &p->cv);
    prod_destroy(p);
}

int64_t fx_mpsc_producer_idx(const fx_mpsc_producer *p) { return p ? p->pidx : -1; }
int64_t fx__mpsc_producer_chan(const fx_mpsc_producer *p) { return p ? p->m.chan : -1; }

fx_err fx__mpsc_producer_fault(const fx_mpsc_producer *p)
{
    if (!p) return FX_OK;
    fx_mpsc_producer *q = (fx_mpsc_producer *)p;
    pthread_mutex_lock(&q->mu);
    fx_err f = q->lf.fault;
    pthread_mutex_unlock(&q->mu);
    return f;
}

void fx__mpsc_producer_stats(const fx_mpsc_producer *p, fx__mpsc_stats *out)
{
    if (p && out) stats_copy(&p->st, out);
}

static bool prod_abort_requested(fx_mpsc_producer *p)
{
    pthread_mutex_lock(&p->mu);
    bool s = p->lf.stop;
    pthread_mutex_unlock(&p->mu);
    return s;
}

static fx_err prod_build(fx_mpsc_producer *p, int64_t chan, const fx__mpsc_parent *parent)
{
    fx_mq_client *c = p->c;
    fx_err e = mgr_open(c, chan, parent, prod_on_expired, p, &p->m);
    if (e) return e;
    p->capacity = p->m.meta.capacity;
    if (prod_abort_requested(p)) return fx_seterr(FX_ECLOSED, "mpsc producer closed while opening");
    if (parent) {
        p->pidx = parent->member;
    } else {
        fx_mq_key k;
        if ((e = key_err(fx_mq_key_alloc_producer_idx(&c->keys, chan, &k), "producer counter")))
            return e;
        if ((e = fx__mq_alloc_ids(c, &k, p->m.meta.global_long_lease_id, 1, &p->pidx))) return e;
    }
    if ((e = key_err(fx_mq_key_producer_member(&c->keys, chan, p->pidx, &p->k_member), "member")) ||
        (e = key_err(fx_mq_key_producer_weight(&c->keys, chan, p->pidx, &p->k_weight), "weight")) ||
        (e = key_err(fx_mq_key_produce_offset(&c->keys, chan, p->pidx, &p->k_offset), "offset")) ||
        (e = key_err(pay_prefix(&p->m, &p->k_prefix), "payload prefix")))
        return e;
    if (prod_abort_requested(p)) return fx_seterr(FX_ECLOSED, "mpsc producer closed while opening");
    fx_mq_producer_meta pm = {.producer_idx = p->pidx, .has_external_client_id = true};
    snprintf(pm.external_client_id, sizeof pm.external_client_id, "%s", c->client_id);
    char *js = NULL;
    if ((e = fx_mq_producer_meta_encode(&pm, &js))) return e;
    char wv[FX_MQ_DEC_BUF];
    size_t wl = fx_mq_dec_format(p->weight, wv);
    fx_slice wk = fx_mq_key_slice(&p->k_weight);
    e = member_txn(c, fx_mq_key_slice(&p->k_member), FX_SLICE_STR(js), p->m.member_lease, &wk,
                   (fx_slice){wv, wl}, p->m.meta.global_lease_id, NULL);
    free(js);
    if (e) return e;
    p->member_written = true;
    int64_t cur;
    if ((e = read_offset(c, &p->k_offset, &cur))) return e;
    p->next = cur + 1;
    return FX_OK;
}

static fx_err prod_open(fx_mq_client *c, int64_t chan, int64_t weight,
                        const fx__mpsc_parent *parent, fx_mpsc_producer **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mpsc producer open: NULL out");
    *out = NULL;
    if (!c || chan < 0 || weight < 0)
        return fx_seterr(FX_EINVAL, "mpsc producer open: bad arguments");
    if (parent && (parent->member < 0 || parent->member_lease <= 0))
        return fx_seterr(FX_EINVAL, "mpsc producer open: parent member and member lease required");
    fx_mpsc_producer *p = calloc(1, sizeof *p);
    if (!p) return fx_seterr(FX_ENOMEM, "mpsc producer open: out of memory");
    p->c = c;
    p->weight = weight ? weight : 1;
    p->pidx = -1;
    p->m.chan = chan;
    p->m.sub = parent != NULL;
    p->lf.constructing = true;
    if (pthread_mutex_init(&p->mu, NULL) || pthread_mutex_init(&p->put_mu, NULL) ||
        fx_cond_init_monotonic(&p->cv)) {
        free(p); /* (a failed init leaves nothing to destroy on Linux) */
        return fx_seterr(FX_ENOMEM, "mpsc producer open: sync init failed");
    }
    fx_err e;
    if (!parent) {
        p->ep.close = prod_close_cb;
        p->ep.self = p;
        if ((e = fx__mq_register(c, &p->ep))) {
            prod_destroy(p);
            return e;
        }
    }
    if ((e = fx__mq_op_enter(c)) == FX_OK) {
        e = prod_build(p, chan, parent);
        fx__mq_op_leave(c);
    }
    pthread_mutex_lock(&p->mu);
    p->lf.constructing = false;
    bool aborted = p->lf.stop;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (e || aborted) {
        if (!e) e = fx_seterr(FX_ECLOSED, "mpsc producer closed while opening");
        char d[512];
        snprintf(d, sizeof d, "%s", fx_err_detail());
        fx_mpsc_producer_free(p);
        return fx_seterr(e, "%s", d);
    }
    FX_DBG("mpsc producer %lld/%lld open (next id %lld)", (long long)chan, (long long)p->pidx,
           (long long)p->next);
    *out = p;
    return FX_OK;
}

fx_err fx_mpsc_producer_open(fx_mq_client *c, int64_t chan, int64_t weight,
                             fx_mpsc_producer **out)
{
    return prod_open(c, chan, weight, NULL, out);
}

fx_err fx__mpsc_producer_open_sub(fx_mq_client *c, int64_t chan, int64_t weight,
                                  const fx__mpsc_parent *parent, fx_mpsc_producer **out)
{
    if (!parent) {
        if (out) *out = NULL;
        return fx_seterr(FX_EINVAL, "sub-producer open: NULL parent");
    }
    return prod_open(c, chan, weight, parent, out);
}

/* ======================================================================================== *
 * Consumer                                                                                 *
 * ======================================================================================== */

/* One fetched payload segment: ids [first, last]; `next` is the next id to hand out from it.
 * bad: the value did not decode (its ids are skipped). */
typedef struct seg_run {
    int64_t first, last, next;
    bool bad;
    fx_seg_iter it;
} seg_run;

static void runs_clear(fx_range_resp *segs, seg_run **runs, size_t *n_runs, size_t *run_i)
{
    fx_range_resp_free(segs);
    free(*runs);
    *runs = NULL;
    *n_runs = *run_i = 0;
}

/* Per-producer read state. Ids: [0, ack_base) acked (or skipped), [ack_base, next_fetch) handed
 * out (win holds their acked flags), [next_fetch, produce] stored and not yet handed out. */
typedef struct pstate {
    int64_t pidx;
    int64_t produce;    /* last written id (watch; -1 none) */
    int64_t start;      /* resume point: ids below were never handed out by this consumer */
    int64_t next_fetch; /* next id to hand out */
    int64_t ack_base;   /* every id below is acked */
    int64_t committed;  /* consume offset written to etcd */
    bool del_pending;   /* payloads below `committed` may still exist (kv apart) */
    uint8_t *win;       /* ring of acked flags for [ack_base, next_fetch) */
    size_t cap, head;
    /* Segment layout: segments fetched and not yet fully handed out (touched by get() under mu).
     * Invariant while n_runs > run_i: every id in [next_fetch, runs[run_i].first) is known to
     * have no message, and runs[run_i..] hold ids >= next_fetch in id order. */
    fx_range_resp segs; /* owns the values the runs point into */
    seg_run *runs;
    size_t n_runs, run_i;
} pstate;

typedef struct resume_pt {
    int64_t pidx, off;
} resume_pt;

struct fx_mpsc_consumer {
    fx__mq_endpoint ep;
    fx_mq_client *c;
    chan_mgr m;
    int64_t cidx;
    fx_mq_key k_member;
    bool member_written;
    bool member_deleted;
    fx_pwatch *pw; /* registered with the client's produce-offset watch (NULL: not) */
    void (*notify)(void *arg); /* fx_mpmc_consumer_set_notify (under mu) */
    void *notify_arg;
    /* commit pool (cpool): under the pool's mu */
    bool cq_on;       /* attached to the client's commit pool (detached at close) */
    bool cq_queued, cq_busy, cq_again;
    int64_t cq_not_before, cq_backoff;
    struct fx_mpsc_consumer *cq_next;
    bool cq_attached; /* closing thread only: a final commit is due at close */

    pthread_mutex_t get_mu; /* serialises gets */

    pthread_mutex_t mu;        /* everything below and lf */
    pthread_cond_t cv;         /* close progress, flush waiters */
    pthread_cond_t data_cv;    /* get waiters (watch, close, fault) */
    pthread_cond_t commit_cv;  /* unused since the commit pool (kept for the destroy order) */
    life lf;
    pstate *ps;
    size_t n_ps, cap_ps, rr;
    resume_pt *resume;
    size_t n_resume;
    uint64_t ack_seq;    /* bumps when some ack_base advances */
    uint64_t commit_seq; /* ack_seq value fully committed */
    fx_log_slot skip_log, commit_log;
    stats st;
    fx_err final_err;       /* the commit thread's final commit failed (written before join) */
    char final_detail[256];
    fx_err retry_err;       /* ST_RETRY: the strong error of the last close (under mu) */
};

static pstate *ps_find(fx_mpsc_consumer *c, int64_t pidx)
{
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].pidx == pidx) return &c->ps[i];
    return NULL;
}

static pstate *ps_add(fx_mpsc_consumer *c, int64_t pidx)
{
    pstate *s = ps_find(c, pidx);
    if (s) return s;
    if (c->n_ps >= MAX_PRODUCERS) return NULL;
    if (c->n_ps == c->cap_ps) {
        size_t nc = c->cap_ps ? c->cap_ps * 2 : 8;
        pstate *np = realloc(c->ps, nc * sizeof *np);
        if (!np) return NULL;
        c->ps = np;
        c->cap_ps = nc;
    }
    int64_t start = FX_MQ_CONSUME_OFFSET_BEGIN;
    for (size_t i = 0; i < c->n_resume; i++)
        if (c->resume[i].pidx == pidx) start = c->resume[i].off;
    s = &c->ps[c->n_ps++];
    *s = (pstate){.pidx = pidx, .produce = FX_MQ_PRODUCE_OFFSET_BEGIN, .start = start,
                  .next_fetch = start, .ack_base = start, .committed = start,
                  .del_pending = !c->c->kv_shared};
    return s;
}

static size_t win_len(const pstate *s) { return (size_t)(s->next_fetch - s->ack_base); }

static uint8_t *win_at(pstate *s, size_t i) { return &s->win[(s->head + i) & (s->cap - 1)]; }

/* Room for `add` more flags. */
static bool win_reserve(pstate *s, size_t add)
{
    size_t len = win_len(s), need = len + add;
    if (need <= s->cap) return true;
    size_t nc = s->cap ? s->cap : 64;
    while (nc < need) nc *= 2;
    uint8_t *nw = malloc(nc);
    if (!nw) return false;
    for (size_t i = 0; i < len; i++) nw[i] = *win_at(s, i);
    free(s->win);
    s->win = nw;
    s->cap = nc;
    s->head = 0;
    return true;
}

/* Pop the acked prefix; true when ack_base moved. */
static bool win_advance(pstate *s)
{
    bool moved = false;
    while (s->ack_base < s->next_fetch && *win_at(s, 0)) {
        *win_at(s, 0) = 0;
        s->head = (s->head + 1) & (s->cap - 1);
        s->ack_base++;
        moved = true;
    }
    return moved;
}

static void cons_on_expired(void *arg, fx_lease *h, int64_t id)
{
    (void)h;
    fx_mpsc_consumer *c = arg;
    pthread_mutex_lock(&c->mu);
    if (life_lease_lost(&c->lf))
        FX_WRN("mpsc consumer %lld/%lld: lease %lld expired; closing the consumer",
               (long long)c->m.chan, (long long)c->cidx, (long long)id);
    pthread_cond_broadcast(&c->data_cv);
    if (c->notify && !c->lf.constructing) c->notify(c->notify_arg);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static fx_err cons_gate_locked(fx_mpsc_consumer *c, bool *self_close)
{
    return life_gate(&c->lf, "consumer", c->m.chan, c->cidx, self_close);
}

/* A produce offset (shared watch or the read at open): merge monotonically (max) under mu, wake
 * getters when it moved. */
static bool cons_merge_locked(fx_mpsc_consumer *c, int64_t pidx, int64_t off)
{
    pstate *s = ps_add(c, pidx);
    if (!s) {
        FX_ERR("mpsc consumer %lld: cannot track producer %lld (memory or %d producers)",
               (long long)c->m.chan, (long long)pidx, MAX_PRODUCERS);
        return false;
    }
    if (off <= s->produce) return false;
    s->produce = off;
    return true;
}

static void cons_pwatch_cb(void *arg, int64_t pidx, int64_t off)
{
    fx_mpsc_consumer *c = arg;
    pthread_mutex_lock(&c->mu);
    if (cons_merge_locked(c, pidx, off)) {
        pthread_cond_broadcast(&c->data_cv);
        if (c->notify) c->notify(c->notify_arg);
    }
    pthread_mutex_unlock(&c->mu);
}

void fx__mpsc_consumer_set_notify(fx_mpsc_consumer *c, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->notify = fn;
    c->notify_arg = arg;
    pthread_mutex_unlock(&c->mu);
}

/* The channel's produce offsets, read once after registering with the shared watch (events
 * written before the registration are in this read; later ones come from the watch). */
static fx_err read_produce(fx_mpsc_consumer *c)
{
    fx_mq_client *cl = c->c;
    fx_mq_key pre;
    fx_err e = key_err(fx_mq_prefix_produce_offsets(&cl->keys, c->m.chan, &pre), "prefix");
    if (e) return e;
    uint8_t end[FX_MQ_KEY_CAP];
    size_t el = fx_prefix_end(fx_mq_key_slice(&pre), end);
    fx_range_req rq = {.key = fx_mq_key_slice(&pre), .range_end = {end, el}};
    fx_range_resp rr = {0};
    if ((e = fx_etcd_range(cl->etcd, &rq, &rr, cl->op_timeout_ms))) {
        fx_range_resp_free(&rr);
        return e;
    }
    bool changed = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < rr.n_kvs; i++) {
        int64_t ch = -1, pidx = -1, off = -1;
        const fx_kv *kv = &rr.kvs[i];
        if (fx_mq_parse_produce_offset_key(&cl->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) ||
            ch != c->m.chan || fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &off)) {
            FX_WRN("mpsc consumer %lld: ignoring a malformed produce offset entry",
                   (long long)c->m.chan);
            continue;
        }
        if (cons_merge_locked(c, pidx, off)) changed = true;
    }
    if (changed) pthread_cond_broadcast(&c->data_cv);
    pthread_mutex_unlock(&c->mu);
    fx_range_resp_free(&rr);
    return FX_OK;
}

/* ---- commit --------------------------------------------------------------------------------- */

typedef struct commit_item {
    int64_t pidx, to;
    bool advance; /* offset moves to `to` */
} commit_item;

/* Write one group: offsets (global lease) and payload deletes of [0, to). kv shared: one txn.
 * Else the offsets txn, then one delete_range per producer. *landed: the offsets were written;
 * deleted[i]: the payloads below it[i].to are gone. */
static fx_err commit_group(fx_mpsc_consumer *c, const commit_item *it, size_t n, int timeout_ms,
                           bool *landed, bool *deleted)
{
    fx_mq_client *cl = c->c;
    fx_err e = FX_OK;
    *landed = false;
    for (size_t i = 0; i < n; i++) deleted[i] = false;
    fx_mq_key *ok = calloc(n, sizeof *ok);
    char (*vals)[FX_MQ_DEC_BUF] = calloc(n, sizeof *vals);
    char *fk = cl->kv_shared ? malloc(n * 2 * FULLKEY_CAP) : NULL;
    fx_op *ops = calloc(2 * n, sizeof *ops);
    if (!ok || !vals || (cl->kv_shared && !fk) || !ops) {
        e = fx_seterr(FX_ENOMEM, "mpsc commit: out of memory");
        goto out;
    }
    size_t nops = 0;
    for (size_t i = 0; i < n; i++) {
        if (!it[i].advance) continue;
        if ((e = key_err(fx_mq_key_consume_offset(&cl->keys, c->m.chan, it[i].pidx, &ok[i]),
                         "consume offset")))
            goto out;
        size_t vl = fx_mq_dec_format(it[i].to, vals[i]);
        ops[nops++] = (fx_op){.type = FX_OP_PUT,
                              .u.put = {.key = fx_mq_key_slice(&ok[i]), .value = {vals[i], vl},
                                        .lease = c->m.meta.global_lease_id}};
    }
    if (cl->kv_shared) {
        for (size_t i = 0; i < n; i++) {
            fx_mq_key s, en;
            fx_slice fs, fe;
            if ((e = key_err(pay_key(&c->m, it[i].pidx, 0, &s), "payload")) ||
                (e = key_err(pay_key(&c->m, it[i].pidx, it[i].to, &en), "payload")) ||
                (e = full_key(cl, &s, fk + 2 * i * FULLKEY_CAP, FULLKEY_CAP, &fs)) ||
                (e = full_key(cl, &en, fk + (2 * i + 1) * FULLKEY_CAP, FULLKEY_CAP, &fe)))
                goto out;
            ops[nops++] = (fx_op){.type = FX_OP_DELETE, .u.del = {.key = fs, .range_end = fe}};
        }
    }
    if (nops) {
        /* Fencing (issue 13): the offsets move only while this consumer's membership key exists.
         * It lives under the member lease, so a consumer whose lease expired (a bridge cut off
         * from etcd for longer than the TTL, its sub-MPSC claimed by another member since) cannot
         * commit late: the compare fails and the commit is refused. */
        fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_GREATER,
                      .key = fx_mq_key_slice(&c->k_member), .num = 0};
        fx_txn_req tx = {.cmp = &cmp, .n_cmp = c->member_written ? 1 : 0, .success = ops,
                         .n_success = nops};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(cl->etcd, &tx, &resp, timeout_ms);
        bool refused = e == FX_OK && !resp.succeeded;
        fx_txn_resp_free(&resp);
        if (e) goto out;
        if (refused) {
            FX_WRN("mpsc consumer %lld/%lld: commit refused: its membership is gone (member lease "
                   "expired): fenced; %zu producer offset(s) not moved",
                   (long long)c->m.chan, (long long)c->cidx, nops);
            e = fx_seterr(FX_ELEASE_LOST, "mpsc consumer %lld/%lld: commit refused (fenced): "
                          "membership gone", (long long)c->m.chan, (long long)c->cidx);
            goto out;
        }
    }
    *landed = true;
    for (size_t i = 0; i < n; i++) {
        if (cl->kv_shared) {
            deleted[i] = true;
            continue;
        }
        fx_mq_key s, en;
        if ((e = key_err(pay_key(&c->m, it[i].pidx, 0, &s), "payload")) ||
            (e = key_err(pay_key(&c->m, it[i].pidx, it[i].to, &en), "payload")))
            goto out;
        /* offsets landed; a failed delete is retried next round (del_pending) */
        if ((e = fx_kv_delete_range(cl->kv, fx_mq_key_slice(&s), fx_mq_key_slice(&en), NULL,
                                    timeout_ms)))
            goto out;
        deleted[i] = true;
    }
out:
    free(ops);
    free(fk);
    free(vals);
    free(ok);
    return e;
}

/* One commit round over every producer whose acked prefix moved (or whose payload delete is
 * pending). FX_OK when everything gathered was written; then commit_seq catches up. */
static fx_err commit_round(fx_mpsc_consumer *c, int timeout_ms, bool *did)
{
    *did = false;
    pthread_mutex_lock(&c->mu);
    uint64_t seq = c->ack_seq;
    size_t n = 0;
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].ack_base > c->ps[i].committed || c->ps[i].del_pending) n++;
    commit_item *it = n ? calloc(n, sizeof *it) : NULL;
    if (n && !it) {
        pthread_mutex_unlock(&c->mu);
        return fx_seterr(FX_ENOMEM, "mpsc commit: out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < c->n_ps && k < n; i++) {
        pstate *s = &c->ps[i];
        if (s->ack_base > s->committed)
            it[k++] = (commit_item){s->pidx, s->ack_base, true};
        else if (s->del_pending)
            it[k++] = (commit_item){s->pidx, s->committed, false};
    }
    pthread_mutex_unlock(&c->mu);
    fx_err e = FX_OK;
    bool deleted[COMMIT_GROUP];
    for (size_t g = 0; g < n && !e; g += COMMIT_GROUP) {
        size_t gn = n - g < COMMIT_GROUP ? n - g : COMMIT_GROUP;
        bool landed = false;
        e = commit_group(c, it + g, gn, timeout_ms, &landed, deleted);
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < gn; i++) {
            pstate *s = ps_find(c, it[g + i].pidx);
            if (!s) continue;
            if (landed && it[g + i].advance) {
                if (it[g + i].to > s->committed) s->committed = it[g + i].to;
                s->del_pending = !c->c->kv_shared;
            }
            if (deleted[i] && s->committed == it[g + i].to) s->del_pending = false;
        }
        pthread_mutex_unlock(&c->mu);
        if (landed) *did = true;
    }
    free(it);
    if (!e) {
        pthread_mutex_lock(&c->mu);
        if (seq > c->commit_seq) c->commit_seq = seq;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return e;
}

static bool commit_dirty(const fx_mpsc_consumer *c)
{
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].ack_base > c->ps[i].committed || c->ps[i].del_pending) return true;
    return false;
}

/* ---- the commit pool ----------------------------------------------------------------------------
 * One pool of FX_MQ_COMMIT_THREADS threads per client commits for every consumer of the client
 * (issue 13: it was one thread per consumer, i.e. per claim). A consumer is queued while it has
 * acks to commit and no pool thread is committing for it, so its commits stay in order and one
 * slow consumer holds one pool thread at most; a failed round is retried after a backoff (50 ms
 * doubling to 1 s: the consumer goes back to the queue with a not-before time). The final commit
 * of a close runs in the closing thread after the consumer left the pool. Lock order: a
 * consumer's mu, then the pool's mu (commit_kick); pool threads never hold the pool's mu while
 * taking a consumer's. */
struct fx__cpool {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* pool threads (monotonic) */
    pthread_cond_t done_cv; /* detach waiting for a busy consumer (monotonic) */
    bool stop;
    fx_mpsc_consumer *head, *tail;
    pthread_t thr[FX_MQ_COMMIT_THREADS];
    size_t n_thr;
    fx_mq_client *c;
};

static void cpool_push_locked(struct fx__cpool *p, fx_mpsc_consumer *c)
{
    c->cq_queued = true;
    c->cq_next = NULL;
    if (p->tail) p->tail->cq_next = c;
    else p->head = c;
    p->tail = c;
    pthread_cond_signal(&p->cv);
}

static void cpool_unlink_locked(struct fx__cpool *p, fx_mpsc_consumer *c, fx_mpsc_consumer *prev)
{
    if (prev) prev->cq_next = c->cq_next;
    else p->head = c->cq_next;
    if (p->tail == c) p->tail = prev;
    c->cq_queued = false;
}

/* Acks to commit (or a flush): queue the consumer. c->mu held. */
static void commit_kick(fx_mpsc_consumer *c)
{
    struct fx__cpool *p = c->c->cpool;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (c->cq_on) {
        if (c->cq_busy) c->cq_again = true;
        else if (!c->cq_queued) {
            c->cq_not_before = 0;
            cpool_push_locked(p, c);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

static void *cpool_main(void *arg)
{
    struct fx__cpool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        fx_mpsc_consumer *c = NULL, *prev = NULL;
        int64_t now = fx_now_ms(), until = now + 1000;
        for (fx_mpsc_consumer *x = p->head; x; prev = x, x = x->cq_next) {
            if (x->cq_not_before <= now) {
                c = x;
                break;
            }
            if (x->cq_not_before < until) until = x->cq_not_before;
        }
        if (p->stop) break;
        if (!c) {
            struct timespec ts = fx_deadline_ts(until);
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
            continue;
        }
        cpool_unlink_locked(p, c, prev);
        c->cq_busy = true;
        c->cq_again = false;
        pthread_mutex_unlock(&p->mu);

        pthread_mutex_lock(&c->mu);
        bool skip = c->lf.stop || c->lf.fault != FX_OK || !commit_dirty(c);
        pthread_mutex_unlock(&c->mu);
        fx_err e = FX_OK;
        if (!skip && (e = fx__mq_op_enter(c->c)) == FX_OK) {
            bool did = false;
            e = commit_round(c, c->c->op_timeout_ms, &did);
            fx__mq_op_leave(c->c);
            if (did) c->st.commits++;
            if (e == FX_ELEASE_LOST) { /* fenced: the consumer is over (its next call closes it) */
                pthread_mutex_lock(&c->mu);
                life_lease_lost(&c->lf);
                pthread_cond_broadcast(&c->data_cv);
                pthread_cond_broadcast(&c->cv);
                pthread_mutex_unlock(&c->mu);
            } else if (e) {
                c->st.commit_retries++;
                if (!c->cq_backoff) c->cq_backoff = RETRY_MIN_MS;
                fx_log_ratelimited(&c->commit_log, 5000, FX_LOG_WRN,
                                   "mpsc consumer %lld/%lld: commit failed: %s (%s); retrying in "
                                   "%lld ms",
                                   (long long)c->m.chan, (long long)c->cidx, fx_errname(e),
                                   fx_err_detail(), (long long)c->cq_backoff);
            }
        }
        bool redo = false;
        if (!skip) {
            pthread_mutex_lock(&c->mu);
            redo = !c->lf.stop && c->lf.fault == FX_OK && commit_dirty(c);
            pthread_mutex_unlock(&c->mu);
        }
        pthread_mutex_lock(&p->mu);
        c->cq_busy = false;
        if (!c->cq_on) {
            pthread_cond_broadcast(&p->done_cv);
        } else if (e && !skip && e != FX_ELEASE_LOST) {
            c->cq_not_before = fx_now_ms() + c->cq_backoff;
            c->cq_backoff = min64(c->cq_backoff * 2, RETRY_MAX_MS);
            cpool_push_locked(p, c);
        } else if (redo || c->cq_again) {
            if (!e) c->cq_backoff = 0;
            c->cq_not_before = 0;
            cpool_push_locked(p, c);
        } else {
            c->cq_backoff = 0;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

fx_err fx__cpool_new(fx_mq_client *c, struct fx__cpool **out)
{
    *out = NULL;
    struct fx__cpool *p = calloc(1, sizeof *p);
    if (!p) return fx_seterr(FX_ENOMEM, "commit pool: out of memory");
    p->c = c;
    if (pthread_mutex_init(&p->mu, NULL) || fx_cond_init_monotonic(&p->cv) ||
        fx_cond_init_monotonic(&p->done_cv)) {
        free(p);
        return fx_seterr(FX_ENOMEM, "commit pool: sync init failed");
    }
    for (size_t i = 0; i < FX_MQ_COMMIT_THREADS; i++) {
        if (pthread_create(&p->thr[p->n_thr], NULL, cpool_main, p) != 0) break;
        p->n_thr++;
    }
    if (!p->n_thr) {
        fx__cpool_free(p);
        return fx_seterr(FX_ENOMEM, "commit pool: cannot start a thread");
    }
    *out = p;
    return FX_OK;
}

void fx__cpool_free(struct fx__cpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_thr; i++) pthread_join(p->thr[i], NULL);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Leave the pool: after it returns no pool thread works for c. */
static void commit_detach(fx_mpsc_consumer *c)
{
    struct fx__cpool *p = c->c->cpool;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (c->cq_on) {
        c->cq_on = false;
        if (c->cq_queued) {
            fx_mpsc_consumer *prev = NULL;
            for (fx_mpsc_consumer *x = p->head; x && x != c; x = x->cq_next) prev = x;
            cpool_unlink_locked(p, c, prev);
        }
        while (c->cq_busy) {
            struct timespec ts = fx_deadline_ts(fx_now_ms() + 1000);
            pthread_cond_timedwait(&p->done_cv, &p->mu, &ts);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

/* The close's one final bounded commit attempt (in the closing thread, after commit_detach). */
static void commit_final(fx_mpsc_consumer *c)
{
    pthread_mutex_lock(&c->mu);
    bool faulted = c->lf.fault != FX_OK;
    pthread_mutex_unlock(&c->mu);
    if (faulted) return; /* a lost lease: no more writes */
    if (fx__mq_op_enter(c->c) != FX_OK) return;
    bool did = false;
    fx_err e = commit_round(c, c->c->close_timeout_ms, &did);
    fx__mq_op_leave(c->c);
    if (did) c->st.commits++;
    if (e == FX_ELEASE_LOST) { /* fenced: nothing of ours may be committed any more */
        pthread_mutex_lock(&c->mu);
        life_lease_lost(&c->lf);
        pthread_mutex_unlock(&c->mu);
    }
    if (e) {
        c->final_err = e;
        snprintf(c->final_detail, sizeof c->final_detail, "%s", fx_err_detail());
        if (c->m.sub)
            FX_WRN("mpsc consumer %lld/%lld close: final commit failed: %s (%s); the "
                   "uncommitted messages will be delivered again",
                   (long long)c->m.chan, (long long)c->cidx, fx_errname(e), fx_err_detail());
    }
}

/* ---- get / ack / flush ------------------------------------------------------------------------- */

static fx_err cons_close_impl(fx_mpsc_consumer *c, bool force, bool *unfinished);

void fx_mq_delivery_free(fx_mq_delivery *d)
{
    if (!d) return;
    fx_bytes_free(&d->value);
    memset(d, 0, sizeof *d);
}

/* Pick a ready producer round robin; fills *pidx, *from, *to. Called with mu held. */
static bool pick(fx_mpsc_consumer *c, size_t want, int64_t *pidx, int64_t *from, int64_t *to,
                 int64_t *hi)
{
    for (size_t k = 0; k < c->n_ps; k++) {
        size_t i = (c->rr + k) % c->n_ps;
        pstate *s = &c->ps[i];
        size_t inflight = win_len(s);
        if (s->produce < s->next_fetch || inflight >= MAX_UNACKED) continue;
        int64_t n = min64((int64_t)want, (int64_t)(MAX_UNACKED - inflight));
        n = min64(n, s->produce - s->next_fetch + 1);
        *pidx = s->pidx;
        *from = s->next_fetch;
        *to = s->next_fetch + n - 1;
        *hi = s->produce;
        c->rr = i + 1;
        return true;
    }
    return false;
}

/* Skipped ids of producer pidx in [from, to]: one rate-limited warning. Called with mu held. */
static void note_skipped(fx_mpsc_consumer *c, pstate *s, uint64_t skipped, int64_t from,
                         int64_t to, const char *why)
{
    c->st.skipped_ids += skipped;
    atomic_fetch_add(&c->c->payload_missing, skipped);
    fx_log_ratelimited(&c->skip_log, SKIP_LOG_MS, FX_LOG_ERR,
                       "mpsc consumer %lld/%lld: %llu message id(s) of producer %lld in "
                       "[%lld, %lld] %s; skipped",
                       (long long)c->m.chan, (long long)c->cidx, (unsigned long long)skipped,
                       (long long)s->pidx, (long long)from, (long long)to, why);
    if (win_advance(s)) {
        c->ack_seq++;
        commit_kick(c);
    }
}

/* Segment fetch for producer pidx, ids from `from` on (hi: its produce offset). Every index scan
 * is bounded (etcd 3.4 walks every key of a range's interval, whatever its limit):
 *   1. every segment whose key (last id) is in [from, wend]: one range, no limit; wend <= hi
 *      and wend - from < the caller's window, so at most that many keys;
 *   2. if none: the first segment with last id in (wend, min(hi, from + FX_SEG_MAX_MSGS - 1)]
 *      (limit 1): it holds `from` when `from` is inside a segment longer than the window, since
 *      a segment holds at most FX_SEG_MAX_MSGS ids.
 * On FX_OK *segs owns the values and *runs (malloc'd, *n runs, key order) describe them;
 * *scanned is the last id the fetch looked at: ids in [from, *scanned] that no run covers have
 * no message. Foreign keys in the range are ignored (a window of nothing else counts as empty);
 * values that do not decode become bad runs. */
static fx_err seg_fetch(fx_mpsc_consumer *c, int64_t pidx, int64_t from, int64_t wend, int64_t hi,
                        fx_range_resp *segs, seg_run **runs, size_t *n, int64_t *scanned)
{
    fx_mq_client *cl = c->c;
    int64_t lo = from, end = wend, limit = 0;
    *runs = NULL;
    *n = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            lo = wend + 1;
            end = min64(hi, from + FX_SEG_MAX_MSGS - 1);
            limit = 1;
            if (lo > end) break;
        }
        fx_mq_key ks, ke;
        fx_err e;
        if ((e = key_err(pay_key(&c->m, pidx, lo, &ks), "payload")) ||
            (e = key_err(pay_key(&c->m, pidx, end + 1, &ke), "payload")))
            return e;
        c->st.fetches++;
        if ((e = fx_kv_get_range(cl->kv, fx_mq_key_slice(&ks), fx_mq_key_slice(&ke), limit, segs,
                                 cl->kv_timeout_ms))) {
            fx_range_resp_free(segs);
            return e;
        }
        *scanned = end;
        if (segs->n_kvs == 0) {
            fx_range_resp_free(segs);
            continue;
        }
        seg_run *r = calloc(segs->n_kvs, sizeof *r);
        if (!r) {
            fx_range_resp_free(segs);
            return fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
        }
        size_t k = 0;
        for (size_t i = 0; i < segs->n_kvs; i++) {
            const fx_kv *kv = &segs->kvs[i];
            int64_t kp = -1, last = -1;
            if (pay_parse(&c->m, (fx_slice){kv->key.data, kv->key.len}, &kp, &last) != FX_OK ||
                kp != pidx || last < from || (k > 0 && last <= r[k - 1].last))
                continue;
            seg_run *x = &r[k];
            bool ok = fx_seg_open(kv->value.data, kv->value.len, &x->it) == FX_OK &&
                      (int64_t)x->it.n <= last + 1;
            int64_t first = ok ? last - (int64_t)x->it.n + 1 : 0;
            if (ok && k > 0 && first <= r[k - 1].last) { /* overlaps the previous segment */
                ok = false;
                fx_seterr(FX_EPROTO, "segment overlaps the one ending at %lld",
                          (long long)r[k - 1].last);
            }
            if (!ok) {
                FX_WRN("mpsc consumer %lld/%lld: payload segment of producer %lld ending at id "
                       "%lld is corrupt (%s)", (long long)c->m.chan, (long long)c->cidx,
                       (long long)pidx, (long long)last, fx_err_detail());
                x->bad = true;
                first = k > 0 ? r[k - 1].last + 1 : from;
            }
            x->first = x->next = first;
            x->last = last;
            k++;
        }
        if (k == 0) { /* only foreign keys: as if empty, so the next pass still looks */
            free(r);
            fx_range_resp_free(segs);
            continue;
        }
        *runs = r;
        *n = k;
        return FX_OK;
    }
    return FX_OK;
}

/* Segment layout: hand out ids [from, <= to] of producer pidx (hi: its produce offset when
 * picked) from the fetched segments, fetching (seg_fetch) when none is buffered. Ids known to
 * have no message (a hole, a corrupt segment, nothing stored for them) are skipped as acked.
 * Called from get() with get_mu held and mu not held. */
static fx_err seg_get(fx_mpsc_consumer *c, int64_t pidx, int64_t from, int64_t to, int64_t hi,
                      fx_mq_delivery *out, size_t *got)
{
    pthread_mutex_lock(&c->mu);
    pstate *s = ps_find(c, pidx);
    bool have = s && s->run_i < s->n_runs;
    pthread_mutex_unlock(&c->mu);

    fx_range_resp segs = {0};
    seg_run *runs = NULL;
    size_t n_runs = 0;
    int64_t scanned = from - 1;
    fx_err e;
    if (!have && (e = seg_fetch(c, pidx, from, to, hi, &segs, &runs, &n_runs, &scanned)))
        return e;

    pthread_mutex_lock(&c->mu);
    s = ps_find(c, pidx);
    if (!s || s->next_fetch != from || c->lf.stop) {
        bool stopped = c->lf.stop;
        pthread_mutex_unlock(&c->mu);
        size_t z = 0;
        runs_clear(&segs, &runs, &n_runs, &z);
        return stopped ? FX_OK : fx_seterr(FX_EPROTO, "mpsc get: producer state moved");
    }
    if (!have) {
        runs_clear(&s->segs, &s->runs, &s->n_runs, &s->run_i);
        s->segs = segs;
        s->runs = runs;
        s->n_runs = n_runs;
    }
    /* Last id this call may settle: up to `to`, and not past what is buffered (ids after the
     * last run are unknown yet) unless the fetch found nothing for them. */
    int64_t end = s->run_i < s->n_runs ? min64(to, s->runs[s->n_runs - 1].last)
                                       : min64(to, scanned);
    if (end < from) end = from; /* nothing buffered and nothing scanned: cannot happen */
    if (!win_reserve(s, (size_t)(end - from + 1))) {
        pthread_mutex_unlock(&c->mu);
        return fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
    }
    uint64_t skipped = 0, corrupt = 0;
    e = FX_OK;
    for (int64_t id = from; id <= end; id++) {
        while (s->run_i < s->n_runs && s->runs[s->run_i].last < id) s->run_i++;
        seg_run *r = s->run_i < s->n_runs ? &s->runs[s->run_i] : NULL;
        size_t slot = win_len(s);
        if (r && !r->bad && id >= r->first) {
            fx_seg_iter peek = r->it;
            fx_slice m;
            while (r->next < id && fx_seg_next(&peek, &m)) r->next++; /* resume inside it */
            uint8_t *buf = fx_seg_next(&peek, &m) ? malloc(m.len + 1) : NULL;
            if (!buf) {
                e = fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
                break;
            }
            memcpy(buf, m.data, m.len);
            buf[m.len] = 0;
            r->it = peek;
            r->next = id + 1;
            out[*got] = (fx_mq_delivery){.id = {c->m.chan, pidx, id}, .value = {buf, m.len}};
            (*got)++;
            *win_at(s, slot) = 0;
        } else {
            skipped++;
            if (r && r->bad && id >= r->first) corrupt++;
            *win_at(s, slot) = 1; /* treated as acked */
        }
        s->next_fetch = id + 1;
    }
    while (s->run_i < s->n_runs && s->runs[s->run_i].last < s->next_fetch) s->run_i++;
    if (s->run_i >= s->n_runs) runs_clear(&s->segs, &s->runs, &s->n_runs, &s->run_i);
    if (skipped)
        note_skipped(c, s, skipped, from, s->next_fetch - 1,
                     corrupt ? "are missing or in a corrupt segment"
                             : "are missing below the produce offset");
    pthread_mutex_unlock(&c->mu);
    return e;
}

fx_err fx_mpsc_get(fx_mpsc_consumer *c, fx_mq_delivery *out, size_t max, size_t *n,
                   int timeout_ms)
{
    if (n) *n = 0;
    if (!c || !out || !n || max == 0) return fx_seterr(FX_EINVAL, "mpsc get: bad arguments");
    bool self_close = false;
    pthread_mutex_lock(&c->mu);
    fx_err e = cons_gate_locked(c, &self_close);
    pthread_mutex_unlock(&c->mu);
    if (e) {
        if (self_close) cons_close_impl(c, false, NULL);
        return e;
    }
    fx_mq_client *cl = c->c;
    if ((e = fx__mq_op_enter(cl))) return e;
    pthread_mutex_lock(&c->get_mu);
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    size_t got = 0;
    for (;;) {
        int64_t pidx, from, to, hi;
        pthread_mutex_lock(&c->mu);
        e = cons_gate_locked(c, &self_close);
        if (e) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        if (!pick(c, max - got, &pidx, &from, &to, &hi)) {
            if (got > 0) {
                pthread_mutex_unlock(&c->mu);
                break;
            }
            if (fx_ms_left(deadline) <= 0) {
                pthread_mutex_unlock(&c->mu);
                e = fx_seterr(FX_ETIMEDOUT, "mpsc get: no message");
                break;
            }
            struct timespec ts = fx_deadline_ts(deadline);
            pthread_cond_timedwait(&c->data_cv, &c->mu, &ts);
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);

        if (c->m.meta.segments) {
            if ((e = seg_get(c, pidx, from, to, hi, out, &got))) break;
            if (got >= max) break;
            continue;
        }
        fx_mq_key ks, ke;
        if ((e = key_err(pay_key(&c->m, pidx, from, &ks), "payload")) ||
            (e = key_err(pay_key(&c->m, pidx, to + 1, &ke), "payload")))
            break;
        fx_range_resp rr = {0};
        c->st.fetches++;
        e = fx_kv_get_range(cl->kv, fx_mq_key_slice(&ks), fx_mq_key_slice(&ke), to - from + 1,
                            &rr, cl->kv_timeout_ms);
        if (e) {
            fx_range_resp_free(&rr);
            break;
        }
        pthread_mutex_lock(&c->mu);
        pstate *s = ps_find(c, pidx);
        bool ok = s && s->next_fetch == from && !c->lf.stop &&
                  win_reserve(s, (size_t)(to - from + 1));
        if (!ok) {
            bool stopped = c->lf.stop;
            pthread_mutex_unlock(&c->mu);
            fx_range_resp_free(&rr);
            if (stopped) continue; /* the gate reports it */
            e = fx_seterr(FX_ENOMEM, "mpsc get: out of memory");
            break;
        }
        size_t j = 0; /* next kv */
        uint64_t skipped = 0;
        for (int64_t id = from; id <= to; id++) {
            int64_t kp = -1, kid = -1;
            while (j < rr.n_kvs) {
                fx_slice key = {rr.kvs[j].key.data, rr.kvs[j].key.len};
                if (pay_parse(&c->m, key, &kp, &kid) == FX_OK && kp == pidx && kid >= id) break;
                j++; /* foreign or malformed key inside the range: ignore */
            }
            size_t slot = win_len(s);
            s->next_fetch = id + 1;
            if (j < rr.n_kvs && kid == id) {
                out[got].id = (fx_mq_msg_id){c->m.chan, pidx, id};
                out[got].value = rr.kvs[j].value;
                rr.kvs[j].value = (fx_bytes){0};
                got++;
                j++;
                *win_at(s, slot) = 0;
            } else {
                skipped++;
                *win_at(s, slot) = 1; /* treated as acked */
            }
        }
        if (skipped) note_skipped(c, s, skipped, from, to, "are missing below the produce offset");
        pthread_mutex_unlock(&c->mu);
        fx_range_resp_free(&rr);
        if (got >= max) break;
    }
    pthread_mutex_unlock(&c->get_mu);
    fx__mq_op_leave(cl);
    if (e && got > 0) {
        if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
            for (size_t i = 0; i < got; i++) fx_mq_delivery_free(&out[i]);
            got = 0;
        } else {
            e = FX_OK; /* a later fetch failed: return what we have */
        }
    }
    if (self_close) cons_close_impl(c, false, NULL);
    c->st.got_msgs += got;
    *n = got;
    return e;
}

fx_err fx_mpsc_ack(fx_mpsc_consumer *c, const fx_mq_msg_id *ids, size_t n)
{
    if (!c || (n && !ids)) return fx_seterr(FX_EINVAL, "mpsc ack: bad arguments");
    bool self_close = false;
    pthread_mutex_lock(&c->mu);
    fx_err e = cons_gate_locked(c, &self_close);
    for (size_t i = 0; i < n && !e; i++) {
        pstate *s = ids[i].chan == c->m.chan ? ps_find(c, ids[i].pidx) : NULL;
        if (!s || ids[i].msg < s->start || ids[i].msg >= s->next_fetch)
            e = fx_seterr(FX_EINVAL, "mpsc ack: id %lld/%lld/%lld was never handed out",
                          (long long)ids[i].chan, (long long)ids[i].pidx, (long long)ids[i].msg);
    }
    if (!e) {
        bool moved = false;
        for (size_t i = 0; i < n; i++) {
            pstate *s = ps_find(c, ids[i].pidx);
            if (ids[i].msg < s->ack_base) continue;
            uint8_t *f = win_at(s, (size_t)(ids[i].msg - s->ack_base));
            if (!*f) c->st.acked++;
            *f = 1;
            moved |= win_advance(s);
        }
        if (moved) {
            c->ack_seq++;
            commit_kick(c);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (self_close) cons_close_impl(c, false, NULL);
    return e;
}

fx_err fx_mpsc_flush(fx_mpsc_consumer *c, int timeout_ms)
{
    if (!c) return fx_seterr(FX_EINVAL, "mpsc flush: NULL");
    bool self_close = false;
    int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&c->mu);
    fx_err e = cons_gate_locked(c, &self_close);
    uint64_t want = c->ack_seq;
    if (!e) commit_kick(c);
    while (!e && c->commit_seq < want) {
        if ((e = cons_gate_locked(c, &self_close))) break;
        if (fx_ms_left(deadline) <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "mpsc flush: acks not committed within %d ms", timeout_ms);
            break;
        }
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    if (self_close) cons_close_impl(c, false, NULL);
    return e;
}

/* ---- consumer open / close -------------------------------------------------------------------- */

static fx_err cons_close_cb(void *self) { return fx_mpsc_consumer_close(self); }
static fx_err cons_close_ex_cb(void *self, bool force, bool *unfinished)
{
    return cons_close_impl(self, force, unfinished);
}

static void cons_destroy(fx_mpsc_consumer *c)
{
    for (size_t i = 0; i < c->n_ps; i++) {
        free(c->ps[i].win);
        runs_clear(&c->ps[i].segs, &c->ps[i].runs, &c->ps[i].n_runs, &c->ps[i].run_i);
    }
    free(c->ps);
    free(c->resume);
    pthread_cond_destroy(&c->commit_cv);
    pthread_cond_destroy(&c->data_cv);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->get_mu);
    free(c);
}

/* Acknowledged ids not committed yet (mu held). */
static int64_t uncommitted_acks(const fx_mpsc_consumer *c)
{
    int64_t n = 0;
    for (size_t i = 0; i < c->n_ps; i++)
        if (c->ps[i].ack_base > c->ps[i].committed) n += c->ps[i].ack_base - c->ps[i].committed;
    return n;
}

/* Close. The first call leaves the shared watch, stops the commit thread (which makes one final bounded
 * commit attempt). Strong error (standalone consumer, no lease lost, force false): acknowledged
 * ids are still uncommitted after that attempt -> the close returns that error, *unfinished is
 * set and the endpoint stays in ST_RETRY (leases, membership and acks kept): the next close
 * retries the commit (one bounded attempt) and, when it lands, finishes. force: finish anyway
 * (the uncommitted messages are delivered again; WARN). Sub-consumers (MPMC) never fail strongly:
 * their MPMC close goes on (the same WARN). */
static fx_err cons_close_impl(fx_mpsc_consumer *c, bool force, bool *unfinished)
{
    if (unfinished) *unfinished = false;
    pthread_mutex_lock(&c->mu);
    c->lf.stop = true;
    pthread_cond_broadcast(&c->data_cv);
    pthread_cond_broadcast(&c->commit_cv);
    pthread_cond_broadcast(&c->cv);
    while (c->lf.constructing) pthread_cond_wait(&c->cv, &c->mu);
    if (c->lf.state == ST_DONE || c->lf.state == ST_FINISHED) {
        fx_err r = c->lf.result;
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    if (c->lf.state == ST_RUNNING) {
        c->lf.waiters++;
        while (c->lf.state == ST_RUNNING) pthread_cond_wait(&c->cv, &c->mu);
        fx_err r = c->lf.result;
        if (c->lf.state == ST_RETRY) {
            r = fx_seterr(c->retry_err, "mpsc consumer %lld/%lld: close failed (acknowledged "
                          "messages not committed); close again to retry",
                          (long long)c->m.chan, (long long)c->cidx);
            if (unfinished) *unfinished = true;
        }
        if (--c->lf.waiters == 0) pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    bool retry = c->lf.state == ST_RETRY;
    c->lf.state = ST_RUNNING;
    pthread_mutex_unlock(&c->mu);

    fx_mq_client *cl = c->c;
    if (!retry) {
        fx_pwatch_remove(c->pw, c); /* no callback for c runs after this */
        c->pw = NULL;
        bool attached = c->cq_attached;
        commit_detach(c);
        if (attached) {
            c->cq_attached = false;
            commit_final(c); /* one final bounded commit attempt */
        }
    }
    if (!c->m.sub) {
        pthread_mutex_lock(&c->mu);
        bool faulted = c->lf.fault != FX_OK;
        int64_t left = faulted ? 0 : uncommitted_acks(c);
        pthread_mutex_unlock(&c->mu);
        if (left > 0 && retry) { /* the retry: one bounded commit attempt of its own */
            fx_err e = fx__mq_op_enter(cl);
            bool did = false;
            if (!e) {
                e = commit_round(c, cl->close_timeout_ms, &did);
                fx__mq_op_leave(cl);
            }
            if (did) c->st.commits++;
            if (e) {
                c->final_err = e;
                snprintf(c->final_detail, sizeof c->final_detail, "%s", fx_err_detail());
            }
            pthread_mutex_lock(&c->mu);
            left = uncommitted_acks(c);
            pthread_mutex_unlock(&c->mu);
        }
        if (left > 0 && !force) {
            fx_err e = c->final_err ? c->final_err : FX_ETIMEDOUT;
            pthread_mutex_lock(&c->mu);
            c->lf.state = ST_RETRY;
            c->retry_err = e;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            if (unfinished) *unfinished = true;
            FX_WRN("mpsc consumer %lld/%lld close: %lld acknowledged message(s) not committed "
                   "(%s: %s); the close stays retryable",
                   (long long)c->m.chan, (long long)c->cidx, (long long)left, fx_errname(e),
                   c->final_detail);
            return fx_seterr(e, "mpsc consumer %lld/%lld close: %lld acknowledged message(s) not "
                             "committed (%s); close again to retry",
                             (long long)c->m.chan, (long long)c->cidx, (long long)left,
                             c->final_detail);
        }
        if (left > 0)
            FX_WRN("mpsc consumer %lld/%lld closed with %lld acknowledged message(s) not "
                   "committed (%s); they will be delivered again",
                   (long long)c->m.chan, (long long)c->cidx, (long long)left, c->final_detail);
        else if (c->final_err)
            FX_WRN("mpsc consumer %lld/%lld close: final commit failed: %s (%s); offsets are "
                   "committed, payloads left behind expire with the payload lease",
                   (long long)c->m.chan, (long long)c->cidx, fx_errname(c->final_err),
                   c->final_detail);
    }
    bool deleted = false;
    if (c->member_written && fx__mq_op_enter(cl) == FX_OK) {
        fx_del_req dr = {.key = fx_mq_key_slice(&c->k_member)};
        fx_err e = fx_etcd_delete(cl->etcd, &dr, NULL, cl->close_timeout_ms);
        if (e)
            FX_WRN("mpsc consumer %lld/%lld close: deleting the membership failed: %s (%s); the "
                   "member lease TTL removes it",
                   (long long)c->m.chan, (long long)c->cidx, fx_errname(e), fx_err_detail());
        else
            deleted = true;
        fx__mq_op_leave(cl);
    }
    mgr_release(&c->m);

    pthread_mutex_lock(&c->mu);
    c->member_deleted = deleted; /* read by the MPMC close once this close has returned */
    pthread_mutex_unlock(&c->mu);
    life_finish(&c->lf, &c->mu, &c->cv, cl, &c->ep, !c->m.sub);
    return FX_OK;
}

fx_err fx_mpsc_consumer_close(fx_mpsc_consumer *c)
{
    if (!c) return fx_seterr(FX_EINVAL, "mpsc consumer close: NULL");
    return cons_close_impl(c, false, NULL);
}

void fx_mpsc_consumer_free(fx_mpsc_consumer *c)
{
    if (!c) return;
    cons_close_impl(c, true, NULL);
    life_wait_finished(&c->lf, &c->mu, &c->cv);
    cons_destroy(c);
}

bool fx__mpsc_consumer_membership_deleted(const fx_mpsc_consumer *c)
{
    if (!c) return false;
    fx_mpsc_consumer *q = (fx_mpsc_consumer *)c;
    pthread_mutex_lock(&q->mu);
    bool d = q->member_deleted;
    pthread_mutex_unlock(&q->mu);
    return d;
}

fx_err fx__mpsc_consumer_fault(const fx_mpsc_consumer *c)
{
    if (!c) return FX_OK;
    fx_mpsc_consumer *q = (fx_mpsc_consumer *)c;
    pthread_mutex_lock(&q->mu);
    fx_err f = q->lf.fault;
    pthread_mutex_unlock(&q->mu);
    return f;
}

void fx__mpsc_consumer_stats(const fx_mpsc_consumer *c, fx__mpsc_stats *out)
{
    if (c && out) stats_copy(&c->st, out);
}

int64_t fx__mpsc_consumer_chan(const fx_mpsc_consumer *c) { return c ? c->m.chan : -1; }
int64_t fx__mpsc_consumer_idx(const fx_mpsc_consumer *c) { return c ? c->cidx : -1; }

static bool cons_abort_requested(fx_mpsc_consumer *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->lf.stop;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Resume points: every consume offset of the channel, read once. */
static fx_err read_resume(fx_mpsc_consumer *c)
{
    fx_mq_client *cl = c->c;
    fx_mq_key pre;
    fx_err e = key_err(fx_mq_prefix_consume_offsets(&cl->keys, c->m.chan, &pre), "prefix");
    if (e) return e;
    uint8_t end[FX_MQ_KEY_CAP];
    size_t el = fx_prefix_end(fx_mq_key_slice(&pre), end);
    fx_range_req rq = {.key = fx_mq_key_slice(&pre), .range_end = {end, el}};
    fx_range_resp rr = {0};
    if ((e = fx_etcd_range(cl->etcd, &rq, &rr, cl->op_timeout_ms))) {
        fx_range_resp_free(&rr);
        return e;
    }
    c->resume = rr.n_kvs ? calloc(rr.n_kvs, sizeof *c->resume) : NULL;
    if (rr.n_kvs && !c->resume) {
        fx_range_resp_free(&rr);
        return fx_seterr(FX_ENOMEM, "mpsc consumer: out of memory");
    }
    for (size_t i = 0; i < rr.n_kvs; i++) {
        int64_t ch, pidx, off;
        const fx_kv *kv = &rr.kvs[i];
        if (fx_mq_parse_consume_offset_key(&cl->keys, (fx_slice){kv->key.data, kv->key.len}, &ch,
                                           &pidx) ||
            ch != c->m.chan || fx_mq_consume_offset_decode(kv->value.data, kv->value.len, &off)) {
            FX_WRN("mpsc consumer %lld: ignoring a malformed consume offset entry",
                   (long long)c->m.chan);
            continue;
        }
        c->resume[c->n_resume++] = (resume_pt){pidx, off};
    }
    fx_range_resp_free(&rr);
    /* Producers with a consume offset are tracked at once (their produce offset comes from the
     * watch snapshot). */
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_resume; i++) ps_add(c, c->resume[i].pidx);
    pthread_mutex_unlock(&c->mu);
    return FX_OK;
}

static fx_err cons_build(fx_mpsc_consumer *c, int64_t chan, const fx__mpsc_parent *parent)
{
    fx_mq_client *cl = c->c;
    fx_err e = mgr_open(cl, chan, parent, cons_on_expired, c, &c->m);
    if (e) return e;
    if (cons_abort_requested(c)) return fx_seterr(FX_ECLOSED, "mpsc consumer closed while opening");
    fx_mq_key k;
    if ((e = key_err(fx_mq_key_alloc_consumer_idx(&cl->keys, chan, &k), "consumer counter")))
        return e;
    bool fresh = parent && parent->fresh_meta; /* see fx__mpsc_parent: nothing to read back */
    if ((e = (fresh ? fx__mq_alloc_ids_fresh : fx__mq_alloc_ids)(
             cl, &k, c->m.meta.global_long_lease_id, 1, &c->cidx)))
        return e;
    if ((e = key_err(fx_mq_key_consumer_member(&cl->keys, chan, c->cidx, &c->k_member), "member")))
        return e;
    fx_mq_key cpre;
    if ((e = key_err(fx_mq_prefix_consumer_members(&cl->keys, chan, &cpre), "consumer prefix")))
        return e;
    fx_mq_member_meta mm = {.member_id = c->cidx, .role = FX_MQ_ROLE_CONSUMER,
                            .has_external_client_id = true};
    snprintf(mm.external_client_id, sizeof mm.external_client_id, "%s", cl->client_id);
    char *js = NULL;
    if ((e = fx_mq_member_meta_encode(&mm, &js))) return e;
    fx_slice cps = fx_mq_key_slice(&cpre);
    e = member_txn(cl, fx_mq_key_slice(&c->k_member), FX_SLICE_STR(js), c->m.member_lease, NULL,
                   (fx_slice){NULL, 0}, 0, &cps);
    free(js);
    if (e) return e;
    c->member_written = true;
    if (cons_abort_requested(c)) return fx_seterr(FX_ECLOSED, "mpsc consumer closed while opening");
    if (!fresh && (e = read_resume(c))) return e;
    fx_pwatch *pw = NULL;
    if ((e = fx__mq_pwatch(cl, &pw))) return e;
    if ((e = fx_pwatch_add(pw, chan, cons_pwatch_cb, c))) return e;
    c->pw = pw;
    if (!fresh && (e = read_produce(c))) return e;
    struct fx__cpool *cp = NULL;
    if ((e = fx__mq_cpool(cl, &cp))) return e;
    pthread_mutex_lock(&cp->mu);
    c->cq_on = true;
    pthread_mutex_unlock(&cp->mu);
    c->cq_attached = true;
    pthread_mutex_lock(&c->mu); /* acks may have come in already (none before the first get) */
    if (commit_dirty(c)) commit_kick(c);
    pthread_mutex_unlock(&c->mu);
    return FX_OK;
}

static fx_err cons_open(fx_mq_client *cl, int64_t chan, const fx__mpsc_parent *parent,
                        fx_mpsc_consumer **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mpsc consumer open: NULL out");
    *out = NULL;
    if (!cl || chan < 0) return fx_seterr(FX_EINVAL, "mpsc consumer open: bad arguments");
    if (parent && parent->member_lease <= 0)
        return fx_seterr(FX_EINVAL, "mpsc consumer open: parent member lease required");
    fx_mpsc_consumer *c = calloc(1, sizeof *c);
    if (!c) return fx_seterr(FX_ENOMEM, "mpsc consumer open: out of memory");
    c->c = cl;
    c->cidx = -1;
    c->m.chan = chan;
    c->m.sub = parent != NULL;
    c->lf.constructing = true;
    if (pthread_mutex_init(&c->mu, NULL) || pthread_mutex_init(&c->get_mu, NULL) ||
        fx_cond_init_monotonic(&c->cv) || fx_cond_init_monotonic(&c->data_cv) ||
        fx_cond_init_monotonic(&c->commit_cv)) {
        free(c);
        return fx_seterr(FX_ENOMEM, "mpsc consumer open: sync init failed");
    }
    fx_err e;
    if (!parent) {
        c->ep.close = cons_close_cb;
        c->ep.close_ex = cons_close_ex_cb;
        c->ep.self = c;
        if ((e = fx__mq_register(cl, &c->ep))) {
            cons_destroy(c);
            return e;
        }
    }
    if ((e = fx__mq_op_enter(cl)) == FX_OK) {
        e = cons_build(c, chan, parent);
        fx__mq_op_leave(cl);
    }
    pthread_mutex_lock(&c->mu);
    c->lf.constructing = false;
    bool aborted = c->lf.stop;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (e || aborted) {
        if (!e) e = fx_seterr(FX_ECLOSED, "mpsc consumer closed while opening");
        char d[512];
        snprintf(d, sizeof d, "%s", fx_err_detail());
        fx_mpsc_consumer_free(c);
        return fx_seterr(e, "%s", d);
    }
    FX_DBG("mpsc consumer %lld/%lld open", (long long)chan, (long long)c->cidx);
    *out = c;
    return FX_OK;
}

fx_err fx_mpsc_consumer_open(fx_mq_client *c, int64_t chan, fx_mpsc_consumer **out)
{
    return cons_open(c, chan, NULL, out);
}

fx_err fx__mpsc_consumer_open_sub(fx_mq_client *c, int64_t chan, const fx__mpsc_parent *parent,
                                  fx_mpsc_consumer **out)
{
    if (!parent) {
        if (out) *out = NULL;
        return fx_seterr(FX_EINVAL, "sub-consumer open: NULL parent");
    }
    return cons_open(c, chan, parent, out);
}
