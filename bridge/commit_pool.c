/* commit_pool.c -- commit rounds of MQ consumers on the executor's commit kind. Contract:
 * commit_pool.h. */
#include "commit_pool.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "fx_time.h"

struct fx_commit_slot {
    fx_exec_strand *strand;
    fx_commit_round_fn round;
    void *arg;
    int64_t backoff;            /* the strand's step only */
    _Atomic int64_t not_before; /* end of the current backoff (0: none) */
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void slot_step(void *arg)
{
    fx_commit_slot *s = arg;
    int64_t nb = atomic_load(&s->not_before);
    if (nb > fx_now_ms()) { /* kicked during a backoff: wait for its end */
        fx_exec_strand_kick(s->strand, nb);
        return;
    }
    int64_t retry_in = s->backoff ? s->backoff : FX_COMMIT_RETRY_MIN_MS;
    switch (s->round(s->arg, retry_in)) {
    case FX_COMMIT_RETRY:
        nb = fx_now_ms() + retry_in;
        atomic_store(&s->not_before, nb);
        s->backoff = min64(retry_in * 2, FX_COMMIT_RETRY_MAX_MS);
        fx_exec_strand_kick(s->strand, nb);
        break;
    case FX_COMMIT_AGAIN:
        s->backoff = 0;
        atomic_store(&s->not_before, 0);
        fx_exec_strand_kick(s->strand, 0);
        break;
    case FX_COMMIT_IDLE:
        s->backoff = 0;
        atomic_store(&s->not_before, 0);
        break;
    }
}

fx_err fx_commit_slot_new(fx_exec *ex, fx_commit_round_fn round, void *arg, fx_commit_slot **out)
{
    *out = NULL;
    if (!ex || !round) return fx_seterr(FX_EINVAL, "commit slot: no executor or round");
    fx_commit_slot *s = calloc(1, sizeof *s);
    if (!s) return fx_seterr(FX_ENOMEM, "commit slot: out of memory");
    s->round = round;
    s->arg = arg;
    fx_err e = fx_exec_strand_new(ex, FX_EXEC_K_COMMIT, slot_step, s, &s->strand);
    if (e) {
        free(s);
        return e;
    }
    *out = s;
    return FX_OK;
}

void fx_commit_slot_kick(fx_commit_slot *s)
{
    if (!s) return;
    int64_t nb = atomic_load(&s->not_before);
    fx_exec_strand_kick(s->strand, nb); /* a due in the past means now */
}

void fx_commit_slot_free(fx_commit_slot *s)
{
    if (!s) return;
    fx_exec_strand_free(s->strand);
    free(s);
}
