/* dmctx.h -- the daemon context: the state the plugin modules share (struct fx_daemon), its
 * bounds and header names, and the small accessors every module may call on it (dmctx.c). Not a
 * public API (that is daemon.h).
 *
 * Dependencies point one way: daemon.c (the wiring) creates the context and calls the modules
 * (capture.h, claim.h, delayq.h, jsapi.h, redrive.h, ...); a module gets the context as an
 * argument and reads it through this header, and never calls into daemon.c. What the daemon
 * does for a module on request is a callback pointer in the context set by fx_daemon_new
 * (nats_connect_aux). `make layers` (scripts/include_cycles.sh) fails on a module loop.
 *
 * Ownership and threads (docs/ARCHITECTURE.md "Threads": one owner per piece of state, bounded
 * queues):
 *  - fx_daemon: created and freed by main; `reg` (rwlock) guards the active channel list and
 *    every channel's claim list. Writers: the interest thread (claims) and the control thread
 *    (channels, drain). Readers: NATS callbacks (ack routing), house-keeping, admin.
 *    Lock order: reg -> claim.mu / pq.mu / chan.mu. Nobody takes reg while holding another lock.
 *  - dm_chan (chan.h): one configured (or DLQ) channel. Its producer queue `q` is written by
 *    NATS capture callbacks and by claims (dead letters) and read by its producer thread only.
 *    Reference counted (`refs`): the daemon while the channel is configured (dropped once a
 *    reload has stopped it), each capture subscription until its completion callback (cnats
 *    natsSubscription_SetOnCompleteCB: the last message callback has returned), and house-keeping
 *    while it works on a snapshot. The last reference frees it (dm_chan_unref).
 *  - fx_config: the current one is shared (fx_config_share); readers that use it outside cfg_mu
 *    take a reference (dm_cfg_get), so a replaced config is freed when its last reader is done.
 *
 * Stored message form: bridge/flatdict.h fx_mq_msg; its "headers" entry is the header block of
 * hdr.h. The producer queue (its items, bounds and lock) is pqueue.h. Both are included here;
 * the claim (dm_claim) is claim.h.
 */
#ifndef FX_PLUGIN_DMCTX_H
#define FX_PLUGIN_DMCTX_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chanq.h"
#include "chan.h"
#include "config.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "hdr.h"
#include "leaf.h"
#include "metrics.h"
#include "origin.h"
#include "pqueue.h"

/* ---- bounds ------------------------------------------------------------------------------------ */
#define FX_DM_DELIVERY_THREADS 4           /* cnats global delivery pool */
/* producer queue per channel: FX_DM_CAPQ_MAX_MSGS, FX_DM_CAPQ_MAX_BYTES (pqueue.h) */
#define FX_DM_SUB_PENDING_MSGS 65536       /* cnats pending per capture sub (slow consumer) */
#define FX_DM_SUB_PENDING_BYTES (128 << 20)
/* One batch = what queued while the previous batch was being stored (no linger: a lone publish
 * is stored at once, and under load the batches grow by themselves), at most this many messages
 * and bytes; the MQ writes it as one segment (<= 4096 msgs, 1 MiB) in one etcd txn. */
#define FX_DM_BATCH_MSGS 1024
#define FX_DM_BATCH_BYTES (1u << 20)
/* Batches of one channel being stored at once (the in-flight bound of its fx_chanq_prod,
 * bridge/chanq_prod.h), at most one per ready stream: a publisher is not bound by one store
 * latency at a time. */
#define FX_DM_INFLIGHT 4
/* A burst spreads over the ready sub-MPSCs R (when R > FX_DM_INFLIGHT): a batch takes at most
 * queued / R messages, but not fewer than this (one store round trip per few messages would cost
 * more than it spreads). */
#define FX_DM_SPREAD_MIN 8
#define FX_DM_PUT_TIMEOUT_MS 4000          /* etcd work of one batch (plus the channel's full_wait) */
#define FX_DM_MAX_MSG_BYTES (1u << 20)     /* payload + header block, before the headroom */
#define FX_DM_DELIVERY_HEADROOM 4096       /* room for the Fluxon-* delivery headers */
#define FX_DM_FETCH_MAX 128                /* messages per fx_chanq_cons_get */
#define FX_DM_EVQ_MIN 1024                 /* claim ack queue: max(2 * max_ack_pending, this) */
#define FX_DM_EVQ_MAX (1u << 20)
#define FX_DM_HK_MS 1000                   /* house-keeping: probe, metrics, views */
#define FX_DM_TRIM_MS 200                  /* house-keeping: malloc_trim (daemon.c) */
#define FX_DM_ADMINQ_MAX 64                /* admin requests waiting; full -> 503 */
#define FX_DM_NONE_GRACE_MS 20             /* ack none: wait for a no-responders before acking */
#define FX_DM_DRAIN_LINGER_MS 1000         /* drain: wait this long for outstanding acks */
#define FX_DM_DLQ_WAIT_MS 5000             /* release: wait for dead letters being stored */
#define FX_DM_IDLE_GET_MS 250             /* an idle claim's get wait (stop noticed within it) */
#define FX_DM_KEEPER_MS 1000               /* producer thread: re-check its producer when idle */

#define FX_DM_HDR_CHANNEL "Fluxon-Channel"
#define FX_DM_HDR_SUBJECT "Fluxon-Subject"
#define FX_DM_HDR_SEQ "Fluxon-Seq"
#define FX_DM_HDR_DELIVERED "Fluxon-Delivered"
#define FX_DM_HDR_ID "Fluxon-Id"
#define FX_DM_HDR_DEAD_REASON "Fluxon-Dead-Reason"
#define FX_DM_HDR_DEAD_DETAIL "Fluxon-Dead-Detail" /* the reason a +TERM carried */
#define FX_DM_HDR_MSG_ID "Nats-Msg-Id"               /* dedup (channel duplicate_window) */
#define FX_DM_HDR_EXPECTED "Nats-Expected-"          /* only ...-Stream is supported */
#define FX_DM_HDR_EXPECTED_STREAM "Nats-Expected-Stream"
/* Loop prevention by proof (deploy/README.md "Securing a deployment"): every delivery carries Fluxon-Origin, a keyed hash
 * (dm_origin_tag) of its subject and reply subject under a 128-bit key drawn from getrandom at
 * start. Capture skips a message only when its Fluxon-Origin verifies for the subject and reply it
 * arrived with, i.e. it is this bridge process's own delivery (the reply carries the per-delivery
 * nonce, so a tag is good for one delivery on one subject). Any other message with Fluxon-*
 * headers (e.g. a delivery republished to a capture subject) is captured and counted in
 * fluxon_foreign_headers_total. */
#define FX_DM_HDR_ORIGIN "Fluxon-Origin"
/* ack none reply: _FLUXON.NR.<bridge>.<chan>.<claim>.<claim seq>.<nonce> (the nonce binds a
 * no-responders status to the one delivery the bridge made; deploy/README.md "Securing a deployment") */
#define FX_DM_NR_PREFIX "_FLUXON.NR."
/* Ack reply subjects. nats-server (2.9.10 verified) refuses a client PUB whose reply starts with
 * "$JS.ACK." ("Publish Violation": reserved reply); a LEAFNODE connection is not checked. So:
 *  - with nats.leaf_url set, explicit-ack deliveries go over the leaf connection (leaf.h) with the
 *    exact jsack.h reply "$JS.ACK.FLUXON.<bridge>...." (deploy/README.md "Ack reply subjects");
 *  - without it they go over the client connection with "$JS.ACK." replaced by this prefix:
 *   $FLUXON.ACK.FLUXON.<bridge>.<channel>.<claim>.<delivered>.<seq>.<claim seq>.<ts>.<pending>.<nonce>
 *    (a client recovers JetStream metadata by swapping the first two tokens back to "$JS.ACK").
 * The bridge subscribes to both prefixes (dm_on_ack). */
#define FX_DM_ACK_PREFIX "$FLUXON.ACK."
#define FX_DM_JS_ACK_PREFIX "$JS.ACK."

/* The sequence shown to clients (PubAck "seq", Fluxon-Seq, the ack subject's stream seq). A stored
 * message is identified by (sub-MPSC chan, producer idx, msg id); msg ids restart per producer, so
 * the id alone repeats across sub-MPSCs and producers. The seq packs the three into 53 bits (exact
 * as a JSON/JavaScript number): chan mod 2^13 << 40 | pidx mod 2^8 << 32 | (msg + 1) mod 2^32.
 * Distinct within a channel unless 8192 sub-MPSCs or 256 producers of one sub-MPSC apart, never
 * 0 in practice (chan and pidx start at 1). The exact identity is "<chan>.<pidx>.<msg>" (PubAck
 * "fluxon_id", Fluxon-Id header). */
static inline uint64_t dm_seq(int64_t chan, int64_t pidx, int64_t msg)
{
    return ((uint64_t)chan & 0x1FFFu) << 40 | ((uint64_t)pidx & 0xFFu) << 32 |
           (((uint64_t)msg + 1) & 0xFFFFFFFFu);
}
#define DM_SEQ(id) dm_seq((id)->chan, (id)->pidx, (id)->msg)

/* ---- channel: chan.h (dm_chan, its metrics and references); producer queue: pqueue.h; claim:
 * claim.h (dm_claim) ------------------------------------------------------------------------ */

/* ---- daemon ----------------------------------------------------------------------------------- */
struct fx_daemon {
    fx_config *cfg;       /* current (shared; one reference); replaced by reload under cfg_mu */
    fx_config *cfg_start; /* the start config: a reference kept for the daemon's lifetime (the
                             connections made at start were set up from it) */
    pthread_mutex_t cfg_mu;
    char name[128];
    uint64_t origin_key[2]; /* Fluxon-Origin key: getrandom at start, read-only after, never logged */

    natsConnection *nc;
    fx_leaf *leaf; /* nats.leaf_url set: explicit-ack deliveries go through it (read-only after
                      start; thread-safe) */
    struct dm_delayq *dq;   /* delayed messages (delayq.h): set by start, read by capture */
    /* A connection of its own with the daemon's NATS settings (the start config) and no daemon
     * callbacks, for a tool the bridge runs as a client (redrive.h); the caller closes and
     * destroys it. Its subscriptions count as interest (only the daemon's own connections are
     * excluded). Set by fx_daemon_new, read-only after; any thread. */
    fx_err (*nats_connect_aux)(fx_daemon *d, const char *cname, natsConnection **out);
    atomic_int_fast64_t max_payload;

    /* The daemon's executor (bridge/executor.h, docs/EXECUTOR.md): every claim's steps (a strand
     * each) and the keeper's jobs run on it. Created by mq_setup before the MQ client and the
     * keeper, freed by fx_daemon_free after both, once no claim is scheduled. */
    fx_exec *exec;
    struct dm_sched {
        pthread_mutex_t mu;
        pthread_cond_t fin_cv; /* a claim finished (monotonic) */
        size_t users;          /* claims scheduled (their strands alive) */
    } sched;
    fx_mq_client *mq;
    fx_chanq_keeper *keeper; /* the consumed channels' keeper (bridge/chanq_keeper.h), with mq */
    fx_metrics *metrics;
    fx_metric *g_invalid_acks, *g_stale_acks, *g_invalid_control, *g_acks_dropped;

    pthread_rwlock_t reg;
    dm_chan **chans; /* active (the daemon's reference each) */
    size_t n_chans;

    /* background threads (interest, house-keeping, admin): their stop flags and the control
     * requests (daemon.c's own, in `own`) are under mu and signalled on cv */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop_interest; /* interest thread (first step of a drain) */

    atomic_bool stopping; /* drain started: no new claims, no new deliveries */

    /* daemon.c's own state (threads, subscriptions, admin queue, control flags, health, its
     * metrics): defined there, read by no module. */
    struct dm_own *own;
};


/* ---- accessors (dmctx.c) ----------------------------------------------------------------------- */
/* Active channel by name (caller holds d->reg). */
dm_chan *dm_find_chan_locked(fx_daemon *d, const char *name);
/* Interruptible wait on d->cv for ms (under d->mu); returns *flag (true: stop). */
bool dm_wait_flag(fx_daemon *d, const bool *flag, int64_t ms);
/* dm_wait_flag on d->stop_interest: true when the interest thread must stop. */
bool dm_bg_wait(fx_daemon *d, int64_t ms);
/* The daemon's NATS connection exists and is connected. Any thread. */
bool dm_nats_connected(fx_daemon *d);
/* The current config with a reference (release with fx_config_unref). Any thread. */
fx_config *dm_cfg_get(fx_daemon *d);
/* A fast non-cryptographic random number (xorshift, per thread, seeded by getrandom). */
uint64_t dm_rand64(void);

#endif
