/* lifecycle.c -- the endpoint lifecycle shared by MPSC, MPMC and the client root. Contract and
 * thread rules: lifecycle.h. Every function runs with the owner's mutex held. */
#include "lifecycle.h"

#include <errno.h>

#include "fx_time.h"

void fx_life_init(fx_life *lf, bool constructing)
{
    *lf = (fx_life){.state = FX_LIFE_OPEN, .constructing = constructing};
}

bool fx_life_constructed(fx_life *lf, pthread_cond_t *cv)
{
    lf->constructing = false;
    pthread_cond_broadcast(cv);
    return lf->stop;
}

bool fx_life_lease_lost(fx_life *lf, int64_t lease)
{
    if (lf->fault || lf->state >= FX_LIFE_RETRY) return false;
    lf->fault = FX_ELEASE_LOST;
    lf->fault_lease = lease;
    lf->stop = true;
    return true;
}

void fx_life_fault_arm(fx_life *lf)
{
    if (lf->fault) lf->fault_armed = true;
}

void fx_life_fault_now(fx_life *lf, int64_t lease)
{
    if (!lf->fault) {
        lf->fault = FX_ELEASE_LOST;
        lf->fault_lease = lease;
    }
    lf->stop = true;
    lf->fault_armed = true;
    lf->fault_reported = true;
}

fx_err fx_life_gate(fx_life *lf)
{
    if (lf->fault && lf->fault_armed && !lf->fault_reported) {
        lf->fault_reported = true;
        return FX_ELEASE_LOST;
    }
    if (lf->stop || lf->state != FX_LIFE_OPEN) return FX_ECLOSED;
    return FX_OK;
}

bool fx_life_closing(fx_life *lf, pthread_cond_t *cv)
{
    lf->stop = true;
    lf->close_req = true;
    bool moved = lf->state == FX_LIFE_OPEN;
    if (moved) lf->state = FX_LIFE_CLOSING;
    pthread_cond_broadcast(cv);
    return moved;
}

fx_life_close fx_life_close_begin(fx_life *lf, pthread_mutex_t *mu, pthread_cond_t *cv,
                                  fx_err *result)
{
    lf->closers++;
    lf->stop = true;
    lf->close_req = true;
    pthread_cond_broadcast(cv);
    while (lf->constructing) pthread_cond_wait(cv, mu);
    switch (lf->state) {
    case FX_LIFE_OPEN:
        lf->state = FX_LIFE_CLOSING;
        pthread_cond_broadcast(cv);
        return FX_LIFE_CLOSE_RUN;
    case FX_LIFE_RETRY:
        lf->state = FX_LIFE_CLOSING;
        pthread_cond_broadcast(cv);
        return FX_LIFE_CLOSE_RERUN;
    case FX_LIFE_CLOSING:
        while (lf->state == FX_LIFE_CLOSING) pthread_cond_wait(cv, mu);
        if (lf->state == FX_LIFE_RETRY) return FX_LIFE_CLOSE_RETRY;
        break;
    case FX_LIFE_CLOSED:
        break;
    }
    *result = lf->result;
    return FX_LIFE_CLOSE_DONE;
}

void fx_life_close_done(fx_life *lf, pthread_cond_t *cv, fx_err result)
{
    lf->state = FX_LIFE_CLOSED;
    lf->result = result;
    pthread_cond_broadcast(cv);
}

void fx_life_close_retry(fx_life *lf, pthread_cond_t *cv)
{
    lf->state = FX_LIFE_RETRY;
    pthread_cond_broadcast(cv);
}

void fx_life_close_leave(fx_life *lf, pthread_cond_t *cv)
{
    lf->closers--;
    pthread_cond_broadcast(cv);
}

void fx_life_wait_closed(fx_life *lf, pthread_mutex_t *mu, pthread_cond_t *cv)
{
    while (lf->state != FX_LIFE_CLOSED || lf->closers > 0) pthread_cond_wait(cv, mu);
}

fx_err fx_life_op_enter(fx_life *lf, bool new_work)
{
    if (lf->state == FX_LIFE_CLOSED || (new_work && lf->state != FX_LIFE_OPEN)) return FX_ECLOSED;
    lf->ops++;
    return FX_OK;
}

void fx_life_op_leave(fx_life *lf, pthread_cond_t *cv)
{
    if (--lf->ops == 0) pthread_cond_broadcast(cv);
}

bool fx_life_drain(fx_life *lf, pthread_mutex_t *mu, pthread_cond_t *cv, int64_t deadline_ms)
{
    while (lf->ops > 0) {
        struct timespec ts = fx_deadline_ts(deadline_ms);
        if (pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT && lf->ops > 0) return false;
    }
    return true;
}
