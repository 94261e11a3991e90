/* admin.c -- the admin view of channels (contract: admin.h): renders the plain data of
 * bridge/inspect.h (one channel read at one etcd revision) as JSON. It reads no MQ key itself.
 *
 * Integers are written from their exact decimal text (cJSON raw values), never through double.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "admin.h"
#include "delay.h"
#include "fx_log.h"
#include "inspect.h"
#include "keys.h"

#define ADMIN_LIST_MAX 4096 /* channel mappings listed when no config is given */

/* ---- JSON ------------------------------------------------------------------------------------ */

#define DEC_BUF 24 /* an int64_t in decimal, with sign and NUL */

static bool add_i64(cJSON *obj, const char *field, int64_t v)
{
    char buf[DEC_BUF];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_AddRawToObject(obj, field, buf) != NULL;
}

static bool push_i64(cJSON *arr, int64_t v)
{
    char buf[DEC_BUF];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    cJSON *it = cJSON_CreateRaw(buf);
    if (it && cJSON_AddItemToArray(arr, it)) return true;
    cJSON_Delete(it);
    return false;
}

static char *print_free(cJSON *root)
{
    char *out = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out;
}

static char *error_json(int code, const char *desc)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = root ? cJSON_AddObjectToObject(root, "error") : NULL;
    if (!err || !cJSON_AddNumberToObject(err, "code", code) ||
        !cJSON_AddStringToObject(err, "description", desc)) {
        cJSON_Delete(root);
        return NULL;
    }
    return print_free(root);
}

/* The error shape for a failed read: 503 when etcd is unreachable or the client is closing,
 * 400 for an invalid name, 500 otherwise. NULL only on OOM. */
static char *read_error_json(fx_err e, const char *what)
{
    if (e == FX_ENOMEM) return NULL;
    int code = 500;
    switch (e) {
    case FX_ETIMEDOUT:
    case FX_EUNAVAIL:
    case FX_ECLOSED:
    case FX_ECANCELED: code = 503; break;
    case FX_EINVAL: code = 400; break;
    default: break;
    }
    char desc[640];
    const char *d = fx_err_detail();
    if (d && *d)
        snprintf(desc, sizeof desc, "%s: %s (%s)", what, fx_strerror(e), d);
    else
        snprintf(desc, sizeof desc, "%s: %s", what, fx_strerror(e));
    return error_json(code, desc);
}

static const fx_chan_config *cfg_channel(const fx_config *cfg, const char *name)
{
    if (!cfg || !name) return NULL;
    for (size_t i = 0; i < cfg->n_channels; i++)
        if (cfg->channels[i].name && strcmp(cfg->channels[i].name, name) == 0) return &cfg->channels[i];
    return NULL;
}

static bool add_mpmc_id(cJSON *o, const fx_mq_channel_info *s)
{
    return s->mapped ? add_i64(o, "mpmc_id", s->mpmc_id) : cJSON_AddNullToObject(o, "mpmc_id") != NULL;
}

static char *info_json(const char *name, const fx_chan_config *cc, const fx_mq_channel_info *s,
                       int64_t delayed)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root && cJSON_AddStringToObject(root, "name", name) && add_mpmc_id(root, s) &&
              add_i64(root, "backlog", s->backlog) &&
              (delayed < 0 ? cJSON_AddNullToObject(root, "delayed") != NULL
                           : add_i64(root, "delayed", delayed));
    if (ok) {
        if (s->has_meta)
            ok = add_i64(root, "capacity", s->capacity) &&
                 add_i64(root, "ttl_seconds", s->ttl_seconds) &&
                 add_i64(root, "retention_seconds", s->retention_seconds);
        else if (cc)
            ok = add_i64(root, "capacity", cc->s.capacity) &&
                 add_i64(root, "ttl_seconds", cc->s.ttl_seconds);
        else
            ok = cJSON_AddNullToObject(root, "capacity") && cJSON_AddNullToObject(root, "ttl_seconds");
    }
    if (ok && cc) /* where its deliveries go (fluxonctl dlq ls / redrive consume a DLQ there) */
        ok = (!cc->deliver_prefix ||
              cJSON_AddStringToObject(root, "deliver_prefix", cc->deliver_prefix)) &&
             cJSON_AddBoolToObject(root, "dlq", cc->is_dlq);
    cJSON *subs = ok ? cJSON_AddArrayToObject(root, "sub_mpscs") : NULL;
    ok = subs != NULL;
    for (size_t i = 0; ok && i < s->n_subs; i++) {
        const fx_mq_sub_mpsc_info *si = &s->subs[i];
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(subs, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        ok = add_i64(o, "chan_id", si->chan_id) && cJSON_AddBoolToObject(o, "ready", si->ready) &&
             (si->ready && si->owner_member >= 0 ? add_i64(o, "owner_member", si->owner_member)
                                          : cJSON_AddNullToObject(o, "owner_member") != NULL) &&
             add_i64(o, "backlog", si->backlog) && add_i64(o, "consumers", si->consumers);
        cJSON *prods = ok ? cJSON_AddArrayToObject(o, "producers") : NULL;
        ok = prods != NULL;
        for (size_t j = 0; ok && j < si->n_producers; j++) {
            const fx_mq_producer_offsets *p = &si->producers[j];
            cJSON *po = cJSON_CreateObject();
            ok = po && cJSON_AddItemToArray(prods, po);
            if (!ok) {
                cJSON_Delete(po);
                break;
            }
            ok = add_i64(po, "pidx", p->pidx) && add_i64(po, "produce_offset", p->produce_offset) &&
                 add_i64(po, "consume_offset", p->consume_offset) && add_i64(po, "backlog", p->backlog);
        }
    }
    cJSON *mem = ok ? cJSON_AddObjectToObject(root, "members") : NULL;
    cJSON *pa = mem ? cJSON_AddArrayToObject(mem, "producers") : NULL;
    cJSON *ca = pa ? cJSON_AddArrayToObject(mem, "consumers") : NULL;
    ok = ca != NULL;
    for (size_t i = 0; ok && i < s->n_producers; i++) ok = push_i64(pa, s->producers[i]);
    for (size_t i = 0; ok && i < s->n_consumers; i++) ok = push_i64(ca, s->consumers[i]);
    if (ok && s->truncated) ok = cJSON_AddTrueToObject(root, "truncated") != NULL;
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return print_free(root);
}

/* ---- public ---------------------------------------------------------------------------------- */

char *fx_admin_channel_info_json(fx_mq_client *c, const fx_config *cfg, const char *name)
{
    if (!name || !*name) return error_json(404, "channel not found");
    const fx_chan_config *cc = cfg_channel(cfg, name);
    if (cfg && !cc) return error_json(404, "channel not found");
    if (fx_mq_name_validate(name) != FX_OK) return error_json(404, "channel not found");
    fx_mq_channel_info s;
    fx_err e = fx_mq_inspect_channel(c, name, &s);
    if (e) return read_error_json(e, "reading channel from etcd");
    /* delayed messages waiting (bridge/delay.h: one count_only range; -1 when unreadable) */
    int64_t delayed = -1;
    fx_delay *dl = NULL;
    if (fx_delay_new(c, "admin", 2, &dl) == FX_OK && fx_delay_count(dl, name, &delayed, 0) != FX_OK)
        delayed = -1;
    fx_delay_free(dl);
    char *out = NULL;
    if (!cfg && !s.mapped)
        out = error_json(404, "channel not found");
    else
        out = info_json(name, cc, &s, delayed);
    fx_mq_channel_info_free(&s);
    return out;
}

/* One entry of the list: {"name":..,"mpmc_id":..,"backlog":..}. */
static fx_err list_entry(fx_mq_client *c, cJSON *arr, const char *name)
{
    fx_mq_channel_info s;
    fx_err e = fx_mq_inspect_channel(c, name, &s);
    if (e) return e;
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddItemToArray(arr, o);
    if (!ok) cJSON_Delete(o);
    ok = ok && cJSON_AddStringToObject(o, "name", name) && add_mpmc_id(o, &s) &&
         add_i64(o, "backlog", s.backlog);
    if (ok && s.truncated) ok = cJSON_AddTrueToObject(o, "truncated") != NULL;
    fx_mq_channel_info_free(&s);
    return ok ? FX_OK : FX_ENOMEM;
}

/* Every mapped channel (no config given), sorted by etcd. */
static fx_err list_mapped(fx_mq_client *c, cJSON *arr)
{
    char **names = NULL;
    size_t n = 0;
    fx_err e = fx_mq_inspect_names(c, ADMIN_LIST_MAX, &names, &n);
    for (size_t i = 0; !e && i < n; i++) e = list_entry(c, arr, names[i]);
    fx_mq_inspect_names_free(names, n);
    return e;
}

char *fx_admin_channel_list_json(fx_mq_client *c, const fx_config *cfg)
{
    if (!c) return error_json(500, "no MQ client");
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "channels") : NULL;
    if (!arr) {
        cJSON_Delete(root);
        return NULL;
    }
    fx_err e = FX_OK;
    if (cfg) {
        for (size_t i = 0; !e && i < cfg->n_channels; i++) {
            const char *name = cfg->channels[i].name;
            if (!name) continue;
            e = list_entry(c, arr, name);
        }
    } else {
        e = list_mapped(c, arr);
    }
    if (e) {
        cJSON_Delete(root);
        return read_error_json(e, "reading channels from etcd");
    }
    return print_free(root);
}

fx_err fx_admin_channel_backlog(fx_mq_client *c, const char *name, int64_t *out)
{
    if (!out) return fx_seterr(FX_EINVAL, "admin: NULL argument");
    *out = 0;
    fx_mq_channel_info s;
    fx_err e = fx_mq_inspect_channel(c, name, &s);
    if (e) return e;
    if (!s.mapped) {
        fx_mq_channel_info_free(&s);
        return fx_seterr(FX_ENOTFOUND, "channel '%s' has no MPMC yet", name);
    }
    *out = s.backlog;
    fx_mq_channel_info_free(&s);
    return FX_OK;
}
