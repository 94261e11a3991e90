/* chanq_prod.h -- the producer side of a channel as the daemon uses it: open (resolve or create,
 * keep attached, reopen after a lease loss) and a pipelined batch submit with an in-order
 * completion callback. No signature carries a sub-MPSC id: which sub-MPSC stores a batch, and
 * how batches in flight are kept apart, is this module's business (over fx_mpmc_put_hold).
 *
 * Submit (fx_chanq_submit): a batch of values and a done callback, as a request and its callback
 * (hiredis redisAsyncCommand). The batch is stored by one put job (or by the submitting thread
 * itself while at most one batch can be in flight), possibly in several runs: a run is a prefix of
 * what is left, stored into one sub-MPSC (the rest did not fit there and goes to another one).
 *
 * Completion order. For every stored run, done is called with last == false, the run's range of
 * the batch and its ids, BEFORE any other batch can be stored into that sub-MPSC. So for every
 * stream of ids (one sub-MPSC and producer index: fx_mq_msg_id chan, pidx) the done calls come in
 * the order the ids were assigned, whichever worker stored them. Then done is called exactly once
 * with last == true: with n == 0 when everything was stored, else with the range that was not
 * stored and why (e). Calls for one submit never overlap and come in this order; calls for
 * different submits run on different threads at once.
 *
 * Bounds and refusal. At most `inflight` batches are in flight (cfg; 0: FX_CHANQ_INFLIGHT),
 * and at most one per sub-MPSC the producer knows ready (fx_chanq_prod_streams, at least 1). A
 * submit past the bound is refused: FX_EFULL with nothing taken and no callback, counted in
 * fx_chanq_prod_stats.refused. A caller asks first (fx_chanq_prod_room) and waits for the room
 * hook (cfg.on_room), which runs after every batch's last completion, once its slot is free.
 * Every batch has a deadline (its deadline_ms argument): a put that cannot store the rest by
 * then ends with FX_ETIMEDOUT; each single put waits at most cfg.full_wait_ms for room in a full
 * channel (0: a full channel answers FX_EFULL at once).
 *
 * Reopen. A put that finds the producer closed (FX_ELEASE_LOST, FX_ECLOSED: a lease expired) ends
 * its batch with that error (the caller decides whether to submit the rest again) and marks the
 * producer for reopening: the next fx_chanq_prod_keep waits until no batch is in flight, closes,
 * forgets the resolved id (cfg.resolve with forget) and opens again. Opening is retried with a
 * backoff (100 ms doubling to 2 s); fx_chanq_submit opens on demand, waiting out the backoff
 * unless stopping.
 *
 * Threads. fx_chanq_prod_new/_free/_keep/_submit/_room/_streams/_member: one owner thread (the
 * dispatcher; in the daemon the channel's producer thread). fx_chanq_prod_stop, _stats_get and
 * _attached: any thread. A batch in flight is a put job of the executor (bridge/executor.h, kind
 * FX_EXEC_K_PUT: cfg.exec, or a private executor of `inflight` threads); done and on_room run on
 * that job's thread or on the owner thread (inline submits), with no lock of this module held:
 * they may call _stats_get and _attached, nothing owner-only. A put job the executor cancels (it
 * was freed first) ends its batch with FX_ECANCELED, nothing stored. A submit the executor
 * refuses (its put queue full: FX_EFULL, or stopping: FX_ECLOSED) takes nothing and calls nothing,
 * like the in-flight bound. Every piece of state lives in the fx_chanq_prod, none in file
 * statics.
 *
 * Lock order: a caller lock taken around _room (the daemon's producer queue lock) comes before
 * this module's lock; this module never calls out while holding it.
 */
#ifndef FX_BRIDGE_CHANQ_PROD_H
#define FX_BRIDGE_CHANQ_PROD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fluxon_mq.h"

#define FX_CHANQ_INFLIGHT 4        /* default bound on batches in flight */
#define FX_CHANQ_INFLIGHT_MAX 16   /* largest bound a cfg may ask for */
#define FX_CHANQ_BATCH_MAX 1024    /* values per submit */

typedef struct fx_chanq_prod fx_chanq_prod;

/* One completion (see the head of this file). first/n: a range of the submitted values;
 * ids[0..n): their ids when stored (e == FX_OK), else NULL. */
typedef struct fx_chanq_done {
    size_t first, n;
    const fx_mq_msg_id *ids;
    fx_err e;
    bool last;
} fx_chanq_done;
typedef void (*fx_chanq_done_fn)(void *arg, const fx_chanq_done *d);

/* Resolve the channel's MPMC id (forget: drop a cached id, *out unused). NULL: fx_mpmc_resolve
 * with name and chan, not cached. */
typedef fx_err (*fx_chanq_resolve_fn)(void *arg, bool forget, int64_t *out);

typedef struct fx_chanq_prod_cfg {
    const char *name;        /* channel name (copied) */
    fx_mq_chan_cfg chan;     /* for the default resolve */
    fx_chanq_resolve_fn resolve;
    void *resolve_arg;
    int64_t full_wait_ms;    /* one put's wait for room in a full channel */
    unsigned inflight;       /* bound on batches in flight; 0: FX_CHANQ_INFLIGHT */
    void (*on_room)(void *arg); /* a slot became free (after a last completion); may be NULL */
    void *room_arg;
    /* The executor that runs the put jobs (borrowed: outlives the producer), on exec_kind. NULL:
     * the producer makes a private one with kind FX_EXEC_K_PUT, `inflight` threads. */
    struct fx_exec *exec;
    int exec_kind;
} fx_chanq_prod_cfg;

typedef struct fx_chanq_prod_stats {
    unsigned in_flight, peak; /* batches in flight now / most at once */
    uint64_t submitted;       /* batches taken */
    uint64_t refused;         /* submits refused by the in-flight bound */
    uint64_t reopens;         /* producer closed and opened again */
} fx_chanq_prod_stats;

/* A producer for the channel, not open yet (the first _keep or _submit opens it). */
fx_err fx_chanq_prod_new(fx_mq_client *c, const fx_chanq_prod_cfg *cfg, fx_chanq_prod **out);
/* Stopping: open backoffs end at once and _keep no longer opens an idle producer; a submit still
 * opens one (what is queued gets stored), and puts in flight run to their deadline. Any thread. */
void fx_chanq_prod_stop(fx_chanq_prod *p);
/* Waits until no batch is in flight, closes the producer, joins the workers, frees. Owner. */
void fx_chanq_prod_free(fx_chanq_prod *p);

/* Keep attached: reopen a producer that closed itself or that a put found closed (waits until no
 * batch is in flight), open one that is not open yet (after waiting out the open backoff, which
 * _stop interrupts; never while stopping). No RPC when all is well. Returns whether it is open. */
bool fx_chanq_prod_keep(fx_chanq_prod *p);
/* Is it open? When not and err is given, why (the last open error, or "attaching"). */
bool fx_chanq_prod_attached(fx_chanq_prod *p, char *err, size_t cap);
/* The member id of the open producer (-1: not open). */
int64_t fx_chanq_prod_member(fx_chanq_prod *p);

/* Submit values[0..n) (1 <= n <= FX_CHANQ_BATCH_MAX; the slices and their bytes stay valid until
 * the last completion). FX_OK: taken, done will be called as above (an inline submit returns
 * after the last call). FX_EFULL: refused by the in-flight bound. Else the producer could not be
 * opened (that error; nothing taken). */
fx_err fx_chanq_submit(fx_chanq_prod *p, const fx_slice *values, size_t n, int64_t deadline_ms,
                       fx_chanq_done_fn done, void *arg);

/* Batches a submit would take now without refusal (0: wait for on_room). */
unsigned fx_chanq_prod_room(fx_chanq_prod *p);
/* Streams ready for batches (ready sub-MPSCs this producer knows of; no RPC): how far a burst
 * can spread. 0 while not open. */
size_t fx_chanq_prod_streams(fx_chanq_prod *p);
void fx_chanq_prod_stats_get(fx_chanq_prod *p, fx_chanq_prod_stats *out);

#endif
