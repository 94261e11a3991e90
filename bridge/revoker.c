/* revoker.c -- background retries of member-lease revokes. Contract: revoker.h. */
#include "revoker.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"

typedef struct pending {
    int64_t lease;
    int64_t until_ms;
} pending;

struct fx_revoker {
    fx_etcd *etcd;
    fx_exec_strand *strand; /* rounds run on it (kind FX_EXEC_K_REVOKE) */
    pthread_mutex_t mu;
    bool stop;
    pending items[FX_REVOKER_MAX]; /* under mu; items[0] is the oldest */
    size_t n;
    fx_revoker_stats st;
};

static void remove_at(fx_revoker *r, size_t i)
{
    memmove(&r->items[i], &r->items[i + 1], (r->n - i - 1) * sizeof r->items[0]);
    r->n--;
}

/* One round: try every pending lease once (the lock is dropped around each call). */
static void round_once(fx_revoker *r)
{
    pthread_mutex_lock(&r->mu);
    size_t i = 0;
    while (i < r->n && !r->stop) {
        pending p = r->items[i];
        if (fx_now_ms() >= p.until_ms) {
            remove_at(r, i);
            r->st.expired++;
            FX_DBG("member lease %" PRId64 ": its TTL is over; no revoke needed", p.lease);
            continue;
        }
        r->st.attempts++;
        pthread_mutex_unlock(&r->mu);
        fx_err e = fx_etcd_lease_revoke(r->etcd, p.lease, FX_REVOKER_CALL_MS);
        pthread_mutex_lock(&r->mu);
        /* The list may have changed while unlocked (adds append, drops remove the oldest). */
        size_t at = r->n;
        for (size_t j = 0; j < r->n; j++)
            if (r->items[j].lease == p.lease) {
                at = j;
                break;
            }
        if (e == FX_OK || e == FX_ENOTFOUND || e == FX_ELEASE_EXPIRED) {
            if (at < r->n) remove_at(r, at);
            r->st.revoked++;
            FX_INF("member lease %" PRId64 ": revoked now that etcd answers (its role, ready and "
                   "membership keys are gone)", p.lease);
            i = at < i ? i - 1 : i;
            continue;
        }
        FX_DBG("member lease %" PRId64 ": revoke failed: %s; retrying", p.lease, fx_errname(e));
        break; /* etcd still unreachable: the rest wait for the next round */
    }
    pthread_mutex_unlock(&r->mu);
}

/* The strand's step: one round, then the next one FX_REVOKER_RETRY_MS later while any is left. */
static void revoker_step(void *arg)
{
    fx_revoker *r = arg;
    round_once(r);
    pthread_mutex_lock(&r->mu);
    bool more = r->n > 0 && !r->stop;
    pthread_mutex_unlock(&r->mu);
    if (more) fx_exec_strand_kick(r->strand, fx_now_ms() + FX_REVOKER_RETRY_MS);
}

fx_err fx_revoker_new(fx_etcd *etcd, fx_exec *ex, fx_revoker **out)
{
    if (!etcd || !ex || !out) return fx_seterr(FX_EINVAL, "revoker: NULL argument");
    fx_revoker *r = calloc(1, sizeof *r);
    if (!r) return fx_seterr(FX_ENOMEM, "revoker: out of memory");
    r->etcd = etcd;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        return fx_seterr(FX_ENOMEM, "revoker: mutex init");
    }
    fx_err e = fx_exec_strand_new(ex, FX_EXEC_K_REVOKE, revoker_step, r, &r->strand);
    if (e) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return e;
    }
    *out = r;
    return FX_OK;
}

void fx_revoker_add(fx_revoker *r, int64_t lease, int64_t until_ms)
{
    if (!r || lease <= 0) return;
    pthread_mutex_lock(&r->mu);
    for (size_t j = 0; j < r->n; j++)
        if (r->items[j].lease == lease) {
            pthread_mutex_unlock(&r->mu);
            return;
        }
    if (r->n == FX_REVOKER_MAX) {
        FX_WRN("member lease %" PRId64 ": revoker full (%d pending): dropping the oldest; its TTL "
               "reclaims it", r->items[0].lease, FX_REVOKER_MAX);
        remove_at(r, 0);
        r->st.dropped++;
    }
    r->items[r->n++] = (pending){.lease = lease, .until_ms = until_ms};
    r->st.added++;
    pthread_mutex_unlock(&r->mu);
    /* The caller has just tried once: the next try is a retry period away (a round already due
     * earlier covers this lease too). */
    fx_exec_strand_kick(r->strand, fx_now_ms() + FX_REVOKER_RETRY_MS);
}

void fx_revoker_get_stats(fx_revoker *r, fx_revoker_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    out->pending = r->n;
    pthread_mutex_unlock(&r->mu);
}

void fx_revoker_free(fx_revoker *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true; /* a running round ends after its current call */
    pthread_mutex_unlock(&r->mu);
    fx_exec_strand_free(r->strand); /* drops the timer, waits for a running round */
    if (r->n)
        FX_INF("revoker: %zu member lease revoke(s) left to their TTL at shutdown", r->n);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
