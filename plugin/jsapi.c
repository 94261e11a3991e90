/* jsapi.c -- the JetStream API subset (contract: jsapi.h). NATS request parsing and JetStream-
 * shaped replies only: the numbers come from bridge/inspect.h (the view fluxonctl and the admin
 * endpoint show), the settings from the current configuration.
 *
 * Integers are written from their exact decimal text (cJSON raw values), never through double.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "daemon_int.h"
#include "fx_time.h"
#include "inspect.h"
#include "jsapi.h"
#include "subject.h"

#define NAMES_LIMIT 1024 /* JSApiNamesLimit */
#define LIST_LIMIT 256   /* JSApiListLimit */
#define REFUSED "channels are configured in the bridge configuration"

typedef struct js_req {
    struct js_req *next;
    char *subject, *reply;
    char *body;
    size_t len;
} js_req;

struct fx_jsapi {
    fx_daemon *d;
    char prefix[160]; /* "$JS.API" or "$JS.<domain>.API" */
    natsSubscription *sub;
    pthread_t thr;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    js_req *head, *tail;
    size_t n;
    bool stop;
    atomic_uint_fast64_t total, errors;
};

const char *fx_jsapi_prefix(const fx_daemon *d, char *out, size_t cap)
{
    const fx_config *c = d->cfg_start;
    if (!c || !c->jetstream.api) return NULL;
    if (c->jetstream.domain)
        snprintf(out, cap, "$JS.%s.API", c->jetstream.domain);
    else
        snprintf(out, cap, "$JS.API");
    return out;
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static bool add_i64(cJSON *o, const char *k, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_AddRawToObject(o, k, buf) != NULL;
}

static bool add_u64(cJSON *o, const char *k, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_AddRawToObject(o, k, buf) != NULL;
}

/* RFC 3339 UTC with nanoseconds (Go's time.Time JSON form); 0 -> Go's zero time. */
static bool add_time(cJSON *o, const char *k, int64_t wall_ns)
{
    if (wall_ns <= 0) return cJSON_AddStringToObject(o, k, "0001-01-01T00:00:00Z") != NULL;
    time_t secs = (time_t)(wall_ns / 1000000000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char buf[64];
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%09" PRId64 "Z", wall_ns % 1000000000);
    return cJSON_AddStringToObject(o, k, buf) != NULL;
}

static cJSON *new_resp(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "type", type)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void reply(fx_jsapi *j, const char *to, const char *body)
{
    fx_daemon *d = j->d;
    natsMsg *m = NULL;
    if (natsMsg_Create(&m, to, NULL, body, (int)strlen(body)) != NATS_OK) return;
    natsMsgHeader_Set(m, FX_JSAPI_HDR_BRIDGE, d->name);
    natsStatus s = natsConnection_PublishMsg(d->nc, m);
    natsMsg_Destroy(m);
    if (s != NATS_OK) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "jsapi: reply: %s", natsStatus_GetText(s));
    }
}

static void reply_json(fx_jsapi *j, const char *to, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (s) reply(j, to, s);
    free(s);
}

/* {"type":type,"error":{"code":code,"err_code":err_code,"description":desc}} */
static void reply_error(fx_jsapi *j, const char *to, const char *type, int code, int err_code,
                        const char *desc)
{
    atomic_fetch_add(&j->errors, 1);
    cJSON *o = new_resp(type);
    cJSON *e = o ? cJSON_AddObjectToObject(o, "error") : NULL;
    if (!e || !cJSON_AddNumberToObject(e, "code", code) ||
        !cJSON_AddNumberToObject(e, "err_code", err_code) ||
        !cJSON_AddStringToObject(e, "description", desc)) {
        cJSON_Delete(o);
        return;
    }
    reply_json(j, to, o);
}

/* An etcd read failed: 503 (unreachable) or 500, JetStream-shaped, with the detail. */
static void reply_read_error(fx_jsapi *j, const char *to, const char *type, fx_err e)
{
    char desc[512];
    const char *det = fx_err_detail();
    snprintf(desc, sizeof desc, "fluxon: reading etcd: %s%s%s%s", fx_strerror(e),
             det && *det ? " (" : "", det && *det ? det : "", det && *det ? ")" : "");
    bool unavail = e == FX_ETIMEDOUT || e == FX_EUNAVAIL || e == FX_ECLOSED || e == FX_ECANCELED;
    reply_error(j, to, type, unavail ? 503 : 500, unavail ? 10008 : 10049, desc);
}

/* ---- requests -------------------------------------------------------------------------------- */

typedef struct js_paged {
    int64_t offset;
    char subject[FX_SUBJECT_MAX + 1]; /* "" = no filter */
} js_paged;

/* Parse an optional paged request body ({"offset":N,"subject":S}); false: error replied. */
static bool parse_paged(fx_jsapi *j, const js_req *r, const char *type, js_paged *out)
{
    memset(out, 0, sizeof *out);
    if (r->len == 0) return true;
    cJSON *o = cJSON_ParseWithLength(r->body, r->len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        reply_error(j, r->reply, type, 400, 10025, "invalid JSON: the request must be an object");
        return false;
    }
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "offset");
    const cJSON *sub = cJSON_GetObjectItemCaseSensitive(o, "subject");
    bool ok = true;
    if (off && !cJSON_IsNull(off)) {
        if (!cJSON_IsNumber(off) || off->valuedouble < 0 || off->valuedouble > 1e9)
            ok = false;
        else
            out->offset = (int64_t)off->valuedouble;
    }
    if (ok && sub && !cJSON_IsNull(sub)) {
        if (!cJSON_IsString(sub) || strlen(sub->valuestring) > FX_SUBJECT_MAX ||
            (sub->valuestring[0] && !fx_subject_valid(sub->valuestring, true)))
            ok = false;
        else
            snprintf(out->subject, sizeof out->subject, "%s", sub->valuestring);
    }
    cJSON_Delete(o);
    if (!ok) reply_error(j, r->reply, type, 400, 10025, "invalid JSON: bad offset or subject");
    return ok;
}

static bool chan_matches(const fx_chan_config *cc, const char *filter)
{
    if (!filter[0]) return true;
    for (size_t i = 0; i < cc->n_subjects; i++)
        if (fx_subject_overlap(cc->subjects[i], filter)) return true;
    return false;
}

static bool add_paged(cJSON *o, int64_t total, int64_t offset, int64_t limit)
{
    return add_i64(o, "total", total) && add_i64(o, "offset", offset) && add_i64(o, "limit", limit);
}

/* The channels a listing shows, in configuration order (filtered). Returns a malloc'd array of
 * pointers into cfg (NULL with *n 0 when there are none or on OOM). */
static const fx_chan_config **list_channels(const fx_config *cfg, const char *filter, size_t *n)
{
    *n = 0;
    if (!cfg->n_channels) return NULL;
    const fx_chan_config **v = calloc(cfg->n_channels, sizeof *v);
    if (!v) return NULL;
    for (size_t i = 0; i < cfg->n_channels; i++)
        if (cfg->channels[i].name && chan_matches(&cfg->channels[i], filter)) v[(*n)++] = &cfg->channels[i];
    return v;
}

/* The StreamInfo of a channel (config + state) into o. */
static bool stream_info(fx_jsapi *j, const fx_config *cfg, const fx_chan_config *cc,
                        const fx_mq_channel_info *s, cJSON *o)
{
    fx_daemon *d = j->d;
    cJSON *c = cJSON_AddObjectToObject(o, "config");
    if (!c || !cJSON_AddStringToObject(c, "name", cc->name)) return false;
    cJSON *subs = cJSON_AddArrayToObject(c, "subjects");
    if (!subs) return false;
    for (size_t i = 0; i < cc->n_subjects; i++) {
        cJSON *it = cJSON_CreateString(cc->subjects[i]);
        if (!it || !cJSON_AddItemToArray(subs, it)) {
            cJSON_Delete(it);
            return false;
        }
    }
    bool redis = cfg->kv.backend && strcmp(cfg->kv.backend, "redis") == 0;
    int64_t replicas = redis ? 1 : (int64_t)(cfg->etcd.n_endpoints ? cfg->etcd.n_endpoints : 1);
    int64_t capacity = s->has_meta ? s->capacity : cc->s.capacity;
    bool ok = cJSON_AddStringToObject(c, "retention", "workqueue") &&
              add_i64(c, "max_consumers", -1) && add_i64(c, "max_msgs", capacity) &&
              add_i64(c, "max_bytes", -1) && add_i64(c, "max_age", 0) &&
              add_i64(c, "max_msgs_per_subject", -1) &&
              add_i64(c, "max_msg_size", (int64_t)dm_max_msg_bytes(d)) &&
              cJSON_AddStringToObject(c, "discard", "new") &&
              cJSON_AddStringToObject(c, "storage",
                                      redis && !cfg->kv.require_fsync ? "memory" : "file") &&
              add_i64(c, "num_replicas", replicas) &&
              add_i64(c, "duplicate_window", cc->s.duplicate_window_ms * 1000000) &&
              cJSON_AddStringToObject(c, "compression", "none") &&
              cJSON_AddFalseToObject(c, "allow_direct") && cJSON_AddFalseToObject(c, "mirror_direct") &&
              cJSON_AddFalseToObject(c, "sealed") && cJSON_AddTrueToObject(c, "deny_delete") &&
              cJSON_AddTrueToObject(c, "deny_purge") && cJSON_AddFalseToObject(c, "allow_rollup_hdrs") &&
              cJSON_AddObjectToObject(c, "consumer_limits") && add_time(o, "created", 0);
    if (!ok) return false;
    /* State: backlog; first = the next message of a producer with backlog (lowest seq), last =
     * the highest last-written seq. An empty stream has first = last + 1, as JetStream's. */
    uint64_t first = 0, last = 0;
    for (size_t i = 0; i < s->n_subs; i++) {
        const fx_mq_sub_mpsc_info *si = &s->subs[i];
        for (size_t k = 0; k < si->n_producers; k++) {
            const fx_mq_producer_offsets *p = &si->producers[k];
            if (p->produce_offset >= 0) {
                uint64_t l = dm_seq(si->chan_id, p->pidx, p->produce_offset);
                if (l > last) last = l;
            }
            if (p->backlog > 0) {
                uint64_t f = dm_seq(si->chan_id, p->pidx, p->consume_offset);
                if (!first || f < first) first = f;
            }
        }
    }
    if (!first) first = last + 1;
    cJSON *st = cJSON_AddObjectToObject(o, "state");
    return st && add_i64(st, "messages", s->backlog) && add_i64(st, "bytes", 0) &&
           add_u64(st, "first_seq", first) && add_time(st, "first_ts", 0) &&
           add_u64(st, "last_seq", last) && add_time(st, "last_ts", 0) &&
           add_i64(st, "consumer_count", (int64_t)s->n_consumers) &&
           (!cfg->jetstream.domain || cJSON_AddStringToObject(o, "domain", cfg->jetstream.domain)) &&
           add_time(o, "ts", fx_wall_ns());
}

#define T_INFO "io.nats.jetstream.api.v1.account_info_response"
#define T_NAMES "io.nats.jetstream.api.v1.stream_names_response"
#define T_LIST "io.nats.jetstream.api.v1.stream_list_response"
#define T_SINFO "io.nats.jetstream.api.v1.stream_info_response"
#define T_CREATE "io.nats.jetstream.api.v1.stream_create_response"
#define T_UPDATE "io.nats.jetstream.api.v1.stream_update_response"
#define T_DELETE "io.nats.jetstream.api.v1.stream_delete_response"
#define T_PURGE "io.nats.jetstream.api.v1.stream_purge_response"
#define T_SYSTEM "io.nats.jetstream.api.v1.system_response"

static void do_account_info(fx_jsapi *j, const fx_config *cfg, const js_req *r)
{
    int64_t consumers = 0;
    for (size_t i = 0; i < cfg->n_channels; i++) {
        fx_mq_channel_info s;
        fx_err e = fx_mq_inspect_channel(j->d->mq, cfg->channels[i].name, &s);
        if (e) {
            reply_read_error(j, r->reply, T_INFO, e);
            return;
        }
        consumers += (int64_t)s.n_consumers;
        fx_mq_channel_info_free(&s);
    }
    cJSON *o = new_resp(T_INFO);
    cJSON *lim = NULL, *api = NULL;
    bool ok = o && add_i64(o, "memory", 0) && add_i64(o, "storage", 0) &&
              add_i64(o, "reserved_memory", 0) && add_i64(o, "reserved_storage", 0) &&
              add_i64(o, "streams", (int64_t)cfg->n_channels) && add_i64(o, "consumers", consumers) &&
              (lim = cJSON_AddObjectToObject(o, "limits")) && add_i64(lim, "max_memory", -1) &&
              add_i64(lim, "max_storage", -1) && add_i64(lim, "max_streams", -1) &&
              add_i64(lim, "max_consumers", -1) && add_i64(lim, "max_ack_pending", -1) &&
              add_i64(lim, "memory_max_stream_bytes", -1) &&
              add_i64(lim, "storage_max_stream_bytes", -1) &&
              cJSON_AddFalseToObject(lim, "max_bytes_required") &&
              (!cfg->jetstream.domain || cJSON_AddStringToObject(o, "domain", cfg->jetstream.domain)) &&
              (api = cJSON_AddObjectToObject(o, "api")) && add_i64(api, "level", 0) &&
              add_u64(api, "total", atomic_load(&j->total)) &&
              add_u64(api, "errors", atomic_load(&j->errors));
    if (!ok) {
        cJSON_Delete(o);
        return;
    }
    reply_json(j, r->reply, o);
}

static void do_names(fx_jsapi *j, const fx_config *cfg, const js_req *r)
{
    js_paged pg;
    if (!parse_paged(j, r, T_NAMES, &pg)) return;
    size_t n = 0;
    const fx_chan_config **v = list_channels(cfg, pg.subject, &n);
    cJSON *o = new_resp(T_NAMES);
    cJSON *arr = NULL;
    bool ok = o && add_paged(o, (int64_t)n, pg.offset, NAMES_LIMIT) &&
              (arr = cJSON_AddArrayToObject(o, "streams"));
    for (size_t i = (size_t)pg.offset; ok && i < n && i < (size_t)pg.offset + NAMES_LIMIT; i++) {
        cJSON *it = cJSON_CreateString(v[i]->name);
        ok = it && cJSON_AddItemToArray(arr, it);
        if (!ok) cJSON_Delete(it);
    }
    free(v);
    if (!ok) {
        cJSON_Delete(o);
        return;
    }
    reply_json(j, r->reply, o);
}

static void do_list(fx_jsapi *j, const fx_config *cfg, const js_req *r)
{
    js_paged pg;
    if (!parse_paged(j, r, T_LIST, &pg)) return;
    size_t n = 0;
    const fx_chan_config **v = list_channels(cfg, pg.subject, &n);
    cJSON *o = new_resp(T_LIST);
    cJSON *arr = NULL;
    bool ok = o && add_paged(o, (int64_t)n, pg.offset, LIST_LIMIT) &&
              (arr = cJSON_AddArrayToObject(o, "streams"));
    fx_err e = FX_OK;
    for (size_t i = (size_t)pg.offset; ok && !e && i < n && i < (size_t)pg.offset + LIST_LIMIT; i++) {
        fx_mq_channel_info s;
        e = fx_mq_inspect_channel(j->d->mq, v[i]->name, &s);
        if (e) break;
        cJSON *it = cJSON_CreateObject();
        ok = it && cJSON_AddItemToArray(arr, it);
        if (!ok) cJSON_Delete(it);
        ok = ok && stream_info(j, cfg, v[i], &s, it);
        fx_mq_channel_info_free(&s);
    }
    free(v);
    if (e) {
        cJSON_Delete(o);
        reply_read_error(j, r->reply, T_LIST, e);
        return;
    }
    if (!ok) {
        cJSON_Delete(o);
        return;
    }
    reply_json(j, r->reply, o);
}

static void do_stream_info(fx_jsapi *j, const fx_config *cfg, const js_req *r, const char *name)
{
    const fx_chan_config *cc = fx_config_channel(cfg, name);
    if (!cc) {
        reply_error(j, r->reply, T_SINFO, 404, 10059, "stream not found");
        return;
    }
    fx_mq_channel_info s;
    fx_err e = fx_mq_inspect_channel(j->d->mq, cc->name, &s);
    if (e) {
        reply_read_error(j, r->reply, T_SINFO, e);
        return;
    }
    cJSON *o = new_resp(T_SINFO);
    bool ok = o && add_paged(o, 0, 0, 0) && stream_info(j, cfg, cc, &s, o);
    fx_mq_channel_info_free(&s);
    if (!ok) {
        cJSON_Delete(o);
        return;
    }
    reply_json(j, r->reply, o);
}

/* The part of subject after "<prefix>." (NULL when it does not start with it). */
static const char *api_op(const fx_jsapi *j, const char *subject)
{
    size_t pl = strlen(j->prefix);
    if (strncmp(subject, j->prefix, pl) != 0 || subject[pl] != '.') return NULL;
    return subject + pl + 1;
}

/* "<verb>.<one token>" -> the token, or NULL. */
static const char *one_token(const char *op, const char *verb)
{
    size_t vl = strlen(verb);
    if (strncmp(op, verb, vl) != 0 || op[vl] != '.') return NULL;
    const char *t = op + vl + 1;
    return *t && !strchr(t, '.') ? t : NULL;
}

static void answer(fx_jsapi *j, const js_req *r)
{
    const char *op = api_op(j, r->subject);
    if (!op) return;
    atomic_fetch_add(&j->total, 1);
    fx_config *cfg = dm_cfg_get(j->d); /* a reload may replace it meanwhile */
    const char *name;
    static const struct {
        const char *verb, *type;
        int err_code;
        const char *what;
    } refused[] = {
        {"STREAM.CREATE", T_CREATE, 10049, "stream create"},
        {"STREAM.UPDATE", T_UPDATE, 10069, "stream update"},
        {"STREAM.DELETE", T_DELETE, 10050, "stream delete"},
        {"STREAM.PURGE", T_PURGE, 10110, "stream purge"},
    };
    if (strcmp(op, "INFO") == 0) {
        do_account_info(j, cfg, r);
    } else if (strcmp(op, "STREAM.NAMES") == 0) {
        do_names(j, cfg, r);
    } else if (strcmp(op, "STREAM.LIST") == 0) {
        do_list(j, cfg, r);
    } else if ((name = one_token(op, "STREAM.INFO"))) {
        do_stream_info(j, cfg, r, name);
    } else {
        size_t i = 0;
        for (; i < sizeof refused / sizeof refused[0]; i++) {
            if (!one_token(op, refused[i].verb)) continue;
            char desc[256];
            snprintf(desc, sizeof desc, "%s: " REFUSED " (fluxon-bridge: a channel is a stream)",
                     refused[i].what);
            reply_error(j, r->reply, refused[i].type, 500, refused[i].err_code, desc);
            break;
        }
        if (i == sizeof refused / sizeof refused[0])
            reply_error(j, r->reply, T_SYSTEM, 400, 10003,
                        "bad request: not supported by fluxon-bridge's JetStream API");
    }
    fx_config_unref(cfg);
}

/* ---- queue, worker, subscription ------------------------------------------------------------- */

static void req_free(js_req *r)
{
    if (!r) return;
    free(r->subject);
    free(r->reply);
    free(r->body);
    free(r);
}

static void on_request(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_jsapi *j = arg;
    const char *rep = natsMsg_GetReply(m);
    const char *subj = natsMsg_GetSubject(m);
    int len = natsMsg_GetDataLength(m);
    if (!rep || !*rep || !subj || len < 0) { /* no one to answer */
        natsMsg_Destroy(m);
        return;
    }
    if ((size_t)len > FX_JSAPI_MAX_REQ) {
        reply_error(j, rep, T_SYSTEM, 400, 10025, "invalid JSON: request larger than 64 KiB");
        natsMsg_Destroy(m);
        return;
    }
    js_req *r = calloc(1, sizeof *r);
    if (r) {
        r->subject = strdup(subj);
        r->reply = strdup(rep);
        r->len = (size_t)len;
        r->body = malloc(r->len + 1);
        if (r->body) {
            if (len) memcpy(r->body, natsMsg_GetData(m), r->len);
            r->body[r->len] = '\0';
        }
    }
    bool queued = false;
    if (r && r->subject && r->reply && r->body) {
        pthread_mutex_lock(&j->mu);
        if (j->n < FX_JSAPI_QUEUE && !j->stop) {
            if (j->tail)
                j->tail->next = r;
            else
                j->head = r;
            j->tail = r;
            j->n++;
            queued = true;
            pthread_cond_signal(&j->cv);
        }
        pthread_mutex_unlock(&j->mu);
    }
    if (!queued) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 10000, FX_LOG_WRN,
                           "jsapi: %d requests waiting (or out of memory): answering 503",
                           FX_JSAPI_QUEUE);
        reply_error(j, rep, T_SYSTEM, 503, 10167, "too many requests: fluxon-bridge JetStream API busy");
        req_free(r);
    }
    natsMsg_Destroy(m);
}

static void *worker(void *arg)
{
    fx_jsapi *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        while (!j->head && !j->stop) pthread_cond_wait(&j->cv, &j->mu);
        js_req *r = j->stop ? NULL : j->head;
        if (r) {
            j->head = r->next;
            if (!j->head) j->tail = NULL;
            j->n--;
        }
        pthread_mutex_unlock(&j->mu);
        if (!r) break;
        answer(j, r);
        req_free(r);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

fx_err fx_jsapi_check(fx_daemon *d)
{
    char prefix[160], subj[200];
    if (!fx_jsapi_prefix(d, prefix, sizeof prefix)) return FX_OK;
    snprintf(subj, sizeof subj, "%s.INFO", prefix);
    if (!d->nc || !dm_nats_connected(d)) {
        FX_WRN("jsapi: NATS not connected yet: cannot check whether the account already has a "
               "JetStream on %s (answering it anyway)", prefix);
        return FX_OK;
    }
    natsMsg *m = NULL;
    natsStatus s = natsConnection_Request(&m, d->nc, subj, "", 0, FX_JSAPI_PROBE_MS);
    if (s != NATS_OK) { /* no responders, or nobody answered in time */
        FX_INF("jsapi: answering the JetStream API on %s.> (no JetStream there: %s)", prefix,
               natsStatus_GetText(s));
        return FX_OK;
    }
    const char *who = NULL;
    bool bridge = natsMsgHeader_Get(m, FX_JSAPI_HDR_BRIDGE, &who) == NATS_OK;
    natsMsg_Destroy(m);
    if (bridge) {
        FX_INF("jsapi: answering the JetStream API on %s.> (with the other bridges of the account)",
               prefix);
        return FX_OK;
    }
    return fx_seterr(FX_EINVAL,
                     "jetstream: the account already has a JetStream (nats-server answers %s): "
                     "set jetstream.domain to serve channels as streams under $JS.<domain>.API "
                     "(clients then use that domain, e.g. nats --js-domain), or set "
                     "jetstream.api to false",
                     subj);
}

fx_err fx_jsapi_start(fx_daemon *d, fx_jsapi **out)
{
    *out = NULL;
    char prefix[160];
    if (!fx_jsapi_prefix(d, prefix, sizeof prefix)) return FX_OK;
    fx_jsapi *j = calloc(1, sizeof *j);
    if (!j) return fx_seterr(FX_ENOMEM, "jsapi: out of memory");
    j->d = d;
    snprintf(j->prefix, sizeof j->prefix, "%s", prefix);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->total, 0);
    atomic_init(&j->errors, 0);
    *out = j; /* the daemon frees it even when this fails half-way */
    if (pthread_create(&j->thr, NULL, worker, j) != 0)
        return fx_seterr(FX_ENOMEM, "jsapi: cannot start the worker thread");
    j->started = true;
    char subj[200];
    snprintf(subj, sizeof subj, "%s.>", prefix);
    natsStatus s = natsConnection_QueueSubscribe(&j->sub, d->nc, subj, "fluxon-jsapi", on_request, j);
    if (s != NATS_OK)
        return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", subj, natsStatus_GetText(s));
    natsSubscription_SetPendingLimits(j->sub, 4 * FX_JSAPI_QUEUE, 8 * FX_JSAPI_MAX_REQ);
    return FX_OK;
}

void fx_jsapi_unsubscribe(fx_jsapi *j)
{
    if (j && j->sub) natsSubscription_Unsubscribe(j->sub);
}

void fx_jsapi_stop(fx_jsapi *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->stop = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (j->started) {
        pthread_join(j->thr, NULL);
        j->started = false;
    }
}

void fx_jsapi_free(fx_jsapi *j)
{
    if (!j) return;
    fx_jsapi_stop(j);
    if (j->sub) natsSubscription_Destroy(j->sub);
    js_req *r = j->head;
    while (r) {
        js_req *nx = r->next;
        req_free(r);
        r = nx;
    }
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}
