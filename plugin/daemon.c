/* daemon.c -- fluxon-bridge lifecycle: NATS connection, MQ client, channels, admin, house-keeping,
 * health, reload and drain. Contracts: daemon.h (public), dmctx.h (the
 * context it shares with the modules it wires: capture.h, claim.h, ...). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "jsapi.h"
#include "capture.h"
#include "claim.h"
#include "daemon.h"
#include "dmctx.h"
#include "delayq.h"
#include "redrive.h"
#include "fx_url.h"
#include "http.h"
#include "fx_time.h"
#include "inspect.h"
#include "jsack.h"

typedef struct dm_admin_req {
    struct dm_admin_req *next;
    char *subject;
    char *reply;
} dm_admin_req;

/* The daemon's own state: what only this file reads (the context the modules share is
 * struct fx_daemon, dmctx.h). Allocated with the daemon, freed with it. */
struct dm_own {
    char *cfg_path;
    int64_t start_ms;
    natsOptions *opts;
    bool nats_opened;
    natsSubscription *ack_sub, *js_ack_sub, *nr_sub;
    natsSubscription *admin_subs[5];
    size_t n_admin_subs;
    struct fx_jsapi *jsapi; /* JetStream API subset (jsapi.h); NULL when off */
    fx_http *http;
    fx_metric *g_lease_ka_fail, *g_etcd_req, *g_etcd_lat, *g_reconnects, *g_slow,
        *g_payload_missing, *g_claims_total, *g_leaf_up, *g_leaf_connects;
    fx_metric *g_plane_lost, *g_kv_refusing, *g_kv_refused, *g_kv_oom, *g_kv_wait_short;
    fx_metric *g_heap_trim_us; /* NULL without glibc */

    /* background threads (under d->mu, signalled on d->cv) */
    bool stop_late; /* house-keeping and admin threads (just before the MQ client closes) */
    pthread_t interest_thr, hk_thr, admin_thr, ctl_thr;
    bool interest_started, hk_started, admin_started, ctl_started;

    /* admin queue (under d->mu) */
    struct dm_admin_req *aq_head, *aq_tail;
    size_t aq_n;

    /* control (under d->mu) */
    bool ctl_reload, ctl_stop, ctl_exit;

    /* health (under health_mu) */
    pthread_mutex_t health_mu;
    bool etcd_ok;
    char etcd_err[256];

    atomic_bool fatal;
    bool drained;
    int done_fd;
    atomic_int exit_code; /* written by the control thread, read by main after done_fd */
};

/* ---- small helpers ------------------------------------------------------------------------- */

static void set_flag(fx_daemon *d, bool *flag)
{
    pthread_mutex_lock(&d->mu);
    *flag = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* URLs in log lines: lease/fx_url.h fx_url_redact (never log credentials). */
static void redact_url(const char *url, char *out, size_t cap) { fx_url_redact(url, out, cap); }

static const char *conn_status_text(natsConnStatus s)
{
    switch (s) {
    case NATS_CONN_STATUS_DISCONNECTED: return "disconnected";
    case NATS_CONN_STATUS_CONNECTING: return "connecting";
    case NATS_CONN_STATUS_CONNECTED: return "connected";
    case NATS_CONN_STATUS_CLOSED: return "closed";
    case NATS_CONN_STATUS_RECONNECTING: return "reconnecting";
    case NATS_CONN_STATUS_DRAINING_SUBS: return "draining subscriptions";
    case NATS_CONN_STATUS_DRAINING_PUBS: return "draining publications";
    }
    return "unknown";
}

/* ---- NATS connection callbacks (cnats threads: log, flags, never block) ------------------ */

static void update_max_payload(fx_daemon *d, natsConnection *nc)
{
    int64_t mp = natsConnection_GetMaxPayload(nc);
    if (mp > 0) atomic_store(&d->max_payload, mp);
}

/* A (re)connection: the server's max_payload, and one INF line with the URL (credentials
 * redacted). */
static void log_connected(fx_daemon *d, natsConnection *nc, const char *what)
{
    char url[256] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof url);
    char red[300];
    redact_url(url, red, sizeof red);
    update_max_payload(d, nc);
    FX_INF("nats: %s to %s", what, red);
}

static void on_connected(natsConnection *nc, void *arg) { log_connected(arg, nc, "connected"); }

static void on_disconnected(natsConnection *nc, void *arg)
{
    (void)nc;
    fx_daemon *d = arg;
    if (!atomic_load(&d->stopping)) FX_WRN("nats: disconnected; reconnecting");
}

static void on_reconnected(natsConnection *nc, void *arg)
{
    fx_daemon *d = arg;
    fx_metric_inc(d->own->g_reconnects, 1);
    log_connected(d, nc, "reconnected");
}

static void on_closed(natsConnection *nc, void *arg)
{
    (void)nc;
    fx_daemon *d = arg;
    if (atomic_load(&d->stopping)) return;
    FX_ERR("nats: connection closed permanently");
    atomic_store(&d->own->fatal, true);
    set_flag(d, &d->own->ctl_stop);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    static fx_log_slot slot_sc, slot_other;
    if (err == NATS_SLOW_CONSUMER) {
        fx_metric_inc(d->own->g_slow, 1);
        fx_log_ratelimited(&slot_sc, 5000, FX_LOG_WRN,
                           "nats: slow consumer: messages dropped by the client library");
    } else {
        fx_log_ratelimited(&slot_other, 5000, FX_LOG_WRN, "nats: async error: %s",
                           natsStatus_GetText(err));
    }
}

/* nats.leaf_url: the leaf connection that carries explicit-ack deliveries with "$JS.ACK."
 * replies. It connects (and reconnects) in the background; until it is up those deliveries wait
 * and /healthz says 503. */
static fx_err leaf_setup(fx_daemon *d, const char *cname)
{
    const fx_config *c = d->cfg;
    if (!c->nats.leaf_url) return FX_OK;
    fx_leaf_opts lo = {.url = c->nats.leaf_url, .name = cname};
    fx_err e = fx_leaf_new(&lo, &d->leaf);
    if (!e) e = fx_leaf_start(d->leaf);
    if (e) return e;
    char red[300];
    redact_url(c->nats.leaf_url, red, sizeof red);
    FX_INF("nats leaf: explicit-ack deliveries go over the leafnode connection to %s with "
           "$JS.ACK.FLUXON.%s.* replies",
           red, d->name);
    return FX_OK;
}

/* The connection options from the config (also run by fx_daemon_check: every refusal of a
 * setting happens here, before any I/O). *out is set even on failure (caller destroys it). */
static fx_err nats_options_cfg(fx_daemon *d, const fx_config *c, const char *cname,
                               natsOptions **out)
{
    natsStatus s = nats_Open(-1);
    if (s != NATS_OK) return fx_seterr(FX_EUNAVAIL, "nats: library init: %s", natsStatus_GetText(s));
    d->own->nats_opened = true;
    if ((s = natsOptions_Create(out)) != NATS_OK)
        return fx_seterr(FX_ENOMEM, "nats: options: %s", natsStatus_GetText(s));
    natsOptions *o = *out;
    /* cnats takes the URL's userinfo as written (no %-decoding): the URL goes without it and
     * the decoded user and password (or token: a user without password) go apart. */
    char url[FX_URL_MAX + 1];
    fx_url cred;
    char why[160];
    fx_url_status ust = fx_url_split_userinfo(c->nats.url ? c->nats.url : "nats://127.0.0.1:4222",
                                              url, sizeof url, &cred, why, sizeof why);
    if (ust != FX_URL_OK) return fx_seterr(FX_EINVAL, "nats.url: %s", why);
    bool url_creds = cred.has_user; /* they win over nats.user/token, as cnats' own rule */
    s = natsOptions_SetURL(o, url);
    if (s == NATS_OK && url_creds)
        s = cred.has_password ? natsOptions_SetUserInfo(o, cred.user, cred.password)
                              : natsOptions_SetToken(o, cred.user);
    fx_url_wipe(&cred);
    explicit_bzero(url, sizeof url);
    if (s == NATS_OK) s = natsOptions_SetName(o, cname);
    if (s == NATS_OK) s = natsOptions_SetNoEcho(o, true);
    if (s == NATS_OK) s = natsOptions_SetSendAsap(o, true);
    if (s == NATS_OK) s = natsOptions_UseGlobalMessageDelivery(o, true);
    if (s == NATS_OK) s = natsOptions_SetRetryOnFailedConnect(o, true, on_connected, d);
    if (s == NATS_OK) s = natsOptions_SetAllowReconnect(o, true);
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(o, -1);
    if (s == NATS_OK) s = natsOptions_SetReconnectWait(o, 1000);
    if (s == NATS_OK) s = natsOptions_SetReconnectJitter(o, 200, 1000);
    if (s == NATS_OK) s = natsOptions_SetTimeout(o, 2000);
    if (s == NATS_OK) s = natsOptions_SetPingInterval(o, 10000);
    if (s == NATS_OK) s = natsOptions_SetMaxPingsOut(o, 3);
    if (s == NATS_OK) s = natsOptions_SetReconnectBufSize(o, 8 * 1024 * 1024);
    if (s == NATS_OK) s = natsOptions_SetMaxPendingMsgs(o, FX_DM_SUB_PENDING_MSGS);
    if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(o, on_disconnected, d);
    if (s == NATS_OK) s = natsOptions_SetReconnectedCB(o, on_reconnected, d);
    if (s == NATS_OK) s = natsOptions_SetClosedCB(o, on_closed, d);
    if (s == NATS_OK) s = natsOptions_SetErrorHandler(o, on_error, d);
    if (s != NATS_OK) return fx_seterr(FX_EINVAL, "nats: options: %s", natsStatus_GetText(s));
    /* credentials and TLS (never logged) */
    if (c->nats.user && !url_creds &&
        (s = natsOptions_SetUserInfo(o, c->nats.user, c->nats.password)) != NATS_OK)
        return fx_seterr(FX_EINVAL, "nats.user: %s", natsStatus_GetText(s));
    if (c->nats.token && !url_creds && (s = natsOptions_SetToken(o, c->nats.token)) != NATS_OK)
        return fx_seterr(FX_EINVAL, "nats.token: %s", natsStatus_GetText(s));
    if (c->nats.creds_file &&
        (s = natsOptions_SetUserCredentialsFromFiles(o, c->nats.creds_file, NULL)) != NATS_OK)
        return fx_seterr(FX_EINVAL, "nats.creds_file: %s", natsStatus_GetText(s));
    if (c->nats.nkey_seed_file)
        return fx_seterr(FX_EINVAL, "nats.nkey_seed_file: not supported by this build; use "
                                    "nats.creds_file");
    if (c->nats.ca_file) {
        if ((s = natsOptions_SetSecure(o, true)) != NATS_OK ||
            (s = natsOptions_LoadCATrustedCertificates(o, c->nats.ca_file)) != NATS_OK)
            return fx_seterr(FX_EINVAL, "nats.ca_file: %s", natsStatus_GetText(s));
    }
    if (c->nats.cert_file || c->nats.key_file) {
        if ((s = natsOptions_SetSecure(o, true)) != NATS_OK ||
            (s = natsOptions_LoadCertificatesChain(o, c->nats.cert_file, c->nats.key_file)) != NATS_OK)
            return fx_seterr(FX_EINVAL, "nats.cert_file: %s", natsStatus_GetText(s));
    }
    if (c->nats.tls_insecure && (s = natsOptions_SkipServerVerification(o, true)) != NATS_OK)
        return fx_seterr(FX_EINVAL, "nats.tls_insecure: %s", natsStatus_GetText(s));
    return FX_OK;
}

static fx_err nats_options(fx_daemon *d, const char *cname, natsOptions **out)
{
    return nats_options_cfg(d, d->cfg, cname, out);
}

static fx_err nats_connect_aux(fx_daemon *d, const char *cname, natsConnection **out)
{
    *out = NULL;
    natsOptions *o = NULL;
    fx_err e = nats_options_cfg(d, d->cfg_start, cname, &o);
    natsStatus s = NATS_OK;
    /* not the daemon's connection: no daemon callbacks (its close is no fatal event), and a
     * connect that fails fails now */
    if (!e) {
        s = natsOptions_SetRetryOnFailedConnect(o, false, NULL, NULL);
        if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(o, NULL, NULL);
        if (s == NATS_OK) s = natsOptions_SetReconnectedCB(o, NULL, NULL);
        if (s == NATS_OK) s = natsOptions_SetClosedCB(o, NULL, NULL);
        if (s == NATS_OK) s = natsOptions_SetErrorHandler(o, NULL, NULL);
        if (s == NATS_OK) s = natsConnection_Connect(out, o);
        if (s != NATS_OK) e = fx_seterr(FX_EUNAVAIL, "nats: connect: %s", natsStatus_GetText(s));
    }
    natsOptions_Destroy(o);
    return e;
}

static fx_err nats_setup(fx_daemon *d)
{
    const fx_config *c = d->cfg;
    char cname[200];
    snprintf(cname, sizeof cname, "fluxon-bridge-%s", d->name);
    fx_err e = nats_options(d, cname, &d->own->opts);
    if (e) return e;
    nats_SetMessageDeliveryPoolSize(FX_DM_DELIVERY_THREADS);
    const char *url = c->nats.url ? c->nats.url : "nats://127.0.0.1:4222";
    natsStatus s = natsConnection_Connect(&d->nc, d->own->opts);
    char red[300];
    redact_url(url, red, sizeof red);
    if (s == NATS_NOT_YET_CONNECTED) {
        FX_WRN("nats: %s not reachable yet; retrying in the background", red);
    } else if (s != NATS_OK) {
        d->nc = NULL;
        return fx_seterr(FX_EUNAVAIL, "nats: connect %s: %s", red, natsStatus_GetText(s));
    } else {
        update_max_payload(d, d->nc);
        FX_INF("nats: connected to %s as %s", red, cname);
    }
    return leaf_setup(d, cname);
}

/* ---- MQ client -------------------------------------------------------------------------------- */

static bool same_endpoints(char **a, size_t na, char **b, size_t nb)
{
    if (na != nb) return false;
    for (size_t i = 0; i < na; i++) {
        bool found = false;
        for (size_t j = 0; j < nb && !found; j++) found = strcmp(a[i], b[j]) == 0;
        if (!found) return false;
    }
    return true;
}

static void mq_options(const fx_config *c, fx_mq_client_opts *out)
{
    fx_mq_client_opts o = {0};
    o.etcd.endpoints = (const char *const *)c->etcd.endpoints;
    o.etcd.n_endpoints = c->etcd.n_endpoints;
    o.etcd.username = c->etcd.username;
    o.etcd.password = c->etcd.password;
    o.etcd.ca_file = c->etcd.ca_file;
    o.etcd.cert_file = c->etcd.cert_file;
    o.etcd.key_file = c->etcd.key_file;
    o.etcd.insecure_skip_verify = c->etcd.tls_insecure;
    o.etcd.grpc = strcmp(c->etcd.transport, "grpc") == 0;
    o.root = c->etcd.prefix;
    if (c->kv.url) { /* kv.backend "redis" */
        o.kv_redis_url = c->kv.url;
        o.kv_timeout_ms = (int)c->kv.timeout_ms;
        o.kv_redis_require_fsync = c->kv.require_fsync;
        o.kv_redis_min_replicas = (int)c->kv.min_replicas;
    } else if (c->kv.n_endpoints &&
        !same_endpoints(c->kv.endpoints, c->kv.n_endpoints, c->etcd.endpoints, c->etcd.n_endpoints)) {
        o.kv_endpoints = (const char *const *)c->kv.endpoints;
        o.n_kv_endpoints = c->kv.n_endpoints;
    }
    int64_t min_ttl = 90; /* the MQ's default product minimum */
    for (size_t i = 0; i < c->n_channels; i++)
        if (c->channels[i].s.ttl_seconds > 0 && c->channels[i].s.ttl_seconds < min_ttl)
            min_ttl = c->channels[i].s.ttl_seconds;
    if (c->defaults.ttl_seconds > 0 && c->defaults.ttl_seconds < min_ttl)
        min_ttl = c->defaults.ttl_seconds;
    o.min_ttl_s = min_ttl;
    o.op_timeout_ms = 5000;
    *out = o;
}

/* Redis plane: read its persistence at start and say what a PubAck means; refuse to start (exit
 * 2, naming the setting) under an evicting maxmemory-policy (the write guard, kv_redis.c) and,
 * with kv.require_fsync, unless every write is fsynced (appendonly + appendfsync always). Redis
 * unreachable at start: with require_fsync a refusal (cannot verify), else a warning (the plane
 * recovers by itself when Redis comes; its write guard checks every new connection before
 * writing). After the start the guard re-checks on its own: after every re-dial, before writes
 * once a connection's check is FX_KV_REDIS_RECHECK_MS old, and from the house-keeping thread. */
static fx_err redis_persistence_check(fx_daemon *d)
{
    const fx_config *c = d->cfg;
    fx_kv_redis_persistence p;
    fx_err e = fx_kv_redis_read_persistence(fx_mq_client_kv(d->mq), &p, 3000);
    if (e) {
        if (c->kv.require_fsync)
            return fx_seterr(e, "kv.require_fsync: cannot read Redis persistence: %s",
                             fx_err_detail());
        FX_WRN("kv redis: cannot read persistence yet (%s): publishes fail with 503 until Redis "
               "answers", fx_err_detail());
        return FX_OK;
    }
    const char *meaning;
    bool always = p.aof_enabled && !strcmp(p.appendfsync, "always");
    if (always)
        meaning = "durable on disk (AOF, appendfsync always)";
    else if (p.aof_enabled && !strcmp(p.appendfsync, "everysec"))
        meaning = "in Redis memory; up to 1 s of acked messages may be lost if Redis itself "
                  "crashes (AOF, appendfsync everysec)";
    else if (p.aof_enabled)
        meaning = "in Redis memory; the OS decides when the AOF reaches disk (appendfsync no)";
    else if (p.rdb_enabled)
        meaning = "in Redis memory only; RDB snapshots lose everything since the last save";
    else
        meaning = "in Redis memory only (no AOF, no RDB): a Redis restart loses every stored message";
    FX_INF("kv redis: appendonly %s, appendfsync %s, rdb %s: a PubAck means the message is %s",
           p.aof_enabled ? "yes" : "no", p.appendfsync[0] ? p.appendfsync : "(unknown)",
           p.rdb_enabled ? "on" : "off", meaning);
    if (c->kv.require_fsync && !always)
        return fx_seterr(FX_EINVAL, "kv.require_fsync: Redis has appendonly %s, appendfsync %s; "
                                    "need appendonly yes and appendfsync always",
                         p.aof_enabled ? "yes" : "no", p.appendfsync[0] ? p.appendfsync : "(unknown)");
    char why[256];
    e = fx_kv_redis_check(fx_mq_client_kv(d->mq), true, why, sizeof why, 3000);
    if (e == FX_EINVAL) return fx_seterr(FX_EINVAL, "kv redis: %s", why);
    if (e) {
        if (c->kv.require_fsync)
            return fx_seterr(e, "kv.require_fsync: cannot check Redis: %s", fx_err_detail());
        FX_WRN("kv redis: cannot check maxmemory-policy yet (%s): writes wait for the check",
               fx_err_detail());
    }
    if (c->kv.min_replicas)
        FX_INF("kv redis: kv.min_replicas %lld: a PubAck also means the payload reached %lld "
               "replica(s) (WAIT)", (long long)c->kv.min_replicas, (long long)c->kv.min_replicas);
    return FX_OK;
}

/* The keeper reclaimed an idle sub-MPSC of channel `name` (keeper thread). */
static void on_reclaim(void *arg, const char *name)
{
    fx_daemon *d = arg;
    pthread_rwlock_rdlock(&d->reg);
    dm_chan *ch = dm_find_chan_locked(d, name);
    if (ch) fx_metric_inc(ch->m.reclaimed, 1);
    pthread_rwlock_unlock(&d->reg);
}

static fx_err mq_setup(fx_daemon *d)
{
    const fx_config *c = d->cfg;
    fx_exec_cfg xc;
    fx_exec_cfg_defaults(&xc);
    xc.name = "daemon";
    fx_err e = fx_exec_new(&xc, &d->exec);
    if (e) return e;
    fx_mq_client_opts o;
    mq_options(c, &o);
    o.exec = d->exec; /* one executor per bridge: commits and revokes run on it too */
    if ((e = fx_mq_client_new(&o, &d->mq))) return e;
    if ((e = fx_chanq_keeper_new(d->mq, d->exec, on_reclaim, d, &d->keeper))) {
        fx_mq_client_free(d->mq);
        d->mq = NULL;
        return e;
    }
    FX_INF("etcd: %zu endpoint(s), prefix %s; payload plane: %s", c->etcd.n_endpoints,
           c->etcd.prefix ? c->etcd.prefix : "/fluxon", fx_mq_client_plane(d->mq));
    if (c->kv.url && (e = redis_persistence_check(d))) {
        fx_chanq_keeper_free(d->keeper);
        d->keeper = NULL;
        fx_mq_client_free(d->mq);
        d->mq = NULL;
    }
    return e;
}

/* ---- health and metrics ----------------------------------------------------------------------- */

static int health_cb(void *arg, char *err, size_t errlen)
{
    fx_daemon *d = arg;
    if (!d->nc) {
        snprintf(err, errlen, "nats: no connection");
        return -1;
    }
    natsConnStatus st = natsConnection_Status(d->nc);
    if (st != NATS_CONN_STATUS_CONNECTED) {
        snprintf(err, errlen, "nats: %s", conn_status_text(st));
        return -1;
    }
    if (d->leaf && !fx_leaf_connected(d->leaf)) {
        char why[256];
        fx_leaf_status(d->leaf, why, sizeof why);
        snprintf(err, errlen, "nats leaf: %s", why);
        return -1;
    }
    pthread_mutex_lock(&d->own->health_mu);
    bool ok = d->own->etcd_ok;
    if (!ok) snprintf(err, errlen, "etcd: %s", d->own->etcd_err);
    pthread_mutex_unlock(&d->own->health_mu);
    if (!ok) return -1;
    /* Healthy only once every channel is attached (its data leases registered and kept alive). */
    pthread_rwlock_rdlock(&d->reg);
    for (size_t i = 0; i < d->n_chans && ok; i++) {
        dm_chan *ch = d->chans[i];
        if (atomic_load(&ch->attached)) continue;
        ok = false;
        pthread_mutex_lock(&ch->mu);
        snprintf(err, errlen, "channel %s: not attached: %s", ch->name, ch->attach_err);
        pthread_mutex_unlock(&ch->mu);
    }
    pthread_rwlock_unlock(&d->reg);
    return ok ? 0 : -1;
}

/* Before anything starts: resolve every configured channel once, so a setting an existing channel
 * cannot take (a changed retention) stops the start with exit 2 and the setting's name. etcd not
 * reachable is not fatal (the producer threads keep trying); the first transport error ends the
 * pass, so a dead etcd costs one deadline, not one per channel. */
static fx_err chans_preflight(fx_daemon *d, const fx_config *cfg)
{
    for (size_t i = 0; i < cfg->n_channels; i++) {
        const fx_chan_config *cc = &cfg->channels[i];
        fx_mq_chan_cfg mc = {.capacity = cc->s.capacity, .ttl_s = cc->s.ttl_seconds,
                             .retention_s = (cc->s.retention_ms + 999) / 1000};
        int64_t id = -1;
        fx_err e = fx_mpmc_resolve(d->mq, cc->name, &mc, &id);
        if (e == FX_EINVAL) {
            return fx_err_wrap(FX_EINVAL, "channels[%s]: ", cc->name);
        }
        if (e) {
            FX_WRN("channel %s: cannot check it yet: %s (%s); attaching in the background",
                   cc->name, fx_strerror(e), fx_err_detail());
            return FX_OK;
        }
    }
    return FX_OK;
}

static void metrics_setup(fx_daemon *d)
{
    fx_metrics *m = d->metrics;
    d->g_invalid_acks = fx_metrics_add(m, "fluxon_invalid_acks_total",
                                       "Malformed ack replies ignored", FX_METRIC_COUNTER, "");
    d->g_stale_acks = fx_metrics_add(m, "fluxon_stale_acks_total",
                                     "Acks for no delivery in flight (late, duplicate or of an earlier attempt)",
                                     FX_METRIC_COUNTER, "");
    d->g_invalid_control = fx_metrics_add(m, "fluxon_invalid_control_total",
                                          "Control messages (acks, no-responders statuses) the bridge "
                                          "did not cause, ignored",
                                          FX_METRIC_COUNTER, "");
    d->g_acks_dropped = fx_metrics_add(m, "fluxon_acks_dropped_total",
                                       "Acks dropped because a claim's ack queue was full",
                                       FX_METRIC_COUNTER, "");
    d->own->g_lease_ka_fail = fx_metrics_add(m, "fluxon_lease_keepalive_failures_total",
                                        "Failed lease keepalive calls", FX_METRIC_COUNTER, "");
    d->own->g_etcd_req = fx_metrics_add(m, "fluxon_etcd_requests_total", "etcd HTTP requests sent",
                                   FX_METRIC_COUNTER, "");
    d->own->g_etcd_lat = fx_metrics_add(m, "fluxon_etcd_latency_avg_us",
                                   "Average latency of successful etcd calls (microseconds)",
                                   FX_METRIC_GAUGE, "");
    d->own->g_reconnects = fx_metrics_add(m, "fluxon_nats_reconnects_total", "NATS reconnections",
                                     FX_METRIC_COUNTER, "");
    d->own->g_payload_missing = fx_metrics_add(m, "fluxon_payload_missing_total",
                                          "Message ids whose payload was missing below the produce "
                                          "offset (lost by the payload store), skipped",
                                          FX_METRIC_COUNTER, "");
    d->own->g_plane_lost = fx_metrics_add(m, "fluxon_payload_plane_lost_total",
                                     "Consumers stopped because their channel's whole payload "
                                     "lease was gone from the payload plane (nothing committed "
                                     "past it)", FX_METRIC_COUNTER, "");
    if (d->cfg->kv.url) {
        d->own->g_kv_refusing = fx_metrics_add(m, "fluxon_kv_redis_refusing_writes",
                                          "1 while Redis fails the write guard (an evicting "
                                          "maxmemory-policy, or persistence below "
                                          "kv.require_fsync): writes are refused",
                                          FX_METRIC_GAUGE, "");
        d->own->g_kv_refused = fx_metrics_add(m, "fluxon_kv_redis_writes_refused_total",
                                         "Redis writes refused by the write guard",
                                         FX_METRIC_COUNTER, "");
        d->own->g_kv_oom = fx_metrics_add(m, "fluxon_kv_redis_oom_total",
                                     "Redis writes refused by Redis with OOM (maxmemory reached)",
                                     FX_METRIC_COUNTER, "");
        d->own->g_kv_wait_short = fx_metrics_add(m, "fluxon_kv_redis_wait_short_total",
                                            "Redis puts failed because WAIT reached fewer than "
                                            "kv.min_replicas replicas", FX_METRIC_COUNTER, "");
    }
#ifdef __GLIBC__
    d->own->g_heap_trim_us = fx_metrics_add(m, "fluxon_heap_trim_us_total",
                                            "Microseconds the house-keeping thread spent handing "
                                            "free heap memory back to the kernel (malloc_trim, "
                                            "five times a second)",
                                            FX_METRIC_COUNTER, "");
#endif
    d->own->g_slow = fx_metrics_add(m, "fluxon_slow_consumer_events_total",
                               "NATS slow-consumer episodes (messages dropped by the client library)",
                               FX_METRIC_COUNTER, "");
    if (d->cfg->nats.leaf_url) {
        d->own->g_leaf_up = fx_metrics_add(m, "fluxon_nats_leaf_connected",
                                      "1 when the leafnode connection for deliveries is up",
                                      FX_METRIC_GAUGE, "");
        d->own->g_leaf_connects = fx_metrics_add(m, "fluxon_nats_leaf_connects_total",
                                            "Leafnode connections established (first and reconnects)",
                                            FX_METRIC_COUNTER, "");
    }
}

/* ---- house-keeping thread ------------------------------------------------------------------- */

static void hk_probe_etcd(fx_daemon *d, bool *was_ok)
{
    fx_etcd_status st;
    memset(&st, 0, sizeof st);
    fx_err e = fx_etcd_status_get(fx_mq_client_etcd(d->mq), &st, 1500);
    char why[256] = "";
    if (e) snprintf(why, sizeof why, "%s", fx_err_detail()[0] ? fx_err_detail() : fx_strerror(e));
    pthread_mutex_lock(&d->own->health_mu);
    d->own->etcd_ok = !e;
    snprintf(d->own->etcd_err, sizeof d->own->etcd_err, "%s", e ? why : "");
    pthread_mutex_unlock(&d->own->health_mu);
    if (e && *was_ok) FX_WRN("etcd: unreachable: %s", why);
    if (!e && !*was_ok) FX_INF("etcd: reachable (version %s)", st.version);
    *was_ok = !e;
}

static void hk_stats(fx_daemon *d)
{
    fx_etcd_stats es;
    fx_etcd_get_stats(fx_mq_client_etcd(d->mq), &es);
    fx_metric_set(d->own->g_etcd_req, (int64_t)es.requests);
    fx_metric_set(d->own->g_etcd_lat, es.latency_count ? (int64_t)(es.latency_us_sum / es.latency_count) : 0);
    fx_lease_mgr_stats ls;
    fx_lease_mgr_get_stats(fx_mq_client_leases(d->mq), &ls);
    fx_metric_set(d->own->g_lease_ka_fail, (int64_t)ls.keepalive_failures);
    fx_metric_set(d->own->g_payload_missing, (int64_t)fx_mq_client_payload_missing(d->mq));
    fx_metric_set(d->own->g_plane_lost, (int64_t)fx_mq_client_plane_lost(d->mq));
    if (d->own->g_kv_refusing) { /* the Redis plane */
        /* The write guard's periodic check also while no write comes (the ERR line and the gauge
         * follow a runtime CONFIG SET within this thread's second). */
        fx_kv_store *kv = fx_mq_client_kv(d->mq);
        fx_kv_redis_check(kv, false, NULL, 0, 1000);
        fx_kv_redis_stats ks;
        fx_kv_redis_get_stats(kv, &ks);
        fx_metric_set(d->own->g_kv_refusing, ks.refused ? 1 : 0);
        fx_metric_set(d->own->g_kv_refused, (int64_t)ks.refused_writes);
        fx_metric_set(d->own->g_kv_oom, (int64_t)ks.oom);
        fx_metric_set(d->own->g_kv_wait_short, (int64_t)ks.wait_short);
    }
    if (d->leaf) {
        fx_leaf_stats st;
        fx_leaf_get_stats(d->leaf, &st);
        fx_metric_set(d->own->g_leaf_up, fx_leaf_connected(d->leaf) ? 1 : 0);
        fx_metric_set(d->own->g_leaf_connects, (int64_t)st.connects);
    }
    pthread_rwlock_rdlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        for (size_t i = 0; i < ch->n_subs; i++) {
            int64_t dropped = 0;
            if (ch->subs[i] && natsSubscription_GetDropped(ch->subs[i], &dropped) == NATS_OK &&
                dropped > ch->sub_dropped[i]) {
                fx_metric_inc(ch->m.dropped, dropped - ch->sub_dropped[i]);
                ch->sub_dropped[i] = dropped;
            }
        }
    }
    pthread_rwlock_unlock(&d->reg);
}

/* The channels' backlog gauges from the keeper's views (bridge/chanq_keeper.h), and the channels
 * it keeps: every configured one. */
static void hk_views(fx_daemon *d)
{
    const char *names[256];
    size_t n = 0;
    pthread_rwlock_rdlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        if (n < 256) names[n++] = ch->name;
        fx_chanq_chan_stats st;
        if (!fx_chanq_keeper_stats(d->keeper, ch->name, &st) || !st.known) continue;
        fx_metric_set(ch->m.backlog, st.backlog);
    }
    fx_chanq_keeper_set_channels(d->keeper, names, n);
    pthread_rwlock_unlock(&d->reg);
}

/* Hand the heap's free pages back to the kernel. glibc keeps what was freed inside its arenas
 * (freed chunks in the middle of a heap are never trimmed by free), so after a burst at 4 KiB
 * (payloads held in the consumers' unacked windows, request frames, read buffers) the bridge
 * held 48-62 MiB while idle, and the next burst's peak sat on top of that (BENCHMARKS.md, issue
 * 24 seventh round). malloc_trim releases free pages anywhere in every arena; its cost is
 * counted in fluxon_heap_trim_us_total. */
static void hk_heap_trim(fx_daemon *d)
{
#ifdef __GLIBC__
    int64_t t0 = fx_now_us();
    malloc_trim(0);
    fx_metric_inc(d->own->g_heap_trim_us, fx_now_us() - t0);
#else
    (void)d;
#endif
}

static void *hk_main(void *arg)
{
    fx_thread_name("fx-housekeep");
    fx_daemon *d = arg;
    bool etcd_was_ok = true;
    int64_t next = 0; /* the next probe and metrics pass (every FX_DM_HK_MS) */
    for (;;) {
        if (fx_now_ms() >= next) {
            hk_probe_etcd(d, &etcd_was_ok);
            hk_stats(d);
            hk_views(d);
            next = fx_now_ms() + FX_DM_HK_MS;
        }
        hk_heap_trim(d);
        int64_t wait = next - fx_now_ms(); /* until the next pass, at most FX_DM_TRIM_MS */
        if (wait > FX_DM_TRIM_MS) wait = FX_DM_TRIM_MS;
        if (wait < 1) wait = 1;
        if (dm_wait_flag(d, &d->own->stop_late, wait)) break;
    }
    return NULL;
}

/* ---- admin ----------------------------------------------------------------------------------- */

static void on_admin(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    const char *reply = natsMsg_GetReply(m);
    const char *subj = natsMsg_GetSubject(m);
    if (!reply || !*reply || !subj) {
        natsMsg_Destroy(m);
        return;
    }
    dm_admin_req *r = calloc(1, sizeof *r);
    if (r) {
        r->subject = strdup(subj);
        r->reply = strdup(reply);
    }
    bool queued = false;
    if (r && r->subject && r->reply) {
        pthread_mutex_lock(&d->mu);
        if (d->own->aq_n < FX_DM_ADMINQ_MAX && !d->own->stop_late) {
            if (d->own->aq_tail)
                d->own->aq_tail->next = r;
            else
                d->own->aq_head = r;
            d->own->aq_tail = r;
            d->own->aq_n++;
            queued = true;
            pthread_cond_broadcast(&d->cv);
        }
        pthread_mutex_unlock(&d->mu);
    }
    if (!queued) {
        dm_reply_error(d, reply, 503, "admin busy");
        if (r) {
            free(r->subject);
            free(r->reply);
            free(r);
        }
    }
    natsMsg_Destroy(m);
}

static void add_counter(cJSON *o, const char *k, fx_metric *m)
{
    cJSON_AddNumberToObject(o, k, m ? (double)atomic_load(&m->value) : 0.0);
}

static char *info_json(fx_daemon *d)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "server", "fluxon-bridge");
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddStringToObject(o, "version", FX_BRIDGE_VERSION);
    int64_t up = fx_now_ms() - d->own->start_ms;
    cJSON_AddNumberToObject(o, "uptime_ms", (double)up);
    char ubuf[64];
    snprintf(ubuf, sizeof ubuf, "%" PRId64 "h%" PRId64 "m%" PRId64 "s", up / 3600000,
             (up / 60000) % 60, (up / 1000) % 60);
    cJSON_AddStringToObject(o, "uptime", ubuf);
    cJSON *n = cJSON_AddObjectToObject(o, "nats");
    bool conn = dm_nats_connected(d);
    cJSON_AddBoolToObject(n, "connected", conn);
    uint64_t cid = 0;
    if (conn && natsConnection_GetClientID(d->nc, &cid) == NATS_OK)
        cJSON_AddNumberToObject(n, "client_id", (double)cid);
    cJSON *e = cJSON_AddObjectToObject(o, "etcd");
    pthread_mutex_lock(&d->own->health_mu);
    cJSON_AddBoolToObject(e, "ok", d->own->etcd_ok);
    if (!d->own->etcd_ok) cJSON_AddStringToObject(e, "error", d->own->etcd_err);
    pthread_mutex_unlock(&d->own->health_mu);
    cJSON *arr = cJSON_AddArrayToObject(o, "channels");
    pthread_rwlock_rdlock(&d->reg);
    for (size_t i = 0; i < d->n_chans; i++) {
        dm_chan *ch = d->chans[i];
        cJSON *c = cJSON_CreateObject();
        if (!c) break;
        cJSON_AddItemToArray(arr, c);
        cJSON_AddStringToObject(c, "name", ch->name);
        cJSON_AddBoolToObject(c, "dlq", ch->is_dlq);
        cJSON *subs = cJSON_AddArrayToObject(c, "subjects");
        for (size_t k = 0; k < ch->n_subjects; k++)
            cJSON_AddItemToArray(subs, cJSON_CreateString(ch->subjects[k]));
        cJSON_AddStringToObject(c, "deliver_prefix", ch->deliver_prefix);
        cJSON_AddStringToObject(c, "ack", ch->s.ack == FX_ACK_NONE ? "none" : "explicit");
        pthread_mutex_lock(&ch->mu);
        cJSON_AddNumberToObject(c, "mpmc_id", ch->have_mpmc ? (double)ch->mpmc : -1.0);
        pthread_mutex_unlock(&ch->mu);
        cJSON *cl = cJSON_AddArrayToObject(c, "claims");
        for (dm_claim *x = ch->claims; x; x = x->next)
            if (atomic_load(&x->stop) == STOP_NONE) cJSON_AddItemToArray(cl, cJSON_CreateString(x->token));
        pthread_mutex_lock(&ch->q.mu);
        cJSON_AddNumberToObject(c, "queued", (double)ch->q.n);
        pthread_mutex_unlock(&ch->q.mu);
        add_counter(c, "captured", ch->m.captured);
        add_counter(c, "stored", ch->m.stored);
        add_counter(c, "store_errors", ch->m.store_errors);
        add_counter(c, "delivered", ch->m.delivered);
        add_counter(c, "acked", ch->m.acked);
        add_counter(c, "redelivered", ch->m.redelivered);
        add_counter(c, "dead_lettered", ch->m.dead);
        add_counter(c, "dropped", ch->m.dropped);
        add_counter(c, "invalid_acks", ch->m.invalid_acks);
        add_counter(c, "backlog", ch->m.backlog);
    }
    pthread_rwlock_unlock(&d->reg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

#define API_PREFIX "$FLUXON.API."

static void admin_answer(fx_daemon *d, dm_admin_req *r)
{
    fx_config *cfg = dm_cfg_get(d); /* a reload may replace it meanwhile */
    const char *op = r->subject + (strncmp(r->subject, API_PREFIX, sizeof API_PREFIX - 1) == 0
                                       ? sizeof API_PREFIX - 1
                                       : 0);
    char *body = NULL;
    if (strcmp(op, "INFO") == 0 || strncmp(op, "INFO.", 5) == 0)
        body = info_json(d);
    else if (strcmp(op, "CHANNEL.LIST") == 0)
        body = fx_admin_channel_list_json(d->mq, cfg);
    else if (strncmp(op, "CHANNEL.INFO.", 13) == 0)
        body = fx_admin_channel_info_json(d->mq, cfg, op + 13);
    fx_config_unref(cfg);
    if (!body) {
        dm_reply_error(d, r->reply, strncmp(op, "CHANNEL.", 8) == 0 || strncmp(op, "INFO", 4) == 0
                                        ? 500
                                        : 404,
                       "cannot answer");
        return;
    }
    natsConnection_PublishString(d->nc, r->reply, body);
    free(body);
}

static void *admin_main(void *arg)
{
    fx_thread_name("fx-admin");
    fx_daemon *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->own->aq_head && !d->own->stop_late) pthread_cond_wait(&d->cv, &d->mu);
        dm_admin_req *r = d->own->aq_head;
        if (r) {
            d->own->aq_head = r->next;
            if (!d->own->aq_head) d->own->aq_tail = NULL;
            d->own->aq_n--;
        }
        pthread_mutex_unlock(&d->mu);
        if (!r) break;
        admin_answer(d, r);
        free(r->subject);
        free(r->reply);
        free(r);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

/* ---- channels --------------------------------------------------------------------------------- */

static bool chans_append(dm_chan ***arr, size_t *n, dm_chan *ch)
{
    dm_chan **na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na) return false;
    na[(*n)++] = ch;
    *arr = na;
    return true;
}

/* Create, register (active) and start one channel. */
static fx_err chan_add(fx_daemon *d, const fx_chan_config *cc)
{
    dm_chan *ch = dm_chan_new(d, d->mq, d->metrics, cc);
    if (!ch) return fx_seterr(FX_ENOMEM, "channel %s: out of memory", cc->name);
    pthread_rwlock_wrlock(&d->reg);
    bool ok = chans_append(&d->chans, &d->n_chans, ch);
    pthread_rwlock_unlock(&d->reg);
    if (!ok) {
        dm_chan_unref(ch);
        return fx_seterr(FX_ENOMEM, "channel %s: out of memory", cc->name);
    }
    return dm_chan_start(ch);
}

/* Take channels out of the active list (no new claims, no ack routing) and drain them:
 * capture first, then claims, then the producer (which answers every queued publish). Then the
 * daemon's reference goes: each channel is freed once its capture subscriptions completed. */
static void chans_retire(fx_daemon *d, dm_chan **list, size_t n)
{
    pthread_rwlock_wrlock(&d->reg);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < d->n_chans; j++)
            if (d->chans[j] == list[i]) {
                d->chans[j] = d->chans[--d->n_chans];
                break;
            }
        atomic_store(&list[i]->draining, true);
    }
    pthread_rwlock_unlock(&d->reg);
    for (size_t i = 0; i < n; i++) dm_chan_drain_capture_begin(list[i]);
    int64_t cap_deadline = fx_now_ms() + 5000;
    for (size_t i = 0; i < n; i++) dm_chan_drain_capture_wait(list[i], cap_deadline);
    for (size_t i = 0; i < n; i++) dm_claims_request_stop(d, list[i], STOP_RELEASE);
    for (size_t i = 0; i < n; i++) dm_claims_stop_all(d, list[i], STOP_RELEASE);
    for (size_t i = 0; i < n; i++) dm_chan_stop_producer_begin(list[i]);
    for (size_t i = 0; i < n; i++) {
        dm_chan_stop_producer_wait(list[i]);
        FX_INF("channel %s: stopped", list[i]->name);
        dm_chan_unref(list[i]);
    }
}

static void reload(fx_daemon *d)
{
    fx_config *nc = calloc(1, sizeof *nc);
    if (!nc) {
        FX_ERR("reload: out of memory");
        return;
    }
    char err[512] = "";
    if (fx_config_load_file(d->own->cfg_path, nc, err, sizeof err) != 0) {
        FX_ERR("reload: %s (keeping the running configuration)", err);
        free(nc);
        return;
    }
    const fx_config *oc = d->cfg;
#define SAME_STR(a, b) (((a) == NULL && (b) == NULL) || ((a) && (b) && strcmp((a), (b)) == 0))
    if (!SAME_STR(oc->name, nc->name)) FX_WRN("reload: name changed: needs a restart (ignored)");
    if (!SAME_STR(oc->nats.url, nc->nats.url) || !SAME_STR(oc->nats.monitor_url, nc->nats.monitor_url) ||
        !SAME_STR(oc->nats.account, nc->nats.account) || !SAME_STR(oc->nats.user, nc->nats.user) ||
        !SAME_STR(oc->nats.password, nc->nats.password) || !SAME_STR(oc->nats.token, nc->nats.token) ||
        !SAME_STR(oc->nats.creds_file, nc->nats.creds_file) ||
        !SAME_STR(oc->nats.leaf_url, nc->nats.leaf_url))
        FX_WRN("reload: nats settings changed: need a restart (ignored)");
    if (!same_endpoints(oc->etcd.endpoints, oc->etcd.n_endpoints, nc->etcd.endpoints,
                        nc->etcd.n_endpoints) ||
        !SAME_STR(oc->etcd.prefix, nc->etcd.prefix) ||
        !same_endpoints(oc->kv.endpoints, oc->kv.n_endpoints, nc->kv.endpoints, nc->kv.n_endpoints) ||
        !SAME_STR(oc->kv.backend, nc->kv.backend) || !SAME_STR(oc->kv.url, nc->kv.url) ||
        oc->kv.require_fsync != nc->kv.require_fsync || oc->kv.timeout_ms != nc->kv.timeout_ms ||
        oc->kv.min_replicas != nc->kv.min_replicas)
        FX_WRN("reload: etcd/kv settings changed: need a restart (ignored)");
    if (!SAME_STR(oc->http.listen, nc->http.listen))
        FX_WRN("reload: http.listen changed: needs a restart (ignored)");
#undef SAME_STR
    /* A setting an existing channel cannot take (a changed retention): refuse the whole reload. */
    if (chans_preflight(d, nc) == FX_EINVAL) {
        FX_ERR("reload: %s (keeping the running configuration)", fx_err_detail());
        fx_config_free(nc);
        free(nc);
        return;
    }

    /* What goes: channels absent from the new file or changed. Non-DLQ first: their claims may
     * still dead-letter into a DLQ channel that is leaving too. */
    dm_chan **gone = NULL;
    size_t removed = 0;
    for (int pass = 0; pass < 2; pass++) {
        pthread_rwlock_rdlock(&d->reg);
        size_t ns = d->n_chans;
        dm_chan **snap = malloc((ns + 1) * sizeof *snap);
        if (snap) memcpy(snap, d->chans, ns * sizeof *snap);
        pthread_rwlock_unlock(&d->reg);
        size_t n_gone = 0;
        gone = malloc((ns + 1) * sizeof *gone);
        for (size_t i = 0; snap && gone && i < ns; i++) {
            dm_chan *ch = snap[i];
            if (ch->is_dlq != (pass == 1)) continue;
            const fx_chan_config *cc = fx_config_channel(nc, ch->name);
            if (!cc || !dm_chan_same(ch, cc)) gone[n_gone++] = ch;
        }
        free(snap);
        if (n_gone) chans_retire(d, gone, n_gone);
        removed += n_gone;
        free(gone);
        gone = NULL;
    }
    /* What comes: DLQ channels first (so a new channel's claims find their DLQ). */
    size_t added = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nc->n_channels; i++) {
            const fx_chan_config *cc = &nc->channels[i];
            if (cc->is_dlq != (pass == 0)) continue;
            pthread_rwlock_rdlock(&d->reg);
            bool have = dm_find_chan_locked(d, cc->name) != NULL;
            pthread_rwlock_unlock(&d->reg);
            if (have) continue;
            fx_err e = chan_add(d, cc);
            if (e)
                FX_ERR("reload: channel %s: %s (%s)", cc->name, fx_strerror(e), fx_err_detail());
            added++;
        }
    }
    fx_config_share(nc);
    pthread_mutex_lock(&d->cfg_mu);
    fx_config *old = d->cfg;
    d->cfg = nc;
    pthread_mutex_unlock(&d->cfg_mu);
    fx_config_unref(old); /* freed here unless a reader still holds it */
    pthread_rwlock_rdlock(&d->reg);
    size_t active = d->n_chans;
    pthread_rwlock_unlock(&d->reg);
    FX_INF("reload: %zu channel(s) stopped, %zu started, %zu active", removed, added, active);
}

/* ---- drain ------------------------------------------------------------------------------------- */

static void drain(fx_daemon *d)
{
    if (d->own->drained) return;
    d->own->drained = true;
    atomic_store(&d->stopping, true);
    int64_t t0 = fx_now_ms();
    FX_INF("draining: stopping capture, releasing claims, flushing batches");
    /* 1. no new claims */
    set_flag(d, &d->stop_interest);
    if (d->own->interest_started) {
        pthread_join(d->own->interest_thr, NULL);
        d->own->interest_started = false;
    }
    /* Only this thread changes the channel list from here on. */
    dm_chan **chans = d->chans;
    size_t n = d->n_chans;
    for (size_t i = 0; i < n; i++) atomic_store(&chans[i]->draining, true);
    /* 2. capture: pending messages still reach the producer queues */
    for (size_t i = 0; i < n; i++) dm_chan_drain_capture_begin(chans[i]);
    int64_t cap_deadline = fx_now_ms() + 5000; /* one budget for every capture subscription */
    for (size_t i = 0; i < n; i++) dm_chan_drain_capture_wait(chans[i], cap_deadline);
    dm_delayq_stop(d); /* delayed publishes answered; the mover queues nothing more */
    dm_redrive_stop(d); /* a running redrive NAKs what it holds back while the DLQ claim lives */
    for (size_t i = 0; i < d->own->n_admin_subs; i++) natsSubscription_Unsubscribe(d->own->admin_subs[i]);
    fx_jsapi_unsubscribe(d->own->jsapi);
    /* 3. claims: every channel in parallel (acks still routed while they linger) */
    for (size_t i = 0; i < n; i++) dm_claims_request_stop(d, chans[i], STOP_DRAIN);
    for (size_t i = 0; i < n; i++) dm_claims_stop_all(d, chans[i], STOP_DRAIN);
    /* 4. producers: store what is queued and answer every publish */
    for (size_t i = 0; i < n; i++) dm_chan_stop_producer_begin(chans[i]);
    for (size_t i = 0; i < n; i++) dm_chan_stop_producer_wait(chans[i]);
    /* 5. replies out */
    if (d->own->ack_sub) natsSubscription_Unsubscribe(d->own->ack_sub);
    if (d->own->js_ack_sub) natsSubscription_Unsubscribe(d->own->js_ack_sub);
    if (d->own->nr_sub) natsSubscription_Unsubscribe(d->own->nr_sub);
    if (d->nc && dm_nats_connected(d)) natsConnection_FlushTimeout(d->nc, 2000);
    if (d->leaf && fx_leaf_connected(d->leaf)) fx_leaf_flush(d->leaf, 2000);
    /* 6. house-keeping and admin */
    set_flag(d, &d->own->stop_late);
    if (d->own->hk_started) {
        pthread_join(d->own->hk_thr, NULL);
        d->own->hk_started = false;
    }
    if (d->own->admin_started) {
        pthread_join(d->own->admin_thr, NULL);
        d->own->admin_started = false;
    }
    fx_jsapi_stop(d->own->jsapi);
    /* 7. the keeper (queued consumer closes run to their end), endpoints and backends */
    fx_chanq_keeper_free(d->keeper);
    d->keeper = NULL;
    if (d->mq) {
        fx_err e = fx_mq_client_close(d->mq);
        if (e) FX_WRN("mq: close: %s (%s)", fx_strerror(e), fx_err_detail());
    }
    fx_http_stop(d->own->http);
    d->own->http = NULL;
    fx_leaf_stop(d->leaf);
    if (d->nc) natsConnection_Close(d->nc);
    FX_INF("drained in %" PRId64 " ms", fx_now_ms() - t0);
}

/* ---- control thread ---------------------------------------------------------------------------- */

static void *ctl_main(void *arg)
{
    fx_thread_name("fx-ctl");
    fx_daemon *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->own->ctl_reload && !d->own->ctl_stop) pthread_cond_wait(&d->cv, &d->mu);
        bool stop = d->own->ctl_stop, rl = d->own->ctl_reload;
        d->own->ctl_reload = false;
        pthread_mutex_unlock(&d->mu);
        if (stop) break;
        if (rl) {
            FX_INF("reload: reading %s", d->own->cfg_path);
            reload(d);
        }
    }
    drain(d);
    atomic_store(&d->own->exit_code, atomic_load(&d->own->fatal) ? 1 : 0);
    uint64_t one = 1;
    ssize_t w = write(d->own->done_fd, &one, sizeof one);
    (void)w;
    return NULL;
}

/* ---- public --------------------------------------------------------------------------------- */

fx_err fx_daemon_new(fx_config *cfg, const char *cfg_path, fx_daemon **out)
{
    *out = NULL;
    fx_daemon *d = calloc(1, sizeof *d);
    if (!d) return fx_seterr(FX_ENOMEM, "daemon: out of memory");
    d->own = calloc(1, sizeof *d->own);
    if (!d->own) {
        free(d);
        return fx_seterr(FX_ENOMEM, "daemon: out of memory");
    }
    d->cfg = calloc(1, sizeof *d->cfg);
    d->own->cfg_path = strdup(cfg_path ? cfg_path : "");
    d->own->done_fd = eventfd(0, EFD_CLOEXEC);
    if (!d->cfg || !d->own->cfg_path || d->own->done_fd < 0) {
        if (d->own->done_fd >= 0) close(d->own->done_fd);
        free(d->cfg);
        free(d->own->cfg_path);
        free(d->own);
        free(d);
        return fx_seterr(FX_ENOMEM, "daemon: out of resources");
    }
    *d->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    fx_config_share(d->cfg);
    d->cfg_start = fx_config_ref(d->cfg);
    d->nats_connect_aux = nats_connect_aux;
    snprintf(d->name, sizeof d->name, "%s", d->cfg->name ? d->cfg->name : "fluxon");
    pthread_mutex_init(&d->cfg_mu, NULL);
    pthread_mutex_init(&d->mu, NULL);
    fx_cond_init_monotonic(&d->cv);
    pthread_mutex_init(&d->own->health_mu, NULL);
    pthread_rwlock_init(&d->reg, NULL);
    pthread_mutex_init(&d->sched.mu, NULL);
    fx_cond_init_monotonic(&d->sched.fin_cv);
    snprintf(d->own->etcd_err, sizeof d->own->etcd_err, "not probed yet");
    atomic_init(&d->max_payload, 0);
    *out = d;
    return FX_OK;
}

fx_err fx_daemon_check(fx_daemon *d)
{
    fx_mq_client_opts mo;
    mq_options(d->cfg, &mo);
    fx_mq_client *mq = NULL;
    fx_err e = fx_mq_client_new(&mo, &mq);
    fx_mq_client_free(mq);
    if (e) return e;
    natsOptions *no = NULL;
    e = nats_options(d, "fluxon-bridge-check", &no);
    natsOptions_Destroy(no);
    if (e) return e;
    if (d->cfg->nats.leaf_url) {
        fx_leaf_opts lo = {.url = d->cfg->nats.leaf_url, .name = "fluxon-bridge-check"};
        fx_leaf *l = NULL;
        e = fx_leaf_new(&lo, &l);
        fx_leaf_free(l);
        if (e) return e;
    }
    return FX_OK;
}

fx_err fx_daemon_start(fx_daemon *d)
{
    fx_err e;
    d->own->start_ms = fx_now_ms();
    if (getrandom(d->origin_key, sizeof d->origin_key, 0) != (ssize_t)sizeof d->origin_key)
        return fx_seterr(FX_EINVAL, "getrandom: cannot draw the Fluxon-Origin key");
    d->metrics = fx_metrics_new(8192);
    if (!d->metrics) return fx_seterr(FX_ENOMEM, "metrics: out of memory");
    metrics_setup(d);
    if ((e = mq_setup(d))) return e;
    if ((e = chans_preflight(d, d->cfg))) return e;
    if ((e = nats_setup(d))) return e;
    if ((e = fx_jsapi_check(d))) return e; /* a real JetStream on our prefix: refuse (exit 2) */
    if (d->cfg->http.listen && *d->cfg->http.listen) {
        if ((e = fx_http_start(d->cfg->http.listen, health_cb, d, d->metrics, &d->own->http)))
            return e;
    }
    if ((e = dm_delayq_start(d))) return e; /* before capture: delayed publishes go there */
    for (size_t i = 0; i < d->cfg->n_channels; i++)
        if ((e = chan_add(d, &d->cfg->channels[i]))) return e;

    char subj[300];
    natsStatus s;
    snprintf(subj, sizeof subj, FX_DM_ACK_PREFIX "FLUXON.%s.>", d->name);
    if ((s = natsConnection_Subscribe(&d->own->ack_sub, d->nc, subj, dm_on_ack, d)) != NATS_OK)
        return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", subj, natsStatus_GetText(s));
    natsSubscription_SetPendingLimits(d->own->ack_sub, FX_DM_SUB_PENDING_MSGS, FX_DM_SUB_PENDING_BYTES);
    /* Acks sent to the JetStream form of the subject are accepted too (same layout). */
    snprintf(subj, sizeof subj, FX_JSACK_PREFIX "%s.>", d->name);
    if ((s = natsConnection_Subscribe(&d->own->js_ack_sub, d->nc, subj, dm_on_ack, d)) != NATS_OK)
        return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", subj, natsStatus_GetText(s));
    natsSubscription_SetPendingLimits(d->own->js_ack_sub, FX_DM_SUB_PENDING_MSGS, FX_DM_SUB_PENDING_BYTES);
    snprintf(subj, sizeof subj, FX_DM_NR_PREFIX "%s.>", d->name);
    if ((s = natsConnection_Subscribe(&d->own->nr_sub, d->nc, subj, dm_on_nr, d)) != NATS_OK)
        return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", subj, natsStatus_GetText(s));
    natsSubscription_SetPendingLimits(d->own->nr_sub, FX_DM_SUB_PENDING_MSGS, FX_DM_SUB_PENDING_BYTES);
    const char *admin_q[] = {API_PREFIX "INFO", API_PREFIX "CHANNEL.LIST", API_PREFIX "CHANNEL.INFO.*"};
    for (size_t i = 0; i < 3; i++) {
        if ((s = natsConnection_QueueSubscribe(&d->own->admin_subs[d->own->n_admin_subs], d->nc, admin_q[i],
                                               "fluxon-admin", on_admin, d)) != NATS_OK)
            return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", admin_q[i], natsStatus_GetText(s));
        d->own->n_admin_subs++;
    }
    /* dead letters back to their channel (redrive.h): a thread of its own, not the admin queue */
    if ((s = natsConnection_QueueSubscribe(&d->own->admin_subs[d->own->n_admin_subs], d->nc,
                                           API_PREFIX "CHANNEL.REDRIVE.*", "fluxon-admin",
                                           dm_on_redrive, d)) != NATS_OK)
        return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", API_PREFIX "CHANNEL.REDRIVE.*",
                         natsStatus_GetText(s));
    d->own->n_admin_subs++;
    snprintf(subj, sizeof subj, API_PREFIX "INFO.%s", d->name);
    if ((s = natsConnection_Subscribe(&d->own->admin_subs[d->own->n_admin_subs], d->nc, subj, on_admin, d)) !=
        NATS_OK)
        return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", subj, natsStatus_GetText(s));
    d->own->n_admin_subs++;
    if ((e = fx_jsapi_start(d, &d->own->jsapi))) return e;

    if (pthread_create(&d->own->hk_thr, NULL, hk_main, d) != 0)
        return fx_seterr(FX_ENOMEM, "cannot start the house-keeping thread");
    d->own->hk_started = true;
    if (pthread_create(&d->own->admin_thr, NULL, admin_main, d) != 0)
        return fx_seterr(FX_ENOMEM, "cannot start the admin thread");
    d->own->admin_started = true;
    if (pthread_create(&d->own->interest_thr, NULL, dm_interest_main, d) != 0)
        return fx_seterr(FX_ENOMEM, "cannot start the interest thread");
    d->own->interest_started = true;
    if (pthread_create(&d->own->ctl_thr, NULL, ctl_main, d) != 0)
        return fx_seterr(FX_ENOMEM, "cannot start the control thread");
    d->own->ctl_started = true;
    FX_INF("fluxon-bridge %s started: name %s, %zu channel(s)", FX_BRIDGE_VERSION, d->name,
           d->cfg->n_channels);
    return FX_OK;
}

void fx_daemon_request_reload(fx_daemon *d) { set_flag(d, &d->own->ctl_reload); }

void fx_daemon_request_stop(fx_daemon *d) { set_flag(d, &d->own->ctl_stop); }

int fx_daemon_done_fd(const fx_daemon *d) { return d->own->done_fd; }

int fx_daemon_exit_code(const fx_daemon *d) { return atomic_load(&d->own->exit_code); }

void fx_daemon_free(fx_daemon *d)
{
    if (!d) return;
    if (d->own->ctl_started) {
        set_flag(d, &d->own->ctl_stop);
        pthread_join(d->own->ctl_thr, NULL);
        d->own->ctl_started = false;
    } else if (d->metrics) { /* fx_daemon_start ran (maybe in part); not after a check alone */
        drain(d);
    }
    /* Each channel goes with its last reference (a capture subscription that has not completed
     * yet frees it from its completion callback, before nats_CloseAndWait returns). */
    for (size_t i = 0; i < d->n_chans; i++) dm_chan_unref(d->chans[i]);
    free(d->chans);
    dm_delayq_free(d);
    if (d->own->ack_sub) natsSubscription_Destroy(d->own->ack_sub);
    if (d->own->js_ack_sub) natsSubscription_Destroy(d->own->js_ack_sub);
    if (d->own->nr_sub) natsSubscription_Destroy(d->own->nr_sub);
    for (size_t i = 0; i < d->own->n_admin_subs; i++) natsSubscription_Destroy(d->own->admin_subs[i]);
    fx_jsapi_free(d->own->jsapi);
    d->own->jsapi = NULL;
    dm_admin_req *r = d->own->aq_head;
    while (r) {
        dm_admin_req *nx = r->next;
        free(r->subject);
        free(r->reply);
        free(r);
        r = nx;
    }
    fx_leaf_free(d->leaf);
    d->leaf = NULL;
    if (d->nc) natsConnection_Destroy(d->nc);
    if (d->own->opts) natsOptions_Destroy(d->own->opts);
    fx_chanq_keeper_free(d->keeper);
    d->keeper = NULL;
    fx_mq_client_free(d->mq);
    fx_metrics_free(d->metrics);
    fx_config_unref(d->cfg);
    fx_config_unref(d->cfg_start);
    if (d->exec && dm_claims_sched_stop(d)) fx_exec_free(d->exec); /* after the keeper and mq */
    d->exec = NULL;
    if (d->own->nats_opened) {
        /* cnats' own threads (delivery pool, flusher, reconnect) end here; one still running
         * after the wait may hold a message it had not delivered (a sanitizer build reports it
         * as a leak at exit), so say so. */
        natsStatus ns = nats_CloseAndWait(2000);
        if (ns != NATS_OK)
            FX_WRN("nats library did not stop within 2 s: %s", natsStatus_GetText(ns));
    }
    close(d->own->done_fd);
    pthread_mutex_destroy(&d->cfg_mu);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->own->health_mu);
    pthread_rwlock_destroy(&d->reg);
    pthread_mutex_destroy(&d->sched.mu);
    pthread_cond_destroy(&d->sched.fin_cv);
    free(d->own->cfg_path);
    free(d->own);
    free(d);
}
