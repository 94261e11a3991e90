/* etcd_watch.c -- the resilient etcd watch (contract in etcd.h, shared internals in etcd_int.h).
 *
 * Ownership and threads: fx_watch_start creates the fx_watch and its thread (watch_main), which
 * alone owns the curl multi handle, the current stream and every field under "watch-thread
 * state"; the callback runs on that thread. fx_watch_start waits for the first session under
 * mu/cv (the start handshake); fx_watch_stop sets `stop`, wakes the thread, joins it and frees
 * the watch. The client (fx_etcd) is borrowed: it must outlive the watch.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_int.h"
#include "etcd_json.h"
#include "fx_log.h"
#include "fx_time.h"

/* Watch reconnect backoff bounds and the log rate limit. */
#define WATCH_BACKOFF_MIN_MS 50
#define WATCH_BACKOFF_MAX_MS 2000
#define WATCH_HEALTHY_MS 1000 /* a stream that lived this long resets the backoff */
#define WATCH_LOG_EVERY_MS 5000

/* ==== watch =========================================================================================
 *
 * The watch thread owns a curl multi handle with at most one stream (easy handle) in it. It loops:
 *   session: open a stream (create_request from last_rev+1, or from "now" when a snapshot is
 *            needed), wait for `created`, take the snapshot if needed, pump events until the
 *            stream fails or stop is requested;
 *   backoff: 50 ms doubling to 2 s between failed sessions (reset by a stream that lived 1 s),
 *            interruptible by fx_watch_stop().
 * Only the initial session reports to fx_watch_start(); a failure there ends the watch.
 */

enum { START_PENDING = 0, START_OK = 1, START_FAILED = -1 };

struct fx_watch {
    fx_etcd *c;
    uint8_t *key, *end;
    size_t key_len, end_len;
    bool prev_kv;
    fx_watch_fn fn;
    void *arg;
    char desc[64]; /* printable form of the key, for logs */

    pthread_t thr;
    bool thr_started;
    CURLM *multi;
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* start handshake and backoff waits; CLOCK_MONOTONIC */
    int start_state;
    fx_err start_err;
    char start_detail[512];
    int64_t start_deadline;

    /* watch-thread state */
    int64_t last_rev;   /* every update up to this revision has been delivered */
    bool need_snapshot;
    bool started;       /* fx_watch_start() has been answered */
    size_t ep;
    CURL *easy;         /* the current stream */
    struct curl_slist *hdrs;
    char *body;
    char errbuf[CURL_ERROR_SIZE];
    rbuf buf;           /* stream bytes not yet split into lines */
    size_t scanned;     /* buf[0..scanned) holds no '\n' */

    struct {
        _Atomic uint64_t streams, reconnects, snapshots, compactions, events;
        _Atomic int64_t last_revision;
    } st;
    fx_log_slot log_slot;
};

static bool watch_stopping(fx_watch *w) { return atomic_load(&w->stop); }

static void stream_close(fx_watch *w)
{
    if (w->easy) {
        /* Removing an unfinished transfer closes its connection: etcd frees the watcher. */
        curl_multi_remove_handle(w->multi, w->easy);
        curl_easy_cleanup(w->easy);
        w->easy = NULL;
    }
    curl_slist_free_all(w->hdrs);
    w->hdrs = NULL;
    free(w->body);
    w->body = NULL;
    w->buf.len = 0;
    w->buf.overflow = false;
    w->scanned = 0;
}

static fx_err stream_open(fx_watch *w, int64_t start_rev, int64_t deadline, uint64_t *auth_gen)
{
    fx_etcd *c = w->c;
    fx_ej_watch_create wc = {.key = {w->key, w->key_len},
                             .range_end = {w->end, w->end_len},
                             .start_revision = start_rev,
                             .prev_kv = w->prev_kv};
    fx_err e = fx_ej_watch_create_req(&wc, &w->body);
    if (e != FX_OK) return e;
    char *auth = NULL;
    e = fx__etcd_auth_header(c, NULL, deadline, &auth, auth_gen);
    if (e != FX_OK) return e;
    const char *lines[] = {"Content-Type: application/json", "Expect:", auth};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i]) continue;
        struct curl_slist *t = curl_slist_append(w->hdrs, lines[i]);
        if (!t) {
            free(auth);
            return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
        }
        w->hdrs = t;
    }
    free(auth);
    w->easy = curl_easy_init();
    if (!w->easy) return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
    char url[MAX_ENDPOINT_LEN + 16];
    snprintf(url, sizeof url, "%s/v3/watch", c->eps[w->ep % c->n_eps]);
    CURL *h = w->easy;
    w->errbuf[0] = '\0';
    fx__etcd_set_common_opts(c, h, w->errbuf);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, w->hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, w->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(w->body));
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    int64_t left = fx_ms_left(deadline);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(left > 0 && left < c->connect_timeout_ms ? left : c->connect_timeout_ms));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fx__etcd_rbuf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &w->buf);
    if (curl_multi_add_handle(w->multi, h) != CURLM_OK)
        return fx_seterr(FX_ENOMEM, "etcd watch: curl_multi_add_handle failed");
    atomic_fetch_add(&w->st.streams, 1);
    atomic_fetch_add(&c->st.requests, 1);
    return FX_OK;
}

static void deliver(fx_watch *w, const fx_watch_update *u)
{
    w->fn(w->arg, u);
    if (u->revision > w->last_rev) w->last_rev = u->revision;
    atomic_store(&w->st.last_revision, w->last_rev);
}

/* Range the watched keys at the latest revision R and deliver them; events up to R are then
 * skipped (they are in the snapshot). */
static fx_err take_snapshot(fx_watch *w, int64_t deadline)
{
    int left = (int)fx_ms_left(deadline);
    if (left <= 0) return fx_seterr(FX_ETIMEDOUT, "etcd watch: no time left for the snapshot");
    fx_range_req req = {.key = {w->key, w->key_len}, .range_end = {w->end, w->end_len}};
    fx_range_resp r;
    fx_err e = fx_etcd_range(w->c, &req, &r, left);
    if (e != FX_OK) return e;
    /* Revisions never go backwards, even across a compaction resync. */
    fx_watch_update u = {.kind = FX_WATCH_SNAPSHOT,
                         .revision = r.revision > w->last_rev ? r.revision : w->last_rev,
                         .kvs = r.kvs,
                         .n_kvs = r.n_kvs};
    deliver(w, &u);
    fx_range_resp_free(&r);
    w->need_snapshot = false;
    atomic_fetch_add(&w->st.snapshots, 1);
    return FX_OK;
}

/* Deliver the events newer than last_rev (moved to the front of the array, so the line still
 * owns and frees all of them). */
static void deliver_events(fx_watch *w, fx_ej_watch_line *l)
{
    size_t n = 0;
    int64_t top = w->last_rev;
    for (size_t i = 0; i < l->n_events; i++) {
        if (l->events[i].kv.mod_revision <= w->last_rev) continue;
        if (i != n) {
            fx_event t = l->events[n];
            l->events[n] = l->events[i];
            l->events[i] = t;
        }
        if (l->events[n].kv.mod_revision > top) top = l->events[n].kv.mod_revision;
        n++;
    }
    if (n == 0) return;
    fx_watch_update u = {.kind = FX_WATCH_EVENTS, .revision = top, .events = l->events,
                         .n_events = n};
    deliver(w, &u);
    atomic_fetch_add(&w->st.events, n);
}

static void start_report(fx_watch *w, fx_err e)
{
    pthread_mutex_lock(&w->mu);
    w->start_state = e == FX_OK ? START_OK : START_FAILED;
    w->start_err = e;
    if (e != FX_OK) snprintf(w->start_detail, sizeof w->start_detail, "%s", fx_err_detail());
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    w->started = true;
}

/* Handle one complete line. Returns FX_OK to go on, or why the session ends
 * (FX_ECOMPACTED: resync with a snapshot). *created tracks the create ack. */
static fx_err handle_line(fx_watch *w, const char *line, size_t len, bool *created,
                          int64_t deadline)
{
    fx_ej_watch_line l;
    fx_err e = fx_ej_parse_watch_line(line, len, &l);
    if (e != FX_OK) return fx_err_wrap(e, "etcd watch: bad stream line: ");
    switch (l.kind) {
    case FX_WL_CREATED:
        *created = true;
        if (w->need_snapshot) e = take_snapshot(w, w->started ? fx_now_ms() + w->c->default_timeout_ms
                                                              : deadline);
        if (e == FX_OK && !w->started) start_report(w, FX_OK);
        break;
    case FX_WL_CANCELED:
        if (l.compact_revision > 0) {
            atomic_fetch_add(&w->st.compactions, 1);
            w->need_snapshot = true;
            e = fx_seterr(FX_ECOMPACTED, "etcd watch: revision %" PRId64 " compacted (at %" PRId64
                          ")", w->last_rev + 1, l.compact_revision);
        } else {
            e = fx_seterr(l.err, "etcd watch canceled by the server: %s", l.reason);
        }
        break;
    case FX_WL_EVENTS:
        if (!*created) {
            e = fx_seterr(FX_EPROTO, "etcd watch: events before created");
            break;
        }
        deliver_events(w, &l);
        break;
    case FX_WL_PROGRESS:
        /* A progress notification: every event up to header.revision has been sent. */
        if (*created && !w->need_snapshot && l.revision > w->last_rev) {
            w->last_rev = l.revision;
            atomic_store(&w->st.last_revision, w->last_rev);
        }
        break;
    case FX_WL_ERROR:
        e = fx_seterr(l.err, "etcd watch stream error (code %d): %s", l.grpc_code, l.reason);
        break;
    }
    fx_ej_watch_line_free(&l);
    return e;
}

/* Split buffered bytes into lines and handle them. */
static fx_err drain_lines(fx_watch *w, bool *created, int64_t deadline)
{
    size_t off = 0;
    fx_err e = FX_OK;
    while (e == FX_OK && !watch_stopping(w)) {
        size_t from = off > w->scanned ? off : w->scanned;
        char *nl = from < w->buf.len ? memchr(w->buf.data + from, '\n', w->buf.len - from) : NULL;
        if (!nl) {
            w->scanned = w->buf.len;
            break;
        }
        size_t end = (size_t)(nl - w->buf.data);
        if (end > off) e = handle_line(w, w->buf.data + off, end - off, created, deadline);
        off = end + 1;
    }
    if (off > 0) { /* keep only the partial line; off <= len, and cap > len */
        size_t rest = w->buf.len - off;
        memmove(w->buf.data, w->buf.data + off, rest);
        w->buf.len = rest;
        w->buf.data[rest] = '\0';
        w->scanned = w->scanned > off ? w->scanned - off : 0;
    }
    return e;
}

/* One stream from open to failure. Returns FX_ECANCELED when stopping, FX_ECOMPACTED for a
 * resync, else the failure. *lived_ms: how long the stream was up after `created`. */
static fx_err watch_session(fx_watch *w, int64_t *lived_ms)
{
    fx_etcd *c = w->c;
    int64_t start_rev = w->need_snapshot ? 0 : w->last_rev + 1;
    int64_t deadline = w->started ? fx_now_ms() + c->default_timeout_ms : w->start_deadline;
    int64_t created_at = 0;
    bool created = false;
    uint64_t auth_gen = 0;
    *lived_ms = 0;

    fx_err e = stream_open(w, start_rev, deadline, &auth_gen);
    while (e == FX_OK) {
        if (watch_stopping(w)) {
            e = FX_ECANCELED;
            break;
        }
        int running = 0;
        curl_multi_perform(w->multi, &running);
        long status = 0;
        curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200) {
            bool was_created = created;
            e = drain_lines(w, &created, deadline);
            if (created && !was_created) created_at = fx_now_ms();
            if (e != FX_OK) break;
        }
        int left_msgs = 0;
        CURLMsg *m;
        while ((m = curl_multi_info_read(w->multi, &left_msgs)) != NULL) {
            if (m->msg != CURLMSG_DONE || m->easy_handle != w->easy) continue;
            CURLcode rc = m->data.result;
            if (w->buf.overflow) {
                e = fx_seterr(FX_EPROTO, "etcd watch: stream line over %zu bytes", w->buf.limit);
            } else if (rc != CURLE_OK) {
                e = fx_seterr(rc == CURLE_OPERATION_TIMEDOUT ? FX_ETIMEDOUT : FX_EUNAVAIL,
                              "etcd watch %s: %s", c->eps[w->ep % c->n_eps],
                              w->errbuf[0] ? w->errbuf : curl_easy_strerror(rc));
            } else if (status != 200) {
                fx_ej_error er;
                e = fx_ej_parse_error((int)status, w->buf.data, w->buf.len, &er);
                fx_seterr(e, "etcd watch %s: HTTP %ld (code %d): %s", c->eps[w->ep % c->n_eps],
                          status, er.grpc_code, er.message);
            } else {
                e = fx_seterr(FX_EUNAVAIL, "etcd watch %s: stream closed by the server",
                              c->eps[w->ep % c->n_eps]);
            }
        }
        if (e != FX_OK) break;
        int timeout = 1000;
        if (!created) {
            int64_t left = fx_ms_left(deadline);
            if (left <= 0) {
                e = fx_seterr(FX_ETIMEDOUT, "etcd watch %s: stream not created in time",
                              c->eps[w->ep % c->n_eps]);
                break;
            }
            if (left < timeout) timeout = (int)left;
        }
        curl_multi_poll(w->multi, NULL, 0, timeout, NULL);
    }
    if (created) *lived_ms = fx_now_ms() - created_at;
    /* A token refused on the stream (401, or a cancel_reason saying Unauthenticated) must not be
     * reused by the next attempt. */
    if (e == FX_EAUTH && c->username) fx__etcd_auth_invalidate(c, auth_gen);
    if (watch_stopping(w)) e = FX_ECANCELED;
    stream_close(w);
    return e;
}

/* Sleep ms unless stopped; false when stopped. */
static bool watch_sleep(fx_watch *w, int64_t ms)
{
    int64_t until = fx_now_ms() + ms;
    struct timespec ts = fx_deadline_ts(until);
    pthread_mutex_lock(&w->mu);
    while (!watch_stopping(w) && fx_now_ms() < until)
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    pthread_mutex_unlock(&w->mu);
    return !watch_stopping(w);
}

static void *watch_main(void *arg)
{
    fx_thread_name("fx-watch");
    fx_watch *w = arg;
    int64_t backoff = 0;
    while (!watch_stopping(w)) {
        int64_t lived = 0;
        fx_err e = watch_session(w, &lived);
        if (e == FX_ECANCELED && watch_stopping(w)) break;
        if (!w->started && e != FX_ECOMPACTED) {
            start_report(w, e);
            break;
        }
        if (e == FX_ECOMPACTED) {
            /* Not a failure: resync right away with a snapshot. */
            fx_log_ratelimited(&w->log_slot, WATCH_LOG_EVERY_MS, FX_LOG_WRN,
                               "watch %s: %s; resyncing with a snapshot", w->desc, fx_err_detail());
            continue;
        }
        atomic_fetch_add(&w->st.reconnects, 1);
        if (lived >= WATCH_HEALTHY_MS || backoff == 0)
            backoff = WATCH_BACKOFF_MIN_MS;
        else
            backoff = backoff * 2 > WATCH_BACKOFF_MAX_MS ? WATCH_BACKOFF_MAX_MS : backoff * 2;
        w->ep = (w->ep + 1) % w->c->n_eps; /* try the next endpoint (a no-op with one) */
        fx_log_ratelimited(&w->log_slot, WATCH_LOG_EVERY_MS, FX_LOG_WRN,
                           "watch %s: %s (%s); reconnecting from revision %" PRId64
                           " in %" PRId64 " ms", w->desc, fx_err_detail(), fx_errname(e),
                           w->last_rev + 1, backoff);
        if (!watch_sleep(w, backoff)) break;
    }
    return NULL;
}

static void watch_free(fx_watch *w)
{
    stream_close(w);
    if (w->multi) curl_multi_cleanup(w->multi);
    free(w->buf.data);
    free(w->key);
    free(w->end);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* "prefix/..." with non-printable bytes as '?', truncated, for log lines. */
static void describe_key(fx_slice k, bool range, char *out, size_t size)
{
    size_t o = 0, max = size - 5; /* room for "...*" and NUL */
    const uint8_t *p = k.data;
    for (size_t i = 0; i < k.len && o < max; i++)
        out[o++] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    if (o < k.len) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    if (range) out[o++] = '*';
    out[o] = '\0';
}

static uint8_t *dup_bytes(fx_slice s)
{
    uint8_t *p = malloc(s.len ? s.len : 1);
    if (p && s.len) memcpy(p, s.data, s.len);
    return p;
}

fx_err fx_watch_start(fx_etcd *c, const fx_watch_opts *o, int timeout_ms, fx_watch **out)
{
    *out = NULL;
    if (!c || !o || !o->fn || o->key.len == 0 || !o->key.data || (o->range_end.len && !o->range_end.data))
        return fx_seterr(FX_EINVAL, "etcd watch: key and callback are required");
    if (o->start_revision < 0) return fx_seterr(FX_EINVAL, "etcd watch: negative start revision");
    fx_watch *w = calloc(1, sizeof *w);
    if (!w) return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
    pthread_mutex_init(&w->mu, NULL);
    fx_cond_init_monotonic(&w->cv);
    w->c = c;
    w->fn = o->fn;
    w->arg = o->arg;
    w->prev_kv = o->prev_kv;
    w->key = dup_bytes(o->key);
    w->key_len = o->key.len;
    w->end = dup_bytes(o->range_end);
    w->end_len = o->range_end.len;
    w->buf.limit = FX_EJ_MAX_BODY;
    describe_key(o->key, o->range_end.len > 0, w->desc, sizeof w->desc);
    w->ep = atomic_load(&c->cur_ep) % c->n_eps;
    w->multi = curl_multi_init();
    if (!w->key || !w->end || !w->multi) {
        watch_free(w);
        return fx_seterr(FX_ENOMEM, "etcd watch: out of memory");
    }
    w->start_deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : c->default_timeout_ms);

    if (o->start_revision > 0) {
        /* Learn up front whether the start revision is compacted, so that the snapshot that
         * replaces it is delivered before we return (the stream would only say so ~100 ms after
         * `created`). Other errors (future revision, etcd down) are left to the stream. */
        fx_range_req probe = {.key = o->key, .range_end = o->range_end,
                              .revision = o->start_revision, .count_only = true};
        fx_range_resp r;
        int left = (int)fx_ms_left(w->start_deadline);
        fx_err e = left > 0 ? fx_etcd_range(c, &probe, &r, left) : FX_ETIMEDOUT;
        if (e == FX_OK) fx_range_resp_free(&r);
        if (e == FX_ECOMPACTED) {
            atomic_fetch_add(&w->st.compactions, 1);
            w->need_snapshot = true;
        } else {
            w->last_rev = o->start_revision - 1;
        }
    } else {
        w->need_snapshot = true;
    }
    atomic_store(&w->st.last_revision, w->last_rev);

    if (pthread_create(&w->thr, NULL, watch_main, w) != 0) {
        watch_free(w);
        return fx_seterr(FX_ENOMEM, "etcd watch: cannot create the thread");
    }
    w->thr_started = true;

    /* The thread bounds its own initial session by start_deadline; the extra second here only
     * guards against a snapshot range that overruns it slightly. */
    struct timespec ts = fx_deadline_ts(w->start_deadline + 1000);
    pthread_mutex_lock(&w->mu);
    while (w->start_state == START_PENDING)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) break;
    int state = w->start_state;
    fx_err err = w->start_err;
    char detail[sizeof w->start_detail];
    memcpy(detail, w->start_detail, sizeof detail);
    pthread_mutex_unlock(&w->mu);

    if (state == START_OK) {
        *out = w;
        return FX_OK;
    }
    fx_watch_stop(w);
    if (state == START_PENDING) return fx_seterr(FX_ETIMEDOUT, "etcd watch: not started in time");
    return fx_seterr(err, "%s", detail);
}

void fx_watch_stop(fx_watch *w)
{
    if (!w) return;
    atomic_store(&w->stop, true);
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    curl_multi_wakeup(w->multi);
    if (w->thr_started) pthread_join(w->thr, NULL);
    watch_free(w);
}

void fx_watch_get_stats(fx_watch *w, fx_watch_stats *out)
{
    out->streams = atomic_load(&w->st.streams);
    out->reconnects = atomic_load(&w->st.reconnects);
    out->snapshots = atomic_load(&w->st.snapshots);
    out->compactions = atomic_load(&w->st.compactions);
    out->events = atomic_load(&w->st.events);
    out->last_revision = atomic_load(&w->st.last_revision);
}
