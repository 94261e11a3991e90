/* delivery.c -- the delivery engine of one consumer (contract: delivery.h). */
#include "delivery.h"

#include <stdlib.h>
#include <string.h>


#define NIL CTAB_NIL
enum { DLV_DELAYED = 1, DLV_DUE = 2 }; /* fx_dlv.delayed[] */

static int64_t now_ms(fx_dlv *d) { return d->ops.now_ms(d->ctx); }

/* Grow hook of the table: the engine's arrays (one item per entry at most), then the
 * front-end's. */
static bool dlv_grow(void *arg, uint32_t nn)
{
    fx_dlv *d = arg;
    uint32_t *ns = realloc(d->sendq, nn * sizeof *ns);
    if (!ns) return false;
    d->sendq = ns;
    fx_mq_msg_id *na = realloc(d->acks, nn * sizeof *na);
    if (!na) return false;
    d->acks = na;
    void **nr = realloc(d->replies, nn * sizeof *nr);
    if (!nr) return false;
    d->replies = nr;
    uint32_t *nw = realloc(d->waitq, nn * sizeof *nw);
    if (!nw) return false;
    d->waitq = nw;
    uint8_t *nd = realloc(d->delayed, nn);
    if (!nd) return false;
    if (nn > d->t.n_ents) memset(nd + d->t.n_ents, 0, nn - d->t.n_ents);
    d->delayed = nd;
    char **ndt = realloc(d->detail, nn * sizeof *ndt);
    if (!ndt) return false;
    for (uint32_t i = d->t.n_ents; i < nn; i++) ndt[i] = NULL;
    d->detail = ndt;
    return !d->ops.grow || d->ops.grow(d->ctx, nn);
}

bool fx_dlv_init(fx_dlv *d, const fx_dlv_cfg *cfg, const fx_dlv_ops *ops, void *ctx)
{
    memset(d, 0, sizeof *d);
    d->cfg = *cfg;
    d->ops = *ops;
    d->ctx = ctx;
    if (d->cfg.ack_wait_ms <= 0) d->cfg.ack_wait_ms = 1;
    if (d->cfg.max_deliver < 1) d->cfg.max_deliver = 1;
    d->cfg.backoff_ms = NULL;
    if (cfg->n_backoff) {
        d->backoff = malloc(cfg->n_backoff * sizeof *d->backoff);
        if (!d->backoff) {
            d->cfg.n_backoff = 0;
            return false;
        }
        memcpy(d->backoff, cfg->backoff_ms, cfg->n_backoff * sizeof *d->backoff);
        d->cfg.backoff_ms = d->backoff;
    }
    if (d->cfg.max_ack_pending < 1) d->cfg.max_ack_pending = 1;
    if (d->cfg.nak_delay_ms < 0) d->cfg.nak_delay_ms = 0;
    /* max_ack_pending out with subscribers + at most as many waiting out a NAK delay */
    d->max_delayed = (uint32_t)(d->cfg.max_ack_pending < CTAB_MAX_ENTRIES / 2 ? d->cfg.max_ack_pending
                                                                             : CTAB_MAX_ENTRIES / 2);
    return ctab_init(&d->t, (int64_t)d->max_delayed * 2, dlv_grow, d);
}

static void reply(fx_dlv *d, void *r, bool ok)
{
    if (r && d->ops.reply) d->ops.reply(d->ctx, r, ok);
}

static void replies_done(fx_dlv *d, bool ok)
{
    for (size_t i = 0; i < d->n_replies; i++) reply(d, d->replies[i], ok);
    d->n_replies = 0;
}

static void detail_clear(fx_dlv *d, uint32_t idx)
{
    if (d->detail && d->detail[idx]) {
        free(d->detail[idx]);
        d->detail[idx] = NULL;
    }
}

void fx_dlv_free(fx_dlv *d)
{
    replies_done(d, false);
    for (uint32_t i = 0; d->detail && i < d->t.n_ents; i++) free(d->detail[i]);
    free(d->detail);
    ctab_free(&d->t);
    free(d->sendq);
    free(d->acks);
    free(d->replies);
    free(d->waitq);
    free(d->delayed);
    free(d->backoff);
    memset(d, 0, sizeof *d);
}

/* Entries that count toward max_ack_pending: all but those waiting out a NAK delay. */
static uint32_t n_out(const fx_dlv *d) { return d->t.n_used - d->n_delayed; }

size_t fx_dlv_room(const fx_dlv *d)
{
    /* NAK-delayed entries that are due wait for a slot before anything new is taken */
    uint64_t busy = (uint64_t)n_out(d) + d->n_wait;
    uint64_t map = (uint64_t)d->cfg.max_ack_pending;
    if (busy >= map || d->t.n_used >= d->t.max_ents) return 0;
    uint64_t room = map - busy, table = d->t.max_ents - d->t.n_used;
    return (size_t)(room < table ? room : table);
}

/* ---- NAK-delayed entries ---------------------------------------------------------------------- */

/* Entry idx (E_WAIT_SEND, scheduled after a NAK delay) stops counting toward max_ack_pending,
 * unless max_delayed entries wait already: then it keeps its slot (counted). */
static void mark_delayed(fx_dlv *d, uint32_t idx)
{
    if (d->delayed[idx]) return;
    if (d->n_delayed >= d->max_delayed) {
        d->nak_delay_held++;
        return;
    }
    d->delayed[idx] = DLV_DELAYED;
    d->n_delayed++;
}

/* Entry idx counts toward max_ack_pending again (it leaves, or its delay is over). */
static void undelay(fx_dlv *d, uint32_t idx)
{
    if (!d->delayed || !d->delayed[idx]) return;
    if (d->delayed[idx] == DLV_DUE) {
        uint32_t keep = 0;
        for (uint32_t i = 0; i < d->n_wait; i++)
            if (d->waitq[i] != idx) d->waitq[keep++] = d->waitq[i];
        d->n_wait = keep;
    }
    d->delayed[idx] = 0;
    d->n_delayed--;
}

static void ack_add(fx_dlv *d, const fx_mq_msg_id *id) { d->acks[d->n_acks++] = *id; }

/* The entry is done (acked, dead-lettered, dropped, discarded): committed at the next flush. */
static void finish(fx_dlv *d, uint32_t idx, fx_dlv_done how)
{
    ctab_ent *e = &d->t.ents[idx];
    undelay(d, idx);
    if (d->ops.done) d->ops.done(d->ctx, e, how);
    ack_add(d, &e->dv.id);
    detail_clear(d, idx);
    ctab_release(&d->t, idx);
}

static void sendq_push(fx_dlv *d, uint32_t idx)
{
    if (d->n_send < d->t.n_ents)
        d->sendq[d->n_send++] = idx;
    else
        ctab_schedule(&d->t, idx, now_ms(d)); /* defensive: picked up by the next round */
}

static void schedule_send(fx_dlv *d, uint32_t idx, int64_t delay_ms)
{
    d->t.ents[idx].state = E_WAIT_SEND;
    if (delay_ms <= 0) {
        ctab_unschedule(&d->t, idx);
        sendq_push(d, idx);
    } else {
        ctab_schedule(&d->t, idx, now_ms(d) + delay_ms);
    }
}

/* ---- dead letters ---------------------------------------------------------------------------- */

static void dead_letter(fx_dlv *d, uint32_t idx, const char *reason)
{
    undelay(d, idx);
    ctab_ent *e = &d->t.ents[idx];
    e->dead_reason = reason;
    if (d->cfg.is_dlq) {
        /* A dead letter's own channel has no DLQ: +TERM discards it, max_deliver never drops it. */
        if (strcmp(reason, "term") == 0) {
            finish(d, idx, FX_DLV_DONE_DISCARDED);
        } else {
            int64_t delay = d->cfg.n_backoff ? d->cfg.backoff_ms[d->cfg.n_backoff - 1] : d->cfg.ack_wait_ms;
            schedule_send(d, idx, delay);
        }
        return;
    }
    switch (d->ops.dead_letter(d->ctx, idx, e, reason)) {
    case FX_DLV_DLQ_QUEUED:
        e = &d->t.ents[idx];
        ctab_unschedule(&d->t, idx);
        e->state = E_WAIT_DLQ;
        d->dlq_pending++;
        return;
    case FX_DLV_DLQ_NONE:
        finish(d, idx, FX_DLV_DONE_DROPPED);
        return;
    default:
        e = &d->t.ents[idx];
        e->state = E_DLQ_RETRY;
        ctab_schedule(&d->t, idx, now_ms(d) + FX_DLV_RETRY_MS);
        return;
    }
}

/* Redeliver now / after delay, or dead-letter when the attempts are used up. */
static void redeliver_or_dlq(fx_dlv *d, uint32_t idx, int64_t delay_ms)
{
    if ((int64_t)d->t.ents[idx].delivered >= d->cfg.max_deliver && !d->cfg.is_dlq) {
        dead_letter(d, idx, "max_deliver");
        return;
    }
    schedule_send(d, idx, delay_ms);
}

void fx_dlv_dlq_done(fx_dlv *d, uint32_t idx, uint64_t gen, bool ok)
{
    if (d->dlq_pending) d->dlq_pending--;
    if (idx >= d->t.n_ents || d->t.ents[idx].state != E_WAIT_DLQ || d->t.ents[idx].gen != gen)
        return;
    if (ok) {
        finish(d, idx, FX_DLV_DONE_DEAD);
    } else {
        d->t.ents[idx].state = E_DLQ_RETRY;
        ctab_schedule(&d->t, idx, now_ms(d) + FX_DLV_RETRY_MS);
    }
}

/* ---- intake ----------------------------------------------------------------------------------- */

fx_err fx_dlv_accept(fx_dlv *d, fx_mq_delivery *dv, const fx_mq_msg *msg, uint64_t delivered)
{
    if (!fx_dlv_room(d)) return FX_EFULL;
    uint32_t idx = ctab_alloc(&d->t);
    if (idx == NIL) return FX_EFULL;
    ctab_ent *e = &d->t.ents[idx];
    e->dv = *dv;
    *dv = (fx_mq_delivery){0};
    if (msg) e->msg = *msg;
    e->state = E_WAIT_SEND;
    e->delivered = delivered;
    if (delivered && (int64_t)delivered >= d->cfg.max_deliver && !d->cfg.is_dlq) {
        /* its attempts were used up under an earlier consumer (released, crashed, moved) */
        dead_letter(d, idx, "max_deliver");
        return FX_OK;
    }
    sendq_push(d, idx);
    return FX_OK;
}

void fx_dlv_drop(fx_dlv *d, fx_mq_delivery *dv)
{
    uint32_t idx = ctab_alloc(&d->t);
    if (idx == NIL) { /* no room to remember the ack: the message stays for the next consumer */
        fx_mq_delivery_free(dv);
        return;
    }
    d->t.ents[idx].dv = *dv;
    *dv = (fx_mq_delivery){0};
    d->t.ents[idx].state = E_WAIT_SEND;
    finish(d, idx, FX_DLV_DONE_DROPPED);
}

/* ---- events ----------------------------------------------------------------------------------- */

static fx_dlv_res apply(fx_dlv *d, fx_dlv_kind kind, uint64_t cseq, uint64_t nonce, int64_t delay_ns)
{
    uint32_t idx = ctab_find(&d->t, cseq);
    ctab_ent *e = idx == NIL ? NULL : &d->t.ents[idx];
    /* Did the engine cause this message? */
    bool issued = nonce != 0 && cseq != 0 && cseq <= d->next_cseq;
    if (kind == FX_DLV_NORESP) {
        if (!issued || !e || e->nonce != nonce || e->state != E_WAIT_ACK) return FX_DLV_INVALID;
        /* no subscriber could receive it: not an attempt */
        if (e->delivered) e->delivered--;
        e->state = E_WAIT_SEND;
        ctab_unschedule(&d->t, idx);
        return FX_DLV_APPLIED;
    }
    if (!issued || !d->cfg.explicit_ack || (e && e->nonce != nonce)) return FX_DLV_INVALID;
    if (!e) return FX_DLV_STALE;
    switch (kind) {
    case FX_DLV_ACK:
        if (e->state != E_WAIT_ACK && e->state != E_WAIT_SEND) return FX_DLV_IGNORED;
        finish(d, idx, FX_DLV_DONE_ACKED);
        return FX_DLV_APPLIED;
    case FX_DLV_NAK: {
        if (e->state != E_WAIT_ACK) return FX_DLV_IGNORED;
        int64_t delay = delay_ns > 0 ? delay_ns / 1000000 : -1;
        if (delay < 0) {
            if (d->cfg.n_backoff) {
                size_t i = e->delivered ? (size_t)e->delivered - 1 : 0;
                if (i >= d->cfg.n_backoff) i = d->cfg.n_backoff - 1;
                delay = d->cfg.backoff_ms[i];
            } else {
                delay = d->cfg.nak_delay_ms;
            }
        }
        redeliver_or_dlq(d, idx, delay);
        if (delay > 0 && d->t.ents[idx].state == E_WAIT_SEND) mark_delayed(d, idx);
        return FX_DLV_APPLIED;
    }
    case FX_DLV_WPI:
        if (e->state != E_WAIT_ACK) return FX_DLV_IGNORED;
        ctab_schedule(&d->t, idx, now_ms(d) + d->cfg.ack_wait_ms);
        return FX_DLV_APPLIED;
    case FX_DLV_TERM:
        if (e->state != E_WAIT_ACK && e->state != E_WAIT_SEND) return FX_DLV_IGNORED;
        if (d->term_detail && *d->term_detail && !d->detail[idx]) {
            size_t n = strnlen(d->term_detail, FX_DLV_DETAIL_MAX);
            char *c = malloc(n + 1);
            if (c) { /* out of memory: the dead letter goes without its detail */
                memcpy(c, d->term_detail, n);
                c[n] = '\0';
                d->detail[idx] = c;
            }
        }
        dead_letter(d, idx, "term");
        return FX_DLV_APPLIED;
    default:
        return FX_DLV_INVALID;
    }
}

fx_dlv_res fx_dlv_term(fx_dlv *d, uint64_t claim_seq, uint64_t nonce, const char *detail, void *rep)
{
    d->term_detail = detail;
    fx_dlv_res r = fx_dlv_event(d, FX_DLV_TERM, claim_seq, nonce, 0, rep);
    d->term_detail = NULL;
    return r;
}

const char *fx_dlv_detail(const fx_dlv *d, uint32_t idx)
{
    return d->detail && idx < d->t.n_ents ? d->detail[idx] : NULL;
}

fx_dlv_res fx_dlv_event(fx_dlv *d, fx_dlv_kind kind, uint64_t claim_seq, uint64_t nonce,
                        int64_t delay_ns, void *rep)
{
    size_t acks_before = d->n_acks;
    fx_dlv_res r = apply(d, kind, claim_seq, nonce, delay_ns);
    if (!rep) return r;
    if (r == FX_DLV_APPLIED && kind == FX_DLV_ACK && d->n_acks > acks_before &&
        d->n_replies < d->n_acks)
        d->replies[d->n_replies++] = rep; /* answered once the flush committed it */
    else
        reply(d, rep, r == FX_DLV_APPLIED);
    return r;
}

/* ---- rounds ----------------------------------------------------------------------------------- */

/* NAK-delayed entries whose delay is over go out, in order, while max_ack_pending allows. */
static void promote_due(fx_dlv *d)
{
    uint32_t i = 0;
    while (i < d->n_wait && n_out(d) < (uint64_t)d->cfg.max_ack_pending) {
        uint32_t idx = d->waitq[i++];
        d->delayed[idx] = 0;
        d->n_delayed--;
        sendq_push(d, idx);
    }
    if (i) {
        memmove(d->waitq, d->waitq + i, (d->n_wait - i) * sizeof *d->waitq);
        d->n_wait -= i;
    }
}

static void run_due(fx_dlv *d)
{
    promote_due(d);
    int64_t now = now_ms(d);
    uint32_t idx;
    while ((idx = ctab_next(&d->t)) != NIL && d->t.ents[idx].due_ms <= now) {
        ctab_ent *e = &d->t.ents[idx];
        ctab_unschedule(&d->t, idx);
        switch (e->state) {
        case E_WAIT_ACK:
            if (!d->cfg.explicit_ack) /* ack none: no no-responders came back */
                finish(d, idx, FX_DLV_DONE_AUTO);
            else if (!d->ops.can_send(d->ctx))
                ctab_schedule(&d->t, idx, now + FX_DLV_HOLD_MS); /* nobody listens: hold, do not count */
            else
                redeliver_or_dlq(d, idx, 0);
            break;
        case E_WAIT_SEND:
            if (d->delayed[idx] == DLV_DELAYED) {
                if (d->n_wait == 0 && n_out(d) < (uint64_t)d->cfg.max_ack_pending) {
                    undelay(d, idx);
                    sendq_push(d, idx);
                } else { /* max_ack_pending out: it waits for a slot, before anything new */
                    d->delayed[idx] = DLV_DUE;
                    d->waitq[d->n_wait++] = idx;
                }
                break;
            }
            sendq_push(d, idx);
            break;
        case E_DLQ_RETRY:
            dead_letter(d, idx, e->dead_reason ? e->dead_reason : "max_deliver");
            break;
        default:
            break;
        }
    }
}

static void do_sends(fx_dlv *d)
{
    if (!d->n_send) return;
    int64_t now = now_ms(d);
    bool ok_to_send = d->ops.can_send(d->ctx);
    if (ok_to_send && d->ops.round) d->ops.round(d->ctx);
    uint32_t n_pub = 0, keep = 0;
    bool blocked = false; /* waiting for an attempt count to be durable */
    for (uint32_t i = 0; i < d->n_send; i++) {
        uint32_t idx = d->sendq[i];
        ctab_ent *e = &d->t.ents[idx];
        if (e->state != E_WAIT_SEND) continue;
        if (ok_to_send && (blocked || (d->ops.ready && !d->ops.ready(d->ctx, e)))) {
            /* this one and every later one wait, in order, at the head of the send queue */
            blocked = true;
            ctab_unschedule(&d->t, idx);
            d->sendq[keep++] = idx;
            continue;
        }
        bool sent = false;
        if (ok_to_send) {
            ctab_unhash(&d->t, idx);
            e->claim_seq = ++d->next_cseq;
            e->nonce = d->ops.nonce(d->ctx) & INT64_MAX;
            if (!e->nonce) e->nonce = 1;
            ctab_hash(&d->t, idx);
            sent = d->ops.send(d->ctx, idx, e);
        }
        if (!sent) {
            ctab_schedule(&d->t, idx, now + (ok_to_send ? FX_DLV_SEND_RETRY_MS : FX_DLV_IDLE_RETRY_MS));
            continue;
        }
        e->delivered++;
        e->state = E_WAIT_ACK;
        if (d->cfg.explicit_ack)
            ctab_schedule(&d->t, idx, now + d->cfg.ack_wait_ms);
        else
            d->sendq[n_pub++] = idx; /* reuse the array: published this round (n_pub <= i) */
    }
    d->n_send = keep;
    if (!d->cfg.explicit_ack && n_pub) {
        if (d->ops.sent) d->ops.sent(d->ctx, n_pub);
        int64_t due = now_ms(d) + d->cfg.none_grace_ms;
        for (uint32_t i = 0; i < n_pub; i++) ctab_schedule(&d->t, d->sendq[i], due);
    }
}

void fx_dlv_run(fx_dlv *d)
{
    run_due(d);
    do_sends(d);
}

void fx_dlv_flush(fx_dlv *d)
{
    size_t n = d->n_acks;
    d->n_acks = 0;
    bool ok = n > 0 && d->ops.commit(d->ctx, d->acks, n);
    replies_done(d, ok);
}

int64_t fx_dlv_next_due(const fx_dlv *d)
{
    uint32_t idx = ctab_next(&d->t);
    if (idx == NIL) return INT64_MAX;
    int64_t left = d->t.ents[idx].due_ms - d->ops.now_ms(d->ctx);
    return left < 0 ? 0 : left;
}

size_t fx_dlv_count(const fx_dlv *d, uint8_t st)
{
    size_t n = 0;
    for (uint32_t i = 0; i < d->t.n_ents; i++)
        if (d->t.ents[i].state == st) n++;
    return n;
}

void fx_dlv_release_all(fx_dlv *d)
{
    ctab_release_all(&d->t);
    for (uint32_t i = 0; d->detail && i < d->t.n_ents; i++) detail_clear(d, i);
    if (d->delayed) memset(d->delayed, 0, d->t.n_ents);
    d->n_delayed = 0;
    d->n_wait = 0;
    d->n_send = 0;
    d->n_acks = 0;
    replies_done(d, false);
}

void fx_dlv_release_chan(fx_dlv *d, int64_t chan)
{
    for (uint32_t k = 0; k < d->t.n_ents; k++)
        if (d->t.ents[k].state != E_FREE && d->t.ents[k].state != E_WAIT_DLQ &&
            d->t.ents[k].dv.id.chan == chan) {
            undelay(d, k);
            detail_clear(d, k);
            ctab_release(&d->t, k);
        }
    uint32_t keep = 0; /* a released index may be reused: it must not stay in the send queue */
    for (uint32_t i = 0; i < d->n_send; i++)
        if (d->t.ents[d->sendq[i]].state != E_FREE) d->sendq[keep++] = d->sendq[i];
    d->n_send = keep;
}
