/* chan.h -- a channel of the daemon (dm_chan): the struct, its creation with its metrics, its
 * references and its MPMC id cache. The capture side (subscriptions, producer thread) is
 * capture.c, the claims are claim.c, the views house-keeping refreshes are daemon.c.
 *
 * Ownership and threads:
 *  - dm_chan_new creates a channel with one reference, the caller's (the daemon's, while the
 *    channel is configured); capture subscriptions and house-keeping snapshots hold more
 *    (dmctx.h, docs/ARCHITECTURE.md "Handles and lifetimes" rule 14). The last
 *    dm_chan_unref frees it, from any thread: what is still queued is answered (a dead letter's
 *    completion hook runs with FX_ECLOSED, pqueue.h) or freed.
 *  - Immutable after dm_chan_new: d, mq, name, deliver_prefix, subjects, s, is_dlq, the metric
 *    pointers (m; every channel metric of the daemon is registered here).
 *  - `mu` guards the MPMC id cache (mpmc, have_mpmc), attach_err and the house-keeping views.
 *  - Lock order (dmctx.h): reg -> mu / q.mu.
 */
#ifndef FX_PLUGIN_CHAN_H
#define FX_PLUGIN_CHAN_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "fluxon_mq.h"
#include "fx_err.h"
#include "metrics.h"
#include "pqueue.h"


typedef struct fx_daemon fx_daemon; /* daemon.h: the channel only points back to it */
typedef struct dm_chan dm_chan;
typedef struct dm_claim dm_claim;

typedef struct dm_chan_metrics {
    fx_metric *captured, *stored, *delivered, *acked, *redelivered, *dead, *dropped,
        *invalid_acks, *backlog, *claims, *store_errors, *foreign_headers, *own_skipped,
        *full_dropped, *duplicates, *inflight, *inflight_peak, *reclaimed, *dedup_forgotten,
        *dedup_ids, *nak_delay_held;
} dm_chan_metrics;

struct dm_chan {
    fx_daemon *d;
    fx_mq_client *mq; /* the daemon's MQ client (borrowed) */
    char *name;
    char *deliver_prefix;
    char **subjects;
    size_t n_subjects;
    fx_chan_settings s;
    bool is_dlq;
    dm_chan_metrics m;

    atomic_int refs;         /* see the top of this file */
    /* capture subs (destroyed with the channel); subs, sub_dropped and n_subs are set by
     * dm_chan_start under d->reg (write) and read by house-keeping under d->reg (read) */
    natsSubscription **subs;
    int64_t *sub_dropped;    /* last natsSubscription_GetDropped seen (house-keeping) */
    size_t n_subs;

    dm_pq q;
    pthread_t prod_thr;
    bool prod_started;
    /* The producer thread's state (capture.c: its chanq producer, batches in flight, dedup
     * window): created by dm_chan_start, freed by dm_chan_stop_producer_wait. */
    struct dm_cap *cap;

    pthread_mutex_t mu; /* mpmc id cache, attach_err */
    int64_t mpmc;
    bool have_mpmc;
    /* The producer is open: the channel's data leases are registered and kept alive (written by
     * the producer thread, read by /healthz). attach_err: why it is not (under mu). */
    atomic_bool attached;
    char attach_err[320];

    dm_claim *claims; /* under d->reg */
    atomic_bool draining;
};

/* A new channel of cc of daemon d, on the MQ client mq, with its metrics registered in reg; one
 * reference (the caller's); NULL when out of memory. Not started (capture.c dm_chan_start). */
dm_chan *dm_chan_new(fx_daemon *d, fx_mq_client *mq, fx_metrics *reg, const fx_chan_config *cc);
dm_chan *dm_chan_ref(dm_chan *ch);
void dm_chan_unref(dm_chan *ch); /* the last one frees it (any thread, NULL ignored) */
/* Does cc configure exactly this channel (a reload keeps it running)? */
bool dm_chan_same(const dm_chan *ch, const fx_chan_config *cc);
/* Resolve the channel's MPMC id (cached; force re-resolves). Any thread. */
fx_err dm_chan_resolve(dm_chan *ch, bool force, int64_t *out);
void dm_chan_forget_mpmc(dm_chan *ch);

#endif
