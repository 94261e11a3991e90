/* commit_pool.h -- when the MQ consumers of a client commit: one slot per consumer, run on the
 * executor (bridge/executor.h, kind FX_EXEC_K_COMMIT).
 *
 * A slot is a strand of the commit kind whose step runs one commit round of its consumer (the
 * round function, given by the consumer). So one consumer's commits never run twice at once and
 * stay in order; a slow consumer holds one thread of the commit kind at most, and the others go
 * on on the kind's other threads (the kind's thread limit is the pool's size).
 *
 * Rules:
 *  - fx_commit_slot_kick(): acks to commit (or a flush): the round runs soon. A kick while the
 *    round runs makes it run once more after; kicks while one is pending coalesce.
 *  - The round returns FX_COMMIT_IDLE (nothing left), FX_COMMIT_AGAIN (more to commit: run again
 *    now) or FX_COMMIT_RETRY (failed: run again after a backoff of FX_COMMIT_RETRY_MIN_MS
 *    doubling to FX_COMMIT_RETRY_MAX_MS; a success resets it). A kick during a backoff does not
 *    shorten it. The round is told the backoff a failure would now wait (for its log line).
 *  - fx_commit_slot_free(): after it returns no round of the slot runs or will run (a running one
 *    is waited for: bounded by the round's own etcd deadline). Not from the slot's own round.
 *
 * Threads: the round runs on a thread of the executor's commit kind, with no lock of the slot
 * held. kick may be called from any thread, also with the consumer's lock held (lock order: the
 * consumer's lock, then the executor's; the round takes the consumer's lock itself).
 */
#ifndef FX_BRIDGE_COMMIT_POOL_H
#define FX_BRIDGE_COMMIT_POOL_H

#include <stdint.h>

#include "executor.h"
#include "fx_err.h"

#define FX_COMMIT_RETRY_MIN_MS 50
#define FX_COMMIT_RETRY_MAX_MS 1000

typedef enum fx_commit_res {
    FX_COMMIT_IDLE = 0,
    FX_COMMIT_AGAIN,
    FX_COMMIT_RETRY,
} fx_commit_res;

/* One commit round of the consumer arg. retry_in_ms: the backoff a failure now waits. */
typedef fx_commit_res (*fx_commit_round_fn)(void *arg, int64_t retry_in_ms);

typedef struct fx_commit_slot fx_commit_slot;

/* A slot on ex's FX_EXEC_K_COMMIT kind. Errors of fx_exec_strand_new. */
fx_err fx_commit_slot_new(fx_exec *ex, fx_commit_round_fn round, void *arg, fx_commit_slot **out);
void fx_commit_slot_kick(fx_commit_slot *s);
/* Leave: no round runs after this returns. NULL is a no-op. */
void fx_commit_slot_free(fx_commit_slot *s);

#endif
