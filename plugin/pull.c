/* pull.c -- pull requests: parsing, JetStream status messages, the wait queue. Contract: pull.h;
 * the claim side (serving the requests) is in claim.c. */
#include "pull.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmctx.h"
#include "leaf.h"

#define NS_PER_MS 1000000LL

/* An integer member k of o in [min, max] into *out; absent or null: untouched. false: invalid. */
static bool num(const cJSON *o, const char *k, int64_t min, int64_t max, int64_t *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!it || cJSON_IsNull(it)) return true;
    if (!cJSON_IsNumber(it)) return false;
    double x = it->valuedouble;
    if (x != x || x < (double)min || x > (double)max) return false;
    *out = (int64_t)x;
    return true;
}

void dm_pull_cfg_from_json(const cJSON *c, const fx_chan_settings *cs, dm_pull_cfg *out)
{
    memset(out, 0, sizeof *out);
    int64_t ack_wait = 0, max_deliver = 0, map = 0, mw = 0, mb = 0, mby = 0, mexp = 0, nakd = -1;
    num(c, "ack_wait", 0, FX_PULL_MAX_DUR_MS * NS_PER_MS, &ack_wait);
    num(c, "max_deliver", -1, 1000000, &max_deliver);
    num(c, "max_ack_pending", -1, 1000000, &map);
    num(c, "max_waiting", 0, 1 << 20, &mw);
    num(c, "max_batch", 0, FX_PULL_MAX_BATCH, &mb);
    num(c, "max_bytes", 0, INT64_C(1) << 40, &mby);
    num(c, "max_expires", 0, FX_PULL_MAX_DUR_MS * NS_PER_MS, &mexp);
    num(c, "nak_delay", 0, FX_PULL_MAX_DUR_MS * NS_PER_MS, &nakd);
    out->ack_wait_ms = ack_wait >= 100 * NS_PER_MS ? ack_wait / NS_PER_MS : cs->ack_wait_ms;
    out->max_deliver = max_deliver > 0 ? max_deliver : cs->max_deliver;
    out->max_ack_pending = map > 0 ? map : cs->max_ack_pending;
    out->max_waiting = mw > 0 ? mw : 512;
    out->max_batch = mb;
    out->max_bytes = mby;
    out->max_expires_ms = mexp / NS_PER_MS;
    out->nak_delay_ms = nakd >= 0 ? nakd / NS_PER_MS : cs->nak_delay_ms;
    const cJSON *bo = cJSON_GetObjectItemCaseSensitive(c, "backoff");
    if (cJSON_IsArray(bo)) {
        for (const cJSON *it = bo->child; it && out->n_backoff < FX_CFG_MAX_BACKOFF; it = it->next)
            if (cJSON_IsNumber(it) && it->valuedouble >= 0 &&
                it->valuedouble <= (double)FX_PULL_MAX_DUR_MS * NS_PER_MS)
                out->backoff_ms[out->n_backoff++] = (int64_t)it->valuedouble / NS_PER_MS;
    } else if (nakd < 0) { /* a consumer's own nak_delay replaces the channel's NAK policy */
        out->n_backoff = cs->n_backoff;
        memcpy(out->backoff_ms, cs->backoff_ms, sizeof out->backoff_ms);
    }
}

/* A duration as Go's %v prints it (JetStream's "Exceeded MaxRequestExpires of 1m0s"). */
static void go_dur(int64_t ms, char *out, size_t cap)
{
    if (ms < 1000) {
        snprintf(out, cap, "%" PRId64 "ms", ms);
        return;
    }
    int64_t h = ms / 3600000, m = ms / 60000 % 60, sec = ms / 1000 % 60, frac = ms % 1000;
    char fs[8] = "";
    if (frac) {
        snprintf(fs, sizeof fs, ".%03" PRId64, frac);
        for (size_t k = strlen(fs); k > 1 && fs[k - 1] == '0'; k--) fs[k - 1] = '\0';
    }
    if (h)
        snprintf(out, cap, "%" PRId64 "h%" PRId64 "m%" PRId64 "%ss", h, m, sec, fs);
    else if (m)
        snprintf(out, cap, "%" PRId64 "m%" PRId64 "%ss", m, sec, fs);
    else
        snprintf(out, cap, "%" PRId64 "%ss", sec, fs);
}

#define FAIL(c, ...)                                                                               \
    do {                                                                                           \
        *code = (c);                                                                               \
        snprintf(desc, dcap, __VA_ARGS__);                                                         \
        cJSON_Delete(j);                                                                           \
        return false;                                                                              \
    } while (0)

bool dm_pull_parse(const char *body, size_t len, const char *reply, const dm_pull_cfg *cfg,
                   int64_t now_ms, dm_pull_req *out, int *code, char *desc, size_t dcap)
{
    cJSON *j = NULL;
    memset(out, 0, sizeof *out);
    if (!reply || !*reply || strlen(reply) > FX_PULL_REPLY_MAX)
        FAIL(400, "Bad Request - reply subject longer than %d bytes", FX_PULL_REPLY_MAX);
    memcpy(out->reply, reply, strlen(reply) + 1);
    int64_t batch = 1, expires = 0, max_bytes = 0, hb = 0;
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n')) i++;
    if (i < len && body[i] == '{') {
        j = cJSON_ParseWithLength(body, len);
        if (!j || !cJSON_IsObject(j)) FAIL(400, "Bad Request");
        bool nw = false;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "no_wait");
        if (x && cJSON_IsBool(x)) nw = cJSON_IsTrue(x);
        if (!num(j, "batch", INT64_MIN / 2, INT64_MAX / 2, &batch) ||
            !num(j, "expires", 0, INT64_MAX / 2, &expires) ||
            !num(j, "max_bytes", 0, INT64_MAX / 2, &max_bytes) ||
            !num(j, "idle_heartbeat", 0, INT64_MAX / 2, &hb))
            FAIL(400, "Bad Request");
        out->no_wait = nw;
        cJSON_Delete(j);
        j = NULL;
    } else if (i < len) { /* a bare batch size */
        char buf[24];
        size_t n = len - i < sizeof buf - 1 ? len - i : sizeof buf - 1;
        memcpy(buf, body + i, n);
        buf[n] = '\0';
        char *end = NULL;
        long long v = strtoll(buf, &end, 10);
        if (end == buf) FAIL(400, "Bad Request");
        batch = v;
    }
    if (batch <= 0) batch = 1;
    if (cfg->max_batch > 0 && batch > cfg->max_batch)
        FAIL(409, "Exceeded MaxRequestBatch of %" PRId64, cfg->max_batch);
    if (batch > FX_PULL_MAX_BATCH) FAIL(409, "Exceeded MaxRequestBatch of %d", FX_PULL_MAX_BATCH);
    if (max_bytes > 0 && cfg->max_bytes > 0 && max_bytes > cfg->max_bytes)
        FAIL(409, "Exceeded MaxRequestMaxBytes of %" PRId64, cfg->max_bytes);
    int64_t exp_ms = expires / NS_PER_MS, hb_ms = hb / NS_PER_MS;
    if (expires > 0 && exp_ms == 0) exp_ms = 1;
    if (cfg->max_expires_ms > 0 && exp_ms > cfg->max_expires_ms) {
        char ds[48];
        go_dur(cfg->max_expires_ms, ds, sizeof ds);
        FAIL(409, "Exceeded MaxRequestExpires of %s", ds);
    }
    if (exp_ms > FX_PULL_MAX_DUR_MS) FAIL(409, "Exceeded MaxRequestExpires of 24h");
    if (hb > 0 && (hb_ms < FX_PULL_MIN_HB_MS || hb_ms > FX_PULL_MAX_DUR_MS))
        FAIL(400, "Bad Request - heartbeat value out of range");
    if (hb_ms > 0 && exp_ms > 0 && hb_ms > exp_ms / 2)
        FAIL(400, "Bad Request - heartbeat value too large");
    out->batch = batch;
    out->max_bytes = max_bytes;
    out->bytes = max_bytes;
    out->expires_ms = exp_ms > 0 ? now_ms + exp_ms : 0;
    out->hb_ms = hb_ms;
    out->next_hb_ms = hb_ms > 0 ? now_ms + hb_ms : 0;
    return true;
}
#undef FAIL

bool dm_pull_status(fx_daemon *d, const char *reply, int code, const char *desc, int64_t pend_msgs,
                    int64_t pend_bytes)
{
    if (!d->leaf || !reply || !*reply) return false;
    char hdr[512];
    int n;
    if (pend_msgs >= 0)
        n = snprintf(hdr, sizeof hdr,
                     "NATS/1.0 %d %s\r\nNats-Pending-Messages: %" PRId64
                     "\r\nNats-Pending-Bytes: %" PRId64 "\r\n\r\n",
                     code, desc, pend_msgs, pend_bytes < 0 ? 0 : pend_bytes);
    else
        n = snprintf(hdr, sizeof hdr, "NATS/1.0 %d %s\r\n\r\n", code, desc);
    if (n <= 0 || (size_t)n >= sizeof hdr) return false;
    return fx_leaf_publish(d->leaf, reply, NULL, hdr, (size_t)n, "", 0) == FX_OK;
}

bool dm_pull_push(dm_pull *p, const dm_pull_req *r)
{
    if (p->n >= (size_t)p->cfg.max_waiting) return false;
    p->wq[(p->head + p->n) % (size_t)p->cfg.max_waiting] = *r;
    p->n++;
    return true;
}

dm_pull_req *dm_pull_at(dm_pull *p, size_t i)
{
    return &p->wq[(p->head + i) % (size_t)p->cfg.max_waiting];
}

void dm_pull_remove(dm_pull *p, size_t i)
{
    size_t cap = (size_t)p->cfg.max_waiting;
    if (i == 0) {
        p->head = (p->head + 1) % cap;
    } else {
        for (size_t k = i; k + 1 < p->n; k++)
            p->wq[(p->head + k) % cap] = p->wq[(p->head + k + 1) % cap];
    }
    p->n--;
}

void dm_pull_rotate(dm_pull *p)
{
    if (p->n < 2) return;
    size_t cap = (size_t)p->cfg.max_waiting;
    dm_pull_req tmp = p->wq[p->head];
    p->head = (p->head + 1) % cap;
    p->wq[(p->head + p->n - 1) % cap] = tmp;
}

bool dm_pull_abandoned(fx_daemon *d, dm_pull_req *r)
{
    if (!d->leaf || !fx_leaf_connected(d->leaf)) return false;
    if (fx_leaf_has_interest(d->leaf, r->reply)) {
        r->had_interest = true;
        return false;
    }
    return r->had_interest;
}
