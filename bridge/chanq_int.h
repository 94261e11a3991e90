/* chanq_int.h -- between the keeper (chanq_keeper.c) and the channel consumers (chanq_cons.c):
 * the consumers' jobs and the per-channel entry. Not part of the API.
 *
 * Jobs run on the keeper's executor (bridge/executor.h, borrowed from the daemon):
 *  - slow jobs (opens, adoptions, closes: each bounded by its etcd deadlines) are one-shot jobs
 *    of kind FX_EXEC_K_CHANQ, posted with fx__chanq_post; fn runs without any lock held and may
 *    post more. The keeper counts them: fx_chanq_keeper_free waits until every one posted has
 *    run (a close must finish: last attempt record durable, acks committed). A job the executor
 *    cancels (it was freed first) runs in the freeing thread instead.
 *  - attempt-record writes are steps of one strand per record (kind FX_EXEC_K_WRITE, chanq_cons.c):
 *    one record's puts in order, a retry as a timed kick. A slow job may wait for a write, never
 *    the reverse (the write kind has its own threads).
 * fx__chanq_stopping turns true when the keeper is being freed: a job then must not retry.
 *
 * Channel entries live until the keeper is freed (their pointers are stable). Fields under the
 * keeper's mutex unless said otherwise.
 */
#ifndef FX_BRIDGE_CHANQ_INT_H
#define FX_BRIDGE_CHANQ_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "chanq_keeper.h"
#include "executor.h"

typedef struct fx__chanq_job {
    void (*fn)(struct fx__chanq_job *j);
    fx_chanq_keeper *k; /* set by fx__chanq_post */
} fx__chanq_job;

/* Submit slow job j. false: the executor refused it (stopping, or its queue is full; logged):
 * nothing was queued, the caller runs it in place or retries later. */
bool fx__chanq_post(fx_chanq_keeper *k, fx__chanq_job *j);
bool fx__chanq_stopping(fx_chanq_keeper *k);
fx_mq_client *fx__chanq_mq(fx_chanq_keeper *k);
fx_exec *fx__chanq_exec(fx_chanq_keeper *k);

typedef struct fx__chanq_chan {
    char *name;
    int consumers; /* open consumers here */
    bool named;    /* by fx_chanq_keeper_set_channels */
    bool due;      /* kicked */
    /* resolve cache (under mu below) */
    pthread_mutex_t mu;
    int64_t mpmc;
    bool have_mpmc;
    /* the view (under mu) */
    bool known;
    int64_t backlog;
    uint64_t reclaimed;
    int64_t stranded[FX_CHANQ_STRANDED_MAX];
    size_t n_stranded;
    uint64_t view_gen; /* bumped when the stranded list changed or is not empty */
    int64_t held[FX_CHANQ_HELD_MAX], held_backlog[FX_CHANQ_HELD_MAX];
    size_t n_held;
} fx__chanq_chan;

/* The entry of channel `name` (created if needed; consumers += 1). NULL: out of memory. */
fx__chanq_chan *fx__chanq_chan_get(fx_chanq_keeper *k, const char *name);
void fx__chanq_chan_put(fx_chanq_keeper *k, fx__chanq_chan *ch); /* consumers -= 1 */
/* The MPMC id of ch (cached; resolved with cfg when not, or when forget was called). */
fx_err fx__chanq_resolve(fx_chanq_keeper *k, fx__chanq_chan *ch, const fx_mq_chan_cfg *cfg,
                         int64_t *out);
void fx__chanq_forget(fx__chanq_chan *ch);

#endif
