/* chanq_keeper.h -- the keeper of the channels a process consumes: what the channel consumers
 * (chanq_cons.h) need besides their own endpoints, in one object per MQ client.
 *
 * It owns:
 *  - the view of each channel it keeps (bridge/inspect.h, one etcd revision per refresh, every
 *    FX_CHANQ_VIEW_MS, and at once -- at most every FX_CHANQ_KICK_MIN_MS -- when a channel was
 *    kicked): the backlog gauge, the consumed parts holding a departed consumer's backlog (which
 *    a consumer of the channel adopts, chanq_cons.h), the backlog of each consumed part (a
 *    consumer's "pending"), and the idle parts a dead process left behind, which it reclaims
 *    (fx_mpmc_reclaim, at most FX_CHANQ_RECLAIM_SWEEP per refresh);
 *  - the release watch (fx_mq_release_watch_start): a consumer released anywhere kicks the view
 *    of its channel, so its backlog is adopted at once instead of at the next refresh;
 *  - the cache of each channel's MPMC id (fx_mpmc_resolve), shared by its consumers;
 *  - the consumers' blocking work, run off their owners' threads on the executor it borrows
 *    (bridge/executor.h, docs/EXECUTOR.md; details in bridge/chanq_int.h): opens, adoptions and
 *    closes as jobs of kind FX_EXEC_K_CHANQ, attempt-record writes as strands of kind
 *    FX_EXEC_K_WRITE.
 *
 * The channels it keeps: those named by fx_chanq_keeper_set_channels (the daemon names every
 * configured channel) and those with an open consumer.
 *
 * Threads: one keeper thread (views, release watch), started by fx_chanq_keeper_new and joined
 * by fx_chanq_keeper_free; the jobs run on the executor's threads of their kinds. Every call may come from any thread.
 * Every etcd call it makes has a deadline (the client's op_timeout_ms, the release watch's
 * FX_CHANQ_WATCH_START_MS).
 *
 * Ownership: the keeper borrows the client and the executor (both must outlive it; the executor
 * registers FX_EXEC_K_CHANQ and FX_EXEC_K_WRITE, as fx_exec_cfg_defaults does). Whoever created it frees it
 * after every consumer of it was closed (fx_chanq_cons_close) and before fx_mq_client_close:
 * fx_chanq_keeper_free stops and joins its thread, then waits until every job it submitted ran
 * (a queued close runs to its end, bounded by its own deadlines).
 */
#ifndef FX_BRIDGE_CHANQ_KEEPER_H
#define FX_BRIDGE_CHANQ_KEEPER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "fluxon_mq.h"

#define FX_CHANQ_VIEW_MS 2000         /* refresh of every kept channel's view */
#define FX_CHANQ_KICK_MIN_MS 100      /* kicked refreshes (released consumers): at most 10/s */
#define FX_CHANQ_STRANDED_MAX 16      /* departed consumers' parts remembered per refresh */
#define FX_CHANQ_RECLAIM_SWEEP 4      /* idle parts (dead processes') reclaimed per refresh */
#define FX_CHANQ_HELD_MAX 256         /* consumed parts whose backlog the view keeps */
#define FX_CHANQ_WATCH_START_MS 2000  /* deadline of a release-watch start (retried each second) */

typedef struct fx_chanq_keeper fx_chanq_keeper;

/* Start the keeper's thread; its jobs run on ex. on_reclaim (may be NULL): called on the keeper thread, with no
 * keeper lock held, after each idle part of channel `name` it reclaimed; it must not block. */
fx_err fx_chanq_keeper_new(fx_mq_client *mq, fx_exec *ex,
                           void (*on_reclaim)(void *arg, const char *name), void *arg,
                           fx_chanq_keeper **out);
/* Stop: the thread is joined, the release watch stops, the submitted jobs run to their end.
 * NULL is a no-op. No consumer may be open (a WRN line names one that is: it is leaked). */
void fx_chanq_keeper_free(fx_chanq_keeper *k);

/* The channels whose view is kept besides those with a consumer here (names copied). A channel
 * no longer named keeps its last view until it is named again. */
void fx_chanq_keeper_set_channels(fx_chanq_keeper *k, const char *const *names, size_t n);

/* Refresh the view of channel `name` soon (FX_CHANQ_KICK_MIN_MS). No I/O. */
void fx_chanq_keeper_kick(fx_chanq_keeper *k, const char *name);

typedef struct fx_chanq_chan_stats {
    bool known;         /* a view of the channel was read */
    int64_t backlog;    /* stored, unconsumed messages (0 while the channel is not mapped) */
    uint64_t reclaimed; /* idle parts reclaimed by this keeper since it started */
} fx_chanq_chan_stats;
/* The last view of channel `name` (no I/O). false: the keeper does not keep it. */
bool fx_chanq_keeper_stats(fx_chanq_keeper *k, const char *name, fx_chanq_chan_stats *out);

#endif
