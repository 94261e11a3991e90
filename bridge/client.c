/* client.c -- the Fluxon MQ client root (Fluxon's KvClient): backends, LeaseManager, the
 * endpoint close registry, channel-config validation. Contracts: fluxon_mq.h, mq_int.h.
 *
 * Registry protocol (Fluxon MQ's child-close registry):
 *  - fx__mq_register() links an endpoint (before its blocking construction); refused with
 *    FX_ECLOSED once the client is closing.
 *  - fx_mq_client_close() takes the endpoints one at a time: it unlinks the endpoint, marks it as
 *    "being closed by the client" (priv->calling), calls its close outside the lock and then only
 *    clears the mark and wakes anyone waiting: it never touches the endpoint after its close
 *    returned, because a thread whose open was interrupted by this close frees the endpoint as
 *    soon as the close has finished it (a construction may be running while the client
 *    closes).
 *  - fx__mq_unregister() unlinks; when the client is inside that endpoint's close on another
 *    thread, it first waits until that call has returned, so an endpoint that unregistered can be
 *    freed without the client still touching it. (The endpoint must therefore let concurrent
 *    closers return *before* it unregisters; see the note at the end of mq_int.h.)
 *  - Backend users (create, puts, gets, commit threads, close deletes) hold an op reference
 *    (fx__mq_op_enter/leave); fx_mq_client_close() frees the backends only after every endpoint
 *    is closed and every op reference is gone (bounded wait; on timeout the backends are leaked
 *    rather than freed under a user, with an ERR line).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fx_log.h"
#include "fx_time.h"
#include "mq_int.h"
#include "pwatch.h"
#include "revoker.h"

#define DEF_LONG_TTL_S FX_MQ_LONG_LEASE_TTL_SECONDS
#define DEF_MIN_TTL_S FX_MQ_MIN_TTL_SECONDS
#define DEF_OP_MS 5000
#define DEF_CLOSE_MS 1000

/* The private part of the client, allocated around the public struct (only this file
 * allocates fx_mq_client). */
typedef struct client_priv {
    struct fx_mq_client pub; /* first: container_of by cast */
    pthread_cond_t cv;        /* registry and op-count changes (with pub.mu) */
    fx__mq_endpoint *calling; /* endpoint whose close the client is running now */
    fx__mq_endpoint *kept;    /* endpoints whose close failed strongly (retried by the next
                               * client close; the backends stay until the list is empty) */
    bool force;               /* fx_mq_client_free: endpoint closes must finish */
    pthread_t caller;         /* the thread running it */
    fx_err close_err;         /* first endpoint close error (returned by repeated closes) */
    bool backends_freed;
} client_priv;

static client_priv *priv_of(fx_mq_client *c) { return (client_priv *)c; }

/* ---- options ---------------------------------------------------------------------------------- */

static char *own_str(fx_mq_client *c, const char *s)
{
    if (!s) return NULL;
    char **ns = realloc(c->strs, (c->n_strs + 1) * sizeof *ns);
    if (!ns) return NULL;
    c->strs = ns;
    char *d = strdup(s);
    if (!d) return NULL;
    c->strs[c->n_strs++] = d;
    return d;
}

/* Owned copy of an array of strings (the array itself is stored in strs as a char*). */
static const char *const *own_strv(fx_mq_client *c, const char *const *v, size_t n, bool *ok)
{
    *ok = true;
    if (!v || !n) return NULL;
    char **ns = realloc(c->strs, (c->n_strs + 1) * sizeof *ns);
    if (!ns) {
        *ok = false;
        return NULL;
    }
    c->strs = ns;
    const char **arr = calloc(n, sizeof *arr);
    if (!arr) {
        *ok = false;
        return NULL;
    }
    c->strs[c->n_strs++] = (char *)arr;
    for (size_t i = 0; i < n; i++) {
        if (!v[i] || !(arr[i] = own_str(c, v[i]))) {
            *ok = false;
            return NULL;
        }
    }
    return arr;
}

static fx_err check_opts(const fx_mq_client_opts *o)
{
    if (!o) return fx_seterr(FX_EINVAL, "mq client: NULL options");
    if (!o->etcd.endpoints || o->etcd.n_endpoints == 0)
        return fx_seterr(FX_EINVAL, "mq client: etcd.endpoints: at least one endpoint required");
    if (o->n_kv_endpoints && !o->kv_endpoints)
        return fx_seterr(FX_EINVAL, "mq client: kv_endpoints: NULL with n_kv_endpoints > 0");
    for (size_t i = 0; i < o->n_kv_endpoints; i++)
        if (!o->kv_endpoints[i] || !o->kv_endpoints[i][0])
            return fx_seterr(FX_EINVAL, "mq client: kv_endpoints[%zu]: empty", i);
    if (o->long_lease_ttl_s < 0 || o->long_lease_ttl_s > FX_MQ_MAX_TTL_SECONDS)
        return fx_seterr(FX_EINVAL, "mq client: long_lease_ttl_s: %lld out of range",
                         (long long)o->long_lease_ttl_s);
    if (o->min_ttl_s < 0 || o->min_ttl_s > FX_MQ_MAX_TTL_SECONDS)
        return fx_seterr(FX_EINVAL, "mq client: min_ttl_s: %lld out of range",
                         (long long)o->min_ttl_s);
    if (o->op_timeout_ms < 0) return fx_seterr(FX_EINVAL, "mq client: op_timeout_ms < 0");
    if (o->close_timeout_ms < 0) return fx_seterr(FX_EINVAL, "mq client: close_timeout_ms < 0");
    if (o->kv_redis_url && (!o->kv_redis_url[0] || o->n_kv_endpoints))
        return fx_seterr(FX_EINVAL, "mq client: kv_redis_url: empty, or given with kv_endpoints");
    if (o->exec && (!fx_exec_kind_name(o->exec, FX_EXEC_K_COMMIT) ||
                    !fx_exec_kind_name(o->exec, FX_EXEC_K_REVOKE)))
        return fx_seterr(FX_EINVAL, "mq client: exec: kinds FX_EXEC_K_COMMIT and "
                                    "FX_EXEC_K_REVOKE must be registered");
    if (o->kv_prefix && !o->kv_prefix[0])
        return fx_seterr(FX_EINVAL, "mq client: kv_prefix: empty (use NULL for the default)");
    if (o->client_id) {
        size_t n = strnlen(o->client_id, FX_MQ_STR_MAX + 1);
        if (n == 0 || n > FX_MQ_STR_MAX)
            return fx_seterr(FX_EINVAL, "mq client: client_id: must be 1..%d bytes",
                             FX_MQ_STR_MAX);
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)o->client_id[i] < 0x20 || o->client_id[i] == 0x7f)
                return fx_seterr(FX_EINVAL, "mq client: client_id: control character at %zu", i);
    }
    return FX_OK;
}

/* Default identity: "<hostname>-<pid>-<16 random hex>" (random from /dev/urandom, else the
 * clock and the client's address), unique per client root and stable for its life. */
static void default_client_id(fx_mq_client *c)
{
    char host[64] = "";
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = 0;
    uint64_t r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    bool ok = f && fread(&r, sizeof r, 1, f) == 1;
    if (f) fclose(f);
    if (!ok) r = (uint64_t)fx_wall_ns() ^ (uint64_t)(uintptr_t)c;
    snprintf(c->client_id, sizeof c->client_id, "%s-%ld-%016llx", host, (long)getpid(),
             (unsigned long long)r);
}

static void free_strs(fx_mq_client *c)
{
    for (size_t i = 0; i < c->n_strs; i++) free(c->strs[i]);
    free(c->strs);
    c->strs = NULL;
    c->n_strs = 0;
}

static void free_backends(fx_mq_client *c)
{
    fx_lease_mgr_free(c->leases);
    c->leases = NULL;
    fx_kv_store_free(c->kv); /* a shared store does not free the etcd client */
    c->kv = NULL;
    fx_etcd_free(c->etcd);
    c->etcd = NULL;
}

fx_err fx_mq_client_new(const fx_mq_client_opts *opts, fx_mq_client **out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mq client: NULL out");
    *out = NULL;
    fx_err e = check_opts(opts);
    if (e) return e;
    client_priv *p = calloc(1, sizeof *p);
    if (!p) return fx_seterr(FX_ENOMEM, "mq client: out of memory");
    fx_mq_client *c = &p->pub;
    if ((e = fx_mq_keys_init(&c->keys, opts->root))) {
        free(p);
        return e;
    }
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(p);
        return fx_seterr(FX_ENOMEM, "mq client: mutex init failed");
    }
    if (pthread_mutex_init(&c->publish_mu, NULL) != 0 || pthread_mutex_init(&c->ids_mu, NULL)) {
        pthread_mutex_destroy(&c->mu);
        free(p);
        return fx_seterr(FX_ENOMEM, "mq client: mutex init failed");
    }
    if (fx_cond_init_monotonic(&p->cv) != 0) {
        pthread_mutex_destroy(&c->publish_mu);
        pthread_mutex_destroy(&c->mu);
        free(p);
        return fx_seterr(FX_ENOMEM, "mq client: condvar init failed");
    }
    c->opts = *opts;
    c->long_ttl_s = opts->long_lease_ttl_s ? opts->long_lease_ttl_s : DEF_LONG_TTL_S;
    c->min_ttl_s = opts->min_ttl_s ? opts->min_ttl_s : DEF_MIN_TTL_S;
    c->op_timeout_ms = opts->op_timeout_ms ? opts->op_timeout_ms : DEF_OP_MS;
    c->kv_timeout_ms = opts->kv_timeout_ms > 0 ? opts->kv_timeout_ms : c->op_timeout_ms;
    c->close_timeout_ms = opts->close_timeout_ms ? opts->close_timeout_ms : DEF_CLOSE_MS;
    if (opts->client_id)
        snprintf(c->client_id, sizeof c->client_id, "%s", opts->client_id);
    else
        default_client_id(c);
    c->opts.client_id = c->client_id;

    /* Owned copies of the strings we keep. Credentials and TLS paths are not kept: the etcd
     * clients copy what they need, and the client root never logs or reuses them. */
    bool ok1, ok2;
    c->opts.root = own_str(c, c->keys.root);
    c->opts.etcd.endpoints = own_strv(c, opts->etcd.endpoints, opts->etcd.n_endpoints, &ok1);
    c->opts.kv_endpoints = own_strv(c, opts->kv_endpoints, opts->n_kv_endpoints, &ok2);
    char defprefix[FX_MQ_ROOT_MAX + 8];
    snprintf(defprefix, sizeof defprefix, "%s/kv/", c->keys.root);
    c->opts.kv_prefix = own_str(c, opts->kv_prefix ? opts->kv_prefix : defprefix);
    c->opts.etcd.username = c->opts.etcd.password = NULL;
    c->opts.kv_redis_url = NULL; /* may hold a password: used once below, never kept */
    c->opts.etcd.ca_file = c->opts.etcd.cert_file = c->opts.etcd.key_file = NULL;
    c->opts.long_lease_ttl_s = c->long_ttl_s;
    c->opts.min_ttl_s = c->min_ttl_s;
    c->opts.op_timeout_ms = c->op_timeout_ms;
    c->opts.close_timeout_ms = c->close_timeout_ms;
    if (!c->opts.root || !ok1 || !ok2 || !c->opts.kv_prefix) {
        e = fx_seterr(FX_ENOMEM, "mq client: out of memory");
        goto fail;
    }

    fx_etcd_opts eo = opts->etcd;
    if (!eo.default_timeout_ms) eo.default_timeout_ms = c->op_timeout_ms;
    if ((e = fx_etcd_new(&eo, &c->etcd))) goto fail;
    c->segments = !opts->per_message_keys;
    c->kv_shared = opts->n_kv_endpoints == 0 && !opts->kv_redis_url;
    if (opts->kv_redis_url) {
        fx_kv_redis_opts ro = {.url = opts->kv_redis_url, .prefix = c->opts.kv_prefix,
                               .default_timeout_ms = c->kv_timeout_ms,
                               .pool_size = opts->kv_redis_pool,
                               .require_fsync = opts->kv_redis_require_fsync,
                               .min_replicas = opts->kv_redis_min_replicas};
        e = fx_kv_new_redis(&ro, &c->kv);
    } else if (c->kv_shared) {
        e = fx_kv_new_etcd_shared(c->etcd, c->opts.kv_prefix, c->op_timeout_ms, &c->kv);
    } else {
        fx_kv_etcd_opts ko = {.etcd = opts->etcd, .prefix = c->opts.kv_prefix,
                              .default_timeout_ms = c->op_timeout_ms};
        ko.etcd.endpoints = opts->kv_endpoints;
        ko.etcd.n_endpoints = opts->n_kv_endpoints;
        if (!ko.etcd.default_timeout_ms) ko.etcd.default_timeout_ms = c->op_timeout_ms;
        e = fx_kv_new_etcd(&ko, &c->kv);
    }
    if (e) goto fail;
    if ((e = fx_lease_mgr_new(&opts->lease, &c->leases))) goto fail;
    if (opts->exec) {
        c->exec = opts->exec;
    } else {
        fx_exec_cfg xc, def;
        fx_exec_cfg_defaults(&def);
        memset(&xc, 0, sizeof xc);
        xc.name = "mq";
        xc.kinds[FX_EXEC_K_COMMIT] = def.kinds[FX_EXEC_K_COMMIT];
        xc.kinds[FX_EXEC_K_COMMIT].threads_max = FX_MQ_COMMIT_THREADS;
        xc.kinds[FX_EXEC_K_REVOKE] = def.kinds[FX_EXEC_K_REVOKE];
        if ((e = fx_exec_new(&xc, &c->exec))) goto fail;
        c->exec_owned = true;
    }
    c->etcd_backend = fx_lease_backend_etcd(c->etcd);
    c->kv_backend = fx_lease_backend_kv(c->kv);
    fx_life_init(&c->life, false);
    *out = c;
    return FX_OK;
fail:
    if (c->exec_owned) fx_exec_free(c->exec);
    c->exec = NULL;
    free_backends(c);
    free_strs(c);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&c->publish_mu);
    pthread_mutex_destroy(&c->ids_mu);
    pthread_mutex_destroy(&c->mu);
    free(p);
    return e;
}

/* ---- registry --------------------------------------------------------------------------------- */

/* An endpoint is on one of two lists: c->endpoints (open) or priv->kept (strong close failure). */
static void unlink_ep(fx_mq_client *c, fx__mq_endpoint *ep)
{
    client_priv *p = priv_of(c);
    fx__mq_endpoint **head = c->endpoints == ep ? &c->endpoints : p->kept == ep ? &p->kept : NULL;
    if (!head && !ep->prev) return; /* not linked */
    if (ep->prev)
        ep->prev->next = ep->next;
    else
        *head = ep->next;
    if (ep->next) ep->next->prev = ep->prev;
    ep->prev = ep->next = NULL;
}

static void push_ep(fx__mq_endpoint **head, fx__mq_endpoint *ep)
{
    ep->prev = NULL;
    ep->next = *head;
    if (*head) (*head)->prev = ep;
    *head = ep;
}

fx_err fx__mq_register(fx_mq_client *c, fx__mq_endpoint *ep)
{
    if (!c || !ep || !ep->close) return fx_seterr(FX_EINVAL, "mq client: bad endpoint");
    pthread_mutex_lock(&c->mu);
    if (c->life.state != FX_LIFE_OPEN) {
        pthread_mutex_unlock(&c->mu);
        return fx_seterr(FX_ECLOSED, "mq client: closed");
    }
    push_ep(&c->endpoints, ep);
    pthread_mutex_unlock(&c->mu);
    return FX_OK;
}

void fx__mq_unregister(fx_mq_client *c, fx__mq_endpoint *ep)
{
    if (!c || !ep) return;
    client_priv *p = priv_of(c);
    pthread_mutex_lock(&c->mu);
    while (p->calling == ep && !pthread_equal(p->caller, pthread_self()))
        pthread_cond_wait(&p->cv, &c->mu);
    unlink_ep(c, ep);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&c->mu);
}

fx_err fx__mq_op_enter(fx_mq_client *c)
{
    if (!c) return fx_seterr(FX_EINVAL, "mq client: NULL");
    pthread_mutex_lock(&c->mu);
    fx_err e = fx_life_op_enter(&c->life, false);
    pthread_mutex_unlock(&c->mu);
    return e ? fx_seterr(e, "mq client: closed") : FX_OK;
}

void fx__mq_op_leave(fx_mq_client *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    fx_life_op_leave(&c->life, &priv_of(c)->cv);
    pthread_mutex_unlock(&c->mu);
}

fx_err fx__mq_new_op_enter(fx_mq_client *c)
{
    if (!c) return fx_seterr(FX_EINVAL, "mq client: NULL");
    pthread_mutex_lock(&c->mu);
    fx_err e = fx_life_op_enter(&c->life, true);
    pthread_mutex_unlock(&c->mu);
    return e ? fx_seterr(e, "mq client: closed") : FX_OK;
}

bool fx__mq_client_closing(fx_mq_client *c)
{
    pthread_mutex_lock(&c->mu);
    bool r = c->life.state != FX_LIFE_OPEN;
    pthread_mutex_unlock(&c->mu);
    return r;
}

fx_err fx_mq_client_close(fx_mq_client *c)
{
    if (!c) return fx_seterr(FX_EINVAL, "mq client: NULL");
    client_priv *p = priv_of(c);
    pthread_mutex_lock(&c->mu);
    fx_life_closing(&c->life, &p->cv); /* OPEN -> CLOSING (idempotent) */
    fx_err first = FX_OK;
    /* The first strong failure: its detail is held (fx_err_hold) through the other closes and
     * goes into the returned error. */
    fx_err strong = FX_OK;
    bool held = false;
    /* Retry the endpoints whose close failed strongly last time. */
    while (p->kept) {
        fx__mq_endpoint *ep = p->kept;
        unlink_ep(c, ep);
        push_ep(&c->endpoints, ep);
    }
    /* Close every endpoint. Concurrent client closes cooperate: each takes the next endpoint
     * nobody is closing; the loop ends when the list is empty and no close is running. */
    for (;;) {
        fx__mq_endpoint *ep = c->endpoints;
        if (!ep) {
            if (p->calling) { /* another thread's client close is still running one */
                pthread_cond_wait(&p->cv, &c->mu);
                continue;
            }
            break;
        }
        if (p->calling) {
            pthread_cond_wait(&p->cv, &c->mu);
            continue;
        }
        /* Unlink first: once fn() returns, the endpoint may already be freed by a thread that
         * was opening it (its failed open frees it as soon as this close has finished it), so
         * `ep` is never dereferenced after the call (only compared, in fx__mq_unregister). */
        unlink_ep(c, ep);
        p->calling = ep;
        p->caller = pthread_self();
        fx_err (*fn)(void *) = ep->close;
        fx_err (*fn_ex)(void *, bool, bool *) = ep->close_ex;
        void *self = ep->self;
        bool force = p->force;
        pthread_mutex_unlock(&c->mu);
        bool unfinished = false;
        fx_err e = fn_ex ? fn_ex(self, force, &unfinished) : fn(self);
        /* Under the hold the detail is the strong failure's, not this close's. */
        const char *why = strong ? "detail not kept" : fx_err_detail();
        if (e && unfinished) {
            FX_WRN("mq client close: an endpoint close failed strongly: %s (%s); keeping the "
                   "backends until a later close succeeds", fx_errname(e), why);
            if (!strong) {
                strong = e;
                held = fx_err_hold();
            }
        } else if (e) {
            if (!first) first = e;
            FX_WRN("mq client close: an endpoint close failed: %s (%s)", fx_errname(e), why);
        }
        pthread_mutex_lock(&c->mu);
        /* An unfinished endpoint has not unregistered (its unregister waits for `calling` to be
         * cleared), so it is still valid here: keep it for the next client close. */
        if (e && unfinished) push_ep(&p->kept, ep);
        p->calling = NULL;
        pthread_cond_broadcast(&p->cv);
    }
    if (first && !p->close_err) p->close_err = first;
    if (strong) fx_err_release(held);
    if (p->kept) {
        /* Strong failure: no backend teardown; state stays "closing" (no new endpoints). */
        pthread_mutex_unlock(&c->mu);
        return fx_seterr(strong ? strong : FX_EUNAVAIL,
                         "mq client close: an endpoint close failed and stays retryable (%s); "
                         "backends kept, close again to retry",
                         strong ? fx_err_detail() : "closed by a concurrent client close");
    }
    if (c->life.state == FX_LIFE_CLOSING) {
        fx_life_close_done(&c->life, &p->cv, FX_OK); /* no new op references */
        int64_t deadline = fx_now_ms() + 2 * (int64_t)c->op_timeout_ms + c->close_timeout_ms;
        if (!fx_life_drain(&c->life, &c->mu, &p->cv, deadline)) {
            FX_ERR("mq client close: %lld backend calls still running after the close bound; "
                   "leaking the backends instead of freeing them under a caller",
                   (long long)c->life.ops);
        } else if (!p->backends_freed) {
            p->backends_freed = true;
            fx_revoker *rv = c->revoker;
            c->revoker = NULL;
            fx_pwatch *pw = c->pwatch;
            c->pwatch = NULL;
            fx_exec *ex = c->exec_owned ? c->exec : NULL;
            if (ex) c->exec = NULL;
            pthread_mutex_unlock(&c->mu);
            fx_revoker_free(rv); /* uses the etcd client: stopped first */
            fx_pwatch_free(pw);
            fx_exec_free(ex); /* every consumer left it: joins the commit threads */
            free_backends(c);
            pthread_mutex_lock(&c->mu);
        }
    }
    fx_err r = p->close_err;
    pthread_mutex_unlock(&c->mu);
    return r;
}

bool fx__mq_revoke_member_lease(fx_mq_client *c, int64_t lease, int64_t ttl_s, int timeout_ms)
{
    if (!c || lease <= 0) return false;
    fx_err e = fx_etcd_lease_revoke(c->etcd, lease, timeout_ms > 0 ? timeout_ms : 1);
    if (e == FX_OK || e == FX_ENOTFOUND || e == FX_ELEASE_EXPIRED) return true;
    pthread_mutex_lock(&c->mu);
    if (!c->revoker && !priv_of(c)->backends_freed &&
        fx_revoker_new(c->etcd, c->exec, &c->revoker) != FX_OK)
        FX_WRN("member lease %lld: cannot start the revoker (%s); its TTL reclaims it",
               (long long)lease, fx_err_detail());
    if (c->revoker) fx_revoker_add(c->revoker, lease, fx_now_ms() + ttl_s * 1000);
    pthread_mutex_unlock(&c->mu);
    return false;
}

fx_err fx__mq_pwatch(fx_mq_client *c, fx_pwatch **out)
{
    pthread_mutex_lock(&c->mu);
    fx_err e = FX_OK;
    if (priv_of(c)->backends_freed)
        e = fx_seterr(FX_ECLOSED, "mq client closed");
    else if (!c->pwatch) /* first consumer: the stream starts under mu (once per client) */
        e = fx_pwatch_new(c->etcd, &c->keys, c->op_timeout_ms, &c->pwatch);
    *out = c->pwatch;
    pthread_mutex_unlock(&c->mu);
    return e;
}

fx_err fx__mq_exec(fx_mq_client *c, fx_exec **out)
{
    pthread_mutex_lock(&c->mu);
    fx_err e = FX_OK;
    *out = NULL;
    if (priv_of(c)->backends_freed)
        e = fx_seterr(FX_ECLOSED, "mq client closed");
    else
        *out = c->exec;
    pthread_mutex_unlock(&c->mu);
    return e;
}

fx_exec *fx_mq_client_exec(fx_mq_client *c)
{
    if (!c) return NULL;
    pthread_mutex_lock(&c->mu);
    fx_exec *ex = c->exec;
    pthread_mutex_unlock(&c->mu);
    return ex;
}

void fx_mq_client_free(fx_mq_client *c)
{
    if (!c) return;
    client_priv *p = priv_of(c);
    if (fx_mq_client_close(c) != FX_OK) {
        pthread_mutex_lock(&c->mu);
        bool kept = p->kept != NULL;
        p->force = true; /* free must finish: endpoint closes give up what they could not do */
        pthread_mutex_unlock(&c->mu);
        if (kept) fx_mq_client_close(c);
    }
    /* Endpoints still registered cannot exist here: close unlinks every one. */
    free_strs(c);
    pthread_cond_destroy(&p->cv);
    fx_bytes_free(&c->pub_list);
    pthread_mutex_destroy(&c->publish_mu);
    pthread_mutex_destroy(&c->ids_mu);
    pthread_mutex_destroy(&c->mu);
    free(p);
}

fx_etcd *fx_mq_client_etcd(fx_mq_client *c) { return c ? c->etcd : NULL; }
fx_kv_store *fx_mq_client_kv(fx_mq_client *c) { return c ? c->kv : NULL; }

const char *fx_mq_client_plane(const fx_mq_client *c)
{
    if (!c) return "";
    return c->kv_shared ? "etcd-fused" : fx_kv_is_redis(c->kv) ? "redis" : "etcd-split";
}

uint64_t fx_mq_client_plane_lost(const fx_mq_client *c)
{
    return c ? atomic_load(&((fx_mq_client *)c)->plane_lost) : 0;
}

uint64_t fx_mq_client_payload_missing(const fx_mq_client *c)
{
    return c ? atomic_load(&((fx_mq_client *)c)->payload_missing) : 0;
}
fx_lease_mgr *fx_mq_client_leases(fx_mq_client *c) { return c ? c->leases : NULL; }
const char *fx_mq_client_root(const fx_mq_client *c) { return c ? c->keys.root : NULL; }
const char *fx_mq_client_id(const fx_mq_client *c) { return c ? c->client_id : NULL; }

/* ---- channel configuration ------------------------------------------------------------------- */

fx_err fx__mq_cfg_validate(const fx_mq_client *c, const fx_mq_chan_cfg *cfg)
{
    if (!c || !cfg) return fx_seterr(FX_EINVAL, "channel config: NULL");
    if (cfg->capacity < 1)
        return fx_seterr(FX_EINVAL, "channel config: capacity: %lld, must be >= 1",
                         (long long)cfg->capacity);
    if (cfg->ttl_s < c->min_ttl_s || cfg->ttl_s > FX_MQ_MAX_TTL_SECONDS)
        return fx_seterr(FX_EINVAL, "channel config: ttl_s: %lld out of range [%lld, %lld]",
                         (long long)cfg->ttl_s, (long long)c->min_ttl_s,
                         (long long)FX_MQ_MAX_TTL_SECONDS);
    if (cfg->retention_s &&
        (cfg->retention_s < cfg->ttl_s || cfg->retention_s > FX_MQ_MAX_TTL_SECONDS))
        return fx_seterr(FX_EINVAL, "channel config: retention_s: %lld out of range [%lld, %lld]",
                         (long long)cfg->retention_s, (long long)cfg->ttl_s,
                         (long long)FX_MQ_MAX_TTL_SECONDS);
    if (cfg->weight < 0)
        return fx_seterr(FX_EINVAL, "channel config: weight: %lld, must be >= 0",
                         (long long)cfg->weight);
    return FX_OK;
}
