/* chanq_int.h -- between the keeper (chanq_keeper.c) and the channel consumers (chanq_cons.c):
 * the job lanes and the per-channel entry. Not part of the API.
 *
 * Job lanes. A job is an intrusive node of a live object (a consumer, an adoption, an attempt
 * stream), queued at most once at a time, so a lane's queue is bounded by the objects alive; a
 * job may carry a not-before time (a retry). A lane's threads run jobs in queue order (the first
 * whose time has come). fn runs without any lane lock held and may post jobs (to any lane).
 * Lanes: FX__CHANQ_SLOW (opens, adoptions, closes: each bounded by its etcd deadlines) and
 * FX__CHANQ_WRITE (attempt-record puts). A job of the slow lane may wait for the write lane,
 * never the reverse. At the keeper's free the slow lane runs every queued job (ignoring
 * not-before times) before its threads exit, then the write lane does the same; a job can tell
 * (fx__chanq_stopping) and must then not post itself again with a not-before time.
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

enum { FX__CHANQ_SLOW = 0, FX__CHANQ_WRITE = 1, FX__CHANQ_LANES = 2 };

typedef struct fx__chanq_job {
    void (*fn)(struct fx__chanq_job *j);
    int64_t not_before; /* fx_now_ms clock; 0: now */
    bool queued;        /* under the lane's lock */
    struct fx__chanq_job *next;
} fx__chanq_job;

/* Queue j (no-op while it is queued). false: the keeper is stopped (j not queued). */
bool fx__chanq_post(fx_chanq_keeper *k, int lane, fx__chanq_job *j);
/* Unlink j if it is queued (it will not run). true: it was. */
bool fx__chanq_unpost(fx_chanq_keeper *k, int lane, fx__chanq_job *j);
bool fx__chanq_stopping(fx_chanq_keeper *k);
fx_mq_client *fx__chanq_mq(fx_chanq_keeper *k);

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
