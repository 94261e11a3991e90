/* fx_err.h -- the one status enum of fluxon-nats and its text.
 *
 * Contract:
 *  - Every fallible function of every layer returns fx_err; FX_OK is 0.
 *  - Codes are only ever appended (before FX__COUNT), never renumbered.
 *  - fx_strerror() returns a static string; never NULL, also for out-of-range codes.
 *  - The human detail of the last failure (server message, URL, HTTP status) is kept
 *    per thread: fx_err_detail() returns it for the calling thread until that thread's
 *    next failing call overwrites it. It never contains credentials.
 *  - A thread can hold its detail (fx_err_hold) across cleanup that may fail on its own: while
 *    held, fx_seterr, fx_err_wrap and fx_clearerr on that thread return their code but leave the
 *    text as it is. Holds nest; each thread has its own.
 * Thread rules: all functions are thread-safe; the detail and the hold are per thread.
 */
#ifndef FX_ERR_H
#define FX_ERR_H

#include <stdarg.h>
#include <stdbool.h>

typedef enum fx_err {
    FX_OK = 0,
    FX_EINVAL,            /* invalid argument or input */
    FX_ENOMEM,            /* out of memory */
    FX_ETIMEDOUT,         /* the call's deadline passed */
    FX_EUNAVAIL,          /* no endpoint reachable (transport failure on every endpoint) */
    FX_EPROTO,            /* malformed or unexpected response */
    FX_ENOTFOUND,         /* key or lease not found */
    FX_ELEASE_EXPIRED,    /* the lease is expired or unknown to the backend */
    FX_ETXN_TOO_MANY_OPS, /* a txn has more operations than the server allows (default 128) */
    FX_ETOO_LARGE,        /* request larger than the server's max request size */
    FX_ECOMPACTED,        /* required revision has been compacted */
    FX_EFUTURE_REV,       /* required revision is a future revision */
    FX_EAUTH,             /* authentication failed or token invalid */
    FX_EPERM,             /* permission denied */
    FX_ENOSPACE,          /* backend out of space (quota) or message larger than the gRPC limit */
    FX_EEXISTS,           /* already exists / failed precondition */
    FX_EKEY_BEING_WRITTEN,/* another put of the same key from this client is in flight */
    FX_ECLOSED,           /* the object was closed */
    FX_ECANCELED,         /* the operation was cancelled by shutdown */
    FX_ESERVER,           /* other server-side error */
    FX_EFULL,             /* channel full (capacity) */
    FX_ELEASE_LOST,       /* closed because a lease it depends on was lost */
    FX_EDUPLICATE_KEY,    /* the same key appears twice in one txn */
    FX__COUNT
} fx_err;

/* Static, never-NULL description of an error code. */
const char *fx_strerror(fx_err e);

/* Short stable name of an error code ("FX_ETIMEDOUT"). */
const char *fx_errname(fx_err e);

/* The calling thread's detail text for its last recorded failure ("" if none). */
const char *fx_err_detail(void);

/* Record a detail text for the calling thread and return e (for `return fx_seterr(...)`).
 * The text is truncated to 511 bytes. The arguments may include fx_err_detail(). */
fx_err fx_seterr(fx_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Put a formatted context in front of the calling thread's detail text and return e:
 *     return fx_err_wrap(e, "lease %lld: ", (long long)id);
 * turns "etcd ...: lease not found" into "lease 7: etcd ...: lease not found". The whole text is
 * truncated to 511 bytes (the context first, so a long context shortens the old text). The
 * arguments may include fx_err_detail(). */
fx_err fx_err_wrap(fx_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the calling thread's detail text. */
void fx_clearerr(void);

/* Hold the calling thread's detail text until the matching fx_err_release: the detail of a
 * failure survives cleanup calls that record their own. Returns the previous hold state, which
 * fx_err_release restores (so holds nest):
 *     bool held = fx_err_hold();
 *     producer_free(p);          // may call fx_seterr: the text stays
 *     fx_err_release(held);
 *     return e;                  // with the detail of the original failure
 */
bool fx_err_hold(void);
void fx_err_release(bool prev);

#endif
