/* meta.h -- Fluxon MQ value codecs: metadata JSON, id lists, decimal counters and offsets.
 *
 * Schemas (those of the Fluxon MQ reference implementation), written exactly with these field
 * names:
 *   ChanGlobalMeta      {"capacity":N,"ttl_seconds":N,"global_lease_id":N,
 *                        "global_long_lease_id":N,"payload_lease_id":N}
 *                       read aliases: "meta_lease_id"/"cluster_lease_id" -> global_lease_id,
 *                       "cluster_long_lease_id" -> global_long_lease_id (a field and its alias
 *                       together is a duplicate: rejected, as serde does).
 *   ProducerMemberMeta  {"producer_idx":"<pidx>","external_client_id":"..."|null}
 *   ChanMemberMeta      {"member_id":"<cidx>","role":"consumer"|"producer",
 *                        "external_client_id":"..."|null,"kvclient_sub_cluster":"..."|null}
 *   MPMC meta           {"capacity":N,"ttl_seconds":N,"created_at":F,"metadata_lease_id":N,
 *                        "payload_lease_id":N,"id_allocator_cluster_lease_id":N,
 *                        "retention_seconds":N (optional),"retention_legacy":true (optional)}
 *   mpsc_channels       ["17","21"]  (decimal strings, creation order, no duplicates)
 *
 * Integers and precision (the documented choice). etcd lease ids are often near 2^62, and a
 * double (what cJSON stores) holds integers exactly only up to 2^53. So:
 *  - Encoders write every int64 field as its exact decimal text (cJSON_CreateRaw), as a JSON
 *    number where the schema has a number and as a JSON string where it has a string.
 *  - Decoders accept an int64 field as a JSON string holding a canonical decimal, or as a JSON
 *    number. A number written as a plain integer literal (-?(0|[1-9][0-9]*)) is read from its
 *    exact source text, so every int64 survives (the text is recovered by a bounded scan of the
 *    input in document order, cross-checked against cJSON's value). A number with a fraction or
 *    exponent is accepted only if it is an exact integer of magnitude <= 2^53 (e.g. 1e3, 90.0).
 *  - Canonical decimal: optional '-', then "0" or [1-9][0-9]*; no '+', no spaces, no "-0", at
 *    most 20 bytes, inside int64. Anything else is rejected.
 * Decoders also reject: input that is not exactly one JSON value (trailing bytes), NUL bytes,
 * nesting deeper than FX_MQ_JSON_MAX_DEPTH, inputs over their byte bound, a duplicate field,
 * a missing required field, a wrong type, a value out of range (naming the field in
 * fx_err_detail()), strings over FX_MQ_STR_MAX bytes. Unknown fields are ignored (forward
 * compatibility, as serde does). Errors: FX_EPROTO for bad input, FX_EINVAL for bad arguments
 * (NULL pointers, an invalid struct given to an encoder), FX_ENOMEM.
 *
 * Ranges: capacity >= 1; FX_MQ_CODEC_MIN_TTL_SECONDS (1) <= ttl_seconds <= FX_MQ_MAX_TTL_SECONDS
 * (the product minimum, FX_MQ_MIN_TTL_SECONDS by default, is a client option checked by
 * fx__mq_cfg_validate, not by the codecs, so tests can use TTLs of a few seconds); lease
 * ids > 0 (payload_lease_id may be JSON null in ChanGlobalMeta on the wire, but readers require
 * a positive id, so the decoder rejects null as the reference readers do); member ids, idx
 * values and channel ids >= 0; created_at finite and >= 0 (optional on read, 0 when absent).
 *
 * Ownership: encoders return a malloc'd NUL-terminated JSON text in *out (caller frees with
 * free()); *out is NULL on error. Decoders borrow their input for the call and fill
 * caller-owned structs (no pointers into the input), except fx_mq_mpsc_list_decode (documented
 * there).
 * Thread rules: all functions are pure and thread-safe (error detail is per thread, fx_err.h).
 */
#ifndef FX_BRIDGE_META_H
#define FX_BRIDGE_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fx_err.h"
#include "keys.h"

/* Constants. */
#define FX_MQ_MIN_TTL_SECONDS 90          /* default product minimum (client opts.min_ttl_s) */
#define FX_MQ_CODEC_MIN_TTL_SECONDS 1     /* smallest ttl_seconds the codecs accept */
#define FX_MQ_MAX_TTL_SECONDS 9000000000LL /* etcd's MaxLeaseTTL */
#define FX_MQ_LONG_LEASE_TTL_SECONDS 1800  /* global-long / id-allocator cluster lease */
#define FX_MQ_PRODUCE_OFFSET_BEGIN (-1)    /* produce offset when the key is absent */
#define FX_MQ_CONSUME_OFFSET_BEGIN 0       /* consume offset when the key is absent */
#define FX_MQ_MEMBER_ID_RANGE 32           /* MPMC member ids allocated per range */
#define FX_MQ_ROLE_KEY_VALUE "dummy_value" /* value of MPMC role keys */
#define FX_MQ_NEXT_CHANNEL_ID_VALUE "0"    /* value of the dead next_channel_id key */
#define FX_MQ_DEFAULT_WEIGHT_VALUE "1"     /* producer_weight value */

/* Bounds. */
#define FX_MQ_STR_MAX 255             /* max bytes of a string field */
#define FX_MQ_META_JSON_MAX 16384     /* max bytes of a meta JSON input */
#define FX_MQ_MAX_MPSC_CHANNELS 4096  /* max entries of an mpsc_channels list */
#define FX_MQ_LIST_JSON_MAX (FX_MQ_MAX_MPSC_CHANNELS * 32 + 64) /* max bytes of a list input */
#define FX_MQ_JSON_MAX_DEPTH 8        /* max nesting of any JSON input (ours are flat) */
#define FX_MQ_DEC_MAX 20              /* max bytes of a decimal value ("-9223372036854775808") */
#define FX_MQ_DEC_BUF 21              /* buffer for fx_mq_dec_format (with NUL) */

/* ---- decimal values (counters, offsets, lease ids, weights, ready-key member ids) ----------- */

/* Strict canonical decimal int64 (see above) in [min, max]. data need not be NUL-terminated.
 * FX_EPROTO with a detail naming `what` (may be NULL: "value") on anything else. */
fx_err fx_mq_dec_parse(const void *data, size_t len, int64_t min, int64_t max, const char *what,
                       int64_t *out);
/* Write v as canonical decimal into buf (NUL-terminated); returns the length (1..20). */
size_t fx_mq_dec_format(int64_t v, char buf[FX_MQ_DEC_BUF]);

/* ID allocator counter value (last allocated id): >= 0. */
fx_err fx_mq_counter_decode(const void *data, size_t len, int64_t *out);
/* Produce offset (last written msg id): >= FX_MQ_PRODUCE_OFFSET_BEGIN. */
fx_err fx_mq_produce_offset_decode(const void *data, size_t len, int64_t *out);
/* Consume offset (next msg id to consume): >= FX_MQ_CONSUME_OFFSET_BEGIN. */
fx_err fx_mq_consume_offset_decode(const void *data, size_t len, int64_t *out);
/* A lease id value (cluster_lease keys): > 0. */
fx_err fx_mq_lease_id_decode(const void *data, size_t len, int64_t *out);
/* A member id value (ready keys, unique-key mappings): >= 0. */
fx_err fx_mq_id_decode(const void *data, size_t len, int64_t *out);

/* ---- ChanGlobalMeta --------------------------------------------------------------------------- */
typedef struct fx_mq_chan_meta {
    int64_t capacity;
    int64_t ttl_seconds;
    int64_t global_lease_id;
    int64_t global_long_lease_id;
    int64_t payload_lease_id;
    /* Payload layout (docs/ARCHITECTURE.md). false: one KV key per message (the reference layout; a
     * meta without the field). true: one segment per batch (bridge/segment.h), written as
     * "payload_format":"segment"; any other payload_format value is refused on decode. */
    bool segments;
} fx_mq_chan_meta;

fx_err fx_mq_chan_meta_encode(const fx_mq_chan_meta *m, char **out);
fx_err fx_mq_chan_meta_decode(const void *json, size_t len, fx_mq_chan_meta *out);

/* ---- ProducerMemberMeta ------------------------------------------------------------------------ */
typedef struct fx_mq_producer_meta {
    int64_t producer_idx;
    bool has_external_client_id; /* false: JSON null (or absent on read) */
    char external_client_id[FX_MQ_STR_MAX + 1];
} fx_mq_producer_meta;

fx_err fx_mq_producer_meta_encode(const fx_mq_producer_meta *m, char **out);
fx_err fx_mq_producer_meta_decode(const void *json, size_t len, fx_mq_producer_meta *out);

/* ---- ChanMemberMeta ----------------------------------------------------------------------------- */
typedef struct fx_mq_member_meta {
    int64_t member_id;
    fx_mq_role role;
    bool has_external_client_id;
    char external_client_id[FX_MQ_STR_MAX + 1];
    bool has_kvclient_sub_cluster;
    char kvclient_sub_cluster[FX_MQ_STR_MAX + 1];
} fx_mq_member_meta;

fx_err fx_mq_member_meta_encode(const fx_mq_member_meta *m, char **out);
fx_err fx_mq_member_meta_decode(const void *json, size_t len, fx_mq_member_meta *out);

/* ---- MPMC meta ---------------------------------------------------------------------------------- */
typedef struct fx_mq_mpmc_meta {
    int64_t capacity;
    int64_t ttl_seconds;
    double created_at; /* epoch seconds */
    int64_t metadata_lease_id;
    int64_t payload_lease_id;
    int64_t id_allocator_cluster_lease_id;
    /* Optional (0 / false when absent: a channel created before retention existed).
     * retention_seconds: TTL of the channel's data leases (metadata, payload, id-allocator and the
     * sub-MPSCs' global-long leases): how long the channel outlives its last member. ttl_seconds
     * is then the TTL of member leases only. retention_legacy: the value was recorded by an
     * upgrade from the TTL the old data leases were granted with, not chosen by a user. */
    int64_t retention_seconds;
    bool retention_legacy;
} fx_mq_mpmc_meta;

fx_err fx_mq_mpmc_meta_encode(const fx_mq_mpmc_meta *m, char **out);
fx_err fx_mq_mpmc_meta_decode(const void *json, size_t len, fx_mq_mpmc_meta *out);

/* ---- mpsc_channels list -------------------------------------------------------------------------- */
/* Encode n (<= FX_MQ_MAX_MPSC_CHANNELS) ids (each >= 0, no duplicates) as ["17","21"]. n may be
 * 0 ("[]"); ids may be NULL when n is 0. */
fx_err fx_mq_mpsc_list_encode(const int64_t *ids, size_t n, char **out);
/* Decode a list (strings or integer numbers, each >= 0, no duplicates, at most
 * FX_MQ_MAX_MPSC_CHANNELS, input at most FX_MQ_LIST_JSON_MAX bytes). On FX_OK *out_ids is a
 * malloc'd array of *out_n ids in list order (caller frees with free(); NULL when *out_n is 0).
 * On error *out_ids is NULL and *out_n 0. */
fx_err fx_mq_mpsc_list_decode(const void *json, size_t len, int64_t **out_ids, size_t *out_n);

#endif
