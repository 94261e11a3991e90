/* lease_mgr.c -- the LeaseManager: registry, keepalive thread, expiry notification.
 *
 * Implementation notes (the contract is lease_mgr.h):
 *  - One mutex `mu` guards everything in the manager, entries and handles. Two condvars on the
 *    monotonic clock: `wake` (the thread sleeps on it until the earliest due entry, a
 *    registration or free()) and `done` (broadcast when a keepalive call or a callback returns;
 *    release() and probe retries wait on it).
 *  - The thread takes one due entry at a time, marks it busy, copies what the call needs and
 *    calls the backend with the lock released. The entry cannot be freed while busy: the last
 *    release() unlinks it (state RELEASED) and the thread frees it when the call returns.
 *  - A backend ctx is borrowed per handle. The thread calls through the backend of the entry's
 *    first handle. A release() whose handle's ctx is the one in use by a running call (and no
 *    other handle of the entry has that ctx) waits for that call to return (bounded by the call's
 *    deadline, min(op_timeout, cadence)), so after release() returns the manager no longer
 *    touches that ctx for this entry. Not from the manager thread (there is no call running while
 *    a callback runs there).
 *  - Transport failure (FX_ETIMEDOUT, FX_EUNAVAIL, FX_ECANCELED) of one backend at time T moves
 *    every other renewing entry of the same backend uid that is due before T + retry_interval to
 *    T + retry_interval (counted in stats.deferred). Entries of a dead backend thus line up and
 *    one call per retry interval probes it, instead of each waiting out its own deadline.
 *  - Expiry: an entry goes to EXPIRED (final), every handle gets `expired` set and, if it has a
 *    callback, a pending notification. The thread delivers pending notifications (one at a time,
 *    lock released, handle marked in_cb) before doing any more keepalives.
 *  - A handle released from inside its own callback (on the manager thread) is unlinked at once
 *    and marked zombie; the thread frees it when the callback returns.
 */
#include "lease_mgr.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"

#define LM_DEF_OP_TIMEOUT_MS 1500
#define LM_DEF_RETRY_MS 200
#define LM_DEF_PROBE_MS 5000
#define LM_PROBE_ATTEMPTS 3
#define LM_LOG_INTERVAL_MS 30000
#define LM_IDLE_WAIT_MS 1000 /* the thread re-checks at least this often (bounded waits) */

typedef enum { LS_ACTIVE = 0, LS_RETRYING, LS_EXPIRED, LS_RELEASED } lm_state;

static const char *const lm_state_name[] = {"active", "retrying", "expired", "released"};

typedef struct lm_entry lm_entry;

struct fx_lease {
    fx_lease *prev, *next; /* in the entry's handle list */
    fx_lease_mgr *m;
    lm_entry *e;
    fx_lease_backend b; /* b.uid points at e->uid */
    int64_t id;
    int64_t ttl_s;
    fx_lease_expired_fn fn;
    void *arg;
    _Atomic bool expired;
    bool pending; /* a notification is due */
    bool in_cb;   /* its callback is running on the manager thread */
    bool zombie;  /* released from inside its own callback; the thread frees it */
};

struct lm_entry {
    lm_entry *next; /* in the manager's registry */
    char *uid;
    int64_t ttl_s;
    int64_t id;
    int64_t cadence_ms;
    int64_t due_ms;
    lm_state state;
    fx_lease *handles;
    size_t nhandles;
    bool busy; /* a keepalive call is running on it */
    int64_t ok_until_ms; /* fx_lease_confirmed_until_ms: last answered call's start + its TTL */
    uint64_t keepalives;
    uint64_t failures;
    fx_log_slot log_slot;
};

struct fx_lease_mgr {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t done;
    pthread_t thread;
    bool closing;
    lm_entry *entries;
    size_t npending; /* handles with a pending notification */
    bool cb_running; /* an expiry callback is running (mu released) */
    /* the running keepalive call */
    bool io_busy;
    void *io_ctx;
    uint64_t io_seq;
    int op_timeout_ms;
    int retry_ms;
    int probe_ms;
    fx_lease_mgr_stats st;
};

/* Set on the manager thread: lets release() know it runs inside a callback. */
static _Thread_local fx_lease_mgr *lm_self;

/* ---- helpers -------------------------------------------------------------------------------- */

static int64_t lm_cadence_ms(int64_t ttl_s)
{
    int64_t c = ttl_s / 3;
    if (c < 1) c = 1;
    /* Long leases (a channel's retention, days) are renewed at least every minute, so a holder
     * that dies leaves them almost their whole TTL, not two thirds of it. */
    if (c > FX_LEASE_MAX_CADENCE_S) c = FX_LEASE_MAX_CADENCE_S;
    return c * 1000;
}

static int lm_min_timeout(int64_t a, int64_t b)
{
    int64_t t = a < b ? a : b;
    if (t > INT32_MAX) t = INT32_MAX;
    if (t < 1) t = 1;
    return (int)t;
}

static bool lm_is_transport(fx_err r)
{
    return r == FX_ETIMEDOUT || r == FX_EUNAVAIL || r == FX_ECANCELED;
}

/* The one place where an entry changes state. Called with mu held. */
static void lm_set_state(lm_entry *e, lm_state to, const char *why)
{
    if (e->state == to) return;
    FX_DBG("lease %" PRId64 " (ttl %" PRId64 "s, %s): %s -> %s (%s)", e->id, e->ttl_s, e->uid,
           lm_state_name[e->state], lm_state_name[to], why);
    e->state = to;
}

static lm_entry *lm_find(fx_lease_mgr *m, const char *uid, int64_t ttl_s, int64_t id)
{
    for (lm_entry *e = m->entries; e; e = e->next)
        if (e->ttl_s == ttl_s && e->id == id && strcmp(e->uid, uid) == 0) return e;
    return NULL;
}

static void lm_unlink_entry(fx_lease_mgr *m, lm_entry *e)
{
    for (lm_entry **pp = &m->entries; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            e->next = NULL;
            return;
        }
    }
}

static void lm_free_entry(lm_entry *e)
{
    free(e->uid);
    free(e);
}

/* Entry is expired for good: flag every handle and queue its notification. mu held. */
static void lm_mark_expired(fx_lease_mgr *m, lm_entry *e, const char *why)
{
    if (e->state == LS_EXPIRED || e->state == LS_RELEASED) return;
    lm_set_state(e, LS_EXPIRED, why);
    m->st.expired++;
    FX_WRN("lease %" PRId64 " (ttl %" PRId64 "s, %s) expired (%s); notifying %zu holder(s)", e->id,
           e->ttl_s, e->uid, why, e->nhandles);
    for (fx_lease *h = e->handles; h; h = h->next) {
        atomic_store(&h->expired, true);
        if (h->fn && !h->pending) {
            h->pending = true;
            m->npending++;
        }
    }
    pthread_cond_broadcast(&m->wake);
}

/* ---- the manager thread ----------------------------------------------------------------------- */

/* Deliver one pending notification. mu held on entry and exit (released during the callback). */
static void lm_deliver_one(fx_lease_mgr *m)
{
    fx_lease *h = NULL;
    for (lm_entry *e = m->entries; e && !h; e = e->next)
        for (fx_lease *x = e->handles; x; x = x->next)
            if (x->pending) {
                h = x;
                break;
            }
    if (!h) { /* counter out of sync would be a bug; recover */
        assert(!"npending without a pending handle");
        m->npending = 0;
        return;
    }
    h->pending = false;
    m->npending--;
    h->in_cb = true;
    m->cb_running = true;
    fx_lease_expired_fn fn = h->fn;
    void *arg = h->arg;
    int64_t id = h->id;
    pthread_mutex_unlock(&m->mu);
    fn(arg, h, id);
    pthread_mutex_lock(&m->mu);
    m->cb_running = false;
    h->in_cb = false;
    if (h->zombie) free(h);
    pthread_cond_broadcast(&m->done);
}

/* Earliest due renewing entry, or NULL. mu held. */
static lm_entry *lm_earliest(fx_lease_mgr *m)
{
    lm_entry *best = NULL;
    for (lm_entry *e = m->entries; e; e = e->next) {
        if (e->state != LS_ACTIVE && e->state != LS_RETRYING) continue;
        if (e->nhandles == 0 || e->busy) continue;
        if (!best || e->due_ms < best->due_ms) best = e;
    }
    return best;
}

/* One keepalive of e (due). mu held on entry and exit (released during the call). */
static void lm_renew(fx_lease_mgr *m, lm_entry *e)
{
    fx_lease_backend b = e->handles->b;
    int64_t id = e->id;
    int timeout = lm_min_timeout(m->op_timeout_ms, e->cadence_ms);
    e->busy = true;
    m->io_busy = true;
    m->io_ctx = b.ctx;
    m->io_seq++;
    e->keepalives++;
    m->st.keepalives++;
    int64_t start = fx_now_ms();
    pthread_mutex_unlock(&m->mu);

    int64_t ttl = 0;
    fx_err r = b.keepalive(b.ctx, id, &ttl, timeout);

    pthread_mutex_lock(&m->mu);
    e->busy = false;
    m->io_busy = false;
    m->io_ctx = NULL;
    pthread_cond_broadcast(&m->done);
    if (e->state == LS_RELEASED) { /* last handle went away during the call */
        lm_free_entry(e);
        return;
    }
    if (e->state == LS_EXPIRED) return; /* a registration probe found it expired meanwhile */
    int64_t now = fx_now_ms();
    if (r == FX_OK && ttl > 0) {
        if (start + ttl * 1000 > e->ok_until_ms) e->ok_until_ms = start + ttl * 1000;
        e->due_ms = start + e->cadence_ms;
        if (e->due_ms < now) e->due_ms = now;
        lm_set_state(e, LS_ACTIVE, "keepalive ok");
        return;
    }
    if (r == FX_OK || r == FX_ELEASE_EXPIRED) {
        lm_mark_expired(m, e, r == FX_OK ? "keepalive answered ttl <= 0" : "keepalive: expired");
        return;
    }
    e->failures++;
    m->st.keepalive_failures++;
    fx_log_ratelimited(&e->log_slot, LM_LOG_INTERVAL_MS, FX_LOG_WRN,
                       "lease %" PRId64 " (ttl %" PRId64 "s, %s): keepalive failed: %s (%s); "
                       "retrying every %d ms",
                       id, e->ttl_s, e->uid, fx_errname(r), fx_err_detail(), m->retry_ms);
    lm_set_state(e, LS_RETRYING, fx_errname(r));
    int64_t retry_at = now + m->retry_ms;
    e->due_ms = retry_at;
    if (!lm_is_transport(r)) return;
    for (lm_entry *o = m->entries; o; o = o->next) {
        if (o == e || o->busy || (o->state != LS_ACTIVE && o->state != LS_RETRYING)) continue;
        if (o->due_ms >= retry_at || strcmp(o->uid, e->uid) != 0) continue;
        o->due_ms = retry_at;
        m->st.deferred++;
    }
}

static void *lm_thread(void *arg)
{
    fx_thread_name("fx-leases");
    fx_lease_mgr *m = arg;
    lm_self = m;
    pthread_mutex_lock(&m->mu);
    while (!m->closing) {
        if (m->npending) {
            lm_deliver_one(m);
            continue;
        }
        int64_t now = fx_now_ms();
        lm_entry *e = lm_earliest(m);
        if (e && e->due_ms <= now) {
            lm_renew(m, e);
            continue;
        }
        int64_t until = now + LM_IDLE_WAIT_MS;
        if (e && e->due_ms < until) until = e->due_ms;
        struct timespec ts = fx_deadline_ts(until);
        pthread_cond_timedwait(&m->wake, &m->mu, &ts);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* ---- public API --------------------------------------------------------------------------------- */

fx_err fx_lease_mgr_new(const fx_lease_mgr_opts *opts, fx_lease_mgr **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "lease_mgr_new: out is NULL");
    *out = NULL;
    if (opts && (opts->op_timeout_ms < 0 || opts->retry_interval_ms < 0 ||
                 opts->probe_timeout_ms < 0))
        return fx_seterr(FX_EINVAL, "lease_mgr_new: negative timeout");
    fx_lease_mgr *m = calloc(1, sizeof *m);
    if (!m) return fx_seterr(FX_ENOMEM, "lease_mgr_new: out of memory");
    m->op_timeout_ms = opts && opts->op_timeout_ms ? opts->op_timeout_ms : LM_DEF_OP_TIMEOUT_MS;
    m->retry_ms = opts && opts->retry_interval_ms ? opts->retry_interval_ms : LM_DEF_RETRY_MS;
    m->probe_ms = opts && opts->probe_timeout_ms ? opts->probe_timeout_ms : LM_DEF_PROBE_MS;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return fx_seterr(FX_ENOMEM, "lease_mgr_new: mutex init failed");
    }
    if (fx_cond_init_monotonic(&m->wake) != 0) {
        pthread_mutex_destroy(&m->mu);
        free(m);
        return fx_seterr(FX_ENOMEM, "lease_mgr_new: condvar init failed");
    }
    if (fx_cond_init_monotonic(&m->done) != 0) {
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->mu);
        free(m);
        return fx_seterr(FX_ENOMEM, "lease_mgr_new: condvar init failed");
    }
    if (pthread_create(&m->thread, NULL, lm_thread, m) != 0) {
        pthread_cond_destroy(&m->done);
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->mu);
        free(m);
        return fx_seterr(FX_ENOMEM, "lease_mgr_new: cannot start thread");
    }
    *out = m;
    return FX_OK;
}

void fx_lease_mgr_free(fx_lease_mgr *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    assert(m->st.handles == 0 && "fx_lease_mgr_free with live handles");
    if (m->st.handles)
        FX_WRN("lease manager freed with %" PRIu64 " live handle(s); releasing them",
               m->st.handles);
    m->closing = true;
    pthread_cond_broadcast(&m->wake);
    pthread_cond_broadcast(&m->done);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);

    /* The thread is gone: no call or callback runs. Free leftovers. */
    lm_entry *e = m->entries;
    while (e) {
        lm_entry *next = e->next;
        fx_lease *h = e->handles;
        while (h) {
            fx_lease *hn = h->next;
            free(h);
            h = hn;
        }
        lm_free_entry(e);
        e = next;
    }
    pthread_cond_destroy(&m->done);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* Registration probe: up to LM_PROBE_ATTEMPTS calls within probe_ms. *calls counts the calls. */
static fx_err lm_probe(fx_lease_mgr *m, const fx_lease_backend *b, int64_t ttl_s, int64_t id,
                       uint64_t *calls, int64_t *ok_until)
{
    int64_t deadline = fx_now_ms() + m->probe_ms;
    int64_t cadence = lm_cadence_ms(ttl_s);
    fx_err last = FX_ETIMEDOUT;
    char detail[256] = "probe budget exhausted";
    for (int attempt = 0; attempt < LM_PROBE_ATTEMPTS; attempt++) {
        int64_t left = fx_ms_left(deadline);
        if (left <= 0) break;
        pthread_mutex_lock(&m->mu);
        bool closing = m->closing;
        if (!closing) m->st.keepalives++;
        pthread_mutex_unlock(&m->mu);
        if (closing) return fx_seterr(FX_ECLOSED, "lease manager closing");
        (*calls)++;
        int64_t ttl = 0;
        int64_t per_call = m->op_timeout_ms < cadence ? m->op_timeout_ms : cadence;
        int64_t start = fx_now_ms();
        fx_err r = b->keepalive(b->ctx, id, &ttl, lm_min_timeout(per_call, left));
        if (r == FX_OK && ttl > 0) {
            *ok_until = start + ttl * 1000;
            return FX_OK;
        }
        if (r == FX_OK || r == FX_ELEASE_EXPIRED)
            return fx_seterr(FX_ELEASE_EXPIRED, "lease %" PRId64 " on %s is expired or unknown",
                             id, b->uid);
        last = r;
        snprintf(detail, sizeof detail, "%s", fx_err_detail());
        FX_DBG("lease %" PRId64 " (%s): probe attempt %d failed: %s (%s)", id, b->uid,
               attempt + 1, fx_errname(r), detail);
        pthread_mutex_lock(&m->mu);
        m->st.keepalive_failures++;
        if (attempt + 1 < LM_PROBE_ATTEMPTS) {
            /* Pause retry_interval (within the budget); free() interrupts it. */
            int64_t until = fx_now_ms() + m->retry_ms;
            if (until > deadline) until = deadline;
            struct timespec ts = fx_deadline_ts(until);
            while (!m->closing && fx_now_ms() < until)
                if (pthread_cond_timedwait(&m->done, &m->mu, &ts) != 0) break;
        }
        pthread_mutex_unlock(&m->mu);
    }
    return fx_seterr(last, "lease %" PRId64 " on %s: registration probe failed: %s (%s)", id,
                     b->uid, fx_errname(last), detail);
}

fx_err fx_lease_register(fx_lease_mgr *m, const fx_lease_backend *b, int64_t ttl_s, int64_t id,
                         const fx_lease_reg_opts *opts, fx_lease **out)
{
    if (out) *out = NULL;
    if (!m || !b || !out || !b->uid || !b->uid[0] || !b->keepalive || ttl_s <= 0 || id <= 0)
        return fx_seterr(FX_EINVAL, "lease_register: invalid argument");
    bool skip_probe = opts && opts->skip_probe;

    pthread_mutex_lock(&m->mu);
    fx_err r = FX_OK;
    if (m->closing) {
        r = fx_seterr(FX_ECLOSED, "lease manager closing");
    } else {
        lm_entry *e = lm_find(m, b->uid, ttl_s, id);
        if (e && e->state == LS_EXPIRED)
            r = fx_seterr(FX_ELEASE_EXPIRED, "lease %" PRId64 " on %s is known expired", id,
                          b->uid);
        else if (e && opts && opts->join_held && e->state == LS_ACTIVE && e->nhandles > 0 &&
                 fx_now_ms() < e->due_ms)
            skip_probe = true;
    }
    pthread_mutex_unlock(&m->mu);
    if (r) return r;

    uint64_t probes = 0;
    /* skip_probe: the caller has just granted the lease (its TTL started a moment ago) */
    int64_t ok_until = fx_now_ms() + ttl_s * 1000;
    if (!skip_probe) {
        r = lm_probe(m, b, ttl_s, id, &probes, &ok_until);
        if (r == FX_ELEASE_EXPIRED) {
            pthread_mutex_lock(&m->mu);
            lm_entry *e = m->closing ? NULL : lm_find(m, b->uid, ttl_s, id);
            if (e) {
                e->keepalives += probes;
                lm_mark_expired(m, e, "registration probe: expired");
            }
            pthread_mutex_unlock(&m->mu);
        }
        if (r) return r;
    }

    fx_lease *h = calloc(1, sizeof *h);
    if (!h) return fx_seterr(FX_ENOMEM, "lease_register: out of memory");
    pthread_mutex_lock(&m->mu);
    if (m->closing) {
        pthread_mutex_unlock(&m->mu);
        free(h);
        return fx_seterr(FX_ECLOSED, "lease manager closing");
    }
    lm_entry *e = lm_find(m, b->uid, ttl_s, id);
    if (e && e->state == LS_EXPIRED) {
        pthread_mutex_unlock(&m->mu);
        free(h);
        return fx_seterr(FX_ELEASE_EXPIRED, "lease %" PRId64 " on %s is known expired", id,
                         b->uid);
    }
    if (!e) {
        e = calloc(1, sizeof *e);
        char *uid = strdup(b->uid);
        if (!e || !uid) {
            pthread_mutex_unlock(&m->mu);
            free(e);
            free(uid);
            free(h);
            return fx_seterr(FX_ENOMEM, "lease_register: out of memory");
        }
        e->uid = uid;
        e->ttl_s = ttl_s;
        e->id = id;
        e->cadence_ms = lm_cadence_ms(ttl_s);
        e->due_ms = fx_now_ms() + e->cadence_ms;
        e->state = LS_ACTIVE;
        e->next = m->entries;
        m->entries = e;
        m->st.entries++;
        FX_DBG("lease %" PRId64 " (ttl %" PRId64 "s, %s): registered, cadence %" PRId64 " ms",
               id, ttl_s, e->uid, e->cadence_ms);
        pthread_cond_broadcast(&m->wake);
    }
    e->keepalives += probes;
    /* a joined entry keeps its own record unless this probe (or grant) is later */
    if ((!skip_probe || e->nhandles == 0) && ok_until > e->ok_until_ms) e->ok_until_ms = ok_until;
    h->m = m;
    h->e = e;
    h->b = *b;
    h->b.uid = e->uid;
    h->id = id;
    h->ttl_s = ttl_s;
    h->fn = opts ? opts->on_expired : NULL;
    h->arg = opts ? opts->arg : NULL;
    atomic_init(&h->expired, false);
    h->next = e->handles;
    if (e->handles) e->handles->prev = h;
    e->handles = h;
    e->nhandles++;
    m->st.handles++;
    pthread_mutex_unlock(&m->mu);
    *out = h;
    return FX_OK;
}

void fx_lease_release(fx_lease *h)
{
    if (!h) return;
    fx_lease_mgr *m = h->m;
    bool on_thread = lm_self == m;
    pthread_mutex_lock(&m->mu);
    /* Its callback runs on the manager thread: wait until it returned (the callback must be
     * short; see the header). From the manager thread itself it is our own callback. */
    while (h->in_cb && !on_thread) pthread_cond_wait(&m->done, &m->mu);

    lm_entry *e = h->e;
    if (h->prev) h->prev->next = h->next;
    else e->handles = h->next;
    if (h->next) h->next->prev = h->prev;
    h->prev = h->next = NULL;
    e->nhandles--;
    m->st.handles--;
    if (h->pending) {
        h->pending = false;
        m->npending--;
    }
    bool ctx_still_used = false;
    for (fx_lease *x = e->handles; x; x = x->next)
        if (x->b.ctx == h->b.ctx) ctx_still_used = true;
    bool wait_io = !on_thread && e->busy && m->io_ctx == h->b.ctx && !ctx_still_used;
    uint64_t seq = m->io_seq;

    if (e->nhandles == 0) {
        lm_unlink_entry(m, e);
        m->st.entries--;
        lm_set_state(e, LS_RELEASED, "last handle released");
        if (!e->busy) lm_free_entry(e); /* else the thread frees it when its call returns */
    }
    if (h->in_cb) h->zombie = true; /* our own callback, on the manager thread */
    else free(h);

    /* The running call uses this handle's ctx: after release() the caller may free the ctx. */
    while (wait_io && m->io_busy && m->io_seq == seq) pthread_cond_wait(&m->done, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

int64_t fx_lease_id(const fx_lease *h) { return h ? h->id : 0; }

int64_t fx_lease_ttl(const fx_lease *h) { return h ? h->ttl_s : 0; }

bool fx_lease_is_expired(const fx_lease *h)
{
    return h ? atomic_load(&((fx_lease *)h)->expired) : false;
}

int64_t fx_lease_confirmed_until_ms(const fx_lease *h)
{
    if (!h) return 0;
    fx_lease_mgr *m = h->m;
    pthread_mutex_lock(&m->mu);
    int64_t r = h->e && h->e->state != LS_EXPIRED ? h->e->ok_until_ms : 0;
    pthread_mutex_unlock(&m->mu);
    return r;
}

void fx_lease_mgr_get_stats(fx_lease_mgr *m, fx_lease_mgr_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    *out = m->st;
    out->notify_pending = m->npending + (m->cb_running ? 1 : 0);
    pthread_mutex_unlock(&m->mu);
}

uint64_t fx_lease_mgr_entry_keepalives(fx_lease_mgr *m, const char *backend_uid, int64_t ttl_s,
                                       int64_t id)
{
    if (!m || !backend_uid) return 0;
    pthread_mutex_lock(&m->mu);
    lm_entry *e = lm_find(m, backend_uid, ttl_s, id);
    uint64_t n = e ? e->keepalives : 0;
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* ---- backends ------------------------------------------------------------------------------------ */

static fx_err lm_etcd_keepalive(void *ctx, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    return fx_etcd_lease_keepalive_lane(ctx, id, out_ttl, timeout_ms);
}

static fx_err lm_kv_keepalive(void *ctx, int64_t id, int64_t *out_ttl, int timeout_ms)
{
    return fx_kv_keepalive_lease(ctx, id, out_ttl, timeout_ms);
}

fx_lease_backend fx_lease_backend_etcd(fx_etcd *c)
{
    fx_lease_backend b = {NULL, lm_etcd_keepalive, c};
    if (c) b.uid = fx_etcd_uid(c);
    return b;
}

fx_lease_backend fx_lease_backend_kv(fx_kv_store *s)
{
    fx_lease_backend b = {NULL, lm_kv_keepalive, s};
    if (s) b.uid = fx_kv_backend_uid(s);
    return b;
}
