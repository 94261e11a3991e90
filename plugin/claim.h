/* claim.h -- consumer claims (claim.c): the interest thread, each claim's steps on the daemon's
 * executor, ack and no-responders routing. Called by daemon.c (start, stop, drain) and by the
 * NATS callbacks it registers; the pull front-end's entry points are pull.h.
 *
 * Ownership and threads (the daemon context's rules: dmctx.h):
 *  - dm_claim: reference counted (registry, the claim scheduler, each dead-letter item in a
 *    producer queue). It has no thread: it is a strand of the daemon's executor (claim.c, kind
 *    FX_EXEC_K_CLAIM), which runs its steps one at a time. Its event queue is written by the ack
 *    callbacks (bounded, full -> dropped and counted; the message is redelivered after ack_wait)
 *    and read by its steps; completed dead letters come back through `dlq_done` (never dropped;
 *    bounded by the in-flight table). Lock order: claim.mu -> claim.sq_mu -> the executor's lock.
 */
#ifndef FX_PLUGIN_CLAIM_H
#define FX_PLUGIN_CLAIM_H

#include "dmctx.h"

/* ---- claim ----------------------------------------------------------------------------------------- */
enum { EV_ACK = 0, EV_NAK, EV_WPI, EV_TERM, EV_NORESP };
enum { STOP_NONE = 0, STOP_RELEASE, STOP_DRAIN };

/* The reply subject of an ack sent as a request (nats.go AckSync, nats.js ackAck): shared by the
 * router and every claim the ack was queued to (reference counted). The claim that applies the
 * ack answers with an empty message (first answer wins); when the last reference goes without an
 * answer, the ack was not applied and gets an error reply. */
typedef struct dm_ackreply {
    atomic_int refs;
    atomic_bool answered;
    char subject[];
} dm_ackreply;

typedef struct dm_ev {
    uint8_t kind;
    uint64_t claim_seq;
    uint64_t nonce; /* from the reply subject; never 0 for a delivery the bridge made */
    int64_t delay_ns;
    dm_ackreply *reply; /* one reference, or NULL */
    char *detail;       /* +TERM reason (malloc'd per queued event, freed by its consumer), or NULL */
} dm_ev;

struct dm_claim {
    dm_chan *ch;
    dm_claim *next; /* ch->claims, under d->reg */
    char token[128];
    char subject[1100];
    atomic_int refs;
    pthread_t thr;          /* unused: a claim has no thread (the scheduler runs its steps) */
    bool started;           /* unused, always false (same reason) */
    atomic_int stop;        /* STOP_* */
    atomic_bool finished;   /* its last step has run and it left the scheduler */
    atomic_bool present;    /* interest seen in the last successful poll */
    atomic_bool noresp;     /* a no-responders arrived: release now */
    atomic_bool holding;    /* its consumer is open (a sub-MPSC is claimed): fluxon_claims */
    int64_t last_seen_ms;   /* interest thread only */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    dm_ev *evs; /* ring */
    size_t ev_cap, ev_head, ev_n;
    pq_item *dlq_done;
    bool dlq_closed; /* its last step has run: completions are freed by the producer side */

    /* claim scheduler (claim.c): the claim's strand; sq_on and strand under sq_mu (strand is
     * also read by its own steps); st and phase touched by its steps only */
    pthread_mutex_t sq_mu;
    bool sq_on;
    fx_exec_strand *strand;
    void *st;       /* the claim's state (cst) */
    int phase;
    struct dm_pull *pull; /* a pull consumer (pull.h; its requests under mu); NULL: push claim */
};

/* ---- claim.c ------------------------------------------------------------------------------------ */
void *dm_interest_main(void *arg);
/* Ask every claim of ch to stop (mode STOP_*) and wait for them; removes them from ch->claims.
 * Caller holds no lock; ch must no longer be in the active list (or stopping must be set). */
void dm_claims_stop_all(fx_daemon *d, dm_chan *ch, int mode);
/* At daemon free: true when no claim is scheduled any more (the executor may be freed); false:
 * some claim still runs (logged; the executor must be kept). */
bool dm_claims_sched_stop(fx_daemon *d);
/* Only ask (no wait): lets a drain stop the claims of every channel in parallel. */
void dm_claims_request_stop(fx_daemon *d, dm_chan *ch, int mode);
void dm_claim_unref(dm_claim *cl);
/* A dead letter came back from the producer (result set): the completion hook claim.c puts on
 * its dead-letter items (pq_item.done). Takes the item. */
void dm_claim_dlq_complete(pq_item *it);
void dm_on_ack(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg);
void dm_on_nr(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg);
/* A control message (ack, no-responders status) the bridge did not cause: counted in
 * fluxon_invalid_control_total and logged at most every 10 s; it changes no state. Any thread. */
void dm_invalid_control(fx_daemon *d, const char *what);

#endif
