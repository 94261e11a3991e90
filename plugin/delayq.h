/* delayq.h -- delayed delivery in the daemon: the publish side (Nats-Schedule: @at <RFC 3339>,
 * Fluxon-Delay: <duration>) and the mover that puts due messages into their channel.
 *
 * Publish side: the capture callback hands a message with a delay header to
 * dm_delayq_capture, which never blocks: a malformed or unsupported header, or a delay above
 * the channel's max_delay (min(max_delay, retention)), is answered at once with a 400 PubAck
 * error and nothing is stored; a due time already passed returns false (the message is stored
 * as any other, at once); otherwise the message goes into the bounded write queue
 * (FX_DQ_WQ_MSGS / FX_DQ_WQ_BYTES; full -> 503 "bridge queue full"), and up to FX_DQ_WRITERS threads
 * store it in the delay index (bridge/delay.h: batched txns, the channel's metadata lease) and
 * PubAck it ({"stream":..,"seq":0,"fluxon_due_ms":N}) only once the txn is committed. A channel
 * whose backlog plus waiting delayed messages reach its capacity refuses delayed publishes with
 * JetStream's 503 10077 (the count is refreshed every FX_DQ_COUNT_MS, or 20 times as long as the
 * last count took when etcd is slow to count a large index, so the bound is checked
 * against a figure at most that old).
 *
 * Mover: one thread per bridge. Every FX_DQ_POLL_MS (FX_DQ_IDLE_POLL_MS for a channel with
 * nothing waiting; at once after a local store; at the due time of the next key a scan saw within
 * FX_DQ_LOOKAHEAD_MS) it reads the due keys of each channel (a window of at most FX_DQ_WINDOW,
 * moves per second at most FX_DQ_MOVE_RATE per bridge); when some are due it takes or confirms
 * the channel's mover lock (one mover per channel across bridges), queues them into the
 * channel's producer queue as captures whose Nats-Msg-Id is "fxd:<id>" (the channel's dedup
 * window drops a second move of the same entry), waits for them to be stored, and deletes their
 * keys. At least once: a move interrupted between the store and the delete (the bridge dies,
 * etcd unreachable) is moved again by the next holder; it is stored twice only when the
 * channel's dedup did not record the first store (duplicate_window 0, the record lost with the
 * bridge that stored it, or the second move later than duplicate_window).
 * Counts: fluxon_delayed_messages{channel} is refreshed by a count_only range every
 * FX_DQ_COUNT_MS (and by this bridge's stores and moves in between).
 *
 * Threads and ownership: up to FX_DQ_WRITERS writer threads (started on demand: a publish
 * finding no idle writer starts one; an idle bridge has none), the mover and a counter thread (counts
 * take seconds on a large index and never hold up moves); dm_delayq_start/stop/free on the
 * control thread (start, drain, free);
 * dm_delayq_capture on NATS callbacks; dm_delayq_waiting on any thread. The write queue and the
 * per-channel table are guarded by the delayq's lock (taken with no other lock held, or under
 * d->reg read: lock order reg -> delayq). A queued write holds a reference on its channel. A
 * moved message's pq_item calls back (pqueue.h `done`) from the producer side; the move batch it
 * points to is reference counted, so a mover that stopped waiting leaves it to the last one.
 */
#ifndef FX_PLUGIN_DELAYQ_H
#define FX_PLUGIN_DELAYQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dmctx.h"

#define FX_DQ_HDR_SCHEDULE "Nats-Schedule"
#define FX_DQ_HDR_DELAY "Fluxon-Delay"
#define FX_DQ_WQ_MSGS 65536          /* delayed publishes waiting to be stored, per bridge ... */
#define FX_DQ_WQ_BYTES (64u << 20)   /* ... and their bytes; full -> 503 */
#define FX_DQ_WRITERS 6              /* threads storing them (one txn each at a time) */
#define FX_DQ_TXN_BYTES (512u << 10) /* record bytes per txn (etcd's request limit is 1.5 MiB) */
#define FX_DQ_POLL_MS 200            /* due-key scan of a channel with delayed messages */
#define FX_DQ_IDLE_POLL_MS 1000      /* ... and of one without */
#define FX_DQ_LOOKAHEAD_MS 300       /* a scan also reads what is due this soon: its turn comes then */
#define FX_DQ_LOCK_CHECK_MS 5000     /* a held mover lock is read again this often (else: its lease) */
#define FX_DQ_COUNT_MS 2000          /* count_only refresh of fluxon_delayed_messages (its own thread) */
#define FX_DQ_COUNT_ETCD_MS 5000     /* deadline of one count (1,000,000 keys: ~1-3 s); past it the
                                        * figure is kept up by this bridge's stores and moves */
#define FX_DQ_WINDOW 256             /* due keys read and moved per scan */
#define FX_DQ_MOVE_RATE 20000        /* moves per second per bridge, at most */
#define FX_DQ_LOCK_TTL_S 3           /* mover lock lease: a dead mover's channels wait this long */
#define FX_DQ_CHANS_MAX 4096         /* channels tracked (more: no delays there, 503) */
#define FX_DQ_ETCD_MS 3000           /* deadline of each index call */

/* Start the writers and the mover (d->dq). */
fx_err dm_delayq_start(fx_daemon *d);
/* Drain step (after capture drained, before the producers stop): the mover stops (releasing its
 * locks), the writers store and answer what is queued, then exit. Idempotent. */
void dm_delayq_stop(fx_daemon *d);
void dm_delayq_free(fx_daemon *d); /* after stop and after every channel is gone */

/* The capture hook (see the top): true when the message was taken (queued or answered). */
bool dm_delayq_capture(dm_chan *ch, const char *subj, const char *reply, const char *hdr,
                       size_t hlen, const char *data, size_t dlen);
/* A header this module reads (so capture does not count it as a foreign Fluxon-* header). */
bool dm_delayq_is_header(fx_slice key);
/* Delayed messages of chan as last counted; -1 when unknown. Any thread. */
int64_t dm_delayq_waiting(fx_daemon *d, const char *chan);

#endif
