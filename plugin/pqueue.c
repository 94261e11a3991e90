/* pqueue.c -- a channel's bounded producer queue. Contract: pqueue.h. */
#include <stdlib.h>
#include <string.h>

#include "fx_time.h"
#include "pqueue.h"

void dm_pq_init(dm_pq *q)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    fx_cond_init_monotonic(&q->cv);
}

void dm_pq_destroy(dm_pq *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

pq_item *dm_pq_item_new(int kind, const char *reply, size_t rec_len)
{
    return dm_pq_item_new_id(kind, reply, NULL, rec_len);
}

pq_item *dm_pq_item_new_id(int kind, const char *reply, const char *msgid, size_t rec_len)
{
    size_t rl = reply ? strlen(reply) + 1 : 0;
    size_t il = msgid ? strlen(msgid) + 1 : 0;
    pq_item *it = malloc(sizeof *it + rl + il + rec_len + 1);
    if (!it) return NULL;
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->in_ms = fx_now_ms();
    char *p = (char *)(it + 1);
    if (reply) {
        memcpy(p, reply, rl);
        it->reply = p;
        p += rl;
    }
    if (msgid) {
        memcpy(p, msgid, il);
        it->msgid = p;
        p += il;
    }
    it->rec = (uint8_t *)p;
    it->rec_len = rec_len;
    return it;
}

void dm_pq_item_free(pq_item *it) { free(it); }

void dm_pq_item_done(pq_item *it, fx_err result)
{
    it->result = result;
    if (it->done)
        it->done(it, result);
    else
        free(it);
}

static bool pq_push_kind(dm_pq *q, pq_item *it)
{
    pthread_mutex_lock(&q->mu);
    if (q->closed || q->n + 1 > FX_DM_CAPQ_MAX_MSGS ||
        (q->n > 0 && q->bytes + it->rec_len > FX_DM_CAPQ_MAX_BYTES)) {
        pthread_mutex_unlock(&q->mu);
        return false;
    }
    it->next = NULL;
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->n++;
    q->bytes += it->rec_len;
    if (q->n == 1) pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return true;
}

bool dm_pq_push(dm_pq *q, pq_item *it) { return pq_push_kind(q, it); }

/* Put items taken from the queue back at its head, in order (they were counted before: no
 * bound check). Producer thread and its put workers; q->mu held. */
void dm_pq_requeue_front_locked(dm_pq *q, pq_item **items, size_t n)
{
    for (size_t i = n; i > 0; i--) {
        pq_item *it = items[i - 1];
        it->next = q->head;
        q->head = it;
        if (!q->tail) q->tail = it;
        q->n++;
        q->bytes += it->rec_len;
    }
}

void dm_pq_requeue_front(dm_pq *q, pq_item **items, size_t n)
{
    if (!n) return;
    pthread_mutex_lock(&q->mu);
    dm_pq_requeue_front_locked(q, items, n);
    pthread_mutex_unlock(&q->mu);
}

pq_item *dm_pq_take_locked(dm_pq *q)
{
    pq_item *it = q->head;
    if (!it) return NULL;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    q->bytes -= it->rec_len;
    it->next = NULL;
    return it;
}

