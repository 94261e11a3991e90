/* inspect.h -- a read-only view of one channel (MPMC) as plain data, for admin tools.
 *
 * fx_mq_inspect_channel reads everything it reports at one etcd revision: the name mapping first
 * (its header revision R), then the MPMC meta, the sub-MPSC list, the ready keys, the producer and
 * consumer role keys and every sub-MPSC's produce offsets, consume offsets and consumer
 * membership count at R, in read-only txns. A compaction between the reads restarts the read
 * (bounded attempts). Bounds: at most FX_MQ_MAX_MPSC_CHANNELS sub-MPSCs and at most
 * FX_MQ_INSPECT_RANGE_LIMIT keys per prefix range; a hit bound sets `truncated`.
 *
 * Backlog of a producer = produce_offset - consume_offset + 1, at least 0 (produce offset = last
 * written id, -1 when absent; consume offset = next id to consume, 0 when absent).
 *
 * Every etcd call uses the client's op deadline and holds a reference on the client's backends
 * (FX_ECLOSED once the client is closing).
 * Ownership: the arrays of a filled fx_mq_channel_info are malloc'd; fx_mq_channel_info_free
 * releases them (safe on a zeroed or already freed struct). fx_mq_inspect_names returns a
 * malloc'd array of malloc'd strings, released by fx_mq_inspect_names_free.
 * Thread rules: any thread, concurrently with the client's other calls.
 */
#ifndef FX_BRIDGE_INSPECT_H
#define FX_BRIDGE_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fluxon_mq.h"

#define FX_MQ_INSPECT_RANGE_LIMIT 4096 /* keys per prefix range */

typedef struct fx_mq_producer_offsets {
    int64_t pidx;           /* producer index inside the sub-MPSC */
    int64_t produce_offset; /* last written id; -1 when absent */
    int64_t consume_offset; /* next id to consume; 0 when absent */
    int64_t backlog;        /* produce_offset - consume_offset + 1, at least 0 */
} fx_mq_producer_offsets;

typedef struct fx_mq_sub_mpsc_info {
    int64_t chan_id;      /* the sub-MPSC's channel id */
    bool ready;           /* a consumer has it ready (its ready key exists) */
    int64_t owner_member; /* member id of that consumer; -1 when not ready or unreadable */
    int64_t backlog;      /* sum over its producers */
    int64_t consumers;    /* consumer membership keys (a bound consumer, ready or draining) */
    fx_mq_producer_offsets *producers; /* sorted by pidx */
    size_t n_producers;
} fx_mq_sub_mpsc_info;

typedef struct fx_mq_channel_info {
    bool mapped;      /* the name has an MPMC; false: every field but revision is zero */
    int64_t mpmc_id;
    int64_t revision; /* the etcd revision everything was read at */
    bool has_meta;    /* the MPMC meta was present and well-formed */
    int64_t capacity, ttl_seconds, retention_seconds; /* of the meta (retention defaults to ttl) */
    fx_mq_sub_mpsc_info *subs; /* in the order of the MPMC's sub-MPSC list */
    size_t n_subs;
    int64_t *producers;        /* member ids with the producer role, sorted */
    size_t n_producers;
    int64_t *consumers;        /* member ids with the consumer role, sorted */
    size_t n_consumers;
    int64_t backlog;           /* sum over the sub-MPSCs */
    bool truncated;            /* a bound was hit: the lists are incomplete */
} fx_mq_channel_info;

/* Read channel `name` (fx_mq_name_validate rules: FX_EINVAL otherwise). An unmapped name is not
 * an error: FX_OK with out->mapped = false. On error *out is zeroed. */
fx_err fx_mq_inspect_channel(fx_mq_client *c, const char *name, fx_mq_channel_info *out);
void fx_mq_channel_info_free(fx_mq_channel_info *info);

/* Names of every mapped channel (at most `max`), sorted as etcd returns the mapping keys. */
fx_err fx_mq_inspect_names(fx_mq_client *c, size_t max, char ***names, size_t *n);
void fx_mq_inspect_names_free(char **names, size_t n);

#endif
