/* plane.h -- the payload plane of the MPSC data path (internal; used by mpsc_prod.c and mpsc_cons.c).
 *
 * One data-path shape, three planes. A producer writes a batch as its payloads plus the
 * produce-offset txn (compare offset == first-1 and membership, put offset = last); a consumer
 * commit moves consume offsets and deletes the committed payloads. What differs is where the
 * payload operations go:
 *   etcd fused (FX_PLANE_FUSED, default: payloads in the control-plane etcd): the payload puts
 *     ride in the produce-offset txn (one round trip per batch) and the payload deletes in the
 *     commit txn (deleted with the offset move, never pending).
 *   etcd split (FX_PLANE_SPLIT, kv_endpoints) and Redis (FX_PLANE_REDIS, kv_redis_url): payload
 *     put_many first, then the offset-only txn (an offset never covers a payload not written:
 *     a retry rewrites the same ids with the same values); commit: the offsets txn, then one
 *     delete_range per producer, retried while pending.
 * Reads (fetch) are the same on every plane: fx_kv get_range over the payload keys.
 *
 * Thread rules: no state of its own; an fx_plane_batch belongs to the one put that built it,
 * an fx_plane_dels to the one commit that built it.
 */
#ifndef FX_BRIDGE_PLANE_H
#define FX_BRIDGE_PLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mq_int.h"

typedef enum { FX_PLANE_FUSED = 0, FX_PLANE_SPLIT, FX_PLANE_REDIS } fx_plane_kind;

fx_plane_kind fx__plane_kind(const fx_mq_client *c);
/* Payload writes and deletes go in the control-plane txns (fused). */
static inline bool fx__plane_fused(const fx_mq_client *c) { return c->kv_shared; }

/* The payload writes of one batch (nkeys payload keys) and the txn ops that carry them. */
typedef struct fx_plane_batch {
    fx_mq_client *c;
    size_t nkeys;
    int64_t lease;     /* payload lease */
    fx_op *ops;        /* txn success ops: the payload puts (fused), then the offset put */
    size_t nops;
    fx_kv_item *items; /* split: the payload items of put_many */
    char *fk;          /* fused: full keys of the payload puts */
    fx_mq_key *rel;    /* relative payload keys */
    bool written;      /* split: put_many succeeded (orphans to remove if the txn is refused) */
} fx_plane_batch;

fx_err fx__plane_batch_init(fx_plane_batch *b, fx_mq_client *c, size_t nkeys, int64_t lease);
/* Payload i: key (relative, copied) and value (borrowed until the batch is freed). */
fx_err fx__plane_batch_set(fx_plane_batch *b, size_t i, const fx_mq_key *rel, fx_slice value);
/* The last success op of the txn: the caller sets the produce-offset put there. */
static inline fx_op *fx__plane_batch_offset_op(fx_plane_batch *b) { return &b->ops[b->nops - 1]; }
/* Before each txn attempt: split planes write the payloads (idempotent: same ids, same values);
 * fused: nothing. FX_ELEASE_EXPIRED: the payload lease is gone. */
fx_err fx__plane_batch_write(fx_plane_batch *b, int timeout_ms);
/* The txn was refused for good after the payloads were written (split): remove the orphans
 * [start, end) above the offset, best effort. */
void fx__plane_batch_undo(fx_plane_batch *b, const fx_mq_key *start, const fx_mq_key *end,
                          int timeout_ms);
void fx__plane_batch_free(fx_plane_batch *b);

/* Payload deletes of one commit group (at most n ranges). */
typedef struct fx_plane_dels {
    fx_mq_client *c;
    size_t n;
    char *fk;          /* fused: full keys of the ranges */
} fx_plane_dels;

fx_err fx__plane_dels_init(fx_plane_dels *d, fx_mq_client *c, size_t n);
/* Range i = [start, end): fused: appends the delete op to ops[*nops] (the commit txn);
 * split: nothing (see fx__plane_dels_after). */
fx_err fx__plane_dels_txn_op(fx_plane_dels *d, size_t i, const fx_mq_key *start,
                             const fx_mq_key *end, fx_op *ops, size_t *nops);
/* After the commit txn landed: split planes delete [start, end) now (fused: done in the txn).
 * A failure leaves the delete pending (the caller retries it next round). */
fx_err fx__plane_dels_after(fx_plane_dels *d, const fx_mq_key *start, const fx_mq_key *end,
                            int timeout_ms);
void fx__plane_dels_free(fx_plane_dels *d);

#endif
