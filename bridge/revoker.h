/* revoker.h -- finishes member-lease revokes that could not reach etcd when a member closed.
 *
 * A member whose close could not confirm the deletes of the keys it owns (etcd unreachable or
 * slow) revokes its own member lease: the lease belongs to that member alone, so revoking it
 * deletes exactly its role, ready and membership keys at once, and a new member does not wait a
 * whole TTL for them (shared leases are never revoked). When that revoke fails too, the lease is
 * handed to the revoker, which retries it every FX_REVOKER_RETRY_MS until etcd answers or until
 * the lease's TTL is over anyway (then the TTL has done the work). Its rounds run on a strand of
 * the executor's FX_EXEC_K_REVOKE kind (executor.h), woken by a timed kick.
 *
 * Bounds: at most FX_REVOKER_MAX leases pending; adding to a full revoker drops the oldest (WRN:
 * its TTL reclaims it). Each revoke call has a deadline of FX_REVOKER_CALL_MS; a transport error
 * ends the round (the rest wait for the next one). Counters in fx_revoker_stats.
 *
 * Ownership and threads: created and freed by the MQ client root (client.c); the fx_etcd and the
 * fx_exec are borrowed and must outlive fx_revoker_free(). fx_revoker_add() and
 * fx_revoker_get_stats() are thread-safe. fx_revoker_free() drops the pending retry timer, waits
 * for a running round (bounded by one call's deadline) and drops what is still pending (their TTL
 * reclaims them).
 */
#ifndef FX_BRIDGE_REVOKER_H
#define FX_BRIDGE_REVOKER_H

#include <stdint.h>

#include "etcd.h"
#include "executor.h"
#include "fx_err.h"

#define FX_REVOKER_MAX 256
#define FX_REVOKER_RETRY_MS 500
#define FX_REVOKER_CALL_MS 1000

typedef struct fx_revoker fx_revoker;

typedef struct fx_revoker_stats {
    uint64_t added;    /* leases handed over */
    uint64_t revoked;  /* revoked by a retry (or found already gone) */
    uint64_t expired;  /* dropped because their TTL was over */
    uint64_t dropped;  /* dropped because the revoker was full */
    uint64_t attempts; /* revoke calls made */
    uint64_t pending;  /* now */
} fx_revoker_stats;

/* Create (a strand on ex's FX_EXEC_K_REVOKE kind; no thread of its own). */
fx_err fx_revoker_new(fx_etcd *etcd, fx_exec *ex, fx_revoker **out);
/* Retry revoking `lease` until until_ms (monotonic ms, fx_now_ms clock). */
void fx_revoker_add(fx_revoker *r, int64_t lease, int64_t until_ms);
void fx_revoker_get_stats(fx_revoker *r, fx_revoker_stats *out);
/* Stop and free. NULL is a no-op. */
void fx_revoker_free(fx_revoker *r);

#endif
