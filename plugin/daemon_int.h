/* daemon_int.h -- internal contract between daemon.c, chan.c, capture.c, origin.c and claim.c (not
 * a public API).
 *
 * Ownership and threads (docs/ARCHITECTURE.md "Threads": one owner per piece of state, bounded
 * queues):
 *  - fx_daemon: created and freed by main; `reg` (rwlock) guards the active channel list and
 *    every channel's claim list. Writers: the interest thread (claims) and the control thread
 *    (channels, drain). Readers: NATS callbacks (ack routing), house-keeping, admin.
 *    Lock order: reg -> claim.mu / pq.mu / chan.mu. Nobody takes reg while holding another lock.
 *  - dm_chan (chan.h): one configured (or DLQ) channel. Its producer queue `q` is written by NATS capture
 *    callbacks and by claims (dead letters) and read by its producer thread only. Reference
 *    counted (`refs`): the daemon while the channel is configured (dropped once a reload has
 *    stopped it), each capture subscription until its completion callback (cnats
 *    natsSubscription_SetOnCompleteCB: the last message callback has returned), and house-keeping
 *    while it works on a snapshot. The last reference frees it (dm_chan_unref).
 *  - fx_config: the current one is shared (fx_config_share); readers that use it outside cfg_mu
 *    take a reference (dm_cfg_get), so a replaced config is freed when its last reader is done.
 *  - dm_claim: reference counted (registry, the claim scheduler, each dead-letter item in a
 *    producer queue). It has no thread: it is a strand of the daemon's executor (claim.c, kind
 *    FX_EXEC_K_CLAIM), which runs its steps one at a time. Its event queue is written by the ack
 *    callbacks (bounded, full -> dropped and counted; the message is redelivered after ack_wait)
 *    and read by its steps; completed dead letters come back through `dlq_done` (never dropped;
 *    bounded by the in-flight table). Lock order: claim.mu -> claim.sq_mu -> the executor's lock.
 *
 * Stored message form: bridge/flatdict.h fx_mq_msg; its "headers" entry is the header block of
 * hdr.h. The producer queue (its items, bounds and lock) is pqueue.h. Both are included here.
 */
#ifndef FX_PLUGIN_DAEMON_INT_H
#define FX_PLUGIN_DAEMON_INT_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chanq.h"
#include "chan.h"
#include "config.h"
#include "daemon.h"
#include "dmctx.h"
#include "fluxon_mq.h"
#include "fx_log.h"
#include "hdr.h"
#include "http.h"
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

/* ---- channel: chan.h (dm_chan, its metrics and references); producer queue: pqueue.h -------- */

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

/* ---- daemon ----------------------------------------------------------------------------------- */
struct fx_daemon {
    char *cfg_path;
    fx_config *cfg;       /* current (shared; one reference); replaced by reload under cfg_mu */
    fx_config *cfg_start; /* the start config: a reference kept for the daemon's lifetime (the
                             connections made at start were set up from it) */
    pthread_mutex_t cfg_mu;
    char name[128];
    int64_t start_ms;
    uint64_t origin_key[2]; /* Fluxon-Origin key: getrandom at start, read-only after, never logged */

    natsOptions *opts;
    natsConnection *nc;
    fx_leaf *leaf; /* nats.leaf_url set: explicit-ack deliveries go through it (read-only after
                      start; thread-safe) */
    bool nats_opened;
    natsSubscription *ack_sub, *js_ack_sub, *nr_sub;
    natsSubscription *admin_subs[5];
    size_t n_admin_subs;
    struct fx_jsapi *jsapi; /* JetStream API subset (jsapi.h); NULL when off */
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
    fx_http *http;
    fx_metric *g_invalid_acks, *g_stale_acks, *g_invalid_control, *g_acks_dropped, *g_lease_ka_fail,
        *g_etcd_req, *g_etcd_lat, *g_reconnects, *g_slow, *g_payload_missing, *g_claims_total, *g_leaf_up, *g_leaf_connects;
    fx_metric *g_plane_lost, *g_kv_refusing, *g_kv_refused, *g_kv_oom, *g_kv_wait_short;

    pthread_rwlock_t reg;
    dm_chan **chans; /* active (the daemon's reference each) */
    size_t n_chans;

    /* background threads (interest, house-keeping, admin) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop_interest; /* interest thread (first step of a drain) */
    bool stop_late;     /* house-keeping and admin threads (just before the MQ client closes) */
    pthread_t interest_thr, hk_thr, admin_thr, ctl_thr;
    bool interest_started, hk_started, admin_started, ctl_started;

    /* admin queue (under mu) */
    struct dm_admin_req *aq_head, *aq_tail;
    size_t aq_n;

    /* control (under mu) */
    bool ctl_reload, ctl_stop, ctl_exit;

    /* health (under health_mu) */
    pthread_mutex_t health_mu;
    bool etcd_ok;
    char etcd_err[256];

    atomic_bool stopping; /* drain started: no new claims, no new deliveries */
    atomic_bool fatal;
    bool drained;
    int done_fd;
    atomic_int exit_code; /* written by the control thread, read by main after done_fd */
};

/* ---- capture.c ---------------------------------------------------------------------------------- */
fx_err dm_chan_start(dm_chan *ch);          /* producer thread + capture subscriptions */
/* Drain the capture subscriptions (unsubscribe when NATS is down), then wait until deadline. */
void dm_chan_drain_capture_begin(dm_chan *ch);
void dm_chan_drain_capture_wait(dm_chan *ch, int64_t deadline_ms);
void dm_chan_stop_producer_begin(dm_chan *ch);
void dm_chan_stop_producer_wait(dm_chan *ch);
/* The producer queue (dm_pq_*): pqueue.h. The header block codec (dm_hdr_*): hdr.h. */
size_t dm_max_msg_bytes(fx_daemon *d);
void dm_reply_error(fx_daemon *d, const char *reply, int code, const char *desc);

/* ---- origin.c: origin.h (dm_origin_tag, dm_origin_ours) ----------------------------------------- */

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
