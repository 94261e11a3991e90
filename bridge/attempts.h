/* attempts.h -- delivery attempts that belong to the message, not to the consumer: a persisted,
 * batched record per sub-MPSC, so an attempt count (and with it max_deliver and the dead-letter
 * rule) survives a consumer closing, crashing, or the sub-MPSC moving to another process.
 *
 * One etcd key per sub-MPSC,  <root>/attempts/<chan>,  bound to the sub-MPSC's global lease (the
 * MPMC metadata lease for a sub-MPSC: it lives exactly as long as the channel's data). Value:
 *     "FXA1"
 *     u32 nh, nh x { i64 pidx, i64 hi }               per producer: highest message id that was
 *                                                      published at least once
 *     u32 ne, ne x { i64 pidx, i64 msg, u32 n }        exceptions: messages <= hi of their
 *                                                      producer whose attempt count is not 1
 * (little endian, no padding). Attempts of a message (pidx, msg) = the exception's n if listed,
 * else 1 when msg <= hi[pidx], else 0. So the usual case (every message delivered once, then
 * acked) is a few bytes whatever the window, and only redelivered messages take room.
 *
 * The consumer writes the record before it publishes a round of deliveries that changes it (new
 * messages, redeliveries): at most one put per round, never one per message (rounds that come
 * while a put is in flight share the next one), and none for acks (an acked
 * message is committed and never read again; its stale exception is dropped at the next write).
 * A consumer that opens a sub-MPSC reads the record once (fx_attempts_open) and asks for the
 * attempts of each message it fetches (fx_attempts_take); inherited entries of a producer below
 * the first message fetched from it are committed and are dropped.
 *
 * Fencing: a record opened for its owner (the MPMC consumer bound to the sub-MPSC) is
 * written only while that owner still holds its consumer membership: every put is a txn that
 * compares the membership key's create revision (the owner's bind). A consumer whose member
 * lease expired (its membership deleted) or whose sub-MPSC was reclaimed (every key under the
 * channel deleted) gets FX_ELEASE_LOST and writes nothing: it can neither roll back the counts of
 * the consumer that took the sub-MPSC over nor re-create the record after a reclaim. The
 * membership key is unique to one bind (create revision), so a later bind with the same consumer
 * index does not pass the compare either. Without an owner (tests, tools) puts are plain.
 *
 * Pruning: a producer entry whose high mark is below the owner's committed offset of that
 * producer (every id of it that was ever published is committed, never read again) is dropped,
 * with its inherited exceptions: at open (from the resume points the owner read at its bind) and
 * when the number of entries doubled since the last prune (amortised: one lock of the owner and
 * no I/O). So churned producer ids (each bridge restart makes new ones) do not fill the bound.
 *
 * Bounds: at most FX_ATTEMPTS_MAX_EXC exceptions and FX_ATTEMPTS_MAX_PRODUCERS producers per
 * record (more: a prune first; what is still over the bound is left out and counted in dropped;
 * such messages fall back to "1 attempt"). A record that does not decode is ignored (counted,
 * FX_EPROTO logged by the caller) and rewritten by the next save.
 *
 * Ownership: fx_attempts borrows the client and the owner consumer (both must outlive it).
 * Thread rules: one thread at a time (the claim thread that owns the consumer).
 */
#ifndef FX_BRIDGE_ATTEMPTS_H
#define FX_BRIDGE_ATTEMPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fluxon_mq.h"

#define FX_ATTEMPTS_MAX_EXC 32768
#define FX_ATTEMPTS_MAX_PRODUCERS 4096
#define FX_ATTEMPTS_KEY_CAP 512 /* a record's key fits (with its NUL) */

typedef struct fx_attempts fx_attempts;

typedef struct fx_attempt {
    int64_t pidx, msg;
    uint32_t n; /* attempts published (or about to be) */
} fx_attempt;

typedef struct fx_attempts_stats {
    uint64_t writes, inherited, dropped, pruned;
    size_t last_bytes;
} fx_attempts_stats;

/* Where a record goes and the writer's fence, copied by value (the writer thread's copy). */
typedef struct fx_attempts_dest {
    char key[FX_ATTEMPTS_KEY_CAP];
    size_t klen;
    int64_t lease;
    char fence[FX_ATTEMPTS_KEY_CAP]; /* the owner's consumer membership key (flen 0: no fence) */
    size_t flen;
    int64_t fence_rev; /* its create revision */
} fx_attempts_dest;

/* Read the record of sub-MPSC chan (and its lease). A missing record is an empty one. owner:
 * the MPMC consumer bound to chan (its membership fences every write, its committed offsets
 * prune the record); NULL only for tests and tools (plain puts, no pruning). */
fx_err fx_attempts_open(fx_mq_client *c, int64_t chan, const fx_mpmc_consumer *owner,
                        int timeout_ms, fx_attempts **out);
#define FX_ATTEMPTS_FENCED 1 /* fx_attempts_open takes the owner */
void fx_attempts_free(fx_attempts *a);

/* Attempts made on (pidx, msg) before this consumer; the inherited entry is consumed. */
uint32_t fx_attempts_take(fx_attempts *a, int64_t pidx, int64_t msg);

/* Write the record for the given in-flight messages (with the attempt count each will have once
 * the round is published) plus the inherited entries not yet taken, if it differs from the last
 * one written. *wrote (may be NULL) says whether a put happened. */
fx_err fx_attempts_save(fx_attempts *a, const fx_attempt *inflight, size_t n, int timeout_ms,
                        bool *wrote);

/* The same in two steps, so the put can run on another thread (pipelined with deliveries):
 * build (the owner thread) returns true when the record differs from the last one built, with
 * *val / *len pointing into a buffer of a that stays valid until the next build; put writes a
 * value to the destination (any thread; fx_attempts_dest_of, copied by the caller, so it does not
 * touch a). A fenced put whose writer no longer owns the sub-MPSC: FX_ELEASE_LOST (nothing
 * written; do not retry). */
bool fx_attempts_build(fx_attempts *a, const fx_attempt *inflight, size_t n, const uint8_t **val,
                       size_t *len);
void fx_attempts_dest_of(const fx_attempts *a, fx_attempts_dest *out);
fx_err fx_attempts_put(fx_mq_client *c, const fx_attempts_dest *d, const uint8_t *val,
                       size_t len, int timeout_ms);

void fx_attempts_get_stats(const fx_attempts *a, fx_attempts_stats *out);

/* Codec (pure; exposed for unit tests). encode: returns the length, 0 if cap is short. */
typedef struct fx_attempts_rec {
    int64_t *hi_pidx, *hi; /* nh */
    size_t nh;
    fx_attempt *exc; /* ne */
    size_t ne;
} fx_attempts_rec;
size_t fx_attempts_encode(const fx_attempts_rec *r, uint8_t *out, size_t cap);
size_t fx_attempts_encoded_size(const fx_attempts_rec *r);
/* decode into malloc'd arrays (free with fx_attempts_rec_free). */
fx_err fx_attempts_decode(const uint8_t *p, size_t len, fx_attempts_rec *out);
void fx_attempts_rec_free(fx_attempts_rec *r);

#endif
