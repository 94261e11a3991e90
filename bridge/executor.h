/* executor.h -- the one owner of blocking background work in the process (etcd commits, lease
 * revokes, claim steps, attempt writes): kinds of job with bounded queues, strands (serial
 * queues) and timed kicks. The rules in prose: docs/EXECUTOR.md.
 *
 * Kinds. A kind is a small integer 0..FX_EXEC_MAX_KINDS-1 registered in fx_exec_cfg.kinds[]:
 * a name (for logs and metrics), the bound of its queue and the most threads it may use. Each
 * kind has its own threads (started on demand, up to threads_max, kept until fx_exec_free), so a
 * kind whose jobs block on etcd never starves another kind. FX_EXEC_K_* and
 * fx_exec_cfg_defaults() are the table of the kinds this project runs (as redis's bio.c keeps
 * its job kinds in one table); a test may register its own.
 *
 * Bounds. A kind holds at most queue_max queued jobs (plain jobs and strand jobs together; a
 * running job is not queued). fx_exec_submit / fx_exec_strand_submit on a full kind never block:
 * they return FX_EFULL, count rejected_full and call nothing; the caller decides (retry later on
 * its own timer, or fail its batch). A strand's step (fx_exec_strand_kick) is not a queued job:
 * at most one is pending per strand (kicks coalesce), so it is never refused.
 *
 * What runs where. work_fn runs on a thread of its kind; done_fn (may be NULL) runs on the same
 * thread right after work_fn with cancelled == false. A caller that wants its completion posted
 * back to its own thread passes a done_fn that enqueues onto its own queue (the executor never
 * calls into a caller's loop by itself). A job cancelled by fx_exec_free or fx_exec_strand_free
 * never runs work_fn: its done_fn runs once with cancelled == true on the thread that called the
 * free. Every submitted job's done_fn runs exactly once.
 *
 * Strands. fx_exec_strand_new(ex, kind, step_fn, arg) makes a serial queue on a kind: at most
 * one job of a strand runs at a time, strand jobs run in submit order, and a strand's step_fn
 * (run by a kick) is one more serial item on it. A job that blocks holds one thread of its kind
 * and only its own strand waits; other strands of the kind run on the kind's other threads. Each
 * turn of a strand runs one item (its oldest job, else its pending step), then the strand goes to
 * the back of its kind's queue, so strands of one kind share the threads fairly.
 * Kicks: fx_exec_strand_kick(s, due_ms) runs step_fn not before due_ms (fx_now_ms clock; a due
 * in the past means now). Kicks coalesce: a kick while a step is pending (queued, or waiting for
 * an earlier or equal due) is a no-op; a kick with an earlier due moves the timer earlier; a kick
 * while the step runs makes it run once more after (no lost wake-up). Timers live in one min-heap
 * per executor served by its one timer thread.
 *
 * Shutdown (fx_exec_free): marks the executor stopping (fx_exec_stopping() turns true and every
 * fx_exec_wait_ms returns at once), drops the timers, cancels every queued job (done_fn with
 * cancelled == true, in the freeing thread), lets running jobs finish, joins every thread. Strands
 * should be freed by their owners before; a strand still alive at fx_exec_free has its queued jobs
 * cancelled and is detached (its fx_exec_strand_free then only frees its memory).
 *
 * Ownership and threads: all state lives in the fx_exec object (no file statics): two executors
 * live side by side in one process. Every function is thread-safe except fx_exec_free (once, by
 * the owner, not from a job of this executor). fx_exec_strand_free may be called from any thread,
 * also from the strand's own running job (then the strand is freed when that job returns);
 * called from elsewhere it waits until the strand's running item (if any) returned. The cfg
 * passed to fx_exec_new is copied (kind names must be string literals or outlive the executor).
 */
#ifndef FX_BRIDGE_EXECUTOR_H
#define FX_BRIDGE_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fx_err.h"

#define FX_EXEC_MAX_KINDS 8

/* The kinds this project runs (fx_exec_cfg_defaults fills their bounds). */
enum {
    FX_EXEC_K_COMMIT = 0, /* MQ consumer commits: one strand per consumer (bridge/commit_pool) */
    FX_EXEC_K_REVOKE = 1, /* member-lease revokes that failed at close (bridge/revoker) */
    FX_EXEC_K_CLAIM = 2,  /* a claim's steps: one strand per claim */
    FX_EXEC_K_WRITE = 3,  /* attempt records and other per-channel etcd writes */
    FX_EXEC_K_PUT = 4,    /* pipelined producer puts */
    FX_EXEC_K__PROJECT = 5
};

typedef struct fx_exec fx_exec;
typedef struct fx_exec_strand fx_exec_strand;

/* Runs on a thread of the job's kind. */
typedef void (*fx_exec_work_fn)(void *arg);
/* Runs once per submitted job: after work_fn on the same thread (cancelled false), or instead of
 * it on the freeing thread (cancelled true). */
typedef void (*fx_exec_done_fn)(void *arg, bool cancelled);
/* A strand's step, run by fx_exec_strand_kick. */
typedef void (*fx_exec_step_fn)(void *arg);

typedef struct fx_exec_kind_cfg {
    const char *name;    /* NULL: kind not registered (submits to it return FX_EINVAL) */
    size_t queue_max;    /* queued jobs at most (>= 1) */
    unsigned threads_max; /* threads at most (>= 1) */
} fx_exec_kind_cfg;

typedef struct fx_exec_cfg {
    const char *name; /* for logs ("mq", "daemon"); may be NULL */
    fx_exec_kind_cfg kinds[FX_EXEC_MAX_KINDS];
} fx_exec_cfg;

/* Counters of one kind (a snapshot). */
typedef struct fx_exec_stats {
    uint64_t submitted;     /* jobs accepted */
    uint64_t completed;     /* jobs whose work ran */
    uint64_t cancelled;     /* jobs cancelled by a free */
    uint64_t rejected_full; /* submits refused: the queue was full */
    uint64_t steps;         /* strand steps run */
    uint64_t queued;        /* now */
    uint64_t running;       /* now (jobs and steps) */
    uint64_t peak_queued;
    uint64_t peak_running;
    uint64_t threads; /* started, now */
} fx_exec_stats;

/* The project's kinds with their bounds (FX_EXEC_K_*). */
void fx_exec_cfg_defaults(fx_exec_cfg *cfg);

/* A new executor (no thread runs until the first job or timed kick). FX_EINVAL when no kind is
 * registered or a registered kind has a zero bound; FX_ENOMEM. */
fx_err fx_exec_new(const fx_exec_cfg *cfg, fx_exec **out);
/* Stop (see Shutdown above) and free. NULL is a no-op. */
void fx_exec_free(fx_exec *ex);

/* Queue work_fn(arg) on kind. FX_EFULL when the kind's queue is full, FX_ECLOSED when stopping,
 * FX_EINVAL for an unregistered kind, FX_ENOMEM: then nothing was queued and nothing is called. */
fx_err fx_exec_submit(fx_exec *ex, int kind, fx_exec_work_fn work, fx_exec_done_fn done, void *arg);

/* A strand on kind; step may be NULL (then kicks are no-ops). FX_EINVAL, FX_ENOMEM, FX_ECLOSED. */
fx_err fx_exec_strand_new(fx_exec *ex, int kind, fx_exec_step_fn step, void *arg,
                          fx_exec_strand **out);
/* Queue a job on the strand (after every earlier job of it). Errors as fx_exec_submit. */
fx_err fx_exec_strand_submit(fx_exec_strand *s, fx_exec_work_fn work, fx_exec_done_fn done,
                             void *arg);
/* Run the strand's step not before due_ms (see Kicks above). */
void fx_exec_strand_kick(fx_exec_strand *s, int64_t due_ms);
/* Cancel the strand's queued jobs (done_fn cancelled, in this thread), drop its timer and pending
 * step, wait for its running item unless called from it, free. NULL is a no-op. */
void fx_exec_strand_free(fx_exec_strand *s);

/* True once fx_exec_free began: a long job should return early. */
bool fx_exec_stopping(fx_exec *ex);
/* Sleep up to ms inside a job; returns false at once (or early) when the executor is stopping. */
bool fx_exec_wait_ms(fx_exec *ex, int64_t ms);

/* Counters of kind (zeroes for an unregistered kind). */
void fx_exec_get_stats(fx_exec *ex, int kind, fx_exec_stats *out);
/* The registered name of kind, or NULL. */
const char *fx_exec_kind_name(const fx_exec *ex, int kind);

#endif
