/* lifecycle.h -- the one endpoint lifecycle of the Fluxon MQ (internal to bridge/): the close
 * state machine shared by the MPSC producer and consumer (mpsc_prod.c, mpsc_cons.c, helpers in
 * mpsc_int.h), the MPMC members (mpmc.c) and the client root (client.c).
 *
 * States (lf->state):
 *     OPEN ----close----> CLOSING ----done----> CLOSED
 *                          |   ^
 *                    retry |   | next close (re-runs the close work)
 *                          v   |
 *                          RETRY
 *   OPEN     calls are served. `constructing` may still be set: the owner's open is running;
 *            a close waits for it to end (fx_life_constructed) before doing any work.
 *   CLOSING  a close is running (one thread does the work: the one fx_life_close_begin answered
 *            RUN / RERUN); new calls are refused with FX_ECLOSED; in-flight op references
 *            (fx_life_op_enter) may still be taken, new work (new_work=true) may not.
 *   RETRY    the close failed "strongly" and stays retryable (an MPSC consumer whose acknowledged
 *            ids could not be committed): calls are refused as in CLOSING, the next close runs
 *            the close work again.
 *   CLOSED   the close work is done (`result`); no op reference may be taken any more.
 *   Fault (a lease the endpoint depends on expired): fx_life_lease_lost records it (`fault` =
 *   FX_ELEASE_LOST, `fault_lease`) and sets `stop`; it does not change the state: the owner
 *   closes itself on the next call. Once the fault is armed (fx_life_fault_arm), the first gate
 *   after it returns FX_ELEASE_LOST and every later one FX_ECLOSED. The MPSC arms at the loss
 *   itself; the MPMC arms when the loss makes it close itself (a user close that came first is
 *   reported as a plain close).
 *
 * Who transitions:
 *   OPEN -> CLOSING      any closer (fx_life_close_begin, or fx_life_closing for the client's
 *                        cooperative close); idempotent.
 *   CLOSING -> CLOSED    only the thread running the close work (fx_life_close_done).
 *   CLOSING -> RETRY     only that thread (fx_life_close_retry).
 *   RETRY -> CLOSING     the next closer (fx_life_close_begin answers RERUN).
 *   fault                the lease expiry callbacks and the data path (fx_life_lease_lost).
 *
 * Thread rules: an fx_life is guarded by its owner's mutex (the endpoint's `mu`, the client's
 * `mu`): every function below is called with that mutex held, and those that wait take it and
 * the owner's condvar as arguments (the condvar may be shared with the owner's other waits:
 * every transition broadcasts it). A thread that called fx_life_close_begin is counted in
 * `closers` until it calls fx_life_close_leave; fx_life_wait_closed (before freeing the owner)
 * waits for CLOSED and closers == 0, so no closer still touches the mutex or the condvar.
 */
#ifndef FX_BRIDGE_LIFECYCLE_H
#define FX_BRIDGE_LIFECYCLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "fx_err.h"

typedef enum { FX_LIFE_OPEN = 0, FX_LIFE_CLOSING, FX_LIFE_RETRY, FX_LIFE_CLOSED } fx_life_state;

/* What fx_life_close_begin tells its caller. */
typedef enum {
    FX_LIFE_CLOSE_RUN,   /* the caller does the close work (state OPEN -> CLOSING) */
    FX_LIFE_CLOSE_RERUN, /* the same, after a retryable failure (RETRY -> CLOSING) */
    FX_LIFE_CLOSE_DONE,  /* already closed (or closed by the closer waited for): *result */
    FX_LIFE_CLOSE_RETRY  /* the closer waited for left the endpoint retryable (RETRY) */
} fx_life_close;

typedef struct fx_life {
    fx_life_state state;
    bool constructing;   /* the owner's open is running (close waits for it) */
    bool stop;           /* the data path must stop: close asked or a lease lost */
    bool close_req;      /* a close was asked (possibly during construction) */
    fx_err fault;        /* FX_ELEASE_LOST once a lease the endpoint depends on is lost */
    int64_t fault_lease; /* the lease lost first (0: unknown) */
    bool fault_armed;    /* the next gate reports the fault */
    bool fault_reported; /* the fault was returned once */
    int closers;         /* threads between fx_life_close_begin and fx_life_close_leave */
    int64_t ops;         /* op references held (fx_life_op_enter / fx_life_op_leave) */
    fx_err result;       /* the close's result (CLOSED) */
} fx_life;

/* OPEN, constructing when `constructing` (zero-filled memory is OPEN and not constructing). */
void fx_life_init(fx_life *lf, bool constructing);
/* End of construction: wakes the closers waiting for it. Returns `stop` (a close or a lease
 * loss arrived meanwhile: the owner fails its open). */
bool fx_life_constructed(fx_life *lf, pthread_cond_t *cv);

/* Record a lease loss (`lease`: its id, 0 unknown) and set stop. Ignored in RETRY and CLOSED
 * (the close is over for the caller: a retried close finds the loss itself). Returns true the
 * first time (the caller logs). */
bool fx_life_lease_lost(fx_life *lf, int64_t lease);
/* The next gate reports the recorded fault (FX_ELEASE_LOST) once. No-op without a fault. */
void fx_life_fault_arm(fx_life *lf);
/* The data path found the loss itself and reports it in this very call: record the fault
 * (whatever the state), set stop, and count it as reported (later gates: FX_ECLOSED). */
void fx_life_fault_now(fx_life *lf, int64_t lease);
/* Entry gate of a data-path call: FX_OK to proceed; FX_ELEASE_LOST once an armed fault is
 * there (not reported yet); FX_ECLOSED when stopping or not OPEN. Returns the code only (the
 * caller writes the error detail). */
fx_err fx_life_gate(fx_life *lf);

/* OPEN -> CLOSING (sets stop and close_req; broadcasts). Idempotent: true when it made the
 * transition. Does not wait for a construction. */
bool fx_life_closing(fx_life *lf, pthread_cond_t *cv);
/* Start a close: counts the caller in `closers`, sets stop and close_req, waits for a running
 * construction, then: OPEN -> CLOSING (RUN), RETRY -> CLOSING (RERUN), CLOSED (DONE, *result),
 * CLOSING: waits for the running closer, then DONE (*result) or RETRY. May unlock mu while
 * waiting. Every caller ends with fx_life_close_leave (RUN / RERUN: after close_done / retry). */
fx_life_close fx_life_close_begin(fx_life *lf, pthread_mutex_t *mu, pthread_cond_t *cv,
                                  fx_err *result);
/* The close work is done: CLOSING -> CLOSED with `result`. */
void fx_life_close_done(fx_life *lf, pthread_cond_t *cv, fx_err result);
/* The close work failed and stays retryable: CLOSING -> RETRY. */
void fx_life_close_retry(fx_life *lf, pthread_cond_t *cv);
/* The caller leaves the close (closers--). After it the caller must not touch the owner unless
 * it owns it otherwise. */
void fx_life_close_leave(fx_life *lf, pthread_cond_t *cv);
/* Before freeing the owner: wait for CLOSED and for every closer to have left. */
void fx_life_wait_closed(fx_life *lf, pthread_mutex_t *mu, pthread_cond_t *cv);

/* Take an op reference (a call that uses what the owner's close frees): refused (FX_ECLOSED,
 * code only) once CLOSED, and for new work (new_work: a call that creates state) once not OPEN. */
fx_err fx_life_op_enter(fx_life *lf, bool new_work);
/* Give it back (wakes fx_life_drain at zero). */
void fx_life_op_leave(fx_life *lf, pthread_cond_t *cv);
/* Wait (bounded by deadline_ms, a fx_now_ms() value; cv must use the monotonic clock) until no
 * op reference is held. True when none is. Call it once CLOSED, so no new one can be taken. */
bool fx_life_drain(fx_life *lf, pthread_mutex_t *mu, pthread_cond_t *cv, int64_t deadline_ms);

#endif
