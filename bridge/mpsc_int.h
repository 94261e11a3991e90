/* mpsc_int.h -- what the three MPSC files share (internal; the MPSC's contract: fluxon_mq.h, and
 * the head comment of mpsc.c for the write and read paths):
 *   mpsc.c       create, the ChanManager (meta + the endpoint's four lease handles) and the
 *                membership txn, used by both endpoints;
 *   mpsc_prod.c  the producer: open/close and the batched, gap-free write path (payloads through
 *                plane.h);
 *   mpsc_cons.c  the consumer: open/close, the watch-driven read path, acks, commit rounds.
 * Ownership and thread rules: a chan_mgr and a life belong to one endpoint and are guarded by
 * that endpoint's `mu` (the life_* helpers say which of them take it); the helpers here keep no
 * state. A producer's puts are serialised by its put_mu; a consumer's commits run on its commit
 * slot (commit_pool.h) on the client's executor, one commit of an endpoint at a time. Neither endpoint file touches the other's
 * struct; the ChanManager functions of mpsc.c are called by the endpoint that owns the chan_mgr.
 */
#ifndef FX_BRIDGE_MPSC_INT_H
#define FX_BRIDGE_MPSC_INT_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"
#include "mq_int.h"
#include "plane.h"
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

/* Close states: lifecycle.h (`life` below). FX_LIFE_RETRY (standalone consumer only): a close
 * failed strongly (acknowledged messages could not be committed); the data path is closed, the
 * endpoint keeps its leases and membership, and the next close runs again (free() forces it to
 * finish). */

/* ---- shared pieces --------------------------------------------------------------------------- */

typedef struct stats {
    _Atomic uint64_t put_calls, put_msgs, put_txns, put_retries, offset_rereads, full_waits,
        full_errors, cap_checks, got_msgs, fetches, skipped_ids, acked, commits, commit_retries;
} stats;

static inline void stats_copy(const stats *s, fx__mpsc_stats *o)
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
    fx_mq_key k_meta; /* the channel's meta key: the bind and every put compare it exists */
} chan_mgr;

/* Endpoint lifecycle state (guarded by the endpoint's mu): lifecycle.h. */
typedef fx_life life;

/* A lease of the endpoint expired (expiry callback, endpoint mutex held): stop the data path and
 * remember the fault, armed (the next call reports it). Returns true the first time (the caller
 * logs). */
static inline bool life_lease_lost(life *lf)
{
    if (!fx_life_lease_lost(lf, 0)) return false;
    fx_life_fault_arm(lf);
    return true;
}

/* Entry gate of every data-path call (endpoint mutex held): FX_OK to proceed; FX_ELEASE_LOST once
 * after a lease loss (*self_close set: the caller runs the endpoint's close); FX_ECLOSED after. */
static inline fx_err life_gate(life *lf, const char *what, int64_t chan, int64_t idx, bool *self_close)
{
    fx_err e = fx_life_gate(lf);
    if (e == FX_ELEASE_LOST) {
        *self_close = true;
        return fx_seterr(FX_ELEASE_LOST, "mpsc %s %lld/%lld: a lease it depends on was lost", what,
                         (long long)chan, (long long)idx);
    }
    if (e) return fx_seterr(FX_ECLOSED, "mpsc %s closed", what);
    return FX_OK;
}

/* End of a close: mark CLOSED (wakes concurrent closers and waiting calls), unregister a
 * standalone endpoint from the client root (which may wait for the root's own close of it), then
 * leave the close. */
static inline void life_finish(life *lf, pthread_mutex_t *mu, pthread_cond_t *cv, fx_mq_client *c,
                        fx__mq_endpoint *ep, bool registered)
{
    pthread_mutex_lock(mu);
    fx_life_close_done(lf, cv, FX_OK);
    pthread_mutex_unlock(mu);
    if (registered) fx__mq_unregister(c, ep);
    pthread_mutex_lock(mu);
    fx_life_close_leave(lf, cv);
    pthread_mutex_unlock(mu);
}

/* free(): wait until the close has finished and no concurrent closer is still inside it. */
static inline void life_wait_finished(life *lf, pthread_mutex_t *mu, pthread_cond_t *cv)
{
    pthread_mutex_lock(mu);
    fx_life_wait_closed(lf, mu, cv);
    pthread_mutex_unlock(mu);
}

static inline bool transient(fx_err e)
{
    return e == FX_ETIMEDOUT || e == FX_EUNAVAIL || e == FX_ESERVER || e == FX_ENOSPACE;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline fx_err key_err(fx_err e, const char *what)
{
    return e ? fx_seterr(e, "mpsc: building %s key failed", what) : FX_OK;
}

/* Relative payload key of (pidx, id) in this channel's namespace. */
static inline fx_err pay_key(const chan_mgr *m, int64_t pidx, int64_t id, fx_mq_key *out)
{
    return m->sub ? fx_mq_payload_key(m->mpmc, m->chan, pidx, id, out)
                  : fx_mq_mpsc_payload_key(m->chan, pidx, id, out);
}

/* Count prefix of every payload of the channel. */
static inline fx_err pay_prefix(const chan_mgr *m, fx_mq_key *out)
{
    return m->sub ? fx_mq_payload_prefix_mpsc(m->mpmc, m->chan, out)
                  : fx_mq_mpsc_payload_prefix_chan(m->chan, out);
}

static inline fx_err pay_parse(const chan_mgr *m, fx_slice key, int64_t *pidx, int64_t *id)
{
    int64_t mp = 0, ch = 0;
    fx_err e = m->sub ? fx_mq_parse_payload_key(key, &mp, &ch, pidx, id)
                      : fx_mq_parse_mpsc_payload_key(key, &ch, pidx, id);
    if (e) return e;
    if (ch != m->chan || (m->sub && mp != m->mpmc))
        return fx_seterr(FX_EPROTO, "mpsc: payload key of another channel");
    return FX_OK;
}

/* Interruptible sleep on an endpoint condvar: returns early when *stop becomes true. */
static inline void nap(pthread_mutex_t *mu, pthread_cond_t *cv, const bool *stop, int64_t ms)
{
    int64_t dl = fx_now_ms() + ms;
    pthread_mutex_lock(mu);
    while (!*stop && fx_ms_left(dl) > 0) {
        struct timespec ts = fx_deadline_ts(dl);
        pthread_cond_timedwait(cv, mu, &ts);
    }
    pthread_mutex_unlock(mu);
}

/* ---- mpsc.c: ChanManager and membership (linked as fx__mpsc_*) ---------------------------- */

#define mgr_release fx__mpsc_mgr_release
#define read_meta fx__mpsc_read_meta
#define mgr_renew_long fx__mpsc_mgr_renew_long
#define mgr_open fx__mpsc_mgr_open
#define member_txn fx__mpsc_member_txn

void mgr_release(chan_mgr *m);
fx_err read_meta(fx_mq_client *c, int64_t chan, fx_mq_chan_meta *out);
fx_err mgr_renew_long(fx_mq_client *c, chan_mgr *m);
fx_err mgr_open(fx_mq_client *c, int64_t chan, const fx__mpsc_parent *parent,
                fx_lease_expired_fn cb, void *arg, chan_mgr *m);
fx_err member_txn(fx_mq_client *c, fx_slice meta, fx_slice key, fx_slice val, int64_t lease,
                  const fx_slice *wkey, fx_slice wval, int64_t wlease, const fx_slice *excl,
                  int64_t *create_rev);

#endif
