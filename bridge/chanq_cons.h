/* chanq_cons.h -- a consumer of one channel as the daemon uses it: no part of a channel (no
 * sub-MPSC id) in its calls. The front-end (a claim) gets deliveries with their durable delivery
 * count, acks them, records the attempts it is about to make, and closes; the consumer does the
 * rest below:
 *  - open: resolve the channel (create it if absent, through the keeper's cache), join it as an
 *    MPMC consumer (fx_mpmc_consumer_open) and read the attempt record of what it consumes; run
 *    as a job (chanq_int.h), retried with backoff (200 ms doubling to 5 s); after a lost lease it
 *    drops the consumer (its deliveries are released, see `release`) and opens a new one;
 *  - adoption: a channel part left with backlog by a departed consumer (closed without acking,
 *    or whose member lease expired: the keeper's view names it) is adopted next to its own (at
 *    most FX_CHANQ_ADOPT_MAX at a time; opened as a job with fx_mpmc_consumer_open_drain and
 *    its own attempt record, so its messages keep their delivery counts), drained first, and let
 *    go once it stayed empty FX_CHANQ_ADOPT_IDLE_MS with nothing of it held by the front-end
 *    (closed as a job: last attempt record durable, acks committed);
 *  - attempt records (explicit acks, bridge/attempts.h): fx_chanq_cons_count builds the record
 *    of each part and hands it to its writer (a strand of the executor's write kind); fx_chanq_cons_durable tells whether a
 *    delivery's count is durable (a delivery must not go out before).
 *
 * Delivery handles: a delivery's fx_mq_msg_id is its handle (opaque: pass it back to ack, count,
 * durable and fenced). `src` in the callbacks is the id's chan field, used only to tell the
 * front-end which handles to forget.
 *
 * Threads: every call but fx_chanq_cons_close's effect runs on the owner's thread, one call at a
 * time (the claim's steps); none blocks: etcd work runs as jobs on the keeper's executor
 * (chanq_int.h). The callbacks:
 *  - notify(arg): something may be ready (new messages, an open or adoption finished, an attempt
 *    record became durable); any thread, with internal locks held: only wake the owner. Never
 *    called once fx_chanq_cons_close returned.
 *  - release(arg, src): forget every delivery with id.chan == src (FX_CHANQ_ALL: every delivery)
 *    the front-end holds: its consumer was lost; the messages stay unacked for the next
 *    consumer. Called on the owner's thread, from fx_chanq_cons_poll only.
 *  - held(arg, src): deliveries with id.chan == src the front-end still holds (not acked). Owner's
 *    thread, from fx_chanq_cons_poll only.
 *
 * Ownership: the consumer borrows its keeper (which must outlive it). fx_chanq_cons_close hands
 * it to a close job: the caller must not use it afterwards.
 */
#ifndef FX_BRIDGE_CHANQ_CONS_H
#define FX_BRIDGE_CHANQ_CONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chanq_keeper.h"
#include "fluxon_mq.h"

#define FX_CHANQ_ADOPT_MAX 4          /* departed consumers' parts one consumer drains at once */
#define FX_CHANQ_ADOPT_IDLE_MS 200    /* an adopted part empty this long is let go */
#define FX_CHANQ_ALL INT64_MIN        /* release(): every delivery */
#define FX_CHANQ_SYNC_MS 2000         /* a close waits this long for its last record and commit */

typedef struct fx_chanq_cons fx_chanq_cons;

typedef struct fx_chanq_cons_cb {
    void (*notify)(void *arg);
    void (*release)(void *arg, int64_t src);
    size_t (*held)(void *arg, int64_t src);
    void *arg;
} fx_chanq_cons_cb;

typedef struct fx_chanq_cons_opts {
    const char *channel;  /* the channel's name */
    fx_mq_chan_cfg cfg;   /* its configuration (resolve: created with it if absent) */
    const char *label;    /* for log lines (the claim's subject) */
    bool attempts;        /* explicit acks: persisted attempt counts (fx_chanq_cons_count) */
} fx_chanq_cons_opts;

/* No I/O: the open runs as a job once fx_chanq_cons_poll asks for it. */
fx_err fx_chanq_cons_new(fx_chanq_keeper *k, const fx_chanq_cons_opts *o,
                         const fx_chanq_cons_cb *cb, fx_chanq_cons **out);

/* Owner's step: take what the jobs finished (an open, adoptions, a dropped consumer), release
 * the deliveries of a lost consumer (release callback), let drained adopted parts go, start the
 * next open when due. Returns -1 when the consumer is open (get may be called), else the ms
 * until the next poll is useful (notify comes earlier when a job finishes). The front-end should
 * commit its gathered acks (fx_chanq_cons_ack) before it polls. */
int64_t fx_chanq_cons_poll(fx_chanq_cons *c);
/* Look at the keeper's view and start adopting the departed consumers' parts it names (jobs; no
 * I/O here). Only when the front-end can deliver now (a consumer that could not would only hold
 * the backlog). */
void fx_chanq_cons_inherit(fx_chanq_cons *c);
/* Adopted parts held now (they need a poll every ~20 ms even with nothing new). */
size_t fx_chanq_cons_inherited(const fx_chanq_cons *c);

/* Up to max deliveries without waiting: the adopted parts first (round robin), then its own.
 * counts[i]: attempts made before (durable record; 0 without attempts). FX_OK with *n >= 1, or
 * FX_ETIMEDOUT with *n == 0 (nothing stored: notify comes when there is), FX_EUNAVAIL (not open:
 * poll), FX_ECLOSED / FX_ELEASE_LOST (the consumer was lost: the next poll releases and
 * reopens), other errors of the MQ (retry later). out[] entries are the caller's on FX_OK. */
fx_err fx_chanq_cons_get(fx_chanq_cons *c, fx_mq_delivery *out, uint64_t *counts, size_t max,
                         size_t *n);
/* Ack deliveries (reordered in place). true: every one was applied; a part whose consumer
 * turned out closed is released at the next poll. */
bool fx_chanq_cons_ack(fx_chanq_cons *c, fx_mq_msg_id *ids, size_t n);
/* The consumer (own part) was lost: the next poll releases everything. */
bool fx_chanq_cons_lost(const fx_chanq_cons *c);

/* One held delivery and the count its attempt record must hold. gen: set by fx_chanq_cons_count
 * to the record generation that holds it. */
typedef struct fx_chanq_attempt {
    fx_mq_msg_id id;
    uint32_t count;
    uint64_t gen;
} fx_chanq_attempt;
/* Record the attempt counts of every delivery the front-end holds (all of them: a record
 * replaces the previous one). No I/O: the records go to the writers. No-op without
 * opts.attempts. */
void fx_chanq_cons_count(fx_chanq_cons *c, fx_chanq_attempt *items, size_t n);
/* Is record generation gen of the part of id durable (true without attempts)? */
bool fx_chanq_cons_durable(const fx_chanq_cons *c, fx_mq_msg_id id, uint64_t gen);

/* Read once per round (no RPC): fencing of each part (fx_mpmc_consumer_fenced) and the own
 * part's backlog from the keeper's view. */
void fx_chanq_cons_round(fx_chanq_cons *c);
/* From the last round: the part of id is held by a fenced consumer (do not deliver it). */
bool fx_chanq_cons_fenced(const fx_chanq_cons *c, fx_mq_msg_id id);
/* From the last round: messages stored in the own part, -1 unknown (JetStream's "pending"). */
int64_t fx_chanq_cons_pending(const fx_chanq_cons *c);
/* For log lines: the MPMC, own part and member ids, or -1. */
void fx_chanq_cons_ids(const fx_chanq_cons *c, int64_t *mpmc, int64_t *part, int64_t *member);

/* Close: notify is off when this returns; the rest runs as a job (last attempt records durable,
 * acks committed, FX_CHANQ_SYNC_MS each; adopted parts and the own part closed; the keeper's
 * view kicked so another consumer adopts the backlog left). Call fx_chanq_cons_ack and
 * fx_chanq_cons_count with the final state first. NULL: no-op. */
void fx_chanq_cons_close(fx_chanq_cons *c);

#endif
