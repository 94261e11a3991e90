/* delivery.h -- the delivery engine of one consumer, below NATS: what is in flight, what is due for
 * (re)delivery, what goes to the dead-letter path, and what an ack does. A front-end (today the
 * push claims of plugin/claim.c) feeds it the deliveries fetched from the MQ and the acks its
 * subscribers send, and gives it the consumer's operations (publish one delivery, commit acks,
 * queue a dead letter, answer an AckSync) and a clock through fx_dlv_ops; the engine decides.
 *
 * Semantics (JetStream's, with the fluxon rules of deploy/README.md "Acks and redelivery"):
 *  - In flight: at most max_ack_pending entries out with a subscriber (fx_dlv_accept refuses more:
 *    FX_EFULL, the delivery stays the caller's). An entry waiting out a NAK delay (explicit,
 *    backoff or nak_delay) does not count (JetStream counts it, nats.go #968); at most
 *    max_ack_pending such entries wait (max_delayed), so the table holds at most
 *    2 x max_ack_pending; a NAK past that bound keeps its slot (counted) and nak_delay_held
 *    counts it. A delayed entry whose delay is over waits (FIFO, in waitq) for a slot before
 *    anything new is accepted (fx_dlv_room counts the waiting ones). Entry states (claim_table.h): WAIT_SEND (due for
 *    (re)publication), WAIT_ACK (published; due = ack deadline, or the no-responders grace with
 *    ack none), WAIT_DLQ (dead letter handed to ops.dead_letter, waiting for fx_dlv_dlq_done),
 *    DLQ_RETRY (dead letter to be handed again at due).
 *  - A round (fx_dlv_run) first moves what is due (ack_wait expired -> redelivered, or dead
 *    letter once max_deliver attempts were made; ack none: acked; DLQ_RETRY -> dead letter
 *    again), then publishes the WAIT_SEND entries in order: only while ops.can_send says a
 *    subscriber could receive them (an expired entry whose subscriber is gone is held, not
 *    counted), each only once ops.ready says its attempt count is durable (an entry that is not
 *    ready holds back every later one: FIFO). ops.send publishes with attempt delivered + 1; each
 *    publish gets a fresh (claim seq, nonce), so an ack of an earlier attempt is stale.
 *  - Acks (fx_dlv_event) match an entry by (claim seq, nonce). ACK: committed at the next
 *    fx_dlv_flush. NAK: redelivered after its delay, else after backoff[delivered - 1] (the last
 *    element repeats), else after nak_delay (0: at once); a NAK of the max_deliver-th attempt
 *    dead-letters. ack_wait expiry redelivers at once (backoff does not replace ack_wait).
 *    WPI: the ack deadline restarts (ack_wait). TERM: dead letter (reason "term"). NORESP (a
 *    no-responders status for a delivery): the delivery reached nobody and is not an attempt
 *    (delivered is taken back; the entry waits for the front-end's release).
 *  - Dead letters: exactly once per entry: ops.dead_letter answers QUEUED (the entry waits in
 *    WAIT_DLQ for fx_dlv_dlq_done: stored -> committed like an ack; failed -> retried after
 *    1 s), NONE (no dead-letter channel: the message is dropped and committed) or RETRY (retried
 *    after 1 s). On a dead-letter channel itself (cfg.is_dlq) TERM discards (commits) and
 *    max_deliver never drops: the message is redelivered after the last backoff (or ack_wait).
 *  - AckSync: an applied ACK's reply is answered ok (ops.reply true) once its flush committed
 *    every gathered ack; anything else (not applied, stale, a failed commit, a release) answers
 *    false: the front-end sends JetStream's 409-style error. An applied NAK/WPI/TERM is answered
 *    ok at once.
 *  - A lost consumer (fx_dlv_release_all): every entry is released (the messages stay unacked in
 *    the MQ for the next consumer), gathered acks are dropped and their replies answered false.
 *
 * Ownership: the engine owns its table and every delivery accepted (freed on release). The ops
 * context is borrowed. Thread rules: none inside; one thread at a time (the consumer's steps).
 * ops are called on that thread, from within the engine's calls; they must not call back into
 * the engine except for reading it (fx_dlv_ent, the public fields).
 */
#ifndef FX_BRIDGE_DELIVERY_H
#define FX_BRIDGE_DELIVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "claim_table.h"
#include "flatdict.h"
#include "fluxon_mq.h"

#define FX_DLV_RETRY_MS 1000  /* a dead letter not queued / not stored is handed again after */
#define FX_DLV_HOLD_MS 200    /* an expired delivery with no subscriber to receive it waits */
#define FX_DLV_SEND_RETRY_MS 200 /* a publish that failed is retried after */
#define FX_DLV_IDLE_RETRY_MS 100 /* deliveries due while nobody could receive them wait */
#define FX_DLV_DETAIL_MAX 256    /* bytes of a +TERM reason kept */

typedef enum { FX_DLV_ACK = 0, FX_DLV_NAK, FX_DLV_WPI, FX_DLV_TERM, FX_DLV_NORESP } fx_dlv_kind;

/* What fx_dlv_event did. */
typedef enum {
    FX_DLV_APPLIED = 0, /* it changed the state of a delivery in flight */
    FX_DLV_IGNORED,     /* the delivery is in flight but not in a state the event applies to */
    FX_DLV_STALE,       /* the claim seq was issued, the delivery is no longer in flight */
    FX_DLV_INVALID      /* not caused by the engine (seq never issued, nonce mismatch, ...) */
} fx_dlv_res;

/* ops.dead_letter answers */
typedef enum { FX_DLV_DLQ_QUEUED = 0, FX_DLV_DLQ_NONE, FX_DLV_DLQ_RETRY } fx_dlv_dlq;

/* How an entry left the engine (ops.done, before it is released). */
typedef enum {
    FX_DLV_DONE_ACKED = 0, /* acked by a subscriber */
    FX_DLV_DONE_AUTO,      /* ack none: published, no no-responders status within the grace */
    FX_DLV_DONE_DEAD,      /* dead letter stored */
    FX_DLV_DONE_DROPPED,   /* no dead-letter channel, or not a valid record (fx_dlv_drop) */
    FX_DLV_DONE_DISCARDED  /* +TERM on a dead-letter channel */
} fx_dlv_done;

typedef struct fx_dlv_ops {
    int64_t (*now_ms)(void *ctx);                /* monotonic clock */
    uint64_t (*nonce)(void *ctx);                /* random, per publish (0 is replaced by 1) */
    bool (*can_send)(void *ctx);                 /* could a subscriber receive a delivery now */
    /* Before a round that publishes (the WAIT_SEND entries are in sendq): e.g. persist the
     * attempt counts they will have. May be NULL. */
    void (*round)(void *ctx);
    bool (*ready)(void *ctx, const ctab_ent *e); /* its attempt count is durable; NULL: always */
    /* Publish entry idx as attempt e->delivered + 1 (claim_seq and nonce set). true: it went
     * out (the engine counts it); false: retried later, not counted. Re-checks can_send's
     * conditions as it likes. */
    bool (*send)(void *ctx, uint32_t idx, const ctab_ent *e);
    /* After a round that published n deliveries (ack none: e.g. flush, so no-responders statuses
     * are in before the grace). May be NULL. */
    void (*sent)(void *ctx, uint32_t n);
    fx_dlv_dlq (*dead_letter)(void *ctx, uint32_t idx, const ctab_ent *e, const char *reason);
    /* Commit ids[0, n) (acked or dead-lettered messages; the op may reorder them). true: every
     * one was applied. */
    bool (*commit)(void *ctx, fx_mq_msg_id *ids, size_t n);
    void (*reply)(void *ctx, void *reply, bool ok); /* AckSync answer; may be NULL */
    void (*done)(void *ctx, const ctab_ent *e, fx_dlv_done how); /* metrics, logs; may be NULL */
    /* The table grows to cap entries: arrays of the front-end that hold up to one item per entry
     * follow. false: do not grow. May be NULL. */
    bool (*grow)(void *ctx, uint32_t cap);
} fx_dlv_ops;

typedef struct fx_dlv_cfg {
    bool explicit_ack;       /* false: ack none (a published delivery is acked after the grace) */
    bool is_dlq;             /* the consumer serves a dead-letter channel */
    int64_t ack_wait_ms;     /* > 0 */
    int64_t max_deliver;     /* >= 1 */
    int64_t max_ack_pending; /* in-flight bound, >= 1 */
    const int64_t *backoff_ms; /* n_backoff delays (copied) */
    size_t n_backoff;
    int64_t nak_delay_ms;    /* delay of a NAK without one when no backoff list is set (0: at once) */
    int64_t none_grace_ms;   /* ack none: wait this long for a no-responders status */
} fx_dlv_cfg;

typedef struct fx_dlv {
    fx_dlv_cfg cfg;
    int64_t *backoff; /* cfg.backoff_ms points here */
    fx_dlv_ops ops;
    void *ctx;
    ctab t;            /* the in-flight table */
    uint32_t *sendq;   /* WAIT_SEND entries due now, in order */
    uint32_t n_send;
    uint64_t next_cseq; /* claim seqs issued: 1..next_cseq */
    fx_mq_msg_id *acks; /* to commit at the next flush */
    size_t n_acks;
    void **replies;    /* AckSync replies of the ACKs in acks */
    size_t n_replies;
    size_t dlq_pending; /* dead letters queued, completion not back */
    /* NAK-delayed entries (see "max_ack_pending" above): per entry 0, waiting out the delay, or
     * due and waiting in waitq (FIFO) for a slot. */
    uint8_t *delayed;
    uint32_t n_delayed, max_delayed;
    uint32_t *waitq;
    uint32_t n_wait;
    uint64_t nak_delay_held; /* NAKs past max_delayed: the entry kept its slot (a counter) */
    char **detail;           /* per entry: the reason a +TERM carried (malloc'd) or NULL */
    const char *term_detail; /* fx_dlv_term's detail, during the call */
} fx_dlv;

/* false: out of memory (fx_dlv_free still required). */
bool fx_dlv_init(fx_dlv *d, const fx_dlv_cfg *cfg, const fx_dlv_ops *ops, void *ctx);
void fx_dlv_free(fx_dlv *d);

/* Room for more deliveries: max_ack_pending minus those out (NAK-delayed ones not counted) and
 * the NAK-delayed ones due and waiting for a slot. */
size_t fx_dlv_room(const fx_dlv *d);
/* Take a delivery fetched from the MQ (msg decoded from dv->value; delivered: attempts made
 * before, from the attempt record). FX_OK: the engine owns it (*dv zeroed): queued for
 * publication, or handed to the dead-letter path when its attempts are used up. FX_EFULL:
 * max_ack_pending in flight (or out of memory): refused, *dv untouched. */
fx_err fx_dlv_accept(fx_dlv *d, fx_mq_delivery *dv, const fx_mq_msg *msg, uint64_t delivered);
/* Commit a delivery without publishing it (e.g. a record that does not decode): the engine
 * takes *dv and frees it. */
void fx_dlv_drop(fx_dlv *d, fx_mq_delivery *dv);
/* An ack (or no-responders status) for the delivery (claim_seq, nonce). reply: an AckSync reply
 * handle (or NULL), always answered through ops.reply (now or at the next flush). */
fx_dlv_res fx_dlv_event(fx_dlv *d, fx_dlv_kind kind, uint64_t claim_seq, uint64_t nonce,
                        int64_t delay_ns, void *reply);
/* A +TERM carrying a reason (detail: text, up to FX_DLV_DETAIL_MAX bytes kept; NULL or "": none):
 * as fx_dlv_event(FX_DLV_TERM, ...); the entry keeps the reason (fx_dlv_detail) until it leaves,
 * so a dead letter handed again (RETRY) still has it. */
fx_dlv_res fx_dlv_term(fx_dlv *d, uint64_t claim_seq, uint64_t nonce, const char *detail, void *reply);
/* The TERM reason of entry idx, or NULL. Valid until the entry leaves the engine. */
const char *fx_dlv_detail(const fx_dlv *d, uint32_t idx);
/* The dead letter of entry idx (generation gen, from when it was handed over) was stored (ok)
 * or not. Completions of released entries are ignored. */
void fx_dlv_dlq_done(fx_dlv *d, uint32_t idx, uint64_t gen, bool ok);
/* Move what is due and publish what may go. */
void fx_dlv_run(fx_dlv *d);
/* Commit the gathered acks and answer their AckSync replies. */
void fx_dlv_flush(fx_dlv *d);
/* ms until the next entry is due (0: now), or INT64_MAX. */
int64_t fx_dlv_next_due(const fx_dlv *d);
/* Entries in state st. */
size_t fx_dlv_count(const fx_dlv *d, uint8_t st);
/* The consumer is lost: release every entry; gathered acks dropped, replies answered false. */
void fx_dlv_release_all(fx_dlv *d);
/* Release the entries fetched from sub-MPSC chan, except dead letters in progress (they finish). */
void fx_dlv_release_chan(fx_dlv *d, int64_t chan);

#endif
