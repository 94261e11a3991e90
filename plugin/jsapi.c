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

#include "capture.h"
#include "claim.h"
#include "dmctx.h"
#include "etcd.h"
#include "fx_time.h"
#include "inspect.h"
#include "jsapi.h"
#include "delayq.h"
#include "pull.h"
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
    natsSubscription *subs[12];
    size_t n_subs;
    pthread_t thr;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    js_req *head, *tail;
    size_t n;
    bool stop;
    /* pull request timers (expiry, heartbeats: dm_pull_timers), own thread, under mu */
    pthread_t tthr;
    bool tstarted, tkick;
    pthread_cond_t tcv; /* monotonic */
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
           (dm_delayq_waiting(d, cc->name) < 0 || /* delayq.h: not in JetStream's state */
            add_i64(st, "fluxon_delayed", dm_delayq_waiting(d, cc->name))) &&
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

/* ---- durable consumers (config in etcd: <root>/js_consumers/<channel>/<name>) ------------------- */

#define T_CCREATE "io.nats.jetstream.api.v1.consumer_create_response"
#define T_CINFO "io.nats.jetstream.api.v1.consumer_info_response"
#define T_CNAMES "io.nats.jetstream.api.v1.consumer_names_response"
#define T_CLIST "io.nats.jetstream.api.v1.consumer_list_response"
#define T_CDELETE "io.nats.jetstream.api.v1.consumer_delete_response"
#define NS_PER_MS 1000000LL
#define MAX_DUR_NS (24LL * 3600 * 1000 * NS_PER_MS) /* any duration setting: at most a day */

static fx_etcd *etcd_of(fx_jsapi *j) { return fx_mq_client_etcd(j->d->mq); }

/* <root>/js_consumers/<channel>/ [+ name] into out; false when it does not fit. */
static bool consumer_key(fx_jsapi *j, const char *chan, const char *name, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s/js_consumers/%s/%s", fx_mq_client_root(j->d->mq), chan,
                     name ? name : "");
    return n > 0 && (size_t)n < cap;
}

/* A durable name: a single subject token (it is also the claim name), at most 64 bytes. */
static bool durable_ok(const char *name)
{
    return name && *name && strlen(name) <= 64 && fx_subject_token_valid(name) && !strpbrk(name, "/\\");
}

/* A JSON number that is an integer in [min, max] (absent: *out untouched, true). */
static bool opt_int(const cJSON *o, const char *k, int64_t min, int64_t max, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v)) return false;
    double x = v->valuedouble;
    if (x < (double)min || x > (double)max || x != (double)(int64_t)x) return false; /* range first */
    *out = (int64_t)x;
    return true;
}

static const char *opt_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Does subject pattern f match every subject that pattern s matches? Token by token: ">" in f
 * covers the rest of s (at least one token); "*" in f covers one token of s but not ">"; a literal
 * covers only the same literal. */
static bool subject_covers(const char *f, const char *s)
{
    for (;;) {
        size_t fl = strcspn(f, "."), sl = strcspn(s, ".");
        if (fl == 1 && f[0] == '>') return sl > 0;
        if (sl == 1 && s[0] == '>') return false;
        if (!(fl == 1 && f[0] == '*') && (fl != sl || memcmp(f, s, fl) != 0)) return false;
        f += fl;
        s += sl;
        if (!*f || !*s) return !*f && !*s;
        f++;
        s++;
    }
}

/* A consumer's filter_subject / filter_subjects: none, or filters that together cover each
 * subject of the channel (equal to them, or wider), which means every message of the channel (the
 * consumer is stored without them). A narrower filter is not: false. */
static bool filters_cover(const fx_chan_config *cc, const cJSON *in)
{
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(in, "filter_subject");
    const cJSON *fss = cJSON_GetObjectItemCaseSensitive(in, "filter_subjects");
    if (fs && !cJSON_IsNull(fs) && !cJSON_IsString(fs)) return false;
    if (fss && !cJSON_IsNull(fss) && !cJSON_IsArray(fss)) return false;
    bool has_fs = cJSON_IsString(fs) && fs->valuestring[0];
    int n_fss = cJSON_IsArray(fss) ? cJSON_GetArraySize(fss) : 0;
    if (!has_fs && n_fss == 0) return true;
    if (has_fs && !fx_subject_valid(fs->valuestring, true)) return false;
    for (const cJSON *it = n_fss ? fss->child : NULL; it; it = it->next)
        if (!cJSON_IsString(it) || !fx_subject_valid(it->valuestring, true)) return false;
    for (size_t i = 0; i < cc->n_subjects; i++) {
        bool covered = has_fs && subject_covers(fs->valuestring, cc->subjects[i]);
        for (const cJSON *it = n_fss ? fss->child : NULL; !covered && it; it = it->next)
            covered = subject_covers(it->valuestring, cc->subjects[i]);
        if (!covered) return false;
    }
    return true;
}

/* The consumer config as stored and shown: JetStream's ConsumerConfig with the channel's defaults
 * filled in. NULL with *why set (and *err_code) when the request asks for what the bridge does
 * not do. */
static cJSON *normalize_config(const fx_chan_config *cc, const char *name, const cJSON *in,
                               char *why, size_t whylen, int *err_code)
{
    *err_code = 10012; /* JSConsumerCreateErrF */
#define REFUSE(...)                                                                                \
    do {                                                                                           \
        snprintf(why, whylen, __VA_ARGS__);                                                        \
        return NULL;                                                                               \
    } while (0)
    const char *ds = opt_str(in, "deliver_subject");
    if (ds && *ds)
        REFUSE("push consumers are subscriptions: subscribe to %s.%s (every subscriber of it is "
               "the claim %s)", cc->deliver_prefix, name, name);
    const char *dp = opt_str(in, "deliver_policy");
    if (dp && *dp && strcmp(dp, "all") != 0)
        REFUSE("deliver_policy %s: a channel is a work queue, consumers get every message (all)", dp);
    const char *ap = opt_str(in, "ack_policy");
    const char *chan_ack = cc->s.ack == FX_ACK_NONE ? "none" : "explicit";
    if (ap && *ap && strcmp(ap, chan_ack) != 0)
        REFUSE("ack_policy %s: channel %s acks are %s (its configuration)", ap, cc->name, chan_ack);
    const char *rp = opt_str(in, "replay_policy");
    if (rp && *rp && strcmp(rp, "instant") != 0) REFUSE("replay_policy %s is not supported", rp);
    if (!filters_cover(cc, in))
        REFUSE("filtered consumers are not supported: a consumer gets every message of channel %s "
               "(a filter must cover each of its subjects)", cc->name);
    const cJSON *ho = cJSON_GetObjectItemCaseSensitive(in, "headers_only");
    if (cJSON_IsTrue(ho)) REFUSE("headers_only consumers are not supported");
    const char *desc = opt_str(in, "description");
    if (desc && strlen(desc) > 4096) REFUSE("description longer than 4096 bytes");

    int64_t ack_wait = cc->s.ack_wait_ms * NS_PER_MS, max_deliver = cc->s.max_deliver,
            max_ack_pending = cc->s.max_ack_pending, max_waiting = 512, inactive = 0,
            max_batch = 0, max_expires = 0, max_bytes = 0, nak_delay = -1;
    *err_code = 10025; /* bad values: invalid JSON */
    if (!opt_int(in, "ack_wait", 0, MAX_DUR_NS, &ack_wait) ||
        !opt_int(in, "max_deliver", -1, 1000000, &max_deliver) ||
        !opt_int(in, "max_ack_pending", -1, 1000000, &max_ack_pending) ||
        !opt_int(in, "max_waiting", 0, FX_JSAPI_MAX_WAITING, &max_waiting) ||
        !opt_int(in, "inactive_threshold", 0, MAX_DUR_NS, &inactive) ||
        !opt_int(in, "max_batch", 0, 1000000, &max_batch) ||
        !opt_int(in, "max_expires", 0, MAX_DUR_NS, &max_expires) ||
        !opt_int(in, "max_bytes", 0, INT64_C(1) << 40, &max_bytes) ||
        !opt_int(in, "nak_delay", 0, MAX_DUR_NS, &nak_delay))
        REFUSE("invalid JSON: a duration or limit is not an integer in range (durations in ns, at "
               "most 24h; max_waiting at most %d)", FX_JSAPI_MAX_WAITING);
    if (ack_wait == 0) ack_wait = cc->s.ack_wait_ms * NS_PER_MS;
    if (ack_wait < 100 * NS_PER_MS) REFUSE("invalid JSON: ack_wait below 100ms");
    if (max_deliver <= 0) max_deliver = cc->s.max_deliver; /* dead letters need a bound */
    if (max_ack_pending <= 0) max_ack_pending = cc->s.max_ack_pending;
    if (max_waiting == 0) max_waiting = 512;
    const cJSON *bo = cJSON_GetObjectItemCaseSensitive(in, "backoff");
    int64_t backoff[FX_CFG_MAX_BACKOFF];
    int nb = 0;
    if (bo && !cJSON_IsNull(bo)) {
        if (!cJSON_IsArray(bo) || cJSON_GetArraySize(bo) > FX_CFG_MAX_BACKOFF)
            REFUSE("invalid JSON: backoff must be an array of at most %d durations (ns)",
                   FX_CFG_MAX_BACKOFF);
        for (const cJSON *it = bo->child; it; it = it->next) {
            double x = cJSON_IsNumber(it) ? it->valuedouble : -1;
            if (x < 0 || x > (double)MAX_DUR_NS || x != (double)(int64_t)x)
                REFUSE("invalid JSON: backoff entries are durations in ns (at most 24h)");
            backoff[nb++] = (int64_t)x;
        }
    }
#undef REFUSE
    cJSON *c = cJSON_CreateObject();
    cJSON *arr = NULL;
    bool ok = c && cJSON_AddStringToObject(c, "durable_name", name) &&
              cJSON_AddStringToObject(c, "name", name) &&
              (!desc || !*desc || cJSON_AddStringToObject(c, "description", desc)) &&
              cJSON_AddStringToObject(c, "deliver_policy", "all") &&
              cJSON_AddStringToObject(c, "ack_policy", chan_ack) && add_i64(c, "ack_wait", ack_wait) &&
              add_i64(c, "max_deliver", max_deliver);
    if (ok && nb > 0) {
        ok = (arr = cJSON_AddArrayToObject(c, "backoff")) != NULL;
        for (int i = 0; ok && i < nb; i++) {
            char buf[24];
            snprintf(buf, sizeof buf, "%" PRId64, backoff[i]);
            cJSON *it = cJSON_CreateRaw(buf);
            ok = it && cJSON_AddItemToArray(arr, it);
            if (!ok) cJSON_Delete(it);
        }
    }
    ok = ok && cJSON_AddStringToObject(c, "replay_policy", "instant") &&
         add_i64(c, "max_waiting", max_waiting) && add_i64(c, "max_ack_pending", max_ack_pending) &&
         (!inactive || add_i64(c, "inactive_threshold", inactive)) &&
         (!max_batch || add_i64(c, "max_batch", max_batch)) &&
         (!max_expires || add_i64(c, "max_expires", max_expires)) &&
         (!max_bytes || add_i64(c, "max_bytes", max_bytes)) &&
         (nak_delay < 0 || add_i64(c, "nak_delay", nak_delay)) && add_i64(c, "num_replicas", 0);
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(in, "metadata");
    if (ok && cJSON_IsObject(md) && md->child) {
        cJSON *m2 = cJSON_AddObjectToObject(c, "metadata");
        ok = m2 != NULL;
        for (const cJSON *it = md->child; ok && it; it = it->next)
            if (cJSON_IsString(it)) ok = cJSON_AddStringToObject(m2, it->string, it->valuestring) != NULL;
    }
    if (!ok) {
        cJSON_Delete(c);
        *err_code = 10012;
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    return c;
}

/* A stored consumer: {"config":{...},"created":<wall ns>}. */
typedef struct js_consumer {
    cJSON *doc;          /* owned */
    const cJSON *config; /* inside doc */
    int64_t created_ns;
} js_consumer;

static bool consumer_decode(const fx_kv *kv, js_consumer *out)
{
    memset(out, 0, sizeof *out);
    out->doc = cJSON_ParseWithLength((const char *)kv->value.data, kv->value.len);
    out->config = out->doc ? cJSON_GetObjectItemCaseSensitive(out->doc, "config") : NULL;
    const cJSON *cr = out->doc ? cJSON_GetObjectItemCaseSensitive(out->doc, "created") : NULL;
    if (!cJSON_IsObject(out->config)) {
        cJSON_Delete(out->doc);
        memset(out, 0, sizeof *out);
        return false;
    }
    out->created_ns = cJSON_IsNumber(cr) && cr->valuedouble > 0 && cr->valuedouble < 9e18
                          ? (int64_t)cr->valuedouble
                          : 0;
    return true;
}

/* The ConsumerInfo fields of a stored consumer into o (numbers from the channel's state, s). */
static bool consumer_info(fx_jsapi *j, const fx_chan_config *cc, const char *name,
                          const js_consumer *k, const fx_mq_channel_info *s, cJSON *o)
{
    /* A push claim of this name held by this bridge (claim registry). */
    bool bound = false;
    int64_t waiting = 0; /* pull requests waiting on this bridge, and its pull claim's engine */
    int64_t ack_pending = 0, redelivered = 0, dseq = 0, floor = 0;
    pthread_rwlock_rdlock(&j->d->reg);
    dm_chan *ch = dm_find_chan_locked(j->d, cc->name);
    for (dm_claim *x = ch ? ch->claims : NULL; x; x = x->next) {
        if (strcmp(x->token, name) != 0 || atomic_load(&x->stop) != STOP_NONE) continue;
        if (x->pull) {
            pthread_mutex_lock(&x->mu);
            waiting += (int64_t)x->pull->n;
            ack_pending += x->pull->num_ack_pending;
            redelivered += x->pull->num_redelivered;
            dseq += (int64_t)x->pull->delivered_seq;
            floor += (int64_t)x->pull->ack_floor_seq;
            pthread_mutex_unlock(&x->mu);
        } else if (atomic_load(&x->holding)) {
            bound = true;
        }
    }
    pthread_rwlock_unlock(&j->d->reg);
    cJSON *cfg = cJSON_Duplicate(k->config, true);
    cJSON *dl = NULL, *af = NULL;
    bool ok = cfg && cJSON_AddStringToObject(o, "stream_name", cc->name) &&
              cJSON_AddStringToObject(o, "name", name) && add_time(o, "created", k->created_ns) &&
              cJSON_AddItemToObject(o, "config", cfg);
    if (!ok && cfg && !cJSON_GetObjectItemCaseSensitive(o, "config")) cJSON_Delete(cfg);
    return ok && (dl = cJSON_AddObjectToObject(o, "delivered")) && add_i64(dl, "consumer_seq", dseq) &&
           add_i64(dl, "stream_seq", 0) && (af = cJSON_AddObjectToObject(o, "ack_floor")) &&
           add_i64(af, "consumer_seq", floor) && add_i64(af, "stream_seq", 0) &&
           add_i64(o, "num_ack_pending", ack_pending) && add_i64(o, "num_redelivered", redelivered) &&
           add_i64(o, "num_waiting", waiting) && add_i64(o, "num_pending", s->backlog) &&
           (!bound || cJSON_AddTrueToObject(o, "push_bound")) && add_time(o, "ts", fx_wall_ns());
}

/* Read one stored consumer: FX_OK, FX_ENOTFOUND, or an etcd error. */
static fx_err consumer_get(fx_jsapi *j, const char *chan, const char *name, js_consumer *out)
{
    char key[512];
    memset(out, 0, sizeof *out);
    if (!consumer_key(j, chan, name, key, sizeof key)) return FX_ENOTFOUND;
    fx_kv kv;
    fx_err e = fx_etcd_get(etcd_of(j), FX_SLICE_STR(key), &kv, FX_JSAPI_ETCD_MS);
    if (e) return e;
    bool ok = consumer_decode(&kv, out);
    fx_kv_free(&kv);
    if (!ok) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "jsapi: consumer %s of %s: stored value is "
                                                     "not a consumer config (ignored)", name, chan);
        return FX_ENOTFOUND;
    }
    return FX_OK;
}

/* Every stored consumer of a channel (at most FX_JSAPI_MAX_CONSUMERS + 1 keys read). */
static fx_err consumer_range(fx_jsapi *j, const char *chan, fx_range_resp *rr)
{
    char key[512];
    memset(rr, 0, sizeof *rr);
    if (!consumer_key(j, chan, NULL, key, sizeof key)) return fx_seterr(FX_EINVAL, "key too long");
    uint8_t end[512];
    size_t el = fx_prefix_end(FX_SLICE_STR(key), end);
    fx_range_req rq = {.key = FX_SLICE_STR(key), .range_end = {end, el},
                       .limit = FX_JSAPI_MAX_CONSUMERS + 1};
    return fx_etcd_range(etcd_of(j), &rq, rr, FX_JSAPI_ETCD_MS);
}

/* Stream of a consumer request: a configured channel, else 404 replied. */
static const fx_chan_config *consumer_stream(fx_jsapi *j, const fx_config *cfg, const js_req *r,
                                             const char *type, const char *stream)
{
    const fx_chan_config *cc = fx_config_channel(cfg, stream);
    if (!cc) reply_error(j, r->reply, type, 404, 10059, "stream not found");
    return cc;
}

/* CONSUMER.CREATE.<s>[.<name>[.<filter>]] and CONSUMER.DURABLE.CREATE.<s>.<name>. */
static void do_consumer_create(fx_jsapi *j, const fx_config *cfg, const js_req *r,
                               const char *stream, const char *subj_name, const char *subj_filter,
                               bool durable_form)
{
    const fx_chan_config *cc = consumer_stream(j, cfg, r, T_CCREATE, stream);
    if (!cc) return;
    cJSON *req = r->len ? cJSON_ParseWithLength(r->body, r->len) : NULL;
    const cJSON *in = req ? cJSON_GetObjectItemCaseSensitive(req, "config") : NULL;
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(req);
        reply_error(j, r->reply, T_CCREATE, 400, 10025,
                    "invalid JSON: expected {\"stream_name\":..,\"config\":{..}}");
        return;
    }
    const char *sn = opt_str(req, "stream_name");
    const char *dn = opt_str(in, "durable_name"), *nm = opt_str(in, "name");
    const char *action = opt_str(req, "action");
    const char *name = subj_name ? subj_name : (dn && *dn ? dn : nm);
    int code = 400, err_code = 0;
    const char *msg = NULL;
    if (sn && *sn && strcmp(sn, stream) != 0)
        err_code = 10060, msg = "expected stream does not match";
    else if (!name || !*name)
        err_code = 10018, msg = "consumer expected to be durable but a durable name was not set "
                                "(fluxon-bridge keeps durable consumers only)";
    else if (!durable_ok(name))
        err_code = 10103, msg = "durable name can not contain '.', '*', '>' (a single subject token "
                                "of at most 64 bytes)";
    else if (durable_form && dn && *dn && strcmp(dn, name) != 0)
        err_code = 10017, msg = "consumer name in subject does not match durable name in request";
    else if (!durable_form && ((dn && *dn && strcmp(dn, name) != 0) || (nm && *nm && strcmp(nm, name) != 0)))
        err_code = 10132, msg = "Consumer Durable and Name have to be equal if both are provided";
    else if (subj_filter) {
        const char *fs = opt_str(in, "filter_subject");
        if (!fs || strcmp(fs, subj_filter) != 0)
            err_code = 10131, msg = "consumer create request did not match filtered subject from "
                                    "create subject";
    }
    if (msg) {
        cJSON_Delete(req);
        reply_error(j, r->reply, T_CCREATE, code, err_code, msg);
        return;
    }
    char why[400];
    cJSON *ncfg = normalize_config(cc, name, in, why, sizeof why, &err_code);
    if (!ncfg) {
        cJSON_Delete(req);
        reply_error(j, r->reply, T_CCREATE, err_code == 10012 ? 500 : 400, err_code, why);
        return;
    }
    char *name_copy = strdup(name);
    bool act_create = action && strcmp(action, "create") == 0;
    bool act_update = action && strcmp(action, "update") == 0;
    cJSON_Delete(req);
    js_consumer old;
    fx_err e = name_copy ? consumer_get(j, cc->name, name_copy, &old) : FX_ENOMEM;
    int64_t created = fx_wall_ns();
    char *newtxt = cJSON_PrintUnformatted(ncfg);
    if (e == FX_OK) {
        char *oldtxt = cJSON_PrintUnformatted(old.config);
        bool same = oldtxt && newtxt && strcmp(oldtxt, newtxt) == 0;
        free(oldtxt);
        created = old.created_ns;
        cJSON_Delete(old.doc);
        if (!same && act_create) {
            reply_error(j, r->reply, T_CCREATE, 400, 10148, "consumer already exists");
            goto out;
        }
    } else if (e == FX_ENOTFOUND) {
        if (act_update) {
            reply_error(j, r->reply, T_CCREATE, 400, 10149, "consumer does not exist");
            goto out;
        }
        fx_range_resp rr;
        fx_err e2 = consumer_range(j, cc->name, &rr);
        if (e2) {
            reply_read_error(j, r->reply, T_CCREATE, e2);
            goto out;
        }
        bool full = rr.count >= FX_JSAPI_MAX_CONSUMERS;
        fx_range_resp_free(&rr);
        if (full) {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 10000, FX_LOG_WRN,
                               "jsapi: channel %s has %d durable consumers: create refused",
                               cc->name, FX_JSAPI_MAX_CONSUMERS);
            reply_error(j, r->reply, T_CCREATE, 400, 10026, "maximum consumers limit reached");
            goto out;
        }
    } else {
        reply_read_error(j, r->reply, T_CCREATE, e);
        goto out;
    }
    {
        cJSON *doc = cJSON_CreateObject();
        char *val = NULL;
        if (doc && cJSON_AddItemToObject(doc, "config", ncfg)) {
            ncfg = NULL;
            if (add_i64(doc, "created", created)) val = cJSON_PrintUnformatted(doc);
        }
        cJSON_Delete(doc);
        char key[512];
        if (!val || !consumer_key(j, cc->name, name_copy, key, sizeof key)) {
            free(val);
            reply_error(j, r->reply, T_CCREATE, 500, 10012, "out of memory");
            goto out;
        }
        fx_put_req pr = {.key = FX_SLICE_STR(key), .value = FX_SLICE_STR(val)};
        e = fx_etcd_put(etcd_of(j), &pr, NULL, FX_JSAPI_ETCD_MS);
        free(val);
        if (e) {
            reply_read_error(j, r->reply, T_CCREATE, e);
            goto out;
        }
        js_consumer k;
        fx_mq_channel_info s;
        e = consumer_get(j, cc->name, name_copy, &k);
        if (!e) e = fx_mq_inspect_channel(j->d->mq, cc->name, &s);
        else memset(&s, 0, sizeof s);
        if (e) {
            cJSON_Delete(k.doc);
            reply_read_error(j, r->reply, T_CCREATE, e);
            goto out;
        }
        cJSON *o = new_resp(T_CCREATE);
        if (o && consumer_info(j, cc, name_copy, &k, &s, o))
            reply_json(j, r->reply, o);
        else
            cJSON_Delete(o);
        cJSON_Delete(k.doc);
        fx_mq_channel_info_free(&s);
        FX_INF("jsapi: durable consumer %s of %s stored", name_copy, cc->name);
    }
out:
    cJSON_Delete(ncfg);
    free(newtxt);
    free(name_copy);
}

static void do_consumer_info(fx_jsapi *j, const fx_config *cfg, const js_req *r, const char *stream,
                             const char *name)
{
    const fx_chan_config *cc = consumer_stream(j, cfg, r, T_CINFO, stream);
    if (!cc) return;
    js_consumer k;
    fx_err e = durable_ok(name) ? consumer_get(j, cc->name, name, &k) : FX_ENOTFOUND;
    if (e == FX_ENOTFOUND) {
        reply_error(j, r->reply, T_CINFO, 404, 10014, "consumer not found");
        return;
    }
    fx_mq_channel_info s;
    if (!e) e = fx_mq_inspect_channel(j->d->mq, cc->name, &s);
    if (e) {
        cJSON_Delete(k.doc);
        reply_read_error(j, r->reply, T_CINFO, e);
        return;
    }
    cJSON *o = new_resp(T_CINFO);
    if (o && consumer_info(j, cc, name, &k, &s, o))
        reply_json(j, r->reply, o);
    else
        cJSON_Delete(o);
    cJSON_Delete(k.doc);
    fx_mq_channel_info_free(&s);
}

static void do_consumer_delete(fx_jsapi *j, const fx_config *cfg, const js_req *r,
                               const char *stream, const char *name)
{
    const fx_chan_config *cc = consumer_stream(j, cfg, r, T_CDELETE, stream);
    if (!cc) return;
    char key[512];
    if (!durable_ok(name) || !consumer_key(j, cc->name, name, key, sizeof key)) {
        reply_error(j, r->reply, T_CDELETE, 404, 10014, "consumer not found");
        return;
    }
    fx_del_req dr = {.key = FX_SLICE_STR(key)};
    fx_del_resp resp;
    memset(&resp, 0, sizeof resp);
    fx_err e = fx_etcd_delete(etcd_of(j), &dr, &resp, FX_JSAPI_ETCD_MS);
    int64_t deleted = resp.deleted;
    fx_del_resp_free(&resp);
    if (e) {
        reply_read_error(j, r->reply, T_CDELETE, e);
        return;
    }
    if (deleted == 0) {
        reply_error(j, r->reply, T_CDELETE, 404, 10014, "consumer not found");
        return;
    }
    FX_INF("jsapi: durable consumer %s of %s deleted", name, cc->name);
    dm_pull_deleted(j->d, cc->name, name); /* its waiting pull requests: 409 Consumer Deleted */
    cJSON *o = new_resp(T_CDELETE);
    if (o && cJSON_AddTrueToObject(o, "success"))
        reply_json(j, r->reply, o);
    else
        cJSON_Delete(o);
}

/* CONSUMER.MSG.NEXT.<s>.<name>: a pull request (pull.h). Served by the consumer's pull claim on
 * this bridge; the first request reads the stored config and starts the claim. Answers are
 * JetStream statuses to the request's reply subject (a consumer that does not exist: 409
 * Consumer Deleted, as a waiting request would see it). */
static void do_next(fx_jsapi *j, const fx_config *cfg, const js_req *r, const char *stream,
                    const char *name)
{
    if (!j->d->leaf) {
        reply_error(j, r->reply, T_SYSTEM, 400, 10003,
                    "pull consumers need nats.leaf_url (fluxon-bridge sends pull deliveries and "
                    "their statuses over the leaf connection)");
        return;
    }
    const fx_chan_config *cc = fx_config_channel(cfg, stream);
    if (!cc || !durable_ok(name)) {
        dm_pull_status(j->d, r->reply, 409, "Consumer Deleted", -1, 0);
        return;
    }
    int res = dm_pull_submit(j->d, cc->name, name, r->reply, r->body, r->len, NULL);
    if (res != DM_PULL_NEED_CFG) {
        if (res == DM_PULL_NO_CHAN) dm_pull_status(j->d, r->reply, 503, "Service Unavailable", -1, 0);
        return;
    }
    js_consumer k;
    fx_err e = consumer_get(j, cc->name, name, &k);
    if (e) {
        if (e == FX_ENOTFOUND)
            dm_pull_status(j->d, r->reply, 409, "Consumer Deleted", -1, 0);
        else
            dm_pull_status(j->d, r->reply, 503, "Service Unavailable", -1, 0);
        return;
    }
    dm_pull_cfg pc;
    dm_pull_cfg_from_json(k.config, &cc->s, &pc);
    cJSON_Delete(k.doc);
    res = dm_pull_submit(j->d, cc->name, name, r->reply, r->body, r->len, &pc);
    if (res == DM_PULL_NO_CHAN) dm_pull_status(j->d, r->reply, 503, "Service Unavailable", -1, 0);
}

/* CONSUMER.NAMES.<s> and CONSUMER.LIST.<s> (paged like the stream listings). */
static void do_consumer_list(fx_jsapi *j, const fx_config *cfg, const js_req *r, const char *stream,
                             bool names_only)
{
    const char *type = names_only ? T_CNAMES : T_CLIST;
    const fx_chan_config *cc = consumer_stream(j, cfg, r, type, stream);
    if (!cc) return;
    js_paged pg;
    if (!parse_paged(j, r, type, &pg)) return;
    fx_range_resp rr;
    fx_err e = consumer_range(j, cc->name, &rr);
    fx_mq_channel_info s;
    memset(&s, 0, sizeof s);
    if (!e && !names_only) e = fx_mq_inspect_channel(j->d->mq, cc->name, &s);
    if (e) {
        fx_range_resp_free(&rr);
        reply_read_error(j, r->reply, type, e);
        return;
    }
    char prefix[512];
    consumer_key(j, cc->name, NULL, prefix, sizeof prefix);
    size_t pl = strlen(prefix);
    int64_t limit = names_only ? NAMES_LIMIT : LIST_LIMIT;
    size_t n = rr.n_kvs < FX_JSAPI_MAX_CONSUMERS ? rr.n_kvs : FX_JSAPI_MAX_CONSUMERS;
    cJSON *o = new_resp(type);
    cJSON *arr = NULL;
    bool ok = o && add_paged(o, (int64_t)n, pg.offset, limit) &&
              (arr = cJSON_AddArrayToObject(o, "consumers"));
    for (size_t i = (size_t)pg.offset; ok && i < n && i < (size_t)(pg.offset + limit); i++) {
        const fx_kv *kv = &rr.kvs[i];
        if (kv->key.len <= pl) continue;
        const char *name = (const char *)kv->key.data + pl;
        if (names_only) {
            cJSON *it = cJSON_CreateString(name);
            ok = it && cJSON_AddItemToArray(arr, it);
            if (!ok) cJSON_Delete(it);
            continue;
        }
        js_consumer k;
        if (!consumer_decode(kv, &k)) continue;
        cJSON *it = cJSON_CreateObject();
        ok = it && cJSON_AddItemToArray(arr, it);
        if (!ok) cJSON_Delete(it);
        ok = ok && consumer_info(j, cc, name, &k, &s, it);
        cJSON_Delete(k.doc);
    }
    fx_range_resp_free(&rr);
    fx_mq_channel_info_free(&s);
    if (!ok) {
        cJSON_Delete(o);
        return;
    }
    reply_json(j, r->reply, o);
}

/* "<a>.<b>" of op after verb: two tokens (the second may hold dots when rest_ok). */
static bool two_tokens(const char *op, const char *verb, char *a, size_t acap, const char **b)
{
    size_t vl = strlen(verb);
    if (strncmp(op, verb, vl) != 0 || op[vl] != '.') return false;
    const char *t = op + vl + 1;
    const char *dot = strchr(t, '.');
    if (!dot || dot == t || (size_t)(dot - t) >= acap || !dot[1]) return false;
    memcpy(a, t, (size_t)(dot - t));
    a[dot - t] = '\0';
    *b = dot + 1;
    return true;
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

static void answer_consumer(fx_jsapi *j, const fx_config *cfg, const js_req *r, const char *op)
{
    char stream[128];
    const char *rest = NULL, *one;
    if (two_tokens(op, "CONSUMER.DURABLE.CREATE", stream, sizeof stream, &rest) && !strchr(rest, '.')) {
        do_consumer_create(j, cfg, r, stream, rest, NULL, true);
    } else if ((one = one_token(op, "CONSUMER.CREATE"))) {
        do_consumer_create(j, cfg, r, one, NULL, NULL, false);
    } else if (two_tokens(op, "CONSUMER.CREATE", stream, sizeof stream, &rest)) {
        char name[128];
        const char *dot = strchr(rest, '.');
        size_t nl = dot ? (size_t)(dot - rest) : strlen(rest);
        if (nl == 0 || nl >= sizeof name) {
            reply_error(j, r->reply, T_CCREATE, 400, 10103, "durable name can not contain '.', '*', '>'");
            return;
        }
        memcpy(name, rest, nl);
        name[nl] = '\0';
        do_consumer_create(j, cfg, r, stream, name, dot ? dot + 1 : NULL, false);
    } else if (two_tokens(op, "CONSUMER.MSG.NEXT", stream, sizeof stream, &rest) && !strchr(rest, '.')) {
        do_next(j, cfg, r, stream, rest);
    } else if (two_tokens(op, "CONSUMER.INFO", stream, sizeof stream, &rest) && !strchr(rest, '.')) {
        do_consumer_info(j, cfg, r, stream, rest);
    } else if (two_tokens(op, "CONSUMER.DELETE", stream, sizeof stream, &rest) && !strchr(rest, '.')) {
        do_consumer_delete(j, cfg, r, stream, rest);
    } else if ((one = one_token(op, "CONSUMER.NAMES"))) {
        do_consumer_list(j, cfg, r, one, true);
    } else if ((one = one_token(op, "CONSUMER.LIST"))) {
        do_consumer_list(j, cfg, r, one, false);
    } else {
        reply_error(j, r->reply, T_SYSTEM, 400, 10003,
                    "bad request: not supported by fluxon-bridge's JetStream API");
    }
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
    } else if (strncmp(op, "CONSUMER.", 9) == 0) {
        answer_consumer(j, cfg, r, op);
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
    /* a pull request is answered with status messages: a JSON body would be taken for a message */
    bool pull = strstr(subj, ".CONSUMER.MSG.NEXT.") != NULL;
    if ((size_t)len > FX_JSAPI_MAX_REQ) {
        if (pull)
            dm_pull_status(j->d, rep, 400, "Bad Request", -1, 0);
        else
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
        if (pull)
            dm_pull_status(j->d, rep, 503, "Service Unavailable", -1, 0);
        else
            reply_error(j, rep, T_SYSTEM, 503, 10167, "too many requests: fluxon-bridge JetStream API busy");
        req_free(r);
    }
    natsMsg_Destroy(m);
}

static void *worker(void *arg)
{
    fx_thread_name("fx-jsapi");
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
        if (strstr(r->subject, ".CONSUMER.MSG.NEXT.")) { /* a new deadline for the timer */
            pthread_mutex_lock(&j->mu);
            j->tkick = true;
            pthread_cond_signal(&j->tcv);
            pthread_mutex_unlock(&j->mu);
        }
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
        FX_INF("jsapi: answering the JetStream API on %s (no JetStream there: %s)", prefix,
               natsStatus_GetText(s));
        return FX_OK;
    }
    const char *who = NULL;
    bool bridge = natsMsgHeader_Get(m, FX_JSAPI_HDR_BRIDGE, &who) == NATS_OK;
    natsMsg_Destroy(m);
    if (bridge) {
        FX_INF("jsapi: answering the JetStream API on %s (with the other bridges of the account)",
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

/* Pull request timers: expire waiting requests and send their heartbeats on time. */
static void *timer_main(void *arg)
{
    fx_thread_name("fx-jsapi-timer");
    fx_jsapi *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        j->tkick = false;
        pthread_mutex_unlock(&j->mu);
        int64_t next = dm_pull_timers(j->d);
        int64_t cap = fx_now_ms() + 1000;
        if (next > cap) next = cap;
        pthread_mutex_lock(&j->mu);
        if (j->stop || j->tkick) continue;
        struct timespec ts = fx_deadline_ts(next);
        pthread_cond_timedwait(&j->tcv, &j->mu, &ts);
    }
    pthread_mutex_unlock(&j->mu);
    nats_ReleaseThreadMemory();
    return NULL;
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
    fx_cond_init_monotonic(&j->tcv);
    atomic_init(&j->total, 0);
    atomic_init(&j->errors, 0);
    *out = j; /* the daemon frees it even when this fails half-way */
    if (pthread_create(&j->thr, NULL, worker, j) != 0)
        return fx_seterr(FX_ENOMEM, "jsapi: cannot start the worker thread");
    j->started = true;
    if (pthread_create(&j->tthr, NULL, timer_main, j) != 0)
        return fx_seterr(FX_ENOMEM, "jsapi: cannot start the timer thread");
    j->tstarted = true;
    /* The API subjects answered, not "<prefix>.>": a request the bridge does not serve (pull
     * requests, direct gets, ...) finds no responder, as on a server without JetStream, instead
     * of an answer a client would take for a message. */
    static const char *const suffixes[] = {"INFO", "STREAM.>", "CONSUMER.CREATE.>",
                                           "CONSUMER.DURABLE.CREATE.>", "CONSUMER.INFO.>",
                                           "CONSUMER.NAMES.>", "CONSUMER.LIST.>",
                                           "CONSUMER.DELETE.>", "CONSUMER.MSG.NEXT.>"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char subj[200];
        snprintf(subj, sizeof subj, "%s.%s", prefix, suffixes[i]);
        natsStatus s = natsConnection_QueueSubscribe(&j->subs[j->n_subs], d->nc, subj,
                                                     "fluxon-jsapi", on_request, j);
        if (s != NATS_OK)
            return fx_seterr(FX_EUNAVAIL, "nats: subscribe %s: %s", subj, natsStatus_GetText(s));
        natsSubscription_SetPendingLimits(j->subs[j->n_subs], 4 * FX_JSAPI_QUEUE, 8 * FX_JSAPI_MAX_REQ);
        j->n_subs++;
    }
    return FX_OK;
}

void fx_jsapi_unsubscribe(fx_jsapi *j)
{
    for (size_t i = 0; j && i < j->n_subs; i++) natsSubscription_Unsubscribe(j->subs[i]);
}

void fx_jsapi_stop(fx_jsapi *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->stop = true;
    pthread_cond_broadcast(&j->cv);
    pthread_cond_broadcast(&j->tcv);
    pthread_mutex_unlock(&j->mu);
    if (j->started) {
        pthread_join(j->thr, NULL);
        j->started = false;
    }
    if (j->tstarted) {
        pthread_join(j->tthr, NULL);
        j->tstarted = false;
    }
}

void fx_jsapi_free(fx_jsapi *j)
{
    if (!j) return;
    fx_jsapi_stop(j);
    for (size_t i = 0; i < j->n_subs; i++) natsSubscription_Destroy(j->subs[i]);
    js_req *r = j->head;
    while (r) {
        js_req *nx = r->next;
        req_free(r);
        r = nx;
    }
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    pthread_cond_destroy(&j->tcv);
    free(j);
}
