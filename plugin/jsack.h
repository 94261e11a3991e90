/* jsack.h -- the JetStream-shaped wire pieces of the bridge (pure, thread-safe, bounded).
 *
 * Ack reply subject of a delivery (12 tokens, deploy/README.md "Ack reply subjects"), parsed by JetStream clients as
 * metadata (domain, account hash, stream, consumer, delivered, stream seq, consumer seq,
 * timestamp, pending):
 *   $JS.ACK.FLUXON.<bridge>.<channel>.<claim>.<delivered>.<seq>.<claim seq>.<ts ns>.<pending>.<nonce>
 * <seq> is the bridge's message sequence (stream seq). The nonce is a random token that binds
 * the ack to one delivery attempt. The bridge subscribes to "$JS.ACK.FLUXON.<bridge>.>".
 *
 * Ack bodies (JetStream vocabulary): empty or "+ACK" ack; "-NAK" redeliver, optionally followed by
 * JSON {"delay":<nanoseconds>}; "+WPI" in progress (extend ack wait); "+TERM" (optionally with a
 * reason) dead-letter. Anything else is FX_ACK_INVALID (count it, ignore it).
 *
 * PubAck (reply to a publish on a capture subject): {"stream":"<channel>","seq":<n>} on success,
 * {"error":{"code":<n>[,"err_code":<n>],"description":"..."}} on failure (503 + 10077 channel
 * full, 413 too large, 500).
 */
#ifndef FX_PLUGIN_JSACK_H
#define FX_PLUGIN_JSACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FX_JSACK_PREFIX "$JS.ACK.FLUXON."
#define FX_JSACK_SUBJECT_MAX 512

typedef struct fx_ack_meta {
    char bridge[128];
    char channel[128];
    char claim[128];
    uint64_t delivered;  /* attempt number, >= 1 */
    uint64_t seq;        /* message sequence */
    uint64_t claim_seq;  /* per-claim delivery counter */
    int64_t ts_ns;       /* delivery time */
    uint64_t pending;    /* messages pending for the claim at delivery time */
    uint64_t nonce;
} fx_ack_meta;

/* Build the reply subject into out (cap bytes). Returns its length, or -1 if it does not fit or a
 * name is not a valid single token. */
int fx_ack_subject_build(const fx_ack_meta *m, char *out, size_t cap);
/* Parse a reply subject; 0 on success, -1 if it is not exactly our 12-token layout. */
int fx_ack_subject_parse(const char *subject, fx_ack_meta *out);

typedef enum {
    FX_ACK_ACK = 0,
    FX_ACK_NAK,
    FX_ACK_WPI,
    FX_ACK_TERM,
    FX_ACK_INVALID
} fx_ack_kind;

/* Classify an ack body; for -NAK with {"delay":ns} sets *delay_ns (else 0). */
fx_ack_kind fx_ack_body_parse(const void *body, size_t len, int64_t *delay_ns);

/* PubAck JSON into out; returns length or -1 if it does not fit. */
int fx_puback_ok(const char *stream, uint64_t seq, char *out, size_t cap);
int fx_puback_err(int code, const char *description, char *out, size_t cap);
/* With JetStream's numeric error code too (nats.go APIError.ErrorCode, nats.js api_error.err_code):
 * {"error":{"code":<code>,"err_code":<err_code>,"description":"..."}}; err_code <= 0: as above. */
int fx_puback_err_code(int code, int err_code, const char *description, char *out, size_t cap);
#define FX_JS_ERR_MAX_MSGS 10077        /* "maximum messages exceeded" (JSStreamStoreFailedF's
                                           store error for a full stream, DiscardNew) */
#define FX_JS_ERR_INSUFFICIENT_RESOURCES 10023 /* JSInsufficientResourcesErr (503): the store is
                                                * full (Redis maxmemory, etcd quota) */
#define FX_JS_ERR_STREAM_MISMATCH 10060 /* Nats-Expected-Stream names another stream */

#endif
