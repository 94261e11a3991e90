/* redrive.c -- dead letters back to their channel: the engine and the bridge's API call
 * (contract: redrive.h). */
#include "redrive.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "admin.h"
#include "capture.h"
#include "dmctx.h"

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

__attribute__((format(printf, 2, 3)))
static void say(const fx_redrive_opts *o, const char *fmt, ...)
{
    if (!o->note) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    o->note(o->arg, buf);
}

static const char *hdr_or(natsMsg *m, const char *k, const char *dflt)
{
    const char *v = NULL;
    return natsMsgHeader_Get(m, k, &v) == NATS_OK && v ? v : dflt;
}

static uint64_t hdr_u64(natsMsg *m, const char *k)
{
    const char *v = hdr_or(m, k, NULL);
    if (!v) return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    return errno || end == v || *end || *v == '-' ? 0 : (uint64_t)x;
}

static void nak_rest(natsConnection *nc, natsSubscription *sub)
{
    natsMsg *m = NULL;
    while (natsSubscription_NextMsg(&m, sub, 1) == NATS_OK) { /* back to the DLQ at once */
        const char *r = natsMsg_GetReply(m);
        if (r && *r) natsConnection_PublishString(nc, r, "-NAK");
        natsMsg_Destroy(m);
    }
}

/* seqs of the DLQ seen in this redrive: open addressing, 0 = empty */
typedef struct seqset {
    uint64_t *k;
    uint8_t *v; /* 1 in flight, 2 moved */
    size_t cap;
} seqset;

static uint8_t *seq_slot(seqset *ss, uint64_t seq, bool add)
{
    size_t i = (size_t)(seq * 0x9E3779B97F4A7C15ULL) & (ss->cap - 1);
    for (size_t probe = 0; probe < ss->cap; probe++, i = (i + 1) & (ss->cap - 1)) {
        if (ss->k[i] == seq) return &ss->v[i];
        if (ss->k[i] == 0) {
            if (!add) return NULL;
            ss->k[i] = seq;
            return &ss->v[i];
        }
    }
    return NULL;
}

typedef enum { SL_FREE = 0, SL_PUB, SL_ACK } slot_state;
typedef struct rslot {
    slot_state st;
    uint32_t gen;
    natsMsg *letter;
    uint64_t seq;
    int64_t due;
} rslot;

typedef struct rstats {
    int64_t moved, failed, uncertain, ack_unconfirmed, skipped, again;
} rstats;

static bool copy_header(const char *k)
{
    return strncasecmp(k, "Fluxon-", 7) != 0 && strcasecmp(k, "Nats-Msg-Id") != 0 &&
           strncasecmp(k, "Nats-Expected-", 14) != 0;
}

/* The letter again as a publish to its original subject, reply inbox.p.<slot>.<gen>. */
static natsStatus redrive_publish(natsConnection *nc, natsMsg *letter, const char *to, const char *inbox,
                                  size_t slot, uint32_t gen)
{
    const char *subj = hdr_or(letter, "Fluxon-Subject", NULL);
    char reply[256], cnt[32];
    snprintf(reply, sizeof reply, "%s.p.%zu.%" PRIu32, inbox, slot, gen);
    natsMsg *nm = NULL;
    int len = natsMsg_GetDataLength(letter);
    natsStatus s = natsMsg_Create(&nm, subj, reply, natsMsg_GetData(letter), len > 0 ? len : 0);
    const char **keys = NULL;
    int nk = 0;
    if (s == NATS_OK && natsMsgHeader_Keys(letter, &keys, &nk) == NATS_OK) {
        for (int i = 0; s == NATS_OK && i < nk; i++) {
            if (!copy_header(keys[i])) continue;
            const char **vals = NULL;
            int nv = 0;
            if (natsMsgHeader_Values(letter, keys[i], &vals, &nv) != NATS_OK) continue;
            for (int j = 0; s == NATS_OK && j < nv; j++) s = natsMsgHeader_Add(nm, keys[i], vals[j]);
            free((void *)vals);
        }
        free((void *)keys);
    }
    uint64_t times = hdr_u64(letter, FX_REDRIVE_HDR);
    snprintf(cnt, sizeof cnt, "%" PRIu64, (times < 1000000000u ? times : (uint64_t)1000000000u) + 1);
    if (s == NATS_OK) s = natsMsgHeader_Set(nm, FX_REDRIVE_HDR, cnt);
    if (s == NATS_OK) s = natsMsgHeader_Set(nm, "Nats-Expected-Stream", to);
    if (s == NATS_OK) s = natsConnection_PublishMsg(nc, nm);
    natsMsg_Destroy(nm);
    return s;
}

/* A PubAck for `to`? Prints why not. */
static bool puback_ok(const fx_redrive_opts *o, natsMsg *r, const char *to)
{
    if (natsMsg_IsNoResponders(r)) {
        say(o, "no bridge captures the letter's subject");
        return false;
    }
    int len = natsMsg_GetDataLength(r);
    cJSON *j = cJSON_ParseWithLength(natsMsg_GetData(r) ? natsMsg_GetData(r) : "", (size_t)(len > 0 ? len : 0));
    const cJSON *st = j ? cJSON_GetObjectItemCaseSensitive(j, "stream") : NULL;
    bool ok = j && !cJSON_GetObjectItemCaseSensitive(j, "error") && cJSON_IsString(st) &&
              strcmp(st->valuestring, to) == 0;
    if (!ok)
        say(o, "publish refused: %.*s", len > 300 ? 300 : len,
            natsMsg_GetData(r) ? natsMsg_GetData(r) : "");
    cJSON_Delete(j);
    return ok;
}

static void ack_letter(natsConnection *nc, rslot *sl, const char *inbox, size_t k, int64_t now, int64_t tmo)
{
    char reply[256];
    snprintf(reply, sizeof reply, "%s.a.%zu.%" PRIu32, inbox, k, sl->gen);
    natsConnection_PublishRequestString(nc, natsMsg_GetReply(sl->letter), reply, "+ACK");
    sl->st = SL_ACK;
    sl->due = now + tmo;
}

static void slot_free(rslot *sl)
{
    natsMsg_Destroy(sl->letter);
    sl->letter = NULL;
    sl->st = SL_FREE;
    sl->gen++;
}

natsStatus fx_redrive_run(natsConnection *nc, const fx_redrive_opts *o, fx_redrive_result *out)
{
    memset(out, 0, sizeof *out);
    const char *dlq = o->dlq, *to = o->to, *subject = o->subject;
    char inbox[128];
    int64_t max = o->max > 0 ? o->max : FX_REDRIVE_MAX_DEFAULT;
    if (max > FX_REDRIVE_MAX_CAP) max = FX_REDRIVE_MAX_CAP;
    int64_t rate = o->rate > 0 ? o->rate : FX_REDRIVE_RATE_DEFAULT;
    if (rate > FX_REDRIVE_RATE_CAP) rate = FX_REDRIVE_RATE_CAP;
    int64_t idle = o->idle_ms > 0 ? o->idle_ms : FX_REDRIVE_IDLE_DEFAULT_MS;
    int64_t tmo = o->timeout_ms > 0 ? o->timeout_ms : 2000;
    int64_t t0 = mono_ms(), deadline = t0 + (o->deadline_ms > 0 ? o->deadline_ms : FX_REDRIVE_DEADLINE_DEFAULT_MS);
    natsInbox *ib = NULL;
    if (natsInbox_Create(&ib) != NATS_OK) return NATS_NO_MEMORY;
    snprintf(inbox, sizeof inbox, "%s", (const char *)ib);
    natsInbox_Destroy(ib);
    char inbox_all[140];
    snprintf(inbox_all, sizeof inbox_all, "%s.>", inbox);
    seqset ss = {0};
    ss.cap = 1;
    while (ss.cap < (size_t)max * 2 + 2 * FX_REDRIVE_WINDOW) ss.cap <<= 1;
    ss.k = calloc(ss.cap, sizeof *ss.k);
    ss.v = calloc(ss.cap, 1);
    natsSubscription *letters = NULL, *replies = NULL;
    natsStatus s = ss.k && ss.v ? NATS_OK : NATS_NO_MEMORY;
    if (s == NATS_OK) s = natsConnection_SubscribeSync(&replies, nc, inbox_all);
    if (s == NATS_OK) s = natsConnection_SubscribeSync(&letters, nc, subject);
    if (s == NATS_OK) s = natsSubscription_SetPendingLimits(letters, 1 << 20, 512 << 20);
    if (s == NATS_OK) s = natsConnection_FlushTimeout(nc, tmo);
    if (s != NATS_OK) {
        natsSubscription_Destroy(letters);
        natsSubscription_Destroy(replies);
        free(ss.k);
        free(ss.v);
        return s;
    }
    rslot slots[FX_REDRIVE_WINDOW];
    memset(slots, 0, sizeof slots);
    size_t window = rate < FX_REDRIVE_WINDOW ? (size_t)rate : FX_REDRIVE_WINDOW;
    int64_t taken = 0, last_letter = t0, busy = 0, last_backlog_check = 0;
    double next_at = (double)t0, gap = 1000.0 / (double)rate;
    bool stopping = false, timed_out = false;
    for (;;) {
        int64_t now = mono_ms();
        if (!stopping && o->stopped && o->stopped(o->arg)) stopping = out->interrupted = true;
        if (now >= deadline && !stopping) {
            stopping = timed_out = true;
            say(o, "deadline reached");
        }
        if (busy == 0 && (stopping || taken >= max)) break;
        if (busy == 0 && now - last_letter >= idle) {
            /* Idle: done when the DLQ is empty; letters held elsewhere (a claim releasing them,
             * another consumer of the DLQ) are waited for up to FX_REDRIVE_HELD_MS more. */
            if (now - last_letter >= idle + FX_REDRIVE_HELD_MS || now >= last_backlog_check + 500) {
                int64_t bl = o->backlog ? o->backlog(o->arg) : 0;
                last_backlog_check = mono_ms();
                if (bl == 0 || now - last_letter >= idle + FX_REDRIVE_HELD_MS) {
                    if (bl > 0)
                        say(o, "%" PRId64 " letter(s) still in %s did not come (another consumer holds them?)", bl, dlq);
                    break;
                }
            }
        }
        if (now >= deadline + tmo * 2) break; /* in-flight answers: bounded too */
        /* take one letter when the rate, the window and --max allow, and no publish waits for
         * its PubAck longer than FX_REDRIVE_STALL_MS (a bridge that died: few letters are left
         * uncertain) */
        bool stalled = false;
        for (size_t k = 0; k < window && !stalled; k++)
            stalled = slots[k].st == SL_PUB && now - (slots[k].due - tmo) > FX_REDRIVE_STALL_MS;
        if (!stopping && !stalled && taken < max && (double)now >= next_at) {
            size_t k = 0;
            while (k < window && slots[k].st != SL_FREE) k++;
            natsMsg *m = NULL;
            if (k < window && natsSubscription_NextMsg(&m, letters, 1) == NATS_OK) {
                last_letter = now;
                const char *rep = natsMsg_GetReply(m);
                uint64_t seq = hdr_u64(m, "Fluxon-Seq");
                uint8_t *st = seq ? seq_slot(&ss, seq, true) : NULL;
                if (!rep || !*rep || !hdr_or(m, "Fluxon-Subject", NULL) || !st) {
                    out->skipped++; /* not a dead letter of the bridge: left alone */
                    natsMsg_Destroy(m);
                } else if (*st) { /* the same letter again (its DLQ ack_wait expired) */
                    out->again++;
                    if (*st == 2) natsConnection_PublishString(nc, rep, "+ACK");
                    natsMsg_Destroy(m);
                } else {
                    rslot *sl = &slots[k];
                    sl->letter = m;
                    sl->seq = seq;
                    if (redrive_publish(nc, m, to, inbox, k, sl->gen) != NATS_OK) {
                        say(o, "publish failed");
                        out->failed++;
                        slot_free(sl);
                        stopping = true;
                    } else {
                        *st = 1;
                        sl->st = SL_PUB;
                        sl->due = now + tmo;
                        busy++;
                        taken++;
                        next_at = next_at + gap < (double)now - gap ? (double)now : next_at + gap;
                    }
                }
                continue;
            }
        }
        /* answers: PubAcks and DLQ acks */
        natsMsg *a = NULL;
        s = natsSubscription_NextMsg(&a, replies, 5);
        now = mono_ms();
        if (s == NATS_OK) {
            const char *sj = natsMsg_GetSubject(a) + strlen(inbox);
            char kind = 0;
            size_t k = 0;
            uint32_t gen = 0;
            if (sscanf(sj, ".%c.%zu.%" SCNu32, &kind, &k, &gen) == 3 && k < window && slots[k].gen == gen) {
                rslot *sl = &slots[k];
                if (kind == 'p' && sl->st == SL_PUB) {
                    if (puback_ok(o, a, to)) {
                        ack_letter(nc, sl, inbox, k, now, tmo);
                    } else {
                        out->failed++; /* not stored: the letter stays in the DLQ */
                        *seq_slot(&ss, sl->seq, true) = 0;
                        slot_free(sl);
                        busy--;
                        stopping = true;
                    }
                } else if (kind == 'a' && sl->st == SL_ACK) {
                    int len = natsMsg_GetDataLength(a);
                    if (len <= 0 && !natsMsg_IsNoResponders(a))
                        out->moved++;
                    else
                        out->ack_unconfirmed++;
                    *seq_slot(&ss, sl->seq, true) = 2; /* stored in the target either way */
                    slot_free(sl);
                    busy--;
                }
            }
            natsMsg_Destroy(a);
        }
        for (size_t k = 0; k < window; k++) { /* answers that did not come */
            rslot *sl = &slots[k];
            if (sl->st == SL_FREE || now < sl->due) continue;
            if (sl->st == SL_PUB) {
                out->uncertain++; /* may be stored: the letter stays in the DLQ, a duplicate */
                stopping = true;
                *seq_slot(&ss, sl->seq, true) = 0; /* a copy again: published again, never lost */
            } else {
                out->ack_unconfirmed++;
                *seq_slot(&ss, sl->seq, true) = 2; /* stored: a copy again is only acked */
            }
            slot_free(sl);
            busy--;
        }
    }
    for (size_t k = 0; k < window; k++)
        if (slots[k].st != SL_FREE) {
            out->uncertain++;
            slot_free(&slots[k]);
        }
    nak_rest(nc, letters);
    natsSubscription_Unsubscribe(letters);
    natsSubscription_Destroy(letters);
    natsSubscription_Unsubscribe(replies);
    natsSubscription_Destroy(replies);
    natsConnection_FlushTimeout(nc, tmo);
    free(ss.k);
    free(ss.v);
    out->ms = mono_ms() - t0;
    out->timed_out = timed_out;
    return NATS_OK;
}

int fx_redrive_json(const char *dlq, const char *to, const fx_redrive_result *r, char *out,
                    size_t cap)
{
    int n = snprintf(out, cap,
                     "{\"dlq\":\"%s\",\"to\":\"%s\",\"moved\":%" PRId64 ",\"failed\":%" PRId64
                     ",\"uncertain\":%" PRId64 ",\"ack_unconfirmed\":%" PRId64 ",\"skipped\":%" PRId64
                     ",\"seen_again\":%" PRId64 ",\"ms\":%" PRId64 "%s%s}",
                     dlq, to, r->moved, r->failed, r->uncertain, r->ack_unconfirmed, r->skipped,
                     r->again, r->ms, r->timed_out ? ",\"timed_out\":true" : "",
                     r->interrupted ? ",\"interrupted\":true" : "");
    return n > 0 && (size_t)n < cap ? n : -1;
}

/* ---- bridge side: $FLUXON.API.CHANNEL.REDRIVE.<dlq> --------------------------------------------- */

/* One redrive per bridge process at a time (the daemon is one per process). */
static struct {
    pthread_mutex_t mu;
    bool running, joinable, closed; /* closed: the bridge drains, no new redrive */
    pthread_t thr;
    atomic_bool stop;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct rd_job {
    fx_daemon *d;
    char dlq[160], to[160], subject[400], reply[512];
    int64_t max, rate, idle_ms, deadline_ms;
} rd_job;

static int64_t job_backlog(void *arg)
{
    rd_job *j = arg;
    int64_t b = -1;
    return fx_admin_channel_backlog(j->d->mq, j->dlq, &b) == FX_OK ? b : -1;
}

static bool job_stopped(void *arg)
{
    rd_job *j = arg;
    return atomic_load(&R.stop) || atomic_load(&j->d->stopping);
}

static void job_note(void *arg, const char *line)
{
    rd_job *j = arg;
    FX_WRN("redrive %s -> %s: %s", j->dlq, j->to, line);
}

static void *job_main(void *arg)
{
    fx_thread_name("fx-redrive");
    rd_job *j = arg;
    fx_redrive_opts o = {.dlq = j->dlq, .to = j->to, .subject = j->subject, .max = j->max,
                         .rate = j->rate, .idle_ms = j->idle_ms, .deadline_ms = j->deadline_ms,
                         .timeout_ms = 2000, .backlog = job_backlog, .stopped = job_stopped,
                         .note = job_note, .arg = j};
    FX_INF("redrive %s -> %s: started (API request; at most %" PRId64 " letters, %" PRId64 "/s)",
           j->dlq, j->to, j->max, j->rate);
    fx_redrive_result r;
    /* a connection of its own: the claim of its subscription is interest like any client's */
    natsConnection *nc = NULL;
    fx_err e = j->d->nats_connect_aux(j->d, "fluxon-bridge-redrive", &nc);
    natsStatus s = e ? NATS_ERR : fx_redrive_run(nc, &o, &r);
    if (nc) {
        natsConnection_FlushTimeout(nc, 2000);
        natsConnection_Destroy(nc); /* closes */
    }
    char buf[640];
    if (e || s != NATS_OK) {
        snprintf(buf, sizeof buf, "redrive could not start: %s",
                 e ? fx_err_detail() : natsStatus_GetText(s));
        dm_reply_error(j->d, j->reply, 503, buf);
    } else {
        int n = fx_redrive_json(j->dlq, j->to, &r, buf, sizeof buf);
        if (n > 0) natsConnection_Publish(j->d->nc, j->reply, buf, n);
        FX_INF("redrive %s -> %s: moved %" PRId64 ", failed %" PRId64 ", uncertain %" PRId64
               ", ack unconfirmed %" PRId64 " in %" PRId64 " ms",
               j->dlq, j->to, r.moved, r.failed, r.uncertain, r.ack_unconfirmed, r.ms);
    }
    free(j);
    pthread_mutex_lock(&R.mu);
    R.running = false;
    pthread_mutex_unlock(&R.mu);
    return NULL;
}

static bool jint(const cJSON *root, const char *k, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, k);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < (double)lo || v->valuedouble > (double)hi) return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

void dm_on_redrive(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    const char *reply = natsMsg_GetReply(m);
    const char *subj = natsMsg_GetSubject(m);
    static const char pre[] = "$FLUXON.API.CHANNEL.REDRIVE.";
    if (!reply || !*reply || !subj || strncmp(subj, pre, sizeof pre - 1) != 0) {
        natsMsg_Destroy(m);
        return;
    }
    rd_job *j = calloc(1, sizeof *j);
    if (!j) {
        dm_reply_error(d, reply, 500, "bridge out of memory");
        natsMsg_Destroy(m);
        return;
    }
    j->d = d;
    snprintf(j->reply, sizeof j->reply, "%s", reply);
    snprintf(j->dlq, sizeof j->dlq, "%s", subj + sizeof pre - 1);
    j->max = FX_REDRIVE_MAX_DEFAULT;
    j->rate = FX_REDRIVE_RATE_DEFAULT;
    j->idle_ms = FX_REDRIVE_IDLE_DEFAULT_MS;
    j->deadline_ms = FX_REDRIVE_DEADLINE_DEFAULT_MS;
    int len = natsMsg_GetDataLength(m);
    const char *data = natsMsg_GetData(m);
    int code = 0;
    const char *why = NULL;
    if (len > 0 && data) {
        cJSON *root = cJSON_ParseWithLength(data, (size_t)len);
        const cJSON *to = root ? cJSON_GetObjectItemCaseSensitive(root, "to") : NULL;
        if (!cJSON_IsObject(root) || (to && (!cJSON_IsString(to) || !*to->valuestring ||
                                             strlen(to->valuestring) >= sizeof j->to)) ||
            !jint(root, "max", 1, FX_REDRIVE_MAX_CAP, &j->max) ||
            !jint(root, "rate", 1, FX_REDRIVE_RATE_CAP, &j->rate) ||
            !jint(root, "wait_ms", 1, FX_REDRIVE_DEADLINE_CAP_MS, &j->idle_ms) ||
            !jint(root, "deadline_ms", 1, FX_REDRIVE_DEADLINE_CAP_MS, &j->deadline_ms)) {
            code = 400;
            why = "bad request: want {\"to\":\"<channel>\",\"max\":1..100000,\"rate\":1..10000,"
                  "\"wait_ms\":N,\"deadline_ms\":N} (every field optional)";
        } else if (to) {
            snprintf(j->to, sizeof j->to, "%s", to->valuestring);
        }
        cJSON_Delete(root);
    }
    if (!code) { /* a dead-letter channel of this bridge: its delivery prefix */
        pthread_rwlock_rdlock(&d->reg);
        dm_chan *ch = dm_find_chan_locked(d, j->dlq);
        if (!ch || !ch->is_dlq) {
            code = 404;
            why = "not a dead-letter channel of this bridge";
        } else {
            snprintf(j->subject, sizeof j->subject, "%s.bridge-redrive", ch->deliver_prefix);
            if (!*j->to) snprintf(j->to, sizeof j->to, "%.*s", (int)(strlen(j->dlq) - 4), j->dlq);
        }
        pthread_rwlock_unlock(&d->reg);
    }
    if (!code && atomic_load(&d->stopping)) {
        code = 503;
        why = "bridge draining";
    }
    if (!code) {
        pthread_mutex_lock(&R.mu);
        if (R.closed) {
            code = 503;
            why = "bridge draining";
        } else if (R.running) {
            code = 409;
            why = "a redrive is already running on this bridge";
        } else {
            if (R.joinable) pthread_join(R.thr, NULL); /* the last one has ended */
            R.joinable = false;
            atomic_store(&R.stop, false);
            if (pthread_create(&R.thr, NULL, job_main, j) == 0) {
                R.running = R.joinable = true;
                j = NULL;
            } else {
                code = 503;
                why = "cannot start the redrive thread";
            }
        }
        pthread_mutex_unlock(&R.mu);
    }
    if (code) dm_reply_error(d, reply, code, why);
    free(j);
    natsMsg_Destroy(m);
}

void dm_redrive_stop(fx_daemon *d)
{
    (void)d;
    pthread_mutex_lock(&R.mu);
    atomic_store(&R.stop, true);
    R.closed = true;
    bool join = R.joinable;
    R.joinable = false;
    pthread_mutex_unlock(&R.mu);
    if (join) pthread_join(R.thr, NULL);
}
