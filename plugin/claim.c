/* claim.c -- interest polling and consumer claims (run by a pool of workers): the push
 * front-end of the delivery engine (bridge/delivery.h), which decides what is in flight, what is
 * redelivered, what is dead-lettered and what an ack does; the claim gives it the consumer's
 * operations (op_*: publish over NATS or the leaf, commit through the MQ, queue a dead letter,
 * answer an AckSync). Contract: claim.h.
 *
 * Claims have no thread of their own: each is a strand of the daemon's executor (kind
 * FX_EXEC_K_CLAIM) that runs it in steps (claim_step: one turn of the claim's loop, never waiting
 * except in the bounded release), one step at a time per claim, so "the claim thread" below
 * means "the claim's steps". A step is due when the claim is kicked (ack or no-responders event,
 * dead-letter completion, stop, durable attempt record) or when the wait it asked for is over.
 *
 * A claim owns its channel consumer (bridge/chanq_cons.h: open, backlog a departed consumer left,
 * attempt records, all below) and a delivery engine whose in-flight table holds at most
 * max_ack_pending entries (each a delivery handed out by fx_chanq_cons_get, not yet committed).
 * Entry states (bridge/claim_table.h, moved by the engine):
 *   WAIT_SEND  due for (re)publication at `due` (new, NAKed, expired, publish failed)
 *   WAIT_ACK   published; `due` is the ack deadline (explicit) or the no-responders grace (none)
 *   WAIT_DLQ   dead letter queued to the <name>-dlq producer; waiting for its completion
 *   DLQ_RETRY  dead letter could not be queued/stored; retried at `due`
 * Every state change happens on the claim thread. Acks reach it through its bounded event queue;
 * an ack matches an entry by (claim seq, nonce) from the reply subject, so stale acks (of an
 * earlier attempt) are ignored.
 *
 * Interest: while the last interest poll did not see the claim's subject, the claim publishes
 * nothing (no new deliveries, no redeliveries) and fetches nothing;
 * after release_after it is released. A delivery counts as an attempt only when a subscriber
 * could have received it: every delivery has a reply subject (the ack subject,
 * FX_DM_ACK_PREFIX, or with ack none "_FLUXON.NR.<bridge>.<channel>.<claim>.<claim seq>.<nonce>"),
 * so a delivery over the client connection that found no subscriber comes back as a
 * no-responders 503, which releases the claim at once and takes the attempt back (the message
 * stays unacked for the next consumer with its earlier count; the record is rewritten at release,
 * persist_actual).
 *
 * Control messages are trusted only when the bridge caused them (deploy/README.md "Securing a deployment"): an ack or a
 * no-responders status changes state only when its (claim seq, nonce) is the one of a delivery in
 * flight; a no-responders status only for a delivery made over the client connection (the leaf
 * path never asks for one). A claim seq never issued, a nonce that does not match, a status on
 * the leaf path or for an entry not waiting for its ack: counted (fluxon_invalid_control_total),
 * rate-logged, ignored. An ack for a claim seq issued earlier and no longer in flight is stale.
 *
 * Leaf path (nats.leaf_url set, ack explicit): deliveries are published over the leafnode
 * connection (leaf.h) with the exact "$JS.ACK.FLUXON...." reply, which a client connection may
 * not use. The header block is the same (built on a natsMsg, then serialised). A leaf connection
 * gets no no-responders status, so before each delivery the claim asks the leaf whether the hub
 * still has a subscriber for its subject (fx_leaf_has_interest: the hub's LS+/LS- lines, which
 * arrive at once, unlike the interest poll); without one the delivery waits and is not counted.
 * Only a subscriber leaving in the instant between that check and the server routing the message
 * loses a counted delivery (redelivered after ack_wait or at release). While the leaf connection
 * is down, or its write buffer is full, deliveries wait (retried like a failed publish).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chanq.h"
#include "claim.h"
#include "delivery.h"
#include "flatdict.h"
#include "fx_time.h"
#include "fx_url.h"
#include "interest.h"
#include "jsack.h"
#include "pull.h"
#include "subject.h"


typedef ctab_ent ent; /* an in-flight entry (claim_table.h, owned by the delivery engine) */

typedef struct cst {
    dm_claim *cl;
    dm_chan *ch;
    fx_daemon *d;
    fx_chanq_cons *cq; /* the channel consumer (bridge/chanq_cons.h) */
    bool opened;       /* cq was open at the last turn (log, fluxon_claims) */
    fx_chanq_attempt *attbuf; /* one item per table entry (fx_chanq_cons_count) */
    uint32_t *attidx;         /* per attbuf item: its entry's index (persist_counts) */
    uint32_t *plk;            /* the attbuf items of planned entries (persist_counts) */
    uint64_t *counts;         /* attempts made before, per delivery fetched */
    bool explicit_ack;
    bool use_leaf; /* explicit ack and d->leaf: deliveries over the leaf connection */
    fx_dlv q; /* the delivery engine (bridge/delivery.h): in flight, due, dead letters, acks */
    fx_mq_delivery *getbuf;
    char *hbuf; /* delivery header block (leaf path), reused */
    size_t hcap;
    int64_t last_ev_ms; /* last ack event handled (a pull claim's activity) */
    fx_log_slot slot_get, slot_pub;
    fx_log_slot slot_nak_held;
} cst;

/* ---- in-flight table (owned by the engine) ----------------------------------------------------- */

/* Grow hook of the engine's table: the attempt buffer holds up to one item per entry. */
static bool op_grow(void *ctx, uint32_t nn)
{
    cst *s = ctx;
    fx_chanq_attempt *nab = realloc(s->attbuf, nn * sizeof *nab);
    if (!nab) return false;
    s->attbuf = nab;
    uint32_t *ni = realloc(s->attidx, nn * sizeof *ni);
    if (!ni) return false;
    s->attidx = ni;
    uint32_t *np = realloc(s->plk, nn * sizeof *np);
    if (!np) return false;
    s->plk = np;
    return true;
}

/* ---- AckSync replies ------------------------------------------------------------------------- */

static dm_ackreply *ackreply_new(const char *subject)
{
    size_t l = strlen(subject);
    dm_ackreply *r = malloc(sizeof *r + l + 1);
    if (!r) return NULL;
    atomic_init(&r->refs, 1);
    atomic_init(&r->answered, false);
    memcpy(r->subject, subject, l + 1);
    return r;
}

/* Drop one reference. ok: the ack was applied: answer with an empty message (the first answer
 * wins). The last reference of an unanswered reply sends the error reply; d NULL: no publish
 * (the daemon is being torn down). */
static void ackreply_done(fx_daemon *d, dm_ackreply *r, bool ok)
{
    if (!r) return;
    if (ok && d && d->nc && !atomic_exchange(&r->answered, true))
        natsConnection_Publish(d->nc, r->subject, NULL, 0);
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    if (!atomic_load(&r->answered) && d && d->nc) {
        char buf[256];
        int n = fx_puback_err(409, "ack not applied: the delivery is no longer pending "
                                   "(already acknowledged, redelivered or released)",
                              buf, sizeof buf);
        if (n > 0) natsConnection_Publish(d->nc, r->subject, buf, n);
    }
    free(r);
}

/* ---- consumer ---------------------------------------------------------------------------------- */

static bool stop_requested(cst *s)
{
    return atomic_load(&s->cl->stop) != STOP_NONE || atomic_load(&s->cl->noresp);
}


static void set_holding(cst *s, bool h);
static void sched_kick(dm_claim *cl);

/* Channel consumer callbacks (chanq_cons.h): wake the claim; forget the deliveries of a lost
 * source; count those of a source still held. */
static void claim_notify(void *arg) { sched_kick(arg); }

static void cq_release(void *arg, int64_t src)
{
    cst *s = ((dm_claim *)arg)->st;
    if (src == FX_CHANQ_ALL) {
        fx_dlv_release_all(&s->q); /* unacked messages stay for the next consumer */
        set_holding(s, false);
        s->opened = false;
    } else {
        fx_dlv_release_chan(&s->q, src);
    }
}

static size_t cq_held(void *arg, int64_t src)
{
    cst *s = ((dm_claim *)arg)->st;
    size_t n = 0;
    for (uint32_t i = 0; i < s->q.t.n_ents; i++)
        if (s->q.t.ents[i].state != E_FREE && s->q.t.ents[i].dv.id.chan == src) n++;
    return n;
}

/* ---- persisted attempts (chanq_cons.h fx_chanq_cons_count) ------------------------------------- */

/* The attempt counts of every entry (planned: the count it will have once this round is out);
 * planned entries remember the record generation that holds their count (op_ready waits).
 * One walk over the table that stops at the last used entry; the planned ones are found again
 * through plk (their items' indexes), not by a second walk. */
static void persist_counts(cst *s)
{
    if (!s->explicit_ack) return;
    ctab *t = &s->q.t;
    size_t k = 0, np = 0;
    for (uint32_t i = 0, seen = 0; i < t->n_ents && seen < t->n_used; i++) {
        ent *e = &t->ents[i];
        if (e->state == E_FREE) continue;
        seen++;
        uint64_t n = e->delivered + (e->planned ? 1 : 0);
        if (e->planned) s->plk[np++] = (uint32_t)k;
        s->attidx[k] = i;
        s->attbuf[k++] = (fx_chanq_attempt){e->dv.id, n > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)n, 0};
    }
    fx_chanq_cons_count(s->cq, s->attbuf, k);
    for (size_t j = 0; j < np; j++) {
        ent *e = &t->ents[s->attidx[s->plk[j]]];
        uint64_t gen = s->attbuf[s->plk[j]].gen;
        e->planned = false;
        uint32_t n = (uint32_t)(e->delivered + 1);
        if (e->rec_n != n || !e->rec_gen) {
            e->rec_n = n;
            e->rec_gen = gen;
        }
    }
}

/* Before a round of deliveries: the records with the counts the round will make. Only entries of
 * the send queue are planned, and persist_counts clears each flag it set. */
static void persist_attempts(cst *s)
{
    if (!s->explicit_ack) return;
    ctab *t = &s->q.t;
    for (uint32_t i = 0; i < s->q.n_send; i++)
        if (t->ents[s->q.sendq[i]].state == E_WAIT_SEND) t->ents[s->q.sendq[i]].planned = true;
    persist_counts(s);
}

/* May this entry be published now (its attempt count durable)? */
static bool attempt_durable(cst *s, const ent *e)
{
    if (!s->explicit_ack) return true;
    return e->rec_n == e->delivered + 1 && e->rec_gen &&
           fx_chanq_cons_durable(s->cq, e->dv.id, e->rec_gen);
}

/* Engine op: commit the acks gathered. true: every ack was applied. */
static bool op_commit(void *ctx, fx_mq_msg_id *acks, size_t n)
{
    cst *s = ctx;
    return fx_chanq_cons_ack(s->cq, acks, n);
}

static void flush(cst *s) { fx_dlv_flush(&s->q); }

/* ---- delivery ----------------------------------------------------------------------------------- */

/* Engine op: publish entry e (its claim seq and nonce set by the engine) as attempt
 * delivered + 1. true: it went out. On the leaf path the subscriber may have left during the
 * round: no publish then (the engine retries it, uncounted). A delivery whose consumer is fenced
 * (this round's reading, op_round) waits. */
static bool ent_fenced(const cst *s, const ent *e) { return fx_chanq_cons_fenced(s->cq, e->dv.id); }

static bool send_to(cst *s, const ent *e, const char *to);

static bool op_send(void *ctx, uint32_t idx, const ent *e)
{
    (void)idx;
    cst *s = ctx;
    if (ent_fenced(s, e)) return false; /* retried next round, not counted */
    dm_pull *p = s->cl->pull;
    if (!p) {
        if (s->use_leaf && !fx_leaf_has_interest(s->d->leaf, s->cl->subject)) return false;
        return send_to(s, e, s->cl->subject);
    }
    /* Pull: the head waiting request gets it. It is reserved (marked sending: the timer thread
     * does not expire it meanwhile, and only this step moves the head), then served (it leaves
     * when done, else goes to the back: JetStream's wait queue order) or given back. */
    char to[FX_PULL_REPLY_MAX + 1];
    size_t sz = e->msg.data.len + e->msg.headers.len;
    pthread_mutex_lock(&s->cl->mu);
    while (p->n > 0) {
        dm_pull_req *r = dm_pull_at(p, 0);
        if (dm_pull_abandoned(s->d, r)) { /* its client is gone: no answer */
            dm_pull_remove(p, 0);
            continue;
        }
        if (r->max_bytes > 0 && (int64_t)sz > r->bytes) {
            dm_pull_status(s->d, r->reply, 409, "Message Size Exceeds MaxBytes", -1, 0);
            dm_pull_remove(p, 0);
            continue;
        }
        r->sending = true;
        memcpy(to, r->reply, sizeof to);
        break;
    }
    bool have = p->n > 0;
    pthread_mutex_unlock(&s->cl->mu);
    if (!have) return false;
    bool ok = send_to(s, e, to);
    pthread_mutex_lock(&s->cl->mu);
    dm_pull_req *r = dm_pull_at(p, 0);
    r->sending = false;
    if (ok) {
        r->batch--;
        if (r->max_bytes > 0) r->bytes -= (int64_t)sz;
        r->delivered++;
        if (r->hb_ms) r->next_hb_ms = fx_now_ms() + r->hb_ms;
        if (r->batch <= 0)
            dm_pull_remove(p, 0);
        else
            dm_pull_rotate(p);
    }
    pthread_mutex_unlock(&s->cl->mu);
    return ok;
}

/* Small formatting without printf (send_to runs once per delivery). */
static void copy_name(char *dst, size_t cap, const char *src) /* snprintf(dst, cap, "%s", src) */
{
    size_t l = strnlen(src, cap - 1);
    memcpy(dst, src, l);
    dst[l] = '\0';
}

static size_t put_u64(char *out, uint64_t v) /* decimal, no NUL; out has room for 20 bytes */
{
    char t[20];
    size_t i = sizeof t;
    do {
        t[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(out, t + i, sizeof t - i);
    return sizeof t - i;
}

static size_t put_i64(char *out, int64_t v)
{
    if (v >= 0) return put_u64(out, (uint64_t)v);
    out[0] = '-';
    return 1 + put_u64(out + 1, (uint64_t)0 - (uint64_t)v);
}

/* Publish entry e to subject `to` (the claim's subject, or a pull request's inbox). */
static bool send_to(cst *s, const ent *e, const char *to)
{
    fx_daemon *d = s->d;
    dm_chan *ch = s->ch;
    uint64_t attempt = e->delivered + 1;

    char reply[FX_JSACK_SUBJECT_MAX + 64];
    if (s->explicit_ack) {
        fx_ack_meta meta;
        copy_name(meta.bridge, sizeof meta.bridge, d->name);
        copy_name(meta.channel, sizeof meta.channel, ch->name);
        copy_name(meta.claim, sizeof meta.claim, s->cl->token);
        meta.delivered = attempt;
        meta.seq = DM_SEQ(&e->dv.id);
        meta.claim_seq = e->claim_seq;
        /* JetStream's metadata timestamp is the time the message was stored */
        meta.ts_ns = e->msg.publish_ns > 0 ? e->msg.publish_ns : fx_wall_ns();
        /* JetStream's pending: stored, not yet handed to this claim (house-keeping view) */
        int64_t used = (int64_t)s->q.t.n_used, backlog = fx_chanq_cons_pending(s->cq);
        meta.pending = backlog > used ? (uint64_t)(backlog - used) : 0;
        meta.nonce = e->nonce;
        /* the exact JetStream form on the leaf path; else the same tokens after FX_DM_ACK_PREFIX */
        const size_t jl = sizeof FX_DM_JS_ACK_PREFIX - 1, fl = sizeof FX_DM_ACK_PREFIX - 1;
        size_t off = s->use_leaf ? 0 : fl - jl;
        _Static_assert(sizeof FX_DM_ACK_PREFIX >= sizeof FX_DM_JS_ACK_PREFIX, "prefix room");
        int n = fx_ack_subject_build(&meta, reply + off, sizeof reply - off);
        if (n < 0 || strncmp(reply + off, FX_DM_JS_ACK_PREFIX, jl) != 0) {
            fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_ERR,
                               "claim %s: cannot build the ack subject", s->cl->subject);
            return false;
        }
        if (off) memcpy(reply, FX_DM_ACK_PREFIX, fl);
    } else {
        /* FX_DM_NR_PREFIX "<bridge>.<channel>.<claim>.<claim seq>.<nonce>" */
        size_t bl = strlen(d->name), cl = strlen(ch->name), tl = strlen(s->cl->token);
        const size_t pl = sizeof FX_DM_NR_PREFIX - 1;
        if (pl + bl + cl + tl + 3 + 2 * 20 + 2 > sizeof reply) {
            fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_ERR,
                               "claim %s: cannot build the reply subject", s->cl->subject);
            return false;
        }
        char *w = reply;
        memcpy(w, FX_DM_NR_PREFIX, pl);
        w += pl;
        memcpy(w, d->name, bl);
        w += bl;
        *w++ = '.';
        memcpy(w, ch->name, cl);
        w += cl;
        *w++ = '.';
        memcpy(w, s->cl->token, tl);
        w += tl;
        *w++ = '.';
        w += put_u64(w, e->claim_seq);
        *w++ = '.';
        w += put_u64(w, e->nonce);
        *w = '\0';
    }
    char orig[FX_SUBJECT_MAX + 1];
    size_t sl = e->msg.subject.len < FX_SUBJECT_MAX ? e->msg.subject.len : FX_SUBJECT_MAX;
    memcpy(orig, e->msg.subject.data, sl);
    orig[sl] = '\0';
    char seq[32], att[32], fid[96];
    seq[put_u64(seq, DM_SEQ(&e->dv.id))] = '\0';
    att[put_u64(att, attempt)] = '\0';
    {
        char *w = fid;
        w += put_i64(w, e->dv.id.chan);
        *w++ = '.';
        w += put_i64(w, e->dv.id.pidx);
        *w++ = '.';
        w += put_i64(w, e->dv.id.msg);
        *w = '\0';
    }

    char origin[FX_DM_ORIGIN_LEN + 1];
    dm_origin_tag(d->origin_key, to, reply, origin, sizeof origin);

    const char *kv[] = {FX_DM_HDR_CHANNEL, ch->name, FX_DM_HDR_SUBJECT,   orig,
                        FX_DM_HDR_SEQ,     seq,      FX_DM_HDR_DELIVERED, att,
                        FX_DM_HDR_ID,      fid,      FX_DM_HDR_ORIGIN,    origin};
    enum { N_PAIRS = sizeof kv / sizeof kv[0] / 2 };
    natsStatus st = NATS_OK;
    if (s->use_leaf) { /* the header block is written directly: no natsMsg, no allocation */
        size_t hlen = 0;
        fx_err fe = dm_hdr_delivery(e->msg.headers, kv, N_PAIRS, &s->hbuf, &s->hcap, &hlen);
        /* pull.h: a pull delivery carries "<$JS.ACK reply>@<published subject>"; the hub shows
         * the message on its published subject, as JetStream's pull deliveries */
        char wire[sizeof reply + FX_SUBJECT_MAX + 2];
        const char *rp = reply;
        if (s->cl->pull && s->explicit_ack && orig[0]) {
            snprintf(wire, sizeof wire, "%s@%s", reply, orig);
            rp = wire;
        }
        if (!fe)
            fe = fx_leaf_publish(d->leaf, to, rp, s->hbuf, hlen, e->msg.data.data,
                                 e->msg.data.len);
        if (fe) {
            fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_WRN,
                               "claim %s: delivery publish (leaf) failed: %s (%s)", s->cl->subject,
                               fx_strerror(fe), fx_err_detail());
            return false;
        }
    } else {
        const char *data = e->msg.data.len ? (const char *)e->msg.data.data : "";
        natsMsg *m = NULL;
        st = natsMsg_Create(&m, s->cl->subject, reply, data, (int)e->msg.data.len);
        if (st == NATS_OK) st = dm_hdr_apply(m, e->msg.headers);
        for (size_t i = 0; st == NATS_OK && i < N_PAIRS; i++)
            st = natsMsgHeader_Set(m, kv[2 * i], kv[2 * i + 1]);
        if (st == NATS_OK) st = natsConnection_PublishMsg(d->nc, m);
        natsMsg_Destroy(m);
    }
    if (st != NATS_OK) {
        fx_log_ratelimited(&s->slot_pub, 5000, FX_LOG_WRN, "claim %s: delivery publish failed: %s",
                           s->cl->subject, natsStatus_GetText(st));
        return false;
    }
    fx_metric_inc(ch->m.delivered, 1);
    if (attempt > 1) fx_metric_inc(ch->m.redelivered, 1);
    return true;
}

/* Could a subscriber receive a delivery of this claim now? The interest poll saw one, and on the
 * leaf path (no no-responders status) the hub's interest lines still name one (a delivery the
 * server drops there is lost without a word and must not count as an attempt). */
static size_t pull_waiting(dm_claim *cl)
{
    pthread_mutex_lock(&cl->mu);
    size_t n = cl->pull->n;
    pthread_mutex_unlock(&cl->mu);
    return n;
}

static bool receivable(cst *s)
{
    if (s->cl->pull) return pull_waiting(s->cl) > 0; /* a waiting request is the interest */
    return atomic_load(&s->cl->present) &&
           (!s->use_leaf || fx_leaf_has_interest(s->d->leaf, s->cl->subject));
}

static bool can_publish(cst *s)
{
    return !atomic_load(&s->d->stopping) && atomic_load(&s->cl->stop) == STOP_NONE &&
           !atomic_load(&s->cl->noresp) && dm_nats_connected(s->d) &&
           (!s->use_leaf || fx_leaf_connected(s->d->leaf)) && receivable(s);
}

/* Engine op: before a round that publishes: persist the attempt counts the round will make, and
 * read the fencing and backlog once (fx_chanq_cons_round). */
static void op_round(void *ctx)
{
    cst *s = ctx;
    persist_attempts(s);
    fx_chanq_cons_round(s->cq);
}

/* Engine op: may this entry be published now (its attempt count durable)? The writer kicks the
 * claim when a record becomes durable. */
static bool op_ready(void *ctx, const ent *e) { return attempt_durable(ctx, e); }

static bool op_can_send(void *ctx) { return can_publish(ctx); }

/* Engine op, ack none: the server has processed the publishes once the PONG is back; any 503 for
 * them is then already in our ack-none subscription. */
static void op_sent(void *ctx, uint32_t n)
{
    (void)n;
    cst *s = ctx;
    natsConnection_FlushTimeout(s->d->nc, 1000);
}

static int64_t op_now(void *ctx)
{
    (void)ctx;
    return fx_now_ms();
}

static uint64_t op_nonce(void *ctx)
{
    (void)ctx;
    return dm_rand64();
}

/* ---- dead letters ------------------------------------------------------------------------------ */

/* The dead-letter item's completion hook (pqueue.h): the producer side ends it here. */
static void dlq_hook(pq_item *it, fx_err e)
{
    (void)e; /* it->result holds it (dm_pq_item_done) */
    dm_claim_dlq_complete(it);
}

/* Engine op: queue entry idx's message to the <channel>-dlq producer with the reason in its
 * headers (the completion comes back through dm_claim_dlq_complete). */
static fx_dlv_dlq op_dead_letter(void *ctx, uint32_t idx, const ent *e, const char *reason)
{
    cst *s = ctx;
    fx_daemon *d = s->d;
    dm_chan *ch = s->ch;
    char dlq_name[160];
    snprintf(dlq_name, sizeof dlq_name, "%s-dlq", ch->name);
    char att[32], fid[96];
    snprintf(att, sizeof att, "%" PRIu64, e->delivered);
    snprintf(fid, sizeof fid, "%" PRId64 ".%" PRId64 ".%" PRId64, e->dv.id.chan, e->dv.id.pidx,
             e->dv.id.msg);
    const char *detail = fx_dlv_detail(&s->q, idx);
    const char *kv[] = {FX_DM_HDR_DEAD_REASON, reason, "Fluxon-Dead-Delivered", att,
                        "Fluxon-Dead-Id", fid, FX_DM_HDR_DEAD_DETAIL, detail};
    char *hdr = NULL;
    size_t hlen = 0;
    pq_item *it = NULL;
    fx_err err = dm_hdr_append(e->msg.headers, kv, detail ? 4 : 3, &hdr, &hlen);
    if (!err) {
        fx_mq_msg rec = {.subject = e->msg.subject,
                         .headers = {hdr, hlen},
                         .publish_ns = e->msg.publish_ns,
                         .data = e->msg.data};
        size_t rl = 0;
        err = fx_mq_msg_encoded_size(&rec, &rl);
        if (!err && !(it = dm_pq_item_new(PQ_DEADLETTER, NULL, rl))) err = FX_ENOMEM;
        if (!err) err = fx_mq_msg_encode_into(&rec, it->rec, rl, &it->rec_len);
    }
    free(hdr);
    bool queued = false, no_dlq = false;
    if (!err) {
        it->claim = s->cl;
        it->done = dlq_hook;
        it->ent_idx = idx;
        it->ent_gen = e->gen;
        atomic_fetch_add(&s->cl->refs, 1);
        pthread_rwlock_rdlock(&d->reg);
        dm_chan *dq = dm_find_chan_locked(d, dlq_name);
        if (!dq)
            no_dlq = true;
        else
            queued = dm_pq_push(&dq->q, it);
        pthread_rwlock_unlock(&d->reg);
        if (!queued) {
            atomic_fetch_sub(&s->cl->refs, 1); /* the registry and the thread still hold refs */
            free(it);
        }
    } else {
        free(it);
    }
    if (queued) return FX_DLV_DLQ_QUEUED;
    if (no_dlq) {
        FX_ERR("claim %s: no dead-letter channel %s: message %s dropped (%s)", s->cl->subject,
               dlq_name, fid, reason);
        return FX_DLV_DLQ_NONE;
    }
    static fx_log_slot slot;
    fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "claim %s: cannot queue dead letter %s (%s): retrying",
                       s->cl->subject, fid, err ? fx_strerror(err) : "queue full");
    return FX_DLV_DLQ_RETRY;
}

/* Engine op: an entry leaves the engine (committed at the next flush). */
static void op_done(void *ctx, const ent *e, fx_dlv_done how)
{
    cst *s = ctx;
    dm_chan *ch = s->ch;
    switch (how) {
    case FX_DLV_DONE_ACKED:
        fx_metric_inc(ch->m.acked, 1);
        break;
    case FX_DLV_DONE_AUTO: /* ack none: no no-responders came back */
        break;
    case FX_DLV_DONE_DEAD:
        FX_INF("claim %s: message %" PRId64 ".%" PRId64 ".%" PRId64 " dead-lettered (%s)",
               s->cl->subject, e->dv.id.chan, e->dv.id.pidx, e->dv.id.msg, e->dead_reason);
        fx_metric_inc(ch->m.dead, 1);
        break;
    case FX_DLV_DONE_DROPPED:
        fx_metric_inc(ch->m.dropped, 1);
        break;
    case FX_DLV_DONE_DISCARDED: /* +TERM on a dead-letter channel */
        FX_INF("claim %s: dead letter %" PRId64 ".%" PRId64 ".%" PRId64 " terminated: discarded",
               s->cl->subject, e->dv.id.chan, e->dv.id.pidx, e->dv.id.msg);
        fx_metric_inc(ch->m.acked, 1);
        break;
    }
}

/* Engine op: an AckSync answer. */
static void op_reply(void *ctx, void *r, bool ok) { ackreply_done(((cst *)ctx)->d, r, ok); }

/* ---- events ------------------------------------------------------------------------------------ */

/* Hand one event to the engine; its AckSync reply (if any) is answered by the engine. */
static void handle_ev(cst *s, dm_ev *ev)
{
    fx_daemon *d = s->d;
    s->last_ev_ms = fx_now_ms();
    void *reply = ev->reply;
    ev->reply = NULL;
    char *detail = ev->detail;
    ev->detail = NULL;
    if (ev->kind == EV_NORESP && s->use_leaf) { /* the leaf path never asks for one */
        dm_invalid_control(d, "no-responders status");
        ackreply_done(d, reply, false);
        free(detail);
        return;
    }
    fx_dlv_kind k;
    switch (ev->kind) {
    case EV_ACK: k = FX_DLV_ACK; break;
    case EV_NAK: k = FX_DLV_NAK; break;
    case EV_WPI: k = FX_DLV_WPI; break;
    case EV_TERM: k = FX_DLV_TERM; break;
    case EV_NORESP: k = FX_DLV_NORESP; break;
    default:
        ackreply_done(d, reply, false);
        free(detail);
        return;
    }
    uint64_t held = s->q.nak_delay_held;
    fx_dlv_res res = k == FX_DLV_TERM ? fx_dlv_term(&s->q, ev->claim_seq, ev->nonce, detail, reply)
                                      : fx_dlv_event(&s->q, k, ev->claim_seq, ev->nonce, ev->delay_ns, reply);
    free(detail);
    if (s->q.nak_delay_held != held) { /* bound of NAK-delayed messages reached (delivery.h) */
        fx_metric_inc(s->ch->m.nak_delay_held, 1);
        fx_log_ratelimited(&s->slot_nak_held, 10000, FX_LOG_WRN,
                           "claim %s: max_ack_pending messages wait out NAK delays already: a "
                           "NAKed message keeps its slot", s->cl->subject);
    }
    switch (res) {
    case FX_DLV_INVALID:
        dm_invalid_control(d, k == FX_DLV_NORESP ? "no-responders status" : "ack");
        break;
    case FX_DLV_STALE:
        fx_metric_inc(d->g_stale_acks, 1);
        break;
    case FX_DLV_APPLIED:
        /* the delivery found no subscriber: release the claim now (the engine took the attempt
         * back; the record is rewritten at release) */
        if (k == FX_DLV_NORESP && !atomic_exchange(&s->cl->noresp, true))
            FX_INF("claim %s: no responders: releasing the claim", s->cl->subject);
        break;
    default:
        break;
    }
}

static void handle_dlq_done(cst *s, pq_item *it)
{
    if (it->result != FX_OK) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "claim %s: dead letter not stored (%s): retrying",
                           s->cl->subject, fx_strerror(it->result));
    }
    fx_dlv_dlq_done(&s->q, it->ent_idx, it->ent_gen, it->result == FX_OK);
    dm_claim *cl = it->claim;
    free(it);
    dm_claim_unref(cl);
}

/* Process queued events and dead-letter completions; returns how many were handled. */
static size_t drain_events(cst *s)
{
    dm_claim *cl = s->cl;
    size_t total = 0;
    for (int round = 0; round < 64; round++) {
        dm_ev local[256];
        size_t n = 0;
        pthread_mutex_lock(&cl->mu);
        while (cl->ev_n && n < 256) {
            local[n++] = cl->evs[cl->ev_head];
            cl->ev_head = (cl->ev_head + 1) % cl->ev_cap;
            cl->ev_n--;
        }
        pq_item *done = cl->dlq_done;
        cl->dlq_done = NULL;
        pthread_mutex_unlock(&cl->mu);
        for (size_t i = 0; i < n; i++) handle_ev(s, &local[i]);
        while (done) {
            pq_item *nx = done->next;
            handle_dlq_done(s, done);
            done = nx;
        }
        total += n;
        if (n < 256) break;
    }
    return total;
}


/* ---- fetch ------------------------------------------------------------------------------------- */

static void accept_msgs(cst *s, size_t got)
{
    for (size_t i = 0; i < got; i++) {
        fx_mq_delivery *dv = &s->getbuf[i];
        fx_mq_msg msg;
        if (fx_mq_msg_decode(dv->value.data, dv->value.len, dv->value.len + 1, &msg) != FX_OK) {
            FX_ERR("claim %s: message %" PRId64 ".%" PRId64 ".%" PRId64
                   " is not a valid record (%s): dropped",
                   s->cl->subject, dv->id.chan, dv->id.pidx, dv->id.msg, fx_err_detail());
            fx_dlv_drop(&s->q, dv);
            continue;
        }
        if (fx_dlv_accept(&s->q, dv, &msg, s->counts[i]) != FX_OK) /* we never fetch past the window */
            fx_mq_delivery_free(dv);
    }
}

/* ---- the claim thread -------------------------------------------------------------------------- */


/* One turn of the claim (on a scheduler worker): what the claim thread's loop did in one
 * iteration, without blocking: returns the ms until the claim wants its next turn (it is kicked
 * earlier by acks, dead-letter completions, a stop and durable attempt records), or -1 when the
 * claim is to be released. */
/* ---- pull requests (pull.h) --------------------------------------------------------------------- */

/* Answer a deleted consumer's requests, and end an idle claim: no request for release_after and
 * nothing awaiting an ack (expiry and heartbeats: dm_pull_timers). Returns ms until the idle
 * release is due (INT64_MAX: none), or -1: the claim ends. */
static int64_t pull_tick(cst *s)
{
    dm_claim *cl = s->cl;
    dm_pull *p = cl->pull;
    fx_daemon *d = s->d;
    int64_t now = fx_now_ms(), next = INT64_MAX;
    pthread_mutex_lock(&cl->mu);
    if (p->deleted) {
        p->closed = true;
        while (p->n) {
            dm_pull_status(d, dm_pull_at(p, 0)->reply, 409, "Consumer Deleted", -1, 0);
            dm_pull_remove(p, 0);
        }
        pthread_mutex_unlock(&cl->mu);
        FX_INF("claim %s: consumer deleted: releasing", cl->subject);
        atomic_store(&cl->stop, STOP_RELEASE);
        return -1;
    }
    int64_t ackp = 0, redel = 0;
    uint64_t floor = s->q.next_cseq;
    for (uint32_t i = 0; i < s->q.t.n_ents; i++) {
        const ent *e = &s->q.t.ents[i];
        if (e->state == E_FREE || e->delivered == 0) continue;
        ackp++;
        if (e->delivered > 1) redel++;
        if (e->claim_seq && e->claim_seq - 1 < floor) floor = e->claim_seq - 1;
    }
    p->num_ack_pending = ackp;
    p->num_redelivered = redel;
    p->delivered_seq = s->q.next_cseq;
    p->ack_floor_seq = floor;
    bool waiting = p->n > 0;
    atomic_store(&cl->present, waiting);
    /* Idle since the last waiting request or ack. Messages awaiting their ack keep the claim
     * (the worker may still ack them) until ack_wait after that: past it their deadline is
     * over (a +WPI is an ack event), and a claim held only by them would keep its backlog from
     * the other bridges. */
    if (waiting || !p->idle_since_ms) p->idle_since_ms = now;
    if (s->last_ev_ms > p->idle_since_ms) p->idle_since_ms = s->last_ev_ms;
    if (!waiting) {
        int64_t due = p->idle_since_ms + s->ch->s.release_after_ms;
        if (ackp > 0 || s->q.dlq_pending > 0) due += p->cfg.ack_wait_ms;
        if (s->q.dlq_pending > 0 && due <= now) due = now + 100; /* dead letters finish first */
        if (now >= due || (atomic_load(&d->stopping) && ackp == 0)) {
            p->closed = true;
            pthread_mutex_unlock(&cl->mu);
            FX_INF("claim %s: no pull request for %" PRId64 " ms: releasing (%" PRId64
                   " unacked)", cl->subject, now - p->idle_since_ms, ackp);
            atomic_store(&cl->stop, STOP_RELEASE);
            return -1;
        }
        if (due < next) next = due;
    }
    pthread_mutex_unlock(&cl->mu);
    return next == INT64_MAX ? INT64_MAX : (next > now ? next - now : 0);
}

/* Nothing more can be delivered now: no_wait requests end (404 when they got nothing, else 408
 * with what they still wanted, as JetStream answers). */
static void pull_nowait(cst *s)
{
    if (s->q.n_send) return; /* deliveries are waiting for their attempt record */
    dm_pull *p = s->cl->pull;
    pthread_mutex_lock(&s->cl->mu);
    for (size_t i = 0; i < p->n;) {
        dm_pull_req *r = dm_pull_at(p, i);
        if (!r->no_wait) {
            i++;
            continue;
        }
        if (r->delivered == 0)
            dm_pull_status(s->d, r->reply, 404, "No Messages", -1, 0);
        else
            dm_pull_status(s->d, r->reply, 408, "Request Timeout", r->batch,
                           r->max_bytes > 0 ? r->bytes : 0);
        dm_pull_remove(p, i);
    }
    pthread_mutex_unlock(&s->cl->mu);
}

/* Messages the waiting requests still want. */
static size_t pull_demand(dm_claim *cl)
{
    size_t want = 0;
    pthread_mutex_lock(&cl->mu);
    for (size_t i = 0; i < cl->pull->n && want < FX_DM_FETCH_MAX; i++)
        want += (size_t)dm_pull_at(cl->pull, i)->batch;
    pthread_mutex_unlock(&cl->mu);
    return want;
}

static int64_t claim_turn_inner(cst *s);

static int64_t claim_turn(cst *s)
{
    if (!s->cl->pull) return claim_turn_inner(s);
    if (stop_requested(s)) return -1;
    int64_t cap = pull_tick(s);
    if (cap < 0) return -1;
    int64_t w = claim_turn_inner(s);
    if (w < 0) return w;
    return w < cap ? w : cap;
}

/* One delivery round: on the leaf path its publishes leave in one write (fx_leaf_cork). */
static void dlv_run(cst *s)
{
    if (s->use_leaf) fx_leaf_cork(s->d->leaf);
    fx_dlv_run(&s->q);
    if (s->use_leaf) fx_leaf_uncork(s->d->leaf);
}

static int64_t claim_turn_inner(cst *s)
{
    if (stop_requested(s)) return -1;
    drain_events(s);
    flush(s);
    int64_t pw = fx_chanq_cons_poll(s->cq); /* open, reopen, inherited backlog taken or let go */
    if (pw >= 0) {
        if (atomic_load(&s->d->stopping)) return -1;
        return pw;
    }
    if (!s->opened) {
        s->opened = true;
        set_holding(s, true);
    }
    dlv_run(s);
    flush(s);
    if (fx_chanq_cons_lost(s->cq)) return 0; /* the next poll releases and reopens */
    if (stop_requested(s)) return -1;
    /* Backlog a departed consumer left (the keeper's view): taken only while we can deliver it */
    if (can_publish(s)) fx_chanq_cons_inherit(s->cq);
    int64_t next = fx_dlv_next_due(&s->q);
    bool can_fetch = fx_dlv_room(&s->q) > 0 && can_publish(s);
    size_t want = fx_dlv_room(&s->q);
    if (want > FX_DM_FETCH_MAX) want = FX_DM_FETCH_MAX;
    if (can_fetch && s->cl->pull) { /* fetch only what the waiting requests want */
        size_t dem = pull_demand(s->cl);
        dem = dem > s->q.n_send ? dem - s->q.n_send : 0;
        if (dem < want) want = dem;
        if (!want) can_fetch = false;
    }
    if (!can_fetch) {
        if (s->cl->pull) pull_nowait(s);
        int64_t cap = s->q.n_send ? 2 : 50; /* deliveries waiting for their record */
        return next < cap ? next : cap;
    }
    size_t got = 0;
    fx_err e = fx_chanq_cons_get(s->cq, s->getbuf, s->counts, want, &got);
    if (e == FX_OK && got) {
        accept_msgs(s, got);
        dlv_run(s);
        return 0;
    }
    if (e == FX_ETIMEDOUT) {
        if (s->cl->pull) pull_nowait(s);
        /* Nothing stored for us: new messages kick the claim (claim_notify); the turn comes back
         * anyway after 20 ms while deliveries are in flight or inherited backlog is held, else
         * after FX_DM_IDLE_GET_MS (a thousand idle claims: 4,000 cheap turns/s). */
        int64_t cap = s->q.t.n_used || fx_chanq_cons_inherited(s->cq) ? 20 : FX_DM_IDLE_GET_MS;
        if (s->q.n_send && cap > 2) cap = 2; /* deliveries wait for their attempt record */
        return next < cap ? next : cap;
    }
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) {
        FX_WRN("claim %s: consumer closed (%s): reopening", s->cl->subject, fx_strerror(e));
        return 0;
    }
    fx_log_ratelimited(&s->slot_get, 5000, FX_LOG_WRN, "claim %s: get failed: %s (%s)",
                       s->cl->subject, fx_strerror(e), fx_err_detail());
    return 200;
}

static void claim_release(cst *s)
{
    dm_claim *cl = s->cl;
    if (s->opened && !fx_chanq_cons_lost(s->cq)) {
        int mode = atomic_load(&cl->stop);
        if (mode == STOP_DRAIN && s->explicit_ack && atomic_load(&cl->present) &&
            !atomic_load(&cl->noresp)) {
            int64_t deadline = fx_now_ms() + FX_DM_DRAIN_LINGER_MS;
            while (fx_dlv_count(&s->q, E_WAIT_ACK) > 0 && fx_ms_left(deadline) > 0 &&
                   !fx_chanq_cons_lost(s->cq)) {
                size_t handled = drain_events(s);
                s->q.n_send = 0; /* nothing is (re)published while draining */
                if (!handled) {
                    flush(s);
                    pthread_mutex_lock(&cl->mu);
                    if (cl->ev_n == 0 && !cl->dlq_done) {
                        struct timespec ts = fx_deadline_ts(fx_now_ms() + 50);
                        pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
                    }
                    pthread_mutex_unlock(&cl->mu);
                }
            }
        }
        int64_t deadline = fx_now_ms() + FX_DM_DLQ_WAIT_MS;
        while (s->q.dlq_pending > 0 && fx_ms_left(deadline) > 0) {
            size_t handled = drain_events(s);
            s->q.n_send = 0;
            if (!handled) {
                pthread_mutex_lock(&cl->mu);
                if (cl->ev_n == 0 && !cl->dlq_done) {
                    struct timespec ts = fx_deadline_ts(fx_now_ms() + 50);
                    pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
                }
                pthread_mutex_unlock(&cl->mu);
            }
        }
        drain_events(s); /* acks and no-responders statuses that came meanwhile */
        s->q.n_send = 0;
        flush(s);
        /* the records with the attempts actually published (a round's record counted planned
         * deliveries that did not go out or found no subscriber) */
        if (!fx_chanq_cons_lost(s->cq)) persist_counts(s);
        FX_INF("claim %s: released (%zu unacked message(s) left for the next consumer)",
               cl->subject, (size_t)s->q.t.n_used);
    }
    if (s->opened) set_holding(s, false);
    s->opened = false;
    fx_dlv_release_all(&s->q);
    /* the consumer's close (last records, acks committed, parts closed) runs as a job; the
     * keeper's view is kicked then, so another claim takes the backlog left at once */
    fx_chanq_cons_close(s->cq);
    s->cq = NULL;
}

/* First turn: the claim's state (owned by its turns from now on). false: out of memory. */
static bool claim_start(dm_claim *cl)
{
    cst *s = calloc(1, sizeof *s);
    if (!s) return false;
    cl->st = s;
    s->cl = cl;
    s->ch = cl->ch;
    s->d = cl->ch->d;
    s->explicit_ack = cl->ch->s.ack == FX_ACK_EXPLICIT;
    s->use_leaf = s->explicit_ack && s->d->leaf != NULL;
    const fx_chan_settings *cs = &cl->ch->s;
    fx_dlv_cfg cfg = {.explicit_ack = s->explicit_ack,
                      .is_dlq = cl->ch->is_dlq,
                      .ack_wait_ms = cs->ack_wait_ms,
                      .max_deliver = cs->max_deliver,
                      .max_ack_pending = cs->max_ack_pending,
                      .backoff_ms = cs->backoff_ms,
                      .n_backoff = cs->n_backoff,
                      .nak_delay_ms = cs->nak_delay_ms,
                      .none_grace_ms = FX_DM_NONE_GRACE_MS};
    if (cl->pull) { /* the durable consumer's stored settings; deliveries over the leaf */
        const dm_pull_cfg *pc = &cl->pull->cfg;
        s->use_leaf = true;
        cfg.ack_wait_ms = pc->ack_wait_ms;
        cfg.max_deliver = pc->max_deliver;
        cfg.max_ack_pending = pc->max_ack_pending;
        cfg.backoff_ms = pc->backoff_ms;
        cfg.n_backoff = pc->n_backoff;
        cfg.nak_delay_ms = pc->nak_delay_ms;
    }
    static const fx_dlv_ops ops = {.now_ms = op_now,
                                   .nonce = op_nonce,
                                   .can_send = op_can_send,
                                   .round = op_round,
                                   .ready = op_ready,
                                   .send = op_send,
                                   .sent = op_sent,
                                   .dead_letter = op_dead_letter,
                                   .commit = op_commit,
                                   .reply = op_reply,
                                   .done = op_done,
                                   .grow = op_grow};
    s->getbuf = calloc(FX_DM_FETCH_MAX, sizeof *s->getbuf);
    s->counts = calloc(FX_DM_FETCH_MAX, sizeof *s->counts);
    fx_chanq_cons_opts co = {.channel = cl->ch->name,
                             .cfg = {.capacity = cs->capacity,
                                     .ttl_s = cs->ttl_seconds,
                                     .retention_s = (cs->retention_ms + 999) / 1000},
                             .label = cl->subject,
                             .attempts = s->explicit_ack};
    fx_chanq_cons_cb cb = {.notify = claim_notify, .release = cq_release, .held = cq_held, .arg = cl};
    if (fx_chanq_cons_new(s->d->keeper, &co, &cb, &s->cq)) return false;
    return fx_dlv_init(&s->q, &cfg, &ops, s) && s->getbuf && s->counts;
}

/* Last turn: release (bounded waits, on the worker) and free the claim's state. The caller then
 * marks the claim finished and drops the scheduler's reference. */
static void claim_end(dm_claim *cl, bool ran)
{
    cst *s = cl->st;
    if (!s) return;
    if (cl->pull) { /* no new requests; those waiting get an answer */
        pthread_mutex_lock(&cl->mu);
        cl->pull->closed = true;
        while (cl->pull->n) {
            dm_pull_status(s->d, dm_pull_at(cl->pull, 0)->reply, 409,
                           cl->pull->deleted ? "Consumer Deleted" : "Server Shutdown", -1, 0);
            dm_pull_remove(cl->pull, 0);
        }
        pthread_mutex_unlock(&cl->mu);
    }
    if (ran) {
        claim_release(s);
    } else {
        FX_ERR("claim %s: out of memory", cl->subject);
    }
    /* completions of dead letters still in flight are freed by the producer side from now on;
     * acks still queued are not applied: their requesters get the error reply now */
    pthread_mutex_lock(&cl->mu);
    while (cl->ev_n) {
        dm_ev *ev = &cl->evs[cl->ev_head];
        ackreply_done(s->d, ev->reply, false);
        ev->reply = NULL;
        free(ev->detail);
        ev->detail = NULL;
        cl->ev_head = (cl->ev_head + 1) % cl->ev_cap;
        cl->ev_n--;
    }
    cl->dlq_closed = true;
    pq_item *done = cl->dlq_done;
    cl->dlq_done = NULL;
    pthread_mutex_unlock(&cl->mu);
    while (done) {
        pq_item *nx = done->next;
        free(done);
        dm_claim_unref(cl);
        done = nx;
    }
    fx_dlv_free(&s->q);
    free(s->attbuf);
    free(s->attidx);
    free(s->plk);
    fx_chanq_cons_close(s->cq); /* not ran: nothing was opened */
    free(s->counts);
    for (size_t i = 0; s->getbuf && i < FX_DM_FETCH_MAX; i++) fx_mq_delivery_free(&s->getbuf[i]);
    free(s->getbuf);
    free(s->hbuf);
    free(s);
    cl->st = NULL;
}

/* One step of claim cl: ms until its next step, or -1 when it has ended. */
static int64_t claim_step(dm_claim *cl)
{
    switch (cl->phase) {
    case 0: /* start */
        if (!claim_start(cl)) {
            claim_end(cl, false);
            return -1;
        }
        cl->phase = 1;
        return 0;
    case 1: { /* run */
        int64_t w = claim_turn(cl->st);
        if (w >= 0) return w;
        claim_end(cl, true);
        return -1;
    }
    default:
        return -1;
    }
}

/* ---- the claim scheduler ------------------------------------------------------------------------
 * Each claim is a strand of the daemon's executor (bridge/executor.h, kind FX_EXEC_K_CLAIM): its
 * steps run one at a time, on the kind's threads, shared fairly with the other claims. A kick
 * (ack, no-responders status, dead-letter completion, stop, consumer notify) runs the next step
 * at once; the wait a step asks for is a timed kick. A kick during a step runs it once more
 * after (no lost wake-up). The last step takes the claim out (sq_on false, the strand freed when
 * that step returns), marks it finished and drops the scheduler's reference.
 * The daemon's dm_sched (d->sched) counts the claims scheduled and wakes dm_claims_stop_all when
 * one finished. Lock order: a claim's mu, then its sq_mu, then the executor's lock; d->sched.mu
 * is taken alone. */

static void sched_kick(dm_claim *cl)
{
    pthread_mutex_lock(&cl->sq_mu);
    if (cl->sq_on) fx_exec_strand_kick(cl->strand, 0);
    pthread_mutex_unlock(&cl->sq_mu);
}

/* A strand step: one step of the claim, then its next kick, or its way out. */
static void sched_step(void *arg)
{
    dm_claim *cl = arg;
    int64_t w = claim_step(cl);
    if (w >= 0) {
        fx_exec_strand_kick(cl->strand, w == 0 ? 0 : fx_now_ms() + w);
        return;
    }
    fx_daemon *d = cl->ch->d;
    pthread_mutex_lock(&cl->sq_mu);
    cl->sq_on = false; /* no kick reaches the strand from now on */
    fx_exec_strand *st = cl->strand;
    cl->strand = NULL;
    pthread_mutex_unlock(&cl->sq_mu);
    fx_exec_strand_free(st); /* from its own step: freed when this step returns */
    pthread_mutex_lock(&d->sched.mu);
    d->sched.users--;
    atomic_store(&cl->finished, true);
    pthread_cond_broadcast(&d->sched.fin_cv);
    pthread_mutex_unlock(&d->sched.mu);
    nats_ReleaseThreadMemory();
    dm_claim_unref(cl);
}

bool dm_claims_sched_stop(fx_daemon *d)
{
    pthread_mutex_lock(&d->sched.mu);
    size_t users = d->sched.users;
    pthread_mutex_unlock(&d->sched.mu);
    if (users)
        FX_WRN("claim scheduler: %zu claim(s) still scheduled at daemon free; the executor is "
               "kept", users);
    return users == 0;
}

/* Hand a new claim to the scheduler (its first step runs at once). */
static bool sched_add(dm_claim *cl)
{
    fx_daemon *d = cl->ch->d;
    if (fx_exec_strand_new(d->exec, FX_EXEC_K_CLAIM, sched_step, cl, &cl->strand)) return false;
    pthread_mutex_lock(&d->sched.mu);
    d->sched.users++;
    pthread_mutex_unlock(&d->sched.mu);
    pthread_mutex_lock(&cl->sq_mu);
    cl->sq_on = true;
    fx_exec_strand_kick(cl->strand, 0);
    pthread_mutex_unlock(&cl->sq_mu);
    return true;
}

/* ---- claim objects ----------------------------------------------------------------------------- */

void dm_claim_unref(dm_claim *cl)
{
    if (!cl || atomic_fetch_sub(&cl->refs, 1) != 1) return;
    pq_item *it = cl->dlq_done;
    while (it) { /* cannot hold refs (each would keep cl alive); defensive */
        pq_item *nx = it->next;
        free(it);
        it = nx;
    }
    for (size_t i = 0; i < cl->ev_n; i++) { /* acks that never reached the thread */
        ackreply_done(NULL, cl->evs[(cl->ev_head + i) % cl->ev_cap].reply, false);
        free(cl->evs[(cl->ev_head + i) % cl->ev_cap].detail);
    }
    free(cl->evs);
    if (cl->pull) free(cl->pull->wq);
    free(cl->pull);
    pthread_mutex_destroy(&cl->mu);
    pthread_mutex_destroy(&cl->sq_mu);
    pthread_cond_destroy(&cl->cv);
    free(cl);
}

void dm_claim_dlq_complete(pq_item *it)
{
    dm_claim *cl = it->claim;
    pthread_mutex_lock(&cl->mu);
    if (cl->dlq_closed) {
        pthread_mutex_unlock(&cl->mu);
        free(it);
        dm_claim_unref(cl);
        return;
    }
    it->next = cl->dlq_done;
    cl->dlq_done = it;
    pthread_cond_signal(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    sched_kick(cl);
}

/* ev->detail is borrowed: each queued event gets its own copy (out of memory: none). */
static bool ev_push(dm_claim *cl, const dm_ev *ev)
{
    char *detail = ev->detail ? strdup(ev->detail) : NULL;
    pthread_mutex_lock(&cl->mu);
    if (cl->ev_n >= cl->ev_cap) {
        pthread_mutex_unlock(&cl->mu);
        free(detail);
        return false;
    }
    cl->evs[(cl->ev_head + cl->ev_n) % cl->ev_cap] = *ev;
    cl->evs[(cl->ev_head + cl->ev_n) % cl->ev_cap].detail = detail;
    cl->ev_n++;
    pthread_cond_signal(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    sched_kick(cl);
    return true;
}

static void request_stop(dm_claim *cl, int mode)
{
    int cur = STOP_NONE;
    atomic_compare_exchange_strong(&cl->stop, &cur, mode); /* the first reason wins */
    pthread_mutex_lock(&cl->mu);
    pthread_cond_broadcast(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    sched_kick(cl);
}

/* pcfg: a pull claim (pull.h) with these settings, first request req; NULL: a push claim. */
static dm_claim *claim_new2(dm_chan *ch, const char *token, const dm_pull_cfg *pcfg,
                            const dm_pull_req *req)
{
    dm_claim *cl = calloc(1, sizeof *cl);
    if (!cl) return NULL;
    cl->ch = ch;
    snprintf(cl->token, sizeof cl->token, "%s", token);
    snprintf(cl->subject, sizeof cl->subject, "%s.%s", ch->deliver_prefix, token);
    int64_t map = ch->s.max_ack_pending;
    if (pcfg) {
        snprintf(cl->subject, sizeof cl->subject, "pull %s.%s", ch->name, token);
        cl->pull = calloc(1, sizeof *cl->pull);
        if (cl->pull) {
            cl->pull->cfg = *pcfg;
            cl->pull->wq = calloc((size_t)pcfg->max_waiting, sizeof *cl->pull->wq);
        }
        if (!cl->pull || !cl->pull->wq) {
            if (cl->pull) free(cl->pull->wq);
            free(cl->pull);
            free(cl);
            return NULL;
        }
        dm_pull_push(cl->pull, req);
        map = pcfg->max_ack_pending;
    }
    uint64_t cap = (uint64_t)map * 2;
    if (cap < FX_DM_EVQ_MIN) cap = FX_DM_EVQ_MIN;
    if (cap > FX_DM_EVQ_MAX) cap = FX_DM_EVQ_MAX;
    cl->ev_cap = (size_t)cap;
    cl->evs = malloc(cl->ev_cap * sizeof *cl->evs);
    if (!cl->evs) {
        if (cl->pull) free(cl->pull->wq);
        free(cl->pull);
        free(cl);
        return NULL;
    }
    pthread_mutex_init(&cl->mu, NULL);
    pthread_mutex_init(&cl->sq_mu, NULL);
    fx_cond_init_monotonic(&cl->cv);
    atomic_init(&cl->refs, 2); /* the registry and the scheduler */
    atomic_init(&cl->stop, STOP_NONE);
    atomic_init(&cl->present, true);
    cl->started = false; /* no thread of its own: the scheduler runs it */
    if (!sched_add(cl)) {
        atomic_store(&cl->refs, 1);
        dm_claim_unref(cl);
        return NULL;
    }
    return cl;
}

static dm_claim *claim_new(dm_chan *ch, const char *token) { return claim_new2(ch, token, NULL, NULL); }

/* ---- pull requests in (pull.h) ------------------------------------------------------------------ */

int dm_pull_submit(fx_daemon *d, const char *chan, const char *name, const char *reply,
                   const char *body, size_t len, const dm_pull_cfg *cfg)
{
    int code = 0;
    char desc[160];
    dm_pull_req r;
    pthread_rwlock_wrlock(&d->reg);
    dm_chan *ch = dm_find_chan_locked(d, chan);
    if (!ch || atomic_load(&ch->draining) || atomic_load(&d->stopping)) {
        pthread_rwlock_unlock(&d->reg);
        return DM_PULL_NO_CHAN;
    }
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
        if (!cl->pull || strcmp(cl->token, name) != 0 || atomic_load(&cl->finished) ||
            atomic_load(&cl->stop) != STOP_NONE)
            continue;
        pthread_mutex_lock(&cl->mu);
        if (cl->pull->closed) {
            pthread_mutex_unlock(&cl->mu);
            continue;
        }
        bool ok = dm_pull_parse(body, len, reply, &cl->pull->cfg, fx_now_ms(), &r, &code, desc,
                                sizeof desc);
        bool full = ok && !dm_pull_push(cl->pull, &r);
        int64_t max_waiting = cl->pull->cfg.max_waiting;
        pthread_mutex_unlock(&cl->mu);
        if (ok && !full) {
            sched_kick(cl); /* under reg: the registry's reference keeps cl */
            pthread_rwlock_unlock(&d->reg);
            return DM_PULL_QUEUED;
        }
        pthread_rwlock_unlock(&d->reg);
        if (full) {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 10000, FX_LOG_WRN,
                               "pull consumer %s of %s: max_waiting (%" PRId64
                               ") requests wait: 409 Exceeded MaxWaiting", name, chan, max_waiting);
            dm_pull_status(d, reply, 409, "Exceeded MaxWaiting", -1, 0);
        } else {
            dm_pull_status(d, reply, code, desc, -1, 0);
        }
        return DM_PULL_ANSWERED;
    }
    if (!cfg) {
        pthread_rwlock_unlock(&d->reg);
        return DM_PULL_NEED_CFG;
    }
    if (!dm_pull_parse(body, len, reply, cfg, fx_now_ms(), &r, &code, desc, sizeof desc)) {
        pthread_rwlock_unlock(&d->reg);
        dm_pull_status(d, reply, code, desc, -1, 0);
        return DM_PULL_ANSWERED;
    }
    dm_claim *cl = claim_new2(ch, name, cfg, &r);
    if (!cl) {
        pthread_rwlock_unlock(&d->reg);
        FX_ERR("pull consumer %s of %s: cannot start (out of resources)", name, chan);
        dm_pull_status(d, reply, 503, "Service Unavailable", -1, 0);
        return DM_PULL_ANSWERED;
    }
    cl->next = ch->claims;
    ch->claims = cl;
    pthread_rwlock_unlock(&d->reg);
    FX_INF("claim %s: pull request waiting: claiming", cl->subject);
    return DM_PULL_QUEUED;
}

/* Expiry (408 with what a request still wanted) and idle heartbeats of one claim's requests;
 * the earliest next deadline into *next. Caller holds cl->mu. */
static void pull_timers_locked(fx_daemon *d, dm_pull *p, int64_t now, int64_t *next)
{
    for (size_t i = 0; i < p->n;) {
        dm_pull_req *r = dm_pull_at(p, i);
        if (!r->sending && dm_pull_abandoned(d, r)) { /* its client is gone: no answer */
            dm_pull_remove(p, i);
            continue;
        }
        if (r->expires_ms && now >= r->expires_ms && !r->sending) {
            dm_pull_status(d, r->reply, 408, "Request Timeout", r->batch,
                           r->max_bytes > 0 ? r->bytes : 0);
            dm_pull_remove(p, i);
            continue;
        }
        if (r->hb_ms && now >= r->next_hb_ms) {
            dm_pull_status(d, r->reply, 100, "Idle Heartbeat", -1, 0);
            r->next_hb_ms = now + r->hb_ms;
        }
        if (r->expires_ms && r->expires_ms < *next) *next = r->expires_ms;
        if (r->hb_ms && r->next_hb_ms < *next) *next = r->next_hb_ms;
        i++;
    }
}

int64_t dm_pull_timers(fx_daemon *d)
{
    int64_t now = fx_now_ms(), next = INT64_MAX;
    pthread_rwlock_rdlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++)
        for (dm_claim *cl = d->chans[c]->claims; cl; cl = cl->next) {
            if (!cl->pull) continue;
            pthread_mutex_lock(&cl->mu);
            size_t before = cl->pull->n;
            pull_timers_locked(d, cl->pull, now, &next);
            bool gone = cl->pull->n < before;
            pthread_mutex_unlock(&cl->mu);
            if (gone) sched_kick(cl); /* its interest may be over */
        }
    pthread_rwlock_unlock(&d->reg);
    return next;
}

void dm_pull_deleted(fx_daemon *d, const char *chan, const char *name)
{
    pthread_rwlock_rdlock(&d->reg);
    dm_chan *ch = dm_find_chan_locked(d, chan);
    for (dm_claim *cl = ch ? ch->claims : NULL; cl; cl = cl->next) {
        if (!cl->pull || strcmp(cl->token, name) != 0) continue;
        pthread_mutex_lock(&cl->mu);
        cl->pull->deleted = true;
        pthread_mutex_unlock(&cl->mu);
        sched_kick(cl);
    }
    pthread_rwlock_unlock(&d->reg);
}

/* ---- ack routing (NATS callbacks: parse, look up, enqueue; never block) ------------------------- */

/* ev->reply (if any) keeps the caller's reference; each queued event takes one more. */
static void route(fx_daemon *d, const char *chan, const char *claim, const dm_ev *ev, bool invalid)
{
    pthread_rwlock_rdlock(&d->reg);
    dm_chan *ch = dm_find_chan_locked(d, chan);
    if (!ch) {
        pthread_rwlock_unlock(&d->reg);
        fx_metric_inc(invalid ? d->g_invalid_acks : d->g_stale_acks, 1);
        return;
    }
    if (invalid) {
        fx_metric_inc(ch->m.invalid_acks, 1);
        pthread_rwlock_unlock(&d->reg);
        return;
    }
    bool routed = false;
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
        if (strcmp(cl->token, claim) != 0 || atomic_load(&cl->finished)) continue;
        routed = true;
        if (ev->reply) atomic_fetch_add(&ev->reply->refs, 1);
        if (!ev_push(cl, ev)) {
            if (ev->reply) atomic_fetch_sub(&ev->reply->refs, 1); /* ours is still held */
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 5000, FX_LOG_WRN, "claim %s: ack queue full: ack dropped",
                               cl->subject);
            fx_metric_inc(d->g_acks_dropped, 1);
        }
    }
    pthread_rwlock_unlock(&d->reg);
    if (!routed) fx_metric_inc(d->g_stale_acks, 1);
}

/* The reason of "+TERM <reason>" (JetStream's form), trimmed, cut at FX_DLV_DETAIL_MAX bytes,
 * control characters made spaces (it becomes a header value); NULL when there is none. */
static char *term_reason(const char *data, int len, char *buf, size_t cap)
{
    if (!data || len <= 6 || cap < 2) return NULL;
    const char *p = data + 6, *end = data + len;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    while (end > p && (unsigned char)end[-1] <= ' ') end--;
    size_t n = 0;
    for (; p < end && n + 1 < cap; p++) {
        unsigned char c = (unsigned char)*p;
        buf[n++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
    }
    buf[n] = '\0';
    return n ? buf : NULL;
}

void dm_on_ack(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    fx_ack_meta meta;
    const char *subj = natsMsg_GetSubject(m);
    char js[FX_JSACK_SUBJECT_MAX + 64];
    bool ok = false;
    if (subj && strncmp(subj, FX_DM_ACK_PREFIX, sizeof FX_DM_ACK_PREFIX - 1) == 0) {
        int n = snprintf(js, sizeof js, "%s%s", FX_DM_JS_ACK_PREFIX, subj + sizeof FX_DM_ACK_PREFIX - 1);
        ok = n > 0 && (size_t)n < sizeof js;
    } else if (subj && strncmp(subj, FX_DM_JS_ACK_PREFIX, sizeof FX_DM_JS_ACK_PREFIX - 1) == 0) {
        int n = snprintf(js, sizeof js, "%s", subj); /* an ack sent to the JetStream form */
        ok = n > 0 && (size_t)n < sizeof js;
    }
    if (!ok || fx_ack_subject_parse(js, &meta) != 0 || strcmp(meta.bridge, d->name) != 0) {
        static fx_log_slot slot;
        fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "invalid ack subject ignored");
        fx_metric_inc(d->g_invalid_acks, 1);
        fx_metric_inc(d->g_invalid_control, 1);
        natsMsg_Destroy(m);
        return;
    }
    dm_ev ev = {.claim_seq = meta.claim_seq, .nonce = meta.nonce};
    char reason[FX_DLV_DETAIL_MAX + 1];
    bool invalid = false;
    if (natsMsg_IsNoResponders(m)) {
        ev.kind = EV_NORESP;
    } else {
        int64_t delay = 0;
        const char *data = natsMsg_GetData(m);
        int len = natsMsg_GetDataLength(m);
        fx_ack_kind k = fx_ack_body_parse(data ? data : "", len > 0 ? (size_t)len : 0, &delay);
        switch (k) {
        case FX_ACK_ACK: ev.kind = EV_ACK; break;
        case FX_ACK_NAK: ev.kind = EV_NAK; ev.delay_ns = delay; break;
        case FX_ACK_WPI: ev.kind = EV_WPI; break;
        case FX_ACK_TERM:
            ev.kind = EV_TERM;
            ev.detail = term_reason(data, len, reason, sizeof reason);
            break;
        default: invalid = true; break;
        }
        if (invalid) {
            static fx_log_slot slot;
            fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "channel %s: invalid ack body ignored",
                               meta.channel);
        }
    }
    const char *rs = natsMsg_GetReply(m);
    if (ev.kind != EV_NORESP && rs && *rs)
        ev.reply = ackreply_new(rs); /* out of memory: the ack is still applied, unanswered */
    route(d, meta.channel, meta.claim, &ev, invalid);
    ackreply_done(d, ev.reply, false); /* the router's reference: error reply if nobody applied it */
    natsMsg_Destroy(m);
}

void dm_invalid_control(fx_daemon *d, const char *what)
{
    static fx_log_slot slot;
    fx_metric_inc(d->g_invalid_control, 1);
    fx_log_ratelimited(&slot, 10000, FX_LOG_WRN,
                       "%s the bridge did not cause ignored (fluxon_invalid_control_total)", what);
}

static bool parse_u64(const char *t, uint64_t *out)
{
    if (!t || *t < '0' || *t > '9') return false;
    char *end = NULL;
    *out = strtoull(t, &end, 10);
    return end && !*end;
}

/* "_FLUXON.NR.<bridge>.<channel>.<claim>.<claim seq>.<nonce>": only no-responders statuses matter;
 * anything else on this subject was not caused by the bridge. */
void dm_on_nr(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    fx_daemon *d = arg;
    const char *subj = natsMsg_GetSubject(m);
    if (!natsMsg_IsNoResponders(m) || !subj || strncmp(subj, FX_DM_NR_PREFIX, sizeof FX_DM_NR_PREFIX - 1)) {
        dm_invalid_control(d, "message on the no-responders subject");
        natsMsg_Destroy(m);
        return;
    }
    char buf[FX_JSACK_SUBJECT_MAX + 64];
    snprintf(buf, sizeof buf, "%s", subj + sizeof FX_DM_NR_PREFIX - 1);
    char *tok[5] = {0};
    char *save = NULL;
    int n = 0;
    for (char *t = strtok_r(buf, ".", &save); t && n < 6; t = strtok_r(NULL, ".", &save)) {
        if (n < 5) tok[n] = t;
        n++;
    }
    uint64_t cseq = 0, nonce = 0;
    if (n == 5 && strcmp(tok[0], d->name) == 0 && parse_u64(tok[3], &cseq) &&
        parse_u64(tok[4], &nonce) && nonce != 0) {
        dm_ev ev = {.kind = EV_NORESP, .claim_seq = cseq, .nonce = nonce};
        route(d, tok[1], tok[2], &ev, false);
    } else {
        dm_invalid_control(d, "no-responders status");
    }
    natsMsg_Destroy(m);
}

/* ---- interest thread --------------------------------------------------------------------------- */

/* fluxon_claims: claims whose consumer is open and are not being released. */
static size_t count_live(dm_chan *ch)
{
    size_t n = 0;
    for (dm_claim *cl = ch->claims; cl; cl = cl->next)
        if (atomic_load(&cl->stop) == STOP_NONE && atomic_load(&cl->holding)) n++;
    return n;
}

/* Called by the claim thread when its consumer opens or closes: refresh the gauge at once. */
static void set_holding(cst *s, bool h)
{
    atomic_store(&s->cl->holding, h);
    fx_daemon *d = s->d;
    pthread_rwlock_rdlock(&d->reg);
    size_t n = 0;
    for (dm_claim *cl = s->ch->claims; cl; cl = cl->next)
        if (atomic_load(&cl->stop) == STOP_NONE && atomic_load(&cl->holding)) n++;
    fx_metric_set(s->ch->m.claims, (int64_t)n);
    pthread_rwlock_unlock(&d->reg);
}

/* Release the claims whose interest has been gone for release_after (each at its own time, not at
 * the next poll: the wait of the interest thread is cut to the earliest due release). Returns the
 * monotonic time of the next due release, or INT64_MAX. Caller holds reg for writing. */
static int64_t release_due_locked(fx_daemon *d, int64_t now)
{
    int64_t next = INT64_MAX;
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        if (atomic_load(&ch->draining)) continue;
        for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
            if (cl->pull || atomic_load(&cl->stop) != STOP_NONE || atomic_load(&cl->present))
                continue;
            int64_t due = cl->last_seen_ms + ch->s.release_after_ms;
            if (now >= due) {
                FX_INF("claim %s: no interest for %" PRId64 " ms: releasing", cl->subject,
                       now - cl->last_seen_ms);
                request_stop(cl, STOP_RELEASE);
            } else if (due < next) {
                next = due;
            }
        }
        fx_metric_set(ch->m.claims, (int64_t)count_live(ch));
    }
    return next;
}

static int64_t apply_interest(fx_daemon *d, const fx_interest *set)
{
    int64_t now = fx_now_ms();
    pthread_rwlock_wrlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        if (atomic_load(&ch->draining)) continue;
        for (size_t i = 0; i < set->n && !atomic_load(&d->stopping); i++) {
            const char *tok = fx_interest_claim_token(ch->deliver_prefix, set->subjects[i]);
            if (!tok || !fx_subject_token_valid(tok) || strlen(tok) >= sizeof ((dm_claim *)0)->token)
                continue;
            dm_claim *cl = ch->claims;
            while (cl && (cl->pull || strcmp(cl->token, tok) != 0 || atomic_load(&cl->stop) != STOP_NONE ||
                          atomic_load(&cl->noresp)))
                cl = cl->next;
            if (!cl) {
                cl = claim_new(ch, tok);
                if (!cl) {
                    FX_ERR("claim %s.%s: cannot start (out of resources)", ch->deliver_prefix, tok);
                    continue;
                }
                cl->next = ch->claims;
                ch->claims = cl;
                FX_INF("claim %s: interest appeared: claiming", cl->subject);
            }
            cl->last_seen_ms = now;
            atomic_store(&cl->present, true);
        }
        for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
            if (cl->pull || atomic_load(&cl->stop) != STOP_NONE || cl->last_seen_ms == now) continue;
            if (atomic_exchange(&cl->present, false))
                FX_DBG("claim %s: no subscriber seen", cl->subject);
        }
    }
    int64_t next = release_due_locked(d, now);
    pthread_rwlock_unlock(&d->reg);
    return next;
}

static void reap(fx_daemon *d)
{
    pthread_rwlock_wrlock(&d->reg);
    for (size_t c = 0; c < d->n_chans; c++) {
        dm_chan *ch = d->chans[c];
        dm_claim **pp = &ch->claims;
        while (*pp) {
            dm_claim *cl = *pp;
            if (atomic_load(&cl->finished)) {
                *pp = cl->next;
                dm_claim_unref(cl);
            } else {
                pp = &cl->next;
            }
        }
        fx_metric_set(ch->m.claims, (int64_t)count_live(ch));
    }
    pthread_rwlock_unlock(&d->reg);
}

void *dm_interest_main(void *arg)
{
    fx_thread_name("fx-interest");
    fx_daemon *d = arg;
    char *url = NULL, *acc = NULL;
    pthread_mutex_lock(&d->cfg_mu);
    char norm[FX_URL_MAX + 1]; /* libcurl ends a userinfo at its first '@' (lease/fx_url.h) */
    if (fx_url_normalize(d->cfg->nats.monitor_url ? d->cfg->nats.monitor_url : "http://127.0.0.1:8222",
                         norm, sizeof norm) == FX_URL_OK)
        url = strdup(norm);
    explicit_bzero(norm, sizeof norm);
    acc = d->cfg->nats.account ? strdup(d->cfg->nats.account) : NULL;
    pthread_mutex_unlock(&d->cfg_mu);
    fx_log_slot slot = {0};
    bool failing = false;
    int64_t next_release = INT64_MAX;
    for (;;) {
        int64_t period = 1000;
        pthread_rwlock_rdlock(&d->reg);
        for (size_t c = 0; c < d->n_chans; c++)
            if (d->chans[c]->s.interest_poll_ms > 0 && d->chans[c]->s.interest_poll_ms < period)
                period = d->chans[c]->s.interest_poll_ms;
        pthread_rwlock_unlock(&d->reg);
        int64_t t0 = fx_now_ms();
        if (url && dm_nats_connected(d)) {
            uint64_t cid = 0;
            natsConnection_GetClientID(d->nc, &cid);
            fx_interest set = {0};
            fx_err e = fx_interest_fetch(url, acc, &cid, 1, 2000, &set);
            if (!e) {
                if (failing) {
                    char red[512];
                    fx_url_redact(url, red, sizeof red); /* monitor_url may hold credentials */
                    FX_INF("interest: %s/subsz reachable again", red);
                }
                failing = false;
                next_release = apply_interest(d, &set);
            } else {
                failing = true;
                fx_log_ratelimited(&slot, 10000, FX_LOG_WRN, "interest: poll failed: %s (%s)",
                                   fx_strerror(e), fx_err_detail());
            }
            fx_interest_free(&set);
        }
        reap(d);
        /* Until the next poll, wake for each release that falls due before it. */
        int64_t next_poll = t0 + period;
        bool stop = false;
        while (!stop) {
            int64_t now = fx_now_ms();
            int64_t until = next_release < next_poll ? next_release : next_poll;
            int64_t wait = until - now;
            stop = dm_bg_wait(d, wait > 10 ? wait : 10);
            if (stop || fx_now_ms() >= next_poll) break;
            pthread_rwlock_wrlock(&d->reg);
            next_release = release_due_locked(d, fx_now_ms());
            pthread_rwlock_unlock(&d->reg);
        }
        if (stop) break;
    }
    free(url);
    free(acc);
    return NULL;
}

void dm_claims_request_stop(fx_daemon *d, dm_chan *ch, int mode)
{
    pthread_rwlock_rdlock(&d->reg);
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) request_stop(cl, mode);
    pthread_rwlock_unlock(&d->reg);
}

void dm_claims_stop_all(fx_daemon *d, dm_chan *ch, int mode)
{
    dm_claims_request_stop(d, ch, mode);
    /* Only this thread changes ch->claims now (the interest thread is stopped or ch is retired). */
    for (dm_claim *cl = ch->claims; cl; cl = cl->next) {
        /* run by the scheduler: wait for its last step (its release is bounded) */
        pthread_mutex_lock(&d->sched.mu);
        while (!atomic_load(&cl->finished)) {
            struct timespec ts = fx_deadline_ts(fx_now_ms() + 1000);
            pthread_cond_timedwait(&d->sched.fin_cv, &d->sched.mu, &ts);
        }
        pthread_mutex_unlock(&d->sched.mu);
    }
    pthread_rwlock_wrlock(&d->reg);
    dm_claim *list = ch->claims;
    ch->claims = NULL;
    pthread_rwlock_unlock(&d->reg);
    while (list) {
        dm_claim *nx = list->next;
        dm_claim_unref(list);
        list = nx;
    }
    fx_metric_set(ch->m.claims, 0);
}
