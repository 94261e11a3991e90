/* etcd.h -- etcd v3 client over the JSON gateway and, for KV calls, gRPC (libcurl + cJSON).
 *
 * What it speaks: POST /v3/... on etcd 3.4+ (the gRPC-gateway of the v3 API). Keys and values
 * are arbitrary bytes (base64 on the wire); int64 fields are sent as JSON strings and parsed from
 * strings; fields missing from a response mean zero/false/empty.
 * With opts.grpc, the KV calls (fx_etcd_range, _put, _delete, _get, _txn) go to etcd's gRPC API
 * instead (unary calls /etcdserverpb.KV/Range, Put, DeleteRange, Txn; protobuf in etcd_pb.h, over HTTP/2: cleartext with
 * prior knowledge, or TLS with ALPN), the same requests and results, error mapping and deadlines
 * (sent as grpc-timeout); the token travels as the "token" metadata. Leases, auth, status,
 * compaction and watches stay on the gateway. HTTP/2 handles are pooled apart from HTTP/1.1 ones
 * (one kind per handle, both within max_conns).
 *
 * Deadlines: every call takes timeout_ms (> 0; 0 means the client's default_timeout_ms). The call
 * returns FX_ETIMEDOUT no later than that (plus scheduling noise), whatever the server does: the
 * deadline covers waiting for a connection, connecting, failover and the HTTP exchange. The
 * deadline is also sent to etcd as Grpc-Timeout.
 *
 * Endpoints and failover: endpoints are tried starting at the one that last worked. A transport
 * failure that proves the request was not delivered (connection refused, resolve failure, connect
 * timeout) moves to the next endpoint and retries within the same deadline. Reads (range,
 * keepalive, timetolive, status) also fail over on any transport error; writes that may have
 * been delivered are not retried (FX_EUNAVAIL or FX_ETIMEDOUT is returned).
 *
 * Connections: the client keeps a pool of libcurl easy handles (one TCP connection each, HTTP/1.1
 * keep-alive). A call borrows one handle; concurrent calls use different handles. At most
 * max_conns handles exist for general calls; a call that finds none free waits (within its
 * deadline; FX_ETIMEDOUT when none frees up). Lease keepalives use fx_etcd_lease_keepalive_lane(),
 * a separate handle reserved for the lease manager, so the data path can never starve them.
 *
 * Auth: with username set, the client authenticates (/v3/auth/authenticate), sends the token raw
 * in the Authorization header, and re-authenticates once on 401 (expired simple token). The
 * password and token are never logged or put in error details.
 *
 * Errors: HTTP/gRPC errors map to fx_err (table in etcd_json.h); fx_err_detail() carries the
 * server's message and the endpoint (never credentials).
 *
 * Ownership: request structs and the bytes they point to are borrowed for the call only. Result
 * structs are filled by the call and freed by the caller with the matching *_free() function
 * (also on error: a failed call leaves results zeroed, so freeing is always safe).
 *
 * Thread rules: fx_etcd is thread-safe; any thread may call anything except fx_etcd_free(), which
 * must be called once, after every other call and every watch on the client has returned.
 */
#ifndef FX_ETCD_H
#define FX_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fx_err.h"

typedef struct fx_etcd fx_etcd;

typedef struct fx_etcd_opts {
    const char *const *endpoints; /* "http://127.0.0.1:2379" or "https://..."; at least one */
    size_t n_endpoints;
    const char *username; /* optional: etcd auth */
    const char *password;
    const char *ca_file;   /* optional TLS: CA bundle */
    const char *cert_file; /* optional TLS client certificate (without a CN: an etcd 3.4 gateway
                            * refuses /v3 requests from a CN certificate when client-cert auth
                            * and RBAC are on; authenticate with a token) */
    const char *key_file;
    bool insecure_skip_verify;
    int default_timeout_ms; /* 0 -> 5000 */
    int connect_timeout_ms; /* 0 -> 1000; also capped by the call's deadline */
    int max_conns;          /* 0 -> 64: general-purpose connection bound */
    bool grpc;              /* KV calls (range, put, delete, txn) over etcd's gRPC API */
} fx_etcd_opts;

/* Create a client. Copies everything from opts. Does no I/O (auth happens on first use).
 * On FX_OK *out owns a client freed with fx_etcd_free(). */
fx_err fx_etcd_new(const fx_etcd_opts *opts, fx_etcd **out);
/* Free the client (NULL is a no-op). Closes all connections. */
void fx_etcd_free(fx_etcd *c);

/* "etcd(http://a:1,http://b:2)": sorted endpoint list; stable identity of the cluster used as
 * the lease backend uid. Valid for the client's lifetime. */
const char *fx_etcd_uid(const fx_etcd *c);

/* Counters since creation (monotonic; for metrics and tests). */
typedef struct fx_etcd_stats {
    uint64_t requests;      /* HTTP requests sent (including retries and failovers) */
    uint64_t failovers;     /* moves to another endpoint */
    uint64_t errors;        /* calls that returned an error */
    uint64_t conns_created; /* easy handles created (pool growth) */
    uint64_t pool_waits;    /* calls that had to wait for a free connection */
    uint64_t keepalives;    /* lease keepalive requests sent */
    uint64_t latency_us_sum;/* sum of call latencies (successful unary calls) */
    uint64_t latency_count;
} fx_etcd_stats;
void fx_etcd_get_stats(fx_etcd *c, fx_etcd_stats *out);

/* ---- data model -------------------------------------------------------------------------- */

/* Owned byte buffer (malloc'd; data is NUL-terminated one past len for convenience). */
typedef struct fx_bytes {
    uint8_t *data;
    size_t len;
} fx_bytes;
void fx_bytes_free(fx_bytes *b);

typedef struct fx_kv {
    fx_bytes key;
    fx_bytes value;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease;
} fx_kv;
void fx_kv_free(fx_kv *kv);

/* A borrowed byte string in requests. */
typedef struct fx_slice {
    const void *data;
    size_t len;
} fx_slice;
#define FX_SLICE_STR(s) ((fx_slice){(s), strlen(s)})

/* Range end for "every key with this prefix" (the prefix with its last byte incremented, as etcd
 * defines it); written into out, which needs
 * max(prefix.len, 1) bytes; returns the length (1 with out[0]=0 meaning "to the end of the
 * keyspace"). */
size_t fx_prefix_end(fx_slice prefix, uint8_t *out);

typedef enum { FX_SORT_NONE = 0, FX_SORT_ASCEND, FX_SORT_DESCEND } fx_sort_order;
typedef enum { FX_SORT_KEY = 0, FX_SORT_VERSION, FX_SORT_CREATE, FX_SORT_MOD, FX_SORT_VALUE } fx_sort_target;

typedef struct fx_range_req {
    fx_slice key;
    fx_slice range_end; /* len 0: single key. Use fx_prefix_end() for a prefix. */
    int64_t limit;      /* 0: no limit */
    int64_t revision;   /* 0: latest */
    bool count_only;
    bool keys_only;
    bool serializable;
    fx_sort_order sort_order; /* ASCEND by KEY is etcd's natural order and is sent as NONE:
                               * etcd (3.4, 3.5) ignores limit for any sort, so a sorted range
                               * with a limit reads every key in the range (etcd issue 20745) */
    fx_sort_target sort_target;
} fx_range_req;

typedef struct fx_range_resp {
    int64_t revision; /* header.revision */
    fx_kv *kvs;
    size_t n_kvs;
    int64_t count; /* total matches (ignores limit) */
    bool more;
} fx_range_resp;
void fx_range_resp_free(fx_range_resp *r);

typedef struct fx_put_req {
    fx_slice key;
    fx_slice value;
    int64_t lease; /* 0: no lease (a put without lease detaches the key from its old lease) */
    bool prev_kv;
    bool ignore_value;
    bool ignore_lease;
} fx_put_req;

typedef struct fx_put_resp {
    int64_t revision;
    bool has_prev;
    fx_kv prev_kv;
} fx_put_resp;
void fx_put_resp_free(fx_put_resp *r);

typedef struct fx_del_req {
    fx_slice key;
    fx_slice range_end; /* len 0: single key */
    bool prev_kv;
} fx_del_req;

typedef struct fx_del_resp {
    int64_t revision;
    int64_t deleted;
    fx_kv *prev_kvs;
    size_t n_prev_kvs;
} fx_del_resp;
void fx_del_resp_free(fx_del_resp *r);

/* ---- unary KV calls ---------------------------------------------------------------------- */

fx_err fx_etcd_range(fx_etcd *c, const fx_range_req *req, fx_range_resp *out, int timeout_ms);
fx_err fx_etcd_put(fx_etcd *c, const fx_put_req *req, fx_put_resp *out /* may be NULL */,
                   int timeout_ms);
fx_err fx_etcd_delete(fx_etcd *c, const fx_del_req *req, fx_del_resp *out /* may be NULL */,
                      int timeout_ms);

/* Convenience: get one key. FX_ENOTFOUND when absent; on FX_OK *out is filled (caller frees). */
fx_err fx_etcd_get(fx_etcd *c, fx_slice key, fx_kv *out, int timeout_ms);

/* ---- txn ----------------------------------------------------------------------------------- */

typedef enum { FX_CMP_VERSION = 0, FX_CMP_CREATE, FX_CMP_MOD, FX_CMP_VALUE, FX_CMP_LEASE } fx_cmp_target;
typedef enum { FX_CMP_EQUAL = 0, FX_CMP_GREATER, FX_CMP_LESS, FX_CMP_NOT_EQUAL } fx_cmp_result;

typedef struct fx_cmp {
    fx_cmp_target target;
    fx_cmp_result result;
    fx_slice key;
    fx_slice range_end; /* len 0: single key */
    int64_t num;        /* version / create_revision / mod_revision / lease */
    fx_slice value;     /* FX_CMP_VALUE only */
} fx_cmp;

typedef enum { FX_OP_RANGE = 0, FX_OP_PUT, FX_OP_DELETE } fx_op_type;

typedef struct fx_op {
    fx_op_type type;
    union {
        fx_range_req range;
        fx_put_req put;
        fx_del_req del;
    } u;
} fx_op;

typedef struct fx_txn_req {
    const fx_cmp *cmp;
    size_t n_cmp;
    const fx_op *success;
    size_t n_success;
    const fx_op *failure;
    size_t n_failure;
} fx_txn_req;

typedef struct fx_op_resp {
    fx_op_type type;
    union {
        fx_range_resp range;
        fx_put_resp put;
        fx_del_resp del;
    } u;
} fx_op_resp;

typedef struct fx_txn_resp {
    int64_t revision;
    bool succeeded;
    fx_op_resp *responses; /* of the branch that ran */
    size_t n_responses;
} fx_txn_resp;
void fx_txn_resp_free(fx_txn_resp *r);

/* Run a txn. A compare that fails is not an error: FX_OK with succeeded == false.
 * More ops than the server allows -> FX_ETXN_TOO_MANY_OPS; a request over the size limit ->
 * FX_ETOO_LARGE (or FX_ENOSPACE past the gRPC receive limit); duplicate keys -> FX_EDUPLICATE_KEY.
 * out may be NULL. */
fx_err fx_etcd_txn(fx_etcd *c, const fx_txn_req *req, fx_txn_resp *out, int timeout_ms);

/* ---- leases ---------------------------------------------------------------------------------- */

/* Grant a lease. ttl_s is raised by etcd to its minimum (2 s with defaults). id 0 lets etcd pick.
 * On FX_OK *out_id is the lease and *out_ttl (may be NULL) the granted TTL. */
fx_err fx_etcd_lease_grant(fx_etcd *c, int64_t ttl_s, int64_t id, int64_t *out_id,
                           int64_t *out_ttl, int timeout_ms);
/* Revoke: FX_OK, or FX_ENOTFOUND when the lease does not exist. Attached keys are deleted. */
fx_err fx_etcd_lease_revoke(fx_etcd *c, int64_t id, int timeout_ms);
/* One keepalive (one POST on a pooled connection). FX_OK with *out_ttl > 0 when renewed;
 * FX_ELEASE_EXPIRED when etcd answered without a TTL (unknown or expired lease). */
fx_err fx_etcd_lease_keepalive(fx_etcd *c, int64_t id, int64_t *out_ttl, int timeout_ms);
/* Same as fx_etcd_lease_keepalive() on the connection reserved for the lease manager: never
 * waits for the general pool. Only one thread (the lease manager's) may use it at a time;
 * calls are serialised by an internal lock. */
fx_err fx_etcd_lease_keepalive_lane(fx_etcd *c, int64_t id, int64_t *out_ttl, int timeout_ms);
/* Remaining TTL: *out_ttl = -1 when the lease does not exist (FX_OK). *out_granted may be NULL. */
fx_err fx_etcd_lease_timetolive(fx_etcd *c, int64_t id, int64_t *out_ttl, int64_t *out_granted,
                                int timeout_ms);

/* ---- maintenance ------------------------------------------------------------------------------ */

typedef struct fx_etcd_status {
    char version[32];
    int64_t db_size;
    int64_t leader;
    int64_t raft_index;
    int64_t revision;
} fx_etcd_status;
/* /v3/maintenance/status on the current endpoint (fails over like a read). */
fx_err fx_etcd_status_get(fx_etcd *c, fx_etcd_status *out, int timeout_ms);
/* /v3/kv/compaction up to revision (physical). */
fx_err fx_etcd_compact(fx_etcd *c, int64_t revision, int timeout_ms);

/* ---- watch ------------------------------------------------------------------------------------ */
/*
 * A resilient watch of one key range. It runs on its own thread and delivers, in order:
 *   1. FX_WATCH_SNAPSHOT: every key in the range at revision R (the watch stream was created
 *      before the snapshot was read, so nothing between the two is missed), then
 *   2. FX_WATCH_EVENTS: batches of events with mod_revision > R, in revision order.
 * If the stream breaks (etcd restart, network error, server error object), the watcher re-creates
 * it from last_revision+1 and continues without a snapshot: no update is missed or repeated. If
 * that revision has been compacted, it re-creates the watch, takes a new snapshot and delivers it
 * (FX_WATCH_SNAPSHOT again): the receiver replaces its view. Revisions delivered never go
 * backwards. Reconnect attempts back off from 50 ms to 2 s (bounded, forever until stopped); each
 * is counted in fx_watch_stats and logged (rate-limited).
 *
 * With start_revision > 0 no snapshot is taken: events from start_revision on are delivered (a
 * compacted start revision -> a snapshot is taken instead, as above).
 *
 * The callback runs on the watch thread, one call at a time; the update and everything it points
 * to is valid only during the call. The callback must not call fx_watch_stop() on its own watch.
 */
typedef enum { FX_EV_PUT = 0, FX_EV_DELETE = 1 } fx_event_type;

typedef struct fx_event {
    fx_event_type type;
    fx_kv kv; /* for DELETE only key and mod_revision are set */
    bool has_prev;
    fx_kv prev_kv;
} fx_event;

typedef enum { FX_WATCH_SNAPSHOT = 0, FX_WATCH_EVENTS = 1 } fx_watch_kind;

typedef struct fx_watch_update {
    fx_watch_kind kind;
    int64_t revision; /* snapshot: its revision; events: revision of the last event */
    const fx_kv *kvs; /* snapshot */
    size_t n_kvs;
    const fx_event *events; /* events */
    size_t n_events;
} fx_watch_update;

typedef void (*fx_watch_fn)(void *arg, const fx_watch_update *u);

typedef struct fx_watch_opts {
    fx_slice key;
    fx_slice range_end; /* len 0: single key; fx_prefix_end() for a prefix */
    int64_t start_revision; /* 0: snapshot then live events */
    bool prev_kv;
    fx_watch_fn fn;
    void *arg;
} fx_watch_opts;

typedef struct fx_watch fx_watch;

typedef struct fx_watch_stats {
    uint64_t streams;     /* watch streams opened */
    uint64_t reconnects;  /* streams re-created after a failure */
    uint64_t snapshots;   /* snapshots delivered */
    uint64_t compactions; /* compacted start revisions met */
    uint64_t events;      /* events delivered */
    int64_t last_revision;
} fx_watch_stats;

/* Start a watch. Returns once the first stream is created and (without start_revision) the
 * first snapshot has been delivered, or with an error if that fails within timeout_ms (the watch
 * is then not started and the callback will not be called again). */
fx_err fx_watch_start(fx_etcd *c, const fx_watch_opts *opts, int timeout_ms, fx_watch **out);
/* Stop: closes the stream (etcd frees the watcher), interrupts any backoff wait, joins the
 * thread. After it returns the callback is never called again. NULL is a no-op. */
void fx_watch_stop(fx_watch *w);
void fx_watch_get_stats(fx_watch *w, fx_watch_stats *out);

#endif
