/* etcd_int.h -- internals shared by the two files of the etcd client: etcd.c (client, connection
 * pool, one HTTP exchange, auth, unary calls) and etcd_watch.c (the resilient watch). Not part of
 * the API (etcd.h); names use the fx__etcd_ prefix. Nothing outside lease/etcd*.c includes it.
 *
 * Ownership: the fx_etcd struct and everything in it belong to etcd.c (fx_etcd_new/fx_etcd_free).
 * etcd_watch.c reads only the fields fixed at creation (eps, n_eps, username, TLS files and the
 * timeouts), cur_ep and the atomic stats; it never touches the pool, the lane or the token
 * directly, only through fx__etcd_auth_header/fx__etcd_auth_invalidate. A watch keeps a pointer
 * to its client, so every fx_watch must be stopped before fx_etcd_free (etcd.h).
 * Thread rules: every function here is safe from any thread, including a watch thread. The
 * mutexes of fx_etcd are private to etcd.c: taken only inside its functions, never held on return
 * or across a watch callback.
 */
#ifndef FX_LEASE_ETCD_INT_H
#define FX_LEASE_ETCD_INT_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_log.h"

#define MAX_ENDPOINT_LEN 256

/* One pooled connection: an easy handle and its error buffer. h2: it speaks gRPC (HTTP/2) to
 * etcd's gRPC API, else HTTP/1.1 to the JSON gateway; a handle never changes kind. */
typedef struct conn {
    CURL *h;
    CURLM *m; /* h2: the multi handle its transfers run on (etcd.c h2_perform), else NULL */
    bool h2;
    int h2_ep; /* h2: the endpoint its HTTP/2 connection is up to, or -1 (etcd.c perform) */
    char errbuf[CURL_ERROR_SIZE];
} conn;

struct fx_etcd {
    char **eps; /* normalised endpoint URLs, no trailing '/' */
    size_t n_eps;
    char *uid;
    char *username, *password; /* password: never logged */
    char *ca_file, *cert_file, *key_file;
    bool insecure;
    bool grpc; /* KV calls over gRPC (fx_etcd_opts.grpc) */
    int default_timeout_ms, connect_timeout_ms, max_conns;

    _Atomic size_t cur_ep; /* the endpoint that last worked */

    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv; /* CLOCK_MONOTONIC */
    conn **idle;            /* max_conns slots, either kind */
    int n_idle, n_conns;    /* n_conns: both kinds together, <= max_conns */

    pthread_mutex_t lane_mu; /* the keepalive lane */
    conn *lane;

    pthread_mutex_t auth_mu;
    char *token; /* never logged */
    uint64_t token_gen;

    struct {
        _Atomic uint64_t requests, failovers, errors, conns_created, pool_waits, keepalives,
            latency_us_sum, latency_count;
    } st;
    fx_log_slot log_slot;
};

/* A bounded response body. */
typedef struct rbuf {
    char *data;
    size_t len, cap, limit;
    bool overflow;
} rbuf;

/* Options every handle gets: no signals, TCP keepalive, HTTP/1.1, http(s) only, TLS files. */
void fx__etcd_set_common_opts(fx_etcd *c, CURL *h, char *errbuf);
/* CURLOPT_WRITEFUNCTION appending to an rbuf (ud); aborts the transfer past b->limit. */
size_t fx__etcd_rbuf_write(char *ptr, size_t size, size_t nmemb, void *ud);
/* "Authorization: <token>" for this call, authenticating first if no token is cached. k may be
 * NULL (a pooled handle is borrowed for the authentication). *hdr is NULL without auth; *gen
 * identifies the token, for fx__etcd_auth_invalidate(). */
fx_err fx__etcd_auth_header(fx_etcd *c, conn *k, int64_t deadline, char **hdr, uint64_t *gen);
/* Drop the cached token if it is still the one of generation gen (a 401 said it expired). */
void fx__etcd_auth_invalidate(fx_etcd *c, uint64_t gen);

#endif
