/* pqueue.h -- a channel's producer queue: the bounded FIFO between the threads that capture or
 * dead-letter messages and the channel's producer thread, which stores them (capture.c).
 *
 * Items: one pq_item per message, one allocation (dm_pq_item_new*): the header, then the reply
 * subject and the Nats-Msg-Id (copied in), then rec_len bytes of encoded record the caller fills.
 *
 * Ownership: dm_pq_push takes the item when it returns true; on false the caller still owns it
 * (and answers or frees it). An item taken from the queue (dm_pq_take_locked) belongs to the
 * taker until it is requeued (dm_pq_requeue_front*: the queue owns it again) or completed. An
 * item with a completion hook (`done`: a dead letter, which holds a reference on its claim and
 * goes back to it; a due delayed message) is ended by dm_pq_item_done, which sets its result and
 * hands it to the hook; the queue's users never call into whoever queued it. The queue itself never frees an item: its
 * owner (the channel) empties it before dm_pq_destroy.
 *
 * Threads: `mu` guards every field of dm_pq, and the items while queued (their `next`). Writers:
 * NATS capture callbacks and claims (dead letters) through dm_pq_push, which locks. Reader: the
 * channel's producer thread (and a batch's completion, which gives back what was not stored),
 * through the *_locked calls under mu. `cv` is signalled when the queue turns non-empty; the producer also
 * uses mu and cv for its own batch state (capture.c), so mu is held only briefly, and the lock
 * order is reg -> mu (dmctx.h); dd_mu (capture.c) before mu; mu before the lock of the
 * channel's producer (bridge/chanq_prod.h, taken by fx_chanq_prod_room under mu).
 *
 * Bounds: at most FX_DM_CAPQ_MAX_MSGS items and FX_DM_CAPQ_MAX_BYTES bytes of records
 * (rec_len) per queue. A push that would exceed either is refused (false; capture answers
 * 503 "bridge queue full", a dead letter is retried by its claim), except that an empty queue
 * takes one item of any size (a record larger than the byte bound is still stored). A closed
 * queue refuses every push. Requeueing at the head checks no bound: the items were counted
 * when pushed, so the queue holds at most what it held before they were taken.
 */
#ifndef FX_PLUGIN_PQUEUE_H
#define FX_PLUGIN_PQUEUE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fx_err.h"

#define FX_DM_CAPQ_MAX_MSGS 16384          /* producer queue per channel: messages ... */
#define FX_DM_CAPQ_MAX_BYTES (64u << 20)   /* ... and bytes; full -> 503 "bridge queue full" */

typedef struct dm_claim dm_claim;

enum { PQ_CAPTURE = 0, PQ_DEADLETTER = 1 };

typedef struct pq_item {
    struct pq_item *next;
    int kind;
    char *reply;         /* capture: reply subject or NULL (points into the allocation) */
    char *msgid;         /* capture: Nats-Msg-Id when the channel dedups, else NULL (ditto) */
    uint8_t *rec;        /* encoded fx_mq_msg (points into the allocation) */
    size_t rec_len;
    int64_t in_ms;       /* fx_now_ms() when queued: its put deadline is in_ms + FX_DM_PUT_TIMEOUT_MS */
    /* dead letter: */
    dm_claim *claim;     /* reference held while the item lives */
    uint32_t ent_idx;
    uint64_t ent_gen;
    fx_err result;       /* set by dm_pq_item_done */
    uint8_t reopens;     /* put retried after the producer was reopened (at most 2) */
    /* Completion hook: an item queued by another module instead of a NATS publish (a dead letter,
     * claim.c; a due delayed message, delayq.h) sets it. Its end (stored, duplicate, failed, or
     * freed unstored with FX_ECLOSED) goes through dm_pq_item_done, which calls done(it, result)
     * exactly once instead of a PubAck; done takes (frees or keeps) the item. It runs on the
     * thread that ends the item (the producer thread, a put job of the channel's producer, or
     * the last dm_chan_unref), must not block and must not push to this queue. NULL: the item
     * is freed. done_arg and ent_idx are then the caller's. */
    void (*done)(struct pq_item *it, fx_err e);
    void *done_arg;
} pq_item;

typedef struct dm_pq {
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* monotonic clock (timed waits use fx_deadline_ts) */
    pq_item *head, *tail;
    size_t n, bytes;     /* items queued and the sum of their rec_len */
    bool closed; /* refuse new items */
    bool stop;   /* producer: exit once empty */
} dm_pq;

/* An empty, open queue / its lock and condition destroyed (the queue must be empty). */
void dm_pq_init(dm_pq *q);
void dm_pq_destroy(dm_pq *q);

/* A new item of kind (PQ_*) with copies of reply and msgid (NULL: none) and room for rec_len
 * record bytes at it->rec; in_ms is now, the rest zero. NULL when out of memory. Any thread. */
pq_item *dm_pq_item_new(int kind, const char *reply, size_t rec_len);
pq_item *dm_pq_item_new_id(int kind, const char *reply, const char *msgid, size_t rec_len);
void dm_pq_item_free(pq_item *it); /* an item without a completion hook */
/* End an item: result set, then its hook runs (which takes it), or it is freed. Any thread. */
void dm_pq_item_done(pq_item *it, fx_err result);

/* Queue it at the tail. false when the queue is full or closed (item not taken). Locks mu. */
bool dm_pq_push(dm_pq *q, pq_item *it);
/* The head item, removed (NULL when empty). Caller holds mu. */
pq_item *dm_pq_take_locked(dm_pq *q);
/* Put items taken from the queue back at its head, in order (items[0] first): no bound check.
 * The _locked form with mu held; the other locks it (n == 0: nothing, no lock). */
void dm_pq_requeue_front_locked(dm_pq *q, pq_item **items, size_t n);
void dm_pq_requeue_front(dm_pq *q, pq_item **items, size_t n);

#endif
