/* jsapi.h -- the JetStream API subset the bridge answers (DESIGN 5.2), so JetStream tools and
 * clients (the nats CLI, nats.go, @nats-io/jetstream) see each channel as a stream.
 *
 * Subjects: <P>.INFO, <P>.STREAM.NAMES, <P>.STREAM.LIST, <P>.STREAM.INFO.<channel>, the refused
 * <P>.STREAM.CREATE/UPDATE/DELETE/PURGE.<name>, and the durable consumers: <P>.CONSUMER.CREATE.
 * <channel>.<name>[.<filter>], <P>.CONSUMER.DURABLE.CREATE.<channel>.<name>, CONSUMER.INFO/DELETE.
 * <channel>.<name>, CONSUMER.NAMES/LIST.<channel>; <P> is "$JS.API" or, with jetstream.domain
 * D, "$JS.D.API". Every bridge of the account answers in the queue group "fluxon-jsapi" (one
 * answer per request). Pull requests <P>.CONSUMER.MSG.NEXT.<channel>.<name> go to the pull
 * front-end (pull.h: the consumer's claim on the bridge that got them; answers are messages and
 * status messages, not JSON). Other API subjects (direct gets, ...) are not subscribed: they find
 * no responder, as without JetStream. Replies are JetStream's JSON (server/jetstream_api.go):
 *   INFO          io.nats.jetstream.api.v1.account_info_response: streams = configured channels
 *                 (dead-letter channels included), consumers = consumer members of them, limits
 *                 unlimited (-1), "domain" when set, api totals of this bridge.
 *   STREAM.NAMES  io.nats.jetstream.api.v1.stream_names_response, paged (total/offset/limit 1024),
 *                 request {"offset":N,"subject":S} (S: channels with a subject overlapping S).
 *   STREAM.LIST   io.nats.jetstream.api.v1.stream_list_response, same paging (limit 256).
 *   STREAM.INFO.c io.nats.jetstream.api.v1.stream_info_response: a channel is a stream with
 *                 retention "workqueue", subjects = capture subjects, max_msgs = capacity,
 *                 max_msg_size = the bridge's message bound, duplicate_window (ns), discard
 *                 "new" (a full channel refuses publishes), storage "file" (etcd, or Redis with
 *                 require_fsync; "memory" otherwise), num_replicas = the etcd endpoints (1 for
 *                 Redis); state.messages = backlog, first/last_seq = the bridge's packed seqs
 *                 (internal dm_seq: ordered within one producer only), consumer_count = consumer
 *                 members. Bytes are not tracked by the MQ: state.bytes is 0.
 *   errors        {"type":...,"error":{"code":404,"err_code":10059,"description":"stream not
 *                 found"}}; stream create/update/delete/purge: JetStream's 10049/10069/10050/
 *                 10110 with "channels are configured in the bridge configuration"; unknown API
 *                 subjects: 400/10003; a request body larger than FX_JSAPI_MAX_REQ or not JSON:
 *                 400/10025.
 * Durable consumers: the config of consumer N of channel C is stored in etcd at
 * <root>/js_consumers/C/N as {"config":<ConsumerConfig>,"created":<unix ns>}, so it survives
 * restarts and every bridge answers the same. CREATE is create-or-update (JetStream 2.9; with
 * "action":"create" a different existing config is 10148, "update" of a missing one 10149).
 * The config is normalised to what the channel does: deliver_policy all, replay instant,
 * ack_policy the channel's, no filter (a filter_subject/filter_subjects that covers every
 * subject of the channel, equal or wider, is accepted and dropped; a narrower one: 10012), no push
 * (deliver_subject: 10012, subscribe to <deliver_prefix>.<name> instead); ack_wait, max_deliver,
 * max_ack_pending default to the channel's; max_waiting to 512 (<= FX_JSAPI_MAX_WAITING); backoff
 * at most 16 entries; durations at most 24h. "nak_delay" (ns; a bridge setting JetStream does not
 * have) is the delay of a plain NAK when there is no backoff list; a consumer with "nak_delay" and
 * no "backoff" has no backoff list, one with neither uses the channel's backoff and nak_delay. Pull requests run with these settings (read when
 * the pull claim starts); a push claim of the same name runs with the channel's settings.
 * DELETE also answers the waiting pull requests of this bridge (409 Consumer Deleted).
 * ConsumerInfo: num_pending = the channel's backlog (stored, not yet acknowledged), push_bound
 * when this bridge holds a push claim of that name; num_waiting, num_ack_pending,
 * num_redelivered, delivered.consumer_seq and ack_floor.consumer_seq from this bridge's pull
 * claim of that name (as its steps last saw them; 0 without one; stream seqs 0).
 * Every reply carries the header "Fluxon-Bridge: <bridge name>" so a bridge can tell another
 * bridge's answer from a real JetStream's (fx_jsapi_check).
 *
 * Bounds: at most FX_JSAPI_QUEUE requests wait for the worker (full: 503 JetStream-shaped, counted
 * in the log every 10 s); each answer reads etcd with the MQ client's op deadline.
 * Threads: NATS callbacks only copy and enqueue; one worker thread reads etcd and replies (and
 * hands pull requests to their claims); one timer thread expires waiting pull requests and
 * sends their heartbeats on time (dm_pull_timers).
 * Ownership: fx_jsapi belongs to the daemon (daemon.c), created by fx_jsapi_start and released by
 * fx_jsapi_free after fx_jsapi_stop.
 */
#ifndef FX_PLUGIN_JSAPI_H
#define FX_PLUGIN_JSAPI_H

#include <stddef.h>

#include "fx_err.h"

#define FX_JSAPI_QUEUE 128          /* requests waiting for the worker */
#define FX_JSAPI_MAX_REQ (64 << 10) /* request body bytes */
#define FX_JSAPI_PROBE_MS 2000      /* start: wait for an answer to <P>.INFO */
#define FX_JSAPI_HDR_BRIDGE "Fluxon-Bridge"
#define FX_JSAPI_MAX_CONSUMERS 256  /* durable consumers per channel (more: 10026) */
#define FX_JSAPI_MAX_WAITING 4096   /* a consumer's max_waiting */
#define FX_JSAPI_ETCD_MS 5000       /* deadline of each consumer read/write in etcd */

struct fx_daemon;
typedef struct fx_jsapi fx_jsapi;

/* The API prefix of a config ("$JS.API" or "$JS.<domain>.API") into out; NULL when the API is
 * off (jetstream.api false). */
const char *fx_jsapi_prefix(const struct fx_daemon *d, char *out, size_t cap);

/* Start-time coexistence check, before anything subscribes: asks <P>.INFO. No answer (no
 * responders, or no answer within FX_JSAPI_PROBE_MS) or another bridge's answer: FX_OK. A real
 * JetStream's answer: FX_EINVAL with a detail that names jetstream.domain and jetstream.api (the
 * bridge refuses to start: exit 2). NATS not connected yet: FX_OK with a warning (not checked). */
fx_err fx_jsapi_check(struct fx_daemon *d);

/* Subscribe <P>.> (queue group fluxon-jsapi) and start the worker. API off: FX_OK, *out NULL. */
fx_err fx_jsapi_start(struct fx_daemon *d, fx_jsapi **out);
/* Drain step: unsubscribe (no new requests). NULL ignored. */
void fx_jsapi_unsubscribe(fx_jsapi *j);
/* Stop the worker (queued requests get no answer) and join it. NULL ignored. */
void fx_jsapi_stop(fx_jsapi *j);
void fx_jsapi_free(fx_jsapi *j);

#endif
