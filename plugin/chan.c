/* chan.c -- a channel of the daemon: creation with its metrics, references, the MPMC id cache.
 * Contract: chan.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"
#include "fluxon_mq.h"
#include "fx_log.h"

static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

static fx_metric *cmetric(fx_metrics *reg, const char *name, const char *help, fx_metric_kind k,
                          const char *label)
{
    return fx_metrics_add(reg, name, help, k, label);
}

static void chan_free(dm_chan *ch);

dm_chan *dm_chan_new(fx_daemon *d, fx_mq_client *mq, fx_metrics *reg, const fx_chan_config *cc)
{
    dm_chan *ch = calloc(1, sizeof *ch);
    if (!ch) return NULL;
    atomic_init(&ch->refs, 1);
    ch->d = d;
    ch->mq = mq;
    ch->name = dupstr(cc->name);
    ch->deliver_prefix = dupstr(cc->deliver_prefix);
    ch->s = cc->s;
    ch->is_dlq = cc->is_dlq;
    ch->n_subjects = cc->n_subjects;
    ch->subjects = calloc(cc->n_subjects ? cc->n_subjects : 1, sizeof *ch->subjects);
    bool ok = ch->name && ch->deliver_prefix && ch->subjects;
    for (size_t i = 0; ok && i < cc->n_subjects; i++) ok = (ch->subjects[i] = dupstr(cc->subjects[i]));
    pthread_mutex_init(&ch->mu, NULL);
    atomic_init(&ch->attached, false);
    snprintf(ch->attach_err, sizeof ch->attach_err, "attaching");
    dm_pq_init(&ch->q);
    ch->mpmc = -1;
    if (!ok) {
        chan_free(ch);
        return NULL;
    }
    const char *l = ch->name;
    dm_chan_metrics *m = &ch->m;
    m->captured = cmetric(reg, "fluxon_captured_total", "Messages captured from NATS and queued for storing",
                          FX_METRIC_COUNTER, l);
    m->stored = cmetric(reg, "fluxon_stored_total", "Messages stored durably (PubAck sent)",
                        FX_METRIC_COUNTER, l);
    m->delivered = cmetric(reg, "fluxon_delivered_total", "Deliveries published (every attempt)",
                           FX_METRIC_COUNTER, l);
    m->acked = cmetric(reg, "fluxon_acked_total", "Deliveries acknowledged by subscribers",
                       FX_METRIC_COUNTER, l);
    m->redelivered = cmetric(reg, "fluxon_redelivered_total", "Redeliveries (attempt > 1)",
                             FX_METRIC_COUNTER, l);
    m->nak_delay_held = cmetric(reg, "fluxon_nak_delay_held_total",
                                "NAKs that kept their max_ack_pending slot while waiting out their "
                                "delay (max_ack_pending messages were waiting out NAK delays already)",
                                FX_METRIC_COUNTER, l);
    m->dead = cmetric(reg, "fluxon_dead_lettered_total", "Messages moved to the dead-letter channel",
                      FX_METRIC_COUNTER, l);
    m->dropped = cmetric(reg, "fluxon_dropped_total",
                         "Messages not captured (bridge queue full, too large, slow consumer)",
                         FX_METRIC_COUNTER, l);
    m->invalid_acks = cmetric(reg, "fluxon_invalid_acks_total", "Malformed ack replies ignored",
                              FX_METRIC_COUNTER, l);
    m->backlog = cmetric(reg, "fluxon_backlog", "Stored, unconsumed messages (from etcd)",
                         FX_METRIC_GAUGE, l);
    m->reclaimed = cmetric(reg, "fluxon_sub_mpscs_reclaimed_total",
                           "Idle sub-MPSCs (no consumer, no backlog, left by a bridge that died) "
                           "reclaimed by this bridge's sweep", FX_METRIC_COUNTER, l);
    m->foreign_headers = cmetric(reg, "fluxon_foreign_headers_total",
                                 "Captured messages carrying Fluxon-* headers that are not a delivery "
                                 "of this bridge (stored like any other)", FX_METRIC_COUNTER, l);
    m->own_skipped = cmetric(reg, "fluxon_own_deliveries_skipped_total",
                             "Own deliveries (proven by Fluxon-Origin) seen on a capture subject and "
                             "not captured (loop prevention)", FX_METRIC_COUNTER, l);
    m->claims = cmetric(reg, "fluxon_claims", "Consumer claims held by this bridge", FX_METRIC_GAUGE, l);
    m->store_errors = cmetric(reg, "fluxon_store_errors_total",
                              "Captured messages that could not be stored (error PubAck)",
                              FX_METRIC_COUNTER, l);
    m->duplicates = cmetric(reg, "fluxon_duplicates_total",
                            "Publishes not stored: their Nats-Msg-Id was in the duplicate window",
                            FX_METRIC_COUNTER, l);
    m->dedup_forgotten = cmetric(reg, "fluxon_dedup_forgotten_total",
                                 "Nats-Msg-Ids forgotten before duplicate_window ended: the "
                                 "window's bound (duplicate_max_ids / duplicate_max_bytes) was "
                                 "reached", FX_METRIC_COUNTER, l);
    m->dedup_ids = cmetric(reg, "fluxon_dedup_ids",
                           "Nats-Msg-Ids this bridge recorded that are still in the window",
                           FX_METRIC_GAUGE, l);
    m->inflight = cmetric(reg, "fluxon_put_batches_in_flight",
                          "Batches being stored right now (each to its own sub-MPSC)",
                          FX_METRIC_GAUGE, l);
    m->inflight_peak = cmetric(reg, "fluxon_put_batches_in_flight_peak",
                               "Most batches stored at once since start (bound: "
                               "min(4, ready sub-MPSCs))", FX_METRIC_GAUGE, l);
    m->full_dropped = cmetric(reg, "fluxon_full_dropped_total",
                              "Publishes without a reply subject dropped because the channel was full",
                              FX_METRIC_COUNTER, l);
    return ch;
}

dm_chan *dm_chan_ref(dm_chan *ch)
{
    atomic_fetch_add(&ch->refs, 1);
    return ch;
}

void dm_chan_unref(dm_chan *ch)
{
    if (ch && atomic_fetch_sub(&ch->refs, 1) == 1) chan_free(ch);
}

static void chan_free(dm_chan *ch)
{
    if (!ch) return;
    for (size_t i = 0; i < ch->n_subs; i++)
        if (ch->subs[i]) natsSubscription_Destroy(ch->subs[i]);
    free(ch->subs);
    free(ch->sub_dropped);
    pq_item *it = ch->q.head;
    while (it) {
        pq_item *nx = it->next;
        dm_pq_item_done(it, FX_ECLOSED);
        it = nx;
    }
    for (size_t i = 0; ch->subjects && i < ch->n_subjects; i++) free(ch->subjects[i]);
    free(ch->subjects);
    free(ch->name);
    free(ch->deliver_prefix);
    pthread_mutex_destroy(&ch->mu);
    dm_pq_destroy(&ch->q);
    free(ch);
}

static bool settings_same(const fx_chan_settings *a, const fx_chan_settings *b)
{
    if (a->ttl_seconds != b->ttl_seconds || a->capacity != b->capacity || a->ack != b->ack ||
        a->ack_wait_ms != b->ack_wait_ms || a->max_deliver != b->max_deliver ||
        a->max_ack_pending != b->max_ack_pending || a->n_backoff != b->n_backoff ||
        a->nak_delay_ms != b->nak_delay_ms ||
        a->release_after_ms != b->release_after_ms || a->interest_poll_ms != b->interest_poll_ms ||
        a->retention_ms != b->retention_ms || a->full_wait_ms != b->full_wait_ms ||
        a->duplicate_window_ms != b->duplicate_window_ms || a->max_delay_ms != b->max_delay_ms)
        return false;
    for (size_t i = 0; i < a->n_backoff && i < FX_CFG_MAX_BACKOFF; i++)
        if (a->backoff_ms[i] != b->backoff_ms[i]) return false;
    return true;
}

bool dm_chan_same(const dm_chan *ch, const fx_chan_config *cc)
{
    if (strcmp(ch->name, cc->name) || strcmp(ch->deliver_prefix, cc->deliver_prefix) ||
        ch->is_dlq != cc->is_dlq || ch->n_subjects != cc->n_subjects || !settings_same(&ch->s, &cc->s))
        return false;
    for (size_t i = 0; i < ch->n_subjects; i++)
        if (strcmp(ch->subjects[i], cc->subjects[i])) return false;
    return true;
}

/* ---- MPMC id ------------------------------------------------------------------------------------ */

fx_err dm_chan_resolve(dm_chan *ch, bool force, int64_t *out)
{
    pthread_mutex_lock(&ch->mu);
    if (ch->have_mpmc && !force) {
        *out = ch->mpmc;
        pthread_mutex_unlock(&ch->mu);
        return FX_OK;
    }
    pthread_mutex_unlock(&ch->mu);
    fx_mq_chan_cfg cfg = {.capacity = ch->s.capacity, .ttl_s = ch->s.ttl_seconds,
                          .retention_s = (ch->s.retention_ms + 999) / 1000, .weight = 0};
    int64_t id = -1;
    fx_err e = fx_mpmc_resolve(ch->mq, ch->name, &cfg, &id);
    if (e) return e;
    pthread_mutex_lock(&ch->mu);
    if (!ch->have_mpmc || ch->mpmc != id)
        FX_INF("channel %s: MPMC %" PRId64, ch->name, id);
    ch->mpmc = id;
    ch->have_mpmc = true;
    pthread_mutex_unlock(&ch->mu);
    *out = id;
    return FX_OK;
}

void dm_chan_forget_mpmc(dm_chan *ch)
{
    pthread_mutex_lock(&ch->mu);
    ch->have_mpmc = false;
    pthread_mutex_unlock(&ch->mu);
}

