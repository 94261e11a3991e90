/* redrive.h -- moving dead letters back to their channel: one engine for `fluxonctl redrive` and
 * for the admin API call $FLUXON.API.CHANNEL.REDRIVE.<channel>-dlq answered by a bridge.
 *
 * The engine (fx_redrive_run) is a NATS client of the bridge, as any tool: it consumes the DLQ
 * through the claim whose delivery subject is o->subject, publishes each letter again to the
 * subject it was first published on (Fluxon-Subject) with its headers (not the Fluxon-* ones,
 * not Nats-Msg-Id / Nats-Expected-*), a Fluxon-Redriven count one higher and
 * Nats-Expected-Stream: <to>, and acks the letter only once the PubAck from <to> came. So at
 * least once: nothing is lost if anything dies mid-redrive; a letter whose PubAck was lost stays
 * in the DLQ and is counted "uncertain" (it may be in <to> too); a letter whose ack was not
 * confirmed is in <to> and may be in the DLQ still ("ack_unconfirmed"). At most o->rate letters
 * per second and CTL window (FX_REDRIVE_WINDOW) unanswered at once; it stops after o->max
 * letters, o->deadline_ms, when the DLQ stays empty for o->idle_ms (its backlog read through
 * o->backlog), on the first refused publish, or when o->stopped says so. Letters it received but
 * did not take are NAKed back.
 *
 * The API call (bridge side): a request to $FLUXON.API.CHANNEL.REDRIVE.<dlq> (queue group
 * fluxon-admin: one bridge answers) with an optional JSON body
 * {"to":"<channel>","max":N,"rate":R,"wait_ms":W,"deadline_ms":D} (defaults: the channel the DLQ
 * belongs to, 1000, 100/s, 2000, 10 min; caps as fluxonctl's) runs the engine on a thread of the
 * bridge with the claim "bridge-redrive" and answers when it is done with
 * {"dlq":..,"to":..,"moved":N,"failed":N,"uncertain":N,"ack_unconfirmed":N,"skipped":N,
 *  "seen_again":N,"ms":N}; errors: 404 (not a dead-letter channel of this bridge), 400 (bad
 * body), 409 (a redrive is already running on this bridge), 503 (draining). One redrive per
 * bridge at a time; a drain interrupts it (dm_redrive_stop) and it answers with what it did.
 *
 * Threads: fx_redrive_run on the caller's thread (it blocks); dm_on_redrive on a NATS callback
 * (never blocks: it starts the thread); dm_redrive_stop on the control thread (drain).
 */
#ifndef FX_PLUGIN_REDRIVE_H
#define FX_PLUGIN_REDRIVE_H

#include <stdbool.h>
#include <stdint.h>

#include <nats/nats.h>

#define FX_REDRIVE_MAX_DEFAULT 1000
#define FX_REDRIVE_MAX_CAP 100000
#define FX_REDRIVE_RATE_DEFAULT 100
#define FX_REDRIVE_RATE_CAP 10000
#define FX_REDRIVE_DEADLINE_DEFAULT_MS (10 * 60 * 1000)
#define FX_REDRIVE_DEADLINE_CAP_MS (24LL * 3600 * 1000)
#define FX_REDRIVE_IDLE_DEFAULT_MS 2000
#define FX_REDRIVE_HELD_MS 5000  /* idle with letters in the DLQ: wait this much longer */
#define FX_REDRIVE_STALL_MS 250  /* a PubAck slower than this pauses taking letters */
#define FX_REDRIVE_WINDOW 64     /* letters between re-publish and confirmed DLQ ack, at most */
#define FX_REDRIVE_HDR "Fluxon-Redriven"

typedef struct fx_redrive_opts {
    const char *dlq, *to;
    const char *subject; /* the DLQ's delivery subject for this redrive's claim */
    int64_t max, rate, idle_ms, deadline_ms, timeout_ms;
    int64_t (*backlog)(void *arg); /* the DLQ's backlog, -1 unknown */
    bool (*stopped)(void *arg);    /* interrupt (may be NULL) */
    void (*note)(void *arg, const char *line); /* why something went wrong (may be NULL) */
    void *arg;
} fx_redrive_opts;

typedef struct fx_redrive_result {
    int64_t moved, failed, uncertain, ack_unconfirmed, skipped, again, ms;
    bool timed_out, interrupted;
} fx_redrive_result;

/* Run a redrive (see the top). NATS_OK, or the error of the subscriptions it needed. */
natsStatus fx_redrive_run(natsConnection *nc, const fx_redrive_opts *o, fx_redrive_result *r);
/* The result as the API's JSON answer into out; its length, or -1 when it does not fit. */
int fx_redrive_json(const char *dlq, const char *to, const fx_redrive_result *r, char *out,
                    size_t cap);

/* Bridge side (dmctx.h's fx_daemon is the callback's arg). */
struct fx_daemon;
void dm_on_redrive(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg);
void dm_redrive_stop(struct fx_daemon *d);

#endif
