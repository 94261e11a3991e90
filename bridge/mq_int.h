/* mq_int.h -- internals shared by the files of bridge/ (client.c, idalloc.c, mpsc*.c, mpmc.c).
 * Not part of the public API (fluxon_mq.h). Names use the fx__ prefix.
 *
 * Thread rules are those of fluxon_mq.h unless stated here.
 */
#ifndef FX_BRIDGE_MQ_INT_H
#define FX_BRIDGE_MQ_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdatomic.h>

#include "fluxon_mq.h"
#include "keys.h"
#include "lifecycle.h"
#include "meta.h"

/* ---- client root ------------------------------------------------------------------------------ */

/* An endpoint registered with the client root (Fluxon MQ's child-close registry). */
typedef struct fx__mq_endpoint {
    fx_err (*close)(void *self); /* the endpoint's public close */
    /* Optional (NULL: `close` is used, which always finishes the endpoint). A close that can fail
     * strongly (Fluxon MQ's rule: such a child blocks backend teardown and stays retryable): on a
     * strong failure it returns the error with *unfinished = true and stays registered-able and
     * closable; force = true always finishes (used by fx_mq_client_free). */
    fx_err (*close_ex)(void *self, bool force, bool *unfinished);
    void *self;
    struct fx__mq_endpoint *prev, *next;
} fx__mq_endpoint;

struct fx_mq_client {
    fx_mq_client_opts opts;   /* copied; strings below own their storage */
    fx_mq_keys keys;          /* root prefix */
    fx_etcd *etcd;            /* control plane (owned) */
    fx_kv_store *kv;          /* payload plane (owned) */
    bool segments;            /* new channels store one segment per batch (opts) */
    bool kv_shared;           /* kv uses `etcd` itself: one txn for payload + offsets */
    _Atomic uint64_t payload_missing; /* ids skipped by consumers: missing below the offset */
    _Atomic uint64_t plane_lost;      /* consumer reads that found the payload lease gone */
    fx_lease_mgr *leases;     /* owned */
    fx_lease_backend etcd_backend; /* lease backend descriptors (uid strings owned by etcd/kv) */
    fx_lease_backend kv_backend;
    int64_t long_ttl_s, min_ttl_s;
    int op_timeout_ms, close_timeout_ms;
    int kv_timeout_ms;        /* deadline of each data-path KV call (opts; op_timeout_ms) */
    char client_id[FX_MQ_STR_MAX + 1]; /* external_client_id of our memberships (opts) */

    pthread_mutex_t mu;       /* guards the registry and `life` */
    fx__mq_endpoint *endpoints;
    fx_life life;             /* OPEN; CLOSING: no new endpoint or new work; CLOSED: no new op
                               * reference (lifecycle.h; life.ops counts the op references) */
    struct fx_revoker *revoker; /* created on first use (under mu); stopped before the backends */
    struct fx_pwatch *pwatch;   /* shared produce-offset watch (pwatch.h): first use, under mu */
    struct fx_exec *exec;       /* background work: consumer commits (commit_pool.h), revoke
                                 * retries (revoker.h); opts.exec (borrowed) or owned */
    bool exec_owned;            /* created by fx_mq_client_new: freed with the backends */
    struct mpmc_keeper *keepers; /* per-MPMC sub-MPSC lease keepers shared by members (mpmc.c) */
    /* Serialises this process's CAS publishes of new sub-MPSCs (mpmc.c: the creation itself runs
     * in parallel; only the short read-check-publish step is taken in turn). */
    pthread_mutex_t publish_mu;
    /* The brief of one MPMC as the last publish txn of this process left it (mpmc.c, under
     * publish_mu): its list value (absent: data NULL), ready and consumer role counts. The next
     * publish CASes against it without reading first; a lost CAS brings the current one back. */
    /* Sub-MPSCs (mpmc, chan) queued for a grouped reclaim by closing consumers (mpmc.c); under
     * mu. */
    int64_t rq[256][2];
    size_t n_rq;
    bool pub_valid;
    int64_t pub_mpmc, pub_ready, pub_active;
    fx_bytes pub_list;
    /* Sub-MPSC channel ids taken from the shared counter in blocks (fx__mpsc_create with a
     * parent): [chan_next, chan_end) is this client's unused rest; guarded by ids_mu. */
    pthread_mutex_t ids_mu;
    int64_t chan_next, chan_end;
    /* owned copies of option strings */
    char **strs;
    size_t n_strs;
};

/* Register an endpoint (before its blocking construction). FX_ECLOSED once the client is closing.
 * The endpoint struct is owned by the caller and must stay valid until unregistered. */
fx_err fx__mq_register(fx_mq_client *c, fx__mq_endpoint *ep);
#define FX_MQ_COMMIT_THREADS 4 /* commit-kind threads of a client-owned executor */
/* The client's executor (FX_ECLOSED once the backends are freed). */
fx_err fx__mq_exec(fx_mq_client *c, struct fx_exec **out);
/* The client's shared produce-offset watch (pwatch.h), started on first use. FX_ECLOSED once
 * the backends are freed. */
fx_err fx__mq_pwatch(fx_mq_client *c, struct fx_pwatch **out);
/* Unregister (idempotent; safe if never registered). Endpoints call it at the end of their close. */
void fx__mq_unregister(fx_mq_client *c, fx__mq_endpoint *ep);
/* Validate a channel config against the client's limits (capacity >= 1, ttl in
 * [min_ttl_s, FX_MQ_MAX_TTL_SECONDS], weight >= 0). */
fx_err fx__mq_cfg_validate(const fx_mq_client *c, const fx_mq_chan_cfg *cfg);

/* ---- id allocators and cluster leases (idalloc.c) --------------------------------------------- */

/* CAS counter at `key` (fx_mq_key_alloc_*): advance by n >= 1 and return the first id of the
 * range in *first (ids start at 1). lease 0: the counter key has no lease. Bounded: 100 CAS
 * attempts, each with the client's op deadline; a lost CAS re-reads the value. */
/* fx__mq_alloc_ids_fresh: the same for a counter the caller expects to be absent (a channel it
 * has just created): the first CAS is create==0 without a read (one round trip when right). */
fx_err fx__mq_alloc_ids_fresh(fx_mq_client *c, const fx_mq_key *key, int64_t lease, int64_t n,
                              int64_t *first);
fx_err fx__mq_alloc_ids(fx_mq_client *c, const fx_mq_key *key, int64_t lease, int64_t n,
                        int64_t *first);
/* get_cluster_lease_id: reuse the lease id stored at `key` or grant one with ttl_s and publish
 * it under itself (txn create==0; a lost race reads the winner). *granted says whether this call
 * granted it (then registration may skip the probe). */
fx_err fx__mq_cluster_lease(fx_mq_client *c, const fx_mq_key *key, int64_t ttl_s, int64_t *id,
                            bool *granted);
/* Register a lease with the client's LeaseManager (etcd or kv backend) with an expiry callback. */
fx_err fx__mq_hold(fx_mq_client *c, bool kv_backend, int64_t ttl_s, int64_t id, bool skip_probe,
                   fx_lease_expired_fn on_expired, void *arg, fx_lease **out);
/* The same with a probe only when no active holder in this client keeps the lease alive yet
 * (fx_lease_reg_opts.join_held): for the leases every member of an MPMC shares. */
fx_err fx__mq_hold_shared(fx_mq_client *c, bool kv_backend, int64_t ttl_s, int64_t id,
                          fx_lease_expired_fn on_expired, void *arg, fx_lease **out);
/* Grant an etcd lease with the client's op deadline. */
fx_err fx__mq_grant(fx_mq_client *c, int64_t ttl_s, int64_t *id);

/* ---- MPSC internals used by MPMC (mpsc*.c) ------------------------------------------------------- */

/* Lease and naming overrides of a sub-MPSC of an MPMC (Fluxon MQ's new_mpmc_subchannel_*). */
typedef struct fx__mpsc_parent {
    int64_t mpmc;          /* payload key namespace: mpmc/{mpmc}/mpsc_{chan}/... */
    int64_t global_lease;  /* MPMC metadata lease (used as the MPSC global lease) */
    int64_t member_lease;  /* the MPMC member lease of the member that owns the handle */
    int64_t payload_lease; /* MPMC payload lease (KV) */
    int64_t member;        /* MPMC member id: the producer idx of a sub-producer */
    int64_t ttl_s;         /* member lease TTL (registration key of the member lease) */
    /* Registration TTL of the global (MPMC metadata) and payload leases: the MPMC's retention
     * (legacy channels: their ttl_seconds). Never above the leases' real TTL. */
    int64_t data_ttl_s;
    /* TTL of a sub-MPSC's global-long lease: granted with it for new sub-MPSCs, registered with it
     * (a legacy one may be longer: registering with a shorter TTL only renews more often). */
    int64_t long_ttl_s;
    /* Set only for the bind of a sub-MPSC this caller has just created and not yet published
     * (fx__mpsc_create's fresh_meta): the bind takes that meta instead of reading it, joins the
     * parent's leases (held by the parent member) without a probe, and reads nothing back (no
     * producer can have routed to an unpublished channel: no offsets, no counters). */
    const fx_mq_chan_meta *fresh_meta;
} fx__mpsc_parent;

/* create_mpsc_channel with parent overrides (parent NULL: standalone, as fx_mpsc_create). */
fx_err fx__mpsc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, const fx__mpsc_parent *parent,
                       int64_t *out_chan);
/* With a parent: also return the meta written (for a fresh bind, fx__mpsc_parent.fresh_meta). */
fx_err fx__mpsc_create_sub(fx_mq_client *c, const fx_mq_chan_cfg *cfg,
                           const fx__mpsc_parent *parent, int64_t *out_chan,
                           fx_mq_chan_meta *out_meta);
/* new_mpmc_subchannel_with_chan_id: bind a sub-producer / sub-consumer, validating that the
 * channel meta's global and payload lease ids equal the parent's (FX_EPROTO otherwise). Sub
 * endpoints are NOT registered with the client root (their MPMC endpoint is). */
fx_err fx__mpsc_producer_open_sub(fx_mq_client *c, int64_t chan, int64_t weight,
                                  const fx__mpsc_parent *parent, fx_mpsc_producer **out);
fx_err fx__mpsc_consumer_open_sub(fx_mq_client *c, int64_t chan, const fx__mpsc_parent *parent,
                                  fx_mpsc_consumer **out);
/* Put without waiting for capacity: FX_EFULL at once when the sub-MPSC has no room for the first
 * value (MPMC rotation then tries the next sub-MPSC). Otherwise as fx_mpsc_put. */
fx_err fx__mpsc_try_put(fx_mpsc_producer *p, const fx_slice *values, size_t n, size_t *n_put,
                        fx_mq_msg_id *ids);
/* Stored, unconsumed messages of the producer's channel (exact at the time of the read). */
fx_err fx__mpsc_backlog(fx_mpsc_producer *p, int64_t *out);
/* After fx_mpsc_consumer_close(): true when the best-effort delete of its consumer membership
 * key was confirmed by etcd (the MPMC close deletes the ready key only then). */
bool fx__mpsc_consumer_membership_deleted(const fx_mpsc_consumer *c);
/* The error that closed the endpoint by itself (FX_ELEASE_LOST), or FX_OK. */
fx_err fx__mpsc_producer_fault(const fx_mpsc_producer *p);
fx_err fx__mpsc_consumer_fault(const fx_mpsc_consumer *c);


/* ---- additions (client.c, mpsc*.c) --------------------------------------------------------------- */

/* Backend references. Every path that uses the client's etcd / KV / LeaseManager outside of
 * fx_mq_client_close (creates, puts, gets, commit threads, close-time deletes) holds one for
 * the duration of the use; fx_mq_client_close frees the backends only once every endpoint is
 * closed and no reference is held (bounded wait). fx__mq_op_enter: FX_ECLOSED once the client
 * has started freeing its backends (allowed while it is closing endpoints, so endpoint closes can
 * still delete their keys). fx__mq_new_op_enter: FX_ECLOSED as soon as the client is closing
 * (for new work that creates state: fx_mpsc_create, resolve). Pair each with fx__mq_op_leave. */
fx_err fx__mq_op_enter(fx_mq_client *c);
fx_err fx__mq_new_op_enter(fx_mq_client *c);
void fx__mq_op_leave(fx_mq_client *c);
/* True once fx_mq_client_close has started. */
bool fx__mq_client_closing(fx_mq_client *c);
/* A member closed without confirming the deletes of its own keys: revoke its member lease now
 * (one call within timeout_ms) and, when that fails, hand it to the client's revoker (revoker.h),
 * which retries until etcd answers or ttl_s has passed. Never for shared leases. Returns true
 * when the lease was revoked (or found gone) now. */
bool fx__mq_revoke_member_lease(fx_mq_client *c, int64_t lease, int64_t ttl_s, int timeout_ms);

/* Note on fx__mq_unregister: when fx_mq_client_close is running this endpoint's close on another
 * thread, fx__mq_unregister waits until that call has returned (so the endpoint can be freed
 * right after). An endpoint close must therefore let concurrent callers of its close return
 * (mark itself closed/done and wake them) BEFORE it calls fx__mq_unregister, or the two wait on
 * each other. Called from the thread the client runs the close on, it does not wait. */

/* Counters of one MPSC endpoint (monotonic since open). */
typedef struct fx__mpsc_stats {
    uint64_t put_calls;      /* put / try_put calls */
    uint64_t put_msgs;       /* messages stored */
    uint64_t put_txns;       /* write txns (or put_many + offset) that stored a chunk */
    uint64_t put_retries;    /* chunk writes retried after a failure */
    uint64_t offset_rereads; /* produce-offset re-reads after an ambiguous failure */
    uint64_t full_waits;     /* capacity waits (a put found no room) */
    uint64_t full_errors;    /* puts that returned FX_EFULL */
    uint64_t cap_checks;     /* stored-count requests (capacity) */
    uint64_t got_msgs;       /* messages handed out by get */
    uint64_t fetches;        /* payload range reads */
    uint64_t skipped_ids;    /* missing ids below the produce offset, skipped */
    uint64_t acked;          /* ids acknowledged */
    uint64_t commits;        /* successful commit rounds (offsets + payload deletes) */
    uint64_t commit_retries; /* failed commit attempts (retried with backoff) */
} fx__mpsc_stats;
void fx__mpsc_producer_stats(const fx_mpsc_producer *p, fx__mpsc_stats *out);
void fx__mpsc_consumer_stats(const fx_mpsc_consumer *c, fx__mpsc_stats *out);
/* Identity of an open endpoint. */
int64_t fx__mpsc_producer_chan(const fx_mpsc_producer *p);
int64_t fx__mpsc_consumer_chan(const fx_mpsc_consumer *c);
/* fx_mpmc_consumer_set_notify of the sub-consumer (mpsc_cons.c). */
void fx__mpsc_consumer_set_notify(fx_mpsc_consumer *c, void (*fn)(void *arg), void *arg);
int64_t fx__mpsc_consumer_idx(const fx_mpsc_consumer *c);
/* The consumer's membership key and its create revision: a write that compares them lands only
 * while this consumer still owns the channel (attempts.c). FX_EINVAL before the bind. */
fx_err fx__mpsc_consumer_fence(const fx_mpsc_consumer *c, fx_mq_key *key, int64_t *create_rev);
/* out[i]: the first id of producer pidx[i] not committed by this consumer (ids below it are
 * committed: never read again), from its commits or the resume point read at open. */
void fx__mpsc_consumer_committed(const fx_mpsc_consumer *c, const int64_t *pidx, size_t n,
                                 int64_t *out);
/* The same of an MPMC consumer's sub-consumer (mpmc.c). */
fx_err fx__mpmc_consumer_fence(const fx_mpmc_consumer *c, fx_mq_key *key, int64_t *create_rev);
void fx__mpmc_consumer_committed(const fx_mpmc_consumer *c, const int64_t *pidx, size_t n,
                                 int64_t *out);
/* Sub-MPSCs an MPMC producer found gone under a put (a bind refused because the meta was gone,
 * or a sub-producer that closed itself) and routed the put elsewhere (monotonic; mpmc.c). */
uint64_t fx__mpmc_producer_reroutes(const fx_mpmc_producer *p);

#endif
