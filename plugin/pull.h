/* pull.h -- the pull front-end of the delivery engine (DESIGN 5.1): JetStream pull requests
 * ($JS.API.CONSUMER.MSG.NEXT.<channel>.<consumer>) for a durable consumer created through the
 * JetStream API (jsapi.h). A pull consumer is a claim (claim.c) named after the consumer, run with
 * the consumer's stored settings (ack_wait, max_deliver, max_ack_pending, backoff, nak_delay); its waiting
 * pull requests are its interest: the claim is made ready while requests wait on this bridge and
 * released after the channel's release_after with no request waiting and no ack (plus the
 * consumer's ack_wait while delivered messages await their ack).
 *
 * Requests (nats-server consumer.go processNextMsgRequest): a JSON body {"batch","expires",
 * "no_wait","max_bytes","idle_heartbeat"} (durations in ns), a bare number (the batch) or an empty
 * body (batch 1). Served like JetStream's wait queue: the head request gets one message, then goes
 * to the back while it wants more (arrival order, round robin over the workers). Messages go to
 * the request's reply subject over the leaf connection with the exact "$JS.ACK." reply (acks flow
 * through dm_on_ack and the engine as for push claims). Status messages (header-only, to the
 * reply subject, over the leaf connection):
 *   404 No Messages            no_wait, nothing could be delivered now and none was
 *   408 Request Timeout        expires passed (or no_wait after a partial batch), with
 *                              Nats-Pending-Messages / Nats-Pending-Bytes: what the request still
 *                              wanted
 *   409 Exceeded MaxWaiting    max_waiting requests already wait (consumer's, default 512)
 *   409 Exceeded MaxRequestBatch of N / MaxRequestMaxBytes of N / MaxRequestExpires of D
 *                              the consumer's max_batch / max_bytes / max_expires (batch is also
 *                              bounded by FX_PULL_MAX_BATCH)
 *   409 Message Size Exceeds MaxBytes  the next message does not fit in the request's bytes left
 *   409 Consumer Deleted       the consumer was deleted (to every waiting request)
 *   409 Server Shutdown        the bridge drains
 *   100 Idle Heartbeat         every idle_heartbeat while a request waits without a message
 * A waiting request whose client is gone (no subscriber on its reply: dm_pull_abandoned) is
 * dropped without an answer, before it is served and by the timers, as JetStream does.
 * Pull consumers need nats.leaf_url (a "$JS.ACK." reply and a status line can only be sent over
 * the leaf connection); without it MSG.NEXT is answered with a JetStream error (400/10003).
 *
 * Bounds: waiting requests per consumer per bridge: max_waiting (<= FX_JSAPI_MAX_WAITING); a
 * request's reply subject at most FX_PULL_REPLY_MAX bytes; batch <= FX_PULL_MAX_BATCH; expires
 * and idle_heartbeat <= 24 h, heartbeat >= FX_PULL_MIN_HB_MS.
 * Threads: requests are queued by the JetStream API worker (dm_pull_submit) under the claim's
 * mutex; the claim's steps serve them and answer no_wait and deleted-consumer requests; the
 * API's timer thread (jsapi.c) expires them and sends their heartbeats (dm_pull_timers).
 */
#ifndef FX_PLUGIN_PULL_H
#define FX_PLUGIN_PULL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define FX_PULL_MAX_BATCH 1000000
#define FX_PULL_REPLY_MAX 512
#define FX_PULL_MIN_HB_MS 100
#define FX_PULL_MAX_DUR_MS (24LL * 3600 * 1000)

struct fx_daemon;
struct cJSON;

/* The settings of a pull consumer (from its stored config, jsapi.c). */
typedef struct dm_pull_cfg {
    int64_t ack_wait_ms, max_deliver, max_ack_pending;
    int64_t backoff_ms[FX_CFG_MAX_BACKOFF];
    size_t n_backoff;
    int64_t nak_delay_ms; /* a plain NAK's delay when there is no backoff list */
    int64_t max_waiting;
    int64_t max_batch, max_bytes, max_expires_ms; /* 0: no limit of the consumer */
} dm_pull_cfg;

typedef struct dm_pull_req {
    char reply[FX_PULL_REPLY_MAX + 1];
    int64_t batch;      /* messages still wanted */
    int64_t bytes;      /* bytes left (max_bytes > 0) */
    int64_t max_bytes;  /* 0: none */
    int64_t expires_ms; /* monotonic deadline, 0: none */
    int64_t hb_ms;      /* idle heartbeat interval, 0: none */
    int64_t next_hb_ms;
    int64_t delivered;  /* messages sent to it */
    bool no_wait;
    bool sending;       /* a delivery to it is being published (the claim's step; not expired) */
    bool had_interest;  /* the hub has shown a subscriber for its reply (dm_pull_abandoned) */
} dm_pull_req;

/* The waiting requests of one pull claim (dm_claim.pull), under the claim's mutex. */
typedef struct dm_pull {
    dm_pull_cfg cfg;
    dm_pull_req *wq; /* ring of cfg.max_waiting */
    size_t head, n;
    bool closed;     /* the claim is ending: new requests go to a new claim */
    bool deleted;    /* the consumer was deleted: answer 409 Consumer Deleted */
    int64_t idle_since_ms; /* steps only: last time a request waited or an ack came */
    /* ConsumerInfo numbers of the claim's engine, refreshed by its steps: delivered and not
     * acked, of them redelivered, claim seqs issued, ack floor (claim seq) */
    int64_t num_ack_pending, num_redelivered;
    uint64_t delivered_seq, ack_floor_seq;
} dm_pull;

/* The consumer's settings from its stored config (the channel's fill what is missing: backoff
 * when the config has neither "backoff" nor "nak_delay", nak_delay when it has no "nak_delay"). */
void dm_pull_cfg_from_json(const struct cJSON *config, const fx_chan_settings *cs, dm_pull_cfg *out);
/* Parse a pull request body (len bytes, not necessarily NUL-terminated) against cfg. true: *out
 * filled (reply copied, deadlines from now_ms). false: *code and desc (a JetStream status, e.g.
 * 409 "Exceeded MaxRequestBatch of 10", 400 "Bad Request") to answer with. */
bool dm_pull_parse(const char *body, size_t len, const char *reply, const dm_pull_cfg *cfg,
                   int64_t now_ms, dm_pull_req *out, int *code, char *desc, size_t dcap);
/* Send a status message (header only) to reply over the leaf connection; pend_msgs >= 0 adds the
 * Nats-Pending-Messages / Nats-Pending-Bytes headers. false: not sent (no leaf, or it failed). */
bool dm_pull_status(struct fx_daemon *d, const char *reply, int code, const char *desc,
                    int64_t pend_msgs, int64_t pend_bytes);

/* Is the client of request r gone? JetStream drops a waiting request whose reply subject has no
 * subscriber left (a worker that stopped or died); so does the bridge, from the hub's interest
 * on the leaf connection (fx_leaf_has_interest): true when the reply had a subscriber and has
 * none now. A reply that never showed one (its LS+ not here yet: it travels on the leaf
 * connection, the request on the client connection; or a reply the hub does not announce)
 * keeps its request until it expires. false while the leaf is down. Caller holds the claim's
 * mutex (r->had_interest is updated). */
bool dm_pull_abandoned(struct fx_daemon *d, dm_pull_req *r);

/* Ring operations (caller holds the claim's mutex). */
bool dm_pull_push(dm_pull *p, const dm_pull_req *r); /* false: max_waiting requests wait */
dm_pull_req *dm_pull_at(dm_pull *p, size_t i);       /* i-th in arrival order (i < n) */
void dm_pull_remove(dm_pull *p, size_t i);           /* keeps the order of the others */
void dm_pull_rotate(dm_pull *p);                     /* the head goes to the back */

/* Queue a request (claim.c). Results: */
enum { DM_PULL_QUEUED = 0, DM_PULL_ANSWERED, DM_PULL_NEED_CFG, DM_PULL_NO_CHAN };
/* Hand the pull request (body, reply) for consumer name of channel chan to its pull claim on
 * this bridge, creating the claim (with cfg) when none runs. The request is parsed against the
 * running claim's settings (or cfg); a refusal (bad request, a bound, max_waiting) is answered
 * with its status here (DM_PULL_ANSWERED). cfg NULL and no claim runs: DM_PULL_NEED_CFG (read
 * the consumer's config and call again). The channel is not active: DM_PULL_NO_CHAN. Any thread
 * but a claim's step. */
int dm_pull_submit(struct fx_daemon *d, const char *chan, const char *name, const char *reply,
                   const char *body, size_t len, const dm_pull_cfg *cfg);
/* Expire waiting requests (408) and send idle heartbeats (100) of every pull claim, on time (the
 * JetStream API's timer thread, not the claims' steps, which may be busy with etcd). Returns the
 * monotonic ms of the next deadline, or INT64_MAX. */
int64_t dm_pull_timers(struct fx_daemon *d);
/* The consumer was deleted: its claim on this bridge answers its waiting requests 409 Consumer
 * Deleted and is released. */
void dm_pull_deleted(struct fx_daemon *d, const char *chan, const char *name);

#endif
