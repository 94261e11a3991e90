/* etcd_json.h -- pure codecs for the etcd v3 JSON gateway: request bodies, responses, watch
 * stream lines and the error mapping. No I/O, no global state: everything is testable from byte
 * buffers (the gateway's wire format is summarised in etcd.h).
 *
 * Wire rules applied here:
 *  - bytes fields are standard base64 with padding (fx_b64); decoding is strict.
 *  - int64 fields are sent as JSON strings; in responses they are parsed from strings (numbers
 *    are accepted too when integral and below 2^53). A missing field (or JSON null) is 0, false
 *    or empty: the gateway omits zero values. A field of the wrong JSON type, an unparsable int64
 *    or invalid base64 makes the whole parse fail with FX_EPROTO.
 *  - enums are sent by name ("CREATE", "DESCEND", ...).
 *  - bodies larger than FX_EJ_MAX_BODY are refused (FX_EPROTO) without being parsed.
 *
 * Ownership: request structs are borrowed. A request builder stores in *out a malloc'd,
 * NUL-terminated JSON text that the caller frees with free(). A parser fills a zeroed result
 * struct that the caller frees with the matching *_free() of etcd.h (fx_range_resp_free, ...,
 * fx_ej_watch_line_free); on failure the result is left zeroed, so freeing is always safe.
 * After a successful parse every fx_bytes in a result has non-NULL data (NUL-terminated, possibly
 * len 0), except prev_kv members that were absent (has_prev false).
 * On failure fx_err_detail() says what was wrong (never the body itself).
 *
 * Error mapping (fx_ej_map_error), from the gRPC code when present, else from the HTTP status:
 *   3 InvalidArgument   "too many operations" -> FX_ETXN_TOO_MANY_OPS
 *                       "request is too large" -> FX_ETOO_LARGE
 *                       "duplicate key"        -> FX_EDUPLICATE_KEY
 *                       "authentication failed", "user name is empty" -> FX_EAUTH
 *                       anything else          -> FX_EINVAL
 *   11 OutOfRange       "compacted" -> FX_ECOMPACTED, "future revision" -> FX_EFUTURE_REV,
 *                       anything else (e.g. "too large lease TTL") -> FX_EINVAL
 *   5 NotFound -> FX_ENOTFOUND. "requested lease not found" is FX_ENOTFOUND here; etcd.c turns it
 *                       into FX_ELEASE_EXPIRED for put/txn with a lease and for keepalives, and
 *                       keeps FX_ENOTFOUND for revoke (see fx_ej_is_lease_not_found()).
 *   16 -> FX_EAUTH   7 -> FX_EPERM   8 -> FX_ENOSPACE   9 and 6 -> FX_EEXISTS
 *   4 -> FX_ETIMEDOUT   14 -> FX_EUNAVAIL   1 -> FX_ECANCELED   other codes -> FX_ESERVER
 *   no gRPC code: HTTP 400 -> FX_EINVAL, 401 -> FX_EAUTH, 403 -> FX_EPERM, 404 -> FX_ENOTFOUND,
 *                 412 -> FX_EEXISTS, 413 -> FX_ETOO_LARGE, 429 -> FX_ENOSPACE,
 *                 502/503 -> FX_EUNAVAIL, 504 -> FX_ETIMEDOUT, else FX_ESERVER.
 *
 * Thread rules: all functions are reentrant and thread-safe.
 */
#ifndef FX_ETCD_JSON_H
#define FX_ETCD_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"

/* Largest response body (or watch line) the codecs accept. */
#define FX_EJ_MAX_BODY ((size_t)64 << 20)

/* ---- request bodies ------------------------------------------------------------------------ */

/* Every builder returns FX_EINVAL for an empty key or an out-of-range enum, FX_ENOMEM on
 * allocation failure. */
fx_err fx_ej_range_req(const fx_range_req *r, char **out);
fx_err fx_ej_put_req(const fx_put_req *r, char **out);
fx_err fx_ej_del_req(const fx_del_req *r, char **out);
/* Compares and ops of both branches (no nested txn: fx_op has no txn type). */
fx_err fx_ej_txn_req(const fx_txn_req *r, char **out);
/* {"TTL":"<ttl>","ID":"<id>"} (ID omitted when 0). */
fx_err fx_ej_lease_grant_req(int64_t ttl_s, int64_t id, char **out);
/* {"ID":"<id>"}: keepalive, revoke and timetolive bodies. */
fx_err fx_ej_lease_id_req(int64_t id, char **out);
/* {"revision":"<rev>","physical":true|omitted} */
fx_err fx_ej_compact_req(int64_t revision, bool physical, char **out);
/* {"name":..,"password":..}: the result holds the password; free it promptly, never log it. */
fx_err fx_ej_auth_req(const char *name, const char *password, char **out);

typedef struct fx_ej_watch_create {
    fx_slice key;
    fx_slice range_end;     /* len 0: single key */
    int64_t start_revision; /* 0: from the current revision on */
    bool prev_kv;
    bool progress_notify;
} fx_ej_watch_create;
/* {"create_request":{...}} */
fx_err fx_ej_watch_create_req(const fx_ej_watch_create *w, char **out);

/* ---- responses (HTTP 200 bodies) ------------------------------------------------------------ */

fx_err fx_ej_parse_range(const char *body, size_t len, fx_range_resp *out);
fx_err fx_ej_parse_put(const char *body, size_t len, fx_put_resp *out);
fx_err fx_ej_parse_del(const char *body, size_t len, fx_del_resp *out);
/* A response_txn member (nested txn) is FX_EPROTO: fx_op_resp cannot represent it. */
fx_err fx_ej_parse_txn(const char *body, size_t len, fx_txn_resp *out);
/* header.revision only (compaction, revoke). rev may be NULL. */
fx_err fx_ej_parse_header(const char *body, size_t len, int64_t *rev);
/* ID and TTL of a grant; FX_EPROTO when ID is missing. */
fx_err fx_ej_parse_lease_grant(const char *body, size_t len, int64_t *id, int64_t *ttl);
/* {"result":{...,"TTL":"n"}}: FX_OK with *ttl > 0, FX_ELEASE_EXPIRED when TTL is absent or <= 0,
 * or the mapped error of a stream error object {"error":{"grpc_code":..}}. */
fx_err fx_ej_parse_keepalive(const char *body, size_t len, int64_t *ttl);
/* TTL (-1 when the lease does not exist) and grantedTTL (granted may be NULL). */
fx_err fx_ej_parse_timetolive(const char *body, size_t len, int64_t *ttl, int64_t *granted);
fx_err fx_ej_parse_status(const char *body, size_t len, fx_etcd_status *out);
/* The token of /v3/auth/authenticate; *token is malloc'd (caller frees; never log it). */
fx_err fx_ej_parse_auth(const char *body, size_t len, char **token);

/* ---- errors ------------------------------------------------------------------------------------ */

typedef struct fx_ej_error {
    int http_status;  /* as given */
    int grpc_code;    /* -1 when the body carried none */
    char message[256]; /* server message, or a printable prefix of a non-JSON body */
} fx_ej_error;

/* Map (HTTP status, gRPC code or -1, message or NULL) to an fx_err (table above). */
fx_err fx_ej_map_error(int http_status, int grpc_code, const char *message);
/* Parse an error body: {"error":"..","message":"..","code":N} (unary) or
 * {"error":{"grpc_code":N,"http_code":..,"message":..}} (stream). Never fails: a body that is not
 * JSON yields grpc_code -1 and its printable prefix as message. Returns the mapped error. */
fx_err fx_ej_parse_error(int http_status, const char *body, size_t len, fx_ej_error *e);
/* True when the message is etcd's "requested lease not found". */
bool fx_ej_is_lease_not_found(const char *message);
/* gRPC code of a status name ("PermissionDenied" -> 7), -1 if unknown. */
int fx_ej_grpc_code_by_name(const char *name, size_t len);

/* ---- watch stream lines --------------------------------------------------------------------- */

typedef enum {
    FX_WL_CREATED = 0, /* the watch was created */
    FX_WL_CANCELED,    /* the watch was canceled (compaction, auth, permission, duplicate id) */
    FX_WL_EVENTS,      /* events (possibly of several revisions) */
    FX_WL_PROGRESS,    /* header only: every event up to `revision` has been sent */
    FX_WL_ERROR        /* stream error object, the stream is about to end */
} fx_ej_wl_kind;

typedef struct fx_ej_watch_line {
    fx_ej_wl_kind kind;
    int64_t revision;         /* header.revision (0 when absent) */
    int64_t watch_id;
    bool created;             /* "created" was true (also on a created+canceled line) */
    int64_t compact_revision; /* CANCELED: > 0 when the start revision was compacted */
    fx_err err;               /* CANCELED/ERROR: the mapped error (FX_ECOMPACTED on compaction) */
    int grpc_code;            /* CANCELED/ERROR: gRPC code, -1 unknown */
    char reason[256];         /* CANCELED: cancel_reason; ERROR: message */
    fx_event *events;         /* EVENTS */
    size_t n_events;
} fx_ej_watch_line;

/* Parse one newline-delimited stream object ({"result":{...}} or {"error":...}); the line may
 * include its trailing "\n" / "\r\n". Fills a zeroed *out (free with fx_ej_watch_line_free). */
fx_err fx_ej_parse_watch_line(const char *line, size_t len, fx_ej_watch_line *out);
void fx_ej_watch_line_free(fx_ej_watch_line *l);
void fx_event_free(fx_event *ev);

#endif
