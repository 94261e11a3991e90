/* delay.c -- delayed messages: the due-time index in etcd and the mover's lock (see delay.h). */
#include "delay.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fx_time.h"
#include "meta.h"
#include "mq_int.h"

struct fx_delay {
    fx_mq_client *c;
    char *owner;
    int64_t lock_ttl_s;
    /* lock lease (fx_delay_lock's thread only) */
    fx_lease *lease;
    char lock_val[200];
};

#define KEY_CAP (FX_MQ_ROOT_MAX + 256)

fx_err fx_delay_new(fx_mq_client *c, const char *owner, int64_t lock_ttl_s, fx_delay **out)
{
    *out = NULL;
    if (!c || !owner || !*owner || strlen(owner) > 128 || lock_ttl_s < 2)
        return fx_seterr(FX_EINVAL, "delay: bad arguments");
    fx_delay *dl = calloc(1, sizeof *dl);
    if (!dl || !(dl->owner = strdup(owner))) {
        free(dl);
        return fx_seterr(FX_ENOMEM, "delay: out of memory");
    }
    dl->c = c;
    dl->lock_ttl_s = lock_ttl_s;
    *out = dl;
    return FX_OK;
}

void fx_delay_free(fx_delay *dl)
{
    if (!dl) return;
    fx_lease_release(dl->lease);
    free(dl->owner);
    free(dl);
}

/* ---- header values ------------------------------------------------------------------------- */

static bool digits(const char *s, size_t n, int *out)
{
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

fx_err fx_delay_parse_rfc3339(const char *s, size_t len, int64_t *ms)
{
    /* YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM) */
    int Y, M, D, h, m, sec;
    if (len < 20 || !digits(s, 4, &Y) || s[4] != '-' || !digits(s + 5, 2, &M) || s[7] != '-' ||
        !digits(s + 8, 2, &D) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        !digits(s + 11, 2, &h) || s[13] != ':' || !digits(s + 14, 2, &m) || s[16] != ':' ||
        !digits(s + 17, 2, &sec))
        return fx_seterr(FX_EINVAL, "not an RFC 3339 time");
    size_t i = 19;
    int64_t frac_ms = 0;
    if (i < len && s[i] == '.') {
        i++;
        size_t f0 = i;
        int64_t scale = 100;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            frac_ms += (s[i] - '0') * scale;
            scale /= 10;
            i++;
        }
        if (i == f0 || i - f0 > 9) return fx_seterr(FX_EINVAL, "bad fraction of a second");
    }
    int64_t off_s = 0;
    if (i < len && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i + 6 == len && (s[i] == '+' || s[i] == '-')) {
        int oh, om;
        if (!digits(s + i + 1, 2, &oh) || s[i + 3] != ':' || !digits(s + i + 4, 2, &om) ||
            oh > 23 || om > 59)
            return fx_seterr(FX_EINVAL, "bad time zone offset");
        off_s = (oh * 3600 + om * 60) * (s[i] == '-' ? -1 : 1);
        i += 6;
    } else {
        return fx_seterr(FX_EINVAL, "RFC 3339 time without a time zone (Z or +hh:mm)");
    }
    if (i != len) return fx_seterr(FX_EINVAL, "trailing characters after the time");
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (Y < 1970 || M < 1 || M > 12 || D < 1 || D > mdays[M - 1] || h > 23 || m > 59 || sec > 60)
        return fx_seterr(FX_EINVAL, "time out of range");
    struct tm tm = {.tm_year = Y - 1900, .tm_mon = M - 1, .tm_mday = D, .tm_hour = h,
                    .tm_min = m, .tm_sec = sec > 59 ? 59 : sec};
    time_t t = timegm(&tm);
    if (t == (time_t)-1) return fx_seterr(FX_EINVAL, "time out of range");
    int64_t v = ((int64_t)t - off_s) * 1000 + frac_ms;
    if (v < 0 || v > FX_DELAY_DUE_MAX) return fx_seterr(FX_EINVAL, "time out of range");
    *ms = v;
    return FX_OK;
}

fx_err fx_delay_parse_schedule(const char *s, size_t len, int64_t *due_ms, bool *unsupported)
{
    if (unsupported) *unsupported = false;
    while (len && (*s == ' ' || *s == '\t')) s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    if (len > 4 && memcmp(s, "@at ", 4) == 0) {
        s += 4;
        len -= 4;
        while (len && *s == ' ') s++, len--;
        return fx_delay_parse_rfc3339(s, len, due_ms);
    }
    if (unsupported && len && (s[0] == '@' || (s[0] >= '0' && s[0] <= '9') || s[0] == '*'))
        *unsupported = true;
    return fx_seterr(FX_EINVAL, "only \"@at <RFC 3339 time>\" is supported");
}

fx_err fx_delay_parse_duration(const char *s, size_t len, int64_t *ms)
{
    if (!len) return fx_seterr(FX_EINVAL, "empty duration");
    double total_ns = 0;
    size_t i = 0;
    while (i < len) {
        size_t n0 = i;
        double v = 0, scale = 0;
        while (i < len && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) {
            if (s[i] == '.') {
                if (scale) return fx_seterr(FX_EINVAL, "bad number in duration");
                scale = 0.1;
            } else if (scale) {
                v += (s[i] - '0') * scale;
                scale /= 10;
            } else {
                v = v * 10 + (s[i] - '0');
            }
            i++;
        }
        if (i == n0 || (i == n0 + 1 && s[n0] == '.')) return fx_seterr(FX_EINVAL, "duration without a number");
        double unit;
        if (i + 2 <= len && memcmp(s + i, "ms", 2) == 0) unit = 1e6, i += 2;
        else if (i + 2 <= len && (memcmp(s + i, "us", 2) == 0 || memcmp(s + i, "\xc2\xb5", 2) == 0)) {
            unit = 1e3;
            i += 2;
            if (s[i - 1] == '\xb5' && i < len && s[i] == 's') i++;
        } else if (i + 2 <= len && memcmp(s + i, "ns", 2) == 0) unit = 1, i += 2;
        else if (i < len && s[i] == 'h') unit = 3600e9, i++;
        else if (i < len && s[i] == 'm') unit = 60e9, i++;
        else if (i < len && s[i] == 's') unit = 1e9, i++;
        else return fx_seterr(FX_EINVAL, "duration needs a unit (h, m, s, ms, us, ns)");
        total_ns += v * unit;
        if (total_ns > 100.0 * 365 * 86400e9) return fx_seterr(FX_EINVAL, "duration too long");
    }
    int64_t whole = (int64_t)(total_ns / 1e6);
    if ((double)whole * 1e6 < total_ns) whole++;
    *ms = whole;
    return FX_OK;
}

/* ---- keys ---------------------------------------------------------------------------------- */

static int chan_prefix(const fx_delay *dl, const char *chan, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s/delay/%s/", dl->c->keys.root, chan);
    return n > 0 && (size_t)n < cap ? n : -1;
}

static int entry_key(const fx_delay *dl, const char *chan, int64_t due, uint64_t id, char *out,
                     size_t cap)
{
    int n = snprintf(out, cap, "%s/delay/%s/%013" PRId64 "/%016" PRIx64, dl->c->keys.root, chan,
                     due, id);
    return n > 0 && (size_t)n < cap ? n : -1;
}

static bool valid_chan(const char *chan)
{
    size_t n = chan ? strlen(chan) : 0;
    if (!n || n > 200) return false;
    for (size_t i = 0; i < n; i++)
        if (chan[i] == '/' || chan[i] == ' ' || chan[i] == '.' || chan[i] == '*' || chan[i] == '>')
            return false;
    return true;
}

static int tmo(const fx_delay *dl, int timeout_ms)
{
    return timeout_ms > 0 ? timeout_ms : dl->c->op_timeout_ms;
}

/* A channel's whole index as a key range: its prefix and the prefix's range end. */
typedef struct chan_span {
    char from[KEY_CAP];
    uint8_t end[KEY_CAP];
    size_t pl, el;
} chan_span;

static fx_err chan_span_of(const fx_delay *dl, const char *chan, chan_span *sp)
{
    if (!valid_chan(chan)) return fx_seterr(FX_EINVAL, "delay: bad channel name");
    int pl = chan_prefix(dl, chan, sp->from, sizeof sp->from);
    if (pl < 0) return fx_seterr(FX_EINVAL, "delay: key too long");
    sp->pl = (size_t)pl;
    sp->el = fx_prefix_end((fx_slice){sp->from, sp->pl}, sp->end);
    return FX_OK;
}

/* One range read of the index, as an operation of the MQ client (refused once it closes). */
static fx_err index_range(fx_delay *dl, const fx_range_req *rq, fx_range_resp *rr, int timeout_ms)
{
    fx_err e = fx__mq_op_enter(dl->c);
    if (e) return e;
    e = fx_etcd_range(dl->c->etcd, rq, rr, tmo(dl, timeout_ms));
    fx__mq_op_leave(dl->c);
    return e;
}

/* ---- index --------------------------------------------------------------------------------- */

fx_err fx_delay_chan_lease(fx_delay *dl, int64_t mpmc, int64_t *lease)
{
    fx_mq_key mk;
    fx_err e = fx_mq_key_mpmc_meta(&dl->c->keys, mpmc, &mk);
    if (e) return e;
    if ((e = fx__mq_op_enter(dl->c))) return e;
    fx_kv kv = {0};
    e = fx_etcd_get(dl->c->etcd, (fx_slice){mk.s, mk.len}, &kv, dl->c->op_timeout_ms);
    fx__mq_op_leave(dl->c);
    if (e) return e;
    fx_mq_mpmc_meta mm;
    e = fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &mm);
    fx_kv_free(&kv);
    if (e) return e;
    *lease = mm.metadata_lease_id;
    return FX_OK;
}

fx_err fx_delay_put_batch(fx_delay *dl, const fx_delay_put *p, size_t n, size_t *stored,
                          int timeout_ms)
{
    *stored = 0;
    fx_op ops[FX_DELAY_TXN_OPS];
    char(*keys)[KEY_CAP] = malloc(FX_DELAY_TXN_OPS * sizeof *keys);
    if (!keys) return fx_seterr(FX_ENOMEM, "delay: out of memory");
    fx_err e = fx__mq_op_enter(dl->c);
    if (e) {
        free(keys);
        return e;
    }
    int64_t deadline = fx_now_ms() + tmo(dl, timeout_ms);
    for (size_t at = 0; at < n && !e;) {
        size_t k = n - at < FX_DELAY_TXN_OPS ? n - at : FX_DELAY_TXN_OPS;
        for (size_t i = 0; i < k && !e; i++) {
            const fx_delay_put *x = &p[at + i];
            if (!valid_chan(x->chan) || x->due_ms < 0 || x->due_ms > FX_DELAY_DUE_MAX || x->lease <= 0) {
                e = fx_seterr(FX_EINVAL, "delay: bad entry");
                break;
            }
            int kl = entry_key(dl, x->chan, x->due_ms, x->id, keys[i], KEY_CAP);
            if (kl < 0) {
                e = fx_seterr(FX_EINVAL, "delay: key too long");
                break;
            }
            ops[i] = (fx_op){.type = FX_OP_PUT,
                             .u.put = {.key = {keys[i], (size_t)kl}, .value = x->rec, .lease = x->lease}};
        }
        if (e) break;
        int left = (int)fx_ms_left(deadline);
        if (left <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "delay: put deadline passed");
            break;
        }
        fx_txn_req t = {.success = ops, .n_success = k};
        e = fx_etcd_txn(dl->c->etcd, &t, NULL, left);
        if (!e) {
            at += k;
            *stored = at;
        }
    }
    fx__mq_op_leave(dl->c);
    free(keys);
    return e;
}

static bool parse_entry_key(const uint8_t *k, size_t kl, size_t plen, int64_t *due, char *id)
{
    if (kl != plen + FX_DELAY_DUE_DIGITS + 1 + FX_DELAY_ID_HEX || k[plen + FX_DELAY_DUE_DIGITS] != '/')
        return false;
    int64_t v = 0;
    for (size_t i = 0; i < FX_DELAY_DUE_DIGITS; i++) {
        uint8_t c = k[plen + i];
        if (c < '0' || c > '9') return false;
        v = v * 10 + (c - '0');
    }
    memcpy(id, k + plen + FX_DELAY_DUE_DIGITS + 1, FX_DELAY_ID_HEX);
    id[FX_DELAY_ID_HEX] = '\0';
    *due = v;
    return true;
}

fx_err fx_delay_scan(fx_delay *dl, const char *chan, int64_t now_ms, size_t limit,
                     fx_delay_entry **out, size_t *n, bool *more, int timeout_ms)
{
    *out = NULL;
    *n = 0;
    *more = false;
    if (!valid_chan(chan)) return fx_seterr(FX_EINVAL, "delay: bad channel name");
    if (limit == 0) return FX_OK;
    if (limit > FX_DELAY_SCAN_MAX) limit = FX_DELAY_SCAN_MAX;
    if (now_ms < 0) return FX_OK;
    if (now_ms >= FX_DELAY_DUE_MAX) now_ms = FX_DELAY_DUE_MAX - 1;
    char from[KEY_CAP], to[KEY_CAP];
    int pl = chan_prefix(dl, chan, from, sizeof from);
    if (pl < 0) return fx_seterr(FX_EINVAL, "delay: key too long");
    int tl = snprintf(to, sizeof to, "%s%013" PRId64, from, now_ms + 1);
    if (tl < 0 || (size_t)tl >= sizeof to) return fx_seterr(FX_EINVAL, "delay: key too long");
    fx_range_req rq = {.key = {from, (size_t)pl}, .range_end = {to, (size_t)tl},
                       .limit = (int64_t)limit, .sort_order = FX_SORT_ASCEND,
                       .sort_target = FX_SORT_KEY};
    fx_range_resp rr = {0};
    fx_err e = index_range(dl, &rq, &rr, timeout_ms);
    if (e) return e;
    fx_delay_entry *v = rr.n_kvs ? calloc(rr.n_kvs, sizeof *v) : NULL;
    if (rr.n_kvs && !v) {
        fx_range_resp_free(&rr);
        return fx_seterr(FX_ENOMEM, "delay: out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < rr.n_kvs; i++) {
        fx_kv *kv = &rr.kvs[i];
        if (!parse_entry_key(kv->key.data, kv->key.len, (size_t)pl, &v[k].due_ms, v[k].id))
            continue; /* not ours: left alone */
        v[k].key = kv->key;
        v[k].rec = kv->value;
        kv->key = (fx_bytes){0};
        kv->value = (fx_bytes){0};
        k++;
    }
    *more = rr.more;
    fx_range_resp_free(&rr);
    *out = v;
    *n = k;
    if (!k) {
        free(v);
        *out = NULL;
    }
    return FX_OK;
}

void fx_delay_entries_free(fx_delay_entry *e, size_t n)
{
    for (size_t i = 0; e && i < n; i++) {
        fx_bytes_free(&e[i].key);
        fx_bytes_free(&e[i].rec);
    }
    free(e);
}

fx_err fx_delay_remove(fx_delay *dl, const fx_delay_entry *en, size_t n, int timeout_ms)
{
    fx_op ops[FX_DELAY_TXN_OPS];
    fx_err e = fx__mq_op_enter(dl->c);
    if (e) return e;
    int64_t deadline = fx_now_ms() + tmo(dl, timeout_ms);
    for (size_t at = 0; at < n && !e;) {
        size_t k = n - at < FX_DELAY_TXN_OPS ? n - at : FX_DELAY_TXN_OPS;
        for (size_t i = 0; i < k; i++)
            ops[i] = (fx_op){.type = FX_OP_DELETE,
                             .u.del = {.key = {en[at + i].key.data, en[at + i].key.len}}};
        int left = (int)fx_ms_left(deadline);
        if (left <= 0) {
            e = fx_seterr(FX_ETIMEDOUT, "delay: remove deadline passed");
            break;
        }
        fx_txn_req t = {.success = ops, .n_success = k};
        e = fx_etcd_txn(dl->c->etcd, &t, NULL, left);
        at += k;
    }
    fx__mq_op_leave(dl->c);
    return e;
}

fx_err fx_delay_next_due(fx_delay *dl, const char *chan, int64_t *due_ms, int timeout_ms)
{
    *due_ms = -1;
    chan_span sp;
    fx_err e = chan_span_of(dl, chan, &sp);
    if (e) return e;
    fx_range_req rq = {.key = {sp.from, sp.pl}, .range_end = {sp.end, sp.el}, .limit = 1,
                       .keys_only = true, .sort_order = FX_SORT_ASCEND, .sort_target = FX_SORT_KEY};
    fx_range_resp rr = {0};
    if ((e = index_range(dl, &rq, &rr, timeout_ms))) return e;
    char id[FX_DELAY_ID_HEX + 1];
    if (rr.n_kvs)
        if (!parse_entry_key(rr.kvs[0].key.data, rr.kvs[0].key.len, sp.pl, due_ms, id))
            *due_ms = -1;
    fx_range_resp_free(&rr);
    return FX_OK;
}

fx_err fx_delay_count(fx_delay *dl, const char *chan, int64_t *n, int timeout_ms)
{
    *n = 0;
    chan_span sp;
    fx_err e = chan_span_of(dl, chan, &sp);
    if (e) return e;
    fx_range_req rq = {.key = {sp.from, sp.pl}, .range_end = {sp.end, sp.el}, .count_only = true};
    fx_range_resp rr = {0};
    if ((e = index_range(dl, &rq, &rr, timeout_ms))) return e;
    *n = rr.count;
    fx_range_resp_free(&rr);
    return FX_OK;
}

fx_err fx_delay_purge(fx_delay *dl, const char *chan, int timeout_ms)
{
    chan_span sp;
    fx_err e = chan_span_of(dl, chan, &sp);
    if (e) return e;
    fx_del_req rq = {.key = {sp.from, sp.pl}, .range_end = {sp.end, sp.el}};
    e = fx__mq_op_enter(dl->c);
    if (e) return e;
    e = fx_etcd_delete(dl->c->etcd, &rq, NULL, tmo(dl, timeout_ms));
    fx__mq_op_leave(dl->c);
    return e;
}

/* ---- the mover's lock ---------------------------------------------------------------------- */

static fx_err lock_lease(fx_delay *dl, int timeout_ms)
{
    if (dl->lease && !fx_lease_is_expired(dl->lease)) return FX_OK;
    fx_lease_release(dl->lease);
    dl->lease = NULL;
    int64_t id = 0, ttl = 0;
    fx_err e = fx_etcd_lease_grant(dl->c->etcd, dl->lock_ttl_s, 0, &id, &ttl, timeout_ms);
    if (e) return e;
    fx_lease_reg_opts ro = {.skip_probe = true};
    e = fx_lease_register(dl->c->leases, &dl->c->etcd_backend, ttl > 0 ? ttl : dl->lock_ttl_s, id,
                          &ro, &dl->lease);
    if (e) {
        fx_etcd_lease_revoke(dl->c->etcd, id, timeout_ms);
        return e;
    }
    snprintf(dl->lock_val, sizeof dl->lock_val, "%s/%016" PRIx64, dl->owner, (uint64_t)id);
    return FX_OK;
}

fx_err fx_delay_lock(fx_delay *dl, const char *chan, bool *held, int timeout_ms)
{
    *held = false;
    if (!valid_chan(chan)) return fx_seterr(FX_EINVAL, "delay: bad channel name");
    char key[KEY_CAP];
    int kl = snprintf(key, sizeof key, "%s/delay_lock/%s", dl->c->keys.root, chan);
    if (kl < 0 || (size_t)kl >= sizeof key) return fx_seterr(FX_EINVAL, "delay: key too long");
    fx_err e = fx__mq_op_enter(dl->c);
    if (e) return e;
    int t = tmo(dl, timeout_ms);
    if ((e = lock_lease(dl, t))) goto out;
    int64_t lid = fx_lease_id(dl->lease);
    fx_slice k = {key, (size_t)kl};
    fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = k, .num = 0};
    fx_op put = {.type = FX_OP_PUT, .u.put = {.key = k, .value = FX_SLICE_STR(dl->lock_val), .lease = lid}};
    fx_op get = {.type = FX_OP_RANGE, .u.range = {.key = k}};
    /* Cheap path first: a read tells whether we hold it already. */
    fx_kv kv = {0};
    e = fx_etcd_get(dl->c->etcd, k, &kv, t);
    if (e == FX_ENOTFOUND) {
        fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1,
                         .failure = &get, .n_failure = 1};
        fx_txn_resp tr = {0};
        e = fx_etcd_txn(dl->c->etcd, &tx, &tr, t);
        if (!e && tr.succeeded) {
            *held = true;
        } else if (!e && tr.n_responses && tr.responses[0].u.range.n_kvs) {
            fx_kv *o = &tr.responses[0].u.range.kvs[0];
            *held = o->lease == lid && o->value.len == strlen(dl->lock_val) &&
                    memcmp(o->value.data, dl->lock_val, o->value.len) == 0;
        }
        fx_txn_resp_free(&tr);
    } else if (!e) {
        *held = kv.lease == lid && kv.value.len == strlen(dl->lock_val) &&
                memcmp(kv.value.data, dl->lock_val, kv.value.len) == 0;
        fx_kv_free(&kv);
    }
    /* Fenced: only while etcd confirms the lease now. */
    if (*held && fx_lease_confirmed_until_ms(dl->lease) <= fx_now_ms()) *held = false;
out:
    fx__mq_op_leave(dl->c);
    return e;
}

void fx_delay_unlock(fx_delay *dl, const char *chan, int timeout_ms)
{
    if (!dl->lease || !valid_chan(chan)) return;
    char key[KEY_CAP];
    int kl = snprintf(key, sizeof key, "%s/delay_lock/%s", dl->c->keys.root, chan);
    if (kl < 0 || (size_t)kl >= sizeof key) return;
    if (fx__mq_op_enter(dl->c)) return;
    fx_slice k = {key, (size_t)kl};
    fx_cmp cmp = {.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL, .key = k,
                  .value = FX_SLICE_STR(dl->lock_val)};
    fx_op del = {.type = FX_OP_DELETE, .u.del = {.key = k}};
    fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &del, .n_success = 1};
    fx_etcd_txn(dl->c->etcd, &tx, NULL, tmo(dl, timeout_ms));
    fx__mq_op_leave(dl->c);
}

void fx_delay_release_lease(fx_delay *dl)
{
    if (!dl) return;
    fx_lease_release(dl->lease);
    dl->lease = NULL;
}

int64_t fx_delay_lock_lease(fx_delay *dl)
{
    if (!dl->lease || fx_lease_is_expired(dl->lease)) return 0;
    return fx_lease_confirmed_until_ms(dl->lease) > fx_now_ms() ? fx_lease_id(dl->lease) : 0;
}
