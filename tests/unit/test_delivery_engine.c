/* test_delivery_engine.c -- unit tests of the delivery engine (bridge/delivery.h) against a fake
 * consumer (records what is published, committed, dead-lettered and answered) and a fake clock:
 * no NATS, no etcd, no threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "delivery.h"

/* ---- the fake consumer and clock ------------------------------------------------------------ */

#define FK_MAX 512

typedef struct sent_rec {
    int64_t msg;
    uint64_t attempt, cseq, nonce;
} sent_rec;

typedef struct fake {
    int64_t now;
    bool can_send;  /* a subscriber could receive */
    bool send_fail; /* the publish fails */
    uint64_t nonces;
    sent_rec sent[FK_MAX];
    size_t n_sent;
    struct {
        int64_t msg;
        const char *reason;
        uint32_t idx;
        uint64_t gen;
    } dead[FK_MAX];
    size_t n_dead;
    fx_dlv_dlq dlq_answer;
    int64_t committed[FK_MAX];
    size_t n_committed;
    bool commit_ok;
    int reply_ok, reply_err; /* AckSync answers: ok, 409 */
    int done[5];             /* by fx_dlv_done */
    size_t rounds;
} fake;

static int64_t fk_now(void *c) { return ((fake *)c)->now; }
static uint64_t fk_nonce(void *c) { return ++((fake *)c)->nonces * 7919; }
static bool fk_can_send(void *c) { return ((fake *)c)->can_send; }
static void fk_round(void *c) { ((fake *)c)->rounds++; }

static bool fk_send(void *c, uint32_t idx, const ctab_ent *e)
{
    (void)idx;
    fake *f = c;
    if (f->send_fail) return false;
    assert_true(f->n_sent < FK_MAX);
    f->sent[f->n_sent++] = (sent_rec){e->dv.id.msg, e->delivered + 1, e->claim_seq, e->nonce};
    return true;
}

static fx_dlv_dlq fk_dead(void *c, uint32_t idx, const ctab_ent *e, const char *reason)
{
    fake *f = c;
    assert_true(f->n_dead < FK_MAX);
    f->dead[f->n_dead].msg = e->dv.id.msg;
    f->dead[f->n_dead].reason = reason;
    f->dead[f->n_dead].idx = idx;
    f->dead[f->n_dead].gen = e->gen;
    f->n_dead++;
    return f->dlq_answer;
}

static bool fk_commit(void *c, fx_mq_msg_id *ids, size_t n)
{
    fake *f = c;
    for (size_t i = 0; i < n; i++) {
        assert_true(f->n_committed < FK_MAX);
        f->committed[f->n_committed++] = ids[i].msg;
    }
    return f->commit_ok;
}

static void fk_reply(void *c, void *r, bool ok)
{
    fake *f = c;
    assert_non_null(r);
    if (ok) f->reply_ok++;
    else f->reply_err++;
}

static void fk_done(void *c, const ctab_ent *e, fx_dlv_done how)
{
    (void)e;
    ((fake *)c)->done[how]++;
}

static const fx_dlv_ops fk_ops = {.now_ms = fk_now,
                                  .nonce = fk_nonce,
                                  .can_send = fk_can_send,
                                  .round = fk_round,
                                  .send = fk_send,
                                  .dead_letter = fk_dead,
                                  .commit = fk_commit,
                                  .reply = fk_reply,
                                  .done = fk_done};

typedef struct env {
    fake f;
    fx_dlv d;
} env;

static env *env_new(fx_dlv_cfg cfg)
{
    env *v = calloc(1, sizeof *v);
    assert_non_null(v);
    v->f.now = 1000000;
    v->f.can_send = true;
    v->f.commit_ok = true;
    v->f.dlq_answer = FX_DLV_DLQ_QUEUED;
    assert_true(fx_dlv_init(&v->d, &cfg, &fk_ops, &v->f));
    return v;
}

static void env_free(env *v)
{
    fx_dlv_free(&v->d);
    free(v);
}

static fx_dlv_cfg cfg_explicit(void)
{
    return (fx_dlv_cfg){.explicit_ack = true, .ack_wait_ms = 30000, .max_deliver = 5,
                        .max_ack_pending = 100, .none_grace_ms = 20};
}

/* Hand message `msg` (sub-MPSC 1, producer 1) to the engine with `delivered` earlier attempts. */
static fx_err give(env *v, int64_t msg, uint64_t delivered)
{
    fx_mq_delivery dv = {.id = {.chan = 1, .pidx = 1, .msg = msg}};
    dv.value.data = malloc(4);
    assert_non_null(dv.value.data);
    dv.value.len = 4;
    fx_err e = fx_dlv_accept(&v->d, &dv, NULL, delivered);
    if (e) fx_mq_delivery_free(&dv);
    return e;
}

/* The last publish of msg, or NULL. */
static const sent_rec *last_sent(const env *v, int64_t msg)
{
    for (size_t i = v->f.n_sent; i-- > 0;)
        if (v->f.sent[i].msg == msg) return &v->f.sent[i];
    return NULL;
}

static size_t sends_of(const env *v, int64_t msg)
{
    size_t n = 0;
    for (size_t i = 0; i < v->f.n_sent; i++)
        if (v->f.sent[i].msg == msg) n++;
    return n;
}

static fx_dlv_res ev(env *v, fx_dlv_kind k, int64_t msg, int64_t delay_ns, void *reply)
{
    const sent_rec *s = last_sent(v, msg);
    assert_non_null(s);
    return fx_dlv_event(&v->d, k, s->cseq, s->nonce, delay_ns, reply);
}

static void advance(env *v, int64_t ms)
{
    v->f.now += ms;
    fx_dlv_run(&v->d);
}

/* ---- tests ------------------------------------------------------------------------------------ */

/* No ack within ack_wait: the message is published again with the next attempt number, not
 * before. */
static void delivery_engine_ack_wait_expiry_redelivers(void **state)
{
    (void)state;
    env *v = env_new(cfg_explicit());
    assert_int_equal(give(v, 1, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 1), 1);
    assert_int_equal(last_sent(v, 1)->attempt, 1);
    advance(v, 29999);
    assert_int_equal(sends_of(v, 1), 1); /* not before ack_wait */
    assert_int_equal(fx_dlv_next_due(&v->d), 1);
    advance(v, 1);
    assert_int_equal(sends_of(v, 1), 2);
    assert_int_equal(last_sent(v, 1)->attempt, 2);
    /* the first attempt's ack is stale now: it changes nothing */
    assert_int_equal(fx_dlv_event(&v->d, FX_DLV_ACK, v->f.sent[0].cseq, v->f.sent[0].nonce, 0, NULL),
                     FX_DLV_STALE);
    /* nobody could receive it: an expired delivery is held, not counted */
    v->f.can_send = false;
    advance(v, 30000);
    advance(v, 30000);
    assert_int_equal(sends_of(v, 1), 2);
    v->f.can_send = true;
    advance(v, FX_DLV_HOLD_MS);
    assert_int_equal(sends_of(v, 1), 3);
    assert_int_equal(last_sent(v, 1)->attempt, 3);
    env_free(v);
}

/* NAK with a delay: redelivered after that delay, not before; without one and no backoff, at
 * once. */
static void delivery_engine_nak_with_delay(void **state)
{
    (void)state;
    env *v = env_new(cfg_explicit());
    assert_int_equal(give(v, 1, 0), FX_OK);
    assert_int_equal(give(v, 2, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(ev(v, FX_DLV_NAK, 1, 5000 * 1000000LL, NULL), FX_DLV_APPLIED);
    assert_int_equal(ev(v, FX_DLV_NAK, 2, 0, NULL), FX_DLV_APPLIED);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 2), 2); /* no delay: at once */
    advance(v, 4999);
    assert_int_equal(sends_of(v, 1), 1);
    advance(v, 1);
    assert_int_equal(sends_of(v, 1), 2);
    assert_int_equal(last_sent(v, 1)->attempt, 2);
    /* a NAK of a delivery not waiting for its ack (already NAKed, due later) is ignored */
    assert_int_equal(ev(v, FX_DLV_NAK, 1, 0, NULL), FX_DLV_APPLIED);
    assert_int_equal(fx_dlv_event(&v->d, FX_DLV_NAK, last_sent(v, 1)->cseq, last_sent(v, 1)->nonce, 0, NULL),
                     FX_DLV_IGNORED);
    env_free(v);
}

/* A NAK without a delay takes backoff[attempts - 1], the last element repeating. */
static void delivery_engine_backoff_list_applied(void **state)
{
    (void)state;
    static const int64_t bo[] = {1000, 3000, 7000};
    fx_dlv_cfg c = cfg_explicit();
    c.backoff_ms = bo;
    c.n_backoff = 3;
    c.max_deliver = 10;
    env *v = env_new(c);
    assert_int_equal(give(v, 1, 0), FX_OK);
    fx_dlv_run(&v->d);
    static const int64_t want[] = {1000, 3000, 7000, 7000};
    for (size_t k = 0; k < 4; k++) {
        assert_int_equal(ev(v, FX_DLV_NAK, 1, 0, NULL), FX_DLV_APPLIED);
        advance(v, want[k] - 1);
        assert_int_equal(sends_of(v, 1), k + 1);
        advance(v, 1);
        assert_int_equal(sends_of(v, 1), k + 2);
        assert_int_equal(last_sent(v, 1)->attempt, k + 2);
    }
    env_free(v);
}

/* +WPI restarts the ack deadline: no redelivery at the first deadline. */
static void delivery_engine_wpi_extends(void **state)
{
    (void)state;
    env *v = env_new(cfg_explicit());
    assert_int_equal(give(v, 1, 0), FX_OK);
    fx_dlv_run(&v->d);
    advance(v, 20000);
    assert_int_equal(ev(v, FX_DLV_WPI, 1, 0, NULL), FX_DLV_APPLIED);
    advance(v, 29999); /* 49,999 ms after the publish: past the first deadline */
    assert_int_equal(sends_of(v, 1), 1);
    assert_int_equal(ev(v, FX_DLV_WPI, 1, 0, NULL), FX_DLV_APPLIED);
    advance(v, 29999);
    assert_int_equal(sends_of(v, 1), 1);
    advance(v, 1);
    assert_int_equal(sends_of(v, 1), 2);
    env_free(v);
}

/* +TERM and the max_deliver-th failed attempt go to the dead-letter path exactly once; once the
 * dead letter is stored the message is committed; a failed store is retried, never doubled. */
static void delivery_engine_term_and_max_deliver_dead_letter_once(void **state)
{
    (void)state;
    fx_dlv_cfg c = cfg_explicit();
    c.max_deliver = 3;
    env *v = env_new(c);
    assert_int_equal(give(v, 1, 0), FX_OK);
    assert_int_equal(give(v, 2, 0), FX_OK);
    assert_int_equal(give(v, 3, 3), FX_OK); /* attempts used up under an earlier consumer */
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 3), 0);
    /* TERM of 1 (twice: the second finds it in the dead-letter path) */
    assert_int_equal(ev(v, FX_DLV_TERM, 1, 0, NULL), FX_DLV_APPLIED);
    assert_int_equal(ev(v, FX_DLV_TERM, 1, 0, NULL), FX_DLV_IGNORED);
    assert_int_equal(ev(v, FX_DLV_ACK, 1, 0, NULL), FX_DLV_IGNORED);
    /* 2: three attempts, each expiring */
    advance(v, 30000);
    advance(v, 30000);
    assert_int_equal(sends_of(v, 2), 3);
    advance(v, 30000);
    advance(v, 30000);
    assert_int_equal(sends_of(v, 2), 3);
    assert_int_equal(v->f.n_dead, 3);
    size_t seen[4] = {0};
    for (size_t i = 0; i < v->f.n_dead; i++) {
        seen[v->f.dead[i].msg]++;
        assert_string_equal(v->f.dead[i].reason, v->f.dead[i].msg == 1 ? "term" : "max_deliver");
    }
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 1);
    assert_int_equal(seen[3], 1);
    assert_int_equal(v->d.dlq_pending, 3);
    /* stored: committed once; a store that failed is handed over again after 1 s, once */
    for (size_t i = 0; i < 3; i++)
        fx_dlv_dlq_done(&v->d, v->f.dead[i].idx, v->f.dead[i].gen, v->f.dead[i].msg != 2);
    fx_dlv_dlq_done(&v->d, v->f.dead[0].idx, v->f.dead[0].gen, true); /* duplicate completion */
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.n_committed, 2);
    assert_int_equal(v->f.done[FX_DLV_DONE_DEAD], 2);
    advance(v, FX_DLV_RETRY_MS);
    assert_int_equal(v->f.n_dead, 4);
    assert_int_equal(v->f.dead[3].msg, 2);
    fx_dlv_dlq_done(&v->d, v->f.dead[3].idx, v->f.dead[3].gen, true);
    advance(v, 100000);
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.n_dead, 4);
    assert_int_equal(v->f.n_committed, 3);
    assert_int_equal(v->f.done[FX_DLV_DONE_DEAD], 3);
    assert_int_equal(v->d.t.n_used, 0);
    /* a late completion of an earlier dead letter does not finish a new one in the same slot */
    assert_int_equal(give(v, 9, 3), FX_OK);
    assert_int_equal(v->f.n_dead, 5);
    uint32_t slot = v->f.dead[4].idx;
    bool reused = false;
    for (size_t i = 0; i < 4; i++)
        if (v->f.dead[i].idx == slot) {
            fx_dlv_dlq_done(&v->d, slot, v->f.dead[i].gen, true);
            reused = true;
        }
    assert_true(reused);
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.n_committed, 3);
    fx_dlv_dlq_done(&v->d, slot, v->f.dead[4].gen, true);
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.n_committed, 4);
    assert_int_equal(v->f.n_dead, 5);
    env_free(v);
}

/* AckSync: an applied ack is answered ok once committed; an ack for a delivery that is no
 * longer pending (acked, expired and redelivered) gets the error (409) answer; so does an
 * applied ack whose commit failed. */
static void delivery_engine_acksync_replies_ok_and_409(void **state)
{
    (void)state;
    env *v = env_new(cfg_explicit());
    int r1, r2, r3, r4;
    assert_int_equal(give(v, 1, 0), FX_OK);
    assert_int_equal(give(v, 2, 0), FX_OK);
    assert_int_equal(give(v, 3, 0), FX_OK);
    fx_dlv_run(&v->d);
    sent_rec s1 = *last_sent(v, 1);
    assert_int_equal(ev(v, FX_DLV_ACK, 1, 0, &r1), FX_DLV_APPLIED);
    assert_int_equal(v->f.reply_ok + v->f.reply_err, 0); /* not before the commit */
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.n_committed, 1);
    assert_int_equal(v->f.reply_ok, 1);
    assert_int_equal(v->f.reply_err, 0);
    /* the same ack again: no longer pending */
    assert_int_equal(fx_dlv_event(&v->d, FX_DLV_ACK, s1.cseq, s1.nonce, 0, &r2), FX_DLV_STALE);
    assert_int_equal(v->f.reply_err, 1);
    /* 2 expires and is redelivered: the first attempt's ack is answered with the error */
    sent_rec s2 = *last_sent(v, 2);
    assert_int_equal(ev(v, FX_DLV_ACK, 3, 0, NULL), FX_DLV_APPLIED);
    fx_dlv_flush(&v->d);
    advance(v, 30000);
    assert_int_equal(sends_of(v, 2), 2);
    assert_int_equal(fx_dlv_event(&v->d, FX_DLV_ACK, s2.cseq, s2.nonce, 0, &r3), FX_DLV_STALE);
    assert_int_equal(v->f.reply_ok, 1);
    assert_int_equal(v->f.reply_err, 2);
    /* applied, but the commit fails: error */
    v->f.commit_ok = false;
    assert_int_equal(ev(v, FX_DLV_ACK, 2, 0, &r4), FX_DLV_APPLIED);
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.reply_ok, 1);
    assert_int_equal(v->f.reply_err, 3);
    env_free(v);
}

/* At most max_ack_pending in flight: the next delivery is refused (and stays the caller's);
 * an ack makes room again. */
static void delivery_engine_bounded_inflight_refuses_past_max_ack_pending(void **state)
{
    (void)state;
    fx_dlv_cfg c = cfg_explicit();
    c.max_ack_pending = 3;
    env *v = env_new(c);
    assert_int_equal(fx_dlv_room(&v->d), 3);
    for (int64_t i = 1; i <= 3; i++) assert_int_equal(give(v, i, 0), FX_OK);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    assert_int_equal(give(v, 4, 0), FX_EFULL);
    fx_dlv_run(&v->d);
    assert_int_equal(v->f.n_sent, 3);
    assert_int_equal(sends_of(v, 4), 0);
    assert_int_equal(ev(v, FX_DLV_ACK, 2, 0, NULL), FX_DLV_APPLIED);
    fx_dlv_flush(&v->d);
    assert_int_equal(fx_dlv_room(&v->d), 1);
    assert_int_equal(give(v, 4, 0), FX_OK);
    assert_int_equal(give(v, 5, 0), FX_EFULL);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 4), 1);
    env_free(v);
}

/* The consumer is lost: every unacked delivery is released (nothing more is published,
 * committed or dead-lettered for it), gathered acks are not committed and their AckSync
 * requests get the error answer; later acks are stale. */
static void delivery_engine_lost_consumer_releases_unacked(void **state)
{
    (void)state;
    env *v = env_new(cfg_explicit());
    int r1;
    for (int64_t i = 1; i <= 4; i++) assert_int_equal(give(v, i, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(ev(v, FX_DLV_ACK, 1, 0, &r1), FX_DLV_APPLIED);
    assert_int_equal(ev(v, FX_DLV_NAK, 2, 0, NULL), FX_DLV_APPLIED); /* due at once */
    assert_int_equal(ev(v, FX_DLV_NAK, 3, 60000 * 1000000LL, NULL), FX_DLV_APPLIED);
    fx_dlv_release_all(&v->d);
    assert_int_equal(v->d.t.n_used, 0);
    assert_int_equal(fx_dlv_room(&v->d), 100);
    assert_int_equal(v->f.reply_err, 1);
    assert_int_equal(v->f.reply_ok, 0);
    fx_dlv_flush(&v->d);
    assert_int_equal(v->f.n_committed, 0);
    size_t sent = v->f.n_sent;
    advance(v, 120000);
    assert_int_equal(v->f.n_sent, sent);
    assert_int_equal(v->f.n_dead, 0);
    assert_int_equal(fx_dlv_next_due(&v->d), INT64_MAX);
    assert_int_equal(ev(v, FX_DLV_ACK, 4, 0, NULL), FX_DLV_STALE);
    env_free(v);
}

/* A plain NAK (no delay) takes backoff[delivered - 1] (the last element repeating), like the
 * ack deadline JetStream derives from BackOff, even when nak_delay is set (the list wins); an
 * explicit delay keeps its value; while it waits out that delay the message holds no
 * max_ack_pending slot (fx_dlv_room counts only deliveries out with a subscriber). */
static void delivery_engine_nak_uses_backoff(void **state)
{
    (void)state;
    static const int64_t bo[] = {1000, 3000};
    fx_dlv_cfg c = cfg_explicit();
    c.backoff_ms = bo;
    c.n_backoff = 2;
    c.max_deliver = 10;
    c.max_ack_pending = 2;
    c.nak_delay_ms = 500;
    env *v = env_new(c);
    assert_int_equal(give(v, 1, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(fx_dlv_room(&v->d), 1);
    static const int64_t want[] = {1000, 3000, 3000};
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(ev(v, FX_DLV_NAK, 1, 0, NULL), FX_DLV_APPLIED);
        assert_int_equal(fx_dlv_room(&v->d), 2); /* waiting out the backoff: no slot held */
        advance(v, want[k] - 1);
        assert_int_equal(sends_of(v, 1), k + 1); /* never early */
        advance(v, 1);
        assert_int_equal(sends_of(v, 1), k + 2);
        assert_int_equal(last_sent(v, 1)->attempt, k + 2);
        assert_int_equal(fx_dlv_room(&v->d), 1);
    }
    /* attempts made under an earlier consumer index the list too */
    assert_int_equal(give(v, 2, 1), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(last_sent(v, 2)->attempt, 2);
    assert_int_equal(ev(v, FX_DLV_NAK, 2, 0, NULL), FX_DLV_APPLIED);
    advance(v, 2999);
    assert_int_equal(sends_of(v, 2), 1);
    advance(v, 1);
    assert_int_equal(sends_of(v, 2), 2);
    /* an explicit delay keeps its value */
    assert_int_equal(ev(v, FX_DLV_NAK, 2, 200 * 1000000LL, NULL), FX_DLV_APPLIED);
    advance(v, 199);
    assert_int_equal(sends_of(v, 2), 2);
    advance(v, 1);
    assert_int_equal(sends_of(v, 2), 3);
    env_free(v);
}

/* Without a backoff list a plain NAK waits nak_delay; nak_delay 0 (the default) redelivers at
 * once, as JetStream does; an explicit delay keeps its value. */
static void delivery_engine_nak_delay_default(void **state)
{
    (void)state;
    fx_dlv_cfg c = cfg_explicit();
    c.nak_delay_ms = 2000;
    env *v = env_new(c);
    assert_int_equal(give(v, 1, 0), FX_OK);
    assert_int_equal(give(v, 2, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(ev(v, FX_DLV_NAK, 1, 0, NULL), FX_DLV_APPLIED);
    assert_int_equal(ev(v, FX_DLV_NAK, 2, 700 * 1000000LL, NULL), FX_DLV_APPLIED);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 1), 1); /* not at once */
    advance(v, 699);
    assert_int_equal(sends_of(v, 2), 1);
    advance(v, 1);
    assert_int_equal(sends_of(v, 2), 2);
    advance(v, 1299);
    assert_int_equal(sends_of(v, 1), 1);
    advance(v, 1);
    assert_int_equal(sends_of(v, 1), 2);
    assert_int_equal(last_sent(v, 1)->attempt, 2);
    env_free(v);
    /* the default: at once */
    v = env_new(cfg_explicit());
    assert_int_equal(give(v, 1, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(ev(v, FX_DLV_NAK, 1, 0, NULL), FX_DLV_APPLIED);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 1), 2);
    env_free(v);
}

/* max_ack_pending 1: a NAKed message waiting out its delay does not hold the slot, so the next
 * message is accepted and published; when the delay is over it waits for the slot (no more
 * than max_ack_pending out) and goes before any newer message (fx_dlv_room says 0 meanwhile).
 * The delayed ones are bounded too: at most max_ack_pending of them; past that a NAKed message
 * keeps its slot (counted in nak_delay_held). */
static void delivery_engine_nak_delayed_not_counted_in_max_ack_pending(void **state)
{
    (void)state;
    fx_dlv_cfg c = cfg_explicit();
    c.max_ack_pending = 1;
    env *v = env_new(c);
    assert_int_equal(give(v, 1, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    assert_int_equal(ev(v, FX_DLV_NAK, 1, 5000 * 1000000LL, NULL), FX_DLV_APPLIED);
    assert_int_equal(fx_dlv_room(&v->d), 1);
    assert_int_equal(give(v, 2, 0), FX_OK);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 2), 1);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    /* a second NAK-delayed message: past the bound of delayed ones, it keeps its slot */
    assert_int_equal(ev(v, FX_DLV_NAK, 2, 10000 * 1000000LL, NULL), FX_DLV_APPLIED);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    assert_int_equal(v->d.nak_delay_held, 1);
    assert_int_equal(give(v, 3, 0), FX_EFULL);
    /* 1 is due: 2 holds the only slot, so 1 waits (nothing new is accepted before it) */
    advance(v, 5000);
    assert_int_equal(sends_of(v, 1), 1);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    advance(v, 5000); /* 2 is due (it held its slot): redelivered */
    assert_int_equal(sends_of(v, 2), 2);
    assert_int_equal(sends_of(v, 1), 1);
    assert_int_equal(ev(v, FX_DLV_ACK, 2, 0, NULL), FX_DLV_APPLIED);
    fx_dlv_flush(&v->d);
    assert_int_equal(fx_dlv_room(&v->d), 0); /* the slot is 1's */
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 1), 2);
    assert_int_equal(last_sent(v, 1)->attempt, 2);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    assert_int_equal(ev(v, FX_DLV_ACK, 1, 0, NULL), FX_DLV_APPLIED);
    fx_dlv_flush(&v->d);
    assert_int_equal(fx_dlv_room(&v->d), 1);
    assert_int_equal(v->d.t.n_used, 0);
    /* an ACK of a delivery that waits out its NAK delay still finishes it (and frees it) */
    assert_int_equal(give(v, 4, 0), FX_OK);
    fx_dlv_run(&v->d);
    sent_rec s4 = *last_sent(v, 4);
    assert_int_equal(ev(v, FX_DLV_NAK, 4, 5000 * 1000000LL, NULL), FX_DLV_APPLIED);
    assert_int_equal(give(v, 5, 0), FX_OK);
    assert_int_equal(fx_dlv_event(&v->d, FX_DLV_TERM, s4.cseq, s4.nonce, 0, NULL), FX_DLV_APPLIED);
    assert_int_equal(v->f.n_dead, 1);
    fx_dlv_dlq_done(&v->d, v->f.dead[0].idx, v->f.dead[0].gen, true);
    fx_dlv_flush(&v->d);
    fx_dlv_run(&v->d);
    assert_int_equal(sends_of(v, 5), 1);
    assert_int_equal(fx_dlv_room(&v->d), 0);
    env_free(v);
}

/* +TERM with a reason: the dead letter is handed over with the reason readable (fx_dlv_detail),
 * also when it is handed again after a RETRY; a reason longer than FX_DLV_DETAIL_MAX is cut. */
static void delivery_engine_term_reason_kept(void **state)
{
    (void)state;
    env *v = env_new(cfg_explicit());
    assert_int_equal(give(v, 1, 0), FX_OK);
    assert_int_equal(give(v, 2, 0), FX_OK);
    fx_dlv_run(&v->d);
    v->f.dlq_answer = FX_DLV_DLQ_RETRY;
    const sent_rec *s1 = last_sent(v, 1);
    assert_int_equal(fx_dlv_term(&v->d, s1->cseq, s1->nonce, "bad payload 7", NULL), FX_DLV_APPLIED);
    assert_int_equal(v->f.n_dead, 1);
    assert_string_equal(fx_dlv_detail(&v->d, v->f.dead[0].idx), "bad payload 7");
    v->f.dlq_answer = FX_DLV_DLQ_QUEUED;
    advance(v, FX_DLV_RETRY_MS);
    assert_int_equal(v->f.n_dead, 2);
    assert_string_equal(v->f.dead[1].reason, "term");
    assert_string_equal(fx_dlv_detail(&v->d, v->f.dead[1].idx), "bad payload 7");
    char longr[600];
    memset(longr, 'x', sizeof longr - 1);
    longr[sizeof longr - 1] = '\0';
    const sent_rec *s2 = last_sent(v, 2);
    assert_int_equal(fx_dlv_term(&v->d, s2->cseq, s2->nonce, longr, NULL), FX_DLV_APPLIED);
    assert_int_equal(strlen(fx_dlv_detail(&v->d, v->f.dead[2].idx)), FX_DLV_DETAIL_MAX);
    fx_dlv_dlq_done(&v->d, v->f.dead[1].idx, v->f.dead[1].gen, true);
    assert_null(fx_dlv_detail(&v->d, v->f.dead[1].idx));
    env_free(v); /* frees the reason still held */
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* run only the tests matching argv[1] */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(delivery_engine_ack_wait_expiry_redelivers),
        cmocka_unit_test(delivery_engine_nak_with_delay),
        cmocka_unit_test(delivery_engine_backoff_list_applied),
        cmocka_unit_test(delivery_engine_wpi_extends),
        cmocka_unit_test(delivery_engine_term_and_max_deliver_dead_letter_once),
        cmocka_unit_test(delivery_engine_acksync_replies_ok_and_409),
        cmocka_unit_test(delivery_engine_bounded_inflight_refuses_past_max_ack_pending),
        cmocka_unit_test(delivery_engine_lost_consumer_releases_unacked),
        cmocka_unit_test(delivery_engine_nak_uses_backoff),
        cmocka_unit_test(delivery_engine_nak_delay_default),
        cmocka_unit_test(delivery_engine_nak_delayed_not_counted_in_max_ack_pending),
        cmocka_unit_test(delivery_engine_term_reason_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
